/* cli_torchvalidate: `zplan validate --torch-trace TRACE --model M ...`: the step of a PyTorch
 * profiler trace beside zplan's prediction of the same plan, kernel class by kernel class. */
#include "cli.h"
#include "cli_torchtrace.h"
#include "zp_cost.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

typedef struct {
    char **traces;    /* --torch-trace, repeatable */
    char *steps;      /* --torch-steps: bench/torch_profile.py's steps-rank<R>.json */
    gboolean json;
} Flags;

/* A compute op's time split by kernel class in proportion to what its parts cost on the
 * profile: with kernel_rates, its framework's inventory kernels by class (zp_cost's class_s);
 * with an op table, its kernels (zp_cost_kernels) each at the table's rate; else the
 * roofline's time of its GEMM FLOPs, its fused attention's and its memory-bound bytes each
 * alone. The optimizer and the pure copies are one class each. */
static void split_compute(const ZpCost *c, const CliSimulated *s, const ZpOp *op, double op_s,
                          double class_s[ZP_KCLASS_N])
{
    const ZpComputeKind kind = op->sub;
    if (kind == ZP_COMP_OPTIMIZER || kind == ZP_COMP_CPU_OPTIMIZER) {
        class_s[ZP_KCLASS_OPTIMIZER] += op_s;
        return;
    }
    if (kind == ZP_COMP_HOST_COPY || kind == ZP_COMP_QUANTIZE || kind == ZP_COMP_UNPACK) {
        class_s[ZP_KCLASS_MEMORY] += op_s;
        return;
    }
    double part[3] = {0}; /* gemm, attention, memory */
    if (c->inventory) { /* the framework's kernels at the profile's kernel_rates */
        part[0] = c->class_s[kind][ZP_KCLASS_GEMM];
        part[1] = c->class_s[kind][ZP_KCLASS_ATTENTION];
        part[2] = c->class_s[kind][ZP_KCLASS_MEMORY];
    } else if (c->table && zp_model_has_architecture(s->model)) {
        ZpKernels ks;
        zp_cost_kernels(s->model, s->plan, kind, &ks);
        for (int i = 0; i < ks.n; i++) {
            const int to = ks.k[i].kind == ZP_KERNEL_GEMM        ? 0
                           : ks.k[i].kind == ZP_KERNEL_ATTENTION ? 1
                                                                 : 2;
            part[to] += zp_cost_kernel_s(c, &ks.k[i]);
        }
    } else {
        const double gemm = fmax(op->flops - op->attn_flops, 0);
        part[0] = gemm > 0 ? zp_cost_op_s(c, kind, -1, gemm, op->gemm_flops, 0, 0) : 0;
        part[1] = op->attn_flops > 0
                      ? zp_cost_op_s(c, kind, -1, op->attn_flops, op->gemm_flops, op->attn_flops, 0)
                      : 0;
        part[2] = op->mem_bytes > 0 ? zp_cost_op_s(c, kind, -1, 0, 0, 0, op->mem_bytes) : 0;
    }
    const double sum = part[0] + part[1] + part[2];
    static const ZpKClass to_class[3] = {ZP_KCLASS_GEMM, ZP_KCLASS_ATTENTION,
                                              ZP_KCLASS_MEMORY};
    for (int p = 0; p < 3; p++)
        class_s[to_class[p]] += sum > 0 ? op_s * part[p] / sum : (p == 0 ? op_s : 0);
}

/* The reported rank's step by class: each op's simulated duration (contention included), the
 * collectives whole. */
static gboolean predicted_classes(const CliSimulated *s, double class_s[ZP_KCLASS_N],
                                  GError **error)
{
    ZpCost c;
    if (!zp_cost_init(&c, s->hw, s->model, s->plan, error))
        return FALSE;
    const SimResult *r = s->result;
    size_t base = 0; /* a sink's run keeps every rank's row (cli_simulate.c) */
    if (!sim_result_timeline_row(r, (uint32_t)r->report_rank, &base)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "validate: the step was run without the reported rank's timeline");
        return FALSE;
    }
    const uint32_t stage = sim_result_rank_stage(r, (uint32_t)r->report_rank, s->plan->mp);
    memset(class_s, 0, ZP_KCLASS_N * sizeof *class_s);
    for (uint32_t i = 0; i < r->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s->sched, i);
        if (op->stage != stage)
            continue;
        const double op_s = r->op_end_s[base + i] - r->op_start_s[base + i];
        if (op->kind == ZP_OP_COLLECTIVE)
            class_s[ZP_KCLASS_COLLECTIVE] += op_s;
        else if (op->kind == ZP_OP_COMPUTE)
            split_compute(&c, s, op, op_s, class_s);
    }
    return TRUE;
}

/* bench/torch_profile.py's steps file: its configuration must be the plan's. */
static gboolean read_steps(const char *path, const CliSimulated *s, json_t **out, GError **error)
{
    json_t *root = zp_json_load_object(path, error);
    const char *format = NULL;
    int64_t micro_batch, seq, world;
    double v;
    gboolean ok = root && zp_json_get_string(root, path, "format", TRUE, &format, error);
    if (ok && strcmp(format, "zplan-torch-profile-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: format \"%s\" is not "
                    "zplan-torch-profile-1 (bench/torch_profile.py)", path, format);
        ok = FALSE;
    }
    ok = ok && zp_json_get_int(root, path, "micro_batch", TRUE, 1, 1 << 24, &micro_batch, error) &&
         zp_json_get_int(root, path, "seq", TRUE, 1, 1 << 30, &seq, error) &&
         zp_json_get_int(root, path, "world", TRUE, 1, 1 << 24, &world, error) &&
         zp_json_get_number(root, path, "median_step_time_s", TRUE, 1e-9, 1e6, &v, error) &&
         zp_json_get_number(root, path, "max_memory_allocated_bytes", TRUE, 0, 1e15, &v, error) &&
         zp_json_get_number(root, path, "max_memory_reserved_bytes", TRUE, 0, 1e15, &v, error);
    const int64_t gpus = s->sched->world;
    if (ok && (micro_batch != s->plan->micro_batch || seq != s->model->seq_len || world != gpus)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s ran another configuration: micro-batch %" G_GINT64_FORMAT ", sequence %"
                    G_GINT64_FORMAT ", %" G_GINT64_FORMAT " rank(s) against the plan's %d, %d, "
                    "%" G_GINT64_FORMAT " (--micro-batch, --seq, --gpus)", path, micro_batch,
                    seq, world, s->plan->micro_batch, (int)s->model->seq_len, gpus);
        ok = FALSE;
    }
    if (!ok)
        json_decref(root);
    *out = ok ? root : NULL;
    return ok;
}

static json_t *row(const char *quantity, double predicted, double measured)
{
    /* No miss (null) where nothing was measured. */
    return json_pack("{s:s, s:f, s:f, s:o}", "quantity", quantity, "predicted", predicted,
                     "measured", measured, "miss",
                     measured > 0 ? json_real(predicted / measured - 1) : json_null());
}

static void print_rows(json_t *rows)
{
    printf("  %-34s %14s %14s %9s\n", "quantity", "predicted", "measured", "miss");
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        const char *q = json_string_value(json_object_get(r, "quantity"));
        const gboolean bytes = g_str_has_suffix(q, "(GB)");
        const double scale = bytes ? 1e-9 : 1e3;
        const double p = json_number_value(json_object_get(r, "predicted"));
        const double m = json_number_value(json_object_get(r, "measured"));
        json_t *miss = json_object_get(r, "miss");
        if (json_is_number(miss))
            printf("  %-34s %14.3f %14.3f %8.1f%%\n", q, scale * p, scale * m,
                   100 * json_number_value(miss));
        else
            printf("  %-34s %14.3f %14.3f %9s\n", q, scale * p, scale * m, "-");
    }
}

static int compare(const CliSimulated *s, void *ctx)
{
    const Flags *f = ctx;
    GError *error = NULL;
    double predicted[ZP_KCLASS_N];
    json_t *steps = NULL;
    ZpTorchTrace *t = NULL;
    if (!predicted_classes(s, predicted, &error) ||
        (f->steps && !read_steps(f->steps, s, &steps, &error)) ||
        !(t = cli_torch_trace_load(f->traces, &error)))
        return cli_fail("validate", error);
    ZpTraceSummary sum;
    zp_torch_trace_summary(t, &sum);
    json_t *rows = json_array();
    const double measured_step = steps ? json_number_value(json_object_get(steps, "median_step_time_s"))
                                       : sum.step_s;
    json_array_append_new(rows, row("step time (ms)", s->result->step_time_s, measured_step));
    for (int c = 0; c < ZP_KCLASS_N; c++) {
        char *q = g_strdup_printf("%s kernels per step (ms)", zp_kclass_name(c));
        json_array_append_new(rows, row(q, predicted[c], sum.class_step_s[c]));
        g_free(q);
    }
    json_array_append_new(rows, row("unknown kernels per step (ms)", 0,
                                    sum.class_step_s[ZP_KCLASS_UNKNOWN]));
    if (steps) {
        json_array_append_new(rows, row("peak reserved (GB)", s->alloc.peak_reserved_bytes,
                                        json_number_value(json_object_get(
                                            steps, "max_memory_reserved_bytes"))));
        json_array_append_new(rows, row("peak allocated (GB)", s->alloc.peak_allocated_bytes,
                                        json_number_value(json_object_get(
                                            steps, "max_memory_allocated_bytes"))));
    }
    int status = 0;
    if (f->json) {
        json_t *root = json_pack("{s:s, s:s, s:o, s:o, s:o}", "model", s->model->name, "cluster",
                                 s->hw->name, "plan", zp_plan_to_json(s->plan), "rows", rows,
                                 "trace", cli_torch_trace_summary_json(t));
        status = zp_json_write(root, NULL, &error) ? 0 : cli_fail("validate", error);
        json_decref(root);
    } else {
        printf("%s on %s: zplan's prediction against %d trace file(s), %d step(s)%s\n\n",
               s->model->name, s->hw->name, sum.files, sum.steps,
               steps ? " and the run's steps file" : "");
        print_rows(rows);
        printf("\n  (measured per class: the median over steps and ranks of the kernels' time in "
               "a step, streams summed; predicted: the simulated rank's op durations split by "
               "what each class costs on the profile)\n");
        json_decref(rows);
    }
    json_decref(steps);
    zp_torch_trace_free(t);
    return status;
}

int cli_torch_validate(int argc, char **argv)
{
    Flags f = {0};
    const GOptionEntry extra[] = {
        {"torch-trace", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &f.traces, "A PyTorch profiler trace of the plan's job (repeatable: ranks, steps)", "TRACE"},
        {"torch-steps", 0, 0, G_OPTION_ARG_FILENAME, &f.steps, "bench/torch_profile.py's steps file: its step time and peak memory compared too", "FILE"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &f.json, "Print JSON", NULL},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    const int status = cli_simulate_into(argc, argv, "validate",
        "Simulates the plan the flags give (as zplan simulate) and sets its step beside a\n"
        "PyTorch profiler trace of the same job, by kernel class: GEMMs, attention,\n"
        "memory-bound kernels, collectives and the optimizer (docs/calibrate.md).",
        extra, compare, &f);
    g_strfreev(f.traces);
    g_free(f.steps);
    return status;
}
