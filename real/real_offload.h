/* real_offload: zreal's host tier for ZeRO-Offload — the optimizer states and fp32 gradient
 * partition in host memory counted by a tracker of their own, real copies between the tiers
 * as the schedule's transfer ops say, and a vectorised CPU Adam. */
#ifndef REAL_OFFLOAD_H
#define REAL_OFFLOAD_H

#include "real_alloc.h"
#include "real_backend.h"
#include "zp_sched.h"

#include <glib.h>

typedef struct RealOffload RealOffload;

/* The host tier of a schedule that offloads the optimizer to the CPU at stage 1 (what zreal
 * executes; other offloads fail naming them): host buffers of exactly the schedule's
 * host_bytes per category (fp32 master, moments and gradients and a 16-bit copy of the
 * partition of part_elems elements, a staging buffer), zeroed, and the device staging buffer
 * of state_bytes[ZP_MEM_BUCKETS] from the backend. The backend must address host memory
 * directly (the CPU backend). */
RealOffload *real_offload_new(const ZpSchedule *s, RealBackend *be, uint64_t part_elems,
                              GError **error);
void real_offload_free(RealOffload *o);

/* The host tier's fp32 master and moments, for the engine to initialise and keep. */
float *real_offload_master(RealOffload *o);
float *real_offload_adam_m(RealOffload *o);
float *real_offload_adam_v(RealOffload *o);

/* A reduced gradient slice of n elements at offset `at` of the partition, from `src` on the
 * device, down to the host's fp32 gradients through the device staging buffer; counts 4 n
 * bytes of ZP_XFER_D2H (the fp32 bytes DeepSpeed moves). */
void real_offload_grads_down(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n);

/* CPU Adam over the host's partition: the same update as the backends' adam_step, from fp32
 * gradients, writing the 16-bit copy. */
void real_offload_adam(RealOffload *o, const RealAdamHyper *hyper);

/* The updated 16-bit partition up to `dst` on the device; counts its bytes as ZP_XFER_H2D. */
void real_offload_params_up(RealOffload *o, RealBf16 *dst);

/* The host tier's tracker counters and the bytes moved per transfer kind so far. */
void real_offload_stats(const RealOffload *o, RealAllocStats *host, double moved[ZP_XFER_N]);

/* One CPU Adam step over n elements with fp32 gradients (exactly the CPU backend's
 * adam_step, which reads bf16 ones): written so the compiler vectorises it. Reads 4 + 3 x 4
 * bytes, writes 3 x 4 + 2, the 30 bytes per element zp_offload_cpu_adam_bytes counts. */
void real_offload_cpu_adam(const RealAdamHyper *hyper, size_t n, float *restrict master,
                           float *restrict m, float *restrict v, const float *restrict grad,
                           RealBf16 *restrict param);

#endif
