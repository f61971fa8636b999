/* real_offload: zreal's host and NVMe tiers for ZeRO-Offload and ZeRO-Infinity — the states the
 * schedule moves off the GPU in host memory counted by a tracker of their own or in swap files
 * (real_nvme), real copies and file I/O as the schedule's transfer ops say, a vectorised CPU Adam. */
#ifndef REAL_OFFLOAD_H
#define REAL_OFFLOAD_H

#include "real_alloc.h"
#include "real_backend.h"
#include "zp_sched.h"

#include <glib.h>

typedef struct RealOffload RealOffload;

/* The tiers of a schedule that offloads (what zreal executes; anything else fails naming it):
 * optimizer offload at stages 1-3 (every sub-group on the CPU, or at DeepSpeed's stage 3 on
 * the CPU backend the last ones by ratio), parameter offload at stage 3 (CPU backend only;
 * with nvme, the sub-groups max_in_cpu keeps in host memory: all, none, or under DeepSpeed's
 * stage 3 the first ones). A device backend pins the host
 * buffers (pin_memory; cudaHostRegister) and copies on its copy stream (copy_async, ordered by
 * copy_wait); the CPU backend addresses host memory directly and copies plainly. Host buffers
 * of exactly the schedule's host_bytes per category, zeroed: the fp32 master, moments and gradients (cpu), the 16-bit
 * host copy (stages 1-2) or partition (offload_param cpu, or max_in_cpu of it with nvme), the
 * staging buffer (stages 1-2), the optimizer swapper's buffer_count fp32 buffers of the
 * partition, the parameter swapper's buffer_count x buffer_size 16-bit pool and its
 * partitioned_swap_buffer (nvme; io-aligned as DeepSpeed sizes them, zp_offload_tiers); a swap
 * file under the plan's nvme_path for each category of nvme_bytes; the device staging buffer
 * of state_bytes[ZP_MEM_BUCKETS] (stages 1-2). `part` is the rank's partition in elements. */
RealOffload *real_offload_new(const ZpSchedule *s, RealBackend *be, int rank, uint64_t part,
                              GError **error);
void real_offload_free(RealOffload *o);

/* With parameter offload: host memory of the 16-bit partition for the engine to initialise
 * (the host tier's own, or a buffer real_offload_init writes to NVMe and releases); NULL when
 * the parameters stay on the GPU. */
RealBf16 *real_offload_param_init_buffer(RealOffload *o);

/* Set-up, counted in no transfer: the fp32 master from the initialised 16-bit `partition`,
 * zero moments, and the swap files written (master, moments, gradients, parameters). */
gboolean real_offload_init(RealOffload *o, const RealBf16 *partition, GError **error);

/* The host tier's 16-bit partition (offload_param cpu, or all of it kept by max_in_cpu), for
 * the engine's stage-3 parameters; NULL otherwise. */
RealBf16 *real_offload_host_params(RealOffload *o);

/* A reduced gradient slice of n elements at offset `at` of the partition, from `src` on the
 * device, down to the host's fp32 gradients: through the device staging buffer (stages 1-2)
 * or converted to fp32 in a device workspace first (stage 3, stage3.py partition_grads'
 * grad_buffer.float()); counts 4 n bytes of ZP_XFER_D2H. */
gboolean real_offload_grads_down(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n,
                                 GError **error);

/* A later micro-step (stages 2-3): the host's sum for the slice comes up into a device
 * workspace and is added to the reduced slice `dst` in place, rounded to its bf16 as the
 * GPU-resident gradients would be (so offload changes no number); counts 4 n bytes of
 * ZP_XFER_H2D. DeepSpeed's stage 3 rounds so too: its host sum (grad_partitions_flat_buffer)
 * is in gradient_accumulation_dtype, the model's bf16 unless data_types.grad_accum_dtype
 * says otherwise (engine.py get_data_types), and fp32 only at the boundary. */
gboolean real_offload_grads_up_add(RealOffload *o, RealBf16 *dst, uint64_t at, uint64_t n,
                                   GError **error);

/* DeepSpeed's stage 3 (stage3.py partition_grads, zp_impl host_grad_accum): the 16-bit
 * reduced slice `src` down into the host's 16-bit sum at `at` (grad_buffer.copy_; counts 2 n
 * bytes of ZP_XFER_D2H), and the sum up onto `dst` on the device (counts 2 n bytes of
 * ZP_XFER_H2D): copied over it at micro-step 0 (grad_buffer.to(device), the same values),
 * added to it in bf16 later (cuda_grad_buffer.add_), as the GPU-resident sum would be. */
void real_offload_accum_down(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n);
gboolean real_offload_accum_up(RealOffload *o, RealBf16 *dst, uint64_t at, uint64_t n,
                               gboolean add, GError **error);

/* DeepSpeed's stage 2 with accumulation (zp_offload_stage2_accum; stage_1_and_2.py
 * async_accumulate_grad_in_cpu_via_gpu): one whole tensor of `numel` elements at `at` of the
 * host's 16-bit sums (accumulated_grads_in_cpu, the tensors overlapping the partition one
 * after another), of which the rank's reduced part `own`, n elements from element `in` of
 * the tensor, is on the device. Up (later micro-steps): the sum comes up into the device
 * staging buffer (temp_grad_buffer_for_gpu_offload) and its part is added to `own` in bf16,
 * as the GPU-resident sum would be (counts 2 numel of ZP_XFER_H2D). Down: `own` into its
 * place in the staging buffer and the tensor down (2 numel of ZP_XFER_D2H). Only the rank's
 * part is ever read, as in DeepSpeed. */
gboolean real_offload_tensor_up_add(RealOffload *o, RealBf16 *own, uint64_t in, uint64_t n,
                                    uint64_t at, uint64_t numel, GError **error);
gboolean real_offload_tensor_down(RealOffload *o, const RealBf16 *own, uint64_t in, uint64_t n,
                                  uint64_t at, uint64_t numel, GError **error);

/* The last micro-step with the optimizer on NVMe: the slice's fp32 gradients to the swap
 * file (stage3.py swap_out_gradients); counts 4 n bytes of ZP_XFER_NVME_WRITE. */
gboolean real_offload_grads_out(RealOffload *o, uint64_t at, uint64_t n, GError **error);

/* The optimizer's NVMe swaps around CPU Adam, a sub-group at a time (stage3.py
 * _optimizer_states_and_gradient_swap_in / _swap_out): master, moments and gradients into
 * the swap buffers; then master and moments out, and with parameters on NVMe the updated
 * 16-bit sub-group (_partitioned_params_swap_out). */
gboolean real_offload_states_in(RealOffload *o, GError **error);
gboolean real_offload_states_out(RealOffload *o, GError **error);

/* The step goes sub-group by sub-group (zp_offload_sub_group_step, stage3.py step), its ops
 * in the schedule's order: states_in reads the next sub-group to step, real_offload_adam
 * steps it, and states_out and params_up write back the one stepped last. Whether the next
 * CPU Adam begins a step (its first sub-group). */
gboolean real_offload_first_sub_group(const RealOffload *o);

/* Partial offload (zp_offload_gpu_elems > 0; DeepSpeed's stage 3 on the cpu backend): the
 * sub-groups the GPU steps keep fp32 master, moments and gradients on the device (stage3.py
 * _create_fp32_partitions, initialize_optimizer_states: subgroup_to_device). grads_keep
 * converts the part of a reduced 16-bit sum [at, at + n) below gpu_elems into their fp32
 * gradients (_offload_grad_partition_at_boundary's copy on the device; real_offload
 * _grads_down moves only the rest); gpu_adam steps them (the backup optimizer) with the CPU
 * backend's Adam on fp32 gradients into the device partition `params`, the step's first op. */
void real_offload_grads_keep(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n);
void real_offload_gpu_adam(RealOffload *o, const RealAdamHyper *hyper, RealBf16 *params);

/* CPU Adam over the next sub-group: the same update as the backends' adam_step, from fp32
 * gradients, writing the 16-bit result to the host partition, the partitioned_swap_buffer,
 * or a transient host buffer of the sub-group (PyTorch's blocking fp32-to-16-bit copy_
 * converts on the CPU) that the transfer after it consumes. */
gboolean real_offload_adam(RealOffload *o, const RealAdamHyper *hyper, GError **error);

/* The updated 16-bit sub-group up to its place in the partition at `dst` on the device;
 * counts its bytes as ZP_XFER_H2D. */
void real_offload_params_up(RealOffload *o, RealBf16 *dst);

/* Parameter offload before a stage-3 all-gather: n elements at `at` of the partition read
 * from the swap file into the parameter pool at element pool_at (ZP_XFER_NVME_READ; only
 * those beyond the sub-groups the host keeps, each at its place), and up from the host (the
 * kept ones) and the pool to `dst` on the device (ZP_XFER_H2D, all n). */
gboolean real_offload_param_read(RealOffload *o, uint64_t at, uint64_t n, uint64_t pool_at,
                                 GError **error);
void real_offload_param_fetch(RealOffload *o, RealBf16 *dst, uint64_t at, uint64_t n,
                              uint64_t pool_at);

/* The host tier's tracker counters, the bytes moved per transfer kind so far, and the bytes
 * the swap files moved with O_DIRECT (set-up included). */
void real_offload_stats(const RealOffload *o, RealAllocStats *host, double moved[ZP_XFER_N],
                        double *direct_bytes);

/* NULL, or why the swap files use buffered I/O ("O_DIRECT: Invalid argument"). */
const char *real_offload_nvme_note(const RealOffload *o);

/* One CPU Adam step over n elements with fp32 gradients (exactly the CPU backend's
 * adam_step, which reads bf16 ones): written so the compiler vectorises it. Reads 4 + 3 x 4
 * bytes, writes 3 x 4 + 2, the 30 bytes per element zp_offload_cpu_adam_bytes counts. param
 * NULL: no 16-bit copy is written (FSDP2's sharded parameters are the fp32 master weights). */
void real_offload_cpu_adam(const RealAdamHyper *hyper, size_t n, float *restrict master,
                           float *restrict m, float *restrict v, const float *restrict grad,
                           RealBf16 *restrict param);

#endif
