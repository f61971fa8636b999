/* sim_fold_jump: the fold's jump (a run advanced by whole periods) and the state the fold keeps,
 * shared by sim_fold.c, which finds the repeats, and sim_fold_jump.c; private to sim/. */
#ifndef SIM_FOLD_JUMP_H
#define SIM_FOLD_JUMP_H

#include "sim_engine_internal.h"
#include "sim_fold_notes.h"
#include "sim_fold_snap.h"

#include <glib.h>
#include <stdint.h>

/* Shifts tried between snapshots: 1 micro-step (1F1B, GPipe) or a group of pp (interleaved:
 * Megatron's groups of pp micro-batches per chunk), and twice each (on the bare double clock a
 * period of an odd number of ulps rounded its ties alternately; on the grid nothing ties, and
 * the doubled shifts stay only for a pattern that truly alternates). 1F1B over more than two
 * stages tries pp micro-steps too, a pipeline round trip: where tensor parallelism spans
 * nodes, the fill leaves a disturbance that comes back every round trip and never washes out
 * (plan --3d gpt-1t/4096's 1F1B pp 32 x tp 32: stage 0's period is 0.0902409 s but 0.0926946
 * then 0.0853067 s at micro-steps 64, 96, .., 480), so no state repeats a micro-step on, while
 * every one repeats pp on. And 1F1B over uneven stages tries the number of stages that hold a
 * block more (zp_pipe_heavy_stages), which its steady state repeats by: the fourth; and any
 * 1F1B run over more than two stages the period its first stage's heads show (sim_fold.c
 * found_period, up to pp micro-steps: mt-nlg-530b's 105 blocks over 64 stages with tp 4 repeat
 * every 40, not the 41 of tp 8 and 16): the fifth. */
#define MAX_SHIFTS 5

/* Ops [from, to) of a stage that do what the op a period before each did, under the steps of
 * generation gen (SimFold.steps_gen). */
typedef struct {
    uint32_t from, to, gen;
} ProvenRun;

/* The fold's state of one run (sim_fold_new to sim_fold_free). */
struct SimFold {
    uint32_t A;            /* micro-steps */
    uint32_t stages;
    GHashTable *heads;     /* 1 + each head op -> 1 + its index (sim_fold.c: find_heads) */
    uint8_t *head_bits;    /* [op / 8] bit op % 8: op is a head (no lookup for the rest) */
    /* [stage]: its ops' indices, [stage_start, stage_end) (the builder lays a stage's ops
     * out together; checked), worked out the first time the cheap fields repeat (NULL
     * before); lo_hint: no counted op below it is still counting down; equal_from and
     * equal_to, [shift * stages + stage]: the ops i in [equal_from, equal_to) do what
     * i - equal_step did (same_op), kept for each shift tried; equal_open: the walk stopped
     * short of an op that does not repeat, and may go on (sim_fold_jump.c repeats_until);
     * equal_steps, [shift * stages + stage]: the steps the shift's walks read. equal_gen:
     * steps_gen[shift] when the run of ops was begun, under the steps equal_steps holds while
     * the two are equal; prior: the run before it (sim_fold_jump.c: borrowed). */
    uint32_t *stage_start, *stage_end, *lo_hint;
    uint32_t *equal_from, *equal_to, *equal_gen;
    int64_t *equal_step, *equal_steps;
    uint8_t *equal_open;
    ProvenRun *prior;
    uint32_t steps_gen[MAX_SHIFTS]; /* equal_steps' changes, of each shift */
    /* The far ops (sim_fold.c find_far), stage s's far[far_start[s] .. far_start[s + 1]),
     * ascending; far_start NULL where there are none. */
    uint32_t *far, *far_start;
    /* The sinks (sim_fold.c find_sinks): ops of no micro-step that every micro-step counts
     * down, stage s's sink[sink_start[s] .. sink_start[s + 1]), ascending (sink_start NULL
     * where there are none); sink_fall[k], what the proof's period counted sink k down by
     * (sim_fold.c at_head, before each jump), which each skipped period counts it down by. */
    uint32_t *sink, *sink_start;
    int64_t *sink_fall;
    uint32_t shifts[MAX_SHIFTS], n_shifts;
    /* 1F1B over more than two stages: the slot of the shift found from the first stage's
     * heads (sim_fold.c found_period; UINT32_MAX where none is looked for), and those heads'
     * times, head_s[micro % n_head_s] (n_head_s = 2 stages + 2), of the last head_run
     * micro-steps in a row (a jump skips some: their places hold older times). */
    uint32_t found_slot, n_head_s, head_run, head_last;
    double *head_s;
    uint32_t group, chunks; /* interleaved: a period's micro-steps (pp), and chunks; else 0 */
    /* sim_jump_periods found no room for this shift before op blocked_at of stage
     * blocked_stage, which does not repeat: not tried again until that stage's window is past
     * it (UINT32_MAX: not blocked). */
    uint32_t blocked_at[MAX_SHIFTS], blocked_stage[MAX_SHIFTS];
    size_t sizes[5];       /* the last snapshot's doubles, integers, references, bytes, peaks */
    GHashTable *snaps;     /* sim_fold.c's snap_key -> Snap */
    int64_t *steps;        /* [stage]: the ops a moving reference moves by a period */
    NoteLog notes;
    uint64_t notes_base;
    /* The log's length past which sim_fold.c's notes_trim next looks for notes to drop. */
    size_t notes_trim_len;
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
    /* Whether a proof may take each rank moving by its own amount (sim_snap_repeats3): not
     * under Megatron's all-gather dispatcher over TP x EP > 1 (its collectives on the compute
     * stream), where such jumps replayed the middle stages' exposed communication wrong
     * (random testing: Mixtral interleaved pp 4, 23,619 quanta over 6 periods; DeepSeek-V3
     * 1F1B pp 16), the cause not yet found: refused there, two-snapshot proofs kept. */
    gboolean own_steps;
    /* With extend_or_stop: a proof whose jump would have counted every virtual period but for
     * the stop time (SimOptions.stop_after_s), which the run is left to reach: its shift, and
     * each stage's window start then (stop_from, NULL before). sim_fold_stopped_exact. */
    uint32_t stop_shift;
    uint32_t *stop_from;
};

/* Whether op i counts its dependencies down (sim_ops.c: Dependent.counted). */
static inline gboolean sim_jump_counted(const SimOp *o)
{
    return o->n_deps > 0 && (op_on_stream(o) || o->n_deps > 1);
}

/* Op i's countdown on stage s's one rank as one code: 0 done, 1 untouched, 2 + its count (and
 * 256 x the ranks that counted it to 0: none while a rank runs its stage). A wide op (over 255
 * dependencies) takes no row: its count is in pending_wide for the whole run, never
 * COUNTS_DONE nor COUNTS_UNUSED, and reads the same, 1 at n_deps (untouched), 0 at 0 (done).
 * Its code may equal another op's, but codes are compared at the same op moved by periods, and
 * same_op refuses a wide op: no jump rests on a wide op's code being some other's. */
static inline int64_t sim_jump_status(const Sim *sim, uint32_t s, uint32_t i)
{
    const Countdown *c = &sim->countdown[i];
    if (c->row == COUNTS_DONE)
        return 0;
    if (c->row == COUNTS_UNUSED)
        return 1;
    if (c->row == COUNTS_WIDE) {
        const uint32_t left = sim->pending_wide[(size_t)c->wide_row * sim->ranks + s];
        return left == 0 ? 0 : left == sim->ops[i].n_deps ? 1 : 2 + (int64_t)left;
    }
    if (c->row == COUNTS_SOLO) /* as a row's, where no rank counted it to 0 */
        return 2 + (int64_t)c->left;
    return 2 + (int64_t)sim->rows[(size_t)c->row * sim->ranks + s] + 256 * (int64_t)c->zeroed;
}

/* Sink i's count of dependencies left on stage s's one rank (n_deps where none counted):
 * sim_fold.c's sinks are counted ops, and no rank counted one to 0 while a jump may come. */
static inline int64_t sim_jump_sink_left(const Sim *sim, uint32_t s, uint32_t i)
{
    const int64_t code = sim_jump_status(sim, s, i);
    return code == 1 ? sim->ops[i].n_deps : code == 0 ? 0 : code - 2;
}

/* Stage s's window: lo, its first counted op still counting down; hi, one past the last that
 * began to (Sim.fold_hi). */
void sim_jump_window(SimFold *f, const Sim *sim, uint32_t s, uint32_t *lo, uint32_t *hi);

/* The first tier of a snapshot, taken at every head: the instant and each rank's times.
 * Three of them a period apart moving alike are what makes the whole state (sim_jump_capture,
 * some thousands of values and the queue) worth taking; in a transient they rarely do. */
void sim_jump_capture_first(SimFold *f, Sim *sim, Snap *snap);

/* The whole state into snap: the walk sim_jump_advance writes the jumped state with. */
void sim_jump_capture(SimFold *f, Sim *sim, Snap *snap);

/* The most periods the schedule allows shift k (f->shifts): every stage's ops from its window
 * back `span` periods (the recorded ones, whose notes the jump replays) on to the moved window
 * and one period past it do what the ops a period before them did; -1 where not even the
 * window and one period past it repeat (0 or 1: room for virtual periods alone, sim_fold.c's
 * head comment); lo and hi [stages] get the windows. Below 2, it marks the shift blocked
 * (SimFold.blocked_at): it waits till the window is past the op that does not repeat. */
int64_t sim_jump_periods(SimFold *f, Sim *sim, uint32_t k, uint32_t span, uint32_t *lo,
                         uint32_t *hi);

/* Whether a run stopped at SimOptions.stop_after_s past a jump the stop time cut short of
 * the virtual periods (SimFold.stop_from) stopped as the long schedule's run does, at the
 * same time: every op that began counting down on a stage since that window's start repeats
 * the op a period before it under the proof's shift (walked on as far as they reach), so
 * none is of the short schedule's drain, and the rest of the run was steady periods, which
 * the long schedule has too, only more of them. */
gboolean sim_jump_stopped_exact(SimFold *f, Sim *sim);

/* Advances the run from c by the most whole periods that stay exact; FALSE where fewer than
 * two fit, or one virtual period (nothing changed). The proof's first snapshot is b (c is b
 * moved) or a, two periods before c (sim_snap_repeats3); k_shift, the shift that found it.
 * With log, the skipped
 * periods' notes are added to the log as stepping would have recorded them (the snapshots
 * before the jump stay usable: sim_fold.c, interleaved jumps inside a group). */
gboolean sim_jump_advance(SimFold *f, Sim *sim, const Snap *a, Snap *b, Snap *c,
                          uint32_t k_shift, gboolean log);

#endif
