/* test_real_watch: zreal's whole-process watchdog under mpirun — a rank stopped (SIGSTOP) before
 * MPI_Init, inside MPI_Finalize or mid-run ends the job within the timeout and a little more,
 * with a non-zero status below 128 and one line, from one rank, naming the stopped rank. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <string.h>
#include <sys/wait.h>

#ifndef ZP_BUILD_DIR
#define ZP_BUILD_DIR "build"
#endif

#define RANKS 4
#define TIMEOUT_S 5
/* The bound: the job ends within the timeout and this much more (mpirun's start and
 * its teardown of the other ranks). */
#define SLACK_S 5
/* A hung job is killed after this long, so that a regression fails instead of hanging. */
#define HANG_KILL_S 60

static char *tmp_dir;

typedef struct {
    int status;
    double elapsed_s;
    char *err;
} Ended;

/* `mpirun -np RANKS zreal ARGS` with ZREAL_COMM_TIMEOUT_S=TIMEOUT_S and ZREAL_TEST_STOP_AT =
 * stop_at (NULL: unset), killed after HANG_KILL_S. */
static Ended run_zreal(const char *stop_at, const char *args)
{
    char *command = g_strdup_printf("timeout -k 5 %d mpirun --oversubscribe -np %d %s/zreal %s",
                                    HANG_KILL_S, RANKS, ZP_BUILD_DIR, args);
    char **envp = tu_mpirun_environ();
    char timeout[16];
    g_snprintf(timeout, sizeof timeout, "%d", TIMEOUT_S);
    envp = g_environ_setenv(envp, "ZREAL_COMM_TIMEOUT_S", timeout, TRUE);
    envp = stop_at ? g_environ_setenv(envp, "ZREAL_TEST_STOP_AT", stop_at, TRUE)
                   : g_environ_unsetenv(envp, "ZREAL_TEST_STOP_AT");
    const gint64 start = g_get_monotonic_time();
    TuRun r = tu_run(command, envp);
    Ended e = {r.status, (double)(g_get_monotonic_time() - start) / 1e6, r.err};
    g_test_message("ZREAL_TEST_STOP_AT=%s zreal %s: %.1f s, exit %d:\n%s", stop_at ? stop_at : "",
                   args, e.elapsed_s, WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1, r.err);
    g_free(r.out);
    g_strfreev(envp);
    g_free(command);
    return e;
}

static int count_lines(const char *text, const char *needle)
{
    int n = 0;
    for (const char *at = text; (at = strstr(at, needle)); at += strlen(needle))
        n++;
    return n;
}

/* The job ended in time, failed below 128, and one line, from one rank, names `expected`. */
static void assert_ended_naming(const Ended *e, const char *expected)
{
    g_assert_true(WIFEXITED(e->status));
    g_assert_cmpint(WEXITSTATUS(e->status), >, 0);
    g_assert_cmpint(WEXITSTATUS(e->status), <, 128);
    g_assert_cmpfloat(e->elapsed_s, <, TIMEOUT_S + SLACK_S);
    g_assert_cmpint(count_lines(e->err, "zreal rank "), ==, 1);
    g_assert_nonnull(strstr(e->err, expected));
}

/* Rank 1 stops before MPI_Init: its peers wait inside MPI_Init, where no collective deadline
 * reaches; before the watchdog the job hung forever. */
static void test_stopped_in_init(void)
{
    Ended e = run_zreal("init:1", "--model tiny --steps 1");
    assert_ended_naming(&e, "rank 1 stopped answering before MPI_Init returned");
    g_free(e.err);
}

/* Rank 2 stops on its way into MPI_Finalize, after rank 0 wrote measured.json. */
static void test_stopped_in_finalize(void)
{
    char *path = g_build_filename(tmp_dir, "finalize.json", NULL);
    char *args = g_strdup_printf("--model tiny --steps 1 --out %s", path);
    Ended e = run_zreal("finalize:2", args);
    assert_ended_naming(&e, "rank 2 stopped answering inside MPI_Finalize");
    g_assert_true(g_file_test(path, G_FILE_TEST_EXISTS)); /* the stop came after the run */
    g_remove(path);
    g_free(e.err);
    g_free(args);
    g_free(path);
}

/* Rank 2 stops at step 3: every peer's collective times out, and one of them names rank 2
 * (before, all of them printed the same line about "a peer"). */
static void test_stopped_mid_run(void)
{
    Ended e = run_zreal(NULL, "--model tiny --stage 2 --steps 100000 --fault-rank 2 "
                              "--fault-step 3 --fault-action stop");
    assert_ended_naming(&e, "rank 2 stopped answering");
    g_assert_nonnull(strstr(e.err, "did not complete within 5 s (ZREAL_COMM_TIMEOUT_S)"));
    g_free(e.err);
}

/* The test hook is checked like any input: a malformed value is refused, naming it. */
static void test_malformed_hook(void)
{
    Ended e = run_zreal("start:1", "--model tiny --steps 1");
    g_assert_true(WIFEXITED(e.status));
    g_assert_cmpint(WEXITSTATUS(e.status), >, 0);
    g_assert_cmpint(WEXITSTATUS(e.status), <, 128);
    g_assert_nonnull(strstr(e.err, "ZREAL_TEST_STOP_AT: 'start:1' is not init:RANK or "
                                   "finalize:RANK"));
    g_free(e.err);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tu_stopped_teardown();
    tmp_dir = g_dir_make_tmp("zreal-watch-XXXXXX", NULL);
    g_assert_nonnull(tmp_dir);
    g_test_add_func("/zreal/watch/stopped-in-init", test_stopped_in_init);
    g_test_add_func("/zreal/watch/stopped-in-finalize", test_stopped_in_finalize);
    g_test_add_func("/zreal/watch/stopped-mid-run", test_stopped_mid_run);
    g_test_add_func("/zreal/watch/malformed-hook", test_malformed_hook);
    const int rc = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return rc;
}
