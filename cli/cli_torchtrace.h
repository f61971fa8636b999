/* cli_torchtrace: `zplan calibrate --torch-trace` and `zplan validate --torch-trace`: a
 * PyTorch profiler trace (zp_torchtrace) into a hwprofile's kernel tables, or beside a prediction. */
#ifndef CLI_TORCHTRACE_H
#define CLI_TORCHTRACE_H

#include "zp_torchtrace.h"

#include <glib.h>
#include <stdio.h>

/* Reads every trace (NULL-terminated paths: one per rank, or several steps' files); a trace
 * without GPU kernels is refused, naming it. */
ZpTorchTrace *cli_torch_trace_load(char **paths, GError **error);

/* The trace's step by kernel class (time per step, share, instances, table rows), then the
 * unknown kernel names with their total time, on `out`. */
void cli_torch_trace_print(const ZpTorchTrace *t, FILE *out);

/* The trace's summary as the profile's calibration records it (a new json_t *): files, steps,
 * step time, each class's time per step and instances, the counts of unlinked, zero-length
 * and shapeless kernels and every unknown kernel name. */
void *cli_torch_trace_summary_json(const ZpTorchTrace *t);

/* `zplan calibrate --torch-trace TRACE... --cluster BASE --out PROFILE`: BASE's profile with
 * the traces' kernel tables merged into its own ("kernel_tables", each class's source
 * recorded), their all-reduce, reduce-scatter and all-gather timings replacing BASE's
 * collective table rows of the same collective and rank count, and the summary under
 * calibration.torch_trace; checked to load, then written. */
gboolean cli_torch_calibrate(char **traces, const char *cluster, const char *out,
                             const char *name, GError **error);

/* `zplan validate --torch-trace TRACE... --model M --cluster C ...` (cli_torchvalidate.c):
 * simulates the plan simulate's flags give and prints the trace's step by kernel class beside
 * the prediction (and the run's step time and peak memory with --torch-steps FILE). */
int cli_torch_validate(int argc, char **argv);

#endif
