/* sim_fold_jump: the fold's jump: the ops that repeat, the walk over the state that takes a
 * snapshot and writes the state periods on, the sums replayed (sim_fold.c says why it is exact). */
#include "sim_fold_jump.h"
#include "zp_u64map.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- the schedule ---- */

/* op + n periods on its stage (steps), or UINT32_MAX - 1 past the stage's ops. */
static uint32_t moved(const SimFold *f, const Sim *sim, uint32_t op, int64_t n)
{
    if (op == NO_OP)
        return op;
    const uint32_t s = sim->ops[op].stage;
    const int64_t to = (int64_t)op + n * f->steps[s];
    return to >= f->stage_start[s] && to < f->stage_end[s] ? (uint32_t)to : UINT32_MAX - 1;
}

/* What same_op reads, in locals for one walk of repeats_until (its stores through eq_to could
 * alias f's and sim's fields for the compiler, which then reloaded them at every op: about
 * 140 instructions an op pair, 134 M of plan --3d gpt-1t/4096's 3.28 G). */
typedef struct {
    const SimOp *ops;
    const Dependent *deps;
    const int64_t *steps;  /* [stage] (SimFold.steps) */
    const uint8_t *far;    /* Sim.fold_far, or NULL */
    int64_t stage_step;    /* the walked stage's (its ops' stream successors move by it) */
    gboolean words;        /* every stage's step is above 0, and op + step < 2^32 - 1, on
                            * a little-endian machine (same_op's shortcuts) */
} OpPairs;

/* Whether b has a's dependencies and as many dependents, `moved` places on: n_deps and
 * dependents_end as one little-endian word (n_deps the low half), b's that word with its high
 * half `moved` more, mod 2^32 as the halves' own differences. */
static inline gboolean same_counts(const SimOp *a, const SimOp *b, uint32_t moved)
{
    G_STATIC_ASSERT(offsetof(SimOp, dependents_end) == offsetof(SimOp, n_deps) + 4);
    if (G_BYTE_ORDER != G_LITTLE_ENDIAN)
        return a->n_deps == b->n_deps && b->dependents_end - a->dependents_end == moved;
    uint64_t a_word, b_word;
    memcpy(&a_word, &a->n_deps, sizeof a_word);
    memcpy(&b_word, &b->n_deps, sizeof b_word);
    return b_word == a_word + ((uint64_t)moved << 32);
}

/* Whether op j does what op i, a period before it, did: the same static facts, its stream's
 * next op and its dependents moved alike (each by its stage's step). An op a dependent or a
 * stream's next names is of that reference's stage (sim_ops.c: place_dependent takes the
 * dependent's stage from its op; a stream is one stage's), so within the stage's run of ops
 * (find_stages): moved by the stage's step, it is the op j names exactly when their indices
 * differ by that step (moved_on's bounds hold for it). */
static inline gboolean same_op(const OpPairs *p, uint32_t i, uint32_t j, uint32_t a_start,
                               uint32_t b_start)
{
    const SimOp *a = &p->ops[i], *b = &p->ops[j];
    /* b's dependents lie `moved` places past a's: as many as a's (their ends moved alike),
     * and as many of them ready at once */
    const uint32_t moved = b_start - a_start;
    /* kind, sub, stream, group, link, wide and stage: the op's first 8 bytes, compared at
     * once; duration_s, latency_s and bytes share one double (SimOp's union). */
    G_STATIC_ASSERT(offsetof(SimOp, stage) + sizeof(uint16_t) == 8 &&
                    offsetof(SimOp, n_deps) == 8);
    uint64_t a_head, b_head;
    memcpy(&a_head, a, sizeof a_head);
    memcpy(&b_head, b, sizeof b_head);
    if (a_head != b_head || a->wide || !same_counts(a, b, moved) ||
        b->dependents_ready - a->dependents_ready != moved ||
        a->duration_s != b->duration_s || a->transfer_s != b->transfer_s)
        return FALSE;
    if (p->words) {
        /* a's successor moved, below NO_OP (op + step < 2^32 - 1), or NO_OP kept */
        const uint32_t next = a->stream_next == NO_OP ? NO_OP
                                                      : a->stream_next + (uint32_t)p->stage_step;
        if (b->stream_next != next)
            return FALSE;
    } else if ((a->stream_next == NO_OP) != (b->stream_next == NO_OP) ||
               (a->stream_next != NO_OP &&
                (int64_t)b->stream_next - (int64_t)a->stream_next != p->stage_step)) {
        return FALSE;
    }
    const uint32_t n = a->dependents_end - a_start;
    const Dependent *x = &p->deps[a_start], *y = &p->deps[b_start];
    /* stage, stream and counted: the 4 bytes after op, compared at once */
    G_STATIC_ASSERT(offsetof(Dependent, op) == 0 && offsetof(Dependent, stage) == 4 &&
                    sizeof(Dependent) == 8);
    if (p->words) {
        /* Each dependent moved by its stage's step, which is what the loop below accepts
         * where no sink is among them (one is compared there, as it stays put). A Dependent
         * read as one little-endian 8-byte word is op + 2^32 x its tail (its stage the low
         * 16 bits); with every op + step below 2^32 (OpPairs.words), y's word is x's plus
         * x's stage's step exactly when the tails are equal and y's op is x's plus that step,
         * which is not 0. */
        uint64_t differ = 0;
        for (uint32_t k = 0; k < n; k++) {
            uint64_t x_word, y_word;
            memcpy(&x_word, &x[k], sizeof x_word);
            memcpy(&y_word, &y[k], sizeof y_word);
            differ |= (y_word - x_word) ^ (uint64_t)p->steps[(uint16_t)(x_word >> 32)];
        }
        if (differ == 0)
            return TRUE;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t x_tail, y_tail;
        memcpy(&x_tail, (const char *)&x[k] + offsetof(Dependent, stage), sizeof x_tail);
        memcpy(&y_tail, (const char *)&y[k] + offsetof(Dependent, stage), sizeof y_tail);
        const int64_t step = p->steps[x[k].stage];
        if (x_tail != y_tail || step == 0)
            return FALSE;
        /* A sink (sim_fold.c) stays put: both count the same op down. Any other op is moved
         * a period on, never onto itself (its stage's step is not 0). */
        if (x[k].op == y[k].op) {
            if (!(x[k].counted && p->far && p->far[x[k].op] == SIM_FOLD_SINK))
                return FALSE;
        } else if ((int64_t)y[k].op - (int64_t)x[k].op != step) {
            return FALSE;
        }
    }
    return TRUE;
}

/* ---- repeats borrowed from other shifts' ----
 *
 * Two shifts' proofs give a third without a walk. Say shift k's walks (steps S, stage s's D)
 * proved op j - G does what op j - G - D did, and shift g's (steps T, stage s's G) proved ops
 * j - D and j do what ops j - G - D and j - G did. Then op j does what op j - D did, under S:
 * the static fields are equal through the chain; j - D's stream successor is j - G - D's moved
 * G on and j's is j - G's moved G on, which lies D past j - G - D's, so j's lies D past
 * j - D's; each dependent the same way, by its stage t's S_t and T_t (its tail, stage and
 * stream, equal through the chain). A dependent that stays put (a sink: same_op) breaks the
 * chain, as it may stay in one proof and move in the other: with sinks nothing is borrowed.
 * Both proofs must be of the steps their shifts walk under now (SimFold.steps_gen). The ops
 * proven are those a walk would find, so every jump is the one the walks gave:
 * narayanan21-t1-529.6b walked each stage's ops inside a group (shift 1, a chunk's
 * micro-step) again after its group's shift (35) proved the groups repeat: 71,884 ops are
 * borrowed now, and 219,005 pairs walked, where 331,788 were. */

/* Whether a run begun at generation gen was proven under the steps shift k walks under now. */
static gboolean run_current(const SimFold *f, uint32_t k, uint32_t gen)
{
    return gen == f->steps_gen[k];
}

/* How far from `to` on stage s's ops repeat under shift k's steps by the proofs above (`to`
 * where no proof gives one more): shift k's run P (its current one, [from, to), or its prior)
 * holding op to - G and another shift g's current run Q holding ops to - D and to give every op
 * j from `to` with j - G in P and j in Q. Each gain extends the current run: tried again. */
static uint32_t borrowed_end(const SimFold *f, uint32_t k, uint32_t s, uint32_t from,
                             uint32_t to)
{
    const size_t at = (size_t)k * f->stages + s;
    const int64_t d = f->equal_step[at];
    if (f->sink_start || d <= 0 || !run_current(f, k, f->equal_gen[at]))
        return to;
    const ProvenRun *prior = &f->prior[at];
    const gboolean prior_current = run_current(f, k, prior->gen);
    for (uint32_t before = UINT32_MAX; before != to;) {
        before = to;
        for (uint32_t g = 0; g < f->n_shifts; g++) {
            const size_t q = (size_t)g * f->stages + s;
            const int64_t g_step = f->equal_step[q], q_end = f->equal_to[q];
            if (g == k || g_step <= 0 || !run_current(f, g, f->equal_gen[q]) ||
                (int64_t)to - d < (int64_t)f->equal_from[q] || to >= q_end)
                continue;
            const int64_t back = (int64_t)to - g_step; /* op j - G for j = to */
            int64_t reach = to;
            if (back >= from)
                reach = MIN((int64_t)to + g_step, q_end);
            if (prior_current && back >= prior->from && back < prior->to)
                reach = MAX(reach, MIN((int64_t)prior->to + g_step, q_end));
            to = (uint32_t)reach; /* reach >= to, below q_end */
        }
    }
    return to;
}

/* Walks shift k's repeat of stage s on from equal_to while each op does what the op a period
 * before it did, up to `need` (INT64_MAX: as far as it goes), under the steps the shift's walks
 * read (equal_steps); first as far as other shifts' proofs give (borrowed_end). equal_open says
 * whether it stopped at `need` alone: it can go on. */
static void walk_on(SimFold *f, const Sim *sim, uint32_t k, uint32_t s, int64_t need)
{
    const size_t at = (size_t)k * f->stages + s;
    const int64_t *steps = &f->equal_steps[(size_t)k * f->stages];
    const int64_t step = f->equal_step[at];
    /* same_op's shortcuts: a Dependent read as one little-endian word (its op the low half),
     * and a stream successor moved, where every op + step stays below 2^32 - 1 (NO_OP) */
    OpPairs p = {.ops = sim->ops, .deps = sim->dependents, .steps = steps,
                 .far = sim->fold_far, .stage_step = steps[s],
                 .words = G_BYTE_ORDER == G_LITTLE_ENDIAN};
    for (uint32_t t = 0; t < f->stages; t++)
        p.words = p.words && steps[t] > 0 &&
                  (uint64_t)sim->n_ops + (uint64_t)steps[t] < ((uint64_t)1 << 32) - 1;
    const uint32_t end = f->stage_end[s];
    const int64_t first = (int64_t)f->stage_start[s] + step;
    uint32_t to = f->equal_to[at];
    if (to < need)
        to = borrowed_end(f, k, s, f->equal_from[at], to);
    if (to >= first) { /* `to` only grows: the bounds are one */
        const uint32_t stop = (uint32_t)MIN(need, (int64_t)end);
        /* An op's dependents begin where those of the op before it end: carried from pair to
         * pair, not loaded again (same_op's a_start and b_start) */
        uint32_t i = (uint32_t)(to - step);
        uint32_t a_start = i == 0 ? 0 : sim->ops[i - 1].dependents_end,
                 b_start = sim->ops[to - 1].dependents_end;
        while (to < stop && same_op(&p, i, to, a_start, b_start)) {
            a_start = sim->ops[i].dependents_end;
            b_start = sim->ops[to].dependents_end;
            i++;
            to++;
        }
    }
    f->equal_to[at] = to;
    f->equal_open[at] = to >= need && to < end && to >= first;
}

/* Shift k's walks read the steps they began under (f->steps is set anew at each proof): where
 * those change, the walks not yet at their end are finished under the old ones first, as a
 * walk that went to its end at once would have been. */
static void sync_steps(SimFold *f, const Sim *sim, uint32_t k)
{
    int64_t *steps = &f->equal_steps[(size_t)k * f->stages];
    if (memcmp(steps, f->steps, f->stages * sizeof *steps) == 0)
        return;
    for (uint32_t s = 0; s < f->stages; s++)
        if (f->equal_open[(size_t)k * f->stages + s])
            walk_on(f, sim, k, s, INT64_MAX);
    memcpy(steps, f->steps, f->stages * sizeof *steps);
    f->steps_gen[k]++; /* the runs proven till now are of other steps: none borrowed */
}

/* The first op past `from` of stage s that does not do what the op a period before it did
 * (every op in [from, that) does), from the stage's end at most; `from` itself where the
 * ops before `from` back to `back` do not repeat either. Remembered for the current steps.
 * The walk stops at `need` (INT64_MAX: none) where it gets there, and goes on from there
 * when asked for more (a jump needs the ops to repeat only as far as it goes: sim_jump_periods),
 * so what it finds is what one walk to the end finds, as far as it went. */
static uint32_t repeats_until(SimFold *f, const Sim *sim, uint32_t k, uint32_t s,
                              uint32_t back, uint32_t from, int64_t need)
{
    const int64_t step = f->steps[s];
    const size_t at = (size_t)k * f->stages + s;
    if (f->equal_step[at] == step && back >= f->equal_from[at] && back > f->equal_to[at] &&
        f->equal_open[at])
        walk_on(f, sim, k, s, back);
    if (f->equal_step[at] != step || back < f->equal_from[at] || back > f->equal_to[at]) {
        f->prior[at] = (ProvenRun){f->equal_from[at], f->equal_to[at], f->equal_gen[at]};
        f->equal_step[at] = step;
        f->equal_from[at] = f->equal_to[at] = back;
        f->equal_gen[at] = f->steps_gen[k];
        f->equal_open[at] = TRUE;
    }
    if (f->equal_open[at])
        walk_on(f, sim, k, s, need);
    return f->equal_to[at] >= from ? f->equal_to[at] : from;
}

void sim_jump_window(SimFold *f, const Sim *sim, uint32_t s, uint32_t *lo, uint32_t *hi)
{
    /* In locals, and a done op (most of those passed) known by its countdown alone */
    const SimOp *const ops = sim->ops;
    const Countdown *const countdown = sim->countdown;
    const uint32_t end = f->stage_end[s];
    uint32_t i = f->lo_hint[s];
    while (i < end && (countdown[i].row == COUNTS_DONE || !sim_jump_counted(&ops[i]) ||
                       sim_jump_status(sim, s, i) == 0))
        i++;
    f->lo_hint[s] = i;
    *lo = i;
    *hi = MAX(i, sim->fold_hi[s]);
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

/* Inlined where called: each kind is a constant there (a snapshot's walk of 35 ranks made 2,520
 * calls of each of its three copies). */
G_ALWAYS_INLINE static inline void walk_double(Walk *w, double *x, FieldKind kind)
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
    /* The flows in flight or with members arrived, each by its index, then an end mark: an
     * idle one (most of narayanan21-t1-529.6b's 2,450) adds nothing, where each added a 0
     * (equal lists are equal states as before). */
    for (uint32_t k = 0; k < sim->n_flows; k++) {
        Flow *fl = &sim->flows[k];
        if (!fl->active && !fl->arrived)
            continue;
        walk_int(w, k);
        walk_int(w, fl->active | (int64_t)fl->arrived << 1);
        walk_op(w, &fl->op);
        if (!fl->active)
            continue;
        walk_double(w, &fl->start_s, FIELD_MOVES);
        walk_double(w, &fl->transfer_from_s, FIELD_MOVES);
        walk_double(w, &fl->remaining_s, FIELD_MOVES);
        walk_double(w, &fl->share, FIELD_MOVES);
        walk_double(w, &fl->end_s, FIELD_MOVES);
    }
    walk_int(w, -1);
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

void sim_jump_capture_first(SimFold *f, Sim *sim, Snap *snap)
{
    /* Written in place, room made once: a push each (its length stored back every time, as
     * the stores could alias it) cost some 16 instructions a value. */
    const size_t n = 1 + 3 * (size_t)sim->ranks;
    vec_grow(&snap->first, n);
    double *d = snap->first.d + snap->first.len;
    *d++ = snap->now_s;
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const RankState *rs = &sim->rank[r];
        d[0] = rs->mark_s, d[1] = rs->end_s, d[2] = rs->flush_s;
        d += 3;
    }
    snap->first.len += n;
    snap->note_at = f->notes_base + f->notes.len;
    snap->epoch = f->epoch;
}

void sim_jump_capture(SimFold *f, Sim *sim, Snap *snap)
{
    snap->full = TRUE;
    /* Room for what the last snapshot held: one allocation each, not a dozen doublings (the
     * bytes' and peaks' places too: theirs were 411 reallocs, 0.76 M instructions, over
     * narayanan21-t1-529.6b's 67 snapshots). */
    Vec *const parts[] = {&snap->d, &snap->i, &snap->refs, &snap->bytes, &snap->peaks};
    G_STATIC_ASSERT(G_N_ELEMENTS(parts) == G_N_ELEMENTS(f->sizes));
    for (size_t k = 0; k < G_N_ELEMENTS(parts); k++)
        vec_grow(parts[k], f->sizes[k]);
    Walk w = {.snap = snap, .f = f, .sim = sim};
    vec_double(&snap->d, snap->now_s);
    walk_ranks(&w, sim);
    GArray *times = g_array_new(FALSE, FALSE, sizeof(double));
    GArray *events = g_array_new(FALSE, FALSE, sizeof(Event));
    snap_queue(&w, sim, times, events);
    g_array_free(times, TRUE);
    g_array_free(events, TRUE);
    snap_counters(&w, sim);
    snap->note_at = f->notes_base + f->notes.len;
    snap->epoch = f->epoch;
    for (size_t k = 0; k < G_N_ELEMENTS(parts); k++)
        f->sizes[k] = parts[k]->len;
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
        if (!sim_jump_counted(&sim->ops[i]))
            continue;
        if (i - shift >= (int64_t)lo)
            sim->countdown[i] = sim->countdown[i - shift];
        else
            sim->countdown[i].row = COUNTS_DONE;
    }
    f->lo_hint[s] = lo;
    sim->fold_hi[s] = (uint32_t)MAX((int64_t)sim->fold_hi[s], (int64_t)hi + shift);
}

/* Note n as the period `moves` periods on records it: a sum's addition the same, a timeline
 * cell (or its last rank) at the op that many periods on, a cell's time moved alike, by its
 * step a period (the period, or its own: sim_fold_notes). */
static Note note_moved(const SimFold *f, const Sim *sim, Note n, uint32_t moves, double step_s)
{
    if (n.kind == NOTE_ADD)
        return n;
    const uint32_t op = (uint32_t)(n.at % sim->n_ops);
    n.at = n.at - op + moved(f, sim, op, moves);
    if (n.kind == NOTE_CELL)
        n.x += (double)moves * step_s;
    return n;
}

/* How far the cells move a period: each its own step (cells.step, notes from cells.from on)
 * after a proof by three snapshots, else the period. */
typedef struct {
    const double *step;
    uint64_t from;
    double period_s;
} CellSteps;

static inline double cell_step(const CellSteps *cells, uint64_t note)
{
    return cells->step ? cells->step[note - cells->from] : cells->period_s;
}

/* Replays the notes of [from, to) for the skipped periods first, first + stride, .. up to
 * periods (note_moved). Two snapshots (stride 1): the one recorded period, j periods on for
 * skipped period j. Three (stride 2): skipped period j is recorded period a -> b (odd j) or
 * b -> c (even j), two or one periods before c: j + 1 or j periods on. */
static void replay(SimFold *f, Sim *sim, uint64_t from, uint64_t to, uint32_t first,
                   uint32_t stride, uint32_t periods, const CellSteps *cells)
{
    if (!f->cells_noted) {
        /* Sums alone (no timeline cell was noted: every note is NOTE_ADD): some 3 M additions
         * in plan --3d gpt-1t/4096, 6.2 M in Megatron 1T's evaluation. */
        const Note *v = f->notes.v + (from - f->notes_base);
        sim_fold_replay_sums(v, (size_t)(to - from),
                             first <= periods ? (periods - first) / stride + 1 : 0);
        return;
    }
    for (uint32_t j = first; j <= periods; j += stride) {
        const uint32_t moves = stride == 1 ? j : j + (j & 1);
        for (uint64_t k = from; k < to; k++) {
            const Note *at = &f->notes.v[k - f->notes_base];
            if (at->kind == NOTE_ADD) { /* the same addition, unmoved (note_moved) */
                *at->field += at->x;
                continue;
            }
            const Note n = note_moved(f, sim, *at, moves, cell_step(cells, k));
            if (n.kind == NOTE_RANK)
                sim->op_last_rank[n.at] = (uint32_t)n.x;
            else
                n.field[n.at] = n.x;
        }
    }
}

/* Appends the log's n notes from index `at` to it again, room made once (narayanan21-t1-529.6b's
 * jumps inside groups logged 230,000 notes one push each). A loop: memcpy here (its rep movsb)
 * counted 3.8 M instructions more under callgrind, which these figures are. */
static void notes_reserve(NoteLog *log, size_t n)
{
    if (log->len + n > log->cap) {
        while (log->len + n > log->cap)
            log->cap = log->cap ? 2 * log->cap : 4096;
        log->v = g_renew(Note, log->v, log->cap);
    }
}

static void notes_copy(NoteLog *log, size_t at, size_t n)
{
    notes_reserve(log, n);
    Note *to = log->v + log->len;
    const Note *from = log->v + at; /* at + n <= len: apart */
    for (size_t k = 0; k < n; k++)
        to[k] = from[k];
    log->len += n;
}

/* Appends to the log the notes the skipped periods would have recorded, in the order stepping
 * records them (period by period: skipped period j is the recorded one replay() gives it),
 * cells at the ops they were written at: the log from any snapshot before the jump on is then
 * the one an unfolded run keeps, and those snapshots stay a later proof's first. */
static void log_skipped(SimFold *f, const Sim *sim, const Snap *a, const Snap *b, const Snap *c,
                        uint32_t span, uint32_t periods, const CellSteps *cells)
{
    /* Room for every skipped period's notes at once: grown period by period, the log was
     * copied by realloc twice in narayanan21-t1-529.6b's jumps inside groups (1.57 M
     * instructions, 9 MB of notes moved). */
    size_t total = 0;
    for (uint32_t j = 1; j <= periods; j++)
        total += (size_t)(span == 2 && (j & 1) ? b->note_at - a->note_at : c->note_at - b->note_at);
    notes_reserve(&f->notes, total);
    for (uint32_t j = 1; j <= periods; j++) {
        const gboolean older = span == 2 && (j & 1);
        const uint64_t from = older ? a->note_at : b->note_at, to = older ? b->note_at : c->note_at;
        const uint32_t moves = span == 1 ? j : j + (j & 1);
        if (!f->cells_noted) { /* sums alone: every note as recorded (note_moved) */
            notes_copy(&f->notes, (size_t)(from - f->notes_base), (size_t)(to - from));
            continue;
        }
        for (uint64_t k = from; k < to; k++)
            note_push(&f->notes, note_moved(f, sim, f->notes.v[k - f->notes_base], moves,
                                            cell_step(cells, k)));
    }
}

/* The most periods stage s's window may move from hi (one past it) and stay short of the far
 * ops that began counting down (sim_fold.c's head comment: none is counted down in the
 * periods skipped, and move_counts writes none); INT64_MAX where none did. On the builder's
 * schedules the ops stop repeating before a far op (DeepSpeed's: at the last micro-step's
 * embedding backward, which the reduction follows), so the room the repeat leaves is the
 * smaller; the proof does not lean on that. */
static int64_t far_periods(const SimFold *f, const Sim *sim, uint32_t s, uint32_t hi,
                           int64_t step)
{
    int64_t most = INT64_MAX;
    for (uint32_t k = f->far_start ? f->far_start[s] : 0;
         f->far_start && k < f->far_start[s + 1]; k++)
        if (f->far[k] >= hi && sim_jump_status(sim, s, f->far[k]) != 1) {
            most = ((int64_t)f->far[k] - (int64_t)hi) / step;
            break;
        }
    /* The sinks: the window stays short of each (they lie past every micro-step's ops, so
     * the ops stop repeating before them anyway), and no skipped period counts one to 0
     * (each counts it down by its fall: sim_fold.c's head comment). */
    for (uint32_t k = f->sink_start ? f->sink_start[s] : 0;
         f->sink_start && k < f->sink_start[s + 1]; k++) {
        const uint32_t i = f->sink[k];
        const int64_t left = sim_jump_sink_left(sim, s, i), fall = f->sink_fall[k];
        most = MIN(most, i < hi ? -1 : ((int64_t)i - (int64_t)hi) / step);
        if (fall > 0)
            most = MIN(most, (left - 1) / fall);
    }
    return most;
}

/* Counts stage s's sinks down by what `periods` periods count (sim_fold.c's head comment):
 * each by its fall a period. */
static void move_sinks(const SimFold *f, Sim *sim, uint32_t s, uint64_t periods)
{
    for (uint32_t k = f->sink_start ? f->sink_start[s] : 0;
         f->sink_start && k < f->sink_start[s + 1]; k++) {
        const uint32_t i = f->sink[k];
        const int64_t fall = f->sink_fall[k] * (int64_t)periods;
        if (fall == 0)
            continue;
        const Countdown *c = &sim->countdown[i];
        g_assert(c->row != COUNTS_DONE && c->row != COUNTS_UNUSED &&
                 sim_jump_sink_left(sim, s, i) > fall); /* far_periods */
        if (c->row == COUNTS_WIDE)
            sim->pending_wide[(size_t)c->wide_row * sim->ranks + s] -= (uint32_t)fall;
        else if (c->row == COUNTS_SOLO)
            sim->countdown[i].left -= (uint32_t)fall;
        else
            sim->rows[(size_t)c->row * sim->ranks + s] -= (uint8_t)fall;
    }
}

int64_t sim_jump_periods(SimFold *f, Sim *sim, uint32_t k, uint32_t span, uint32_t *lo,
                         uint32_t *hi)
{
    int64_t most = INT64_MAX;
    uint32_t block_at = UINT32_MAX, block_stage = 0;
    sync_steps(f, sim, k);
    for (uint32_t s = 0; s < f->stages && most >= 0; s++) {
        const int64_t step = f->steps[s];
        sim_jump_window(f, sim, s, &lo[s], &hi[s]);
        if (step <= 0 || (int64_t)lo[s] - span * step < (int64_t)f->stage_start[s] + step) {
            most = -1;
            break;
        }
        const uint32_t back = (uint32_t)(lo[s] - span * step);
        /* The ops need repeat only as far as the jump can go: past the room the stages
         * before left (most) and this one's far ops leave, and past two periods (room for
         * less blocks the shift). Where they repeat that far, the room found is that. Once a
         * stage before blocked the shift (room for fewer than two periods: most is 0 or 1,
         * a jump of virtual periods alone), past `most` periods: a longer walk decides
         * nothing (narayanan21-t1-529.6b's group jump walked 34 stages 1,000 ops further). */
        const int64_t far = far_periods(f, sim, s, hi[s], step);
        const int64_t cap = MAX(MIN(most, far), block_at != UINT32_MAX ? 0 : 2);
        const int64_t need = cap >= ((int64_t)f->stage_end[s] - hi[s]) / step + 2
                                 ? INT64_MAX
                                 : (int64_t)hi[s] + (cap + 1) * step;
        const uint32_t until = repeats_until(f, sim, k, s, back, hi[s], need);
        if (f->equal_from[(size_t)k * f->stages + s] > back) {
            most = -1;
            break;
        }
        /* Room for n periods past the window and one more: until >= hi + (n + 1) step. */
        const int64_t room = (int64_t)until < (int64_t)hi[s] + step
                                 ? -1
                                 : ((int64_t)until - (int64_t)hi[s]) / step - 1;
        if (room < 2 && block_at == UINT32_MAX) {
            block_at = until;
            block_stage = s;
        }
        most = MIN(most, MIN(room, far));
    }
    if (block_at != UINT32_MAX) {
        /* No room for two periods before an op that does not repeat: the window moves
         * towards it, so this shift waits till the window is past it. */
        f->blocked_at[k] = block_at;
        f->blocked_stage[k] = block_stage;
    }
    return most;
}

/* The most of `periods` the caller's stop time allows (SimOptions.stop_after_s): no jump
 * whose last queued event (times: the queue's, from sim_queue_events) would reach it. */
static uint64_t periods_before_stop(const Sim *sim, const Snap *c, const GArray *times,
                                    double period_s, uint64_t periods)
{
    if (sim->stop_after_s <= 0)
        return periods;
    double horizon_s = 0; /* the last queued event, from now */
    for (guint k = 0; k < times->len; k++)
        horizon_s = MAX(horizon_s, g_array_index(times, double, k) - c->now_s);
    while (periods > 0 && c->now_s + (double)periods * period_s + horizon_s >= sim->stop_after_s)
        periods--;
    return periods;
}

/* Whether every moving reference of c (a stream's next op, a flow's, a queued event's) moves
 * by its stage's step and stays inside the ops that repeat for shift k (sim_jump_periods)
 * over `physical` periods. */
static gboolean refs_stay_inside(SimFold *f, const Sim *sim, const Snap *c, uint32_t k,
                                 uint64_t physical)
{
    const uint32_t *eq_from = &f->equal_from[(size_t)k * f->stages],
                   *eq_to = &f->equal_to[(size_t)k * f->stages];
    for (size_t r = 0; r < c->moves.len; r++) {
        const uint32_t op = (uint32_t)c->refs.i[2 * r + 1];
        const uint32_t s = op == NO_OP ? 0 : sim->ops[op].stage;
        if (c->moves.i[r] == 0)
            continue;
        const int64_t last = (int64_t)op + (int64_t)physical * f->steps[s];
        if (last >= (int64_t)eq_to[s] && f->equal_open[(size_t)k * f->stages + s])
            walk_on(f, sim, k, s, last + 1); /* repeats_until's walk, on as far as needed */
        if (c->moves.i[r] != f->steps[s] || op < eq_from[s] || last >= (int64_t)eq_to[s])
            return FALSE;
    }
    return TRUE;
}

/* Writes the state `periods` periods on from c (b a period before it): every time, sum and
 * counter moved by them all, the op references by the `physical` ones (the rest virtual, their
 * op events counted in Sim.virtual_op_events); the queue's events (times and events, from
 * sim_queue_events) moved and put back. */
static void move_state(SimFold *f, Sim *sim, const Snap *b, Snap *c, uint64_t periods,
                       uint64_t physical, GArray *times, GArray *events)
{
    Walk w = {.apply = TRUE, .snap = c, .before = b, .periods = (uint32_t)periods,
              .physical = (uint32_t)physical, .f = f, .sim = sim};
    w.d_at = 1;
    walk_ranks(&w, sim);
    const uint32_t instant = sim->queue.instant;
    snap_queue(&w, sim, times, events);
    const uint64_t op_events = sim->op_events;
    snap_counters(&w, sim);
    sim->virtual_op_events += (sim->op_events - op_events) / periods * (periods - physical);
    for (guint k = 0; k < events->len; k++) { /* the instants they were queued at */
        Event *e = &g_array_index(events, Event, k);
        e->made = sim->queue.instant - (instant - e->made);
    }
    sim_queue_replace(&sim->queue, times, events);
}

gboolean sim_jump_stopped_exact(SimFold *f, Sim *sim)
{
    if (!f->stop_from)
        return FALSE;
    const uint32_t k = f->stop_shift;
    for (uint32_t s = 0; s < f->stages; s++) {
        const size_t at = (size_t)k * f->stages + s;
        uint32_t lo, hi;
        sim_jump_window(f, sim, s, &lo, &hi);
        if (f->equal_open[at] && f->equal_to[at] < hi)
            walk_on(f, sim, k, s, hi);
        if (f->equal_step[at] <= 0 || f->equal_from[at] > f->stop_from[s] ||
            f->equal_to[at] < hi)
            return FALSE;
    }
    return TRUE;
}

gboolean sim_jump_advance(SimFold *f, Sim *sim, const Snap *a, Snap *b, Snap *c,
                          uint32_t k_shift, gboolean log)
{
    const uint32_t span = a == b ? 1 : 2;
    uint32_t *lo = g_new(uint32_t, f->stages), *hi = g_new(uint32_t, f->stages);
    const int64_t most = sim_jump_periods(f, sim, k_shift, span, lo, hi);
    const uint64_t physical = most >= 2 ? (uint64_t)most : 0;
    /* Virtual periods (Sim.extend_micro_steps) where the window and a period past it repeat,
     * by a whole period of the builder's schedule (an interleaved group, not a shift inside
     * one): the longer schedule's ops repeat over as many more. */
    const gboolean whole = c->shift % MAX(f->group, 1) == 0;
    const uint64_t virt = most >= 0 && !f->cells_noted && whole ? f->virtual_left / c->shift : 0;
    /* The whole state repeated (the caller's proof) but the ops not a period past the window:
     * on a short schedule, its drain came first (deepseek-v3 tp 4 pp 32 repeats every 26
     * micro-steps, and 130 kept of 768 left no room; 170 kept count 598 virtual). */
    if (most < 0 && whole && sim->extend_or_stop && f->virtual_left > 0 && !f->report.extend_room)
        f->report.extend_room = c->shift;
    uint64_t periods = MIN(sim_snap_periods_exact(a, c, span, &f->grid_end), physical + virt);
    GArray *times = g_array_new(FALSE, FALSE, sizeof(double));
    GArray *events = g_array_new(FALSE, FALSE, sizeof(Event));
    sim_queue_events(&sim->queue, times, events);
    const double period_s = c->now_s - b->now_s;
    /* Every virtual period would be counted but for the stop time: the run goes on to it,
     * jumping those before it, and its stop is the long schedule's (sim_fold_stopped_exact). */
    const gboolean all_but_stop = sim->extend_or_stop && whole && f->virtual_left > 0 &&
                                  MIN(virt, periods) * c->shift >= f->virtual_left;
    periods = periods_before_stop(sim, c, times, period_s, periods);
    /* The virtual periods first (the physical ones left for the jumps to come); the
     * schedule's ops move by the physical ones only. */
    const uint64_t virtual_periods = MIN(virt, periods), moved_periods = periods - virtual_periods;
    if (periods >= 1 && !refs_stay_inside(f, sim, c, k_shift, moved_periods))
        periods = 0;
    if (all_but_stop && virtual_periods * c->shift < f->virtual_left && !f->stop_from) {
        f->stop_shift = k_shift;
        f->stop_from = g_memdup2(lo, f->stages * sizeof *lo);
    } else if (periods >= 1 && sim->extend_or_stop && whole &&
               virtual_periods * c->shift < f->virtual_left && !f->stop_from) {
        /* Not all the virtual micro-steps in this jump (a stop time or the grid's end comes
         * first): the caller runs the long schedule anyway, so the rest of this run is not
         * worth its time (SimOptions.extend_or_stop). A jump inside an interleaved group
         * counts none: the group's shift comes after it (sim_fold.c). */
        f->refused = "the virtual periods do not fit this jump";
        sim->stopped_s = c->now_s;
        if (f->virtual_left % c->shift != 0)
            f->report.extend_period = c->shift;
        periods = 0;
    }
    /* Two periods at least, or virtual ones alone (no op moves: sim_fold.c's head comment). */
    const gboolean jumps = periods >= 2 || (periods == 1 && moved_periods == 0);
    if (jumps)
        move_state(f, sim, b, c, periods, moved_periods, times, events);
    g_array_free(times, TRUE);
    g_array_free(events, TRUE);
    if (!jumps) {
        g_free(lo);
        g_free(hi);
        return FALSE;
    }
    for (uint32_t s = 0; s < f->stages; s++) {
        move_counts(f, sim, s, lo[s], hi[s], moved_periods);
        move_sinks(f, sim, s, moved_periods);
        if (virtual_periods > 0) { /* before the window: its ops and those past it moved */
            const SimFoldInsert at = {lo[s], (uint32_t)f->steps[s], c->shift, virtual_periods};
            g_array_append_val(f->report.inserts, at);
        }
    }
    /* Three snapshots: each value moved by its own step, a lagging stage's cells too. */
    const CellSteps cells = {
        span == 2 && f->cells_noted
            ? sim_fold_cell_steps(sim, f->notes.v + (a->note_at - f->notes_base),
                                  (size_t)(c->note_at - a->note_at),
                                  (size_t)(b->note_at - a->note_at), f->steps, period_s)
            : NULL,
        a->note_at, period_s};
    if (span == 1) {
        replay(f, sim, b->note_at, c->note_at, 1, 1, (uint32_t)periods, &cells);
    } else {
        replay(f, sim, a->note_at, b->note_at, 1, 2, (uint32_t)periods, &cells);
        replay(f, sim, b->note_at, c->note_at, 2, 2, (uint32_t)periods, &cells);
    }
    if (log)
        log_skipped(f, sim, a, b, c, span, (uint32_t)periods, &cells);
    g_free((double *)cells.step);
    /* In each stage's micro-steps of one chunk (a forward and a backward, what a shift inside
     * an interleaved group moves by): a group's runs every chunk. */
    f->report.micro_steps += (uint32_t)moved_periods * c->shift * (whole ? MAX(f->chunks, 1) : 1);
    f->report.virtual_micro_steps += (uint32_t)virtual_periods * c->shift;
    f->virtual_left -= virtual_periods * c->shift;
    f->report.jumps++;
    g_free(lo);
    g_free(hi);
    return TRUE;
}
