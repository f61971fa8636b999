/* test_budget: time and money for a training run (issue 39 item 6): --tokens (or --steps)
 * gives the steps, wall-clock days and GPU-hours from the simulated step, --gpu-hour-price the
 * cost, in simulate and plan, text and JSON. */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

static double number(json_t *o, const char *key)
{
    return json_number_value(json_object_get(o, key));
}

/* Llama-3-8B on 64 H100s, stage 1, micro-batch 1 x 8: 64 x 8 x 4096 = 2,097,152 tokens a step;
 * 1T tokens is ceil(1e12 / 2,097,152) = 476,838 steps. */
static void test_simulate_tokens(void)
{
    const char *plan = "simulate --model hf/llama-3-8b --cluster dgx-h100 --gpus 64 --stage 1 "
                       "--micro-batch 1 --grad-accum 8";
    char *args = g_strdup_printf("%s --tokens 1T --gpu-hour-price 2.5 --json", plan);
    json_t *root = tu_zplan_json(args);
    json_t *b = json_object_get(root, "budget");
    g_assert_nonnull(b);
    const double step_s = number(root, "step_time_s");
    g_assert_cmpfloat(number(b, "steps"), ==, 476838);
    g_assert_cmpfloat(number(b, "tokens"), ==, 476838.0 * 2097152);
    g_assert_cmpfloat(fabs(number(b, "days") - 476838 * step_s / 86400), <, 1e-9);
    g_assert_cmpfloat(fabs(number(b, "gpu_hours") - 476838 * step_s * 64 / 3600), <, 1e-6);
    g_assert_cmpfloat(fabs(number(b, "cost") - 2.5 * number(b, "gpu_hours")), <, 1e-6);
    json_decref(root);
    g_free(args);
    /* --steps N is N steps; the text says it in one line. */
    args = g_strdup_printf("%s --steps 1000", plan);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "  Training 2.097B tokens: 1,000 steps of "));
    g_assert_null(strstr(r.out, "per GPU-hour"));
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("%s --tokens 1T --steps 10", plan);
    r = tu_zplan(args);
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
    g_assert_nonnull(strstr(r.err, "give one of --tokens and --steps, not both"));
    tu_free(&r);
    g_free(args);
}

/* plan gives plan 1's budget in its opening lines. */
static void test_plan_tokens(void)
{
    TuRun r = tu_zplan("plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 16 --top 1 "
                       "--tokens 300B --gpu-hour-price 1");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "\nPlan 1: Training 300"));
    g_assert_nonnull(strstr(r.out, " GPU-hours, "));
    g_assert_nonnull(strstr(r.out, " at 1 per GPU-hour"));
    tu_free(&r);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/budget/simulate-tokens", test_simulate_tokens);
    g_test_add_func("/budget/plan-tokens", test_plan_tokens);
    return g_test_run();
}
