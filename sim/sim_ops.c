/* sim_ops: the static facts of a run's ops, computed once and shared by all ranks: each op's
 * duration or cost, its dependents (allocs and frees ready at once first) and its stream. */
#include "sim_engine.h"
#include "sim_engine_internal.h"
#include "sim_sums.h"
#include "zp_offload.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* ---- static facts ---- */

double sim_engine_compute_time_s(const ZpOp *op, const ZpHw *hw, double peak_flops,
                                 double attn_flops_per_s)
{
    const double link = hw->host_link_bytes_per_s;
    const double host_s = op->bytes > 0 && link > 0 ? op->bytes / link : 0.0;
    return host_s + zp_hw_compute_time_s(hw, peak_flops, op->flops, op->gemm_flops,
                                         op->attn_flops, attn_flops_per_s, op->mem_bytes,
                                         op->sub == ZP_COMP_OPTIMIZER);
}

gboolean sim_engine_attention_flops_per_s(const ZpModel *model, const ZpPlan *plan,
                                          const ZpHw *hw, double *flops_per_s, GError **error)
{
    *flops_per_s = 0;
    if (!zp_plan_attention_rated(plan))
        return TRUE;
    *flops_per_s = zp_hw_attention_flops_per_s(hw, plan->attention,
                                               (double)zp_model_head_dim(model),
                                               (double)model->seq_len);
    if (*flops_per_s > 0)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "attention: %s has no rate for '%s' in its attention table", hw->name,
                zp_attention_name(plan->attention));
    return FALSE;
}

gboolean sim_engine_peak_flops(const ZpHw *hw, ZpPrecision precision, double *peak_flops,
                               GError **error)
{
    *peak_flops = zp_hw_peak_flops(hw, precision);
    if (*peak_flops <= 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s (%s) has no %s peak in its profile",
                    hw->name, hw->gpu, zp_precision_name(precision));
        return FALSE;
    }
    return TRUE;
}

static gboolean fail_op(GError **error, uint32_t i, const char *what)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "schedule: op %u: %s", i, what);
    return FALSE;
}

/* Whether ops of this kind run on a stream (op_on_stream's, from the ZpOp). */
static inline gboolean kind_on_stream(uint8_t kind)
{
    return kind == ZP_OP_COMPUTE || kind == ZP_OP_COLLECTIVE || kind == ZP_OP_P2P ||
           kind == ZP_OP_TRANSFER;
}

/* What check_op holds each op to, read once: the schedule's fields sit behind pointers that
 * the pass's stores (counts, SimOps) may alias, so the compiler loaded them again for every
 * op. */
typedef struct {
    uint32_t stages, n_groups, n_ops;
    uint64_t n_deps_total;
    gboolean attention_rated;
} OpLimits;

/* x >= 0 && isfinite(x), from its bits: below +inf's with the sign clear, or -0 (>= 0).
 * Every op's bytes are checked: the floating-point tests, their constants loaded again for
 * each op in count_pass, were 8 instructions an op. */
static inline gboolean finite_not_negative(double x)
{
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits < UINT64_C(0x7ff0000000000000) || bits == UINT64_C(0x8000000000000000);
}

#define FIGURES_FAULT "FLOPs and bytes must be finite and not negative"

/* A compute op's costs (other kinds hold their range there: ZpOp's union), its bytes
 * checked. The costing pass asks it of those whose figures no compute op's before them had
 * (compute_s): they repeat (Megatron 1T: 9 of 27,928), and asked of each in count_pass, its
 * tests were 0.6 M of Megatron 1T's instructions. */
static inline gboolean check_figures(const ZpOp *op, const OpLimits *l, uint32_t i,
                                     GError **error)
{
    if (!(op->flops >= 0 && op->gemm_flops >= 0 && op->mem_bytes >= 0) ||
        !isfinite(op->flops + op->gemm_flops + op->mem_bytes))
        return fail_op(error, i, FIGURES_FAULT);
    if (!(op->attn_flops >= 0 && op->attn_flops <= op->flops) ||
        (op->attn_flops > 0 && !l->attention_rated))
        return fail_op(error, i, "attn_flops must be part of flops, and only with a fused kernel");
    return TRUE;
}

/* Every field the loop indexes by must be in range, or the loop would read out of bounds.
 * dep_end is where op's dependencies end, dep_start + n_deps (count_pass's sum, which is
 * where the next op's start where they are packed). `kind` is op's, a constant in each of
 * check_op's cases; `figures`, whether a compute op's figures are checked too (a constant:
 * count_pass leaves them to the costing pass, check_figures). */
static inline gboolean check_kind(const ZpOp *op, uint8_t kind, const OpLimits *l, uint32_t i,
                                  uint64_t dep_end, gboolean figures, GError **error)
{
    static const uint8_t sub_limit[] = {
        [ZP_OP_COMPUTE] = ZP_COMP_N, [ZP_OP_COLLECTIVE] = ZP_COLL_N,
        [ZP_OP_ALLOC] = ZP_MEM_N, [ZP_OP_FREE] = ZP_MEM_N, [ZP_OP_P2P] = ZP_P2P_N,
        [ZP_OP_TRANSFER] = ZP_XFER_N};
    if (op->stage >= l->stages || (kind == ZP_OP_P2P && op->peer >= l->stages))
        return fail_op(error, i, "stage or peer beyond the schedule's pipeline stages");
    if (op->sub >= sub_limit[kind])
        return fail_op(error, i, "unknown compute, collective, p2p, transfer or memory category");
    if (kind_on_stream(kind) && op->stream >= ZP_STREAM_N)
        return fail_op(error, i, "unknown stream");
    if (kind == ZP_OP_COLLECTIVE && op->group >= l->n_groups)
        return fail_op(error, i, "unknown group");
    if (!finite_not_negative(op->bytes))
        return fail_op(error, i, FIGURES_FAULT);
    if (kind == ZP_OP_COMPUTE && figures && !check_figures(op, l, i, error))
        return FALSE;
    if (dep_end > l->n_deps_total)
        return fail_op(error, i, "dependencies run past the dependency list");
    return TRUE; /* each dependency's range: count_dependents, in the same pass */
}

/* The streams on which each group runs collectives: bit `stream` of pairs[group], noted by
 * count_pass (check_op). A group and stream alone among those of every group on its group's
 * link (links_alone) share that link with no other flow at a rank that runs a stage alone
 * (Flow.alone_on_link). Over all stages, and a collective without a transfer (which loads no
 * link) noted too: either can only keep a pair from being alone. By stage (a row for each of
 * 128, stages 128 apart sharing one), count_pass's were 0.35 M more of Megatron 1T's
 * instructions; noted in the costing pass, where a collective's memo missed or for every
 * collective, that pass's registers spilled, 0.9-1.5 M more. */
typedef uint8_t LinkPairs[ZP_SCHED_MAX_GROUPS];

/* check_kind for each kind, its tests by kind known in each case: where they asked the kind
 * again, 1.08 M more of Megatron 1T's instructions, 2.20 M of narayanan21-t1-529.6b's. */
static inline gboolean check_op(const ZpOp *op, const OpLimits *l, uint32_t i, uint64_t dep_end,
                                gboolean figures, LinkPairs pairs, GError **error)
{
    switch (op->kind) {
    case ZP_OP_COMPUTE:
        return check_kind(op, ZP_OP_COMPUTE, l, i, dep_end, figures, error);
    case ZP_OP_COLLECTIVE:
        if (!check_kind(op, ZP_OP_COLLECTIVE, l, i, dep_end, figures, error))
            return FALSE;
        /* Its stage, group and stream in range; noted where its kind is known already */
        pairs[op->group] |= (uint8_t)(1u << op->stream);
        return TRUE;
    case ZP_OP_ALLOC:
        return check_kind(op, ZP_OP_ALLOC, l, i, dep_end, figures, error);
    case ZP_OP_FREE:
        return check_kind(op, ZP_OP_FREE, l, i, dep_end, figures, error);
    case ZP_OP_P2P:
        return check_kind(op, ZP_OP_P2P, l, i, dep_end, figures, error);
    case ZP_OP_TRANSFER:
        return check_kind(op, ZP_OP_TRANSFER, l, i, dep_end, figures, error);
    default:
        return fail_op(error, i, "unknown kind");
    }
}

/* DepCursor.ready of an op whose dependents are not split (count_ready). */
#define SPLIT_REFUSED UINT32_MAX

/* An op's dependents while sim_ops_build places them, 8 bytes an op apart from the SimOps (the
 * scattered increments stay in cache: a 32,000-layer model's 2.1 million ops spent a sixth of
 * sim_ops_build on them inside 64-byte SimOps). Counted first: `rest` all of them, `ready`
 * the allocs and frees ready the moment the op ends (count_ready), or SPLIT_REFUSED; then
 * each part's cursor, where its next dependent goes (the ready ones first). */
typedef struct {
    uint32_t rest, ready;
} DepCursor;

/* Moves the allocs and frees ready at once to the front of an op's dependents, each part in
 * its order, where that changes no order the run can see: where all the op's dependents that
 * release an alloc or free are of that kind. Releasing the op then queues the same allocs and
 * frees in the same order (as a block, before it counts down the rest), and the rest start
 * in their order as before: queueing one touches nothing that counting down or starting an
 * op reads, nor the other way round. An alloc or free is ready at once where it has one
 * dependency (it counts nothing down: Dependent.counted) and runs on its stage; any other
 * alloc or free among the dependents refuses the split. Decided as the dependents are counted,
 * so that they are placed split (two cursors an op) and no pass moves them afterwards (a
 * pass over every op's list took 90 M of plan --3d gpt-1t/4096's 4.3 G instructions). */
static inline void count_ready(DepCursor *c, gboolean ready)
{
    if (!ready)
        c->ready = SPLIT_REFUSED;
    else if (c->ready != SPLIT_REFUSED)
        c->ready++;
}

/* Counts op i, which is `op` (of zops), as a dependent of each op it depends on, which must
 * exist: check_op's last check, in the same pass. `zeroed` and `*ahead` say whether the
 * cursors past i are zeroed already: the ops before it zero their own as they come, and the
 * first dependency on a later op (a pipeline's, or a schedule file's graph) zeroes all that
 * follow, once; with `zeroed` (a constant) the caller knows it has. `cursor[i]` is zeroed by
 * the caller. */
static inline gboolean count_dependents(uint32_t n_ops, const ZpOp *zops,
                                        const uint32_t *all_deps, const ZpOp *op, uint32_t i,
                                        DepCursor *cursor, gboolean zeroed, gboolean *ahead,
                                        GError **error)
{
    const uint32_t n_deps = op->n_deps, first = op->dep_start;
    const gboolean alloc_or_free = !kind_on_stream(op->kind);
    for (uint32_t d = 0; d < n_deps; d++) { /* no pointer into an empty list's NULL */
        const uint32_t t = all_deps[first + d];
        if (t >= n_ops)
            return fail_op(error, i, "depends on an op that does not exist");
        if (!zeroed && G_UNLIKELY(t > i) && !*ahead) {
            memset(&cursor[i + 1], 0, (size_t)(n_ops - i - 1) * sizeof *cursor);
            *ahead = TRUE;
        }
        cursor[t].rest++;
        if (alloc_or_free) { /* ready at once: one dependency, on t's stage (as uint16s) */
            const uint16_t t_stage = (uint16_t)zops[t].stage;
            count_ready(&cursor[t], n_deps == 1 && t_stage == (uint16_t)op->stage);
        }
    }
    return TRUE;
}

/* An op's dependents start at `*offset`, split after its ready ones (count_ready): returns
 * where its ready ones end (SimOp.dependents_ready); its cursors then point where each
 * part's first goes, and *offset past its list (SimOp.dependents_end). */
static inline uint32_t open_dependents(DepCursor *c, uint32_t *offset)
{
    const uint32_t start = *offset, n_ready = c->ready == SPLIT_REFUSED ? 0 : c->ready;
    *offset += c->rest;
    c->rest = start + n_ready;
    if (c->ready != SPLIT_REFUSED)
        c->ready = start;
    return start + n_ready;
}

/* Places op i (its n_deps, stage and stream, whether on_stream) among the dependents of each
 * op it depends on (deps[first ..]): a ready alloc or free among the ready ones, unless its
 * op refused the split. */
static inline void place_dependent(Dependent *list, DepCursor *cursor, const uint32_t *all_deps,
                                   gboolean on_stream, uint32_t n_deps, uint16_t stage,
                                   uint8_t stream, uint32_t i, uint32_t first)
{
    const Dependent dependent = {.op = i, .stage = stage,
                                 .stream = on_stream ? stream : NOT_ON_STREAM,
                                 .counted = on_stream || n_deps > 1};
    if (!dependent.counted) { /* one dependency at most */
        if (n_deps == 1) {
            DepCursor *c = &cursor[all_deps[first]];
            list[c->ready != SPLIT_REFUSED ? c->ready++ : c->rest++] = dependent;
        }
        return;
    }
    /* One 8-byte store a dependency, of the word built in registers: stored field by field,
     * it was 4 stores (13 instructions a dependency, 479,052 of them at
     * narayanan21-t1-529.6b). Dependent's fields lie in the word's bytes 0-3, 4-5, 6 and 7
     * (little-endian, as sim_fold_jump's same_op reads them). */
    G_STATIC_ASSERT(G_BYTE_ORDER == G_LITTLE_ENDIAN && offsetof(Dependent, stage) == 4 &&
                    offsetof(Dependent, stream) == 6 && offsetof(Dependent, counted) == 7);
    const uint64_t word = i | (uint64_t)dependent.stage << 32 |
                          (uint64_t)dependent.stream << 48 | (uint64_t)1 << 56;
    /* By pointer: each dependency's place made from `first + d`, one instruction more a
     * dependency (0.17 M of Megatron 1T's instructions) */
    for (const uint32_t *d = &all_deps[first], *const end = d + n_deps; d < end; d++)
        memcpy(&list[cursor[*d].rest++], &word, sizeof word);
}

/* Each class's streams, linked in op order: SimOp.stream_next the op after it on its class's
 * stream. streams_begin allocates them and returns, for each list, where its next op goes
 * (`tail`: its stream_first, then its last op's stream_next, which the costing pass set to
 * NO_OP); stream_link appends op i, in op order, in build_dependents' pass over the SimOps.
 * There, not in the costing pass, whose two dozen values left the streams' arrays to be
 * loaded again for each op: 0.36 M more of Megatron 1T's instructions, 0.71 M more of
 * narayanan21-t1-529.6b's. The arrays travel in a StreamLinks, a local of that pass: read
 * through the Sim, they were loaded again after each dependent's store (memcpy's, which may
 * alias anything), 0.13 M and 0.31 M more. Each op's place in its stream (Sim.stream_pos),
 * which only a run that did not finish reads, is made then (sim_ops_stream_places). */
/* A list's tail and length side by side, 16 bytes, in rows of STREAM_ROW a class: its place
 * a shift and an or (stage * ZP_STREAM_N + stream in two arrays took four instructions
 * more, 0.3 M of Megatron 1T's). */
#define STREAM_ROW 8
G_STATIC_ASSERT(ZP_STREAM_N <= STREAM_ROW);
typedef struct {
    uint32_t *tail;
    uint32_t len;
} StreamTail;

typedef struct {
    SimOp *ops;
    uint32_t *class_ops;
    StreamTail *lists; /* [stage * STREAM_ROW + stream] */
} StreamLinks;

static StreamLinks streams_begin(Sim *sim)
{
    const uint32_t lists = sim->sim_pp * ZP_STREAM_N;
    StreamTail *tails = g_new(StreamTail, (gsize)sim->sim_pp * STREAM_ROW);
    sim->stream_first = g_new(uint32_t, lists);
    sim->stream_len = g_new0(uint32_t, lists);
    sim->class_ops = g_new0(uint32_t, sim->sim_pp);
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++) {
            const uint32_t l = k * ZP_STREAM_N + stream;
            sim->stream_first[l] = NO_OP;
            tails[k * STREAM_ROW + stream] = (StreamTail){.tail = &sim->stream_first[l]};
        }
    return (StreamLinks){.ops = sim->ops, .class_ops = sim->class_ops, .lists = tails};
}

/* Appends op i, on `stage` and `stream` where `on_stream`, to its stream: through the list's
 * tail, without asking whether it is the first (its stream_first or the last op's
 * stream_next, and a place kept for each op, were 1.1 M of Megatron 1T's instructions).
 * class_ops counts the ops off the streams here, and streams_end adds the streams' lengths:
 * an increment for every op was 4 instructions an op (1.1 M at narayanan21-t1-529.6b), for
 * 27% of them. */
static inline void stream_link(StreamLinks *s, gboolean on_stream, uint16_t stage,
                               uint8_t stream, uint32_t i)
{
    if (!on_stream) {
        s->class_ops[stage]++;
        return;
    }
    StreamTail *t = &s->lists[(uint32_t)stage * STREAM_ROW + stream];
    t->len++;
    *t->tail = i;
    t->tail = &s->ops[i].stream_next;
}

/* The streams' lengths, and each class's ops (stream_link); frees streams_begin's tails. */
static void streams_end(Sim *sim, StreamLinks *s)
{
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++) {
            const uint32_t len = s->lists[k * STREAM_ROW + stream].len;
            sim->stream_len[k * ZP_STREAM_N + stream] = len;
            sim->class_ops[k] += len;
        }
    g_free(s->lists);
}

void sim_ops_stream_places(Sim *sim)
{
    if (sim->stream_pos)
        return;
    uint32_t *len = g_new0(uint32_t, (gsize)sim->sim_pp * ZP_STREAM_N);
    sim->stream_pos = g_new(uint32_t, MAX(sim->n_ops, 1));
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const SimOp *o = &sim->ops[i];
        sim->stream_pos[i] = op_on_stream(o) ? len[o->stage * ZP_STREAM_N + o->stream]++ : 0;
    }
    g_free(len);
}

/* build_dependents' pass: each op's dependencies at dep_start[i], or packed where dep_start
 * is NULL. */
static inline void place_all(Sim *sim, Dependent *list, DepCursor *cursor,
                             const uint32_t *dep_start, StreamLinks *links)
{
    /* Never NULL (an empty GArray's data), so that place_dependent may point into it */
    static const uint32_t no_deps[1];
    const uint32_t *all_deps =
        sim->sched->deps->data ? (const uint32_t *)sim->sched->deps->data : no_deps;
    const uint32_t n_ops = sim->n_ops;
    SimOp *ops = sim->ops;
    uint32_t packed_start = 0;
    for (uint32_t i = 0; i < n_ops; i++) {
        /* Read once, before the stores (stream_link's and the dependents', which may alias
         * the SimOps): read again after them, 5 instructions an op. */
        const uint32_t n_deps = ops[i].n_deps;
        const uint16_t stage = ops[i].stage;
        const uint8_t stream = ops[i].stream;
        const gboolean on_stream = op_on_stream(&ops[i]);
        const uint32_t first = dep_start ? dep_start[i] : packed_start;
        packed_start += n_deps;
        stream_link(links, on_stream, stage, stream, i);
        place_dependent(list, cursor, all_deps, on_stream, n_deps, stage, stream, i, first);
    }
}

/* Each op's dependents, counted in `cursor` by count_pass, placed in
 * op order, each part of its list (count_ready) in its order. Each op's dependencies are
 * found from its SimOp's n_deps and where they start, not from its ZpOp again (a second pass
 * over the ZpOps read 203 MB at 32,000 layers): one after the other, in op order, as the
 * builder and the schedule reader write them (zp_build_emit), where dep_start is NULL, and
 * else at dep_start[i] (ZpOp's, noted by count_pass). Each op's list is open already (the
 * costing pass's open_dependents, after count_pass counted them all): one pass over the
 * SimOps places each op among the lists of those it depends on, and links the streams
 * (streams_begin). Frees cursor, dep_start and the links' tails. */
static void build_dependents(Sim *sim, DepCursor *cursor, uint32_t *dep_start, uint64_t total,
                             StreamLinks links)
{
    Dependent *list = g_new(Dependent, total ? total : 1);
    zp_advise_huge_pages(list, (size_t)(total ? total : 1) * sizeof(Dependent));
    sim->dependents = list;
    /* A loop for each case, dep_start a constant NULL in the builder's (packed): the test
     * in one loop was 0.30 M of Megatron 1T's instructions, 0.68 M of narayanan21-t1-529.6b's. */
    if (dep_start)
        place_all(sim, list, cursor, dep_start, &links);
    else
        place_all(sim, list, cursor, NULL, &links);
    streams_end(sim, &links);
    g_free(cursor);
    g_free(dep_start);
}

/* A pipeline send's time: it goes from the stage's rank to the neighbour's, the stage
 * distance times zp_plan_placed_pp_stride ranks away (mp under tp-pp-dp, mp dp under
 * Megatron-Core's and DeepSpeed's tp-dp-pp), over NVLink when both sit on one node and else over
 * the sender's share of the node's NICs (every GPU of a node sends to its peer at once), at
 * the bus bandwidth NCCL reaches there. */
static double p2p_time_s(const Sim *sim, const ZpHw *hw, const ZpOp *op)
{
    /* the stages' first ranks where the plan's order puts them (ZpRankOrder) */
    const int64_t apart = zp_plan_placed_pp_stride(&sim->sched->plan), gpn = hw->gpus_per_node;
    const gboolean same_node = op->stage * apart / gpn == op->peer * apart / gpn;
    if (same_node)
        return hw->intra_node_latency_s + op->bytes / zp_hw_intra_bus_bytes_per_s(hw);
    return hw->inter_node_latency_s + op->bytes / (zp_hw_inter_bus_bytes_per_s(hw) / gpn);
}

/* Each direction's last send costed (p2p_time_s): a stage's sends of one direction go to one
 * peer with one size (its micro-batches' activations or their gradients), and the time reads
 * only those and the run's constants, so a repeat gets the very double computed again: 34
 * instructions a send and a call, 9,074 sends at Megatron 1T. stage UINT32_MAX: none yet. */
typedef struct {
    uint32_t stage, peer;
    double bytes, duration_s;
} P2pLast;

/* "NAME: " and how group g costs the collective kinds in the mask `kinds` (bit k: ZpCollKind
 * k), after what result->collective_model holds; nothing for a group of one rank, which sends
 * nothing, or one that runs no collective. */
static void describe_group(SimResult *result, const char *name, const SimCollGroup *g,
                           unsigned kinds)
{
    if (g->ranks <= 1 || !kinds)
        return;
    char how[384];
    sim_coll_describe(g, kinds, how, sizeof how);
    char *line = g_strdup_printf("%s%s: %s", result->collective_model[0] ? "; " : "", name, how);
    g_strlcat(result->collective_model, line, sizeof result->collective_model);
    g_free(line);
}

/* The sum a compute op's FLOPs go to: the recomputed ones, its stage's, or none (the
 * optimizer's, which are no model FLOPs). */
static inline uint32_t compute_slot(const SimSums *sums, uint8_t sub, uint16_t stage)
{
    if (sub == ZP_COMP_RECOMPUTE)
        return sim_sums_recompute();
    if (sub == ZP_COMP_OPTIMIZER || sub == ZP_COMP_CPU_OPTIMIZER)
        return SIM_SUM_NONE;
    return sim_sums_stage_flops(sums, stage);
}

/* A compute op's duration by what it depends on: FLOPs (all, GEMM's, fused attention's),
 * memory bytes and host bytes, in ZpOp's order, compared bit for bit. 64 bytes, in rows of
 * MEMO_MODULES: a memo's address a shift, where 56-byte memos in rows of 7 took a multiply
 * and four more instructions. A memo not set holds a key of all ones: its bytes a NaN no op
 * that passed count_pass holds (check_kind: finite). */
#define MEMO_MODULES 8
G_STATIC_ASSERT(ZP_MOD_N + 1 <= MEMO_MODULES);
typedef struct {
    double key[5];
    double duration_s;
    double pad[2];
} ComputeMemo;
G_STATIC_ASSERT(sizeof(ComputeMemo) == 64);
G_STATIC_ASSERT(offsetof(ZpOp, gemm_flops) == offsetof(ZpOp, flops) + sizeof(double) &&
                offsetof(ZpOp, attn_flops) == offsetof(ZpOp, flops) + 2 * sizeof(double) &&
                offsetof(ZpOp, mem_bytes) == offsetof(ZpOp, flops) + 3 * sizeof(double) &&
                offsetof(ZpOp, bytes) == offsetof(ZpOp, flops) + 4 * sizeof(double));

/* A compute op's time (*duration_s): its bytes over the host link (Pa+cpu's host_copy; 0 for
 * other ops) and its kernels' (zp_cost_op_s). A step repeats each block op with the same
 * figures thousands of times (Megatron's 1T: 921,794 ops), so the last duration of each kind
 * and module is kept, by its figures bit for bit: both functions read only their arguments
 * and the run's constant ZpCost, so a repeat gets the very double computed again. Op i's
 * figures are checked where they are not a memo's (check_figures: a memo keeps checked
 * figures only, and none matches before it is set, its key's bytes all ones, a NaN no op
 * that passed count_pass holds). */
static gboolean compute_s(const Sim *sim, const ZpHw *hw, const ZpOp *op,
                          ComputeMemo memo[ZP_COMP_N][MEMO_MODULES], const OpLimits *l,
                          uint32_t i, double *duration_out, GError **error)
{
    /* The key's figures as they lie in the ZpOp (flops, gemm_flops, attn_flops, mem_bytes,
     * bytes), compared in place: copied into an array first, they were 11 instructions of
     * each compute op. */
    const char *key = (const char *)op + offsetof(ZpOp, flops);
    ComputeMemo *m = op->module <= ZP_MOD_N ? &memo[op->sub][op->module] : NULL;
    if (m && memcmp(m->key, key, sizeof m->key) == 0) {
        *duration_out = m->duration_s;
        return TRUE;
    }
    if (!check_figures(op, l, i, error))
        return FALSE;
    const double host_s = op->bytes > 0 && hw->host_link_bytes_per_s > 0
                              ? op->bytes / hw->host_link_bytes_per_s
                              : 0.0;
    const double duration_s =
        host_s + zp_cost_op_s(&sim->cost, op->sub, zp_op_module(op), op->flops,
                              op->gemm_flops, op->attn_flops, op->mem_bytes);
    if (m) {
        m->duration_s = duration_s;
        memcpy(m->key, key, sizeof m->key);
    }
    *duration_out = duration_s;
    return TRUE;
}

/* Sim.link_alone from count_pass's LinkPairs (freed here), group_link each group's link;
 * NULL where ops run in line (streams_in_line moves them after count_pass). */
static void links_alone(Sim *sim, uint8_t *pairs, const uint8_t *group_link, gboolean in_line)
{
    const uint32_t n_groups = sim->n_groups;
    sim->link_alone =
        in_line ? NULL : g_new0(uint8_t, (gsize)MAX(n_groups, 1) * ZP_STREAM_N);
    for (uint32_t g = 0; sim->link_alone && g < n_groups; g++) {
        gboolean alone = __builtin_popcount(pairs[g]) == 1;
        for (uint32_t other = 0; other < n_groups; other++)
            if (other != g && pairs[other] && group_link[other] == group_link[g])
                alone = FALSE;
        if (alone)
            sim->link_alone[g * ZP_STREAM_N + (uint32_t)__builtin_ctz(pairs[g])] = 1;
    }
    g_free(pairs);
}

/* A collective's cost and bytes sent at one size. */
typedef struct {
    double bytes, sent;
    SimCollCost cost;
} CollCosted;

/* The last COLL_RECENT sizes one communicator costed for one collective kind, in a ring:
 * plan --3d gpt-1t/4096 alternates sizes (a fifth of its 942,438 collectives were not the
 * size before, 54 M instructions in sim_coll_cost), which the last one alone misses. */
#define COLL_RECENT 4
typedef struct {
    CollCosted sizes[COLL_RECENT];
    uint32_t n, next;
} CollRecent;

/* The cost and bytes sent of collective `kind` over `bytes` on g: one of its recent sizes,
 * equal bit for bit (sim_coll_cost and sim_coll_bytes_sent read only their arguments, so it
 * is the very double computed again), or computed and kept. */
static CollCosted coll_costed(CollRecent *r, ZpCollKind kind, double bytes,
                              const SimCollGroup *g)
{
    for (uint32_t k = 0; k < r->n; k++)
        if (memcmp(&r->sizes[k].bytes, &bytes, sizeof bytes) == 0)
            return r->sizes[k];
    const CollCosted c = {.bytes = bytes, .sent = sim_coll_bytes_sent(kind, bytes, g->ranks),
                          .cost = sim_coll_cost(kind, bytes, g)};
    r->sizes[r->next] = c;
    r->next = (r->next + 1) % COLL_RECENT;
    r->n = MIN(r->n + 1, COLL_RECENT);
    return c;
}

/* Each communicator's last collective of each kind costed: its size (-1: none yet), time
 * and bytes sent. 32 bytes, in rows of COLL_KINDS: an entry's address a shift, where
 * CollCosted's 40 bytes in rows of ZP_COLL_N took a multiply and four more instructions, made
 * again for each field read (1.3 M of Megatron 1T's instructions). */
#define COLL_KINDS 8
G_STATIC_ASSERT(ZP_COLL_N <= COLL_KINDS);
typedef struct {
    double bytes, start_s, transfer_s, sent;
} CollLast;
G_STATIC_ASSERT(sizeof(CollLast) == 32);

/* The dep_start of each of the n ops, those before op i noted from their ZpOps. */
static uint32_t *noted_dep_starts(const ZpOp *zops, uint32_t i, uint32_t n)
{
    uint32_t *dep_start = g_new(uint32_t, MAX(n, 1));
    zp_advise_huge_pages(dep_start, MAX(n, 1) * sizeof(uint32_t));
    for (uint32_t j = 0; j < i; j++)
        dep_start[j] = zops[j].dep_start;
    return dep_start;
}

/* What count_pass carries from op to op (a local: its fields stay in registers). Each op's
 * ZpOp.dep_start is noted in dep_start only once one is not where the ops before it end,
 * packed_end (4 bytes an op of fresh pages, 3.7 MB at Megatron's 1T, which the builder's
 * never need). */
typedef struct {
    const ZpOp *zops;
    const uint32_t *all_deps;
    DepCursor *cursor;
    uint32_t *dep_start;
    uint32_t packed_end;
    gboolean ahead;
} CountState;

/* Checks op i and counts it as a dependent (count_dependents, `zeroed` as there). */
static inline gboolean count_op(CountState *c, const OpLimits *limits, uint32_t i,
                                gboolean zeroed, LinkPairs pairs, GError **error)
{
    const ZpOp *op = &c->zops[i];
    if (!zeroed)
        c->cursor[i] = (DepCursor){0, 0};
    const uint64_t dep_end = (uint64_t)op->dep_start + op->n_deps;
    if (!check_op(op, limits, i, dep_end, FALSE, pairs, NULL)) {
        /* The fault the whole check finds first (a compute op's figures before its
         * dependencies' range) */
        check_op(op, limits, i, dep_end, TRUE, pairs, error);
        return FALSE;
    }
    if (!count_dependents(limits->n_ops, c->zops, c->all_deps, op, i, c->cursor, zeroed,
                          &c->ahead, error))
        return FALSE;
    /* Packed so far and still (the builder's): one test */
    if (G_UNLIKELY(op->dep_start != c->packed_end || c->dep_start)) {
        if (!c->dep_start)
            c->dep_start = noted_dep_starts(c->zops, i, limits->n_ops);
        c->dep_start[i] = op->dep_start;
    }
    c->packed_end = (uint32_t)dep_end; /* check_op: within the list, a uint32_t */

    return TRUE;
}

G_STATIC_ASSERT(offsetof(SimOp, kind) == offsetof(ZpOp, kind) &&
                offsetof(SimOp, sub) == offsetof(ZpOp, sub) &&
                offsetof(SimOp, stream) == offsetof(ZpOp, stream) &&
                offsetof(SimOp, group) == offsetof(ZpOp, group) && offsetof(SimOp, link) == 4);

/* A backend that runs a rank's ops in line runs them on one stream; a pipeline send stays on
 * its own (it is posted, and the stage goes on). A pass of its own over the first n SimOps,
 * for such a backend only (a profile measured on zreal's cpu backend): in the costing pass
 * the test cost every backend 0.53 M of Megatron 1T's instructions, 1.05 M of
 * narayanan21-t1-529.6b's. */
static void streams_in_line(Sim *sim, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (sim->ops[i].kind != ZP_OP_P2P)
            sim->ops[i].stream = ZP_STREAM_COMPUTE;
}

/* count_pass from op i on, where the cursors past each op are zeroed (count_op's `zeroed`):
 * returns where it stopped, as count_pass. A function of its own: its loop and count_pass's
 * first were merged, each op of this one asking again whether i was within the ops and
 * whether an op depended on a later one, its op's address made again from i (about 10
 * instructions an op). */
static G_GNUC_NO_INLINE uint32_t count_zeroed(CountState *state, const OpLimits *limits,
                                              uint32_t i, LinkPairs pairs_io, GError **error)
{
    CountState c = *state;
    const OpLimits l = *limits; /* on the stack: through the pointer, it was loaded again */
    LinkPairs pairs; /* a local: through the pointer, each store may alias the rest */
    memcpy(pairs, pairs_io, sizeof pairs);
    for (; i < l.n_ops; i++)
        if (!count_op(&c, &l, i, TRUE, pairs, error))
            break;
    *state = c;
    memcpy(pairs_io, pairs, sizeof pairs);
    return i;
}

/* sim_ops_build's first pass over the ops: checks each (a compute op's figures aside:
 * check_figures) and counts it as a dependent of those it depends on (cursor:
 * count_dependents), noting where each op's dependencies start (*dep_start) once they are
 * not packed. Returns how many ops passed, all of them or the
 * index of the op *error names. A pass of its own: folded into the costing pass, their
 * two dozen values lived on the stack, and keeping one more in a register (s->ops' data, a
 * 64-bit sum) cost 1-2.7 M more instructions (spills). A function of its own: inlined in
 * sim_ops_build with count_op's second check_op (a fault's), it spilled more, 0.5 M. */
static G_GNUC_NO_INLINE uint32_t count_pass(const Sim *sim, const OpLimits *limits,
                                            DepCursor *cursor, uint32_t **dep_start_out,
                                            uint8_t **pairs_out, GError **error)
{
    LinkPairs pairs;
    memset(pairs, 0, sizeof pairs);
    CountState c = {.zops = (const ZpOp *)sim->sched->ops->data,
                    .all_deps = (const uint32_t *)sim->sched->deps->data, .cursor = cursor};
    const uint32_t n_ops = limits->n_ops;
    uint32_t i = 0;
    gboolean ok = TRUE;
    /* Until an op depends on a later one, each op zeroes its cursor and asks of each
     * dependency whether it lies ahead; from then on neither: a pipeline's first backward
     * depends on the next stage's send (Megatron 1T's op 705 of 130,674 on op 2,765). */
    for (; i < n_ops && !c.ahead; i++)
        if (!(ok = count_op(&c, limits, i, FALSE, pairs, error)))
            break;
    if (ok && i < n_ops)
        i = count_zeroed(&c, limits, i, pairs, error);
    *dep_start_out = c.dep_start;
    *pairs_out = g_memdup2(pairs, sizeof pairs);
    return i;
}

/* Durations, costs and totals of every op; the result's per-rank sums come from here.
 * count_pass checks the ops and counts their dependents; one pass over those it passed
 * checks the compute ops' figures no memo holds (check_figures), writes each SimOp whole
 * with its countdown, and adds it to the sums; build_dependents then places the dependents
 * and links the streams. */
gboolean sim_ops_build(Sim *sim, const ZpHw *hw, SimResult *result, GError **error)
{
    const ZpSchedule *s = sim->sched;
    if (!zp_cost_init(&sim->cost, hw, &s->model, &s->plan, error))
        return FALSE;
    g_strlcpy(result->cost_model, sim->cost.why, sizeof result->cost_model);
    sim->contention = zp_cost_contention(&sim->cost, 1);
    SimCollGroup groups[ZP_SCHED_MAX_GROUPS];
    /* Each communicator's last collective costed, by kind: a step repeats the same sizes
     * (every tensor-parallel all-reduce is b s h), so most costs are the one before; and its
     * last COLL_RECENT sizes, for those that alternate (CollRecent). */
    CollLast last_cost[ZP_SCHED_MAX_GROUPS][COLL_KINDS];
    uint8_t group_link[ZP_SCHED_MAX_GROUPS]; /* each communicator's SimCollGroup.bottleneck */
    CollRecent *recent = g_new(CollRecent, (gsize)MAX(sim->n_groups, 1) * ZP_COLL_N);
    ComputeMemo memo[ZP_COMP_N][MEMO_MODULES];
    memset(memo, 0xff, sizeof memo); /* no key set (ComputeMemo) */
    P2pLast p2p_last[ZP_P2P_N];
    for (int k = 0; k < ZP_P2P_N; k++)
        p2p_last[k].stage = UINT32_MAX;
    for (uint32_t g = 0; g < sim->n_groups; g++) {
        const ZpCommGroup placed = zp_sched_placed_group(s, &sim->groups[g]);
        groups[g] = sim_coll_group_of(hw, s->world, &placed);
        group_link[g] = (uint8_t)groups[g].bottleneck;
        for (int k = 0; k < ZP_COLL_N; k++) {
            last_cost[g][k].bytes = -1;
            recent[g * ZP_COLL_N + k].n = recent[g * ZP_COLL_N + k].next = 0;
        }
    }
    SimSums sums;
    sim_sums_begin(&sums, sim, result);
    double largest_buffer = 0, states = 0;
    const int ranks_per_node = MIN(hw->gpus_per_node, s->world);
    const gboolean in_line = zp_cost_cpu_backend(hw);
    if (in_line)
        g_strlcpy(result->collective_model, "in line with compute, one op of a rank at a time "
                  "(the profile's op table was measured on zreal's cpu backend)",
                  sizeof result->collective_model);
    const OpLimits limits = {.stages = (uint32_t)MAX(s->stages, 1), .n_groups = sim->n_groups,
                             .n_ops = sim->n_ops, .n_deps_total = s->deps->len,
                             .attention_rated = zp_plan_attention_rated(&s->plan)};
    const gboolean copies = sim->cost.table; /* zp_cost_coll_copy_s's, else 0 */
    const int zero_stage = s->plan.zero.stage;
    const StreamLinks links = streams_begin(sim);
    /* Not cleared: each op zeroes its own as it comes (count_dependents). */
    DepCursor *cursor = g_new(DepCursor, MAX(sim->n_ops, 1));
    zp_advise_huge_pages(cursor, MAX(sim->n_ops, 1) * sizeof *cursor);
    uint32_t *dep_start, n_wide = 0;
    /* The first op at fault, as the one pass that did both found it: a check's fault
     * reported only where no op before it failed its costing. */
    GError *check_error = NULL;
    uint8_t *link_pairs; /* LinkPairs */
    const uint32_t n_checked =
        count_pass(sim, &limits, cursor, &dep_start, &link_pairs, &check_error);
    gboolean ok = TRUE;
    /* Where the next op's dependents start: each op's list is opened here, count_pass having
     * counted them all, where build_dependents' pass opened it (and where an op depended
     * on a later one, as every pipeline schedule's do, a pass of its own opened them all
     * first): 0.23 M fewer of Megatron 1T's instructions, 0.55 M of narayanan21-t1-529.6b's. */
    uint32_t dep_offset = 0;
    /* Each op's countdown, and the seed's roots, written here as its SimOp is (a pass of its
     * own over the SimOps in sim_ranks_alloc_state, which listed the roots, was 2.2 M of
     * Megatron 1T's instructions): COUNTS_DONE without
     * dependencies, COUNTS_WIDE for a wide op (over 255), COUNTS_UNUSED otherwise, one above
     * and one below it, chosen without a branch. Taken with the SimOps, a fifth of their
     * size; sim_ranks_alloc_state counts it in the run's state. */
    G_STATIC_ASSERT(COUNTS_DONE == COUNTS_UNUSED + 1 && COUNTS_WIDE == COUNTS_UNUSED - 1);
    G_STATIC_ASSERT(G_BYTE_ORDER == G_LITTLE_ENDIAN && offsetof(Countdown, row) == 0 &&
                    offsetof(Countdown, zeroed) == 4);
    Countdown *const countdown = sim->countdown = g_new(Countdown, MAX(sim->n_ops, 1));
    zp_advise_huge_pages(countdown, MAX(sim->n_ops, 1) * sizeof *countdown);
    GArray *const roots = sim->roots = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    /* In locals: the Sim's and the sums' fields, read through pointers the stores below may
     * alias, were loaded again for each op (the sums' kept arrays, the ZpOps' and the
     * SimOps' data: 7 instructions an op). */
    const ZpOp *const zops = (const ZpOp *)s->ops->data;
    SimOp *const sim_ops = sim->ops;
    const SimSums kept = sums;
    for (uint32_t i = 0; ok && i < n_checked; i++) {
        const ZpOp *op = &zops[i];
        const uint8_t kind = op->kind, sub = op->sub;
        const uint32_t n_deps = op->n_deps;
        double figure = op->bytes, transfer_s = 0; /* SimOp's union, and a collective's */
        uint8_t link = 0;
        uint32_t sum_slot = SIM_SUM_NONE; /* the per-rank sum it adds sum_x to */
        double sum_x = 0;
        /* Collectives, the most common kind (Megatron 1T: 55,896 of 130,674 ops), tested
         * first: the switch tested three kinds before them. */
        if (kind == ZP_OP_COLLECTIVE) {
            const uint8_t group = op->group;
            const SimCollGroup *g = &groups[group];
            CollLast *last = &last_cost[group][sub];
            if (last->bytes != op->bytes) {
                const CollCosted c =
                    coll_costed(&recent[group * ZP_COLL_N + sub], sub, op->bytes, g);
                *last = (CollLast){.bytes = c.bytes, .start_s = c.cost.latency_s + 0.0,
                                   .transfer_s = c.cost.transfer_s, .sent = c.sent};
            }
            /* Its figures read at once: through `last`, each read made its address again. */
            const double sent = last->sent;
            transfer_s = last->transfer_s;
            figure = last->start_s;
            /* With an op table (the measured backend's), the rank's own copies around the
             * collective, which it pays even alone (zp_cost_coll_copy_bytes); they read the
             * op's micro-batch and buffer, so not kept with its size. start_s is latency_s +
             * 0.0 (kept so: added for each op, it was 2 instructions of each collective),
             * which differs from latency_s at -0.0 only, where adding the copies' seconds
             * (+0.0 or more) gives the same sum. */
            if (copies)
                figure += zp_cost_coll_copy_s(&sim->cost, op, zero_stage, g->ranks);
            link = group_link[group];
            sum_slot = sim_sums_comm(&kept, (uint16_t)op->stage, group), sum_x = sent;
        } else switch (kind) {
        case ZP_OP_TRANSFER:
            /* The host link is each GPU's own; the node's NVMe is shared by its ranks, which
             * move their slices at the same time (the schedule is the same on every rank). */
            figure = op->bytes / zp_offload_link_bytes_per_s(hw, sub, ranks_per_node);
            sum_slot = sim_sums_offload(sub), sum_x = op->bytes;
            break;
        case ZP_OP_COMPUTE: {
            /* Out of `figure`, whose address taken kept it on the stack for every op */
            double duration_s = 0;
            if (sub != ZP_COMP_CPU_OPTIMIZER) {
                ok = compute_s(sim, hw, op, memo, &limits, i, &duration_s, error);
            } else {
                /* A local of its own: with duration_s's address passed here too, each
                 * compute op stored duration_s on the stack (0.15 M of Megatron 1T's). */
                double cpu_s = 0;
                ok = check_figures(op, &limits, i, error) &&
                     zp_offload_cpu_time_s(hw, op->mem_bytes, ranks_per_node, &cpu_s, error);
                duration_s = cpu_s;
            }
            figure = duration_s;
            sum_slot = compute_slot(&kept, sub, (uint16_t)op->stage), sum_x = op->flops;
            break;
        }
        case ZP_OP_P2P: {
            P2pLast *m = &p2p_last[sub];
            if (m->stage != op->stage || m->peer != op->peer ||
                memcmp(&m->bytes, &op->bytes, sizeof m->bytes) != 0)
                *m = (P2pLast){.stage = op->stage, .peer = op->peer, .bytes = op->bytes,
                               .duration_s = p2p_time_s(sim, hw, op)};
            figure = m->duration_s;
            sum_slot = sim_sums_comm(&kept, (uint16_t)op->stage, ZP_GROUP_PP), sum_x = op->bytes;
            break;
        }
        default:
            largest_buffer = MAX(largest_buffer, op->bytes);
            /* An alloc or free without dependencies: one of the seed's roots, in op order
             * (Sim.roots) */
            if (G_UNLIKELY(n_deps == 0)) {
                const uint32_t root = i;
                g_array_append_val(roots, root);
            }
            break;
        }
        if (!ok)
            break;
        sim_sums_put(&kept, i, sum_slot, sum_x);
        const uint32_t wide = n_deps > UINT8_MAX;
        const uint32_t ready = open_dependents(&cursor[i], &dep_offset);
        /* Field by field: a SimOp built whole on the stack was copied, 27 instructions an
         * op; built as three words in registers, the shifts were 5 more. Its first four bytes
         * are the ZpOp's (kind, sub, stream, group). Its stage read from the ZpOp where it
         * is used, here and for the sums: a local read at the top was stored on the stack and
         * loaded back, each op (0.29 M of Megatron 1T's instructions). */
        SimOp *o = &sim_ops[i];
        memcpy(o, op, offsetof(SimOp, link));
        o->link = link, o->wide = (uint8_t)wide, o->stage = (uint16_t)op->stage, o->n_deps = n_deps;
        o->dependents_end = dep_offset, o->dependents_ready = ready, o->stream_next = NO_OP;
        o->duration_s = figure, o->transfer_s = transfer_s;
        n_wide += wide;
        /* Its row, and 0 after it (Countdown.zeroed), as one word: as a struct, a branch
         * and three instructions more. */
        const uint64_t countdown_word = COUNTS_UNUSED + (uint32_t)(n_deps == 0) - wide;
        memcpy(&countdown[i], &countdown_word, sizeof countdown_word);
    }
    sim->n_wide_rows += n_wide;
    if (in_line)
        streams_in_line(sim, n_checked);
    g_free(recent);
    links_alone(sim, link_pairs, group_link, in_line);
    sim_sums_end(&sums, sim, result);
    if (ok && check_error) {
        g_propagate_error(error, check_error);
        ok = FALSE;
    } else {
        g_clear_error(&check_error);
    }
    if (!ok) {
        g_free(cursor);
        g_free(dep_start);
        g_free(links.lists);
        return FALSE;
    }
    G_STATIC_ASSERT(ZP_SCHED_MAX_GROUPS <= 32); /* Sim.collective_groups */
    sim->collective_groups = 0;
    for (uint32_t g = 0; g < sim->n_groups; g++) {
        unsigned kinds = 0; /* the kinds costed on it: those whose last size was set */
        for (int k = 0; k < ZP_COLL_N; k++)
            kinds |= (unsigned)(last_cost[g][k].bytes >= 0) << k;
        describe_group(result, sim->groups[g].name, &groups[g], kinds);
        sim->collective_groups |= (uint32_t)(kinds != 0) << g;
    }
    for (uint32_t k = 0; k < sim->sim_pp; k++) {
        double stage_states = 0;
        for (int c = 0; c < ZP_MEM_N; c++)
            stage_states += sim->class_state[k * ZP_MEM_N + c];
        states = MAX(states, stage_states);
    }
    /* Live bytes are sums of doubles (8-bit Adam makes them fractional), so "negative" and
     * "back to the start" allow rounding relative to the largest amounts involved. */
    sim->mem_tolerance_bytes = 1e-9 * (states + largest_buffer) + 1.0;
    build_dependents(sim, cursor, dep_start, s->deps->len, links);
    return TRUE;
}
