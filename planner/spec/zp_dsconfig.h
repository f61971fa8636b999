/* zp_dsconfig: DeepSpeed's ds_config.json read into a ZpPlan (with DeepSpeed's defaults and
 * the Hugging Face Trainer's "auto" rules) and written from one, so that a plan runs as is. */
#ifndef ZP_DSCONFIG_H
#define ZP_DSCONFIG_H

#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>
#include <stdint.h>

/* Reads a ds_config.json into *plan. A ds_config does not say how many GPUs there are, so
 * `launch` supplies what DeepSpeed takes from the launch: dp and mp, and the optimizer (the
 * config's "optimizer" section is not modeled); it also supplies what "auto" resolves to, as
 * the Hugging Face Trainer resolves it: micro_batch and grad_accum for the batch keys, the
 * precision for fp16/bf16 "enabled", and from the model's hidden size h: reduce_bucket_size
 * h^2, stage3_prefetch_bucket_size floor(0.9 h^2), stage3_param_persistence_threshold 10h.
 *
 * Batch: DeepSpeed's rule train_batch_size = train_micro_batch_size_per_gpu x
 * gradient_accumulation_steps x dp; any two keys determine the third, one of train_batch_size
 * or the micro-batch alone means no accumulation, none of the three the launch's micro-batch
 * and accumulation (as Accelerate and the Trainer fill them); a contradiction or a batch the
 * data-parallel degree does not divide fails naming the keys. *train_batch_size receives the
 * global batch.
 * Precision: fp16 or bf16 {"enabled": true} (both is an error), neither means fp32.
 * zero_optimization: every absent key takes DeepSpeed's default (deepspeed/runtime/zero/
 * config.py: overlap_comm true only for stage 3); the stage3_* keys also under DeepSpeed's
 * short names (prefetch_bucket_size, ...). activation_checkpointing: its presence means
 * checkpointing at every block (the section configures deepspeed.checkpointing, which the
 * model calls at each block, as Megatron-DeepSpeed does); its options that change memory or
 * time (partition_activations, cpu_checkpointing, ...) are not modeled and warn when set.
 * communication_data_type sets the gradient reduction dtype; attention_kernel (zplan's own
 * key: eager, flash2, ...) the attention kernel, else the launch's. tensor_parallel.autotp_size
 * (DeepSpeed's AutoTP) is the tensor-parallel degree: the launch's dp x mp GPUs are split by
 * it, and a launch mp other than 1 that disagrees is an error. pipeline.stages (DeepSpeed's
 * pipeline engine: 1F1B, gradient_accumulation_steps micro-batches) splits the launch's world
 * dp x mp x stages again; pipeline.partition_method ("uniform" or "parameters", the argument
 * of DeepSpeed's PipelineModule) places the layers; pipeline.activation_checkpoint_interval 1
 * checkpoints every block. expert_parallel (DeepSpeed's AutoEP) enabled sets a mixture of
 * experts' degree to its autoep_size, every token routed; without it the launch's experts
 * stand (a deepspeed.moe.layer.MoE's, in the model's code). The writer records every choice of
 * the plan, autotp_size, the pipeline section and, where every token is routed over EP > 1,
 * expert_parallel included.
 *
 * Keys DeepSpeed knows that zplan does not model (optimizer, scheduler, offload_*, ...) are
 * listed in one line appended to `warnings` (g_free'd strings, never NULL), unknown top-level
 * keys (DeepSpeed ignores them) in another; unknown keys inside a section, values of the
 * wrong type ("stage": "three"), fractional sizes and "auto" where the Trainer does not
 * resolve it fail naming the file and key. Numbers may be written 5e8 or 500000000. */
gboolean zp_dsconfig_read(const char *path, const ZpModel *model, const ZpPlan *launch,
                          ZpPlan *plan, int64_t *train_batch_size, GPtrArray *warnings,
                          GError **error);

/* The same for a parsed JSON object (json_t *); `what` names it in messages. */
gboolean zp_dsconfig_from_json(void *json_object, const char *what, const ZpModel *model,
                               const ZpPlan *launch, ZpPlan *plan, int64_t *train_batch_size,
                               GPtrArray *warnings, GError **error);

/* What a config read into *plan (zp_dsconfig_from_json) did not set and took by default, one
 * "key = value (whose default)" string per setting appended to `taken` (g_free'd): the batch
 * keys when fewer than two are given, the precision when neither fp16 nor bf16 is there, the
 * ZeRO stage when zero_optimization.stage is absent. An empty config `{}` takes all four. */
void zp_dsconfig_defaults_taken(void *json_object, const ZpPlan *plan, GPtrArray *taken);

/* Sets the sizes the Hugging Face Trainer fills in for "auto" from the model's hidden size h:
 * reduce_bucket_size h^2, stage3_prefetch_bucket_size floor(0.9 h^2),
 * stage3_param_persistence_threshold 10h; the rest of *zero is left as it is. */
void zp_dsconfig_hf_auto(const ZpModel *model, ZpZeroConfig *zero);

/* The ds_config DeepSpeed would run the plan with (json_t *, caller decrefs): the three batch
 * keys, fp16 or bf16 {"enabled": true} (neither for fp32), zero_optimization with the stage,
 * the bucket sizes, overlap_comm, contiguous_gradients, reduce_scatter and the stage3_* keys,
 * activation_checkpointing when the plan checkpoints, communication_data_type when gradients
 * are reduced in another dtype than their own, and attention_kernel (zplan's key, which
 * DeepSpeed ignores: the model's attention implementation must match it). Sizes are written as JSON integers
 * (rounded: DeepSpeed's fields are integers). Reading it back with the plan's dp and mp gives
 * the plan again. */
void *zp_dsconfig_to_json(const ZpPlan *plan);

/* zp_dsconfig_to_json written atomically to path. */
gboolean zp_dsconfig_write(const ZpPlan *plan, const char *path, GError **error);

#endif
