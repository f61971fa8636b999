/* real_timing: how the microbenchmarks (real_microbench, real_opbench, real_opseq) time a call:
 * on the device clock on a device backend, else on the host's, one rank's or the slowest's. */
#ifndef REAL_TIMING_H
#define REAL_TIMING_H

#include "real_backend.h"
#include "real_comm.h"

#include <glib.h>
#include <stddef.h>

/* The most repeats real_timing_median_s takes. */
#define REAL_TIMING_REPEATS 7

/* A timed call: runs the kernel once on ctx. */
typedef gboolean (*RealTimedFn)(void *ctx, GError **error);

/* Waits for a device backend's work to be done (it returns before); TRUE at once on a host
 * backend. */
gboolean real_timing_finished(RealBackend *be, GError **error);

/* One call's time: on the device clock on a device backend; on the host the slowest rank's,
 * the ranks lined up first. */
gboolean real_timing_once_s(RealBackend *be, RealComm *comm, RealTimedFn fn, void *ctx,
                            double *s, GError **error);

/* One call's time on this rank alone, with no line-up: on the device clock on a device
 * backend, on this rank's host clock otherwise. For a sequence of calls that every rank makes
 * without a pause, lined up once before it (real_timing_line_up), so that each call runs
 * while the other ranks run theirs, as in training. */
gboolean real_timing_own_s(RealBackend *be, RealTimedFn fn, void *ctx, double *s,
                           GError **error);

/* Waits until every rank of `comm` has called it. */
gboolean real_timing_line_up(RealComm *comm, GError **error);

/* The median of n times (sorted in place): the middle one, the upper of two. */
double real_timing_median(double *times, size_t n);

/* The median of `repeats` (1 to REAL_TIMING_REPEATS) calls after one warm-up call (page
 * faults, library start-up): each on the device clock on a device backend, on the host each
 * the slowest rank's, the ranks lined up first. */
gboolean real_timing_median_s(RealBackend *be, RealComm *comm, RealTimedFn fn, void *ctx,
                              int repeats, double *median_s, GError **error);

#endif
