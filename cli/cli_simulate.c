/* cli_simulate: `zplan simulate` builds one step's schedule for a plan, runs it through the
 * discrete-event simulator and prints step time, throughput, MFU, breakdown, bytes and memory. */
#include "cli.h"
#include "cli_pipe.h"
#include "cli_progress.h"
#include "cli_report.h"
#include "sim_coll.h"
#include "sim_engine.h"
#include "sim_trace.h"
#include "zp_alloc_replay.h"
#include "zp_cost.h"
#include "zp_zeror.h"
#include "zp_dsconfig.h"
#include "zp_impl.h"
#include "zp_megatron_args.h"
#include "zp_pipe.h"
#include "zp_offload.h"
#include "zp_sched.h"
#include "zp_outpath.h"
#include "zp_util.h"

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
    gboolean checkpoint, overlap, no_overlap, no_dropout, explicit_ranks, json;
    gboolean overlap_param_gather;
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

static gboolean zero_size_flags(const SimulateFlags *f, ZpZeroConfig *zero, GError **error)
{
    const char *texts[ZP_KNOB_N] = {
        [ZP_KNOB_REDUCE_BUCKET] = f->reduce_bucket, [ZP_KNOB_ALLGATHER_BUCKET] = f->allgather_bucket,
        [ZP_KNOB_PREFETCH_BUCKET] = f->prefetch_bucket, [ZP_KNOB_MAX_LIVE] = f->max_live,
        [ZP_KNOB_PERSISTENCE] = f->persistence};
    for (int k = 0; k < ZP_KNOB_N; k++)
        if (texts[k] && !zp_zero_knob_set(zero, (ZpZeroKnob)k, texts[k], error))
            return FALSE;
    return TRUE;
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
        {"--offload-optimizer", f->offload_optimizer != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--offload-param", f->offload_param != NULL, FROM_BOTH | FROM_MEGATRON},
        {"--nvme-path", f->nvme_path != NULL, FROM_BOTH | FROM_MEGATRON},
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

/* --ds-config FILE: the plan is the user's DeepSpeed config, with the degrees (--gpus, --mp)
 * and, for "auto" (as the Hugging Face Trainer fills it from its arguments), --micro-batch,
 * --grad-accum, --precision and the optimizer from the flags; --checkpoint turns
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
        !cli_int(f->grad_accum, "--grad-accum", 1, 1e6, 1, &launch.grad_accum, error))
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
                     f->ds_config, error);
    if (ok && (f->checkpoint || f->recompute))
        ok = cli_recompute(f->recompute, f->checkpoint, plan, error);
    /* What is not modeled is said only of a config that is taken: a refused one gets its
     * error line alone. */
    for (guint i = 0; ok && i < warnings->len; i++)
        fprintf(stderr, "zplan: warning: %s\n", (char *)g_ptr_array_index(warnings, i));
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
    if (ok && attention_set && f->attention &&
        strcmp(f->attention, zp_attention_name(plan->attention)) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--attention %s contradicts %s's %s",
                    f->attention, f->megatron_args, zp_attention_name(plan->attention));
        ok = FALSE;
    }
    if (ok && !attention_set)
        ok = zp_hw_attention_choose(hw, f->attention, plan->precision, "--attention",
                                    &plan->attention, error);
    plan->gpus_per_node = hw ? hw->gpus_per_node : 0;
    if (ok && hw && !sim_coll_check_placement(hw, plan->mp, error)) {
        g_prefix_error(error, "%s: --tensor-model-parallel-size: ", f->megatron_args);
        ok = FALSE;
    }
    for (guint i = 0; ok && i < warnings->len; i++)
        fprintf(stderr, "zplan: warning: %s\n", (char *)g_ptr_array_index(warnings, i));
    g_ptr_array_unref(warnings);
    return ok;
}

static gboolean simulate_plan(const SimulateFlags *f, const ZpModel *model, const ZpHw *hw,
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
        cli_note_inert_features(plan);
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
    if (f->impl && !zp_impl_parse(f->impl, "--impl", &plan->impl, error))
        return FALSE;
    if (!cli_int(f->hpz, "--hpz-partition-size", 1, 65536, 1,
                 &plan->zero.zero_hpz_partition_size, error) ||
        !cli_attention_reduce(f->attention, f->reduce_dtype, hw, precision, plan, error) ||
        !cli_recompute(f->recompute, f->checkpoint, plan, error))
        return FALSE;
    zp_impl_plan_defaults(plan); /* the implementation's own, before the flags that say more */
    const gboolean ok =
        overlap_flag(f, &plan->zero, error) && zero_size_flags(f, &plan->zero, error) &&
        cli_offload(f->offload_optimizer, f->offload_param, f->nvme_path, &plan->zero, error) &&
        cli_offload_tuning(&f->tuning, &plan->zero, error);
    if (ok && hw)
        cli_note_inert_features(plan);
    return ok;
}

/* ---- output ---- */

typedef struct {
    const ZpModel *model;
    const ZpHw *hw;
    const ZpPlan *plan;
    const ZpSchedule *sched;
    const SimResult *r;
    double peak_flops;
    const SimOptions *options;
    const char *schedule_path; /* --schedule FILE, or NULL for a plan's schedule */
    const GPtrArray *defaults_taken; /* with --ds-config: what the file left to defaults */
    ZpAllocStats alloc; /* the schedule's sequence through the caching allocator */
    const CliBudget *budget;   /* --tokens/--steps and --gpu-hour-price */
} Report;

/* Tokens one optimizer step trains: samples x sequence. */
static double tokens_per_step(const Report *p)
{
    return (double)p->plan->dp * p->plan->micro_batch * p->plan->grad_accum *
           (double)p->model->seq_len;
}

static void print_tiers(const Report *p);

/* A rank's compute by kernel class: each kind's ops (zp_sched_compute_ops: the step's, over a
 * pipeline's stages; divided by the stages, a stage's mean) times its kernels' time by class,
 * the optimizer at the rank's elements; NULL unless the profile's kernel_rates cost the plan's
 * inventory. Interference with collectives is not in it (the breakdown's compute_s has it). */
static json_t *compute_by_class_json(const Report *p)
{
    ZpCost c;
    if (!zp_model_has_architecture(p->model) ||
        !zp_cost_init(&c, p->hw, p->model, &p->sched->plan, NULL) || !c.inventory)
        return NULL;
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(p->model, &p->sched->plan, ops);
    double by_class[ZP_KC_N] = {0}, host = 0, launches = 0;
    for (int k = 0; k < ZP_COMP_N; k++) {
        const double n = k == ZP_COMP_OPTIMIZER ? (c.optimizer_elems > 0)
                                                : (double)ops[k].count / zp_plan_pp(&p->sched->plan);
        for (int cls = 0; cls < ZP_KC_N; cls++)
            by_class[cls] += n * c.class_s[k][cls];
        host += n * c.host_s[k];
        launches += n * c.launches[k];
    }
    json_t *o = json_pack("{s:s}", "inventory", c.inv->name);
    for (int cls = 0; cls < ZP_KC_COLLECTIVE; cls++) {
        char key[32];
        g_snprintf(key, sizeof key, "%s_s", zp_kernel_class_name((ZpKernelClass)cls));
        json_object_set_new(o, key, json_real(by_class[cls]));
    }
    json_object_set_new(o, "host_issue_s", json_real(host));
    json_object_set_new(o, "launches", json_real(launches));
    return o;
}


static double samples_per_s(const Report *p)
{
    return (double)p->plan->dp * p->plan->micro_batch * p->plan->grad_accum / p->r->step_time_s;
}

static double flops_per_gpu(const Report *p)
{
    return p->r->model_flops / p->r->step_time_s;
}

/* Bytes over the GPU's memory at the peak, counting the profile's CUDA-context reserve
 * (not a schedule buffer); zero or less when the step fits. The need is the allocator's
 * (zp_alloc_replay_needed_bytes), as every command judges it. */
static double bytes_over(const Report *p)
{
    const double capacity = p->hw->gpu_memory_bytes - p->hw->runtime_reserve_bytes;
    return zp_alloc_replay_needed_bytes(&p->alloc, p->r->peak_memory_bytes, capacity) - capacity;
}

static json_t *alloc_json(const ZpAllocStats *a)
{
    json_t *o = json_pack("{s:f, s:f, s:f, s:f, s:b, s:b}", "peak_allocated_bytes",
                          a->peak_allocated_bytes, "peak_reserved_bytes", a->peak_reserved_bytes,
                          "reserved_at_peak_bytes", a->reserved_at_peak_bytes,
                          "largest_free_at_peak_bytes", a->largest_free_at_peak_bytes, "oom",
                          a->oom, "oom_fragmented", a->oom_fragmented);
    if (a->oom)
        json_object_set_new(o, "oom_at", json_pack("{s:f, s:f, s:f, s:f}", "request_bytes",
                                                   a->oom_request_bytes, "allocated_bytes",
                                                   a->oom_allocated_bytes, "reserved_bytes",
                                                   a->oom_reserved_bytes, "largest_free_bytes",
                                                   a->oom_largest_free_bytes));
    return o;
}

/* Predicted seconds per step and op count by op type ("block_fwd", "allgather", ...), from the
 * timeline of the reported rank: the figures `zplan validate` sets against zreal's. */
static json_t *ops_json(const Report *p)
{
    const SimResult *r = p->r;
    const uint32_t base = (uint32_t)r->report_rank * r->n_ops;
    /* The reported rank's pipeline stage (world ranks tp-fastest, then stage). */
    const uint32_t stage = (r->first_rank[r->report_rank] / (uint32_t)p->plan->mp) %
                           (uint32_t)MAX(r->stages, 1);
    double seconds[ZP_COMP_N + ZP_COLL_N] = {0}, count[ZP_COMP_N + ZP_COLL_N] = {0};
    for (uint32_t i = 0; i < r->n_ops; i++) {
        const ZpOp *op = zp_sched_op(p->sched, i);
        if ((op->kind != ZP_OP_COMPUTE && op->kind != ZP_OP_COLLECTIVE) || op->stage != stage)
            continue;
        const int type = op->kind == ZP_OP_COMPUTE ? op->sub : ZP_COMP_N + op->sub;
        seconds[type] += r->op_end_s[base + i] - r->op_start_s[base + i];
        count[type] += 1;
    }
    json_t *o = json_object();
    for (int k = 0; k < ZP_COMP_N + ZP_COLL_N; k++)
        if (count[k] > 0)
            json_object_set_new(o, k < ZP_COMP_N ? zp_sched_compute_name(k)
                                                 : zp_sched_coll_name(k - ZP_COMP_N),
                                json_pack("{s:f, s:f}", "count", count[k], "total_s", seconds[k]));
    return o;
}

/* Data-parallel bytes: the DP group's and those of ZeRO++'s subgroups of it. */
static double dp_bytes(const SimResult *r)
{
    return r->comm_bytes[ZP_GROUP_DP] + r->comm_bytes[ZP_GROUP_HPZ] +
           r->comm_bytes[ZP_GROUP_NODE] + r->comm_bytes[ZP_GROUP_XNODE];
}

static int print_json(const Report *p)
{
    const SimResult *r = p->r;
    json_t *root = json_pack(
        "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f,"
        " s:{s:f, s:f, s:f}, s:f, s:o, s:f, s:b, s:{s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f},"
        " s:i, s:i, s:s, s:I, s:I}",
        "model", p->model->name, "cluster", p->hw->name, "stage", p->plan->zero.stage,
        "gpus", p->sched->world, "dp", p->plan->dp, "mp", p->plan->mp, "micro_batch",
        p->plan->micro_batch, "grad_accum", p->plan->grad_accum, "step_time_s", r->step_time_s,
        "samples_per_s", samples_per_s(p), "tflops_per_gpu", flops_per_gpu(p) / 1e12, "mfu",
        flops_per_gpu(p) / p->peak_flops, "model_flops_per_gpu", r->model_flops,
        "recompute_flops_per_gpu", r->recompute_flops, "comm_bytes_per_rank", "dp",
        dp_bytes(r), "tp", r->comm_bytes[ZP_GROUP_TP], "pp",
        r->comm_bytes[ZP_GROUP_PP], "peak_memory_bytes",
        r->peak_memory_bytes, "peak_breakdown", zp_sched_categories_json(r->peak_breakdown_bytes),
        "peak_model_state_bytes", r->peak_model_state_bytes, "fits_in_gpu_memory",
        bytes_over(p) <= 0, "breakdown", "compute_s",
        r->compute_s, "exposed_comm_s", r->exposed_comm_s, "optimizer_s", r->optimizer_s,
        "idle_s", r->idle_s, "stream_busy_s", "compute", r->stream_busy_s[ZP_STREAM_COMPUTE],
        "dp", r->stream_busy_s[ZP_STREAM_DP], "tp", r->stream_busy_s[ZP_STREAM_TP],
        "ranks_simulated", r->ranks_simulated, "report_rank", (int)r->first_rank[r->report_rank], "mode",
        sim_mode_name(r->mode), "op_events", (json_int_t)r->op_events, "heap_events",
        (json_int_t)r->heap_events);
    json_object_set_new(root, "category_peak_bytes", zp_sched_categories_json(r->category_peak_bytes));
    /* A schedule file's other communicators (a world group, node groups): their bytes too. */
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(p->sched, groups);
    json_t *comm = json_object_get(root, "comm_bytes_per_rank");
    for (int g = ZP_GROUP_N; g < n_groups; g++)
        json_object_set_new(comm, groups[g].name, json_real(r->comm_bytes[g]));
    json_object_set_new(root, "cost_model", json_string(r->cost_model));
    json_t *by_class = compute_by_class_json(p);
    if (by_class)
        json_object_set_new(root, "compute_by_class", by_class);
    if (p->defaults_taken) {
        json_t *taken = json_array();
        for (guint i = 0; i < p->defaults_taken->len; i++)
            json_array_append_new(taken, json_string(g_ptr_array_index(p->defaults_taken, i)));
        json_object_set_new(root, "defaults_taken", taken);
    }
    json_object_set_new(root, "collective_model", json_string(r->collective_model));
    /* Whether zreal's CPU backend workspace is listed (zplan validate notes when not). */
    json_object_set_new(root, "backend_workspace", json_boolean(p->sched->plan.backend_workspace));
    json_object_set_new(root, "model_state_bytes",
                        json_real(zp_sched_model_state_bytes(p->sched)));
    json_object_set_new(root, "ops", ops_json(p));
    json_object_set_new(root, "caching_allocator", alloc_json(&p->alloc));
    if (zp_model_has_architecture(p->model)) { /* a graph without a model has no buckets */
        const ZpConstantBuffers cb = zp_zeror_constant_buffers(p->model, p->plan);
        json_object_set_new(root, "constant_buffers",
                            json_pack("{s:f, s:f, s:s?}", "constant_bytes", cb.constant_bytes,
                                      "model_sized_bytes", cb.model_sized_bytes,
                                      "model_sized_what", cb.model_sized_what));
    }
    json_object_set_new(root, "zeropp_comm_bytes_per_rank",
                        json_pack("{s:f, s:f, s:f, s:f}", "dp_group", r->comm_bytes[ZP_GROUP_DP],
                                  "hpz", r->comm_bytes[ZP_GROUP_HPZ], "node",
                                  r->comm_bytes[ZP_GROUP_NODE], "xnode",
                                  r->comm_bytes[ZP_GROUP_XNODE]));
    json_t *slow[2] = {json_array(), json_array()};
    for (uint32_t k = 0; k < p->options->n_slow_ranks; k++)
        json_array_append_new(slow[0], json_pack("[i, f]", (int)p->options->slow_ranks[k].index,
                                                 p->options->slow_ranks[k].factor));
    for (uint32_t k = 0; k < p->options->n_slow_nodes; k++)
        json_array_append_new(slow[1], json_pack("[i, f]", (int)p->options->slow_nodes[k].index,
                                                 p->options->slow_nodes[k].factor));
    json_object_set_new(root, "slow_ranks", slow[0]);
    json_object_set_new(root, "slow_links", slow[1]);
    json_object_set_new(root, "plan", zp_plan_to_json(p->plan));
    cli_pipe_json(root, p->plan, r);
    json_t *budget = cli_budget_json(p->budget, r->step_time_s, tokens_per_step(p),
                                     p->sched->world);
    if (budget)
        json_object_set_new(root, "budget", budget);
    json_object_set_new(root, "notes", cli_notes_json());
    /* the figure the verdict gives and memory's need_bytes: the allocator's need + reserve */
    json_object_set_new(root, "need_bytes", json_real(p->hw->gpu_memory_bytes + bytes_over(p)));
    GError *error = NULL;
    const gboolean ok = zp_json_write(root, NULL, &error);
    json_decref(root);
    return ok ? 0 : cli_fail("simulate", error);
}

static void print_breakdown(const Report *p)
{
    const SimResult *r = p->r;
    const struct {
        const char *label;
        double seconds;
    } rows[] = {
        {"compute", r->compute_s},
        {"exposed communication", r->exposed_comm_s},
        {"optimizer", r->optimizer_s},
        {"CPU optimizer", r->cpu_optimizer_s},
        {"offload transfer", r->offload_transfer_s},
        {"idle", r->idle_s},
    };
    printf("\n  breakdown of the step (rank %u)   seconds    share\n",
           r->first_rank[r->report_rank]);
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++)
        if (i < 3 || i == G_N_ELEMENTS(rows) - 1 || zp_offload_any(p->plan))
            printf("    %-28s %10.4f %7.1f%%\n", rows[i].label, rows[i].seconds,
                   100.0 * rows[i].seconds / r->step_time_s);
    if (zp_offload_any(p->plan))
        printf("  host link %.4f s busy (%.3f GB down, %.3f GB up), NVMe %.4f s busy (%.3f GB "
               "read, %.3f GB written), CPU Adam %.4f s\n",
               r->stream_busy_s[ZP_STREAM_HOST], r->offload_bytes[ZP_XFER_D2H] / GB,
               r->offload_bytes[ZP_XFER_H2D] / GB, r->stream_busy_s[ZP_STREAM_NVME],
               r->offload_bytes[ZP_XFER_NVME_READ] / GB, r->offload_bytes[ZP_XFER_NVME_WRITE] / GB,
               r->stream_busy_s[ZP_STREAM_CPU]);
    printf("  streams busy: compute %.4f s, dp-comm %.4f s, tp-comm %.4f s\n",
           r->stream_busy_s[ZP_STREAM_COMPUTE], r->stream_busy_s[ZP_STREAM_DP],
           r->stream_busy_s[ZP_STREAM_TP]);
}

static void print_memory(const Report *p)
{
    const SimResult *r = p->r;
    char *capacity = cli_capacity(p->hw->gpu_memory_bytes);
    printf("\n  peak memory per rank           %10.3f GB (of %s), live at the peak:\n",
           r->peak_memory_bytes / GB, capacity);
    g_free(capacity);
    for (int c = 0; c < ZP_MEM_N; c++)
        if (r->peak_breakdown_bytes[c] > 0)
            printf("    %-28s %10.3f GB\n", zp_sched_mem_name(c), r->peak_breakdown_bytes[c] / GB);
    if (zp_model_has_architecture(p->model)) {
        const ZpConstantBuffers cb = zp_zeror_constant_buffers(p->model, p->plan);
        printf("  constant buffers (CB)          %10.3f GB of fixed-size buckets",
               cb.constant_bytes / GB);
        if (cb.model_sized_what)
            printf("; %.3f GB sized by the model (%s)", cb.model_sized_bytes / GB,
                   cb.model_sized_what);
        printf("\n");
    }
    const ZpAllocStats *a = &p->alloc;
    printf("  caching allocator (replay)     %10.3f GB allocated, %.3f GB reserved at that "
           "peak (largest free block %.3f GB); reserved peaks at %.3f GB\n",
           a->peak_allocated_bytes / GB, a->reserved_at_peak_bytes / GB,
           a->largest_free_at_peak_bytes / GB, a->peak_reserved_bytes / GB);
    if (a->oom)
        printf("  out of memory%s: a %.3f GB request with %.3f GB allocated and %.3f GB "
               "reserved; the largest free block is %.3f GB\n",
               a->oom_fragmented ? " from fragmentation" : "", a->oom_request_bytes / GB,
               a->oom_allocated_bytes / GB, a->oom_reserved_bytes / GB,
               a->oom_largest_free_bytes / GB);
    printf("  (model states peak at %.3f GB; the CUDA context and allocator reserve of %.1f GB "
           "come on top)\n",
           r->peak_model_state_bytes / GB, p->hw->runtime_reserve_bytes / GB);
}

/* A count as DeepSpeed's configs write it: "5e7", "2.3e8". */
static char *elems_text(double count)
{
    if (count < 1)
        return g_strdup_printf("%g", count);
    const int exponent = (int)floor(log10(count));
    return g_strdup_printf("%.2ge%d", count / pow(10, exponent), exponent);
}

/* Why a step that is mostly exposed communication is so, in one line: the first diagnosis
 * whose condition holds. */
static void print_exposed_reason(const Report *p)
{
    const SimResult *r = p->r;
    const ZpPlan *plan = p->plan;
    if (r->exposed_comm_s <= 0.5 * r->step_time_s)
        return;
    const double block_elems = p->sched->n_units > 2 ? (double)p->sched->unit_elems[1] : 0;
    char *why;
    if (plan->zero.stage == 3 && plan->zero.stage3_prefetch_bucket_size < block_elems) {
        char *prefetch = elems_text(plan->zero.stage3_prefetch_bucket_size);
        char *block = elems_text(block_elems);
        why = g_strdup_printf("stage-3 gathers are not prefetched: stage3_prefetch_bucket_size "
                              "%s is smaller than one block (%s elements)", prefetch, block);
        g_free(prefetch);
        g_free(block);
    } else if (!plan->zero.overlap_comm && plan->dp > 1)
        why = g_strdup("overlap_comm is off: the gradient reduction waits for the backward "
                       "pass instead of running beside it");
    else if (r->stream_busy_s[ZP_STREAM_TP] > r->stream_busy_s[ZP_STREAM_DP])
        why = g_strdup_printf("the tensor-parallel all-reduces (%.3f s) sit between compute "
                              "ops and cannot be hidden: use a smaller --mp",
                              r->stream_busy_s[ZP_STREAM_TP]);
    else
        why = g_strdup_printf("the data-parallel collectives (%.3f s) take longer than the "
                              "compute they could hide behind (%.3f s): a larger micro-batch or "
                              "more accumulation amortises them",
                              r->stream_busy_s[ZP_STREAM_DP], r->stream_busy_s[ZP_STREAM_COMPUTE]);
    printf("Mostly exposed communication (%.0f%% of the step): %s.\n",
           100 * r->exposed_comm_s / r->step_time_s, why);
    g_free(why);
}

/* --html: the page of this step (cli_report), titled by the plan, opening with the verdict. */
static gboolean write_html(const Report *p, const char *path, GError **error)
{
    char *detail = g_strdup_printf("allocator-reserved peak + %.1f GB reserve",
                                   p->hw->runtime_reserve_bytes / GB);
    char *verdict = cli_verdict("the step", detail, p->hw->gpu_memory_bytes + bytes_over(p),
                                p->hw->gpu_memory_bytes);
    char *title = g_strdup_printf("%s on %d x %s (%s): ZeRO stage %d, DP %d x MP %d, micro-batch "
                                  "%d x %d, %.4f s a step", p->model->name, p->sched->world,
                                  p->hw->gpu, p->hw->name, p->plan->zero.stage, p->plan->dp,
                                  p->plan->mp, p->plan->micro_batch, p->plan->grad_accum,
                                  p->r->step_time_s);
    const gboolean ok = cli_report_html(path, title, verdict, p->sched, p->r, p->hw, error);
    g_free(title), g_free(verdict), g_free(detail);
    return ok;
}

static void print_human(const Report *p)
{
    const SimResult *r = p->r;
    const ZpPlan *plan = p->plan;
    char *detail = g_strdup_printf("allocator-reserved peak + %.1f GB reserve%s",
                                   p->hw->runtime_reserve_bytes / GB,
                                   p->alloc.oom_fragmented ? "; out of memory from fragmentation"
                                                           : "");
    char *verdict = cli_verdict("the step", detail,
                                p->hw->gpu_memory_bytes + bytes_over(p),
                                p->hw->gpu_memory_bytes);
    printf("%s\n", verdict);
    g_free(verdict);
    g_free(detail);
    print_exposed_reason(p);
    cli_print_defaults();
    char *pipe_text = zp_plan_pp(plan) > 1
                          ? g_strdup_printf(" x PP %d (%s, %d chunk(s) a stage, %s partition)",
                                            zp_plan_pp(plan),
                                            zp_pipe_schedule_name(plan->pipe.schedule),
                                            zp_plan_vstages(plan),
                                            zp_partition_name(plan->pipe.partition))
                          : g_strdup("");
    if (p->schedule_path)
        printf("Simulated the schedule %s (%u ops a rank, %s) on %d x %s (%s): DP %d x MP %d.\n",
               p->schedule_path, p->sched->ops->len, zp_precision_name(plan->precision),
               p->sched->world, p->hw->gpu, p->hw->name, plan->dp, plan->mp);
    else
        printf("Simulated one step of %s on %d x %s (%s): ZeRO stage %d, DP %d x MP %d%s%s, "
               "micro-batch %d x %d accumulation step(s),\n%s %s, overlap_comm %s, %s.\n",
               p->model->name, p->sched->world, p->hw->gpu, p->hw->name, plan->zero.stage,
               plan->dp, plan->mp, pipe_text, plan->sequence_parallel ? " (sequence parallel)" : "",
               plan->micro_batch, plan->grad_accum,
               zp_precision_name(plan->precision), zp_optimizer_name(plan->optimizer),
               plan->zero.overlap_comm ? "on" : "off",
               plan->checkpoint ? "activation checkpointing" : "no activation checkpointing");
    g_free(pipe_text);
    cli_pipe_print_placement(plan, p->hw);
    printf("Compute costed by: %s.\n", r->cost_model);
    if (r->collective_model[0])
        printf("Collectives costed by: %s.\n", r->collective_model);
    if (r->mode == SIM_MODE_FOLDED && r->ranks_simulated > MAX(r->stages, 1))
        printf("Ranks: folded - %d simulated ranks stand for the %d, one for each class of "
               "alike ranks (the slowed ranks and those that wait for them differently are "
               "classes of their own); --explicit simulates every rank, with the same "
               "results.\n\n",
               r->ranks_simulated, r->world);
    else if (r->mode == SIM_MODE_FOLDED)
        printf("Ranks: folded - one simulated rank stands for each class of %d (every rank of "
               "a pipeline stage runs the same schedule and its groups are placed alike).\n\n",
               r->world);
    else
        printf("Ranks: explicit - all %d ranks simulated, collectives wait for their real "
               "group members.\n\n",
               r->ranks_simulated);
    for (uint32_t k = 0; k < p->options->n_slow_ranks; k++)
        printf("Slowed: rank %u computes %g times slower.\n", p->options->slow_ranks[k].index,
               p->options->slow_ranks[k].factor);
    for (uint32_t k = 0; k < p->options->n_slow_nodes; k++)
        printf("Slowed: node %u's network moves data %g times slower.\n",
               p->options->slow_nodes[k].index, p->options->slow_nodes[k].factor);
    if (p->options->n_slow_ranks + p->options->n_slow_nodes > 0)
        printf("\n");
    printf("  step time                      %10.4f s\n", r->step_time_s);
    printf("  samples/s                      %10.2f\n", samples_per_s(p));
    char *budget = cli_budget_line(p->budget, r->step_time_s, tokens_per_step(p),
                                   p->sched->world);
    if (budget)
        printf("  %s\n", budget);
    g_free(budget);
    printf("  model TFLOP/s per GPU          %10.1f   (model FLOPs: forward and backward, not "
           "recomputation or the optimizer)\n",
           flops_per_gpu(p) / 1e12);
    printf("  MFU                            %10.1f %% (of the %.0f TFLOP/s %s peak)\n",
           100.0 * flops_per_gpu(p) / p->peak_flops, p->peak_flops / 1e12,
           zp_precision_name(plan->precision));
    print_breakdown(p);
    printf("\n  bytes sent per rank            %10.3f GB data-parallel, %.3f GB tensor-parallel, "
           "%.3f GB pipeline",
           dp_bytes(r) / GB, r->comm_bytes[ZP_GROUP_TP] / GB, r->comm_bytes[ZP_GROUP_PP] / GB);
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(p->sched, groups);
    for (int g = ZP_GROUP_N; g < n_groups; g++)
        printf(", %.3f GB %s", r->comm_bytes[g] / GB, groups[g].name);
    printf("\n");
    if (dp_bytes(r) > r->comm_bytes[ZP_GROUP_DP])
        printf("    ZeRO++ subgroups             %10.3f GB hpZ (in the node), %.3f GB qgZ in the "
               "node, %.3f GB qgZ across nodes\n",
               r->comm_bytes[ZP_GROUP_HPZ] / GB, r->comm_bytes[ZP_GROUP_NODE] / GB,
               r->comm_bytes[ZP_GROUP_XNODE] / GB);
    print_memory(p);
    cli_pipe_print_stages(r);
    print_tiers(p);
    printf("\n  %" G_GUINT64_FORMAT " op events on %d simulated rank(s), %" G_GUINT64_FORMAT
           " queue events\n",
           r->op_events, r->ranks_simulated, r->heap_events);
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
    ZpSchedule *sched = zp_sched_read_graph(f->schedule, error);
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

/* Where offload puts the model states (and Pa+cpu the checkpoints): per rank and per node. */
static void print_tiers(const Report *p)
{
    const ZpSchedule *s = p->sched;
    const double ckpt_host = s->host_bytes[ZP_MEM_CHECKPOINTS];
    if (!zp_offload_any(p->plan) && ckpt_host == 0)
        return;
    const int per_node = MIN(p->hw->gpus_per_node, s->world);
    double host = 0, nvme = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        host += s->host_bytes[c], nvme += s->nvme_bytes[c];
    char *ckpt = ckpt_host > 0 ? g_strdup_printf(", checkpoints %.3f GB (cpu_checkpointing)",
                                                 ckpt_host / GB)
                               : g_strdup("");
    printf("  offload: optimizer %s, parameters %s%s; host memory %.3f GB per rank, %.1f GB per "
           "node of %.1f GB; NVMe %.3f GB per rank, %.1f GB per node of %.1f GB\n",
           zp_offload_device_name(p->plan->zero.offload_optimizer.device),
           zp_offload_device_name(p->plan->zero.offload_param.device), ckpt, host / GB,
           per_node * host / GB, p->hw->cpu_memory_bytes / GB, nvme / GB, per_node * nvme / GB,
           p->hw->nvme_bytes / GB);
    g_free(ckpt);
}

/* --kernels NAME: the inventory the GPU's compute is costed from (zp_inventory), in the plan
 * and in a schedule file's plan. */
static gboolean kernels_flag(const SimulateFlags *f, ZpPlan *sched_plan, ZpPlan *plan,
                             GError **error)
{
    if (!f->kernels)
        return TRUE;
    const ZpInventory *inv = zp_inventory_find(f->kernels, "--kernels", error);
    if (!inv)
        return FALSE;
    g_strlcpy(plan->kernels, inv->name, sizeof plan->kernels);
    if (sched_plan)
        g_strlcpy(sched_plan->kernels, inv->name, sizeof sched_plan->kernels);
    return TRUE;
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
    if (!sched && !(sched = zp_sched_build(&model, &plan, &error)))
        return cli_fail(f->command, error);
    say_defaults_taken(f);
    if (!host_tiers_fit(sched, &hw, &error)) { /* refused: the host or NVMe cannot hold it */
        zp_sched_free(sched);
        fprintf(stderr, "zplan %s: %s\n", f->command, error->message);
        g_error_free(error);
        return CLI_EXIT_DOES_NOT_FIT;
    }
    char *what = g_strdup_printf("zplan simulate: %d rank(s) of %u ops",
                                 f->explicit_ranks ? sched->world : 1, sched->ops->len);
    CliProgress *progress = cli_progress_new(what);
    g_free(what);
    SimOptions options = {
        .mode = f->explicit_ranks ? SIM_MODE_EXPLICIT : SIM_MODE_FOLDED,
        .record_timeline = f->trace != NULL || f->json || f->sink || f->html != NULL,
        .progress = cli_progress_update,
        .progress_ctx = progress,
    };
    SimResult *result = NULL;
    if (slow_flags(f, &plan, &hw, &options, &error))
        result = sim_engine_run(sched, &hw, &options, &error);
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
        const Report report = {
            &model, &hw, &plan, sched, result, peak_flops, &options, f->schedule,
            f->ds_config ? f->defaults_taken : NULL,
            zp_alloc_replay_schedule(sched, hw.gpu_memory_bytes - hw.runtime_reserve_bytes),
            &f->budget};
        if (f->html && !write_html(&report, f->html, &error))
            status = cli_fail(f->command, error);
        else if (f->sink)
            status = f->sink(&(CliSimulated){&model, &hw, &plan, sched, result, report.alloc},
                             f->sink_ctx);
        else if (f->json)
            status = print_json(&report);
        else
            print_human(&report);
        if (status == 0 && !f->sink && bytes_over(&report) > 0)
            status = CLI_EXIT_DOES_NOT_FIT;
    }
    sim_result_free(result);
    zp_sched_free(sched);
    g_free((SimSlow *)options.slow_ranks);
    g_free((SimSlow *)options.slow_nodes);
    return status;
}

/* The flags that make a plan, shared by `simulate` and `schedule`; NULL-terminated. */
static void plan_entries(SimulateFlags *f, GOptionEntry out[45])
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
        {"ds-config", 0, 0, G_OPTION_ARG_FILENAME, &f->ds_config, "Take the plan from a DeepSpeed ds_config.json (with --gpus; its tensor_parallel.autotp_size or --mp)", "FILE"},
        CLI_SEQ_ENTRY(&f->seq),
        {"attention", 0, 0, G_OPTION_ARG_STRING, &f->attention, "eager, flash (the profile's fused kernel) or a kernel its attention table lists (default: what PyTorch's SDPA picks there)", "K"},
        {"reduce-dtype", 0, 0, G_OPTION_ARG_STRING, &f->reduce_dtype, "Gradient reduction dtype fp32, bf16 or fp16 (default: the gradients')", "D"},
        {"partition-activations", 0, 0, G_OPTION_ARG_NONE, &f->partition_activations, "ZeRO-R Pa: each checkpoint split across the MP ranks, all-gathered before its recompute (with --checkpoint)", NULL},
        {"cpu-checkpointing", 0, 0, G_OPTION_ARG_NONE, &f->cpu_checkpointing, "ZeRO-R Pa+cpu: checkpoints kept in host memory (with --checkpoint)", NULL},
        {"contiguous-memory", 0, 0, G_OPTION_ARG_NONE, &f->contiguous_memory, "ZeRO-R MD: checkpoints in one pre-allocated region (contiguous_memory_optimization)", NULL},
        {"quantized-weights", 0, 0, G_OPTION_ARG_NONE, &f->quantized_weights, "ZeRO++ qwZ: stage-3 all-gathers in block-quantised int8", NULL},
        {"hpz-partition-size", 0, 0, G_OPTION_ARG_STRING, &f->hpz, "ZeRO++ hpZ: a secondary parameter copy split over this many GPUs of a node (default 1: none); under --impl fsdp2, reshard_after_forward=N", "N"},
        {"quantized-gradients", 0, 0, G_OPTION_ARG_NONE, &f->quantized_gradients, "ZeRO++ qgZ: int4 gradients through the hierarchical all-to-all", NULL},
        {"impl", 0, 0, G_OPTION_ARG_STRING, &f->impl, "Whose ZeRO: deepspeed (default: DeepSpeed v0.19.6 as its source does it), fsdp (PyTorch FSDP), paper (the ZeRO paper's volumes), megatron (Megatron-Core's DDP and distributed optimizer: stages 0 and 1) or fsdp2 (PyTorch's fully_shard: stage 3 reshards after forward, stage 2 does not)", "I"},
        CLI_PIPE_ENTRIES(&f->pipe),
        CLI_OFFLOAD_ENTRIES(&f->offload_optimizer, &f->offload_param, &f->nvme_path),
        CLI_OFFLOAD_TUNING_ENTRIES(&f->tuning),
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    G_STATIC_ASSERT(G_N_ELEMENTS(entries) <= 45);
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
                      &f->megatron_args};
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
    GOptionEntry entries[45];
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

int cli_simulate(int argc, char **argv)
{
    SimulateFlags f = {0};
    const GOptionEntry extra[] = {
        {"explicit", 0, 0, G_OPTION_ARG_NONE, &f.explicit_ranks, "Simulate every rank, not one per class of identical ranks", NULL},
        {"json", 0, 0, G_OPTION_ARG_NONE, &f.json, "Print JSON", NULL},
        {"trace", 0, 0, G_OPTION_ARG_FILENAME, &f.trace, "Write a Chrome/Perfetto trace-event JSON", "FILE"},
        {"html", 0, 0, G_OPTION_ARG_FILENAME, &f.html, "Write the step as one HTML page (zplan report)", "OUT.html"},
        {"schedule", 0, 0, G_OPTION_ARG_FILENAME, &f.schedule, "Time this schedule file (zplan schedule --out, or written by hand; docs/schedule.md) instead of a plan: no --model or plan flags", "FILE"},
        {"kernels", 0, 0, G_OPTION_ARG_STRING, &f.kernels, "The kernel inventory a GPU profile's kernel_rates price: eager (PyTorch eager under autocast, as Hugging Face runs a model), megatron or deepspeed (default: the one --impl names, else eager)", "NAME"},
        {"slow-rank", 0, 0, G_OPTION_ARG_STRING_ARRAY, &f.slow_ranks, "Rank R computes FACTOR times slower (repeatable)", "R:FACTOR"},
        {"slow-link", 0, 0, G_OPTION_ARG_STRING_ARRAY, &f.slow_links, "Node NODE's network moves data FACTOR times slower (repeatable)", "NODE:FACTOR"},
        CLI_BUDGET_ENTRIES(&f.budget),
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    return run_with_flags(argc, argv, "simulate",
        "Builds the schedule of one optimizer step for a ZeRO plan and times it with a\n"
        "discrete-event simulator: compute by roofline, collectives by NCCL's cost model,\n"
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
    if (!sched || !zp_sched_write_json(sched, f->out, &error)) {
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
