/* cli_sweep: `zplan sweep` varies one input (GPUs, model size, micro-batch or stage), computes
 * a metric per ZeRO stage at each value, and writes PREFIX.csv and a gnuplot PREFIX.svg (or
 * .png) whose title states what it assumes and where what does not fit stays visible. */
#include "cli.h"
#include "cli_progress.h"
#include "cli_moe.h"
#include "zp_mem.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define GB 1e9

typedef enum { VARY_GPUS, VARY_PARAMS, VARY_MICRO_BATCH, VARY_STAGE, VARY_N } SweepVary;
typedef enum { METRIC_TFLOPS, METRIC_MEMORY, METRIC_MAXMODEL, METRIC_N } SweepMetric;

/* Names on the command line, the CSV column of x and the axis label. */
static const struct {
    const char *name, *column, *label;
    gboolean log_x;
} varies[VARY_N] = {
    [VARY_GPUS] = {"gpus", "gpus", "GPUs", TRUE},
    [VARY_PARAMS] = {"params", "params_billions", "parameters (billions)", TRUE},
    [VARY_MICRO_BATCH] = {"micro-batch", "micro_batch", "micro-batch per GPU", TRUE},
    [VARY_STAGE] = {"stage", "stage", "ZeRO stage", FALSE},
};

/* Names, the CSV column when one stage is plotted, axis label and whether y is logarithmic. */
static const struct {
    const char *name, *column, *label;
    gboolean log_y;
} metrics[METRIC_N] = {
    [METRIC_TFLOPS] = {"tflops", "tflops_per_gpu", "model TFLOP/s per GPU (best plan)", FALSE},
    [METRIC_MEMORY] = {"memory", "memory_gb", "memory per GPU (GB)", TRUE},
    [METRIC_MAXMODEL] = {"maxmodel", "max_params_billions", "largest model (billion parameters)",
                         TRUE},
};

typedef struct {
    SweepVary vary;
    SweepMetric metric;
    GArray *values; /* double */
    ZpModel model;
    gboolean have_model; /* --model (else --params, or the varied params) */
    ZpHw hw;
    gboolean have_hw;
    int gpus, mp, micro_batch, stage;
    int64_t global_batch;
    gboolean checkpoint;
    ZpPrecision precision;
    ZpOptimizer optimizer;
    ZpPlan kernels; /* its attention and reduce_dtype: every plan's (cli_attention_reduce) */
    char *out;
    gboolean png; /* PREFIX.png instead of PREFIX.svg */
} SweepArgs;

/* One x value's row: a value per stage (NAN where nothing fits or nothing applies); for
 * tflops, the ZeRO-R and ZeRO++ options of each stage's best plan ("Pa + MD", "" for none,
 * NULL where nothing fits). */
typedef struct {
    double x;
    double stage[4];
    char *options[4];
} SweepRow;

/* ---- one point ------------------------------------------------------------------------- */

/* The inputs at x: the varied one replaced, the rest from the flags. */
static void point(const SweepArgs *a, double x, ZpModel *model, int *gpus, int *micro)
{
    *model = a->model;
    *gpus = a->vary == VARY_GPUS ? (int)x : a->gpus;
    *micro = a->vary == VARY_MICRO_BATCH ? (int)x : a->micro_batch;
    if (a->vary == VARY_PARAMS)
        zp_model_from_params(x, model);
}

static gboolean memory_row(const SweepArgs *a, double x, SweepRow *row, GError **error)
{
    ZpModel model;
    int gpus, micro;
    point(a, x, &model, &gpus, &micro);
    if (!cli_check_mp(a->mp, gpus, &model, error))
        return FALSE;
    const ZpStateBytes sb = zp_plan_state_bytes(a->precision, a->optimizer);
    for (int stage = 0; stage <= 3; stage++) {
        ZpPlan plan;
        zp_plan_defaults(&plan, stage, gpus / a->mp, a->mp);
        plan.micro_batch = micro;
        plan.checkpoint = a->checkpoint;
        plan.precision = a->precision;
        plan.optimizer = a->optimizer;
        plan.attention = a->kernels.attention;
        plan.attention_unrated = a->kernels.attention_unrated;
        plan.reduce_dtype = a->kernels.reduce_dtype;
        /* Table 1 counts model states only; with an architecture the rest is known too, and
         * it is what `memory` says of the same plan (cli_need_bytes). */
        const double bytes = zp_model_has_architecture(&model)
                                 ? cli_need_bytes(&model, &plan, a->have_hw ? &a->hw : NULL)
                                 : zp_mem_model_states((double)zp_model_param_count(&model),
                                                       stage, plan.dp, a->mp, sb).total_bytes;
        row->stage[stage] = isinf(bytes) ? NAN : bytes / GB;
    }
    return TRUE;
}

static gboolean maxmodel_row(const SweepArgs *a, double x, SweepRow *row, GError **error)
{
    ZpModel model;
    int gpus, micro;
    point(a, x, &model, &gpus, &micro);
    if (!cli_check_mp(a->mp, gpus, &model, error))
        return FALSE;
    const ZpStateBytes sb = zp_plan_state_bytes(a->precision, a->optimizer);
    const double budget = a->hw.gpu_memory_bytes - a->hw.runtime_reserve_bytes;
    for (int stage = 0; stage <= 3; stage++)
        row->stage[stage] = zp_mem_max_params(budget, stage, gpus / a->mp, a->mp, sb) / 1e9;
    return TRUE;
}

/* The options as one CSV cell: "Pa+cpu + MD + hpZ 8" (no commas). */
static char *options_cell(const ZpPlan *plan)
{
    char *text = zp_search_options_text(plan);
    char **parts = g_strsplit(text, ", ", -1);
    char *cell = g_strjoinv(" + ", parts);
    g_strfreev(parts);
    g_free(text);
    return cell;
}

/* The closed form's fitting plans of a stage a mixture of experts' point simulates, at most,
 * where none of its search's shortlist fits (zp_moe_search_simulate_stages): a plan the
 * closed form says fits but the allocator replay does not (stage 3's gathers) is followed by
 * its next best. */
#define SWEEP_MOE_TRIES 16

/* A mixture of experts at one point: its own search as `zplan plan` runs it (zp_moe_search:
 * EP, TP, stage, micro-batch, checkpointing; dropless, no skew), each stage's best fitting
 * plan judged by the simulator, and that plan's model TFLOP/s per GPU as `simulate` reports
 * it (its schedule's model FLOPs over the step: a sparse block's routed experts included). */
static gboolean moe_tflops_row(const ZpSearchSpec *spec, CliRankContext *rank, SweepRow *row,
                               GError **error)
{
    cli_rank_keep(rank); /* the runs the rows' FLOPs are read from */
    GArray *all = zp_moe_search_run(spec, 1.0, 0.0, error);
    if (!all) {
        cli_rank_clear(rank);
        return FALSE;
    }
    zp_moe_search_simulate(spec, all, 1);
    zp_moe_search_simulate_stages(spec, all, SWEEP_MOE_TRIES);
    for (int stage = 0; stage <= 3; stage++) {
        row->stage[stage] = NAN;
        for (guint i = 0; i < all->len; i++) { /* the simulated ones first, the best first */
            ZpMoeCandidate *c = &g_array_index(all, ZpMoeCandidate, i);
            if (c->plan.zero.stage != stage || !c->simulated || !c->fits)
                continue;
            cli_moe_read_simulated(spec, c);
            row->stage[stage] = cli_moe_tflops(c);
            if (!isnan(row->stage[stage])) {
                char *cell = options_cell(&c->plan);
                row->options[stage] = g_strdup_printf("%s%sEP %d", cell, *cell ? " + " : "",
                                                      zp_plan_ep(&c->plan));
                g_free(cell);
            }
            break;
        }
    }
    g_array_unref(all);
    cli_rank_clear(rank);
    return TRUE;
}

static gboolean tflops_row(const SweepArgs *a, double x, SweepRow *row, GError **error)
{
    ZpModel model;
    int gpus, micro;
    point(a, x, &model, &gpus, &micro);
    ZpSearchSpec spec;
    CliRankContext rank;
    cli_search_spec(&spec, &rank, &model, &a->hw, gpus);
    spec.global_batch = a->global_batch;
    spec.mp = a->mp;
    spec.micro_batch = micro;
    spec.stage = a->vary == VARY_STAGE ? (int)x : -1;
    spec.top_k = 1;
    spec.precision = a->precision;
    spec.optimizer = a->optimizer;
    spec.attention = a->kernels.attention;
    spec.reduce_dtype = a->kernels.reduce_dtype;
    g_strlcpy(spec.kernels, a->kernels.kernels, sizeof spec.kernels);
    spec.exclude = CLI_LOSSY_ZEROPP;
    if (zp_moe_enabled(&model.moe))
        return moe_tflops_row(&spec, &rank, row, error);
    ZpSearchResult r;
    if (!zp_search_run(&spec, &r, error)) {
        zp_search_result_clear(&r);
        return FALSE;
    }
    for (int stage = 0; stage <= 3; stage++) {
        row->stage[stage] = NAN;
        for (int ckpt = 0; ckpt <= 1; ckpt++) {
            const int best = r.stage_best[stage][ckpt];
            if (best < 0)
                continue;
            const ZpCandidate *c = zp_search_candidate(&r, best);
            const double tflops = cli_plan_tflops(&model, c);
            if (isnan(row->stage[stage]) || tflops > row->stage[stage]) {
                row->stage[stage] = tflops;
                g_free(row->options[stage]);
                row->options[stage] = options_cell(&c->plan);
            }
        }
    }
    zp_search_result_clear(&r);
    return TRUE;
}

typedef gboolean (*RowFn)(const SweepArgs *a, double x, SweepRow *row, GError **error);
static const RowFn row_fns[METRIC_N] = {
    [METRIC_TFLOPS] = tflops_row,
    [METRIC_MEMORY] = memory_row,
    [METRIC_MAXMODEL] = maxmodel_row,
};

/* ---- output ---------------------------------------------------------------------------- */

static void format_cell(GString *csv, double value)
{
    if (isnan(value))
        g_string_append(csv, ",");
    else
        g_string_append_printf(csv, ",%.6g", value);
}

/* Varying the stage gives one series (the metric at that stage); otherwise one per stage,
 * and the GPU's memory beside the memory series. */
static char *csv_text(const SweepArgs *a, const SweepRow *rows, guint n)
{
    GString *csv = g_string_new(varies[a->vary].column);
    const gboolean by_stage = a->vary != VARY_STAGE;
    const gboolean memory_line = a->metric == METRIC_MEMORY && a->have_hw && by_stage;
    if (by_stage)
        g_string_append(csv, ",stage 0,stage 1,stage 2,stage 3");
    else
        g_string_append_printf(csv, ",%s", metrics[a->metric].column);
    if (memory_line)
        g_string_append_printf(csv, ",%s memory", a->hw.gpu);
    /* tflops: which ZeRO-R and ZeRO++ options each best plan uses, after the plotted columns */
    const gboolean options = a->metric == METRIC_TFLOPS;
    for (int stage = 0; stage <= 3 && options; stage++)
        if (by_stage)
            g_string_append_printf(csv, ",stage %d zero-r/zero++", stage);
    if (options && !by_stage)
        g_string_append(csv, ",zero-r/zero++");
    g_string_append_c(csv, '\n');
    for (guint i = 0; i < n; i++) {
        g_string_append_printf(csv, "%.6g", rows[i].x);
        for (int stage = 0; stage <= 3; stage++)
            if (by_stage || stage == (int)rows[i].x)
                format_cell(csv, rows[i].stage[stage]);
        if (memory_line)
            format_cell(csv, a->hw.gpu_memory_bytes / GB);
        for (int stage = 0; stage <= 3 && options; stage++)
            if (by_stage || stage == (int)rows[i].x)
                g_string_append_printf(csv, ",%s", rows[i].options[stage] ? rows[i].options[stage] : "");
        g_string_append_c(csv, '\n');
    }
    return g_string_free(csv, FALSE);
}

/* A gnuplot single-quoted string: only the quote itself needs escaping (doubled). */
static char *gnuplot_quote(const char *text)
{
    char **parts = g_strsplit(text, "'", -1);
    char *joined = g_strjoinv("''", parts);
    char *quoted = g_strdup_printf("'%s'", joined);
    g_strfreev(parts);
    g_free(joined);
    return quoted;
}

/* A gnuplot double-quoted string, for text with a line break ("\n" there). */
static char *gnuplot_dquote(const char *text)
{
    GString *out = g_string_new("\"");
    for (const char *c = text; *c; c++) {
        if (*c == '\n')
            g_string_append(out, "\\n");
        else if (*c == '"' || *c == '\\')
            g_string_append_printf(out, "\\%c", *c);
        else
            g_string_append_c(out, *c);
    }
    g_string_append_c(out, '"');
    return g_string_free(out, FALSE);
}

/* The second line of the title: what the sweep holds fixed (or searches). */
static char *plot_assumptions(const SweepArgs *a)
{
    GString *s = g_string_new(NULL);
    if (a->vary != VARY_GPUS)
        g_string_append_printf(s, "%d GPUs, ", a->gpus);
    if (a->metric == METRIC_TFLOPS) {
        if (a->micro_batch > 0 && a->vary != VARY_MICRO_BATCH)
            g_string_append_printf(s, "micro-batch %d, ", a->micro_batch);
        else if (a->vary != VARY_MICRO_BATCH)
            g_string_append(s, "micro-batch searched, ");
        g_string_append_printf(s, "checkpointing searched, sequence %" G_GINT64_FORMAT ", %s",
                               a->model.seq_len, a->mp > 0 ? "" : "TP searched, ");
        if (a->mp > 0)
            g_string_append_printf(s, "MP %d, ", a->mp);
        if (a->global_batch > 0)
            g_string_append_printf(s, "global batch %" G_GINT64_FORMAT ", ", a->global_batch);
        else
            g_string_append(s, "no accumulation, ");
    } else if (a->metric == METRIC_MEMORY && zp_model_has_architecture(&a->model) &&
               a->vary != VARY_PARAMS) {
        if (a->vary != VARY_MICRO_BATCH)
            g_string_append_printf(s, "micro-batch %d, ", a->micro_batch);
        g_string_append_printf(s, "%s, sequence %" G_GINT64_FORMAT ", MP %d, ",
                               a->checkpoint ? "checkpointing every block" : "no checkpointing",
                               a->model.seq_len, a->mp);
    } else {
        g_string_append_printf(s, "model states only, MP %d, ", a->mp);
    }
    g_string_append_printf(s, "%s + %s", zp_precision_name(a->precision),
                           zp_optimizer_name(a->optimizer));
    /* Wrapped at the commas so that a long list stays inside the plot's width. */
    GString *wrapped = g_string_new(NULL);
    char **parts = g_strsplit(s->str, ", ", -1);
    size_t line = 0;
    for (char **part = parts; *part; part++) {
        const size_t n = strlen(*part);
        if (part != parts) {
            g_string_append(wrapped, line + n + 2 > 60 ? ",\n" : ", ");
            line = line + n + 2 > 60 ? 0 : line + 2;
        }
        g_string_append(wrapped, *part);
        line += n;
    }
    g_strfreev(parts);
    g_string_free(s, TRUE);
    return g_string_free(wrapped, FALSE);
}

static char *plot_title(const SweepArgs *a)
{
    const char *model = a->vary == VARY_PARAMS ? "varying size" : a->model.name;
    const char *where = a->have_hw ? a->hw.name : "any GPU";
    switch (a->metric) {
    case METRIC_TFLOPS:
        return g_strdup_printf("%s on %s: model TFLOP/s per GPU of the best plan", model, where);
    case METRIC_MEMORY:
        return g_strdup_printf("%s: %s per GPU by ZeRO stage", model,
                               zp_model_has_architecture(&a->model) && a->vary != VARY_PARAMS
                                   ? "memory (states + activations + buffers)"
                                   : "model-state memory");
    case METRIC_MAXMODEL:
        return g_strdup_printf("largest model whose states fit, %s (%.0f GB less reserve)", where,
                               a->hw.gpu_memory_bytes / GB);
    case METRIC_N:
        break;
    }
    return g_strdup("");
}

/* gnuplot reads the CSV at csv_path and draws to plot_path, both in zplan's own temporary
 * folder `dir`: what lies at PREFIX.csv and PREFIX.svg (a FIFO, a link) is written once, by
 * zp_out_write, after the plot succeeded. */
static gboolean draw_plot(const SweepArgs *a, const char *dir, const char *csv_path,
                          const char *plot_path, guint columns, GError **error)
{
    char *q_out = gnuplot_quote(plot_path), *q_csv = gnuplot_quote(csv_path);
    char *first = plot_title(a), *assumptions = plot_assumptions(a);
    char *title = g_strdup_printf("%s\n(%s)", first, assumptions);
    char *q_title = gnuplot_dquote(title);
    g_free(first), g_free(assumptions);
    char *q_x = gnuplot_quote(varies[a->vary].label);
    char *q_y = gnuplot_quote(metrics[a->metric].label);
    GString *script = g_string_new(NULL);
    if (a->png) /* pngcairo where gnuplot has it, else libgd's png */
        g_string_append(script,
                        "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                        "  set terminal pngcairo size 1000,600 enhanced font 'sans,11' "
                        "background rgb 'white'\n"
                        "} else {\n  set terminal png size 1000,600 background rgb 'white'\n}\n");
    else
        g_string_append(script, "set terminal svg size 900,540 dynamic enhanced font 'sans,12' "
                                "background rgb 'white'\n");
    g_string_append_printf(script,
                           "set output %s\n"
                           "set datafile separator ','\nset title %s noenhanced\n"
                           "set xlabel %s\nset ylabel %s\nset grid\nset key outside right\n",
                           q_out, q_title, q_x, q_y);
    /* Memory above the GPU's is shaded: the stages there do not fit. */
    if (a->metric == METRIC_MEMORY && a->have_hw)
        g_string_append_printf(script,
                               "set object 1 rectangle from graph 0, first %g to graph 1, graph 1 "
                               "behind fillcolor rgb '#f6d5d5' fillstyle solid 1.0 noborder\n"
                               "set label 1 'shaded: does not fit in %s (%.1f GB)' at graph 0.02, "
                               "graph 0.95 textcolor rgb '#a02020' noenhanced\n"
                               "set linetype 5 lc rgb '#a02020' lw 2 dt 2 pt 0\n",
                               a->hw.gpu_memory_bytes / GB, a->hw.gpu,
                               a->hw.gpu_memory_bytes / GB);
    if (varies[a->vary].log_x && a->vary != VARY_STAGE)
        g_string_append(script, "set logscale x 2\n");
    if (metrics[a->metric].log_y)
        g_string_append(script, "set logscale y 10\n");
    if (a->vary == VARY_STAGE)
        g_string_append(script, "set xrange [-0.5:3.5]\nset xtics ('0 (baseline)' 0, "
                                "'1 (P_{os})' 1, '2 (P_{os+g})' 2, '3 (P_{os+g+p})' 3)\n");
    /* A stage without a plan that fits keeps its colour as a cross on the axis instead of
     * vanishing (tflops: an empty cell), the stages side by side; the memory series show
     * theirs above the shading. */
    const gboolean crosses = a->metric == METRIC_TFLOPS;
    if (a->vary == VARY_STAGE) {
        g_string_append_printf(script, "plot %s using 1:2 with linespoints lt 1 lw 2 pt 7 title %s",
                               q_csv, q_y);
        if (crosses)
            g_string_append_printf(script, ", %s using 1:(valid(2) ? 1/0 : 0) with points lt 1 "
                                           "pt 2 ps 2.5 lw 3 title 'no plan fits'", q_csv);
    } else {
        g_string_append_printf(script,
                               "plot for [i=2:%u] %s using 1:i with linespoints lt (i-1) lw 2 "
                               "pt 7 title columnheader(i)",
                               columns, q_csv);
        if (crosses)
            g_string_append_printf(script,
                                   ", for [i=2:5] %s using ($1 * %s):(valid(i) ? 1/0 : 0) with "
                                   "points lt (i-1) pt 2 ps 2.5 lw 3 "
                                   "title sprintf('stage %%d: no plan fits', i - 2)",
                                   q_csv, varies[a->vary].log_x ? "2**((i - 3.5) * 0.06)" : "1");
    }
    g_string_append_c(script, '\n');
    char *script_path = g_build_filename(dir, "plot.gp", NULL);
    gboolean ok = zp_out_write(script_path, script->str, script->len, error);
    int status = 0;
    char *err = NULL;
    if (ok) {
        char *argv[] = {"gnuplot", script_path, NULL};
        ok = g_spawn_sync(NULL, argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL,
                          NULL, NULL, NULL, &err, &status, error);
        if (!ok)
            g_prefix_error(error, "gnuplot: ");
    }
    if (ok && !g_spawn_check_wait_status(status, NULL)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "gnuplot failed: %s", err ? g_strstrip(err) : "");
        ok = FALSE;
    }
    g_remove(script_path);
    g_free(err);
    g_free(script_path);
    g_string_free(script, TRUE);
    g_free(q_x), g_free(q_y), g_free(title), g_free(q_title), g_free(q_csv), g_free(q_out);
    return ok;
}

/* The CSV and the plot come as a pair: both are made in a temporary folder first, and a failed
 * plot writes neither; a plot that cannot be written takes a CSV file written before it along. */
static gboolean write_outputs(const SweepArgs *a, const char *csv_text, guint columns,
                              GError **error)
{
    char *dir = g_dir_make_tmp("zplan-sweep-XXXXXX", error);
    if (!dir)
        return FALSE;
    char *tmp_csv = g_build_filename(dir, "data.csv", NULL);
    char *tmp_plot = g_build_filename(dir, a->png ? "plot.png" : "plot.svg", NULL);
    char *csv_path = g_strconcat(a->out, ".csv", NULL);
    char *plot_path = g_strconcat(a->out, a->png ? ".png" : ".svg", NULL);
    char *plot = NULL;
    gsize plot_bytes = 0;
    gboolean ok = zp_out_write(tmp_csv, csv_text, strlen(csv_text), error) &&
                  draw_plot(a, dir, tmp_csv, tmp_plot, columns, error) &&
                  g_file_get_contents(tmp_plot, &plot, &plot_bytes, error) &&
                  zp_out_write(csv_path, csv_text, strlen(csv_text), error);
    if (ok && !zp_out_write(plot_path, plot, plot_bytes, error)) {
        ZpOutKind kind;
        char *target = NULL;
        if (zp_out_resolve(csv_path, &kind, &target, NULL) && kind == ZP_OUT_FILE)
            g_remove(target);
        g_free(target);
        ok = FALSE;
    }
    g_remove(tmp_csv);
    g_remove(tmp_plot);
    g_rmdir(dir);
    g_free(plot);
    g_free(csv_path), g_free(plot_path), g_free(tmp_csv), g_free(tmp_plot), g_free(dir);
    return ok;
}

static gboolean run_sweep(const SweepArgs *a, GError **error)
{
    const guint n = a->values->len;
    SweepRow *rows = g_new0(SweepRow, n);
    gboolean ok = TRUE;
    CliProgress *progress = cli_progress_new("zplan sweep");
    for (guint i = 0; ok && i < n; i++) {
        rows[i].x = g_array_index(a->values, double, i);
        ok = row_fns[a->metric](a, rows[i].x, &rows[i], error);
        if (!ok)
            g_prefix_error(error, "--values: at %s = %g: ", varies[a->vary].name, rows[i].x);
        else
            cli_progress_update((double)(i + 1) / n, progress);
    }
    cli_progress_free(progress);
    if (a->vary == VARY_PARAMS)
        for (guint i = 0; i < n; i++)
            rows[i].x /= 1e9;
    const guint columns = a->vary == VARY_STAGE ? 2
                          : (a->metric == METRIC_MEMORY && a->have_hw) ? 6 : 5;
    if (ok) {
        char *text = csv_text(a, rows, n);
        ok = write_outputs(a, text, columns, error);
        g_free(text);
    }
    for (guint i = 0; i < n; i++)
        for (int stage = 0; stage <= 3; stage++)
            g_free(rows[i].options[stage]);
    g_free(rows);
    return ok;
}

/* ---- flags ----------------------------------------------------------------------------- */

typedef struct {
    char *vary, *values, *model, *params, *cluster, *gpu_memory, *metric, *out, *gpus, *mp;
    char *micro_batch, *global_batch, *precision, *optimizer, *seq, *attention, *reduce;
    char *kernels;
} SweepFlags;

static const char *const vary_names[] = {"gpus", "params", "micro-batch", "stage", NULL};
static const char *const metric_names[] = {"tflops", "memory", "maxmodel", NULL};

/* Which metric can vary what: a simulated step needs an architecture (so not --params), and
 * the largest model does not depend on the size or the micro-batch. */
static const char *combination_error(SweepVary vary, SweepMetric metric)
{
    if (metric == METRIC_TFLOPS && vary == VARY_PARAMS)
        return "--vary params: tflops simulates steps, which needs --model (an architecture)";
    if (metric == METRIC_MAXMODEL && (vary == VARY_PARAMS || vary == VARY_MICRO_BATCH))
        return "--metric maxmodel: the largest model depends only on GPUs and stage; "
               "vary gpus or stage";
    return NULL;
}

/* Values one sweep takes: each is a row of the CSV and a point of the plot, and --metric tflops
 * runs a plan search at each (0.1-0.2 s apiece: 1,000 values took 139 s), so a longer list is
 * refused before any work; a finer sweep is several. */
#define SWEEP_MAX_VALUES 200

static GArray *parse_values(const SweepFlags *f, SweepVary vary, GError **error)
{
    static const double ranges[VARY_N][2] = {
        [VARY_GPUS] = {1, CLI_MAX_GPUS}, [VARY_PARAMS] = {1, CLI_MAX_PARAMS},
        [VARY_MICRO_BATCH] = {1, 1e6}, [VARY_STAGE] = {0, 3},
    };
    GArray *values = g_array_new(FALSE, FALSE, sizeof(double));
    char **parts = g_strsplit(f->values, ",", -1);
    const guint n = g_strv_length(parts);
    gboolean ok = n > 0 && n <= SWEEP_MAX_VALUES;
    if (n == 0)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--values: empty list");
    else if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--values: %u values, past the cap of %d a sweep (SWEEP_MAX_VALUES)", n,
                    SWEEP_MAX_VALUES);
    for (char **p = parts; ok && *p; p++) {
        double v;
        ok = zp_parse_size(g_strstrip(*p), "--values", ZP_SIZE_COUNT, ranges[vary][0],
                           ranges[vary][1], vary != VARY_PARAMS, &v, error);
        if (ok)
            g_array_append_val(values, v);
    }
    g_strfreev(parts);
    if (!ok) {
        g_array_unref(values);
        return NULL;
    }
    return values;
}

static gboolean parse_flags(const SweepFlags *f, SweepArgs *a, GError **error)
{
    const char *missing = !f->vary ? "--vary gpus|params|micro-batch|stage"
                          : !f->values ? "--values A,B,C"
                          : !f->out ? "--out PREFIX" : NULL;
    if (missing) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s is required", missing);
        return FALSE;
    }
    int vary, metric;
    if (!zp_parse_choice(f->vary, "--vary", vary_names, &vary, error) ||
        !zp_parse_choice(f->metric ? f->metric : "tflops", "--metric", metric_names, &metric,
                         error))
        return FALSE;
    a->vary = (SweepVary)vary;
    a->metric = (SweepMetric)metric;
    const char *bad = combination_error(a->vary, a->metric);
    if (!bad && a->vary == VARY_PARAMS && (f->model || f->params))
        bad = "--vary params: the sizes come from --values; give neither --model nor --params";
    if (!bad && a->vary != VARY_PARAMS && a->metric != METRIC_MAXMODEL && !f->model && !f->params)
        bad = "give exactly one of --model NAME|PATH.json and --params P";
    if (!bad && a->vary != VARY_GPUS && !f->gpus)
        bad = "--gpus N is required unless --vary gpus";
    if (!bad && a->vary == VARY_GPUS && f->gpus)
        bad = "--gpus: the GPU counts come from --values";
    if (!bad && a->metric == METRIC_TFLOPS && !f->cluster)
        bad = "--metric tflops: give --cluster NAME|PATH.json (the hardware to simulate)";
    /* The search's own inputs, which memory and maxmodel would drop in silence */
    if (!bad && a->metric != METRIC_TFLOPS && f->global_batch)
        bad = "--global-batch: the tflops metric's search takes it; memory and maxmodel size "
              "one micro-batch";
    if (!bad && a->metric != METRIC_TFLOPS && f->kernels)
        bad = "--kernels: the tflops metric's simulation prices kernels; memory and maxmodel "
              "time nothing";
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
        return FALSE;
    }
    /* The plot needs gnuplot: without it nothing is computed or written. */
    char *gnuplot = g_find_program_in_path("gnuplot");
    g_free(gnuplot);
    if (!gnuplot) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "--out: PREFIX.svg needs gnuplot, which is "
                                                  "not on PATH (Debian: gnuplot-nox)");
        return FALSE;
    }
    /* "--out /" or "--out dir/" would write /.csv and /.svg: a prefix needs a name. */
    if (!*f->out || g_str_has_suffix(f->out, G_DIR_SEPARATOR_S)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--out: '%s' has no file name; give DIR/NAME for NAME.csv and NAME.%s",
                    f->out, a->png ? "png" : "svg");
        return FALSE;
    }
    char *csv = g_strconcat(f->out, ".csv", NULL);
    char *plot = g_strconcat(f->out, a->png ? ".png" : ".svg", NULL);
    const gboolean writable =
        zp_check_out_path(csv, "--out", error) && zp_check_out_path(plot, "--out", error);
    g_free(csv);
    g_free(plot);
    if (!writable)
        return FALSE;
    int batch = 0;
    a->have_model = f->model != NULL;
    if (f->model || f->params) {
        if (!cli_model(f->model, f->params, &a->model, error) || !cli_seq(f->seq, &a->model, error))
            return FALSE;
    } else {
        zp_model_from_params(1, &a->model);
    }
    if (!(cli_cluster(f->cluster, f->gpu_memory, a->metric == METRIC_MAXMODEL, &a->hw,
                      &a->have_hw, error) &&
          cli_int(f->gpus, "--gpus", 1, CLI_MAX_GPUS, 1, &a->gpus, error) &&
          cli_int(f->mp, "--mp", 1, 65536, a->metric == METRIC_TFLOPS ? 0 : 1, &a->mp, error) &&
          cli_int(f->micro_batch, "--micro-batch", 1, 1e6, a->metric == METRIC_TFLOPS ? 0 : 1,
                  &a->micro_batch, error) &&
          cli_int(f->global_batch, "--global-batch", 1, 1 << 24, 0, &batch, error) &&
          cli_precision_optimizer(f->precision, f->optimizer, &a->model, a->have_hw ? &a->hw : NULL,
                                  &a->precision, &a->optimizer,
                                  error) &&
          cli_attention_reduce(f->attention, f->reduce, a->have_hw ? &a->hw : NULL,
                               a->precision, &a->kernels, error) &&
          cli_kernels(f->kernels, &a->kernels, error) &&
          (a->values = parse_values(f, a->vary, error)) != NULL))
        return FALSE;
    a->global_batch = batch;
    a->out = f->out;
    return TRUE;
}

int cli_sweep(int argc, char **argv)
{
    SweepFlags f = {0};
    SweepArgs a = {0};
    GOptionEntry entries[] = {
        {"vary", 0, 0, G_OPTION_ARG_STRING, &f.vary, "What varies: gpus, params, micro-batch or stage (required)", "WHAT"},
        {"values", 0, 0, G_OPTION_ARG_STRING, &f.values, "Its values, comma-separated (required; params take 7B, 175B, 1T)", "A,B,C"},
        {"model", 0, 0, G_OPTION_ARG_STRING, &f.model, "Model name in models/ or a PATH.json", "M"},
        {"params", 0, 0, G_OPTION_ARG_STRING, &f.params, "Parameter count instead of a model (memory; 7B, 1.5e9, 1T)", "P"},
        {"cluster", 0, 0, G_OPTION_ARG_STRING, &f.cluster, "Hardware profile (tflops, maxmodel; memory adds its reserve)", "C"},
        {"gpu-memory", 0, 0, G_OPTION_ARG_STRING, &f.gpu_memory, "GPU memory instead of a cluster (maxmodel; 80GB, 80GiB)", "BYTES"},
        {"metric", 0, 0, G_OPTION_ARG_STRING, &f.metric, "tflops (default: best plan's model TFLOP/s per GPU, per stage), memory (per GPU, per stage) or maxmodel (largest model whose states fit, per stage)", "M"},
        {"out", 0, 0, G_OPTION_ARG_FILENAME, &f.out, "Write PREFIX.csv and PREFIX.svg or .png (required)", "PREFIX"},
        {"gpus", 0, 0, G_OPTION_ARG_STRING, &f.gpus, "GPU count when it does not vary", "N"},
        {"mp", 0, 0, G_OPTION_ARG_STRING, &f.mp, "Tensor-parallel degree (default 1; tflops: searched)", "M"},
        {"micro-batch", 0, 0, G_OPTION_ARG_STRING, &f.micro_batch, "Micro-batch (default 1; tflops: searched)", "B"},
        {"global-batch", 0, 0, G_OPTION_ARG_STRING, &f.global_batch, "Global batch for tflops (default: free)", "B"},
        {"checkpoint", 0, 0, G_OPTION_ARG_NONE, &a.checkpoint, "memory: with activation checkpointing", NULL},
        {"png", 0, 0, G_OPTION_ARG_NONE, &a.png, "Plot to PREFIX.png instead of PREFIX.svg", NULL},
        CLI_SEQ_ENTRY(&f.seq),
        {"precision", 0, 0, G_OPTION_ARG_STRING, &f.precision, "fp16, bf16 or fp32 (default: the model's torch_dtype where the GPU has it, else fp16)", "P"},
        {"optimizer", 0, 0, G_OPTION_ARG_STRING, &f.optimizer, "adam (default), sgd-momentum, sgd or adam-8bit", "O"},
        {"attention", 0, 0, G_OPTION_ARG_STRING, &f.attention, "eager or a fused kernel (flash, mem-efficient, or a name in --cluster's attention table; default: PyTorch SDPA's choice for the dtype on --cluster, mem-efficient in fp32; without one flash2, eager in fp32)", "K"},
        {"kernels", 0, 0, G_OPTION_ARG_STRING, &f.kernels, "tflops: the kernel inventory a GPU profile's kernel_rates price: eager, megatron or deepspeed (default: deepspeed, as sweep plans DeepSpeed's ZeRO)", "NAME"},
        {"reduce-dtype", 0, 0, G_OPTION_ARG_STRING, &f.reduce, "Gradient reduction dtype fp32, bf16 or fp16 (default: the gradients')", "D"},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("- a metric per ZeRO stage against one input");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Writes PREFIX.csv (one row per value, one column per stage) and PREFIX.svg (gnuplot).\n"
        "memory is model states per GPU (Table 1) with --params, and adds activations, buffers\n"
        "and the reserve when --model gives an architecture; maxmodel budgets GPU memory less\n"
        "the runtime reserve; tflops runs `zplan plan`'s search at each value.");
    GError *error = NULL;
    const gboolean ok = cli_parse(context, &argc, &argv, &error) && parse_flags(&f, &a, &error) &&
                        run_sweep(&a, &error);
    if (ok)
        cli_print_defaults();
    const int status = ok ? 0 : cli_fail("sweep", error);
    if (a.values)
        g_array_unref(a.values);
    g_option_context_free(context);
    g_free(f.vary), g_free(f.values), g_free(f.model), g_free(f.params), g_free(f.cluster);
    g_free(f.gpu_memory), g_free(f.metric), g_free(f.out), g_free(f.gpus), g_free(f.mp);
    g_free(f.micro_batch), g_free(f.global_batch), g_free(f.precision), g_free(f.optimizer);
    g_free(f.seq), g_free(f.attention), g_free(f.reduce), g_free(f.kernels);
    return status;
}
