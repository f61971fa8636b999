/* bench_sim: how fast the simulator runs — one ZeRO-3 step of gpt-1t on 1,024 explicit ranks
 * and one 1 GiB all-reduce on 4,096 explicit ranks — in events/s, wall time and peak RSS. */
#include "sim_coll.h"
#include "sim_engine.h"
#include "zp_sched.h"

#include <stdio.h>
#include <sys/resource.h>

/* Wall seconds of the fastest of `repeats` runs, and the result of the last one. */
static double time_runs(const ZpSchedule *s, const ZpHw *hw, int repeats, SimResult **last)
{
    const SimOptions options = {.mode = SIM_MODE_EXPLICIT};
    double best_s = G_MAXDOUBLE;
    for (int i = 0; i < repeats; i++) {
        GError *error = NULL;
        const gint64 start_us = g_get_monotonic_time();
        SimResult *r = sim_engine_run(s, hw, &options, &error);
        const double wall_s = (g_get_monotonic_time() - start_us) / 1e6;
        if (!r) {
            fprintf(stderr, "bench_sim: %s\n", error->message);
            g_error_free(error);
            return -1;
        }
        best_s = MIN(best_s, wall_s);
        sim_result_free(*last);
        *last = r;
    }
    return best_s;
}

static void report(const char *what, const SimResult *r, double wall_s, int repeats)
{
    printf("%s\n  %d ranks, %" G_GUINT64_FORMAT " op events, %" G_GUINT64_FORMAT
           " queue events, simulated step %.6g s\n  wall %.4f s (fastest of %d), %.3g op "
           "events/s\n",
           what, r->ranks_simulated, r->op_events, r->heap_events, r->step_time_s, wall_s,
           repeats, r->op_events / wall_s);
}

static int bench_gpt_1t(const ZpHw *hw)
{
    ZpModel model;
    ZpPlan plan;
    GError *error = NULL;
    zp_plan_defaults(&plan, 3, 1024, 1);
    const gint64 start_us = g_get_monotonic_time();
    ZpSchedule *s = zp_model_load("gpt-1t", &model, &error)
                        ? zp_sched_build(&model, &plan, &error)
                        : NULL;
    if (!s) {
        fprintf(stderr, "bench_sim: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    printf("gpt-1t schedule: %u ops, built in %.4f s\n", s->ops->len,
           (g_get_monotonic_time() - start_us) / 1e6);
    SimResult *r = NULL;
    const int repeats = 3;
    const double wall_s = time_runs(s, hw, repeats, &r);
    if (wall_s >= 0)
        report("gpt-1t, ZeRO-3, dp 1024, mp 1, micro-batch 1, explicit ranks, dgx-a100-80g:", r,
               wall_s, repeats);
    sim_result_free(r);
    zp_sched_free(s);
    return wall_s < 0;
}

/* A schedule of one all-reduce on the DP stream, built by hand: no model, no other op. */
static int bench_allreduce(const ZpHw *hw)
{
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    zp_plan_defaults(&s->plan, 0, 4096, 1);
    s->world = 4096;
    s->elem_bytes = 2;
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const ZpOp op = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLREDUCE,
                     .stream = ZP_STREAM_DP, .group = ZP_GROUP_DP, .unit = -1, .buffer = -1,
                     .bytes = 1073741824.0};
    g_array_append_val(s->ops, op);
    const SimCollGroup g = sim_coll_group(hw, 4096, 1, ZP_GROUP_DP);
    const SimCollCost c = sim_coll_cost(ZP_COLL_ALLREDUCE, op.bytes, &g);
    printf("\n1 GiB all-reduce on 4096 ranks (%d nodes): NCCL's choice %s/%s, %.6g s; "
           "the ring (Simple) would take %.6g s\n",
           g.nodes, sim_coll_algo_name(c.algo), sim_coll_proto_name(c.proto),
           c.latency_s + c.transfer_s,
           sim_coll_ring_time_s(ZP_COLL_ALLREDUCE, op.bytes, &g, SIM_PROTO_SIMPLE));
    SimResult *r = NULL;
    const int repeats = 20;
    const double wall_s = time_runs(s, hw, repeats, &r);
    if (wall_s >= 0)
        report("1 GiB all-reduce, dp 4096, explicit ranks, dgx-a100-80g:", r, wall_s, repeats);
    sim_result_free(r);
    zp_sched_free(s);
    return wall_s < 0;
}

int main(void)
{
    ZpHw hw;
    GError *error = NULL;
    if (!zp_hw_load("dgx-a100-80g", &hw, &error)) {
        fprintf(stderr, "bench_sim: %s\n", error->message);
        return 1;
    }
    const int failed = bench_gpt_1t(&hw) + bench_allreduce(&hw);
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    printf("\npeak RSS of this process: %.1f MiB\n", usage.ru_maxrss / 1024.0);
    return failed ? 1 : 0;
}
