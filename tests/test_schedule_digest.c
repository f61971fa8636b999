/* test_schedule_digest: a schedule file is held to what it claims — each unit's forward and
 * backward once per micro-step and one optimizer op a step (zplan and zreal refuse a repeat,
 * naming the op), and the ops zplan wrote (an edited file is refused by its digest unless
 * --schedule-edited; one without a digest runs with a note). */
#include "testutil.h"
#include "zp_schedcheck.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <sys/wait.h>

#ifndef ZP_BUILD_DIR
#define ZP_BUILD_DIR "build"
#endif

static char *tmp_dir;

static char *tmp_path(const char *name)
{
    return g_build_filename(tmp_dir, name, NULL);
}

/* `zplan schedule` of the tiny GPT-2 on 2 ranks with `flags`, into TMP/name. */
static char *write_schedule(const char *name, const char *flags)
{
    char *path = tmp_path(name);
    char *args = g_strdup_printf("schedule --model tiny --cluster dgx-a100-80g --gpus 2 "
                                 "--micro-batch 2 --precision bf16 --no-dropout %s --out %s", flags, path);
    TuRun r = tu_zplan(args);
    if (!g_spawn_check_wait_status(r.status, NULL))
        g_printerr("zplan %s: %s", args, r.err);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r);
    g_free(args);
    return path;
}

/* The first compute op `op` of the file's ops. */
static size_t find_compute(json_t *ops, const char *op)
{
    for (size_t i = 0; i < json_array_size(ops); i++) {
        json_t *o = json_array_get(ops, i);
        if (strcmp(json_string_value(json_object_get(o, "kind")), "compute") == 0 &&
            strcmp(json_string_value(json_object_get(o, "op")), op) == 0)
            return i;
    }
    g_assert_not_reached();
}

/* The file at `from`, edited, written to TMP/name: op `dup` (a compute op's name, or NULL)
 * repeated right after itself (later dependencies renumbered), the first op with flops made
 * twice as costly when `flops`, and its digest removed when `strip`. Returns the path and,
 * in *at, the repeat's index. */
static char *edit(const char *from, const char *name, const char *dup, gboolean flops,
                  gboolean strip, size_t *at)
{
    json_t *root = json_load_file(from, 0, NULL);
    g_assert_nonnull(root);
    json_t *ops = json_object_get(root, "ops");
    if (dup) {
        const size_t i = find_compute(ops, dup);
        for (size_t k = i + 1; k < json_array_size(ops); k++) {
            json_t *deps = json_object_get(json_array_get(ops, k), "deps");
            for (size_t d = 0; d < json_array_size(deps); d++) {
                const json_int_t v = json_integer_value(json_array_get(deps, d));
                if (v > (json_int_t)i)
                    json_array_set_new(deps, d, json_integer(v + 1));
            }
        }
        json_array_insert_new(ops, i + 1, json_deep_copy(json_array_get(ops, i)));
        *at = i + 1;
    }
    for (size_t k = 0; flops && k < json_array_size(ops); k++) {
        json_t *o = json_array_get(ops, k);
        const double f = json_number_value(json_object_get(o, "flops"));
        if (f > 0) {
            json_object_set_new(o, "flops", json_real(2 * f));
            break;
        }
    }
    if (strip)
        g_assert_cmpint(json_object_del(root, "digest"), ==, 0);
    char *path = tmp_path(name);
    g_assert_cmpint(json_dump_file(root, path, JSON_INDENT(1)), ==, 0);
    json_decref(root);
    return path;
}

/* `zreal --schedule path FLAGS --steps 1`, one process playing one of 2 ranks (--emulate 2;
 * n > 0: under mpirun -np n instead). */
static TuRun zreal(int n, const char *path, const char *flags)
{
    char *args = g_strdup_printf("--schedule %s --steps 1 %s", path, flags);
    TuRun r;
    if (n > 0) {
        r = tu_zreal_mpirun(n, args, NULL);
    } else {
        char *command = g_strdup_printf("%s/zreal %s --emulate 2", ZP_BUILD_DIR, args);
        char **envp = g_environ_setenv(g_get_environ(), "OPENBLAS_NUM_THREADS", "1", TRUE);
        r = tu_run(command, envp);
        g_strfreev(envp);
        g_free(command);
    }
    g_test_message("zreal %s: exit %d: %s", args,
                   WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1, r.err);
    g_free(args);
    return r;
}

static void assert_failed(const TuRun *r)
{
    g_assert_true(WIFEXITED(r->status));
    g_assert_cmpint(WEXITSTATUS(r->status), >, 0);
    g_assert_cmpint(WEXITSTATUS(r->status), <, 128);
}

/* The op's line from zreal (every copy of the file refused alike) and from zplan simulate. */
static void assert_refused_naming(int n, const char *path, size_t at, const char *expected)
{
    char *op = g_strdup_printf("%s: ops[%zu]: key \"op\" %s", path, at, expected);
    /* Refused by its semantics, digest or not, told it was edited or not. */
    TuRun r = zreal(n, path, "--schedule-edited");
    assert_failed(&r);
    g_assert_nonnull(strstr(r.err, op));
    g_assert_null(strstr(r.err, "step   0"));
    tu_free(&r);
    char *args = g_strdup_printf("simulate --schedule %s --cluster dgx-a100-80g", path);
    r = tu_zplan(args);
    assert_failed(&r);
    g_assert_nonnull(strstr(r.err, op));
    g_assert_cmpstr(r.out, ==, "");
    tu_free(&r);
    g_free(args);
    g_free(op);
}

/* The runs: a second optimizer op applied Adam twice (loss 3.9206 for 3.9298) and a
 * second forward of a block gave 4.1916 for 4.1996, and zreal exited 0. */
static void test_repeats_refused(void)
{
    char *sched = write_schedule("stage0.json", "--stage 0 --impl paper");
    size_t at = 0;
    char *opt = edit(sched, "dup-optimizer.json", "optimizer", FALSE, TRUE, &at);
    assert_refused_naming(2, opt, at, "optimizer: a second optimizer step");
    char *fwd = edit(sched, "dup-block-fwd.json", "block_fwd", FALSE, FALSE, &at);
    assert_refused_naming(0, fwd, at, "block_fwd: unit 1 ran it already in micro-step 0");
    char *bwd = edit(sched, "dup-block-bwd.json", "block_bwd", FALSE, TRUE, &at);
    assert_refused_naming(0, bwd, at, "block_bwd: unit 2 ran it already in micro-step 0");
    g_remove(opt), g_remove(fwd), g_remove(bwd), g_remove(sched);
    g_free(opt), g_free(fwd), g_free(bwd), g_free(sched);
}

/* An edit every check accepts (a cost zreal never reads) still shows in the digest. */
static void test_edited_refused_by_digest(void)
{
    char *sched = write_schedule("stage2.json", "--stage 2 --impl paper");
    TuRun r = zreal(0, sched, "");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_null(strstr(r.err, "note:")); /* zplan's own file: nothing to say */
    tu_free(&r);
    char *edited = edit(sched, "edited.json", NULL, TRUE, FALSE, NULL);
    r = zreal(0, edited, "");
    assert_failed(&r);
    g_assert_nonnull(strstr(r.err, "key \"digest\": its ops are not the ones zplan wrote"));
    g_assert_null(strstr(r.err, "step   0"));
    tu_free(&r);
    r = zreal(0, edited, "--schedule-edited");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "was edited (--schedule-edited)"));
    g_assert_nonnull(strstr(r.err, "step   0"));
    tu_free(&r);
    /* No digest at all (older files, hand-written ones): run, with a note saying so. */
    char *bare = edit(sched, "bare.json", NULL, FALSE, TRUE, NULL);
    r = zreal(0, bare, "");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "has no digest"));
    tu_free(&r);
    g_remove(edited), g_remove(bare), g_remove(sched);
    g_free(edited), g_free(bare), g_free(sched);
}

/* Every schedule zplan writes keeps the step's semantics: zplan simulate --schedule reads
 * each back through the same check. */
static void test_written_schedules_pass(void)
{
    static const char *const flags[] = {
        "--stage 0 --impl deepspeed --grad-accum 2",
        "--stage 2 --impl fsdp --checkpoint",
        "--stage 2 --impl deepspeed --checkpoint --grad-accum 3",
        "--stage 3 --impl deepspeed --checkpoint --grad-accum 2",
        "--stage 3 --impl fsdp --grad-accum 2",
        "--stage 3 --impl paper --checkpoint --grad-accum 2",
        "--stage 2 --impl paper --offload-optimizer cpu",
        "--stage 3 --impl deepspeed --offload-optimizer cpu --offload-param cpu",
        "--stage 3 --impl deepspeed --quantized-weights --quantized-gradients",
    };
    for (size_t i = 0; i < G_N_ELEMENTS(flags); i++) {
        char *sched = write_schedule("written.json", flags[i]);
        char *args = g_strdup_printf("simulate --schedule %s --cluster dgx-a100-80g", sched);
        TuRun r = tu_zplan(args);
        if (!g_spawn_check_wait_status(r.status, NULL))
            g_printerr("%s: %s", flags[i], r.err);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        tu_free(&r);
        g_remove(sched);
        g_free(args);
        g_free(sched);
    }
}

/* Pipelines (whose files simulate --schedule does not read) keep it too, stage by stage:
 * 1F1B, GPipe and interleaved with 2 chunks a stage, each stage one optimizer op. */
static void test_pipelines_pass(void)
{
    ZpModel m = tu_load_model("tiny");
    m.layers = 4; /* a block for each of 2 stages x 2 chunks */
    for (int k = 0; k < ZP_PIPE_N; k++) {
        ZpPlan p;
        zp_plan_defaults(&p, 1, 1, 1);
        p.pipe.stages = 2;
        p.pipe.schedule = (ZpPipeSchedule)k;
        p.pipe.virtual_stages = k == ZP_PIPE_INTERLEAVED ? 2 : 1;
        p.grad_accum = 4;
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        g_assert_true(zp_schedcheck_step(s, "built", &error));
        g_assert_no_error(error);
        zp_sched_free(s);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zplan-digest-XXXXXX", NULL);
    g_assert_nonnull(tmp_dir);
    g_test_add_func("/schedule/repeats-refused", test_repeats_refused);
    g_test_add_func("/schedule/edited-refused-by-digest", test_edited_refused_by_digest);
    g_test_add_func("/schedule/written-schedules-pass", test_written_schedules_pass);
    g_test_add_func("/schedule/pipelines-pass", test_pipelines_pass);
    const int rc = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return rc;
}
