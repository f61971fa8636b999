/* real_engine_ds: the engine's plug-in for DeepSpeed v0.19.6's ZeRO stages 2 and 3 — gradients
 * landing tensor by tensor in whole-tensor buckets, grads_in_partition, per-tensor partitions,
 * gathers and persistence — executing the ops zp_impl_deepspeed.c plans. */
#ifndef REAL_ENGINE_DS_H
#define REAL_ENGINE_DS_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_engine_base.h"
#include "real_gpt.h"
#include "real_offload.h"
#include "zp_sched.h"

#include <glib.h>

typedef struct RealDs RealDs;

/* Writes elements [first, first + count) of unit u's initial parameters to dst. */
typedef gboolean (*RealDsInitFn)(void *engine, int unit, uint64_t first, uint64_t count,
                                 RealBf16 *dst, GError **error);

/* Whether a schedule is DeepSpeed's at stage 2 or 3 (the plug-in's, not the engine's own). */
gboolean real_ds_applies(const ZpSchedule *s);

/* The plug-in of a schedule real_ds_applies to, on the engine's buffers by schedule id (the
 * array lives as long as the plug-in) and its 16-bit parameters (stage 2: all of them,
 * stage 3: this rank's partition). It allocates the gradients the schedule's model states
 * name (stage 2: grads_in_partition; stage 3: the partition) and, at stage 3, the full copies
 * of persistent parameters; it fails naming what the schedule asks that it cannot lay out. */
RealDs *real_ds_new(const ZpSchedule *s, RealBackend *be, RealComm *comm, void **buffers,
                    RealBf16 *params, GError **error);
void real_ds_free(RealDs *ds);

/* Stage 3: draws this rank's slice of every tensor and the persistent tensors whole. */
gboolean real_ds_init_params(RealDs *ds, RealDsInitFn init, void *engine, GError **error);

/* Unit u's parameters as a compute op reads them: the tensors k with bit k of `used` set (a
 * tied LM head reads only the embedding's first, wte); the others NULL. */
gboolean real_ds_params(RealDs *ds, int unit, uint32_t used, RealGptTensors *out,
                        GError **error);

/* Where the compute op of micro-step `micro` accumulates unit u's gradients of the tensors in
 * `used`: each in the bucket that reduces it (a held ipg buffer at the bucket's place in it,
 * or the bucket's own buffer). */
/* ZpImpl experts_in_buckets: where `elems` expert gradients from expert-space offset `at`
 * land in micro-step `micro`: their place after their bucket's dense part, or while it has no
 * room a zeroed buffer of their own, copied in when it has (as a dense tensor waits). */
RealBf16 *real_ds_expert_grads(RealDs *ds, uint64_t at, uint64_t elems, int micro,
                               GError **error);
/* A bucket's experts [lo, lo + elems) as their EDP reduction reads them (*bucket: which), and
 * after it the bucket's place given back. */
RealBf16 *real_ds_expert_region(RealDs *ds, uint64_t lo, uint64_t elems, int micro, int *bucket,
                                GError **error);
gboolean real_ds_experts_reduced(RealDs *ds, int bucket, GError **error);
gboolean real_ds_grads(RealDs *ds, int unit, uint32_t used, int micro, RealGptTensors *out,
                       GError **error);

/* Stage 3: a coalesced all-gather's tensors copied out of its flat buffer into their own
 * (partition_parameters.py AllGatherCoalescedHandle.wait), the buffers its op depends on. */
gboolean real_ds_unpack(RealDs *ds, const ZpOp *op, GError **error);

/* Stage 3 with qwZ: a quantize op on the gather stream (this rank's slices of the call that
 * follows, into its place of the int8 buffer the op depends on), or on the compute stream
 * once the call is waited for (every rank's int8 and scales into its gathered buffer). */
gboolean real_ds_qwz(RealDs *ds, const ZpOp *op, GError **error);

/* Stage 3 with qgZ: the intra-node all-to-all of one tensor (zp_build_qgz.c
 * zp_build_qgz_by_tensor; comm/coalesced_collectives.py all_to_all_quant_reduce): its
 * gradients in its bucket as the world's partitions, int4 in zp_zeropp_qgz_tensor's groups
 * through real_zeropp_qgz_tensor in DeepSpeed's own buffers (`work`, work_bytes long: the
 * cross-node all-to-all and the kernels are part of it), into the output slice the op depends
 * on (a bucket buffer held until the bucket's reduction is done), added from there to this
 * rank's slice of the partition. */
gboolean real_ds_qgz(RealDs *ds, const ZpOp *op, RealComm *node, RealComm *cross,
                     uint8_t *work, uint64_t work_bytes, GError **error);

/* Stage 3 with hpZ: backward calls gather over hpz_comm (the plug-in does not own it) from
 * this rank's secondary partition, which the forward's data-parallel gathers fill; it takes
 * that partition (the schedule's secondary_params), failing where it cannot lay it out. */
gboolean real_ds_hpz(RealDs *ds, RealComm *hpz_comm, GError **error);

/* A collective op of the schedule. */
gboolean real_ds_collective(RealDs *ds, const ZpOp *op, GError **error);

/* Stage 3: an alloc or free of buffer -1 (zp_impl.h persistent_freed_for_step): the free
 * releases every persistent tensor's full copy as the step begins; an alloc takes one back,
 * for the all-gather `next` (the op after it) refreshes. */
gboolean real_ds_state_op(RealDs *ds, const ZpOp *op, const ZpOp *next, GError **error);

/* This rank's reduced partition gradients, as the step reads them. */
const RealBf16 *real_ds_step_grads(const RealDs *ds);

/* Optimizer offload: transfer op `op` of this rank's reduced slice of the reduction `coll`,
 * between the device and real_offload's tiers as DeepSpeed moves it: stage 2 the fp32 slice
 * down (stage_1_and_2.py copy_grads_in_partition -> async_inplace_copy_grad_to_fp32_buffer
 * _from_gpu; one micro-step); stage 3 the 16-bit slice down into the host's sum and the sum
 * up (added at later micro-steps), then fp32 down and out to NVMe at the last (stage3.py
 * partition_grads, _offload_grad_partition_at_boundary, swap_out_gradients). */
gboolean real_ds_grad_transfer(RealDs *ds, const ZpOp *op, const ZpOp *coll, RealOffload *o,
                               GError **error);

/* Parameter offload (stage 3): transfer op `op` before the call whose buffer `alloc`
 * allocates, the next call of the micro-step: each of its tensors' slices of this rank's
 * partition read from NVMe into the parameter pool one after another (ZP_XFER_NVME_READ), or
 * up from the pool or the host partition into this rank's place of the call's buffer
 * (ZP_XFER_H2D), as partition_parameters.py all_gather_coalesced does after
 * _ensure_availability_of_partitioned_params: p.ds_tensor.to(device) for each, concatenated
 * into partitions[rank] (_all_gather_dtype); the call then gathers in place. */
gboolean real_ds_param_transfer(RealDs *ds, const ZpOp *op, const ZpOp *alloc, RealOffload *o,
                                GError **error);

#endif
