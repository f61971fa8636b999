/* bench_io: what a deep pipeline's large outputs and inputs cost as a user runs them: Megatron's
 * 1T (pp 64, 512 micro-batches: 921,794 ops) --trace, report --html, schedule --out and
 * simulate --schedule of that file; each its own `zplan` process, CPU time and peak RSS. */
#include "zp_util.h"

#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ZP_BUILD_DIR
#define ZP_BUILD_DIR "build"
#endif

/* Megatron 1T as the development set runs it (rows.json: narayanan21-t1-1008b). */
#define PLAN_1T                                                                                \
    "--model %s/megatron-1008b.json --cluster dgx-a100-80g --gpus 3072 --mp 8 --pp 64 "      \
    "--stage 0 --micro-batch 1 --grad-accum 512 --checkpoint --precision fp16 "             \
    "--attention eager"

typedef struct {
    double cpu_s, rss_mib, file_mib;
} Cost;

/* Runs argv with its output sent to /dev/null; its own CPU (user + sys) and peak RSS, from
 * wait4. FALSE where it could not run or failed. */
static gboolean run_child(char **argv, Cost *cost)
{
    fflush(stdout); /* else the child's copy of the buffer is written again */
    const pid_t pid = fork();
    if (pid < 0)
        return FALSE;
    if (pid == 0) {
        FILE *null_out = freopen("/dev/null", "w", stdout);
        (void)null_out;
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return FALSE;
    cost->cpu_s = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                  usage.ru_stime.tv_usec / 1e6;
    cost->rss_mib = usage.ru_maxrss / 1024.0;
    return TRUE;
}

/* The development set's models: beside the project's root, or where the shared folder lies on
 * the development machines (bench_sim's megatron_dev_set). */
static const char *models_dir(void)
{
    const char *beside = "../shared/validation/megatron-t1/models";
    return g_file_test(beside, G_FILE_TEST_IS_DIR) ? beside
                                                   : "/work/shared/validation/megatron-t1/models";
}

/* One row: `zplan FORMAT` (its %s the models' folder, then the output path), the least of
 * `repeats`, and the size of what it wrote. */
static int bench_row(const char *what, const char *format, const char *out_path, int repeats)
{
    char *args = g_strdup_printf(format, models_dir(), out_path);
    char *command = g_strdup_printf("%s/zplan %s", ZP_BUILD_DIR, args);
    char **argv = NULL;
    Cost best = {G_MAXDOUBLE, G_MAXDOUBLE, 0};
    gboolean ok = g_shell_parse_argv(command, NULL, &argv, NULL);
    for (int i = 0; i < repeats && ok; i++) {
        Cost c = {0};
        ok = run_child(argv, &c);
        best.cpu_s = MIN(best.cpu_s, c.cpu_s);
        best.rss_mib = MIN(best.rss_mib, c.rss_mib);
    }
    GStatBuf st;
    if (ok && g_stat(out_path, &st) == 0)
        best.file_mib = st.st_size / (1024.0 * 1024.0);
    if (ok)
        printf("%-40s %8.2f %9.1f %10.1f\n", what, best.cpu_s, best.rss_mib, best.file_mib);
    else
        fprintf(stderr, "bench_io: %s failed\n", command);
    g_strfreev(argv);
    g_free(command);
    g_free(args);
    return !ok;
}

/* Usage: bench_io [REPEATS] (default 2: each row takes seconds). */
int main(int argc, char **argv)
{
    const int repeats = argc > 1 ? atoi(argv[1]) : 2;
    if (repeats < 1) {
        fprintf(stderr, "bench_io: REPEATS must be at least 1\n");
        return 1;
    }
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) != 3)
        load[0] = load[1] = load[2] = -1;
    char *dir = g_dir_make_tmp("bench_io-XXXXXX", NULL);
    if (!dir) {
        fprintf(stderr, "bench_io: cannot make a temporary directory\n");
        return 1;
    }
    char *trace = g_build_filename(dir, "trace.json", NULL);
    char *html = g_build_filename(dir, "step.html", NULL);
    char *schedule = g_build_filename(dir, "schedule.json", NULL);
    char *none = g_build_filename(dir, "none", NULL);
    printf("Megatron 1T (pp 64 x tp 8 x dp 6, 512 micro-batches; the full schedule is 921,794 "
           "ops), each a zplan process, the least of %d (load %.2f %.2f %.2f)\n%-40s %8s %9s "
           "%10s\n",
           repeats, load[0], load[1], load[2], "command", "CPU s", "RSS MiB", "file MiB");
    int failed = bench_row("simulate --json", "simulate " PLAN_1T " --json%.0s", none, repeats);
    failed += bench_row("simulate --trace", "simulate " PLAN_1T " --trace %s", trace, repeats);
    failed += bench_row("report --html", "report " PLAN_1T " --html %s", html, repeats);
    failed += bench_row("schedule --out", "schedule " PLAN_1T " --out %s", schedule, repeats);
    /* The file schedule --out wrote, read back and simulated. */
    char *read_format =
        g_strdup_printf("simulate --schedule %s --cluster dgx-a100-80g --json%%.0s%%.0s", schedule);
    failed += bench_row("simulate --schedule (that file) --json", read_format, none, repeats);
    g_free(read_format);
    const char *const paths[] = {trace, html, schedule, none};
    for (size_t i = 0; i < G_N_ELEMENTS(paths); i++)
        g_remove(paths[i]);
    g_rmdir(dir);
    g_free(trace), g_free(html), g_free(schedule), g_free(none), g_free(dir);
    return failed ? 1 : 0;
}
