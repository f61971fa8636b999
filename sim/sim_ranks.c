/* sim_ranks: the simulated ranks (the world's, one a stage, rank classes, or blocks of ranks in
 * lockstep) and their state, their groups' flow slots, and stragglers' slowdowns. */
#include "sim_engine.h"
#include "sim_engine_internal.h"
#include "zp_budget.h"

#include <string.h>

/* ---- blocks of explicit ranks ----
 *
 * Explicit ranks are numbered tp fastest, then pipeline stage: rank (d, j) = d x row + j,
 * with row = pp x mp ranks, sits in dp row d at model-parallel index j = stage x mp + tp
 * index. A communicator is of a row (tp's, and the pipeline's: each group inside one row, so
 * a stage's sends reach a neighbour in its own row) or across rows (dp's, hpZ's: a stride
 * that is a multiple of row, so each group holds one model-parallel index). A block
 * is a maximal run of consecutive rows that agree rank by rank: the same stage and slowdowns,
 * and the same group of every communicator across rows (sim_class_blocks). Its ranks of one
 * model-parallel index, (d, j) for d in block D, are one unit (D, j), stepped once; a row
 * communicator's groups inside D are one flow, standing for |D| (Flow.copies); a group across
 * rows is its own flow, whose members are the units of its ranks, one a block. Units are
 * numbered block by block as ranks are row by row, so a unit's pipeline neighbour is
 * (stage difference) x mp units away, as a rank's is. With one row rank (mp 1, no pipeline),
 * blocks are the runs of consecutive ranks that share every group. This is exact — the same
 * result for every rank, the same event counts, the same timeline and op_last_rank as
 * stepping each rank on its own (SimOptions.each_rank) — because stepping rank by rank does
 * exactly what the units do, expanded:
 * - Its queue is the units' with each unit event ((D, j), op) and row flow event D stand
 *   for their |D| copies, one per row d of D, ordered in *strips*: what one handling (a unit
 *   event, a member's completion in a flow's end, a drain, a block in seed) queued at one
 *   time, (D, [x1 .. xk]), stands for x1@d .. xk@d for each d of D in turn. Taking a strip
 *   rank by rank then runs, row by row, what the units run once, in the same order within a
 *   row: each rank's own state (its clock, account(), busy sums, memory, the dependencies
 *   its pipeline neighbour's sends count down, all in its row) sees the same operations in
 *   the same order; a row flow of row d sees its own row's arrivals, so the same index
 *   arrives last, and what it queues forms strips again (induction). A flow across rows, one
 *   to one with its unit flow, counts D's ranks in one by one and starts at the last,
 *   (max D, j): the unit's last rank (arriving_rank); its end, queued there, is the single
 *   event of its own strip. Its end completes its members in rank order: the blocks in
 *   order, each a strip of its own. What runs between a unit's ranks rank by rank (other
 *   rows of the block) only counts arrivals at groups across rows, which nothing reads
 *   before the last.
 * - This holds unless one handling queues a flow across rows and a unit or row event at the
 *   same time: rank by rank that flow's end then lies inside the strip, after the rows before
 *   max D ran the events after it. The units detect it when they take two such events one
 *   after the other with one time and one instant of queueing (check_order, coarser than a
 *   handling), and the whole run is then stepped again rank by rank: exact, never guessed.
 * - Bandwidth sharing: flows of a row and flows across rows must load different link
 *   classes (blocks_exact). Then resharing, at a flow's start or end, touches only flows of
 *   its own kind: a row flow's copies reshare copies, one to one, and a flow across rows is
 *   reshared once either way; which flows are reshared, and when, is the units' expanded.
 *   Pipeline sends share no link (p2p_time_s).
 * - Contention (an op table's factor, kernel rates' interference) is settled at the end of
 *   each instant (sim_engine.c, settle_contention), rank by rank in rank order, which the
 *   units in their order expand to; within an instant it reads nothing, so the order of the
 *   instant's events, which differs between rows (a flow across rows starts at the last),
 *   changes nothing.
 * - Not where a communicator is neither of a row nor across rows: every rank then steps on
 *   its own. */

/* The unit that steps reported rank `rank`, and the row of its block the rank is in (*k). */
static uint32_t unit_of(const Sim *sim, uint32_t rank, uint32_t *k)
{
    *k = 0;
    if (!sim->weight)
        return rank;
    const uint32_t row = row_ranks(sim);
    for (uint32_t u = 0; u < sim->ranks; u++)
        if (rank >= sim->first_rank[u] && (rank - sim->first_rank[u]) % row == 0 &&
            (rank - sim->first_rank[u]) / row < sim->weight[u]) {
            *k = (rank - sim->first_rank[u]) / row;
            return u;
        }
    g_assert_not_reached(); /* blocks tile the world */
}

/* Some ranks' timeline (SimOptions.timeline_ranks): the ranks asked for, ascending, and a row
 * for each unit that steps one of them. Returns the rows. */
static uint32_t plan_timeline_rows(Sim *sim, const SimOptions *o)
{
    const uint32_t reported = ranks_reported(sim);
    sim->timeline_ranks = g_new(uint32_t, MAX(o->n_timeline_ranks, 1));
    for (uint32_t k = 0; k < o->n_timeline_ranks; k++)
        if (o->timeline_ranks[k] < reported)
            sim->timeline_ranks[sim->n_timeline_ranks++] = o->timeline_ranks[k];
    /* Ascending, each once (a handful: insertion). */
    uint32_t n = 0;
    for (uint32_t k = 0; k < sim->n_timeline_ranks; k++) {
        const uint32_t v = sim->timeline_ranks[k];
        uint32_t at = n;
        while (at > 0 && sim->timeline_ranks[at - 1] > v)
            at--;
        if (at > 0 && sim->timeline_ranks[at - 1] == v)
            continue;
        memmove(&sim->timeline_ranks[at + 1], &sim->timeline_ranks[at],
                (n - at) * sizeof *sim->timeline_ranks);
        sim->timeline_ranks[at] = v;
        n++;
    }
    sim->n_timeline_ranks = n;
    sim->timeline_row = g_new(uint32_t, MAX(sim->ranks, 1));
    for (uint32_t u = 0; u < sim->ranks; u++)
        sim->timeline_row[u] = NO_ROW;
    uint32_t rows = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t block_row;
        const uint32_t u = unit_of(sim, sim->timeline_ranks[k], &block_row);
        if (sim->timeline_row[u] == NO_ROW)
            sim->timeline_row[u] = rows++;
    }
    return rows;
}

/* The reported rank's timeline, whichever unit's it turns out to be
 * (SimOptions.timeline_report_rank): a unit runs, and writes the cells of, its own stage's
 * ops only (stage_of), so the k-th unit of each stage takes row k, shared with the others'
 * k-th. Returns the rows, the most units of one stage; 0 (no rows planned) past
 * SIM_REPORT_ROWS_MAX. */
static uint32_t plan_shared_rows(Sim *sim)
{
    uint32_t rows = 0;
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        rows = MAX(rows, sim->stage_ranks[k]);
    if (rows == 0 || rows > SIM_REPORT_ROWS_MAX)
        return 0;
    uint32_t *taken = g_new0(uint32_t, sim->sim_pp);
    sim->timeline_row = g_new(uint32_t, MAX(sim->ranks, 1));
    for (uint32_t u = 0; u < sim->ranks; u++)
        sim->timeline_row[u] = taken[sim->stage_of[u]]++;
    g_free(taken);
    sim->timeline_shared = TRUE;
    return rows;
}

gboolean sim_ranks_alloc_state(Sim *sim, const SimOptions *options, GError **error)
{
    const uint32_t shared = options->timeline_report_rank && !options->record_timeline
                                ? plan_shared_rows(sim)
                                : 0;
    const gboolean timeline = options->record_timeline || options->timeline_ranks || shared;
    /* The timeline has a row per rank reported (blocks fill their unit's,
     * sim_ranks_expand_blocks the rest), or one per unit stepping a rank asked for, or rows
     * shared by the stages' units. */
    const gboolean some = !shared && !options->record_timeline && options->timeline_ranks &&
                          ranks_reported(sim) > options->timeline_every_rank_upto;
    const size_t per_op = (size_t)(shared ? shared
                                   : some ? plan_timeline_rows(sim, options)
                                          : ranks_reported(sim)) *
                          sim->n_ops;
    /* Said before it is taken: g_try_new succeeds past the machine's memory where the kernel
     * overcommits, and the pages fault in later, or the OOM killer ends the process. */
    const double per_rank = sizeof(StreamState) + SIM_LINK_N * sizeof(uint16_t) +
                            sizeof(RankState) + sizeof(RankBusy) + sizeof(uint32_t) +
                            2 * SIM_OP_TYPES * sizeof(double) +
                            ZP_STREAM_N * sizeof(RunningCompute) + sizeof(uint32_t) +
                            (double)sim->n_wide_rows * sizeof(uint32_t);
    const double bytes = (double)sim->n_ops * sizeof(Countdown) + (double)sim->ranks * per_rank +
                         (timeline ? (double)per_op * (3 * sizeof(double) + sizeof(uint32_t)) : 0);
    char *what = g_strdup_printf("simulating %u ranks x %u ops%s", ranks_reported(sim),
                                 sim->n_ops,
                                 timeline ? (some ? " with some ranks' timeline"
                                                  : " with a timeline")
                                          : "");
    const gboolean fits = zp_budget_check(what, (double)ranks_reported(sim) * sim->n_ops,
                                          "rank-ops", 0, NULL, bytes, error);
    g_free(what);
    if (!fits)
        return FALSE;
    /* sim->countdown: taken and written by sim_ops_build (its costing pass), counted here */
    sim->pending_wide = g_try_new(uint32_t, MAX((size_t)sim->n_wide_rows * sim->ranks, 1));
    sim->stream = g_try_new0(StreamState, sim->ranks);
    sim->link_load = g_try_new0(uint16_t, (size_t)sim->ranks * SIM_LINK_N);
    sim->rank = g_try_new0(RankState, sim->ranks);
    if (sim->contention > 1) {
        sim->running = g_try_new0(RunningCompute, (size_t)sim->ranks * ZP_STREAM_N);
        sim->unsettled = g_try_new(uint32_t, sim->ranks);
        for (size_t r = 0; sim->running && r < (size_t)sim->ranks * ZP_STREAM_N; r++)
            sim->running[r].end_s = -1;
    }
    sim->busy = g_try_new0(RankBusy, sim->ranks);
    sim->op_type_sums = g_try_new0(double, (size_t)sim->ranks * 2 * SIM_OP_TYPES);
    sim->mem_pos = g_try_new0(uint32_t, sim->ranks);
    gboolean ok = sim->countdown && sim->pending_wide && sim->stream && sim->link_load &&
                  sim->rank && ((sim->running && sim->unsettled) || sim->contention == 1) &&
                  sim->busy && sim->op_type_sums &&
                  sim->mem_pos && sim_memory_alloc_logs(sim);
    if (ok && timeline) {
        sim->op_start_s = g_try_new0(double, per_op ? per_op : 1);
        sim->op_end_s = g_try_new0(double, per_op ? per_op : 1);
        sim->op_ready_s = g_try_new0(double, per_op ? per_op : 1);
        sim->op_last_rank = g_try_new0(uint32_t, per_op ? per_op : 1);
        ok = sim->op_start_s && sim->op_end_s && sim->op_ready_s && sim->op_last_rank;
    }
    if (!ok) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "simulating %u ranks x %u ops%s does not fit in memory; fold the ranks",
                    ranks_reported(sim), sim->n_ops,
                    timeline ? (some ? " with some ranks' timeline" : " with a timeline") : "");
        return FALSE;
    }
    sim->state_bytes += (size_t)sim->ranks * sim->n_wide_rows * sizeof *sim->pending_wide +
                       (size_t)sim->n_ops * sizeof *sim->countdown +
                       per_op * (timeline ? 3 * sizeof(double) + sizeof(uint32_t) : 0) +
                       (size_t)sim->ranks * (sizeof *sim->stream +
                                             SIM_LINK_N * sizeof *sim->link_load +
                                             sizeof *sim->rank + sizeof *sim->busy +
                                             2 * SIM_OP_TYPES * sizeof *sim->op_type_sums +
                                             (sim->running ? ZP_STREAM_N * sizeof *sim->running +
                                                                 sizeof *sim->unsettled
                                                           : 0) +
                                             sizeof *sim->mem_pos);
    uint32_t wide_rows = 0; /* the wide ops' rows, in op order (few: a pass where there are) */
    for (uint32_t i = 0; sim->n_wide_rows > 0 && i < sim->n_ops; i++) {
        const SimOp *o = &sim->ops[i];
        if (!o->wide)
            continue;
        const size_t row = (size_t)wide_rows * sim->ranks;
        sim->countdown[i].wide_row = wide_rows++;
        for (uint32_t r = 0; r < sim->ranks; r++)
            sim->pending_wide[row + r] = o->n_deps;
    }
    for (uint32_t r = 0; r < sim->ranks; r++)
        for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++)
            sim->stream[r].next[stream] =
                sim->stream_first[rank_class(sim, r) * ZP_STREAM_N + stream];
    return TRUE;
}

/* ---- simulated ranks and their groups ---- */

gboolean sim_ranks_read_slowdowns(const SimOptions *o, const ZpPlan *plan, uint32_t world,
                                  uint32_t gpus_per_node, Slowdowns *w, GError **error)
{
    const uint32_t nodes = (world + gpus_per_node - 1) / gpus_per_node;
    for (uint32_t k = 0; k < o->n_slow_ranks + o->n_slow_nodes; k++) {
        const gboolean is_rank = k < o->n_slow_ranks;
        const SimSlow *s = is_rank ? &o->slow_ranks[k] : &o->slow_nodes[k - o->n_slow_ranks];
        if (s->index >= (is_rank ? world : nodes) || !(s->factor >= 1 && s->factor <= 1e6)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "slow %s %u x %g: the index must be below %u and the factor in 1..1e6",
                        is_rank ? "rank" : "node", s->index, s->factor,
                        is_rank ? world : nodes);
            return FALSE;
        }
    }
    *w = (Slowdowns){.rank = g_new(double, world), .node = g_new(double, nodes),
                     .gpus_per_node = gpus_per_node, .plan = plan};
    for (uint32_t r = 0; r < world; r++)
        w->rank[r] = 1.0;
    for (uint32_t n = 0; n < nodes; n++)
        w->node[n] = 1.0;
    for (uint32_t k = 0; k < o->n_slow_ranks; k++) { /* a world rank: zplan's number for it */
        const uint32_t r = (uint32_t)zp_plan_rank_of_placed(plan, o->slow_ranks[k].index);
        w->rank[r] = MAX(w->rank[r], o->slow_ranks[k].factor);
    }
    for (uint32_t k = 0; k < o->n_slow_nodes; k++)
        w->node[o->slow_nodes[k].index] =
            MAX(w->node[o->slow_nodes[k].index], o->slow_nodes[k].factor);
    return TRUE;
}

/* The communicators whose groups a rank waits on: those its collectives run over, as
 * sim_ops_build found them (Sim.collective_groups: three passes over the ops here were 1.4 M
 * of narayanan21-t1-529.6b's instructions), and the pipeline's (a stage's sends) with more
 * than one stage. */
static void groups_used(const Sim *sim, gboolean used[ZP_SCHED_MAX_GROUPS])
{
    for (uint32_t g = 0; g < ZP_SCHED_MAX_GROUPS; g++)
        used[g] = (sim->collective_groups >> g & 1) != 0;
}

static void alloc_units(Sim *sim)
{
    sim->stage_of = g_new(uint16_t, MAX(sim->ranks, 1));
    sim->first_rank = g_new(uint32_t, MAX(sim->ranks, 1));
    sim->rank_count = g_new(uint32_t, MAX(sim->ranks, 1));
}

/* Each world rank's colour: its stage and its slowdowns (1 where none is set), as words. */
static uint32_t rank_colours(const Sim *sim, const Slowdowns *w, uint32_t *colour)
{
    const uint32_t world = (uint32_t)sim->sched->world, mp = (uint32_t)sim->sched->plan.mp;
    const double none = 1.0;
    SimInterner kinds;
    sim_interner_init(&kinds);
    for (uint32_t r = 0; r < world; r++) {
        uint32_t key[5] = {(r / mp) % sim->sim_pp};
        memcpy(&key[1], w->rank ? &w->rank[r] : &none, sizeof(double));
        const double node = w->node ? slowdown_node(w, r) : none;
        memcpy(&key[3], &node, sizeof(double));
        colour[r] = sim_interner_id(&kinds, key, 5);
    }
    const uint32_t n = sim_interner_count(&kinds);
    sim_interner_clear(&kinds);
    return n;
}

/* The groups ranks wait on: the collectives' and, between stages, the pipeline's (schedule
 * files, whose communicators may be anything, hold no pipeline). */
static uint32_t wait_groups(const Sim *sim, ZpCommGroup waits[ZP_SCHED_MAX_GROUPS])
{
    gboolean used[ZP_SCHED_MAX_GROUPS];
    groups_used(sim, used);
    uint32_t n_waits = 0;
    for (uint32_t g = 0; g < sim->n_groups; g++)
        if (used[g] || (g == ZP_GROUP_PP && sim->sim_pp > 1))
            waits[n_waits++] = sim->groups[g];
    return n_waits;
}

/* Marks each communicator of a row (Sim.per_row), and puts those across rows that
 * collectives use into across; FALSE where blocks would not be exact (above): a used
 * communicator neither of a row nor across rows, or a link class loaded by collectives of
 * both kinds. */
static gboolean blocks_exact(Sim *sim, ZpCommGroup across[ZP_SCHED_MAX_GROUPS],
                             uint32_t *n_across)
{
    gboolean used[ZP_SCHED_MAX_GROUPS], fits = TRUE;
    groups_used(sim, used);
    *n_across = 0;
    for (uint32_t g = 0; g < sim->n_groups; g++) {
        const ZpCommGroup *group = &sim->groups[g];
        sim->per_row[g] = row_ranks(sim) % zp_group_span(group) == 0;
        if (used[g] && !sim->per_row[g]) {
            /* every member in a row of its own, the same place in each */
            fits = fits && group->stride % row_ranks(sim) == 0 &&
                   zp_group_run_stride(group) % row_ranks(sim) == 0;
            across[(*n_across)++] = *group;
        }
    }
    unsigned loaded[2] = {0, 0}; /* link classes loaded: [per_row] bit link */
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const SimOp *o = &sim->ops[i];
        if (o->kind == ZP_OP_COLLECTIVE && o->transfer_s > 0)
            loaded[sim->per_row[o->group]] |= 1u << o->link;
    }
    return fits && (loaded[0] & loaded[1]) == 0;
}

/* The simulated ranks: every world rank (explicit), one a stage (folded), the rank classes
 * (folded with stragglers: what sets ranks apart is their stage and slowdowns, and through
 * the groups whom they wait for), or with `blocks`, explicit, the units of blocks of ranks in
 * lockstep (above), where they are exact. classes is filled in the last two cases only. */
void sim_ranks_build_units(Sim *sim, const Slowdowns *w, gboolean blocks, SimClasses *classes)
{
    const uint32_t world = (uint32_t)sim->sched->world, mp = (uint32_t)sim->sched->plan.mp;
    const gboolean fold = w->rank && sim->ranks < world;
    ZpCommGroup across[ZP_SCHED_MAX_GROUPS];
    uint32_t n_across = 0;
    blocks = blocks && blocks_exact(sim, across, &n_across);
    if (fold || blocks) {
        uint32_t *colour = g_new(uint32_t, world);
        const uint32_t n_colours = rank_colours(sim, w, colour);
        ZpCommGroup waits[ZP_SCHED_MAX_GROUPS];
        const uint32_t n_waits = wait_groups(sim, waits);
        if (fold)
            sim_class_refine(classes, world, colour, n_colours, waits, n_waits);
        else
            sim_class_blocks(classes, world, row_ranks(sim), colour, across, n_across);
        g_free(colour);
        if (!fold && classes->n == world) /* units of one rank: every rank on its own */
            sim_class_clear(classes);
        sim->ranks = classes->of_rank ? classes->n : sim->ranks;
    }
    alloc_units(sim);
    sim->stage_ranks = g_new0(uint32_t, sim->sim_pp);
    for (uint32_t u = 0; u < sim->ranks; u++) {
        const uint32_t first = classes->of_rank ? classes->first_rank[u]
                               : sim->ranks == world ? u
                                                     : u * mp;
        sim->first_rank[u] = first;
        sim->rank_count[u] = classes->of_rank ? classes->count[u] : world / sim->ranks;
        sim->stage_of[u] = (uint16_t)((first / mp) % sim->sim_pp);
        sim->stage_ranks[sim->stage_of[u]]++;
    }
    if (!fold && classes->of_rank)
        sim->weight = sim->rank_count;
    /* Blocks number a row's units as its ranks: neighbours need no table (peer_rank). */
    if (!fold || sim->sim_pp == 1)
        return;
    sim->peer = g_new(uint32_t, (size_t)sim->ranks * sim->sim_pp);
    for (uint32_t u = 0; u < sim->ranks; u++)
        for (uint32_t k = 0; k < sim->sim_pp; k++)
            sim->peer[(size_t)u * sim->sim_pp + k] = classes->of_rank[
                (int64_t)sim->first_rank[u] + ((int64_t)k - sim->stage_of[u]) * mp];
}

/* Appends one flow slot per stream for a group of the given simulated members. */
static uint32_t add_flow_slots(GArray *flows, GArray *members, const uint32_t *group,
                               uint32_t count, uint8_t per_row)
{
    const uint32_t base = flows->len;
    for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++) {
        const Flow f = {.member_start = members->len, .count = count, .copies = 1,
                        .inter_scale = 1.0, .per_row = per_row};
        g_array_append_val(flows, f);
    }
    g_array_append_vals(members, group, count);
    return base;
}

/* One communicator's flow slots: each of its groups (explicit), each simulated rank alone
 * (one a stage), or each set of classes its groups hold (rank classes; explicit blocks,
 * where a row communicator's groups in one block hold the same units: Flow.copies). */
static void build_group_flows(Sim *sim, uint32_t g, SimClasses *classes, GArray *flows,
                              GArray *members, uint32_t *scratch)
{
    const uint32_t world = (uint32_t)sim->sched->world;
    const ZpCommGroup *group = &sim->groups[g];
    const uint32_t ranks = (uint32_t)group->ranks;
    if (sim->ranks < world && !classes->of_rank) {
        /* Each rank alone runs its stage's ops: its loads on a link are its own flows'
         * (Flow.alone_on_link), each of them the only one of its group and stream */
        for (uint32_t u = 0; u < sim->ranks; u++) {
            const uint32_t base = add_flow_slots(flows, members, &u, 1, FALSE);
            sim->slot_of[(size_t)u * sim->n_groups + g] = base;
            const uint8_t *alone =
                sim->link_alone ? &sim->link_alone[g * ZP_STREAM_N] : NULL;
            for (uint32_t stream = 0; alone && stream < ZP_STREAM_N; stream++)
                g_array_index(flows, Flow, base + stream).alone_on_link = alone[stream];
        }
        return;
    }
    SimInterner sets;
    sim_interner_init(&sets);
    uint32_t *base = g_new(uint32_t, world / ranks);
    for (uint32_t k = 0; k < world / ranks; k++) {
        const uint32_t first = (uint32_t)zp_group_first(group, k);
        uint32_t n = ranks, id = k;
        gboolean fresh = TRUE;
        if (classes->of_rank) {
            const uint32_t known = sim_interner_count(&sets);
            n = sim_class_group(classes, group, first, scratch);
            id = sim_interner_id(&sets, scratch, n);
            fresh = id == known;
        } else {
            for (uint32_t i = 0; i < ranks; i++)
                scratch[i] = (uint32_t)zp_group_member(group, first, i);
        }
        if (fresh)
            base[id] = add_flow_slots(flows, members, scratch, n, sim->per_row[g]);
        else if (sim->weight) /* a block's row: one more group its flow stands for */
            for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++)
                g_array_index(flows, Flow, base[id] + stream).copies++;
        for (uint32_t i = 0; i < ranks; i++) {
            const uint32_t r = (uint32_t)zp_group_member(group, first, i);
            sim->slot_of[(size_t)(classes->of_rank ? classes->of_rank[r] : r) * sim->n_groups +
                         g] = base[id];
        }
    }
    g_free(base);
    sim_interner_clear(&sets);
}

/* Flow slots of every communicator that runs collectives: tp without tensor parallelism or pp
 * (whose sends are p2p ops) would otherwise be a slot per rank and stream, written and
 * resident for nothing (160 MB at 131,072 ranks). */
void sim_ranks_build_flows(Sim *sim, SimClasses *classes)
{
    gboolean used[ZP_SCHED_MAX_GROUPS];
    uint32_t largest = 1;
    groups_used(sim, used);
    const size_t n_slots = (size_t)sim->ranks * sim->n_groups;
    sim->slot_of = g_new(uint32_t, MAX(n_slots, 1));
    for (size_t k = 0; k < n_slots; k++)
        sim->slot_of[k] = NO_FLOWS;
    for (uint32_t g = 0; g < sim->n_groups; g++)
        largest = MAX(largest, (uint32_t)sim->groups[g].ranks);
    uint32_t *scratch = g_new(uint32_t, largest);
    GArray *flows = g_array_new(FALSE, FALSE, sizeof(Flow));
    GArray *members = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t g = 0; g < sim->n_groups; g++)
        if (used[g])
            build_group_flows(sim, g, classes, flows, members, scratch);
    g_free(scratch);
    sim->n_flows = flows->len;
    sim->state_bytes += n_slots * sizeof *sim->slot_of + members->len * sizeof(uint32_t) +
                        (uint64_t)sim->n_flows * sizeof(Flow);
    sim->flows = (Flow *)g_array_free(flows, sim->n_flows == 0);
    sim->members = (uint32_t *)g_array_free(members, FALSE);
    sim->affected_cap = 64;
    sim->affected = g_new(uint32_t, sim->affected_cap);
}

/* Slow ranks scale their compute; a slow node scales the network transfers of every group
 * with a member on it (the slowest link paces a ring or a tree). A simulated rank's factors
 * are its first rank's (a rank class's ranks share theirs). */
void sim_ranks_apply_slowdowns(Sim *sim, const Slowdowns *w)
{
    if (!w->rank)
        return;
    sim->compute_scale = g_new(double, sim->ranks);
    for (uint32_t u = 0; u < sim->ranks; u++)
        sim->compute_scale[u] = w->rank[sim->first_rank[u]];
    for (uint32_t slot = 0; slot < sim->n_flows; slot++) {
        Flow *f = &sim->flows[slot];
        for (uint32_t i = 0; i < f->count; i++) {
            const uint32_t first = sim->first_rank[sim->members[f->member_start + i]];
            f->inter_scale = MAX(f->inter_scale, slowdown_node(w, first));
        }
    }
}

gboolean sim_slow_parse(const char *text, uint32_t count, const char *what, SimSlow *slow,
                        GError **error)
{
    const char *colon = strchr(text, ':');
    char *end = NULL;
    guint64 index = 0;
    double factor = 0;
    gboolean ok = colon != NULL && colon > text;
    if (ok) {
        char *index_text = g_strndup(text, (gsize)(colon - text));
        ok = g_ascii_string_to_unsigned(index_text, 10, 0, G_MAXUINT32, &index, NULL);
        g_free(index_text);
    }
    if (ok) {
        factor = g_ascii_strtod(colon + 1, &end);
        ok = end != colon + 1 && *end == '\0' && factor >= 1 && factor <= 1e6;
    }
    if (!ok) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "'%s' is not %s:FACTOR (a whole number, a colon, a factor from 1 to 1e6)",
                    text, what);
        return FALSE;
    }
    if (index >= count) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "'%s': %s %" G_GUINT64_FORMAT
                    " is not below the %u there are", text, what, index, count);
        return FALSE;
    }
    *slow = (SimSlow){.index = (uint32_t)index, .factor = factor};
    return TRUE;
}

/* One timeline array's row `from` (a unit's) copied to row `to` (a rank's), another row, over
 * the ops [lo, lo + len): the span of the unit's stage's ops, outside which a rank's row is 0.
 * The rest of the row is left alone: never written (a pipeline's rank runs 1/pp of the ops,
 * and the other pages stay unmapped), or, where row `to` held unit `to`'s, written inside the
 * same span only (a unit and a rank of one index share its place in a row, so its stage). */
static void copy_row_span(void *rows, size_t item_bytes, size_t n, size_t to, size_t from,
                          size_t lo, size_t len)
{
    char *base = rows;
    memcpy(base + (to * n + lo) * item_bytes, base + (from * n + lo) * item_bytes,
           len * item_bytes);
}

/* Blocks: each unit's timeline row (at its index, which is at most its first rank's) copied
 * to every rank of its unit, row k of the block at first rank + k x row, from the last unit
 * down so that no row is overwritten before it is read; a collective of a row communicator
 * was started by the rank of that row (arriving_rank: + k x row), where the unit's stage runs
 * it (another stage's stay 0). first_rank and rank_count become every world rank's own. */
void sim_ranks_expand_blocks(Sim *sim)
{
    const size_t n = sim->n_ops;
    const uint32_t row = row_ranks(sim);
    /* Each stage's ops lie in [lo, end) (its first and one past its last). */
    uint32_t *lo = g_new(uint32_t, sim->sim_pp), *end = g_new0(uint32_t, sim->sim_pp);
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        lo[k] = sim->n_ops;
    GArray *row_ops = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const uint32_t k = sim->ops[i].stage;
        lo[k] = MIN(lo[k], i);
        end[k] = i + 1;
        if (sim->ops[i].kind == ZP_OP_COLLECTIVE && sim->per_row[sim->ops[i].group])
            g_array_append_val(row_ops, i);
    }
    for (uint32_t u = sim->ranks; sim->op_start_s && !sim->timeline_row && u-- > 0;)
        for (uint32_t k = sim->weight[u]; k-- > 0;) {
            const size_t to = sim->first_rank[u] + k * row;
            const uint32_t stage = sim->stage_of[u];
            const size_t len = end[stage] > lo[stage] ? end[stage] - lo[stage] : 0;
            if (to != u) {
                copy_row_span(sim->op_start_s, sizeof(double), n, to, u, lo[stage], len);
                copy_row_span(sim->op_end_s, sizeof(double), n, to, u, lo[stage], len);
                copy_row_span(sim->op_ready_s, sizeof(double), n, to, u, lo[stage], len);
                copy_row_span(sim->op_last_rank, sizeof(uint32_t), n, to, u, lo[stage], len);
            }
            for (guint j = 0; j < row_ops->len; j++) {
                const uint32_t i = g_array_index(row_ops, uint32_t, j);
                if (sim->ops[i].stage == stage)
                    sim->op_last_rank[to * n + i] += k * row;
            }
        }
    g_array_free(row_ops, TRUE);
    g_free(lo);
    g_free(end);
    sim->weight = NULL;
    g_free(sim->first_rank);
    g_free(sim->rank_count);
    sim->first_rank = g_new(uint32_t, MAX(sim->world, 1));
    sim->rank_count = g_new(uint32_t, MAX(sim->world, 1));
    for (uint32_t r = 0; r < sim->world; r++) {
        sim->first_rank[r] = r;
        sim->rank_count[r] = 1;
    }
}

/* Some ranks' timeline: the units' rows it kept become a row per rank asked for (as
 * sim_ranks_expand_blocks copies them: a collective of a row communicator was started by the
 * rank of the same row, k rows on), in place of the units' rows. */
void sim_ranks_gather_timeline(Sim *sim)
{
    const size_t n = sim->n_ops, rows = sim->n_timeline_ranks;
    double *start = g_new0(double, MAX(rows * n, 1)), *end = g_new0(double, MAX(rows * n, 1));
    double *ready = g_new0(double, MAX(rows * n, 1));
    uint32_t *last = g_new0(uint32_t, MAX(rows * n, 1));
    for (size_t j = 0; j < rows; j++) {
        uint32_t k;
        const uint32_t u = unit_of(sim, sim->timeline_ranks[j], &k);
        const size_t from = (size_t)sim->timeline_row[u] * n;
        if (sim->timeline_shared) { /* the unit's own stage's cells; the others' stay 0 */
            for (uint32_t i = 0; i < sim->n_ops; i++)
                if (sim->ops[i].stage == sim->stage_of[u]) {
                    start[j * n + i] = sim->op_start_s[from + i];
                    end[j * n + i] = sim->op_end_s[from + i];
                    ready[j * n + i] = sim->op_ready_s[from + i];
                    last[j * n + i] = sim->op_last_rank[from + i];
                }
        } else {
            memcpy(&start[j * n], &sim->op_start_s[from], n * sizeof *start);
            memcpy(&end[j * n], &sim->op_end_s[from], n * sizeof *end);
            memcpy(&ready[j * n], &sim->op_ready_s[from], n * sizeof *ready);
            memcpy(&last[j * n], &sim->op_last_rank[from], n * sizeof *last);
        }
        for (uint32_t i = 0; k > 0 && i < sim->n_ops; i++)
            if (sim->ops[i].kind == ZP_OP_COLLECTIVE && sim->per_row[sim->ops[i].group] &&
                sim->ops[i].stage == sim->stage_of[u])
                last[j * n + i] += k * row_ranks(sim);
    }
    g_free(sim->op_start_s);
    g_free(sim->op_end_s);
    g_free(sim->op_ready_s);
    g_free(sim->op_last_rank);
    sim->op_start_s = start;
    sim->op_end_s = end;
    sim->op_ready_s = ready;
    sim->op_last_rank = last;
}
