/* real_zeror: ZeRO-R's cpu_checkpointing as zreal executes it — each block's checkpoint (its
 * Pa slice at mp > 1) copied to a host tier of its own (tracked) in forward and back into a
 * new device buffer before the recompute, as DeepSpeed's CheckpointFunction does with `.cpu()`
 * and `copy_`. */
#ifndef REAL_ZEROR_H
#define REAL_ZEROR_H

#include "real_alloc.h"
#include "real_backend.h"
#include "zp_sched.h"

#include <glib.h>

typedef struct RealCkptHost RealCkptHost;

/* The host tier of a schedule with cpu_checkpointing into *out (NULL without it). A block's
 * copy is its whole input, or with Pa at mp > 1 this rank's 1/M slice (the host copy ops'
 * bytes); the backend must address host memory directly (the CPU backend). Fails naming what
 * is missing. */
gboolean real_zeror_new(const ZpSchedule *s, RealBackend *be, RealCkptHost **out,
                        GError **error);
void real_zeror_free(RealCkptHost *h);

/* Whether block `block`'s checkpoint of micro-step `micro` is in host memory now (between
 * its two copies). */
gboolean real_zeror_on_host(const RealCkptHost *h, int block, int micro);

/* A host_copy op of `block` in micro-step `micro`: forward (nothing on the host yet) copies `bytes` of the block
 * input (its slice) at `device` into a new host buffer; backward copies the host buffer into
 * `device` (its place in the new GPU buffer the recompute reads) and releases it. */
gboolean real_zeror_host_copy(RealCkptHost *h, int block, int micro, void *device,
                              uint64_t bytes, GError **error);

/* The host tier's tracker counters (checkpoints only) and the bytes copied down and up so
 * far. */
void real_zeror_stats(const RealCkptHost *h, RealAllocStats *host, double *down_bytes,
                      double *up_bytes);

#endif
