/* zp_ep: a mixture of experts under expert parallelism — its partitioned model states, its
 * sparse layers' tokens, buffers and activations, and the all-to-all NCCL runs for them. */
#include "zp_ep.h"
#include "zp_util.h"

#include <math.h>

gboolean zp_ep_check(const ZpModel *model, const ZpPlan *plan, const char *flag, GError **error)
{
    const int ep = zp_plan_ep(plan);
    if (ep == 1)
        return TRUE;
    if (!zp_moe_enabled(&model->moe)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %d needs a mixture of experts; %s has none", flag, ep, model->name);
        return FALSE;
    }
    if (model->moe.experts % ep != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %d does not divide the %" G_GINT64_FORMAT " experts of %s", flag, ep,
                    model->moe.experts, model->name);
        return FALSE;
    }
    if (zp_plan_etp(plan) == 1 && plan->mp > 1) { /* whole experts: EP over TP x DP */
        if ((plan->mp * plan->dp) % ep != 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: %d does not divide the %d ranks of a stage (TP %d x DP %d: with "
                        "whole experts the expert-parallel group is taken from them)", flag, ep,
                        plan->mp * plan->dp, plan->mp, plan->dp);
            return FALSE;
        }
        return TRUE;
    }
    if (plan->dp % ep != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %d does not divide the data-parallel degree %d (the expert-parallel "
                    "group is taken from the data-parallel ranks)", flag, ep, plan->dp);
        return FALSE;
    }
    return TRUE;
}

gboolean zp_ep_dispatcher_check(const ZpModel *model, const ZpPlan *plan, const char *flag,
                                GError **error)
{
    if (plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER && !zp_moe_enabled(&model->moe)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: allgather: %s is not a mixture of "
                    "experts", flag, model->name);
        return FALSE;
    }
    return zp_plan_dispatcher_check(plan, flag, error);
}

double zp_ep_expert_params(const ZpModel *model)
{
    double elems = 0;
    if (zp_moe_enabled(&model->moe))
        for (int unit = 1; unit <= model->layers; unit++)
            elems += (double)zp_model_unit_expert_elems(model, unit);
    return elems;
}

ZpEpStates zp_ep_model_states(const ZpModel *model, const ZpPlan *plan, int stage,
                              ZpStateBytes bytes)
{
    const int ep = zp_plan_ep(plan);
    const double experts = zp_ep_expert_params(model);
    const double dense = (double)zp_model_param_count(model) - experts;
    ZpEpStates s = {0};
    const int etp = zp_plan_etp(plan);
    s.expert_params = experts / ep / etp;
    s.dense_params = dense / plan->mp;
    s.dense = zp_mem_model_states(dense, stage, plan->dp, plan->mp, bytes);
    s.expert = zp_mem_model_states(experts / ep, stage, zp_plan_edp(plan), etp, bytes);
    s.total.params_bytes = s.dense.params_bytes + s.expert.params_bytes;
    s.total.grads_bytes = s.dense.grads_bytes + s.expert.grads_bytes;
    s.total.optim_bytes = s.dense.optim_bytes + s.expert.optim_bytes;
    s.total.total_bytes = s.dense.total_bytes + s.expert.total_bytes;
    return s;
}

/* Tokens a rank routes (T), copies it dispatches (T k), an expert's capacity from one rank and
 * what the busiest rank's E/EP experts receive (R). Capacity as Megatron-Core's
 * moe_utils.get_capacity and DeepSpeed's sharded_moe.py top2gating: ceil(T k / E x factor) per
 * expert, each rank's dispatch a padded [E, capacity, h] buffer, so every rank receives
 * E x capacity whatever the router does. Dropless (Megatron-Core's default, the capacity factor
 * None): T k in balance, the busiest rank `skew` times that, in whole tokens. */
static void route(const ZpModel *model, const ZpPlan *plan, ZpEpActivations *a)
{
    const ZpMoe *moe = &model->moe;
    a->tokens = (double)plan->micro_batch * (double)model->seq_len /
                (plan->sequence_parallel ? plan->mp : 1);
    a->routed_tokens = a->tokens * (double)moe->top_k;
    /* DeepSpeed over TP: each tensor rank dispatches its 1/t of every expert's slots */
    const double drop = zp_ep_tp_drop(plan);
    if (plan->experts.capacity_factor > 0) {
        a->expert_capacity =
            ceil(a->routed_tokens / (double)moe->experts * plan->experts.capacity_factor);
        a->received_tokens = (double)moe->experts * a->expert_capacity / drop;
    } else {
        /* whole tokens: a skew's product rounded up (a fraction left fractional bytes, whose
         * allocations and frees then summed to -1.8e-12 bytes live in a peak's breakdown);
         * the float's own noise below 1e-6 of a token is none */
        a->received_tokens = ceil(a->routed_tokens * zp_plan_expert_skew(plan) / drop - 1e-6);
    }
    if (plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
        /* MoEAllGatherTokenDispatcher.token_dispatch gathers the T tokens of each of the
         * ETP x EP ranks of its group (tp_ep: the expert tensor ranks of each EP rank; the
         * gather is the identity over one); the rank's E/EP experts take their 1/EP of the
         * copies, each expert split ETP ways, so ETP R, the busiest rank's skew included. */
        a->gathered_tokens = a->tokens * zp_plan_etp(plan) * zp_plan_ep(plan);
        a->expert_tokens = a->received_tokens * zp_plan_etp(plan);
        return;
    }
    a->expert_tokens = a->received_tokens * zp_ep_tp_gather(plan);
}

/* With sequence parallelism each of the t tensor ranks routes its own T = b s / t tokens and
 * all-to-alls them alone; the experts, split t ways as the dense MLP (expert tensor parallelism
 * at the TP degree), then need every token of the group, so the t ranks' received tokens are
 * all-gathered over the expert tensor group before the experts and their outputs
 * reduce-scattered back after (Megatron-Core's token_dispatcher.py
 * MoEAlltoAllTokenDispatcher.dispatch_postprocess: gather_from_sequence_parallel_region over
 * expt_tp; combine_preprocess: reduce_scatter_to_sequence_parallel_region, in the probs' dtype,
 * which moe_utils.py topk_routing_with_score_function casts back to the logits'). Without it
 * every tensor rank holds the whole sequence and routes all of it: no gather. DeepSpeed's
 * tensor ranks each dispatch 1/t of the slots (zp_ep_tp_drop), and its experts split over TP
 * gather them back in the same way (MOELayer.forward: gather_tokens after the all-to-all). */
int zp_ep_tp_gather(const ZpPlan *plan)
{
    const gboolean own_tokens = plan->sequence_parallel || zp_ep_tp_drop(plan) > 1;
    return plan->experts.dispatcher == ZP_DISPATCH_ALLTOALL && own_tokens &&
                   zp_plan_etp(plan) > 1
               ? zp_plan_etp(plan)
               : 1;
}

/* Megatron-Core reduce-scatters the split experts' partial outputs back to the ranks' own
 * tokens (combine_preprocess, above). DeepSpeed's experts split over TP are Megatron-DeepSpeed's
 * ParallelMLP(moe=True, enable_expert_tensor_parallelism=True): its RowParallelLinear
 * all-reduces the t R outputs, and backward its ColumnParallelLinear all-reduces their inputs'
 * gradients; MOELayer.forward then drops each rank's 1/t again (sharded_moe.py drop_tokens,
 * a slice, and gather_tokens' backward likewise) for the combine's all-to-all. */
ZpCollKind zp_ep_tp_gather_back(const ZpPlan *plan)
{
    return zp_ep_tp_drop(plan) > 1 ? ZP_COLL_ALLREDUCE : ZP_COLL_REDUCE_SCATTER;
}

int zp_ep_tp_drop(const ZpPlan *plan)
{
    return plan->impl == ZP_IMPL_DEEPSPEED && plan->mp > 1 ? plan->mp : 1;
}

gboolean zp_ep_drop_check(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    const int t = zp_ep_tp_drop(plan);
    if (t == 1 || !zp_moe_enabled(&model->moe))
        return TRUE;
    if (plan->sequence_parallel) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "sequence_parallel: DeepSpeed's mixture "
                    "of experts over TP %d drops the tensor ranks' duplicate tokens "
                    "(sharded_moe.py drop_tokens), which sequence parallelism does not have: "
                    "not modeled (%s)", t, model->name);
        return FALSE;
    }
    ZpEpActivations a = {0};
    route(model, plan, &a);
    if (plan->experts.capacity_factor > 0 && fmod(a.expert_capacity, t) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "capacity_factor: %g gives each expert "
                    "%.0f slots a micro-batch, which DeepSpeed's drop_tokens cannot split over "
                    "TP %d (mappings.py _drop_tokens asserts it divides them) (%s)",
                    plan->experts.capacity_factor, a.expert_capacity, t, model->name);
        return FALSE;
    }
    return TRUE;
}

/* The experts' outputs come back summed over the tensor ranks (the expert tensor group's
 * reduce-scatter, or the all-gather dispatcher's over TP x EP) or whole (each expert on one
 * rank: ETP 1), so only split experts without sequence parallelism under the all-to-all leave
 * partial sums for the block's row-parallel all-reduce. At TP 1 there is no sum to drop. */
gboolean zp_ep_sparse_mlp_sums(const ZpModel *model, const ZpPlan *plan)
{
    const gboolean partial = plan->experts.dispatcher == ZP_DISPATCH_ALLTOALL &&
                             zp_ep_tp_gather(plan) == 1 && zp_plan_etp(plan) > 1;
    return plan->mp == 1 || partial || model->moe.shared_ffn > 0;
}

/* One block's saved activations with the MLP `ffn` wide (0: attention and norms alone). */
static double block_bytes(const ZpModel *model, const ZpPlan *plan, int64_t ffn)
{
    ZpModel m = *model;
    m.ffn_hidden = ffn;
    return zp_mem_plan_activation_block_bytes(&m, plan);
}

/* What latent attention keeps beyond zp_mem_terms' fused-qkv accounting (Q h, K and V 2kd,
 * the output h, split over t): DeepseekV3Attention saves q_a's output and its norm's (r_q
 * each), kv_a's (r_kv + d_rope) and its norm's (r_kv), whole on every tensor rank (the down
 * projections are replicated), then Q and K of H (d_nope + d_rope), V and the output of
 * H d_v, split over t. */
static double mla_extra_bytes(const ZpModel *model, const ZpPlan *plan)
{
    const ZpMla *mla = &model->mla;
    if (!zp_mla_enabled(mla))
        return 0;
    const double H = (double)model->heads, t = plan->mp;
    const double kd = (double)zp_model_kv_heads(model) * (double)zp_model_head_dim(model);
    const double ha = (double)zp_model_attn_width(model); /* the dense terms' a d */
    const double whole = 2.0 * (double)mla->q_lora_rank + 2.0 * (double)mla->kv_lora_rank +
                         (double)mla->qk_rope_dim;
    const double split = H * (2.0 * (double)(mla->qk_nope_dim + mla->qk_rope_dim) +
                              2.0 * (double)mla->v_dim);
    return (double)model->seq_len * plan->micro_batch * zp_plan_elem_bytes(plan->precision) *
           (whole + (split - 2.0 * ha - 2.0 * kd) / t);
}

ZpEpActivations zp_ep_activations(const ZpModel *model, const ZpPlan *plan)
{
    ZpEpActivations a = {0};
    const double mla = mla_extra_bytes(model, plan);
    a.dense_layer_bytes = zp_mem_plan_activation_block_bytes(model, plan) + mla;
    const int64_t sparse = zp_moe_sparse_layers(&model->moe, model->layers);
    if (sparse == 0) {
        a.activations_bytes = (double)model->layers * a.dense_layer_bytes;
        return a;
    }
    route(model, plan, &a);
    const double e = zp_plan_elem_bytes(plan->precision), h = (double)model->hidden;
    const double fe = (double)model->moe.expert_ffn / zp_plan_etp(plan);
    const double E = (double)model->moe.experts, k = (double)model->moe.top_k;
    /* modeling_mixtral's MixtralSparseMoeBlock: softmax(router_logits, dtype=float) and
     * torch.topk's int64 indices; Megatron-Core's router keeps its probabilities in fp32 too. */
    a.router_bytes = 4.0 * a.tokens * E + 8.0 * a.tokens * k;
    /* Dropless, the T k permuted copies go out and R come in; with a capacity factor the send
     * buffer is the padded [E, capacity, h] itself, R rows as the receive buffer (DeepSpeed's
     * sharded_moe.py MOELayer.forward: dispatched_input = einsum("sec,sm->ecm") is what
     * _AllToAll sends, its output the same shape). */
    const int drop = zp_ep_tp_drop(plan);
    const double sent =
        plan->experts.capacity_factor > 0 ? a.received_tokens : a.routed_tokens / drop;
    const double gathered = zp_ep_tp_gather(plan) > 1 ? a.expert_tokens : 0.0;
    a.dispatch_bytes = (sent + a.received_tokens + gathered) * h * e;
    a.combine_bytes = a.dispatch_bytes;
    if (drop > 1)
        a.regathered_bytes = drop * a.received_tokens * h * e;
    if (plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
        /* MoEAllGatherTokenDispatcher: the gathered tokens, probabilities (the logits' dtype)
         * and boolean routing map, then permute's copies for the experts; back, the experts'
         * outputs and unpermute's [G, h] sum, which token_combine reduce-scatters (in the
         * probabilities' dtype, the model's here). The gathered tokens go into Megatron's
         * persistent "mpu" buffer (token_dispatcher.py token_dispatch: gather_from_sequence_
         * parallel_region(..., use_global_buffer=True); mappings.py _gather_along_first_dim
         * takes it from parallel_state's GlobalMemoryBuffer, utils.py get_tensor, which
         * keeps it at its largest request for good): held all step, a state of the stage
         * (zp_build_moe_states), not the layer's. The probabilities and the map are gathered
         * into tensors of their own. Only where the group gathers (one rank: the identity). */
        const double G = a.gathered_tokens;
        if (zp_plan_etp(plan) * zp_plan_ep(plan) > 1)
            a.global_buffer_bytes = G * h * e;
        a.dispatch_bytes = a.expert_tokens * h * e + G * E * (e + 1.0) +
                           (a.global_buffer_bytes > 0 ? 0.0 : G * h * e);
        a.combine_bytes = (a.expert_tokens + G) * h * e;
    }
    /* The experts' input (fc1's weight gradient) and the gated MLP's gate, up and product (the
     * dense MLP's 3f of zp_mem_terms, over the tokens the experts compute and the expert width
     * split over the tensor group: Megatron-Core's expert tensor parallelism at the TP
     * degree). */
    a.expert_act_bytes = a.expert_tokens * (h + 3.0 * fe) * e;
    a.combine_act_bytes = a.routed_tokens * h * e;
    const double attention = block_bytes(model, plan, 0) + mla;
    const double shared = model->moe.shared_ffn > 0
                              ? block_bytes(model, plan, model->moe.shared_ffn) -
                                    block_bytes(model, plan, 0)
                              : 0.0;
    a.sparse_layer_bytes =
        attention + shared + a.router_bytes + a.expert_act_bytes + a.combine_act_bytes;
    a.activations_bytes = (double)(model->layers - sparse) * a.dense_layer_bytes +
                          (double)sparse * a.sparse_layer_bytes;
    return a;
}

static ZpEpGatherColl gather_coll(ZpCollKind kind, double rows, double width,
                                  double elem_bytes)
{
    return (ZpEpGatherColl){kind, rows * width, rows * width * elem_bytes};
}

ZpEpGatherPass zp_ep_gather_pass(const ZpModel *model, const ZpPlan *plan, gboolean backward)
{
    ZpEpGatherPass p = {0};
    if (plan->experts.dispatcher != ZP_DISPATCH_ALLGATHER ||
        zp_plan_etp(plan) * zp_plan_ep(plan) == 1)
        return p;
    ZpEpActivations a = {0};
    route(model, plan, &a);
    const double G = a.gathered_tokens, e = zp_plan_elem_bytes(plan->precision);
    const double h = (double)model->hidden, E = (double)model->moe.experts;
    if (!backward) {
        p.before[p.n_before++] = gather_coll(ZP_COLL_ALLGATHER, G, E, 1.0);
        p.before[p.n_before++] = gather_coll(ZP_COLL_ALLGATHER, G, E, e);
        p.before[p.n_before++] = gather_coll(ZP_COLL_ALLGATHER, G, h, e);
        p.after[p.n_after++] = gather_coll(ZP_COLL_REDUCE_SCATTER, G, h, e);
    } else {
        p.before[p.n_before++] = gather_coll(ZP_COLL_ALLGATHER, G, h, e);
        p.after[p.n_after++] = gather_coll(ZP_COLL_REDUCE_SCATTER, G, h, e);
        p.after[p.n_after++] = gather_coll(ZP_COLL_REDUCE_SCATTER, G, E, e);
    }
    return p;
}

double zp_ep_alltoall_time_s(const ZpHw *hw, double send_bytes, int ranks, int on_node,
                             int node_ranks)
{
    if (ranks <= 1)
        return 0.0;
    const double intra_bytes = send_bytes * (on_node - 1) / ranks;
    const double inter_bytes = send_bytes * (ranks - on_node) / ranks;
    /* Every GPU of a node runs its own group's all-to-all at once, so the node's NICs carry
     * node_ranks ranks' inter-node chunks; NVLink carries each GPU's own. */
    const double intra_s =
        hw->intra_node_bytes_per_s > 0 ? intra_bytes / hw->intra_node_bytes_per_s : 0.0;
    const double inter_s = hw->inter_node_bytes_per_s > 0
                               ? inter_bytes * node_ranks / hw->inter_node_bytes_per_s
                               : 0.0;
    return fmax(intra_s, inter_s) + (on_node > 1 ? hw->intra_node_latency_s : 0.0) +
           (ranks > on_node ? hw->inter_node_latency_s : 0.0);
}

ZpEpAlltoall zp_ep_alltoall(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw)
{
    ZpEpAlltoall x = {0};
    const int ep = zp_plan_ep(plan);
    const int64_t sparse = zp_moe_sparse_layers(&model->moe, model->layers);
    if (sparse == 0 || ep == 1)
        return x;
    ZpEpActivations a = {0};
    route(model, plan, &a);
    const double e = zp_plan_elem_bytes(plan->precision), h = (double)model->hidden;
    /* What a rank sends in one dispatch (and receives in one combine): R, the padded
     * E x capacity with a capacity factor (below 1 it drops tokens and sends less than T k),
     * and dropless T k, times the skew for the busiest rank. */
    x.send_bytes = a.received_tokens * h * e;
    /* The EP group's ranks are spaced by the tensor degree (Megatron-Core's rank order
     * tp-cp-ep-dp-pp; DeepSpeed's expert groups over data-parallel ranks), so a node holds
     * gpus_per_node / t of them; whole experts (ETP 1) take consecutive ranks. A chunk of
     * send/EP goes to each peer, its own stays. */
    const int spacing = zp_plan_etp(plan) == 1 ? 1 : plan->mp;
    const int per_node = hw && hw->gpus_per_node > 0 ? hw->gpus_per_node : ep * plan->mp;
    const int on_node = MAX(1, MIN(ep, per_node / spacing));
    x.intra_bytes = x.send_bytes * (on_node - 1) / ep;
    x.inter_bytes = x.send_bytes * (ep - on_node) / ep;
    if (hw)
        x.time_s = zp_ep_alltoall_time_s(hw, x.send_bytes, ep, on_node, per_node);
    /* Forward dispatch and combine, their two in backward (the transposed all-to-alls), and a
     * recomputed forward's two under full activation checkpointing. */
    x.calls_per_layer = plan->checkpoint ? 6 : 4;
    const double per_step = (double)x.calls_per_layer * (double)sparse / zp_plan_pp(plan) *
                            (double)MAX(plan->grad_accum, 1);
    x.step_bytes = per_step * (x.intra_bytes + x.inter_bytes);
    x.step_time_s = per_step * x.time_s;
    return x;
}
