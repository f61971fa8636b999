/* zp_moe_search: enumerates a mixture of experts' plans and judges each in closed form: its
 * memory as zp_ep and zp_mem count it, its step as compute (the cost model's, over a dense model
 * of the same FLOPs) + tensor-parallel all-reduces + all-to-all, against the data-parallel
 * reductions of the dense and the expert gradients over their own groups. */
#include "zp_moe_search.h"
#include "zp_cost.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_mem.h"

#include <math.h>
#include <string.h>

/* The dense model whose blocks do a sparse model's work on average: attention as it is, an MLP
 * as wide as the dense layers' and the sparse layers' (top_k routed experts, stretched by the
 * skew, since the busiest rank sets the pace, plus the shared ones) averaged over the layers.
 * GEMM FLOPs and the MLP's elementwise bytes are linear in the width, so their sums agree. */
static ZpModel compute_equivalent(const ZpModel *model, double skew)
{
    ZpModel m = *model;
    const ZpMoe *moe = &model->moe;
    const double L = (double)model->layers;
    const double sparse = (double)zp_moe_sparse_layers(moe, model->layers);
    const double routed = (double)moe->top_k * (double)moe->expert_ffn * skew;
    const double width = ((L - sparse) * (double)model->ffn_hidden +
                          sparse * (routed + (double)moe->shared_ffn)) / L;
    memset(&m.moe, 0, sizeof m.moe);
    m.ffn_hidden = (int64_t)llround(width);
    return m;
}

/* The compute stream's time per step, as the search's screen takes it (zp_cost_op_s per op
 * kind); the optimizer's bytes scaled to the rank's partition of the sparse model. */
static double compute_s(const ZpSearchSpec *spec, const ZpPlan *plan, double skew)
{
    const ZpModel eq = compute_equivalent(spec->model, skew);
    ZpCost cost;
    if (!zp_cost_init(&cost, spec->hw, &eq, plan, NULL))
        return INFINITY;
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(&eq, plan, ops);
    const ZpStateBytes sb = zp_plan_state_bytes(plan->precision, plan->optimizer);
    const int stage = plan->zero.stage;
    const double eq_optim = zp_mem_model_states((double)zp_model_param_count(&eq), stage,
                                                plan->dp, plan->mp, sb).optim_bytes;
    const double optim = zp_ep_model_states(spec->model, plan, stage, sb).total.optim_bytes;
    double total = 0;
    for (int k = 0; k < ZP_COMP_N; k++) {
        const ZpComputeOps *o = &ops[k];
        if (o->count == 0 || k == ZP_COMP_CPU_OPTIMIZER)
            continue;
        const double bytes = k == ZP_COMP_OPTIMIZER && eq_optim > 0
                                 ? o->mem_bytes * optim / eq_optim : o->mem_bytes;
        total += (double)o->count * zp_cost_op_s(&cost, (ZpComputeKind)k, -1, o->flops,
                                                 o->gemm_flops, o->attn_flops, bytes);
    }
    return total;
}

static double bus_bytes_per_s(const ZpSearchSpec *spec, int ranks, int stride, ZpGroup group)
{
    return spec->bus_bytes_per_s ? spec->bus_bytes_per_s(spec->hw, ranks, stride, group)
                                 : zp_hw_intra_bus_bytes_per_s(spec->hw);
}

/* Megatron's two all-reduces of b s h a block, forward and backward (and recompute). */
static double tp_s(const ZpSearchSpec *spec, const ZpPlan *plan)
{
    if (plan->mp == 1)
        return 0;
    const ZpModel *m = spec->model;
    const double bytes = (double)plan->micro_batch * (double)m->seq_len * (double)m->hidden *
                         zp_plan_elem_bytes(plan->precision);
    const double each = spec->coll_s ? spec->coll_s(spec->hw, plan->dp, plan->mp, ZP_GROUP_TP,
                                                    ZP_COLL_ALLREDUCE, bytes)
                                     : 2.0 * (plan->mp - 1) / plan->mp * bytes /
                                           bus_bytes_per_s(spec, plan->dp, plan->mp,
                                                           ZP_GROUP_TP);
    return (plan->checkpoint ? 6.0 : 4.0) * (double)m->layers * plan->grad_accum * each;
}

/* One group's data-parallel traffic per step: `psi` elements a rank reduces (once a step at
 * stages 0-1, every micro-step at 2-3, twice over by an all-reduce) and, at stages 1-2, the
 * updated parameters all-gathered; stage 3 gathers the parameters forward and backward. */
static void group_s(const ZpSearchSpec *spec, const ZpPlan *plan, double psi, int ranks,
                    int stride, double *reduce_s, double *gather_s)
{
    *reduce_s = *gather_s = 0;
    if (ranks <= 1)
        return;
    const ZpStateBytes sb = zp_plan_state_bytes(plan->precision, plan->optimizer);
    const double sent = (ranks - 1.0) / ranks;
    const double bw = bus_bytes_per_s(spec, ranks, stride, ZP_GROUP_DP);
    const int stage = plan->zero.stage;
    const double passes =
        zp_impl_get(plan->impl)->grad_collective(plan) == ZP_COLL_ALLREDUCE ? 2.0 : 1.0;
    const double times = stage >= 2 ? plan->grad_accum : 1.0;
    *reduce_s = sent * passes * times * psi * zp_plan_reduce_bytes(plan) / bw;
    if (stage == 3)
        *gather_s = 2.0 * plan->grad_accum * sent * psi * sb.param_bytes / bw;
    else if (stage >= 1)
        *gather_s = sent * psi * sb.param_bytes / bw;
}

/* The step: the compute stream (with its tensor all-reduces and all-to-alls, which block it)
 * against the gradient reductions DeepSpeed overlaps with backward (overlap_comm), then the
 * stage-1/2 all-gather after the optimizer; stage 3's gathers run beside the compute. */
static void judge(const ZpSearchSpec *spec, double skew, ZpMoeCandidate *c)
{
    const ZpPlan *p = &c->plan;
    const ZpStateBytes sb = zp_plan_state_bytes(p->precision, p->optimizer);
    c->states_bytes = zp_ep_model_states(spec->model, p, p->zero.stage, sb).total.total_bytes;
    c->residual_bytes = zp_mem_residual(spec->model, p, spec->hw).total_bytes;
    c->memory_bytes = c->states_bytes + c->residual_bytes;
    c->fits = c->memory_bytes <= spec->hw->gpu_memory_bytes;
    c->compute_s = compute_s(spec, p, skew);
    c->tp_s = tp_s(spec, p);
    c->alltoall_s = zp_ep_alltoall(spec->model, p, spec->hw).step_time_s;
    const int ep = zp_plan_ep(p);
    const double experts = zp_ep_expert_params(spec->model) / ep / p->mp;
    const double dense = ((double)zp_model_param_count(spec->model) -
                          zp_ep_expert_params(spec->model)) / p->mp;
    double dense_reduce, dense_gather, expert_reduce, expert_gather;
    group_s(spec, p, dense, p->dp, p->mp, &dense_reduce, &dense_gather);
    group_s(spec, p, experts, p->dp / ep, p->mp * ep, &expert_reduce, &expert_gather);
    const double reduce = dense_reduce + expert_reduce, gather = dense_gather + expert_gather;
    c->dp_s = reduce + gather;
    const double chain = c->compute_s + c->tp_s + c->alltoall_s;
    c->step_s = p->zero.stage == 3 ? fmax(chain, reduce + gather)
                                   : fmax(chain, reduce) + gather;
    c->tokens_per_s = (double)p->dp * p->micro_batch * p->grad_accum *
                      (double)spec->model->seq_len / c->step_s;
}

static gint by_merit(gconstpointer a, gconstpointer b)
{
    const ZpMoeCandidate *x = a, *y = b;
    if (x->fits != y->fits)
        return x->fits ? -1 : 1;
    if (x->fits)
        return (x->tokens_per_s < y->tokens_per_s) - (x->tokens_per_s > y->tokens_per_s);
    return (x->memory_bytes > y->memory_bytes) - (x->memory_bytes < y->memory_bytes);
}

static gboolean check(const ZpSearchSpec *spec, GError **error)
{
    const ZpModel *m = spec->model;
    const char *bad = NULL;
    if (!zp_moe_enabled(&m->moe))
        bad = "--model: not a mixture of experts";
    else if (zp_mla_enabled(&m->mla))
        bad = "--model: latent attention is not timed yet (its attention is not the fused "
              "qkv's); `zplan memory --ep` reckons its memory and all-to-all";
    else if (spec->gpus < 1)
        bad = "--gpus: must be at least 1";
    if (bad)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
    return bad == NULL;
}

static void add_micro(const ZpSearchSpec *spec, ZpPlan *base, double skew, GArray *out)
{
    static const int micros[] = {1, 2, 4, 8, 16, 32};
    for (size_t i = 0; i < G_N_ELEMENTS(micros); i++) {
        const int micro = micros[i];
        if (spec->micro_batch > 0 && micro != spec->micro_batch)
            continue;
        const int64_t per_step = (int64_t)base->dp * micro;
        if (spec->global_batch > 0 && spec->global_batch % per_step != 0)
            continue;
        for (int ckpt = 0; ckpt <= 1; ckpt++) {
            ZpMoeCandidate c = {.plan = *base};
            c.plan.micro_batch = micro;
            c.plan.grad_accum = spec->global_batch > 0 ? (int)(spec->global_batch / per_step) : 1;
            c.plan.checkpoint = ckpt;
            judge(spec, skew, &c);
            g_array_append_val(out, c);
        }
    }
}

GArray *zp_moe_search_run(const ZpSearchSpec *spec, double skew, double capacity_factor,
                          GError **error)
{
    if (!check(spec, error))
        return NULL;
    const ZpModel *m = spec->model;
    GArray *out = g_array_new(FALSE, FALSE, sizeof(ZpMoeCandidate));
    const int node = MAX(spec->hw->gpus_per_node, 1);
    for (int mp = 1; mp <= node; mp *= 2) {
        if ((spec->mp > 0 && mp != spec->mp) || spec->gpus % mp || m->heads % mp ||
            zp_model_kv_heads(m) % mp || node % mp)
            continue;
        const int dp = spec->gpus / mp;
        for (int ep = 1; ep <= dp; ep++) {
            if (m->moe.experts % ep || dp % ep)
                continue;
            for (int stage = 0; stage <= 3; stage++) {
                if ((spec->stage >= 0 && stage != spec->stage) ||
                    !zp_impl_get(spec->impl)->has_stage(stage))
                    continue;
                ZpPlan base;
                zp_plan_defaults(&base, stage, dp, mp);
                base.precision = spec->precision;
                base.optimizer = spec->optimizer;
                base.attention = spec->attention;
                base.reduce_dtype = spec->reduce_dtype;
                base.impl = spec->impl;
                g_strlcpy(base.kernels, spec->kernels, sizeof base.kernels);
                base.gpus_per_node = node;
                base.experts = (ZpExpertConfig){ep, capacity_factor, skew};
                add_micro(spec, &base, skew, out);
            }
        }
    }
    if (out->len == 0) {
        g_array_unref(out);
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--global-batch: %" G_GINT64_FORMAT " is no multiple of the data-parallel "
                    "degree times a micro-batch for any plan on %d GPUs",
                    spec->global_batch, spec->gpus);
        return NULL;
    }
    g_array_sort(out, by_merit);
    return out;
}
