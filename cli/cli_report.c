/* cli_report: `zplan report ... --html OUT.html` (and `simulate --html`), one self-contained
 * page of a simulated step to look at: the verdict, the reported rank's memory over the step
 * stacked by category under the GPU's line, its streams as a Gantt chart, time by op class and
 * bytes by group, each an inline SVG (no script, no network). */
#include "cli_report.h"
#include "cli.h"

#include "zp_outpath.h"
#include "zp_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define WIDTH 960.0
#define LEFT 110.0 /* room for the axis labels */
#define GB 1e9

/* One colour per memory category and per op class (ColorBrewer's Set3 and Dark2, cycled). */
static const char *const palette[] = {"#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3",
                                      "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5",
                                      "#ffed6f", "#1b9e77", "#d95f02", "#7570b3"};
#define COLOUR(i) palette[(i) % G_N_ELEMENTS(palette)]

static void escape(GString *out, const char *text)
{
    char *e = g_markup_escape_text(text, -1);
    g_string_append(out, e);
    g_free(e);
}

static double x_of(double t_s, double end_s)
{
    return LEFT + (WIDTH - LEFT - 10) * (end_s > 0 ? t_s / end_s : 0);
}

/* The rank the page draws: the reported one, its row of the timeline and its pipeline
 * stage. A pipeline's schedule holds every stage's ops and a rank runs its own stage's only;
 * the others' have no times in its row. */
typedef struct {
    const double *start_s, *end_s;
    uint32_t stage;
    const double *state_bytes; /* held all step: its stage's */
} Drawn;

static gboolean drawn_rank(const ZpSchedule *s, const SimResult *r, Drawn *d)
{
    size_t base = 0;
    if (!sim_result_timeline_row(r, (uint32_t)r->report_rank, &base))
        return FALSE;
    d->start_s = r->op_start_s + base;
    d->end_s = r->op_end_s + base;
    d->stage = sim_result_rank_stage(r, (uint32_t)r->report_rank, s->plan.mp);
    d->state_bytes = r->stages > 1 && s->stage_state_bytes
                         ? &s->stage_state_bytes[d->stage * ZP_MEM_N]
                         : s->state_bytes;
    return TRUE;
}

/* An op the drawn rank runs (its stage's) and draws on a stream's row. */
static gboolean drawn_on_stream(const ZpOp *op, const Drawn *d)
{
    return op->stage == d->stage && op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE &&
           op->stream < ZP_STREAM_N;
}

/* Live bytes per category after each alloc or free of the reported rank, in time order
 * (ops start in list order within a rank's walk; equal times keep list order). */
typedef struct {
    double t_s;
    double live[ZP_MEM_N];
} MemPoint;

static gint by_time(gconstpointer a, gconstpointer b, gpointer data)
{
    const double *start = data;
    const double x = start[*(const guint *)a], y = start[*(const guint *)b];
    return (x > y) - (x < y);
}

static GArray *memory_points(const ZpSchedule *s, const Drawn *d)
{
    const double *start = d->start_s;
    GArray *order = g_array_new(FALSE, FALSE, sizeof(guint));
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if ((op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE) && op->stage == d->stage)
            g_array_append_val(order, i);
    }
    g_array_sort_with_data(order, by_time, (gpointer)start);
    GArray *points = g_array_new(FALSE, FALSE, sizeof(MemPoint));
    MemPoint p = {0};
    memcpy(p.live, d->state_bytes, sizeof p.live);
    g_array_append_val(points, p);
    for (guint k = 0; k < order->len; k++) {
        const guint i = g_array_index(order, guint, k);
        const ZpOp *op = zp_sched_op(s, i);
        p.t_s = start[i];
        p.live[op->sub] += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
        g_array_append_val(points, p);
    }
    g_array_unref(order);
    return points;
}

static void svg_open(GString *out, const char *title, double height)
{
    g_string_append_printf(out, "<h2>");
    escape(out, title);
    g_string_append_printf(out, "</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
                                "height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
                           WIDTH, height);
}

/* Stacked areas, one polygon per category (its band between the sum below and the sum with
 * it), the GPU's capacity as a red line. */
static void memory_svg(GString *out, const ZpSchedule *s, const SimResult *r, const Drawn *d,
                       const ZpHw *hw)
{
    GArray *pts = memory_points(s, d);
    const double H = 260, end = r->step_time_s;
    double top = hw->gpu_memory_bytes;
    for (guint k = 0; k < pts->len; k++) {
        double sum = 0;
        for (int c = 0; c < ZP_MEM_N; c++)
            sum += g_array_index(pts, MemPoint, k).live[c];
        top = fmax(top, sum);
    }
    top *= 1.05;
    svg_open(out, "Memory of the reported rank over the step, stacked by category", H + 60);
    /* A band's lower edge runs back from the step's end: its points, written in reverse
     * (prepending each to a string was quadratic: Megatron 1T's 130,000 points took minutes). */
    double *lower_xy = g_new(double, 4 * (gsize)pts->len);
    for (int c = 0; c < ZP_MEM_N; c++) {
        GString *upper = g_string_new(NULL), *lower = g_string_new(NULL);
        for (guint k = 0; k < pts->len; k++) {
            const MemPoint *p = &g_array_index(pts, MemPoint, k);
            const double t1 = k + 1 < pts->len ? g_array_index(pts, MemPoint, k + 1).t_s : end;
            double below = 0;
            for (int d = 0; d < c; d++)
                below += p->live[d];
            const double y0 = 10 + H * (1 - below / top), y1 = 10 + H * (1 - (below + p->live[c]) / top);
            g_string_append_printf(upper, "%.1f,%.1f %.1f,%.1f ", x_of(p->t_s, end), y1,
                                   x_of(t1, end), y1);
            double *xy = &lower_xy[4 * (gsize)k];
            xy[0] = x_of(t1, end), xy[1] = y0, xy[2] = x_of(p->t_s, end), xy[3] = y0;
        }
        for (guint k = pts->len; k-- > 0;) {
            const double *xy = &lower_xy[4 * (gsize)k];
            g_string_append_printf(lower, "%.1f,%.1f %.1f,%.1f ", xy[0], xy[1], xy[2], xy[3]);
        }
        g_string_append_printf(out, "<polygon fill=\"%s\" stroke=\"none\" points=\"%s%s\"><title>%s"
                                    "</title></polygon>\n",
                               COLOUR(c), upper->str, lower->str, zp_sched_mem_name(c));
        g_string_free(upper, TRUE), g_string_free(lower, TRUE);
    }
    g_free(lower_xy);
    const double cap_y = 10 + H * (1 - hw->gpu_memory_bytes / top);
    g_string_append_printf(out, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" "
                                "stroke=\"#d00\" stroke-width=\"2\"/><text x=\"%.0f\" y=\"%.1f\" "
                                "fill=\"#d00\">GPU %.1f GB</text>\n",
                           LEFT, cap_y, WIDTH - 10, cap_y, LEFT + 4, cap_y - 4,
                           hw->gpu_memory_bytes / GB);
    g_string_append_printf(out, "<text x=\"4\" y=\"20\">%.0f GB</text><text x=\"4\" y=\"%.0f\">0"
                                "</text><text x=\"%.0f\" y=\"%.0f\">%.3f s</text>\n",
                           top / GB, 10 + H, WIDTH - 70, H + 28, end);
    /* The legend names the categories that hold bytes at some point of the step: a category
     * that stays at zero has no band to point at (a dense model's ep_buffers, a plan without
     * ZeRO++'s secondary_params). */
    int shown = 0;
    for (int c = 0; c < ZP_MEM_N; c++) {
        gboolean held = FALSE;
        for (guint k = 0; k < pts->len && !held; k++)
            held = g_array_index(pts, MemPoint, k).live[c] > 0;
        if (!held)
            continue;
        g_string_append_printf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" "
                                    "fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                               LEFT + (shown % 7) * 120.0, H + 32 + (shown / 7) * 14.0, COLOUR(c),
                               LEFT + 14 + (shown % 7) * 120.0, H + 41 + (shown / 7) * 14.0,
                               zp_sched_mem_name(c));
        shown++;
    }
    g_string_append(out, "</svg>\n");
    g_array_unref(pts);
}

/* An op's name on the chart: its compute, collective or transfer kind. */
static const char *op_name(const ZpOp *op)
{
    return op->kind == ZP_OP_COMPUTE      ? zp_sched_compute_name(op->sub)
           : op->kind == ZP_OP_COLLECTIVE ? zp_sched_coll_name(op->sub)
           : op->kind == ZP_OP_TRANSFER   ? zp_sched_transfer_name(op->sub)
                                          : zp_sched_op_kind_name(op->kind);
}

/* Where `name` is in `names` (names->len when it is not). */
static guint name_index(const GPtrArray *names, const char *name)
{
    guint k = 0;
    while (k < names->len && strcmp(g_ptr_array_index(names, k), name) != 0)
        k++;
    return k;
}

/* One row per stream that holds an op, a bar per op of the reported rank, and a legend of
 * the op names shown. */
static void gantt_svg(GString *out, const ZpSchedule *s, const SimResult *r, const Drawn *d)
{
    const double *start = d->start_s, *stop = d->end_s;
    gboolean used[ZP_STREAM_N] = {FALSE};
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (drawn_on_stream(op, d))
            used[op->stream] = TRUE;
    }
    int row[ZP_STREAM_N], rows = 0;
    for (int k = 0; k < ZP_STREAM_N; k++)
        row[k] = used[k] ? rows++ : -1;
    /* The legend: each op name the chart shows, once, in order of first appearance, its
     * colour the name's place in that list (distinct up to the palette's size). */
    GPtrArray *names = g_ptr_array_new();
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (drawn_on_stream(op, d) && name_index(names, op_name(op)) == names->len)
            g_ptr_array_add(names, (gpointer)op_name(op));
    }
    const double band = 26, legend_y = rows * band + 34;
    const int legend_rows = (int)(names->len + 6) / 7;
    svg_open(out, "The streams of one step (the reported rank)",
             legend_y + legend_rows * 14.0 + 6);
    for (int k = 0; k < ZP_STREAM_N; k++)
        if (row[k] >= 0)
            g_string_append_printf(out, "<text x=\"4\" y=\"%.0f\">%s</text>\n",
                                   18 + row[k] * band, zp_sched_stream_name(k));
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (!drawn_on_stream(op, d))
            continue;
        const double x0 = x_of(start[i], r->step_time_s), x1 = x_of(stop[i], r->step_time_s);
        const char *name = op_name(op);
        g_string_append_printf(out, "<rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"18\" "
                                    "fill=\"%s\"><title>%s %.6f-%.6f s</title></rect>\n",
                               x0, 6 + row[op->stream] * band, fmax(x1 - x0, 0.3),
                               COLOUR(name_index(names, name)), name, start[i], stop[i]);
    }
    g_string_append_printf(out, "<text x=\"%.0f\" y=\"%.0f\">%.3f s</text>\n", WIDTH - 70,
                           rows * band + 20, r->step_time_s);
    for (guint k = 0; k < names->len; k++)
        g_string_append_printf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" "
                                    "fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                               LEFT + (k % 7) * 120.0, legend_y + (k / 7) * 14.0,
                               COLOUR(k), LEFT + 14 + (k % 7) * 120.0,
                               legend_y + 9 + (k / 7) * 14.0,
                               (const char *)g_ptr_array_index(names, k));
    g_string_append(out, "</svg>\n");
    g_ptr_array_unref(names);
}

/* Horizontal bars, one per (label, value). */
static void bars_svg(GString *out, const char *title, const char *const *labels,
                     const double *values, int n, const char *unit, double scale)
{
    double most = 0;
    for (int i = 0; i < n; i++)
        most = fmax(most, values[i]);
    svg_open(out, title, n * 24 + 16);
    for (int i = 0; i < n; i++) {
        const double w = most > 0 ? (WIDTH - LEFT - 140) * values[i] / most : 0;
        g_string_append_printf(out, "<text x=\"4\" y=\"%d\">%s</text><rect x=\"%.0f\" y=\"%d\" "
                                    "width=\"%.1f\" height=\"16\" fill=\"%s\"/><text x=\"%.1f\" "
                                    "y=\"%d\">%.4g %s</text>\n",
                               20 + i * 24, labels[i], LEFT, 8 + i * 24, w, COLOUR(i + 3),
                               LEFT + w + 6, 20 + i * 24,
                               fabs(values[i]) < 1e-12 * fmax(most, 1e-300) ? 0.0
                                                                            : values[i] / scale,
                               unit);
    }
    g_string_append(out, "</svg>\n");
}

/* The page's head, title and verdict (the body is left open). */
static GString *page_open(const char *title, const char *verdict)
{
    GString *out = g_string_new("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                                "<title>");
    escape(out, title);
    g_string_append(out, "</title><style>body{font-family:sans-serif;margin:24px;max-width:1000px}"
                         "h2{font-size:16px;margin-top:28px}.verdict{font-size:15px;"
                         "padding:8px;background:#f4f4f4}table{border-collapse:collapse;"
                         "font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;"
                         "text-align:right}td:nth-child(2){text-align:left}</style></head>"
                         "<body>\n<h1>");
    escape(out, title);
    g_string_append(out, "</h1>\n<p class=\"verdict\">");
    escape(out, verdict);
    g_string_append(out, "</p>\n");
    return out;
}

static gboolean page_close(GString *out, const char *path, GError **error)
{
    g_string_append(out, "</body></html>\n");
    const gboolean ok = zp_out_write(path, out->str, out->len, error);
    if (!ok)
        g_prefix_error(error, "--html: ");
    g_string_free(out, TRUE);
    return ok;
}

gboolean cli_report_plans_html(const char *path, const char *title, const char *verdict,
                               const CliReportPlan *plans, int n, double capacity_bytes,
                               GError **error)
{
    GString *out = page_open(title, verdict);
    g_string_append(out, "<h2>The top plans</h2>\n<table><tr><th>#</th><th>plan</th><th>step s"
                         "</th><th>samples/s</th><th>TFLOP/s per GPU</th><th>needs GB</th></tr>\n");
    for (int i = 0; i < n; i++) {
        g_string_append_printf(out, "<tr><td>%d</td><td>", i + 1);
        escape(out, plans[i].what);
        g_string_append_printf(out, "</td><td>%.3f</td><td>%.2f</td><td>", plans[i].step_s,
                               plans[i].samples_per_s);
        if (isnan(plans[i].tflops)) /* no schedule's FLOPs read (a closed-form judgement) */
            g_string_append(out, "n/a");
        else
            g_string_append_printf(out, "%.1f", plans[i].tflops);
        g_string_append_printf(out, "</td><td>%.2f</td></tr>\n", plans[i].need_bytes / GB);
    }
    g_string_append(out, "</table>\n");
    char **labels = g_new0(char *, n + 1);
    double *rate = g_new(double, n), *need = g_new(double, n);
    for (int i = 0; i < n; i++) {
        labels[i] = g_strdup_printf("plan %d", i + 1);
        rate[i] = plans[i].samples_per_s;
        need[i] = plans[i].need_bytes;
    }
    bars_svg(out, "Samples per second", (const char *const *)labels, rate, n, "samples/s", 1);
    bars_svg(out, "Memory each needs per GPU", (const char *const *)labels, need, n, "GB", GB);
    g_string_append_printf(out, "<p>The GPU holds %.1f GB.</p>\n", capacity_bytes / GB);
    g_strfreev(labels);
    g_free(rate), g_free(need);
    return page_close(out, path, error);
}

gboolean cli_report_html(const char *path, const char *title, const char *verdict,
                         const ZpSchedule *s, const SimResult *r, const ZpHw *hw, GError **error)
{
    Drawn drawn;
    if (!drawn_rank(s, r, &drawn)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--html: the step was run without the "
                                                     "reported rank's timeline");
        return FALSE;
    }
    GString *out = page_open(title, verdict);
    memory_svg(out, s, r, &drawn, hw);
    gantt_svg(out, s, r, &drawn);
    const char *const classes[] = {"compute", "exposed comm.", "optimizer",
                                   "CPU optimizer", "offload transfer", "idle"};
    const double times[] = {r->compute_s, r->exposed_comm_s, r->optimizer_s,
                            r->cpu_optimizer_s, r->offload_transfer_s, r->idle_s};
    bars_svg(out, "Time by op class (adds up to the step)", classes, times, G_N_ELEMENTS(times),
             "s", 1);
    /* The groups simulate's text and JSON name: data parallel with its ZeRO++ and expert
     * subgroups (a page that drew the DP group alone showed 30.1 GB of Mixtral-8x7B's 148.5),
     * and a mixture of experts' dispatcher where it has one: the all-to-alls, or the
     * all-gather dispatcher's collectives over TP x EP. */
    const char *groups[] = {"data parallel", "tensor parallel", "pipeline", NULL};
    double bytes[] = {cli_dp_bytes(r->comm_bytes), r->comm_bytes[ZP_GROUP_TP],
                      r->comm_bytes[ZP_GROUP_PP], 0};
    int n_groups = 3;
    const ZpGroup dispatch = r->comm_bytes[ZP_GROUP_EP] > 0 ? ZP_GROUP_EP : ZP_GROUP_TPEP;
    if (r->comm_bytes[dispatch] > 0) {
        groups[n_groups] = dispatch == ZP_GROUP_EP ? "expert all-to-all" : "expert TP x EP gathers";
        bytes[n_groups++] = r->comm_bytes[dispatch];
    }
    bars_svg(out, "Bytes each rank sends, by group", groups, bytes, n_groups, "GB", GB);
    return page_close(out, path, error);
}
