/* test_whole_nodes: GPU counts that are not a whole number of nodes (9, 12 and 20 on 8-GPU
 * nodes, 24 on a DGX-2's 16) simulate and plan at every ZeRO stage; ZeRO++'s node groups exist
 * only with their technique, which is refused in one line, or left out of plan with a note. */
#include "testutil.h"

#include <jansson.h>
#include <string.h>
#include <sys/wait.h>

typedef struct {
    const char *cluster;
    int gpus;
    int hpz_fits; /* an hpZ size dividing both the node and the GPUs (0: none) */
    int node;     /* GPUs a node holds: hpZ's and qgZ's node group */
} Partial;

static const Partial partials[] = {
    {"dgx-a100-80g", 9, 0, 8},
    {"dgx-a100-80g", 12, 4, 8},
    {"dgx-a100-80g", 20, 4, 8},
    {"dgx2-v100", 24, 8, 16},
};

static void assert_simulates(const Partial *p, int stage, const char *extra)
{
    char *args = g_strdup_printf("simulate --model gpt2-124m --cluster %s --gpus %d --stage %d "
                                 "--micro-batch 2 --json %s", p->cluster, p->gpus, stage, extra);
    json_t *root = tu_zplan_json(args);
    g_assert_nonnull(json_object_get(root, "step_time_s"));
    json_decref(root);
    g_free(args);
}

/* One line on stderr, naming the key, status 1, nothing on stdout. */
static void assert_refused(const Partial *p, const char *extra, const char *key)
{
    char *args = g_strdup_printf("simulate --model gpt2-124m --cluster %s --gpus %d --stage 3 "
                                 "--micro-batch 2 %s", p->cluster, p->gpus, extra);
    TuRun r = tu_zplan(args);
    g_test_message("zplan %s: %s", args, r.err);
    g_assert_true(WIFEXITED(r.status));
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
    g_assert_cmpstr(r.out, ==, "");
    g_assert_nonnull(strstr(r.err, key));
    g_assert_nonnull(strstr(r.err, "needs whole nodes"));
    g_assert_cmpint(strchr(r.err, '\n') - r.err, ==, (long)strlen(r.err) - 1);
    tu_free(&r);
    g_free(args);
}

static void test_simulate(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(partials); i++) {
        const Partial *p = &partials[i];
        for (int stage = 0; stage <= 3; stage++)
            assert_simulates(p, stage, "");
        /* ZeRO++ at stage 3: qwZ needs no node group; hpZ over a size that tiles both. */
        assert_simulates(p, 3, "--quantized-weights");
        if (p->hpz_fits) {
            char *hpz = g_strdup_printf("--quantized-weights --hpz-partition-size %d",
                                        p->hpz_fits);
            assert_simulates(p, 3, hpz);
            g_free(hpz);
        }
        /* What needs whole nodes, asked for explicitly: one line each. */
        char *hpz_node = g_strdup_printf("--hpz-partition-size %d", p->node);
        assert_refused(p, hpz_node, "zero_hpz_partition_size (--hpz-partition-size)");
        g_free(hpz_node);
        assert_refused(p, "--quantized-gradients", "zero_quantized_gradients");
    }
}

/* plan ranks a best plan at every stage, and says what it left out. */
static void test_plan(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(partials); i++) {
        const Partial *p = &partials[i];
        char *args = g_strdup_printf("plan --model gpt2-124m --cluster %s --gpus %d --json",
                                     p->cluster, p->gpus);
        json_t *root = tu_zplan_json(args);
        json_t *stages = json_object_get(root, "stages");
        g_assert_cmpuint(json_array_size(stages), ==, 4);
        for (size_t s = 0; s < 4; s++)
            g_assert_true(json_is_object(json_object_get(json_array_get(stages, s), "best")));
        const char *note = json_string_value(json_object_get(root, "whole_node_note"));
        g_assert_nonnull(note);
        g_assert_nonnull(strstr(note, "hpZ and qgZ left out: they need whole nodes"));
        json_decref(root);
        g_free(args);
    }
    /* Whole nodes: nothing left out, and no note. */
    json_t *root = tu_zplan_json("plan --model gpt2-124m --cluster dgx-a100-80g --gpus 16 --json");
    g_assert_null(json_object_get(root, "whole_node_note"));
    json_decref(root);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/whole-nodes/simulate", test_simulate);
    g_test_add_func("/whole-nodes/plan", test_plan);
    return g_test_run();
}
