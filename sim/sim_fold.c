/* sim_fold: a pipeline's steady state (and gradient accumulation's micro-steps) advanced by
 * whole periods, bit for bit what stepping every event would give, or refused for the plan.
 * Here the repeats are found (snapshots at each micro-step's head, the run's hooks);
 * sim_fold_jump.c makes the jump (the schedule's ops checked, the state walked and moved).
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
 * end, the stop time), so a caller whose short run did not count all k runs the long one;
 * but where a proof would count them all and the stop time alone comes first, the run goes
 * on to its stop, and if every op that began since lies in the run the proof's shift repeats
 * (none of the short schedule's drain), it stopped where the long one does
 * (sim_jump_stopped_exact; test_sim_extend's random trials stop both at a random time).
 * Only a shift that is a whole period of the builder's schedule counts them: one or more
 * micro-steps of 1F1B or accumulation, a whole group of an interleaved schedule (the long
 * one has whole groups more, each running every chunk; a shift inside a group repeats one
 * chunk's micro-step, and k of those are not k micro-steps of the long schedule: counted
 * so, narayanan21-t1-529.6b built 105 of 280 gave another step time than --no-fold). A jump
 * of virtual periods alone moves no op, so it needs the ops to repeat one period past the
 * window, not three as a physical jump of two periods does: the first proof after the fill
 * can count them (1F1B pp 8 proves 8 virtual micro-steps on a schedule of 12).
 *
 * Interleaved: jumps inside a group and the group's. A jump inside a group (one chunk's
 * micro-step a period, while the forwards and the backwards stay in their chunks) is exact,
 * so the snapshots taken before it are still the run's states: where a group's jump may still
 * come (group_may_jump), it keeps them, and adds to the log the notes the periods it skipped
 * would have recorded (sim_jump_advance's log), so the
 * group's shift proves its repeat from them a group on and jumps whole groups (or counts the
 * virtual ones) between the jumps inside groups. Before, a jump dropped every snapshot, and
 * the two excluded each other: narayanan21-t1-529.6b (8 groups of 35, v 3) skipped 301 of
 * each stage's 840 chunk micro-steps inside groups; with both, 489 (3 groups in one jump), and
 * a short run no longer holds its jumps inside groups back till the virtual groups are
 * counted. The group's shift is tried first at a head.
 *
 * Far ops. An op of the last micro-step may wait on one of the first: DeepSpeed's stage 1
 * reduces the last micro-step's gradients through the ipg buffer micro-step 0's first hook
 * took and kept (zp_impl_deepspeed.c ds_held_span), so the first all-reduce waits on that
 * alloc and begins counting down in micro-step 0. A window reaching it (from the first op
 * still counting down to one past the last that began) ended at the schedule's end at every
 * head, never moved by a period, and no two snapshots compared (gpt-13b stage 1 x 10: 1,322
 * codes against 1,157): such a plan never folded. Such an op (find_far: an edge from the first
 * micro-step to the last has one instance, so it is no period's) stays out of the window (the
 * engine's take_row leaves Sim.fold_hi alone for it); once it began counting down, its index
 * and code are compared in place (push_status), equal in every snapshot of a proof. Why a jump
 * stays exact. One rank runs a stage, so a code only falls: equal far codes say the proof's
 * period counted no far op down. The ops the skipped periods count down are those the period
 * counted down, moved by 1 .. n periods (the ops repeat, same_op), and those lie below the
 * window's end at c (every op that began counting down and is not far does), so below
 * hi + n steps. The jump stops there, short of the first far op that began (sim_jump_periods):
 * no skipped period counts it down, and the window the jump writes (move_counts) ends before
 * it. A virtual period inserts its ops before the window, moving the far op on by as many as
 * the window: the bound is the same.
 *
 * Wide ops. An op with over 255 dependencies (SimOp.wide) counts them down in pending_wide,
 * four bytes a rank for the whole run, and never takes a row: its Countdown.row stays
 * COUNTS_WIDE, neither untouched nor done. The step's optimizer and its workspace allocs wait
 * on every reduction of the last micro-step, so at Hugging Face's "auto" reduce_bucket_size
 * (hidden x hidden: 26.2 M for gpt-13b, 322 buckets at stage 2) DeepSpeed's plans of a 13B
 * model have them, at every stage. The fold could not see them: its code read a row such an op
 * has not, and take_row, which moves the window's end, never ran for one; so every such plan
 * was refused. Now its first count down moves the window's end as taking a row does (the
 * engine's fold_began), and its code reads its count (sim_jump_status: 1 at n_deps, 0 at 0,
 * else 2 + the count), so the window again holds every op that began counting down and is not
 * done, far ops aside, which the proof above needs. Why a jump stays exact: same_op refuses a
 * wide op, so none lies among the ops a jump checks, from the window back `span` periods to
 * n + 1 periods past it. The window lies inside them, so no wide op is counting down at c; one
 * before them is done (the window starts at the first counted op not done); one past them is
 * untouched. The skipped periods count down the recorded period's ops moved by 1 .. n periods,
 * below the window's end moved by n: none is wide; move_counts writes no wide op's count; and
 * the untouched ones keep n_deps in pending_wide, which a snapshot need not hold, as stepping
 * would keep it. A wide far op is compared in place by the same code. A virtual period inserts
 * ops before the window: the long schedule's wide ops lie that many ops on, as untouched. A
 * wide op inside a period (none the builder makes) stops every repeat at it: such a plan steps
 * every event. A wide sink (below) counts down at c, outside the window: it is no op a jump
 * checks, and its count is moved as a sink's.
 *
 * Sinks. An op of no micro-step may wait on ops of every micro-step: with the optimizer
 * offloaded, the CPU step waits on each micro-step's gradient copies to the host
 * (zp_build_cpu_optimizer_step; DeepSpeed's stage 2 copies every micro-step's sum down,
 * stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu's copy_gradients_to_cpu, on the
 * current stream (reduce_ipg_grads: copy_grad_stream is disabled), and step's check_overflow
 * reads overflow_gpu[0].item() after them: the CPU step follows every copy). It began
 * counting down at micro-step 0, so the window reached past every micro-step at every head,
 * and each copy's dependents held it, an op no period moves, so same_op saw no copy repeat:
 * no stage 2 or 3 offload plan with accumulation folded (gpt-13b on 64 GPUs, 16
 * micro-steps, an optimizer of 476 dependencies). find_far marks such an op (a counted op
 * past every micro-step's op of its stage, waiting on one of micro-step 0, where the
 * optimizer is offloaded) a sink: the window leaves it out (fold_began), same_op takes an edge
 * to it as repeating where both ops count the same sink down (it stays put), and a snapshot
 * holds each sink's count left, whose fall over the proof's period (over each of a three-
 * snapshot proof's two, equal) the jump subtracts once per physical period (move_sinks). Why
 * it is exact. A sink's count is read by nothing but its own start (at 0) and the fold: the
 * rest of the state evolves as if it were not there, so the proof above moves it whole. Every
 * count down comes from an op's end, once per counted edge; the skipped periods end the
 * recorded period's ops moved by 1 .. n periods (every stage's ops from the window back the
 * proof's periods to n + 1 periods past it repeat, same_op), each with the recorded op's edges
 * to the sink, so each period counts it down by the recorded fall. The jump stays short of the
 * sink (it lies past the ops that repeat) and of its count reaching 0 (sim_jump_periods:
 * left - n x fall >= 1), so it never starts in the skipped periods. A virtual period counts it
 * down by the fall too, in the long schedule, whose sink waits on that many more ops (an edge
 * from each inserted copy): its count left is the short schedule's, unmoved. */
#include "sim_fold.h"
#include "sim_clock.h"
#include "sim_fold_jump.h"
#include "zp_pipe.h"

#include <string.h>

/* An interleaved run's group shifts are f->shifts[GROUP_SHIFTS] (a group) and the one after
 * it (two groups), after the micro-step's 1 and 2 (sim_fold_new). */
#define GROUP_SHIFTS 2
/* Why a run whose clock reached the grid's end (sim_clock.h) folds no further. */
#define PAST_GRID "the clock passed 2^22 s (48.5 days), where its grid of 2^-30 s ends"
/* Notes kept before the ones no snapshot needs are dropped, and appended between two looks. */
#define NOTES_TRIM_AT 65536

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
                f->head_bits[i / 8] |= (uint8_t)(1u << (i % 8));
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
    uint32_t *end = g_new0(uint32_t, f->stages);
    for (uint32_t s = 0; s < f->stages; s++)
        f->stage_start[s] = UINT32_MAX;
    /* In locals: the stores below could alias sim's and f's fields for the compiler. One
     * compare an op: only where the stage changes is a run opened (a stage's second run
     * refuses) and the last one closed. */
    uint32_t *const start = f->stage_start;
    const SimOp *const ops = sim->ops;
    const uint32_t n_ops = sim->n_ops;
    gboolean runs = n_ops > 0;
    uint16_t stage = runs ? ops[0].stage : 0; /* the open run's */
    if (runs)
        start[stage] = 0;
    for (uint32_t i = 1; i < n_ops; i++) {
        /* Eight ops a branch while they stay on the open run's stage: 7 instructions an op
         * (one compare and branch each) were 0.92 M of Megatron 1T's evaluation. */
        for (const SimOp *o = &ops[i]; i + 8 <= n_ops; o += 8, i += 8)
            if (((o[0].stage ^ stage) | (o[1].stage ^ stage) | (o[2].stage ^ stage) |
                 (o[3].stage ^ stage) | (o[4].stage ^ stage) | (o[5].stage ^ stage) |
                 (o[6].stage ^ stage) | (o[7].stage ^ stage)) != 0)
                break;
        if (i >= n_ops)
            break;
        const uint16_t next = ops[i].stage;
        if (G_LIKELY(next == stage))
            continue;
        end[stage] = i;
        if (start[next] != UINT32_MAX) {
            runs = FALSE;
            break;
        }
        start[next] = i;
        stage = next;
    }
    if (runs)
        end[stage] = n_ops;
    for (uint32_t s = 0; s < f->stages; s++)
        runs = runs && f->stage_start[s] != UINT32_MAX;
    if (!runs) {
        g_free(end);
        return FALSE;
    }
    f->stage_end = end;
    f->lo_hint = g_memdup2(f->stage_start, f->stages * sizeof *f->lo_hint);
    f->equal_from = g_new0(uint32_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_to = g_new0(uint32_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_step = g_new0(int64_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_steps = g_new0(int64_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_open = g_new0(uint8_t, (size_t)MAX_SHIFTS * f->stages);
    f->equal_gen = g_new0(uint32_t, (size_t)MAX_SHIFTS * f->stages);
    f->prior = g_new0(ProvenRun, (size_t)MAX_SHIFTS * f->stages);
    return TRUE;
}

/* Lists the ops marked `mark` in far[] by stage: (*start)[s] .. (*start)[s + 1] of *list. */
static void list_marked(const SimFold *f, const Sim *sim, const uint8_t *far, uint8_t mark,
                        uint32_t n, uint32_t **list, uint32_t **start)
{
    *start = g_new0(uint32_t, f->stages + 1);
    *list = g_new(uint32_t, MAX(n, 1));
    for (uint32_t i = 0; i < sim->n_ops; i++)
        (*start)[sim->ops[i].stage + 1] += far[i] == mark;
    for (uint32_t s = 0; s < f->stages; s++)
        (*start)[s + 1] += (*start)[s];
    uint32_t *at = g_memdup2(*start, f->stages * sizeof *at);
    for (uint32_t i = 0; i < sim->n_ops; i++)
        if (far[i] == mark)
            (*list)[at[sim->ops[i].stage]++] = i;
    g_free(at);
}

/* The far ops (the head comment): counted ops of the last micro-step waiting on an op of the
 * first, marked SIM_FOLD_FAR in Sim.fold_far (which the engine's take_row reads) and listed by
 * stage. Looked for without a pipeline only, where DeepSpeed holds the ipg buffers from
 * micro-step 0 (zp_build_head; a pipeline takes them after its flush): walking a pipeline's
 * ops cost 0.3% of plan --3d gpt3-175b/1024's instructions, and the edges it found (pp 16
 * over 32 micro-steps: its fill's) changed no fold. And the sinks (the head comment): counted
 * ops of no micro-step past every op of one on their stage, waiting on an op of the first
 * micro-step, marked SIM_FOLD_SINK; looked for where the optimizer is offloaded (the CPU
 * step waits on every micro-step's gradient copies to the host: zp_build_cpu_optimizer_step),
 * on any pipeline. */
static void find_far(SimFold *f, Sim *sim)
{
    const gboolean sinks = sim->sched->plan.zero.offload_optimizer.device != ZP_OFFLOAD_NONE;
    if (f->stages > 1 && !sinks)
        return;
    uint32_t *last = g_new0(uint32_t, f->stages); /* [stage]: one past its last micro-step op */
    for (uint32_t i = 0; sinks && i < sim->n_ops; i++)
        if (op_micro(f, sim, i) >= 0)
            last[sim->ops[i].stage] = i + 1;
    uint8_t *far = NULL;
    uint32_t n_far = 0, n_sinks = 0;
    for (uint32_t d = 0; d < sim->n_ops; d++) {
        if (op_micro(f, sim, d) != 0)
            continue;
        const SimOp *o = &sim->ops[d];
        for (uint32_t k = op_dependents_start(sim, o); k < o->dependents_end; k++) {
            const Dependent *x = &sim->dependents[k];
            const int32_t m = op_micro(f, sim, x->op);
            const uint8_t mark = f->stages == 1 && m == (int32_t)f->A - 1 ? SIM_FOLD_FAR
                                 : sinks && m < 0 && x->op >= last[x->stage] ? SIM_FOLD_SINK
                                                                             : 0;
            if (!x->counted || !mark || (far && far[x->op]))
                continue;
            if (!far)
                far = g_new0(uint8_t, sim->n_ops);
            far[x->op] = mark;
            n_far += mark == SIM_FOLD_FAR;
            n_sinks += mark == SIM_FOLD_SINK;
        }
    }
    g_free(last);
    if (!far)
        return;
    if (n_far > 0)
        list_marked(f, sim, far, SIM_FOLD_FAR, n_far, &f->far, &f->far_start);
    if (n_sinks > 0) {
        list_marked(f, sim, far, SIM_FOLD_SINK, n_sinks, &f->sink, &f->sink_start);
        f->sink_fall = g_new0(int64_t, n_sinks);
    }
    sim->fold_far = far;
}

/* ---- dependency counts ---- */

/* Each stage's window and every op's code in it: what snapshots a period apart must
 * repeat (their windows moving by the stage's step); then the far ops past the window that
 * began counting down, their count and each one's index and code, compared in place. */
static void push_status(SimFold *f, const Sim *sim, Vec *ints)
{
    for (uint32_t s = 0; s < f->stages; s++) {
        uint32_t lo, hi;
        sim_jump_window(f, sim, s, &lo, &hi);
        vec_int(ints, lo);
        vec_int(ints, hi);
        for (uint32_t i = lo; i < hi; i++)
            vec_int(ints, sim_jump_counted(&sim->ops[i]) ? sim_jump_status(sim, s, i) : 1);
        const size_t count_at = ints->len;
        vec_int(ints, 0);
        for (uint32_t k = f->far_start ? f->far_start[s] : 0;
             f->far_start && k < f->far_start[s + 1]; k++) {
            const uint32_t i = f->far[k];
            const int64_t code = sim_jump_status(sim, s, i);
            if (i >= hi && code != 1) {
                vec_int(ints, i);
                vec_int(ints, code);
                ints->i[count_at]++;
            }
        }
        /* every sink's count left (the same sinks at every snapshot: their count is fixed) */
        for (uint32_t k = f->sink_start ? f->sink_start[s] : 0;
             f->sink_start && k < f->sink_start[s + 1]; k++)
            vec_int(ints, sim_jump_sink_left(sim, s, f->sink[k]));
    }
}

/* Whether stage s's part of y (at *k) is x's (at the same place: equal lengths) moved by
 * `periods` of the stage's step: the window moved, its codes and the far ops' equal. Moves *k
 * past the part. */
static gboolean same_stage_status(SimFold *f, uint32_t s, const Vec *x, const Vec *y,
                                  int64_t periods, size_t *k)
{
    const int64_t lo = y->i[*k], hi = y->i[*k + 1], step = periods * f->steps[s];
    if (x->i[*k] != lo - step || x->i[*k + 1] != hi - step)
        return FALSE;
    const size_t n = (size_t)(hi - lo);
    if (memcmp(x->i + *k + 2, y->i + *k + 2, n * sizeof(int64_t)) != 0)
        return FALSE;
    *k += 2 + n;
    const size_t far = 1 + 2 * (size_t)y->i[*k]; /* the far ops: count, index and code each */
    if (x->i[*k] != y->i[*k] || memcmp(x->i + *k, y->i + *k, far * sizeof(int64_t)) != 0)
        return FALSE;
    *k += far;
    /* The sinks: what a period counted each down (b to c), or twice that (a to c: the same
     * fall each period of three snapshots). */
    for (uint32_t j = f->sink_start ? f->sink_start[s] : 0;
         f->sink_start && j < f->sink_start[s + 1]; j++, (*k)++) {
        const int64_t fall = x->i[*k] - y->i[*k];
        if (fall < 0 || (periods == 1 ? (f->sink_fall[j] = fall, FALSE)
                                      : fall != periods * f->sink_fall[j]))
            return FALSE;
    }
    return TRUE;
}

/* Whether the status of b and c repeat: each stage's window the same size and moving by its
 * step, the codes in it equal, the far ops' equal in place. */
static gboolean same_status(SimFold *f, const Vec *b, const Vec *c)
{
    if (b->len != c->len)
        return FALSE;
    for (size_t k = 0, s = 0; s < f->stages; s++)
        if (!same_stage_status(f, (uint32_t)s, b, c, 1, &k))
            return FALSE;
    return TRUE;
}


/* The same over a, b and c (the three-snapshot test: sim_snap_repeats3). */
static gboolean same_status3(SimFold *f, const Vec *a, const Vec *b, const Vec *c)
{
    if (a->len != c->len || !same_status(f, b, c))
        return FALSE;
    for (size_t k = 0, s = 0; s < f->stages; s++)
        if (!same_stage_status(f, (uint32_t)s, a, c, 2, &k))
            return FALSE;
    return TRUE;
}

/* ---- the run's hooks ---- */

/* Stops keeping notes and drops those kept: the snapshots taken till now cannot be a jump's. */
static void notes_stop(SimFold *f, Sim *sim)
{
    f->notes_base += f->notes.len;
    f->notes.len = 0;
    f->notes_trim_len = NOTES_TRIM_AT;
    f->epoch++;
    f->passing[0] = f->passing[1] = FALSE;
    sim->fold_recording = FALSE;
}

static void notes_drop(SimFold *f, Sim *sim)
{
    notes_stop(f, sim);
    g_hash_table_remove_all(f->snaps);
}

void sim_fold_note_cell(Sim *sim, double *array, size_t at, double value)
{
    const Note n = {NOTE_CELL, array, at, value};
    sim->fold->cells_noted = TRUE;
    note_push(&sim->fold->notes, n);
}

void sim_fold_note_rank(Sim *sim, size_t at, uint32_t rank)
{
    const Note n = {NOTE_RANK, NULL, at, rank};
    sim->fold->cells_noted = TRUE;
    note_push(&sim->fold->notes, n);
}

/* Whether shift k waits for a window to pass an op that does not repeat (sim_jump_periods). */
static gboolean blocked(SimFold *f, const Sim *sim, uint32_t k)
{
    if (f->blocked_at[k] == UINT32_MAX)
        return FALSE;
    uint32_t lo, hi;
    sim_jump_window(f, sim, f->blocked_stage[k], &lo, &hi);
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

/* Drops the notes every kept snapshot has passed, and looks again NOTES_TRIM_AT notes on:
 * where the oldest snapshot holds more than half of them, looking at every boundary after
 * took 6.6 M of narayanan21-t1-529.6b's 482 M instructions (118,210 snapshots walked). */
static void notes_trim(SimFold *f)
{
    uint64_t oldest = f->notes_base + f->notes.len;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, f->snaps);
    while (g_hash_table_iter_next(&it, NULL, &value)) /* those of this epoch */
        if (((Snap *)value)->epoch == f->epoch)
            oldest = MIN(oldest, ((Snap *)value)->note_at);
    const uint64_t drop = oldest - f->notes_base;
    if (drop * 2 > f->notes.len) {
        memmove(f->notes.v, f->notes.v + drop, (f->notes.len - drop) * sizeof(Note));
        f->notes.len -= drop;
        f->notes_base = oldest;
    }
    f->notes_trim_len = f->notes.len + NOTES_TRIM_AT;
}

/* Whether a group's shift may still jump after a jump inside a group from head `micro`: the
 * skipped periods are logged (sim_jump_advance) only then, and the snapshots dropped
 * otherwise, as a jump of any other shift does (the log costs: plan --3d gpt-1t/4096's pp 32
 * v 4 over 2 groups). The group's shift proves at a head past this one and jumps where the
 * ops repeat a period (virtual groups alone) or three (two physical) past its window, inside
 * the schedule's micro-steps; and not while both its shifts wait for their window to pass an
 * op that does not repeat (sim_jump_periods). */
static gboolean group_may_jump(SimFold *f, const Sim *sim, uint32_t micro)
{
    const uint64_t past = (uint64_t)micro + f->group;
    if (f->virtual_left > 0 && past < f->A)
        return TRUE;
    return (uint64_t)micro + 3 * (uint64_t)f->group < f->A &&
           !(blocked(f, sim, GROUP_SHIFTS) && blocked(f, sim, GROUP_SHIFTS + 1));
}

/* Shift k tried anew with d micro-steps: what its walks proved is of another period (their
 * runs, no longer of the current generation, are not borrowed: sim_fold_jump.c). */
static void shift_reset(SimFold *f, uint32_t k, uint32_t d)
{
    const size_t at = (size_t)k * f->stages, n = f->stages;
    f->steps_gen[k]++;
    f->blocked_at[k] = UINT32_MAX;
    f->shifts[k] = d;
    if (k == f->n_shifts)
        f->n_shifts++;
    if (!f->equal_from) /* no walk yet (find_stages makes their rows) */
        return;
    memset(&f->equal_from[at], 0, n * sizeof *f->equal_from);
    memset(&f->equal_to[at], 0, n * sizeof *f->equal_to);
    memset(&f->equal_gen[at], 0, n * sizeof *f->equal_gen);
    memset(&f->equal_step[at], 0, n * sizeof *f->equal_step);
    memset(&f->equal_steps[at], 0, n * sizeof *f->equal_steps);
    memset(&f->equal_open[at], 0, n * sizeof *f->equal_open);
    memset(&f->prior[at], 0, n * sizeof *f->prior);
}

/* The period of a 1F1B pipeline's first stage by its heads: the fewest micro-steps d (3 to
 * pp, none of the shifts tried) over which its head times repeat, each head d after another d
 * after that one's, over a whole period: the shift found_slot tries (MAX_SHIFTS says why). A
 * shift only proposes: a jump still needs the whole state to repeat (sim_snap_repeats). Run
 * at a head where no shift's cheap fields repeated, past the fill. */
static void found_period(SimFold *f, uint32_t micro)
{
    const uint32_t n = f->n_head_s;
    const double *t = f->head_s;
#define HEAD_S(m) t[(m) % n]
    for (uint32_t d = 3; d <= f->stages && 2 * d < f->head_run && 2 * d < n; d++) {
        gboolean tried = FALSE;
        for (uint32_t j = 0; j < f->n_shifts; j++)
            tried = tried || (f->shifts[j] == d && j != f->found_slot);
        if (tried)
            continue;
        const double moved = HEAD_S(micro) - HEAD_S(micro - d);
        uint32_t j = 1;
        while (j < d && HEAD_S(micro - j) - HEAD_S(micro - j - d) == moved)
            j++;
        if (j < d)
            continue;
        if (f->found_slot >= f->n_shifts || f->shifts[f->found_slot] != d)
            shift_reset(f, f->found_slot, d);
        return;
    }
#undef HEAD_S
}

/* Watched rank w's compute stream moved on to op head: a snapshot where it is a head, and a
 * jump where the last three of its kind repeat. TRUE where it jumped. */
static gboolean at_head(SimFold *f, Sim *sim, uint32_t w, uint32_t head, double now_s)
{
    /* Most ops are no head: a bit says so without the hash's lookup (2 a boundary, 92k
     * boundaries in plan --3d gpt-1t). */
    const uint32_t at = head == NO_OP || !(f->head_bits[head / 8] >> (head % 8) & 1)
                            ? 0
                            : GPOINTER_TO_UINT(g_hash_table_lookup(
                                  f->heads, GUINT_TO_POINTER(head + 1)));
    if (at == 0)
        return FALSE;
    const uint32_t micro = at - 1; /* the head's number (find_heads) */
    Snap *c = sim_snap_new(micro, now_s);
    sim_jump_capture_first(f, sim, c);
    uint64_t *key = g_new(uint64_t, 1);
    *key = snap_key(micro, w);
    g_hash_table_replace(f->snaps, key, c);
    uint32_t dmax = 0; /* the longest shift, which the snapshots kept must reach back */
    for (uint32_t j = 0; j < f->n_shifts; j++)
        dmax = MAX(dmax, f->shifts[j]);
    const uint64_t old = snap_key(micro - MIN(micro, 2 * dmax + 1), w);
    if (micro >= 2 * dmax + 1)
        g_hash_table_remove(f->snaps, &old);
    f->passing[w] = FALSE;
    if (w == 0 && f->head_s) {
        f->head_run = f->head_run > 0 && micro == f->head_last + 1 ? f->head_run + 1 : 1;
        f->head_last = micro;
        f->head_s[micro % f->n_head_s] = now_s;
    }
    /* Interleaved: a group's shifts first (where a group repeats, its jump skips whole groups,
     * and it alone counts virtual ones), then those inside a group. */
    const uint32_t first_k = f->group > 0 ? GROUP_SHIFTS : 0;
    for (uint32_t j = 0; j < f->n_shifts; j++) {
        const uint32_t k = (first_k + j) % f->n_shifts, d = f->shifts[k];
        Snap *b = find(f, (int64_t)micro - d, w), *a = find(f, (int64_t)micro - 2 * d, w);
        if (blocked(f, sim, k) || !b)
            continue;
        /* c as b moved by a period (two snapshots), or each value moving by its own amount
         * twice (three: a lagging rank's times, GPipe's backward phase). */
        const gboolean two = sim_snap_same_steps(&b->first, &c->first);
        const gboolean three =
            a && f->own_steps && sim_snap_same_steps3(&a->first, &b->first, &c->first);
        if (!two && !three)
            continue;
        /* The first tier repeats: the whole state, then, of this instant, kept for the heads
         * to come where the one before lacks it. */
        if (!c->full)
            sim_jump_capture(f, sim, c);
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
             * the group's end) leaves the snapshots and the longer shifts alone. A jump
             * inside an interleaved group keeps the snapshots (and logs the periods it
             * skipped): the group's shift proves its repeat from them later. */
            const gboolean log = d < f->group && group_may_jump(f, sim, micro);
            if (sim_jump_advance(f, sim, from, b, c, k, log)) {
                if (!log)
                    notes_drop(f, sim);
                return TRUE;
            }
        }
    }
    if (w == 0 && f->head_s && !f->passing[0] && micro >= f->stages)
        found_period(f, micro);
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
    else if (f->notes.len > f->notes_trim_len) /* walking every snapshot costs: now and then */
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
    f->head_bits = g_new0(uint8_t, sim->n_ops / 8 + 1);
    find_heads(f, sim);
    find_far(f, sim);
    f->steps = g_new0(int64_t, f->stages);
    sim->fold_hi = g_new0(uint32_t, f->stages);
    for (uint32_t k = 0; k < MAX_SHIFTS; k++)
        f->blocked_at[k] = UINT32_MAX;
    const ZpPlan *plan = &sim->sched->plan;
    f->own_steps = !(plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER &&
                     zp_plan_etp(plan) * zp_plan_ep(plan) > 1);
    f->shifts[f->n_shifts++] = 1;
    f->shifts[f->n_shifts++] = 2;
    if (sim->sched->plan.pipe.schedule == ZP_PIPE_1F1B && f->stages > 2)
        f->shifts[f->n_shifts++] = f->stages; /* a round trip (MAX_SHIFTS) */
    /* Uneven stages repeat every heavy stage's worth of micro-steps (zp_pipe_heavy_stages):
     * mt-nlg-530b over 16 stages, 9 of 7 blocks and 7 of 6, stepped every event of 1,536
     * micro-steps ("no steady state repeated exactly"); with the shift of 9 it jumps 1,485. */
    const uint32_t heavy = (uint32_t)zp_pipe_heavy_stages(&sim->sched->model, &sim->sched->plan);
    if (heavy > 2 && heavy < f->stages)
        f->shifts[f->n_shifts++] = heavy;
    f->found_slot = UINT32_MAX;
    if (sim->sched->plan.pipe.schedule == ZP_PIPE_1F1B && f->stages > 2) {
        f->found_slot = f->n_shifts; /* taken when found_period finds one */
        f->n_head_s = 2 * f->stages + 2;
        f->head_s = g_new0(double, f->n_head_s);
    }
    if (sim->sched->plan.pipe.schedule == ZP_PIPE_INTERLEAVED && f->stages > 1) {
        g_assert(f->n_shifts == GROUP_SHIFTS);
        f->shifts[f->n_shifts++] = f->stages;
        f->shifts[f->n_shifts++] = 2 * f->stages;
        f->group = f->stages;
        f->chunks = (uint32_t)MAX(sim->sched->plan.pipe.virtual_stages, 1);
    }
    f->snaps = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, sim_snap_free);
    f->notes_trim_len = NOTES_TRIM_AT;
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

gboolean sim_fold_stopped_exact(SimFold *f, Sim *sim)
{
    return f && !f->refused && sim->stop_after_s > 0 && sim->stopped_s > sim->stop_after_s &&
           sim_jump_stopped_exact(f, sim);
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
    g_free(f->head_bits);
    g_free(f->steps);
    g_free(f->stage_start);
    g_free(f->stage_end);
    g_free(f->lo_hint);
    g_free(f->stop_from);
    g_free(f->head_s);
    g_free(f->equal_from);
    g_free(f->equal_to);
    g_free(f->equal_step);
    g_free(f->equal_steps);
    g_free(f->equal_open);
    g_free(f->equal_gen);
    g_free(f->prior);
    g_free(f->far);
    g_free(f->far_start);
    g_free(f->sink);
    g_free(f->sink_start);
    g_free(f->sink_fall);
    g_hash_table_destroy(f->snaps);
    g_free(f->notes.v);
    g_free(f);
}
