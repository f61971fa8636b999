/* zp_cost: a compute op's kernels as real/real_gpt.c issues them, and their time from the
 * profile's op table, or the roofline where the profile has no table. */
#include "zp_cost.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

/* ---- the kernels of each op, mirroring real_gpt.c ---- */

/* Sizes of one op's tensors on this rank: tokens, widths split by mp. */
typedef struct {
    double b, s, t, h, hd, heads, kvd, q, f, f1, v, mp;
    gboolean bias_qkv, bias_proj, bias_mlp, rope, learned, rms, swiglu, fused;
    gboolean save;
    double block_elems, embed_elems, norm_elems;
    double attention_share; /* of the s^2 pairs a fused kernel computes (sliding windows) */
} Dims;

static Dims dims(const ZpModel *m, const ZpPlan *p)
{
    const double mp = p->mp;
    Dims d = {.b = p->micro_batch, .s = (double)m->seq_len, .h = (double)m->hidden, .mp = mp};
    d.t = d.b * d.s;
    d.hd = (double)zp_model_head_dim(m);
    d.heads = (double)m->heads / mp;
    d.kvd = (double)zp_model_kv_heads(m) * d.hd / mp;
    d.q = (double)zp_model_qkv_width(m) / mp;
    d.f = (double)m->ffn_hidden / mp;
    d.f1 = (double)zp_model_fc1_width(m) / mp;
    d.v = (double)m->vocab / mp;
    d.bias_qkv = zp_model_has_bias(m, ZP_NO_BIAS_QKV);
    d.bias_proj = zp_model_has_bias(m, ZP_NO_BIAS_PROJ);
    d.bias_mlp = zp_model_has_bias(m, ZP_NO_BIAS_MLP);
    d.rope = m->rope_theta > 0;
    d.learned = m->learned_positions;
    d.rms = m->norm == ZP_NORM_RMSNORM;
    d.swiglu = zp_model_gated(m);
    d.fused = zp_attention_fused(p->attention);
    d.attention_share = d.fused ? zp_model_attention_share(m) : 1.0;
    d.block_elems = (double)zp_model_unit_elems(m, 1) / mp;
    d.embed_elems = (double)zp_model_unit_elems(m, 0) / mp;
    d.norm_elems = d.rms ? d.h : 2 * d.h;
    return d;
}

static void add(ZpKernels *out, ZpKernel k)
{
    g_assert(out->n < ZP_COST_MAX_KERNELS);
    out->k[out->n++] = k;
}

static void gemm(ZpKernels *out, ZpGemmForm form, double m, double n, double k)
{
    add(out, (ZpKernel){.kind = ZP_KERNEL_GEMM, .sub = form, .m = m, .n = n, .k = k,
                        .flops = 2 * m * n * k});
}

static void ew(ZpKernels *out, ZpEwClass c, double bytes, double accesses)
{
    add(out, (ZpKernel){.kind = ZP_KERNEL_EW, .sub = c, .bytes = bytes, .accesses = accesses});
}

/* real_gpt_keep: round an fp32 activation to bf16 in place, and store it when saving. */
static void keep(ZpKernels *out, const Dims *d, double elems)
{
    ew(out, ZP_EW_CONVERT, 8 * elems, 0);
    if (d->save)
        ew(out, ZP_EW_CONVERT, 6 * elems, 0);
}

/* y = x W (+ bias): the bias add reads and writes y in fp32 (a GEMM epilogue in a framework,
 * hence no accesses). */
static void linear_fwd(ZpKernels *out, const Dims *d, double n, double k, gboolean bias)
{
    gemm(out, ZP_GEMM_FORWARD, d->t, n, k);
    if (bias)
        ew(out, ZP_EW_BIAS_FWD, 8 * d->t * n, 0);
}

/* dW += x^T dy with the bias gradient (reads dy), then dx = dy W^T. */
static void linear_bwd(ZpKernels *out, const Dims *d, double n, double k, gboolean bias)
{
    gemm(out, ZP_GEMM_WEIGHT_GRAD, k, n, d->t);
    if (bias)
        ew(out, ZP_EW_BIAS_BWD, 4 * d->t * n, d->t * n);
    gemm(out, ZP_GEMM_INPUT_GRAD, d->t, k, n);
}

/* The attention kernel: the model's 4bs^2h/mp FLOPs forward (a fused kernel's share of them
 * under a sliding window), twice that backward; the eager kernel's softmax reads and writes
 * the b a s^2 scores (forward 2, backward 3 accesses). */
static void attention(ZpKernels *out, const Dims *d, int backward)
{
    const double scores = d->b * d->heads * d->s * d->s;
    add(out, (ZpKernel){.kind = ZP_KERNEL_ATTENTION, .sub = backward,
                        .flops = (backward ? 8 : 4) * d->b * d->s * d->s * d->h / d->mp *
                                 d->attention_share,
                        .accesses = d->fused ? 0 : (backward ? 3 : 2) * scores});
}

/* Rotary embedding of the query and key heads: reads and writes them in fp32. */
static void rope(ZpKernels *out, const Dims *d)
{
    if (d->rope)
        ew(out, ZP_EW_ROPE, 8 * d->t * (d->heads * d->hd + d->kvd), 0);
}

/* real_gpt_block_fwd_compute. */
static void block_fwd(ZpKernels *out, const Dims *d)
{
    const double th = d->t * d->h;
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
    if (d->save)
        ew(out, ZP_EW_CONVERT, 4 * th, 0);
    ew(out, ZP_EW_NORM_FWD, 8 * th, 2 * th);
    keep(out, d, th);
    linear_fwd(out, d, d->q, d->h, d->bias_qkv);
    rope(out, d);
    keep(out, d, d->t * d->q);
    attention(out, d, 0);
    keep(out, d, th / d->mp);
    linear_fwd(out, d, d->h, d->h / d->mp, d->bias_proj);
    ew(out, ZP_EW_ADD, 12 * th, 3 * th);
    keep(out, d, th);
    ew(out, ZP_EW_NORM_FWD, 8 * th, 2 * th);
    keep(out, d, th);
    linear_fwd(out, d, d->f1, d->h, d->bias_mlp);
    keep(out, d, d->t * d->f1);
    ew(out, ZP_EW_ACT_FWD, (d->swiglu ? 12 : 8) * d->t * d->f, (d->swiglu ? 3 : 2) * d->t * d->f);
    keep(out, d, d->t * d->f);
    linear_fwd(out, d, d->h, d->f, d->bias_mlp);
    ew(out, ZP_EW_ADD, 12 * th, 3 * th);
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
}

/* real_gpt_block_bwd_compute: the norm backward reads dy, x and the residual gradient it
 * accumulates into, and writes it (4 accesses: the residual add rides in it). */
static void block_bwd(ZpKernels *out, const Dims *d)
{
    const double th = d->t * d->h, tf = d->t * d->f;
    ew(out, ZP_EW_CONVERT, 4 * d->block_elems, 0);
    linear_bwd(out, d, d->h, d->f, d->bias_mlp);
    ew(out, ZP_EW_CONVERT, 6 * d->t * d->f1, 0);
    ew(out, ZP_EW_ACT_BWD, (d->swiglu ? 20 : 12) * tf, (d->swiglu ? 5 : 3) * tf);
    linear_bwd(out, d, d->f1, d->h, d->bias_mlp);
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
    ew(out, ZP_EW_CONVERT, 8 * th, 0);
    ew(out, ZP_EW_NORM_BWD, 16 * th, 4 * th);
    linear_bwd(out, d, d->h, d->h / d->mp, d->bias_proj);
    ew(out, ZP_EW_CONVERT, 6 * d->t * d->q, 0);
    if (d->fused)
        ew(out, ZP_EW_CONVERT, 6 * th / d->mp, 0);
    attention(out, d, 1);
    rope(out, d);
    linear_bwd(out, d, d->q, d->h, d->bias_qkv);
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
    ew(out, ZP_EW_CONVERT, 8 * th, 0);
    ew(out, ZP_EW_NORM_BWD, 16 * th, 4 * th);
    ew(out, ZP_EW_CONVERT, 8 * d->block_elems, 0);
}

/* real_gpt_head_compute: final norm, logits, loss, dwte, dy, the norm's backward. */
static void head(ZpKernels *out, const Dims *d)
{
    const double th = d->t * d->h;
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
    ew(out, ZP_EW_NORM_FWD, 8 * th, 2 * th);
    ew(out, ZP_EW_CONVERT, 8 * th, 0);
    gemm(out, ZP_GEMM_FORWARD, d->t, d->v, d->h);
    ew(out, ZP_EW_LOSS, 20 * d->t * d->v, 4 * d->t * d->v);
    gemm(out, ZP_GEMM_WEIGHT_GRAD, d->v, d->h, d->t);
    ew(out, ZP_EW_CONVERT, 8 * d->v * d->h, 0);
    gemm(out, ZP_GEMM_INPUT_GRAD, d->t, d->h, d->v);
    ew(out, ZP_EW_CONVERT, 4 * (2 * d->h + th), 0);
    ew(out, ZP_EW_NORM_BWD, 16 * th, 4 * th);
    ew(out, ZP_EW_CONVERT, 8 * d->norm_elems, 0);
}

/* real_gpt_embed_forward / _backward: the lookup reads the bf16 token (and position) rows
 * and writes fp32; the backward zeroes the unit's fp32 gradients, adds every token's
 * gradient into its rows, and accumulates them into the bf16 gradients. */
static void embed(ZpKernels *out, const Dims *d, gboolean backward)
{
    const double th = d->t * d->h;
    if (!backward) {
        ew(out, ZP_EW_EMBED, (d->learned ? 8 : 6) * th, 3 * th);
        ew(out, ZP_EW_CONVERT, 6 * th, 0);
        return;
    }
    ew(out, ZP_EW_CONVERT, 4 * d->embed_elems, 0);
    ew(out, ZP_EW_EMBED, (d->learned ? 20 : 12) * th, 3 * th);
    ew(out, ZP_EW_CONVERT, 8 * d->embed_elems, 0);
}

void zp_cost_kernels(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                     ZpKernels *out)
{
    Dims d = dims(model, plan);
    out->n = 0;
    switch (kind) {
    case ZP_COMP_EMBED_FWD:
        embed(out, &d, FALSE);
        break;
    case ZP_COMP_BLOCK_FWD:
        d.save = !plan->checkpoint;
        block_fwd(out, &d);
        break;
    case ZP_COMP_RECOMPUTE:
        d.save = TRUE;
        block_fwd(out, &d);
        break;
    case ZP_COMP_HEAD:
        head(out, &d);
        break;
    case ZP_COMP_BLOCK_BWD:
        block_bwd(out, &d);
        break;
    case ZP_COMP_EMBED_BWD:
        embed(out, &d, TRUE);
        break;
    case ZP_COMP_OPTIMIZER:
    case ZP_COMP_CPU_OPTIMIZER:
    case ZP_COMP_HOST_COPY: /* the host link's, not a kernel's (sim_engine) */
    case ZP_COMP_QUANTIZE:  /* ZeRO++'s: bytes vary per op (zp_cost_op_s) */
    case ZP_COMP_N:
        break;
    }
}

double zp_cost_accesses(const ZpKernels *kernels)
{
    double total = 0;
    for (int i = 0; i < kernels->n; i++)
        total += kernels->k[i].accesses;
    return total;
}

/* ---- times ---- */

double zp_cost_kernel_s(const ZpCost *c, const ZpKernel *k)
{
    const ZpOpTable *t = &c->hw->op_costs;
    double rate = 0, work = k->flops;
    if (k->kind == ZP_KERNEL_GEMM) {
        double x, y;
        zp_gemm_coords(k->m, k->n, k->k, &x, &y);
        rate = zp_grid_at(&t->gemm[k->sub], x, y);
    } else if (k->kind == ZP_KERNEL_ATTENTION && c->attn_flops_per_s > 0) {
        rate = c->attn_flops_per_s;
    } else if (k->kind == ZP_KERNEL_ATTENTION) {
        rate = zp_grid_at(&t->eager_attention[k->sub], c->log2_seq, c->log2_head_dim);
    } else {
        rate = t->ew_bytes_per_s[k->sub];
        work = k->bytes;
    }
    return t->launch_s + work / rate;
}

static double kernels_s(const ZpCost *c, const ZpKernels *ks)
{
    double total = 0;
    for (int i = 0; i < ks->n; i++)
        total += zp_cost_kernel_s(c, &ks->k[i]);
    return total;
}

/* Why the table cannot cost this plan, or NULL when it can. */
static const char *table_gap(const ZpHw *hw, const ZpModel *model, const ZpPlan *plan)
{
    if (!hw->op_costs.present)
        return "the profile has no op_costs table";
    if (!zp_model_has_architecture(model))
        return "the model has no architecture (its ops have no shapes)";
    if (!zp_attention_fused(plan->attention) && !hw->op_costs.has_eager_attention)
        return "the op table has no eager_attention rates";
    return NULL;
}

gboolean zp_cost_init(ZpCost *c, const ZpHw *hw, const ZpModel *model, const ZpPlan *plan,
                      GError **error)
{
    memset(c, 0, sizeof *c);
    c->hw = hw;
    c->peak_flops = zp_hw_peak_flops(hw, plan->precision);
    if (c->peak_flops <= 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s (%s) has no %s peak in its profile",
                    hw->name, hw->gpu, zp_precision_name(plan->precision));
        return FALSE;
    }
    if (zp_attention_fused(plan->attention)) {
        c->attn_flops_per_s = zp_hw_attention_flops_per_s(
            hw, plan->attention, (double)zp_model_head_dim(model), (double)model->seq_len);
        if (c->attn_flops_per_s <= 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "attention: %s has no rate for '%s' in its attention table", hw->name,
                        zp_attention_name(plan->attention));
            return FALSE;
        }
    }
    const char *gap = table_gap(hw, model, plan);
    if (gap) {
        g_snprintf(c->why, sizeof c->why, "roofline: %s", gap);
        return TRUE;
    }
    c->table = TRUE;
    c->log2_seq = log2((double)model->seq_len);
    c->log2_head_dim = log2((double)zp_model_head_dim(model));
    g_snprintf(c->why, sizeof c->why, "op table (%s)", hw->op_costs.source);
    for (int k = 0; k < ZP_COMP_N; k++) {
        ZpKernels ks;
        zp_cost_kernels(model, plan, (ZpComputeKind)k, &ks);
        c->kind_s[k] = k == ZP_COMP_OPTIMIZER ? hw->op_costs.launch_s : kernels_s(c, &ks);
    }
    return TRUE;
}

double zp_cost_op_s(const ZpCost *c, ZpComputeKind kind, double flops, double gemm_flops,
                    double attn_flops, double mem_bytes)
{
    const gboolean optimizer = kind == ZP_COMP_OPTIMIZER;
    /* ZeRO++'s (de)quantisation kernels move bytes that differ op by op (a bucket's, a
     * unit's), so they stay on the roofline's memory rate even with an op table. */
    if (!c->table || kind == ZP_COMP_QUANTIZE)
        return zp_hw_compute_time_s(c->hw, c->peak_flops, flops, gemm_flops, attn_flops,
                                    c->attn_flops_per_s, mem_bytes, optimizer);
    return c->kind_s[kind] +
           (optimizer ? mem_bytes / c->hw->op_costs.optimizer_bytes_per_s : 0);
}

double zp_cost_contention(const ZpCost *c, int overlapping)
{
    return c->table && overlapping > 0 ? c->hw->op_costs.contention : 1.0;
}
