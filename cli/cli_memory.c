/* cli_memory: `zplan memory` prints the ZeRO paper's Table 1 layout — model-state bytes per
 * GPU, one row per GPU count, one column per stage — and the residual terms beside it. With a
 * model and --cluster, the need per stage is the plan's schedule's peak, as `simulate` gives
 * it (the same rules: zp_impl), so the two commands never disagree. */
#include "cli.h"
#include "cli_moe.h"
#include "zp_comm.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_schedsize.h"
#include "zp_outpath.h"
#include "zp_util.h"
#include "zp_zeror.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    ZpModel model;
    ZpHw hw;
    gboolean have_hw;
    GArray *gpus; /* int64_t */
    int mp, micro_batch;
    gboolean checkpoint, json;
    ZpCheckpointConfig ckpt; /* ZeRO-R: --partition-activations, --cpu-checkpointing */
    ZpPrecision precision;
    ZpOptimizer optimizer;
    ZpPlan kernels; /* its attention and reduce_dtype, and the offload flags' zero sections */
    ZpImplKind impl;
    ZpExpertConfig experts; /* --ep, --capacity-factor, --expert-skew */
} MemoryArgs;

#define GB 1e9

static json_t *states_json(ZpModelStates m)
{
    return json_pack("{s:f, s:f, s:f, s:f}", "params_bytes", m.params_bytes, "grads_bytes",
                     m.grads_bytes, "optimizer_bytes", m.optim_bytes, "total_bytes",
                     m.total_bytes);
}

static json_t *residual_json(const ZpResidual *r)
{
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                     "activation_block_bytes", r->activation_block_bytes, "activations_bytes",
                     r->activations_bytes, "checkpoint_bytes", r->checkpoint_bytes,
                     "checkpoint_host_bytes", r->checkpoint_host_bytes,
                     "recompute_bytes", r->recompute_bytes, "logits_bytes", r->logits_bytes,
                     "reduce_bucket_bytes", r->reduce_bucket_bytes, "allgather_bucket_bytes",
                     r->allgather_bucket_bytes, "stage3_gathered_bytes",
                     r->stage3_gathered_bytes, "stage3_persistent_bytes",
                     r->stage3_persistent_bytes, "reserve_bytes", r->reserve_bytes,
                     "total_bytes", r->total_bytes);
}

static void plan_for(const MemoryArgs *a, int stage, int gpus, ZpPlan *plan)
{
    zp_plan_defaults(plan, stage, gpus / a->mp, a->mp);
    plan->micro_batch = a->micro_batch;
    plan->checkpoint = a->checkpoint;
    plan->selective_recompute = a->kernels.selective_recompute;
    plan->ckpt = a->ckpt;
    plan->precision = a->precision;
    plan->optimizer = a->optimizer;
    plan->attention = a->kernels.attention;
    plan->attention_unrated = a->kernels.attention_unrated;
    plan->reduce_dtype = a->kernels.reduce_dtype;
    plan->impl = a->impl;
    plan->experts = a->experts;
    zp_impl_plan_defaults(plan); /* Megatron's fp32 main_grad under bf16 */
    /* Offload where the stage allows it (the optimizer from stage 1, parameters at 3). */
    if (stage >= 1)
        plan->zero.offload_optimizer = a->kernels.zero.offload_optimizer;
    if (stage == 3)
        plan->zero.offload_param = a->kernels.zero.offload_param;
    plan->zero.sub_group_size = a->kernels.zero.sub_group_size; /* --sub-group-size */
}

static gboolean offloads(const MemoryArgs *a)
{
    return zp_offload_any(&a->kernels);
}

static gboolean has_stage(const MemoryArgs *a, int stage)
{
    return zp_impl_get(a->impl)->has_stage(stage);
}

/* Whether the need is the schedule's allocator-reserved peak: a model with an architecture on a
 * cluster (a --params model has no schedule; without a cluster nothing can be timed). */
static gboolean simulated(const MemoryArgs *a)
{
    return a->have_hw && zp_model_has_architecture(&a->model) && a->hw.peak_fp16_flops > 0;
}

/* Model states per rank at a stage: zp_ep's split of experts and dense parameters for a
 * mixture of experts, the paper's formula otherwise. */
static ZpModelStates states(const MemoryArgs *a, int stage, int gpus)
{
    ZpPlan plan;
    plan_for(a, stage, gpus, &plan);
    ZpStateBytes sb = zp_impl_state_bytes(&plan); /* the implementation's gradients */
    if (zp_moe_enabled(&a->model.moe))
        return zp_ep_model_states(&a->model, &plan, stage, sb).total;
    zp_impl_normalize_plan(&plan); /* FSDP2's stage 2 holds stage 3's states */
    /* FSDP2's fp32 shards are the master weights: no 16-bit partition besides them, as the
     * schedule's layout counts (Llama-2-7B on 16 GPUs: 7.581 GB, 18 bytes a parameter, where
     * simulate held 6.738 GB). */
    if (zp_impl_params_are_master(&plan))
        sb.param_bytes = 0;
    return zp_mem_model_states((double)zp_model_param_count(&a->model), plan.zero.stage,
                               gpus / a->mp,
                               a->mp, sb);
}

/* Bytes per GPU at a stage (cli_need_bytes, as sweep and plan count them); a stage the
 * implementation does not have needs infinitely much. */
static double stage_need_bytes(const MemoryArgs *a, int stage, int gpus)
{
    if (!has_stage(a, stage))
        return INFINITY;
    ZpPlan plan;
    plan_for(a, stage, gpus, &plan);
    /* A mixture of experts without a cluster: zp_ep's states + the residual in closed form;
     * with one, its schedule's peak as for a dense model (the expert space over EP). */
    if (zp_moe_enabled(&a->model.moe) && !simulated(a))
        return states(a, stage, gpus).total_bytes +
               zp_mem_residual(&a->model, &plan, a->have_hw ? &a->hw : NULL).total_bytes;
    return cli_need_bytes(&a->model, &plan, a->have_hw ? &a->hw : NULL);
}

/* Bytes a rank sends per step over its data-parallel groups: the plan's schedule's collectives
 * when the model has an architecture (the implementation's rules; the DP group's and those of
 * its subgroups, ZeRO++'s and a mixture of experts' expert-data-parallel group, as simulate
 * counts "dp": Mixtral-8x7B's 9.48 GB at stage 1 on 64 H100s with EP 8 was the dense
 * parameters' alone, of 39.08 GB), else the paper's closed form with the implementation's
 * gradient collective (an all-reduce moves the gradients twice); null for a stage the
 * implementation lacks. */
static json_t *comm_json(const MemoryArgs *a, const ZpPlan *plan)
{
    if (!has_stage(a, plan->zero.stage))
        return json_null();
    if (!zp_model_has_architecture(&a->model)) {
        const double psi = (double)zp_model_param_count(&a->model) / plan->mp;
        const double sent = psi * (plan->dp - 1) / plan->dp, reduce = zp_plan_reduce_bytes(plan);
        const gboolean twice = zp_impl_get(a->impl)->grad_collective(plan) == ZP_COLL_ALLREDUCE;
        return json_real(zp_comm_dp_bytes_per_rank(psi * plan->mp, plan->zero.stage, plan->dp,
                                                   plan->mp, zp_plan_elem_bytes(plan->precision),
                                                   reduce) +
                         (twice && plan->zero.stage > 0 ? sent * reduce : 0.0));
    }
    ZpSchedule *s = zp_sched_build(&a->model, plan, NULL);
    if (!s)
        return json_null();
    double bytes[ZP_GROUP_N];
    for (int g = 0; g < ZP_GROUP_N; g++)
        bytes[g] = zp_sched_comm_bytes(s, (ZpGroup)g);
    zp_sched_free(s);
    return json_real(cli_dp_bytes(bytes));
}

/* The text's offload table, per stage: the model states left on the GPU (the residual table's
 * first row with offload, which the JSON's Table-1 model_states are not) and the host and NVMe
 * tiers, as simulate --json's "offload" counts a rank's. */
static json_t *offload_json(const MemoryArgs *a, int gpus)
{
    json_t *o = json_object();
    for (int stage = 0; stage <= 3; stage++) {
        ZpPlan plan;
        plan_for(a, stage, gpus, &plan);
        ZpTiers t;
        zp_offload_tiers(&a->model, &plan, a->have_hw ? &a->hw : NULL, &t);
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        json_object_set_new(o, key,
                            json_pack("{s:f, s:f, s:f, s:f, s:f}", "gpu_model_states_bytes",
                                      t.total_bytes[ZP_TIER_GPU], "host_bytes_per_gpu",
                                      t.total_bytes[ZP_TIER_CPU], "pinned_bytes", t.pinned_bytes,
                                      "host_bytes_per_node", t.cpu_node_bytes,
                                      "nvme_bytes_per_node", t.nvme_node_bytes));
    }
    return o;
}

static int print_json(const MemoryArgs *a)
{
    ZpPlan first;
    plan_for(a, 0, a->mp, &first);
    const ZpStateBytes sb = zp_impl_state_bytes(&first); /* the implementation's gradients */
    json_t *root = json_pack("{s:I, s:s, s:I, s:s, s:s, s:s, s:i, s:{s:f, s:f, s:f}}", "params",
                             (json_int_t)zp_model_param_count(&a->model), "model",
                             a->model.name, "seq_len", (json_int_t)a->model.seq_len,
                             "attention", zp_attention_name(a->kernels.attention),
                             "precision", zp_precision_name(a->precision),
                             "optimizer", zp_optimizer_name(a->optimizer), "mp", a->mp,
                             "bytes_per_param", "params", sb.param_bytes, "grads",
                             sb.grad_bytes, "optimizer", sb.optim_bytes);
    json_t *rows = json_array();
    for (guint i = 0; i < a->gpus->len; i++) {
        const int gpus = (int)g_array_index(a->gpus, int64_t, i), dp = gpus / a->mp;
        json_t *row = json_pack("{s:i, s:i}", "gpus", gpus, "dp", dp);
        json_t *detail = json_object(), *comm = json_object(), *residual = json_object();
        json_t *needs = json_object();
        for (int stage = 0; stage <= 3; stage++) {
            char key[16];
            g_snprintf(key, sizeof key, "stage%d", stage);
            if (!has_stage(a, stage)) { /* no plan to size: null, as the text's "n/a" */
                json_object_set_new(row, key, json_null());
                json_object_set_new(detail, key, json_null());
                json_object_set_new(comm, key, json_null());
                json_object_set_new(residual, key, json_null());
                json_object_set_new(needs, key, json_null());
                continue;
            }
            ZpModelStates m = states(a, stage, gpus);
            json_object_set_new(row, key, json_real(m.total_bytes));
            json_object_set_new(detail, key, states_json(m));
            ZpPlan plan;
            plan_for(a, stage, gpus, &plan);
            json_object_set_new(comm, key, comm_json(a, &plan));
            ZpResidual r = zp_mem_residual(&a->model, &plan, a->have_hw ? &a->hw : NULL);
            json_object_set_new(residual, key, residual_json(&r));
            const double need = stage_need_bytes(a, stage, gpus);
            json_object_set_new(needs, key, isinf(need) ? json_null() : json_real(need));
        }
        json_object_set_new(row, "need_bytes", needs);
        json_object_set_new(row, "model_states", detail);
        json_object_set_new(row, "residual", residual);
        json_object_set_new(row, "comm_bytes_per_rank", comm);
        if (offloads(a))
            json_object_set_new(row, "offload", offload_json(a, gpus));
        if (zp_moe_enabled(&a->model.moe)) { /* stage 1's: the section hardly depends on it */
            ZpPlan plan;
            plan_for(a, 1, gpus, &plan);
            json_object_set_new(row, "moe", cli_moe_json(&a->model, &plan,
                                                         a->have_hw ? &a->hw : NULL));
        }
        json_array_append_new(rows, row);
    }
    json_object_set_new(root, "rows", rows);
    if (a->have_hw)
        json_object_set_new(root, "gpu_memory_bytes", json_real(a->hw.gpu_memory_bytes));
    GError *error = NULL;
    gboolean ok = zp_json_write(root, NULL, &error);
    json_decref(root);
    return ok ? 0 : cli_fail("memory", error);
}

/* The stage that needs the least memory at the last GPU count (the one the residual table
 * is for), and whether it fits in --cluster's GPU. */
static int least_stage(const MemoryArgs *a, double *need_bytes)
{
    const int gpus = (int)g_array_index(a->gpus, int64_t, a->gpus->len - 1);
    int best = -1;
    for (int stage = 0; stage <= 3; stage++) {
        const double need = stage_need_bytes(a, stage, gpus);
        if (best < 0 || need < *need_bytes)
            best = stage, *need_bytes = need;
    }
    return best;
}

static void print_verdict(const MemoryArgs *a)
{
    double need = 0;
    const int stage = least_stage(a, &need);
    const int gpus = (int)g_array_index(a->gpus, int64_t, a->gpus->len - 1);
    if (!zp_model_has_architecture(&a->model) && need <= a->hw.gpu_memory_bytes) {
        /* No architecture, no activations: a "Fits" here would be at sequence 0. */
        char *capacity = cli_capacity(a->hw.gpu_memory_bytes);
        printf("Model states only: stage %d on %d GPUs holds %.1f GB per GPU (states + reserve) "
               "of %s. --params gives no architecture, so no activations or buffers are "
               "counted and there is no verdict: give --model (and --seq) for one.\n",
               stage, gpus, need / GB, capacity);
        g_free(capacity);
        return;
    }
    char *what = g_strdup_printf("stage %d on %d GPUs", stage, gpus);
    char *detail = g_strdup_printf("%s at micro-batch %d, sequence %" G_GINT64_FORMAT ", %s, %s",
                                   simulated(a) ? "allocator-reserved peak + reserve"
                                                : "model states + residual",
                                   a->micro_batch, a->model.seq_len,
                                   a->checkpoint ? "checkpointing" : "no checkpointing",
                                   zp_impl_name(a->impl));
    if (!zp_model_has_architecture(&a->model)) {
        g_free(detail);
        detail = g_strdup("model states + reserve alone: --params gives no activations");
    }
    char *verdict = cli_verdict(what, detail, need, a->hw.gpu_memory_bytes);
    printf("%s\n", verdict);
    g_free(verdict), g_free(detail), g_free(what);
    /* What does not fit for its activations may fit with checkpointing: say so. */
    MemoryArgs with = *a;
    with.checkpoint = TRUE;
    double with_need = 0;
    const int with_stage = need > a->hw.gpu_memory_bytes && !a->checkpoint &&
                                   zp_model_has_architecture(&a->model)
                               ? least_stage(&with, &with_need)
                               : -1;
    if (with_stage >= 0 && with_need <= a->hw.gpu_memory_bytes)
        printf("With --checkpoint it fits: stage %d needs %.1f GB per GPU, %.1f GB headroom.\n",
               with_stage, with_need / GB, (a->hw.gpu_memory_bytes - with_need) / GB);
}

/* One stage's cell of a table, `width` wide: GB, or "n/a" for a stage the implementation
 * does not have (Megatron's 2-3, FSDP's 1, FSDP2's 0-1), whose figures would be the paper's
 * formula for a plan that cannot run. */
static void print_stage_cell(const MemoryArgs *a, int stage, double bytes, int width)
{
    if (has_stage(a, stage))
        printf(" %*.3f", width, bytes / GB);
    else
        printf(" %*s", width, "n/a");
}

static void print_residual(const MemoryArgs *a, int gpus)
{
    ZpResidual r[4];
    ZpModelStates m[4];
    double need[4];
    for (int stage = 0; stage <= 3; stage++) {
        ZpPlan plan;
        plan_for(a, stage, gpus, &plan);
        r[stage] = zp_mem_residual(&a->model, &plan, a->have_hw ? &a->hw : NULL);
        m[stage] = states(a, stage, gpus);
        if (offloads(a)) { /* what stays on the GPU, as the need counts it */
            ZpTiers t;
            zp_offload_tiers(&a->model, &plan, a->have_hw ? &a->hw : NULL, &t);
            m[stage].total_bytes = t.total_bytes[ZP_TIER_GPU];
        }
        need[stage] = stage_need_bytes(a, stage, gpus);
    }
    if (!zp_model_has_architecture(&a->model))
        printf("\nPer-GPU memory at %d GPUs, model states and reserve only (--params: no "
               "activations) (GB):\n", gpus);
    else
        printf("\nPer-GPU memory at %d GPUs, micro-batch %d, sequence %" G_GINT64_FORMAT
               ", %s attention, %s (GB):\n",
               gpus, a->micro_batch, a->model.seq_len, zp_attention_name(a->kernels.attention),
               a->checkpoint                     ? "checkpointing every block"
               : a->kernels.selective_recompute ? "selective recomputation (core attention)"
                                                 : "no activation checkpointing");
    printf("  %-28s %9s %9s %9s %9s\n", "term", "stage 0", "stage 1", "stage 2", "stage 3");
    const struct {
        const char *label;
        size_t offset;
    } rows[] = {
        {"activations (all blocks)", G_STRUCT_OFFSET(ZpResidual, activations_bytes)},
        {"checkpoints (block inputs)", G_STRUCT_OFFSET(ZpResidual, checkpoint_bytes)},
        {"recomputed block", G_STRUCT_OFFSET(ZpResidual, recompute_bytes)},
        {"logits (fp32)", G_STRUCT_OFFSET(ZpResidual, logits_bytes)},
        {"gradient buckets", G_STRUCT_OFFSET(ZpResidual, reduce_bucket_bytes)},
        {"all-gather bucket", G_STRUCT_OFFSET(ZpResidual, allgather_bucket_bytes)},
        {"stage-3 gathered params", G_STRUCT_OFFSET(ZpResidual, stage3_gathered_bytes)},
        {"stage-3 persistent params", G_STRUCT_OFFSET(ZpResidual, stage3_persistent_bytes)},
        {"step gradient copies", G_STRUCT_OFFSET(ZpResidual, step_buffer_bytes)},
        {"MoE all-to-all buffers", G_STRUCT_OFFSET(ZpResidual, moe_buffer_bytes)},
        {"CUDA context + allocator", G_STRUCT_OFFSET(ZpResidual, reserve_bytes)},
    };
    printf("  %-28s", offloads(a) ? "model states left on GPU" : "model states");
    for (int stage = 0; stage <= 3; stage++)
        print_stage_cell(a, stage, m[stage].total_bytes, 9);
    printf("\n");
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++) {
        printf("  %-28s", rows[i].label);
        for (int stage = 0; stage <= 3; stage++)
            print_stage_cell(a, stage, G_STRUCT_MEMBER(double, &r[stage], rows[i].offset), 9);
        printf("\n");
    }
    printf("  %-28s", "sum of the terms");
    for (int stage = 0; stage <= 3; stage++)
        print_stage_cell(a, stage, m[stage].total_bytes + r[stage].total_bytes, 9);
    printf("\n");
    if (r[0].checkpoint_host_bytes > 0) {
        printf("  %-28s", "checkpoints in host memory");
        for (int stage = 0; stage <= 3; stage++)
            print_stage_cell(a, stage, r[stage].checkpoint_host_bytes, 9);
        printf("   (cpu_checkpointing; not in the total)\n");
    }
    if (simulated(a)) {
        /* The terms are each one's worst; the schedule's peak is when they add up most. */
        printf("  %-28s", "reserved peak + reserve");
        for (int stage = 0; stage <= 3; stage++)
            if (isinf(need[stage]))
                printf(" %9s", "n/a");
            else
                printf(" %9.3f", need[stage] / GB);
        printf("\n");
    }
    if (!a->have_hw)
        return;
    printf("  %-28s", "fits in GPU memory?");
    for (int stage = 0; stage <= 3; stage++) {
        const double over = need[stage] - a->hw.gpu_memory_bytes;
        char cell[32];
        if (isinf(need[stage]))
            g_snprintf(cell, sizeof cell, "n/a");
        else if (over <= 0)
            g_snprintf(cell, sizeof cell, "yes");
        else
            g_snprintf(cell, sizeof cell, "+%.1f", over / GB);
        printf(" %9s", cell);
    }
    char *capacity = cli_capacity(a->hw.gpu_memory_bytes);
    printf("\n  (%s: %s per GPU; \"+X\" is how many GB over)\n", a->hw.name, capacity);
    g_free(capacity);
}

/* With offload: where each stage's model states go, per GPU and per node, and which tier
 * overflows (DeepSpeed's own estimator beside it). */
static void print_offload(const MemoryArgs *a, int gpus)
{
    printf("\nOffload (optimizer %s, parameters %s) at %d GPUs, %d per node (GB):\n",
           zp_offload_device_name(a->kernels.zero.offload_optimizer.device),
           zp_offload_device_name(a->kernels.zero.offload_param.device), gpus,
           a->have_hw ? MIN(a->hw.gpus_per_node, gpus) : 1);
    printf("  %-28s %9s %9s %9s %9s\n", "tier", "stage 0", "stage 1", "stage 2", "stage 3");
    ZpTiers t[4];
    for (int stage = 0; stage <= 3; stage++) {
        ZpPlan plan;
        plan_for(a, stage, gpus, &plan);
        zp_offload_tiers(&a->model, &plan, a->have_hw ? &a->hw : NULL, &t[stage]);
    }
    const struct {
        const char *label;
        size_t offset;
    } rows[] = {
        {"GPU model states per GPU", G_STRUCT_OFFSET(ZpTiers, total_bytes[ZP_TIER_GPU])},
        {"host memory per GPU", G_STRUCT_OFFSET(ZpTiers, total_bytes[ZP_TIER_CPU])},
        {"  of it pinned", G_STRUCT_OFFSET(ZpTiers, pinned_bytes)},
        {"host memory per node", G_STRUCT_OFFSET(ZpTiers, cpu_node_bytes)},
        {"NVMe per node", G_STRUCT_OFFSET(ZpTiers, nvme_node_bytes)},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++) {
        printf("  %-28s", rows[i].label);
        for (int stage = 0; stage <= 3; stage++)
            printf(" %9.3f", G_STRUCT_MEMBER(double, &t[stage], rows[i].offset) / GB);
        printf("\n");
    }
    if (!a->have_hw)
        return;
    printf("  %-28s", "fits (every tier)?");
    for (int stage = 0; stage <= 3; stage++) {
        double short_bytes;
        const double need = stage_need_bytes(a, stage, gpus);
        const ZpTier over =
            zp_offload_overflow(&t[stage], need > a->hw.gpu_memory_bytes ? need : 0, &a->hw,
                                &short_bytes);
        static const char *const tier_cell[ZP_TIER_N + 1] = {"GPU over", "CPU over",
                                                             "NVMe over", "yes"};
        printf(" %9s", need > a->hw.gpu_memory_bytes && over == ZP_TIER_N ? "GPU over"
                                                                          : tier_cell[over]);
    }
    printf("\n  (%s: %.0f GB host memory and %.0f GB NVMe per node)\n", a->hw.name,
           a->hw.cpu_memory_bytes / GB, a->hw.nvme_bytes / GB);
}

static void print_table(const MemoryArgs *a)
{
    const uint64_t count = zp_model_param_count(&a->model);
    ZpPlan first;
    plan_for(a, 0, a->mp, &first);
    const ZpStateBytes sb = zp_impl_state_bytes(&first); /* the implementation's gradients */
    if (a->have_hw)
        print_verdict(a);
    cli_print_defaults();
    char *pretty = cli_thousands(count);
    printf("Model-state memory per GPU for %s (%s parameters), %s + %s: %g + %g + %g bytes "
           "per parameter, MP %d.\nGB = 1e9 bytes, as in the ZeRO paper's Table 1.\n\n",
           a->model.name, pretty, zp_precision_name(a->precision),
           zp_optimizer_name(a->optimizer), sb.param_bytes, sb.grad_bytes, sb.optim_bytes,
           a->mp);
    ZpPlan sharded;
    plan_for(a, 3, a->mp, &sharded);
    if (zp_impl_params_are_master(&sharded)) /* states(): no 16-bit copy where sharded */
        printf("Stages 2-3 (%s): the fp32 shards are the master weights, 0 + %g + %g.\n\n",
               zp_impl_name(a->impl), sb.grad_bytes, sb.optim_bytes);
    g_free(pretty);
    printf("  %7s %7s %10s %10s %10s %10s\n", "GPUs", "DP", "stage 0", "stage 1", "stage 2",
           "stage 3");
    printf("  %7s %7s %10s %10s %10s %10s\n", "", "", "(baseline)", "(Pos)", "(Pos+g)",
           "(Pos+g+p)");
    for (guint i = 0; i < a->gpus->len; i++) {
        const int gpus = (int)g_array_index(a->gpus, int64_t, i), dp = gpus / a->mp;
        printf("  %7d %7d", gpus, dp);
        for (int stage = 0; stage <= 3; stage++)
            print_stage_cell(a, stage, states(a, stage, gpus).total_bytes, 10);
        printf("\n");
    }
    if (zp_model_has_architecture(&a->model) || a->have_hw)
        print_residual(a, (int)g_array_index(a->gpus, int64_t, a->gpus->len - 1));
    if (offloads(a))
        print_offload(a, (int)g_array_index(a->gpus, int64_t, a->gpus->len - 1));
    if (zp_moe_enabled(&a->model.moe)) {
        const int gpus = (int)g_array_index(a->gpus, int64_t, a->gpus->len - 1);
        ZpPlan plans[4];
        for (int stage = 0; stage <= 3; stage++)
            plan_for(a, stage, gpus, &plans[stage]);
        cli_moe_print_memory(&a->model, plans, a->have_hw ? &a->hw : NULL, gpus);
    }
}

/* The offload flags, checked as a stage-3 plan would take them (each stage then uses what it
 * can: plan_for). */
static gboolean memory_offload(const char *opt, const char *param, const char *path,
                               const CliOffloadTuning *tuning, ZpPlan *kernels, GError **error)
{
    zp_zero_config_defaults(&kernels->zero, 3);
    return cli_offload(opt, param, path, &kernels->zero, error) &&
           cli_offload_tuning(tuning, &kernels->zero, error);
}

int cli_memory(int argc, char **argv)
{
    char *model = NULL, *params = NULL, *gpus = NULL, *mp = NULL, *cluster = NULL;
    char *micro_batch = NULL, *precision = NULL, *optimizer = NULL, *seq = NULL;
    char *attention = NULL, *reduce = NULL, *impl = NULL, *offload_opt = NULL, *recompute = NULL;
    char *offload_param = NULL, *nvme_path = NULL, *gpu_memory = NULL;
    char *ep = NULL, *capacity = NULL, *skew = NULL;
    MemoryArgs a = {0};
    CliOffloadTuning tuning = {0};
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &model, "Model name in models/ or a PATH.json", "M"},
        {"params", 0, 0, G_OPTION_ARG_STRING, &params, "Parameter count instead of a model (7B, 1.5e9, 1T)", "P"},
        {"gpus", 0, 0, G_OPTION_ARG_STRING, &gpus, "GPU counts, comma-separated (required)", "N[,N...]"},
        {"mp", 0, 0, G_OPTION_ARG_STRING, &mp, "Tensor (model) parallel degree (default 1)", "M"},
        {"cluster", 0, 0, G_OPTION_ARG_STRING, &cluster, "Hardware profile: adds the reserve and a fit check", "C"},
        {"gpu-memory", 0, 0, G_OPTION_ARG_STRING, &gpu_memory, "GPU memory (40GB, 40GiB): a bare GPU for the fit check, or --cluster's GPU with this memory", "BYTES"},
        {"micro-batch", 0, 0, G_OPTION_ARG_STRING, &micro_batch, "Samples per GPU for activations (default 1)", "B"},
        {"checkpoint", 0, 0, G_OPTION_ARG_NONE, &a.checkpoint, "Activation checkpointing at every block (--recompute full)", NULL},
        {"recompute", 0, 0, G_OPTION_ARG_STRING, &recompute, "none, selective (Megatron's core attention) or full (as --checkpoint)", "R"},
        {"partition-activations", 0, 0, G_OPTION_ARG_NONE, &a.ckpt.partition_activations, "ZeRO-R Pa: each checkpoint split across the MP ranks (with --checkpoint)", NULL},
        {"cpu-checkpointing", 0, 0, G_OPTION_ARG_NONE, &a.ckpt.cpu_checkpointing, "ZeRO-R Pa+cpu: checkpoints in host memory (with --checkpoint)", NULL},
        {"precision", 0, 0, G_OPTION_ARG_STRING, &precision, "fp16, bf16 or fp32 (default: the model's torch_dtype where the GPU has it, else fp16)", "P"},
        {"optimizer", 0, 0, G_OPTION_ARG_STRING, &optimizer, "adam (default), sgd-momentum, sgd or adam-8bit", "O"},
        CLI_SEQ_ENTRY(&seq),
        {"attention", 0, 0, G_OPTION_ARG_STRING, &attention, "eager or a fused kernel (flash, mem-efficient, or a name in --cluster's attention table; default: PyTorch SDPA's choice for the dtype on --cluster, mem-efficient in fp32; without one flash2, eager in fp32)", "K"},
        {"reduce-dtype", 0, 0, G_OPTION_ARG_STRING, &reduce, "Gradient reduction dtype fp32, bf16 or fp16 (default: the gradients')", "D"},
        {"impl", 0, 0, G_OPTION_ARG_STRING, &impl, "Whose ZeRO: deepspeed (default), fsdp, paper, megatron or fsdp2", "I"},
        CLI_OFFLOAD_ENTRIES(&offload_opt, &offload_param, &nvme_path),
        CLI_OFFLOAD_TUNING_ENTRIES(&tuning),
        CLI_MOE_ENTRIES(&ep, &capacity, &skew),
        {"json", 0, 0, G_OPTION_ARG_NONE, &a.json, "Print JSON", NULL},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("- model-state and residual memory per GPU");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Prints the ZeRO paper's Table 1 layout: bytes per GPU of parameters, gradients and\n"
        "optimizer states for ZeRO stages 0-3, one row per GPU count (GB = 1e9 bytes).\n"
        "With --cluster it opens with whether the least hungry stage fits at the last GPU\n"
        "count, and exits with status 2 when none does.");
    GError *error = NULL;
    gboolean have_hw = FALSE;
    gboolean ok = cli_parse(context, &argc, &argv, &error) &&
                  cli_model(model, params, &a.model, &error) &&
                  cli_seq(seq, &a.model, &error) &&
                  cli_cluster(cluster, gpu_memory, FALSE, &a.hw, &have_hw, &error) &&
                  cli_int(mp, "--mp", 1, 65536, 1, &a.mp, &error) &&
                  cli_int(micro_batch, "--micro-batch", 1, 1e6, 1, &a.micro_batch, &error) &&
                  cli_precision_optimizer(precision, optimizer, &a.model, have_hw ? &a.hw : NULL,
                                          &a.precision, &a.optimizer,
                                          &error) &&
                  cli_attention_reduce(attention, reduce, have_hw ? &a.hw : NULL, a.precision,
                                       &a.kernels, &error) &&
                  memory_offload(offload_opt, offload_param, nvme_path, &tuning, &a.kernels,
                                 &error) &&
                  (!impl || zp_impl_parse(impl, "--impl", &a.impl, &error)) &&
                  cli_moe_parse(&a.model, ep, capacity, skew, &a.experts, &error) &&
                  cli_recompute(recompute, a.checkpoint, &a.kernels, &error);
    a.checkpoint = a.kernels.checkpoint;
    if (ok && !zp_model_has_architecture(&a.model)) {
        /* --params has no blocks to hold activations: the flags that size them are refused
         * rather than dropped in silence (Table 1 counts model states only). */
        const struct {
            const char *flag;
            gboolean given;
        } activation_flags[] = {
            {"--micro-batch", micro_batch != NULL}, {"--checkpoint", a.checkpoint},
            {"--recompute", recompute != NULL},
            {"--partition-activations", a.ckpt.partition_activations},
            {"--cpu-checkpointing", a.ckpt.cpu_checkpointing}, {"--attention", attention != NULL},
        };
        for (size_t i = 0; ok && i < G_N_ELEMENTS(activation_flags); i++)
            if (activation_flags[i].given) {
                g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE,
                            "%s: activations need a model's architecture (--model); --params "
                            "counts model states only",
                            activation_flags[i].flag);
                ok = FALSE;
            }
    }
    if (ok && !gpus) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "--gpus N[,N...] is required");
        ok = FALSE;
    }
    if (ok)
        ok = (a.gpus = zp_parse_int_list(gpus, "--gpus", 1, CLI_MAX_GPUS, &error)) != NULL;
    for (guint i = 0; ok && a.gpus && i < a.gpus->len; i++)
        ok = cli_check_mp(a.mp, g_array_index(a.gpus, int64_t, i), &a.model, &error);
    if (ok) { /* ZeRO-R's options against the plan (any stage: they do not depend on it) */
        ZpPlan probe;
        plan_for(&a, 0, (int)g_array_index(a.gpus, int64_t, 0), &probe);
        ok = !zp_model_has_architecture(&a.model) || zp_zeror_check(&a.model, &probe, &error);
    }
    for (guint i = 0; ok && i < a.gpus->len; i++) { /* --ep against each GPU count */
        ZpPlan probe;
        plan_for(&a, 0, (int)g_array_index(a.gpus, int64_t, i), &probe);
        ok = zp_ep_check(&a.model, &probe, "--ep", &error);
    }
    if (ok && zp_moe_enabled(&a.model.moe) && offloads(&a)) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--offload-optimizer/--offload-param: not modelled for a mixture of experts");
        ok = FALSE;
    }
    a.have_hw = have_hw;
    /* Each stage's schedule is built to simulate it: one too big to build is bad input, said in
     * one line before anything is allocated (it was an abort in GLib after 8.8 GB for a model
     * of 3.6e18 parameters), not a stage that needs infinitely much. */
    for (guint i = 0; ok && simulated(&a) && i < a.gpus->len; i++)
        for (int stage = 0; ok && stage <= 3; stage++) {
            ZpPlan plan;
            plan_for(&a, stage, (int)g_array_index(a.gpus, int64_t, i), &plan);
            ok = !has_stage(&a, stage) || zp_schedsize_check_plan(&a.model, &plan, &error);
        }
    int status = ok ? (a.json ? print_json(&a) : (print_table(&a), 0)) : cli_fail("memory", error);
    double need = 0;
    if (ok && status == 0 && have_hw && (least_stage(&a, &need), need > a.hw.gpu_memory_bytes))
        status = CLI_EXIT_DOES_NOT_FIT;
    if (a.gpus)
        g_array_unref(a.gpus);
    g_option_context_free(context);
    g_free(model), g_free(params), g_free(gpus), g_free(mp), g_free(cluster);
    g_free(micro_batch), g_free(precision), g_free(optimizer), g_free(seq);
    g_free(attention), g_free(reduce), g_free(offload_opt), g_free(offload_param);
    g_free(nvme_path), g_free(impl), g_free(gpu_memory), g_free(recompute);
    g_free(ep), g_free(capacity), g_free(skew);
    cli_offload_tuning_free(&tuning);
    return status;
}
