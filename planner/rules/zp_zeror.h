/* zp_zeror: ZeRO-R's rules (the ZeRO paper, section 6) — partitioned activation checkpoints
 * (Pa), their host copy (Pa+cpu), the contiguous checkpoint region (MD) and constant buffers. */
#ifndef ZP_ZEROR_H
#define ZP_ZEROR_H

#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>
#include <stdint.h>

/* One block's checkpoint as DeepSpeed keeps it (runtime/activation_checkpointing/
 * checkpointing.py). CheckpointFunction.forward calls partition_activations(), which keeps
 * rank r's 1/M slice of the block input (get_partition_size: numel / mp_size), `.cpu()`'d when
 * cpu_checkpointing is on; CheckpointFunction.backward calls gather_partitioned_activations(),
 * which allocates the whole b*s*h tensor on the GPU, copies the slice in (from the host with
 * cpu_checkpointing) and all-gathers it over the tensor-parallel group. Both copies are
 * synchronous on the compute stream. cpu_checkpointing without Pa moves the whole input.
 * Under sequence parallelism a rank's checkpoint is already its own 1/M of the sequence
 * (zp_mem_checkpoint_bytes), so Pa splits nothing further and gathers nothing. */
typedef struct {
    double full_bytes;      /* the block input, b*s*h elements in the working precision */
    double gpu_bytes;       /* what each rank keeps on the GPU per block until its backward */
    double host_bytes;      /* what each rank keeps in host memory per block */
    double copy_bytes;      /* over the host link per block, each way (forward and backward) */
    uint64_t gather_elems;  /* Pa with M > 1: the all-gather before the recompute (b*s*h) */
    gboolean regathered;    /* backward rebuilds the whole input in a new GPU buffer (Pa with
                             * M > 1, or cpu_checkpointing) */
} ZpCkptRule;

/* The rule for a plan with checkpointing; all zero without. */
ZpCkptRule zp_zeror_checkpoint(const ZpModel *model, const ZpPlan *plan);

/* Pa+cpu: the bytes of checkpoints a rank keeps in host memory over the step, every
 * block's slice (host_bytes x layers; 0 without cpu_checkpointing). A pipeline stage holds
 * its own blocks' slices of the micro-batches in flight there instead: the schedule counts
 * those from its host copies (zp_sched's host_bytes, per stage). Pageable memory:
 * partition_activations() keeps `partition.cpu()`, and with contiguous_memory_optimization
 * the same number of slices in CPU buffers (torch.tensor(()).new_empty(device='cpu')). */
double zp_zeror_host_bytes(const ZpModel *model, const ZpPlan *plan);

/* Fails naming the option when a plan's activation_checkpointing options cannot run:
 * options without checkpointing, Pa whose b*s*h is not a multiple of M (DeepSpeed asserts),
 * a negative number_checkpoints. */
gboolean zp_zeror_check(const ZpModel *model, const ZpPlan *plan, GError **error);

/* MD: with contiguous_memory_optimization, DeepSpeed allocates number_checkpoints (default:
 * one per layer) slices in a list of buffers at the first checkpoint and keeps them for the
 * step; the bytes that region holds on the GPU (0 with cpu_checkpointing, whose buffers are
 * on the host, or without the option). */
double zp_zeror_contiguous_region_bytes(const ZpModel *model, const ZpPlan *plan);

/* CB: the communication buffers and whether their size is fixed or set by the model. A
 * bucket of reduce_bucket_size (or allgather_bucket_size) elements is a constant buffer; a
 * bucket that must hold a whole unit larger than that, or all of a smaller model, is sized
 * by the model. */
typedef struct {
    double constant_bytes;    /* buffers of the configured bucket sizes */
    double model_sized_bytes; /* buffers whose size follows the model */
    const char *model_sized_what; /* what the model sizes (NULL when nothing) */
} ZpConstantBuffers;

ZpConstantBuffers zp_zeror_constant_buffers(const ZpModel *model, const ZpPlan *plan);

#endif
