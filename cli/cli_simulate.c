/* cli_simulate: `zplan simulate`, `zplan report` and `zplan schedule`: the flags into a plan, the
 * plan into one step's schedule, the schedule through the simulator (printed by cli_simulate_out). */
#include "cli.h"
#include "cli_moe.h"
#include "cli_pipe.h"
#include "cli_progress.h"
#include "cli_simulate_out.h"
#include "sim_coll.h"
#include "sim_trace.h"
#include "zp_cost.h"
#include "zp_dsconfig.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_megatron_args.h"
#include "zp_offload.h"
#include "zp_outpath.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GB 1e9

/* The flags as given (NULL when absent); the plan is built from them in one place. */
typedef struct {
    char *model, *cluster, *gpus, *stage, *micro_batch, *mp, *grad_accum;
    char *reduce_bucket, *allgather_bucket, *prefetch_bucket, *max_live, *persistence;
    char *precision, *optimizer, *trace, *ds_config, *out, *seq, *attention, *reduce_dtype;
    char *recompute, *megatron_args;
    char *ep, *capacity_factor, *expert_skew; /* --ep, --capacity-factor, --expert-skew */
    char *moe_dispatcher;                     /* --moe-dispatcher alltoall|allgather */
    char *expert_tp;                          /* --expert-tp: 1 or the TP degree */
    char *impl;     /* --impl deepspeed|fsdp|paper */
    char *kernels;  /* simulate --kernels NAME: the kernel inventory (zp_inventory) */
    char *gpu_memory; /* --gpu-memory: the cluster's GPUs with this memory */
    char *html;       /* --html OUT.html: the step as a page (cli_report) */
    char *schedule; /* simulate --schedule FILE: the ops from a file, no model or plan flags */
    char *hpz;      /* --hpz-partition-size */
    gboolean partition_activations, cpu_checkpointing, contiguous_memory; /* ZeRO-R */
    gboolean quantized_weights, quantized_gradients;                      /* ZeRO++ */
    char *offload_optimizer, *offload_param, *nvme_path;
    CliOffloadTuning tuning; /* --sub-group-size, --max-in-cpu, --buffer-count */
    CliBudget budget;        /* --tokens or --steps, --gpu-hour-price */
    gboolean checkpoint, overlap, no_overlap, no_dropout, explicit_ranks, json, no_fold;
    gboolean overlap_param_gather, no_main_grad, p2p_sync;
    char **slow_ranks, **slow_links; /* --slow-rank R:FACTOR, --slow-link NODE:FACTOR */
    CliPipeFlags pipe; /* --pp, --pp-schedule, --virtual-stages, --partition-method, --sequence-parallel */
    GPtrArray *defaults_taken; /* what --ds-config left unset, as read (--json: defaults_taken) */
    const char *command; /* the command whose name errors carry: "simulate", "validate" */
    CliSimulatedFn sink; /* cli_simulate_into: the result goes here, not to stdout */
    void *sink_ctx;
} SimulateFlags;

static gboolean required(const char *text, const char *usage, GError **error)
{
    if (!text)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s is required", usage);
    return text != NULL;
}

/* The model as trained: --no-dropout drops the dropout masks and outputs from the activation
 * memory, as for zreal's GPT, which trains without dropout. */
static gboolean load_model(const SimulateFlags *f, ZpModel *model, GError **error)
{
    if (!required(f->model, "--model NAME|PATH.json", error) ||
        !zp_model_load(f->model, model, error) || !cli_seq(f->seq, model, error))
        return FALSE;
    if (f->no_dropout)
        model->dropout = FALSE;
    return TRUE;
}

static gboolean overlap_flag(const SimulateFlags *f, ZpZeroConfig *zero, GError **error)
{
    if (f->overlap && f->no_overlap) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--overlap and --no-overlap: give one of them, not both");
        return FALSE;
    }
    if (f->overlap || f->no_overlap)
        zero->overlap_comm = f->overlap;
    return TRUE;
}

/* DeepSpeed's size knobs as given, set on the plan; those its implementation has no setting
 * for are refused (cli_knobs_read). */
static gboolean zero_size_flags(const SimulateFlags *f, ZpPlan *plan, GError **error)
{
    const char *texts[ZP_KNOB_N] = {
        [ZP_KNOB_REDUCE_BUCKET] = f->reduce_bucket, [ZP_KNOB_ALLGATHER_BUCKET] = f->allgather_bucket,
        [ZP_KNOB_PREFETCH_BUCKET] = f->prefetch_bucket, [ZP_KNOB_MAX_LIVE] = f->max_live,
        [ZP_KNOB_PERSISTENCE] = f->persistence};
    for (int k = 0; k < ZP_KNOB_N; k++)
        if (texts[k] && !zp_zero_knob_set(&plan->zero, (ZpZeroKnob)k, texts[k], error))
            return FALSE;
    return cli_knobs_read(plan->impl, texts, error);
}

/* The flags that say a plan, and which other source of the plan refuses them rather than
 * silently overriding it: a DeepSpeed config says the ZeRO and batch choices (the degrees,
 * precision and model still come from flags); a schedule file says everything. */
enum { FROM_DS_CONFIG = 1, FROM_SCHEDULE = 2, FROM_BOTH = 3, FROM_MEGATRON = 4 };

static gboolean refuse_plan_flags(const SimulateFlags *f, int source, const char *why,
                                  GError **error)
{
    const struct {
        const char *flag;
        gboolean given;
        int refused_by;
    } plan_flags[] = {
        {"--model", f->model != NULL, FROM_SCHEDULE}, {"--gpus", f->gpus != NULL, FROM_SCHEDULE},
        {"--mp", f->mp != NULL, FROM_SCHEDULE | FROM_MEGATRON}, {"--stage", f->stage != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--micro-batch", f->micro_batch != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--grad-accum", f->grad_accum != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--ds-config", f->ds_config != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--checkpoint", f->checkpoint, FROM_SCHEDULE | FROM_MEGATRON},
        {"--recompute", f->recompute != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--precision", f->precision != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--optimizer", f->optimizer != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--seq", f->seq != NULL, FROM_SCHEDULE},
        {"--attention", f->attention != NULL, FROM_SCHEDULE},
        {"--reduce-dtype", f->reduce_dtype != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--impl", f->impl != NULL, FROM_SCHEDULE},
        {"--overlap", f->overlap, FROM_BOTH | FROM_MEGATRON},
        {"--overlap-param-gather", f->overlap_param_gather, FROM_BOTH | FROM_MEGATRON}, {"--no-overlap", f->no_overlap, FROM_BOTH | FROM_MEGATRON},
        {"--no-dropout", f->no_dropout, FROM_SCHEDULE},
        {"--no-main-grad", f->no_main_grad, FROM_SCHEDULE},
        {"--p2p-sync", f->p2p_sync, FROM_SCHEDULE},
        {"--reduce-bucket-size", f->reduce_bucket != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--allgather-bucket-size", f->allgather_bucket != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--prefetch-bucket-size", f->prefetch_bucket != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--max-live-parameters", f->max_live != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--persistence-threshold", f->persistence != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--partition-activations", f->partition_activations, FROM_BOTH | FROM_MEGATRON},
        {"--cpu-checkpointing", f->cpu_checkpointing, FROM_BOTH | FROM_MEGATRON},
        {"--contiguous-memory", f->contiguous_memory, FROM_BOTH | FROM_MEGATRON},
        {"--quantized-weights", f->quantized_weights, FROM_BOTH | FROM_MEGATRON},
        {"--quantized-gradients", f->quantized_gradients, FROM_BOTH | FROM_MEGATRON},
        {"--hpz-partition-size", f->hpz != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--pp", f->pipe.pp != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--pp-schedule", f->pipe.schedule != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--virtual-stages", f->pipe.virtual_stages != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--partition-method", f->pipe.partition != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--sequence-parallel", f->pipe.sequence_parallel, FROM_SCHEDULE | FROM_MEGATRON},
        /* DeepSpeed's pipeline topology is tp-dp-pp, Megatron's flag its own */
        {"--rank-order", f->pipe.rank_order != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--offload-optimizer", f->offload_optimizer != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--offload-param", f->offload_param != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--nvme-path", f->nvme_path != NULL, FROM_BOTH | FROM_MEGATRON},
        /* beside --ds-config, a deepspeed.moe.layer.MoE's (the model's code) or AutoEP's
         * degree again (zp_dsconfig: expert_parallel); Megatron's are its flags
         * (--expert-model-parallel-size, --moe-expert-capacity-factor); the skew is no
         * framework's setting but the routing's load, beside either */
        {"--ep", f->ep != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--capacity-factor", f->capacity_factor != NULL, FROM_SCHEDULE | FROM_MEGATRON},
        {"--expert-skew", f->expert_skew != NULL, FROM_SCHEDULE},
        /* Megatron's is --moe-token-dispatcher-type; DeepSpeed's experts take the all-to-all */
        {"--moe-dispatcher", f->moe_dispatcher != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--expert-tp", f->expert_tp != NULL, FROM_BOTH | FROM_MEGATRON},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(plan_flags); i++)
        if (plan_flags[i].given && (plan_flags[i].refused_by & source)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", plan_flags[i].flag, why);
            return FALSE;
        }
    return TRUE;
}

/* A flag given beside --ds-config must agree with the value the file gives (its "auto" took
 * the flag's value already). */
static gboolean agrees(const char *flag, const char *given, int flag_value, const char *key,
                       int file_value, const char *path, GError **error)
{
    if (!given || flag_value == file_value)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s %d contradicts %s's %s %d; give one of them",
                flag, flag_value, path, key, file_value);
    return FALSE;
}

/* agrees() for a kernel's name: --attention or --reduce-dtype against the file's
 * attention_kernel or communication_data_type (dropped in silence otherwise). */
static gboolean names_agree(const char *flag, const char *given, const char *flag_name,
                            const char *key, const char *file_name, const char *path,
                            GError **error)
{
    if (!given || strcmp(flag_name, file_name) == 0)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s %s contradicts %s's %s %s; give one of them",
                flag, flag_name, path, key, file_name);
    return FALSE;
}

/* Whether the plan's attention kernel must run where zplan prices it (zp_hw_attention_check):
 * not for `schedule`, whose ops zreal runs with its own blockwise kernel, in any dtype (fp32 on
 * the CPU included). */
static gboolean kernel_checked(const SimulateFlags *f)
{
    return strcmp(f->command, "schedule") != 0;
}

/* A warning of a config's, one line (a key may hold a newline or a megabyte). */
static void print_warning(const char *warning)
{
    char *line = cli_one_line(warning);
    fprintf(stderr, "zplan: warning: %s\n", line);
    g_free(line);
}

/* --ds-config FILE: the plan is the user's DeepSpeed config, with the degrees (--gpus, --mp,
 * and a mixture of experts' --ep, --capacity-factor and --expert-skew, which a
 * deepspeed.moe.layer.MoE takes in the model's code) and, for "auto" (as the Hugging Face
 * Trainer fills it from its arguments), --micro-batch, --grad-accum, --precision and the
 * optimizer from the flags; --checkpoint turns
 * checkpointing on (the Trainer's gradient_checkpointing lives outside the config). A flag
 * that contradicts a concrete value of the file is an error naming both; the ZeRO knobs'
 * flags would say the plan a second time and are refused. */
static gboolean ds_config_plan(const SimulateFlags *f, const ZpModel *model, const ZpHw *hw,
                               ZpPlan *plan, GError **error)
{
    if (!refuse_plan_flags(f, FROM_DS_CONFIG,
                           "the plan comes from --ds-config; set it in the file instead", error))
        return FALSE;
    int gpus = 0, mp = 1, pp = 1;
    ZpPlan launch;
    if (!(required(f->gpus, "--gpus N", error) &&
          cli_int(f->gpus, "--gpus", 1, CLI_MAX_GPUS, 0, &gpus, error) &&
          cli_int(f->mp, "--mp", 1, 65536, 1, &mp, error) &&
          cli_check_mp(mp, gpus, model, error) && cli_pipe_stages(&f->pipe, gpus, mp, &pp, error)))
        return FALSE;
    zp_plan_defaults(&launch, 0, gpus / (mp * pp), mp);
    if (!cli_pipe_plan(&f->pipe, pp, &launch, error))
        return FALSE;
    if (!cli_precision_optimizer(f->precision, f->optimizer, model, hw, &launch.precision,
                                 &launch.optimizer, error) ||
        !cli_int(f->micro_batch, "--micro-batch", 1, 1e6, 1, &launch.micro_batch, error) ||
        !cli_int(f->grad_accum, "--grad-accum", 1, 1e6, 1, &launch.grad_accum, error) ||
        !cli_moe_parse(model, f->ep, f->capacity_factor, f->expert_skew, &launch.experts, error))
        return FALSE;
    ZpPlan kernels = launch;
    if (!cli_attention_reduce(f->attention, f->reduce_dtype, hw, launch.precision, &kernels,
                              error))
        return FALSE;
    launch.attention = kernels.attention;
    launch.reduce_dtype = kernels.reduce_dtype;
    if (f->impl && !zp_impl_parse(f->impl, "--impl", &launch.impl, error))
        return FALSE;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    int64_t train_batch = 0;
    json_t *config = zp_json_load_object(f->ds_config, error);
    gboolean ok = config && zp_dsconfig_from_json(config, f->ds_config, model, &launch, plan,
                                                  &train_batch, warnings, error);
    if (ok)
        zp_dsconfig_defaults_taken(config, plan, f->defaults_taken);
    const gboolean config_kernel = config && json_object_get(config, "attention_kernel");
    json_decref(config);
    ok = ok &&
         agrees("--micro-batch", f->micro_batch, launch.micro_batch,
                "train_micro_batch_size_per_gpu", plan->micro_batch, f->ds_config, error) &&
         agrees("--grad-accum", f->grad_accum, launch.grad_accum, "gradient_accumulation_steps",
                plan->grad_accum, f->ds_config, error);
    if (ok && f->precision && plan->precision != launch.precision) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--precision %s contradicts %s's %s; give one of them", f->precision,
                    f->ds_config,
                    plan->precision == ZP_PREC_FP32 ? "fp32 (neither fp16 nor bf16 enabled)"
                                                    : plan->precision == ZP_PREC_FP16
                                                          ? "fp16.enabled"
                                                          : "bf16.enabled");
        ok = FALSE;
    }
    ok = ok &&
         names_agree("--attention", f->attention, zp_attention_name(launch.attention),
                     "attention_kernel", zp_attention_name(plan->attention), f->ds_config,
                     error) &&
         names_agree("--reduce-dtype", f->reduce_dtype, zp_reduce_dtype_name(launch.reduce_dtype),
                     "communication_data_type", zp_reduce_dtype_name(plan->reduce_dtype),
                     f->ds_config, error) &&
         names_agree("--optimizer", f->optimizer, zp_optimizer_name(launch.optimizer),
                     "optimizer.type", zp_optimizer_name(plan->optimizer), f->ds_config, error);
    /* The config's fp16/bf16 sections may change the launch's precision: where no one named a
     * kernel, PyTorch SDPA's choice follows the dtype the step runs in; a named one must run
     * in it (zp_hw_attention_check: FlashAttention takes no fp32). */
    if (ok && !f->attention && !config_kernel && plan->precision != launch.precision) {
        /* The defaults line spoke of the launch's dtype and kernel: say the config's. */
        cli_attention_default(hw, plan->precision, plan);
    } else if (ok && config_kernel) {
        cli_default_retract("--attention");
    }
    if (ok && plan->precision != launch.precision)
        cli_default_retract("--precision");
    char *key = f->attention ? g_strdup("--attention")
                             : g_strdup_printf("%s: attention_kernel", f->ds_config);
    if (ok && kernel_checked(f))
        ok = zp_hw_attention_runs(hw, plan->attention, plan->precision, key, error);
    /* `schedule` writes what zreal runs: a kernel named mem-efficient (PyTorch's SDPA kernel)
     * is refused; where it is only the default, simulate_plan takes eager instead */
    if (ok && !kernel_checked(f) && plan->attention == ZP_ATTN_MEM_EFFICIENT &&
        (f->attention || config_kernel)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: zreal does not run mem-efficient (PyTorch's memory-efficient SDPA "
                    "kernel); use eager or flash2 (its own blockwise kernel)", key);
        ok = FALSE;
    }
    g_free(key);
    if (ok && (f->checkpoint || f->recompute))
        ok = cli_recompute(f->recompute, f->checkpoint, plan, error);
    /* A simulated step times a CPU optimizer by the profile's rate: a profile without one
     * refuses the config's offload here, before its warnings, not after them (`schedule`
     * simulates nothing). */
    double cpu_s;
    if (ok && hw && kernel_checked(f) && plan->zero.offload_optimizer.device != ZP_OFFLOAD_NONE)
        ok = zp_offload_cpu_time_s(hw, 0, 1, &cpu_s, error);
    /* --ep beside the file (expert_parallel's autoep_size the reader checked), before them too */
    if (ok && f->ep)
        ok = zp_ep_check(model, plan, "--ep", error);
    /* What is not modeled is said only of a config that is taken: a refused one gets its
     * error line alone. */
    for (guint i = 0; ok && i < warnings->len; i++)
        print_warning(g_ptr_array_index(warnings, i));
    g_ptr_array_unref(warnings);
    return ok;
}

/* A config that leaves the batch, the precision or the stage unset (`{}`) is still a plan, but
 * not one to take in silence: once the plan is accepted, one line says what was filled in. */
static void say_defaults_taken(const SimulateFlags *f)
{
    if (!f->ds_config || f->defaults_taken->len == 0)
        return;
    GString *list = g_string_new(NULL);
    for (guint i = 0; i < f->defaults_taken->len; i++)
        g_string_append_printf(list, "%s%s", i ? "; " : "",
                               (char *)g_ptr_array_index(f->defaults_taken, i));
    fprintf(stderr, "zplan: note: %s does not set these; took the defaults: %s\n", f->ds_config,
            list->str);
    g_string_free(list, TRUE);
}

/* The one place a plan is made from the command line: degrees, batch, DeepSpeed's knobs
 * (defaults where a flag is absent) or a DeepSpeed config, precision and optimizer, checked
 * against the model and, when a cluster is given, its node size. */
/* --megatron-args FILE: the plan is Megatron-LM's own launch flags (zp_megatron_args), on
 * --gpus GPUs, under --impl megatron; the attention kernel is the file's, else --attention's or
 * the profile's default. */
static gboolean megatron_args_plan(const SimulateFlags *f, const ZpModel *model, const ZpHw *hw,
                                   ZpPlan *plan, GError **error)
{
    int gpus = 0;
    if (!refuse_plan_flags(f, FROM_MEGATRON,
                           "the plan comes from --megatron-args; set it in the file instead",
                           error))
        return FALSE;
    if (f->impl && strcmp(f->impl, "megatron") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--impl %s: --megatron-args plans are --impl megatron's", f->impl);
        return FALSE;
    }
    if (!(required(f->gpus, "--gpus N", error) &&
          cli_int(f->gpus, "--gpus", 1, CLI_MAX_GPUS, 0, &gpus, error)))
        return FALSE;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    gboolean attention_set = FALSE;
    gboolean ok = zp_megatron_args_read(f->megatron_args, model, gpus, plan, &attention_set,
                                        warnings, error);
    ZpExpertConfig skew;
    if (ok && f->expert_skew &&
        (ok = cli_moe_parse(model, NULL, NULL, f->expert_skew, &skew, error)))
        plan->experts.skew = skew.skew;
    if (ok && attention_set && f->attention &&
        strcmp(f->attention, zp_attention_name(plan->attention)) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--attention %s contradicts %s's %s",
                    f->attention, f->megatron_args, zp_attention_name(plan->attention));
        ok = FALSE;
    }
    if (ok && !attention_set)
        ok = zp_hw_attention_choose(hw, f->attention, plan->precision, "--attention",
                                    &plan->attention, error);
    else if (ok && kernel_checked(f)) {
        /* --use-flash-attn in fp32 or below sm80 stops in flash_api.cpp mha_fwd. */
        char *key = g_strdup_printf("%s: --use-flash-attn", f->megatron_args);
        ok = zp_hw_attention_runs(hw, plan->attention, plan->precision, key, error);
        g_free(key);
    }
    plan->gpus_per_node = hw ? hw->gpus_per_node : 0;
    if (ok && hw && !sim_coll_check_placement(hw, plan->mp, error)) {
        g_prefix_error(error, "%s: --tensor-model-parallel-size: ", f->megatron_args);
        ok = FALSE;
    }
    for (guint i = 0; ok && i < warnings->len; i++)
        print_warning(g_ptr_array_index(warnings, i));
    g_ptr_array_unref(warnings);
    return ok;
}

static gboolean plan_from_flags(const SimulateFlags *f, const ZpModel *model, const ZpHw *hw,
                                ZpPlan *plan, GError **error)
{
    if (f->megatron_args)
        return megatron_args_plan(f, model, hw, plan, error);
    if (f->ds_config) {
        if (!ds_config_plan(f, model, hw, plan, error) ||
            !cli_check_mp(plan->mp, (int64_t)plan->dp * plan->mp * zp_plan_pp(plan), model,
                          error))
            return FALSE;
        plan->gpus_per_node = hw ? hw->gpus_per_node : 0;
        if (hw && !sim_coll_check_placement(hw, plan->mp, error)) {
            g_prefix_error(error, "--mp: ");
            return FALSE;
        }
        cli_note_ds_config_auto(f->ds_config, plan);
        cli_note_inert_features(model, plan);
        return TRUE;
    }
    int gpus = 0, stage = 0, micro_batch = 0, mp = 1, grad_accum = 1, pp = 1;
    ZpPrecision precision;
    ZpOptimizer optimizer;
    if (!(required(f->gpus, "--gpus N", error) &&
          cli_int(f->gpus, "--gpus", 1, CLI_MAX_GPUS, 0, &gpus, error) &&
          required(f->stage, "--stage S (0, 1, 2 or 3)", error) &&
          cli_int(f->stage, "--stage", 0, 3, 0, &stage, error) &&
          required(f->micro_batch, "--micro-batch B", error) &&
          cli_int(f->micro_batch, "--micro-batch", 1, 1e6, 1, &micro_batch, error) &&
          cli_int(f->mp, "--mp", 1, 65536, 1, &mp, error) &&
          cli_int(f->grad_accum, "--grad-accum", 1, 1e6, 1, &grad_accum, error) &&
          cli_check_mp(mp, gpus, model, error) &&
          cli_pipe_stages(&f->pipe, gpus, mp, &pp, error) &&
          cli_precision_optimizer(f->precision, f->optimizer, model, hw, &precision, &optimizer,
                                  error)))
        return FALSE;
    if (hw && !sim_coll_check_placement(hw, mp, error)) {
        g_prefix_error(error, "--mp: ");
        return FALSE;
    }
    zp_plan_defaults(plan, stage, gpus / (mp * pp), mp);
    if (!cli_pipe_plan(&f->pipe, pp, plan, error))
        return FALSE;
    plan->micro_batch = micro_batch;
    plan->grad_accum = grad_accum;
    plan->checkpoint = f->checkpoint;
    plan->precision = precision;
    plan->optimizer = optimizer;
    plan->gpus_per_node = hw ? hw->gpus_per_node : 0;
    plan->ckpt.partition_activations = f->partition_activations;
    plan->ckpt.cpu_checkpointing = f->cpu_checkpointing;
    plan->ckpt.contiguous_memory_optimization = f->contiguous_memory;
    plan->zero.zero_quantized_weights = f->quantized_weights;
    plan->zero.zero_quantized_gradients = f->quantized_gradients;
    plan->overlap_param_gather = f->overlap_param_gather;
    plan->no_main_grad = f->no_main_grad;
    plan->p2p_sync = f->p2p_sync;
    if (f->impl && !zp_impl_parse(f->impl, "--impl", &plan->impl, error))
        return FALSE;
    if (!cli_int(f->hpz, "--hpz-partition-size", 1, 65536, 1,
                 &plan->zero.zero_hpz_partition_size, error) ||
        !cli_attention_reduce(kernel_checked(f) ? f->attention : NULL, f->reduce_dtype, hw,
                              precision, plan, error) ||
        (!kernel_checked(f) && f->attention && !cli_attention_zreal(f->attention, plan, error)) ||
        !cli_recompute(f->recompute, f->checkpoint, plan, error))
        return FALSE;
    const char *moe_only = f->moe_dispatcher ? "--moe-dispatcher"
                           : f->expert_tp    ? "--expert-tp"
                                             : NULL;
    if (moe_only && !zp_moe_enabled(&model->moe)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s is not a mixture of experts",
                    moe_only, model->name);
        return FALSE;
    }
    if (!cli_moe_parse(model, f->ep, f->capacity_factor, f->expert_skew, &plan->experts, error) ||
        !cli_int(f->expert_tp, "--expert-tp", 1, 1 << 20, 0, &plan->experts.etp, error) ||
        !zp_plan_etp_check(plan, zp_moe_enabled(&model->moe), "--expert-tp", error) ||
        !zp_ep_check(model, plan, "--ep", error) ||
        (f->moe_dispatcher && (!zp_dispatcher_parse(f->moe_dispatcher, "--moe-dispatcher",
                                                    &plan->experts.dispatcher, error) ||
                               !zp_ep_dispatcher_check(model, plan, "--moe-dispatcher", error))))
        return FALSE;
    /* zplan's default is not Megatron-Core's (transformer_config.py moe_token_dispatcher_type
     * "allgather"): said where it could tell, the tokens crossing ranks */
    if (!f->moe_dispatcher && plan->impl == ZP_IMPL_MEGATRON && zp_moe_enabled(&model->moe) &&
        zp_plan_etp(plan) * zp_plan_ep(plan) > 1)
        cli_default_taken("--moe-dispatcher", "the alltoall dispatcher (Megatron-Core's own "
                          "default is allgather)");
    if (!f->expert_tp && plan->impl == ZP_IMPL_DEEPSPEED && zp_moe_enabled(&model->moe) &&
        plan->mp > 1)
        cli_default_taken("--expert-tp", "whole experts on each tensor rank, each rank "
                          "dispatching 1/%d of the slots (DeepSpeed's default)", plan->mp);
    zp_impl_plan_defaults(plan); /* the implementation's own, before the flags that say more */
    const gboolean ok =
        overlap_flag(f, &plan->zero, error) && zero_size_flags(f, plan, error) &&
        cli_offload(f->offload_optimizer, f->offload_param, f->nvme_path, &plan->zero, error) &&
        cli_offload_tuning(&f->tuning, &plan->zero, error);
    if (ok && hw)
        cli_note_inert_features(model, plan);
    return ok;
}

/* The plan from --megatron-args, --ds-config or the flags, its kernel priced as eager's work
 * where the profile (or none) has no rate for it (zp_hw_attention_unrated: mem-efficient). */
static gboolean simulate_plan(const SimulateFlags *f, const ZpModel *model, const ZpHw *hw,
                              ZpPlan *plan, GError **error)
{
    if (!plan_from_flags(f, model, hw, plan, error))
        return FALSE;
    if (!kernel_checked(f) && plan->attention == ZP_ATTN_MEM_EFFICIENT) {
        /* `schedule` writes what zreal runs: eager or its own blockwise kernel, not SDPA's
         * memory-efficient one, which is here only as the default (a named one is refused by
         * cli_attention_zreal, or ds_config_plan for the config's attention_kernel). */
        plan->attention = ZP_ATTN_EAGER;
        cli_default_retract("--attention");
        cli_default_taken("--attention", "eager attention (zreal, which runs this schedule, "
                          "has no memory-efficient kernel)");
    }
    plan->attention_unrated = zp_hw_attention_unrated(hw, plan->attention);
    return TRUE;
}

/* ---- the command ---- */

/* --slow-rank and --slow-link into the options' arrays (freed by the caller). */
static gboolean slow_flags(const SimulateFlags *f, const ZpPlan *plan, const ZpHw *hw,
                           SimOptions *options, GError **error)
{
    const uint32_t world = (uint32_t)plan->dp * (uint32_t)plan->mp * (uint32_t)zp_plan_pp(plan);
    const struct {
        char **texts;
        const char *flag, *what;
        uint32_t count;
        const SimSlow **out;
        uint32_t *n;
    } lists[] = {
        {f->slow_ranks, "--slow-rank", "rank", world, &options->slow_ranks,
         &options->n_slow_ranks},
        {f->slow_links, "--slow-link", "node",
         (world + hw->gpus_per_node - 1) / hw->gpus_per_node, &options->slow_nodes,
         &options->n_slow_nodes},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(lists); k++) {
        const guint n = lists[k].texts ? g_strv_length(lists[k].texts) : 0;
        SimSlow *slow = g_new0(SimSlow, n ? n : 1);
        *lists[k].out = slow;
        *lists[k].n = n;
        for (guint i = 0; i < n; i++)
            if (!sim_slow_parse(lists[k].texts[i], lists[k].count, lists[k].what, &slow[i],
                                error)) {
                g_prefix_error(error, "%s: ", lists[k].flag);
                return FALSE;
            }
    }
    return TRUE;
}

/* --schedule FILE: the graph, its plan and model (zp_sched_read_graph); the flags that make
 * a plan would say it a second time and are refused. */
static ZpSchedule *schedule_file(const SimulateFlags *f, GError **error)
{
    if (!refuse_plan_flags(f, FROM_SCHEDULE, "the ops come from --schedule; leave it out", error))
        return NULL;
    CliProgress *progress = cli_progress_new("zplan simulate: reading the schedule");
    ZpSchedule *sched =
        zp_sched_read_graph_progress(f->schedule, cli_progress_update, progress, error);
    cli_progress_free(progress);
    if (!sched)
        g_prefix_error(error, "--schedule: ");
    return sched;
}

/* The schedule's host memory and NVMe per node against the profile (ranks of a node hold
 * the same): the error names the tier that overflows. */
static gboolean host_tiers_fit(const ZpSchedule *sched, const ZpHw *hw, GError **error)
{
    ZpTiers t = {0};
    t.ranks_per_node = MIN(hw->gpus_per_node, sched->world);
    t.swap_buffer_bytes = zp_offload_param_swap_buffer_bytes(&sched->model, &sched->plan,
                                                             (double)sched->partition_elems);
    for (int c = 0; c < ZP_MEM_N; c++) {
        t.cpu_node_bytes += t.ranks_per_node * sched->host_bytes[c];
        t.nvme_node_bytes += t.ranks_per_node * sched->nvme_bytes[c];
    }
    return zp_offload_fit(&t, 0, hw, error);
}

/* --kernels NAME: the inventory the GPU's compute is costed from (zp_inventory), in the plan
 * and in a schedule file's plan. */
static gboolean kernels_flag(const SimulateFlags *f, ZpPlan *sched_plan, ZpPlan *plan,
                             GError **error)
{
    if (!cli_kernels(f->kernels, plan, error))
        return FALSE;
    if (sched_plan && f->kernels)
        g_strlcpy(sched_plan->kernels, plan->kernels, sizeof sched_plan->kernels);
    return TRUE;
}

/* `simulate`, text or --json, from the plan's schedule built short (cli_rank_simulate_short:
 * its steady periods past the kept ones counted by the fold as virtual periods), as the search
 * evaluates a plan: the full schedule's SimResult in every field either output prints but the
 * fold's own report (tests/test_sim_extend.c; test_sim_fold /sim/fold/json-short and
 * /sim/fold/text-short compare both outputs with --no-fold's), and the full schedule's
 * allocator replay (*alloc). Only where nothing reads a timeline (--trace, --html, a sink),
 * every rank is not asked for (--explicit, which does not fold), the fold is on, no rank or
 * link is slowed and no checkpoint goes to the host (the plans test_sim_extend proves it on:
 * a slowed rank's class is not; cpu_checkpointing's host bytes are a peak over the
 * schedule's ops). Offloaded states are: test_sim_extend's /sim/extend/offload proves the host
 * tiers' figures, and the text's offload lines read the schedule's host bytes, which depend on
 * grad_accum > 1 only (zp_offload_stage2_accum), not on how many (the short schedule keeps
 * 10 at least: cli_rank_short_by). And only where it is complete: every missing micro-step counted,
 * the op sums exact (ops_json's timeline path needs the full schedule; the text reads no op
 * sums, but one rule for both keeps them on the same plans) and the allocator replay
 * extended. NULL otherwise, with nothing kept (the caller builds and runs the full schedule);
 * else the result, with *sched the short schedule, which the outputs read only for what its
 * length does not change (cli_simulate_out.c: cli_simulate_print_json and
 * cli_simulate_print_human say which). */
static SimResult *simulate_short(const SimulateFlags *f, const ZpModel *model, const ZpHw *hw,
                                 const ZpPlan *plan, ZpSchedule **sched, ZpAllocStats *alloc)
{
    if (f->trace || f->html || f->sink || f->schedule || f->no_fold ||
        f->explicit_ranks || f->slow_ranks || f->slow_links ||
        plan->ckpt.cpu_checkpointing || cli_rank_short_by(model, plan, hw) == 0)
        return NULL;
    CliProgress *progress = cli_progress_new("zplan simulate: the schedule built short");
    const SimOptions base = {.mode = SIM_MODE_FOLDED,
                             .progress = cli_progress_update,
                             .progress_ctx = progress};
    gboolean alloc_done = FALSE;
    SimResult *result = cli_rank_simulate_short(model, hw, plan, &base, alloc, &alloc_done, sched);
    cli_progress_free(progress);
    if (result && (result->stopped || !result->op_types_exact || !alloc_done)) {
        sim_result_free(result);
        zp_sched_free(*sched);
        *sched = NULL;
        result = NULL;
    }
    return result;
}

static int simulate(const SimulateFlags *f)
{
    GError *error = NULL;
    ZpModel model;
    ZpHw hw;
    ZpPlan plan;
    double peak_flops = 0;
    ZpSchedule *sched = f->schedule ? schedule_file(f, &error) : NULL;
    gboolean ready = f->schedule ? sched != NULL : load_model(f, &model, &error);
    ready = ready && required(f->cluster, "--cluster NAME|PATH.json", &error) &&
            cli_cluster(f->cluster, f->gpu_memory, TRUE, &hw, &(gboolean){FALSE}, &error) &&
            (sched ? sim_coll_check_placement(&hw, sched->plan.mp, &error)
                   : simulate_plan(f, &model, &hw, &plan, &error)) &&
            (!f->trace || zp_check_out_path(f->trace, "--trace", &error)) &&
            (!f->html || zp_check_out_path(f->html, "--html", &error));
    if (ready && sched) {
        model = sched->model;
        plan = sched->plan;
    }
    ready = ready && kernels_flag(f, sched ? &sched->plan : NULL, &plan, &error);
    /* the flags are this command's own: parsing fills in the budget's numbers */
    ready = ready && cli_budget_parse((CliBudget *)&f->budget, &error);
    if (ready && !sim_engine_peak_flops(&hw, plan.precision, &peak_flops, &error)) {
        g_prefix_error(&error, "--precision: ");
        ready = FALSE;
    }
    if (!ready) {
        zp_sched_free(sched);
        return cli_fail(f->command, error);
    }
    /* A profile measured on zreal's CPU backend: its workspace buffers are listed too. */
    plan.backend_workspace = zp_cost_cpu_backend(&hw);
    ZpAllocStats alloc = {0};
    SimResult *result = sched ? NULL : simulate_short(f, &model, &hw, &plan, &sched, &alloc);
    const gboolean from_short = result != NULL;
    if (!sched && !(sched = zp_sched_build(&model, &plan, &error)))
        return cli_fail(f->command, error);
    say_defaults_taken(f);
    if (!host_tiers_fit(sched, &hw, &error)) { /* refused: the host or NVMe cannot hold it */
        sim_result_free(result);
        zp_sched_free(sched);
        cli_fail(f->command, error);
        return CLI_EXIT_DOES_NOT_FIT;
    }
    char *what = g_strdup_printf("zplan simulate: %d rank(s) of %u ops",
                                 f->explicit_ranks ? sched->world : 1, sched->ops->len);
    CliProgress *progress = cli_progress_new(what);
    g_free(what);
    SimOptions options = {
        .mode = f->explicit_ranks ? SIM_MODE_EXPLICIT : SIM_MODE_FOLDED,
        .no_fold = f->no_fold,
        /* A caller's sink reads every rank's ops; --trace keeps only the rows it writes and
         * the page (--html) only the reported rank's (sim_trace_run), --json none (the
         * engine's sums by op type). */
        .record_timeline = f->sink != NULL,
        .progress = cli_progress_update,
        .progress_ctx = progress,
    };
    if (!from_short && slow_flags(f, &plan, &hw, &options, &error))
        result = (f->trace || f->html) && !options.record_timeline
                     ? sim_trace_run(sched, &hw, &options, f->trace != NULL, &error)
                     : sim_engine_run(sched, &hw, &options, &error);
    /* --json reads the reported rank's sums by op type (SimResult.op_type_s), kept with no
     * timeline; past the clock's grid (a step over 2^22 s) they are not exact, and the run
     * is made again keeping that rank's timeline (sim_trace_run), which --json then sums. */
    if (result && f->json && !result->stopped && !result->op_types_exact &&
        !result->op_start_s) {
        sim_result_free(result);
        result = sim_trace_run(sched, &hw, &options, FALSE, &error);
    }
    cli_progress_free(progress);
    gboolean ok = result != NULL;
    /* Samples/s, TFLOP/s, MFU and the breakdown's shares divide by the step time: a schedule
     * with no ops, or only allocs and frees, is refused instead of reported as inf and NaN. */
    if (ok && !(result->step_time_s > 0)) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: the step takes no time (none of its %u ops a rank computes, "
                    "communicates or moves data): no throughput or MFU to give",
                    f->schedule ? f->schedule : "the plan", sched->ops->len);
        if (f->schedule)
            g_prefix_error(&error, "--schedule: ");
        ok = FALSE;
    }
    if (ok && f->trace) {
        progress = cli_progress_new("zplan simulate: writing the trace");
        ok = sim_trace_write(sched, result, f->trace, cli_progress_update, progress, &error);
        cli_progress_free(progress);
        if (!ok)
            g_prefix_error(&error, "--trace: ");
    }
    int status = 0;
    if (!ok) {
        status = cli_fail(f->command, error);
    } else {
        const CliSimReport report = {
            &model, &hw, &plan, sched, result, peak_flops, &options, f->schedule,
            f->ds_config ? f->defaults_taken : NULL,
            from_short ? alloc
                       : zp_alloc_replay_schedule(sched,
                                                  hw.gpu_memory_bytes - hw.runtime_reserve_bytes),
            &f->budget};
        if (f->html && !cli_simulate_write_html(&report, f->html, &error))
            status = cli_fail(f->command, error);
        else if (f->sink)
            status = f->sink(&(CliSimulated){&model, &hw, &plan, sched, result, report.alloc},
                             f->sink_ctx);
        else if (f->json)
            status = cli_simulate_print_json(&report);
        else
            cli_simulate_print_human(&report);
        if (status == 0 && !f->sink && cli_simulate_bytes_over(&report) > 0)
            status = CLI_EXIT_DOES_NOT_FIT;
    }
    sim_result_free(result);
    zp_sched_free(sched);
    g_free((SimSlow *)options.slow_ranks);
    g_free((SimSlow *)options.slow_nodes);
    return status;
}

/* The flags that make a plan, shared by `simulate` and `schedule`; NULL-terminated. */
static void plan_entries(SimulateFlags *f, GOptionEntry out[56])
{
    const GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &f->model, "Model name in models/ or a PATH.json (required)", "M"},
        {"cluster", 0, 0, G_OPTION_ARG_STRING, &f->cluster, "Hardware profile name or PATH.json", "C"},
        {"gpu-memory", 0, 0, G_OPTION_ARG_STRING, &f->gpu_memory, "The cluster's GPUs with this memory instead (40GB, 40GiB)", "BYTES"},
        {"gpus", 0, 0, G_OPTION_ARG_STRING, &f->gpus, "Total GPU count, DP x MP x PP (required)", "N"},
        {"stage", 0, 0, G_OPTION_ARG_STRING, &f->stage, "ZeRO stage 0, 1, 2 or 3 (required without --ds-config)", "S"},
        {"micro-batch", 0, 0, G_OPTION_ARG_STRING, &f->micro_batch, "Samples per GPU per micro-step (required without --ds-config)", "B"},
        {"mp", 0, 0, G_OPTION_ARG_STRING, &f->mp, "Tensor (model) parallel degree: divides a node's GPUs or spans whole nodes (default 1)", "M"},
        {"grad-accum", 0, 0, G_OPTION_ARG_STRING, &f->grad_accum, "Micro-steps per optimizer step (default 1)", "G"},
        {"checkpoint", 0, 0, G_OPTION_ARG_NONE, &f->checkpoint, "Activation checkpointing at every block (--recompute full)", NULL},
        {"overlap-param-gather", 0, 0, G_OPTION_ARG_NONE, &f->overlap_param_gather, "Megatron's distributed optimizer (--impl megatron --stage 1): the updated parameters' all-gather runs bucket by bucket beside the next forward instead of after the step", NULL},
        {"recompute", 0, 0, G_OPTION_ARG_STRING, &f->recompute, "Activation recomputation: none (default), selective (Megatron's core attention; --impl megatron) or full (every block, as --checkpoint)", "R"},
        {"no-main-grad", 0, 0, G_OPTION_ARG_NONE, &f->no_main_grad, "Megatron-LM without an fp32 main_grad (--kernels megatron), as in 2021 with torch DDP or local DDP without contiguous buffers: weight-gradient GEMMs write 16-bit gradients that autograd adds into .grad on each micro-step after the first, the optimizer copies them to fp32", NULL},
        {"p2p-sync", 0, 0, G_OPTION_ARG_NONE, &f->p2p_sync, "Megatron-LM's pipeline exchanges waited for on the host (--impl megatron; nothing without --pp), as in 2021 (de7dc40f) and today with --no-overlap-p2p-communication: a stage's next op waits for its sends and all it received; interleaved, a forward's output goes with the next backward's gradients, after both", NULL},
        {"no-dropout", 0, 0, G_OPTION_ARG_NONE, &f->no_dropout, "Train without dropout (as zreal does): smaller activations", NULL},
        {"overlap", 0, 0, G_OPTION_ARG_NONE, &f->overlap, "overlap_comm on (DeepSpeed's default for stage 3 only)", NULL},
        {"no-overlap", 0, 0, G_OPTION_ARG_NONE, &f->no_overlap, "overlap_comm off", NULL},
        {"reduce-bucket-size", 0, 0, G_OPTION_ARG_STRING, &f->reduce_bucket, "Gradient bucket, elements (default 5e8)", "E"},
        {"allgather-bucket-size", 0, 0, G_OPTION_ARG_STRING, &f->allgather_bucket, "Stage 1-2 parameter all-gather bucket, elements (default 5e8)", "E"},
        {"prefetch-bucket-size", 0, 0, G_OPTION_ARG_STRING, &f->prefetch_bucket, "Stage 3 prefetch, elements (default 5e7)", "E"},
        {"max-live-parameters", 0, 0, G_OPTION_ARG_STRING, &f->max_live, "Stage 3 live gathered parameters, elements (default 1e9)", "E"},
        {"persistence-threshold", 0, 0, G_OPTION_ARG_STRING, &f->persistence, "Stage 3 keeps units this small whole, elements (default 1e5)", "E"},
        {"precision", 0, 0, G_OPTION_ARG_STRING, &f->precision, "fp16, bf16 or fp32 (default: the model's torch_dtype where the GPU has it, else fp16)", "P"},
        {"optimizer", 0, 0, G_OPTION_ARG_STRING, &f->optimizer, "adam (default), sgd-momentum, sgd or adam-8bit", "O"},
        {"megatron-args", 0, 0, G_OPTION_ARG_FILENAME, &f->megatron_args, "Take the plan from Megatron-LM's launch flags (a file of pretrain_gpt.py's arguments: --tensor-model-parallel-size, --use-distributed-optimizer, ...; with --gpus; --impl megatron)", "FILE"},
        {"ds-config", 0, 0, G_OPTION_ARG_FILENAME, &f->ds_config, "Take the plan from a DeepSpeed ds_config.json (with --gpus; its tensor_parallel.autotp_size or --mp, expert_parallel.autoep_size or --ep)", "FILE"},
        CLI_SEQ_ENTRY(&f->seq),
        {"attention", 0, 0, G_OPTION_ARG_STRING, &f->attention, "eager, flash (the profile's fused kernel), a kernel its attention table lists, or mem-efficient (SDPA's memory-efficient kernel: a fused kernel's memory, eager's time where unrated) (default: what PyTorch's SDPA picks there for the dtype; mem-efficient in fp32)", "K"},
        {"reduce-dtype", 0, 0, G_OPTION_ARG_STRING, &f->reduce_dtype, "Gradient reduction dtype fp32, bf16 or fp16 (default: the gradients')", "D"},
        {"partition-activations", 0, 0, G_OPTION_ARG_NONE, &f->partition_activations, "ZeRO-R Pa: each checkpoint split across the MP ranks, all-gathered before its recompute (with --checkpoint)", NULL},
        {"cpu-checkpointing", 0, 0, G_OPTION_ARG_NONE, &f->cpu_checkpointing, "ZeRO-R Pa+cpu: checkpoints kept in host memory (with --checkpoint)", NULL},
        {"contiguous-memory", 0, 0, G_OPTION_ARG_NONE, &f->contiguous_memory, "ZeRO-R MD: checkpoints in one pre-allocated region (contiguous_memory_optimization)", NULL},
        {"quantized-weights", 0, 0, G_OPTION_ARG_NONE, &f->quantized_weights, "ZeRO++ qwZ: stage-3 all-gathers in block-quantised int8", NULL},
        {"hpz-partition-size", 0, 0, G_OPTION_ARG_STRING, &f->hpz, "ZeRO++ hpZ: a secondary parameter copy split over this many GPUs of a node (default 1: none); under --impl fsdp2, reshard_after_forward=N", "N"},
        {"quantized-gradients", 0, 0, G_OPTION_ARG_NONE, &f->quantized_gradients, "ZeRO++ qgZ: int4 gradients through the hierarchical all-to-all", NULL},
        {"impl", 0, 0, G_OPTION_ARG_STRING, &f->impl, "Whose ZeRO: deepspeed (default: DeepSpeed v0.19.6 as its source does it), fsdp (PyTorch FSDP), paper (the ZeRO paper's volumes), megatron (Megatron-Core's DDP and distributed optimizer: stages 0 and 1) or fsdp2 (PyTorch's fully_shard: stage 3 reshards after forward, stage 2 does not)", "I"},
        CLI_PIPE_ENTRIES(&f->pipe),
        CLI_MOE_ENTRIES(&f->ep, &f->capacity_factor, &f->expert_skew),
        {"expert-tp", 0, 0, G_OPTION_ARG_STRING, &f->expert_tp, "A mixture of experts over TP > 1: the ranks each expert is split over, the TP degree (--impl megatron's default; DeepSpeed's enable_expert_tensor_parallelism) or 1 (whole experts on each rank, the expert-parallel group taken from the tensor and data-parallel ranks: Megatron-Core's --expert-tensor-parallel-size 1, and DeepSpeed's default)", "N"},
        {"moe-dispatcher", 0, 0, G_OPTION_ARG_STRING, &f->moe_dispatcher, "A mixture of experts under --impl megatron: alltoall (default) or allgather (Megatron-Core's default --moe-token-dispatcher-type: each rank gathers every token of its TP x EP group, its experts' outputs are reduce-scattered back)", "D"},
        CLI_OFFLOAD_ENTRIES(&f->offload_optimizer, &f->offload_param, &f->nvme_path),
        CLI_OFFLOAD_TUNING_ENTRIES(&f->tuning),
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    G_STATIC_ASSERT(G_N_ELEMENTS(entries) <= 56);
    memcpy(out, entries, sizeof entries);
}

static void free_flags(SimulateFlags *f)
{
    char **texts[] = {&f->model, &f->cluster, &f->gpus, &f->stage, &f->micro_batch, &f->mp,
                      &f->grad_accum, &f->reduce_bucket, &f->allgather_bucket,
                      &f->prefetch_bucket, &f->max_live, &f->persistence, &f->precision,
                      &f->optimizer, &f->trace, &f->ds_config, &f->out, &f->seq,
                      &f->attention, &f->reduce_dtype, &f->impl, &f->kernels, &f->schedule, &f->hpz,
                      &f->offload_optimizer, &f->offload_param, &f->nvme_path,
                      &f->gpu_memory, &f->html, &f->recompute,
                      &f->megatron_args, &f->ep, &f->capacity_factor, &f->expert_skew,
                      &f->moe_dispatcher, &f->expert_tp};
    for (size_t i = 0; i < G_N_ELEMENTS(texts); i++)
        g_free(*texts[i]);
    g_strfreev(f->slow_ranks);
    g_strfreev(f->slow_links);
    cli_pipe_free(&f->pipe);
    cli_offload_tuning_free(&f->tuning);
    cli_budget_free(&f->budget);
}

typedef int (*FlagsCommand)(const SimulateFlags *f);

static int run_with_flags(int argc, char **argv, const char *name, const char *summary,
                          const GOptionEntry *extra, SimulateFlags *f, FlagsCommand command)
{
    GOptionEntry entries[56];
    f->command = name;
    plan_entries(f, entries);
    GOptionContext *context = g_option_context_new(NULL);
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_add_main_entries(context, extra, NULL);
    g_option_context_set_summary(context, summary);
    GError *error = NULL;
    f->defaults_taken = g_ptr_array_new_with_free_func(g_free);
    int status = cli_parse(context, &argc, &argv, &error) ? command(f) : cli_fail(name, error);
    g_ptr_array_unref(f->defaults_taken);
    g_option_context_free(context);
    free_flags(f);
    return status;
}

/* --no-fold, on simulate and report alike. */
#define NO_FOLD_HELP "Step every period of a pipeline's steady state (and every micro-step of gradient accumulation) instead of advancing by whole periods where they repeat exactly: the same results, slower"

/* What the step runs and how, on simulate and report alike: report says it takes simulate's
 * flags, and refused these (a plan priced with `plan --kernels eager` could not be drawn). */
#define SIMULATE_RUN_ENTRIES(f) \
        {"schedule", 0, 0, G_OPTION_ARG_FILENAME, &(f)->schedule, "Time this schedule file (zplan schedule --out, or written by hand; docs/schedule.md) instead of a plan: no --model or plan flags", "FILE"}, \
        {"kernels", 0, 0, G_OPTION_ARG_STRING, &(f)->kernels, "The kernel inventory a GPU profile's kernel_rates price: eager (PyTorch eager under autocast, as Hugging Face runs a model), megatron or deepspeed (default: the one --impl names, else eager)", "NAME"}, \
        {"slow-rank", 0, 0, G_OPTION_ARG_STRING_ARRAY, &(f)->slow_ranks, "Rank R computes FACTOR times slower (repeatable)", "R:FACTOR"}, \
        {"slow-link", 0, 0, G_OPTION_ARG_STRING_ARRAY, &(f)->slow_links, "Node NODE's network moves data FACTOR times slower (repeatable)", "NODE:FACTOR"}

int cli_simulate(int argc, char **argv)
{
    SimulateFlags f = {0};
    const GOptionEntry extra[] = {
        {"explicit", 0, 0, G_OPTION_ARG_NONE, &f.explicit_ranks, "Simulate every rank, not one per class of identical ranks", NULL},
        {"no-fold", 0, 0, G_OPTION_ARG_NONE, &f.no_fold, NO_FOLD_HELP, NULL},
        {"json", 0, 0, G_OPTION_ARG_NONE, &f.json, "Print JSON", NULL},
        {"trace", 0, 0, G_OPTION_ARG_FILENAME, &f.trace, "Write a Chrome/Perfetto trace-event JSON", "FILE"},
        {"html", 0, 0, G_OPTION_ARG_FILENAME, &f.html, "Write the step as one HTML page (zplan report)", "OUT.html"},
        SIMULATE_RUN_ENTRIES(&f),
        CLI_BUDGET_ENTRIES(&f.budget),
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    return run_with_flags(argc, argv, "simulate",
        "Builds the schedule of one optimizer step for a ZeRO plan and times it with a\n"
        "discrete-event simulator: compute by the profile's kernel rates (its roofline where it\n"
        "has none), collectives by NCCL's cost model,\n"
        "streams in order, bandwidth shared between concurrent collectives. Prints step\n"
        "time, samples/s, model TFLOP/s and MFU, the breakdown, bytes sent and peak memory,\n"
        "after a first line saying whether the step fits in the GPU's memory.\n"
        "--cluster is required; --schedule FILE times a schedule file in place of a plan.\n"
        "Exit status 2: the step does not fit.",
        extra, &f, simulate);
}

int cli_simulate_into(int argc, char **argv, const char *name, const char *summary,
                      const GOptionEntry *extra, CliSimulatedFn fn, void *ctx)
{
    SimulateFlags f = {.sink = fn, .sink_ctx = ctx};
    return run_with_flags(argc, argv, name, summary, extra, &f, simulate);
}

/* `zplan report`: simulate's flags, and the page (--html) is the point. */
static int report_command(const SimulateFlags *f)
{
    if (!f->html) {
        GError *error = NULL;
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "--html OUT.html is required");
        return cli_fail("report", error);
    }
    return simulate(f);
}

int cli_report(int argc, char **argv)
{
    SimulateFlags f = {0};
    const GOptionEntry extra[] = {
        {"html", 0, 0, G_OPTION_ARG_FILENAME, &f.html, "Write the page here (required)", "OUT.html"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &f.json, "Print simulate's JSON", NULL},
        {"explicit", 0, 0, G_OPTION_ARG_NONE, &f.explicit_ranks, "Simulate every rank, not one per class of identical ranks", NULL},
        {"no-fold", 0, 0, G_OPTION_ARG_NONE, &f.no_fold, NO_FOLD_HELP, NULL},
        {"trace", 0, 0, G_OPTION_ARG_FILENAME, &f.trace, "Write a Chrome/Perfetto trace-event JSON", "FILE"},
        SIMULATE_RUN_ENTRIES(&f),
        CLI_BUDGET_ENTRIES(&f.budget),
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    return run_with_flags(argc, argv, "report",
        "Simulates one step as `zplan simulate` does (the same flags, --ds-config included)\n"
        "and writes it as one self-contained HTML page: the verdict, the reported rank's\n"
        "memory over the step stacked by category under the GPU's line, its streams as a\n"
        "Gantt chart, time by op class and bytes by group, as inline SVG. Prints what\n"
        "simulate prints. Exit status 2: the step does not fit.",
        extra, &f, report_command);
}

/* `zplan schedule`: the per-rank op list of one step as JSON, for zreal --schedule and tests. */
static int schedule(const SimulateFlags *f)
{
    GError *error = NULL;
    ZpModel model;
    ZpHw hw;
    ZpPlan plan;
    if (!(load_model(f, &model, &error) &&
          required(f->out, "--out FILE", &error) &&
          zp_check_out_path(f->out, "--out", &error) &&
          (!f->cluster ||
           cli_cluster(f->cluster, f->gpu_memory, TRUE, &hw, &(gboolean){FALSE}, &error)) &&
          simulate_plan(f, &model, f->cluster ? &hw : NULL, &plan, &error)))
        return cli_fail("schedule", error);
    ZpSchedule *sched = zp_sched_build(&model, &plan, &error);
    if (sched)
        say_defaults_taken(f);
    CliProgress *progress = sched ? cli_progress_new("zplan schedule: writing the ops") : NULL;
    const gboolean written = sched && zp_sched_write_json_progress(
                                          sched, f->out, cli_progress_update, progress, &error);
    cli_progress_free(progress);
    if (!written) {
        zp_sched_free(sched);
        return cli_fail("schedule", error);
    }
    int counts[ZP_OP_TRANSFER + 1] = {0};
    for (guint i = 0; i < sched->ops->len; i++)
        counts[zp_sched_op(sched, i)->kind]++;
    if (sched->stages > 1) /* one op list, each op run by its stage's ranks */
        printf("wrote %s: %u ops (%d compute, %d collective, %d alloc, %d free, %d p2p, "
               "%d transfer) over %d pipeline stages of %d ranks each\n",
               f->out, sched->ops->len, counts[ZP_OP_COMPUTE], counts[ZP_OP_COLLECTIVE],
               counts[ZP_OP_ALLOC], counts[ZP_OP_FREE], counts[ZP_OP_P2P],
               counts[ZP_OP_TRANSFER], sched->stages, sched->world / sched->stages);
    else
        printf("wrote %s: %u ops (%d compute, %d collective, %d alloc, %d free, %d transfer) "
               "for each of %d ranks\n",
               f->out, sched->ops->len, counts[ZP_OP_COMPUTE], counts[ZP_OP_COLLECTIVE],
               counts[ZP_OP_ALLOC], counts[ZP_OP_FREE], counts[ZP_OP_TRANSFER], sched->world);
    zp_sched_free(sched);
    return 0;
}

int cli_schedule(int argc, char **argv)
{
    SimulateFlags f = {0};
    const GOptionEntry extra[] = {
        {"out", 0, 0, G_OPTION_ARG_FILENAME, &f.out, "Write the schedule JSON here (required)", "FILE"},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    return run_with_flags(argc, argv, "schedule",
        "Writes the per-rank schedule of one optimizer step (compute, collective, alloc and\n"
        "free ops with their dependencies) as JSON: the ops zplan simulate times and\n"
        "zreal --schedule runs. --cluster, when given, checks tensor-parallel placement.",
        extra, &f, schedule);
}
