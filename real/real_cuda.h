/* real_cuda: the CUDA implementation of RealBackend (cuBLAS GEMMs, own kernels, one stream).
 * Includable from C without CUDA headers; built only where nvcc exists (ZP_HAVE_CUDA). */
#ifndef REAL_CUDA_H
#define REAL_CUDA_H

#include "real_backend.h"

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t is a pointer to this; declared here so C callers need no CUDA header. */
struct CUstream_st;

/* How GEMMs treat their operands. */
typedef enum {
    /* bf16 tensor cores, fp32 accumulation and output: fp32 operands are rounded to bf16 in
     * workspace first, as PyTorch autocast does. The training default. */
    REAL_CUDA_GEMM_BF16,
    /* fp32 GEMMs with TF32 and every reduced-precision shortcut disabled (cuBLAS pedantic
     * math): bf16 operands are widened exactly, so results differ from the CPU backend's
     * only by summation order, for bit-close comparison. */
    REAL_CUDA_GEMM_FP32,
} RealCudaGemmMode;

#define REAL_CUDA_ERROR real_cuda_error_quark()
GQuark real_cuda_error_quark(void);

/* The GEMM mode the environment asks for: ZREAL_CUDA_GEMM unset or "bf16" gives
 * REAL_CUDA_GEMM_BF16, "fp32" REAL_CUDA_GEMM_FP32; anything else is an error naming it. */
gboolean real_cuda_gemm_mode_from_env(RealCudaGemmMode *mode, GError **error);

/* A CUDA backend on device local_rank modulo the number of devices (one rank per GPU when
 * ranks on a node are numbered 0, 1, ...), with its own stream, cuBLAS handle, stream-ordered
 * memory pool and tracker, named "cuda" (bf16 GEMMs) or "cuda-exact" (fp32 GEMMs). Every device allocation is counted in the tracker under its
 * category (its GEMM workspace and token staging as workspace). Fails with one line when no
 * device can be used: "no CUDA device (cudaGetDeviceCount: <CUDA's reason>)". Release with
 * be->destroy(be). One backend per thread: it makes its device current on construction and
 * expects it to stay current. */
RealBackend *real_cuda_backend_new(int local_rank, RealCudaGemmMode mode, GError **error);

/* The device a backend from real_cuda_backend_new runs on. */
int real_cuda_device(RealBackend *be);

/* The stream every call of the backend is issued on, in order; work ordered after it (a
 * collective) must wait for it, and work it depends on must be waited for on it. */
struct CUstream_st *real_cuda_stream(RealBackend *be);

/* Records the device memory the NCCL communicator took at set-up, for device_memory. */
void real_cuda_set_nccl_bytes(RealBackend *be, uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif
