/* cli_validate: `zplan validate PREDICTED MEASURED` sets what `zplan simulate --json`
 * predicted beside what `zreal --out` measured: time, memory by category, bytes, op times. */
#include "cli.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *quantity;
    const char *unit;
    double predicted, measured;
} Row;

static double number(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static double rank_max(json_t *ranks, const char *object, const char *key)
{
    double best = NAN;
    for (size_t r = 0; r < json_array_size(ranks); r++) {
        json_t *rank = json_array_get(ranks, r);
        const double v = number(object ? json_object_get(rank, object) : rank, key);
        if (!isnan(v))
            best = isnan(best) ? v : fmax(best, v);
    }
    return best;
}

/* Mean over ranks of a per-step op time (the ranks run the same ops). */
static double rank_mean_op(json_t *ranks, const char *op, const char *field)
{
    double sum = 0;
    size_t n = 0;
    for (size_t r = 0; r < json_array_size(ranks); r++) {
        json_t *o = json_object_get(json_object_get(json_array_get(ranks, r), "ops"), op);
        if (o) {
            sum += number(o, field);
            n++;
        }
    }
    return n ? sum / (double)n : NAN;
}

static void add(GArray *rows, const char *quantity, const char *unit, double predicted,
                double measured)
{
    Row row = {g_strdup(quantity), unit, predicted, measured};
    g_array_append_val(rows, row);
}

/* Both files must describe the same plan: compare the fields that change the step. */
static gboolean same_plan(json_t *pred, json_t *meas, const char *pred_path,
                          const char *meas_path, GError **error)
{
    static const char *const keys[] = {"stage", "dp", "mp", "micro_batch", "grad_accum",
                                       "checkpoint"};
    json_t *a = json_object_get(pred, "plan"), *b = json_object_get(meas, "plan");
    if (!json_is_object(a) || !json_is_object(b)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: no \"plan\" object (expected zplan simulate --json and zreal --out)",
                    !json_is_object(a) ? pred_path : meas_path);
        return FALSE;
    }
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++)
        if (!json_equal(json_object_get(a, keys[i]), json_object_get(b, keys[i]))) {
            char *x = json_dumps(json_object_get(a, keys[i]), JSON_ENCODE_ANY);
            char *y = json_dumps(json_object_get(b, keys[i]), JSON_ENCODE_ANY);
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s and %s are different plans: %s %s vs %s", pred_path, meas_path,
                        keys[i], x ? x : "none", y ? y : "none");
            free(x);
            free(y);
            return FALSE;
        }
    return TRUE;
}

/* ---- what each file must hold ----------------------------------------------------------- */

/* Each key a number in [0, 1e30] in the object `o` (named `what`), or, for `nullable` keys,
 * null (zreal --steps 0 measures no time). */
static gboolean check_numbers(json_t *o, const char *what, const char *const *keys,
                              gboolean nullable, GError **error)
{
    if (!json_is_object(o)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s must be an object", what);
        return FALSE;
    }
    double v;
    for (const char *const *k = keys; *k; k++)
        if (!(nullable && json_is_null(json_object_get(o, *k))) &&
            !zp_json_get_number(o, what, *k, TRUE, 0, 1e30, &v, error))
            return FALSE;
    return TRUE;
}

/* Every memory category's figure, in the object at `key` of o. */
static gboolean check_categories(json_t *o, const char *what, const char *key, GError **error)
{
    const char *names[ZP_MEM_N + 1] = {NULL};
    for (int c = 0; c < ZP_MEM_N; c++)
        names[c] = zp_sched_mem_name(c);
    char *inner = g_strdup_printf("%s: %s", what, key);
    const gboolean ok = check_numbers(json_object_get(o, key), inner, names, FALSE, error);
    g_free(inner);
    return ok;
}

/* "ops": {"block_fwd": {"count": N, "total_s": T}, ...}, with known op types only. */
static gboolean check_ops(json_t *o, const char *what, GError **error)
{
    static const char *const fields[] = {"count", "total_s", NULL};
    json_t *ops = json_object_get(o, "ops"), *entry;
    const char *op;
    if (!json_is_object(ops)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an object", what);
        return FALSE;
    }
    json_object_foreach(ops, op, entry)
    {
        gboolean known = FALSE;
        for (int k = 0; k < ZP_COMP_N; k++)
            known = known || strcmp(op, zp_sched_compute_name(k)) == 0;
        for (int k = 0; k < ZP_COLL_N; k++)
            known = known || strcmp(op, zp_sched_coll_name(k)) == 0;
        char *inner = g_strdup_printf("%s: ops: %s", what, op);
        const gboolean ok = known ? check_numbers(entry, inner, fields, FALSE, error)
                                  : (g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                                                 "%s: unknown op type", inner), FALSE);
        g_free(inner);
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

/* zreal --out says what it is ("format"); simulate --json does not. */
static gboolean is_measured(json_t *obj)
{
    json_t *format = json_object_get(obj, "format");
    return json_is_string(format) && strcmp(json_string_value(format), "zplan-measured-1") == 0;
}

/* The two files given the wrong way round are named as such, not as a missing key. */
static gboolean not_swapped(json_t *pred, json_t *meas, const char *pred_path,
                            const char *meas_path, GError **error)
{
    if (!is_measured(pred) || is_measured(meas))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "the two files are swapped: %s is zreal's measurement and %s is not; give the "
                "prediction first: zplan validate %s %s", pred_path, meas_path, meas_path,
                pred_path);
    return FALSE;
}

/* zplan simulate --json: the figures compared, all present. */
static gboolean check_predicted(json_t *pred, const char *path, GError **error)
{
    static const char *const keys[] = {"step_time_s", "model_state_bytes", "peak_memory_bytes",
                                       NULL};
    static const char *const comm[] = {"dp", NULL};
    char *inner = g_strdup_printf("%s: comm_bytes_per_rank", path);
    const gboolean ok = check_numbers(pred, path, keys, FALSE, error) &&
                        check_numbers(json_object_get(pred, "comm_bytes_per_rank"), inner, comm,
                                      FALSE, error) &&
                        check_categories(pred, path, "category_peak_bytes", error) &&
                        check_ops(pred, path, error);
    g_free(inner);
    return ok;
}

/* zreal --out: its format, and one object per rank, 0..world-1, with every figure. */
static gboolean check_measured(json_t *meas, const char *path, GError **error)
{
    static const char *const keys[] = {"model_state_bytes", "peak_memory_bytes", "comm_bytes",
                                       NULL};
    static const char *const step[] = {"step_time_s", NULL};
    const char *format = NULL;
    int64_t world = 0, rank = 0;
    if (!zp_json_get_string(meas, path, "format", TRUE, &format, error))
        return FALSE;
    if (strcmp(format, "zplan-measured-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: format \"%s\" is not zplan-measured-1 (zreal --out)", path, format);
        return FALSE;
    }
    json_t *ranks = json_object_get(meas, "ranks");
    if (!zp_json_get_int(meas, path, "world", TRUE, 1, 1 << 24, &world, error) ||
        !check_numbers(meas, path, step, TRUE, error))
        return FALSE;
    if (!json_is_array(ranks) || json_array_size(ranks) == 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"ranks\" must be a non-empty array of rank objects", path);
        return FALSE;
    }
    gboolean ok = TRUE;
    for (size_t r = 0; ok && r < json_array_size(ranks); r++) {
        json_t *o = json_array_get(ranks, r);
        char *what = g_strdup_printf("%s: ranks[%zu]", path, r);
        ok = check_numbers(o, what, keys, FALSE, error) &&
             zp_json_get_int(o, what, "rank", TRUE, 0, world - 1, &rank, error) &&
             check_numbers(o, what, step, TRUE, error) &&
             check_categories(o, what, "category_peak_bytes", error) &&
             check_ops(o, what, error);
        g_free(what);
    }
    return ok;
}

static void collect_rows(json_t *pred, json_t *meas, GArray *rows)
{
    json_t *ranks = json_object_get(meas, "ranks");
    add(rows, "step time", "s", number(pred, "step_time_s"), number(meas, "step_time_s"));
    add(rows, "model states", "bytes", number(pred, "model_state_bytes"),
        rank_max(ranks, NULL, "model_state_bytes"));
    add(rows, "peak memory", "bytes", number(pred, "peak_memory_bytes"),
        rank_max(ranks, NULL, "peak_memory_bytes"));
    json_t *cat = json_object_get(pred, "category_peak_bytes");
    for (int c = 0; c < ZP_MEM_N; c++) {
        char *q = g_strdup_printf("peak %s", zp_sched_mem_name(c));
        add(rows, q, "bytes", number(cat, zp_sched_mem_name(c)),
            rank_max(ranks, "category_peak_bytes", zp_sched_mem_name(c)));
        g_free(q);
    }
    add(rows, "bytes sent per rank", "bytes",
        number(json_object_get(pred, "comm_bytes_per_rank"), "dp"),
        rank_max(ranks, NULL, "comm_bytes"));
    json_t *ops = json_object_get(pred, "ops");
    const char *op;
    json_t *o;
    json_object_foreach(ops, op, o)
    {
        char *q = g_strdup_printf("%s (%.0f ops)", op, number(o, "count"));
        add(rows, q, "s", number(o, "total_s"), rank_mean_op(ranks, op, "total_s"));
        g_free(q);
    }
}

static double error_of(const Row *r)
{
    return r->predicted == r->measured ? 0.0 : (r->measured - r->predicted) / r->predicted;
}

/* The size of a row's miss for sorting: |error|, a prediction of 0 that missed above all, and
 * rows without both figures below the exact ones. */
static double miss_of(const Row *r)
{
    if (isnan(r->predicted) || isnan(r->measured))
        return -1;
    if (r->predicted == 0 && r->measured != 0)
        return INFINITY;
    return fabs(error_of(r));
}

/* Largest miss first; equal misses keep the order they were collected in (step time, memory,
 * bytes, op times). */
static gint by_miss(gconstpointer a, gconstpointer b)
{
    const double x = miss_of(a), y = miss_of(b);
    return (x < y) - (x > y);
}

static void print_rows(const GArray *rows, const char *pred_path, const char *meas_path)
{
    printf("Predicted (%s) against measured (%s); error = (measured - predicted) / predicted,\n"
           "largest miss first.\n"
           "Memory is each category's own peak on the rank where it is highest; op times are\n"
           "seconds per step, summed over the step's ops of that type.\n\n",
           pred_path, meas_path);
    printf("  %-34s %16s %16s %10s\n", "quantity", "predicted", "measured", "error");
    for (guint i = 0; i < rows->len; i++) {
        const Row *r = &g_array_index(rows, Row, i);
        char err[32];
        if (isnan(r->predicted) || isnan(r->measured))
            g_snprintf(err, sizeof err, "n/a");
        else if (r->predicted == r->measured)
            g_snprintf(err, sizeof err, "exact");
        else if (r->predicted == 0)
            g_snprintf(err, sizeof err, "(pred. 0)");
        else
            g_snprintf(err, sizeof err, "%+.1f%%", 100 * error_of(r));
        printf("  %-34s %16.6g %16.6g %10s  %s\n", r->quantity, r->predicted, r->measured, err,
               r->unit);
    }
}

static json_t *rows_json(const GArray *rows)
{
    json_t *out = json_array();
    for (guint i = 0; i < rows->len; i++) {
        const Row *r = &g_array_index(rows, Row, i);
        json_t *row = json_pack("{s:s, s:s}", "quantity", r->quantity, "unit", r->unit);
        json_object_set_new(row, "predicted", isnan(r->predicted) ? json_null() : json_real(r->predicted));
        json_object_set_new(row, "measured", isnan(r->measured) ? json_null() : json_real(r->measured));
        json_object_set_new(row, "error", isnan(r->predicted) || isnan(r->measured) || r->predicted == 0
                                              ? json_null() : json_real(error_of(r)));
        json_array_append_new(out, row);
    }
    return json_pack("{s:o}", "rows", out);
}

int cli_validate(int argc, char **argv)
{
    gboolean json = FALSE;
    GOptionEntry entries[] = {
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("PREDICTED.json MEASURED.json");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Compares zplan simulate --json (PREDICTED) with zreal --out (MEASURED) for the same\n"
        "plan: step time, model states, peak memory and every memory category, bytes sent,\n"
        "and the time of every op type.");
    GError *error = NULL;
    json_t *pred = NULL, *meas = NULL;
    gboolean ok = g_option_context_parse(context, &argc, &argv, &error);
    if (ok && argc != 3) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE,
                    "give two files: PREDICTED.json MEASURED.json (see --help)");
        ok = FALSE;
    }
    ok = ok && (pred = zp_json_load_object(argv[1], &error)) &&
         (meas = zp_json_load_object(argv[2], &error)) &&
         not_swapped(pred, meas, argv[1], argv[2], &error) &&
         same_plan(pred, meas, argv[1], argv[2], &error) &&
         check_predicted(pred, argv[1], &error) && check_measured(meas, argv[2], &error);
    int status = 0;
    if (ok) {
        GArray *rows = g_array_new(FALSE, FALSE, sizeof(Row));
        collect_rows(pred, meas, rows);
        g_array_sort(rows, by_miss); /* GLib's sort is stable */
        if (json) {
            json_t *out = rows_json(rows);
            ok = zp_json_write(out, NULL, &error);
            json_decref(out);
        } else {
            print_rows(rows, argv[1], argv[2]);
        }
        for (guint i = 0; i < rows->len; i++)
            g_free(g_array_index(rows, Row, i).quantity);
        g_array_unref(rows);
    }
    if (!ok)
        status = cli_fail("validate", error);
    json_decref(pred);
    json_decref(meas);
    g_option_context_free(context);
    return status;
}
