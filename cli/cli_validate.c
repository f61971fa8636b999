/* cli_validate: `zplan validate PREDICTED MEASURED` sets what `zplan simulate --json`
 * predicted beside what `zreal --out` measured: time, memory by category, bytes, op times, and
 * the compute by kernel class where both files have it. */
#include "cli.h"
#include "cli_torchtrace.h"
#include "zp_sched.h"
#include "zp_outpath.h"
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

/* Plan key `key` of a file's plan as compared: all of it but where the NVMe tier's swap files
 * go (zero.offload_*.nvme_path), which the two runs may put in different places. */
static json_t *compared(json_t *plan, const char *key)
{
    json_t *v = json_object_get(plan, key);
    if (strcmp(key, "zero") != 0 || !json_is_object(v))
        return json_incref(v);
    json_t *copy = json_deep_copy(v);
    static const char *const tiers[] = {"offload_optimizer", "offload_param"};
    for (size_t i = 0; i < G_N_ELEMENTS(tiers); i++)
        json_object_del(json_object_get(copy, tiers[i]), "nvme_path");
    return copy;
}

/* Whether x and y differ (either may be NULL: absent); objects key by key, so that `path`
 * (the key path so far) ends at the first difference, whose two values go to *dx and *dy. */
static gboolean differ(json_t *x, json_t *y, GString *path, json_t **dx, json_t **dy)
{
    if (!json_is_object(x) || !json_is_object(y)) {
        *dx = x, *dy = y;
        return (x || y) && !json_equal(x, y);
    }
    json_t *const sides[2] = {x, y};
    for (int side = 0; side < 2; side++) {
        const char *key;
        json_t *value;
        json_object_foreach(sides[side], key, value)
        {
            const gsize len = path->len;
            g_string_append_printf(path, ".%s", key);
            if (differ(json_object_get(x, key), json_object_get(y, key), path, dx, dy))
                return TRUE;
            g_string_truncate(path, len);
        }
    }
    return FALSE;
}

/* Both files must describe the same plan: every field that changes the step, its memory or its
 * bytes (the attention kernel and the implementation's semantics among them: `simulate` picks
 * a profile's fused kernel and DeepSpeed's semantics by default, zreal eager attention and the
 * paper's). A key neither file has (an older file's, a plan without a pipeline) agrees; the
 * cluster's GPUs per node do not enter (zreal's ranks share one machine). */
static gboolean same_plan(json_t *pred, json_t *meas, const char *pred_path,
                          const char *meas_path, GError **error)
{
    static const char *const keys[] = {"stage", "dp", "mp", "micro_batch", "grad_accum",
                                       "checkpoint", "precision", "optimizer", "attention",
                                       "reduce_dtype", "impl", "zero", "activation_checkpointing",
                                       "pipeline", "sequence_parallel", "recompute",
                                       "overlap_param_gather"};
    json_t *a = json_object_get(pred, "plan"), *b = json_object_get(meas, "plan");
    if (!json_is_object(a) || !json_is_object(b)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: no \"plan\" object (expected zplan simulate --json and zreal --out)",
                    !json_is_object(a) ? pred_path : meas_path);
        return FALSE;
    }
    gboolean same = TRUE;
    for (size_t i = 0; same && i < G_N_ELEMENTS(keys); i++) {
        json_t *x = compared(a, keys[i]), *y = compared(b, keys[i]), *dx, *dy;
        GString *path = g_string_new(keys[i]);
        same = !differ(x, y, path, &dx, &dy);
        if (!same) {
            char *xs = dx ? json_dumps(dx, JSON_ENCODE_ANY) : NULL;
            char *ys = dy ? json_dumps(dy, JSON_ENCODE_ANY) : NULL;
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s and %s are different plans: %s %s vs %s", pred_path, meas_path,
                        path->str, xs ? xs : "none", ys ? ys : "none");
            free(xs);
            free(ys);
        }
        g_string_free(path, TRUE);
        json_decref(x);
        json_decref(y);
    }
    return same;
}

/* zreal's CPU backend holds workspace buffers (its run-long x, dx, staging and GEMM buffers,
 * each op's own) that a prediction lists only when it was simulated on a profile calibrated
 * there ("backend_workspace"): without them its peak memory and workspace leave them out. */
static char *workspace_note(json_t *pred, json_t *meas, const char *pred_path)
{
    json_t *backend = json_object_get(meas, "backend");
    if (!json_is_string(backend) || strcmp(json_string_value(backend), "cpu") != 0 ||
        json_is_true(json_object_get(pred, "backend_workspace")))
        return NULL;
    return g_strdup_printf("%s was simulated on a profile not calibrated on zreal's CPU backend "
                           "(zplan calibrate), so its peak memory and workspace leave out the "
                           "backend's workspace buffers", pred_path);
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

/* Every memory category's figure, in the object at `key` of o; a mixture of experts' buffers
 * (ep_buffers) only where the file has them, since files written before them lack the key. */
static gboolean check_categories(json_t *o, const char *what, const char *key, GError **error)
{
    const char *names[ZP_MEM_N + 1] = {NULL};
    for (int c = 0; c < ZP_MEM_EP_BUFFERS; c++)
        names[c] = zp_sched_mem_name(c);
    char *inner = g_strdup_printf("%s: %s", what, key);
    double v;
    gboolean ok = check_numbers(json_object_get(o, key), inner, names, FALSE, error);
    for (int c = ZP_MEM_EP_BUFFERS; ok && c < ZP_MEM_N; c++)
        ok = zp_json_get_number(json_object_get(o, key), inner, zp_sched_mem_name(c), FALSE, 0,
                                1e30, &v, error);
    g_free(inner);
    return ok;
}

/* The kernel classes `simulate --json` lists under "compute_by_class" (with a profile's kernel
 * rates) and a measurement may carry at its top level (a GPU run's profile summed by class):
 * seconds a rank's step spends in each. */
static const char *const class_keys[] = {"gemm_s", "attention_s", "memory_s", NULL};

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

/* A measured step time, which validation compares: zreal --steps 0 writes null (no step ran),
 * and such a file has no time to set beside the prediction (its row would vanish). */
static gboolean check_step_time(json_t *o, const char *what, GError **error)
{
    static const char *const step[] = {"step_time_s", NULL};
    if (json_is_null(json_object_get(o, "step_time_s"))) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"step_time_s\" is null (zreal --steps 0 times no step): no "
                    "measured time to validate", what);
        return FALSE;
    }
    return check_numbers(o, what, step, FALSE, error);
}

/* Each rank listed once, and every rank of the world listed unless the file says it is an
 * emulated run (one process playing some of the world's ranks). */
static gboolean check_rank_set(json_t *meas, json_t *ranks, const char *path, int64_t world,
                               GError **error)
{
    const size_t n = json_array_size(ranks);
    const gboolean emulated = json_is_true(json_object_get(meas, "emulated"));
    if (emulated ? n > (size_t)world : n != (size_t)world) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"world\" = %" G_GINT64_FORMAT " but \"ranks\" lists %zu rank%s%s",
                    path, world, n, n == 1 ? "" : "s", emulated ? "" : " (not an emulated run)");
        return FALSE;
    }
    GHashTable *seen = g_hash_table_new(g_int64_hash, g_int64_equal);
    int64_t *ids = g_new(int64_t, n);
    gboolean ok = TRUE;
    for (size_t r = 0; ok && r < n; r++) {
        ids[r] = json_integer_value(json_object_get(json_array_get(ranks, r), "rank"));
        ok = g_hash_table_add(seen, &ids[r]);
        if (!ok)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: ranks[%zu]: key \"rank\" = %" G_GINT64_FORMAT
                        " is listed twice", path, r, ids[r]);
    }
    g_hash_table_destroy(seen);
    g_free(ids);
    return ok;
}

/* zreal --out: its format, and one object per rank, 0..world-1, with every figure. */
static gboolean check_measured(json_t *meas, const char *path, GError **error)
{
    static const char *const keys[] = {"model_state_bytes", "peak_memory_bytes", "comm_bytes",
                                       NULL};
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
    json_t *by_class = json_object_get(meas, "compute_by_class");
    char *inner = g_strdup_printf("%s: compute_by_class", path);
    const gboolean classes_ok =
        !by_class || check_numbers(by_class, inner, class_keys, FALSE, error);
    g_free(inner);
    if (!classes_ok || !zp_json_get_int(meas, path, "world", TRUE, 1, 1 << 24, &world, error) ||
        !check_step_time(meas, path, error))
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
             check_step_time(o, what, error) &&
             check_categories(o, what, "category_peak_bytes", error) &&
             check_ops(o, what, error);
        g_free(what);
    }
    return ok && check_rank_set(meas, ranks, path, world, error);
}

static void collect_class_rows(json_t *pred, json_t *meas, GArray *rows)
{
    json_t *p = json_object_get(pred, "compute_by_class");
    json_t *m = json_object_get(meas, "compute_by_class");
    if (!p || !m)
        return;
    for (const char *const *k = class_keys; *k; k++) {
        char *q = g_strdup_printf("compute: %.*s kernels", (int)(strlen(*k) - 2), *k);
        add(rows, q, "s", number(p, *k), number(m, *k));
        g_free(q);
    }
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
        if (c >= ZP_MEM_EP_BUFFERS && !json_object_get(cat, zp_sched_mem_name(c)))
            continue; /* a file from before the category */
        char *q = g_strdup_printf("peak %s", zp_sched_mem_name(c));
        add(rows, q, "bytes", number(cat, zp_sched_mem_name(c)),
            rank_max(ranks, "category_peak_bytes", zp_sched_mem_name(c)));
        g_free(q);
    }
    add(rows, "bytes sent per rank", "bytes",
        number(json_object_get(pred, "comm_bytes_per_rank"), "dp"),
        rank_max(ranks, NULL, "comm_bytes"));
    /* A mixture of experts: the all-to-alls over the EP group and the experts' reductions and
     * gathers over the dp / EP ranks holding the same experts (zreal's moe_comm_bytes). */
    static const char *const moe_groups[] = {"ep", "edp"};
    json_t *first = json_array_get(ranks, 0);
    for (size_t g = 0; json_object_get(first, "moe_comm_bytes") && g < G_N_ELEMENTS(moe_groups);
         g++) {
        char *q = g_strdup_printf("bytes sent per rank (%s)", moe_groups[g]);
        add(rows, q, "bytes", number(json_object_get(pred, "comm_bytes_per_rank"), moe_groups[g]),
            rank_max(ranks, "moe_comm_bytes", moe_groups[g]));
        g_free(q);
    }
    json_t *ops = json_object_get(pred, "ops");
    const char *op;
    json_t *o;
    json_object_foreach(ops, op, o)
    {
        char *q = g_strdup_printf("%s (%.0f ops)", op, number(o, "count"));
        add(rows, q, "s", number(o, "total_s"), rank_mean_op(ranks, op, "total_s"));
        g_free(q);
    }
    collect_class_rows(pred, meas, rows);
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

/* A figure as a person reads it: bytes in B, KB, MB or GB (1e3 steps) to four significant
 * digits, or exact below 1e4; seconds in s, ms, us or ns; anything else as %g. */
static void human(double value, const char *unit, char *out, size_t size)
{
    static const struct {
        const char *unit, *name;
        double scale;
    } scales[] = {
        {"bytes", "GB", 1e9}, {"bytes", "MB", 1e6}, {"bytes", "KB", 1e3},
        {"s", "s", 1},        {"s", "ms", 1e-3},    {"s", "us", 1e-6}, {"s", "ns", 1e-9},
    };
    if (isnan(value)) {
        g_snprintf(out, size, "n/a");
        return;
    }
    for (size_t i = 0; i < G_N_ELEMENTS(scales); i++)
        if (strcmp(unit, scales[i].unit) == 0 && fabs(value) >= scales[i].scale &&
            !(strcmp(unit, "bytes") == 0 && fabs(value) < 1e4)) {
            g_snprintf(out, size, "%.4g %s", value / scales[i].scale, scales[i].name);
            return;
        }
    g_snprintf(out, size, strcmp(unit, "bytes") == 0 ? "%.0f B" : "%.4g %s", value,
               strcmp(unit, "bytes") == 0 ? "" : unit);
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
        char predicted[32], measured[32];
        human(r->predicted, r->unit, predicted, sizeof predicted);
        human(r->measured, r->unit, measured, sizeof measured);
        printf("  %-34s %16s %16s %10s\n", r->quantity, predicted, measured, err);
    }
}

static json_t *rows_json(const GArray *rows, const char *note)
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
    return json_pack("{s:o, s:s?}", "rows", out, "note", note);
}

/* Whether argv asks for the PyTorch trace's comparison (--torch-trace), whose flags are
 * simulate's. */
static gboolean torch_trace_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--torch-trace") == 0 || g_str_has_prefix(argv[i], "--torch-trace="))
            return TRUE;
    return FALSE;
}

/* The rows whose miss is over `tolerance` (a fraction), the largest first as sorted; says so on
 * stdout (text) and returns how many. */
static guint over_tolerance(const GArray *rows, double tolerance, gboolean print)
{
    guint over = 0;
    for (guint i = 0; i < rows->len; i++) {
        const Row *r = &g_array_index(rows, Row, i);
        if (miss_of(r) > tolerance) {
            if (over == 0 && print)
                printf("\nOver the %.3g%% tolerance: %s (%+.1f%%)", 100 * tolerance, r->quantity,
                       r->predicted == 0 ? INFINITY : 100 * error_of(r));
            over++;
        }
    }
    if (over > 1 && print)
        printf(" and %u more", over - 1);
    if (over > 0 && print)
        printf(".\n");
    return over;
}

/* --tolerance P% (or P): a percentage in (0, 1e6]. */
static gboolean parse_tolerance(const char *text, double *out, GError **error)
{
    if (!text)
        return TRUE;
    char *digits = g_strndup(text, strlen(text) - (g_str_has_suffix(text, "%") ? 1 : 0));
    double pct;
    const gboolean ok = zp_parse_number(digits, "--tolerance", 0, 1e6, FALSE, &pct, error);
    g_free(digits);
    *out = pct / 100;
    return ok;
}

int cli_validate(int argc, char **argv)
{
    if (torch_trace_args(argc, argv))
        return cli_torch_validate(argc, argv);
    gboolean json = FALSE;
    char *tolerance_flag = NULL;
    double tolerance = INFINITY;
    GOptionEntry entries[] = {
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
        {"tolerance", 0, 0, G_OPTION_ARG_STRING, &tolerance_flag, "Exit with status 3 when any quantity misses by more than P percent (10%; default: no limit)", "P%"},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("PREDICTED.json MEASURED.json");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Compares zplan simulate --json (PREDICTED) with zreal --out (MEASURED) for the same\n"
        "plan: step time, model states, peak memory and every memory category, bytes sent,\n"
        "and the time of every op type.\n\n"
        "zplan validate --torch-trace TRACE --model M --cluster C --gpus N --stage S\n"
        "--micro-batch B ... compares a PyTorch profiler trace of a job with zplan's\n"
        "prediction of its plan instead, by kernel class (docs/calibrate.md).");
    GError *error = NULL;
    json_t *pred = NULL, *meas = NULL;
    gboolean ok = cli_parse_options(context, &argc, &argv, &error) &&
                  parse_tolerance(tolerance_flag, &tolerance, &error);
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
        char *note = workspace_note(pred, meas, argv[1]);
        if (json) {
            json_t *out = rows_json(rows, note);
            ok = zp_json_write(out, NULL, &error);
            json_decref(out);
        } else {
            print_rows(rows, argv[1], argv[2]);
            if (note)
                printf("\nNote: %s.\n", note);
        }
        g_free(note);
        if (ok && over_tolerance(rows, tolerance, !json) > 0)
            status = CLI_EXIT_OVER_TOLERANCE;
        for (guint i = 0; i < rows->len; i++)
            g_free(g_array_index(rows, Row, i).quantity);
        g_array_unref(rows);
    }
    if (!ok)
        status = cli_fail("validate", error);
    json_decref(pred);
    json_decref(meas);
    g_option_context_free(context);
    g_free(tolerance_flag);
    return status;
}
