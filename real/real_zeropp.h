/* real_zeropp: ZeRO++'s qwZ block quantisation as zreal executes it — bf16 to int8 with one
 * fp32 scale per group, and back — on host memory (the CPU backend's). */
#ifndef REAL_ZEROPP_H
#define REAL_ZEROPP_H

#include "real_bf16.h"

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

#endif
