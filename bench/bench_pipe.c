/* bench_pipe: the pipeline bubble zreal measured beside the one the simulator predicts when
 * each compute op takes the time zreal measured for its kind on its stage (bench/pipe_bubble.sh).
 * Usage: bench_pipe MEASURED.json, from `mpirun -np P zreal --pp P ... --out MEASURED.json`. */
#include "sim_engine.h"
#include "zp_pipe.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>

/* What one stage's ranks measured per timed step: mean seconds per op of each compute kind,
 * wall time of a step, its compute (optimizer included) and its p2p sends. */
typedef struct {
    double op_s[ZP_COMP_N];
    double step_s, compute_s, send_s, recv_s;
    int ranks;
} StageTimes;

static double field(json_t *o, const char *key)
{
    return json_number_value(json_object_get(o, key));
}

static void add_rank(json_t *rank, StageTimes *st)
{
    json_t *ops = json_object_get(rank, "ops"), *pipe = json_object_get(rank, "pipeline");
    for (int k = 0; k < ZP_COMP_N; k++) {
        json_t *op = json_object_get(ops, zp_sched_compute_name((ZpComputeKind)k));
        if (!op || field(op, "count") <= 0)
            continue;
        st->op_s[k] += field(op, "total_s") / field(op, "count");
        st->compute_s += field(op, "total_s");
    }
    st->step_s += field(rank, "step_time_s");
    st->send_s += field(pipe, "send_s");
    st->recv_s += field(pipe, "recv_wait_s");
    st->ranks++;
}

/* Each compute op costs what zreal measured for its kind on its stage: no FLOPs, and the
 * bytes the roofline's memory rate moves in that time. */
static void use_measured_times(ZpSchedule *s, const StageTimes *st, const ZpHw *hw)
{
    for (guint i = 0; i < s->ops->len; i++) {
        ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->kind != ZP_OP_COMPUTE)
            continue;
        const StageTimes *t = &st[op->stage];
        op->flops = op->gemm_flops = op->attn_flops = 0;
        op->mem_bytes = t->op_s[op->sub] / t->ranks *
                        zp_hw_memory_bytes_per_s(hw, op->sub == ZP_COMP_OPTIMIZER);
    }
}

/* Each rank's memory and bytes beside its stage's prediction (they are equal: the tests
 * check it; printed here for the record). */
static void print_memory(json_t *root, const SimResult *r)
{
    static const ZpMemCategory shown[] = {ZP_MEM_PARAMS, ZP_MEM_ACTIVATIONS, ZP_MEM_CHECKPOINTS,
                                          ZP_MEM_BUCKETS};
    printf("rank stage  peak bytes measured/predicted:");
    for (size_t c = 0; c < G_N_ELEMENTS(shown); c++)
        printf("  %s", zp_sched_mem_name(shown[c]));
    printf("  p2p sent\n");
    json_t *rank;
    size_t i;
    json_array_foreach(json_object_get(root, "ranks"), i, rank) {
        json_t *pipe = json_object_get(rank, "pipeline");
        const int k = (int)field(pipe, "stage");
        json_t *peaks = json_object_get(rank, "category_peak_bytes");
        printf("%4zu %5d ", i, k);
        for (size_t c = 0; c < G_N_ELEMENTS(shown); c++)
            printf("  %.0f/%.0f", field(peaks, zp_sched_mem_name(shown[c])),
                   r->stage_category_peak_bytes[k * ZP_MEM_N + shown[c]]);
        printf("  %.0f/%.0f\n", field(pipe, "p2p_bytes"),
               r->stage_comm_bytes[k * ZP_GROUP_N + ZP_GROUP_PP]);
    }
}

static gboolean run(const char *path, GError **error)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, jerr.text);
        return FALSE;
    }
    ZpModel model;
    ZpPlan plan;
    ZpHw hw;
    ZpSchedule *s = NULL;
    SimResult *r = NULL;
    StageTimes *st = NULL;
    gboolean ok = zp_model_from_json(json_object_get(root, "model"), path, &model, error) &&
                  zp_plan_from_json(json_object_get(root, "plan"), path, &plan, error) &&
                  zp_hw_load("dgx-a100-80g", &hw, error);
    if (ok && (zp_plan_pp(&plan) < 2 || plan.dp * plan.mp != 1)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: a pipeline of one data-parallel replica (dp 1, mp 1, pp >= 2) is "
                    "what bench_pipe compares", path);
        ok = FALSE;
    }
    ok = ok && (s = zp_sched_build(&model, &plan, error)) != NULL;
    if (ok) {
        const int P = s->stages;
        st = g_new0(StageTimes, P);
        json_t *rank;
        size_t i;
        json_array_foreach(json_object_get(root, "ranks"), i, rank)
            add_rank(rank, &st[(int)field(json_object_get(rank, "pipeline"), "stage")]);
        hw.op_costs.present = FALSE; /* the roofline: time = mem_bytes / memory rate */
        use_measured_times(s, st, &hw);
        const SimOptions o = {.mode = SIM_MODE_FOLDED};
        ok = (r = sim_engine_run(s, &hw, &o, error)) != NULL;
    }
    if (ok) {
        const int P = s->stages, m = plan.grad_accum;
        printf("%s: %d stages, %d micro-batches of %d, %s; closed form (P-1)/(m+P-1) = %.1f%%\n",
               path, P, m, plan.micro_batch, zp_pipe_schedule_name(plan.pipe.schedule),
               100.0 * (P - 1) / (m + P - 1));
        printf("stage  step_s meas/sim    compute_s  bubble_s meas/sim  (of step)     diff  "
               "recv_wait_s\n");
        for (int k = 0; k < P; k++) {
            const StageTimes *t = &st[k];
            const double step = t->step_s / t->ranks, compute = t->compute_s / t->ranks;
            const double bubble = step - compute - t->send_s / t->ranks;
            const double sim_bubble = r->stage_bubble_s[k];
            printf("%5d  %.4f / %.4f    %.4f     %.4f / %.4f  (%4.1f%% / %4.1f%%)  %+5.1f%%  "
                   "%.4f\n", k, step, r->step_time_s, compute, bubble, sim_bubble,
                   100 * bubble / step, 100 * sim_bubble / r->step_time_s,
                   100 * (bubble - sim_bubble) / sim_bubble, t->recv_s / t->ranks);
        }
        print_memory(root, r);
    }
    sim_result_free(r);
    zp_sched_free(s);
    g_free(st);
    json_decref(root);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench_pipe MEASURED.json (mpirun -np P zreal --pp P --out ...)\n");
        return 1;
    }
    GError *error = NULL;
    if (!run(argv[1], &error)) {
        fprintf(stderr, "bench_pipe: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    return 0;
}
