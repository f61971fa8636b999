/* zp_pipe: pipeline parallelism's two plug-ins to the schedule builder — how the model's
 * units are split into stages (model chunks), and the order a stage runs its micro-batches. */
#ifndef ZP_PIPE_H
#define ZP_PIPE_H

#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>

/* One step of a stage: the forward or backward of one micro-batch through one model chunk
 * (chunk c = v * P + stage for the stage's v-th chunk, Megatron's virtual pipeline order). */
typedef struct {
    int micro;
    int chunk;
    gboolean backward;
} ZpPipeAction;

/* Splits the model's units (0 the embedding, 1..L the blocks, L+1 the head) into `chunks`
 * contiguous ranges: chunk c holds units first_unit[c] .. first_unit[c+1]-1, the embedding
 * in chunk 0 and the head in the last. Uniform splits the blocks evenly (Megatron; the first
 * L mod chunks chunks take one more); parameters balances the units' parameter counts, the
 * embedding and head included (DeepSpeed's partition_method="parameters":
 * deepspeed/runtime/pipe/module.py PipelineModule._partition_layers with
 * deepspeed/runtime/utils.py partition_balanced). first_unit has chunks + 1 entries. Fails
 * when there are fewer blocks than chunks. */
gboolean zp_pipe_partition(const ZpModel *model, int chunks, ZpPartition method, int *first_unit,
                           GError **error);

/* How many stages of a 1F1B pipeline hold one block more than the rest: Megatron's uniform
 * split of L blocks over P stages gives the first L mod P one more. With tensor parallelism of
 * 8 or more, such a pipeline's steady state was measured to repeat only every that many
 * micro-steps, not every one (mt-nlg-530b's 105 blocks over 16 and over 32 stages every 9,
 * over 64 every 41; gpt3-175b's 96 over 20 every 16): the shift sim_fold.c tries for it.
 * 0 where the stages hold equal blocks, the split balances parameters, or the schedule is
 * not 1F1B. */
int zp_pipe_heavy_stages(const ZpModel *model, const ZpPlan *plan);

/* The actions of `stage` in the order it issues them, for P stages, V chunks per stage and
 * m micro-batches (GArray of ZpPipeAction):
 *   gpipe        every forward, then every backward;
 *   1f1b         min(P - stage - 1, m) forwards, then one forward and one backward in turn,
 *                then the remaining backwards (PipeDream-flush: Megatron's
 *                forward_backward_pipelining_without_interleaving, DeepSpeed's TrainSchedule);
 *   interleaved  Megatron's forward_backward_pipelining_with_interleaving: micro-batches in
 *                groups of P through each chunk in turn, (P - stage - 1) * 2 + (V - 1) * P
 *                warm-up forwards (all of them when m = P). */
GArray *zp_pipe_actions(ZpPipeSchedule schedule, int stages, int virtual_stages, int micro,
                        int stage);
/* The warm-up forwards zp_pipe_actions lists first for that stage, before the forwards that
 * each pair with the backward after them (1F1B's and the interleaved schedule's steady state):
 * every forward for GPipe. */
int zp_pipe_warmup(ZpPipeSchedule schedule, int stages, int virtual_stages, int micro, int stage);

/* Fails naming the flag (--pp, --virtual-stages, --pp-schedule, --grad-accum) when the pipeline
 * configuration cannot run: interleaving needs V >= 2 and m a multiple of P (Megatron's
 * check), V > 1 needs the interleaved schedule, and every chunk needs a block. */
gboolean zp_pipe_check(const ZpModel *model, const ZpPlan *plan, GError **error);

#endif
