/* cli_torchtrace: calibrate from a PyTorch profiler trace: the traces read (zp_torchtrace), their
 * classes printed, their tables merged into a base hwprofile and written. */
#include "cli_torchtrace.h"
#include "zp_colltab.h"
#include "zp_hw.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

/* Unknown kernel names printed (all of them go into the profile's calibration). */
#define PRINT_UNKNOWN 12

ZpTorchTrace *cli_torch_trace_load(char **paths, GError **error)
{
    ZpTorchTrace *t = zp_torch_trace_new();
    for (int i = 0; paths[i]; i++)
        if (!zp_torch_trace_read(t, paths[i], error)) {
            zp_torch_trace_free(t);
            return NULL;
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
                                   (double *)time_s->data, kind->len, &measured, &local) &&
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
                "group size and bytes, the median per size, pooled to non-decreasing; the "
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
            printf("\nwrote %s: %s with the traces' kernel tables merged in\n", out, base_path);
        }
        g_free(source);
        g_free(files);
    }
    zp_torch_trace_free(t);
    json_decref(profile);
    g_free(base_path);
    return ok;
}
