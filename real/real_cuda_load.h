/* real_cuda_load: the CUDA backend and the NCCL communicator, loaded from libzcuda.so beside
 * the running program when --backend cuda asks for them, so that a CPU rank never maps CUDA. */
#ifndef REAL_CUDA_LOAD_H
#define REAL_CUDA_LOAD_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_cuda.h"

#include <glib.h>

/* What zreal calls of the CUDA parts (real_cuda.h, real_comm_nccl.h). */
typedef struct {
    gboolean (*gemm_mode_from_env)(RealCudaGemmMode *mode, GError **error);
    RealBackend *(*backend_new)(int local_rank, RealCudaGemmMode mode, GError **error);
    RealComm *(*comm_nccl_new)(RealBackend *cuda_be, GError **error);
} RealCudaEntries;

/* Loads libzcuda.so from the running program's folder (it stays loaded) and fills
 * `entries`. Fails with one line naming the library and why: a build without CUDA, a missing
 * library, or one that lacks an entry or a symbol it needs from the program. */
gboolean real_cuda_load(RealCudaEntries *entries, GError **error);

#endif
