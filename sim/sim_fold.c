/* sim_fold: a pipeline's steady state (and gradient accumulation's micro-steps) advanced by
 * whole periods, bit for bit what stepping every event would give, or refused for the plan.
 *
 * Why it is exact. Every time the engine computes is an event time plus a duration rounded to
 * the clock's fixed grid of 2^-30 s (sim_clock.h, sim_clock_q: op durations, a flow's latency
 * and its end after each reshare, contention's rescaled ends), or a difference of two times
 * scaled by a constant (account, reshare's remaining bytes). Below 2^22 s a whole number of
 * quanta is a double exactly and adding two of them is integer arithmetic: nothing rounds, so
 * a whole state moved by a whole number of quanta evolves into the same evolution moved by the
 * same amount, bit for bit, across any power of two. So two snapshots one period apart (same
 * head op of a watched rank's compute stream, d micro-steps later), the second the first with
 * every time moved by the period (or left alone: a time no period writes), every count equal,
 * every op reference moved by its stage's step, times all on the grid, prove (with the
 * schedule's ops repeating, checked op by op) that the state n periods on is the state now
 * moved by n periods: the run jumps n periods. Bytes move by the period's net allocation, the
 * same each period, and a peak with them only where it rose by its live count's rise (it was
 * set in the period); a live count rising under a still peak is refused. Where the state is
 * no moved copy (each rank's times moving by its own amount: GPipe's backward phase, where
 * the ranks behind the leading last stage lag further each period) the old proof stands:
 * three snapshots whose every value moved by its own amount twice (sim_snap_repeats3). Two
 * where they suffice make the first jump come two periods sooner (plan --3d gpt-1t/4096's
 * 1F1B pp 32 x tp 32, a round trip a period: 288 -> 352 of 512 micro-steps skipped). The sums
 * the simulation only writes (busy, exposed and idle times) are not moved: they get the very
 * additions the recorded period (or two) made, in order, once per skipped period, so they
 * come out as the unfolded run's would even where a sum (a rank's
 * busy time over its streams) outgrows the grid. Memory is whole bytes: exact when every value
 * is an integer below 2^53. Anything else (a straggler's classes, an unequal period, the
 * grid's end) refuses or ends the jump, and the engine steps every event as before.
 *
 * Where it stops. A jump ends before any time would reach 2^22 s (48.5 days), where the grid
 * ends (sim_snap_periods_exact); a run whose steady state lies past it steps every event and
 * its note says so. Until issue 40's grid the clock was the bare double, whose spacing doubles
 * at each power of two: a jump had to stay in one binade, and the rounding a crossing left
 * took a pipeline round trip to wash out (Megatron's 1T shape folded 254 of stage 0's 449
 * steady micro-steps; on the grid it folds them nearly all). What remains unfolded is the
 * fill, the drain, and the periods the snapshots take to prove a repeat.
 *
 * Virtual periods (Sim.extend_micro_steps). The builder's schedule of m micro-steps is its
 * schedule of m - k with whole steady periods inserted, op for op but the micro field
 * (tests/test_sim_extend.c checks it), so a jump proven on the short schedule holds on the
 * long one for as many more periods as were inserted: a jump counts up to k / d of them on
 * top of its physical ones (times, sums and counts move by both, op indices by the physical
 * only), inserted before each stage's window (SimFoldReport.inserts, which sim_ops.c needs to
 * add the long schedule's static sums in its order). The same checks bound it (the grid's
 * end, the stop time), so a caller whose short run did not count all k runs the long one. */
#include "sim_fold.h"
#include "sim_clock.h"
#include "sim_fold_snap.h"

#include <math.h>
#include <string.h>

/* Shifts tried between snapshots: 1 micro-step (1F1B, GPipe) or a group of pp (interleaved:
 * Megatron's groups of pp micro-batches per chunk), and twice each (on the bare double clock a
 * period of an odd number of ulps rounded its ties alternately; on the grid nothing ties, and
 * the doubled shifts stay only for a pattern that truly alternates). 1F1B over more than two
 * stages tries pp micro-steps too, a pipeline round trip: where tensor parallelism spans
 * nodes, the fill leaves a disturbance that comes back every round trip and never washes out
 * (plan --3d gpt-1t/4096's 1F1B pp 32 x tp 32: stage 0's period is 0.0902409 s but 0.0926946
 * then 0.0853067 s at micro-steps 64, 96, .., 480), so no state repeats a micro-step on, while
 * every one repeats pp on. */
#define MAX_SHIFTS 4
/* Periods an interleaved group's shift needs before it can jump (group_first). */
#define GROUP_PERIODS 5
/* Why a run whose clock reached the grid's end (sim_clock.h) folds no further. */
#define PAST_GRID "the clock passed 2^22 s (48.5 days), where its grid of 2^-30 s ends"
/* Notes kept before the ones no snapshot needs are dropped. */
#define NOTES_TRIM_AT 65536
/* A recorded period's log (sums added to, timeline cells written). */
typedef enum { NOTE_ADD, NOTE_CELL, NOTE_RANK } NoteKind;

typedef struct {
    uint8_t kind;
    double *field; /* NOTE_ADD: the sum; NOTE_CELL: the timeline array */
    size_t at;     /* NOTE_CELL, NOTE_RANK: the cell (row x n_ops + op) */
    double x;      /* NOTE_ADD: what was added; NOTE_CELL: the value; NOTE_RANK: the rank */
} Note;


struct SimFold {
    uint32_t A;            /* micro-steps */
    uint32_t stages;
    GHashTable *heads;     /* 1 + each head op -> 1 + its index (find_heads) */
    /* [stage]: its ops' indices, [stage_start, stage_end) (the builder lays a stage's ops
     * out together; checked), worked out the first time the cheap fields repeat (NULL
     * before); lo_hint: no counted op below it is still counting down; equal_from and
     * equal_to, [shift * stages + stage]: the ops i in [equal_from, equal_to) do what
     * i - equal_step did (same_op), kept for each shift tried. */
    uint32_t *stage_start, *stage_end, *lo_hint;
    uint32_t *equal_from, *equal_to;
    int64_t *equal_step;
    uint32_t shifts[MAX_SHIFTS], n_shifts;
    uint32_t group, chunks; /* interleaved: a period's micro-steps (pp), and chunks; else 0 */
    /* periods_schedule found no room for this shift before op blocked_at of stage
     * blocked_stage, which does not repeat: not tried again until that stage's window is past
     * it (UINT32_MAX: not blocked). */
    uint32_t blocked_at[MAX_SHIFTS], blocked_stage[MAX_SHIFTS];
    size_t sizes[3];              /* the last snapshot's doubles, integers, references */
    GHashTable *snaps;     /* snap_key -> Snap */
    int64_t *steps;        /* [stage]: the ops a moving reference moves by a period */
    GArray *notes;
    uint64_t notes_base;
    /* Whether the cheap fields of watched rank w's last snapshots repeated: notes are kept
     * only while one did (epoch counts the breaks, when they were dropped). */
    gboolean passing[2];
    uint32_t epoch;
    SimFoldReport report;
    const char *refused; /* why the run stopped looking, or NULL */
    gboolean grid_end;   /* a repeat found no room before the clock's grid ends (2^22 s) */
    /* Virtual micro-steps still to count (Sim.extend_micro_steps); whether a timeline cell
     * was noted (a virtual period has no op to write its cells at: none counted then). */
    uint64_t virtual_left;
    gboolean cells_noted;
};

/* ---- the schedule ---- */

/* Op i's micro-step, -1 for none (or one past the plan's). */
static int32_t op_micro(const SimFold *f, const Sim *sim, uint32_t i)
{
    const int32_t m = zp_sched_op(sim->sched, i)->micro;
    return m >= 0 && (uint32_t)m < f->A ? m : -1;
}

/* Whether a compute op belongs to a micro-step's backward pass. */
static gboolean backward(const ZpOp *op)
{
    static const uint8_t kinds[] = {ZP_COMP_RECOMPUTE, ZP_COMP_BLOCK_BWD, ZP_COMP_EMBED_BWD,
                                    ZP_COMP_EXPERT_BWD, ZP_COMP_UNPERMUTE_BWD};
    for (size_t k = 0; op->kind == ZP_OP_COMPUTE && k < G_N_ELEMENTS(kinds); k++)
        if (op->sub == kinds[k])
            return TRUE;
    return FALSE;
}

/* The watched ranks' (the first and the last stage's) first compute op of each micro-step,
 * each one snapshot's head, numbered by its micro-step (interleaved schedules change
 * micro-step at nearly every op). GPipe runs every forward before the first backward: its
 * backward phase, where a slow last stage leads and the others follow, gets heads too, the
 * first backward op of each micro-step, numbered A + its micro-step. */
static void find_heads(SimFold *f, const Sim *sim)
{
    const uint32_t phases = sim->sched->plan.pipe.schedule == ZP_PIPE_GPIPE ? 2 : 1;
    uint8_t *seen = g_new(uint8_t, (size_t)phases * f->A);
    for (uint32_t w = 0; w < 2; w++) {
        memset(seen, 0, (size_t)phases * f->A);
        const size_t first = (size_t)(w ? sim->ranks - 1 : 0) * ZP_STREAM_N + ZP_STREAM_COMPUTE;
        for (uint32_t i = sim->stream_first[first]; i != NO_OP; i = sim->ops[i].stream_next) {
            const int32_t m = op_micro(f, sim, i);
            const uint32_t at = (uint32_t)m + (phases > 1 && backward(zp_sched_op(sim->sched, i))
                                                   ? f->A
                                                   : 0);
            if (m >= 0 && !seen[at]) {
                g_hash_table_insert(f->heads, GUINT_TO_POINTER(i + 1),
                                    GUINT_TO_POINTER(at + 1));
                seen[at] = 1;
            }
        }
    }
    g_free(seen);
}

/* Each stage's ops as one run of indices, the first time the cheap fields repeat: a run
 * that never repeats pays nothing per op. FALSE where a stage's ops are not one run. */
static gboolean find_stages(SimFold *f, const Sim *sim)
{
    if (f->stage_start)
        return f->stage_end != NULL;
    f->stage_start = g_new(uint32_t, f->stages);
    uint32_t *count = g_new0(uint32_t, f->stages), *end = g_new0(uint32_t, f->stages);
    for (uint32_t s = 0; s < f->stages; s++)
        f->stage_start[s] = UINT32_MAX;
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const uint32_t s = sim->ops[i].stage;
        f->stage_start[s] = MIN(f->stage_start[s], i);
        end[s] = i + 1;
        count[s]++;
    }
    gboolean runs = TRUE;
    for (uint32_t s = 0; s < f->stages; s++)
        runs = runs && count[s] > 0 && end[s] - f->stage_start[s] == count[s];
    g_free(count);
    if (!runs) {
        g_free(end);
        return FALSE;
    }
    f->stage_end = end;
    f->lo_hint = g_memdup2(f->stage_start, f->stages * sizeof *f->lo_hint);
    f->equal_from = g_new0(uint32_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_to = g_new0(uint32_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_step = g_new0(int64_t, (size_t)MAX_SHIFTS * f->stages);
    return TRUE;
}

/* Whether op i counts its dependencies down (sim_ops.c: Dependent.counted). */
static gboolean counted(const SimOp *o)
{
    return o->n_deps > 0 && (op_on_stream(o) || o->n_deps > 1);
}

/* op + n periods on stage s (steps), or UINT32_MAX - 1 past the stage's ops. */
static uint32_t moved_on(const SimFold *f, uint32_t s, uint32_t op, int64_t n)
{
    const int64_t to = (int64_t)op + n * f->steps[s];
    return to >= f->stage_start[s] && to < f->stage_end[s] ? (uint32_t)to : UINT32_MAX - 1;
}

/* op + n periods on its stage (steps), or UINT32_MAX - 1 past the stage's ops. */
static uint32_t moved(const SimFold *f, const Sim *sim, uint32_t op, int64_t n)
{
    if (op == NO_OP)
        return op;
    const uint32_t s = sim->ops[op].stage;
    const int64_t to = (int64_t)op + n * f->steps[s];
    return to >= f->stage_start[s] && to < f->stage_end[s] ? (uint32_t)to : UINT32_MAX - 1;
}

/* Whether op j does what op i, a period before it, did: the same static facts, its stream's
 * next op and its dependents moved alike (each by its stage's step). */
static gboolean same_op(const SimFold *f, const Sim *sim, uint32_t i, uint32_t j)
{
    const SimOp *a = &sim->ops[i], *b = &sim->ops[j];
    if (a->kind != b->kind || a->sub != b->sub || a->stream != b->stream ||
        a->group != b->group || a->link != b->link || a->wide || b->wide ||
        a->stage != b->stage || a->n_deps != b->n_deps || a->duration_s != b->duration_s ||
        a->latency_s != b->latency_s || a->transfer_s != b->transfer_s ||
        a->bytes != b->bytes ||
        a->dependents_end - a->dependents_start != b->dependents_end - b->dependents_start ||
        a->dependents_ready - a->dependents_start != b->dependents_ready - b->dependents_start)
        return FALSE;
    if ((a->stream_next == NO_OP) != (b->stream_next == NO_OP) ||
        (a->stream_next != NO_OP && moved_on(f, a->stage, a->stream_next, 1) != b->stream_next))
        return FALSE;
    for (uint32_t k = 0; k < a->dependents_end - a->dependents_start; k++) {
        const Dependent *x = &sim->dependents[a->dependents_start + k];
        const Dependent *y = &sim->dependents[b->dependents_start + k];
        if (x->stage != y->stage || x->stream != y->stream || x->counted != y->counted ||
            f->steps[x->stage] == 0 || moved_on(f, x->stage, x->op, 1) != y->op)
            return FALSE;
    }
    return TRUE;
}

/* The first op past `from` of stage s that does not do what the op a period before it did
 * (every op in [from, that) does), from the stage's end at most; `from` itself where the
 * ops before `from` back to `back` do not repeat either. Remembered for the current steps. */
static uint32_t repeats_until(SimFold *f, const Sim *sim, uint32_t k, uint32_t s,
                              uint32_t back, uint32_t from)
{
    const int64_t step = f->steps[s];
    const size_t at = (size_t)k * f->stages + s;
    uint32_t *eq_from = &f->equal_from[at], *eq_to = &f->equal_to[at];
    if (f->equal_step[at] != step || back < *eq_from || back > *eq_to) {
        f->equal_step[at] = step;
        *eq_from = *eq_to = back;
    }
    while (*eq_to < f->stage_end[s] && *eq_to >= f->stage_start[s] + step &&
           same_op(f, sim, (uint32_t)(*eq_to - step), *eq_to))
        (*eq_to)++;
    return *eq_to >= from ? *eq_to : from;
}

/* ---- dependency counts ---- */

/* An op's countdown as one code: 0 done, 1 untouched, 2 + its count (its one rank's). */
static int64_t status(const Sim *sim, uint32_t rank, uint32_t i)
{
    const Countdown *c = &sim->countdown[i];
    if (c->first == COUNTS_DONE)
        return 0;
    if (c->first == COUNTS_UNUSED)
        return 1;
    return 2 + (int64_t)sim->rows[c->first + rank] + 256 * (int64_t)c->zeroed;
}

/* Stage s's window: lo, its first counted op still counting down; hi, one past the last that
 * began to (Sim.fold_hi). */
static void window(SimFold *f, const Sim *sim, uint32_t s, uint32_t *lo, uint32_t *hi)
{
    uint32_t i = f->lo_hint[s];
    while (i < f->stage_end[s] &&
           (!counted(&sim->ops[i]) || sim->countdown[i].first == COUNTS_DONE))
        i++;
    f->lo_hint[s] = i;
    *lo = i;
    *hi = MAX(i, sim->fold_hi[s]);
}

/* Each stage's window and every op's code in it: what snapshots a period apart must
 * repeat (their windows moving by the stage's step). */
static void push_status(SimFold *f, const Sim *sim, Vec *ints)
{
    for (uint32_t s = 0; s < f->stages; s++) {
        uint32_t lo, hi;
        window(f, sim, s, &lo, &hi);
        vec_int(ints, lo);
        vec_int(ints, hi);
        for (uint32_t i = lo; i < hi; i++)
            vec_int(ints, counted(&sim->ops[i]) ? status(sim, s, i) : 1);
    }
}

/* Whether the status of b and c repeat: each stage's window the same size and moving by its
 * step, the codes in it equal. */
static gboolean same_status(const SimFold *f, const Vec *b, const Vec *c)
{
    if (b->len != c->len)
        return FALSE;
    for (size_t k = 0, s = 0; s < f->stages; s++) {
        const int64_t lo = c->i[k], hi = c->i[k + 1], step = f->steps[s];
        if (b->i[k] != lo - step || b->i[k + 1] != hi - step)
            return FALSE;
        const size_t n = (size_t)(hi - lo);
        if (memcmp(b->i + k + 2, c->i + k + 2, n * sizeof(int64_t)) != 0)
            return FALSE;
        k += 2 + n;
    }
    return TRUE;
}


/* The same over a, b and c (the three-snapshot test: sim_snap_repeats3). */
static gboolean same_status3(const SimFold *f, const Vec *a, const Vec *b, const Vec *c)
{
    if (a->len != c->len || !same_status(f, b, c))
        return FALSE;
    for (size_t k = 0, s = 0; s < f->stages; s++) {
        const int64_t lo = c->i[k], hi = c->i[k + 1], step = f->steps[s];
        if (a->i[k] != lo - 2 * step || a->i[k + 1] != hi - 2 * step)
            return FALSE;
        const size_t n = (size_t)(hi - lo);
        if (memcmp(a->i + k + 2, c->i + k + 2, n * sizeof(int64_t)) != 0)
            return FALSE;
        k += 2 + n;
    }
    return TRUE;
}

/* A reference to op i (or NO_OP): its stage (REF_NONE for none) and its index. Between
 * snapshots a period apart a reference moves by its stage's step, the same for every moving
 * one of the stage (the builder lays a stage's micro-steps out alike, one after another:
 * same_op checks it op by op before a jump), or stays put (an op waited for past the steady
 * state: the last micro-step's reduction, say). */
static void push_ref(Vec *ints, const Sim *sim, uint32_t i)
{
    vec_int(ints, i == NO_OP ? REF_NONE : sim->ops[i].stage);
    vec_int(ints, i);
}

/* ---- the state: one walk both takes a snapshot and writes the jumped one ---- */

/* A double the snapshot compares: a time (moving by the period or not at all), a count of
 * bytes (which goes up and down within a period: it must stay a whole number), a peak of
 * bytes (the field before it is its live count: sim_snap_repeats), or an output sum (replayed
 * from the notes, not compared). */
typedef enum { FIELD_MOVES, FIELD_BYTES, FIELD_PEAK, FIELD_SUM } FieldKind;

typedef struct {
    gboolean apply;
    Snap *snap;          /* capture: filled; apply: the current snapshot */
    const Snap *before;  /* apply: the snapshot a period before */
    uint32_t periods;    /* apply: how many (times, sums and counts move by these) */
    uint32_t physical;   /* apply: how many of them the schedule's ops move by (the rest
                          * are virtual: Sim.extend_micro_steps) */
    size_t d_at, ref_at;
    SimFold *f;
    const Sim *sim;
} Walk;

static void walk_double(Walk *w, double *x, FieldKind kind)
{
    if (kind == FIELD_SUM)
        return; /* replayed from the notes */
    if (!w->apply) {
        if (kind == FIELD_BYTES || kind == FIELD_PEAK)
            vec_int(&w->snap->bytes, (int64_t)w->snap->d.len);
        if (kind == FIELD_PEAK)
            vec_int(&w->snap->peaks, (int64_t)w->snap->d.len);
        vec_double(&w->snap->d, *x);
        return;
    }
    const double now = w->snap->d.d[w->d_at];
    const double step = now - w->before->d.d[w->d_at];
    w->d_at++;
    if (step != 0)
        *x = now + (double)w->periods * step;
}

static void walk_int(Walk *w, int64_t value)
{
    if (!w->apply)
        vec_int(&w->snap->i, value);
}

static void walk_op(Walk *w, uint32_t *op)
{
    if (!w->apply) {
        push_ref(&w->snap->refs, w->sim, *op);
        return;
    }
    const int64_t step = w->snap->moves.i[w->ref_at++];
    *op = (uint32_t)(*op + (int64_t)w->physical * step);
}

static void walk_ranks(Walk *w, Sim *sim)
{
    for (uint32_t r = 0; r < sim->ranks; r++) {
        RankState *rs = &sim->rank[r];
        walk_double(w, &rs->mark_s, FIELD_MOVES);
        walk_double(w, &rs->exposed_s, FIELD_SUM);
        walk_double(w, &rs->end_s, FIELD_MOVES);
        walk_double(w, &rs->cpu_optimizer_s, FIELD_SUM);
        walk_double(w, &rs->transfer_s, FIELD_SUM);
        walk_double(w, &rs->flush_s, FIELD_MOVES);
        walk_double(w, &rs->gpu_overlap_s, FIELD_SUM);
        /* unsettled is 0 between instants (settle_contention ran); computing, the streams
         * running GPU compute, must repeat. */
        walk_int(w, rs->compute_running | rs->comm_active << 8 | rs->cpu_running << 16 |
                        (int64_t)rs->transfers_active << 24 | (int64_t)rs->unsettled << 32 |
                        (int64_t)rs->computing << 40);
        StreamState *ss = &sim->stream[r];
        for (uint32_t s = 0; s < ZP_STREAM_N; s++) {
            walk_op(w, &ss->next[s]);
            walk_int(w, ss->busy[s]);
        }
        for (uint32_t s = 0; sim->running && s < ZP_STREAM_N; s++) {
            RunningCompute *run = &sim->running[(size_t)r * ZP_STREAM_N + s];
            walk_int(w, run->end_s >= 0);
            if (run->end_s >= 0) {
                walk_double(w, &run->end_s, FIELD_MOVES);
                walk_double(w, &run->start_s, FIELD_MOVES);
                walk_op(w, &run->op);
                walk_int(w, run->slowed | run->started << 8);
            }
        }
        for (uint32_t l = 0; l < SIM_LINK_N; l++)
            walk_int(w, sim->link_load[r * SIM_LINK_N + l]);
        walk_int(w, sim->mem_pos[r]);
        MemState *m = &sim->eager[sim->mem_pos[r] & ~MEM_EAGER];
        for (int c = 0; c < ZP_MEM_N; c++) {
            walk_double(w, &m->category[c].live, FIELD_BYTES);
            walk_double(w, &m->category[c].peak, FIELD_PEAK);
            walk_double(w, &m->peak_breakdown_bytes[c], FIELD_BYTES);
        }
        walk_double(w, &m->total.live, FIELD_BYTES);
        walk_double(w, &m->total.peak, FIELD_PEAK);
        walk_double(w, &m->states.live, FIELD_BYTES);
        walk_double(w, &m->states.peak, FIELD_PEAK);
    }
    for (uint32_t l = 0; l < SIM_LINK_N; l++)
        walk_int(w, sim->active_on_link[l]);
    for (uint32_t k = 0; k < sim->n_flows; k++) {
        Flow *fl = &sim->flows[k];
        walk_int(w, fl->active | (int64_t)fl->arrived << 1);
        if (fl->active || fl->arrived)
            walk_op(w, &fl->op);
        if (!fl->active)
            continue;
        walk_double(w, &fl->start_s, FIELD_MOVES);
        walk_double(w, &fl->transfer_from_s, FIELD_MOVES);
        walk_double(w, &fl->remaining_s, FIELD_MOVES);
        walk_double(w, &fl->share, FIELD_MOVES);
        walk_double(w, &fl->end_s, FIELD_MOVES);
    }
}

/* The queue's events in the order they will be taken: times moved, op events' ops as
 * references, flow events' staleness (version - detail), the instant each was queued at
 * relative to now. */
static void snap_queue(Walk *w, Sim *sim, GArray *times, GArray *events)
{
    sim_queue_events(&sim->queue, times, events);
    walk_int(w, events->len);
    for (guint k = 0; k < events->len; k++) {
        Event *e = &g_array_index(events, Event, k);
        walk_double(w, &g_array_index(times, double, k), FIELD_MOVES);
        walk_int(w, e->id);
        if (e->id & EVENT_FLOW)
            walk_int(w, (int64_t)sim->flows[e->id & ~EVENT_FLOW].version - e->detail);
        else
            walk_op(w, &e->detail);
        walk_int(w, (int64_t)sim->queue.instant - e->made);
    }
}

static void snap_counters(Walk *w, Sim *sim)
{
    const int64_t v[3] = {(int64_t)sim->op_events, (int64_t)sim->heap_events,
                          sim->queue.instant};
    if (!w->apply) {
        for (int k = 0; k < 3; k++)
            vec_int(&w->snap->lin, v[k]);
        return;
    }
    int64_t step[3];
    for (int k = 0; k < 3; k++)
        step[k] = w->snap->lin.i[k] - w->before->lin.i[k];
    sim->op_events += (uint64_t)(w->periods * step[0]);
    sim->heap_events += (uint64_t)(w->periods * step[1]);
    sim->queue.instant += (uint32_t)(w->periods * step[2]);
}

/* The first tier of a snapshot, taken at every head: the instant and each rank's times.
 * Three of them a period apart moving alike are what makes the whole state (capture, some
 * thousands of values and the queue) worth taking; in a transient they rarely do. */
static void capture_first(SimFold *f, Sim *sim, Snap *snap)
{
    vec_grow(&snap->first, 1 + 3 * (size_t)sim->ranks);
    vec_double(&snap->first, snap->now_s);
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const RankState *rs = &sim->rank[r];
        vec_double(&snap->first, rs->mark_s);
        vec_double(&snap->first, rs->end_s);
        vec_double(&snap->first, rs->flush_s);
    }
    snap->note_at = f->notes_base + f->notes->len;
    snap->epoch = f->epoch;
}

static void capture(SimFold *f, Sim *sim, Snap *snap)
{
    snap->full = TRUE;
    /* Room for what the last snapshot held: one allocation each, not a dozen doublings. */
    vec_grow(&snap->d, f->sizes[0]);
    vec_grow(&snap->i, f->sizes[1]);
    vec_grow(&snap->refs, f->sizes[2]);
    Walk w = {.snap = snap, .f = f, .sim = sim};
    vec_double(&snap->d, snap->now_s);
    walk_ranks(&w, sim);
    GArray *times = g_array_new(FALSE, FALSE, sizeof(double));
    GArray *events = g_array_new(FALSE, FALSE, sizeof(Event));
    snap_queue(&w, sim, times, events);
    g_array_free(times, TRUE);
    g_array_free(events, TRUE);
    snap_counters(&w, sim);
    snap->note_at = f->notes_base + f->notes->len;
    snap->epoch = f->epoch;
    f->sizes[0] = snap->d.len;
    f->sizes[1] = snap->i.len;
    f->sizes[2] = snap->refs.len;
}

/* ---- the jump ---- */

/* Rewrites stage s's countdowns as `periods` periods on: each op in the moved window gets the
 * code of the op that many periods before it, the ops between the window's start and there
 * are done (those that count), and nothing past it has begun. */
static void move_counts(SimFold *f, Sim *sim, uint32_t s, uint32_t lo, uint32_t hi,
                        uint64_t periods)
{
    const int64_t shift = (int64_t)periods * f->steps[s];
    for (int64_t i = (int64_t)hi - 1 + shift; i >= (int64_t)lo; i--) {
        if (!counted(&sim->ops[i]))
            continue;
        if (i - shift >= (int64_t)lo)
            sim->countdown[i] = sim->countdown[i - shift];
        else
            sim->countdown[i].first = COUNTS_DONE;
    }
    f->lo_hint[s] = lo;
    sim->fold_hi[s] = (uint32_t)MAX((int64_t)sim->fold_hi[s], (int64_t)hi + shift);
}

/* Replays the notes of [from, to) for the skipped periods first, first + stride, .. up to
 * periods: sums added to again; timeline cells written at the op `moves` periods on, their
 * times moved alike. Two snapshots (stride 1): the one recorded period, j periods on for
 * skipped period j. Three (stride 2): skipped period j is recorded period a -> b (odd j) or
 * b -> c (even j), two or one periods before c: j + 1 or j periods on. */
static void replay(SimFold *f, Sim *sim, uint64_t from, uint64_t to, uint32_t first,
                   uint32_t stride, uint32_t periods, double period_s)
{
    for (uint32_t j = first; j <= periods; j += stride) {
        const uint32_t moves = stride == 1 ? j : j + (j & 1);
        for (uint64_t k = from; k < to; k++) {
            const Note *n = &g_array_index(f->notes, Note, k - f->notes_base);
            if (n->kind == NOTE_ADD) {
                *n->field += n->x;
                continue;
            }
            const uint32_t op = (uint32_t)(n->at % sim->n_ops);
            const size_t row = n->at - op;
            const uint32_t to_op = moved(f, sim, op, moves);
            if (n->kind == NOTE_RANK)
                sim->op_last_rank[row + to_op] = (uint32_t)n->x;
            else
                n->field[row + to_op] = n->x + (double)moves * period_s;
        }
    }
}

/* The most periods the schedule allows: every stage's ops from its window back `span` periods
 * (the recorded ones, whose notes the jump replays) on to the moved window and one period past
 * it do what the ops a period before them did. */
static uint64_t periods_schedule(SimFold *f, Sim *sim, uint32_t k, uint32_t span, uint32_t *lo,
                                 uint32_t *hi)
{
    uint64_t most = UINT64_MAX;
    for (uint32_t s = 0; s < f->stages; s++) {
        const int64_t step = f->steps[s];
        window(f, sim, s, &lo[s], &hi[s]);
        if (step <= 0 || (int64_t)lo[s] - span * step < (int64_t)f->stage_start[s] + step)
            return 0;
        const uint32_t back = (uint32_t)(lo[s] - span * step);
        const uint32_t until = repeats_until(f, sim, k, s, back, hi[s]);
        if (f->equal_from[(size_t)k * f->stages + s] > back)
            return 0;
        most = until < hi[s] + 3 * (uint32_t)step
                   ? 0
                   : MIN(most, (uint64_t)(until - hi[s]) / (uint64_t)step - 1);
        if (most < 2) {
            /* No room for two periods before an op that does not repeat: the window moves
             * towards it, so this shift waits till the window is past it. */
            f->blocked_at[k] = until;
            f->blocked_stage[k] = s;
            break;
        }
    }
    return most;
}

/* Advances the run from c by the most whole periods that stay exact; FALSE where fewer than
 * two fit (nothing changed). The proof's first snapshot is b (c is b moved) or a, two periods
 * before c (sim_snap_repeats3). */
static gboolean jump(SimFold *f, Sim *sim, const Snap *a, Snap *b, Snap *c, uint32_t k_shift)
{
    const uint32_t span = a == b ? 1 : 2;
    uint32_t *lo = g_new(uint32_t, f->stages), *hi = g_new(uint32_t, f->stages);
    const uint64_t physical = periods_schedule(f, sim, k_shift, span, lo, hi);
    /* Virtual periods (Sim.extend_micro_steps), only where the schedule allows a physical
     * jump here: the longer schedule's ops repeat over as many more. */
    const uint64_t virt = physical >= 2 && !f->cells_noted ? f->virtual_left / c->shift : 0;
    uint64_t periods = MIN(sim_snap_periods_exact(a, c, span, &f->grid_end), physical + virt);
    const uint32_t *eq_from = &f->equal_from[(size_t)k_shift * f->stages],
                   *eq_to = &f->equal_to[(size_t)k_shift * f->stages];
    GArray *times = g_array_new(FALSE, FALSE, sizeof(double));
    GArray *events = g_array_new(FALSE, FALSE, sizeof(Event));
    sim_queue_events(&sim->queue, times, events);
    double horizon_s = 0; /* the last queued event, from now */
    for (guint k = 0; k < times->len; k++)
        horizon_s = MAX(horizon_s, g_array_index(times, double, k) - c->now_s);
    const double period_s = c->now_s - b->now_s;
    if (sim->stop_after_s > 0) /* the caller stops the run: no jump past its time */
        while (periods > 0 &&
               c->now_s + (double)periods * period_s + horizon_s >= sim->stop_after_s)
            periods--;
    /* The virtual periods first (the physical ones left for the jumps to come); the
     * schedule's ops move by the physical ones only. */
    const uint64_t virtual_periods = MIN(virt, periods), moved_periods = periods - virtual_periods;
    /* Every moving reference (a stream's next op, a flow's, a queued event's) moves inside
     * the ops that repeat (periods_schedule). */
    for (size_t k = 0; k < c->moves.len && periods >= 2; k++) {
        const uint32_t op = (uint32_t)c->refs.i[2 * k + 1];
        const uint32_t s = op == NO_OP ? 0 : sim->ops[op].stage;
        if (c->moves.i[k] != 0 &&
            (c->moves.i[k] != f->steps[s] || op < eq_from[s] ||
             (int64_t)op + (int64_t)moved_periods * f->steps[s] >= (int64_t)eq_to[s]))
            periods = 0;
    }
    if (periods >= 2 && sim->extend_or_stop && virtual_periods * c->shift < f->virtual_left) {
        /* Not all the virtual micro-steps in this jump (a stop time or the grid's end comes
         * first): the caller runs the long schedule anyway, so the rest of this run is not
         * worth its time (SimOptions.extend_or_stop). */
        f->refused = "the virtual periods do not fit this jump";
        sim->stopped_s = c->now_s;
        periods = 0;
    }
    if (periods < 2) {
        g_array_free(times, TRUE);
        g_array_free(events, TRUE);
        g_free(lo);
        g_free(hi);
        return FALSE;
    }
    Walk w = {.apply = TRUE, .snap = c, .before = b, .periods = (uint32_t)periods,
              .physical = (uint32_t)moved_periods, .f = f, .sim = sim};
    w.d_at = 1;
    walk_ranks(&w, sim);
    const uint32_t instant = sim->queue.instant;
    snap_queue(&w, sim, times, events);
    const uint64_t op_events = sim->op_events;
    snap_counters(&w, sim);
    sim->virtual_op_events += (sim->op_events - op_events) / periods * virtual_periods;
    for (guint k = 0; k < events->len; k++) { /* the instants they were queued at */
        Event *e = &g_array_index(events, Event, k);
        e->made = sim->queue.instant - (instant - e->made);
    }
    sim_queue_replace(&sim->queue, times, events);
    g_array_free(times, TRUE);
    g_array_free(events, TRUE);
    for (uint32_t s = 0; s < f->stages; s++) {
        move_counts(f, sim, s, lo[s], hi[s], moved_periods);
        if (virtual_periods > 0) { /* before the window: its ops and those past it moved */
            const SimFoldInsert at = {lo[s], (uint32_t)f->steps[s], c->shift, virtual_periods};
            g_array_append_val(f->report.inserts, at);
        }
    }
    if (span == 1) {
        replay(f, sim, b->note_at, c->note_at, 1, 1, (uint32_t)periods, period_s);
    } else {
        replay(f, sim, a->note_at, b->note_at, 1, 2, (uint32_t)periods, period_s);
        replay(f, sim, b->note_at, c->note_at, 2, 2, (uint32_t)periods, period_s);
    }
    f->report.micro_steps += (uint32_t)moved_periods * c->shift;
    f->report.virtual_micro_steps += (uint32_t)virtual_periods * c->shift;
    f->virtual_left -= virtual_periods * c->shift;
    f->report.jumps++;
    g_free(lo);
    g_free(hi);
    return TRUE;
}

/* ---- the run's hooks ---- */

/* Stops keeping notes and drops those kept: the snapshots taken till now cannot be a jump's. */
static void notes_stop(SimFold *f, Sim *sim)
{
    f->notes_base += f->notes->len;
    g_array_set_size(f->notes, 0);
    f->epoch++;
    f->passing[0] = f->passing[1] = FALSE;
    sim->fold_recording = FALSE;
}

static void notes_drop(SimFold *f, Sim *sim)
{
    notes_stop(f, sim);
    g_hash_table_remove_all(f->snaps);
}

void sim_fold_note_add(Sim *sim, double *field, double x)
{
    const Note n = {NOTE_ADD, field, 0, x};
    g_array_append_val(sim->fold->notes, n);
}

void sim_fold_note_cell(Sim *sim, double *array, size_t at, double value)
{
    const Note n = {NOTE_CELL, array, at, value};
    sim->fold->cells_noted = TRUE;
    g_array_append_val(sim->fold->notes, n);
}

void sim_fold_note_rank(Sim *sim, size_t at, uint32_t rank)
{
    const Note n = {NOTE_RANK, NULL, at, rank};
    sim->fold->cells_noted = TRUE;
    g_array_append_val(sim->fold->notes, n);
}

/* Whether shift k waits for a window to pass an op that does not repeat (periods_schedule). */
static gboolean blocked(SimFold *f, const Sim *sim, uint32_t k)
{
    if (f->blocked_at[k] == UINT32_MAX)
        return FALSE;
    uint32_t lo, hi;
    window(f, sim, f->blocked_stage[k], &lo, &hi);
    if (lo <= f->blocked_at[k])
        return TRUE;
    f->blocked_at[k] = UINT32_MAX;
    return FALSE;
}

/* A snapshot's key: its head's micro-step and watched rank w. */
static uint64_t snap_key(uint32_t micro, uint32_t w)
{
    return (uint64_t)micro << 1 | w;
}

static Snap *find(SimFold *f, int64_t micro, uint32_t w)
{
    if (micro < 0)
        return NULL;
    const uint64_t key = snap_key((uint32_t)micro, w);
    return g_hash_table_lookup(f->snaps, &key);
}

/* Drops the notes every kept snapshot has passed. */
static void notes_trim(SimFold *f)
{
    uint64_t oldest = f->notes_base + f->notes->len;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, f->snaps);
    while (g_hash_table_iter_next(&it, NULL, &value)) /* those of this epoch */
        if (((Snap *)value)->epoch == f->epoch)
            oldest = MIN(oldest, ((Snap *)value)->note_at);
    const uint64_t drop = oldest - f->notes_base;
    if (drop * 2 > f->notes->len) {
        g_array_remove_range(f->notes, 0, (guint)drop);
        f->notes_base = oldest;
    }
}

/* Whether a jump by shift k's d micro-steps inside an interleaved group (up to the group's end
 * at most: the micro-steps after it do not repeat the ones before) gives way to the group's
 * shift: a jump drops every snapshot, and the group's shift needs GROUP_PERIODS periods of
 * them, so it waits where they fit before the clock's grid ends and in the micro-steps left,
 * and where the group's jump would skip more than this shift's jumps in each group left (few
 * long groups: narayanan21-t1-529.6b's 8 of 35 folds 301 micro-steps so, 191 waiting). */
static gboolean group_first(SimFold *f, Sim *sim, const Snap *b, uint32_t k, uint32_t span,
                            uint32_t micro, double now_s)
{
    const uint32_t d = f->shifts[k];
    if (f->group == 0 || d >= f->group || now_s <= 0)
        return FALSE;
    /* A group's period from this shift's: each micro-step of a group runs every chunk. */
    const double period_s = (now_s - b->now_s) / d * f->group * f->chunks;
    if (!(now_s + GROUP_PERIODS * period_s < SIM_CLOCK_GRID_END_S &&
          micro + GROUP_PERIODS * f->group < f->A))
        return FALSE;
    /* Worth the wait only where the group's jump would skip more than this shift's jumps
     * would, one a group, over the groups left: the group's comes a group on at the soonest
     * (two snapshots a group apart) and stops short of the last three (its room past the
     * window, the drain), while this one skips what the schedule allows now in each group. */
    uint32_t *lo = g_new(uint32_t, f->stages), *hi = g_new(uint32_t, f->stages);
    const uint64_t in_group = MIN(periods_schedule(f, sim, k, span, lo, hi), f->A) * d;
    g_free(lo);
    g_free(hi);
    const uint64_t left = f->A - micro;
    const uint64_t by_groups = left > 4 * (uint64_t)f->group ? left - 4 * (uint64_t)f->group : 0;
    return by_groups > in_group * left / f->group;
}

/* Watched rank w's compute stream moved on to op head: a snapshot where it is a head, and a
 * jump where the last three of its kind repeat. TRUE where it jumped. */
static gboolean at_head(SimFold *f, Sim *sim, uint32_t w, uint32_t head, double now_s)
{
    const uint32_t at = head == NO_OP ? 0
                                      : GPOINTER_TO_UINT(g_hash_table_lookup(
                                            f->heads, GUINT_TO_POINTER(head + 1)));
    if (at == 0)
        return FALSE;
    const uint32_t micro = at - 1; /* the head's number (find_heads) */
    Snap *c = sim_snap_new(micro, now_s);
    capture_first(f, sim, c);
    uint64_t *key = g_new(uint64_t, 1);
    *key = snap_key(micro, w);
    g_hash_table_replace(f->snaps, key, c);
    const uint32_t dmax = f->shifts[f->n_shifts - 1];
    const uint64_t old = snap_key(micro - MIN(micro, 2 * dmax + 1), w);
    if (micro >= 2 * dmax + 1)
        g_hash_table_remove(f->snaps, &old);
    f->passing[w] = FALSE;
    for (uint32_t k = 0; k < f->n_shifts; k++) {
        const uint32_t d = f->shifts[k];
        Snap *b = find(f, (int64_t)micro - d, w), *a = find(f, (int64_t)micro - 2 * d, w);
        if (blocked(f, sim, k) || !b)
            continue;
        /* c as b moved by a period (two snapshots), or each value moving by its own amount
         * twice (three: a lagging rank's times, GPipe's backward phase). */
        const gboolean two = sim_snap_same_steps(&b->first, &c->first);
        const gboolean three = a && sim_snap_same_steps3(&a->first, &b->first, &c->first);
        if (!two && !three)
            continue;
        /* The first tier repeats: the whole state, then, of this instant, kept for the heads
         * to come where the one before lacks it. */
        if (!c->full)
            capture(f, sim, c);
        /* The proof's first snapshot (b or a), once the snapshots it needs are whole. */
        const Snap *from = NULL;
        if (two && b->full && sim_snap_repeats(f->steps, f->stages, b, c))
            from = b;
        else if (three && a->full && b->full && sim_snap_repeats3(f->steps, f->stages, a, b, c))
            from = a;
        else if (!(two && !b->full) && !(three && !(a->full && b->full)))
            continue;
        f->passing[w] = TRUE;
        /* The cheap fields repeat: record from here on, and compare the countdowns. */
        if (!find_stages(f, sim)) {
            f->refused = "a stage's ops are not laid out together";
            return FALSE;
        }
        sim->fold_recording = TRUE;
        if (!c->has_status)
            push_status(f, sim, &c->status);
        c->has_status = TRUE;
        c->shift = d;
        if (from && from->has_status && b->has_status && from->epoch == c->epoch &&
            b->epoch == c->epoch && from->note_at >= f->notes_base &&
            (from == b ? same_status(f, &b->status, &c->status)
                       : same_status3(f, &a->status, &b->status, &c->status))) {
            /* A shift with no room to jump (the grid's end, or a sub-period: one
             * micro-step inside an interleaved group repeats the one before it up to
             * the group's end) leaves the snapshots and the longer shifts alone. */
            if (!group_first(f, sim, b, k, from == b ? 1 : 2, micro, now_s) &&
                jump(f, sim, from, b, c, k)) {
                notes_drop(f, sim);
                return TRUE;
            }
        }
    }
    if (sim->extend_or_stop && f->virtual_left > 0 && w == 0 && micro + 1 >= f->A) {
        /* The first stage's last micro-step began: its steady periods are over, so no jump
         * comes (every stage's ops must repeat ahead of it), and the virtual micro-steps left
         * will not be counted (SimOptions.extend_or_stop). */
        f->refused = "no jump counted the virtual periods before the last micro-step";
        sim->stopped_s = now_s;
    }
    return FALSE;
}

void sim_fold_boundary(SimFold *f, Sim *sim, double now_s)
{
    if (now_s >= SIM_CLOCK_GRID_END_S && !f->refused) {
        /* Past the grid no jump is exact: stop looking (and recording). */
        f->refused = PAST_GRID;
        notes_drop(f, sim);
        return;
    }
    for (uint32_t w = 0; w < 2 && !f->refused; w++) {
        const uint32_t rank = w ? sim->ranks - 1 : 0;
        const uint32_t head = sim->stream[rank].next[ZP_STREAM_COMPUTE];
        if (head == sim->fold_watch[w])
            continue;
        sim->fold_watch[w] = head;
        if (at_head(f, sim, w, head, now_s)) {
            sim->fold_watch[0] = sim->stream[0].next[ZP_STREAM_COMPUTE];
            sim->fold_watch[1] = sim->stream[sim->ranks - 1].next[ZP_STREAM_COMPUTE];
            return;
        }
    }
    if (sim->fold_recording && !f->passing[0] && !f->passing[1])
        notes_stop(f, sim); /* neither watched rank repeats: no jump near, no notes */
    else if (f->notes->len > NOTES_TRIM_AT) /* walking every snapshot costs: now and then */
        notes_trim(f);
}

SimFold *sim_fold_new(Sim *sim, gboolean turned_off, SimFoldReport *report)
{
    const uint32_t A = (uint32_t)MAX(sim->sched->plan.grad_accum, 1);
    const char *why = turned_off                 ? "turned off"
                      : sim->ranks != sim->sim_pp ? "a stage simulated as more than one rank "
                                                    "(explicit ranks, or rank classes: a slow "
                                                    "rank or link)"
                      : sim->weight              ? "ranks in blocks"
                      : A < 4                    ? "fewer than 4 micro-steps"
                      : sim->n_wide_rows > 0     ? "an op with over 255 dependencies"
                      : sim->stream_first[ZP_STREAM_COMPUTE] == NO_OP
                          ? "stage 0 computes nothing"
                          : NULL;
    for (uint32_t r = 0; !why && r < sim->ranks; r++)
        if (sim->stage_of[r] != r || !(sim->mem_pos[r] & MEM_EAGER))
            why = "a rank's memory shared with others";
    if (why) {
        *report = (SimFoldReport){0};
        g_snprintf(report->note, sizeof report->note, "not folded: %s", why);
        return NULL;
    }
    SimFold *f = g_new0(SimFold, 1);
    f->A = A;
    f->stages = sim->sim_pp;
    f->heads = g_hash_table_new(g_direct_hash, g_direct_equal);
    find_heads(f, sim);
    f->steps = g_new0(int64_t, f->stages);
    sim->fold_hi = g_new0(uint32_t, f->stages);
    for (uint32_t k = 0; k < MAX_SHIFTS; k++)
        f->blocked_at[k] = UINT32_MAX;
    f->shifts[f->n_shifts++] = 1;
    f->shifts[f->n_shifts++] = 2;
    if (sim->sched->plan.pipe.schedule == ZP_PIPE_1F1B && f->stages > 2)
        f->shifts[f->n_shifts++] = f->stages; /* a round trip (MAX_SHIFTS) */
    if (sim->sched->plan.pipe.schedule == ZP_PIPE_INTERLEAVED && f->stages > 1) {
        f->shifts[f->n_shifts++] = f->stages;
        f->shifts[f->n_shifts++] = 2 * f->stages;
        f->group = f->stages;
        f->chunks = (uint32_t)MAX(sim->sched->plan.pipe.virtual_stages, 1);
    }
    f->snaps = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, sim_snap_free);
    f->notes = g_array_new(FALSE, FALSE, sizeof(Note));
    f->report.inserts = g_array_new(FALSE, FALSE, sizeof(SimFoldInsert));
    /* GPipe's forward phase, which does not fold, would be short by the same micro-steps
     * as its backward phase: no virtual periods there (the caller runs the long one). */
    if (sim->sched->plan.pipe.schedule != ZP_PIPE_GPIPE || f->stages == 1)
        f->virtual_left = sim->extend_micro_steps;
    sim->fold_watch[0] = sim->fold_watch[1] = NO_OP;
    return f;
}

static gint insert_cmp(gconstpointer x, gconstpointer y)
{
    const SimFoldInsert *a = x, *b = y;
    return a->at < b->at ? -1 : a->at > b->at;
}

void sim_fold_free(SimFold *f, SimFoldReport *report)
{
    if (!f)
        return;
    g_array_sort(f->report.inserts, insert_cmp);
    *report = f->report;
    if (f->report.jumps > 0)
        g_snprintf(report->note, sizeof report->note,
                   "folded: %u micro-steps of every stage skipped in %u jump%s",
                   f->report.micro_steps, f->report.jumps, f->report.jumps == 1 ? "" : "s");
    else if (!f->refused && f->grid_end)
        /* A repeat whose jump would reach 2^22 s, where the clock's grid ends. */
        g_snprintf(report->note, sizeof report->note, "not folded: %s", PAST_GRID);
    else if (!f->refused && f->group > 0)
        /* A group's jump needs its snapshots over four groups and two more to jump, past the
         * fill: an interleaved run of few groups has no such room, and a jump inside a group
         * finds none either where a group is short. */
        g_snprintf(report->note, sizeof report->note,
                   "not folded: no steady state repeated exactly (interleaved: %u groups of %u "
                   "micro-steps; a group's jump needs 6)",
                   f->A / f->group, f->group);
    else
        g_snprintf(report->note, sizeof report->note, "not folded: %s",
                   f->refused ? f->refused : "no steady state repeated exactly");
    g_hash_table_destroy(f->heads);
    g_free(f->steps);
    g_free(f->stage_start);
    g_free(f->stage_end);
    g_free(f->lo_hint);
    g_free(f->equal_from);
    g_free(f->equal_to);
    g_free(f->equal_step);
    g_hash_table_destroy(f->snaps);
    g_array_free(f->notes, TRUE);
    g_free(f);
}
