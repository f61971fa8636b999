/* zp_megatron_args: a plan read from Megatron-LM's own command-line flags, as a launch script
 * passes them to pretrain_gpt.py (megatron/training/arguments.py) — --ds-config's counterpart
 * for --impl megatron. */
#ifndef ZP_MEGATRON_ARGS_H
#define ZP_MEGATRON_ARGS_H

#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>

/* Reads the flags in `path` (a launch script's arguments: words as the shell splits them,
 * backslash-newlines, quotes and # comments included; whatever precedes the first word ending
 * in ".py" — torchrun and its own flags — is skipped when there is one) into *plan for
 * `gpus` GPUs, with Megatron's defaults where a flag is absent (arguments.py: tensor and
 * pipeline size 1, micro-batch 1, no distributed optimizer, no overlap, no recomputation,
 * fp32 unless --fp16 or --bf16; the DDP's grad_reduce_in_fp32 under bf16 and with
 * --accumulate-allreduce-grads-in-fp32; bucket_size max(4e7, 1e6 dp)). The plan is --impl
 * megatron's: stage 1 with --use-distributed-optimizer, else 0.
 *
 * Model flags (--num-layers, --hidden-size, --num-attention-heads, --seq-length,
 * --ffn-hidden-size) must agree with `model`, naming the flag when not. A value that is not
 * a whole number in range, a value missing, degrees that do not divide `gpus`, a global
 * batch the data-parallel micro-batches do not divide, and flags that change memory or time
 * in ways zplan does not model (--recompute-method with --recompute-num-layers, partial
 * recomputation; --no-scatter-gather-tensors-in-pipeline; --context-parallel-size above 1;
 * --moe-layer-recompute) fail naming the file and flag. A mixture of experts' flags
 * (--num-experts, --expert-model-parallel-size, --moe-expert-capacity-factor, ...) set
 * plan->experts where they agree with `model` and with what zplan times (moe_plan in the .c).
 * Architecture flags (--swiglu, --untie-embeddings-and-output-weights, --normalization, the
 * biases, positions, query groups, --qk-layernorm, dropouts) that build otherwise than `model`
 * fail naming the flag; absent ones whose Megatron default does are said in one warning
 * (arch_check in the .c).
 * Flags with no bearing on a step's memory or time (learning rate, data, checkpoint paths,
 * logging, ...) are listed in one line appended to `warnings` (g_free'd strings). *attention_set says whether the flags chose the
 * attention kernel (--use-flash-attn, --attention-backend); else the caller chooses it. */
gboolean zp_megatron_args_read(const char *path, const ZpModel *model, int gpus, ZpPlan *plan,
                               gboolean *attention_set, GPtrArray *warnings, GError **error);

/* The same for words already split (argv-like, argc of them); `what` names their source. */
gboolean zp_megatron_args_parse(int argc, char **argv, const char *what, const ZpModel *model,
                                int gpus, ZpPlan *plan, gboolean *attention_set,
                                GPtrArray *warnings, GError **error);

#endif
