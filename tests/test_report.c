/* test_report: `zplan report ... --html OUT.html` (issue 39 item 8): one self-contained page
 * (inline SVG, no script, nothing fetched) rendered by headless Chromium to a PNG with no
 * console message. Without Chromium (make test's setup installs it) the rendering is skipped
 * with one line; the page's own checks still run. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

static guint count(const char *text, const char *what)
{
    guint n = 0;
    for (const char *at = strstr(text, what); at; at = strstr(at + 1, what))
        n++;
    return n;
}

static void test_html_page(void)
{
    char *dir;
    char *html = tu_tmp_file("report", "step.html", &dir);
    char *args = g_strdup_printf("report --model hf/llama-3-8b --cluster dgx-h100 --gpus 16 "
                                 "--stage 3 --micro-batch 1 --html %s", html);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_true(g_str_has_prefix(r.out, "Fits: the step needs "));
    tu_free(&r);
    char *page = NULL;
    g_assert_true(g_file_get_contents(html, &page, NULL, NULL));
    /* the verdict, the four charts, nothing to fetch or run */
    g_assert_nonnull(strstr(page, "<p class=\"verdict\">Fits: the step needs "));
    g_assert_cmpuint(count(page, "<svg "), ==, 4);
    g_assert_cmpuint(count(page, "</svg>"), ==, 4);
    g_assert_nonnull(strstr(page, "Memory of the reported rank over the step"));
    g_assert_nonnull(strstr(page, ">GPU 85.9 GB</text>"));
    g_assert_nonnull(strstr(page, "The streams of one step"));
    /* the memory chart's legend names the categories that hold bytes, not those that stay
     * at zero (a dense model has no expert buffers, stage 3 without hpZ no secondary copy) */
    const char *mem = strstr(page, "Memory of the reported rank over the step");
    const char *mem_end = strstr(mem, "</svg>");
    char *mem_svg = g_strndup(mem, mem_end - mem);
    g_assert_nonnull(strstr(mem_svg, ">params</text>"));
    g_assert_null(strstr(mem_svg, ">ep_buffers</text>"));
    g_assert_null(strstr(mem_svg, ">secondary_params</text>"));
    g_free(mem_svg);
    /* the Gantt chart's legend names its op kinds (it had none: colours only) */
    const char *gantt = strstr(page, "The streams of one step");
    g_assert_nonnull(strstr(gantt, ">block_fwd</text>"));
    g_assert_nonnull(strstr(gantt, ">reduce_scatter</text>"));
    g_assert_null(strstr(page, "<script"));
    g_assert_cmpuint(count(page, "http"), ==, count(page, "xmlns=\"http://www.w3.org/2000/svg\""));
    g_free(page);
    /* report without --html is refused */
    r = tu_zplan("report --model hf/llama-3-8b --cluster dgx-h100 --gpus 16 --stage 3 "
                 "--micro-batch 1");
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
    g_assert_nonnull(strstr(r.err, "--html OUT.html is required"));
    tu_free(&r);
    char *chromium = g_find_program_in_path("chromium");
    if (!chromium) {
        g_test_skip("chromium is not installed: the page is not rendered (make setup installs it)");
    } else {
        char *png = g_build_filename(dir, "step.png", NULL);
        char *command = g_strdup_printf("%s --headless --no-sandbox --disable-gpu "
                                        "--hide-scrollbars --enable-logging=stderr "
                                        "--window-size=1040,1400 --screenshot=%s file://%s",
                                        chromium, png, html);
        r = tu_run(command, NULL);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        g_assert_null(strstr(r.err, "CONSOLE")); /* no console message of the page's */
        GStatBuf st;
        g_assert_cmpint(g_stat(png, &st), ==, 0);
        g_assert_cmpint(st.st_size, >, 20000); /* a page with charts, not a blank one */
        tu_free(&r);
        g_remove(png);
        g_free(command), g_free(png);
    }
    g_free(chromium);
    tu_tmp_file_remove(html, dir);
    g_free(args);
}

/* plan --html: the top plans side by side, a table row and a bar each, the verdict first. */
static void test_plan_page(void)
{
    char *dir;
    char *html = tu_tmp_file("report", "plans.html", &dir);
    char *args = g_strdup_printf("plan --model hf/llama-3-70b --cluster dgx-h100 --gpus 64 "
                                 "--html %s", html);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    /* the plans the text lists: the rows between the table's header and the blank line */
    const char *table = strstr(r.out, "ZeRO-R/ZeRO++\n");
    g_assert_nonnull(table);
    guint listed = 0;
    for (const char *line = strchr(table, '\n') + 1; *line && *line != '\n' &&
                                                     !g_str_has_prefix(line, "  (");
         line = strchr(line, '\n') + 1)
        listed++;
    g_assert_cmpuint(listed, >=, 2);
    tu_free(&r);
    char *page = NULL;
    g_assert_true(g_file_get_contents(html, &page, NULL, NULL));
    g_assert_nonnull(strstr(page, "<p class=\"verdict\">Fits: plan 1 (stage 3, "));
    g_assert_cmpuint(count(page, "<tr><td>"), ==, listed);
    g_assert_cmpuint(count(page, "<svg "), ==, 2);
    char *last = g_strdup_printf(">plan %u</text>", listed);
    g_assert_cmpuint(count(page, last), ==, 2); /* a bar in each chart */
    g_free(last);
    g_assert_null(strstr(page, "<script"));
    g_free(page);
    tu_tmp_file_remove(html, dir);
    g_free(args);
}

/* A pipeline's page draws the reported rank's own stage: a bar for each of that stage's ops
 * and none of the others' (they have no times in its row: before, 583 bars of 776 sat at 0 s
 * on this plan, and their buffers went into the memory chart), and the chart's highest
 * stack is that stage's peak. */
#define PIPE_PLAN "--model gpt-13b --cluster dgx-a100-80g --gpus 16 --pp 4 --stage 1 " \
                  "--micro-batch 1 --grad-accum 8"

static void test_pipeline_page(void)
{
    char *dir;
    char *html = tu_tmp_file("report", "pipe.html", &dir);
    char *sched_path = g_build_filename(dir, "pipe-schedule.json", NULL);
    json_t *result = tu_zplan_json("simulate " PIPE_PLAN " --json");
    const int pp = (int)json_integer_value(json_object_get(result, "pp"));
    const int mp = (int)json_integer_value(json_object_get(result, "mp"));
    const int dp = (int)json_integer_value(json_object_get(result, "dp"));
    /* report_rank is the world's (Megatron-Core's default order, tp-dp-pp: ZpRankOrder) */
    g_assert_cmpstr(json_string_value(json_object_get(result, "placement")), ==,
                    "tp, dp, pp (tp fastest)");
    const int stage = (int)(zp_rank_of_placed(ZP_ORDER_TP_DP_PP, mp, dp, pp,
                                              json_integer_value(
                                                  json_object_get(result, "report_rank"))) /
                            mp % pp);
    const double stage_peak_bytes = json_real_value(json_object_get(
        json_array_get(json_object_get(result, "stages"), (size_t)stage), "peak_memory_bytes"));
    g_assert_cmpint(pp, ==, 4);
    g_assert_cmpfloat(stage_peak_bytes, >, 1e9);
    char *args = g_strdup_printf("schedule " PIPE_PLAN " --out %s", sched_path);
    tu_zplan_ok(args);
    g_free(args);
    json_t *sched = json_load_file(sched_path, 0, NULL);
    g_assert_nonnull(sched);
    guint drawn = 0;
    size_t i;
    json_t *op;
    json_array_foreach(json_object_get(sched, "ops"), i, op)
    {
        const char *kind = json_string_value(json_object_get(op, "kind"));
        drawn += json_integer_value(json_object_get(op, "stage")) == stage &&
                 strcmp(kind, "alloc") != 0 && strcmp(kind, "free") != 0;
    }
    g_assert_cmpuint(drawn, >, 100);
    args = g_strdup_printf("report " PIPE_PLAN " --html %s", html);
    tu_zplan_ok(args);
    char *page = NULL;
    g_assert_true(g_file_get_contents(html, &page, NULL, NULL));
    const char *gantt = strstr(page, "The streams of one step");
    g_assert_nonnull(gantt);
    char *gantt_svg = g_strndup(gantt, strstr(gantt, "</svg>") - gantt);
    g_assert_cmpuint(count(gantt_svg, "</title></rect>"), ==, drawn);
    /* The memory chart: y = 10 + 260 (1 - bytes / top), top 1.05 x the GPU's memory here
     * (read back from its red line, to 0.1 px); its least y is the stacked peak. */
    const char *mem = strstr(page, "Memory of the reported rank over the step");
    double least_y = G_MAXDOUBLE, cap_y = 0;
    for (const char *at = strstr(mem, "points=\""); at && at < gantt;
         at = strstr(at + 1, "points=\"")) {
        const char *p = at + strlen("points=\"");
        while (*p != '"') {
            double x, y;
            int used = 0;
            g_assert_cmpint(sscanf(p, "%lf,%lf %n", &x, &y, &used), ==, 2);
            least_y = MIN(least_y, y);
            p += used;
        }
    }
    g_assert_cmpint(sscanf(strstr(mem, "<line x1=\"110\" y1=\""), "<line x1=\"110\" y1=\"%lf",
                           &cap_y), ==, 1);
    const double gpu_bytes = 80.0 * 1024 * 1024 * 1024;
    const double top_bytes = gpu_bytes / (1 - (cap_y - 10) / 260);
    const double chart_peak_bytes = top_bytes * (1 - (least_y - 10) / 260);
    g_test_message("stage %d: peak %.4g B, the chart's %.4g B", stage, stage_peak_bytes,
                   chart_peak_bytes);
    g_assert_cmpfloat(fabs(chart_peak_bytes - stage_peak_bytes), <, 0.1e9);
    g_free(gantt_svg);
    g_free(page);
    g_free(args);
    json_decref(sched);
    json_decref(result);
    g_remove(sched_path);
    g_free(sched_path);
    tu_tmp_file_remove(html, dir);
}

/* The page's bytes by group are simulate's: data parallel with ZeRO++'s hpZ and qgZ subgroups
 * and a mixture of experts' expert-data-parallel group (the page drew the DP group's alone:
 * 13.07 GB of Llama-2-7B's 29.68 with ZeRO++, 30.14 GB of Mixtral-8x7B's 148.5), and the
 * experts' all-to-all, which simulate prints apart, as a bar of its own. */
static void test_bytes_agree(void)
{
    static const char *const plans[] = {
        "--model gpt2-1.5b --cluster dgx-h100 --gpus 16 --stage 3 --micro-batch 1 "
        "--quantized-weights --quantized-gradients --hpz-partition-size 8",
        "--model moe-tiny --cluster dgx-h100 --gpus 8 --stage 2 --micro-batch 4 --ep 2",
    };
    for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
        char *dir;
        char *html = tu_tmp_file("report", "bytes.html", &dir);
        char *args = g_strdup_printf("simulate %s --json", plans[i]);
        json_t *sim = tu_zplan_json(args);
        g_free(args);
        json_t *bytes = json_object_get(sim, "comm_bytes_per_rank");
        const double dp = json_number_value(json_object_get(bytes, "dp"));
        const double ep = json_number_value(json_object_get(bytes, "ep"));
        args = g_strdup_printf("report %s --html %s", plans[i], html);
        tu_zplan_ok(args);
        char *page = NULL;
        g_assert_true(g_file_get_contents(html, &page, NULL, NULL));
        g_assert_cmpfloat(dp, >, 0);
        const char *labels[] = {">data parallel</text>", ">expert all-to-all</text>"};
        const double want[] = {dp, ep};
        for (size_t b = 0; b < G_N_ELEMENTS(labels); b++) {
            const char *bar = strstr(page, labels[b]);
            if (want[b] == 0) { /* no all-to-all, no bar */
                g_assert_null(bar);
                continue;
            }
            g_assert_nonnull(bar);
            char *line = g_strndup(bar, strcspn(bar, "\n"));
            char *value = g_strdup_printf(">%.4g GB</text>", want[b] / 1e9);
            g_test_message("%s: %s", line, value);
            g_assert_nonnull(strstr(line, value));
            g_free(value), g_free(line);
        }
        g_free(page), g_free(args);
        json_decref(sim);
        tu_tmp_file_remove(html, dir);
    }
}

/* report takes simulate's flags, as its help says: --kernels, --slow-rank, --slow-link and
 * --trace were refused ("Unknown option"), so the plan `plan --kernels eager` ranked or a slow
 * rank's step could not be drawn; with them it prints what simulate prints. */
static void test_simulate_flags(void)
{
    char *dir;
    char *html = tu_tmp_file("report", "flags.html", &dir);
    char *trace = g_build_filename(dir, "flags.json", NULL);
    const char *plan = "--model gpt2-1.5b --cluster dgx-a100-80g --gpus 16 --stage 2 "
                       "--micro-batch 2 --grad-accum 2 --kernels eager --slow-rank 3:1.2 "
                       "--slow-link 1:1.5";
    char *args = g_strdup_printf("simulate %s", plan);
    TuRun sim = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(sim.status, NULL));
    g_free(args);
    args = g_strdup_printf("report %s --trace %s --html %s", plan, trace, html);
    TuRun report = tu_zplan(args);
    g_test_message("%s: %s", args, report.err);
    g_assert_true(g_spawn_check_wait_status(report.status, NULL));
    g_assert_cmpstr(report.out, ==, sim.out);
    g_assert_true(g_file_test(trace, G_FILE_TEST_EXISTS));
    g_assert_true(g_file_test(html, G_FILE_TEST_EXISTS));
    tu_free(&sim), tu_free(&report);
    g_remove(trace);
    g_free(trace), g_free(args);
    tu_tmp_file_remove(html, dir);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/report/html-page", test_html_page);
    g_test_add_func("/report/plan-page", test_plan_page);
    g_test_add_func("/report/pipeline-page", test_pipeline_page);
    g_test_add_func("/report/bytes-agree", test_bytes_agree);
    g_test_add_func("/report/simulate-flags", test_simulate_flags);
    return g_test_run();
}
