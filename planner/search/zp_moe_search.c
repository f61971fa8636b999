/* zp_moe_search: enumerates a mixture of experts' plans and judges each in closed form: its
 * memory as zp_ep and zp_mem count it, its step as compute (the cost model's over the schedule's
 * compute ops in closed form) + tensor-parallel all-reduces + the dispatcher's collectives,
 * against the data-parallel reductions of the dense and the expert gradients over their own
 * groups. */
#include "zp_moe_search.h"
#include "zp_cost.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_pipe.h"

#include <math.h>
#include <string.h>

/* The compute stream's time per step, as the search's screen takes it (zp_cost_op_s per op
 * kind): the schedule's compute ops in closed form (zp_sched_compute_ops), a block's by the
 * mean over the dense and sparse blocks with latent attention's own projections, the busiest
 * rank's experts (the skew is the plan's) and the optimizer on the rank's partitions. */
static double compute_s(const ZpSearchSpec *spec, const ZpPlan *piped)
{
    ZpPlan whole = *piped; /* the whole model's ops: stage_share takes a stage's part */
    whole.pipe = (ZpPipeConfig){0};
    const ZpPlan *plan = &whole;
    ZpCost cost;
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(spec->model, plan, ops);
    if (!zp_cost_init_whole_ops(&cost, spec->hw, spec->model, plan, ops, NULL, NULL))
        return INFINITY;
    double total = 0;
    for (int k = 0; k < ZP_COMP_N; k++) {
        const ZpComputeOps *o = &ops[k];
        if (o->count == 0 || k == ZP_COMP_CPU_OPTIMIZER)
            continue;
        total += (double)o->count * zp_cost_op_s(&cost, (ZpComputeKind)k, -1, o->flops,
                                                 o->gemm_flops, o->attn_flops, o->mem_bytes);
    }
    return total;
}

/* The busiest pipeline stage's part of the blocks: ceil(L / P) of L, as Megatron's uniform
 * split gives the first L mod P stages one block more (zp_pipe_partition), so a P that does
 * not divide the layers pays for its largest stage. */
static double stage_share(const ZpModel *m, const ZpPlan *p)
{
    const int64_t P = zp_plan_pp(p);
    return P == 1 ? 1.0 : (double)((m->layers + P - 1) / P) / (double)m->layers;
}

/* 1F1B's fill and drain: the stage's m micro-batches take m + P - 1 chunk steps (Narayanan et
 * al. 2021, sec. 2.2: the bubble's share (P - 1) / m of the ideal time). */
static double bubble(const ZpPlan *p)
{
    return 1.0 + (zp_plan_pp(p) - 1.0) / p->grad_accum;
}

/* The first pipeline stage's memory, as the dense screen takes it (zp_search_screen.c
 * pipeline_memory_bytes): its blocks' states with the embedding, the activations of the
 * min(P, m) micro-batches 1F1B keeps in flight there. Its blocks are taken all sparse (the
 * heaviest stage's; DeepSeek-V3's first three dense blocks sit on stage 0 but the screen
 * bounds the worst), the states of its dense part over DP and its experts over DP/EP. */
static double stage_memory_bytes(const ZpSearchSpec *spec, const ZpPlan *piped,
                                 double *states_bytes, double *residual_bytes)
{
    const ZpModel *m = spec->model;
    const int64_t P = zp_plan_pp(piped);
    ZpModel stage = *m;
    stage.layers = (m->layers + P - 1) / P;
    if (stage.moe.step <= 1) {
        stage.moe.first_dense = 0;
        stage.moe.n_dense_listed = 0;
    }
    ZpPlan plan = *piped;
    plan.pipe = (ZpPipeConfig){0};
    const int ep = zp_plan_ep(&plan);
    double dense = (double)zp_model_unit_elems(&stage, 0), experts = 0;
    for (int u = 1; u <= stage.layers; u++) {
        const double x = (double)zp_model_unit_expert_elems(&stage, u);
        experts += x;
        dense += (double)zp_model_unit_elems(&stage, u) - x;
    }
    const ZpStateBytes sb = zp_impl_state_bytes(&plan);
    const int s = plan.zero.stage;
    *states_bytes = zp_mem_model_states(dense, s, plan.dp, plan.mp, sb).total_bytes +
                    zp_mem_model_states(experts / ep, s, zp_plan_edp(&plan), zp_plan_etp(&plan), sb)
                        .total_bytes;
    const ZpResidual r = zp_mem_residual(&stage, &plan, spec->hw);
    const double in_flight = MIN(P, piped->grad_accum);
    *residual_bytes = r.total_bytes + (in_flight - 1) * (r.activations_bytes + r.checkpoint_bytes);
    return *states_bytes + *residual_bytes;
}

static double bus_bytes_per_s(const ZpSearchSpec *spec, int ranks, int stride, ZpGroup group)
{
    return spec->bus_bytes_per_s ? spec->bus_bytes_per_s(spec->hw, ranks, stride, group)
                                 : zp_hw_intra_bus_bytes_per_s(spec->hw);
}

/* One collective of `bytes` (its whole buffer) over the plan's tensor group: the simulator's
 * cost (spec->coll_s), else (n - 1) / n of it at the group's busbw, twice for an all-reduce. */
static double tp_coll_s(const ZpSearchSpec *spec, const ZpPlan *plan, ZpCollKind kind,
                        double bytes)
{
    return spec->coll_s ? spec->coll_s(spec->hw, plan->dp, plan->mp, ZP_GROUP_TP, kind, bytes)
                        : (kind == ZP_COLL_ALLREDUCE ? 2.0 : 1.0) * (plan->mp - 1) / plan->mp *
                              bytes / bus_bytes_per_s(spec, plan->dp, plan->mp, ZP_GROUP_TP);
}

/* DeepSpeed's all-gathers over TP of the slots its tensor ranks dropped (zp_ep_tp_drop), per
 * step of the whole model: a sparse layer's forward one (again in a recomputed forward) and
 * its backward's, as the schedule's (zp_build_moe.c tp_regather); 0 elsewhere. */
static double regather_s(const ZpSearchSpec *spec, const ZpPlan *p)
{
    const ZpModel *m = spec->model;
    const double bytes = zp_ep_activations(m, p).regathered_bytes;
    if (bytes <= 0)
        return 0;
    return (p->checkpoint ? 3.0 : 2.0) * tp_coll_s(spec, p, ZP_COLL_ALLGATHER, bytes) *
           (double)zp_moe_sparse_layers(&m->moe, m->layers) * (double)MAX(p->grad_accum, 1);
}

/* One sum of `bytes` over the tensor group as the schedule runs it (zp_build_tp_sum_shape):
 * an all-reduce, or under sequence parallelism a reduce-scatter and an all-gather. */
static double tp_sum_s(const ZpSearchSpec *spec, const ZpPlan *plan, double bytes)
{
    return plan->sequence_parallel ? tp_coll_s(spec, plan, ZP_COLL_REDUCE_SCATTER, bytes) +
                                         tp_coll_s(spec, plan, ZP_COLL_ALLGATHER, bytes)
                                   : tp_coll_s(spec, plan, ZP_COLL_ALLREDUCE, bytes);
}

/* The vocabulary's collectives a micro-step (zp_build_step.c): VocabParallelEmbedding's sum
 * forward on the first stage, and on the last the head's loss (zp_build_vocab_parallel_head:
 * two fp32 a token from each rank, all-gathered) and its input gradient's sum backward. With
 * a pipeline they are on two stages: the dearer stands for the stage the screen times. */
static double vocab_s(const ZpSearchSpec *spec, const ZpPlan *plan, double sum_s)
{
    const double tokens = (double)plan->micro_batch * (double)spec->model->seq_len;
    const double head = tp_coll_s(spec, plan, ZP_COLL_ALLGATHER, 8.0 * tokens * plan->mp) + sum_s;
    return zp_plan_pp(plan) > 1 ? fmax(sum_s, head) : sum_s + head;
}

/* The tensor group's collectives, as the schedule runs them: a block's two sums of b s h
 * (tp_sum_s), forward and backward (and recompute); a sparse block's one, the attention's,
 * where its experts return their outputs whole or summed themselves (zp_ep_sparse_mlp_sums),
 * with the expert tensor group's all-gather and sum back (zp_ep_tp_gather_back) of the t R
 * received tokens where it gathers (zp_ep_tp_gather: Megatron's split experts under sequence
 * parallelism, DeepSpeed's split ones); the embedding's and the head's (vocab_s); and
 * DeepSpeed's all-gathers of its dropped slots (regather_s). Two sums a block in all, before,
 * were 35% short of the simulated tensor stream for Megatron's split experts and 70% over for
 * whole ones (Mixtral, 64 H100s, s 2048); the sums under sequence parallelism timed as one
 * all-reduce and the vocabulary's left out, 6-15% short. */
static double tp_s(const ZpSearchSpec *spec, const ZpPlan *plan)
{
    if (plan->mp == 1)
        return 0;
    const ZpModel *m = spec->model;
    const double bytes = (double)plan->micro_batch * (double)m->seq_len * (double)m->hidden *
                         zp_plan_elem_bytes(plan->precision);
    const double each = tp_sum_s(spec, plan, bytes);
    const double sparse = (double)zp_moe_sparse_layers(&m->moe, m->layers);
    const double sums = 2.0 * (double)m->layers - (zp_ep_sparse_mlp_sums(m, plan) ? 0 : sparse);
    double gather = 0; /* the expert tensor group's pair, a sparse block's pass */
    if (zp_ep_tp_gather(plan) > 1) {
        const double moved = zp_ep_activations(m, plan).expert_tokens * (double)m->hidden *
                             zp_plan_elem_bytes(plan->precision);
        gather = tp_coll_s(spec, plan, ZP_COLL_ALLGATHER, moved) +
                 tp_coll_s(spec, plan, zp_ep_tp_gather_back(plan), moved);
    }
    return ((plan->checkpoint ? 3.0 : 2.0) * (sums * each + sparse * gather) *
                stage_share(m, plan) +
            vocab_s(spec, plan, each)) *
               plan->grad_accum +
           regather_s(spec, plan) * stage_share(m, plan);
}

/* One gather or reduce-scatter of `bytes` (its whole buffer) over `n` ranks `stride` apart:
 * the simulator's cost (spec->coll_s: NCCL's algorithms, protocols and latencies), else (n - 1)
 * / n of it at the group's busbw. */
static double ring_s(const ZpSearchSpec *spec, ZpCollKind kind, double bytes, int n, int stride)
{
    return spec->coll_s ? spec->coll_s(spec->hw, n, stride, ZP_GROUP_DP, kind, bytes)
                        : (n - 1.0) / n * bytes / bus_bytes_per_s(spec, n, stride, ZP_GROUP_DP);
}

/* The collectives of a pass's list (zp_ep_gather_pass) over n ranks `stride` apart. */
static double pass_s(const ZpSearchSpec *spec, const ZpEpGatherColl *c, int k, int n,
                     int stride)
{
    double t = 0;
    for (int i = 0; i < k; i++)
        t += ring_s(spec, c[i].kind, c[i].bytes, n, stride);
    return t;
}

/* The dispatcher's collectives per step of the whole model: the all-to-alls (zp_ep_alltoall),
 * or Megatron's allgather dispatcher's a sparse layer (zp_ep_gather_pass, the schedule's own
 * list), forward and backward and a recomputed forward's (full checkpointing) again, over the
 * group placed as zp_sched_groups lays it out and the plan's order places it (the expert
 * tensor ranks of EP consecutive ranks, one run placed, pipeline or not: zp_sched_placed_group;
 * the EP group at TP 1). */
static double dispatch_s(const ZpSearchSpec *spec, const ZpPlan *p)
{
    const ZpModel *m = spec->model;
    if (p->experts.dispatcher != ZP_DISPATCH_ALLGATHER)
        return zp_ep_alltoall(m, p, spec->hw).step_time_s * zp_plan_pp(p);
    const int n = zp_plan_etp(p) * zp_plan_ep(p);
    const int stride = p->mp == 1 ? (int)zp_plan_placed_dp_stride(p) : 1;
    double pass[2];
    for (int backward = 0; backward <= 1; backward++) {
        const ZpEpGatherPass g = zp_ep_gather_pass(m, p, backward);
        pass[backward] = pass_s(spec, g.before, g.n_before, n, stride) +
                         pass_s(spec, g.after, g.n_after, n, stride);
    }
    const double layer = (p->checkpoint ? 2.0 : 1.0) * pass[0] + pass[1];
    return layer * (double)zp_moe_sparse_layers(&m->moe, m->layers) *
           (double)MAX(p->grad_accum, 1);
}

/* One group's data-parallel traffic per step: `psi` elements a rank reduces (once a step at
 * stages 0-1, every micro-step at 2-3, twice over by an all-reduce) and, at stages 1-2, the
 * updated parameters all-gathered; stage 3 gathers the parameters forward and backward. */
static void group_s(const ZpSearchSpec *spec, const ZpPlan *plan, double psi, int ranks,
                    int stride, ZpCollKind reduce, double *reduce_s, double *gather_s)
{
    *reduce_s = *gather_s = 0;
    if (ranks <= 1)
        return;
    const ZpStateBytes sb = zp_plan_state_bytes(plan->precision, plan->optimizer);
    const double sent = (ranks - 1.0) / ranks;
    const double bw = bus_bytes_per_s(spec, ranks, stride, ZP_GROUP_DP);
    const int stage = plan->zero.stage;
    const double passes = reduce == ZP_COLL_ALLREDUCE ? 2.0 : 1.0;
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
static void judge(const ZpSearchSpec *spec, ZpMoeCandidate *c)
{
    const ZpPlan *p = &c->plan;
    const ZpStateBytes sb = zp_plan_state_bytes(p->precision, p->optimizer);
    const double share = stage_share(spec->model, p), stretch = bubble(p);
    const int P = zp_plan_pp(p);
    if (P > 1) {
        c->memory_bytes = stage_memory_bytes(spec, p, &c->states_bytes, &c->residual_bytes);
    } else {
        c->states_bytes =
            zp_ep_model_states(spec->model, p, p->zero.stage, sb).total.total_bytes;
        c->residual_bytes = zp_mem_residual(spec->model, p, spec->hw).total_bytes;
        c->memory_bytes = c->states_bytes + c->residual_bytes;
    }
    c->fits = c->memory_bytes <= spec->hw->gpu_memory_bytes;
    /* A stage's compute, TP all-reduces and all-to-alls, stretched by the bubble
     * (zp_ep_alltoall's step counts an average stage's sparse layers: its P x share). */
    c->compute_s = compute_s(spec, p) * share * stretch;
    c->tp_s = tp_s(spec, p) * stretch;
    c->alltoall_s = dispatch_s(spec, p) * share * stretch;
    const int ep = zp_plan_ep(p);
    const double experts = zp_ep_expert_params(spec->model) / ep / zp_plan_etp(p) * share;
    const double dense = ((double)zp_model_param_count(spec->model) -
                          zp_ep_expert_params(spec->model)) / p->mp * share;
    double dense_reduce, dense_gather, expert_reduce, expert_gather;
    /* the DP groups where the plan's order puts them (ZpRankOrder) */
    const int dp_apart = (int)zp_plan_placed_dp_stride(p);
    group_s(spec, p, dense, p->dp, dp_apart, zp_impl_get(p->impl)->grad_collective(p),
            &dense_reduce, &dense_gather);
    /* the expert-data-parallel group where zp_sched_groups lays it and the plan's order
     * places it: EP dp ranks apart, or with whole experts EP ranks apart in the stage's TP x
     * DP grid (placed so under tp-dp-pp, with a pipeline too; under tp-pp-dp a pipeline has EP
     * = TP, zp_plan_etp_check, and the group is dp) */
    const gboolean tp_pp_dp = p->rank_order != ZP_ORDER_TP_DP_PP;
    const int edp_apart = zp_plan_etp(p) == 1 && p->mp > 1 ? (P > 1 && tp_pp_dp ? dp_apart : ep)
                                                             : dp_apart * ep;
    group_s(spec, p, experts, zp_plan_edp(p), edp_apart, zp_impl_expert_grad_collective(p),
            &expert_reduce, &expert_gather);
    const double reduce = dense_reduce + expert_reduce, gather = dense_gather + expert_gather;
    c->dp_s = reduce + gather;
    const double chain = c->compute_s + c->tp_s + c->alltoall_s;
    /* A pipeline reduces after its flush (zp_sched: no reduction inside the micro-steps);
     * without overlap_comm the reductions block the compute stream (stage_1_and_2.py
     * average_tensor on the current stream), the experts' as the dense buckets'. */
    c->step_s = P > 1 || !p->zero.overlap_comm ? chain + reduce + gather
                : p->zero.stage == 3           ? fmax(chain, reduce + gather)
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
    else if (spec->gpus < 1)
        bad = "--gpus: must be at least 1";
    if (bad)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
    return bad == NULL;
}

static void add_micro(const ZpSearchSpec *spec, ZpPlan *base, GArray *out)
{
    static const int micros[] = {1, 2, 4, 8, 16, 32};
    for (size_t i = 0; i < G_N_ELEMENTS(micros); i++) {
        const int micro = micros[i];
        if (spec->micro_batch > 0 && micro != spec->micro_batch)
            continue;
        const int64_t per_step = (int64_t)base->dp * micro;
        if (spec->global_batch > 0 && spec->global_batch % per_step != 0)
            continue;
        const int P = zp_plan_pp(base);
        if (P > 1 && spec->global_batch / per_step < P)
            continue; /* a pipeline needs micro-batches to fill it (Megatron's check) */
        /* None, full checkpointing (unless --exclude checkpoint), and where the
         * implementation has it (Megatron's) the selective recomputation of core attention. */
        for (int ckpt = 0; ckpt <= 2; ckpt++) {
            if ((ckpt == 2 && !zp_impl_get(base->impl)->selective_recompute) ||
                (ckpt == 1 && (spec->exclude & ZP_TECH_CHECKPOINT)))
                continue;
            ZpMoeCandidate c = {.plan = *base};
            c.plan.micro_batch = micro;
            c.plan.grad_accum = spec->global_batch > 0 ? (int)(spec->global_batch / per_step) : 1;
            c.plan.checkpoint = ckpt == 1;
            c.plan.selective_recompute = ckpt == 2;
            judge(spec, &c);
            g_array_append_val(out, c);
        }
    }
}

/* Every EP degree and stage at one TP degree and pipeline: the experts split over TP (EP
 * dividing dp), and under Megatron and DeepSpeed over TP > 1 whole on each rank too (ETP 1:
 * EP dividing TP x DP, and with a pipeline a multiple or a divisor of TP: zp_plan_etp_check). */
static void add_degrees(const ZpSearchSpec *spec, int mp, ZpPipeConfig pipe, double skew,
                        double capacity_factor, GArray *out)
{
    const ZpModel *m = spec->model;
    const int node = MAX(spec->hw->gpus_per_node, 1);
    const int dp = spec->gpus / (mp * MAX(pipe.stages, 1));
    /* Megatron and DeepSpeed split experts over TP or keep them whole (ETP 1); the split is
     * Megatron's default and DeepSpeed's enable_expert_tensor_parallelism (zp_plan_etp) */
    const gboolean deepspeed = spec->impl == ZP_IMPL_DEEPSPEED;
    const int wholes = (spec->impl == ZP_IMPL_MEGATRON || deepspeed) && mp > 1 ? 2 : 1;
    for (int whole = 0; whole < wholes; whole++) {
        /* the ranks EP is taken from */
        const int grid = whole ? mp * dp : dp;
        const int etp = whole ? 1 : deepspeed ? mp : 0;
        for (int ep = 1; ep <= grid; ep++) {
            if (m->moe.experts % ep || grid % ep)
                continue;
            for (int stage = 0; stage <= 3; stage++) {
                if ((spec->stage >= 0 && stage != spec->stage) ||
                    !zp_impl_get(spec->impl)->has_stage(stage))
                    continue;
                ZpPlan base;
                zp_search_plan_base(spec, stage, dp, mp, &base);
                base.gpus_per_node = node;
                base.pipe = pipe;
                /* Megatron-Core trains a mixture of experts over TP > 1 only with sequence
                 * parallelism (moe_layer.py MoELayer.forward raises without it). */
                base.sequence_parallel = mp > 1 && spec->impl == ZP_IMPL_MEGATRON;
                base.experts = (ZpExpertConfig){ep, capacity_factor, skew, ZP_DISPATCH_ALLTOALL,
                                                etp};
                /* what the schedule refuses runs nowhere: ZeRO-2 and -3 with a pipeline
                 * (zp_pipe_check), DeepSpeed's BF16_Optimizer (zp_impl_ds_bf16_optimizer) */
                if (!zp_plan_etp_check(&base, TRUE, "", NULL) || !zp_pipe_check(m, &base, NULL) ||
                    zp_impl_ds_bf16_optimizer(&base))
                    continue;
                add_micro(spec, &base, out);
                /* Megatron's other dispatcher, its default, where it communicates (ETP x EP
                 * > 1) and zplan lays its group out (zp_plan_dispatcher_check) */
                base.experts.dispatcher = ZP_DISPATCH_ALLGATHER;
                if (zp_plan_etp(&base) * ep > 1 && zp_plan_dispatcher_check(&base, "", NULL))
                    add_micro(spec, &base, out);
            }
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
        /* Pipelines (1F1B, the uniform split) where a global batch gives micro-batches to
         * fill them: every P up to the layer count that leaves whole data-parallel ranks. */
        for (int P = 1; P <= m->layers && (P == 1 || spec->global_batch > 0); P++) {
            if (spec->gpus % ((int64_t)mp * P) != 0)
                continue;
            const ZpPipeConfig pipe = {P > 1 ? P : 0, P > 1 ? 1 : 0, ZP_PIPE_1F1B,
                                       ZP_PARTITION_UNIFORM};
            add_degrees(spec, mp, pipe, skew, capacity_factor, out);
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

/* Simulated candidates first, fitting ones by their tokens/s; the others keep their order. */
static gint by_simulation(gconstpointer a, gconstpointer b)
{
    const ZpMoeCandidate *x = a, *y = b;
    if (x->simulated != y->simulated)
        return x->simulated ? -1 : 1;
    if (!x->simulated)
        return 0;
    return by_merit(a, b);
}

/* x timed by the simulator: its step, memory and fit become its schedule's. */
static void simulate_one(const ZpSearchSpec *spec, ZpMoeCandidate *x)
{
    double step_s = 0, need = 0;
    GError *error = NULL;
    x->simulated = TRUE;
    x->closed_step_s = x->step_s, x->closed_memory_bytes = x->memory_bytes;
    if (!spec->rank(&x->plan, spec->rank_ctx, 0, &step_s, &need, &error)) {
        g_clear_error(&error); /* a plan the simulator refuses runs nowhere */
        x->fits = FALSE;
        return;
    }
    x->step_s = step_s;
    x->memory_bytes = need + spec->hw->runtime_reserve_bytes; /* as simulate's need */
    x->fits = need <= spec->hw->gpu_memory_bytes;
    x->tokens_per_s = (double)x->plan.dp * x->plan.micro_batch * x->plan.grad_accum *
                      (double)spec->model->seq_len / step_s;
}

guint zp_moe_search_simulate_stages(const ZpSearchSpec *spec, GArray *c, guint tries)
{
    if (!spec->rank)
        return 0;
    guint timed = 0, tried[4] = {0};
    gboolean found[4] = {FALSE};
    for (guint i = 0; i < c->len; i++) { /* the simulated first, then the closed form's order */
        ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        const int stage = x->plan.zero.stage;
        if (!x->fits || stage < 0 || stage > 3 || found[stage])
            continue;
        if (!x->simulated) {
            if (tried[stage]++ >= tries)
                continue;
            simulate_one(spec, x);
            timed++;
        }
        found[stage] = x->fits;
    }
    g_array_sort(c, by_simulation);
    return timed;
}

guint zp_moe_search_simulate(const ZpSearchSpec *spec, GArray *c, guint top)
{
    if (!spec->rank)
        return 0;
    guint timed = 0, fitting = 0;
    GHashTable *per_ep = g_hash_table_new(NULL, NULL); /* EP degree: its fitting plans so far */
    GHashTable *per_pp = g_hash_table_new(NULL, NULL); /* PP degree: likewise */
    for (guint i = 0; i < c->len; i++) {
        ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        if (!x->fits)
            continue;
        const gpointer ep = GINT_TO_POINTER(zp_plan_ep(&x->plan));
        const guint of_ep = GPOINTER_TO_UINT(g_hash_table_lookup(per_ep, ep));
        g_hash_table_insert(per_ep, ep, GUINT_TO_POINTER(of_ep + 1));
        const gpointer pp = GINT_TO_POINTER(zp_plan_pp(&x->plan));
        const guint of_pp = GPOINTER_TO_UINT(g_hash_table_lookup(per_pp, pp));
        g_hash_table_insert(per_pp, pp, GUINT_TO_POINTER(of_pp + 1));
        if (fitting++ >= top && of_ep >= ZP_MOE_SIMULATED_PER_EP &&
            of_pp >= ZP_MOE_SIMULATED_PER_EP)
            continue;
        simulate_one(spec, x);
        timed++;
    }
    g_hash_table_destroy(per_ep);
    g_hash_table_destroy(per_pp);
    g_array_sort(c, by_simulation);
    return timed;
}
