/* real_comm_mpi: RealComm over MPI_COMM_WORLD, with a user-defined bf16 sum so gradients
 * travel in their 16-bit storage format, as they do under NCCL; every collective is
 * non-blocking and waited for with a deadline, so a stopped peer cannot hang the job. */
#include "real_comm.h"
#include "real_watch.h"
#include "zp_util.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>

G_DEFINE_QUARK(real-comm-error-quark, real_comm_error)

/* A wait polls MPI_Test (Open MPI progresses non-blocking collectives only inside MPI calls)
 * without pause for WAIT_SPIN_S, as a blocking collective would spin, then every
 * WAIT_SLEEP_US: only a stalled peer makes a wait that long, and it should not burn a core. */
#define WAIT_SPIN_S 1.0
#define WAIT_SLEEP_US 1000

typedef struct {
    RealComm base;
    MPI_Datatype bf16;
    MPI_Op bf16_sum;
    double timeout_s; /* ZREAL_COMM_TIMEOUT_S */
    MPI_Comm comm;    /* MPI_COMM_WORLD, or a split of it */
    GArray *sends;    /* PendingSend: p2p sends not yet taken by their peers */
} MpiComm;

/* A p2p send in flight from the communicator's own copy of its data. */
typedef struct {
    MPI_Request request;
    void *copy;
} PendingSend;

/* MPI reduction callback: inout[i] = round(widen(in[i]) + widen(inout[i])). */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const RealBf16 *a = in;
    RealBf16 *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = real_bf16_from_f32(real_bf16_to_f32(a[i]) + real_bf16_to_f32(b[i]));
}

static gboolean check(RealComm *c, int rc, const char *what, GError **error)
{
    if (rc == MPI_SUCCESS)
        return TRUE;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    g_set_error(error, REAL_COMM_ERROR, 0, "rank %d: %s failed: %s (a peer rank may have died)",
                c->rank, what, text);
    return FALSE;
}

/* A collective past its deadline: which peer stopped, where the watchdog's heartbeats tell
 * (silent for half the deadline: a live rank beats every fraction of a second). */
static void timed_out(const char *what, double timeout_s, GError **error)
{
    char *silent = real_watch_silent_ranks(MAX(timeout_s, REAL_WATCH_MIN_SILENCE_S) / 2);
    if (silent)
        g_set_error(error, REAL_COMM_ERROR, REAL_COMM_ERROR_TIMEOUT,
                    "%s did not complete within %g s (ZREAL_COMM_TIMEOUT_S): %s stopped "
                    "answering (no heartbeat for half of it); aborting the job", what, timeout_s,
                    silent);
    else
        g_set_error(error, REAL_COMM_ERROR, REAL_COMM_ERROR_TIMEOUT,
                    "%s did not complete within %g s (ZREAL_COMM_TIMEOUT_S): a peer rank is "
                    "stopped, hung or dead; aborting the job", what, timeout_s);
    g_free(silent);
}

/* Waits for the request a non-blocking collective `what` started (rc: its start's code)
 * until the deadline; a collective that outlives it fails with REAL_COMM_ERROR_TIMEOUT, and
 * the caller aborts the job (its peers are then still inside the collective). */
static gboolean wait_for(RealComm *c, int rc, MPI_Request *request, const char *what,
                         GError **error)
{
    if (!check(c, rc, what, error))
        return FALSE;
    const double timeout_s = ((MpiComm *)c)->timeout_s, deadline = zp_now_s() + timeout_s;
    for (;;) {
        int done = 0;
        if (!check(c, MPI_Test(request, &done, MPI_STATUS_IGNORE), what, error))
            return FALSE;
        if (done)
            return TRUE;
        if (zp_now_s() > deadline) {
            timed_out(what, timeout_s, error);
            return FALSE;
        }
        /* Ranks may share cores: yield to the one we wait for. */
        if (zp_now_s() - (deadline - timeout_s) < WAIT_SPIN_S)
            sched_yield();
        else
            g_usleep(WAIT_SLEEP_US);
    }
}

static gboolean fits_int(RealComm *c, size_t n, const char *what, GError **error)
{
    if (n <= INT_MAX)
        return TRUE;
    g_set_error(error, REAL_COMM_ERROR, 0, "rank %d: %s of %zu elements exceeds MPI's int count",
                c->rank, what, n);
    return FALSE;
}

static gboolean mpi_allreduce(RealComm *c, RealBf16 *buf, size_t n, GError **error)
{
    MpiComm *m = (MpiComm *)c;
    if (!fits_int(c, n, "all-reduce", error))
        return FALSE;
    c->sent_bytes += real_comm_ring_allreduce_bytes(c->size, (double)n);
    MPI_Request r;
    return wait_for(c, MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, m->bf16, m->bf16_sum,
                                      ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Allreduce", error);
}

static gboolean mpi_reduce_scatter(RealComm *c, RealBf16 *buf, const int *counts, GError **error)
{
    MpiComm *m = (MpiComm *)c;
    double total = 0;
    for (int q = 0; q < c->size; q++)
        total += counts[q];
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, total);
    MPI_Request r;
    return wait_for(c, MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, m->bf16, m->bf16_sum,
                                           ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Reduce_scatter", error);
}

static gboolean mpi_allreduce_f32(RealComm *c, float *buf, size_t n, GError **error)
{
    if (!fits_int(c, n, "all-reduce", error))
        return FALSE;
    c->sent_bytes += real_comm_ring_allreduce_f32_bytes(c->size, (double)n);
    MPI_Request r;
    return wait_for(c, MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM,
                                      ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Allreduce", error);
}

static gboolean mpi_reduce_scatter_f32(RealComm *c, float *buf, const int *counts,
                                       GError **error)
{
    double total = 0;
    for (int q = 0; q < c->size; q++)
        total += counts[q];
    c->sent_bytes += real_comm_ring_scatter_f32_bytes(c->size, total);
    MPI_Request r;
    return wait_for(c, MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM,
                                           ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Reduce_scatter", error);
}

static gboolean mpi_allgather(RealComm *c, const RealBf16 *send, size_t n, RealBf16 *recv,
                              GError **error)
{
    MpiComm *m = (MpiComm *)c;
    if (!fits_int(c, n, "all-gather", error))
        return FALSE;
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, (double)n * c->size);
    MPI_Request r;
    /* This rank's piece already in its slot: MPI's in-place form (MPI forbids aliasing). */
    const void *from = send == recv + (size_t)c->rank * n ? MPI_IN_PLACE : (const void *)send;
    return wait_for(c, MPI_Iallgather(from, (int)n, m->bf16, recv, (int)n, m->bf16,
                                      ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Allgather", error);
}

static gboolean mpi_allreduce_host(RealComm *c, double *buf, size_t n, GError **error)
{
    MPI_Request r;
    return fits_int(c, n, "host all-reduce", error) &&
           wait_for(c, MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM,
                                      ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Allreduce (host)", error);
}

static gboolean mpi_gather_host(RealComm *c, const double *send, size_t n, double *recv,
                                GError **error)
{
    MPI_Request r;
    return fits_int(c, n, "host gather", error) &&
           wait_for(c, MPI_Igather(send, (int)n, MPI_DOUBLE, recv, (int)n, MPI_DOUBLE, 0,
                                   ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Gather", error);
}

gboolean real_comm_mpi_broadcast(RealComm *c, void *buf, size_t bytes, int root, GError **error)
{
    if (!fits_int(c, bytes, "broadcast", error))
        return FALSE;
    MPI_Request r;
    return wait_for(c, MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &r), &r,
                    "MPI_Bcast", error);
}

/* In place: buf holds size x n bytes, this rank's at rank x n (qwZ's int8 and scales). */
static gboolean mpi_allgather_bytes(RealComm *c, void *buf, size_t n, GError **error)
{
    if (!fits_int(c, n, "byte all-gather", error))
        return FALSE;
    c->sent_bytes += (double)(c->size - 1) * (double)n;
    MPI_Request r;
    return wait_for(c, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n, MPI_BYTE,
                                      ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Allgather (bytes)", error);
}

static gboolean mpi_alltoall_bytes(RealComm *c, const void *send, void *recv, size_t n,
                                   GError **error)
{
    if (!fits_int(c, n, "byte all-to-all", error))
        return FALSE;
    c->sent_bytes += (double)(c->size - 1) * (double)n;
    MPI_Request r;
    return wait_for(c, MPI_Ialltoall(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE,
                                     ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Alltoall (bytes)", error);
}

static gboolean mpi_alltoall_bf16(RealComm *c, const RealBf16 *send, RealBf16 *recv, size_t n,
                                  GError **error)
{
    MpiComm *m = (MpiComm *)c;
    if (!fits_int(c, n, "all-to-all", error))
        return FALSE;
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, (double)n * c->size);
    MPI_Request r;
    return wait_for(c, MPI_Ialltoall(send, (int)n, m->bf16, recv, (int)n, m->bf16, m->comm, &r),
                    &r, "MPI_Alltoall", error);
}

/* Frees the copies of the sends their peers have taken; with `all`, waits for every one. */
static gboolean reap_sends(RealComm *c, gboolean all, GError **error)
{
    GArray *sends = ((MpiComm *)c)->sends;
    for (guint i = 0; i < sends->len;) {
        PendingSend *p = &g_array_index(sends, PendingSend, i);
        int done = 0;
        if (all) {
            if (!wait_for(c, MPI_SUCCESS, &p->request, "MPI_Isend (pipeline)", error))
                return FALSE;
            done = 1;
        } else if (!check(c, MPI_Test(&p->request, &done, MPI_STATUS_IGNORE), "MPI_Isend "
                          "(pipeline)", error)) {
            return FALSE;
        }
        if (!done) {
            i++;
            continue;
        }
        g_free(p->copy);
        g_array_remove_index_fast(sends, i);
    }
    return TRUE;
}

static gboolean p2p_args(RealComm *c, size_t bytes, int peer, int tag, const char *what,
                         GError **error)
{
    if (!fits_int(c, bytes, what, error))
        return FALSE;
    if (peer >= 0 && peer < c->size && peer != c->rank && tag >= 0 && tag <= REAL_COMM_MAX_TAG)
        return TRUE;
    g_set_error(error, REAL_COMM_ERROR, 0, "rank %d: %s to or from rank %d of %d with tag %d",
                c->rank, what, peer, c->size, tag);
    return FALSE;
}

/* Buffered: MPI_Isend from a copy (host memory: the CPU backend's), freed once taken. */
static gboolean mpi_send(RealComm *c, const void *buf, size_t bytes, int peer, int tag,
                         GError **error)
{
    MpiComm *m = (MpiComm *)c;
    if (!p2p_args(c, bytes, peer, tag, "pipeline send", error) || !reap_sends(c, FALSE, error))
        return FALSE;
    PendingSend p = {MPI_REQUEST_NULL, g_memdup2(buf, bytes)};
    if (!check(c, MPI_Isend(p.copy, (int)bytes, MPI_BYTE, peer, tag, m->comm, &p.request),
               "MPI_Isend (pipeline)", error)) {
        g_free(p.copy);
        return FALSE;
    }
    g_array_append_val(m->sends, p);
    c->sent_bytes += (double)bytes;
    return TRUE;
}

static gboolean mpi_recv(RealComm *c, void *buf, size_t bytes, int peer, int tag, GError **error)
{
    MPI_Request r;
    return p2p_args(c, bytes, peer, tag, "pipeline receive", error) &&
           reap_sends(c, FALSE, error) &&
           wait_for(c, MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, ((MpiComm *)c)->comm, &r),
                    &r, "MPI_Recv (pipeline)", error);
}

static void mpi_destroy(RealComm *c)
{
    MpiComm *m = (MpiComm *)c;
    /* Every send of a finished step has been received; after a failure the job aborts. */
    GError *error = NULL;
    if (!reap_sends(c, TRUE, &error))
        g_clear_error(&error);
    for (guint i = 0; i < m->sends->len; i++)
        g_free(g_array_index(m->sends, PendingSend, i).copy);
    g_array_free(m->sends, TRUE);
    MPI_Op_free(&m->bf16_sum);
    MPI_Type_free(&m->bf16);
    if (m->comm != MPI_COMM_WORLD)
        MPI_Comm_free(&m->comm);
    g_free(m);
}

static RealComm *mpi_split(RealComm *c, int color, int key, GError **error);

gboolean real_comm_timeout_s(double *out, GError **error)
{
    const char *text = g_getenv("ZREAL_COMM_TIMEOUT_S");
    *out = REAL_COMM_DEFAULT_TIMEOUT_S;
    return !text || zp_parse_number(text, "ZREAL_COMM_TIMEOUT_S", 1e-3, 1e9, FALSE, out, error);
}

/* A communicator over `comm` (taken: freed with it unless it is MPI_COMM_WORLD). */
static RealComm *mpi_comm_new(MPI_Comm comm, GError **error)
{
    MpiComm *m = g_new0(MpiComm, 1);
    RealComm *c = &m->base;
    m->bf16 = MPI_DATATYPE_NULL;
    m->comm = comm;
    if (!real_comm_timeout_s(&m->timeout_s, error)) {
        g_free(m);
        return NULL;
    }
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    /* Return errors instead of aborting, so a dead peer becomes a message naming this rank. */
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (!check(c, MPI_Type_contiguous(1, MPI_UINT16_T, &m->bf16), "MPI_Type_contiguous", error) ||
        !check(c, MPI_Type_commit(&m->bf16), "MPI_Type_commit", error) ||
        !check(c, MPI_Op_create(bf16_sum, 1, &m->bf16_sum), "MPI_Op_create", error)) {
        if (m->bf16 != MPI_DATATYPE_NULL)
            MPI_Type_free(&m->bf16);
        g_free(m);
        return NULL;
    }
    m->sends = g_array_new(FALSE, FALSE, sizeof(PendingSend));
    c->allreduce_bf16 = mpi_allreduce;
    c->reduce_scatter_bf16 = mpi_reduce_scatter;
    c->allreduce_f32 = mpi_allreduce_f32;
    c->reduce_scatter_f32 = mpi_reduce_scatter_f32;
    c->allgather_bf16 = mpi_allgather;
    c->allreduce_host_f64 = mpi_allreduce_host;
    c->gather_host_f64 = mpi_gather_host;
    c->allgather_bytes = mpi_allgather_bytes;
    c->alltoall_bytes = mpi_alltoall_bytes;
    c->alltoall_bf16 = mpi_alltoall_bf16;
    c->send = mpi_send;
    c->recv = mpi_recv;
    c->split = mpi_split;
    c->destroy = mpi_destroy;
    return c;
}

RealComm *real_comm_mpi_new(GError **error)
{
    return mpi_comm_new(MPI_COMM_WORLD, error);
}

static RealComm *mpi_split(RealComm *c, int color, int key, GError **error)
{
    MPI_Comm sub;
    if (!check(c, MPI_Comm_split(((MpiComm *)c)->comm, color, key, &sub), "MPI_Comm_split", error))
        return NULL;
    RealComm *s = mpi_comm_new(sub, error);
    if (!s)
        MPI_Comm_free(&sub);
    return s;
}
