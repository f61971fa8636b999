/* real_bf16: bfloat16 storage type and its exact conversions to and from fp32.
 * zreal keeps parameters, gradients and saved activations in bf16 as mixed precision does. */
#ifndef REAL_BF16_H
#define REAL_BF16_H

#include <stdint.h>
#include <string.h>

/* A bfloat16 value: the upper 16 bits of an IEEE fp32 (1 sign, 8 exponent, 7 mantissa). */
typedef uint16_t RealBf16;

/* Widens a bf16 to fp32; exact (every bf16 is an fp32). */
static inline float real_bf16_to_f32(RealBf16 value)
{
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* Narrows fp32 to the nearest bf16, ties to even (what GPU converters do), so results do
 * not drift the way truncation would. NaNs stay NaNs (quiet); overflow rounds to inf. */
static inline RealBf16 real_bf16_from_f32(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (RealBf16)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (RealBf16)(bits >> 16);
}

/* fp32 -> bf16 -> fp32: the value a bf16 store of `value` would read back. */
static inline float real_bf16_round_f32(float value)
{
    return real_bf16_to_f32(real_bf16_from_f32(value));
}

#endif
