/* sim_engine_internal: what the simulator's files share (sim_engine.c's event loop, sim_ops.c's
 * static facts, sim_ranks.c's simulated ranks and blocks, sim_memory.c, sim_breakdown.c): the
 * run's state, Sim, and the small helpers all of them read it through. Private to sim/. */
#ifndef SIM_ENGINE_INTERNAL_H
#define SIM_ENGINE_INTERNAL_H

#include "sim_class.h"
#include "sim_coll.h"
#include "sim_queue.h"
#include "zp_cost.h"
#include "zp_hw.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib.h>
#include <stdint.h>

/* What a run is asked and what it returns (sim_engine.h, which the files that read them
 * include: this header stays below it, so that sim_engine and its parts form no circle). */
typedef struct SimOptions SimOptions;
typedef struct SimResult SimResult;
/* sim_fold.c's state of one run (sim_fold.h). */
typedef struct SimFold SimFold;
/* Virtual periods a jump counted (sim_fold.c), as zp_sched.h describes them. */
typedef ZpOpInsert SimFoldInsert;
/* How a run folded (sim_fold.h): the micro-steps of every stage it skipped (whole periods of d
 * each) in how many jumps, and a line saying so or why it did not. Here, not in sim_fold.h:
 * SimFold (sim_fold_jump.h, which sim_fold.c includes) keeps one, and would otherwise make
 * sim_fold and sim_fold_jump include each other. */
typedef struct {
    uint32_t micro_steps, jumps;
    char note[192];
    /* Virtual micro-steps counted (SimOptions.extend_micro_steps), and where: a GArray of
     * SimFoldInsert sorted by op, the caller's to free (NULL where none). */
    uint32_t virtual_micro_steps;
    GArray *inserts;
    /* A proof's period (micro-steps) that the virtual ones are no whole number of: its jump
     * could not count them all for that alone (SimResult.extend_period); 0 otherwise. */
    uint32_t extend_period;
    /* A shift whose state repeated but whose ops ran out before a period past the window,
     * with virtual periods left to count (SimResult.extend_room); 0 otherwise. */
    uint32_t extend_room;
} SimFoldReport;

/* What the loop needs of an op, computed once and shared by all ranks: 40 bytes, each op's
 * one figure of time or size sharing one place (a 32,000-layer model's 2.1 million SimOps
 * took 135 MB at 64 bytes, 101 MB at 48, each page of it faulted in fresh). Where its
 * dependents start is the op before it's dependents_end (op_dependents_start), and a wide
 * op's row of pending_wide is in its Countdown: 8 bytes less, 17 MB at 32,000 layers. */
typedef struct {
    uint8_t kind, sub, stream, group;
    uint8_t link;                /* collectives: the link class they load */
    uint8_t wide;                /* it has over 255 dependencies */
    uint16_t stage;              /* the rank class (pipeline stage) that runs it */
    uint32_t n_deps;
    /* dependents[op_dependents_start .. dependents_end), placed in op order */
    uint32_t dependents_end;
    /* dependents[op_dependents_start .. dependents_ready): allocs and frees ready the moment
     * it ends, queued as a block (sim_ops.c, count_ready); the start where none are. */
    uint32_t dependents_ready;
    uint32_t stream_next;        /* the op after it on its class's stream; NO_OP after the last */
    union {                      /* by kind: */
        double duration_s;       /* compute, p2p and transfer ops */
        double latency_s;        /* collectives: the part contention does not stretch */
        double bytes;            /* alloc and free */
    };
    double transfer_s;           /* collectives: the bandwidth part at full busbw; 0 otherwise */
} SimOp;
G_STATIC_ASSERT(sizeof(SimOp) == 40);

#define NO_ROW UINT32_MAX
/* StreamState.next of a stream that ran all its ops, and SimOp.stream_next of its last op. */
#define NO_OP UINT32_MAX
/* slot_of of a communicator no collective uses. */
#define NO_FLOWS UINT32_MAX
/* Countdown.row before any rank counted the op's dependencies down, and after all reached 0
 * (rows are fewer: one for each op counting down at once, past a budget check). */
#define COUNTS_UNUSED (UINT32_MAX - 1)
#define COUNTS_DONE UINT32_MAX
/* Sim.fold_far's marks: sim_fold.c's far ops and sinks, which its window leaves out. */
#define SIM_FOLD_FAR 1
#define SIM_FOLD_SINK 2

/* Countdown.row of an op with over 255 dependencies: its counts are in pending_wide. */
#define COUNTS_WIDE (UINT32_MAX - 2)
/* Countdown.row of an op counting down where each stage is one simulated rank (Sim.solo):
 * the one count is Countdown.left, and no row is taken. */
#define COUNTS_SOLO (UINT32_MAX - 3)
/* Dependent.stream of an alloc or free. */
#define NOT_ON_STREAM UINT8_MAX

/* An op waiting for another: what releasing it needs, in one load (not the 48-byte SimOp). */
typedef struct {
    uint32_t op;
    uint16_t stage;  /* the rank class that runs it */
    uint8_t stream;  /* the stream it runs on, or NOT_ON_STREAM */
    /* Whether it counts its dependencies down: not an alloc or free with one dependency, which
     * is ready the moment that one ends (1,162 of gpt-1t's 2,067 ops, ZeRO-3), and which
     * nothing asks later whether it is ready (a stream op is asked when its stream reaches it). */
    uint8_t counted;
} Dependent;

/* Counting an op's dependencies down, side by side for the one access a rank-op makes: the
 * op's row of counts, rank r's count at Sim.rows[row * Sim.ranks + r] (or COUNTS_*), and how
 * many ranks have counted to 0 (or, where row is COUNTS_WIDE, which never counts rows, its row
 * of pending_wide). How many ranks run it is its stage's (Sim.stage_ranks). 8 bytes an op:
 * 16 with a 64-bit offset and the rank count, 17 MB more of fresh pages at 32,000 layers. */
typedef struct {
    uint32_t row;
    union {
        uint32_t zeroed;
        uint32_t wide_row;
        uint32_t left; /* COUNTS_SOLO: the dependencies left on the stage's one rank */
    };
} Countdown;
G_STATIC_ASSERT(sizeof(Countdown) == 8);


/* One collective in flight on one group (a group has at most one per stream: its members
 * reach a stream's collectives in the same order and none passes one before it ends). */
typedef struct {
    uint32_t member_start, count; /* simulated members: members[member_start ..][< count] */
    uint32_t op, arrived, version, touched;
    /* Explicit blocks: the world's groups it stands for (a row's communicator: one per row
     * of the block), which its events count as; 1 otherwise. */
    uint32_t copies;
    gboolean active;
    uint8_t per_row; /* its communicator's groups each lie in one row (Sim.per_row) */
    /* Its member alone (one rank a stage) and its group and stream the only ones to run
     * collectives over its link (Sim.link_alone): no other flow shares the link with it, so
     * start_flow and finish_flow keep no load for it (link_load, active_on_link). */
    uint8_t alone_on_link;
    double start_s;
    double transfer_from_s; /* when the transfer began, or was last brought up to date */
    double remaining_s;     /* transfer left, in seconds at the group's full busbw */
    double share;           /* fraction of the link it gets now: 1 / most flows on a member */
    double end_s;
    double inter_scale; /* network transfers take this many times longer (a slow node) */
} Flow;

/* Live bytes and their highest value, side by side: an alloc reads and writes both. */
typedef struct {
    double live, peak;
} LiveBytes;

/* A rank's memory: each category's live bytes, their total and the model states' (params ..
 * Adam v), each with its highest value, and what each category held when the total last rose
 * to its peak (the breakdown reported for the peak rank). */
typedef struct {
    LiveBytes category[ZP_MEM_N];
    LiveBytes total, states;
    double peak_breakdown_bytes[ZP_MEM_N];
} MemState;

/* The memory ops of one rank class in the order its first rank ran them (an op's place is
 * Sim.log_pos[op]), and the state after each: state[p] is a rank's memory after the first p
 * of them. Ranks in lockstep run their allocs and frees in one order, so a rank that has run
 * exactly the first p is at state[p] and keeps only p (Sim.mem_pos): its next memory op, if
 * it is the log's p-th, moves it to p + 1 without touching any bytes, and the first rank to
 * run one past the end appends it. A rank that runs another op copies state[p] out and keeps
 * its own MemState from then on: the same additions in the same order, so the same bits. */
typedef struct {
    MemState *state;
    uint32_t len;
} MemLog;

/* Sim.mem_pos of a rank with its own MemState, eager[mem_pos & ~MEM_EAGER]. */
#define MEM_EAGER 0x80000000u
/* Sim.log_pos of an op no rank has run yet: no mem_pos equals it (a log's places are below
 * it, an eager rank's mem_pos above). */
#define NOT_LOGGED (MEM_EAGER - 1)

/* A rank's clock and what account() reads: every compute op and collective touches these at
 * its start and its end, so they are kept together (the busy times and the running op apart)
 * in 64 bytes: the members of a collective are swept in order at each, 131,072 of them at the
 * largest. The counts are of ops in flight, at most one a stream. */
typedef struct {
    double mark_s; /* exposed communication is accounted up to here */
    double exposed_s, end_s;
    double cpu_optimizer_s, transfer_s; /* exposed CPU Adam and offload transfers */
    double flush_s; /* when its last compute op but the optimizer ended (a pipeline's flush) */
    /* GPU time counted more than once by the busy sums: (k - 1) x the time k GPU ops ran at
     * once (an unpack or a quantisation on a communication stream beside the compute). */
    double gpu_overlap_s;
    uint8_t compute_running, comm_active;
    uint8_t cpu_running, transfers_active;
    uint8_t unsettled; /* with contention: in Sim.unsettled, its compute to settle this instant */
    uint8_t computing; /* with contention: bit s, stream s runs a GPU compute op (running) */
} RankState;

/* With contention (Sim.contention > 1), the GPU compute op a stream of a rank runs, which a
 * collective starting or ending stretches or shrinks; nothing reads it otherwise, so it is kept
 * apart from RankState and allocated only then. One per stream: DeepSpeed's stage 3 unpacks a
 * gathered bucket on the gather stream while the compute stream runs a block. */
typedef struct {
    double end_s;   /* when it ends now; -1: the stream runs no GPU compute op */
    double start_s; /* when it started (its type's seconds are end - start: handle) */
    uint32_t op;
    uint8_t slowed; /* it runs slowed (a collective is in flight) */
    uint8_t started; /* it started this instant: its duration and end are set when it ends */
} RunningCompute;

/* A rank's busy times: touched when a compute op starts and when a collective ends. */
typedef struct {
    double busy_s[ZP_STREAM_N];
    double compute_s, optimizer_s;
    double alltoall_s; /* a mixture of experts' dispatch and combine (the all-to-alls, or
                        * the all-gather dispatcher's collectives), start to end */
} RankBusy;

typedef struct {
    uint32_t rank, op;
} ReadyOp;

/* A rank's streams: the op each runs next (NO_OP when done), and whether one is running
 * (together, one access). */
typedef struct {
    uint32_t next[ZP_STREAM_N];
    uint8_t busy[ZP_STREAM_N];
} StreamState;

typedef struct {
    const ZpSchedule *sched;
    uint32_t n_ops;
    SimOp *ops;
    Dependent *dependents;
    /* Rank classes: a pipeline stage's ranks run the ops with its stage, each class its own
     * streams, [class * ZP_STREAM_N + stream]: the first op of each (NO_OP for none; the rest
     * linked by SimOp.stream_next) and how many. One class without a pipeline. */
    uint32_t *stream_first;
    uint32_t *stream_len;
    uint32_t *stream_pos;         /* [op]: a stream op's place in its class's stream (0 off
                                   * the streams); NULL until sim_ops_stream_places */
    uint32_t *class_ops;          /* [class]: ops a rank of it runs */
    const double *class_state;    /* [class * ZP_MEM_N + c]: bytes held all step */

    /* Simulated ranks. Explicit: the world's, numbered as Megatron orders them: tp fastest,
     * then pipeline stage, then dp: rank = (dp_index * sim_pp + stage) * sim_mp + tp_index.
     * Folded: one per stage (sim_dp = sim_mp = 1), or with stragglers one per rank class
     * (sim_class), each standing for rank_count[r] world ranks from first_rank[r] on. */
    uint32_t ranks, sim_dp, sim_mp, sim_pp;
    uint32_t world;
    /* Explicit ranks stepped in blocks (below): [unit] how many ranks each stands for, which
     * its events count as (rank_count); NULL where each simulated rank counts once. */
    const uint32_t *weight;
    /* [communicator]: its groups each lie in one dp row, the sim_pp x sim_mp consecutive
     * ranks of one dp index (tp's, a pipeline's); a block's unit stands for one rank of each
     * row, and a flow for one group of each. */
    uint8_t per_row[ZP_SCHED_MAX_GROUPS];
    /* Blocks' order check (check_order): the last event taken, its time, whether it was a
     * flow of a communicator across rows, and whether two events broke the order. */
    double taken_s;
    uint32_t taken_made;
    uint8_t taken_across;
    gboolean order_broken;
    uint16_t *stage_of;    /* [rank]: its pipeline stage (the ops it runs) */
    uint32_t *first_rank, *rank_count;
    uint32_t *stage_ranks; /* [stage]: simulated ranks that run it */
    /* Rank classes: [rank * sim_pp + stage], the simulated rank of its pipeline neighbour
     * at that stage; NULL where that is rank + (stage difference) x sim_mp (every rank, and
     * blocks, whose units a row holds are numbered as its ranks are). */
    uint32_t *peer;
    /* The communicators (zp_sched_groups). slot_of[rank * n_groups + g]: the first of the
     * flow slots (one per stream) of rank's group of g; NO_FLOWS for a communicator no
     * collective uses. A slot's members are simulated ranks: its group's ranks (explicit),
     * the rank alone (one per stage), or the classes in its group (rank classes). */
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    uint32_t n_groups;
    uint32_t collective_groups; /* bit g: a collective runs over communicator g (sim_ops.c) */
    uint32_t *slot_of;
    uint32_t *members;
    /* [g * ZP_STREAM_N + stream]: whether g's collectives on that stream are the only
     * collectives over g's link (sim_ops.c, links_alone), or NULL. Read by
     * sim_ranks_build_flows for flows of one rank alone (Flow.alone_on_link). */
    uint8_t *link_alone;
    /* Dependencies not yet done, op-major so that a group's members, stepping in lockstep
     * through the same ops, count down adjacent bytes: [row * ranks + rank], one byte each.
     * An op holds a row only while some ranks have begun counting it down and others have not
     * finished (countdown[op]): ranks near lockstep need a few dozen rows,
     * not one per op, and those stay in cache. The few ops with over 255 dependencies keep a
     * row of four-byte counts in pending_wide for the whole run. */
    uint8_t *rows;
    Countdown *countdown;
    uint32_t *free_rows;
    uint32_t n_rows_made, cap_rows, n_free_rows;
    GArray *roots; /* uint32_t: the allocs and frees without dependencies, in op order */
    uint32_t *pending_wide;
    uint32_t n_wide_rows;
    /* Every stage is one simulated rank (folded runs without rank classes): an op's count
     * lives in its Countdown (COUNTS_SOLO), not in a row of one byte a rank that the same
     * event would take, fill and free (take_row and its memset, 2% of plan --3d gpt-1t). */
    gboolean solo;
    StreamState *stream;   /* [rank] */
    uint16_t *link_load;   /* [rank * SIM_LINK_N + link]: flows in flight */
    RankState *rank;
    RunningCompute *running; /* [rank * ZP_STREAM_N + stream], with contention only; NULL
                              * without */
    /* With contention: the ranks whose collectives or compute changed this instant, settled
     * at its end (RankState.unsettled), and whether they were listed out of rank order. */
    uint32_t *unsettled;
    uint32_t n_unsettled;
    gboolean unsettled_unordered;
    RankBusy *busy;
    /* [unit * 2 * SIM_OP_TYPES]: the unit's seconds of each op type, then its counts, added
     * as each compute op or collective ends (whole durations on the grid, all positive, so
     * any order of the additions, the fold's replay included, gives the same bits). */
    double *op_type_sums;
    /* Memory: [class] the memory ops its ranks ran in lockstep (MemLog), [rank] how far along
     * them a rank is, or MEM_EAGER and its own state's index in eager. */
    MemLog *mem_log;
    uint32_t *log_pos; /* [op]: its place in its class's log, or NOT_LOGGED */
    uint32_t *mem_pos;
    MemState *eager;
    uint32_t n_eager, cap_eager;
    double *op_start_s, *op_end_s, *op_ready_s;
    uint32_t *op_last_rank;
    /* A kept timeline of some ranks only (SimOptions.timeline_ranks): [unit] its row in the
     * op_* arrays, or NO_ROW; NULL where every unit has its row at its index. The reported
     * ranks asked for, ascending: timeline_ranks[n_timeline_ranks]. */
    uint32_t *timeline_row;
    uint32_t *timeline_ranks;
    uint32_t n_timeline_ranks;
    /* SimOptions.timeline_report_rank: units of different stages share timeline rows, so a
     * row holds the cells of a unit's own stage's ops alone. */
    gboolean timeline_shared;
    double *compute_scale; /* [rank]: slow ranks' factor, 1 elsewhere; NULL if none is slow */
    ZpCost cost;           /* how compute ops are costed (zp_cost), and their contention */
    double contention;     /* compute slows this many times while a collective runs (>= 1) */

    Flow *flows;
    uint32_t n_flows, epoch;
    uint32_t active_on_link[SIM_LINK_N]; /* flows transferring over each link class, all ranks */
    uint32_t *affected;
    uint32_t n_affected, affected_cap;

    Queue queue;
    ReadyOp *ready; /* zero-time ops waiting to run, FIFO: ready[ready_head .. ready_end) */
    size_t ready_head, ready_end, ready_cap;

    double mem_tolerance_bytes;
    uint64_t op_events, heap_events, state_bytes;
    /* Of op_events, those the fold's virtual periods counted (SimOptions.extend_micro_steps):
     * ops the schedule does not have, so the end's check that every op ran leaves them out. */
    uint64_t virtual_op_events;
    double stop_after_s; /* SimOptions.stop_after_s (0: run to the end) */
    double stopped_s;    /* when the first op ended past it (0: none has) */
    /* Folding whole periods of a pipeline's steady state (sim_fold.h), NULL where refused;
     * while fold_recording, the output sums' additions and the timeline's cells are noted;
     * fold_watch: the first and the last rank's compute stream's next op when sim_fold last
     * looked. */
    SimFold *fold;
    gboolean fold_recording;
    uint32_t fold_watch[2];
    uint32_t *fold_hi; /* [stage]: one past the last op that began counting down (take_row,
                        * or a wide op's first count: fold_began), the far ops aside */
    uint8_t *fold_far; /* [op]: SIM_FOLD_FAR or SIM_FOLD_SINK for sim_fold's far ops and
                        * sinks, else 0 (NULL where there are none) */
    /* SimOptions.extend_micro_steps: micro-steps of the steady state the schedule lacks,
     * which sim_fold.c counts as virtual periods in its jumps. */
    uint32_t extend_micro_steps;
    gboolean extend_or_stop; /* SimOptions.extend_or_stop */
    /* With extend_micro_steps: each op's figure and the sum it goes to (sim_sums.h), added at
     * the end in the order of the schedule the run stands for; NULL otherwise. */
    uint32_t *sum_slot;
    double *sum_figure;
    GError *error;
} Sim;

/* Every slowed rank's and node's factor, 1 elsewhere: rank by zplan's numbering, node by the
 * world's order (the plan's ZpRankOrder: slowdown_node). */
typedef struct {
    double *rank, *node; /* [world], [nodes] */
    uint32_t gpus_per_node;
    const ZpPlan *plan;
} Slowdowns;

/* The factor of the node zplan's rank `rank` sits on. */
static inline double slowdown_node(const Slowdowns *w, uint32_t rank)
{
    return w->node[zp_plan_placed_rank(w->plan, rank) / w->gpus_per_node];
}

/* The pipeline stage (rank class) of a simulated rank. */
static inline uint32_t rank_class(const Sim *sim, uint32_t rank)
{
    return sim->stage_of[rank];
}

/* How many ranks' events one of simulated rank u stands for. */
static inline uint32_t rank_weight(const Sim *sim, uint32_t u)
{
    return sim->weight ? sim->weight[u] : 1;
}

/* The world rank that messages and the result name for simulated rank u: a block's first. */
static inline uint32_t named_rank(const Sim *sim, uint32_t u)
{
    return sim->weight ? sim->first_rank[u] : u;
}

/* The ranks of a dp row: every stage's tp ranks of one dp index. */
static inline uint32_t row_ranks(const Sim *sim)
{
    return sim->sim_pp * sim->sim_mp;
}

/* The rank whose arrival starts flow f when unit u's does: across rows, u's last (its ranks
 * arrive row by row); in a row, u's rank there, its first in the unit's row
 * (sim_ranks_expand_blocks moves it to each row's). */
static inline uint32_t arriving_rank(const Sim *sim, uint32_t u, const Flow *f)
{
    if (!sim->weight)
        return u;
    return f->per_row ? sim->first_rank[u]
                      : sim->first_rank[u] + (sim->weight[u] - 1) * row_ranks(sim);
}

/* The ranks the result reports on: the world's for blocks, else the simulated ones. */
static inline uint32_t ranks_reported(const Sim *sim)
{
    return sim->weight ? sim->world : sim->ranks;
}

/* Where op o's dependents start: where the op before it's end (build_dependents places them
 * in op order). */
static inline uint32_t op_dependents_start(const Sim *sim, const SimOp *o)
{
    return o == sim->ops ? 0 : o[-1].dependents_end;
}

static inline gboolean op_on_stream(const SimOp *op)
{
    return op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_COLLECTIVE || op->kind == ZP_OP_P2P ||
           op->kind == ZP_OP_TRANSFER;
}

/* What a timed op of one rank keeps busy, for the breakdown: the GPU's kernels, the host's
 * CPU Adam, or an offload transfer. */
typedef enum { BUSY_GPU, BUSY_CPU, BUSY_TRANSFER } Busy;

static inline Busy busy_of(const SimOp *op)
{
    if (op->kind == ZP_OP_TRANSFER)
        return BUSY_TRANSFER;
    return op->sub == ZP_COMP_CPU_OPTIMIZER ? BUSY_CPU : BUSY_GPU;
}

static inline gboolean is_model_state(ZpMemCategory category)
{
    return category <= ZP_MEM_ADAM_V;
}

/* A rank's memory now: its class's logged state where it keeps to the log, else its own. */
static inline const MemState *mem_state(const Sim *sim, uint32_t rank)
{
    const uint32_t pos = sim->mem_pos[rank];
    return pos & MEM_EAGER ? &sim->eager[pos & ~MEM_EAGER]
                           : &sim->mem_log[rank_class(sim, rank)].state[pos];
}

static inline uint32_t pending_of(const Sim *sim, uint32_t op, uint32_t rank)
{
    const uint32_t row = sim->countdown[op].row;
    if (row < COUNTS_SOLO)
        return sim->rows[(size_t)row * sim->ranks + rank];
    return row == COUNTS_DONE     ? 0
           : row == COUNTS_SOLO   ? sim->countdown[op].left
           : row == COUNTS_UNUSED ? sim->ops[op].n_deps
                                    : sim->pending_wide[(size_t)sim->countdown[op].wide_row *
                                                            sim->ranks +
                                                        rank];
}

/* The rank of stage to_stage with rank's dp and tp index (rank runs stage): where another
 * stage's op waiting for a send runs. */
static inline uint32_t peer_rank(const Sim *sim, uint32_t rank, uint32_t stage,
                                 uint32_t to_stage)
{
    if (G_LIKELY(to_stage == stage))
        return rank;
    return sim->peer ? sim->peer[(size_t)rank * sim->sim_pp + to_stage]
                     : rank + (to_stage - stage) * sim->sim_mp;
}

/* sim_engine.c: a run-time array of *cap items of item_bytes doubled (16 items at first, *cap
 * updated): the new array, or NULL and sim->error, naming what, if it does not fit. */
void *sim_grow_state(Sim *sim, void *items, uint32_t *cap, size_t item_bytes, const char *what);

/* sim_engine.c: the event loop, seeded, run until the queue is empty, an error, the stop time or
 * (blocks) an order the units cannot stand for; sim_engine_step.c sets the run up around it. */
void sim_engine_loop(Sim *sim, const SimOptions *options);

/* sim_ops.c: durations, costs and totals of every op, its dependents and the classes'
 * streams; the result's per-rank sums come from here (sim_sums.h). */
gboolean sim_ops_build(Sim *sim, const ZpHw *hw, SimResult *result, GError **error);
/* Sim.stream_pos, made where it is NULL (after sim_ops_build): read only where a run did not
 * finish every op (sim_breakdown.c), so not made with the streams. */
void sim_ops_stream_places(Sim *sim);

/* sim_sums.c: the result's sums from the figures kept (Sim.sum_slot; nothing where none were),
 * in the order of the schedule the result stands for: where `extended` (the fold counted
 * virtual periods, Sim.extend_micro_steps), the longer one, with inserts[k].periods periods of
 * inserts[k].step ops (ops [at - step, at)) before op `at` (SimFoldInsert, sorted by at), and
 * its op count; else the schedule's own. */
void sim_sums_add_kept(const Sim *sim, SimResult *result, const GArray *inserts,
                       gboolean extended);

/* sim_memory.c: each class's log of memory states and its ranks' state at the start (FALSE
 * where it does not fit), and op i on rank's memory (FALSE and sim->error where a category
 * goes negative). */
gboolean sim_memory_alloc_logs(Sim *sim);
gboolean sim_memory_step(Sim *sim, uint32_t rank, uint32_t i);

/* sim_ranks.c: the simulated ranks (every rank, one a stage, rank classes or blocks), their
 * state, their groups' flow slots, stragglers' slowdowns, and a blocked run's timeline
 * expanded to every rank. */
gboolean sim_ranks_read_slowdowns(const SimOptions *o, const ZpPlan *plan, uint32_t world,
                                  uint32_t gpus_per_node, Slowdowns *w, GError **error);
void sim_ranks_build_units(Sim *sim, const Slowdowns *w, gboolean blocks, SimClasses *classes);
gboolean sim_ranks_alloc_state(Sim *sim, const SimOptions *options, GError **error);
void sim_ranks_gather_timeline(Sim *sim);
void sim_ranks_build_flows(Sim *sim, SimClasses *classes);
void sim_ranks_apply_slowdowns(Sim *sim, const Slowdowns *w);
void sim_ranks_expand_blocks(Sim *sim);

/* sim_breakdown.c: the ops the simulated ranks run in a full step; whether every rank ran all
 * of them and ended with the memory it began with; the result's times and peaks. */
uint64_t sim_breakdown_rank_ops(const Sim *sim);
gboolean sim_breakdown_check_end(Sim *sim, GError **error);
void sim_breakdown_fill(const Sim *sim, SimResult *result);

#endif
