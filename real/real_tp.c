/* real_tp: the tensor group and its sums. The model's blocks call real_tp_reduce in their
 * middle; the schedule lists the same all-reduces after each block op, and the engine hands
 * them to real_tp_collective, which checks them against the sums made, in order. */
#include "real_tp.h"

G_DEFINE_QUARK(real-tp-error-quark, real_tp_error)
#define REAL_TP_ERROR real_tp_error_quark()

struct RealTp {
    RealComm *comm;
    RealBackend *be;
    GQueue owed; /* the collectives no TP op has matched yet (Owed), oldest first */
};

/* A collective the model made: its kind and its elements as the schedule counts them. */
typedef struct {
    ZpCollKind kind;
    uint64_t elems;
} Owed;

static void owe(RealTp *tp, ZpCollKind kind, uint64_t elems)
{
    Owed *o = g_new(Owed, 1);
    *o = (Owed){kind, elems};
    g_queue_push_tail(&tp->owed, o);
}

static gboolean split_one(RealComm *world, int color, int key, RealComm **out, GError **error)
{
    *out = world->split(world, color, key, error);
    return *out != NULL;
}

gboolean real_groups_split(RealComm *world, int tp, int pp, ZpRankOrder order, RealGroups *out,
                           GError **error)
{
    *out = (RealGroups){0};
    const int block = tp * pp;
    if (tp < 1 || pp < 1 || world->size % block != 0) {
        g_set_error(error, REAL_TP_ERROR, 0,
                    "--mp %d x pipeline stages %d must divide the %d ranks", tp, pp,
                    world->size);
        return FALSE;
    }
    if (block == 1) {
        out->dp = world;
        return TRUE;
    }
    if (!world->split && tp == 1 && pp == world->size) {
        out->pp = world;
        return TRUE;
    }
    if (!world->split) {
        g_set_error(error, REAL_TP_ERROR, 0,
                    "tensor parallelism (mp %d) and pipelines (pp %d) run over MPI ranks "
                    "(mpirun), whose communicator splits into groups; this one does not",
                    tp, pp);
        return FALSE;
    }
    /* zplan's number for this world rank (ZpRankOrder): its groups are zplan's */
    const int w = (int)zp_rank_of_placed(order, tp, world->size / block, pp, world->rank);
    const int t = w % tp, p = w / tp % pp, d = w / block;
    out->dp_owned = out->pp_owned = TRUE;
    gboolean ok = (tp == 1 || split_one(world, w / tp, t, &out->tp, error)) &&
                  (pp == 1 || split_one(world, d * tp + t, p, &out->pp, error)) &&
                  split_one(world, w % block, d, &out->dp, error);
    if (!ok)
        real_groups_free(out);
    return ok;
}

void real_groups_free(RealGroups *g)
{
    RealComm *owned[3] = {g->tp, g->pp_owned ? g->pp : NULL, g->dp_owned ? g->dp : NULL};
    for (int i = 0; i < 3; i++)
        if (owned[i])
            owned[i]->destroy(owned[i]);
    *g = (RealGroups){0};
}

RealTp *real_tp_new(RealComm *comm, RealBackend *be)
{
    RealTp *tp = g_new0(RealTp, 1);
    tp->comm = comm;
    tp->be = be;
    g_queue_init(&tp->owed);
    return tp;
}

void real_tp_free(RealTp *tp)
{
    if (!tp)
        return;
    g_queue_clear_full(&tp->owed, g_free);
    g_free(tp);
}

int real_tp_rank(const RealTp *tp)
{
    return tp->comm->rank;
}

int real_tp_size(const RealTp *tp)
{
    return tp->comm->size;
}

gboolean real_tp_reduce(void *ctx, float *x, size_t n, GError **error)
{
    RealTp *tp = ctx;
    RealBackend *be = tp->be;
    RealBf16 *buf = be->alloc(be, n * sizeof(RealBf16), REAL_MEM_WORKSPACE);
    if (!buf) {
        g_set_error(error, REAL_TP_ERROR, 0, "out of memory for a tensor-parallel sum of %zu "
                    "elements", n);
        return FALSE;
    }
    be->f32_to_bf16(be, buf, x, n);
    const gboolean ok = tp->comm->allreduce_bf16(tp->comm, buf, n, error);
    if (ok)
        be->bf16_to_f32(be, x, buf, n);
    be->free(be, buf);
    if (ok)
        owe(tp, ZP_COLL_ALLREDUCE, n);
    return ok;
}

gboolean real_tp_gather_host(void *ctx, void *buf, size_t n, GError **error)
{
    RealTp *tp = ctx;
    if (!tp->comm->allgather_bytes) {
        g_set_error(error, REAL_TP_ERROR, 0, "the vocab-parallel head needs a communicator "
                    "with a host all-gather (MPI's)");
        return FALSE;
    }
    const gboolean ok = tp->comm->allgather_bytes(tp->comm, buf, n, error);
    if (ok) /* fp32 values of the whole gathered buffer */
        owe(tp, ZP_COLL_ALLGATHER, (uint64_t)n * (uint64_t)tp->comm->size / sizeof(float));
    return ok;
}

gboolean real_tp_gather_checkpoint(RealTp *tp, RealBf16 *whole, size_t n, GError **error)
{
    RealComm *c = tp->comm;
    return c->allgather_bf16(c, whole + (size_t)c->rank * n, n, whole, error);
}

const RealGptTpOps real_tp_ops = {.sum = real_tp_reduce, .gather_host = real_tp_gather_host};

gboolean real_tp_collective(RealTp *tp, const ZpOp *op, GError **error)
{
    Owed *made = g_queue_pop_head(&tp->owed);
    const gboolean ok = made && made->kind == (ZpCollKind)op->sub && made->elems == op->elems;
    if (!ok)
        g_set_error(error, REAL_TP_ERROR, 0,
                    "the schedule's tensor-parallel %s of %" G_GUINT64_FORMAT " elements is not "
                    "the model's next (%s of %" G_GUINT64_FORMAT " elements)",
                    zp_sched_coll_name((ZpCollKind)op->sub), op->elems,
                    made ? zp_sched_coll_name(made->kind) : "none", made ? made->elems : 0);
    g_free(made);
    return ok;
}

gboolean real_tp_settled(const RealTp *tp, GError **error)
{
    const guint n = g_queue_get_length((GQueue *)&tp->owed);
    if (n == 0)
        return TRUE;
    g_set_error(error, REAL_TP_ERROR, 0, "the model made %u tensor-parallel collectives the "
                "schedule has no TP op for", n);
    return FALSE;
}

double real_tp_sent_bytes(const RealTp *tp)
{
    return tp->comm->sent_bytes;
}
