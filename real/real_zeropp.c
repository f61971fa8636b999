/* real_zeropp: scales are stored after the int8 values, unaligned, so they are copied with
 * memcpy; groups are equal runs of ceil(n / groups) elements, the last one shorter. */
#include "real_zeropp.h"

#include <math.h>
#include <string.h>

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

size_t real_zeropp_quantized_bytes(uint64_t n, uint64_t groups)
{
    return (size_t)n + (size_t)groups * sizeof(float);
}

static uint64_t group_elems(uint64_t n, uint64_t groups)
{
    return groups ? (n + groups - 1) / groups : n;
}

void real_zeropp_quantize(const RealBf16 *src, uint64_t n, uint64_t groups, uint8_t *out)
{
    const uint64_t g = group_elems(n, groups);
    for (uint64_t k = 0; k < groups; k++) {
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        float most = 0;
        for (uint64_t i = lo; i < hi; i++)
            most = fmaxf(most, fabsf(real_bf16_to_f32(src[i])));
        const float scale = most > 0 ? most / 127.0f : 1.0f;
        for (uint64_t i = lo; i < hi; i++) {
            const float q = fminf(127.0f, fmaxf(-127.0f, rintf(real_bf16_to_f32(src[i]) / scale)));
            out[i] = (uint8_t)(int8_t)q;
        }
        memcpy(out + n + k * sizeof(float), &scale, sizeof scale);
    }
}

void real_zeropp_dequantize(const uint8_t *in, uint64_t n, uint64_t groups, RealBf16 *dst)
{
    const uint64_t g = group_elems(n, groups);
    for (uint64_t k = 0; k < groups; k++) {
        float scale;
        memcpy(&scale, in + n + k * sizeof(float), sizeof scale);
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        for (uint64_t i = lo; i < hi; i++)
            dst[i] = real_bf16_from_f32((float)(int8_t)in[i] * scale);
    }
}
