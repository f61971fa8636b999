/* real_pipe: a rank's pipeline stage in zreal — where it sits (ranks numbered TP fastest,
 * then pipeline stage, then DP, as Megatron orders them), its data-parallel and pipeline
 * communicators, and the p2p sends and receives of the schedule's ZP_OP_P2P ops. */
#ifndef REAL_PIPE_H
#define REAL_PIPE_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_tp.h"
#include "zp_sched.h"

#include <glib.h>

typedef struct RealPipe RealPipe;

/* This rank's place in a world of dp x mp x pp ranks (`world`, borrowed) for the schedule
 * `sched` (borrowed; its plan's degrees and ZpRankOrder): the world's rank w is zplan's rank
 * r = zp_rank_of_placed(w), TP rank r mod mp of stage (r / mp) mod pp of DP replica
 * r / (mp pp), as real_groups_split numbers them. Its DP group (the ranks of its
 * stage and TP rank) and pipeline group (its replica's stages of its TP rank) are `groups`'s
 * (borrowed; real_groups_split(world, mp, pp)); where the world could not split (NCCL's:
 * groups->dp NULL) its DP group is one rank (real_comm_emulated). Sends go to the same TP
 * rank of the adjacent stages. Fails when the world's size is not dp x mp x pp or it has no
 * p2p (the emulated world). */
RealPipe *real_pipe_new(RealComm *world, RealBackend *be, const ZpSchedule *sched,
                        const RealGroups *groups, GError **error);
void real_pipe_free(RealPipe *pipe);

int real_pipe_stage(const RealPipe *pipe);
/* The communicators a stage's engine reduces over (DP) and its loss is shared over (the
 * pipeline group: only the last stage computes it); owned by the pipe. */
RealComm *real_pipe_dp_comm(RealPipe *pipe);
RealComm *real_pipe_pp_comm(RealPipe *pipe);

/* Before op `op` of the stage's schedule `sched` runs: receives what it waits for from
 * another stage (a dependency on that stage's p2p send) — a forward's input activations into
 * x (bf16 [b s, h]) or a backward's output gradients into dx (fp32 [b s, h]; they travel in
 * bf16, as the schedule's b s h x 2 bytes say, through x, which a backward does not need). */
gboolean real_pipe_receive(RealPipe *pipe, const ZpSchedule *sched, const ZpOp *op,
                           RealBf16 *x, float *dx, GError **error);

/* Runs a p2p op: sends x (SEND_NEXT) or dx in bf16 (SEND_PREV, through x) to the op's peer
 * stage of this rank's replica and TP rank. */
gboolean real_pipe_send(RealPipe *pipe, const ZpSchedule *sched, const ZpOp *op, RealBf16 *x,
                        const float *dx, GError **error);

/* A tied word embedding's gradient (ZP_P2P_TIED): whether `op` waits for the other
 * embedding stage's; that stage's n bf16 gradients received, through x (bf16) and dx (fp32)
 * of b s h elements a piece, and added to `grads` (the sum rounded to bf16 once, as NCCL's
 * bf16 all-reduce of two ranks); and this stage's sent, in the same pieces. Both stages
 * send before they receive (the MPI communicator's buffered sends): no deadlock. */
gboolean real_pipe_waits_tied(const ZpSchedule *sched, const ZpOp *op);
gboolean real_pipe_receive_tied(RealPipe *pipe, const ZpSchedule *sched, const ZpOp *op,
                                RealBf16 *grads, size_t n, RealBf16 *x, float *dx,
                                GError **error);
gboolean real_pipe_send_tied(RealPipe *pipe, const ZpSchedule *sched, const ZpOp *op,
                             const RealBf16 *grads, size_t n, GError **error);

/* Bytes this rank has sent to other stages, and seconds it has spent waiting in receives
 * (its bubble, in part) and in sends, since it was made or reset. */
double real_pipe_sent_bytes(const RealPipe *pipe);
double real_pipe_recv_s(const RealPipe *pipe);
double real_pipe_send_s(const RealPipe *pipe);
void real_pipe_reset_timings(RealPipe *pipe);

#endif
