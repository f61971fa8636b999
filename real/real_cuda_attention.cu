/* real_cuda_attention: the CUDA backend's attention: eager causal attention (cuBLAS GEMMs
 * around own softmax kernels), grouped-query attention, and fused (flash) attention. */
#include "real_cuda_internal.cuh"

/* ---- attention ---- */

/* Causal softmax of rows of `scores` [rows = heads s, s] (one sample), a warp per row: probs
 * (when not NULL) in probs_dtype, and `tile`, the same values in the GEMM dtype for P v.
 * Rounding to bf16 happens before the tile is written when probs are bf16, so the product
 * uses exactly the stored values. Entries past the diagonal, and before the window's first
 * key, are 0 (so the backward, which multiplies by them, needs no mask of its own). */
template <typename TileT>
__global__ void real_cuda_k_causal_softmax(const float *scores, TileT *tile, void *probs,
                                           bool probs_bf16, int rows, int seq_len, int window)
{
    const int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) /* the same for the whole warp: no lane is left out of a shuffle */
        return;
    const int t = row % seq_len, lo = REAL_FIRST_KEY(t, window);
    const size_t base = (size_t)row * seq_len;
    const float *in = scores + base;
    float max = -INFINITY;
    for (int u = lo + lane; u <= t; u += 32)
        max = fmaxf(max, in[u]);
    max = real_cuda_warp_max(max);
    float sum = 0.0f;
    for (int u = lo + lane; u <= t; u += 32)
        sum += expf(in[u] - max);
    sum = real_cuda_warp_sum(sum);
    for (int u = lane; u < seq_len; u += 32) {
        float p = u >= lo && u <= t ? expf(in[u] - max) / sum : 0.0f;
        if (probs_bf16) {
            const RealBf16 stored = real_cuda_narrow(p);
            p = real_cuda_widen(stored);
            if (probs)
                ((RealBf16 *)probs)[base + u] = stored;
        } else if (probs) {
            ((float *)probs)[base + u] = p;
        }
        real_cuda_store(tile + base + u, p);
    }
}

/* dS = P o (dP - rowsum(dP o P)), zero past the diagonal, into ds in the GEMM dtype; P as
 * stored (probs_dtype). A warp per row of one sample. */
template <typename TileT>
__global__ void real_cuda_k_causal_softmax_bwd(TileT *ds, const float *dp, const void *probs,
                                               bool probs_bf16, int rows, int seq_len)
{
    const int row = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    const int t = row % seq_len;
    const size_t base = (size_t)row * seq_len;
    const float *dpr = dp + base;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += 32) {
        const float p = probs_bf16 ? real_cuda_widen(((const RealBf16 *)probs)[base + u])
                                   : ((const float *)probs)[base + u];
        dot += p * dpr[u];
    }
    dot = real_cuda_warp_sum(dot);
    for (int u = lane; u < seq_len; u += 32) {
        float value = 0.0f;
        if (u <= t) {
            const float p = probs_bf16 ? real_cuda_widen(((const RealBf16 *)probs)[base + u])
                                       : ((const float *)probs)[base + u];
            value = p * (dpr[u] - dot);
        }
        real_cuda_store(ds + base + u, value);
    }
}

/* Blocks for a warp per row. */
static unsigned real_cuda_warp_blocks(int rows)
{
    return (unsigned)((rows + REAL_CUDA_WARPS - 1) / REAL_CUDA_WARPS);
}

static void real_cuda_softmax(RealCuda *cu, const float *scores, void *tile, void *probs,
                              RealDType probs_dtype, int rows, int seq_len)
{
    const bool probs_bf16 = probs_dtype == REAL_DTYPE_BF16;
    const unsigned blocks = real_cuda_warp_blocks(rows);
    if (real_cuda_gemm_dtype(cu) == REAL_DTYPE_BF16)
        real_cuda_k_causal_softmax<<<blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(
            scores, (RealBf16 *)tile, probs, probs_bf16, rows, seq_len,
            cu->base.attention_window);
    else
        real_cuda_k_causal_softmax<<<blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(
            scores, (float *)tile, probs, probs_bf16, rows, seq_len,
            cu->base.attention_window);
    real_cuda_launched(cu, "causal softmax");
}

static void real_cuda_softmax_bwd(RealCuda *cu, void *ds, const float *dp, const void *probs,
                                  RealDType probs_dtype, int rows, int seq_len)
{
    const bool probs_bf16 = probs_dtype == REAL_DTYPE_BF16;
    const unsigned blocks = real_cuda_warp_blocks(rows);
    if (real_cuda_gemm_dtype(cu) == REAL_DTYPE_BF16)
        real_cuda_k_causal_softmax_bwd<<<blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(
            (RealBf16 *)ds, dp, probs, probs_bf16, rows, seq_len);
    else
        real_cuda_k_causal_softmax_bwd<<<blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(
            (float *)ds, dp, probs, probs_bf16, rows, seq_len);
    real_cuda_launched(cu, "causal softmax backward");
}

/* Per sample i and all heads at once (strided over heads, whose q, k, v columns are
 * head_dim apart): scores = scale q k^T, P = causal softmax, out = P v. The heads of one
 * sample share a [heads, s, s] score tile, so scratch stays O(heads s^2) whatever the batch. */
static bool real_cuda_attention_fwd(RealBackend *be, float *out, void *probs,
                                    RealDType probs_dtype, const float *qkv, int batch,
                                    int seq_len, int heads, int head_dim)
{
    RealCuda *cu = real_cuda_of(be);
    const int h = heads * head_dim, ld = 3 * h, s = seq_len;
    if (batch <= 0 || s <= 0 || heads <= 0 || head_dim <= 0)
        return !cu->failed;
    const RealDType gt = real_cuda_gemm_dtype(cu);
    const size_t gsize = real_cuda_dtype_bytes(gt), tile_elems = (size_t)heads * s * s;
    const size_t qkv_elems = (size_t)batch * s * ld;
    void *qkv_tmp = gt == REAL_DTYPE_F32 ? NULL : real_cuda_scratch(cu, qkv_elems * gsize);
    void *scratch[] = {qkv_tmp, real_cuda_scratch(cu, tile_elems * sizeof(float)),
                       real_cuda_scratch(cu, tile_elems * gsize)};
    float *scores = (float *)scratch[1];
    void *tile = scratch[2];
    bool ok = (gt == REAL_DTYPE_F32 || qkv_tmp) && scores && tile;
    const char *qkv_g = ok ? (const char *)real_cuda_as_gemm_dtype(cu, REAL_DTYPE_F32, qkv,
                                                                   qkv_elems, qkv_tmp)
                           : NULL;
    const float scale = 1.0f / sqrtf((float)head_dim);
    const long long ss = (long long)s * s;
    for (int i = 0; ok && i < batch; i++) {
        const char *q = qkv_g + (size_t)i * s * ld * gsize;
        const char *k = q + (size_t)h * gsize, *v = q + 2 * (size_t)h * gsize;
        ok = real_cuda_gemm_strided(cu, false, true, s, s, head_dim, scale, q, ld, head_dim, k, ld,
                                    head_dim, 0.0f, scores, s, ss, heads);
        void *probs_i = probs ? (char *)probs + (size_t)i * tile_elems *
                                                    real_cuda_dtype_bytes(probs_dtype)
                              : NULL;
        if (ok)
            real_cuda_softmax(cu, scores, tile, probs_i, probs_dtype, heads * s, s);
        ok = ok && real_cuda_gemm_strided(cu, false, false, s, head_dim, s, 1.0f, tile, s, ss, v,
                                          ld, head_dim, 0.0f, out + (size_t)i * s * h, h,
                                          head_dim, heads);
    }
    real_cuda_free_all(cu, scratch, G_N_ELEMENTS(scratch));
    return ok && !cu->failed;
}

/* Per sample, all heads at once: dP = dout v^T, dv = P^T dout, dS = softmax backward,
 * dq = scale dS k, dk = scale dS^T q. */
static bool real_cuda_attention_bwd(RealBackend *be, float *dqkv, const float *dout,
                                    const float *qkv, const void *probs, RealDType probs_dtype,
                                    int batch, int seq_len, int heads, int head_dim)
{
    RealCuda *cu = real_cuda_of(be);
    const int h = heads * head_dim, ld = 3 * h, s = seq_len;
    if (batch <= 0 || s <= 0 || heads <= 0 || head_dim <= 0)
        return !cu->failed;
    const RealDType gt = real_cuda_gemm_dtype(cu);
    const bool convert = gt == REAL_DTYPE_BF16; /* fp32 activations to bf16 operands */
    const size_t gsize = real_cuda_dtype_bytes(gt), tile_elems = (size_t)heads * s * s;
    const size_t qkv_elems = (size_t)batch * s * ld, dout_elems = (size_t)batch * s * h;
    const bool probs_convert = probs_dtype != gt;
    void *scratch[] = {convert ? real_cuda_scratch(cu, qkv_elems * gsize) : NULL,
                       convert ? real_cuda_scratch(cu, dout_elems * gsize) : NULL,
                       real_cuda_scratch(cu, tile_elems * sizeof(float)),
                       real_cuda_scratch(cu, tile_elems * gsize),
                       probs_convert ? real_cuda_scratch(cu, tile_elems * gsize) : NULL};
    float *dp = (float *)scratch[2];
    void *ds = scratch[3], *p_tmp = scratch[4];
    bool ok = (!convert || (scratch[0] && scratch[1])) && dp && ds && (!probs_convert || p_tmp);
    const char *qkv_g = NULL, *dout_g = NULL;
    if (ok) {
        qkv_g = (const char *)real_cuda_as_gemm_dtype(cu, REAL_DTYPE_F32, qkv, qkv_elems,
                                                      scratch[0]);
        dout_g = (const char *)real_cuda_as_gemm_dtype(cu, REAL_DTYPE_F32, dout, dout_elems,
                                                       scratch[1]);
    }
    const float scale = 1.0f / sqrtf((float)head_dim);
    const long long ss = (long long)s * s;
    const size_t probs_sample_bytes = tile_elems * real_cuda_dtype_bytes(probs_dtype);
    for (int i = 0; ok && i < batch; i++) {
        const char *q = qkv_g + (size_t)i * s * ld * gsize;
        const char *k = q + (size_t)h * gsize, *v = q + 2 * (size_t)h * gsize;
        const char *dout_i = dout_g + (size_t)i * s * h * gsize;
        const void *probs_i = (const char *)probs + (size_t)i * probs_sample_bytes;
        const void *p = real_cuda_as_gemm_dtype(cu, probs_dtype, probs_i, tile_elems, p_tmp);
        float *dq = dqkv + (size_t)i * s * ld, *dk = dq + h, *dv = dq + 2 * h;
        ok = real_cuda_gemm_strided(cu, false, true, s, s, head_dim, 1.0f, dout_i, h, head_dim, v,
                                    ld, head_dim, 0.0f, dp, s, ss, heads) &&
             real_cuda_gemm_strided(cu, true, false, s, head_dim, s, 1.0f, p, s, ss, dout_i, h,
                                    head_dim, 0.0f, dv, ld, head_dim, heads);
        if (ok)
            real_cuda_softmax_bwd(cu, ds, dp, probs_i, probs_dtype, heads * s, s);
        ok = ok &&
             real_cuda_gemm_strided(cu, false, false, s, head_dim, s, scale, ds, s, ss, k, ld,
                                    head_dim, 0.0f, dq, ld, head_dim, heads) &&
             real_cuda_gemm_strided(cu, true, false, s, head_dim, s, scale, ds, s, ss, q, ld,
                                    head_dim, 0.0f, dk, ld, head_dim, heads);
    }
    real_cuda_free_all(cu, scratch, G_N_ELEMENTS(scratch));
    return ok && !cu->failed;
}

/* ---- grouped-query attention ---- */

/* attention_fwd with kv_heads key/value heads: per sample, and per position g of a query head
 * within its group, all key/value heads at once (strided): query head j = kh group + g reads
 * key/value head kh, so its q columns are group head_dim apart from one problem to the next
 * and its k and v columns head_dim apart. Scores land in head order [heads, s, s], so the
 * softmax (and the stored probs) are those of attention_fwd. */
static bool real_cuda_attention_gqa_fwd(RealBackend *be, float *out, void *probs,
                                        RealDType probs_dtype, const float *qkv, int batch,
                                        int seq_len, int heads, int kv_heads, int head_dim)
{
    RealCuda *cu = real_cuda_of(be);
    const int h = heads * head_dim, kvd = kv_heads * head_dim, ld = h + 2 * kvd, s = seq_len;
    if (batch <= 0 || s <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0)
        return !cu->failed;
    const int group = heads / kv_heads;
    const RealDType gt = real_cuda_gemm_dtype(cu);
    const size_t gsize = real_cuda_dtype_bytes(gt), tile_elems = (size_t)heads * s * s;
    const size_t qkv_elems = (size_t)batch * s * ld;
    void *qkv_tmp = gt == REAL_DTYPE_F32 ? NULL : real_cuda_scratch(cu, qkv_elems * gsize);
    void *scratch[] = {qkv_tmp, real_cuda_scratch(cu, tile_elems * sizeof(float)),
                       real_cuda_scratch(cu, tile_elems * gsize)};
    float *scores = (float *)scratch[1];
    char *tile = (char *)scratch[2];
    bool ok = (gt == REAL_DTYPE_F32 || qkv_tmp) && scores && tile;
    const char *qkv_g = ok ? (const char *)real_cuda_as_gemm_dtype(cu, REAL_DTYPE_F32, qkv,
                                                                   qkv_elems, qkv_tmp)
                           : NULL;
    const float scale = 1.0f / sqrtf((float)head_dim);
    const long long ss = (long long)s * s, gss = (long long)group * ss;
    const long long ghd = (long long)group * head_dim;
    for (int i = 0; ok && i < batch; i++) {
        const char *q = qkv_g + (size_t)i * s * ld * gsize;
        const char *k = q + (size_t)h * gsize, *v = k + (size_t)kvd * gsize;
        for (int g = 0; ok && g < group; g++)
            ok = real_cuda_gemm_strided(cu, false, true, s, s, head_dim, scale,
                                        q + (size_t)g * head_dim * gsize, ld, ghd, k, ld,
                                        head_dim, 0.0f, scores + (size_t)g * ss, s, gss,
                                        kv_heads);
        void *probs_i = probs ? (char *)probs + (size_t)i * tile_elems *
                                                    real_cuda_dtype_bytes(probs_dtype)
                              : NULL;
        if (ok)
            real_cuda_softmax(cu, scores, tile, probs_i, probs_dtype, heads * s, s);
        float *out_i = out + (size_t)i * s * h;
        for (int g = 0; ok && g < group; g++)
            ok = real_cuda_gemm_strided(cu, false, false, s, head_dim, s, 1.0f,
                                        tile + (size_t)g * ss * gsize, s, gss, v, ld, head_dim,
                                        0.0f, out_i + (size_t)g * head_dim, h, ghd, kv_heads);
    }
    real_cuda_free_all(cu, scratch, G_N_ELEMENTS(scratch));
    return ok && !cu->failed;
}

/* attention_bwd with grouped-query heads, strided as the forward: dP = dout v^T, then dv of
 * key/value head kh = sum over its group's query heads of P^T dout (g = 0 overwrites, the
 * others add, in head order as the CPU does), dS, dq = scale dS k, dk = sum scale dS^T q. */
static bool real_cuda_attention_gqa_bwd(RealBackend *be, float *dqkv, const float *dout,
                                        const float *qkv, const void *probs,
                                        RealDType probs_dtype, int batch, int seq_len, int heads,
                                        int kv_heads, int head_dim)
{
    RealCuda *cu = real_cuda_of(be);
    const int h = heads * head_dim, kvd = kv_heads * head_dim, ld = h + 2 * kvd, s = seq_len;
    if (batch <= 0 || s <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0)
        return !cu->failed;
    const int group = heads / kv_heads;
    const RealDType gt = real_cuda_gemm_dtype(cu);
    const bool convert = gt == REAL_DTYPE_BF16; /* fp32 activations to bf16 operands */
    const size_t gsize = real_cuda_dtype_bytes(gt), tile_elems = (size_t)heads * s * s;
    const size_t qkv_elems = (size_t)batch * s * ld, dout_elems = (size_t)batch * s * h;
    const bool probs_convert = probs_dtype != gt;
    void *scratch[] = {convert ? real_cuda_scratch(cu, qkv_elems * gsize) : NULL,
                       convert ? real_cuda_scratch(cu, dout_elems * gsize) : NULL,
                       real_cuda_scratch(cu, tile_elems * sizeof(float)),
                       real_cuda_scratch(cu, tile_elems * gsize),
                       probs_convert ? real_cuda_scratch(cu, tile_elems * gsize) : NULL};
    float *dp = (float *)scratch[2];
    char *ds = (char *)scratch[3];
    bool ok = (!convert || (scratch[0] && scratch[1])) && dp && ds &&
              (!probs_convert || scratch[4]);
    const char *qkv_g = NULL, *dout_g = NULL;
    if (ok) {
        qkv_g = (const char *)real_cuda_as_gemm_dtype(cu, REAL_DTYPE_F32, qkv, qkv_elems,
                                                      scratch[0]);
        dout_g = (const char *)real_cuda_as_gemm_dtype(cu, REAL_DTYPE_F32, dout, dout_elems,
                                                       scratch[1]);
    }
    const float scale = 1.0f / sqrtf((float)head_dim);
    const long long ss = (long long)s * s, gss = (long long)group * ss;
    const long long ghd = (long long)group * head_dim;
    const size_t probs_sample_bytes = tile_elems * real_cuda_dtype_bytes(probs_dtype);
    for (int i = 0; ok && i < batch; i++) {
        const char *q = qkv_g + (size_t)i * s * ld * gsize;
        const char *k = q + (size_t)h * gsize, *v = k + (size_t)kvd * gsize;
        const char *dout_i = dout_g + (size_t)i * s * h * gsize;
        const void *probs_i = (const char *)probs + (size_t)i * probs_sample_bytes;
        const char *p = (const char *)real_cuda_as_gemm_dtype(cu, probs_dtype, probs_i,
                                                              tile_elems, scratch[4]);
        float *dq = dqkv + (size_t)i * s * ld, *dk = dq + h, *dv = dk + kvd;
        for (int g = 0; ok && g < group; g++) {
            const char *dout_g_i = dout_i + (size_t)g * head_dim * gsize;
            const char *p_g = p + (size_t)g * ss * gsize;
            ok = real_cuda_gemm_strided(cu, false, true, s, s, head_dim, 1.0f, dout_g_i, h, ghd,
                                        v, ld, head_dim, 0.0f, dp + (size_t)g * ss, s, gss,
                                        kv_heads) &&
                 real_cuda_gemm_strided(cu, true, false, s, head_dim, s, 1.0f, p_g, s, gss,
                                        dout_g_i, h, ghd, g ? 1.0f : 0.0f, dv, ld, head_dim,
                                        kv_heads);
        }
        if (ok)
            real_cuda_softmax_bwd(cu, ds, dp, probs_i, probs_dtype, heads * s, s);
        for (int g = 0; ok && g < group; g++) {
            const char *ds_g = ds + (size_t)g * ss * gsize;
            ok = real_cuda_gemm_strided(cu, false, false, s, head_dim, s, scale, ds_g, s, gss, k,
                                        ld, head_dim, 0.0f, dq + (size_t)g * head_dim, ld, ghd,
                                        kv_heads) &&
                 real_cuda_gemm_strided(cu, true, false, s, head_dim, s, scale, ds_g, s, gss,
                                        q + (size_t)g * head_dim * gsize, ld, ghd,
                                        g ? 1.0f : 0.0f, dk, ld, head_dim, kv_heads);
        }
    }
    real_cuda_free_all(cu, scratch, G_N_ELEMENTS(scratch));
    return ok && !cu->failed;
}

/* ---- fused attention: no s^2 tensor, the CPU's blockwise algorithm thread by thread ---- */

#define REAL_CUDA_FLASH_BLOCK 32 /* keys per block: real_cpu.c's REAL_CPU_FLASH_BLOCK */

/* Where query head j of sample i at position t reads and writes, in the grouped-query layout
 * of qkv rows [heads d | kv_heads d | kv_heads d]. */
struct RealCudaFlashRow {
    const float *q;  /* q[t] of head j */
    const float *k0; /* k of position 0 of j's key/value head; v = k + kvd */
    size_t ld, kvd;
};

__device__ RealCudaFlashRow real_cuda_flash_row(const float *qkv, int i, int j, int t, int s,
                                                int heads, int kv_heads, int d)
{
    const size_t h = (size_t)heads * d, kvd = (size_t)kv_heads * d, ld = h + 2 * kvd;
    const float *row = qkv + (size_t)i * s * ld;
    RealCudaFlashRow f;
    f.q = row + (size_t)t * ld + (size_t)j * d;
    f.k0 = row + h + (size_t)(j / (heads / kv_heads)) * d;
    f.ld = ld;
    f.kvd = kvd;
    return f;
}

/* A thread per query row (sample i, head j, position t), as the CPU's loop body computes it:
 * keys in blocks of 32 with a running maximum m and sum l, the output accumulated in place
 * in out (the thread's own row), then out /= l and lse = m + log l. */
__global__ void real_cuda_k_flash_fwd(float *out, float *lse, const float *qkv, int batch,
                                      int s, int heads, int kv_heads, int d, float scale,
                                      int window)
{
    const size_t rows = (size_t)batch * heads * s;
    REAL_CUDA_GRID_STRIDE(idx, rows)
    {
        const int t = (int)(idx % (size_t)s), j = (int)(idx / (size_t)s % (size_t)heads);
        const int i = (int)(idx / ((size_t)s * heads));
        const RealCudaFlashRow f = real_cuda_flash_row(qkv, i, j, t, s, heads, kv_heads, d);
        float *o = out + ((size_t)i * s + t) * (size_t)heads * d + (size_t)j * d;
        float sc[REAL_CUDA_FLASH_BLOCK];
        float m = -INFINITY, l = 0.0f;
        for (int c = 0; c < d; c++)
            o[c] = 0.0f;
        for (int u0 = REAL_FIRST_KEY(t, window); u0 <= t; u0 += REAL_CUDA_FLASH_BLOCK) {
            const int n = min(REAL_CUDA_FLASH_BLOCK, t + 1 - u0);
            float bm = -INFINITY;
            for (int u = 0; u < n; u++) {
                const float *k = f.k0 + (size_t)(u0 + u) * f.ld;
                float dot = 0.0f;
                for (int c = 0; c < d; c++)
                    dot += f.q[c] * k[c];
                sc[u] = dot * scale;
                bm = fmaxf(bm, sc[u]);
            }
            const float m_new = fmaxf(m, bm), rescale = expf(m - m_new);
            l *= rescale;
            for (int c = 0; c < d; c++)
                o[c] *= rescale;
            for (int u = 0; u < n; u++) {
                const float pu = expf(sc[u] - m_new);
                const float *v = f.k0 + (size_t)(u0 + u) * f.ld + f.kvd;
                l += pu;
                for (int c = 0; c < d; c++)
                    o[c] += pu * v[c];
            }
            m = m_new;
        }
        for (int c = 0; c < d; c++)
            o[c] = o[c] / l;
        lse[idx] = m + logf(l); /* [batch, heads, s]: idx's own order */
    }
}

static bool real_cuda_flash_attention_fwd(RealBackend *be, float *out, float *lse,
                                          const float *qkv, int batch, int seq_len, int heads,
                                          int kv_heads, int head_dim)
{
    RealCuda *cu = real_cuda_of(be);
    if (batch <= 0 || seq_len <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0)
        return !cu->failed;
    const size_t rows = (size_t)batch * heads * seq_len;
    real_cuda_k_flash_fwd<<<real_cuda_blocks(rows), REAL_CUDA_THREADS, 0, cu->stream>>>(
        out, lse, qkv, batch, seq_len, heads, kv_heads, head_dim,
        1.0f / sqrtf((float)head_dim), be->attention_window);
    return real_cuda_launched(cu, "flash_attention_fwd") && !cu->failed;
}

/* Backward, pass 1, a thread per query row: delta = rowsum(dout o out) into delta[idx], and
 * dq[t] = sum over the keys t attends to of ds k[u] with each probability recomputed from
 * q, k and the log-sum-exp, in the CPU's order. */
__global__ void real_cuda_k_flash_bwd_dq(float *dqkv, float *delta_out, const float *dout,
                                         const float *qkv, const float *out, const float *lse,
                                         int batch, int s, int heads, int kv_heads, int d,
                                         float scale, int window)
{
    const size_t rows = (size_t)batch * heads * s;
    REAL_CUDA_GRID_STRIDE(idx, rows)
    {
        const int t = (int)(idx % (size_t)s), j = (int)(idx / (size_t)s % (size_t)heads);
        const int i = (int)(idx / ((size_t)s * heads));
        const RealCudaFlashRow f = real_cuda_flash_row(qkv, i, j, t, s, heads, kv_heads, d);
        const size_t orow = ((size_t)i * s + t) * (size_t)heads * d + (size_t)j * d;
        const float *dot_ = dout + orow, *o = out + orow;
        float *dq = dqkv + (f.q - qkv);
        float delta = 0.0f;
        for (int c = 0; c < d; c++)
            delta += dot_[c] * o[c];
        delta_out[idx] = delta;
        for (int c = 0; c < d; c++)
            dq[c] = 0.0f;
        const float row_lse = lse[idx];
        for (int u = REAL_FIRST_KEY(t, window); u <= t; u++) {
            const float *k = f.k0 + (size_t)u * f.ld, *v = k + f.kvd;
            float dot = 0.0f, dp = 0.0f;
            for (int c = 0; c < d; c++) {
                dot += f.q[c] * k[c];
                dp += dot_[c] * v[c];
            }
            const float p = expf(dot * scale - row_lse);
            const float ds = p * (dp - delta) * scale;
            for (int c = 0; c < d; c++)
                dq[c] += ds * k[c];
        }
    }
}

/* Pass 2, a thread per key row (sample i, key/value head kh, position u): dk[u] and dv[u]
 * sum over the group's query heads j (in order), then the positions t >= u that attend to u
 * (in order), the CPU's order of accumulation into them; no two threads write the same
 * element. */
__global__ void real_cuda_k_flash_bwd_dkv(float *dqkv, const float *delta, const float *dout,
                                          const float *qkv, const float *lse, int batch, int s,
                                          int heads, int kv_heads, int d, float scale,
                                          int window)
{
    const size_t rows = (size_t)batch * kv_heads * s;
    const int group = heads / kv_heads;
    REAL_CUDA_GRID_STRIDE(idx, rows)
    {
        const int u = (int)(idx % (size_t)s), kh = (int)(idx / (size_t)s % (size_t)kv_heads);
        const int i = (int)(idx / ((size_t)s * kv_heads));
        const RealCudaFlashRow f0 =
            real_cuda_flash_row(qkv, i, kh * group, u, s, heads, kv_heads, d);
        const float *k = f0.k0 + (size_t)u * f0.ld, *v = k + f0.kvd;
        float *dk = dqkv + (k - qkv), *dv = dqkv + (v - qkv);
        for (int c = 0; c < d; c++)
            dk[c] = 0.0f, dv[c] = 0.0f;
        for (int j = kh * group; j < (kh + 1) * group; j++)
            for (int t = u; t < s && REAL_FIRST_KEY(t, window) <= u; t++) {
                const RealCudaFlashRow f = real_cuda_flash_row(qkv, i, j, t, s, heads, kv_heads,
                                                               d);
                const size_t row = ((size_t)i * heads + j) * s + t;
                const float *dot_ = dout + ((size_t)i * s + t) * (size_t)heads * d +
                                    (size_t)j * d;
                float dot = 0.0f, dp = 0.0f;
                for (int c = 0; c < d; c++) {
                    dot += f.q[c] * k[c];
                    dp += dot_[c] * v[c];
                }
                const float p = expf(dot * scale - lse[row]);
                const float ds = p * (dp - delta[row]) * scale;
                for (int c = 0; c < d; c++) {
                    dv[c] += p * dot_[c];
                    dk[c] += ds * f.q[c];
                }
            }
    }
}

static bool real_cuda_flash_attention_bwd(RealBackend *be, float *dqkv, const float *dout,
                                          const float *qkv, const float *out, const float *lse,
                                          int batch, int seq_len, int heads, int kv_heads,
                                          int head_dim)
{
    RealCuda *cu = real_cuda_of(be);
    if (batch <= 0 || seq_len <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0)
        return !cu->failed;
    const size_t q_rows = (size_t)batch * heads * seq_len;
    const size_t kv_rows = (size_t)batch * kv_heads * seq_len;
    const float scale = 1.0f / sqrtf((float)head_dim);
    float *delta = (float *)real_cuda_scratch(cu, q_rows * sizeof(float));
    if (!delta)
        return false;
    real_cuda_k_flash_bwd_dq<<<real_cuda_blocks(q_rows), REAL_CUDA_THREADS, 0, cu->stream>>>(
        dqkv, delta, dout, qkv, out, lse, batch, seq_len, heads, kv_heads, head_dim, scale,
        be->attention_window);
    const bool ok = real_cuda_launched(cu, "flash_attention_bwd (dq)");
    if (ok) {
        real_cuda_k_flash_bwd_dkv<<<real_cuda_blocks(kv_rows), REAL_CUDA_THREADS, 0,
                                    cu->stream>>>(dqkv, delta, dout, qkv, lse, batch, seq_len,
                                                  heads, kv_heads, head_dim, scale,
                                                  be->attention_window);
        real_cuda_launched(cu, "flash_attention_bwd (dk, dv)");
    }
    real_cuda_free(be, delta);
    return !cu->failed;
}

/* Its entries of the backend's table. */
void real_cuda_install_attention(RealBackend *be)
{
    be->attention_fwd = real_cuda_attention_fwd;
    be->attention_bwd = real_cuda_attention_bwd;
    be->attention_gqa_fwd = real_cuda_attention_gqa_fwd;
    be->attention_gqa_bwd = real_cuda_attention_gqa_bwd;
    be->flash_attention_fwd = real_cuda_flash_attention_fwd;
    be->flash_attention_bwd = real_cuda_flash_attention_bwd;
}
