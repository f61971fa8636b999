/* real_opbench: microbenchmarks of exactly the op kinds the op-level cost model (zp_cost)
 * costs — a GEMM shape grid per GEMM form, eager attention by head dimension and sequence,
 * every elementwise op class, a kernel launch, compute under a concurrent collective, and,
 * given a model and plan, every kernel of every compute op at that plan's own shapes. */
#ifndef REAL_OPBENCH_H
#define REAL_OPBENCH_H

#include "real_backend.h"
#include "real_comm.h"
#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>

/* Adds to `root` (a json_t object; every rank runs, rank 0's is written):
 * "launch_s" (a one-element add), "gemm_grid": [{form, m, n, k, log2_mnk, log2_aspect,
 * flops, time_s}] over the grid zp_optable's surface is read on, "attention_grid":
 * [{pass, batch, heads, seq_len, head_dim, flops (the model's count), time_s}] (eager),
 * "elementwise": [{class, elems, bytes (as zp_cost counts them), time_s}],
 * "contention": {gemm_s, gemm_with_collective_s, collective_bytes} (host backends with two or
 * more ranks: the GEMM in a thread while this thread runs all-reduces), and with a model
 * "ops": [{op, kernel, type, form or class, m, n, k, flops, bytes, time_s}] — each kernel
 * of each compute op (zp_cost_kernels) timed at its shape — "op_sequence" (real_opseq: each
 * compute op timed whole inside a step's sequence), "model" and "plan". */
gboolean real_opbench_run(RealBackend *be, RealComm *comm, const ZpModel *model,
                          const ZpPlan *plan, void *root, GError **error);

#endif
