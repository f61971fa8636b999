/* test_sim_scale: the simulator at scale keeps only the timeline that is read (issue 40):
 * `--json` and `--trace` give the same figures and the same bytes as with every rank's. */
#include "cost_common.h"
#include "sim_common.h"
#include "sim_engine_internal.h"
#include "sim_trace.h"

/* Rank's timeline rows in both, bit for bit. */
static void assert_same_row(const SimResult *full, const SimResult *kept, uint32_t rank)
{
    size_t a = 0, b = 0;
    g_assert_true(sim_result_timeline_row(full, rank, &a));
    g_assert_true(sim_result_timeline_row(kept, rank, &b));
    const size_t n = full->n_ops;
    g_assert_cmpmem(&full->op_start_s[a], n * 8, &kept->op_start_s[b], n * 8);
    g_assert_cmpmem(&full->op_end_s[a], n * 8, &kept->op_end_s[b], n * 8);
    g_assert_cmpmem(&full->op_ready_s[a], n * 8, &kept->op_ready_s[b], n * 8);
    g_assert_cmpmem(&full->op_last_rank[a], n * 4, &kept->op_last_rank[b], n * 4);
}

/* Calls check on each of the frozen-results plans, folded and explicit, as they are, with a
 * straggler (the last rank slowed 1.5 x, so that the rank reported is not rank 0) and,
 * explicit, with a slow node (node 0's link 3 x slower). */
typedef void (*FrozenCaseFn)(size_t plan, int mode, int slow, const ZpSchedule *s,
                             const ZpHw *hw, SimOptions options, void *ctx);

static void each_frozen_case(FrozenCaseFn check, void *ctx)
{
    for (size_t i = 0; i < FROZEN_PLANS; i++)
        for (int mode = 0; mode < 2; mode++)
            for (int slow = 0; slow < 3; slow++) {
                if (slow == 2 && mode == SIM_MODE_FOLDED)
                    continue;
                ZpHw hw;
                ZpSchedule *s = frozen_schedule(&frozen_plans[i], &hw);
                const SimSlow straggler = {.index = (uint32_t)s->world - 1, .factor = 1.5};
                const SimSlow link = {.index = 0, .factor = 3};
                SimOptions options = {.mode = mode};
                if (slow == 1) {
                    options.slow_ranks = &straggler;
                    options.n_slow_ranks = 1;
                } else if (slow == 2) {
                    options.slow_nodes = &link;
                    options.n_slow_nodes = 1;
                }
                check(i, mode, slow, s, &hw, options, ctx);
                zp_sched_free(s);
            }
}

static void json_timeline_case(size_t i, int mode, int slow, const ZpSchedule *s,
                               const ZpHw *hw, SimOptions options, void *ctx)
{
    uint64_t *second_passes = ctx;
    GError *error = NULL;
    SimResult *kept = sim_trace_run(s, hw, &options, FALSE, &error);
    g_assert_no_error(error);
    options.record_timeline = TRUE;
    SimResult *full = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    g_test_message("plan %zu %s slow %d: %d ranks, report rank %d, %u kept", i,
                   sim_mode_name(mode), slow, full->ranks_simulated,
                   full->report_rank, kept->n_timeline_ranks);
    assert_same_figures(full, kept);
    assert_same_row(full, kept, (uint32_t)full->report_rank);
    /* Rank 0's, and the reported rank's where a second pass kept it. */
    g_assert_nonnull(kept->timeline_ranks);
    g_assert_cmpuint(kept->n_timeline_ranks, <=, 2);
    *second_passes += full->report_rank != 0;
    sim_result_free(full);
    sim_result_free(kept);
}

/* `--json`'s run (sim_trace_run keeping the reported rank's timeline) gives every figure and
 * the reported rank's op times of the run keeping every rank's, and keeps at most two ranks',
 * on each frozen case. */
static void test_json_timeline(void)
{
    uint64_t second_passes = 0;
    each_frozen_case(json_timeline_case, &second_passes);
    /* The stragglers made some reported rank other than rank 0: the second pass ran. */
    g_assert_cmpuint(second_passes, >, 0);
}

static char *read_whole(const char *path)
{
    char *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
    return text;
}

/* The trace of every rank's timeline and of the bounded one, byte for byte: past 64 ranks
 * (rank 0, the last to finish, the slow rank rank 0 waited for: a second pass), and on the
 * shipped example's plan (64 ranks: every one traced). */
static void test_trace_bounded(void)
{
    const struct {
        const char *model, *hw;
        int dp, micro_batch;
        uint32_t slow_rank;
    } cases[] = {{"gpt2-124m", "dgx-a100-80g", 128, 8, 77},
                 {"gpt2-124m", "dgx-a100-80g", 96, 4, 95},
                 {"gpt2-1.5b", "dgx2-v100", 64, 8, UINT32_MAX}};
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        ZpModel model;
        ZpHw hw;
        ZpPlan p;
        GError *error = NULL;
        g_assert_true(zp_model_load(cases[k].model, &model, &error));
        g_assert_true(zp_hw_load(cases[k].hw, &hw, &error));
        zp_plan_defaults(&p, 3, cases[k].dp, 1);
        p.micro_batch = cases[k].micro_batch;
        p.checkpoint = TRUE;
        if (strcmp(cases[k].hw, "dgx2-v100") == 0)
            p.precision = ZP_PREC_FP16;
        ZpSchedule *s = zp_sched_build(&model, &p, &error);
        g_assert_no_error(error);
        const SimSlow slow = {.index = cases[k].slow_rank, .factor = 3};
        SimOptions options = {.mode = SIM_MODE_EXPLICIT,
                              .slow_ranks = &slow,
                              .n_slow_ranks = cases[k].slow_rank != UINT32_MAX};
        SimResult *kept = sim_trace_run(s, &hw, &options, TRUE, &error);
        g_assert_no_error(error);
        options.record_timeline = TRUE;
        SimResult *full = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        assert_same_figures(full, kept);
        if (full->ranks_simulated > SIM_TRACE_ALL_RANKS)
            g_assert_cmpuint(kept->n_timeline_ranks, <=, 3);
        char *a = g_build_filename(sim_tmp_dir, "full.json", NULL);
        char *b = g_build_filename(sim_tmp_dir, "kept.json", NULL);
        g_assert_true(sim_trace_write(s, full, a, NULL, NULL, &error));
        g_assert_true(sim_trace_write(s, kept, b, NULL, NULL, &error));
        char *ta = read_whole(a), *tb = read_whole(b);
        g_assert_cmpstr(ta, ==, tb);
        if (cases[k].slow_rank != UINT32_MAX) {
            char *wait = g_strdup_printf("wait for rank %u", cases[k].slow_rank);
            g_assert_nonnull(strstr(tb, wait));
            g_free(wait);
        }
        g_free(ta);
        g_free(tb);
        g_remove(a);
        g_remove(b);
        g_free(a);
        g_free(b);
        sim_result_free(full);
        sim_result_free(kept);
        zp_sched_free(s);
    }
}

/* A pipeline of `pp` stages of a 64-block GPT (hidden 1024, vocab 32000), 1F1B, `accum`
 * micro-batches: Megatron 1T's shape (pp 64, 512 micro-batches) made small. */
static ZpSchedule *pipeline_schedule(int pp, int dp, int mp, int accum)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", "scale-pipe", "layers", 64,
                          "hidden", 1024, "heads", 16, "seq_len", 1024, "vocab", 32000);
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_from_json(o, "scale-pipe", &m, &error));
    json_decref(o);
    ZpPlan p;
    zp_plan_defaults(&p, 0, dp, mp);
    p.pipe.stages = pp;
    p.pipe.schedule = ZP_PIPE_1F1B;
    p.grad_accum = accum;
    p.checkpoint = TRUE;
    p.gpus_per_node = a100.gpus_per_node;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* `--json` on pipelines keeps the reported rank's timeline in one run, whichever rank that
 * is (SimOptions.timeline_report_rank: the stages' units share rows): the last stage's rank
 * here, not rank 0, and its row bit for bit the one of the run keeping every rank's. Folded
 * (one unit a stage, the fold jumping), explicit (tp 2 x dp 2: a stage's units share none),
 * and with a straggler (a stage of two rank classes). */
static void test_json_report_rank(void)
{
    const struct {
        int pp, dp, mp, accum;
        SimMode mode;
        uint32_t slow_rank;
    } cases[] = {{32, 1, 1, 64, SIM_MODE_FOLDED, UINT32_MAX},
                 {4, 2, 2, 16, SIM_MODE_EXPLICIT, UINT32_MAX},
                 {4, 2, 2, 16, SIM_MODE_FOLDED, 5}};
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        ZpSchedule *s = pipeline_schedule(cases[k].pp, cases[k].dp, cases[k].mp, cases[k].accum);
        const SimSlow slow = {.index = cases[k].slow_rank, .factor = 1.5};
        SimOptions options = {.mode = cases[k].mode,
                              .slow_ranks = &slow,
                              .n_slow_ranks = cases[k].slow_rank != UINT32_MAX};
        GError *error = NULL;
        SimResult *bare = sim_engine_run(s, &a100, &options, &error);
        g_assert_no_error(error);
        options.timeline_report_rank = TRUE;
        SimResult *kept = sim_engine_run(s, &a100, &options, &error);
        g_assert_no_error(error);
        options.timeline_report_rank = FALSE;
        options.record_timeline = TRUE;
        SimResult *full = sim_engine_run(s, &a100, &options, &error);
        g_assert_no_error(error);
        g_test_message("pp %d %s: %d ranks, report rank %d, %u micro-steps folded",
                       cases[k].pp, sim_mode_name(cases[k].mode), full->ranks_simulated,
                       full->report_rank, kept->fold_micro_steps);
        g_assert_cmpint(full->report_rank, !=, 0);
        assert_same_figures(full, kept);
        g_assert_cmpuint(kept->n_timeline_ranks, ==, 1);
        g_assert_cmpuint(kept->timeline_ranks[0], ==, (uint32_t)full->report_rank);
        assert_same_row(full, kept, (uint32_t)full->report_rank);
        /* A row per unit of a stage, each n_ops wide: not a row per stage. */
        g_assert_cmpuint(kept->state_bytes, <=,
                         bare->state_bytes + SIM_REPORT_ROWS_MAX * (size_t)s->ops->len * 28);
        sim_result_free(bare);
        sim_result_free(kept);
        sim_result_free(full);
        zp_sched_free(s);
    }
}

/* ops_json's sum over the reported rank's timeline (`--json` before the engine kept sums): each
 * compute op's and collective's end - start, and how many, by type, over that rank's stage's
 * ops in op order. */
static void hand_op_types(const ZpSchedule *s, const SimResult *full, double *seconds,
                          double *count)
{
    size_t base = 0;
    g_assert_true(sim_result_timeline_row(full, (uint32_t)full->report_rank, &base));
    const uint32_t stage = (full->first_rank[full->report_rank] / (uint32_t)s->plan.mp) %
                           (uint32_t)MAX(full->stages, 1);
    memset(seconds, 0, SIM_OP_TYPES * sizeof *seconds);
    memset(count, 0, SIM_OP_TYPES * sizeof *count);
    for (uint32_t i = 0; i < full->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if ((op->kind != ZP_OP_COMPUTE && op->kind != ZP_OP_COLLECTIVE) || op->stage != stage)
            continue;
        const int type = op->kind == ZP_OP_COMPUTE ? op->sub : ZP_COMP_N + op->sub;
        seconds[type] += full->op_end_s[base + i] - full->op_start_s[base + i];
        count[type] += 1;
    }
}

/* The engine's sums by op type of `bare` (no timeline kept, folded or stepped) are the hand
 * sum over `full`'s timeline, bit for bit; returns the compute types' seconds. */
static double assert_op_types(const ZpSchedule *s, const SimResult *full, const SimResult *bare)
{
    double seconds[SIM_OP_TYPES], count[SIM_OP_TYPES];
    hand_op_types(s, full, seconds, count);
    g_assert_null(bare->op_start_s);
    g_assert_true(bare->op_types_exact);
    g_assert_cmpint(bare->report_rank, ==, full->report_rank);
    g_assert_cmpmem(bare->op_type_s, sizeof bare->op_type_s, seconds, sizeof seconds);
    g_assert_cmpmem(bare->op_type_count, sizeof bare->op_type_count, count, sizeof count);
    double compute_s = 0, ops = 0;
    for (int t = 0; t < SIM_OP_TYPES; t++) {
        compute_s += t < ZP_COMP_N ? seconds[t] : 0;
        ops += count[t];
    }
    g_assert_cmpfloat(compute_s, >, 0);
    g_assert_cmpfloat(ops, >, 0);
    return compute_s;
}

/* Runs s with no timeline, folded and stepped, and with every rank's, and checks the sums. */
static double check_op_types(const ZpSchedule *s, const ZpHw *hw, SimOptions options,
                             uint32_t *folded_micro_steps)
{
    GError *error = NULL;
    SimResult *bare = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    options.no_fold = TRUE;
    SimResult *stepped = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    options.no_fold = FALSE;
    options.record_timeline = TRUE;
    SimResult *full = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    const double compute_s = assert_op_types(s, full, bare);
    assert_op_types(s, full, stepped);
    *folded_micro_steps += bare->fold_micro_steps;
    sim_result_free(bare);
    sim_result_free(stepped);
    sim_result_free(full);
    return compute_s;
}

static void op_types_case(size_t i, int mode, int slow, const ZpSchedule *s, const ZpHw *hw,
                          SimOptions options, void *ctx)
{
    (void)i, (void)mode, (void)slow;
    check_op_types(s, hw, options, ctx);
}

/* `--json`'s op times with no timeline (SimResult.op_type_s, summed as ops end): the hand sum
 * over the reported rank's timeline, bit for bit, folded and stepped, on the frozen-results
 * plans (folded, explicit, a straggler, a slow link), on pipelines whose fold jumps (its
 * replayed additions), and with contention (an op's end rescaled while it runs: the sum takes
 * end - start, as the timeline does; larger than without). */
static void test_op_types(void)
{
    uint32_t folded = 0;
    each_frozen_case(op_types_case, &folded);
    const struct {
        int pp, dp, mp, accum;
        SimMode mode;
    } pipes[] = {{32, 1, 1, 64, SIM_MODE_FOLDED}, {4, 2, 2, 16, SIM_MODE_EXPLICIT}};
    for (size_t k = 0; k < G_N_ELEMENTS(pipes); k++) {
        ZpSchedule *s = pipeline_schedule(pipes[k].pp, pipes[k].dp, pipes[k].mp, pipes[k].accum);
        check_op_types(s, &a100, (SimOptions){.mode = pipes[k].mode}, &folded);
        zp_sched_free(s);
    }
    g_assert_cmpuint(folded, >, 0); /* some fold jumped: its replayed sums are checked */
    /* gpt2-124m at DeepSpeed's stage 3 on 2 ranks, on the synthetic op table's contention. */
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    tiny_setup(&hw, &m, &p, 3, 2, 1, TRUE);
    load_model("gpt2-124m", &m);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    double compute_s[2];
    for (int slowed = 0; slowed <= 1; slowed++) {
        hw.op_costs.contention = slowed ? 1.5 : 1;
        for (int mode = 0; mode < 2; mode++)
            compute_s[slowed] = check_op_types(s, &hw, (SimOptions){.mode = mode}, &folded);
    }
    g_test_message("compute by type %.9g s without contention, %.9g s with", compute_s[0],
                   compute_s[1]);
    g_assert_cmpfloat(compute_s[1], >, compute_s[0]);
    zp_sched_free(s);
    /* Past the grid's end (rank 0 a million times slower: 271 days) the sums are not exact,
     * and say so: `--json` then sums the reported rank's timeline (cli_simulate.c). */
    load_model("gpt-13b", &m);
    load_hw("dgx-a100-80g", &hw);
    zp_plan_defaults(&p, 3, 8, 1);
    p.micro_batch = 4;
    p.grad_accum = 16;
    s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const SimSlow snail = {.index = 0, .factor = 1e6};
    const SimOptions slowed = {.mode = SIM_MODE_FOLDED, .slow_ranks = &snail, .n_slow_ranks = 1};
    SimResult *r = sim_engine_run(s, &hw, &slowed, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(r->step_time_s, >, SIM_CLOCK_GRID_END_S);
    g_assert_false(r->op_types_exact);
    sim_result_free(r);
    zp_sched_free(s);
}

/* The memory kept: 4,096 explicit ranks of gpt2-124m keep a handful of rows, not 4,096. */
static void test_state_bounded(void)
{
    ZpSchedule *s = build_case(&(Case){.stage = 3, .dp = 4096, .mp = 1, .accum = 1});
    SimOptions options = {.mode = SIM_MODE_EXPLICIT};
    GError *error = NULL;
    SimResult *bare = sim_engine_run(s, &a100, &options, &error);
    g_assert_no_error(error);
    SimResult *kept = sim_trace_run(s, &a100, &options, TRUE, &error);
    g_assert_no_error(error);
    /* Three rows of start, end and ready times and last ranks at most. */
    g_assert_cmpuint(kept->state_bytes, <=, bare->state_bytes + 3 * (size_t)s->ops->len * 28);
    g_assert_cmpfloat(kept->step_time_s, ==, bare->step_time_s);
    sim_result_free(bare);
    sim_result_free(kept);
    zp_sched_free(s);
}

/* A folded run's classes have one rank each, which keeps its own memory state: no log of a
 * state per memory op (for 32,000 layers, 328 MB). The state it allocates stays below one
 * MemState per memory op, and the figures are those test_sim_plan's frozen results hold. */
static void test_folded_memory_unlogged(void)
{
    ZpSchedule *s = build_case(&(Case){.stage = 3, .dp = 8, .mp = 1, .accum = 2,
                                       .checkpoint = TRUE, .overlap = TRUE});
    uint64_t memory_ops = 0;
    for (guint i = 0; i < s->ops->len; i++)
        memory_ops += zp_sched_op(s, i)->kind == ZP_OP_ALLOC ||
                      zp_sched_op(s, i)->kind == ZP_OP_FREE;
    SimResult *folded = run(s, &a100, SIM_MODE_FOLDED);
    SimResult *explicit_ranks = run(s, &a100, SIM_MODE_EXPLICIT);
    g_test_message("%" G_GUINT64_FORMAT " memory ops, %" G_GUINT64_FORMAT " state bytes",
                   memory_ops, folded->state_bytes);
    g_assert_cmpuint(folded->state_bytes, <, memory_ops * sizeof(MemState));
    g_assert_cmpfloat(folded->peak_memory_bytes, ==, explicit_ranks->peak_memory_bytes);
    g_assert_cmpmem(folded->peak_breakdown_bytes, sizeof folded->peak_breakdown_bytes,
                    explicit_ranks->peak_breakdown_bytes,
                    sizeof explicit_ranks->peak_breakdown_bytes);
    g_assert_cmpmem(folded->category_peak_bytes, sizeof folded->category_peak_bytes,
                    explicit_ranks->category_peak_bytes,
                    sizeof explicit_ranks->category_peak_bytes);
    sim_result_free(folded);
    sim_result_free(explicit_ranks);
    zp_sched_free(s);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_test_add_func("/sim/scale/json-timeline", test_json_timeline);
    g_test_add_func("/sim/scale/json-report-rank", test_json_report_rank);
    g_test_add_func("/sim/scale/op-types", test_op_types);
    g_test_add_func("/sim/scale/trace-bounded", test_trace_bounded);
    g_test_add_func("/sim/scale/state-bounded", test_state_bounded);
    g_test_add_func("/sim/scale/folded-memory-unlogged", test_folded_memory_unlogged);
    return sim_common_run();
}
