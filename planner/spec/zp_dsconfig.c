/* zp_dsconfig: one table per ds_config section says what each key DeepSpeed knows becomes in a
 * ZpPlan (or that it is not modeled); the reader and the writer both walk these tables. */
#include "zp_dsconfig.h"
#include "zp_dsconfig_engine.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

/* Sizes are element counts; beyond 1e15 a value is a typo, not a bucket. */
#define MAX_ELEMS 1000000000000000LL
#define MAX_BATCH (1LL << 24)

typedef enum {
    KEY_SIZE,    /* a whole number of elements, into a ZpZeroConfig double */
    KEY_FLAG,    /* true or false, into a ZpZeroConfig gboolean */
    KEY_OWN,     /* read by the section's own code */
    KEY_IGNORED, /* DeepSpeed knows it, zplan does not model it: a warning */
} KeyKind;

/* The Hugging Face Trainer's "auto" for a size, from the model's hidden size h
 * (transformers/integrations/deepspeed.py, trainer_config_process). */
typedef enum { AUTO_NONE, AUTO_H2, AUTO_09H2, AUTO_10H } AutoRule;

typedef struct {
    const char *key;
    KeyKind kind;
    size_t offset;     /* KEY_SIZE, KEY_FLAG: the ZpZeroConfig field */
    AutoRule autorule; /* KEY_SIZE */
    gboolean alias;    /* another name of a field listed before it; never written */
} KeySpec;

#define SIZE(k, f, a) {k, KEY_SIZE, G_STRUCT_OFFSET(ZpZeroConfig, f), a, FALSE}
#define SIZE_ALIAS(k, f, a) {k, KEY_SIZE, G_STRUCT_OFFSET(ZpZeroConfig, f), a, TRUE}
#define FLAG(k, f) {k, KEY_FLAG, G_STRUCT_OFFSET(ZpZeroConfig, f), AUTO_NONE, FALSE}
#define FLAG_ALIAS(k, f) {k, KEY_FLAG, G_STRUCT_OFFSET(ZpZeroConfig, f), AUTO_NONE, TRUE}
#define OWN(k) {k, KEY_OWN, 0, AUTO_NONE, FALSE}
#define IGNORED(k) {k, KEY_IGNORED, 0, AUTO_NONE, FALSE}

/* Top-level keys of deepspeed/runtime/config.py and constants.py. */
static const KeySpec top_keys[] = {
    OWN("train_batch_size"), OWN("train_micro_batch_size_per_gpu"),
    OWN("gradient_accumulation_steps"), OWN("fp16"), OWN("bf16"), OWN("bfloat16"),
    OWN("zero_optimization"), OWN("activation_checkpointing"), OWN("communication_data_type"),
    OWN("attention_kernel"), OWN("tensor_parallel"), OWN("pipeline"),
    OWN("sequence_parallel_size"),
    OWN("optimizer"), IGNORED("scheduler"), IGNORED("gradient_clipping"),
    IGNORED("steps_per_print"), IGNORED("wall_clock_breakdown"), IGNORED("memory_breakdown"),
    IGNORED("prescale_gradients"), IGNORED("gradient_predivide_factor"),
    IGNORED("sparse_gradients"), IGNORED("zero_allow_untested_optimizer"),
    IGNORED("zero_force_ds_cpu_optimizer"), IGNORED("amp"), IGNORED("dump_state"),
    IGNORED("tensorboard"), IGNORED("wandb"), IGNORED("csv_monitor"), IGNORED("comet"),
    IGNORED("flops_profiler"), IGNORED("autotuning"), IGNORED("elasticity"),
    OWN("data_types"),
    IGNORED("seq_parallel_communication_data_type"), IGNORED("disable_allgather"),
    IGNORED("dataloader_drop_last"), IGNORED("aio"), IGNORED("checkpoint"),
    IGNORED("data_efficiency"), IGNORED("curriculum_learning"),
    IGNORED("compression_training"), IGNORED("sparse_attention"), IGNORED("eigenvalue"),
    IGNORED("progressive_layer_drop"), IGNORED("quantize_training"), IGNORED("nebula"),
    IGNORED("use_node_local_storage"), IGNORED("load_universal_checkpoint"),
    IGNORED("weight_quantization"), IGNORED("hybrid_engine"), IGNORED("compile"),
    IGNORED("timers"), IGNORED("graph_harvesting"),
    /* more keys v0.19.6's DeepSpeedConfig reads (runtime/config.py, runtime/constants.py,
     * comm/constants.py) that move no bytes zplan counts for a dense model */
    IGNORED("comms_logger"), IGNORED("gradient_allreduce_op"), IGNORED("log_level"),
    IGNORED("managed_gradient_accumulation"), IGNORED("vocabulary_size"),
    OWN("expert_parallel"), IGNORED("use_data_before_expert_parallelism"),
    OWN("torch_autocast"),
};

/* zero_optimization (deepspeed/runtime/zero/config.py). DeepSpeed accepts the stage3_* keys
 * also under their field names (populate_by_name). */
static const KeySpec zero_keys[] = {
    OWN("stage"),
    SIZE("reduce_bucket_size", reduce_bucket_size, AUTO_H2),
    SIZE("allgather_bucket_size", allgather_bucket_size, AUTO_NONE),
    FLAG("overlap_comm", overlap_comm),
    FLAG("contiguous_gradients", contiguous_gradients),
    FLAG("reduce_scatter", reduce_scatter),
    SIZE("stage3_prefetch_bucket_size", stage3_prefetch_bucket_size, AUTO_09H2),
    SIZE("stage3_param_persistence_threshold", stage3_param_persistence_threshold, AUTO_10H),
    SIZE("stage3_max_live_parameters", stage3_max_live_parameters, AUTO_NONE),
    SIZE("stage3_max_reuse_distance", stage3_max_reuse_distance, AUTO_NONE),
    SIZE_ALIAS("prefetch_bucket_size", stage3_prefetch_bucket_size, AUTO_09H2),
    SIZE_ALIAS("param_persistence_threshold", stage3_param_persistence_threshold, AUTO_10H),
    SIZE_ALIAS("max_live_parameters", stage3_max_live_parameters, AUTO_NONE),
    SIZE_ALIAS("max_reuse_distance", stage3_max_reuse_distance, AUTO_NONE),
    SIZE("sub_group_size", sub_group_size, AUTO_NONE),
    FLAG("use_multi_rank_bucket_allreduce", use_multi_rank_bucket_allreduce),
    FLAG("stage3_allgather_sequential", stage3_allgather_sequential),
    FLAG_ALIAS("allgather_sequential", stage3_allgather_sequential),
    OWN("allgather_partitions"),
    OWN("offload_param"), OWN("offload_optimizer"), IGNORED("cpu_offload"),
    IGNORED("cpu_offload_param"), IGNORED("cpu_offload_use_pin_memory"),
    IGNORED("load_from_fp32_weights"), IGNORED("elastic_checkpoint"),
    IGNORED("stage3_gather_16bit_weights_on_model_save"),
    IGNORED("stage3_gather_fp16_weights_on_model_save"),
    IGNORED("gather_16bit_weights_on_model_save"),
    IGNORED("stage3_model_persistence_threshold"), IGNORED("model_persistence_threshold"),
    IGNORED("ignore_unused_parameters"), IGNORED("legacy_stage1"),
    IGNORED("round_robin_gradients"), OWN("zero_hpz_partition_size"),
    FLAG("zero_quantized_weights", zero_quantized_weights),
    IGNORED("zero_quantized_nontrainable_weights"),
    FLAG("zero_quantized_gradients", zero_quantized_gradients), IGNORED("zeropp_loco_param"),
    IGNORED("mics_shard_size"), IGNORED("mics_hierarchical_params_gather"),
    IGNORED("memory_efficient_linear"),
    IGNORED("stage3_module_granularity_threshold"), IGNORED("module_granularity_threshold"),
    FLAG("stage3_use_all_reduce_for_fetch_params", stage3_use_all_reduce_for_fetch_params),
    FLAG_ALIAS("use_all_reduce_for_fetch_params", stage3_use_all_reduce_for_fetch_params),
    IGNORED("pipeline_loading_checkpoint"),
    IGNORED("override_module_apply"), IGNORED("log_trace_cache_warnings"),
    /* ZenFlow's sparse CPU-offload updates, ZeRO-3 leaf modules fetched whole, and switches
     * that move no bytes in a step: accepted, listed as not modeled. */
    IGNORED("zenflow"), IGNORED("leaf_module"), IGNORED("enable_sanity_checks"),
    IGNORED("save_muon_momentum_buffer_in_memory"),
    /* zero.Init's chunked partitioning, a field of DeepSpeed's master after v0.19.6. */
    IGNORED("partition_stream_chunk_size"), IGNORED("stage3_partition_stream_chunk_size"),
};

/* tensor_parallel (DeepSpeed's AutoTP training, deepspeed/runtime/tensor_parallel/config.py):
 * autotp_size is the tensor-parallel degree; the rest is not modeled. */
static const KeySpec tensor_parallel_keys[] = {
    OWN("autotp_size"), IGNORED("tp_overlap_comm"), IGNORED("partition_config"),
    IGNORED("injection_policy_tuple"), IGNORED("keep_module_on_host"),
};

/* expert_parallel (DeepSpeed's AutoEP: deepspeed/module_inject/auto_ep_config.py
 * parse_autoep_config, engine.py _configure_expert_parallel): "enabled" and "autoep_size", the
 * expert-parallel degree, are read; "top_k" must be the model's where it is a number (zplan
 * routes the model's) and "expert_tensor_parallel_size" 1. The keys that only find the layers
 * (preset_model, the patterns, the weights' and config attributes' names, the shared experts')
 * have no bearing on a step and are taken silently, as are use_grouped_mm and
 * grouped_mm_backend where they keep the grouped GEMMs zplan prices (zp_inventory_moe); the
 * router's arithmetic (route_norm, score_func, ...) is not modeled. */
static const KeySpec expert_parallel_keys[] = {
    OWN("enabled"), OWN("autoep_size"), OWN("top_k"), OWN("expert_tensor_parallel_size"),
    OWN("preset_model"), OWN("moe_layer_pattern"), OWN("expert_pattern"),
    OWN("router_pattern"), OWN("expert_w1"), OWN("expert_w2"), OWN("expert_w3"),
    OWN("num_experts_attr"), OWN("top_k_attr"), OWN("has_shared_experts"),
    OWN("shared_experts_pattern"),
    OWN("use_grouped_mm"), OWN("grouped_mm_backend"), IGNORED("route_norm"),
    IGNORED("route_scale"), IGNORED("score_apply"), IGNORED("score_func"),
    IGNORED("num_expert_groups"), IGNORED("num_limited_groups"), IGNORED("load_balance_coeff"),
    IGNORED("routed_scaling_factor"),
};

/* pipeline (deepspeed/runtime/config.py get_pipeline_config: stages "auto", partition "best",
 * seed_layers, activation_checkpoint_interval 0, pipe_partitioned, grad_partitioned): the
 * stages and the checkpoint interval, and partition_method (the argument of PipelineModule,
 * deepspeed/runtime/pipe/module.py, that zplan keeps here: "uniform" or "parameters"), and
 * zplan's schedule and virtual_stages for a plan that is not 1F1B (`plan --3d` ranks
 * Megatron's interleaved schedule; DeepSpeed keeps the keys it does not know and runs
 * TrainSchedule, 1F1B). */
static const KeySpec pipeline_keys[] = {
    OWN("stages"), OWN("partition_method"), OWN("activation_checkpoint_interval"),
    OWN("schedule"), OWN("virtual_stages"),
    IGNORED("partition"), IGNORED("seed_layers"), IGNORED("pipe_partitioned"),
    IGNORED("grad_partitioned"),
};

/* fp16 and bf16: only "enabled" changes the plan; loss scaling is not modeled. */
static const KeySpec fp16_keys[] = {
    OWN("enabled"), IGNORED("auto_cast"), IGNORED("loss_scale"),
    IGNORED("initial_scale_power"), IGNORED("loss_scale_window"), IGNORED("hysteresis"),
    IGNORED("consecutive_hysteresis"), IGNORED("min_loss_scale"),
    IGNORED("fp16_master_weights_and_grads"),
};
static const KeySpec bf16_keys[] = {
    OWN("enabled"), IGNORED("immediate_grad_update"), IGNORED("check_grad_overflow"),
};
/* torch_autocast (runtime/config.py get_torch_autocast_*): fp32 weights, gradients and
 * states, the forward under torch.autocast; not modeled, so refused when enabled. */
static const KeySpec autocast_keys[] = {
    OWN("enabled"), IGNORED("dtype"), IGNORED("lower_precision_safe_modules"),
};

/* activation_checkpointing (deepspeed/runtime/activation_checkpointing/config.py): ZeRO-R's
 * options, read into the plan's ZpCheckpointConfig (zp_zeror models them); profile only
 * times the checkpointed functions, and warns when true. */
static const struct {
    const char *key;
    size_t offset;
} checkpoint_options[] = {
    {"partition_activations", G_STRUCT_OFFSET(ZpCheckpointConfig, partition_activations)},
    {"contiguous_memory_optimization",
     G_STRUCT_OFFSET(ZpCheckpointConfig, contiguous_memory_optimization)},
    {"cpu_checkpointing", G_STRUCT_OFFSET(ZpCheckpointConfig, cpu_checkpointing)},
    {"synchronize_checkpoint_boundary",
     G_STRUCT_OFFSET(ZpCheckpointConfig, synchronize_checkpoint_boundary)},
};
static const KeySpec checkpoint_keys[] = {
    OWN("partition_activations"), OWN("contiguous_memory_optimization"),
    OWN("cpu_checkpointing"), OWN("synchronize_checkpoint_boundary"), OWN("profile"),
    OWN("number_checkpoints"),
};

static const KeySpec *find_key(const KeySpec *table, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i].key, key) == 0)
            return &table[i];
    return NULL;
}

static void warn(GPtrArray *warnings, const char *what, const char *prefix, const char *key,
                 const char *why)
{
    g_ptr_array_add(warnings, g_strdup_printf("%s: \"%s%s\" ignored: %s", what, prefix, key, why));
}

/* Keys read but not modeled, and unknown top-level keys (which DeepSpeed ignores), are listed
 * in one line each: while a file is read they wait in `warnings` as entries starting with one
 * of these marks and the key, and merge_key_lists joins them at the end. */
#define MARK_UNMODELED '\x1f'
#define MARK_UNKNOWN '\x1e'

static void list_key(GPtrArray *warnings, char mark, const char *prefix, const char *key)
{
    g_ptr_array_add(warnings, g_strdup_printf("%c%s%s", mark, prefix, key));
}

static void merge_key_lists(GPtrArray *warnings, guint first, const char *what)
{
    const struct {
        char mark;
        const char *says;
    } lists[] = {{MARK_UNMODELED, "read but not modeled (ignored)"},
                 {MARK_UNKNOWN, "unknown top-level keys, which DeepSpeed ignores"}};
    GString *line[2] = {g_string_new(NULL), g_string_new(NULL)};
    for (guint i = first; i < warnings->len;) {
        const char *w = g_ptr_array_index(warnings, i);
        int l = w[0] == lists[0].mark ? 0 : w[0] == lists[1].mark ? 1 : -1;
        if (l < 0) {
            i++;
            continue;
        }
        g_string_append_printf(line[l], "%s%s", line[l]->len ? ", " : "", w + 1);
        g_ptr_array_remove_index(warnings, i);
    }
    for (int l = 0; l < 2; l++) {
        if (line[l]->len)
            g_ptr_array_add(warnings, g_strdup_printf("%s: %s: %s", what, lists[l].says,
                                                      line[l]->str));
        g_string_free(line[l], TRUE);
    }
}

static gboolean is_auto(json_t *value)
{
    return json_is_string(value) && strcmp(json_string_value(value), "auto") == 0;
}

/* Unknown keys fail; known unmodeled ones warn. `prefix` is "zero_optimization." etc. */
static gboolean check_section(json_t *obj, const char *what, const char *prefix,
                              const KeySpec *table, size_t n, GPtrArray *warnings,
                              GError **error)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value)
    {
        const KeySpec *spec = find_key(table, n, key);
        if (!spec && table == top_keys) { /* deepspeed/runtime/config.py reads what it knows */
            list_key(warnings, MARK_UNKNOWN, prefix, key);
            continue;
        }
        if (!spec) { /* a section's model (DeepSpeedConfigModel) forbids extra keys */
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: unknown key \"%s%s\"", what, prefix,
                        key);
            return FALSE;
        }
        if (spec->kind == KEY_IGNORED)
            list_key(warnings, MARK_UNMODELED, prefix, key);
    }
    return TRUE;
}

/* A section's value must be an object; *section is NULL when the key is absent. */
static gboolean get_section(json_t *root, const char *what, const char *key, json_t **section,
                            GError **error)
{
    *section = json_object_get(root, key);
    if (*section && !json_is_object(*section)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be an object", what, key);
        return FALSE;
    }
    return TRUE;
}

static double auto_size(AutoRule rule, double h)
{
    switch (rule) {
    case AUTO_H2:
        return h * h;
    case AUTO_09H2:
        return floor(0.9 * h * h);
    case AUTO_10H:
        return 10 * h;
    case AUTO_NONE:
        break;
    }
    return 0;
}

/* A whole number of elements, or "auto" where the Trainer has a rule for the key. */
static gboolean read_size(json_t *obj, const char *what, const KeySpec *spec,
                          const ZpModel *model, double *out, GError **error)
{
    json_t *value = json_object_get(obj, spec->key);
    if (is_auto(value)) {
        if (spec->autorule == AUTO_NONE) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"%s\" = \"auto\" has no Hugging Face rule; give a number",
                        what, spec->key);
            return FALSE;
        }
        if (!zp_model_has_architecture(model)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"%s\" = \"auto\" needs the model's hidden size (give --model)",
                        what, spec->key);
            return FALSE;
        }
        *out = auto_size(spec->autorule, (double)model->hidden);
        return TRUE;
    }
    int64_t n;
    if (!zp_json_get_int(obj, what, spec->key, TRUE, 0, MAX_ELEMS, &n, error))
        return FALSE;
    *out = (double)n;
    return TRUE;
}

/* Applies a section's KEY_SIZE and KEY_FLAG keys to *zero; a field named twice (a key and
 * its alias) fails. */
static gboolean apply_fields(json_t *obj, const char *what, const KeySpec *table, size_t n,
                             const ZpModel *model, ZpZeroConfig *zero, GError **error)
{
    for (size_t i = 0; i < n; i++) {
        const KeySpec *spec = &table[i];
        if ((spec->kind != KEY_SIZE && spec->kind != KEY_FLAG) ||
            !json_object_get(obj, spec->key))
            continue;
        for (size_t j = 0; j < i; j++)
            if (table[j].offset == spec->offset && table[j].kind == spec->kind &&
                json_object_get(obj, table[j].key)) {
                g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                            "%s: keys \"%s\" and \"%s\" name the same setting; give one", what,
                            table[j].key, spec->key);
                return FALSE;
            }
        void *field = G_STRUCT_MEMBER_P(zero, spec->offset);
        if (spec->kind == KEY_SIZE ? !read_size(obj, what, spec, model, field, error)
                                   : !zp_json_get_bool(obj, what, spec->key, TRUE, field, error))
            return FALSE;
    }
    return TRUE;
}

/* offload_optimizer and offload_param (zp_offload), then DeepSpeed's own checks of them
 * against the stage, naming the key. */
static gboolean read_offload(json_t *section, const char *path, ZpZeroConfig *zero,
                             GPtrArray *warnings, GError **error)
{
    static const char *const keys[2] = {"offload_optimizer", "offload_param"};
    ZpOffload *slots[2] = {&zero->offload_optimizer, &zero->offload_param};
    for (int i = 0; i < 2; i++) {
        char *what = g_strdup_printf("%s: zero_optimization.%s", path, keys[i]);
        const gboolean ok = zp_offload_from_json(json_object_get(section, keys[i]), what, i == 1,
                                                 slots[i], warnings, error);
        g_free(what);
        if (!ok)
            return FALSE;
    }
    ZpPlan probe;
    zp_plan_defaults(&probe, zero->stage, 1, 1);
    probe.zero = *zero;
    if (!zp_offload_check(&probe, error)) {
        g_prefix_error(error, "%s: zero_optimization.", path);
        return FALSE;
    }
    return TRUE;
}

static gboolean read_zero(json_t *root, const char *path, const ZpModel *model,
                          ZpZeroConfig *zero, GPtrArray *warnings, GError **error)
{
    json_t *section;
    if (!get_section(root, path, "zero_optimization", &section, error))
        return FALSE;
    if (!section) {
        zp_zero_config_defaults(zero, 0);
        return TRUE;
    }
    char *what = g_strdup_printf("%s: zero_optimization", path);
    int64_t stage = 0, hpz = 1;
    gboolean allgather_partitions = TRUE;
    gboolean ok = check_section(section, path, "zero_optimization.", zero_keys,
                                G_N_ELEMENTS(zero_keys), warnings, error) &&
                  zp_json_get_int(section, what, "stage", FALSE, 0, 3, &stage, error);
    if (ok) {
        zp_zero_config_defaults(zero, (int)stage);
        ok = apply_fields(section, what, zero_keys, G_N_ELEMENTS(zero_keys), model, zero,
                          error) &&
             zp_json_get_bool(section, what, "allgather_partitions", FALSE,
                              &allgather_partitions, error) &&
             zp_json_get_int(section, what, "zero_hpz_partition_size", FALSE, 0, 1 << 16, &hpz,
                             error) &&
             read_offload(section, path, zero, warnings, error);
        /* DeepSpeed accepts 0 (Field ge=0) and builds hpZ's group only above 1. */
        zero->zero_hpz_partition_size = (int)MAX(hpz, 1);
    }
    /* Checked above; only false changes what DeepSpeed does, which zplan does not model. */
    if (ok && !allgather_partitions)
        warn(warnings, path, "zero_optimization.", "allgather_partitions",
             "false is not modeled (zplan all-gathers the updated partitions)");
    g_free(what);
    return ok;
}

/* fp16/bf16 {"enabled": ...}; "auto" is enabled when the launch's precision is this one. */
static gboolean read_enabled(json_t *root, const char *path, const char *key,
                             const KeySpec *table, size_t n, ZpPrecision precision,
                             const ZpPlan *launch, gboolean *enabled, GPtrArray *warnings,
                             GError **error)
{
    json_t *section;
    *enabled = FALSE;
    if (!get_section(root, path, key, &section, error))
        return FALSE;
    if (!section)
        return TRUE;
    char *prefix = g_strdup_printf("%s.", key);
    char *what = g_strdup_printf("%s: %s", path, key);
    gboolean ok = check_section(section, path, prefix, table, n, warnings, error);
    if (ok && is_auto(json_object_get(section, "enabled")))
        *enabled = launch->precision == precision;
    else if (ok)
        ok = zp_json_get_bool(section, what, "enabled", FALSE, enabled, error);
    g_free(prefix);
    g_free(what);
    return ok;
}

static gboolean read_precision(json_t *root, const char *path, const ZpPlan *launch,
                               ZpPrecision *precision, GPtrArray *warnings, GError **error)
{
    gboolean fp16 = FALSE, bf16 = FALSE, bf16_old = FALSE;
    if (json_object_get(root, "bf16") && json_object_get(root, "bfloat16")) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: keys \"bf16\" and \"bfloat16\" name the same setting; give one", path);
        return FALSE;
    }
    if (!read_enabled(root, path, "fp16", fp16_keys, G_N_ELEMENTS(fp16_keys), ZP_PREC_FP16,
                      launch, &fp16, warnings, error) ||
        !read_enabled(root, path, "bf16", bf16_keys, G_N_ELEMENTS(bf16_keys), ZP_PREC_BF16,
                      launch, &bf16, warnings, error) ||
        !read_enabled(root, path, "bfloat16", bf16_keys, G_N_ELEMENTS(bf16_keys), ZP_PREC_BF16,
                      launch, &bf16_old, warnings, error))
        return FALSE;
    bf16 = bf16 || bf16_old;
    gboolean autocast = FALSE;
    if (!read_enabled(root, path, "torch_autocast", autocast_keys, G_N_ELEMENTS(autocast_keys),
                      ZP_PREC_FP32, launch, &autocast, warnings, error))
        return FALSE;
    if (autocast) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: torch_autocast.enabled (fp32 weights under torch.autocast) is not "
                    "modeled; give bf16 or fp16 instead", path);
        return FALSE;
    }
    if (fp16 && bf16) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: fp16.enabled and bf16.enabled are both true; DeepSpeed takes one", path);
        return FALSE;
    }
    *precision = fp16 ? ZP_PREC_FP16 : bf16 ? ZP_PREC_BF16 : ZP_PREC_FP32;
    return TRUE;
}

static gboolean read_checkpointing(json_t *root, const char *path, gboolean *checkpoint,
                                   ZpCheckpointConfig *options, GPtrArray *warnings,
                                   GError **error)
{
    json_t *section;
    *checkpoint = FALSE;
    memset(options, 0, sizeof *options);
    if (!get_section(root, path, "activation_checkpointing", &section, error))
        return FALSE;
    if (!section)
        return TRUE;
    *checkpoint = TRUE;
    char *what = g_strdup_printf("%s: activation_checkpointing", path);
    gboolean ok = check_section(section, path, "activation_checkpointing.", checkpoint_keys,
                                G_N_ELEMENTS(checkpoint_keys), warnings, error);
    for (size_t i = 0; ok && i < G_N_ELEMENTS(checkpoint_options); i++)
        ok = zp_json_get_bool(section, what, checkpoint_options[i].key, FALSE,
                              G_STRUCT_MEMBER_P(options, checkpoint_options[i].offset), error);
    int64_t number = 0;
    if (ok && (ok = zp_json_get_int(section, what, "number_checkpoints", FALSE, 0, MAX_BATCH,
                                    &number, error)))
        options->number_checkpoints = (int)number;
    gboolean profile = FALSE;
    if (ok && (ok = zp_json_get_bool(section, what, "profile", FALSE, &profile, error)) && profile)
        warn(warnings, path, "activation_checkpointing.", "profile",
             "true is not modeled (it times the checkpointed functions)");
    g_free(what);
    return ok;
}

/* tensor_parallel.autotp_size over the launch's degrees: the world stays dp x mp, split by the
 * file's degree; a launch that names another degree (not 1, the default) is refused. */
static gboolean read_tensor_parallel(json_t *root, const char *path, ZpPlan *p,
                                     GPtrArray *warnings, GError **error)
{
    json_t *section;
    if (!get_section(root, path, "tensor_parallel", &section, error))
        return FALSE;
    if (!section)
        return TRUE;
    char *what = g_strdup_printf("%s: tensor_parallel", path);
    int64_t size = p->mp;
    const int64_t world = (int64_t)p->dp * p->mp;
    gboolean ok = check_section(section, path, "tensor_parallel.", tensor_parallel_keys,
                                G_N_ELEMENTS(tensor_parallel_keys), warnings, error) &&
                  zp_json_get_int(section, what, "autotp_size", FALSE, 1, 65536, &size, error);
    if (ok && p->mp != 1 && size != p->mp) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: autotp_size %" G_GINT64_FORMAT " disagrees with the launch's "
                    "tensor-parallel degree %d", what, size, p->mp);
        ok = FALSE;
    } else if (ok && world % size != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: autotp_size %" G_GINT64_FORMAT " does not divide the %" G_GINT64_FORMAT
                    " GPUs", what, size, world);
        ok = FALSE;
    }
    if (ok) {
        p->mp = (int)size;
        p->dp = (int)(world / size);
    }
    g_free(what);
    return ok;
}

/* pipeline.stages over the launch's world (dp x mp x its stages): DeepSpeed's pipeline engine
 * runs 1F1B (TrainSchedule) with gradient_accumulation_steps micro-batches, the schedule
 * unless zplan's "schedule" (and "virtual_stages") say another; "auto" keeps the launch's
 * stages. activation_checkpoint_interval 1 checkpoints every block, 0 none; others (every
 * k-th layer) are not modeled and fail. */
static gboolean read_pipeline(json_t *root, const char *path, ZpPlan *p, GPtrArray *warnings,
                              GError **error)
{
    json_t *section;
    if (!get_section(root, path, "pipeline", &section, error))
        return FALSE;
    if (!section)
        return TRUE;
    char *what = g_strdup_printf("%s: pipeline", path);
    const int launch_pp = zp_plan_pp(p);
    const int64_t world = (int64_t)p->dp * p->mp * launch_pp;
    int64_t stages = launch_pp, interval = 0, virtual_stages = 1;
    const char *method = NULL, *schedule = NULL;
    ZpPipeSchedule pipe_schedule = ZP_PIPE_1F1B;
    gboolean ok = check_section(section, path, "pipeline.", pipeline_keys,
                                G_N_ELEMENTS(pipeline_keys), warnings, error) &&
                  (is_auto(json_object_get(section, "stages")) ||
                   zp_json_get_int(section, what, "stages", FALSE, 1, 65535, &stages, error)) &&
                  zp_json_get_int(section, what, "activation_checkpoint_interval", FALSE, 0,
                                  MAX_BATCH, &interval, error) &&
                  zp_json_get_string(section, what, "partition_method", FALSE, &method, error) &&
                  (!method || zp_partition_parse(method, "key \"partition_method\"",
                                                 &p->pipe.partition, error)) &&
                  zp_json_get_string(section, what, "schedule", FALSE, &schedule, error) &&
                  (!schedule || zp_pipe_schedule_parse(schedule, "key \"schedule\"",
                                                       &pipe_schedule, error)) &&
                  zp_json_get_int(section, what, "virtual_stages", FALSE, 1, 65535,
                                  &virtual_stages, error);
    if (!ok && (method || schedule))
        g_prefix_error(error, "%s: ", what);
    if (ok && (pipe_schedule == ZP_PIPE_INTERLEAVED) != (virtual_stages > 1)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: schedule \"%s\" with virtual_stages %" G_GINT64_FORMAT ": more than "
                    "one model chunk a stage is the interleaved schedule's, and it has two or "
                    "more", what, zp_pipe_schedule_name(pipe_schedule), virtual_stages);
        ok = FALSE;
    } else if (ok && interval > 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: activation_checkpoint_interval %" G_GINT64_FORMAT " is not modeled "
                    "(0: none, 1: every block)", what, interval);
        ok = FALSE;
    } else if (ok && world % ((int64_t)p->mp * stages) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: stages %" G_GINT64_FORMAT " x tensor-parallel %d does not divide the %"
                    G_GINT64_FORMAT " GPUs", what, stages, p->mp, world);
        ok = FALSE;
    }
    if (ok) {
        p->pipe.stages = (int)stages;
        p->pipe.schedule = pipe_schedule;
        p->pipe.virtual_stages = (int)virtual_stages;
        p->dp = (int)(world / ((int64_t)p->mp * stages));
        p->checkpoint = p->checkpoint || interval == 1;
    }
    g_free(what);
    return ok;
}

/* AutoEP over the launch's plan: autoep_size (with top_k and expert_tensor_parallel_size as
 * read) becomes the plan's expert-parallel degree, or the first thing it contradicts fails
 * naming the key: a launch EP other than 1 that disagrees, the launch's capacity factor (that
 * of a deepspeed.moe.layer.MoE in the model's code: AutoEP's router, TorchTitan's, routes
 * every token), a top_k not the model's, expert tensor parallelism, and a degree that does
 * not divide the experts and the stage's ranks (validate_autoep_config asks it of them;
 * AutoEP folds its EP groups over the tensor ranks, auto_ep_folding.py, as zplan lays out
 * DeepSpeed's whole experts: zp_plan_etp). */
static gboolean apply_autoep(const char *what, const ZpModel *model, int64_t size, int64_t top_k,
                             int64_t etp, ZpPlan *p, GError **error)
{
    const int64_t experts = model->moe.experts;
    char *bad = NULL;
    if (p->experts.ep != 1 && p->experts.ep != size)
        bad = g_strdup_printf("autoep_size %" G_GINT64_FORMAT " disagrees with the launch's "
                              "expert-parallel degree %d", size, p->experts.ep);
    else if (p->experts.capacity_factor > 0)
        bad = g_strdup_printf("enabled: AutoEP routes every token (TorchTitan's router, no "
                              "capacity), so the launch's capacity factor %g cannot apply",
                              p->experts.capacity_factor);
    else if (top_k && top_k != model->moe.top_k)
        bad = g_strdup_printf("top_k %" G_GINT64_FORMAT " is not %s's %" G_GINT64_FORMAT
                              " (zplan routes the model's top-k)", top_k, model->name,
                              model->moe.top_k);
    else if (etp != 1)
        bad = g_strdup_printf("expert_tensor_parallel_size %" G_GINT64_FORMAT " is not "
                              "modeled (1: each expert whole on its rank)", etp);
    else if (experts % size != 0 || ((int64_t)p->mp * p->dp) % size != 0)
        bad = g_strdup_printf("autoep_size %" G_GINT64_FORMAT " must divide the %" G_GINT64_FORMAT
                              " experts of %s and the %d ranks of a stage (TP %d x DP %d)",
                              size, experts, model->name, p->mp * p->dp, p->mp, p->dp);
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", what, bad);
        g_free(bad);
        return FALSE;
    }
    p->experts.ep = (int)size;
    return TRUE;
}

/* expert_parallel enabled (apply_autoep); absent or disabled, the launch's experts stand. A
 * dense model has no MoE block for AutoEP to replace: a warning. */
static gboolean read_expert_parallel(json_t *root, const char *path, const ZpModel *model,
                                     ZpPlan *p, GPtrArray *warnings, GError **error)
{
    json_t *section;
    if (!get_section(root, path, "expert_parallel", &section, error))
        return FALSE;
    if (!section)
        return TRUE;
    char *what = g_strdup_printf("%s: expert_parallel", path);
    gboolean enabled = FALSE, grouped = TRUE;
    const char *backend = NULL;
    int64_t size = 1, etp = 1, top_k = 0;
    gboolean ok = check_section(section, path, "expert_parallel.", expert_parallel_keys,
                                G_N_ELEMENTS(expert_parallel_keys), warnings, error) &&
                  zp_json_get_bool(section, what, "enabled", FALSE, &enabled, error) &&
                  zp_json_get_int(section, what, "autoep_size", FALSE, 1, 65536, &size, error) &&
                  zp_json_get_int(section, what, "expert_tensor_parallel_size", FALSE, 1, 65536,
                                  &etp, error) &&
                  (is_auto(json_object_get(section, "top_k")) ||
                   zp_json_get_int(section, what, "top_k", FALSE, 1, 1 << 20, &top_k, error)) &&
                  zp_json_get_bool(section, what, "use_grouped_mm", FALSE, &grouped, error) &&
                  zp_json_get_string(section, what, "grouped_mm_backend", FALSE, &backend, error);
    /* auto_ep_layer: without grouped_mm, or on the "sequential" backend, a rank's experts run
     * one GEMM each */
    if (ok && enabled && (!grouped || (backend && strcmp(backend, "sequential") == 0)))
        warn(warnings, path, "expert_parallel.", grouped ? "grouped_mm_backend" : "use_grouped_mm",
             "an expert's GEMMs one by one are not modeled: priced as one grouped GEMM");
    if (ok && enabled && !zp_moe_enabled(&model->moe))
        g_ptr_array_add(warnings, g_strdup_printf("%s: enabled, but %s is dense: AutoEP finds "
                                                  "no MoE block to replace (ignored)",
                                                  what, model->name));
    else if (ok && enabled)
        ok = apply_autoep(what, model, size, top_k, etp, p, error);
    g_free(what);
    return ok;
}

/* ---- batch ----------------------------------------------------------------------------- */

typedef struct {
    const char *key;
    int64_t value;
    gboolean given;
} BatchKey;

static gboolean read_batch_key(json_t *root, const char *path, BatchKey *k, int64_t auto_value,
                               GError **error)
{
    json_t *value = json_object_get(root, k->key);
    k->given = value != NULL && !json_is_null(value);
    if (is_auto(value)) {
        k->value = auto_value;
        return TRUE;
    }
    return zp_json_get_int(root, path, k->key, FALSE, 1, MAX_BATCH, &k->value, error);
}

/* DeepSpeed's _set_batch_related_parameters and _batch_assertion, with exact division. */
static gboolean resolve_batch(const char *path, int64_t dp, BatchKey *train, BatchKey *micro,
                              BatchKey *accum, GError **error)
{
    int64_t divisor = 0;
    const char *by = NULL;
    if (train->given && micro->given && !accum->given) {
        divisor = micro->value * dp, by = micro->key;
    } else if (train->given && accum->given && !micro->given) {
        divisor = accum->value * dp, by = accum->key;
    } else if (train->given && !micro->given) {
        divisor = dp, accum->value = 1;
    } else if (micro->given && !train->given) {
        if (!accum->given)
            accum->value = 1;
        train->value = micro->value * accum->value * dp;
    } else if (!train->given) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed "
                    "needs one of them)", path);
        return FALSE;
    }
    if (divisor) {
        if (train->value % divisor != 0) {
            char *factor = by ? g_strdup_printf("%s %" G_GINT64_FORMAT " x ", by, divisor / dp)
                              : g_strdup("");
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: train_batch_size = %" G_GINT64_FORMAT " is not a multiple of %sthe "
                        "data-parallel degree %" G_GINT64_FORMAT,
                        path, train->value, factor, dp);
            g_free(factor);
            return FALSE;
        }
        const int64_t rest = train->value / divisor;
        if (by == micro->key)
            accum->value = rest;
        else
            micro->value = rest;
    }
    if (train->value != micro->value * accum->value * dp) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: train_batch_size = %" G_GINT64_FORMAT " but train_micro_batch_size_per_gpu"
                    " %" G_GINT64_FORMAT " x gradient_accumulation_steps %" G_GINT64_FORMAT
                    " x the data-parallel degree %" G_GINT64_FORMAT " = %" G_GINT64_FORMAT,
                    path, train->value, micro->value, accum->value, dp,
                    micro->value * accum->value * dp);
        return FALSE;
    }
    return TRUE;
}

/* ---- the whole file -------------------------------------------------------------------- */

/* communication_data_type (DeepSpeed: "fp32", "fp16", "bf16" or its old "bfp16") and
 * attention_kernel (zplan's; DeepSpeed ignores unknown top-level keys) over the launch's. */
static gboolean read_kernels(json_t *root, const char *what, ZpPlan *p, GError **error)
{
    const char *dtype = NULL, *kernel = NULL;
    char *key = g_strdup_printf("%s: communication_data_type", what);
    gboolean ok = zp_json_get_string(root, what, "communication_data_type", FALSE, &dtype,
                                     error) &&
                  (!dtype || zp_reduce_dtype_parse(strcmp(dtype, "bfp16") == 0 ? "bf16" : dtype,
                                                   key, &p->reduce_dtype, error)) &&
                  zp_json_get_string(root, what, "attention_kernel", FALSE, &kernel, error);
    g_free(key);
    key = g_strdup_printf("%s: attention_kernel", what);
    ok = ok && (!kernel || zp_attention_parse(kernel, key, &p->attention, error));
    g_free(key);
    return ok;
}

/* The engine's optimizer and gradient accumulation (zp_dsconfig_engine): their sections. */
static gboolean read_engine(json_t *root, const char *what, ZpPlan *p, GError **error)
{
    json_t *data_types, *optimizer;
    return get_section(root, what, "data_types", &data_types, error) &&
           get_section(root, what, "optimizer", &optimizer, error) &&
           zp_dsconfig_engine_read(data_types, optimizer, what, p, error);
}

/* sequence_parallel_size: DeepSpeed-Ulysses' degree, by which DeepSpeedConfig.__init__
 * (runtime/config.py) divides the world for the data-parallel batch. zplan does not model
 * sequence parallelism (its all-to-alls, activations split by sequence), so only 1 passes. */
static gboolean read_sequence_parallel(json_t *root, const char *what, GError **error)
{
    int64_t sp = 1;
    if (!zp_json_get_int(root, what, "sequence_parallel_size", FALSE, 1, 1 << 20, &sp, error))
        return FALSE;
    if (sp != 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: sequence_parallel_size %" G_GINT64_FORMAT " (DeepSpeed-Ulysses sequence "
                    "parallelism) is not modeled; only 1 is accepted", what, sp);
        return FALSE;
    }
    return TRUE;
}

static gboolean from_json(void *json_object, const char *what, const ZpModel *model,
                          const ZpPlan *launch, ZpPlan *plan, int64_t *train_batch_size,
                          GPtrArray *warnings, GError **error);

gboolean zp_dsconfig_from_json(void *json_object, const char *what, const ZpModel *model,
                               const ZpPlan *launch, ZpPlan *plan, int64_t *train_batch_size,
                               GPtrArray *warnings, GError **error)
{
    const guint first = warnings->len;
    const gboolean ok = from_json(json_object, what, model, launch, plan, train_batch_size,
                                  warnings, error);
    merge_key_lists(warnings, first, what);
    return ok;
}

static gboolean from_json(void *json_object, const char *what, const ZpModel *model,
                          const ZpPlan *launch, ZpPlan *plan, int64_t *train_batch_size,
                          GPtrArray *warnings, GError **error)
{
    json_t *root = json_object;
    if (!json_is_object(root)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE, "%s: top level must be a JSON object", what);
        return FALSE;
    }
    if (launch->dp < 1 || launch->mp < 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: the launch's data- and tensor-parallel degrees must be at least 1", what);
        return FALSE;
    }
    ZpPlan p = *launch;
    if (!read_sequence_parallel(root, what, error) ||
        !read_tensor_parallel(root, what, &p, warnings, error) ||
        !read_checkpointing(root, what, &p.checkpoint, &p.ckpt, warnings, error) ||
        !read_pipeline(root, what, &p, warnings, error) ||
        !read_expert_parallel(root, what, model, &p, warnings, error))
        return FALSE;
    const int64_t dp = p.dp;
    BatchKey train = {"train_batch_size", 0, FALSE};
    BatchKey micro = {"train_micro_batch_size_per_gpu", 0, FALSE};
    BatchKey accum = {"gradient_accumulation_steps", 0, FALSE};
    /* No batch key at all: the launcher supplies the batch (Accelerate fills
     * train_micro_batch_size_per_gpu from its dataloader, the Trainer its accumulation). */
    const gboolean no_batch = !json_object_get(root, train.key) &&
                              !json_object_get(root, micro.key) &&
                              !json_object_get(root, accum.key);
    if (!check_section(root, what, "", top_keys, G_N_ELEMENTS(top_keys), warnings, error) ||
        !read_batch_key(root, what, &train,
                        (int64_t)launch->micro_batch * launch->grad_accum * dp, error) ||
        !read_batch_key(root, what, &micro, launch->micro_batch, error) ||
        !read_batch_key(root, what, &accum, launch->grad_accum, error))
        return FALSE;
    if (no_batch) {
        micro = (BatchKey){micro.key, launch->micro_batch, TRUE};
        accum = (BatchKey){accum.key, launch->grad_accum, TRUE};
    }
    if (!resolve_batch(what, dp, &train, &micro, &accum, error) ||
        !read_precision(root, what, launch, &p.precision, warnings, error) ||
        !read_zero(root, what, model, &p.zero, warnings, error) ||
        !read_engine(root, what, &p, error) || !read_kernels(root, what, &p, error))
        return FALSE;
    if (micro.value > MAX_BATCH || accum.value > MAX_BATCH) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: train_micro_batch_size_per_gpu or gradient_accumulation_steps beyond %lld",
                    what, MAX_BATCH);
        return FALSE;
    }
    p.micro_batch = (int)micro.value;
    p.grad_accum = (int)accum.value;
    *plan = p;
    *train_batch_size = train.value;
    return TRUE;
}

gboolean zp_dsconfig_read(const char *path, const ZpModel *model, const ZpPlan *launch,
                          ZpPlan *plan, int64_t *train_batch_size, GPtrArray *warnings,
                          GError **error)
{
    json_t *root = zp_json_load_object(path, error);
    gboolean ok = root && zp_dsconfig_from_json(root, path, model, launch, plan,
                                                train_batch_size, warnings, error);
    json_decref(root);
    return ok;
}

void zp_dsconfig_defaults_taken(void *json_object, const ZpPlan *plan, GPtrArray *taken)
{
    json_t *root = json_object;
    static const char *const batch_keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                             "gradient_accumulation_steps"};
    int given = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(batch_keys); i++)
        given += json_object_get(root, batch_keys[i]) != NULL;
    /* Two batch keys determine the third; with fewer, what is absent was filled in (by the
     * launch, as Accelerate does, or by DeepSpeed's 1 for the accumulation). */
    if (given < 2 && !json_object_get(root, batch_keys[1]))
        g_ptr_array_add(taken, g_strdup_printf("train_micro_batch_size_per_gpu = %d (the launch's "
                                               "--micro-batch, 1 unless given)",
                                               plan->micro_batch));
    if (given < 2 && !json_object_get(root, batch_keys[2]))
        g_ptr_array_add(taken, g_strdup_printf("gradient_accumulation_steps = %d%s",
                                               plan->grad_accum,
                                               given == 0 ? " (the launch's --grad-accum, 1 "
                                                            "unless given)"
                                                          : " (DeepSpeed's default)"));
    if (!json_object_get(root, "fp16") && !json_object_get(root, "bf16") &&
        !json_object_get(root, "bfloat16"))
        g_ptr_array_add(taken, g_strdup("precision fp32 (neither fp16 nor bf16 is enabled)"));
    json_t *zero = json_object_get(root, "zero_optimization");
    if (!json_is_object(zero) || !json_object_get(zero, "stage"))
        g_ptr_array_add(taken, g_strdup("zero_optimization.stage = 0 (DeepSpeed's default)"));
}

void zp_dsconfig_hf_auto(const ZpModel *model, ZpZeroConfig *zero)
{
    for (size_t i = 0; i < G_N_ELEMENTS(zero_keys); i++)
        if (zero_keys[i].autorule != AUTO_NONE && !zero_keys[i].alias)
            G_STRUCT_MEMBER(double, zero, zero_keys[i].offset) =
                auto_size(zero_keys[i].autorule, (double)model->hidden);
}

void *zp_dsconfig_to_json(const ZpPlan *plan)
{
    const json_int_t micro = plan->micro_batch, accum = plan->grad_accum;
    json_t *root = json_pack("{s:I, s:I, s:I}", "train_batch_size", micro * accum * plan->dp,
                             "train_micro_batch_size_per_gpu", micro,
                             "gradient_accumulation_steps", accum);
    if (plan->precision != ZP_PREC_FP32)
        json_object_set_new(root, plan->precision == ZP_PREC_FP16 ? "fp16" : "bf16",
                            json_pack("{s:b}", "enabled", TRUE));
    json_t *zero = json_pack("{s:i}", "stage", plan->zero.stage);
    for (size_t i = 0; i < G_N_ELEMENTS(zero_keys); i++) {
        const KeySpec *spec = &zero_keys[i];
        if (spec->alias)
            continue;
        if (spec->kind == KEY_SIZE)
            json_object_set_new(zero, spec->key,
                                json_integer((json_int_t)llround(
                                    G_STRUCT_MEMBER(double, &plan->zero, spec->offset))));
        else if (spec->kind == KEY_FLAG)
            json_object_set_new(zero, spec->key,
                                json_boolean(G_STRUCT_MEMBER(gboolean, &plan->zero, spec->offset)));
    }
    json_object_set_new(zero, "zero_hpz_partition_size",
                        json_integer(plan->zero.zero_hpz_partition_size));
    zp_offload_add_json(zero, &plan->zero.offload_optimizer, &plan->zero.offload_param);
    json_object_set_new(root, "zero_optimization", zero);
    /* SGD as read_optimizer reads it back (Adam, DeepSpeed's and the Trainer's default, and
     * 8-bit Adam, a client's bitsandbytes optimizer no config names, are left to the code) */
    if (plan->optimizer == ZP_OPT_SGD || plan->optimizer == ZP_OPT_SGD_MOMENTUM)
        json_object_set_new(root, "optimizer",
                            plan->optimizer == ZP_OPT_SGD
                                ? json_pack("{s:s}", "type", "SGD")
                                : json_pack("{s:s, s:{s:f}}", "type", "SGD", "params", "momentum",
                                            0.9));
    json_object_set_new(root, "tensor_parallel", json_pack("{s:i}", "autotp_size", plan->mp));
    if (plan->reduce_dtype != ZP_REDUCE_GRAD)
        json_object_set_new(root, "communication_data_type",
                            json_string(zp_reduce_dtype_name(plan->reduce_dtype)));
    json_object_set_new(root, "attention_kernel", json_string(zp_attention_name(plan->attention)));
    /* Expert parallelism as AutoEP's: every token routed. A capacity factor is a
     * deepspeed.moe.layer.MoE's, whose ep_size is set in the model's code, not here. */
    if (plan->experts.ep > 1 && plan->experts.capacity_factor <= 0)
        json_object_set_new(root, "expert_parallel", json_pack("{s:b, s:i}", "enabled", TRUE,
                                                               "autoep_size", plan->experts.ep));
    if (zp_plan_pp(plan) > 1) {
        json_t *pipe = json_pack("{s:i, s:s, s:i}", "stages", zp_plan_pp(plan),
                                 "partition_method", zp_partition_name(plan->pipe.partition),
                                 "activation_checkpoint_interval", plan->checkpoint ? 1 : 0);
        /* Another schedule than DeepSpeed's 1F1B in zplan's keys, so that the file reads back
         * as the plan (an interleaved plan 1 read back as 1F1B: 33.60 s -> 35.23 s). */
        if (plan->pipe.schedule != ZP_PIPE_1F1B || zp_plan_vstages(plan) > 1) {
            json_object_set_new(pipe, "schedule",
                                json_string(zp_pipe_schedule_name(plan->pipe.schedule)));
            json_object_set_new(pipe, "virtual_stages", json_integer(zp_plan_vstages(plan)));
        }
        json_object_set_new(root, "pipeline", pipe);
    }
    if (plan->checkpoint) {
        /* number_checkpoints only when set: DeepSpeed's default is None (one per layer). */
        json_t *ckpt = json_object();
        if (plan->ckpt.number_checkpoints)
            json_object_set_new(ckpt, "number_checkpoints",
                                json_integer(plan->ckpt.number_checkpoints));
        for (size_t i = 0; i < G_N_ELEMENTS(checkpoint_options); i++)
            json_object_set_new(ckpt, checkpoint_options[i].key,
                                json_boolean(G_STRUCT_MEMBER(gboolean, &plan->ckpt,
                                                             checkpoint_options[i].offset)));
        json_object_set_new(root, "activation_checkpointing", ckpt);
    }
    return root;
}

gboolean zp_dsconfig_write(const ZpPlan *plan, const char *path, GError **error)
{
    json_t *root = zp_dsconfig_to_json(plan);
    gboolean ok = zp_json_write(root, path, error);
    json_decref(root);
    return ok;
}
