/* zp_build_layout: the flat layout of a stage's units (padding, partition) and the model
 * states each rank holds for the step; a pipeline stage's view of a built schedule. */
#include "zp_build.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_sched.h"
#include "zp_zeropp.h"

#include <string.h>

gboolean zp_sched_fetch_allreduce(const ZpPlan *plan, guint n, ZpGroup group)
{
    return plan->impl == ZP_IMPL_DEEPSPEED && plan->zero.stage == 3 &&
           plan->zero.stage3_use_all_reduce_for_fetch_params && n > 1 &&
           !plan->zero.zero_quantized_weights && group == ZP_GROUP_DP;
}

gboolean zp_sched_coll_fetches(const ZpSchedule *s, const ZpOp *op)
{
    return op->kind == ZP_OP_COLLECTIVE &&
           (op->sub == ZP_COLL_ALLGATHER ||
            (op->sub == ZP_COLL_ALLREDUCE && op->group == ZP_GROUP_DP &&
             s->plan.zero.stage == 3));
}

/* The chunk that holds each unit (one chunk without a pipeline), in one walk of the chunks'
 * first units: each layout asked for every unit's by a walk from chunk 0 (Megatron 1T's 64
 * stages x 130 units: 2.4 M instructions of its 40 M build). */
int *zp_build_unit_chunks(const int *first_unit, int n_chunks, int n_units)
{
    int *chunk = g_new(int, MAX(n_units, 1));
    int c = 0;
    for (int u = 0; u < n_units; u++) {
        while (c + 1 < n_chunks && first_unit[c + 1] <= u)
            c++;
        chunk[u] = c;
    }
    return chunk;
}

/* Whether the stage being built holds the unit: chunk c sits on stage c mod P. */
gboolean zp_build_unit_held(const Builder *b, int unit)
{
    return b->unit_chunk[unit] % zp_plan_pp(&b->s->plan) == b->stage;
}

/* A unit's elements on the stage being built, this rank's share of the tensor-parallel group
 * (zp_model_unit_tp_elems): 0 for another stage's. A last stage without
 * the embedding keeps its own copy of a tied word embedding for the LM head (Megatron's
 * pipeline: the first and last stages each hold word_embeddings). */
static uint64_t held_elems(const Builder *b, int unit)
{
    if (!zp_build_unit_held(b, unit))
        return 0;
    const ZpModel *m = &b->s->model;
    /* A sparse block's routed experts live in the expert space (zp_sched_experts). */
    uint64_t elems = zp_model_unit_dense_tp_elems(m, unit, b->s->plan.mp);
    if (unit == (int)m->layers + 1 && m->tied_embeddings && !zp_build_unit_held(b, 0))
        elems += ((uint64_t)m->vocab + (uint64_t)b->s->plan.mp - 1) / (uint64_t)b->s->plan.mp *
                 (uint64_t)m->hidden; /* its vocabulary rows */
    return elems;
}

/* Unit offsets in the flat space of unit_elems, its total, padding and partition. */
static void place_units(ZpSchedule *s)
{
    const uint64_t dp = (uint64_t)s->plan.dp;
    const gboolean stage3 = s->plan.zero.stage == 3;
    uint64_t offset = 0, partition3 = 0;
    for (int u = 0; u < s->n_units; u++) {
        s->unit_offset[u] = offset;
        offset += s->unit_elems[u];
        if (stage3) /* stage 3's partition alone: a call a unit, and a division, each stage's
                     * layout (Megatron 1T: 8,320 of them) */
            partition3 += zp_sched_unit_padded(s, u) / dp;
    }
    s->total_elems = offset;
    s->padded_elems = zp_mem_padded_elems(offset, dp);
    /* an implementation's own flat buffer, padding included (ZpImpl flat_elems) */
    const ZpImpl *impl = zp_impl_get(s->plan.impl);
    if (impl->flat_elems && s->plan.zero.stage != 3)
        s->padded_elems = impl->flat_elems(s);
    s->partition_elems = stage3 ? partition3 : s->padded_elems / dp;
}

double zp_sched_gathered_elems(const ZpModel *model, const ZpPlan *plan)
{
    return zp_sched_gathered_elems_kept(model, plan, NULL);
}

double zp_sched_gathered_elems_kept(const ZpModel *model, const ZpPlan *plan,
                                    ZpSchedMemo *memo)
{
    /* Only the model's table may carry over: the tensors of the layout before were listed
     * for another plan's tensor-parallel degree, which memo_fresh (zp_impl.c) does not
     * compare. */
    if (memo)
        zp_sched_memo_drop_layout(memo);
    ZpSchedule s = {.model = *model, .plan = *plan,
                    .elem_bytes = zp_plan_elem_bytes(plan->precision), .memo = memo};
    zp_impl_normalize_plan(&s.plan);
    s.n_units = zp_model_n_units(model);
    s.unit_offset = g_new0(uint64_t, s.n_units);
    s.unit_elems = g_new(uint64_t, s.n_units);
    for (int u = 0; u < s.n_units; u++) /* held_elems: one stage holds every unit */
        s.unit_elems[u] = zp_model_unit_dense_tp_elems(model, u, plan->mp);
    place_units(&s);
    GArray *fetches = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    zp_impl_get(s.plan.impl)->plan_fetches(&s, fetches);
    double elems = 0;
    for (guint i = 0; i < fetches->len; i++)
        elems += (double)g_array_index(fetches, ZpFetch, i).elems;
    g_array_unref(fetches);
    if (memo)
        zp_sched_memo_drop_layout(memo);
    g_free(s.unit_offset);
    g_free(s.unit_elems);
    return elems;
}

/* The flat layout of the units the stage being built holds (all of them without a
 * pipeline): ZeRO partitions each stage's own parameters over its data-parallel group. */
void zp_build_layout(Builder *b)
{
    ZpSchedule *s = b->s;
    const int stage = s->plan.zero.stage;
    const int n_units = zp_model_n_units(&s->model);
    /* A pipeline's next stage: the arrays the stage before had, as many units (both written
     * whole below, place_units the offsets), not freed and zeroed anew each stage (Megatron
     * 1T's 64 stages: 90,000 instructions). */
    if (!s->unit_offset || !s->unit_elems || s->n_units != n_units) {
        g_free(s->unit_offset);
        g_free(s->unit_elems);
        s->unit_offset = g_new0(uint64_t, n_units);
        s->unit_elems = g_new0(uint64_t, n_units);
    }
    s->n_units = n_units;
    for (int u = 0; u < s->n_units; u++)
        s->unit_elems[u] = held_elems(b, u);
    if (s->stage_unit_elems)
        memcpy(&s->stage_unit_elems[(gsize)b->stage * (gsize)s->n_units], s->unit_elems,
               sizeof(uint64_t) * (gsize)s->n_units);
    place_units(s);
    b->grad_copy_elems = -1; /* another layout's (grad_copy_bytes) */

    const double total = (double)s->total_elems, padded = (double)s->padded_elems;
    const double part = (double)s->partition_elems;
    const double p = b->state.param_bytes, g = b->state.grad_bytes;
    double master, m, v;
    zp_plan_optimizer_split(&s->plan, &master, &m, &v);
    const double params_elems[4] = {total, padded, padded, part};
    /* the most any rank's optimizer holds (Megatron's: its parameters' elements alone) */
    const double optim_elems = stage == 3 ? part : (double)zp_impl_opt_elems(s, -1);
    /* the master weights are the partition itself (ZpImpl sharded_params_are_master) */
    const gboolean master_only = zp_impl_params_are_master(&s->plan);
    s->state_bytes[ZP_MEM_PARAMS] = master_only ? 0.0 : params_elems[stage] * p;
    const double grads = b->impl->grad_state_elems(s) * g;
    const gboolean taken = b->impl->grads_taken_by_reduction &&
                           b->impl->grads_taken_by_reduction(&s->plan);
    s->state_bytes[ZP_MEM_GRADS] = taken ? 0 : grads;
    b->grad_state_bytes = taken ? grads : 0;
    b->full_by_unit = b->impl->full_grads_transient && b->impl->full_grads_transient(&s->plan);
    s->state_bytes[ZP_MEM_MASTER] = optim_elems * master;
    s->state_bytes[ZP_MEM_ADAM_M] = optim_elems * m;
    s->state_bytes[ZP_MEM_ADAM_V] = optim_elems * v;
    if (stage == 3) { /* the full copies of persistent parameters, hpZ's secondary partition */
        GArray *kept = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
        b->impl->persistent(s, kept);
        double elems = 0;
        for (guint i = 0; i < kept->len; i++)
            elems += (double)g_array_index(kept, ZpFetch, i).elems;
        s->state_bytes[ZP_MEM_GATHERED_PARAMS] = elems * p;
        s->state_bytes[ZP_MEM_SECONDARY_PARAMS] =
            b->impl->secondary_per_block ? 0 : zp_zeropp_secondary_bytes(s, elems);
        g_array_unref(kept);
    }
    zp_build_moe_states(b);
    zp_offload_layout(s);
}

double zp_sched_model_state_bytes(const ZpSchedule *s)
{
    return s->state_bytes[ZP_MEM_PARAMS] + s->state_bytes[ZP_MEM_GRADS] +
           s->state_bytes[ZP_MEM_MASTER] + s->state_bytes[ZP_MEM_ADAM_M] +
           s->state_bytes[ZP_MEM_ADAM_V];
}

ZpSchedule *zp_sched_stage_view(const ZpSchedule *s, int stage)
{
    g_return_val_if_fail(stage >= 0 && stage < MAX(s->stages, 1), NULL);
    ZpSchedule *v = g_memdup2(s, sizeof *s);
    v->ops = g_array_ref(s->ops);
    v->deps = g_array_ref(s->deps);
    v->view_stage = stage;
    v->memo = NULL;
    const gsize n = (gsize)s->n_units, stages = (gsize)MAX(s->stages, 1);
    v->stage_state_bytes = g_memdup2(s->stage_state_bytes, sizeof(double) * stages * ZP_MEM_N);
    v->stage_host_bytes = g_memdup2(s->stage_host_bytes, sizeof(double) * stages * ZP_MEM_N);
    v->stage_unit_elems = s->stage_unit_elems
                              ? g_memdup2(s->stage_unit_elems, sizeof(uint64_t) * stages * n)
                              : NULL;
    v->unit_offset = g_new0(uint64_t, n);
    v->unit_elems = g_memdup2(s->stage_unit_elems ? &s->stage_unit_elems[(gsize)stage * n]
                                                  : s->unit_elems,
                              sizeof(uint64_t) * n);
    place_units(v);
    if (s->stage_state_bytes) /* a schedule read from a file has one stage, its own */
        memcpy(v->state_bytes, &s->stage_state_bytes[(gsize)stage * ZP_MEM_N],
               sizeof v->state_bytes);
    if (s->stage_host_bytes)
        memcpy(v->host_bytes, &s->stage_host_bytes[(gsize)stage * ZP_MEM_N],
               sizeof v->host_bytes);
    return v;
}
