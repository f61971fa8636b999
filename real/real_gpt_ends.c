/* real_gpt_ends: the model's ends: the embeddings (token, learned positions; a vocabulary
 * shard each with tensor parallelism) and the head (final norm, LM head, loss), forward and
 * backward. */
#include "real_gpt.h"
#include "real_gpt_internal.h"

#include <math.h>
#include <string.h>

/* Tokens as rows of this rank's vocabulary shard (host arrays of b s): local[i] = tokens[i] -
 * tp_rank V / t, or row 0 with mine[i] false where another rank's rows hold the token. */
static void real_gpt_local_tokens(const RealGptDims *d, const int *tokens, int *local,
                                  bool *mine)
{
    const int v = real_gpt_vocab(d), lo = d->tp_rank * v;
    for (size_t i = 0; i < real_gpt_tokens(d); i++) {
        mine[i] = tokens[i] >= lo && tokens[i] < lo + v;
        local[i] = mine[i] ? tokens[i] - lo : 0;
    }
}

/* Zeroes the rows [T, h] of x whose token another rank's rows hold. */
static void real_gpt_zero_others(RealGpt *gpt, float *x, const bool *mine)
{
    const size_t h = gpt->dims.hidden;
    for (size_t i = 0; i < real_gpt_tokens(&gpt->dims); i++)
        if (!mine[i])
            gpt->be->fill(gpt->be, x + i * h, 0, h * sizeof(float));
}

/* Positions of the rows, t for row i s + t (host array of b s). */
static int *real_gpt_positions_of(const RealGptDims *d)
{
    int *pos = g_new(int, real_gpt_tokens(d));
    for (size_t i = 0; i < real_gpt_tokens(d); i++)
        pos[i] = (int)(i % (size_t)d->seq_len);
    return pos;
}

/* VocabParallelEmbedding: xf = the sum over the group of each rank's lookup of the tokens in
 * its rows (0 elsewhere), plus wpe[position] (whole on every rank) after the sum. */
static bool real_gpt_embed_fwd_tp(RealGpt *gpt, const RealGptTensors *embed,
                                  const int *tokens, float *xf)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const size_t n = real_gpt_tokens(d), th = n * d->hidden;
    int *local = g_new(int, n), *pos = real_gpt_positions_of(d);
    bool *mine = g_new(bool, n);
    real_gpt_local_tokens(d, tokens, local, mine);
    be->token_embedding_fwd(be, xf, local, embed->at[0], (int)n, d->hidden);
    real_gpt_zero_others(gpt, xf, mine);
    bool ok = real_gpt_tp_sum(gpt, xf, th);
    if (ok && d->rope_theta <= 0) {
        float *wpe_rows = real_gpt_workspace(gpt, th);
        ok = wpe_rows != NULL;
        if (ok) {
            be->token_embedding_fwd(be, wpe_rows, pos, embed->at[1], (int)n, d->hidden);
            be->add(be, xf, xf, wpe_rows, th);
        }
        be->free(be, wpe_rows);
    }
    g_free(local), g_free(pos), g_free(mine);
    return ok;
}

/* Its backward into the fp32 unit gradients: this rank's rows from the tokens they hold,
 * wpe's from every row. */
static bool real_gpt_embed_bwd_tp(RealGpt *gpt, const int *tokens, const float *dx0,
                                  float *grads)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const size_t n = real_gpt_tokens(d), th = n * d->hidden;
    float *dx = real_gpt_workspace(gpt, th);
    if (!dx)
        return false;
    int *local = g_new(int, n), *pos = real_gpt_positions_of(d);
    bool *mine = g_new(bool, n);
    real_gpt_local_tokens(d, tokens, local, mine);
    be->copy(be, dx, dx0, th * sizeof(float));
    real_gpt_zero_others(gpt, dx, mine);
    be->token_embedding_bwd(be, grads, local, dx, (int)n, d->hidden);
    if (d->rope_theta <= 0)
        be->token_embedding_bwd(be, grads + (size_t)real_gpt_vocab(d) * d->hidden, pos, dx0,
                                (int)n, d->hidden);
    be->free(be, dx);
    g_free(local), g_free(pos), g_free(mine);
    return true;
}

/* The vocab-parallel cross-entropy over logits [rows, v] of this rank's vocabulary rows, as
 * softmax_xent does for the whole vocabulary: each rank's per-row log-sum-exp and target
 * logit (0 where another rank holds the target) gathered over the group (2 fp32 per row),
 * the loss from their combination, and the logits turned into their gradient. Computed on
 * the host (copied there and back on a device backend). */
static bool real_gpt_vocab_xent(RealGpt *gpt, float *logits, const int *targets, int rows,
                                float scale, float *loss_out)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const int v = real_gpt_vocab(d), t = real_gpt_tp(d), lo = d->tp_rank * v;
    const size_t n = (size_t)rows * v;
    float *z = g_try_new(float, n), *stats = g_try_new(float, (size_t)2 * rows * t);
    double *lse = g_try_new(double, rows);
    bool ok = z && stats && lse;
    if (ok) {
        be->copy(be, z, logits, n * sizeof(float));
        float *own = stats + (size_t)2 * rows * d->tp_rank;
        for (int i = 0; i < rows; i++) {
            const float *row = z + (size_t)i * v;
            float max = row[0];
            for (int j = 1; j < v; j++)
                max = fmaxf(max, row[j]);
            double sum = 0;
            for (int j = 0; j < v; j++)
                sum += exp((double)row[j] - max);
            const int target = targets[i] - lo;
            own[2 * i] = (float)(max + log(sum));
            own[2 * i + 1] = target >= 0 && target < v ? row[target] : 0.0f;
        }
        ok = gpt->tp_ops->gather_host(gpt->tp_ctx, stats, (size_t)2 * rows * sizeof(float),
                                      &gpt->tp_error);
    }
    double loss = 0;
    for (int i = 0; ok && i < rows; i++) {
        double max = -INFINITY, sum = 0, target_logit = 0;
        for (int q = 0; q < t; q++)
            max = fmax(max, stats[(size_t)2 * rows * q + 2 * i]);
        for (int q = 0; q < t; q++) {
            sum += exp(stats[(size_t)2 * rows * q + 2 * i] - max);
            target_logit += stats[(size_t)2 * rows * q + 2 * i + 1];
        }
        lse[i] = max + log(sum);
        loss += lse[i] - target_logit;
    }
    for (int i = 0; ok && i < rows; i++)
        for (int j = 0; j < v; j++) {
            float *g = z + (size_t)i * v + j;
            const double p = exp((double)*g - lse[i]) - (j + lo == targets[i] ? 1.0 : 0.0);
            *g = (float)(p * scale / rows);
        }
    if (ok) {
        be->copy(be, logits, z, n * sizeof(float));
        *loss_out = (float)(loss / rows);
    }
    g_free(z), g_free(stats), g_free(lse);
    return ok;
}

/* ---- embeddings ---- */

gboolean real_gpt_embed_forward(RealGpt *gpt, const RealBf16 *embed_params, const int *tokens,
                                RealBf16 *x0, GError **error)
{
    RealGptTensors v;
    real_gpt_tensors_at(&gpt->dims, 0, embed_params, &v);
    return real_gpt_embed_forward_t(gpt, &v, tokens, x0, error);
}

gboolean real_gpt_embed_forward_t(RealGpt *gpt, const RealGptTensors *embed, const int *tokens,
                                  RealBf16 *x0, GError **error)
{
    if (!real_gpt_check_tokens(gpt, tokens, "tokens", error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    size_t n = real_gpt_tokens(d) * d->hidden;
    float *xf = real_gpt_workspace(gpt, n);
    if (!xf)
        return real_gpt_nomem(error, "the embedding output");
    if (real_gpt_tp(d) > 1) {
        if (!real_gpt_embed_fwd_tp(gpt, embed, tokens, xf)) {
            be->free(be, xf);
            return real_gpt_failed(gpt, error, "the embedding output");
        }
    } else if (d->rope_theta > 0) {
        be->token_embedding_fwd(be, xf, tokens, embed->at[0], (int)real_gpt_tokens(d),
                                d->hidden);
    } else {
        be->embedding_fwd(be, xf, tokens, embed->at[0], embed->at[1], d->micro_batch,
                          d->seq_len, d->hidden);
    }
    be->f32_to_bf16(be, x0, xf, n);
    be->free(be, xf);
    return TRUE;
}

gboolean real_gpt_embed_backward(RealGpt *gpt, const int *tokens, const float *dx0,
                                 RealBf16 *embed_grads, GError **error)
{
    RealGptTensors v;
    real_gpt_tensors_at(&gpt->dims, 0, embed_grads, &v);
    return real_gpt_embed_backward_t(gpt, tokens, dx0, &v, error);
}

gboolean real_gpt_embed_backward_t(RealGpt *gpt, const int *tokens, const float *dx0,
                                   const RealGptTensors *embed_grads, GError **error)
{
    if (!real_gpt_check_tokens(gpt, tokens, "tokens", error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    size_t n = real_gpt_unit_elems(d, 0);
    float *grads = real_gpt_workspace(gpt, n);
    if (!grads)
        return real_gpt_nomem(error, "the embedding gradients");
    be->fill(be, grads, 0, n * sizeof(float));
    bool ok = true;
    if (real_gpt_tp(d) > 1)
        ok = real_gpt_embed_bwd_tp(gpt, tokens, dx0, grads);
    else if (d->rope_theta > 0)
        be->token_embedding_bwd(be, grads, tokens, dx0, (int)real_gpt_tokens(d), d->hidden);
    else
        be->embedding_bwd(be, grads, grads + (size_t)d->vocab * d->hidden, tokens, dx0,
                          d->micro_batch, d->seq_len, d->hidden);
    if (ok)
        real_gpt_accumulate(gpt, 0, 0, embed_grads, grads, 0, real_gpt_n_tensors(d, 0));
    be->free(be, grads);
    return ok ? TRUE : real_gpt_nomem(error, "the embedding gradients");
}

/* ---- head: final norm, LM head (tied or its own), loss ---- */

/* The head in workspace ws (T(2h + 2) + h(V + 2) floats) and logits [T,V]; wte is the head
 * weight (unit 0's when tied, unit L+1's lm_head when not) and gwte_out its gradient. */
static bool real_gpt_head_compute(RealGpt *gpt, const RealGptTensors *lnf, const RealBf16 *wte,
                                  const RealBf16 *x_last, const int *targets, float dloss_scale,
                                  float *loss_out, float *dx_last,
                                  const RealGptTensors *final_ln_grads, RealBf16 *gwte_out,
                                  float *ws, float *logits)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden, v = real_gpt_vocab(d);
    size_t th = (size_t)t * h;
    float *xf = ws, *y = xf + th, *mean = y + th, *rstd = mean + t, *gwte = rstd + t;
    float *gln = gwte + (size_t)v * h;
    const int norm_tensors = d->rmsnorm ? 1 : 2;

    be->bf16_to_f32(be, xf, x_last, th);
    if (d->rmsnorm)
        be->rmsnorm_fwd(be, y, xf, lnf->at[0], t, h, real_gpt_eps(d));
    else
        be->layernorm_fwd(be, y, mean, rstd, xf, lnf->at[0], lnf->at[1], t, h);
    /* The LM-head GEMM reads the normalised stream as a bf16 tensor, as mixed precision
     * does; its backward uses the same rounded values. */
    be->round_bf16(be, y, th);
    if (!be->gemm(be, false, true, t, v, h, 1.0f, REAL_DTYPE_F32, y, REAL_DTYPE_BF16, wte, 0.0f,
                  logits))
        return false;
    /* Tensor parallelism: the logits of this rank's vocabulary rows (Megatron's
     * vocab-parallel head). */
    if (real_gpt_tp(d) > 1) {
        if (!real_gpt_vocab_xent(gpt, logits, targets, t, dloss_scale, loss_out))
            return false;
    } else {
        be->softmax_xent(be, logits, targets, t, v, dloss_scale, loss_out);
    }
    /* logits = y wte^T: dwte = dlogits^T y, then dy = dlogits wte into y's buffer (y is
     * dead once dwte is formed), summed over the tensor group. */
    if (!be->gemm(be, true, false, v, h, t, 1.0f, REAL_DTYPE_F32, logits, REAL_DTYPE_F32, y,
                  0.0f, gwte))
        return false;
    real_gpt_write_grad(gpt, d->untied ? d->layers + 1 : 0,
                        d->untied ? real_gpt_n_tensors(d, d->layers + 1) - 1 : 0, gwte_out, gwte,
                        (size_t)v * h);
    if (!be->gemm(be, false, false, t, h, v, 1.0f, REAL_DTYPE_F32, logits, REAL_DTYPE_BF16, wte,
                  0.0f, y) ||
        !real_gpt_tp_sum(gpt, y, th))
        return false;
    be->fill(be, gln, 0, 2 * (size_t)h * sizeof(float));
    be->fill(be, dx_last, 0, th * sizeof(float));
    if (d->rmsnorm)
        be->rmsnorm_bwd(be, dx_last, gln, y, xf, lnf->at[0], t, h, real_gpt_eps(d));
    else
        be->layernorm_bwd(be, dx_last, gln, gln + h, y, xf, mean, rstd, lnf->at[0], t, h);
    real_gpt_accumulate(gpt, d->layers + 1, d->layers + 1, final_ln_grads, gln, 0, norm_tensors);
    return true;
}

gboolean real_gpt_head_forward_backward(RealGpt *gpt, const RealBf16 *final_ln_params,
                                        const RealBf16 *embed_params, const RealBf16 *x_last,
                                        const int *targets, float dloss_scale,
                                        float *loss_out, float *dx_last,
                                        RealBf16 *final_ln_grads, RealBf16 *embed_grads,
                                        GError **error)
{
    const int last = gpt->dims.layers + 1;
    RealGptTensors lnf, emb, glnf, gemb;
    real_gpt_tensors_at(&gpt->dims, last, final_ln_params, &lnf);
    real_gpt_tensors_at(&gpt->dims, 0, embed_params, &emb);
    real_gpt_tensors_at(&gpt->dims, last, final_ln_grads, &glnf);
    real_gpt_tensors_at(&gpt->dims, 0, embed_grads, &gemb);
    return real_gpt_head_forward_backward_t(gpt, &lnf, &emb, x_last, targets, dloss_scale,
                                            loss_out, dx_last, &glnf, &gemb, error);
}

gboolean real_gpt_head_forward_backward_t(RealGpt *gpt, const RealGptTensors *final_ln,
                                          const RealGptTensors *embed, const RealBf16 *x_last,
                                          const int *targets, float dloss_scale,
                                          float *loss_out, float *dx_last,
                                          const RealGptTensors *final_ln_grads,
                                          const RealGptTensors *embed_grads, GError **error)
{
    if (!real_gpt_check_tokens(gpt, targets, "targets", error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    size_t t = real_gpt_tokens(d), h = d->hidden;
    /* untied: lm_head is unit L+1's last tensor; tied: wte, unit 0's first */
    const int lm_head = real_gpt_n_tensors(d, d->layers + 1) - 1;
    const RealBf16 *head = d->untied ? final_ln->at[lm_head] : embed->at[0];
    RealBf16 *ghead = d->untied ? final_ln_grads->at[lm_head] : embed_grads->at[0];
    float *logits = be->alloc(be, real_gpt_logits_bytes(d), REAL_MEM_WORKSPACE);
    float *ws = real_gpt_workspace(gpt, t * (2 * h + 2) + h * ((size_t)real_gpt_vocab(d) + 2));
    bool ok = logits && ws &&
              real_gpt_head_compute(gpt, final_ln, head, x_last, targets, dloss_scale,
                                    loss_out, dx_last, final_ln_grads, ghead, ws, logits);
    be->free(be, ws);
    be->free(be, logits);
    if (!ok)
        return real_gpt_failed(gpt, error, "the head workspace");
    return TRUE;
}
