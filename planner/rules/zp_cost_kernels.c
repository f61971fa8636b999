/* zp_cost_kernels: a compute op's kernels as real/real_gpt.c issues them, with the workspace
 * they hold; their time is zp_cost's. */
#include "zp_cost_kernels.h"

#include <math.h>
#include <string.h>

/* ---- the kernels of each op, mirroring real_gpt.c ---- */

/* Sizes of one op's tensors on this rank: tokens, widths split by mp. */
typedef struct {
    double b, s, t, h, hd, heads, kvd, q, f, f1, v, mp;
    double ha; /* heads x hd over all ranks: h unless head_dim differs */
    gboolean bias_qkv, bias_proj, bias_mlp, rope, learned, rms, swiglu, fused;
    gboolean save;
    gboolean selective; /* the recompute op is core attention alone (selective) */
    double block_elems, embed_elems, norm_elems;
    double attention_share; /* of the s^2 pairs a fused kernel computes (sliding windows) */
} Dims;

static Dims dims(const ZpModel *m, const ZpPlan *p)
{
    const double mp = p->mp;
    Dims d = {.b = p->micro_batch, .s = (double)m->seq_len, .h = (double)m->hidden, .mp = mp};
    d.t = d.b * d.s;
    d.hd = (double)zp_model_head_dim(m);
    d.ha = (double)zp_model_attn_width(m);
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
    d.fused = zp_plan_attention_rated(p); /* time: an unrated fused kernel as eager's */
    d.selective = p->selective_recompute && !p->checkpoint;
    d.attention_share = d.fused ? zp_model_attention_share(m) : 1.0;
    /* The rank's shards as real_gpt_unit_elems counts them: the norms, the row-parallel
     * biases and the position table are whole on every tensor rank. */
    d.block_elems = (double)zp_model_unit_tp_elems(m, 1, p->mp);
    d.embed_elems = (double)zp_model_unit_tp_elems(m, 0, p->mp);
    d.norm_elems = d.rms ? d.h : 2 * d.h;
    return d;
}

static void add(ZpKernels *out, ZpKernel k)
{
    g_assert(out->n < ZP_COST_MAX_KERNELS);
    k.module = out->module;
    out->k[out->n++] = k;
}

static void gemm(ZpKernels *out, ZpGemmForm form, double m, double n, double k)
{
    add(out, (ZpKernel){.kind = ZP_KERNEL_GEMM, .sub = form, .m = m, .n = n, .k = k,
                        .flops = 2 * m * n * k});
}

static void head_gemm(ZpKernels *out, ZpGemmForm form, double m, double n, double k)
{
    gemm(out, form, m, n, k);
    out->k[out->n - 1].head = TRUE;
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
                        .flops = (backward ? 8 : 4) * d->b * d->s * d->s * d->ha / d->mp *
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
    out->module = ZP_MOD_LN1;
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
    if (d->save)
        ew(out, ZP_EW_CONVERT, 4 * th, 0);
    ew(out, ZP_EW_NORM_FWD, 8 * th, 2 * th);
    keep(out, d, th);
    out->module = ZP_MOD_QKV;
    linear_fwd(out, d, d->q, d->h, d->bias_qkv);
    rope(out, d);
    keep(out, d, d->t * d->q);
    attention(out, d, 0);
    keep(out, d, th / d->mp);
    out->module = ZP_MOD_PROJ;
    linear_fwd(out, d, d->h, d->ha / d->mp, d->bias_proj);
    ew(out, ZP_EW_ADD, 12 * th, 3 * th);
    keep(out, d, th);
    out->module = ZP_MOD_LN2;
    ew(out, ZP_EW_NORM_FWD, 8 * th, 2 * th);
    keep(out, d, th);
    out->module = ZP_MOD_FC1;
    linear_fwd(out, d, d->f1, d->h, d->bias_mlp);
    keep(out, d, d->t * d->f1);
    ew(out, ZP_EW_ACT_FWD, (d->swiglu ? 12 : 8) * d->t * d->f, (d->swiglu ? 3 : 2) * d->t * d->f);
    keep(out, d, d->t * d->f);
    out->module = ZP_MOD_FC2;
    linear_fwd(out, d, d->h, d->f, d->bias_mlp);
    ew(out, ZP_EW_ADD, 12 * th, 3 * th);
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
}

/* real_gpt_block_bwd_compute: the norm backward reads dy, x and the residual gradient it
 * accumulates into, and writes it (4 accesses: the residual add rides in it). */
static void block_bwd(ZpKernels *out, const Dims *d)
{
    const double th = d->t * d->h, tf = d->t * d->f;
    out->module = ZP_MOD_FC2;
    ew(out, ZP_EW_CONVERT, 4 * d->block_elems, 0);
    linear_bwd(out, d, d->h, d->f, d->bias_mlp);
    ew(out, ZP_EW_CONVERT, 6 * d->t * d->f1, 0);
    ew(out, ZP_EW_ACT_BWD, (d->swiglu ? 20 : 12) * tf, (d->swiglu ? 5 : 3) * tf);
    out->module = ZP_MOD_FC1;
    linear_bwd(out, d, d->f1, d->h, d->bias_mlp);
    out->module = ZP_MOD_LN2;
    ew(out, ZP_EW_CONVERT, 6 * th, 0);
    ew(out, ZP_EW_CONVERT, 8 * th, 0);
    ew(out, ZP_EW_NORM_BWD, 16 * th, 4 * th);
    out->module = ZP_MOD_PROJ;
    linear_bwd(out, d, d->h, d->ha / d->mp, d->bias_proj);
    ew(out, ZP_EW_CONVERT, 6 * d->t * d->q, 0);
    if (d->fused)
        ew(out, ZP_EW_CONVERT, 6 * th / d->mp, 0);
    attention(out, d, 1);
    rope(out, d);
    out->module = ZP_MOD_QKV;
    linear_bwd(out, d, d->q, d->h, d->bias_qkv);
    out->module = ZP_MOD_LN1;
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
    head_gemm(out, ZP_GEMM_FORWARD, d->t, d->v, d->h);
    ew(out, ZP_EW_LOSS, 20 * d->t * d->v, 4 * d->t * d->v);
    head_gemm(out, ZP_GEMM_WEIGHT_GRAD, d->v, d->h, d->t);
    ew(out, ZP_EW_CONVERT, 8 * d->v * d->h, 0);
    head_gemm(out, ZP_GEMM_INPUT_GRAD, d->t, d->h, d->v);
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
    out->module = 0;
    switch (kind) {
    case ZP_COMP_EMBED_FWD:
        embed(out, &d, FALSE);
        break;
    case ZP_COMP_BLOCK_FWD:
        d.save = !plan->checkpoint;
        block_fwd(out, &d);
        break;
    case ZP_COMP_RECOMPUTE:
        if (d.selective) { /* Megatron's selective recomputation: core attention alone */
            out->module = ZP_MOD_QKV;
            attention(out, &d, 0);
            break;
        }
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
    case ZP_COMP_UNPACK:    /* a coalesced gather's copies: likewise */
    case ZP_COMP_EXPERT_FWD: /* a sparse block's: sized by its routed tokens (zp_ep) */
    case ZP_COMP_EXPERT_BWD:
    case ZP_COMP_UNPERMUTE_FWD:
    case ZP_COMP_UNPERMUTE_BWD:
    case ZP_COMP_N:
        break;
    }
}

/* Tensor parallelism (mp > 1): what an op holds beside its own workspace while it runs.
 * Every sum over the tensor group (real_tp.c real_tp_reduce) rounds its T h fp32 values
 * into a bf16 buffer of T h, all-reduces that and widens it back, inside the op that sums:
 * the embedding's lookup, a block's row-parallel proj and fc2 outputs and the input
 * gradients of its column-parallel fc1 and qkv, the head's dy. The embedding's forward then
 * adds the whole position table's rows in an fp32 buffer of T h (real_gpt_embed_fwd_tp
 * wpe_rows, after the sum), and its backward zeroes the other ranks' tokens in a copy of
 * dx0 (real_gpt_embed_bwd_tp dx). */
static double tp_workspace_bytes(const Dims *d, ZpComputeKind kind)
{
    const double sum = 2 * d->t * d->h;
    if (d->mp <= 1)
        return 0;
    switch (kind) {
    case ZP_COMP_EMBED_FWD:
        return d->learned ? MAX(sum, 4 * d->t * d->h) : sum;
    case ZP_COMP_EMBED_BWD:
        return 4 * d->t * d->h;
    case ZP_COMP_BLOCK_FWD:
    case ZP_COMP_RECOMPUTE:
    case ZP_COMP_HEAD:
    case ZP_COMP_BLOCK_BWD:
        return sum;
    default:
        return 0;
    }
}

static double own_workspace_bytes(const Dims *d, ZpComputeKind kind)
{
    switch (kind) {
    case ZP_COMP_EMBED_FWD:
        return 4 * d->t * d->h;
    case ZP_COMP_BLOCK_FWD:
    case ZP_COMP_RECOMPUTE:
        return 4 * (d->t * (3 * d->h + d->q + d->f1 + d->f + 4) + d->b * d->heads * d->s);
    case ZP_COMP_HEAD:
        return 4 * (d->t * (2 * d->h + 2) + d->h * (d->v + 2));
    case ZP_COMP_BLOCK_BWD:
        return 4 * (d->block_elems + d->t * (2 * d->f1 + 3 * d->h + 2 * d->q));
    case ZP_COMP_EMBED_BWD:
        return 4 * d->embed_elems;
    default:
        return 0;
    }
}

double zp_cost_op_workspace_bytes(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind)
{
    const Dims d = dims(model, plan);
    return own_workspace_bytes(&d, kind) + tp_workspace_bytes(&d, kind);
}

double zp_cost_resident_workspace_bytes(const ZpModel *model, const ZpPlan *plan)
{
    const Dims d = dims(model, plan);
    const double panel_elems = 8388608; /* real_cpu.c's REAL_CPU_GEMM_PANEL_ELEMS */
    double a = 0, b = 0;
    for (int kind = 0; kind < ZP_COMP_N; kind++) {
        ZpKernels ks;
        zp_cost_kernels(model, plan, (ZpComputeKind)kind, &ks);
        for (int i = 0; i < ks.n; i++) {
            const ZpKernel *k = &ks.k[i];
            if (k->kind != ZP_KERNEL_GEMM)
                continue;
            if (k->sub == ZP_GEMM_WEIGHT_GRAD && kind == ZP_COMP_BLOCK_BWD) /* bf16 x^T */
                a = MAX(a, k->m * k->k);
            else if (k->sub != ZP_GEMM_WEIGHT_GRAD) /* bf16 weights */
                b = MAX(b, MAX(1.0, MIN(k->n, floor(panel_elems / k->k))) * k->k);
        }
    }
    /* memory: zreal's blockwise kernel for any fused name */
    const double tile = zp_attention_fused(plan->attention)
                            ? (double)zp_model_head_dim(model) + 32
                            : 2 * d.s * d.s;
    return 2 * d.t * d.h + 4 * d.t * d.h + 4 * (a + b + tile);
}

/* Fractions of a total per module; an empty total is all in the first module. */
static void normalise(double share[ZP_MOD_N])
{
    double total = 0;
    for (int m = 0; m < ZP_MOD_N; m++)
        total += share[m];
    for (int m = 0; m < ZP_MOD_N; m++)
        share[m] = total > 0 ? share[m] / total : m == 0;
}

void zp_cost_kernel_shares(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                           ZpKernelTimeFn kernel_s, const void *ctx, ZpModuleShares *out)
{
    ZpKernels ks;
    zp_cost_kernels(model, plan, kind, &ks);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ks.n; i++) {
        const ZpKernel *k = &ks.k[i];
        out->flops[k->module] += k->kind == ZP_KERNEL_EW ? 0 : k->flops;
        out->attn_flops[k->module] += k->kind == ZP_KERNEL_ATTENTION ? k->flops : 0;
        out->accesses[k->module] += k->accesses;
        out->time[k->module] += kernel_s ? kernel_s(ctx, k) : 0;
    }
    normalise(out->flops);
    normalise(out->attn_flops);
    normalise(out->accesses);
    normalise(out->time);
}

double zp_cost_accesses(const ZpKernels *kernels)
{
    double total = 0;
    for (int i = 0; i < kernels->n; i++)
        total += kernels->k[i].accesses;
    return total;
}

void zp_cost_op_shape(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                      char out[ZP_OPTABLE_SHAPE_LEN])
{
    const Dims d = dims(model, plan);
    const gboolean save =
        kind == ZP_COMP_RECOMPUTE || (kind == ZP_COMP_BLOCK_FWD && !plan->checkpoint);
    g_snprintf(out, ZP_OPTABLE_SHAPE_LEN,
               "b%g s%g h%g a%g kv%g q%g f%g f1%g v%g mp%g e%g %s%s%s%s%s%s%s%s%s%s%s%s r%g w%lld "
               "ck%d sv%d",
               d.b, d.s, d.h, d.heads, d.kvd, d.q, d.f, d.f1, d.v, d.mp, d.embed_elems,
               d.bias_qkv ? "Q" : "", d.bias_proj ? "P" : "", d.bias_mlp ? "M" : "",
               d.rope ? "R" : "", d.learned ? "L" : "", d.rms ? "N" : "", d.swiglu ? "G" : "",
               d.fused ? "F" : "", model->exact_gelu ? "E" : "",
               model->parallel_residual ? "X" : "", model->tied_embeddings ? "T" : "",
               model->dropout ? "D" : "", model->rotary_fraction,
               (long long)model->sliding_window,
               plan->checkpoint ? 1 : plan->selective_recompute ? 2 : 0, save ? 1 : 0);
}
