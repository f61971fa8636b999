/* test_sim_slow: stragglers in the simulator: slow ranks and links by hand and under ZeRO-3,
 * their bad input, and rank classes, runs of ranks and blocks equal to every rank explicit. */
#include "sim_common.h"

/* ---- stragglers ---- */

static SimResult *run_slow(const ZpSchedule *s, const SimSlow *ranks, uint32_t n_ranks,
                           const SimSlow *nodes, uint32_t n_nodes)
{
    const SimOptions options = {.mode = SIM_MODE_EXPLICIT, .record_timeline = TRUE,
                                .slow_ranks = ranks, .n_slow_ranks = n_ranks,
                                .slow_nodes = nodes, .n_slow_nodes = n_nodes};
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &a100, &options, &error);
    g_assert_no_error(error);
    return r;
}

/* 1,024 ranks each run A (1e12 FLOPs, a = 1e12 / (312e12 x 0.807) s), then a 64 MB
 * all-gather over all of them (c s, NCCL's cost for 128 nodes), then B (= A). Rank 5 at 2x:
 * its A ends at 2a, when the all-gather starts for all, so every rank waited a for it; its B
 * ends last at 2a + c + 2a. The step grows from 2a + c by exactly 2a (2a and a each rounded
 * to the clock's grid: by 2 x (q(2a) - q(a))). */
static void test_slow_rank_by_hand(void)
{
    ZpSchedule *s = hand_schedule(1024, 1);
    const ZpOp math = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_BLOCK_FWD, .flops = 1e12};
    ZpOp gather = allreduce(64e6, ZP_GROUP_DP, ZP_STREAM_DP);
    gather.sub = ZP_COLL_ALLGATHER;
    const uint32_t a = add_op(s, math, NULL, 0);
    const uint32_t c = add_op(s, gather, &a, 1);
    add_op(s, math, &c, 1);
    /* Each duration on the clock's grid (sim_clock_q): A's, the slow rank's 2x A's, and the
     * all-gather's latency and transfer. */
    const double a_s = sim_clock_q(1e12 / (312e12 * 0.807));
    const double slow_a_s = sim_clock_q(2 * (1e12 / (312e12 * 0.807)));
    const SimCollGroup g = sim_coll_group(&a100, 1024, 1, ZP_GROUP_DP);
    const SimCollCost cost = sim_coll_cost(ZP_COLL_ALLGATHER, 64e6, &g);
    const double c_s = sim_clock_q(cost.latency_s) + sim_clock_q(cost.transfer_s);
    SimResult *r = run_slow(s, NULL, 0, NULL, 0);
    assert_close(r->step_time_s, 2 * a_s + c_s, 1e-12);
    const double base_s = r->step_time_s;
    sim_result_free(r);
    const SimSlow slow = {5, 2.0};
    r = run_slow(s, &slow, 1, NULL, 0);
    g_test_message("1,024 ranks: step %.9g s, with rank 5 at 2x %.9g s (+%.9g s, 2a = %.9g s)",
                   base_s, r->step_time_s, r->step_time_s - base_s, 2 * a_s);
    assert_close(r->step_time_s, 2 * slow_a_s + c_s, 1e-12);
    assert_close(r->step_time_s - base_s, 2 * (slow_a_s - a_s), 1e-9);
    g_assert_cmpint(r->report_rank, ==, 5);
    assert_close(r->compute_s, 2 * slow_a_s, 1e-12);
    /* Who waited for whom: rank 0 reached the all-gather at a and started it at 2a, when
     * rank 5 arrived; rank 5 waited for nobody. */
    const size_t rank0 = c, rank5 = 5 * (size_t)r->n_ops + c;
    assert_close(r->op_ready_s[rank0], a_s, 1e-12);
    assert_close(r->op_start_s[rank0], slow_a_s, 1e-12);
    g_assert_cmpuint(r->op_last_rank[rank0], ==, 5);
    g_assert_cmpfloat(r->op_ready_s[rank5], ==, r->op_start_s[rank5]);
    sim_result_free(r);
    zp_sched_free(s);
}

/* A 1 GiB all-gather over 16 ranks on 2 nodes, node 1's network at 3x: the ring is as fast
 * as its slowest link, so the transfer takes 3x and the latency stays. Inside one node
 * (8 ranks) a slow network changes nothing. */
static void test_slow_link_by_hand(void)
{
    for (int dp = 8; dp <= 16; dp += 8) {
        ZpSchedule *s = hand_schedule(dp, 1);
        ZpOp gather = allreduce(GIB, ZP_GROUP_DP, ZP_STREAM_DP);
        gather.sub = ZP_COLL_ALLGATHER;
        add_op(s, gather, NULL, 0);
        const SimCollGroup g = sim_coll_group(&a100, dp, 1, ZP_GROUP_DP);
        const SimCollCost cost = sim_coll_cost(ZP_COLL_ALLGATHER, GIB, &g);
        const SimSlow slow = {dp / 8 - 1, 3.0};
        SimResult *r = run_slow(s, NULL, 0, &slow, 1);
        const double factor = dp > 8 ? 3.0 : 1.0;
        g_assert_cmpint(g.bottleneck, ==, dp > 8 ? SIM_LINK_INTER : SIM_LINK_INTRA);
        /* The latency and the transfer each on the clock's grid (sim_clock_q). */
        assert_close(r->step_time_s,
                     sim_clock_q(cost.latency_s) + sim_clock_q(factor * cost.transfer_s), 1e-12);
        sim_result_free(r);
        zp_sched_free(s);
    }
}

/* A ZeRO-3 step of gpt2-124m (micro-batch 32: compute-bound) on 1,024 explicit ranks with
 * rank 700 at 2x. Every all-gather
 * waits for every rank, so the step is at least the slow rank's own compute (2x its compute
 * and optimizer time) and at most the even step plus that extra compute: here (compute-bound)
 * it grows by nearly all of it. */
static void test_slow_rank_zero3(void)
{
    ZpPlan p;
    zp_plan_defaults(&p, 3, 1024, 1);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.micro_batch = 32;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&gpt2, &p, &error);
    g_assert_no_error(error);
    SimResult *even = run_slow(s, NULL, 0, NULL, 0);
    const SimSlow slow = {700, 2.0};
    SimResult *r = run_slow(s, &slow, 1, NULL, 0);
    const double busy_s = even->compute_s + even->optimizer_s;
    g_test_message("ZeRO-3, 1,024 ranks: step %.6g s (compute %.6g s), rank 700 at 2x: %.6g s",
                   even->step_time_s, busy_s, r->step_time_s);
    g_assert_cmpfloat(r->step_time_s, >=, 2 * busy_s);
    g_assert_cmpfloat(r->step_time_s, <=, (even->step_time_s + busy_s) * (1 + 1e-12));
    sim_result_free(even);
    sim_result_free(r);
    zp_sched_free(s);
}

static void test_slow_bad_input(void)
{
    SimSlow slow;
    GError *error = NULL;
    const char *bad[] = {"5", ":2", "5:", "5:0.5", "x:2", "5:2x", "-1:2", "5:nan", "1024:2"};
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_assert_false(sim_slow_parse(bad[i], 1024, "rank", &slow, &error));
        g_test_message("%s: %s", bad[i], error->message);
        g_assert_nonnull(strstr(error->message, bad[i]));
        g_clear_error(&error);
    }
    g_assert_true(sim_slow_parse("1023:2.5", 1024, "rank", &slow, &error));
    g_assert_cmpuint(slow.index, ==, 1023);
    g_assert_cmpfloat(slow.factor, ==, 2.5);
    ZpSchedule *s = hand_schedule(8, 1);
    add_op(s, (ZpOp){.kind = ZP_OP_COMPUTE, .flops = 1}, NULL, 0);
    const SimOptions folded = {.mode = SIM_MODE_FOLDED, .slow_ranks = &slow, .n_slow_ranks = 1};
    g_assert_null(sim_engine_run(s, &a100, &folded, &error));
    g_assert_nonnull(strstr(error->message, "slow rank 1023 x 2.5: the index must be below 8"));
    g_clear_error(&error);
    zp_sched_free(s);
}

/* ---- rank classes against every rank ---- */

/* Stragglers folded into rank classes (sim_class) against --explicit: a plan, and the slow
 * ranks and nodes. pp > 1: a 1F1B pipeline of `micro` micro-batches. */
typedef struct {
    const char *what;
    int stage, dp, mp, pp, micro, hpz;
    SimSlow rank, node; /* factor 0: none */
    int classes;        /* simulated ranks the classes come to */
    gboolean wide;      /* a 4-layer, 16-head model (tp 16) in place of gpt2-124m (12 heads) */
} ClassCase;

static ZpSchedule *build_class_case(const ClassCase *c)
{
    ZpPlan p;
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.impl = ZP_IMPL_PAPER;
    p.checkpoint = TRUE;
    p.zero.reduce_bucket_size = p.zero.allgather_bucket_size = 2e7;
    if (c->hpz > 1)
        p.zero.zero_hpz_partition_size = c->hpz;
    p.gpus_per_node = a100.gpus_per_node;
    if (c->pp > 1) {
        p.pipe.stages = c->pp;
        p.pipe.schedule = ZP_PIPE_1F1B;
        p.grad_accum = c->micro;
    }
    GError *error = NULL;
    ZpModel wide;
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", "wide", "layers", 4,
                          "hidden", 2048, "heads", 16, "seq_len", 1024, "vocab", 50304);
    g_assert_true(zp_model_from_json(o, "wide", &wide, &error));
    json_decref(o);
    ZpSchedule *s = zp_sched_build(c->wide ? &wide : &gpt2, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* A run on a100 with a timeline, a slow rank and a slow node (factor 0: none) added to o. */
static SimResult *run_slowed(const ZpSchedule *s, SimOptions o, const SimSlow *rank,
                             const SimSlow *node)
{
    o.record_timeline = TRUE;
    o.slow_ranks = rank;
    o.n_slow_ranks = rank->factor > 0;
    o.slow_nodes = node;
    o.n_slow_nodes = node->factor > 0;
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &a100, &o, &error);
    g_assert_no_error(error);
    return r;
}

static SimResult *run_class_case(const ZpSchedule *s, const ClassCase *c, SimMode mode)
{
    return run_slowed(s, (SimOptions){.mode = mode}, &c->rank, &c->node);
}

static gboolean same_timeline(const SimResult *a, int ra, const SimResult *b, int rb)
{
    const size_t n = a->n_ops, bytes = n * sizeof(double);
    return memcmp(&a->op_start_s[ra * n], &b->op_start_s[rb * n], bytes) == 0 &&
           memcmp(&a->op_end_s[ra * n], &b->op_end_s[rb * n], bytes) == 0 &&
           memcmp(&a->op_ready_s[ra * n], &b->op_ready_s[rb * n], bytes) == 0;
}

/* Every rank's ready, start and end times of every op, explicit, equal one simulated rank's
 * bit for bit (its class's), and as many explicit ranks have each timeline as the classes
 * with it stand for (two classes may run alike: a slow node whose links pace every group). */
static void assert_same_timelines(const SimResult *all, const SimResult *classes)
{
    const int units = classes->ranks_simulated;
    uint32_t *matched = g_new0(uint32_t, units), *expected = g_new0(uint32_t, units);
    for (int u = 0; u < units; u++) {
        int first = 0;
        while (!same_timeline(classes, first, classes, u))
            first++;
        expected[first] += classes->rank_count[u];
    }
    for (int r = 0; r < all->ranks_simulated; r++) {
        int found = 0;
        while (found < units && !same_timeline(all, r, classes, found))
            found++;
        g_assert_cmpint(found, <, units);
        matched[found]++;
    }
    for (int u = 0; u < units; u++)
        g_assert_cmpuint(matched[u], ==, expected[u]);
    g_free(matched);
    g_free(expected);
}

static void assert_same_step(const SimResult *all, const SimResult *c)
{
    const double got[] = {c->step_time_s, c->exposed_comm_s, c->compute_s, c->optimizer_s,
                          c->idle_s, c->flush_s, c->peak_memory_bytes,
                          c->peak_model_state_bytes};
    const double want[] = {all->step_time_s, all->exposed_comm_s, all->compute_s,
                           all->optimizer_s, all->idle_s, all->flush_s,
                           all->peak_memory_bytes, all->peak_model_state_bytes};
    assert_same_doubles(got, want, G_N_ELEMENTS(got));
    g_assert_cmpuint(c->first_rank[c->report_rank], ==, all->report_rank);
    assert_same_breakdowns(c, all);
}

/* Folded with stragglers, the ranks the slowdowns set apart are simulated as rank classes;
 * the step, every peak, the bytes and every rank's timeline are --explicit's, bit for bit.
 * The cases place the groups differently: tp inside a node, tp across two nodes, a pipeline
 * (its sends and stages), hpZ's node groups, a slow rank and a slow node together. */
static void test_classes_equal_explicit(void)
{
    const ClassCase cases[] = {
        {"ZeRO-3, dp 64 x tp 2, rank 77 at 3x", 3, 64, 2, 1, 1, 0, {77, 3.0}, {0, 0}, 4, FALSE},
        {"ZeRO-2, dp 32 x tp 4, rank 5 at 1.5x, node 9 at 2.5x", 2, 32, 4, 1, 1, 0, {5, 1.5},
         {9, 2.5}, 6, FALSE},
        {"ZeRO-1, dp 8 x tp 16 across 2 nodes, node 3 at 2x", 1, 8, 16, 1, 1, 0, {0, 0},
         {3, 2.0}, 4, TRUE},
        {"ZeRO-1, dp 4 x pp 4 x tp 2 (1F1B, 4 micro), rank 13 at 2x", 1, 4, 2, 4, 4, 0,
         {13, 2.0}, {0, 0}, 16, FALSE},
        {"ZeRO-3 hpZ 8, dp 64, rank 20 at 2x, node 5 at 1.5x", 3, 64, 1, 1, 1, 8, {20, 2.0},
         {5, 1.5}, 4, FALSE},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpSchedule *s = build_class_case(&cases[i]);
        SimResult *all = run_class_case(s, &cases[i], SIM_MODE_EXPLICIT);
        SimResult *c = run_class_case(s, &cases[i], SIM_MODE_FOLDED);
        g_test_message("%s: %d ranks as %d classes, step %.9g s (explicit %.9g s)",
                       cases[i].what, s->world, c->ranks_simulated, c->step_time_s,
                       all->step_time_s);
        g_assert_cmpint(all->ranks_simulated, ==, s->world);
        g_assert_cmpint(c->ranks_simulated, ==, cases[i].classes);
        assert_same_step(all, c);
        assert_same_timelines(all, c);
        sim_result_free(all);
        sim_result_free(c);
        zp_sched_free(s);
    }
}

/* ---- blocks of explicit ranks against each rank on its own ---- */

/* An explicit plan whose ranks fall into blocks (sim_class_blocks): how many units they come
 * to. */
typedef struct {
    const char *what;
    ZpImplKind impl;
    int stage, dp, mp, hpz;
    gboolean offload;
    SimSlow rank, node; /* factor 0: none */
    double stop_after_s;
    int units;
    const char *model; /* NULL: gpt2-124m (12 heads: tp 8 needs another) */
} RunsCase;

/* The same with a pipeline of `micro` micro-batches. */
typedef struct {
    RunsCase plan;
    ZpPipeConfig pipe;
    int micro;
    ZpRankOrder order; /* where the ranks sit (ZpRankOrder; the zero value Megatron's default) */
} PipeRunsCase;

static SimResult *run_runs_case(const ZpSchedule *s, const RunsCase *c, gboolean each_rank)
{
    const SimOptions o = {.mode = SIM_MODE_EXPLICIT, .each_rank = each_rank,
                          .stop_after_s = c->stop_after_s};
    return run_slowed(s, o, &c->rank, &c->node);
}

/* Every figure of two explicit runs, the whole timeline with who started each collective,
 * and both event counts, bit for bit. */
static void assert_same_explicit(const SimResult *runs, const SimResult *each)
{
    g_assert_cmpint(runs->ranks_simulated, ==, each->ranks_simulated);
    g_assert_cmpint(runs->report_rank, ==, each->report_rank);
    assert_same_step(runs, each);
    const double got[] = {runs->cpu_optimizer_s, runs->offload_transfer_s, runs->model_flops,
                          runs->recompute_flops};
    const double want[] = {each->cpu_optimizer_s, each->offload_transfer_s, each->model_flops,
                           each->recompute_flops};
    assert_same_doubles(got, want, G_N_ELEMENTS(got));
    assert_same_doubles(runs->offload_bytes, each->offload_bytes, ZP_XFER_N);
    g_assert_cmpuint(runs->op_events, ==, each->op_events);
    g_assert_cmpuint(runs->heap_events, ==, each->heap_events);
    const size_t n = (size_t)each->ranks_simulated * each->n_ops;
    g_assert_true(memcmp(runs->op_start_s, each->op_start_s, n * sizeof(double)) == 0);
    g_assert_true(memcmp(runs->op_end_s, each->op_end_s, n * sizeof(double)) == 0);
    g_assert_true(memcmp(runs->op_ready_s, each->op_ready_s, n * sizeof(double)) == 0);
    g_assert_true(memcmp(runs->op_last_rank, each->op_last_rank, n * sizeof(uint32_t)) == 0);
    const size_t ranks = (size_t)each->ranks_simulated * sizeof(uint32_t);
    g_assert_true(memcmp(runs->first_rank, each->first_rank, ranks) == 0);
    g_assert_true(memcmp(runs->rank_count, each->rank_count, ranks) == 0);
}

/* Runs c (with pipe and micro micro-batches) in blocks and rank by rank: the same results. */
static void check_runs_case(const RunsCase *c, const ZpPipeConfig *pipe, int micro,
                            ZpRankOrder order)
{
    ZpPlan p;
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.rank_order = order;
    p.impl = c->impl;
    p.checkpoint = TRUE;
    p.zero.reduce_bucket_size = p.zero.allgather_bucket_size = 2e7;
    p.gpus_per_node = a100.gpus_per_node;
    p.pipe = *pipe;
    p.grad_accum = micro;
    if (c->hpz > 1)
        p.zero.zero_hpz_partition_size = c->hpz;
    if (c->offload) {
        zp_offload_defaults(&p.zero.offload_optimizer, FALSE);
        p.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    }
    GError *error = NULL;
    ZpModel model = gpt2;
    if (c->model)
        g_assert_true(zp_model_load(c->model, &model, &error));
    ZpSchedule *s = zp_sched_build(&model, &p, &error);
    g_assert_no_error(error);
    SimResult *runs = run_runs_case(s, c, FALSE), *each = run_runs_case(s, c, TRUE);
    g_test_message("%s: %d ranks as %d units, step %a s", c->what, runs->ranks_simulated,
                   runs->units_simulated, runs->step_time_s);
    g_assert_cmpint(each->units_simulated, ==, s->world);
    if (c->stop_after_s > 0) {
        g_assert_true(runs->stopped && each->stopped);
        g_assert_cmpfloat(runs->step_time_s, ==, each->step_time_s);
    } else {
        g_assert_cmpint(runs->units_simulated, ==, c->units);
        assert_same_explicit(runs, each);
    }
    sim_result_free(runs);
    sim_result_free(each);
    zp_sched_free(s);
}

/* Explicit ranks stepped in blocks give what stepping each rank on its own gives, bit for
 * bit, the timeline and who started each collective included. With mp 1 a block is a run of
 * ranks: one slow rank splits dp's one group into three; a slow node sets its ranks apart
 * too; hpZ's node groups make a block of each node; CPU Adam with its transfers; DeepSpeed's
 * schedule; a run stopped early. With tp 2, 4 and 8 a block is a run of tp rows and each of
 * its tp indices one unit: a slow rank makes three blocks (two at the ends of the world), a
 * slow node its own, with DeepSpeed's schedule and the paper's at stages 1 to 3, and a run
 * stopped early. Where tp and a group across rows share a link class (tp 16 across two
 * nodes with dp; hpZ's node groups inside a node with tp) blocks are not exact and every
 * rank steps on its own. With a pipeline a row is every stage's tp ranks of one dp index,
 * and each of its (stage, tp index) one unit: 1F1B, GPipe and interleaved 1F1B, with tp 1,
 * 2 and 4, a slow rank and a slow node, and a run stopped early. */
static void test_runs_equal_each_rank(void)
{
    const RunsCase cases[] = {
        {"ZeRO-3, dp 64, rank 5 at 2x", ZP_IMPL_PAPER, 3, 64, 1, 0, FALSE, {5, 2.0}, {0, 0},
         0, 3, NULL},
        {"ZeRO-3 (DeepSpeed), dp 64, rank 40 at 1.5x, node 2 at 2x", ZP_IMPL_DEEPSPEED, 3, 64,
         1, 0, FALSE, {40, 1.5}, {2, 2.0}, 0, 5, NULL},
        {"ZeRO-3 hpZ 8, dp 64, rank 20 at 2x, node 5 at 1.5x", ZP_IMPL_PAPER, 3, 64, 1, 8,
         FALSE, {20, 2.0}, {5, 1.5}, 0, 10, NULL},
        {"ZeRO-2, CPU Adam, dp 16, rank 3 at 2x", ZP_IMPL_PAPER, 2, 16, 1, 0, TRUE, {3, 2.0},
         {0, 0}, 0, 3, NULL},
        {"ZeRO-3 (DeepSpeed), dp 32, no straggler", ZP_IMPL_DEEPSPEED, 3, 32, 1, 0, FALSE,
         {0, 0}, {0, 0}, 0, 1, NULL},
        {"ZeRO-1, dp 16 x tp 2, rank 5 at 2x", ZP_IMPL_PAPER, 1, 16, 2, 0, FALSE, {5, 2.0},
         {0, 0}, 0, 6, NULL},
        {"gpt-7.5b ZeRO-3, dp 16 x tp 8, rank 77 at 2x", ZP_IMPL_PAPER, 3, 16, 8, 0, FALSE,
         {77, 2.0}, {0, 0}, 0, 24, "gpt-7.5b"},
        {"ZeRO-3 (DeepSpeed), dp 32 x tp 4, rank 0 at 1.5x, node 3 at 2x", ZP_IMPL_DEEPSPEED, 3,
         32, 4, 0, FALSE, {0, 1.5}, {3, 2.0}, 0, 16, NULL},
        {"ZeRO-3 hpZ 4, dp 16 x tp 2, rank 31 at 2x", ZP_IMPL_PAPER, 3, 16, 2, 4, FALSE,
         {31, 2.0}, {0, 0}, 0, 32, NULL},
        {"ZeRO-3 (DeepSpeed), dp 16 x tp 4, rank 42 at 3x, node 1 at 1.5x", ZP_IMPL_DEEPSPEED,
         3, 16, 4, 0, FALSE, {42, 3.0}, {1, 1.5}, 0, 20, NULL},
        {"llama-tiny ZeRO-2 (DeepSpeed), dp 8 x tp 8, no straggler", ZP_IMPL_DEEPSPEED, 2, 8, 8,
         0, FALSE, {0, 0}, {0, 0}, 0, 8, "llama-tiny"},
        {"gpt-7.5b ZeRO-1, dp 8 x tp 16 across 2 nodes, node 3 at 2x", ZP_IMPL_PAPER, 1, 8, 16,
         0, FALSE, {0, 0}, {3, 2.0}, 0, 128, "gpt-7.5b"},
        {"ZeRO-3, dp 64, rank 5 at 2x, stopped at 5 ms", ZP_IMPL_PAPER, 3, 64, 1, 0, FALSE,
         {5, 2.0}, {0, 0}, 0.005, 0, NULL},
        {"ZeRO-3, dp 16 x tp 4, rank 9 at 2x, stopped at 5 ms", ZP_IMPL_PAPER, 3, 16, 4, 0,
         FALSE, {9, 2.0}, {0, 0}, 0.005, 0, NULL},
    };
    const PipeRunsCase pipe_cases[] = {
        {{"ZeRO-1, dp 8 x pp 4 (1F1B, 8 micro), rank 13 at 2x", ZP_IMPL_PAPER, 1, 8, 1, 0,
          FALSE, {13, 2.0}, {0, 0}, 0, 12, NULL},
         {.stages = 4, .schedule = ZP_PIPE_1F1B}, 8, ZP_ORDER_TP_DP_PP},
        /* Megatron-Core's default order (tp-dp-pp): world rank 9 is dp row 4's, node 1 the
         * first stage of rows 4-7, so rows 0-3, 4 and 5-7 make three blocks */
        {{"ZeRO-1 (DeepSpeed), dp 8 x pp 2 x tp 2 (GPipe, 4 micro), rank 9 at 1.5x, node 1 at "
          "2x", ZP_IMPL_DEEPSPEED, 1, 8, 2, 0, FALSE, {9, 1.5}, {1, 2.0}, 0, 12, NULL},
         {.stages = 2, .schedule = ZP_PIPE_GPIPE}, 4, ZP_ORDER_TP_DP_PP},
        /* under tp-pp-dp each dp group crosses nodes, tp's stays in one: blocks; under the
         * default a dp group is 4 ranks of one node, as tp's: every rank on its own */
        {{"ZeRO-0, dp 4 x pp 4 x tp 2 (interleaved, 2 chunks, 8 micro), no straggler, tp-pp-dp",
          ZP_IMPL_PAPER, 0, 4, 2, 0, FALSE, {0, 0}, {0, 0}, 0, 8, NULL},
         {.stages = 4, .virtual_stages = 2, .schedule = ZP_PIPE_INTERLEAVED}, 8,
         ZP_ORDER_TP_PP_DP},
        {{"ZeRO-0, dp 4 x pp 4 x tp 2 (interleaved, 2 chunks, 8 micro), no straggler",
          ZP_IMPL_PAPER, 0, 4, 2, 0, FALSE, {0, 0}, {0, 0}, 0, 32, NULL},
         {.stages = 4, .virtual_stages = 2, .schedule = ZP_PIPE_INTERLEAVED}, 8,
         ZP_ORDER_TP_DP_PP},
        {{"ZeRO-1, dp 16 x pp 2 x tp 4 (1F1B, 4 micro), rank 70 at 3x, node 3 at 1.5x",
          ZP_IMPL_PAPER, 1, 16, 4, 0, FALSE, {70, 3.0}, {3, 1.5}, 0, 40, NULL},
         {.stages = 2, .schedule = ZP_PIPE_1F1B}, 4, ZP_ORDER_TP_DP_PP},
        {{"ZeRO-1, dp 8 x pp 4 x tp 2 (1F1B, 8 micro), rank 9 at 2x, stopped at 5 ms",
          ZP_IMPL_PAPER, 1, 8, 2, 0, FALSE, {9, 2.0}, {0, 0}, 0.005, 0, NULL},
         {.stages = 4, .schedule = ZP_PIPE_1F1B}, 8, ZP_ORDER_TP_DP_PP},
    };
    const ZpPipeConfig none = {0};
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++)
        check_runs_case(&cases[i], &none, 1, ZP_ORDER_TP_DP_PP);
    for (size_t i = 0; i < G_N_ELEMENTS(pipe_cases); i++)
        check_runs_case(&pipe_cases[i].plan, &pipe_cases[i].pipe, pipe_cases[i].micro,
                        pipe_cases[i].order);
}

/* Where one instant queues a flow across rows and a unit's or a row flow's event for one time,
 * rank by rank the flow's end falls inside the strip (sim_engine.c): here tp's and dp's empty
 * all-reduces, of one latency on one node, start together on dp 2 x tp 2. The units stop and
 * every rank steps on its own, with the same results. */
static void test_blocks_fall_back(void)
{
    const SimSlow none = {0, 0};
    /* dp's after tp's: two units (one block, two tp indices); together: every rank. */
    for (int together = 0; together < 2; together++) {
        ZpSchedule *s = hand_schedule(2, 2);
        const uint32_t tp = add_op(s, allreduce(0, ZP_GROUP_TP, ZP_STREAM_TP), NULL, 0);
        add_op(s, allreduce(0, ZP_GROUP_DP, ZP_STREAM_DP), &tp, together ? 0 : 1);
        SimResult *units = run_slowed(s, (SimOptions){.mode = SIM_MODE_EXPLICIT}, &none, &none);
        SimResult *each = run_slowed(s, (SimOptions){.mode = SIM_MODE_EXPLICIT, .each_rank = TRUE},
                                     &none, &none);
        g_assert_cmpint(units->units_simulated, ==, together ? 4 : 2);
        assert_same_explicit(units, each);
        sim_result_free(units);
        sim_result_free(each);
        zp_sched_free(s);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_test_add_func("/sim/slow/rank-by-hand", test_slow_rank_by_hand);
    g_test_add_func("/sim/slow/link-by-hand", test_slow_link_by_hand);
    g_test_add_func("/sim/slow/rank-zero3", test_slow_rank_zero3);
    g_test_add_func("/sim/slow/bad-input", test_slow_bad_input);
    g_test_add_func("/sim/slow/classes-equal-explicit", test_classes_equal_explicit);
    g_test_add_func("/sim/slow/runs-equal-each-rank", test_runs_equal_each_rank);
    g_test_add_func("/sim/slow/blocks-fall-back", test_blocks_fall_back);
    return sim_common_run();
}
