/* sim_fold_snap: the fold's snapshots of the run (a growing array of 8-byte values, a
 * snapshot's parts) and the tests two of them a period apart must pass to prove a repeat. */
#ifndef SIM_FOLD_SNAP_H
#define SIM_FOLD_SNAP_H

#include <glib.h>
#include <stddef.h>
#include <stdint.h>

/* An op reference's stage where it names none (NO_OP). */
#define REF_NONE UINT32_MAX

/* A growing array of 8-byte values (doubles or int64_t), appended to inline: a snapshot
 * takes thousands of them at every period's head. */
typedef struct {
    union {
        double *d;
        int64_t *i;
    };
    size_t len, cap;
} Vec;

static inline void vec_grow(Vec *v, size_t more)
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
    uint32_t micro, shift; /* its head's micro-step; micro-steps a period (set when compared) */
    double now_s;
    Vec d;      /* doubles */
    Vec i;      /* equal across snapshots */
    Vec lin;    /* counters, moving by one amount */
    Vec status; /* the countdowns (push_status), once the rest repeated */
    Vec refs;  /* two an op reference (push_ref) */
    Vec bytes; /* the places in d of byte counts (FIELD_BYTES, FIELD_PEAK) */
    Vec peaks; /* the places in d of peaks of bytes, each just after its live count */
    Vec moves; /* per reference: the ops it moves by a period (0: it stays put) */
    Vec first;  /* now_s and each rank's times (capture_first): every snapshot's */
    gboolean full; /* d, i, lin, refs, bytes taken (capture) */
    gboolean has_status;
    uint64_t note_at; /* notes taken before it (SimFold.notes_base counts the dropped ones) */
    uint32_t epoch;   /* SimFold.epoch when taken: notes were kept unbroken within one */
} Snap;

Snap *sim_snap_new(uint32_t micro, double now_s);
void sim_snap_free(gpointer snap);

/* Whether z is y moved by a period: the first value (now) grew, by the period, and every other
 * value moved by it or not at all. */
gboolean sim_snap_same_steps(const Vec *y, const Vec *z);

/* Whether c is b (a period before it) moved by a period: the integers equal, every time moved
 * by the period or not at all, each peak of bytes still or rising with its live count
 * (which does not rise under a still peak), each op reference naming one op in both
 * or moving by its stage's step (steps[stages]: set here, the same for every moving reference
 * of a stage); c->moves gets each reference's move. Counters may move by any amount. */
gboolean sim_snap_repeats(int64_t *steps, uint32_t stages, const Snap *b, Snap *c);

/* The most periods the doubles can move on from c, each staying exact (sim_fold.c: times on
 * the clock's grid below 2^22 s, bytes whole numbers below 2^53), b span periods before c;
 * *grid_end set where the
 * grid's end left room for fewer than two. */
uint64_t sim_snap_periods_exact(const Snap *b, const Snap *c, uint32_t span, gboolean *grid_end);

/* Whether x, y and z move by one amount twice, value by value. */
gboolean sim_snap_same_steps3(const Vec *x, const Vec *y, const Vec *z);

/* Whether a, b and c (one period apart each) repeat: the integers equal, the counters and
 * every double moving by one amount twice, each op reference naming one op in all three or
 * moving by its stage's step (steps[stages]: set here, the same for every moving reference
 * of a stage); c->moves gets each reference's move. For states that are not b moved. */
gboolean sim_snap_repeats3(int64_t *steps, uint32_t stages, const Snap *a, const Snap *b,
                           Snap *c);

#endif
