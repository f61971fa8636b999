/* zp_torchtrace: reads PyTorch profiler traces (Kineto's Chrome-trace JSON, plain or gzip) one
 * event at a time, links each GPU kernel to the CPU op that launched it and places it in a class. */
#ifndef ZP_TORCHTRACE_H
#define ZP_TORCHTRACE_H

#include "zp_kclass.h"

#include <glib.h>

/* Bounds that keep a trace of any size in bounded memory: one event's JSON (a kernel with its
 * arguments is under 2 KB in Kineto's traces), and the records kept of one file (kernels,
 * launches and CPU ops with shapes, about 60 bytes each: 16M of them is under 1 GB). */
#define ZP_TRACE_MAX_EVENT_BYTES (1u << 20)
#define ZP_TRACE_MAX_RECORDS (1u << 24)

typedef struct ZpTorchTrace ZpTorchTrace;

ZpTorchTrace *zp_torch_trace_new(void);
void zp_torch_trace_free(ZpTorchTrace *t);

/* Reads one rank's trace (PATH.json or PATH.json.gz) into t: its kernels become timed
 * instances of their class (the kernels of one CPU op and class summed: a GEMM and its split-K
 * reduction are one GEMM), grouped by shape across every file read. Fails naming the file
 * and the byte or event on malformed or truncated JSON, an event over
 * ZP_TRACE_MAX_EVENT_BYTES, a non-finite time or a duration below 0 or over 1,000 s, more
 * than ZP_TRACE_MAX_RECORDS
 * records, or a trace without a "traceEvents" array. */
gboolean zp_torch_trace_read(ZpTorchTrace *t, const char *path, GError **error);

/* What the traces read so far hold. */
typedef struct {
    int files, steps;           /* steps: ProfilerStep#N spans, or one per file without */
    int world_size;             /* distributedInfo's, the largest; 0 without */
    double step_s;              /* median ProfilerStep# duration (CPU side); 0 without */
    double class_step_s[ZP_KCLASS_N + 1]; /* per class (and unknown): the median over steps
                                           * and files of its kernels' time in one step */
    guint64 kernels;            /* GPU kernels, copies and fills read */
    guint64 instances[ZP_KCLASS_N + 1];
    guint64 unlinked;           /* kernels with no launch or CPU op found for their
                                 * correlation id (none, or none in the trace) */
    guint64 zero_length;        /* kernels under a nanosecond (zero in older traces' whole
                                 * microseconds): counted, out of the tables */
    guint64 shapeless;          /* instances whose shape nothing in the trace says (a GEMM
                                 * whose CPU op had no recorded shapes, a collective without
                                 * its size): in the class totals, not the tables */
    guint64 outside_steps;      /* kernels launched outside every ProfilerStep */
} ZpTraceSummary;
void zp_torch_trace_summary(const ZpTorchTrace *t, ZpTraceSummary *s);

/* The "kernel_tables" object (zp_kclass.h) of every instance with a shape: each row the
 * median time of its shape over every step and file, with its count; `source` goes into each
 * class's "sources" (a new json_t *). */
void *zp_torch_trace_tables(const ZpTorchTrace *t, const char *source);

/* The kernel names in no class: an array of {name, total_s, count}, longest total first (a
 * new json_t *). */
void *zp_torch_trace_unknown(const ZpTorchTrace *t);

/* The collectives zp_colltab's table holds (all-reduce, reduce-scatter, all-gather; a
 * ZpCollKind each) as timings: appended to kind and ranks (int) and bytes and time_s
 * (double), one per timed kernel. */
void zp_torch_trace_collectives(const ZpTorchTrace *t, GArray *kind, GArray *ranks,
                                GArray *bytes, GArray *time_s);

#endif
