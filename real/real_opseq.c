/* real_opseq: a step's compute ops timed whole, in a step's own sequence over every layer (its
 * optimizer included, untimed), so that zp_cost can take measured op times first. */
#include "real_opseq.h"
#include "real_engine.h"
#include "real_gpt.h"
#include "real_microbench.h"
#include "zp_cost.h"
#include "zp_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define TIMED_STEPS 3

typedef struct {
    RealBackend *be;
    RealGpt *gpt;
    RealGptDims dims;
    int n_units;
    RealBf16 **params, **grads; /* per unit */
    float **master, **adam_m, **adam_v; /* per unit: the optimizer's states */
    int64_t adam_step;
    RealBf16 **x;               /* x_0 .. x_L, bf16 [T, h] */
    RealBf16 *scratch;          /* a recompute's output (backward reads its saved tensors) */
    float *dx;                  /* fp32 [T, h], in place through the backward */
    int *tokens, *targets;      /* host */
    int layer;
    gboolean save;
    GArray *times[ZP_COMP_N];   /* double: every timed call of each kind */
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

/* One op, timed when `record`. */
static gboolean op(Seq *q, RealComm *comm, ZpComputeKind kind, RealTimedFn fn, gboolean record,
                   GError **error)
{
    double t;
    if (!real_microbench_once_s(q->be, comm, fn, q, &t, error))
        return FALSE;
    if (record)
        g_array_append_val(q->times[kind], t);
    return TRUE;
}

/* The step's Adam over every unit, untimed (zp_cost takes the optimizer from its fitted
 * rate): it runs so that the next step's first ops find the caches as training leaves them,
 * after the optimizer has streamed 16 bytes per parameter through them. A learning rate of 0
 * writes the same parameters back: every timed step computes on the same values (gradients
 * here are never zeroed, and drifting weights could reach slow denormal arithmetic). */
static gboolean optimizer(Seq *q)
{
    const RealAdamHyper hyper = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .grad_scale = 1.0f, .step = ++q->adam_step};
    for (int u = 0; u < q->n_units; u++)
        q->be->adam_step(q->be, &hyper, real_gpt_unit_elems(&q->dims, u), q->master[u],
                         q->adam_m[u], q->adam_v[u], q->grads[u], q->params[u]);
    return TRUE;
}

/* The compute of one step, in the engine's order, and its optimizer. */
static gboolean step(Seq *q, RealComm *comm, gboolean checkpoint, gboolean record,
                     GError **error)
{
    const int L = q->dims.layers;
    gboolean ok = op(q, comm, ZP_COMP_EMBED_FWD, run_embed_fwd, record, error);
    q->save = !checkpoint;
    for (q->layer = 0; ok && q->layer < L; q->layer++)
        ok = op(q, comm, ZP_COMP_BLOCK_FWD, run_block_fwd, record, error);
    ok = ok && op(q, comm, ZP_COMP_HEAD, run_head, record, error);
    for (q->layer = L - 1; ok && q->layer >= 0; q->layer--)
        ok = (!checkpoint || op(q, comm, ZP_COMP_RECOMPUTE, run_recompute, record, error)) &&
             op(q, comm, ZP_COMP_BLOCK_BWD, run_block_bwd, record, error);
    return ok && op(q, comm, ZP_COMP_EMBED_BWD, run_embed_bwd, record, error) &&
           optimizer(q);
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A row per op kind timed in this mode, and the samples cleared. */
static void rows(Seq *q, const ZpModel *model, const ZpPlan *plan, json_t *out)
{
    for (int k = 0; k < ZP_COMP_N; k++) {
        GArray *t = q->times[k];
        if (t->len == 0)
            continue;
        qsort(t->data, t->len, sizeof(double), compare_doubles);
        char shape[ZP_OPTABLE_SHAPE_LEN];
        zp_cost_op_shape(model, plan, (ZpComputeKind)k, shape);
        json_array_append_new(out, json_pack("{s:s, s:s, s:b, s:i, s:f}", "op",
                                             zp_sched_compute_name(k), "shape", shape,
                                             "checkpoint", plan->checkpoint, "calls",
                                             (int)t->len, "time_s",
                                             g_array_index(t, double, t->len / 2)));
        g_array_set_size(t, 0);
    }
}

/* The units' parameters (the model's initialisation), zeroed gradients, the residual
 * stream, tokens. */
static gboolean allocate(Seq *q, GError **error)
{
    RealBackend *be = q->be;
    const size_t T = (size_t)q->dims.micro_batch * (size_t)q->dims.seq_len;
    const size_t xbytes = real_gpt_checkpoint_bytes(&q->dims);
    gboolean ok = TRUE;
    q->params = g_new0(RealBf16 *, q->n_units);
    q->grads = g_new0(RealBf16 *, q->n_units);
    q->master = g_new0(float *, q->n_units);
    q->adam_m = g_new0(float *, q->n_units);
    q->adam_v = g_new0(float *, q->n_units);
    q->x = g_new0(RealBf16 *, q->dims.layers + 1);
    for (int u = 0; ok && u < q->n_units; u++) {
        const size_t n = real_gpt_unit_elems(&q->dims, u);
        RealBf16 *host = g_new(RealBf16, n);
        q->params[u] = be->alloc(be, n * sizeof(RealBf16), REAL_MEM_PARAMS);
        q->grads[u] = be->alloc(be, n * sizeof(RealBf16), REAL_MEM_GRADS);
        q->master[u] = be->alloc(be, n * sizeof(float), REAL_MEM_MASTER);
        q->adam_m[u] = be->alloc(be, n * sizeof(float), REAL_MEM_ADAM_M);
        q->adam_v[u] = be->alloc(be, n * sizeof(float), REAL_MEM_ADAM_V);
        ok = q->params[u] && q->grads[u] && q->master[u] && q->adam_m[u] && q->adam_v[u] &&
             real_gpt_init_params(&q->dims, 7, u, host, error);
        if (ok) {
            float *wide = g_new(float, n);
            for (size_t i = 0; i < n; i++)
                wide[i] = real_bf16_to_f32(host[i]);
            be->copy(be, q->params[u], host, n * sizeof(RealBf16));
            be->copy(be, q->master[u], wide, n * sizeof(float));
            memset(host, 0, n * sizeof(RealBf16));
            be->copy(be, q->grads[u], host, n * sizeof(RealBf16));
            be->fill(be, q->adam_m[u], 0, n * sizeof(float));
            be->fill(be, q->adam_v[u], 0, n * sizeof(float));
            g_free(wide);
        }
        g_free(host);
    }
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
    for (int u = 0; q->params && u < q->n_units; u++) {
        q->be->free(q->be, q->params[u]);
        q->be->free(q->be, q->grads[u]);
        q->be->free(q->be, q->master[u]);
        q->be->free(q->be, q->adam_m[u]);
        q->be->free(q->be, q->adam_v[u]);
    }
    for (int l = 0; q->x && l <= q->dims.layers; l++)
        q->be->free(q->be, q->x[l]);
    q->be->free(q->be, q->scratch);
    q->be->free(q->be, q->dx);
    g_free(q->params), g_free(q->grads), g_free(q->x);
    g_free(q->master), g_free(q->adam_m), g_free(q->adam_v);
    g_free(q->tokens), g_free(q->targets);
    real_gpt_free(q->gpt);
    for (int k = 0; k < ZP_COMP_N; k++)
        g_array_unref(q->times[k]);
}

gboolean real_opseq_run(RealBackend *be, RealComm *comm, const ZpModel *model,
                        const ZpPlan *plan, void *root, GError **error)
{
    if (plan->mp > 1)
        return TRUE;
    Seq q = {.be = be, .dims = real_engine_dims(model, plan)};
    for (int k = 0; k < ZP_COMP_N; k++)
        q.times[k] = g_array_new(FALSE, FALSE, sizeof(double));
    q.n_units = real_gpt_n_units(&q.dims);
    gboolean ok = real_gpt_dims_check(&q.dims, error) &&
                  real_gpt_check_backend(be, &q.dims, error) &&
                  (q.gpt = real_gpt_new(be, &q.dims, error)) != NULL && allocate(&q, error);
    json_t *out = json_array();
    for (int checkpoint = 0; ok && checkpoint < 2; checkpoint++) {
        ZpPlan mode = *plan;
        mode.checkpoint = checkpoint;
        for (int s = 0; ok && s <= TIMED_STEPS; s++)
            ok = step(&q, comm, checkpoint, s > 0, error);
        if (ok)
            rows(&q, model, &mode, out);
    }
    release(&q);
    if (!ok) {
        json_decref(out);
        g_prefix_error(error, "op sequence (%s): ", model->name);
        return FALSE;
    }
    json_object_set_new(root, "op_sequence", out);
    return TRUE;
}
