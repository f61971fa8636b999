/* test_plan_traps: `plan` without traps and offload answers a user can act on (issue 39 items
 * 2 and 4): lossy ZeRO++ only when asked, no listed plan another beats on time and memory,
 * --exclude, offload searched and shown beside "needs N GPUs" with each stage's real limit,
 * maxmodel asking for the host's sizes and naming the tier that binds, DGX-2's 30 TB of NVMe. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

static gboolean any_option(json_t *root, const char *option)
{
    json_t *candidates = json_object_get(root, "candidates");
    for (size_t i = 0; i < json_array_size(candidates); i++)
        if (strstr(json_string_value(json_object_get(json_array_get(candidates, i),
                                                     "zero_r_zeropp")),
                   option))
            return TRUE;
    return FALSE;
}

/* Llama-3-70B on 64 H100s: with lossy ZeRO++ allowed, qgZ's int4 gradients rank (0.017%
 * faster than the same plan without); by default neither qgZ nor qwZ is listed or written. */
static void test_lossy_zeropp_only_when_asked(void)
{
    const char *args = "plan --model hf/llama-3-70b --cluster dgx-h100 --gpus 64 --json";
    char *lossy = g_strdup_printf("%s --zeropp lossy", args);
    json_t *with = tu_zplan_json(lossy);
    g_assert_true(any_option(with, "qgZ"));
    json_decref(with);
    char *dir = g_dir_make_tmp("zplan-traps-XXXXXX", NULL);
    char *ds = g_build_filename(dir, "ds.json", NULL);
    char *written = g_strdup_printf("%s --ds-config %s", args, ds);
    json_t *plain = tu_zplan_json(written);
    g_assert_false(any_option(plain, "qgZ"));
    g_assert_false(any_option(plain, "qwZ"));
    json_decref(plain);
    char *text = NULL;
    g_assert_true(g_file_get_contents(ds, &text, NULL, NULL));
    g_assert_null(strstr(text, "\"zero_quantized_gradients\": true"));
    g_assert_null(strstr(text, "\"zero_quantized_weights\": true"));
    g_free(text);
    g_remove(ds);
    g_rmdir(dir);
    g_free(ds), g_free(dir), g_free(written), g_free(lossy);
}

/* gpt2-1.5b on 16 V100s, top 10: nine of the ten fastest plans were slower than plan 1 and
 * needed as much memory or more. None is listed now, and the text says how many were left
 * out. */
static void test_no_dominated_plans(void)
{
    const char *args = "plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 16 --top 10";
    char *json_args = g_strdup_printf("%s --json", args);
    json_t *root = tu_zplan_json(json_args);
    json_t *c = json_object_get(root, "candidates");
    g_assert_cmpuint(json_array_size(c), >=, 1);
    for (size_t j = 1; j < json_array_size(c); j++)
        for (size_t i = 0; i < j; i++) {
            json_t *x = json_array_get(c, i), *y = json_array_get(c, j);
            g_assert_cmpfloat(json_number_value(json_object_get(x, "peak_memory_bytes")), >,
                              json_number_value(json_object_get(y, "peak_memory_bytes")));
        }
    json_decref(root);
    TuRun r = tu_zplan(args);
    g_assert_nonnull(strstr(r.out, "more plans left out: each is no faster than one above and "
                                   "needs no less memory."));
    /* and that lossy ZeRO++ was left out, and how to have it */
    g_assert_nonnull(strstr(r.out, "\nLossy ZeRO++ (qwZ's int8 parameter gathers, qgZ's int4 "
                                   "gradients) is not searched: it changes the training; "
                                   "--zeropp lossy tries it.\n"));
    tu_free(&r);
    g_free(json_args);
}

/* --exclude keeps a technique out of every plan; an unknown one is refused, with a guess. */
static void test_exclude(void)
{
    json_t *root = tu_zplan_json("plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 16 --top 10 "
                                 "--exclude checkpoint,hpz --json");
    json_t *c = json_object_get(root, "candidates");
    g_assert_cmpuint(json_array_size(c), >=, 1);
    for (size_t i = 0; i < json_array_size(c); i++)
        g_assert_false(json_is_true(json_object_get(json_array_get(c, i), "checkpoint")));
    json_decref(root);
    TuRun r = tu_zplan("plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 16 --exclude chekpoint");
    g_assert_cmpint(exit_status(&r), ==, 1);
    g_assert_nonnull(strstr(r.err, "--exclude: unknown value 'chekpoint'"));
    g_assert_nonnull(strstr(r.err, "Did you mean 'checkpoint'?"));
    tu_free(&r);
}

/* GPT-3 175B on one DGX-2 (16 V100s): nothing fits on the GPUs, and with the datasheet's 30 TB
 * of NVMe (the profile had 1.92 TB, the OS drives) ZeRO-Infinity's NVMe offload fits; the
 * answer says so beside the 84 GPUs the states alone would need, and each stage that lost says
 * the GPU's memory stopped it, not "optimizer offload needs stage 1". */
static void test_offload_beside_gpus_needed(void)
{
    TuRun r = tu_zplan("plan --model gpt3-175b --cluster dgx2-v100 --gpus 16 --top 1");
    g_test_message("%s", r.out);
    g_assert_cmpint(exit_status(&r), ==, 0);
    g_assert_true(g_str_has_prefix(r.out, "Fits: plan 1 (stage 3, "));
    g_assert_nonnull(strstr(r.out, "\nNothing fits on the GPUs alone: plan 1 offloads the "
                                   "optimizer to nvme and the parameters to nvme"));
    g_assert_nonnull(strstr(r.out, "\nWithout offload, the 2794 GB of model states alone need "
                                   "at least 84 GPUs of this size (16 given).\n"));
    g_assert_nonnull(strstr(r.out, "      0 out of GPU memory: without offload its closest plan "
                                   "needs "));
    g_assert_null(strstr(r.out, "needs stage 1 or above"));
    tu_free(&r);
}

/* maxmodel with offload and a bare GPU printed "1e-06M" and exited 0: it now asks for the
 * host's sizes, takes them, and names the tier that binds each stage. */
static void test_maxmodel_offload(void)
{
    TuRun r = tu_zplan("maxmodel --gpu-memory 32GB --gpus 16 --offload-optimizer cpu");
    g_assert_cmpint(exit_status(&r), ==, 1);
    g_assert_cmpstr(r.err, ==, "zplan maxmodel: offload needs the host's sizes: give --cluster "
                               "NAME, or --cpu-memory BYTES per GPU with --gpu-memory\n");
    tu_free(&r);
    r = tu_zplan("maxmodel --gpu-memory 32GB --gpus 16 --offload-optimizer cpu "
                 "--cpu-memory 100GB");
    g_assert_cmpint(exit_status(&r), ==, 0);
    g_assert_null(strstr(r.out, "e-06"));
    g_assert_nonnull(strstr(r.out, "        limit        GPU        GPU        GPU       host\n"));
    tu_free(&r);
    /* One DGX-2 with NVMe: host memory binds (not the 30 TB of NVMe), and a smaller
     * sub_group_size, whose buffers the host holds, lets a larger model in. */
    json_t *plain = tu_zplan_json("maxmodel --cluster dgx2-v100 --gpus 16 --offload-optimizer "
                                  "nvme --offload-param nvme --json");
    json_t *small = tu_zplan_json("maxmodel --cluster dgx2-v100 --gpus 16 --offload-optimizer "
                                  "nvme --offload-param nvme --sub-group-size 1e8 --json");
    g_assert_cmpstr(json_string_value(json_object_get(json_object_get(plain, "limit"), "stage3")),
                    ==, "host");
    g_assert_cmpfloat(json_number_value(json_object_get(plain, "stage3")), >, 100e9);
    g_assert_cmpfloat(json_number_value(json_object_get(small, "stage3")), >,
                      json_number_value(json_object_get(plain, "stage3")));
    json_decref(plain), json_decref(small);
    ZpHw hw = tu_load_hw("dgx2-v100");
    g_assert_cmpfloat(hw.nvme_bytes, ==, 30.72e12);
}

/* memory with offload printed the model states as if nothing were offloaded (205.6 GB at
 * every stage for gpt-13b on one GPU); the row is now what stays on the GPU, the offload
 * table's first row. */
static void test_memory_offload_states(void)
{
    TuRun r = tu_zplan("memory --model gpt-13b --cluster dgx2-v100 --gpus 1 --checkpoint "
                       "--offload-optimizer cpu");
    g_assert_cmpint(exit_status(&r), ==, 0);
    const char *left = strstr(r.out, "\n  model states left on GPU   ");
    const char *tier = strstr(r.out, "\n  GPU model states per GPU   ");
    g_assert_nonnull(left);
    g_assert_nonnull(tier);
    char **a = g_strsplit(left + 1, "\n", 2), **b = g_strsplit(tier + 1, "\n", 2);
    g_assert_cmpstr(a[0] + 30, ==, b[0] + 30); /* the four stages' figures */
    g_strfreev(a), g_strfreev(b);
    /* and at stage 1 the closed form's sum is the simulated need (54.92 against 54.93 GB):
     * DeepSpeed's stages 1-2 step on the host under offload, with no fp32 step copies on the
     * GPU, which the sum had added (77.1 GB: 132.0) */
    const char *sum = strstr(r.out, "\n  sum of the terms   ");
    const char *peak = strstr(r.out, "\n  reserved peak + reserve   ");
    g_assert_nonnull(sum);
    g_assert_nonnull(peak);
    double s[4], p[4];
    g_assert_cmpint(sscanf(sum + 22, "%lf %lf %lf %lf", &s[0], &s[1], &s[2], &s[3]), ==, 4);
    g_assert_cmpint(sscanf(peak + 29, "%lf %lf %lf %lf", &p[0], &p[1], &p[2], &p[3]), ==, 4);
    g_assert_cmpfloat(fabs(s[1] - p[1]), <, 0.01 * p[1]);
    tu_free(&r);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/plan-traps/lossy-zeropp-only-when-asked", test_lossy_zeropp_only_when_asked);
    g_test_add_func("/plan-traps/no-dominated-plans", test_no_dominated_plans);
    g_test_add_func("/plan-traps/exclude", test_exclude);
    g_test_add_func("/plan-traps/offload-beside-gpus-needed", test_offload_beside_gpus_needed);
    g_test_add_func("/plan-traps/maxmodel-offload", test_maxmodel_offload);
    g_test_add_func("/plan-traps/memory-offload-states", test_memory_offload_states);
    return g_test_run();
}
