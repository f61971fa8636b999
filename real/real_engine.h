/* real_engine: runs a ZpSchedule — the very op list the simulator times — on a backend and a
 * communicator, training real_gpt under ZeRO stages 0-3, and measures what it does. */
#ifndef REAL_ENGINE_H
#define REAL_ENGINE_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_engine_base.h"
#include "real_gpt.h"
#include "real_tp.h"
#include "zp_sched.h"

#include <glib.h>


/* Allocates this rank's model states as the schedule lays them out and initialises them
 * (identically on every rank, from cfg->seed). `comm` is the data-parallel group; with
 * tensor parallelism cfg->tp is the tensor group and this rank holds its shard of every
 * block. Fails if the schedule is not one this engine executes (sequence parallelism, fp32
 * or a non-Adam optimizer) or does not match the model.
 * With pipeline stages `sched` is the rank's stage view, `comm` its stage's DP group and
 * cfg->pipe its stage: it runs the stage's ops, receiving and sending activations and their
 * gradients where the ops say (1F1B and GPipe; its saved activations per micro-batch), and
 * its step's loss is the stage's (0 but on the last). */
RealEngine *real_engine_new(const ZpSchedule *sched, RealBackend *be, RealComm *comm,
                            const RealTrainConfig *cfg, GError **error);
void real_engine_free(RealEngine *engine);

/* Runs every op of the schedule once, in list order, for optimizer step `step` (0-based):
 * *loss_out is the mean training loss over all ranks and micro-steps of the step. A buffer
 * size that differs from what the engine needs is an error naming the op. Returns once the
 * backend's device (if any) has finished the step; a device failure is an error. */
gboolean real_engine_step(RealEngine *engine, uint64_t step, double *loss_out, GError **error);

/* Bytes of params, grads, master, Adam m and v this rank holds, read from the tracker. */
double real_engine_model_state_bytes(const RealEngine *engine);

/* With hpZ: the bytes this rank sent in hpZ's group since the engine was made (counted in
 * the data-parallel communicator's total too); FALSE without it. */
gboolean real_engine_hpz_sent_bytes(const RealEngine *engine, double *sent);

/* With cpu_checkpointing: the checkpoints' host tier's tracker counters and the bytes copied
 * down and up since the engine was made (real_zeror); FALSE without it. */
gboolean real_engine_ckpt_host_stats(const RealEngine *engine, RealAllocStats *host,
                                     double *down_bytes, double *up_bytes);

/* With offload: the host tier's tracker counters (live bytes per category), the bytes moved
 * per ZpTransferKind since the engine was made, and the bytes the NVMe tier's swap files
 * moved with O_DIRECT (set-up included); FALSE without offload. */
gboolean real_engine_offload_stats(const RealEngine *engine, RealAllocStats *host,
                                   double moved[ZP_XFER_N], double *direct_bytes);

/* NULL, or why the NVMe tier's swap files use buffered I/O instead of O_DIRECT. */
const char *real_engine_nvme_note(const RealEngine *engine);

/* A mixture of experts: the bytes this rank sent over the expert-parallel group (the
 * all-to-alls, ZP_GROUP_EP) or the expert-data-parallel one (the experts' reductions and
 * gathers, ZP_GROUP_EDP; counted in the data-parallel communicator's total too) since the
 * engine was made; 0 for another group or a dense model. */
double real_engine_moe_sent_bytes(const RealEngine *engine, ZpGroup group);
gboolean real_engine_has_experts(const RealEngine *engine);

/* Forgets the op timings so far (zreal drops its warm-up step's one-time costs). */
void real_engine_reset_timings(RealEngine *engine);

/* Cumulative op timings since the engine was made or last reset, by type: on the backend's
 * device clock when it has one (mark/elapsed_s), else the host's (clock_gettime). */
void real_engine_timings(const RealEngine *engine, RealOpTiming out[REAL_ENGINE_N_OP_TYPES]);

/* "block_fwd", ..., "optimizer", "allreduce", "reduce_scatter", "allgather". */
const char *real_engine_op_type_name(int type);

#endif
