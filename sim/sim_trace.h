/* sim_trace: a simulated step as Chrome trace-event JSON, which ui.perfetto.dev and
 * chrome://tracing open: one process per simulated rank, one thread per stream, memory counters. */
#ifndef SIM_TRACE_H
#define SIM_TRACE_H

#include "sim_engine.h"
#include "zp_sched.h"

#include <glib.h>

/* A result of more ranks than this is traced on a few of them (sim_trace_write). */
#define SIM_TRACE_ALL_RANKS 64

/* Writes the trace of `result` (run with record_timeline) to path, atomically: a complete
 * ("X") event per compute and collective op, ts and dur in microseconds, named like
 * "fwd L12", "allgather L13", "reduce-scatter bucket 3", "adam"; before a collective that
 * this rank reached before the last member did, a "wait for rank N" event naming that
 * member; process and thread names; and a "memory" counter ("C") with the live bytes of
 * every category after each change. Up to SIM_TRACE_ALL_RANKS simulated ranks all go in;
 * past that rank 0, the rank that finished last and the rank rank 0 waited for longest.
 * Fails if the result has no timeline or the file cannot be written. `progress` (or NULL) is
 * told the share of ranks written. */
gboolean sim_trace_write(const ZpSchedule *sched, const SimResult *result, const char *path,
                         ZpProgressFn progress, void *progress_ctx, GError **error);

/* Runs sim_engine_run keeping only the timelines that are read: the reported rank's (for
 * `--json`'s op times where SimResult.op_type_s is not exact, past the clock's grid), and
 * with `trace` those sim_trace_write writes. Without `trace`, one
 * pass keeps the reported rank's where the stages' units share few rows
 * (SimOptions.timeline_report_rank), else rank 0's. With `trace`, a first pass keeps rank 0's
 * (every rank's, up to SIM_TRACE_ALL_RANKS). Where the ranks wanted are known only from the
 * first pass (the last to finish, the one rank 0 waited for), a second pass keeps theirs.
 * Memory is then a few ranks x ops, not ranks x ops; the result is the full run's. */
SimResult *sim_trace_run(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                         gboolean trace, GError **error);

#endif
