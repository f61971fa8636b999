/* test_search_prune: the search's branch and bound changes no answer: on several plans the
 * pruned search ranks exactly as the exhaustive one (ZpSearchSpec.exhaustive), and every bound
 * is below the step the simulator gives its plan. */
#include "plan_common.h"

#include <math.h>
#include <string.h>

typedef struct {
    const char *name, *model, *cluster;
    int gpus;
    int64_t global_batch;
    gboolean three_d;
    int mp, stage; /* 0 and -1: searched */
    /* GPU memory cut to just below the least any plan needs when simulated, so that nothing
     * fits though plans pass the closed-form screen (simulated over memory) */
    gboolean squeeze;
    /* the bound with the schedule's gathers leaves some stage-3 plans out (past_stop) */
    gboolean gathers;
} PruneCase;

static gboolean run_search(const PruneCase *pc, const ZpModel *m, const ZpHw *hw,
                           gboolean exhaustive, ZpSearchResult *r)
{
    ZpSearchSpec spec;
    CliRankContext ctx;
    cli_search_spec(&spec, &ctx, m, hw, pc->gpus);
    spec.global_batch = pc->global_batch;
    spec.three_d = pc->three_d;
    spec.mp = pc->mp;
    spec.stage = pc->stage;
    /* as `zplan plan` searches by default: the profile's attention kernel and gradient
     * dtype, lossy ZeRO++ left out */
    ZpPlan kernels;
    zp_plan_defaults(&kernels, 0, 1, 1);
    g_assert_true(cli_attention_reduce(NULL, NULL, hw, spec.precision, &kernels, NULL));
    spec.attention = kernels.attention;
    spec.reduce_dtype = kernels.reduce_dtype;
    spec.exclude = CLI_LOSSY_ZEROPP;
    spec.exhaustive = exhaustive;
    GError *error = NULL;
    const gboolean ok = zp_search_run(&spec, r, &error);
    g_assert_no_error(error);
    return ok;
}

/* The plan and the figures `zplan plan` prints for one ranked or best plan. */
static void assert_same_plan(const ZpSearchResult *a, int ia, const ZpSearchResult *b, int ib)
{
    g_assert_cmpint(ia < 0, ==, ib < 0);
    if (ia < 0)
        return;
    const ZpCandidate *x = zp_search_candidate(a, ia), *y = zp_search_candidate(b, ib);
    g_assert_cmpint(ia, ==, ib); /* the same enumeration: the same plan */
    g_assert_true(memcmp(&x->plan, &y->plan, sizeof x->plan) == 0);
    g_assert_cmpfloat(x->step_time_s, ==, y->step_time_s);
    g_assert_cmpfloat(x->peak_memory_bytes, ==, y->peak_memory_bytes);
}

static void check_case(gconstpointer data)
{
    const PruneCase *pc = data;
    const ZpModel m = tu_load_model(pc->model);
    ZpHw hw = tu_load_hw(pc->cluster);
    ZpSearchResult pruned, full;
    /* Squeezed: below the least need of the plans that fit, again while some fit (a ZeRO-R
     * level is tried once the level before it does not fit, and may). */
    for (gboolean fits = pc->squeeze; fits;) {
        g_assert_true(run_search(pc, &m, &hw, TRUE, &full));
        double least = G_MAXDOUBLE;
        for (guint i = 0; i < full.candidates->len; i++)
            if (zp_search_candidate(&full, (int)i)->fate == ZP_FATE_SIMULATED)
                least = MIN(least, zp_search_candidate(&full, (int)i)->peak_memory_bytes);
        fits = least < G_MAXDOUBLE;
        if (fits)
            hw.gpu_memory_bytes = least * (1 - 1e-3);
        zp_search_result_clear(&full);
    }
    g_assert_true(run_search(pc, &m, &hw, FALSE, &pruned));
    g_assert_true(run_search(pc, &m, &hw, TRUE, &full));
    g_assert_cmpuint(pruned.candidates->len, ==, full.candidates->len);

    /* The exhaustive search simulated every plan the screen let through (bar ZeRO-R and
     * ZeRO++ children of a fitting parent) to the end: each bound must be below its step. */
    guint simulated = 0, skipped = 0, fails = 0;
    double pipe_tightest = 0; /* the largest bound / step of a pipeline plan */
    for (guint i = 0; i < full.candidates->len; i++) {
        const ZpCandidate *c = zp_search_candidate(&full, (int)i);
        g_assert_cmpfloat(zp_search_candidate(&pruned, (int)i)->memory_bytes, ==, c->memory_bytes);
        if (c->fate != ZP_FATE_SIMULATED && c->fate != ZP_FATE_SIMULATED_OOM)
            continue;
        simulated++;
        g_assert_cmpfloat(c->step_time_s, >, 0);
        if (zp_plan_pp(&c->plan) > 1)
            pipe_tightest = MAX(pipe_tightest, c->bound_step_s / c->step_time_s);
        if (!(c->bound_step_s <= c->step_time_s) && ++fails)
            g_printerr("%s: plan %u (stage %d, mp %d x pp %d v%d x dp %d, micro %d x %d, ckpt %d, "
                    "overlap %d, buckets %d) bound %.9g s is above its simulated step %.9g s\n",
                    pc->name, i, c->plan.zero.stage, c->plan.mp, zp_plan_pp(&c->plan),
                    zp_plan_vstages(&c->plan), c->plan.dp, c->plan.micro_batch,
                    c->plan.grad_accum, c->plan.checkpoint, c->plan.zero.overlap_comm, c->buckets,
                    c->bound_step_s, c->step_time_s);
        const ZpCandidate *p = zp_search_candidate(&pruned, (int)i);
        if (p->fate == ZP_FATE_CANNOT_WIN && p->step_time_s == 0)
            skipped++; /* the bound alone left it out */
    }
    g_test_message("%s: %u plans, %u simulated exhaustively; the pruned search left %u out by "
                   "their bound and %u by the bound with the schedule's gathers, simulated %u "
                   "to the end and stopped %u; the pipeline plans' bounds at most %.4f of their step",
                   pc->name, full.candidates->len, simulated, skipped, pruned.past_stop,
                   pruned.count[ZP_FATE_SIMULATED] + pruned.count[ZP_FATE_SIMULATED_OOM],
                   pruned.stopped, pipe_tightest);

    g_assert_cmpuint(fails, ==, 0);
    g_assert_true(!pc->gathers || pruned.past_stop > 0);

    /* The ranking, each stage's best (with and without checkpointing) and the pipelines'
     * best: what `zplan plan` prints, plan for plan and figure for figure. */
    g_assert_cmpuint(pruned.ranked->len, ==, full.ranked->len);
    for (guint i = 0; i < full.ranked->len; i++)
        assert_same_plan(&pruned, (int)g_array_index(pruned.ranked, guint, i), &full,
                         (int)g_array_index(full.ranked, guint, i));
    for (int stage = 0; stage < 4; stage++)
        for (int ckpt = 0; ckpt < 2; ckpt++)
            assert_same_plan(&pruned, pruned.stage_best[stage][ckpt], &full,
                             full.stage_best[stage][ckpt]);
    for (int ckpt = 0; ckpt < 2; ckpt++)
        assert_same_plan(&pruned, pruned.pipe_best[ckpt], &full, full.pipe_best[ckpt]);
    /* Nothing fits: the pruned search simulated every plan the screen passed too, so the
     * plan over memory by the least is the same. */
    if (full.ranked->len == 0) {
        g_assert_cmpint(pruned.closest, ==, full.closest);
        g_assert_cmpint(pruned.closest, >=, 0);
        for (int stage = 0; stage < 4; stage++)
            for (int ckpt = 0; ckpt < 2; ckpt++)
                g_assert_cmpint(pruned.stage_closest[stage][ckpt], ==,
                                full.stage_closest[stage][ckpt]);
    }
    g_assert_true(!pc->squeeze ||
                  (full.ranked->len == 0 && full.count[ZP_FATE_SIMULATED_OOM] > 0));
    zp_search_result_clear(&pruned);
    zp_search_result_clear(&full);
}

/* The elements a built schedule's parameter fetches gather. */
static double schedule_gathered_elems(const ZpModel *m, const ZpPlan *p)
{
    ZpSchedule *s = zp_sched_build(m, p, NULL);
    g_assert_nonnull(s);
    double gathered = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (zp_sched_coll_fetches(s, op))
            gathered += (double)op->elems;
    }
    zp_sched_free(s);
    return gathered;
}

/* zp_sched_gathered_elems is at most what the built schedule gathers each micro-step (the
 * search's bound rests on it): a second micro-step adds that (at mp 2 a few thousand
 * elements more), and a first one with the step's own gathers no less. Every stage-3
 * implementation, with and without checkpointing, at DeepSpeed's buckets and at small ones
 * (prefetch and reuse then leave more to gather again). */
static void test_gathered_elems_are_the_schedules(void)
{
    static const ZpImplKind impls[] = {ZP_IMPL_DEEPSPEED, ZP_IMPL_FSDP, ZP_IMPL_FSDP2,
                                       ZP_IMPL_PAPER};
    const ZpModel m = tu_load_model("gpt2-124m");
    for (size_t k = 0; k < G_N_ELEMENTS(impls); k++)
        for (int variant = 0; variant < 4; variant++) {
            ZpPlan p;
            zp_plan_defaults(&p, 3, 4, 1 + (variant & 1));
            p.impl = impls[k];
            zp_impl_plan_defaults(&p);
            p.micro_batch = 2;
            p.checkpoint = (variant >> 1) & 1;
            if (variant & 1) { /* small buckets: more calls, less kept */
                p.zero.stage3_prefetch_bucket_size = 1e5;
                p.zero.stage3_max_live_parameters = 1e6;
                p.zero.stage3_max_reuse_distance = 1e6;
            }
            const double per_micro = zp_sched_gathered_elems(&m, &p);
            p.grad_accum = 1;
            const double one = schedule_gathered_elems(&m, &p);
            p.grad_accum = 2;
            const double two = schedule_gathered_elems(&m, &p);
            g_test_message("%s variant %d: %.0f a micro-step, the schedule %.0f and %.0f more",
                           zp_impl_get(impls[k])->name, variant, per_micro, one, two - one);
            g_assert_cmpfloat(per_micro, >, 0);
            g_assert_cmpfloat(two - one, >=, per_micro);
            g_assert_cmpfloat(one, >=, per_micro);
        }
}

static const PruneCase cases[] = {
    /* A small model: stages 0-3, TP in a node, ZeRO-R and ZeRO++ variants. */
    {"gpt2-1.5b-64", "gpt2-1.5b", "dgx2-v100", 64, 512, FALSE, 0, -1, FALSE, FALSE},
    /* Pipelines (1F1B and interleaved) beside ZeRO, at TP 2 (where stage 0 with pp 2 found the
     * bubble stretching the optimizer). */
    {"gpt-13b-3d-mp2", "gpt-13b", "dgx-a100-80g", 64, 256, TRUE, 2, -1, FALSE, FALSE},
    /* Nothing fits: 1T parameters on 8 GPUs (every plan over memory in closed form), and
     * gpt2-1.5b on GPUs a little smaller than its leanest plan needs (some simulated). */
    {"gpt-1t-8", "gpt-1t", "dgx-a100-80g", 8, 0, FALSE, 0, -1, FALSE, FALSE},
    {"gpt2-1.5b-64-squeezed", "gpt2-1.5b", "dgx2-v100", 64, 512, FALSE, 0, -1, TRUE, FALSE},
    /* gpt-1t on 1,024 A100s (bench_plan's first search): stage-3 plans that gather their
     * blocks again (recompute, micro-steps) are left out by the bound with those gathers. */
    {"gpt-1t-1024", "gpt-1t", "dgx-a100-80g", 1024, 0, FALSE, 0, -1, FALSE, TRUE},
    /* The benchmark's 3D search (bench_plan), at one TP degree: gpt-1t on 4,096 A100s. */
    {"gpt-1t-4096-3d-mp8", "gpt-1t", "dgx-a100-80g", 4096, 2048, TRUE, 8, -1, FALSE, FALSE},
    /* ... at TP 4, where two stages share a node: the pipeline's sends alternate between
     * NVLink and the network (fill_drain_sends_s times each boundary). */
    {"gpt-1t-4096-3d-mp4", "gpt-1t", "dgx-a100-80g", 4096, 2048, TRUE, 4, -1, FALSE, FALSE},
};

/* With -m slow: the whole of it, every TP degree (some 1,700 plans simulated exhaustively,
 * minutes of CPU). */
static const PruneCase slow_case = {"gpt-1t-4096-3d", "gpt-1t", "dgx-a100-80g", 4096, 2048,
                                    TRUE, 0, -1, FALSE, TRUE};

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    plan_common_init();
    g_test_add_func("/search-prune/gathered-elems-are-the-schedules",
                    test_gathered_elems_are_the_schedules);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *path = g_strdup_printf("/search-prune/%s", cases[i].name);
        g_test_add_data_func(path, &cases[i], check_case);
        g_free(path);
    }
    if (g_test_slow())
        g_test_add_data_func("/search-prune/gpt-1t-4096-3d", &slow_case, check_case);
    return plan_common_run();
}
