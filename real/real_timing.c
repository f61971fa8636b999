/* real_timing: one call timed on the device clock or the host's (one rank's, or the slowest
 * rank's after a line-up), and the median of repeats: what every microbenchmark reads. */
#include "real_timing.h"
#include "zp_util.h"

#include <stdlib.h>

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A device backend returns before its work is done: the timed region waits for it. */
gboolean real_timing_finished(RealBackend *be, GError **error)
{
    const char *text = NULL;
    if (!be->synchronize || be->synchronize(be, &text))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s", text);
    return FALSE;
}

/* One call's time on the device clock (events around it, as the engine times its ops). */
static gboolean device_time(RealBackend *be, RealTimedFn fn, void *ctx, double *s,
                            GError **error)
{
    void *begin = be->mark(be);
    if (!fn(ctx, error))
        return FALSE;
    *s = be->elapsed_s(be, begin, be->mark(be));
    return real_timing_finished(be, error);
}

/* One call's time on this rank's host clock. */
static gboolean own_host_time(RealBackend *be, RealTimedFn fn, void *ctx, double *s,
                              GError **error)
{
    const double t0 = zp_now_s();
    if (!fn(ctx, error) || !real_timing_finished(be, error))
        return FALSE;
    *s = zp_now_s() - t0;
    return TRUE;
}

/* The largest of the ranks' `own_s` (every rank calls it), in *s on rank 0 (0 elsewhere). */
static gboolean slowest_s(RealComm *comm, double own_s, double *s, GError **error)
{
    double *all = g_new0(double, comm->size);
    gboolean ok = comm->gather_host_f64(comm, &own_s, 1, all, error);
    *s = 0;
    for (int r = 0; ok && r < comm->size; r++)
        *s = MAX(*s, all[r]);
    g_free(all);
    return ok;
}

gboolean real_timing_line_up(RealComm *comm, GError **error)
{
    double zero = 0;
    return comm->allreduce_host_f64(comm, &zero, 1, error);
}

/* One call's time on the host clock, the slowest rank's (collectives and synchronous
 * training wait for it), the ranks lined up first. */
static gboolean host_time(RealBackend *be, RealComm *comm, RealTimedFn fn, void *ctx,
                          double *s, GError **error)
{
    double own_s;
    return real_timing_line_up(comm, error) && own_host_time(be, fn, ctx, &own_s, error) &&
           slowest_s(comm, own_s, s, error);
}

gboolean real_timing_once_s(RealBackend *be, RealComm *comm, RealTimedFn fn, void *ctx,
                            double *s, GError **error)
{
    return be->mark ? device_time(be, fn, ctx, s, error) : host_time(be, comm, fn, ctx, s, error);
}

gboolean real_timing_own_s(RealBackend *be, RealTimedFn fn, void *ctx, double *s,
                           GError **error)
{
    return be->mark ? device_time(be, fn, ctx, s, error) : own_host_time(be, fn, ctx, s, error);
}

double real_timing_median(double *times, size_t n)
{
    qsort(times, n, sizeof times[0], compare_doubles);
    return times[n / 2];
}

gboolean real_timing_median_s(RealBackend *be, RealComm *comm, RealTimedFn fn, void *ctx,
                              int repeats, double *median_s, GError **error)
{
    double times[REAL_TIMING_REPEATS];
    repeats = CLAMP(repeats, 1, REAL_TIMING_REPEATS);
    if (!fn(ctx, error) || !real_timing_finished(be, error))
        return FALSE;
    for (int i = 0; i < repeats; i++)
        if (!real_timing_once_s(be, comm, fn, ctx, &times[i], error))
            return FALSE;
    *median_s = real_timing_median(times, (size_t)repeats);
    return TRUE;
}
