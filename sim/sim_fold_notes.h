/* sim_fold_notes: the log a recorded period keeps (the sums added to, the timeline cells
 * written), its sums replayed for the periods a jump skips, and how far the jump moves the
 * cells it writes for them. */
#ifndef SIM_FOLD_NOTES_H
#define SIM_FOLD_NOTES_H

#include "sim_engine_internal.h"

#include <glib.h>
#include <stdint.h>

/* A recorded period's log (sums added to, timeline cells written). */
typedef enum { NOTE_ADD, NOTE_CELL, NOTE_RANK } NoteKind;

typedef struct {
    uint8_t kind;
    double *field; /* NOTE_ADD: the sum; NOTE_CELL: the timeline array */
    size_t at;     /* NOTE_CELL, NOTE_RANK: the cell (row x n_ops + op) */
    double x;      /* NOTE_ADD: what was added; NOTE_CELL: the value; NOTE_RANK: the rank */
} Note;

/* The recorded log: appended to at every sum the engine adds to while recording (some
 * hundred thousand a run), so inline, not through GArray's call. */
typedef struct {
    Note *v;
    size_t len, cap;
} NoteLog;

/* Room for 16,384 notes (512 kB, its pages touched as notes come) at the first: from 4,096,
 * Megatron 1T's log grew twice, realloc copying it (0.13 M instructions). */
static inline void note_push(NoteLog *log, Note n)
{
    if (G_UNLIKELY(log->len == log->cap)) {
        log->cap = log->cap ? 2 * log->cap : 16384;
        log->v = g_renew(Note, log->v, log->cap);
    }
    log->v[log->len++] = n;
}

/* Adds each of the n notes v[k] (NOTE_ADD: v[k].x to *v[k].field) `times` times over, giving
 * the very doubles the additions in order give; in time in the notes, not in times x n, where
 * the sums and figures lie on the clock's grid (sim_fold_notes.c says why that is exact). */
void sim_fold_replay_sums(const Note *v, size_t n, uint64_t times);

/* The step a period of each of the n notes v[0..n) of two recorded periods (v[0..mid) the
 * first, v[mid..n) the second), in a newly allocated array (g_free), for a jump proved by
 * three snapshots (each value of the state moving by its own constant amount: a lagging
 * stage's times, GPipe's backward phase), whose cells move by as many steps of their own, not
 * by the clock's period: a stage that falls behind the others falls behind now_s too. A cell's
 * step is its value in the second period less its op's one period before in the first (the
 * same row and array, the op its stage's step, steps[stage], earlier), given to both notes; a
 * cell whose counterpart lies outside the two periods takes the step another cell of its row
 * and stage found, else period_s. Sums and ranks (NOTE_ADD, NOTE_RANK) get 0: they do not move
 * in time. */
double *sim_fold_cell_steps(const Sim *sim, const Note *v, size_t n, size_t mid,
                            const int64_t *steps, double period_s);

#endif
