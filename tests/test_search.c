/* test_search: the planner's search: its compute ops match the schedule's, its screen is
 * zp_mem's, its bound prunes nothing it should keep, ZeRO-R and ZeRO++ knobs, and ties. */
#include "plan_common.h"

/* ---- the screen and the bound ---------------------------------------------------------- */

/* zp_sched_compute_ops is the schedule's compute in closed form: the same count of every kind
 * and every op of a kind with the same cost, padding included (dp 3 pads every unit). */
static void test_compute_ops_match_schedule(void)
{
    ZpModel m = tu_load_model("gpt2-124m");
    for (int stage = 0; stage <= 3; stage++)
        for (int mp = 1; mp <= 2; mp++) {
            ZpPlan p;
            zp_plan_defaults(&p, stage, 3, mp);
            p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
            p.micro_batch = 2;
            p.grad_accum = 2;
            p.checkpoint = stage % 2;
            ZpComputeOps ops[ZP_COMP_N];
            zp_sched_compute_ops(&m, &p, ops);
            ZpSchedule *s = zp_sched_build(&m, &p, NULL);
            g_assert_nonnull(s);
            uint64_t count[ZP_COMP_N] = {0};
            for (guint i = 0; i < s->ops->len; i++) {
                const ZpOp *op = zp_sched_op(s, i);
                if (op->kind != ZP_OP_COMPUTE)
                    continue;
                count[op->sub]++;
                g_assert_cmpfloat(op->flops, ==, ops[op->sub].flops);
                g_assert_cmpfloat(op->gemm_flops, ==, ops[op->sub].gemm_flops);
                g_assert_cmpfloat(op->mem_bytes, ==, ops[op->sub].mem_bytes);
            }
            for (int k = 0; k < ZP_COMP_N; k++)
                g_assert_cmpuint(count[k], ==, ops[k].count);
            zp_sched_free(s);
        }
}

/* The screen's memory is zp_mem's model states + residual (reserve included). */
static void test_screen_memory_is_zp_mem(void)
{
    ZpModel m = tu_load_model("gpt2-1.5b");
    ZpHw hw = tu_load_hw("dgx2-v100");
    ZpSearchSpec spec;
    zp_search_spec_defaults(&spec, &m, &hw, 64);
    ZpScreen screen;
    g_assert_true(zp_search_screen_init(&screen, &spec, NULL));
    GArray *plans = zp_search_enumerate(&spec, NULL);
    g_assert_nonnull(plans);
    g_assert_cmpuint(plans->len, >, 100);
    for (guint i = 0; i < plans->len; i++) {
        const ZpPlan *p = &g_array_index(plans, ZpCandidate, i).plan;
        double memory, bound;
        zp_search_screen(&screen, p, &memory, &bound);
        const ZpModelStates st = zp_mem_model_states(
            (double)zp_model_param_count(&m), p->zero.stage, p->dp, p->mp,
            zp_plan_state_bytes(p->precision, p->optimizer));
        g_assert_cmpfloat(memory, ==, st.total_bytes + zp_mem_residual(&m, p, &hw).total_bytes);
        g_assert_cmpfloat(bound, >, 0);
    }
    g_array_unref(plans);
}

/* The ranking callback, recording what it simulated. */
typedef struct {
    CliRankContext sim;
    guint calls;
} Recorder;

static gboolean record(const ZpPlan *plan, void *ctx, double stop_after_s, double *step_s,
                       double *peak, GError **error)
{
    Recorder *r = ctx;
    r->calls++;
    return cli_rank_by_simulation(plan, &r->sim, stop_after_s, step_s, peak, error);
}

/* A search never prices a kernel that cannot launch: a spec with FlashAttention-2 in fp32,
 * or on a V100, is refused before any plan is tried (zp_hw_attention_check). */
static void test_refuses_unrunnable_attention(void)
{
    ZpModel m = tu_load_model("tiny");
    static const struct {
        const char *cluster;
        ZpPrecision precision;
        const char *message;
    } cases[] = {
        {"dgx-h100", ZP_PREC_FP32, "--attention: flash2 takes only fp16 or bf16 inputs, not fp32"},
        {"dgx2-v100", ZP_PREC_FP16, "--attention: flash2 in fp16 needs compute capability 8.0"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpHw hw = tu_load_hw(cases[i].cluster);
        ZpSearchSpec spec;
        Recorder rec = {.sim = {&m, &hw}};
        cli_search_spec(&spec, &rec.sim, &m, &hw, 8);
        spec.rank = record;
        spec.rank_ctx = &rec;
        spec.precision = cases[i].precision;
        spec.attention = ZP_ATTN_FLASH2;
        ZpSearchResult r;
        GError *error = NULL;
        g_assert_false(zp_search_run(&spec, &r, &error));
        g_assert_nonnull(error);
        g_assert_nonnull(strstr(error->message, cases[i].message));
        g_assert_cmpuint(rec.calls, ==, 0);
        g_clear_error(&error);
    }
}

/* The bound never exceeds the simulated step (so pruning loses nothing), the plans it pruned
 * really were slower than the K-th or their group's best, and the best plan fits. */
static void check_search(const char *model_name, const char *cluster, int gpus, int64_t batch)
{
    ZpModel m = tu_load_model(model_name);
    ZpHw hw = tu_load_hw(cluster);
    ZpSearchSpec spec;
    Recorder rec = {.sim = {&m, &hw}};
    cli_search_spec(&spec, &rec.sim, &m, &hw, gpus);
    spec.rank = record;
    spec.rank_ctx = &rec;
    spec.global_batch = batch;
    spec.top_k = 3;
    ZpSearchResult r;
    GError *error = NULL;
    g_assert_true(zp_search_run(&spec, &r, &error));
    g_assert_no_error(error);
    g_assert_cmpuint(rec.calls, ==,
                     r.count[ZP_FATE_SIMULATED] + r.count[ZP_FATE_SIMULATED_OOM] + r.stopped);
    g_assert_cmpuint(r.ranked->len, >, 0);
    const ZpCandidate *best = zp_search_ranked(&r, 0);
    g_assert_cmpfloat(best->peak_memory_bytes, <=, hw.gpu_memory_bytes);
    const ZpCandidate *kth = zp_search_ranked(&r, r.ranked->len - 1);
    const double kth_ps = kth->step_time_s / zp_search_samples(&kth->plan);
    guint pruned_checked = 0;
    for (guint i = 0; i < r.candidates->len; i++) {
        const ZpCandidate *c = zp_search_candidate(&r, (int)i);
        if (c->fate == ZP_FATE_SIMULATED || c->fate == ZP_FATE_SIMULATED_OOM)
            g_assert_cmpfloat(c->bound_step_s, <=, c->step_time_s * (1 + 1e-9));
        if (c->fate == ZP_FATE_SIMULATED)
            g_assert_cmpfloat(c->peak_memory_bytes, <=, hw.gpu_memory_bytes);
        if (c->fate != ZP_FATE_CANNOT_WIN || pruned_checked >= 40)
            continue;
        /* Simulate a pruned plan anyway: it is no faster per sample than the K-th, or, a
         * ZeRO-R level left out because a level before it fits, than that level. */
        double step_s, peak;
        g_assert_true(cli_rank_by_simulation(&c->plan, &rec.sim, 0, &step_s, &peak, NULL));
        g_assert_cmpfloat(c->bound_step_s, <=, step_s * (1 + 1e-9));
        const ZpCandidate *parent = c->parent >= 0 ? zp_search_candidate(&r, c->parent) : NULL;
        while (parent && parent->fate == ZP_FATE_CANNOT_WIN && parent->parent >= 0)
            parent = zp_search_candidate(&r, parent->parent);
        /* A ZeRO++ plan at smaller buckets than its parent's is left out for memory the
         * parent does not need: the same bytes, its step within 1% of the parent's
         * (zp_search.c zeropp_buckets; smaller buckets launch a little earlier, as DeepSpeed's
         * hooks reduce them, so it may be that much faster). A ZeRO-R level is no faster. */
        const gboolean buckets = parent && c->buckets != parent->buckets;
        if (parent && parent->fate == ZP_FATE_SIMULATED)
            g_assert_cmpfloat(step_s, >=, parent->step_time_s * (1 - (buckets ? 1e-2 : 1e-9)));
        else
            g_assert_cmpfloat(step_s / zp_search_samples(&c->plan), >=, kth_ps * (1 - 1e-9));
        pruned_checked++;
    }
    /* Fastest first; times equal to 1e-4 (the search's twin tolerance) list the plan with
     * more memory left first. */
    for (guint i = 1; i < r.ranked->len; i++) {
        const ZpCandidate *a = zp_search_ranked(&r, i - 1), *b = zp_search_ranked(&r, i);
        const double a_ps = a->step_time_s / zp_search_samples(&a->plan);
        const double b_ps = b->step_time_s / zp_search_samples(&b->plan);
        g_assert_true(a_ps <= b_ps ||
                      (a_ps <= b_ps * (1 + 1e-4) && a->peak_memory_bytes <= b->peak_memory_bytes));
    }
    zp_search_result_clear(&r);
}

/* Runs the search for one shape (stage, mp, micro-batch fixed) with the simulator ranking. */
static void search_shape(const char *model, const char *cluster, int gpus, int stage, int mp,
                         int micro, ZpImplKind impl, ZpModel *m, ZpHw *hw, ZpSearchResult *r)
{
    *m = tu_load_model(model);
    *hw = tu_load_hw(cluster);
    ZpSearchSpec spec;
    CliRankContext *ctx = g_new0(CliRankContext, 1);
    cli_search_spec(&spec, ctx, m, hw, gpus);
    spec.stage = stage;
    spec.mp = mp;
    spec.micro_batch = micro;
    spec.impl = impl;
    GError *error = NULL;
    g_assert_true(zp_search_run(&spec, r, &error));
    g_assert_no_error(error);
    g_free(ctx);
}

/* ZeRO-R in the search: the ZeRO paper's 100B run (MP 16, stage 2, micro-batch 32 on 400
 * V100s) fits only with Pa, so the best plan has it; and a level is simulated only when the
 * level before it (its parent) did not fit. */
static void test_search_zero_r(void)
{
    ZpModel m;
    ZpHw hw;
    ZpSearchResult r;
    search_shape("zero-100b", "dgx2-v100", 400, 2, 16, 32, ZP_IMPL_PAPER, &m, &hw, &r);
    g_assert_cmpuint(r.ranked->len, >, 0);
    const ZpPlan *best = &zp_search_ranked(&r, 0)->plan;
    g_assert_true(best->checkpoint && best->ckpt.partition_activations);
    char *text = zp_search_options_text(best);
    g_test_message("best: %s", text);
    g_assert_true(g_str_has_prefix(text, "Pa"));
    g_free(text);
    guint levels_simulated = 0;
    for (guint i = 0; i < r.candidates->len; i++) {
        const ZpCandidate *c = zp_search_candidate(&r, (int)i);
        const gboolean simulated =
            c->fate == ZP_FATE_SIMULATED || c->fate == ZP_FATE_SIMULATED_OOM;
        if (c->parent < 0 || !simulated)
            continue;
        const ZpFate parent = zp_search_candidate(&r, c->parent)->fate;
        g_assert_true(parent == ZP_FATE_OUT_OF_MEMORY || parent == ZP_FATE_SIMULATED_OOM);
        levels_simulated++;
    }
    g_assert_cmpuint(levels_simulated, >, 0);
    zp_search_result_clear(&r);
}

/* ZeRO++ in the search: GPT-3 175B at stage 3 on 64 A100s (8 nodes), mp 1, micro-batch 2
 * fits without ZeRO++, but its gathers and reductions cross nodes; the search tries qwZ, hpZ
 * over the node's 8 ranks and qgZ, and its best plan quantises and is faster per sample than
 * the same plan without ZeRO++ (simulated here). */
static void test_search_zeropp(void)
{
    ZpModel m;
    ZpHw hw;
    ZpSearchResult r;
    search_shape("gpt3-175b", "dgx-a100-80g", 64, 3, 1, 2, ZP_IMPL_DEEPSPEED, &m, &hw, &r);
    guint hpz = 0, qwz = 0, qgz = 0;
    for (guint i = 0; i < r.candidates->len; i++) {
        const ZpZeroConfig *z = &zp_search_candidate(&r, (int)i)->plan.zero;
        hpz += z->zero_hpz_partition_size == 8;
        qwz += z->zero_quantized_weights;
        qgz += z->zero_quantized_gradients;
    }
    g_assert_cmpuint(hpz, >, 0);
    g_assert_cmpuint(qwz, >, 0);
    g_assert_cmpuint(qgz, >, 0);
    g_assert_cmpuint(r.ranked->len, >, 0);
    const ZpCandidate *best = zp_search_ranked(&r, 0);
    g_assert_true(best->plan.zero.zero_quantized_weights ||
                  best->plan.zero.zero_quantized_gradients);
    ZpPlan plain = best->plan;
    plain.zero.zero_quantized_weights = plain.zero.zero_quantized_gradients = FALSE;
    plain.zero.zero_hpz_partition_size = 1;
    CliRankContext sim = {&m, &hw, NULL};
    double step_s, need;
    g_assert_true(cli_rank_by_simulation(&plain, &sim, 0, &step_s, &need, NULL));
    g_test_message("best %.3f s, without ZeRO++ %.3f s", best->step_time_s, step_s);
    g_assert_cmpfloat(best->step_time_s, <, step_s);
    zp_search_result_clear(&r);
}

/* ZeRO++ at smaller buckets: GPT-3 175B at stage 3, mp 4, micro-batch 1 on 128 V100s (32 GB)
 * does not fit with Pa, qwZ and qgZ at DeepSpeed's buckets, but at half of them it does, and
 * the search finds it (its best ZeRO++ plan is at ds-half). A ZeRO++ plan is tried only at
 * DeepSpeed's buckets and the smaller ones, and at these only after the same plan at
 * DeepSpeed's (its parent) did not fit. */
static void test_search_zeropp_buckets(void)
{
    ZpModel m;
    ZpHw hw;
    ZpSearchResult r;
    search_shape("gpt3-175b", "dgx2-v100", 128, 3, 4, 1, ZP_IMPL_DEEPSPEED, &m, &hw, &r);
    const ZpCandidate *best = NULL;
    for (guint i = 0; i < r.ranked->len && !best; i++) {
        const ZpCandidate *c = zp_search_ranked(&r, (int)i);
        if (c->plan.zero.zero_quantized_weights || c->plan.zero.zero_quantized_gradients)
            best = c;
    }
    g_assert_nonnull(best);
    g_assert_cmpstr(zp_search_buckets_name(best->buckets), ==, "ds-half");
    char *text = zp_search_options_text(&best->plan);
    g_test_message("best ZeRO++ plan: %s at %s, %.3f s", text,
                   zp_search_buckets_name(best->buckets), best->step_time_s);
    g_free(text);
    for (guint i = 0; i < r.candidates->len; i++) {
        const ZpCandidate *c = zp_search_candidate(&r, (int)i);
        const ZpZeroConfig *z = &c->plan.zero;
        if (c->buckets == 0 || !(z->zero_quantized_weights || z->zero_quantized_gradients ||
                                 z->zero_hpz_partition_size > 1))
            continue;
        g_assert_cmpstr(zp_search_buckets_name(c->buckets), ==, "ds-half");
        const ZpCandidate *parent = zp_search_candidate(&r, c->parent);
        g_assert_cmpint(parent->buckets, ==, 0);
        g_assert_true(memcmp(&parent->plan.ckpt, &c->plan.ckpt, sizeof c->plan.ckpt) == 0);
        if (c->fate == ZP_FATE_SIMULATED || c->fate == ZP_FATE_SIMULATED_OOM)
            g_assert_true(parent->fate == ZP_FATE_OUT_OF_MEMORY ||
                          parent->fate == ZP_FATE_SIMULATED_OOM);
    }
    zp_search_result_clear(&r);
}

static void test_bound_and_pruning(void)
{
    check_search("gpt2-1.5b", "dgx2-v100", 64, 0);
    check_search("gpt2-1.5b", "dgx2-v100", 64, 512);
    check_search("gpt-13b", "dgx-a100-80g", 64, 256);
    check_search("gpt3-175b", "dgx-a100-80g", 256, 1536);
}

/* A ranker under which every plan takes the same time per sample (a tie everywhere) and needs
 * memory that depends on its shape: the ranking must then list the plans with more memory
 * left first. */
static gboolean tied_rank(const ZpPlan *plan, void *ctx, double stop_after_s,
                          double *step_time_s, double *peak_memory_bytes, GError **error)
{
    (void)ctx, (void)stop_after_s, (void)error;
    *step_time_s = 1e6 * zp_search_samples(plan);
    *peak_memory_bytes = 1e9 * (1 + plan->zero.stage + 4.0 * plan->checkpoint +
                                8.0 * plan->mp + 0.5 * plan->micro_batch);
    return TRUE;
}

static void test_ties_prefer_memory_left(void)
{
    ZpModel m = tu_load_model("gpt2-124m");
    ZpHw hw = tu_load_hw("dgx-a100-80g");
    ZpSearchSpec spec;
    zp_search_spec_defaults(&spec, &m, &hw, 16);
    spec.rank = tied_rank;
    spec.top_k = 6;
    ZpSearchResult r;
    g_assert_true(zp_search_run(&spec, &r, NULL));
    g_assert_cmpuint(r.ranked->len, ==, 6);
    for (guint i = 1; i < r.ranked->len; i++)
        g_assert_cmpfloat(zp_search_ranked(&r, i - 1)->peak_memory_bytes, <=,
                          zp_search_ranked(&r, i)->peak_memory_bytes);
    g_assert_cmpfloat(zp_search_ranked(&r, 0)->peak_memory_bytes, <,
                      zp_search_ranked(&r, 5)->peak_memory_bytes);
    zp_search_result_clear(&r);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    plan_common_init();
    g_test_add_func("/search/compute-ops-match-schedule", test_compute_ops_match_schedule);
    g_test_add_func("/search/screen-memory-is-zp-mem", test_screen_memory_is_zp_mem);
    g_test_add_func("/search/bound-and-pruning", test_bound_and_pruning);
    g_test_add_func("/search/refuses-unrunnable-attention", test_refuses_unrunnable_attention);
    g_test_add_func("/search/zero-r", test_search_zero_r);
    g_test_add_func("/search/zeropp", test_search_zeropp);
    g_test_add_func("/search/zeropp-buckets", test_search_zeropp_buckets);
    g_test_add_func("/search/ties-prefer-memory-left", test_ties_prefer_memory_left);
    return plan_common_run();
}
