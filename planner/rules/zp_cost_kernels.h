/* zp_cost_kernels: the kernels of one compute op of the schedule as real/'s backends issue
 * them — every GEMM of forward, data gradient and weight gradient with its own shape,
 * attention, each elementwise kernel by its real bytes — and the workspace they hold. The
 * schedule builder takes an op's memory-bound bytes, module shares and workspace from here;
 * zp_cost times the kernels. */
#ifndef ZP_COST_KERNELS_H
#define ZP_COST_KERNELS_H

#include "zp_model.h"
#include "zp_optable.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"

#include <glib.h>

typedef enum { ZP_KERNEL_GEMM, ZP_KERNEL_ATTENTION, ZP_KERNEL_EW } ZpKernelKind;

/* One kernel of a compute op. */
typedef struct {
    ZpKernelKind kind;
    int sub;          /* GEMM: ZpGemmForm; attention: 0 forward, 1 backward; ZpEwClass */
    double m, n, k;   /* GEMM shape: c[m,n] = a[m,k] b[k,n] */
    gboolean head;    /* GEMM: the LM head's, whose layouts and operand dtypes are not a block
                       * linear's (real_gpt_head_compute: the logits against the tied table,
                       * dwte from two fp32 operands) */
    double flops;     /* GEMM 2mnk; attention the model's 4bs^2h/mp forward, 8 backward */
    double bytes;     /* elementwise: bytes the backend really reads and writes */
    /* Elements read plus written in the schedule's accounting (its mem_bytes are this times
     * the working precision's size): the norms, residual adds, activations, bias gradients,
     * the eager softmax; 0 for conversions and copies (zreal's fp32 bookkeeping, which a
     * 16-bit framework does not do) and for what a GEMM epilogue does (bias adds). */
    double accesses;
    /* A block op's kernel: the module (ZpBlockModule) whose compute it is, with the
     * parameter-free work that follows that module in forward (the attention core after qkv,
     * the activation after fc1, the residual adds after proj and fc2) and so precedes it in
     * backward, up to the next module's hook; 0 for other ops. */
    int module;
} ZpKernel;

#define ZP_COST_MAX_KERNELS 64
typedef struct {
    int n;
    int module; /* the module the kernels being added belong to */
    ZpKernel k[ZP_COST_MAX_KERNELS];
} ZpKernels;

/* The kernels of one compute op of `kind` (none for the optimizers, whose work is their op's
 * bytes, on the GPU or, offloaded, on the host: zp_offload costs that one)
 * for the model (with an architecture) and plan, in the order real_gpt.c issues them:
 * a block forward saves its activations unless the plan checkpoints (the recompute always
 * does); widths split by the tensor degree mp as Megatron splits them. */
void zp_cost_kernels(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                     ZpKernels *out);

/* A block op's (forward, recompute, backward) work per module (ZpKernel module), as
 * fractions of the op's that sum to 1: its FLOPs, those of the fused attention kernel, its
 * memory-bound accesses, and its time by kernel_s (NULL: none; zp_cost_module_shares passes
 * the op table's kernel rates, so that this layer needs no costs). */
typedef struct {
    double flops[ZP_MOD_N], attn_flops[ZP_MOD_N], accesses[ZP_MOD_N], time[ZP_MOD_N];
} ZpModuleShares;

typedef double (*ZpKernelTimeFn)(const void *ctx, const ZpKernel *kernel);
void zp_cost_kernel_shares(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                           ZpKernelTimeFn kernel_s, const void *ctx, ZpModuleShares *out);

/* Elements read plus written by an op's memory-bound kernels in the schedule's accounting
 * (the sum of their `accesses`): the schedule's mem_bytes of a block backward are this times
 * the element size, from the backward's own kernels. */
double zp_cost_accesses(const ZpKernels *kernels);

/* The key of a compute op's shape in the op table's whole-op times: every size and choice
 * that changes the op's kernels (its Dims), the plan's checkpointing and, for a block forward,
 * whether it saves its activations. Written into out (ZP_OPTABLE_SHAPE_LEN bytes). */
void zp_cost_op_shape(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                      char out[ZP_OPTABLE_SHAPE_LEN]);

/* Bytes of fp32 workspace real_gpt.c allocates while one compute op of `kind` runs, besides
 * the head's logits (which the schedule lists for every backend): the embedding's fp32 output
 * (T h) or its fp32 gradients (unit 0), a block forward's buffers
 * T(3h + q + f1 + f + 4) + b a s, a block backward's block_elems + T(2 f1 + 3h + 2q), the
 * head's T(2h + 2) + h(V + 2); 0 for other kinds. With mp > 1 also what the op holds for
 * the tensor group: the bf16 buffer of T h each of its sums stages (real_tp_reduce), the
 * embedding's T h position rows or dx copy (real_gpt_embed_fwd_tp, real_gpt_embed_bwd_tp). */
double zp_cost_op_workspace_bytes(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind);

/* Bytes zreal holds as workspace through a whole run on its CPU backend: the engine's residual
 * stream x (bf16 T h) and gradient dx (fp32 T h), and real_cpu.c's staging buffers, grown to
 * the largest use and kept: a bf16 first GEMM operand widened (the blocks' weight gradients,
 * m k), a bf16 second operand widened a panel at a time (n k, at most 2^23 elements of it),
 * and the eager attention's two s x s tiles (a fused kernel's d + 32). */
double zp_cost_resident_workspace_bytes(const ZpModel *model, const ZpPlan *plan);

#endif
