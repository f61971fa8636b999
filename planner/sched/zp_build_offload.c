/* zp_build_offload: ZeRO-Offload's and ZeRO-Infinity's ops in the schedule: gradient slices
 * copied to the host as buckets drain, and the CPU optimizer's step (zp_offload). */
#include "zp_build.h"
#include "zp_mem.h"
#include "zp_offload.h"

#include <math.h>

/* Optimizer offload: this rank's slice of bucket k streams to the host as the bucket is
 * reduced; returns the op after which the slice has left the GPU (the collective without
 * offload). The paper's way: later micro-steps first bring the host's fp32 sum up to add to
 * it (DeepSpeed's stage 2 accumulates on the GPU so: async_accumulate_grad_in_cpu_via_gpu),
 * then the fp32 slice goes down. An implementation with host_grad_accum (DeepSpeed's stage
 * 3, stage3.py partition_grads): the 16-bit slice goes down into grad_partitions_flat_buffer
 * and comes back up (grad_buffer.to(device)) at micro-step 0; later ones bring the 16-bit
 * sum up, add on the GPU and copy it down again; at the last micro-step the sum goes down
 * once more as fp32 (_offload_grad_partition_at_boundary). */
static double partial_d2h_bytes(const ZpSchedule *s, uint64_t lo, double elems)
{
    const double at = zp_impl_tensor_part_at(s, lo);
    const double gpu = zp_offload_gpu_elems(&s->plan, (double)s->partition_elems);
    return fmax(0.0, at + elems - fmax(at, gpu)) * 4.0;
}

uint32_t zp_build_offload_grad_slice(Builder *b, const Bucket *k, int unit, int micro)
{
    const ZpSchedule *s = b->s;
    const double elems = k->spec.bytes / zp_plan_reduce_bytes(&s->plan) / s->plan.dp;
    const double part = (double)s->partition_elems;
    const gboolean partial = s->plan.zero.stage == 3 && b->impl->host_grad_accum &&
                             zp_offload_cpu_share(&s->plan, part) > 0 &&
                             zp_offload_gpu_elems(&s->plan, part) > 0;
    const double slice = partial ? partial_d2h_bytes(s, k->spec.lo, elems)
                                 : zp_offload_grad_d2h_bytes(&s->plan, elems, part);
    uint32_t drained = k->coll_op;
    if (slice <= 0 && !partial)
        return drained;
    const gboolean last = micro == s->plan.grad_accum - 1;
    if (s->plan.zero.stage == 3 && b->impl->host_grad_accum) {
        /* every sub-group's, those the GPU steps too (the buffer is the host's) */
        const double half = elems * zp_plan_elem_bytes(s->plan.precision);
        const ZpTransferKind first = micro == 0 ? ZP_XFER_D2H : ZP_XFER_H2D;
        drained = zp_build_emit_transfer(b, first, half, unit, micro, drained);
        drained = zp_build_emit_transfer(b, first == ZP_XFER_D2H ? ZP_XFER_H2D : ZP_XFER_D2H, half,
                                         unit, micro, drained);
        drained = zp_build_emit_transfer(b, ZP_XFER_D2H, last ? slice : 0, unit, micro, drained);
    } else if (zp_offload_stage2_accum(&s->plan)) {
        /* DeepSpeed's stage 2 by whole tensors (zp_offload_stage2_accum_elems), the mean over
         * the ranks: stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu brings the host's
         * 16-bit sum up and adds it on later micro-steps, then copies the sum down; at the
         * last, async_inplace_copy_grad_to_fp32_buffer_from_gpu sends the rank's part in
         * fp32 */
        const double whole = zp_offload_stage2_accum_elems(&s->model, &s->plan,
                                                           (double)s->partition_elems,
                                                           (double)k->spec.lo,
                                                           (double)k->spec.hi, -1) /
                             s->plan.dp * zp_plan_elem_bytes(s->plan.precision);
        drained =
            zp_build_emit_transfer(b, ZP_XFER_H2D, micro > 0 ? whole : 0, unit, micro, drained);
        drained = zp_build_emit_transfer(b, ZP_XFER_D2H, whole, unit, micro, drained);
        drained = zp_build_emit_transfer(b, ZP_XFER_D2H, last ? slice : 0, unit, micro, drained);
    } else {
        drained = zp_build_emit_transfer(
            b, ZP_XFER_H2D, s->plan.zero.stage >= 2 && micro > 0 ? slice : 0, unit, micro, drained);
        drained = zp_build_emit_transfer(b, ZP_XFER_D2H, slice, unit, micro, drained);
    }
    g_array_append_val(b->offloaded, drained);
    /* ZeRO-Infinity: at the last micro-step the fp32 slice goes on to the optimizer's swap
     * file (stage3.py partition_grads -> optimizer_swapper.swap_out_gradients), to be swapped
     * in with the states at the step. */
    if (zp_offload_optimizer_tier(&s->plan) == ZP_TIER_NVME && last) {
        const uint32_t out =
            zp_build_emit_transfer(b, ZP_XFER_NVME_WRITE, slice, unit, micro, drained);
        g_array_append_val(b->offloaded, out);
    }
    return drained;
}

/* Optimizer offload: CPU Adam on the host's share once every gradient slice has arrived,
 * sub-group by sub-group (zp_offload_sub_group_step): its states swapped in from NVMe
 * (ZeRO-Infinity) once the previous sub-group's are out of the swap buffers, the step after
 * the previous one, then its 16-bit parameters back to the GPU (or NVMe) and its states out.
 * It overlaps nothing: DeepSpeed steps after backward, the GPU's share (`gpu_opt`, partial
 * offload) before the host's. Returns the op the parameter all-gathers wait for (the last
 * transfer up, which follows the ones before it). */
uint32_t zp_build_cpu_optimizer_step(Builder *b, double elems, GArray *launched, uint32_t gpu_opt)
{
    const ZpPlan *plan = &b->s->plan;
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_array_append_vals(deps, launched->data, launched->len);
    g_array_append_vals(deps, b->offloaded->data, b->offloaded->len);
    g_array_append_val(deps, gpu_opt);
    uint32_t adam = NONE, out = NONE, up = NONE; /* the last of each so far */
    const double adam_bytes = zp_offload_cpu_adam_bytes(plan);
    for (int j = 0; j < zp_offload_sub_group_count(plan, elems); j++) {
        ZpOffloadStep step;
        zp_offload_sub_group_step(plan, elems, j, &step);
        uint32_t done = gpu_opt; /* what its parameters' write-back follows */
        if (step.on_cpu) {
            const uint32_t before[2] = {out, adam};
            g_array_append_vals(deps, before, 2);
            if (step.nvme_read_bytes > 0) {
                const ZpOp read = {.kind = ZP_OP_TRANSFER, .sub = ZP_XFER_NVME_READ,
                                   .bytes = step.nvme_read_bytes};
                const uint32_t r =
                    zp_build_emit_step_op(b, read, (uint32_t *)deps->data, deps->len);
                g_array_append_val(deps, r);
            }
            const ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_CPU_OPTIMIZER,
                             .mem_bytes = step.elems * adam_bytes};
            done = adam = zp_build_emit_step_op(b, op, (uint32_t *)deps->data, deps->len);
            g_array_set_size(deps, 0);
        }
        const uint32_t after[2] = {done, out}, after_up[2] = {done, up};
        if (step.nvme_write_bytes > 0)
            out = zp_build_emit_step_op(b, (ZpOp){.kind = ZP_OP_TRANSFER, .sub = ZP_XFER_NVME_WRITE,
                                                  .bytes = step.nvme_write_bytes}, after, 2);
        if (step.h2d_bytes > 0)
            up = zp_build_emit_step_op(b, (ZpOp){.kind = ZP_OP_TRANSFER, .sub = ZP_XFER_H2D,
                                                 .bytes = step.h2d_bytes}, after_up, 2);
    }
    g_array_unref(deps);
    return up != NONE ? up : adam != NONE ? adam : gpu_opt;
}
