/* real_tp: zreal's Megatron tensor parallelism: the ranks' groups (tensor ranks innermost,
 * then pipeline stages, then data parallelism, as the planner numbers them) and the tensor
 * group's sums of the model's blocks, matched one by one against the schedule's TP ops. */
#ifndef REAL_TP_H
#define REAL_TP_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_gpt.h"
#include "zp_sched.h"

#include <glib.h>

/* The groups one rank belongs to. zplan's rank w = tp_rank + tp (pp_rank + pp dp_rank) (the
 * world's rank where the order is tp-pp-dp; real_groups_split maps the world's to it):
 * tp consecutive ranks form a tensor group, every tp-th rank of a tp x pp block a pipeline,
 * every (tp pp)-th rank a data-parallel group. A group of one rank is NULL when tp or pp
 * is 1, and the world itself stands for dp when tp = pp = 1 (dp_owned FALSE). A world that
 * cannot split (NCCL's) runs one pipeline of pp = its size ranks at tp 1: the world itself
 * is then pp (pp_owned FALSE) and dp is NULL (one rank; real_pipe stands one in). */
typedef struct {
    RealComm *tp, *pp, *dp;
    gboolean dp_owned, pp_owned;
} RealGroups;

/* Splits `world` (MPI_Comm_split through world->split) for tensor degree tp and pp stages,
 * the world's ranks in `order` (the numbering above is zplan's, each world rank's number
 * zp_rank_of_placed); fails naming --mp when tp pp does not divide the world or the
 * communicator cannot split (but for the one pipeline above). */
gboolean real_groups_split(RealComm *world, int tp, int pp, ZpRankOrder order, RealGroups *out,
                           GError **error);
void real_groups_free(RealGroups *groups);

typedef struct RealTp RealTp;

/* The tensor group `comm` (borrowed) on backend `be` (borrowed). */
RealTp *real_tp_new(RealComm *comm, RealBackend *be);
void real_tp_free(RealTp *tp);

int real_tp_rank(const RealTp *tp);
int real_tp_size(const RealTp *tp);

/* RealGptTpOps's (ctx = the RealTp), each then owed to the schedule's next TP op. sum:
 * x[0..n) rounded to bf16, all-reduced over the group (the sum taken in fp32 and rounded, as
 * NCCL's bf16 sum), widened back: an all-reduce of n. gather_host: the communicator's host
 * all-gather of n bytes a rank: an all-gather of size n / 4 fp32 values. */
gboolean real_tp_reduce(void *tp, float *x, size_t n, GError **error);
gboolean real_tp_gather_host(void *tp, void *buf, size_t n, GError **error);
extern const RealGptTpOps real_tp_ops;

/* ZeRO-R's Pa (DeepSpeed's checkpointing.py, gather_partitioned_activations): `whole` holds
 * the group's size x n elements of a block input, this rank's slice at rank x n; the
 * all_gather_into_tensor over the tensor group fills the rest in place. The schedule's op
 * for it is executed here, not matched (real_tp_collective). */
gboolean real_tp_gather_checkpoint(RealTp *tp, RealBf16 *whole, size_t n, GError **error);

/* The schedule's TP collective `op`: the oldest collective the model made that no TP op has
 * matched, which must be of op's kind and elements; fails naming both when not. The
 * collective itself ran inside the compute op (a block sums in its middle), so it is timed
 * there. */
gboolean real_tp_collective(RealTp *tp, const ZpOp *op, GError **error);

/* FALSE, naming how many, when sums were made that no TP op matched (at a step's end). */
gboolean real_tp_settled(const RealTp *tp, GError **error);

/* Bytes this rank sent in the group's sums (ring formula, real_comm.h). */
double real_tp_sent_bytes(const RealTp *tp);

#endif
