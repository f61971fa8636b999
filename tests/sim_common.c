/* sim_common: the simulator tests' shared profile, model, folder and hand-built
 * schedules (sim_common.h) */
#include "sim_common.h"

ZpHw a100;  /* dgx-a100-80g: 8 GPUs a node, bus bandwidth 230e9 B/s on NVLink, 192e9 B/s a node
             * on the NICs (published nccl-tests figures) */
ZpModel gpt2;  /* gpt2-124m */
char *sim_tmp_dir;

void assert_close(double got, double want, double rel)
{
    g_assert_cmpfloat(fabs(got - want), <=, rel * fabs(want) + 1e-15);
}

void assert_close_grid(double got, double want, double rel, int n_durations)
{
    g_assert_cmpfloat(fabs(got - want), <=,
                      rel * fabs(want) + n_durations * SIM_CLOCK_HALF_Q_S + 1e-15);
}

/* ---- hand-built schedules ---- */

ZpSchedule *hand_schedule(int dp, int mp)
{
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->model = gpt2;
    zp_plan_defaults(&s->plan, 0, dp, mp);
    s->plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    s->world = dp * mp;
    s->elem_bytes = 2;
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    return s;
}

uint32_t add_op(ZpSchedule *s, ZpOp op, const uint32_t *deps, uint32_t n_deps)
{
    op.dep_start = s->deps->len;
    op.n_deps = n_deps;
    g_array_append_vals(s->deps, deps, n_deps);
    g_array_append_val(s->ops, op);
    return s->ops->len - 1;
}

uint32_t widest_op(const ZpSchedule *s)
{
    uint32_t most = 0;
    for (guint i = 0; i < s->ops->len; i++)
        most = MAX(most, zp_sched_op(s, i)->n_deps);
    return most;
}

ZpOp allreduce(double bytes, ZpGroup group, ZpStream stream)
{
    return (ZpOp){.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLREDUCE, .stream = stream,
                  .group = group, .unit = -1, .buffer = -1, .bytes = bytes};
}

SimResult *run(const ZpSchedule *s, const ZpHw *hw, SimMode mode)
{
    const SimOptions options = {.mode = mode};
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    return r;
}

ZpSchedule *build_case(const Case *c)
{
    ZpPlan p;
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.grad_accum = c->accum;
    p.checkpoint = c->checkpoint;
    p.zero.overlap_comm = c->overlap;
    p.zero.reduce_bucket_size = 2e7; /* several buckets for a 124M model */
    p.zero.allgather_bucket_size = 2e7;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&gpt2, &p, &error);
    g_assert_no_error(error);
    return s;
}

void sim_common_init(void)
{
    g_assert_true(zp_hw_load("dgx-a100-80g", &a100, NULL));
    /* The hand computations here are the roofline's and NCCL's: without the profile's kernel
     * rates (test_kernrate has theirs). */
    a100.kernel_rates.present = FALSE;
    g_assert_true(zp_model_load("gpt2-124m", &gpt2, NULL));
    sim_tmp_dir = g_dir_make_tmp("zplan-sim-XXXXXX", NULL);
}

int sim_common_run(void)
{
    const int status = g_test_run();
    g_rmdir(sim_tmp_dir);
    g_free(sim_tmp_dir);
    return status;
}

const FrozenPlan frozen_plans[FROZEN_PLANS] = {
    {"gpt2-124m", "dgx-a100-80g", 0, 16, 2, 1, FALSE, FALSE},
    {"gpt2-124m", "dgx-a100-80g", 1, 16, 2, 2, FALSE, TRUE},
    {"gpt2-124m", "dgx-a100-80g", 2, 8, 4, 1, TRUE, TRUE},
    {"gpt2-124m", "dgx-a100-80g", 3, 16, 2, 2, TRUE, TRUE},
    {"gpt2-124m", "dgx-a100-80g", 3, 2, 4, 1, FALSE, TRUE},
    {"gpt2-124m", "dgx-a100-80g", 2, 4, 2, 2, FALSE, FALSE},
    {"gpt2-124m", "dgx-a100-80g", 3, 64, 1, 1, FALSE, TRUE},
    {"gpt2-124m", "dgx-a100-80g", 3, 32, 4, 2, TRUE, FALSE},
    {"gpt2-124m", "dgx2-v100", 3, 48, 2, 1, FALSE, TRUE},
    {"gpt2-124m", "dgx-h100", 1, 24, 4, 3, TRUE, TRUE},
    {"gpt2-124m", "h100-measured", 3, 16, 1, 1, TRUE, TRUE},
    {"gpt2-124m", "h100-measured", 2, 8, 1, 2, FALSE, TRUE},
    {"gpt-1t", "dgx-a100-80g", 3, 1024, 1, 1, TRUE, TRUE},
    {"gpt-1t", "dgx-a100-80g", 3, 128, 8, 1, TRUE, TRUE},
    {"gpt-13b", "dgx-a100-80g", 3, 96, 2, 2, TRUE, TRUE},
};

ZpSchedule *frozen_schedule(const FrozenPlan *c, ZpHw *hw)
{
    ZpModel model;
    ZpPlan p;
    GError *error = NULL;
    g_assert_true(zp_model_load(c->model, &model, &error));
    g_assert_true(zp_hw_load(c->hw, hw, &error));
    /* The line rates the figures were frozen with: the profiles' published bus
     * bandwidths came after, and this test checks the engine, not the profiles. */
    hw->intra_node_bus_bytes_per_s = hw->inter_node_bus_bytes_per_s = 0;
    hw->kernel_rates.present = FALSE; /* likewise the kernel rates: the roofline's figures */
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.grad_accum = c->accum;
    p.checkpoint = c->checkpoint;
    p.zero.overlap_comm = c->overlap;
    if (strcmp(c->model, "gpt2-124m") == 0)
        p.zero.reduce_bucket_size = p.zero.allgather_bucket_size = 2e7;
    if (strcmp(c->hw, "dgx2-v100") == 0)
        p.precision = ZP_PREC_FP16;
    ZpSchedule *s = zp_sched_build(&model, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* Every figure of two results, bit for bit (the JSON prints nothing else of them). */
void assert_same_doubles(const double *a, const double *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g_assert_cmpfloat(a[i], ==, b[i]);
}

/* The reported rank's sums by op type (what `--json`'s "ops" prints), bit for bit. */
static void assert_same_op_types(const SimResult *got, const SimResult *want)
{
    g_assert_cmpint(got->op_types_exact, ==, want->op_types_exact);
    assert_same_doubles(got->op_type_s, want->op_type_s, SIM_OP_TYPES);
    assert_same_doubles(got->op_type_count, want->op_type_count, SIM_OP_TYPES);
}

void assert_same_totals(const SimResult *f, const SimResult *u)
{
    const double got[] = {f->step_time_s, f->compute_s, f->exposed_comm_s, f->optimizer_s,
                          f->idle_s, f->cpu_optimizer_s, f->offload_transfer_s,
                          f->model_flops, f->recompute_flops, f->peak_memory_bytes,
                          f->peak_model_state_bytes, f->flush_s, f->alltoall_s};
    const double want[] = {u->step_time_s, u->compute_s, u->exposed_comm_s, u->optimizer_s,
                           u->idle_s, u->cpu_optimizer_s, u->offload_transfer_s,
                           u->model_flops, u->recompute_flops, u->peak_memory_bytes,
                           u->peak_model_state_bytes, u->flush_s, u->alltoall_s};
    assert_same_doubles(got, want, G_N_ELEMENTS(got));
}

void assert_same_breakdowns(const SimResult *got, const SimResult *want)
{
    assert_same_op_types(got, want);
    assert_same_doubles(got->stream_busy_s, want->stream_busy_s, ZP_STREAM_N);
    assert_same_doubles(got->peak_breakdown_bytes, want->peak_breakdown_bytes, ZP_MEM_N);
    assert_same_doubles(got->category_peak_bytes, want->category_peak_bytes, ZP_MEM_N);
    assert_same_doubles(got->comm_bytes, want->comm_bytes, ZP_SCHED_MAX_GROUPS);
    const size_t k = (size_t)want->stages;
    assert_same_doubles(got->stage_peak_bytes, want->stage_peak_bytes, k);
    assert_same_doubles(got->stage_compute_s, want->stage_compute_s, k);
    assert_same_doubles(got->stage_bubble_s, want->stage_bubble_s, k);
    assert_same_doubles(got->stage_comm_bytes, want->stage_comm_bytes, k * ZP_GROUP_N);
    assert_same_doubles(got->stage_category_peak_bytes, want->stage_category_peak_bytes,
                        k * ZP_MEM_N);
}

void assert_same_figures(const SimResult *a, const SimResult *b)
{
    g_assert_cmpint(a->ranks_simulated, ==, b->ranks_simulated);
    g_assert_cmpint(a->units_simulated, ==, b->units_simulated);
    g_assert_cmpint(a->report_rank, ==, b->report_rank);
    g_assert_cmpint(a->stages, ==, b->stages);
    g_assert_cmpuint(a->op_events, ==, b->op_events);
    g_assert_cmpuint(a->heap_events, ==, b->heap_events);
    g_assert_cmpstr(a->cost_model, ==, b->cost_model);
    g_assert_cmpstr(a->collective_model, ==, b->collective_model);
    const double x[] = {a->step_time_s, a->compute_s, a->exposed_comm_s, a->optimizer_s,
                        a->idle_s, a->cpu_optimizer_s, a->offload_transfer_s, a->model_flops,
                        a->recompute_flops, a->peak_memory_bytes, a->peak_model_state_bytes,
                        a->flush_s};
    const double y[] = {b->step_time_s, b->compute_s, b->exposed_comm_s, b->optimizer_s,
                        b->idle_s, b->cpu_optimizer_s, b->offload_transfer_s, b->model_flops,
                        b->recompute_flops, b->peak_memory_bytes, b->peak_model_state_bytes,
                        b->flush_s};
    g_assert_cmpmem(x, sizeof x, y, sizeof y);
    g_assert_cmpmem(a->stream_busy_s, sizeof a->stream_busy_s, b->stream_busy_s,
                    sizeof b->stream_busy_s);
    assert_same_op_types(a, b);
    g_assert_cmpmem(a->offload_bytes, sizeof a->offload_bytes, b->offload_bytes,
                    sizeof b->offload_bytes);
    g_assert_cmpmem(a->comm_bytes, sizeof a->comm_bytes, b->comm_bytes, sizeof b->comm_bytes);
    g_assert_cmpmem(a->peak_breakdown_bytes, sizeof a->peak_breakdown_bytes,
                    b->peak_breakdown_bytes, sizeof b->peak_breakdown_bytes);
    g_assert_cmpmem(a->category_peak_bytes, sizeof a->category_peak_bytes,
                    b->category_peak_bytes, sizeof b->category_peak_bytes);
    const size_t stages = (size_t)a->stages;
    g_assert_cmpmem(a->stage_peak_bytes, stages * 8, b->stage_peak_bytes, stages * 8);
    g_assert_cmpmem(a->stage_compute_s, stages * 8, b->stage_compute_s, stages * 8);
    g_assert_cmpmem(a->stage_bubble_s, stages * 8, b->stage_bubble_s, stages * 8);
    g_assert_cmpmem(a->stage_comm_bytes, stages * ZP_GROUP_N * 8, b->stage_comm_bytes,
                    stages * ZP_GROUP_N * 8);
    g_assert_cmpmem(a->first_rank, (size_t)a->ranks_simulated * 4, b->first_rank,
                    (size_t)b->ranks_simulated * 4);
    g_assert_cmpmem(a->rank_count, (size_t)a->ranks_simulated * 4, b->rank_count,
                    (size_t)b->ranks_simulated * 4);
}

/* Every figure of two replays of the caching allocator, bit for bit. */
void assert_same_alloc(const ZpAllocStats *f, const ZpAllocStats *u)
{
    const double got[] = {f->allocated_bytes, f->reserved_bytes, f->peak_allocated_bytes,
                          f->peak_reserved_bytes, f->reserved_at_peak_bytes,
                          f->largest_free_at_peak_bytes, f->oom_request_bytes,
                          f->oom_allocated_bytes, f->oom_reserved_bytes,
                          f->oom_largest_free_bytes};
    const double want[] = {u->allocated_bytes, u->reserved_bytes, u->peak_allocated_bytes,
                           u->peak_reserved_bytes, u->reserved_at_peak_bytes,
                           u->largest_free_at_peak_bytes, u->oom_request_bytes,
                           u->oom_allocated_bytes, u->oom_reserved_bytes,
                           u->oom_largest_free_bytes};
    assert_same_doubles(got, want, G_N_ELEMENTS(got));
    g_assert_cmpuint(f->segments_allocated, ==, u->segments_allocated);
    g_assert_cmpint(f->oom, ==, u->oom);
    g_assert_cmpint(f->oom_fragmented, ==, u->oom_fragmented);
}

void assert_same_alloc_events(const ZpAllocStats *f, const ZpAllocStats *u)
{
    assert_same_alloc(f, u);
    g_assert_cmpuint(f->folded_events, ==, u->folded_events);
}

ZpModel sim_gpt_model(int layers, int vocab)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", "sim-test", "layers",
                          layers, "hidden", 1024, "heads", 16, "seq_len", 1024, "vocab", vocab);
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_from_json(o, "sim-test", &m, &error));
    g_assert_no_error(error);
    json_decref(o);
    return m;
}
