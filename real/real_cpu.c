/* real_cpu: the host implementation of RealBackend (OpenBLAS GEMMs, plain C loops).
 * Staging buffers grow on demand and stay, like a device workspace, counted as `workspace`. */
#include "real_cpu.h"

#include <glib.h>
#include <gsl/gsl_cblas.h>
#include <math.h>
#include <string.h>

#define REAL_CPU_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define REAL_CPU_GELU_K 0.044715f
#define REAL_CPU_SQRT1_2 0.7071067811865476f      /* 1/sqrt(2) */
#define REAL_CPU_INV_SQRT_2PI 0.3989422804014327f /* 1/sqrt(2 pi) */

/* One reusable staging buffer per purpose, so a GEMM's two operands never share one. */
typedef enum {
    REAL_CPU_SLOT_GEMM_A,
    REAL_CPU_SLOT_GEMM_B,
    REAL_CPU_SLOT_ATTENTION,
    REAL_CPU_N_SLOTS
} RealCpuSlot;

typedef struct {
    RealBackend base; /* first, so the interface pointer converts back */
    float *slot[REAL_CPU_N_SLOTS];
    size_t slot_elems[REAL_CPU_N_SLOTS];
} RealCpu;

static RealCpu *real_cpu_of(RealBackend *be)
{
    return (RealCpu *)be;
}

/* ---- memory ---- */

static void *real_cpu_alloc(RealBackend *be, size_t bytes, RealMemCategory cat)
{
    return real_alloc_take(be->tracker, bytes, cat);
}

static void real_cpu_free(RealBackend *be, void *ptr)
{
    real_alloc_release(be->tracker, ptr);
}

static void real_cpu_fill(RealBackend *be, void *dst, int byte_value, size_t bytes)
{
    (void)be;
    memset(dst, byte_value, bytes);
}

static void real_cpu_copy(RealBackend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memmove(dst, src, bytes);
}

static void real_cpu_destroy(RealBackend *be)
{
    RealCpu *cpu = real_cpu_of(be);
    for (int i = 0; i < REAL_CPU_N_SLOTS; i++)
        real_alloc_release(be->tracker, cpu->slot[i]);
    real_alloc_free_tracker(be->tracker);
    g_free(cpu);
}

/* A staging buffer of at least n_elems floats; grows (never shrinks) through the tracker.
 * NULL when the allocation fails. */
static float *real_cpu_slot(RealCpu *cpu, RealCpuSlot slot, size_t n_elems)
{
    if (cpu->slot_elems[slot] >= n_elems && cpu->slot[slot])
        return cpu->slot[slot];
    if (n_elems > SIZE_MAX / sizeof(float))
        return NULL;
    real_alloc_release(cpu->base.tracker, cpu->slot[slot]);
    cpu->slot[slot] = real_alloc_take(cpu->base.tracker, n_elems * sizeof(float),
                                      REAL_MEM_WORKSPACE);
    cpu->slot_elems[slot] = cpu->slot[slot] ? n_elems : 0;
    return cpu->slot[slot];
}

/* ---- precision ---- */

static void real_cpu_bf16_to_f32(RealBackend *be, float *dst, const RealBf16 *src,
                                 size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        dst[i] = real_bf16_to_f32(src[i]);
}

static void real_cpu_f32_to_bf16(RealBackend *be, RealBf16 *dst, const float *src,
                                 size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        dst[i] = real_bf16_from_f32(src[i]);
}

static void real_cpu_round_bf16(RealBackend *be, float *x, size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        x[i] = real_bf16_round_f32(x[i]);
}

static void real_cpu_accumulate_bf16(RealBackend *be, RealBf16 *dst, const float *src,
                                     size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        dst[i] = real_bf16_from_f32(real_bf16_to_f32(dst[i]) + src[i]);
}

static void real_cpu_add_bf16(RealBackend *be, RealBf16 *dst, const RealBf16 *src,
                              size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        dst[i] = real_bf16_from_f32(real_bf16_to_f32(dst[i]) + real_bf16_to_f32(src[i]));
}

static void real_cpu_scale_bf16(RealBackend *be, RealBf16 *x, size_t n_elems, float factor)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        x[i] = real_bf16_from_f32(real_bf16_to_f32(x[i]) * factor);
}

/* An fp32 view of an operand: itself when fp32, else widened into `slot`. */
static const float *real_cpu_as_f32(RealCpu *cpu, RealCpuSlot slot, RealDType dtype,
                                    const void *data, size_t n_elems)
{
    if (dtype == REAL_DTYPE_F32)
        return data;
    float *out = real_cpu_slot(cpu, slot, n_elems);
    if (out)
        real_cpu_bf16_to_f32(&cpu->base, out, data, n_elems);
    return out;
}

/* ---- linear algebra ---- */

/* sgemm rejects k = 0 (its leading dimensions would be 0), but the product is then
 * empty: c = beta * c. */
static void real_cpu_scale_f32(float *c, size_t n_elems, float beta)
{
    for (size_t i = 0; i < n_elems; i++)
        c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

/* A bf16 B operand is widened one panel of columns of op(B) at a time, at most this many
 * elements: staging stays 32 MiB however large the weight (a 7.5B model's tied embedding
 * would need 643 MB widened whole), so the workspace zreal measures stays the model's own. */
#define REAL_CPU_GEMM_PANEL_ELEMS ((size_t)1 << 23)

/* op(B)[:, j0 .. j0 + width) widened into a dense [k, width] (NoTrans) or [width, k] (Trans)
 * panel, in the layout sgemm then reads with leading dimension width or k. */
static void real_cpu_widen_panel(RealBackend *be, float *panel, const RealBf16 *b, bool trans_b,
                                 int n, int k, int j0, int width)
{
    if (trans_b) { /* B is [n, k]: the panel's rows are contiguous */
        real_cpu_bf16_to_f32(be, panel, b + (size_t)j0 * k, (size_t)width * k);
        return;
    }
    for (int r = 0; r < k; r++)
        real_cpu_bf16_to_f32(be, panel + (size_t)r * width, b + (size_t)r * n + j0,
                             (size_t)width);
}

static bool real_cpu_gemm(RealBackend *be, bool trans_a, bool trans_b, int m, int n, int k,
                          float alpha, RealDType a_dtype, const void *a, RealDType b_dtype,
                          const void *b, float beta, float *c)
{
    if (m <= 0 || n <= 0)
        return true;
    if (k <= 0) {
        real_cpu_scale_f32(c, (size_t)m * n, beta);
        return true;
    }
    RealCpu *cpu = real_cpu_of(be);
    const float *af = real_cpu_as_f32(cpu, REAL_CPU_SLOT_GEMM_A, a_dtype, a, (size_t)m * k);
    if (!af)
        return false;
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    if (b_dtype == REAL_DTYPE_F32) {
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, af, trans_a ? m : k, b,
                    trans_b ? k : n, beta, c, n);
        return true;
    }
    const int width = (int)MAX((size_t)1, MIN((size_t)n, REAL_CPU_GEMM_PANEL_ELEMS / (size_t)k));
    float *panel = real_cpu_slot(cpu, REAL_CPU_SLOT_GEMM_B, (size_t)width * k);
    if (!panel)
        return false;
    for (int j0 = 0; j0 < n; j0 += width) {
        const int w = MIN(width, n - j0);
        real_cpu_widen_panel(be, panel, b, trans_b, n, k, j0, w);
        cblas_sgemm(CblasRowMajor, ta, tb, m, w, k, alpha, af, trans_a ? m : k, panel,
                    trans_b ? k : w, beta, c + j0, n);
    }
    return true;
}

static void real_cpu_bias_fwd(RealBackend *be, float *y, const RealBf16 *bias, int rows,
                              int cols)
{
    (void)be;
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            row[c] += real_bf16_to_f32(bias[c]);
    }
}

static void real_cpu_bias_bwd(RealBackend *be, float *dbias, const float *dy, int rows,
                              int cols)
{
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *row = dy + (size_t)r * cols;
        for (int c = 0; c < cols; c++)
            dbias[c] += row[c];
    }
}

static void real_cpu_add(RealBackend *be, float *out, const float *a, const float *b,
                         size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        out[i] = a[i] + b[i];
}

/* ---- embedding ---- */

static void real_cpu_embedding_fwd(RealBackend *be, float *x, const int *tokens,
                                   const RealBf16 *wte, const RealBf16 *wpe, int batch,
                                   int seq_len, int hidden)
{
    (void)be;
    for (int i = 0; i < batch; i++) {
        for (int t = 0; t < seq_len; t++) {
            size_t row = (size_t)i * seq_len + t;
            const RealBf16 *tok = wte + (size_t)tokens[row] * hidden;
            const RealBf16 *pos = wpe + (size_t)t * hidden;
            float *out = x + row * hidden;
            for (int c = 0; c < hidden; c++)
                out[c] = real_bf16_to_f32(tok[c]) + real_bf16_to_f32(pos[c]);
        }
    }
}

static void real_cpu_embedding_bwd(RealBackend *be, float *dwte, float *dwpe,
                                   const int *tokens, const float *dx, int batch, int seq_len,
                                   int hidden)
{
    (void)be;
    for (int i = 0; i < batch; i++) {
        for (int t = 0; t < seq_len; t++) {
            size_t row = (size_t)i * seq_len + t;
            float *tok = dwte + (size_t)tokens[row] * hidden;
            float *pos = dwpe + (size_t)t * hidden;
            const float *g = dx + row * hidden;
            for (int c = 0; c < hidden; c++) {
                tok[c] += g[c];
                pos[c] += g[c];
            }
        }
    }
}

/* ---- layer norm ---- */

static void real_cpu_layernorm_fwd(RealBackend *be, float *y, float *mean, float *rstd,
                                   const float *x, const RealBf16 *gain, const RealBf16 *bias,
                                   int rows, int cols)
{
    const double eps = REAL_LAYERNORM_EPS(be);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float *yr = y + (size_t)r * cols;
        /* Two passes in double: the variance of nearly constant rows stays accurate. */
        double sum = 0.0, sq = 0.0;
        for (int c = 0; c < cols; c++)
            sum += xr[c];
        double mu = sum / cols;
        for (int c = 0; c < cols; c++)
            sq += (xr[c] - mu) * (xr[c] - mu);
        float m = (float)mu;
        float rs = (float)(1.0 / sqrt(sq / cols + eps));
        for (int c = 0; c < cols; c++)
            yr[c] = (xr[c] - m) * rs * real_bf16_to_f32(gain[c]) + real_bf16_to_f32(bias[c]);
        mean[r] = m;
        rstd[r] = rs;
    }
}

static void real_cpu_layernorm_bwd(RealBackend *be, float *dx, float *dgain, float *dbias,
                                   const float *dy, const float *x, const float *mean,
                                   const float *rstd, const RealBf16 *gain, int rows, int cols)
{
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols, *dyr = dy + (size_t)r * cols;
        float *dxr = dx + (size_t)r * cols;
        float m = mean[r], rs = rstd[r];
        /* dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gain. */
        float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
        for (int c = 0; c < cols; c++) {
            float xhat = (xr[c] - m) * rs;
            float dxhat = dyr[c] * real_bf16_to_f32(gain[c]);
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * xhat;
            dgain[c] += dyr[c] * xhat;
            dbias[c] += dyr[c];
        }
        float mean_dxhat = sum_dxhat / cols, mean_dxhat_xhat = sum_dxhat_xhat / cols;
        for (int c = 0; c < cols; c++) {
            float xhat = (xr[c] - m) * rs;
            float dxhat = dyr[c] * real_bf16_to_f32(gain[c]);
            dxr[c] += rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        }
    }
}

/* ---- attention ---- */

/* Causal softmax of each row of scores [seq_len, seq_len] in place; entries past the
 * diagonal, and before the window's first key, become 0 so the tile can feed full GEMMs
 * (and the softmax backward, which multiplies by them, needs no mask of its own). */
static void real_cpu_causal_softmax(float *scores, int seq_len, int window)
{
    for (int t = 0; t < seq_len; t++) {
        float *row = scores + (size_t)t * seq_len;
        const int lo = REAL_FIRST_KEY(t, window);
        float max = row[lo];
        for (int u = lo + 1; u <= t; u++)
            max = fmaxf(max, row[u]);
        float sum = 0.0f;
        for (int u = lo; u <= t; u++) {
            row[u] = expf(row[u] - max);
            sum += row[u];
        }
        for (int u = lo; u <= t; u++)
            row[u] /= sum;
        for (int u = 0; u < lo; u++)
            row[u] = 0.0f;
        for (int u = t + 1; u < seq_len; u++)
            row[u] = 0.0f;
    }
}

/* Loads one head's stored probs tile into fp32. */
static void real_cpu_load_probs(RealBackend *be, float *tile, const void *probs,
                                RealDType dtype, size_t offset_elems, size_t n_elems)
{
    if (dtype == REAL_DTYPE_F32)
        memcpy(tile, (const float *)probs + offset_elems, n_elems * sizeof(float));
    else
        real_cpu_bf16_to_f32(be, tile, (const RealBf16 *)probs + offset_elems, n_elems);
}

/* Stores one head's probs tile in `dtype`, first rounding the tile itself so that the
 * caller computes with exactly the stored values. */
static void real_cpu_store_probs(RealBackend *be, float *tile, void *probs, RealDType dtype,
                                 size_t offset_elems, size_t n_elems)
{
    if (dtype == REAL_DTYPE_BF16)
        real_cpu_round_bf16(be, tile, n_elems);
    if (!probs)
        return;
    if (dtype == REAL_DTYPE_F32)
        memcpy((float *)probs + offset_elems, tile, n_elems * sizeof(float));
    else
        real_cpu_f32_to_bf16(be, (RealBf16 *)probs + offset_elems, tile, n_elems);
}

/* Query head j of a grouped-query layout reads key/value head j / (heads / kv_heads); qkv
 * rows are [q: heads d, k: kv_heads d, v: kv_heads d]. */
typedef struct {
    int h, kvd, ld, group;
} RealCpuHeads;

static RealCpuHeads real_cpu_heads(int heads, int kv_heads, int head_dim)
{
    return (RealCpuHeads){.h = heads * head_dim, .kvd = kv_heads * head_dim,
                          .ld = (heads + 2 * kv_heads) * head_dim, .group = heads / kv_heads};
}

static bool real_cpu_attention_gqa_fwd(RealBackend *be, float *out, void *probs,
                                       RealDType probs_dtype, const float *qkv, int batch,
                                       int seq_len, int heads, int kv_heads, int head_dim)
{
    const RealCpuHeads g = real_cpu_heads(heads, kv_heads, head_dim);
    int h = g.h, ld = g.ld, s = seq_len;
    size_t tile_elems = (size_t)s * s;
    float *tile = real_cpu_slot(real_cpu_of(be), REAL_CPU_SLOT_ATTENTION, 2 * tile_elems);
    if (!tile)
        return false;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int i = 0; i < batch; i++) {
        for (int j = 0; j < heads; j++) {
            const float *row = qkv + (size_t)i * s * ld;
            const float *q = row + (size_t)j * head_dim;
            const float *k = row + h + (size_t)(j / g.group) * head_dim, *v = k + g.kvd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, head_dim, scale, q, ld,
                        k, ld, 0.0f, tile, s);
            real_cpu_causal_softmax(tile, s, be->attention_window);
            size_t offset = ((size_t)i * heads + j) * tile_elems;
            real_cpu_store_probs(be, tile, probs, probs_dtype, offset, tile_elems);
            float *o = out + (size_t)i * s * h + (size_t)j * head_dim;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, head_dim, s, 1.0f, tile,
                        s, v, ld, 0.0f, o, h);
        }
    }
    return true;
}

static bool real_cpu_attention_fwd(RealBackend *be, float *out, void *probs,
                                   RealDType probs_dtype, const float *qkv, int batch,
                                   int seq_len, int heads, int head_dim)
{
    return real_cpu_attention_gqa_fwd(be, out, probs, probs_dtype, qkv, batch, seq_len, heads,
                                      heads, head_dim);
}

/* dS = P o (dP - rowsum(dP o P)), in place over dP: the softmax backward, per row. */
static void real_cpu_softmax_bwd(const float *p, float *dp, int seq_len)
{
    for (int t = 0; t < seq_len; t++) {
        const float *pr = p + (size_t)t * seq_len;
        float *dr = dp + (size_t)t * seq_len;
        float dot = 0.0f;
        for (int u = 0; u <= t; u++)
            dot += pr[u] * dr[u];
        for (int u = 0; u < seq_len; u++)
            dr[u] = u <= t ? pr[u] * (dr[u] - dot) : 0.0f;
    }
}

/* Zeroes the k and v columns of every row of dqkv: grouped query heads accumulate there. */
static void real_cpu_zero_kv(float *dqkv, size_t rows, const RealCpuHeads *g)
{
    for (size_t r = 0; r < rows; r++)
        memset(dqkv + r * g->ld + g->h, 0, 2 * (size_t)g->kvd * sizeof(float));
}

static bool real_cpu_attention_gqa_bwd(RealBackend *be, float *dqkv, const float *dout,
                                       const float *qkv, const void *probs,
                                       RealDType probs_dtype, int batch, int seq_len, int heads,
                                       int kv_heads, int head_dim)
{
    const RealCpuHeads g = real_cpu_heads(heads, kv_heads, head_dim);
    int h = g.h, ld = g.ld, s = seq_len;
    size_t tile_elems = (size_t)s * s;
    float *p = real_cpu_slot(real_cpu_of(be), REAL_CPU_SLOT_ATTENTION, 2 * tile_elems);
    if (!p)
        return false;
    float *dp = p + tile_elems;
    float scale = 1.0f / sqrtf((float)head_dim);
    real_cpu_zero_kv(dqkv, (size_t)batch * s, &g);
    for (int i = 0; i < batch; i++) {
        for (int j = 0; j < heads; j++) {
            size_t col = (size_t)j * head_dim, kv_col = h + (size_t)(j / g.group) * head_dim;
            const float *row = qkv + (size_t)i * s * ld, *q = row + col;
            const float *k = row + kv_col, *v = k + g.kvd;
            float *drow = dqkv + (size_t)i * s * ld, *dq = drow + col;
            float *dk = drow + kv_col, *dv = dk + g.kvd;
            const float *dout_ij = dout + (size_t)i * s * h + col;
            real_cpu_load_probs(be, p, probs, probs_dtype, ((size_t)i * heads + j) * tile_elems,
                                tile_elems);
            /* out = P v: dP = dout v^T, dv += P^T dout. */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, head_dim, 1.0f, dout_ij,
                        h, v, ld, 0.0f, dp, s);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, head_dim, s, 1.0f, p, s,
                        dout_ij, h, 1.0f, dv, ld);
            real_cpu_softmax_bwd(p, dp, s);
            /* scores = scale q k^T: dq = scale dS k, dk += scale dS^T q. */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, head_dim, s, scale, dp,
                        s, k, ld, 0.0f, dq, ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s, head_dim, s, scale, dp, s,
                        q, ld, 1.0f, dk, ld);
        }
    }
    return true;
}

static bool real_cpu_attention_bwd(RealBackend *be, float *dqkv, const float *dout,
                                   const float *qkv, const void *probs, RealDType probs_dtype,
                                   int batch, int seq_len, int heads, int head_dim)
{
    return real_cpu_attention_gqa_bwd(be, dqkv, dout, qkv, probs, probs_dtype, batch, seq_len,
                                      heads, heads, head_dim);
}

/* ---- fused attention: blocks of keys, a running max and sum, the log-sum-exp kept ---- */

#define REAL_CPU_FLASH_BLOCK 32

static bool real_cpu_flash_attention_fwd(RealBackend *be, float *out, float *lse,
                                         const float *qkv, int batch, int seq_len, int heads,
                                         int kv_heads, int head_dim)
{
    const RealCpuHeads g = real_cpu_heads(heads, kv_heads, head_dim);
    const int s = seq_len, d = head_dim, B = REAL_CPU_FLASH_BLOCK;
    /* One query row's running output and one block of its scores. */
    float *acc = real_cpu_slot(real_cpu_of(be), REAL_CPU_SLOT_ATTENTION, (size_t)d + B);
    if (!acc)
        return false;
    float *sc = acc + d;
    const float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < batch; i++)
        for (int j = 0; j < heads; j++) {
            const float *row = qkv + (size_t)i * s * g.ld;
            const size_t qc = (size_t)j * d, kc = g.h + (size_t)(j / g.group) * d;
            for (int t = 0; t < s; t++) {
                const float *q = row + (size_t)t * g.ld + qc;
                float m = -INFINITY, l = 0.0f;
                memset(acc, 0, (size_t)d * sizeof(float));
                for (int u0 = REAL_FIRST_KEY(t, be->attention_window); u0 <= t; u0 += B) {
                    const int n = MIN(B, t + 1 - u0);
                    float bm = -INFINITY;
                    for (int u = 0; u < n; u++) {
                        const float *k = row + (size_t)(u0 + u) * g.ld + kc;
                        float dot = 0.0f;
                        for (int c = 0; c < d; c++)
                            dot += q[c] * k[c];
                        sc[u] = dot * scale;
                        bm = fmaxf(bm, sc[u]);
                    }
                    const float m_new = fmaxf(m, bm), rescale = expf(m - m_new);
                    l *= rescale;
                    for (int c = 0; c < d; c++)
                        acc[c] *= rescale;
                    for (int u = 0; u < n; u++) {
                        const float pu = expf(sc[u] - m_new);
                        const float *v = row + (size_t)(u0 + u) * g.ld + kc + g.kvd;
                        l += pu;
                        for (int c = 0; c < d; c++)
                            acc[c] += pu * v[c];
                    }
                    m = m_new;
                }
                float *o = out + ((size_t)i * s + t) * g.h + qc;
                for (int c = 0; c < d; c++)
                    o[c] = acc[c] / l;
                lse[((size_t)i * heads + j) * s + t] = m + logf(l);
            }
        }
    return true;
}

static bool real_cpu_flash_attention_bwd(RealBackend *be, float *dqkv, const float *dout,
                                         const float *qkv, const float *out, const float *lse,
                                         int batch, int seq_len, int heads, int kv_heads,
                                         int head_dim)
{
    const RealCpuHeads g = real_cpu_heads(heads, kv_heads, head_dim);
    const int s = seq_len, d = head_dim;
    const float scale = 1.0f / sqrtf((float)d);
    memset(dqkv, 0, (size_t)batch * s * g.ld * sizeof(float));
    for (int i = 0; i < batch; i++)
        for (int j = 0; j < heads; j++) {
            const float *row = qkv + (size_t)i * s * g.ld;
            float *drow = dqkv + (size_t)i * s * g.ld;
            const size_t qc = (size_t)j * d, kc = g.h + (size_t)(j / g.group) * d;
            for (int t = 0; t < s; t++) {
                const float *q = row + (size_t)t * g.ld + qc;
                const float *dot_ = dout + ((size_t)i * s + t) * g.h + qc;
                const float *o = out + ((size_t)i * s + t) * g.h + qc;
                const float row_lse = lse[((size_t)i * heads + j) * s + t];
                float *dq = drow + (size_t)t * g.ld + qc;
                float delta = 0.0f; /* rowsum(dout o out) */
                for (int c = 0; c < d; c++)
                    delta += dot_[c] * o[c];
                /* Each probability again from q, k and the log-sum-exp, one key at a time. */
                for (int u = REAL_FIRST_KEY(t, be->attention_window); u <= t; u++) {
                    const float *k = row + (size_t)u * g.ld + kc, *v = k + g.kvd;
                    float *dk = drow + (size_t)u * g.ld + kc, *dv = dk + g.kvd;
                    float dot = 0.0f, dp = 0.0f;
                    for (int c = 0; c < d; c++) {
                        dot += q[c] * k[c];
                        dp += dot_[c] * v[c];
                    }
                    const float p = expf(dot * scale - row_lse);
                    const float ds = p * (dp - delta) * scale;
                    for (int c = 0; c < d; c++) {
                        dv[c] += p * dot_[c];
                        dq[c] += ds * k[c];
                        dk[c] += ds * q[c];
                    }
                }
            }
        }
    return true;
}

/* ---- the Llama-family block: token embedding, RMSNorm, rotary embeddings, SwiGLU ---- */

static void real_cpu_token_embedding_fwd(RealBackend *be, float *x, const int *tokens,
                                         const RealBf16 *wte, int rows, int hidden)
{
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < hidden; c++)
            x[(size_t)r * hidden + c] = real_bf16_to_f32(wte[(size_t)tokens[r] * hidden + c]);
}

static void real_cpu_token_embedding_bwd(RealBackend *be, float *dwte, const int *tokens,
                                         const float *dx, int rows, int hidden)
{
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < hidden; c++)
            dwte[(size_t)tokens[r] * hidden + c] += dx[(size_t)r * hidden + c];
}

static float real_cpu_rms_rstd(const float *x, int cols, float eps)
{
    double sq = 0.0;
    for (int c = 0; c < cols; c++)
        sq += (double)x[c] * x[c];
    return (float)(1.0 / sqrt(sq / cols + eps));
}

static void real_cpu_rmsnorm_fwd(RealBackend *be, float *y, const float *x, const RealBf16 *gain,
                                 int rows, int cols, float eps)
{
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float *yr = y + (size_t)r * cols;
        const float rs = real_cpu_rms_rstd(xr, cols, eps);
        for (int c = 0; c < cols; c++)
            yr[c] = xr[c] * rs * real_bf16_to_f32(gain[c]);
    }
}

static void real_cpu_rmsnorm_bwd(RealBackend *be, float *dx, float *dgain, const float *dy,
                                 const float *x, const RealBf16 *gain, int rows, int cols,
                                 float eps)
{
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols, *dyr = dy + (size_t)r * cols;
        float *dxr = dx + (size_t)r * cols;
        const float rs = real_cpu_rms_rstd(xr, cols, eps);
        float sum = 0.0f;
        for (int c = 0; c < cols; c++) {
            const float xhat = xr[c] * rs;
            sum += dyr[c] * real_bf16_to_f32(gain[c]) * xhat;
            dgain[c] += dyr[c] * xhat;
        }
        const float mean = sum / cols;
        for (int c = 0; c < cols; c++)
            dxr[c] += rs * (dyr[c] * real_bf16_to_f32(gain[c]) - xr[c] * rs * mean);
    }
}

static bool real_cpu_rope(RealBackend *be, float *qkv, int batch, int seq_len, int heads,
                          int kv_heads, int head_dim, const RealRope *rope, bool inverse)
{
    (void)be;
    const int half = rope->rot_dim / 2, ld = (heads + 2 * kv_heads) * head_dim;
    for (int r = 0; r < batch * seq_len; r++) {
        const int t = r % seq_len;
        for (int c = 0; c < half; c++) {
            const double angle = t * real_rope_inv_freq(rope, c);
            const float cs = (float)cos(angle), sn = (float)(inverse ? -sin(angle) : sin(angle));
            /* The q heads and the k heads, which follow them in the row. */
            for (int j = 0; j < heads + kv_heads; j++) {
                float *x = qkv + (size_t)r * ld + (size_t)j * head_dim;
                const float a = x[c], b = x[c + half];
                x[c] = a * cs - b * sn;
                x[c + half] = b * cs + a * sn;
            }
        }
    }
    return true;
}

/* ---- activations: GELU (tanh and exact), SiLU, and the gated MLP ---- */

static float real_cpu_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* The tanh GELU, 0.5 x (1 + tanh u) with u = c (x + k x^3), computed as x sigmoid(2u): the
 * same function (0.5 (1 + tanh u) = 1 / (1 + exp(-2u))), because its cost must not depend on
 * the values. glibc's tanhf takes expm1f's longer paths as |u| grows: 10 ns a call at
 * |u| ~ 0.01, 20 ns at |u| ~ 1 on this machine, where expf takes 3.1-3.4 ns at any |u|. With
 * tanhf, tiny's GELU-heavy blocks ran 15-20% slower once training had moved the activations
 * than at the initial weights that the microbenchmark times (real_opseq steps with lr 0), and
 * a GPU's kernel runs at one speed whatever the values. Past |2u| ~ 88 expf overflows to inf
 * and the sigmoid is 0, as 1 + tanhf(u) is there. */
static float real_cpu_gelu_tanh_sigmoid(float x)
{
    const float inner = REAL_CPU_GELU_C * (x + REAL_CPU_GELU_K * x * x * x);
    return real_cpu_sigmoid(2.0f * inner);
}

static float real_cpu_gelu_tanh(float x)
{
    return x * real_cpu_gelu_tanh_sigmoid(x);
}

/* d/dx x s(x), s = sigmoid(2u): s + x 2 s (1 - s) u', the tanh form's
 * 0.5 (1 + th) + 0.5 x (1 - th^2) u' with th = 2s - 1. */
static float real_cpu_gelu_tanh_grad(float x)
{
    const float s = real_cpu_gelu_tanh_sigmoid(x);
    const float dinner = REAL_CPU_GELU_C * (1.0f + 3.0f * REAL_CPU_GELU_K * x * x);
    return s + 2.0f * x * s * (1.0f - s) * dinner;
}

/* x Phi(x) and its derivative Phi(x) + x phi(x), Phi the standard normal's distribution. */
static float real_cpu_gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * REAL_CPU_SQRT1_2));
}

static float real_cpu_gelu_erf_grad(float x)
{
    return 0.5f * (1.0f + erff(x * REAL_CPU_SQRT1_2)) +
           x * REAL_CPU_INV_SQRT_2PI * expf(-0.5f * x * x);
}

static float real_cpu_act(float x, RealActivation act)
{
    switch (act) {
    case REAL_ACT_SILU:
        return x * real_cpu_sigmoid(x);
    case REAL_ACT_GELU_TANH:
        return real_cpu_gelu_tanh(x);
    case REAL_ACT_GELU_ERF:
        return real_cpu_gelu_erf(x);
    }
    return NAN;
}

static float real_cpu_act_grad(float x, RealActivation act)
{
    switch (act) {
    case REAL_ACT_SILU: {
        const float sg = real_cpu_sigmoid(x);
        return sg * (1.0f + x * (1.0f - sg));
    }
    case REAL_ACT_GELU_TANH:
        return real_cpu_gelu_tanh_grad(x);
    case REAL_ACT_GELU_ERF:
        return real_cpu_gelu_erf_grad(x);
    }
    return NAN;
}

static void real_cpu_glu_fwd(RealBackend *be, float *out, const float *gate_up, int rows,
                             int ffn, RealActivation act)
{
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ffn; c++) {
            const float gt = gate_up[(size_t)r * 2 * ffn + c];
            const float up = gate_up[(size_t)r * 2 * ffn + ffn + c];
            out[(size_t)r * ffn + c] = real_cpu_act(gt, act) * up;
        }
}

static void real_cpu_glu_bwd(RealBackend *be, float *dgate_up, const float *dout,
                             const float *gate_up, int rows, int ffn, RealActivation act)
{
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ffn; c++) {
            const size_t gi = (size_t)r * 2 * ffn + c, ui = gi + (size_t)ffn;
            const float gt = gate_up[gi], up = gate_up[ui];
            const float dy = dout[(size_t)r * ffn + c];
            dgate_up[gi] = dy * up * real_cpu_act_grad(gt, act);
            dgate_up[ui] = dy * real_cpu_act(gt, act);
        }
}

static void real_cpu_gelu_fwd(RealBackend *be, float *y, const float *x, size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        y[i] = real_cpu_gelu_tanh(x[i]);
}

static void real_cpu_gelu_bwd(RealBackend *be, float *dx, const float *dy, const float *x,
                              size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        dx[i] = dy[i] * real_cpu_gelu_tanh_grad(x[i]);
}

static void real_cpu_gelu_erf_fwd(RealBackend *be, float *y, const float *x, size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        y[i] = real_cpu_gelu_erf(x[i]);
}

static void real_cpu_gelu_erf_bwd(RealBackend *be, float *dx, const float *dy, const float *x,
                                  size_t n_elems)
{
    (void)be;
    for (size_t i = 0; i < n_elems; i++)
        dx[i] = dy[i] * real_cpu_gelu_erf_grad(x[i]);
}

/* ---- loss ---- */

static void real_cpu_softmax_xent(RealBackend *be, float *logits, const int *targets, int rows,
                                  int vocab, float dloss_scale, float *loss_out)
{
    (void)be;
    double loss_sum = 0.0;
    float grad_scale = dloss_scale / (float)rows;
    for (int r = 0; r < rows; r++) {
        float *row = logits + (size_t)r * vocab;
        float target_logit = row[targets[r]];
        float max = row[0];
        for (int c = 1; c < vocab; c++)
            max = fmaxf(max, row[c]);
        /* Shifted by the max so exp cannot overflow; the sum in double keeps large
         * vocabularies accurate. */
        double sum = 0.0;
        for (int c = 0; c < vocab; c++) {
            row[c] = expf(row[c] - max);
            sum += row[c];
        }
        loss_sum += log(sum) + max - target_logit;
        float inv_sum = (float)(1.0 / sum);
        for (int c = 0; c < vocab; c++)
            row[c] *= inv_sum * grad_scale;
        row[targets[r]] -= grad_scale;
    }
    *loss_out = (float)(loss_sum / rows);
}

/* ---- optimizer ---- */

static void real_cpu_adam_step(RealBackend *be, const RealAdamHyper *hyper, size_t n_elems,
                               float *master, float *m, float *v, const RealBf16 *grad,
                               RealBf16 *param)
{
    (void)be;
    float b1 = hyper->beta1, b2 = hyper->beta2;
    float correct1 = (float)(1.0 - pow(b1, (double)hyper->step));
    float correct2 = (float)(1.0 - pow(b2, (double)hyper->step));
    for (size_t i = 0; i < n_elems; i++) {
        float g = real_bf16_to_f32(grad[i]) * hyper->grad_scale;
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        float update = (m[i] / correct1) / (sqrtf(v[i] / correct2) + hyper->eps);
        master[i] -= hyper->lr * (update + hyper->weight_decay * master[i]);
        param[i] = real_bf16_from_f32(master[i]);
    }
}

RealBackend *real_cpu_backend_new(void)
{
    RealCpu *cpu = g_new0(RealCpu, 1);
    cpu->base = (RealBackend){
        .name = "cpu",
        .tracker = real_alloc_new(),
        .alloc = real_cpu_alloc,
        .free = real_cpu_free,
        .fill = real_cpu_fill,
        .copy = real_cpu_copy,
        .destroy = real_cpu_destroy,
        .bf16_to_f32 = real_cpu_bf16_to_f32,
        .f32_to_bf16 = real_cpu_f32_to_bf16,
        .round_bf16 = real_cpu_round_bf16,
        .accumulate_bf16 = real_cpu_accumulate_bf16,
        .add_bf16 = real_cpu_add_bf16,
        .scale_bf16 = real_cpu_scale_bf16,
        .gemm = real_cpu_gemm,
        .bias_fwd = real_cpu_bias_fwd,
        .bias_bwd = real_cpu_bias_bwd,
        .add = real_cpu_add,
        .embedding_fwd = real_cpu_embedding_fwd,
        .embedding_bwd = real_cpu_embedding_bwd,
        .layernorm_fwd = real_cpu_layernorm_fwd,
        .layernorm_bwd = real_cpu_layernorm_bwd,
        .attention_fwd = real_cpu_attention_fwd,
        .attention_bwd = real_cpu_attention_bwd,
        .gelu_fwd = real_cpu_gelu_fwd,
        .gelu_bwd = real_cpu_gelu_bwd,
        .softmax_xent = real_cpu_softmax_xent,
        .adam_step = real_cpu_adam_step,
        .token_embedding_fwd = real_cpu_token_embedding_fwd,
        .token_embedding_bwd = real_cpu_token_embedding_bwd,
        .rmsnorm_fwd = real_cpu_rmsnorm_fwd,
        .rmsnorm_bwd = real_cpu_rmsnorm_bwd,
        .rope = real_cpu_rope,
        .glu_fwd = real_cpu_glu_fwd,
        .glu_bwd = real_cpu_glu_bwd,
        .gelu_erf_fwd = real_cpu_gelu_erf_fwd,
        .gelu_erf_bwd = real_cpu_gelu_erf_bwd,
        .attention_gqa_fwd = real_cpu_attention_gqa_fwd,
        .attention_gqa_bwd = real_cpu_attention_gqa_bwd,
        .flash_attention_fwd = real_cpu_flash_attention_fwd,
        .flash_attention_bwd = real_cpu_flash_attention_bwd,
    };
    return &cpu->base;
}
