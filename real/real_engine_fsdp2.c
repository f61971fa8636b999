/* real_engine_fsdp2: the engine's plug-in for PyTorch FSDP2 (fully_shard; zp_impl_fsdp2.c's
 * schedule) on the CPU backend: each parameter sharded on its own in fp32 (the optimizer's
 * parameter), all-gathered per group (a block, or the root's two units) through one flat
 * buffer and copied out per tensor, gradients copied into the reduce-scatter's input and
 * reduced into fp32 sharded grads. */
#include "real_engine_fw.h"

#include "real_offload.h"
#include "zp_impl.h"
#include "zp_mem.h"

#include <string.h>

/* Tensor i's places: its shard in the fp32 states, in every rank's chunk of its unit's
 * flat buffers (all-gather output, reduce-scatter input), in its unit's unsharded
 * gradients (padded tensor after padded tensor). */
typedef struct {
    uint64_t slice, shard_at, chunk_at, grad_at;
} Place;

typedef struct {
    RealFwEnv env;
    int rank, dp;
    RealFwTensors tensors;
    Place *at;
    uint64_t *chunk;       /* per unit: one rank's chunk of its flat buffers */
    uint64_t part;         /* the shard's elements */
    RealGptTensors *unit_params, *unit_grads; /* per unit: where they are now */
    int *params_buffer, *grads_buffer;        /* per unit: the buffer ids holding them, -1 */
    /* _fsdp_param.py FSDPParam: the sharded parameters (fp32, the optimizer's master),
     * their .grad (fp32: foreach_reduce casts the reduced shard to orig_dtype), Adam's. */
    float *master, *grads, *adam_m, *adam_v;
    /* reshard_after_forward=int (hpZ's group of that many consecutive ranks): the group's
     * communicator and each block's post-forward shard while the schedule holds it (its
     * secondary_params buffer: this rank's share of the unit's flat all-gather output), NULL
     * without. */
    RealComm *hpz_comm;
    RealBf16 **secondary;
    /* The root's FSDPParamGroup (zp_impl_fsdp2_root_joined): unit L + 1's tensors in unit
     * 0's flat buffers, after its own; -1: each unit its own group. */
    int root_tail;
} Fsdp2;

/* The units of group u (its own, and for the root unit L + 1 after unit 0), n of them. */
static int group_units(const Fsdp2 *f, int u, int units[2])
{
    units[0] = u;
    if (u == 0 && f->root_tail > 0) {
        units[1] = f->root_tail;
        return 2;
    }
    return 1;
}

/* The group whose flat buffers hold unit u's tensors. */
static int group_of(const Fsdp2 *f, int u)
{
    return u == f->root_tail ? 0 : u;
}

static gboolean fsdp2_applies(const ZpSchedule *s)
{
    return s->plan.impl == ZP_IMPL_FSDP2;
}

static void fsdp2_destroy(void *data)
{
    Fsdp2 *f = data;
    if (!f)
        return;
    float *states[] = {f->master, f->grads, f->adam_m, f->adam_v};
    for (size_t i = 0; i < G_N_ELEMENTS(states); i++)
        f->env.be->free(f->env.be, states[i]);
    real_engine_fw_tensors_clear(&f->tensors);
    g_free(f->at), g_free(f->chunk);
    g_free(f->unit_params), g_free(f->unit_grads);
    g_free(f->params_buffer), g_free(f->grads_buffer);
    g_free(f->secondary);
    g_free(f);
}

/* _fsdp_param.py: each parameter's dim 0 padded to the world size and split in equal
 * shards (_get_dim0_padded_size, torch.chunk), here its elements padded to dp as the
 * schedule counts them (zp_impl_fsdp2.c fsdp2_plan_fetches). */
static void place_tensors(Fsdp2 *f)
{
    const ZpSchedule *s = f->env.s;
    f->at = g_new0(Place, MAX(f->tensors.n_t, 1));
    f->chunk = g_new0(uint64_t, s->n_units);
    uint64_t grad_at = 0;
    for (guint i = 0; i < f->tensors.n_t; i++) {
        const ZpImplTensor *t = &f->tensors.t[i];
        if (i == 0 || t->unit != f->tensors.t[i - 1].unit)
            grad_at = 0;
        const uint64_t padded = zp_mem_padded_elems(t->elems, (uint64_t)f->dp);
        const int g = group_of(f, t->unit);
        f->at[i] = (Place){padded / (uint64_t)f->dp, f->part, f->chunk[g], grad_at};
        f->part += f->at[i].slice;
        f->chunk[g] += f->at[i].slice;
        grad_at += padded;
    }
}

static float *take(Fsdp2 *f, uint64_t bytes, ZpMemCategory cat, GError **error)
{
    void *p = real_engine_alloc(f->env.be, f->env.comm->rank, bytes, cat, error);
    if (p)
        f->env.be->fill(f->env.be, p, 0, bytes);
    return p;
}

static void *fsdp2_create(const RealFwEnv *env, GError **error)
{
    const ZpSchedule *s = env->s;
    if (strcmp(env->be->name, "cpu") != 0) {
        real_engine_fail(error, "zreal executes --impl fsdp2 on the CPU backend, not %s",
                         env->be->name);
        return NULL;
    }
    if (s->plan.zero.stage != 3) {
        real_engine_fail(error, "zreal executes --impl fsdp2 at stages 2 "
                         "(reshard_after_forward=False) and 3 (True or an int), not at stage %d",
                         s->plan.zero.stage);
        return NULL;
    }
    Fsdp2 *f = g_new0(Fsdp2, 1);
    f->env = *env;
    f->rank = env->comm->rank, f->dp = s->plan.dp;
    f->unit_params = g_new0(RealGptTensors, s->n_units);
    f->unit_grads = g_new0(RealGptTensors, s->n_units);
    f->params_buffer = g_new(int, s->n_units);
    f->grads_buffer = g_new(int, s->n_units);
    for (int u = 0; u < s->n_units; u++)
        f->params_buffer[u] = f->grads_buffer[u] = -1;
    f->root_tail = zp_impl_fsdp2_root_joined(s) ? s->n_units - 1 : -1;
    if (!real_engine_fw_tensors(s, &f->tensors, error)) {
        fsdp2_destroy(f);
        return NULL;
    }
    place_tensors(f);
    const double f4 = sizeof(float);
    if (f->part != s->partition_elems || s->state_bytes[ZP_MEM_PARAMS] != 0 ||
        s->state_bytes[ZP_MEM_GRADS] != (double)f->part * f4) {
        real_engine_fail(error, "FSDP2's shards hold %" G_GUINT64_FORMAT " elements a rank "
                         "(each parameter padded to %d), fp32 gradients and no 16-bit copy; the "
                         "schedule has %" G_GUINT64_FORMAT ", %.0f gradient and %.0f parameter "
                         "bytes", f->part, f->dp, s->partition_elems,
                         s->state_bytes[ZP_MEM_GRADS], s->state_bytes[ZP_MEM_PARAMS]);
        fsdp2_destroy(f);
        return NULL;
    }
    const uint64_t bytes = f->part * sizeof(float);
    if (!(f->grads = take(f, bytes, ZP_MEM_GRADS, error)) ||
        !(f->master = take(f, bytes, ZP_MEM_MASTER, error)) ||
        !(f->adam_m = take(f, bytes, ZP_MEM_ADAM_M, error)) ||
        !(f->adam_v = take(f, bytes, ZP_MEM_ADAM_V, error))) {
        fsdp2_destroy(f);
        return NULL;
    }
    return f;
}

/* Each parameter's shard, drawn as the whole model would be (the rank's rows of it), in
 * fp32 (_init_sharded_param: the shard keeps the module's dtype; zreal's parameters are
 * drawn in bf16, as the other runs'). */
static gboolean fsdp2_init_params(void *data, RealFwInitFn init, void *engine, GError **error)
{
    Fsdp2 *f = data;
    const ZpSchedule *s = f->env.s;
    for (guint i = 0; i < f->tensors.n_t; i++) {
        const ZpImplTensor *t = &f->tensors.t[i];
        const Place *p = &f->at[i];
        const uint64_t first = (uint64_t)f->rank * p->slice;
        const uint64_t n = first < t->elems ? MIN(p->slice, t->elems - first) : 0;
        RealBf16 *drawn = g_new0(RealBf16, MAX(n, 1));
        const gboolean ok =
            n == 0 || init(engine, t->unit, t->offset - s->unit_offset[t->unit] + first, n,
                           drawn, error);
        if (ok)
            f->env.be->bf16_to_f32(f->env.be, f->master + p->shard_at, drawn, n);
        g_free(drawn);
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

static gboolean fsdp2_params(void *data, int unit, RealGptTensors *out, GError **error)
{
    Fsdp2 *f = data;
    if (f->params_buffer[unit] < 0)
        return real_engine_fail(error, "rank %d: unit %d is used but was not gathered",
                                f->rank, unit);
    *out = f->unit_params[unit];
    return TRUE;
}

static gboolean fsdp2_grads(void *data, int unit, int micro, RealGptTensors *out,
                            GError **error)
{
    (void)micro;
    Fsdp2 *f = data;
    if (f->grads_buffer[unit] < 0)
        return real_engine_fail(error, "rank %d: no unsharded gradients of unit %d", f->rank,
                                unit);
    *out = f->unit_grads[unit];
    return TRUE;
}

/* Every gathered or gradient buffer the schedule takes is the plug-in's: an all-gather's flat
 * output or a parameter's copy-out (gathered_params), a unit's unsharded gradients or the
 * reduce-scatter's input (buckets). A unit's gradients are its first bucket buffer taken
 * while none holds them, each tensor at its padded place and fresh (autograd's .grad, None
 * until backward's first write), the padding zero. */
static gboolean keep_post_forward(Fsdp2 *f, int u, RealBf16 *out, double bytes,
                                  GError **error);

static gboolean fsdp2_alloc(void *data, const ZpOp *op, gboolean *handled, GError **error)
{
    Fsdp2 *f = data;
    *handled = op->sub == ZP_MEM_GATHERED_PARAMS || op->sub == ZP_MEM_BUCKETS ||
               op->sub == ZP_MEM_SECONDARY_PARAMS;
    if (!*handled)
        return TRUE;
    float *p = take(f, (uint64_t)op->bytes, (ZpMemCategory)op->sub, error);
    if (!p)
        return FALSE;
    f->env.buffers[op->buffer] = p;
    const int u = op->unit;
    if (op->sub == ZP_MEM_SECONDARY_PARAMS)
        return keep_post_forward(f, u, (RealBf16 *)(void *)p, op->bytes, error);
    if (op->sub != ZP_MEM_BUCKETS || f->grads_buffer[u] >= 0)
        return TRUE;
    const guint first = f->tensors.unit_first[u], last = f->tensors.unit_first[u + 1];
    const uint64_t need = (f->at[last - 1].grad_at +
                           zp_mem_padded_elems(f->tensors.t[last - 1].elems, (uint64_t)f->dp)) *
                          sizeof(RealBf16);
    if (op->bytes != (double)need)
        return real_engine_fail(error, "unit %d's unsharded gradients: %.0f bytes, its "
                                "parameters padded to %d take %" G_GUINT64_FORMAT, u, op->bytes,
                                f->dp, need);
    f->grads_buffer[u] = op->buffer;
    f->unit_grads[u] = (RealGptTensors){0};
    for (guint i = first; i < last; i++)
        f->unit_grads[u].at[i - first] = (RealBf16 *)(void *)p + f->at[i].grad_at;
    real_gpt_grads_fresh(f->env.gpt, u, UINT32_MAX);
    return TRUE;
}

static void fsdp2_release(void *data, const ZpOp *op)
{
    Fsdp2 *f = data;
    if (op->sub == ZP_MEM_SECONDARY_PARAMS && f->secondary && op->unit >= 0)
        f->secondary[op->unit] = NULL;
    for (int u = 0; u < f->env.s->n_units; u++) {
        if (f->params_buffer[u] == op->buffer)
            f->params_buffer[u] = -1;
        if (f->grads_buffer[u] == op->buffer)
            f->grads_buffer[u] = -1;
    }
}

/* The group a unit-level op names by its flat range: a unit's, or the root's, which starts
 * at unit 0 and spans its two units' elements. */
static int unit_of(const Fsdp2 *f, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = f->env.s;
    for (int u = 0; u < s->n_units; u++) {
        int units[2];
        const int n = group_units(f, u, units);
        uint64_t elems = 0;
        for (int k = 0; k < n; k++)
            elems += s->unit_elems[units[k]];
        if (u != f->root_tail && s->unit_offset[u] == op->elem_offset && elems == op->elems)
            return u;
    }
    real_engine_fail(error, "no FSDP2 unit spans offset %" G_GUINT64_FORMAT " of %"
                     G_GUINT64_FORMAT " elements", op->elem_offset, op->elems);
    return -1;
}

/* The elements of unit u's flat all-gather output a rank of hpZ's group keeps. */
static uint64_t secondary_elems(const Fsdp2 *f, int u)
{
    return f->chunk[u] * (uint64_t)f->dp / (uint64_t)f->hpz_comm->size;
}

/* _fsdp_collectives.py foreach_all_gather: each shard cast to param_dtype into this rank's
 * chunk of the flat output (all_gather_input is a view of all_gather_output, the copy-in
 * _foreach_copy_), then all_gather_into_tensor in place. With reshard_after_forward=int
 * (_fsdp_param.py to_sharded_post_forward: the unsharded parameters resharded over the
 * post-forward mesh) this rank keeps its 1/size of the output, and backward's all-gather
 * over that group (hpZ's) rebuilds the output from those; its bytes count in the
 * data-parallel communicator's total, as hpZ's do. */
static gboolean gather(Fsdp2 *f, const ZpOp *op, GError **error)
{
    const int u = unit_of(f, op, error);
    if (u < 0)
        return FALSE;
    if (op->bytes != (double)(f->chunk[u] * (uint64_t)f->dp * sizeof(RealBf16)))
        return real_engine_fail(error, "unit %d's all-gather: %.0f bytes; its shards take %"
                                G_GUINT64_FORMAT " a rank", u, op->bytes, f->chunk[u]);
    RealBf16 *flat = f->env.buffers[op->buffer];
    RealComm *c = f->env.comm;
    if (op->group == ZP_GROUP_HPZ) {
        RealComm *h = f->hpz_comm;
        if (!h || !f->secondary[u])
            return real_engine_fail(error, "unit %d's all-gather over hpZ's group without the "
                                    "group or its post-forward shard", u);
        const double before = h->sent_bytes;
        const gboolean ok =
            h->allgather_bf16(h, f->secondary[u], secondary_elems(f, u), flat, error);
        c->sent_bytes += h->sent_bytes - before;
        return ok;
    }
    RealBf16 *mine = flat + (uint64_t)f->rank * f->chunk[u];
    int units[2];
    for (int k = 0, n = group_units(f, u, units); k < n; k++)
        for (guint i = f->tensors.unit_first[units[k]]; i < f->tensors.unit_first[units[k] + 1];
             i++)
            f->env.be->f32_to_bf16(f->env.be, mine + f->at[i].chunk_at,
                                   f->master + f->at[i].shard_at, f->at[i].slice);
    return c->allgather_bf16(c, mine, f->chunk[u], flat, error);
}

/* _fsdp_param.py to_sharded_post_forward (post_forward, reshard_after_forward=int): the
 * block's post-forward shard, this rank's 1/size of its unsharded parameters as the unit's
 * flat all-gather output lays them out (dp/size ranks' chunks: each parameter's padded rows
 * of those ranks, the padding zero), copied from the unsharded parameters the copy-out made
 * before they are freed. */
static gboolean keep_post_forward(Fsdp2 *f, int u, RealBf16 *out, double bytes,
                                  GError **error)
{
    if (!f->hpz_comm || f->params_buffer[u] < 0 ||
        bytes != (double)(secondary_elems(f, u) * sizeof(RealBf16)))
        return real_engine_fail(error, "unit %d's post-forward shard: %.0f bytes, taken "
                                "without hpZ's group or its unsharded parameters", u, bytes);
    const int ranks = f->dp / f->hpz_comm->size, from = f->hpz_comm->rank * ranks;
    const guint first = f->tensors.unit_first[u], last = f->tensors.unit_first[u + 1];
    for (int q = from; q < from + ranks; q++)
        for (guint i = first; i < last; i++) {
            const uint64_t numel = f->tensors.t[i].elems, slice = f->at[i].slice;
            if ((uint64_t)q * slice >= numel)
                continue;
            f->env.be->copy(f->env.be, out + (uint64_t)(q - from) * f->chunk[u] + f->at[i].chunk_at,
                            f->unit_params[u].at[i - first] + (uint64_t)q * slice,
                            MIN(slice, numel - (uint64_t)q * slice) * sizeof(RealBf16));
        }
    f->secondary[u] = out;
    return TRUE;
}

/* The engine's hpZ group and secondary buffers (a unit's padded elements / size each): a
 * rank keeps its 1/size of each unit's flat output, which needs the unit's parameters padded
 * one by one to hold no more than the unit padded whole. */
static gboolean fsdp2_hpz(void *data, RealComm *hpz_comm, RealBf16 **secondary, GError **error)
{
    Fsdp2 *f = data;
    const ZpSchedule *s = f->env.s;
    (void)secondary; /* the schedule takes each block's post-forward shard (fsdp2_alloc) */
    for (int u = 1; u + 1 < s->n_units; u++) /* the blocks: the root is never resharded */
        if (f->chunk[u] * (uint64_t)f->dp != zp_sched_unit_padded(s, u))
            return real_engine_fail(error, "unit %d: its parameters padded one by one to %d "
                                    "ranks take %" G_GUINT64_FORMAT " elements, the schedule's "
                                    "secondary shard is of %" G_GUINT64_FORMAT, u, f->dp,
                                    f->chunk[u] * (uint64_t)f->dp,
                                    zp_sched_unit_padded(s, u));
    f->hpz_comm = hpz_comm;
    f->secondary = g_new0(RealBf16 *, s->n_units);
    return TRUE;
}

/* foreach_reduce: the unsharded gradients copied into the reduce-scatter's input, rank q's
 * chunk the q-th shard of every parameter (foreach_reduce_scatter_copy_in, chunk_cat), the
 * reduce_scatter_tensor, this rank's chunk widened into each parameter's sharded .grad,
 * stored or (a later micro-step) added. The input is the bucket buffer the op depends on
 * besides the gradients'. */
static gboolean reduce(Fsdp2 *f, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = f->env.s;
    const int u = unit_of(f, op, error);
    if (u < 0)
        return FALSE;
    int units[2];
    const int n = group_units(f, u, units);
    int input = -1;
    const uint32_t *deps = zp_sched_deps(s, op);
    for (uint32_t d = 0; d < op->n_deps; d++) {
        const ZpOp *dep = zp_sched_op(s, deps[d]);
        gboolean grad = FALSE; /* one of the group's unsharded gradients */
        for (int k = 0; k < n; k++)
            grad = grad || dep->buffer == f->grads_buffer[units[k]];
        if (dep->kind == ZP_OP_ALLOC && dep->sub == ZP_MEM_BUCKETS && !grad)
            input = dep->buffer;
    }
    RealBf16 *in = input >= 0 ? f->env.buffers[input] : NULL;
    const uint64_t chunk = f->chunk[u];
    for (int k = 0; k < n; k++) {
        const int v = units[k];
        const RealBf16 *grads =
            f->grads_buffer[v] >= 0 ? f->env.buffers[f->grads_buffer[v]] : NULL;
        if (!grads || !in)
            return real_engine_fail(error, "unit %d's reduce-scatter needs its gradients and "
                                    "the copy-in buffer it depends on", v);
        for (int q = 0; q < f->dp; q++)
            for (guint i = f->tensors.unit_first[v]; i < f->tensors.unit_first[v + 1]; i++)
                f->env.be->copy(f->env.be, in + (uint64_t)q * chunk + f->at[i].chunk_at,
                                grads + f->at[i].grad_at + (uint64_t)q * f->at[i].slice,
                                f->at[i].slice * sizeof(RealBf16));
    }
    int *counts = g_new(int, f->dp);
    for (int q = 0; q < f->dp; q++)
        counts[q] = (int)chunk;
    const gboolean ok = f->env.comm->reduce_scatter_bf16(f->env.comm, in, counts, error);
    g_free(counts);
    for (int k = 0; k < n; k++)
        for (guint i = f->tensors.unit_first[units[k]];
             ok && i < f->tensors.unit_first[units[k] + 1]; i++) {
            float *dst = f->grads + f->at[i].shard_at;
            const RealBf16 *src = in + f->at[i].chunk_at;
            if (op->micro == 0) {
                f->env.be->bf16_to_f32(f->env.be, dst, src, f->at[i].slice);
                continue;
            }
            for (uint64_t j = 0; j < f->at[i].slice; j++) /* the CPU backend's host memory */
                dst[j] += real_bf16_to_f32(src[j]);
        }
    return ok;
}

static gboolean fsdp2_collective(void *data, const ZpOp *op, GError **error)
{
    Fsdp2 *f = data;
    if (op->sub == ZP_COLL_ALLGATHER && op->buffer >= 0)
        return gather(f, op, error);
    if (op->sub == ZP_COLL_REDUCE_SCATTER && op->buffer >= 0)
        return reduce(f, op, error);
    return real_engine_fail(error, "FSDP2 all-gathers units into a buffer and reduce-scatters "
                            "their gradients, nothing else (%s)",
                            zp_sched_coll_name((ZpCollKind)op->sub));
}

/* Unit v's tensors copied out of group flat buffer `flat` into the buffers of the unpack's
 * deps from deps[d] on; returns the next dep, 0 after an error (then set). */
static int copy_out(Fsdp2 *f, int v, const RealBf16 *flat, const uint32_t *deps, int d,
                    GError **error)
{
    const ZpSchedule *s = f->env.s;
    const int u = v;
    const uint64_t chunk = f->chunk[group_of(f, v)];
    const guint first = f->tensors.unit_first[u], last = f->tensors.unit_first[u + 1];
    f->unit_params[u] = (RealGptTensors){0};
    for (guint i = first; i < last; i++) {
        const ZpOp *alloc = zp_sched_op(s, deps[d + (int)(i - first)]);
        RealBf16 *out = alloc->kind == ZP_OP_ALLOC ? f->env.buffers[alloc->buffer] : NULL;
        const uint64_t numel = f->tensors.t[i].elems, slice = f->at[i].slice;
        if (!flat || !out || alloc->bytes != (double)(numel * sizeof(RealBf16))) {
            real_engine_fail(error, "unit %d's copy-out of tensor %u: no gathered buffer, or "
                             "not one of %" G_GUINT64_FORMAT " elements", u, i - first, numel);
            return 0;
        }
        for (int q = 0; q < f->dp && (uint64_t)q * slice < numel; q++)
            f->env.be->copy(f->env.be, out + (uint64_t)q * slice,
                            flat + (uint64_t)q * chunk + f->at[i].chunk_at,
                            MIN(slice, numel - (uint64_t)q * slice) * sizeof(RealBf16));
        f->unit_params[u].at[i - first] = out;
        if (i == first)
            f->params_buffer[u] = alloc->buffer;
    }
    return d + (int)(last - first);
}

/* foreach_all_gather_copy_out: each parameter's unsharded tensor (the unpack's buffers, in
 * the unit's order after the all-gather it depends on first) filled from every rank's
 * chunk, the padding left out (split_with_sizes_copy). */
static gboolean fsdp2_unpack(void *data, const ZpOp *op, GError **error)
{
    Fsdp2 *f = data;
    const ZpSchedule *s = f->env.s;
    const int u = op->unit;
    int units[2];
    const int n = u >= 0 && u < s->n_units ? group_units(f, u, units) : 0;
    guint count = 0;
    for (int k = 0; k < n; k++)
        count += f->tensors.unit_first[units[k] + 1] - f->tensors.unit_first[units[k]];
    const uint32_t *deps = zp_sched_deps(s, op);
    const ZpOp *coll = op->n_deps > 0 ? zp_sched_op(s, deps[0]) : NULL;
    if (n == 0 || !coll || coll->kind != ZP_OP_COLLECTIVE || op->n_deps != 1 + count)
        return real_engine_fail(error, "unit %d's copy-out must depend on its all-gather, then "
                                "on one buffer per parameter", u);
    const RealBf16 *flat = f->env.buffers[coll->buffer];
    for (int k = 0, d = 1; k < n; k++)
        if ((d = copy_out(f, units[k], flat, deps, d, error)) == 0)
            return FALSE;
    return TRUE;
}

/* The optimizer steps the fp32 shards in place with their fp32 gradients; there is no 16-bit
 * copy to write (the next all-gather casts). */
static gboolean fsdp2_optimizer(void *data, const RealAdamHyper *hyper, GError **error)
{
    (void)error;
    Fsdp2 *f = data;
    real_offload_cpu_adam(hyper, f->part, f->master, f->adam_m, f->adam_v, f->grads, NULL);
    return TRUE;
}

const RealFwOps real_fw_fsdp2 = {
    .name = "fsdp2",
    .applies = fsdp2_applies,
    .create = fsdp2_create,
    .destroy = fsdp2_destroy,
    .init_params = fsdp2_init_params,
    .params = fsdp2_params,
    .grads = fsdp2_grads,
    .alloc = fsdp2_alloc,
    .release = fsdp2_release,
    .collective = fsdp2_collective,
    .optimizer = fsdp2_optimizer,
    .unpack = fsdp2_unpack,
    .hpz = fsdp2_hpz,
};
