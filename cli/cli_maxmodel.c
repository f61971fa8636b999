/* cli_maxmodel: `zplan maxmodel` prints the ZeRO paper's Table 2 theoretical columns — the
 * largest parameter count whose model states fit in one GPU's memory, per stage. */
#include "cli.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <math.h>
#include <stdio.h>

/* "7.64B", "2.05T": the paper's way of writing model sizes. */
static void format_params(double params, char *out, size_t size)
{
    if (params >= 1e12)
        g_snprintf(out, size, "%.3gT", params / 1e12);
    else if (params >= 1e9)
        g_snprintf(out, size, "%.3gB", params / 1e9);
    else
        g_snprintf(out, size, "%.3gM", params / 1e6);
}

/* The tier names of the limit row: [tier][the swap buffer alone overflows the host]. */
static const char *const tier_names[ZP_TIER_N + 1][2] = {
    [ZP_TIER_GPU] = {"GPU", "GPU"},
    [ZP_TIER_CPU] = {"host", "swap buf"},
    [ZP_TIER_NVME] = {"NVMe", "NVMe"},
    [ZP_TIER_N] = {"none", "none"},
};

/* The tier that stops a model just above `params` from fitting (ZP_TIER_N: none, which the
 * bisection's upper end means); *swap_buffer set when the host overflows and the
 * partitioned_swap_buffer is at least half of what it holds (sub_group_size sets it). */
static ZpTier binding_tier(const ZpHw *hw, const ZpPlan *plan, double params,
                           gboolean *swap_buffer)
{
    ZpModel m;
    zp_model_from_params(ceil(params * 1.001) + 1, &m);
    ZpTiers t;
    zp_offload_tiers(&m, plan, hw, &t);
    double short_bytes;
    const ZpTier over = zp_offload_overflow(&t, t.total_bytes[ZP_TIER_GPU] + hw->runtime_reserve_bytes, hw,
                            &short_bytes);
    *swap_buffer = over == ZP_TIER_CPU && t.swap_buffer_bytes >= 0.5 * t.total_bytes[ZP_TIER_CPU];
    return over;
}

/* The largest parameter count whose model states fit every tier with offload: the GPU's
 * states in its memory, the host's and NVMe's per node in the profile's. The tiers grow with
 * the parameters (the offload buffers are fixed or proportional), so a bisection in log
 * space finds the edge to 1e-6. */
static double max_params_offloaded(const ZpHw *hw, const ZpPlan *plan)
{
    double lo = 1, hi = 1e16;
    for (int i = 0; i < 200 && hi / lo > 1 + 1e-6; i++) {
        const double mid = sqrt(lo * hi);
        ZpModel m;
        zp_model_from_params((uint64_t)mid, &m);
        ZpTiers t;
        zp_offload_tiers(&m, plan, hw, &t);
        double short_bytes;
        if (zp_offload_overflow(&t, t.total_bytes[ZP_TIER_GPU] + hw->runtime_reserve_bytes, hw,
                            &short_bytes) == ZP_TIER_N)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Offload needs the host's sizes: a cluster's, or --cpu-memory (and --nvme-bytes for NVMe) per
 * GPU beside --gpu-memory; a bare GPU has neither, and every model would "fit" in 0 bytes of
 * host memory at 1 parameter (it printed 1e-06M). */
static gboolean host_sizes(const char *cluster, const char *cpu_memory, const char *nvme_bytes,
                           const ZpZeroConfig *offload, ZpHw *hw, GError **error)
{
    if (cluster && (cpu_memory || nvme_bytes)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: --cluster %s has its own host sizes",
                    cpu_memory ? "--cpu-memory" : "--nvme-bytes", cluster);
        return FALSE;
    }
    if ((cpu_memory && !zp_parse_size(cpu_memory, "--cpu-memory", ZP_SIZE_BYTES, 1e6, 1e16,
                                      FALSE, &hw->cpu_memory_bytes, error)) ||
        (nvme_bytes && !zp_parse_size(nvme_bytes, "--nvme-bytes", ZP_SIZE_BYTES, 1e6, 1e18,
                                      FALSE, &hw->nvme_bytes, error)))
        return FALSE;
    const gboolean nvme = offload->offload_optimizer.device == ZP_OFFLOAD_NVME ||
                          offload->offload_param.device == ZP_OFFLOAD_NVME;
    const gboolean any = nvme || offload->offload_optimizer.device != ZP_OFFLOAD_NONE ||
                         offload->offload_param.device != ZP_OFFLOAD_NONE;
    if (!cluster && any && (hw->cpu_memory_bytes <= 0 || (nvme && hw->nvme_bytes <= 0))) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "offload needs the host's sizes: give --cluster NAME, or --cpu-memory "
                    "BYTES%s per GPU with --gpu-memory", nvme ? " and --nvme-bytes BYTES" : "");
        return FALSE;
    }
    return TRUE;
}

int cli_maxmodel(int argc, char **argv)
{
    char *cluster = NULL, *gpu_memory = NULL, *gpus_flag = NULL, *mp_flag = NULL;
    char *precision_flag = NULL, *optimizer_flag = NULL, *offload_opt = NULL;
    char *offload_param = NULL, *nvme_path = NULL;
    char *cpu_memory = NULL, *nvme_bytes = NULL;
    CliOffloadTuning tuning = {0};
    gboolean json = FALSE;
    GOptionEntry entries[] = {
        {"cluster", 0, 0, G_OPTION_ARG_STRING, &cluster, "Hardware profile (its GPU memory)", "C"},
        {"gpu-memory", 0, 0, G_OPTION_ARG_STRING, &gpu_memory, "GPU memory instead of a cluster (32e9, 80GB, 80GiB)", "BYTES"},
        {"gpus", 0, 0, G_OPTION_ARG_STRING, &gpus_flag, "Total GPU count (required)", "N"},
        {"mp", 0, 0, G_OPTION_ARG_STRING, &mp_flag, "Tensor (model) parallel degree; DP = N / M", "M"},
        {"precision", 0, 0, G_OPTION_ARG_STRING, &precision_flag, "fp16 (default), bf16 or fp32", "P"},
        {"optimizer", 0, 0, G_OPTION_ARG_STRING, &optimizer_flag, "adam (default), sgd-momentum, sgd or adam-8bit", "O"},
        CLI_OFFLOAD_ENTRIES(&offload_opt, &offload_param, &nvme_path),
        CLI_OFFLOAD_TUNING_ENTRIES(&tuning),
        {"cpu-memory", 0, 0, G_OPTION_ARG_STRING, &cpu_memory, "With --gpu-memory and offload: host memory per GPU (1.5TB; a --cluster has its own per node)", "BYTES"},
        {"nvme-bytes", 0, 0, G_OPTION_ARG_STRING, &nvme_bytes, "With --gpu-memory and NVMe offload: NVMe capacity per GPU (30TB)", "BYTES"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("- the largest model whose states fit");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Prints the ZeRO paper's Table 2 theoretical columns: the largest parameter count\n"
        "whose model states (no activations or buffers) fit in one GPU, per ZeRO stage.\n"
        "With --offload-optimizer/--offload-param (and --cluster) the states that go to\n"
        "the host or NVMe must fit there too, per node (give --cluster, or --cpu-memory\n"
        "and --nvme-bytes per GPU); stages that cannot offload so keep everything on the\n"
        "GPU. The limit row names the tier the next larger model overflows.");
    GError *error = NULL;
    ZpHw hw;
    ZpModel no_model;
    zp_model_from_params(1, &no_model);
    gboolean have_hw = FALSE;
    int gpus = 0, mp = 1;
    ZpPrecision precision;
    ZpOptimizer optimizer;
    gboolean ok = cli_parse(context, &argc, &argv, &error) &&
                  cli_cluster(cluster, gpu_memory, TRUE, &hw, &have_hw, &error) &&
                  cli_int(mp_flag, "--mp", 1, 65536, 1, &mp, &error) &&
                  cli_precision_optimizer(precision_flag, optimizer_flag, NULL, &hw, &precision,
                                          &optimizer, &error);
    if (ok && !gpus_flag) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "--gpus N is required");
        ok = FALSE;
    }
    ok = ok && cli_int(gpus_flag, "--gpus", 1, CLI_MAX_GPUS, 1, &gpus, &error) &&
         cli_check_mp(mp, gpus, &no_model, &error);
    ZpZeroConfig offload;
    zp_zero_config_defaults(&offload, 3);
    ok = ok && cli_offload(offload_opt, offload_param, nvme_path, &offload, &error) &&
         cli_offload_tuning(&tuning, &offload, &error) &&
         host_sizes(cluster, cpu_memory, nvme_bytes, &offload, &hw, &error);
    int status = 0;
    if (!ok) {
        status = cli_fail("maxmodel", error);
    } else {
        const ZpStateBytes sb = zp_plan_state_bytes(precision, optimizer);
        const int dp = gpus / mp;
        double best[4];
        ZpTier binding[4];
        gboolean swap_buffer[4];
        for (int stage = 0; stage <= 3; stage++) {
            ZpPlan plan;
            zp_plan_defaults(&plan, stage, dp, mp);
            plan.precision = precision, plan.optimizer = optimizer;
            if (stage >= 1)
                plan.zero.offload_optimizer = offload.offload_optimizer;
            if (stage == 3)
                plan.zero.offload_param = offload.offload_param;
            plan.zero.sub_group_size = offload.sub_group_size;
            plan.gpus_per_node = hw.gpus_per_node;
            swap_buffer[stage] = FALSE;
            binding[stage] = ZP_TIER_GPU;
            if (zp_offload_any(&plan)) {
                best[stage] = max_params_offloaded(&hw, &plan);
                binding[stage] = binding_tier(&hw, &plan, best[stage], &swap_buffer[stage]);
            } else {
                /* the profile's runtime reserve set aside, as sweep --metric maxmodel and
                 * memory count it (0 for a bare --gpu-memory GPU: the paper's columns) */
                best[stage] = zp_mem_max_params(hw.gpu_memory_bytes - hw.runtime_reserve_bytes,
                                                stage, dp, mp, sb);
            }
            if (best[stage] < 1e3) /* a bisection stuck at its floor: nothing fits */
                best[stage] = 0;
        }
        if (json) {
            json_t *root = json_pack("{s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:f}", "stage0",
                                     best[0], "stage1", best[1], "stage2", best[2], "stage3",
                                     best[3], "gpus", gpus, "mp", mp, "dp", dp,
                                     "gpu_memory_bytes", hw.gpu_memory_bytes);
            json_t *limits = json_object();
            for (int stage = 0; stage <= 3; stage++) {
                char key[8];
                g_snprintf(key, sizeof key, "stage%d", stage);
                json_object_set_new(limits, key,
                                    json_string(tier_names[binding[stage]][swap_buffer[stage]]));
            }
            json_object_set_new(root, "limit", limits);
            ok = zp_json_write(root, NULL, &error);
            json_decref(root);
            status = ok ? 0 : cli_fail("maxmodel", error);
        } else {
            printf("Largest model whose model states fit in %.3g GB per GPU (%s) less its %.3g GB "
                   "runtime reserve, %d GPUs = MP %d x DP %d,\n%s + %s; activations and buffers "
                   "not counted (Table 2's theoretical columns; B = 1e9, T = 1e12).\n\n",
                   hw.gpu_memory_bytes / 1e9, hw.name, hw.runtime_reserve_bytes / 1e9, gpus, mp,
                   dp,
                   zp_precision_name(precision), zp_optimizer_name(optimizer));
            printf("  %4s %6s %10s %10s %10s %10s\n", "MP", "GPUs", "baseline", "Pos", "Pos+g",
                   "Pos+g+p");
            printf("  %4d %6d", mp, gpus);
            for (int stage = 0; stage <= 3; stage++) {
                char cell[32];
                format_params(best[stage], cell, sizeof cell);
                printf(" %10s", best[stage] > 0 ? cell : "none");
            }
            printf("\n  %4s %6s", "", "limit");
            for (int stage = 0; stage <= 3; stage++)
                printf(" %10s", tier_names[binding[stage]][swap_buffer[stage]]);
            printf("\n\nThe limit is the tier that the next larger model overflows: GPU memory, "
                   "host memory per node,\nNVMe per node, or the host's NVMe swap buffer "
                   "(--sub-group-size shrinks it).\n");
        }
    }
    g_option_context_free(context);
    g_free(cluster), g_free(gpu_memory), g_free(gpus_flag), g_free(mp_flag);
    g_free(precision_flag), g_free(optimizer_flag), g_free(offload_opt);
    g_free(offload_param), g_free(nvme_path), g_free(cpu_memory), g_free(nvme_bytes);
    cli_offload_tuning_free(&tuning);
    return status;
}
