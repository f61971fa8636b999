/* real_pipe: places a rank in the TP x PP x DP grid, makes its stage's communicators and
 * turns the schedule's p2p ops and the dependencies on them into sends and receives. */
#include "real_pipe.h"
#include "zp_util.h"

struct RealPipe {
    RealComm *world;       /* borrowed: p2p goes over it, peers by world rank */
    RealBackend *be;       /* borrowed */
    RealComm *dp, *pp;     /* borrowed from the groups, or dp = dp_owned */
    RealComm *dp_owned;    /* the one-rank DP group of a world that cannot split */
    int stage, mp;
    int rank, dp_size, pp_size; /* zplan's number for this rank, and the degrees it is taken in */
    ZpRankOrder order;     /* the world's (the plan's: ZpRankOrder) */
    double recv_s, send_s; /* since made or reset */
    double sent_before;    /* world->sent_bytes when made: its collectives are not p2p */
};

int real_pipe_stage(const RealPipe *p)
{
    return p->stage;
}

RealComm *real_pipe_dp_comm(RealPipe *p)
{
    return p->dp;
}

RealComm *real_pipe_pp_comm(RealPipe *p)
{
    return p->pp;
}

RealPipe *real_pipe_new(RealComm *world, RealBackend *be, const ZpSchedule *s,
                        const RealGroups *g, GError **error)
{
    const int mp = s->plan.mp, pp = MAX(s->stages, 1), dp = s->plan.dp;
    if (world->size != dp * mp * pp) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--pp: the plan has dp %d x mp %d x pp %d = %d ranks, %d are running", dp,
                    mp, pp, dp * mp * pp, world->size);
        return NULL;
    }
    if (!world->send || !world->recv) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--pp: this communicator has no point-to-point sends (run pipelines under "
                    "mpirun, not --emulate)");
        return NULL;
    }
    RealPipe *p = g_new0(RealPipe, 1);
    p->world = world, p->be = be, p->mp = mp;
    p->dp_size = dp, p->pp_size = pp, p->order = s->plan.rank_order;
    p->rank = (int)zp_rank_of_placed(p->order, mp, dp, pp, world->rank);
    p->stage = (p->rank / mp) % pp;
    p->sent_before = world->sent_bytes;
    p->pp = g->pp;
    p->dp = g->dp ? g->dp : (p->dp_owned = real_comm_emulated_new(be, 1, 0));
    return p;
}

void real_pipe_free(RealPipe *p)
{
    if (!p)
        return;
    if (p->dp_owned)
        p->dp_owned->destroy(p->dp_owned);
    g_free(p);
}

/* The world rank of stage `stage` in this rank's replica and TP rank. */
static int peer_rank(const RealPipe *p, int stage)
{
    return (int)zp_rank_placed(p->order, p->mp, p->dp_size, p->pp_size,
                               p->rank + (stage - p->stage) * p->mp);
}

/* Both ends name a transfer by its send op's index in the list every stage shares. */
static int send_tag(const ZpSchedule *s, const ZpOp *send)
{
    return (int)((guint)(send - zp_sched_op(s, 0)) % (REAL_COMM_MAX_TAG + 1u));
}

static gboolean check_bytes(const ZpOp *send, size_t have, GError **error)
{
    if (send->bytes == (double)have)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "a pipeline transfer of %.0f bytes; zreal moves its [b s, h] bf16 activations "
                "(%zu bytes)", send->bytes, have);
    return FALSE;
}

gboolean real_pipe_receive(RealPipe *p, const ZpSchedule *s, const ZpOp *op, RealBf16 *x,
                           float *dx, GError **error)
{
    const uint32_t *deps = zp_sched_deps(s, op);
    const size_t bytes = (size_t)s->plan.micro_batch * (size_t)s->model.seq_len *
                         (size_t)s->model.hidden * sizeof(RealBf16);
    for (uint32_t i = 0; i < op->n_deps; i++) {
        const ZpOp *send = zp_sched_op(s, deps[i]);
        if (send->kind != ZP_OP_P2P || (int)send->stage == p->stage ||
            send->sub == ZP_P2P_TIED)
            continue;
        if (!check_bytes(send, bytes, error))
            return FALSE;
        const double t0 = zp_now_s();
        if (!p->world->recv(p->world, x, bytes, peer_rank(p, (int)send->stage),
                            send_tag(s, send), error))
            return FALSE;
        p->recv_s += zp_now_s() - t0;
        if (send->sub == ZP_P2P_SEND_PREV)
            p->be->bf16_to_f32(p->be, dx, x, bytes / sizeof(RealBf16));
    }
    return TRUE;
}

gboolean real_pipe_send(RealPipe *p, const ZpSchedule *s, const ZpOp *op, RealBf16 *x,
                        const float *dx, GError **error)
{
    const size_t bytes = (size_t)s->plan.micro_batch * (size_t)s->model.seq_len *
                         (size_t)s->model.hidden * sizeof(RealBf16);
    if (!check_bytes(op, bytes, error))
        return FALSE;
    const double t0 = zp_now_s();
    if (op->sub == ZP_P2P_SEND_PREV)
        p->be->f32_to_bf16(p->be, x, dx, bytes / sizeof(RealBf16));
    const gboolean ok = p->world->send(p->world, x, bytes, peer_rank(p, (int)op->peer),
                                       send_tag(s, op), error);
    p->send_s += zp_now_s() - t0;
    return ok;
}

/* The tied gradient's send `op` waits for (another stage's), or NULL. */
static const ZpOp *tied_send(const ZpSchedule *s, const ZpOp *op)
{
    const uint32_t *deps = zp_sched_deps(s, op);
    for (uint32_t i = 0; i < op->n_deps; i++) {
        const ZpOp *send = zp_sched_op(s, deps[i]);
        if (send->kind == ZP_OP_P2P && send->sub == ZP_P2P_TIED && send->stage != op->stage)
            return send;
    }
    return NULL;
}

gboolean real_pipe_waits_tied(const ZpSchedule *s, const ZpOp *op)
{
    return tied_send(s, op) != NULL;
}

/* The pieces a tied gradient travels in: the residual stream's b s h elements. */
static size_t tied_piece(const ZpSchedule *s)
{
    return (size_t)s->plan.micro_batch * (size_t)s->model.seq_len * (size_t)s->model.hidden;
}

static gboolean check_tied(const ZpOp *send, size_t n, GError **error)
{
    if (send->bytes == (double)(n * sizeof(RealBf16)))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "a tied embedding's gradient of %.0f bytes; this stage's copy has %zu bf16 "
                "elements", send->bytes, n);
    return FALSE;
}

gboolean real_pipe_receive_tied(RealPipe *p, const ZpSchedule *s, const ZpOp *op,
                                RealBf16 *grads, size_t n, RealBf16 *x, float *dx,
                                GError **error)
{
    const ZpOp *send = tied_send(s, op);
    if (!check_tied(send, n, error))
        return FALSE;
    const double t0 = zp_now_s();
    for (size_t at = 0; at < n; at += tied_piece(s)) {
        const size_t k = MIN(tied_piece(s), n - at);
        if (!p->world->recv(p->world, x, k * sizeof(RealBf16), peer_rank(p, (int)send->stage),
                            send_tag(s, send), error))
            return FALSE;
        p->be->bf16_to_f32(p->be, dx, x, k);
        p->be->accumulate_bf16(p->be, grads + at, dx, k);
    }
    p->recv_s += zp_now_s() - t0;
    return TRUE;
}

gboolean real_pipe_send_tied(RealPipe *p, const ZpSchedule *s, const ZpOp *op,
                             const RealBf16 *grads, size_t n, GError **error)
{
    if (!check_tied(op, n, error))
        return FALSE;
    const double t0 = zp_now_s();
    gboolean ok = TRUE;
    for (size_t at = 0; ok && at < n; at += tied_piece(s))
        ok = p->world->send(p->world, grads + at, MIN(tied_piece(s), n - at) * sizeof(RealBf16),
                            peer_rank(p, (int)op->peer), send_tag(s, op), error);
    p->send_s += zp_now_s() - t0;
    return ok;
}

double real_pipe_sent_bytes(const RealPipe *p)
{
    return p->world->sent_bytes - p->sent_before;
}

double real_pipe_recv_s(const RealPipe *p)
{
    return p->recv_s;
}

double real_pipe_send_s(const RealPipe *p)
{
    return p->send_s;
}

void real_pipe_reset_timings(RealPipe *p)
{
    p->recv_s = p->send_s = 0;
}
