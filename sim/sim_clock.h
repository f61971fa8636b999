/* sim_clock: the simulator's clock grid: every duration rounded to a whole number of 2^-30 s
 * quanta, so that the engine's times add exactly and sim_fold can jump whole periods. */
#ifndef SIM_CLOCK_H
#define SIM_CLOCK_H

#include <glib.h>

/* The clock's fixed grid (issue 40). Every time the engine computes is an event time plus a
 * duration rounded by sim_clock_q to a whole number of quanta of 2^-30 s (0.93 ns). Below
 * SIM_CLOCK_GRID_END_S = 2^22 s (48.5 days) a multiple of 2^-30 needs at most 52 bits, so
 * every such time is a double exactly, and sums and differences of them (t + d, now - mark,
 * t + k * period) are exact integer arithmetic: a state moved by any whole number of quanta
 * evolves into the same evolution moved alike, whatever powers of two it crosses, which is
 * what lets sim_fold.c jump a pipeline's steady state. At or past 2^22 s there is no grid:
 * durations are added unrounded, the engine runs as before and the fold refuses. */
#define SIM_CLOCK_GRID_END_S 0x1p22

/* A duration d >= 0 on the grid: d + 2^22 lies in [2^22, 2^23), whose doubles are 2^-30
 * apart, so one add rounds d to the nearest quantum (a tie to the even one) and the subtract
 * is exact. To nearest, not up: the error is at most half a quantum (0.47 ns) either way, where
 * rounding up would add up to a whole one to every op, always later (like ops round alike, so
 * a step moves by up to its critical path's op count x 0.47 ns: 117 ns on test_sim_plan's
 * 99.6 s plan); a positive duration under half a quantum becomes 0, which the engine
 * already runs (a zero-byte transfer ends in the instant it starts), and which merges a
 * flow's rounding residue (remaining bytes a few ulps above 0 after a reshare) into the
 * instant it belongs to. Needs strict IEEE arithmetic (no -ffast-math: it folds this to d). */
static inline double sim_clock_q(double d)
{
    return d < SIM_CLOCK_GRID_END_S ? (d + SIM_CLOCK_GRID_END_S) - SIM_CLOCK_GRID_END_S : d;
}

/* The most sim_clock_q moves one duration (half a quantum): a hand computation of n
 * durations in a row lies within n of these of the engine's time (tests use it). */
#define SIM_CLOCK_HALF_Q_S 0x1p-31

/* Whether time t is on the grid (a whole number of quanta below 2^22 s). */
static inline gboolean sim_clock_on_grid(double t)
{
    return t >= 0 && t < SIM_CLOCK_GRID_END_S && sim_clock_q(t) == t;
}

#endif
