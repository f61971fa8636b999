/* real_cuda_elementwise: the CUDA backend's elementwise kernels — bf16 conversions and
 * rounding, bias, add, GELU (tanh and exact), gated MLPs, Adam — 4 elements a thread where aligned. */
#include "real_cuda_internal.cuh"

/* ---- precision ---- */

/* Elementwise kernels move 4 elements per thread where every pointer allows it: fp32 as one
 * 16-byte float4, bf16 as one 8-byte uint2. One scalar element per thread left these kernels
 * at a fraction of HBM bandwidth (measured on an H100 with Nsight Compute: 281 f32_to_bf16
 * launches took 12.8 ms of a 73 ms GPT-2 124M step). Each element is computed exactly as
 * before, so the results are the same bits. An op is a functor with one(i) for element i
 * and four(i) for elements i..i+3 (i a multiple of 4). */
__device__ __forceinline__ float4 real_cuda_load4_bf16(const RealBf16 *p)
{
    const uint2 raw = *reinterpret_cast<const uint2 *>(p);
    return make_float4(real_cuda_widen((RealBf16)(raw.x & 0xffffu)),
                       real_cuda_widen((RealBf16)(raw.x >> 16)),
                       real_cuda_widen((RealBf16)(raw.y & 0xffffu)),
                       real_cuda_widen((RealBf16)(raw.y >> 16)));
}

__device__ __forceinline__ void real_cuda_store4_bf16(RealBf16 *p, float4 v)
{
    uint2 raw;
    raw.x = (uint32_t)real_cuda_narrow(v.x) | ((uint32_t)real_cuda_narrow(v.y) << 16);
    raw.y = (uint32_t)real_cuda_narrow(v.z) | ((uint32_t)real_cuda_narrow(v.w) << 16);
    *reinterpret_cast<uint2 *>(p) = raw;
}

__device__ __forceinline__ float4 real_cuda_load4(const float *p)
{
    return *reinterpret_cast<const float4 *>(p);
}

__device__ __forceinline__ void real_cuda_store4(float *p, float4 v)
{
    *reinterpret_cast<float4 *>(p) = v;
}

template <typename Op>
__global__ void real_cuda_k_elementwise(Op op, size_t n, bool vector)
{
    const size_t n4 = vector ? n / 4 : 0;
    REAL_CUDA_GRID_STRIDE(j, n4)
    op.four(4 * j);
    REAL_CUDA_GRID_STRIDE(i, n - 4 * n4)
    op.one(4 * n4 + i);
}

/* Runs op over n elements; `vector` when every pointer it touches is aligned to its
 * element's 4-vector (16 bytes for fp32, 8 for bf16). */
template <typename Op>
static void real_cuda_elementwise(RealCuda *cu, const Op &op, size_t n, bool vector,
                                  const char *name)
{
    if (n == 0)
        return;
    const size_t blocks = real_cuda_blocks(vector ? MAX(n / 4, (size_t)1) : n);
    real_cuda_k_elementwise<<<(unsigned)blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(op, n, vector);
    real_cuda_launched(cu, name);
}

struct RealCudaToF32 {
    float *dst;
    const RealBf16 *src;
    __device__ void one(size_t i) const { dst[i] = real_cuda_widen(src[i]); }
    __device__ void four(size_t i) const { real_cuda_store4(dst + i, real_cuda_load4_bf16(src + i)); }
};

struct RealCudaToBf16 {
    RealBf16 *dst;
    const float *src;
    __device__ void one(size_t i) const { dst[i] = real_cuda_narrow(src[i]); }
    __device__ void four(size_t i) const { real_cuda_store4_bf16(dst + i, real_cuda_load4(src + i)); }
};

__device__ __forceinline__ float real_cuda_rounded(float x)
{
    return real_cuda_widen(real_cuda_narrow(x));
}

struct RealCudaRound {
    float *x;
    __device__ void one(size_t i) const { x[i] = real_cuda_rounded(x[i]); }
    __device__ void four(size_t i) const
    {
        const float4 v = real_cuda_load4(x + i);
        real_cuda_store4(x + i, make_float4(real_cuda_rounded(v.x), real_cuda_rounded(v.y),
                                            real_cuda_rounded(v.z), real_cuda_rounded(v.w)));
    }
};

struct RealCudaAccumulate {
    RealBf16 *dst;
    const float *src;
    __device__ void one(size_t i) const { dst[i] = real_cuda_narrow(real_cuda_widen(dst[i]) + src[i]); }
    __device__ void four(size_t i) const
    {
        const float4 d = real_cuda_load4_bf16(dst + i), s = real_cuda_load4(src + i);
        real_cuda_store4_bf16(dst + i, make_float4(d.x + s.x, d.y + s.y, d.z + s.z, d.w + s.w));
    }
};

struct RealCudaAddBf16 {
    RealBf16 *dst;
    const RealBf16 *src;
    __device__ void one(size_t i) const
    {
        dst[i] = real_cuda_narrow(real_cuda_widen(dst[i]) + real_cuda_widen(src[i]));
    }
    __device__ void four(size_t i) const
    {
        const float4 d = real_cuda_load4_bf16(dst + i), s = real_cuda_load4_bf16(src + i);
        real_cuda_store4_bf16(dst + i, make_float4(d.x + s.x, d.y + s.y, d.z + s.z, d.w + s.w));
    }
};

struct RealCudaScale {
    RealBf16 *x;
    float factor;
    __device__ void one(size_t i) const { x[i] = real_cuda_narrow(real_cuda_widen(x[i]) * factor); }
    __device__ void four(size_t i) const
    {
        const float4 v = real_cuda_load4_bf16(x + i);
        real_cuda_store4_bf16(x + i, make_float4(v.x * factor, v.y * factor, v.z * factor,
                                                 v.w * factor));
    }
};

void real_cuda_bf16_to_f32(RealBackend *be, float *dst, const RealBf16 *src, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaToF32{dst, src}, n,
                          real_cuda_aligned(dst, 16) && real_cuda_aligned(src, 8), "bf16_to_f32");
}

void real_cuda_f32_to_bf16(RealBackend *be, RealBf16 *dst, const float *src, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaToBf16{dst, src}, n,
                          real_cuda_aligned(dst, 8) && real_cuda_aligned(src, 16), "f32_to_bf16");
}

static void real_cuda_round_bf16(RealBackend *be, float *x, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaRound{x}, n, real_cuda_aligned(x, 16),
                          "round_bf16");
}

static void real_cuda_accumulate_bf16(RealBackend *be, RealBf16 *dst, const float *src, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaAccumulate{dst, src}, n,
                          real_cuda_aligned(dst, 8) && real_cuda_aligned(src, 16),
                          "accumulate_bf16");
}

static void real_cuda_add_bf16(RealBackend *be, RealBf16 *dst, const RealBf16 *src, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaAddBf16{dst, src}, n,
                          real_cuda_aligned(dst, 8) && real_cuda_aligned(src, 8), "add_bf16");
}

static void real_cuda_scale_bf16(RealBackend *be, RealBf16 *x, size_t n, float factor)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaScale{x, factor}, n, real_cuda_aligned(x, 8),
                          "scale_bf16");
}

/* ---- bias, add ---- */

/* y[r, c] += bias[c]; four() needs cols a multiple of 4, so that 4 elements share a row. */
struct RealCudaBiasFwd {
    float *y;
    const RealBf16 *bias;
    int cols;
    __device__ void one(size_t i) const { y[i] += real_cuda_widen(bias[i % (size_t)cols]); }
    __device__ void four(size_t i) const
    {
        const float4 v = real_cuda_load4(y + i), b = real_cuda_load4_bf16(bias + i % (size_t)cols);
        real_cuda_store4(y + i, make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w));
    }
};

static void real_cuda_bias_fwd(RealBackend *be, float *y, const RealBf16 *bias, int rows, int cols)
{
    if (rows <= 0 || cols <= 0)
        return;
    real_cuda_elementwise(real_cuda_of(be), RealCudaBiasFwd{y, bias, cols}, (size_t)rows * cols,
                          cols % 4 == 0 && real_cuda_aligned(y, 16) && real_cuda_aligned(bias, 8),
                          "bias_fwd");
}

/* Deterministic column sums, pass 1: thread (column c, chunk j) sums rows [j R, (j+1) R) of
 * column c in row order into partial[j, c]: sum dy, and with xhat also sum dy * xhat where
 * xhat = (x - mean[r]) rstd[r] (the layer norm's dgain). No atomics, so the order of every
 * sum is fixed. */
template <bool WITH_XHAT>
__global__ void real_cuda_k_column_partials(float *partial_dy, float *partial_dy_xhat,
                                            const float *dy, const float *x, const float *mean,
                                            const float *rstd, int rows, int cols, int chunk_rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    const int r0 = blockIdx.y * chunk_rows;
    const int r1 = min(rows, r0 + chunk_rows);
    float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
    for (int r = r0; r < r1; r++) {
        const size_t at = (size_t)r * cols + c;
        const float g = dy[at];
        sum_dy += g;
        if (WITH_XHAT)
            sum_dy_xhat += g * ((x[at] - mean[r]) * rstd[r]);
    }
    const size_t out = (size_t)blockIdx.y * cols + c;
    partial_dy[out] = sum_dy;
    if (WITH_XHAT)
        partial_dy_xhat[out] = sum_dy_xhat;
}

/* Pass 2: out[c] += the chunks' partial sums of column c, in chunk order. */
__global__ void real_cuda_k_column_finish(float *out, const float *partial, int chunks, int cols)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float sum = 0.0f;
    for (int j = 0; j < chunks; j++)
        sum += partial[(size_t)j * cols + c];
    out[c] += sum;
}

/* dsum[c] += sum_r dy[r,c] and, when dsum_xhat is not NULL, dsum_xhat[c] += sum_r dy xhat. */
void real_cuda_column_sums(RealCuda *cu, float *dsum, float *dsum_xhat, const float *dy,
                           const float *x, const float *mean, const float *rstd, int rows,
                           int cols)
{
    if (rows <= 0 || cols <= 0)
        return;
    /* Chunks of 64 rows, more when there would be more chunks than a grid's y extent. */
    const int chunk_rows = MAX(REAL_CUDA_COLUMN_CHUNK_ROWS, (rows + 65534) / 65535);
    const int chunks = (rows + chunk_rows - 1) / chunk_rows;
    const int outputs = dsum_xhat ? 2 : 1;
    float *partial =
        (float *)real_cuda_scratch(cu, (size_t)outputs * chunks * cols * sizeof(float));
    if (!partial) {
        real_cuda_fail(cu, "no scratch memory for a column sum of %d x %d", rows, cols);
        return;
    }
    float *partial_xhat = dsum_xhat ? partial + (size_t)chunks * cols : NULL;
    const unsigned finish_blocks = (unsigned)((cols + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS);
    const dim3 grid(finish_blocks, (unsigned)chunks);
    if (dsum_xhat)
        real_cuda_k_column_partials<true><<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
            partial, partial_xhat, dy, x, mean, rstd, rows, cols, chunk_rows);
    else
        real_cuda_k_column_partials<false><<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
            partial, NULL, dy, NULL, NULL, NULL, rows, cols, chunk_rows);
    real_cuda_launched(cu, "column partial sums");
    real_cuda_k_column_finish<<<finish_blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(dsum, partial,
                                                                                  chunks, cols);
    real_cuda_launched(cu, "column sums");
    if (dsum_xhat) {
        real_cuda_k_column_finish<<<finish_blocks, REAL_CUDA_THREADS, 0, cu->stream>>>(
            dsum_xhat, partial_xhat, chunks, cols);
        real_cuda_launched(cu, "column sums");
    }
    real_cuda_free(&cu->base, partial);
}

static void real_cuda_bias_bwd(RealBackend *be, float *dbias, const float *dy, int rows, int cols)
{
    real_cuda_column_sums(real_cuda_of(be), dbias, NULL, dy, NULL, NULL, NULL, rows, cols);
}

struct RealCudaAdd {
    float *out;
    const float *a, *b;
    __device__ void one(size_t i) const { out[i] = a[i] + b[i]; }
    __device__ void four(size_t i) const
    {
        const float4 x = real_cuda_load4(a + i), y = real_cuda_load4(b + i);
        real_cuda_store4(out + i, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
    }
};

static void real_cuda_add(RealBackend *be, float *out, const float *a, const float *b, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaAdd{out, a, b}, n,
                          real_cuda_aligned(out, 16) && real_cuda_aligned(a, 16) &&
                              real_cuda_aligned(b, 16),
                          "add");
}

/* ---- GELU ---- */

__global__ void real_cuda_k_gelu_fwd(float *y, const float *x, size_t n)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const float xi = x[i];
        const float inner = REAL_CUDA_GELU_C * (xi + REAL_CUDA_GELU_K * xi * xi * xi);
        y[i] = 0.5f * xi * (1.0f + tanhf(inner));
    }
}

__global__ void real_cuda_k_gelu_bwd(float *dx, const float *dy, const float *x, size_t n)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const float xi = x[i];
        const float inner = REAL_CUDA_GELU_C * (xi + REAL_CUDA_GELU_K * xi * xi * xi);
        const float th = tanhf(inner);
        const float dinner = REAL_CUDA_GELU_C * (1.0f + 3.0f * REAL_CUDA_GELU_K * xi * xi);
        const float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * dinner;
        dx[i] = dy[i] * grad;
    }
}

static void real_cuda_gelu_fwd(RealBackend *be, float *y, const float *x, size_t n)
{
    RealCuda *cu = real_cuda_of(be);
    if (n == 0)
        return;
    real_cuda_k_gelu_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(y, x, n);
    real_cuda_launched(cu, "gelu_fwd");
}

static void real_cuda_gelu_bwd(RealBackend *be, float *dx, const float *dy, const float *x,
                               size_t n)
{
    RealCuda *cu = real_cuda_of(be);
    if (n == 0)
        return;
    real_cuda_k_gelu_bwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(dx, dy, x, n);
    real_cuda_launched(cu, "gelu_bwd");
}

/* The activations as real_cpu.c computes them, operation for operation. */
#define REAL_CUDA_SQRT1_2 0.7071067811865476f      /* 1/sqrt(2) */
#define REAL_CUDA_INV_SQRT_2PI 0.3989422804014327f /* 1/sqrt(2 pi) */

__device__ float real_cuda_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

__device__ float real_cuda_act(float x, RealActivation act)
{
    switch (act) {
    case REAL_ACT_SILU:
        return x * real_cuda_sigmoid(x);
    case REAL_ACT_GELU_TANH: {
        const float inner = REAL_CUDA_GELU_C * (x + REAL_CUDA_GELU_K * x * x * x);
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    case REAL_ACT_GELU_ERF:
        return 0.5f * x * (1.0f + erff(x * REAL_CUDA_SQRT1_2));
    }
    return NAN;
}

__device__ float real_cuda_act_grad(float x, RealActivation act)
{
    switch (act) {
    case REAL_ACT_SILU: {
        const float sg = real_cuda_sigmoid(x);
        return sg * (1.0f + x * (1.0f - sg));
    }
    case REAL_ACT_GELU_TANH: {
        const float inner = REAL_CUDA_GELU_C * (x + REAL_CUDA_GELU_K * x * x * x);
        const float th = tanhf(inner);
        const float dinner = REAL_CUDA_GELU_C * (1.0f + 3.0f * REAL_CUDA_GELU_K * x * x);
        return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dinner;
    }
    case REAL_ACT_GELU_ERF:
        return 0.5f * (1.0f + erff(x * REAL_CUDA_SQRT1_2)) +
               x * REAL_CUDA_INV_SQRT_2PI * expf(-0.5f * x * x);
    }
    return NAN;
}

/* A thread per (row, c < ffn): out = act(gate) up. */
__global__ void real_cuda_k_glu_fwd(float *out, const float *gate_up, size_t n, int ffn,
                                    RealActivation act)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const size_t r = i / (size_t)ffn, c = i % (size_t)ffn;
        const float gt = gate_up[r * 2 * ffn + c], up = gate_up[r * 2 * ffn + ffn + c];
        out[i] = real_cuda_act(gt, act) * up;
    }
}

/* Each thread reads its gate and up before writing either, so dgate_up may alias gate_up. */
__global__ void real_cuda_k_glu_bwd(float *dgate_up, const float *dout, const float *gate_up,
                                    size_t n, int ffn, RealActivation act)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const size_t r = i / (size_t)ffn, c = i % (size_t)ffn;
        const size_t gi = r * 2 * ffn + c, ui = gi + (size_t)ffn;
        const float gt = gate_up[gi], up = gate_up[ui], dy = dout[i];
        dgate_up[gi] = dy * up * real_cuda_act_grad(gt, act);
        dgate_up[ui] = dy * real_cuda_act(gt, act);
    }
}

static void real_cuda_glu_fwd(RealBackend *be, float *out, const float *gate_up, int rows,
                              int ffn, RealActivation act)
{
    RealCuda *cu = real_cuda_of(be);
    const size_t n = (size_t)MAX(rows, 0) * (size_t)MAX(ffn, 0);
    if (n == 0)
        return;
    real_cuda_k_glu_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(out, gate_up,
                                                                                  n, ffn, act);
    real_cuda_launched(cu, "glu_fwd");
}

static void real_cuda_glu_bwd(RealBackend *be, float *dgate_up, const float *dout,
                              const float *gate_up, int rows, int ffn, RealActivation act)
{
    RealCuda *cu = real_cuda_of(be);
    const size_t n = (size_t)MAX(rows, 0) * (size_t)MAX(ffn, 0);
    if (n == 0)
        return;
    real_cuda_k_glu_bwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        dgate_up, dout, gate_up, n, ffn, act);
    real_cuda_launched(cu, "glu_bwd");
}

__global__ void real_cuda_k_gelu_erf_fwd(float *y, const float *x, size_t n)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    y[i] = real_cuda_act(x[i], REAL_ACT_GELU_ERF);
}

__global__ void real_cuda_k_gelu_erf_bwd(float *dx, const float *dy, const float *x, size_t n)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    dx[i] = dy[i] * real_cuda_act_grad(x[i], REAL_ACT_GELU_ERF);
}

static void real_cuda_gelu_erf_fwd(RealBackend *be, float *y, const float *x, size_t n)
{
    RealCuda *cu = real_cuda_of(be);
    if (n == 0)
        return;
    real_cuda_k_gelu_erf_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(y, x, n);
    real_cuda_launched(cu, "gelu_erf_fwd");
}

static void real_cuda_gelu_erf_bwd(RealBackend *be, float *dx, const float *dy, const float *x,
                                   size_t n)
{
    RealCuda *cu = real_cuda_of(be);
    if (n == 0)
        return;
    real_cuda_k_gelu_erf_bwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(dx, dy,
                                                                                       x, n);
    real_cuda_launched(cu, "gelu_erf_bwd");
}

/* ---- optimizer ---- */

__global__ void real_cuda_k_adam(size_t n, float lr, float beta1, float beta2, float eps,
                                 float weight_decay, float grad_scale, float correct1,
                                 float correct2, float *master, float *m, float *v,
                                 const RealBf16 *grad, RealBf16 *param)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const float g = real_cuda_widen(grad[i]) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float update = (mi / correct1) / (sqrtf(vi / correct2) + eps);
        const float w = master[i] - lr * (update + weight_decay * master[i]);
        master[i] = w;
        param[i] = real_cuda_narrow(w);
    }
}

static void real_cuda_adam_step(RealBackend *be, const RealAdamHyper *hyper, size_t n,
                                float *master, float *m, float *v, const RealBf16 *grad,
                                RealBf16 *param)
{
    RealCuda *cu = real_cuda_of(be);
    if (n == 0)
        return;
    /* The bias corrections exactly as the CPU computes them, in double then rounded. */
    const float correct1 = (float)(1.0 - pow(hyper->beta1, (double)hyper->step));
    const float correct2 = (float)(1.0 - pow(hyper->beta2, (double)hyper->step));
    real_cuda_k_adam<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        n, hyper->lr, hyper->beta1, hyper->beta2, hyper->eps, hyper->weight_decay,
        hyper->grad_scale, correct1, correct2, master, m, v, grad, param);
    real_cuda_launched(cu, "adam_step");
}

/* Its entries of the backend's table. */
void real_cuda_install_elementwise(RealBackend *be)
{
    be->bf16_to_f32 = real_cuda_bf16_to_f32;
    be->f32_to_bf16 = real_cuda_f32_to_bf16;
    be->round_bf16 = real_cuda_round_bf16;
    be->accumulate_bf16 = real_cuda_accumulate_bf16;
    be->add_bf16 = real_cuda_add_bf16;
    be->scale_bf16 = real_cuda_scale_bf16;
    be->bias_fwd = real_cuda_bias_fwd;
    be->bias_bwd = real_cuda_bias_bwd;
    be->add = real_cuda_add;
    be->gelu_fwd = real_cuda_gelu_fwd;
    be->gelu_bwd = real_cuda_gelu_bwd;
    be->glu_fwd = real_cuda_glu_fwd;
    be->glu_bwd = real_cuda_glu_bwd;
    be->gelu_erf_fwd = real_cuda_gelu_erf_fwd;
    be->gelu_erf_bwd = real_cuda_gelu_erf_bwd;
    be->adam_step = real_cuda_adam_step;
}
