/* zp_alloc_seq: a schedule's allocs and frees in one walk, the runs of inserted copies left
 * out (each a copy of its last listed one, buffers and places a copy on). */
#include "zp_alloc_seq.h"
#include "zp_util.h"

#include <math.h>

static gboolean is_ckpt(const ZpAllocSeq *q, const ZpOp *op)
{
    return q->ckpt_region > 0 && op->sub == ZP_MEM_CHECKPOINTS && op->bytes == q->ckpt_gpu_bytes;
}

static gboolean is_grad(const ZpAllocSeq *q, const ZpOp *op)
{
    return q->grad_contiguous && op->sub == ZP_MEM_BUCKETS;
}

/* Grows a [buffer] array to hold index b, new entries -1. */
static int64_t *grow_buffers(int64_t *v, size_t *cap, size_t b)
{
    const size_t was = *cap;
    while (*cap <= b)
        *cap = *cap ? 2 * *cap : 1024;
    v = g_renew(int64_t, v, *cap);
    for (size_t k = was; k < *cap; k++)
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
        if ((size_t)(to - 1 + shift) >= *cap)
            *open = grow_buffers(*open, cap, (size_t)(to - 1 + shift));
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

/* The alloc and free events in one walk of the ops, each plain one matched with its alloc,
 * and the gradient region's size (the most bucket bytes live at once, walking the ops in
 * order); FALSE (no fold) where buffer ids are too sparse to index. The runs of copies the
 * ops leave out (q->op_runs) are left out of the events too (q->runs); where one would not
 * repeat its last listed copy, q->runs_refused (the caller lists every copy). */
static gboolean seq_events(ZpAllocSeq *q)
{
    double live = 0, most = 0;
    uint32_t stage = UINT32_MAX;
    int32_t micro = -1;
    const ZpSchedule *s = q->s;
    /* Room for half the ops (a pipeline's are a quarter allocs and frees): growing by
     * copies costs more than the pages never touched. */
    uint64_t n = 0, n_listed = 0, room = s->ops->len / 2 + 64;
    ZpAllocEvent *events = g_new(ZpAllocEvent, room);
    zp_advise_huge_pages(events, room * sizeof *events);
    /* [buffer]: its plain alloc's event while that is open; -1 closed; -2 open otherwise
     * (a region's slot, nothing allocated, an alloc over an open one) */
    int64_t *open = NULL;
    size_t cap = 0;
    gboolean indexed = TRUE;
    /* The regions' figures, copied: the events' doubles written below might be q's to the
     * compiler, which would read q's again for every event. */
    const ZpAllocSeq regions = {.ckpt_region = q->ckpt_region, .ckpt_gpu_bytes = q->ckpt_gpu_bytes,
                         .grad_contiguous = q->grad_contiguous};
    const guint n_src = q->ops ? q->ops->len : s->ops->len;
    uint64_t n_long = n_src;
    const guint n_op_runs = q->op_runs ? q->op_runs->len : 0;
    for (guint r = 0; r < n_op_runs; r++) {
        const ZpAllocRun *x = &g_array_index(q->op_runs, ZpAllocRun, r);
        n_long += x->copies * x->len;
    }
    const size_t most_id = 4 * (size_t)MAX(s->ops->len, n_long) + 1024;
    guint next_run = 0;
    int32_t micro_at_model = -1; /* the next run's last listed copy's: before it */
    double live_at_model = 0;
    /* the next run (NULL: none) and the next op it concerns: its first listed, then its end
     * (one test an op: seq_events reads every op of a schedule replayed whole) */
    const ZpAllocRun *x = n_op_runs ? &g_array_index(q->op_runs, ZpAllocRun, 0) : NULL;
    guint run_at = x ? x->first : G_MAXUINT;
    gboolean in_model = FALSE; /* between x's first and after */
    guint stop = MIN(run_at, n_src); /* one test an op: the next run's, or the end */
    for (guint i = 0;; i++) {
        if (G_UNLIKELY(i == stop)) {
            while (i == run_at) {
                if (!in_model) {
                    micro_at_model = micro;
                    live_at_model = live;
                    in_model = TRUE;
                    run_at = x->after;
                    continue;
                }
                q->ev = events; /* seq_skip_run reads the listed copy */
                q->runs_refused = micro_at_model < 0 ||
                                  micro != micro_at_model + x->micro_step ||
                                  live != live_at_model || n_listed < x->len ||
                                  !seq_skip_run(q, x, n, n_listed, &open, &cap, most_id);
                if (q->runs_refused)
                    goto refused;
                n += x->copies * x->len;
                micro += (int32_t)x->copies * x->micro_step;
                next_run++;
                x = next_run < n_op_runs ? &g_array_index(q->op_runs, ZpAllocRun, next_run)
                                         : NULL;
                run_at = x ? x->first : G_MAXUINT;
                in_model = FALSE;
            }
            if (i == n_src)
                break;
            stop = MIN(run_at, n_src);
        }
        ZpAllocOp here;
        const ZpAllocOp *so = &here;
        if (q->ops) {
            so = &g_array_index(q->ops, ZpAllocOp, i);
        } else { /* the schedule's own allocs and frees, read in place */
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE)
                continue;
            here = (ZpAllocOp){op, i, op->micro, op->buffer};
        }
        const ZpOp *op = so->op;
        ZpAllocEvent v = {.op = so->at, .buffer = so->buffer, .kind = op->kind, .sub = op->sub,
                      .bytes = op->bytes};
        if (op->sub == ZP_MEM_CHECKPOINTS) {
            v.flags = is_ckpt(&regions, op) ? ZP_ALLOC_EV_CKPT : 0;
        } else if (op->sub == ZP_MEM_BUCKETS) {
            v.flags = is_grad(&regions, op) ? ZP_ALLOC_EV_GRAD : 0;
            live += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
            most = fmax(most, live);
        }
        if (op->stage != stage) {
            stage = op->stage;
            micro = so->micro;
            v.flags |= ZP_ALLOC_EV_STAGE | ZP_ALLOC_EV_HEAD;
        } else if (so->micro > micro) {
            micro = so->micro;
            v.flags |= ZP_ALLOC_EV_HEAD;
        }
        indexed = indexed && (so->buffer < 0 || (size_t)so->buffer < most_id);
        if (indexed && so->buffer >= 0) {
            const size_t b = (size_t)so->buffer;
            if (b >= cap)
                open = grow_buffers(open, &cap, b);
            const gboolean own = !(v.flags & (ZP_ALLOC_EV_CKPT | ZP_ALLOC_EV_GRAD));
            gboolean plain;
            if (op->kind == ZP_OP_ALLOC) {
                plain = own && op->bytes > 0 && open[b] == -1;
                open[b] = plain ? (int64_t)n : -2;
            } else {
                plain = own && open[b] >= 0;
                v.partner = plain ? (uint32_t)(n - (uint64_t)open[b]) : 0;
                open[b] = -1;
            }
            v.flags |= plain ? ZP_ALLOC_EV_PLAIN : 0;
        }
        if (n_listed == room) {
            room *= 2;
            events = g_renew(ZpAllocEvent, events, room);
        }
        events[n_listed++] = v;
        n++;
    }
refused:
    q->n_ev = n;
    q->ev = events;
    g_free(open);
    q->grad_region = q->grad_contiguous ? most : 0;
    if (q->runs_refused)
        return FALSE;
    if (q->grad_contiguous && most <= 0) { /* no region after all: the buckets are plain */
        g_free(q->ev);
        q->ev = NULL;
        q->n_ev = 0;
        seq_runs_free(q);
        q->grad_contiguous = FALSE;
        return seq_events(q);
    }
    if (!indexed)
        return FALSE;
    q->n_buffers = cap;
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
