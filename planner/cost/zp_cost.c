/* zp_cost: a compute op's kernels as real/real_gpt.c issues them, and their time from the
 * profile's op table, or the roofline where the profile has no table. */
#include "zp_cost.h"
#include "zp_offload.h"
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
    linear_fwd(out, d, d->h, d->h / d->mp, d->bias_proj);
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
    linear_bwd(out, d, d->h, d->h / d->mp, d->bias_proj);
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
    const double tile = d.fused ? (double)zp_model_head_dim(model) + 32 : 2 * d.s * d.s;
    return 2 * d.t * d.h + 4 * d.t * d.h + 4 * (a + b + tile);
}

gboolean zp_cost_cpu_backend(const ZpHw *hw)
{
    return hw->op_costs.present && strcmp(hw->op_costs.backend, "cpu") == 0;
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

void zp_cost_module_shares(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                           const ZpCost *c, ZpModuleShares *out)
{
    ZpKernels ks;
    zp_cost_kernels(model, plan, kind, &ks);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ks.n; i++) {
        const ZpKernel *k = &ks.k[i];
        out->flops[k->module] += k->kind == ZP_KERNEL_EW ? 0 : k->flops;
        out->attn_flops[k->module] += k->kind == ZP_KERNEL_ATTENTION ? k->flops : 0;
        out->accesses[k->module] += k->accesses;
        out->time[k->module] += c && c->table ? zp_cost_kernel_s(c, k) : 0;
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
               (long long)model->sliding_window, plan->checkpoint ? 1 : 0, save ? 1 : 0);
}

void zp_cost_optimizer_shape(double elems, char out[ZP_OPTABLE_SHAPE_LEN])
{
    g_snprintf(out, ZP_OPTABLE_SHAPE_LEN, "n%.0f", elems);
}

ZpOptPath zp_cost_optimizer_whole(const ZpOpTable *t, double elems, int ranks, double *time_s,
                                  double around[2])
{
    const char *name = zp_sched_compute_name(ZP_COMP_OPTIMIZER);
    const ZpOpTime *below = NULL, *above = NULL;
    double lo = -INFINITY, hi = INFINITY;
    for (int i = 0; i < t->n_ops; i++) {
        const ZpOpTime *o = &t->ops[i];
        char *end = NULL;
        const double n = o->shape[0] == 'n' ? g_ascii_strtod(o->shape + 1, &end) : NAN;
        if (o->ranks != ranks || strcmp(o->op, name) != 0 || !end || *end || !(n > 0))
            continue;
        if (n <= elems && n > lo)
            lo = n, below = o;
        if (n >= elems && n < hi)
            hi = n, above = o;
    }
    around[0] = lo, around[1] = hi;
    if (below && fabs(elems - lo) <= 0.5) {
        *time_s = below->time_s;
        return ZP_OPT_PATH_WHOLE;
    }
    if (above && fabs(hi - elems) <= 0.5) {
        *time_s = above->time_s;
        return ZP_OPT_PATH_WHOLE;
    }
    if (!below || !above)
        return ZP_OPT_PATH_FITTED;
    *time_s = below->time_s + (elems - lo) * (above->time_s - below->time_s) / (hi - lo);
    return ZP_OPT_PATH_INTERPOLATED;
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

/* How the plan's optimizer is costed (c->whole[ZP_COMP_OPTIMIZER] when measured whole at
 * its elements), in words. */
static char *optimizer_path(ZpCost *c, const ZpModel *model, const ZpPlan *plan)
{
    const double all = (double)zp_sched_optimizer_elems(model, plan);
    const double elems = (1.0 - zp_offload_cpu_share(plan, all)) * all;
    double t, around[2];
    if (elems <= 0)
        return g_strdup("no optimizer on the device (offloaded)");
    if (zp_plan_pp(plan) > 1)
        return g_strdup("the optimizer by each pipeline stage's elements: a whole time there, "
                        "else its fitted rate");
    const ZpOptPath path = zp_cost_optimizer_whole(&c->hw->op_costs, elems, c->ranks, &t, around);
    c->whole[ZP_COMP_OPTIMIZER] = path == ZP_OPT_PATH_WHOLE;
    if (path == ZP_OPT_PATH_WHOLE)
        return g_strdup_printf("the optimizer measured whole at its %.0f elements", elems);
    if (path == ZP_OPT_PATH_INTERPOLATED)
        return g_strdup_printf("the optimizer's %.0f elements between its whole times at %.0f "
                               "and %.0f", elems, around[0], around[1]);
    return g_strdup_printf("the optimizer's %.0f elements at its fitted rate (no whole times "
                           "around them)", elems);
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
    c->optimizer_elem_bytes =
        zp_plan_step_bytes(zp_plan_state_bytes(plan->precision, plan->optimizer));
    c->log2_seq = log2((double)model->seq_len);
    c->log2_head_dim = log2((double)zp_model_head_dim(model));
    const int world = plan->dp * plan->mp * zp_plan_pp(plan);
    c->ranks = hw->gpus_per_node > 0 ? MIN(world, hw->gpus_per_node) : world;
    GString *whole = g_string_new(NULL), *summed = g_string_new(NULL);
    for (int k = 0; k < ZP_COMP_N; k++) {
        ZpKernels ks;
        zp_cost_kernels(model, plan, (ZpComputeKind)k, &ks);
        c->kind_s[k] = k == ZP_COMP_OPTIMIZER ? hw->op_costs.launch_s : kernels_s(c, &ks);
        if (ks.n == 0)
            continue;
        char shape[ZP_OPTABLE_SHAPE_LEN];
        zp_cost_op_shape(model, plan, (ZpComputeKind)k, shape);
        const ZpOpTime *t = zp_optable_op(&hw->op_costs, zp_sched_compute_name(k), shape,
                                          c->ranks);
        c->whole[k] = t != NULL;
        if (t)
            c->kind_s[k] = t->time_s;
        ZpModuleShares shares;
        zp_cost_module_shares(model, plan, (ZpComputeKind)k, c, &shares);
        memcpy(c->module_share[k], shares.time, sizeof shares.time);
        GString *list = t ? whole : summed;
        g_string_append_printf(list, "%s%s", list->len ? ", " : "", zp_sched_compute_name(k));
    }
    char *opt = optimizer_path(c, model, plan);
    g_snprintf(c->why, sizeof c->why,
               "op table: %s measured whole (%d rank%s at once)%s%s; %s (%s)",
               whole->len ? whole->str : "no op", c->ranks, c->ranks == 1 ? "" : "s",
               summed->len ? "; the sum of their kernels for " : "", summed->str, opt,
               hw->op_costs.source);
    g_free(opt);
    g_string_free(whole, TRUE);
    g_string_free(summed, TRUE);
    return TRUE;
}

/* Moving `bytes` (read and written) on a backend with an op table: one launch at its measured
 * convert rate (conversions, rounding, adds in place). */
static double convert_s(const ZpCost *c, double bytes)
{
    const ZpOpTable *t = &c->hw->op_costs;
    return t->launch_s + bytes / t->ew_bytes_per_s[ZP_EW_CONVERT];
}

/* One copy of an array of `bytes`: one launch and the table's measured copy time at that size
 * (zp_optable's "copy"), or without one at the convert rate over its bytes read and written. */
static double copy_s(const ZpCost *c, double bytes)
{
    const ZpOpTable *t = &c->hw->op_costs;
    return t->copy.n > 0 ? t->launch_s + zp_colltab_time_s(&t->copy, bytes)
                         : convert_s(c, 2 * bytes);
}

double zp_cost_op_s(const ZpCost *c, ZpComputeKind kind, int module, double flops,
                    double gemm_flops, double attn_flops, double mem_bytes)
{
    const gboolean optimizer = kind == ZP_COMP_OPTIMIZER;
    /* A coalesced gather's unpack is copies: the table's measured copy rate, as the
     * collectives' own copies (not the block kernels' elementwise rate, a tenth of it on a
     * CPU). ZeRO++'s (de)quantisation kernels move bytes that differ op by op (a bucket's, a
     * unit's) in kernels the table does not time, so they stay on the roofline. */
    if (c->table && kind == ZP_COMP_UNPACK)
        return copy_s(c, mem_bytes / 2);
    if (!c->table || kind == ZP_COMP_QUANTIZE)
        return zp_hw_compute_time_s(c->hw, c->peak_flops, flops, gemm_flops, attn_flops,
                                    c->attn_flops_per_s, mem_bytes, optimizer);
    double whole_s, around[2];
    if (optimizer && zp_cost_optimizer_whole(&c->hw->op_costs, mem_bytes / c->optimizer_elem_bytes,
                                             c->ranks, &whole_s, around) != ZP_OPT_PATH_FITTED)
        return whole_s;
    return c->kind_s[kind] * (module >= 0 ? c->module_share[kind][module] : 1.0) +
           (optimizer ? mem_bytes / c->hw->op_costs.optimizer_bytes_per_s : 0);
}

int zp_cost_coll_passes(const ZpOp *op, int stage, int ranks,
                        ZpCollPass out[ZP_COLL_PASSES_MAX])
{
    const double share = op->bytes / MAX(ranks, 1);
    /* this rank's share delivered: copied, or at stages 2-3 after the first micro-step added
     * in place in bf16 (real_engine.c real_engine_deliver) */
    const ZpCollPass deliver = {share, stage >= 2 && op->micro > 0};
    const ZpCollPass whole = {op->bytes, FALSE};
    if (op->buffer < 0 && !(op->sub == ZP_COLL_ALLGATHER && stage == 3))
        return 0;
    int n = 0;
    switch ((ZpCollKind)op->sub) {
    case ZP_COLL_ALLREDUCE: /* into the bucket and back */
        out[n++] = whole, out[n++] = whole;
        break;
    case ZP_COLL_REDUCE_SCATTER:
        if (stage < 2)
            out[n++] = whole;
        out[n++] = deliver;
        break;
    case ZP_COLL_ALLGATHER: /* alone, MPI copies the rank's slice into the bucket itself */
        if (ranks == 1)
            out[n++] = whole;
        if (stage < 3)
            out[n++] = whole;
        break;
    default:
        break;
    }
    return n;
}

double zp_cost_coll_copy_bytes(const ZpOp *op, int stage, int ranks)
{
    ZpCollPass p[ZP_COLL_PASSES_MAX];
    const int n = zp_cost_coll_passes(op, stage, ranks, p);
    double bytes = 0;
    for (int i = 0; i < n; i++) /* an add reads 2 + 2 and writes 2 per 2-byte element */
        bytes += (p[i].add ? 3 : 2) * p[i].bytes;
    return bytes;
}

double zp_cost_coll_copy_s(const ZpCost *c, const ZpOp *op, int stage, int ranks)
{
    ZpCollPass p[ZP_COLL_PASSES_MAX];
    const int n = c->table ? zp_cost_coll_passes(op, stage, ranks, p) : 0;
    double s = 0;
    for (int i = 0; i < n; i++)
        if (p[i].bytes > 0)
            s += p[i].add ? convert_s(c, 3 * p[i].bytes) : copy_s(c, p[i].bytes);
    return s;
}

double zp_cost_contention(const ZpCost *c, int overlapping)
{
    return c->table && overlapping > 0 ? c->hw->op_costs.contention : 1.0;
}
