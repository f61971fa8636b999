/* test_sim_plan: the simulator on planned schedules — the planner's volume and memory
 * models, monotonicity, explicit = folded ranks, frozen results — and `zplan simulate` (JSON,
 * human, the trace, bad input). */
#include "sim_common.h"

static double step_time(const Case *c, const ZpHw *hw, SimMode mode)
{
    ZpSchedule *s = build_case(c);
    SimResult *r = run(s, hw, mode);
    const double t = r->step_time_s;
    sim_result_free(r);
    zp_sched_free(s);
    return t;
}

/* Bytes sent per rank are the planner's: exactly zp_sched_comm_bytes, and the closed forms
 * of zp_comm up to padding: stage 3 sends 1.5x stage 2, stages 0, 1 and 2 the same. */
static void test_comm_bytes(void)
{
    /* The closed form's params / mp is a tensor rank's shard: what it holds under Megatron's
     * split (zp_model_unit_tp_elems), times mp. */
    double shard = 0;
    for (int u = 0; u < zp_model_n_units(&gpt2); u++)
        shard += (double)zp_model_unit_tp_elems(&gpt2, u, 2);
    const double psi = 2 * shard;
    double dp_bytes[4];
    for (int stage = 0; stage <= 3; stage++) {
        const Case c = {stage, 16, 2, 1, FALSE, TRUE};
        ZpSchedule *s = build_case(&c);
        SimResult *r = run(s, &a100, SIM_MODE_FOLDED);
        dp_bytes[stage] = r->comm_bytes[ZP_GROUP_DP];
        assert_close(dp_bytes[stage], zp_sched_comm_bytes(s, ZP_GROUP_DP), 1e-12);
        assert_close(r->comm_bytes[ZP_GROUP_TP], zp_sched_comm_bytes(s, ZP_GROUP_TP), 1e-12);
        assert_close(dp_bytes[stage], zp_comm_dp_bytes_per_rank(psi, stage, 16, 2, 2, 2), 1e-3);
        assert_close(r->comm_bytes[ZP_GROUP_TP],
                     gpt2.layers * zp_comm_tp_bytes_per_block(&gpt2, 1, 2, FALSE, 2) +
                         zp_comm_tp_bytes_vocab(&gpt2, 1, 2, 2), 1e-12);
        sim_result_free(r);
        zp_sched_free(s);
    }
    assert_close(dp_bytes[3] / dp_bytes[2], 1.5, 1e-3);
    assert_close(dp_bytes[1], dp_bytes[2], 1e-3);
    assert_close(dp_bytes[0], dp_bytes[1], 1e-3);
    for (int stage = 0; stage <= 3; stage++) {
        const Case c = {stage, 1, 1, 1, FALSE, TRUE};
        ZpSchedule *s = build_case(&c);
        SimResult *r = run(s, &a100, SIM_MODE_EXPLICIT);
        g_assert_cmpfloat(r->comm_bytes[ZP_GROUP_DP] + r->comm_bytes[ZP_GROUP_TP], ==, 0);
        sim_result_free(r);
        zp_sched_free(s);
    }
}

/* The engine itself fails if a category goes negative or does not come back to the model
 * states; here the model-state peak must be exactly the planner's padded figure. */
static void test_memory_states(void)
{
    for (int stage = 0; stage <= 3; stage++)
        for (int accum = 1; accum <= 2; accum++) {
            const Case c = {stage, 8, 1, accum, accum == 2, TRUE};
            ZpSchedule *s = build_case(&c);
            SimResult *r = run(s, &a100, SIM_MODE_FOLDED);
            assert_close(r->peak_model_state_bytes, zp_sched_model_state_bytes(s), 1e-12);
            double sum = 0;
            for (int k = 0; k < ZP_MEM_N; k++) {
                g_assert_cmpfloat(r->peak_breakdown_bytes[k], >=, 0);
                sum += r->peak_breakdown_bytes[k];
            }
            assert_close(sum, r->peak_memory_bytes, 1e-12);
            g_assert_cmpfloat(r->peak_memory_bytes, >, zp_sched_model_state_bytes(s));
            sim_result_free(r);
            zp_sched_free(s);
        }
}

static void test_overlap_never_slower(void)
{
    for (int stage = 0; stage <= 3; stage++)
        for (int dp = 2; dp <= 32; dp *= 4) {
            Case on = {stage, dp, 2, 2, FALSE, TRUE}, off = on;
            off.overlap = FALSE;
            const double t_on = step_time(&on, &a100, SIM_MODE_FOLDED);
            const double t_off = step_time(&off, &a100, SIM_MODE_FOLDED);
            g_test_message("stage %d dp %d: overlap %.6g s, none %.6g s", stage, dp, t_on, t_off);
            g_assert_cmpfloat(t_on, <=, t_off * (1 + 1e-12));
        }
}

static void test_faster_network_never_slower(void)
{
    for (int stage = 0; stage <= 3; stage++) {
        const Case c = {stage, 32, 2, 1, FALSE, stage == 3};
        double previous = INFINITY;
        for (double scale = 1; scale <= 16; scale *= 2) {
            ZpHw hw = a100;
            hw.intra_node_bytes_per_s *= scale;
            hw.inter_node_bytes_per_s *= scale;
            const double t = step_time(&c, &hw, SIM_MODE_FOLDED);
            g_assert_cmpfloat(t, <=, previous * (1 + 1e-12));
            previous = t;
        }
        /* Only the network faster: still never slower. */
        ZpHw hw = a100;
        hw.inter_node_bytes_per_s *= 8;
        g_assert_cmpfloat(step_time(&c, &hw, SIM_MODE_FOLDED), <=,
                          step_time(&c, &a100, SIM_MODE_FOLDED) * (1 + 1e-12));
    }
}

/* Explicit ranks and folded ones agree on everything, including plans whose DP and TP
 * collectives share NVLink (8 ranks in one node). */
static void test_explicit_equals_folded(void)
{
    const Case cases[] = {
        {0, 16, 2, 1, FALSE, FALSE}, {1, 16, 2, 2, FALSE, TRUE}, {2, 8, 4, 1, TRUE, TRUE},
        {3, 16, 2, 2, TRUE, TRUE},   {3, 2, 4, 1, FALSE, TRUE},  {2, 4, 2, 2, FALSE, FALSE},
        {3, 64, 1, 1, FALSE, TRUE},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpSchedule *s = build_case(&cases[i]);
        SimResult *folded = run(s, &a100, SIM_MODE_FOLDED);
        SimResult *all = run(s, &a100, SIM_MODE_EXPLICIT);
        g_test_message("case %zu: folded %.9g s, explicit %.9g s", i, folded->step_time_s,
                       all->step_time_s);
        g_assert_cmpint(all->ranks_simulated, ==, s->world);
        assert_close(all->step_time_s, folded->step_time_s, 1e-12);
        assert_close(all->exposed_comm_s, folded->exposed_comm_s, 1e-9);
        g_assert_cmpfloat(all->peak_memory_bytes, ==, folded->peak_memory_bytes);
        g_assert_cmpuint(all->op_events, ==, folded->op_events * (uint64_t)s->world);
        sim_result_free(folded);
        sim_result_free(all);
        zp_sched_free(s);
    }
}

/* ---- results frozen before the memory-layout change (issue 19) ---- */

/* Plans of several models, profiles and degrees; every one is simulated folded and explicit
 * with a timeline, and each figure must equal, bit for bit, what the engine gave before its
 * state was laid out op-major (the figures below were printed with %a by that engine, and
 * printed again when two model changes moved them: a block backward's memory-bound bytes
 * from its own kernels, issue 15, which moved every compute time, and collectives costed
 * by NCCL's tuning model, issue 19, which moved every collective's; and the plans of
 * mp > 1 when issue 18 laid out each tensor rank's Megatron shard, with the vocab-parallel
 * embedding's and head's collectives: those of mp 1 did not move; and the peak memory
 * alone when the LayerNorms' fp32 statistics, 16 s b bytes a block, entered the activation
 * formula: every time, count and hash stayed; and every time when the clock took its fixed
 * grid of 2^-30 s, issue 40 (sim_clock_q: each duration rounded to the nearest 0.93 ns):
 * 214 of the 300 figures moved, a step time by 117 ns at most (plan 12's 99.6 s, 1.2e-9) and
 * by 4.98e-6 of itself at most (plan 4's 5.7 ms, by 28.5 ns); any time by 367 ns at most
 * (plan 13's TP busy time, 7.1e-7 of 0.51 s: its like collectives round alike, so their
 * errors add); the largest relative change 2.9e-5 (plan 7's optimizer time, 13.6 us, by
 * 0.40 ns: one op's rounding). Idle times that were rounding residues (2^-60 to 3.8e-13 s)
 * are now exactly 0; bytes, event counts and the report rank stayed. */
/* The plans: sim_common's frozen_plans. */

/* step, exposed comm, compute, optimizer, idle, peak memory, peak model states, and the
 * compute, dp and tp streams' busy time; the report rank; op and queue events; FNV-1a of
 * every op's start and end time on every simulated rank. */
static const struct {
    size_t plan;
    SimMode mode;
    double seconds_bytes[10];
    int report_rank;
    uint64_t op_events, heap_events, timeline_hash;
} frozen[] = {
    {0, 0, {0x1.3fd4ecp-7, 0x1.e4e8ap-9, 0x1.54d59p-8, 0x1.c2ffcp-11, 0x0p+0, 0x1.930bep+30, 0x1.ddeb8p+29, 0x1.8d3588p-8, 0x1.7a807p-9, 0x1.e3264p-11}, 0, 117u, 83u, 0xa360a13cf8c94011u},
    {0, 1, {0x1.3fd4ecp-7, 0x1.e4e8ap-9, 0x1.54d59p-8, 0x1.c2ffcp-11, 0x0p+0, 0x1.930bep+30, 0x1.ddeb8p+29, 0x1.8d3588p-8, 0x1.7a807p-9, 0x1.e3264p-11}, 0, 3744u, 1720u, 0xde9b399b42c55703u},
    {1, 0, {0x1.d74b4ap-7, 0x1.016574p-8, 0x1.54d59p-7, 0x1.c3p-15, 0x0p+0, 0x1.d60e2ap+29, 0x1.1bc3d4p+28, 0x1.56989p-7, 0x1.81d7a8p-9, 0x1.e3264p-10}, 0, 233u, 165u, 0xb48b4b4d28d36dd1u},
    {1, 1, {0x1.d74b4ap-7, 0x1.016574p-8, 0x1.54d59p-7, 0x1.c3p-15, 0x0p+0, 0x1.d60e2ap+29, 0x1.1bc3d4p+28, 0x1.56989p-7, 0x1.81d7a8p-9, 0x1.e3264p-10}, 0, 7456u, 3408u, 0x94e3799b384e1d43u},
    {2, 0, {0x1.2e50a4p-7, 0x1.02b2ep-8, 0x1.565c4p-8, 0x1.c914p-15, 0x0p+0, 0x1.e24aap+27, 0x1.c6164p+26, 0x1.59ee68p-8, 0x1.44cc1p-9, 0x1.f936bp-10}, 0, 177u, 119u, 0xb2ef49544c598144u},
    {2, 1, {0x1.2e50a4p-7, 0x1.02b2ep-8, 0x1.565c4p-8, 0x1.c914p-15, 0x0p+0, 0x1.e24aap+27, 0x1.c6164p+26, 0x1.59ee68p-8, 0x1.44cc1p-9, 0x1.f936bp-10}, 0, 5664u, 1896u, 0x826ad67c32edbc3u},
    {3, 0, {0x1.314ba5p-6, 0x1.4d9454p-8, 0x1.ba0a2p-7, 0x1.c3p-15, 0x0p+0, 0x1.6f82cp+28, 0x1.ddeb8p+25, 0x1.bbcd2p-7, 0x1.5bd286p-7, 0x1.649e2p-9}, 0, 510u, 290u, 0x74acdc9f8f7a88e7u},
    {3, 1, {0x1.314ba5p-6, 0x1.4d9454p-8, 0x1.ba0a2p-7, 0x1.c3p-15, 0x0p+0, 0x1.6f82cp+28, 0x1.ddeb8p+25, 0x1.bbcd2p-7, 0x1.5bd286p-7, 0x1.649e2p-9}, 0, 16320u, 5050u, 0x6752c4eeb108d703u},
    {4, 0, {0x1.770b4p-8, 0x1.8ed19p-10, 0x1.050e4p-8, 0x1.c9138p-13, 0x0p+0, 0x1.7044ap+29, 0x1.e45cp+27, 0x1.1356dcp-8, 0x1.89276p-11, 0x1.72f3ap-10}, 0, 190u, 156u, 0xacf7615a685d8182u},
    {4, 1, {0x1.770b4p-8, 0x1.8ed19p-10, 0x1.050e4p-8, 0x1.c9138p-13, 0x0p+0, 0x1.7044ap+29, 0x1.e45cp+27, 0x1.1356dcp-8, 0x1.89276p-11, 0x1.72f3ap-10}, 0, 1520u, 528u, 0x3b55590e3e14ccb3u},
    {5, 0, {0x1.bb0438p-7, 0x1.7c8aap-9, 0x1.54d59p-7, 0x1.c3p-13, 0x0p+0, 0x1.084316p+30, 0x1.4891e8p+28, 0x1.5be19p-7, 0x1.4f748p-10, 0x1.02114p-9}, 0, 245u, 205u, 0xc06a3cc67fcc9db3u},
    {5, 1, {0x1.bb0438p-7, 0x1.7c8aap-9, 0x1.54d59p-7, 0x1.c3p-13, 0x0p+0, 0x1.084316p+30, 0x1.4891e8p+28, 0x1.5be19p-7, 0x1.4f748p-10, 0x1.02114p-9}, 0, 1960u, 944u, 0xd47a61cfda862703u},
    {6, 0, {0x1.4fd9cp-7, 0x1.531f18p-9, 0x1.f464p-8, 0x1.bff4p-16, 0x0p+0, 0x1.7d0595p+30, 0x1.dab34p+24, 0x1.f623f4p-8, 0x1.23849ep-7, 0x0p+0}, 0, 154u, 62u, 0xcbd8dd5b1b970bb3u},
    {6, 1, {0x1.4fd9cp-7, 0x1.531f18p-9, 0x1.f464p-8, 0x1.bff4p-16, 0x0p+0, 0x1.7d0595p+30, 0x1.dab34p+24, 0x1.f623f4p-8, 0x1.23849ep-7, 0x0p+0}, 0, 9856u, 1826u, 0x497e8af3b5adea83u},
    {7, 0, {0x1.48aec9p-6, 0x1.3a8f0ep-7, 0x1.565c4p-7, 0x1.c91p-17, 0x0p+0, 0x1.969c4p+27, 0x1.e45cp+23, 0x1.56ce84p-7, 0x1.c88116p-7, 0x1.f936bp-9}, 0, 498u, 286u, 0x9c2b862168bcee4u},
    {7, 1, {0x1.48aec9p-6, 0x1.3a8f0ep-7, 0x1.565c4p-7, 0x1.c91p-17, 0x0p+0, 0x1.969c4p+27, 0x1.e45cp+23, 0x1.56ce84p-7, 0x1.c88116p-7, 0x1.f936bp-9}, 0, 63744u, 15140u, 0x22223827d1493383u},
    {8, 0, {0x1.ed562ep-7, 0x1.ffe3d8p-9, 0x1.6c08a2p-7, 0x1.5496p-15, 0x0p+0, 0x1.b1ef9p+29, 0x1.3e9dp+24, 0x1.6d5d38p-7, 0x1.78104ep-7, 0x1.5296p-10}, 0, 196u, 110u, 0xcb1708b8a730e8dfu},
    {8, 1, {0x1.ed562ep-7, 0x1.ffe3d8p-9, 0x1.6c08a2p-7, 0x1.5496p-15, 0x0p+0, 0x1.b1ef9p+29, 0x1.3e9dp+24, 0x1.6d5d38p-7, 0x1.78104ep-7, 0x1.5296p-10}, 0, 18816u, 5198u, 0xb33f2022a0d3683u},
    {9, 0, {0x1.93fe32p-7, 0x1.8a65f8p-8, 0x1.9cdcf4p-8, 0x1.72fp-17, 0x0p+0, 0x1.969c4p+27, 0x1.1073cp+27, 0x1.9d966cp-8, 0x1.af715p-10, 0x1.2ea0a8p-8}, 0, 505u, 347u, 0xeb2dc77398cfda3au},
    {9, 1, {0x1.93fe32p-7, 0x1.8a65f8p-8, 0x1.9cdcf4p-8, 0x1.72fp-17, 0x0p+0, 0x1.969c4p+27, 0x1.1073cp+27, 0x1.9d966cp-8, 0x1.af715p-10, 0x1.2ea0a8p-8}, 0, 48480u, 16744u, 0x8d1cc7b38ac4fa43u},
    {10, 0, {0x1.4de9acp-7, 0x1.f694p-14, 0x1.47357cp-7, 0x1.6384p-14, 0x0p+0, 0x1.2e73f8p+29, 0x1.dab34p+26, 0x1.49fc84p-7, 0x1.73d8cp-11, 0x0p+0}, 0, 190u, 74u, 0xae342a2b5b3fe3f7u},
    {10, 1, {0x1.4de9acp-7, 0x1.f694p-14, 0x1.47357cp-7, 0x1.6384p-14, 0x0p+0, 0x1.2e73f8p+29, 0x1.dab34p+26, 0x1.49fc84p-7, 0x1.73d8cp-11, 0x0p+0}, 0, 3040u, 674u, 0x47c3828b0d48ff23u},
    {11, 0, {0x1.03eec8p-6, 0x1.27eb4p-12, 0x1.f91028p-7, 0x1.63838p-13, 0x0p+0, 0x1.ba6c7bp+30, 0x1.bd080cp+28, 0x1.fe9e36p-7, 0x1.92b6p-12, 0x0p+0}, 0, 170u, 76u, 0x2bb1b96f3b039d62u},
    {11, 1, {0x1.03eec8p-6, 0x1.27eb4p-12, 0x1.f91028p-7, 0x1.63838p-13, 0x0p+0, 0x1.ba6c7bp+30, 0x1.bd080cp+28, 0x1.fe9e36p-7, 0x1.92b6p-12, 0x0p+0}, 0, 1360u, 461u, 0x8ddb8d0a7a0c3aa3u},
    {12, 0, {0x1.8e54ceeecp+6, 0x1.00a3d1092p+5, 0x1.0df50eb4dp+6, 0x1.baf6acp-7, 0x0p+0, 0x1.095258b2p+36, 0x1.d567959p+33, 0x1.0e02e66a3p+6, 0x1.00a421ecp+5, 0x0p+0}, 0, 2067u, 777u, 0x7430bd6548025651u},
    {12, 1, {0x1.8e54ceeecp+6, 0x1.00a3d1092p+5, 0x1.0df50eb4dp+6, 0x1.baf6acp-7, 0x0p+0, 0x1.095258b2p+36, 0x1.d567959p+33, 0x1.0e02e66a3p+6, 0x1.00a421ecp+5, 0x0p+0}, 0, 2116608u, 397701u, 0x84a9e1499bb21383u},
    {13, 0, {0x1.3c420d6d6p+5, 0x1.ee221c75p+4, 0x1.145530ec8p+3, 0x1.bb2f7cp-7, 0x0p+0, 0x1.055c8bep+35, 0x1.d5a3c88p+33, 0x1.14c3fccb8p+3, 0x1.eb66a3facp+4, 0x1.073a6298p-1}, 0, 2838u, 1548u, 0xd99f32b0b35ffd71u},
    {13, 1, {0x1.3c420d6d6p+5, 0x1.ee221c75p+4, 0x1.145530ec8p+3, 0x1.bb2f7cp-7, 0x0p+0, 0x1.055c8bep+35, 0x1.d5a3c88p+33, 0x1.14c3fccb8p+3, 0x1.eb66a3facp+4, 0x1.073a6298p-1}, 0, 2906112u, 499112u, 0x534141b09c478383u},
    {14, 0, {0x1.5a48993p+0, 0x1.be59f16p-1, 0x1.eb7d7eep-2, 0x1.e2064p-11, 0x0p+0, 0x1.c75d424p+31, 0x1.fecc17p+29, 0x1.ec6e82p-2, 0x1.ba23dfp-1, 0x1.8df0e8p-6}, 0, 1634u, 926u, 0x2b0282239500a8a8u},
    {14, 1, {0x1.5a48993p+0, 0x1.be59f16p-1, 0x1.eb7d7eep-2, 0x1.e2064p-11, 0x0p+0, 0x1.c75d424p+31, 0x1.fecc17p+29, 0x1.ec6e82p-2, 0x1.ba23dfp-1, 0x1.8df0e8p-6}, 0, 313728u, 94466u, 0x84feab4bf8369483u},
};

static uint64_t fnv1a(uint64_t hash, const void *data, size_t bytes)
{
    const unsigned char *c = data;
    for (size_t i = 0; i < bytes; i++)
        hash = (hash ^ c[i]) * 1099511628211u;
    return hash;
}

static void test_frozen_results(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(frozen); i++) {
        const FrozenPlan *c = &frozen_plans[frozen[i].plan];
        ZpHw hw;
        GError *error = NULL;
        ZpSchedule *s = frozen_schedule(c, &hw);
        const SimOptions options = {.mode = frozen[i].mode, .record_timeline = TRUE};
        SimResult *r = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        const double got[10] = {r->step_time_s, r->exposed_comm_s, r->compute_s,
                                r->optimizer_s, r->idle_s, r->peak_memory_bytes,
                                r->peak_model_state_bytes, r->stream_busy_s[ZP_STREAM_COMPUTE],
                                r->stream_busy_s[ZP_STREAM_DP], r->stream_busy_s[ZP_STREAM_TP]};
        g_test_message("case %zu (%s, %s): step %a s", i, c->model, sim_mode_name(frozen[i].mode),
                       r->step_time_s);
        for (int k = 0; k < 10; k++)
            g_assert_cmpfloat(got[k], ==, frozen[i].seconds_bytes[k]);
        g_assert_cmpint(r->report_rank, ==, frozen[i].report_rank);
        g_assert_cmpuint(r->op_events, ==, frozen[i].op_events);
        g_assert_cmpuint(r->heap_events, ==, frozen[i].heap_events);
        const size_t n = (size_t)r->ranks_simulated * r->n_ops;
        const uint64_t hash = fnv1a(fnv1a(1469598103934665603u, r->op_start_s, n * sizeof(double)),
                                    r->op_end_s, n * sizeof(double));
        g_assert_cmpuint(hash, ==, frozen[i].timeline_hash);
        sim_result_free(r);
        zp_sched_free(s);
    }
}

/* ---- the command line ---- */

static double number(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    g_assert_true(json_is_number(v));
    return json_number_value(v);
}

static void test_cli_json(void)
{
    const char *base = "simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 32 --mp 2 "
                       "--stage 3 --micro-batch 2 --grad-accum 2 --checkpoint --json";
    json_t *folded = tu_zplan_json(base);
    char *args = g_strdup_printf("%s --explicit", base);
    json_t *all = tu_zplan_json(args);
    g_free(args);
    g_assert_cmpstr(json_string_value(json_object_get(folded, "mode")), ==, "folded");
    g_assert_cmpstr(json_string_value(json_object_get(all, "mode")), ==, "explicit");
    g_assert_cmpfloat(number(folded, "ranks_simulated"), ==, 1);
    g_assert_cmpfloat(number(all, "ranks_simulated"), ==, 32);
    const double step = number(folded, "step_time_s");
    assert_close(number(all, "step_time_s"), step, 1e-12);
    /* samples/s = dp x micro-batch x accumulation / step; MFU = TFLOP/s over the peak. */
    assert_close(number(folded, "samples_per_s"), 16.0 * 2 * 2 / step, 1e-12);
    assert_close(number(folded, "mfu"), number(folded, "tflops_per_gpu") * 1e12 / 312e12, 1e-12);
    g_assert_cmpfloat(number(folded, "mfu"), >, 0);
    g_assert_cmpfloat(number(folded, "mfu"), <, 1);
    json_t *breakdown = json_object_get(folded, "breakdown");
    const double sum = number(breakdown, "compute_s") + number(breakdown, "exposed_comm_s") +
                       number(breakdown, "optimizer_s") + number(breakdown, "idle_s");
    assert_close(sum, step, 1e-9);
    json_t *comm = json_object_get(folded, "comm_bytes_per_rank");
    g_assert_cmpfloat(number(comm, "dp"), >, 0);
    g_assert_cmpfloat(number(comm, "tp"), >, 0);
    json_t *peak = json_object_get(folded, "peak_breakdown");
    g_assert_cmpint(json_object_size(peak), ==, ZP_MEM_N);
    g_assert_cmpfloat(number(peak, "checkpoints"), >, 0);
    g_assert_cmpfloat(number(folded, "peak_memory_bytes"), >, 0);
    json_decref(folded);
    json_decref(all);
}

static void test_cli_human(void)
{
    TuRun r = tu_zplan("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 16 --stage 2 "
                      "--micro-batch 4 --no-overlap");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    const char *expected[] = {"step time", "samples/s", "MFU", "exposed communication",
                              "bytes sent per rank", "peak memory per rank", "Ranks: folded",
                              "overlap_comm off"};
    for (size_t i = 0; i < G_N_ELEMENTS(expected); i++)
        g_assert_nonnull(strstr(r.out, expected[i]));
    tu_free(&r);
    r = tu_zplan("simulate --help");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "--explicit"));
    g_assert_nonnull(strstr(r.out, "--trace"));
    tu_free(&r);
}

static gboolean has_event(json_t *events, const char *ph, const char *name)
{
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "ph")), ph) == 0 &&
            (!name || strcmp(json_string_value(json_object_get(e, "name")), name) == 0))
            return TRUE;
    }
    return FALSE;
}

static void test_trace(void)
{
    char *path = g_build_filename(sim_tmp_dir, "trace.json", NULL);
    char *args = g_strdup_printf("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 "
                                 "--mp 2 --stage 3 --micro-batch 1 --explicit --slow-rank 3:2 "
                                 "--trace %s",
                                 path);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    g_assert_nonnull(root);
    json_t *events = json_object_get(root, "traceEvents");
    g_assert_true(json_is_array(events));
    size_t i, complete = 0, processes = 0;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        g_assert_nonnull(ph);
        if (strcmp(ph, "X") == 0) {
            complete++;
            g_assert_true(json_is_number(json_object_get(e, "ts")));
            g_assert_cmpfloat(json_number_value(json_object_get(e, "dur")), >=, 0);
            g_assert_true(json_is_integer(json_object_get(e, "pid")));
            g_assert_true(json_is_integer(json_object_get(e, "tid")));
        } else if (strcmp(ph, "M") == 0 &&
                   strcmp(json_string_value(json_object_get(e, "name")), "process_name") == 0) {
            processes++;
        }
    }
    g_assert_cmpuint(complete, >, 0);
    g_assert_cmpuint(processes, ==, 8);
    const char *names[] = {"fwd L1 qkv", "bwd L12 qkv", "allgather L1", "reduce-scatter bucket 0",
                           "tp allreduce L1", "adam", "head fwd+bwd"};
    for (size_t k = 0; k < G_N_ELEMENTS(names); k++) {
        g_test_message("event %s", names[k]);
        g_assert_true(has_event(events, "X", names[k]));
    }
    g_assert_true(has_event(events, "C", "memory"));
    g_assert_true(has_event(events, "M", "thread_name"));
    g_assert_true(has_event(events, "X", "wait for rank 3"));
    json_decref(root);
    tu_free(&r);
    g_remove(path);
    g_free(args);
    g_free(path);
}

/* Past 64 ranks the trace holds rank 0, the last to finish and the one rank 0 waited for
 * longest: here the slow rank 77. */
static void test_trace_many_ranks(void)
{
    char *path = g_build_filename(sim_tmp_dir, "trace-many.json", NULL);
    char *args = g_strdup_printf("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 128 "
                                 "--stage 3 --micro-batch 8 --explicit --slow-rank 77:3 "
                                 "--trace %s",
                                 path);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    json_t *root = json_load_file(path, 0, NULL);
    g_assert_nonnull(root);
    json_t *other = json_object_get(root, "otherData");
    g_assert_cmpfloat(number(other, "ranks_simulated"), ==, 128);
    const double traced = number(other, "ranks_traced");
    g_assert_cmpfloat(traced, >=, 2);
    g_assert_cmpfloat(traced, <=, 3);
    json_t *events = json_object_get(root, "traceEvents");
    g_assert_true(has_event(events, "X", "wait for rank 77"));
    size_t i;
    json_t *e;
    gboolean named = FALSE;
    json_array_foreach(events, i, e)
    {
        json_t *args_json = json_object_get(e, "args");
        const char *name = json_string_value(json_object_get(args_json, "name"));
        named = named || (name && strcmp(name, "rank 77 (dp 77, tp 0)") == 0);
    }
    g_assert_true(named);
    json_decref(root);
    tu_free(&r);
    g_remove(path);
    g_free(args);
    g_free(path);
}

static const struct {
    const char *args, *message;
} bad_cases[] = {
    {"simulate --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1", "--model NAME|PATH.json is required"},
    {"simulate --model gpt2-124m --gpus 8 --stage 3 --micro-batch 1", "--cluster NAME|PATH.json is required"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --stage 3 --micro-batch 1", "--gpus N is required"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --micro-batch 1", "--stage S (0, 1, 2 or 3) is required"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3", "--micro-batch B is required"},
    {"simulate --model nosuch --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1", "unknown model 'nosuch'"},
    {"simulate --model gpt2-124m --cluster nosuch --gpus 8 --stage 3 --micro-batch 1", "unknown cluster 'nosuch'"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 0 --stage 3 --micro-batch 1", "--gpus: '0' is outside"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 4 --micro-batch 1", "--stage: '4' is outside"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage -1 --micro-batch 1", "--stage: '-1' is outside"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 0", "--micro-batch: '0' is outside"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --grad-accum 1.5", "--grad-accum: '1.5' must be a whole number"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 12 --mp 8 --stage 3 --micro-batch 1", "--mp: 8 does not divide --gpus 12"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 40 --mp 5 --stage 3 --micro-batch 1", "--mp: 5 does not divide the 12 attention heads"},
    {"simulate --model gpt-1t --cluster dgx-a100-80g --gpus 40 --mp 20 --stage 3 --micro-batch 1", "--mp: tensor-parallel degree 20 must divide the 8 GPUs per node"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --overlap --no-overlap", "not both"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --reduce-bucket-size -1", "--reduce-bucket-size: '-1' is outside"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --max-live-parameters lots", "--max-live-parameters: 'lots' is not a number"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --persistence-threshold -1", "--persistence-threshold: '-1' is outside"},
    {"simulate --model gpt2-124m --cluster dgx2-v100 --gpus 8 --stage 3 --micro-batch 1 --precision bf16", "--precision: dgx2-v100"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --precision fp8", "--precision: unknown value 'fp8'"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 stray", "unexpected argument 'stray'"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --trace /nonexistent-dir/t.json", "--trace: "},
    {"simulate --params 1e9 --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1", "Unknown option --params"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --slow-rank 9:2", "--slow-rank: '9:2': rank 9 is not below the 8 there are"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --explicit --slow-rank 8:2", "--slow-rank: '8:2': rank 8 is not below the 8 there are"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --explicit --slow-link 1:2", "--slow-link: '1:2': node 1 is not below the 1 there are"},
    {"simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --explicit --slow-rank 3:0.5", "--slow-rank: '3:0.5' is not rank:FACTOR"},
    {"simulate --schedule tests/data/schedule-example.json --cluster dgx-a100-80g --gpus 8", "--gpus: the ops come from --schedule; leave it out"},
    {"simulate --schedule tests/data/schedule-example.json --cluster dgx-a100-80g --attention flash", "--attention: the ops come from --schedule"},
    {"simulate --schedule /nonexistent/s.json --cluster dgx-a100-80g", "--schedule: /nonexistent/s.json"},
};

static void test_cli_bad_input(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        TuRun r = tu_zplan(bad_cases[i].args);
        g_test_message("case: zplan %s -> %s", bad_cases[i].args, r.err);
        g_assert_false(g_spawn_check_wait_status(r.status, NULL));
        g_assert_nonnull(strstr(r.err, bad_cases[i].message));
        g_assert_cmpint((int)(strchr(r.err, '\n') - r.err), ==, (int)strlen(r.err) - 1);
        g_assert_cmpstr(r.out, ==, "");
        tu_free(&r);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_test_add_func("/sim/plan/comm-bytes", test_comm_bytes);
    g_test_add_func("/sim/plan/memory-states", test_memory_states);
    g_test_add_func("/sim/plan/overlap-never-slower", test_overlap_never_slower);
    g_test_add_func("/sim/plan/faster-network-never-slower", test_faster_network_never_slower);
    g_test_add_func("/sim/plan/explicit-equals-folded", test_explicit_equals_folded);
    g_test_add_func("/sim/plan/frozen-results", test_frozen_results);
    g_test_add_func("/sim/cli/json", test_cli_json);
    g_test_add_func("/sim/cli/human", test_cli_human);
    g_test_add_func("/sim/cli/trace", test_trace);
    g_test_add_func("/sim/cli/trace-many-ranks", test_trace_many_ranks);
    g_test_add_func("/sim/cli/bad-input", test_cli_bad_input);
    return sim_common_run();
}
