/* real_engine_ds: DeepSpeed's stages 2 and 3 in zreal. The ops (zp_sched with zp_impl_deepspeed)
 * say what is allocated, reduced and gathered; this file maps them onto tensors and buffers as
 * deepspeed/runtime/zero/stage_1_and_2.py and stage3.py lay them out. */
#include "real_engine_ds.h"
#include "real_engine_ds_internal.h"
#include "real_offload.h"
#include "real_zeropp.h"
#include "zp_offload.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_zeropp.h"

#include <string.h>

gboolean real_ds_applies(const ZpSchedule *s)
{
    return s->plan.impl == ZP_IMPL_DEEPSPEED && s->plan.zero.stage >= 2;
}

/* A reduction reading a bucket: the data-parallel group's (a tensor group's sums are the
 * model's, real_tp), or qgZ's intra-node all-to-all. */
static gboolean is_reduction(const RealDs *ds, const ZpOp *op)
{
    return op->kind == ZP_OP_COLLECTIVE &&
           ((op->group == ZP_GROUP_DP && !zp_sched_coll_fetches(ds->s, op)) ||
            (op->group == ZP_GROUP_NODE && op->sub == ZP_COLL_ALLTOALL));
}

/* The schedule's tensors (zp_impl_tensors: the layout DeepSpeed's flat groups follow), each
 * matched to real_gpt's, with its stage-3 slice of this rank's partition. */
static gboolean index_tensors(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    GArray *tensors = zp_impl_tensors(s);
    ds->n_t = tensors->len;
    ds->t = g_new0(Tensor, MAX(ds->n_t, 1));
    RealGptDims dims = real_engine_dims(&s->model, &s->plan);
    uint64_t part = 0;
    int k = 0;
    for (guint i = 0; i < ds->n_t; i++) {
        const ZpImplTensor *z = &g_array_index(tensors, ZpImplTensor, i);
        k = i > 0 && ds->t[i - 1].unit == z->unit ? k + 1 : 0;
        RealGptTensor rt[REAL_GPT_MAX_UNIT_TENSORS];
        const int n = real_gpt_unit_tensors(&dims, z->unit, rt);
        const uint64_t in_unit = z->offset - s->unit_offset[z->unit];
        if (k >= n || rt[k].offset_elems != in_unit || rt[k].elems != z->elems) {
            g_array_unref(tensors);
            return fail(error, "unit %d: the schedule's tensor %d (%" G_GUINT64_FORMAT
                        " elements) is not the model's", z->unit, k, z->elems);
        }
        const uint64_t slice = zp_mem_padded_elems(z->elems, (uint64_t)ds->dp) / (uint64_t)ds->dp;
        ds->t[i] = (Tensor){z->unit, k, z->offset, z->elems, in_unit, slice, part, -1,
                            {-1, -1, -1, -1}, {0}, NULL, 0};
        part += slice;
    }
    g_array_unref(tensors);
    /* DeepSpeed pads each parameter to dp (partition_parameters.py _partition_param); the
     * schedule's partition pads each unit, which holds them when no tensor needs padding of
     * its own beyond its unit's. */
    if (ds->stage == 3 && part > s->partition_elems)
        return fail(error, "DeepSpeed's stage 3 pads each tensor to %d ranks: %" G_GUINT64_FORMAT
                    " elements a rank, more than the schedule's partition of %" G_GUINT64_FORMAT,
                    ds->dp, part, s->partition_elems);
    return TRUE;
}

/* The bucket whose experts hold expert-space offset `at`, -1 none. */
static int expert_bucket(const RealDs *ds, uint64_t at)
{
    for (int k = 0; k < ds->n_buckets; k++)
        if (ds->bk[k].xelems > 0 && ds->bk[k].xlo <= at &&
            at < ds->bk[k].xlo + ds->bk[k].xelems)
            return k;
    return -1;
}

/* A bucket's experts' reduction over the EDP group (ZpImpl experts_in_buckets). */
static gboolean is_expert_reduction(const RealDs *ds, const ZpOp *op)
{
    return op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_EDP &&
           op->sub != ZP_COLL_ALLGATHER && op->buffer >= 0 &&
           expert_bucket(ds, op->elem_offset) >= 0;
}

/* The implementation's buckets (under qgZ a bucket is reduced tensor by tensor, by several
 * ops), and the buffer each lands in per micro-step: the one its reductions read; a buffer
 * reducing more than one bucket is a held ipg buffer. */
static gboolean index_buckets(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    for (guint i = 0; i < s->ops->len; i++)
        ds->n_buffers = MAX(ds->n_buffers, zp_sched_op(s, i)->buffer + 1);
    GArray *specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    zp_impl_get(s->plan.impl)->plan_buckets(s, specs);
    ds->n_buckets = (int)specs->len;
    ds->bk = g_new(Bucket, MAX(specs->len, 1));
    for (guint k = 0; k < specs->len; k++) {
        const ZpBucketSpec *b = &g_array_index(specs, ZpBucketSpec, k);
        ds->bk[k] = (Bucket){b->lo, b->hi, -1, 0, 0};
    }
    g_array_unref(specs);
    GArray *experts = zp_impl_bucket_experts(s);
    for (guint k = 0; experts && k < experts->len && (int)k < ds->n_buckets; k++) {
        ds->bk[k].xlo = g_array_index(experts, ZpBucketExperts, k).lo;
        ds->bk[k].xelems = g_array_index(experts, ZpBucketExperts, k).elems;
    }
    if (experts)
        g_array_unref(experts);
    const int G = s->plan.grad_accum;
    ds->bucket_buffer = g_new(int, MAX((gsize)G * (gsize)ds->n_buckets, 1));
    for (int i = 0; i < G * ds->n_buckets; i++)
        ds->bucket_buffer[i] = -1;
    ds->held = g_new0(gboolean, MAX(ds->n_buffers, 1));
    /* per buffer: the first bucket and micro-step it reduces (micro x buckets + bucket) */
    int *first = g_new(int, MAX(ds->n_buffers, 1));
    for (int b = 0; b < ds->n_buffers; b++)
        first[b] = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (is_expert_reduction(ds, op)) { /* a bucket's experts, from the same buffer */
            const int k = expert_bucket(ds, op->elem_offset);
            if (k < 0 || op->micro < 0 || op->micro >= G || op->buffer < 0)
                return g_free(first), fail(error, "op %u: an expert gradient reduction of no "
                                                  "bucket's experts, or with no buffer", i);
            const int at = op->micro * ds->n_buckets + k;
            ds->bucket_buffer[at] = op->buffer;
            ds->held[op->buffer] |= first[op->buffer] >= 0 && first[op->buffer] != at;
            if (first[op->buffer] < 0)
                first[op->buffer] = at;
            continue;
        }
        if (!is_reduction(ds, op))
            continue;
        const int k = bucket_at(ds, op->elem_offset);
        if (k < 0 || op->micro < 0 || op->micro >= G || op->buffer < 0 ||
            op->elem_offset + op->elems > ds->bk[k].hi)
            return g_free(first), fail(error, "op %u: a gradient reduction of a range no bucket "
                                              "covers, or with no buffer", i);
        const int at = op->micro * ds->n_buckets + k;
        ds->bucket_buffer[at] = op->buffer;
        ds->held[op->buffer] |= first[op->buffer] >= 0 && first[op->buffer] != at;
        if (first[op->buffer] < 0)
            first[op->buffer] = at;
    }
    g_free(first);
    for (guint i = 0; i < ds->n_t; i++) {
        Tensor *t = &ds->t[i];
        t->bucket = bucket_at(ds, t->offset);
        if (t->bucket < 0 || t->offset + t->elems > ds->bk[t->bucket].hi)
            return fail(error, "unit %d: tensor %d is in no gradient bucket", t->unit, t->k);
    }
    return TRUE;
}

/* The tied head's wte gradient buffer of each micro-step: a bucket buffer the head op waits
 * for that no reduction uses (zp_sched.c alloc_tied_grad). */
static gboolean index_tied_grad(RealDs *ds)
{
    const ZpSchedule *s = ds->s;
    ds->tied_grad = g_new(int, (gsize)s->plan.grad_accum);
    for (int m = 0; m < s->plan.grad_accum; m++)
        ds->tied_grad[m] = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_HEAD || op->micro < 0 ||
            op->micro >= s->plan.grad_accum)
            continue;
        for (uint32_t k = 0; k < op->n_deps; k++) {
            const ZpOp *d = zp_sched_op(s, zp_sched_deps(s, op)[k]);
            gboolean reduced = FALSE;
            for (int j = 0; j < s->plan.grad_accum * ds->n_buckets; j++)
                reduced |= ds->bucket_buffer[j] == d->buffer;
            if (d->kind == ZP_OP_ALLOC && d->sub == ZP_MEM_BUCKETS && d->unit == 0 && !reduced)
                ds->tied_grad[op->micro] = d->buffer;
        }
    }
    return TRUE;
}

/* Stage 3: the calls zp_impl_deepspeed plans for a micro-step (the schedule issues them in
 * that order, every micro-step alike), each tensor by its flat offset. */
static gboolean index_calls(RealDs *ds, GError **error)
{
    ds->flat_call = g_new(int, MAX(ds->n_buffers, 1));
    ds->quant_of = g_new(int, MAX(ds->n_buffers, 1));
    for (int b = 0; b < ds->n_buffers; b++)
        ds->flat_call[b] = ds->quant_of[b] = -1;
    if (ds->stage != 3)
        return TRUE;
    GArray *fetches = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    zp_impl_get(ds->s->plan.impl)->plan_fetches(ds->s, fetches);
    const ZpFetch *f = (const ZpFetch *)fetches->data;
    ds->calls = g_new0(Call, MAX(2 * fetches->len, 1));
    ds->members = g_new(guint, MAX(fetches->len, 1));
    gboolean ok = TRUE;
    guint m = 0;
    for (guint i = 0, j; ok && i < fetches->len; i = j) {
        for (j = i + 1; j < fetches->len && f[j].joins_previous; j++)
            ;
        /* with hpZ the parameters of a call used in backward go first, in a call of their
         * own (zp_sched.c plan_gathers) */
        for (int pass = 0; pass < 2; pass++) {
            const ZpGroup group = pass == 0 ? ZP_GROUP_HPZ : ZP_GROUP_DP;
            const int ranks = zp_zeropp_group_ranks(&ds->s->plan, group);
            Call c = {m, 0, 0, group, ranks};
            for (guint k = i; ok && k < j; k++) {
                if (zp_sched_fetch_group(ds->s, f[k].use_pos) != group)
                    continue;
                const int x = tensor_at(ds, f[k].offset);
                ok = x >= 0 && f[k].elems == ds->t[x].slice * (uint64_t)ds->dp &&
                     f[k].elems % (uint64_t)ranks == 0;
                ds->members[m++] = (guint)MAX(x, 0);
                c.n++;
                c.per_rank += f[k].elems / (uint64_t)ranks;
            }
            if (c.n > 0)
                ds->calls[ds->n_calls++] = c;
        }
    }
    g_array_unref(fetches);
    return ok ? TRUE : fail(error, "a stage-3 fetch of no whole tensor");
}

/* Stage 2: stage_1_and_2.py copy_grads_in_partition keeps the whole parameters that overlap
 * this rank's partition (params_in_partition), the partition's padding included, in
 * grads_in_partition: the schedule's first gradient alloc, at the step's first reduction
 * (zp_impl.h grads_taken_by_reduction), sized for the rank where that is largest; each later
 * micro-step's copy is the same size. Stage 3: the partition (stage3.py
 * __param_id_to_grad_partition), held throughout. */
static gboolean allocate_grads(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    const uint64_t P = s->partition_elems;
    /* A mixture of experts' gradient partition over its expert-data-parallel group is the
     * engine's (real_engine_moe: stage_1_and_2.py _configure_moe_settings gives an expert
     * param group its own partition, partition_count the expert DP group's size); what the
     * schedule's states hold beyond it is the dense one's. */
    ds->grad_elems = (uint64_t)(s->state_bytes[ZP_MEM_GRADS] / sizeof(RealBf16)) -
                     zp_sched_experts(s).partition_elems;
    ds->gip = -1;
    ds->grad_copy = g_new(int, (gsize)s->plan.grad_accum);
    for (int m = 0; m < s->plan.grad_accum; m++)
        ds->grad_copy[m] = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_ALLOC || op->sub != ZP_MEM_GRADS)
            continue;
        if (ds->stage == 2 && ds->gip < 0 && ds->grad_elems == 0) {
            ds->gip = op->buffer;
            ds->grad_elems = (uint64_t)(op->bytes / sizeof(RealBf16));
            continue;
        }
        if (ds->stage != 2 || op->micro <= 0 || op->micro >= s->plan.grad_accum ||
            op->bytes != (double)(ds->grad_elems * sizeof(RealBf16)))
            return fail(error, "op %u: a gradient copy other than stage 2's of a later "
                        "micro-step, the size of grads_in_partition", i);
        ds->grad_copy[op->micro] = op->buffer;
    }
    if (ds->stage == 2) {
        zp_impl_params_in_partition(s, ds->rank, &ds->gip_lo, &ds->gip_hi);
        if (ds->host_grads) /* offloaded: only the layout of the host's whole-tensor sums */
            return TRUE;
        if (ds->gip < 0)
            return fail(error, "the schedule takes no stage-2 grads_in_partition");
        if (ds->gip_hi - ds->gip_lo > ds->grad_elems)
            return fail(error, "rank %d: grads_in_partition needs %" G_GUINT64_FORMAT
                        " elements, the schedule holds %" G_GUINT64_FORMAT, ds->rank,
                        ds->gip_hi - ds->gip_lo, ds->grad_elems);
        return TRUE; /* the engine allocates it at its op */
    } else if (ds->host_grads) {
        return TRUE;
    } else if (ds->grad_elems != P) {
        return fail(error, "the schedule's stage-3 gradients are not the partition");
    }
    return (ds->grads = take(ds, ds->grad_elems * sizeof(RealBf16), ZP_MEM_GRADS, error)) != NULL;
}

/* Stage 3: the tensors the step refreshes whole (buffer -1 all-gathers after the optimizer:
 * partition_parameters.py ds_persist) get their full copies. */
static gboolean allocate_persistent(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    for (guint i = 0; ds->stage == 3 && i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COLLECTIVE || op->group != ZP_GROUP_DP ||
            op->sub != ZP_COLL_ALLGATHER || op->buffer >= 0)
            continue;
        const int x = tensor_at(ds, op->elem_offset);
        if (x < 0 || op->elems != ds->t[x].slice * (uint64_t)ds->dp)
            return fail(error, "op %u: a persistent all-gather of no whole tensor", i);
        if (!(ds->t[x].persistent = take(ds, op->elems * sizeof(RealBf16),
                                         ZP_MEM_GATHERED_PARAMS, error)))
            return FALSE;
    }
    return TRUE;
}

RealDs *real_ds_new(const ZpSchedule *s, RealBackend *be, RealComm *comm, void **buffers,
                    RealBf16 *params, GError **error)
{
    RealDs *ds = g_new0(RealDs, 1);
    *ds = (RealDs){.s = s, .be = be, .comm = comm, .buffers = buffers, .params = params,
                   .pending = g_array_new(FALSE, FALSE, sizeof(Pending)),
                   .stage = s->plan.zero.stage, .dp = s->plan.dp, .rank = comm->rank,
                   .host_grads = zp_offload_cpu_share(&s->plan, (double)s->partition_elems) > 0,
                   .host_params = zp_offload_param_tier(&s->plan) != ZP_TIER_GPU};
    if (!index_tensors(ds, error) || !index_buckets(ds, error) || !index_calls(ds, error) ||
        !index_tied_grad(ds) || !allocate_grads(ds, error) || !allocate_persistent(ds, error)) {
        real_ds_free(ds);
        return NULL;
    }
    return ds;
}

void real_ds_free(RealDs *ds)
{
    if (!ds)
        return;
    for (guint i = 0; i < ds->n_t; i++)
        ds->be->free(ds->be, ds->t[i].persistent);
    ds->be->free(ds->be, ds->grads);
    g_free(ds->grad_copy);
    for (guint i = 0; i < ds->pending->len; i++)
        ds->be->free(ds->be, g_array_index(ds->pending, Pending, i).grad);
    g_array_unref(ds->pending);
    g_free(ds->t), g_free(ds->bk), g_free(ds->bucket_buffer);
    g_free(ds->held);
    g_free(ds->calls), g_free(ds->members), g_free(ds->flat_call), g_free(ds->tied_grad);
    g_free(ds->quant_of);
    ds->be->free(ds->be, ds->secondary);
    g_free(ds);
}

gboolean real_ds_init_params(RealDs *ds, RealDsInitFn init, void *engine, GError **error)
{
    for (guint i = 0; i < ds->n_t; i++) {
        const Tensor *t = &ds->t[i];
        const uint64_t first = MIN((uint64_t)ds->rank * t->slice, t->elems);
        const uint64_t count = MIN(t->slice, t->elems - first);
        if ((count > 0 && !init(engine, t->unit, t->in_unit + first, count,
                                ds->params + t->part, error)) ||
            (t->persistent && !init(engine, t->unit, t->in_unit, t->elems, t->persistent, error)))
            return FALSE;
    }
    return TRUE;
}

/* Where a compute op reads tensor t's parameters: stage 2's full copy, stage 3's persistent
 * copy or its live gather. */
static RealBf16 *tensor_params(RealDs *ds, const Tensor *t, GError **error)
{
    if (ds->stage == 2)
        return ds->params + t->offset;
    if (t->persistent)
        return t->persistent;
    for (size_t i = 0; i < G_N_ELEMENTS(t->gathered); i++)
        if (t->gathered[i] >= 0 && ds->buffers[t->gathered[i]])
            return (RealBf16 *)ds->buffers[t->gathered[i]] + t->gathered_at[i];
    return fail(error, "rank %d: unit %d's tensor %d is used but was not gathered", ds->rank,
                t->unit, t->k), NULL;
}

static int pending_bucket(const RealDs *ds, const Pending *w)
{
    return w->tensor == NO_TENSOR ? w->bucket : ds->t[w->tensor].bucket;
}

/* Whether bucket k of micro-step `micro` has its place (its own buffer, or the held ipg
 * buffer) or can take it now: an ipg buffer holds one bucket at a time, from its first
 * gradient to its reduction (DeepSpeed's bucket.buffer from offset 0, emptied by
 * __reduce_and_partition_ipg_grads / reduce_ipg_grads), and the buckets fill in their order,
 * so not while an earlier one's gradients wait. */
static gboolean has_room(const RealDs *ds, int k, int micro)
{
    const int id = ds->bucket_buffer[micro * ds->n_buckets + k];
    if (id < 0 || !ds->held[id] || ds->bk[k].landed_in == id)
        return TRUE;
    for (guint i = 0; i < ds->pending->len; i++)
        if (pending_bucket(ds, &g_array_index(ds->pending, Pending, i)) < k)
            return FALSE;
    for (int j = 0; j < ds->n_buckets; j++)
        if (ds->bk[j].landed_in == id)
            return FALSE;
    return TRUE;
}

/* Where bucket k's gradients of micro-step `micro` lie: the start of its own buffer or of the
 * held ipg buffer, taken when its first tensor lands. Either is zeroed then, as
 * backward adds into it (real_engine zeroes no bucket of unit -1, such as the ipg buffer
 * when it reduces one bucket only). DeepSpeed fills the ipg buffer tensor by tensor and
 * reduces it when the next parameter does not fit (stage3.py
 * reduce_independent_p_g_buckets_and_remove_grads); a module's backward here hands on its
 * tensors' gradients together, and a bucket with no room yet is not landed (its gradients
 * wait: Pending). */
RealBf16 *real_ds_land(RealDs *ds, int k, int micro, GError **error)
{
    Bucket *b = &ds->bk[k];
    const int id = ds->bucket_buffer[micro * ds->n_buckets + k];
    RealBf16 *buf = id >= 0 ? ds->buffers[id] : NULL;
    if (!buf)
        return fail(error, "rank %d: bucket [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ") of "
                    "micro-step %d has no buffer allocated", ds->rank, b->lo, b->hi, micro), NULL;
    if (b->landed_in != id) {
        if (!has_room(ds, k, micro))
            return fail(error, "rank %d: bucket [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        ") is reduced while the ipg buffer (reduce_bucket_size %.0f elements) "
                        "has no room for it", ds->rank, b->lo, b->hi,
                        ds->s->plan.zero.reduce_bucket_size), NULL;
        b->landed_in = id;
        ds->be->fill(ds->be, buf, 0, (b->hi - b->lo + b->xelems) * sizeof(RealBf16));
    }
    return buf;
}

/* Where tensor x's gradients of micro-step `micro` are added: its place in its bucket, or
 * while the bucket has no room a zeroed buffer of its own (one per tensor and micro-step). */
static RealBf16 *grad_place(RealDs *ds, guint x, int micro, GError **error)
{
    const Tensor *t = &ds->t[x];
    if (has_room(ds, t->bucket, micro)) {
        RealBf16 *place = real_ds_land(ds, t->bucket, micro, error);
        return place ? place + (t->offset - ds->bk[t->bucket].lo) : NULL;
    }
    for (guint i = 0; i < ds->pending->len; i++) {
        const Pending *w = &g_array_index(ds->pending, Pending, i);
        if (w->tensor == x && w->micro == micro)
            return w->grad;
    }
    const Pending w = {x, micro, take(ds, t->elems * sizeof(RealBf16), ZP_MEM_WORKSPACE, error),
                       -1, 0, 0};
    if (w.grad)
        g_array_append_val(ds->pending, w);
    return w.grad;
}

/* The waiting gradients whose buckets have room now, copied into them, in the order they
 * were handed on. */
gboolean real_ds_land_pending(RealDs *ds, GError **error)
{
    for (guint i = 0; i < ds->pending->len;) {
        const Pending w = g_array_index(ds->pending, Pending, i);
        const int k = pending_bucket(ds, &w);
        if (!has_room(ds, k, w.micro)) {
            i++;
            continue;
        }
        RealBf16 *place = real_ds_land(ds, k, w.micro, error);
        if (!place)
            return FALSE;
        if (w.tensor == NO_TENSOR) /* experts: after the bucket's dense part */
            ds->be->copy(ds->be, place + (ds->bk[k].hi - ds->bk[k].lo) + w.at, w.grad,
                         w.elems * sizeof(RealBf16));
        else
            ds->be->copy(ds->be, place + (ds->t[w.tensor].offset - ds->bk[k].lo), w.grad,
                         ds->t[w.tensor].elems * sizeof(RealBf16));
        ds->be->free(ds->be, w.grad);
        g_array_remove_index(ds->pending, i);
    }
    return TRUE;
}

RealBf16 *real_ds_expert_grads(RealDs *ds, uint64_t at, uint64_t elems, int micro,
                               GError **error)
{
    const int k = expert_bucket(ds, at);
    if (k < 0 || at + elems > ds->bk[k].xlo + ds->bk[k].xelems)
        return fail(error, "rank %d: experts at %" G_GUINT64_FORMAT " are in no gradient bucket",
                    ds->rank, at), NULL;
    const uint64_t in = at - ds->bk[k].xlo;
    if (has_room(ds, k, micro)) {
        RealBf16 *place = real_ds_land(ds, k, micro, error);
        return place ? place + (ds->bk[k].hi - ds->bk[k].lo) + in : NULL;
    }
    for (guint i = 0; i < ds->pending->len; i++) {
        const Pending *w = &g_array_index(ds->pending, Pending, i);
        if (w->tensor == NO_TENSOR && w->bucket == k && w->at == in && w->micro == micro)
            return w->grad;
    }
    const uint64_t bytes = elems * sizeof(RealBf16);
    const Pending w = {NO_TENSOR, micro, take(ds, bytes, ZP_MEM_WORKSPACE, error), k, in, elems};
    if (!w.grad)
        return NULL;
    ds->be->fill(ds->be, w.grad, 0, bytes);
    g_array_append_val(ds->pending, w);
    return w.grad;
}

RealBf16 *real_ds_expert_region(RealDs *ds, uint64_t lo, uint64_t elems, int micro, int *bucket,
                                GError **error)
{
    const int k = *bucket = expert_bucket(ds, lo);
    if (k < 0 || ds->bk[k].xlo != lo || ds->bk[k].xelems != elems)
        return fail(error, "rank %d: an expert reduction [%" G_GUINT64_FORMAT ", +%"
                    G_GUINT64_FORMAT ") of no bucket's experts", ds->rank, lo, elems), NULL;
    if (!real_ds_land_pending(ds, error))
        return NULL;
    const int id = ds->bucket_buffer[micro * ds->n_buckets + k];
    if (id < 0 || ds->bk[k].landed_in != id)
        return fail(error, "rank %d: bucket %d's experts are reduced before they landed",
                    ds->rank, k), NULL;
    return (RealBf16 *)ds->buffers[id] + (ds->bk[k].hi - ds->bk[k].lo);
}

gboolean real_ds_experts_reduced(RealDs *ds, int k, GError **error)
{
    ds->bk[k].landed_in = -1;
    return real_ds_land_pending(ds, error);
}

/* The tied head's wte gradient of micro-step `micro` when it waits in a buffer of its own:
 * the head (which asks for wte alone) writes there; the embedding's backward finds it
 * copied into wte's place of its bucket, untouched since the bucket landed (no other op
 * writes wte's gradient), and adds its own (autograd's sum, then the hook's copy into the
 * ipg buffer). */
static RealBf16 *tied_grad(RealDs *ds, guint x, uint32_t used, int micro, GError **error)
{
    RealBf16 *wait = ds->buffers[ds->tied_grad[micro]];
    if (!wait)
        return fail(error, "rank %d: the tied head's wte gradient has no buffer", ds->rank),
               NULL;
    if (used == 1u)
        return wait;
    RealBf16 *place = grad_place(ds, x, micro, error);
    if (place)
        ds->be->copy(ds->be, place, wait, ds->t[x].elems * sizeof(RealBf16));
    return place;
}

/* Unit u's tensors in `used`: their parameters (micro -1) or where micro-step micro's
 * gradients land. */
static gboolean view(RealDs *ds, int unit, uint32_t used, int micro, RealGptTensors *out,
                     GError **error)
{
    memset(out, 0, sizeof *out);
    /* from the last tensor down, as backward hands gradients on */
    for (guint j = ds->n_t; j-- > 0;) {
        const guint i = j;
        const Tensor *t = &ds->t[i];
        if (t->unit != unit || !(used >> t->k & 1))
            continue;
        if (micro >= 0 && t->unit == 0 && t->k == 0 && ds->tied_grad[micro] >= 0) {
            if (!(out->at[t->k] = tied_grad(ds, i, used, micro, error)))
                return FALSE;
            continue;
        }
        if (!(out->at[t->k] = micro < 0 ? tensor_params(ds, t, error)
                                        : grad_place(ds, i, micro, error)))
            return FALSE;
    }
    return TRUE;
}

gboolean real_ds_params(RealDs *ds, int unit, uint32_t used, RealGptTensors *out,
                        GError **error)
{
    return view(ds, unit, used, -1, out, error);
}

gboolean real_ds_grads(RealDs *ds, int unit, uint32_t used, int micro, RealGptTensors *out,
                       GError **error)
{
    return view(ds, unit, used, micro, out, error);
}

const RealBf16 *real_ds_step_grads(const RealDs *ds)
{
    const RealBf16 *g = grads_in_partition(ds);
    if (ds->stage != 2)
        return ds->grads;
    return g ? g + ((uint64_t)ds->rank * ds->s->partition_elems - ds->gip_lo) : NULL;
}
