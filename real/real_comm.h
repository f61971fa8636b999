/* real_comm: the collectives the ZeRO engine needs, as a table of function pointers, so MPI
 * (CPU ranks), NCCL (GPU ranks) or an emulated world can stand behind the same engine. */
#ifndef REAL_COMM_H
#define REAL_COMM_H

#include "real_backend.h"
#include "real_bf16.h"

#include <glib.h>
#include <stddef.h>

#define REAL_COMM_ERROR real_comm_error_quark()
GQuark real_comm_error_quark(void);

typedef enum {
    REAL_COMM_ERROR_FAILED,  /* the collective failed (a peer died, a count too large) */
    REAL_COMM_ERROR_TIMEOUT, /* it did not complete within ZREAL_COMM_TIMEOUT_S */
} RealCommError;

/* Seconds a collective may take before its rank gives up: ZREAL_COMM_TIMEOUT_S (MPI and
 * NCCL alike), REAL_COMM_DEFAULT_TIMEOUT_S when unset; fails naming the variable when it is
 * not a positive number. */
#define REAL_COMM_DEFAULT_TIMEOUT_S 300.0
gboolean real_comm_timeout_s(double *out, GError **error);

typedef struct RealComm RealComm;

/* The largest p2p tag every communicator accepts (MPI guarantees tags up to 32767). */
#define REAL_COMM_MAX_TAG 32767

/* Every collective is over all `size` ranks, called by all of them in the same order, on
 * buffers of the backend's memory. Sums of bf16 are taken in fp32 and rounded to bf16 (as
 * NCCL does for bf16). `sent_bytes` counts what this rank sends under ring algorithms:
 * 2(n-1)/n S for an all-reduce of S bytes, (n-1)/n S for reduce-scatter and all-gather,
 * the same formula the planner and simulator use, so the three can be compared. */
struct RealComm {
    int rank, size;
    double sent_bytes;

    /* buf[0..n) = sum over ranks of buf[0..n). */
    gboolean (*allreduce_bf16)(RealComm *c, RealBf16 *buf, size_t n, GError **error);
    /* In place: buf holds sum(counts) elements, rank q's piece after the pieces of ranks
     * < q; afterwards buf[0..counts[rank]) holds the sum of this rank's piece. */
    gboolean (*reduce_scatter_bf16)(RealComm *c, RealBf16 *buf, const int *counts,
                                    GError **error);
    /* recv[q*n .. (q+1)*n) = rank q's send[0..n); in place when send is recv + rank n. */
    gboolean (*allgather_bf16)(RealComm *c, const RealBf16 *send, size_t n, RealBf16 *recv,
                               GError **error);
    /* The same sums of fp32 elements (NULL where a communicator has none; zreal then refuses
     * fp32 reductions, Megatron's grad_reduce_in_fp32): sums exact in fp32 (no rounding to
     * bf16), sent_bytes counting 4 bytes an element. */
    gboolean (*allreduce_f32)(RealComm *c, float *buf, size_t n, GError **error);
    gboolean (*reduce_scatter_f32)(RealComm *c, float *buf, const int *counts, GError **error);
    /* Sums doubles on the host: metrics (loss, timings), not counted in sent_bytes. */
    gboolean (*allreduce_host_f64)(RealComm *c, double *buf, size_t n, GError **error);
    /* Gathers n doubles from every rank to rank 0's recv (size * n); host memory. */
    gboolean (*gather_host_f64)(RealComm *c, const double *send, size_t n, double *recv,
                                GError **error);
    /* ZeRO++ (NULL where a communicator has none; zreal then refuses qwZ and hpZ). In place:
     * buf holds size x n bytes, this rank's at rank x n; counts (size-1) n in sent_bytes,
     * the ring all-gather's (n-1)/n S. Host memory. */
    gboolean (*allgather_bytes)(RealComm *c, void *buf, size_t n, GError **error);
    /* qgZ (NULL where a communicator has none): send holds size x n bytes, the q-th n for
     * rank q; recv gets rank q's piece for this rank at q x n; counts (size-1) n in
     * sent_bytes, an all-to-all's (n-1)/n S. Host memory. */
    gboolean (*alltoall_bytes)(RealComm *c, const void *send, void *recv, size_t n,
                               GError **error);
    /* A mixture of experts' dispatch and combine over the expert-parallel group: one
     * all-to-all of equal pieces, as DeepSpeed's sharded_moe.py _AllToAll.forward runs
     * dist.all_to_all_single on the capacity-padded [E, capacity, h] buffer. send holds
     * size x n elements, the q-th n for rank q; recv (apart from send) gets rank q's piece for
     * this rank at q x n. Backend memory. Counts the ring formula's (n-1)/n S of the S = size
     * x n elements in sent_bytes (this rank's own piece stays), the schedule's count for an
     * all-to-all. */
    gboolean (*alltoall_bf16)(RealComm *c, const RealBf16 *send, RealBf16 *recv, size_t n,
                              GError **error);
    /* Pipeline point-to-point (NULL where a communicator has none; zreal then refuses --pp):
     * `bytes` of the backend's memory to or from rank `peer` of this communicator, matched
     * by `tag` (0 .. REAL_COMM_MAX_TAG). A send returns once `buf` may be reused: the
     * communicator keeps its own copy until the peer takes it, so a send never waits for its
     * receive (a pipeline's two directions cross: stage s sends micro-batch i + 1 forward
     * while stage s + 1 sends micro-batch i back). It counts `bytes` in sent_bytes. A receive
     * returns once the data is in `buf`, or fails after ZREAL_COMM_TIMEOUT_S. */
    gboolean (*send)(RealComm *c, const void *buf, size_t bytes, int peer, int tag,
                     GError **error);
    gboolean (*recv)(RealComm *c, void *buf, size_t bytes, int peer, int tag, GError **error);
    /* A communicator of the ranks with the same `color`, ordered by `key` (MPI_Comm_split);
     * collective over this one; the caller destroys it. */
    RealComm *(*split)(RealComm *c, int color, int key, GError **error);
    void (*destroy)(RealComm *c);
};

/* Bytes one rank sends under ring algorithms, for collectives over `size` ranks of `total`
 * bf16 elements (the whole buffer: an all-reduce's, a reduce-scatter's input, an
 * all-gather's output). The schedule's formula, evaluated in the same order so the sums
 * compare exactly; every communicator counts with these. */
static inline double real_comm_ring_allreduce_bytes(int size, double total)
{
    return 2.0 * (size - 1) / size * (total * sizeof(RealBf16));
}
static inline double real_comm_ring_scatter_gather_bytes(int size, double total)
{
    return (double)(size - 1) / size * (total * sizeof(RealBf16));
}
/* The same of fp32 elements. */
static inline double real_comm_ring_allreduce_f32_bytes(int size, double total)
{
    return 2.0 * (size - 1) / size * (total * sizeof(float));
}
static inline double real_comm_ring_scatter_f32_bytes(int size, double total)
{
    return (double)(size - 1) / size * (total * sizeof(float));
}

/* MPI_COMM_WORLD after MPI_Init: errors are returned (not fatal) and turned into GErrors
 * that say a peer may have died. Every collective is started non-blocking and waited for
 * at most ZREAL_COMM_TIMEOUT_S seconds: a stopped or hung peer then fails the collective
 * with REAL_COMM_ERROR_TIMEOUT naming it, and zreal aborts the job. */
RealComm *real_comm_mpi_new(GError **error);

/* Copies `bytes` of host memory from rank `root` to every rank of a communicator from
 * real_comm_mpi_new (how the NCCL communicator shares its unique id). Not counted in
 * sent_bytes. */
gboolean real_comm_mpi_broadcast(RealComm *mpi, void *buf, size_t bytes, int root,
                                 GError **error);

/* One process playing rank `rank` of a virtual world of `world` ranks (1 <= world, 0 <= rank
 * < world): every collective is replaced by local copies on backend `be` (borrowed) of the
 * sizes the real one would deliver, and sent_bytes counts what the real one would send, so
 * the engine allocates, moves and measures exactly what that rank would. The other ranks
 * are stand-ins holding what this one holds: sums are `world` times this rank's values and
 * all-gathers repeat this rank's piece. At stage 0 that is N identical replicas and training
 * is exact for them; at stages 1-3 the gathered partitions of other ranks are stand-ins, so
 * the run measures memory, bytes and time, not learning. */
RealComm *real_comm_emulated_new(RealBackend *be, int world, int rank);

#endif
