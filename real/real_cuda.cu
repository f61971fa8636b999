/* real_cuda: the CUDA implementation of RealBackend: cuBLAS GEMMs and own kernels, all issued in
 * order on one stream, numerics matching real_cpu.c's operation for operation where they can.
 * This file: errors, memory, the host tier's copies, device clocks and the life cycle; the
 * kernels are in real_cuda_{elementwise,gemm,embed,norm,attention}.cu. */
#include "real_cuda_internal.cuh"

G_DEFINE_QUARK(real-cuda-error-quark, real_cuda_error)

/* ---- errors: the first failure is kept, and reported by synchronize ---- */

void real_cuda_fail(RealCuda *cu, const char *format, ...)
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

bool real_cuda_check(RealCuda *cu, cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return true;
    real_cuda_fail(cu, "%s failed: %s (%s)", what, cudaGetErrorName(rc), cudaGetErrorString(rc));
    return false;
}

bool real_cuda_check_blas(RealCuda *cu, cublasStatus_t status, const char *what)
{
    if (status == CUBLAS_STATUS_SUCCESS)
        return true;
    real_cuda_fail(cu, "%s failed: %s", what, cublasGetStatusString(status));
    return false;
}

/* After every kernel launch: a bad configuration is reported at once, a fault later. */
bool real_cuda_launched(RealCuda *cu, const char *kernel)
{
    return real_cuda_check(cu, cudaGetLastError(), kernel);
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

void real_cuda_free(RealBackend *be, void *ptr)
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
void *real_cuda_scratch(RealCuda *cu, size_t bytes)
{
    return real_cuda_alloc(&cu->base, bytes, REAL_MEM_WORKSPACE);
}

/* Frees every non-NULL scratch buffer of a call. */
void real_cuda_free_all(RealCuda *cu, void **buffers, size_t n)
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
bool real_cuda_copy_host(RealCuda *cu, void *dst, const void *src, size_t bytes)
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
const int *real_cuda_upload_ints(RealCuda *cu, int slot, const int *host, size_t n)
{
    int *dev = real_cuda_stage(cu, slot, n);
    if (!dev) {
        real_cuda_fail(cu, "no device memory to stage %zu host ints", n);
        return NULL;
    }
    return real_cuda_copy_host(cu, dev, host, n * sizeof(int)) ? dev : NULL;
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
    real_cuda_install_elementwise(be);
    real_cuda_install_gemm(be);
    real_cuda_install_embed(be);
    real_cuda_install_norm(be);
    real_cuda_install_attention(be);
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
