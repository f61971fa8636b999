/* Tests that nothing wrong passes in silence: a schedule that takes no time is refused, not
 * reported as inf and NaN; validate refuses a measurement it cannot compare; a ds_config that
 * leaves the batch, precision or stage unset says which defaults it took. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#define CORPUS ZP_DATA_DIR "/tests/fuzz/corpus"

static char *tmp_dir;

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
}

/* One line on stderr containing `expect`, exit 1, nothing on stdout. */
static void assert_refused(const char *args, const char *expect)
{
    TuRun r = tu_zplan(args);
    g_test_message("%s -> %d: %s", args, exit_status(&r), r.err);
    g_assert_cmpint(exit_status(&r), ==, 1);
    g_assert_nonnull(strstr(r.err, expect));
    g_assert_cmpint(strchr(r.err, '\n') - r.err, ==, (long)strlen(r.err) - 1);
    g_assert_cmpstr(r.out, ==, "");
    tu_free(&r);
}

static char *write_tmp(const char *name, const char *text)
{
    char *path = g_build_filename(tmp_dir, name, NULL);
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    return path;
}

#define SCHEDULE_HEAD                                                                         \
    "{\"format\": \"zplan-schedule-1\", \"world\": 2, \"groups\": [{\"name\": \"dp\", "        \
    "\"ranks\": 2, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 1, \"stride\": 1}], "         \
    "\"precision\": \"bf16\", \"state_bytes\": {\"params\": 1e9}, \"ops\": ["

/* No ops, or only an alloc and a free: the step takes no time, and samples/s and MFU would be
 * inf and NaN (main printed them and exited 0; --json failed as "could not serialise"). */
static void test_schedule_without_time(void)
{
    const char *files[] = {
        SCHEDULE_HEAD "]}",
        SCHEDULE_HEAD "{\"kind\": \"alloc\", \"category\": \"gathered_params\", \"bytes\": 64e6, "
                      "\"deps\": []}, {\"kind\": \"free\", \"category\": \"gathered_params\", "
                      "\"bytes\": 64e6, \"deps\": [0]}]}",
    };
    for (guint i = 0; i < G_N_ELEMENTS(files); i++) {
        char *name = g_strdup_printf("no-time-%u.json", i);
        char *path = write_tmp(name, files[i]);
        for (int json = 0; json <= 1; json++) {
            char *args = g_strdup_printf("simulate --schedule %s --cluster dgx-h100%s", path,
                                         json ? " --json" : "");
            assert_refused(args, "the step takes no time");
            g_free(args);
        }
        g_free(path), g_free(name);
    }
}

/* Zero FLOPs in a step that takes time (one all-gather): TFLOP/s and MFU are 0, every figure
 * finite, in the table and in JSON. */
static void test_schedule_zero_flops(void)
{
    char *path = write_tmp("comm-only.json",
                           SCHEDULE_HEAD "{\"kind\": \"collective\", \"op\": \"allgather\", "
                                         "\"group\": \"dp\", \"bytes\": 64e6, \"deps\": []}]}");
    char *args = g_strdup_printf("simulate --schedule %s --cluster dgx-h100", path);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_null(strstr(r.out, "inf"));
    g_assert_null(strstr(r.out, "nan"));
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("simulate --schedule %s --cluster dgx-h100 --json", path);
    json_t *root = tu_zplan_json(args);
    g_assert_cmpfloat(json_number_value(json_object_get(root, "mfu")), ==, 0);
    g_assert_true(isfinite(json_number_value(json_object_get(root, "samples_per_s"))));
    json_decref(root);
    g_free(args), g_free(path);
}

/* A measured file validate cannot compare is refused naming the field. */
static void test_validate_refuses(void)
{
    json_error_t jerr;
    json_t *good = json_load_file(CORPUS "/measured/measured-tiny.json", 0, &jerr);
    g_assert_nonnull(good);
    g_assert_cmpint(json_array_size(json_object_get(good, "ranks")), ==, 2);
    struct {
        const char *name, *expect;
    } cases[] = {
        {"top-null", "key \"step_time_s\" is null"},
        {"rank-null", "ranks[1]: key \"step_time_s\" is null"},
        {"rank-missing", "ranks[1]: missing key \"step_time_s\""},
        {"duplicate", "ranks[1]: key \"rank\" = 0 is listed twice"},
        {"world", "key \"world\" = 4 but \"ranks\" lists 2 ranks"},
    };
    for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
        json_t *m = json_deep_copy(good);
        json_t *rank1 = json_array_get(json_object_get(m, "ranks"), 1);
        switch (i) {
        case 0: json_object_set_new(m, "step_time_s", json_null()); break;
        case 1: json_object_set_new(rank1, "step_time_s", json_null()); break;
        case 2: json_object_del(rank1, "step_time_s"); break;
        case 3: json_object_set_new(rank1, "rank", json_integer(0)); break;
        default: json_object_set_new(m, "world", json_integer(4)); break;
        }
        char *path = g_strdup_printf("%s/%s.json", tmp_dir, cases[i].name);
        g_assert_cmpint(json_dump_file(m, path, 0), ==, 0);
        for (int json = 0; json <= 1; json++) {
            char *args = g_strdup_printf("validate " CORPUS "/predicted/predicted-tiny.json %s%s",
                                         path, json ? " --json" : "");
            assert_refused(args, cases[i].expect);
            g_free(args);
        }
        json_decref(m);
        g_free(path);
    }
    /* The shipped measurement itself still validates. */
    TuRun r = tu_zplan("validate " CORPUS "/predicted/predicted-tiny.json " CORPUS
                       "/measured/measured-tiny.json");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r);
    json_decref(good);
}

/* `{}` is simulated as stage 0, fp32, micro-batch 1 as DeepSpeed would, but says so: on stderr
 * and, with --json, under defaults_taken; a config that sets all of it takes none. */
static void test_dsconfig_defaults_said(void)
{
    struct {
        const char *config;
        int n_taken;
    } cases[] = {
        {"{}", 4},
        {"{\"train_micro_batch_size_per_gpu\": 2}", 3},
        {"{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2, \"bf16\": "
         "{\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}}", 0},
    };
    for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *name = g_strdup_printf("ds-%u.json", i);
        char *path = write_tmp(name, cases[i].config);
        char *args = g_strdup_printf("simulate --model tiny --cluster dgx-h100 --gpus 8 "
                                     "--ds-config %s", path);
        TuRun r = tu_zplan(args);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        const char *note = strstr(r.err, "took the defaults");
        if (cases[i].n_taken) {
            g_assert_nonnull(note);
            g_assert_nonnull(strstr(r.err, path));
        } else {
            g_assert_null(note);
        }
        if (i == 0) {
            g_assert_nonnull(strstr(r.err, "zero_optimization.stage = 0"));
            g_assert_nonnull(strstr(r.err, "precision fp32"));
            g_assert_nonnull(strstr(r.err, "train_micro_batch_size_per_gpu = 1"));
        }
        tu_free(&r);
        char *json_args = g_strconcat(args, " --json", NULL);
        json_t *root = tu_zplan_json(json_args);
        json_t *taken = json_object_get(root, "defaults_taken");
        g_assert_true(json_is_array(taken));
        g_assert_cmpint(json_array_size(taken), ==, cases[i].n_taken);
        json_decref(root);
        g_free(json_args), g_free(args), g_free(path), g_free(name);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zplan-no-silence-XXXXXX", NULL);
    g_test_add_func("/no-silence/schedule-without-time", test_schedule_without_time);
    g_test_add_func("/no-silence/schedule-zero-flops", test_schedule_zero_flops);
    g_test_add_func("/no-silence/validate-refuses", test_validate_refuses);
    g_test_add_func("/no-silence/dsconfig-defaults-said", test_dsconfig_defaults_said);
    const int status = g_test_run();
    char *cmd = g_strdup_printf("rm -rf %s", tmp_dir);
    TuRun r = tu_run(cmd, NULL);
    tu_free(&r);
    g_free(cmd);
    g_free(tmp_dir);
    return status;
}
