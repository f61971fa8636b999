/* real_opseq: a step's compute ops timed whole, in a step's own sequence over every layer (its
 * optimizer too, at each ZeRO stage's partition), so that zp_cost can take measured times first. */
#include "real_opseq.h"
#include "real_timing.h"
#include "real_engine.h"
#include "real_gpt.h"
#include "zp_cost.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ZERO_STAGES 4
#define MODES 2 /* without and with checkpointing */
/* Timed steps per mode: at least MIN_TIMED_STEPS, more where a step is cheap, up to about
 * TIMED_BUDGET_S of both modes' steps together (the host's noise on a 15-ms step is tens of
 * percent, and the median of 3 then misses by that much). */
#define MIN_TIMED_STEPS 3
#define MAX_TIMED_STEPS 15
#define TIMED_BUDGET_S 6.0
#define LINE_UPS 100 /* back to back, for one line-up's own time */

typedef struct {
    RealBackend *be;
    RealGpt *gpt;
    RealGptDims dims;
    int n_units;
    /* The parameters and gradients flat, units at their offsets, as the engine lays them out
     * (real_engine.c), then zeros to the widest stage's padding; the optimizer's states over
     * the same span. */
    uint64_t flat;
    RealBf16 *flat_params, *flat_grads;
    float *master, *adam_m, *adam_v;
    RealBf16 **params, **grads; /* per unit: into the flat buffers */
    int64_t adam_step;
    /* The optimizer's partitions, one per distinct element count of stages 0-3 on the plan's
     * dp ranks (zp_sched_optimizer_elems): this rank's, at its place in the flat space. Each
     * timed step steps the next one in turn (its caches as a step leaves them, not as another
     * optimizer call would). */
    int n_parts, part, turn;
    uint64_t part_elems[ZERO_STAGES], part_offset[ZERO_STAGES];
    GArray *part_times[ZERO_STAGES];
    RealBf16 **x;               /* x_0 .. x_L, bf16 [T, h] */
    RealBf16 *scratch;          /* a recompute's output (backward reads its saved tensors) */
    float *dx;                  /* fp32 [T, h], in place through the backward */
    int *tokens, *targets;      /* host */
    int layer;
    gboolean save;
    GArray *times[MODES][ZP_COMP_N]; /* double: every timed call of each kind, per mode */
    double timed_sum_s; /* the sum of every timed call's time, optimizer included */
    double cycle_s, line_up_s; /* the timed steps' cycle and one line-up's own time */
    /* Each timed call's time is this many times its own: its share of the cycle the ranks
     * went through together (real_opseq_run's cycle_factor). */
    double cycle_factor;
} Seq;

static gboolean run_embed_fwd(void *p, GError **error)
{
    Seq *q = p;
    return real_gpt_embed_forward(q->gpt, q->params[0], q->tokens, q->x[0], error);
}

static gboolean run_block_fwd(void *p, GError **error)
{
    Seq *q = p;
    return real_gpt_block_forward(q->gpt, q->layer, q->params[q->layer + 1], q->x[q->layer],
                                  q->x[q->layer + 1], q->save, error);
}

static gboolean run_recompute(void *p, GError **error)
{
    Seq *q = p;
    return real_gpt_block_forward(q->gpt, q->layer, q->params[q->layer + 1], q->x[q->layer],
                                  q->scratch, TRUE, error);
}

static gboolean run_head(void *p, GError **error)
{
    Seq *q = p;
    const int last = q->n_units - 1;
    float loss;
    return real_gpt_head_forward_backward(q->gpt, q->params[last], q->params[0],
                                          q->x[q->dims.layers], q->targets, 1.0f, &loss, q->dx,
                                          q->grads[last], q->grads[0], error);
}

static gboolean run_block_bwd(void *p, GError **error)
{
    Seq *q = p;
    return real_gpt_block_backward(q->gpt, q->layer, q->params[q->layer + 1], q->dx, q->dx,
                                   q->grads[q->layer + 1], error);
}

static gboolean run_embed_bwd(void *p, GError **error)
{
    Seq *q = p;
    return real_gpt_embed_backward(q->gpt, q->tokens, q->dx, q->grads[0], error);
}

/* The step's Adam over the partition in turn, one call as the engine makes it
 * (real_engine_compute.c optimizer). A learning rate of 0 writes the same parameters back: every
 * timed step computes on the same values (gradients here are never zeroed, and drifting
 * weights could reach slow denormal arithmetic). */
static gboolean run_optimizer(void *p, GError **error)
{
    (void)error;
    Seq *q = p;
    const RealAdamHyper hyper = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .grad_scale = 1.0f, .step = ++q->adam_step};
    const uint64_t at = q->part_offset[q->part];
    q->be->adam_step(q->be, &hyper, q->part_elems[q->part], q->master + at, q->adam_m + at,
                     q->adam_v + at, q->flat_grads + at, q->flat_params + at);
    return TRUE;
}

/* One op, its time on this rank appended to `times` (NULL: untimed) and summed. */
static gboolean op(Seq *q, RealTimedFn fn, GArray *times, GError **error)
{
    double t;
    if (!real_timing_own_s(q->be, fn, q, &t, error))
        return FALSE;
    if (times) {
        g_array_append_val(times, t);
        q->timed_sum_s += t;
    }
    return TRUE;
}

/* The compute of one step, in the engine's order, and its optimizer; timed when `record`.
 * The ranks are lined up once, before the step, not before each op: each then runs its ops
 * one after another while the others run theirs, as in training. Lined up before every op,
 * ranks that outnumber the cores take turns through a short op (one time slice each), and
 * each would time it as if alone (tiny's 2-3 ms blocks with 4 ranks on 2 cores: 1.05-1.20x
 * their time alone, where training took 1.9-2.0x). */
static gboolean step(Seq *q, RealComm *comm, gboolean checkpoint, gboolean record,
                     GError **error)
{
    const int L = q->dims.layers;
    GArray *untimed[ZP_COMP_N] = {NULL}, **t = record ? q->times[checkpoint] : untimed;
    /* The step's gradients start fresh, as the engine's first micro-step writes them
     * (real_engine.c start_step): backward stores each, then adds to it. */
    real_gpt_grads_fresh(q->gpt, -1, UINT32_MAX);
    gboolean ok = real_timing_line_up(comm, error) &&
                  op(q, run_embed_fwd, t[ZP_COMP_EMBED_FWD], error);
    q->save = !checkpoint;
    for (q->layer = 0; ok && q->layer < L; q->layer++)
        ok = op(q, run_block_fwd, t[ZP_COMP_BLOCK_FWD], error);
    ok = ok && op(q, run_head, t[ZP_COMP_HEAD], error);
    for (q->layer = L - 1; ok && q->layer >= 0; q->layer--)
        ok = (!checkpoint || op(q, run_recompute, t[ZP_COMP_RECOMPUTE], error)) &&
             op(q, run_block_bwd, t[ZP_COMP_BLOCK_BWD], error);
    ok = ok && op(q, run_embed_bwd, t[ZP_COMP_EMBED_BWD], error);
    q->part = q->turn % q->n_parts;
    q->turn += record;
    return ok && op(q, run_optimizer, record ? q->part_times[q->part] : NULL, error);
}

/* The mean of `t`'s samples. Not their median: where ranks outnumber the cores, an op shorter
 * than a time slice mostly runs whole inside one slice and only some calls wait out the other
 * ranks' slices, so the median call was the op alone (tiny's 1.1-ms blocks with 4 ranks on 2
 * cores: 1.12 and 1.14 ms, where training spent 1.37 and 2.33 ms a call on them). The mean
 * counts every slice the rank waited for inside its calls. */
static double mean_s(const GArray *t)
{
    double sum = 0;
    for (guint i = 0; i < t->len; i++)
        sum += g_array_index(t, double, i);
    return t->len > 0 ? sum / t->len : 0;
}

/* v[0..n) replaced by the ranks' means of it (every rank calls it; every rank gets them). */
static gboolean ranks_mean(RealComm *comm, double *v, size_t n, GError **error)
{
    if (!comm->allreduce_host_f64(comm, v, n, error))
        return FALSE;
    for (size_t i = 0; i < n; i++)
        v[i] /= comm->size;
    return TRUE;
}

/* {op, shape, calls, time_s} of this rank's samples `t`, which are cleared: time_s is the
 * ranks' mean of their calls' mean share of the cycle (the mean times q->cycle_factor; the
 * same on every rank). Not the slowest rank's: every rank's shares sum to the same cycle,
 * which already waited for the slowest at each line-up, and the slowest of each op summed
 * over the ops would exceed it. NULL, with *error set, when the ranks' figures could not be
 * gathered. */
static json_t *row(const Seq *q, RealComm *comm, ZpComputeKind kind, const char *shape,
                   GArray *t, GError **error)
{
    double s = mean_s(t) * q->cycle_factor;
    const gboolean ok = ranks_mean(comm, &s, 1, error);
    json_t *r = ok ? json_pack("{s:s, s:s, s:i, s:f}", "op", zp_sched_compute_name(kind),
                               "shape", shape, "calls", (int)t->len, "time_s", s)
                   : NULL;
    g_array_set_size(t, 0);
    return r;
}

/* A row per compute op kind timed in this mode (plan->checkpoint), with the mode. Every rank
 * calls it: each kind has as many samples on every rank. */
static gboolean rows(Seq *q, RealComm *comm, const ZpModel *model, const ZpPlan *plan,
                     json_t *out, GError **error)
{
    GArray **times = q->times[plan->checkpoint ? 1 : 0];
    for (int k = 0; k < ZP_COMP_N; k++) {
        if (times[k]->len == 0)
            continue;
        char shape[ZP_OPTABLE_SHAPE_LEN];
        zp_cost_op_shape(model, plan, (ZpComputeKind)k, shape);
        json_t *r = row(q, comm, (ZpComputeKind)k, shape, times[k], error);
        if (!r)
            return FALSE;
        json_object_set_new(r, "checkpoint", json_boolean(plan->checkpoint));
        json_array_append_new(out, r);
    }
    return TRUE;
}

/* A row per optimizer partition, over both modes' steps (every rank calls it). */
static gboolean optimizer_rows(Seq *q, RealComm *comm, json_t *out, GError **error)
{
    for (int i = 0; i < q->n_parts; i++) {
        char shape[ZP_OPTABLE_SHAPE_LEN];
        zp_cost_optimizer_shape((double)q->part_elems[i], shape);
        json_t *r = row(q, comm, ZP_COMP_OPTIMIZER, shape, q->part_times[i], error);
        if (!r)
            return FALSE;
        json_array_append_new(out, r);
    }
    return TRUE;
}

/* The distinct optimizer partitions of stages 0-3 with plan->dp ranks, this rank's (`rank`)
 * place in the flat space, and the flat space's elements (the model's, or the widest
 * stage's padding). */
static void partitions(Seq *q, const ZpModel *model, const ZpPlan *plan, int rank)
{
    q->flat = 0;
    for (int u = 0; u < q->n_units; u++)
        q->flat += real_gpt_unit_elems(&q->dims, u);
    for (int stage = 0; stage < ZERO_STAGES; stage++) {
        ZpPlan at = *plan;
        at.zero.stage = stage;
        const uint64_t n = zp_sched_optimizer_elems(model, &at);
        int i = 0;
        while (i < q->n_parts && q->part_elems[i] != n)
            i++;
        if (i < q->n_parts)
            continue;
        q->part_elems[i] = n;
        q->part_offset[i] = stage == 0 ? 0 : (uint64_t)(rank % plan->dp) * n;
        q->flat = MAX(q->flat, q->part_offset[i] + n);
        q->n_parts++;
    }
}

/* The units' parameters (the model's initialisation) and their fp32 master copy, zeroed
 * gradients and moments, the residual stream, tokens. */
static gboolean allocate(Seq *q, GError **error)
{
    RealBackend *be = q->be;
    const size_t T = (size_t)q->dims.micro_batch * (size_t)q->dims.seq_len;
    const size_t xbytes = real_gpt_checkpoint_bytes(&q->dims);
    const size_t flat = (size_t)q->flat;
    q->params = g_new0(RealBf16 *, q->n_units);
    q->grads = g_new0(RealBf16 *, q->n_units);
    q->x = g_new0(RealBf16 *, q->dims.layers + 1);
    q->flat_params = be->alloc(be, flat * sizeof(RealBf16), REAL_MEM_PARAMS);
    q->flat_grads = be->alloc(be, flat * sizeof(RealBf16), REAL_MEM_GRADS);
    q->master = be->alloc(be, flat * sizeof(float), REAL_MEM_MASTER);
    q->adam_m = be->alloc(be, flat * sizeof(float), REAL_MEM_ADAM_M);
    q->adam_v = be->alloc(be, flat * sizeof(float), REAL_MEM_ADAM_V);
    gboolean ok = q->flat_params && q->flat_grads && q->master && q->adam_m && q->adam_v;
    RealBf16 *host = ok ? g_new0(RealBf16, flat) : NULL;
    for (size_t u = 0, at = 0; ok && u < (size_t)q->n_units; u++) {
        q->params[u] = q->flat_params + at;
        q->grads[u] = q->flat_grads + at;
        ok = real_gpt_init_params(&q->dims, 7, (int)u, host + at, error);
        at += real_gpt_unit_elems(&q->dims, (int)u);
    }
    if (ok) {
        float *wide = g_new(float, flat);
        for (size_t i = 0; i < flat; i++)
            wide[i] = real_bf16_to_f32(host[i]);
        be->copy(be, q->flat_params, host, flat * sizeof(RealBf16));
        be->copy(be, q->master, wide, flat * sizeof(float));
        be->fill(be, q->flat_grads, 0, flat * sizeof(RealBf16));
        be->fill(be, q->adam_m, 0, flat * sizeof(float));
        be->fill(be, q->adam_v, 0, flat * sizeof(float));
        g_free(wide);
    }
    g_free(host);
    for (int l = 0; ok && l <= q->dims.layers; l++)
        ok = (q->x[l] = be->alloc(be, xbytes, REAL_MEM_CHECKPOINTS)) != NULL;
    ok = ok && (q->scratch = be->alloc(be, xbytes, REAL_MEM_WORKSPACE)) != NULL &&
         (q->dx = be->alloc(be, real_gpt_residual_grad_bytes(&q->dims), REAL_MEM_WORKSPACE));
    q->tokens = g_new(int, T);
    q->targets = g_new(int, T);
    for (size_t i = 0; i < T; i++) { /* any tokens: the work does not depend on them */
        q->tokens[i] = (int)((i * 2654435761u) % (size_t)q->dims.vocab);
        q->targets[i] = (int)((i * 40503u + 1) % (size_t)q->dims.vocab);
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "op sequence: out of backend memory");
    return ok;
}

static void release(Seq *q)
{
    void *device[] = {q->flat_params, q->flat_grads, q->master, q->adam_m, q->adam_v,
                      q->scratch, q->dx};
    for (size_t i = 0; i < G_N_ELEMENTS(device); i++)
        q->be->free(q->be, device[i]);
    for (int l = 0; q->x && l <= q->dims.layers; l++)
        q->be->free(q->be, q->x[l]);
    g_free(q->params), g_free(q->grads), g_free(q->x);
    g_free(q->tokens), g_free(q->targets);
    real_gpt_free(q->gpt);
    for (int m = 0; m < MODES; m++)
        for (int k = 0; k < ZP_COMP_N; k++)
            g_array_unref(q->times[m][k]);
    for (int i = 0; i < ZERO_STAGES; i++)
        g_array_unref(q->part_times[i]);
}

/* One untimed step of each mode (a warm-up), and from the ranks' mean wall time for it the
 * timed steps each mode takes (`timed`): the same on every rank, which make the same calls. */
static gboolean timed_steps(Seq *q, RealComm *comm, int *timed, GError **error)
{
    const double t0 = zp_now_s();
    gboolean ok = TRUE;
    for (int m = 0; ok && m < MODES; m++)
        ok = step(q, comm, m, FALSE, error);
    double pair_s = zp_now_s() - t0;
    if (!ok || !ranks_mean(comm, &pair_s, 1, error))
        return FALSE;
    *timed = pair_s > 0 ? (int)CLAMP(ceil(TIMED_BUDGET_S / pair_s), MIN_TIMED_STEPS,
                                     MAX_TIMED_STEPS)
                        : MAX_TIMED_STEPS;
    return TRUE;
}

/* Seconds of one line-up alone: the mean of LINE_UPS back to back, the ranks' mean. */
static gboolean time_line_up(RealComm *comm, double *s, GError **error)
{
    gboolean ok = real_timing_line_up(comm, error);
    const double t0 = zp_now_s();
    for (int i = 0; ok && i < LINE_UPS; i++)
        ok = real_timing_line_up(comm, error);
    *s = (zp_now_s() - t0) / LINE_UPS;
    return ok && ranks_mean(comm, s, 1, error);
}

/* The `steps` timed steps (modes in turn), each lined up at its start, and one line-up after
 * the last, as one cycle, from which q->cycle_factor: on the host, the cycle's time less its
 * line-ups' own (line_up_s each) over the sum of the rank's timed calls (1 at least); on a
 * device, whose calls are timed on its clock, 1.
 * Ranks that outnumber the cores take turns on them, and a rank that the others' time slices
 * hold back also waits for the core inside a line-up, which its calls do not time (with 4
 * ranks on 2 cores tiny's calls summed to 55-82% of the cycle on its ranks, cpu-small's to
 * 96-99%). A step's compute takes the whole cycle but the collective's own cost, as in
 * training, where that wait fell in the gradient collective: each call's share of it is its
 * share of the calls' sum. */
static gboolean timed_cycle(Seq *q, RealComm *comm, int steps, GError **error)
{
    gboolean ok = real_timing_line_up(comm, error);
    const double t0 = zp_now_s();
    for (int s = 0; ok && s < steps; s++)
        ok = step(q, comm, s % MODES, TRUE, error);
    ok = ok && real_timing_line_up(comm, error);
    q->cycle_s = zp_now_s() - t0;
    if (!ok || !time_line_up(comm, &q->line_up_s, error))
        return FALSE;
    const double calls_s = q->cycle_s - (steps + 1) * q->line_up_s;
    q->cycle_factor =
        q->be->mark || q->timed_sum_s <= 0 ? 1.0 : MAX(1.0, calls_s / q->timed_sum_s);
    return TRUE;
}

/* "op_sequence_cycle": {ranks, steps, cycle_s, line_up_s, calls_s, cycle_factor} into `root`,
 * the last two the ranks' means (every rank calls it). */
static gboolean cycle_json(const Seq *q, RealComm *comm, int steps, json_t *root,
                           GError **error)
{
    double mean[2] = {q->timed_sum_s, q->cycle_factor};
    if (!ranks_mean(comm, mean, 2, error))
        return FALSE;
    json_object_set_new(root, "op_sequence_cycle",
                        json_pack("{s:i, s:i, s:f, s:f, s:f, s:f}", "ranks", comm->size, "steps",
                                  steps, "cycle_s", q->cycle_s, "line_up_s", q->line_up_s,
                                  "calls_s", mean[0], "cycle_factor", mean[1]));
    return TRUE;
}

gboolean real_opseq_run(RealBackend *be, RealComm *comm, const ZpModel *model,
                        const ZpPlan *plan, void *root, GError **error)
{
    if (plan->mp > 1)
        return TRUE;
    Seq q = {.be = be, .dims = real_engine_dims(model, plan)};
    for (int m = 0; m < MODES; m++)
        for (int k = 0; k < ZP_COMP_N; k++)
            q.times[m][k] = g_array_new(FALSE, FALSE, sizeof(double));
    for (int i = 0; i < ZERO_STAGES; i++)
        q.part_times[i] = g_array_new(FALSE, FALSE, sizeof(double));
    q.n_units = real_gpt_n_units(&q.dims);
    partitions(&q, model, plan, comm->rank);
    gboolean ok = real_gpt_dims_check(&q.dims, error) &&
                  real_gpt_check_backend(be, &q.dims, error) &&
                  (q.gpt = real_gpt_new(be, &q.dims, error)) != NULL && allocate(&q, error);
    int timed = 0;
    ok = ok && timed_steps(&q, comm, &timed, error);
    /* The modes take turns, so that a slow spell of the host falls on both alike. */
    ok = ok && timed_cycle(&q, comm, timed * MODES, error);
    json_t *out = json_array();
    for (int checkpoint = 0; ok && checkpoint < MODES; checkpoint++) {
        ZpPlan mode = *plan;
        mode.checkpoint = checkpoint;
        ok = rows(&q, comm, model, &mode, out, error);
    }
    ok = ok && optimizer_rows(&q, comm, out, error) &&
         cycle_json(&q, comm, timed * MODES, root, error);
    release(&q);
    if (!ok) {
        json_decref(out);
        g_prefix_error(error, "op sequence (%s): ", model->name);
        return FALSE;
    }
    json_object_set_new(root, "op_sequence", out);
    return TRUE;
}
