/* real_engine_comm: the engine's collectives (reductions of buckets and units, gathers, qgZ,
 * checkpoint gathers) and offload transfers between the device and real_offload's tiers. */
#include "real_engine_internal.h"
#include "real_engine.h"
#include "real_engine_ds.h"
#include "real_offload.h"
#include "zp_impl.h"
#include "zp_offload.h"
#include "real_data.h"
#include "real_gpt.h"
#include "real_pipe.h"
#include "real_zeropp.h"
#include "real_zeror.h"
#include "zp_zeropp.h"
#include "zp_zeror.h"
#include "zp_mem.h"
#include "zp_util.h"

#include <string.h>

#include <string.h>

/* ---- collectives ------------------------------------------------------------------------- */

/* Stages 1-2: rank q receives the part of [lo, hi) inside its partition [qP, (q+1)P). */
static int *partition_counts(const RealEngine *e, uint64_t lo, uint64_t hi)
{
    const uint64_t P = e->s->partition_elems;
    int *counts = g_new0(int, e->dp);
    for (int q = 0; q < e->dp; q++) {
        const uint64_t a = MAX(lo, (uint64_t)q * P), b = MIN(hi, (uint64_t)(q + 1) * P);
        counts[q] = b > a ? (int)(b - a) : 0;
    }
    return counts;
}

/* The unit holding flat offset `at`, -1 none. */
static int unit_at(const ZpSchedule *s, uint64_t at)
{
    for (int u = 0; u < s->n_units; u++)
        if (at >= s->unit_offset[u] && at < s->unit_offset[u] + s->unit_elems[u])
            return u;
    return -1;
}

/* Stages 0-1: where the full gradients of flat offset `at` lie (one array, or with
 * full_by_unit its unit's buffer), NULL when not taken. */
static RealBf16 *full_grads_at(const RealEngine *e, uint64_t at)
{
    if (!e->full_by_unit)
        return e->grads + at;
    const int u = unit_at(e->s, at);
    return u >= 0 && e->unit_grads[u] ? e->unit_grads[u] + (at - e->s->unit_offset[u]) : NULL;
}

/* Stages 0-1: the full gradients of flat range [lo, lo + n) copied into buf, or from buf
 * into them (`into`), unit by unit with full_by_unit. */
static gboolean full_grads_copy(RealEngine *e, uint64_t lo, uint64_t n, RealBf16 *buf,
                                gboolean into, GError **error)
{
    for (uint64_t at = lo, run; at < lo + n; at += run) {
        const int u = e->full_by_unit ? unit_at(e->s, at) : -1;
        run = u >= 0 ? MIN(lo + n, e->s->unit_offset[u] + e->s->unit_elems[u]) - at
                     : lo + n - at;
        RealBf16 *full = full_grads_at(e, at);
        if (!full)
            return fail(error, "rank %d: the full gradients of flat offset %" G_GUINT64_FORMAT
                        " are reduced but not taken", e->rank, at);
        e->be->copy(e->be, into ? full : buf + (at - lo), into ? buf + (at - lo) : full,
                    run * sizeof(RealBf16));
    }
    return TRUE;
}

static gboolean reduce_flat(RealEngine *e, const ZpOp *op, GError **error)
{
    const uint64_t lo = op->elem_offset, hi = lo + op->elems;
    if (op->buffer < 0) { /* a parameter larger than the bucket, reduced in place */
        RealBf16 *full = e->stage < 2 ? full_grads_at(e, lo) : NULL;
        if (!full || op->sub != ZP_COLL_ALLREDUCE)
            return fail(error, "rank %d: a bucketless reduction is an all-reduce of the full "
                               "gradients (stages 0-1)", e->rank);
        return e->comm->allreduce_bf16(e->comm, full, hi - lo, error);
    }
    RealBf16 *bucket = e->buffers[op->buffer];
    /* stages 0-1: the full gradients are kept apart; the bucket is a copy */
    if (e->stage < 2 && !full_grads_copy(e, lo, hi - lo, bucket, FALSE, error))
        return FALSE;
    if (op->sub == ZP_COLL_ALLREDUCE)
        return e->comm->allreduce_bf16(e->comm, bucket, hi - lo, error) &&
               full_grads_copy(e, lo, hi - lo, bucket, TRUE, error);
    int *counts = partition_counts(e, lo, hi);
    gboolean ok = e->comm->reduce_scatter_bf16(e->comm, bucket, counts, error);
    const uint64_t mine = (uint64_t)counts[e->rank];
    g_free(counts);
    if (!ok || mine == 0 || e->host_grads) /* offloaded: the transfers take it from the bucket */
        return ok;
    const uint64_t start = MAX(lo, e->part_base); /* first element of ours in the flat space */
    if (e->stage == 1)
        return full_grads_copy(e, start, mine, bucket, TRUE, error);
    real_engine_deliver(e->be, e->grads + (start - e->part_base), bucket, mine, op->micro > 0);
    return TRUE;
}

/* Stage 1 (index_stage1_grads): the reduced gradients of [lo, hi) in this rank's partition,
 * copied from the full gradients into grads_in_partition (stage_1_and_2.py
 * copy_grads_in_partition; the rest of its whole tensors the step never reads). */
static gboolean copy_grads_in_partition(RealEngine *e, const ZpOp *op, GError **error)
{
    const uint64_t P = e->s->partition_elems;
    const uint64_t a = MAX(op->elem_offset, e->part_base);
    const uint64_t b = MIN(op->elem_offset + op->elems, e->part_base + P);
    RealBf16 *gip = e->buffers[e->gip_id];
    if (!gip)
        return fail(error, "rank %d: a stage-1 reduction before grads_in_partition is taken",
                    e->rank);
    return b <= a || full_grads_copy(e, a, b - a, gip + (a - e->gip_lo), FALSE, error);
}

/* Stage 3: each unit of the bucket is reduce-scattered over its own padded partition. */
static gboolean reduce_units(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    for (int u = 0; u < s->n_units; u++) {
        if (s->unit_offset[u] < op->elem_offset ||
            s->unit_offset[u] >= op->elem_offset + op->elems)
            continue;
        const int slice = (int)(unit_padded(e, u) / (uint64_t)e->dp);
        int *counts = g_new(int, e->dp);
        for (int q = 0; q < e->dp; q++)
            counts[q] = slice;
        const gboolean ok = e->comm->reduce_scatter_bf16(e->comm, e->unit_grads[u], counts, error);
        g_free(counts);
        if (!ok)
            return FALSE;
        if (!e->host_grads)
            real_engine_deliver(e->be, e->grads + e->part_off[u], e->unit_grads[u],
                                (uint64_t)slice, op->micro > 0);
    }
    return TRUE;
}

/* Stage 3: over the DP group, or hpZ's in backward; qwZ's int8 and scales in place in the
 * quantize op's buffer, dequantised when the unit is needed. A subgroup's bytes count in
 * the rank's total. */
static gboolean gather_unit(RealEngine *e, const ZpOp *op, GError **error)
{
    const int u = op->unit;
    const ZpGroup group = (ZpGroup)op->group;
    RealComm *c = gather_comm(e, group);
    if (!c)
        return fail(error, "an hpZ gather without zero_hpz_partition_size");
    const double before = c->sent_bytes;
    const uint64_t slice = unit_padded(e, u) / (uint64_t)c->size;
    RealBf16 *dst = e->buffers[op->buffer];
    gboolean ok;
    if (e->s->plan.zero.zero_quantized_weights) {
        const int quant = e->quant_of[op->buffer];
        if (quant < 0 || !e->buffers[quant])
            return fail(error, "a qwZ gather of unit %d with no int8 buffer", u);
        ok = c->allgather_bytes(c, e->buffers[quant],
                                real_zeropp_quantized_bytes(slice, zp_zeropp_qwz_groups(slice)),
                                error);
    } else {
        /* With offload_param the transfer before the gather put this rank's slice in place. */
        const RealBf16 *src = e->host_params ? dst + (uint64_t)c->rank * slice
                                             : gather_source(e, u, group);
        ok = c->allgather_bf16(c, src, slice, dst, error);
        if (ok) {
            e->unit_params[u] = dst;
            keep_secondary(e, u, group, dst);
        }
    }
    if (c != e->comm)
        e->comm->sent_bytes += c->sent_bytes - before;
    return ok;
}

static gboolean gather(RealEngine *e, const ZpOp *op, GError **error)
{
    const size_t b2 = sizeof(RealBf16);
    if (e->stage == 3 && op->buffer >= 0) /* a unit into its gathered buffer */
        return gather_unit(e, op, error);
    if (e->stage == 3) { /* a persistent unit's full copy */
        const uint64_t slice = unit_padded(e, op->unit) / (uint64_t)e->dp;
        return e->comm->allgather_bf16(e->comm, e->params + e->part_off[op->unit], slice,
                                       e->persistent[op->unit], error);
    }
    /* Stages 1-2: a chunk at offset elem_offset of every rank's partition. */
    const uint64_t n = op->elems / (uint64_t)e->dp, P = e->s->partition_elems;
    if (op->buffer < 0) { /* in place (runtime/utils.py all_gather_dp_groups): one chunk */
        if (op->elem_offset != 0 || n != P)
            return fail(error, "rank %d: an in-place all-gather takes the whole partition in "
                               "one chunk (allgather_bucket_size at least the parameters)",
                        e->rank);
        return e->comm->allgather_bf16(e->comm, e->params + e->part_base, P, e->params, error);
    }
    RealBf16 *bucket = e->buffers[op->buffer];
    if (!e->comm->allgather_bf16(e->comm, e->params + e->part_base + op->elem_offset, n, bucket,
                                 error))
        return FALSE;
    for (int q = 0; q < e->dp; q++)
        e->be->copy(e->be, e->params + (uint64_t)q * P + op->elem_offset, bucket + (uint64_t)q * n,
                    n * b2);
    return TRUE;
}

/* qgZ at the bucket's all-to-all inside the node (zp_sched's qgz_reduce): the bucket's units
 * as the world's partitions (rank q's slice of every unit, in order) through real_engine_qgz
 * in zp_zeropp_qgz's groups, and this rank's sum delivered as a reduce-scatter's is; the
 * all-to-all across nodes and the kernels around them are part of it. */
static gboolean qgz_reduce(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    const uint64_t lo = op->elem_offset, hi = lo + op->elems;
    uint64_t part = 0;
    for (int u = 0; u < s->n_units; u++)
        if (s->unit_offset[u] >= lo && s->unit_offset[u] < hi)
            part += unit_padded(e, u) / (uint64_t)e->dp;
    if (part * (uint64_t)e->dp != op->elems || e->qgz_work < 0 || !e->buffers[e->qgz_work])
        return fail(error, "a qgZ all-to-all must cover whole padded units after its int4 "
                    "buffer");
    const ZpQgz q = zp_zeropp_qgz(&s->plan, (double)op->elems,
                                  (double)s->model.hidden / s->plan.mp,
                                  zp_plan_reduce_bytes(&s->plan));
    float *pieces = take(e, op->elems * sizeof(float), ZP_MEM_WORKSPACE, error);
    RealBf16 *mine = pieces ? take(e, part * sizeof(RealBf16), ZP_MEM_WORKSPACE, error) : NULL;
    gboolean ok = mine != NULL;
    uint64_t at = 0; /* a unit's offset in every partition */
    for (int u = 0; ok && u < s->n_units; u++) {
        if (s->unit_offset[u] < lo || s->unit_offset[u] >= hi)
            continue;
        const uint64_t slice = unit_padded(e, u) / (uint64_t)e->dp;
        for (int r = 0; r < e->dp; r++)
            for (uint64_t k = 0; k < slice; k++)
                pieces[(uint64_t)r * part + at + k] =
                    real_bf16_to_f32(e->unit_grads[u][(uint64_t)r * slice + k]);
        at += slice;
    }
    ok = ok && real_engine_qgz(e->be, e->rank, e->comm, e->qgz_node, e->qgz_cross, pieces, part,
                               (uint64_t)q.groups / (uint64_t)e->dp, e->buffers[e->qgz_work],
                               mine, error);
    at = 0;
    for (int u = 0; ok && u < s->n_units; u++) {
        if (s->unit_offset[u] < lo || s->unit_offset[u] >= hi)
            continue;
        const uint64_t slice = unit_padded(e, u) / (uint64_t)e->dp;
        real_engine_deliver(e->be, e->grads + e->part_off[u], mine + at, slice, op->micro > 0);
        at += slice;
    }
    e->be->free(e->be, pieces);
    e->be->free(e->be, mine);
    return ok;
}

/* qgZ's intra-node all-to-all (the op does the whole reduction): the engine's bucket, or
 * under DeepSpeed's stage 3 one tensor (real_ds_qgz). */
static gboolean qgz_node_op(RealEngine *e, const ZpOp *op, GError **error)
{
    if (!e->ds)
        return qgz_reduce(e, op, error);
    if (e->qgz_work < 0 || !e->buffers[e->qgz_work])
        return fail(error, "a qgZ all-to-all with no int4 buffer before it");
    return real_ds_qgz(e->ds, op, e->qgz_node, e->qgz_cross, e->buffers[e->qgz_work],
                       e->qgz_work_bytes, error);
}

/* Pa's all-gather before block op->unit's recompute (DeepSpeed's checkpointing.py,
 * gather_partitioned_activations, called by CheckpointFunction.backward): this rank's slice
 * into its place in the new whole buffer (from the GPU slice; with cpu_checkpointing the
 * host copy put it there), then all_gather_into_tensor over the tensor group. */
static gboolean gather_checkpoint(RealEngine *e, const ZpOp *op, GError **error)
{
    const gsize at = slot(e, op->unit, op->micro);
    void *whole = e->buffers[e->ckpt_buffer[at]];
    const uint64_t elems = real_gpt_checkpoint_bytes(&e->dims) / sizeof(RealBf16);
    if (op->elems != elems)
        return fail(error, "the schedule gathers %" G_GUINT64_FORMAT " elements of block %d's "
                    "checkpoint; its input has %" G_GUINT64_FORMAT, op->elems, op->unit, elems);
    if (!e->ckpt_host)
        e->be->copy(e->be, block_input_slice(e, whole), e->buffers[e->ckpt_slice[at]],
                    e->ckpt_slice_bytes);
    return real_tp_gather_checkpoint(e->cfg.tp, whole, e->ckpt_slice_bytes / sizeof(RealBf16),
                                     error);
}

gboolean real_engine_do_collective(RealEngine *e, const ZpOp *op, GError **error)
{
    gboolean experts = FALSE; /* over the EP or EDP group: real_engine_moe's */
    if (!real_engine_moe_collective(e, op, &experts, error) || experts)
        return experts;
    /* A tensor group's all-gather of a block (not the head's logits): Pa's. */
    if (op->group == ZP_GROUP_TP && e->cfg.tp && op->sub == ZP_COLL_ALLGATHER &&
        op->unit >= 1 && op->unit <= e->L)
        return gather_checkpoint(e, op, error);
    if (op->group == ZP_GROUP_TP && e->cfg.tp)
        return real_tp_collective(e->cfg.tp, op, error);
    if (op->sub == ZP_COLL_ALLTOALL) /* qgZ: the node's op does both (qgz_node_op) */
        return op->group == ZP_GROUP_NODE ? qgz_node_op(e, op, error) : TRUE;
    if (e->ds)
        return real_ds_collective(e->ds, op, error);
    if (e->fw && (op->group == ZP_GROUP_DP || op->group == ZP_GROUP_HPZ))
        return e->fw_ops->collective(e->fw, op, error);
    if (op->group != ZP_GROUP_DP && op->group != ZP_GROUP_HPZ)
        return fail(error, "zreal has no qgZ's node groups");
    if (op->sub == ZP_COLL_ALLGATHER)
        return gather(e, op, error);
    if (e->stage == 3)
        return reduce_units(e, op, error);
    return reduce_flat(e, op, error) && (e->gip_id < 0 || copy_grads_in_partition(e, op, error));
}

/* ---- offload transfers ------------------------------------------------------------------ */

/* The op a transfer chain hangs off (its first dependencies, past other transfers): the
 * bucket's collective for gradients, the gathered buffer's alloc for parameters. */
static const ZpOp *transfer_origin(const RealEngine *e, const ZpOp *op)
{
    while (op && op->kind == ZP_OP_TRANSFER)
        op = op->n_deps ? zp_sched_op(e->s, zp_sched_deps(e->s, op)[0]) : NULL;
    return op;
}

/* One slice of this rank's reduced gradients of a bucket: down to the host (d2h), the
 * host's sum up and added (h2d, later micro-steps), or out to NVMe (nvme_write). */
static gboolean grad_slice(RealEngine *e, const ZpOp *op, RealBf16 *dev, uint64_t at, uint64_t n,
                           GError **error)
{
    switch ((ZpTransferKind)op->sub) {
    case ZP_XFER_D2H:
        return real_offload_grads_down(e->offload, dev, at, n, error);
    case ZP_XFER_H2D:
        return real_offload_grads_up_add(e->offload, dev, at, n, error);
    case ZP_XFER_NVME_WRITE:
        return real_offload_grads_out(e->offload, at, n, error);
    default:
        return fail(error, "zreal reads no gradients from NVMe during backward");
    }
}

/* This rank's reduced slices of the bucket `coll` reduced: stage 1 in the full gradients,
 * stage 2 at the head of the bucket (its reduce-scatter's share), stage 3 at the head of
 * each unit's padded part of the bucket. */
static gboolean grad_transfer(RealEngine *e, const ZpOp *op, const ZpOp *coll, GError **error)
{
    const uint64_t lo = MAX(coll->elem_offset, e->part_base);
    const uint64_t hi = MIN(coll->elem_offset + coll->elems, e->part_base + e->opt_elems);
    if (e->stage == 1)
        return hi <= lo || grad_slice(e, op, e->grads + lo, lo - e->part_base, hi - lo, error);
    if (e->stage == 2)
        return hi <= lo || grad_slice(e, op, e->buffers[coll->buffer], lo - e->part_base,
                                      hi - lo, error);
    for (int u = 0; u < e->s->n_units; u++)
        if (e->s->unit_offset[u] >= coll->elem_offset &&
            e->s->unit_offset[u] < coll->elem_offset + coll->elems &&
            !grad_slice(e, op, e->unit_grads[u], e->part_off[u], unit_padded(e, u) / (uint64_t)e->dp,
                        error))
            return FALSE;
    return TRUE;
}

gboolean real_engine_ckpt_host_stats(const RealEngine *e, RealAllocStats *host,
                                     double *down_bytes, double *up_bytes)
{
    if (!e->ckpt_host)
        return FALSE;
    real_zeror_stats(e->ckpt_host, host, down_bytes, up_bytes);
    return TRUE;
}

/* Stage 3 with offload_param: unit u's slice from NVMe into the pool, then up into its place
 * in the gathered buffer. */
static gboolean param_transfer(RealEngine *e, const ZpOp *op, const ZpOp *alloc, GError **error)
{
    const uint64_t n = unit_padded(e, op->unit) / (uint64_t)e->dp;
    if (op->sub == ZP_XFER_NVME_READ)
        return real_offload_param_read(e->offload, e->part_off[op->unit], n, 0, error);
    if (op->sub != ZP_XFER_H2D || !e->buffers[alloc->buffer])
        return fail(error, "a parameter fetch moves a slice from NVMe and up, nothing else");
    real_offload_param_fetch(e->offload, (RealBf16 *)e->buffers[alloc->buffer] + e->rank * n,
                             e->part_off[op->unit], n, 0);
    return TRUE;
}

/* The schedule's transfers: around the CPU step (unit -1: states in from NVMe, states and
 * parameters out, the 16-bit partition up), gradient slices after their bucket's reduction,
 * parameter slices before their gather. */
gboolean real_engine_do_transfer(RealEngine *e, const ZpOp *op, GError **error)
{
    if (op->unit < 0) {
        switch ((ZpTransferKind)op->sub) {
        case ZP_XFER_NVME_READ:
            return real_offload_states_in(e->offload, error);
        case ZP_XFER_NVME_WRITE:
            return real_offload_states_out(e->offload, error);
        case ZP_XFER_H2D:
            real_offload_params_up(e->offload, e->params + e->part_base);
            return TRUE;
        default:
            return fail(error, "nothing goes down to the host after the step");
        }
    }
    const ZpOp *origin = transfer_origin(e, op);
    if (origin && origin->kind == ZP_OP_COLLECTIVE)
        return e->ds ? real_ds_grad_transfer(e->ds, op, origin, e->offload, error)
                     : grad_transfer(e, op, origin, error);
    if (origin && origin->kind == ZP_OP_ALLOC && e->host_params)
        return e->ds ? real_ds_param_transfer(e->ds, op, origin, e->offload, error)
                     : param_transfer(e, op, origin, error);
    return fail(error, "zreal moves gradients after their reduction and parameters before "
                       "their gather, nothing else");
}

gboolean real_engine_offload_stats(const RealEngine *e, RealAllocStats *host,
                                   double moved[ZP_XFER_N], double *direct_bytes)
{
    if (!e->offload)
        return FALSE;
    real_offload_stats(e->offload, host, moved, direct_bytes);
    return TRUE;
}

const char *real_engine_nvme_note(const RealEngine *e)
{
    return e->offload ? real_offload_nvme_note(e->offload) : NULL;
}
