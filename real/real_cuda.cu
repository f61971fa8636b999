/* real_cuda: the CUDA implementation of RealBackend: cuBLAS GEMMs and own kernels, all issued in
 * order on one stream, numerics matching real_cpu.c's operation for operation where they can. */
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

G_DEFINE_QUARK(real-cuda-error-quark, real_cuda_error)

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

static RealCuda *real_cuda_of(RealBackend *be)
{
    return (RealCuda *)be;
}

/* ---- errors: the first failure is kept, and reported by synchronize ---- */

static void real_cuda_fail(RealCuda *cu, const char *format, ...) G_GNUC_PRINTF(2, 3);
static void real_cuda_fail(RealCuda *cu, const char *format, ...)
{
    if (cu->failed)
        return;
    cu->failed = true;
    va_list args;
    va_start(args, format);
    char message[sizeof cu->error_text - 32];
    g_vsnprintf(message, sizeof message, format, args);
    va_end(args);
    g_snprintf(cu->error_text, sizeof cu->error_text, "CUDA device %d: %s", cu->device, message);
}

static bool real_cuda_check(RealCuda *cu, cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return true;
    real_cuda_fail(cu, "%s failed: %s (%s)", what, cudaGetErrorName(rc), cudaGetErrorString(rc));
    return false;
}

static bool real_cuda_check_blas(RealCuda *cu, cublasStatus_t status, const char *what)
{
    if (status == CUBLAS_STATUS_SUCCESS)
        return true;
    real_cuda_fail(cu, "%s failed: %s", what, cublasGetStatusString(status));
    return false;
}

/* After every kernel launch: a bad configuration is reported at once, a fault later. */
static bool real_cuda_launched(RealCuda *cu, const char *kernel)
{
    return real_cuda_check(cu, cudaGetLastError(), kernel);
}

/* Blocks for a grid-stride loop over n elements (n > 0). */
static unsigned real_cuda_blocks(size_t n)
{
    size_t blocks = (n + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS;
    return (unsigned)(blocks < REAL_CUDA_MAX_BLOCKS ? blocks : REAL_CUDA_MAX_BLOCKS);
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

__device__ float real_cuda_block_max(float value, float *shared)
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

/* ---- memory ---- */

static void *real_cuda_alloc(RealBackend *be, size_t bytes, RealMemCategory cat)
{
    RealCuda *cu = real_cuda_of(be);
    if ((int)cat < 0 || cat >= REAL_MEM_N_CATEGORIES)
        return NULL;
    void *ptr = NULL;
    /* Stream-ordered: memory freed earlier on this stream is reused without a sync. A
     * zero-byte request still gets a distinct pointer. */
    cudaError_t rc = cudaMallocFromPoolAsync(&ptr, bytes ? bytes : 1, cu->pool, cu->stream);
    if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* exhaustion is an answer (NULL), not a device failure */
        return NULL;
    }
    if (!real_cuda_check(cu, rc, "cudaMallocFromPoolAsync"))
        return NULL;
    if ((uintptr_t)ptr % REAL_CUDA_ALIGN_BYTES != 0) {
        real_cuda_fail(cu, "cudaMallocFromPoolAsync returned %p, not %d-byte aligned", ptr,
                       REAL_CUDA_ALIGN_BYTES);
        (void)cudaFreeAsync(ptr, cu->stream);
        return NULL;
    }
    if (!real_alloc_track(be->tracker, ptr, bytes, cat)) {
        real_cuda_fail(cu, "the pool returned %p, which is still live", ptr);
        (void)cudaFreeAsync(ptr, cu->stream);
        return NULL;
    }
    return ptr;
}

static void real_cuda_free(RealBackend *be, void *ptr)
{
    RealCuda *cu = real_cuda_of(be);
    if (!ptr)
        return;
    if (!real_alloc_untrack(be->tracker, ptr)) {
        real_cuda_fail(cu, "free(%p): not a buffer of this backend", ptr);
        return;
    }
    real_cuda_check(cu, cudaFreeAsync(ptr, cu->stream), "cudaFreeAsync");
}

/* Backend scratch for one call, freed (stream-ordered) before the call returns. */
static void *real_cuda_scratch(RealCuda *cu, size_t bytes)
{
    return real_cuda_alloc(&cu->base, bytes, REAL_MEM_WORKSPACE);
}

/* Frees every non-NULL scratch buffer of a call. */
static void real_cuda_free_all(RealCuda *cu, void **buffers, size_t n)
{
    for (size_t i = 0; i < n; i++)
        real_cuda_free(&cu->base, buffers[i]);
}

static void real_cuda_fill(RealBackend *be, void *dst, int byte_value, size_t bytes)
{
    RealCuda *cu = real_cuda_of(be);
    if (bytes)
        real_cuda_check(cu, cudaMemsetAsync(dst, byte_value, bytes, cu->stream),
                        "cudaMemsetAsync");
}

/* Whether the host addresses ptr directly (pageable or pinned memory) rather than it being
 * device memory; unified addressing tells them apart. */
static bool real_cuda_is_host(RealCuda *cu, const void *ptr)
{
    cudaPointerAttributes attr;
    if (!real_cuda_check(cu, cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes"))
        return false;
    return attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost;
}

/* A copy with a host side, in stream order and waited for: the host memory has been read (or
 * written) when this returns, whatever CUDA's rules for pageable transfers allow, so callers
 * may free or read it at once. Rare in a step (tokens, targets, the loss), so the wait is
 * cheap. */
static bool real_cuda_copy_host(RealCuda *cu, void *dst, const void *src, size_t bytes)
{
    return real_cuda_check(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu->stream),
                           "cudaMemcpyAsync") &&
           real_cuda_check(cu, cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize");
}

/* Either side may be host memory (the engine uploads initial parameters this way). */
static void real_cuda_copy(RealBackend *be, void *dst, const void *src, size_t bytes)
{
    RealCuda *cu = real_cuda_of(be);
    if (bytes == 0 || dst == src)
        return;
    const bool host_dst = real_cuda_is_host(cu, dst), host_src = real_cuda_is_host(cu, src);
    if (host_dst && host_src) { /* no device work pending on them: every host copy waits */
        memmove(dst, src, bytes);
        return;
    }
    if (host_dst || host_src) {
        real_cuda_copy_host(cu, dst, src, bytes);
        return;
    }
    const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + bytes && s < d + bytes) {
        /* cudaMemcpy is undefined on overlapping ranges: go through scratch. */
        void *tmp = real_cuda_scratch(cu, bytes);
        if (!tmp) {
            real_cuda_fail(cu, "no scratch memory for an overlapping copy of %zu bytes", bytes);
            return;
        }
        real_cuda_check(cu, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDefault, cu->stream),
                        "cudaMemcpyAsync");
        real_cuda_check(cu, cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDefault, cu->stream),
                        "cudaMemcpyAsync");
        real_cuda_free(be, tmp);
        return;
    }
    real_cuda_check(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu->stream),
                    "cudaMemcpyAsync");
}

/* ---- the host tier's pinned memory and copy stream (ZeRO-Offload; not yet run on a GPU:
 * the tests that cover offload run on the CPU backend) ---- */

/* Page-locks memory the host tier already allocated (DeepSpeed pins with pin_memory(), a
 * pinned allocation; registering the tier's own allocation keeps its tracker's counts). */
static bool real_cuda_pin_host(RealBackend *be, void *host, size_t bytes)
{
    return bytes == 0 || real_cuda_check(real_cuda_of(be), cudaHostRegister(host, bytes,
                                                                            cudaHostRegisterDefault),
                                         "cudaHostRegister");
}

static void real_cuda_unpin_host(RealBackend *be, void *host)
{
    real_cuda_check(real_cuda_of(be), cudaHostUnregister(host), "cudaHostUnregister");
}

/* On the copy stream after everything queued on the compute stream so far. */
static void real_cuda_copy_async(RealBackend *be, void *dst, const void *src, size_t bytes)
{
    RealCuda *cu = real_cuda_of(be);
    if (bytes == 0)
        return;
    if (real_cuda_check(cu, cudaEventRecord(cu->queued, cu->stream), "cudaEventRecord") &&
        real_cuda_check(cu, cudaStreamWaitEvent(cu->copy_stream, cu->queued, 0),
                        "cudaStreamWaitEvent"))
        real_cuda_check(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cu->copy_stream),
                        "cudaMemcpyAsync");
}

static void real_cuda_copy_wait(RealBackend *be, bool host)
{
    RealCuda *cu = real_cuda_of(be);
    if (real_cuda_check(cu, cudaEventRecord(cu->copied, cu->copy_stream), "cudaEventRecord") &&
        real_cuda_check(cu, cudaStreamWaitEvent(cu->stream, cu->copied, 0),
                        "cudaStreamWaitEvent") &&
        host)
        real_cuda_check(cu, cudaEventSynchronize(cu->copied), "cudaEventSynchronize");
}

/* A staging buffer of at least n_elems ints; grows (never shrinks). NULL when it cannot. */
static int *real_cuda_stage(RealCuda *cu, int slot, size_t n_elems)
{
    if (cu->stage[slot] && cu->stage_elems[slot] >= n_elems)
        return cu->stage[slot];
    real_cuda_free(&cu->base, cu->stage[slot]);
    cu->stage[slot] = (int *)real_cuda_alloc(&cu->base, n_elems * sizeof(int),
                                             REAL_MEM_WORKSPACE);
    cu->stage_elems[slot] = cu->stage[slot] ? n_elems : 0;
    return cu->stage[slot];
}

/* Host ints -> the staging slot, in stream order; NULL (a recorded failure) when it cannot. */
static const int *real_cuda_upload_ints(RealCuda *cu, int slot, const int *host, size_t n)
{
    int *dev = real_cuda_stage(cu, slot, n);
    if (!dev) {
        real_cuda_fail(cu, "no device memory to stage %zu host ints", n);
        return NULL;
    }
    return real_cuda_copy_host(cu, dev, host, n * sizeof(int)) ? dev : NULL;
}

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

static bool real_cuda_aligned(const void *p, size_t bytes)
{
    return (uintptr_t)p % bytes == 0;
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

static void real_cuda_bf16_to_f32(RealBackend *be, float *dst, const RealBf16 *src, size_t n)
{
    real_cuda_elementwise(real_cuda_of(be), RealCudaToF32{dst, src}, n,
                          real_cuda_aligned(dst, 16) && real_cuda_aligned(src, 8), "bf16_to_f32");
}

static void real_cuda_f32_to_bf16(RealBackend *be, RealBf16 *dst, const float *src, size_t n)
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

/* ---- GEMMs ---- */

/* The element type GEMM operands must have in this mode, and its size. */
static RealDType real_cuda_gemm_dtype(const RealCuda *cu)
{
    return cu->mode == REAL_CUDA_GEMM_BF16 ? REAL_DTYPE_BF16 : REAL_DTYPE_F32;
}

static size_t real_cuda_dtype_bytes(RealDType dtype)
{
    return dtype == REAL_DTYPE_BF16 ? sizeof(RealBf16) : sizeof(float);
}

/* An operand of n elements in the GEMM dtype: itself when it already is, else converted
 * into `scratch` (which the caller sized for n elements of the GEMM dtype). */
static const void *real_cuda_as_gemm_dtype(RealCuda *cu, RealDType dtype, const void *data,
                                           size_t n, void *scratch)
{
    if (dtype == real_cuda_gemm_dtype(cu))
        return data;
    if (dtype == REAL_DTYPE_F32)
        real_cuda_f32_to_bf16(&cu->base, (RealBf16 *)scratch, (const float *)data, n);
    else
        real_cuda_bf16_to_f32(&cu->base, (float *)scratch, (const RealBf16 *)data, n);
    return scratch;
}

/* Row-major, strided-batched: for each of `batch` problems, c[m,n] (row stride ldc) =
 * alpha op(a) op(b) + beta c, a and b in the GEMM dtype with row strides lda, ldb; stride_*
 * is the element distance between problems. cuBLAS is column-major, and a row-major matrix
 * is its transpose there, so the row-major C = op(A) op(B) is computed as the column-major
 * C^T = op(B)^T op(A)^T: the operands swap places and keep their transpose flags. */
static bool real_cuda_gemm_strided(RealCuda *cu, bool trans_a, bool trans_b, int m, int n, int k,
                                   float alpha, const void *a, int lda, long long stride_a,
                                   const void *b, int ldb, long long stride_b, float beta,
                                   float *c, int ldc, long long stride_c, int batch)
{
    const bool bf16 = cu->mode == REAL_CUDA_GEMM_BF16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    /* Pedantic: no TF32, no reduced-precision shortcuts, whatever NVIDIA_TF32_OVERRIDE says. */
    const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t status;
    if (batch == 1)
        status = cublasGemmEx(cu->blas, op_b, op_a, n, m, k, &alpha, b, type, ldb, a, type, lda,
                              &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT);
    else
        status = cublasGemmStridedBatchedEx(cu->blas, op_b, op_a, n, m, k, &alpha, b, type, ldb,
                                            stride_b, a, type, lda, stride_a, &beta, c,
                                            CUDA_R_32F, ldc, stride_c, batch, compute,
                                            CUBLAS_GEMM_DEFAULT);
    return real_cuda_check_blas(cu, status, batch == 1 ? "cublasGemmEx"
                                                       : "cublasGemmStridedBatchedEx");
}

__global__ void real_cuda_k_scale_f32(float *c, size_t n, float beta)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

/* cuBLAS picks its fast kernels (on Hopper, tensor-core kernels fed by the TMA) only when
 * every matrix's row stride is a multiple of 16 bytes and the output's extents m and n are
 * multiples of 8; otherwise it falls back to "align1" kernels. Measured on an H100 (Nsight
 * Compute): GPT-2's tied LM head, vocabulary 50257, ran its three GEMMs in 15.5 ms of a
 * 66 ms step through align1 kernels, and still did with only the strides padded. So m, n
 * and k are rounded up to multiples of 8, like the vocabulary padding of nanoGPT and
 * Megatron but invisible to the caller: an operand that must grow, change dtype or stride
 * is staged in scratch, and the output is computed into padded scratch and copied out, a
 * band of rows at a time (so that the padding costs at most REAL_CUDA_PAD_C_BYTES). Each
 * output element reads only its own row of op(A) and column of op(B), so the rows and
 * columns added (left as the scratch holds them) reach only outputs that are dropped. */
#define REAL_CUDA_LD_ALIGN_BYTES 16
#define REAL_CUDA_EXTENT_ALIGN 8
#define REAL_CUDA_PAD_C_BYTES ((size_t)128 << 20)

static int real_cuda_round_up(int value, int multiple)
{
    return (int)(((size_t)value + multiple - 1) / multiple * multiple);
}

/* The smallest row stride >= cols elements of elem_bytes that is a multiple of 16 bytes. */
static int real_cuda_padded_ld(int cols, size_t elem_bytes)
{
    return real_cuda_round_up(cols, (int)(REAL_CUDA_LD_ALIGN_BYTES / elem_bytes));
}

/* dst[r, c] (row stride ld_dst, the GEMM dtype) = src[r, c] (row stride cols, src_dtype),
 * for c < cols; the padding columns are left as they are (no GEMM reads them). */
template <typename Dst, typename Src>
__global__ void real_cuda_k_convert_2d(Dst *dst, int ld_dst, const Src *src, int rows, int cols)
{
    for (int r = blockIdx.y; r < rows; r += gridDim.y)
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
            real_cuda_store(dst + (size_t)r * ld_dst + c, real_cuda_load(src + (size_t)r * cols + c));
}

static void real_cuda_convert_2d(RealCuda *cu, void *dst, int ld_dst, RealDType src_dtype,
                                 const void *src, int rows, int cols)
{
    const dim3 grid((unsigned)MIN((cols + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS, 64),
                    (unsigned)MIN(rows, 65535));
    if (src_dtype == REAL_DTYPE_F32)
        real_cuda_k_convert_2d<<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
            (RealBf16 *)dst, ld_dst, (const float *)src, rows, cols);
    else
        real_cuda_k_convert_2d<<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
            (float *)dst, ld_dst, (const RealBf16 *)src, rows, cols);
    real_cuda_launched(cu, "gemm operand conversion");
}

/* A GEMM operand stored rows x cols (row-major, row stride cols) in `dtype`, as cuBLAS will
 * read it: in the GEMM dtype, rows_ext x cols_ext (>= rows x cols), row stride *ld a
 * multiple of 16 bytes; with zero_pad, what lies outside rows x cols is +0 (padding along
 * k, which every output sums over). *out is the operand itself when it already is, else
 * *tmp, scratch the caller frees. False when scratch cannot be had. */
static bool real_cuda_gemm_operand(RealCuda *cu, RealDType dtype, const void *data, int rows,
                                   int cols, int rows_ext, int cols_ext, bool zero_pad,
                                   const void **out, int *ld, void **tmp)
{
    const RealDType want = real_cuda_gemm_dtype(cu);
    const size_t want_bytes = real_cuda_dtype_bytes(want);
    *ld = real_cuda_padded_ld(cols_ext, want_bytes);
    *tmp = NULL;
    *out = data;
    if (dtype == want && *ld == cols && rows_ext == rows &&
        real_cuda_aligned(data, REAL_CUDA_LD_ALIGN_BYTES))
        return true;
    const size_t tmp_bytes = (size_t)rows_ext * *ld * want_bytes;
    *tmp = real_cuda_scratch(cu, tmp_bytes);
    if (!*tmp)
        return false;
    *out = *tmp;
    if (zero_pad && (rows_ext != rows || cols_ext != cols))
        real_cuda_check(cu, cudaMemsetAsync(*tmp, 0, tmp_bytes, cu->stream), "cudaMemsetAsync");
    if (*ld == cols && dtype == want) /* staged only to add rows, or to align the pointer */
        real_cuda_check(cu, cudaMemcpyAsync(*tmp, data, (size_t)rows * cols * want_bytes,
                                            cudaMemcpyDeviceToDevice, cu->stream),
                        "cudaMemcpyAsync");
    else if (*ld == cols)
        real_cuda_as_gemm_dtype(cu, dtype, data, (size_t)rows * cols, *tmp);
    else if (dtype == want)
        real_cuda_check(cu, cudaMemcpy2DAsync(*tmp, (size_t)*ld * want_bytes, data,
                                              (size_t)cols * want_bytes,
                                              (size_t)cols * want_bytes, (size_t)rows,
                                              cudaMemcpyDeviceToDevice, cu->stream),
                        "cudaMemcpy2DAsync");
    else
        real_cuda_convert_2d(cu, *tmp, *ld, dtype, data, rows, cols);
    return true;
}

/* Copies an fp32 matrix of rows x cols between row strides (elements). */
static bool real_cuda_copy_2d(RealCuda *cu, float *dst, int ld_dst, const float *src, int ld_src,
                              int rows, int cols)
{
    return real_cuda_check(cu, cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src,
                                                 (size_t)ld_src * sizeof(float),
                                                 (size_t)cols * sizeof(float), (size_t)rows,
                                                 cudaMemcpyDeviceToDevice, cu->stream),
                           "cudaMemcpy2DAsync");
}

static bool real_cuda_gemm(RealBackend *be, bool trans_a, bool trans_b, int m, int n, int k,
                           float alpha, RealDType a_dtype, const void *a, RealDType b_dtype,
                           const void *b, float beta, float *c)
{
    RealCuda *cu = real_cuda_of(be);
    if (m <= 0 || n <= 0)
        return !cu->failed;
    if (k <= 0) { /* the product is empty (and cuBLAS rejects leading dimensions of 0) */
        const size_t elems = (size_t)m * n;
        real_cuda_k_scale_f32<<<real_cuda_blocks(elems), REAL_CUDA_THREADS, 0, cu->stream>>>(
            c, elems, beta);
        return real_cuda_launched(cu, "gemm (k = 0)") && !cu->failed;
    }
    const int mp = real_cuda_round_up(m, REAL_CUDA_EXTENT_ALIGN);
    const int np = real_cuda_round_up(n, REAL_CUDA_EXTENT_ALIGN);
    const int kp = real_cuda_round_up(k, REAL_CUDA_EXTENT_ALIGN);
    const void *ag = NULL, *bg = NULL;
    int lda = 0, ldb = 0;
    void *scratch[3] = {NULL, NULL, NULL};
    /* op(A) is m x k: A stored [m,k], or [k,m] when transposed; op(B) is k x n likewise. k
     * grows with zeros in both operands, so the sums gain only exact zeros. */
    bool ok = real_cuda_gemm_operand(cu, a_dtype, a, trans_a ? k : m, trans_a ? m : k,
                                     trans_a ? kp : mp, trans_a ? mp : kp, kp != k, &ag, &lda,
                                     &scratch[0]) &&
              real_cuda_gemm_operand(cu, b_dtype, b, trans_b ? n : k, trans_b ? k : n,
                                     trans_b ? np : kp, trans_b ? kp : np, kp != k, &bg, &ldb,
                                     &scratch[1]);
    const bool direct = mp == m && np == n && real_cuda_aligned(c, REAL_CUDA_LD_ALIGN_BYTES);
    if (ok && direct)
        ok = real_cuda_gemm_strided(cu, trans_a, trans_b, m, n, kp, alpha, ag, lda, 0, bg, ldb,
                                    0, beta, c, n, 0, 1);
    /* Otherwise bands of rows of the padded output; rows of C are rows of op(A): rows of A,
     * or columns when A is transposed. */
    const int band = real_cuda_round_up(
        (int)MAX((size_t)1, REAL_CUDA_PAD_C_BYTES / ((size_t)np * sizeof(float))),
        REAL_CUDA_EXTENT_ALIGN);
    if (ok && !direct)
        ok = (scratch[2] = real_cuda_scratch(cu, (size_t)MIN(band, mp) * np * sizeof(float))) !=
             NULL;
    const size_t a_bytes = real_cuda_dtype_bytes(real_cuda_gemm_dtype(cu));
    for (int r0 = 0; ok && !direct && r0 < mp; r0 += band) {
        const int rows = MIN(band, mp - r0), kept = MIN(rows, m - r0);
        const char *a_band = (const char *)ag + (trans_a ? (size_t)r0 : (size_t)r0 * lda) * a_bytes;
        float *cg = (float *)scratch[2];
        ok = (beta == 0.0f || real_cuda_copy_2d(cu, cg, np, c + (size_t)r0 * n, n, kept, n)) &&
             real_cuda_gemm_strided(cu, trans_a, trans_b, rows, np, kp, alpha, a_band, lda, 0, bg,
                                    ldb, 0, beta, cg, np, 0, 1) &&
             real_cuda_copy_2d(cu, c + (size_t)r0 * n, n, cg, np, kept, n);
    }
    real_cuda_free_all(cu, scratch, G_N_ELEMENTS(scratch));
    return ok && !cu->failed;
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
static void real_cuda_column_sums(RealCuda *cu, float *dsum, float *dsum_xhat, const float *dy,
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

/* ---- embedding ---- */

__global__ void real_cuda_k_embedding_fwd(float *x, const int *tokens, const RealBf16 *wte,
                                          const RealBf16 *wpe, size_t n, int seq_len, int hidden)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)hidden;
        const int c = (int)(i % (size_t)hidden), t = (int)(row % (size_t)seq_len);
        x[i] = real_cuda_widen(wte[(size_t)tokens[row] * hidden + c]) +
               real_cuda_widen(wpe[(size_t)t * hidden + c]);
    }
}

static void real_cuda_embedding_fwd(RealBackend *be, float *x, const int *tokens,
                                    const RealBf16 *wte, const RealBf16 *wpe, int batch,
                                    int seq_len, int hidden)
{
    RealCuda *cu = real_cuda_of(be);
    const size_t rows = (size_t)batch * seq_len, n = rows * hidden;
    if (n == 0)
        return;
    const int *dev_tokens = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_TOKENS, tokens, rows);
    if (!dev_tokens)
        return;
    real_cuda_k_embedding_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        x, dev_tokens, wte, wpe, n, seq_len, hidden);
    real_cuda_launched(cu, "embedding_fwd");
}

/* dwpe[t,c] += dx[i s + t, c] for i = 0, 1, ...: the CPU's order, so the same bits. */
__global__ void real_cuda_k_embedding_bwd_pos(float *dwpe, const float *dx, int batch,
                                              int seq_len, int hidden)
{
    const size_t n = (size_t)seq_len * hidden;
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        float sum = dwpe[i];
        for (int b = 0; b < batch; b++)
            sum += dx[(size_t)b * n + i];
        dwpe[i] = sum;
    }
}

/* dwte[token,:] += dx[row,:] over the rows holding each token, in row order: block
 * (segment j, column tile) owns one distinct token's row of dwte, so no two threads add to
 * the same element and the order is the CPU's. index = [rows by token, then row; segment
 * starts (n_segments + 1); segment tokens (n_segments)]. */
__global__ void real_cuda_k_embedding_bwd_tok(float *dwte, const float *dx, const int *index,
                                              int rows, int n_segments, int hidden)
{
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int segment = blockIdx.x;
    if (c >= hidden)
        return;
    const int *order = index, *start = index + rows, *token = start + n_segments + 1;
    float *out = dwte + (size_t)token[segment] * hidden + c;
    float sum = *out;
    for (int j = start[segment]; j < start[segment + 1]; j++)
        sum += dx[(size_t)order[j] * hidden + c];
    *out = sum;
}

static int real_cuda_compare_pairs(const void *pa, const void *pb)
{
    const int *a = (const int *)pa, *b = (const int *)pb;
    if (a[0] != b[0])
        return (a[0] > b[0]) - (a[0] < b[0]);
    return (a[1] > b[1]) - (a[1] < b[1]);
}

/* dwte[tokens[r],:] += dx[r,:] for rows r < rows (rows, hidden > 0). */
static void real_cuda_embedding_bwd_tokens(RealCuda *cu, float *dwte, const int *tokens,
                                           const float *dx, int rows, int hidden)
{
    /* The token index is built on the host, where the tokens are: (token, row) pairs sorted,
     * then cut into one segment per distinct token. */
    int *pairs = g_new(int, 2 * (size_t)rows);
    for (int r = 0; r < rows; r++)
        pairs[2 * r] = tokens[r], pairs[2 * r + 1] = r;
    qsort(pairs, (size_t)rows, 2 * sizeof(int), real_cuda_compare_pairs);
    int *index = g_new(int, 3 * (size_t)rows + 1);
    int *start = index + rows, n_segments = 0;
    for (int r = 0; r < rows; r++) {
        index[r] = pairs[2 * r + 1];
        if (r == 0 || pairs[2 * r] != pairs[2 * r - 2])
            start[n_segments++] = r;
    }
    start[n_segments] = rows;
    int *segment_token = start + n_segments + 1;
    for (int j = 0; j < n_segments; j++)
        segment_token[j] = pairs[2 * start[j]];
    const int *dev_index = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_INDEX, index,
                                                 (size_t)rows + 2 * (size_t)n_segments + 1);
    g_free(pairs);
    g_free(index);
    if (!dev_index)
        return;
    const dim3 grid((unsigned)n_segments,
                    (unsigned)((hidden + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS));
    real_cuda_k_embedding_bwd_tok<<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
        dwte, dx, dev_index, rows, n_segments, hidden);
    real_cuda_launched(cu, "embedding_bwd (tokens)");
}

static void real_cuda_embedding_bwd(RealBackend *be, float *dwte, float *dwpe, const int *tokens,
                                    const float *dx, int batch, int seq_len, int hidden)
{
    RealCuda *cu = real_cuda_of(be);
    const int rows = batch * seq_len;
    if (rows <= 0 || hidden <= 0)
        return;
    const size_t pos_elems = (size_t)seq_len * hidden;
    real_cuda_k_embedding_bwd_pos<<<real_cuda_blocks(pos_elems), REAL_CUDA_THREADS, 0,
                                    cu->stream>>>(dwpe, dx, batch, seq_len, hidden);
    real_cuda_launched(cu, "embedding_bwd (positions)");
    real_cuda_embedding_bwd_tokens(cu, dwte, tokens, dx, rows, hidden);
}

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

/* ---- the Llama family: token embedding, RMSNorm, rotary, gated MLP, exact GELU ---- */

__global__ void real_cuda_k_token_embedding_fwd(float *x, const int *tokens, const RealBf16 *wte,
                                                size_t n, int hidden)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)hidden;
        x[i] = real_cuda_widen(wte[(size_t)tokens[row] * hidden + i % (size_t)hidden]);
    }
}

static void real_cuda_token_embedding_fwd(RealBackend *be, float *x, const int *tokens,
                                          const RealBf16 *wte, int rows, int hidden)
{
    RealCuda *cu = real_cuda_of(be);
    const size_t n = (size_t)MAX(rows, 0) * (size_t)MAX(hidden, 0);
    if (n == 0)
        return;
    const int *dev_tokens = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_TOKENS, tokens,
                                                  (size_t)rows);
    if (!dev_tokens)
        return;
    real_cuda_k_token_embedding_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        x, dev_tokens, wte, n, hidden);
    real_cuda_launched(cu, "token_embedding_fwd");
}

static void real_cuda_token_embedding_bwd(RealBackend *be, float *dwte, const int *tokens,
                                          const float *dx, int rows, int hidden)
{
    if (rows > 0 && hidden > 0)
        real_cuda_embedding_bwd_tokens(real_cuda_of(be), dwte, tokens, dx, rows, hidden);
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

/* The frequencies of up to REAL_CUDA_ROPE_MAX_PAIRS pairs (head dimensions up to 512; every
 * published model's are 256 at most), passed by value as a kernel parameter: no copy, no
 * synchronisation. */
#define REAL_CUDA_ROPE_MAX_PAIRS 256

struct RealCudaRopeFreqs {
    double inv_freq[REAL_CUDA_ROPE_MAX_PAIRS];
};

/* A thread per (row, q or k head, pair c < rot_dim/2): the CPU's angle t inv_freq[c] in double
 * (the same table, real_rope_inv_freq), its cosine and sine rounded to float, then the same
 * float rotation. */
__global__ void real_cuda_k_rope(float *qkv, size_t n, int seq_len, int heads_qk, int ld,
                                 int head_dim, int rot_dim, RealCudaRopeFreqs freqs, bool inverse)
{
    const int half = rot_dim / 2;
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const int c = (int)(i % (size_t)half);
        const int j = (int)(i / (size_t)half % (size_t)heads_qk);
        const size_t r = i / ((size_t)half * heads_qk);
        const int t = (int)(r % (size_t)seq_len);
        const double angle = t * freqs.inv_freq[c];
        const float cs = (float)cos(angle), sn = (float)(inverse ? -sin(angle) : sin(angle));
        float *x = qkv + r * ld + (size_t)j * head_dim;
        const float a = x[c], b = x[c + half];
        x[c] = a * cs - b * sn;
        x[c + half] = b * cs + a * sn;
    }
}

static bool real_cuda_rope(RealBackend *be, float *qkv, int batch, int seq_len, int heads,
                           int kv_heads, int head_dim, const RealRope *rope, bool inverse)
{
    RealCuda *cu = real_cuda_of(be);
    const int half = rope->rot_dim / 2;
    if (batch <= 0 || seq_len <= 0 || half < 1)
        return !cu->failed;
    if (half > REAL_CUDA_ROPE_MAX_PAIRS) {
        real_cuda_fail(cu, "rope: %d rotated dimensions, more than the %d this backend turns",
                       rope->rot_dim, 2 * REAL_CUDA_ROPE_MAX_PAIRS);
        return false;
    }
    RealCudaRopeFreqs freqs;
    for (int c = 0; c < half; c++)
        freqs.inv_freq[c] = real_rope_inv_freq(rope, c);
    const size_t n = (size_t)batch * seq_len * (size_t)(heads + kv_heads) * (size_t)half;
    real_cuda_k_rope<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        qkv, n, seq_len, heads + kv_heads, (heads + 2 * kv_heads) * head_dim, head_dim,
        rope->rot_dim, freqs, inverse);
    return real_cuda_launched(cu, "rope") && !cu->failed;
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

/* ---- loss ---- */

/* One block per row, two passes over the logits (they are the largest tensor of a step:
 * GPT-2's 50257-wide rows). Pass 1: each thread keeps the running maximum of its entries and
 * the sum of exp(x - max) in double, rescaled when its maximum grows; the block combines
 * them at the row's maximum in a fixed tree. Pass 2 writes the gradient exp(x - max) / sum
 * (times grad_scale) as the CPU does, then the target's -grad_scale. Only the sum's rounding
 * differs from the CPU's three passes. row_loss[r] = log(sum) + max - logit[target]. */
__global__ void real_cuda_k_softmax_xent(float *logits, const int *targets, int vocab,
                                         float grad_scale, double *row_loss)
{
    __shared__ float shared_f[32];
    __shared__ double shared_d[32];
    const size_t r = blockIdx.x;
    float *row = logits + r * vocab;
    const int target = targets[r];
    const float target_logit = row[target]; /* read by all before any write (the max syncs) */
    float local_max = -INFINITY;
    double local_sum = 0.0;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        const float x = row[c];
        if (x > local_max) {
            local_sum *= exp((double)local_max - (double)x);
            local_max = x;
        }
        local_sum += expf(x - local_max);
    }
    const float max = real_cuda_block_max(local_max, shared_f);
    const double sum = real_cuda_block_sum(
        local_max == -INFINITY ? 0.0 : local_sum * exp((double)local_max - (double)max), shared_d);
    const float scale = (float)(1.0 / sum) * grad_scale;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x)
        row[c] = expf(row[c] - max) * scale;
    __syncthreads(); /* the target's entry may be another thread's */
    if (threadIdx.x == 0) {
        row[target] -= grad_scale;
        row_loss[r] = log(sum) + max - target_logit;
    }
}

/* *total = sum of n doubles, one block in a fixed order. */
__global__ void real_cuda_k_sum_doubles(double *total, const double *values, int n)
{
    __shared__ double shared[32];
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        sum += values[i];
    sum = real_cuda_block_sum(sum, shared);
    if (threadIdx.x == 0)
        *total = sum;
}

static void real_cuda_softmax_xent(RealBackend *be, float *logits, const int *targets, int rows,
                                   int vocab, float dloss_scale, float *loss_out)
{
    RealCuda *cu = real_cuda_of(be);
    *loss_out = NAN; /* what a failure leaves; synchronize reports it */
    if (rows <= 0 || vocab <= 0)
        return;
    const int *dev_targets = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_TOKENS, targets,
                                                   (size_t)rows);
    double *row_loss = (double *)real_cuda_scratch(cu, (size_t)rows * sizeof(double));
    if (!dev_targets || !row_loss) {
        real_cuda_fail(cu, "no scratch memory for the loss of %d rows", rows);
        real_cuda_free(be, row_loss);
        return;
    }
    const float grad_scale = dloss_scale / (float)rows;
    real_cuda_k_softmax_xent<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        logits, dev_targets, vocab, grad_scale, row_loss);
    real_cuda_launched(cu, "softmax_xent");
    real_cuda_k_sum_doubles<<<1, REAL_CUDA_THREADS, 0, cu->stream>>>(cu->loss_sum, row_loss, rows);
    real_cuda_launched(cu, "softmax_xent (sum)");
    real_cuda_free(be, row_loss);
    double loss_sum = NAN;
    if (real_cuda_copy_host(cu, &loss_sum, cu->loss_sum, sizeof loss_sum))
        *loss_out = (float)(loss_sum / rows);
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

/* ---- device-only entries ---- */

static bool real_cuda_synchronize(RealBackend *be, const char **error_text)
{
    RealCuda *cu = real_cuda_of(be);
    real_cuda_check(cu, cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize");
    real_cuda_check(cu, cudaGetLastError(), "a kernel");
    if (error_text)
        *error_text = cu->failed ? cu->error_text : NULL;
    return !cu->failed;
}

static void *real_cuda_mark(RealBackend *be)
{
    RealCuda *cu = real_cuda_of(be);
    cudaEvent_t event;
    if (cu->free_events->len > 0) {
        event = (cudaEvent_t)g_ptr_array_steal_index_fast(cu->free_events,
                                                          cu->free_events->len - 1);
    } else {
        if (!real_cuda_check(cu, cudaEventCreate(&event), "cudaEventCreate"))
            return NULL;
        g_ptr_array_add(cu->events, event);
    }
    if (!real_cuda_check(cu, cudaEventRecord(event, cu->stream), "cudaEventRecord")) {
        g_ptr_array_add(cu->free_events, event);
        return NULL;
    }
    return event;
}

static double real_cuda_elapsed_s(RealBackend *be, void *begin, void *end)
{
    RealCuda *cu = real_cuda_of(be);
    float ms = 0.0f;
    if (begin && end &&
        real_cuda_check(cu, cudaEventSynchronize((cudaEvent_t)end), "cudaEventSynchronize"))
        real_cuda_check(cu, cudaEventElapsedTime(&ms, (cudaEvent_t)begin, (cudaEvent_t)end),
                        "cudaEventElapsedTime");
    if (begin)
        g_ptr_array_add(cu->free_events, begin);
    if (end)
        g_ptr_array_add(cu->free_events, end);
    return 1e-3 * ms;
}

static bool real_cuda_device_memory(RealBackend *be, RealDeviceMemory *out)
{
    RealCuda *cu = real_cuda_of(be);
    size_t free_bytes = 0, total_bytes = 0;
    uint64_t reserved = 0, peak = 0;
    if (!real_cuda_check(cu, cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo") ||
        !real_cuda_check(cu, cudaMemPoolGetAttribute(cu->pool, cudaMemPoolAttrReservedMemCurrent,
                                                     &reserved),
                         "cudaMemPoolGetAttribute") ||
        !real_cuda_check(cu, cudaMemPoolGetAttribute(cu->pool, cudaMemPoolAttrReservedMemHigh,
                                                     &peak),
                         "cudaMemPoolGetAttribute"))
        return false;
    *out = RealDeviceMemory{};
    out->total_bytes = total_bytes;
    out->used_bytes = total_bytes - free_bytes;
    out->context_bytes = cu->context_bytes;
    out->nccl_bytes = cu->nccl_bytes;
    out->pool_reserved_bytes = reserved;
    out->pool_peak_reserved_bytes = peak;
    return true;
}

/* ---- life cycle ---- */

/* Releases whatever a (possibly partial) construction made; device resources first. */
static void real_cuda_release(RealCuda *cu)
{
    if (cu->stream) {
        (void)cudaStreamSynchronize(cu->stream);
        for (int i = 0; i < REAL_CUDA_N_STAGES; i++)
            real_cuda_free(&cu->base, cu->stage[i]);
        real_cuda_free(&cu->base, cu->blas_workspace);
        real_cuda_free(&cu->base, cu->loss_sum);
        (void)cudaStreamSynchronize(cu->stream); /* the frees above are stream-ordered */
    }
    for (guint i = 0; cu->events && i < cu->events->len; i++)
        (void)cudaEventDestroy((cudaEvent_t)g_ptr_array_index(cu->events, i));
    if (cu->events)
        g_ptr_array_free(cu->events, TRUE);
    if (cu->free_events)
        g_ptr_array_free(cu->free_events, TRUE);
    if (cu->blas)
        (void)cublasDestroy(cu->blas);
    if (cu->pool)
        (void)cudaMemPoolDestroy(cu->pool);
    if (cu->stream)
        (void)cudaStreamDestroy(cu->stream);
    if (cu->copy_stream)
        (void)cudaStreamDestroy(cu->copy_stream);
    if (cu->queued)
        (void)cudaEventDestroy(cu->queued);
    if (cu->copied)
        (void)cudaEventDestroy(cu->copied);
    real_alloc_free_tracker(cu->base.tracker);
    g_free(cu);
}

static void real_cuda_destroy(RealBackend *be)
{
    real_cuda_release(real_cuda_of(be));
}

/* The device-side set-up, each step checked; false with cu->error_text on failure. */
static bool real_cuda_setup(RealCuda *cu)
{
    if (!real_cuda_check(cu, cudaSetDevice(cu->device), "cudaSetDevice") ||
        !real_cuda_check(cu, cudaFree(0), "creating the CUDA context") ||
        !real_cuda_check(cu, cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags") ||
        !real_cuda_check(cu, cudaStreamCreateWithFlags(&cu->copy_stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags") ||
        !real_cuda_check(cu, cudaEventCreateWithFlags(&cu->queued, cudaEventDisableTiming),
                         "cudaEventCreateWithFlags") ||
        !real_cuda_check(cu, cudaEventCreateWithFlags(&cu->copied, cudaEventDisableTiming),
                         "cudaEventCreateWithFlags") ||
        !real_cuda_check_blas(cu, cublasCreate(&cu->blas), "cublasCreate") ||
        !real_cuda_check_blas(cu, cublasSetStream(cu->blas, cu->stream), "cublasSetStream"))
        return false;
    int pools_supported = 0;
    if (!real_cuda_check(cu, cudaDeviceGetAttribute(&pools_supported,
                                                    cudaDevAttrMemoryPoolsSupported, cu->device),
                         "cudaDeviceGetAttribute"))
        return false;
    if (!pools_supported) {
        real_cuda_fail(cu, "no stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported)");
        return false;
    }
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = cu->device;
    /* Freed memory stays in the pool for the next allocation instead of going back to the
     * driver at every synchronisation: per-op alloc/free then costs no device sync. */
    uint64_t keep_all = UINT64_MAX;
    size_t free_bytes = 0, total_bytes = 0;
    if (!real_cuda_check(cu, cudaMemPoolCreate(&cu->pool, &props), "cudaMemPoolCreate") ||
        !real_cuda_check(cu, cudaMemPoolSetAttribute(cu->pool, cudaMemPoolAttrReleaseThreshold,
                                                     &keep_all),
                         "cudaMemPoolSetAttribute") ||
        !real_cuda_check(cu, cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"))
        return false;
    cu->context_bytes = total_bytes - free_bytes;
    /* cublasSetStream resets the workspace, so the workspace is set after it. */
    cu->blas_workspace = real_cuda_alloc(&cu->base, REAL_CUDA_BLAS_WORKSPACE_BYTES,
                                         REAL_MEM_WORKSPACE);
    cu->loss_sum = (double *)real_cuda_alloc(&cu->base, sizeof(double), REAL_MEM_WORKSPACE);
    if (!cu->blas_workspace || !cu->loss_sum) {
        real_cuda_fail(cu, "no device memory for the cuBLAS workspace");
        return false;
    }
    return real_cuda_check_blas(cu, cublasSetWorkspace(cu->blas, cu->blas_workspace,
                                                       REAL_CUDA_BLAS_WORKSPACE_BYTES),
                                "cublasSetWorkspace") &&
           real_cuda_check(cu, cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize");
}

RealBackend *real_cuda_backend_new(int local_rank, RealCudaGemmMode mode, GError **error)
{
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count <= 0) {
        g_set_error(error, REAL_CUDA_ERROR, 0, "no CUDA device (cudaGetDeviceCount: %s)",
                    rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return NULL;
    }
    if (local_rank < 0) {
        g_set_error(error, REAL_CUDA_ERROR, 0, "local rank %d is negative", local_rank);
        return NULL;
    }
    RealCuda *cu = g_new0(RealCuda, 1);
    cu->mode = mode;
    cu->device = local_rank % count;
    cu->events = g_ptr_array_new();
    cu->free_events = g_ptr_array_new();
    RealBackend *be = &cu->base;
    be->name = mode == REAL_CUDA_GEMM_BF16 ? "cuda" : "cuda-exact"; /* measured.json's backend */
    be->tracker = real_alloc_new();
    be->alloc = real_cuda_alloc;
    be->free = real_cuda_free;
    be->fill = real_cuda_fill;
    be->copy = real_cuda_copy;
    be->destroy = real_cuda_destroy;
    be->pin_host = real_cuda_pin_host;
    be->unpin_host = real_cuda_unpin_host;
    be->copy_async = real_cuda_copy_async;
    be->copy_wait = real_cuda_copy_wait;
    be->bf16_to_f32 = real_cuda_bf16_to_f32;
    be->f32_to_bf16 = real_cuda_f32_to_bf16;
    be->round_bf16 = real_cuda_round_bf16;
    be->accumulate_bf16 = real_cuda_accumulate_bf16;
    be->add_bf16 = real_cuda_add_bf16;
    be->scale_bf16 = real_cuda_scale_bf16;
    be->gemm = real_cuda_gemm;
    be->bias_fwd = real_cuda_bias_fwd;
    be->bias_bwd = real_cuda_bias_bwd;
    be->add = real_cuda_add;
    be->embedding_fwd = real_cuda_embedding_fwd;
    be->embedding_bwd = real_cuda_embedding_bwd;
    be->layernorm_fwd = real_cuda_layernorm_fwd;
    be->layernorm_bwd = real_cuda_layernorm_bwd;
    be->attention_fwd = real_cuda_attention_fwd;
    be->attention_bwd = real_cuda_attention_bwd;
    be->gelu_fwd = real_cuda_gelu_fwd;
    be->gelu_bwd = real_cuda_gelu_bwd;
    be->softmax_xent = real_cuda_softmax_xent;
    be->adam_step = real_cuda_adam_step;
    be->token_embedding_fwd = real_cuda_token_embedding_fwd;
    be->token_embedding_bwd = real_cuda_token_embedding_bwd;
    be->rmsnorm_fwd = real_cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = real_cuda_rmsnorm_bwd;
    be->rope = real_cuda_rope;
    be->glu_fwd = real_cuda_glu_fwd;
    be->glu_bwd = real_cuda_glu_bwd;
    be->gelu_erf_fwd = real_cuda_gelu_erf_fwd;
    be->gelu_erf_bwd = real_cuda_gelu_erf_bwd;
    be->attention_gqa_fwd = real_cuda_attention_gqa_fwd;
    be->attention_gqa_bwd = real_cuda_attention_gqa_bwd;
    be->flash_attention_fwd = real_cuda_flash_attention_fwd;
    be->flash_attention_bwd = real_cuda_flash_attention_bwd;
    be->synchronize = real_cuda_synchronize;
    be->mark = real_cuda_mark;
    be->elapsed_s = real_cuda_elapsed_s;
    be->device_memory = real_cuda_device_memory;
    if (!real_cuda_setup(cu)) {
        g_set_error_literal(error, REAL_CUDA_ERROR, 0, cu->error_text);
        real_cuda_release(cu);
        return NULL;
    }
    return be;
}

gboolean real_cuda_gemm_mode_from_env(RealCudaGemmMode *mode, GError **error)
{
    const char *value = g_getenv("ZREAL_CUDA_GEMM");
    if (!value || strcmp(value, "bf16") == 0) {
        *mode = REAL_CUDA_GEMM_BF16;
        return TRUE;
    }
    if (strcmp(value, "fp32") == 0) {
        *mode = REAL_CUDA_GEMM_FP32;
        return TRUE;
    }
    g_set_error(error, REAL_CUDA_ERROR, 0, "ZREAL_CUDA_GEMM: '%s' is neither bf16 nor fp32", value);
    return FALSE;
}

int real_cuda_device(RealBackend *be)
{
    return real_cuda_of(be)->device;
}

struct CUstream_st *real_cuda_stream(RealBackend *be)
{
    return real_cuda_of(be)->stream;
}

void real_cuda_set_nccl_bytes(RealBackend *be, uint64_t bytes)
{
    real_cuda_of(be)->nccl_bytes = bytes;
}
