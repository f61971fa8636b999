/* zp_build_ckpt: activation checkpoints in the schedule: block inputs kept, partitioned over
 * the tensor group (ZeRO-R's Pa) or copied to the host (Pa+cpu), re-gathered for recompute. */
#include "zp_build.h"

/* synchronize_checkpoint_boundary: CheckpointFunction's forward and backward begin and end
 * with a device synchronize, so the next compute op waits for everything issued so far on
 * every stream (in-flight gathers and reductions included). */
void zp_build_checkpoint_sync(Builder *b)
{
    for (int stream = 0; stream < ZP_STREAM_N; stream++)
        zp_build_sync_on(b, b->last_on_stream[stream]);
}

/* Pa+cpu (zp_zeror): the synchronous copy of a block's checkpoint slice over the host link,
 * on the compute stream as DeepSpeed's `.cpu()` and `copy_()` are. */
static void host_copy(Builder *b, int unit, int micro, double bytes)
{
    const Cost none = {0};
    const uint32_t op =
        zp_build_emit_compute(b, ZP_COMP_HOST_COPY, unit, micro, none, &b->last_compute, 1);
    g_array_index(b->s->ops, ZpOp, op).bytes = bytes;
}

/* Forward keeps the block input: whole, its 1/M slice (Pa) on the GPU, or the slice copied
 * to the host (Pa+cpu), before the block runs (CheckpointFunction.forward). */
void zp_build_keep_checkpoint(Builder *b, int l, int micro, Activations *a, GArray *deps)
{
    int *slot = zp_build_act_slot(b, a->ckpt, micro, l);
    *slot = -1;
    if (a->rule.copy_bytes > 0)
        host_copy(b, l, micro, a->rule.copy_bytes);
    if (a->rule.gpu_bytes > 0) {
        uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_CHECKPOINTS, a->rule.gpu_bytes, l, micro,
                                             slot, &b->last_compute, 1);
        zp_build_put_dep(b, deps, alloc);
    }
}

/* Before the recompute, Pa and Pa+cpu rebuild the whole input in a new GPU buffer
 * (gather_partitioned_activations): the slice copied in from the host, then the all-gather
 * of b*s*h over the tensor group; the slice kept on the GPU is released then. */
void zp_build_regather_checkpoint(Builder *b, int l, int micro, Activations *a)
{
    if (!a->rule.regathered)
        return;
    int *slot = zp_build_act_slot(b, a->ckpt, micro, l);
    const int kept = *slot;
    uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_CHECKPOINTS, a->rule.full_bytes, l, micro, slot,
                                         &b->last_compute, 1);
    zp_build_sync_on(b, alloc);
    if (a->rule.copy_bytes > 0)
        host_copy(b, l, micro, a->rule.copy_bytes);
    if (a->rule.gather_elems > 0) {
        const uint32_t after[2] = {alloc, b->last_compute};
        uint32_t coll =
            zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_TP, l, micro, -1, 0,
                                     a->rule.gather_elems, a->rule.full_bytes, after, 2);
        zp_build_sync_on(b, coll);
        if (kept >= 0)
            zp_build_emit_free(b, ZP_MEM_CHECKPOINTS, a->rule.gpu_bytes, l, micro, kept, coll);
    } else if (kept >= 0) {
        zp_build_emit_free(b, ZP_MEM_CHECKPOINTS, a->rule.gpu_bytes, l, micro, kept,
                           b->last_compute);
    }
}
