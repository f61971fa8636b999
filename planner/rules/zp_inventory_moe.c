/* zp_inventory_moe: the kernels of a mixture of experts' own ops, as Megatron-Core launches them
 * whatever the framework around them: the experts' grouped GEMMs and activation, and unpermute. */
#include "zp_ep.h"
#include "zp_inventory.h"

#include <string.h>

#define GROUPED "megatron/core/transformer/moe/experts.py GroupedMLP.forward (grouped_gemm)"
#define ROUTER                                                                                 \
    "megatron/core/transformer/moe/router.py TopKRouter.gating (the [E, h] linear); "           \
    "deepspeed/moe/sharded_moe.py TopKGate.forward (self.wg)"
#define TOPK                                                                                   \
    "megatron/core/transformer/moe/moe_utils.py topk_softmax_with_capacity (softmax, topk); "  \
    "deepspeed/moe/sharded_moe.py top2gating / topkgating"
#define PERMUTE                                                                                \
    "megatron/core/transformer/moe/moe_utils.py permute (index_select into expert order, "     \
    "token_dispatcher.py MoEAlltoAllTokenDispatcher.dispatch_preprocess); "                    \
    "deepspeed/moe/sharded_moe.py MOELayer.forward (the dispatch einsum before _AllToAll)"
#define PERMUTE_GATHERED                                                                       \
    "megatron/core/transformer/moe/moe_utils.py permute (index_select of the local experts' "  \
    "rows, token_dispatcher.py MoEAllGatherTokenDispatcher.dispatch_postprocess)"
#define MLA "transformers modeling_deepseek_v3.py DeepseekV3Attention.forward"
#define BLOCK "zp_build_moe.c block_forward (the block's own widths)"
#define UNPERMUTE "megatron/core/transformer/moe/moe_utils.py unpermute"

/* The routed experts over the R tokens this rank's E/EP experts compute (the busiest rank's,
 * zp_ep_activations expert_tokens: received, and gathered over the expert tensor group under
 * sequence parallelism), R / (E/EP) each: fc1 [h, f1_e / t] and fc2 [f_e / t, h] as grouped GEMMs
 * of E/EP problems, the gated activation between them (3 R f_e / t elements moved, 2 plain);
 * backward the data and weight gradients of each and the activation's backward (5, or 3). */
static void experts(const ZpModel *model, const ZpPlan *plan, gboolean backward, ZpInvList *out)
{
    const ZpEpActivations a = zp_ep_activations(model, plan);
    const double e = zp_plan_elem_bytes(plan->precision), h = (double)model->hidden;
    const gboolean gated = zp_model_gated(model);
    const double f = (double)model->moe.expert_ffn / zp_plan_etp(plan), f1 = gated ? 2 * f : f;
    const double local = (double)(model->moe.experts / zp_plan_ep(plan));
    const double m = a.expert_tokens / local, R = a.expert_tokens;
    if (!backward) {
        zp_inv_gemm(out, "experts.fc1", local, m, f1, h, e, e, GROUPED);
        zp_inv_mem(out, gated ? "experts.swiglu" : "experts.activation", (gated ? 2 : 1) * R * f * e,
                   R * f * e, GROUPED);
        zp_inv_gemm(out, "experts.fc2", local, m, h, f, e, e, GROUPED);
        return;
    }
    zp_inv_gemm(out, "experts.fc2.dgrad", local, m, f, h, e, e, GROUPED);
    zp_inv_gemm(out, "experts.fc2.wgrad", local, f, h, m, e, e, GROUPED);
    zp_inv_mem(out, gated ? "experts.swiglu.backward" : "experts.activation.backward",
               (gated ? 3 : 2) * R * f * e, (gated ? 2 : 1) * R * f * e, GROUPED);
    zp_inv_gemm(out, "experts.fc1.dgrad", local, m, h, f1, e, e, GROUPED);
    zp_inv_gemm(out, "experts.fc1.wgrad", local, h, f1, m, e, e, GROUPED);
}

/* Unpermute: the T k returned copies and their fp32 routing weights read, the T tokens written
 * (moe_utils.py unpermute: the probs multiplied in, then scatter_add into token order); its
 * backward reads the tokens' gradient and the copies (for the weights' gradient) and writes
 * the copies' gradients and the weights'. */
static void unpermute(const ZpModel *model, const ZpPlan *plan, gboolean backward,
                      ZpInvList *out)
{
    const ZpEpActivations a = zp_ep_activations(model, plan);
    const double e = zp_plan_elem_bytes(plan->precision), h = (double)model->hidden;
    const double T = a.tokens, Tk = a.routed_tokens;
    if (plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
        /* MoEAllGatherTokenDispatcher.combine_preprocess: zeros for the G gathered rows, the
         * experts' t R outputs scatter-added into them (each read, its row read and written);
         * backward, a gather of the t R rows' gradients. */
        const double G = a.gathered_tokens, tR = a.expert_tokens;
        if (!backward)
            zp_inv_mem(out, "unpermute", 2 * tR * h * e, (G + tR) * h * e, UNPERMUTE);
        else
            zp_inv_mem(out, "unpermute.backward", tR * h * e, tR * h * e, UNPERMUTE);
        return;
    }
    if (!backward)
        zp_inv_mem(out, "unpermute", Tk * h * e + 4 * Tk, T * h * e, UNPERMUTE);
    else
        zp_inv_mem(out, "unpermute.backward", (T + Tk) * h * e, Tk * h * e + 4 * Tk, UNPERMUTE);
}

/* ---- a block by its own widths --------------------------------------------------------- */

/* Forward kernels are listed as built; the backward is derived kernel by kernel from them
 * (each GEMM's data and weight gradients, the attention kernel's backward, each memory-bound
 * kernel's reads and writes twice), as zp_build_unit_block_cost doubles the forward. */
static void gemm(ZpInvList *out, const char *name, double m, double n, double k, double e)
{
    zp_inv_gemm(out, name, 1, m, n, k, e, e, BLOCK);
}

/* Core attention over d_qk-wide scores and d_v-wide values per head (H/t heads on the rank):
 * the fused kernel at the model's attention FLOPs (2 b s^2 H (d_qk + d_v) / t), or eager's
 * scores and context batched GEMMs around the softmax's 2 b H s^2 / t reads and writes. */
static void core_attention(ZpInvList *out, const ZpInvDims *d, double heads, double dqk,
                           double dv)
{
    if (d->fused) {
        ZpInvDims a = *d;
        a.ha = 0.5 * heads * d->mp * (dqk + dv); /* zp_inv_attention's 4 b s^2 ha / t */
        a.heads = heads, a.hd = 0.5 * (dqk + dv);
        zp_inv_attention(out, &a, 0, BLOCK);
        return;
    }
    const double bh = d->b * heads, sc = bh * d->s * d->s;
    zp_inv_gemm(out, "scores", bh, d->s, d->s, dqk, d->e, d->e, BLOCK);
    zp_inv_mem(out, "softmax", sc * d->e, sc * d->e, BLOCK);
    zp_inv_gemm(out, "context", bh, d->s, dv, d->s, d->e, d->e, BLOCK);
}

static void block_forward(const ZpModel *model, const ZpPlan *plan, int unit, ZpInvList *out)
{
    ZpInvDims d;
    zp_inventory_dims(model, plan, &d);
    const double T = d.t, h = d.h, t = d.mp, e = d.e, H = (double)model->heads;
    const double th = d.t_norm * h * e; /* a norm's or residual add's tensor */
    zp_inv_mem(out, "input_norm", th, th, BLOCK);
    const ZpMla *mla = &model->mla;
    if (zp_mla_enabled(mla)) {
        const double rq = (double)mla->q_lora_rank, rkv = (double)mla->kv_lora_rank;
        const double rope = (double)mla->qk_rope_dim, dqk = (double)mla->qk_nope_dim + rope;
        const double dv = (double)mla->v_dim;
        if (rq > 0) {
            gemm(out, "q_a_proj", T, rq, h, e);
            zp_inv_mem(out, "q_a_layernorm", T * rq * e, T * rq * e, MLA);
            gemm(out, "q_b_proj", T, H * dqk / t, rq, e);
        } else {
            gemm(out, "q_proj", T, H * dqk / t, h, e);
        }
        gemm(out, "kv_a_proj_with_mqa", T, rkv + rope, h, e);
        zp_inv_mem(out, "kv_a_layernorm", T * rkv * e, T * rkv * e, MLA);
        gemm(out, "kv_b_proj", T, H * ((double)mla->qk_nope_dim + dv) / t, rkv, e);
        core_attention(out, &d, H / t, dqk, dv);
        gemm(out, "o_proj", T, h, H * dv / t, e);
    } else {
        gemm(out, "qkv", T, (double)zp_model_qkv_width(model) / t, h, e);
        zp_inv_qk_norm(out, &d, 0, BLOCK); /* Qwen3's q_norm and k_norm */
        core_attention(out, &d, H / t, d.hd, d.hd);
        gemm(out, "proj", T, h, d.ha / t, e);
    }
    zp_inv_mem(out, "residual_add", 2 * th, th, BLOCK);
    zp_inv_mem(out, "post_attention_norm", th, th, BLOCK);
    const gboolean sparse = zp_moe_enabled(&model->moe) && zp_model_unit_sparse(model, unit);
    const double f = (double)(sparse ? model->moe.shared_ffn : model->ffn_hidden) / t;
    if (f > 0) {
        gemm(out, sparse ? "shared_experts.fc1" : "fc1", T, (d.gated ? 2 : 1) * f, h, e);
        zp_inv_mem(out, d.gated ? "swiglu" : "activation", (d.gated ? 2 : 1) * T * f * e,
                   T * f * e, BLOCK);
        gemm(out, sparse ? "shared_experts.fc2" : "fc2", T, h, f, e);
    }
    if (sparse) {
        /* The router is whole on every tensor rank (TopKRouter is not split), over the rank's
         * own tokens (T_r: the sequence's t-th with sequence parallelism, d.t_norm), its
         * logits [T_r, E]; softmax and top-k read them and write the probabilities (the
         * scores kept for the combine); permute reads the T_r tokens and writes their T_r k
         * copies. */
        const double E = (double)model->moe.experts, k = (double)model->moe.top_k;
        const double Tr = d.t_norm;
        zp_inv_gemm(out, "router", 1, Tr, E, h, e, e, ROUTER);
        zp_inv_mem(out, "router.softmax_topk", Tr * E * e, Tr * E * e, TOPK);
        if (plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
            /* the experts' t R rows picked out of the gathered tokens (dispatch_postprocess) */
            const double tR = zp_ep_activations(model, plan).expert_tokens;
            zp_inv_mem(out, "permute", tR * h * e, tR * h * e, PERMUTE_GATHERED);
        } else {
            zp_inv_mem(out, "permute", Tr * h * e, Tr * k * h * e, PERMUTE);
        }
    }
    zp_inv_mem(out, "residual_add", 2 * th, th, BLOCK);
}

void zp_inventory_moe_block(const ZpModel *model, const ZpPlan *plan, int unit, gboolean backward,
                            ZpInvList *out)
{
    out->n = 0;
    if (!zp_moe_enabled(&model->moe) && !zp_mla_enabled(&model->mla))
        return;
    if (!backward) {
        block_forward(model, plan, unit, out);
        return;
    }
    ZpInvList fwd = {0};
    block_forward(model, plan, unit, &fwd);
    const double e = zp_plan_elem_bytes(plan->precision);
    for (int i = 0; i < fwd.n; i++) {
        const ZpInvKernel *x = &fwd.k[i];
        if (x->cls == ZP_KCLASS_GEMM) { /* dgrad [m, k] = [m, n] [n, k]; wgrad [k, n] over m */
            zp_inv_gemm(out, x->name, x->batch, x->m, x->k, x->n, e, e, x->source);
            zp_inv_gemm(out, x->name, x->batch, x->k, x->n, x->m, e, e, x->source);
        } else if (x->cls == ZP_KCLASS_ATTENTION) {
            ZpInvKernel b = *x;
            b.backward = 1, b.flops = 2 * x->flops, b.name = "attention_bwd";
            b.read_bytes = x->read_bytes + 2 * x->write_bytes, b.write_bytes = x->read_bytes;
            g_assert(out->n < ZP_INV_MAX);
            out->k[out->n++] = b;
        } else {
            zp_inv_mem(out, x->name, 2 * x->read_bytes, 2 * x->write_bytes, x->source);
        }
    }
}

void zp_inventory_moe_op(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                         ZpInvList *out)
{
    if (!zp_moe_enabled(&model->moe))
        return;
    if (kind == ZP_COMP_EXPERT_FWD || kind == ZP_COMP_EXPERT_BWD)
        experts(model, plan, kind == ZP_COMP_EXPERT_BWD, out);
    else if (kind == ZP_COMP_UNPERMUTE_FWD || kind == ZP_COMP_UNPERMUTE_BWD)
        unpermute(model, plan, kind == ZP_COMP_UNPERMUTE_BWD, out);
}
