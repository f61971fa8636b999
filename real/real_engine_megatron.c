/* real_engine_megatron: the engine's plug-in for Megatron-Core's data parallelism (zp_impl_
 * megatron.c's schedule): param_data and main_grad as one contiguous buffer each, the
 * parameters in reverse and padded, buckets reduced in place, the distributed optimizer's
 * shard of every bucket, its in-place all-gather of the updated shards bucket by bucket. */
#include "real_engine_fw.h"

#include "real_offload.h"
#include "zp_impl.h"
#include "zp_mem.h"

#include <string.h>

typedef struct {
    const ZpBucketSpec *spec;
    uint64_t start, elems; /* its padded range in the buffer */
    uint64_t gather_at;    /* the schedule's offset of its all-gather (forward order) */
} Bucket;

/* One range the optimizer steps: a parameter's elements within this rank's shard of its
 * bucket (distrib_optimizer.py's param_range; every parameter whole at stage 0), at buffer
 * element `at`, `elems` long, its fp32 states at master_at. */
typedef struct {
    uint64_t at, elems, master_at;
} Piece;

typedef struct {
    RealFwEnv env;
    int rank, dp, stage;
    RealFwTensors tensors;
    uint64_t *t_start; /* each tensor's start in the buffers */
    GArray *specs;     /* ZpBucketSpec in buffer order */
    Bucket *bk;
    guint n_bk;
    Piece *pieces;
    guint n_pieces;
    uint64_t numel, opt_elems;
    /* distributed_data_parallel.py / param_and_grad_buffer.py: param_data and main_grad
     * (the model states params and grads, in the buffer's layout; main_grad of grad_bytes
     * an element: 4 with grad_reduce_in_fp32, else 2), and the optimizer's fp32 states: all
     * parameters (stage 0) or this rank's shard of each bucket. */
    RealBf16 *params;
    void *grads;
    gsize grad_bytes;
    float *master, *adam_m, *adam_v;
} Mg;

static gboolean mg_applies(const ZpSchedule *s)
{
    return s->plan.impl == ZP_IMPL_MEGATRON;
}

/* The shard of bucket b this rank steps: 1/dp of its padded range (distrib_optimizer.py
 * _build_model_gbuf_range: gbuf_world_range of the bucket), the whole bucket at stage 0. */
static uint64_t shard_elems(const Mg *mg, const Bucket *b)
{
    return mg->stage == 1 ? b->elems / (uint64_t)mg->dp : b->elems;
}

static uint64_t shard_start(const Mg *mg, const Bucket *b)
{
    return b->start + (mg->stage == 1 ? (uint64_t)mg->rank * shard_elems(mg, b) : 0);
}

static void mg_destroy(void *data)
{
    Mg *mg = data;
    if (!mg)
        return;
    RealBackend *be = mg->env.be;
    void *states[] = {mg->params, mg->grads, mg->master, mg->adam_m, mg->adam_v};
    for (size_t i = 0; i < G_N_ELEMENTS(states); i++)
        be->free(be, states[i]);
    real_engine_fw_tensors_clear(&mg->tensors);
    if (mg->specs)
        g_array_unref(mg->specs);
    g_free(mg->t_start);
    g_free(mg->bk);
    g_free(mg->pieces);
    g_free(mg);
}

/* The buckets in buffer order (backward's), their padded ranges one after another, the
 * shards' places in the states, and their all-gathers' offsets, which the schedule counts
 * in forward order (zp_build_optimizer.c issue_param_gather). */
static void index_buckets(Mg *mg)
{
    mg->n_bk = mg->specs->len;
    mg->bk = g_new0(Bucket, MAX(mg->n_bk, 1));
    uint64_t start = 0;
    for (guint i = 0; i < mg->n_bk; i++) {
        Bucket *b = &mg->bk[i];
        b->spec = &g_array_index(mg->specs, ZpBucketSpec, i);
        b->start = start;
        b->elems = b->spec->padded_elems;
        start += b->elems;
    }
    uint64_t at = 0;
    for (guint i = mg->n_bk; i-- > 0;) {
        mg->bk[i].gather_at = at;
        at += mg->bk[i].elems / (uint64_t)mg->dp;
    }
}

/* distrib_optimizer.py _build_model_gbuf_param_range_map: each parameter's range clipped
 * to this rank's shard of its bucket, one fp32 main parameter (and Adam's moments) per
 * nonempty piece, in buffer order; the padding has none (zp_impl_megatron.c
 * mg_rank_opt_elems counts the same). */
static void index_pieces(Mg *mg)
{
    mg->pieces = g_new0(Piece, MAX(mg->tensors.n_t, 1));
    uint64_t master = 0;
    guint k = 0;
    for (int i = (int)mg->tensors.n_t - 1; i >= 0; i--) { /* the buffer's order */
        const uint64_t lo = mg->t_start[i], hi = lo + mg->tensors.t[i].elems;
        while (k + 1 < mg->n_bk && lo >= mg->bk[k].start + mg->bk[k].elems)
            k++;
        const uint64_t from = shard_start(mg, &mg->bk[k]);
        const uint64_t a = MAX(lo, from), b = MIN(hi, from + shard_elems(mg, &mg->bk[k]));
        if (a >= b)
            continue;
        mg->pieces[mg->n_pieces++] = (Piece){a, b - a, master};
        master += b - a;
    }
    mg->opt_elems = master;
}

/* main_grad at element `at`. */
static void *grad_at(const Mg *mg, uint64_t at)
{
    return (char *)mg->grads + at * mg->grad_bytes;
}

static void *take(Mg *mg, uint64_t bytes, ZpMemCategory cat, GError **error)
{
    void *p = real_engine_alloc(mg->env.be, mg->env.comm->rank, bytes, cat, error);
    if (p)
        mg->env.be->fill(mg->env.be, p, 0, bytes);
    return p;
}

static void *mg_create(const RealFwEnv *env, GError **error)
{
    const ZpSchedule *s = env->s;
    Mg *mg = g_new0(Mg, 1);
    mg->env = *env;
    mg->rank = env->comm->rank, mg->dp = s->plan.dp, mg->stage = s->plan.zero.stage;
    if (!real_engine_fw_tensors(s, &mg->tensors, error)) {
        mg_destroy(mg);
        return NULL;
    }
    mg->t_start = g_new0(uint64_t, MAX(mg->tensors.n_t, 1));
    mg->specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    mg->numel = zp_impl_megatron_layout(s, mg->specs, mg->t_start);
    index_buckets(mg);
    index_pieces(mg);
    /* The schedule's states: param_data (stage 1; the parameters at stage 0) and main_grad
     * of the buffer's numel, the fp32 states of the shard (zp_build_layout.c). */
    const size_t b2 = sizeof(RealBf16), f4 = sizeof(float);
    const uint64_t param_elems = mg->stage == 1 ? s->padded_elems : s->total_elems;
    const uint64_t opt = zp_impl_opt_elems(s, mg->rank);
    mg->grad_bytes = (gsize)(s->state_bytes[ZP_MEM_GRADS] / (double)MAX(mg->numel, 1));
    if (param_elems != mg->numel || opt != mg->opt_elems ||
        s->state_bytes[ZP_MEM_GRADS] != (double)(mg->numel * mg->grad_bytes) ||
        (mg->grad_bytes != 2 && mg->grad_bytes != 4)) {
        real_engine_fail(error, "Megatron's buffers hold %" G_GUINT64_FORMAT " elements, a "
                         "shard %" G_GUINT64_FORMAT "; the schedule has %" G_GUINT64_FORMAT ", %"
                         G_GUINT64_FORMAT " and %.0f bytes of main_grad", mg->numel,
                         mg->opt_elems, param_elems, opt, s->state_bytes[ZP_MEM_GRADS]);
        mg_destroy(mg);
        return NULL;
    }
    /* grad_reduce_in_fp32: fp32 sums, and Adam reading fp32 gradients (the CPU's) */
    const gboolean f32 = mg->grad_bytes == 4;
    if (f32 && (!env->comm->allreduce_f32 || !env->comm->reduce_scatter_f32 ||
                strcmp(env->be->name, "cpu") != 0)) {
        real_engine_fail(error, "zreal keeps Megatron's main_grad in fp32 (grad_reduce_in_fp32) "
                         "on the CPU backend over MPI ranks; here run with --reduce-dtype bf16");
        mg_destroy(mg);
        return NULL;
    }
    real_gpt_set_grads_f32(env->gpt, f32);
    if (!(mg->params = take(mg, mg->numel * b2, ZP_MEM_PARAMS, error)) ||
        !(mg->grads = take(mg, mg->numel * mg->grad_bytes, ZP_MEM_GRADS, error)) ||
        !(mg->master = take(mg, mg->opt_elems * f4, ZP_MEM_MASTER, error)) ||
        !(mg->adam_m = take(mg, mg->opt_elems * f4, ZP_MEM_ADAM_M, error)) ||
        !(mg->adam_v = take(mg, mg->opt_elems * f4, ZP_MEM_ADAM_V, error))) {
        mg_destroy(mg);
        return NULL;
    }
    return mg;
}

/* Every tensor whole into param_data (the padding stays zero), and the fp32 main params of
 * the shard from them (distrib_optimizer.py _build_model_and_main_param_groups:
 * shard_model_param.clone().float()). */
static gboolean mg_init_params(void *data, RealFwInitFn init, void *engine, GError **error)
{
    Mg *mg = data;
    const ZpSchedule *s = mg->env.s;
    for (guint i = 0; i < mg->tensors.n_t; i++) {
        const ZpImplTensor *t = &mg->tensors.t[i];
        if (!init(engine, t->unit, t->offset - s->unit_offset[t->unit], t->elems,
                  mg->params + mg->t_start[i], error))
            return FALSE;
    }
    for (guint i = 0; i < mg->n_pieces; i++) {
        const Piece *q = &mg->pieces[i];
        mg->env.be->bf16_to_f32(mg->env.be, mg->master + q->master_at, mg->params + q->at,
                                q->elems);
    }
    return TRUE;
}

/* distributed_data_parallel.py zero_grad_buffer zeroes main_grad as each step begins; the
 * same as every tensor's first write storing its gradient (the padding stays zero). */
static void mg_start_step(void *data)
{
    Mg *mg = data;
    real_gpt_grads_fresh(mg->env.gpt, -1, UINT32_MAX);
}

/* Unit u's tensors in a buffer of `elem` bytes an element (main_grad's fp32 views are
 * handed on as such: real_gpt_set_grads_f32). */
static gboolean view(const Mg *mg, void *base, gsize elem, int u, RealGptTensors *out,
                     GError **error)
{
    const guint first = mg->tensors.unit_first[u], last = mg->tensors.unit_first[u + 1];
    if (last == first)
        return real_engine_fail(error, "unit %d has no tensors here", u);
    *out = (RealGptTensors){0};
    for (guint i = first; i < last; i++)
        out->at[i - first] = (RealBf16 *)(void *)((char *)base + mg->t_start[i] * elem);
    return TRUE;
}

static gboolean mg_params(void *data, int unit, RealGptTensors *out, GError **error)
{
    Mg *mg = data;
    return view(mg, mg->params, sizeof(RealBf16), unit, out, error);
}

/* Backward adds each gradient into its main_grad view (the backward hook's
 * param.main_grad.add_(param.grad), or the fused wgrad GEMM's accumulation). */
static gboolean mg_grads(void *data, int unit, int micro, RealGptTensors *out, GError **error)
{
    (void)micro;
    Mg *mg = data;
    return view(mg, mg->grads, mg->grad_bytes, unit, out, error);
}

/* The step's fp32 copy of the gradients it steps (zp_impl_megatron.c mg_step_buffers:
 * _copy_model_grads_to_main_grads .float() of a 16-bit main_grad): piece by piece, in a
 * buffer of the most any rank steps (the schedule's one size for every rank). The
 * optimizer reads the same values from main_grad (the backend's Adam widens them as the
 * copy does). */
static gboolean mg_alloc(void *data, const ZpOp *op, gboolean *handled, GError **error)
{
    Mg *mg = data;
    *handled = op->sub == ZP_MEM_WORKSPACE && op->unit == -1 && op->micro == -1;
    if (!*handled)
        return TRUE;
    const uint64_t most = zp_impl_opt_elems(mg->env.s, -1);
    if (op->bytes != (double)(most * sizeof(float)) || mg->opt_elems > most)
        return real_engine_fail(error, "the step's fp32 gradients: %.0f bytes, the most a "
                                "rank steps is %" G_GUINT64_FORMAT " (this one %"
                                G_GUINT64_FORMAT ")", op->bytes,
                                most * (uint64_t)sizeof(float),
                                mg->opt_elems * (uint64_t)sizeof(float));
    float *copy = take(mg, (uint64_t)op->bytes, ZP_MEM_WORKSPACE, error);
    if (!copy)
        return FALSE;
    mg->env.buffers[op->buffer] = copy;
    for (guint i = 0; i < mg->n_pieces; i++) {
        const Piece *q = &mg->pieces[i];
        mg->env.be->bf16_to_f32(mg->env.be, copy + q->master_at, grad_at(mg, q->at), q->elems);
    }
    return TRUE;
}

/* The bucket a reduction or an all-gather op names. */
static const Bucket *bucket_of(const Mg *mg, const ZpOp *op, GError **error)
{
    const gboolean gather = op->sub == ZP_COLL_ALLGATHER;
    for (guint i = 0; i < mg->n_bk; i++) {
        const Bucket *b = &mg->bk[i];
        if (gather ? b->gather_at == op->elem_offset && b->elems == op->elems
                   : b->spec->lo == op->elem_offset && b->spec->hi - b->spec->lo == op->elems)
            return b;
    }
    real_engine_fail(error, "no Megatron bucket at offset %" G_GUINT64_FORMAT " of %"
                     G_GUINT64_FORMAT " elements", op->elem_offset, op->elems);
    return NULL;
}

/* param_and_grad_buffer.py _ParamAndGradBucketGroup.start_grad_sync: each bucket's
 * grad_data all-reduced in place (DDP), or reduce-scattered into this rank's shard of it
 * (reduce_scatter_tensor(local_data_view, bucket.grad_data)); start_param_sync: the
 * updated shard of param_data all-gathered into the bucket in place
 * (all_gather_into_tensor(bucket.param_data, local_data_view)). */
static gboolean mg_collective(void *data, const ZpOp *op, GError **error)
{
    Mg *mg = data;
    RealComm *c = mg->env.comm;
    const Bucket *b = bucket_of(mg, op, error);
    if (!b)
        return FALSE;
    const uint64_t n = b->elems / (uint64_t)mg->dp;
    switch ((ZpCollKind)op->sub) {
    case ZP_COLL_ALLREDUCE:
        return mg->grad_bytes == 4 ? c->allreduce_f32(c, grad_at(mg, b->start), b->elems, error)
                                   : c->allreduce_bf16(c, grad_at(mg, b->start), b->elems, error);
    case ZP_COLL_REDUCE_SCATTER: {
        int *counts = g_new(int, mg->dp);
        for (int q = 0; q < mg->dp; q++)
            counts[q] = (int)n;
        void *bucket = grad_at(mg, b->start);
        const gboolean ok = mg->grad_bytes == 4 ? c->reduce_scatter_f32(c, bucket, counts, error)
                                                : c->reduce_scatter_bf16(c, bucket, counts, error);
        g_free(counts);
        if (ok && mg->rank > 0) /* the sum lands at the bucket's head: into the shard's view */
            mg->env.be->copy(mg->env.be, grad_at(mg, shard_start(mg, b)), bucket,
                             n * mg->grad_bytes);
        return ok;
    }
    case ZP_COLL_ALLGATHER:
        return c->allgather_bf16(c, mg->params + shard_start(mg, b), n, mg->params + b->start,
                                 error);
    default:
        return real_engine_fail(error, "Megatron's data parallelism has no %s",
                                zp_sched_coll_name((ZpCollKind)op->sub));
    }
}

/* Adam on what this rank steps, piece by piece (a parameter's range in the rank's shard:
 * the padding between is not stepped), writing the updated 16-bit parameters into param_data
 * (_copy_main_params_to_model_params); an fp32 main_grad is the main parameters' .grad
 * itself (optimizer.py _copy_model_grads_to_main_grads: .float() of an fp32 tensor). */
static gboolean mg_optimizer(void *data, const RealAdamHyper *hyper, GError **error)
{
    (void)error;
    Mg *mg = data;
    for (guint i = 0; i < mg->n_pieces; i++) {
        const Piece *q = &mg->pieces[i];
        const uint64_t at = q->master_at, from = q->at;
        if (mg->grad_bytes == 4)
            real_offload_cpu_adam(hyper, q->elems, mg->master + at, mg->adam_m + at,
                                  mg->adam_v + at, grad_at(mg, from), mg->params + from);
        else
            mg->env.be->adam_step(mg->env.be, hyper, q->elems, mg->master + at,
                                  mg->adam_m + at, mg->adam_v + at, grad_at(mg, from),
                                  mg->params + from);
    }
    return TRUE;
}

const RealFwOps real_fw_megatron = {
    .name = "megatron",
    .applies = mg_applies,
    .create = mg_create,
    .destroy = mg_destroy,
    .init_params = mg_init_params,
    .start_step = mg_start_step,
    .params = mg_params,
    .grads = mg_grads,
    .alloc = mg_alloc,
    .collective = mg_collective,
    .optimizer = mg_optimizer,
};
