/* zp_plan: plan defaults and the precision x optimizer table of bytes per parameter, the
 * knobs' names, and the plan's JSON with DeepSpeed's offload sections.
 * The table is the only place the "K" of the ZeRO paper is decided. */
#include "zp_plan.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

void zp_zero_config_defaults(ZpZeroConfig *zero, int stage)
{
    *zero = (ZpZeroConfig){
        .stage = stage,
        .reduce_bucket_size = 5e8,
        .allgather_bucket_size = 5e8,
        .overlap_comm = stage == 3,
        .contiguous_gradients = TRUE,
        .reduce_scatter = TRUE,
        .stage3_prefetch_bucket_size = 5e7,
        .stage3_param_persistence_threshold = 1e5,
        .stage3_max_live_parameters = 1e9,
        .stage3_max_reuse_distance = 1e9,
        .zero_hpz_partition_size = 1,
        .sub_group_size = 1e9,
        .use_multi_rank_bucket_allreduce = TRUE,
    };
    zp_offload_defaults(&zero->offload_optimizer, FALSE);
    zp_offload_defaults(&zero->offload_param, TRUE);
}

void zp_offload_defaults(ZpOffload *offload, gboolean param)
{
    *offload = (ZpOffload){.device = ZP_OFFLOAD_NONE, .pin_memory = TRUE,
                           .buffer_count = param ? 5 : 4, .buffer_size = 1e8,
                           .max_in_cpu = 1e9, .ratio = 1.0};
}

static const struct {
    const char *flag;
    size_t offset;
    double min;
} zero_knobs[ZP_KNOB_N] = {
    [ZP_KNOB_REDUCE_BUCKET] = {"--reduce-bucket-size",
                               G_STRUCT_OFFSET(ZpZeroConfig, reduce_bucket_size), 0},
    [ZP_KNOB_ALLGATHER_BUCKET] = {"--allgather-bucket-size",
                                  G_STRUCT_OFFSET(ZpZeroConfig, allgather_bucket_size), 1},
    [ZP_KNOB_PREFETCH_BUCKET] = {"--prefetch-bucket-size",
                                 G_STRUCT_OFFSET(ZpZeroConfig, stage3_prefetch_bucket_size), 0},
    [ZP_KNOB_MAX_LIVE] = {"--max-live-parameters",
                          G_STRUCT_OFFSET(ZpZeroConfig, stage3_max_live_parameters), 0},
    [ZP_KNOB_PERSISTENCE] = {"--persistence-threshold",
                             G_STRUCT_OFFSET(ZpZeroConfig, stage3_param_persistence_threshold), 0},
    [ZP_KNOB_MAX_REUSE] = {"--max-reuse-distance",
                           G_STRUCT_OFFSET(ZpZeroConfig, stage3_max_reuse_distance), 0},
};

const char *zp_zero_knob_flag(ZpZeroKnob knob)
{
    return zero_knobs[knob].flag;
}

gboolean zp_zero_knob_set(ZpZeroConfig *zero, ZpZeroKnob knob, const char *text, GError **error)
{
    return zp_parse_size(text, zero_knobs[knob].flag, ZP_SIZE_COUNT, zero_knobs[knob].min, 1e15,
                         TRUE, &G_STRUCT_MEMBER(double, zero, zero_knobs[knob].offset), error);
}

void zp_plan_defaults(ZpPlan *plan, int stage, int dp, int mp)
{
    memset(plan, 0, sizeof *plan);
    zp_zero_config_defaults(&plan->zero, stage);
    plan->dp = dp;
    plan->mp = mp;
    plan->micro_batch = 1;
    plan->grad_accum = 1;
    plan->precision = ZP_PREC_FP16;
    plan->optimizer = ZP_OPT_ADAM;
}

/* Optimizer state bytes per parameter beyond the master copy:
 *   Adam: fp32 momentum + variance = 8.
 *   SGD with momentum: fp32 momentum = 4.  Plain SGD: nothing.
 *   8-bit Adam (bitsandbytes, block-wise): 1 + 1 byte, plus one fp32 absmax per 2048-element
 *   block for each of the two states = 2 + 8/2048. */
static double optimizer_moment_bytes(ZpOptimizer optimizer)
{
    static const double moment_bytes[] = {
        [ZP_OPT_ADAM] = 8.0,
        [ZP_OPT_SGD_MOMENTUM] = 4.0,
        [ZP_OPT_SGD] = 0.0,
        [ZP_OPT_ADAM_8BIT] = 2.0 + 8.0 / 2048.0,
    };
    return moment_bytes[optimizer];
}

ZpStateBytes zp_plan_state_bytes(ZpPrecision precision, ZpOptimizer optimizer)
{
    /* Mixed precision keeps 16-bit params and grads and a 4-byte fp32 master copy inside the
     * optimizer states; fp32 training needs no master copy. Adam with fp16: 2 + 2 + 12. */
    const gboolean mixed = precision != ZP_PREC_FP32;
    const double elem = mixed ? 2.0 : 4.0;
    return (ZpStateBytes){
        .param_bytes = elem,
        .grad_bytes = elem,
        .optim_bytes = (mixed ? 4.0 : 0.0) + optimizer_moment_bytes(optimizer),
    };
}

double zp_plan_step_bytes(ZpStateBytes st)
{
    return st.grad_bytes + st.param_bytes + 2 * st.optim_bytes;
}

double zp_plan_elem_bytes(ZpPrecision precision)
{
    return precision == ZP_PREC_FP32 ? 4.0 : 2.0;
}

static const char *const precision_names[] = {"fp16", "bf16", "fp32", NULL};
static const char *const attention_names[] = {"eager", "flash1", "flash1-triton", "flash2",
                                              "flash3", "mem-efficient", NULL};
/* "grad" is the default's name in plan JSON; the flag takes the three dtypes. */
static const char *const reduce_names[] = {"grad", "fp32", "bf16", "fp16", NULL};

double zp_plan_reduce_bytes(const ZpPlan *plan)
{
    static const double bytes[] = {[ZP_REDUCE_FP32] = 4.0, [ZP_REDUCE_BF16] = 2.0,
                                   [ZP_REDUCE_FP16] = 2.0};
    return plan->reduce_dtype == ZP_REDUCE_GRAD
               ? zp_plan_state_bytes(plan->precision, plan->optimizer).grad_bytes
               : bytes[plan->reduce_dtype];
}

/* Each kernel's one property beyond its name: whether its work, where no profile rates it,
 * can be counted as eager attention's (its FLOPs as batched GEMMs, the softmax's passes) and
 * so priced without a rate. PyTorch's memory-efficient kernel (xFormers' CUTLASS kernel,
 * aten/src/ATen/native/transformers/cuda/mem_eff_attention) does the same QK^T and PV products
 * over the full s x s (no causal skipping counted) with the softmax in registers; counting
 * the eager softmax's passes over HBM as well is pessimistic. FlashAttention's kernels are
 * listed only where a profile rates them. */
static const gboolean attention_eager_work_unrated[ZP_ATTN_N] = {
    [ZP_ATTN_MEM_EFFICIENT] = TRUE,
};

gboolean zp_attention_fused(ZpAttention attention)
{
    return attention != ZP_ATTN_EAGER;
}

gboolean zp_attention_eager_work_unrated(ZpAttention attention)
{
    return attention_eager_work_unrated[attention];
}

gboolean zp_plan_attention_rated(const ZpPlan *plan)
{
    return zp_attention_fused(plan->attention) && !plan->attention_unrated;
}

const char *zp_attention_name(ZpAttention attention)
{
    return attention_names[attention];
}

const char *zp_reduce_dtype_name(ZpReduceDtype dtype)
{
    return reduce_names[dtype];
}
static const char *const impl_names[] = {"deepspeed", "fsdp", "paper", "megatron", "fsdp2",
                                         NULL};

const char *zp_impl_name(ZpImplKind impl)
{
    return impl_names[impl];
}

gboolean zp_impl_parse(const char *text, const char *flag, ZpImplKind *out, GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, impl_names, &v, error))
        return FALSE;
    *out = (ZpImplKind)v;
    return TRUE;
}

static const char *const recompute_names[] = {"none", "selective", "full", NULL};

gboolean zp_recompute_parse(const char *text, const char *flag, ZpRecompute *out,
                            GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, recompute_names, &v, error))
        return FALSE;
    *out = (ZpRecompute)v;
    return TRUE;
}

const char *zp_recompute_name(ZpRecompute r)
{
    return recompute_names[r];
}

ZpRecompute zp_plan_recompute(const ZpPlan *plan)
{
    return plan->checkpoint ? ZP_RECOMPUTE_FULL
           : plan->selective_recompute ? ZP_RECOMPUTE_SELECTIVE
                                       : ZP_RECOMPUTE_NONE;
}

void zp_plan_set_recompute(ZpPlan *plan, ZpRecompute r)
{
    plan->checkpoint = r == ZP_RECOMPUTE_FULL;
    plan->selective_recompute = r == ZP_RECOMPUTE_SELECTIVE;
}

static const char *const offload_names[] = {"none", "cpu", "nvme", NULL};

const char *zp_offload_device_name(ZpOffloadDevice device)
{
    return offload_names[device];
}

static const char *const optimizer_names[] = {"adam", "sgd-momentum", "sgd", "adam-8bit", NULL};

const char *zp_precision_name(ZpPrecision precision)
{
    return precision_names[precision];
}

const char *zp_optimizer_name(ZpOptimizer optimizer)
{
    return optimizer_names[optimizer];
}

gboolean zp_precision_parse(const char *text, const char *flag, ZpPrecision *out,
                            GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, precision_names, &v, error))
        return FALSE;
    *out = (ZpPrecision)v;
    return TRUE;
}

gboolean zp_optimizer_parse(const char *text, const char *flag, ZpOptimizer *out,
                            GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, optimizer_names, &v, error))
        return FALSE;
    *out = (ZpOptimizer)v;
    return TRUE;
}

gboolean zp_offload_device_parse(const char *text, const char *flag, ZpOffloadDevice *out,
                                 GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, offload_names, &v, error))
        return FALSE;
    *out = (ZpOffloadDevice)v;
    return TRUE;
}

gboolean zp_attention_parse(const char *text, const char *flag, ZpAttention *out,
                            GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, attention_names, &v, error))
        return FALSE;
    *out = (ZpAttention)v;
    return TRUE;
}

gboolean zp_reduce_dtype_parse(const char *text, const char *flag, ZpReduceDtype *out,
                               GError **error)
{
    int v;
    /* The flag names a dtype; plan JSON may also say "grad" (the default). */
    const gboolean json = strcmp(flag, "reduce_dtype") == 0;
    if (!zp_parse_choice(text, flag, json ? reduce_names : reduce_names + 1, &v, error))
        return FALSE;
    *out = (ZpReduceDtype)(json ? v : v + 1);
    return TRUE;
}

/* The pipeline's schedule and partition method (zp_pipe). */
static const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved", NULL};
static const char *const partition_names[] = {"uniform", "parameters", NULL};

const char *zp_pipe_schedule_name(ZpPipeSchedule schedule)
{
    return schedule_names[schedule];
}

static const char *const rank_order_names[] = {"tp-dp-pp", "tp-pp-dp", NULL};

const char *zp_rank_order_name(ZpRankOrder order)
{
    return rank_order_names[order];
}

gboolean zp_rank_order_parse(const char *text, const char *flag, ZpRankOrder *out,
                             GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, rank_order_names, &v, error))
        return FALSE;
    *out = (ZpRankOrder)v;
    return TRUE;
}

gboolean zp_plan_dispatcher_check(const ZpPlan *plan, const char *flag, GError **error)
{
    if (plan->experts.dispatcher != ZP_DISPATCH_ALLGATHER)
        return TRUE;
    const int ep = zp_plan_ep(plan), pp = zp_plan_pp(plan);
    if (plan->impl != ZP_IMPL_MEGATRON)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: allgather is Megatron-Core's "
                    "dispatcher (--impl megatron); %s's experts take the all-to-all", flag,
                    zp_impl_name(plan->impl));
    else if (zp_plan_etp(plan) > 1 && ep > 1 && pp > 1 && plan->rank_order != ZP_ORDER_TP_DP_PP)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: allgather over TP %d x EP %d with a "
                    "pipeline of %d stages under the tp-pp-dp order is not modeled: its TP x EP "
                    "group is not one run of ranks on the nodes (Megatron's default tp-dp-pp "
                    "order is)", flag, plan->mp, ep, pp);
    else
        return TRUE;
    return FALSE;
}

gboolean zp_plan_etp_check(const ZpPlan *plan, gboolean experts, const char *flag,
                           GError **error)
{
    const int etp = plan->experts.etp, mp = plan->mp, ep = zp_plan_ep(plan);
    const int pp = zp_plan_pp(plan);
    /* a dense model lays no experts out: its default ETP (DeepSpeed's 1) says nothing */
    const gboolean whole = experts && zp_plan_etp(plan) == 1 && mp > 1;
    if (etp != 0 && etp != 1 && etp != mp)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %d: experts split over the TP "
                    "degree (%d) or whole on each rank (1) are modeled", flag, etp, mp);
    else if (whole && plan->impl != ZP_IMPL_MEGATRON && plan->impl != ZP_IMPL_DEEPSPEED)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: 1 is Megatron-Core's "
                    "--expert-tensor-parallel-size (--impl megatron) and DeepSpeed's default; "
                    "%s's experts are timed split over TP", flag, zp_impl_name(plan->impl));
    else if (experts && plan->impl == ZP_IMPL_MEGATRON && pp > 1 &&
             plan->rank_order != ZP_ORDER_TP_DP_PP && zp_plan_etp(plan) * ep != mp)
        /* initialize.py passes order tp-cp-ep-pp-dp under --use-tp-pp-dp-mapping, and
         * parallel_state.py initialize_model_parallel asserts that an order not ending in pp
         * with a pipeline keeps the experts' data-parallel size the dense one's */
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: Megatron-Core under the tp-pp-dp order "
                    "(--use-tp-pp-dp-mapping) with a pipeline of %d stages needs ETP x EP = TP "
                    "(the experts' data-parallel size the dense one's: parallel_state.py "
                    "initialize_model_parallel asserts it), not ETP %d x EP %d over TP %d",
                    flag, pp, zp_plan_etp(plan), ep, mp);
    else if (whole && pp > 1 && ep % mp != 0 && mp % ep != 0)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: whole experts (1) with a pipeline "
                    "of %d stages need EP a multiple or a divisor of TP (%d, not %d): zplan "
                    "lays the expert groups out over whole tensor groups or inside one", flag,
                    pp, mp, ep);
    else if (whole && pp > 1 && ep != mp && plan->rank_order != ZP_ORDER_TP_DP_PP)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: whole experts (1) with a pipeline "
                    "of %d stages and EP %d over TP %d under the tp-pp-dp order are not "
                    "modeled: its expert groups are not runs of ranks on the nodes (the "
                    "tp-dp-pp order, Megatron's and DeepSpeed's default, is)", flag, pp, ep, mp);
    else
        return TRUE;
    return FALSE;
}

static const char *const dispatcher_names[] = {"alltoall", "allgather", NULL};

const char *zp_dispatcher_name(ZpDispatcher dispatcher)
{
    return dispatcher_names[dispatcher];
}

gboolean zp_dispatcher_parse(const char *text, const char *flag, ZpDispatcher *out,
                             GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, dispatcher_names, &v, error))
        return FALSE;
    *out = (ZpDispatcher)v;
    return TRUE;
}

const char *zp_partition_name(ZpPartition partition)
{
    return partition_names[partition];
}

gboolean zp_pipe_schedule_parse(const char *text, const char *flag, ZpPipeSchedule *out,
                                GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, schedule_names, &v, error))
        return FALSE;
    *out = (ZpPipeSchedule)v;
    return TRUE;
}

gboolean zp_partition_parse(const char *text, const char *flag, ZpPartition *out,
                            GError **error)
{
    int v;
    if (!zp_parse_choice(text, flag, partition_names, &v, error))
        return FALSE;
    *out = (ZpPartition)v;
    return TRUE;
}

/* zero_optimization keys that are numbers, with their slots: one table drives both the
 * writer and the reader. */
static const struct {
    const char *key;
    size_t offset;
} zero_numbers[] = {
    {"reduce_bucket_size", G_STRUCT_OFFSET(ZpZeroConfig, reduce_bucket_size)},
    {"allgather_bucket_size", G_STRUCT_OFFSET(ZpZeroConfig, allgather_bucket_size)},
    {"stage3_prefetch_bucket_size", G_STRUCT_OFFSET(ZpZeroConfig, stage3_prefetch_bucket_size)},
    {"stage3_param_persistence_threshold",
     G_STRUCT_OFFSET(ZpZeroConfig, stage3_param_persistence_threshold)},
    {"stage3_max_live_parameters", G_STRUCT_OFFSET(ZpZeroConfig, stage3_max_live_parameters)},
    {"stage3_max_reuse_distance", G_STRUCT_OFFSET(ZpZeroConfig, stage3_max_reuse_distance)},
    {"sub_group_size", G_STRUCT_OFFSET(ZpZeroConfig, sub_group_size)},
};
static const struct {
    const char *key;
    size_t offset;
} zero_flags[] = {
    {"overlap_comm", G_STRUCT_OFFSET(ZpZeroConfig, overlap_comm)},
    {"contiguous_gradients", G_STRUCT_OFFSET(ZpZeroConfig, contiguous_gradients)},
    {"reduce_scatter", G_STRUCT_OFFSET(ZpZeroConfig, reduce_scatter)},
    {"zero_quantized_weights", G_STRUCT_OFFSET(ZpZeroConfig, zero_quantized_weights)},
    {"zero_quantized_gradients", G_STRUCT_OFFSET(ZpZeroConfig, zero_quantized_gradients)},
    {"use_multi_rank_bucket_allreduce",
     G_STRUCT_OFFSET(ZpZeroConfig, use_multi_rank_bucket_allreduce)},
    {"stage3_allgather_sequential", G_STRUCT_OFFSET(ZpZeroConfig, stage3_allgather_sequential)},
    {"stage3_use_all_reduce_for_fetch_params",
     G_STRUCT_OFFSET(ZpZeroConfig, stage3_use_all_reduce_for_fetch_params)},
    {"fsdp2_no_reshard_after_forward",
     G_STRUCT_OFFSET(ZpZeroConfig, fsdp2_no_reshard_after_forward)},
};
/* activation_checkpointing's booleans, as DeepSpeed names them. */
static const struct {
    const char *key;
    size_t offset;
} ckpt_flags[] = {
    {"partition_activations", G_STRUCT_OFFSET(ZpCheckpointConfig, partition_activations)},
    {"cpu_checkpointing", G_STRUCT_OFFSET(ZpCheckpointConfig, cpu_checkpointing)},
    {"contiguous_memory_optimization",
     G_STRUCT_OFFSET(ZpCheckpointConfig, contiguous_memory_optimization)},
    {"synchronize_checkpoint_boundary",
     G_STRUCT_OFFSET(ZpCheckpointConfig, synchronize_checkpoint_boundary)},
};

static json_t *ckpt_to_json(const ZpCheckpointConfig *c)
{
    json_t *o = json_pack("{s:i}", "number_checkpoints", c->number_checkpoints);
    for (size_t i = 0; i < G_N_ELEMENTS(ckpt_flags); i++)
        json_object_set_new(o, ckpt_flags[i].key,
                            json_boolean(G_STRUCT_MEMBER(gboolean, c, ckpt_flags[i].offset)));
    return o;
}

static gboolean ckpt_from_json(json_t *o, const char *what, ZpCheckpointConfig *c,
                               GError **error)
{
    static const char *const keys[] = {"partition_activations", "cpu_checkpointing",
                                       "contiguous_memory_optimization",
                                       "synchronize_checkpoint_boundary", "number_checkpoints",
                                       NULL};
    int64_t number = 0;
    memset(c, 0, sizeof *c);
    if (!o)
        return TRUE;
    if (!json_is_object(o)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"activation_checkpointing\" must be an object", what);
        return FALSE;
    }
    if (!zp_json_check_keys(o, what, keys, error) ||
        !zp_json_get_int(o, what, "number_checkpoints", FALSE, 0, 1 << 24, &number, error))
        return FALSE;
    c->number_checkpoints = (int)number;
    for (size_t i = 0; i < G_N_ELEMENTS(ckpt_flags); i++)
        if (!zp_json_get_bool(o, what, ckpt_flags[i].key, FALSE,
                              G_STRUCT_MEMBER_P(c, ckpt_flags[i].offset), error))
            return FALSE;
    return TRUE;
}

void *zp_plan_to_json(const ZpPlan *plan)
{
    json_t *zero = json_pack("{s:i}", "stage", plan->zero.stage);
    for (size_t i = 0; i < G_N_ELEMENTS(zero_numbers); i++)
        json_object_set_new(zero, zero_numbers[i].key,
                            json_real(G_STRUCT_MEMBER(double, &plan->zero, zero_numbers[i].offset)));
    for (size_t i = 0; i < G_N_ELEMENTS(zero_flags); i++)
        json_object_set_new(zero, zero_flags[i].key,
                            json_boolean(G_STRUCT_MEMBER(gboolean, &plan->zero, zero_flags[i].offset)));
    json_object_set_new(zero, "zero_hpz_partition_size",
                        json_integer(plan->zero.zero_hpz_partition_size));
    zp_offload_add_json(zero, &plan->zero.offload_optimizer, &plan->zero.offload_param);
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:b, s:s, s:s, s:s, s:s, s:s, s:o, s:o, s:i}",
                          "stage", plan->zero.stage, "dp", plan->dp, "mp", plan->mp,
                          "micro_batch", plan->micro_batch, "grad_accum", plan->grad_accum,
                          "checkpoint", plan->checkpoint, "precision",
                          zp_precision_name(plan->precision), "optimizer",
                          zp_optimizer_name(plan->optimizer), "attention",
                          zp_attention_name(plan->attention), "reduce_dtype",
                          zp_reduce_dtype_name(plan->reduce_dtype), "impl",
                          zp_impl_name(plan->impl), "zero", zero,
                          "activation_checkpointing", ckpt_to_json(&plan->ckpt),
                          "gpus_per_node", plan->gpus_per_node);
    /* The 3D keys only where they say something, so that plans without them read as before. */
    if (zp_plan_pp(plan) > 1)
        json_object_set_new(o, "pipeline",
                            json_pack("{s:i, s:i, s:s, s:s}", "stages", zp_plan_pp(plan),
                                      "virtual_stages", zp_plan_vstages(plan), "schedule",
                                      zp_pipe_schedule_name(plan->pipe.schedule),
                                      "partition_method",
                                      zp_partition_name(plan->pipe.partition)));
    if (plan->selective_recompute)
        json_object_set_new(o, "recompute", json_string("selective"));
    if (plan->overlap_param_gather)
        json_object_set_new(o, "overlap_param_gather", json_true());
    if (plan->no_main_grad)
        json_object_set_new(o, "main_grad", json_false());
    if (plan->p2p_sync)
        json_object_set_new(o, "p2p_sync", json_true());
    if (plan->attention_unrated)
        json_object_set_new(o, "attention_unrated", json_true());
    if (plan->sequence_parallel)
        json_object_set_new(o, "sequence_parallel", json_true());
    if (plan->rank_order != ZP_ORDER_TP_DP_PP) /* only where it is not the default */
        json_object_set_new(o, "rank_order", json_string(zp_rank_order_name(plan->rank_order)));
    /* Expert parallelism (a mixture of experts) only where it is not the default. */
    ZpPlan reader = *plan; /* what a file without "etp" reads as: the framework's default */
    reader.experts.etp = 0;
    const gboolean own_etp =
        zp_plan_etp(plan) != plan->mp || zp_plan_etp(plan) != zp_plan_etp(&reader);
    if (zp_plan_ep(plan) > 1 || plan->experts.capacity_factor > 0 || plan->experts.skew > 1 ||
        plan->experts.dispatcher != ZP_DISPATCH_ALLTOALL || own_etp) {
        json_t *x = json_pack("{s:i, s:f, s:f}", "ep", zp_plan_ep(plan), "capacity_factor",
                              plan->experts.capacity_factor, "skew", zp_plan_expert_skew(plan));
        if (plan->experts.dispatcher != ZP_DISPATCH_ALLTOALL)
            json_object_set_new(x, "dispatcher",
                                json_string(zp_dispatcher_name(plan->experts.dispatcher)));
        if (own_etp)
            json_object_set_new(x, "etp", json_integer(zp_plan_etp(plan)));
        json_object_set_new(o, "experts", x);
    }
    return o;
}

/* "experts": {"ep", "capacity_factor" (0: dropless), "skew", "dispatcher", "etp"}, all
 * optional. */
static gboolean experts_from_json(json_t *o, const char *what, ZpExpertConfig *x,
                                  GError **error)
{
    static const char *const keys[] = {"ep", "capacity_factor", "skew", "dispatcher", "etp",
                                       NULL};
    char *inner = g_strdup_printf("%s: experts", what);
    char *flag = g_strdup_printf("%s.dispatcher", inner);
    int64_t ep = 1, etp = 0;
    double skew = 1;
    const char *dispatcher = NULL;
    const gboolean ok =
        json_is_object(o) && zp_json_check_keys(o, inner, keys, error) &&
        zp_json_get_int(o, inner, "ep", FALSE, 1, 1 << 20, &ep, error) &&
        zp_json_get_number(o, inner, "capacity_factor", FALSE, 0, 1000, &x->capacity_factor,
                           error) &&
        zp_json_get_number(o, inner, "skew", FALSE, 1, 1000, &skew, error) &&
        zp_json_get_string(o, inner, "dispatcher", FALSE, &dispatcher, error) &&
        (!dispatcher || zp_dispatcher_parse(dispatcher, flag, &x->dispatcher, error)) &&
        zp_json_get_int(o, inner, "etp", FALSE, 1, 1 << 20, &etp, error);
    g_free(flag);
    x->etp = (int)etp;
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", inner);
    g_free(inner);
    x->ep = (int)ep, x->skew = skew;
    return ok;
}

/* "pipeline": {"stages", "virtual_stages", "schedule", "partition_method"}, all optional. */
static gboolean pipe_from_json(json_t *o, const char *what, ZpPipeConfig *pipe, GError **error)
{
    static const char *const keys[] = {"stages", "virtual_stages", "schedule",
                                       "partition_method", NULL};
    char *inner = g_strdup_printf("%s: pipeline", what);
    int64_t stages = 1, v = 1;
    const char *schedule = NULL, *partition = NULL;
    gboolean ok = json_is_object(o) && zp_json_check_keys(o, inner, keys, error) &&
                  zp_json_get_int(o, inner, "stages", FALSE, 1, 65535, &stages, error) &&
                  zp_json_get_int(o, inner, "virtual_stages", FALSE, 1, 65535, &v, error) &&
                  zp_json_get_string(o, inner, "schedule", FALSE, &schedule, error) &&
                  (!schedule || zp_pipe_schedule_parse(schedule, "schedule", &pipe->schedule,
                                                       error)) &&
                  zp_json_get_string(o, inner, "partition_method", FALSE, &partition, error) &&
                  (!partition || zp_partition_parse(partition, "partition_method",
                                                    &pipe->partition, error));
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", inner);
    g_free(inner);
    pipe->stages = (int)stages;
    pipe->virtual_stages = (int)v;
    return ok;
}

static gboolean zero_from_json(json_t *zero, const char *what, ZpZeroConfig *z, GError **error)
{
    int64_t stage;
    if (!zp_json_get_int(zero, what, "stage", TRUE, 0, 3, &stage, error))
        return FALSE;
    static const char *const keys[] = {"stage", "reduce_bucket_size", "allgather_bucket_size",
                                       "stage3_prefetch_bucket_size",
                                       "stage3_param_persistence_threshold",
                                       "stage3_max_live_parameters", "stage3_max_reuse_distance",
                                       "sub_group_size", "overlap_comm", "contiguous_gradients",
                                       "reduce_scatter", "use_multi_rank_bucket_allreduce",
                                       "stage3_allgather_sequential",
                                       "stage3_use_all_reduce_for_fetch_params",
                                       "zero_quantized_weights", "zero_quantized_gradients",
                                       "zero_hpz_partition_size", "offload_optimizer",
                                       "offload_param", "fsdp2_no_reshard_after_forward",
                                       NULL};
    int64_t hpz = 1;
    if (!zp_json_check_keys(zero, what, keys, error) ||
        !zp_json_get_int(zero, what, "zero_hpz_partition_size", FALSE, 1, 1 << 16, &hpz, error))
        return FALSE;
    zp_zero_config_defaults(z, (int)stage);
    z->zero_hpz_partition_size = (int)hpz;
    for (size_t i = 0; i < G_N_ELEMENTS(zero_numbers); i++)
        if (!zp_json_get_number(zero, what, zero_numbers[i].key, FALSE, 0, 1e15,
                                G_STRUCT_MEMBER_P(z, zero_numbers[i].offset), error))
            return FALSE;
    for (size_t i = 0; i < G_N_ELEMENTS(zero_flags); i++)
        if (!zp_json_get_bool(zero, what, zero_flags[i].key, FALSE,
                              G_STRUCT_MEMBER_P(z, zero_flags[i].offset), error))
            return FALSE;
    /* The plan's own JSON holds no unmodeled option, so nothing warns. */
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    char *opt_what = g_strdup_printf("%s: zero.offload_optimizer", what);
    char *param_what = g_strdup_printf("%s: zero.offload_param", what);
    const gboolean ok = zp_offload_from_json(json_object_get(zero, "offload_optimizer"),
                                             opt_what, FALSE, &z->offload_optimizer, warnings,
                                             error) &&
                        zp_offload_from_json(json_object_get(zero, "offload_param"), param_what,
                                             TRUE, &z->offload_param, warnings, error);
    g_free(opt_what), g_free(param_what);
    g_ptr_array_unref(warnings);
    return ok;
}

gboolean zp_plan_from_json(void *json_object, const char *what, ZpPlan *plan, GError **error)
{
    json_t *o = json_object;
    int64_t dp, mp, micro, accum, node = 0;
    const char *precision, *optimizer, *attention = NULL, *reduce = NULL, *impl = NULL;
    const char *recompute = NULL, *order = NULL;
    gboolean checkpoint = FALSE, main_grad = TRUE;
    json_t *zero = json_object_get(o, "zero");
    if (!json_is_object(zero)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"zero\" must be an object", what);
        return FALSE;
    }
    static const char *const keys[] = {"stage", "dp", "mp", "micro_batch", "grad_accum",
                                       "checkpoint", "precision", "optimizer", "attention",
                                       "reduce_dtype", "impl", "zero", "activation_checkpointing",
                                       "gpus_per_node", "pipeline", "sequence_parallel",
                                       "recompute", "overlap_param_gather", "experts",
                                       "main_grad", "p2p_sync", "attention_unrated",
                                       "rank_order", NULL};
    json_t *pipeline = json_object_get(o, "pipeline");
    json_t *experts = json_object_get(o, "experts");
    memset(plan, 0, sizeof *plan);
    if (!zp_json_check_keys(o, what, keys, error) ||
        !zp_json_get_int(o, what, "dp", TRUE, 1, 1 << 24, &dp, error) ||
        !zp_json_get_int(o, what, "mp", TRUE, 1, 1 << 16, &mp, error) ||
        !zp_json_get_int(o, what, "micro_batch", TRUE, 1, 1 << 24, &micro, error) ||
        !zp_json_get_int(o, what, "grad_accum", TRUE, 1, 1 << 24, &accum, error) ||
        !zp_json_get_int(o, what, "gpus_per_node", FALSE, 0, 1 << 16, &node, error) ||
        !zp_json_get_bool(o, what, "checkpoint", TRUE, &checkpoint, error) ||
        !zp_json_get_string(o, what, "precision", TRUE, &precision, error) ||
        !zp_json_get_string(o, what, "optimizer", TRUE, &optimizer, error) ||
        !zp_precision_parse(precision, "precision", &plan->precision, error) ||
        !zp_optimizer_parse(optimizer, "optimizer", &plan->optimizer, error) ||
        !zp_json_get_string(o, what, "attention", FALSE, &attention, error) ||
        (attention && !zp_attention_parse(attention, "attention", &plan->attention, error)) ||
        !zp_json_get_string(o, what, "reduce_dtype", FALSE, &reduce, error) ||
        (reduce && !zp_reduce_dtype_parse(reduce, "reduce_dtype", &plan->reduce_dtype, error)) ||
        !zp_json_get_string(o, what, "impl", FALSE, &impl, error) ||
        !zp_impl_parse(impl ? impl : "paper", "impl", &plan->impl, error) ||
        !zp_json_get_bool(o, what, "sequence_parallel", FALSE, &plan->sequence_parallel,
                          error) ||
        !zp_json_get_string(o, what, "recompute", FALSE, &recompute, error) ||
        !zp_json_get_string(o, what, "rank_order", FALSE, &order, error) ||
        (order && !zp_rank_order_parse(order, "rank_order", &plan->rank_order, error)) ||
        !zp_json_get_bool(o, what, "overlap_param_gather", FALSE, &plan->overlap_param_gather,
                          error) ||
        !zp_json_get_bool(o, what, "main_grad", FALSE, &main_grad,
                          error) ||
        !zp_json_get_bool(o, what, "p2p_sync", FALSE, &plan->p2p_sync, error) ||
        !zp_json_get_bool(o, what, "attention_unrated", FALSE, &plan->attention_unrated,
                          error) ||
        (pipeline && !pipe_from_json(pipeline, what, &plan->pipe, error)) ||
        (experts && !experts_from_json(experts, what, &plan->experts, error)) ||
        !zero_from_json(zero, what, &plan->zero, error) ||
        !ckpt_from_json(json_object_get(o, "activation_checkpointing"), what, &plan->ckpt,
                        error))
        return FALSE;
    plan->dp = (int)dp, plan->mp = (int)mp, plan->micro_batch = (int)micro;
    plan->grad_accum = (int)accum, plan->checkpoint = checkpoint;
    plan->gpus_per_node = (int)node;
    plan->no_main_grad = !main_grad;
    if (plan->attention_unrated && !zp_attention_eager_work_unrated(plan->attention)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"attention_unrated\": '%s' is never priced as eager attention",
                    what, zp_attention_name(plan->attention));
        return FALSE;
    }
    /* "recompute" is written only for the selective kind; "full" is "checkpoint" */
    if (recompute) {
        ZpRecompute r;
        if (!zp_recompute_parse(recompute, "recompute", &r, error))
            return FALSE;
        zp_plan_set_recompute(plan, r);
    }
    return TRUE;
}

void zp_plan_optimizer_split(const ZpPlan *plan, double *master, double *m, double *v)
{
    const ZpStateBytes st = zp_plan_state_bytes(plan->precision, plan->optimizer);
    *master = plan->precision == ZP_PREC_FP32 ? 0.0 : 4.0;
    const double moments = st.optim_bytes - *master;
    const gboolean two = plan->optimizer == ZP_OPT_ADAM || plan->optimizer == ZP_OPT_ADAM_8BIT;
    *m = two ? moments / 2 : moments;
    *v = two ? moments / 2 : 0.0;
}

/* ---- offload_optimizer and offload_param: DeepSpeed v0.19.6's sections
 * (deepspeed/runtime/zero/offload_config.py) ---- */

gboolean zp_offload_check(const ZpPlan *plan, GError **error)
{
    const ZpZeroConfig *z = &plan->zero;
    const char *bad = NULL;
    if (z->offload_optimizer.device != ZP_OFFLOAD_NONE && z->stage < 1)
        bad = "offload_optimizer: needs ZeRO stage 1, 2 or 3";
    else if (z->offload_param.device != ZP_OFFLOAD_NONE && z->stage != 3)
        bad = "offload_param: needs ZeRO stage 3 (DeepSpeed partitions parameters only there)";
    else if (z->offload_optimizer.ratio < 1.0 && z->stage != 3 &&
             z->offload_optimizer.device != ZP_OFFLOAD_NONE)
        bad = "offload_optimizer.ratio: below 1 only with ZeRO stage 3 (partial offload)";
    else if (z->offload_optimizer.ratio < 0 || z->offload_optimizer.ratio > 1)
        bad = "offload_optimizer.ratio: must be from 0 to 1";
    if (bad)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
    return bad == NULL;
}

static const char *const optimizer_keys[] = {"device", "nvme_path", "buffer_count",
                                             "pin_memory", "ratio", "pipeline_read",
                                             "pipeline_write", "fast_init", "super_offload",
                                             "cpuadam_cores_perc", NULL};
static const char *const param_keys[] = {"device", "nvme_path", "buffer_count", "buffer_size",
                                         "max_in_cpu", "pin_memory", NULL};
/* offload_optimizer's options that change only how the swaps are pipelined or initialised. */
static const char *const unmodeled[] = {"pipeline_read", "pipeline_write", "fast_init",
                                        "super_offload", "cpuadam_cores_perc"};

static gboolean read_count(json_t *o, const char *what, const char *key, double *out,
                           GError **error)
{
    int64_t n;
    if (!json_object_get(o, key))
        return TRUE;
    if (!zp_json_get_int(o, what, key, TRUE, 0, 1000000000000000LL, &n, error))
        return FALSE;
    *out = (double)n;
    return TRUE;
}

gboolean zp_offload_from_json(void *section, const char *what, gboolean param,
                              ZpOffload *offload, GPtrArray *warnings, GError **error)
{
    json_t *o = section;
    zp_offload_defaults(offload, param);
    if (!o)
        return TRUE;
    if (!json_is_object(o)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s must be an object", what);
        return FALSE;
    }
    const char *device = "none", *path = NULL;
    char *device_key = g_strdup_printf("%s: key \"device\"", what);
    gboolean ok = zp_json_check_keys(o, what, param ? param_keys : optimizer_keys, error) &&
                  zp_json_get_string(o, what, "device", FALSE, &device, error) &&
                  zp_offload_device_parse(device, device_key, &offload->device, error) &&
                  zp_json_get_string(o, what, "nvme_path", FALSE, &path, error) &&
                  zp_json_get_bool(o, what, "pin_memory", FALSE, &offload->pin_memory, error) &&
                  read_count(o, what, "buffer_count", &offload->buffer_count, error) &&
                  (!param || (read_count(o, what, "buffer_size", &offload->buffer_size, error) &&
                              read_count(o, what, "max_in_cpu", &offload->max_in_cpu, error))) &&
                  (param || zp_json_get_number(o, what, "ratio", FALSE, 0, 1, &offload->ratio,
                                               error));
    g_free(device_key);
    if (ok && path) {
        if (strlen(path) == 0 || strlen(path) >= sizeof offload->nvme_path) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"nvme_path\" must be 1 to %zu characters", what,
                        sizeof offload->nvme_path - 1);
            return FALSE;
        }
        g_strlcpy(offload->nvme_path, path, sizeof offload->nvme_path);
    }
    if (!ok)
        return FALSE;
    for (size_t i = 0; !param && i < G_N_ELEMENTS(unmodeled); i++)
        if (json_object_get(o, unmodeled[i]))
            g_ptr_array_add(warnings, g_strdup_printf("%s: \"%s\" ignored: not modeled", what,
                                                      unmodeled[i]));
    if (offload->device == ZP_OFFLOAD_NVME && !offload->nvme_path[0])
        g_ptr_array_add(warnings,
                        g_strdup_printf("%s: device nvme without \"nvme_path\": DeepSpeed needs "
                                        "the directory to swap to", what));
    return TRUE;
}

/* One section as DeepSpeed reads it, or NULL when device is none. */
static json_t *offload_to_json(const ZpOffload *offload, gboolean param)
{
    if (offload->device == ZP_OFFLOAD_NONE)
        return NULL;
    json_t *o = json_pack("{s:s, s:b, s:I}", "device", zp_offload_device_name(offload->device),
                          "pin_memory", offload->pin_memory, "buffer_count",
                          (json_int_t)llround(offload->buffer_count));
    if (param) {
        json_object_set_new(o, "buffer_size", json_integer((json_int_t)llround(offload->buffer_size)));
        json_object_set_new(o, "max_in_cpu", json_integer((json_int_t)llround(offload->max_in_cpu)));
    } else {
        json_object_set_new(o, "ratio", json_real(offload->ratio));
    }
    if (offload->nvme_path[0])
        json_object_set_new(o, "nvme_path", json_string(offload->nvme_path));
    return o;
}

void zp_offload_add_json(void *zero, const ZpOffload *optimizer, const ZpOffload *param)
{
    json_t *o = offload_to_json(optimizer, FALSE);
    if (o)
        json_object_set_new(zero, "offload_optimizer", o);
    json_t *p = offload_to_json(param, TRUE);
    if (p)
        json_object_set_new(zero, "offload_param", p);
}
