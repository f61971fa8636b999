/* zp_schedcheck: checks a schedule's ops against its model, plan and layout, walking them in
 * list order with the state of every buffer, so that a file cannot steer zreal out of bounds. */
#include "zp_schedcheck.h"
#include "zp_build.h"
#include "zp_ep.h"
#include "zp_mem.h"
#include "zp_sched.h"
#include "zp_impl.h"
#include "zp_zeror.h"
#include "zp_zeropp.h"
#include "zp_impl.h"
#include "zp_offload.h"
#include "zp_util.h"

#include <stdarg.h>

typedef enum { BUF_NEVER, BUF_LIVE, BUF_FREED } BufState;

typedef struct {
    BufState state;
    ZpMemCategory cat;
    int unit;
    guint alloc_op;
    double bytes;
    int coll; /* the one collective that uses it, -1 for none */
} Buffer;

typedef struct {
    const ZpSchedule *s;
    const char *what;
    ZpStateBytes st;
    int L, n_units;
    guint n_ops, index;
    Buffer *buf;                    /* by id: ids are below the op count */
    int *landing, *gathered, *ckpt; /* per unit: the buffer holding its gradients, gathered
                                       parameters or checkpoint (-1 for none) */
    ZpEpActivations moe;            /* a mixture of experts' tokens and buffers (zp_ep) */
    GError **error;
} Check;

static gboolean bad(Check *c, const char *key, const char *format, ...) G_GNUC_PRINTF(3, 4);
static gboolean bad(Check *c, const char *key, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    char *text = g_strdup_vprintf(format, args);
    va_end(args);
    g_set_error(c->error, ZP_ERROR, ZP_ERROR_VALUE, "%s: ops[%u]: key \"%s\" %s", c->what,
                c->index, key, text);
    g_free(text);
    return FALSE;
}

static const ZpOp *op_at(const Check *c, guint i)
{
    return zp_sched_op(c->s, i);
}

/* Units whose flat ranges exactly tile [lo, lo + elems): *first..*last. */
static gboolean unit_range(const Check *c, uint64_t lo, uint64_t elems, int *first, int *last)
{
    const ZpSchedule *s = c->s;
    if (elems == 0 || lo >= s->total_elems || elems > s->total_elems - lo)
        return FALSE;
    int a = 0, b = c->n_units - 1;
    while (a < b) { /* the last unit starting at or before lo */
        const int mid = a + (b - a + 1) / 2;
        if (s->unit_offset[mid] <= lo)
            a = mid;
        else
            b = mid - 1;
    }
    const uint64_t hi = lo + elems;
    int z = a, y = c->n_units - 1;
    while (z < y) { /* the first unit ending at or after hi */
        const int mid = z + (y - z) / 2;
        if (s->unit_offset[mid] + s->unit_elems[mid] >= hi)
            y = mid;
        else
            z = mid + 1;
    }
    *first = a, *last = z;
    return s->unit_offset[a] == lo && s->unit_offset[z] + s->unit_elems[z] == hi;
}

static gboolean live(const Check *c, int id)
{
    return id >= 0 && (guint)id < c->n_ops && c->buf[id].state == BUF_LIVE;
}

/* A buffer the op names: live and of the category the op needs. */
static gboolean need_buffer(Check *c, int id, ZpMemCategory cat)
{
    if (!live(c, id))
        return bad(c, "buffer", "= %d is not a live buffer here (allocated and not yet freed)",
                   id);
    if (c->buf[id].cat != cat)
        return bad(c, "buffer", "= %d is a %s buffer; this op needs %s", id,
                   zp_sched_mem_name(c->buf[id].cat), zp_sched_mem_name(cat));
    return TRUE;
}

/* `source` says where the expected figure comes from ("the layout", "its alloc"). */
static gboolean need_bytes(Check *c, double have, double want, const char *source)
{
    if (have != want)
        return bad(c, "bytes", "= %.17g; %s gives %.17g", have, source, want);
    return TRUE;
}

/* ---- compute ------------------------------------------------------------------------- */

typedef enum { U_NONE, U_EMBED, U_BLOCK, U_HEAD, U_ANY } UnitRule;

/* What each compute op works on: its unit, and whether it needs the unit's parameters
 * (gathered, at stage 3), its gradient bucket (stages 2-3) or its checkpoint. The head also
 * needs unit 0, the tied embedding, for both. */
typedef struct {
    UnitRule unit;
    gboolean params, grads, ckpt;
} ComputeRule;

static const ComputeRule compute_rules[ZP_COMP_N] = {
    [ZP_COMP_EMBED_FWD] = {U_EMBED, TRUE, FALSE, FALSE},
    [ZP_COMP_BLOCK_FWD] = {U_BLOCK, TRUE, FALSE, TRUE},
    [ZP_COMP_HEAD] = {U_HEAD, TRUE, TRUE, FALSE},
    [ZP_COMP_RECOMPUTE] = {U_BLOCK, TRUE, FALSE, TRUE},
    [ZP_COMP_BLOCK_BWD] = {U_BLOCK, TRUE, TRUE, FALSE},
    [ZP_COMP_EMBED_BWD] = {U_EMBED, FALSE, TRUE, FALSE},
    [ZP_COMP_OPTIMIZER] = {U_NONE, FALSE, FALSE, FALSE},
    [ZP_COMP_CPU_OPTIMIZER] = {U_NONE, FALSE, FALSE, FALSE},
    [ZP_COMP_HOST_COPY] = {U_BLOCK, FALSE, FALSE, FALSE},
    [ZP_COMP_QUANTIZE] = {U_ANY, FALSE, FALSE, FALSE},
    [ZP_COMP_UNPACK] = {U_ANY, FALSE, FALSE, FALSE},
    /* a sparse block's: their experts' gathers are checked on their own (check_experts) */
    [ZP_COMP_EXPERT_FWD] = {U_BLOCK, FALSE, FALSE, FALSE},
    [ZP_COMP_EXPERT_BWD] = {U_BLOCK, FALSE, FALSE, FALSE},
    [ZP_COMP_UNPERMUTE_FWD] = {U_BLOCK, FALSE, FALSE, FALSE},
    [ZP_COMP_UNPERMUTE_BWD] = {U_BLOCK, FALSE, FALSE, FALSE},
};

static gboolean expert_op(int sub)
{
    return sub == ZP_COMP_EXPERT_FWD || sub == ZP_COMP_EXPERT_BWD ||
           sub == ZP_COMP_UNPERMUTE_FWD || sub == ZP_COMP_UNPERMUTE_BWD;
}

static gboolean unit_fits_rule(const Check *c, UnitRule rule, int unit)
{
    switch (rule) {
    case U_EMBED:
        return unit == 0;
    case U_BLOCK:
        return unit >= 1 && unit <= c->L;
    case U_HEAD:
        return unit == c->L + 1;
    case U_ANY:
        return unit >= 0 && unit <= c->L + 1;
    default:
        return unit == -1;
    }
}

static gboolean unit_ready(Check *c, int u, gboolean params, gboolean grads)
{
    const int stage = c->s->plan.zero.stage;
    if (params && stage == 3 && !zp_sched_unit_persistent(c->s, u) && !live(c, c->gathered[u]))
        return bad(c, "unit", "= %d: its parameters are used but not gathered here", u);
    if (grads && stage >= 2 && !live(c, c->landing[u]))
        return bad(c, "unit", "= %d: its gradients have no live bucket here", u);
    return TRUE;
}

static gboolean check_compute(Check *c, const ZpOp *op)
{
    const int u = op->unit;
    const ComputeRule *r = &compute_rules[op->sub];
    if (!unit_fits_rule(c, r->unit, u))
        return bad(c, "unit", "= %d is not a unit op %s works on", u,
                   zp_sched_compute_name(op->sub));
    if (op->sub == ZP_COMP_CPU_OPTIMIZER && zp_offload_cpu_share(&c->s->plan, (double)c->s->partition_elems) <= 0)
        return bad(c, "op", "cpu_optimizer in a plan without optimizer offload");
    if (op->sub != ZP_COMP_OPTIMIZER && op->sub != ZP_COMP_CPU_OPTIMIZER && op->micro < 0)
        return bad(c, "micro", "= %d: op %s needs a micro-step", op->micro,
                   zp_sched_compute_name(op->sub));
    if (op->sub == ZP_COMP_RECOMPUTE && !c->s->plan.checkpoint &&
        !c->s->plan.selective_recompute)
        return bad(c, "op", "recompute in a plan without recomputation");
    const ZpZeroConfig *z = &c->s->plan.zero;
    if (op->sub == ZP_COMP_QUANTIZE && !z->zero_quantized_weights && !z->zero_quantized_gradients)
        return bad(c, "op", "quantize in a plan without ZeRO++'s quantisation");
    if (op->sub == ZP_COMP_UNPACK) /* the paper's gathers are never coalesced */
        return bad(c, "op", "unpack in a schedule of the paper's ZeRO");
    if (zp_op_module(op) >= 0) /* the paper computes a block as one op */
        return bad(c, "module", "= %s: the paper's ZeRO computes a block as one op",
                   zp_model_module_name(zp_op_module(op)));
    if (op->sub == ZP_COMP_HOST_COPY && !c->s->plan.ckpt.cpu_checkpointing)
        return bad(c, "op", "host_copy in a plan without cpu_checkpointing");
    if (expert_op(op->sub) && !zp_build_moe_sparse(c->s, u))
        return bad(c, "op", "%s: unit %d is no sparse block of a mixture of experts",
                   zp_sched_compute_name(op->sub), u);
    /* Forward under cpu_checkpointing keeps the checkpoint on the host, not the GPU. */
    const gboolean on_gpu = op->sub == ZP_COMP_RECOMPUTE || !c->s->plan.ckpt.cpu_checkpointing;
    if (r->ckpt && c->s->plan.checkpoint && on_gpu &&
        !need_buffer(c, c->ckpt[u], ZP_MEM_CHECKPOINTS))
        return FALSE;
    /* A tied LM head also reads the embedding's weights and adds to their gradient. */
    const gboolean reads_embedding = op->sub == ZP_COMP_HEAD && c->s->model.tied_embeddings;
    return unit_ready(c, u, r->params, r->grads) &&
           (!reads_embedding || unit_ready(c, 0, r->params, r->grads));
}

/* ---- collectives --------------------------------------------------------------------- */

/* Stage 3: a unit's padded partitions, into its gathered buffer or (buffer -1) the full copy
 * of a persistent unit. */
static gboolean check_unit_gather(Check *c, const ZpOp *op, int id)
{
    const int u = op->unit;
    if (u < 0)
        return bad(c, "unit", "= -1: a stage-3 all-gather gathers one unit");
    const uint64_t padded = zp_sched_unit_padded(c->s, u);
    if (op->elems != padded || op->elem_offset != c->s->unit_offset[u])
        return bad(c, "elems", "= %" G_GUINT64_FORMAT " at %" G_GUINT64_FORMAT ": unit %d is %"
                   G_GUINT64_FORMAT " padded elements at %" G_GUINT64_FORMAT, op->elems,
                   op->elem_offset, u, padded, c->s->unit_offset[u]);
    const int ranks = zp_zeropp_group_ranks(&c->s->plan, op->group);
    const double wire = id < 0 ? (double)padded * c->st.param_bytes
                               : zp_zeropp_gather_bytes(&c->s->plan, padded, ranks,
                                                        c->st.param_bytes);
    if (!need_bytes(c, op->bytes, wire, "the layout (zp_zeropp)"))
        return FALSE;
    if (id < 0) {
        if (!zp_sched_unit_persistent(c->s, u))
            return bad(c, "buffer", "= -1 (the persistent copy) but unit %d is not persistent",
                       u);
        return TRUE;
    }
    if (!need_buffer(c, id, ZP_MEM_GATHERED_PARAMS))
        return FALSE;
    if (c->buf[id].unit != u)
        return bad(c, "buffer", "= %d holds unit %d, not %d", id, c->buf[id].unit, u);
    c->gathered[u] = id;
    return TRUE;
}

/* Stages 1-2: a chunk at elem_offset of every rank's partition, elems in all. */
static gboolean check_chunk_gather(Check *c, const ZpOp *op, int id)
{
    const uint64_t dp = (uint64_t)c->s->plan.dp, part = c->s->partition_elems;
    if (op->elems == 0 || op->elems % dp != 0)
        return bad(c, "elems", "= %" G_GUINT64_FORMAT " is not a positive multiple of dp = %"
                   G_GUINT64_FORMAT, op->elems, dp);
    if (op->elem_offset > part || op->elems / dp > part - op->elem_offset)
        return bad(c, "elem_offset", "= %" G_GUINT64_FORMAT ": the chunk runs past the %"
                   G_GUINT64_FORMAT "-element partition", op->elem_offset, part);
    return need_bytes(c, op->bytes, (double)op->elems * c->st.param_bytes, "the layout") &&
           need_buffer(c, id, ZP_MEM_BUCKETS) &&
           need_bytes(c, op->bytes, c->buf[id].bytes, "its buffer's alloc");
}

/* A gradient bucket: whole units of the flat space, reduced from a live bucket that holds
 * them (stage 3: each unit padded), which at stages 2-3 backward wrote into. */
static gboolean check_reduce(Check *c, const ZpOp *op, int id)
{
    const int stage = c->s->plan.zero.stage;
    if ((op->sub == ZP_COLL_ALLREDUCE) != (stage == 0))
        return bad(c, "op", "%s: stage %d reduces gradients with %s",
                   zp_sched_coll_name(op->sub), stage, stage == 0 ? "allreduce" : "reduce_scatter");
    int a, z;
    unit_range(c, op->elem_offset, op->elems, &a, &z); /* checked by index_collectives */
    double elems = 0;
    for (int u = a; u <= z; u++)
        elems += (double)(stage == 3 ? zp_sched_unit_padded(c->s, u) : c->s->unit_elems[u]);
    if (!need_bytes(c, op->bytes, elems * c->st.grad_bytes, "the layout") ||
        !need_buffer(c, id, ZP_MEM_BUCKETS) ||
        !need_bytes(c, op->bytes, c->buf[id].bytes, "its buffer's alloc"))
        return FALSE;
    for (int u = a; stage >= 2 && u <= z; u++)
        if (c->landing[u] != id)
            return bad(c, "buffer", "= %d: unit %d's gradients were not accumulated in it", id,
                       u);
    return TRUE;
}

/* ZeRO++'s subgroups: hpZ's backward gathers and qgZ's two all-to-alls of a bucket. */
static gboolean check_zeropp(Check *c, const ZpOp *op)
{
    const ZpZeroConfig *z = &c->s->plan.zero;
    if (op->group == ZP_GROUP_HPZ) {
        if (z->zero_hpz_partition_size <= 1 || op->sub != ZP_COLL_ALLGATHER)
            return bad(c, "group",
                       "hpz: only stage 3's all-gathers with zero_hpz_partition_size > 1");
        return check_unit_gather(c, op, op->buffer);
    }
    if (!z->zero_quantized_gradients || op->sub != ZP_COLL_ALLTOALL || z->stage != 3)
        return bad(c, "group", "%s: only qgZ's all-to-alls (zero_quantized_gradients, stage 3)",
                   op->group == ZP_GROUP_NODE ? "qgz_node" : "qgz_cross");
    if (op->group == ZP_GROUP_XNODE) /* moves the node's reduction, from workspace */
        return op->buffer == -1 || bad(c, "buffer", "= %d: the inter-node all-to-all uses "
                                                    "workspace", op->buffer);
    return need_buffer(c, op->buffer, ZP_MEM_BUCKETS);
}

/* A mixture of experts' collectives: the EP group's all-to-alls of the busiest rank's R h e
 * bytes (zp_ep), and over the expert-data-parallel group one sparse unit's experts (their
 * range of the expert space, padded at stage 3) reduced in the reduction dtype or gathered into
 * a live buffer of theirs, or after the step (stages 1-2) the whole padded expert space. */
static gboolean check_experts(Check *c, const ZpOp *op)
{
    const ZpSchedule *s = c->s;
    const gboolean a2a = op->sub == ZP_COLL_EP_DISPATCH || op->sub == ZP_COLL_EP_COMBINE;
    if (a2a != (op->group == ZP_GROUP_EP))
        return bad(c, "group", "%s: ep_dispatch and ep_combine run over ep, and only they",
                   zp_sched_coll_name(op->sub));
    if (zp_plan_ep(&s->plan) == 1 && op->group == ZP_GROUP_EP)
        return bad(c, "group", "ep in a plan without expert parallelism (EP 1)");
    /* Where the expert gradients are partitioned (zp_sched_expert_grads_partitioned) a unit's
     * are reduced out of a bucket of their own (zp_build_moe_backward), by whichever
     * collective the implementation reduces them with; nothing else of the experts' names a
     * buffer. */
    const gboolean bucketed = op->group == ZP_GROUP_EDP && op->unit >= 0 &&
                              op->sub != ZP_COLL_ALLGATHER && zp_sched_expert_grads_partitioned(s);
    /* or, after the backward (ZpImpl experts_after_backward), a flattened copy all-reduced */
    const gboolean copy = op->group == ZP_GROUP_EDP && op->sub == ZP_COLL_ALLREDUCE &&
                          op->unit < 0;
    if (bucketed || copy ? !need_buffer(c, op->buffer, ZP_MEM_BUCKETS) : op->buffer != -1)
        return bucketed || copy
                   ? FALSE
                   : bad(c, "buffer", "= %d: expert collectives but the reductions of expert "
                                      "gradients from a bucket use none", op->buffer);
    if (a2a)
        return zp_build_moe_sparse(s, op->unit) ||
               bad(c, "unit", "= %d is no sparse block", op->unit);
    const int stage = s->plan.zero.stage;
    const uint64_t edp = (uint64_t)zp_plan_edp(&s->plan);
    const ZpImpl *impl = zp_impl_get(s->plan.impl);
    if (copy) { /* a run of the expert space all-reduced after the backward */
        const ZpSchedExperts x = zp_sched_experts(s);
        if (!impl->experts_after_backward || !impl->experts_after_backward(&s->plan) ||
            op->elems == 0 || op->elem_offset + op->elems > x.total_elems)
            return bad(c, "elems", "= %" G_GUINT64_FORMAT " at %" G_GUINT64_FORMAT ": an "
                       "all-reduce of the expert space after the backward (%s reduces them so "
                       "%s)", op->elems, op->elem_offset, zp_impl_name(s->plan.impl),
                       impl->experts_after_backward ? "not at this stage" : "never");
        return need_bytes(c, op->bytes, (double)op->elems * zp_plan_reduce_bytes(&s->plan),
                          "the layout");
    }
    if (op->unit < 0) { /* stages 1-2: the updated expert partitions */
        const ZpSchedExperts x = zp_sched_experts(s);
        if (op->sub != ZP_COLL_ALLGATHER || (stage != 1 && stage != 2) || op->elem_offset != 0 ||
            op->elems != x.padded_elems)
            return bad(c, "elems", "= %" G_GUINT64_FORMAT ": after the step, stages 1-2 gather "
                       "the %" G_GUINT64_FORMAT " padded expert elements", op->elems,
                       x.padded_elems);
        return need_bytes(c, op->bytes, (double)op->elems * c->st.param_bytes, "the layout");
    }
    const uint64_t elems = zp_sched_unit_expert_elems(s, op->unit);
    const uint64_t want = stage == 3 ? zp_mem_padded_elems(elems, edp) : elems;
    if (elems == 0 || op->elems != want ||
        op->elem_offset != zp_sched_unit_expert_offset(s, op->unit))
        return bad(c, "elems", "= %" G_GUINT64_FORMAT ": unit %d's experts are %" G_GUINT64_FORMAT
                   " elements at %" G_GUINT64_FORMAT " of the expert space", op->elems, op->unit,
                   want, zp_sched_unit_expert_offset(s, op->unit));
    if (op->sub == ZP_COLL_ALLGATHER)
        return stage == 3 ? need_bytes(c, op->bytes, (double)want * c->st.param_bytes,
                                       "the layout")
                          : bad(c, "op", "allgather: only stage 3 gathers a unit's experts");
    const ZpCollKind reduce = zp_impl_expert_grad_collective(&s->plan);
    if (op->sub != reduce)
        return bad(c, "op", "%s: stage %d (%s) reduces expert gradients with %s",
                   zp_sched_coll_name(op->sub), stage, zp_impl_name(s->plan.impl),
                   zp_sched_coll_name(reduce));
    return need_bytes(c, op->bytes, (double)want * zp_plan_reduce_bytes(&s->plan), "the layout");
}

/* The all-gather dispatcher's collectives over TP x EP (zp_build_moe.c tpep_chain): a sparse
 * block's gathers and reduce-scatters, each one of zp_ep_gather_pass's, no buffer. */
static gboolean check_tpep(Check *c, const ZpOp *op)
{
    const ZpSchedule *s = c->s;
    if (s->plan.experts.dispatcher != ZP_DISPATCH_ALLGATHER)
        return bad(c, "group", "tpep: only the allgather dispatcher's collectives run over it");
    if (op->sub != ZP_COLL_ALLGATHER && op->sub != ZP_COLL_REDUCE_SCATTER)
        return bad(c, "op", "%s: the allgather dispatcher gathers and reduce-scatters",
                   zp_sched_coll_name(op->sub));
    if (op->buffer != -1)
        return bad(c, "buffer", "= %d: the allgather dispatcher's collectives use none",
                   op->buffer);
    if (!zp_build_moe_sparse(s, op->unit))
        return bad(c, "unit", "= %d is no sparse block", op->unit);
    for (int backward = 0; backward <= 1; backward++) {
        const ZpEpGatherPass p = zp_ep_gather_pass(&s->model, &s->plan, backward);
        for (int k = 0; k < p.n_before + p.n_after; k++) {
            const ZpEpGatherColl *x = k < p.n_before ? &p.before[k] : &p.after[k - p.n_before];
            if (x->kind == op->sub && x->bytes == op->bytes)
                return TRUE;
        }
    }
    return bad(c, "bytes", "= %.17g: no %s of the allgather dispatcher's (zp_ep_gather_pass)",
               op->bytes, zp_sched_coll_name(op->sub));
}

static gboolean check_collective(Check *c, const ZpOp *op)
{
    const int id = op->buffer;
    if (op->group == ZP_GROUP_EP || op->group == ZP_GROUP_EDP || op->sub == ZP_COLL_EP_DISPATCH ||
        op->sub == ZP_COLL_EP_COMBINE)
        return check_experts(c, op);
    if (op->group == ZP_GROUP_TPEP)
        return check_tpep(c, op);
    if (op->group >= ZP_GROUP_HPZ)
        return check_zeropp(c, op);
    if (op->group == ZP_GROUP_TP) {
        if (c->s->plan.mp == 1)
            return bad(c, "group", "tp in a plan without tensor parallelism (mp 1)");
        return id == -1 || bad(c, "buffer", "= %d: tensor-parallel ops use no buffer", id);
    }
    if (op->sub != ZP_COLL_ALLGATHER)
        return check_reduce(c, op, id);
    switch (c->s->plan.zero.stage) {
    case 0:
        return bad(c, "op", "allgather: stage 0 gathers nothing");
    case 3:
        return check_unit_gather(c, op, id);
    default:
        return check_chunk_gather(c, op, id);
    }
}

/* ---- alloc and free ------------------------------------------------------------------ */

static gboolean check_alloc_size(Check *c, const ZpOp *op)
{
    const ZpSchedule *s = c->s;
    const int u = op->unit;
    switch (op->sub) {
    case ZP_MEM_GATHERED_PARAMS:
        if (u < 0)
            return bad(c, "unit", "= -1: gathered parameters belong to a unit");
        if (zp_build_moe_sparse(s, u) && c->s->plan.zero.stage == 3 &&
            op->bytes == (double)zp_mem_padded_elems(
                             zp_sched_unit_expert_elems(s, u),
                             (uint64_t)zp_plan_edp(&s->plan)) *
                             c->st.param_bytes)
            return TRUE; /* the unit's experts, gathered over the expert-data-parallel group */
        return need_bytes(c, op->bytes,
                          (double)zp_sched_unit_padded(s, u) * c->st.param_bytes, "the layout");
    case ZP_MEM_CHECKPOINTS:
    case ZP_MEM_ACTIVATIONS:
        if (u < 1 || u > c->L)
            return bad(c, "unit", "= %d: %s belong to a block, 1..%d", u,
                       zp_sched_mem_name(op->sub), c->L);
        if (op->sub != ZP_MEM_CHECKPOINTS)
            return TRUE;
        /* The kept checkpoint (1/M under Pa) or, before the recompute, the whole input. */
        const ZpCkptRule rule = zp_zeror_checkpoint(&s->model, &s->plan);
        return op->bytes == rule.full_bytes ||
               need_bytes(c, op->bytes, rule.gpu_bytes, "the layout (zp_zeror)");
    case ZP_MEM_BUCKETS:
        if (c->buf[op->buffer].coll < 0)
            return bad(c, "buffer", "= %d: a bucket no collective uses", op->buffer);
        /* qgZ: the intra-node all-to-all names the bucket it reduces, moving its int4 form. */
        if (op_at(c, (guint)c->buf[op->buffer].coll)->sub == ZP_COLL_ALLTOALL)
            return TRUE;
        return need_bytes(c, op->bytes, op_at(c, (guint)c->buf[op->buffer].coll)->bytes,
                          "the collective using it");
    case ZP_MEM_WORKSPACE:
        return TRUE;
    case ZP_MEM_EP_BUFFERS: /* a sparse block's dispatch or combine buffers, or DeepSpeed's
                             * regathered slots (zp_build_moe.c tp_regather) */
        if (!zp_build_moe_sparse(s, u))
            return bad(c, "unit", "= %d: ep_buffers belong to a sparse block", u);
        return op->bytes == c->moe.combine_bytes ||
               (c->moe.regathered_bytes > 0 && op->bytes == c->moe.regathered_bytes) ||
               need_bytes(c, op->bytes, c->moe.dispatch_bytes, "zp_ep_activations");
    case ZP_MEM_GRADS: /* gradients the reductions take (zp_impl.h grads_taken_by_reduction,
                        * grad_copy_elems; unit -1) or a unit's full gradients
                        * (full_grads_transient); zreal checks their sizes */
        if (u < -1 || u >= c->n_units)
            return bad(c, "unit", "= %d: gradients belong to no unit (-1) or to 0..%d", u,
                       c->n_units - 1);
        return u == -1 || need_bytes(c, op->bytes,
                                     (double)s->unit_elems[u] * c->st.grad_bytes, "the layout");
    default:
        return bad(c, "category", "%s: a model state, held for the whole step, not allocated",
                   zp_sched_mem_name(op->sub));
    }
}

/* Stages 2-3: a bucket allocated for a unit is where backward writes the gradients of the
 * units its collective reduces. */
static void map_landing(Check *c, const ZpOp *op)
{
    const int id = op->buffer;
    const ZpOp *coll = op_at(c, (guint)c->buf[id].coll);
    int a, z;
    /* (an expert gradient bucket's range is of the expert space, not the flat one) */
    if (c->s->plan.zero.stage < 2 || op->unit < 0 || coll->sub == ZP_COLL_ALLGATHER ||
        coll->group == ZP_GROUP_EDP || !unit_range(c, coll->elem_offset, coll->elems, &a, &z))
        return;
    for (int u = a; u <= z; u++)
        c->landing[u] = id;
}

static gboolean check_alloc(Check *c, const ZpOp *op)
{
    const int id = op->buffer;
    if ((guint)id >= c->n_ops)
        return bad(c, "buffer", "= %d: ids are below the op count, %u", id, c->n_ops);
    if (c->buf[id].state != BUF_NEVER)
        return bad(c, "buffer", "= %d was allocated before, at ops[%u]", id,
                   c->buf[id].alloc_op);
    if (!check_alloc_size(c, op))
        return FALSE;
    c->buf[id] = (Buffer){BUF_LIVE, op->sub, op->unit, c->index, op->bytes, c->buf[id].coll};
    if (op->sub == ZP_MEM_BUCKETS)
        map_landing(c, op);
    if (op->sub == ZP_MEM_CHECKPOINTS)
        c->ckpt[op->unit] = id;
    return TRUE;
}

static gboolean check_free(Check *c, const ZpOp *op)
{
    const int id = op->buffer;
    if (!need_buffer(c, id, op->sub) || !need_bytes(c, op->bytes, c->buf[id].bytes, "its alloc"))
        return FALSE;
    c->buf[id].state = BUF_FREED;
    return TRUE;
}

/* ---- offload transfers --------------------------------------------------------------- */

/* A transfer moves a non-negative byte count over the stream of its kind, in a plan that
 * offloads something. */
static gboolean check_transfer(Check *c, const ZpOp *op)
{
    if (!zp_offload_any(&c->s->plan))
        return bad(c, "op", "%s in a plan without offload", zp_sched_transfer_name(op->sub));
    const ZpStream want = op->sub == ZP_XFER_D2H || op->sub == ZP_XFER_H2D ? ZP_STREAM_HOST
                                                                            : ZP_STREAM_NVME;
    if (op->stream != want)
        return bad(c, "stream", "= %s: %s runs on %s", zp_sched_stream_name(op->stream),
                   zp_sched_transfer_name(op->sub), zp_sched_stream_name(want));
    if (!(op->bytes >= 0))
        return bad(c, "bytes", "= %g: must be >= 0", op->bytes);
    return TRUE;
}

/* ---- the walk ------------------------------------------------------------------------ */

static gboolean check_common(Check *c, const ZpOp *op)
{
    if (op->unit < -1 || op->unit >= c->n_units)
        return bad(c, "unit", "= %d is outside [-1, %d]", op->unit, c->n_units - 1);
    if (op->micro < -1 || op->micro >= c->s->plan.grad_accum)
        return bad(c, "micro", "= %d is outside [-1, %d]", op->micro,
                   c->s->plan.grad_accum - 1);
    if (op->kind == ZP_OP_COLLECTIVE && (op->buffer < -1 || op->buffer >= (int)c->n_ops))
        return bad(c, "buffer", "= %d: ids are below the op count, %u", op->buffer, c->n_ops);
    return TRUE;
}

/* Each bucket serves one collective; the alloc needs to know which. */
static gboolean index_collectives(Check *c)
{
    for (c->index = 0; c->index < c->n_ops; c->index++) {
        const ZpOp *op = op_at(c, c->index);
        if (!check_common(c, op))
            return FALSE;
        int a, z;
        if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_DP &&
            op->sub != ZP_COLL_ALLGATHER && !unit_range(c, op->elem_offset, op->elems, &a, &z))
            return bad(c, "elems", "= %" G_GUINT64_FORMAT " at %" G_GUINT64_FORMAT " is not a "
                       "run of whole units of the %" G_GUINT64_FORMAT "-element model",
                       op->elems, op->elem_offset, c->s->total_elems);
        if (op->kind != ZP_OP_COLLECTIVE || op->buffer < 0)
            continue;
        if (c->buf[op->buffer].coll >= 0)
            return bad(c, "buffer", "= %d is used by ops[%d] already; a buffer serves one "
                       "collective", op->buffer, c->buf[op->buffer].coll);
        c->buf[op->buffer].coll = (int)c->index;
    }
    return TRUE;
}

static gboolean walk(Check *c)
{
    if (!index_collectives(c))
        return FALSE;
    for (c->index = 0; c->index < c->n_ops; c->index++) {
        const ZpOp *op = op_at(c, c->index);
        gboolean ok = TRUE;
        switch ((ZpOpKind)op->kind) {
        case ZP_OP_COMPUTE:
            ok = check_compute(c, op);
            break;
        case ZP_OP_COLLECTIVE:
            ok = check_collective(c, op);
            break;
        case ZP_OP_ALLOC:
            ok = check_alloc(c, op);
            break;
        case ZP_OP_FREE:
            ok = check_free(c, op);
            break;
        case ZP_OP_P2P: /* the reader refuses them: files hold no pipeline */
            ok = bad(c, "kind", "p2p: a schedule file holds no pipeline sends");
            break;
        case ZP_OP_TRANSFER:
            ok = check_transfer(c, op);
            break;
        }
        if (!ok)
            return FALSE;
    }
    for (guint id = 0; id < c->n_ops; id++)
        if (c->buf[id].state == BUF_LIVE) {
            c->index = c->buf[id].alloc_op;
            return bad(c, "buffer", "= %u is never freed", id);
        }
    return TRUE;
}

/* ---- the step's semantics ------------------------------------------------------------ */

/* A unit's passes, each of which runs once per micro-step (recompute only with
 * checkpointing); the head is its unit's forward and backward in one op. */
static const struct {
    ZpComputeKind sub;
    UnitRule units;
} passes[] = {
    {ZP_COMP_EMBED_FWD, U_EMBED}, {ZP_COMP_BLOCK_FWD, U_BLOCK}, {ZP_COMP_HEAD, U_HEAD},
    {ZP_COMP_RECOMPUTE, U_BLOCK}, {ZP_COMP_BLOCK_BWD, U_BLOCK}, {ZP_COMP_EMBED_BWD, U_EMBED},
};

static int pass_index(int sub)
{
    for (int i = 0; i < (int)G_N_ELEMENTS(passes); i++)
        if ((int)passes[i].sub == sub)
            return i;
    return -1;
}

/* One op's key among the passes: pass, unit, micro-step and (DeepSpeed's and FSDP's per-module
 * ops) block module; the unit and micro-step are bounded by the walk's range checks. */
static gint64 pass_key(int pass, int unit, int micro, int module)
{
    return (((gint64)pass * (1 << 24) + unit) * (1 << 24) + micro) * 16 + module;
}

/* The keys' bits all matter: GLib's g_int64_hash keeps only the low 32 bits of a key, where
 * every unit past the sixteenth would collide. MurmurHash3's 64-bit finaliser mixes them. */
static guint key_hash(gconstpointer key)
{
    guint64 x = *(const guint64 *)key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (guint)x;
}

typedef struct {
    const ZpSchedule *s;
    const char *what;
    int L, micro, stages;
    GHashTable *first;     /* pass_key with module: the op index (+1) that ran it first */
    GHashTable *ran;       /* pass_key without module: present */
    guint *optimizer_at;   /* per stage: 1 + the index of its optimizer op (0: none) */
    guint last_pass;       /* the last forward or backward op (stages 1) */
    GError **error;
} Step;

static gboolean step_bad(Step *t, guint index, const char *format, ...) G_GNUC_PRINTF(3, 4);
static gboolean step_bad(Step *t, guint index, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    char *text = g_strdup_vprintf(format, args);
    va_end(args);
    g_set_error(t->error, ZP_ERROR, ZP_ERROR_VALUE, "%s: ops[%u]: key \"op\" %s", t->what,
                index, text);
    g_free(text);
    return FALSE;
}

/* A forward or backward op: in range, not a repeat, and (one rank class) a backward after its
 * unit's forward in that micro-step and before the optimizer. */
static gboolean step_pass(Step *t, guint i, const ZpOp *op, int pass)
{
    const char *name = zp_sched_compute_name(op->sub);
    const Check range = {.L = t->L};
    if (!unit_fits_rule(&range, passes[pass].units, op->unit) || op->micro < 0 ||
        op->micro >= t->micro)
        return step_bad(t, i, "%s: unit %d, micro-step %d is not one of the step's (%d layers, "
                        "%d micro-steps)", name, op->unit, op->micro, t->L, t->micro);
    const gint64 key = pass_key(pass, op->unit, op->micro, op->module);
    const guint seen = GPOINTER_TO_UINT(g_hash_table_lookup(t->first, &key));
    if (seen)
        return step_bad(t, i, "%s: unit %d ran it already in micro-step %d (ops[%u]): each "
                        "unit's forward and backward run once per micro-step", name, op->unit,
                        op->micro, seen - 1);
    gint64 *k = g_new(gint64, 1), *bare = g_new(gint64, 1);
    *k = key, *bare = pass_key(pass, op->unit, op->micro, 0);
    g_hash_table_insert(t->first, k, GUINT_TO_POINTER(i + 1));
    g_hash_table_add(t->ran, bare);
    if (t->stages > 1)
        return TRUE;
    if (t->optimizer_at[0])
        return step_bad(t, i, "%s after the optimizer step (ops[%u]): a step's passes come "
                        "before its update", name, t->optimizer_at[0] - 1);
    const gboolean backward = op->sub == ZP_COMP_BLOCK_BWD || op->sub == ZP_COMP_EMBED_BWD;
    const gint64 fwd = pass_key(pass_index(op->sub == ZP_COMP_BLOCK_BWD ? ZP_COMP_BLOCK_FWD
                                                                        : ZP_COMP_EMBED_FWD),
                                op->unit, op->micro, 0);
    if (backward && !g_hash_table_contains(t->ran, &fwd))
        return step_bad(t, i, "%s of unit %d in micro-step %d before its forward", name,
                        op->unit, op->micro);
    return TRUE;
}

/* The optimizer on the GPU: once per stage (its ranks' partition) a step. */
static gboolean step_optimizer(Step *t, guint i, const ZpOp *op)
{
    if (op->stage >= (uint32_t)t->stages)
        return step_bad(t, i, "optimizer: stage %u of %d", op->stage, t->stages);
    if (t->optimizer_at[op->stage])
        return step_bad(t, i, "optimizer: a second optimizer step (the first at ops[%u]): one "
                        "optimizer op updates the partition once a step",
                        t->optimizer_at[op->stage] - 1);
    t->optimizer_at[op->stage] = i + 1;
    return TRUE;
}

/* Every pass of every unit and micro-step ran; each stage stepped its optimizer (on the GPU
 * unless all of it is offloaded). At most one lookup past the ops the walk saw per miss. */
static gboolean step_complete(Step *t, int cpu_steps)
{
    for (int p = 0; p < (int)G_N_ELEMENTS(passes); p++) {
        if (passes[p].sub == ZP_COMP_RECOMPUTE && !t->s->plan.checkpoint)
            continue;
        const int lo = passes[p].units == U_BLOCK ? 1 : passes[p].units == U_HEAD ? t->L + 1 : 0;
        const int hi = passes[p].units == U_BLOCK ? t->L : lo;
        for (int m = 0; m < t->micro; m++)
            for (int u = lo; u <= hi; u++) {
                const gint64 key = pass_key(p, u, m, 0);
                if (!g_hash_table_contains(t->ran, &key)) {
                    g_set_error(t->error, ZP_ERROR, ZP_ERROR_VALUE,
                                "%s: ops: no %s of unit %d in micro-step %d: each unit's "
                                "forward and backward run once per micro-step", t->what,
                                zp_sched_compute_name(passes[p].sub), u, m);
                    return FALSE;
                }
            }
    }
    const gboolean offloaded = t->s->plan.zero.offload_optimizer.device != ZP_OFFLOAD_NONE;
    for (int k = 0; k < t->stages; k++)
        if (!t->optimizer_at[k] && !(offloaded && cpu_steps > 0)) {
            g_set_error(t->error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: ops: no optimizer op%s: the step must update the partition once",
                        t->what, t->stages > 1 ? " for a pipeline stage" : "");
            return FALSE;
        }
    return TRUE;
}

/* The sub-groups of the partition the host steps (optimizer offload), one cpu_optimizer op
 * each; -1 where the layout is unknown (a graph file) or a pipeline's stages differ. */
static int cpu_sub_groups(const ZpSchedule *s)
{
    if (s->n_units == 0 || MAX(s->stages, 1) > 1)
        return -1;
    const double elems = s->plan.zero.stage == 0 ? (double)s->total_elems
                                                 : (double)s->partition_elems;
    if (zp_offload_cpu_share(&s->plan, elems) <= 0)
        return 0;
    int n = 0;
    for (int j = 0; j < zp_offload_sub_group_count(&s->plan, elems); j++) {
        ZpOffloadStep step;
        zp_offload_sub_group_step(&s->plan, elems, j, &step);
        n += step.on_cpu;
    }
    return n;
}

gboolean zp_schedcheck_step(const ZpSchedule *s, const char *what, GError **error)
{
    Step t = {.s = s, .what = what, .L = (int)s->model.layers, .micro = s->plan.grad_accum,
              .stages = MAX(zp_plan_pp(&s->plan), 1), .error = error};
    t.first = g_hash_table_new_full(key_hash, g_int64_equal, g_free, NULL);
    t.ran = g_hash_table_new_full(key_hash, g_int64_equal, g_free, NULL);
    t.optimizer_at = g_new0(guint, t.stages);
    const int cpu_groups = cpu_sub_groups(s);
    int cpu_steps = 0;
    gboolean ok = TRUE;
    for (guint i = 0; ok && i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE)
            continue;
        const int pass = pass_index(op->sub);
        if (pass >= 0)
            ok = step_pass(&t, i, op, pass);
        else if (op->sub == ZP_COMP_OPTIMIZER)
            ok = step_optimizer(&t, i, op);
        else if (op->sub == ZP_COMP_CPU_OPTIMIZER && ++cpu_steps > cpu_groups && cpu_groups >= 0)
            ok = step_bad(&t, i, "cpu_optimizer: a CPU optimizer step past the %d sub-groups "
                          "of the partition the host steps: each is updated once a step",
                          cpu_groups);
    }
    if (ok && cpu_groups >= 0 && cpu_steps < cpu_groups) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: ops: %d cpu_optimizer ops for the %d "
                    "sub-groups of the partition the host steps: each is updated once a step",
                    what, cpu_steps, cpu_groups);
        ok = FALSE;
    }
    ok = ok && step_complete(&t, cpu_steps);
    g_hash_table_unref(t.first);
    g_hash_table_unref(t.ran);
    g_free(t.optimizer_at);
    return ok;
}

gboolean zp_schedcheck_ops(const ZpSchedule *s, const char *what, GError **error)
{
    Check c = {.s = s, .what = what, .error = error,
               .st = zp_impl_state_bytes(&s->plan),
               .L = (int)s->model.layers, .n_units = s->n_units, .n_ops = s->ops->len,
               .moe = zp_ep_activations(&s->model, &s->plan)};
    c.buf = g_new0(Buffer, MAX(c.n_ops, 1));
    for (guint i = 0; i < c.n_ops; i++)
        c.buf[i].coll = -1;
    int *per_unit = g_new(int, 3 * (gsize)c.n_units);
    for (int i = 0; i < 3 * c.n_units; i++)
        per_unit[i] = -1;
    c.landing = per_unit, c.gathered = per_unit + c.n_units, c.ckpt = per_unit + 2 * c.n_units;
    /* The buffers first: the step's check reads units and micro-steps the walk bounded. */
    const gboolean ok = walk(&c) && zp_schedcheck_step(s, what, error);
    g_free(per_unit);
    g_free(c.buf);
    return ok;
}
