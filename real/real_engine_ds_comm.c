/* real_engine_ds_comm: the DeepSpeed plug-in's collectives and transfers: buckets reduced
 * (stage 2's, stage 3's, qgZ's), coalesced gathers (qwZ, hpZ, persistence), their offload. */
#include "real_engine_ds.h"
#include "real_engine_ds_internal.h"
#include "real_offload.h"
#include "real_zeropp.h"
#include "zp_offload.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_zeropp.h"

#include <string.h>

/* Stage 2: the elements of flat range [lo, hi) in rank q's partition, from *start. */
static uint64_t part_overlap(const RealDs *ds, uint64_t lo, uint64_t hi, int q, uint64_t *start)
{
    const uint64_t P = ds->s->partition_elems;
    const uint64_t x = MAX(lo, (uint64_t)q * P), y = MIN(hi, (uint64_t)(q + 1) * P);
    *start = x;
    return y > x ? y - x : 0;
}

/* Stage 2: the bucket all-reduced (use_multi_rank_bucket_allreduce) or each rank's part of it
 * reduced to it (stage_1_and_2.py average_tensor); grads_in_partition takes the whole
 * tensors that overlap this rank's partition, the rest is dropped; a later micro-step's land
 * in its copy (copy_grads_in_partition), added to the sum in bf16 (the epilogue's
 * accumulated_grad.add_(new_avg_grad), here bucket by bucket: the same sums). */
static gboolean reduce_stage2(RealDs *ds, const ZpOp *op, RealBf16 *data, GError **error)
{
    const uint64_t lo = op->elem_offset, hi = lo + op->elems;
    uint64_t a = MAX(lo, ds->gip_lo), b = MIN(hi, ds->gip_hi), start;
    gboolean ok;
    if (op->sub == ZP_COLL_ALLREDUCE) {
        ok = ds->comm->allreduce_bf16(ds->comm, data, hi - lo, error);
    } else {
        int *counts = g_new0(int, ds->dp);
        for (int q = 0; q < ds->dp; q++)
            counts[q] = (int)part_overlap(ds, lo, hi, q, &start);
        ok = ds->comm->reduce_scatter_bf16(ds->comm, data, counts, error);
        g_free(counts);
        const uint64_t mine = part_overlap(ds, lo, hi, ds->rank, &a);
        b = a + mine;
    }
    if (!ok || b <= a || ds->host_grads)
        return ok;
    /* all-reduced: the bucket in place; reduced to its owner: this rank's part first */
    const RealBf16 *src = op->sub == ZP_COLL_ALLREDUCE ? data + (a - lo) : data;
    if (!grads_in_partition(ds))
        return fail(error, "rank %d: micro-step %d reduces before grads_in_partition is "
                    "allocated", ds->rank, op->micro);
    RealBf16 *sum = grads_in_partition(ds) + (a - ds->gip_lo);
    const int copy = op->micro > 0 ? ds->grad_copy[op->micro] : -1;
    if (copy >= 0 && !ds->buffers[copy])
        return fail(error, "rank %d: micro-step %d's gradient copy is not allocated", ds->rank,
                    op->micro);
    if (copy < 0) {
        real_engine_deliver(ds->be, sum, src, b - a, op->micro > 0);
        return TRUE;
    }
    RealBf16 *dst = (RealBf16 *)ds->buffers[copy] + (a - ds->gip_lo);
    real_engine_deliver(ds->be, dst, src, b - a, FALSE);
    real_engine_deliver(ds->be, sum, dst, b - a, TRUE);
    return TRUE;
}

/* Stage 3: stage3.py __avg_scatter_grads -> reduce_scatter_coalesced: each tensor padded to dp
 * and cut in dp slices, the slices concatenated rank by rank into the copy, reduce-scattered,
 * and this rank's slices added to its gradient partition. One tensor that needs no padding
 * (qgZ's fallback, reduce_scatter_coalesced([tensor])) is reduce-scattered in place, in its
 * bucket (data, at op's offset), with no copy. */
static gboolean reduce_stage3(RealDs *ds, const ZpOp *op, RealBf16 *data, RealBf16 *copy,
                              uint64_t copy_bytes, GError **error)
{
    const int first = tensor_at(ds, op->elem_offset);
    guint last = (guint)MAX(first, 0);
    uint64_t per_rank = 0;
    while (first >= 0 && last < ds->n_t && ds->t[last].offset < op->elem_offset + op->elems)
        per_rank += ds->t[last++].slice;
    const size_t b2 = sizeof(RealBf16);
    const uint64_t padded = per_rank * (uint64_t)ds->dp;
    if (!copy && first >= 0 && last == (guint)first + 1 && ds->t[first].elems == padded)
        copy = data, copy_bytes = padded * b2;
    if (first < 0 || padded * b2 != copy_bytes)
        return fail(error, "a stage-3 reduction whose concatenation copy is not its tensors "
                           "padded to %d ranks", ds->dp);
    if (copy != data)
        ds->be->fill(ds->be, copy, 0, padded * b2);
    for (int q = 0; copy != data && q < ds->dp; q++) {
        RealBf16 *dst = copy + (uint64_t)q * per_rank;
        for (guint i = (guint)first; i < last; i++) {
            const Tensor *t = &ds->t[i];
            const uint64_t from = MIN((uint64_t)q * t->slice, t->elems);
            ds->be->copy(ds->be, dst, data + (t->offset - op->elem_offset) + from,
                         MIN(t->slice, t->elems - from) * b2);
            dst += t->slice;
        }
    }
    int *counts = g_new(int, ds->dp);
    for (int q = 0; q < ds->dp; q++)
        counts[q] = (int)per_rank;
    const gboolean ok = ds->comm->reduce_scatter_bf16(ds->comm, copy, counts, error);
    g_free(counts);
    const RealBf16 *mine = copy;
    for (guint i = (guint)first; ok && !ds->host_grads && i < last; mine += ds->t[i].slice, i++)
        real_engine_deliver(ds->be, ds->grads + ds->t[i].part, mine, ds->t[i].slice,
                            op->micro > 0);
    return ok;
}

/* The concatenation copy a stage-3 reduction depends on: a bucket buffer of its own alloc
 * (its size in *bytes). */
static RealBf16 *concat_copy(RealDs *ds, const ZpOp *op, uint64_t *bytes)
{
    const uint32_t *deps = zp_sched_deps(ds->s, op);
    for (uint32_t i = 0; i < op->n_deps; i++) {
        const ZpOp *d = zp_sched_op(ds->s, deps[i]);
        if (d->kind == ZP_OP_ALLOC && d->sub == ZP_MEM_BUCKETS && d->buffer != op->buffer) {
            *bytes = (uint64_t)d->bytes;
            return ds->buffers[d->buffer];
        }
    }
    return NULL;
}

/* The gradients a reduction reads, at its offset of its bucket's place (*bucket: which),
 * with any of them still waiting landed first. */
static RealBf16 *reduced_grads(RealDs *ds, const ZpOp *op, int *bucket, GError **error)
{
    const int k = *bucket = bucket_at(ds, op->elem_offset);
    if (k < 0)
        return fail(error, "a reduction of no bucket"), NULL;
    RealBf16 *data =
        real_ds_land_pending(ds, error) ? real_ds_land(ds, k, op->micro, error) : NULL;
    return data ? data + (op->elem_offset - ds->bk[k].lo) : NULL;
}

/* After a reduction: once it read the bucket's last tensor, the bucket's place in a held
 * buffer is free again, and the gradients waiting for room are copied in. */
static gboolean reduced(RealDs *ds, const ZpOp *op, int k, GError **error)
{
    /* a bucket with experts stays until their reduction (real_ds_experts_reduced) */
    if (op->elem_offset + op->elems == ds->bk[k].hi && ds->bk[k].xelems == 0)
        ds->bk[k].landed_in = -1;
    return real_ds_land_pending(ds, error);
}

static gboolean reduce(RealDs *ds, const ZpOp *op, GError **error)
{
    int k;
    RealBf16 *data = reduced_grads(ds, op, &k, error);
    if (!data)
        return FALSE;
    gboolean ok;
    if (ds->stage == 2) {
        ok = reduce_stage2(ds, op, data, error);
    } else {
        uint64_t bytes = 0;
        RealBf16 *copy = concat_copy(ds, op, &bytes);
        ok = reduce_stage3(ds, op, data, copy, bytes, error);
    }
    return ok && reduced(ds, op, k, error);
}

gboolean real_ds_qgz(RealDs *ds, const ZpOp *op, RealComm *node, RealComm *cross,
                     uint8_t *work, uint64_t work_bytes, GError **error)
{
    const ZpPlan *plan = &ds->s->plan;
    const int x = tensor_at(ds, op->elem_offset);
    const Tensor *t = x >= 0 ? &ds->t[x] : NULL;
    if (ds->stage != 3 || !t || op->elems != t->elems)
        return fail(error, "a qgZ all-to-all of no whole tensor of DeepSpeed's stage 3");
    const ZpQgz q = zp_zeropp_qgz_tensor(plan, (double)t->elems, (double)ds->s->model.hidden,
                                         zp_plan_reduce_bytes(plan));
    const uint64_t world = (uint64_t)ds->dp, groups = (uint64_t)q.groups;
    if (groups % world != 0 || t->slice * world != t->elems)
        return fail(error, "qgZ: unit %d's tensor %d (%" G_GUINT64_FORMAT " elements) has %"
                    G_GUINT64_FORMAT " quantisation groups; zreal quantises each of %d ranks' "
                    "partitions in whole groups", t->unit, t->k, t->elems, groups, ds->dp);
    const uint64_t need = real_zeropp_qgz_tensor_work_bytes(node->size, cross->size, t->slice,
                                                            groups / world);
    uint64_t out_bytes = 0;
    RealBf16 *out = concat_copy(ds, op, &out_bytes);
    if (work_bytes != need || !out || out_bytes != t->slice * sizeof(RealBf16))
        return fail(error, "qgZ: unit %d's tensor %d needs %" G_GUINT64_FORMAT " bytes of "
                    "all_to_all_quant_reduce's buffers (the schedule has %" G_GUINT64_FORMAT
                    ") and an output slice of %" G_GUINT64_FORMAT " (it has %" G_GUINT64_FORMAT
                    ")", t->unit, t->k, need, work_bytes, t->slice * sizeof(RealBf16), out_bytes);
    int k;
    const RealBf16 *data = reduced_grads(ds, op, &k, error);
    if (!data)
        return FALSE;
    const double before = node->sent_bytes + cross->sent_bytes;
    const gboolean ok = real_zeropp_qgz_tensor(node, cross, data, t->slice, groups / world,
                                               work, out, error);
    ds->comm->sent_bytes += node->sent_bytes + cross->sent_bytes - before;
    if (ok) /* partition_grads adds the bucket's outputs to the partition */
        real_engine_deliver(ds->be, ds->grads + t->part, out, t->slice, op->micro > 0);
    return ok && reduced(ds, op, k, error);
}

/* Stage 3: tensor t is in buffer id too, from element `at` (in a slot whose buffer is freed,
 * or unused; the same ops, so the same ids, come again every step). */
static gboolean hold(RealDs *ds, Tensor *t, int id, uint64_t at, GError **error)
{
    for (size_t i = 0; i < G_N_ELEMENTS(t->gathered); i++)
        if (t->gathered[i] == id) {
            t->gathered_at[i] = at;
            return TRUE;
        }
    for (size_t i = 0; i < G_N_ELEMENTS(t->gathered); i++)
        if (t->gathered[i] < 0 || !ds->buffers[t->gathered[i]]) {
            t->gathered[i] = id;
            t->gathered_at[i] = at;
            return TRUE;
        }
    return fail(error, "rank %d: unit %d's tensor %d is gathered more than %zu times at once",
                ds->rank, t->unit, t->k, G_N_ELEMENTS(t->gathered));
}

/* The communicator of call c: the data-parallel group's, or hpZ's (real_ds_hpz). */
static RealComm *call_comm(const RealDs *ds, const Call *c)
{
    return c->group == ZP_GROUP_HPZ ? ds->hpz_comm : ds->comm;
}

/* What tensor t puts in call c: its slice of the partition (the data-parallel group), or of
 * the secondary partition (hpZ's group: its padded elements / hpZ ranks,
 * partition_parameters.py _partition_param_sec secondary_partition_size). */
static uint64_t call_slice(const RealDs *ds, const Call *c, const Tensor *t)
{
    return t->slice * (uint64_t)ds->dp / (uint64_t)c->ranks;
}

static const RealBf16 *call_source(const RealDs *ds, const Call *c, const Tensor *t)
{
    return c->group == ZP_GROUP_HPZ ? ds->secondary + t->sec : ds->params + t->part;
}

/* This rank's slices of call c, one after another at its place of dst (every rank's in
 * turn: _all_gather_dtype's partitions[rank_in_group]; with use_secondary_tensor the
 * ds_secondary_tensors, _all_gather_coalesced). */
static void place_slices(RealDs *ds, const Call *c, RealBf16 *dst)
{
    RealBf16 *mine = dst + (uint64_t)call_comm(ds, c)->rank * c->per_rank;
    for (guint i = 0; i < c->n; i++) {
        const Tensor *t = &ds->t[ds->members[c->first + i]];
        const uint64_t n = call_slice(ds, c, t);
        ds->be->copy(ds->be, mine, call_source(ds, c, t), n * sizeof(RealBf16));
        mine += n;
    }
}

/* hpZ: a tensor gathered whole over the data-parallel group leaves this rank its slice of
 * the secondary partition, the unpadded elements from secondary_partition_size x
 * rank_in_group on (partition_parameters.py _partition_param_sec, called by _partition when
 * the module releases it; the values are those of the gather). */
static void keep_secondary(RealDs *ds, const Call *c, const Tensor *t, const RealBf16 *full)
{
    if (!ds->secondary || c->group != ZP_GROUP_DP || t->sec == G_MAXUINT64)
        return;
    const uint64_t n = t->slice * (uint64_t)ds->dp / (uint64_t)ds->hpz_comm->size;
    const uint64_t start = n * (uint64_t)ds->hpz_comm->rank;
    if (start < t->elems)
        ds->be->copy(ds->be, ds->secondary + t->sec, full + start,
                     MIN(n, t->elems - start) * sizeof(RealBf16));
}

gboolean real_ds_hpz(RealDs *ds, RealComm *hpz_comm, GError **error)
{
    if (ds->stage != 3 || ds->host_params)
        return fail(error, "zreal executes DeepSpeed's hpZ (zero_hpz_partition_size) at stage 3 "
                           "without offload_param");
    ds->hpz_comm = hpz_comm;
    uint64_t at = 0;
    for (guint i = 0; i < ds->n_t; i++) {
        Tensor *t = &ds->t[i];
        t->sec = t->persistent ? G_MAXUINT64 : at;
        at += t->persistent ? 0 : t->slice * (uint64_t)ds->dp / (uint64_t)hpz_comm->size;
    }
    const double bytes = (double)(at * sizeof(RealBf16));
    if (bytes != ds->s->state_bytes[ZP_MEM_SECONDARY_PARAMS])
        return fail(error, "DeepSpeed's secondary partition of the tensors DeepSpeed does not "
                    "persist is %.0f bytes a rank, the schedule's %.0f (it pads units, "
                    "DeepSpeed tensors)", bytes, ds->s->state_bytes[ZP_MEM_SECONDARY_PARAMS]);
    return (ds->secondary = take(ds, MAX(bytes, 1), ZP_MEM_SECONDARY_PARAMS, error)) != NULL;
}

/* qwZ (partition_parameters.py _all_gather_coalesced and _all_gather_sequential with
 * quantize): this rank's slices of the next call, concatenated (in its place of the call's
 * gathered buffer), quantised in the groups of CUDAQuantizer.quantize into its place of the
 * int8 buffer; once waited for (AllGatherCoalescedHandle.wait, AllGatherHandle.wait), every
 * rank's dequantised into the gathered buffer, to be unpacked as without qwZ. */
gboolean real_ds_qwz(RealDs *ds, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = ds->s;
    const guint index = (guint)(op - zp_sched_op(s, 0));
    const gboolean quantize = op->stream == ZP_STREAM_DP;
    const ZpOp *coll = quantize ? (index + 1 < s->ops->len ? zp_sched_op(s, index + 1) : NULL)
                                : (op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0])
                                                  : NULL);
    const ZpOp *alloc = op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0]) : NULL;
    if (ds->n_calls == 0 || !coll || coll->kind != ZP_OP_COLLECTIVE ||
        coll->sub != ZP_COLL_ALLGATHER || coll->buffer < 0 || !ds->buffers[coll->buffer] ||
        (quantize && (alloc->kind != ZP_OP_ALLOC || !ds->buffers[alloc->buffer])))
        return fail(error, "a qwZ op that does not sit around a stage-3 call's all-gather "
                           "(its int8 buffer's alloc, the quantize, the gather; the dequantize "
                           "after it)");
    const int k = quantize ? (int)(ds->next_call % ds->n_calls) : ds->flat_call[coll->buffer];
    if (k < 0)
        return fail(error, "a dequantize op of no quantised call");
    const Call *c = &ds->calls[k];
    const uint64_t n = c->per_rank, groups = zp_zeropp_qwz_groups(n);
    const size_t bytes = real_zeropp_quantized_bytes(n, groups);
    RealBf16 *dst = ds->buffers[coll->buffer];
    const int rank = call_comm(ds, c)->rank;
    if (quantize) {
        place_slices(ds, c, dst);
        uint8_t *int8 = ds->buffers[alloc->buffer];
        real_zeropp_quantize(dst + (uint64_t)rank * n, n, groups, int8 + (size_t)rank * bytes);
        ds->quant_of[coll->buffer] = alloc->buffer;
        ds->flat_call[coll->buffer] = k; /* the call, for its dequantize (and unpack) */
        return TRUE;
    }
    const int id = ds->quant_of[coll->buffer];
    if (id < 0 || !ds->buffers[id])
        return fail(error, "a dequantize op with no gathered int8 buffer");
    for (int q = 0; q < c->ranks; q++)
        real_zeropp_dequantize((const uint8_t *)ds->buffers[id] + (size_t)q * bytes, n, groups,
                               dst + (uint64_t)q * n);
    ds->quant_of[coll->buffer] = -1;
    if (c->n == 1) { /* gathered into its tensor's own buffer: nothing to unpack */
        ds->flat_call[coll->buffer] = -1;
        keep_secondary(ds, c, &ds->t[ds->members[c->first]], dst);
    }
    return TRUE;
}

/* stage3_use_all_reduce_for_fetch_params (partition_parameters.py _all_gather_coalesced): the
 * zeroed flat buffer holds each tensor's padded size in turn, this rank's slice at its place
 * in it; summed over the ranks it holds every tensor whole, read in place (param.data =
 * flat_tensor.narrow), nothing to unpack. */
static gboolean fetch_allreduce(RealDs *ds, const Call *c, int id, RealBf16 *dst,
                                GError **error)
{
    /* with parameter offload the transfers before the call zeroed it and put this rank's
     * slices in place (real_ds_param_transfer) */
    if (!ds->host_params)
        ds->be->fill(ds->be, dst, 0, c->per_rank * (uint64_t)ds->dp * sizeof(RealBf16));
    uint64_t at = 0;
    for (guint i = 0; i < c->n; i++) {
        Tensor *t = &ds->t[ds->members[c->first + i]];
        if (!ds->host_params)
            ds->be->copy(ds->be, dst + at + (uint64_t)ds->rank * t->slice, ds->params + t->part,
                         t->slice * sizeof(RealBf16));
        if (!hold(ds, t, id, at, error))
            return FALSE;
        at += t->slice * (uint64_t)ds->dp;
    }
    if (!ds->comm->allreduce_bf16(ds->comm, dst, at, error))
        return FALSE;
    at = 0;
    for (guint i = 0; i < c->n; i++) {
        const Tensor *t = &ds->t[ds->members[c->first + i]];
        keep_secondary(ds, c, t, dst + at);
        at += t->slice * (uint64_t)ds->dp;
    }
    return TRUE;
}

/* Stage 3: the micro-step's next call (partitioned_param_coordinator.py
 * __all_gather_params_ -> partition_parameters.py all_gather_coalesced). One tensor is gathered
 * into its own buffer (_all_gather_sequential); more, each rank's slices concatenated into
 * its place of the flat buffer, gathered in place (_all_gather_dtype), to be unpacked. */
static gboolean gather_call(RealDs *ds, const ZpOp *op, GError **error)
{
    if (ds->n_calls == 0)
        return fail(error, "a stage-3 all-gather where DeepSpeed plans none");
    const guint k = ds->next_call++ % ds->n_calls;
    const Call *c = &ds->calls[k];
    Tensor *first = &ds->t[ds->members[c->first]];
    RealBf16 *dst = ds->buffers[op->buffer];
    RealComm *comm = call_comm(ds, c);
    if (op->elem_offset != first->offset || op->elems != c->per_rank * (uint64_t)c->ranks ||
        op->group != c->group || !dst || !comm)
        return fail(error, "rank %d: all-gather %u of the micro-step is not DeepSpeed's call "
                    "at flat offset %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT " elements "
                    "over the %s group", ds->rank, k, first->offset,
                    c->per_rank * (uint64_t)c->ranks, c->group == ZP_GROUP_HPZ ? "hpZ" : "DP");
    if (ds->quant_of[op->buffer] >= 0) { /* qwZ: the int8 and scales instead (real_ds_qwz) */
        if (ds->flat_call[op->buffer] != (int)k)
            return fail(error, "rank %d: a qwZ gather of another call than the one quantised",
                        ds->rank);
        if (c->n == 1 && !hold(ds, first, op->buffer, 0, error))
            return FALSE;
        return comm->allgather_bytes(
            comm, ds->buffers[ds->quant_of[op->buffer]],
            real_zeropp_quantized_bytes(c->per_rank, zp_zeropp_qwz_groups(c->per_rank)), error);
    }
    /* with parameter offload the transfers before the call put this rank's slices in place */
    RealBf16 *mine = dst + (uint64_t)comm->rank * c->per_rank;
    if (c->n == 1) {
        if (!hold(ds, first, op->buffer, 0, error) ||
            !comm->allgather_bf16(comm, ds->host_params ? mine : call_source(ds, c, first),
                                  c->per_rank, dst, error))
            return FALSE;
        keep_secondary(ds, c, first, dst);
        return TRUE;
    }
    if (op->sub == ZP_COLL_ALLREDUCE)
        return fetch_allreduce(ds, c, op->buffer, dst, error);
    if (!ds->host_params)
        place_slices(ds, c, dst);
    ds->flat_call[op->buffer] = (int)k;
    return comm->allgather_bf16(comm, mine, c->per_rank, dst, error);
}

gboolean real_ds_param_transfer(RealDs *ds, const ZpOp *op, const ZpOp *alloc, RealOffload *o,
                                GError **error)
{
    const Call *c = ds->n_calls ? &ds->calls[ds->next_call % ds->n_calls] : NULL;
    RealBf16 *dst = alloc->buffer >= 0 ? ds->buffers[alloc->buffer] : NULL;
    if (!c || !dst || alloc->bytes != (double)(c->per_rank * (uint64_t)ds->dp * sizeof(RealBf16)))
        return fail(error, "rank %d: a parameter fetch before no call of DeepSpeed's", ds->rank);
    if (op->sub != ZP_XFER_NVME_READ && op->sub != ZP_XFER_H2D)
        return fail(error, "a parameter fetch moves slices from NVMe and up, nothing else");
    /* An all-reduce fetch (zp_sched_fetch_allreduce; partition_parameters.py
     * _all_gather_coalesced): each slice up into its place in its parameter's region of the
     * zeroed buffer (flat_tensor.narrow(0, start, ...).copy_(param.ds_tensor)); else into
     * this rank's part, the slices one after the other. */
    const gboolean reduced = zp_sched_fetch_allreduce(&ds->s->plan, c->n, ZP_GROUP_DP);
    if (reduced && op->sub == ZP_XFER_H2D)
        ds->be->fill(ds->be, dst, 0, c->per_rank * (uint64_t)ds->dp * sizeof(RealBf16));
    else
        dst += (uint64_t)ds->rank * c->per_rank;
    uint64_t at = 0, place = 0; /* the tensor's slice inside this rank's part (and the pool),
                                 * and its place in the buffer */
    for (guint i = 0; i < c->n; i++) {
        const Tensor *t = &ds->t[ds->members[c->first + i]];
        if (op->sub == ZP_XFER_NVME_READ) {
            if (!real_offload_param_read(o, t->part, t->slice, at, error))
                return FALSE;
        } else {
            real_offload_param_fetch(o, dst + (reduced ? place + ds->rank * t->slice : at),
                                     t->part, t->slice, at);
        }
        at += t->slice, place += t->slice * (uint64_t)ds->dp;
    }
    return TRUE;
}

gboolean real_ds_unpack(RealDs *ds, const ZpOp *op, GError **error)
{
    const uint32_t *deps = zp_sched_deps(ds->s, op);
    const ZpOp *coll = op->n_deps > 0 ? zp_sched_op(ds->s, deps[0]) : NULL;
    if (coll && coll->kind == ZP_OP_COMPUTE && coll->sub == ZP_COMP_QUANTIZE && coll->n_deps > 0)
        coll = zp_sched_op(ds->s, zp_sched_deps(ds->s, coll)[0]); /* qwZ: after its dequantize */
    const int k = coll && coll->kind == ZP_OP_COLLECTIVE && coll->buffer >= 0
                      ? ds->flat_call[coll->buffer] : -1;
    if (k < 0 || op->n_deps != ds->calls[k].n + 1)
        return fail(error, "an unpack op that follows no coalesced all-gather, or not one "
                           "buffer for each of its tensors");
    const Call *c = &ds->calls[k];
    const RealBf16 *flat = ds->buffers[coll->buffer];
    uint64_t at = 0; /* the tensor's slice inside each rank's part */
    for (guint i = 0; i < c->n; i++) {
        Tensor *t = &ds->t[ds->members[c->first + i]];
        const ZpOp *alloc = zp_sched_op(ds->s, deps[i + 1]);
        RealBf16 *dst = alloc->kind == ZP_OP_ALLOC ? ds->buffers[alloc->buffer] : NULL;
        if (!dst || alloc->bytes != (double)(t->elems * sizeof(RealBf16)))
            return fail(error, "unpack: unit %d's tensor %d has no buffer of its size", t->unit,
                        t->k);
        /* AllGatherCoalescedHandle.wait: ds_tensor_numel (x ds_secondary_tensor_num_of_groups
         * from the secondary partition) from each rank's part, the unpadded elements */
        const uint64_t n = call_slice(ds, c, t);
        for (int q = 0; q < c->ranks && (uint64_t)q * n < t->elems; q++)
            ds->be->copy(ds->be, dst + (uint64_t)q * n, flat + q * c->per_rank + at,
                         MIN(n, t->elems - (uint64_t)q * n) * sizeof(RealBf16));
        keep_secondary(ds, c, t, dst);
        if (!hold(ds, t, alloc->buffer, 0, error))
            return FALSE;
        at += n;
    }
    ds->flat_call[coll->buffer] = -1;
    return TRUE;
}

/* Stage 3: a call (gather_call), or a persistent tensor's full copy after the step; stage 2:
 * the updated partitions in place (runtime/utils.py all_gather_dp_groups). */
static gboolean gather(RealDs *ds, const ZpOp *op, GError **error)
{
    const uint64_t P = ds->s->partition_elems;
    if (ds->stage == 2) {
        if (op->buffer >= 0 || op->elem_offset != 0 || op->elems != P * (uint64_t)ds->dp)
            return fail(error, "DeepSpeed's stage 2 all-gathers the partitions in place, in "
                               "one chunk (allgather_bucket_size at least the parameters)");
        return ds->comm->allgather_bf16(ds->comm, ds->params + (uint64_t)ds->rank * P, P,
                                        ds->params, error);
    }
    if (op->buffer >= 0)
        return gather_call(ds, op, error);
    const int x = tensor_at(ds, op->elem_offset);
    Tensor *t = x >= 0 ? &ds->t[x] : NULL;
    if (!t || op->elems != t->slice * (uint64_t)ds->dp || !t->persistent)
        return fail(error, "a persistent all-gather of no persistent tensor");
    return ds->comm->allgather_bf16(ds->comm, ds->params + t->part, t->slice, t->persistent,
                                    error);
}

gboolean real_ds_state_op(RealDs *ds, const ZpOp *op, const ZpOp *next, GError **error)
{
    if (ds->stage != 3 || op->sub != ZP_MEM_GATHERED_PARAMS)
        return fail(error, "an alloc or free of the step-long %s: DeepSpeed frees and takes "
                    "back only stage 3's persistent copies", zp_sched_mem_name(op->sub));
    const uint64_t b2 = sizeof(RealBf16), dp = (uint64_t)ds->dp;
    if (op->kind == ZP_OP_FREE) { /* stage3.py step -> _partition_all_parameters */
        double bytes = 0;
        for (guint i = 0; i < ds->n_t; i++)
            if (ds->t[i].persistent) {
                bytes += (double)(ds->t[i].slice * dp * b2);
                ds->be->free(ds->be, ds->t[i].persistent);
                ds->t[i].persistent = NULL;
            }
        return bytes == op->bytes ? TRUE
                                  : fail(error, "rank %d: the step frees %.0f bytes of persistent "
                                         "copies, zreal held %.0f", ds->rank, op->bytes, bytes);
    }
    /* _post_step -> _allgather_params_coalesced: the parameter's buffer, then its gather */
    const int x = next && next->kind == ZP_OP_COLLECTIVE && next->sub == ZP_COLL_ALLGATHER &&
                          next->buffer < 0
                      ? tensor_at(ds, next->elem_offset)
                      : -1;
    Tensor *t = x >= 0 ? &ds->t[x] : NULL;
    if (!t || t->persistent || op->bytes != (double)(t->slice * dp * b2))
        return fail(error, "rank %d: a persistent copy of %.0f bytes taken back for no freed "
                    "persistent tensor refreshed next", ds->rank, op->bytes);
    return (t->persistent = take(ds, t->slice * dp * b2, ZP_MEM_GATHERED_PARAMS, error)) != NULL;
}

gboolean real_ds_collective(RealDs *ds, const ZpOp *op, GError **error)
{
    if (op->group != ZP_GROUP_DP && !(op->group == ZP_GROUP_HPZ && op->buffer >= 0))
        return fail(error, "DeepSpeed's stages 2-3 run over the data-parallel group only (and "
                           "with hpZ stage 3's backward gathers over hpZ's)");
    if (op->group == ZP_GROUP_HPZ) { /* counted in the rank's total too, as real_engine's */
        if (!ds->hpz_comm)
            return fail(error, "an hpZ gather without hpZ's group (real_ds_hpz)");
        const double before = ds->hpz_comm->sent_bytes;
        const gboolean ok = gather(ds, op, error);
        ds->comm->sent_bytes += ds->hpz_comm->sent_bytes - before;
        return ok;
    }
    return zp_sched_coll_fetches(ds->s, op) ? gather(ds, op, error) : reduce(ds, op, error);
}

/* ---- optimizer offload: the reduced slices to the host tier -------------------------------- */

/* Where this rank's reduced slice of the reduction `coll` lies on the device, its offset in
 * the partition and its elements (0: none of the bucket is this rank's). Stage 2: in the
 * bucket (its held ipg buffer's place stays untouched until the next bucket lands), at this
 * rank's part of an all-reduced bucket or at the head of a reduced-to-owner one (stage
 * _1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu reads each parameter's part
 * in the partition from its reduced gradient). Stage 3: at the head of the concatenation
 * copy (or of the tensor itself, one reduced in place), the bucket's tensors' slices one after
 * the other, as in the partition (stage3.py partition_grads takes the reduce-scatter's
 * outputs, views of the copy). */
static RealBf16 *reduced_slice(RealDs *ds, const ZpOp *coll, uint64_t *at, uint64_t *n,
                               GError **error)
{
    const int k = bucket_at(ds, coll->elem_offset);
    if (k < 0 || coll->micro < 0)
        return fail(error, "a gradient transfer after no bucket's reduction"), NULL;
    *n = 0;
    if (ds->stage == 3) {
        uint64_t bytes = 0;
        RealBf16 *copy = concat_copy(ds, coll, &bytes);
        const int first = tensor_at(ds, coll->elem_offset);
        if (!copy && first >= 0) { /* one tensor needing no padding, reduced in place */
            const int id = ds->bucket_buffer[coll->micro * ds->n_buckets + k];
            copy = id >= 0 && ds->buffers[id]
                       ? (RealBf16 *)ds->buffers[id] + (coll->elem_offset - ds->bk[k].lo)
                       : NULL;
            bytes = coll->elems * sizeof(RealBf16);
        }
        if (!copy || first < 0)
            return fail(error, "a stage-3 gradient transfer without its reduced gradients"),
                   NULL;
        *at = ds->t[first].part;
        *n = bytes / sizeof(RealBf16) / (uint64_t)ds->dp;
        return copy;
    }
    const int id = ds->bucket_buffer[coll->micro * ds->n_buckets + k];
    RealBf16 *base = id >= 0 ? ds->buffers[id] : NULL;
    if (!base)
        return fail(error, "a gradient transfer from a bucket with no buffer"), NULL;
    const uint64_t lo = coll->elem_offset;
    uint64_t a;
    *n = part_overlap(ds, lo, lo + coll->elems, ds->rank, &a);
    if (*n > 0)
        *at = a - (uint64_t)ds->rank * ds->s->partition_elems;
    return coll->sub == ZP_COLL_ALLREDUCE ? base + (*n > 0 ? a - lo : 0) : base;
}

/* Stage 2 with accumulation (zp_offload_stage2_accum): each tensor of the bucket that overlaps
 * this rank's partition, whole, up and added or down (stage_1_and_2.py copy_grads_in_partition
 * -> async_accumulate_grad_in_cpu_via_gpu), its sum at its place from gip_lo; the fp32 D2H
 * after the 16-bit one (at the last micro-step) is the rank's part, as at one micro-step. */
static gboolean stage2_accum_transfer(RealDs *ds, const ZpOp *op, const ZpOp *coll,
                                      RealOffload *o, RealBf16 *dev, uint64_t at, uint64_t n,
                                      GError **error)
{
    const ZpOp *before = zp_sched_op(ds->s, zp_sched_deps(ds->s, op)[0]);
    if (op->sub == ZP_XFER_D2H && before->kind == ZP_OP_TRANSFER && before->sub == ZP_XFER_D2H)
        return real_offload_grads_down(o, dev, at, n, error);
    if (op->sub != ZP_XFER_D2H && op->sub != ZP_XFER_H2D)
        return fail(error, "DeepSpeed's stage 2 moves its gradient sums over the host link only");
    const uint64_t a = (uint64_t)ds->rank * ds->s->partition_elems + at, end = a + n;
    const int first = tensor_at(ds, coll->elem_offset);
    gboolean ok = first >= 0 || fail(error, "a gradient transfer of no whole tensors");
    for (guint i = (guint)MAX(first, 0);
         ok && i < ds->n_t && ds->t[i].offset < coll->elem_offset + coll->elems; i++) {
        const Tensor *t = &ds->t[i];
        const uint64_t x = MAX(t->offset, a), y = MIN(t->offset + t->elems, end);
        if (y <= x)
            continue;
        ok = op->sub == ZP_XFER_H2D
                 ? real_offload_tensor_up_add(o, dev + (x - a), x - t->offset, y - x,
                                              t->offset - ds->gip_lo, t->elems, error)
                 : real_offload_tensor_down(o, dev + (x - a), x - t->offset, y - x,
                                            t->offset - ds->gip_lo, t->elems, error);
    }
    return ok;
}

gboolean real_ds_grad_transfer(RealDs *ds, const ZpOp *op, const ZpOp *coll, RealOffload *o,
                               GError **error)
{
    uint64_t at = 0, n = 0;
    RealBf16 *dev = reduced_slice(ds, coll, &at, &n, error);
    if (!dev)
        return FALSE;
    if (n == 0)
        return TRUE;
    if (ds->stage == 2 && zp_offload_stage2_accum(&ds->s->plan))
        return stage2_accum_transfer(ds, op, coll, o, dev, at, n, error);
    /* Stage 3's chain (offload_grad_slice): the 16-bit sum's round trip, then at the last
     * micro-step the fp32 slice down, the third; stage 2's are this rank's part of the
     * bucket, fp32. Once the round trip left the sum on the device at the last micro-step,
     * the GPU's sub-groups take their fp32 gradients from it (partial offload). */
    int before = 0;
    for (const ZpOp *p = op; p->n_deps > 0;) {
        p = zp_sched_op(ds->s, zp_sched_deps(ds->s, p)[0]);
        if (p->kind != ZP_OP_TRANSFER)
            break;
        before++;
    }
    const gboolean fp32 = ds->stage != 3 || before == 2;
    if (ds->stage == 3 && before == 1 && op->micro == ds->s->plan.grad_accum - 1)
        real_offload_grads_keep(o, dev, at, n);
    switch ((ZpTransferKind)op->sub) {
    case ZP_XFER_D2H:
        if (fp32)
            return real_offload_grads_down(o, dev, at, n, error);
        if (ds->stage != 3)
            break;
        real_offload_accum_down(o, dev, at, n);
        return TRUE;
    case ZP_XFER_H2D:
        if (ds->stage != 3 || fp32)
            break;
        return real_offload_accum_up(o, dev, at, n, op->micro > 0, error);
    case ZP_XFER_NVME_WRITE:
        return real_offload_grads_out(o, at, n, error);
    default:
        break;
    }
    return fail(error, "rank %d: a gradient transfer of %.0f bytes DeepSpeed's stage %d does "
                "not make (stage 2 sends fp32 slices down; stage 3 its 16-bit sum down and up, "
                "and fp32 down at the last micro-step)", ds->rank, op->bytes, ds->stage);
}
