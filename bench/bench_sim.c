/* bench_sim: how fast the simulator runs — one ZeRO-3 step of gpt-1t (ZeRO-1 with a
 * pipeline) on 1,024 to 131,072 ranks with one slow rank, tp and pp 1 or more: every rank
 * explicit (blocks of ranks in lockstep stepped as units, and each rank on its own) and as
 * rank classes (CPU time, events/s, peak RSS), one 1 GiB all-reduce on 4,096 ranks, and issue
 * 40's targets (--json and --trace at scale, a 32,000-layer model). */
#include "cli.h"
#include "sim_coll.h"
#include "sim_engine.h"
#include "sim_trace.h"
#include "zp_alloc_replay.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>

#include <fcntl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* What one size's child process sends back to the parent. */
typedef struct {
    int ok, ranks_simulated, units_simulated;
    uint32_t n_ops;
    double build_s, cpu_s, step_s, state_bytes;
    double sim_s, replay_s; /* bench_deep's phases (cpu_s: its build and simulation) */
    uint64_t op_events, heap_events;
} Row;

/* Whose ZeRO-3 the table times: the paper's by default, the schedule the speed targets were
 * set on (one gather per block); DeepSpeed's per-module gathers give about 5x the ops a rank. */
static ZpImplKind bench_impl = ZP_IMPL_PAPER;
/* Tensor-parallel degree and pipeline stages of the table's plans (the world is dp x mp x
 * pp). With a pipeline the plans are ZeRO-1 (DeepSpeed refuses stages 2 and 3 with one,
 * zp_pipe_check), 1F1B over 2 x pp micro-batches. */
static int bench_mp = 1, bench_pp = 1;

/* The ZeRO stage of the table's plans. */
static int bench_stage(void)
{
    return bench_pp > 1 ? 1 : 3;
}

/* The rank the class runs slow (2x): one in the middle of the world. */
static SimSlow slow_rank(int ranks)
{
    return (SimSlow){.index = (uint32_t)ranks / 2 + 1, .factor = 2.0};
}

/* How a run simulates the ranks. */
typedef enum { RUN_EXPLICIT, RUN_EACH_RANK, RUN_CLASSES } RunKind;

/* gpt-1t, bench_stage(), micro-batch 1, checkpointing, ranks (dp x bench_mp x bench_pp), one
 * of them slow: every rank explicit (the issue's case), also stepped one by one, or folded
 * into rank classes. Runs in a child so that its peak RSS is its own. */
static Row run_gpt_1t(const ZpHw *hw, int ranks, RunKind kind)
{
    Row row = {0};
    ZpModel model;
    ZpPlan plan;
    GError *error = NULL;
    zp_plan_defaults(&plan, bench_stage(), ranks / (bench_mp * bench_pp), bench_mp);
    plan.impl = bench_impl;
    plan.checkpoint = TRUE;
    if (bench_pp > 1) {
        plan.pipe = (ZpPipeConfig){.stages = bench_pp, .schedule = ZP_PIPE_1F1B};
        plan.grad_accum = 2 * bench_pp;
    }
    const double build_start_s = cpu_s();
    ZpSchedule *s = zp_model_load("gpt-1t", &model, &error)
                        ? zp_sched_build(&model, &plan, &error)
                        : NULL;
    row.build_s = cpu_s() - build_start_s;
    SimResult *r = NULL;
    if (s) {
        const SimSlow slow = slow_rank(ranks);
        const SimOptions options = {.mode = kind == RUN_CLASSES ? SIM_MODE_FOLDED
                                                                : SIM_MODE_EXPLICIT,
                                    .each_rank = kind == RUN_EACH_RANK,
                                    .slow_ranks = &slow, .n_slow_ranks = 1};
        const double start_s = cpu_s();
        r = sim_engine_run(s, hw, &options, &error);
        row.cpu_s = cpu_s() - start_s;
    }
    if (!r) {
        fprintf(stderr, "bench_sim: %d ranks: %s\n", ranks, error->message);
        g_error_free(error);
    } else {
        row = (Row){.ok = 1, .ranks_simulated = r->ranks_simulated,
                    .units_simulated = r->units_simulated, .n_ops = r->n_ops,
                    .build_s = row.build_s, .cpu_s = row.cpu_s,
                    .step_s = r->step_time_s, .state_bytes = (double)r->state_bytes,
                    .op_events = r->op_events, .heap_events = r->heap_events};
    }
    sim_result_free(r);
    zp_sched_free(s);
    return row;
}

/* One run, as a child runs it: gpt-1t's table (RunKind) or a target (TargetCase). */
typedef Row (*RunFn)(const ZpHw *hw, int ranks, int kind);

static Row run_table(const ZpHw *hw, int ranks, int kind)
{
    return run_gpt_1t(hw, ranks, (RunKind)kind);
}

/* One run in a child process; its peak RSS (MiB) from wait4. */
static int child_run_fn(RunFn fn, const ZpHw *hw, int ranks, int kind, Row *row,
                        double *rss_mib)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("bench_sim: pipe");
        return 1;
    }
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        perror("bench_sim: fork");
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        const Row got = fn(hw, ranks, kind);
        const ssize_t written = write(fds[1], &got, sizeof got);
        _exit(written == (ssize_t)sizeof got && got.ok ? 0 : 1);
    }
    close(fds[1]);
    *row = (Row){0};
    const ssize_t got = read(fds[0], row, sizeof *row);
    close(fds[0]);
    int status = 0;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0 || got != (ssize_t)sizeof *row) {
        fprintf(stderr, "bench_sim: the %d-rank run failed\n", ranks);
        return 1;
    }
    *rss_mib = usage.ru_maxrss / 1024.0;
    return 0;
}

static int child_run(const ZpHw *hw, int ranks, RunKind kind, Row *row, double *rss_mib)
{
    return child_run_fn(run_table, hw, ranks, (int)kind, row, rss_mib);
}

/* ---- issue 40's targets: what `zplan simulate` runs for them ---- */

typedef enum { TARGET_JSON, TARGET_TRACE, TARGET_SLOW_LINK_JSON, TARGET_DEEP } TargetCase;

static const char *const target_names[] = {
    "gpt-1t ZeRO-3, 131,072 explicit ranks, --json",
    "gpt-1t ZeRO-3, 16,384 explicit ranks, --trace",
    "gpt-1t ZeRO-3, 8,192 ranks, --slow-link 3:2, grad-accum 8, --json",
    "32,000-layer stage 3 (gpt2-124m's shape, DeepSpeed's), 8 GPUs, folded",
};

/* A target's build and simulation (and its trace written, to a file then removed), with the
 * CLI's defaults (DeepSpeed's ZeRO-3), micro-batch 1, checkpointing. */
static Row run_target(const ZpHw *hw, int ranks, int kind)
{
    Row row = {0};
    ZpModel model;
    ZpPlan plan;
    GError *error = NULL;
    const gboolean deep = kind == TARGET_DEEP;
    zp_plan_defaults(&plan, 3, ranks, 1);
    plan.checkpoint = TRUE;
    plan.grad_accum = kind == TARGET_SLOW_LINK_JSON ? 8 : 1;
    const double start_s = cpu_s();
    gboolean ok = zp_model_load(deep ? "gpt2-124m" : "gpt-1t", &model, &error);
    model.layers = deep ? 32000 : model.layers;
    ZpSchedule *s = ok ? zp_sched_build(&model, &plan, &error) : NULL;
    row.build_s = cpu_s() - start_s;
    const SimSlow link = {.index = 3, .factor = 2};
    const SimOptions options = {.mode = deep ? SIM_MODE_FOLDED : SIM_MODE_EXPLICIT,
                                .slow_nodes = &link,
                                .n_slow_nodes = kind == TARGET_SLOW_LINK_JSON};
    /* As `zplan simulate` runs them: --trace keeps the ranks it writes (sim_trace_run),
     * --json no timeline (its op times are the engine's sums by op type), unless the step
     * is past the clock's grid. */
    SimResult *r = s ? (kind == TARGET_TRACE ? sim_trace_run(s, hw, &options, TRUE, &error)
                                             : sim_engine_run(s, hw, &options, &error))
                     : NULL;
    if (r && !deep && kind != TARGET_TRACE && !r->op_types_exact) {
        sim_result_free(r);
        r = sim_trace_run(s, hw, &options, FALSE, &error);
    }
    if (r && kind == TARGET_TRACE) {
        char *path = g_build_filename(g_get_tmp_dir(), "bench_sim-trace.json", NULL);
        ok = sim_trace_write(s, r, path, NULL, NULL, &error);
        g_remove(path);
        g_free(path);
    }
    row.cpu_s = cpu_s() - start_s;
    if (!r || !ok) {
        fprintf(stderr, "bench_sim: %s: %s\n", target_names[kind], error->message);
        g_error_free(error);
    } else {
        row = (Row){.ok = 1, .ranks_simulated = r->ranks_simulated, .n_ops = r->n_ops,
                    .build_s = row.build_s, .cpu_s = row.cpu_s, .step_s = r->step_time_s,
                    .op_events = r->op_events};
    }
    sim_result_free(r);
    zp_sched_free(s);
    return row;
}

/* Each target three times in its own process: the least CPU time (schedule build included)
 * and peak RSS. */
static int bench_targets(const ZpHw *hw)
{
    const int ranks[] = {131072, 16384, 8192, 8};
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) != 3)
        load[0] = load[1] = load[2] = -1;
    printf("\nissue 40's targets (CPU s and peak RSS of the least of 3 runs, each in its own "
           "process; schedule build, simulation, and the trace written; load %.2f %.2f %.2f)\n"
           "%-72s %8s %8s %8s %10s\n",
           load[0], load[1], load[2], "case", "CPU s", "build s", "RSS MiB", "op events");
    int failed = 0;
    for (int k = 0; k < (int)G_N_ELEMENTS(ranks); k++) {
        Row best = {0};
        double best_mib = 0;
        for (int i = 0; i < 3 && !failed; i++) {
            Row row;
            double mib;
            failed += child_run_fn(run_target, hw, ranks[k], k, &row, &mib);
            if (!failed && (i == 0 || row.cpu_s < best.cpu_s)) {
                best = row;
                best_mib = mib;
            }
        }
        if (!failed)
            printf("%-72s %8.3f %8.3f %8.1f %10" G_GUINT64_FORMAT "\n", target_names[k],
                   best.cpu_s, best.build_s, best_mib, best.op_events);
    }
    return failed;
}

/* ---- issue 40's deep model, phase by phase (bench_sim deep) ---- */

/* The TARGET_DEEP row's plan (gpt2-124m's shape with `layers` blocks, DeepSpeed's stage 3,
 * 8 GPUs, micro-batch 1, checkpointing, folded) with each phase's CPU time apart: the schedule
 * build, the simulation, and the caching allocator's replay, which `zplan simulate` runs
 * after them (zp_alloc_replay_schedule). */
static Row run_deep(const ZpHw *hw, int layers, int unused)
{
    (void)unused;
    Row row = {0};
    ZpModel model;
    ZpPlan plan;
    GError *error = NULL;
    zp_plan_defaults(&plan, 3, 8, 1);
    plan.checkpoint = TRUE;
    const double start_s = cpu_s();
    const gboolean ok = zp_model_load("gpt2-124m", &model, &error);
    model.layers = layers;
    ZpSchedule *s = ok ? zp_sched_build(&model, &plan, &error) : NULL;
    const double built_s = cpu_s();
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r = s ? sim_engine_run(s, hw, &options, &error) : NULL;
    const double simulated_s = cpu_s();
    if (r)
        zp_alloc_replay_schedule(s, hw->gpu_memory_bytes - hw->runtime_reserve_bytes);
    if (!r) {
        fprintf(stderr, "bench_sim: %d layers: %s\n", layers, error->message);
        g_error_free(error);
    } else {
        row = (Row){.ok = 1, .n_ops = r->n_ops, .build_s = built_s - start_s,
                    .sim_s = simulated_s - built_s, .replay_s = cpu_s() - simulated_s,
                    .cpu_s = simulated_s - start_s, .step_s = r->step_time_s,
                    .op_events = r->op_events};
    }
    sim_result_free(r);
    zp_sched_free(s);
    return row;
}

/* Each depth three times in its own process: the run of least build + simulation CPU time,
 * its phases and peak RSS (all three phases' process), and the load. */
static int bench_deep(const ZpHw *hw, int argc, char **argv)
{
    int layers[8] = {8000, 32000}, n = 2;
    if (argc > 0) {
        n = MIN(argc, (int)G_N_ELEMENTS(layers));
        for (int k = 0; k < n; k++) {
            layers[k] = atoi(argv[k]);
            if (layers[k] < 1 || layers[k] > 100000) {
                fprintf(stderr, "bench_sim deep: LAYERS must be 1 to 100000, not '%s'\n",
                        argv[k]);
                return 1;
            }
        }
    }
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) != 3)
        load[0] = load[1] = load[2] = -1;
    printf("stage-3 model of gpt2-124m's blocks (DeepSpeed's, 8 GPUs, micro-batch 1, "
           "checkpointing, folded): CPU s of the least of 3 runs by build + simulation, each in "
           "its own process, and its peak RSS; load %.2f %.2f %.2f\n"
           "%8s %9s %8s %8s %8s %10s %8s %8s %10s\n",
           load[0], load[1], load[2], "layers", "ops", "build s", "sim s", "replay s",
           "build+sim", "RSS MiB", "B/op", "ns/op");
    int failed = 0;
    for (int k = 0; k < n && !failed; k++) {
        Row best = {0};
        double best_mib = 0;
        for (int i = 0; i < 3 && !failed; i++) {
            Row row;
            double mib;
            failed += child_run_fn(run_deep, hw, layers[k], 0, &row, &mib);
            if (!failed && (i == 0 || row.cpu_s < best.cpu_s)) {
                best = row;
                best_mib = mib;
            }
        }
        if (!failed)
            printf("%8d %9u %8.3f %8.3f %8.3f %10.3f %8.1f %8.0f %10.0f\n", layers[k],
                   best.n_ops, best.build_s, best.sim_s, best.replay_s, best.cpu_s, best_mib,
                   best_mib * 1048576.0 / best.n_ops, 1e9 * best.cpu_s / best.n_ops);
    }
    return failed;
}

/* Whether two runs of every rank gave the same step and event counts. */
static const char *same(const Row *a, const Row *b)
{
    return a->step_s == b->step_s && a->op_events == b->op_events &&
                   a->heap_events == b->heap_events
               ? "yes"
               : "NO";
}

/* One table row: every rank explicit, in blocks and one by one, then the rank classes (one
 * slow rank every time). */
static int table_row(const ZpHw *hw, int ranks)
{
    Row all, each, classes;
    double all_mib, each_mib, classes_mib;
    if (child_run(hw, ranks, RUN_EXPLICIT, &all, &all_mib) ||
        child_run(hw, ranks, RUN_EACH_RANK, &each, &each_mib) ||
        child_run(hw, ranks, RUN_CLASSES, &classes, &classes_mib))
        return 1;
    const double rank_ops = (double)ranks * all.n_ops;
    printf("%8d %8.4f %10.3g %7.1f %7.3f %6d %10.6g | %8.3f %7.1f %7.1f %7.2f %6.1f %4s | "
           "%7d %8.4f %7.1f\n",
           ranks, all.cpu_s, all.op_events / all.cpu_s, all_mib, all.state_bytes / rank_ops,
           all.units_simulated, all.step_s, each.cpu_s, 1e9 * each.cpu_s / each.op_events,
           each_mib, each.state_bytes / rank_ops, each.heap_events / (double)ranks,
           same(&all, &each), classes.ranks_simulated, classes.cpu_s, classes_mib);
    return 0;
}

static int bench_table(const ZpHw *hw, int max_ranks)
{
    printf("gpt-1t, ZeRO-%d (--impl %s), micro-batch 1, checkpointing, mp %d, pp %d (1F1B, "
           "%d micro-batches), dgx-a100-80g; one "
           "process per run; rank RANKS/2+1 computes 2x slower. Left: every rank simulated "
           "(--explicit), blocks of ranks in lockstep stepped as units. Middle: the same, each "
           "rank stepped on its own (SimOptions.each_rank); same: the step and both event "
           "counts equal the left's. Right: folded into rank classes, which give --explicit's "
           "results (test_sim_slow checks all three bit for bit)\n"
           "   ranks    CPU s   events/s RSS MiB  bytes/  units  simulated |     each  ns per"
           " RSS MiB  bytes/  queue same | classes    CPU s RSS MiB\n"
           "                                     rank-op            step s |    CPU s   event"
           "         rank-op  ev/rk      |\n",
           bench_stage(), zp_impl_name(bench_impl), bench_mp, bench_pp,
           bench_pp > 1 ? 2 * bench_pp : 1);
    int failed = 0;
    for (int ranks = 1024; ranks <= max_ranks; ranks *= 2)
        failed += table_row(hw, ranks);
    return failed;
}

/* A schedule of one all-reduce on the DP stream, built by hand: no model, no other op. */
static int bench_allreduce(const ZpHw *hw)
{
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    zp_plan_defaults(&s->plan, 0, 4096, 1);
    s->world = 4096;
    s->elem_bytes = 2;
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const ZpOp op = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLREDUCE,
                     .stream = ZP_STREAM_DP, .group = ZP_GROUP_DP, .unit = -1, .buffer = -1,
                     .bytes = 1073741824.0};
    g_array_append_val(s->ops, op);
    const SimCollGroup g = sim_coll_group(hw, 4096, 1, ZP_GROUP_DP);
    const SimCollCost c = sim_coll_cost(ZP_COLL_ALLREDUCE, op.bytes, &g);
    printf("\n1 GiB all-reduce on 4096 ranks (%d nodes): NCCL's choice %s/%s, %.6g s; "
           "the ring (Simple) would take %.6g s\n",
           g.nodes, sim_coll_algo_name(c.algo), sim_coll_proto_name(c.proto),
           c.latency_s + c.transfer_s,
           sim_coll_ring_time_s(ZP_COLL_ALLREDUCE, op.bytes, &g, SIM_PROTO_SIMPLE));
    const SimOptions options = {.mode = SIM_MODE_EXPLICIT};
    const int repeats = 20;
    double best_s = G_MAXDOUBLE;
    int failed = 0;
    for (int i = 0; i < repeats && !failed; i++) {
        GError *error = NULL;
        const double start_s = cpu_s();
        SimResult *r = sim_engine_run(s, hw, &options, &error);
        best_s = MIN(best_s, cpu_s() - start_s);
        if (!r) {
            fprintf(stderr, "bench_sim: %s\n", error->message);
            g_error_free(error);
            failed = 1;
        } else if (i == repeats - 1) {
            printf("  %d ranks, %" G_GUINT64_FORMAT " op events, simulated %.6g s, CPU %.5f s "
                   "(least of %d)\n",
                   r->ranks_simulated, r->op_events, r->step_time_s, best_s, repeats);
        }
        sim_result_free(r);
    }
    zp_sched_free(s);
    return failed;
}

/* ---- issue 40's Megatron rows: one evaluation as `zplan simulate ... --json` runs it ---- */

/* Korthikanti et al. 2022 Table 3 (arXiv 2205.05198): heads, hidden, layers, pipeline stages,
 * micro-batch and global batch (tensor parallel 8, sequence 2048, vocabulary 51200, one
 * data-parallel replica), each with recomputation none and selective: the eight shapes
 * tests/test_recompute.c runs. */
static const struct {
    const char *name;
    int heads, hidden, layers, pp, micro, global;
} korthikanti[] = {
    {"22b", 64, 6144, 48, 1, 4, 4},
    {"175b", 96, 12288, 96, 8, 1, 64},
    {"530b", 128, 20480, 105, 35, 1, 280},
    {"1t", 160, 25600, 128, 64, 1, 512},
};

/* The development set's rows (rows.json under dir: "zplan_command", @HERE@ the folder) and
 * Korthikanti's eight, as simulate's argument vectors (argv[0] "simulate", --json last). */
static GPtrArray *megatron_commands(const char *dir, GPtrArray *names, GError **error)
{
    char *path = g_build_filename(dir, "rows.json", NULL);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        g_set_error(error, G_FILE_ERROR, G_FILE_ERROR_INVAL, "%s: %s", path, jerr.text);
        g_free(path);
        return NULL;
    }
    g_free(path);
    GPtrArray *commands = g_ptr_array_new_with_free_func((GDestroyNotify)g_strfreev);
    json_t *row;
    size_t i;
    json_array_foreach(json_object_get(root, "rows"), i, row)
    {
        const char *command = json_string_value(json_object_get(row, "zplan_command"));
        if (!command)
            continue;
        GString *text = g_string_new(command);
        g_string_replace(text, "@HERE@", dir, 0);
        char **argv = g_strsplit(text->str + strlen("build/zplan "), " ", -1);
        g_string_free(text, TRUE);
        g_ptr_array_add(commands, argv);
        g_ptr_array_add(names, g_strdup(json_string_value(json_object_get(row, "id"))));
    }
    json_decref(root);
    for (size_t k = 0; k < G_N_ELEMENTS(korthikanti); k++) {
        char *model = g_strdup_printf("%s/bench_sim-k-%s-%d.json", g_get_tmp_dir(),
                                      korthikanti[k].name, (int)getpid());
        char *text = g_strdup_printf("{\"name\": \"k-%s\", \"layers\": %d, \"hidden\": %d, "
                                     "\"heads\": %d, \"seq_len\": 2048, \"vocab\": 51200}",
                                     korthikanti[k].name, korthikanti[k].layers,
                                     korthikanti[k].hidden, korthikanti[k].heads);
        if (!g_file_set_contents(model, text, -1, error)) {
            g_free(text);
            g_free(model);
            g_ptr_array_free(commands, TRUE);
            return NULL;
        }
        g_free(text);
        for (int selective = 0; selective <= 1; selective++) {
            char *line = g_strdup_printf(
                "simulate --model %s --cluster dgx-a100-80g --gpus %d --mp 8 --pp %d --stage 0 "
                "--micro-batch %d --grad-accum %d --sequence-parallel --attention eager "
                "--impl megatron --recompute %s --json",
                model, 8 * korthikanti[k].pp, korthikanti[k].pp, korthikanti[k].micro,
                korthikanti[k].global / korthikanti[k].micro, selective ? "selective" : "none");
            g_ptr_array_add(commands, g_strsplit(line, " ", -1));
            g_ptr_array_add(names, g_strdup_printf("korthikanti-%s-%s", korthikanti[k].name,
                                                   selective ? "selective" : "none"));
            g_free(line);
        }
        g_free(model);
    }
    return commands;
}

/* CPU seconds of one `zplan simulate` run in this process, its JSON sent to /dev/null; exit
 * status 2 (does not fit, JSON printed) counts as a run. */
static double simulate_cpu_s(char **argv, int *status)
{
    char **copy = g_strdupv(argv); /* GOption reorders what it parses */
    const int argc = (int)g_strv_length(copy);
    fflush(stdout);
    const int saved = dup(STDOUT_FILENO);
    const int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, STDOUT_FILENO);
    close(null_fd);
    const double start_s = cpu_s();
    *status = cli_simulate(argc, copy);
    fflush(stdout);
    const double used_s = cpu_s() - start_s;
    dup2(saved, STDOUT_FILENO);
    close(saved);
    g_free(copy); /* cli_simulate's parse may have dropped entries: the strings stay argv's */
    return used_s;
}

/* Where one evaluation's time goes: the sink (cli_simulate_into) times the schedule's build,
 * the simulation stepped (--no-fold) and folded, and the caching allocator's replay again,
 * one by one, the least of 3 each. */
typedef struct {
    double build_s, sim_s, stepped_s, replay_s, replay_stepped_s;
    double rank_s; /* the search's evaluation (cli_rank_simulate: step time, peak, allocator) */
    uint32_t n_ops, folded, extended;
    uint64_t op_events;
} Phases;

static int time_phases(const CliSimulated *s, void *ctx)
{
    Phases *p = ctx;
    *p = (Phases){.build_s = G_MAXDOUBLE, .sim_s = G_MAXDOUBLE, .stepped_s = G_MAXDOUBLE,
                  .replay_s = G_MAXDOUBLE, .replay_stepped_s = G_MAXDOUBLE,
                  .rank_s = G_MAXDOUBLE};
    for (int i = 0; i < 3; i++) { /* the least of 3 each */
        GError *error = NULL;
        double start_s = cpu_s();
        ZpSchedule *sched = zp_sched_build(s->model, s->plan, &error);
        p->build_s = MIN(p->build_s, cpu_s() - start_s);
        SimOptions options = {.mode = SIM_MODE_FOLDED, .no_fold = TRUE};
        start_s = cpu_s();
        SimResult *r = sched ? sim_engine_run(sched, s->hw, &options, &error) : NULL;
        p->stepped_s = MIN(p->stepped_s, cpu_s() - start_s);
        sim_result_free(r);
        options.no_fold = FALSE;
        start_s = cpu_s();
        r = sched ? sim_engine_run(sched, s->hw, &options, &error) : NULL;
        p->sim_s = MIN(p->sim_s, cpu_s() - start_s);
        p->folded = r ? r->fold_micro_steps : 0;
        start_s = cpu_s();
        if (r)
            zp_alloc_replay_schedule(sched,
                                     s->hw->gpu_memory_bytes - s->hw->runtime_reserve_bytes);
        p->replay_s = MIN(p->replay_s, cpu_s() - start_s);
        start_s = cpu_s();
        if (r)
            zp_alloc_replay_schedule_folded(
                sched, s->hw->gpu_memory_bytes - s->hw->runtime_reserve_bytes, FALSE);
        p->replay_stepped_s = MIN(p->replay_stepped_s, cpu_s() - start_s);
        p->n_ops = sched ? sched->ops->len : 0;
        p->op_events = r ? r->op_events : 0;
        if (!r) {
            fprintf(stderr, "bench_sim: %s\n", error->message);
            g_error_free(error);
        }
        sim_result_free(r);
        zp_sched_free(sched);
        if (!r)
            return 1;
        ZpAllocStats alloc;
        start_s = cpu_s();
        r = cli_rank_simulate(s->model, s->hw, s->plan, 0, &alloc, &error);
        p->rank_s = MIN(p->rank_s, cpu_s() - start_s);
        if (!r) {
            fprintf(stderr, "bench_sim: %s\n", error->message);
            g_error_free(error);
            return 1;
        }
        p->extended = r->extended_micro_steps;
        sim_result_free(r);
    }
    return 0;
}

/* The 18 Megatron configurations, each evaluated 3 times (the least CPU time kept), their
 * mean, and the 1T row's phases. */
static int bench_megatron(const char *dir)
{
    GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
    GError *error = NULL;
    GPtrArray *commands = megatron_commands(dir, names, &error);
    if (!commands) {
        fprintf(stderr, "bench_sim: %s\n", error->message);
        g_error_free(error);
        g_ptr_array_free(names, TRUE);
        return 1;
    }
    printf("\nMegatron configurations: one evaluation, `zplan simulate ... --json` in this process "
           "(model, schedule build, folded simulation, allocator replay, JSON; the schedule "
           "built short where the fold counts the rest as virtual periods, as the search's "
           "evaluation), the least CPU time of 3; then the full schedule's phases, each the "
           "least of 3 (issue 40: Megatron 1T is narayanan21-t1-1008b)\n%-36s %10s %10s %12s\n",
           "configuration", "CPU ms", "ops", "op events");
    double sum_s = 0, rank_sum_s = 0;
    int failed = 0;
    for (guint k = 0; k < commands->len; k++) {
        char **argv = g_ptr_array_index(commands, k);
        double best_s = G_MAXDOUBLE;
        for (int i = 0; i < 3 && !failed; i++) {
            int status = 0;
            best_s = MIN(best_s, simulate_cpu_s(argv, &status));
            failed += status != 0 && status != 2;
        }
        Phases p = {0};
        char **copy = g_strdupv(argv);
        int argc = (int)g_strv_length(copy);
        gboolean json = FALSE; /* simulate's own flag, which cli_simulate_into leaves out */
        const GOptionEntry extra[] = {{"json", 0, 0, G_OPTION_ARG_NONE, &json, "JSON", NULL},
                                      {NULL, 0, 0, 0, NULL, NULL, NULL}};
        failed += failed ? 0
                         : cli_simulate_into(argc, copy, "simulate", "", extra, time_phases, &p);
        g_free(copy);
        if (failed) {
            fprintf(stderr, "bench_sim: %s failed\n", (char *)g_ptr_array_index(names, k));
            break;
        }
        sum_s += best_s;
        rank_sum_s += p.rank_s;
        printf("%-36s %10.2f %10u %12" G_GUINT64_FORMAT "   build %.1f ms, simulation %.1f ms "
               "(%u micro-steps folded; %.1f ms stepped), replay %.1f ms (%.1f ms stepped); "
               "the search's evaluation %.1f ms (%u micro-steps virtual)\n",
               (char *)g_ptr_array_index(names, k), 1e3 * best_s, p.n_ops, p.op_events,
               1e3 * p.build_s, 1e3 * p.sim_s, p.folded, 1e3 * p.stepped_s, 1e3 * p.replay_s,
               1e3 * p.replay_stepped_s, 1e3 * p.rank_s, p.extended);
    }
    if (!failed) {
        printf("%-36s %10.2f   (mean per evaluation over %u configurations)\n", "mean",
               1e3 * sum_s / commands->len, commands->len);
        printf("%-36s %10.2f   (the search's evaluation, cli_rank_simulate: the schedule "
               "built short and extended by virtual periods where its fold proves them; mean, "
               "least of 3 each)\n",
               "mean, search's evaluation", 1e3 * rank_sum_s / commands->len);
    }
    for (guint k = 0; k < commands->len; k++) {
        char **argv = g_ptr_array_index(commands, k);
        if (g_str_has_prefix((char *)g_ptr_array_index(names, k), "korthikanti") &&
            g_str_has_suffix((char *)g_ptr_array_index(names, k), "none"))
            g_unlink(argv[2]); /* each shape's model file, once */
    }
    g_ptr_array_free(commands, TRUE);
    g_ptr_array_free(names, TRUE);
    return failed;
}

/* Whether a degree is 1 to most, a power of two (so that every row's world divides). */
static gboolean fits_world(int degree, int most)
{
    return degree >= 1 && degree <= most && (degree & (degree - 1)) == 0;
}

/* The development set's folder (GUIDE.md): beside the project's root, or where the shared
 * folder lies on the development machines. */
static const char *megatron_dev_set(void)
{
    const char *beside = "../shared/validation/megatron-t1";
    return g_file_test(beside, G_FILE_TEST_IS_DIR) ? beside : "/work/shared/validation/megatron-t1";
}

/* Usage: bench_sim [MAX_RANKS [paper|deepspeed|fsdp [MP [PP]]]]: the table's last row (default
 * 131072), whose ZeRO (paper), the tensor-parallel degree (default 1; 1 to 8) and the
 * pipeline stages (default 1; 1 to 16), each a power of two. bench_sim targets: issue 40's
 * rows alone. bench_sim megatron [DIR]: the 18 Megatron configurations alone (DIR the
 * development set's folder, megatron_dev_set() by default). bench_sim deep [LAYERS...]: the
 * deep stage-3 model phase by phase (build, simulation, allocator replay) at 8,000 and 32,000
 * layers or those given. */
int main(int argc, char **argv)
{
    ZpHw hw;
    GError *error = NULL;
    zp_malloc_keep_freed(); /* as zplan's main: the rows time what `zplan simulate` does */
    if (argc > 1 && strcmp(argv[1], "targets") == 0) {
        if (!zp_hw_load("dgx-a100-80g", &hw, &error)) {
            fprintf(stderr, "bench_sim: %s\n", error->message);
            return 1;
        }
        return bench_targets(&hw) ? 1 : 0;
    }
    if (argc > 1 && strcmp(argv[1], "deep") == 0) {
        if (!zp_hw_load("dgx-a100-80g", &hw, &error)) {
            fprintf(stderr, "bench_sim: %s\n", error->message);
            return 1;
        }
        return bench_deep(&hw, argc - 2, argv + 2) ? 1 : 0;
    }
    if (argc > 1 && strcmp(argv[1], "megatron") == 0)
        return bench_megatron(argc > 2 ? argv[2] : megatron_dev_set()) ? 1 : 0;
    const int max_ranks = argc > 1 ? atoi(argv[1]) : 131072;
    bench_mp = argc > 3 ? atoi(argv[3]) : 1;
    bench_pp = argc > 4 ? atoi(argv[4]) : 1;
    if (max_ranks < 1024 || !fits_world(bench_mp, 8) || !fits_world(bench_pp, 16) ||
        (argc > 2 && !zp_impl_parse(argv[2], "IMPL", &bench_impl, &error)) ||
        !zp_hw_load("dgx-a100-80g", &hw, &error)) {
        fprintf(stderr, "bench_sim: %s\n",
                error ? error->message
                      : "MAX_RANKS must be at least 1024, MP 1, 2, 4 or 8, and PP 1 to 16, a "
                        "power of two");
        return 1;
    }
    const int failed = bench_table(&hw, max_ranks) + bench_allreduce(&hw) + bench_targets(&hw) +
                       bench_megatron(megatron_dev_set());
    return failed ? 1 : 0;
}
