/* zp_build_emit: how the schedule builder emits ops (compute, collective, alloc, free, transfer)
 * with their dependencies and stream order, and what each compute op costs. */
#include "zp_build.h"
#include "zp_cost_kernels.h"
#include "zp_sched_json.h"
#include "zp_util.h"

#include <string.h>

/* An op's dependencies written straight into the schedule's array: room for all it may
 * take is made once (zp_array_extend, then the length put back), so that each is one store.
 * Each GArray call checks the array's room with a 64-bit division (g_array_maybe_expand),
 * and ops took five or more of them each (perf on Megatron 1T's build: 8% of it in that
 * check); gathering them on the stack first and copying them over cost a memcpy call an op
 * (callgrind, plan --3d gpt-1t/4096: 90 M instructions of 4.28 G).
 * deps_open: room for `most` more dependencies past s->deps's length, which stays; returns
 * the first. */
G_ALWAYS_INLINE static inline uint32_t *deps_open(Builder *b, guint64 most)
{
    GArray *out = b->s->deps;
    const guint len = out->len;
    if (G_UNLIKELY((guint64)len + most > G_MAXUINT)) /* as GLib's growth aborts there */
        g_error("the schedule's dependencies: %u and %" G_GUINT64_FORMAT " more overflow",
                len, most);
    zp_array_extend(out, (guint)most, sizeof(uint32_t), &b->deps_room);
    out->len = len;
    return (uint32_t *)out->data + len;
}

/* Those of deps[0 .. n) that are ops (NONE: none), written from p on; returns past the last. */
G_ALWAYS_INLINE static inline uint32_t *deps_put_ops(uint32_t *p, const uint32_t *deps, guint n)
{
    for (guint i = 0; i < n; i++)
        if (deps[i] != NONE)
            *p++ = deps[i];
    return p;
}

/* The dependency at position `at` of the deps array on another stage's send `key`, filled in
 * once it is built (link_sends): recorded, and CROSS returned to be stored there. One array
 * of pairs, where two arrays (positions, keys) took two extensions a receive (Megatron 1T:
 * 67 instructions each of its 9,072, their growth included). */
static uint32_t deps_cross(Builder *b, uint32_t at, int64_t key)
{
    ZpCrossDep *c = zp_array_extend(b->cross, 1, sizeof *c, &b->cross_room);
    c->at = at, c->key = key;
    return CROSS;
}

/* Where the next op is written: its place at the end of the schedule's ops, taken now, or
 * past max_ops (zp_schedsize_max_ops) the builder's scratch op, which is not stored. The
 * emitters fill it in place: an op built on the stack and passed by value was read back
 * whole right after its byte fields were written, which stalls the store forwarding (perf:
 * three quarters of zp_build_emit_collective's time on that load). The array is made
 * without clearing (zp_sched_build), so growing it writes nothing. */
G_ALWAYS_INLINE static inline ZpOp *op_slot(Builder *b)
{
    GArray *ops = b->s->ops;
    if (ops->len >= b->max_ops) {
        b->over_ops = TRUE; /* its dependencies stay: a pipeline's link_sends fills some */
        return &b->unstored_op;
    }
    return zp_array_extend(ops, 1, sizeof(ZpOp), &b->ops_room);
}

/* Completes the op op_slot gave, filled but for its stage and dependencies: those are
 * another stage's send it receives first, deps and then more (each NONE skipped), and the
 * host's wait on the device. Returns its index (the last stored op's past max_ops). Inlined
 * in each emitter with op_slot (G_ALWAYS_INLINE: gcc -O2 called them), where the op's kind
 * and its dependencies' counts are known: plan --3d gpt-1t/4096's 2.2 million ops took 0.13 G
 * instructions less. */
G_ALWAYS_INLINE static inline uint32_t op_finish(Builder *b, ZpOp *op, const uint32_t *deps,
                                                 guint n_deps, const uint32_t *more,
                                                 guint n_more)
{
    ZpSchedule *s = b->s;
    const gboolean compute = op->kind == ZP_OP_COMPUTE;
    const gboolean streamed = compute || op->kind == ZP_OP_COLLECTIVE;
    /* The dependencies through a local cursor and the array's length in a local: through the
     * builder, each store could alias the arrays' fields for the compiler, which re-read them
     * (and a cursor whose address is taken lives in memory). */
    GArray *dep_array = s->deps;
    const guint start = dep_array->len;
    uint32_t *const first = deps_open(b, (guint64)n_deps + n_more + 3); /* + 2 sends, host */
    uint32_t *p = first;
    if (b->recv_key >= 0 && streamed) { /* the first dependency: another stage's send */
        *p = deps_cross(b, start + (guint)(p - first), b->recv_key);
        p++;
        b->recv_key = -1;
    }
    if (b->recv_key_sync >= 0 && compute) { /* ZpPlan p2p_sync */
        *p = deps_cross(b, start + (guint)(p - first), b->recv_key_sync);
        p++;
        b->recv_key_sync = -1;
    }
    p = deps_put_ops(p, deps, n_deps);
    p = deps_put_ops(p, more, n_more);
    if (b->host_sync != NONE) { /* issued by the host after it waited for the device */
        *p++ = b->host_sync;
        if (compute)
            b->host_sync = NONE;
    }
    const guint n = (guint)(p - first);
    dep_array->len = start + n;
    op->stage = (uint32_t)b->stage;
    op->dep_start = start;
    op->n_deps = n;
    const uint32_t at = s->ops->len - 1;
    if (op != &b->unstored_op && streamed)
        b->last_on_stream[op->stream] = at;
    return at;
}

uint32_t zp_build_emit(Builder *b, ZpOp op, const uint32_t *deps, guint n_deps)
{
    ZpOp *slot = op_slot(b);
    *slot = op;
    return op_finish(b, slot, deps, n_deps, NULL, 0);
}

/* backend_workspace: the workspace zreal's CPU backend holds from the first compute op to the
 * end of the run (the engine's, unit 0 micro-step 0, so that the engine allocates nothing for
 * it: real_engine.c needed_bytes), then each op's own around it. */
static void workspace_before(Builder *b, ZpComputeKind kind, int unit, int micro,
                             GArray *all, int *buffer)
{
    const ZpSchedule *s = b->s;
    *buffer = -1;
    if (!s->plan.backend_workspace)
        return;
    if (b->resident < 0) {
        const uint32_t at = zp_build_emit_alloc(
            b, ZP_MEM_WORKSPACE, zp_cost_resident_workspace_bytes(&s->model, &s->plan), 0, 0,
            &b->resident, NULL, 0);
        g_array_append_val(all, at);
    }
    const double bytes = zp_cost_op_workspace_bytes(&s->model, &s->plan, kind);
    if (b->module_step > 0) /* a later module of a block: the first one's is held */
        return;
    if (b->workspace_free != NONE) /* one op's at a time, as the backend runs them */
        g_array_append_val(all, b->workspace_free);
    if (bytes > 0) {
        const uint32_t at = zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, bytes, unit, micro, buffer,
                                                (const uint32_t *)all->data, all->len);
        g_array_append_val(all, at);
    }
}

uint32_t zp_build_emit_compute(Builder *b, ZpComputeKind kind, int unit, int micro, Cost cost,
                               const uint32_t *deps, guint n_deps)
{
    /* The op waits for deps and the collectives it synchronises with (sync_deps); under
     * backend_workspace for its workspace too, whose alloc, emitted first, takes the same
     * dependencies (`all`: emitting an alloc never comes back here). */
    const uint32_t *more = (const uint32_t *)b->sync_deps->data;
    guint n_more = b->n_sync;
    int workspace = -1;
    const gboolean workspaces = b->s->plan.backend_workspace;
    if (workspaces) {
        GArray *all = b->compute_deps;
        g_array_set_size(all, 0);
        g_array_append_vals(all, deps, n_deps);
        g_array_append_vals(all, more, n_more);
        b->n_sync = 0;
        workspace_before(b, kind, unit, micro, all, &workspace);
        deps = (const uint32_t *)all->data, n_deps = all->len;
        more = NULL, n_more = 0;
    }
    ZpOp *op = op_slot(b);
    *op = (ZpOp){.kind = ZP_OP_COMPUTE, .sub = kind, .stream = ZP_STREAM_COMPUTE, .unit = unit,
                 .micro = micro, .buffer = -1, .flops = cost.flops,
                 .gemm_flops = cost.gemm_flops, .attn_flops = cost.attn_flops,
                 .mem_bytes = cost.mem_bytes};
    b->last_compute = op_finish(b, op, deps, n_deps, more, n_more);
    b->n_sync = 0;
    /* Without backend_workspace there is none to hand on or free (block_workspace stays -1):
     * the three tests below were each compute op's (plan --3d gpt-1t/4096: 470,000). */
    if (!workspaces)
        return b->last_compute;
    if (b->module_step == 0)
        b->block_workspace = workspace;
    if (b->module_step == ZP_POS_STEPS - 1)
        workspace = b->block_workspace, b->block_workspace = -1;
    if (workspace >= 0 && (b->module_step < 0 || b->module_step == ZP_POS_STEPS - 1))
        b->workspace_free = zp_build_emit_free(b, ZP_MEM_WORKSPACE,
                                               zp_cost_op_workspace_bytes(&b->s->model, &b->s->plan,
                                                                                   kind),
                                               unit, micro, workspace, b->last_compute);
    return b->last_compute;
}

uint32_t zp_build_emit_collective(Builder *b, ZpCollKind kind, ZpGroup group, int unit, int micro,
                                  int buffer, uint64_t offset, uint64_t elems, double bytes,
                                  const uint32_t *deps, guint n_deps)
{
    /* Each on its group's stream, a mixture of experts' dispatch and combine between the
     * layer's kernels (zp_sched_json_default_stream). */
    ZpOp *op = op_slot(b);
    *op = (ZpOp){.kind = ZP_OP_COLLECTIVE, .sub = kind,
                 .stream = zp_sched_json_default_stream(ZP_OP_COLLECTIVE, kind, group),
                 .group = group,
                 .unit = unit, .micro = micro, .buffer = buffer, .bytes = bytes,
                 .elem_offset = offset, .elems = elems};
    return op_finish(b, op, deps, n_deps, NULL, 0);
}

/* Emits an alloc; returns the op index and stores the new buffer id in *buffer. */
uint32_t zp_build_emit_alloc(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                             int *buffer, const uint32_t *deps, guint n_deps)
{
    *buffer = b->next_buffer++;
    ZpOp *op = op_slot(b);
    *op = (ZpOp){.kind = ZP_OP_ALLOC, .sub = cat, .unit = unit, .micro = micro,
                 .buffer = *buffer, .bytes = bytes};
    return op_finish(b, op, deps, n_deps, NULL, 0);
}

uint32_t zp_build_emit_free(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                            int buffer, uint32_t after)
{
    ZpOp *op = op_slot(b);
    *op = (ZpOp){.kind = ZP_OP_FREE, .sub = cat, .unit = unit, .micro = micro, .buffer = buffer,
                 .bytes = bytes};
    return op_finish(b, op, &after, 1, NULL, 0);
}

/* A transfer of `bytes` (none when 0: returns `after`) after `after`. */
uint32_t zp_build_emit_transfer(Builder *b, ZpTransferKind kind, double bytes, int unit, int micro,
                                uint32_t after)
{
    if (bytes <= 0)
        return after;
    const ZpStream stream =
        kind == ZP_XFER_D2H || kind == ZP_XFER_H2D ? ZP_STREAM_HOST : ZP_STREAM_NVME;
    ZpOp *op = op_slot(b);
    *op = (ZpOp){.kind = ZP_OP_TRANSFER, .sub = kind, .stream = stream, .unit = unit,
                 .micro = micro, .buffer = -1, .bytes = bytes};
    return op_finish(b, op, &after, 1, NULL, 0);
}

/* The next compute op waits for op too (Builder.sync_deps). */
void zp_build_sync_on(Builder *b, uint32_t op)
{
    if (b->n_sync == b->sync_deps->len)
        g_array_set_size(b->sync_deps, 2 * b->n_sync + 8);
    g_array_index(b->sync_deps, uint32_t, b->n_sync++) = op;
}

/* A sum's collective at op: its template (ZpTpSum ops) for (unit, micro, stage), its
 * dependencies at dep_start. */
G_ALWAYS_INLINE static inline void put_sum_op(ZpOp *op, const ZpOp *tmpl, int unit, int micro,
                                              uint32_t stage, guint dep_start)
{
    *op = *tmpl;
    op->unit = unit, op->micro = micro, op->stage = stage, op->dep_start = dep_start;
}

/* The common case of zp_build_emit_tp_chain: no other stage's send to wait for and room for
 * every op below max_ops. The ops (from the sum's templates) and their dependencies (the op
 * before in the chain, and the host's wait on the device while there is one: op_finish's
 * list for them) are written in one pass, with the arrays' room made once, where op_finish
 * re-read the arrays' lengths through the builder for each (plan --3d and Megatron 1T: 130
 * instructions a collective). */
static uint32_t tp_chain_direct(Builder *b, const ZpTpSum *t, int chains, int unit, int micro,
                                uint32_t after)
{
    ZpSchedule *s = b->s;
    const guint n_ops = (guint)(t->n * chains), first = s->ops->len;
    ZpOp *op = zp_array_extend(s->ops, n_ops, sizeof(ZpOp), &b->ops_room);
    /* locals throughout: a store through op or the dependencies may alias the arrays' fields
     * for the compiler, which then reloads them */
    const guint dep_base = s->deps->len;
    uint32_t *const first_dep = deps_open(b, 2 * (guint64)n_ops);
    uint32_t *dep = first_dep;
    const uint32_t host = b->host_sync, stage = (uint32_t)b->stage;
    uint32_t *sync = &g_array_index(b->sync_deps, uint32_t, b->n_sync);
    uint32_t at = first;
    for (int c = 0; c < chains; c++) {
        uint32_t last = after; /* each chain follows `after` alone */
        for (int k = 0; k < t->n; k++, op++, at++) {
            uint32_t *from = dep;
            if (last != NONE)
                *dep++ = last;
            if (host != NONE)
                *dep++ = host;
            put_sum_op(op, &t->ops[k], unit, micro, stage, dep_base + (guint)(from - first_dep));
            op->n_deps = (uint32_t)(dep - from);
            last = at;
            *sync++ = at;
        }
    }
    s->deps->len = dep_base + (guint)(dep - first_dep);
    b->n_sync += n_ops;
    b->last_on_stream[ZP_STREAM_TP] = at - 1;
    return at - 1;
}

/* The build's tensor-parallel sums (Builder.tp_sum), as zp_build_emit_collective and
 * zp_build_sync_on emit them, in one call all of a block op's sums: their ops' kind, group,
 * stream and single dependency are known here, and a call of eleven arguments a collective and
 * one a sync were a third of their cost (plan --3d gpt-1t/4096: 548,400 of them); the sync
 * list's room is made once for them all, and a block's two sums were two calls through
 * zp_build_tp_sum (Megatron 1T: 55,000 collectives, 30 instructions each in the calls). */
uint32_t zp_build_emit_tp_chain(Builder *b, int chains, int unit, int micro, uint32_t after)
{
    const ZpTpSum *t = &b->tp_sum;
    const guint n_ops = (guint)(t->n * chains);
    if (n_ops == 0)
        return after;
    if (b->n_sync + n_ops > b->sync_deps->len)
        g_array_set_size(b->sync_deps, 2 * (b->n_sync + n_ops) + 8);
    if (b->recv_key < 0 && (double)b->s->ops->len + (double)(n_ops - 1) < b->max_ops)
        return tp_chain_direct(b, t, chains, unit, micro, after);
    uint32_t last = after;
    for (int c = 0; c < chains; c++) {
        last = after; /* each chain follows `after` alone */
        for (int k = 0; k < t->n; k++) {
            ZpOp *op = op_slot(b);
            put_sum_op(op, &t->ops[k], unit, micro, 0, 0); /* op_finish: stage, dependencies */
            last = op_finish(b, op, &last, 1, NULL, 0);
            g_array_index(b->sync_deps, uint32_t, b->n_sync++) = last;
        }
    }
    return last;
}

/* A run of ops written in one pass (block_op_direct, the blocks' writers below): the room
 * for all of them and their dependencies made once, the next op's place and index and the
 * next dependency's place held in locals of the caller, the arrays' lengths put back at the
 * end (run_close). Each op written through op_slot and op_finish made the room and re-read
 * the arrays through the builder (Megatron 1T: an alloc or free cost 86 to 105
 * instructions). */
typedef struct {
    ZpOp *op;                  /* the next op's place */
    uint32_t at;               /* and its index */
    uint32_t *dep, *first_dep; /* the next dependency's place; the run's first */
    guint dep_base;            /* the first's index in the schedule's deps */
} Run;

/* Room for n_ops ops (exactly those the run writes) and at most most_deps dependencies;
 * FALSE, with nothing done, where an op would pass max_ops (the emitters' own path then
 * stores what it may and records the overflow). */
G_ALWAYS_INLINE static inline gboolean run_open(Builder *b, Run *r, guint n_ops,
                                                guint64 most_deps)
{
    ZpSchedule *s = b->s;
    if ((guint64)s->ops->len + n_ops > b->ops_cap) /* an op at max_ops or past it */
        return FALSE;
    r->at = s->ops->len;
    r->op = zp_array_extend(s->ops, n_ops, sizeof(ZpOp), &b->ops_room);
    r->dep_base = s->deps->len;
    r->first_dep = r->dep = deps_open(b, most_deps);
    return TRUE;
}

G_ALWAYS_INLINE static inline void run_close(Builder *b, const Run *r)
{
    b->s->deps->len = r->dep_base + (guint)(r->dep - r->first_dep);
}

/* An alloc or free (kind) in a run, as zp_build_emit_alloc and zp_build_emit_free write it:
 * after `after` (NONE: nothing) and the host's wait on the device, which stays. */
G_ALWAYS_INLINE static inline uint32_t run_memory_op(Builder *b, Run *r, ZpOpKind kind,
                                                     ZpMemCategory cat, double bytes, int unit,
                                                     int micro, int buffer, uint32_t after)
{
    ZpOp *op = r->op++;
    /* field by field over a cleared op, as run_block_op writes its compute op: an op built
     * whole was built on the stack and copied (19 instructions an op) */
    memset(op, 0, sizeof *op);
    op->kind = (uint8_t)kind, op->sub = (uint8_t)cat;
    op->unit = unit, op->micro = micro, op->buffer = buffer, op->bytes = bytes;
    uint32_t *dep = r->dep;
    if (after != NONE)
        *dep++ = after;
    if (b->host_sync != NONE)
        *dep++ = b->host_sync;
    op->stage = (uint32_t)b->stage;
    op->dep_start = r->dep_base + (guint)(r->dep - r->first_dep);
    op->n_deps = (uint32_t)(dep - r->dep);
    r->dep = dep;
    return r->at++;
}

/* A block op in a run (zp_build_emit_block_op's common case: no workspaces, no p2p_sync
 * exchange pending). The compute op takes what emit_compute's op_finish gives it (another
 * stage's send, deps, the synchronised collectives, the host's wait, which it clears); each
 * sum's first collective then waits for the compute op alone, the next for the one before.
 * The sync list holds room for the sums (zp_build_emit_block_op, Builder.blocks_direct). */
G_ALWAYS_INLINE static inline uint32_t run_block_op(Builder *b, Run *r, ZpComputeKind kind,
                                                    int unit, int micro, const Cost *cost,
                                                    const uint32_t *deps, guint n_deps,
                                                    const ZpTpSum *t, int sums)
{
    const guint n_tp = (guint)(t->n * sums), n_sync = b->n_sync, dep_base = r->dep_base;
    const uint32_t first = r->at, stage = (uint32_t)b->stage;
    uint32_t *const first_dep = r->first_dep, *const op_deps = r->dep;
    uint32_t *dep = op_deps;
    ZpOp *op = r->op;
    if (b->recv_key >= 0) { /* the first dependency: another stage's send */
        *dep = deps_cross(b, dep_base + (guint)(dep - first_dep), b->recv_key);
        dep++;
        b->recv_key = -1;
    }
    dep = deps_put_ops(dep, deps, n_deps);
    uint32_t *sync = (uint32_t *)b->sync_deps->data;
    dep = deps_put_ops(dep, sync, n_sync);
    if (b->host_sync != NONE) { /* issued by the host after it waited for the device */
        *dep++ = b->host_sync;
        b->host_sync = NONE;
    }
    /* field by field over a cleared op: an op built whole was built on the stack and copied
     * (gcc -O2), each time */
    memset(op, 0, sizeof *op);
    op->kind = ZP_OP_COMPUTE, op->sub = (uint8_t)kind, op->stream = ZP_STREAM_COMPUTE;
    op->unit = unit, op->micro = micro, op->buffer = -1, op->stage = stage;
    op->flops = cost->flops, op->gemm_flops = cost->gemm_flops;
    op->attn_flops = cost->attn_flops, op->mem_bytes = cost->mem_bytes;
    op->dep_start = dep_base + (guint)(op_deps - first_dep);
    op->n_deps = (uint32_t)(dep - op_deps);
    b->last_compute = b->last_on_stream[ZP_STREAM_COMPUTE] = first;
    /* The sums' ops, each copied from its template (ZpTpSum ops): a sum's first follows the
     * compute op, the next the one before it. Two loops, each collective cleared and written
     * field by field, were 302 instructions a block op and its two all-reduces on Megatron
     * 1T (8.34 M over 27,648), 270 with one loop; a sum of one collective (no sequence
     * parallelism) has its own loop without the chain's bookkeeping: 250. */
    uint32_t at = first + 1;
    if (t->n == 1) {
        for (guint i = 0; i < n_tp; i++, at++) {
            put_sum_op(++op, &t->ops[0], unit, micro, stage, dep_base + (guint)(dep - first_dep));
            *dep++ = first;
            *sync++ = at;
        }
    } else {
        for (guint i = 0, k = 0; i < n_tp; i++, at++) {
            put_sum_op(++op, &t->ops[k], unit, micro, stage, dep_base + (guint)(dep - first_dep));
            *dep++ = k == 0 ? first : at - 1;
            *sync++ = at;
            if (++k == (guint)t->n)
                k = 0;
        }
    }
    b->n_sync = n_tp;
    if (n_tp > 0)
        b->last_on_stream[ZP_STREAM_TP] = at - 1;
    r->op = op + 1, r->at = at, r->dep = dep;
    return first;
}

/* zp_build_emit_block_op's common case, room for all its ops below max_ops: a run of its
 * own. A block op and its two sums were a call of the compute's and three calls deep for the
 * sums, each making room and re-reading the arrays through the builder
 * (narayanan21-t1-529.6b: 55,000 block ops, 470 instructions each). */
static uint32_t block_op_direct(Builder *b, ZpComputeKind kind, int unit, int micro,
                                const Cost *cost, const uint32_t *deps, guint n_deps,
                                const ZpTpSum *t, int sums)
{
    const guint n_tp = (guint)(t->n * sums);
    Run r;
    if (!run_open(b, &r, 1 + n_tp, (guint64)n_deps + b->n_sync + 2 + n_tp))
        return NONE;
    const uint32_t first = run_block_op(b, &r, kind, unit, micro, cost, deps, n_deps, t, sums);
    run_close(b, &r);
    return first;
}

uint32_t zp_build_emit_block_op(Builder *b, ZpComputeKind kind, int unit, int micro,
                                const Cost *cost, const uint32_t *deps, guint n_deps, int sums)
{
    const ZpTpSum *t = &b->tp_sum;
    const guint n_tp = (guint)(t->n * sums);
    if (n_tp > b->sync_deps->len) /* the sums' syncs replace the compute op's */
        g_array_set_size(b->sync_deps, 2 * n_tp + 8);
    if (!b->s->plan.backend_workspace && b->recv_key_sync < 0) {
        const uint32_t first = block_op_direct(b, kind, unit, micro, cost, deps, n_deps, t, sums);
        if (first != NONE)
            return first;
    }
    const uint32_t op = zp_build_emit_compute(b, kind, unit, micro, *cost, deps, n_deps);
    if (sums > 0)
        zp_build_emit_tp_chain(b, sums, unit, micro, b->last_compute);
    return op;
}

/* A block's forward or recompute in one run (Builder.blocks_direct): the alloc of what it
 * keeps (its checkpoint, or its activations) after the last compute op, and the block op
 * after it alone with its sums, as zp_build_emit_alloc and zp_build_emit_block_op write them
 * (the step's deps, through which the emitters' path passes the alloc, are not written: the
 * step's next position empties them before any use). In calls, a block's forward, recompute and backward
 * with their allocs and frees cost 2,300 instructions on Megatron 1T, its calls' prologues,
 * room checks and tests again for each op. */
gboolean zp_build_emit_block_kept(Builder *b, ZpComputeKind kind, int unit, int micro,
                                  ZpMemCategory cat, double bytes, int *buffer,
                                  const Cost *cost, int sums)
{
    const ZpTpSum *t = &b->tp_sum;
    const guint n_tp = (guint)(t->n * sums);
    Run r;
    if (!run_open(b, &r, 2 + n_tp, 2 + 1 + 1 + (guint64)b->n_sync + 1 + n_tp))
        return FALSE;
    if (n_tp > b->sync_deps->len) /* the sums' syncs replace the compute op's */
        g_array_set_size(b->sync_deps, 2 * n_tp + 8);
    *buffer = b->next_buffer++;
    const uint32_t alloc =
        run_memory_op(b, &r, ZP_OP_ALLOC, cat, bytes, unit, micro, *buffer, b->last_compute);
    run_block_op(b, &r, kind, unit, micro, cost, &alloc, 1, t, sums);
    run_close(b, &r);
    return TRUE;
}

/* A block's backward in one run (Builder.blocks_direct): the block op after deps with its
 * sums, then the frees of its activations (act), of core attention's recomputed tensors
 * (core; -1: none) and of its checkpoint (ckpt; -1: none), as zp_build_emit_block_op and
 * zp_build_emit_free write them. */
gboolean zp_build_emit_block_backward(Builder *b, int unit, int micro, const Cost *cost,
                                      const uint32_t *deps, guint n_deps, double act_bytes,
                                      int act, double core_bytes, int core, double ckpt_bytes,
                                      int ckpt)
{
    const ZpTpSum *t = &b->tp_sum;
    const int sums = zp_build_block_tp_sums(b, unit);
    const guint n_tp = (guint)(t->n * sums);
    Run r;
    if (!run_open(b, &r, 2 + n_tp + (core >= 0) + (ckpt >= 0),
                  1 + (guint64)n_deps + b->n_sync + 1 + n_tp + 3 * 2))
        return FALSE;
    if (n_tp > b->sync_deps->len)
        g_array_set_size(b->sync_deps, 2 * n_tp + 8);
    run_block_op(b, &r, ZP_COMP_BLOCK_BWD, unit, micro, cost, deps, n_deps, t, sums);
    run_memory_op(b, &r, ZP_OP_FREE, ZP_MEM_ACTIVATIONS, act_bytes, unit, micro, act,
                  b->last_compute);
    if (core >= 0)
        run_memory_op(b, &r, ZP_OP_FREE, ZP_MEM_ACTIVATIONS, core_bytes, unit, micro, core,
                      b->last_compute);
    if (ckpt >= 0)
        run_memory_op(b, &r, ZP_OP_FREE, ZP_MEM_CHECKPOINTS, ckpt_bytes, unit, micro, ckpt,
                      b->last_compute);
    run_close(b, &r);
    return TRUE;
}

/* A p2p op of the pipeline (zp_build_send), written in place as the other emitters write
 * theirs, after the last compute op and the collectives it synchronises with: built on the
 * stack, its dependencies gathered in an array and both copied into the schedule, a send cost
 * 280 instructions (narayanan21-t1-529.6b: 36,400 of them). */
uint32_t zp_build_emit_p2p(Builder *b, ZpP2pKind dir, int unit, int micro, uint32_t peer,
                           uint64_t elems, double bytes)
{
    ZpOp *op = op_slot(b);
    *op = (ZpOp){.kind = ZP_OP_P2P, .sub = dir, .stream = ZP_STREAM_PP, .group = ZP_GROUP_PP,
                 .unit = unit, .micro = micro, .buffer = -1, .peer = peer, .bytes = bytes,
                 .elems = elems};
    return op_finish(b, op, &b->last_compute, 1, (const uint32_t *)b->sync_deps->data,
                     b->n_sync);
}

/* An event recorded on a stream after op (a ring of the last three), and the op whose event
 * the host synchronises before recording another, `gate` until three are outstanding:
 * DeepSpeed lets 2 be outstanding (partitioned_param_coordinator.py __max_ongoing_fetch_events,
 * stage3.py max_param_reduce_events) and synchronises the oldest of more (zp_runahead.h). */
void zp_build_record_event(uint32_t ring[3], guint *n, uint32_t op)
{
    ring[(*n)++ % 3] = op;
}

uint32_t zp_build_host_sync(const uint32_t ring[3], guint n, uint32_t gate)
{
    return n >= 3 ? ring[n % 3] : gate;
}

/* FLOPs and memory-bound bytes of one block's forward on this rank (tensor degree mp), with
 * q = h + 2kd the fused qkv width and f1 = f (plain MLP) or 2f (gated: gate and up):
 * GEMMs 2bs(hq + h^2 + h f1 + f h)/mp, attention scores and values 4bs^2h/mp (the s^2 counted
 * whole, as Megatron's model FLOPs count it). Elementwise work reads and writes: two norms
 * (4bsh), two residual adds (6bsh), the activation (2bsf/mp; a gated unit reads gate and up
 * and writes their product, 3bsf/mp), the eager softmax (2bas^2/mp), in the working
 * precision. A fused attention kernel's work is its own (attn_flops, timed at the kernel's
 * rate, which covers its memory traffic), so it moves no s^2 bytes here. Bias adds ride in
 * the GEMM epilogues. The typical GEMM is the mean of the block's four (five gated). */
/* Core attention's forward on this rank: scores and values 4bs^2h/mp FLOPs (a fused
 * kernel's share under a sliding window), and the eager softmax's reads and writes of the
 * b a s^2 / mp scores, 2 accesses in the working precision. What selective recomputation
 * recomputes in a block's backward (zp_build_recompute_cost). */
static Cost core_attention_cost(const ZpSchedule *s)
{
    const ZpModel *m = &s->model;
    const double b = s->plan.micro_batch, sq = m->seq_len, a = m->heads;
    const double mp = s->plan.mp;
    const gboolean fused = zp_plan_attention_rated(&s->plan); /* else eager's work */
    /* Latent attention scores over d_qk = d_nope + d_rope and weighs values of d_v per head:
     * 2 b s^2 H (d_qk + d_v) (zp_build_moe block_forward), H d_qk not being h there. */
    const ZpMla *mla = &m->mla;
    const double width = zp_mla_enabled(mla)
                             ? 0.5 * a * (double)(mla->qk_nope_dim + mla->qk_rope_dim + mla->v_dim)
                             : (double)zp_model_attn_width(m);
    const double attention =
        4 * b * sq * sq * width / mp * (fused ? zp_model_attention_share(m) : 1.0);
    return (Cost){.flops = attention, .attn_flops = fused ? attention : 0.0,
                  .mem_bytes = fused ? 0.0 : s->elem_bytes * 2 * b * a * sq * sq / mp};
}

Cost zp_build_block_forward_cost(const ZpSchedule *s)
{
    const ZpModel *m = &s->model;
    const double b = s->plan.micro_batch, sq = m->seq_len, h = m->hidden, f = m->ffn_hidden;
    const double mp = s->plan.mp, e = s->elem_bytes;
    const double q = (double)zp_model_qkv_width(m), f1 = (double)zp_model_fc1_width(m);
    const gboolean gated = zp_model_gated(m), fused = zp_plan_attention_rated(&s->plan);
    const double ha = (double)zp_model_attn_width(m); /* proj's input a d: h unless head_dim */
    const double gemm = 2 * b * sq * (h * q + ha * h + h * f1 + f * h) / mp;
    const Cost core = core_attention_cost(s);
    const double attention = core.flops;
    const double softmax = core.mem_bytes / e;
    return (Cost){.flops = gemm + attention,
                  .gemm_flops = gemm / (gated ? 5 : 4),
                  .attn_flops = fused ? attention : 0.0,
                  .mem_bytes = e * (10 * b * sq * h / (s->plan.sequence_parallel ? mp : 1) +
                                    (gated ? 3 : 2) * b * sq * f / mp + softmax)};
}

gboolean zp_build_selective(const ZpPlan *plan)
{
    return plan->selective_recompute && !plan->checkpoint;
}

Cost zp_build_recompute_cost(const ZpSchedule *s)
{
    return zp_build_selective(&s->plan) ? core_attention_cost(s) : zp_build_block_forward_cost(s);
}

/* A block's backward from its own ops (zp_cost_kernels): the data-gradient and
 * weight-gradient GEMMs of every linear (as many FLOPs as the forward's, each), the attention
 * backward (twice the forward's), and the elementwise traffic of the backward's own kernels
 * (norm and activation backward, bias gradients, the eager softmax's backward), not twice the
 * forward's. */
Cost zp_build_block_backward_cost(const ZpSchedule *s)
{
    const Cost fwd = zp_build_block_forward_cost(s);
    ZpKernels bwd;
    zp_cost_kernels(&s->model, &s->plan, ZP_COMP_BLOCK_BWD, &bwd);
    return (Cost){2 * fwd.flops, fwd.gemm_flops, 2 * fwd.attn_flops,
                  s->elem_bytes * zp_cost_accesses(&bwd)};
}

/* LM head: logits GEMM 2bshV/mp forward and twice that backward; the fp32 softmax and loss
 * read and write the logits four times. */
Cost zp_build_head_cost(const ZpSchedule *s)
{
    const ZpModel *m = &s->model;
    const double b = s->plan.micro_batch, sq = m->seq_len, h = m->hidden, V = m->vocab;
    const double logits_gemm = 2 * b * sq * h * V / s->plan.mp;
    return (Cost){.flops = 3 * logits_gemm, .gemm_flops = logits_gemm, .attn_flops = 0,
                  .mem_bytes = 16 * b * sq * V / s->plan.mp};
}

/* Embedding lookup or its scatter-add backward: read token and position rows, write bsh. */
Cost zp_build_embed_cost(const ZpSchedule *s)
{
    const double b = s->plan.micro_batch, sq = s->model.seq_len, h = s->model.hidden;
    return (Cost){.flops = 0, .gemm_flops = 0, .attn_flops = 0,
                  .mem_bytes = 3 * b * sq * h * s->elem_bytes};
}

/* Adam-like update (zp_plan_step_bytes). */
Cost zp_build_optimizer_cost(const Builder *b, double elems)
{
    return (Cost){.flops = 0, .gemm_flops = 0, .attn_flops = 0,
                  .mem_bytes = elems * zp_plan_step_bytes(b->state)};
}
