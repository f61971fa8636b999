/* zp_impl_fsdp: PyTorch FSDP (torch/distributed/fsdp, FullyShardedDataParallel) as users run
 * it: FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, NO_SHARD = DDP; one FSDP unit per
 * transformer block (transformer_auto_wrap_policy), the root unit holding the rest. */
#include "zp_impl.h"

#include <math.h>

/* ShardingStrategy has no stage 1 (optimizer states alone). */
static gboolean fsdp_has_stage(int stage)
{
    return stage == 0 || stage == 2 || stage == 3;
}

/* NO_SHARD all-reduces gradients; the sharded strategies reduce-scatter them
 * (_runtime_utils.py _reduce_grad) in the reduce dtype (MixedPrecision.reduce_dtype). */
ZpCollKind zp_impl_fsdp_grad_collective(const ZpPlan *plan)
{
    return plan->zero.stage == 0 ? ZP_COLL_ALLREDUCE : ZP_COLL_REDUCE_SCATTER;
}

/* One reduction per block unit as its backward ends (_post_backward_hook); the root's
 * parameters (embeddings, final norm, untied head) are reduced together after the embedding's
 * backward, when the root's post-backward hook fires. */
void zp_impl_fsdp_plan_buckets(const ZpSchedule *s, GArray *buckets)
{
    zp_impl_group_buckets(s, FALSE, 0, FALSE, buckets);
    const int last = s->n_units - 1;
    for (guint i = 0; i < buckets->len; i++) {
        ZpBucketSpec *k = &g_array_index(buckets, ZpBucketSpec, i);
        if (k->low_unit == last)
            k->launch_unit = 0;
    }
}

/* FSDP holds no bucket buffers: each unit's unsharded gradient is its own until reduced. */
static int fsdp_bucket_buffers(const ZpPlan *plan, double *elems)
{
    (void)plan;
    *elems = 0;
    return 0;
}

static gboolean fsdp_concat_copy(const ZpPlan *plan, const ZpBucketSpec *k)
{
    (void)plan, (void)k;
    return FALSE;
}

static void add_fetch(const ZpSchedule *s, GArray *fetches, int unit, int trigger_pos,
                      int use_pos, int free_pos)
{
    ZpFetch f = {unit, s->unit_offset[unit], zp_sched_unit_padded(s, unit), trigger_pos, use_pos,
                 free_pos, FALSE, s->unit_elems[unit], 0, 0, 0};
    g_array_append_val(fetches, f);
}

/* FULL_SHARD: the root unit (embeddings and the final unit) is gathered at the start and not
 * resharded until its backward ends (the root keeps its parameters between forward and
 * backward); each block is gathered before its forward, one block ahead (forward_prefetch),
 * resharded after its forward (reshard_after_forward), gathered again before its backward,
 * one block ahead (BackwardPrefetch.BACKWARD_PRE), used by its recompute and its backward and
 * resharded after. */
void zp_impl_fsdp_plan_fetches(const ZpSchedule *s, GArray *fetches)
{
    const int L = (int)s->model.layers;
    const int end = zp_pos_embed_bwd(L);
    add_fetch(s, fetches, 0, zp_pos_fwd(0), zp_pos_fwd(0), end);
    add_fetch(s, fetches, L + 1, zp_pos_fwd(0), zp_pos_fwd(0), end);
    for (int l = 1; l <= L; l++)
        add_fetch(s, fetches, l, zp_pos_fwd(l - 1), zp_pos_fwd(l), zp_pos_fwd(l));
    for (int l = L; l >= 1; l--) {
        const int use = s->plan.checkpoint ? zp_pos_rec(L, l) : zp_pos_bwd(L, l);
        const int ahead = l == L ? zp_pos_head(L) : zp_pos_bwd(L, l + 1);
        add_fetch(s, fetches, l, ahead, use, zp_pos_bwd(L, l));
    }
}

static void fsdp_persistent(const ZpSchedule *s, GArray *ranges)
{
    (void)s, (void)ranges; /* FSDP shards every unit */
}

static double fsdp_grad_state_elems(const ZpSchedule *s)
{
    return zp_impl_partition_grad_elems(s);
}

/* Block-granular terms: one unsharded block (the unit being reduced) per bucket, no
 * all-gather bucket, and at stage 3 the root unit, the block in use and the one prefetched. */
void zp_impl_fsdp_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    zp_impl_paper_residual(model, plan, r);
    r->allgather_bucket_bytes = 0;
    if (!zp_model_has_architecture(model))
        return;
    const double block = (double)zp_model_unit_elems(model, 1) / plan->mp;
    const double root = ((double)zp_model_unit_elems(model, 0) +
                         (double)zp_model_unit_elems(model, (int)model->layers + 1)) / plan->mp;
    r->reduce_bucket_bytes = fmax(block, root) * zp_plan_reduce_bytes(plan);
    if (plan->zero.stage == 3) {
        const ZpStateBytes bytes = zp_plan_state_bytes(plan->precision, plan->optimizer);
        r->stage3_gathered_bytes = (root + 2 * block) * bytes.param_bytes;
        r->stage3_persistent_bytes = 0;
    }
}

const ZpImpl zp_impl_fsdp = {
    .kind = ZP_IMPL_FSDP,
    .name = "fsdp",
    .has_stage = fsdp_has_stage,
    .stages = "stages 0 (NO_SHARD), 2 (SHARD_GRAD_OP) and 3 (FULL_SHARD), no stage 1",
    .grad_collective = zp_impl_fsdp_grad_collective,
    .plan_buckets = zp_impl_fsdp_plan_buckets,
    .bucket_buffers = fsdp_bucket_buffers,
    .concat_copy = fsdp_concat_copy,
    .post_step_gather_buffer = FALSE,
    .plan_fetches = zp_impl_fsdp_plan_fetches,
    .persistent = fsdp_persistent,
    .unit_persistence = FALSE,
    .grad_state_elems = fsdp_grad_state_elems,
    .step_buffers = zp_impl_no_step_buffers,
    .residual_buffers = zp_impl_fsdp_residual,
    .gather_bound_elems = zp_impl_unit_gather_bound,
    .zero_knobs = 0,
};
