/* real_gpt_block: one transformer block of the model forward and backward, whole or module by
 * module (attention, MLP), its activations saved or recomputed bit for bit. */
#include "real_gpt.h"
#include "real_gpt_internal.h"

#include <math.h>
#include <string.h>

/* ---- transformer block ---- */

/* Rounds a freshly computed activation to bf16 (every activation tensor is bf16 in mixed
 * precision) and, when saving, stores it: later ops and the backward then see the same
 * values, whether or not activations were saved. */
static void real_gpt_keep(RealBackend *be, float *x, RealBf16 *saved, size_t n_elems)
{
    be->round_bf16(be, x, n_elems);
    if (saved)
        be->f32_to_bf16(be, saved, x, n_elems);
}

/* y[T,n] = x[T,k] W[k,n] + bias, W and bias taken from the block's parameters. A
 * row-parallel layer (proj, fc2) sums its partial products over the tensor group before its
 * bias, which every rank holds whole and adds once to the sum (Megatron's
 * RowParallelLinear). */
static bool real_gpt_linear(RealGpt *gpt, RealBf16 *const *params, RealGptBlockTensor weight,
                            const float *x, float *y, int n, int k)
{
    RealBackend *be = gpt->be;
    int t = (int)real_gpt_tokens(&gpt->dims);
    if (!be->gemm(be, false, false, t, n, k, 1.0f, REAL_DTYPE_F32, x, REAL_DTYPE_BF16,
                  params[weight], 0.0f, y))
        return false;
    const bool row_parallel = weight == REAL_GPT_PROJ_W || weight == REAL_GPT_FC2_W;
    if (row_parallel && !real_gpt_tp_sum(gpt, y, (size_t)t * n))
        return false;
    if (gpt->block_has[weight + 1])
        be->bias_fwd(be, y, params[weight + 1], t, n);
    return true;
}

/* A block's norm forward: LayerNorm (gain, bias; statistics kept in mean and rstd) or
 * RMSNorm (gain; nothing kept). */
static void real_gpt_norm_fwd(RealGpt *gpt, RealBf16 *const *p, RealGptBlockTensor gain,
                              float *y, float *mean, float *rstd, const float *x)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden;
    if (d->rmsnorm)
        be->rmsnorm_fwd(be, y, x, p[gain], t, h, real_gpt_eps(d));
    else
        be->layernorm_fwd(be, y, mean, rstd, x, p[gain],
                          p[gain + 1], t, h);
}

/* Its backward: dx += d/dx, the gain's (and bias's) gradients into g. */
static void real_gpt_norm_bwd(RealGpt *gpt, RealBf16 *const *p, float *g,
                              RealGptBlockTensor gain, float *dx, const float *dy,
                              const float *x, const float *mean, const float *rstd)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden;
    const size_t *off = gpt->block_offset;
    if (d->rmsnorm)
        be->rmsnorm_bwd(be, dx, g + off[gain], dy, x, p[gain], t, h, real_gpt_eps(d));
    else
        be->layernorm_bwd(be, dx, g + off[gain], g + off[gain + 1], dy, x, mean, rstd,
                          p[gain], t, h);
}

/* The block forward's fp32 workspace, T(3h + q + f1 + f + 4) + b a s floats, and where the
 * norm statistics and the log-sum-exp go (into the saved activations when saving). */
typedef struct {
    float *x, *a, *qkv, *x2, *u, *act;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} RealGptFwdBufs;

static size_t real_gpt_fwd_ws_elems(const RealGptDims *d)
{
    return real_gpt_tokens(d) * (3 * (size_t)d->hidden + real_gpt_qkv_width(d) +
                                 real_gpt_fc1_width(d) + real_gpt_ffn(d) + 4) +
           (size_t)d->micro_batch * real_gpt_heads(d) * d->seq_len;
}

static RealGptFwdBufs real_gpt_fwd_bufs(const RealGptDims *d, float *ws, const RealGptSaved *sv)
{
    size_t t = real_gpt_tokens(d), th = t * d->hidden;
    RealGptFwdBufs b = {.x = ws, .a = ws + th, .qkv = ws + 2 * th};
    b.x2 = b.qkv + t * real_gpt_qkv_width(d);
    b.u = b.x2 + th;
    b.act = real_gpt_gated(d) ? b.u + t * real_gpt_fc1_width(d) : b.u; /* GELU: in place */
    float *stats = b.u + t * real_gpt_fc1_width(d) + t * real_gpt_ffn(d);
    const bool saved_stats = sv && !d->rmsnorm;
    b.ln1_mean = saved_stats ? sv->ln1_mean : stats;
    b.ln1_rstd = saved_stats ? sv->ln1_rstd : stats + t;
    b.ln2_mean = saved_stats ? sv->ln2_mean : stats + 2 * t;
    b.ln2_rstd = saved_stats ? sv->ln2_rstd : stats + 3 * t;
    b.lse = sv && d->flash ? sv->lse : stats + 4 * t;
    return b;
}

/* The attention of qkv into out: fused (keeping the log-sum-exp), grouped-query or, with as
 * many key/value heads as heads, the original entry (which every backend has). */
static bool real_gpt_attention_fwd(RealGpt *gpt, float *out, RealBf16 *probs, float *lse,
                                   const float *qkv)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const int b = d->micro_batch, s = d->seq_len, a = real_gpt_heads(d), k = real_gpt_kv(d);
    const int hd = real_gpt_head_dim(d);
    if (d->flash)
        return be->flash_attention_fwd(be, out, lse, qkv, b, s, a, k, hd);
    if (k != a)
        return be->attention_gqa_fwd(be, out, probs, REAL_DTYPE_BF16, qkv, b, s, a, k, hd);
    return be->attention_fwd(be, out, probs, REAL_DTYPE_BF16, qkv, b, s, a, hd);
}

/* Module m of the block forward in its workspace (RealGptFwdBufs), with the parameter-free
 * work that follows it up to the next module (zp_cost.c block_fwd tags the same kernels):
 *   ln1   x = x_in (fp32, and kept whole when saving), a = norm1(x)
 *   qkv   qkv = a Wqkv + b (rotated), a = attention(qkv)
 *   proj  x2 = x + a Wp + bp
 *   ln2   a = norm2(y), y = x2, or the block input x under a parallel residual
 *   fc1   u = a W1 + b1, act = GELU(u) or the gated unit (in place for GELU)
 *   fc2   x = x2 + act W2 + b2 (x is dead once norm2 has read it), x_out = x
 * sv NULL when not saving. */
static bool real_gpt_fwd_module(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv,
                                const RealGptFwdBufs *b, int m, const RealBf16 *x_in,
                                RealBf16 *x_out)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden, q = (int)real_gpt_qkv_width(d);
    int f = real_gpt_ffn(d), f1 = (int)real_gpt_fc1_width(d);
    size_t th = (size_t)t * h, tf = (size_t)t * f;
    const RealRope rope = real_gpt_rope(d);
    switch (m) {
    case REAL_GPT_MOD_LN1:
        be->bf16_to_f32(be, b->x, x_in, th);
        if (sv)
            be->copy(be, sv->x, x_in, th * sizeof(RealBf16));
        real_gpt_norm_fwd(gpt, p, REAL_GPT_LN1_G, b->a, b->ln1_mean, b->ln1_rstd, b->x);
        real_gpt_keep(be, b->a, sv ? sv->ln1 : NULL, th);
        return true;
    case REAL_GPT_MOD_QKV:
        if (!real_gpt_linear(gpt, p, REAL_GPT_QKV_W, b->a, b->qkv, q, h))
            return false;
        if (d->rope_theta > 0 &&
            !be->rope(be, b->qkv, d->micro_batch, d->seq_len, real_gpt_heads(d),
                      real_gpt_kv(d), real_gpt_head_dim(d), &rope, false))
            return false;
        real_gpt_keep(be, b->qkv, sv ? sv->qkv : NULL, (size_t)t * q);
        if (!real_gpt_attention_fwd(gpt, b->a, sv ? sv->probs : NULL, b->lse, b->qkv))
            return false;
        real_gpt_keep(be, b->a, sv ? sv->att : NULL, th);
        return true;
    case REAL_GPT_MOD_PROJ:
        if (!real_gpt_linear(gpt, p, REAL_GPT_PROJ_W, b->a, b->x2, h,
                             (int)real_gpt_att_width(d)))
            return false;
        be->add(be, b->x2, b->x2, b->x, th);
        real_gpt_keep(be, b->x2, sv ? sv->x2 : NULL, th); /* sv->x2 NULL: parallel residual */
        return true;
    case REAL_GPT_MOD_LN2:
        real_gpt_norm_fwd(gpt, p, REAL_GPT_LN2_G, b->a, b->ln2_mean, b->ln2_rstd,
                          d->parallel_residual ? b->x : b->x2);
        real_gpt_keep(be, b->a, sv ? sv->ln2 : NULL, th);
        return true;
    case REAL_GPT_MOD_FC1:
        if (real_gpt_sparse(d)) /* route, dispatch, the experts, combine */
            return real_gpt_moe_fc1_fwd(gpt, p, sv, b->a, &gpt->tp_error);
        if (!real_gpt_linear(gpt, p, REAL_GPT_FC1_W, b->a, b->u, f1, h))
            return false;
        real_gpt_keep(be, b->u, sv ? sv->fc1 : NULL, (size_t)t * f1);
        if (real_gpt_gated(d))
            be->glu_fwd(be, b->act, b->u, t, f, real_gpt_act(d));
        else if (d->exact_gelu)
            be->gelu_erf_fwd(be, b->act, b->u, tf);
        else
            be->gelu_fwd(be, b->act, b->u, tf);
        real_gpt_keep(be, b->act, sv ? sv->gelu : NULL, tf);
        return true;
    default:
        if (real_gpt_sparse(d) ? !real_gpt_moe_fc2_fwd(gpt, sv, b->x, &gpt->tp_error)
                               : !real_gpt_linear(gpt, p, REAL_GPT_FC2_W, b->act, b->x, h, f))
            return false;
        be->add(be, b->x, b->x, b->x2, th);
        be->f32_to_bf16(be, x_out, b->x, th);
        return true;
    }
}

/* A block's view indexed by RealGptBlockTensor (absent tensors NULL). */
static void real_gpt_block_ptrs(const RealGpt *gpt, const RealGptTensors *v,
                                RealBf16 *out[REAL_GPT_N_BLOCK_TENSORS])
{
    for (int i = 0, k = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++)
        out[i] = gpt->block_has[i] ? v->at[k++] : NULL;
}

gboolean real_gpt_block_forward(RealGpt *gpt, int layer, const RealBf16 *block_params,
                                const RealBf16 *x_in, RealBf16 *x_out,
                                gboolean save_activations, GError **error)
{
    RealGptTensors v;
    real_gpt_tensors_at(&gpt->dims, 1, block_params, &v);
    return real_gpt_block_forward_t(gpt, layer, &v, x_in, x_out, save_activations, error);
}

/* Whether module m of block `layer` is the next of a run in that direction (a new run starts
 * at the direction's first module when none is under way). */
static gboolean real_gpt_run_next(RealGpt *gpt, int layer, int m, bool backward, GError **error)
{
    const int step = backward ? REAL_GPT_N_MODULES - 1 - m : m;
    const bool fresh = gpt->run.layer < 0 && step == 0;
    if (m < 0 || m >= REAL_GPT_N_MODULES ||
        !(fresh || (gpt->run.layer == layer && gpt->run.backward == backward &&
                    gpt->run.done == step))) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d: module %d of its %s out of order", layer, m,
                    backward ? "backward" : "forward");
        return FALSE;
    }
    return TRUE;
}

/* Ends a run: its workspace freed; on failure its saved activations (forward) too. */
static gboolean real_gpt_run_end(RealGpt *gpt, bool ok, const char *what, GError **error)
{
    RealBackend *be = gpt->be;
    be->free(be, gpt->run.ws);
    real_gpt_moe_run_end(gpt);
    if (!ok && !gpt->run.backward)
        be->free(be, gpt->run.saved);
    gpt->run.layer = -1;
    gpt->run.ws = NULL;
    gpt->run.saved = NULL;
    return ok ? TRUE : real_gpt_failed(gpt, error, what);
}

gboolean real_gpt_block_forward_module_t(RealGpt *gpt, int layer, int module,
                                         const RealGptTensors *block, const RealBf16 *x_in,
                                         RealBf16 *x_out, gboolean save_activations,
                                         GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error) ||
        !real_gpt_run_next(gpt, layer, module, false, error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    if (module == REAL_GPT_MOD_LN1) {
        if (save_activations && gpt->saved[layer]) {
            g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                        "block %d already holds saved activations (forward twice?)", layer);
            return FALSE;
        }
        void *saved = NULL;
        if (save_activations) {
            saved = be->alloc(be, real_gpt_block_activation_bytes(d), REAL_MEM_ACTIVATIONS);
            if (!saved)
                return real_gpt_nomem(error, "saved activations");
        }
        gpt->run.layer = layer, gpt->run.done = 0, gpt->run.backward = false;
        gpt->run.saved = saved;
        gpt->run.ws = real_gpt_workspace(gpt, real_gpt_fwd_ws_elems(d));
        if (!gpt->run.ws)
            return real_gpt_run_end(gpt, false, "the block forward workspace", error);
    }
    RealGptSaved sv = {0};
    if (gpt->run.saved)
        sv = real_gpt_saved_view(d, gpt->run.saved);
    const RealGptFwdBufs b = real_gpt_fwd_bufs(d, gpt->run.ws, gpt->run.saved ? &sv : NULL);
    RealBf16 *p[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_ptrs(gpt, block, p);
    if (!real_gpt_fwd_module(gpt, p, gpt->run.saved ? &sv : NULL, &b, module, x_in, x_out))
        return real_gpt_run_end(gpt, false, "the block forward workspace", error);
    if (++gpt->run.done < REAL_GPT_N_MODULES)
        return TRUE;
    gpt->saved[layer] = gpt->run.saved;
    return real_gpt_run_end(gpt, true, NULL, error);
}

gboolean real_gpt_block_forward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                  const RealBf16 *x_in, RealBf16 *x_out,
                                  gboolean save_activations, GError **error)
{
    for (int m = 0; m < REAL_GPT_N_MODULES; m++)
        if (!real_gpt_block_forward_module_t(gpt, layer, m, block, x_in, x_out,
                                             save_activations, error))
            return FALSE;
    return TRUE;
}

void *real_gpt_take_saved(RealGpt *gpt, int layer)
{
    g_return_val_if_fail(layer >= 0 && layer < gpt->dims.layers, NULL);
    void *saved = gpt->saved[layer];
    gpt->saved[layer] = NULL;
    return saved;
}

gboolean real_gpt_put_saved(RealGpt *gpt, int layer, void *saved, GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error))
        return FALSE;
    if (gpt->saved[layer]) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d already holds saved activations", layer);
        return FALSE;
    }
    gpt->saved[layer] = saved;
    return TRUE;
}

/* dW += x^T dy for a weight [k,n] given x [T,k] (bf16 saved) and dy [T,n] (fp32); bias
 * gradient too; writes into the unit's fp32 gradient scratch g. */
static bool real_gpt_linear_param_grads(RealGpt *gpt, float *g, RealGptBlockTensor weight,
                                        const RealBf16 *x, const float *dy, int n, int k)
{
    RealBackend *be = gpt->be;
    int t = (int)real_gpt_tokens(&gpt->dims);
    if (!be->gemm(be, true, false, k, n, t, 1.0f, REAL_DTYPE_BF16, x, REAL_DTYPE_F32, dy, 1.0f,
                  g + gpt->block_offset[weight]))
        return false;
    if (gpt->block_has[weight + 1])
        be->bias_bwd(be, g + gpt->block_offset[weight + 1], dy, t, n);
    return true;
}

/* dx[T,k] = dy[T,n] W^T for a block weight W [k,n]. */
static bool real_gpt_linear_input_grad(RealGpt *gpt, RealBf16 *const *p,
                                       RealGptBlockTensor weight, const float *dy, float *dx,
                                       int n, int k)
{
    RealBackend *be = gpt->be;
    int t = (int)real_gpt_tokens(&gpt->dims);
    return be->gemm(be, false, true, t, k, n, 1.0f, REAL_DTYPE_F32, dy, REAL_DTYPE_BF16,
                    p[weight], 0.0f, dx);
}

/* The block backward's fp32 workspace, unit + T(2 f1 + 3h + 2q) floats: the unit's parameter
 * gradients gather in g and reach the bf16 gradients in one accumulation. */
typedef struct {
    float *g, *df, *uf, *dh, *xh, *dx2, *qkv, *dqkv;
} RealGptBwdBufs;

static size_t real_gpt_bwd_ws_elems(const RealGpt *gpt)
{
    const RealGptDims *d = &gpt->dims;
    return gpt->block_elems +
           real_gpt_tokens(d) * (2 * real_gpt_fc1_width(d) + 3 * (size_t)d->hidden +
                                 2 * real_gpt_qkv_width(d));
}

static RealGptBwdBufs real_gpt_bwd_bufs(const RealGpt *gpt, float *ws)
{
    const RealGptDims *d = &gpt->dims;
    size_t t = real_gpt_tokens(d), th = t * d->hidden, tf1 = t * real_gpt_fc1_width(d);
    RealGptBwdBufs b = {.g = ws, .df = ws + gpt->block_elems};
    b.uf = b.df + tf1;
    b.dh = b.uf + tf1;
    b.xh = b.dh + th;
    b.dx2 = b.xh + th;
    b.qkv = b.dx2 + th;
    b.dqkv = b.qkv + t * real_gpt_qkv_width(d);
    return b;
}

/* dqkv from dout and the saved attention: the fused kernel's backward (which reads the
 * forward's output, widened into out_scratch), the grouped-query one or the original. */
static bool real_gpt_attention_bwd(RealGpt *gpt, const RealGptSaved *sv, float *dqkv,
                                   const float *dout, const float *qkv, float *out_scratch)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const int b = d->micro_batch, s = d->seq_len, a = real_gpt_heads(d), k = real_gpt_kv(d);
    const int hd = real_gpt_head_dim(d);
    if (d->flash) {
        be->bf16_to_f32(be, out_scratch, sv->att, real_gpt_tokens(d) * real_gpt_att_width(d));
        return be->flash_attention_bwd(be, dqkv, dout, qkv, out_scratch, sv->lse, b, s, a, k,
                                       hd);
    }
    if (k != a)
        return be->attention_gqa_bwd(be, dqkv, dout, qkv, sv->probs, REAL_DTYPE_BF16, b, s, a,
                                     k, hd);
    return be->attention_bwd(be, dqkv, dout, qkv, sv->probs, REAL_DTYPE_BF16, b, s, a, hd);
}

/* Module m of the block backward in its workspace (RealGptBwdBufs), with the parameter-free
 * backward that precedes it up to the previous module (zp_cost.c block_bwd tags the same
 * kernels), in the order fc2, fc1, ln2, proj, qkv, ln1:
 *   fc2   g = 0; fc2's gradients from dy, df = dy W2^T, then the activation's backward
 *   fc1   fc1's gradients, dh = dfc1 W1^T (summed over the tensor group)
 *   ln2   dx2 = dy + norm2's backward of dh (the MLP's part of dL/dz, z = x2 or x)
 *   proj  proj's gradients from datt = dx2 (dy under a parallel residual), dh = datt Wp^T,
 *         then the attention's and rotary backward into dqkv
 *   qkv   qkv's gradients, dh = dqkv Wqkv^T (summed over the tensor group)
 *   ln1   dx = dx2 + norm1's backward of dh
 * dy is last read (ln2, or proj under a parallel residual) before dx is first written (ln1),
 * so they may alias. */
static bool real_gpt_bwd_module(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv,
                                const RealGptBwdBufs *b, int m, const float *dy, float *dx)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden, f = real_gpt_ffn(d);
    int f1 = (int)real_gpt_fc1_width(d), q = (int)real_gpt_qkv_width(d);
    int att = (int)real_gpt_att_width(d);
    size_t th = (size_t)t * h;
    float *dfc1 = real_gpt_gated(d) ? b->uf : b->df;
    const RealRope rope = real_gpt_rope(d);
    switch (m) {
    case REAL_GPT_MOD_FC2:
        be->fill(be, b->g, 0, gpt->block_elems * sizeof(float));
        if (real_gpt_sparse(d)) /* combine's backward, dispatch, the experts, combine */
            return real_gpt_moe_fc2_bwd(gpt, p, sv, b->g, dy, &gpt->tp_error);
        if (!real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_FC2_W, sv->gelu, dy, h, f) ||
            !real_gpt_linear_input_grad(gpt, p, REAL_GPT_FC2_W, dy, b->df, h, f))
            return false;
        /* dfc1: GELU's backward in place over df, or the gated one over the widened gate
         * and up. */
        be->bf16_to_f32(be, b->uf, sv->fc1, (size_t)t * f1);
        if (real_gpt_gated(d))
            be->glu_bwd(be, b->uf, b->df, b->uf, t, f, real_gpt_act(d));
        else if (d->exact_gelu)
            be->gelu_erf_bwd(be, b->df, b->df, b->uf, (size_t)t * f);
        else
            be->gelu_bwd(be, b->df, b->df, b->uf, (size_t)t * f);
        return true;
    case REAL_GPT_MOD_FC1:
        if (real_gpt_sparse(d)) /* the routed copies' and the router's input gradients */
            return real_gpt_moe_fc1_bwd(gpt, p, sv, b->g, b->dh, &gpt->tp_error);
        /* Column-parallel fc1: its input gradient is summed over the tensor group. */
        return real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_FC1_W, sv->ln2, dfc1, f1, h) &&
               real_gpt_linear_input_grad(gpt, p, REAL_GPT_FC1_W, dfc1, b->dh, f1, h) &&
               real_gpt_tp_sum(gpt, b->dh, th);
    case REAL_GPT_MOD_LN2:
        be->bf16_to_f32(be, b->xh, d->parallel_residual ? sv->x : sv->x2, th);
        be->copy(be, b->dx2, dy, th * sizeof(float));
        real_gpt_norm_bwd(gpt, p, b->g, REAL_GPT_LN2_G, b->dx2, b->dh, b->xh, sv->ln2_mean,
                          sv->ln2_rstd);
        return true;
    case REAL_GPT_MOD_PROJ: {
        const float *datt = d->parallel_residual ? dy : b->dx2;
        if (!real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_PROJ_W, sv->att, datt, h, att) ||
            !real_gpt_linear_input_grad(gpt, p, REAL_GPT_PROJ_W, datt, b->dh, h, att))
            return false;
        be->bf16_to_f32(be, b->qkv, sv->qkv, (size_t)t * q);
        if (!real_gpt_attention_bwd(gpt, sv, b->dqkv, b->dh, b->qkv, b->xh))
            return false;
        return d->rope_theta <= 0 ||
               be->rope(be, b->dqkv, d->micro_batch, d->seq_len, real_gpt_heads(d),
                        real_gpt_kv(d), real_gpt_head_dim(d), &rope, true);
    }
    case REAL_GPT_MOD_QKV:
        /* Column-parallel qkv: its input gradient is summed over the tensor group. */
        return real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_QKV_W, sv->ln1, b->dqkv, q, h) &&
               real_gpt_linear_input_grad(gpt, p, REAL_GPT_QKV_W, b->dqkv, b->dh, q, h) &&
               real_gpt_tp_sum(gpt, b->dh, th);
    default:
        be->bf16_to_f32(be, b->xh, sv->x, th);
        be->copy(be, dx, b->dx2, th * sizeof(float));
        real_gpt_norm_bwd(gpt, p, b->g, REAL_GPT_LN1_G, dx, b->dh, b->xh, sv->ln1_mean,
                          sv->ln1_rstd);
        return true;
    }
}

gboolean real_gpt_block_backward(RealGpt *gpt, int layer, const RealBf16 *block_params,
                                 const float *dx_out, float *dx_in, RealBf16 *block_grads,
                                 GError **error)
{
    RealGptTensors p, g;
    real_gpt_tensors_at(&gpt->dims, 1, block_params, &p);
    real_gpt_tensors_at(&gpt->dims, 1, block_grads, &g);
    return real_gpt_block_backward_t(gpt, layer, &p, dx_out, dx_in, &g, error);
}

/* Writes module m's gradients (its tensors are consecutive in the block's list) from the
 * workspace g into dst of block `layer`: stored where fresh, else added. */
static void real_gpt_add_module_grads(RealGpt *gpt, int layer, int m,
                                      const RealGptTensors *dst, const float *g)
{
    const RealGptDims *d = &gpt->dims;
    uint32_t bits = real_gpt_module_tensors(d, m);
    /* Split, the experts' gradients are their own op's (real_gpt_moe_experts_backward_t). */
    if (gpt->moe_split && real_gpt_sparse(d))
        bits &= ~(real_gpt_moe_expert_tensors(gpt));
    if (!bits)
        return;
    const int first = g_bit_nth_lsf(bits, -1);
    int last = first;
    while (last < 32 && (bits >> last & 1u))
        last++;
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    real_gpt_unit_tensors(d, 1, t);
    real_gpt_accumulate(gpt, 1, layer + 1, dst, g + t[first].offset_elems, first, last);
}

gboolean real_gpt_block_backward_module_t(RealGpt *gpt, int layer, int module,
                                          const RealGptTensors *block, const float *dx_out,
                                          float *dx_in, const RealGptTensors *block_grads,
                                          GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error) ||
        !real_gpt_run_next(gpt, layer, module, true, error))
        return FALSE;
    if (!gpt->saved[layer]) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d has no saved activations: forward it with save_activations "
                    "(recompute) before its backward",
                    layer);
        return FALSE;
    }
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    if (module == REAL_GPT_MOD_FC2) {
        gpt->run.layer = layer, gpt->run.done = 0, gpt->run.backward = true;
        gpt->run.ws = real_gpt_workspace(gpt, real_gpt_bwd_ws_elems(gpt));
        if (!gpt->run.ws)
            return real_gpt_run_end(gpt, false, "the block backward workspace", error);
    }
    const RealGptSaved sv = real_gpt_saved_view(d, gpt->saved[layer]);
    const RealGptBwdBufs b = real_gpt_bwd_bufs(gpt, gpt->run.ws);
    RealBf16 *p[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_ptrs(gpt, block, p);
    if (!real_gpt_bwd_module(gpt, p, &sv, &b, module, dx_out, dx_in))
        return real_gpt_run_end(gpt, false, "the block backward workspace", error);
    if (block_grads)
        real_gpt_add_module_grads(gpt, layer, module, block_grads, b.g);
    if (++gpt->run.done < REAL_GPT_N_MODULES)
        return TRUE;
    real_gpt_run_end(gpt, true, NULL, error);
    be->free(be, gpt->saved[layer]);
    gpt->saved[layer] = NULL;
    return TRUE;
}

gboolean real_gpt_block_backward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                   const float *dx_out, float *dx_in,
                                   const RealGptTensors *block_grads, GError **error)
{
    for (int m = REAL_GPT_N_MODULES - 1; m >= 0; m--)
        if (!real_gpt_block_backward_module_t(gpt, layer, m, block, dx_out, dx_in, block_grads,
                                              error))
            return FALSE;
    return TRUE;
}
