/* zp_colltab: collectives as measured on one machine, nccl-tests' table of time against message
 * size for each collective and rank count, and the time of any size read off that table. */
#ifndef ZP_COLLTAB_H
#define ZP_COLLTAB_H

#include <glib.h>
#include <stddef.h>

/* Why a table and not only a fitted ring (collective_fit): a ring fit has one bandwidth per
 * collective, and the bus bandwidth of MPI's shared-memory collectives moves with the message
 * as it leaves the caches. On 2 ranks here the all-reduce's was 1.14 GB/s at 512 KB, 0.83 at
 * 4 MB and 0.77 at 248 MB (gpt2-124m's gradients), the all-gather's 2.96 at 4 MB and 3.3 at
 * 14 MB. nccl-tests report a bus bandwidth per size for the same reason. The microbenchmark
 * times each collective at the very sizes the model's schedules use, besides a grid
 * (real_microbench), so the table holds them. */
#define ZP_COLLTAB_MAX_ROWS 12   /* 3 collectives x 4 rank counts */
#define ZP_COLLTAB_MAX_POINTS 64 /* a grid and several models' own sizes */

typedef struct {
    int kind;  /* a ZpCollKind (zp_sched.h, which includes this through zp_hw.h): all-reduce 0,
                * reduce-scatter 1 or all-gather 2; -1 in a curve of copies */
    int ranks; /* ranks of the group, on one machine */
    int n;     /* points */
    double bytes[ZP_COLLTAB_MAX_POINTS];  /* the whole array S, increasing */
    double time_s[ZP_COLLTAB_MAX_POINTS]; /* one call, positive and non-decreasing */
} ZpCollRow;

typedef struct {
    int n_rows;
    ZpCollRow rows[ZP_COLLTAB_MAX_ROWS];
} ZpCollTable;

/* Parses "collective_table": an array of {"op", "ranks", "bytes": [...], "time_s": [...]}, one
 * per collective and rank count; `what` names the file in messages. Fails, naming the key, on
 * an unknown op, ranks below 2, a repeated (op, ranks), sizes that do not increase or times that
 * decrease. */
gboolean zp_colltab_from_json(void *json_array, const char *what, ZpCollTable *t,
                              GError **error);

/* The table as that JSON array (a new reference). */
void *zp_colltab_to_json(const ZpCollTable *t);

/* What a size's several timings give: ZP_COLLTAB_LEAST where each is a microbenchmark run's
 * median of its repeats (the host's load differs between runs and only adds time: the fastest
 * run is the op's own cost), ZP_COLLTAB_MEDIAN where each is one instance (a profiler trace's
 * kernels, whose waits for peers a step pays as well). */
typedef enum { ZP_COLLTAB_LEAST, ZP_COLLTAB_MEDIAN } ZpCollPick;

/* Builds a table from timings (kind, ranks, bytes, time_s)[i], i < n: for each collective and
 * rank count, each size's timings taken as `pick` says, made
 * non-decreasing in size by its lower envelope (each size at most every larger size's time: a
 * smaller message costs no more, and a shared host's noise only adds time, so one slow timing
 * must not lift its neighbours). Fails when there are more rank counts or sizes than the
 * table holds. */
gboolean zp_colltab_build(const int *kind, const int *ranks, const double *bytes,
                          const double *time_s, size_t n, ZpCollPick pick, ZpCollTable *t,
                          GError **error);

/* One curve of time against size alone (a row without its op and ranks), as the op table
 * keeps the rank's memory copies (zp_optable's "copy"): {"bytes": [...], "time_s": [...]},
 * parsed and checked as a row's points (naming `what`), or written. */
gboolean zp_colltab_curve_from_json(void *json, const char *what, ZpCollRow *row,
                                    GError **error);
void *zp_colltab_curve_to_json(const ZpCollRow *row);

/* A curve from timings (bytes, time_s)[i], i < n, as zp_colltab_build makes a row (each size
 * as `pick` says, its lower envelope); `name` (such as "copies") names it in messages.
 * A curve's kind is -1 and its ranks 0. */
gboolean zp_colltab_curve_build(const double *bytes, const double *time_s, size_t n,
                                ZpCollPick pick, const char *name, ZpCollRow *row,
                                GError **error);

/* The row of collective `kind` (a ZpCollKind) at a rank count, NULL when the table has none. */
const ZpCollRow *zp_colltab_find(const ZpCollTable *t, int kind, int ranks);

/* Seconds of one collective of `bytes` (the whole array) from its row: exact at a measured size,
 * linear in log time against log size between two (so non-decreasing, as the row is); below the
 * smallest, the smallest's time (a latency floor); above the largest, at the largest's bus
 * bandwidth (nccl-tests' plateau). */
double zp_colltab_time_s(const ZpCollRow *row, double bytes);

#endif
