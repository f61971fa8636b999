/* real_cuda_internal: what the CUDA backend's files share: the backend's state (RealCuda), its
 * launch and error helpers, the device helpers every kernel family uses, and each family's
 * entries. Private to the backend's .cu files. */
#ifndef REAL_CUDA_INTERNAL_CUH
#define REAL_CUDA_INTERNAL_CUH

/* The interface headers are C: their functions (the tracker's) have C linkage. */
extern "C" {
#include "real_backend.h"
}
#include "real_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstring>

/* Numerics. Kernels are compiled with --fmad=false (see the Makefile) so that a * b + c is
 * rounded twice, as the CPU backend's C computes it: elementwise results (bf16 conversions,
 * bias, add, embedding, Adam, layer-norm forward) then match the CPU bit for bit, and the
 * rest differ only where the order of a sum or the accuracy of expf/tanhf differs. */
#define REAL_CUDA_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define REAL_CUDA_GELU_K 0.044715f

#define REAL_CUDA_THREADS 256             /* every kernel's block size: 8 warps */
#define REAL_CUDA_WARPS (REAL_CUDA_THREADS / 32)
#define REAL_CUDA_MAX_BLOCKS 65536u       /* grid-stride loops cover the rest */
#define REAL_CUDA_COLUMN_CHUNK_ROWS 64    /* rows one thread sums in a column reduction */
/* cuBLAS's recommended workspace on Hopper (cuBLAS docs, cublasSetWorkspace), enough for
 * every architecture; given explicitly so that it is counted in the tracker. */
#define REAL_CUDA_BLAS_WORKSPACE_BYTES (32u << 20)
#define REAL_CUDA_ALIGN_BYTES 64

/* Persistent device staging for host arrays the interface passes (tokens, targets, the
 * embedding backward's token index), grown on demand and counted as workspace. */
enum {
    REAL_CUDA_STAGE_TOKENS,
    REAL_CUDA_STAGE_INDEX,
    REAL_CUDA_N_STAGES
};

typedef struct {
    RealBackend base; /* first, so the interface pointer converts back */
    RealCudaGemmMode mode;
    int device;
    cudaStream_t stream;
    /* ZeRO-Offload's copies between the host tier and the device: their own stream, ordered
     * after the compute stream by `queued` and waited for through `copied`. */
    cudaStream_t copy_stream;
    cudaEvent_t queued, copied;
    cublasHandle_t blas;
    cudaMemPool_t pool;
    void *blas_workspace;
    int *stage[REAL_CUDA_N_STAGES];
    size_t stage_elems[REAL_CUDA_N_STAGES];
    double *loss_sum; /* one device double: the cross-entropy's sum of row losses */
    GPtrArray *events;      /* every event made for mark(), destroyed with the backend */
    GPtrArray *free_events; /* those not handed out */
    uint64_t context_bytes, nccl_bytes;
    bool failed;
    char error_text[512];
} RealCuda;

static inline RealCuda *real_cuda_of(RealBackend *be)
{
    return (RealCuda *)be;
}

/* real_cuda.cu: the first failure is kept (real_cuda_fail), and reported by synchronize;
 * real_cuda_check and real_cuda_check_blas keep a failed call's, real_cuda_launched a failed
 * launch's (after every kernel launch: a bad configuration is reported at once, a fault later). */
void real_cuda_fail(RealCuda *cu, const char *format, ...) G_GNUC_PRINTF(2, 3);
bool real_cuda_check(RealCuda *cu, cudaError_t rc, const char *what);
bool real_cuda_check_blas(RealCuda *cu, cublasStatus_t status, const char *what);
bool real_cuda_launched(RealCuda *cu, const char *kernel);

/* real_cuda.cu: device memory (the backend's free; workspace scratch and its release), a
 * copy to or from the host, and a host int array staged on the device in slot `slot`. */
void real_cuda_free(RealBackend *be, void *ptr);
void *real_cuda_scratch(RealCuda *cu, size_t bytes);
void real_cuda_free_all(RealCuda *cu, void **buffers, size_t n);
bool real_cuda_copy_host(RealCuda *cu, void *dst, const void *src, size_t bytes);
const int *real_cuda_upload_ints(RealCuda *cu, int slot, const int *host, size_t n);

/* Blocks for a grid-stride loop over n elements (n > 0). */
static inline unsigned real_cuda_blocks(size_t n)
{
    size_t blocks = (n + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS;
    return (unsigned)(blocks < REAL_CUDA_MAX_BLOCKS ? blocks : REAL_CUDA_MAX_BLOCKS);
}

static inline bool real_cuda_aligned(const void *p, size_t bytes)
{
    return (uintptr_t)p % bytes == 0;
}

/* ---- device helpers ---- */

__device__ __forceinline__ float real_cuda_widen(RealBf16 value)
{
    return __uint_as_float((uint32_t)value << 16);
}

/* real_bf16_from_f32, bit for bit (NaNs included, which cuda_bf16.h canonicalises). */
__device__ __forceinline__ RealBf16 real_cuda_narrow(float value)
{
    uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (RealBf16)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (RealBf16)(bits >> 16);
}

__device__ __forceinline__ float real_cuda_load(const float *src)
{
    return *src;
}

__device__ __forceinline__ float real_cuda_load(const RealBf16 *src)
{
    return real_cuda_widen(*src);
}

__device__ __forceinline__ void real_cuda_store(float *dst, float value)
{
    *dst = value;
}

__device__ __forceinline__ void real_cuda_store(RealBf16 *dst, float value)
{
    *dst = real_cuda_narrow(value);
}

#define REAL_CUDA_GRID_STRIDE(i, n)                                                        \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (size_t)gridDim.x * blockDim.x)

/* Sums over the block in a fixed tree (shuffles, then one warp over the warps' sums), so the
 * result is the same on every run; every thread gets it. shared holds 32 values. */
template <typename T>
__device__ T real_cuda_block_sum(T value, T *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_down_sync(0xffffffffu, value, offset);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < (int)(blockDim.x >> 5) ? shared[lane] : (T)0;
        for (int offset = 16; offset > 0; offset >>= 1)
            value += __shfl_down_sync(0xffffffffu, value, offset);
        if (lane == 0)
            shared[0] = value;
    }
    __syncthreads();
    return shared[0];
}

static inline __device__ float real_cuda_block_max(float value, float *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1)
        value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
    __syncthreads();
    if (lane == 0)
        shared[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < (int)(blockDim.x >> 5) ? shared[lane] : -INFINITY;
        for (int offset = 16; offset > 0; offset >>= 1)
            value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
        if (lane == 0)
            shared[0] = value;
    }
    __syncthreads();
    return shared[0];
}

/* Butterfly sums and maxima over a warp: every lane ends with the same bits, because each
 * step adds the same two values in either order. */
__device__ __forceinline__ float real_cuda_warp_sum(float value)
{
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

__device__ __forceinline__ float real_cuda_warp_max(float value)
{
    for (int offset = 16; offset > 0; offset >>= 1)
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}

/* real_cuda_elementwise.cu: the bf16 conversions (the GEMMs' operands too), and the column
 * sums of dy (and of dy x xhat, xhat from x, mean and rstd) that the bias's and the layer
 * norm's backward take: dsum[c] += sum_r dy[r,c], dsum_xhat[c] += sum_r dy xhat. */
void real_cuda_bf16_to_f32(RealBackend *be, float *dst, const RealBf16 *src, size_t n);
void real_cuda_f32_to_bf16(RealBackend *be, RealBf16 *dst, const float *src, size_t n);
void real_cuda_column_sums(RealCuda *cu, float *dsum, float *dsum_xhat, const float *dy,
                           const float *x, const float *mean, const float *rstd, int rows,
                           int cols);

/* real_cuda_gemm.cu: the element type GEMM operands must have in this mode and its size; an
 * operand of n elements in it (itself, or converted into `scratch`); and the row-major,
 * strided-batched GEMM attention's batches run on (c = alpha op(a) op(b) + beta c). */
RealDType real_cuda_gemm_dtype(const RealCuda *cu);
size_t real_cuda_dtype_bytes(RealDType dtype);
const void *real_cuda_as_gemm_dtype(RealCuda *cu, RealDType dtype, const void *data, size_t n,
                                    void *scratch);
bool real_cuda_gemm_strided(RealCuda *cu, bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const void *a, int lda, long long stride_a,
                            const void *b, int ldb, long long stride_b, float beta, float *c,
                            int ldc, long long stride_c, int batch);

/* Each kernel family's entries of the backend's table (real_cuda_backend_new). */
void real_cuda_install_elementwise(RealBackend *be);
void real_cuda_install_gemm(RealBackend *be);
void real_cuda_install_embed(RealBackend *be);
void real_cuda_install_norm(RealBackend *be);
void real_cuda_install_attention(RealBackend *be);

#endif
