/* real_microbench: times the kernels and collectives the simulator's cost model has
 * constants for, on this backend and communicator, for `zplan calibrate` to fit. */
#ifndef REAL_MICROBENCH_H
#define REAL_MICROBENCH_H

#include "real_backend.h"
#include "real_comm.h"
#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>

/* Runs on every rank at once (all ranks compute together, as they do in training, so the
 * GEMM rates include contention for the machine's cores). Rank 0 writes, atomically, a
 * JSON object {"format": "zplan-microbench-1", "backend", "world", "emulated",
 * "host_memory_bytes" (the machine's physical memory),
 * "gemm": [{shape, form, m, n, k, flops, time_s}], "memory": [{kernel, elems, bytes,
 * time_s}] (the kernels calibrate fits, bytes as the schedule counts them),
 * "kernels": [{kernel, elems or shape, bytes, [flops,] time_s}] (every other kernel of a
 * step, device backends only), "collectives": [{op, ranks, bytes, time_s}] (two ranks or
 * more), "copies": [{bytes, time_s}] (one copy of an array of bytes, every rank copying at
 * once, at the collectives' sizes and their shares per rank: the copies around them),
 * "device_memory": {total_bytes, context_bytes} (device backends), "cpu_adam": [{elems,
 * bytes, time_s}] (the host's vectorised Adam of optimizer offload, one core per rank) and
 * "host_cores", "nvme": {path, direct, ranks, write: [{bytes, time_s}], read: [...]} (the
 * swap files of the NVMe tier under `nvme_dir`, written and read back by every rank at once;
 * bytes are the node's)} to `path`. Times are
 * the median of repeats: on a device backend each one call on the device clock; on the host
 * each the slowest rank's. Sizes are small on a CPU rank and model-shaped on a device
 * (GPT-2 124M and 1.5B linears at 1,024 to 16,384 tokens). Over an emulated communicator
 * (`emulated`), the collectives are the device-to-device copies that stand in for them. Each
 * collective also carries its algorithm and bus bandwidth as nccl-tests define them; with a
 * model, the collectives are also timed at the sizes of its data-parallel collectives at ZeRO
 * stages 0-3 (for zp_colltab's table), and their
 * repeats go round every collective and size in turn (a passing load hits one repeat of many
 * sizes, which the medians drop, not every repeat of one). The op
 * microbenchmarks of real_opbench follow (its sections), with `model` and `plan` (both NULL,
 * or both set) also every kernel of that plan's compute ops. */
gboolean real_microbench_run(RealBackend *be, RealComm *comm, gboolean emulated,
                             const ZpModel *model, const ZpPlan *plan, const char *nvme_dir,
                             const char *path, GError **error);

#endif
