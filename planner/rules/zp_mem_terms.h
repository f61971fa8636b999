/* zp_mem_terms: the exact per-rank memory model's terms — model states per term (params,
 * grads, optimizer states) for ZeRO stages 0-3, activations and checkpoints, and the residual
 * terms' record (zp_mem.h sums a plan's). */
#ifndef ZP_MEM_TERMS_H
#define ZP_MEM_TERMS_H

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
    double checkpoint_bytes;        /* block-input checkpoints of all blocks (1/M with Pa) */
    double checkpoint_host_bytes;   /* those in host memory instead (cpu_checkpointing);
                                     * not part of total_bytes */
    double recompute_bytes;         /* one block recomputed in backward (checkpointing), with
                                     * the re-gathered whole input under Pa or Pa+cpu; or
                                     * one block's core attention (selective) */
    double logits_bytes;            /* fp32 logits/softmax of the LM head and loss */
    double reduce_bucket_bytes;     /* gradient bucket buffers */
    double allgather_bucket_bytes;  /* parameter all-gather bucket (stages 1-2) */
    double stage3_gathered_bytes;   /* stage 3: largest unit gathered + prefetch, capped */
    double stage3_persistent_bytes; /* stage 3: full copies of params under the threshold */
    double hpz_secondary_bytes;     /* stage 3 with ZeRO++ hpZ: the 16-bit secondary partition
                                     * of the non-persistent parameters, 2 psi / size */
    double step_buffer_bytes;       /* the step's gradient copies (flattened, fp32) */
    double moe_buffer_bytes;        /* a mixture of experts' dispatch (or combine) all-to-all
                                     * send and receive buffers, one layer's at a time (zp_ep) */
    double reserve_bytes;           /* CUDA context and allocator (from the hwprofile) */
    double total_bytes;
} ZpResidual;

/* Activation bytes one block saves for backward: Korthikanti et al.'s accounting (arXiv
 * 2205.05198: tensor parallel degree t, no sequence parallelism, 16-bit activations)
 * extended to grouped-query attention, gated MLPs and fused attention kernels. Per token,
 * in 16-bit elements, with k key/value heads of dimension d and MLP width f:
 *   replicated across t: both norms' inputs and outputs   4h (3h with a parallel residual,
 *                                                          whose second norm reads the input)
 *   split across t:      Q h, K and V 2kd, the attention output h (the projection's input),
 *                        plain MLP: fc1 output f and activation output f;
 *                        gated MLP: gate f, up f and their product f (the activation is
 *                        recomputed from the gate)
 * so 2 s b (4h + (2h + 2kd + 2f or 3f)/t) bytes, which for GPT-2 (k d = h, f = 4h) is
 * Korthikanti's s b h (8 + 24/t). The attention kernel adds:
 *   eager    the softmax output, 2 a s^2 b / t
 *   fused    no s x s tensor: an fp32 log-sum-exp per row and head, 4 a s b / t
 * and training with dropout adds the two 1-byte residual masks (2 s b h) and, eager only,
 * the attention mask and dropout output (3 a s^2 b / t; a fused kernel regenerates its mask
 * from the RNG state): GPT-2 eager with dropout is s b h (10 + 24/t + 5 a s/(h t)).
 * The 16-bit terms scale by elem/2 for fp32 training; the log-sum-exp is fp32 either way.
 * A LayerNorm model also keeps both norms' fp32 mean and 1/std, 16 s b bytes (PyTorch's
 * native_layer_norm saves them for backward, as zreal's real_gpt does; Korthikanti leaves
 * them out), replicated like the norms' inputs; RMSNorm keeps none. */
double zp_mem_activation_block_bytes(const ZpModel *model, int micro_batch, int mp,
                                     double elem_bytes, ZpAttention attention);

/* The same for a plan, with Megatron's sequence parallelism when the plan has it
 * (Korthikanti et al. section 4.2.2): the layer norms' inputs and outputs and the dropout
 * masks are split over the t ranks of the tensor group too, so GPT-2 eager with dropout keeps
 * (s b h / t)(34 + 5 a s / h) bytes, and its LayerNorm statistics 16 s b / t. With selective
 * recomputation (section 5, Table 2) core attention keeps only its inputs: the 5 a s / h term
 * goes (a fused kernel's log-sum-exp likewise), sbh(10 + 24/t) without sequence parallelism,
 * sbh 34/t with it. */
double zp_mem_plan_activation_block_bytes(const ZpModel *model, const ZpPlan *plan);

/* Selective recomputation: core attention's tensors one block's backward recomputes and holds
 * until it ends (what the plan's block no longer saves: 5as^2b/t eager with dropout, a fused
 * kernel's log-sum-exp 4asb/t); 0 otherwise. */
double zp_mem_core_attention_bytes(const ZpModel *model, const ZpPlan *plan);

/* One block's checkpoint, its input: s b h elements, over t with sequence parallelism. */
double zp_mem_checkpoint_bytes(const ZpModel *model, const ZpPlan *plan);

#endif
