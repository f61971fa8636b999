/* zp_alloc_seq: the allocation sequence the caching-allocator replay walks (zp_alloc_replay):
 * a schedule's allocs and frees as events, each plain free matched with its alloc, and the
 * runs of inserted copies that the extended replay's ops leave out (ZpAllocRun). */
#ifndef ZP_ALLOC_SEQ_H
#define ZP_ALLOC_SEQ_H

#include "zp_alloc_ops.h"
#include "zp_sched.h"

#include <glib.h>
#include <stdint.h>

/* One alloc or free of the sequence. plain: a buffer's own alloc of some bytes, or the free
 * of one (the model states, the contiguous regions, the retaken state copies and anything
 * unmatched are not, and never repeat). partner: for a plain free, the events back to its
 * alloc. */
typedef struct {
    uint32_t op;
    int32_t buffer;
    uint32_t partner;
    uint8_t kind, sub;
    uint8_t flags; /* ZP_ALLOC_EV_* */
    double bytes;
} ZpAllocEvent;

enum {
    ZP_ALLOC_EV_PLAIN = 1,
    ZP_ALLOC_EV_CKPT = 2,  /* the checkpoints' contiguous region's */
    ZP_ALLOC_EV_GRAD = 4,  /* the gradient buckets' */
    ZP_ALLOC_EV_HEAD = 8,  /* the first of its stage's micro-step (a later one than any before) */
    ZP_ALLOC_EV_STAGE = 16 /* the first of its stage */
};

/* Where a run of copies the ops leave out (ZpAllocRun) lies among the events: [start, end),
 * copy g (from 1) of the listed events ev[first, first + len) with its buffers g x
 * buffer_step and its places g x op_step on; `before` events left out by the runs before.
 * For the replay's fold (zp_alloc_repeat_events, zp_alloc_slots_skip): the farthest
 * back a plain free of a copy looks (max_partner), [offset]: how far on the plain free of the
 * alloc at that offset of a copy is (free_after, 0: none in the copies), and whether a copy
 * has region slots. */
typedef struct {
    uint64_t start, end, first, before;
    uint32_t len, op_step, max_partner;
    int32_t buffer_step, buffer_first, buffer_window; /* zp_alloc_run_buffer's */
    gboolean slots;
    uint32_t *free_after;
} ZpAllocEventRun;

/* The sequence: inputs (the schedule; its longer schedule's ops, ZpAllocOp, and the runs they
 * leave out, ZpAllocRun, or NULL: the schedule's own; the contiguous regions' figures), then
 * what zp_alloc_seq_build makes of them. */
typedef struct {
    const ZpSchedule *s;
    GArray *ops;
    const GArray *op_runs;
    double ckpt_region, ckpt_gpu_bytes;
    gboolean grad_contiguous; /* the gradient buckets come from one region */
    double grad_region;       /* its size: the most bucket bytes live at once */
    ZpAllocEvent *ev;         /* the listed events */
    uint64_t n_ev;            /* every event, the runs' too */
    ZpAllocEventRun *runs;
    guint n_runs;
    size_t n_buffers;      /* buffer ids below this (foldable) */
    gboolean foldable;     /* buffer ids dense enough to index */
    gboolean runs_refused; /* a run that would not repeat its last listed copy: none made */
} ZpAllocSeq;

/* The last run that starts at or before event j (runs[0] starts there or before). */
static inline const ZpAllocEventRun *zp_alloc_seq_run_at(const ZpAllocSeq *q, uint64_t j)
{
    guint lo = 0, hi = q->n_runs;
    while (hi - lo > 1) {
        const guint mid = lo + (hi - lo) / 2;
        if (q->runs[mid].start <= j)
            lo = mid;
        else
            hi = mid;
    }
    return &q->runs[lo];
}

/* Event j, run x's (built in *tmp). */
G_ALWAYS_INLINE static inline const ZpAllocEvent *
zp_alloc_seq_run_event(const ZpAllocSeq *q, const ZpAllocEventRun *x, uint64_t j,
                       ZpAllocEvent *tmp)
{
    const uint64_t d = j - x->start, g = d / x->len + 1;
    *tmp = q->ev[x->first + d % x->len];
    tmp->buffer = zp_alloc_run_buffer(tmp->buffer, g, x->buffer_step, x->buffer_first,
                                      x->buffer_window);
    tmp->op += (uint32_t)g * x->op_step;
    return tmp;
}

/* Event j of the sequence: a listed one, or one of a run's (built in *tmp). */
static inline const ZpAllocEvent *zp_alloc_seq_event(const ZpAllocSeq *q, uint64_t j,
                                                    ZpAllocEvent *tmp)
{
    if (q->n_runs == 0 || j < q->runs[0].start)
        return &q->ev[j];
    const ZpAllocEventRun *x = zp_alloc_seq_run_at(q, j);
    if (j >= x->end)
        return &q->ev[j - x->before - (x->end - x->start)];
    return zp_alloc_seq_run_event(q, x, j, tmp);
}

/* A walk's place among the events: the listed stretch it was last in (ev[j - shift] for j
 * in [from, to)) and the run it was last in, so that a walk looks neither up per event. */
typedef struct {
    uint64_t from, to, shift;
    const ZpAllocEventRun *run;
} ZpAllocCursor;

#define ZP_ALLOC_CURSOR_INIT {.from = 1, .to = 0, .shift = 0, .run = NULL}

/* Event j, as zp_alloc_seq_event, from cursor c (inlined: a call an event of every replay) */
G_ALWAYS_INLINE static inline const ZpAllocEvent *
zp_alloc_seq_cursor_event(const ZpAllocSeq *q, ZpAllocCursor *c, uint64_t j, ZpAllocEvent *tmp)
{
    if (j >= c->from && j < c->to)
        return &q->ev[j - c->shift];
    if (c->run && j >= c->run->start && j < c->run->end)
        return zp_alloc_seq_run_event(q, c->run, j, tmp);
    if (q->n_runs == 0 || j < q->runs[0].start) {
        c->from = 0;
        c->to = q->n_runs ? q->runs[0].start : q->n_ev;
        c->shift = 0;
        return &q->ev[j];
    }
    const ZpAllocEventRun *x = zp_alloc_seq_run_at(q, j);
    if (j < x->end) {
        c->run = x;
        return zp_alloc_seq_run_event(q, x, j, tmp);
    }
    c->from = x->end;
    c->to = x + 1 < q->runs + q->n_runs ? x[1].start : q->n_ev;
    c->shift = x->before + (x->end - x->start);
    return &q->ev[j - c->shift];
}

/* The listed event that event j is or copies, from cursor c: a run's event is its listed
 * event with its buffer and op moved on (zp_alloc_seq_run_event), which a comparison of
 * kinds, sizes, flags and partners (zp_alloc_repeat_events) does not read; building it
 * was 36 instructions at each of the 32,000 run events Megatron 1T's fold compared. */
G_ALWAYS_INLINE static inline const ZpAllocEvent *
zp_alloc_seq_cursor_listed(const ZpAllocSeq *q, ZpAllocCursor *c, uint64_t j)
{
    if (j >= c->from && j < c->to)
        return &q->ev[j - c->shift];
    if (!c->run || j < c->run->start || j >= c->run->end) {
        ZpAllocEvent tmp;
        const ZpAllocEvent *v = zp_alloc_seq_cursor_event(q, c, j, &tmp);
        if (v != &tmp) /* listed */
            return v;
    }
    return &q->ev[c->run->first + (j - c->run->start) % c->run->len];
}

/* zp_alloc_seq_cursor_listed's event for j, and in *n how many events from j on are the
 * listed ones from it in order: the rest of its listed stretch, or of its run's copy. A walk
 * that reads events in order takes the next *n - 1 by pointer (each by the cursor was 17
 * instructions, 1.3 M of Megatron 1T's fold comparing events a period apart). */
static inline const ZpAllocEvent *zp_alloc_seq_cursor_span(const ZpAllocSeq *q, ZpAllocCursor *c,
                                                           uint64_t j, uint64_t *n)
{
    const ZpAllocEvent *v = zp_alloc_seq_cursor_listed(q, c, j);
    if (j >= c->from && j < c->to) {
        *n = c->to - j;
        return v;
    }
    const ZpAllocEventRun *x = c->run; /* j is its copy's event */
    *n = MIN(x->len - (j - x->start) % x->len, x->end - j);
    return v;
}

/* The events of q's ops (q->foldable: whether buffer ids are dense enough to index). */
void zp_alloc_seq_build(ZpAllocSeq *q);
void zp_alloc_seq_clear(ZpAllocSeq *q);

#endif
