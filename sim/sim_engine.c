/* sim_engine: the event loop; static facts are computed once per op and shared by all ranks,
 * and a collective is one queue event for its whole group, never one per ring step. */
#include "sim_engine.h"
#include "zp_cost.h"
#include "zp_offload.h"
#include "sim_class.h"
#include "sim_coll.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

/* How often (queue events as heap_events counts them, a unit's once per rank) the run tells
 * SimOptions.progress how far it is. */
#define PROGRESS_EVERY_EVENTS 4096

/* What the loop needs of an op, computed once and shared by all ranks. */
typedef struct {
    uint8_t kind, sub, stream, group;
    uint8_t link;                /* collectives: the link class they load */
    uint8_t wide;                /* it has over 255 dependencies */
    uint16_t stage;              /* the rank class (pipeline stage) that runs it */
    uint32_t n_deps;
    uint32_t dependents_start;   /* dependents[dependents_start .. dependents_end) */
    uint32_t dependents_end;
    /* dependents[dependents_start .. dependents_ready): allocs and frees ready the moment it
     * ends, queued as a block (split_ready_dependents); dependents_start where none are. */
    uint32_t dependents_ready;
    uint32_t stream_next;        /* the op after it on its class's stream; NO_OP after the last */
    uint32_t pending_row;        /* wide: its row of pending_wide; else NO_ROW */
    double duration_s;           /* compute and p2p ops */
    double latency_s;            /* collectives: the part contention does not stretch */
    double transfer_s;           /* collectives: the bandwidth part at full busbw */
    double bytes;                /* alloc and free */
} SimOp;

#define NO_ROW UINT32_MAX
/* StreamState.next of a stream that ran all its ops, and SimOp.stream_next of its last op. */
#define NO_OP UINT32_MAX
/* slot_of of a communicator no collective uses. */
#define NO_FLOWS UINT32_MAX
/* Countdown.first before any rank counted the op's dependencies down, and after all reached 0. */
#define COUNTS_UNUSED (UINT64_MAX - 1)
#define COUNTS_DONE UINT64_MAX
/* Countdown.first of an op with over 255 dependencies: its counts are in pending_wide. */
#define COUNTS_WIDE (UINT64_MAX - 2)
/* Dependent.stream of an alloc or free. */
#define NOT_ON_STREAM UINT8_MAX

/* An op waiting for another: what releasing it needs, in one load (not the 64-byte SimOp). */
typedef struct {
    uint32_t op;
    uint16_t stage;  /* the rank class that runs it */
    uint8_t stream;  /* the stream it runs on, or NOT_ON_STREAM */
    /* Whether it counts its dependencies down: not an alloc or free with one dependency, which
     * is ready the moment that one ends (1,162 of gpt-1t's 2,067 ops, ZeRO-3), and which
     * nothing asks later whether it is ready (a stream op is asked when its stream reaches it). */
    uint8_t counted;
} Dependent;

/* Counting an op's dependencies down, side by side for the one access a rank-op makes: where
 * the op's row of counts starts, rank r's count at Sim.rows[first + r] (or COUNTS_*), how many
 * ranks have counted to 0, and how many run it. */
typedef struct {
    uint64_t first;
    uint32_t zeroed, ranks;
} Countdown;

/* A queued event, 12 bytes and no pointer: the flow bit of id tells a flow's end (id the flow
 * slot, detail its version when queued) from an op's (id the rank, detail the op); made, the
 * instant it was queued at (Queue.instant), tells blocks' order check (check_order) which
 * events one instant queued. */
typedef struct {
    uint32_t id, detail, made;
} Event;

#define EVENT_FLOW 0x80000000u

/* Events of one time in the order they were queued. */
typedef struct {
    double time_s;
    uint64_t seq; /* among buckets of one time, the order they were made in */
    Event *items;
    uint32_t head, len, cap;
} Bucket;

/* The event queue, in (time, queue order) like one binary heap of events, but with the events
 * in FIFO buckets and only the buckets in the heap: ranks in lockstep queue thousands of
 * events at one time, and each goes to the bucket the last event went to, in O(1), when its
 * time is that bucket's. Any other bucket of that time was made earlier and was never pushed
 * to since, so it holds only earlier events: buckets taken by (time, seq) and each in order
 * give exactly the order of the one heap. */
typedef struct {
    Bucket *buckets;
    uint32_t n_buckets, cap_buckets;
    uint32_t *spare; /* buckets not in use (their items kept for reuse) */
    uint32_t n_spare;
    uint32_t *heap; /* bucket indices, a min-heap by (time_s, seq) */
    uint32_t heap_len;
    uint32_t last; /* the bucket the last event went to; UINT32_MAX after it emptied */
    uint32_t instant; /* the distinct times taken so far (0 while seeding): Event.made */
    uint64_t next_seq;
    size_t len; /* events queued */
} Queue;

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
} RankState;

/* With contention (Sim.contention > 1), the GPU compute op a stream of a rank runs, which a
 * collective starting or ending stretches or shrinks; nothing reads it otherwise, so it is kept
 * apart from RankState and allocated only then. One per stream: DeepSpeed's stage 3 unpacks a
 * gathered bucket on the gather stream while the compute stream runs a block. */
typedef struct {
    double end_s;   /* when it ends now; -1: the stream runs no GPU compute op */
    uint32_t op;
    uint8_t slowed; /* it runs slowed (a collective is in flight) */
} RunningCompute;

/* A rank's busy times: touched when a compute op starts and when a collective ends. */
typedef struct {
    double busy_s[ZP_STREAM_N];
    double compute_s, optimizer_s;
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
    uint32_t *stream_pos;         /* [op]: a stream op's place in its class's stream */
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
    uint32_t *slot_of;
    uint32_t *members;
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
    uint32_t *pending_wide;
    uint32_t n_wide_rows;
    StreamState *stream;   /* [rank] */
    uint16_t *link_load;   /* [rank * SIM_LINK_N + link]: flows in flight */
    RankState *rank;
    RunningCompute *running; /* [rank * ZP_STREAM_N + stream], with contention only; NULL
                              * without */
    RankBusy *busy;
    /* Memory: [class] the memory ops its ranks ran in lockstep (MemLog), [rank] how far along
     * them a rank is, or MEM_EAGER and its own state's index in eager. */
    MemLog *mem_log;
    uint32_t *log_pos; /* [op]: its place in its class's log, or NOT_LOGGED */
    uint32_t *mem_pos;
    MemState *eager;
    uint32_t n_eager, cap_eager;
    double *op_start_s, *op_end_s, *op_ready_s;
    uint32_t *op_last_rank;
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
    double stop_after_s; /* SimOptions.stop_after_s (0: run to the end) */
    double stopped_s;    /* when the first op ended past it (0: none has) */
    GError *error;
} Sim;

static const char *const mode_names[] = {"folded", "explicit"};

/* The pipeline stage (rank class) of a simulated rank. */
static uint32_t rank_class(const Sim *sim, uint32_t rank)
{
    return sim->stage_of[rank];
}

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
 * - Not with contention (an op table's factor: a collective that starts rescales its
 *   members' running compute, which depends on arrival order), nor where a communicator is
 *   neither of a row nor across rows: every rank then steps on its own. */

/* How many ranks' events one of simulated rank u stands for. */
static inline uint32_t rank_weight(const Sim *sim, uint32_t u)
{
    return sim->weight ? sim->weight[u] : 1;
}

/* The world rank that messages and the result name for simulated rank u: a block's first. */
static uint32_t named_rank(const Sim *sim, uint32_t u)
{
    return sim->weight ? sim->first_rank[u] : u;
}

/* The ranks of a dp row: every stage's tp ranks of one dp index. */
static uint32_t row_ranks(const Sim *sim)
{
    return sim->sim_pp * sim->sim_mp;
}

/* The rank whose arrival starts flow f when unit u's does: across rows, u's last (its ranks
 * arrive row by row); in a row, u's rank there, its first in the unit's row (expand_blocks
 * moves it to each row's). */
static uint32_t arriving_rank(const Sim *sim, uint32_t u, const Flow *f)
{
    if (!sim->weight)
        return u;
    return f->per_row ? sim->first_rank[u]
                      : sim->first_rank[u] + (sim->weight[u] - 1) * row_ranks(sim);
}

/* The ranks the result reports on: the world's for blocks, else the simulated ones. */
static uint32_t ranks_reported(const Sim *sim)
{
    return sim->weight ? sim->world : sim->ranks;
}

const char *sim_mode_name(SimMode mode)
{
    return mode_names[mode];
}

/* ---- the event queue ---- */

static gboolean bucket_before(const Queue *q, uint32_t a, uint32_t b)
{
    const Bucket *x = &q->buckets[a], *y = &q->buckets[b];
    return x->time_s < y->time_s || (x->time_s == y->time_s && x->seq < y->seq);
}

static void queue_sift_down(Queue *q, size_t i)
{
    const uint32_t moving = q->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= q->heap_len)
            break;
        if (child + 1 < q->heap_len && bucket_before(q, q->heap[child + 1], q->heap[child]))
            child++;
        if (!bucket_before(q, q->heap[child], moving))
            break;
        q->heap[i] = q->heap[child];
        i = child;
    }
    q->heap[i] = moving;
}

/* A bucket for time_s, newest of its time, in the heap. */
static uint32_t queue_new_bucket(Queue *q, double time_s)
{
    uint32_t b;
    if (q->n_spare > 0) {
        b = q->spare[--q->n_spare];
    } else {
        if (q->n_buckets == q->cap_buckets) {
            q->cap_buckets = q->cap_buckets ? 2 * q->cap_buckets : 64;
            q->buckets = g_renew(Bucket, q->buckets, q->cap_buckets);
            q->spare = g_renew(uint32_t, q->spare, q->cap_buckets);
            q->heap = g_renew(uint32_t, q->heap, q->cap_buckets);
        }
        b = q->n_buckets++;
        q->buckets[b] = (Bucket){0};
    }
    Bucket *bucket = &q->buckets[b];
    bucket->time_s = time_s;
    bucket->seq = q->next_seq++;
    bucket->head = bucket->len = 0;
    size_t i = q->heap_len++;
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (!bucket_before(q, b, q->heap[parent]))
            break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = b;
    return b;
}

/* The bucket for an event at time_s with room for it: the last one, or a new one (apart from
 * queue_push, whose common case, the last bucket, stays small enough to inline). */
G_NO_INLINE static Bucket *queue_bucket_for(Queue *q, double time_s)
{
    uint32_t b = q->last;
    if (b == UINT32_MAX || q->buckets[b].time_s != time_s)
        b = q->last = queue_new_bucket(q, time_s);
    Bucket *bucket = &q->buckets[b];
    if (bucket->len == bucket->cap) {
        bucket->cap = bucket->cap ? 2 * bucket->cap : 16;
        bucket->items = g_renew(Event, bucket->items, bucket->cap);
    }
    return bucket;
}

G_ALWAYS_INLINE static inline void queue_push(Queue *q, double time_s, uint32_t id,
                                              uint32_t detail)
{
    Bucket *bucket = q->last == UINT32_MAX ? NULL : &q->buckets[q->last];
    if (!bucket || bucket->time_s != time_s || bucket->len == bucket->cap)
        bucket = queue_bucket_for(q, time_s);
    bucket->items[bucket->len++] = (Event){id, detail, q->instant};
    q->len++;
}

/* The earliest event; the queue must not be empty. */
static Event queue_pop(Queue *q, double *time_s)
{
    const uint32_t b = q->heap[0];
    Bucket *bucket = &q->buckets[b];
    const Event e = bucket->items[bucket->head++];
    *time_s = bucket->time_s;
    q->len--;
    if (bucket->head == bucket->len) {
        q->heap[0] = q->heap[--q->heap_len];
        if (q->heap_len > 0)
            queue_sift_down(q, 0);
        q->spare[q->n_spare++] = b;
        if (q->last == b)
            q->last = UINT32_MAX;
    }
    return e;
}

static void queue_clear(Queue *q)
{
    for (uint32_t b = 0; b < q->n_buckets; b++)
        g_free(q->buckets[b].items);
    g_free(q->buckets);
    g_free(q->spare);
    g_free(q->heap);
}

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
    if (!zp_attention_fused(plan->attention))
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

static gboolean op_on_stream(const SimOp *op)
{
    return op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_COLLECTIVE || op->kind == ZP_OP_P2P ||
           op->kind == ZP_OP_TRANSFER;
}

/* What a timed op of one rank keeps busy, for the breakdown: the GPU's kernels, the host's
 * CPU Adam, or an offload transfer. */
typedef enum { BUSY_GPU, BUSY_CPU, BUSY_TRANSFER } Busy;

static Busy busy_of(const SimOp *op)
{
    if (op->kind == ZP_OP_TRANSFER)
        return BUSY_TRANSFER;
    return op->sub == ZP_COMP_CPU_OPTIMIZER ? BUSY_CPU : BUSY_GPU;
}

static gboolean is_model_state(ZpMemCategory category)
{
    return category <= ZP_MEM_ADAM_V;
}

static gboolean fail_op(GError **error, uint32_t i, const char *what)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "schedule: op %u: %s", i, what);
    return FALSE;
}

/* Every field the loop indexes by must be in range, or the loop would read out of bounds. */
static gboolean check_op(const ZpSchedule *s, uint32_t n_groups, uint32_t i, GError **error)
{
    const ZpOp *op = zp_sched_op(s, i);
    static const uint8_t sub_limit[] = {
        [ZP_OP_COMPUTE] = ZP_COMP_N, [ZP_OP_COLLECTIVE] = ZP_COLL_N,
        [ZP_OP_ALLOC] = ZP_MEM_N, [ZP_OP_FREE] = ZP_MEM_N, [ZP_OP_P2P] = ZP_P2P_N,
        [ZP_OP_TRANSFER] = ZP_XFER_N};
    if (op->kind > ZP_OP_TRANSFER)
        return fail_op(error, i, "unknown kind");
    if (op->stage >= (uint32_t)MAX(s->stages, 1) || op->peer >= (uint32_t)MAX(s->stages, 1))
        return fail_op(error, i, "stage or peer beyond the schedule's pipeline stages");
    if (op->sub >= sub_limit[op->kind])
        return fail_op(error, i, "unknown compute, collective, p2p, transfer or memory category");
    if ((op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_COLLECTIVE || op->kind == ZP_OP_P2P ||
         op->kind == ZP_OP_TRANSFER) && op->stream >= ZP_STREAM_N)
        return fail_op(error, i, "unknown stream");
    if (op->kind == ZP_OP_COLLECTIVE && op->group >= n_groups)
        return fail_op(error, i, "unknown group");
    if (!(op->flops >= 0 && op->gemm_flops >= 0 && op->mem_bytes >= 0 && op->bytes >= 0) ||
        !isfinite(op->flops + op->gemm_flops + op->mem_bytes + op->bytes))
        return fail_op(error, i, "FLOPs and bytes must be finite and not negative");
    if (!(op->attn_flops >= 0 && op->attn_flops <= op->flops) ||
        (op->attn_flops > 0 && !zp_attention_fused(s->plan.attention)))
        return fail_op(error, i, "attn_flops must be part of flops, and only with a fused kernel");
    if ((uint64_t)op->dep_start + op->n_deps > s->deps->len)
        return fail_op(error, i, "dependencies run past the dependency list");
    const uint32_t *deps = zp_sched_deps(s, op);
    for (uint32_t d = 0; d < op->n_deps; d++)
        if (deps[d] >= s->ops->len)
            return fail_op(error, i, "depends on an op that does not exist");
    return TRUE;
}

static void build_dependents(Sim *sim)
{
    const ZpSchedule *s = sim->sched;
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        const uint32_t *deps = zp_sched_deps(s, op);
        for (uint32_t d = 0; d < op->n_deps; d++)
            sim->ops[deps[d]].dependents_end++;
    }
    uint32_t offset = 0;
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const uint32_t count = sim->ops[i].dependents_end;
        sim->ops[i].dependents_start = sim->ops[i].dependents_end = offset;
        offset += count;
    }
    sim->dependents = g_new(Dependent, offset ? offset : 1);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        const uint32_t *deps = zp_sched_deps(s, op);
        const SimOp *o = &sim->ops[i];
        for (uint32_t d = 0; d < op->n_deps; d++)
            sim->dependents[sim->ops[deps[d]].dependents_end++] = (Dependent){
                .op = i, .stage = o->stage, .stream = op_on_stream(o) ? o->stream : NOT_ON_STREAM,
                .counted = op_on_stream(o) || o->n_deps > 1};
    }
}

/* An alloc or free that is ready the moment the op it depends on ends, on the same rank. */
static gboolean ready_at_once(const Dependent *d, uint16_t stage)
{
    return !d->counted && d->stage == stage;
}

/* Moves the allocs and frees ready at once to the front of each op's dependents, each part in
 * its order, where that changes no order the run can see: where all the op's dependents that
 * release an alloc or free are of that kind. Releasing the op then queues the same allocs and
 * frees in the same order (as a block, before it counts down the rest), and the rest start
 * in their order as before: queueing one touches nothing that counting down or starting an
 * op reads, nor the other way round. */
static void split_ready_dependents(Sim *sim)
{
    uint32_t most = 1;
    for (uint32_t i = 0; i < sim->n_ops; i++)
        most = MAX(most, sim->ops[i].dependents_end - sim->ops[i].dependents_start);
    Dependent *scratch = g_new(Dependent, most);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        SimOp *o = &sim->ops[i];
        Dependent *d = &sim->dependents[o->dependents_start];
        uint32_t n = o->dependents_end - o->dependents_start, n_ready = 0, n_rest = 0;
        o->dependents_ready = o->dependents_start;
        for (uint32_t k = 0; k < n; k++)
            if (d[k].stream == NOT_ON_STREAM && !ready_at_once(&d[k], o->stage))
                n = 0; /* a counted or another stage's alloc or free: no block */
        for (uint32_t k = 0; k < n; k++)
            if (ready_at_once(&d[k], o->stage))
                d[n_ready++] = d[k];
            else
                scratch[n_rest++] = d[k];
        memcpy(&d[n_ready], scratch, n_rest * sizeof *d);
        o->dependents_ready += n_ready;
    }
    g_free(scratch);
}

/* Each class's streams, linked in op order: an op's stream_pos is its place in its own
 * class's stream, SimOp.stream_next the op after it there. */
static void build_streams(Sim *sim)
{
    const uint32_t lists = sim->sim_pp * ZP_STREAM_N;
    uint32_t *last = g_new(uint32_t, lists);
    sim->stream_first = g_new(uint32_t, lists);
    sim->stream_len = g_new0(uint32_t, lists);
    sim->stream_pos = g_new0(uint32_t, MAX(sim->n_ops, 1));
    sim->class_ops = g_new0(uint32_t, sim->sim_pp);
    for (uint32_t l = 0; l < lists; l++)
        sim->stream_first[l] = last[l] = NO_OP;
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        SimOp *o = &sim->ops[i];
        sim->class_ops[o->stage]++;
        o->stream_next = NO_OP;
        if (!op_on_stream(o))
            continue;
        const uint32_t l = o->stage * ZP_STREAM_N + o->stream;
        sim->stream_pos[i] = sim->stream_len[l]++;
        if (last[l] == NO_OP)
            sim->stream_first[l] = i;
        else
            sim->ops[last[l]].stream_next = i;
        last[l] = i;
    }
    g_free(last);
}

/* A pipeline send's time: it goes from the stage's rank to the neighbour's, tp x stage
 * distance ranks away (Megatron's order), over NVLink when both sit on one node and else over
 * the sender's share of the node's NICs (every GPU of a node sends to its peer at once), at
 * the bus bandwidth NCCL reaches there. */
static double p2p_time_s(const Sim *sim, const ZpHw *hw, const ZpOp *op)
{
    const int64_t mp = sim->sched->plan.mp, gpn = hw->gpus_per_node;
    const gboolean same_node = op->stage * mp / gpn == op->peer * mp / gpn;
    if (same_node)
        return hw->intra_node_latency_s + op->bytes / zp_hw_intra_bus_bytes_per_s(hw);
    return hw->inter_node_latency_s + op->bytes / (zp_hw_inter_bus_bytes_per_s(hw) / gpn);
}

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

/* Durations, costs and totals of every op; the result's per-rank sums come from here. */
static gboolean build_ops(Sim *sim, const ZpHw *hw, SimResult *result, GError **error)
{
    const ZpSchedule *s = sim->sched;
    if (!zp_cost_init(&sim->cost, hw, &s->model, &s->plan, error))
        return FALSE;
    g_strlcpy(result->cost_model, sim->cost.why, sizeof result->cost_model);
    sim->contention = zp_cost_contention(&sim->cost, 1);
    SimCollGroup groups[ZP_SCHED_MAX_GROUPS];
    /* Each communicator's last collective costed, by kind: a step repeats the same sizes
     * (every tensor-parallel all-reduce is b s h), so most costs are the one before. */
    struct {
        double bytes;
        SimCollCost cost;
    } last_cost[ZP_SCHED_MAX_GROUPS][ZP_COLL_N];
    for (uint32_t g = 0; g < sim->n_groups; g++) {
        groups[g] = sim_coll_group_placed(hw, s->world, sim->groups[g].ranks,
                                          sim->groups[g].stride);
        for (int k = 0; k < ZP_COLL_N; k++)
            last_cost[g][k].bytes = -1;
    }
    double *stage_flops = g_new0(double, sim->sim_pp);
    double largest_buffer = 0, states = 0;
    const int ranks_per_node = MIN(hw->gpus_per_node, s->world);
    const gboolean in_line = zp_cost_cpu_backend(hw);
    if (in_line)
        g_strlcpy(result->collective_model, "in line with compute, one op of a rank at a time "
                  "(the profile's op table was measured on zreal's cpu backend)",
                  sizeof result->collective_model);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        if (!check_op(s, sim->n_groups, i, error)) {
            g_free(stage_flops);
            return FALSE;
        }
        const ZpOp *op = zp_sched_op(s, i);
        SimOp *o = &sim->ops[i];
        /* A backend that runs a rank's ops in line runs them on one stream; a pipeline send
         * stays on its own (it is posted, and the stage goes on). */
        const gboolean in_line_op = in_line && op->kind != ZP_OP_P2P;
        *o = (SimOp){.kind = op->kind, .sub = op->sub,
                     .stream = in_line_op ? ZP_STREAM_COMPUTE : op->stream,
                     .group = op->group, .stage = op->stage, .n_deps = op->n_deps,
                     .bytes = op->bytes};
        if (op->kind == ZP_OP_TRANSFER) {
            /* The host link is each GPU's own; the node's NVMe is shared by its ranks, which
             * move their slices at the same time (the schedule is the same on every rank). */
            o->duration_s = op->bytes / zp_offload_link_bytes_per_s(hw, op->sub, ranks_per_node);
            result->offload_bytes[op->sub] += op->bytes;
        } else if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_CPU_OPTIMIZER) {
            if (!zp_offload_cpu_time_s(hw, op->mem_bytes, ranks_per_node, &o->duration_s,
                                       error)) {
                g_free(stage_flops);
                return FALSE;
            }
        } else if (op->kind == ZP_OP_COMPUTE) {
            /* Pa+cpu's host_copy: its bytes over the host link (0 for other ops). */
            const double host_s = op->bytes > 0 && hw->host_link_bytes_per_s > 0
                                      ? op->bytes / hw->host_link_bytes_per_s
                                      : 0.0;
            o->duration_s = host_s + zp_cost_op_s(&sim->cost, op->sub, zp_op_module(op),
                                                  op->flops, op->gemm_flops, op->attn_flops,
                                                  op->mem_bytes);
            if (op->sub == ZP_COMP_RECOMPUTE)
                result->recompute_flops += op->flops;
            else if (op->sub != ZP_COMP_OPTIMIZER)
                stage_flops[op->stage] += op->flops;
        } else if (op->kind == ZP_OP_COLLECTIVE) {
            const SimCollGroup *g = &groups[op->group];
            if (last_cost[op->group][op->sub].bytes != op->bytes)
                last_cost[op->group][op->sub].cost = sim_coll_cost(op->sub, op->bytes, g);
            last_cost[op->group][op->sub].bytes = op->bytes;
            const SimCollCost cost = last_cost[op->group][op->sub].cost;
            /* With an op table (the measured backend's), the rank's own copies around the
             * collective, which it pays even alone (zp_cost_coll_copy_bytes). */
            o->latency_s = cost.latency_s + zp_cost_coll_copy_s(&sim->cost, op,
                                                                s->plan.zero.stage, g->ranks);
            o->transfer_s = cost.transfer_s;
            o->link = g->bottleneck;
            const double sent = sim_coll_bytes_sent(op->sub, op->bytes, g->ranks);
            if (op->group < ZP_GROUP_N)
                result->stage_comm_bytes[op->stage * ZP_GROUP_N + op->group] += sent;
            else /* a schedule file's own communicator: files hold no pipeline */
                result->comm_bytes[op->group] += sent;
        } else if (op->kind == ZP_OP_P2P) {
            o->duration_s = p2p_time_s(sim, hw, op);
            result->stage_comm_bytes[op->stage * ZP_GROUP_N + ZP_GROUP_PP] += op->bytes;
        } else {
            largest_buffer = MAX(largest_buffer, op->bytes);
        }
    }
    for (uint32_t g = 0; g < sim->n_groups; g++) {
        unsigned kinds = 0; /* the kinds costed on it: those whose last size was set */
        for (int k = 0; k < ZP_COLL_N; k++)
            kinds |= (unsigned)(last_cost[g][k].bytes >= 0) << k;
        describe_group(result, sim->groups[g].name, &groups[g], kinds);
    }
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        SimOp *o = &sim->ops[i];
        o->wide = o->n_deps > UINT8_MAX;
        o->pending_row = o->wide ? sim->n_wide_rows++ : NO_ROW;
    }
    /* Per rank: FLOPs averaged over the stages (MFU is the mean GPU's), the bytes of the
     * stage that sends most (all of them without a pipeline). */
    result->recompute_flops /= sim->sim_pp;
    for (uint32_t k = 0; k < sim->sim_pp; k++) {
        result->model_flops += stage_flops[k] / sim->sim_pp;
        for (int g = 0; g < ZP_GROUP_N; g++)
            result->comm_bytes[g] =
                MAX(result->comm_bytes[g], result->stage_comm_bytes[k * ZP_GROUP_N + g]);
    }
    g_free(stage_flops);
    for (uint32_t k = 0; k < sim->sim_pp; k++) {
        double stage_states = 0;
        for (int c = 0; c < ZP_MEM_N; c++)
            stage_states += sim->class_state[k * ZP_MEM_N + c];
        states = MAX(states, stage_states);
    }
    /* Live bytes are sums of doubles (8-bit Adam makes them fractional), so "negative" and
     * "back to the start" allow rounding relative to the largest amounts involved. */
    sim->mem_tolerance_bytes = 1e-9 * (states + largest_buffer) + 1.0;
    build_dependents(sim);
    split_ready_dependents(sim);
    build_streams(sim);
    return TRUE;
}

/* ---- per-rank state ---- */

/* A rank's memory now: its class's logged state where it keeps to the log, else its own. */
static const MemState *mem_state(const Sim *sim, uint32_t rank)
{
    const uint32_t pos = sim->mem_pos[rank];
    return pos & MEM_EAGER ? &sim->eager[pos & ~MEM_EAGER]
                           : &sim->mem_log[rank_class(sim, rank)].state[pos];
}

/* Each class's log, room for every memory op of the class, and its ranks' state at the start:
 * what the schedule says they hold all step. */
static gboolean alloc_mem_logs(Sim *sim)
{
    sim->mem_log = g_new0(MemLog, sim->sim_pp);
    sim->log_pos = g_new(uint32_t, MAX(sim->n_ops, 1));
    sim->state_bytes += (uint64_t)sim->n_ops * sizeof *sim->log_pos;
    uint32_t *memory_ops = g_new0(uint32_t, sim->sim_pp);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        memory_ops[sim->ops[i].stage] += !op_on_stream(&sim->ops[i]);
        sim->log_pos[i] = NOT_LOGGED;
    }
    gboolean ok = TRUE;
    for (uint32_t k = 0; k < sim->sim_pp; k++) {
        MemLog *log = &sim->mem_log[k];
        log->state = g_try_new(MemState, memory_ops[k] + 1);
        ok = ok && log->state;
        if (!ok)
            break;
        sim->state_bytes += memory_ops[k] * sizeof(MemState);
        MemState *m = &log->state[0];
        const double *state = &sim->class_state[k * ZP_MEM_N];
        *m = (MemState){0};
        for (int c = 0; c < ZP_MEM_N; c++) {
            m->total.live += state[c];
            if (is_model_state(c))
                m->states.live += state[c];
            m->category[c] = (LiveBytes){state[c], state[c]};
            m->peak_breakdown_bytes[c] = state[c];
        }
        m->total.peak = m->total.live;
        m->states.peak = m->states.live;
    }
    g_free(memory_ops);
    return ok;
}

static gboolean alloc_rank_state(Sim *sim, gboolean timeline, GError **error)
{
    /* The timeline has a row per rank reported (blocks fill their unit's, expand_blocks the rest). */
    const size_t per_op = (size_t)ranks_reported(sim) * sim->n_ops;
    sim->countdown = g_try_new(Countdown, MAX(sim->n_ops, 1));
    sim->pending_wide = g_try_new(uint32_t, MAX((size_t)sim->n_wide_rows * sim->ranks, 1));
    sim->stream = g_try_new0(StreamState, sim->ranks);
    sim->link_load = g_try_new0(uint16_t, (size_t)sim->ranks * SIM_LINK_N);
    sim->rank = g_try_new0(RankState, sim->ranks);
    if (sim->contention > 1) {
        sim->running = g_try_new0(RunningCompute, (size_t)sim->ranks * ZP_STREAM_N);
        for (size_t r = 0; sim->running && r < (size_t)sim->ranks * ZP_STREAM_N; r++)
            sim->running[r].end_s = -1;
    }
    sim->busy = g_try_new0(RankBusy, sim->ranks);
    sim->mem_pos = g_try_new0(uint32_t, sim->ranks);
    gboolean ok = sim->countdown && sim->pending_wide && sim->stream && sim->link_load &&
                  sim->rank && (sim->running || sim->contention == 1) && sim->busy &&
                  sim->mem_pos && alloc_mem_logs(sim);
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
                    ranks_reported(sim), sim->n_ops, timeline ? " with a timeline" : "");
        return FALSE;
    }
    sim->state_bytes += (size_t)sim->ranks * sim->n_wide_rows * sizeof *sim->pending_wide +
                       (size_t)sim->n_ops * sizeof *sim->countdown +
                       per_op * (timeline ? 3 * sizeof(double) + sizeof(uint32_t) : 0) +
                       (size_t)sim->ranks * (sizeof *sim->stream +
                                             SIM_LINK_N * sizeof *sim->link_load +
                                             sizeof *sim->rank + sizeof *sim->busy +
                                             (sim->running ? ZP_STREAM_N * sizeof *sim->running
                                                           : 0) +
                                             sizeof *sim->mem_pos);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const SimOp *o = &sim->ops[i];
        const size_t row = (size_t)o->pending_row * sim->ranks;
        sim->countdown[i] = (Countdown){
            .first = o->n_deps == 0 ? COUNTS_DONE : o->wide ? COUNTS_WIDE : COUNTS_UNUSED,
            .ranks = sim->stage_ranks[o->stage]};
        for (uint32_t r = 0; o->wide && r < sim->ranks; r++)
            sim->pending_wide[row + r] = o->n_deps;
    }
    for (uint32_t r = 0; r < sim->ranks; r++)
        for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++)
            sim->stream[r].next[stream] =
                sim->stream_first[rank_class(sim, r) * ZP_STREAM_N + stream];
    return TRUE;
}

/* ---- simulated ranks and their groups ---- */

/* Every slowed rank's and node's factor, 1 elsewhere. */
typedef struct {
    double *rank, *node; /* [world], [nodes] */
    uint32_t gpus_per_node;
} Slowdowns;

static gboolean read_slowdowns(const SimOptions *o, uint32_t world, uint32_t gpus_per_node,
                               Slowdowns *w, GError **error)
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
                     .gpus_per_node = gpus_per_node};
    for (uint32_t r = 0; r < world; r++)
        w->rank[r] = 1.0;
    for (uint32_t n = 0; n < nodes; n++)
        w->node[n] = 1.0;
    for (uint32_t k = 0; k < o->n_slow_ranks; k++)
        w->rank[o->slow_ranks[k].index] =
            MAX(w->rank[o->slow_ranks[k].index], o->slow_ranks[k].factor);
    for (uint32_t k = 0; k < o->n_slow_nodes; k++)
        w->node[o->slow_nodes[k].index] =
            MAX(w->node[o->slow_nodes[k].index], o->slow_nodes[k].factor);
    return TRUE;
}

/* The communicators whose groups a rank waits on: those its collectives run over, and the
 * pipeline's (a stage's sends) with more than one stage. */
static void groups_used(const Sim *sim, gboolean used[ZP_SCHED_MAX_GROUPS])
{
    for (uint32_t g = 0; g < ZP_SCHED_MAX_GROUPS; g++)
        used[g] = FALSE;
    for (uint32_t i = 0; i < sim->n_ops; i++)
        if (sim->ops[i].kind == ZP_OP_COLLECTIVE)
            used[sim->ops[i].group] = TRUE;
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
        memcpy(&key[3], w->node ? &w->node[r / w->gpus_per_node] : &none, sizeof(double));
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
        const uint32_t ranks = (uint32_t)sim->groups[g].ranks;
        const uint32_t stride = (uint32_t)sim->groups[g].stride;
        sim->per_row[g] = row_ranks(sim) % (ranks * stride) == 0;
        if (used[g] && !sim->per_row[g]) {
            fits = fits && stride % row_ranks(sim) == 0;
            across[(*n_across)++] = sim->groups[g];
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
static void build_units(Sim *sim, const Slowdowns *w, gboolean blocks, SimClasses *classes)
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
    const uint32_t ranks = (uint32_t)sim->groups[g].ranks, stride = (uint32_t)sim->groups[g].stride;
    if (sim->ranks < world && !classes->of_rank) {
        for (uint32_t u = 0; u < sim->ranks; u++)
            sim->slot_of[(size_t)u * sim->n_groups + g] =
                add_flow_slots(flows, members, &u, 1, FALSE);
        return;
    }
    SimInterner sets;
    sim_interner_init(&sets);
    uint32_t *base = g_new(uint32_t, world / ranks);
    for (uint32_t k = 0; k < world / ranks; k++) {
        const uint32_t first = sim_class_group_first(ranks, stride, k);
        uint32_t n = ranks, id = k;
        gboolean fresh = TRUE;
        if (classes->of_rank) {
            const uint32_t known = sim_interner_count(&sets);
            n = sim_class_group(classes, &sim->groups[g], first, scratch);
            id = sim_interner_id(&sets, scratch, n);
            fresh = id == known;
        } else {
            for (uint32_t i = 0; i < ranks; i++)
                scratch[i] = first + i * stride;
        }
        if (fresh)
            base[id] = add_flow_slots(flows, members, scratch, n, sim->per_row[g]);
        else if (sim->weight) /* a block's row: one more group its flow stands for */
            for (uint32_t stream = 0; stream < ZP_STREAM_N; stream++)
                g_array_index(flows, Flow, base[id] + stream).copies++;
        for (uint32_t i = 0, r = first; i < ranks; i++, r += stride)
            sim->slot_of[(size_t)(classes->of_rank ? classes->of_rank[r] : r) * sim->n_groups +
                         g] = base[id];
    }
    g_free(base);
    sim_interner_clear(&sets);
}

/* Flow slots of every communicator that runs collectives: tp without tensor parallelism or pp
 * (whose sends are p2p ops) would otherwise be a slot per rank and stream, written and
 * resident for nothing (160 MB at 131,072 ranks). */
static void build_flows(Sim *sim, SimClasses *classes)
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
static void apply_slowdowns(Sim *sim, const Slowdowns *w)
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
            f->inter_scale = MAX(f->inter_scale, w->node[first / w->gpus_per_node]);
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

static inline uint32_t flow_slot(const Sim *sim, uint32_t group, uint32_t rank, uint32_t stream)
{
    return sim->slot_of[(size_t)rank * sim->n_groups + group] + stream;
}

static inline uint32_t pending_of(const Sim *sim, uint32_t op, uint32_t rank)
{
    const uint64_t first = sim->countdown[op].first;
    if (first < COUNTS_WIDE)
        return sim->rows[first + rank];
    const SimOp *o = &sim->ops[op];
    return first == COUNTS_DONE     ? 0
           : first == COUNTS_UNUSED ? o->n_deps
                                    : sim->pending_wide[(size_t)o->pending_row * sim->ranks + rank];
}

/* A run-time array of *cap items of item_bytes (rank rows, ranks' states) doubled (16 items at
 * first, *cap updated): the new array, or NULL and sim->error, naming what, if it does not fit. */
static void *grow_state(Sim *sim, void *items, uint32_t *cap, size_t item_bytes,
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

/* A row of counts for `op`, every rank's at n_deps, from the free rows or a new one. */
G_NO_INLINE static gboolean take_row(Sim *sim, uint32_t op)
{
    uint32_t row;
    if (sim->n_free_rows > 0) {
        row = sim->free_rows[--sim->n_free_rows];
    } else {
        if (sim->n_rows_made == sim->cap_rows) {
            uint8_t *rows = grow_state(sim, sim->rows, &sim->cap_rows, sim->ranks,
                                       "rows of dependency counts");
            if (!rows)
                return FALSE;
            sim->rows = rows;
            sim->free_rows = g_renew(uint32_t, sim->free_rows, sim->cap_rows);
        }
        row = sim->n_rows_made++;
    }
    memset(sim->rows + (size_t)row * sim->ranks, (int)sim->ops[op].n_deps, sim->ranks);
    sim->countdown[op].first = (uint64_t)row * sim->ranks;
    return TRUE;
}

/* One dependency of `op` done on `rank`; TRUE when it was the last. */
static inline gboolean pending_done(Sim *sim, uint32_t op, uint32_t rank)
{
    Countdown *c = &sim->countdown[op];
    if (c->first >= COUNTS_WIDE) {
        if (c->first == COUNTS_WIDE)
            return --sim->pending_wide[(size_t)sim->ops[op].pending_row * sim->ranks + rank] == 0;
        if (!take_row(sim, op))
            return FALSE;
    }
    if (--sim->rows[c->first + rank] != 0)
        return FALSE;
    if (++c->zeroed == c->ranks) { /* no rank needs it */
        sim->free_rows[sim->n_free_rows++] = (uint32_t)(c->first / sim->ranks);
        c->first = COUNTS_DONE;
    }
    return TRUE;
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

/* Exposed communication: time no compute op runs while a collective of the rank is in flight.
 * Called before either count changes. */
static void account(RankState *rs, double now_s)
{
    /* What the GPU waits for when no kernel runs, in this order: a collective, CPU Adam, an
     * offload transfer. */
    const double dt = now_s - rs->mark_s;
    if (rs->compute_running > 1)
        rs->gpu_overlap_s += (rs->compute_running - 1) * dt;
    if (rs->compute_running == 0) {
        if (rs->comm_active > 0)
            rs->exposed_s += dt;
        else if (rs->cpu_running > 0)
            rs->cpu_optimizer_s += dt;
        else if (rs->transfers_active > 0)
            rs->transfer_s += dt;
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
    const double end_s = f->transfer_from_s + f->remaining_s / f->share;
    if (end_s != f->end_s) {
        f->end_s = end_s;
        queue_push(&sim->queue, end_s, EVENT_FLOW | slot, ++f->version);
    }
}

/* Reshares every flow in flight on the same link at any member of `changed`. */
static void reshare_neighbours(Sim *sim, const Flow *changed, uint8_t link, double now_s)
{
    sim->epoch++;
    sim->n_affected = 0;
    for (uint32_t i = 0; i < changed->count; i++)
        for (uint32_t group = 0; group < sim->n_groups; group++) {
            const uint32_t m = sim->members[changed->member_start + i];
            const uint32_t base = sim->slot_of[(size_t)m * sim->n_groups + group];
            for (uint32_t stream = 0; stream < ZP_STREAM_N && base != NO_FLOWS; stream++) {
                const uint32_t slot = base + stream;
                Flow *f = &sim->flows[slot];
                if (!f->active || f->touched == sim->epoch || f->remaining_s <= 0 ||
                    sim->ops[f->op].link != link)
                    continue;
                f->touched = sim->epoch;
                if (sim->n_affected == sim->affected_cap) {
                    sim->affected_cap *= 2;
                    sim->affected = g_renew(uint32_t, sim->affected, sim->affected_cap);
                }
                sim->affected[sim->n_affected++] = slot;
            }
        }
    for (uint32_t i = 0; i < sim->n_affected; i++)
        reshare(sim, sim->affected[i], link, now_s);
}

/* Contention: a rank's compute ops run sim->contention times slower while a collective of
 * that rank is in flight. When that changes in the middle of an op, the rest of the op is
 * rescaled and its end queued again; the superseded end event is ignored (handle). */
static void recontend_stream(Sim *sim, uint32_t rank, uint32_t stream, double now_s)
{
    RunningCompute *run = &sim->running[(size_t)rank * ZP_STREAM_N + stream];
    const uint8_t slowed = sim->rank[rank].comm_active > 0;
    if (run->end_s < 0 || slowed == run->slowed)
        return;
    const double end_s = now_s + (run->end_s - now_s) *
                                     (slowed ? sim->contention : 1 / sim->contention);
    const SimOp *op = &sim->ops[run->op];
    RankBusy *rb = &sim->busy[rank];
    rb->busy_s[op->stream] += end_s - run->end_s;
    if (op->sub == ZP_COMP_OPTIMIZER)
        rb->optimizer_s += end_s - run->end_s;
    else
        rb->compute_s += end_s - run->end_s;
    run->end_s = end_s;
    run->slowed = slowed;
    queue_push(&sim->queue, end_s, rank, run->op);
}

static inline void recontend(Sim *sim, uint32_t rank, double now_s)
{
    for (uint32_t stream = 0; sim->running && stream < ZP_STREAM_N; stream++)
        recontend_stream(sim, rank, stream, now_s);
}

static void set_link_load(Sim *sim, const Flow *f, uint8_t link, int delta)
{
    const uint32_t *member = &sim->members[f->member_start];
    for (uint32_t i = 0; i < f->count; i++)
        sim->link_load[member[i] * SIM_LINK_N + link] += delta;
}

/* ---- ops ---- */

/* `last` is the member whose arrival starts it. */
G_NO_INLINE static void start_flow(Sim *sim, uint32_t slot, uint32_t last, double now_s)
{
    Flow *f = &sim->flows[slot];
    const SimOp *op = &sim->ops[f->op];
    f->arrived = 0;
    f->active = TRUE;
    f->start_s = now_s;
    f->transfer_from_s = now_s + op->latency_s;
    f->remaining_s = op->link == SIM_LINK_INTER ? op->transfer_s * f->inter_scale
                                                : op->transfer_s;
    f->share = 1.0;
    f->end_s = f->transfer_from_s + f->remaining_s;
    queue_push(&sim->queue, f->end_s, EVENT_FLOW | slot, ++f->version);
    const uint32_t *member = &sim->members[f->member_start];
    for (uint32_t i = 0; i < f->count; i++) {
        const uint32_t m = member[i];
        account(&sim->rank[m], now_s);
        sim->rank[m].comm_active++;
        recontend(sim, m, now_s);
        if (sim->op_start_s) {
            sim->op_start_s[(size_t)m * sim->n_ops + f->op] = now_s;
            sim->op_last_rank[(size_t)m * sim->n_ops + f->op] = arriving_rank(sim, last, f);
        }
    }
    if (op->transfer_s > 0) {
        set_link_load(sim, f, op->link, +1);
        /* Alone on its link class anywhere, it has the link to itself: nothing to reshare. */
        if (++sim->active_on_link[op->link] > 1)
            reshare_neighbours(sim, f, op->link, now_s);
    }
}

/* Starts compute, transfer or p2p op i on rank's stream: its duration booked, its end queued. */
G_NO_INLINE static void start_timed_op(Sim *sim, uint32_t rank, uint32_t stream, uint32_t i,
                                       double now_s)
{
    const SimOp *op = &sim->ops[i];
    if (op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_TRANSFER) {
        const Busy busy = busy_of(op);
        RankState *rs = &sim->rank[rank];
        RankBusy *rb = &sim->busy[rank];
        /* A collective of this rank in flight shares the GPU with its compute (recontend). */
        const gboolean gpu = busy == BUSY_GPU;
        const uint8_t slowed = gpu && sim->contention > 1 && rs->comm_active > 0;
        const double duration_s =
            (sim->compute_scale && gpu ? op->duration_s * sim->compute_scale[rank]
                                       : op->duration_s) *
            (slowed ? sim->contention : 1);
        if (gpu && sim->running)
            sim->running[(size_t)rank * ZP_STREAM_N + stream] = (RunningCompute){
                .end_s = now_s + duration_s, .op = i, .slowed = slowed};
        account(rs, now_s);
        (*busy_counter(rs, busy))++;
        rb->busy_s[stream] += duration_s;
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_OPTIMIZER)
            rb->optimizer_s += duration_s;
        else if (busy == BUSY_GPU)
            rb->compute_s += duration_s;
        if (sim->op_start_s)
            sim->op_start_s[(size_t)rank * sim->n_ops + i] = now_s;
        queue_push(&sim->queue, now_s + duration_s, rank, i);
        return;
    }
    /* p2p: the sender's share of its link, no group to wait for. An isend: the rank does not
     * wait for it, so it is never exposed communication (a rank waiting only for sends idles,
     * in the pipeline's bubble). */
    sim->busy[rank].busy_s[stream] += op->duration_s;
    if (sim->op_start_s)
        sim->op_start_s[(size_t)rank * sim->n_ops + i] = now_s;
    queue_push(&sim->queue, now_s + op->duration_s, rank, i);
}

/* Starts op i, the next of a rank's idle stream, its dependencies done: a collective counts
 * the rank in (the last member's arrival starts it), any other op is timed. */
G_ALWAYS_INLINE static inline void start_stream_op(Sim *sim, uint32_t rank, uint32_t stream,
                                                   uint32_t i, double now_s)
{
    StreamState *ss = &sim->stream[rank];
    const SimOp *op = &sim->ops[i];
    ss->next[stream] = op->stream_next;
    ss->busy[stream] = 1;
    if (sim->op_ready_s)
        sim->op_ready_s[(size_t)rank * sim->n_ops + i] = now_s;
    if (op->kind != ZP_OP_COLLECTIVE) {
        start_timed_op(sim, rank, stream, i, now_s);
        return;
    }
    const uint32_t slot = flow_slot(sim, op->group, rank, stream);
    Flow *f = &sim->flows[slot];
    f->op = i;
    if (++f->arrived == f->count)
        start_flow(sim, slot, rank, now_s);
}

/* Starts the next op of a rank's stream if the stream is idle and the op's dependencies are
 * done; `ready` is an op known to have none left (UINT32_MAX: none known). The check is
 * inlined in the callers: a third of the calls start nothing. */
G_ALWAYS_INLINE static inline void try_stream(Sim *sim, uint32_t rank, uint32_t stream,
                                              uint32_t ready, double now_s)
{
    const StreamState *ss = &sim->stream[rank];
    const uint32_t i = ss->next[stream];
    if (ss->busy[stream] || i == NO_OP || (i != ready && pending_of(sim, i, rank)))
        return;
    start_stream_op(sim, rank, stream, i, now_s);
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

/* Op i is done on rank: counts down its dependents there and starts those now ready (the
 * caller records its end in the timeline, with whatever else it records there). */
G_ALWAYS_INLINE static inline void release_dependents(Sim *sim, uint32_t rank, uint32_t i,
                                                      double now_s)
{
    const SimOp *op = &sim->ops[i];
    sim->op_events++;
    if (op->dependents_ready > op->dependents_start)
        ready_push_block(sim, rank, &sim->dependents[op->dependents_start],
                         op->dependents_ready - op->dependents_start);
    const Dependent *const end = &sim->dependents[op->dependents_end];
    for (const Dependent *d = &sim->dependents[op->dependents_ready]; d < end; d++) {
        const Dependent next = *d;
        const uint32_t at = peer_rank(sim, rank, op->stage, next.stage);
        if (next.counted && !pending_done(sim, next.op, at))
            continue;
        if (next.stream != NOT_ON_STREAM)
            try_stream(sim, at, next.stream, next.op, now_s);
        else
            ready_push(sim, at, next.op);
    }
}

/* A compute op or collective is done on rank. Only these move a rank's clock: an alloc or
 * free runs at the time the op it waited for ended on the same rank, so it never moves
 * end_s, and memory ops never touch RankState. */
G_ALWAYS_INLINE static inline void complete(Sim *sim, uint32_t rank, uint32_t i,
                                            double now_s)
{
    const SimOp *op = &sim->ops[i];
    sim->rank[rank].end_s = now_s;
    if (sim->op_end_s)
        sim->op_end_s[(size_t)rank * sim->n_ops + i] = now_s;
    /* An op that ends past the caller's time: the step ends later still. */
    if (sim->stop_after_s > 0 && now_s > sim->stop_after_s && sim->stopped_s == 0)
        sim->stopped_s = now_s;
    release_dependents(sim, rank, i, now_s);
    sim->stream[rank].busy[op->stream] = 0;
    try_stream(sim, rank, op->stream, UINT32_MAX, now_s);
}

/* Alloc or free op i on a rank's memory m; FALSE (and sim->error) if a category goes
 * negative. */
static gboolean apply_memory_op(Sim *sim, MemState *m, uint32_t rank, uint32_t i)
{
    const SimOp *op = &sim->ops[i];
    const double delta = op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
    LiveBytes *category = &m->category[op->sub];
    category->live += delta;
    category->peak = MAX(category->peak, category->live);
    m->total.live += delta;
    if (is_model_state(op->sub)) {
        m->states.live += delta;
        m->states.peak = MAX(m->states.peak, m->states.live);
    }
    if (category->live < -sim->mem_tolerance_bytes) {
        g_set_error(&sim->error, ZP_ERROR, ZP_ERROR_VALUE,
                    "memory: %s goes negative (%.6g bytes) on rank %u at op %u",
                    zp_sched_mem_name(op->sub), category->live, named_rank(sim, rank), i);
        return FALSE;
    }
    if (m->total.live > m->total.peak) {
        m->total.peak = m->total.live;
        for (int c = 0; c < ZP_MEM_N; c++)
            m->peak_breakdown_bytes[c] = m->category[c].live;
    }
    return TRUE;
}

/* A rank leaves its class's log at position pos: its own copy of the state there. */
static gboolean go_eager(Sim *sim, uint32_t rank, const MemLog *log, uint32_t pos)
{
    if (sim->n_eager == sim->cap_eager) {
        MemState *eager = grow_state(sim, sim->eager, &sim->cap_eager, sizeof(MemState),
                                     "memory states of ranks out of lockstep");
        if (!eager)
            return FALSE;
        sim->eager = eager;
    }
    sim->eager[sim->n_eager] = log->state[pos];
    sim->mem_pos[rank] = MEM_EAGER | sim->n_eager++;
    return TRUE;
}

/* Op i on rank's memory: a step along its class's log, a new entry at its end, or the rank's
 * own state (MemLog). */
static gboolean step_memory(Sim *sim, uint32_t rank, uint32_t i)
{
    uint32_t *pos = &sim->mem_pos[rank];
    if (*pos == sim->log_pos[i]) {
        ++*pos;
        return TRUE;
    }
    MemLog *log = &sim->mem_log[sim->ops[i].stage];
    if (*pos == log->len) { /* it ran the whole log, so not op i: op i is not in it */
        log->state[*pos + 1] = log->state[*pos];
        if (!apply_memory_op(sim, &log->state[*pos + 1], rank, i))
            return FALSE;
        sim->log_pos[i] = log->len++;
        ++*pos;
        return TRUE;
    }
    if (!(*pos & MEM_EAGER) && !go_eager(sim, rank, log, *pos))
        return FALSE;
    return apply_memory_op(sim, &sim->eager[*pos & ~MEM_EAGER], rank, i);
}

static void run_memory_op(Sim *sim, uint32_t rank, uint32_t i, double now_s)
{
    if (!step_memory(sim, rank, i))
        return;
    if (sim->op_start_s) {
        const size_t at = (size_t)rank * sim->n_ops + i;
        sim->op_start_s[at] = sim->op_ready_s[at] = sim->op_end_s[at] = now_s;
    }
    release_dependents(sim, rank, i, now_s);
}

static void drain_ready(Sim *sim, double now_s)
{
    while (sim->ready_head < sim->ready_end && !sim->error) {
        const ReadyOp r = sim->ready[sim->ready_head++];
        run_memory_op(sim, r.rank, r.op, now_s);
    }
    sim->ready_head = sim->ready_end = 0;
}

static void finish_flow(Sim *sim, uint32_t slot, double now_s)
{
    Flow *f = &sim->flows[slot];
    /* Completing the last member may start the group's next collective in this same slot. */
    const uint32_t i = f->op;
    const double start_s = f->start_s;
    const SimOp *op = &sim->ops[i];
    f->active = FALSE;
    if (op->transfer_s > 0) {
        set_link_load(sim, f, op->link, -1);
        if (--sim->active_on_link[op->link] > 0)
            reshare_neighbours(sim, f, op->link, now_s);
    }
    const uint32_t *member = &sim->members[f->member_start];
    const uint32_t count = f->count;
    for (uint32_t k = 0; k < count; k++) {
        const uint32_t m = member[k];
        RankState *rs = &sim->rank[m];
        account(rs, now_s);
        rs->comm_active--;
        recontend(sim, m, now_s);
        sim->busy[m].busy_s[op->stream] += now_s - start_s;
        complete(sim, m, i, now_s);
    }
}

/* How many queue events the result counts for e: a unit's stands for one per rank of its
 * block; a flow's for one per group it stands for (Flow.copies). (Ops are counted per unit as
 * they run, and per rank at the end: fill_result.) */
static uint64_t event_weight(const Sim *sim, const Event *e)
{
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

static void handle(Sim *sim, const Event *e, double now_s)
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
        if (run)
            run->end_s = -1;
        if (op->kind == ZP_OP_COMPUTE || op->kind == ZP_OP_TRANSFER) {
            account(rs, now_s);
            (*busy_counter(rs, busy_of(op)))--;
            if (op->kind == ZP_OP_COMPUTE && op->sub != ZP_COMP_OPTIMIZER &&
                op->sub != ZP_COMP_CPU_OPTIMIZER)
                rs->flush_s = now_s;
        }
        complete(sim, e->id, e->detail, now_s);
        return;
    }
    const uint32_t slot = e->id & ~EVENT_FLOW;
    if (e->detail == sim->flows[slot].version && sim->flows[slot].active)
        finish_flow(sim, slot, now_s);
}

/* ---- the run ---- */

/* How many ops of its stream a rank has started. */
static uint32_t stream_head(const Sim *sim, uint32_t rank, uint32_t stream)
{
    const uint32_t next = sim->stream[rank].next[stream];
    return next == NO_OP ? sim->stream_len[rank_class(sim, rank) * ZP_STREAM_N + stream]
                         : sim->stream_pos[next];
}

/* Whether stream op i has finished on rank (its stream passed it, and is not running it). */
static gboolean stream_op_finished(const Sim *sim, uint32_t i, uint32_t rank)
{
    const uint32_t stream = sim->ops[i].stream;
    return sim->stream_pos[i] + sim->stream[rank].busy[stream] < stream_head(sim, rank, stream);
}

/* Whether an alloc or free ran on rank, once the queue is empty. One with a single dependency
 * keeps no count (Dependent.counted): it ran if that dependency finished, on the rank that
 * released it. Followed along chains of such ops, n_ops steps at most: a cycle never ran. */
static gboolean memory_op_ran(const Sim *sim, uint32_t op, uint32_t rank)
{
    for (uint32_t step = 0; step <= sim->n_ops; step++) {
        const SimOp *o = &sim->ops[op];
        if (o->n_deps != 1)
            return pending_of(sim, op, rank) == 0;
        const uint32_t dep = zp_sched_deps(sim->sched, zp_sched_op(sim->sched, op))[0];
        const SimOp *d = &sim->ops[dep];
        rank = peer_rank(sim, rank, o->stage, d->stage);
        if (op_on_stream(d))
            return stream_op_finished(sim, dep, rank);
        op = dep;
    }
    return FALSE;
}

/* The first op of a rank that never started: a stream op its stream never reached, or an
 * alloc or free whose dependencies never finished. Called only when one exists. */
static uint32_t first_unrun_op(const Sim *sim, uint32_t rank)
{
    uint32_t i = 0;
    for (; i + 1 < sim->n_ops; i++) {
        const SimOp *o = &sim->ops[i];
        if (o->stage != rank_class(sim, rank))
            continue;
        const gboolean ran = op_on_stream(o)
                                 ? sim->stream_pos[i] < stream_head(sim, rank, o->stream)
                                 : memory_op_ran(sim, i, rank);
        if (!ran)
            break;
    }
    return i;
}

/* Ops done on a rank once the queue is empty: its finished compute ops and collectives (those
 * its streams passed, less one still running or waiting on a busy stream), and the allocs and
 * frees whose dependencies all finished (each ran as soon as they had). */
static uint32_t ops_done(const Sim *sim, uint32_t rank)
{
    uint32_t done = 0;
    for (int s = 0; s < ZP_STREAM_N; s++) /* a busy stream's last op has not finished */
        done += stream_head(sim, rank, (uint32_t)s) - sim->stream[rank].busy[s];
    for (uint32_t i = 0; i < sim->n_ops; i++)
        done += sim->ops[i].stage == rank_class(sim, rank) && !op_on_stream(&sim->ops[i]) &&
                memory_op_ran(sim, i, rank);
    return done;
}

/* The ops the simulated ranks run in a full step, each its class's: what op_events counts
 * up to. */
static uint64_t simulated_rank_ops(const Sim *sim)
{
    uint64_t rank_ops = 0;
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        rank_ops += (uint64_t)sim->class_ops[k] * sim->stage_ranks[k];
    return rank_ops;
}

static gboolean check_end(Sim *sim, GError **error)
{
    /* Each rank does each op of its class at most once, so a full count means that no rank
     * fell short. */
    const gboolean all_done = sim->op_events == simulated_rank_ops(sim);
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const uint32_t k = rank_class(sim, r);
        const uint32_t done = all_done ? sim->class_ops[k] : ops_done(sim, r);
        if (done < sim->class_ops[k]) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "schedule deadlock: rank %u ran %u of %u ops; op %u never ran",
                        named_rank(sim, r), done, sim->class_ops[k], first_unrun_op(sim, r));
            return FALSE;
        }
        const double *state = &sim->class_state[k * ZP_MEM_N];
        for (int c = 0; c < ZP_MEM_N; c++) {
            const double live = mem_state(sim, r)->category[c].live;
            if (fabs(live - state[c]) > sim->mem_tolerance_bytes) {
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "memory: %s ends the step at %.6g bytes on rank %u, not the "
                            "%.6g it started with",
                            zp_sched_mem_name(c), live, named_rank(sim, r), state[c]);
                return FALSE;
            }
        }
    }
    return TRUE;
}

/* The GPU's compute time but the optimizer's, each instant once: the busy sums count an op on
 * a communication stream (unpack, quantisation) and the compute it overlaps both, so that the
 * breakdown's terms would add up to more than the step. */
static double gpu_compute_s(const RankState *rs, const RankBusy *rb)
{
    return rb->compute_s - rs->gpu_overlap_s;
}

/* The ops the ranks of the blocks ran: each all of its class's (check_end found none short);
 * op_events counted each unit's once. */
static uint64_t ops_of_blocks(const Sim *sim)
{
    uint64_t ops = 0;
    for (uint32_t u = 0; u < sim->ranks; u++)
        ops += (uint64_t)sim->class_ops[rank_class(sim, u)] * sim->weight[u];
    return ops;
}

static void fill_result(const Sim *sim, SimResult *result)
{
    /* The peak rank: the lowest of those whose total rose highest. */
    uint32_t last = 0, peak = 0;
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const MemState *m = mem_state(sim, r);
        if (sim->rank[r].end_s > sim->rank[last].end_s)
            last = r;
        if (m->total.peak > mem_state(sim, peak)->total.peak)
            peak = r;
        result->peak_model_state_bytes = MAX(result->peak_model_state_bytes, m->states.peak);
    }
    const MemState *top = mem_state(sim, peak);
    const RankState *rs = &sim->rank[last];
    const RankBusy *rb = &sim->busy[last];
    result->step_time_s = rs->end_s;
    result->report_rank = (int)named_rank(sim, last);
    memcpy(result->stream_busy_s, rb->busy_s, sizeof rb->busy_s);
    result->compute_s = gpu_compute_s(rs, rb);
    result->optimizer_s = rb->optimizer_s;
    result->exposed_comm_s = rs->exposed_s;
    result->cpu_optimizer_s = rs->cpu_optimizer_s;
    result->offload_transfer_s = rs->transfer_s;
    result->idle_s = MAX(0.0, rs->end_s - result->compute_s - rb->optimizer_s - rs->exposed_s -
                                  rs->cpu_optimizer_s - rs->transfer_s);
    result->peak_memory_bytes = top->total.peak;
    memcpy(result->peak_breakdown_bytes, top->peak_breakdown_bytes,
           sizeof result->peak_breakdown_bytes);
    for (int c = 0; c < ZP_MEM_N; c++)
        result->category_peak_bytes[c] = top->category[c].peak;
    result->op_events = sim->weight ? ops_of_blocks(sim) : sim->op_events;
    result->heap_events = sim->heap_events;
    result->state_bytes = sim->state_bytes + (uint64_t)sim->cap_rows * sim->ranks +
                          (uint64_t)sim->cap_eager * sizeof(MemState);
    for (uint32_t r = 0; r < sim->ranks; r++)
        result->flush_s = MAX(result->flush_s, sim->rank[r].flush_s);
    /* A stage's bubble: the time its rank neither computes nor waits for its own
     * communication, over the step up to the flush or the rank's end, whichever is later
     * (after the flush a rank reduces and steps without waiting on other stages). The rank
     * of the stage with the least stands for it. */
    for (int k = 0; k < result->stages; k++)
        result->stage_bubble_s[k] = G_MAXDOUBLE;
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const uint32_t k = rank_class(sim, r);
        const RankState *rs = &sim->rank[r];
        const RankBusy *rb = &sim->busy[r];
        const MemState *m = mem_state(sim, r);
        result->stage_peak_bytes[k] = MAX(result->stage_peak_bytes[k], m->total.peak);
        for (int c = 0; c < ZP_MEM_N; c++)
            result->stage_category_peak_bytes[k * ZP_MEM_N + c] =
                MAX(result->stage_category_peak_bytes[k * ZP_MEM_N + c], m->category[c].peak);
        const double compute_s = gpu_compute_s(rs, rb);
        result->stage_compute_s[k] = MAX(result->stage_compute_s[k], compute_s);
        const double idle_s = MAX(rs->end_s, result->flush_s) - compute_s - rb->optimizer_s -
                              rs->exposed_s;
        result->stage_bubble_s[k] = MIN(result->stage_bubble_s[k], MAX(0.0, idle_s));
    }
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
static void expand_blocks(Sim *sim)
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
    for (uint32_t u = sim->ranks; sim->op_start_s && u-- > 0;)
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

static void sim_clear(Sim *sim)
{
    g_free(sim->ops);
    g_free(sim->dependents);
    g_free(sim->stream_first);
    g_free(sim->stream_len);
    g_free(sim->stream_pos);
    g_free(sim->class_ops);
    g_free(sim->stage_of);
    g_free(sim->first_rank);
    g_free(sim->rank_count);
    g_free(sim->stage_ranks);
    g_free(sim->peer);
    g_free(sim->slot_of);
    g_free(sim->members);
    g_free(sim->rows);
    g_free(sim->countdown);
    g_free(sim->free_rows);
    g_free(sim->pending_wide);
    g_free(sim->stream);
    g_free(sim->link_load);
    g_free(sim->rank);
    g_free(sim->running);
    g_free(sim->busy);
    for (uint32_t k = 0; sim->mem_log && k < sim->sim_pp; k++)
        g_free(sim->mem_log[k].state);
    g_free(sim->mem_log);
    g_free(sim->log_pos);
    g_free(sim->mem_pos);
    g_free(sim->eager);
    g_free(sim->op_start_s);
    g_free(sim->op_end_s);
    g_free(sim->op_ready_s);
    g_free(sim->op_last_rank);
    g_free(sim->compute_scale);
    g_free(sim->flows);
    g_free(sim->affected);
    queue_clear(&sim->queue);
    g_free(sim->ready);
    g_clear_error(&sim->error);
}

static gboolean check_plan(const ZpSchedule *s, const ZpHw *hw, GError **error)
{
    const int P = MAX(s->stages, 1);
    if (s->plan.dp < 1 || s->plan.mp < 1 ||
        (int64_t)s->plan.dp * s->plan.mp * P != s->world || P > UINT16_MAX ||
        (P > 1 && !s->stage_state_bytes)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "schedule: world %d is not dp %d x mp %d x pp %d", s->world, s->plan.dp,
                    s->plan.mp, P);
        return FALSE;
    }
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(s, groups);
    for (int g = 0; g < n_groups; g++)
        if (groups[g].ranks < 1 || groups[g].stride < 1 ||
            s->world % ((int64_t)groups[g].ranks * groups[g].stride) != 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "schedule: group %s: %d ranks %d apart do not tile the world of %d",
                        groups[g].name, groups[g].ranks, groups[g].stride, s->world);
            return FALSE;
        }
    return sim_coll_check_placement(hw, s->plan.mp, error);
}

/* Every rank's allocs and frees without dependencies, then its streams, rank by rank. */
static void seed(Sim *sim)
{
    GArray *roots = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t i = 0; i < sim->n_ops; i++)
        if (!op_on_stream(&sim->ops[i]) && sim->ops[i].n_deps == 0)
            g_array_append_val(roots, i);
    for (uint32_t r = 0; r < sim->ranks; r++) {
        for (guint k = 0; k < roots->len; k++)
            if (sim->ops[g_array_index(roots, uint32_t, k)].stage == rank_class(sim, r))
                ready_push(sim, r, g_array_index(roots, uint32_t, k));
        for (uint32_t s = 0; s < ZP_STREAM_N; s++)
            try_stream(sim, r, s, UINT32_MAX, 0.0);
    }
    g_array_free(roots, TRUE);
    drain_ready(sim, 0.0);
}

/* Takes the queue's events in order until it is empty, an error, the stop time, or (blocks)
 * an order the units cannot stand for. */
static void run_queue(Sim *sim, const SimOptions *options)
{
    const double total_ops = (double)simulated_rank_ops(sim);
    uint64_t told = 0;
    double instant_s = -1;
    while (sim->queue.len > 0 && !sim->error && sim->stopped_s == 0) {
        double now_s;
        const Event e = queue_pop(&sim->queue, &now_s);
        if (sim->weight) {
            check_order(sim, &e, now_s);
            if (sim->order_broken)
                return;
        }
        if (now_s != instant_s) {
            instant_s = now_s;
            sim->queue.instant++;
        }
        sim->heap_events += event_weight(sim, &e);
        handle(sim, &e, now_s);
        drain_ready(sim, now_s);
        if (options->progress && sim->heap_events / PROGRESS_EVERY_EVENTS != told) {
            told = sim->heap_events / PROGRESS_EVERY_EVENTS;
            options->progress((double)sim->op_events / total_ops, options->progress_ctx);
        }
    }
}

/* One step; *order_broken (with NULL and no error) where blocks met an order they cannot
 * stand for. */
static SimResult *run_step(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                           gboolean *order_broken, GError **error)
{
    if (!check_plan(sched, hw, error))
        return NULL;
    const gboolean explicit_ranks = options->mode == SIM_MODE_EXPLICIT;
    Sim sim = {
        .sched = sched,
        .n_ops = sched->ops->len,
        .sim_dp = explicit_ranks ? (uint32_t)sched->plan.dp : 1,
        .sim_mp = explicit_ranks ? (uint32_t)sched->plan.mp : 1,
        .sim_pp = (uint32_t)MAX(sched->stages, 1),
        .class_state = sched->stages > 1 ? sched->stage_state_bytes : sched->state_bytes,
        .queue = {.last = UINT32_MAX},
        .stop_after_s = options->stop_after_s,
        .world = (uint32_t)sched->world,
        .taken_s = -1,
    };
    sim.ranks = sim.sim_dp * sim.sim_mp * sim.sim_pp;
    sim.n_groups = (uint32_t)zp_sched_groups(sched, sim.groups);
    sim.ops = g_new0(SimOp, sim.n_ops ? sim.n_ops : 1);
    SimResult *result = g_new0(SimResult, 1);
    *result = (SimResult){.mode = options->mode, .world = sched->world,
                          .ranks_simulated = (int)sim.ranks, .n_ops = sim.n_ops,
                          .stages = (int)sim.sim_pp};
    result->stage_peak_bytes = g_new0(double, sim.sim_pp);
    result->stage_compute_s = g_new0(double, sim.sim_pp);
    result->stage_bubble_s = g_new0(double, sim.sim_pp);
    result->stage_comm_bytes = g_new0(double, (gsize)sim.sim_pp * ZP_GROUP_N);
    result->stage_category_peak_bytes = g_new0(double, (gsize)sim.sim_pp * ZP_MEM_N);
    Slowdowns slow = {0};
    SimClasses classes = {0};
    gboolean ok = build_ops(&sim, hw, result, error) &&
                  (options->n_slow_ranks + options->n_slow_nodes == 0 ||
                   read_slowdowns(options, (uint32_t)sched->world, (uint32_t)hw->gpus_per_node,
                                  &slow, error));
    if (ok) {
        /* Blocks need no contention (above). */
        build_units(&sim, &slow, explicit_ranks && !options->each_rank && sim.contention == 1,
                    &classes);
        result->ranks_simulated = (int)ranks_reported(&sim);
        result->units_simulated = (int)sim.ranks;
        ok = alloc_rank_state(&sim, options->record_timeline, error);
    }
    if (ok) {
        build_flows(&sim, &classes);
        apply_slowdowns(&sim, &slow);
    }
    sim_class_clear(&classes);
    g_free(slow.rank);
    g_free(slow.node);
    if (ok) {
        seed(&sim);
        run_queue(&sim, options);
        if (sim.order_broken) {
            *order_broken = TRUE;
            ok = FALSE;
        } else if (sim.error) {
            g_propagate_error(error, sim.error);
            sim.error = NULL;
            ok = FALSE;
        } else if (sim.stopped_s > 0) {
            result->stopped = TRUE;
            result->step_time_s = sim.stopped_s;
        } else {
            ok = check_end(&sim, error);
        }
    }
    if (ok && !result->stopped) {
        fill_result(&sim, result);
        if (sim.weight)
            expand_blocks(&sim);
        result->op_start_s = sim.op_start_s;
        result->op_end_s = sim.op_end_s;
        result->op_ready_s = sim.op_ready_s;
        result->op_last_rank = sim.op_last_rank;
        result->first_rank = sim.first_rank;
        result->rank_count = sim.rank_count;
        sim.op_start_s = sim.op_end_s = sim.op_ready_s = NULL;
        sim.op_last_rank = NULL;
        sim.first_rank = sim.rank_count = NULL;
    }
    sim_clear(&sim);
    if (!ok) {
        sim_result_free(result);
        return NULL;
    }
    return result;
}

SimResult *sim_engine_run(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                          GError **error)
{
    gboolean order_broken = FALSE;
    SimResult *result = run_step(sched, hw, options, &order_broken, error);
    if (!order_broken)
        return result;
    /* Blocks met an order they cannot stand for (above): every rank on its own. */
    SimOptions each = *options;
    each.each_rank = TRUE;
    return run_step(sched, hw, &each, &order_broken, error);
}

void sim_result_free(SimResult *result)
{
    if (!result)
        return;
    g_free(result->op_start_s);
    g_free(result->op_end_s);
    g_free(result->op_ready_s);
    g_free(result->op_last_rank);
    g_free(result->first_rank);
    g_free(result->rank_count);
    g_free(result->stage_peak_bytes);
    g_free(result->stage_compute_s);
    g_free(result->stage_bubble_s);
    g_free(result->stage_comm_bytes);
    g_free(result->stage_category_peak_bytes);
    g_free(result);
}
