/* zp_build_buckets: the gradient reductions of a backward — buckets, their held or own
 * buffers, landing buffers, gradients handed on module by module — where the rules put them. */
#include "zp_build.h"
#include "zp_sched.h"
#include "zp_zeropp.h"

#include <string.h>

Bucket *zp_build_bucket(Builder *b, guint i)
{
    return &g_array_index(b->buckets, Bucket, i);
}

/* The held buffer a bucket is reduced through, -1 none: the buckets that use them take them
 * in turn, in launch order (which is bucket order); a bypassing bucket takes its own at
 * stages 2-3 and none at stages 0-1 (reduced in place). `held`: those counted so far. */
static int held_slot(const Builder *b, const Bucket *k, guint *held)
{
    if (b->n_ipg == 0 || zp_build_own_buffer(b, k) || k->spec.bypass)
        return -1;
    return (int)((*held)++ % (guint)b->n_ipg);
}

/* The implementation's buckets, indexed by the units they hold and the unit after whose
 * backward they launch. */
void zp_build_plan_buckets(Builder *b)
{
    const ZpSchedule *s = b->s;
    GArray *specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    b->impl->plan_buckets(s, specs);
    GArray *experts = zp_impl_bucket_experts(s);
    /* the buckets' room made at once and written in place (a GLib append each: 80
     * instructions a bucket, each pipeline stage's buckets anew) */
    const guint first = b->buckets->len;
    g_array_set_size(b->buckets, first + specs->len);
    Bucket *out = &g_array_index(b->buckets, Bucket, first);
    for (guint i = 0; i < specs->len; i++) {
        Bucket k = {g_array_index(specs, ZpBucketSpec, i), -1, NONE, NONE, NONE, -1,
                    {0, 0, FALSE}};
        if (experts && i < experts->len)
            k.experts = g_array_index(experts, ZpBucketExperts, i);
        out[i] = k;
    }
    if (experts)
        g_array_unref(experts);
    g_array_unref(specs);
    const gsize n_units = (gsize)s->n_units;
    memset(b->launch_start, 0, sizeof(guint) * (n_units + 1));
    /* G_MAXUINT is every byte 0xff: a pipeline's 64 stages each set Megatron 1T's 130 units
     * one by one, 4 instructions a unit */
    memset(b->unit_first, 0xff, sizeof(guint) * n_units);
    memset(b->unit_last, 0, sizeof(guint) * n_units);
    for (guint i = 0; i < b->buckets->len; i++) {
        const ZpBucketSpec *k = &zp_build_bucket(b, i)->spec;
        for (int u = k->low_unit; u <= k->top_unit; u++) {
            b->unit_first[u] = MIN(b->unit_first[u], i);
            b->unit_last[u] = MAX(b->unit_last[u], i);
        }
        b->launch_start[k->launch_unit + 1]++;
    }
    guint *start = b->launch_start, sum = start[0]; /* the running sum kept in a register */
    for (gsize u = 1; u <= n_units; u++)
        start[u] = sum += start[u];
    guint *next = g_memdup2(b->launch_start, sizeof(guint) * (gsize)s->n_units);
    g_array_set_size(b->launch, b->buckets->len);
    for (guint i = 0; i < b->buckets->len; i++)
        g_array_index(b->launch, guint, next[zp_build_bucket(b, i)->spec.launch_unit]++) = i;
    g_free(next);
    b->n_ipg = b->impl->bucket_buffers(&s->plan, &b->ipg_bytes);
    b->ipg_bytes *= zp_plan_reduce_bytes(&s->plan);
    guint held = 0;
    for (guint i = 0; i < b->buckets->len; i++)
        zp_build_bucket(b, i)->slot = held_slot(b, zp_build_bucket(b, i), &held);
}

/* When the implementation's held bucket buffers are taken and given back (zp_impl.h). */
ZpHeldSpan zp_build_held_span(const Builder *b)
{
    return b->impl->held_span ? b->impl->held_span(&b->s->plan) : ZP_HELD_PER_BACKWARD;
}

/* Each micro-step's buckets start unlaunched; held buffers taken for the whole step stay. */
void zp_build_reset_buckets(Builder *b)
{
    for (guint i = 0; i < b->buckets->len; i++) {
        zp_build_bucket(b, i)->buffer = -1;
        zp_build_bucket(b, i)->alloc_op = zp_build_bucket(b, i)->coll_op =
            zp_build_bucket(b, i)->drain_op = NONE;
    }
    const gboolean keep = zp_build_held_span(b) == ZP_HELD_ALL_STEP;
    for (int i = 0; i < 2; i++) {
        if (!keep || b->ipg[i] < 0)
            b->ipg[i] = -1, b->ipg_alloc[i] = b->ipg_last[i] = NONE;
        b->occupant[i] = -1;
    }
    g_array_set_size(b->waits, 0);
}

/* Whether a bucket takes a buffer of its own: always without held buffers; with them, only
 * a bypassing bucket at stages 2-3 (the gradient autograd allocated, kept until reduced;
 * stages 0-1 reduce a bypassing bucket straight from the full gradients). */
gboolean zp_build_own_buffer(const Builder *b, const Bucket *k)
{
    return b->n_ipg == 0 || (k->spec.bypass && b->s->plan.zero.stage >= 2);
}

/* Double buffering: bucket i may take memory only once bucket i-2's collective was issued
 * (DeepSpeed waits on the older ipg buffer before refilling it). */
static uint32_t bucket_backpressure(Builder *b, guint i)
{
    return i >= 2 ? zp_build_bucket(b, i - 2)->drain_op : NONE;
}

/* The held bucket buffers, allocated as the reducing backward starts (DeepSpeed allocates
 * its ipg buffer pair at the first gradient hook, stage_1_and_2.py setup_buckets), before
 * the step (ZP_HELD_ALL_STEP), or at the first reduction when it runs apart from the backward
 * (a pipeline's, after its flush). */
void zp_build_alloc_held_buckets(Builder *b, int micro)
{
    for (int i = 0; i < b->n_ipg && b->ipg[i] < 0; i++)
        b->ipg_alloc[i] = zp_build_emit_alloc(b, ZP_MEM_BUCKETS, b->ipg_bytes, -1, micro,
                                              &b->ipg[i], &b->last_compute, 1);
}

/* Frees them after their last reduction, or after op `after` when it is not NONE. */
void zp_build_free_held_buckets(Builder *b, int micro, uint32_t after)
{
    for (int i = 0; i < b->n_ipg && b->ipg[i] >= 0; i++) {
        const uint32_t read = b->ipg_last[i] != NONE ? b->ipg_last[i] : b->ipg_alloc[i];
        zp_build_emit_free(b, ZP_MEM_BUCKETS, b->ipg_bytes, -1, micro, b->ipg[i],
                           after != NONE ? after : read);
        b->ipg[i] = -1;
    }
}

/* A bucket's own buffer: a bypassing one's at stage 3 is the parameter's gradient, ds_numel
 * (stage3.py __add_grad_to_ipg_bucket leaves it outside the flat buffer; only
 * reduce_scatter_coalesced's copy pads it), any other one the size it is reduced at. */
static double own_bytes(const Builder *b, const Bucket *k)
{
    return k->spec.bypass && b->s->plan.zero.stage == 3
               ? (double)(k->spec.hi - k->spec.lo) * zp_plan_reduce_bytes(&b->s->plan)
               : k->spec.bytes;
}

/* Stages 2-3 keep no full gradient: backward writes a unit's gradients straight into the
 * buckets that cover it, so those taking their own buffer are allocated before the unit's
 * producing op. */
void zp_build_alloc_landing_buckets(Builder *b, int unit, int micro, GArray *deps)
{
    for (guint i = b->unit_first[unit]; i <= b->unit_last[unit] && i < b->buckets->len; i++) {
        Bucket *k = zp_build_bucket(b, i);
        if (k->buffer >= 0 || !zp_build_own_buffer(b, k))
            continue;
        uint32_t adeps[2] = {b->last_compute, bucket_backpressure(b, i)};
        k->alloc_op = zp_build_emit_alloc(b, ZP_MEM_BUCKETS, own_bytes(b, k), k->spec.top_unit,
                                          micro, &k->buffer, adeps, 2);
        zp_build_put_dep(b, deps, k->alloc_op);
    }
}

/* ZpImpl full_grads_transient: unit u's full gradients, taken before the first op that
 * produces them (autograd allocates a parameter's .grad when its first gradient arrives; the
 * unit's together), kept until its last bucket is reduced (launch_bucket). */
void zp_build_take_unit_grads(Builder *b, int u, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    if (!b->full_by_unit || b->unit_grad[u] >= 0 || s->unit_elems[u] == 0)
        return;
    const uint32_t at =
        zp_build_emit_alloc(b, ZP_MEM_GRADS, (double)s->unit_elems[u] * b->state.grad_bytes, u,
                            micro, &b->unit_grad[u], &b->last_compute, 1);
    zp_build_put_dep(b, deps, at);
}

/* A Copy of `bytes` after deps, listed in `copies` to be freed once the reduced slices are
 * taken. */
uint32_t zp_build_bucket_copy(Builder *b, const Bucket *k, double bytes, int micro,
                              const uint32_t *deps, guint n_deps, GArray *copies)
{
    int copy;
    const uint32_t op =
        zp_build_emit_alloc(b, ZP_MEM_BUCKETS, bytes, k->spec.top_unit, micro, &copy, deps, n_deps);
    const Copy c = {copy, bytes, op};
    g_array_append_val(copies, c);
    return op;
}

/* The waiting gradients copied into their held buffers as those empty, in the order they were
 * handed on (a bucket's only once no earlier bucket's wait: buckets fill in turn), each freed
 * after `after` (the reduction that empties the buffer, or the op after which the host
 * issued it: ZpImpl frees_at_issue). */
static void land_waits(Builder *b, int micro, uint32_t after)
{
    guint n = 0;
    for (; n < b->waits->len; n++) {
        const Wait *w = &g_array_index(b->waits, Wait, n);
        int *occupant = &b->occupant[zp_build_bucket(b, w->bucket)->slot];
        if (*occupant >= 0 && *occupant != (int)w->bucket)
            break;
        *occupant = (int)w->bucket;
        zp_build_emit_free(b, ZP_MEM_WORKSPACE, w->bytes, w->unit, micro, w->buffer, after);
    }
    g_array_remove_range(b->waits, 0, n);
}

/* The bucket holding flat offset `at` among those holding unit u's gradients. */
static guint bucket_holding(Builder *b, int u, uint64_t at)
{
    guint i = b->unit_first[u];
    while (i < b->unit_last[u] &&
           !(zp_build_bucket(b, i)->spec.lo <= at && at < zp_build_bucket(b, i)->spec.hi))
        i++;
    return i;
}

/* The first of `tensors` (in flat order) at or after flat offset `at`. */
static guint first_tensor_at(const GArray *tensors, uint64_t at)
{
    guint lo = 0, hi = tensors->len;
    while (lo < hi) {
        const guint mid = lo + (hi - lo) / 2;
        if (g_array_index(tensors, ZpImplTensor, mid).offset < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Narrows [*first, *end) of `t` to the tensors of module `module`: zp_impl_tensors numbers
 * modules in list order (list_tensors), so they are a run found by two binary searches, where
 * every module's call walked the unit's tensors (plan --3d gpt-1t/4096: 36 M instructions). */
static void module_tensors(const ZpImplTensor *t, int module, guint *first, guint *end)
{
    guint lo = *first, hi = *end;
    while (lo < hi) { /* the first of module or later */
        const guint mid = lo + (hi - lo) / 2;
        if (t[mid].module < module)
            lo = mid + 1;
        else
            hi = mid;
    }
    *first = lo;
    hi = *end;
    while (lo < hi) { /* the first past it */
        const guint mid = lo + (hi - lo) / 2;
        if (t[mid].module <= module)
            lo = mid + 1;
        else
            hi = mid;
    }
    *end = lo;
}

/* ZpImpl grads_by_module at stages 2-3, a reducing backward: the gradients unit u's op (its
 * module `module`'s, -1: all of the unit's) hands on, from its last tensor down as autograd's
 * hooks run (zreal's real_engine_ds.c view): one lands in its held bucket buffer when its
 * bucket is there already, or when the buffer is empty and no earlier bucket's gradient
 * waits; otherwise it waits (Wait), its buffer allocated before the op (in deps). */
void zp_build_hand_on(Builder *b, int u, int module, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    if (!b->hands_on || b->n_ipg == 0)
        return;
    if (!b->tensors)
        b->tensors = zp_impl_tensors(s);
    const ZpImplTensor *t = (const ZpImplTensor *)b->tensors->data;
    const uint64_t lo = s->unit_offset[u], hi = lo + s->unit_elems[u];
    if (b->unit_tensors.lo != lo || b->unit_tensors.hi != hi || b->unit_tensors.end == 0) {
        b->unit_tensors.lo = lo, b->unit_tensors.hi = hi;
        b->unit_tensors.first = first_tensor_at(b->tensors, lo);
        b->unit_tensors.end = first_tensor_at(b->tensors, hi);
    }
    guint first = b->unit_tensors.first, end = b->unit_tensors.end;
    if (module >= 0 && first < end) /* the module's tensors alone: modules rise with the list */
        module_tensors(t, t[first].module + module, &first, &end);
    for (guint x = end; x-- > first;) {
        const guint i = bucket_holding(b, u, t[x].offset);
        const int slot = zp_build_bucket(b, i)->slot;
        if (slot < 0)
            continue;
        int *occupant = &b->occupant[slot];
        const gboolean earlier = b->waits->len > 0 &&
                                 g_array_index(b->waits, Wait, 0).bucket < i;
        if (*occupant == (int)i || (*occupant < 0 && !earlier)) {
            *occupant = (int)i;
            continue;
        }
        Wait w = {i, -1, u, (double)t[x].elems * s->elem_bytes};
        const uint32_t at = zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, w.bytes, u, micro, &w.buffer,
                                                &b->last_compute, 1);
        zp_build_put_dep(b, deps, at);
        g_array_append_val(b->waits, w);
    }
}

/* ZpImpl experts_in_buckets: sparse unit u's expert gradients handed on as its experts'
 * backward produces them, as zp_build_hand_on hands on a tensor: into their bucket's held
 * buffer when it holds that bucket already or is empty with no earlier gradient waiting, else
 * waiting in a buffer of their own, allocated before the experts' op (returned; NONE: none). */
uint32_t zp_build_hand_on_experts(Builder *b, int u, int micro)
{
    const ZpSchedule *s = b->s;
    if (b->n_ipg == 0 || !zp_impl_experts_in_buckets(s))
        return NONE;
    const uint64_t at = zp_sched_unit_expert_offset(s, u);
    guint i = b->unit_first[u];
    for (; i < b->unit_last[u]; i++) {
        const ZpBucketExperts *x = &zp_build_bucket(b, i)->experts;
        if (x->elems > 0 && x->lo <= at && at < x->lo + x->elems)
            break;
    }
    const int slot = zp_build_bucket(b, i)->slot;
    if (slot < 0)
        return NONE;
    int *occupant = &b->occupant[slot];
    const gboolean earlier = b->waits->len > 0 && g_array_index(b->waits, Wait, 0).bucket < i;
    if (*occupant == (int)i || (*occupant < 0 && !earlier)) {
        *occupant = (int)i;
        return NONE;
    }
    Wait w = {i, -1, u, (double)zp_sched_unit_expert_elems(s, u) * s->elem_bytes};
    const uint32_t op = zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, w.bytes, u, micro, &w.buffer,
                                            &b->last_compute, 1);
    g_array_append_val(b->waits, w);
    return op;
}

/* The bytes of micro-step `micro`'s gradient copy (ZpImpl grad_copy_elems; 0: none). */
static double grad_copy_bytes(Builder *b, int micro)
{
    if (micro == 0 || !b->impl->grad_copy_elems)
        return 0;
    if (b->grad_copy_elems < 0) /* the layout's: zp_build_layout forgets it */
        b->grad_copy_elems = b->impl->grad_copy_elems(b->s);
    return b->grad_copy_elems * b->state.grad_bytes;
}

/* ZpImpl copy_held_to_next: the copy the last reduction held, freed after `after`. */
static void free_held_copy(Builder *b, uint32_t after)
{
    if (b->held_copy.buffer < 0)
        return;
    zp_build_emit_free(b, ZP_MEM_BUCKETS, b->held_copy.bytes, b->held_copy_unit,
                       b->held_copy_micro, b->held_copy.buffer, after);
    b->held_copy.buffer = -1;
}

/* Bucket k's reduction after deps: its dense range over dp, then its experts (ZpBucketExperts)
 * over the expert-data-parallel group from the same buffer, where they follow
 * the dense part (stage_1_and_2.py average_tensor: one allreduce_and_scatter per process
 * group, in turn on the one stream); the last collective's op. */
static uint32_t reduce_bucket(Builder *b, const Bucket *k, ZpCollKind kind, int unit, int micro,
                              const uint32_t *deps, guint n_deps)
{
    const ZpSchedule *s = b->s;
    const double expert_bytes = (double)k->experts.elems * zp_plan_reduce_bytes(&s->plan);
    uint32_t op = NONE;
    if (k->spec.hi > k->spec.lo || k->experts.elems == 0)
        op = zp_build_emit_collective(b, kind, ZP_GROUP_DP, unit, micro, k->buffer, k->spec.lo,
                                      k->spec.hi - k->spec.lo, k->spec.bytes - expert_bytes, deps,
                                      n_deps);
    if (k->experts.elems == 0)
        return op;
    uint32_t edeps[8] = {op};
    for (guint d = 0; d < n_deps && d + 1 < G_N_ELEMENTS(edeps); d++)
        edeps[d + 1] = deps[d];
    return zp_build_emit_collective(b, zp_impl_expert_grad_collective(&s->plan), ZP_GROUP_EDP,
                                    unit, micro, k->buffer, k->experts.lo,
                                    k->experts.elems, expert_bytes, edeps,
                                    MIN(n_deps + 1, G_N_ELEMENTS(edeps)));
}

/* Bucket `i`'s reduction, and with it bucket `joined`'s (ZpBucketSpec joins_previous; NONE:
 * none): one copy-in of both, one collective over both ranges (from the lower one's start,
 * their elements together), after both gradients. */
static void launch_bucket(Builder *b, guint i, guint joined, int unit, int micro,
                          GArray *launched)
{
    const ZpSchedule *s = b->s;
    const ZpCollKind kind = b->impl->grad_collective(&s->plan);
    Bucket *k = zp_build_bucket(b, i);
    Bucket *j = joined != NONE ? zp_build_bucket(b, joined) : NULL;
    const double call_bytes = k->spec.bytes + (j ? j->spec.bytes : 0);
    const uint64_t call_lo = j ? MIN(k->spec.lo, j->spec.lo) : k->spec.lo;
    const uint64_t call_elems =
        k->spec.hi - k->spec.lo + (j ? j->spec.hi - j->spec.lo : 0);
    const guint last = j ? MAX(i, joined) : i; /* the later of them in bucket order */
    /* stage3.py __reduce_and_partition_ipg_grads: the host waits for the reduction three
     * buckets back before launching this one */
    b->reduce_gate = zp_build_host_sync(b->reduce_event, b->n_reduce_events, b->reduce_gate);
    uint32_t after = NONE; /* what the collective waits for besides the gradients */
    int held = -1;
    /* A bypassing bucket at stages 0-1 is reduced in place in the full gradients: no buffer. */
    const gboolean in_place = k->spec.bypass && s->plan.zero.stage < 2;
    if (!in_place && zp_build_own_buffer(b, k) && k->buffer < 0) {
        /* stages 0-1: copy the finished gradients into a bucket */
        uint32_t adeps[2] = {b->last_compute, bucket_backpressure(b, i)};
        k->alloc_op = zp_build_emit_alloc(b, ZP_MEM_BUCKETS, k->spec.bytes, k->spec.top_unit, micro,
                                          &k->buffer, adeps, 2);
    } else if (k->slot >= 0) {
        zp_build_alloc_held_buckets(b, micro);
        /* the gradients are copied into the next held buffer once its last reduction ran */
        held = k->slot;
        k->buffer = b->ipg[held];
        after = b->ipg_last[held] != NONE ? b->ipg_last[held] : b->ipg_alloc[held];
    }
    /* the gradient state, taken by the step's first reduction (ZpImpl
     * grads_taken_by_reduction), and a later micro-step's gradient copy, by its first: the
     * reduced gradients are copied into them */
    if (b->grad_state_bytes > 0 && b->grad_state < 0)
        zp_build_emit_alloc(b, ZP_MEM_GRADS, b->grad_state_bytes, -1, micro, &b->grad_state,
                            &b->last_compute, 1);
    const double copy_bytes = grad_copy_bytes(b, micro);
    if (copy_bytes > 0 && i == 0)
        zp_build_emit_alloc(b, ZP_MEM_GRADS, copy_bytes, -1, micro, &b->grad_copy, &b->last_compute,
                            1);
    uint32_t read = NONE; /* qgZ: the op after which the bucket's gradients were read */
    GArray *copies = b->launch_copies ? b->launch_copies : g_array_new(FALSE, FALSE, sizeof(Copy));
    b->launch_copies = NULL; /* this launch's till its end */
    const gboolean qgz = s->plan.zero.stage == 3 && s->plan.zero.zero_quantized_gradients;
    if (qgz && b->impl->qgz_by_tensor && zp_zeropp_qgz_across_nodes(&s->plan)) {
        read = zp_build_qgz_by_tensor(b, k, unit, micro, after, copies);
    } else if (qgz && !b->impl->qgz_by_tensor) {
        /* qgZ replaces the reduce-scatter and its concatenated copy */
        const uint32_t cdeps[3] = {k->alloc_op, b->last_compute, after};
        read = zp_build_qgz_reduce(b, k, unit, micro, cdeps);
    } else {
        uint32_t copy_op = NONE;
        if (kind == ZP_COLL_REDUCE_SCATTER && b->impl->concat_copy(&s->plan, &k->spec)) {
            /* stage3.py __avg_scatter_grads -> reduce_scatter_coalesced concatenates the
             * bucket's padded partitions into one tensor first; FSDP2 frees the previous
             * reduction's copy first (_fsdp_param_group.py post_backward clears
             * comm_ctx.reduce_scatter_state before foreach_reduce) */
            free_held_copy(b, b->last_compute);
            uint32_t adeps[2] = {b->last_compute, after};
            copy_op = zp_build_bucket_copy(b, k, call_bytes, micro, adeps, 2, copies);
        }
        uint32_t cdeps[5] = {k->alloc_op, b->last_compute, after, copy_op,
                             j ? j->alloc_op : NONE};
        /* a joined call works in its copy-in, the one buffer that holds both */
        const int buffer = j && copies->len > 0
                               ? g_array_index(copies, Copy, copies->len - 1).buffer
                               : k->buffer;
        if (j || k->experts.elems == 0)
            k->coll_op = zp_build_emit_collective(b, kind, ZP_GROUP_DP, unit, micro, buffer,
                                                  call_lo, call_elems, call_bytes, cdeps,
                                                  j ? 5 : 4);
        else /* a bucket holding experts (ZpImpl experts_in_buckets): dp, then EDP */
            k->coll_op = reduce_bucket(b, k, kind, unit, micro, cdeps, 4);
    }
    const uint32_t drained = zp_build_offload_grad_slice(b, k, unit, micro);
    /* the reduced slices are views of the copies (or, qgZ's, its outputs) until they went
     * down: DeepSpeed drops the list of them once the host has issued the bucket's last
     * reduction (stage3.py __reduce_and_partition_ipg_grads after partition_grads), so at
     * issue they are freed after the last of them was taken; FSDP2 holds its
     * reduce_scatter_input in comm_ctx.reduce_scatter_state until the next post_backward
     * or, the last one, the root's post-backward final callback */
    uint32_t issued = 0;
    for (guint c = 0; c < copies->len; c++)
        issued = MAX(issued, g_array_index(copies, Copy, c).alloc);
    for (guint c = 0; c < copies->len; c++) {
        const Copy *x = &g_array_index(copies, Copy, c);
        if (b->impl->copy_held_to_next && copies->len == 1) {
            b->held_copy = *x, b->held_copy_unit = k->spec.top_unit, b->held_copy_micro = micro;
            continue;
        }
        zp_build_emit_free(b, ZP_MEM_BUCKETS, x->bytes, k->spec.top_unit, micro, x->buffer,
                           b->impl->frees_at_issue ? issued : drained);
    }
    const gboolean copied = copies->len > 0;
    copies->len = 0; /* no clear function, no terminator: emptied as g_array_set_size does */
    if (!b->launch_copies)
        b->launch_copies = copies;
    else
        g_array_unref(copies);
    k->drain_op = drained;
    if (j)
        j->coll_op = k->coll_op, j->drain_op = drained;
    zp_build_record_event(b->reduce_event, &b->n_reduce_events, drained);
    if (read == NONE)
        read = drained;
    if (held >= 0) {
        b->ipg_last[held] = read;
        if (b->occupant[held] == (int)i)
            b->occupant[held] = -1;
        land_waits(b, micro, b->impl->frees_at_issue ? b->last_compute : read);
    } else if (k->buffer >= 0) {
        /* at issue: once the later of its alloc and the compute the reduction follows (FSDP2:
         * foreach_reduce drops the unsharded gradients once their copy-in is issued) */
        const uint32_t taken = MAX(k->alloc_op, b->last_compute);
        const gboolean at_issue =
            b->impl->frees_at_issue || (b->impl->copy_held_to_next && copied);
        zp_build_emit_free(b, ZP_MEM_BUCKETS, own_bytes(b, k), k->spec.top_unit, micro, k->buffer,
                           at_issue ? taken : read);
        if (j && j->buffer >= 0) /* its gradients went into the same copy-in: freed with k's */
            zp_build_emit_free(b, ZP_MEM_BUCKETS, own_bytes(b, j), j->spec.top_unit, micro,
                               j->buffer, at_issue ? MAX(j->alloc_op, b->last_compute) : read);
    }
    /* the full gradients of the units whose last bucket this is: each was copied into its
     * bucket and dropped (ZpImpl full_grads_transient), freed once the host issued it */
    for (int u = k->spec.low_unit; u <= k->spec.top_unit; u++)
        if (b->unit_grad[u] >= 0 && b->unit_last[u] == i) {
            zp_build_emit_free(b, ZP_MEM_GRADS, (double)s->unit_elems[u] * b->state.grad_bytes, u,
                               micro, b->unit_grad[u], b->last_compute);
            b->unit_grad[u] = -1;
        }
    if (copy_bytes > 0 && last + 1 == b->buckets->len) /* added into the state, then freed */
        zp_build_emit_free(b, ZP_MEM_GRADS, copy_bytes, -1, micro, b->grad_copy, drained);
    if (last + 1 == b->buckets->len) /* the backward's last reduction has run */
        free_held_copy(b, drained);
    if (!s->plan.zero.overlap_comm)
        zp_build_sync_on(b, k->coll_op);
    g_array_append_val(launched, k->coll_op);
}

/* Launches the buckets that wait for this unit's gradients and are not launched yet: those
 * whose launch module is `module` (ZpBucketSpec launch_module; after that module's op), or
 * with module -1 (after the unit's whole backward) every one left. */
void zp_build_launch_buckets(Builder *b, int unit, int module, int micro, GArray *launched)
{
    const guint end = b->launch_start[unit + 1];
    for (guint j = b->launch_start[unit]; j < end; j++) {
        const guint i = g_array_index(b->launch, guint, j);
        if (zp_build_bucket(b, i)->coll_op != NONE ||
            (module >= 0 && zp_build_bucket(b, i)->spec.launch_module != module))
            continue;
        /* the next bucket launched here reduced by the same call (joins_previous) */
        const guint next = j + 1 < end ? g_array_index(b->launch, guint, j + 1) : NONE;
        const gboolean joins = next != NONE && zp_build_bucket(b, next)->spec.joins_previous;
        launch_bucket(b, i, joins ? next : NONE, unit, micro, launched);
    }
}
