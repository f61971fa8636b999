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

static float at_bf16(const void *src, uint64_t i)
{
    return real_bf16_to_f32(((const RealBf16 *)src)[i]);
}

static float at_f32(const void *src, uint64_t i)
{
    return ((const float *)src)[i];
}

/* A group's symmetric scale, max |x| / levels over [lo, hi) (1 for an all-zero group), and
 * an element's code, round(x / scale) clamped to [-levels, levels]. */
static float group_scale(float (*at)(const void *, uint64_t), const void *src, uint64_t lo,
                         uint64_t hi, float levels)
{
    float most = 0;
    for (uint64_t i = lo; i < hi; i++)
        most = fmaxf(most, fabsf(at(src, i)));
    return most > 0 ? most / levels : 1.0f;
}

static int code(float x, float scale, float levels)
{
    return (int)fminf(levels, fmaxf(-levels, rintf(x / scale)));
}

void real_zeropp_quantize(const RealBf16 *src, uint64_t n, uint64_t groups, uint8_t *out)
{
    const uint64_t g = group_elems(n, groups);
    for (uint64_t k = 0; k < groups; k++) {
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        const float scale = group_scale(at_bf16, src, lo, hi, 127.0f);
        for (uint64_t i = lo; i < hi; i++)
            out[i] = (uint8_t)(int8_t)code(at_bf16(src, i), scale, 127.0f);
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

/* ---- qgZ's int4 ---- */

size_t real_zeropp_int4_bytes(uint64_t n, uint64_t groups)
{
    return (size_t)((n + 1) / 2) + (size_t)groups * sizeof(float);
}

static void quantize_int4(float (*at)(const void *, uint64_t), const void *src, uint64_t n,
                          uint64_t groups, uint8_t *out)
{
    const uint64_t g = group_elems(n, groups), packed = (n + 1) / 2;
    memset(out, 0, (size_t)packed);
    for (uint64_t k = 0; k < groups; k++) {
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        const float scale = group_scale(at, src, lo, hi, 7.0f);
        for (uint64_t i = lo; i < hi; i++)
            out[i / 2] |= (uint8_t)((code(at(src, i), scale, 7.0f) & 0xf) << (4 * (i % 2)));
        memcpy(out + packed + k * sizeof(float), &scale, sizeof scale);
    }
}

void real_zeropp_quantize_int4(const float *src, uint64_t n, uint64_t groups, uint8_t *out)
{
    quantize_int4(at_f32, src, n, groups, out);
}

/* Element i of int4 data `in` (n elements) whose group has scale `scale`. */
static float int4_value(const uint8_t *in, uint64_t i, float scale)
{
    const int nibble = (in[i / 2] >> (4 * (i % 2))) & 0xf;
    return (float)(nibble >= 8 ? nibble - 16 : nibble) * scale;
}

static float int4_scale(const uint8_t *in, uint64_t n, uint64_t k)
{
    float scale;
    memcpy(&scale, in + (n + 1) / 2 + k * sizeof(float), sizeof scale);
    return scale;
}

void real_zeropp_dequantize_int4_add(const uint8_t *in, uint64_t n, uint64_t groups, float *dst)
{
    const uint64_t g = group_elems(n, groups);
    for (uint64_t k = 0; k < groups; k++) {
        const float scale = int4_scale(in, n, k);
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        for (uint64_t i = lo; i < hi; i++)
            dst[i] += int4_value(in, i, scale);
    }
}

gboolean real_zeropp_qgz_reduce(RealComm *node, RealComm *cross, const float *pieces,
                                uint64_t part, uint64_t groups, uint8_t *work, float *acc,
                                float *out, GError **error)
{
    const int local = node->size, nodes = cross->size;
    const size_t qb = real_zeropp_int4_bytes(part, groups);
    uint8_t *send1 = work, *recv1 = work + (size_t)local * nodes * qb;
    uint8_t *send2 = recv1 + (size_t)local * nodes * qb, *recv2 = send1; /* send1 is done */
    /* For node rank j, the partitions of rank j of every node, in node order. */
    for (int j = 0; j < local; j++)
        for (int m = 0; m < nodes; m++)
            real_zeropp_quantize_int4(pieces + (uint64_t)(m * local + j) * part, part, groups,
                                      send1 + ((size_t)j * nodes + m) * qb);
    if (!node->alltoall_bytes(node, send1, recv1, (size_t)nodes * qb, error))
        return FALSE;
    /* quantized_reduction: each node partition summed over the node's ranks, to int4 again */
    for (int m = 0; m < nodes; m++) {
        float *sum = acc + (uint64_t)m * part;
        memset(sum, 0, part * sizeof(float));
        for (int i = 0; i < local; i++)
            real_zeropp_dequantize_int4_add(recv1 + ((size_t)i * nodes + m) * qb, part, groups,
                                            sum);
        real_zeropp_quantize_int4(sum, part, groups, send2 + (size_t)m * qb);
    }
    if (!cross->alltoall_bytes(cross, send2, recv2, qb, error))
        return FALSE;
    memset(out, 0, part * sizeof(float));
    for (int m = 0; m < nodes; m++)
        real_zeropp_dequantize_int4_add(recv2 + (size_t)m * qb, part, groups, out);
    return TRUE;
}

/* ---- DeepSpeed's qgZ of one tensor, in its own buffers ---- */

/* quantized_reduction (csrc/quantization/quant_reduce.cu): the sum of `count` int4 inputs of
 * n elements, each in `groups` groups, quantised to int4 again in the same groups. The kernel
 * keeps the fp32 sums in registers; here each group's are summed twice, once for its scale
 * and once for its codes, in the order real_zeropp_qgz_reduce's accumulator adds them. */
static void int4_reduce(const uint8_t *const *in, int count, uint64_t n, uint64_t groups,
                        uint8_t *out)
{
    const uint64_t g = group_elems(n, groups), packed = (n + 1) / 2;
    memset(out, 0, (size_t)packed);
    for (uint64_t k = 0; k < groups; k++) {
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        float most = 0;
        for (int pass = 0; pass < 2; pass++) {
            const float scale = most > 0 ? most / 7.0f : 1.0f;
            for (uint64_t i = lo; i < hi; i++) {
                float sum = 0;
                for (int j = 0; j < count; j++)
                    sum += int4_value(in[j], i, int4_scale(in[j], n, k));
                if (pass == 0)
                    most = fmaxf(most, fabsf(sum));
                else
                    out[i / 2] |= (uint8_t)((code(sum, scale, 7.0f) & 0xf) << (4 * (i % 2)));
            }
            if (pass == 1)
                memcpy(out + packed + k * sizeof(float), &scale, sizeof scale);
        }
    }
}

/* dequantize's 16-bit output of int4 data. */
static void dequantize_int4(const uint8_t *in, uint64_t n, uint64_t groups, RealBf16 *dst)
{
    const uint64_t g = group_elems(n, groups);
    for (uint64_t k = 0; k < groups; k++) {
        const float scale = int4_scale(in, n, k);
        const uint64_t lo = min_u64(k * g, n), hi = min_u64(lo + g, n);
        for (uint64_t i = lo; i < hi; i++)
            dst[i] = real_bf16_from_f32(int4_value(in, i, scale));
    }
}

size_t real_zeropp_qgz_tensor_work_bytes(int local, int nodes, uint64_t part, uint64_t groups)
{
    const size_t s2 = (size_t)nodes * real_zeropp_int4_bytes(part, groups);
    return 2 * (size_t)local * s2 + 2 * s2 + ((size_t)nodes + 1) * part * sizeof(RealBf16);
}

gboolean real_zeropp_qgz_tensor(RealComm *node, RealComm *cross, const RealBf16 *grads,
                                uint64_t part, uint64_t groups, uint8_t *work, RealBf16 *out,
                                GError **error)
{
    const int local = node->size, nodes = cross->size;
    const size_t qb = real_zeropp_int4_bytes(part, groups), s2 = (size_t)nodes * qb;
    const size_t s1 = (size_t)local * s2;
    uint8_t *swizzled = work, *local_output = swizzled + s1, *reduced = local_output + s1;
    uint8_t *global_output = reduced + s2;
    RealBf16 *final_output = (RealBf16 *)(global_output + s2), *total = final_output + nodes * part;
    /* swizzle_quant: for node rank j, the partitions of rank j of every node, in node order */
    for (int j = 0; j < local; j++)
        for (int m = 0; m < nodes; m++)
            quantize_int4(at_bf16, grads + (uint64_t)(m * local + j) * part, part, groups,
                          swizzled + ((size_t)j * nodes + m) * qb);
    if (!node->alltoall_bytes(node, swizzled, local_output, s2, error))
        return FALSE;
    const uint8_t **in = g_new(const uint8_t *, local);
    for (int m = 0; m < nodes; m++) {
        for (int i = 0; i < local; i++)
            in[i] = local_output + ((size_t)i * nodes + m) * qb;
        int4_reduce(in, local, part, groups, reduced + (size_t)m * qb);
    }
    g_free(in);
    if (!cross->alltoall_bytes(cross, reduced, global_output, qb, error))
        return FALSE;
    for (int m = 0; m < nodes; m++)
        dequantize_int4(global_output + (size_t)m * qb, part, groups, final_output + m * part);
    /* sum(final_output.chunk(num_nodes)): 0 + chunk 0, then each next chunk added into a new
     * tensor while the one before is still held; the last sum lands in out */
    RealBf16 *sum = (nodes - 1) % 2 ? total : out;
    memcpy(sum, final_output, part * sizeof(RealBf16));
    for (int m = 1; m < nodes; m++) {
        RealBf16 *next = sum == out ? total : out;
        for (uint64_t k = 0; k < part; k++)
            next[k] = real_bf16_from_f32(real_bf16_to_f32(sum[k]) +
                                         real_bf16_to_f32(final_output[m * part + k]));
        sum = next;
    }
    return TRUE;
}
