/* zp_build_optimizer: the step's end in the schedule: the buffers around the optimizer, the
 * optimizer on this rank's partition and the all-gather of the updated parameters. */
#include "zp_build.h"
#include "zp_offload.h"

/* A step-level op (unit and micro-step -1) after deps[0 .. n). */
uint32_t zp_build_emit_step_op(Builder *b, ZpOp op, const uint32_t *deps, guint n)
{
    op.unit = -1, op.micro = -1, op.buffer = -1;
    op.stream = op.kind == ZP_OP_TRANSFER ? (op.sub == ZP_XFER_H2D ? ZP_STREAM_HOST
                                                                   : ZP_STREAM_NVME)
                                          : ZP_STREAM_CPU;
    return zp_build_emit(b, op, deps, n);
}

/* ---- the distributed optimizer's all-gather in the next forward ----------------------- */

/* Megatron's overlap_param_gather (param_and_grad_buffer.py _ParamAndGradBucketGroup
 * finish_param_sync, distributed_data_parallel.py's forward pre-hooks): the updated
 * parameters are all-gathered bucket by bucket in forward order, in place, instead of after
 * the step: a module's pre-hook waits for its bucket's all-gather (dispatching it first when
 * it was not: the step's first) and then dispatches the next bucket's
 * (next_param_gather_bucket_group). The one step built stands for each: its forward waits for
 * the gathers of the step before, which are these. */
static gboolean gathers_in_forward(const ZpPlan *plan)
{
    return plan->overlap_param_gather && plan->zero.stage == 1;
}

/* Forward-order bucket j: the buckets are listed in backward order. */
static const Bucket *forward_bucket(Builder *b, guint j)
{
    return zp_build_bucket(b, b->buckets->len - 1 - j);
}

/* A bucket's elements in the flat buffer (ZpBucketSpec padded_elems: Megatron's padded
 * bucket, whose param_data start_param_sync all-gathers whole), else its range padded to
 * the group. */
static uint64_t gathered_elems(const Bucket *k, uint64_t dp)
{
    return k->spec.padded_elems > 0 ? k->spec.padded_elems
                                    : zp_mem_padded_elems(k->spec.hi - k->spec.lo, dp);
}

/* Issues the next bucket's all-gather (after op `after`, NONE: none): its gathered_elems,
 * at the next offset of the rank's partition (the post-step gathers' space), the last one
 * clipped to it. */
static void issue_param_gather(Builder *b, uint32_t after)
{
    const ZpSchedule *s = b->s;
    const uint64_t dp = (uint64_t)s->plan.dp;
    const guint j = b->param_gathers_issued++;
    uint64_t offset = 0;
    for (guint i = 0; i < j; i++)
        offset += gathered_elems(forward_bucket(b, i), dp) / dp;
    const Bucket *k = forward_bucket(b, j);
    offset = MIN(offset, s->partition_elems);
    const uint64_t n = MIN(gathered_elems(k, dp), (s->partition_elems - offset) * dp);
    g_array_index(b->param_gathers, uint32_t, j) =
        n == 0 ? NONE
               : zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_DP, -1, -1, -1, offset,
                                          n, (double)n * b->state.param_bytes, &after, 1);
}

void zp_build_wait_param_gathers(Builder *b, int unit, int micro)
{
    if (!gathers_in_forward(&b->s->plan) || micro != 0)
        return;
    const guint n = b->buckets->len;
    if (b->param_gathers_issued == 0)
        g_array_set_size(b->param_gathers, n);
    gboolean waited = FALSE;
    while (b->param_gathers_waited < n &&
           forward_bucket(b, b->param_gathers_waited)->spec.low_unit <= unit) {
        while (b->param_gathers_issued <= b->param_gathers_waited)
            issue_param_gather(b, NONE);
        const uint32_t op = g_array_index(b->param_gathers, uint32_t, b->param_gathers_waited++);
        if (op != NONE)
            zp_build_sync_on(b, op);
        waited = TRUE;
    }
    if (waited && b->param_gathers_issued < n)
        issue_param_gather(b, NONE);
}

/* The implementation's buffers around the optimizer, then the optimizer on this rank's
 * partition, then (stages 1-2) the all-gather of the updated 16-bit partitions in
 * allgather_bucket_size chunks. For those all-gathers elem_offset is the offset inside every
 * rank's partition and elems the gathered total. Stage 3 refreshes the full copies of its
 * persistent parameters. */
void zp_build_optimizer_step(Builder *b, GArray *launched)
{
    const ZpSchedule *s = b->s;
    const int stage = s->plan.zero.stage;
    GArray *kept = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    if (stage == 3)
        b->impl->persistent(s, kept);
    const gboolean freed = b->impl->persistent_freed_for_step && kept->len > 0;
    if (freed) { /* the step-long copies (buffer -1), freed when the step begins */
        ZpOp op = {.kind = ZP_OP_FREE, .sub = ZP_MEM_GATHERED_PARAMS, .unit = -1, .micro = -1,
                   .buffer = -1, .bytes = s->state_bytes[ZP_MEM_GATHERED_PARAMS]};
        const uint32_t release = zp_build_emit(b, op, (uint32_t *)launched->data, launched->len);
        g_array_append_val(launched, release);
    }
    const double elems = (stage == 0 ? (double)s->total_elems : (double)s->partition_elems) +
                         zp_build_moe_optimizer_elems(s);
    const double cpu_share = zp_offload_cpu_share(&s->plan, elems);
    const Cost c = zp_build_optimizer_cost(b, (1.0 - cpu_share) * elems);
    GArray *step = g_array_new(FALSE, FALSE, sizeof(ZpStepBuffer));
    if (cpu_share < 1.0) /* the GPU's step (all of it without optimizer offload) */
        b->impl->step_buffers(s, step);
    int *ids = g_new(int, step->len + 1);
    uint32_t previous = NONE;
    for (guint i = 0; i < step->len; i++) {
        const ZpStepBuffer *sb = &g_array_index(step, ZpStepBuffer, i);
        g_array_append_val(launched, previous);
        previous = zp_build_emit_alloc(b, sb->cat, sb->bytes, -1, -1, &ids[i],
                                       (uint32_t *)launched->data, launched->len);
        g_array_set_size(launched, launched->len - 1);
        if (i > 0 && g_array_index(step, ZpStepBuffer, i - 1).transient)
            zp_build_emit_free(b, g_array_index(step, ZpStepBuffer, i - 1).cat,
                               g_array_index(step, ZpStepBuffer, i - 1).bytes, -1, -1, ids[i - 1],
                               previous);
    }
    g_array_append_val(launched, previous);
    uint32_t opt = cpu_share < 1.0
                       ? zp_build_emit_compute(b, ZP_COMP_OPTIMIZER, -1, -1, c,
                                               (uint32_t *)launched->data, launched->len)
                       : NONE;
    g_array_set_size(launched, launched->len - 1);
    for (guint i = 0; i < step->len; i++) {
        const ZpStepBuffer *sb = &g_array_index(step, ZpStepBuffer, i);
        if (!sb->transient || i + 1 == step->len)
            zp_build_emit_free(b, sb->cat, sb->bytes, -1, -1, ids[i], opt);
    }
    if (b->grad_state >= 0) { /* the gradient state the first reduction took */
        zp_build_emit_free(b, ZP_MEM_GRADS, b->grad_state_bytes, -1, -1, b->grad_state, opt);
        b->grad_state = -1;
    }
    g_free(ids);
    g_array_unref(step);
    if (cpu_share > 0)
        opt = zp_build_cpu_optimizer_step(b, elems, launched, opt);
    if (stage == 3) {
        /* Persistent parameters are never gathered before use, so their full copies (buffer
         * -1: the step-long state) are refreshed from the updated partitions here, each into
         * a buffer taken again just before its all-gather when they were freed. */
        for (guint i = 0; i < kept->len; i++) {
            const ZpFetch *f = &g_array_index(kept, ZpFetch, i);
            const double bytes = (double)f->elems * b->state.param_bytes;
            ZpOp op = {.kind = ZP_OP_ALLOC, .sub = ZP_MEM_GATHERED_PARAMS, .unit = f->unit,
                       .micro = -1, .buffer = -1, .bytes = bytes};
            const uint32_t taken = freed ? zp_build_emit(b, op, &opt, 1) : opt;
            zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_DP, f->unit, -1, -1, f->offset,
                                     f->elems, bytes, &taken, 1);
        }
        g_array_unref(kept);
        return;
    }
    g_array_unref(kept);
    if (stage == 1 || stage == 2)
        zp_build_moe_param_gather(b, opt);
    if ((stage != 1 && stage != 2) || gathers_in_forward(&s->plan))
        return; /* none, or in the next forward */
    if (b->impl->param_gather_by_bucket) { /* in place, a gradient bucket at a time */
        g_array_set_size(b->param_gathers, b->buckets->len);
        while (b->param_gathers_issued < b->buckets->len)
            issue_param_gather(b, opt);
        return;
    }
    const uint64_t dp = (uint64_t)s->plan.dp;
    const uint64_t chunk = MAX((uint64_t)1, (uint64_t)(s->plan.zero.allgather_bucket_size / dp));
    const gboolean buffered = b->impl->post_step_gather_buffer;
    /* One chunk's buffer at a time, as the memory model counts it: a chunk takes its
     * buffer only when the previous chunk's all-gather is done. In place (no buffer), the
     * chunks still go one after another on the stream. */
    previous = NONE;
    for (uint64_t off = 0; off < s->partition_elems; off += chunk) {
        const uint64_t n = MIN(chunk, s->partition_elems - off) * dp;
        const double bytes = (double)n * b->state.param_bytes;
        int buffer = -1;
        const uint32_t adeps[2] = {opt, previous};
        uint32_t alloc =
            buffered ? zp_build_emit_alloc(b, ZP_MEM_BUCKETS, bytes, -1, -1, &buffer, adeps, 2)
                     : NONE;
        const uint32_t cdeps[2] = {alloc, buffered ? NONE : opt};
        previous = zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_DP, -1, -1, buffer, off,
                                            n, bytes, cdeps, 2);
        if (buffered)
            zp_build_emit_free(b, ZP_MEM_BUCKETS, bytes, -1, -1, buffer, previous);
    }
}
