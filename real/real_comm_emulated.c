/* real_comm_emulated: RealComm for one process standing in for rank r of a world of N, so one
 * machine measures the memory and traffic of a rank of a cluster it does not have. */
#include "real_comm.h"

#include <string.h>

typedef struct {
    RealComm base;
    RealBackend *be;
} EmulatedComm;

/* The world's sum when all ranks hold this rank's values: N x. Multiplying by N is exact in
 * bf16 for powers of two and one rounding otherwise, like a real sum. */
static void world_sum(EmulatedComm *m, RealBf16 *buf, size_t n)
{
    if (m->base.size > 1)
        m->be->scale_bf16(m->be, buf, n, (float)m->base.size);
}

static gboolean emulated_allreduce(RealComm *c, RealBf16 *buf, size_t n, GError **error)
{
    (void)error;
    c->sent_bytes += real_comm_ring_allreduce_bytes(c->size, (double)n);
    world_sum((EmulatedComm *)c, buf, n);
    return TRUE;
}

/* This rank's piece moves to the front of the buffer, where the real one lands. */
static gboolean emulated_reduce_scatter(RealComm *c, RealBf16 *buf, const int *counts,
                                        GError **error)
{
    (void)error;
    EmulatedComm *m = (EmulatedComm *)c;
    double total = 0;
    size_t offset = 0;
    for (int q = 0; q < c->size; q++) {
        total += counts[q];
        if (q < c->rank)
            offset += (size_t)counts[q];
    }
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, total);
    const size_t mine = (size_t)counts[c->rank];
    m->be->copy(m->be, buf, buf + offset, mine * sizeof(RealBf16));
    world_sum(m, buf, mine);
    return TRUE;
}

/* Every rank's slot receives this rank's piece: N copies, the bytes a real all-gather
 * delivers. */
static gboolean emulated_allgather(RealComm *c, const RealBf16 *send, size_t n, RealBf16 *recv,
                                   GError **error)
{
    (void)error;
    EmulatedComm *m = (EmulatedComm *)c;
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, (double)n * c->size);
    for (int q = 0; q < c->size; q++)
        if (recv + (size_t)q * n != send) /* in place: this rank's slot holds it already */
            m->be->copy(m->be, recv + (size_t)q * n, send, n * sizeof(RealBf16));
    return TRUE;
}

/* Every stand-in sends this rank what this rank sends itself (its own piece): N copies of it,
 * the bytes a real all-to-all delivers. */
static gboolean emulated_alltoall(RealComm *c, const RealBf16 *send, RealBf16 *recv, size_t n,
                                  GError **error)
{
    (void)error;
    EmulatedComm *m = (EmulatedComm *)c;
    c->sent_bytes += real_comm_ring_scatter_gather_bytes(c->size, (double)n * c->size);
    for (int q = 0; q < c->size; q++)
        m->be->copy(m->be, recv + (size_t)q * n, send + (size_t)c->rank * n,
                    n * sizeof(RealBf16));
    return TRUE;
}

static gboolean emulated_allreduce_host(RealComm *c, double *buf, size_t n, GError **error)
{
    (void)error;
    for (size_t i = 0; i < n; i++)
        buf[i] *= c->size;
    return TRUE;
}

static gboolean emulated_gather_host(RealComm *c, const double *send, size_t n, double *recv,
                                     GError **error)
{
    (void)error;
    for (int q = 0; q < c->size; q++)
        memcpy(recv + (size_t)q * n, send, n * sizeof(double));
    return TRUE;
}

static void emulated_destroy(RealComm *c)
{
    g_free(c);
}

RealComm *real_comm_emulated_new(RealBackend *be, int world, int rank)
{
    g_return_val_if_fail(world >= 1 && rank >= 0 && rank < world, NULL);
    EmulatedComm *m = g_new0(EmulatedComm, 1);
    m->be = be;
    RealComm *c = &m->base;
    c->rank = rank;
    c->size = world;
    c->allreduce_bf16 = emulated_allreduce;
    c->reduce_scatter_bf16 = emulated_reduce_scatter;
    c->allgather_bf16 = emulated_allgather;
    c->alltoall_bf16 = emulated_alltoall;
    c->allreduce_host_f64 = emulated_allreduce_host;
    c->gather_host_f64 = emulated_gather_host;
    c->destroy = emulated_destroy;
    return c;
}
