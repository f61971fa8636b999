/* sim_engine: the event loop; static facts are computed once per op and shared by all ranks,
 * and a collective is one queue event for its whole group, never one per ring step. */
#include "sim_engine.h"
#include "sim_engine_internal.h"
#include "sim_fold.h"
#include "sim_memory.h"

#include <stddef.h>
#include <string.h>

/* How often (queue events as heap_events counts them, a unit's once per rank) the run tells
 * SimOptions.progress how far it is. */
#define PROGRESS_EVERY_EVENTS 4096

static inline uint32_t flow_slot(const Sim *sim, uint32_t group, uint32_t rank, uint32_t stream)
{
    return sim->slot_of[(size_t)rank * sim->n_groups + group] + stream;
}

/* A run-time array of *cap items of item_bytes (rank rows, ranks' states) doubled (16 items at
 * first, *cap updated): the new array, or NULL and sim->error, naming what, if it does not fit. */
void *sim_grow_state(Sim *sim, void *items, uint32_t *cap, size_t item_bytes,
                     const char *what)
{
    const uint32_t grown_cap = *cap ? 2 * *cap : 16;
    void *grown = g_try_realloc(items, (size_t)grown_cap * item_bytes);
    if (!grown) {
        g_set_error(&sim->error, ZP_ERROR, ZP_ERROR_VALUE,
                    "simulating %u ranks: %u %s do not fit in memory; fold the ranks",
                    ranks_reported(sim), grown_cap, what);
        return NULL;
    }
    *cap = grown_cap;
    return grown;
}

/* Which copy of the event loop's hot paths runs (PATH_COPIES, below). */
typedef enum { PATH_FULL, PATH_QUIET, PATH_SOLO } Path;

/* Op began counting its dependencies down: sim_fold's window (Sim.fold_hi) reaches it, but
 * for the far ops (SimFold's far list: an op waiting on one from the first micro-step, in
 * the last), which sim_fold compares in place, and the sinks (an op of no micro-step that
 * every micro-step counts down), whose fall it compares. */
static inline void fold_began(Sim *sim, uint32_t op, uint32_t stage)
{
    if (sim->fold_hi && !(sim->fold_far && sim->fold_far[op]))
        sim->fold_hi[stage] = MAX(sim->fold_hi[stage], op + 1);
}

/* A row of counts for `op` (of `stage`), every rank's at n_deps, from the free rows or a new
 * one. */
G_NO_INLINE static gboolean take_row(Sim *sim, uint32_t op, uint32_t stage)
{
    uint32_t row;
    if (sim->n_free_rows > 0) {
        row = sim->free_rows[--sim->n_free_rows];
    } else {
        if (sim->n_rows_made == sim->cap_rows) {
            uint8_t *rows = sim_grow_state(sim, sim->rows, &sim->cap_rows, sim->ranks,
                                           "rows of dependency counts");
            if (!rows)
                return FALSE;
            sim->rows = rows;
            sim->free_rows = g_renew(uint32_t, sim->free_rows, sim->cap_rows);
        }
        row = sim->n_rows_made++;
    }
    memset(sim->rows + (size_t)row * sim->ranks, (int)sim->ops[op].n_deps, sim->ranks);
    sim->countdown[op].row = row;
    fold_began(sim, op, stage);
    return TRUE;
}

/* One dependency of `op` (of `stage`) done on `rank`; TRUE when it was the last. The solo
 * path (PATH_SOLO: Sim.solo) asks for its Countdown's cases first, without the test for a row
 * and the load of Sim.solo (over 2% of Megatron 1T's loop); a row, were one taken, is asked
 * for after them. */
static inline gboolean pending_done(Sim *sim, const Path path, uint32_t op, uint32_t stage,
                                    uint32_t rank)
{
    Countdown *c = &sim->countdown[op];
    if (path == PATH_SOLO || c->row >= COUNTS_SOLO) {
        if (c->row == COUNTS_SOLO) {
            if (--c->left != 0)
                return FALSE;
            c->row = COUNTS_DONE;
            return TRUE;
        }
        if (c->row == COUNTS_UNUSED && (path == PATH_SOLO || sim->solo)) {
            /* Its first count down, as take_row's (the stage's one rank: no other to wait). */
            fold_began(sim, op, stage);
            if (sim->ops[op].n_deps == 1) {
                c->row = COUNTS_DONE;
                return TRUE;
            }
            c->row = COUNTS_SOLO;
            c->left = sim->ops[op].n_deps - 1;
            return FALSE;
        }
        if (c->row == COUNTS_WIDE) {
            /* A wide op takes no row, but its first count down is a beginning all the same:
             * sim_fold's window must reach it as it reaches every other (sim_fold.c, wide
             * ops). Rare: the few ops with over 255 dependencies. */
            uint32_t *left = &sim->pending_wide[(size_t)c->wide_row * sim->ranks + rank];
            if (sim->fold_hi && *left == sim->ops[op].n_deps)
                fold_began(sim, op, stage);
            return --*left == 0;
        }
        if (c->row >= COUNTS_SOLO && !take_row(sim, op, stage))
            return FALSE;
    }
    if (--sim->rows[(size_t)c->row * sim->ranks + rank] != 0)
        return FALSE;
    if (++c->zeroed == sim->stage_ranks[stage]) { /* no rank needs it */
        sim->free_rows[sim->n_free_rows++] = c->row;
        c->row = COUNTS_DONE;
    }
    return TRUE;
}

/* pending_of (sim_engine_internal.h), the solo path's Countdown cases asked first, without
 * the test for a row (none is taken there; were one, it is asked for after them). */
static inline uint32_t pending_in(const Sim *sim, const Path path, uint32_t op, uint32_t rank)
{
    if (path == PATH_SOLO) {
        const Countdown *c = &sim->countdown[op];
        if (c->row == COUNTS_DONE)
            return 0;
        if (c->row == COUNTS_SOLO)
            return c->left;
        if (c->row == COUNTS_UNUSED)
            return sim->ops[op].n_deps;
    }
    return pending_of(sim, op, rank);
}

/* Room for n more at the end of the ready queue: slides it back to the front, and grows it
 * if that is not enough. Apart from the pushes so that they, on every alloc and free, stay
 * small enough to inline. */
static void ready_make_room(Sim *sim, size_t n)
{
    if (sim->ready_head > 0) {
        sim->ready_end -= sim->ready_head;
        memmove(sim->ready, sim->ready + sim->ready_head, sim->ready_end * sizeof *sim->ready);
        sim->ready_head = 0;
    }
    if (sim->ready_end + n > sim->ready_cap) {
        while (sim->ready_end + n > sim->ready_cap)
            sim->ready_cap = sim->ready_cap ? 2 * sim->ready_cap : 1024;
        sim->ready = g_renew(ReadyOp, sim->ready, sim->ready_cap);
    }
}

static inline void ready_push(Sim *sim, uint32_t rank, uint32_t op)
{
    if (sim->ready_end == sim->ready_cap)
        ready_make_room(sim, 1);
    sim->ready[sim->ready_end++] = (ReadyOp){rank, op};
}

/* Queues the n allocs and frees of `ready` on rank, in order (SimOp.dependents_ready). */
static inline void ready_push_block(Sim *sim, uint32_t rank, const Dependent *ready, size_t n)
{
    if (sim->ready_end + n > sim->ready_cap)
        ready_make_room(sim, n);
    ReadyOp *to = &sim->ready[sim->ready_end];
    for (size_t k = 0; k < n; k++)
        to[k] = (ReadyOp){rank, ready[k].op};
    sim->ready_end += n;
}

/* The event loop's hot paths come in three copies (run_queue), `path` a constant in each:
 * PATH_FULL asks everything; PATH_QUIET, where no timeline is kept (Sim.op_start_s NULL) and
 * sim_fold records nothing (Sim.fold_recording), asks neither at each sum and cell; PATH_SOLO,
 * quiet and each stage one simulated rank, its neighbours' numbers its own (Sim.solo, no
 * Sim.peer, sim_mp 1), counts down in Countdowns alone and runs flows of one member. Only
 * sim_fold_boundary starts a recording, so the path is decided again after each. The
 * functions called, not inlined, come in each copy: PATH_COPIES(name, params, args) makes
 * name_full, name_quiet and name_solo of name_as, and PATH_CALL(name, path) picks one. */
#define PATH_COPY(name, suffix, value, params, args)                                          \
    G_NO_INLINE static void name##suffix params                                                \
    {                                                                                          \
        const Path path = value;                                                               \
        name##_as args;                                                                        \
    }
#define PATH_COPIES(name, params, args)                                                        \
    PATH_COPY(name, _full, PATH_FULL, params, args)                                            \
    PATH_COPY(name, _quiet, PATH_QUIET, params, args)                                          \
    PATH_COPY(name, _solo, PATH_SOLO, params, args)
/* The full copy alone, where the others are inlined. */
#define PATH_COPY_FULL(name, params, args) PATH_COPY(name, _full, PATH_FULL, params, args)
#define PATH_CALL(name, path)                                                                  \
    ((path) == PATH_SOLO ? name##_solo : (path) == PATH_QUIET ? name##_quiet : name##_full)

/* field += x for one of the sums a run only writes (busy, exposed, idle times); noted while
 * sim_fold records a period, which it replays for the periods it skips. */
#define ADD_SUM(sim, path, field, x)                                                           \
    do {                                                                                       \
        const double add_ = (x);                                                               \
        (field) += add_;                                                                       \
        if ((path) == PATH_FULL && G_UNLIKELY((sim)->fold_recording))                          \
            sim_fold_note_add((sim), &(field), add_);                                          \
    } while (0)

/* A timeline cell written (noted for sim_fold as above). */
#define SET_CELL(sim, array, at, value)                                                        \
    do {                                                                                       \
        (sim)->array[at] = (value);                                                            \
        if (G_UNLIKELY((sim)->fold_recording))                                                 \
            sim_fold_note_cell((sim), (sim)->array, (at), (sim)->array[at]);                   \
    } while (0)

/* A compute op or collective that ran `seconds` ended on rank: its type's seconds and count
 * (SimResult.op_type_s), written only, noted for sim_fold as the busy sums are. */
static inline void add_op_type(Sim *sim, const Path path, uint32_t rank, const SimOp *op,
                               double seconds)
{
    const uint32_t type = op->kind == ZP_OP_COMPUTE ? op->sub : ZP_COMP_N + op->sub;
    double *sums = &sim->op_type_sums[(size_t)rank * 2 * SIM_OP_TYPES];
    ADD_SUM(sim, path, sums[type], seconds);
    ADD_SUM(sim, path, sums[SIM_OP_TYPES + type], 1.0);
}

/* How long a timed op runs on rank without contention: on the grid, a slow rank's GPU work
 * `factor` times longer (its start queues its end with it; its end, a compute op's, adds it
 * to its type's seconds). */
static inline double timed_duration_s(const Sim *sim, uint32_t rank, const SimOp *op,
                                      gboolean gpu)
{
    return sim_clock_q(sim->compute_scale && gpu ? op->duration_s * sim->compute_scale[rank]
                                                 : op->duration_s);
}

/* RankState's four counts of ops in flight, side by side: account reads them as one word. */
G_STATIC_ASSERT(offsetof(RankState, comm_active) == offsetof(RankState, compute_running) + 1 &&
                offsetof(RankState, cpu_running) == offsetof(RankState, compute_running) + 2 &&
                offsetof(RankState, transfers_active) ==
                    offsetof(RankState, compute_running) + 3);

/* Exposed communication: time no compute op runs while a collective of the rank is in flight.
 * Called before either count changes. */
static inline void account(Sim *sim, const Path path, RankState *rs, double now_s)
{
    /* A rank running nothing adds to no sum below: one load and test for the four counts,
     * where each was loaded and tested (a collective starts so, after the compute op it
     * waited for: 53,459 of Megatron 1T's 53,583 flows). */
    uint32_t counts;
    memcpy(&counts, &rs->compute_running, sizeof counts);
    if (counts == 0) {
        rs->mark_s = now_s;
        return;
    }
    /* What the GPU waits for when no kernel runs, in this order: a collective, CPU Adam, an
     * offload transfer. */
    const double dt = now_s - rs->mark_s;
    if (rs->compute_running > 1)
        ADD_SUM(sim, path, rs->gpu_overlap_s, (rs->compute_running - 1) * dt);
    if (rs->compute_running == 0) {
        if (rs->comm_active > 0)
            ADD_SUM(sim, path, rs->exposed_s, dt);
        else if (rs->cpu_running > 0)
            ADD_SUM(sim, path, rs->cpu_optimizer_s, dt);
        else if (rs->transfers_active > 0)
            ADD_SUM(sim, path, rs->transfer_s, dt);
    }
    rs->mark_s = now_s;
}

static uint8_t *busy_counter(RankState *rs, Busy busy)
{
    return busy == BUSY_GPU ? &rs->compute_running
           : busy == BUSY_CPU ? &rs->cpu_running
                              : &rs->transfers_active;
}

/* ---- bandwidth sharing ---- */

/* Brings a flow's transfer up to now at its old share, then gives it 1/k of the link, k the
 * most flows in flight on that link at any of its members; requeues it if its end moved. */
static void reshare(Sim *sim, uint32_t slot, uint8_t link, double now_s)
{
    Flow *f = &sim->flows[slot];
    if (now_s > f->transfer_from_s) {
        f->remaining_s = MAX(0.0, f->remaining_s - (now_s - f->transfer_from_s) * f->share);
        f->transfer_from_s = now_s;
    }
    uint16_t most = 1;
    const uint32_t *member = &sim->members[f->member_start];
    for (uint32_t i = 0; i < f->count; i++)
        most = MAX(most, sim->link_load[member[i] * SIM_LINK_N + link]);
    f->share = 1.0 / most;
    /* On the clock's grid (sim_clock_q): the remaining bytes are not a time and need none. */
    const double end_s = f->transfer_from_s + sim_clock_q(f->remaining_s / f->share);
    if (end_s != f->end_s) {
        f->end_s = end_s;
        sim_queue_push(&sim->queue, end_s, EVENT_FLOW | slot, ++f->version);
    }
}

/* Adds flow `slot` to those to reshare, once an epoch. */
static void affect(Sim *sim, uint32_t slot)
{
    sim->flows[slot].touched = sim->epoch;
    if (sim->n_affected == sim->affected_cap) {
        sim->affected_cap *= 2;
        sim->affected = g_renew(uint32_t, sim->affected, sim->affected_cap);
    }
    sim->affected[sim->n_affected++] = slot;
}

/* Reshares every flow in flight on the same link at any member of `changed`, in the order
 * its members, their groups and streams are walked. `own`: 1 where `changed` has just started
 * (its own load counted), 0 where it has ended. A member whose load on the link is its own
 * only has no other flow there to find: it is not walked (the walk of every group and stream
 * of every member was a twentieth of Megatron's 1T evaluation); where that is the first
 * member, `changed` itself, which its walk would have found first, comes first. */
G_NO_INLINE static void reshare_walk(Sim *sim, const Flow *changed, uint32_t changed_slot,
                                     uint8_t link, uint16_t own, double now_s, uint32_t first)
{
    sim->epoch++;
    sim->n_affected = 0;
    const uint32_t *member = &sim->members[changed->member_start];
    if (own && changed->remaining_s > 0 && sim->link_load[member[0] * SIM_LINK_N + link] == own)
        affect(sim, changed_slot);
    for (uint32_t i = first; i < changed->count; i++) {
        const uint32_t m = member[i];
        if (sim->link_load[m * SIM_LINK_N + link] <= own)
            continue;
        for (uint32_t group = 0; group < sim->n_groups; group++) {
            const uint32_t base = sim->slot_of[(size_t)m * sim->n_groups + group];
            for (uint32_t stream = 0; stream < ZP_STREAM_N && base != NO_FLOWS; stream++) {
                const uint32_t slot = base + stream;
                Flow *f = &sim->flows[slot];
                if (!f->active || f->touched == sim->epoch || f->remaining_s <= 0 ||
                    sim->ops[f->op].link != link)
                    continue;
                affect(sim, slot);
            }
        }
    }
    for (uint32_t i = 0; i < sim->n_affected; i++)
        reshare(sim, sim->affected[i], link, now_s);
}

/* The walk above from the first member whose load on the link is more than its own: where
 * there is none, it changes nothing and is skipped (over half the calls of plan --3d gpt-1t).
 * It would walk no member, and find no flow but `changed`, which has just started alone
 * (own 1: share 1, transfer not begun, its end as start_flow set it, so reshare queues
 * nothing) or is not counted (own 0). */
static inline void reshare_neighbours(Sim *sim, const Flow *changed, uint32_t changed_slot,
                                      uint8_t link, uint16_t own, double now_s)
{
    const uint32_t *member = &sim->members[changed->member_start];
    for (uint32_t i = 0; i < changed->count; i++)
        if (sim->link_load[member[i] * SIM_LINK_N + link] > own) {
            reshare_walk(sim, changed, changed_slot, link, own, now_s, i);
            return;
        }
}

/* Contention: a rank's compute ops run sim->contention times slower while a collective of
 * that rank is in flight. What counts is whether one is in flight once the instant is over: a
 * collective that starts or ends marks its members unsettled, a compute op that starts is
 * timed only then, and at the instant's end (settle_contention) each unsettled rank's compute
 * is timed, or rescaled where it ran on from before: the rest of the op at the new rate, its
 * end queued again and the superseded end ignored (handle). So the order of one instant's
 * events cannot change a step: a compute op and a collective starting at one time give the
 * same bits whichever is taken first, as they must for blocks of ranks in lockstep
 * (sim_ranks.c), whose ranks take them in different orders. */
G_STATIC_ASSERT(ZP_STREAM_N <= 8); /* RankState.computing */

static inline void unsettle(Sim *sim, uint32_t rank)
{
    RankState *rs = &sim->rank[rank];
    /* A rank computing nothing has nothing to settle (an op it starts later in the instant
     * marks it then). Without contention (no Sim.running) none computes: start_timed_op
     * marks a stream computing only with it, so that one test stands for both. */
    if (!rs->computing || rs->unsettled)
        return;
    rs->unsettled = 1;
    if (sim->n_unsettled > 0 && sim->unsettled[sim->n_unsettled - 1] > rank)
        sim->unsettled_unordered = TRUE;
    sim->unsettled[sim->n_unsettled++] = rank;
}

G_ALWAYS_INLINE static inline void settle_stream(Sim *sim, const Path path, uint32_t rank,
                                                 uint32_t stream, double now_s)
{
    RunningCompute *run = &sim->running[(size_t)rank * ZP_STREAM_N + stream];
    const uint8_t slowed = sim->rank[rank].comm_active > 0;
    const SimOp *op = &sim->ops[run->op];
    double added_s;
    if (run->started) {
        /* As start_timed_op times an op without contention. */
        const double duration_s = sim_clock_q(
            (sim->compute_scale ? op->duration_s * sim->compute_scale[rank] : op->duration_s) *
            (slowed ? sim->contention : 1));
        run->end_s = now_s + duration_s;
        run->started = 0;
        added_s = duration_s;
    } else {
        if (run->end_s < 0 || slowed == run->slowed)
            return;
        const double end_s =
            now_s + sim_clock_q((run->end_s - now_s) *
                                (slowed ? sim->contention : 1 / sim->contention));
        added_s = end_s - run->end_s;
        run->end_s = end_s;
    }
    run->slowed = slowed;
    RankBusy *rb = &sim->busy[rank];
    ADD_SUM(sim, path, rb->busy_s[op->stream], added_s);
    if (op->sub == ZP_COMP_OPTIMIZER)
        ADD_SUM(sim, path, rb->optimizer_s, added_s);
    else
        ADD_SUM(sim, path, rb->compute_s, added_s);
    sim_queue_push(&sim->queue, run->end_s, rank, run->op);
}

static int compare_ranks(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The instant's end: its unsettled ranks in rank order (blocks' units, expanded, are the
 * ranks in that order: sim_ranks.c), each stream's compute timed or rescaled, the ends queued
 * as no handling's (MADE_SETTLED: blocks' check_order never takes them for one's). */
G_ALWAYS_INLINE static inline void settle_contention_as(Sim *sim, const Path path,
                                                       double now_s)
{
    if (sim->unsettled_unordered)
        qsort(sim->unsettled, sim->n_unsettled, sizeof *sim->unsettled, compare_ranks);
    sim->queue.made_mark = MADE_SETTLED;
    for (uint32_t k = 0; k < sim->n_unsettled; k++) {
        const uint32_t rank = sim->unsettled[k];
        sim->rank[rank].unsettled = 0;
        /* Lowest stream first, as g_bit_nth_lsf's walk, which steps through all 64 bits of a
         * long after the last one set (122M instructions of plan --3d gpt-1t's 4.3G). */
        for (unsigned computing = sim->rank[rank].computing; computing != 0;
             computing &= computing - 1)
            settle_stream(sim, path, rank, (uint32_t)__builtin_ctz(computing), now_s);
    }
    sim->queue.made_mark = 0;
    sim->n_unsettled = 0;
    sim->unsettled_unordered = FALSE;
}

PATH_COPY_FULL(settle_contention, (Sim *sim, double now_s), (sim, path, now_s))
PATH_COPY(settle_contention, _quiet, PATH_QUIET, (Sim *sim, double now_s), (sim, path, now_s))

/* The solo copy inlined into the loop (its entry and exit were 0.45 M of Megatron 1T's 153 M:
 * an instant settles one rank's one op there), the others called. */
static inline void settle(Sim *sim, const Path path, double now_s)
{
    if (path == PATH_SOLO)
        settle_contention_as(sim, PATH_SOLO, now_s);
    else if (path == PATH_QUIET)
        settle_contention_quiet(sim, now_s);
    else
        settle_contention_full(sim, now_s);
}

static void set_link_load(Sim *sim, const Flow *f, uint8_t link, int delta)
{
    const uint32_t *member = &sim->members[f->member_start];
    for (uint32_t i = 0; i < f->count; i++)
        sim->link_load[member[i] * SIM_LINK_N + link] += delta;
}

/* ---- ops ---- */

#define NO_TIMELINE SIZE_MAX

/* Where rank's op i sits in the timeline, or NO_TIMELINE where none is kept for the rank. */
G_ALWAYS_INLINE static inline size_t timeline_at(const Sim *sim, const Path path,
                                                 uint32_t rank, uint32_t i)
{
    if (path != PATH_FULL || !sim->op_start_s)
        return NO_TIMELINE;
    const uint32_t row = sim->timeline_row ? sim->timeline_row[rank] : rank;
    return row == NO_ROW ? NO_TIMELINE : (size_t)row * sim->n_ops + i;
}

/* Member m's part of flow f's start, `last` the member whose arrival starts it: its exposed
 * time brought up to now, the collective counted in flight, its timeline cells. */
G_ALWAYS_INLINE static inline void member_starts(Sim *sim, const Path path, const Flow *f,
                                                 uint32_t m, uint32_t last, double now_s)
{
    account(sim, path, &sim->rank[m], now_s);
    sim->rank[m].comm_active++;
    unsettle(sim, m);
    const size_t at = timeline_at(sim, path, m, f->op);
    if (at != NO_TIMELINE) {
        SET_CELL(sim, op_start_s, at, now_s);
        sim->op_last_rank[at] = arriving_rank(sim, last, f);
        if (G_UNLIKELY(sim->fold_recording))
            sim_fold_note_rank(sim, at, sim->op_last_rank[at]);
    }
}

/* Flow f (`slot`) of op `op` starts; `last` is the member whose arrival starts it. */
G_ALWAYS_INLINE static inline void start_flow_as(Sim *sim, const Path path, Flow *f,
                                                 uint32_t slot, const SimOp *op, uint32_t last,
                                                 double now_s)
{
    f->arrived = 0;
    f->active = TRUE;
    f->start_s = now_s;
    f->transfer_from_s = now_s + sim_clock_q(op->latency_s);
    f->remaining_s = op->link == SIM_LINK_INTER ? op->transfer_s * f->inter_scale
                                                : op->transfer_s;
    f->share = 1.0;
    f->end_s = f->transfer_from_s + sim_clock_q(f->remaining_s);
    sim_queue_push(&sim->queue, f->end_s, EVENT_FLOW | slot, ++f->version);
    const uint32_t *member = &sim->members[f->member_start];
    if (f->count == 1) {
        /* A group of one simulated rank: where each pipeline stage is one (folded runs),
         * every collective's, all 53,583 flows of Megatron 1T's evaluation. The loops below
         * for that one member, in the same order, without their setup (the loop, the walk
         * for a loaded member). A load above 1 on its link is another flow at that member,
         * which reshare_neighbours would walk from member 0; active_on_link counts both, so
         * it is above 1 too and need not be asked. A flow alone on its link
         * (Flow.alone_on_link) would take its member's load from 0 to 1 and back, walking
         * nothing, and no decision reads active_on_link where every flow has one member: its
         * load is not kept. The fold compares both between periods: the flows in flight it
         * compares too, their ops alike (sim_fold_jump.c, same_op: transfer_s), so the
         * loads left out are the same at either end and its decisions are as with them. */
        const uint32_t m = member[0];
        member_starts(sim, path, f, m, last, now_s);
        if (!f->alone_on_link && op->transfer_s > 0) {
            uint16_t *load = &sim->link_load[m * SIM_LINK_N + op->link];
            sim->active_on_link[op->link]++;
            if (++*load > 1)
                reshare_walk(sim, f, slot, op->link, 1, now_s, 0);
        }
        return;
    }
    for (uint32_t i = 0; i < f->count; i++)
        member_starts(sim, path, f, member[i], last, now_s);
    if (op->transfer_s > 0) {
        set_link_load(sim, f, op->link, +1);
        /* Alone on its link class anywhere, it has the link to itself: nothing to reshare. */
        if (++sim->active_on_link[op->link] > 1)
            reshare_neighbours(sim, f, slot, op->link, 1, now_s);
    }
}

PATH_COPY_FULL(start_flow, (Sim *sim, Flow *f, uint32_t slot, const SimOp *op, uint32_t last,
                          double now_s), (sim, path, f, slot, op, last, now_s))

/* Starts compute, transfer or p2p op i on rank's stream: its duration booked, its end queued. */
G_ALWAYS_INLINE static inline void start_timed_op_as(Sim *sim, const Path path,
                                                     uint32_t rank, uint32_t stream, uint32_t i,
                                                     double now_s)
{
    const SimOp *op = &sim->ops[i];
    if (op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_TRANSFER) {
        const Busy busy = busy_of(op);
        RankState *rs = &sim->rank[rank];
        RankBusy *rb = &sim->busy[rank];
        const gboolean gpu = busy == BUSY_GPU;
        account(sim, path, rs, now_s);
        (*busy_counter(rs, busy))++;
        if (gpu && sim->running) {
            /* With contention, timed at the instant's end (settle_contention). */
            sim->running[(size_t)rank * ZP_STREAM_N + stream] =
                (RunningCompute){.end_s = -1, .start_s = now_s, .op = i, .started = 1};
            rs->computing |= (uint8_t)(1u << stream);
            unsettle(sim, rank);
            const size_t at = timeline_at(sim, path, rank, i);
            if (at != NO_TIMELINE)
                SET_CELL(sim, op_start_s, at, now_s);
            return;
        }
        const double duration_s = timed_duration_s(sim, rank, op, gpu);
        ADD_SUM(sim, path, rb->busy_s[stream], duration_s);
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_OPTIMIZER)
            ADD_SUM(sim, path, rb->optimizer_s, duration_s);
        else if (busy == BUSY_GPU)
            ADD_SUM(sim, path, rb->compute_s, duration_s);
        const size_t at = timeline_at(sim, path, rank, i);
        if (at != NO_TIMELINE)
            SET_CELL(sim, op_start_s, at, now_s);
        sim_queue_push(&sim->queue, now_s + duration_s, rank, i);
        return;
    }
    /* p2p: the sender's share of its link, no group to wait for. An isend: the rank does not
     * wait for it, so it is never exposed communication (a rank waiting only for sends idles,
     * in the pipeline's bubble). */
    const double duration_s = sim_clock_q(op->duration_s);
    ADD_SUM(sim, path, sim->busy[rank].busy_s[stream], duration_s);
    const size_t at = timeline_at(sim, path, rank, i);
    if (at != NO_TIMELINE)
        SET_CELL(sim, op_start_s, at, now_s);
    sim_queue_push(&sim->queue, now_s + duration_s, rank, i);
}

PATH_COPIES(start_timed_op, (Sim *sim, uint32_t rank, uint32_t stream, uint32_t i, double now_s),
             (sim, path, rank, stream, i, now_s))

/* Starts op i, the next of a rank's idle stream, its dependencies done: a collective counts
 * the rank in (the last member's arrival starts it), any other op is timed. */
G_ALWAYS_INLINE static inline void start_stream_op(Sim *sim, const Path path, uint32_t rank,
                                                   uint32_t stream, uint32_t i, double now_s)
{
    StreamState *ss = &sim->stream[rank];
    const SimOp *op = &sim->ops[i];
    ss->next[stream] = op->stream_next;
    ss->busy[stream] = 1;
    const size_t at = timeline_at(sim, path, rank, i);
    if (at != NO_TIMELINE)
        SET_CELL(sim, op_ready_s, at, now_s);
    if (op->kind != ZP_OP_COLLECTIVE) {
        PATH_CALL(start_timed_op, path)(sim, rank, stream, i, now_s);
        return;
    }
    const uint32_t slot = flow_slot(sim, op->group, rank, stream);
    Flow *f = &sim->flows[slot];
    f->op = i;
    if (++f->arrived != f->count)
        return;
    /* The quiet and solo copies inlined (the call's entry and exit were 0.9 M of Megatron
     * 1T's 163 M); start_timed_op's, inlined so, cost 2.6 M more. */
    if (path == PATH_FULL)
        start_flow_full(sim, f, slot, op, rank, now_s);
    else
        start_flow_as(sim, path, f, slot, op, rank, now_s);
}

/* Starts the next op of a rank's stream if the stream is idle and the op's dependencies are
 * done; `ready` is an op known to have none left (UINT32_MAX: none known). The check is
 * inlined in the callers: a third of the calls start nothing. */
G_ALWAYS_INLINE static inline void try_stream(Sim *sim, const Path path, uint32_t rank,
                                              uint32_t stream, uint32_t ready, double now_s)
{
    const StreamState *ss = &sim->stream[rank];
    const uint32_t i = ss->next[stream];
    if (ss->busy[stream] || i == NO_OP || (i != ready && pending_in(sim, path, i, rank)))
        return;
    start_stream_op(sim, path, rank, stream, i, now_s);
}

/* Op i is done on rank: counts down its dependents there and starts those now ready (the
 * caller records its end in the timeline, with whatever else it records there). */
G_ALWAYS_INLINE static inline void release_dependents(Sim *sim, const Path path, uint32_t rank,
                                                      uint32_t i, double now_s)
{
    const SimOp *op = &sim->ops[i];
    sim->op_events++;
    const uint32_t start = op_dependents_start(sim, op);
    if (op->dependents_ready > start)
        ready_push_block(sim, rank, &sim->dependents[start], op->dependents_ready - start);
    const Dependent *const end = &sim->dependents[op->dependents_end];
    for (const Dependent *d = &sim->dependents[op->dependents_ready]; d < end; d++) {
        const Dependent next = *d;
        /* Solo: no Sim.peer and sim_mp 1, peer_rank's sum without its tests */
        const uint32_t at = path == PATH_SOLO ? rank + (next.stage - op->stage)
                                              : peer_rank(sim, rank, op->stage, next.stage);
        if (next.counted && !pending_done(sim, path, next.op, next.stage, at))
            continue;
        if (next.stream != NOT_ON_STREAM)
            try_stream(sim, path, at, next.stream, next.op, now_s);
        else
            ready_push(sim, at, next.op);
    }
}

/* A compute op or collective is done on rank. Only these move a rank's clock: an alloc or
 * free runs at the time the op it waited for ended on the same rank, so it never moves
 * end_s, and memory ops never touch RankState. */
G_ALWAYS_INLINE static inline void complete(Sim *sim, const Path path, uint32_t rank, uint32_t i,
                                            double now_s)
{
    const SimOp *op = &sim->ops[i];
    sim->rank[rank].end_s = now_s;
    const size_t at = timeline_at(sim, path, rank, i);
    if (at != NO_TIMELINE)
        SET_CELL(sim, op_end_s, at, now_s);
    /* An op that ends past the caller's time: the step ends later still. */
    if (sim->stop_after_s > 0 && now_s > sim->stop_after_s && sim->stopped_s == 0)
        sim->stopped_s = now_s;
    release_dependents(sim, path, rank, i, now_s);
    /* try_stream's, the stream idle now, without loading that back */
    StreamState *ss = &sim->stream[rank];
    const uint32_t stream = op->stream, next = ss->next[stream];
    ss->busy[stream] = 0;
    if (next != NO_OP && !pending_in(sim, path, next, rank))
        start_stream_op(sim, path, rank, stream, next, now_s);
}

G_ALWAYS_INLINE static inline void run_memory_op(Sim *sim, const Path path, uint32_t rank,
                                                 uint32_t i, double now_s)
{
    if (!sim_memory_run(sim, rank, i))
        return;
    const size_t at = timeline_at(sim, path, rank, i);
    if (at != NO_TIMELINE) {
        SET_CELL(sim, op_start_s, at, now_s);
        SET_CELL(sim, op_ready_s, at, now_s);
        SET_CELL(sim, op_end_s, at, now_s);
    }
    release_dependents(sim, path, rank, i, now_s);
}

G_ALWAYS_INLINE static inline void drain_ready_ops_as(Sim *sim, const Path path,
                                                     double now_s)
{
    while (sim->ready_head < sim->ready_end && !sim->error) {
        const ReadyOp r = sim->ready[sim->ready_head++];
        run_memory_op(sim, path, r.rank, r.op, now_s);
    }
    sim->ready_head = sim->ready_end = 0;
}

PATH_COPY_FULL(drain_ready_ops, (Sim *sim, double now_s), (sim, path, now_s))
PATH_COPY(drain_ready_ops, _quiet, PATH_QUIET, (Sim *sim, double now_s), (sim, path, now_s))

/* Runs the allocs and frees made ready, in order; the check inlined: after most events there
 * are none (the call was 1.5% of plan --3d gpt-1t's instructions). */
G_ALWAYS_INLINE static inline void drain_ready(Sim *sim, const Path path, double now_s)
{
    if (sim->ready_head >= sim->ready_end)
        return;
    if (path == PATH_SOLO)
        drain_ready_ops_as(sim, path, now_s);
    else if (path == PATH_QUIET)
        drain_ready_ops_quiet(sim, now_s);
    else
        drain_ready_ops_full(sim, now_s);
}

/* Member m's part of the end of flow f, op i (started at start_s): its exposed time brought
 * up to now, the collective counted out, its busy time and type's sums, and the op done. */
G_ALWAYS_INLINE static inline void member_finishes(Sim *sim, const Path path, uint32_t m,
                                                   uint32_t i, const SimOp *op, double start_s,
                                                   double now_s)
{
    RankState *rs = &sim->rank[m];
    account(sim, path, rs, now_s);
    rs->comm_active--;
    unsettle(sim, m);
    ADD_SUM(sim, path, sim->busy[m].busy_s[op->stream], now_s - start_s);
    if (op->sub == ZP_COLL_EP_DISPATCH || op->sub == ZP_COLL_EP_COMBINE ||
        op->group == ZP_GROUP_TPEP)
        ADD_SUM(sim, path, sim->busy[m].alltoall_s, now_s - start_s);
    add_op_type(sim, path, m, op, now_s - start_s);
    complete(sim, path, m, i, now_s);
}

/* Flow `slot` ends at now_s: its link reshared, each member's collective done. Its quiet and
 * solo copies are inlined into handle's (the call's entry and exit were 1.3 M of Megatron
 * 1T's 165 M), its full copy called (PATH_COPY_FULL). */
G_ALWAYS_INLINE static inline void finish_flow_as(Sim *sim, const Path path, uint32_t slot,
                                                  double now_s)
{
    Flow *f = &sim->flows[slot];
    /* Completing the last member may start the group's next collective in this same slot. */
    const uint32_t i = f->op;
    const double start_s = f->start_s;
    const SimOp *op = &sim->ops[i];
    const uint32_t *member = &sim->members[f->member_start];
    const uint32_t count = f->count;
    f->active = FALSE;
    if (count == 1) {
        /* One member, as in start_flow: a load left on its link is another flow there,
         * which reshare_neighbours would walk from member 0 (active_on_link, counting it,
         * is above 0 then). */
        const uint32_t m = member[0];
        if (!f->alone_on_link && op->transfer_s > 0) {
            uint16_t *load = &sim->link_load[m * SIM_LINK_N + op->link];
            sim->active_on_link[op->link]--;
            if (--*load > 0)
                reshare_walk(sim, f, slot, op->link, 0, now_s, 0);
        }
        member_finishes(sim, path, m, i, op, start_s, now_s);
        return;
    }
    if (op->transfer_s > 0) {
        set_link_load(sim, f, op->link, -1);
        if (--sim->active_on_link[op->link] > 0)
            reshare_neighbours(sim, f, slot, op->link, 0, now_s);
    }
    for (uint32_t k = 0; k < count; k++)
        member_finishes(sim, path, member[k], i, op, start_s, now_s);
}

PATH_COPY_FULL(finish_flow, (Sim *sim, uint32_t slot, double now_s), (sim, path, slot, now_s))

/* How many queue events the result counts for e: a unit's stands for one per rank of its
 * block; a flow's for one per group it stands for (Flow.copies). (Ops are counted per unit as
 * they run, and per rank at the end: sim_breakdown_fill.) */
static uint64_t event_weight(const Sim *sim, const Event *e)
{
    if (!sim->weight) /* no blocks: every flow stands for one group (sim_ranks.c) */
        return 1;
    return e->id & EVENT_FLOW ? sim->flows[e->id & ~EVENT_FLOW].copies : rank_weight(sim, e->id);
}

/* Blocks: e, taken at now_s, and the event taken before it must not be a flow across rows
 * and another event queued at one time in one instant (above); where they are, the order
 * rank by rank is not the units' expanded, and order_broken stops the run. */
static void check_order(Sim *sim, const Event *e, double now_s)
{
    const uint8_t across =
        (e->id & EVENT_FLOW) != 0 && !sim->flows[e->id & ~EVENT_FLOW].per_row;
    if (now_s == sim->taken_s && e->made == sim->taken_made && across != sim->taken_across)
        sim->order_broken = TRUE;
    sim->taken_s = now_s;
    sim->taken_made = e->made;
    sim->taken_across = across;
}

G_ALWAYS_INLINE static inline void handle(Sim *sim, const Path path, const Event *e,
                                          double now_s)
{
    if (!(e->id & EVENT_FLOW)) {
        RankState *rs = &sim->rank[e->id];
        const SimOp *op = &sim->ops[e->detail];
        const gboolean gpu = op->kind == ZP_OP_COMPUTE && busy_of(op) == BUSY_GPU;
        RunningCompute *run =
            gpu && sim->running ? &sim->running[(size_t)e->id * ZP_STREAM_N + op->stream] : NULL;
        if (run && (e->detail != run->op || now_s != run->end_s))
            return; /* an end that contention moved */
        /* Rescaled there and back, an op can have two end events at the same instant: the
         * first completes it, the end is then spent. */
        if (run) {
            run->end_s = -1;
            rs->computing &= (uint8_t)~(1u << op->stream);
        }
        /* Contention rescales a running op's end: its seconds are end - start, taken here
         * (one positive addition an op, as every other op's: SimResult.op_types_exact). */
        if (op->kind == ZP_OP_COMPUTE)
            add_op_type(sim, path, e->id, op,
                        run ? now_s - run->start_s : timed_duration_s(sim, e->id, op, gpu));
        if (op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_TRANSFER) {
            account(sim, path, rs, now_s);
            (*busy_counter(rs, busy_of(op)))--;
            if (op->kind == ZP_OP_COMPUTE && op->sub != ZP_COMP_OPTIMIZER &&
                op->sub != ZP_COMP_CPU_OPTIMIZER)
                rs->flush_s = now_s;
        }
        complete(sim, path, e->id, e->detail, now_s);
        return;
    }
    const uint32_t slot = e->id & ~EVENT_FLOW;
    if (e->detail != sim->flows[slot].version || !sim->flows[slot].active)
        return;
    if (path != PATH_FULL)
        finish_flow_as(sim, path, slot, now_s);
    else
        finish_flow_full(sim, slot, now_s);
}

/* Every rank's allocs and frees without dependencies (Sim.roots), then its streams, rank by
 * rank. */
static void seed(Sim *sim)
{
    const Path path = PATH_FULL; /* seeding may write the timeline: every check kept */
    const GArray *roots = sim->roots;
    for (uint32_t r = 0; r < sim->ranks; r++) {
        for (guint k = 0; k < roots->len; k++)
            if (sim->ops[g_array_index(roots, uint32_t, k)].stage == rank_class(sim, r))
                ready_push(sim, r, g_array_index(roots, uint32_t, k));
        for (uint32_t s = 0; s < ZP_STREAM_N; s++)
            try_stream(sim, path, r, s, UINT32_MAX, 0.0);
    }
    drain_ready(sim, path, 0.0);
}

/* The copy of the loop's hot paths that runs now (PATH_COPIES). */
static Path path_of(const Sim *sim)
{
    if (sim->op_start_s || sim->fold_recording)
        return PATH_FULL;
    return sim->solo && !sim->peer && sim->sim_mp == 1 ? PATH_SOLO : PATH_QUIET;
}

/* Takes the queue's events in order until it is empty, an error, the stop time, or (blocks)
 * an order the units cannot stand for. */
static void run_queue(Sim *sim, const SimOptions *options)
{
    const double total_ops = (double)sim_breakdown_rank_ops(sim);
    /* The next multiple of PROGRESS_EVERY_EVENTS the count reaches (it only grows, jumps
     * too): a compare an event, where dividing was 9 instructions of each */
    uint64_t tell_at = PROGRESS_EVERY_EVENTS;
    double instant_s = -1, now_s = 0; /* seeding's time */
    /* Fixed for the run, in locals: after a handling's byte stores (counts, flags), which may
     * alias any field of the Sim, each was loaded again for every event */
    SimFold *const fold = sim->fold;
    const gboolean blocks = sim->weight != NULL;
    const uint32_t *const first_next = sim->stream[0].next;
    const uint32_t *const last_next = sim->stream[sim->ranks - 1].next;
    /* Which copy of the loop's paths runs (PATH_COPIES): decided again after each boundary. */
    Path path = path_of(sim);
    for (;;) {
        /* The instant is over when no event of its time is left. */
        if (sim->n_unsettled > 0 &&
            (sim->queue.len == 0 || sim_queue_next_time(&sim->queue) != now_s))
            settle(sim, path, now_s);
        if (sim->queue.len == 0 || sim->error || sim->stopped_s != 0)
            break;
        /* Between two instants (contention settled), the first or the last rank's compute
         * stream moved on: a period's head? */
        if (fold &&
            (first_next[ZP_STREAM_COMPUTE] != sim->fold_watch[0] ||
             last_next[ZP_STREAM_COMPUTE] != sim->fold_watch[1]) &&
            instant_s >= 0 && sim_queue_next_time(&sim->queue) != instant_s) {
            sim_fold_boundary(fold, sim, instant_s);
            path = path_of(sim);
            if (sim->queue.len == 0)
                break;
        }
        const Event e = sim_queue_pop(&sim->queue, &now_s);
        if (blocks) {
            check_order(sim, &e, now_s);
            if (sim->order_broken)
                return;
            sim->heap_events += event_weight(sim, &e);
        } else {
            sim->heap_events++;
        }
        if (now_s != instant_s) {
            instant_s = now_s;
            sim->queue.instant++;
        }
        if (path == PATH_SOLO) {
            handle(sim, PATH_SOLO, &e, now_s);
            drain_ready(sim, PATH_SOLO, now_s);
        } else if (path == PATH_QUIET) {
            handle(sim, PATH_QUIET, &e, now_s);
            drain_ready(sim, PATH_QUIET, now_s);
        } else {
            handle(sim, PATH_FULL, &e, now_s);
            drain_ready(sim, PATH_FULL, now_s);
        }
        if (sim->heap_events >= tell_at && options->progress) {
            tell_at = (sim->heap_events / PROGRESS_EVERY_EVENTS + 1) * PROGRESS_EVERY_EVENTS;
            options->progress((double)sim->op_events / total_ops, options->progress_ctx);
        }
    }
}

void sim_engine_loop(Sim *sim, const SimOptions *options)
{
    seed(sim);
    run_queue(sim, options);
}
