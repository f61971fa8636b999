/* zp_mem: the exact per-rank memory model — model states per term (params, grads,
 * optimizer states) for ZeRO stages 0-3, and each residual term beside them. */
#ifndef ZP_MEM_H
#define ZP_MEM_H

#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"

#include <stdint.h>

typedef struct {
    double params_bytes;
    double grads_bytes;
    double optim_bytes;
    double total_bytes;
} ZpModelStates;

/* Model-state bytes per rank for `params` parameters, tensor-parallel degree mp (each rank
 * holds params/mp) and data-parallel degree dp:
 *   stage 0: (p + g + K) psi          stage 1: (p + g) psi + K psi/N
 *   stage 2: p psi + (g + K) psi/N    stage 3: (p + g + K) psi/N
 * With fp16 Adam (2, 2, 12) these are the paper's 16, 4+12/N, 2+14/N and 16/N. */
ZpModelStates zp_mem_model_states(double params, int stage, int dp, int mp, ZpStateBytes bytes);

/* The largest parameter count whose model states fit in budget_bytes per GPU. */
double zp_mem_max_params(double budget_bytes, int stage, int dp, int mp, ZpStateBytes bytes);

/* Rounds elems up to a multiple of `multiple` (DeepSpeed pads flat buffers so that every
 * rank's partition has the same size). */
uint64_t zp_mem_padded_elems(uint64_t elems, uint64_t multiple);

typedef struct {
    double activation_block_bytes;  /* one block's saved activations (per rank) */
    double activations_bytes;       /* all blocks kept for backward (0 with checkpointing) */
    double checkpoint_bytes;        /* block-input checkpoints of all blocks */
    double recompute_bytes;         /* one block recomputed in backward (checkpointing) */
    double logits_bytes;            /* fp32 logits/softmax of the LM head and loss */
    double reduce_bucket_bytes;     /* gradient bucket buffers */
    double allgather_bucket_bytes;  /* parameter all-gather bucket (stages 1-2) */
    double stage3_gathered_bytes;   /* stage 3: largest unit gathered + prefetch, capped */
    double stage3_persistent_bytes; /* stage 3: full copies of params under the threshold */
    double reserve_bytes;           /* CUDA context and allocator (from the hwprofile) */
    double total_bytes;
} ZpResidual;

/* Activation bytes one block saves for backward (Korthikanti et al., arXiv 2205.05198,
 * tensor parallel degree t, no sequence parallelism, 16-bit activations):
 *   with dropout     s b h (10 + 24/t + 5 a s/(h t))
 *   without dropout  s b h ( 8 + 24/t + 2 a s/(h t))
 * The second drops the two 1-byte masks and the dropout outputs that stand in for the
 * softmax output and the block outputs. Scaled by elem/2 for fp32 training. */
double zp_mem_activation_block_bytes(const ZpModel *model, int micro_batch, int mp,
                                     double elem_bytes);

/* Every residual term for a plan; hw may be NULL (no reserve). The model must have an
 * architecture for activation terms; a params-only model reports buffers and reserve. */
ZpResidual zp_mem_residual(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw);

#endif
