/* real_microbench: times the kernels and collectives the simulator's cost model has
 * constants for, on this backend and communicator, for `zplan calibrate` to fit. */
#ifndef REAL_MICROBENCH_H
#define REAL_MICROBENCH_H

#include "real_backend.h"
#include "real_comm.h"

#include <glib.h>

/* Runs on every rank at once (all ranks compute together, as they do in training, so the
 * GEMM rates include contention for the machine's cores). Rank 0 writes, atomically, a
 * JSON object {"format": "zplan-microbench-1", "world", "gemm": [{m, n, k, flops, time_s}],
 * "memory": [{kernel, elems, bytes, time_s}], "collectives": [{op, ranks, bytes, time_s}]}
 * to `path`; times are the median of repeats, each repeat the slowest rank's. */
gboolean real_microbench_run(RealBackend *be, RealComm *comm, const char *path,
                             GError **error);

#endif
