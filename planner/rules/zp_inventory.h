/* zp_inventory: what a framework really launches on a GPU for each compute op of a step — every
 * GEMM with its shape, the attention kernel, each memory-bound kernel with the bytes it reads and
 * writes, the collectives inside an op — in the order it issues them, with the source of each.
 *
 * One file per framework (zp_inventory_eager.c, zp_inventory_megatron.c,
 * zp_inventory_deepspeed.c) fills a ZpInventory, a small table of functions, as real/real_comm.h
 * does for communicators; the costing (zp_cost) never asks which framework it prices. */
#ifndef ZP_INVENTORY_H
#define ZP_INVENTORY_H

#include "zp_kclass.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"

#include <glib.h>

/* A kernel's class (zp_kclass.h, the first ZP_KCLASS_INVENTORY_N), how zp_kernrate prices it:
 * GEMM batch x (c[m,n] = a[m,k] b[k,n]), 2 batch m n k FLOPs; attention, a fused kernel's
 * share of the model's attention FLOPs; memory-bound, its bytes read and written; collective,
 * one inside the op (tensor parallelism), which the schedule's own collective ops price, so
 * the op's time leaves it out. */

typedef struct {
    const char *name;   /* what it computes: "qkv", "softmax", "gelu_new.tanh" */
    ZpKClass cls;
    double batch, m, n, k; /* GEMM */
    double flops;       /* GEMM 2 batch m n k; attention its FLOPs (4 b s^2 h forward per the
                         * model's count, twice that backward, a sliding window's share) */
    double read_bytes, write_bytes; /* every class: bytes the kernel moves in device memory;
                                     * collectives: read_bytes is the array's */
    double launches;    /* kernels it stands for (multi-tensor kernels launched in chunks); 1 */
    int backward;       /* attention: 0 forward, 1 backward */
    const char *source; /* the framework's file and function that launches it */
} ZpInvKernel;

#define ZP_INV_MAX 192
typedef struct {
    int n;
    ZpInvKernel k[ZP_INV_MAX];
} ZpInvList;

/* One rank's sizes for an op: tokens of a micro-batch, widths split by the tensor degree mp as
 * Megatron splits them, bytes of an activation element (e). */
typedef struct {
    double b, s, t, h, heads, kv_heads, hd, q, f, f1, v, mp, e;
    double ha; /* the attention's width over all ranks, heads x hd (h unless head_dim differs) */
    double t_norm; /* tokens a norm, dropout or residual add sees: t/mp with sequence
                    * parallelism, else t */
    double positions; /* rows of a learned position table */
    gboolean gated, rms, bias_qkv, bias_proj, bias_mlp, learned, rope, tied, dropout;
    gboolean qk_norm; /* Qwen3's q_norm and k_norm over each head */
    gboolean fp16;    /* fp16 (a loss scale to undo), not bf16 or fp32 */
    gboolean fused;   /* the plan's attention is a fused kernel (FlashAttention and kin) */
    gboolean main_grad; /* gradients accumulate in an fp32 main_grad (plan: unless no_main_grad) */
    gboolean head_shares_table; /* the tied word embedding and the head on one rank (no
                                 * pipeline): one parameter, both gradients summed by autograd */
    double accum_share; /* of the micro-steps that add a gradient into an existing one:
                         * (grad_accum - 1) / grad_accum (the first assigns it), over the
                         * step's micro-steps (zp_plan_step_grad_accum) */
    double attention_share; /* of the s^2 pairs a fused kernel computes (sliding windows) */
    gboolean amp;     /* torch.autocast over fp32 parameters: the inventory's own (autocast) */
} ZpInvDims;

void zp_inventory_dims(const ZpModel *model, const ZpPlan *plan, ZpInvDims *out);

/* A framework's inventory. Each function appends one op's kernels to out, in issue order. The
 * recompute of a checkpointed block runs block_fwd again. head: the final norm, the logits, the
 * loss, and their backward (one op in the schedule). optimizer: the step over the `elems`
 * parameters this rank updates. */
typedef struct {
    const char *name;  /* "eager", "megatron", "deepspeed": --kernels NAME */
    const char *about; /* what runs this way, in words */
    void (*embed_fwd)(const ZpInvDims *d, ZpInvList *out);
    void (*block_fwd)(const ZpInvDims *d, ZpInvList *out);
    void (*head)(const ZpInvDims *d, ZpInvList *out);
    void (*block_bwd)(const ZpInvDims *d, ZpInvList *out);
    void (*embed_bwd)(const ZpInvDims *d, ZpInvList *out);
    void (*optimizer)(const ZpInvDims *d, double elems, ZpInvList *out);
    gboolean autocast; /* the model under torch.autocast (ZpInvDims.amp for its functions) */
} ZpInventory;

extern const ZpInventory zp_inventory_eager;
extern const ZpInventory zp_inventory_megatron;
extern const ZpInventory zp_inventory_deepspeed;

/* The inventory a name selects; NULL (with every name listed in the error, naming `flag`) when
 * none has it. */
const ZpInventory *zp_inventory_find(const char *name, const char *flag, GError **error);

/* The inventory a plan runs: plan->kernels when set, else the one named like the plan's
 * implementation (zp_impl_name: "deepspeed", and "megatron" once that implementation exists),
 * else PyTorch eager (FSDP and the paper run the model as PyTorch does). */
const ZpInventory *zp_inventory_for_plan(const ZpPlan *plan);

/* One compute op's kernels (kind; optimizer_elems for the optimizer only). Kinds that are not
 * kernels of the model (host copies, ZeRO++'s quantisation, unpacks) give none. */
void zp_inventory_op(const ZpInventory *inv, const ZpModel *model, const ZpPlan *plan,
                     ZpComputeKind kind, double optimizer_elems, ZpInvList *out);

/* A mixture of experts' expert and unpermute ops (Megatron-Core's grouped GEMMs and
 * moe_utils.py unpermute, whichever framework runs the rest): nothing for another kind or a
 * dense model. zp_inventory_op calls it. */
void zp_inventory_moe_op(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                         ZpInvList *out);

/* A block of a mixture of experts or with latent attention by its own widths (unit 1..L: a
 * sparse unit's shared experts, router, softmax and top-k and permutation, a dense unit's MLP;
 * latent attention's low-rank projections), forward (backward FALSE) or backward: the kernels
 * whose FLOPs and bytes zp_build_unit_block_cost counts for the op, so that the op is priced
 * on the kernel surface. Nothing for a model with uniform blocks. */
void zp_inventory_moe_block(const ZpModel *model, const ZpPlan *plan, int unit, gboolean backward,
                            ZpInvList *out);

/* Totals over a list: GEMM FLOPs (batched GEMMs included), attention-kernel FLOPs, bytes read
 * plus written by the memory-bound kernels, and kernel launches (collectives excluded). */
typedef struct {
    double gemm_flops, attention_flops, memory_bytes, launches;
} ZpInvTotals;
void zp_inventory_totals(const ZpInvList *list, ZpInvTotals *out);

/* Builders the framework files share. */
void zp_inv_gemm(ZpInvList *out, const char *name, double batch, double m, double n, double k,
                 double in_bytes, double out_bytes, const char *source);
void zp_inv_mem(ZpInvList *out, const char *name, double read_bytes, double write_bytes,
                const char *source);
void zp_inv_multi(ZpInvList *out, const char *name, double read_bytes, double write_bytes,
                  double launches, const char *source);
void zp_inv_attention(ZpInvList *out, const ZpInvDims *d, int backward, const char *source);
/* q_norm and k_norm (when d->qk_norm): one RMSNorm over hd for each of the rank's query and
 * key heads; forward reads and writes q and k, backward reads them and their gradients and
 * writes the input gradients. Nothing without q/k norms. */
void zp_inv_qk_norm(ZpInvList *out, const ZpInvDims *d, int backward, const char *source);
void zp_inv_collective(ZpInvList *out, const char *name, double bytes, const char *source);

/* PyTorch eager's block, head and embedding (zp_inventory_eager.c), for the inventories that run
 * the model as PyTorch does, straight from their tables: d->amp is torch.autocast over fp32 parameters (Hugging Face's
 * Trainer, llm-foundry, torchtitan without compile: each GEMM casts its weight and fp32 input,
 * norms and softmax run in fp32, the residual stream stays fp32), else the module converted to
 * 16 bits (DeepSpeed's engine: every tensor in the working precision, no casts). */
void zp_inventory_eager_embed_fwd(const ZpInvDims *d, ZpInvList *out);
void zp_inventory_eager_block_fwd(const ZpInvDims *d, ZpInvList *out);
void zp_inventory_eager_head(const ZpInvDims *d, ZpInvList *out);
void zp_inventory_eager_block_bwd(const ZpInvDims *d, ZpInvList *out);
void zp_inventory_eager_embed_bwd(const ZpInvDims *d, ZpInvList *out);

/* Megatron's core attention forward (transformer/dot_product_attention.py, or the fused kernel
 * in its place): what a block's forward runs between linear_qkv and linear_proj, and all that
 * selective recomputation (recompute_granularity "selective", core_attn) runs again. */
void zp_inventory_megatron_core_attention_fwd(const ZpInvDims *d, ZpInvList *out);

/* Launches of a multi-tensor kernel over `elems` elements: ATen's and apex's
 * multi_tensor_apply give each block a chunk of 65536 elements and launch at most 320 blocks
 * (aten/src/ATen/native/cuda/MultiTensorApply.cuh kChunkSize, depth_to_max_blocks;
 * apex csrc/multi_tensor_apply.cuh). */
double zp_inv_multi_tensor_launches(double elems);

#endif
