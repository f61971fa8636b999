/* zp_build_moe: a mixture of experts and latent attention in the schedule — a block's cost by its
 * own widths, the expert space ZeRO partitions over the expert-data-parallel group, and a sparse
 * block's dispatch, experts, combine and unpermute with their buffers, gathers and reductions. */
#include "zp_build.h"
#include "zp_mem.h"
#include "zp_sched.h"

#include <math.h>

gboolean zp_build_moe_sparse(const ZpSchedule *s, int unit)
{
    return zp_moe_enabled(&s->model.moe) && zp_model_unit_sparse(&s->model, unit);
}

static gboolean uniform_blocks(const ZpModel *m)
{
    return !zp_moe_enabled(&m->moe) && !zp_mla_enabled(&m->mla);
}

uint64_t zp_sched_unit_expert_elems(const ZpSchedule *s, int unit)
{
    return zp_impl_unit_expert_elems(s, unit);
}

uint64_t zp_sched_unit_expert_offset(const ZpSchedule *s, int unit)
{
    uint64_t offset = 0;
    for (int u = 0; u < unit; u++)
        offset += zp_sched_unit_expert_elems(s, u);
    return offset;
}

/* The expert-data-parallel group: dp / EP ranks (mp dp / EP with whole experts). */
static uint64_t edp_ranks(const ZpSchedule *s)
{
    return (uint64_t)zp_plan_edp(&s->plan);
}

/* Whether the implementation reduces the expert gradients once the backward is done (ZpImpl
 * experts_after_backward), not unit by unit. */
static gboolean after_backward(const Builder *b)
{
    return b->impl->experts_after_backward && b->impl->experts_after_backward(&b->s->plan);
}

ZpSchedExperts zp_sched_experts(const ZpSchedule *s)
{
    ZpSchedExperts x = {0};
    if (!zp_moe_enabled(&s->model.moe)) /* every unit's 0 (zp_impl_unit_expert_elems): no walk
                                          * of the units, once a stage's optimizer */
        return x;
    const uint64_t edp = edp_ranks(s);
    uint64_t partition3 = 0;
    for (int u = 0; u < s->n_units; u++) {
        const uint64_t elems = zp_sched_unit_expert_elems(s, u);
        x.total_elems += elems;
        partition3 += zp_mem_padded_elems(elems, edp) / edp;
    }
    x.padded_elems = zp_mem_padded_elems(x.total_elems, edp);
    x.partition_elems = s->plan.zero.stage == 3 ? partition3 : x.padded_elems / edp;
    return x;
}

/* Whether the expert gradients are kept as the rank's partition over the expert-data-parallel
 * group: from stage 2, and at stage 1 where the implementation keeps the dense ones so
 * (DeepSpeed's stage 1 shares stage 2's grads_in_partition: ZpImpl grad_state_elems; an
 * expert param group's partition is over its expert DP group, stage_1_and_2.py
 * _configure_moe_settings). */
gboolean zp_sched_expert_grads_partitioned(const ZpSchedule *s)
{
    const int stage = s->plan.zero.stage;
    return stage >= 2 || (stage == 1 && zp_impl_get(s->plan.impl)->grad_state_elems(s) <
                                            (double)s->total_elems);
}

/* The expert space's model states, by the stage's rule over the expert-data-parallel group as
 * DeepSpeed's stage_1_and_2.py (_configure_moe_settings: real_dp_process_group of an expert
 * group is its expert_dp_process_group) and stage3.py partition them: 16-bit parameters whole
 * below stage 3, gradients whole below stage 2, the optimizer's partition from stage 1; the
 * rank's own experts (E / EP of them) throughout. zp_ep_model_states is the closed form. */
void zp_build_moe_states(Builder *b)
{
    ZpSchedule *s = b->s;
    if (!zp_moe_enabled(&s->model.moe)) /* no expert space: not a walk of the units a stage */
        return;
    const ZpSchedExperts x = zp_sched_experts(s);
    if (x.total_elems == 0)
        return;
    const int stage = s->plan.zero.stage;
    const double total = (double)x.total_elems, padded = (double)x.padded_elems;
    const double part = (double)x.partition_elems;
    double master, m, v;
    zp_plan_optimizer_split(&s->plan, &master, &m, &v);
    const double params[4] = {total, padded, padded, part};
    const double grads[4] = {total, zp_sched_expert_grads_partitioned(s) ? part : total, part, part};
    const double optim = stage == 0 ? total : part;
    s->state_bytes[ZP_MEM_PARAMS] += params[stage] * b->state.param_bytes;
    s->state_bytes[ZP_MEM_GRADS] += grads[stage] * b->state.grad_bytes;
    s->state_bytes[ZP_MEM_MASTER] += optim * master;
    s->state_bytes[ZP_MEM_ADAM_M] += optim * m;
    s->state_bytes[ZP_MEM_ADAM_V] += optim * v;
    /* A stage with sparse layers holds Megatron's persistent buffer of the all-gather
     * dispatcher's gathered tokens from its first step on (zp_ep_activations) */
    s->state_bytes[ZP_MEM_EP_BUFFERS] += b->moe.global_buffer_bytes;
}

double zp_build_moe_optimizer_elems(const ZpSchedule *s)
{
    const ZpSchedExperts x = zp_sched_experts(s);
    return (double)(s->plan.zero.stage == 0 ? x.total_elems : x.partition_elems);
}

gboolean zp_build_moe_mlp_sums(const ZpSchedule *s, int unit)
{
    return !zp_build_moe_sparse(s, unit) || zp_ep_sparse_mlp_sums(&s->model, &s->plan);
}

/* ---- a block's cost by its own widths ------------------------------------------------- */

double zp_build_moe_permute_elems(const ZpModel *m, const ZpPlan *plan)
{
    const double h = (double)m->hidden;
    if (plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) /* the experts' t R rows picked out */
        return 2 * zp_ep_activations(m, plan).expert_tokens * h;
    const double T = (double)plan->micro_batch * (double)m->seq_len;
    const double Tr = plan->sequence_parallel ? T / plan->mp : T;
    return (Tr + Tr * (double)m->moe.top_k) * h;
}

/* A block's forward on this rank, T = b s tokens, t the tensor degree:
 * - attention's GEMMs: the fused qkv and proj, 2T(h q + a d h)/t (a d = h unless head_dim
 *   sets d apart); latent attention's low-rank
 *   projections (DeepseekV3Attention: q_a [h, r_q], q_b [r_q, H d_qk], kv_a [h, r_kv + d_rope],
 *   kv_b [r_kv, H (d_nope + d_v)], o [H d_v, h]; the down projections whole on every tensor
 *   rank, as Megatron-Core's MLASelfAttention replicates them, the rest split);
 * - core attention: 4 b s^2 a d / t, or with latent attention 2 b s^2 H (d_qk + d_v) / t (scores
 *   over d_qk = d_nope + d_rope, values over d_v: H d_qk is not h there);
 * - the MLP: the dense one's 2T(h f1 + f h)/t, or a sparse block's shared experts at their
 *   width and the router's 2 T_r h E (whole: Megatron-Core's TopKRouter is not split, over
 *   the rank's T_r tokens, T / t with sequence parallelism);
 * - elementwise reads and writes: norms and residual adds 10 T h, the activation 3 T f / t gated
 *   (2 plain), the eager softmax 2 b a s^2 / t, latent attention's two latent RMSNorms
 *   2T (r_q + r_kv), and a sparse block's router softmax and top-k (2 T_r E) and the
 *   permutation of its T_r k token copies into expert order (token_dispatcher.py permute: read
 *   T_r h, write T_r k h).
 * The typical GEMM is their mean. */
static Cost block_forward(const ZpSchedule *s, int unit)
{
    const ZpModel *m = &s->model;
    const ZpMla *mla = &m->mla;
    const double b = s->plan.micro_batch, sq = (double)m->seq_len, h = (double)m->hidden;
    const double t = s->plan.mp, T = b * sq, e = s->elem_bytes, H = (double)m->heads;
    const gboolean sparse = zp_build_moe_sparse(s, unit), gated = zp_model_gated(m);
    const gboolean fused = zp_plan_attention_rated(&s->plan); /* else eager's work */
    const double share = fused ? zp_model_attention_share(m) : 1.0;
    double gemm = 0, core = 0, ew = 0;
    int gemms = 0;
    if (zp_mla_enabled(mla)) {
        const double rq = (double)mla->q_lora_rank, rkv = (double)mla->kv_lora_rank;
        const double dqk = (double)(mla->qk_nope_dim + mla->qk_rope_dim);
        const double dv = (double)mla->v_dim;
        const double q = rq > 0 ? h * rq + rq * H * dqk / t : h * H * dqk / t;
        gemm += 2 * T * (q + h * (rkv + (double)mla->qk_rope_dim) +
                         rkv * H * ((double)mla->qk_nope_dim + dv) / t + H * dv * h / t);
        gemms += rq > 0 ? 5 : 4;
        core = 2 * b * sq * sq * H * (dqk + dv) / t * share;
        ew += 2 * T * (rq + rkv);
    } else {
        const double ha = (double)zp_model_attn_width(m); /* a d: h unless head_dim differs */
        gemm += 2 * T * (h * (double)zp_model_qkv_width(m) + ha * h) / t;
        gemms += 2;
        core = 4 * b * sq * sq * ha / t * share;
        if (m->qk_norm) /* q_norm and k_norm read and write q and k (zp_inv_qk_norm) */
            ew += 2 * T * (H + (double)zp_model_kv_heads(m)) * (double)zp_model_head_dim(m) / t;
    }
    const double f = sparse ? (double)m->moe.shared_ffn : (double)m->ffn_hidden;
    if (f > 0) {
        gemm += 2 * T * (h * (gated ? 2 : 1) * f + f * h) / t;
        gemms += gated ? 3 : 2;
        ew += (gated ? 3 : 2) * T * f / t;
    }
    if (sparse) { /* over the rank's own tokens: the sequence's t-th with sequence parallelism
                   * (MoELayer routes its input, [s/t, b, h]), else all of it on every rank;
                   * permute's reads and writes (zp_build_moe_permute_elems) */
        const double E = (double)m->moe.experts;
        const double Tr = s->plan.sequence_parallel ? T / t : T;
        gemm += 2 * Tr * h * E;
        gemms += 1;
        ew += 2 * Tr * E + zp_build_moe_permute_elems(m, &s->plan);
    }
    ew += 10 * T * h / (s->plan.sequence_parallel ? t : 1);
    if (!fused)
        ew += 2 * b * H * sq * sq / t;
    return (Cost){.flops = gemm + core, .gemm_flops = gemm / gemms,
                  .attn_flops = fused ? core : 0.0, .mem_bytes = e * ew};
}

Cost zp_build_unit_block_cost(const ZpSchedule *s, int unit, ZpComputeKind kind)
{
    if (uniform_blocks(&s->model)) {
        if (kind == ZP_COMP_BLOCK_BWD)
            return zp_build_block_backward_cost(s);
        return kind == ZP_COMP_RECOMPUTE ? zp_build_recompute_cost(s)
                                         : zp_build_block_forward_cost(s);
    }
    const Cost fwd = block_forward(s, unit);
    if (kind != ZP_COMP_BLOCK_BWD)
        return fwd;
    /* Backward: the data- and weight-gradient GEMMs (as many FLOPs as the forward's each),
     * attention's backward twice its forward, and each elementwise kernel's backward reading
     * its input and output gradient and writing its input's gradient (twice the forward's). */
    return (Cost){2 * fwd.flops, fwd.gemm_flops, 2 * fwd.attn_flops, 2 * fwd.mem_bytes};
}

double zp_build_unit_act_bytes(const Builder *b, int unit, double uniform)
{
    if (uniform_blocks(&b->s->model))
        return uniform;
    return zp_build_moe_sparse(b->s, unit) ? b->moe.sparse_layer_bytes
                                           : b->moe.dense_layer_bytes;
}

/* ---- a sparse block's experts ---------------------------------------------------------- */

/* The routed experts over the R tokens they compute (the busiest rank's, zp_ep_activations
 * expert_tokens: what its all-to-all received, gathered over the expert tensor group under
 * sequence parallelism), E/EP experts on this rank, each a gated MLP f_e / t wide:
 * 2 R (h f1 + f h) FLOPs, the typical GEMM one expert's projection over its R / (E/EP) tokens;
 * the activation's 3 R f_e / t reads and writes gated (2 plain), its backward's 5 (3), as the
 * dense MLP's kernels (zp_cost_kernels). */
static Cost expert_cost(const Builder *b, gboolean backward)
{
    const ZpSchedule *s = b->s;
    const ZpModel *m = &s->model;
    const gboolean gated = zp_model_gated(m);
    const double R = b->moe.expert_tokens, h = (double)m->hidden;
    const double f = (double)m->moe.expert_ffn / zp_plan_etp(&s->plan);
    const double local = (double)(m->moe.experts / zp_plan_ep(&s->plan));
    const double flops = 2 * R * (h * (gated ? 2 : 1) * f + f * h);
    const double ew = (backward ? (gated ? 5 : 3) : (gated ? 3 : 2)) * R * f;
    return (Cost){.flops = backward ? 2 * flops : flops,
                  .gemm_flops = flops / (local * (gated ? 3 : 2)), .attn_flops = 0,
                  .mem_bytes = s->elem_bytes * ew};
}

/* Unpermute (token_dispatcher.py unpermute, DeepSpeed's combine einsum): the T k returned
 * copies read and summed into T tokens with their routing weights; its backward reads the
 * tokens' gradient and the expert outputs (for the weights' gradient) and writes the copies'.
 * Under the all-gather dispatcher (MoEAllGatherTokenDispatcher.combine_preprocess, moe_utils.py
 * unpermute without probabilities) it zeroes the G gathered rows and scatter-adds the experts'
 * t R outputs into them (each read, and its row read and written); backward, a gather of the
 * t R rows' gradients. */
static Cost unpermute_cost(const Builder *b, gboolean backward)
{
    const double h = (double)b->s->model.hidden, T = b->moe.tokens, Tk = b->moe.routed_tokens;
    if (b->s->plan.experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
        const double G = b->moe.gathered_tokens, tR = b->moe.expert_tokens;
        return (Cost){.mem_bytes = b->s->elem_bytes * (backward ? 2 * tR : G + 3 * tR) * h};
    }
    const double ew = backward ? (T + 2 * Tk) * h + Tk : (Tk + T) * h + Tk;
    return (Cost){.mem_bytes = b->s->elem_bytes * ew};
}

/* Stage 3: the rank's experts of the unit gathered over the expert-data-parallel group
 * (stage3.py fetches an expert parameter over its ds_process_group, the expert DP group), each
 * padded to it; NONE and no buffer below stage 3 or with one expert-data-parallel rank. */
static uint32_t gather_experts(Builder *b, int unit, int micro, int *buffer)
{
    const ZpSchedule *s = b->s;
    *buffer = -1;
    const uint64_t elems = zp_sched_unit_expert_elems(s, unit), edp = edp_ranks(s);
    if (s->plan.zero.stage != 3 || elems == 0 || edp == 1)
        return NONE;
    const uint64_t padded = zp_mem_padded_elems(elems, edp);
    const double bytes = (double)padded * b->state.param_bytes;
    const uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_GATHERED_PARAMS, bytes, unit, micro,
                                               buffer, &b->last_compute, 1);
    return zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_EDP, unit, micro, -1,
                                    zp_sched_unit_expert_offset(s, unit), padded, bytes, &alloc,
                                    1);
}

static void release_experts(Builder *b, int unit, int micro, int buffer, uint32_t after)
{
    if (buffer < 0)
        return;
    const uint64_t padded =
        zp_mem_padded_elems(zp_sched_unit_expert_elems(b->s, unit), edp_ranks(b->s));
    zp_build_emit_free(b, ZP_MEM_GATHERED_PARAMS, (double)padded * b->state.param_bytes, unit,
                       micro, buffer, after);
}

/* One all-to-all over the EP group (none at EP 1: every expert is on the rank), after `after`
 * and the buffer's alloc; the rank sends R h e bytes, its own slice included (zp_ep_alltoall). */
static uint32_t alltoall(Builder *b, ZpCollKind kind, int unit, int micro, uint32_t after,
                         uint32_t alloc)
{
    const ZpSchedule *s = b->s;
    if (zp_plan_ep(&s->plan) == 1)
        return after;
    const double elems = b->moe.received_tokens * (double)s->model.hidden;
    const uint32_t deps[2] = {after, alloc};
    return zp_build_emit_collective(b, kind, ZP_GROUP_EP, unit, micro, -1, 0, (uint64_t)elems,
                                    elems * s->elem_bytes, deps, 2);
}

/* The expert tensor group's all-gather of what its t ranks received, or (`back`) the
 * experts' outputs summed back after them (zp_ep_tp_gather_back: Megatron's reduce-scatter,
 * DeepSpeed's all-reduce; nothing where zp_ep_tp_gather is 1): t R h elements in the model's
 * dtype, on the tensor-parallel stream after `after`. */
static uint32_t tp_gather(Builder *b, gboolean back, int unit, int micro, uint32_t after)
{
    const ZpSchedule *s = b->s;
    if (zp_ep_tp_gather(&s->plan) == 1)
        return after;
    const ZpCollKind kind = back ? zp_ep_tp_gather_back(&s->plan) : ZP_COLL_ALLGATHER;
    const double elems = b->moe.expert_tokens * (double)s->model.hidden;
    return zp_build_emit_collective(b, kind, ZP_GROUP_TP, unit, micro, -1, 0, (uint64_t)elems,
                                    elems * s->elem_bytes, &after, 1);
}

/* DeepSpeed's all-gather over TP of the slots its tensor ranks dropped (zp_ep_tp_drop: forward
 * gather_tokens after the combine's all-to-all, backward drop_tokens' backward after the
 * dispatch's), t R h e into a buffer of its own taken after `after`, on the tensor-parallel
 * stream as zplan runs the tensor group's collectives, the next compute op waiting for it
 * (the combine reads it; mappings.py _gather_tokens on the current stream). Returns it, or
 * `after` where nothing drops; *buffer its buffer (-1 without). */
static uint32_t tp_regather(Builder *b, int unit, int micro, uint32_t after, int *buffer)
{
    *buffer = -1;
    if (b->moe.regathered_bytes <= 0)
        return after;
    const double bytes = b->moe.regathered_bytes;
    const uint32_t alloc =
        zp_build_emit_alloc(b, ZP_MEM_EP_BUFFERS, bytes, unit, micro, buffer, &after, 1);
    const uint32_t deps[2] = {after, alloc};
    const uint32_t gather = zp_build_emit_collective(
        b, ZP_COLL_ALLGATHER, ZP_GROUP_TP, unit, micro, -1, 0,
        (uint64_t)(bytes / b->s->elem_bytes), bytes, deps, 2);
    zp_build_sync_on(b, gather);
    return gather;
}

/* The all-gather dispatcher's collectives `c` (zp_ep_gather_pass) over ZP_GROUP_TPEP, each
 * after the one before, the first after `deps`; on the compute stream, as Megatron runs
 * gather_from_sequence_parallel_region and reduce_scatter_to_sequence_parallel_region on the
 * current stream. Returns the last, or deps[0] where there are none (one rank). */
static uint32_t tpep_chain(Builder *b, const ZpEpGatherColl *c, int n, int unit, int micro,
                           const uint32_t *deps, guint n_deps)
{
    uint32_t last = deps[0];
    for (int k = 0; k < n; k++) {
        last = zp_build_emit_collective(b, c[k].kind, ZP_GROUP_TPEP, unit, micro, -1, 0,
                                        (uint64_t)c[k].elems, c[k].bytes, k ? &last : deps,
                                        k ? 1 : n_deps);
    }
    return last;
}

/* A dispatcher's two halves in the schedule (ZpDispatcher), forward and backward: `in` moves
 * the tokens (or, backward, the outputs' gradients) from the block op `after` to the experts,
 * into the buffer `alloc` took; `out` takes the experts' op to the combined tokens (or the
 * tokens' gradients), writing the buffer `alloc` took, and returns its last op. */
typedef struct {
    uint32_t (*in)(Builder *b, int unit, int micro, gboolean backward, uint32_t after,
                   uint32_t alloc);
    uint32_t (*out)(Builder *b, int unit, int micro, gboolean backward, uint32_t expert,
                    uint32_t alloc);
} Dispatcher;

/* The all-to-all's: forward the dispatch (then the expert tensor group's gather), and after
 * the experts that gather's sum back (tp_gather), the combine (then DeepSpeed's regather)
 * and unpermute; backward unpermute's backward comes first, then the same collectives, and
 * the experts' input gradients go back through the sum and the combine. */
static uint32_t a2a_in(Builder *b, int unit, int micro, gboolean backward, uint32_t after,
                       uint32_t alloc)
{
    if (backward)
        after = zp_build_emit_compute(b, ZP_COMP_UNPERMUTE_BWD, unit, micro,
                                      unpermute_cost(b, TRUE), &alloc, 1);
    return tp_gather(b, FALSE, unit, micro,
                     alltoall(b, ZP_COLL_EP_DISPATCH, unit, micro, after, alloc));
}

static uint32_t a2a_out(Builder *b, int unit, int micro, gboolean backward, uint32_t expert,
                        uint32_t alloc)
{
    int regathered;
    const uint32_t back = tp_regather(
        b, unit, micro,
        alltoall(b, ZP_COLL_EP_COMBINE, unit, micro,
                 tp_gather(b, TRUE, unit, micro, expert), alloc),
        &regathered);
    if (backward) {
        /* the slots' gradients go on into the block's backward (the dispatch's), which frees
         * them with the experts' returned buffer */
        b->moe_regathered = regathered;
        return back;
    }
    const uint32_t deps[2] = {back, alloc};
    const uint32_t unpermuted = zp_build_emit_compute(b, ZP_COMP_UNPERMUTE_FWD, unit, micro,
                                                      unpermute_cost(b, FALSE), deps, 2);
    if (regathered >= 0)
        zp_build_emit_free(b, ZP_MEM_EP_BUFFERS, b->moe.regathered_bytes, unit, micro,
                           regathered, unpermuted);
    return unpermuted;
}

/* The all-gather's (token_dispatcher.py MoEAllGatherTokenDispatcher, zp_ep_gather_pass):
 * forward token_dispatch's gathers, permute (in the block op's cost) picking the experts'
 * rows; after them combine_preprocess unpermutes into G rows and token_combine
 * reduce-scatters them. Backward the outputs' gradients gathered and unpermute's backward
 * picking the experts' rows; after the experts the gradients reduce-scattered. */
static uint32_t gather_in(Builder *b, int unit, int micro, gboolean backward, uint32_t after,
                          uint32_t alloc)
{
    const ZpEpGatherPass p = zp_ep_gather_pass(&b->s->model, &b->s->plan, backward);
    if (backward) { /* after is the buffer's alloc itself */
        const uint32_t grads = tpep_chain(b, p.before, p.n_before, unit, micro, &alloc, 1);
        return zp_build_emit_compute(b, ZP_COMP_UNPERMUTE_BWD, unit, micro,
                                     unpermute_cost(b, TRUE), &grads, 1);
    }
    const uint32_t deps[2] = {after, alloc};
    return tpep_chain(b, p.before, p.n_before, unit, micro, deps, 2);
}

static uint32_t gather_out(Builder *b, int unit, int micro, gboolean backward, uint32_t expert,
                           uint32_t alloc)
{
    const ZpEpGatherPass p = zp_ep_gather_pass(&b->s->model, &b->s->plan, backward);
    const uint32_t deps[2] = {expert, alloc};
    if (backward)
        return tpep_chain(b, p.after, p.n_after, unit, micro, deps, 2);
    const uint32_t unperm = zp_build_emit_compute(b, ZP_COMP_UNPERMUTE_FWD, unit, micro,
                                                  unpermute_cost(b, FALSE), deps, 2);
    return tpep_chain(b, p.after, p.n_after, unit, micro, &unperm, 1);
}

static const Dispatcher dispatchers[ZP_DISPATCH_N] = {
    [ZP_DISPATCH_ALLTOALL] = {a2a_in, a2a_out},
    [ZP_DISPATCH_ALLGATHER] = {gather_in, gather_out},
};

static const Dispatcher *dispatcher(const Builder *b)
{
    return &dispatchers[b->s->plan.experts.dispatcher];
}

/* A sparse block's first EP buffer, taken after `after` (the last compute op) and the
 * tensor-parallel sums still pending (Builder.sync_deps), which only the next compute op would
 * otherwise wait for: the router reads the attention's summed output (Megatron-Core's
 * MoELayer after the row-parallel projection's all-reduce, or its reduce-scatter under
 * sequence parallelism), and backward the experts' output gradient is the next layer's summed
 * input gradient, so no dispatch collective (each waits on this alloc) starts before them. */
static uint32_t take_after_sums(Builder *b, double bytes, int unit, int micro, int *buffer,
                                uint32_t after)
{
    GArray *deps = b->compute_deps; /* scratch: zp_build_emit_alloc does not use it */
    g_array_set_size(deps, 0);
    g_array_append_val(deps, after);
    g_array_append_vals(deps, b->sync_deps->data, b->n_sync);
    return zp_build_emit_alloc(b, ZP_MEM_EP_BUFFERS, bytes, unit, micro, buffer,
                               (const uint32_t *)deps->data, deps->len);
}

void zp_build_moe_forward(Builder *b, int unit, int micro)
{
    if (!zp_build_moe_sparse(b->s, unit))
        return;
    const double dispatch = b->moe.dispatch_bytes, combine = b->moe.combine_bytes;
    const Dispatcher *d = dispatcher(b);
    int gathered, sent, returned;
    const uint32_t gather = gather_experts(b, unit, micro, &gathered);
    const uint32_t block = b->last_compute;
    const uint32_t alloc = take_after_sums(b, dispatch, unit, micro, &sent, block);
    const uint32_t in = d->in(b, unit, micro, FALSE, block, alloc);
    /* The experts write their outputs into the combine's send buffer, so it is taken before
     * them and the dispatch's freed after (zreal's experts read one and write the other:
     * real_engine_moe; DeepSpeed's expert_output is allocated while dispatched_input lives). */
    const uint32_t out = zp_build_emit_alloc(b, ZP_MEM_EP_BUFFERS, combine, unit, micro,
                                             &returned, &in, 1);
    const uint32_t deps[4] = {in, gather, alloc, out};
    const uint32_t expert = zp_build_emit_compute(b, ZP_COMP_EXPERT_FWD, unit, micro,
                                                  expert_cost(b, FALSE), deps, 4);
    release_experts(b, unit, micro, gathered, expert);
    zp_build_emit_free(b, ZP_MEM_EP_BUFFERS, dispatch, unit, micro, sent, expert);
    const uint32_t done = d->out(b, unit, micro, FALSE, expert, out);
    zp_build_emit_free(b, ZP_MEM_EP_BUFFERS, combine, unit, micro, returned, done);
}

int zp_build_moe_backward(Builder *b, int unit, int micro, gboolean reduce)
{
    const ZpSchedule *s = b->s;
    if (!zp_build_moe_sparse(s, unit))
        return -1;
    const double dispatch = b->moe.dispatch_bytes, combine = b->moe.combine_bytes;
    int gathered, sent, returned;
    const uint32_t gather = gather_experts(b, unit, micro, &gathered);
    const uint32_t before = b->last_compute;
    const uint32_t alloc = take_after_sums(b, combine, unit, micro, &sent, before);
    const Dispatcher *d = dispatcher(b);
    const uint32_t in = d->in(b, unit, micro, TRUE, alloc, alloc);
    /* As in forward: the experts' input gradients go into the combine's buffer, taken first. */
    const uint32_t out = zp_build_emit_alloc(b, ZP_MEM_EP_BUFFERS, dispatch, unit, micro,
                                             &returned, &in, 1);
    /* The experts' gradients, reduced over the expert-data-parallel group where the dense
     * ones are reduced over dp, by the collective the dense buckets use
     * (zp_impl_expert_grad_collective): DeepSpeed's stage_1_and_2.py keeps the experts in
     * param groups of their own (_configure_moe_settings: real_dp_process_group is the
     * expert DP group) but in the same IPG buckets as the dense gradients, and average_tensor
     * reduces each parameter's slice over its group, all-reducing with
     * use_multi_rank_bucket_allreduce (allreduce_and_scatter, its default) at stages 1-2;
     * stage3.py __avg_scatter_grads reduce-scatters over the parameter's ds_process_group;
     * Megatron-Core's expert grad buffers reduce-scatter with the distributed optimizer. One
     * collective a sparse unit, not a bucket's worth: the bytes are the same, and a unit's
     * experts (Mixtral at EP 8: 176M elements) are a third of the default 5e8 bucket.
     * Where the rank keeps only its partition (zp_sched_expert_grads_partitioned: from stage
     * 2, and DeepSpeed's stage 1) the unit's unreduced expert gradients land in a bucket of
     * their own, taken before the experts' backward and freed after the reduction reads it
     * (DeepSpeed reduces an expert parameter's gradient out of its IPG bucket), and the rank
     * keeps its slice. Without overlap_comm average_tensor runs on the current stream, so
     * the compute waits for it, as for a dense bucket (zp_build_buckets launch_bucket).
     * DeepSpeed's stage 0 reduces them after the backward instead
     * (zp_build_moe_reduce_after_backward), and its stage 2 out of the dense gradients' ipg
     * buckets (ZpImpl experts_in_buckets: zp_build_hand_on_experts, launch_bucket). */
    const uint64_t elems = zp_sched_unit_expert_elems(s, unit), edp = edp_ranks(s);
    const gboolean bucketed = zp_sched_expert_grads_partitioned(s);
    const gboolean in_ipg = zp_impl_experts_in_buckets(s);
    const gboolean reduced = reduce && edp > 1 && !after_backward(b) && !in_ipg;
    const uint64_t n = s->plan.zero.stage == 3 ? zp_mem_padded_elems(elems, edp) : elems;
    const double bytes = (double)n * zp_plan_reduce_bytes(&s->plan);
    int bucket = -1;
    const uint32_t taken = reduced && bucketed
                               ? zp_build_emit_alloc(b, ZP_MEM_BUCKETS, bytes, unit, micro,
                                                     &bucket, &in, 1)
                           : reduce && in_ipg ? zp_build_hand_on_experts(b, unit, micro)
                                              : NONE;
    const uint32_t deps[4] = {in, gather, out, taken};
    const uint32_t expert = zp_build_emit_compute(b, ZP_COMP_EXPERT_BWD, unit, micro,
                                                  expert_cost(b, TRUE), deps, 4);
    release_experts(b, unit, micro, gathered, expert);
    zp_build_emit_free(b, ZP_MEM_EP_BUFFERS, combine, unit, micro, sent, expert);
    d->out(b, unit, micro, TRUE, expert, out);
    if (reduced) {
        const uint32_t r = zp_build_emit_collective(
            b, zp_impl_expert_grad_collective(&s->plan), ZP_GROUP_EDP, unit, micro, bucket,
            zp_sched_unit_expert_offset(s, unit), n, bytes, &expert, 1);
        if (bucket >= 0)
            zp_build_emit_free(b, ZP_MEM_BUCKETS, bytes, unit, micro, bucket, r);
        if (!s->plan.zero.overlap_comm)
            zp_build_sync_on(b, r);
    }
    return returned;
}

/* The expert gradients all-reduced over the expert-data-parallel group after the dense ones:
 * the sparse units' in model order, grouped until a group passes the dense buckets' size
 * (engine.py allreduce_no_retain: the unit whose experts pass it closes the group), each
 * flattened into a copy of its own (a bucket), all-reduced and copied back. */
void zp_build_moe_reduce_after_backward(Builder *b, int micro)
{
    const ZpSchedule *s = b->s;
    if (!after_backward(b) || zp_sched_experts(s).total_elems == 0 || edp_ranks(s) == 1)
        return;
    uint32_t after = b->last_compute; /* after the dense buckets' reductions are issued */
    for (guint i = 0; i < b->buckets->len; i++)
        if (zp_build_bucket(b, i)->coll_op != NONE)
            after = MAX(after, zp_build_bucket(b, i)->coll_op);
    const double limit = s->plan.zero.reduce_bucket_size, e = zp_plan_reduce_bytes(&s->plan);
    uint64_t lo = 0, n = 0;
    for (int u = 0; u < s->n_units; u++) {
        n += zp_sched_unit_expert_elems(s, u);
        const gboolean last = u + 1 == s->n_units;
        if (n == 0 || (!last && (double)n <= limit))
            continue;
        int buffer;
        const double bytes = (double)n * e;
        const uint32_t alloc =
            zp_build_emit_alloc(b, ZP_MEM_BUCKETS, bytes, -1, micro, &buffer, &after, 1);
        after = zp_build_emit_collective(b, ZP_COLL_ALLREDUCE, ZP_GROUP_EDP, -1, micro, buffer,
                                         lo, n, bytes, &alloc, 1);
        zp_build_emit_free(b, ZP_MEM_BUCKETS, bytes, -1, micro, buffer, after);
        lo += n, n = 0;
    }
}

void zp_build_moe_free_backward(Builder *b, int unit, int micro, int buffer)
{
    if (buffer >= 0)
        zp_build_emit_free(b, ZP_MEM_EP_BUFFERS, b->moe.dispatch_bytes, unit, micro, buffer,
                           b->last_compute);
    if (b->moe_regathered >= 0)
        zp_build_emit_free(b, ZP_MEM_EP_BUFFERS, b->moe.regathered_bytes, unit, micro,
                           b->moe_regathered, b->last_compute);
    b->moe_regathered = -1;
}

void zp_build_moe_param_gather(Builder *b, uint32_t after)
{
    const ZpSchedule *s = b->s;
    const ZpSchedExperts x = zp_sched_experts(s);
    if (x.total_elems == 0 || edp_ranks(s) == 1)
        return;
    /* Stages 1-2: the updated expert partitions all-gathered over their group, as the dense
     * ones over dp (stage_1_and_2.py step: all_gather_dp_groups over real_dp_process_group). */
    zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_EDP, -1, -1, -1, 0, x.padded_elems,
                             (double)x.padded_elems * b->state.param_bytes, &after, 1);
}

uint64_t zp_build_moe_optimizer_elems_of(const ZpModel *model, const ZpPlan *plan)
{
    const uint64_t dp = (uint64_t)plan->dp, edp = (uint64_t)zp_plan_edp(plan);
    const int stage = plan->zero.stage;
    const uint64_t expert = (uint64_t)(model->moe.experts / zp_plan_ep(plan)) *
                            zp_model_expert_tp_elems(model, zp_plan_etp(plan));
    uint64_t dense = 0, dense3 = 0, experts = 0, experts3 = 0;
    for (int u = 0; u < zp_model_n_units(model); u++) {
        const uint64_t d = zp_model_unit_dense_tp_elems(model, u, plan->mp);
        const uint64_t e = zp_model_unit_sparse(model, u) ? expert : 0;
        dense += d, dense3 += zp_mem_padded_elems(d, dp) / dp;
        experts += e, experts3 += zp_mem_padded_elems(e, edp) / edp;
    }
    if (stage == 0)
        return dense + experts;
    if (stage == 3)
        return dense3 + experts3;
    return zp_mem_padded_elems(dense, dp) / dp + zp_mem_padded_elems(experts, edp) / edp;
}

static void set_ops(ZpComputeOps *o, uint64_t count, Cost c)
{
    *o = (ZpComputeOps){count, c.flops, c.gemm_flops, c.attn_flops, c.mem_bytes, 0.0};
}

void zp_build_moe_compute_ops(const ZpModel *model, const ZpPlan *plan,
                              ZpComputeOps ops[ZP_COMP_N])
{
    if (uniform_blocks(model))
        return;
    ZpSchedule s = {.model = *model, .plan = *plan,
                    .elem_bytes = zp_plan_elem_bytes(plan->precision), .stages = 1};
    const Builder b = {.s = &s, .state = zp_impl_state_bytes(plan),
                       .moe = zp_ep_activations(model, plan)};
    const uint64_t micro = (uint64_t)plan->grad_accum, L = (uint64_t)model->layers;
    Cost fwd = {0}, bwd = {0};
    for (int l = 1; l <= (int)L; l++) {
        const Cost f = zp_build_unit_block_cost(&s, l, ZP_COMP_BLOCK_FWD);
        const Cost w = zp_build_unit_block_cost(&s, l, ZP_COMP_BLOCK_BWD);
        fwd.flops += f.flops / L, fwd.gemm_flops += f.gemm_flops / L;
        fwd.attn_flops += f.attn_flops / L, fwd.mem_bytes += f.mem_bytes / L;
        bwd.flops += w.flops / L, bwd.gemm_flops += w.gemm_flops / L;
        bwd.attn_flops += w.attn_flops / L, bwd.mem_bytes += w.mem_bytes / L;
    }
    const uint64_t again = plan->checkpoint ? 2 : 1; /* the recomputed forward's experts */
    const uint64_t sparse = (uint64_t)zp_moe_sparse_layers(&model->moe, model->layers);
    set_ops(&ops[ZP_COMP_BLOCK_FWD], micro * L, fwd);
    /* Selective recomputation: each block's core attention again in its backward (Megatron's
     * --recompute-granularity selective: CoreAttention under checkpointed_attention_forward),
     * the experts not (they keep their activations). */
    if (zp_build_selective(plan))
        set_ops(&ops[ZP_COMP_RECOMPUTE], micro * L, zp_build_recompute_cost(&s));
    else
        set_ops(&ops[ZP_COMP_RECOMPUTE], plan->checkpoint ? micro * L : 0, fwd);
    set_ops(&ops[ZP_COMP_BLOCK_BWD], micro * L, bwd);
    if (sparse == 0)
        return;
    set_ops(&ops[ZP_COMP_EXPERT_FWD], again * micro * sparse, expert_cost(&b, FALSE));
    set_ops(&ops[ZP_COMP_EXPERT_BWD], micro * sparse, expert_cost(&b, TRUE));
    set_ops(&ops[ZP_COMP_UNPERMUTE_FWD], again * micro * sparse, unpermute_cost(&b, FALSE));
    set_ops(&ops[ZP_COMP_UNPERMUTE_BWD], micro * sparse, unpermute_cost(&b, TRUE));
}

gboolean zp_sched_unit_block_op(const ZpModel *model, const ZpPlan *plan, int unit,
                                ZpComputeKind kind, double *flops, double *mem_bytes)
{
    if (uniform_blocks(model))
        return FALSE;
    ZpSchedule s = {.model = *model, .plan = *plan,
                    .elem_bytes = zp_plan_elem_bytes(plan->precision), .stages = 1};
    const Cost c = zp_build_unit_block_cost(&s, unit, kind);
    *flops = c.flops, *mem_bytes = c.mem_bytes;
    return TRUE;
}
