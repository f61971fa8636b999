/* zp_mem_terms: model states follow the ZeRO paper's formulas term by term, in double: 1e15
 * parameters x 16 bytes is 1.6e16, exact in a double's 53-bit mantissa for our inputs. */
#include "zp_mem_terms.h"

#include <math.h>

ZpModelStates zp_mem_model_states(double params, int stage, int dp, int mp, ZpStateBytes bytes)
{
    const double psi = params / mp, n = dp;
    ZpModelStates m;
    m.params_bytes = bytes.param_bytes * psi / (stage >= 3 ? n : 1.0);
    m.grads_bytes = bytes.grad_bytes * psi / (stage >= 2 ? n : 1.0);
    m.optim_bytes = bytes.optim_bytes * psi / (stage >= 1 ? n : 1.0);
    m.total_bytes = m.params_bytes + m.grads_bytes + m.optim_bytes;
    return m;
}

double zp_mem_max_params(double budget_bytes, int stage, int dp, int mp, ZpStateBytes bytes)
{
    /* Model states are linear in psi: bytes(psi) = psi * bytes(1). */
    const ZpModelStates per_param = zp_mem_model_states(1.0, stage, dp, mp, bytes);
    return budget_bytes / per_param.total_bytes;
}

uint64_t zp_mem_padded_elems(uint64_t elems, uint64_t multiple)
{
    return multiple ? (elems + multiple - 1) / multiple * multiple : elems;
}

/* The block's bytes with the replicated terms (norms, dropout masks) divided by `spread`:
 * 1 without sequence parallelism, t with it. */
static double block_bytes(const ZpModel *model, int micro_batch, int mp, double elem_bytes,
                          ZpAttention attention, double spread, gboolean selective)
{
    const double s = model->seq_len, b = micro_batch, h = model->hidden, a = model->heads;
    const double t = mp, f = model->ffn_hidden;
    const double kd = (double)zp_model_kv_heads(model) * (double)zp_model_head_dim(model);
    /* Korthikanti's Q and the attention output before proj are a d wide (h when d = h/a). */
    const double ha = (double)zp_model_attn_width(model);
    const double replicated = model->parallel_residual ? 3 * h : 4 * h;
    const double split = 2 * ha + 2 * kd + (zp_model_gated(model) ? 3 : 2) * f;
    const gboolean fused = zp_attention_fused(attention);
    /* Selective recomputation saves core attention's inputs only (Q, K, V, counted in
     * `split`): its s x s tensors, or a fused kernel's log-sum-exp, are recomputed. */
    const double scores =
        fused || selective ? 0.0 : (model->dropout ? 5.0 : 2.0) * a * s * s * b / t;
    const double masks = model->dropout ? 2.0 * s * b * h / spread : 0.0;
    const double sixteen_bit = 2.0 * s * b * (replicated / spread + split / t) + masks + scores;
    const double lse = fused && !selective ? 4.0 * a * s * b / t : 0.0;
    /* Each LayerNorm keeps its fp32 mean and 1/std per token for backward (PyTorch's
     * native_layer_norm, as zreal's real_gpt), replicated like the norm's input; RMSNorm's
     * inverse root is recomputed. */
    const double ln_stats = model->norm == ZP_NORM_LAYERNORM ? 2 * 8.0 * s * b / spread : 0.0;
    return sixteen_bit * elem_bytes / 2.0 + lse + ln_stats;
}

double zp_mem_activation_block_bytes(const ZpModel *model, int micro_batch, int mp,
                                     double elem_bytes, ZpAttention attention)
{
    return block_bytes(model, micro_batch, mp, elem_bytes, attention, 1.0, FALSE);
}

double zp_mem_plan_activation_block_bytes(const ZpModel *model, const ZpPlan *plan)
{
    return block_bytes(model, plan->micro_batch, plan->mp, zp_plan_elem_bytes(plan->precision),
                       plan->attention, plan->sequence_parallel ? plan->mp : 1.0,
                       plan->selective_recompute && !plan->checkpoint);
}

double zp_mem_core_attention_bytes(const ZpModel *model, const ZpPlan *plan)
{
    if (!plan->selective_recompute || plan->checkpoint)
        return 0.0;
    const double spread = plan->sequence_parallel ? plan->mp : 1.0;
    const double elem = zp_plan_elem_bytes(plan->precision);
    return block_bytes(model, plan->micro_batch, plan->mp, elem, plan->attention, spread, FALSE) -
           block_bytes(model, plan->micro_batch, plan->mp, elem, plan->attention, spread, TRUE);
}

double zp_mem_checkpoint_bytes(const ZpModel *model, const ZpPlan *plan)
{
    return (double)model->seq_len * plan->micro_batch * (double)model->hidden *
           zp_plan_elem_bytes(plan->precision) / (plan->sequence_parallel ? plan->mp : 1);
}
