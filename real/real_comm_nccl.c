/* real_comm_nccl: RealComm over NCCL for GPU ranks; bf16 sums on a communication stream that
 * waits for the backend's stream and is waited for by it, host metrics over MPI. */
#include "real_comm_nccl.h"
#include "real_cuda.h"
#include "real_watch.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_COMM_DEFAULT_TIMEOUT_S 300.0
/* ncclGetVersion's code for 2.30.0, the first NCCL that lets two ranks share one GPU
 * (NCCL_MULTI_RANK_GPU_ENABLE); 2.5 to 2.29 refuse with "Duplicate GPU detected". */
#define NCCL_COMM_MULTI_RANK_GPU_VERSION 23000

typedef struct {
    RealComm base;     /* first, so the interface pointer converts back */
    RealComm *host;    /* MPI_COMM_WORLD: the unique id, host f64 collectives */
    RealBackend *be;   /* the CUDA backend whose buffers are reduced */
    cudaStream_t compute, stream;
    cudaEvent_t ready, done; /* compute reached the collective; the collective finished */
    cudaStream_t sends;      /* pipeline sends, apart from the receives on `stream` */
    GArray *pending;         /* PendingSend: sends not yet finished */
    ncclComm_t nccl;   /* NULL once aborted */
    double timeout_s;
} NcclComm;

/* A pipeline send from the communicator's own copy of its data (cudaMalloc'd, outside the
 * backend's tracker, as NCCL's own buffers are), freed once `done` has passed. */
typedef struct {
    void *copy;
    cudaEvent_t done;
} PendingSend;

static NcclComm *nccl_of(RealComm *c)
{
    return (NcclComm *)c;
}

static gboolean nccl_fail(NcclComm *n, GError **error, const char *format, ...) G_GNUC_PRINTF(3, 4);
static gboolean nccl_fail(NcclComm *n, GError **error, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    char *message = g_strdup_vprintf(format, args);
    va_end(args);
    g_set_error(error, REAL_COMM_ERROR, 0, "rank %d: %s", n->base.rank, message);
    g_free(message);
    return FALSE;
}

static gboolean nccl_cuda_ok(NcclComm *n, cudaError_t rc, const char *what, GError **error)
{
    if (rc == cudaSuccess)
        return TRUE;
    return nccl_fail(n, error, "%s failed: %s", what, cudaGetErrorString(rc));
}

/* Aborts the communicator (stopping its kernels, so no rank waits forever) and reports why. */
static gboolean nccl_abort(NcclComm *n, const char *what, ncclResult_t result, GError **error)
{
    const char *detail = n->nccl ? ncclGetLastError(n->nccl) : NULL;
    nccl_fail(n, error, "%s failed: NCCL error %d, %s%s%s", what, (int)result,
              ncclGetErrorString(result), detail && *detail ? ": " : "", detail ? detail : "");
    if (n->nccl)
        ncclCommAbort(n->nccl);
    n->nccl = NULL;
    return FALSE;
}

static gboolean nccl_timed_out(NcclComm *n, const char *what, GError **error)
{
    /* The peer the watchdog's heartbeats find silent for half the deadline, when one is. */
    char *silent = real_watch_silent_ranks(MAX(n->timeout_s, REAL_WATCH_MIN_SILENCE_S) / 2);
    nccl_fail(n, error, "%s did not finish within %g s (ZREAL_COMM_TIMEOUT_S); %s%s", what,
              n->timeout_s, silent ? silent : "a peer rank may have died or stopped",
              silent ? " stopped answering (no heartbeat for half of it)" : "");
    g_free(silent);
    if (n->nccl)
        ncclCommAbort(n->nccl);
    n->nccl = NULL;
    return FALSE;
}

static gint64 nccl_deadline_us(const NcclComm *n)
{
    return g_get_monotonic_time() + (gint64)(n->timeout_s * 1e6);
}

/* NCCL's asynchronous state: TRUE while nothing failed (*in_progress: a non-blocking call is
 * still running), else the communicator is aborted with the reason. */
static gboolean nccl_poll(NcclComm *n, const char *what, gboolean *in_progress, GError **error)
{
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(n->nccl, &state);
    if (rc != ncclSuccess)
        return nccl_abort(n, what, rc, error);
    if (state != ncclSuccess && state != ncclInProgress)
        return nccl_abort(n, what, state, error);
    *in_progress = state == ncclInProgress;
    return TRUE;
}

/* A non-blocking NCCL call returned `rc`: done, failed, or still running (ncclInProgress),
 * in which case no other call may be made on the communicator until it is done. */
static gboolean nccl_issued(NcclComm *n, ncclResult_t rc, const char *what, GError **error)
{
    if (rc == ncclSuccess)
        return TRUE;
    if (rc != ncclInProgress)
        return nccl_abort(n, what, rc, error);
    const gint64 deadline = nccl_deadline_us(n);
    for (;;) {
        gboolean in_progress = FALSE;
        if (!nccl_poll(n, what, &in_progress, error))
            return FALSE;
        if (!in_progress)
            return TRUE;
        if (g_get_monotonic_time() > deadline)
            return nccl_timed_out(n, what, error);
        sched_yield();
    }
}

/* Orders the communication stream after everything issued on the backend's stream so far. */
static gboolean nccl_begin(NcclComm *n, const char *what, GError **error)
{
    if (!n->nccl)
        return nccl_fail(n, error, "%s: the NCCL communicator was aborted after an earlier error",
                         what);
    return nccl_cuda_ok(n, cudaEventRecord(n->ready, n->compute), "cudaEventRecord", error) &&
           nccl_cuda_ok(n, cudaStreamWaitEvent(n->stream, n->ready, 0), "cudaStreamWaitEvent",
                        error);
}

/* Waits on the host until the collective has finished, polling NCCL for asynchronous errors
 * and the timeout, then orders the backend's stream after it (so, for instance, the
 * optimizer's output is in place before the parameter all-gather reads it, and the gathered
 * parameters before the forward uses them). */
static gboolean nccl_finish(NcclComm *n, const char *what, GError **error)
{
    if (!nccl_cuda_ok(n, cudaEventRecord(n->done, n->stream), "cudaEventRecord", error))
        return FALSE;
    const gint64 deadline = nccl_deadline_us(n);
    for (;;) {
        const cudaError_t rc = cudaEventQuery(n->done);
        if (rc == cudaSuccess)
            break;
        if (rc != cudaErrorNotReady)
            return nccl_cuda_ok(n, rc, what, error);
        gboolean in_progress = FALSE;
        if (!nccl_poll(n, what, &in_progress, error))
            return FALSE;
        if (g_get_monotonic_time() > deadline)
            return nccl_timed_out(n, what, error);
        sched_yield();
    }
    return nccl_cuda_ok(n, cudaStreamWaitEvent(n->compute, n->done, 0), "cudaStreamWaitEvent",
                        error);
}

/* ---- collectives ---- */

static gboolean nccl_allreduce(RealComm *c, RealBf16 *buf, size_t n, GError **error)
{
    NcclComm *nc = nccl_of(c);
    c->sent_bytes += real_comm_ring_allreduce_bytes(c->size, (double)n);
    if (n == 0)
        return TRUE;
    return nccl_begin(nc, "ncclAllReduce", error) &&
           nccl_issued(nc, ncclAllReduce(buf, buf, n, ncclBfloat16, ncclSum, nc->nccl, nc->stream),
                       "ncclAllReduce", error) &&
           nccl_finish(nc, "ncclAllReduce", error);
}

/* The contract's in-place form: buf holds every rank's piece in rank order, and this rank's
 * sum ends at buf[0]. Equal pieces: ncclReduceScatter in NCCL's in-place form (each rank's
 * result at its own piece, buf + rank * count), then moved to the front. Unequal pieces
 * (some possibly empty): one in-place ncclReduce per non-empty piece, rooted at its owner,
 * in one group; then the same move. */
static gboolean nccl_reduce_scatter(RealComm *c, RealBf16 *buf, const int *counts, GError **error)
{
    NcclComm *nc = nccl_of(c);
    double total = 0;
    gboolean equal = TRUE;
    size_t mine_offset = 0;
    for (int q = 0; q < c->size; q++) {
        total += counts[q];
        equal = equal && counts[q] == counts[0];
        if (q < c->rank)
            mine_offset += (size_t)counts[q];
    }
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, total);
    if (total == 0)
        return TRUE;
    const char *what = equal ? "ncclReduceScatter" : "ncclReduce (grouped)";
    if (!nccl_begin(nc, what, error))
        return FALSE;
    ncclResult_t rc;
    if (equal) {
        rc = ncclReduceScatter(buf, buf + mine_offset, (size_t)counts[0], ncclBfloat16, ncclSum,
                               nc->nccl, nc->stream);
    } else {
        rc = ncclGroupStart();
        size_t offset = 0;
        for (int q = 0; rc == ncclSuccess && q < c->size; q++) {
            if (counts[q] > 0)
                rc = ncclReduce(buf + offset, buf + offset, (size_t)counts[q], ncclBfloat16,
                                ncclSum, q, nc->nccl, nc->stream);
            offset += (size_t)counts[q];
        }
        const ncclResult_t end = ncclGroupEnd(); /* a group is always closed */
        rc = rc != ncclSuccess ? rc : end;
    }
    if (!nccl_issued(nc, rc, what, error) || !nccl_finish(nc, what, error))
        return FALSE;
    /* The backend's copy allows overlap ([offset, offset + n) and [0, n) may overlap) and
     * runs on its stream, after the collective. */
    if (mine_offset > 0 && counts[c->rank] > 0)
        nc->be->copy(nc->be, buf, buf + mine_offset, (size_t)counts[c->rank] * sizeof(RealBf16));
    return TRUE;
}

/* ncclAllGather is in place only when send == recv + rank n; a send range that overlaps recv
 * any other way is staged through scratch first. */
static gboolean nccl_allgather(RealComm *c, const RealBf16 *send, size_t n, RealBf16 *recv,
                               GError **error)
{
    NcclComm *nc = nccl_of(c);
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, (double)n * c->size);
    if (n == 0)
        return TRUE;
    const size_t bytes = n * sizeof(RealBf16);
    const uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    const gboolean in_place = send == recv + (size_t)c->rank * n;
    const gboolean overlaps = s < r + (size_t)c->size * bytes && r < s + bytes;
    RealBf16 *staged = NULL;
    if (overlaps && !in_place) {
        staged = nc->be->alloc(nc->be, bytes, REAL_MEM_WORKSPACE);
        if (!staged)
            return nccl_fail(nc, error, "out of device memory staging an all-gather of %zu bytes",
                             bytes);
        nc->be->copy(nc->be, staged, send, bytes);
        send = staged;
    }
    const gboolean ok =
        nccl_begin(nc, "ncclAllGather", error) &&
        nccl_issued(nc, ncclAllGather(send, recv, n, ncclBfloat16, nc->nccl, nc->stream),
                    "ncclAllGather", error) &&
        nccl_finish(nc, "ncclAllGather", error);
    nc->be->free(nc->be, staged); /* on the backend's stream, after the collective */
    return ok;
}

/* NCCL has no all-to-all call: its own tests and PyTorch's ProcessGroupNCCL alltoall_base
 * (torch/csrc/cuda/nccl.cpp all2all_single_equal_split) post one ncclSend and one ncclRecv
 * per peer inside a group, this rank's own piece included. */
static gboolean nccl_alltoall(RealComm *c, const RealBf16 *send, RealBf16 *recv, size_t n,
                              GError **error)
{
    NcclComm *nc = nccl_of(c);
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, (double)n * c->size);
    if (n == 0)
        return TRUE;
    if (!nccl_begin(nc, "ncclSend/ncclRecv (all-to-all)", error))
        return FALSE;
    ncclResult_t rc = ncclGroupStart();
    for (int q = 0; rc == ncclSuccess && q < c->size; q++) {
        rc = ncclSend(send + (size_t)q * n, n, ncclBfloat16, q, nc->nccl, nc->stream);
        if (rc == ncclSuccess)
            rc = ncclRecv(recv + (size_t)q * n, n, ncclBfloat16, q, nc->nccl, nc->stream);
    }
    const ncclResult_t end = ncclGroupEnd(); /* a group is always closed */
    rc = rc != ncclSuccess ? rc : end;
    return nccl_issued(nc, rc, "ncclSend/ncclRecv (all-to-all)", error) &&
           nccl_finish(nc, "ncclSend/ncclRecv (all-to-all)", error);
}

static gboolean nccl_allreduce_host(RealComm *c, double *buf, size_t n, GError **error)
{
    RealComm *host = nccl_of(c)->host;
    return host->allreduce_host_f64(host, buf, n, error);
}

static gboolean nccl_gather_host(RealComm *c, const double *send, size_t n, double *recv,
                                 GError **error)
{
    RealComm *host = nccl_of(c)->host;
    return host->gather_host_f64(host, send, n, recv, error);
}

/* ---- pipeline point-to-point ---- */

/* Frees the copies of the finished sends; with `all`, waits for every one first. */
static gboolean nccl_reap_sends(NcclComm *n, gboolean all, GError **error)
{
    for (guint i = 0; i < n->pending->len;) {
        PendingSend *p = &g_array_index(n->pending, PendingSend, i);
        const cudaError_t rc = all ? cudaEventSynchronize(p->done) : cudaEventQuery(p->done);
        if (rc == cudaErrorNotReady) {
            i++;
            continue;
        }
        if (!nccl_cuda_ok(n, rc, "ncclSend", error))
            return FALSE;
        cudaEventDestroy(p->done);
        cudaFree(p->copy);
        g_array_remove_index_fast(n->pending, i);
    }
    return TRUE;
}

/* The data is copied on the backend's stream (so later kernels may overwrite `buf`), then sent
 * on a stream of its own; the host does not wait. NCCL has no tags: the n-th send to a peer
 * matches that peer's n-th receive from this rank, which is the schedule's order. */
static gboolean nccl_send(RealComm *c, const void *buf, size_t bytes, int peer, int tag,
                          GError **error)
{
    (void)tag;
    NcclComm *nc = nccl_of(c);
    if (!nc->nccl)
        return nccl_fail(nc, error, "ncclSend: the NCCL communicator was aborted after an "
                                    "earlier error");
    PendingSend p = {NULL, NULL};
    gboolean ok = nccl_reap_sends(nc, FALSE, error) &&
                  nccl_cuda_ok(nc, cudaMalloc(&p.copy, MAX(bytes, 1)), "cudaMalloc", error) &&
                  nccl_cuda_ok(nc, cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming),
                               "cudaEventCreateWithFlags", error) &&
                  nccl_cuda_ok(nc, cudaMemcpyAsync(p.copy, buf, bytes, cudaMemcpyDeviceToDevice,
                                                   nc->compute), "cudaMemcpyAsync", error) &&
                  nccl_cuda_ok(nc, cudaEventRecord(nc->ready, nc->compute), "cudaEventRecord",
                               error) &&
                  nccl_cuda_ok(nc, cudaStreamWaitEvent(nc->sends, nc->ready, 0),
                               "cudaStreamWaitEvent", error) &&
                  nccl_issued(nc, ncclSend(p.copy, bytes, ncclUint8, peer, nc->nccl, nc->sends),
                              "ncclSend", error) &&
                  nccl_cuda_ok(nc, cudaEventRecord(p.done, nc->sends), "cudaEventRecord", error);
    if (!ok) {
        if (p.done)
            cudaEventDestroy(p.done);
        cudaFree(p.copy);
        return FALSE;
    }
    g_array_append_val(nc->pending, p);
    c->sent_bytes += (double)bytes;
    return TRUE;
}

static gboolean nccl_recv(RealComm *c, void *buf, size_t bytes, int peer, int tag,
                          GError **error)
{
    (void)tag;
    NcclComm *nc = nccl_of(c);
    return nccl_reap_sends(nc, FALSE, error) && nccl_begin(nc, "ncclRecv", error) &&
           nccl_issued(nc, ncclRecv(buf, bytes, ncclUint8, peer, nc->nccl, nc->stream),
                       "ncclRecv", error) &&
           nccl_finish(nc, "ncclRecv", error);
}

/* ---- life cycle ---- */

static void nccl_destroy(RealComm *c)
{
    NcclComm *nc = nccl_of(c);
    GError *unsent = NULL;
    if (nc->pending && !nccl_reap_sends(nc, TRUE, &unsent))
        g_clear_error(&unsent);
    for (guint i = 0; nc->pending && i < nc->pending->len; i++) {
        cudaEventDestroy(g_array_index(nc->pending, PendingSend, i).done);
        cudaFree(g_array_index(nc->pending, PendingSend, i).copy);
    }
    if (nc->pending)
        g_array_free(nc->pending, TRUE);
    if (nc->nccl) {
        /* Finalize flushes outstanding work (non-blocking: in progress until done); a
         * communicator that does not finish in time is aborted instead. */
        GError *ignored = NULL;
        if (nccl_issued(nc, ncclCommFinalize(nc->nccl), "ncclCommFinalize", &ignored))
            ncclCommDestroy(nc->nccl);
        g_clear_error(&ignored);
    }
    if (nc->ready)
        cudaEventDestroy(nc->ready);
    if (nc->done)
        cudaEventDestroy(nc->done);
    if (nc->stream)
        cudaStreamDestroy(nc->stream);
    if (nc->sends)
        cudaStreamDestroy(nc->sends);
    nc->host->destroy(nc->host);
    g_free(nc);
}

/* ZREAL_COMM_TIMEOUT_S, a positive number of seconds; the default when unset. */
static gboolean nccl_read_timeout(NcclComm *nc, GError **error)
{
    const char *text = g_getenv("ZREAL_COMM_TIMEOUT_S");
    nc->timeout_s = NCCL_COMM_DEFAULT_TIMEOUT_S;
    if (!text)
        return TRUE;
    char *end = NULL;
    const double value = g_ascii_strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(value) || value <= 0)
        return nccl_fail(nc, error, "ZREAL_COMM_TIMEOUT_S: '%s' is not a positive number of "
                                    "seconds", text);
    nc->timeout_s = value;
    return TRUE;
}

/* Ranks on this node (Open MPI tells each process) against its GPUs: sharing a GPU needs
 * NCCL >= 2.30, which does it when NCCL_MULTI_RANK_GPU_ENABLE=1. */
static gboolean nccl_check_sharing(NcclComm *nc, GError **error)
{
    int version = 0, devices = 0;
    const ncclResult_t rc = ncclGetVersion(&version);
    if (rc != ncclSuccess)
        return nccl_abort(nc, "ncclGetVersion", rc, error);
    if (!nccl_cuda_ok(nc, cudaGetDeviceCount(&devices), "cudaGetDeviceCount", error))
        return FALSE;
    const char *local = g_getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int local_ranks = local ? atoi(local) : 1;
    if (local_ranks <= devices)
        return TRUE;
    if (version < NCCL_COMM_MULTI_RANK_GPU_VERSION)
        return nccl_fail(nc, error, "%d ranks on this node share %d GPU%s, but NCCL %d.%d.%d "
                                    "allows one rank per GPU (two per GPU needs NCCL >= 2.30 "
                                    "with NCCL_MULTI_RANK_GPU_ENABLE=1)",
                         local_ranks, devices, devices == 1 ? "" : "s", version / 10000,
                         version / 100 % 100, version % 100);
    g_setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", FALSE);
    return TRUE;
}

/* The id, the stream and events, then the communicator, measuring what NCCL's set-up takes
 * (connections NCCL makes lazily at the first collective are not in that figure). */
static gboolean nccl_setup(NcclComm *nc, GError **error)
{
    RealComm *c = &nc->base;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (!nccl_cuda_ok(nc, cudaSetDevice(real_cuda_device(nc->be)), "cudaSetDevice", error))
        return FALSE;
    if (c->rank == 0) {
        const ncclResult_t rc = ncclGetUniqueId(&id);
        if (rc != ncclSuccess)
            return nccl_abort(nc, "ncclGetUniqueId", rc, error);
    }
    if (!real_comm_mpi_broadcast(nc->host, &id, sizeof id, 0, error) ||
        !nccl_cuda_ok(nc, cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags", error) ||
        !nccl_cuda_ok(nc, cudaStreamCreateWithFlags(&nc->sends, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags", error) ||
        !nccl_cuda_ok(nc, cudaEventCreateWithFlags(&nc->ready, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags", error) ||
        !nccl_cuda_ok(nc, cudaEventCreateWithFlags(&nc->done, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags", error))
        return FALSE;
    size_t free_before = 0, free_after = 0, total = 0;
    if (!nccl_cuda_ok(nc, cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo", error))
        return FALSE;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (!nccl_issued(nc, ncclCommInitRankConfig(&nc->nccl, c->size, id, c->rank, &config),
                     "ncclCommInitRankConfig", error) ||
        !nccl_cuda_ok(nc, cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo", error))
        return FALSE;
    real_cuda_set_nccl_bytes(nc->be, free_before > free_after ? free_before - free_after : 0);
    return TRUE;
}

RealComm *real_comm_nccl_new(RealBackend *cuda_be, GError **error)
{
    RealComm *host = real_comm_mpi_new(error);
    if (!host)
        return NULL;
    NcclComm *nc = g_new0(NcclComm, 1);
    RealComm *c = &nc->base;
    nc->host = host;
    nc->be = cuda_be;
    nc->compute = real_cuda_stream(cuda_be);
    c->rank = host->rank;
    c->size = host->size;
    c->allreduce_bf16 = nccl_allreduce;
    c->reduce_scatter_bf16 = nccl_reduce_scatter;
    c->allgather_bf16 = nccl_allgather;
    c->alltoall_bf16 = nccl_alltoall;
    c->allreduce_host_f64 = nccl_allreduce_host;
    c->gather_host_f64 = nccl_gather_host;
    c->send = nccl_send;
    c->recv = nccl_recv;
    c->destroy = nccl_destroy;
    nc->pending = g_array_new(FALSE, FALSE, sizeof(PendingSend));
    if (!nccl_read_timeout(nc, error) || !nccl_check_sharing(nc, error) ||
        !nccl_setup(nc, error)) {
        nccl_destroy(c);
        return NULL;
    }
    return c;
}
