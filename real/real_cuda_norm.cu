/* real_cuda_norm: the CUDA backend's normalisations: layer norm and RMSNorm, forward and
 * backward, a block per row, sums in a fixed tree so that every run gives the same bits. */
#include "real_cuda_internal.cuh"

/* ---- layer norm ---- */

/* One block per row; the statistics in double, two passes, as the CPU computes them. */
__global__ void real_cuda_k_layernorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                          const RealBf16 *gain, const RealBf16 *bias, int cols,
                                          double eps)
{
    __shared__ double shared[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    double sum = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        sum += xr[c];
    const double mu = real_cuda_block_sum(sum, shared) / cols;
    double sq = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        sq += (xr[c] - mu) * (xr[c] - mu);
    sq = real_cuda_block_sum(sq, shared);
    const float m = (float)mu;
    const float rs = (float)(1.0 / sqrt(sq / cols + eps));
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (xr[c] - m) * rs * real_cuda_widen(gain[c]) + real_cuda_widen(bias[c]);
    if (threadIdx.x == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

static void real_cuda_layernorm_fwd(RealBackend *be, float *y, float *mean, float *rstd,
                                    const float *x, const RealBf16 *gain, const RealBf16 *bias,
                                    int rows, int cols)
{
    RealCuda *cu = real_cuda_of(be);
    if (rows <= 0 || cols <= 0)
        return;
    real_cuda_k_layernorm_fwd<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        y, mean, rstd, x, gain, bias, cols, REAL_LAYERNORM_EPS(be));
    real_cuda_launched(cu, "layernorm_fwd");
}

/* dx += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gain; a block per row. */
__global__ void real_cuda_k_layernorm_bwd_dx(float *dx, const float *dy, const float *x,
                                             const float *mean, const float *rstd,
                                             const RealBf16 *gain, int cols)
{
    __shared__ float shared[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * cols, *dyr = dy + r * cols;
    float *dxr = dx + r * cols;
    const float m = mean[r], rs = rstd[r];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float xhat = (xr[c] - m) * rs;
        const float dxhat = dyr[c] * real_cuda_widen(gain[c]);
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
    }
    const float mean_dxhat = real_cuda_block_sum(sum_dxhat, shared) / cols;
    const float mean_dxhat_xhat = real_cuda_block_sum(sum_dxhat_xhat, shared) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float xhat = (xr[c] - m) * rs;
        const float dxhat = dyr[c] * real_cuda_widen(gain[c]);
        dxr[c] += rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
}

static void real_cuda_layernorm_bwd(RealBackend *be, float *dx, float *dgain, float *dbias,
                                    const float *dy, const float *x, const float *mean,
                                    const float *rstd, const RealBf16 *gain, int rows, int cols)
{
    RealCuda *cu = real_cuda_of(be);
    if (rows <= 0 || cols <= 0)
        return;
    real_cuda_k_layernorm_bwd_dx<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        dx, dy, x, mean, rstd, gain, cols);
    real_cuda_launched(cu, "layernorm_bwd");
    real_cuda_column_sums(cu, dbias, dgain, dy, x, mean, rstd, rows, cols);
}

/* 1/sqrt(mean(x^2) + eps) of one row, a block per row, the sum of squares in double as the
 * CPU computes it (in another order: the double sum may round to another float only at a
 * rounding boundary). */
__device__ float real_cuda_rms_rstd(const float *xr, int cols, float eps, double *shared)
{
    double sq = 0.0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        sq += (double)xr[c] * xr[c];
    sq = real_cuda_block_sum(sq, shared);
    return (float)(1.0 / sqrt(sq / cols + eps));
}

/* y = x rstd gain, a block per row; rstd_out[r] = rstd when not NULL. */
__global__ void real_cuda_k_rmsnorm_fwd(float *y, float *rstd_out, const float *x,
                                        const RealBf16 *gain, int cols, float eps)
{
    __shared__ double shared[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * cols;
    float *yr = y ? y + r * cols : NULL;
    const float rs = real_cuda_rms_rstd(xr, cols, eps, shared);
    for (int c = threadIdx.x; yr && c < cols; c += blockDim.x)
        yr[c] = xr[c] * rs * real_cuda_widen(gain[c]);
    if (rstd_out && threadIdx.x == 0)
        rstd_out[r] = rs;
}

static void real_cuda_rmsnorm_fwd(RealBackend *be, float *y, const float *x, const RealBf16 *gain,
                                  int rows, int cols, float eps)
{
    RealCuda *cu = real_cuda_of(be);
    if (rows <= 0 || cols <= 0)
        return;
    real_cuda_k_rmsnorm_fwd<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        y, NULL, x, gain, cols, eps);
    real_cuda_launched(cu, "rmsnorm_fwd");
}

/* dx += rstd (dy gain - xhat mean(dy gain xhat)), a block per row, rstd from rstd[r]. */
__global__ void real_cuda_k_rmsnorm_bwd_dx(float *dx, const float *dy, const float *x,
                                           const float *rstd, const RealBf16 *gain, int cols)
{
    __shared__ float shared[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * cols, *dyr = dy + r * cols;
    float *dxr = dx + r * cols;
    const float rs = rstd[r];
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float xhat = xr[c] * rs;
        sum += dyr[c] * real_cuda_widen(gain[c]) * xhat;
    }
    const float mean = real_cuda_block_sum(sum, shared) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        dxr[c] += rs * (dyr[c] * real_cuda_widen(gain[c]) - xr[c] * rs * mean);
}

/* dgain[c] += sum_r dy[r,c] x[r,c] rstd[r], a thread per column summing the rows in order as
 * the CPU does (correctness first: one pass, no partial sums). */
__global__ void real_cuda_k_rmsnorm_bwd_dgain(float *dgain, const float *dy, const float *x,
                                              const float *rstd, int rows, int cols)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float sum = dgain[c];
    for (int r = 0; r < rows; r++) {
        const size_t at = (size_t)r * cols + c;
        sum += dy[at] * (x[at] * rstd[r]);
    }
    dgain[c] = sum;
}

static void real_cuda_rmsnorm_bwd(RealBackend *be, float *dx, float *dgain, const float *dy,
                                  const float *x, const RealBf16 *gain, int rows, int cols,
                                  float eps)
{
    RealCuda *cu = real_cuda_of(be);
    if (rows <= 0 || cols <= 0)
        return;
    float *rstd = (float *)real_cuda_scratch(cu, (size_t)rows * sizeof(float));
    if (!rstd) {
        real_cuda_fail(cu, "no scratch memory for the RMSNorm statistics of %d rows", rows);
        return;
    }
    real_cuda_k_rmsnorm_fwd<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        NULL, rstd, x, gain, cols, eps);
    real_cuda_launched(cu, "rmsnorm_bwd (statistics)");
    real_cuda_k_rmsnorm_bwd_dx<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        dx, dy, x, rstd, gain, cols);
    real_cuda_launched(cu, "rmsnorm_bwd (dx)");
    real_cuda_k_rmsnorm_bwd_dgain<<<(unsigned)((cols + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS),
                                    REAL_CUDA_THREADS, 0, cu->stream>>>(dgain, dy, x, rstd, rows,
                                                                         cols);
    real_cuda_launched(cu, "rmsnorm_bwd (dgain)");
    real_cuda_free(be, rstd);
}

/* Its entries of the backend's table. */
void real_cuda_install_norm(RealBackend *be)
{
    be->layernorm_fwd = real_cuda_layernorm_fwd;
    be->layernorm_bwd = real_cuda_layernorm_bwd;
    be->rmsnorm_fwd = real_cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = real_cuda_rmsnorm_bwd;
}
