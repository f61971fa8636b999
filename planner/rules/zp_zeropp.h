/* zp_zeropp: ZeRO++ (Wang et al., arXiv 2306.10209) as DeepSpeed implements it — qwZ's int8
 * parameter all-gather, hpZ's secondary partition inside a node, qgZ's int4 all-to-all
 * gradient reduction — as group sizes, bytes and kernel costs the schedule builder uses. */
#ifndef ZP_ZEROPP_H
#define ZP_ZEROPP_H

#include "zp_plan.h"
#include "zp_sched_graph.h"

#include <glib.h>
#include <stdint.h>

/* Members of a group: dp, mp, hpZ's zero_hpz_partition_size, a node's data-parallel ranks
 * (gpus_per_node / mp, at most dp; all dp when the node size is unknown) and the ranks of
 * one local index across the nodes (dp / that). */
int zp_zeropp_group_ranks(const ZpPlan *plan, ZpGroup group);

/* Fails naming the key when the plan's ZeRO++ options cannot run: any of them with --impl
 * fsdp (PyTorch FSDP has no ZeRO++) or below stage 3; an hpZ size that does not divide a
 * node's data-parallel ranks, or dp; qgZ where a node's data-parallel ranks do not divide dp
 * (the two need whole nodes: one line says so). */
gboolean zp_zeropp_check(const ZpPlan *plan, GError **error);

/* qwZ: the quantisation groups DeepSpeed's CUDAQuantizer.quantize picks for n elements
 * (runtime/zero/partition_parameters.py: about n / 8000, adjusted until 8 x groups divides
 * n, doubled while groups stay above 8000 elements); 0 for n = 0. */
uint64_t zp_zeropp_qwz_groups(uint64_t n);

/* A stage-3 all-gather of `elems` elements (a multiple of `ranks`) over `ranks` ranks, as
 * the schedule's S: 16-bit elements, or with qwZ one int8 byte each plus a 4-byte fp32
 * scale per quantisation group of each rank's partition (_all_gather_coalesced gathers both). */
double zp_zeropp_gather_bytes(const ZpPlan *plan, uint64_t elems, int ranks, double param_bytes);

/* qwZ's memory-bound kernels: quantize reads a partition's 16-bit elements and writes int8
 * and scales; dequantize reads the gathered int8 and scales and writes 16-bit elements. */
double zp_zeropp_quantize_mem_bytes(uint64_t partition_elems);
double zp_zeropp_dequantize_mem_bytes(uint64_t elems, int ranks);

/* hpZ: the bytes of this rank's secondary partitions, the padded units less the
 * `persistent_elems` the implementation keeps whole (ZpImpl.persistent), split over
 * zero_hpz_partition_size ranks in 16 bits (_partition_param_sec keeps param.dtype):
 * 2 psi / size for fp16. 0 without hpZ. */
double zp_zeropp_secondary_bytes(const ZpSchedule *sched, double persistent_elems);

/* qgZ on a bucket of `elems` gradient elements (all_to_all_quant_reduce in
 * runtime/comm/coalesced_collectives.py): swizzle_quant to int4 with an fp32 scale per
 * group, an all-to-all inside the node, quantized_reduction over the node's ranks to int4
 * again, an all-to-all across nodes, dequantize and sum the nodes' chunks. DeepSpeed groups a
 * tensor by max(rows, cols, world); for a unit whose matrices have the hidden size h on one
 * side that is elems / h groups (at least the world), here rounded up to a multiple of the
 * world so that each of the world's partitions (elems / world elements) is g whole groups:
 * S1 = world (ceil(elems / world / 2) + 4 g) bytes, S2 = S1 / local. */
typedef struct {
    double groups;           /* intra-node quantisation groups */
    double intra_bytes;      /* S of the intra-node all-to-all: int4 data and scales */
    double inter_bytes;      /* S of the inter-node all-to-all: 1/local of that */
    double quantize_mem_bytes, reduce_mem_bytes, dequantize_mem_bytes; /* the kernels */
    /* the workspace the reduction holds (the paper's: the two int4 buffers of the node's
     * all-to-all and the one sent across nodes), and the output that outlives it, held until
     * the bucket's reduction is done (0: none; DeepSpeed's output_lst, zp_zeropp_qgz_tensor) */
    double work_bytes, output_bytes;
} ZpQgz;

ZpQgz zp_zeropp_qgz(const ZpPlan *plan, double elems, double hidden, double grad_bytes);

/* DeepSpeed's qgZ (zp_impl.h qgz_by_tensor), the world taken as the data-parallel ranks:
 * - whether it runs at all: more than one node (stage3.py __avg_scatter_grads: num_nodes =
 *   world // device_count() > 1);
 * - whether a tensor of `elems` elements is quantised: 2-D with elems % (2 world) == 0
 *   (all_to_all_quant_reduce; the others go through reduce_scatter_coalesced([tensor]));
 * - one quantised tensor's figures: g = max(rows, cols, world) groups, `hidden` being one
 *   side of every matrix (max(elems / hidden, hidden, world)); swizzle_quant's int4 and g
 *   fp32 scales, S1 = elems / 2 + 4 g; quantized_reduction's 1/local of the int4 and
 *   g / local (integer division) scales, S2 = elems / (2 local) + 4 floor(g / local). */
gboolean zp_zeropp_qgz_across_nodes(const ZpPlan *plan);
gboolean zp_zeropp_qgz_quantizes(const ZpPlan *plan, uint64_t elems, gboolean matrix);
/* - the buffers all_to_all_quant_reduce holds for it: swizzle_quant's int4 and scales and
 *   local_output and scale_output (S1 each), quantized_reduction's and global_output and
 *   global_scale_output (S2 each), dequantize's final_output (elems / local in fp16:
 *   csrc/quantization/pt_binding.cpp dequantize), and sum(final_output.chunk(num_nodes))'s
 *   running total (a slice, elems / world in fp16) beside the next one; the average
 *   (output_lst[idx], a slice) stays until __avg_scatter_grads returns the bucket's list to
 *   partition_grads. Each name holds its buffer until the next quantised tensor rebinds it
 *   (or the function returns): here the buffers are freed after the tensor's own reduction,
 *   before the next tensor's are taken. */
ZpQgz zp_zeropp_qgz_tensor(const ZpPlan *plan, double elems, double hidden, double grad_bytes);

#endif
