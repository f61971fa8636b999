/* real_engine_base: what the engine and its plug-ins (real_engine_ds) share, below both: its
 * error domain, buffers by category, gradients delivered into place, qgZ's reduction, dims. */
#ifndef REAL_ENGINE_BASE_H
#define REAL_ENGINE_BASE_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_gpt.h"
#include "real_tp.h"
#include "zp_sched.h"

#include <glib.h>

/* The engine's own types (real_engine.h's API takes them): here, below the engine's files,
 * so that its private header (real_engine_internal.h) need not include real_engine.h. */
typedef struct {
    float lr;           /* AdamW learning rate */
    float weight_decay; /* decoupled weight decay */
    uint64_t seed;      /* parameter initialisation and the synthetic data stream */
    RealTp *tp;         /* the tensor group of a schedule with mp > 1 (borrowed); NULL at 1 */
    /* Pipelines: this rank's stage (real_pipe; borrowed), whose view of the schedule
     * (zp_sched_stage_view) the engine runs over the stage's DP communicator; NULL without. */
    struct RealPipe *pipe;
} RealTrainConfig;

/* Op types that are timed: the compute kinds, then the collective kinds. */
#define REAL_ENGINE_N_OP_TYPES (ZP_COMP_N + ZP_COLL_N)

typedef struct {
    uint64_t count;
    double total_s;
} RealOpTiming;

typedef struct RealEngine RealEngine;

#define REAL_ENGINE_ERROR real_engine_error_quark()
GQuark real_engine_error_quark(void);

/* The executor's model for a planner's model and plan: the same architecture (GPT-2 or
 * Llama blocks), the plan's micro-batch and attention kernel (eager or fused). Not checked:
 * real_engine_new refuses what the executor cannot train. */
RealGptDims real_engine_dims(const ZpModel *model, const ZpPlan *plan);

/* What the engine (real_engine.c) shares with its plug-ins (real_engine_ds.c): a
 * REAL_ENGINE_ERROR (returns FALSE); a buffer of a category, NULL with an error naming the
 * rank when there is no memory; dst = src (the step's first micro-step's reduced gradients), or with `accumulate` dst +=
 * src in place, in bf16, allocating nothing (a later micro-step's, as DeepSpeed adds them in
 * the gradient accumulation dtype, the model's by default: stage3.py partition_grads
 * grad_buffer.add_(grad_partition.to(gradient_accumulation_dtype)), stage_1_and_2.py
 * independent_gradient_partition_epilogue accumulated_grad.add_(new_avg_grad)). */
gboolean real_engine_fail(GError **error, const char *format, ...) G_GNUC_PRINTF(2, 3);
void *real_engine_alloc(RealBackend *be, int rank, uint64_t bytes, ZpMemCategory cat,
                        GError **error);
void real_engine_deliver(RealBackend *be, RealBf16 *dst, const RealBf16 *src, uint64_t n,
                         gboolean accumulate);

/* qgZ's reduction (real_zeropp_qgz_reduce) of `pieces`, the world's partitions of `part` fp32
 * elements each in `groups` groups a partition, through the node's and the cross-node
 * groups in `work`; this rank's sum into mine (bf16). Both subgroups' bytes count in
 * `total`'s sent_bytes. */
gboolean real_engine_qgz(RealBackend *be, int rank, RealComm *total, RealComm *node,
                         RealComm *cross, const float *pieces, uint64_t part, uint64_t groups,
                         uint8_t *work, RealBf16 *mine, GError **error);

#endif
