/* zp_alloc_repeat: how far the allocator replay's events from a head on repeat those a period
 * before them (zp_alloc_replay.c try_fold), and the handles its heads share (fixed). */
#include "zp_alloc_repeat.h"

#include <stdlib.h>

static int u64_cmp(const void *x, const void *y)
{
    const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

void zp_alloc_repeat_sort(GArray *fixed)
{
    if (fixed->len > 0) /* an empty GArray's data is NULL, which qsort may not be given */
        qsort(fixed->data, fixed->len, sizeof(uint64_t), u64_cmp);
}

gboolean zp_alloc_repeat_fixed(const GArray *fixed, uint64_t handle)
{
    return fixed->len > 0 &&
           bsearch(&handle, fixed->data, fixed->len, sizeof(uint64_t), u64_cmp) != NULL;
}

/* Whether event v, a region's slot (ZP_ALLOC_EV_CKPT or ZP_ALLOC_EV_GRAD), is the slot event
 * u a period before it again and leaves the allocator alone: its region taken already (an
 * alloc then only marks the slot; a free that finds its slot marked only unmarks it, which
 * zp_alloc_slots_skip checks as it replays the marks). */
static gboolean same_slot(const ZpAllocEvent *v, const ZpAllocEvent *u, gboolean ckpt_taken,
                          gboolean grad_taken)
{
    const uint8_t region = v->flags & (ZP_ALLOC_EV_CKPT | ZP_ALLOC_EV_GRAD);
    return region && v->flags == u->flags && v->kind == u->kind && v->sub == u->sub &&
           v->bytes == u->bytes && (region == ZP_ALLOC_EV_CKPT ? ckpt_taken : grad_taken);
}

/* Where the repeat checked from `from` to `ahead` (each event the one a period before) goes
 * on unchecked inside a run of copies: to the run's end, or to the first free of a fixed
 * handle's alloc (or the one a period after it), which the caller checks. Once the last len
 * events checked, those a period before them and their frees' allocs all lie in the run,
 * each later event and the one a period before it are a copy's events at offsets just
 * checked. `ahead` where it cannot; *next: the event to ask again at. */
static uint64_t repeat_in_run(const ZpAllocSeq *q, uint64_t from, uint64_t ahead,
                              uint64_t period, const GArray *fixed, uint64_t *next)
{
    *next = UINT64_MAX;
    if (q->n_runs == 0)
        return ahead;
    if (ahead < q->runs[0].start) {
        *next = q->runs[0].start;
        return ahead;
    }
    const ZpAllocEventRun *x = zp_alloc_seq_run_at(q, ahead);
    if (ahead >= x->end) {
        *next = x + 1 < q->runs + q->n_runs ? x[1].start : UINT64_MAX;
        return ahead;
    }
    const uint64_t ready = MAX(x->start + period + x->max_partner, from) + x->len;
    if (ahead < ready) {
        *next = ready;
        return ahead;
    }
    uint64_t to = x->end;
    for (guint k = 0; k < fixed->len; k++) {
        const uint64_t f = g_array_index(fixed, uint64_t, k);
        const uint32_t after = f >= x->start && f < x->end
                                   ? x->free_after[(f - x->start) % x->len]
                                   : 0;
        if (after > 0 && f + after >= ahead)
            to = MIN(to, f + after);
        else if (after > 0 && f + after + period >= ahead)
            to = MIN(to, f + after + period);
    }
    *next = to + 1;
    return to;
}

/* How many events from e on repeat the event a period before each: plain events, and slots
 * that leave the allocator alone (same_slot). */
uint64_t zp_alloc_repeat_events(const ZpAllocSeq *q, uint64_t e, uint64_t period,
                                const GArray *fixed, gboolean ckpt_taken, gboolean grad_taken)
{
    const gboolean any_fixed = fixed->len > 0; /* read once, not at every free */
    uint64_t j = e, next = e;
    ZpAllocCursor at_v = ZP_ALLOC_CURSOR_INIT, at_u = ZP_ALLOC_CURSOR_INIT;
    /* their buffers and ops aside (a run's listed ones do), v and u walked by pointer through
     * n_v and n_u events in order (zp_alloc_seq_cursor_span) */
    const ZpAllocEvent *v = NULL, *u = NULL;
    uint64_t n_v = 0, n_u = 0;
    for (; j < q->n_ev; j++, v++, u++, n_v--, n_u--) {
        if (j >= next) {
            const uint64_t to = repeat_in_run(q, e, j, period, fixed, &next);
            if (to != j)
                n_v = n_u = 0;
            j = to;
            if (j >= q->n_ev)
                break;
        }
        if (n_v == 0)
            v = zp_alloc_seq_cursor_span(q, &at_v, j, &n_v);
        if (n_u == 0)
            u = zp_alloc_seq_cursor_span(q, &at_u, j - period, &n_u);
        if (!(v->flags & ZP_ALLOC_EV_PLAIN) && same_slot(v, u, ckpt_taken, grad_taken))
            continue;
        if (!(v->flags & u->flags & ZP_ALLOC_EV_PLAIN) || v->kind != u->kind || v->sub != u->sub ||
            v->bytes != u->bytes || v->partner != u->partner)
            break;
        if (v->kind == ZP_OP_FREE && any_fixed &&
            (zp_alloc_repeat_fixed(fixed, j - v->partner) ||
             zp_alloc_repeat_fixed(fixed, j - period - u->partner)))
            break;
    }
    return j - e;
}
