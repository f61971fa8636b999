/* zp_search_screen: the search's closed-form screen (zp_search_screen.h): each plan's memory by
 * the rules, and a lower bound of its simulated step from its exact compute and collectives. */
#include "zp_search_screen.h"
#include "zp_cost.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_sched.h"
#include "zp_util.h"
#include "zp_zeropp.h"

#include <math.h>
#include <string.h>

/* The group's busbw where the plan's order puts it (ZpRankOrder: a DP group's ranks mp apart
 * under tp-dp-pp, mp P under tp-pp-dp), as the simulator places it (zp_sched_placed_stride). */
static double bus_bytes_per_s(const ZpScreen *sc, const ZpPlan *plan, ZpGroup group)
{
    const int stride = group == ZP_GROUP_DP ? (int)zp_plan_placed_dp_stride(plan) : plan->mp;
    return sc->bus_bytes_per_s ? sc->bus_bytes_per_s(sc->hw, plan->dp, stride, group)
                               : zp_hw_intra_bus_bytes_per_s(sc->hw);
}

/* The compute stream's busy time by kind: each op as the simulator times it (zp_cost_op_s;
 * the CPU optimizer zp_offload_cpu_time_s); returns the total. A plan the cost model cannot
 * time (no peak for its precision) is never a bound's winner. */
static double compute_s_of(const ZpScreen *sc, const ZpPlan *plan, double by_kind[ZP_COMP_N])
{
    ZpComputeOps ops[ZP_COMP_N];
    ZpCost cost;
    for (int k = 0; k < ZP_COMP_N; k++)
        by_kind[k] = 0;
    zp_sched_compute_ops(sc->model, plan, ops);
    if (!zp_cost_init_whole_ops(&cost, sc->hw, sc->model, plan, ops, sc->cost_memo, NULL))
        return INFINITY;
    double total = 0;
    for (int k = 0; k < ZP_COMP_N; k++) {
        const ZpComputeOps *o = &ops[k];
        if (k == ZP_COMP_CPU_OPTIMIZER) { /* after backward, overlapping nothing */
            if (o->count && zp_offload_cpu_time_s(sc->hw, o->mem_bytes,
                                                MIN(sc->hw->gpus_per_node, plan->dp * plan->mp),
                                                &by_kind[k], NULL))
                total += by_kind[k];
            continue;
        }
        by_kind[k] = (double)o->count *
                     (zp_cost_op_s(&cost, (ZpComputeKind)k, -1, o->flops, o->gemm_flops,
                                   o->attn_flops, o->mem_bytes) +
                      o->host_bytes / sc->hw->host_link_bytes_per_s);
        total += by_kind[k];
    }
    return total;
}

/* One of Megatron's tensor-parallel all-reduces of b*s*h (plans with mp > 1; else 0), at
 * least what the simulator gives one alone (spec->coll_s: its latency and its transfer at full
 * busbw; contention only stretches the transfer), else its 2(M-1)/M bytes at busbw. It reads
 * the plan's micro_batch, precision, sequence_parallel, mp, dp and pipeline degree, all in
 * compute_key. */
static double tp_allreduce_s(const ZpScreen *sc, const ZpPlan *plan)
{
    if (plan->mp <= 1)
        return 0;
    const ZpModel *m = sc->model;
    const double mp = plan->mp;
    const double bytes =
        (double)plan->micro_batch * m->seq_len * m->hidden * zp_plan_elem_bytes(plan->precision);
    return sc->coll_s && !plan->sequence_parallel
               ? sc->coll_s(sc->hw, plan->dp, plan->mp, ZP_GROUP_TP, ZP_COLL_ALLREDUCE, bytes)
               : 2.0 * (mp - 1) / mp * bytes / bus_bytes_per_s(sc, plan, ZP_GROUP_TP);
}

/* A plan's compute seconds and tensor-parallel all-reduce, kept under its compute key. */
typedef struct {
    ZpPlan key;
    double total_s;
    double by_kind[ZP_COMP_N];
    double tp_allreduce_s;
} ComputeMemo;

/* The plan with the fields no compute cost reads set to zero: those that tell the search's
 * plans of one shape apart, the four bucket sizes (bucket_choices, zp_dsconfig_hf_auto),
 * overlap_comm, ZeRO++'s qwZ, hpZ and qgZ, and ZeRO-R's MD (Pa and cpu_checkpointing stay:
 * zp_zeror_checkpoint's copy_bytes, the host copies' bytes, reads both). The functions that
 * read those fields (field names grepped over planner/, also as z->, c->, and no header's
 * inline reads one): the bucket layout, residual and fetch rules (zp_impl*.c ds_group,
 * ds_residual, ds_plan_fetches, ds_persistent, persistent_elems, ds_gather_bound,
 * ds_bucket_buffers, ds_grads_by_module, ds_epilogue_syncs_device, ds_experts_in_buckets,
 * zp_impl_prefetch_window, zp_impl_persistent_units, zp_sched_unit_persistent,
 * paper_plan_buckets, zp_impl_paper_residual, zp_impl_unit_gather_bound,
 * zp_impl_megatron_layout, mg_plan_defaults, zp_impl_fsdp2_root_joined), the memory and
 * ZeRO-R/ZeRO++ rules (zp_zeror_constant_buffers, zp_zeror_check,
 * zp_zeror_contiguous_region_bytes, zp_zeropp.c's, zp_mem.c add_hpz_term), the builder's
 * (launch_bucket, zp_build_optimizer_step, zp_build_moe_backward,
 * zp_build_moe_reduce_after_backward, issue_call, keeps_secondary, secondary_bytes,
 * zp_sched_fetch_group, zp_sched_fetch_allreduce, zp_sched_groups, check_plan, check_experts,
 * zp_schedcheck.c's, zp_schedsize_estimate_ops), and zp_plan.c's and zp_dsconfig.c's JSON and
 * flag readers. None is among the 214 functions compute_s_of reaches: GCC's
 * -fcallgraph-info over planner/, its indirect calls' targets added (every ZpInventory
 * function, which reads a ZpInvDims and no plan; ZpImpl grad_bytes, mg_grad_bytes and
 * fsdp2_grad_bytes; zp_cost.c table_kernel_s). A field left in that no cost reads only costs
 * a hit; the key is the plan's bytes, padding included, so equal keys are the same plan in
 * every field read. */
static void compute_key(const ZpPlan *plan, ZpPlan *key)
{
    memcpy(key, plan, sizeof *key);
    key->zero.reduce_bucket_size = 0;
    key->zero.allgather_bucket_size = 0;
    key->zero.stage3_prefetch_bucket_size = 0;
    key->zero.stage3_param_persistence_threshold = 0;
    key->zero.overlap_comm = FALSE;
    key->zero.zero_quantized_weights = FALSE;
    key->zero.zero_hpz_partition_size = 0;
    key->zero.zero_quantized_gradients = FALSE;
    key->ckpt.contiguous_memory_optimization = FALSE;
}

/* FNV-1a over the key's 64-bit words (a ZpPlan holds doubles: its size is a multiple). */
static guint compute_key_hash(gconstpointer p)
{
    G_STATIC_ASSERT(sizeof(ZpPlan) % sizeof(guint64) == 0);
    return zp_hash_words64(p, sizeof(ZpPlan));
}

static gboolean compute_key_equal(gconstpointer a, gconstpointer b)
{
    return memcmp(a, b, sizeof(ZpPlan)) == 0;
}

/* compute_s_of, kept in sc->compute_memo where there is one: the search screens each shape
 * with its bucket choices, overlap_comm, ZeRO++ and ZeRO-R options, and zp_cost_init's
 * inventory made compute_s_of 439 M instructions of plan --3d gpt-1t/4096's 5.29 G. The very
 * doubles again: compute_s_of reads only the key's fields, sc's model and hw. */
static double compute_s(const ZpScreen *sc, const ZpPlan *plan, double by_kind[ZP_COMP_N],
                        double *tp_s)
{
    if (!sc->compute_memo) {
        *tp_s = tp_allreduce_s(sc, plan);
        return compute_s_of(sc, plan, by_kind);
    }
    ZpPlan key;
    compute_key(plan, &key);
    const ComputeMemo *m = g_hash_table_lookup(sc->compute_memo, &key);
    if (!m) {
        ComputeMemo *fresh = g_new(ComputeMemo, 1);
        fresh->key = key;
        fresh->total_s = compute_s_of(sc, plan, fresh->by_kind);
        fresh->tp_allreduce_s = tp_allreduce_s(sc, plan);
        g_hash_table_add(sc->compute_memo, fresh);
        m = fresh;
    }
    memcpy(by_kind, m->by_kind, sizeof m->by_kind);
    *tp_s = m->tp_allreduce_s;
    return m->total_s;
}

/* One micro-batch's send between stages over the slowest boundary, as the simulator times
 * it: b s h elements (over t with sequence parallelism), NVLink when all stages share a node,
 * else the sender's share of the node's NICs. */
static double p2p_s(const ZpScreen *sc, const ZpPlan *plan)
{
    const ZpModel *m = sc->model;
    const ZpHw *hw = sc->hw;
    const double bytes = (double)plan->micro_batch * (double)m->seq_len * (double)m->hidden *
                         zp_plan_elem_bytes(plan->precision) /
                         (plan->sequence_parallel ? plan->mp : 1);
    if (zp_plan_placed_pp_stride(plan) * zp_plan_pp(plan) <= hw->gpus_per_node)
        return hw->intra_node_latency_s + bytes / zp_hw_intra_bus_bytes_per_s(hw);
    return hw->inter_node_latency_s +
           bytes / (zp_hw_inter_bus_bytes_per_s(hw) / hw->gpus_per_node);
}

/* The sends a pipeline's fill and drain wait for: the first micro-batch's activations pass
 * every stage boundary before the last stage computes anything, and the last micro-batch's
 * gradients pass them all back after the last stage's final backward, each send the
 * receiver's dependency (zp_build_send; its next compute waits for it). Each boundary timed
 * as the simulator times it (sim_ops.c p2p_time_s: NVLink when both stages' first ranks share
 * a node, else the sender's share of the node's NICs), over the bytes zp_build_send sends
 * (1/t with sequence parallelism or Megatron's scatter-gather, whose receiving all-gather is
 * left out). */
static double fill_drain_sends_s(const ZpScreen *sc, const ZpPlan *plan)
{
    const ZpModel *m = sc->model;
    const ZpHw *hw = sc->hw;
    const int64_t P = zp_plan_pp(plan), mp = plan->mp, gpn = hw->gpus_per_node;
    const int64_t apart = zp_plan_placed_pp_stride(plan); /* a stage's ranks from the next's */
    if (gpn <= 0)
        return 0;
    const gboolean split = plan->sequence_parallel ||
                           (zp_impl_get(plan->impl)->p2p_scatter_gather && mp > 1);
    const double bytes = (double)plan->micro_batch * (double)m->seq_len * (double)m->hidden *
                         zp_plan_elem_bytes(plan->precision) / (split ? (double)mp : 1.0);
    double sends_s = 0;
    for (int64_t k = 0; k + 1 < P; k++)
        sends_s += k * apart / gpn == (k + 1) * apart / gpn
                       ? hw->intra_node_latency_s + bytes / zp_hw_intra_bus_bytes_per_s(hw)
                       : hw->inter_node_latency_s +
                             bytes / (zp_hw_inter_bus_bytes_per_s(hw) / (double)gpn);
    return 2.0 * sends_s;
}

/* A pipeline's forward-backward chain, a lower bound: the last stage does at least its
 * fewest blocks (uniform split) of every micro-batch and the head, and cannot start before
 * the first micro-batch's chunks reach it nor finish before the last drains back: P - 1
 * chunk steps of the average stage's work (the bubble). Sends: in 1F1B's steady state the
 * last stage's F(j+1) waits for stage P-2 to receive B(j-1)'s gradient (a send), run B(j-1)
 * and F(j+1) and send back (another), while the last stage itself runs F(j) and B(j), longer
 * than stage P-2's by the head: it idles 2c - head every two micro-batches when that is
 * positive, counted here past the warm-up, in 1F1B only: interleaving runs other chunks
 * there (gpt-1t's TP 32 interleaved plans simulate up to 0.4% below a bound with it). The
 * fill's and the drain's sends add (fill_drain_sends_s).
 * test_pipe checks the bound against simulated steps. */
static double pipeline_chain_s(const ZpScreen *sc, const ZpPlan *plan, double tp_s,
                               double all_s, const double kind[ZP_COMP_N])
{
    const double total = all_s - kind[ZP_COMP_OPTIMIZER];
    const double P = zp_plan_pp(plan), V = zp_plan_vstages(plan), L = (double)sc->model->layers;
    const double blocks = kind[ZP_COMP_BLOCK_FWD] + kind[ZP_COMP_BLOCK_BWD] +
                          kind[ZP_COMP_RECOMPUTE] + tp_s;
    const double last = blocks * floor(L / (P * V)) * V / L + kind[ZP_COMP_HEAD];
    /* The fill and drain run through the other stages: their average, without the head. */
    const double step = (total - kind[ZP_COMP_HEAD] + tp_s) / P / (plan->grad_accum * V);
    const double idle =
        plan->pipe.schedule != ZP_PIPE_1F1B
            ? 0.0
            : fmax(0.0, p2p_s(sc, plan) - 0.5 * kind[ZP_COMP_HEAD] / plan->grad_accum);
    return last + (P - 1) * step + fmax(0.0, plan->grad_accum - P) * idle +
           fill_drain_sends_s(sc, plan);
}

/* ZeRO++ in the bound, each below what the schedule sends (zp_zeropp): qwZ gathers one byte
 * an element (its scales left out); with hpZ at most half the gathers (the backward's) stay
 * in the node, at the intra-node link's rate, which no busbw exceeds. */
static double zeropp_gather_s_per_elem(const ZpScreen *sc, const ZpPlan *plan, double sent,
                                       double bw, double param_bytes)
{
    const double bytes = plan->zero.zero_quantized_weights ? 1.0 : param_bytes;
    const int hpz = plan->zero.zero_hpz_partition_size;
    if (hpz <= 1)
        return sent * bytes / bw;
    const double sent_hpz = (hpz - 1.0) / hpz;
    return 0.5 * bytes * (sent / bw + sent_hpz / sc->hw->intra_node_bytes_per_s);
}

/* qgZ's two all-to-alls of int4 gradients (half a byte an element, scales left out): the
 * node's ranks exchange (local - 1) / local of each bucket, then the nodes 1/local of it,
 * (nodes - 1) / nodes of that leaving each; both at the intra-node link's rate. */
static double qgz_s_per_elem(const ZpScreen *sc, const ZpPlan *plan)
{
    const double local = zp_zeropp_group_ranks(plan, ZP_GROUP_NODE);
    const double nodes = zp_zeropp_group_ranks(plan, ZP_GROUP_XNODE);
    return 0.5 * ((local - 1) / local + (nodes - 1) / nodes / local) /
           sc->hw->intra_node_bytes_per_s;
}

/* The bound; `gathered_elems` >= 0: stage 3's elements gathered a micro-step, those the
 * schedule plans (zp_sched_gathered_elems) in place of the implementation's O(1) bound. */
static double step_bound_s(const ZpScreen *sc, const ZpPlan *plan, double gathered_elems)
{
    const ZpModel *m = sc->model;
    const ZpStateBytes sb = zp_impl_state_bytes(plan);
    const double accum = plan->grad_accum;
    const double L = (double)m->layers, mp = plan->mp, n = plan->dp, P = zp_plan_pp(plan);
    /* A stage's share of the work, stretched by the bubble. */
    const double chunks = accum * zp_plan_vstages(plan), bubble = (chunks + P - 1) / chunks;

    /* Megatron's all-reduces of b*s*h, two per block forward, backward and recompute, each
     * tp_allreduce_s; one in a sparse block whose MLP has none (zp_ep_sparse_mlp_sums: its
     * experts' tensor-group gather and reduce-scatter, not counted here, only add). Those
     * after a block's backward run beside the gradient reductions launched there (another
     * stream), so only the rest add to them. */
    double kind[ZP_COMP_N], each_s;
    const double all_s = compute_s(sc, plan, kind, &each_s);
    double tp_s = 0, tp_bwd_s = 0;
    if (plan->mp > 1) {
        const double sums = 2.0 * L - (zp_ep_sparse_mlp_sums(m, plan)
                                           ? 0.0
                                           : (double)zp_moe_sparse_layers(&m->moe, m->layers));
        const double one_s = accum * sums * each_s; /* a pass's sums over the blocks */
        tp_s = (plan->checkpoint ? 2.0 : 1.0) * one_s;
        tp_bwd_s = one_s;
    }

    /* Data-parallel volumes per rank, from the unpadded psi (padding only adds): gradients
     * reduced once per step (stages 0-1) or every micro-step (2-3), by the implementation's
     * collective (an all-reduce sends twice what a reduce-scatter does: DeepSpeed's stages
     * 1-2 all-reduce their buckets too); stage 3 gathers at least what its implementation's
     * bound says (zp_impl.h); stages 1-2 all-gather the updated parameters after the
     * optimizer. */
    /* A pipeline's stages reduce their own parameters after the flush, the last stage's
     * earlier than the first's: the step is at least the first's chain and reduction, whose
     * parameters are at least its V floor(L / (P V)) blocks'. The average stage's share is
     * no bound there: the first stage holds less than it where the last holds an untied head
     * bigger than the embedding, or a stage more blocks. */
    const double V = zp_plan_vstages(plan);
    const double stage_blocks = V * floor(L / (P * V));
    const double psi =
        (P > 1 ? fmin(sc->params / P, stage_blocks * sc->block_elems_min) : sc->params) / mp;
    const double sent = (n - 1) / n;
    const double bw = bus_bytes_per_s(sc, plan, ZP_GROUP_DP);
    const int stage = plan->zero.stage;
    const ZpCollKind reduce_kind = zp_impl_get(plan->impl)->grad_collective(plan);
    const double passes = reduce_kind == ZP_COLL_ALLREDUCE ? 2.0 : 1.0;
    const double reductions[4] = {passes * psi, passes * psi, passes * accum * psi,
                                  passes * accum * psi};
    /* With the simulator's own cost (spec->coll_s) one collective of all of them a
     * reduction: the cheapest of NCCL's algorithms, a tree's all-reduce below the ring's
     * 2(n-1)/n over the busbw where a group has several ranks a node (a DP group mp apart,
     * ZpRankOrder's tp-dp-pp), and each cost, latency plus bytes over a rate, subadditive
     * over the buckets the schedule reduces them in. */
    const double times = stage >= 2 ? accum : 1.0;
    const double reduce_s =
        plan->zero.zero_quantized_gradients ? reductions[stage] * qgz_s_per_elem(sc, plan)
        : sc->coll_s && n > 1
            ? times * sc->coll_s(sc->hw, plan->dp, (int)zp_plan_placed_dp_stride(plan),
                                 ZP_GROUP_DP, reduce_kind, psi * zp_plan_reduce_bytes(plan))
            : sent * reductions[stage] * zp_plan_reduce_bytes(plan) / bw;
    double gather_s = 0, post_s = 0;
    if (stage == 3) {
        const double gathered =
            fmax(zp_impl_get(plan->impl)->gather_bound_elems(m, plan), gathered_elems);
        gather_s = accum * gathered * zeropp_gather_s_per_elem(sc, plan, sent, bw, sb.param_bytes);
    } else if (stage >= 1) {
        post_s = sent * psi * sb.param_bytes / bw;
    }
    /* A pipeline reduces after its flush, so its TP all-reduces all add. The optimizer runs
     * once, after the flush: the bubble stretches the forward and backward only (stretching
     * it too put gpt-13b's stage-0 pp 2 plans 0.5% above their simulated step:
     * test_search_prune). */
    const double tp_all_s = tp_s + tp_bwd_s;
    const double chain_s =
        P > 1 ? fmax(pipeline_chain_s(sc, plan, tp_all_s, all_s, kind),
                     (all_s - kind[ZP_COMP_OPTIMIZER] + tp_all_s) / P * bubble +
                         kind[ZP_COMP_OPTIMIZER] / P) +
                    (plan->zero.overlap_comm ? 0 : reduce_s)
              : all_s + tp_s + fmax(tp_bwd_s, plan->zero.overlap_comm ? 0 : reduce_s);
    return fmax(chain_s, reduce_s + gather_s) + post_s;
}

/* The first stage's memory: the embedding and its chunks' blocks, and the activations of the
 * micro-batches in flight there. */
static double pipeline_memory_bytes(const ZpScreen *sc, const ZpPlan *plan)
{
    const ZpModel *m = sc->model;
    const int P = zp_plan_pp(plan), V = zp_plan_vstages(plan), micro = plan->grad_accum;
    const int64_t blocks = V * ((m->layers + (int64_t)P * V - 1) / ((int64_t)P * V));
    const double params = (double)zp_model_unit_elems(m, 0) +
                          (double)blocks * (double)zp_model_unit_elems(m, 1);
    const ZpStateBytes sb = zp_impl_state_bytes(plan);
    ZpPlan normalized = *plan; /* FSDP2's stage 2 holds stage 3's states */
    zp_impl_normalize_plan(&normalized);
    const ZpModelStates states =
        zp_mem_model_states(params, normalized.zero.stage, plan->dp, plan->mp, sb);
    ZpModel stage = *m;
    stage.layers = blocks;
    ZpPlan one = *plan;
    one.pipe = (ZpPipeConfig){0};
    const ZpResidual r = zp_mem_residual(&stage, &one, sc->hw);
    const double in_flight =
        V == 1 ? MIN(P, micro)
               : MIN((double)micro * V, (double)(P - 1) * 2 + (double)(V - 1) * P + 1) / V;
    return states.total_bytes + r.total_bytes +
           (in_flight - 1) * (r.activations_bytes + r.checkpoint_bytes);
}

void zp_search_screen(const ZpScreen *screen, const ZpPlan *plan, double *memory_bytes,
                      double *bound_step_s)
{
    *bound_step_s = step_bound_s(screen, plan, -1);
    if (zp_plan_pp(plan) > 1) { /* never with offload (add_plans) */
        *memory_bytes = pipeline_memory_bytes(screen, plan);
        return;
    }
    ZpTiers tiers;
    zp_offload_tiers(screen->model, plan, screen->hw, &tiers);
    const ZpResidual residual = zp_mem_residual(screen->model, plan, screen->hw);
    *memory_bytes = tiers.total_bytes[ZP_TIER_GPU] + residual.total_bytes;
    /* A plan whose host memory or NVMe overflows does not fit either: it counts as needing
     * that much more than the GPU has. */
    double short_bytes;
    const ZpTier over = zp_offload_overflow(&tiers, *memory_bytes, screen->hw, &short_bytes);
    if (over == ZP_TIER_CPU || over == ZP_TIER_NVME)
        *memory_bytes = screen->hw->gpu_memory_bytes + short_bytes;
}


/* A stage-3 plan's gathered elements, kept under its gather key. */
typedef struct {
    ZpPlan key;
    double elems;
} GatherMemo;

/* The plan with the fields zp_sched_gathered_elems never reads set to zero, so that the
 * search's plans of one shape that differ only there share one fetch plan: the reduce and
 * all-gather bucket sizes, overlap_comm, qwZ, hpZ, ZeRO-R's options (ckpt: Pa,
 * cpu_checkpointing, MD...), the micro-batch and the accumulation. What it reads (its call
 * tree: zp_impl_normalize_plan, place_units, zp_sched_unit_padded,
 * zp_model_unit_dense_tp_elems, and each implementation's plan_fetches: ds_plan_fetches with
 * zp_impl_tensors/list_tensors, build_trace, add_unit, zp_impl_module_compute, kept, fetch,
 * sort_calls; paper_plan_fetches with add_fetch, zp_sched_unit_persistent,
 * zp_impl_prefetch_window; zp_impl_fsdp_plan_fetches; fsdp2_plan_fetches with
 * keep_to_backward, join_root, zp_impl_fsdp2_root_joined): impl, stage, mp, dp, checkpoint,
 * block_compute, fsdp2_no_reshard_after_forward, qgZ, the offloaded optimizer's device and
 * the stage-3 knobs (stage3_param_persistence_threshold, stage3_prefetch_bucket_size,
 * stage3_max_live_parameters, stage3_max_reuse_distance, stage3_allgather_sequential), all
 * kept; the zeroed fields' names (also as z->) appear in none of those functions (grepped
 * over planner/rules, planner/sched/zp_build_layout.c and planner/spec; ckpt's fields are
 * read only in zp_zeror.c, zp_build_ckpt.c, zp_sched.c, zp_schedcheck.c, the search,
 * zp_plan.c and zp_dsconfig.c). The fetches' elements are padded to dp: dp stays. */
static void gather_key(const ZpPlan *plan, ZpPlan *key)
{
    memcpy(key, plan, sizeof *key);
    key->zero.reduce_bucket_size = 0;
    key->zero.allgather_bucket_size = 0;
    key->zero.overlap_comm = FALSE;
    key->zero.zero_quantized_weights = FALSE;
    key->zero.zero_hpz_partition_size = 0;
    key->ckpt = (ZpCheckpointConfig){0};
    key->micro_batch = 0;
    key->grad_accum = 0;
}

/* zp_sched_gathered_elems, kept in sc->gather_memo where there is one: the search asks it for
 * each stage-3 shape's bucket, overlap and ZeRO++ choices, and each call plans the whole
 * step's fetches (plan --3d gpt-1t/4096: 52 calls, 88 M instructions). */
static double gathered_elems(const ZpScreen *sc, const ZpPlan *plan)
{
    if (!sc->gather_memo)
        return zp_sched_gathered_elems(sc->model, plan);
    ZpPlan key;
    gather_key(plan, &key);
    const GatherMemo *m = g_hash_table_lookup(sc->gather_memo, &key);
    if (!m) {
        GatherMemo *fresh = g_new(GatherMemo, 1);
        fresh->key = key;
        fresh->elems = zp_sched_gathered_elems_kept(sc->model, plan, sc->tensor_memo);
        g_hash_table_add(sc->gather_memo, fresh);
        m = fresh;
    }
    return m->elems;
}

double zp_search_screen_gathers_bound_s(const ZpScreen *sc, const ZpPlan *p)
{
    if (p->zero.stage != 3 || p->zero.zero_hpz_partition_size > 1 || zp_plan_pp(p) > 1 ||
        p->zero.offload_param.device != ZP_OFFLOAD_NONE)
        return 0;
    return step_bound_s(sc, p, gathered_elems(sc, p));
}

void zp_search_screen_keep_costs(ZpScreen *screen)
{
    /* ComputeMemo's and GatherMemo's key first, a ZpPlan: each table hashes its entries by
     * it (compute_key_hash) and frees them. */
    screen->compute_memo =
        g_hash_table_new_full(compute_key_hash, compute_key_equal, g_free, NULL);
    screen->gather_memo =
        g_hash_table_new_full(compute_key_hash, compute_key_equal, g_free, NULL);
    screen->tensor_memo = g_new0(ZpSchedMemo, 1);
    screen->cost_memo = zp_cost_memo_new();
}

void zp_search_screen_clear(ZpScreen *screen)
{
    if (screen->compute_memo)
        g_hash_table_destroy(screen->compute_memo);
    screen->compute_memo = NULL;
    if (screen->gather_memo)
        g_hash_table_destroy(screen->gather_memo);
    screen->gather_memo = NULL;
    zp_sched_memo_destroy(screen->tensor_memo);
    screen->tensor_memo = NULL;
    zp_cost_memo_free(screen->cost_memo);
    screen->cost_memo = NULL;
}
