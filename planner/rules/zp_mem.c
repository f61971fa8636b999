/* zp_mem: a plan's residual memory, term by term: the activation terms (zp_mem_terms, with
 * ZeRO-R's checkpoints from zp_zeror), the implementation's buffers (zp_impl), hpZ's secondary
 * partition (ZeRO++) and the hwprofile's reserve. */
#include "zp_mem.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_zeror.h"

#include <math.h>

static void add_activation_terms(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    const double s = model->seq_len, b = plan->micro_batch;
    r->activation_block_bytes = zp_mem_plan_activation_block_bytes(model, plan);
    if (plan->checkpoint) {
        /* A checkpoint is the block input, 2sbh in 16 bits, replicated across the tensor
         * group (split over it with sequence parallelism) unless Pa partitions it (zp_zeror);
         * backward recomputes one block at a time, so one block's set is live, beside the
         * re-gathered input under Pa. */
        const ZpCkptRule rule = zp_zeror_checkpoint(model, plan);
        r->checkpoint_bytes = (double)model->layers * rule.gpu_bytes;
        r->checkpoint_host_bytes = zp_zeror_host_bytes(model, plan);
        r->recompute_bytes = r->activation_block_bytes + (rule.regathered ? rule.full_bytes : 0);
    } else {
        r->activations_bytes = (double)model->layers * r->activation_block_bytes;
        /* selective: one block's core attention recomputed in its backward */
        r->recompute_bytes = zp_mem_core_attention_bytes(model, plan);
    }
    if (zp_moe_enabled(&model->moe)) {
        /* A mixture of experts' blocks differ: the sparse ones keep the router's, the experts'
         * and the combine's activations instead of the dense MLP's (zp_ep_activations). */
        const ZpEpActivations moe = zp_ep_activations(model, plan);
        const double uniform = r->activation_block_bytes;
        r->activation_block_bytes = fmax(moe.dense_layer_bytes, moe.sparse_layer_bytes);
        /* DeepSpeed's regathered slots beside the buffer they came back in, and Megatron's
         * persistent buffer of the all-gather dispatcher's gathered tokens */
        r->moe_buffer_bytes = fmax(moe.dispatch_bytes, moe.combine_bytes) +
                              moe.regathered_bytes + moe.global_buffer_bytes;
        if (plan->checkpoint)
            r->recompute_bytes += r->activation_block_bytes - uniform;
        else
            r->activations_bytes = moe.activations_bytes;
    }
    /* Korthikanti's output layer term: 4 s b V / t bytes of fp32 logits for the loss. */
    r->logits_bytes = 4.0 * s * b * (double)model->vocab / plan->mp;
}

/* hpZ (zp_zeropp_secondary_bytes, without the schedule's per-unit padding): the 16-bit
 * secondary partition of the parameters the implementation does not keep whole. */
static void add_hpz_term(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    const int hpz = plan->zero.zero_hpz_partition_size;
    if (plan->zero.stage != 3 || hpz <= 1)
        return;
    const double param_bytes = zp_plan_state_bytes(plan->precision, plan->optimizer).param_bytes;
    const double psi = (double)zp_model_param_count(model) / plan->mp;
    r->hpz_secondary_bytes = (psi * param_bytes - r->stage3_persistent_bytes) / hpz;
    /* ZpImpl secondary_per_block (FSDP2): the blocks' shards alone, all held at the turn
     * from forward to backward, the root's none */
    if (zp_impl_get(plan->impl)->secondary_per_block && zp_model_has_architecture(model))
        r->hpz_secondary_bytes = (double)model->layers * (double)zp_model_unit_elems(model, 1) /
                                 plan->mp * param_bytes / hpz;
}

ZpResidual zp_mem_residual(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw)
{
    ZpPlan normalized = *plan;
    zp_impl_normalize_plan(&normalized);
    plan = &normalized;
    ZpResidual r = {0};
    if (zp_model_has_architecture(model))
        add_activation_terms(model, plan, &r);
    zp_impl_get(plan->impl)->residual_buffers(model, plan, &r);
    add_hpz_term(model, plan, &r);
    r.reserve_bytes = hw ? hw->runtime_reserve_bytes : 0.0;
    r.total_bytes = r.activations_bytes + r.checkpoint_bytes + r.recompute_bytes +
                    r.logits_bytes + r.reduce_bucket_bytes + r.allgather_bucket_bytes +
                    r.stage3_gathered_bytes + r.stage3_persistent_bytes + r.hpz_secondary_bytes +
                    r.step_buffer_bytes + r.moe_buffer_bytes + r.reserve_bytes;
    return r;
}
