/* test_sim_contend: explicit ranks stepped in blocks under contention (a profile's kernel rates
 * with Calculon's interference) give what stepping each rank on its own gives, bit for bit. */
#include "sim_common.h"

/* dgx-a100-80g as shipped: kernel rates, and compute slowed beside collectives (0.15 of the
 * GPU beside NVLink's, 0.02 beside InfiniBand's). */
static ZpHw interfering;

typedef struct {
    const char *what;
    ZpImplKind impl;
    int stage, dp, mp, accum;
    SimSlow rank, node; /* factor 0: none */
    ZpPipeConfig pipe;
} ContendCase;

static SimResult *run_case(const ZpSchedule *s, const ContendCase *c, gboolean each_rank)
{
    const SimOptions o = {.mode = SIM_MODE_EXPLICIT, .each_rank = each_rank,
                          .record_timeline = TRUE,
                          .slow_ranks = &c->rank, .n_slow_ranks = c->rank.factor > 0,
                          .slow_nodes = &c->node, .n_slow_nodes = c->node.factor > 0};
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &interfering, &o, &error);
    g_assert_no_error(error);
    return r;
}

/* Blocks and every rank on its own: every figure the JSON prints (assert_same_figures, units
 * aside), and every rank's timeline with who started each collective; the blocks stood for
 * the world in fewer units (they did not fall back to every rank). */
static void check_case(const ContendCase *c)
{
    ZpPlan p;
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.impl = c->impl;
    p.checkpoint = TRUE;
    p.zero.reduce_bucket_size = p.zero.allgather_bucket_size = 2e7;
    p.gpus_per_node = interfering.gpus_per_node;
    p.pipe = c->pipe;
    p.grad_accum = c->accum;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&gpt2, &p, &error);
    g_assert_no_error(error);
    SimResult *blocks = run_case(s, c, FALSE), *each = run_case(s, c, TRUE);
    g_test_message("%s: %d ranks as %d units, step %a s (%.9g)", c->what,
                   blocks->ranks_simulated, blocks->units_simulated, blocks->step_time_s,
                   blocks->step_time_s);
    g_assert_true(strstr(blocks->cost_model, "compute beside the data-parallel group") != NULL);
    g_assert_cmpint(each->units_simulated, ==, s->world);
    g_assert_cmpint(blocks->units_simulated, <, s->world);
    each->units_simulated = blocks->units_simulated;
    assert_same_figures(blocks, each);
    const size_t n = (size_t)each->ranks_simulated * each->n_ops;
    g_assert_cmpmem(blocks->op_start_s, n * 8, each->op_start_s, n * 8);
    g_assert_cmpmem(blocks->op_end_s, n * 8, each->op_end_s, n * 8);
    g_assert_cmpmem(blocks->op_ready_s, n * 8, each->op_ready_s, n * 8);
    g_assert_cmpmem(blocks->op_last_rank, n * 4, each->op_last_rank, n * 4);
    sim_result_free(blocks);
    sim_result_free(each);
    zp_sched_free(s);
}

/* ZeRO-3 (DeepSpeed's and the paper's), ZeRO-2 and ZeRO-1 with a pipeline, over InfiniBand
 * (0.02) and inside a node over NVLink (0.15), with a slow rank, a slow link, tp, and
 * gradient accumulation. */
static void test_blocks_equal_each_rank(void)
{
    const ZpPipeConfig none = {0};
    const ContendCase cases[] = {
        {"ZeRO-3 (DeepSpeed), dp 64, rank 5 at 2x", ZP_IMPL_DEEPSPEED, 3, 64, 1, 1, {5, 2.0},
         {0, 0}, none},
        {"ZeRO-3 (DeepSpeed), dp 64, node 2's link at 3x, grad-accum 4", ZP_IMPL_DEEPSPEED, 3,
         64, 1, 4, {0, 0}, {2, 3.0}, none},
        {"ZeRO-3, dp 32, rank 40 at 1.5x, node 1's link at 2x", ZP_IMPL_PAPER, 3, 32, 1, 2,
         {20, 1.5}, {1, 2.0}, none},
        {"ZeRO-3 (DeepSpeed), dp 8 on one node (NVLink), rank 3 at 2x", ZP_IMPL_DEEPSPEED, 3,
         8, 1, 2, {3, 2.0}, {0, 0}, none},
        {"ZeRO-2 (DeepSpeed), dp 16 x tp 2, rank 9 at 2x", ZP_IMPL_DEEPSPEED, 2, 16, 2, 1,
         {9, 2.0}, {0, 0}, none},
        {"ZeRO-3 (DeepSpeed), dp 16 x tp 4, rank 42 at 3x, node 1's link at 1.5x",
         ZP_IMPL_DEEPSPEED, 3, 16, 4, 1, {42, 3.0}, {1, 1.5}, none},
        {"ZeRO-1, dp 8 x pp 4 (1F1B, 8 micro), rank 13 at 2x", ZP_IMPL_PAPER, 1, 8, 1, 8,
         {13, 2.0}, {0, 0}, {.stages = 4, .schedule = ZP_PIPE_1F1B}},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++)
        check_case(&cases[i]);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_assert_true(zp_hw_load("dgx-a100-80g", &interfering, NULL));
    g_assert_true(interfering.kernel_rates.present);
    g_test_add_func("/sim/contend/blocks-equal-each-rank", test_blocks_equal_each_rank);
    return sim_common_run();
}
