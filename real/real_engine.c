/* real_engine: executes the schedule op by op. Everything a stage decides — what is
 * partitioned, when buckets are reduced, what is gathered and freed — comes from the ops;
 * the engine only maps each op onto model calls, backend buffers and collectives. */
#include "real_engine_internal.h"
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

#include <string.h>

G_STATIC_ASSERT((int)REAL_MEM_N_CATEGORIES == (int)ZP_MEM_N);
G_STATIC_ASSERT((int)REAL_GPT_NO_BIAS_QKV == (int)ZP_NO_BIAS_QKV &&
                (int)REAL_GPT_NO_BIAS_PROJ == (int)ZP_NO_BIAS_PROJ &&
                (int)REAL_GPT_NO_BIAS_MLP == (int)ZP_NO_BIAS_MLP);

/* One op timed on the backend's device clock: read after the step's last op, so that
 * timing does not make the host wait for the device op by op. */
typedef struct {
    int type;
    void *begin, *end;
} PendingMark;

/* ---- set-up ------------------------------------------------------------------------------ */

static gboolean check_schedule(const ZpSchedule *s, const RealTrainConfig *cfg, GError **error)
{
    if (s->plan.mp != (cfg->tp ? real_tp_size(cfg->tp) : 1))
        return fail(error, "the schedule's tensor-parallel degree is %d, the tensor group's %d "
                    "(zreal --mp)", s->plan.mp, cfg->tp ? real_tp_size(cfg->tp) : 1);
    if (s->plan.sequence_parallel)
        return fail(error, "zreal executes tensor parallelism without sequence parallelism");
    /* zreal computes in bf16 only (RealBf16 storage, no fp16 loss scaling): an fp16 plan run
     * in bf16 would be measured under the schedule's name for another numeric format. */
    if (s->plan.precision != ZP_PREC_BF16 || s->plan.optimizer != ZP_OPT_ADAM)
        return fail(error, "zreal trains in bf16 with Adam; the schedule's plan has %s, %s "
                    "(build it with zplan schedule --precision bf16)",
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
    /* real_gpt's heads are hidden / heads wide (RealGptDims has no head dimension of its own)
     * and its blocks have no q/k norms: a Qwen3-like model is planned, not run. */
    if (m->head_dim > 0 || m->qk_norm)
        return fail(error, "zreal runs heads of hidden / heads without q/k norms; %s has "
                           "head_dim %" G_GINT64_FORMAT "%s", m->name, zp_model_head_dim(m),
                    m->qk_norm ? " and q/k norms" : "");
    if (m->rope_scaling.type == ZP_ROPE_SCALING_OTHER)
        return fail(error, "zreal rescales rotary embeddings linearly or as Llama 3.1 does "
                           "(\"linear\", \"llama3\"), not \"%s\" as %s does",
                    m->rope_scaling.name, m->name);
    if (real_ds_applies(s) && s->plan.zero.zero_quantized_gradients && zp_offload_any(&s->plan))
        return fail(error, "zreal executes DeepSpeed's qgZ (zero_quantized_gradients) without "
                           "offload");
    if (s->plan.reduce_dtype != ZP_REDUCE_GRAD && s->plan.reduce_dtype != ZP_REDUCE_BF16 &&
        !real_engine_fw_find(s)) /* a plug-in checks its own (Megatron's fp32 main_grad) */
        return fail(error, "zreal reduces gradients in bf16, their own dtype; the plan says %s",
                    zp_reduce_dtype_name(s->plan.reduce_dtype));
    return TRUE;
}

/* What a framework's plug-in (real_engine_fw.h) executes: data and tensor parallelism, on the
 * GPU. */
static gboolean check_plugin(const ZpSchedule *s, const RealFwOps *fw, GError **error)
{
    if (s->stages > 1 || zp_offload_any(&s->plan))
        return fail(error, "zreal executes --impl %s with data and tensor parallelism (no "
                    "pipeline, no offload)", fw->name);
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
    if (e->fw_ops) { /* the plug-in lays the states out */
        const RealFwEnv env = {s, e->be, e->comm, e->gpt, e->buffers};
        return (e->fw = e->fw_ops->create(&env, error)) != NULL;
    }
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
    if (e->fw && hpz > 1 && !e->fw_ops->hpz)
        return fail(error, "zreal executes --impl %s without hpZ's groups", e->fw_ops->name);
    /* a state, unless the schedule takes each block's op by op (ZpImpl secondary_per_block) */
    const gboolean state = !zp_impl_get(e->s->plan.impl)->secondary_per_block;
    for (int u = 0; state && hpz > 1 && u < e->s->n_units; u++)
        if (!is_persistent(e, u) &&
            !(e->secondary[u] = take(e, unit_padded(e, u) / (uint64_t)hpz * sizeof(RealBf16),
                                     ZP_MEM_SECONDARY_PARAMS, error)))
            return FALSE;
    if (e->fw && hpz > 1) /* the plug-in fills and reads them */
        return e->fw_ops->hpz(e->fw, e->hpz_comm, e->secondary, error);
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
    /* Past the schedule's unit, padding: zeros (real_gpt's unit goes on with a sparse block's
     * experts, which the expert space holds). */
    const uint64_t end = e->s->unit_elems[u];
    const uint64_t drawn = first < end ? MIN(count, end - first) : 0;
    RealBf16 *host = g_new0(RealBf16, MAX(count, 1));
    gboolean ok = drawn == 0 || init_host(e, u, first, drawn, host, error);
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
    if (e->fw)
        return e->fw_ops->init_params(e->fw, init_ds_range, e, error);
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
    const RealFwOps *fw_ops = real_engine_fw_find(s);
    if (fw_ops && !check_plugin(s, fw_ops, error))
        return NULL;
    RealEngine *e = g_new0(RealEngine, 1);
    e->s = s, e->be = be, e->comm = comm, e->cfg = *cfg;
    e->fw_ops = fw_ops;
    e->stage = s->plan.zero.stage, e->dp = s->plan.dp, e->rank = comm->rank;
    e->L = (int)s->model.layers;
    e->dims = real_engine_dims(&s->model, &s->plan);
    e->dims.tp_rank = cfg->tp ? real_tp_rank(cfg->tp) : 0;
    /* A tied model's last pipeline stage holds the head's own copy of wte (zp_sched's
     * held_elems), kept equal to the first stage's by their ZP_P2P_TIED exchange. */
    if (s->model.tied_embeddings && s->stages > 1 && s->unit_elems[0] == 0 &&
        s->unit_elems[e->L + 1] > 0)
        e->dims.untied = e->dims.tied_copy = true;
    /* the experts' groups set ep_rank; all before b s sizes anything */
    if (!real_engine_moe_groups(e, error) || !real_gpt_dims_check(&e->dims, error)) {
        real_engine_moe_free(e);
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
    /* (a sparse unit's experts live in the expert space: the rest is the schedule's unit) */
    for (int u = 0; ok && u < s->n_units; u++)
        if (s->unit_elems[u] > 0 && real_gpt_unit_elems(&e->dims, u) !=
                                        s->unit_elems[u] + zp_sched_unit_expert_elems(s, u))
            ok = fail(error, "unit %d: the schedule has %" G_GUINT64_FORMAT " elements, the "
                             "model %zu", u, s->unit_elems[u] + zp_sched_unit_expert_elems(s, u),
                      real_gpt_unit_elems(&e->dims, u));
    ok = ok && allocate_states(e, error) && real_engine_moe_states(e, error) &&
         setup_zeropp(e, error) &&
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
    if (e->fw)
        e->fw_ops->destroy(e->fw);
    real_zeror_free(e->ckpt_host);
    real_engine_moe_free(e);
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
    if (e->fw && e->fw_ops->start_step)
        e->fw_ops->start_step(e->fw);
    real_engine_moe_start_step(e);
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
                             !(real_engine_tied_grads(e, &tied, &n_tied, error) &&
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
            ok = real_engine_do_alloc(e, i, op, error);
            break;
        case ZP_OP_FREE:
            ok = real_engine_do_free(e, op, error);
            break;
        case ZP_OP_COMPUTE:
            type = op->sub;
            ok = real_engine_do_compute(e, op, error);
            break;
        case ZP_OP_COLLECTIVE:
            type = ZP_COMP_N + op->sub;
            ok = real_engine_do_collective(e, op, error);
            break;
        case ZP_OP_P2P: /* only in pipeline schedules, whose stages have a pipe */
            ok = !e->cfg.pipe ? fail(error, "a pipeline send in a schedule without stages")
                 : op->sub == ZP_P2P_TIED
                     ? real_engine_tied_grads(e, &tied, &n_tied, error) &&
                           real_pipe_send_tied(e->cfg.pipe, s, op, tied, n_tied, error)
                     : real_pipe_send(e->cfg.pipe, s, op, e->x, e->dx, error);
            break;
        case ZP_OP_TRANSFER:
            ok = real_engine_do_transfer(e, op, error);
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
