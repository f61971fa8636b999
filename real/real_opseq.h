/* real_opseq: times each compute op of a step whole — every kernel of it in real_gpt.c's own
 * order, each reading what the one before wrote — inside a step's sequence of ops over all
 * the model's layers, so that each op meets its inputs as training leaves them (not warm in
 * cache). zplan calibrate puts these times into the op table (zp_optable's "ops"). */
#ifndef REAL_OPSEQ_H
#define REAL_OPSEQ_H

#include "real_backend.h"
#include "real_comm.h"
#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>

/* Runs, on every rank at once (as many ranks share the machine as will train on it), the
 * compute of a step of `model` under `plan` as the engine drives real_gpt: embedding
 * forward, every block forward, the head, every block backward (after its recompute under
 * checkpointing), the embedding backward, from the model's initial parameters, then the
 * optimizer: one Adam call over this rank's partition, as real_engine.c makes it, at the
 * element count of one ZeRO stage on plan->dp ranks (zp_sched_optimizer_elems: stage 0's
 * every parameter, stages 1-2's and stage 3's shares), the distinct counts in turn, one a
 * timed step. It does so without and with checkpointing: a warm-up step of each, then timed
 * steps of the two in turn, 3 each or as many more (up to 15) as fit about 6 s. The ranks
 * line up before each step, not before each op, and each times its own ops. On the host a
 * rank's calls are then scaled to fill the timed steps' cycle, less the line-ups' own time:
 * where ranks outnumber the cores, the time a rank waits for a core inside a line-up belongs
 * to the step's compute, as it does in training (on a device each call keeps its time on the
 * device clock). Adds to `root` (a json_t object) "op_sequence": [{op, shape
 * (zp_cost_op_shape), checkpoint, calls, time_s}]: for each op kind and mode, the ranks' mean
 * of their calls' mean, so scaled; per optimizer element count {op "optimizer", shape
 * (zp_cost_optimizer_shape), calls, time_s} over both modes' timed steps; and
 * "op_sequence_cycle": {ranks, steps, cycle_s, line_up_s, calls_s, cycle_factor} (the timed
 * steps' cycle, one line-up alone, the ranks' mean of their calls' sum and of the scale).
 * Adds nothing (returns TRUE) when plan->mp > 1: zreal runs no tensor-parallel shapes. */
gboolean real_opseq_run(RealBackend *be, RealComm *comm, const ZpModel *model,
                        const ZpPlan *plan, void *root, GError **error);

#endif
