/* zp_alloc_seq: a schedule's allocs and frees in one walk, the runs of inserted copies left
 * out (each a copy of its last listed one, buffers and places a copy on). */
#include "zp_alloc_seq.h"
#include "zp_util.h"

#include <math.h>

/* The capacity of a [buffer] array that holds index b, from `cap`. */
static size_t buffers_cap(size_t cap, size_t b)
{
    while (cap <= b)
        cap = cap ? 2 * cap : 1024;
    return cap;
}

/* Grows a [buffer] array of `was` entries to `cap`, new entries -1. */
static int64_t *grow_buffers(int64_t *v, size_t was, size_t cap)
{
    v = g_renew(int64_t, v, cap);
    for (size_t k = was; k < cap; k++)
        v[k] = -1;
    return v;
}

static void seq_runs_free(ZpAllocSeq *q)
{
    for (guint r = 0; r < q->n_runs; r++)
        g_free(q->runs[r].free_after);
    g_free(q->runs);
    q->runs = NULL;
    q->n_runs = 0;
}

/* The events leave out run x's copies, after the listed ones (the last of them the events
 * [n_listed - x->len, n_listed)) at event n: its ZpAllocEventRun, and each of its listed copies'
 * buffers' state in open[] moved as many copies on (the frees after the run look back into
 * its last copies, as into the last listed ones without it). FALSE where the run's copies
 * would not repeat the last listed one event for event: that copy changes the stage, or its
 * head's micro-step, or the bucket bytes live (the gradient region's size, the most of
 * them, is then the one a listed copy reached). */
static gboolean seq_skip_run(ZpAllocSeq *q, const ZpAllocRun *x, uint64_t n, uint64_t n_listed,
                             int64_t **open, size_t *cap, size_t most_id)
{
    for (uint64_t j = n_listed - x->len; j < n_listed; j++)
        if (q->ev[j].flags & ZP_ALLOC_EV_STAGE)
            return FALSE;
    const int64_t shift = (int64_t)x->copies * x->buffer_step;
    const int64_t from = x->first_buffer,
                  to = x->first_buffer + (int64_t)x->listed_copies * x->buffer_step;
    const int64_t events = (int64_t)(x->copies * x->len);
    if (x->buffer_window > 0) { /* the listed copies' buffers, taken again: turned round */
        const int64_t window = x->buffer_window;
        int64_t *was = g_memdup2(*open + from, (size_t)window * sizeof *was);
        for (int64_t k = 0; k < window; k++)
            (*open)[from + (k + shift) % window] = was[k] >= 0 ? was[k] + events : was[k];
        g_free(was);
    } else if (to > from) {
        if ((uint64_t)(to - 1 + shift) >= most_id)
            return FALSE;
        if ((size_t)(to - 1 + shift) >= *cap) {
            const size_t was = *cap;
            *cap = buffers_cap(*cap, (size_t)(to - 1 + shift));
            *open = grow_buffers(*open, was, *cap);
        }
        for (int64_t b = to - 1; b >= from; b--) /* down: the moved may land on the listed */
            (*open)[b + shift] = (*open)[b] >= 0 ? (*open)[b] + events : (*open)[b];
    }
    ZpAllocEventRun run = {.start = n, .end = n + x->copies * x->len, .first = n_listed - x->len,
                  .before = n - n_listed, .len = x->len, .op_step = x->at_step,
                  .buffer_step = x->buffer_step, .buffer_first = x->first_buffer,
                  .buffer_window = x->buffer_window, .free_after = g_new0(uint32_t, x->len)};
    for (uint32_t o = 0; o < x->len; o++) {
        const ZpAllocEvent *v = &q->ev[run.first + o];
        run.slots = run.slots || (v->flags & (ZP_ALLOC_EV_CKPT | ZP_ALLOC_EV_GRAD));
        if (v->kind == ZP_OP_FREE && (v->flags & ZP_ALLOC_EV_PLAIN)) {
            run.max_partner = MAX(run.max_partner, v->partner);
            run.free_after[(o + x->len - v->partner % x->len) % x->len] = v->partner;
        }
    }
    q->runs = g_renew(ZpAllocEventRun, q->runs, q->n_runs + 1);
    q->runs[q->n_runs++] = run;
    return TRUE;
}

/* The walk's state from one event to the next (seq_events'): a local of seq_events whose
 * address only inlined code takes, so that its fields stay in registers where the events'
 * doubles are written (the regions' figures too, copied from q). */
typedef struct {
    ZpAllocEvent *ev; /* the listed events */
    uint64_t n, n_listed; /* the events, the runs' too; those listed */
    double live, most;    /* the bucket bytes live, the most of them at once */
    uint32_t stage;
    int32_t micro;        /* the stage's latest micro-step */
    /* [buffer]: its plain alloc's event while that is open; -1 closed; -2 open otherwise
     * (a region's slot, nothing allocated, an alloc over an open one) */
    int64_t *open;
    size_t cap;     /* open's entries */
    size_t most_id; /* buffer ids at or past it are too sparse to index (no fold) */
    size_t limit;   /* ids below it are indexed as they are: MIN(cap, most_id); 0 once not */
    gboolean indexed;
    /* the checkpoints' region's slot size: NAN where there is no region (no size equals
     * it), so that a checkpoint's test is one comparison (two were 10 instructions at each
     * of narayanan21-t1-529.6b's 59,710) */
    double ckpt_slot_bytes;
    gboolean grad_contiguous;
} Walk;

/* Whether buffer b is indexed in w->open (grown here to hold it): an event tests b against
 * w->limit only, the rest where open[] grows or ids turn too sparse (none indexed after). */
G_ALWAYS_INLINE static inline gboolean walk_indexes(Walk *w, size_t b)
{
    if (G_LIKELY(b < w->limit))
        return TRUE;
    if (!w->indexed || b >= w->most_id) {
        w->indexed = FALSE;
        w->limit = 0;
        return FALSE;
    }
    const size_t was = w->cap;
    w->cap = buffers_cap(w->cap, b);
    w->open = grow_buffers(w->open, was, w->cap);
    w->limit = MIN(w->cap, w->most_id);
    return TRUE;
}

/* Lists the event of alloc or free `op` at place `at` of micro-step `micro`, its buffer
 * `buffer` (inlined: once an event); a plain free is matched with its alloc. */
G_ALWAYS_INLINE static inline void walk_event(Walk *w, const ZpOp *op, uint32_t at,
                                              int32_t micro, int32_t buffer)
{
    ZpAllocEvent v = {.op = at, .buffer = buffer, .kind = op->kind, .sub = op->sub,
                      .bytes = op->bytes};
    if (op->sub == ZP_MEM_CHECKPOINTS) {
        v.flags = op->bytes == w->ckpt_slot_bytes ? ZP_ALLOC_EV_CKPT : 0;
    } else if (op->sub == ZP_MEM_BUCKETS) {
        v.flags = w->grad_contiguous ? ZP_ALLOC_EV_GRAD : 0;
        w->live += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
        /* fmax, not called (neither is NaN): the call spilled the walk's registers round it */
        if (w->live > w->most)
            w->most = w->live;
    }
    if (op->stage != w->stage) {
        w->stage = op->stage;
        w->micro = micro;
        v.flags |= ZP_ALLOC_EV_STAGE | ZP_ALLOC_EV_HEAD;
    } else if (micro > w->micro) {
        w->micro = micro;
        v.flags |= ZP_ALLOC_EV_HEAD;
    }
    if (buffer >= 0 && walk_indexes(w, (size_t)buffer)) {
        int64_t *open = &w->open[buffer];
        const gboolean own = !(v.flags & (ZP_ALLOC_EV_CKPT | ZP_ALLOC_EV_GRAD));
        gboolean plain;
        if (op->kind == ZP_OP_ALLOC) {
            plain = own && op->bytes > 0 && *open == -1;
            *open = plain ? (int64_t)w->n : -2;
        } else {
            plain = own && *open >= 0;
            v.partner = plain ? (uint32_t)(w->n - (uint64_t)*open) : 0;
            *open = -1;
        }
        v.flags |= plain ? ZP_ALLOC_EV_PLAIN : 0;
    }
    w->ev[w->n_listed++] = v;
    w->n++;
}

/* The schedule's own allocs and frees, read in place (no list of them). */
G_ALWAYS_INLINE static inline void walk_own(const ZpSchedule *s, Walk *w)
{
    /* Room for half the ops (a pipeline's are a quarter allocs and frees): growing by
     * copies costs more than the pages never touched. */
    uint64_t room = s->ops->len / 2 + 64;
    w->ev = g_new(ZpAllocEvent, room);
    zp_advise_huge_pages(w->ev, room * sizeof *w->ev);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE)
            continue;
        if (w->n_listed == room) {
            room *= 2;
            w->ev = g_renew(ZpAllocEvent, w->ev, room);
        }
        walk_event(w, op, i, op->micro, op->buffer);
    }
}

/* The listed ops' events (q->ops: an event each, so room for them all and no test an
 * event), the runs of copies they leave out (q->op_runs) left out too (q->runs): FALSE
 * (q->runs_refused) where one would not repeat its last listed copy. The ops come in
 * stretches: up to a run's last listed copy (ops[first]), that copy (to ops[after]), the
 * run; after the last run, to the end. */
G_ALWAYS_INLINE static inline gboolean walk_listed(ZpAllocSeq *q, Walk *w)
{
    const ZpAllocOp *ops = (const ZpAllocOp *)(void *)q->ops->data;
    const guint n_src = q->ops->len, n_op_runs = q->op_runs ? q->op_runs->len : 0;
    w->ev = g_new(ZpAllocEvent, MAX(n_src, 1));
    zp_advise_huge_pages(w->ev, MAX(n_src, 1) * sizeof *w->ev);
    int32_t micro_at_model = -1; /* the run's last listed copy's: before it */
    double live_at_model = 0;
    gboolean in_model = FALSE; /* in the run's last listed copy */
    guint i = 0;
    for (guint r = 0;;) {
        const ZpAllocRun *x = r < n_op_runs ? &g_array_index(q->op_runs, ZpAllocRun, r) : NULL;
        const guint bound = !x ? n_src : in_model ? x->after : x->first;
        for (const ZpAllocOp *o = ops + i, *end = ops + MIN(bound, n_src); o < end; o++)
            walk_event(w, o->op, o->at, o->micro, o->buffer);
        i = MAX(i, MIN(bound, n_src));
        if (!x || bound > n_src)
            return TRUE;
        if (!in_model) {
            micro_at_model = w->micro;
            live_at_model = w->live;
            in_model = TRUE;
            continue;
        }
        q->ev = w->ev; /* seq_skip_run reads the listed copy */
        int64_t *open = w->open;
        size_t cap = w->cap;
        q->runs_refused = micro_at_model < 0 || w->micro != micro_at_model + x->micro_step ||
                          w->live != live_at_model || w->n_listed < x->len ||
                          !seq_skip_run(q, x, w->n, w->n_listed, &open, &cap, w->most_id);
        w->open = open;
        w->cap = cap;
        w->limit = w->indexed ? MIN(cap, w->most_id) : 0;
        if (q->runs_refused)
            return FALSE;
        w->n += x->copies * x->len;
        w->micro += (int32_t)x->copies * x->micro_step;
        r++;
        in_model = FALSE;
    }
}

/* The alloc and free events in one walk of the ops, each plain one matched with its alloc,
 * and the gradient region's size (the most bucket bytes live at once, walking the ops in
 * order); FALSE (no fold) where buffer ids are too sparse to index. The runs of copies the
 * ops leave out (q->op_runs) are left out of the events too (q->runs); where one would not
 * repeat its last listed copy, q->runs_refused (the caller lists every copy). */
static gboolean seq_events(ZpAllocSeq *q)
{
    const ZpSchedule *s = q->s;
    uint64_t n_long = q->ops ? q->ops->len : s->ops->len;
    const guint n_op_runs = q->op_runs ? q->op_runs->len : 0;
    for (guint r = 0; r < n_op_runs; r++) {
        const ZpAllocRun *x = &g_array_index(q->op_runs, ZpAllocRun, r);
        n_long += x->copies * x->len;
    }
    Walk w = {.stage = UINT32_MAX, .micro = -1, .indexed = TRUE,
              .most_id = 4 * (size_t)MAX(s->ops->len, n_long) + 1024,
              .ckpt_slot_bytes = q->ckpt_region > 0 ? q->ckpt_gpu_bytes : NAN,
              .grad_contiguous = q->grad_contiguous};
    if (q->ops)
        q->runs_refused = !walk_listed(q, &w);
    else
        walk_own(s, &w);
    q->n_ev = w.n;
    q->ev = w.ev;
    g_free(w.open);
    q->grad_region = q->grad_contiguous ? w.most : 0;
    if (q->runs_refused)
        return FALSE;
    if (q->grad_contiguous && w.most <= 0) { /* no region after all: the buckets are plain */
        g_free(q->ev);
        q->ev = NULL;
        q->n_ev = 0;
        seq_runs_free(q);
        q->grad_contiguous = FALSE;
        return seq_events(q);
    }
    if (!w.indexed)
        return FALSE;
    q->n_buffers = w.cap;
    return TRUE;
}

void zp_alloc_seq_build(ZpAllocSeq *q)
{
    q->foldable = seq_events(q);
}

void zp_alloc_seq_clear(ZpAllocSeq *q)
{
    g_free(q->ev);
    q->ev = NULL;
    seq_runs_free(q);
}
