/* test_real_faults: zreal when things go wrong: a killed rank takes the job down with a
 * message naming it and no half-written output, a stopped rank times out, a slow step is
 * flagged, bad input gets one line, and the CUDA backend without a device says so. */
#include "real_zero_common.h"

static void test_killed_rank(void)
{
    char *path = g_strdup_printf("%s/killed.json", tmp_dir);
    char *args = g_strdup_printf("--model tiny --stage 3 --steps 100000 --fault-rank 2 "
                                 "--fault-step 3 --out %s",
                                 path);
    char *err = NULL;
    const gint64 start = g_get_monotonic_time();
    int status = mpirun(4, args, &err);
    const double elapsed_s = (double)(g_get_monotonic_time() - start) / 1e6;
    g_assert_false(g_spawn_check_wait_status(status, NULL));
    g_assert_cmpfloat(elapsed_s, <, 30); /* the issue's bound, not a timing benchmark */
    g_assert_nonnull(strstr(err, "rank 2"));
    g_assert_false(g_file_test(path, G_FILE_TEST_EXISTS));
    g_free(err);
    g_free(args);
    g_free(path);
}

/* A rank stopped with SIGSTOP (kill -STOP) mid-run: its peers' collectives time out after
 * ZREAL_COMM_TIMEOUT_S, one of them names itself, the op and the collective in one line, and
 * the job ends with a non-zero status and no measured.json. */
static void test_stopped_rank(void)
{
    char *path = g_strdup_printf("%s/stopped.json", tmp_dir);
    char *args = g_strdup_printf("--model tiny --stage 2 --steps 100000 --fault-rank 1 "
                                 "--fault-step 3 --fault-action stop --out %s", path);
    char *err = NULL;
    const gint64 start = g_get_monotonic_time();
    int status = mpirun_timeout(3, args, "2", &err);
    const double elapsed_s = (double)(g_get_monotonic_time() - start) / 1e6;
    g_test_message("stopped rank: %.1f s, status %d: %s", elapsed_s, status, err);
    g_assert_false(g_spawn_check_wait_status(status, NULL));
    g_assert_true(WIFEXITED(status) && WEXITSTATUS(status) > 0 && WEXITSTATUS(status) < 128);
    g_assert_cmpfloat(elapsed_s, >=, 2);
    g_assert_cmpfloat(elapsed_s, <, 30);
    g_assert_nonnull(strstr(err, "did not complete within 2 s (ZREAL_COMM_TIMEOUT_S)"));
    g_assert_true(g_regex_match_simple("zreal rank [02]: op [0-9]+ \\(collective [a-z_]+, unit",
                                       err, 0, 0));
    g_assert_false(g_file_test(path, G_FILE_TEST_EXISTS));
    g_free(err);
    g_free(args);
    g_free(path);
}

/* A step 2 s slower than the others (a rank slept): flagged in measured.json and on stderr;
 * the other steps of the tiny model take milliseconds. On a loaded machine another step can
 * pass the factor too (a make test beside helpers' builds flagged two): step 5 must be among
 * those flagged, and the only one 2 s long. */
static void test_slow_step_flagged(void)
{
    char *path = g_strdup_printf("%s/slow.json", tmp_dir);
    char *args = g_strdup_printf("--model tiny --stage 1 --steps 8 --fault-rank 1 "
                                 "--fault-step 5 --fault-action sleep --out %s", path);
    char *err = NULL;
    int status = mpirun(2, args, &err);
    g_assert_true(g_spawn_check_wait_status(status, NULL));
    g_assert_nonnull(strstr(err, "zreal: warning: step 5 took"));
    json_t *root = json_load_file(path, 0, NULL);
    json_t *slow = json_object_get(root, "slow_steps");
    g_assert_cmpuint(json_array_size(slow), >=, 1);
    int long_steps = 0;
    for (size_t k = 0; k < json_array_size(slow); k++) {
        const json_t *step = json_array_get(slow, k);
        const double time_s = json_number_value(json_object_get(step, "time_s"));
        const json_int_t index = json_integer_value(json_object_get(step, "step"));
        g_test_message("flagged: step %d, %.3f s", (int)index, time_s);
        if (index == 5)
            g_assert_cmpfloat(time_s, >=, 2);
        long_steps += time_s >= 2;
        if (time_s >= 2)
            g_assert_cmpint(index, ==, 5);
    }
    g_assert_cmpint(long_steps, ==, 1);
    json_decref(root);
    g_free(err);
    g_free(args);
    g_free(path);
}

static void test_bad_input(void)
{
    const struct {
        const char *args, *message;
    } cases[] = {
        {"--model tiny --stage 4", "--stage: '4' is outside"},
        {"--model nosuch", "unknown model 'nosuch'"},
        {"--stage 1", "give one of --model and --schedule"},
        {"--model tiny --micro-batch 0", "--micro-batch: '0' is outside"},
        {"--model tiny --reduce-bucket-size -5", "--reduce-bucket-size: '-5' is outside"},
        {"--model tiny --rank 1", "--rank needs --emulate N"},
        {"--model tiny --emulate 4 --rank 4", "--rank: '4' is outside [0, 3]"},
        {"--model tiny --emulate 0", "--emulate: '0' is outside"},
        {"--model tiny --steps -1", "--steps: '-1' is outside"},
        {"--model tiny --backend gpu", "--backend: 'gpu' is neither cpu nor cuda"},
        {"--model tiny --offload-optimizer disk", "--offload-optimizer: unknown value 'disk'"},
        {"--model tiny --offload-optimizer cpu",
         "--offload-optimizer: offload_optimizer: needs ZeRO stage 1, 2 or 3"},
        {"--model tiny --stage 3 --persistence-threshold 0 --offload-optimizer nvme",
         "--nvme-path: NVMe offload needs a directory for its swap files"},
        {"--model tiny --stage 3 --persistence-threshold 0 --offload-optimizer nvme "
         "--nvme-path /nonexistent/zreal", "--nvme-path: cannot create /nonexistent/zreal/"},
        {"--model tiny --stage 3 --offload-optimizer cpu --offload-param cpu",
         "zreal offloads parameters without persistent ones (--persistence-threshold 0)"},
        {"--model tiny --stage 3 --persistence-threshold 0 --offload-param cpu",
         "zreal offloads parameters together with the optimizer (--offload-optimizer)"},
        {"--model tiny --stage 3 --impl deepspeed --quantized-gradients --offload-optimizer cpu "
         "--persistence-threshold 0 --steps 1",
         "zreal executes DeepSpeed's qgZ (zero_quantized_gradients) without offload"},
        {"--model tiny --mp 2", "--mp 2 x pipeline stages 1 must divide the 1 ranks"},
        {"--model tiny --mp 2 --emulate 2",
         "tensor parallelism (mp 2) and pipelines (pp 1) run over MPI ranks"},
    };
    /* Each of these ranks fails on its own, at once: the teardown has nothing to stop, and
     * tu_mpirun_environ's (no pause) holds here, not this file's for stopped ranks (2 s a
     * case, 42 s in all). */
    g_unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *err = NULL;
        int status = mpirun(1, cases[i].args, &err);
        g_assert_false(g_spawn_check_wait_status(status, NULL));
        g_assert_nonnull(strstr(err, cases[i].message));
        g_free(err);
    }
    char *err = NULL;
    g_assert_false(g_spawn_check_wait_status(mpirun(2, "--model tiny --emulate 2", &err), NULL));
    g_assert_nonnull(strstr(err, "--emulate runs as one process; start it without mpirun"));
    g_free(err);
    /* A refusal every rank reaches alike (the plan, what the engine executes) is said once,
     * not once a rank */
    static const char *const alike[] = {
        "--model tiny --steps 1 --impl megatron --stage 1 --offload-optimizer cpu",
        "--model tiny --steps 1 --impl fsdp --stage 3 --prefetch-bucket-size 10",
    };
    for (size_t i = 0; i < G_N_ELEMENTS(alike); i++) {
        g_assert_false(g_spawn_check_wait_status(mpirun(4, alike[i], &err), NULL));
        int lines = 0;
        for (const char *at = err; (at = strstr(at, "zreal rank")); at++)
            lines++;
        g_test_message("%s: %d line(s)", alike[i], lines);
        g_assert_cmpint(lines, ==, 1);
        g_free(err);
    }
    tu_stopped_teardown();
}

/* --backend cuda where no GPU can be used (CI has none; CUDA_VISIBLE_DEVICES=-1 hides any a
 * GPU machine has): one line naming the rank and why, and a non-zero exit. */
static void test_cuda_backend_without_device(void)
{
#ifdef ZP_HAVE_CUDA
    const char *reason = "zreal rank 0: --backend cuda: no CUDA device (cudaGetDeviceCount: ";
#else
    const char *reason = "zreal rank 0: --backend cuda: this zreal was built without CUDA";
#endif
    g_setenv("CUDA_VISIBLE_DEVICES", "-1", TRUE);
    char *err = NULL;
    int status = mpirun(1, "--model tiny --backend cuda --steps 1", &err);
    g_unsetenv("CUDA_VISIBLE_DEVICES");
    g_assert_false(g_spawn_check_wait_status(status, NULL));
    g_assert_nonnull(strstr(err, reason));
    int lines = 0;
    for (const char *at = err; (at = strstr(at, "zreal rank")); at++)
        lines++;
    g_assert_cmpint(lines, ==, 1);
    g_free(err);
}

/* A CPU rank maps none of CUDA's libraries (they cost each rank 77 ms of its start): zreal
 * does not link them, and opens libzcuda.so beside it for --backend cuda only; a zreal without
 * it there says so in one line. */
static void test_cuda_library_on_demand(void)
{
    char *out = NULL, *err = NULL;
    int status = 0;
    char *readelf[] = {"readelf", "-d", ZP_BUILD_DIR "/zreal", NULL};
    g_assert_true(g_spawn_sync(NULL, readelf, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, &out, &err,
                               &status, NULL));
    g_assert_true(g_spawn_check_wait_status(status, NULL));
    g_assert_nonnull(strstr(out, "(NEEDED)"));
    g_assert_null(strstr(out, "libcu"));
    g_assert_null(strstr(out, "libnccl"));
    g_free(out), g_free(err);

    char *moved = g_build_filename(tmp_dir, "zreal", NULL);
    char *bytes = NULL;
    gsize length = 0;
    g_assert_true(g_file_get_contents(ZP_BUILD_DIR "/zreal", &bytes, &length, NULL));
    g_assert_true(g_file_set_contents(moved, bytes, (gssize)length, NULL));
    g_assert_cmpint(g_chmod(moved, 0700), ==, 0);
    char *run[] = {moved, "--model", "tiny", "--backend", "cuda", "--emulate", "2", "--steps", "1",
                   NULL};
    g_assert_true(g_spawn_sync(NULL, run, NULL, 0, NULL, NULL, &out, &err, &status, NULL));
    g_assert_true(WIFEXITED(status) && WEXITSTATUS(status) > 0 && WEXITSTATUS(status) < 128);
#ifdef ZP_HAVE_CUDA
    g_assert_nonnull(strstr(err, "zreal rank 0: --backend cuda: cannot load libzcuda.so: "));
#else
    g_assert_nonnull(strstr(err, "zreal rank 0: --backend cuda: this zreal was built without "));
#endif
    g_assert_null(strchr(strchr(err, '\n') + 1, '\n')); /* one line */
    g_remove(moved);
    g_free(moved), g_free(bytes), g_free(out), g_free(err);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    real_zero_common_init();
    tu_stopped_teardown();
    g_test_add_func("/zreal/killed-rank", test_killed_rank);
    g_test_add_func("/zreal/stopped-rank", test_stopped_rank);
    g_test_add_func("/zreal/slow-step-flagged", test_slow_step_flagged);
    g_test_add_func("/zreal/bad-input", test_bad_input);
    g_test_add_func("/zreal/cuda-backend-without-device", test_cuda_backend_without_device);
    g_test_add_func("/zreal/cuda-library-on-demand", test_cuda_library_on_demand);
    return real_zero_common_run();
}
