/* zp_build_replay: a pipeline stage's actions written again from the last one of their kind
 * built op by op: a micro-batch's forward (or backward) of a chunk repeats the one before it,
 * its micro-step, buffers, dependencies and sends moved on, where the builder reads nothing
 * else that differs between them. Megatron 1T's build wrote 8,813 of its 9,216 actions so,
 * 800 instructions each where op by op they took 1,300 (forward) to 1,700 (backward). */
#include "zp_build.h"

#include <string.h>

/* A dependency's or a state's source, an action's ops being [op0, op0 + n_ops): >= 0 the op
 * op0 + code; else one of what the action found on entry, or no op. */
enum {
    SRC_LAST_COMPUTE = -1, /* Builder.last_compute on entry */
    SRC_HOST_SYNC = -2,    /* Builder.host_sync on entry */
    SRC_CROSS = -3,        /* another stage's send (CROSS, filled in by link_sends) */
    SRC_NONE = -4,         /* NONE */
    SRC_REFUSED = -5,      /* none the replay can give: no template */
    SRC_SYNC = -16,        /* SRC_SYNC - k: Builder.sync_deps[k] on entry */
};
/* The buffer a free frees: >= 0 the action's own (next_buffer on entry + code), or the
 * micro-step's checkpoint or activations of the op's unit (Activations ckpt, act). */
enum { BUF_CKPT = -1, BUF_ACT = -2 };
#define MOST_SYNC 8 /* the synchronised collectives an action may find on entry */

typedef struct {
    guint at; /* the op's or dependency's place in the action */
    int code; /* SRC_* or BUF_* */
} Patch;

typedef struct {
    gboolean recorded; /* and usable: every dependency, buffer and state has its source */
    gboolean refused;  /* recorded without a source for each: built op by op this stage */
    guint n_ops, n_deps;
    ZpOp *ops;         /* the action's ops, dep_start relative to its first dependency */
    int *deps;         /* SRC_* of each dependency */
    /* the dependencies as written: op0 + deps[i] for the action's own, those of the entry
     * (SRC_* below 0) 0 there and listed in `entry` (Patch: place, SRC_*) */
    uint32_t *own;
    GArray *entry;
    int next_buffer;   /* on entry; the action's allocs take next_buffer .. + n_buffers */
    int n_buffers;
    guint shape;       /* what the replay checks on entry (entry_values) */
    GArray *allocs;    /* Patch: an alloc taking a micro-step's slot (BUF_CKPT, BUF_ACT) */
    GArray *frees;     /* Patch: a free's buffer */
    GArray *cross;     /* Patch: dependency place, key less micro * ZP_P2P_N */
    GArray *sends;     /* Patch: op place, key less micro * ZP_P2P_N */
    /* the five lists above (entry, allocs, frees, cross, sends) end to end, as the replay
     * reads them: one pointer walked through, not each GArray's header and data loaded */
    Patch *flat;
    guint n_entry, n_allocs, n_frees, n_cross, n_sends;
    /* the builder after it */
    int last_compute, host_sync;
    int n_streams, streams[ZP_STREAM_N], on_stream[ZP_STREAM_N]; /* the streams it ends */
    guint post_sync;
    int sync[MOST_SYNC];
    int step;
} Template;

struct ZpReplay {
    Template *t;  /* per (virtual stage, backward) of the stage being built */
    int n;
    gboolean plan_replays; /* what template_of asks of the plan, asked once a stage */
    /* the one being recorded: the builder on entry */
    Template *rec;
    uint32_t op0, last_compute, host_sync, on_stream[ZP_STREAM_N], sync[MOST_SYNC];
    guint dep0, cross0, n_sync;
};

/* Whether the builder reads, for this action, nothing but what a template carries over: the
 * build's blocks written directly (Builder.blocks_direct: no stage 3, no workspaces, experts
 * or module compute), below stage 2 (no buckets reset per micro-step, nothing reduced before
 * the flush), no p2p_sync exchange (its host waits and deferred sends), no overlapped
 * parameter gathers (micro-step 0's waits), no full gradients taken unit by unit; neither the
 * embedding's chunk nor the head's forward (their units' gradients and buffers). */
static gboolean plan_replays(const Builder *b)
{
    const ZpPlan *plan = &b->s->plan;
    return b->blocks_direct && plan->zero.stage < 2 && !plan->p2p_sync &&
           !plan->overlap_param_gather;
}

ZpReplay *zp_build_replay_new(int vstages)
{
    ZpReplay *r = g_new0(ZpReplay, 1);
    r->n = 2 * vstages;
    r->t = g_new0(Template, (gsize)r->n);
    for (int i = 0; i < r->n; i++) {
        r->t[i].allocs = g_array_new(FALSE, FALSE, sizeof(Patch));
        r->t[i].frees = g_array_new(FALSE, FALSE, sizeof(Patch));
        r->t[i].cross = g_array_new(FALSE, FALSE, sizeof(Patch));
        r->t[i].sends = g_array_new(FALSE, FALSE, sizeof(Patch));
        r->t[i].entry = g_array_new(FALSE, FALSE, sizeof(Patch));
    }
    return r;
}

void zp_build_replay_free(ZpReplay *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++) {
        g_free(r->t[i].ops);
        g_free(r->t[i].deps);
        g_array_unref(r->t[i].allocs);
        g_array_unref(r->t[i].frees);
        g_array_unref(r->t[i].cross);
        g_array_unref(r->t[i].sends);
        g_array_unref(r->t[i].entry);
        g_free(r->t[i].own);
        g_free(r->t[i].flat);
    }
    g_free(r->t);
    g_free(r);
}

/* A new stage: its actions are of its own chunks and layout. */
void zp_build_replay_reset(ZpReplay *r, const Builder *b)
{
    r->plan_replays = plan_replays(b) && !b->full_by_unit; /* laid out: the stage's */
    for (int i = 0; i < r->n; i++)
        r->t[i].recorded = r->t[i].refused = FALSE;
}

static Template *template_of(ZpReplay *r, const Builder *b, const ZpPipeAction *x)
{
    /* recv_key_sync and deferred_chunk are p2p_sync's, which plan_replays refuses */
    if (!r->plan_replays || x->chunk == 0 || (!x->backward && x->chunk == b->n_chunks - 1) ||
        b->n_sync > MOST_SYNC)
        return NULL;
    /* chunk c sits on stage c mod P: the stage's own are its virtual stages */
    Template *t = &r->t[2 * (x->chunk / b->s->stages) + (x->backward ? 1 : 0)];
    return t->refused ? NULL : t;
}

/* The values of the sources below 0 on entry, by -code (SRC_SYNC - k: -SRC_SYNC + k), so
 * that a dependency is a test and a load: a switch over its source was 11 instructions a
 * dependency (Megatron 1T: 230,000). */
#define N_SOURCES (-SRC_SYNC + MOST_SYNC)

/* Writes them into v and returns the entry's shape, which the template's must be: as many
 * synchronised collectives, and the same sources NONE, which the emitters skip (bits 4, 5 and
 * 6 + k: last_compute, host_sync, sync_deps[k]); one compare where the fields' were a
 * dozen tests. */
static guint entry_values(const Builder *b, uint32_t v[N_SOURCES])
{
    v[-SRC_LAST_COMPUTE] = b->last_compute;
    v[-SRC_HOST_SYNC] = b->host_sync;
    v[-SRC_CROSS] = CROSS;
    v[-SRC_NONE] = NONE;
    guint shape = b->n_sync | (guint)(b->last_compute == NONE) << 4 |
                  (guint)(b->host_sync == NONE) << 5;
    const uint32_t *sync = (const uint32_t *)b->sync_deps->data;
    for (guint k = 0; k < b->n_sync; k++) {
        v[-SRC_SYNC + k] = sync[k];
        shape |= (guint)(sync[k] == NONE) << (6 + k);
    }
    return shape;
}

static inline uint32_t source_value(int code, uint32_t op0, const uint32_t v[N_SOURCES])
{
    return code >= 0 ? op0 + (uint32_t)code : v[-code];
}

gboolean zp_build_replay(ZpReplay *r, Builder *b, Activations *a, const ZpPipeAction *x)
{
    Template *t = template_of(r, b, x);
    r->rec = NULL;
    if (!t)
        return FALSE;
    ZpSchedule *s = b->s;
    const uint32_t *sync = (const uint32_t *)b->sync_deps->data;
    uint32_t v[N_SOURCES];
    const guint shape = entry_values(b, v);
    if (!t->recorded || t->shape != shape || (guint64)s->ops->len + t->n_ops > b->ops_cap) {
        /* built op by op, and recorded */
        r->rec = t;
        t->shape = shape;
        r->op0 = s->ops->len, r->dep0 = s->deps->len, r->cross0 = b->cross->len;
        r->last_compute = b->last_compute, r->host_sync = b->host_sync;
        r->n_sync = b->n_sync;
        if (b->n_sync > 0) /* sync_deps' data is NULL while it is empty */
            memcpy(r->sync, sync, b->n_sync * sizeof *sync);
        memcpy(r->on_stream, b->last_on_stream, sizeof r->on_stream);
        t->recorded = FALSE;
        t->next_buffer = b->next_buffer;
        return FALSE;
    }
    const uint32_t op0 = s->ops->len;
    const guint dep0 = s->deps->len;
    /* counts, codes and the micro-step in locals: a store through op or dep might alias the
     * template for the compiler, which re-read them each time (11 instructions a dependency) */
    const guint n_ops = t->n_ops, n_deps = t->n_deps;
    const int micro = x->micro;
    ZpOp *op = zp_array_extend(s->ops, n_ops, sizeof(ZpOp), &b->ops_room);
    memcpy(op, t->ops, n_ops * sizeof *op);
    for (guint i = 0; i < n_ops; i++)
        op[i].micro = micro, op[i].dep_start += dep0;
    uint32_t *restrict dep = zp_array_extend(s->deps, n_deps, sizeof(uint32_t), &b->deps_room);
    /* the action's own first, all moved alike, four at a time (GCC's vector extension; the
     * loop a dependency at a time was 4.3 instructions each, 3 M of narayanan21-t1-529.6b's
     * build), then the few found on entry */
    typedef uint32_t Deps4 __attribute__((vector_size(16)));
    const uint32_t *restrict own = t->own;
    guint i = 0;
    for (; i + 4 <= n_deps; i += 4) {
        Deps4 four;
        memcpy(&four, own + i, sizeof four);
        four += op0;
        memcpy(dep + i, &four, sizeof four);
    }
    for (; i < n_deps; i++)
        dep[i] = own[i] + op0;
    /* each list through a local pointer and count: a store through op or dep might alias the
     * template's arrays for the compiler, which re-read them each time */
    const Patch *p = t->flat;
    for (const Patch *end = p + t->n_entry; p < end; p++)
        dep[p->at] = v[-p->code];
    const int buffers = b->next_buffer - t->next_buffer;
    for (const Patch *end = p + t->n_allocs; p < end; p++) {
        ZpOp *alloc = &op[p->at];
        alloc->buffer += buffers;
        if (p->code != 0)
            *zp_build_act_slot(b, p->code == BUF_CKPT ? a->ckpt : a->act, x->micro,
                               alloc->unit) = alloc->buffer;
    }
    for (const Patch *end = p + t->n_frees; p < end; p++) {
        ZpOp *f = &op[p->at];
        f->buffer = p->code >= 0 ? b->next_buffer + p->code
                                 : *zp_build_act_slot(b, p->code == BUF_CKPT ? a->ckpt : a->act,
                                                      x->micro, f->unit);
    }
    const int64_t keys = (int64_t)x->micro * ZP_P2P_N;
    if (t->n_cross > 0) { /* the cross-stage receives' room made once for all of them */
        ZpCrossDep *c = zp_array_extend(b->cross, t->n_cross, sizeof *c, &b->cross_room);
        for (const Patch *end = p + t->n_cross; p < end; p++, c++)
            c->at = dep0 + p->at, c->key = p->code + keys;
    }
    for (const Patch *end = p + t->n_sends; p < end; p++)
        b->send_op[p->code + keys] = op0 + p->at;
    b->next_buffer += t->n_buffers;
    b->last_compute = source_value(t->last_compute, op0, v);
    b->host_sync = source_value(t->host_sync, op0, v);
    const int n_streams = t->n_streams;
    for (int k = 0; k < n_streams; k++)
        b->last_on_stream[t->streams[k]] = op0 + (uint32_t)t->on_stream[k];
    const guint post_sync = t->post_sync;
    if (post_sync > b->sync_deps->len)
        g_array_set_size(b->sync_deps, 2 * post_sync + 8);
    uint32_t *restrict synced = (uint32_t *)b->sync_deps->data;
    for (guint k = 0; k < post_sync; k++)
        synced[k] = source_value(t->sync[k], op0, v);
    b->n_sync = post_sync;
    b->recv_key = -1;
    b->step = t->step;
    /* Builder.pos_last_op is left: stage 3's alone (zp_build_gathers.c), which has no
     * pipeline; the step's deps likewise, which each position empties first. */
    return TRUE;
}

/* The source of value v, an action's ops being [op0, end); SRC_NONE where it has none
 * (another op before the action than those it found on entry, or two of those alike). */
static int source_of(const ZpReplay *r, uint32_t v, uint32_t end)
{
    if (v == NONE)
        return SRC_NONE;
    if (v == CROSS)
        return SRC_CROSS;
    if (v >= r->op0 && v < end)
        return (int)(v - r->op0);
    int code = SRC_NONE, found = 0;
    if (v == r->last_compute)
        code = SRC_LAST_COMPUTE, found++;
    if (v == r->host_sync)
        code = SRC_HOST_SYNC, found++;
    for (guint k = 0; k < r->n_sync; k++)
        if (v == r->sync[k])
            code = SRC_SYNC - (int)k, found++;
    return found == 1 ? code : SRC_REFUSED;
}

/* After an action built op by op where zp_build_replay said to record it: its template, or
 * none where something in it has no source the replay can give. */
void zp_build_replay_record(ZpReplay *r, Builder *b, Activations *a, const ZpPipeAction *x)
{
    Template *t = r->rec;
    r->rec = NULL;
    if (!t)
        return;
    const ZpSchedule *s = b->s;
    const uint32_t end = s->ops->len;
    const guint n_ops = end - r->op0, n_deps = s->deps->len - r->dep0;
    t->recorded = FALSE;
    t->refused = TRUE; /* until every source is found below */
    if (b->over_ops || b->recv_key >= 0 || b->n_sync > MOST_SYNC || n_ops == 0)
        return;
    t->n_ops = n_ops, t->n_deps = n_deps;
    t->ops = g_renew(ZpOp, t->ops, n_ops);
    t->deps = g_renew(int, t->deps, MAX(n_deps, 1));
    memcpy(t->ops, &g_array_index(s->ops, ZpOp, r->op0), n_ops * sizeof(ZpOp));
    const uint32_t *deps = &g_array_index(s->deps, uint32_t, r->dep0);
    t->own = g_renew(uint32_t, t->own, MAX(n_deps, 1));
    g_array_set_size(t->entry, 0);
    for (guint i = 0; i < n_deps; i++) {
        t->deps[i] = source_of(r, deps[i], end);
        if (t->deps[i] == SRC_REFUSED || t->deps[i] == SRC_NONE) /* NONE is never one */
            return;
        t->own[i] = t->deps[i] >= 0 ? (uint32_t)t->deps[i] : 0;
        if (t->deps[i] < 0) {
            const Patch p = {i, t->deps[i]};
            g_array_append_val(t->entry, p);
        }
    }
    t->n_buffers = b->next_buffer - t->next_buffer;
    g_array_set_size(t->allocs, 0);
    g_array_set_size(t->frees, 0);
    g_array_set_size(t->cross, 0);
    g_array_set_size(t->sends, 0);
    for (guint i = 0; i < n_ops; i++) {
        ZpOp *op = &t->ops[i];
        if (op->micro != x->micro)
            return;
        op->dep_start -= r->dep0;
        const gboolean own = op->buffer >= t->next_buffer && op->buffer < b->next_buffer;
        /* a block's slots (Activations: blocks 1 .. L of each micro-step) */
        const gboolean block = op->unit >= 1 && op->unit <= (int)s->model.layers;
        if (op->kind == ZP_OP_ALLOC) {
            if (!own)
                return;
            const int ckpt = block ? *zp_build_act_slot(b, a->ckpt, x->micro, op->unit) : -1;
            const int act = block ? *zp_build_act_slot(b, a->act, x->micro, op->unit) : -1;
            const Patch p = {i, op->buffer == ckpt ? BUF_CKPT : op->buffer == act ? BUF_ACT : 0};
            g_array_append_val(t->allocs, p);
        } else if (op->kind == ZP_OP_FREE) {
            int code = op->buffer - t->next_buffer;
            if (!own) {
                if (!block)
                    return;
                if (op->buffer == *zp_build_act_slot(b, a->ckpt, x->micro, op->unit))
                    code = BUF_CKPT;
                else if (op->buffer == *zp_build_act_slot(b, a->act, x->micro, op->unit))
                    code = BUF_ACT;
                else
                    return;
            }
            const Patch p = {i, code};
            g_array_append_val(t->frees, p);
        } else if (op->kind == ZP_OP_P2P) {
            const int64_t key = zp_build_send_key(b, x->chunk, x->micro, (ZpP2pKind)op->sub);
            if (b->send_op[key] != r->op0 + i)
                return;
            const Patch p = {i, (int)(key - (int64_t)x->micro * ZP_P2P_N)};
            g_array_append_val(t->sends, p);
        }
    }
    for (guint i = r->cross0; i < b->cross->len; i++) {
        const ZpCrossDep *c = &g_array_index(b->cross, ZpCrossDep, i);
        const int64_t rel = c->key - (int64_t)x->micro * ZP_P2P_N;
        if (c->at < r->dep0 || rel < 0 || rel > G_MAXINT ||
            (c->key / ZP_P2P_N) % b->s->plan.grad_accum != x->micro)
            return;
        const Patch p = {c->at - r->dep0, (int)rel};
        g_array_append_val(t->cross, p);
    }
    if ((t->last_compute = source_of(r, b->last_compute, end)) == SRC_REFUSED ||
        (t->host_sync = source_of(r, b->host_sync, end)) == SRC_REFUSED)
        return;
    t->n_streams = 0;
    for (int k = 0; k < ZP_STREAM_N; k++) {
        const uint32_t v = b->last_on_stream[k];
        if (v == r->on_stream[k])
            continue; /* SRC_UNCHANGED */
        const int code = source_of(r, v, end);
        if (code < 0) /* a stream's last op changes to one of the action's own */
            return;
        t->streams[t->n_streams] = k, t->on_stream[t->n_streams++] = code;
    }
    t->post_sync = b->n_sync;
    for (guint k = 0; k < b->n_sync; k++)
        if ((t->sync[k] = source_of(r, g_array_index(b->sync_deps, uint32_t, k), end)) ==
            SRC_REFUSED)
            return;
    t->step = b->step;
    const GArray *lists[] = {t->entry, t->allocs, t->frees, t->cross, t->sends};
    guint *counts[] = {&t->n_entry, &t->n_allocs, &t->n_frees, &t->n_cross, &t->n_sends};
    guint n = 0;
    for (guint k = 0; k < G_N_ELEMENTS(lists); k++)
        n += lists[k]->len;
    t->flat = g_renew(Patch, t->flat, MAX(n, 1));
    n = 0;
    for (guint k = 0; k < G_N_ELEMENTS(lists); k++) {
        if (lists[k]->len > 0) /* an empty GArray's data may be NULL: no memcpy from it */
            memcpy(t->flat + n, lists[k]->data, lists[k]->len * sizeof(Patch));
        n += *counts[k] = lists[k]->len;
    }
    t->recorded = TRUE, t->refused = FALSE;
}
