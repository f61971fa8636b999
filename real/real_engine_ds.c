/* real_engine_ds: DeepSpeed's stages 2 and 3 in zreal. The ops (zp_sched with zp_impl_deepspeed)
 * say what is allocated, reduced and gathered; this file maps them onto tensors and buffers as
 * deepspeed/runtime/zero/stage_1_and_2.py and stage3.py lay them out. */
#include "real_engine_ds.h"
#include "real_engine.h"
#include "real_offload.h"
#include "real_zeropp.h"
#include "zp_offload.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_zeropp.h"

#include <string.h>

typedef struct {
    int unit, k;            /* its unit and index in real_gpt_unit_tensors' list */
    uint64_t offset, elems; /* flat range (unpadded) and offset inside its unit */
    uint64_t in_unit;
    uint64_t slice;         /* stage 3: padded elements / dp */
    uint64_t part;          /* stage 3: where its slice sits in this rank's partition */
    int bucket;             /* the bucket that reduces it */
    /* stage 3: the buffer ids of its gathers (a tensor prefetched for a later use while
     * still held for this one has two; a freed buffer is NULL in the engine's table), and
     * where in each it starts (an all-reduced call's flat buffer holds it in place) */
    int gathered[4];
    uint64_t gathered_at[4];
    RealBf16 *persistent;   /* stage 3: its full copy when ds_persist */
    uint64_t sec;           /* hpZ: where its secondary slice sits in the secondary partition */
} Tensor;

/* Stage 3: one coalesced all-gather of a micro-step (zp_impl.h ZpFetch), its tensors in the
 * order of its flat buffer, over the data-parallel group or (hpZ, in backward) hpZ's. */
typedef struct {
    guint first, n;        /* its tensors: members[first .. first + n) */
    uint64_t per_rank;     /* the slices of every rank, one after another in the flat buffer */
    ZpGroup group;
    int ranks;
} Call;

/* A gradient handed on before its bucket had room in the held ipg buffer (an earlier bucket
 * still there): it waits in a buffer of its own, as autograd's param.grad waits for the hook
 * that copies it into the bucket (stage3.py reduce_independent_p_g_buckets_and_remove_grads
 * reduces the full bucket first, then __add_grad_to_ipg_bucket copies). The schedule lists
 * these buffers by the same rule (zp_sched.c hand_on, land_waits). */
typedef struct {
    guint tensor;
    int micro;
    RealBf16 *grad;
} Pending;

typedef struct {
    uint64_t lo, hi;  /* flat range of whole tensors */
    int landed_in;    /* the held buffer holding its gradients until reduced, -1 none */
} Bucket;

struct RealDs {
    const ZpSchedule *s;
    RealBackend *be;
    RealComm *comm;
    void **buffers;
    RealBf16 *params;
    int stage, dp, rank, n_buckets, n_buffers;
    Tensor *t;
    guint n_t;
    Bucket *bk;
    int *bucket_buffer;   /* [micro * n_buckets + k]: the buffer bucket k lands in */
    gboolean *held;       /* per buffer id: reduces more than one bucket (an ipg buffer) */
    /* Gradients: stage 2's grads_in_partition (the whole tensors overlapping this rank's
     * partition from flat offset gip_lo; with accumulation the sum), the buffer id `gip` the
     * step's first reduction takes, or stage 3's partition, `grads`, held throughout.
     * grad_copy: per micro-step, the buffer id of the copy its reduced gradients land in
     * before they are added to the sum (zp_impl.h grad_copy_elems), -1 none. */
    RealBf16 *grads;
    int gip;
    uint64_t gip_lo, gip_hi, grad_elems;
    int *grad_copy;
    /* With optimizer offload the reduced slices go to real_offload's host tier from the
     * bucket (stage 2) or the concatenation copy (stage 3) and no gradients stay here. */
    gboolean host_grads;
    /* With parameter offload the partition is the host tier's: the transfers before a call
     * put this rank's slices in place (real_ds_param_transfer). */
    gboolean host_params;
    /* Stage 3: a micro-step's calls in issue order, the next one, the tensors they gather,
     * and the call whose flat buffer each buffer id holds (-1 none). */
    Call *calls;
    guint n_calls, next_call;
    guint *members;
    int *flat_call;
    /* qwZ: per gathered buffer id, the int8 buffer its call is gathered in (-1 none) */
    int *quant_of;
    /* Per micro-step: the buffer the tied head's wte gradient waits in until the embedding's
     * backward (zp_impl.h tied_grad_waits), or -1. */
    int *tied_grad;
    GArray *pending; /* Pending, in the order handed on */
    /* hpZ (real_ds_hpz): its group's communicator and this rank's secondary partition */
    RealComm *hpz_comm;
    RealBf16 *secondary;
};

#define fail real_engine_fail

gboolean real_ds_applies(const ZpSchedule *s)
{
    return s->plan.impl == ZP_IMPL_DEEPSPEED && s->plan.zero.stage >= 2;
}

/* A zeroed buffer of the category. */
static void *take(RealDs *ds, uint64_t bytes, ZpMemCategory cat, GError **error)
{
    void *p = real_engine_alloc(ds->be, ds->rank, bytes, cat, error);
    if (p)
        ds->be->fill(ds->be, p, 0, bytes);
    return p;
}

/* The tensor that starts at flat offset `offset`, or -1 (tensors are in flat order). */
static int tensor_at(const RealDs *ds, uint64_t offset)
{
    guint lo = 0, hi = ds->n_t;
    while (lo < hi) {
        const guint mid = (lo + hi) / 2;
        if (ds->t[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ds->n_t && ds->t[lo].offset == offset ? (int)lo : -1;
}

/* The bucket holding flat offset `at`, or -1. */
static int bucket_at(const RealDs *ds, uint64_t at)
{
    for (int k = 0; k < ds->n_buckets; k++)
        if (ds->bk[k].lo <= at && at < ds->bk[k].hi)
            return k;
    return -1;
}

/* A reduction reading a bucket: the data-parallel group's (a tensor group's sums are the
 * model's, real_tp), or qgZ's intra-node all-to-all. */
static gboolean is_reduction(const RealDs *ds, const ZpOp *op)
{
    return op->kind == ZP_OP_COLLECTIVE &&
           ((op->group == ZP_GROUP_DP && !zp_sched_coll_fetches(ds->s, op)) ||
            (op->group == ZP_GROUP_NODE && op->sub == ZP_COLL_ALLTOALL));
}

/* The schedule's tensors (zp_impl_tensors: the layout DeepSpeed's flat groups follow), each
 * matched to real_gpt's, with its stage-3 slice of this rank's partition. */
static gboolean index_tensors(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    GArray *tensors = zp_impl_tensors(s);
    ds->n_t = tensors->len;
    ds->t = g_new0(Tensor, MAX(ds->n_t, 1));
    RealGptDims dims = real_engine_dims(&s->model, &s->plan);
    uint64_t part = 0;
    int k = 0;
    for (guint i = 0; i < ds->n_t; i++) {
        const ZpImplTensor *z = &g_array_index(tensors, ZpImplTensor, i);
        k = i > 0 && ds->t[i - 1].unit == z->unit ? k + 1 : 0;
        RealGptTensor rt[REAL_GPT_MAX_UNIT_TENSORS];
        const int n = real_gpt_unit_tensors(&dims, z->unit, rt);
        const uint64_t in_unit = z->offset - s->unit_offset[z->unit];
        if (k >= n || rt[k].offset_elems != in_unit || rt[k].elems != z->elems) {
            g_array_unref(tensors);
            return fail(error, "unit %d: the schedule's tensor %d (%" G_GUINT64_FORMAT
                        " elements) is not the model's", z->unit, k, z->elems);
        }
        const uint64_t slice = zp_mem_padded_elems(z->elems, (uint64_t)ds->dp) / (uint64_t)ds->dp;
        ds->t[i] = (Tensor){z->unit, k, z->offset, z->elems, in_unit, slice, part, -1,
                            {-1, -1, -1, -1}, {0}, NULL, 0};
        part += slice;
    }
    g_array_unref(tensors);
    /* DeepSpeed pads each parameter to dp (partition_parameters.py _partition_param); the
     * schedule's partition pads each unit, which holds them when no tensor needs padding of
     * its own beyond its unit's. */
    if (ds->stage == 3 && part > s->partition_elems)
        return fail(error, "DeepSpeed's stage 3 pads each tensor to %d ranks: %" G_GUINT64_FORMAT
                    " elements a rank, more than the schedule's partition of %" G_GUINT64_FORMAT,
                    ds->dp, part, s->partition_elems);
    return TRUE;
}

/* The implementation's buckets (under qgZ a bucket is reduced tensor by tensor, by several
 * ops), and the buffer each lands in per micro-step: the one its reductions read; a buffer
 * reducing more than one bucket is a held ipg buffer. */
static gboolean index_buckets(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    for (guint i = 0; i < s->ops->len; i++)
        ds->n_buffers = MAX(ds->n_buffers, zp_sched_op(s, i)->buffer + 1);
    GArray *specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    zp_impl_get(s->plan.impl)->plan_buckets(s, specs);
    ds->n_buckets = (int)specs->len;
    ds->bk = g_new(Bucket, MAX(specs->len, 1));
    for (guint k = 0; k < specs->len; k++) {
        const ZpBucketSpec *b = &g_array_index(specs, ZpBucketSpec, k);
        ds->bk[k] = (Bucket){b->lo, b->hi, -1};
    }
    g_array_unref(specs);
    const int G = s->plan.grad_accum;
    ds->bucket_buffer = g_new(int, MAX((gsize)G * (gsize)ds->n_buckets, 1));
    for (int i = 0; i < G * ds->n_buckets; i++)
        ds->bucket_buffer[i] = -1;
    ds->held = g_new0(gboolean, MAX(ds->n_buffers, 1));
    /* per buffer: the first bucket and micro-step it reduces (micro x buckets + bucket) */
    int *first = g_new(int, MAX(ds->n_buffers, 1));
    for (int b = 0; b < ds->n_buffers; b++)
        first[b] = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (!is_reduction(ds, op))
            continue;
        const int k = bucket_at(ds, op->elem_offset);
        if (k < 0 || op->micro < 0 || op->micro >= G || op->buffer < 0 ||
            op->elem_offset + op->elems > ds->bk[k].hi)
            return g_free(first), fail(error, "op %u: a gradient reduction of a range no bucket "
                                              "covers, or with no buffer", i);
        const int at = op->micro * ds->n_buckets + k;
        ds->bucket_buffer[at] = op->buffer;
        ds->held[op->buffer] |= first[op->buffer] >= 0 && first[op->buffer] != at;
        if (first[op->buffer] < 0)
            first[op->buffer] = at;
    }
    g_free(first);
    for (guint i = 0; i < ds->n_t; i++) {
        Tensor *t = &ds->t[i];
        t->bucket = bucket_at(ds, t->offset);
        if (t->bucket < 0 || t->offset + t->elems > ds->bk[t->bucket].hi)
            return fail(error, "unit %d: tensor %d is in no gradient bucket", t->unit, t->k);
    }
    return TRUE;
}

/* The tied head's wte gradient buffer of each micro-step: a bucket buffer the head op waits
 * for that no reduction uses (zp_sched.c alloc_tied_grad). */
static gboolean index_tied_grad(RealDs *ds)
{
    const ZpSchedule *s = ds->s;
    ds->tied_grad = g_new(int, (gsize)s->plan.grad_accum);
    for (int m = 0; m < s->plan.grad_accum; m++)
        ds->tied_grad[m] = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_HEAD || op->micro < 0 ||
            op->micro >= s->plan.grad_accum)
            continue;
        for (uint32_t k = 0; k < op->n_deps; k++) {
            const ZpOp *d = zp_sched_op(s, zp_sched_deps(s, op)[k]);
            gboolean reduced = FALSE;
            for (int j = 0; j < s->plan.grad_accum * ds->n_buckets; j++)
                reduced |= ds->bucket_buffer[j] == d->buffer;
            if (d->kind == ZP_OP_ALLOC && d->sub == ZP_MEM_BUCKETS && d->unit == 0 && !reduced)
                ds->tied_grad[op->micro] = d->buffer;
        }
    }
    return TRUE;
}

/* Stage 3: the calls zp_impl_deepspeed plans for a micro-step (the schedule issues them in
 * that order, every micro-step alike), each tensor by its flat offset. */
static gboolean index_calls(RealDs *ds, GError **error)
{
    ds->flat_call = g_new(int, MAX(ds->n_buffers, 1));
    ds->quant_of = g_new(int, MAX(ds->n_buffers, 1));
    for (int b = 0; b < ds->n_buffers; b++)
        ds->flat_call[b] = ds->quant_of[b] = -1;
    if (ds->stage != 3)
        return TRUE;
    GArray *fetches = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    zp_impl_get(ds->s->plan.impl)->plan_fetches(ds->s, fetches);
    const ZpFetch *f = (const ZpFetch *)fetches->data;
    ds->calls = g_new0(Call, MAX(2 * fetches->len, 1));
    ds->members = g_new(guint, MAX(fetches->len, 1));
    gboolean ok = TRUE;
    guint m = 0;
    for (guint i = 0, j; ok && i < fetches->len; i = j) {
        for (j = i + 1; j < fetches->len && f[j].joins_previous; j++)
            ;
        /* with hpZ the parameters of a call used in backward go first, in a call of their
         * own (zp_sched.c plan_gathers) */
        for (int pass = 0; pass < 2; pass++) {
            const ZpGroup group = pass == 0 ? ZP_GROUP_HPZ : ZP_GROUP_DP;
            const int ranks = zp_zeropp_group_ranks(&ds->s->plan, group);
            Call c = {m, 0, 0, group, ranks};
            for (guint k = i; ok && k < j; k++) {
                if (zp_sched_fetch_group(ds->s, f[k].use_pos) != group)
                    continue;
                const int x = tensor_at(ds, f[k].offset);
                ok = x >= 0 && f[k].elems == ds->t[x].slice * (uint64_t)ds->dp &&
                     f[k].elems % (uint64_t)ranks == 0;
                ds->members[m++] = (guint)MAX(x, 0);
                c.n++;
                c.per_rank += f[k].elems / (uint64_t)ranks;
            }
            if (c.n > 0)
                ds->calls[ds->n_calls++] = c;
        }
    }
    g_array_unref(fetches);
    return ok ? TRUE : fail(error, "a stage-3 fetch of no whole tensor");
}

/* Stage 2: stage_1_and_2.py copy_grads_in_partition keeps the whole parameters that overlap
 * this rank's partition (params_in_partition), the partition's padding included, in
 * grads_in_partition: the schedule's first gradient alloc, at the step's first reduction
 * (zp_impl.h grads_taken_by_reduction), sized for the rank where that is largest; each later
 * micro-step's copy is the same size. Stage 3: the partition (stage3.py
 * __param_id_to_grad_partition), held throughout. */
static gboolean allocate_grads(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    const uint64_t P = s->partition_elems;
    ds->grad_elems = (uint64_t)(s->state_bytes[ZP_MEM_GRADS] / sizeof(RealBf16));
    ds->gip = -1;
    ds->grad_copy = g_new(int, (gsize)s->plan.grad_accum);
    for (int m = 0; m < s->plan.grad_accum; m++)
        ds->grad_copy[m] = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_ALLOC || op->sub != ZP_MEM_GRADS)
            continue;
        if (ds->stage == 2 && ds->gip < 0 && ds->grad_elems == 0) {
            ds->gip = op->buffer;
            ds->grad_elems = (uint64_t)(op->bytes / sizeof(RealBf16));
            continue;
        }
        if (ds->stage != 2 || op->micro <= 0 || op->micro >= s->plan.grad_accum ||
            op->bytes != (double)(ds->grad_elems * sizeof(RealBf16)))
            return fail(error, "op %u: a gradient copy other than stage 2's of a later "
                        "micro-step, the size of grads_in_partition", i);
        ds->grad_copy[op->micro] = op->buffer;
    }
    if (ds->stage == 2) {
        zp_impl_params_in_partition(s, ds->rank, &ds->gip_lo, &ds->gip_hi);
        if (ds->host_grads) /* offloaded: only the layout of the host's whole-tensor sums */
            return TRUE;
        if (ds->gip < 0)
            return fail(error, "the schedule takes no stage-2 grads_in_partition");
        if (ds->gip_hi - ds->gip_lo > ds->grad_elems)
            return fail(error, "rank %d: grads_in_partition needs %" G_GUINT64_FORMAT
                        " elements, the schedule holds %" G_GUINT64_FORMAT, ds->rank,
                        ds->gip_hi - ds->gip_lo, ds->grad_elems);
        return TRUE; /* the engine allocates it at its op */
    } else if (ds->host_grads) {
        return TRUE;
    } else if (ds->grad_elems != P) {
        return fail(error, "the schedule's stage-3 gradients are not the partition");
    }
    return (ds->grads = take(ds, ds->grad_elems * sizeof(RealBf16), ZP_MEM_GRADS, error)) != NULL;
}

/* Stage 3: the tensors the step refreshes whole (buffer -1 all-gathers after the optimizer:
 * partition_parameters.py ds_persist) get their full copies. */
static gboolean allocate_persistent(RealDs *ds, GError **error)
{
    const ZpSchedule *s = ds->s;
    for (guint i = 0; ds->stage == 3 && i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COLLECTIVE || op->group != ZP_GROUP_DP ||
            op->sub != ZP_COLL_ALLGATHER || op->buffer >= 0)
            continue;
        const int x = tensor_at(ds, op->elem_offset);
        if (x < 0 || op->elems != ds->t[x].slice * (uint64_t)ds->dp)
            return fail(error, "op %u: a persistent all-gather of no whole tensor", i);
        if (!(ds->t[x].persistent = take(ds, op->elems * sizeof(RealBf16),
                                         ZP_MEM_GATHERED_PARAMS, error)))
            return FALSE;
    }
    return TRUE;
}

RealDs *real_ds_new(const ZpSchedule *s, RealBackend *be, RealComm *comm, void **buffers,
                    RealBf16 *params, GError **error)
{
    RealDs *ds = g_new0(RealDs, 1);
    *ds = (RealDs){.s = s, .be = be, .comm = comm, .buffers = buffers, .params = params,
                   .pending = g_array_new(FALSE, FALSE, sizeof(Pending)),
                   .stage = s->plan.zero.stage, .dp = s->plan.dp, .rank = comm->rank,
                   .host_grads = zp_offload_cpu_share(&s->plan, (double)s->partition_elems) > 0,
                   .host_params = zp_offload_param_tier(&s->plan) != ZP_TIER_GPU};
    if (!index_tensors(ds, error) || !index_buckets(ds, error) || !index_calls(ds, error) ||
        !index_tied_grad(ds) || !allocate_grads(ds, error) || !allocate_persistent(ds, error)) {
        real_ds_free(ds);
        return NULL;
    }
    return ds;
}

void real_ds_free(RealDs *ds)
{
    if (!ds)
        return;
    for (guint i = 0; i < ds->n_t; i++)
        ds->be->free(ds->be, ds->t[i].persistent);
    ds->be->free(ds->be, ds->grads);
    g_free(ds->grad_copy);
    for (guint i = 0; i < ds->pending->len; i++)
        ds->be->free(ds->be, g_array_index(ds->pending, Pending, i).grad);
    g_array_unref(ds->pending);
    g_free(ds->t), g_free(ds->bk), g_free(ds->bucket_buffer);
    g_free(ds->held);
    g_free(ds->calls), g_free(ds->members), g_free(ds->flat_call), g_free(ds->tied_grad);
    g_free(ds->quant_of);
    ds->be->free(ds->be, ds->secondary);
    g_free(ds);
}

gboolean real_ds_init_params(RealDs *ds, RealDsInitFn init, void *engine, GError **error)
{
    for (guint i = 0; i < ds->n_t; i++) {
        const Tensor *t = &ds->t[i];
        const uint64_t first = MIN((uint64_t)ds->rank * t->slice, t->elems);
        const uint64_t count = MIN(t->slice, t->elems - first);
        if ((count > 0 && !init(engine, t->unit, t->in_unit + first, count,
                                ds->params + t->part, error)) ||
            (t->persistent && !init(engine, t->unit, t->in_unit, t->elems, t->persistent, error)))
            return FALSE;
    }
    return TRUE;
}

/* Where a compute op reads tensor t's parameters: stage 2's full copy, stage 3's persistent
 * copy or its live gather. */
static RealBf16 *tensor_params(RealDs *ds, const Tensor *t, GError **error)
{
    if (ds->stage == 2)
        return ds->params + t->offset;
    if (t->persistent)
        return t->persistent;
    for (size_t i = 0; i < G_N_ELEMENTS(t->gathered); i++)
        if (t->gathered[i] >= 0 && ds->buffers[t->gathered[i]])
            return (RealBf16 *)ds->buffers[t->gathered[i]] + t->gathered_at[i];
    return fail(error, "rank %d: unit %d's tensor %d is used but was not gathered", ds->rank,
                t->unit, t->k), NULL;
}

/* Whether bucket k of micro-step `micro` has its place (its own buffer, or the held ipg
 * buffer) or can take it now: an ipg buffer holds one bucket at a time, from its first
 * gradient to its reduction (DeepSpeed's bucket.buffer from offset 0, emptied by
 * __reduce_and_partition_ipg_grads / reduce_ipg_grads), and the buckets fill in their order,
 * so not while an earlier one's gradients wait. */
static gboolean has_room(const RealDs *ds, int k, int micro)
{
    const int id = ds->bucket_buffer[micro * ds->n_buckets + k];
    if (id < 0 || !ds->held[id] || ds->bk[k].landed_in == id)
        return TRUE;
    for (guint i = 0; i < ds->pending->len; i++)
        if (ds->t[g_array_index(ds->pending, Pending, i).tensor].bucket < k)
            return FALSE;
    for (int j = 0; j < ds->n_buckets; j++)
        if (ds->bk[j].landed_in == id)
            return FALSE;
    return TRUE;
}

/* Where bucket k's gradients of micro-step `micro` lie: the start of its own buffer or of the
 * held ipg buffer, taken when its first tensor lands. Either is zeroed then, as
 * backward adds into it (real_engine zeroes no bucket of unit -1, such as the ipg buffer
 * when it reduces one bucket only). DeepSpeed fills the ipg buffer tensor by tensor and
 * reduces it when the next parameter does not fit (stage3.py
 * reduce_independent_p_g_buckets_and_remove_grads); a module's backward here hands on its
 * tensors' gradients together, and a bucket with no room yet is not landed (its gradients
 * wait: Pending). */
static RealBf16 *land(RealDs *ds, int k, int micro, GError **error)
{
    Bucket *b = &ds->bk[k];
    const int id = ds->bucket_buffer[micro * ds->n_buckets + k];
    RealBf16 *buf = id >= 0 ? ds->buffers[id] : NULL;
    if (!buf)
        return fail(error, "rank %d: bucket [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ") of "
                    "micro-step %d has no buffer allocated", ds->rank, b->lo, b->hi, micro), NULL;
    if (b->landed_in != id) {
        if (!has_room(ds, k, micro))
            return fail(error, "rank %d: bucket [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        ") is reduced while the ipg buffer (reduce_bucket_size %.0f elements) "
                        "has no room for it", ds->rank, b->lo, b->hi,
                        ds->s->plan.zero.reduce_bucket_size), NULL;
        b->landed_in = id;
        ds->be->fill(ds->be, buf, 0, (b->hi - b->lo) * sizeof(RealBf16));
    }
    return buf;
}

/* Where tensor x's gradients of micro-step `micro` are added: its place in its bucket, or
 * while the bucket has no room a zeroed buffer of its own (one per tensor and micro-step). */
static RealBf16 *grad_place(RealDs *ds, guint x, int micro, GError **error)
{
    const Tensor *t = &ds->t[x];
    if (has_room(ds, t->bucket, micro)) {
        RealBf16 *place = land(ds, t->bucket, micro, error);
        return place ? place + (t->offset - ds->bk[t->bucket].lo) : NULL;
    }
    for (guint i = 0; i < ds->pending->len; i++) {
        const Pending *w = &g_array_index(ds->pending, Pending, i);
        if (w->tensor == x && w->micro == micro)
            return w->grad;
    }
    const Pending w = {x, micro, take(ds, t->elems * sizeof(RealBf16), ZP_MEM_WORKSPACE, error)};
    if (w.grad)
        g_array_append_val(ds->pending, w);
    return w.grad;
}

/* The waiting gradients whose buckets have room now, copied into them, in the order they
 * were handed on. */
static gboolean land_pending(RealDs *ds, GError **error)
{
    for (guint i = 0; i < ds->pending->len;) {
        const Pending w = g_array_index(ds->pending, Pending, i);
        const Tensor *t = &ds->t[w.tensor];
        if (!has_room(ds, t->bucket, w.micro)) {
            i++;
            continue;
        }
        RealBf16 *place = land(ds, t->bucket, w.micro, error);
        if (!place)
            return FALSE;
        ds->be->copy(ds->be, place + (t->offset - ds->bk[t->bucket].lo), w.grad,
                     t->elems * sizeof(RealBf16));
        ds->be->free(ds->be, w.grad);
        g_array_remove_index(ds->pending, i);
    }
    return TRUE;
}

/* The tied head's wte gradient of micro-step `micro` when it waits in a buffer of its own:
 * the head (which asks for wte alone) writes there; the embedding's backward finds it
 * copied into wte's place of its bucket, untouched since the bucket landed (no other op
 * writes wte's gradient), and adds its own (autograd's sum, then the hook's copy into the
 * ipg buffer). */
static RealBf16 *tied_grad(RealDs *ds, guint x, uint32_t used, int micro, GError **error)
{
    RealBf16 *wait = ds->buffers[ds->tied_grad[micro]];
    if (!wait)
        return fail(error, "rank %d: the tied head's wte gradient has no buffer", ds->rank),
               NULL;
    if (used == 1u)
        return wait;
    RealBf16 *place = grad_place(ds, x, micro, error);
    if (place)
        ds->be->copy(ds->be, place, wait, ds->t[x].elems * sizeof(RealBf16));
    return place;
}

/* Unit u's tensors in `used`: their parameters (micro -1) or where micro-step micro's
 * gradients land. */
static gboolean view(RealDs *ds, int unit, uint32_t used, int micro, RealGptTensors *out,
                     GError **error)
{
    memset(out, 0, sizeof *out);
    /* from the last tensor down, as backward hands gradients on */
    for (guint j = ds->n_t; j-- > 0;) {
        const guint i = j;
        const Tensor *t = &ds->t[i];
        if (t->unit != unit || !(used >> t->k & 1))
            continue;
        if (micro >= 0 && t->unit == 0 && t->k == 0 && ds->tied_grad[micro] >= 0) {
            if (!(out->at[t->k] = tied_grad(ds, i, used, micro, error)))
                return FALSE;
            continue;
        }
        if (!(out->at[t->k] = micro < 0 ? tensor_params(ds, t, error)
                                        : grad_place(ds, i, micro, error)))
            return FALSE;
    }
    return TRUE;
}

gboolean real_ds_params(RealDs *ds, int unit, uint32_t used, RealGptTensors *out,
                        GError **error)
{
    return view(ds, unit, used, -1, out, error);
}

gboolean real_ds_grads(RealDs *ds, int unit, uint32_t used, int micro, RealGptTensors *out,
                       GError **error)
{
    return view(ds, unit, used, micro, out, error);
}

/* Stage 2's grads_in_partition while the schedule holds it, else NULL. */
static RealBf16 *grads_in_partition(const RealDs *ds)
{
    return ds->gip >= 0 ? (RealBf16 *)ds->buffers[ds->gip] : NULL;
}

const RealBf16 *real_ds_step_grads(const RealDs *ds)
{
    const RealBf16 *g = grads_in_partition(ds);
    if (ds->stage != 2)
        return ds->grads;
    return g ? g + ((uint64_t)ds->rank * ds->s->partition_elems - ds->gip_lo) : NULL;
}

/* Stage 2: the elements of flat range [lo, hi) in rank q's partition, from *start. */
static uint64_t part_overlap(const RealDs *ds, uint64_t lo, uint64_t hi, int q, uint64_t *start)
{
    const uint64_t P = ds->s->partition_elems;
    const uint64_t x = MAX(lo, (uint64_t)q * P), y = MIN(hi, (uint64_t)(q + 1) * P);
    *start = x;
    return y > x ? y - x : 0;
}

/* Stage 2: the bucket all-reduced (use_multi_rank_bucket_allreduce) or each rank's part of it
 * reduced to it (stage_1_and_2.py average_tensor); grads_in_partition takes the whole
 * tensors that overlap this rank's partition, the rest is dropped; a later micro-step's land
 * in its copy (copy_grads_in_partition), added to the sum in bf16 (the epilogue's
 * accumulated_grad.add_(new_avg_grad), here bucket by bucket: the same sums). */
static gboolean reduce_stage2(RealDs *ds, const ZpOp *op, RealBf16 *data, GError **error)
{
    const uint64_t lo = op->elem_offset, hi = lo + op->elems;
    uint64_t a = MAX(lo, ds->gip_lo), b = MIN(hi, ds->gip_hi), start;
    gboolean ok;
    if (op->sub == ZP_COLL_ALLREDUCE) {
        ok = ds->comm->allreduce_bf16(ds->comm, data, hi - lo, error);
    } else {
        int *counts = g_new0(int, ds->dp);
        for (int q = 0; q < ds->dp; q++)
            counts[q] = (int)part_overlap(ds, lo, hi, q, &start);
        ok = ds->comm->reduce_scatter_bf16(ds->comm, data, counts, error);
        g_free(counts);
        const uint64_t mine = part_overlap(ds, lo, hi, ds->rank, &a);
        b = a + mine;
    }
    if (!ok || b <= a || ds->host_grads)
        return ok;
    /* all-reduced: the bucket in place; reduced to its owner: this rank's part first */
    const RealBf16 *src = op->sub == ZP_COLL_ALLREDUCE ? data + (a - lo) : data;
    if (!grads_in_partition(ds))
        return fail(error, "rank %d: micro-step %d reduces before grads_in_partition is "
                    "allocated", ds->rank, op->micro);
    RealBf16 *sum = grads_in_partition(ds) + (a - ds->gip_lo);
    const int copy = op->micro > 0 ? ds->grad_copy[op->micro] : -1;
    if (copy >= 0 && !ds->buffers[copy])
        return fail(error, "rank %d: micro-step %d's gradient copy is not allocated", ds->rank,
                    op->micro);
    if (copy < 0) {
        real_engine_deliver(ds->be, sum, src, b - a, op->micro > 0);
        return TRUE;
    }
    RealBf16 *dst = (RealBf16 *)ds->buffers[copy] + (a - ds->gip_lo);
    real_engine_deliver(ds->be, dst, src, b - a, FALSE);
    real_engine_deliver(ds->be, sum, dst, b - a, TRUE);
    return TRUE;
}

/* Stage 3: stage3.py __avg_scatter_grads -> reduce_scatter_coalesced: each tensor padded to dp
 * and cut in dp slices, the slices concatenated rank by rank into the copy, reduce-scattered,
 * and this rank's slices added to its gradient partition. One tensor that needs no padding
 * (qgZ's fallback, reduce_scatter_coalesced([tensor])) is reduce-scattered in place, in its
 * bucket (data, at op's offset), with no copy. */
static gboolean reduce_stage3(RealDs *ds, const ZpOp *op, RealBf16 *data, RealBf16 *copy,
                              uint64_t copy_bytes, GError **error)
{
    const int first = tensor_at(ds, op->elem_offset);
    guint last = (guint)MAX(first, 0);
    uint64_t per_rank = 0;
    while (first >= 0 && last < ds->n_t && ds->t[last].offset < op->elem_offset + op->elems)
        per_rank += ds->t[last++].slice;
    const size_t b2 = sizeof(RealBf16);
    const uint64_t padded = per_rank * (uint64_t)ds->dp;
    if (!copy && first >= 0 && last == (guint)first + 1 && ds->t[first].elems == padded)
        copy = data, copy_bytes = padded * b2;
    if (first < 0 || padded * b2 != copy_bytes)
        return fail(error, "a stage-3 reduction whose concatenation copy is not its tensors "
                           "padded to %d ranks", ds->dp);
    if (copy != data)
        ds->be->fill(ds->be, copy, 0, padded * b2);
    for (int q = 0; copy != data && q < ds->dp; q++) {
        RealBf16 *dst = copy + (uint64_t)q * per_rank;
        for (guint i = (guint)first; i < last; i++) {
            const Tensor *t = &ds->t[i];
            const uint64_t from = MIN((uint64_t)q * t->slice, t->elems);
            ds->be->copy(ds->be, dst, data + (t->offset - op->elem_offset) + from,
                         MIN(t->slice, t->elems - from) * b2);
            dst += t->slice;
        }
    }
    int *counts = g_new(int, ds->dp);
    for (int q = 0; q < ds->dp; q++)
        counts[q] = (int)per_rank;
    const gboolean ok = ds->comm->reduce_scatter_bf16(ds->comm, copy, counts, error);
    g_free(counts);
    const RealBf16 *mine = copy;
    for (guint i = (guint)first; ok && !ds->host_grads && i < last; mine += ds->t[i].slice, i++)
        real_engine_deliver(ds->be, ds->grads + ds->t[i].part, mine, ds->t[i].slice,
                            op->micro > 0);
    return ok;
}

/* The concatenation copy a stage-3 reduction depends on: a bucket buffer of its own alloc
 * (its size in *bytes). */
static RealBf16 *concat_copy(RealDs *ds, const ZpOp *op, uint64_t *bytes)
{
    const uint32_t *deps = zp_sched_deps(ds->s, op);
    for (uint32_t i = 0; i < op->n_deps; i++) {
        const ZpOp *d = zp_sched_op(ds->s, deps[i]);
        if (d->kind == ZP_OP_ALLOC && d->sub == ZP_MEM_BUCKETS && d->buffer != op->buffer) {
            *bytes = (uint64_t)d->bytes;
            return ds->buffers[d->buffer];
        }
    }
    return NULL;
}

/* The gradients a reduction reads, at its offset of its bucket's place (*bucket: which),
 * with any of them still waiting landed first. */
static RealBf16 *reduced_grads(RealDs *ds, const ZpOp *op, int *bucket, GError **error)
{
    const int k = *bucket = bucket_at(ds, op->elem_offset);
    if (k < 0)
        return fail(error, "a reduction of no bucket"), NULL;
    RealBf16 *data = land_pending(ds, error) ? land(ds, k, op->micro, error) : NULL;
    return data ? data + (op->elem_offset - ds->bk[k].lo) : NULL;
}

/* After a reduction: once it read the bucket's last tensor, the bucket's place in a held
 * buffer is free again, and the gradients waiting for room are copied in. */
static gboolean reduced(RealDs *ds, const ZpOp *op, int k, GError **error)
{
    if (op->elem_offset + op->elems == ds->bk[k].hi)
        ds->bk[k].landed_in = -1;
    return land_pending(ds, error);
}

static gboolean reduce(RealDs *ds, const ZpOp *op, GError **error)
{
    int k;
    RealBf16 *data = reduced_grads(ds, op, &k, error);
    if (!data)
        return FALSE;
    gboolean ok;
    if (ds->stage == 2) {
        ok = reduce_stage2(ds, op, data, error);
    } else {
        uint64_t bytes = 0;
        RealBf16 *copy = concat_copy(ds, op, &bytes);
        ok = reduce_stage3(ds, op, data, copy, bytes, error);
    }
    return ok && reduced(ds, op, k, error);
}

gboolean real_ds_qgz(RealDs *ds, const ZpOp *op, RealComm *node, RealComm *cross,
                     uint8_t *work, GError **error)
{
    const ZpPlan *plan = &ds->s->plan;
    const int x = tensor_at(ds, op->elem_offset);
    const Tensor *t = x >= 0 ? &ds->t[x] : NULL;
    if (ds->stage != 3 || !t || op->elems != t->elems)
        return fail(error, "a qgZ all-to-all of no whole tensor of DeepSpeed's stage 3");
    const ZpQgz q = zp_zeropp_qgz_tensor(plan, (double)t->elems, (double)ds->s->model.hidden,
                                         zp_plan_reduce_bytes(plan));
    const uint64_t world = (uint64_t)ds->dp, groups = (uint64_t)q.groups;
    if (groups % world != 0 || t->slice * world != t->elems)
        return fail(error, "qgZ: unit %d's tensor %d (%" G_GUINT64_FORMAT " elements) has %"
                    G_GUINT64_FORMAT " quantisation groups; zreal quantises each of %d ranks' "
                    "partitions in whole groups", t->unit, t->k, t->elems, groups, ds->dp);
    int k;
    RealBf16 *data = reduced_grads(ds, op, &k, error);
    if (!data)
        return FALSE;
    /* swizzle_quant's partitions: rank q's is elements [q slice, (q + 1) slice) */
    float *pieces = take(ds, t->elems * sizeof(float), ZP_MEM_WORKSPACE, error);
    RealBf16 *mine = pieces ? take(ds, t->slice * sizeof(RealBf16), ZP_MEM_WORKSPACE, error)
                            : NULL;
    for (uint64_t i = 0; mine && i < t->elems; i++)
        pieces[i] = real_bf16_to_f32(data[i]);
    const gboolean ok = mine && real_engine_qgz(ds->be, ds->rank, ds->comm, node, cross, pieces,
                                                t->slice, groups / world, work, mine, error);
    if (ok)
        real_engine_deliver(ds->be, ds->grads + t->part, mine, t->slice, op->micro > 0);
    ds->be->free(ds->be, pieces);
    ds->be->free(ds->be, mine);
    return ok && reduced(ds, op, k, error);
}

/* Stage 3: tensor t is in buffer id too, from element `at` (in a slot whose buffer is freed,
 * or unused; the same ops, so the same ids, come again every step). */
static gboolean hold(RealDs *ds, Tensor *t, int id, uint64_t at, GError **error)
{
    for (size_t i = 0; i < G_N_ELEMENTS(t->gathered); i++)
        if (t->gathered[i] == id) {
            t->gathered_at[i] = at;
            return TRUE;
        }
    for (size_t i = 0; i < G_N_ELEMENTS(t->gathered); i++)
        if (t->gathered[i] < 0 || !ds->buffers[t->gathered[i]]) {
            t->gathered[i] = id;
            t->gathered_at[i] = at;
            return TRUE;
        }
    return fail(error, "rank %d: unit %d's tensor %d is gathered more than %zu times at once",
                ds->rank, t->unit, t->k, G_N_ELEMENTS(t->gathered));
}

/* The communicator of call c: the data-parallel group's, or hpZ's (real_ds_hpz). */
static RealComm *call_comm(const RealDs *ds, const Call *c)
{
    return c->group == ZP_GROUP_HPZ ? ds->hpz_comm : ds->comm;
}

/* What tensor t puts in call c: its slice of the partition (the data-parallel group), or of
 * the secondary partition (hpZ's group: its padded elements / hpZ ranks,
 * partition_parameters.py _partition_param_sec secondary_partition_size). */
static uint64_t call_slice(const RealDs *ds, const Call *c, const Tensor *t)
{
    return t->slice * (uint64_t)ds->dp / (uint64_t)c->ranks;
}

static const RealBf16 *call_source(const RealDs *ds, const Call *c, const Tensor *t)
{
    return c->group == ZP_GROUP_HPZ ? ds->secondary + t->sec : ds->params + t->part;
}

/* This rank's slices of call c, one after another at its place of dst (every rank's in
 * turn: _all_gather_dtype's partitions[rank_in_group]; with use_secondary_tensor the
 * ds_secondary_tensors, _all_gather_coalesced). */
static void place_slices(RealDs *ds, const Call *c, RealBf16 *dst)
{
    RealBf16 *mine = dst + (uint64_t)call_comm(ds, c)->rank * c->per_rank;
    for (guint i = 0; i < c->n; i++) {
        const Tensor *t = &ds->t[ds->members[c->first + i]];
        const uint64_t n = call_slice(ds, c, t);
        ds->be->copy(ds->be, mine, call_source(ds, c, t), n * sizeof(RealBf16));
        mine += n;
    }
}

/* hpZ: a tensor gathered whole over the data-parallel group leaves this rank its slice of
 * the secondary partition, the unpadded elements from secondary_partition_size x
 * rank_in_group on (partition_parameters.py _partition_param_sec, called by _partition when
 * the module releases it; the values are those of the gather). */
static void keep_secondary(RealDs *ds, const Call *c, const Tensor *t, const RealBf16 *full)
{
    if (!ds->secondary || c->group != ZP_GROUP_DP || t->sec == G_MAXUINT64)
        return;
    const uint64_t n = t->slice * (uint64_t)ds->dp / (uint64_t)ds->hpz_comm->size;
    const uint64_t start = n * (uint64_t)ds->hpz_comm->rank;
    if (start < t->elems)
        ds->be->copy(ds->be, ds->secondary + t->sec, full + start,
                     MIN(n, t->elems - start) * sizeof(RealBf16));
}

gboolean real_ds_hpz(RealDs *ds, RealComm *hpz_comm, GError **error)
{
    if (ds->stage != 3 || ds->host_params)
        return fail(error, "zreal executes DeepSpeed's hpZ (zero_hpz_partition_size) at stage 3 "
                           "without offload_param");
    ds->hpz_comm = hpz_comm;
    uint64_t at = 0;
    for (guint i = 0; i < ds->n_t; i++) {
        Tensor *t = &ds->t[i];
        t->sec = t->persistent ? G_MAXUINT64 : at;
        at += t->persistent ? 0 : t->slice * (uint64_t)ds->dp / (uint64_t)hpz_comm->size;
    }
    const double bytes = (double)(at * sizeof(RealBf16));
    if (bytes != ds->s->state_bytes[ZP_MEM_SECONDARY_PARAMS])
        return fail(error, "DeepSpeed's secondary partition of the tensors DeepSpeed does not "
                    "persist is %.0f bytes a rank, the schedule's %.0f (it pads units, "
                    "DeepSpeed tensors)", bytes, ds->s->state_bytes[ZP_MEM_SECONDARY_PARAMS]);
    return (ds->secondary = take(ds, MAX(bytes, 1), ZP_MEM_SECONDARY_PARAMS, error)) != NULL;
}

/* qwZ (partition_parameters.py _all_gather_coalesced and _all_gather_sequential with
 * quantize): this rank's slices of the next call, concatenated (in its place of the call's
 * gathered buffer), quantised in the groups of CUDAQuantizer.quantize into its place of the
 * int8 buffer; once waited for (AllGatherCoalescedHandle.wait, AllGatherHandle.wait), every
 * rank's dequantised into the gathered buffer, to be unpacked as without qwZ. */
gboolean real_ds_qwz(RealDs *ds, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = ds->s;
    const guint index = (guint)(op - zp_sched_op(s, 0));
    const gboolean quantize = op->stream == ZP_STREAM_DP;
    const ZpOp *coll = quantize ? (index + 1 < s->ops->len ? zp_sched_op(s, index + 1) : NULL)
                                : (op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0])
                                                  : NULL);
    const ZpOp *alloc = op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0]) : NULL;
    if (ds->n_calls == 0 || !coll || coll->kind != ZP_OP_COLLECTIVE ||
        coll->sub != ZP_COLL_ALLGATHER || coll->buffer < 0 || !ds->buffers[coll->buffer] ||
        (quantize && (alloc->kind != ZP_OP_ALLOC || !ds->buffers[alloc->buffer])))
        return fail(error, "a qwZ op that does not sit around a stage-3 call's all-gather "
                           "(its int8 buffer's alloc, the quantize, the gather; the dequantize "
                           "after it)");
    const int k = quantize ? (int)(ds->next_call % ds->n_calls) : ds->flat_call[coll->buffer];
    if (k < 0)
        return fail(error, "a dequantize op of no quantised call");
    const Call *c = &ds->calls[k];
    const uint64_t n = c->per_rank, groups = zp_zeropp_qwz_groups(n);
    const size_t bytes = real_zeropp_quantized_bytes(n, groups);
    RealBf16 *dst = ds->buffers[coll->buffer];
    const int rank = call_comm(ds, c)->rank;
    if (quantize) {
        place_slices(ds, c, dst);
        uint8_t *int8 = ds->buffers[alloc->buffer];
        real_zeropp_quantize(dst + (uint64_t)rank * n, n, groups, int8 + (size_t)rank * bytes);
        ds->quant_of[coll->buffer] = alloc->buffer;
        ds->flat_call[coll->buffer] = k; /* the call, for its dequantize (and unpack) */
        return TRUE;
    }
    const int id = ds->quant_of[coll->buffer];
    if (id < 0 || !ds->buffers[id])
        return fail(error, "a dequantize op with no gathered int8 buffer");
    for (int q = 0; q < c->ranks; q++)
        real_zeropp_dequantize((const uint8_t *)ds->buffers[id] + (size_t)q * bytes, n, groups,
                               dst + (uint64_t)q * n);
    ds->quant_of[coll->buffer] = -1;
    if (c->n == 1) { /* gathered into its tensor's own buffer: nothing to unpack */
        ds->flat_call[coll->buffer] = -1;
        keep_secondary(ds, c, &ds->t[ds->members[c->first]], dst);
    }
    return TRUE;
}

/* stage3_use_all_reduce_for_fetch_params (partition_parameters.py _all_gather_coalesced): the
 * zeroed flat buffer holds each tensor's padded size in turn, this rank's slice at its place
 * in it; summed over the ranks it holds every tensor whole, read in place (param.data =
 * flat_tensor.narrow), nothing to unpack. */
static gboolean fetch_allreduce(RealDs *ds, const Call *c, int id, RealBf16 *dst,
                                GError **error)
{
    /* with parameter offload the transfers before the call zeroed it and put this rank's
     * slices in place (real_ds_param_transfer) */
    if (!ds->host_params)
        ds->be->fill(ds->be, dst, 0, c->per_rank * (uint64_t)ds->dp * sizeof(RealBf16));
    uint64_t at = 0;
    for (guint i = 0; i < c->n; i++) {
        Tensor *t = &ds->t[ds->members[c->first + i]];
        if (!ds->host_params)
            ds->be->copy(ds->be, dst + at + (uint64_t)ds->rank * t->slice, ds->params + t->part,
                         t->slice * sizeof(RealBf16));
        if (!hold(ds, t, id, at, error))
            return FALSE;
        at += t->slice * (uint64_t)ds->dp;
    }
    if (!ds->comm->allreduce_bf16(ds->comm, dst, at, error))
        return FALSE;
    at = 0;
    for (guint i = 0; i < c->n; i++) {
        const Tensor *t = &ds->t[ds->members[c->first + i]];
        keep_secondary(ds, c, t, dst + at);
        at += t->slice * (uint64_t)ds->dp;
    }
    return TRUE;
}

/* Stage 3: the micro-step's next call (partitioned_param_coordinator.py
 * __all_gather_params_ -> partition_parameters.py all_gather_coalesced). One tensor is gathered
 * into its own buffer (_all_gather_sequential); more, each rank's slices concatenated into
 * its place of the flat buffer, gathered in place (_all_gather_dtype), to be unpacked. */
static gboolean gather_call(RealDs *ds, const ZpOp *op, GError **error)
{
    if (ds->n_calls == 0)
        return fail(error, "a stage-3 all-gather where DeepSpeed plans none");
    const guint k = ds->next_call++ % ds->n_calls;
    const Call *c = &ds->calls[k];
    Tensor *first = &ds->t[ds->members[c->first]];
    RealBf16 *dst = ds->buffers[op->buffer];
    RealComm *comm = call_comm(ds, c);
    if (op->elem_offset != first->offset || op->elems != c->per_rank * (uint64_t)c->ranks ||
        op->group != c->group || !dst || !comm)
        return fail(error, "rank %d: all-gather %u of the micro-step is not DeepSpeed's call "
                    "at flat offset %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT " elements "
                    "over the %s group", ds->rank, k, first->offset,
                    c->per_rank * (uint64_t)c->ranks, c->group == ZP_GROUP_HPZ ? "hpZ" : "DP");
    if (ds->quant_of[op->buffer] >= 0) { /* qwZ: the int8 and scales instead (real_ds_qwz) */
        if (ds->flat_call[op->buffer] != (int)k)
            return fail(error, "rank %d: a qwZ gather of another call than the one quantised",
                        ds->rank);
        if (c->n == 1 && !hold(ds, first, op->buffer, 0, error))
            return FALSE;
        return comm->allgather_bytes(
            comm, ds->buffers[ds->quant_of[op->buffer]],
            real_zeropp_quantized_bytes(c->per_rank, zp_zeropp_qwz_groups(c->per_rank)), error);
    }
    /* with parameter offload the transfers before the call put this rank's slices in place */
    RealBf16 *mine = dst + (uint64_t)comm->rank * c->per_rank;
    if (c->n == 1) {
        if (!hold(ds, first, op->buffer, 0, error) ||
            !comm->allgather_bf16(comm, ds->host_params ? mine : call_source(ds, c, first),
                                  c->per_rank, dst, error))
            return FALSE;
        keep_secondary(ds, c, first, dst);
        return TRUE;
    }
    if (op->sub == ZP_COLL_ALLREDUCE)
        return fetch_allreduce(ds, c, op->buffer, dst, error);
    if (!ds->host_params)
        place_slices(ds, c, dst);
    ds->flat_call[op->buffer] = (int)k;
    return comm->allgather_bf16(comm, mine, c->per_rank, dst, error);
}

gboolean real_ds_param_transfer(RealDs *ds, const ZpOp *op, const ZpOp *alloc, RealOffload *o,
                                GError **error)
{
    const Call *c = ds->n_calls ? &ds->calls[ds->next_call % ds->n_calls] : NULL;
    RealBf16 *dst = alloc->buffer >= 0 ? ds->buffers[alloc->buffer] : NULL;
    if (!c || !dst || alloc->bytes != (double)(c->per_rank * (uint64_t)ds->dp * sizeof(RealBf16)))
        return fail(error, "rank %d: a parameter fetch before no call of DeepSpeed's", ds->rank);
    if (op->sub != ZP_XFER_NVME_READ && op->sub != ZP_XFER_H2D)
        return fail(error, "a parameter fetch moves slices from NVMe and up, nothing else");
    /* An all-reduce fetch (zp_sched_fetch_allreduce; partition_parameters.py
     * _all_gather_coalesced): each slice up into its place in its parameter's region of the
     * zeroed buffer (flat_tensor.narrow(0, start, ...).copy_(param.ds_tensor)); else into
     * this rank's part, the slices one after the other. */
    const gboolean reduced = zp_sched_fetch_allreduce(&ds->s->plan, c->n, ZP_GROUP_DP);
    if (reduced && op->sub == ZP_XFER_H2D)
        ds->be->fill(ds->be, dst, 0, c->per_rank * (uint64_t)ds->dp * sizeof(RealBf16));
    else
        dst += (uint64_t)ds->rank * c->per_rank;
    uint64_t at = 0, place = 0; /* the tensor's slice inside this rank's part (and the pool),
                                 * and its place in the buffer */
    for (guint i = 0; i < c->n; i++) {
        const Tensor *t = &ds->t[ds->members[c->first + i]];
        if (op->sub == ZP_XFER_NVME_READ) {
            if (!real_offload_param_read(o, t->part, t->slice, at, error))
                return FALSE;
        } else {
            real_offload_param_fetch(o, dst + (reduced ? place + ds->rank * t->slice : at),
                                     t->part, t->slice, at);
        }
        at += t->slice, place += t->slice * (uint64_t)ds->dp;
    }
    return TRUE;
}

gboolean real_ds_unpack(RealDs *ds, const ZpOp *op, GError **error)
{
    const uint32_t *deps = zp_sched_deps(ds->s, op);
    const ZpOp *coll = op->n_deps > 0 ? zp_sched_op(ds->s, deps[0]) : NULL;
    if (coll && coll->kind == ZP_OP_COMPUTE && coll->sub == ZP_COMP_QUANTIZE && coll->n_deps > 0)
        coll = zp_sched_op(ds->s, zp_sched_deps(ds->s, coll)[0]); /* qwZ: after its dequantize */
    const int k = coll && coll->kind == ZP_OP_COLLECTIVE && coll->buffer >= 0
                      ? ds->flat_call[coll->buffer] : -1;
    if (k < 0 || op->n_deps != ds->calls[k].n + 1)
        return fail(error, "an unpack op that follows no coalesced all-gather, or not one "
                           "buffer for each of its tensors");
    const Call *c = &ds->calls[k];
    const RealBf16 *flat = ds->buffers[coll->buffer];
    uint64_t at = 0; /* the tensor's slice inside each rank's part */
    for (guint i = 0; i < c->n; i++) {
        Tensor *t = &ds->t[ds->members[c->first + i]];
        const ZpOp *alloc = zp_sched_op(ds->s, deps[i + 1]);
        RealBf16 *dst = alloc->kind == ZP_OP_ALLOC ? ds->buffers[alloc->buffer] : NULL;
        if (!dst || alloc->bytes != (double)(t->elems * sizeof(RealBf16)))
            return fail(error, "unpack: unit %d's tensor %d has no buffer of its size", t->unit,
                        t->k);
        /* AllGatherCoalescedHandle.wait: ds_tensor_numel (x ds_secondary_tensor_num_of_groups
         * from the secondary partition) from each rank's part, the unpadded elements */
        const uint64_t n = call_slice(ds, c, t);
        for (int q = 0; q < c->ranks && (uint64_t)q * n < t->elems; q++)
            ds->be->copy(ds->be, dst + (uint64_t)q * n, flat + q * c->per_rank + at,
                         MIN(n, t->elems - (uint64_t)q * n) * sizeof(RealBf16));
        keep_secondary(ds, c, t, dst);
        if (!hold(ds, t, alloc->buffer, 0, error))
            return FALSE;
        at += n;
    }
    ds->flat_call[coll->buffer] = -1;
    return TRUE;
}

/* Stage 3: a call (gather_call), or a persistent tensor's full copy after the step; stage 2:
 * the updated partitions in place (runtime/utils.py all_gather_dp_groups). */
static gboolean gather(RealDs *ds, const ZpOp *op, GError **error)
{
    const uint64_t P = ds->s->partition_elems;
    if (ds->stage == 2) {
        if (op->buffer >= 0 || op->elem_offset != 0 || op->elems != P * (uint64_t)ds->dp)
            return fail(error, "DeepSpeed's stage 2 all-gathers the partitions in place, in "
                               "one chunk (allgather_bucket_size at least the parameters)");
        return ds->comm->allgather_bf16(ds->comm, ds->params + (uint64_t)ds->rank * P, P,
                                        ds->params, error);
    }
    if (op->buffer >= 0)
        return gather_call(ds, op, error);
    const int x = tensor_at(ds, op->elem_offset);
    Tensor *t = x >= 0 ? &ds->t[x] : NULL;
    if (!t || op->elems != t->slice * (uint64_t)ds->dp || !t->persistent)
        return fail(error, "a persistent all-gather of no persistent tensor");
    return ds->comm->allgather_bf16(ds->comm, ds->params + t->part, t->slice, t->persistent,
                                    error);
}

gboolean real_ds_state_op(RealDs *ds, const ZpOp *op, const ZpOp *next, GError **error)
{
    if (ds->stage != 3 || op->sub != ZP_MEM_GATHERED_PARAMS)
        return fail(error, "an alloc or free of the step-long %s: DeepSpeed frees and takes "
                    "back only stage 3's persistent copies", zp_sched_mem_name(op->sub));
    const uint64_t b2 = sizeof(RealBf16), dp = (uint64_t)ds->dp;
    if (op->kind == ZP_OP_FREE) { /* stage3.py step -> _partition_all_parameters */
        double bytes = 0;
        for (guint i = 0; i < ds->n_t; i++)
            if (ds->t[i].persistent) {
                bytes += (double)(ds->t[i].slice * dp * b2);
                ds->be->free(ds->be, ds->t[i].persistent);
                ds->t[i].persistent = NULL;
            }
        return bytes == op->bytes ? TRUE
                                  : fail(error, "rank %d: the step frees %.0f bytes of persistent "
                                         "copies, zreal held %.0f", ds->rank, op->bytes, bytes);
    }
    /* _post_step -> _allgather_params_coalesced: the parameter's buffer, then its gather */
    const int x = next && next->kind == ZP_OP_COLLECTIVE && next->sub == ZP_COLL_ALLGATHER &&
                          next->buffer < 0
                      ? tensor_at(ds, next->elem_offset)
                      : -1;
    Tensor *t = x >= 0 ? &ds->t[x] : NULL;
    if (!t || t->persistent || op->bytes != (double)(t->slice * dp * b2))
        return fail(error, "rank %d: a persistent copy of %.0f bytes taken back for no freed "
                    "persistent tensor refreshed next", ds->rank, op->bytes);
    return (t->persistent = take(ds, t->slice * dp * b2, ZP_MEM_GATHERED_PARAMS, error)) != NULL;
}

gboolean real_ds_collective(RealDs *ds, const ZpOp *op, GError **error)
{
    if (op->group != ZP_GROUP_DP && !(op->group == ZP_GROUP_HPZ && op->buffer >= 0))
        return fail(error, "DeepSpeed's stages 2-3 run over the data-parallel group only (and "
                           "with hpZ stage 3's backward gathers over hpZ's)");
    if (op->group == ZP_GROUP_HPZ) { /* counted in the rank's total too, as real_engine's */
        if (!ds->hpz_comm)
            return fail(error, "an hpZ gather without hpZ's group (real_ds_hpz)");
        const double before = ds->hpz_comm->sent_bytes;
        const gboolean ok = gather(ds, op, error);
        ds->comm->sent_bytes += ds->hpz_comm->sent_bytes - before;
        return ok;
    }
    return zp_sched_coll_fetches(ds->s, op) ? gather(ds, op, error) : reduce(ds, op, error);
}

/* ---- optimizer offload: the reduced slices to the host tier -------------------------------- */

/* Where this rank's reduced slice of the reduction `coll` lies on the device, its offset in
 * the partition and its elements (0: none of the bucket is this rank's). Stage 2: in the
 * bucket (its held ipg buffer's place stays untouched until the next bucket lands), at this
 * rank's part of an all-reduced bucket or at the head of a reduced-to-owner one (stage
 * _1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu reads each parameter's part
 * in the partition from its reduced gradient). Stage 3: at the head of the concatenation
 * copy (or of the tensor itself, one reduced in place), the bucket's tensors' slices one after
 * the other, as in the partition (stage3.py partition_grads takes the reduce-scatter's
 * outputs, views of the copy). */
static RealBf16 *reduced_slice(RealDs *ds, const ZpOp *coll, uint64_t *at, uint64_t *n,
                               GError **error)
{
    const int k = bucket_at(ds, coll->elem_offset);
    if (k < 0 || coll->micro < 0)
        return fail(error, "a gradient transfer after no bucket's reduction"), NULL;
    *n = 0;
    if (ds->stage == 3) {
        uint64_t bytes = 0;
        RealBf16 *copy = concat_copy(ds, coll, &bytes);
        const int first = tensor_at(ds, coll->elem_offset);
        if (!copy && first >= 0) { /* one tensor needing no padding, reduced in place */
            const int id = ds->bucket_buffer[coll->micro * ds->n_buckets + k];
            copy = id >= 0 && ds->buffers[id]
                       ? (RealBf16 *)ds->buffers[id] + (coll->elem_offset - ds->bk[k].lo)
                       : NULL;
            bytes = coll->elems * sizeof(RealBf16);
        }
        if (!copy || first < 0)
            return fail(error, "a stage-3 gradient transfer without its reduced gradients"),
                   NULL;
        *at = ds->t[first].part;
        *n = bytes / sizeof(RealBf16) / (uint64_t)ds->dp;
        return copy;
    }
    const int id = ds->bucket_buffer[coll->micro * ds->n_buckets + k];
    RealBf16 *base = id >= 0 ? ds->buffers[id] : NULL;
    if (!base)
        return fail(error, "a gradient transfer from a bucket with no buffer"), NULL;
    const uint64_t lo = coll->elem_offset;
    uint64_t a;
    *n = part_overlap(ds, lo, lo + coll->elems, ds->rank, &a);
    if (*n > 0)
        *at = a - (uint64_t)ds->rank * ds->s->partition_elems;
    return coll->sub == ZP_COLL_ALLREDUCE ? base + (*n > 0 ? a - lo : 0) : base;
}

/* Stage 2 with accumulation (zp_offload_stage2_accum): each tensor of the bucket that overlaps
 * this rank's partition, whole, up and added or down (stage_1_and_2.py copy_grads_in_partition
 * -> async_accumulate_grad_in_cpu_via_gpu), its sum at its place from gip_lo; the fp32 D2H
 * after the 16-bit one (at the last micro-step) is the rank's part, as at one micro-step. */
static gboolean stage2_accum_transfer(RealDs *ds, const ZpOp *op, const ZpOp *coll,
                                      RealOffload *o, RealBf16 *dev, uint64_t at, uint64_t n,
                                      GError **error)
{
    const ZpOp *before = zp_sched_op(ds->s, zp_sched_deps(ds->s, op)[0]);
    if (op->sub == ZP_XFER_D2H && before->kind == ZP_OP_TRANSFER && before->sub == ZP_XFER_D2H)
        return real_offload_grads_down(o, dev, at, n, error);
    if (op->sub != ZP_XFER_D2H && op->sub != ZP_XFER_H2D)
        return fail(error, "DeepSpeed's stage 2 moves its gradient sums over the host link only");
    const uint64_t a = (uint64_t)ds->rank * ds->s->partition_elems + at, end = a + n;
    const int first = tensor_at(ds, coll->elem_offset);
    gboolean ok = first >= 0 || fail(error, "a gradient transfer of no whole tensors");
    for (guint i = (guint)MAX(first, 0);
         ok && i < ds->n_t && ds->t[i].offset < coll->elem_offset + coll->elems; i++) {
        const Tensor *t = &ds->t[i];
        const uint64_t x = MAX(t->offset, a), y = MIN(t->offset + t->elems, end);
        if (y <= x)
            continue;
        ok = op->sub == ZP_XFER_H2D
                 ? real_offload_tensor_up_add(o, dev + (x - a), x - t->offset, y - x,
                                              t->offset - ds->gip_lo, t->elems, error)
                 : real_offload_tensor_down(o, dev + (x - a), x - t->offset, y - x,
                                            t->offset - ds->gip_lo, t->elems, error);
    }
    return ok;
}

gboolean real_ds_grad_transfer(RealDs *ds, const ZpOp *op, const ZpOp *coll, RealOffload *o,
                               GError **error)
{
    uint64_t at = 0, n = 0;
    RealBf16 *dev = reduced_slice(ds, coll, &at, &n, error);
    if (!dev)
        return FALSE;
    if (n == 0)
        return TRUE;
    if (ds->stage == 2 && zp_offload_stage2_accum(&ds->s->plan))
        return stage2_accum_transfer(ds, op, coll, o, dev, at, n, error);
    /* Stage 3's chain (offload_grad_slice): the 16-bit sum's round trip, then at the last
     * micro-step the fp32 slice down, the third; stage 2's are this rank's part of the
     * bucket, fp32. Once the round trip left the sum on the device at the last micro-step,
     * the GPU's sub-groups take their fp32 gradients from it (partial offload). */
    int before = 0;
    for (const ZpOp *p = op; p->n_deps > 0;) {
        p = zp_sched_op(ds->s, zp_sched_deps(ds->s, p)[0]);
        if (p->kind != ZP_OP_TRANSFER)
            break;
        before++;
    }
    const gboolean fp32 = ds->stage != 3 || before == 2;
    if (ds->stage == 3 && before == 1 && op->micro == ds->s->plan.grad_accum - 1)
        real_offload_grads_keep(o, dev, at, n);
    switch ((ZpTransferKind)op->sub) {
    case ZP_XFER_D2H:
        if (fp32)
            return real_offload_grads_down(o, dev, at, n, error);
        if (ds->stage != 3)
            break;
        real_offload_accum_down(o, dev, at, n);
        return TRUE;
    case ZP_XFER_H2D:
        if (ds->stage != 3 || fp32)
            break;
        return real_offload_accum_up(o, dev, at, n, op->micro > 0, error);
    case ZP_XFER_NVME_WRITE:
        return real_offload_grads_out(o, at, n, error);
    default:
        break;
    }
    return fail(error, "rank %d: a gradient transfer of %.0f bytes DeepSpeed's stage %d does "
                "not make (stage 2 sends fp32 slices down; stage 3 its 16-bit sum down and up, "
                "and fp32 down at the last micro-step)", ds->rank, op->bytes, ds->stage);
}
