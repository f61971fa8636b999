/* sim_fold: a pipeline's steady state (and gradient accumulation's micro-steps) advanced by
 * whole periods, bit for bit what stepping every event would give, or refused for the plan. */
#ifndef SIM_FOLD_H
#define SIM_FOLD_H

#include "sim_engine_internal.h"
#include "sim_fold_jump.h"

#include <glib.h>
#include <stdint.h>

/* The fold of one run, or NULL (report->note says why) where the run cannot fold: turned off
 * (SimOptions.no_fold), a stage simulated as more than one rank (explicit ranks, stragglers,
 * slow links: rank classes), fewer than four micro-steps. Called once the run's ranks and
 * state are set up. */
SimFold *sim_fold_new(Sim *sim, gboolean turned_off, SimFoldReport *report);

/* Between two instants (every event up to now_s taken and its allocs and frees run), when
 * rank 0's compute stream moved on: snapshots the state at the head of a micro-step, and
 * where its last two snapshots (or three) of one phase repeat exactly, advances the run by whole
 * periods; from 2^22 s on (the end of the clock's grid, sim_clock.h) it stops looking. */
void sim_fold_boundary(SimFold *fold, Sim *sim, double now_s);

/* sim_engine.c's hooks while a reference period is recorded (Sim.fold_recording): an output
 * sum `field` grew by x; a timeline cell written. The sums' hook is inline in the engine: a
 * call each cost 26 instructions, 3.6 M of narayanan21-t1-529.6b's 329 M (139,254 notes). */
static inline void sim_fold_note_add(Sim *sim, double *field, double x)
{
    const Note n = {NOTE_ADD, field, 0, x};
    note_push(&sim->fold->notes, n);
}
void sim_fold_note_cell(Sim *sim, double *array, size_t at, double value);
void sim_fold_note_rank(Sim *sim, size_t at, uint32_t rank);

/* Whether a run with extend_or_stop that stopped at SimOptions.stop_after_s stopped where
 * the long schedule's run stops (sim_jump_stopped_exact): every virtual period would have
 * been counted but for the stop time, and the run reached it on steady periods alone. Its
 * step time then stands for the long schedule's (SimResult.extended_micro_steps). */
gboolean sim_fold_stopped_exact(SimFold *fold, Sim *sim);

void sim_fold_free(SimFold *fold, SimFoldReport *report);

#endif
