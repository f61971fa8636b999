/* sim_fold_cells: how far a jump moves the timeline cells it writes for the periods it skips:
 * each cell by its own step a period, which a lagging stage's cells need. */
#ifndef SIM_FOLD_CELLS_H
#define SIM_FOLD_CELLS_H

#include "sim_fold_jump.h"

/* The step a period of each note of [a->note_at, c->note_at), in a newly allocated array
 * (g_free) indexed from a->note_at, for a jump proved by three snapshots (each value of the
 * state moving by its own constant amount: a lagging stage's times, GPipe's backward phase),
 * whose cells move by as many steps of their own, not by the clock's period: a stage that falls
 * behind the others falls behind now_s too. A cell's step is its value in b -> c less its op's
 * one period before in a -> b (the same row and array, the op its stage's step earlier), given
 * to both notes; a cell whose counterpart lies outside the two periods takes the step another
 * cell of its row and stage found, else period_s. Sums and ranks (NOTE_ADD, NOTE_RANK) get 0:
 * they do not move in time. */
double *sim_fold_cell_steps(const SimFold *f, const Sim *sim, const Snap *a, const Snap *b,
                            const Snap *c, double period_s);

#endif
