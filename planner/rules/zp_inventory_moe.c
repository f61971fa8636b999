/* zp_inventory_moe: the kernels of a mixture of experts' own ops, as Megatron-Core launches them
 * whatever the framework around them: the experts' grouped GEMMs and activation, and unpermute. */
#include "zp_ep.h"
#include "zp_inventory.h"

#define GROUPED "megatron/core/transformer/moe/experts.py GroupedMLP.forward (grouped_gemm)"
#define UNPERMUTE "megatron/core/transformer/moe/moe_utils.py unpermute"

/* The routed experts over the R tokens this rank's E/EP experts received (the busiest rank's,
 * zp_ep_activations), R / (E/EP) each: fc1 [h, f1_e / t] and fc2 [f_e / t, h] as grouped GEMMs
 * of E/EP problems, the gated activation between them (3 R f_e / t elements moved, 2 plain);
 * backward the data and weight gradients of each and the activation's backward (5, or 3). */
static void experts(const ZpModel *model, const ZpPlan *plan, gboolean backward, ZpInvList *out)
{
    const ZpEpActivations a = zp_ep_activations(model, plan);
    const double e = zp_plan_elem_bytes(plan->precision), h = (double)model->hidden;
    const gboolean gated = zp_model_gated(model);
    const double f = (double)model->moe.expert_ffn / plan->mp, f1 = gated ? 2 * f : f;
    const double local = (double)(model->moe.experts / zp_plan_ep(plan));
    const double m = a.received_tokens / local, R = a.received_tokens;
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
    if (!backward)
        zp_inv_mem(out, "unpermute", Tk * h * e + 4 * Tk, T * h * e, UNPERMUTE);
    else
        zp_inv_mem(out, "unpermute.backward", (T + Tk) * h * e, Tk * h * e + 4 * Tk, UNPERMUTE);
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
