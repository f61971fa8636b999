/* Tests that resources stay bounded and are said up front: absurd requests refused in one line
 * before they allocate, and deep models built in time linear in their layers. */
#include "testutil.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static char *tmp_dir;

/* What a refused request may take: a second of CPU and 1 GB; and the address space a run gets
 * here (ulimit -v), so that a build without the up-front checks fails the test instead of
 * taking the shared machine's memory (the 3.6e18-parameter model took 8.8 GB, then aborted). */
/* Under AddressSanitizer (make check-asan) code runs a few times slower, and its shadow
 * memory takes terabytes of address space: the bounds stretch and ulimit -v is left off. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#define SLOWDOWN 5.0
#else
#define SANITIZED 0
#define SLOWDOWN 1.0
#endif
#define REFUSAL_CPU_S (1.0 * SLOWDOWN)
#define REFUSAL_RSS_KB (1024 * 1024)
#define RUN_LIMIT_KB "4194304"

typedef struct {
    int exit_status;
    char *err;
    double cpu_s; /* user + system of the run and its children */
} Run;

/* Runs `command` (a program of build/ and its arguments) under ulimit -v RUN_LIMIT_KB, with
 * ZPLAN_MEMORY_AVAILABLE = `available` (NULL: unset, the machine's MemAvailable). */
static Run run_limited(const char *command, const char *available)
{
    struct rusage before, after;
    getrusage(RUSAGE_CHILDREN, &before);
    char *cmd = g_strdup_printf("sh -c '%sexec %s/%s'",
                                SANITIZED ? "" : "ulimit -v " RUN_LIMIT_KB "; ", ZP_BUILD_DIR,
                                command);
    char **envp = g_environ_setenv(g_get_environ(), "OPENBLAS_NUM_THREADS", "1", TRUE);
    envp = available ? g_environ_setenv(envp, "ZPLAN_MEMORY_AVAILABLE", available, TRUE)
                     : g_environ_unsetenv(envp, "ZPLAN_MEMORY_AVAILABLE");
    TuRun r = tu_run(cmd, envp);
    g_strfreev(envp);
    getrusage(RUSAGE_CHILDREN, &after);
    const double cpu = (double)(after.ru_utime.tv_sec - before.ru_utime.tv_sec) +
                       (double)(after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                       1e-6 * (double)(after.ru_utime.tv_usec - before.ru_utime.tv_usec +
                                       after.ru_stime.tv_usec - before.ru_stime.tv_usec);
    Run run = {WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + WTERMSIG(r.status),
               g_strdup(r.err), cpu};
    g_printerr("# %s -> exit %d, %.2f s CPU, children's peak RSS %ld KB: %s%s", command,
               run.exit_status, cpu, after.ru_maxrss, r.err,
               g_str_has_suffix(r.err, "\n") ? "" : "\n");
    tu_free(&r);
    g_free(cmd);
    return run;
}

/* Refused: exit 1, one line containing `expect`, within REFUSAL_CPU_S and REFUSAL_RSS_KB. */
static void assert_refused(const char *command, const char *available, const char *expect)
{
    Run r = run_limited(command, available);
    g_assert_cmpint(r.exit_status, ==, 1);
    g_assert_nonnull(strstr(r.err, expect));
    g_assert_cmpint(strchr(r.err, '\n') - r.err, ==, (long)strlen(r.err) - 1);
    g_assert_cmpfloat(r.cpu_s, <, REFUSAL_CPU_S);
    struct rusage children;
    getrusage(RUSAGE_CHILDREN, &children);
    g_assert_cmpint(children.ru_maxrss, <, REFUSAL_RSS_KB);
    g_free(r.err);
}

/* Every key in range, the product about 3.6e18 parameters: 7.2e9 all-gather chunks at stage
 * 1-2. memory refuses it before building a schedule. */
static void test_huge_model(void)
{
    char *path = g_build_filename(tmp_dir, "huge.json", NULL);
    g_assert_true(g_file_set_contents(path,
                                      "{\"name\": \"huge\", \"layers\": 100000, \"hidden\": "
                                      "1000000, \"heads\": 1000, \"seq_len\": 2048, \"vocab\": "
                                      "50000, \"ffn_hidden\": 16000000}", -1, NULL));
    char *cmd = g_strdup_printf("zplan memory --model %s --cluster dgx-h100 --gpus 8", path);
    assert_refused(cmd, NULL, "past the cap of 5e+07 ops (ZP_SCHED_MAX_OPS)");
    g_free(cmd);
    cmd = g_strdup_printf("zplan simulate --model %s --cluster dgx-h100 --gpus 8 --stage 1 "
                          "--micro-batch 1", path);
    assert_refused(cmd, NULL, "ZP_SCHED_MAX_OPS");
    g_free(cmd);
    g_remove(path);
    g_free(path);
}

/* What an answer from the short path may take (cli_rank_simulate_short: the schedule built
 * short, the allocator replay listing the inserted copies only until they repeat): Megatron
 * 1T at 3,800 micro-steps took 0.06 s and 45 MB, gpt-1t ZeRO-3 0.14 s and 26 MB. */
#define SHORT_CPU_S (2.0 * SLOWDOWN)
#define SHORT_RSS_KB (128 * 1024)

/* A plan whose full schedule is past the op cap is answered where `simulate` (text or --json)
 * builds it short and counts the rest as virtual periods (cli_rank_simulate_short), in time
 * and memory of the short schedule: its allocator replay no longer lists every inserted
 * period (the cap held there while it did: 140 MB for Megatron 1T at 3,800, and growing with
 * the micro-steps). Where the short path does not run (--no-fold), the full path refuses in
 * one line, naming the cap. The short path takes micro-steps x units past the full
 * schedule's ZP_SCHED_MAX_UNIT_STEPS (5e5: Megatron 1T at 4,096 is 5.3e5), up to its own
 * CLI_SHORT_MAX_UNIT_STEPS (2.5e6), past which both refuse. Registered first: the children's
 * peak RSS is the most of any child so far. */
static void test_short_path_past_cap(void)
{
    static const char *const plans[] = {
        "--gpus 3072 --mp 8 --pp 64 --stage 0 --micro-batch 1 --grad-accum 3800 --checkpoint",
        "--gpus 16384 --stage 3 --micro-batch 1 --checkpoint --grad-accum 3800"};
    static const char *const outputs[] = {"--json", ""};
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
        for (size_t o = 0; o < G_N_ELEMENTS(outputs); o++) {
            char *cmd = g_strdup_printf(
                "zplan simulate --model gpt-1t --cluster dgx-a100-80g %s %s", plans[k],
                outputs[o]);
            Run r = run_limited(cmd, NULL);
            g_assert_cmpint(r.exit_status, ==, 0);
            g_assert_cmpstr(r.err, ==, "");
            g_assert_cmpfloat(r.cpu_s, <, SHORT_CPU_S);
            struct rusage children;
            getrusage(RUSAGE_CHILDREN, &children);
            g_assert_cmpint(children.ru_maxrss, <, SHORT_RSS_KB);
            g_free(r.err);
            g_free(cmd);
        }
        char *cmd = g_strdup_printf("zplan simulate --model gpt-1t --cluster dgx-a100-80g %s "
                                    "--no-fold --json",
                                    plans[k]);
        assert_refused(cmd, NULL, "past the cap of 5e+07 ops (ZP_SCHED_MAX_OPS)");
        g_free(cmd);
    }
    const char *past_full = "zplan simulate --model gpt-1t --cluster dgx-a100-80g --gpus 3072 "
                            "--mp 8 --pp 64 --stage 0 --micro-batch 1 --grad-accum 4096 "
                            "--checkpoint --json";
    Run r = run_limited(past_full, NULL);
    g_assert_cmpint(r.exit_status, ==, 0);
    g_assert_cmpstr(r.err, ==, "");
    g_assert_cmpfloat(r.cpu_s, <, SHORT_CPU_S);
    g_free(r.err);
    char *no_fold = g_strdup_printf("%s --no-fold", past_full);
    assert_refused(no_fold, NULL, "grad-accum: 4096 micro-steps x 130 units = 5.325e+05 exceeds");
    g_free(no_fold);
    assert_refused("zplan simulate --model gpt-1t --cluster dgx-a100-80g --gpus 16384 --stage 3 "
                   "--micro-batch 1 --checkpoint --grad-accum 20000 --json",
                   NULL, "grad-accum: 20000 micro-steps x 130 units");
}

/* A schedule file of 10^7 ops (110 MB, each op as short as JSON allows) is refused from a
 * streamed count of its ops, before Jansson parses it (10 GB and 31.7 s). */
static void test_schedule_file_10m_ops(void)
{
    char *path = g_build_filename(tmp_dir, "ten-million.json", NULL);
    FILE *f = fopen(path, "w");
    g_assert_nonnull(f);
    fputs("{\"format\": \"zplan-schedule-1\", \"world\": 2, \"ops\": [", f);
    for (int i = 0; i < 10000000; i++)
        fputs(i ? ",{\"kind\":0}" : "{\"kind\":0}", f);
    fputs("]}\n", f);
    g_assert_cmpint(fclose(f), ==, 0);
    char *cmd = g_strdup_printf("zplan simulate --schedule %s --cluster dgx-h100", path);
    assert_refused(cmd, NULL, "about 1e+07 ops (10.2 GB), past the cap of 4e+06 ops "
                        "(ZP_SCHED_FILE_MAX_OPS)");
    g_free(cmd);
    g_remove(path);
    g_free(path);
}

/* --micro-batch 1048576 is inside the flag's range; tiny's activations at it are 164 GB a
 * rank. zreal says so before allocating (it took past 12 GB in 26 s). */
static void test_zreal_micro_batch(void)
{
    assert_refused("zreal --model tiny --micro-batch 1048576 --steps 1 --emulate 2 --rank 0",
                   "16GB", "--micro-batch 1048576 (--model tiny, --stage 0, --grad-accum 1): a rank's "
                   "buffers peak at 164.3 GB");
}

/* What the trace holds is said before it is written: its text is streamed, so that is its
 * two buffers (0.5 MB) and a few words an op of tiny's 32, past a budget of 300 KB that the
 * schedule and the simulation fit in; nothing is left at the path. The variable itself is
 * checked. */
static void test_trace_said_first(void)
{
    char *trace = g_build_filename(tmp_dir, "trace.json", NULL);
    char *cmd = g_strdup_printf("zplan simulate --model tiny --cluster dgx-h100 --gpus 64 "
                                "--stage 1 --micro-batch 1 --explicit --trace %s", trace);
    assert_refused(cmd, "300KB", "--trace: the trace: about 32 ops need 0.000525 GB, "
                                 "more than the 0.0003 GB this machine has available "
                                 "(ZPLAN_MEMORY_AVAILABLE)");
    g_assert_false(g_file_test(trace, G_FILE_TEST_EXISTS));
    assert_refused(cmd, "lots", "ZPLAN_MEMORY_AVAILABLE: 'lots' is not a number");
    Run r = run_limited(cmd, NULL); /* the machine's memory holds it */
    g_assert_cmpint(r.exit_status, ==, 0);
    g_assert_true(g_file_test(trace, G_FILE_TEST_IS_REGULAR));
    g_free(r.err);
    g_remove(trace);
    g_free(cmd);
    g_free(trace);
}

/* What writing a schedule holds is said before its file is opened: its ops are written one at
 * a time, so that is the stream's buffer (0.26 MB) and the units' layout (tiny's 4), past a
 * budget of 200 KB that tiny's 32-op schedule is built in; nothing is left at the path. */
static void test_schedule_write_said_first(void)
{
    char *out = g_build_filename(tmp_dir, "schedule.json", NULL);
    char *cmd = g_strdup_printf("zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 1 "
                                "--out %s", out);
    assert_refused(cmd, "200KB", "zplan schedule: writing the schedule as JSON: about 4 units "
                                 "need 0.000263 GB, more than the 0.0002 GB this machine has "
                                 "available (ZPLAN_MEMORY_AVAILABLE)");
    g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
    g_free(cmd);
    g_free(out);
}

/* A sweep takes at most 200 values (each a plan search with --metric tflops). */
static void test_sweep_values_capped(void)
{
    GString *values = g_string_new("1");
    for (int i = 2; i <= 201; i++)
        g_string_append_printf(values, ",%d", i);
    char *cmd = g_strdup_printf("zplan sweep --vary gpus --values %s --params 1e9 --metric "
                                "memory --out %s/s", values->str, tmp_dir);
    assert_refused(cmd, NULL, "--values: 201 values, past the cap of 200 a sweep (SWEEP_MAX_VALUES)");
    char *csv = g_build_filename(tmp_dir, "s.csv", NULL);
    g_assert_false(g_file_test(csv, G_FILE_TEST_EXISTS));
    g_free(csv);
    g_free(cmd);
    g_string_free(values, TRUE);
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 100,000 layers under DeepSpeed's stage 3: the coordinator's trace found each unit's modules
 * by scanning every module (O(layers^2), 321 s); now one pass. Built in a subprocess so that a
 * quadratic build is cut off (60 s of wall clock on a shared machine) instead of hanging; the
 * bound is on CPU time, which other processes do not inflate. */
static void test_deepspeed_deep_model(void)
{
    if (g_test_subprocess()) {
        ZpModel m = tu_load_model("tiny");
        m.layers = 100000;
        ZpPlan p;
        zp_plan_defaults(&p, 3, 8, 1);
        p.micro_batch = 1;
        p.impl = ZP_IMPL_DEEPSPEED;
        const double wall0 = zp_now_s(), cpu0 = cpu_s();
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        const double cpu = cpu_s() - cpu0;
        g_printerr("# deepspeed stage 3, 100,000 layers: %u ops, %.2f s CPU, %.2f s wall\n",
                   s->ops->len, cpu, zp_now_s() - wall0);
        g_assert_cmpfloat(cpu, <, 5 * SLOWDOWN);
        zp_sched_free(s);
        return;
    }
    g_test_trap_subprocess(NULL, (guint64)(60 * SLOWDOWN) * G_USEC_PER_SEC, G_TEST_SUBPROCESS_INHERIT_STDOUT | G_TEST_SUBPROCESS_INHERIT_STDERR);
    g_test_trap_assert_passed();
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zplan-limits-XXXXXX", NULL);
    /* The refusals first: their peak RSS is read over every child so far. */
    g_test_add_func("/limits/short-path-past-cap", test_short_path_past_cap);
    g_test_add_func("/limits/schedule-file-10m-ops", test_schedule_file_10m_ops);
    g_test_add_func("/limits/huge-model", test_huge_model);
    g_test_add_func("/limits/zreal-micro-batch", test_zreal_micro_batch);
    g_test_add_func("/limits/sweep-values-capped", test_sweep_values_capped);
    g_test_add_func("/limits/trace-said-first", test_trace_said_first);
    g_test_add_func("/limits/schedule-write-said-first", test_schedule_write_said_first);
    g_test_add_func("/limits/deepspeed-deep-model", test_deepspeed_deep_model);
    const int status = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return status;
}
