/* cli: the flag handling every zplan subcommand shares, so that each bad-input case is
 * refused the same way everywhere: one line, naming the flag, non-zero exit. */
#include "cli.h"
#include "zp_offload.h"
#include "zp_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int cli_fail(const char *command, GError *error)
{
    fprintf(stderr, "zplan %s: %s\n", command, error ? error->message : "failed");
    g_clear_error(&error);
    return 1;
}

gboolean cli_parse(GOptionContext *context, int *argc, char ***argv, GError **error)
{
    if (!g_option_context_parse(context, argc, argv, error))
        return FALSE;
    if (*argc > 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "unexpected argument '%s' (see --help)",
                    (*argv)[1]);
        return FALSE;
    }
    return TRUE;
}

gboolean cli_model(const char *model_flag, const char *params_flag, ZpModel *model,
                   GError **error)
{
    if (!!model_flag == !!params_flag) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "give exactly one of --model NAME|PATH.json and --params P");
        return FALSE;
    }
    if (model_flag)
        return zp_model_load(model_flag, model, error);
    double params;
    if (!zp_parse_size(params_flag, "--params", ZP_SIZE_COUNT, 1, CLI_MAX_PARAMS, FALSE, &params,
                       error))
        return FALSE;
    zp_model_from_params(params, model);
    return TRUE;
}

gboolean cli_cluster(const char *cluster_flag, const char *memory_flag, gboolean required,
                     ZpHw *hw, gboolean *have, GError **error)
{
    *have = cluster_flag || memory_flag;
    if (cluster_flag && memory_flag) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "give one of --cluster and --gpu-memory, not both");
        return FALSE;
    }
    if (!*have) {
        if (required)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "give --cluster NAME|PATH.json or --gpu-memory BYTES");
        return !required;
    }
    if (cluster_flag)
        return zp_hw_load(cluster_flag, hw, error);
    double bytes;
    if (!zp_parse_size(memory_flag, "--gpu-memory", ZP_SIZE_BYTES, 1e6, 1e14, FALSE, &bytes, error))
        return FALSE;
    zp_hw_from_gpu_memory(bytes, hw);
    return TRUE;
}

gboolean cli_int(const char *text, const char *flag, double min, double max, int fallback,
                 int *out, GError **error)
{
    if (!text) {
        *out = fallback;
        return TRUE;
    }
    double value;
    if (!zp_parse_number(text, flag, min, max, TRUE, &value, error))
        return FALSE;
    *out = (int)value;
    return TRUE;
}

gboolean cli_precision_optimizer(const char *precision_flag, const char *optimizer_flag,
                                 ZpPrecision *precision, ZpOptimizer *optimizer,
                                 GError **error)
{
    *precision = ZP_PREC_FP16;
    *optimizer = ZP_OPT_ADAM;
    return (!precision_flag || zp_precision_parse(precision_flag, "--precision", precision,
                                                  error)) &&
           (!optimizer_flag || zp_optimizer_parse(optimizer_flag, "--optimizer", optimizer,
                                                  error));
}

gboolean cli_attention_reduce(const char *attention_flag, const char *reduce_flag,
                              const ZpHw *hw, ZpPrecision precision, ZpPlan *plan,
                              GError **error)
{
    plan->reduce_dtype = ZP_REDUCE_GRAD;
    return zp_hw_attention_choose(hw, attention_flag, precision, "--attention",
                                  &plan->attention, error) &&
           (!reduce_flag ||
            zp_reduce_dtype_parse(reduce_flag, "--reduce-dtype", &plan->reduce_dtype, error));
}

gboolean cli_seq(const char *text, ZpModel *model, GError **error)
{
    int seq;
    if (!text)
        return TRUE;
    if (!zp_model_has_architecture(model)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--seq: --params gives no architecture "
                                                     "for a sequence to change (give --model)");
        return FALSE;
    }
    if (!cli_int(text, "--seq", 1, 10000000, 0, &seq, error))
        return FALSE;
    model->seq_len = seq;
    if (!zp_model_check(model, model->name, error)) {
        g_prefix_error(error, "--seq: ");
        return FALSE;
    }
    return TRUE;
}

gboolean cli_check_mp(int mp, int64_t gpus, const ZpModel *model, GError **error)
{
    if (gpus % mp != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--mp: %d does not divide --gpus %" G_GINT64_FORMAT, mp, gpus);
        return FALSE;
    }
    if (zp_model_has_architecture(model) && model->heads % mp != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--mp: %d does not divide the %" G_GINT64_FORMAT " attention heads of %s",
                    mp, model->heads, model->name);
        return FALSE;
    }
    return TRUE;
}

char *cli_capacity(double bytes)
{
    return g_strdup_printf("%.4g GiB (%.1f GB)", bytes / (1024.0 * 1024 * 1024), bytes / 1e9);
}

char *cli_verdict(const char *what, const char *detail, double needed_bytes,
                  double capacity_bytes)
{
    char *capacity = cli_capacity(capacity_bytes);
    const double margin = capacity_bytes - needed_bytes;
    char *line = g_strdup_printf("%s: %s needs %.1f GB per GPU (%s) of %s, %.1f GB %s.",
                                 margin >= 0 ? "Fits" : "Does not fit", what, needed_bytes / 1e9,
                                 detail, capacity, fabs(margin) / 1e9,
                                 margin >= 0 ? "headroom" : "short");
    g_free(capacity);
    return line;
}

char *cli_thousands(uint64_t value)
{
    char digits[32];
    g_snprintf(digits, sizeof digits, "%" G_GUINT64_FORMAT, value);
    GString *out = g_string_new(NULL);
    const size_t n = strlen(digits);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            g_string_append_c(out, ',');
        g_string_append_c(out, digits[i]);
    }
    return g_string_free(out, FALSE);
}

gboolean cli_offload_nvme_path(const char *nvme_path, ZpOffload *offload, GError **error)
{
    if (strlen(nvme_path) >= sizeof offload->nvme_path) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--nvme-path: longer than %zu characters",
                    sizeof offload->nvme_path - 1);
        return FALSE;
    }
    if (offload->device == ZP_OFFLOAD_NVME)
        g_strlcpy(offload->nvme_path, nvme_path, sizeof offload->nvme_path);
    return TRUE;
}

gboolean cli_offload(const char *optimizer_flag, const char *param_flag, const char *nvme_path,
                     ZpZeroConfig *zero, GError **error)
{
    const struct {
        const char *flag, *text;
        ZpOffload *slot;
    } flags[] = {{"--offload-optimizer", optimizer_flag, &zero->offload_optimizer},
                 {"--offload-param", param_flag, &zero->offload_param}};
    for (size_t i = 0; i < G_N_ELEMENTS(flags); i++) {
        if (!flags[i].text)
            continue;
        if (!zp_offload_device_parse(flags[i].text, flags[i].flag, &flags[i].slot->device,
                                     error))
            return FALSE;
        if (nvme_path && !cli_offload_nvme_path(nvme_path, flags[i].slot, error))
            return FALSE;
    }
    ZpPlan probe;
    zp_plan_defaults(&probe, zero->stage, 1, 1);
    probe.zero = *zero;
    if (!zp_offload_check(&probe, error)) {
        const gboolean optimizer = zero->offload_optimizer.device != ZP_OFFLOAD_NONE &&
                                   zero->stage < 1;
        g_prefix_error(error, "%s: ", optimizer ? "--offload-optimizer" : "--offload-param");
        return FALSE;
    }
    return TRUE;
}
