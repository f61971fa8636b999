/* real_zeropp: ZeRO++ as zreal executes it on host memory (the CPU backend's) — qwZ's bf16 to
 * int8 with one fp32 scale per group and back, qgZ's int4 and its two all-to-alls. */
#ifndef REAL_ZEROPP_H
#define REAL_ZEROPP_H

#include "real_bf16.h"
#include "real_comm.h"

#include <glib.h>

#include <stddef.h>
#include <stdint.h>

/* Bytes of n elements quantised in `groups` groups: n int8 values, then groups fp32 scales
 * (zp_zeropp_gather_bytes's per-rank figure). */
size_t real_zeropp_quantized_bytes(uint64_t n, uint64_t groups);

/* Symmetric int8 (DeepSpeed's quantizer, Symmetric mode): group k of ceil(n / groups)
 * consecutive elements gets scale = max |x| / 127 and q = round(x / scale), clamped to
 * [-127, 127]; out holds real_zeropp_quantized_bytes(n, groups) bytes. */
void real_zeropp_quantize(const RealBf16 *src, uint64_t n, uint64_t groups, uint8_t *out);

/* dst[i] = bf16(q[i] x scale of its group), from what real_zeropp_quantize wrote. */
void real_zeropp_dequantize(const uint8_t *in, uint64_t n, uint64_t groups, RealBf16 *dst);

/* qgZ's int4: n fp32 elements in `groups` groups of ceil(n / groups), scale = max |x| / 7,
 * code round(x / scale) clamped to [-7, 7], two codes a byte (the even element in the low
 * nibble), then the groups' fp32 scales: real_zeropp_int4_bytes(n, groups) = ceil(n / 2) +
 * 4 groups bytes. The dequantiser adds the values to dst. */
size_t real_zeropp_int4_bytes(uint64_t n, uint64_t groups);
void real_zeropp_quantize_int4(const float *src, uint64_t n, uint64_t groups, uint8_t *out);
void real_zeropp_dequantize_int4_add(const uint8_t *in, uint64_t n, uint64_t groups, float *dst);

/* qgZ's reduction of one bucket (all_to_all_quant_reduce in DeepSpeed's
 * runtime/comm/coalesced_collectives.py): `pieces` holds the bucket as the world's partitions
 * of `part` fp32 elements, rank q's at q x part, where q = node x local + i for node rank i
 * (`node`: the node's ranks; `cross`: the ranks of this node index, one a node). Each
 * partition goes as int4 in `groups` groups: to node rank i the partitions of rank i of every
 * node (all-to-all in the node), summed over the node and quantised again, then to each node
 * its own partition (all-to-all across nodes), whose dequantised sum is `out` (part
 * elements): this rank's partition summed over the world. `work` holds 2 S1 + S2 bytes
 * (S1 = world x int4 bytes, S2 = S1 / local, zp_zeropp_qgz's), acc nodes x part floats. */
gboolean real_zeropp_qgz_reduce(RealComm *node, RealComm *cross, const float *pieces,
                                uint64_t part, uint64_t groups, uint8_t *work, float *acc,
                                float *out, GError **error);

/* DeepSpeed's qgZ of one tensor (all_to_all_quant_reduce in runtime/comm/coalesced_collectives.py)
 * in the buffers it allocates, all in `work`, real_zeropp_qgz_tensor_work_bytes long:
 * swizzle_quant's int4 of the world's partitions (S1 = world x int4 bytes of `part`
 * elements in `groups` groups), local_output (S1) from the all-to-all in the node,
 * quantized_reduction's sums over the node (S2 = S1 / local), global_output (S2) from the
 * all-to-all across nodes, dequantize's 16-bit final_output (nodes x part) and one running
 * sum of its chunks (part); the last sum, this rank's partition summed over the world, goes
 * to out (part elements). `grads` holds the tensor, rank q's partition at q x part, where
 * q = node x local + i for node rank i. */
size_t real_zeropp_qgz_tensor_work_bytes(int local, int nodes, uint64_t part, uint64_t groups);
gboolean real_zeropp_qgz_tensor(RealComm *node, RealComm *cross, const RealBf16 *grads,
                                uint64_t part, uint64_t groups, uint8_t *work, RealBf16 *out,
                                GError **error);

#endif
