/* zp_alloc_ops: the allocs and frees the allocator replay walks for the longer schedule that
 * whole inserted steady periods make (zp_alloc_replay_schedule_extended). */
#include "zp_alloc_ops.h"
#include "zp_util.h"

#include <string.h>

/* Where op `alloc`, allocated at `at` in the longer schedule, is: an alloc of the same
 * category and size (else the inserted periods are not what they claim: refused). */
static gboolean same_alloc(const ZpOp *alloc, const ZpOp *free_op)
{
    return alloc && alloc->kind == ZP_OP_ALLOC && alloc->sub == free_op->sub &&
           alloc->bytes == free_op->bytes;
}

/* [op]: for a free, how many ops back its buffer's alloc is (0: none, or not a free); *far:
 * the most of them. */
static uint32_t *pair_distances(const ZpSchedule *s, int32_t most, uint32_t *far)
{
    const guint n = s->ops->len;
    uint32_t *back = g_new0(uint32_t, MAX(n, 1));
    int32_t *alloc_of = g_new(int32_t, (size_t)most + 2);
    for (int32_t b = 0; b <= most; b++)
        alloc_of[b] = -1;
    for (guint i = 0; i < n; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->buffer < 0)
            continue;
        if (op->kind == ZP_OP_ALLOC)
            alloc_of[op->buffer] = (int32_t)i;
        else if (op->kind == ZP_OP_FREE && alloc_of[op->buffer] >= 0)
            back[i] = i - (uint32_t)alloc_of[op->buffer];
        *far = MAX(*far, back[i]);
    }
    g_free(alloc_of);
    return back;
}

/* An insert moved on by whole periods till its model period's frees each free what the same
 * free a period later frees as far back (the sim inserts at its window, whose period may
 * still free a warm-up's allocation: 1F1B's first stage frees its warm-up forwards' through
 * its first pp steady periods): the same ops inserted, since the ops between repeat (checked:
 * kind, category, size, micro-step a period on, and the distance of each free). FALSE where
 * no such period comes before the stage's end. */
static gboolean settle_insert(const ZpSchedule *s, const uint32_t *back, ZpOpInsert *x)
{
    const guint n = s->ops->len;
    const uint32_t stage = zp_sched_op(s, x->at - 1)->stage;
    for (;;) {
        gboolean steady = TRUE;
        for (uint32_t t = x->at - x->step; t < x->at; t++) {
            const ZpOp *a = zp_sched_op(s, t);
            const uint32_t u = t + x->step;
            if (u >= n)
                return FALSE;
            const ZpOp *b = zp_sched_op(s, u);
            if (b->stage != stage || a->kind != b->kind || a->sub != b->sub ||
                a->bytes != b->bytes || (a->micro < 0) != (b->micro < 0) ||
                (a->micro >= 0 && b->micro != a->micro + (int32_t)x->micro_steps))
                return FALSE; /* past the steady periods */
            steady = steady && back[t] == back[u];
        }
        if (steady)
            return TRUE;
        x->at += x->step;
    }
}

/* The allocs of the longer schedule's last stretch, by place in a ring: [place & mask] its
 * place (tag; UINT32_MAX: none yet), op and buffer there (-1: none). Only allocs are written:
 * a free looks back only for an alloc, and a place whose tag differs (a free, a compute op, or
 * an alloc a ring before) is no alloc there. */
typedef struct {
    uint32_t *tag;
    const ZpOp **op;
    int32_t *buffer;
    uint64_t mask;
} Places;

static void places_put(Places *r, uint32_t at, const ZpOp *op, int32_t buffer)
{
    r->tag[at & r->mask] = at;
    r->op[at & r->mask] = op;
    r->buffer[at & r->mask] = buffer;
}

/* The buffer of the alloc at place `at` that free_op frees: -1 where none is there, or one of
 * another category or size. */
static int32_t places_alloc(const Places *r, uint32_t at, const ZpOp *free_op)
{
    const uint64_t j = at & r->mask;
    return r->tag[j] == at && same_alloc(r->op[j], free_op) && r->buffer[j] >= 0 ? r->buffer[j]
                                                                                 : -1;
}

static gint insert_cmp(gconstpointer x, gconstpointer y, gpointer unused)
{
    (void)unused;
    const ZpOpInsert *a = x, *b = y;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* The longer schedule's allocs and frees: this one's, with the inserted periods' copies
 * (ZpOpInsert), each copy's micro-steps numbered on and the ops after them by as many. Each
 * allocation keeps its buffer, a copy's a new one. A free frees the alloc as far back as its
 * model op's did (inside the steady periods every pair repeats at one distance), except a
 * free whose alloc lies before an inserted period and belongs to another micro-step (or
 * none): a buffer held across the steady state (the step's buckets, say), whose alloc it
 * keeps. NULL where a copy's op is not what that implies (an alloc of another size, a state
 * or region op inside a period, buffers too sparse): the caller replays the longer schedule. */
GArray *zp_alloc_ops_extended(const ZpSchedule *s, const ZpOpInsert *given, size_t n_ins)
{
    const guint n = s->ops->len;
    int32_t most = -1;
    uint64_t total = n;
    for (guint i = 0; i < n; i++)
        most = MAX(most, zp_sched_op(s, i)->buffer);
    for (size_t k = 0; k < n_ins; k++)
        total += given[k].periods * given[k].step;
    if ((uint64_t)most > 4 * (uint64_t)n + 1024 || total >= UINT32_MAX / 2)
        return NULL;
    uint32_t far = 0;
    uint32_t *pair_back = pair_distances(s, most, &far);
    ZpOpInsert *ins = g_memdup2(given, MAX(n_ins, 1) * sizeof *ins);
    gboolean settled = TRUE;
    for (size_t k = 0; settled && k < n_ins; k++)
        settled = ins[k].step > 0 && ins[k].at >= ins[k].step &&
                  settle_insert(s, pair_back, &ins[k]);
    g_free(pair_back);
    if (!settled) {
        g_free(ins);
        return NULL;
    }
    if (n_ins > 1)
        g_qsort_with_data(ins, (gint)n_ins, sizeof *ins, insert_cmp, NULL);
    /* [buffer]: its latest alloc's op in this schedule; [op]: an alloc's place in the longer
     * one; places: the allocs there. A free looks back at most as far as the farthest pair
     * here (its model free's distance, or its own), so the places are a ring of that many, not
     * the longer schedule's length (Megatron 1T's 921,794 ops: 11 MB of fresh pages an
     * evaluation). */
    int32_t *alloc_of = g_new(int32_t, (size_t)most + 2);
    for (int32_t b = 0; b <= most; b++)
        alloc_of[b] = -1;
    uint32_t *place = g_new(uint32_t, MAX(n, 1));
    uint64_t ring = 1;
    while (ring <= far)
        ring <<= 1;
    Places places = {.tag = g_new(uint32_t, ring), .op = g_new(const ZpOp *, ring),
                     .buffer = g_new(int32_t, ring), .mask = ring - 1};
    memset(places.tag, 0xff, ring * sizeof *places.tag); /* UINT32_MAX: no place is that far */
    guint room = (guint)(total / 4 + 16); /* zp_array_extend's: what the array holds */
    GArray *ops = g_array_sized_new(FALSE, FALSE, sizeof(ZpAllocOp), room);
    int32_t fresh = most + 1, micro_shift = 0;
    uint32_t at = 0, stage = UINT32_MAX;
    size_t k = 0;
    gboolean ok = TRUE;
    for (guint i = 0; ok && i < n; i++) {
        const ZpOp *here = zp_sched_op(s, i);
        if (here->stage != stage) {
            stage = here->stage;
            micro_shift = 0;
        }
        /* [copy][op]: the inserted periods before op i, then op i itself (copy 0) */
        for (; ok && k < n_ins && ins[k].at == i; k++) {
            const ZpOpInsert *x = &ins[k];
            for (uint64_t c = 1; ok && c <= x->periods; c++) {
                for (uint32_t t = i - x->step; ok && t < i; t++, at++) {
                    const ZpOp *op = zp_sched_op(s, t);
                    if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE)
                        continue;
                    ZpAllocOp so = {op, at,
                                op->micro < 0 ? op->micro
                                              : op->micro + micro_shift +
                                                    (int32_t)(c * x->micro_steps),
                                fresh};
                    if (op->buffer < 0) {
                        ok = FALSE; /* a state or retaken op inside a steady period */
                    } else if (op->kind == ZP_OP_ALLOC) {
                        places_put(&places, at, op, fresh++);
                    } else {
                        const int32_t a = alloc_of[op->buffer];
                        const uint32_t back =
                            a >= 0 && (uint32_t)a < t ? t - (uint32_t)a : UINT32_MAX;
                        so.buffer = back <= at && back <= far
                                        ? places_alloc(&places, at - back, op)
                                        : -1;
                        ok = so.buffer >= 0;
                    }
                    *(ZpAllocOp *)zp_array_extend(ops, 1, sizeof so, &room) = so;
                }
            }
            micro_shift += (int32_t)(x->periods * x->micro_steps);
        }
        if (ok && (here->kind == ZP_OP_ALLOC || here->kind == ZP_OP_FREE)) {
            ZpAllocOp so = {here, at, here->micro < 0 ? here->micro : here->micro + micro_shift,
                        here->buffer};
            if (here->kind == ZP_OP_ALLOC) {
                place[i] = at;
                places_put(&places, at, here, here->buffer >= 0 ? here->buffer : -1);
                if (here->buffer >= 0)
                    alloc_of[here->buffer] = (int32_t)i;
            } else if (here->buffer >= 0 && alloc_of[here->buffer] >= 0) {
                const uint32_t a = (uint32_t)alloc_of[here->buffer];
                const ZpOp *alloc = zp_sched_op(s, a);
                /* Periods inserted between: the same micro-step's alloc is the one as far
                 * back (it moved with the free); another's stayed. */
                if (at - place[a] != i - a && alloc->micro == here->micro && here->micro >= 0) {
                    const uint32_t back = i - a;
                    so.buffer = back <= far ? places_alloc(&places, at - back, here) : -1;
                    ok = so.buffer >= 0;
                }
            }
            *(ZpAllocOp *)zp_array_extend(ops, 1, sizeof so, &room) = so;
        }
        at++;
    }
    g_free(alloc_of);
    g_free(place);
    g_free(places.tag);
    g_free(places.op);
    g_free(places.buffer);
    g_free(ins);
    if (!ok || k != n_ins) {
        g_array_unref(ops);
        return NULL;
    }
    return ops;
}

