/* test_defaults: the defaults a user would choose, stated in the first lines (issue 39 item 1):
 * the sequence at most 4096 unless --seq, the precision from config.json's torch_dtype where
 * the GPU has it, the cluster's attention kernel in every command, sweep included, and no
 * "Fits" for a --params model that has no activations. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <sys/wait.h>

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

static char *line(const char *text, int index)
{
    char **lines = g_strsplit(text, "\n", -1);
    char *out = g_strdup(index < (int)g_strv_length(lines) ? lines[index] : "");
    g_strfreev(lines);
    return out;
}

/* Llama 3.1's config says 131072 positions: memory used to judge a step at that length ("Does
 * not fit ... 589.5 GB short" on 8 H100s) without saying so. Now 4096, in the second line with
 * how to change it, and the verdict fits. */
static void test_seq_default(void)
{
    TuRun r = tu_zplan("memory --model hf/llama-3.1-8b --cluster dgx-h100 --gpus 8");
    g_test_message("%s", r.out);
    g_assert_cmpint(exit_status(&r), ==, 0);
    g_assert_true(g_str_has_prefix(r.out, "Fits: stage "));
    g_assert_nonnull(strstr(r.out, "sequence 4096, "));
    char *second = line(r.out, 1);
    g_assert_true(g_str_has_prefix(second, "Defaults: sequence 4096 (the smaller of "
                                           "llama-3.1-8b's maximum 131072 and 4096)"));
    g_assert_nonnull(strstr(second, "Change with --seq"));
    g_free(second);
    tu_free(&r);
    /* --seq still says otherwise, and 8k is 8192 tokens. */
    json_t *eight = tu_zplan_json("memory --model hf/llama-3.1-8b --gpus 8 --seq 8k --json");
    g_assert_cmpint(json_integer_value(json_object_get(eight, "seq_len")), ==, 8192);
    json_decref(eight);
    /* A model whose own sequence is shorter keeps it, and says whose it is. */
    r = tu_zplan("memory --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --checkpoint");
    g_assert_nonnull(strstr(r.out, "sequence 2048 (gpt3-175b's)"));
    tu_free(&r);
}

/* torch_dtype bfloat16 gives bf16 on an H100 and fp16 on a V100 (no bf16 tensor cores), each
 * said; float16 gives fp16. */
static void test_precision_default(void)
{
    const struct {
        const char *args, *precision, *said;
    } cases[] = {
        {"memory --model hf/llama-3-8b --cluster dgx-h100 --gpus 8 --json", "bf16", NULL},
        {"memory --model hf/llama-3-8b --cluster dgx2-v100 --gpus 64 --json", "fp16", NULL},
        {"memory --model hf/llama-2-7b --cluster dgx-h100 --gpus 8 --json", "fp16", NULL},
        {"memory --model hf/llama-3-8b --cluster dgx-h100 --gpus 8", NULL,
         "bf16 (config.json's torch_dtype)"},
        {"memory --model hf/llama-3-8b --cluster dgx2-v100 --gpus 64", NULL,
         "fp16 (torch_dtype is bfloat16, which dgx2-v100's V100-SXM3-32GB lacks)"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        TuRun r = tu_zplan(cases[i].args);
        g_test_message("zplan %s", cases[i].args);
        if (cases[i].precision) {
            json_t *root = json_loads(r.out, 0, NULL);
            g_assert_nonnull(root);
            g_assert_cmpstr(json_string_value(json_object_get(root, "precision")), ==,
                            cases[i].precision);
            json_decref(root);
        } else {
            g_assert_nonnull(strstr(r.out, cases[i].said));
        }
        tu_free(&r);
    }
}

/* One CSV cell: row `row`, column `column` of PREFIX.csv. */
static double csv_cell(const char *path, int row, int column)
{
    char *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
    char **lines = g_strsplit(text, "\n", -1);
    char **cells = g_strsplit(lines[row], ",", -1);
    const double value = g_ascii_strtod(cells[column], NULL);
    g_strfreev(cells), g_strfreev(lines), g_free(text);
    return value;
}

/* sweep --metric memory used eager attention and the closed form where memory used the
 * cluster's flash kernel and the simulated peak: 897.7 GB against 212.4 for Llama-3-70B on 64
 * H100s. Both now give the same figure per stage, and sweep takes --attention. */
static void test_sweep_matches_memory(void)
{
    char *dir = g_dir_make_tmp("zplan-defaults-XXXXXX", NULL);
    const char *common = "--model hf/llama-3-70b --cluster dgx-h100";
    char *memory = g_strdup_printf("memory %s --gpus 64 --json", common);
    json_t *root = tu_zplan_json_exit(memory, 2); /* 124.2 GB at stage 3 without --checkpoint */
    json_t *needs = json_object_get(json_array_get(json_object_get(root, "rows"), 0),
                                    "need_bytes");
    char *sweep = g_strdup_printf("sweep --vary gpus --values 64 --metric memory %s --out %s/sw",
                                  common, dir);
    TuRun r = tu_zplan(sweep);
    g_assert_cmpint(exit_status(&r), ==, 0);
    char *csv = g_build_filename(dir, "sw.csv", NULL);
    for (int stage = 1; stage <= 3; stage++) {
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        const double gb = json_number_value(json_object_get(needs, key)) / 1e9;
        g_test_message("stage %d: memory %.3f GB, sweep %.3f GB", stage, gb,
                       csv_cell(csv, 1, 1 + stage));
        g_assert_cmpfloat_with_epsilon(csv_cell(csv, 1, 1 + stage), gb, 1e-3);
    }
    tu_free(&r);
    /* --attention eager changes the sweep's figure: the flag exists and is used. */
    char *eager = g_strdup_printf("%s --attention eager", sweep);
    const double flash3 = csv_cell(csv, 1, 4);
    r = tu_zplan(eager);
    g_assert_cmpint(exit_status(&r), ==, 0);
    g_assert_cmpfloat(csv_cell(csv, 1, 4), >, flash3);
    tu_free(&r);
    g_remove(csv);
    char *svg = g_build_filename(dir, "sw.svg", NULL);
    g_remove(svg);
    g_rmdir(dir);
    g_free(svg), g_free(csv), g_free(eager), g_free(sweep), g_free(memory), g_free(dir);
    json_decref(root);
}

/* --params has no architecture, so no activations: no "Fits" at sequence 0; states that do
 * not fit on their own still do not fit. */
static void test_params_states_only(void)
{
    TuRun r = tu_zplan("memory --params 70B --cluster dgx-h100 --gpus 64");
    g_assert_cmpint(exit_status(&r), ==, 0);
    g_assert_true(g_str_has_prefix(r.out, "Model states only: stage 3 on 64 GPUs"));
    g_assert_null(strstr(r.out, "Fits"));
    g_assert_null(strstr(r.out, "sequence 0"));
    tu_free(&r);
    r = tu_zplan("memory --params 70B --cluster dgx-h100 --gpus 8");
    g_assert_cmpint(exit_status(&r), ==, 2);
    g_assert_true(g_str_has_prefix(r.out, "Does not fit: "));
    g_assert_null(strstr(r.out, "sequence 0"));
    tu_free(&r);
}

/* Without --cluster, attention is FlashAttention-2's (what PyTorch picks on any GPU from Ampere
 * on), not eager scores. */
static void test_attention_without_cluster(void)
{
    json_t *plain = tu_zplan_json("memory --model hf/llama-3-8b --gpus 8 --json");
    g_assert_cmpstr(json_string_value(json_object_get(plain, "attention")), ==, "flash2");
    json_decref(plain);
}

/* A mixture of experts under --impl megatron: zplan's dispatcher by default is the all-to-all,
 * Megatron-Core's the all-gather, so the Defaults line says which it took where tokens cross
 * ranks (EP 8), and nothing with --moe-dispatcher or at TP x EP 1. */
static void test_moe_dispatcher_default(void)
{
    const char *common = "simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 8 "
                         "--stage 1 --micro-batch 1 --seq 512 --impl megatron --precision bf16";
    const struct {
        const char *flags;
        gboolean said;
    } cases[] = {{"--ep 8", TRUE}, {"--ep 8 --moe-dispatcher alltoall", FALSE}, {"", FALSE}};
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *args = g_strdup_printf("%s %s", common, cases[i].flags);
        TuRun r = tu_zplan(args);
        g_assert_true(exit_status(&r) == 0 || exit_status(&r) == 2);
        g_assert_cmpint(strstr(r.out, "the alltoall dispatcher (Megatron-Core's own default is "
                                      "allgather)") != NULL, ==, cases[i].said);
        tu_free(&r);
        g_free(args);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/defaults/seq", test_seq_default);
    g_test_add_func("/defaults/precision", test_precision_default);
    g_test_add_func("/defaults/sweep-matches-memory", test_sweep_matches_memory);
    g_test_add_func("/defaults/params-states-only", test_params_states_only);
    g_test_add_func("/defaults/attention-without-cluster", test_attention_without_cluster);
    g_test_add_func("/defaults/moe-dispatcher", test_moe_dispatcher_default);
    return g_test_run();
}
