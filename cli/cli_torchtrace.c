/* cli_torchtrace: calibrate from a PyTorch profiler trace: the traces read (zp_torchtrace), their
 * classes printed, their tables merged into a base hwprofile and written. */
#include "cli_torchtrace.h"
#include "zp_colltab.h"
#include "zp_hw.h"
#include "zp_kernrate.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <gsl/gsl_sort.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

/* Unknown kernel names printed (all of them go into the profile's calibration). */
#define PRINT_UNKNOWN 12

ZpTorchTrace *cli_torch_trace_load(char **paths, GError **error)
{
    ZpTorchTrace *t = zp_torch_trace_new();
    ZpTraceSummary s = {0};
    for (int i = 0; paths[i]; i++) {
        const guint64 before = s.kernels;
        gboolean ok = zp_torch_trace_read(t, paths[i], error);
        zp_torch_trace_summary(t, &s);
        /* Nothing to calibrate or compare from, said rather than taken as a step of 0 s. */
        if (ok && s.kernels == before) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: no GPU kernels (a CPU-only trace, or one profiled without "
                        "ProfilerActivity.CUDA: docs/calibrate.md)", paths[i]);
            ok = FALSE;
        }
        if (!ok) {
            zp_torch_trace_free(t);
            return NULL;
        }
    }
    return t;
}

static double step_total_s(const ZpTraceSummary *s)
{
    double sum = 0;
    for (int c = 0; c <= ZP_KCLASS_N; c++)
        sum += s->class_step_s[c];
    return sum;
}

void cli_torch_trace_print(const ZpTorchTrace *t, FILE *out)
{
    ZpTraceSummary s;
    zp_torch_trace_summary(t, &s);
    json_t *tables = zp_torch_trace_tables(t, "");
    const double total = step_total_s(&s);
    fprintf(out, "%d trace file(s), %d step(s), %" G_GUINT64_FORMAT " GPU kernels", s.files,
            s.steps, s.kernels);
    if (s.step_s > 0)
        fprintf(out, "; step %.3f ms (median ProfilerStep)", 1e3 * s.step_s);
    fprintf(out, "\n\n  kernel class    ms per step   share   instances   table rows\n");
    for (int c = 0; c <= ZP_KCLASS_N; c++)
        fprintf(out, "  %-14s %12.3f %6.1f%% %11" G_GUINT64_FORMAT " %12zu\n", zp_kclass_name(c),
                1e3 * s.class_step_s[c], total > 0 ? 100 * s.class_step_s[c] / total : 0,
                s.instances[c], c < ZP_KCLASS_N ? json_array_size(json_object_get(tables,
                                                      zp_kclass_name(c))) : 0);
    fprintf(out, "  (per class: the median over steps and files of its kernels' time in a step; "
                 "kernels on several streams overlap, so the sum can exceed the step)\n");
    if (s.unlinked || s.zero_length || s.shapeless || s.outside_steps)
        fprintf(out, "\n  %" G_GUINT64_FORMAT " kernels with no launch or CPU op for their "
                     "correlation id, %" G_GUINT64_FORMAT " of zero length (left out of the "
                     "tables), %" G_GUINT64_FORMAT " instances without a shape (timed in their "
                     "class, no table row), %" G_GUINT64_FORMAT " launched outside the "
                     "profiled steps\n", s.unlinked, s.zero_length, s.shapeless,
                s.outside_steps);
    json_t *unknown = zp_torch_trace_unknown(t);
    const size_t n = json_array_size(unknown);
    if (n)
        fprintf(out, "\n  %zu kernel name(s) in no class, by total time:\n", n);
    double rest_s = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *u = json_array_get(unknown, i);
        const double s_total = json_number_value(json_object_get(u, "total_s"));
        if (i >= PRINT_UNKNOWN) {
            rest_s += s_total;
            continue;
        }
        fprintf(out, "  %12.3f ms %8" JSON_INTEGER_FORMAT "x  %.100s\n", 1e3 * s_total,
                json_integer_value(json_object_get(u, "count")),
                json_string_value(json_object_get(u, "name")));
    }
    if (n > PRINT_UNKNOWN)
        fprintf(out, "  %12.3f ms in the %zu others (all listed in the profile's "
                     "calibration.torch_trace.unknown_kernels)\n", 1e3 * rest_s,
                n - PRINT_UNKNOWN);
    json_decref(unknown);
    json_decref(tables);
}

void *cli_torch_trace_summary_json(const ZpTorchTrace *t)
{
    ZpTraceSummary s;
    zp_torch_trace_summary(t, &s);
    json_t *classes = json_object();
    for (int c = 0; c <= ZP_KCLASS_N; c++)
        json_object_set_new(classes, zp_kclass_name(c),
                            json_pack("{s:f, s:I}", "time_per_step_s", s.class_step_s[c],
                                      "instances", (json_int_t)s.instances[c]));
    return json_pack("{s:i, s:i, s:i, s:f, s:o, s:I, s:I, s:I, s:I, s:I, s:o}", "files", s.files,
                     "steps", s.steps, "world_size", s.world_size, "step_s", s.step_s, "classes",
                     classes, "kernels", (json_int_t)s.kernels, "unlinked_kernels",
                     (json_int_t)s.unlinked, "zero_length_kernels", (json_int_t)s.zero_length,
                     "shapeless_instances", (json_int_t)s.shapeless, "outside_steps",
                     (json_int_t)s.outside_steps, "unknown_kernels", zp_torch_trace_unknown(t));
}

/* The traces' collective rows into the profile's "collective_table": each replaces the base's
 * row of its collective and rank count. FALSE (with *why) when they do not fit a table. */
static gboolean merge_collectives(json_t *profile, const ZpTorchTrace *t, const char *what,
                                  int *rows, char **why)
{
    GArray *kind = g_array_new(FALSE, FALSE, sizeof(int)),
           *ranks = g_array_new(FALSE, FALSE, sizeof(int)),
           *bytes = g_array_new(FALSE, FALSE, sizeof(double)),
           *time_s = g_array_new(FALSE, FALSE, sizeof(double));
    zp_torch_trace_collectives(t, kind, ranks, bytes, time_s);
    ZpCollTable measured, base = {0};
    GError *local = NULL;
    json_t *existing = json_object_get(profile, "collective_table");
    gboolean ok = zp_colltab_build((int *)kind->data, (int *)ranks->data, (double *)bytes->data,
                                   (double *)time_s->data, kind->len, ZP_COLLTAB_MEDIAN,
                                   &measured, &local) &&
                  (!existing || zp_colltab_from_json(existing, what, &base, &local));
    *rows = ok ? measured.n_rows : 0;
    for (int i = 0; ok && i < measured.n_rows; i++) {
        const ZpCollRow *m = &measured.rows[i];
        ZpCollRow *slot = (ZpCollRow *)zp_colltab_find(&base, m->kind, m->ranks);
        if (!slot && base.n_rows == ZP_COLLTAB_MAX_ROWS) {
            g_set_error(&local, ZP_ERROR, ZP_ERROR_VALUE, "the base's collective table is full "
                        "(%d rows)", ZP_COLLTAB_MAX_ROWS);
            ok = FALSE;
            break;
        }
        *(slot ? slot : &base.rows[base.n_rows++]) = *m;
    }
    if (ok && measured.n_rows > 0)
        json_object_set_new(profile, "collective_table", zp_colltab_to_json(&base));
    *why = ok ? NULL : g_strdup(local->message);
    g_clear_error(&local);
    GArray *arrays[] = {kind, ranks, bytes, time_s};
    for (size_t i = 0; i < G_N_ELEMENTS(arrays); i++)
        g_array_unref(arrays[i]);
    return ok;
}

/* ---- the profile's kernel_rates from the trace's rows ---- */

/* The median of v[i] weighted by w[i] (each row by the time its instances took in all: the
 * kernels a step spends its time in set the rate), n > 0. */
static double weighted_median(const double *v, const double *w, size_t n)
{
    size_t *order = g_new(size_t, n);
    gsl_sort_index(order, v, 1, n);
    double total = 0, sum = 0, median = v[order[n - 1]];
    for (size_t i = 0; i < n; i++)
        total += w[i];
    for (size_t i = 0; i < n; i++)
        if ((sum += w[order[i]]) >= total / 2) {
            median = v[order[i]];
            break;
        }
    g_free(order);
    return median;
}

/* kernel_rates.gemm.best_flops_per_s so that zp_kernrate's wave model gives the trace's 16-bit
 * GEMMs their measured times: the model's time is waves x tile time, inversely proportional
 * to the best rate, so each compute-bound row (its waves outlast its bytes at the memory
 * curve) asks for best x model / measured; the rows' weighted median is kept. FALSE when no
 * such row. */
static gboolean fit_gemm(const ZpHw *hw, json_t *rows, json_t *gemm, int *used)
{
    const ZpKernRates *r = &hw->kernel_rates;
    const size_t n = json_array_size(rows);
    double *want = g_new(double, n + 1), *weight = g_new(double, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(rows, i);
        const char *dtype = json_string_value(json_object_get(row, "dtype"));
        const double b = json_number_value(json_object_get(row, "batch")),
                     m = json_number_value(json_object_get(row, "m")),
                     nn = json_number_value(json_object_get(row, "n")),
                     kk = json_number_value(json_object_get(row, "k")),
                     t = json_number_value(json_object_get(row, "time_s"));
        if (!dtype || (strcmp(dtype, "bf16") != 0 && strcmp(dtype, "fp16") != 0))
            continue;
        const double bytes = 2 * b * (m * kk + kk * nn + m * nn);
        const double waves_s = zp_kernrate_gemm_s(r, hw->hbm_bytes_per_s, b, m, nn, kk, 0);
        if (waves_s < zp_kernrate_gemm_s(r, hw->hbm_bytes_per_s, b, m, nn, kk, bytes))
            continue; /* memory-bound on the model: its time says nothing of the rate */
        want[k] = r->gemm_best_flops_per_s * waves_s / t;
        weight[k++] = t * (double)json_integer_value(json_object_get(row, "count"));
    }
    *used = (int)k;
    if (k > 0)
        json_object_set_new(gemm, "best_flops_per_s", json_real(weighted_median(want, weight, k)));
    g_free(want), g_free(weight);
    return k > 0;
}

/* Each step of kernel_rates.memory_efficiency that the trace's memory-bound rows fall in: the
 * weighted median of their bytes / (time x hbm_bytes_per_s), at most 1 (a row whose bytes
 * the inputs overstate, an in-place op's, would read above it). *steps: the steps fitted. */
static void fit_memory(const ZpHw *hw, json_t *rows, json_t *curve, int *steps, int *used)
{
    const ZpKernRates *r = &hw->kernel_rates;
    const size_t n = json_array_size(rows);
    double *eff = g_new(double, n + 1), *weight = g_new(double, n + 1);
    *steps = *used = 0;
    for (int j = 0; j < r->n_memory; j++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *row = json_array_get(rows, i);
            const double bytes = json_number_value(json_object_get(row, "bytes"));
            const double t = json_number_value(json_object_get(row, "time_s"));
            if (bytes < r->memory_min_bytes[j] || (j > 0 && bytes >= r->memory_min_bytes[j - 1]))
                continue;
            eff[k] = fmin(bytes / (t * hw->hbm_bytes_per_s), 1.0);
            weight[k++] = t * (double)json_integer_value(json_object_get(row, "count"));
        }
        if (k == 0)
            continue;
        json_array_set_new(json_array_get(curve, (size_t)j), 1,
                           json_real(weighted_median(eff, weight, k)));
        (*steps)++;
        *used += (int)k;
    }
    g_free(eff), g_free(weight);
}

/* Appends `text` to note `key` (after what the base profile said, which still holds for the
 * figures not fitted). */
static void add_note(json_t *notes, const char *key, const char *text)
{
    const char *before = json_string_value(json_object_get(notes, key));
    const gboolean stop = before && g_str_has_suffix(before, ".");
    char *note = before ? g_strdup_printf("%s%s Then %s", before, stop ? "" : ".", text)
                        : g_strdup(text);
    json_object_set_new(notes, key, json_string(note));
    g_free(note);
}

/* The base profile's kernel_rates (when it has them) fitted to the trace's tables, each fitted
 * figure's source in notes; returns the line that says what moved. */
static char *fit_kernel_rates(json_t *profile, const ZpHw *hw, json_t *tables, const char *files)
{
    json_t *rates = json_object_get(profile, "kernel_rates");
    json_t *notes = json_object_get(profile, "notes");
    if (!hw->kernel_rates.present || !json_is_object(rates))
        return g_strdup("kernel_rates: the base profile has none; the trace's rows stay in "
                        "kernel_tables");
    int gemm_rows = 0, steps = 0, memory_rows = 0;
    json_t *gemm = json_object_get(rates, "gemm");
    if (hw->kernel_rates.has_gemm &&
        fit_gemm(hw, json_object_get(tables, "gemm"), gemm, &gemm_rows)) {
        char *note = g_strdup_printf(
            "best_flops_per_s fitted by zplan calibrate --torch-trace %s: the weighted median "
            "(by time) over its %d compute-bound 16-bit GEMM shapes of best x the wave model's "
            "time / the measured median", files, gemm_rows);
        add_note(notes, "kernel_rates.gemm", note);
        g_free(note);
    }
    fit_memory(hw, json_object_get(tables, "memory"), json_object_get(rates, "memory_efficiency"),
               &steps, &memory_rows);
    if (steps > 0) {
        char *note = g_strdup_printf(
            "%d of its steps fitted by zplan calibrate --torch-trace %s: the weighted median (by "
            "time) of bytes / (time x hbm_bytes_per_s) over the %d memory-bound shapes (an op's "
            "tensors read and its largest written; copies and fills their bytes) whose bytes "
            "fall in the step, at most 1", steps, files, memory_rows);
        add_note(notes, "kernel_rates.memory_efficiency", note);
        g_free(note);
    }
    return g_strdup_printf("kernel_rates: GEMM best rate %s (%d shapes), memory efficiency %d "
                           "step(s) fitted (%d shapes)", gemm_rows ? "fitted" : "kept", gemm_rows,
                           steps, memory_rows);
}

static char *joined_names(char **paths)
{
    GString *s = g_string_new(NULL);
    for (int i = 0; paths[i]; i++) {
        char *base = g_path_get_basename(paths[i]);
        g_string_append_printf(s, "%s%s", i ? ", " : "", base);
        g_free(base);
    }
    return g_string_free(s, FALSE);
}

gboolean cli_torch_calibrate(char **traces, const char *cluster, const char *out,
                             const char *name, GError **error)
{
    if (!cluster) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--torch-trace needs --cluster NAME|PATH.json: the hwprofile whose tables "
                    "the trace's measurements are merged into");
        return FALSE;
    }
    char *base_path = zp_resolve_spec(cluster, "hwprofiles", "--cluster", "cluster", error);
    json_t *profile = base_path ? zp_json_load_object(base_path, error) : NULL;
    ZpHw hw;
    gboolean ok = profile && zp_hw_from_json(profile, base_path, &hw, error) &&
                  zp_check_out_path(out, "--out", error);
    ZpTorchTrace *t = ok ? cli_torch_trace_load(traces, error) : NULL;
    ok = t != NULL;
    if (ok) {
        ZpTraceSummary s;
        zp_torch_trace_summary(t, &s);
        char *files = joined_names(traces);
        char *source = g_strdup_printf(
            "zplan calibrate --torch-trace %s: PyTorch profiler (Kineto) traces, %d file(s), "
            "%d step(s); each row the median duration of the kernels of one CPU op and class "
            "at one shape (shapes from record_shapes, linked by correlation id)", files, s.files,
            s.steps);
        json_t *tables = zp_torch_trace_tables(t, source);
        char *fitted = fit_kernel_rates(profile, &hw, tables, files);
        json_t *existing = json_object_get(profile, "kernel_tables");
        if (existing)
            zp_kclass_tables_merge(existing, tables);
        else
            json_object_set(profile, "kernel_tables", tables);
        json_decref(tables);
        json_t *notes = json_object_get(profile, "notes");
        if (!json_is_object(notes)) {
            notes = json_object();
            json_object_set_new(profile, "notes", notes);
        }
        json_object_set_new(notes, "kernel_tables", json_string(source));
        int coll_rows = 0;
        char *why = NULL;
        if (merge_collectives(profile, t, base_path, &coll_rows, &why) && coll_rows > 0) {
            char *note = g_strdup_printf(
                "%d row(s) measured by zplan calibrate --torch-trace %s: each NCCL kernel's "
                "duration (waiting for its peers included, as a step pays it) by collective, "
                "group size and bytes, the median per size, each size at most every larger "
                "size's (the lower envelope); the "
                "other rows from %s", coll_rows, files, base_path);
            json_object_set_new(notes, "collective_table", json_string(note));
            g_free(note);
        } else if (why) {
            fprintf(stderr, "zplan calibrate: warning: the traces' collectives stay in "
                            "kernel_tables only, not the collective table: %s\n", why);
        }
        g_free(why);
        json_t *calibration = json_object_get(profile, "calibration");
        if (!json_is_object(calibration)) {
            calibration = json_object();
            json_object_set_new(profile, "calibration", calibration);
        }
        json_object_set_new(calibration, "torch_trace", cli_torch_trace_summary_json(t));
        char *base_name = g_path_get_basename(out);
        if (g_str_has_suffix(base_name, ".json"))
            base_name[strlen(base_name) - 5] = '\0';
        json_object_set_new(profile, "name", json_string(name ? name : base_name));
        g_free(base_name);
        ok = zp_hw_from_json(profile, "the calibrated profile", &hw, error) &&
             zp_json_write(profile, out, error);
        if (ok) {
            cli_torch_trace_print(t, stdout);
            printf("\n%s\n", fitted);
            printf("\nwrote %s: %s with the traces' kernel tables merged in\n", out, base_path);
        }
        g_free(fitted);
        g_free(source);
        g_free(files);
    }
    zp_torch_trace_free(t);
    json_decref(profile);
    g_free(base_path);
    return ok;
}
