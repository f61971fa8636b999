/* test_sim_fold: pipelines and gradient accumulation folded by whole periods (sim_fold) give
 * the unfolded run's results bit for bit, over 1F1B, GPipe and interleaved schedules, pp 2 to
 * 64, with and without a pipeline; a slow rank refuses the fold. */
#include "cli.h"
#include "sim_common.h"
#include "sim_fold_jump.h"
#include "zp_alloc_replay.h"

#include <math.h>
#include <string.h>

typedef struct {
    const char *what;
    int layers, vocab, stage, dp, mp, pp, v, accum;
    ZpPipeSchedule schedule;
    gboolean checkpoint;
    gboolean must_fold; /* the steady state repeats long enough to jump */
} FoldCase;

static ZpSchedule *fold_schedule(const FoldCase *c)
{
    const ZpModel m = sim_gpt_model(c->layers, c->vocab);
    ZpPlan p;
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.pipe.stages = c->pp;
    p.pipe.schedule = c->schedule;
    p.pipe.virtual_stages = c->v;
    p.grad_accum = c->accum;
    p.checkpoint = c->checkpoint;
    p.gpus_per_node = a100.gpus_per_node;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    return s;
}

static SimResult *run_fold(const ZpSchedule *s, SimOptions o, gboolean no_fold)
{
    o.no_fold = no_fold;
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &a100, &o, &error);
    g_assert_no_error(error);
    return r;
}

/* Every figure of the result, bit for bit, and the timeline where one was kept. */
static void assert_same_result(const SimResult *f, const SimResult *u)
{
    assert_same_totals(f, u);
    g_assert_cmpint(f->report_rank, ==, u->report_rank);
    g_assert_cmpint(f->stages, ==, u->stages);
    assert_same_doubles(f->offload_bytes, u->offload_bytes, ZP_XFER_N);
    assert_same_breakdowns(f, u);
    /* The event counts too: the fold adds each skipped period's. */
    g_assert_cmpuint(f->op_events, ==, u->op_events);
    g_assert_cmpuint(f->heap_events, ==, u->heap_events);
    g_assert_true((f->op_start_s == NULL) == (u->op_start_s == NULL));
}

/* Each kept row's cells of the ops its rank runs (the rest of a row is never written). */
static void assert_same_timeline(const ZpSchedule *s, const SimResult *f, const SimResult *u)
{
    g_assert_nonnull(f->op_start_s);
    const uint32_t stages = (uint32_t)MAX(u->stages, 1);
    uint64_t compared = 0;
    for (int r = 0; r < u->ranks_simulated; r++) {
        size_t fb, ub;
        if (!sim_result_timeline_row(u, (uint32_t)r, &ub))
            continue;
        g_assert_true(sim_result_timeline_row(f, (uint32_t)r, &fb));
        const uint32_t stage = (u->first_rank[r] / (uint32_t)s->plan.mp) % stages;
        for (uint32_t i = 0; i < u->n_ops; i++) {
            if (zp_sched_op(s, i)->stage != stage)
                continue;
            g_assert_cmpfloat(f->op_start_s[fb + i], ==, u->op_start_s[ub + i]);
            g_assert_cmpfloat(f->op_end_s[fb + i], ==, u->op_end_s[ub + i]);
            g_assert_cmpfloat(f->op_ready_s[fb + i], ==, u->op_ready_s[ub + i]);
            if (zp_sched_op(s, i)->kind == ZP_OP_COLLECTIVE)
                g_assert_cmpuint(f->op_last_rank[fb + i], ==, u->op_last_rank[ub + i]);
            compared++;
        }
    }
    g_assert_cmpuint(compared, >, 0);
}

static const FoldCase cases[] = {
    {"1f1b pp 2", 64, 32000, 0, 1, 1, 2, 1, 64, ZP_PIPE_1F1B, FALSE, TRUE},
    {"1f1b pp 4 tp 2 dp 2", 64, 32000, 1, 2, 2, 4, 1, 32, ZP_PIPE_1F1B, TRUE, TRUE},
    {"1f1b pp 8", 64, 32000, 0, 1, 1, 8, 1, 128, ZP_PIPE_1F1B, FALSE, TRUE},
    {"1f1b pp 64", 64, 32000, 0, 1, 1, 64, 1, 256, ZP_PIPE_1F1B, FALSE, TRUE},
    {"interleaved pp 4 v 2", 64, 32000, 0, 2, 1, 4, 2, 128, ZP_PIPE_INTERLEAVED, FALSE, TRUE},
    {"interleaved pp 8 v 2", 64, 32000, 0, 2, 1, 8, 2, 128, ZP_PIPE_INTERLEAVED, FALSE, TRUE},
    {"interleaved pp 8 v 2 x 512", 64, 32000, 0, 2, 1, 8, 2, 512, ZP_PIPE_INTERLEAVED, FALSE,
     TRUE},
    {"interleaved pp 4 v 4 x 256", 64, 32000, 0, 2, 1, 4, 4, 256, ZP_PIPE_INTERLEAVED, FALSE,
     TRUE},
    {"interleaved pp 16 v 2 x 512", 64, 32000, 0, 1, 1, 16, 2, 512, ZP_PIPE_INTERLEAVED, FALSE,
     TRUE},
    {"1f1b pp 16, 105 blocks (9 stages of 7, 7 of 6)", 105, 1024, 0, 1, 16, 16, 1, 256,
     ZP_PIPE_1F1B, FALSE, TRUE},
    {"1f1b pp 8, 61 blocks (5 stages of 8, 3 of 7), tp 2", 61, 1024, 1, 1, 16, 8, 1, 128,
     ZP_PIPE_1F1B, TRUE, TRUE},
    {"gpipe pp 4", 65, 1024, 0, 1, 1, 4, 1, 64, ZP_PIPE_GPIPE, FALSE, TRUE},
    {"gpipe pp 8", 64, 32000, 0, 1, 1, 8, 1, 64, ZP_PIPE_GPIPE, FALSE, TRUE},
    {"gpipe pp 8, checkpoints, tp 2", 64, 32000, 1, 2, 2, 8, 1, 96, ZP_PIPE_GPIPE, TRUE, TRUE},
    {"accumulation, stage 2", 65, 32000, 2, 16, 1, 1, 1, 64, ZP_PIPE_1F1B, FALSE, TRUE},
    {"accumulation, stage 3", 65, 32000, 3, 8, 1, 1, 1, 32, ZP_PIPE_1F1B, FALSE, TRUE},
    {"accumulation, stage 1", 65, 32000, 1, 16, 1, 1, 1, 64, ZP_PIPE_1F1B, FALSE, TRUE},
};

/* Folded and stepped event by event, each case gives the same result; those whose steady
 * state repeats (1F1B, interleaved, GPipe pp 4 with its slowest stage first, accumulation)
 * do jump. 1F1B over uneven stages with tensor parallelism across nodes repeats only every
 * heavy stage's worth of micro-steps (9 and 5 here: zp_pipe_heavy_stages), a shift the fold
 * tries since; both stepped every event before. An interleaved period is a group of pp micro-steps, or one micro-step up to its
 * group's end: interleaved pp 8 over 128 micro-steps stepped every event while each crossing
 * of a power of two left rounding to wash out; on the clock's grid (issue 40) none is left,
 * and it folds. GPipe
 * pp 8's last stage (the head) falls further behind each forward, its backlog of received
 * activations growing: that phase never repeats; its backward phase, which the last stage
 * leads, does, freeing a micro-step's activations a period. */
static void test_fold_equal(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        const FoldCase *c = &cases[k];
        ZpSchedule *s = fold_schedule(c);
        const SimOptions o = {.mode = SIM_MODE_FOLDED};
        SimResult *folded = run_fold(s, o, FALSE), *stepped = run_fold(s, o, TRUE);
        g_test_message("%s: %s (%u micro-steps skipped)", c->what, folded->fold_note,
                       folded->fold_micro_steps);
        assert_same_result(folded, stepped);
        g_assert_cmpuint(stepped->fold_jumps, ==, 0);
        g_assert_true(g_str_has_prefix(stepped->fold_note, "not folded: turned off"));
        if (c->must_fold)
            g_assert_cmpuint(folded->fold_jumps, >, 0);
        else if (c->schedule == ZP_PIPE_INTERLEAVED) /* the note says why */
            g_assert_nonnull(strstr(folded->fold_note, "interleaved: 16 groups of 8"));
        sim_result_free(folded);
        sim_result_free(stepped);
        zp_sched_free(s);
    }
}

/* With the timeline kept (every rank's, and the reported rank's alone, as --json keeps it),
 * the skipped periods' cells are written as the stepped run writes them. */
static void test_fold_timeline(void)
{
    const FoldCase *c = &cases[2];
    ZpSchedule *s = fold_schedule(c);
    SimOptions o = {.mode = SIM_MODE_FOLDED, .record_timeline = TRUE};
    SimResult *folded = run_fold(s, o, FALSE), *stepped = run_fold(s, o, TRUE);
    g_assert_cmpuint(folded->fold_jumps, >, 0);
    assert_same_result(folded, stepped);
    assert_same_timeline(s, folded, stepped);
    sim_result_free(folded);
    sim_result_free(stepped);
    const uint32_t last = (uint32_t)c->pp - 1;
    o = (SimOptions){.mode = SIM_MODE_FOLDED, .timeline_ranks = &last, .n_timeline_ranks = 1};
    folded = run_fold(s, o, FALSE);
    stepped = run_fold(s, o, TRUE);
    g_assert_cmpuint(folded->fold_jumps, >, 0);
    assert_same_result(folded, stepped);
    assert_same_timeline(s, folded, stepped);
    sim_result_free(folded);
    sim_result_free(stepped);
    zp_sched_free(s);
}

/* Builds plan p of model m, runs it folded and stepped, and checks they agree in every field
 * and every timeline cell; from 8 micro-steps on the fold must jump. `what` names the plan in
 * the test's log, with its widest op's dependencies and the fold's note. Counts the runs and
 * those that jumped. */
static void assert_fold_equal(const ZpModel *m, const ZpPlan *p, const char *what, int *jumped,
                              int *runs)
{
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, p, &error);
    g_assert_no_error(error);
    const SimOptions o = {.mode = SIM_MODE_FOLDED, .record_timeline = TRUE};
    SimResult *folded = run_fold(s, o, FALSE), *stepped = run_fold(s, o, TRUE);
    g_test_message("%s, an op of %u dependencies: %s", what, widest_op(s), folded->fold_note);
    assert_same_result(folded, stepped);
    assert_same_timeline(s, folded, stepped);
    if (p->grad_accum >= 8)
        g_assert_cmpuint(folded->fold_jumps, >, 0);
    *jumped += folded->fold_jumps > 0;
    (*runs)++;
    sim_result_free(folded);
    sim_result_free(stepped);
    zp_sched_free(s);
}

/* GPipe's backward phase where a stage falls behind the one after it each micro-step: the fold
 * proves it by three snapshots, each value moving by its own step, and the cells it writes for
 * the skipped periods move by their own steps too. They moved by the clock's period (the
 * stage it lags), so the lagging stage's cells fell ever further ahead of the stepped run's,
 * and an op in flight at the jump ended before it began (--trace: "dur":-3818.-617 in moe-tiny
 * on 16 A100s, 96 micro-batches). Every cell of every rank's timeline, tiny over 2 stages and
 * gpt-13b over 2 and 4, checkpointed or not, 32 micro-batches, each run jumping. */
static void test_fold_lagging_stage_timeline(void)
{
    const struct {
        const char *model;
        int pp;
    } plans[] = {{"tiny", 2}, {"gpt-13b", 2}, {"gpt-13b", 4}};
    int jumped = 0, runs = 0;
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++)
        for (int checkpoint = 0; checkpoint <= 1; checkpoint++) {
            ZpModel m;
            GError *error = NULL;
            g_assert_true(zp_model_load(plans[k].model, &m, &error));
            ZpPlan p;
            zp_plan_defaults(&p, 0, 1, 1);
            p.pipe = (ZpPipeConfig){.stages = plans[k].pp, .schedule = ZP_PIPE_GPIPE};
            p.grad_accum = 32;
            p.checkpoint = checkpoint;
            p.gpus_per_node = a100.gpus_per_node;
            char *what = g_strdup_printf("%s, gpipe over %d stages%s", plans[k].model,
                                         plans[k].pp, checkpoint ? ", checkpointed" : "");
            assert_fold_equal(&m, &p, what, &jumped, &runs);
            g_free(what);
        }
    g_assert_cmpint(jumped, ==, runs);
}

/* DeepSpeed's stage 1 without a pipeline reduces the last micro-step's gradients through the
 * ipg buffer micro-step 0's first gradient hook took (zp_impl_deepspeed.c ds_held_span): the
 * last micro-step's first all-reduce waits on that alloc, and begins counting down in
 * micro-step 0. The fold keeps it out of its window as a far op, compared in place
 * (sim_fold.c); before, the window ended at the schedule's end at every head and no plan of
 * this kind folded. Over 4 to 64 micro-steps, one ipg buffer and overlap_comm's two,
 * checkpointed or not, tensor-parallel or not, the folded run equals the stepped one in every
 * field and every timeline cell, and from 8 micro-steps on it jumps. */
static void test_fold_held_buckets(void)
{
    static const int accums[] = {4, 5, 8, 11, 24, 64};
    int jumped = 0, runs = 0;
    for (size_t a = 0; a < G_N_ELEMENTS(accums); a++)
        for (int variant = 0; variant < 8; variant++) {
            const gboolean overlap = variant & 1, ckpt = (variant >> 1) & 1;
            const int mp = variant & 4 ? 2 : 1;
            const FoldCase c = {"stage 1", 13, 32000, 1, 8, mp, 1, 1, accums[a],
                                ZP_PIPE_1F1B, ckpt, TRUE};
            const ZpModel m = sim_gpt_model(c.layers, c.vocab);
            ZpPlan p;
            zp_plan_defaults(&p, c.stage, c.dp, c.mp);
            p.grad_accum = c.accum;
            p.checkpoint = ckpt;
            p.zero.overlap_comm = overlap;
            p.gpus_per_node = a100.gpus_per_node;
            char *what = g_strdup_printf("%d micro-steps, overlap %d, ckpt %d, tp %d", c.accum,
                                         overlap, ckpt, mp);
            assert_fold_equal(&m, &p, what, &jumped, &runs);
            g_free(what);
        }
    g_test_message("%d of %d runs jumped", jumped, runs);
}

/* Small reduction buckets (Hugging Face's "auto" reduce_bucket_size is hidden x hidden) make
 * the step's optimizer and its workspace allocs wait on some hundreds of the last micro-step's
 * reductions: ops with over 255 dependencies, whose counts the engine keeps in pending_wide,
 * not in rows (sim_fold.c's wide ops). Such plans were refused ("an op with over 255
 * dependencies"). Over DeepSpeed's stages 0-3 without a pipeline (one ipg buffer and
 * overlap_comm's two, which halves the count over 2 stages) and stage 1 over 2 stages, 40
 * layers, 4 to 64 micro-steps, each plan has such an op (323 to 647 dependencies), and
 * its folded run equals the stepped one in every field and every timeline cell; from 8
 * micro-steps on it jumps. */
static void test_fold_wide_ops(void)
{
    static const int accums[] = {4, 8, 17, 64};
    static const struct {
        int stage, pp;
    } shapes[] = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {1, 2}};
    int jumped = 0, runs = 0;
    for (size_t a = 0; a < G_N_ELEMENTS(accums); a++)
        for (size_t k = 0; k < G_N_ELEMENTS(shapes); k++)
            for (int overlap = 0; overlap < 3 - shapes[k].pp; overlap++) {
                const ZpModel m = sim_gpt_model(40, 32000);
                ZpPlan p;
                zp_plan_defaults(&p, shapes[k].stage, 8, 1);
                p.pipe.stages = shapes[k].pp;
                p.grad_accum = accums[a];
                p.zero.overlap_comm = overlap;
                /* Hugging Face's "auto", hidden x hidden */
                p.zero.reduce_bucket_size = (double)m.hidden * m.hidden;
                p.gpus_per_node = a100.gpus_per_node;
                GError *error = NULL;
                ZpSchedule *s = zp_sched_build(&m, &p, &error);
                g_assert_no_error(error);
                g_assert_cmpuint(widest_op(s), >, 255);
                zp_sched_free(s);
                char *what = g_strdup_printf("stage %d pp %d, %d micro-steps, overlap %d",
                                             shapes[k].stage, shapes[k].pp, accums[a], overlap);
                assert_fold_equal(&m, &p, what, &jumped, &runs);
                g_free(what);
            }
    g_test_message("%d of %d runs jumped", jumped, runs);
}

/* ZeRO-Offload and ZeRO-Infinity with accumulation: the CPU optimizer waits on every
 * micro-step's gradient copies to the host (zp_build_cpu_optimizer_step, as DeepSpeed's step
 * follows every copy async_accumulate_grad_in_cpu_via_gpu made), so it began counting down at
 * micro-step 0 and stayed in the window, and no stage 2 or 3 plan folded; each copy's
 * dependents held it, which same_op saw as no period's (sim_fold.c's sinks). Over stages 1-3,
 * the optimizer to the CPU and to NVMe, stage 3's parameters to the CPU too, 4 to 64
 * micro-steps (an optimizer of 25 to 1,665 dependencies: rows and pending_wide), each folded
 * run equals the stepped one in every field and every timeline cell; from 8 micro-steps on it
 * jumps. */
static void test_fold_offload(void)
{
    static const int accums[] = {4, 8, 17, 64};
    int jumped = 0, runs = 0;
    static const struct {
        int stage;
        ZpOffloadDevice optimizer, param;
        gboolean small_buckets; /* Hugging Face's "auto", hidden x hidden: a wide optimizer */
    } shapes[] = {{1, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE, FALSE},
                  {2, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE, FALSE},
                  {2, ZP_OFFLOAD_NVME, ZP_OFFLOAD_NONE, FALSE},
                  {2, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE, TRUE},
                  {3, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE, FALSE},
                  {3, ZP_OFFLOAD_CPU, ZP_OFFLOAD_CPU, FALSE},
                  {3, ZP_OFFLOAD_NVME, ZP_OFFLOAD_NVME, FALSE}};
    for (size_t a = 0; a < G_N_ELEMENTS(accums); a++)
        for (size_t k = 0; k < G_N_ELEMENTS(shapes); k++) {
            const ZpModel m = sim_gpt_model(16, 32000);
            ZpPlan p;
            zp_plan_defaults(&p, shapes[k].stage, 8, 1);
            p.grad_accum = accums[a];
            p.zero.offload_optimizer.device = shapes[k].optimizer;
            p.zero.offload_param.device = shapes[k].param;
            if (shapes[k].small_buckets)
                p.zero.reduce_bucket_size = (double)m.hidden * m.hidden;
            p.gpus_per_node = a100.gpus_per_node;
            char *what = g_strdup_printf("stage %d, optimizer %d, parameters %d, %d micro-steps",
                                         shapes[k].stage, shapes[k].optimizer, shapes[k].param,
                                         accums[a]);
            assert_fold_equal(&m, &p, what, &jumped, &runs);
            g_free(what);
        }
    g_test_message("%d of %d runs jumped", jumped, runs);
}

/* A slow rank (a straggler computing 1.5x slower) among its stage's data-parallel peers sets
 * its ranks apart: the simulator runs rank classes, the fold is refused, and the result is
 * the unfolded one. Alone in its stage (dp 1) it makes that stage slower every micro-step
 * alike: the steady state still repeats exactly, and the folded run still equals the stepped
 * one. Explicit ranks refuse; a search's early stop (stop_after_s) is honoured. */
static void test_fold_refused(void)
{
    ZpSchedule *s = fold_schedule(&cases[1]); /* pp 4, tp 2, dp 2 */
    const SimSlow slow = {.index = 5, .factor = 1.5};
    SimOptions o = {.mode = SIM_MODE_FOLDED, .slow_ranks = &slow, .n_slow_ranks = 1};
    SimResult *folded = run_fold(s, o, FALSE), *stepped = run_fold(s, o, TRUE);
    g_assert_cmpint(folded->ranks_simulated, >, cases[1].pp);
    g_assert_cmpuint(folded->fold_jumps, ==, 0);
    g_assert_cmpuint(folded->fold_micro_steps, ==, 0);
    g_assert_nonnull(strstr(folded->fold_note, "not folded: a stage simulated as more"));
    assert_same_result(folded, stepped);
    sim_result_free(folded);
    sim_result_free(stepped);
    o = (SimOptions){.mode = SIM_MODE_EXPLICIT};
    folded = run_fold(s, o, FALSE);
    g_assert_cmpuint(folded->fold_jumps, ==, 0);
    sim_result_free(folded);
    zp_sched_free(s);

    s = fold_schedule(&cases[2]); /* pp 8, dp 1 */
    const SimSlow stage = {.index = 3, .factor = 1.5};
    o = (SimOptions){.mode = SIM_MODE_FOLDED, .slow_ranks = &stage, .n_slow_ranks = 1};
    folded = run_fold(s, o, FALSE);
    stepped = run_fold(s, o, TRUE);
    g_assert_cmpuint(folded->fold_jumps, >, 0);
    assert_same_result(folded, stepped);
    sim_result_free(folded);
    sim_result_free(stepped);
    /* A stop time in the middle of the steady state: the folded run stops where the stepped
     * one does. */
    o = (SimOptions){.mode = SIM_MODE_FOLDED};
    stepped = run_fold(s, o, TRUE);
    o.stop_after_s = stepped->step_time_s * 0.8;
    sim_result_free(stepped);
    folded = run_fold(s, o, FALSE);
    stepped = run_fold(s, o, TRUE);
    g_assert_true(folded->stopped && stepped->stopped);
    g_assert_cmpfloat(folded->step_time_s, ==, stepped->step_time_s);
    sim_result_free(folded);
    sim_result_free(stepped);
    zp_sched_free(s);
}

/* `zplan simulate ARGS --json` folds at least min_micro_steps micro-steps and prints what
 * --no-fold prints, the fold report and the event counts aside; the micro-steps of them it
 * counted as virtual periods (its schedule built that many short, cli_simulate.c
 * simulate_short; --no-fold's never). */
static int64_t assert_json_folds_exit(const char *args, int64_t min_micro_steps,
                                      int exit_status)
{
    json_t *folded = tu_zplan_json_exit(args, exit_status);
    char *no_fold = g_strdup_printf("%s --no-fold", args);
    json_t *stepped = tu_zplan_json_exit(no_fold, exit_status);
    g_free(no_fold);
    json_t *fold = json_object_get(folded, "fold");
    g_test_message("%s: %s", args, json_string_value(json_object_get(fold, "note")));
    g_assert_cmpint(json_integer_value(json_object_get(fold, "micro_steps")), >=,
                    min_micro_steps);
    g_assert_cmpint(json_integer_value(json_object_get(json_object_get(stepped, "fold"),
                                                       "micro_steps")), ==, 0);
    json_t *virt = json_object_get(fold, "virtual_micro_steps");
    g_assert_true(json_is_integer(virt));
    const int64_t virtual_micro_steps = json_integer_value(virt);
    g_assert_cmpint(virtual_micro_steps, <=, json_integer_value(json_object_get(fold, "micro_steps")));
    g_assert_cmpint(json_integer_value(json_object_get(json_object_get(stepped, "fold"),
                                                       "virtual_micro_steps")), ==, 0);
    const char *const aside[] = {"fold", "op_events", "heap_events"};
    for (size_t k = 0; k < G_N_ELEMENTS(aside); k++) {
        g_assert_nonnull(json_object_get(folded, aside[k]));
        json_object_del(folded, aside[k]);
        json_object_del(stepped, aside[k]);
    }
    g_assert_cmpuint(json_object_size(folded), >, 40);
    g_assert_true(json_equal(folded, stepped));
    json_decref(folded);
    json_decref(stepped);
    return virtual_micro_steps;
}

static int64_t assert_json_folds(const char *args, int64_t min_micro_steps)
{
    return assert_json_folds_exit(args, min_micro_steps, 0);
}

/* Megatron's 1T shape (pp 64 x tp 8 x dp 6, 512 micro-batches, issue 40's row) through
 * `zplan simulate --json`, folded and with --no-fold: every field the same but the event
 * counts (which the fold adds up per skipped period, so equal here too) and the fold's own
 * report; and the fold skips at least 440 of stage 0's 449 steady micro-steps, in one jump
 * across 16, 32 and 64 s (441 here). On the bare double clock it skipped 254 (each crossing
 * of a power of two left a pipeline round trip of rounding to wash out); on the grid with
 * each jump kept in one binade, 426 in 4 jumps. */
static void test_fold_megatron_1t(void)
{
    (void)assert_json_folds("simulate --model gpt-1t --cluster dgx-a100-80g --gpus 3072 --mp 8 "
                      "--pp 64 --stage 0 --micro-batch 1 --grad-accum 512 --checkpoint "
                      "--precision fp16 --attention eager --json",
                      440);
}

/* 1F1B with tensor parallelism across nodes (gpt3-175b, pp 4 x tp 16 x dp 2, 64 micro-
 * batches): the fill leaves a disturbance that comes back every pipeline round trip, so the
 * state repeats pp micro-steps on, never one; the fold tries that shift (sim_fold.c
 * MAX_SHIFTS) and skips 44 micro-steps (all virtual, the schedule built 5 pp long: one jump
 * of virtual periods alone), equal to --no-fold in every field. Before it tried only 1 and
 * 2, it folded none (plan --3d gpt-1t/4096's 1F1B pp 32 x tp 32 neither). */
static void test_fold_round_trip(void)
{
    (void)assert_json_folds("simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 128 --stage 1 "
                      "--mp 16 --pp 4 --micro-batch 1 --grad-accum 64 --attention flash2 "
                      "--json",
                      44);
}

/* The first jump comes two periods sooner where the state one period on is the state moved by
 * the period (sim_fold.c: two snapshots prove it on the grid, where three were taken): plan
 * --3d gpt-1t/4096's 1F1B pp 32 x tp 32 x dp 4 over 512 micro-batches, whose period is a
 * pipeline round trip, skips 352 micro-steps, all virtual from the schedule built 5 pp long
 * (288 with 7 pp kept, 224 with three snapshots and 9 pp), equal to --no-fold. */
static void test_fold_two_snapshots(void)
{
    assert_json_folds("simulate --model gpt-1t --cluster dgx-a100-80g --gpus 4096 --mp 32 "
                      "--pp 32 --stage 1 --micro-batch 1 --grad-accum 512 --checkpoint --json",
                      352);
}

/* Interleaved over few groups (pp 10 v 4 over 80 micro-batches: 8 groups of 10) folds by
 * jumps inside groups and, between them, a jump of whole groups: a jump inside a group keeps
 * the snapshots the group's shift proves its repeat from (sim_fold.c). 197 of each stage's
 * 320 chunk micro-steps in 5 jumps (inside groups 1 and 2, 3 whole groups, inside 6 and 7),
 * equal to the unfolded run; when a jump dropped every snapshot, the jumps inside each group
 * alone skipped 133 (and the group's shift, waited for, 68). The full schedule's run, in the
 * engine (through simulate it is built 2 groups short: short_plans, cli_rank_short_by). */
static void test_fold_few_groups(void)
{
    const FoldCase c = {"interleaved pp 10 v 4 x 80", 40, 32000, 0, 1, 1, 10, 4, 80,
                        ZP_PIPE_INTERLEAVED, TRUE, TRUE};
    ZpSchedule *s = fold_schedule(&c);
    SimResult *folded = run_fold(s, (SimOptions){0}, FALSE);
    SimResult *stepped = run_fold(s, (SimOptions){0}, TRUE);
    g_test_message("%s: %s", c.what, folded->fold_note);
    g_assert_cmpuint(folded->fold_micro_steps, >=, 197);
    assert_same_result(folded, stepped);
    sim_result_free(folded);
    sim_result_free(stepped);
    zp_sched_free(s);
}

/* Stage 0's first compute op of micro-step m starts at this time on rank 0 (a timeline's). */
static double micro_start_s(const ZpSchedule *s, const SimResult *r, int32_t m)
{
    size_t row;
    g_assert_true(sim_result_timeline_row(r, 0, &row));
    for (uint32_t i = 0; i < r->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->stage == 0 && op->kind == ZP_OP_COMPUTE && op->micro == m)
            return r->op_start_s[row + i];
    }
    g_assert_not_reached();
}

/* The clock's grid (issue 40) makes a jump exact across powers of two: each 1F1B case folds
 * its steady state in one jump that crosses at least one, and still equals the stepped run in
 * every field and every timeline cell. One jump of M of A micro-steps, from the head of
 * micro-step h >= 0 to h + M <= A - 1, skips at least [t(A - 1 - M), t(M)] of the stepped run
 * (t: stage 0's start of a micro-step): where those lie in different binades, a power of two
 * lies inside the jump. (Before the grid these took 3 or 4 jumps, each inside one binade.) */
static void test_fold_across_powers_of_two(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        const FoldCase *c = &cases[k];
        if (c->schedule != ZP_PIPE_1F1B || c->pp < 2)
            continue;
        ZpSchedule *s = fold_schedule(c);
        const SimOptions o = {.mode = SIM_MODE_FOLDED, .record_timeline = TRUE};
        SimResult *folded = run_fold(s, o, FALSE), *stepped = run_fold(s, o, TRUE);
        assert_same_result(folded, stepped);
        assert_same_timeline(s, folded, stepped);
        const int32_t M = (int32_t)folded->fold_micro_steps, A = c->accum;
        g_assert_cmpuint(folded->fold_jumps, ==, 1);
        g_assert_cmpint(2 * M, >, A);
        const double lo_s = micro_start_s(s, stepped, A - 1 - M), hi_s = micro_start_s(s, stepped, M);
        int lo_e, hi_e;
        frexp(lo_s, &lo_e);
        frexp(hi_s, &hi_e);
        g_test_message("%s: one jump of %d of %d micro-steps, over [%.4g, %.4g] s at least "
                       "(%d powers of two)",
                       c->what, M, A, lo_s, hi_s, hi_e - lo_e);
        g_assert_cmpint(hi_e, >, lo_e);
        sim_result_free(folded);
        sim_result_free(stepped);
        zp_sched_free(s);
    }
}

/* Past 2^22 s the clock has no grid, and the fold refuses: pp 4 of a GPT of hidden 65,536
 * with stage 1 a million times slower (alone in its stage, it keeps the steady state
 * repeating, as test_fold_refused shows) takes 27 days a micro-step and passes 2^22 s
 * (48.5 days) in the fill. The fold says why and the run equals the stepped one. (On the
 * bare double clock the same plan through `zplan simulate --slow-rank 1:1e6` folded 8
 * micro-steps, a jump in one binade.) */
static void test_fold_past_grid(void)
{
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", "fold-test-wide", "layers",
                          8, "hidden", 65536, "heads", 512, "seq_len", 1024, "vocab", 32000);
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_from_json(j, "fold-test-wide", &m, &error));
    json_decref(j);
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, 1);
    p.pipe.stages = 4;
    p.pipe.schedule = ZP_PIPE_1F1B;
    p.grad_accum = 32;
    p.gpus_per_node = a100.gpus_per_node;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const SimSlow slow = {.index = 1, .factor = 1e6};
    const SimOptions o = {.mode = SIM_MODE_FOLDED, .slow_ranks = &slow, .n_slow_ranks = 1};
    SimResult *folded = run_fold(s, o, FALSE), *stepped = run_fold(s, o, TRUE);
    g_test_message("step %.4g s (%.1f days): %s", folded->step_time_s,
                   folded->step_time_s / 86400, folded->fold_note);
    g_assert_cmpfloat(folded->step_time_s, >, 4 * SIM_CLOCK_GRID_END_S);
    g_assert_cmpuint(folded->fold_jumps, ==, 0);
    g_assert_cmpstr(folded->fold_note, ==,
                    "not folded: the clock passed 2^22 s (48.5 days), where its grid of "
                    "2^-30 s ends");
    assert_same_result(folded, stepped);
    sim_result_free(folded);
    sim_result_free(stepped);
    zp_sched_free(s);
}

/* Interleaved and GPipe schedules through the CLI: gpt-13b on 64 GPUs. Interleaved pp 4 v 4
 * (a group's shift, 4 micro-steps) and GPipe pp 8 (its backward phase) stepped everything
 * before; interleaved pp 8 v 2 over 512 micro-batches folds as before. */
static void test_fold_json_schedules(void)
{
    static const struct {
        const char *plan;
        int64_t min_micro_steps;
    } plans[] = {
        {"--pp 4 --pp-schedule interleaved --virtual-stages 4 --grad-accum 256", 128},
        {"--pp 8 --pp-schedule interleaved --virtual-stages 2 --grad-accum 512", 288},
        /* its stages on one node (tp-pp-dp): GPipe with sends across nodes (every stage
         * on a node of its own, as Megatron-Core's default order puts them here, or TP 8
         * under either order) finds no exact period and steps everything */
        {"--pp 8 --pp-schedule gpipe --grad-accum 64 --rank-order tp-pp-dp", 40},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
        char *args = g_strdup_printf("simulate --model gpt-13b --cluster dgx-a100-80g --gpus 64 "
                                     "--mp 1 --stage 0 --micro-batch 1 --checkpoint %s --json",
                                     plans[k].plan);
        (void)assert_json_folds(args, plans[k].min_micro_steps);
        g_free(args);
    }
}

/* A 1F1B period no shift names: mt-nlg-530b's 105 blocks over 64 stages with tp 4 repeat
 * every 40 micro-steps (41 stages hold a block more; with tp 8 and 16 they repeat every 41),
 * which the first stage's heads show (sim_fold.c found_period). It stepped every event
 * before; now it folds, equal to --no-fold in every field, and its virtual micro-steps, built
 * short by 82 x 3 (cli_rank_short_by) and then by 40 x 6 (SimResult.extend_period), count. */
static void test_fold_found_period(void)
{
    const int64_t virt = assert_json_folds("simulate --model mt-nlg-530b --cluster dgx-a100-80g "
                                           "--gpus 256 --mp 4 --pp 64 --stage 0 --micro-batch 1 "
                                           "--grad-accum 512 --checkpoint --json",
                                           240);
    g_assert_cmpint(virt, ==, 240);
}

/* Plans `simulate` runs from the schedule built short (cli_simulate.c simulate_short), their
 * missing steady periods counted as virtual ones, as the search evaluates a plan: 1F1B pp 4, 8
 * and 16 over many micro-batches, plain accumulation (stage 2, stage 3 checkpointed, stage 3
 * mostly exposed communication), interleaved (many groups, and 9 groups of 10 built 5 long),
 * a round trip's shift (tp 16 across nodes), uneven stages' shift and
 * Megatron's 1T row (the development set's narayanan21-t1-1008b, whose megatron-1008b.json is
 * gpt-1t's shape) count their virtual micro-steps (cli_rank_short_by's: the micro-batches past
 * those kept, in whole periods); --explicit, a slowed rank and GPipe run the full schedule (0
 * virtual). */
static const struct {
    const char *plan;
    int64_t min_micro_steps, virtual_micro_steps;
} short_plans[] = {
    {"--model gpt-13b --gpus 16 --stage 1 --pp 4 --grad-accum 64", 50, 52},
    {"--model gpt-13b --gpus 32 --stage 1 --pp 8 --grad-accum 128", 110, 112},
    /* 40 blocks over 16 stages (8 of 3): 2 x 8 more kept for uneven stages' shift, which
     * this plan does not need (88 virtual before, 72 since) */
    {"--model gpt-13b --gpus 64 --stage 1 --pp 16 --grad-accum 128 --checkpoint", 100, 72},
    {"--model gpt-13b --gpus 16 --stage 2 --grad-accum 64", 50, 56},
    {"--model gpt-13b --gpus 16 --stage 3 --grad-accum 64 --checkpoint", 50, 56},
    /* mostly exposed communication: the text's line on why reads the schedule's units */
    {"--model gpt-13b --gpus 256 --stage 3 --grad-accum 64 --seq 128", 50, 56},
    /* DeepSpeed's stage 1, its ipg buffers held from micro-step 0 (sim_fold.c's far ops): one,
     * and overlap_comm's two; gpt3-175b on 1,024 GPUs as plan --3d evaluates it (does not
     * fit: exit status 2) */
    {"--model gpt-13b --gpus 64 --stage 1 --grad-accum 64", 50, 56},
    {"--model gpt-13b --gpus 64 --stage 1 --grad-accum 64 --overlap", 50, 56},
    /* Hugging Face's "auto" reduce_bucket_size (hidden x hidden): the optimizer waits on
     * some 320 reductions (sim_fold.c's wide ops), which no fold took before */
    {"--model gpt-13b --gpus 64 --stage 2 --grad-accum 16 --reduce-bucket-size 26214400", 10, 8},
    {"--model gpt-13b --gpus 64 --stage 1 --grad-accum 64 --reduce-bucket-size 26214400 "
     "--overlap", 50, 56},
    /* ZeRO-Offload and ZeRO-Infinity with accumulation (the CPU step waits on every
     * micro-step's copies: sim_fold.c's sinks), built short as the search builds them; the
     * text's offload lines read the host tiers, which depend on grad_accum > 1 only
     * (zp_offload_stage2_accum), not on how many */
    {"--model gpt-13b --gpus 64 --stage 1 --grad-accum 16 --offload-optimizer cpu", 11, 8},
    {"--model gpt-13b --gpus 64 --stage 2 --grad-accum 16 --offload-optimizer cpu", 10, 8},
    {"--model gpt-13b --gpus 64 --stage 2 --grad-accum 64 --offload-optimizer nvme", 50, 56},
    {"--model gpt-13b --gpus 64 --stage 3 --grad-accum 16 --offload-optimizer cpu "
     "--offload-param cpu", 8, 8},
    {"--model gpt-13b --gpus 64 --stage 3 --grad-accum 64 --offload-optimizer nvme "
     "--offload-param nvme --reduce-bucket-size 26214400", 50, 56},
    {"--model gpt-13b --gpus 64 --stage 0 --checkpoint --pp 4 --pp-schedule interleaved "
     "--virtual-stages 4 --grad-accum 256", 128, 236},
    /* narayanan21-t1-529.6b's shape (8 groups) at a smaller scale: 8 groups of 10 built 5
     * long, the group's shift counts the other 3 between the jumps inside groups (built full
     * while the short run held those back: cli_rank_short_by) */
    {"--model gpt-13b --gpus 40 --stage 0 --checkpoint --pp 10 --pp-schedule interleaved "
     "--virtual-stages 4 --grad-accum 80", 107, 30},
    /* 9 groups of 10 built 5 long: the group's shift counts the other 4 */
    {"--model gpt-13b --gpus 40 --stage 0 --checkpoint --pp 10 --pp-schedule interleaved "
     "--virtual-stages 4 --grad-accum 90", 87, 40},
    {"--model gpt3-175b --gpus 128 --stage 1 --mp 16 --pp 4 --grad-accum 64 "
     "--attention flash2", 44, 44},
    {"--model gpt-1t --gpus 3072 --mp 8 --pp 64 --stage 0 --grad-accum 512 --checkpoint "
     "--precision fp16 --attention eager", 440, 440},
    /* Uneven stages (zp_pipe_heavy_stages): mt-nlg-530b's 105 blocks over 16 stages (9 of 7,
     * 7 of 6) repeat every 9 micro-steps, tp 8 in a node and tp 16 across nodes (k whole
     * periods of 18 and of 144, the round trip's too); gpt3-175b's 96 over 20 (16 of 5)
     * every 16. Each stepped every event before (sim_fold.c tried 1, 2 and pp only). */
    {"--model mt-nlg-530b --gpus 128 --mp 8 --pp 16 --stage 0 --grad-accum 256 --checkpoint",
     190, 198},
    {"--model mt-nlg-530b --gpus 256 --mp 16 --pp 16 --stage 0 --grad-accum 256 --checkpoint",
     200, 144},
    {"--model gpt3-175b --gpus 160 --mp 8 --pp 20 --stage 1 --grad-accum 256 --checkpoint", 170,
     176},
    /* Proofs whose shift repeated with no room left in the short schedule (its drain came
     * first), built short once more by a period fewer (SimResult.extend_room): bloom-176b's 70
     * blocks over 40 stages with tp 2 repeat every micro-step (k 210 -> 209); deepseek-v3's 61
     * over 16 with tp 8 every 12, not the 13 of its heavy stages (k 702 -> 684), its experts
     * split over TP (the paper's layout: DeepSpeed's whole experts at EP 1 do not fit). Each
     * ran its whole schedule before. */
    {"--model bloom-176b --gpus 80 --mp 2 --pp 40 --stage 0 --grad-accum 384 --checkpoint", 209,
     209},
    {"--model hf/deepseek-v3 --gpus 256 --mp 8 --pp 16 --stage 1 --grad-accum 768 --checkpoint "
     "--impl paper",
     684, 684},
    {"--model gpt-13b --gpus 32 --stage 1 --pp 8 --grad-accum 128 --explicit", 0, 0},
    {"--model gpt-13b --gpus 32 --stage 1 --pp 8 --grad-accum 128 --slow-rank 3:1.5", 0, 0},
    {"--model gpt-13b --gpus 64 --stage 0 --pp 8 --pp-schedule gpipe --grad-accum 64 "
     "--checkpoint --rank-order tp-pp-dp", 40, 0}, /* as in test_fold_json_schedules */
};

/* Megatron's 1T row without checkpointing does not fit (exit status 2): the allocator's
 * out-of-memory replay from the short schedule (zp_alloc_replay_schedule_extended) is the
 * full one's too. */
#define SHORT_OOM_PLAN                                                                           \
    "simulate --model gpt-1t --cluster dgx-a100-80g --gpus 3072 --mp 8 --pp 64 --stage 0 "      \
    "--micro-batch 1 --grad-accum 512 --precision fp16 --attention eager"

/* `simulate --json` on short_plans prints what --no-fold prints in every field, the fold
 * report and event counts aside, with the virtual micro-steps each plan counts; and the plan
 * that does not fit. */
static void test_fold_json_short(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(short_plans); k++) {
        char *args = g_strdup_printf("simulate --cluster dgx-a100-80g --micro-batch 1 %s --json",
                                     short_plans[k].plan);
        const int64_t virt = assert_json_folds(args, short_plans[k].min_micro_steps);
        g_assert_cmpint(virt, ==, short_plans[k].virtual_micro_steps);
        g_free(args);
    }
    int64_t virt = assert_json_folds_exit(SHORT_OOM_PLAN " --json", 440,
                                          CLI_EXIT_DOES_NOT_FIT);
    g_assert_cmpint(virt, ==, 440);
    virt = assert_json_folds_exit("simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 1024 "
                                  "--stage 1 --mp 8 --micro-batch 1 --grad-accum 24 --json",
                                  19, CLI_EXIT_DOES_NOT_FIT);
    g_assert_cmpint(virt, ==, 16);
}

/* `zplan simulate ARGS` (text) exits with exit_status and prints, line for line, what
 * --no-fold prints but its last line, the fold's: at least min_micro_steps folded, of them
 * `virtual_micro_steps` virtual (said only where some are), where --no-fold's says it was
 * turned off. The event counts' line is compared too: a jump moves them by its periods'. */
static void assert_text_folds(const char *args, int exit_status, int64_t min_micro_steps,
                              int64_t virtual_micro_steps)
{
    char *no_fold = g_strdup_printf("%s --no-fold", args);
    TuRun runs[2] = {tu_zplan(args), tu_zplan(no_fold)};
    g_free(no_fold);
    char **lines[2];
    for (int k = 0; k < 2; k++) {
        g_assert_true(WIFEXITED(runs[k].status));
        g_assert_cmpint(WEXITSTATUS(runs[k].status), ==, exit_status);
        lines[k] = g_strsplit(runs[k].out, "\n", -1);
    }
    const guint n = g_strv_length(lines[0]);
    g_assert_cmpuint(n, >, 20);
    g_assert_cmpuint(g_strv_length(lines[1]), ==, n);
    /* the output ends with the fold's line and a newline (an empty last piece) */
    g_assert_cmpstr(lines[0][n - 1], ==, "");
    for (guint i = 0; i + 2 < n; i++)
        g_assert_cmpstr(lines[0][i], ==, lines[1][i]);
    const char *fold = lines[0][n - 2];
    g_test_message("%s: %s", args, fold);
    g_assert_cmpstr(lines[1][n - 2], ==, "  not folded: turned off");
    if (min_micro_steps > 0) {
        unsigned micro_steps = 0, jumps = 0;
        g_assert_cmpint(sscanf(fold, "  folded: %u micro-steps of every stage skipped in %u",
                               &micro_steps, &jumps), ==, 2);
        g_assert_cmpuint(micro_steps, >=, min_micro_steps);
        g_assert_cmpuint(micro_steps, >=, virtual_micro_steps);
        g_assert_cmpuint(jumps, >, 0);
    }
    if (virtual_micro_steps > 0) {
        char *said = g_strdup_printf(", %" G_GINT64_FORMAT " of them virtual (the schedule "
                                     "built that many micro-steps short)", virtual_micro_steps);
        g_assert_true(g_str_has_suffix(fold, said));
        g_free(said);
    } else {
        g_assert_null(strstr(fold, "virtual"));
    }
    for (int k = 0; k < 2; k++) {
        g_strfreev(lines[k]);
        tu_free(&runs[k]);
    }
}

/* `simulate` as text on short_plans: what --no-fold prints, line for line, but the fold's
 * line, which says how many micro-steps were virtual (cli_simulate_out.c
 * cli_simulate_print_human says why every other line is the step's); and the plan that does
 * not fit, whose verdict and allocator lines come from the short schedule's replay. */
static void test_fold_text_short(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(short_plans); k++) {
        char *args = g_strdup_printf("simulate --cluster dgx-a100-80g --micro-batch 1 %s",
                                     short_plans[k].plan);
        assert_text_folds(args, 0, short_plans[k].min_micro_steps,
                          short_plans[k].virtual_micro_steps);
        g_free(args);
    }
    assert_text_folds(SHORT_OOM_PLAN, CLI_EXIT_DOES_NOT_FIT, 440, 440);
}

/* The caching allocator's replay skips a stage's repeated micro-steps (zp_alloc_replay.c)
 * and gives every figure of the full replay: unbounded, and against a capacity below its
 * reserved peak (the out-of-memory replay). The pipelines skip most of their events. */
static void test_fold_alloc_replay(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        const FoldCase *c = &cases[k];
        ZpSchedule *s = fold_schedule(c);
        const ZpAllocStats full = zp_alloc_replay_schedule_folded(s, 0, FALSE);
        const ZpAllocStats folded = zp_alloc_replay_schedule(s, 0);
        g_test_message("%s: %" G_GUINT64_FORMAT " allocs and frees skipped", c->what,
                       folded.folded_events);
        g_assert_cmpuint(full.folded_events, ==, 0);
        assert_same_alloc(&folded, &full);
        if (c->pp >= 8 && c->schedule == ZP_PIPE_1F1B)
            g_assert_cmpuint(folded.folded_events, >, 0);
        /* Its heads compared with those a group of pp before, not the last: 7,888 skipped
         * when every group's edge looked like a transient. */
        if (strcmp(c->what, "interleaved pp 4 v 4 x 256") == 0)
            g_assert_cmpuint(folded.folded_events, >=, 9808);
        const double capacity = 0.9 * full.peak_reserved_bytes;
        const ZpAllocStats full_oom = zp_alloc_replay_schedule_folded(s, capacity, FALSE);
        const ZpAllocStats folded_oom = zp_alloc_replay_schedule(s, capacity);
        g_assert_true(full_oom.oom);
        assert_same_alloc(&folded_oom, &full_oom);
        zp_sched_free(s);
    }
    /* Megatron's 1T shape: 64 stages of 512 micro-steps. */
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt-1t", &m, &error));
    ZpPlan p;
    zp_plan_defaults(&p, 0, 6, 8);
    p.impl = ZP_IMPL_MEGATRON;
    p.pipe.stages = 64;
    p.grad_accum = 512;
    p.checkpoint = TRUE;
    p.gpus_per_node = a100.gpus_per_node;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const ZpAllocStats full = zp_alloc_replay_schedule_folded(s, 0, FALSE);
    const ZpAllocStats folded = zp_alloc_replay_schedule(s, 0);
    uint64_t events = 0;
    for (guint i = 0; i < s->ops->len; i++)
        events += zp_sched_op(s, i)->kind == ZP_OP_ALLOC || zp_sched_op(s, i)->kind == ZP_OP_FREE;
    g_test_message("1T: %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT " allocs and frees skipped",
                   folded.folded_events, events);
    assert_same_alloc(&folded, &full);
    g_assert_cmpuint(folded.folded_events, >, events / 2);
    zp_sched_free(s);
}

/* ZeRO-2 and -3 with contiguous gradients (DeepSpeed's default) take each micro-step's
 * gradient buckets as slots of one region (zp_alloc_replay.c seq_events): the slots, which
 * leave the allocator alone once the region is taken, repeat with the rest, and the micro-steps
 * between the first few and the last are skipped (none were while a slot broke the
 * repetition; plan --3d gpt-1t/4096's ZeRO-2 plans of 8 micro-steps now skip about 30,000 of
 * their 42,000 allocs and frees each). */
static void test_fold_alloc_replay_slots(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt-1t", &m, &error));
    for (int stage = 2; stage <= 3; stage++) {
        ZpPlan p;
        zp_plan_defaults(&p, stage, 128, 32);
        p.grad_accum = 8;
        p.checkpoint = TRUE;
        p.gpus_per_node = a100.gpus_per_node;
        g_assert_true(p.zero.contiguous_gradients);
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        const ZpAllocStats full = zp_alloc_replay_schedule_folded(s, 0, FALSE);
        const ZpAllocStats folded = zp_alloc_replay_schedule(s, 0);
        g_test_message("stage %d, contiguous gradients: %" G_GUINT64_FORMAT
                       " allocs and frees skipped", stage, folded.folded_events);
        assert_same_alloc(&folded, &full);
        g_assert_cmpuint(folded.folded_events, >, 0);
        const double capacity = 0.9 * full.peak_reserved_bytes;
        const ZpAllocStats full_oom = zp_alloc_replay_schedule_folded(s, capacity, FALSE);
        const ZpAllocStats folded_oom = zp_alloc_replay_schedule(s, capacity);
        assert_same_alloc(&folded_oom, &full_oom);
        zp_sched_free(s);
    }
}

static void push_mem(GArray *ops, uint8_t kind, uint8_t sub, int buffer, double bytes,
                     int micro, uint32_t stage)
{
    const ZpOp op = {.kind = kind, .sub = sub, .buffer = buffer, .bytes = bytes,
                     .micro = micro, .stage = stage, .unit = -1};
    g_array_append_val(ops, op);
}

/* A hand-made sequence through the fold: two stages of 64 micro-steps, each keeping k
 * micro-batches' 40 MB activations (their blocks turn round every k micro-steps), a small
 * and a split large scratch buffer a micro-step, a 300 MB buffer held the whole stage (a
 * handle that stays: fixed) and, on stage 1, a 1 MB one taken at micro-step 40 and held (the
 * state changes in the middle of a steady run). Every figure equals the full replay, with
 * and without a capacity that runs out, and whole periods are skipped. */
static void test_fold_alloc_replay_made(void)
{
    ZpSchedule *s = fold_schedule(&cases[0]);
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(ZpOp));
    int id = 0;
    const int A = 64, keep[2] = {5, 3};
    for (uint32_t st = 0; st < 2; st++) {
        const int k = keep[st], held = id++, act0 = id;
        id += A;
        int extra = -1;
        push_mem(ops, ZP_OP_ALLOC, ZP_MEM_GRADS, held, 3e8, 0, st);
        for (int m = 0; m < A; m++) {
            const int tmp = id++, split = id++, grad = id++;
            push_mem(ops, ZP_OP_ALLOC, ZP_MEM_ACTIVATIONS, act0 + m, 4e7, m, st);
            push_mem(ops, ZP_OP_ALLOC, ZP_MEM_WORKSPACE, tmp, 3e5, m, st);
            push_mem(ops, ZP_OP_ALLOC, ZP_MEM_WORKSPACE, split, 5e6, m, st);
            push_mem(ops, ZP_OP_FREE, ZP_MEM_WORKSPACE, tmp, 3e5, m, st);
            if (m >= k) {
                push_mem(ops, ZP_OP_ALLOC, ZP_MEM_WORKSPACE, grad, 1.2e7, m - k, st);
                push_mem(ops, ZP_OP_FREE, ZP_MEM_ACTIVATIONS, act0 + m - k, 4e7, m - k, st);
                push_mem(ops, ZP_OP_FREE, ZP_MEM_WORKSPACE, grad, 1.2e7, m - k, st);
            }
            push_mem(ops, ZP_OP_FREE, ZP_MEM_WORKSPACE, split, 5e6, m, st);
            if (st == 1 && m == 40) {
                extra = id++;
                push_mem(ops, ZP_OP_ALLOC, ZP_MEM_WORKSPACE, extra, 1e6, m, st);
            }
        }
        for (int m = A - k; m < A; m++)
            push_mem(ops, ZP_OP_FREE, ZP_MEM_ACTIVATIONS, act0 + m, 4e7, m, st);
        push_mem(ops, ZP_OP_FREE, ZP_MEM_GRADS, held, 3e8, -1, st);
        if (extra >= 0)
            push_mem(ops, ZP_OP_FREE, ZP_MEM_WORKSPACE, extra, 1e6, -1, st);
    }
    g_array_unref(s->ops);
    s->ops = ops;
    memset(s->state_bytes, 0, sizeof s->state_bytes);
    const ZpAllocStats full = zp_alloc_replay_schedule_folded(s, 0, FALSE);
    const ZpAllocStats folded = zp_alloc_replay_schedule(s, 0);
    g_test_message("made: %" G_GUINT64_FORMAT " of %u allocs and frees skipped",
                   folded.folded_events, ops->len);
    assert_same_alloc(&folded, &full);
    g_assert_cmpuint(folded.folded_events, >, ops->len / 3);
    const double capacity = 0.8 * full.peak_reserved_bytes;
    const ZpAllocStats full_oom = zp_alloc_replay_schedule_folded(s, capacity, FALSE);
    const ZpAllocStats folded_oom = zp_alloc_replay_schedule(s, capacity);
    assert_same_alloc(&folded_oom, &full_oom);
    zp_sched_free(s);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_test_add_func("/sim/fold/equal", test_fold_equal);
    g_test_add_func("/sim/fold/timeline", test_fold_timeline);
    g_test_add_func("/sim/fold/lagging-stage-timeline", test_fold_lagging_stage_timeline);
    g_test_add_func("/sim/fold/refused", test_fold_refused);
    g_test_add_func("/sim/fold/held-buckets", test_fold_held_buckets);
    g_test_add_func("/sim/fold/wide-ops", test_fold_wide_ops);
    g_test_add_func("/sim/fold/offload", test_fold_offload);
    g_test_add_func("/sim/fold/megatron-1t", test_fold_megatron_1t);
    g_test_add_func("/sim/fold/round-trip", test_fold_round_trip);
    g_test_add_func("/sim/fold/two-snapshots", test_fold_two_snapshots);
    g_test_add_func("/sim/fold/few-groups", test_fold_few_groups);
    g_test_add_func("/sim/fold/across-powers-of-two", test_fold_across_powers_of_two);
    g_test_add_func("/sim/fold/past-grid", test_fold_past_grid);
    g_test_add_func("/sim/fold/json-schedules", test_fold_json_schedules);
    g_test_add_func("/sim/fold/json-short", test_fold_json_short);
    g_test_add_func("/sim/fold/found-period", test_fold_found_period);
    g_test_add_func("/sim/fold/text-short", test_fold_text_short);
    g_test_add_func("/sim/fold/alloc-replay", test_fold_alloc_replay);
    g_test_add_func("/sim/fold/alloc-replay-made", test_fold_alloc_replay_made);
    g_test_add_func("/sim/fold/alloc-replay-slots", test_fold_alloc_replay_slots);
    return sim_common_run();
}
