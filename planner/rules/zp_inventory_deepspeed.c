/* zp_inventory_deepspeed: what a DeepSpeed run launches — the model as PyTorch eager runs it,
 * converted to 16 bits by the engine (no autocast casts), and DeepSpeed's optimizer step: ZeRO's
 * fp32 gradient partition, its norm, unscale and clip, FusedAdam, the copy back to 16 bits. */
#include "zp_inventory.h"

#define STAGE12 "deepspeed/runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.step"
#define FUSED_ADAM "deepspeed/ops/adam/fused_adam.py FusedAdam.step (multi_tensor_applier " \
                   "over csrc/adam/multi_tensor_adam.cu)"

/* The step over this rank's partition of n elements (stage_1_and_2.py step): the 16-bit
 * gradient partition widened to fp32 (single_partition_grad ... .to(fp32)), its norm
 * (get_grad_norm_direct), unscale_and_clip_grads (one multiply by the combined scale),
 * FusedAdam (reads parameter, gradient and both moments, writes three), and the fp32 partition
 * copied into the 16-bit one (bit16_partitions[...].data.copy_). */
static void optimizer(const ZpInvDims *d, double n, ZpInvList *out)
{
    const double l = zp_inv_multi_tensor_launches(n), e = d->e;
    zp_inv_mem(out, "grad_partition.to_fp32", e * n, 4 * n, STAGE12);
    zp_inv_mem(out, "grad_norm", 4 * n, 0, STAGE12 " (get_grad_norm_direct)");
    zp_inv_mem(out, "unscale_and_clip", 4 * n, 4 * n, STAGE12 " (unscale_and_clip_grads)");
    zp_inv_multi(out, "fused_adam", 16 * n, 12 * n, l, FUSED_ADAM);
    zp_inv_mem(out, "copy_to_bit16", 4 * n, e * n, STAGE12);
}

const ZpInventory zp_inventory_deepspeed = {
    .name = "deepspeed",
    .about = "DeepSpeed's engine: the Hugging Face model in 16 bits as PyTorch eager runs it, "
             "ZeRO's optimizer step with FusedAdam",
    /* deepspeed/runtime/engine.py DeepSpeedEngine._configure_distributed_model casts the
     * module's parameters to the 16-bit dtype (module.half() or .bfloat16() up to v0.19.1,
     * _cast_module_mixed_precision since v0.19.2), so the model's kernels are eager's without
     * autocast. */
    .autocast = FALSE,
    .embed_fwd = zp_inventory_eager_embed_fwd,
    .block_fwd = zp_inventory_eager_block_fwd,
    .head = zp_inventory_eager_head,
    .block_bwd = zp_inventory_eager_block_bwd,
    .embed_bwd = zp_inventory_eager_embed_bwd,
    .optimizer = optimizer,
};
