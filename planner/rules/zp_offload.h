/* zp_offload: ZeRO-Offload and ZeRO-Infinity — which model states DeepSpeed v0.19.6 moves to
 * host memory or NVMe, the tiers' bytes per GPU and per node, their fit, and the rules the
 * schedule builder asks about transfers (gradients down, parameters up, NVMe swaps, CPU Adam). */
#ifndef ZP_OFFLOAD_H
#define ZP_OFFLOAD_H

#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"

#include <glib.h>

/* zreal's NVMe tier moves the page-aligned middle of each transfer with O_DIRECT through one
 * aligned host buffer of ZP_OFFLOAD_BOUNCE_BYTES (DeepSpeed's aio block_size default, 1 MiB),
 * shared by a rank's swap files and taken with a page to spare to align it: the host tier
 * counts those ZP_OFFLOAD_BOUNCE_BYTES + ZP_OFFLOAD_PAGE_BYTES (ZP_MEM_BUCKETS, pageable)
 * whenever anything lives on NVMe. */
#define ZP_OFFLOAD_BOUNCE_BYTES (1u << 20)
#define ZP_OFFLOAD_PAGE_BYTES 4096u

/* DeepSpeed's aio alignment of swap buffers: AIO_ALIGNED_BYTES (1024) x
 * aio.intra_op_parallelism, whose default 1 zplan assumes (it reads no "aio" section). */
#define ZP_OFFLOAD_AIO_ALIGNED_BYTES 1024.0

/* `elems` elements of `elem_bytes` rounded up to a multiple of the aio alignment
 * (swap_tensor's _io_aligned_numel with numel_alignment = 1024 / elem_bytes). */
double zp_offload_io_aligned(double elems, double elem_bytes);

/* Per-rank bytes of each memory category in each tier, and the per-node sums of the host
 * tiers. The GPU row holds the model states left on the GPU plus the GPU staging buffers
 * offload adds (counted as ZP_MEM_BUCKETS); the CPU row the host copies, pinned staging and
 * swap buffers, and Pa+cpu's checkpoint slices (ZP_MEM_CHECKPOINTS, zp_zeror_host_bytes); the
 * NVMe row the swapped files. The GPU's residual terms (activations, buckets of the plain
 * schedule, the reserve) are zp_mem_residual's and are not in here. */
typedef struct {
    double bytes[ZP_TIER_N][ZP_MEM_N];
    double total_bytes[ZP_TIER_N]; /* per rank */
    double pinned_bytes;           /* of the CPU row: page-locked (pin_memory) */
    double swap_buffer_bytes;      /* of the CPU row: offload_param's partitioned_swap_buffer */
    int ranks_per_node;            /* min(gpus_per_node, dp x mp) */
    double cpu_node_bytes;         /* all the node's ranks together */
    double nvme_node_bytes;
} ZpTiers;

/* The tiers of a plan for a model of `params` parameters (model may be a params-only model;
 * the largest tensor then counts as 0). hw may be NULL (one rank per node). Without offload
 * the GPU row equals zp_mem_model_states term by term (params, grads, master + moments).
 *
 * offload_optimizer (stages 1-3; stage_1_and_2.py treats device nvme as cpu, only stage3.py
 * swaps to NVMe), with r = ratio (stage 3; 1 otherwise) and P the partition, Psi/mp/dp:
 *   moves r of the fp32 master and moments off the GPU (cpu, or nvme at stage 3);
 *   gradients: stage 2 keeps no 16-bit partition on the GPU, stage 3 r of it; the host holds
 *     r P fp32 gradients (stage_1_and_2.py single_partition_of_fp32_groups[i].grad;
 *     stage3.py initialize_optimizer_states subgroup_gradient_buffer), and at stage 3 with
 *     nvme also NVMe (swapped out by swap_out_gradients), where an implementation with
 *     host_grad_accum (DeepSpeed's) keeps on the host only one unpinned gradient_buffer of
 *     the largest sub-group, min(sub_group_size, P) fp32 elements, that every swapped
 *     sub-group's .grad views; such an implementation keeps
 *     none of it on the GPU at stage 3 and adds the 16-bit sum P x 2 on the host;
 *   stages 1-2 add a 16-bit host copy of the partition (param_buffer_of_bit16_for_cpu_offload
 *     _groups, what returns to the GPU) and a GPU buffer of the largest tensor
 *     (temp_grad_buffer_for_gpu_offload);
 *   stage 3 nvme adds buffer_count swap buffers of min(sub_group_size, P) fp32 elements
 *     on the host (PartitionedOptimizerSwapper's SwapBufferManager: the largest sub-group).
 * offload_param (stage 3): the 16-bit partition P moves to the host (cpu) or NVMe; with nvme
 *   the host keeps min(P, max_in_cpu) of it (_create_param_groups_fp16_flat_cpu_memory),
 *   buffer_count x buffer_size 16-bit swap buffers (AsyncPartitionedParameterSwapper), and
 *   when a sub-group is not kept the partitioned_swap_buffer
 *   (zp_offload_param_swap_buffer_elems).
 * Swap buffers are io-aligned to DeepSpeed's aio default, 1024 bytes (_io_aligned_numel).
 * Host buffers are pinned when pin_memory is set. */
void zp_offload_tiers(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw, ZpTiers *tiers);

/* Whether a plan offloads anything. */
gboolean zp_offload_any(const ZpPlan *plan);

/* The fit check over the three tiers: GPU need per GPU (the caller's total: states, residual
 * and reserve) against gpu_memory_bytes, CPU per node against cpu_memory_bytes, NVMe per node
 * against nvme_bytes (0 in a profile without NVMe). Returns the first tier that overflows and
 * by how many bytes in *short_bytes, or ZP_TIER_N when all fit. */
ZpTier zp_offload_overflow(const ZpTiers *tiers, double gpu_need_bytes, const ZpHw *hw,
                           double *short_bytes);

/* "GPU memory per GPU", "CPU memory per node", "NVMe per node". */
const char *zp_tier_what(ZpTier tier);

/* The fit check as an error naming the tier that overflows, its need and its capacity; for
 * the CPU tier also the share of offload_param's partitioned_swap_buffer, when there is one,
 * and the settings that shrink it (it alone can outgrow the host: about dp x sub_group_size). */
gboolean zp_offload_fit(const ZpTiers *tiers, double gpu_need_bytes, const ZpHw *hw,
                        GError **error);

/* DeepSpeed's own estimators, as written in v0.19.6 (bytes, before its int()):
 * stage_1_and_2.py estimate_zero2_model_states_mem_needs and stage3.py
 * estimate_zero3_model_states_mem_needs, additional_buffer_factor 1.5, zero_init true. */
void zp_offload_ds_estimate_zero2(double params, int gpus_per_node, int nodes,
                                  gboolean cpu_offload, double *cpu_bytes, double *gpu_bytes);
void zp_offload_ds_estimate_zero3(double params, double largest_layer_params,
                                  int gpus_per_node, int nodes, gboolean cpu_offload,
                                  gboolean cpu_offload_params, double *cpu_bytes,
                                  double *gpu_bytes);

/* ---- rules for the schedule builder (zp_sched.c) ---- */

/* Bytes per element CPU Adam moves: read the fp32 gradient, read and write the master copy
 * and the moments, write the 16-bit parameter (the same accounting as the GPU optimizer). */
double zp_offload_cpu_adam_bytes(const ZpPlan *plan);

/* Share of a partition of `part` elements the CPU steps, 0 without optimizer offload, 1 at
 * stages 1-2. Stage 3 splits the partition into sub-groups of sub_group_size elements
 * (stage3.py _create_fp16_sub_groups; one when it is at least the partition) and steps
 * sub-group i on the CPU when i >= int((1 - ratio) n) (_create_fp32_partitions:
 * subgroup_to_device): with one sub-group any ratio above 0 offloads all of it. */
double zp_offload_cpu_share(const ZpPlan *plan, double part);
/* The elements of the partition's first sub-groups, which the GPU steps: the partition
 * without optimizer offload, 0 at stages 1-2 with it (the share above, in elements). */
double zp_offload_gpu_elems(const ZpPlan *plan, double part);

/* Stage 3 with offload_param nvme: elements of a partition of `part` the host keeps, the
 * sub-groups from the first that fit together in min(part, max_in_cpu) elements
 * (stage3.py _create_fp16_partitions_with_defragmentation: the others are None, on NVMe);
 * all of it otherwise. With one sub-group: all when max_in_cpu >= part, else none, though
 * the flat buffer of max_in_cpu elements is allocated all the same
 * (_create_param_groups_fp16_flat_cpu_memory). */
double zp_offload_param_kept_elems(const ZpPlan *plan, double part);

/* Stage 3 with offload_param nvme and a sub-group not kept in host memory: the 16-bit
 * elements of the parameter swapper's partitioned_swap_buffer, which the step converts the
 * sub-groups on NVMe into before swapping them out (stage3.py
 * _create_fp16_partitions_with_defragmentation -> reserve_partitioned_swap_space). DeepSpeed
 * sizes it by the largest sub-group's parameters' full ds_numel, each io-aligned, though it
 * swaps out only their partitions: about dp x the sub-group. Sub-groups are formed as
 * _create_fp16_sub_groups forms them, from the model's tensors (for a params-only model,
 * dp x min(sub_group_size, P), unaligned). 0 otherwise. */
double zp_offload_param_swap_buffer_elems(const ZpModel *model, const ZpPlan *plan, double part);
/* The same in bytes (the plan's 16-bit element size). */
double zp_offload_param_swap_buffer_bytes(const ZpModel *model, const ZpPlan *plan, double part);

/* DeepSpeed's stage 2 with optimizer offload and accumulation (zp_impl host_grad_accum,
 * grad_accum > 1) sums each whole tensor that overlaps a rank's partition on the host in 16
 * bits (stage_1_and_2.py copy_grads_in_partition -> async_accumulate_grad_in_cpu_via_gpu:
 * accumulated_grads_in_cpu[param_id], param.numel() elements of param.dtype), so a rank moves
 * and holds more than its partition, by rank. Tensors are the model's in flat order
 * (zp_model_tensors, tensor-parallel shares), partitions of `part` elements.
 * zp_offload_stage2_accum_elems: the elements of the tensors that start in [lo, hi) and
 * overlap rank `rank`'s partition, or with rank -1 their sum over the dp ranks.
 * zp_offload_stage2_accum_max_elems: the most any rank holds over all tensors (the host
 * buffer, sized for that rank as grads_in_partition is on the GPU). A params-only model has
 * no tensors: the partition. */
double zp_offload_stage2_accum_elems(const ZpModel *model, const ZpPlan *plan, double part,
                                     double lo, double hi, int rank);
double zp_offload_stage2_accum_max_elems(const ZpModel *model, const ZpPlan *plan, double part);

/* Whether a plan's gradients are summed on the host by whole tensors (the above). */
gboolean zp_offload_stage2_accum(const ZpPlan *plan);

/* The bytes data-parallel rank `rank` moves per transfer kind in a step of the schedule s.
 * Its transfer ops carry what every rank moves, but for the gradient transfers of stages 1-2,
 * which carry the mean over the ranks: a rank moves its part of the bucket's unpadded range
 * (4 bytes an element, fp32), and with zp_offload_stage2_accum the whole tensors that
 * overlap its partition in 16 bits (the host link's up and first down transfers of the
 * bucket; the down transfer after a down transfer is the fp32 part). */
void zp_offload_rank_transfer_bytes(const ZpSchedule *s, int rank, double bytes[ZP_XFER_N]);

/* The tier optimizer states live in: ZP_TIER_CPU, ZP_TIER_NVME (stage 3 only), or ZP_TIER_GPU
 * without offload; likewise for the parameters. */
ZpTier zp_offload_optimizer_tier(const ZpPlan *plan);
ZpTier zp_offload_param_tier(const ZpPlan *plan);

/* Bytes of a gradient slice of `elems` elements (this rank's part of a bucket) that go down
 * the host link: fp32, since DeepSpeed copies the 16-bit gradient into the fp32 host buffer
 * and PyTorch converts a cross-device copy on the GPU before the transfer. Scaled by the
 * CPU share of a partition of `part` elements. */
double zp_offload_grad_d2h_bytes(const ZpPlan *plan, double elems, double part);

/* The optimizer step goes sub-group by sub-group (stage3.py step: _prepare_sub_group,
 * _optimizer_step, _reassign_or_swap_out_partitioned_parameters, _release_sub_group), over
 * zp_offload_sub_group_count sub-groups of a partition of `part` elements (stage 3; one at
 * stages 1-2): zplan's sub-groups are sub_group_size elements each, the last what is left.
 * Sub-group j's range of the partition, whether the CPU steps it, and its transfers per
 * rank: nvme_read (optimizer states and gradients swapped in), nvme_write (swapped out again,
 * and its 16-bit parameters when they live on NVMe and the host does not keep them, whoever
 * stepped it), h2d (the updated 16-bit sub-group back to the GPU when parameters stay there). */
typedef struct {
    double offset_elems, elems;
    gboolean on_cpu;
    double nvme_read_bytes, nvme_write_bytes, h2d_bytes;
} ZpOffloadStep;
int zp_offload_sub_group_count(const ZpPlan *plan, double part);
void zp_offload_sub_group_step(const ZpPlan *plan, double part, int j, ZpOffloadStep *step);

/* Stage 3 with offload_param: what fetching a slice of `elems` elements of the rank's
 * partition of partition_elems, from element `at` (-1: not known), to the GPU before its
 * all-gather moves: with nvme, the slice's part beyond the sub-groups the host keeps
 * (zp_offload_param_kept_elems; for `at` -1 that share of the slice) read from NVMe, then the
 * whole slice over the host link. Zeros when parameters stay on the GPU. */
void zp_offload_fetch(const ZpPlan *plan, double elems, double at, double partition_elems,
                      double *nvme_read_bytes, double *h2d_bytes);

/* Moves a built schedule's model states (ZpSchedule.state_bytes, laid out with the
 * schedule's padding) between the tiers as zp_offload_tiers does, into state_bytes (GPU),
 * host_bytes and nvme_bytes, and puts Pa+cpu's checkpoint slices in host_bytes. Nothing
 * changes without offload or cpu_checkpointing. */
void zp_offload_layout(ZpSchedule *sched);

/* The host tier's peak per rank: host_bytes, plus at stage 3 with optimizer offload and the
 * parameters on the GPU one sub-group's 16-bit copy, min(sub_group_size, P) elements, made on
 * the host for a moment: PyTorch's blocking fp32-to-16-bit copy_ converts on the CPU before
 * the transfer (stage3.py _reassign_or_swap_out_partitioned_parameters; Copy.cu
 * copy_kernel_cuda). With offload_param the step converts into host memory host_bytes
 * holds: the flat buffer, or the partitioned_swap_buffer for a sub-group not kept. */
double zp_offload_host_peak_bytes(const ZpSchedule *s);

/* Per-rank seconds of CPU Adam over `bytes` (zp_offload_cpu_adam_bytes x elements): the
 * rate per core x the cores one rank gets, cpu_cores_per_node / ranks_per_node (DeepSpeed's
 * launcher gives each local process its share of the cores as OMP_NUM_THREADS). Fails naming
 * the hwprofile keys when the profile has no CPU Adam rate. */
gboolean zp_offload_cpu_time_s(const ZpHw *hw, double bytes, int ranks_per_node,
                               double *seconds, GError **error);

/* Per-rank bandwidth of a transfer: the host link is each GPU's own (host_link_bytes_per_s);
 * NVMe is the node's, shared by its ranks_per_node ranks moving their slices at once
 * (ZeRO-Infinity's bandwidth-centric partitioning: each rank moves only its 1/N, so the
 * aggregate grows with the nodes). */
double zp_offload_link_bytes_per_s(const ZpHw *hw, ZpTransferKind kind, int ranks_per_node);

#endif
