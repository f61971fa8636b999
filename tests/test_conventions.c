/* test_conventions: zplan's command-line conventions (issue 39 item 7): exit statuses (0 an
 * answer, 1 bad input or usage, 2 does not fit, 3 validate over --tolerance), lower-case size
 * suffixes, and "did you mean" for commands, flags, models, clusters and values. */
#include "zp_util.h"

#include "testutil.h"

#include <glib/gstdio.h>
#include <string.h>
#include <sys/wait.h>

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

/* Usage errors are bad input (1), never "does not fit" (2), which they used to share. */
static void test_exit_statuses(void)
{
    const struct {
        const char *args;
        int status;
    } cases[] = {
        {"", 1},
        {"frobnicate", 1},
        {"memory --gpus 8", 1},
        {"memory --model tiny --gpus 2", 0},
        {"memory --model gpt3-175b --cluster dgx-a100-80g --gpus 8", 2},
        {"--help", 0},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        TuRun r = tu_zplan(cases[i].args);
        g_test_message("zplan %s -> %d", cases[i].args, exit_status(&r));
        g_assert_cmpint(exit_status(&r), ==, cases[i].status);
        tu_free(&r);
    }
    /* --help documents them, and the defaults. */
    TuRun r = tu_zplan("--help");
    g_assert_nonnull(strstr(r.out, "Exit status: 0 an answer, 1 bad input or usage, 2 does not "
                                   "fit, 3 validate over --tolerance."));
    g_assert_nonnull(strstr(r.out, "\nDefaults (what a flag left out means):\n  --seq "));
    tu_free(&r);
}

/* 7b and 8k as well as 7B and 8K; a mixed case (80Gib) is still refused. */
static void test_lower_case_suffixes(void)
{
    const struct {
        const char *text;
        ZpSizeUnit unit;
        double value;
    } good[] = {
        {"7b", ZP_SIZE_COUNT, 7e9},  {"8k", ZP_SIZE_COUNT, 8e3},    {"1t", ZP_SIZE_COUNT, 1e12},
        {"80gb", ZP_SIZE_BYTES, 80e9}, {"80gib", ZP_SIZE_BYTES, 80 * 0x1p30},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(good); i++) {
        double v = 0;
        GError *error = NULL;
        g_assert_true(zp_parse_size(good[i].text, "--x", good[i].unit, 1, 1e15, TRUE, &v, &error));
        g_assert_no_error(error);
        g_assert_cmpfloat(v, ==, good[i].value);
    }
    double v = 0;
    GError *error = NULL;
    g_assert_false(zp_parse_size("80Gib", "--x", ZP_SIZE_BYTES, 1, 1e15, TRUE, &v, &error));
    g_clear_error(&error);
    TuRun r = tu_zplan("memory --params 7b --gpus 64 --json");
    g_assert_cmpint(exit_status(&r), ==, 0);
    g_assert_nonnull(strstr(r.out, "\"params\": 7000000000"));
    tu_free(&r);
}

/* One line naming what was wrong, then the closest thing that exists. */
static void test_did_you_mean(void)
{
    const struct {
        const char *args, *suggestion;
    } cases[] = {
        {"memry --model tiny --gpus 2", "zplan: unknown command 'memry' (see zplan --help). "
                                        "Did you mean 'memory'?\n"},
        {"memory --model tiny --gpu 2", "Unknown option --gpu. Did you mean '--gpus'?\n"},
        {"plan --model tiny --cluster dgx-h100 --gpus 2 --globl-batch 8",
         "Did you mean '--global-batch'?\n"},
        {"memory --model gpt2-124n --gpus 2", "Did you mean 'gpt2-124m'?\n"},
        {"memory --model llama-3-8b --gpus 2", "Did you mean 'hf/llama-3-8b'?\n"},
        {"memory --model tiny --gpus 2 --cluster dgx-h10", "Did you mean 'dgx-h100'?\n"},
        {"memory --model tiny --gpus 2 --attention eagre", "Did you mean 'eager'?\n"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        TuRun r = tu_zplan(cases[i].args);
        g_test_message("zplan %s -> %s", cases[i].args, r.err);
        g_assert_cmpint(exit_status(&r), ==, 1);
        g_assert_true(g_str_has_suffix(r.err, cases[i].suggestion));
        g_assert_null(strchr(r.err, '\n') + 1 < r.err + strlen(r.err) ? "two lines" : NULL);
        tu_free(&r);
    }
    /* Nothing close: no guess. */
    TuRun r = tu_zplan("frobnicate");
    g_assert_null(strstr(r.err, "Did you mean"));
    tu_free(&r);
    const char *names[] = {"memory", "maxmodel"};
    g_assert_cmpstr(zp_closest_name("maxmodle", names, 2), ==, "maxmodel");
    g_assert_null(zp_closest_name("memory", names, 2)); /* itself is no suggestion */
    g_assert_null(zp_closest_name("zzzzzz", names, 2));
}

/* validate exits 3 when a quantity misses by more than --tolerance (it exited 0 at +358%), says
 * which, and prints figures as people read them (1.062 MB, not 1.06189e+06). */
static void test_validate_tolerance(void)
{
    const char *files = ZP_DATA_DIR "/tests/fuzz/corpus/predicted/predicted-tiny.json "
                        ZP_DATA_DIR "/tests/fuzz/corpus/measured/measured-tiny.json";
    char *args = g_strdup_printf("validate %s --tolerance 10%%", files);
    TuRun r = tu_zplan(args);
    g_assert_cmpint(exit_status(&r), ==, 3);
    g_assert_nonnull(strstr(r.out, "\nOver the 10% tolerance: "));
    g_assert_nonnull(strstr(r.out, "  model states                               1.062 MB"));
    g_assert_null(strstr(r.out, "e+0"));
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("validate %s --tolerance 1e6 --json", files);
    r = tu_zplan(args);
    g_assert_cmpint(exit_status(&r), ==, 0);
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("validate %s --tolerance ten", files);
    r = tu_zplan(args);
    g_assert_cmpint(exit_status(&r), ==, 1);
    g_assert_nonnull(strstr(r.err, "--tolerance: 'ten' is not a number"));
    tu_free(&r);
    g_free(args);
}

/* A DeepSpeed config's "auto" values are said as resolved in the text (they were only in
 * --json), and qgZ on one node, which DeepSpeed skips, is said rather than dropped silently. */
static void test_ds_config_said(void)
{
    char *dir = g_dir_make_tmp("zplan-conv-XXXXXX", NULL);
    char *path = g_build_filename(dir, "ds.json", NULL);
    g_assert_true(g_file_set_contents(
        path,
        "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", "
        "\"gradient_accumulation_steps\": \"auto\", \"bf16\": {\"enabled\": \"auto\"}, "
        "\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\", "
        "\"zero_quantized_gradients\": true}}",
        -1, NULL));
    for (int gpus = 8; gpus <= 16; gpus += 8) {
        char *args = g_strdup_printf("simulate --model hf/llama-3-8b --cluster dgx-h100 --gpus %d "
                                     "--micro-batch 1 --ds-config %s", gpus, path);
        TuRun r = tu_zplan(args);
        g_test_message("%s", r.out);
        g_assert_cmpint(exit_status(&r), ==, 0);
        char *resolved = g_strdup_printf("\n%s's \"auto\" resolved as the Hugging Face Trainer "
                                         "would (its rules, the flags and the model): "
                                         "train_micro_batch_size_per_gpu 1, "
                                         "gradient_accumulation_steps 1, train_batch_size %d, "
                                         "reduce_bucket_size 16,777,216, bf16.enabled true.\n",
                                         path, gpus);
        g_assert_nonnull(strstr(r.out, resolved));
        const char *qgz = "\nzero_quantized_gradients (qgZ) does nothing here: ";
        if (gpus == 8)
            g_assert_nonnull(strstr(r.out, qgz));
        else
            g_assert_null(strstr(r.out, qgz)); /* two nodes: it runs */
        g_free(resolved);
        tu_free(&r);
        g_free(args);
    }
    g_remove(path);
    g_rmdir(dir);
    g_free(path), g_free(dir);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/conventions/exit-statuses", test_exit_statuses);
    g_test_add_func("/conventions/lower-case-suffixes", test_lower_case_suffixes);
    g_test_add_func("/conventions/did-you-mean", test_did_you_mean);
    g_test_add_func("/conventions/validate-tolerance", test_validate_tolerance);
    g_test_add_func("/conventions/ds-config-said", test_ds_config_said);
    return g_test_run();
}
