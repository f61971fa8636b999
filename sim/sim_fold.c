/* sim_fold: a pipeline's steady state (and gradient accumulation's micro-steps) advanced by
 * whole periods, bit for bit what stepping every event would give, or refused for the plan.
 *
 * Why it is exact. Every time the engine computes is an event time plus a duration, or a
 * difference of two times scaled by a constant (sim_engine.c: start_timed_op, start_flow,
 * reshare, account). Doubles in one binade [2^e, 2^(e+1)) lie on one grid of spacing u, so
 * t + d rounds to t + (d rounded to u), the same offset wherever t is on the grid, except at
 * a tie, which rounds to the even neighbour. A whole state moved by an even multiple of u
 * therefore evolves into the same evolution moved by the same amount, bit for bit, as long
 * as every time stays in the binade. So: three snapshots one period apart (same head op of
 * stage 0's compute stream, d micro-steps later each) whose every field moved by the same
 * amount twice, times all in one binade, prove (with the schedule's ops repeating, checked op
 * by op) that the state two periods on is the state now moved by twice that amount, and so on:
 * the run jumps an even number of periods. The sums the simulation only writes (busy, exposed
 * and idle times) are not moved: they get the very additions the two recorded periods made,
 * in order, once per skipped period, so they round exactly as the unfolded run's would, in
 * any binade. Memory is whole bytes: exact when every value is an integer below 2^53.
 * Anything else (a straggler's classes, an unequal period, a binade's end) refuses or ends
 * the jump, and the engine steps every event as before. */
#include "sim_fold.h"

#include <math.h>
#include <string.h>

/* Canonical op references in a snapshot: a micro-step's op as (stage, micro - the
 * snapshot's micro, place among the stage's ops of that micro-step); others as they are. */
#define REF_FIXED UINT32_MAX
#define REF_NONE (UINT32_MAX - 1)
/* Shifts tried between snapshots: 1 micro-step (1F1B, GPipe) or a group of pp (interleaved:
 * Megatron's groups of pp micro-batches per chunk), and twice each: a period whose length is
 * an odd number of grid steps rounds a tie one way and the next the other way, so that only
 * every second period repeats exactly. */
#define MAX_SHIFTS 4
/* A recorded period's log (sums added to, timeline cells written). */
typedef enum { NOTE_ADD, NOTE_CELL, NOTE_RANK } NoteKind;

typedef struct {
    uint8_t kind;
    double *field; /* NOTE_ADD: the sum; NOTE_CELL: the timeline array */
    size_t at;     /* NOTE_CELL, NOTE_RANK: the cell (row x n_ops + op) */
    double x;      /* NOTE_ADD: what was added; NOTE_CELL: the value; NOTE_RANK: the rank */
} Note;

/* A growing array of 8-byte values (doubles or int64_t), appended to inline: a snapshot
 * takes thousands of them at every period's head. */
typedef struct {
    union {
        double *d;
        int64_t *i;
    };
    size_t len, cap;
} Vec;

static void vec_grow(Vec *v, size_t more)
{
    while (v->len + more > v->cap)
        v->cap = v->cap ? 2 * v->cap : 256;
    v->i = g_renew(int64_t, v->i, v->cap);
}

static inline void vec_int(Vec *v, int64_t x)
{
    if (G_UNLIKELY(v->len == v->cap))
        vec_grow(v, 1);
    v->i[v->len++] = x;
}

static inline void vec_double(Vec *v, double x)
{
    if (G_UNLIKELY(v->len == v->cap))
        vec_grow(v, 1);
    v->d[v->len++] = x;
}

/* What a snapshot compares: doubles (each moving by one amount a period) and integers (equal,
 * or counters moving by one amount); where the recorded log stood. */
typedef struct {
    uint32_t micro, head_pos;
    double now_s;
    Vec d;      /* doubles */
    Vec i;      /* equal across snapshots */
    Vec lin;    /* counters, moving by one amount */
    Vec status; /* the countdowns (push_status), once the rest repeated */
    /* int64_t, four an op reference: relative (stage, micro - micro, place) and its index;
     * moves: per reference, whether it moves with the period (else it stays put: an op
     * waited for past the steady state, the last micro-step's reduction say). */
    Vec refs;
    GArray *moves;
    gboolean has_status;
    uint64_t note_at; /* notes taken before it (SimFold.notes_base counts the dropped ones) */
} Snap;

struct SimFold {
    uint32_t A;           /* micro-steps */
    uint32_t stages;
    uint32_t *group_start; /* [stage * (A + 1) + micro]: into group_ops */
    uint32_t *group_ops;   /* a stage's ops of a micro-step, ascending */
    uint32_t *pos;         /* [op]: its place in its group; UINT32_MAX: micro -1 (fixed) */
    int32_t *micro;        /* [op] */
    uint8_t *counted;      /* [op]: it counts its dependencies down (Dependent.counted) */
    uint8_t *head;         /* [op]: rank 0's compute op after one of another micro-step */
    uint32_t *fixed_counted; /* counted ops of no micro-step, their countdown compared */
    uint32_t n_fixed_counted;
    uint32_t *lo_hint;     /* [stage]: no group below it has a counted op not done */
    uint32_t shifts[MAX_SHIFTS], n_shifts;
    /* [shift][stage * A + m]: group m of the stage does what group m - shift did (same_op),
     * worked out once a jump first asks; NULL before. */
    uint8_t *repeats_group[MAX_SHIFTS];
    GHashTable *snaps;     /* (micro << 32 | head_pos) -> Snap */
    GArray *notes;
    uint64_t notes_base;
    SimFoldReport report;
};

/* ---- the schedule's micro-steps ---- */

static uint32_t group_size(const SimFold *f, uint32_t stage, uint32_t m)
{
    const size_t k = (size_t)stage * (f->A + 1) + m;
    return f->group_start[k + 1] - f->group_start[k];
}

static uint32_t group_op(const SimFold *f, uint32_t stage, uint32_t m, uint32_t pos)
{
    return f->group_ops[f->group_start[(size_t)stage * (f->A + 1) + m] + pos];
}

static void build_groups(SimFold *f, const Sim *sim)
{
    const size_t cells = (size_t)f->stages * (f->A + 1) + 1;
    f->group_start = g_new0(uint32_t, cells);
    f->pos = g_new(uint32_t, sim->n_ops);
    f->micro = g_new(int32_t, sim->n_ops);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        const int32_t m = zp_sched_op(sim->sched, i)->micro;
        f->micro[i] = m >= 0 && (uint32_t)m < f->A ? m : -1;
        if (f->micro[i] >= 0)
            f->group_start[(size_t)sim->ops[i].stage * (f->A + 1) + (uint32_t)m + 1]++;
    }
    for (size_t k = 1; k < cells; k++)
        f->group_start[k] += f->group_start[k - 1];
    f->group_ops = g_new(uint32_t, MAX(f->group_start[cells - 1], 1));
    uint32_t *fill = g_memdup2(f->group_start, cells * sizeof *fill);
    for (uint32_t i = 0; i < sim->n_ops; i++) {
        f->pos[i] = UINT32_MAX;
        if (f->micro[i] < 0)
            continue;
        const size_t k = (size_t)sim->ops[i].stage * (f->A + 1) + (uint32_t)f->micro[i];
        f->pos[i] = fill[k] - f->group_start[k];
        f->group_ops[fill[k]++] = i;
    }
    g_free(fill);
    f->counted = g_new0(uint8_t, sim->n_ops);
    uint32_t total = 0;
    for (uint32_t i = 0; i < sim->n_ops; i++)
        total = MAX(total, sim->ops[i].dependents_end);
    for (uint32_t k = 0; k < total; k++)
        if (sim->dependents[k].counted && sim->ops[sim->dependents[k].op].n_deps > 0)
            f->counted[sim->dependents[k].op] = 1;
    GArray *fixed = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t i = 0; i < sim->n_ops; i++)
        if (f->counted[i] && f->micro[i] < 0)
            g_array_append_val(fixed, i);
    f->n_fixed_counted = fixed->len;
    f->fixed_counted = (uint32_t *)(void *)g_array_free(fixed, FALSE);
    /* The watched ranks' (the first and the last stage's) compute ops after one of another
     * micro-step. */
    f->head = g_new0(uint8_t, sim->n_ops);
    for (uint32_t w = 0; w < 2; w++) {
        int32_t before = -2;
        const size_t first = (size_t)(w ? sim->ranks - 1 : 0) * ZP_STREAM_N + ZP_STREAM_COMPUTE;
        for (uint32_t i = sim->stream_first[first]; i != NO_OP; i = sim->ops[i].stream_next) {
            if (f->micro[i] >= 0 && f->micro[i] != before)
                f->head[i] = 1;
            before = f->micro[i];
        }
    }
}

/* A reference to op i (or NO_OP) relative to micro-step m, as three integers, and i. */
static void push_ref(const SimFold *f, Vec *ints, uint32_t i, uint32_t m, const SimOp *ops)
{
    int64_t v[4] = {REF_NONE, 0, 0, i};
    if (i != NO_OP && f->micro[i] < 0) {
        v[0] = REF_FIXED;
        v[2] = i;
    } else if (i != NO_OP) {
        v[0] = ops[i].stage;
        v[1] = (int64_t)f->micro[i] - m;
        v[2] = f->pos[i];
    }
    for (int k = 0; k < 4; k++)
        vec_int(ints, v[k]);
}

/* The op a reference moved by `shift` micro-steps names: NO_OP for none, UINT32_MAX - 1 where
 * that micro-step or place does not exist. */
static uint32_t moved_op(const SimFold *f, const SimOp *ops, uint32_t i, int64_t shift)
{
    if (i == NO_OP || f->micro[i] < 0)
        return i;
    const int64_t m = f->micro[i] + shift;
    const uint32_t stage = ops[i].stage;
    if (m < 0 || m >= f->A || f->pos[i] >= group_size(f, stage, (uint32_t)m))
        return UINT32_MAX - 1;
    return group_op(f, stage, (uint32_t)m, f->pos[i]);
}

/* Whether op j does what op i does, d micro-steps on: the same static facts, its stream's next
 * op and its dependents moved alike. */
static gboolean same_op(const SimFold *f, const Sim *sim, uint32_t i, uint32_t j, uint32_t d)
{
    const SimOp *a = &sim->ops[i], *b = &sim->ops[j];
    if (a->kind != b->kind || a->sub != b->sub || a->stream != b->stream ||
        a->group != b->group || a->link != b->link || a->wide || b->wide ||
        a->stage != b->stage || a->n_deps != b->n_deps || a->duration_s != b->duration_s ||
        a->latency_s != b->latency_s || a->transfer_s != b->transfer_s ||
        a->bytes != b->bytes || f->counted[i] != f->counted[j] ||
        a->dependents_end - a->dependents_start != b->dependents_end - b->dependents_start ||
        a->dependents_ready - a->dependents_start != b->dependents_ready - b->dependents_start)
        return FALSE;
    if (moved_op(f, sim->ops, a->stream_next, d) != b->stream_next)
        return FALSE;
    for (uint32_t k = 0; k < a->dependents_end - a->dependents_start; k++) {
        const Dependent *x = &sim->dependents[a->dependents_start + k];
        const Dependent *y = &sim->dependents[b->dependents_start + k];
        if (x->stage != y->stage || x->stream != y->stream || x->counted != y->counted ||
            moved_op(f, sim->ops, x->op, d) != y->op)
            return FALSE;
    }
    return TRUE;
}

/* Whether group m of stage s does what group m - d did, op by op. */
static gboolean group_repeats(const SimFold *f, const Sim *sim, uint32_t s, uint32_t m,
                              uint32_t d)
{
    const uint32_t n = group_size(f, s, m);
    if (m < d || n != group_size(f, s, m - d))
        return FALSE;
    for (uint32_t p = 0; p < n; p++)
        if (!same_op(f, sim, group_op(f, s, m - d, p), group_op(f, s, m, p), d))
            return FALSE;
    return TRUE;
}

/* The last micro-step M from `from` on such that every group of stage s in [from, M] does what
 * the one d (shifts[k]) before it did; from - 1 where none does. */
static int64_t repeats_upto(SimFold *f, const Sim *sim, uint32_t s, int64_t from, uint32_t k)
{
    const uint32_t d = f->shifts[k];
    if (!f->repeats_group[k]) {
        f->repeats_group[k] = g_new(uint8_t, (size_t)f->stages * f->A);
        for (uint32_t t = 0; t < f->stages; t++)
            for (uint32_t m = 0; m < f->A; m++)
                f->repeats_group[k][(size_t)t * f->A + m] = group_repeats(f, sim, t, m, d);
    }
    int64_t m = MAX(from, (int64_t)d);
    while (m < f->A && f->repeats_group[k][(size_t)s * f->A + m])
        m++;
    return m - 1;
}

/* ---- dependency counts ---- */

/* An op's countdown as one code: 0 done, 1 untouched, 2 + count otherwise (its one rank's). */
static int64_t status(const Sim *sim, uint32_t rank, uint32_t i)
{
    const Countdown *c = &sim->countdown[i];
    if (c->first == COUNTS_DONE)
        return 0;
    if (c->first == COUNTS_UNUSED)
        return 1;
    if (c->first == COUNTS_WIDE)
        return 3 + 2 * (int64_t)sim->pending_wide[(size_t)sim->ops[i].pending_row * sim->ranks +
                                                  rank];
    return 2 + 2 * ((int64_t)sim->rows[c->first + rank] + 256 * (int64_t)c->zeroed);
}

static gboolean group_all(const SimFold *f, const Sim *sim, uint32_t s, uint32_t m,
                          int64_t code)
{
    for (uint32_t p = 0; p < group_size(f, s, m); p++) {
        const uint32_t i = group_op(f, s, m, p);
        if (f->counted[i] && status(sim, s, i) != code)
            return FALSE;
    }
    return TRUE;
}

/* Stage s's window: lo, the first group with a counted op not done; hi, the last before the
 * first group with every counted op untouched. */
static void window(SimFold *f, const Sim *sim, uint32_t s, uint32_t *lo, uint32_t *hi)
{
    while (f->lo_hint[s] < f->A && group_all(f, sim, s, f->lo_hint[s], 0))
        f->lo_hint[s]++;
    uint32_t m = f->lo_hint[s];
    while (m < f->A && !group_all(f, sim, s, m, 1))
        m++;
    *lo = f->lo_hint[s];
    *hi = m; /* one past */
}

/* Each stage's window relative to micro, and every counted op's code in it, and the ops of
 * no micro-step's: what two periods apart must repeat. */
static void push_status(SimFold *f, const Sim *sim, Vec *ints, uint32_t micro)
{
    for (uint32_t s = 0; s < f->stages; s++) {
        uint32_t lo, hi;
        window(f, sim, s, &lo, &hi);
        vec_int(ints, (int64_t)lo - micro);
        vec_int(ints, (int64_t)hi - micro);
        for (uint32_t m = lo; m < hi; m++)
            for (uint32_t p = 0; p < group_size(f, s, m); p++) {
                const uint32_t i = group_op(f, s, m, p);
                if (f->counted[i])
                    vec_int(ints, status(sim, s, i));
            }
    }
    for (uint32_t k = 0; k < f->n_fixed_counted; k++)
        vec_int(ints, status(sim, sim->ops[f->fixed_counted[k]].stage, f->fixed_counted[k]));
}

/* ---- the state: one walk both takes a snapshot and writes the jumped one ---- */

typedef enum { FIELD_MOVES, FIELD_SUM } FieldKind;

typedef struct {
    gboolean apply;
    Snap *snap;          /* capture: filled; apply: the current snapshot */
    const Snap *before;  /* apply: the snapshot a period before */
    uint32_t periods;    /* apply: how many */
    int64_t shift;       /* apply: micro-steps the op references move */
    size_t d_at, ref_at;
    SimFold *f;
    const Sim *sim;
} Walk;

static void walk_double(Walk *w, double *x, FieldKind kind)
{
    if (kind == FIELD_SUM)
        return; /* replayed from the notes */
    if (!w->apply) {
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
        push_ref(w->f, &w->snap->refs, *op, w->snap->micro, w->sim->ops);
        return;
    }
    if (g_array_index(w->snap->moves, uint8_t, w->ref_at++))
        *op = moved_op(w->f, w->sim->ops, *op, w->shift);
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
        walk_int(w, rs->compute_running | rs->comm_active << 8 | rs->cpu_running << 16 |
                        (int64_t)rs->transfers_active << 24);
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
                walk_op(w, &run->op);
                walk_int(w, run->slowed);
            }
        }
        for (uint32_t l = 0; l < SIM_LINK_N; l++)
            walk_int(w, sim->link_load[r * SIM_LINK_N + l]);
        walk_int(w, sim->mem_pos[r]);
        MemState *m = &sim->eager[sim->mem_pos[r] & ~MEM_EAGER];
        for (int c = 0; c < ZP_MEM_N; c++) {
            walk_double(w, &m->category[c].live, FIELD_MOVES);
            walk_double(w, &m->category[c].peak, FIELD_MOVES);
            walk_double(w, &m->peak_breakdown_bytes[c], FIELD_MOVES);
        }
        walk_double(w, &m->total.live, FIELD_MOVES);
        walk_double(w, &m->total.peak, FIELD_MOVES);
        walk_double(w, &m->states.live, FIELD_MOVES);
        walk_double(w, &m->states.peak, FIELD_MOVES);
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

static Snap *snap_new(uint32_t micro, uint32_t head_pos, double now_s)
{
    Snap *s = g_new0(Snap, 1);
    s->micro = micro;
    s->head_pos = head_pos;
    s->now_s = now_s;
    s->moves = g_array_new(FALSE, FALSE, sizeof(uint8_t));
    return s;
}

static void snap_free(gpointer p)
{
    Snap *s = p;
    g_free(s->d.d);
    g_free(s->i.i);
    g_free(s->lin.i);
    g_free(s->status.i);
    g_free(s->refs.i);
    g_array_free(s->moves, TRUE);
    g_free(s);
}

static void capture(SimFold *f, Sim *sim, Snap *snap)
{
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
}

/* ---- comparing three snapshots ---- */

static gboolean same_ints(const Vec *a, const Vec *b)
{
    return a->len == b->len && memcmp(a->i, b->i, a->len * sizeof(int64_t)) == 0;
}

/* Every op reference either moves with the period in all three or names one op in all. */
static gboolean same_refs(const Snap *a, const Snap *b, Snap *c)
{
    if (a->refs.len != c->refs.len || b->refs.len != c->refs.len)
        return FALSE;
    g_array_set_size(c->moves, (guint)(c->refs.len / 4));
    const int64_t *x = a->refs.i, *y = b->refs.i, *z = c->refs.i;
    for (size_t k = 0; k < c->refs.len; k += 4) {
        const gboolean moving = memcmp(x + k, y + k, 3 * sizeof *x) == 0 &&
                                memcmp(y + k, z + k, 3 * sizeof *x) == 0;
        if (!moving && (x[k + 3] != y[k + 3] || y[k + 3] != z[k + 3]))
            return FALSE;
        g_array_index(c->moves, uint8_t, k / 4) = (uint8_t)moving;
    }
    return TRUE;
}

/* Whether a, b and c (one period apart each) repeat: the integers equal, the counters and
 * every double moving by one amount twice. */
static gboolean repeats(const Snap *a, const Snap *b, Snap *c)
{
    if (!same_ints(&a->i, &b->i) || !same_ints(&b->i, &c->i) || a->d.len != c->d.len ||
        b->d.len != c->d.len || !same_refs(a, b, c))
        return FALSE;
    for (size_t k = 0; k < c->lin.len; k++)
        if (c->lin.i[k] - b->lin.i[k] != b->lin.i[k] - a->lin.i[k])
            return FALSE;
    for (size_t k = 0; k < c->d.len; k++)
        if (c->d.d[k] - b->d.d[k] != b->d.d[k] - a->d.d[k])
            return FALSE;
    return TRUE;
}

/* The most periods (even) the doubles can move on from c, each staying exact: a value that
 * moves stays in the binade all three snapshots share, or is a whole number below 2^53. */
static uint64_t periods_exact(const Snap *a, const Snap *c)
{
    uint64_t most = UINT64_MAX;
    for (size_t k = 0; k < c->d.len && most > 0; k++) {
        const double x = a->d.d[k], z = c->d.d[k];
        const double step = (z - x) / 2; /* exact: a difference on one grid, halved */
        if (step == 0)
            continue;
        if (step < 0 || x < 0) {
            most = 0;
            break;
        }
        double limit;
        if (x == floor(x) && step == floor(step) && z < 0x1p53) {
            limit = 0x1p53;
        } else {
            int ex, ez;
            frexp(x, &ex);
            frexp(z, &ez);
            if (ex != ez || x == 0) {
                most = 0;
                break;
            }
            limit = ldexp(1.0, ez);
        }
        double n = floor((limit - z) / step);
        while (n > 0 && z + n * step >= limit)
            n--;
        most = MIN(most, n > 1e9 ? (uint64_t)1e9 : (uint64_t)n);
    }
    return most;
}

/* ---- the jump ---- */

/* Rewrites the countdowns of stage s's groups as `periods` x d micro-steps on: each group's
 * codes are those of the group that many micro-steps before, the groups between the window's
 * start and there done. */
static void move_counts(SimFold *f, Sim *sim, uint32_t s, uint32_t lo, uint32_t hi,
                        uint64_t shift)
{
    for (int64_t m = (int64_t)(hi - 1 + shift); m >= (int64_t)lo; m--) {
        for (uint32_t p = 0; p < group_size(f, s, (uint32_t)m); p++) {
            const uint32_t i = group_op(f, s, (uint32_t)m, p);
            if (!f->counted[i])
                continue;
            if (m - (int64_t)shift >= (int64_t)lo)
                sim->countdown[i] = sim->countdown[group_op(f, s, (uint32_t)(m - shift), p)];
            else
                sim->countdown[i].first = COUNTS_DONE;
        }
    }
    f->lo_hint[s] = lo;
}

/* Replays the notes of [from, to) `times` x for the skipped periods `first`, first + 2, ..:
 * sums added to again; timeline cells written at the op that many periods on, their times
 * moved. */
static void replay(SimFold *f, Sim *sim, uint64_t from, uint64_t to, uint32_t first,
                   uint32_t periods, uint32_t d, double period_s)
{
    for (uint32_t j = first; j <= periods; j += 2) {
        const uint32_t moves = j + (j & 1); /* an even number of periods: exact (above) */
        for (uint64_t k = from; k < to; k++) {
            const Note *n = &g_array_index(f->notes, Note, k - f->notes_base);
            if (n->kind == NOTE_ADD) {
                *n->field += n->x;
                continue;
            }
            const uint32_t op = (uint32_t)(n->at % sim->n_ops);
            const size_t row = n->at - op;
            const uint32_t to_op = moved_op(f, sim->ops, op, (int64_t)moves * d);
            if (n->kind == NOTE_RANK)
                sim->op_last_rank[row + to_op] = (uint32_t)n->x;
            else
                n->field[row + to_op] = n->x + (double)moves * period_s;
        }
    }
}

/* How far every stage's groups repeat from its window on, and every reference's room: the
 * most periods the schedule allows. */
static uint64_t periods_schedule(SimFold *f, Sim *sim, uint32_t k, uint32_t *lo,
                                 uint32_t *hi)
{
    const uint32_t d = f->shifts[k];
    uint64_t most = UINT64_MAX;
    for (uint32_t s = 0; s < f->stages; s++) {
        window(f, sim, s, &lo[s], &hi[s]);
        for (uint32_t m = hi[s]; m < f->A; m++) /* nothing past the window began */
            if (!group_all(f, sim, s, m, 1))
                return 0;
        const int64_t upto = repeats_upto(f, sim, s, (int64_t)lo[s] - 2 * (int64_t)d, k);
        if (upto < (int64_t)hi[s])
            return 0;
        /* A stream's next op may lie in the group after the window: it moves too. */
        most = MIN(most, (uint64_t)(upto - hi[s]) / d);
    }
    return most;
}

static void jump(SimFold *f, Sim *sim, Snap *a, Snap *b, Snap *c, uint32_t k)
{
    const uint32_t d = f->shifts[k];
    uint32_t *lo = g_new(uint32_t, f->stages), *hi = g_new(uint32_t, f->stages);
    uint64_t periods = MIN(periods_exact(a, c), periods_schedule(f, sim, k, lo, hi));
    periods &= ~(uint64_t)1;
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
            periods -= 2;
    const int64_t shift = (int64_t)periods * d;
    /* Every op in flight, queued or next on a stream lies in a group that moves within the
     * repeating ones (periods_schedule); an event's is checked again. */
    for (guint k = 0; k < events->len && periods >= 2; k++) {
        const Event *e = &g_array_index(events, Event, k);
        if (!(e->id & EVENT_FLOW) && moved_op(f, sim->ops, e->detail, shift) == UINT32_MAX - 1)
            periods = 0;
    }
    if (periods < 2) {
        g_array_free(times, TRUE);
        g_array_free(events, TRUE);
        g_free(lo);
        g_free(hi);
        return;
    }
    Walk w = {.apply = TRUE, .snap = c, .before = b, .periods = (uint32_t)periods,
              .shift = shift, .f = f, .sim = sim};
    w.d_at = 1;
    walk_ranks(&w, sim);
    const uint32_t instant = sim->queue.instant;
    snap_queue(&w, sim, times, events);
    snap_counters(&w, sim);
    for (guint k = 0; k < events->len; k++) { /* the instants they were queued at */
        Event *e = &g_array_index(events, Event, k);
        e->made = sim->queue.instant - (instant - e->made);
    }
    sim_queue_replace(&sim->queue, times, events);
    g_array_free(times, TRUE);
    g_array_free(events, TRUE);
    for (uint32_t s = 0; s < f->stages; s++)
        move_counts(f, sim, s, lo[s], hi[s], (uint64_t)shift);
    replay(f, sim, a->note_at, b->note_at, 1, (uint32_t)periods, d, period_s);
    replay(f, sim, b->note_at, c->note_at, 2, (uint32_t)periods, d, period_s);
    f->report.micro_steps += (uint32_t)shift;
    f->report.jumps++;
    g_free(lo);
    g_free(hi);
}

/* ---- the run's hooks ---- */

static void notes_drop(SimFold *f, Sim *sim)
{
    g_array_set_size(f->notes, 0);
    f->notes_base = 0;
    g_hash_table_remove_all(f->snaps);
    sim->fold_recording = FALSE;
}

void sim_fold_note_add(Sim *sim, double *field, double x)
{
    const Note n = {NOTE_ADD, field, 0, x};
    g_array_append_val(sim->fold->notes, n);
}

void sim_fold_note_cell(Sim *sim, double *array, size_t at, double value)
{
    const Note n = {NOTE_CELL, array, at, value};
    g_array_append_val(sim->fold->notes, n);
}

void sim_fold_note_rank(Sim *sim, size_t at, uint32_t rank)
{
    const Note n = {NOTE_RANK, NULL, at, rank};
    g_array_append_val(sim->fold->notes, n);
}

/* A snapshot's key: the micro-step and place of the head op of watched rank w. */
static uint64_t snap_key(uint32_t micro, uint32_t w, uint32_t pos)
{
    return (uint64_t)micro << 32 | (uint64_t)w << 31 | pos;
}

static Snap *find(SimFold *f, int64_t micro, uint32_t w, uint32_t pos)
{
    if (micro < 0)
        return NULL;
    const uint64_t key = snap_key((uint32_t)micro, w, pos);
    return g_hash_table_lookup(f->snaps, &key);
}

/* Drops the notes every kept snapshot has passed. */
static void notes_trim(SimFold *f)
{
    uint64_t oldest = f->notes_base + f->notes->len;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, f->snaps);
    while (g_hash_table_iter_next(&it, NULL, &value))
        oldest = MIN(oldest, ((Snap *)value)->note_at);
    const uint64_t drop = oldest - f->notes_base;
    if (drop > 4096 && drop * 2 > f->notes->len) {
        g_array_remove_range(f->notes, 0, (guint)drop);
        f->notes_base = oldest;
    }
}

/* Watched rank w's compute stream moved on to op head: a snapshot where it is a head, and a
 * jump where the last three of its kind repeat. TRUE where it jumped. */
static gboolean at_head(SimFold *f, Sim *sim, uint32_t w, uint32_t head, double now_s)
{
    if (head == NO_OP || !f->head[head])
        return FALSE;
    const uint32_t micro = (uint32_t)f->micro[head], pos = f->pos[head];
    Snap *c = snap_new(micro, pos, now_s);
    capture(f, sim, c);
    uint64_t *key = g_new(uint64_t, 1);
    *key = snap_key(micro, w, pos);
    g_hash_table_replace(f->snaps, key, c);
    const uint32_t dmax = f->shifts[f->n_shifts - 1];
    const uint64_t old = snap_key(micro - MIN(micro, 2 * dmax + 1), w, pos);
    if (micro >= 2 * dmax + 1)
        g_hash_table_remove(f->snaps, &old);
    for (uint32_t k = 0; k < f->n_shifts; k++) {
        const uint32_t d = f->shifts[k];
        Snap *b = find(f, (int64_t)micro - d, w, pos),
             *a = find(f, (int64_t)micro - 2 * d, w, pos);
        if (!a || !b || !repeats(a, b, c))
            continue;
        /* The cheap fields repeat: record from here on, and compare the countdowns. */
        sim->fold_recording = TRUE;
        push_status(f, sim, &c->status, micro);
        c->has_status = TRUE;
        if (a->has_status && b->has_status && a->note_at >= f->notes_base &&
            same_ints(&a->status, &b->status) && same_ints(&b->status, &c->status)) {
            jump(f, sim, a, b, c, k);
            notes_drop(f, sim);
            return TRUE;
        }
        break;
    }
    return FALSE;
}

void sim_fold_boundary(SimFold *f, Sim *sim, double now_s)
{
    for (uint32_t w = 0; w < 2; w++) {
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
    if (!sim->fold_recording)
        g_array_set_size(f->notes, 0), f->notes_base = 0;
    else
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
    build_groups(f, sim);
    f->lo_hint = g_new0(uint32_t, f->stages);
    f->shifts[f->n_shifts++] = 1;
    f->shifts[f->n_shifts++] = 2;
    if (sim->sched->plan.pipe.schedule == ZP_PIPE_INTERLEAVED && f->stages > 1) {
        f->shifts[f->n_shifts++] = f->stages;
        f->shifts[f->n_shifts++] = 2 * f->stages;
    }
    f->snaps = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, snap_free);
    f->notes = g_array_new(FALSE, FALSE, sizeof(Note));
    sim->fold_watch[0] = sim->fold_watch[1] = NO_OP;
    return f;
}

void sim_fold_free(SimFold *f, SimFoldReport *report)
{
    if (!f)
        return;
    *report = f->report;
    if (f->report.jumps > 0)
        g_snprintf(report->note, sizeof report->note,
                   "folded: %u micro-steps of every stage skipped in %u jumps",
                   f->report.micro_steps, f->report.jumps);
    else
        g_snprintf(report->note, sizeof report->note,
                   "not folded: no steady state repeated exactly");
    g_free(f->group_start);
    g_free(f->group_ops);
    g_free(f->pos);
    g_free(f->micro);
    g_free(f->counted);
    g_free(f->head);
    g_free(f->fixed_counted);
    g_free(f->lo_hint);
    for (uint32_t k = 0; k < MAX_SHIFTS; k++)
        g_free(f->repeats_group[k]);
    g_hash_table_destroy(f->snaps);
    g_array_free(f->notes, TRUE);
    g_free(f);
}
