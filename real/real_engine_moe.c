/* real_engine_moe: a mixture of experts in the engine — the EP and expert-data-parallel groups,
 * the expert space's states (ZeRO over dp / EP), and a sparse block's ops between its own. */
#include "real_engine_internal.h"
#include "real_engine.h"
#include "real_gpt.h"
#include "real_engine_ds.h"
#include "real_engine_fw.h"
#include "zp_mem.h"
#include "zp_offload.h"

#include <string.h>

/* Where a sparse block's ops stand: the block forward routed (its run open), dispatched, the
 * experts done, combined; backward likewise from unpermute's backward. */
typedef enum { MOE_IDLE, MOE_ROUTED, MOE_DISPATCHED, MOE_EXPERTS, MOE_COMBINED } MoeState;

struct RealEngineMoe {
    RealComm *ep, *edp; /* EP consecutive dp ranks; the dp / EP ranks EP apart */
    int ep_rank, edp_rank;
    ZpSchedExperts x;    /* the expert space (zp_sched.h) */
    uint64_t *part_off;  /* stage 3: unit u's slice in the partition */
    RealBf16 *params, *grads;
    float *master, *adam_m, *adam_v;
    uint64_t opt_elems, part_base; /* the optimizer's elements, from part_base of params */
    uint64_t grad_base;            /* and of the gradients */
    RealBf16 **gathered; /* stage 3: unit u's experts gathered over the EDP group */
    int gather_id;       /* an alloc's buffer the next EDP gather fills, -1 none */
    /* The EP buffers of the sparse block under way: each alloc alternates, the first of a
     * pair what is dispatched, the second what the experts write and is combined; each holds
     * a send half and a receive half of real_moe_a2a_elems. */
    int in_id, out_id;
    unsigned allocs;
    /* From stage 2 with dp / EP > 1: the bucket a unit's unreduced expert gradients land in
     * (the buffer an EDP reduce-scatter names), -1 none; which buffer ids are such buckets. */
    int bucket_id, bucket_unit;
    gboolean *edp_bucket;
    /* ZpImpl experts_in_buckets (DeepSpeed's stage 2): the expert gradients land in the
     * DeepSpeed plug-in's ipg buckets (real_ds_expert_grads) */
    gboolean in_ipg;
    int micro; /* the sparse block under way's micro-step */
    gboolean scattered; /* the expert gradients kept as the EDP partition (from stage 2, and
                         * DeepSpeed's stage 1: zp_build_moe_grads_partitioned) */
    MoeState state;
    int unit;
    gboolean backward, recompute; /* the block under way: its backward; a recomputed forward */
};

static RealEngineMoe *moe_of(const RealEngine *e)
{
    return e->moe;
}

gboolean real_engine_moe_sparse(const RealEngine *e, int u)
{
    return e->moe && zp_sched_unit_expert_elems(e->s, u) > 0;
}

/* ---- groups and states ----------------------------------------------------------------- */

/* What zreal's sparse block does not run: checked before the groups are made. */
static gboolean check_moe(const RealEngine *e, GError **error)
{
    const ZpSchedule *s = e->s;
    const ZpMoe *moe = &s->model.moe;
    if (zp_mla_enabled(&s->model.mla) || moe->shared_experts > 0 || moe->shared_ffn > 0 ||
        moe->router_bias || zp_moe_sparse_layers(moe, s->model.layers) != s->model.layers)
        return fail(error, "zreal runs mixtures of experts whose every layer is sparse, without "
                           "shared experts, a router bias or latent attention (%s)",
                    s->model.name);
    if (!(s->plan.experts.capacity_factor > 0))
        return fail(error, "zreal routes with a capacity factor (DeepSpeed's fixed [E, C, h] "
                           "all-to-all, --capacity-factor); dropless routing's buffers follow "
                           "the router");
    if (real_engine_fw_find(s) || zp_offload_any(&s->plan) || s->stages > 1 || s->plan.mp > 1 ||
        s->plan.zero.zero_quantized_weights || s->plan.zero.zero_quantized_gradients ||
        s->plan.zero.zero_hpz_partition_size > 1 || s->plan.ckpt.cpu_checkpointing)
        return fail(error, "zreal runs a mixture of experts under --impl paper or deepspeed "
                           "only, without offload, pipelines, tensor parallelism, ZeRO++ or "
                           "cpu_checkpointing");
    const ZpSchedExperts x = zp_sched_experts(s);
    const int edp = zp_plan_edp(&s->plan);
    if (e->stage == 1 && x.padded_elems != x.total_elems)
        return fail(error, "stage 1 keeps the experts' %" G_GUINT64_FORMAT " gradients whole: "
                           "zreal needs them a multiple of the %d expert-data-parallel ranks",
                    x.total_elems, edp);
    return TRUE;
}

/* A subgroup of the data-parallel group: a split of it, or for an emulated world (which has
 * no split) an emulated group of its size. */
static RealComm *subgroup(RealEngine *e, int color, int key, int size, GError **error)
{
    if (e->comm->split)
        return e->comm->split(e->comm, color, key, error);
    if (e->comm->send) { /* a real world that cannot split: NCCL's here */
        fail(error, "the communicator cannot split into the experts' groups: zreal runs a "
                    "mixture of experts over MPI ranks or --emulate");
        return NULL;
    }
    return real_comm_emulated_new(e->be, size, key);
}

gboolean real_engine_moe_groups(RealEngine *e, GError **error)
{
    const ZpSchedule *s = e->s;
    if (!zp_moe_enabled(&s->model.moe))
        return TRUE;
    if (!check_moe(e, error))
        return FALSE;
    const int ep = zp_plan_ep(&s->plan), edp = zp_plan_edp(&s->plan);
    RealEngineMoe *m = e->moe = g_new0(RealEngineMoe, 1);
    /* DeepSpeed's deepspeed/utils/groups.py _create_expert_and_data_parallel: EP consecutive ranks
     * share the experts between them; the ranks ep apart hold the same experts. */
    m->ep_rank = e->rank % ep, m->edp_rank = e->rank / ep;
    m->gather_id = -1;
    e->dims.ep_rank = m->ep_rank;
    if (ep > 1 && !(m->ep = subgroup(e, e->rank / ep, m->ep_rank, ep, error)))
        return FALSE;
    if (edp > 1 && !(m->edp = subgroup(e, m->ep_rank, m->edp_rank, edp, error)))
        return FALSE;
    if ((m->ep && !m->ep->alltoall_bf16))
        return fail(error, "the communicator has no all-to-all for the experts' dispatch");
    return TRUE;
}

/* Draws real_gpt's elements [first, first + count) of unit u's experts, which follow its dense
 * tensors in the unit (real_gpt_dims.h), into dst; past the experts' end zeros (padding). */
static gboolean init_experts(RealEngine *e, int u, uint64_t first, uint64_t count,
                             RealBf16 *dst, GError **error)
{
    const uint64_t elems = zp_sched_unit_expert_elems(e->s, u);
    const uint64_t drawn = first < elems ? MIN(count, elems - first) : 0;
    RealBf16 *host = g_new0(RealBf16, MAX(count, 1));
    gboolean ok = drawn == 0 ||
                  real_gpt_init_params_range(&e->dims, e->cfg.seed, u,
                                             e->s->unit_elems[u] + first, drawn, host, error);
    if (ok)
        e->be->copy(e->be, dst, host, count * sizeof(RealBf16));
    g_free(host);
    return ok;
}

gboolean real_engine_moe_states(RealEngine *e, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    if (!m)
        return TRUE;
    const ZpSchedule *s = e->s;
    const int edp = m->edp ? m->edp->size : 1;
    m->x = zp_sched_experts(s);
    const uint64_t total = m->x.total_elems, padded = m->x.padded_elems;
    const uint64_t part = m->x.partition_elems;
    /* zp_sched's expert states (zp_build_moe_states): parameters whole below stage 3,
     * gradients whole below stage 2, the optimizer's partition from stage 1. */
    /* Stage 1 keeps the expert gradients whole (the paper's) or as the partition (DeepSpeed's
     * grads_in_partition), as the schedule reduces them: all-reduced or reduce-scattered over
     * EDP (with one EDP rank the two agree). */
    m->scattered = e->stage >= 2;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        m->scattered |= op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_EDP &&
                        op->unit >= 0 && op->buffer >= 0 &&
                        (op->sub == ZP_COLL_REDUCE_SCATTER || op->sub == ZP_COLL_ALLREDUCE);
    }
    const uint64_t params[4] = {total, padded, padded, part};
    const uint64_t grads[4] = {total, m->scattered ? part : total, part, part};
    const size_t b2 = sizeof(RealBf16), f4 = sizeof(float);
    m->opt_elems = e->stage == 0 ? total : part;
    /* Below stage 2 the schedule reduces only at the last micro-step: the earlier ones' expert
     * gradients would need the whole space, which a partition does not hold. */
    if (e->stage == 1 && m->scattered && s->plan.grad_accum > 1)
        return fail(error, "zreal keeps DeepSpeed's stage-1 expert gradients as the partition: "
                           "run it with --grad-accum 1 (the schedule reduces them only at the "
                           "last micro-step)");
    m->part_base = e->stage == 1 || e->stage == 2 ? (uint64_t)m->edp_rank * part : 0;
    m->grad_base = e->stage == 1 && !m->scattered ? m->part_base : 0;
    if (!(m->params = take(e, params[e->stage] * b2, ZP_MEM_PARAMS, error)) ||
        !(m->grads = take(e, grads[e->stage] * b2, ZP_MEM_GRADS, error)) ||
        !(m->master = take(e, m->opt_elems * f4, ZP_MEM_MASTER, error)) ||
        !(m->adam_m = take(e, m->opt_elems * f4, ZP_MEM_ADAM_M, error)) ||
        !(m->adam_v = take(e, m->opt_elems * f4, ZP_MEM_ADAM_V, error)))
        return FALSE;
    e->be->fill(e->be, m->params, 0, params[e->stage] * b2);
    e->be->fill(e->be, m->grads, 0, grads[e->stage] * b2);
    e->be->fill(e->be, m->adam_m, 0, m->opt_elems * f4);
    e->be->fill(e->be, m->adam_v, 0, m->opt_elems * f4);
    m->part_off = g_new0(uint64_t, s->n_units);
    m->gathered = g_new0(RealBf16 *, s->n_units);
    m->bucket_id = m->bucket_unit = -1;
    m->edp_bucket = g_new0(gboolean, MAX(e->n_buffers, 1));
    m->in_ipg = e->ds && zp_impl_experts_in_buckets(s);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_EDP && op->buffer >= 0 &&
            op->buffer < e->n_buffers && !m->in_ipg)
            m->edp_bucket[op->buffer] = TRUE;
    }
    for (int u = 0, off = 0; u < s->n_units; u++) {
        const uint64_t elems = zp_sched_unit_expert_elems(s, u);
        if (elems == 0)
            continue;
        const uint64_t slice = zp_mem_padded_elems(elems, (uint64_t)edp) / (uint64_t)edp;
        m->part_off[u] = (uint64_t)off;
        off += (int)slice;
        const gboolean ok =
            e->stage < 3
                ? init_experts(e, u, 0, elems, m->params + zp_sched_unit_expert_offset(s, u),
                               error)
                : init_experts(e, u, (uint64_t)m->edp_rank * slice, slice,
                               m->params + m->part_off[u], error);
        if (!ok)
            return FALSE;
    }
    e->be->bf16_to_f32(e->be, m->master, m->params + m->part_base, m->opt_elems);
    real_gpt_set_ep(e->gpt, m->ep);
    real_gpt_moe_set_split(e->gpt, true);
    return TRUE;
}

void real_engine_moe_free(RealEngine *e)
{
    RealEngineMoe *m = moe_of(e);
    if (!m)
        return;
    void *states[] = {m->params, m->grads, m->master, m->adam_m, m->adam_v};
    for (size_t i = 0; i < G_N_ELEMENTS(states); i++)
        e->be->free(e->be, states[i]);
    RealComm *groups[] = {m->ep, m->edp};
    for (size_t i = 0; i < G_N_ELEMENTS(groups); i++)
        if (groups[i])
            groups[i]->destroy(groups[i]);
    g_free(m->part_off);
    g_free(m->gathered);
    g_free(m->edp_bucket);
    g_free(m);
    e->moe = NULL;
}

gboolean real_engine_has_experts(const RealEngine *e)
{
    return e->moe != NULL;
}

double real_engine_moe_sent_bytes(const RealEngine *e, ZpGroup group)
{
    const RealEngineMoe *m = moe_of(e);
    const RealComm *c = !m ? NULL : group == ZP_GROUP_EP ? m->ep : group == ZP_GROUP_EDP ? m->edp
                                                                                     : NULL;
    return c ? c->sent_bytes : 0;
}

/* ---- views ------------------------------------------------------------------------------- */

/* Where unit u's experts lie in the expert space: their parameters or gradients (NULL at stage
 * 3 before their gather: the block's own ops, which read no experts). */
static RealBf16 *experts_at(RealEngine *e, int u, gboolean grads)
{
    RealEngineMoe *m = moe_of(e);
    const ZpSchedule *s = e->s;
    if (grads && m->bucket_unit == u && m->bucket_id >= 0) /* from stage 2, dp / EP > 1 */
        return e->buffers[m->bucket_id];
    if (grads && m->in_ipg) /* handed on to their ipg bucket by the experts' backward */
        return m->backward && m->unit == u &&
                       (m->state == MOE_ROUTED || m->state == MOE_DISPATCHED)
                   ? real_ds_expert_grads(e->ds, zp_sched_unit_expert_offset(s, u),
                                          zp_sched_unit_expert_elems(s, u), m->micro, NULL)
                   : NULL;
    if (grads) /* whole below stage 2; from stage 2 at EP = dp the partition is the whole
                * unit, laid out as stage 3's slices or stage 2's flat range */
        return m->grads + (e->stage < 3 ? zp_sched_unit_expert_offset(s, u) : m->part_off[u]);
    if (e->stage < 3)
        return m->params + zp_sched_unit_expert_offset(s, u);
    return m->edp ? m->gathered[u] : m->params + m->part_off[u];
}

/* real_gpt's unit: its dense tensors, then the experts' (fc1.experts, fc2.experts); the
 * experts' slots of v set from the expert space, the others from `dense` unless it is NULL
 * (the DeepSpeed plug-in's view, which holds the dense tensors where DeepSpeed lays them). */
static void fill_view(RealEngine *e, int u, const RealBf16 *dense, gboolean grads,
                      RealGptTensors *v)
{
    RealBf16 *experts = experts_at(e, u, grads);
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    const int n = real_gpt_unit_tensors(&e->dims, u, t);
    const uint64_t dense_elems = e->s->unit_elems[u];
    for (int k = 0; k < n; k++) {
        if (t[k].offset_elems >= dense_elems)
            v->at[k] = experts ? experts + (t[k].offset_elems - dense_elems) : NULL;
        else if (dense)
            v->at[k] = (RealBf16 *)dense + t[k].offset_elems;
    }
}

gboolean real_engine_moe_view(RealEngine *e, int u, const RealBf16 *dense, gboolean grads,
                              RealGptTensors *v, GError **error)
{
    (void)error;
    memset(v, 0, sizeof *v);
    fill_view(e, u, dense, grads, v);
    return TRUE;
}

void real_engine_moe_view_experts(RealEngine *e, int u, gboolean grads, RealGptTensors *v)
{
    if (real_engine_moe_sparse(e, u))
        fill_view(e, u, NULL, grads, v);
}

/* Whether a view holds unit u's experts (stage 3: gathered before their op). */
static gboolean experts_ready(RealEngine *e, int u, const RealGptTensors *v, GError **error)
{
    const uint32_t bits = real_engine_moe_expert_tensors(e, u);
    for (int k = 0; k < REAL_GPT_MAX_UNIT_TENSORS; k++)
        if ((bits >> k & 1u) && !v->at[k])
            return fail(error, "rank %d: unit %d's experts are used but were not gathered",
                        e->rank, u);
    return TRUE;
}

/* ---- allocs, collectives ------------------------------------------------------------------ */

static uint64_t a2a_elems(const RealEngine *e)
{
    const RealMoeDims d = real_gpt_moe_dims(&e->dims);
    return real_moe_a2a_elems(&d);
}

gboolean real_engine_moe_alloc(RealEngine *e, guint index, const ZpOp *op, gboolean *handled,
                               GError **error)
{
    RealEngineMoe *m = moe_of(e);
    const ZpSchedule *s = e->s;
    *handled = FALSE;
    if (!m)
        return TRUE;
    const ZpOp *next = index + 1 < s->ops->len ? zp_sched_op(s, index + 1) : NULL;
    const gboolean gather = op->sub == ZP_MEM_GATHERED_PARAMS && next &&
                            next->kind == ZP_OP_COLLECTIVE && next->group == ZP_GROUP_EDP &&
                            next->sub == ZP_COLL_ALLGATHER;
    const gboolean bucket = op->sub == ZP_MEM_BUCKETS && op->buffer >= 0 &&
                            op->buffer < e->n_buffers && m->edp_bucket[op->buffer];
    if (bucket && op->unit < 0) { /* a flattened copy all-reduced after the backward */
        *handled = TRUE;
        if (op->bytes > (double)(m->x.total_elems * sizeof(RealBf16)))
            return fail(error, "schedule op %u: a copy of %.0f bytes of %" G_GUINT64_FORMAT
                        " expert gradients", index, op->bytes, m->x.total_elems);
        return (e->buffers[op->buffer] = take(e, (uint64_t)op->bytes, op->sub, error)) != NULL;
    }
    if (bucket) { /* a unit's unreduced expert gradients: fresh, the padding zero */
        *handled = TRUE;
        const uint64_t elems = zp_sched_unit_expert_elems(s, op->unit);
        const uint64_t edp = (uint64_t)(m->edp ? m->edp->size : 1);
        const uint64_t need =
            (e->stage == 3 ? zp_mem_padded_elems(elems, edp) : elems) * sizeof(RealBf16);
        if ((double)need != op->bytes)
            return fail(error, "schedule op %u: an expert gradient bucket of %.0f bytes; unit "
                        "%d's experts need %" G_GUINT64_FORMAT, index, op->bytes, op->unit, need);
        RealBf16 *p = e->buffers[op->buffer] = take(e, need, op->sub, error);
        if (!p)
            return FALSE;
        e->be->fill(e->be, p + elems, 0, need - elems * sizeof(RealBf16));
        real_gpt_grads_fresh(e->gpt, op->unit, real_engine_moe_expert_tensors(e, op->unit));
        m->bucket_id = op->buffer, m->bucket_unit = op->unit;
        return TRUE;
    }
    if (op->sub != ZP_MEM_EP_BUFFERS && !gather)
        return TRUE;
    *handled = TRUE;
    const uint64_t need =
        gather ? zp_mem_padded_elems(zp_sched_unit_expert_elems(s, op->unit),
                                     (uint64_t)(m->edp ? m->edp->size : 1)) * sizeof(RealBf16)
               : 2 * a2a_elems(e) * sizeof(RealBf16); /* a send and a receive half */
    if ((double)need != op->bytes)
        return fail(error, "schedule op %u: a %s buffer of %.0f bytes; the engine needs %"
                    G_GUINT64_FORMAT, index, zp_sched_mem_name(op->sub), op->bytes, need);
    if (!(e->buffers[op->buffer] = take(e, need, op->sub, error)))
        return FALSE;
    if (gather)
        m->gather_id = op->buffer;
    else if (m->allocs++ % 2 == 0)
        m->in_id = op->buffer;
    else
        m->out_id = op->buffer;
    return TRUE;
}

void real_engine_moe_freed(RealEngine *e, const void *p)
{
    RealEngineMoe *m = moe_of(e);
    for (int u = 0; m && u < e->s->n_units; u++)
        if (m->gathered[u] == p)
            m->gathered[u] = NULL;
    if (m && m->bucket_id >= 0 && e->buffers[m->bucket_id] == p)
        m->bucket_id = m->bucket_unit = -1;
}

/* From stage 2: a unit's expert gradient bucket reduce-scattered over the EDP group and this
 * rank's share delivered into its partition (stored at micro-step 0, added after): at stage 3
 * the unit's own padded slices, at stage 2 the part of the unit's range in the flat
 * partition [q P, (q + 1) P) of each rank q. */
static gboolean reduce_experts(RealEngine *e, const ZpOp *op, RealBf16 *bucket, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    if (!bucket)
        return fail(error, "rank %d: unit %d's expert gradients are reduced from no bucket",
                    e->rank, op->unit);
    const int n = m->edp->size;
    const uint64_t lo = op->elem_offset, hi = lo + op->elems, P = m->x.partition_elems;
    int *counts = g_new0(int, n);
    for (int q = 0; q < n; q++) {
        const uint64_t a = e->stage == 3 ? 0 : MAX(lo, (uint64_t)q * P);
        const uint64_t b = e->stage == 3 ? op->elems / (uint64_t)n : MIN(hi, (uint64_t)(q + 1) * P);
        counts[q] = b > a ? (int)(b - a) : 0;
    }
    const uint64_t mine = (uint64_t)counts[m->edp_rank];
    /* DeepSpeed's stages 1-2 with use_multi_rank_bucket_allreduce all-reduce the bucket and
     * keep the partition's slice (stage_1_and_2.py average_tensor -> allreduce_and_scatter);
     * a reduce-scatter leaves the rank's slice at the bucket's start. */
    uint64_t at = 0;
    gboolean ok;
    if (op->sub == ZP_COLL_ALLREDUCE) {
        for (int q = 0; q < m->edp_rank; q++)
            at += (uint64_t)counts[q];
        ok = m->edp->allreduce_bf16(m->edp, bucket, op->elems, error);
    } else {
        ok = m->edp->reduce_scatter_bf16(m->edp, bucket, counts, error);
    }
    g_free(counts);
    if (!ok || mine == 0)
        return ok;
    RealBf16 *dst = e->stage == 3 ? m->grads + m->part_off[op->unit]
                                  : m->grads + (MAX(lo, (uint64_t)m->edp_rank * P) -
                                                (uint64_t)m->edp_rank * P);
    real_engine_deliver(e->be, dst, bucket + at, mine, op->micro > 0);
    return TRUE;
}

/* A unit's own expert bucket (zp_build_moe_backward), or NULL. */
static RealBf16 *unit_bucket(RealEngine *e, const ZpOp *op)
{
    const RealEngineMoe *m = moe_of(e);
    return op->buffer >= 0 && op->buffer == m->bucket_id ? e->buffers[op->buffer] : NULL;
}

/* ZpImpl experts_in_buckets: an ipg bucket's experts, landed after its dense part as the hooks
 * copy each parameter's gradient in (stage_1_and_2.py
 * reduce_independent_p_g_buckets_and_remove_grads), reduced over the EDP group (average_tensor's
 * allreduce_and_scatter for their process group) and delivered; then the bucket's place is
 * free for the next. */
static gboolean reduce_ipg_experts(RealEngine *e, const ZpOp *op, GError **error)
{
    int k;
    RealBf16 *experts =
        real_ds_expert_region(e->ds, op->elem_offset, op->elems, op->micro, &k, error);
    return experts && reduce_experts(e, op, experts, error) &&
           real_ds_experts_reduced(e->ds, k, error);
}

/* Half h (0: send, 1: receive) of EP buffer `id`. */
static RealBf16 *half(RealEngine *e, int id, int h, GError **error)
{
    RealBf16 *p = id >= 0 && id < e->n_buffers ? e->buffers[id] : NULL;
    if (!p)
        fail(error, "rank %d: a sparse block's op with no all-to-all buffer allocated (the "
                    "schedule allocates the experts' output buffer before their op)", e->rank);
    return p ? p + (uint64_t)h * a2a_elems(e) : NULL;
}

/* The forward's permutation into the dispatch buffer's send half, once. */
static gboolean permute(RealEngine *e, const ZpOp *op, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    RealBf16 *send = half(e, m->in_id, 0, error);
    return send && real_gpt_moe_permute(e->gpt, op->unit - 1, send, error);
}

static gboolean ep_alltoall(RealEngine *e, const ZpOp *op, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    const gboolean dispatch = op->sub == ZP_COLL_EP_DISPATCH;
    const MoeState want = dispatch ? MOE_ROUTED : MOE_EXPERTS;
    if (m->state != want || op->unit != m->unit)
        return fail(error, "rank %d: an %s of unit %d out of its block's order", e->rank,
                    zp_sched_coll_name((ZpCollKind)op->sub), op->unit);
    if (!m->ep || (double)a2a_elems(e) * sizeof(RealBf16) != op->bytes)
        return fail(error, "rank %d: an all-to-all of %.0f bytes; the experts' buffers hold %"
                    G_GUINT64_FORMAT " (EP %d)", e->rank, op->bytes,
                    a2a_elems(e) * sizeof(RealBf16), m->ep ? m->ep->size : 1);
    const int id = dispatch ? m->in_id : m->out_id;
    RealBf16 *send = half(e, id, 0, error), *recv = send ? half(e, id, 1, error) : NULL;
    const RealMoeDims d = real_gpt_moe_dims(&e->dims);
    if (!recv || (dispatch && !m->backward && !permute(e, op, error)))
        return FALSE;
    m->state = dispatch ? MOE_DISPATCHED : MOE_COMBINED;
    return m->ep->alltoall_bf16(m->ep, send, recv, real_moe_a2a_elems(&d) / (uint64_t)d.ep,
                                error);
}

/* The experts' gradients reduced over the EDP group (stages 0-1: all-reduced in place; at
 * EP = dp there is no such op), or stage 3's gather of a unit's experts, or stages 1-2's of
 * the updated expert partitions. */
static gboolean edp_collective(RealEngine *e, const ZpOp *op, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    if (!m->edp)
        return fail(error, "an expert-data-parallel collective with one rank in the group");
    if ((op->sub == ZP_COLL_ALLREDUCE || op->sub == ZP_COLL_REDUCE_SCATTER) && m->in_ipg)
        return reduce_ipg_experts(e, op, error);
    if (op->sub == ZP_COLL_ALLREDUCE && !m->scattered && op->unit >= 0)
        return m->edp->allreduce_bf16(m->edp, m->grads + op->elem_offset, op->elems, error);
    if (op->sub == ZP_COLL_ALLREDUCE && m->scattered && op->unit >= 0)
        return reduce_experts(e, op, unit_bucket(e, op), error);
    if (op->sub == ZP_COLL_ALLREDUCE && !m->scattered && op->unit < 0 && op->buffer >= 0 &&
        op->buffer < e->n_buffers && e->buffers[op->buffer] &&
        op->elem_offset + op->elems <= m->x.total_elems) {
        /* DeepSpeed's stage 0 after the backward (engine.py allreduce_and_copy): the run
         * flattened into its copy, all-reduced, copied back */
        RealBf16 *copy = e->buffers[op->buffer], *grads = m->grads + op->elem_offset;
        const size_t bytes = op->elems * sizeof(RealBf16);
        e->be->copy(e->be, copy, grads, bytes);
        if (!m->edp->allreduce_bf16(m->edp, copy, op->elems, error))
            return FALSE;
        e->be->copy(e->be, grads, copy, bytes);
        return TRUE;
    }
    if (op->sub == ZP_COLL_REDUCE_SCATTER && m->scattered && op->unit >= 0)
        return reduce_experts(e, op, unit_bucket(e, op), error);
    if (op->sub == ZP_COLL_ALLGATHER && op->unit < 0 && (e->stage == 1 || e->stage == 2)) {
        const uint64_t part = m->x.partition_elems;
        return m->edp->allgather_bf16(m->edp, m->params + m->part_base, part, m->params, error);
    }
    if (op->sub == ZP_COLL_ALLGATHER && e->stage == 3 && op->unit >= 0 && m->gather_id >= 0) {
        const uint64_t n = op->elems / (uint64_t)m->edp->size;
        RealBf16 *dst = e->buffers[m->gather_id];
        m->gather_id = -1;
        m->gathered[op->unit] = dst;
        return m->edp->allgather_bf16(m->edp, m->params + m->part_off[op->unit], n, dst, error);
    }
    return fail(error, "rank %d: an expert-data-parallel %s zreal does not execute at stage %d",
                e->rank, zp_sched_coll_name((ZpCollKind)op->sub), e->stage);
}

gboolean real_engine_moe_collective(RealEngine *e, const ZpOp *op, gboolean *handled,
                                    GError **error)
{
    *handled = e->moe && (op->group == ZP_GROUP_EP || op->group == ZP_GROUP_EDP);
    if (!*handled)
        return TRUE;
    if (op->group == ZP_GROUP_EP)
        return ep_alltoall(e, op, error);
    /* The EDP group is a subgroup of dp: its bytes count in the data-parallel total too, as
     * hpZ's and qgZ's do (and as simulate's dp bytes hold them). */
    const double before = moe_of(e)->edp ? moe_of(e)->edp->sent_bytes : 0;
    const gboolean ok = edp_collective(e, op, error);
    if (moe_of(e)->edp)
        e->comm->sent_bytes += moe_of(e)->edp->sent_bytes - before;
    return ok;
}

/* ---- a sparse block's compute ops --------------------------------------------------------- */

/* A sparse block's fc2 module holds only the experts' down projections: unpermute's forward
 * and backward do its work, so a schedule's fc2 module op (DeepSpeed's module-by-module
 * blocks: stage 3's gathers, stage 2's gradient hand-on) has nothing of its own to run. The
 * modules a block op runs: a module op's own, or the whole block's (lo..hi). */
static gboolean module_span(const ZpOp *op, int whole_lo, int whole_hi, int *lo, int *hi)
{
    const int mod = zp_op_module(op);
    *lo = mod < 0 ? whole_lo : mod, *hi = mod < 0 ? whole_hi : mod;
    return mod != REAL_GPT_MOD_FC2;
}

gboolean real_engine_moe_block_forward(RealEngine *e, const ZpOp *op, const RealGptTensors *p,
                                       const RealBf16 *x_in, gboolean save, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    int lo, hi;
    if (!module_span(op, REAL_GPT_MOD_LN1, REAL_GPT_MOD_FC1, &lo, &hi))
        return TRUE;
    for (int mod = lo; mod <= hi; mod++)
        if (!real_gpt_block_forward_module_t(e->gpt, op->unit - 1, mod, p, x_in, e->x, save,
                                             error))
            return FALSE;
    if (hi == REAL_GPT_MOD_FC1) { /* routed: the experts' ops follow */
        m->state = MOE_ROUTED, m->unit = op->unit, m->backward = FALSE;
        m->recompute = op->sub == ZP_COMP_RECOMPUTE;
    }
    return TRUE;
}

gboolean real_engine_moe_block_backward(RealEngine *e, const ZpOp *op, const RealGptTensors *p,
                                        const RealGptTensors *g, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    int lo, hi;
    if (!module_span(op, REAL_GPT_MOD_LN1, REAL_GPT_MOD_FC1, &lo, &hi))
        return TRUE;
    if (hi == REAL_GPT_MOD_FC1) { /* from the router: the experts' backward came first */
        if (m->state != MOE_EXPERTS && m->state != MOE_COMBINED)
            return fail(error, "rank %d: unit %d's block backward before its experts' backward",
                        e->rank, op->unit);
        RealBf16 *ret = half(e, m->out_id, m->state == MOE_COMBINED, error);
        if (!ret)
            return FALSE;
        real_gpt_moe_bind(e->gpt, ret);
    }
    for (int mod = hi; mod >= lo; mod--)
        if (!real_gpt_block_backward_module_t(e->gpt, op->unit - 1, mod, p, e->dx, e->dx, g,
                                              error))
            return FALSE;
    if (hi == REAL_GPT_MOD_FC1)
        m->state = MOE_IDLE;
    return TRUE;
}

static gboolean in_order(RealEngine *e, const ZpOp *op, MoeState a, MoeState b,
                         gboolean backward, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    if ((m->state == a || m->state == b) && m->unit == op->unit && m->backward == backward)
        return TRUE;
    return fail(error, "rank %d: %s of unit %d out of its sparse block's order", e->rank,
                zp_sched_compute_name((ZpComputeKind)op->sub), op->unit);
}

gboolean real_engine_moe_compute(RealEngine *e, const ZpOp *op, const RealGptTensors *p,
                                 const RealGptTensors *g, GError **error)
{
    RealEngineMoe *m = moe_of(e);
    const int l = op->unit - 1;
    RealBf16 *src, *out, *buf;
    switch ((ZpComputeKind)op->sub) {
    case ZP_COMP_EXPERT_FWD: /* at EP 1 no dispatch op: permuted here, read in place */
        if (!experts_ready(e, op->unit, p, error) ||
            !in_order(e, op, MOE_ROUTED, MOE_DISPATCHED, FALSE, error) ||
            (m->state == MOE_ROUTED && !permute(e, op, error)))
            return FALSE;
        src = half(e, m->in_id, m->state == MOE_DISPATCHED, error);
        out = src ? half(e, m->out_id, 0, error) : NULL;
        m->state = MOE_EXPERTS;
        return out && real_gpt_moe_experts_forward_t(e->gpt, l, p, src, out, error);
    case ZP_COMP_UNPERMUTE_FWD:
        if (!in_order(e, op, MOE_EXPERTS, MOE_COMBINED, FALSE, error) ||
            !(buf = half(e, m->out_id, m->state == MOE_COMBINED, error)))
            return FALSE;
        real_gpt_moe_bind(e->gpt, buf);
        if (!real_gpt_block_forward_module_t(e->gpt, l, REAL_GPT_MOD_FC2, p, e->x, e->x,
                                             !e->s->plan.checkpoint || m->recompute, error))
            return FALSE;
        m->state = MOE_IDLE;
        /* A forward's saved activations kept until the backward (without checkpointing) */
        if (!e->s->plan.checkpoint && !m->recompute)
            e->stash[slot(e, op->unit, op->micro)] = real_gpt_take_saved(e->gpt, l);
        return TRUE;
    case ZP_COMP_UNPERMUTE_BWD:
        if (!e->s->plan.checkpoint) {
            void **saved = &e->stash[slot(e, op->unit, op->micro)];
            if (!real_gpt_put_saved(e->gpt, l, *saved, error))
                return FALSE;
            *saved = NULL;
        }
        if (!(buf = half(e, m->in_id, 0, error)))
            return FALSE;
        real_gpt_moe_bind(e->gpt, buf);
        m->state = MOE_ROUTED, m->unit = op->unit, m->backward = TRUE, m->micro = op->micro;
        return real_gpt_block_backward_module_t(e->gpt, l, REAL_GPT_MOD_FC2, p, e->dx, e->dx,
                                                NULL, error);
    case ZP_COMP_EXPERT_BWD:
        if (!experts_ready(e, op->unit, p, error) ||
            !in_order(e, op, MOE_ROUTED, MOE_DISPATCHED, TRUE, error))
            return FALSE;
        src = half(e, m->in_id, m->state == MOE_DISPATCHED, error);
        out = src ? half(e, m->out_id, 0, error) : NULL;
        m->state = MOE_EXPERTS;
        return out && real_gpt_moe_experts_backward_t(e->gpt, l, p, src, g, out, error);
    default:
        return fail(error, "unknown compute op %d", op->sub);
    }
}

/* The experts' Adam step on this rank's expert partition, with the dense step's settings. */
void real_engine_moe_optimizer(RealEngine *e, const RealAdamHyper *hyper)
{
    RealEngineMoe *m = moe_of(e);
    if (!m || m->opt_elems == 0)
        return;
    const RealBf16 *grad = m->grads + m->grad_base;
    e->be->adam_step(e->be, hyper, m->opt_elems, m->master, m->adam_m, m->adam_v, grad,
                     m->params + m->part_base);
}

/* Bits of unit u's tensors in real_gpt's view that live in the expert space. */
uint32_t real_engine_moe_expert_tensors(const RealEngine *e, int u)
{
    if (!real_engine_moe_sparse(e, u))
        return 0;
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    const int n = real_gpt_unit_tensors(&e->dims, u, t);
    uint32_t bits = 0;
    for (int k = 0; k < n; k++)
        bits |= (t[k].offset_elems >= e->s->unit_elems[u] ? 1u : 0u) << k;
    return bits;
}

/* Each step's expert gradients start fresh: the experts' backward stores its first write (no
 * reduction delivers them at EP = dp, where stages 2-3 keep them in place). */
void real_engine_moe_start_step(RealEngine *e)
{
    for (int u = 0; e->moe && u < e->s->n_units; u++)
        if (real_engine_moe_sparse(e, u))
            real_gpt_grads_fresh(e->gpt, u, real_engine_moe_expert_tensors(e, u));
}
