/* zp_build_gathers: stage 3's parameter all-gathers in the schedule — issued ahead by the
 * implementation's prefetch rules, coalesced, unpacked, waited for and freed. */
#include "zp_build.h"
#include "zp_offload.h"
#include "zp_sched.h"
#include "zp_util.h"
#include "zp_zeropp.h"

#include <string.h>

/* What a step's gather buffers are allocated after: the previous position's last compute op
 * for a position's first step, the previous step's op for a later one. */
static uint32_t step_after(const Builder *b, int key)
{
    const int pos = key / ZP_POS_STEPS;
    return key % ZP_POS_STEPS > 0 || pos == 0 ? b->last_compute
                                               : g_array_index(b->pos_last_op, uint32_t, pos - 1);
}

/* A stage-3 gather's buffer, taken by the host at step `key`: after the compute op before the
 * step, or where the host runs ahead (zp_runahead.h) after its latest waits on the allgather
 * stream and the reductions and its previous such alloc, that compute op being the first
 * dependency zp_runahead_bound moves. */
static uint32_t gather_alloc(Builder *b, double bytes, int unit, int micro, int *buffer, int key)
{
    const uint32_t after = step_after(b, key);
    /* The host takes it after the modules before released theirs (FSDP2's post_forward
     * reshard and post_backward run before the next module's pre-forward unshard and
     * copy-out); a prefetch once the step's own calls are waited for and unpacked, their
     * flat buffers freed (_fsdp_param_group.py pre_backward: unshard, wait_for_unshard with
     * its copy-out, then _backward_prefetch; DeepSpeed's fetch_sub_module likewise). */
    const uint32_t waited[3] = {after, b->released, b->waited_key == key ? b->waited : NONE};
    if (!b->runahead)
        return zp_build_emit_alloc(b, ZP_MEM_GATHERED_PARAMS, bytes, unit, micro, buffer, waited,
                                   3);
    const uint32_t deps[4] = {after, b->fetch_gate, b->reduce_gate, b->host_alloc};
    b->host_alloc =
        zp_build_emit_alloc(b, ZP_MEM_GATHERED_PARAMS, bytes, unit, micro, buffer, deps, 4);
    if (after != NONE)
        *(uint32_t *)zp_array_extend(b->gated, 1, sizeof(uint32_t), &b->gated_room) =
            b->host_alloc;
    return b->host_alloc;
}

static ZpGroup gather_group(const Builder *b, const Gather *g);

/* The gathers in the implementation's calls. With hpZ a call's parameters that hold a
 * secondary partition (those used in backward) are gathered inside the node by a call of
 * their own, before the others (partitioned_param_coordinator.py __all_gather_params_). */
void zp_build_plan_gathers(Builder *b)
{
    GArray *fetches = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    b->impl->plan_fetches(b->s, fetches);
    const ZpFetch *f = (const ZpFetch *)fetches->data;
    /* one each (zp_array_extend's room: a GLib append each checked it by a division) */
    guint room = zp_array_reserve_huge(b->gathers, b->gathers->len + (guint64)fetches->len);
    for (guint i = 0, j; i < fetches->len; i = j) {
        for (j = i + 1; j < fetches->len && f[j].joins_previous; j++)
            ;
        for (int pass = 0; pass < 2; pass++) {
            const ZpGroup want = pass == 0 ? ZP_GROUP_HPZ : ZP_GROUP_DP;
            guint first = b->gathers->len;
            for (guint k = i; k < j; k++) {
                Gather g = {f[k], -1, 0, NONE, first, 0, 0, -1,
                            zp_build_step_key(f[k].use_pos, f[k].use_step), -1, FALSE,
                            FALSE, FALSE, ZP_GROUP_DP, 0, 0, 0, 0};
                if (gather_group(b, &g) != want)
                    continue;
                *(Gather *)zp_array_extend(b->gathers, 1, sizeof g, &room) = g;
                Gather *c = &g_array_index(b->gathers, Gather, first);
                c->n++;
                c->call_elems += f[k].elems;
                c->last_use = MAX(c->last_use, zp_build_step_key(f[k].use_pos, f[k].use_step));
            }
        }
    }
    g_array_unref(fetches);
}

/* The step key of a fetch's position and step fields (offsets into ZpFetch). */
static int fetch_key(const Gather *g, size_t pos_field, size_t step_field)
{
    return zp_build_step_key(G_STRUCT_MEMBER(int, &g->fetch, pos_field),
                             G_STRUCT_MEMBER(int, &g->fetch, step_field));
}

/* Lists the gathers by the step their fetch's fields name (a counting sort, so each step
 * keeps list order); `calls_only`: each call's first gather alone (by_trigger: a call is
 * issued once, by its first gather, and the others were walked past at every step of every
 * micro-step). */
PosIndex zp_build_index_gathers(const Builder *b, size_t pos_field, size_t step_field, int n_pos,
                                gboolean calls_only)
{
    const GArray *gathers = b->gathers;
    const int n_keys = n_pos * ZP_POS_STEPS;
    PosIndex ix = {g_new0(guint, (gsize)n_keys + 1), g_new(guint, MAX(gathers->len, 1))};
    zp_advise_huge_pages(ix.start, ((gsize)n_keys + 1) * sizeof(guint));
    zp_advise_huge_pages(ix.items, MAX(gathers->len, 1) * sizeof(guint));
    for (guint k = 0; k < gathers->len; k++)
        if (!calls_only || g_array_index(gathers, Gather, k).call == k)
            ix.start[fetch_key(&g_array_index(gathers, Gather, k), pos_field, step_field) + 1]++;
    for (int p = 0; p < n_keys; p++)
        ix.start[p + 1] += ix.start[p];
    guint *next = g_new(guint, MAX(n_keys, 1));
    zp_advise_huge_pages(next, (gsize)MAX(n_keys, 1) * sizeof(guint));
    memcpy(next, ix.start, sizeof(guint) * (gsize)n_keys);
    for (guint k = 0; k < gathers->len; k++)
        if (!calls_only || g_array_index(gathers, Gather, k).call == k)
            ix.items[next[fetch_key(&g_array_index(gathers, Gather, k), pos_field,
                                    step_field)]++] = k;
    g_free(next);
    return ix;
}

void zp_build_free_pos_index(PosIndex *ix)
{
    g_free(ix->start);
    g_free(ix->items);
}

static Gather *gather_at(Builder *b, const PosIndex *ix, guint i)
{
    return &g_array_index(b->gathers, Gather, ix->items[i]);
}

ZpGroup zp_sched_fetch_group(const ZpSchedule *s, int use_pos)
{
    return s->plan.zero.zero_hpz_partition_size > 1 && use_pos > zp_pos_head((int)s->model.layers)
               ? ZP_GROUP_HPZ
               : ZP_GROUP_DP;
}

/* hpZ: backward gathers from the secondary partitions, inside the node; forward ones over
 * the whole group (zp_sched_fetch_group). */
static ZpGroup gather_group(const Builder *b, const Gather *g)
{
    return zp_sched_fetch_group(b->s, g->fetch.use_pos);
}

/* A block's secondary shard under ZpImpl secondary_per_block: 1/hpz of the unit padded to
 * dp, in the parameters' 16-bit dtype (zreal's FSDP2 keeps its share of the unit's flat
 * all-gather output, which is that size). */
static double secondary_bytes(const Builder *b, int unit)
{
    return (double)(zp_sched_unit_padded(b->s, unit) /
                    (uint64_t)b->s->plan.zero.zero_hpz_partition_size) *
           b->state.param_bytes;
}

/* Whether releasing gather g follows its block's secondary shard: a block's forward gather
 * under ZpImpl secondary_per_block with hpZ's group (the first of them takes it). */
static gboolean keeps_secondary(const Builder *b, const Gather *g)
{
    const int u = g->fetch.unit, L = (int)b->s->model.layers;
    return b->impl->secondary_per_block && b->s->plan.zero.zero_hpz_partition_size > 1 &&
           u >= 1 && u <= L && g->fetch.use_pos == zp_pos_fwd(u);
}

/* stage3_use_all_reduce_for_fetch_params: a call's parameters are views of its zeroed flat
 * buffer (partition_parameters.py _all_gather_coalesced: param.data = flat_tensor.narrow),
 * so the buffer is freed with the last of them to be released; the call's gather that is
 * freed last (by position, then module step: by_free's key) holds it, the others nothing. */
static void own_by_last_free(Gather *c, int buffer, double bytes)
{
    guint last = 0;
    for (guint k = 0; k < c->n; k++) {
        c[k].buffer = -1, c[k].bytes = 0;
        const ZpFetch *f = &c[k].fetch, *l = &c[last].fetch;
        if (f->free_pos > l->free_pos ||
            (f->free_pos == l->free_pos && f->free_step >= l->free_step))
            last = k; /* freed later: a later position, or a later module step in it */
    }
    c[last].buffer = buffer, c[last].bytes = bytes;
}

/* One call's all-gather. A call of one parameter gathers into that parameter's buffer, of
 * its padded size (partition_parameters.py _all_gather_sequential; unless the
 * implementation copies out every call: ZpImpl copy_out_single); a call of more into one
 * flat buffer of their padded partitions, every rank's in turn (_all_gather_dtype: the
 * partitions concatenated, partition_sz * world_size elements), the parameters copied out
 * when the call is first waited for (unpack_call). With stage3_use_all_reduce_for_fetch_params
 * (zp_sched_fetch_allreduce) a call of more is an all-reduce of a zeroed buffer of the same
 * size, parameter by parameter, each rank's slices at their places: nothing to unpack. */
/* The call's group, ranks, kind and bytes (Gather costed). */
static void cost_call(const Builder *b, Gather *c)
{
    const ZpSchedule *s = b->s;
    const double bytes = (double)c->call_elems * b->state.param_bytes;
    c->group = gather_group(b, c);
    c->ranks = zp_zeropp_group_ranks(&s->plan, c->group);
    c->reduced = zp_sched_fetch_allreduce(&s->plan, c->n, c->group);
    c->wire_bytes = c->reduced ? bytes
                               : zp_zeropp_gather_bytes(&s->plan, c->call_elems, c->ranks,
                                                        b->state.param_bytes);
    /* Parameter offload: the partition comes up from the host (and NVMe) first. */
    double nvme_bytes = 0, h2d_bytes = 0;
    const double part = (double)s->partition_elems;
    const double kept = zp_offload_param_kept_elems(&s->plan, part);
    if (s->plan.impl == ZP_IMPL_DEEPSPEED && kept > 0 && kept < part) {
        /* some sub-groups kept on the host: each tensor's slice from its place (the call's
         * gathers are its tensors) */
        for (guint k = 0; k < c->n; k++) {
            double nvme, h2d;
            zp_offload_fetch(&s->plan, (double)c[k].fetch.elems / s->plan.dp,
                             zp_impl_tensor_part_at(s, c[k].fetch.offset), part, &nvme, &h2d);
            nvme_bytes += nvme, h2d_bytes += h2d;
        }
    } else {
        zp_offload_fetch(&s->plan, (double)c->call_elems / s->plan.dp, -1, part, &nvme_bytes,
                         &h2d_bytes);
    }
    c->nvme_bytes = nvme_bytes, c->h2d_bytes = h2d_bytes;
    c->costed = TRUE;
}

static void issue_call(Builder *b, Gather *c, int key, int micro)
{
    const ZpSchedule *s = b->s;
    if (!c->costed)
        cost_call(b, c);
    const double bytes = (double)c->call_elems * b->state.param_bytes;
    const ZpGroup group = c->group;
    const int ranks = c->ranks;
    const gboolean reduced = c->reduced;
    const double wire = c->wire_bytes, nvme_bytes = c->nvme_bytes, h2d_bytes = c->h2d_bytes;
    int buffer;
    uint32_t alloc = gather_alloc(b, bytes, c->fetch.unit, micro, &buffer, key);
    const gboolean in_place = c->n == 1 && !b->impl->copy_out_single;
    c->unpacked = in_place || reduced;
    c->flat = c->unpacked ? -1 : buffer;
    if (in_place)
        c->buffer = buffer, c->bytes = bytes;
    if (reduced) /* the parameters are views of the buffer: freed with the last of them */
        own_by_last_free(c, buffer, bytes);
    const uint32_t read =
        zp_build_emit_transfer(b, ZP_XFER_NVME_READ, nvme_bytes, c->fetch.unit, micro, alloc);
    alloc = zp_build_emit_transfer(b, ZP_XFER_H2D, h2d_bytes, c->fetch.unit, micro, read);
    if (s->plan.zero.zero_quantized_weights) { /* this rank's partition into int8 */
        uint32_t qalloc = zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, wire, c->fetch.unit, micro,
                                              &c->quant_buffer, &alloc, 1);
        const uint64_t part = c->call_elems / (uint64_t)ranks;
        alloc = zp_build_emit_quantize(b, ZP_STREAM_DP, c->fetch.unit, micro,
                                       zp_zeropp_quantize_mem_bytes(part), &qalloc, 1);
    }
    const uint32_t coll = zp_build_emit_collective(
        b, reduced ? ZP_COLL_ALLREDUCE : ZP_COLL_ALLGATHER, group, c->fetch.unit, micro, buffer,
        c->fetch.offset, c->call_elems, wire, &alloc, 1);
    for (guint k = 0; k < c->n; k++)
        c[k].coll_op = coll;
    /* ZpImpl secondary_per_block: the gather inside hpZ's group reads the block's secondary
     * shard, freed once the host has issued it (_fsdp_param.py to_unsharded drops the
     * post-forward shard as the all-gather is issued, the all-gather stream's use of it
     * ordered by FSDP2's events): after the compute op the gather follows, as frees_at_issue
     * frees, so that the timeline holds what the list order does */
    for (guint k = 0; group == ZP_GROUP_HPZ && k < c->n; k++) {
        const int u = c[k].fetch.unit;
        if (b->secondary && b->secondary[u] >= 0) {
            zp_build_emit_free(b, ZP_MEM_SECONDARY_PARAMS, secondary_bytes(b, u), u, micro,
                               b->secondary[u], b->last_compute);
            b->secondary[u] = -1;
        }
    }
}

/* The calls triggered at step `key`: those its compute needs (`now`), or its prefetches.
 * fetch_sub_module (partitioned_param_coordinator.py) gathers the module's own parameters,
 * waits for them on the gather stream, and only then issues the prefetch, so a prefetch
 * queues behind the wait's copies, never the wait behind the prefetch. */
void zp_build_issue_gathers(Builder *b, int key, int micro, gboolean now)
{
    for (guint i = b->by_trigger.start[key]; i < b->by_trigger.start[key + 1]; i++) {
        Gather *g = gather_at(b, &b->by_trigger, i); /* a call's first gather */
        if ((zp_build_step_key(g->fetch.use_pos, g->fetch.use_step) == key) == now)
            issue_call(b, g, key, micro);
    }
}

/* A coalesced call waited for (AllGatherCoalescedHandle.wait): every parameter of the call
 * gets a buffer of its own elements (torch.cat of its slices out of the flat buffer, on the
 * gather stream), all at once, whichever of them is needed first. */
static void unpack_call(Builder *b, Gather *c, int key, int micro)
{
    uint32_t *deps = g_new(uint32_t, c->n + 1);
    double bytes = 0;
    deps[0] = c->coll_op;
    for (guint k = 0; k < c->n; k++) {
        c[k].bytes = (double)c[k].fetch.numel * b->state.param_bytes;
        deps[k + 1] = gather_alloc(b, c[k].bytes, c[k].fetch.unit, micro, &c[k].buffer, key);
        bytes += c[k].bytes;
    }
    ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_UNPACK, .stream = ZP_STREAM_DP,
               .unit = c->fetch.unit, .micro = micro, .buffer = -1, .mem_bytes = 2 * bytes};
    const uint32_t unpack = zp_build_emit(b, op, deps, c->n + 1);
    for (guint k = 0; k < c->n; k++)
        c[k].coll_op = unpack;
    c->unpacked = TRUE;
    g_free(deps);
}

/* The gathers the compute op of step `key` needs. With qwZ each call is dequantised first, on the
 * compute stream when it is waited for (AllGatherCoalescedHandle.wait); a coalesced call is
 * unpacked, and its flat buffer freed once its last parameter is waited for (the handle,
 * which holds the buffer, leaves the inflight registry with that parameter:
 * partitioned_param_coordinator.py fetch_sub_module). The host waits for each parameter after
 * the allgather stream's event three parameters back, and records one after it (the op its
 * compute waits for: _fetch_sub_module_impl's __ongoing_fetch_events). */
void zp_build_gathers_used_at(Builder *b, int key, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    for (guint i = b->by_use.start[key]; i < b->by_use.start[key + 1]; i++) {
        Gather *g = gather_at(b, &b->by_use, i);
        Gather *c = &g_array_index(b->gathers, Gather, g->call);
        b->fetch_gate = zp_build_host_sync(b->fetch_event, b->n_fetch_events, b->fetch_gate);
        if (c->quant_buffer >= 0) {
            const int ranks = zp_zeropp_group_ranks(&s->plan, gather_group(b, c));
            const uint32_t after[2] = {c->coll_op, b->last_compute};
            const uint32_t op = zp_build_emit_quantize(
                         b, ZP_STREAM_COMPUTE, c->fetch.unit, micro,
                         zp_zeropp_dequantize_mem_bytes(c->call_elems, ranks), after, 2);
            zp_build_emit_free(b, ZP_MEM_WORKSPACE,
                               zp_zeropp_gather_bytes(&s->plan, c->call_elems, ranks,
                                                               b->state.param_bytes),
                               c->fetch.unit, micro, c->quant_buffer, op);
            c->quant_buffer = -1;
            for (guint k = 0; k < c->n; k++)
                c[k].coll_op = op;
        }
        if (!c->unpacked) {
            unpack_call(b, c, key, micro);
            b->waited = c->coll_op, b->waited_key = key;
        }
        if (c->flat >= 0 && key == c->last_use) {
            b->waited = zp_build_emit_free(b, ZP_MEM_GATHERED_PARAMS,
                                           (double)c->call_elems * b->state.param_bytes,
                                           c->fetch.unit, micro, c->flat, c->coll_op);
            b->waited_key = key;
            c->flat = -1;
        }
        zp_build_put_dep(b, deps, g->coll_op);
        zp_build_record_event(b->fetch_event, &b->n_fetch_events, g->coll_op);
    }
}

void zp_build_free_gathers(Builder *b, int key, int micro)
{
    for (guint i = b->by_free.start[key]; i < b->by_free.start[key + 1]; i++) {
        const Gather *g = gather_at(b, &b->by_free, i);
        uint32_t after = b->last_compute;
        const int u = g->fetch.unit;
        if (keeps_secondary(b, g) && b->secondary[u] < 0) /* copied from the unsharded block */
            b->secondary_op[u] = zp_build_emit_alloc(b, ZP_MEM_SECONDARY_PARAMS,
                                                     secondary_bytes(b, u), u, micro,
                                                     &b->secondary[u], &after, 1);
        if (keeps_secondary(b, g)) /* before it goes */
            after = b->secondary_op[u];
        if (g->buffer >= 0)
            b->released = zp_build_emit_free(b, ZP_MEM_GATHERED_PARAMS, g->bytes, g->fetch.unit,
                                             micro, g->buffer, after);
    }
}
