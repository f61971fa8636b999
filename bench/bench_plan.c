/* bench_plan: how fast the planner is — closed-form screenings per second on one core, and the
 * CPU and wall time of a whole `zplan plan` (screen + simulating finalists) for gpt-1t on 1,024
 * A100s, and of the 3D search (pipelines, TP over nodes) for gpt-1t on 4,096 and mt-nlg-530b on
 * 1,024 (uneven pipelines), and deepseek-v3's (a mixture of experts) on 256 H100s, with the
 * load. */
#include "cli.h"
#include "zp_search.h"
#include "zp_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#ifndef ZP_BUILD_DIR
#define ZP_BUILD_DIR "build"
#endif

/* Screens every enumerated plan over and over for at least `seconds` of wall time. */
static int bench_screen(const ZpSearchSpec *spec, double seconds)
{
    GError *error = NULL;
    ZpScreen screen;
    GArray *plans = zp_search_screen_init(&screen, spec, &error)
                        ? zp_search_enumerate(spec, &error)
                        : NULL;
    if (!plans) {
        fprintf(stderr, "bench_plan: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    uint64_t screened = 0, fit = 0;
    double checksum = 0;
    const gint64 start_us = g_get_monotonic_time();
    gint64 now_us = start_us;
    while (now_us - start_us < seconds * G_USEC_PER_SEC) {
        for (guint i = 0; i < plans->len; i++) {
            double memory, bound;
            zp_search_screen(&screen, &g_array_index(plans, ZpCandidate, i).plan, &memory,
                             &bound);
            fit += memory <= spec->hw->gpu_memory_bytes;
            checksum += bound;
        }
        screened += plans->len;
        now_us = g_get_monotonic_time();
    }
    const double wall_s = (now_us - start_us) / 1e6;
    printf("closed-form screen (one core): %u plans of %s on %d GPUs, screened %" G_GUINT64_FORMAT
           " times in %.3f s\n  %.3g screenings/s (%.0f ns each), %" G_GUINT64_FORMAT
           " fit, bound checksum %.6g\n",
           plans->len, spec->model->name, spec->gpus, screened, wall_s, screened / wall_s,
           1e9 * wall_s / screened, fit, checksum);
    g_array_unref(plans);
    return 0;
}

/* The search's simulations, counted and timed (CPU) around the simulator's ranking. */
typedef struct {
    ZpRankFn rank;
    void *rank_ctx;
    guint runs, stopped;
    double cpu_s, longest_s;
} TimedRank;

static gboolean timed_rank(const ZpPlan *plan, void *ctx, double stop_after_s,
                           double *step_time_s, double *peak_memory_bytes, GError **error)
{
    TimedRank *t = ctx;
    const clock_t start = clock();
    const gboolean ok =
        t->rank(plan, t->rank_ctx, stop_after_s, step_time_s, peak_memory_bytes, error);
    const double cpu_s = (double)(clock() - start) / CLOCKS_PER_SEC;
    t->runs++;
    t->stopped += ok && *peak_memory_bytes == ZP_RANK_STOPPED;
    t->cpu_s += cpu_s;
    t->longest_s = MAX(t->longest_s, cpu_s);
    return ok;
}

/* The whole search in process: enumeration, screen, and the simulated finalists; and where
 * its CPU time goes: the simulations (schedule build, simulated step, allocator replay) and
 * the rest (enumeration, the closed-form screen, ordering). */
static int bench_search(const ZpSearchSpec *base)
{
    ZpSearchResult r;
    GError *error = NULL;
    ZpSearchSpec spec = *base;
    TimedRank timed = {.rank = base->rank, .rank_ctx = base->rank_ctx};
    spec.rank = timed_rank;
    spec.rank_ctx = &timed;
    const gint64 start_us = g_get_monotonic_time();
    const clock_t start_cpu = clock(); /* one thread: the CPU time is one core's */
    const gboolean ok = zp_search_run(&spec, &r, &error);
    const double wall_s = (g_get_monotonic_time() - start_us) / 1e6;
    const double cpu_s = (double)(clock() - start_cpu) / CLOCKS_PER_SEC;
    if (!ok) {
        fprintf(stderr, "bench_plan: %s\n", error->message);
        g_error_free(error);
        zp_search_result_clear(&r);
        return 1;
    }
    printf("search in process: %u plans screened, %u simulated (%u over memory), %u cannot win "
           "(%u of them simulations stopped once past what could win), wall %.4f s, CPU %.4f s\n",
           r.candidates->len, r.count[ZP_FATE_SIMULATED] + r.count[ZP_FATE_SIMULATED_OOM],
           r.count[ZP_FATE_SIMULATED_OOM], r.count[ZP_FATE_CANNOT_WIN], r.stopped, wall_s,
           cpu_s);
    printf("  CPU: %u simulations (%u stopped) %.4f s, the longest %.4f s; enumeration, screen "
           "and ordering %.4f s; %u stage-3 plans left out by the bound with the schedule's "
           "gathers\n",
           timed.runs, timed.stopped, timed.cpu_s, timed.longest_s, cpu_s - timed.cpu_s,
           r.past_stop);
    zp_search_result_clear(&r);
    return 0;
}

/* CPU seconds (user + sys) of the children waited for so far. */
static double children_cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_CHILDREN, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
           u.ru_stime.tv_usec / 1e6;
}

/* The machine's load averages over 1, 5 and 15 minutes ("?" where unknown): the machine is
 * shared, and a figure means little without it. */
static const char *load_average(void)
{
    static char text[64];
    double load[3];
    if (getloadavg(load, 3) != 3)
        return "?";
    g_snprintf(text, sizeof text, "%.2f %.2f %.2f", load[0], load[1], load[2]);
    return text;
}

/* `zplan plan` as a user runs it: process start, search, re-simulating the top plans, output. */
static int bench_command(const char *args, int repeats)
{
    char *command = g_strdup_printf("%s/zplan plan %s", ZP_BUILD_DIR, args);
    char **argv = NULL;
    double best_s = G_MAXDOUBLE, best_cpu_s = G_MAXDOUBLE;
    int status = 0;
    g_shell_parse_argv(command, NULL, &argv, NULL);
    for (int i = 0; i < repeats && status == 0; i++) {
        char *out = NULL, *err = NULL;
        const gint64 start_us = g_get_monotonic_time();
        const double start_cpu_s = children_cpu_s();
        if (!g_spawn_sync(NULL, argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, &out, &err, &status,
                          NULL))
            status = -1;
        best_s = MIN(best_s, (g_get_monotonic_time() - start_us) / 1e6);
        best_cpu_s = MIN(best_cpu_s, children_cpu_s() - start_cpu_s);
        g_free(out);
        g_free(err);
    }
    if (status != 0)
        fprintf(stderr, "bench_plan: %s failed (status %d)\n", command, status);
    else
        printf("zplan plan %s\n  CPU %.4f s (user + sys, least of %d), wall %.4f s (fastest), "
               "load %s\n",
               args, best_cpu_s, repeats, best_s, load_average());
    g_strfreev(argv);
    g_free(command);
    return status != 0;
}

int main(void)
{
    ZpModel model;
    ZpHw hw;
    GError *error = NULL;
    zp_malloc_keep_freed(); /* as zplan's main: the searches in this process run as zplan's */
    if (!zp_model_load("gpt-1t", &model, &error) || !zp_hw_load("dgx-a100-80g", &hw, &error)) {
        fprintf(stderr, "bench_plan: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    ZpSearchSpec spec;
    CliRankContext rank;
    cli_search_spec(&spec, &rank, &model, &hw, 1024);
    int failed = bench_screen(&spec, 1.0);
    failed |= bench_search(&spec);
    spec.global_batch = 2048;
    failed |= bench_search(&spec);
    /* 3D: pipeline stages, virtual stages and TP over whole nodes as well, on 4,096 GPUs. */
    ZpSearchSpec spec3d;
    cli_search_spec(&spec3d, &rank, &model, &hw, 4096);
    spec3d.global_batch = 2048;
    spec3d.three_d = TRUE;
    printf("3D (DP x TP x PP x V, stage, micro-batch, micro-batches, checkpointing), gpt-1t on "
           "4096 GPUs, global batch 2048:\n");
    failed |= bench_search(&spec3d);
    /* The same as `zplan plan --3d` searches it: the profile's default attention kernel and
     * gradient dtype, lossy ZeRO++ left out. */
    ZpPlan kernels;
    zp_plan_defaults(&kernels, 0, 1, 1);
    if (!cli_attention_reduce(NULL, NULL, &hw, spec3d.precision, &kernels, &error)) {
        fprintf(stderr, "bench_plan: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    spec3d.attention = kernels.attention;
    spec3d.reduce_dtype = kernels.reduce_dtype;
    spec3d.exclude = CLI_LOSSY_ZEROPP;
    printf("the same as `zplan plan --3d` searches it (%s attention, lossless ZeRO++ only):\n",
           zp_attention_name(spec3d.attention));
    failed |= bench_search(&spec3d);
    failed |= bench_command("--model gpt-1t --cluster dgx-a100-80g --gpus 4096 --global-batch 2048 --3d", 3);
    failed |= bench_command("--model gpt-1t --cluster dgx-a100-80g --gpus 1024", 5);
    failed |= bench_command("--model gpt-1t --cluster dgx-a100-80g --gpus 1024 --global-batch 2048", 5);
    failed |= bench_command("--model gpt3-175b --cluster dgx-a100-80g --gpus 256 --global-batch 1536", 5);
    /* 105 blocks: most pipelines uneven (sim_fold's heavy stages' shift), and many plans the
     * search stops early (cli_rank.c: no long schedule where the short run stopped as it) */
    failed |= bench_command("--model mt-nlg-530b --cluster dgx-a100-80g --gpus 1024 --global-batch 1536 --3d", 3);
    /* A mixture of experts (zp_moe_search): 61 blocks, pipelines over 16 and 32 stages whose
     * period is none the heavy stages name (cli_rank.c short_again), and the table's
     * all-to-all from the search's kept runs (cli_moe.c) */
    failed |= bench_command("--model hf/deepseek-v3 --cluster dgx-h100 --gpus 256 --global-batch 1536 --3d", 3);
    return failed;
}
