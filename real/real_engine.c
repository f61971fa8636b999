/* real_engine: executes the schedule op by op. Everything a stage decides — what is
 * partitioned, when buckets are reduced, what is gathered and freed — comes from the ops;
 * the engine only maps each op onto model calls, backend buffers and collectives. */
#include "real_engine.h"
#include "real_engine_ds.h"
#include "real_offload.h"
#include "zp_impl.h"
#include "zp_offload.h"
#include "real_data.h"
#include "real_gpt.h"
#include "real_pipe.h"
#include "real_zeropp.h"
#include "real_zeror.h"
#include "zp_zeropp.h"
#include "zp_zeror.h"
#include "zp_mem.h"
#include "zp_util.h"

#include <string.h>

G_DEFINE_QUARK(real-engine-error-quark, real_engine_error)

G_STATIC_ASSERT((int)REAL_MEM_N_CATEGORIES == (int)ZP_MEM_N);
G_STATIC_ASSERT((int)REAL_GPT_NO_BIAS_QKV == (int)ZP_NO_BIAS_QKV &&
                (int)REAL_GPT_NO_BIAS_PROJ == (int)ZP_NO_BIAS_PROJ &&
                (int)REAL_GPT_NO_BIAS_MLP == (int)ZP_NO_BIAS_MLP);

struct RealEngine {
    const ZpSchedule *s;
    RealBackend *be;
    RealComm *comm;
    RealGpt *gpt;
    RealGptDims dims;
    RealTrainConfig cfg;
    int stage, dp, rank, L;
    uint64_t step;
    int64_t adam_step;

    /* Model states, laid out as zp_sched's layout() says. */
    RealBf16 *params, *grads;
    float *master, *adam_m, *adam_v;
    uint64_t opt_elems;   /* elements of the optimizer partition */
    uint64_t part_base;   /* stages 1-2: offset of this rank's partition in params/grads */
    uint64_t *part_off;   /* stage 3: offset of unit u's slice in the partition arrays */
    RealBf16 **persistent; /* stage 3: full copies of persistent units */

    /* Buffers by schedule id, and the flat range a bucket id covers. */
    void **buffers;
    uint64_t *bucket_lo, *bucket_hi;
    int n_buffers;
    int *ckpt_buffer;       /* per (micro-step, unit): its checkpoint buffer id (slot()) */
    int *ckpt_slice;        /* Pa at mp > 1: per (micro-step, unit) the id of the GPU buffer
                             * holding this rank's slice from forward to the gather */
    uint64_t ckpt_slice_off, ckpt_slice_bytes; /* this rank's slice of a block input: at
                             * tp_rank x 2bsh/M with Pa at mp > 1, the whole input at 0 else */
    void **stash;           /* per (micro-step, unit): a block's saved activations from its
                             * forward to its backward (without checkpointing) */
    float **head_dx;        /* per micro-step: a pipeline's head output gradient kept until
                             * the micro-step's backward, when other forwards come first */
    RealBf16 **unit_params; /* where each unit's full parameters are now */
    RealBf16 **unit_grads;  /* where backward accumulates each unit's gradients */

    /* ZeRO++ (qwZ, hpZ): hpZ's node communicator and secondary partitions per unit; per
     * gathered buffer id, qwZ's int8 buffer id and the gather's group, from the quantize op
     * to the dequantize op (a unit may have two gathers in flight). */
    RealComm *hpz_comm;
    RealBf16 **secondary;
    int *quant_of, *quant_group;
    RealComm *qgz_node, *qgz_cross; /* qgZ: the node's ranks; this node index's, a node each */
    int qgz_work;                   /* qgZ: the bucket's int4 workspace buffer id */

    RealBf16 *x;  /* residual stream [b s, h] */
    float *dx;    /* its gradient */
    int *tokens, *targets;
    double loss_sum;
    RealOpTiming timing[REAL_ENGINE_N_OP_TYPES];
    GArray *marks; /* this step's device-timed ops (PendingMark), resolved at its end */
    double model_state_bytes;
    RealOffload *offload; /* the host and NVMe tiers, with offload */
    gboolean host_grads;  /* stages 2-3 with optimizer offload: no gradient partition here */
    gboolean host_params; /* stage 3 with parameter offload: the partition is off the GPU */
    RealDs *ds;           /* DeepSpeed's stages 2-3 (real_engine_ds): its gradients, gathers */
    /* Stage 1 whose full gradients the schedule takes and frees unit by unit (zp_impl.h
     * full_grads_transient; unit_grads while taken): full_by_unit, and the buffer id of
     * grads_in_partition, which the reductions copy this rank's partition into, from flat
     * offset gip_lo (the first tensor overlapping the partition), -1 none. */
    gboolean full_by_unit;
    int gip_id;
    uint64_t gip_lo;
    RealCkptHost *ckpt_host; /* the checkpoints' host tier, with cpu_checkpointing */
};

/* One op timed on the backend's device clock: read after the step's last op, so that
 * timing does not make the host wait for the device op by op. */
typedef struct {
    int type;
    void *begin, *end;
} PendingMark;

gboolean real_engine_fail(GError **error, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    char *message = g_strdup_vprintf(format, args);
    va_end(args);
    g_set_error_literal(error, REAL_ENGINE_ERROR, 0, message);
    g_free(message);
    return FALSE;
}
#define fail real_engine_fail

/* Sets of a unit's tensors, bit k for tensor k. */
#define ALL_TENSORS UINT32_MAX
#define WTE_ONLY 1u /* a tied LM head's use of the embeddings */

static uint64_t unit_padded(const RealEngine *e, int u)
{
    return zp_mem_padded_elems(e->s->unit_elems[u], (uint64_t)e->dp);
}

/* The index of unit u in micro-step `micro` of a per-(micro-step, unit) array: a pipeline
 * stage has several micro-steps between their forwards and backwards. */
static gsize slot(const RealEngine *e, int u, int micro)
{
    return (gsize)micro * (gsize)(e->L + 2) + (gsize)u;
}

static gboolean is_persistent(const RealEngine *e, int u)
{
    return zp_sched_unit_persistent(e->s, u);
}

void *real_engine_alloc(RealBackend *be, int rank, uint64_t bytes, ZpMemCategory cat,
                        GError **error)
{
    void *p = be->alloc(be, bytes, (RealMemCategory)cat);
    if (!p)
        fail(error, "rank %d: out of memory allocating %" G_GUINT64_FORMAT " bytes of %s",
             rank, bytes, zp_sched_mem_name(cat));
    return p;
}

static void *take(RealEngine *e, uint64_t bytes, ZpMemCategory cat, GError **error)
{
    return real_engine_alloc(e->be, e->rank, bytes, cat, error);
}

/* ---- set-up ------------------------------------------------------------------------------ */

static gboolean check_schedule(const ZpSchedule *s, const RealTrainConfig *cfg, GError **error)
{
    if (s->plan.mp != (cfg->tp ? real_tp_size(cfg->tp) : 1))
        return fail(error, "the schedule's tensor-parallel degree is %d, the tensor group's %d "
                    "(zreal --mp)", s->plan.mp, cfg->tp ? real_tp_size(cfg->tp) : 1);
    if (s->plan.sequence_parallel)
        return fail(error, "zreal executes tensor parallelism without sequence parallelism");
    if (s->plan.precision == ZP_PREC_FP32 || s->plan.optimizer != ZP_OPT_ADAM)
        return fail(error, "zreal trains with 16-bit storage and Adam (plan has %s, %s)",
                    zp_precision_name(s->plan.precision), zp_optimizer_name(s->plan.optimizer));
    if (s->model.dropout)
        return fail(error, "zreal's GPT trains without dropout; the schedule's model %s has it "
                           "(build it with zplan schedule --no-dropout)", s->model.name);
    /* Positions come from a learned table or from rotary embeddings, one of the two: the
     * blocks real_gpt trains (real_gpt_dims_check refuses what else it cannot run). */
    const ZpModel *m = &s->model;
    if (m->learned_positions == (m->rope_theta > 0))
        return fail(error, "zreal trains models with learned positions or rotary embeddings, "
                           "one of the two; %s has %s", m->name,
                    m->learned_positions ? "both" : "neither");
    if (m->rope_scaling.type == ZP_ROPE_SCALING_OTHER)
        return fail(error, "zreal rescales rotary embeddings linearly or as Llama 3.1 does "
                           "(\"linear\", \"llama3\"), not \"%s\" as %s does",
                    m->rope_scaling.name, m->name);
    if (real_ds_applies(s) && s->plan.zero.zero_quantized_gradients && zp_offload_any(&s->plan))
        return fail(error, "zreal executes DeepSpeed's qgZ (zero_quantized_gradients) without "
                           "offload");
    if (s->plan.reduce_dtype != ZP_REDUCE_GRAD && s->plan.reduce_dtype != ZP_REDUCE_BF16)
        return fail(error, "zreal reduces gradients in bf16, their own dtype; the plan says %s",
                    zp_reduce_dtype_name(s->plan.reduce_dtype));
    return TRUE;
}

/* A stage view with its pipe, or no pipeline; what zreal's stages do not execute. */
static gboolean check_pipeline(const ZpSchedule *s, const RealTrainConfig *cfg, GError **error)
{
    if ((s->stages > 1) != (cfg->pipe != NULL) ||
        (cfg->pipe && real_pipe_stage(cfg->pipe) != s->view_stage))
        return fail(error, "a pipeline schedule runs as a stage's view with its pipe "
                           "(zp_sched_stage_view, real_pipe_new)");
    if (s->stages == 1)
        return TRUE;
    if (zp_offload_any(&s->plan) || s->plan.zero.zero_quantized_weights ||
        s->plan.zero.zero_hpz_partition_size > 1)
        return fail(error, "zreal runs pipelines without optimizer offload or ZeRO++");
    return TRUE;
}

RealGptDims real_engine_dims(const ZpModel *m, const ZpPlan *plan)
{
    RealGptDims d = real_gpt_dims_make((int)m->layers, (int)m->hidden, (int)m->heads,
                                       (int)m->seq_len, (int)m->vocab, plan->micro_batch);
    d.ffn_hidden = (int)m->ffn_hidden;
    d.kv_heads = (int)zp_model_kv_heads(m);
    d.swiglu = m->mlp == ZP_MLP_SWIGLU;
    d.geglu = m->mlp == ZP_MLP_GEGLU;
    d.exact_gelu = m->exact_gelu;
    d.rmsnorm = m->norm == ZP_NORM_RMSNORM;
    d.untied = !m->tied_embeddings;
    d.no_bias = m->no_bias; /* the same flags (real_gpt.h) */
    d.parallel_residual = m->parallel_residual;
    d.rope_theta = (float)m->rope_theta;
    d.rotary_fraction = (float)m->rotary_fraction;
    const ZpRopeScaling *r = &m->rope_scaling;
    d.rope_scaling = r->type == ZP_ROPE_SCALING_LINEAR   ? REAL_ROPE_SCALING_LINEAR
                     : r->type == ZP_ROPE_SCALING_LLAMA3 ? REAL_ROPE_SCALING_LLAMA3
                                                         : REAL_ROPE_SCALING_NONE;
    d.rope_factor = (float)r->factor;
    d.rope_low_freq_factor = (float)r->low_freq_factor;
    d.rope_high_freq_factor = (float)r->high_freq_factor;
    d.rope_original_positions = (int)r->original_max_positions; /* <= 10^7: zp_model's bound */
    d.positions = m->learned_positions ? (int)zp_model_positions(m) : 0;
    d.norm_eps = (float)m->norm_eps;
    d.attention_window = (int)MIN(m->sliding_window, (int64_t)m->seq_len);
    d.flash = zp_attention_fused(plan->attention);
    d.tp = plan->mp;
    return d;
}

static gboolean allocate_states(RealEngine *e, GError **error)
{
    const ZpSchedule *s = e->s;
    const uint64_t total = s->total_elems, padded = s->padded_elems, part = s->partition_elems;
    const uint64_t params_elems[4] = {total, padded, padded, part};
    const uint64_t grads_elems[4] = {total, padded, part, part};
    e->opt_elems = e->stage == 0 ? total : part;
    e->part_base = (e->stage == 1 || e->stage == 2) ? (uint64_t)e->rank * part : 0;
    const size_t b2 = sizeof(RealBf16), f4 = sizeof(float);
    /* With offload the optimizer states (and at stages 2-3 the gradient partition, at stage
     * 3 with offload_param the 16-bit partition) live in real_offload's tiers. */
    if (zp_offload_any(&s->plan) &&
        !(e->offload = real_offload_new(s, e->be, e->rank, e->opt_elems, error)))
        return FALSE;
    e->host_grads = e->offload && e->stage >= 2;
    e->host_params = e->offload && zp_offload_param_tier(&s->plan) != ZP_TIER_GPU;
    if (e->host_params)
        e->params = real_offload_param_init_buffer(e->offload);
    else if (!(e->params = take(e, params_elems[e->stage] * b2, ZP_MEM_PARAMS, error)))
        return FALSE;
    if (!e->params)
        return fail(error, "rank %d: no host memory for the 16-bit partition", e->rank);
    if (real_ds_applies(s)) /* the plug-in holds the gradients as DeepSpeed lays them out */
        e->ds = real_ds_new(s, e->be, e->comm, e->buffers, e->params, error);
    else if (!e->host_grads && !e->full_by_unit) /* else taken by the schedule */
        e->grads = take(e, grads_elems[e->stage] * b2, ZP_MEM_GRADS, error);
    if (!e->ds && !e->grads && !e->host_grads && !e->full_by_unit)
        return FALSE;
    if (!e->offload && (!(e->master = take(e, e->opt_elems * f4, ZP_MEM_MASTER, error)) ||
                        !(e->adam_m = take(e, e->opt_elems * f4, ZP_MEM_ADAM_M, error)) ||
                        !(e->adam_v = take(e, e->opt_elems * f4, ZP_MEM_ADAM_V, error))))
        return FALSE;
    e->be->fill(e->be, e->params, 0, params_elems[e->stage] * b2);
    if (e->grads) /* once: the padding no write reaches (start_step) */
        e->be->fill(e->be, e->grads, 0, grads_elems[e->stage] * b2);
    if (!e->offload) {
        e->be->fill(e->be, e->adam_m, 0, e->opt_elems * f4);
        e->be->fill(e->be, e->adam_v, 0, e->opt_elems * f4);
    }
    for (int u = 0, off = 0; u < s->n_units; u++) {
        e->part_off[u] = (uint64_t)off;
        off += (int)(unit_padded(e, u) / (uint64_t)e->dp);
        if (is_persistent(e, u) &&
            !(e->persistent[u] = take(e, unit_padded(e, u) * b2, ZP_MEM_GATHERED_PARAMS, error)))
            return FALSE;
    }
    return TRUE;
}

/* qwZ and hpZ run on host memory over a communicator that has the byte all-gather and
 * the split they need (MPI's); hpZ's group is zero_hpz_partition_size consecutive ranks
 * (DeepSpeed's _create_zero_param_parallel_group), each keeping a 1/size slice of every
 * non-persistent unit from its forward gather. */
static gboolean setup_zeropp(RealEngine *e, GError **error)
{
    const ZpZeroConfig *z = &e->s->plan.zero;
    const int hpz = z->zero_hpz_partition_size;
    e->secondary = g_new0(RealBf16 *, e->s->n_units);
    e->quant_of = g_new(int, MAX(e->n_buffers, 1));
    e->quant_group = g_new0(int, MAX(e->n_buffers, 1));
    for (int i = 0; i < e->n_buffers; i++)
        e->quant_of[i] = -1;
    if (!z->zero_quantized_weights && hpz <= 1 && !z->zero_quantized_gradients)
        return TRUE;
    if (strcmp(e->be->name, "cpu") != 0)
        return fail(error, "zreal executes ZeRO++ on the CPU backend, not %s", e->be->name);
    if (!e->comm->allgather_bytes || !e->comm->alltoall_bytes || !e->comm->split)
        return fail(error, "zreal executes ZeRO++ over MPI ranks (mpirun), not --emulate");
    if (hpz > 1 && !(e->hpz_comm = e->comm->split(e->comm, e->rank / hpz, e->rank % hpz, error)))
        return FALSE;
    /* qgZ's groups: a node's consecutive ranks, and the ranks of one node index */
    const int local = zp_zeropp_group_ranks(&e->s->plan, ZP_GROUP_NODE);
    if (z->zero_quantized_gradients &&
        (!(e->qgz_node = e->comm->split(e->comm, e->rank / local, e->rank % local, error)) ||
         !(e->qgz_cross = e->comm->split(e->comm, e->rank % local, e->rank / local, error))))
        return FALSE;
    if (e->ds && hpz > 1) /* DeepSpeed's secondary partition is per tensor */
        return real_ds_hpz(e->ds, e->hpz_comm, error);
    for (int u = 0; hpz > 1 && u < e->s->n_units; u++)
        if (!is_persistent(e, u) &&
            !(e->secondary[u] = take(e, unit_padded(e, u) / (uint64_t)hpz * sizeof(RealBf16),
                                     ZP_MEM_SECONDARY_PARAMS, error)))
            return FALSE;
    return TRUE;
}

/* Units are drawn from the seed as the whole model would be, each rank drawing only what its
 * layout holds: a ZeRO-3 rank draws its slice of each unit (and persistent units whole), so
 * setting up one rank of a 64-way 7.5B model draws 1/64 of the model, not all of it. Every
 * element is a function of (seed, unit, index), so the draw is split over the machine's
 * cores (a rank per GPU has a host of cores idle): GPT-2 1.5B's 1.5e9 normal draws take
 * tens of seconds on one core. */
#define INIT_CHUNK_ELEMS ((uint64_t)1 << 22)

typedef struct {
    const RealGptDims *dims;
    uint64_t seed, first, count;
    int unit;
    RealBf16 *out;
    gboolean ok;
    GError *error;
} InitChunk;

static gpointer init_chunk(gpointer data)
{
    InitChunk *c = data;
    c->ok = real_gpt_init_params_range(c->dims, c->seed, c->unit, c->first, c->count, c->out,
                                       &c->error);
    return NULL;
}

/* host[0..count) = elements first.. of unit u, drawn by up to one thread per core. */
static gboolean init_host(RealEngine *e, int u, uint64_t first, uint64_t count, RealBf16 *host,
                          GError **error)
{
    const uint64_t chunks = MAX((uint64_t)1, (count + INIT_CHUNK_ELEMS - 1) / INIT_CHUNK_ELEMS);
    const uint64_t threads = MIN(chunks, (uint64_t)g_get_num_processors());
    const uint64_t per = (count + threads - 1) / threads;
    InitChunk *c = g_new0(InitChunk, threads);
    GThread **t = g_new0(GThread *, threads);
    for (uint64_t i = 0; i < threads; i++) {
        const uint64_t lo = MIN(count, i * per);
        c[i] = (InitChunk){&e->dims, e->cfg.seed, first + lo, MIN(per, count - lo), u,
                           host + lo, FALSE, NULL};
        if (i > 0)
            t[i] = g_thread_new("zreal-init", init_chunk, &c[i]);
    }
    init_chunk(&c[0]);
    gboolean ok = TRUE;
    for (uint64_t i = 0; i < threads; i++) {
        if (t[i])
            g_thread_join(t[i]);
        if (ok && !c[i].ok) {
            g_propagate_error(error, c[i].error);
            c[i].error = NULL;
            ok = FALSE;
        }
        g_clear_error(&c[i].error);
    }
    g_free(c);
    g_free(t);
    return ok;
}

static gboolean init_unit(RealEngine *e, int u, uint64_t first, uint64_t count, RealBf16 *dst,
                          GError **error)
{
    RealBf16 *host = g_new(RealBf16, count);
    gboolean ok = init_host(e, u, first, count, host, error);
    if (ok)
        e->be->copy(e->be, dst, host, count * sizeof(RealBf16));
    g_free(host);
    return ok;
}

static gboolean init_ds_range(void *engine, int u, uint64_t first, uint64_t count,
                              RealBf16 *dst, GError **error)
{
    return init_unit(engine, u, first, count, dst, error);
}

static gboolean init_units(RealEngine *e, GError **error)
{
    const ZpSchedule *s = e->s;
    for (int u = 0; u < s->n_units; u++) {
        if (s->unit_elems[u] == 0) /* another pipeline stage's */
            continue;
        const uint64_t padded = unit_padded(e, u), slice = padded / (uint64_t)e->dp;
        gboolean ok = e->stage < 3
                          ? init_unit(e, u, 0, s->unit_elems[u], e->params + s->unit_offset[u],
                                      error)
                          : init_unit(e, u, (uint64_t)e->rank * slice, slice,
                                      e->params + e->part_off[u], error) &&
                                (!e->persistent[u] ||
                                 init_unit(e, u, 0, padded, e->persistent[u], error));
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

static gboolean init_params(RealEngine *e, GError **error)
{
    /* DeepSpeed's stage 3 partitions each tensor on its own (real_engine_ds). */
    if (!(e->ds && e->stage == 3 ? real_ds_init_params(e->ds, init_ds_range, e, error)
                                 : init_units(e, error)))
        return FALSE;
    if (e->offload) { /* the partition's master copy and swap files; host parameters */
        const gboolean ok = real_offload_init(e->offload, e->params + e->part_base, error);
        if (e->host_params)
            e->params = real_offload_host_params(e->offload);
        return ok;
    }
    e->be->bf16_to_f32(e->be, e->master, e->params + e->part_base, e->opt_elems);
    return TRUE;
}

/* Stage 1 (zp_impl.h full_grads_transient): the schedule's gradient allocs, each unit's full
 * gradients (in micro-step 0's backward) and grads_in_partition (unit -1, at the first
 * reduction), sized for the rank where the whole tensors overlapping the partition are the
 * most. */
static gboolean index_stage1_grads(RealEngine *e, GError **error)
{
    const ZpSchedule *s = e->s;
    double gip_bytes = 0;
    e->gip_id = -1;
    for (guint i = 0; !real_ds_applies(s) && i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_ALLOC || op->sub != ZP_MEM_GRADS)
            continue;
        const gboolean unit = op->unit >= 0 && op->unit < s->n_units;
        const gboolean unit_sized =
            unit && op->bytes == (double)(s->unit_elems[op->unit] * sizeof(RealBf16));
        if (e->stage != 1 || (op->unit >= 0 && !unit_sized) || (op->unit < 0 && e->gip_id >= 0))
            return fail(error, "schedule op %u: a gradient alloc other than stage 1's full "
                        "gradients of a unit and grads_in_partition", i);
        e->full_by_unit |= unit;
        if (op->unit < 0)
            e->gip_id = op->buffer, gip_bytes = op->bytes;
    }
    if (e->full_by_unit != (e->gip_id >= 0))
        return fail(error, "the schedule takes stage 1's full gradients without "
                    "grads_in_partition, or the other way round");
    uint64_t gip_hi;
    zp_impl_params_in_partition(s, e->rank, &e->gip_lo, &gip_hi);
    /* the step reads the partition from it, its padding zero (get_flat_partition pads); the
     * reductions copy nothing past the partition's end (copy_grads_in_partition) */
    const uint64_t part_hi = (uint64_t)(e->rank + 1) * s->partition_elems;
    const double need = (double)((part_hi - e->gip_lo) * sizeof(RealBf16));
    if (e->gip_id >= 0 && need > gip_bytes)
        return fail(error, "rank %d: grads_in_partition needs %.0f bytes, the schedule takes "
                    "%.0f", e->rank, need, gip_bytes);
    return TRUE;
}

/* Buckets' flat ranges come from the collectives that reduce them. */
static void index_buckets(RealEngine *e)
{
    const ZpSchedule *s = e->s;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->buffer >= e->n_buffers)
            e->n_buffers = op->buffer + 1;
    }
    e->buffers = g_new0(void *, e->n_buffers);
    e->bucket_lo = g_new0(uint64_t, e->n_buffers);
    e->bucket_hi = g_new0(uint64_t, e->n_buffers);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COLLECTIVE && !zp_sched_coll_fetches(s, op) && op->buffer >= 0 &&
            op->stage == (uint32_t)s->view_stage) {
            e->bucket_lo[op->buffer] = op->elem_offset;
            e->bucket_hi[op->buffer] = op->elem_offset + op->elems;
        }
    }
}

RealEngine *real_engine_new(const ZpSchedule *s, RealBackend *be, RealComm *comm,
                            const RealTrainConfig *cfg, GError **error)
{
    if (!check_schedule(s, cfg, error) || !check_pipeline(s, cfg, error))
        return NULL;
    if (comm->size != s->plan.dp) {
        fail(error, "the schedule is for %d data-parallel ranks, %d are running", s->plan.dp,
             comm->size);
        return NULL;
    }
    RealEngine *e = g_new0(RealEngine, 1);
    e->s = s, e->be = be, e->comm = comm, e->cfg = *cfg;
    e->stage = s->plan.zero.stage, e->dp = s->plan.dp, e->rank = comm->rank;
    e->L = (int)s->model.layers;
    e->dims = real_engine_dims(&s->model, &s->plan);
    e->dims.tp_rank = cfg->tp ? real_tp_rank(cfg->tp) : 0;
    /* A tied model's last pipeline stage holds the head's own copy of wte (zp_sched's
     * held_elems), kept equal to the first stage's by their ZP_P2P_TIED exchange. */
    if (s->model.tied_embeddings && s->stages > 1 && s->unit_elems[0] == 0 &&
        s->unit_elems[e->L + 1] > 0)
        e->dims.untied = e->dims.tied_copy = true;
    if (!real_gpt_dims_check(&e->dims, error)) { /* before b s sizes anything */
        g_free(e);
        return NULL;
    }
    e->part_off = g_new0(uint64_t, s->n_units);
    e->persistent = g_new0(RealBf16 *, s->n_units);
    e->unit_params = g_new0(RealBf16 *, s->n_units);
    e->unit_grads = g_new0(RealBf16 *, s->n_units);
    e->ckpt_buffer = g_new0(int, (gsize)(e->L + 2) * (gsize)s->plan.grad_accum);
    e->ckpt_slice = g_new0(int, (gsize)(e->L + 2) * (gsize)s->plan.grad_accum);
    /* Pa (zp_zeror): DeepSpeed's get_partition_start / get_partition_size, numel / mp_size
     * from numel / mp_size x mp_rank (no padding: zp_zeror_check refuses what DeepSpeed's
     * assert does, b s h not a multiple of M). */
    e->ckpt_slice_bytes = real_gpt_checkpoint_bytes(&e->dims);
    if (zp_zeror_checkpoint(&s->model, &s->plan).gather_elems > 0) {
        e->ckpt_slice_bytes /= (uint64_t)s->plan.mp;
        e->ckpt_slice_off = (uint64_t)e->dims.tp_rank * e->ckpt_slice_bytes;
    }
    e->stash = g_new0(void *, (gsize)(e->L + 2) * (gsize)s->plan.grad_accum);
    e->head_dx = g_new0(float *, s->plan.grad_accum);
    e->qgz_work = -1;
    e->marks = g_array_new(FALSE, FALSE, sizeof(PendingMark));
    const gsize tokens = (gsize)s->plan.micro_batch * (gsize)s->model.seq_len;
    e->tokens = g_try_new0(int, tokens);
    e->targets = g_try_new0(int, tokens);
    index_buckets(e);
    gboolean ok = index_stage1_grads(e, error);
    ok = ok && ((e->tokens && e->targets) ||
                  fail(error, "rank %d: out of memory allocating two arrays of %" G_GSIZE_FORMAT
                              " tokens (micro_batch x seq_len)", e->rank, tokens));
    ok = ok && (e->gpt = real_gpt_new(be, &e->dims, error)) != NULL;
    if (ok && cfg->tp)
        real_gpt_set_tp(e->gpt, &real_tp_ops, cfg->tp);
    for (int u = 0; ok && u < s->n_units; u++)
        if (s->unit_elems[u] > 0 && real_gpt_unit_elems(&e->dims, u) != s->unit_elems[u])
            ok = fail(error, "unit %d: the schedule has %" G_GUINT64_FORMAT " elements, the "
                             "model %zu", u, s->unit_elems[u], real_gpt_unit_elems(&e->dims, u));
    ok = ok && allocate_states(e, error) && setup_zeropp(e, error) &&
         real_zeror_new(s, be, &e->ckpt_host, error) && init_params(e, error) &&
         (e->x = take(e, real_gpt_checkpoint_bytes(&e->dims), ZP_MEM_WORKSPACE, error)) &&
         (e->dx = take(e, real_gpt_residual_grad_bytes(&e->dims), ZP_MEM_WORKSPACE, error));
    if (!ok) {
        real_engine_free(e);
        return NULL;
    }
    RealAllocStats st;
    real_alloc_stats(be->tracker, &st);
    for (int c = ZP_MEM_PARAMS; c <= ZP_MEM_ADAM_V; c++)
        e->model_state_bytes += (double)st.live_bytes[c];
    return e;
}

void real_engine_free(RealEngine *e)
{
    if (!e)
        return;
    RealBackend *be = e->be;
    for (int i = 0; i < e->n_buffers; i++)
        be->free(be, e->buffers[i]);
    for (int i = 0; i < (e->L + 2) * e->s->plan.grad_accum; i++)
        be->free(be, e->stash[i]);
    for (int i = 0; i < e->s->plan.grad_accum; i++)
        be->free(be, e->head_dx[i]);
    for (int u = 0; u < e->s->n_units; u++) {
        be->free(be, e->persistent[u]);
        if (e->secondary)
            be->free(be, e->secondary[u]);
    }
    RealComm *subgroups[] = {e->hpz_comm, e->qgz_node, e->qgz_cross};
    for (size_t i = 0; i < G_N_ELEMENTS(subgroups); i++)
        if (subgroups[i])
            subgroups[i]->destroy(subgroups[i]);
    g_free(e->secondary), g_free(e->quant_of), g_free(e->quant_group);
    if (e->host_params) /* the host tier's */
        e->params = NULL;
    real_offload_free(e->offload);
    real_ds_free(e->ds);
    real_zeror_free(e->ckpt_host);
    void *states[] = {e->params, e->grads, e->master, e->adam_m, e->adam_v, e->x, e->dx};
    for (size_t i = 0; i < G_N_ELEMENTS(states); i++)
        be->free(be, states[i]);
    real_gpt_free(e->gpt);
    g_free(e->buffers), g_free(e->bucket_lo), g_free(e->bucket_hi);
    g_free(e->part_off), g_free(e->persistent), g_free(e->unit_params), g_free(e->unit_grads);
    g_free(e->ckpt_buffer), g_free(e->ckpt_slice), g_free(e->stash), g_free(e->head_dx);
    g_free(e->tokens), g_free(e->targets);
    g_array_free(e->marks, TRUE);
    g_free(e);
}

double real_engine_model_state_bytes(const RealEngine *e)
{
    return e->model_state_bytes;
}

gboolean real_engine_hpz_sent_bytes(const RealEngine *e, double *sent)
{
    if (e->hpz_comm)
        *sent = e->hpz_comm->sent_bytes;
    return e->hpz_comm != NULL;
}

/* ---- alloc and free ---------------------------------------------------------------------- */

/* A new buffer of `bytes` for the gradients of unit u from its start: the unit's tensors are
 * declared fresh, so backward's first write stores them (no zeroing pass, as autograd's
 * into a .grad that is None), and only what lies beyond them, the padding that the
 * reductions and the step read, is zeroed. */
static void fresh_unit_grads(RealEngine *e, int u, RealBf16 *at, uint64_t bytes)
{
    const uint64_t used = MIN(bytes, e->s->unit_elems[u] * sizeof(RealBf16));
    real_gpt_grads_fresh(e->gpt, u, ALL_TENSORS);
    e->be->fill(e->be, (char *)at + used, 0, bytes - used);
}

/* The units a landing bucket covers and, for stage 3, each unit's offset inside it (units
 * padded), their gradients fresh; the bucket's bytes that no unit covers are zeroed. */
static void map_landing_bucket(RealEngine *e, int id, uint64_t bytes)
{
    const ZpSchedule *s = e->s;
    const size_t b2 = sizeof(RealBf16);
    RealBf16 *bucket = e->buffers[id];
    uint64_t offset = 0, end = 0; /* end: bytes covered so far, in order */
    for (int u = 0; u < s->n_units; u++) {
        if (s->unit_offset[u] < e->bucket_lo[id] || s->unit_offset[u] >= e->bucket_hi[id])
            continue;
        const uint64_t at = e->stage == 3 ? offset : s->unit_offset[u] - e->bucket_lo[id];
        const uint64_t room = e->stage == 3 ? unit_padded(e, u) : s->unit_elems[u];
        const uint64_t from = MIN(at * b2, bytes), to = MIN((at + room) * b2, bytes);
        if (from > end)
            e->be->fill(e->be, (char *)bucket + end, 0, from - end);
        e->unit_grads[u] = bucket + at;
        fresh_unit_grads(e, u, bucket + at, to - from);
        end = MAX(end, to);
        offset += unit_padded(e, u);
    }
    if (end < bytes)
        e->be->fill(e->be, (char *)bucket + end, 0, bytes - end);
}

static const RealBf16 *step_grads(const RealEngine *e);

/* DeepSpeed's step copies of the reduced partition (stage_1_and_2.py step): the flattened
 * 16-bit gradients, or their fp32 conversion, by the buffer's size; at stage 3 the fp32
 * gradient of a sub_group_size group (stage3.py _prepare_fp32_grad_for_sub_group), the first:
 * the schedule has one buffer of the largest group around one optimizer op. */
static void step_copy(RealEngine *e, void *dst, uint64_t bytes)
{
    const uint64_t part = e->s->partition_elems;
    const RealBf16 *grad = step_grads(e);
    if (bytes == part * sizeof(float) || e->stage == 3)
        e->be->bf16_to_f32(e->be, dst, grad, MIN(part, bytes / sizeof(float)));
    else
        e->be->copy(e->be, dst, grad, bytes);
}

/* Whether Pa splits each checkpoint over the tensor group (mp > 1). */
static gboolean pa_splits(const RealEngine *e)
{
    return e->ckpt_slice_bytes < real_gpt_checkpoint_bytes(&e->dims);
}

/* Bytes the engine needs for the buffer an alloc op asks for; 0 for the buffers the model
 * allocates itself (activations, logits), whose sizes the tracker measures instead. */
static uint64_t needed_bytes(const RealEngine *e, const ZpOp *op)
{
    const size_t b2 = sizeof(RealBf16);
    switch (op->sub) {
    case ZP_MEM_GATHERED_PARAMS: /* a unit, or with real_engine_ds one tensor it checks */
        return e->ds ? (uint64_t)op->bytes : unit_padded(e, op->unit) * b2;
    case ZP_MEM_CHECKPOINTS: /* Pa's slice kept in forward, or a whole block input */
        return op->bytes == (double)e->ckpt_slice_bytes ? e->ckpt_slice_bytes
                                                        : real_gpt_checkpoint_bytes(&e->dims);
    case ZP_MEM_BUCKETS:
        return (uint64_t)op->bytes; /* its size follows from the collective that uses it */
    case ZP_MEM_GRADS: /* real_engine_ds's grads_in_partition and copies, which it checks,
                        * or stage 1's (index_stage1_grads) */
        return e->ds || e->full_by_unit ? (uint64_t)op->bytes : 0;
    case ZP_MEM_WORKSPACE: /* the step's gradient copies (unit and micro-step -1) */
        return op->unit == -1 && op->micro == -1 ? (uint64_t)op->bytes : 0;
    default:
        return 0;
    }
}

/* Whether op `index` is one of qgZ's all-to-alls. */
static gboolean is_alltoall(const ZpSchedule *s, guint index)
{
    return index < s->ops->len && zp_sched_op(s, index)->kind == ZP_OP_COLLECTIVE &&
           zp_sched_op(s, index)->sub == ZP_COLL_ALLTOALL;
}

static gboolean do_alloc(RealEngine *e, guint index, const ZpOp *op, GError **error)
{
    if (op->buffer < 0) /* the step-long state's: DeepSpeed's persistent copies */
        return e->ds ? real_ds_state_op(e->ds, op,
                                        index + 1 < e->s->ops->len ? zp_sched_op(e->s, index + 1)
                                                                   : NULL,
                                        error)
                     : fail(error, "schedule op %u: an alloc of the step-long state outside "
                                   "DeepSpeed's stage 3", index);
    /* qwZ's int8 buffer: the workspace a quantize op follows (zp_sched's issue_gathers). */
    /* qgZ's int4 buffers likewise, the quantize op then followed by its all-to-all. */
    const ZpSchedule *s = e->s;
    if (op->sub == ZP_MEM_WORKSPACE && index + 1 < s->ops->len &&
        zp_sched_op(s, index + 1)->kind == ZP_OP_COMPUTE &&
        zp_sched_op(s, index + 1)->sub == ZP_COMP_QUANTIZE) {
        if (is_alltoall(s, index + 2))
            e->qgz_work = op->buffer;
        return (e->buffers[op->buffer] = take(e, (uint64_t)op->bytes, op->sub, error)) != NULL;
    }
    const uint64_t need = needed_bytes(e, op);
    if (need == 0)
        return TRUE;
    if ((double)need != op->bytes)
        return fail(error, "schedule op %u: a %s buffer of %.0f bytes; the engine needs %" G_GUINT64_FORMAT,
                    index, zp_sched_mem_name(op->sub), op->bytes, need);
    if (!(e->buffers[op->buffer] = take(e, need, op->sub, error)))
        return FALSE;
    if (op->sub == ZP_MEM_GRADS && op->unit >= 0 && !e->ds) { /* a unit's gradients */
        e->unit_grads[op->unit] = e->buffers[op->buffer];
        fresh_unit_grads(e, op->unit, e->buffers[op->buffer], need);
    } else if (op->sub == ZP_MEM_GRADS) { /* read whole (real_engine_ds adds into its own) */
        e->be->fill(e->be, e->buffers[op->buffer], 0, need);
    }
    if (op->sub == ZP_MEM_CHECKPOINTS) /* Pa's slice in forward, or a whole input */
        (pa_splits(e) && need == e->ckpt_slice_bytes ? e->ckpt_slice
                                                     : e->ckpt_buffer)[slot(e, op->unit,
                                                                            op->micro)] = op->buffer;
    if (op->sub == ZP_MEM_BUCKETS && e->stage >= 2 && op->unit >= 0) {
        /* Stages 2-3: backward writes straight into the bucket (real_engine_ds maps its
         * tensors itself, zeroing the bucket where they land). */
        if (e->ds)
            e->be->fill(e->be, e->buffers[op->buffer], 0, need);
        else
            map_landing_bucket(e, op->buffer, need);
    }
    if (op->sub == ZP_MEM_WORKSPACE)
        step_copy(e, e->buffers[op->buffer], need);
    return TRUE;
}

static gboolean do_free(RealEngine *e, const ZpOp *op, GError **error)
{
    if (op->buffer < 0)
        return e->ds ? real_ds_state_op(e->ds, op, NULL, error)
                     : fail(error, "a free of the step-long state outside DeepSpeed's stage 3");
    void *p = e->buffers[op->buffer];
    if (!p)
        return TRUE;
    if (op->sub == ZP_MEM_GRADS && op->unit >= 0 && e->unit_grads[op->unit] == p)
        e->unit_grads[op->unit] = NULL;
    if (op->sub == ZP_MEM_GATHERED_PARAMS && e->unit_params[op->unit] == p)
        e->unit_params[op->unit] = NULL;
    e->be->free(e->be, p);
    e->buffers[op->buffer] = NULL;
    return TRUE;
}

/* ---- compute ----------------------------------------------------------------------------- */

/* Unit u's parameters as a compute op reads them, and where it accumulates its gradients:
 * the tensors in `used` (bit k: tensor k of the unit) or all (ALL_TENSORS). */
static gboolean params_of(RealEngine *e, int u, uint32_t used, RealGptTensors *v,
                          GError **error)
{
    if (e->ds)
        return real_ds_params(e->ds, u, used, v, error);
    const RealBf16 *p = e->stage < 3          ? e->params + e->s->unit_offset[u]
                        : e->persistent[u] ? e->persistent[u]
                                           : e->unit_params[u];
    if (!p)
        return fail(error, "rank %d: unit %d is used but was not gathered", e->rank, u);
    real_gpt_tensors_at(&e->dims, u, p, v);
    return TRUE;
}

static gboolean grads_of(RealEngine *e, int u, uint32_t used, int micro, RealGptTensors *v,
                         GError **error)
{
    if (e->ds)
        return real_ds_grads(e->ds, u, used, micro, v, error);
    RealBf16 *g = e->stage < 2 && !e->full_by_unit ? e->grads + e->s->unit_offset[u]
                                                   : e->unit_grads[u];
    if (!g)
        return fail(error, "rank %d: no gradient bucket holds unit %d", e->rank, u);
    real_gpt_tensors_at(&e->dims, u, g, v);
    return TRUE;
}

/* A pipeline's tied word embedding gradient on this stage: wte's (the first stage) or the
 * head's copy of it (the last), this rank's vocabulary rows. */
static gboolean tied_grads(RealEngine *e, RealBf16 **grads, size_t *n, GError **error)
{
    const int u = e->dims.tied_copy ? e->L + 1 : 0;
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    const int n_tensors = real_gpt_unit_tensors(&e->dims, u, t);
    const int k = e->dims.tied_copy ? n_tensors - 1 : 0; /* lm_head.weight last, wte first */
    RealGptTensors g;
    if (!grads_of(e, u, ALL_TENSORS, e->s->plan.grad_accum - 1, &g, error))
        return FALSE;
    *grads = g.at[k];
    *n = t[k].elems;
    return TRUE;
}

/* This rank's reduced partition gradients, as the step reads them. */
static const RealBf16 *step_grads(const RealEngine *e)
{
    if (e->ds)
        return real_ds_step_grads(e->ds);
    if (e->gip_id >= 0)
        return e->buffers[e->gip_id] ? (const RealBf16 *)e->buffers[e->gip_id] +
                                           (e->part_base - e->gip_lo)
                                     : NULL;
    return e->grads + (e->stage == 1 ? e->part_base : 0);
}

static gboolean load_micro_batch(RealEngine *e, int micro, GError **error)
{
    const ZpSchedule *s = e->s;
    uint64_t first = real_data_first_sample(e->step, micro, s->plan.grad_accum, e->rank, e->dp,
                                            s->plan.micro_batch);
    return real_data_batch(e->cfg.seed, first, s->plan.micro_batch, (int)s->model.seq_len,
                           (int)s->model.vocab, e->tokens, e->targets, error);
}

/* The optimizer's settings; `next` for a new step (a CPU step's later sub-groups are not). */
static RealAdamHyper adam_hyper(RealEngine *e, gboolean next)
{
    e->adam_step += next;
    return (RealAdamHyper){
        .lr = e->cfg.lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
        .weight_decay = e->cfg.weight_decay,
        /* Each micro-step's loss is a mean over its tokens; the step's is their mean. */
        .grad_scale = 1.0f / (float)(e->dp * e->s->plan.grad_accum),
        .step = e->adam_step};
}

static gboolean optimizer(RealEngine *e)
{
    const RealAdamHyper hyper = adam_hyper(e, TRUE);
    if (e->offload) { /* partial offload: the GPU's sub-groups */
        real_offload_gpu_adam(e->offload, &hyper, e->params + e->part_base);
        return TRUE;
    }
    const RealBf16 *grad = step_grads(e);
    e->be->adam_step(e->be, &hyper, e->opt_elems, e->master, e->adam_m, e->adam_v, grad,
                     e->params + e->part_base);
    return TRUE;
}

/* hpZ: a unit gathered whole over the DP group leaves this rank its 1/size slice in the
 * node (_partition_param_sec: secondary_start = its size x rank in the group). */
static void keep_secondary(RealEngine *e, int u, ZpGroup group, const RealBf16 *full)
{
    if (!e->hpz_comm || group != ZP_GROUP_DP || !e->secondary[u])
        return;
    const uint64_t n = unit_padded(e, u) / (uint64_t)e->hpz_comm->size;
    e->be->copy(e->be, e->secondary[u], full + (uint64_t)e->hpz_comm->rank * n,
                n * sizeof(RealBf16));
}

/* The communicator of a stage-3 gather on `group`. */
static RealComm *gather_comm(RealEngine *e, ZpGroup group)
{
    return group == ZP_GROUP_HPZ ? e->hpz_comm : e->comm;
}

/* What this rank contributes to a stage-3 gather of unit u: its partition (the DP group) or
 * its secondary slice (hpZ's group in backward). */
static const RealBf16 *gather_source(RealEngine *e, int u, ZpGroup group)
{
    return group == ZP_GROUP_HPZ ? e->secondary[u] : e->params + e->part_off[u];
}

/* qwZ before the gather that follows it in the list (zp_sched's issue_gathers: the int8
 * buffer's alloc, the quantize op, the gather): this rank's source, quantised into its place
 * of the int8 buffer in CUDAQuantizer.quantize's groups. */
static gboolean qwz_quantize(RealEngine *e, const ZpOp *op, GError **error)
{
    const int u = op->unit;
    const ZpSchedule *s = e->s;
    const guint index = (guint)(op - zp_sched_op(s, 0));
    const ZpOp *gather_op = index + 1 < s->ops->len ? zp_sched_op(s, index + 1) : NULL;
    const ZpOp *alloc = op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0]) : NULL;
    if (!gather_op || gather_op->kind != ZP_OP_COLLECTIVE || gather_op->unit != u ||
        gather_op->buffer < 0 || !alloc || alloc->kind != ZP_OP_ALLOC ||
        !e->buffers[alloc->buffer])
        return fail(error, "a quantize op must follow its int8 buffer's alloc and precede its "
                    "unit's gather");
    RealComm *c = gather_comm(e, (ZpGroup)gather_op->group);
    if (!c)
        return fail(error, "an hpZ gather without zero_hpz_partition_size");
    const uint64_t n = unit_padded(e, u) / (uint64_t)c->size;
    const uint64_t groups = zp_zeropp_qwz_groups(n);
    uint8_t *buf = e->buffers[alloc->buffer];
    real_zeropp_quantize(gather_source(e, u, (ZpGroup)gather_op->group), n, groups,
                         buf + (size_t)c->rank * real_zeropp_quantized_bytes(n, groups));
    e->quant_of[gather_op->buffer] = alloc->buffer;
    e->quant_group[gather_op->buffer] = gather_op->group;
    return TRUE;
}

/* qwZ when the gathered unit is needed (its first dependency is the gather): every rank's
 * int8 and scales into the unit's bf16 buffer. */
static gboolean qwz_dequantize(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    const int u = op->unit;
    const ZpOp *gather_op = op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0]) : NULL;
    const int target = gather_op && gather_op->kind == ZP_OP_COLLECTIVE ? gather_op->buffer : -1;
    if (target < 0 || e->quant_of[target] < 0 || !e->buffers[e->quant_of[target]])
        return fail(error, "a dequantize op with no gathered int8 buffer for unit %d", u);
    const ZpGroup group = (ZpGroup)e->quant_group[target];
    const int ranks = gather_comm(e, group)->size;
    const uint64_t n = unit_padded(e, u) / (uint64_t)ranks, groups = zp_zeropp_qwz_groups(n);
    const uint8_t *buf = e->buffers[e->quant_of[target]];
    RealBf16 *dst = e->buffers[target];
    for (int q = 0; q < ranks; q++)
        real_zeropp_dequantize(buf + (size_t)q * real_zeropp_quantized_bytes(n, groups), n,
                               groups, dst + (uint64_t)q * n);
    e->unit_params[u] = dst;
    e->quant_of[target] = -1;
    keep_secondary(e, u, group, dst);
    return TRUE;
}

/* After a head: when this stage's next compute op is not its micro-step's backward (GPipe's
 * and the interleaved schedule's last stage forward other micro-steps first), its output
 * gradient is kept aside (workspace: 4 b s h bytes each). */
static gboolean keep_head_dx(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    guint i = (guint)(op - zp_sched_op(s, 0)) + 1;
    while (i < s->ops->len && (zp_sched_op(s, i)->stage != (uint32_t)s->view_stage ||
                               zp_sched_op(s, i)->kind != ZP_OP_COMPUTE))
        i++;
    const ZpOp *next = i < s->ops->len ? zp_sched_op(s, i) : NULL;
    if (!next || next->micro == op->micro)
        return TRUE;
    const uint64_t bytes = real_gpt_residual_grad_bytes(&e->dims);
    if (!(e->head_dx[op->micro] = take(e, bytes, ZP_MEM_WORKSPACE, error)))
        return FALSE;
    e->be->copy(e->be, e->head_dx[op->micro], e->dx, bytes);
    return TRUE;
}

/* Before a backward op: the micro-step's kept head output gradient, if any, back into dx. */
static void restore_head_dx(RealEngine *e, int micro)
{
    float **kept = &e->head_dx[micro];
    if (!*kept)
        return;
    e->be->copy(e->be, e->dx, *kept, real_gpt_residual_grad_bytes(&e->dims));
    e->be->free(e->be, *kept);
    *kept = NULL;
}

/* This rank's slice of a block input held at `input` (the whole input without Pa). */
static void *block_input_slice(const RealEngine *e, void *input)
{
    return (char *)input + e->ckpt_slice_off;
}

/* Where forward keeps block l's checkpoint on the GPU: Pa's slice, or the whole input. */
static void *kept_checkpoint(const RealEngine *e, int l, int micro)
{
    return e->buffers[(pa_splits(e) ? e->ckpt_slice : e->ckpt_buffer)[slot(e, l, micro)]];
}

/* A block op: one of its modules (DeepSpeed's stage 3: real_gpt's per-module entry points,
 * with that module's tensors only, backward adding that module's gradients) or the whole
 * block. */
static gboolean block_forward(RealEngine *e, const ZpOp *op, const RealBf16 *x_in,
                              gboolean save, GError **error)
{
    const int m = zp_op_module(op), l = op->unit;
    RealGptTensors p;
    if (m < 0)
        return params_of(e, l, ALL_TENSORS, &p, error) &&
               real_gpt_block_forward_t(e->gpt, l - 1, &p, x_in, e->x, save, error);
    return params_of(e, l, real_gpt_module_tensors(&e->dims, m), &p, error) &&
           real_gpt_block_forward_module_t(e->gpt, l - 1, m, &p, x_in, e->x, save, error);
}

static gboolean block_backward(RealEngine *e, const ZpOp *op, GError **error)
{
    const int m = zp_op_module(op), l = op->unit;
    RealGptTensors p, g;
    const uint32_t used = m < 0 ? ALL_TENSORS : real_gpt_module_tensors(&e->dims, m);
    if (!params_of(e, l, used, &p, error) || !grads_of(e, l, used, op->micro, &g, error))
        return FALSE;
    if (m < 0)
        return real_gpt_block_backward_t(e->gpt, l - 1, &p, e->dx, e->dx, &g, error);
    return real_gpt_block_backward_module_t(e->gpt, l - 1, m, &p, e->dx, e->dx, &g, error);
}

static gboolean do_compute(RealEngine *e, const ZpOp *op, GError **error)
{
    const int l = op->unit, L = e->L, micro = op->micro;
    RealGptTensors p, g;
    float loss = 0;
    switch ((ZpComputeKind)op->sub) {
    case ZP_COMP_EMBED_FWD:
        return load_micro_batch(e, op->micro, error) && params_of(e, 0, ALL_TENSORS, &p, error) &&
               real_gpt_embed_forward_t(e->gpt, &p, e->tokens, e->x, error);
    case ZP_COMP_BLOCK_FWD: {
        const int m = zp_op_module(op);
        /* cpu_checkpointing: a host_copy did */
        if (e->s->plan.checkpoint && !e->ckpt_host && m <= REAL_GPT_MOD_LN1)
            e->be->copy(e->be, kept_checkpoint(e, l, op->micro), block_input_slice(e, e->x),
                        e->ckpt_slice_bytes);
        if (!block_forward(e, op, e->x, !e->s->plan.checkpoint, error))
            return FALSE;
        if (!e->s->plan.checkpoint && (m < 0 || m == REAL_GPT_MOD_FC2))
            e->stash[slot(e, l, op->micro)] = real_gpt_take_saved(e->gpt, l - 1);
        return TRUE;
    }
    case ZP_COMP_HEAD: {
        /* A pipeline's last stage reads the micro-batch's targets itself. */
        if (e->s->stages > 1 && !load_micro_batch(e, op->micro, error))
            return FALSE;
        /* A tied head reads and updates the embedding (unit 0) too; an untied one only its
         * own unit. */
        const gboolean tied = !e->dims.untied;
        RealGptTensors emb = {0}, gemb = {0};
        gboolean ok = params_of(e, L + 1, ALL_TENSORS, &p, error) &&
                      (!tied || params_of(e, 0, WTE_ONLY, &emb, error)) &&
                      grads_of(e, L + 1, ALL_TENSORS, micro, &g, error) &&
                      (!tied || grads_of(e, 0, WTE_ONLY, micro, &gemb, error)) &&
                      real_gpt_head_forward_backward_t(e->gpt, &p, &emb, e->x, e->targets, 1.0f,
                                                       &loss, e->dx, &g, &gemb, error);
        e->loss_sum += loss;
        return ok && (e->s->stages == 1 || keep_head_dx(e, op, error));
    }
    case ZP_COMP_RECOMPUTE:
        restore_head_dx(e, op->micro);
        /* The recomputed block's output is not needed: the residual stream is scratch now. */
        return block_forward(e, op, e->buffers[e->ckpt_buffer[slot(e, l, op->micro)]], TRUE,
                             error);
    case ZP_COMP_BLOCK_BWD:
        restore_head_dx(e, op->micro);
        /* the block's activations back for its backward, which fc2's op begins */
        if (!e->s->plan.checkpoint &&
            (zp_op_module(op) < 0 || zp_op_module(op) == REAL_GPT_MOD_FC2)) {
            void **saved = &e->stash[slot(e, l, op->micro)];
            if (!real_gpt_put_saved(e->gpt, l - 1, *saved, error))
                return FALSE;
            *saved = NULL;
        }
        return block_backward(e, op, error);
    case ZP_COMP_EMBED_BWD:
        /* A pipeline's first stage has forwarded later micro-batches since: their tokens. */
        return (e->s->stages == 1 || load_micro_batch(e, op->micro, error)) &&
               grads_of(e, 0, ALL_TENSORS, micro, &g, error) &&
               real_gpt_embed_backward_t(e->gpt, e->tokens, e->dx, &g, error);
    case ZP_COMP_OPTIMIZER:
        return optimizer(e);
    case ZP_COMP_CPU_OPTIMIZER: {
        const RealAdamHyper hyper = adam_hyper(e, real_offload_first_sub_group(e->offload));
        return real_offload_adam(e->offload, &hyper, error);
    }
    case ZP_COMP_QUANTIZE: {
        /* qgZ's kernels sit around its all-to-alls, whose op does their work (qgz_reduce) */
        const guint index = (guint)(op - zp_sched_op(e->s, 0));
        if (is_alltoall(e->s, index + 1) || (index > 0 && is_alltoall(e->s, index - 1)))
            return TRUE;
        if (e->ds)
            return real_ds_qwz(e->ds, op, error);
        return op->stream == ZP_STREAM_DP ? qwz_quantize(e, op, error)
                                          : qwz_dequantize(e, op, error);
    }
    case ZP_COMP_UNPACK:
        return e->ds ? real_ds_unpack(e->ds, op, error)
                     : fail(error, "an unpack op outside DeepSpeed's stage 3");
    case ZP_COMP_HOST_COPY: /* the block input (its slice) down, or back into the
                             * recompute's buffer (Pa: at the slice's place, then gathered) */
        return real_zeror_host_copy(
            e->ckpt_host, l, micro,
            block_input_slice(e, real_zeror_on_host(e->ckpt_host, l, micro)
                                     ? e->buffers[e->ckpt_buffer[slot(e, l, micro)]]
                                     : e->x),
            (uint64_t)op->bytes, error);
    default:
        return fail(error, "unknown compute op %d", op->sub);
    }
}

/* ---- collectives ------------------------------------------------------------------------- */

void real_engine_deliver(RealBackend *be, RealBf16 *dst, const RealBf16 *src, uint64_t n,
                         gboolean accumulate)
{
    if (accumulate)
        be->add_bf16(be, dst, src, n);
    else
        be->copy(be, dst, src, n * sizeof(RealBf16));
}

/* Stages 1-2: rank q receives the part of [lo, hi) inside its partition [qP, (q+1)P). */
static int *partition_counts(const RealEngine *e, uint64_t lo, uint64_t hi)
{
    const uint64_t P = e->s->partition_elems;
    int *counts = g_new0(int, e->dp);
    for (int q = 0; q < e->dp; q++) {
        const uint64_t a = MAX(lo, (uint64_t)q * P), b = MIN(hi, (uint64_t)(q + 1) * P);
        counts[q] = b > a ? (int)(b - a) : 0;
    }
    return counts;
}

/* The unit holding flat offset `at`, -1 none. */
static int unit_at(const ZpSchedule *s, uint64_t at)
{
    for (int u = 0; u < s->n_units; u++)
        if (at >= s->unit_offset[u] && at < s->unit_offset[u] + s->unit_elems[u])
            return u;
    return -1;
}

/* Stages 0-1: where the full gradients of flat offset `at` lie (one array, or with
 * full_by_unit its unit's buffer), NULL when not taken. */
static RealBf16 *full_grads_at(const RealEngine *e, uint64_t at)
{
    if (!e->full_by_unit)
        return e->grads + at;
    const int u = unit_at(e->s, at);
    return u >= 0 && e->unit_grads[u] ? e->unit_grads[u] + (at - e->s->unit_offset[u]) : NULL;
}

/* Stages 0-1: the full gradients of flat range [lo, lo + n) copied into buf, or from buf
 * into them (`into`), unit by unit with full_by_unit. */
static gboolean full_grads_copy(RealEngine *e, uint64_t lo, uint64_t n, RealBf16 *buf,
                                gboolean into, GError **error)
{
    for (uint64_t at = lo, run; at < lo + n; at += run) {
        const int u = e->full_by_unit ? unit_at(e->s, at) : -1;
        run = u >= 0 ? MIN(lo + n, e->s->unit_offset[u] + e->s->unit_elems[u]) - at
                     : lo + n - at;
        RealBf16 *full = full_grads_at(e, at);
        if (!full)
            return fail(error, "rank %d: the full gradients of flat offset %" G_GUINT64_FORMAT
                        " are reduced but not taken", e->rank, at);
        e->be->copy(e->be, into ? full : buf + (at - lo), into ? buf + (at - lo) : full,
                    run * sizeof(RealBf16));
    }
    return TRUE;
}

static gboolean reduce_flat(RealEngine *e, const ZpOp *op, GError **error)
{
    const uint64_t lo = op->elem_offset, hi = lo + op->elems;
    if (op->buffer < 0) { /* a parameter larger than the bucket, reduced in place */
        RealBf16 *full = e->stage < 2 ? full_grads_at(e, lo) : NULL;
        if (!full || op->sub != ZP_COLL_ALLREDUCE)
            return fail(error, "rank %d: a bucketless reduction is an all-reduce of the full "
                               "gradients (stages 0-1)", e->rank);
        return e->comm->allreduce_bf16(e->comm, full, hi - lo, error);
    }
    RealBf16 *bucket = e->buffers[op->buffer];
    /* stages 0-1: the full gradients are kept apart; the bucket is a copy */
    if (e->stage < 2 && !full_grads_copy(e, lo, hi - lo, bucket, FALSE, error))
        return FALSE;
    if (op->sub == ZP_COLL_ALLREDUCE)
        return e->comm->allreduce_bf16(e->comm, bucket, hi - lo, error) &&
               full_grads_copy(e, lo, hi - lo, bucket, TRUE, error);
    int *counts = partition_counts(e, lo, hi);
    gboolean ok = e->comm->reduce_scatter_bf16(e->comm, bucket, counts, error);
    const uint64_t mine = (uint64_t)counts[e->rank];
    g_free(counts);
    if (!ok || mine == 0 || e->host_grads) /* offloaded: the transfers take it from the bucket */
        return ok;
    const uint64_t start = MAX(lo, e->part_base); /* first element of ours in the flat space */
    if (e->stage == 1)
        return full_grads_copy(e, start, mine, bucket, TRUE, error);
    real_engine_deliver(e->be, e->grads + (start - e->part_base), bucket, mine, op->micro > 0);
    return TRUE;
}

/* Stage 1 (index_stage1_grads): the reduced gradients of [lo, hi) in this rank's partition,
 * copied from the full gradients into grads_in_partition (stage_1_and_2.py
 * copy_grads_in_partition; the rest of its whole tensors the step never reads). */
static gboolean copy_grads_in_partition(RealEngine *e, const ZpOp *op, GError **error)
{
    const uint64_t P = e->s->partition_elems;
    const uint64_t a = MAX(op->elem_offset, e->part_base);
    const uint64_t b = MIN(op->elem_offset + op->elems, e->part_base + P);
    RealBf16 *gip = e->buffers[e->gip_id];
    if (!gip)
        return fail(error, "rank %d: a stage-1 reduction before grads_in_partition is taken",
                    e->rank);
    return b <= a || full_grads_copy(e, a, b - a, gip + (a - e->gip_lo), FALSE, error);
}

/* Stage 3: each unit of the bucket is reduce-scattered over its own padded partition. */
static gboolean reduce_units(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    for (int u = 0; u < s->n_units; u++) {
        if (s->unit_offset[u] < op->elem_offset ||
            s->unit_offset[u] >= op->elem_offset + op->elems)
            continue;
        const int slice = (int)(unit_padded(e, u) / (uint64_t)e->dp);
        int *counts = g_new(int, e->dp);
        for (int q = 0; q < e->dp; q++)
            counts[q] = slice;
        const gboolean ok = e->comm->reduce_scatter_bf16(e->comm, e->unit_grads[u], counts, error);
        g_free(counts);
        if (!ok)
            return FALSE;
        if (!e->host_grads)
            real_engine_deliver(e->be, e->grads + e->part_off[u], e->unit_grads[u],
                                (uint64_t)slice, op->micro > 0);
    }
    return TRUE;
}

/* Stage 3: over the DP group, or hpZ's in backward; qwZ's int8 and scales in place in the
 * quantize op's buffer, dequantised when the unit is needed. A subgroup's bytes count in
 * the rank's total. */
static gboolean gather_unit(RealEngine *e, const ZpOp *op, GError **error)
{
    const int u = op->unit;
    const ZpGroup group = (ZpGroup)op->group;
    RealComm *c = gather_comm(e, group);
    if (!c)
        return fail(error, "an hpZ gather without zero_hpz_partition_size");
    const double before = c->sent_bytes;
    const uint64_t slice = unit_padded(e, u) / (uint64_t)c->size;
    RealBf16 *dst = e->buffers[op->buffer];
    gboolean ok;
    if (e->s->plan.zero.zero_quantized_weights) {
        const int quant = e->quant_of[op->buffer];
        if (quant < 0 || !e->buffers[quant])
            return fail(error, "a qwZ gather of unit %d with no int8 buffer", u);
        ok = c->allgather_bytes(c, e->buffers[quant],
                                real_zeropp_quantized_bytes(slice, zp_zeropp_qwz_groups(slice)),
                                error);
    } else {
        /* With offload_param the transfer before the gather put this rank's slice in place. */
        const RealBf16 *src = e->host_params ? dst + (uint64_t)c->rank * slice
                                             : gather_source(e, u, group);
        ok = c->allgather_bf16(c, src, slice, dst, error);
        if (ok) {
            e->unit_params[u] = dst;
            keep_secondary(e, u, group, dst);
        }
    }
    if (c != e->comm)
        e->comm->sent_bytes += c->sent_bytes - before;
    return ok;
}

static gboolean gather(RealEngine *e, const ZpOp *op, GError **error)
{
    const size_t b2 = sizeof(RealBf16);
    if (e->stage == 3 && op->buffer >= 0) /* a unit into its gathered buffer */
        return gather_unit(e, op, error);
    if (e->stage == 3) { /* a persistent unit's full copy */
        const uint64_t slice = unit_padded(e, op->unit) / (uint64_t)e->dp;
        return e->comm->allgather_bf16(e->comm, e->params + e->part_off[op->unit], slice,
                                       e->persistent[op->unit], error);
    }
    /* Stages 1-2: a chunk at offset elem_offset of every rank's partition. */
    const uint64_t n = op->elems / (uint64_t)e->dp, P = e->s->partition_elems;
    if (op->buffer < 0) { /* in place (runtime/utils.py all_gather_dp_groups): one chunk */
        if (op->elem_offset != 0 || n != P)
            return fail(error, "rank %d: an in-place all-gather takes the whole partition in "
                               "one chunk (allgather_bucket_size at least the parameters)",
                        e->rank);
        return e->comm->allgather_bf16(e->comm, e->params + e->part_base, P, e->params, error);
    }
    RealBf16 *bucket = e->buffers[op->buffer];
    if (!e->comm->allgather_bf16(e->comm, e->params + e->part_base + op->elem_offset, n, bucket,
                                 error))
        return FALSE;
    for (int q = 0; q < e->dp; q++)
        e->be->copy(e->be, e->params + (uint64_t)q * P + op->elem_offset, bucket + (uint64_t)q * n,
                    n * b2);
    return TRUE;
}

gboolean real_engine_qgz(RealBackend *be, int rank, RealComm *total, RealComm *node,
                         RealComm *cross, const float *pieces, uint64_t part, uint64_t groups,
                         uint8_t *work, RealBf16 *mine, GError **error)
{
    const int nodes = cross->size;
    float *acc = real_engine_alloc(be, rank, (uint64_t)nodes * part * sizeof(float),
                                   ZP_MEM_WORKSPACE, error);
    float *out = acc ? real_engine_alloc(be, rank, part * sizeof(float), ZP_MEM_WORKSPACE, error)
                     : NULL;
    const double before = node->sent_bytes + cross->sent_bytes;
    gboolean ok = out && real_zeropp_qgz_reduce(node, cross, pieces, part, groups, work, acc,
                                                out, error);
    total->sent_bytes += node->sent_bytes + cross->sent_bytes - before;
    for (uint64_t k = 0; ok && k < part; k++)
        mine[k] = real_bf16_from_f32(out[k]);
    be->free(be, acc);
    be->free(be, out);
    return ok;
}

/* qgZ at the bucket's all-to-all inside the node (zp_sched's qgz_reduce): the bucket's units
 * as the world's partitions (rank q's slice of every unit, in order) through real_engine_qgz
 * in zp_zeropp_qgz's groups, and this rank's sum delivered as a reduce-scatter's is; the
 * all-to-all across nodes and the kernels around them are part of it. */
static gboolean qgz_reduce(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    const uint64_t lo = op->elem_offset, hi = lo + op->elems;
    uint64_t part = 0;
    for (int u = 0; u < s->n_units; u++)
        if (s->unit_offset[u] >= lo && s->unit_offset[u] < hi)
            part += unit_padded(e, u) / (uint64_t)e->dp;
    if (part * (uint64_t)e->dp != op->elems || e->qgz_work < 0 || !e->buffers[e->qgz_work])
        return fail(error, "a qgZ all-to-all must cover whole padded units after its int4 "
                    "buffer");
    const ZpQgz q = zp_zeropp_qgz(&s->plan, (double)op->elems,
                                  (double)s->model.hidden / s->plan.mp,
                                  zp_plan_reduce_bytes(&s->plan));
    float *pieces = take(e, op->elems * sizeof(float), ZP_MEM_WORKSPACE, error);
    RealBf16 *mine = pieces ? take(e, part * sizeof(RealBf16), ZP_MEM_WORKSPACE, error) : NULL;
    gboolean ok = mine != NULL;
    uint64_t at = 0; /* a unit's offset in every partition */
    for (int u = 0; ok && u < s->n_units; u++) {
        if (s->unit_offset[u] < lo || s->unit_offset[u] >= hi)
            continue;
        const uint64_t slice = unit_padded(e, u) / (uint64_t)e->dp;
        for (int r = 0; r < e->dp; r++)
            for (uint64_t k = 0; k < slice; k++)
                pieces[(uint64_t)r * part + at + k] =
                    real_bf16_to_f32(e->unit_grads[u][(uint64_t)r * slice + k]);
        at += slice;
    }
    ok = ok && real_engine_qgz(e->be, e->rank, e->comm, e->qgz_node, e->qgz_cross, pieces, part,
                               (uint64_t)q.groups / (uint64_t)e->dp, e->buffers[e->qgz_work],
                               mine, error);
    at = 0;
    for (int u = 0; ok && u < s->n_units; u++) {
        if (s->unit_offset[u] < lo || s->unit_offset[u] >= hi)
            continue;
        const uint64_t slice = unit_padded(e, u) / (uint64_t)e->dp;
        real_engine_deliver(e->be, e->grads + e->part_off[u], mine + at, slice, op->micro > 0);
        at += slice;
    }
    e->be->free(e->be, pieces);
    e->be->free(e->be, mine);
    return ok;
}

/* qgZ's intra-node all-to-all (the op does the whole reduction): the engine's bucket, or
 * under DeepSpeed's stage 3 one tensor (real_ds_qgz). */
static gboolean qgz_node_op(RealEngine *e, const ZpOp *op, GError **error)
{
    if (!e->ds)
        return qgz_reduce(e, op, error);
    if (e->qgz_work < 0 || !e->buffers[e->qgz_work])
        return fail(error, "a qgZ all-to-all with no int4 buffer before it");
    return real_ds_qgz(e->ds, op, e->qgz_node, e->qgz_cross, e->buffers[e->qgz_work], error);
}

/* Pa's all-gather before block op->unit's recompute (DeepSpeed's checkpointing.py,
 * gather_partitioned_activations, called by CheckpointFunction.backward): this rank's slice
 * into its place in the new whole buffer (from the GPU slice; with cpu_checkpointing the
 * host copy put it there), then all_gather_into_tensor over the tensor group. */
static gboolean gather_checkpoint(RealEngine *e, const ZpOp *op, GError **error)
{
    const gsize at = slot(e, op->unit, op->micro);
    void *whole = e->buffers[e->ckpt_buffer[at]];
    const uint64_t elems = real_gpt_checkpoint_bytes(&e->dims) / sizeof(RealBf16);
    if (op->elems != elems)
        return fail(error, "the schedule gathers %" G_GUINT64_FORMAT " elements of block %d's "
                    "checkpoint; its input has %" G_GUINT64_FORMAT, op->elems, op->unit, elems);
    if (!e->ckpt_host)
        e->be->copy(e->be, block_input_slice(e, whole), e->buffers[e->ckpt_slice[at]],
                    e->ckpt_slice_bytes);
    return real_tp_gather_checkpoint(e->cfg.tp, whole, e->ckpt_slice_bytes / sizeof(RealBf16),
                                     error);
}

static gboolean do_collective(RealEngine *e, const ZpOp *op, GError **error)
{
    /* A tensor group's all-gather of a block (not the head's logits): Pa's. */
    if (op->group == ZP_GROUP_TP && e->cfg.tp && op->sub == ZP_COLL_ALLGATHER &&
        op->unit >= 1 && op->unit <= e->L)
        return gather_checkpoint(e, op, error);
    if (op->group == ZP_GROUP_TP && e->cfg.tp)
        return real_tp_collective(e->cfg.tp, op, error);
    if (op->sub == ZP_COLL_ALLTOALL) /* qgZ: the node's op does both (qgz_node_op) */
        return op->group == ZP_GROUP_NODE ? qgz_node_op(e, op, error) : TRUE;
    if (e->ds)
        return real_ds_collective(e->ds, op, error);
    if (op->group != ZP_GROUP_DP && op->group != ZP_GROUP_HPZ)
        return fail(error, "zreal has no qgZ's node groups");
    if (op->sub == ZP_COLL_ALLGATHER)
        return gather(e, op, error);
    if (e->stage == 3)
        return reduce_units(e, op, error);
    return reduce_flat(e, op, error) && (e->gip_id < 0 || copy_grads_in_partition(e, op, error));
}

/* ---- offload transfers ------------------------------------------------------------------ */

/* The op a transfer chain hangs off (its first dependencies, past other transfers): the
 * bucket's collective for gradients, the gathered buffer's alloc for parameters. */
static const ZpOp *transfer_origin(const RealEngine *e, const ZpOp *op)
{
    while (op && op->kind == ZP_OP_TRANSFER)
        op = op->n_deps ? zp_sched_op(e->s, zp_sched_deps(e->s, op)[0]) : NULL;
    return op;
}

/* One slice of this rank's reduced gradients of a bucket: down to the host (d2h), the
 * host's sum up and added (h2d, later micro-steps), or out to NVMe (nvme_write). */
static gboolean grad_slice(RealEngine *e, const ZpOp *op, RealBf16 *dev, uint64_t at, uint64_t n,
                           GError **error)
{
    switch ((ZpTransferKind)op->sub) {
    case ZP_XFER_D2H:
        return real_offload_grads_down(e->offload, dev, at, n, error);
    case ZP_XFER_H2D:
        return real_offload_grads_up_add(e->offload, dev, at, n, error);
    case ZP_XFER_NVME_WRITE:
        return real_offload_grads_out(e->offload, at, n, error);
    default:
        return fail(error, "zreal reads no gradients from NVMe during backward");
    }
}

/* This rank's reduced slices of the bucket `coll` reduced: stage 1 in the full gradients,
 * stage 2 at the head of the bucket (its reduce-scatter's share), stage 3 at the head of
 * each unit's padded part of the bucket. */
static gboolean grad_transfer(RealEngine *e, const ZpOp *op, const ZpOp *coll, GError **error)
{
    const uint64_t lo = MAX(coll->elem_offset, e->part_base);
    const uint64_t hi = MIN(coll->elem_offset + coll->elems, e->part_base + e->opt_elems);
    if (e->stage == 1)
        return hi <= lo || grad_slice(e, op, e->grads + lo, lo - e->part_base, hi - lo, error);
    if (e->stage == 2)
        return hi <= lo || grad_slice(e, op, e->buffers[coll->buffer], lo - e->part_base,
                                      hi - lo, error);
    for (int u = 0; u < e->s->n_units; u++)
        if (e->s->unit_offset[u] >= coll->elem_offset &&
            e->s->unit_offset[u] < coll->elem_offset + coll->elems &&
            !grad_slice(e, op, e->unit_grads[u], e->part_off[u], unit_padded(e, u) / (uint64_t)e->dp,
                        error))
            return FALSE;
    return TRUE;
}

gboolean real_engine_ckpt_host_stats(const RealEngine *e, RealAllocStats *host,
                                     double *down_bytes, double *up_bytes)
{
    if (!e->ckpt_host)
        return FALSE;
    real_zeror_stats(e->ckpt_host, host, down_bytes, up_bytes);
    return TRUE;
}

/* Stage 3 with offload_param: unit u's slice from NVMe into the pool, then up into its place
 * in the gathered buffer. */
static gboolean param_transfer(RealEngine *e, const ZpOp *op, const ZpOp *alloc, GError **error)
{
    const uint64_t n = unit_padded(e, op->unit) / (uint64_t)e->dp;
    if (op->sub == ZP_XFER_NVME_READ)
        return real_offload_param_read(e->offload, e->part_off[op->unit], n, 0, error);
    if (op->sub != ZP_XFER_H2D || !e->buffers[alloc->buffer])
        return fail(error, "a parameter fetch moves a slice from NVMe and up, nothing else");
    real_offload_param_fetch(e->offload, (RealBf16 *)e->buffers[alloc->buffer] + e->rank * n,
                             e->part_off[op->unit], n, 0);
    return TRUE;
}

/* The schedule's transfers: around the CPU step (unit -1: states in from NVMe, states and
 * parameters out, the 16-bit partition up), gradient slices after their bucket's reduction,
 * parameter slices before their gather. */
static gboolean do_transfer(RealEngine *e, const ZpOp *op, GError **error)
{
    if (op->unit < 0) {
        switch ((ZpTransferKind)op->sub) {
        case ZP_XFER_NVME_READ:
            return real_offload_states_in(e->offload, error);
        case ZP_XFER_NVME_WRITE:
            return real_offload_states_out(e->offload, error);
        case ZP_XFER_H2D:
            real_offload_params_up(e->offload, e->params + e->part_base);
            return TRUE;
        default:
            return fail(error, "nothing goes down to the host after the step");
        }
    }
    const ZpOp *origin = transfer_origin(e, op);
    if (origin && origin->kind == ZP_OP_COLLECTIVE)
        return e->ds ? real_ds_grad_transfer(e->ds, op, origin, e->offload, error)
                     : grad_transfer(e, op, origin, error);
    if (origin && origin->kind == ZP_OP_ALLOC && e->host_params)
        return e->ds ? real_ds_param_transfer(e->ds, op, origin, e->offload, error)
                     : param_transfer(e, op, origin, error);
    return fail(error, "zreal moves gradients after their reduction and parameters before "
                       "their gather, nothing else");
}

gboolean real_engine_offload_stats(const RealEngine *e, RealAllocStats *host,
                                   double moved[ZP_XFER_N], double *direct_bytes)
{
    if (!e->offload)
        return FALSE;
    real_offload_stats(e->offload, host, moved, direct_bytes);
    return TRUE;
}

const char *real_engine_nvme_note(const RealEngine *e)
{
    return e->offload ? real_offload_nvme_note(e->offload) : NULL;
}

/* ---- the step ---------------------------------------------------------------------------- */

/* "block_fwd", "allgather", "buckets": what an op does, for messages. */
static const char *op_sub_name(const ZpOp *op)
{
    switch ((ZpOpKind)op->kind) {
    case ZP_OP_COMPUTE:
        return zp_sched_compute_name((ZpComputeKind)op->sub);
    case ZP_OP_COLLECTIVE:
        return zp_sched_coll_name((ZpCollKind)op->sub);
    case ZP_OP_P2P:
        return op->sub == ZP_P2P_SEND_NEXT   ? "activations"
               : op->sub == ZP_P2P_SEND_PREV ? "gradients"
                                             : "tied embedding gradients";
    default:
        return zp_sched_mem_name((ZpMemCategory)op->sub);
    }
}

/* A step's gradients start fresh where the engine keeps them whole (stages 0-1): backward's
 * first write of each tensor stores it, as autograd's into the .grad that DeepSpeed's
 * zero_grad set to None, with no pass that zeroes them (their padding was zeroed once). A
 * partition (stages 2-3) is stored by the first micro-step's reductions
 * (real_engine_deliver), and buffers the schedule takes start fresh when taken. */
static void start_step(RealEngine *e)
{
    if (e->grads && e->stage < 2)
        real_gpt_grads_fresh(e->gpt, -1, ALL_TENSORS);
}

/* Waits for the device (when the backend has one) and adds the step's device-timed ops. */
static gboolean finish_device_timings(RealEngine *e, GError **error)
{
    RealBackend *be = e->be;
    const char *device_error = NULL;
    if (be->synchronize && !be->synchronize(be, &device_error))
        return fail(error, "rank %d: %s", e->rank, device_error);
    for (guint i = 0; i < e->marks->len; i++) {
        const PendingMark *m = &g_array_index(e->marks, PendingMark, i);
        e->timing[m->type].total_s += be->elapsed_s(be, m->begin, m->end);
    }
    g_array_set_size(e->marks, 0);
    return TRUE;
}

/* Names the op that failed in `error`; FALSE. */
static gboolean op_failed(GError **error, guint i, const ZpOp *op)
{
    g_prefix_error(error, "op %u (%s %s, unit %d, micro-step %d): ", i,
                   zp_sched_op_kind_name((ZpOpKind)op->kind), op_sub_name(op), op->unit,
                   op->micro);
    return FALSE;
}

gboolean real_engine_step(RealEngine *e, uint64_t step, double *loss_out, GError **error)
{
    const ZpSchedule *s = e->s;
    e->step = step;
    e->loss_sum = 0;
    g_array_set_size(e->marks, 0); /* a failed step leaves marks: the backend frees them */
    start_step(e);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->stage != (uint32_t)s->view_stage) /* another pipeline stage's */
            continue;
        /* What the op waits for from other stages arrives first (untimed: the bubble), a
         * tied embedding's gradient added to this stage's. */
        RealBf16 *tied = NULL;
        size_t n_tied = 0;
        if (e->cfg.pipe && (!real_pipe_receive(e->cfg.pipe, s, op, e->x, e->dx, error) ||
                            (real_pipe_waits_tied(s, op) &&
                             !(tied_grads(e, &tied, &n_tied, error) &&
                               real_pipe_receive_tied(e->cfg.pipe, s, op, tied, n_tied, e->x,
                                                      e->dx, error)))))
            return op_failed(error, i, op);
        const double t0 = zp_now_s();
        const gboolean timed = op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_COLLECTIVE;
        void *begin = timed && e->be->mark ? e->be->mark(e->be) : NULL;
        gboolean ok = TRUE;
        int type = -1;
        switch ((ZpOpKind)op->kind) {
        case ZP_OP_ALLOC:
            ok = do_alloc(e, i, op, error);
            break;
        case ZP_OP_FREE:
            ok = do_free(e, op, error);
            break;
        case ZP_OP_COMPUTE:
            type = op->sub;
            ok = do_compute(e, op, error);
            break;
        case ZP_OP_COLLECTIVE:
            type = ZP_COMP_N + op->sub;
            ok = do_collective(e, op, error);
            break;
        case ZP_OP_P2P: /* only in pipeline schedules, whose stages have a pipe */
            ok = !e->cfg.pipe ? fail(error, "a pipeline send in a schedule without stages")
                 : op->sub == ZP_P2P_TIED
                     ? tied_grads(e, &tied, &n_tied, error) &&
                           real_pipe_send_tied(e->cfg.pipe, s, op, tied, n_tied, error)
                     : real_pipe_send(e->cfg.pipe, s, op, e->x, e->dx, error);
            break;
        case ZP_OP_TRANSFER:
            ok = do_transfer(e, op, error);
            break;
        }
        if (!ok)
            return op_failed(error, i, op);
        if (type >= 0) {
            e->timing[type].count++;
            if (begin) {
                const PendingMark m = {type, begin, e->be->mark(e->be)};
                g_array_append_val(e->marks, m);
            } else {
                e->timing[type].total_s += zp_now_s() - t0;
            }
        }
    }
    if (!finish_device_timings(e, error) || (e->cfg.tp && !real_tp_settled(e->cfg.tp, error)))
        return FALSE;
    double loss = e->loss_sum / s->plan.grad_accum;
    if (!e->comm->allreduce_host_f64(e->comm, &loss, 1, error)) {
        g_prefix_error(error, "the step's loss all-reduce: ");
        return FALSE;
    }
    *loss_out = loss / e->dp;
    return TRUE;
}

void real_engine_reset_timings(RealEngine *e)
{
    memset(e->timing, 0, sizeof e->timing);
}

void real_engine_timings(const RealEngine *e, RealOpTiming out[REAL_ENGINE_N_OP_TYPES])
{
    memcpy(out, e->timing, sizeof e->timing);
}

const char *real_engine_op_type_name(int type)
{
    return type < ZP_COMP_N ? zp_sched_compute_name((ZpComputeKind)type)
                            : zp_sched_coll_name((ZpCollKind)(type - ZP_COMP_N));
}
