/* real_comm_nccl: RealComm over NCCL for GPU ranks (one process per GPU, launched by mpirun),
 * the collectives on a stream of their own, ordered against the CUDA backend's stream. */
#ifndef REAL_COMM_NCCL_H
#define REAL_COMM_NCCL_H

#include "real_backend.h"
#include "real_comm.h"

#include <glib.h>

/* Called by every rank after MPI_Init, with its CUDA backend (real_cuda_backend_new; borrowed,
 * must outlive the communicator). Rank 0 makes the NCCL unique id and MPI broadcasts it; the
 * communicator is non-blocking, so that waiting for a collective can poll for NCCL's
 * asynchronous errors and give up after ZREAL_COMM_TIMEOUT_S seconds (default 300): the
 * communicator is then aborted and the GError names the rank and NCCL's reason. Every
 * collective waits, on the host, until it has finished, and the backend's stream is ordered
 * after it, so its results are ready for the next backend call. Host f64 collectives go over
 * MPI. When ranks on a node outnumber its GPUs, NCCL >= 2.30 is needed (it then gets
 * NCCL_MULTI_RANK_GPU_ENABLE=1 unless the environment sets it); older NCCL is refused with
 * one line saying so. The device memory NCCL takes at set-up is reported to the backend
 * (real_cuda_set_nccl_bytes). Pipeline sends copy their data into a buffer of the
 * communicator's own and go out on a stream of their own without the host waiting (receives
 * wait, as collectives do), so the two directions of a pipeline can cross; the GPU itself
 * then relies on NCCL completing a send before its receive is posted for messages within its
 * buffers (NCCL_BUFFSIZE), as for the activations of one micro-batch. No split: pipelines run
 * over NCCL with dp 1 and mp 1 (real_pipe). */
RealComm *real_comm_nccl_new(RealBackend *cuda_be, GError **error);

#endif
