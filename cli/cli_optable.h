/* cli_optable: `zplan calibrate`'s op-level table — fits a profile's "op_costs" (zp_optable)
 * from the op microbenchmarks of `zreal --microbench` runs, with GSL, and checks it against
 * the runs' own model-shaped kernels. */
#ifndef CLI_OPTABLE_H
#define CLI_OPTABLE_H

#include <glib.h>

/* Fits the op table from the runs at `paths` with `world` ranks (the rank count the profile
 * describes; runs with fewer share the cores differently and are left out): the GEMM
 * surface and eager attention at their grid points (mean rate over runs, net of the launch),
 * each elementwise class by t = c0 + bytes / rate (GSL weighted least squares, 1/t^2), the
 * optimizer from Adam's runs, the launch, the contention factor (1, said so in the note,
 * when no run measured it) and the whole-op times of every run's "op_sequence" (runs of any
 * rank count, each keyed by it: the mean per op, shape and ranks; the optimizer's
 * keyed by its elements). Stores in *op_costs the "op_costs" object, or NULL when no run has
 * op microbenchmarks (runs of an older zreal); adds its residuals to `calibration` under
 * "op_table" and, for every residual over 10%, prints a warning on stderr naming the ops.
 * `notes` (a json_t object) gains the table's source. Fails on a malformed run or a grid
 * with a missing point. */
gboolean cli_optable_fit(char **paths, int n_paths, int world, void **op_costs,
                         void *calibration, void *notes, GError **error);

#endif
