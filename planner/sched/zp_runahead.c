/* zp_runahead: the caching allocator's bound on DeepSpeed's stage-3 host run-ahead — each
 * gathered-parameter alloc waits for the compute op that releases enough of the gathers' pool. */
#include "zp_runahead.h"
#include "zp_util.h"

#include <math.h>

/* A gathered-parameter free: its bytes, back once compute op `at` (an op index) has ended. */
typedef struct {
    uint32_t at;
    double bytes;
} Release;

/* A gathered alloc: its op, the bytes taken by then (its own included) and, gated, the compute
 * op its first dependency names as built (UINT32_MAX: not gated, no compute op before it). */
typedef struct {
    uint32_t op, after;
    double taken;
} Taken;

static gboolean on_compute(const ZpOp *op)
{
    return op->kind == ZP_OP_COMPUTE && op->stream == ZP_STREAM_COMPUTE;
}

static gboolean gathered_buffer(const ZpOp *op)
{
    return (op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE) &&
           op->sub == ZP_MEM_GATHERED_PARAMS && op->micro >= 0 && op->buffer >= 0;
}

/* The allocs and frees in list order; a free waiting for no compute op returns its bytes with
 * the next compute op (it waits for an unpack, which that compute op waits for). */
static void ledger(const ZpSchedule *s, const GArray *gated, GArray *taken, guint taken_room,
                   GArray *releases, guint releases_room)
{
    GArray *pending = g_array_new(FALSE, FALSE, sizeof(guint)); /* releases waiting for one */
    double total = 0;
    guint next_gated = 0;
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (on_compute(op) && pending->len > 0) { /* a GLib call at every compute op else */
            for (guint k = 0; k < pending->len; k++)
                g_array_index(releases, Release, g_array_index(pending, guint, k)).at = i;
            g_array_set_size(pending, 0);
        }
        if (!gathered_buffer(op))
            continue;
        const uint32_t after = op->n_deps > 0 ? zp_sched_deps(s, op)[0] : UINT32_MAX;
        if (op->kind == ZP_OP_ALLOC) {
            total += op->bytes;
            Taken t = {i, UINT32_MAX, total};
            if (next_gated < gated->len && g_array_index(gated, uint32_t, next_gated) == i)
                t.after = after, next_gated++;
            *(Taken *)zp_array_extend(taken, 1, sizeof t, &taken_room) = t;
            continue;
        }
        Release r = {after != UINT32_MAX && on_compute(zp_sched_op(s, after)) ? after
                                                                              : UINT32_MAX,
                     op->bytes};
        if (r.at == UINT32_MAX) /* never returned if no compute op follows */
            g_array_append_val(pending, releases->len);
        *(Release *)zp_array_extend(releases, 1, sizeof r, &releases_room) = r;
    }
    g_array_unref(pending);
}

static int by_at(const void *a, const void *b)
{
    const uint32_t x = ((const Release *)a)->at, y = ((const Release *)b)->at;
    return (x > y) - (x < y);
}

static gboolean sorted_by_at(const GArray *releases)
{
    const Release *r = (const Release *)releases->data;
    for (guint k = 1; k < releases->len; k++)
        if (r[k - 1].at > r[k].at)
            return FALSE;
    return TRUE;
}

/* How many releases (sorted by op) are back once compute op `at` has ended. */
static guint released_by(const Release *r, guint n, uint32_t at)
{
    guint lo = 0, hi = n;
    while (lo < hi) {
        const guint mid = lo + (hi - lo) / 2;
        if (r[mid].at <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* released_by for compute op `at`, given `from`, the count for an earlier gated alloc (or 0):
 * those come in op order, so the count mostly moves forward a few releases, stepped here;
 * past 32 steps, or backward, it is searched for as released_by does. The same count. */
static guint released_from(const Release *r, guint n, uint32_t at, guint from)
{
    if (from > 0 && r[from - 1].at > at)
        return released_by(r, n, at);
    for (guint steps = 0; from < n && r[from].at <= at; steps++, from++)
        if (steps == 32)
            return from + released_by(r + from, n - from, at);
    return from;
}

/* Drops op's first dependency (the others move up one). */
static void drop_first_dep(ZpSchedule *s, ZpOp *op)
{
    uint32_t *d = &g_array_index(s->deps, uint32_t, op->dep_start);
    for (uint32_t k = 1; k < op->n_deps; k++)
        d[k - 1] = d[k];
    op->n_deps--;
}

double zp_runahead_bound(ZpSchedule *s, const GArray *gated)
{
    GArray *taken = g_array_new(FALSE, FALSE, sizeof(Taken));
    GArray *releases = g_array_new(FALSE, FALSE, sizeof(Release));
    /* about as many allocs as are gated, and a free each */
    const guint64 most = gated->len + (guint64)64;
    ledger(s, gated, taken, zp_array_reserve_huge(taken, most), releases,
           zp_array_reserve_huge(releases, most));
    if (!sorted_by_at(releases)) /* g_array_sort is stable: an ordered list stays as it is */
        g_array_sort(releases, by_at);
    const Release *r = (const Release *)releases->data;
    const guint n = releases->len;
    double *returned = g_new(double, (gsize)n + 1); /* bytes are whole: the sums are exact */
    returned[0] = 0;
    for (guint k = 0; k < n; k++)
        returned[k + 1] = returned[k] + r[k].bytes;
    double pool = 0;
    guint back = 0; /* releases back by the last gated alloc's compute op */
    for (guint i = 0; i < taken->len; i++) {
        const Taken *t = &g_array_index(taken, Taken, i);
        if (t->after != UINT32_MAX)
            back = released_from(r, n, t->after, back);
        pool = fmax(pool, t->taken - (t->after == UINT32_MAX ? 0 : returned[back]));
    }
    guint k = 0; /* the fewest releases that leave what is live within the pool (taken only
                  * grows, so k only grows) */
    for (guint i = 0; i < taken->len; i++) {
        const Taken *t = &g_array_index(taken, Taken, i);
        ZpOp *op = &g_array_index(s->ops, ZpOp, t->op);
        while (t->taken - returned[k] > pool)
            k++;
        if (t->after == UINT32_MAX)
            continue;
        if (k == 0)
            drop_first_dep(s, op);
        else
            g_array_index(s->deps, uint32_t, op->dep_start) = r[k - 1].at;
    }
    g_free(returned);
    g_array_unref(taken);
    g_array_unref(releases);
    return pool;
}
