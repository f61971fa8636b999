/* cli: the flag handling every zplan subcommand shares, so that each bad-input case is
 * refused the same way everywhere: one line, naming the flag, non-zero exit. */
#include "cli.h"
#include "zp_inventory.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Where a long message is cut: its head and tail, on UTF-8 character starts. */
#define CLI_LINE_MAX_BYTES 1000
#define CLI_LINE_HEAD_BYTES 600
#define CLI_LINE_TAIL_BYTES 300

static size_t char_start(const char *text, size_t at)
{
    while (at > 0 && ((unsigned char)text[at] & 0xC0) == 0x80)
        at--;
    return at;
}

static void append_escaped(GString *out, const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c == '\n')
            g_string_append(out, "\\n");
        else if (c < 0x20 || c == 0x7f)
            g_string_append_printf(out, "\\x%02x", c);
        else
            g_string_append_c(out, (char)c);
    }
}

char *cli_one_line(const char *message)
{
    const size_t len = strlen(message);
    GString *out = g_string_sized_new(MIN(len, CLI_LINE_MAX_BYTES) + 64);
    if (len <= CLI_LINE_MAX_BYTES) {
        append_escaped(out, message, len);
    } else {
        const size_t head = char_start(message, CLI_LINE_HEAD_BYTES);
        const size_t tail = char_start(message, len - CLI_LINE_TAIL_BYTES);
        append_escaped(out, message, head);
        g_string_append_printf(out, " [... %zu bytes ...] ", tail - head);
        append_escaped(out, message + tail, len - tail);
    }
    return g_string_free(out, FALSE);
}

double cli_dp_bytes(const double *comm_bytes)
{
    return comm_bytes[ZP_GROUP_DP] + comm_bytes[ZP_GROUP_HPZ] + comm_bytes[ZP_GROUP_NODE] +
           comm_bytes[ZP_GROUP_XNODE] + comm_bytes[ZP_GROUP_EDP];
}

int cli_fail(const char *command, GError *error)
{
    char *line = cli_one_line(error ? error->message : "failed");
    fprintf(stderr, "zplan %s: %s\n", command, line);
    g_free(line);
    g_clear_error(&error);
    return 1;
}

/* For an unknown --flag, the closest flag the command has: its long names, read from its own
 * help text (GOptionContext does not list its entries). */
static void suggest_flag(GOptionContext *context, GError **error)
{
    const char *message = (*error)->message, *dashes = strstr(message, "--");
    if (!dashes)
        return;
    char *word = g_strndup(dashes + 2, strcspn(dashes + 2, " =\t\n"));
    char *help = g_option_context_get_help(context, FALSE, NULL);
    GPtrArray *flags = g_ptr_array_new_with_free_func(g_free);
    for (const char *at = strstr(help, "  --"); at; at = strstr(at + 1, "  --"))
        g_ptr_array_add(flags, g_strndup(at + 4, strcspn(at + 4, " =\t\n")));
    const char *closest = zp_closest_name(word, (const char *const *)flags->pdata, flags->len);
    if (closest) {
        char *with = g_strdup_printf("%s. Did you mean '--%s'?", message, closest);
        g_free((*error)->message);
        (*error)->message = with;
    }
    g_ptr_array_unref(flags);
    g_free(help);
    g_free(word);
}

/* GOption takes --switch=VALUE for a flag without a value and ignores VALUE, so that
 * --checkpoint=false would turn checkpointing on: refuse it. The switches are the flags its
 * help text lists without "=ARG" (GOptionContext does not list its entries). */
static gboolean check_switches(GOptionContext *context, int argc, char **argv, GError **error)
{
    char *help = NULL;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *equals = strchr(argv[i], '=');
        if (!g_str_has_prefix(argv[i], "--") || !equals)
            continue;
        if (!help)
            help = g_option_context_get_help(context, FALSE, NULL);
        char *entry = g_strdup_printf("  %.*s ", (int)(equals - argv[i]), argv[i]);
        const gboolean is_switch = strstr(help, entry) != NULL;
        g_free(entry);
        if (is_switch) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%.*s takes no value ('%s')",
                        (int)(equals - argv[i]), argv[i], argv[i]);
            g_free(help);
            return FALSE;
        }
    }
    g_free(help);
    return TRUE;
}

gboolean cli_parse_options(GOptionContext *context, int *argc, char ***argv, GError **error)
{
    return check_switches(context, *argc, *argv, error) &&
           g_option_context_parse(context, argc, argv, error);
}

gboolean cli_parse(GOptionContext *context, int *argc, char ***argv, GError **error)
{
    if (!cli_parse_options(context, argc, argv, error)) {
        if (g_error_matches(*error, G_OPTION_ERROR, G_OPTION_ERROR_UNKNOWN_OPTION))
            suggest_flag(context, error);
        return FALSE;
    }
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
    if (!*have) {
        if (required)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "give --cluster NAME|PATH.json or --gpu-memory BYTES");
        return !required;
    }
    double bytes = 0;
    if (memory_flag &&
        !zp_parse_size(memory_flag, "--gpu-memory", ZP_SIZE_BYTES, 1e6, 1e14, FALSE, &bytes, error))
        return FALSE;
    if (!cluster_flag) {
        zp_hw_from_gpu_memory(bytes, hw);
        return TRUE;
    }
    if (!zp_hw_load(cluster_flag, hw, error))
        return FALSE;
    /* Both: the cluster's rates with another memory size (an A100 40GB node from the 80GB
     * profile, a GPU shared with another job). */
    if (memory_flag)
        hw->gpu_memory_bytes = bytes;
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

/* ---- the defaults a command took, stated in its first lines ---- */

static GPtrArray *defaults_taken, *defaults_flags; /* char *: "sequence 4096 (...)", "--seq" */

void cli_default_taken(const char *flag, const char *format, ...)
{
    if (!defaults_taken) {
        defaults_taken = g_ptr_array_new_with_free_func(g_free);
        defaults_flags = g_ptr_array_new();
    }
    va_list args;
    va_start(args, format);
    g_ptr_array_add(defaults_taken, g_strdup_vprintf(format, args));
    va_end(args);
    g_ptr_array_add(defaults_flags, (gpointer)flag);
}

void cli_default_retract(const char *flag)
{
    for (guint i = defaults_flags ? defaults_flags->len : 0; i-- > 0;)
        if (strcmp(g_ptr_array_index(defaults_flags, i), flag) == 0) {
            g_ptr_array_remove_index(defaults_taken, i);
            g_ptr_array_remove_index(defaults_flags, i);
        }
}

char *cli_defaults_line(void)
{
    if (!defaults_taken || defaults_taken->len == 0)
        return NULL;
    GString *line = g_string_new("Defaults: ");
    for (guint i = 0; i < defaults_taken->len; i++)
        g_string_append_printf(line, "%s%s", i ? "; " : "",
                               (const char *)g_ptr_array_index(defaults_taken, i));
    g_string_append(line, ". Change with ");
    for (guint i = 0; i < defaults_flags->len; i++)
        g_string_append_printf(line, "%s%s", i ? ", " : "",
                               (const char *)g_ptr_array_index(defaults_flags, i));
    g_string_append_c(line, '.');
    return g_string_free(line, FALSE);
}

static GPtrArray *notes; /* char *, cli_note's */

void cli_note(const char *format, ...)
{
    if (!notes)
        notes = g_ptr_array_new_with_free_func(g_free);
    va_list args;
    va_start(args, format);
    g_ptr_array_add(notes, g_strdup_vprintf(format, args));
    va_end(args);
}

json_t *cli_notes_json(void)
{
    json_t *out = json_array();
    for (guint i = 0; notes && i < notes->len; i++)
        json_array_append_new(out, json_string(g_ptr_array_index(notes, i)));
    return out;
}

void cli_print_defaults(void)
{
    char *line = cli_defaults_line();
    if (line)
        printf("%s\n", line);
    g_free(line);
    for (guint i = 0; notes && i < notes->len; i++)
        printf("%s\n", (const char *)g_ptr_array_index(notes, i));
}

/* The precision a model was saved in (config.json's torch_dtype), where the GPU computes in it:
 * Hugging Face's Llama 3 and Mistral are trained and shipped in bf16, and fp16 overflows where
 * bf16 does not; a V100 has no bf16 tensor cores (peak_bf16_flops absent), so there it is fp16. */
static ZpPrecision default_precision(const ZpModel *model, const ZpHw *hw)
{
    const char *dtype = model ? model->torch_dtype : "";
    if (strcmp(dtype, "bfloat16") == 0) {
        if (!hw || zp_hw_peak_flops(hw, ZP_PREC_BF16) > 0 || hw->peak_fp16_flops <= 0) {
            cli_default_taken("--precision", "bf16 (config.json's torch_dtype)");
            return ZP_PREC_BF16;
        }
        cli_default_taken("--precision", "fp16 (torch_dtype is bfloat16, which %s's %s lacks)",
                          hw->name, hw->gpu);
        return ZP_PREC_FP16;
    }
    if (strcmp(dtype, "float16") == 0)
        cli_default_taken("--precision", "fp16 (config.json's torch_dtype)");
    else
        cli_default_taken("--precision", "fp16 mixed precision");
    return ZP_PREC_FP16;
}

gboolean cli_precision_optimizer(const char *precision_flag, const char *optimizer_flag,
                                 const ZpModel *model, const ZpHw *hw, ZpPrecision *precision,
                                 ZpOptimizer *optimizer, GError **error)
{
    *precision = precision_flag ? ZP_PREC_FP16 : default_precision(model, hw);
    *optimizer = ZP_OPT_ADAM;
    return (!precision_flag || zp_precision_parse(precision_flag, "--precision", precision,
                                                  error)) &&
           (!optimizer_flag || zp_optimizer_parse(optimizer_flag, "--optimizer", optimizer,
                                                  error));
}

void cli_attention_default(const ZpHw *hw, ZpPrecision precision, ZpPlan *plan)
{
    cli_default_retract("--attention");
    if (!hw && precision != ZP_PREC_FP32) {
        /* No cluster: the fused kernel PyTorch's scaled-dot-product attention picks for 16-bit
         * inputs on every GPU from Ampere on (FlashAttention-2), not the eager scores that no
         * one trains with. */
        plan->attention = ZP_ATTN_FLASH2;
        cli_default_taken("--attention", "%s attention (no --cluster: PyTorch SDPA's choice on "
                          "A100 and later)", zp_attention_name(plan->attention));
        return;
    }
    char why[512];
    plan->attention = zp_hw_attention_default(hw, precision, why, sizeof why);
    cli_default_taken("--attention", "%s attention (%s)", zp_attention_name(plan->attention),
                      why);
}

gboolean cli_attention_reduce(const char *attention_flag, const char *reduce_flag,
                              const ZpHw *hw, ZpPrecision precision, ZpPlan *plan,
                              GError **error)
{
    plan->reduce_dtype = ZP_REDUCE_GRAD;
    if (!attention_flag)
        cli_attention_default(hw, precision, plan);
    else if (!zp_hw_attention_choose(hw, attention_flag, precision, "--attention",
                                     &plan->attention, error))
        return FALSE;
    plan->attention_unrated = zp_hw_attention_unrated(hw, plan->attention);
    return !reduce_flag ||
           zp_reduce_dtype_parse(reduce_flag, "--reduce-dtype", &plan->reduce_dtype, error);
}

gboolean cli_knobs_read(ZpImplKind impl, const char *const given[ZP_KNOB_N], GError **error)
{
    unsigned bits = 0;
    for (int k = 0; k < ZP_KNOB_N; k++)
        bits |= given[k] ? 1u << k : 0;
    const int unread = g_bit_nth_lsf(zp_impl_unread_knobs(impl, bits), -1);
    if (unread < 0)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: a DeepSpeed ZeRO setting, which --impl %s has none of (it would change "
                "nothing)",
                zp_zero_knob_flag((ZpZeroKnob)unread), zp_impl_get(impl)->name);
    return FALSE;
}

gboolean cli_attention_zreal(const char *attention_flag, ZpPlan *plan, GError **error)
{
    cli_default_retract("--attention");
    if (strcmp(attention_flag, "flash") == 0) {
        plan->attention = ZP_ATTN_FLASH2;
        return TRUE;
    }
    if (!zp_attention_parse(attention_flag, "--attention", &plan->attention, error))
        return FALSE;
    if (plan->attention == ZP_ATTN_MEM_EFFICIENT) {
        /* zreal's fused path is its own blockwise kernel (real_engine_base: flash), not
         * PyTorch's mem_eff_attention; a plan naming that one is simulated, not run. */
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--attention: zreal does not run mem-efficient (PyTorch's memory-efficient "
                    "SDPA kernel); use eager or flash (its own blockwise kernel)");
        return FALSE;
    }
    return TRUE;
}

gboolean cli_kernels(const char *kernels_flag, ZpPlan *plan, GError **error)
{
    if (!kernels_flag)
        return TRUE;
    const ZpInventory *inv = zp_inventory_find(kernels_flag, "--kernels", error);
    if (inv)
        g_strlcpy(plan->kernels, inv->name, sizeof plan->kernels);
    return inv != NULL;
}

gboolean cli_recompute(const char *recompute_flag, gboolean checkpoint_flag, ZpPlan *plan,
                       GError **error)
{
    ZpRecompute r = checkpoint_flag ? ZP_RECOMPUTE_FULL : ZP_RECOMPUTE_NONE;
    if (recompute_flag && !zp_recompute_parse(recompute_flag, "--recompute", &r, error))
        return FALSE;
    if (checkpoint_flag && r != ZP_RECOMPUTE_FULL) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--checkpoint is --recompute full, not --recompute %s: give one of them",
                    recompute_flag);
        return FALSE;
    }
    zp_plan_set_recompute(plan, r);
    return TRUE;
}

gboolean cli_seq(const char *text, ZpModel *model, GError **error)
{
    if (!text) {
        if (!zp_model_has_architecture(model))
            return TRUE;
        /* A Hugging Face config's maximum (131072 for Llama 3.1) is what the model can read,
         * not what anyone trains a step at: 4096 at most unless asked. */
        if (model->seq_len > CLI_DEFAULT_SEQ_MAX) {
            cli_default_taken("--seq", "sequence %d (the smaller of %s's maximum %" G_GINT64_FORMAT
                              " and %d)", CLI_DEFAULT_SEQ_MAX, model->name, model->seq_len,
                              CLI_DEFAULT_SEQ_MAX);
            model->seq_len = CLI_DEFAULT_SEQ_MAX;
        } else {
            cli_default_taken("--seq", "sequence %" G_GINT64_FORMAT " (%s's)", model->seq_len,
                              model->name);
        }
        return TRUE;
    }
    if (!zp_model_has_architecture(model)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--seq: --params gives no architecture "
                                                     "for a sequence to change (give --model)");
        return FALSE;
    }
    /* "8k" is 8192 tokens, as context lengths are spoken of (Llama 3's "8K context" is
     * max_position_embeddings 8192), not the 8000 that K means for --params. */
    const size_t n = strlen(text);
    const gboolean kilo = n > 1 && (text[n - 1] == 'k' || text[n - 1] == 'K');
    char *digits = g_strndup(text, kilo ? n - 1 : n);
    double seq;
    const gboolean parsed = zp_parse_number(digits, "--seq", 1.0 / 1024, 10000000, !kilo, &seq,
                                            error);
    g_free(digits);
    if (parsed && kilo && (seq * 1024 != nearbyint(seq * 1024) || seq * 1024 > 10000000)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--seq: '%s' is not a whole number of "
                    "tokens in [1, 10000000] (8k = 8192)", text);
        return FALSE;
    }
    if (!parsed)
        return FALSE;
    model->seq_len = (int64_t)(kilo ? seq * 1024 : seq);
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

double cli_need_bytes(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw)
{
    const ZpResidual r = zp_mem_residual(model, plan, hw);
    ZpTiers t;
    zp_offload_tiers(model, plan, hw, &t);
    double need = t.total_bytes[ZP_TIER_GPU] + r.total_bytes;
    if (!hw)
        return need;
    if (zp_model_has_architecture(model) && hw->peak_fp16_flops > 0) { /* a bare --gpu-memory
                                                                          * GPU has no rates */
        CliRankContext ctx = {model, hw, NULL};
        double step_s = 0, peak = 0;
        GError *error = NULL;
        if (!cli_rank_by_simulation(plan, &ctx, 0, &step_s, &peak, &error)) {
            g_error_free(error); /* a plan the simulator refuses cannot run: it fits nowhere */
            return INFINITY;
        }
        need = peak + hw->runtime_reserve_bytes;
    }
    double short_bytes;
    const ZpTier over = zp_offload_overflow(&t, need, hw, &short_bytes);
    return over == ZP_TIER_CPU || over == ZP_TIER_NVME ? hw->gpu_memory_bytes + short_bytes : need;
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

gboolean cli_offload_tuning(const CliOffloadTuning *tuning, ZpZeroConfig *zero, GError **error)
{
    double v;
    if (tuning->sub_group_size) {
        if (!zp_parse_size(tuning->sub_group_size, "--sub-group-size", ZP_SIZE_COUNT, 1, 1e13,
                           TRUE, &v, error))
            return FALSE;
        zero->sub_group_size = v;
    }
    if (tuning->max_in_cpu) {
        if (!zp_parse_size(tuning->max_in_cpu, "--max-in-cpu", ZP_SIZE_COUNT, 0, 1e13, TRUE, &v,
                           error))
            return FALSE;
        zero->offload_param.max_in_cpu = v;
    }
    if (tuning->buffer_count) {
        if (!zp_parse_number(tuning->buffer_count, "--buffer-count", 1, 1024, TRUE, &v, error))
            return FALSE;
        zero->offload_param.buffer_count = zero->offload_optimizer.buffer_count = v;
    }
    return TRUE;
}

void cli_offload_tuning_free(CliOffloadTuning *tuning)
{
    g_free(tuning->sub_group_size), g_free(tuning->max_in_cpu), g_free(tuning->buffer_count);
}

gboolean cli_budget_parse(CliBudget *b, GError **error)
{
    if (b->tokens_flag && b->steps_flag) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "give one of --tokens and --steps, not both");
        return FALSE;
    }
    if (b->price_flag && !b->tokens_flag && !b->steps_flag) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--gpu-hour-price: give --tokens or --steps");
        return FALSE;
    }
    return (!b->tokens_flag || zp_parse_size(b->tokens_flag, "--tokens", ZP_SIZE_COUNT, 1, 1e18,
                                             FALSE, &b->tokens, error)) &&
           (!b->steps_flag || zp_parse_size(b->steps_flag, "--steps", ZP_SIZE_COUNT, 1, 1e15,
                                            TRUE, &b->steps, error)) &&
           (!b->price_flag ||
            zp_parse_number(b->price_flag, "--gpu-hour-price", 0, 1e6, FALSE, &b->price, error));
}

void cli_budget_free(CliBudget *b)
{
    g_free(b->tokens_flag), g_free(b->steps_flag), g_free(b->price_flag);
}

/* Steps (whole: the last one trains the remainder too), seconds, GPU-hours. */
static gboolean budget_figures(const CliBudget *b, double step_s, double tokens_per_step,
                               int gpus, double *steps, double *seconds, double *gpu_hours)
{
    if (b->tokens <= 0 && b->steps <= 0)
        return FALSE;
    *steps = b->steps > 0 ? b->steps : ceil(b->tokens / tokens_per_step);
    *seconds = *steps * step_s;
    *gpu_hours = *seconds * gpus / 3600;
    return TRUE;
}

char *cli_budget_line(const CliBudget *b, double step_s, double tokens_per_step, int gpus)
{
    double steps, seconds, gpu_hours;
    if (!budget_figures(b, step_s, tokens_per_step, gpus, &steps, &seconds, &gpu_hours))
        return NULL;
    char *n_steps = cli_thousands((uint64_t)steps), *hours = cli_thousands((uint64_t)llround(gpu_hours));
    GString *line = g_string_new(NULL);
    const double tokens = steps * tokens_per_step;
    const double scale = tokens >= 1e12 ? 1e12 : tokens >= 1e9 ? 1e9 : tokens >= 1e6 ? 1e6 : 1;
    g_string_append_printf(line, "Training %.4g%s tokens: %s steps of %.4g s = %.1f days on %d "
                           "GPUs, %s GPU-hours", tokens / scale,
                           scale == 1e12 ? "T" : scale == 1e9 ? "B" : scale == 1e6 ? "M" : "",
                           n_steps, step_s, seconds / 86400, gpus, hours);
    if (b->price > 0) {
        char *cost = cli_thousands((uint64_t)llround(gpu_hours * b->price));
        g_string_append_printf(line, ", %s at %g per GPU-hour", cost, b->price);
        g_free(cost);
    }
    g_string_append(line, " (step time as simulated; no restarts, evaluation or checkpoints).");
    g_free(n_steps), g_free(hours);
    return g_string_free(line, FALSE);
}

json_t *cli_budget_json(const CliBudget *b, double step_s, double tokens_per_step, int gpus)
{
    double steps, seconds, gpu_hours;
    if (!budget_figures(b, step_s, tokens_per_step, gpus, &steps, &seconds, &gpu_hours))
        return NULL;
    json_t *o = json_pack("{s:f, s:f, s:f, s:f, s:f}", "steps", steps, "tokens",
                          steps * tokens_per_step, "seconds", seconds, "days", seconds / 86400,
                          "gpu_hours", gpu_hours);
    if (b->price > 0)
        json_object_set_new(o, "cost", json_real(gpu_hours * b->price));
    return o;
}
