/* test_cuda_backend: every entry of the CUDA backend against the CPU backend, in both GEMM modes,
 * on awkward sizes (the Llama family's too: RMSNorm, rotary, gated MLPs, grouped-query and fused
 * attention); determinism; the tracker against the driver; a whole model micro-step of each
 * block zreal trains. */
#include "real_cpu.h"
#include "real_cuda.h"
#include "real_gpt.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Tolerances, and why. Where the CUDA kernel performs the CPU's operations in the CPU's order
 * (conversions, bias, add, embedding, Adam: --fmad=false keeps a * b + c rounded twice, as the
 * CPU's C does), the results must be bit-identical. Elsewhere they differ by
 *  - the order of a sum: both orders are within (n-1) eps sum|x| of the exact sum (the
 *    worst case; about sqrt(n) eps sum|x| in practice), eps = FLT_EPSILON = 2^-23;
 *  - libm: CUDA's expf and tanhf are within 2 ulps, glibc's within 1: 3 ulps apart, 4e-7;
 *  - in bf16 GEMM mode, fp32 operands rounded to bf16 (relative 2^-9 each, so 2^-8 for a
 *    product), which the CPU does not do. */
#define EPS ((double)FLT_EPSILON)
/* A reduction over a column of n values: the worst case is (n-1) eps sum|x|, but rounding
 * errors of random data add up like a random walk, to about sqrt(n) eps sum|x| even when the
 * partial sums grow steadily; 4 sqrt(n) eps sum|x| leaves 4x margin. A dropped or doubled row
 * changes the sum by about sum|x| / n, more than that for every n < 16,000 (n^1.5 < 1 /
 * (4 eps)); the sums tested have n <= 4,100. */
#define COLUMN_TOL(n) (4.0 * sqrt((double)(n)) * EPS)
/* GEMM, element (i,j): |cuda - cpu| <= tol |alpha| sum_k |a_ik b_kj| + 4 eps |beta c_ij|, with
 * tol = 2 k eps for the worst-case fp32 summation of both sides (tensor cores truncate where
 * IEEE rounds: at most 1 ulp per add instead of 1/2) plus 2^-7 in bf16 mode (operand
 * rounding, 2^-8, with a factor 2 of margin). */
#define GEMM_ROUNDING_TOL (1.0 / 128)
/* Elementwise libm-based results (GELU): 3 ulps of libm difference plus the same again from
 * the few roundings around it: 16 eps relative, and absolute 16 eps near zero. */
#define LIBM_TOL (16.0 * EPS)
/* Attention, relative to the largest magnitude of the output part compared: exact mode with
 * fp32 probabilities differs by summation order in GEMMs of k = head_dim or s and in the
 * softmax sums, about (head_dim + s) eps = 2e-5 here: 1e-4. With bf16 probabilities a value
 * within that distance of a rounding boundary may round the other way (one bf16 ulp, 2^-8
 * relative, of a probability that then multiplies v): 2^-7 of max|v|. bf16 GEMM mode rounds
 * probabilities and dout, dS to bf16 for the products (2^-9 each, summed with weights that
 * add up to about 1): forward 2^-6, backward 2^-5 of the largest magnitude. A wrong head,
 * offset or transpose is off by the order of the largest magnitude itself. */
#define ATTN_EXACT_TOL 1e-4
#define ATTN_BF16_PROBS_TOL (1.0 / 128)
#define ATTN_BF16_FWD_TOL (1.0 / 64)
#define ATTN_BF16_BWD_TOL (1.0 / 32)
/* Cross-entropy: the loss differs by libm (expf) and double summation order: 1e-6
 * relative; each gradient element is exp(l - max) / sum * grad_scale, 3 ulps of expf plus
 * the sum's relative difference: 4e-6 of grad_scale, absolute. */
#define XENT_LOSS_TOL 1e-6
#define XENT_GRAD_TOL 4e-6
/* Layer norm forward: statistics in double as on the CPU, so y differs only when a double
 * sum in another order rounds to another float: 1e-6 relative to max(1, |y|). */
#define LN_FWD_TOL 1e-6
/* Layer-norm dx: fp32 row sums over cols (tree vs sequential), each feeding every element of
 * the row: 4 sqrt(cols) eps relative to the row's largest |dx| term, cols <= 1601 here. */
#define LN_DX_TOL(cols) (4.0 * sqrt((double)(cols)) * EPS)
/* Whole model micro-step (2 layers), relative to the norm of each parameter unit's
 * gradient: both backends store activations and gradients in bf16, so an ulp-level
 * difference in fp32 (summation order, libm) occasionally rounds a stored value the other
 * way (2^-9 relative); the CPU model test measures 1% against a double reference for all of
 * bf16 rounding, so a few such flips stay well under 1% (exact mode). bf16 GEMM mode also
 * rounds the gradient operands of every backward GEMM (2^-9 relative each, on two layers,
 * accumulating like the storage rounding itself): 3%. The loss: forward GEMM inputs are bf16
 * values in both modes, so only flips count: 5e-4 relative. */
#define MODEL_GRAD_TOL_EXACT 1e-2
#define MODEL_GRAD_TOL_BF16 3e-2
#define MODEL_LOSS_TOL 5e-4

#define MIB (1024.0 * 1024.0)

static RealBackend *cpu;
static RealBackend *gpu[2]; /* indexed by RealCudaGemmMode */
static const char *const mode_name[2] = {"bf16", "fp32"};
static GRand *rng;

/* ---- host data ---- */

static double normal(void)
{
    const double u1 = 1.0 - g_rand_double(rng), u2 = g_rand_double(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * G_PI * u2);
}

static float *random_f32(size_t n, double mean, double std)
{
    float *x = g_new(float, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mean + std * normal());
    return x;
}

/* fp32 values that are exactly bf16 (as the model's activations are when GEMMs read them). */
static float *random_bf16_values(size_t n, double std)
{
    float *x = random_f32(n, 0.0, std);
    for (size_t i = 0; i < n; i++)
        x[i] = real_bf16_round_f32(x[i]);
    return x;
}

static RealBf16 *random_bf16(size_t n, double mean, double std)
{
    RealBf16 *x = g_new(RealBf16, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        x[i] = real_bf16_from_f32((float)(mean + std * normal()));
    return x;
}

static void *copy_of(const void *src, size_t bytes)
{
    return g_memdup2(src, bytes ? bytes : 1);
}

/* ---- device data ---- */

static void device_ok(RealBackend *be)
{
    const char *text = NULL;
    be->synchronize(be, &text);
    g_assert_cmpstr(text, ==, NULL);
}

static void *upload(RealBackend *be, const void *host, size_t bytes)
{
    void *dev = be->alloc(be, bytes, REAL_MEM_WORKSPACE);
    g_assert_nonnull(dev);
    be->copy(be, dev, host, bytes);
    return dev;
}

static void *download(RealBackend *be, const void *dev, size_t bytes)
{
    void *host = g_malloc(bytes ? bytes : 1);
    be->copy(be, host, dev, bytes);
    device_ok(be);
    return host;
}

/* ---- comparisons ---- */

static void assert_same_bits(const void *got, const void *want, size_t bytes, const char *what)
{
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != w[i]) {
            g_test_message("%s: first difference at byte %zu of %zu", what, i, bytes);
            g_assert_cmpmem(got, bytes, want, bytes);
        }
}

/* |got - want| <= bound[i] for every i (NaN fails). */
static void assert_within(const float *got, const float *want, const double *bound, size_t n,
                          const char *what)
{
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double ratio = fabs((double)got[i] - want[i]) / bound[i];
        if (!(ratio <= worst)) {
            worst = isnan(ratio) ? INFINITY : ratio;
            at = i;
        }
    }
    g_test_message("%s: worst difference %.3g of its tolerance (element %zu: %.9g vs %.9g)",
                   what, worst, at, n ? got[at] : 0.0f, n ? want[at] : 0.0f);
    g_assert_cmpfloat(worst, <=, 1.0);
}

/* |got - want| <= abs_tol + rel_tol |want|. */
static void assert_close(const float *got, const float *want, size_t n, double abs_tol,
                         double rel_tol, const char *what)
{
    double *bound = g_new(double, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        bound[i] = abs_tol + rel_tol * fabs(want[i]);
    assert_within(got, want, bound, n, what);
    g_free(bound);
}

/* |got - want| <= tol max|want|, over every `stride`-th run of `width` values (all zeros
 * when want is: the gradient of q and k when every row attends to itself only). */
static void assert_close_to_max(const float *got, const float *want, size_t rows, size_t width,
                                size_t stride, double tol, const char *what)
{
    double max = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < width; c++)
            max = fmax(max, fabs(want[r * stride + c]));
    const double allowed = max > 0.0 ? tol * max : FLT_MIN;
    double worst = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < width; c++) {
            const double d = fabs((double)got[r * stride + c] - want[r * stride + c]) / allowed;
            worst = isnan(d) ? INFINITY : fmax(worst, d);
        }
    g_test_message("%s: worst difference %.3g of its tolerance (%.3g x max %.3g)", what, worst,
                   tol, max);
    g_assert_cmpfloat(worst, <=, 1.0);
}

/* ---- memory ---- */

/* Run first, while the pool holds only the backend's own workspace: a large buffer must show
 * in the tracker exactly, and in the pool's reservation and the driver's used memory as a
 * growth of that size (give or take the pool's granularity); freed, it stays reserved (the
 * release threshold keeps it) and is reused without growing again. */
static void test_device_memory(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_FP32];
    const size_t bytes = (size_t)1 << 30;
    const double slack = 64 * MIB; /* pool granularity and driver bookkeeping */
    RealDeviceMemory m0, m1, m2, m3;
    RealAllocStats s0, s1;
    device_ok(be);
    g_assert_true(be->device_memory(be, &m0));
    real_alloc_stats(be->tracker, &s0);
    g_assert_cmpuint(m0.total_bytes, >, 0);
    g_assert_cmpuint(m0.context_bytes, >, 0);
    g_assert_cmpuint(m0.context_bytes, <, m0.total_bytes);
    g_assert_cmpuint(s0.live_total_bytes, <=, m0.pool_reserved_bytes);
    void *p = be->alloc(be, bytes, REAL_MEM_ACTIVATIONS);
    g_assert_nonnull(p);
    be->fill(be, p, 0, bytes);
    device_ok(be);
    g_assert_true(be->device_memory(be, &m1));
    real_alloc_stats(be->tracker, &s1);
    g_assert_cmpuint(s1.live_total_bytes - s0.live_total_bytes, ==, bytes);
    g_assert_cmpuint(s1.live_bytes[REAL_MEM_ACTIVATIONS] - s0.live_bytes[REAL_MEM_ACTIVATIONS],
                     ==, bytes);
    const double pool_growth = (double)m1.pool_reserved_bytes - (double)m0.pool_reserved_bytes;
    const double used_growth = (double)m1.used_bytes - (double)m0.used_bytes;
    g_test_message("1 GiB: pool +%.1f MiB, driver used +%.1f MiB, context %.1f MiB, total "
                   "%.1f MiB", pool_growth / MIB, used_growth / MIB, m0.context_bytes / MIB,
                   m0.total_bytes / MIB);
    /* The pool may already hold up to what it reserved before (the workspace's chunk). */
    g_assert_cmpfloat(pool_growth, >=, (double)bytes - (double)m0.pool_reserved_bytes);
    g_assert_cmpfloat(pool_growth, <=, (double)bytes + slack);
    g_assert_cmpfloat(fabs(used_growth - pool_growth), <=, slack);
    g_assert_cmpuint(m1.pool_peak_reserved_bytes, >=, m1.pool_reserved_bytes);
    be->free(be, p);
    device_ok(be);
    g_assert_true(be->device_memory(be, &m2));
    g_assert_cmpuint(m2.pool_reserved_bytes, ==, m1.pool_reserved_bytes);
    p = be->alloc(be, bytes, REAL_MEM_ACTIVATIONS);
    g_assert_nonnull(p);
    device_ok(be);
    g_assert_true(be->device_memory(be, &m3));
    g_assert_cmpuint(m3.pool_reserved_bytes, ==, m1.pool_reserved_bytes);
    be->free(be, p);
    device_ok(be);
}

/* 64-byte alignment for every size, distinct zero-byte buffers, exact counts, overlapping
 * copies in both directions, host <-> device copies and fill. */
static void test_alloc_copy_fill(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    static const size_t sizes[] = {0, 0, 1, 63, 64, 65, 1000, 4097, (size_t)1 << 20};
    void *ptrs[G_N_ELEMENTS(sizes)];
    RealAllocStats before, during, after;
    real_alloc_stats(be->tracker, &before);
    size_t total = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
        ptrs[i] = be->alloc(be, sizes[i], REAL_MEM_BUCKETS);
        g_assert_nonnull(ptrs[i]);
        g_assert_cmpuint((uintptr_t)ptrs[i] % 64, ==, 0);
        for (size_t j = 0; j < i; j++)
            g_assert_true(ptrs[i] != ptrs[j]);
        total += sizes[i];
    }
    real_alloc_stats(be->tracker, &during);
    g_assert_cmpuint(during.live_bytes[REAL_MEM_BUCKETS] - before.live_bytes[REAL_MEM_BUCKETS],
                     ==, total);
    g_assert_cmpuint(during.live_allocs - before.live_allocs, ==, G_N_ELEMENTS(sizes));
    for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++)
        be->free(be, ptrs[i]);
    be->free(be, NULL);
    real_alloc_stats(be->tracker, &after);
    g_assert_cmpuint(after.live_total_bytes, ==, before.live_total_bytes);

    enum { N = 100003 };
    unsigned char *host = g_new(unsigned char, N);
    for (size_t i = 0; i < N; i++)
        host[i] = (unsigned char)g_rand_int(rng);
    static const struct {
        size_t dst, src, bytes;
    } moves[] = {{5, 0, 90000}, {0, 7, 90000}, {1, 1, 10}, {64, 0, 64}, {100, 30000, 30000}};
    for (size_t i = 0; i < G_N_ELEMENTS(moves); i++) {
        unsigned char *dev = upload(be, host, N);
        unsigned char *want = copy_of(host, N);
        memmove(want + moves[i].dst, want + moves[i].src, moves[i].bytes);
        be->copy(be, dev + moves[i].dst, dev + moves[i].src, moves[i].bytes);
        unsigned char *got = download(be, dev, N);
        assert_same_bits(got, want, N, "overlapping copy");
        be->fill(be, dev + 3, 0xa5, 1000);
        memset(want + 3, 0xa5, 1000);
        g_free(got);
        got = download(be, dev, N);
        assert_same_bits(got, want, N, "fill");
        be->free(be, dev);
        g_free(got), g_free(want);
    }
    g_free(host);
    device_ok(be);
}

/* The host tier's pinned memory and copy stream (ZeRO-Offload): a pinned buffer copied
 * up on the copy stream is what the next call on the compute stream overwrites in part; copied
 * down again it is there once copy_wait(host) returns. */
static void test_pinned_copy_stream(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    enum { N = 1 << 20 };
    float *host = g_new(float, N), *back = g_new0(float, N);
    for (size_t i = 0; i < N; i++)
        host[i] = (float)g_rand_double_range(rng, -1, 1);
    g_assert_true(be->pin_host(be, host, N * sizeof(float)));
    g_assert_true(be->pin_host(be, back, N * sizeof(float)));
    float *dev = be->alloc(be, N * sizeof(float), REAL_MEM_BUCKETS);
    be->fill(be, dev, 0, N * sizeof(float)); /* queued on the compute stream first */
    be->copy_async(be, dev, host, N * sizeof(float));
    be->copy_wait(be, true); /* the host may write its side now */
    be->fill(be, dev, 0, 4); /* a compute-stream call after the wait: the copy came first */
    memset(host, 0, 4);
    be->copy_async(be, back, dev, N * sizeof(float));
    be->copy_wait(be, true);
    assert_same_bits(back, host, N * sizeof(float), "copy stream round trip");
    be->free(be, dev);
    be->unpin_host(be, host);
    be->unpin_host(be, back);
    g_free(host), g_free(back);
    device_ok(be);
}

/* ---- precision ---- */

static void test_precision(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    enum { N = 100003 };
    float *x = random_f32(N, 0.0, 3.0), *acc = random_f32(N, 0.0, 1e-2);
    /* Ties (1 + 2^-8 rounds to even), signed zero, infinities, denormals, huge values. */
    const float special[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f, INFINITY, -INFINITY,
                             1e-40f, -3e-39f, 3.4e38f, -2.5f};
    memcpy(x, special, sizeof special);
    RealBf16 *h16 = g_new(RealBf16, N);
    for (size_t i = 0; i < N; i++)
        h16[i] = real_bf16_from_f32(x[i]);
    const RealBf16 nan16[] = {0x7fc1, 0xffa0, 0x7f81}; /* conversions keep NaNs NaN */
    memcpy(h16 + 20, nan16, sizeof nan16);
    float *xn = copy_of(x, N * sizeof(float));
    const float nans[] = {NAN, -NAN};
    memcpy(xn + 40, nans, sizeof nans);

    float *d32 = upload(be, xn, N * sizeof(float));
    RealBf16 *d16 = upload(be, h16, N * sizeof(RealBf16));
    float *out32 = be->alloc(be, N * sizeof(float), REAL_MEM_WORKSPACE);
    RealBf16 *out16 = be->alloc(be, N * sizeof(RealBf16), REAL_MEM_WORKSPACE);
    float *want32 = g_new(float, N);
    RealBf16 *want16 = g_new(RealBf16, N);

    be->bf16_to_f32(be, out32, d16, N);
    cpu->bf16_to_f32(cpu, want32, h16, N);
    float *got32 = download(be, out32, N * sizeof(float));
    assert_same_bits(got32, want32, N * sizeof(float), "bf16_to_f32");
    g_free(got32);

    be->f32_to_bf16(be, out16, d32, N);
    cpu->f32_to_bf16(cpu, want16, xn, N);
    RealBf16 *got16 = download(be, out16, N * sizeof(RealBf16));
    assert_same_bits(got16, want16, N * sizeof(RealBf16), "f32_to_bf16");
    g_free(got16);
    /* One element in: pointers off the 4-vector alignment take the one-element path. */
    be->fill(be, out16, 0, N * sizeof(RealBf16));
    be->f32_to_bf16(be, out16 + 1, d32 + 1, N - 1);
    got16 = download(be, out16, N * sizeof(RealBf16));
    assert_same_bits(got16 + 1, want16 + 1, (N - 1) * sizeof(RealBf16), "f32_to_bf16, unaligned");
    g_free(got16);

    be->copy(be, out32, d32, N * sizeof(float));
    be->round_bf16(be, out32, N);
    memcpy(want32, xn, N * sizeof(float));
    cpu->round_bf16(cpu, want32, N);
    got32 = download(be, out32, N * sizeof(float));
    assert_same_bits(got32, want32, N * sizeof(float), "round_bf16");
    g_free(got32);

    /* Arithmetic on NaNs may give other NaN bits on a GPU: finite inputs only from here. */
    be->free(be, d32), be->free(be, d16);
    for (size_t i = 0; i < N; i++)
        h16[i] = real_bf16_from_f32(x[i]);
    d16 = upload(be, h16, N * sizeof(RealBf16));
    float *dacc = upload(be, acc, N * sizeof(float));
    be->accumulate_bf16(be, d16, dacc, N);
    memcpy(want16, h16, N * sizeof(RealBf16));
    cpu->accumulate_bf16(cpu, want16, acc, N);
    got16 = download(be, d16, N * sizeof(RealBf16));
    assert_same_bits(got16, want16, N * sizeof(RealBf16), "accumulate_bf16");
    g_free(got16);

    RealBf16 *dsum = upload(be, h16, N * sizeof(RealBf16));
    be->add_bf16(be, d16, dsum, N);
    cpu->add_bf16(cpu, want16, h16, N);
    got16 = download(be, d16, N * sizeof(RealBf16));
    assert_same_bits(got16, want16, N * sizeof(RealBf16), "add_bf16");
    g_free(got16);
    be->free(be, dsum);

    be->scale_bf16(be, d16, N, 0.37f);
    cpu->scale_bf16(cpu, want16, N, 0.37f);
    got16 = download(be, d16, N * sizeof(RealBf16));
    assert_same_bits(got16, want16, N * sizeof(RealBf16), "scale_bf16");
    g_free(got16);

    be->free(be, d16), be->free(be, dacc), be->free(be, out32), be->free(be, out16);
    g_free(x), g_free(xn), g_free(acc), g_free(h16), g_free(want32), g_free(want16);
    device_ok(be);
}

/* ---- GEMM ---- */

typedef struct {
    int m, n, k;
} Shape;

/* One GEMM on the CPU and on `be` from the same operands; checked against the bound above,
 * and repeated on `be` for identical bits. */
static void check_gemm(RealBackend *be, RealCudaGemmMode mode, Shape sh, bool ta, bool tb,
                       RealDType at, RealDType bt, float alpha, float beta)
{
    const int m = sh.m, n = sh.n, k = sh.k;
    const size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *a32 = random_bf16_values(na, 1.0), *b32 = random_f32(nb, 0.0, 1.0);
    float *c0 = random_f32(nc, 0.0, 1.0);
    RealBf16 *a16 = g_new(RealBf16, na ? na : 1), *b16 = g_new(RealBf16, nb ? nb : 1);
    for (size_t i = 0; i < na; i++)
        a16[i] = real_bf16_from_f32(a32[i]);
    for (size_t i = 0; i < nb; i++)
        b16[i] = real_bf16_from_f32(b32[i]);
    /* What each side reads: a bf16 operand is the rounded value. */
    float *a_read = g_new(float, na ? na : 1), *b_read = g_new(float, nb ? nb : 1);
    for (size_t i = 0; i < na; i++)
        a_read[i] = at == REAL_DTYPE_BF16 ? real_bf16_to_f32(a16[i]) : a32[i];
    for (size_t i = 0; i < nb; i++)
        b_read[i] = bt == REAL_DTYPE_BF16 ? real_bf16_to_f32(b16[i]) : b32[i];
    const void *ha = at == REAL_DTYPE_BF16 ? (const void *)a16 : a32;
    const void *hb = bt == REAL_DTYPE_BF16 ? (const void *)b16 : b32;
    const size_t abytes = na * (at == REAL_DTYPE_BF16 ? 2 : 4);
    const size_t bbytes = nb * (bt == REAL_DTYPE_BF16 ? 2 : 4);

    float *want = copy_of(c0, nc * sizeof(float));
    g_assert_true(cpu->gemm(cpu, ta, tb, m, n, k, alpha, at, ha, bt, hb, beta, want));
    void *da = upload(be, ha, abytes), *db = upload(be, hb, bbytes);
    float *dc = upload(be, c0, nc * sizeof(float));
    g_assert_true(be->gemm(be, ta, tb, m, n, k, alpha, at, da, bt, db, beta, dc));
    float *got = download(be, dc, nc * sizeof(float));
    be->copy(be, dc, c0, nc * sizeof(float));
    g_assert_true(be->gemm(be, ta, tb, m, n, k, alpha, at, da, bt, db, beta, dc));
    float *again = download(be, dc, nc * sizeof(float));
    assert_same_bits(again, got, nc * sizeof(float), "gemm repeated");

    const double tol = 2.0 * k * EPS + (mode == REAL_CUDA_GEMM_BF16 ? GEMM_ROUNDING_TOL : 0.0);
    double *bound = g_new(double, nc ? nc : 1);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double abs_sum = 0.0;
            for (int p = 0; p < k; p++)
                abs_sum += fabs(a_read[ta ? (size_t)p * m + i : (size_t)i * k + p]) *
                           fabs(b_read[tb ? (size_t)j * k + p : (size_t)p * n + j]);
            bound[(size_t)i * n + j] = tol * fabs(alpha) * abs_sum +
                                       4.0 * EPS * fabs(beta * c0[(size_t)i * n + j]) + FLT_MIN;
        }
    char *what = g_strdup_printf("gemm %s %dx%dx%d ta=%d tb=%d a=%s b=%s beta=%g", mode_name[mode],
                                 m, n, k, ta, tb, at == REAL_DTYPE_BF16 ? "bf16" : "f32",
                                 bt == REAL_DTYPE_BF16 ? "bf16" : "f32", beta);
    assert_within(got, want, bound, nc, what);
    g_free(what), g_free(bound);
    be->free(be, da), be->free(be, db), be->free(be, dc);
    g_free(a32), g_free(b32), g_free(c0), g_free(a16), g_free(b16), g_free(a_read);
    g_free(b_read), g_free(want), g_free(got), g_free(again);
}

static void test_gemm(void)
{
    /* 700 x 50257: a padded output over 128 MiB, computed in two bands of rows (GPT-2's
     * vocabulary as the row length). */
    static const Shape shapes[] = {{37, 129, 67}, {1, 1000, 3}, {1000, 1, 37}, {3, 5, 1},
                                   {257, 96, 1000}, {1000, 777, 513}, {5, 7, 0},
                                   {700, 50257, 8}};
    for (int mode = 0; mode < 2; mode++)
        for (size_t s = 0; s < G_N_ELEMENTS(shapes); s++)
            for (int variant = 0; variant < 16; variant++) {
                const bool ta = variant & 1, tb = variant & 2;
                const RealDType at = variant & 4 ? REAL_DTYPE_BF16 : REAL_DTYPE_F32;
                const RealDType bt = variant & 8 ? REAL_DTYPE_BF16 : REAL_DTYPE_F32;
                /* The large shapes only in the model's combinations, to bound the test's time. */
                if ((size_t)shapes[s].m * shapes[s].n > 500000 && variant % 5 != 0)
                    continue;
                check_gemm(gpu[mode], (RealCudaGemmMode)mode, shapes[s], ta, tb, at, bt, 0.75f,
                           variant & 1 ? 1.0f : 0.0f);
            }
    device_ok(gpu[0]);
    device_ok(gpu[1]);
}

/* ---- bias, add ---- */

static void test_bias_add(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_FP32];
    static const int dims[][2] = {{1031, 129}, {1, 3000}, {4099, 3}, {64, 64}};
    for (size_t d = 0; d < G_N_ELEMENTS(dims); d++) {
        const int rows = dims[d][0], cols = dims[d][1];
        const size_t n = (size_t)rows * cols;
        float *y = random_f32(n, 0.0, 1.0), *z = random_f32(n, 0.5, 2.0);
        float *db0 = random_f32((size_t)cols, 0.0, 1.0);
        RealBf16 *bias = random_bf16((size_t)cols, 0.0, 1.0);
        float *dy = upload(be, y, n * sizeof(float)), *dz = upload(be, z, n * sizeof(float));
        RealBf16 *dbias = upload(be, bias, (size_t)cols * sizeof(RealBf16));

        be->bias_fwd(be, dy, dbias, rows, cols);
        float *want = copy_of(y, n * sizeof(float));
        cpu->bias_fwd(cpu, want, bias, rows, cols);
        float *got = download(be, dy, n * sizeof(float));
        assert_same_bits(got, want, n * sizeof(float), "bias_fwd");
        g_free(got);

        /* add, out aliasing each input in turn. */
        be->add(be, dy, dy, dz, n);
        cpu->add(cpu, want, want, z, n);
        be->add(be, dz, dy, dz, n);
        cpu->add(cpu, z, want, z, n);
        got = download(be, dz, n * sizeof(float));
        assert_same_bits(got, z, n * sizeof(float), "add");
        g_free(got);

        /* bias_bwd accumulates column sums: against the CPU with the column tolerance, and
         * repeated for identical bits. */
        float *dsum = upload(be, db0, (size_t)cols * sizeof(float));
        be->bias_bwd(be, dsum, dz, rows, cols);
        float *want_sum = copy_of(db0, (size_t)cols * sizeof(float));
        cpu->bias_bwd(cpu, want_sum, z, rows, cols);
        got = download(be, dsum, (size_t)cols * sizeof(float));
        be->copy(be, dsum, db0, (size_t)cols * sizeof(float));
        be->bias_bwd(be, dsum, dz, rows, cols);
        float *again = download(be, dsum, (size_t)cols * sizeof(float));
        assert_same_bits(again, got, (size_t)cols * sizeof(float), "bias_bwd repeated");
        double *bound = g_new(double, cols);
        for (int c = 0; c < cols; c++) {
            double abs_sum = fabs(db0[c]);
            for (int r = 0; r < rows; r++)
                abs_sum += fabs(z[(size_t)r * cols + c]);
            bound[c] = COLUMN_TOL(rows + 1) * abs_sum + FLT_MIN;
        }
        assert_within(got, want_sum, bound, (size_t)cols, "bias_bwd");
        be->free(be, dy), be->free(be, dz), be->free(be, dbias), be->free(be, dsum);
        g_free(y), g_free(z), g_free(db0), g_free(bias), g_free(want), g_free(got);
        g_free(want_sum), g_free(again), g_free(bound);
    }
    device_ok(be);
}

/* ---- embedding ---- */

/* Tokens from a small range so that most repeat: the backward's per-token sums must still
 * come out in the CPU's order, bit for bit, run after run. */
static void test_embedding(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    enum { B = 3, S = 37, H = 80, V = 50, ROWS = B * S };
    int tokens[ROWS];
    for (int r = 0; r < ROWS; r++)
        tokens[r] = r % 7 == 0 ? V - 1 : (int)g_rand_int_range(rng, 0, 9);
    RealBf16 *wte = random_bf16((size_t)V * H, 0.0, 0.1), *wpe = random_bf16((size_t)S * H, 0.0, 0.1);
    RealBf16 *dwte_w = upload(be, wte, (size_t)V * H * 2), *dwpe_w = upload(be, wpe, (size_t)S * H * 2);
    float *dx = be->alloc(be, (size_t)ROWS * H * sizeof(float), REAL_MEM_WORKSPACE);
    g_assert_nonnull(dx);
    be->embedding_fwd(be, dx, tokens, dwte_w, dwpe_w, B, S, H);
    float *want = g_new(float, (size_t)ROWS * H);
    cpu->embedding_fwd(cpu, want, tokens, wte, wpe, B, S, H);
    float *got = download(be, dx, (size_t)ROWS * H * sizeof(float));
    assert_same_bits(got, want, (size_t)ROWS * H * sizeof(float), "embedding_fwd");
    g_free(got);

    float *g = random_f32((size_t)ROWS * H, 0.0, 1.0);
    float *gte0 = random_f32((size_t)V * H, 0.0, 1.0), *gpe0 = random_f32((size_t)S * H, 0.0, 1.0);
    float *dg = upload(be, g, (size_t)ROWS * H * sizeof(float));
    float *want_te = copy_of(gte0, (size_t)V * H * sizeof(float));
    float *want_pe = copy_of(gpe0, (size_t)S * H * sizeof(float));
    cpu->embedding_bwd(cpu, want_te, want_pe, tokens, g, B, S, H);
    for (int run = 0; run < 2; run++) {
        float *dte = upload(be, gte0, (size_t)V * H * sizeof(float));
        float *dpe = upload(be, gpe0, (size_t)S * H * sizeof(float));
        be->embedding_bwd(be, dte, dpe, tokens, dg, B, S, H);
        float *got_te = download(be, dte, (size_t)V * H * sizeof(float));
        float *got_pe = download(be, dpe, (size_t)S * H * sizeof(float));
        assert_same_bits(got_te, want_te, (size_t)V * H * sizeof(float), "embedding_bwd wte");
        assert_same_bits(got_pe, want_pe, (size_t)S * H * sizeof(float), "embedding_bwd wpe");
        be->free(be, dte), be->free(be, dpe);
        g_free(got_te), g_free(got_pe);
    }
    be->free(be, dwte_w), be->free(be, dwpe_w), be->free(be, dx), be->free(be, dg);
    g_free(wte), g_free(wpe), g_free(want), g_free(g), g_free(gte0), g_free(gpe0);
    g_free(want_te), g_free(want_pe);
    device_ok(be);
}

/* ---- layer norm ---- */

static void test_layernorm(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_FP32];
    static const int dims[][2] = {{1003, 80}, {67, 768}, {5, 1601}, {1, 3}};
    for (size_t d = 0; d < G_N_ELEMENTS(dims); d++) {
        const int rows = dims[d][0], cols = dims[d][1];
        const size_t n = (size_t)rows * cols;
        float *x = random_f32(n, 0.5, 2.0), *dy = random_f32(n, 0.0, 1.0);
        float *dx0 = random_f32(n, 0.0, 1.0);
        float *dg0 = random_f32((size_t)cols, 0.0, 1.0), *db0 = random_f32((size_t)cols, 0.0, 1.0);
        RealBf16 *gain = random_bf16((size_t)cols, 1.0, 0.3), *bias = random_bf16((size_t)cols, 0.0, 0.3);
        float *y = g_new(float, n), *mean = g_new(float, rows), *rstd = g_new(float, rows);
        cpu->layernorm_fwd(cpu, y, mean, rstd, x, gain, bias, rows, cols);

        float *d_x = upload(be, x, n * sizeof(float)), *d_y = be->alloc(be, n * sizeof(float), REAL_MEM_WORKSPACE);
        float *d_mean = be->alloc(be, (size_t)rows * sizeof(float), REAL_MEM_WORKSPACE);
        float *d_rstd = be->alloc(be, (size_t)rows * sizeof(float), REAL_MEM_WORKSPACE);
        RealBf16 *d_gain = upload(be, gain, (size_t)cols * 2), *d_bias = upload(be, bias, (size_t)cols * 2);
        be->layernorm_fwd(be, d_y, d_mean, d_rstd, d_x, d_gain, d_bias, rows, cols);
        float *got_y = download(be, d_y, n * sizeof(float));
        float *got_mean = download(be, d_mean, (size_t)rows * sizeof(float));
        float *got_rstd = download(be, d_rstd, (size_t)rows * sizeof(float));
        assert_close(got_y, y, n, LN_FWD_TOL, LN_FWD_TOL, "layernorm_fwd y");
        assert_close(got_mean, mean, (size_t)rows, LN_FWD_TOL, LN_FWD_TOL, "layernorm_fwd mean");
        assert_close(got_rstd, rstd, (size_t)rows, 0.0, LN_FWD_TOL, "layernorm_fwd rstd");

        /* Backward from the CPU's statistics on both sides, so only the backward differs. */
        be->copy(be, d_mean, mean, (size_t)rows * sizeof(float));
        be->copy(be, d_rstd, rstd, (size_t)rows * sizeof(float));
        float *want_dx = copy_of(dx0, n * sizeof(float));
        float *want_dg = copy_of(dg0, (size_t)cols * sizeof(float));
        float *want_db = copy_of(db0, (size_t)cols * sizeof(float));
        cpu->layernorm_bwd(cpu, want_dx, want_dg, want_db, dy, x, mean, rstd, gain, rows, cols);
        float *d_dy = upload(be, dy, n * sizeof(float));
        float *got[2][3];
        for (int run = 0; run < 2; run++) {
            float *d_dx = upload(be, dx0, n * sizeof(float));
            float *d_dg = upload(be, dg0, (size_t)cols * sizeof(float));
            float *d_db = upload(be, db0, (size_t)cols * sizeof(float));
            be->layernorm_bwd(be, d_dx, d_dg, d_db, d_dy, d_x, d_mean, d_rstd, d_gain, rows, cols);
            got[run][0] = download(be, d_dx, n * sizeof(float));
            got[run][1] = download(be, d_dg, (size_t)cols * sizeof(float));
            got[run][2] = download(be, d_db, (size_t)cols * sizeof(float));
            be->free(be, d_dx), be->free(be, d_dg), be->free(be, d_db);
        }
        assert_same_bits(got[1][0], got[0][0], n * sizeof(float), "layernorm_bwd dx repeated");
        assert_same_bits(got[1][1], got[0][1], (size_t)cols * sizeof(float), "dgain repeated");
        assert_same_bits(got[1][2], got[0][2], (size_t)cols * sizeof(float), "dbias repeated");
        /* dx: per row, relative to the row's largest term |rstd dxhat| (+ the initial dx). */
        double *bound = g_new(double, n);
        for (int r = 0; r < rows; r++) {
            double row_max = 0.0;
            for (int c = 0; c < cols; c++)
                row_max = fmax(row_max, fabs(rstd[r] * dy[(size_t)r * cols + c] *
                                             real_bf16_to_f32(gain[c])));
            for (int c = 0; c < cols; c++)
                bound[(size_t)r * cols + c] = LN_DX_TOL(cols) * (row_max + fabs(dx0[(size_t)r * cols + c])) + FLT_MIN;
        }
        assert_within(got[0][0], want_dx, bound, n, "layernorm_bwd dx");
        g_free(bound);
        double *bg = g_new(double, cols), *bb = g_new(double, cols);
        for (int c = 0; c < cols; c++) {
            double sg = fabs(dg0[c]), sb = fabs(db0[c]);
            for (int r = 0; r < rows; r++) {
                const size_t at = (size_t)r * cols + c;
                sg += fabs(dy[at] * (x[at] - mean[r]) * rstd[r]);
                sb += fabs(dy[at]);
            }
            bg[c] = COLUMN_TOL(rows + 1) * sg + FLT_MIN;
            bb[c] = COLUMN_TOL(rows + 1) * sb + FLT_MIN;
        }
        assert_within(got[0][1], want_dg, bg, (size_t)cols, "layernorm_bwd dgain");
        assert_within(got[0][2], want_db, bb, (size_t)cols, "layernorm_bwd dbias");
        g_free(bg), g_free(bb);
        for (int run = 0; run < 2; run++)
            for (int i = 0; i < 3; i++)
                g_free(got[run][i]);
        be->free(be, d_x), be->free(be, d_y), be->free(be, d_mean), be->free(be, d_rstd);
        be->free(be, d_gain), be->free(be, d_bias), be->free(be, d_dy);
        g_free(x), g_free(dy), g_free(dx0), g_free(dg0), g_free(db0), g_free(gain), g_free(bias);
        g_free(y), g_free(mean), g_free(rstd), g_free(got_y), g_free(got_mean), g_free(got_rstd);
        g_free(want_dx), g_free(want_dg), g_free(want_db);
    }
    device_ok(be);
}

/* ---- attention ---- */

typedef struct {
    int batch, seq, heads, head_dim;
} AttnShape;

static void check_attention(RealCudaGemmMode mode, AttnShape sh, RealDType probs_dtype)
{
    RealBackend *be = gpu[mode];
    const int b = sh.batch, s = sh.seq, a = sh.heads, hd = sh.head_dim, h = a * hd;
    const size_t rows = (size_t)b * s, nqkv = rows * 3 * h, nout = rows * h;
    const size_t np = (size_t)b * a * s * s, pbytes = np * (probs_dtype == REAL_DTYPE_BF16 ? 2 : 4);
    /* q, k, v are bf16 values, as the model's are: bf16 mode converts them exactly. */
    float *qkv = random_bf16_values(nqkv, 1.0), *dout = random_f32(nout, 0.0, 1.0);
    float *out = g_new(float, nout), *dqkv = g_new(float, nqkv);
    void *probs = g_malloc(pbytes);
    g_assert_true(cpu->attention_fwd(cpu, out, probs, probs_dtype, qkv, b, s, a, hd));
    g_assert_true(cpu->attention_bwd(cpu, dqkv, dout, qkv, probs, probs_dtype, b, s, a, hd));

    float *d_qkv = upload(be, qkv, nqkv * sizeof(float));
    float *d_out = be->alloc(be, nout * sizeof(float), REAL_MEM_WORKSPACE);
    void *d_probs = be->alloc(be, pbytes, REAL_MEM_ACTIVATIONS);
    g_assert_true(be->attention_fwd(be, d_out, d_probs, probs_dtype, d_qkv, b, s, a, hd));
    float *got_out = download(be, d_out, nout * sizeof(float));
    void *got_probs = download(be, d_probs, pbytes);
    /* Without stored probabilities the output is the same, bit for bit, and so is a rerun. */
    g_assert_true(be->attention_fwd(be, d_out, NULL, probs_dtype, d_qkv, b, s, a, hd));
    float *again = download(be, d_out, nout * sizeof(float));
    assert_same_bits(again, got_out, nout * sizeof(float), "attention_fwd without probs");
    g_free(again);

    char *what = g_strdup_printf("attention %s b=%d s=%d a=%d hd=%d probs=%s", mode_name[mode], b,
                                 s, a, hd, probs_dtype == REAL_DTYPE_BF16 ? "bf16" : "f32");
    /* The mask: exact zeros above the diagonal. Probabilities: compared as floats. */
    size_t same = 0;
    float *pf = g_new(float, np), *gf = g_new(float, np);
    for (size_t i = 0; i < np; i++) {
        const size_t t = i / s % s, u = i % s;
        pf[i] = probs_dtype == REAL_DTYPE_BF16 ? real_bf16_to_f32(((RealBf16 *)probs)[i]) : ((float *)probs)[i];
        gf[i] = probs_dtype == REAL_DTYPE_BF16 ? real_bf16_to_f32(((RealBf16 *)got_probs)[i]) : ((float *)got_probs)[i];
        if (u > t)
            g_assert_true(gf[i] == 0.0f);
        same += pf[i] == gf[i];
    }
    g_test_message("%s: %.4f%% of probabilities bit-identical", what, 100.0 * same / np);
    const double base_tol = mode == REAL_CUDA_GEMM_FP32 ? ATTN_EXACT_TOL : ATTN_BF16_FWD_TOL;
    const double fwd_tol = probs_dtype == REAL_DTYPE_BF16 ? MAX(base_tol, ATTN_BF16_PROBS_TOL)
                                                          : base_tol;
    /* Probabilities lie in [0, 1] with a largest value near 1, so this is absolute. */
    assert_close_to_max(gf, pf, np, 1, 1, fwd_tol, what);
    assert_close_to_max(got_out, out, rows, (size_t)h, (size_t)h, fwd_tol, what);

    /* Backward from the CPU's probabilities on both sides. */
    be->copy(be, d_probs, probs, pbytes);
    float *d_dout = upload(be, dout, nout * sizeof(float));
    float *d_dqkv = be->alloc(be, nqkv * sizeof(float), REAL_MEM_WORKSPACE);
    g_assert_true(be->attention_bwd(be, d_dqkv, d_dout, d_qkv, d_probs, probs_dtype, b, s, a, hd));
    float *got_dqkv = download(be, d_dqkv, nqkv * sizeof(float));
    g_assert_true(be->attention_bwd(be, d_dqkv, d_dout, d_qkv, d_probs, probs_dtype, b, s, a, hd));
    again = download(be, d_dqkv, nqkv * sizeof(float));
    assert_same_bits(again, got_dqkv, nqkv * sizeof(float), "attention_bwd repeated");
    const double bwd_tol = mode == REAL_CUDA_GEMM_FP32 ? ATTN_EXACT_TOL : ATTN_BF16_BWD_TOL;
    static const char *const part[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
        char *label = g_strdup_printf("%s %s", what, part[p]);
        assert_close_to_max(got_dqkv + (size_t)p * h, dqkv + (size_t)p * h, rows, (size_t)h,
                            3 * (size_t)h, bwd_tol, label);
        g_free(label);
    }
    be->free(be, d_qkv), be->free(be, d_out), be->free(be, d_probs), be->free(be, d_dout);
    be->free(be, d_dqkv);
    g_free(what), g_free(qkv), g_free(dout), g_free(out), g_free(dqkv), g_free(probs);
    g_free(got_out), g_free(got_probs), g_free(pf), g_free(gf), g_free(got_dqkv), g_free(again);
}

static void test_attention(void)
{
    static const AttnShape shapes[] = {{2, 37, 3, 16}, {1, 129, 2, 24}, {3, 1, 4, 8},
                                       {1, 256, 12, 64}};
    for (int mode = 0; mode < 2; mode++)
        for (size_t i = 0; i < G_N_ELEMENTS(shapes); i++) {
            check_attention((RealCudaGemmMode)mode, shapes[i], REAL_DTYPE_F32);
            check_attention((RealCudaGemmMode)mode, shapes[i], REAL_DTYPE_BF16);
        }
    device_ok(gpu[0]);
    device_ok(gpu[1]);
}

/* ---- the Llama family's entries ---- */

/* Token embedding (bit for bit, forward and the backward's per-token sums), rotary embeddings
 * whole and partial (the CPU's double angle, rounded to float: the same bits but for a
 * one-ulp double cos/sin difference at a float rounding boundary), the exact GELU and the
 * gated MLP with each activation (libm). */
static void test_llama_elementwise(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    enum { B = 3, S = 37, H = 80, V = 50, ROWS = B * S };
    int tokens[ROWS];
    for (int r = 0; r < ROWS; r++)
        tokens[r] = r % 7 == 0 ? V - 1 : (int)g_rand_int_range(rng, 0, 9);
    RealBf16 *wte = random_bf16((size_t)V * H, 0.0, 0.1);
    RealBf16 *d_wte = upload(be, wte, (size_t)V * H * 2);
    float *d_x = be->alloc(be, (size_t)ROWS * H * sizeof(float), REAL_MEM_WORKSPACE);
    float *want = g_new(float, (size_t)ROWS * H);
    be->token_embedding_fwd(be, d_x, tokens, d_wte, ROWS, H);
    cpu->token_embedding_fwd(cpu, want, tokens, wte, ROWS, H);
    float *got = download(be, d_x, (size_t)ROWS * H * sizeof(float));
    assert_same_bits(got, want, (size_t)ROWS * H * sizeof(float), "token_embedding_fwd");
    g_free(got);
    float *g = random_f32((size_t)ROWS * H, 0.0, 1.0), *gte0 = random_f32((size_t)V * H, 0.0, 1.0);
    float *d_g = upload(be, g, (size_t)ROWS * H * sizeof(float));
    float *d_gte = upload(be, gte0, (size_t)V * H * sizeof(float));
    float *want_te = copy_of(gte0, (size_t)V * H * sizeof(float));
    cpu->token_embedding_bwd(cpu, want_te, tokens, g, ROWS, H);
    be->token_embedding_bwd(be, d_gte, tokens, d_g, ROWS, H);
    got = download(be, d_gte, (size_t)V * H * sizeof(float));
    assert_same_bits(got, want_te, (size_t)V * H * sizeof(float), "token_embedding_bwd");
    g_free(got);
    be->free(be, d_wte), be->free(be, d_x), be->free(be, d_g), be->free(be, d_gte);
    g_free(wte), g_free(want), g_free(g), g_free(gte0), g_free(want_te);

    /* Rotary: 4 query and 2 key/value heads of 24, all 24 turned or the first 6 (NeoX), and
     * all 24 with Llama 3.1's rescaling (pairs in each of its three ranges). */
    enum { A = 4, KV = 2, D = 24, LD = (A + 2 * KV) * D };
    const size_t nq = (size_t)ROWS * LD;
    static const RealRope ropes[] = {
        {.theta = 10000.0f, .rot_dim = D},
        {.theta = 10000.0f, .rot_dim = 6},
        {.theta = 500000.0f, .rot_dim = D, .scaling = REAL_ROPE_SCALING_LLAMA3, .factor = 8.0f,
         .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_positions = 8192},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(ropes); k++)
        for (int inverse = 0; inverse <= 1; inverse++) {
            float *qkv = random_f32(nq, 0.0, 1.0);
            float *d_qkv = upload(be, qkv, nq * sizeof(float));
            g_assert_true(cpu->rope(cpu, qkv, B, S, A, KV, D, &ropes[k], inverse));
            g_assert_true(be->rope(be, d_qkv, B, S, A, KV, D, &ropes[k], inverse));
            got = download(be, d_qkv, nq * sizeof(float));
            assert_close(got, qkv, nq, 4 * EPS, 4 * EPS, inverse ? "rope inverse" : "rope");
            be->free(be, d_qkv);
            g_free(qkv), g_free(got);
        }

    /* Activations over [-8, 8]: the exact GELU alone, and gated (gate, up) rows. */
    enum { N = 100003, F = 1001 };
    float *x = g_new(float, N), *dy = random_f32(N, 0.0, 1.0);
    for (size_t i = 0; i < N; i++)
        x[i] = -8.0f + 16.0f * (float)i / N;
    float *y = g_new(float, N), *dx = g_new(float, N);
    cpu->gelu_erf_fwd(cpu, y, x, N);
    cpu->gelu_erf_bwd(cpu, dx, dy, x, N);
    float *d_in = upload(be, x, N * sizeof(float)), *d_dy = upload(be, dy, N * sizeof(float));
    float *d_y = be->alloc(be, N * sizeof(float), REAL_MEM_WORKSPACE);
    be->gelu_erf_fwd(be, d_y, d_in, N);
    be->gelu_erf_bwd(be, d_dy, d_dy, d_in, N); /* in place, as the model calls it */
    float *got_y = download(be, d_y, N * sizeof(float));
    float *got_dx = download(be, d_dy, N * sizeof(float));
    assert_close(got_y, y, N, LIBM_TOL, LIBM_TOL, "gelu_erf_fwd");
    double *bound = g_new(double, N);
    for (size_t i = 0; i < N; i++)
        bound[i] = LIBM_TOL * fmax(1.0, fabs(x[i])) * fmax(1.0, fabs(dy[i]));
    assert_within(got_dx, dx, bound, N, "gelu_erf_bwd");
    be->free(be, d_in), be->free(be, d_dy), be->free(be, d_y);
    g_free(got_y), g_free(got_dx);
    const int rows = N / F;
    const size_t ne = (size_t)rows * F;
    float *gate_up = g_new(float, 2 * ne), *dout = random_f32(ne, 0.0, 1.0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < F; c++) {
            gate_up[(size_t)r * 2 * F + c] = x[(size_t)r * F + c];
            gate_up[(size_t)r * 2 * F + F + c] = dy[(size_t)r * F + c];
        }
    static const RealActivation acts[] = {REAL_ACT_SILU, REAL_ACT_GELU_TANH, REAL_ACT_GELU_ERF};
    static const char *const act_name[] = {"silu", "gelu_tanh", "gelu_erf"};
    for (size_t k = 0; k < G_N_ELEMENTS(acts); k++) {
        float *out = g_new(float, ne), *dgu = g_new(float, 2 * ne);
        cpu->glu_fwd(cpu, out, gate_up, rows, F, acts[k]);
        cpu->glu_bwd(cpu, dgu, dout, gate_up, rows, F, acts[k]);
        float *d_gu = upload(be, gate_up, 2 * ne * sizeof(float));
        float *d_dout = upload(be, dout, ne * sizeof(float));
        float *d_out = be->alloc(be, ne * sizeof(float), REAL_MEM_WORKSPACE);
        be->glu_fwd(be, d_out, d_gu, rows, F, acts[k]);
        be->glu_bwd(be, d_gu, d_dout, d_gu, rows, F, acts[k]); /* in place, as the model does */
        float *got_out = download(be, d_out, ne * sizeof(float));
        float *got_dgu = download(be, d_gu, 2 * ne * sizeof(float));
        /* act(x) up and its derivatives: libm-level, relative to max(1, |x|) |up| (|dout|). */
        for (size_t i = 0; i < ne; i++)
            bound[i] = LIBM_TOL * fmax(1.0, fabs(x[i])) * fmax(1.0, fabs(dy[i]));
        char *what = g_strdup_printf("glu_fwd %s", act_name[k]);
        assert_within(got_out, out, bound, ne, what);
        g_free(what);
        what = g_strdup_printf("glu_bwd %s", act_name[k]);
        double *bound_bwd = g_new(double, 2 * ne);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < F; c++) {
                const size_t i = (size_t)r * F + c, gi = (size_t)r * 2 * F + c;
                const double b = LIBM_TOL * fmax(1.0, fabs(x[i])) * fmax(1.0, fabs(dy[i])) *
                                 fmax(1.0, fabs(dout[i]));
                bound_bwd[gi] = b, bound_bwd[gi + F] = b;
            }
        assert_within(got_dgu, dgu, bound_bwd, 2 * ne, what);
        g_free(what), g_free(bound_bwd);
        be->free(be, d_gu), be->free(be, d_dout), be->free(be, d_out);
        g_free(out), g_free(dgu), g_free(got_out), g_free(got_dgu);
    }
    g_free(x), g_free(dy), g_free(y), g_free(dx), g_free(bound), g_free(gate_up), g_free(dout);
    device_ok(be);
}

/* RMSNorm: rstd in double as on the CPU; dx's row sum in another order (as layer norm's);
 * dgain summed over rows in the CPU's order from the same rstd. */
static void test_rmsnorm(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_FP32];
    static const int dims[][2] = {{1003, 80}, {67, 768}, {5, 1601}, {1, 3}};
    const float eps = 1e-6f;
    for (size_t d = 0; d < G_N_ELEMENTS(dims); d++) {
        const int rows = dims[d][0], cols = dims[d][1];
        const size_t n = (size_t)rows * cols;
        float *x = random_f32(n, 0.5, 2.0), *dy = random_f32(n, 0.0, 1.0);
        float *dx0 = random_f32(n, 0.0, 1.0), *dg0 = random_f32((size_t)cols, 0.0, 1.0);
        RealBf16 *gain = random_bf16((size_t)cols, 1.0, 0.3);
        float *y = g_new(float, n);
        cpu->rmsnorm_fwd(cpu, y, x, gain, rows, cols, eps);
        float *d_x = upload(be, x, n * sizeof(float));
        float *d_y = be->alloc(be, n * sizeof(float), REAL_MEM_WORKSPACE);
        RealBf16 *d_gain = upload(be, gain, (size_t)cols * 2);
        be->rmsnorm_fwd(be, d_y, d_x, d_gain, rows, cols, eps);
        float *got_y = download(be, d_y, n * sizeof(float));
        assert_close(got_y, y, n, LN_FWD_TOL, LN_FWD_TOL, "rmsnorm_fwd");
        float *want_dx = copy_of(dx0, n * sizeof(float));
        float *want_dg = copy_of(dg0, (size_t)cols * sizeof(float));
        cpu->rmsnorm_bwd(cpu, want_dx, want_dg, dy, x, gain, rows, cols, eps);
        float *d_dy = upload(be, dy, n * sizeof(float));
        float *got[2][2];
        for (int run = 0; run < 2; run++) {
            float *d_dx = upload(be, dx0, n * sizeof(float));
            float *d_dg = upload(be, dg0, (size_t)cols * sizeof(float));
            be->rmsnorm_bwd(be, d_dx, d_dg, d_dy, d_x, d_gain, rows, cols, eps);
            got[run][0] = download(be, d_dx, n * sizeof(float));
            got[run][1] = download(be, d_dg, (size_t)cols * sizeof(float));
            be->free(be, d_dx), be->free(be, d_dg);
        }
        assert_same_bits(got[1][0], got[0][0], n * sizeof(float), "rmsnorm_bwd dx repeated");
        assert_same_bits(got[1][1], got[0][1], (size_t)cols * sizeof(float),
                         "rmsnorm_bwd dgain repeated");
        double *bound = g_new(double, n), *bg = g_new(double, cols), *rs = g_new(double, rows);
        for (int r = 0; r < rows; r++) {
            double sq = 0.0, row_max = 0.0;
            for (int c = 0; c < cols; c++)
                sq += (double)x[(size_t)r * cols + c] * x[(size_t)r * cols + c];
            rs[r] = 1.0 / sqrt(sq / cols + eps);
            for (int c = 0; c < cols; c++)
                row_max = fmax(row_max, fabs(rs[r] * dy[(size_t)r * cols + c] *
                                             real_bf16_to_f32(gain[c])));
            for (int c = 0; c < cols; c++)
                bound[(size_t)r * cols + c] =
                    LN_DX_TOL(cols) * (row_max + fabs(dx0[(size_t)r * cols + c])) + FLT_MIN;
        }
        assert_within(got[0][0], want_dx, bound, n, "rmsnorm_bwd dx");
        for (int c = 0; c < cols; c++) {
            double sg = fabs(dg0[c]);
            for (int r = 0; r < rows; r++)
                sg += fabs(dy[(size_t)r * cols + c] * x[(size_t)r * cols + c] * rs[r]);
            bg[c] = COLUMN_TOL(rows + 1) * sg + FLT_MIN;
        }
        assert_within(got[0][1], want_dg, bg, (size_t)cols, "rmsnorm_bwd dgain");
        be->free(be, d_x), be->free(be, d_y), be->free(be, d_gain), be->free(be, d_dy);
        for (int run = 0; run < 2; run++)
            g_free(got[run][0]), g_free(got[run][1]);
        g_free(x), g_free(dy), g_free(dx0), g_free(dg0), g_free(gain), g_free(y), g_free(got_y);
        g_free(want_dx), g_free(want_dg), g_free(bound), g_free(bg), g_free(rs);
    }
    device_ok(be);
}

typedef struct {
    int batch, seq, heads, kv_heads, head_dim;
    int window; /* a sliding window (attention_window), 0 for none */
} GqaShape;

/* Grouped-query attention against the CPU's, with the tolerances of check_attention; and the
 * fused kernel against the CPU's fused kernel, which it follows operation for operation (no
 * GEMMs: the same in both modes; expf and logf differ by libm ulps only). */
static void check_attention_gqa(RealCudaGemmMode mode, GqaShape sh, RealDType probs_dtype)
{
    RealBackend *be = gpu[mode];
    const int b = sh.batch, s = sh.seq, a = sh.heads, kv = sh.kv_heads, hd = sh.head_dim;
    const int h = a * hd, ld = (a + 2 * kv) * hd;
    const size_t rows = (size_t)b * s, nqkv = rows * ld, nout = rows * h;
    const size_t np = (size_t)b * a * s * s, pbytes = np * (probs_dtype == REAL_DTYPE_BF16 ? 2 : 4);
    const size_t nl = (size_t)b * a * s;
    float *qkv = random_bf16_values(nqkv, 1.0), *dout = random_f32(nout, 0.0, 1.0);
    float *out = g_new(float, nout), *dqkv = g_new(float, nqkv);
    void *probs = g_malloc(pbytes);
    cpu->attention_window = be->attention_window = sh.window;
    g_assert_true(cpu->attention_gqa_fwd(cpu, out, probs, probs_dtype, qkv, b, s, a, kv, hd));
    g_assert_true(cpu->attention_gqa_bwd(cpu, dqkv, dout, qkv, probs, probs_dtype, b, s, a, kv,
                                         hd));
    char *what = g_strdup_printf("gqa %s b=%d s=%d a=%d kv=%d hd=%d window=%d probs=%s",
                                 mode_name[mode], b, s, a, kv, hd, sh.window,
                                 probs_dtype == REAL_DTYPE_BF16 ? "bf16" : "f32");
    float *d_qkv = upload(be, qkv, nqkv * sizeof(float));
    float *d_out = be->alloc(be, nout * sizeof(float), REAL_MEM_WORKSPACE);
    void *d_probs = be->alloc(be, pbytes, REAL_MEM_ACTIVATIONS);
    g_assert_true(be->attention_gqa_fwd(be, d_out, d_probs, probs_dtype, d_qkv, b, s, a, kv, hd));
    float *got_out = download(be, d_out, nout * sizeof(float));
    const double base_tol = mode == REAL_CUDA_GEMM_FP32 ? ATTN_EXACT_TOL : ATTN_BF16_FWD_TOL;
    const double fwd_tol = probs_dtype == REAL_DTYPE_BF16 ? MAX(base_tol, ATTN_BF16_PROBS_TOL)
                                                          : base_tol;
    assert_close_to_max(got_out, out, rows, (size_t)h, (size_t)h, fwd_tol, what);
    be->copy(be, d_probs, probs, pbytes);
    float *d_dout = upload(be, dout, nout * sizeof(float));
    float *d_dqkv = be->alloc(be, nqkv * sizeof(float), REAL_MEM_WORKSPACE);
    be->fill(be, d_dqkv, 0xff, nqkv * sizeof(float)); /* NaNs: every element must be written */
    g_assert_true(be->attention_gqa_bwd(be, d_dqkv, d_dout, d_qkv, d_probs, probs_dtype, b, s, a,
                                        kv, hd));
    float *got_dqkv = download(be, d_dqkv, nqkv * sizeof(float));
    const double bwd_tol = mode == REAL_CUDA_GEMM_FP32 ? ATTN_EXACT_TOL : ATTN_BF16_BWD_TOL;
    const size_t off[3] = {0, (size_t)h, (size_t)h + (size_t)kv * hd};
    const size_t width[3] = {(size_t)h, (size_t)kv * hd, (size_t)kv * hd};
    static const char *const part[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
        char *label = g_strdup_printf("%s %s", what, part[p]);
        assert_close_to_max(got_dqkv + off[p], dqkv + off[p], rows, width[p], (size_t)ld, bwd_tol,
                            label);
        g_free(label);
    }

    /* The fused kernel. */
    float *f_out = g_new(float, nout), *f_lse = g_new(float, nl), *f_dqkv = g_new(float, nqkv);
    g_assert_true(cpu->flash_attention_fwd(cpu, f_out, f_lse, qkv, b, s, a, kv, hd));
    g_assert_true(cpu->flash_attention_bwd(cpu, f_dqkv, dout, qkv, f_out, f_lse, b, s, a, kv, hd));
    float *d_lse = be->alloc(be, nl * sizeof(float), REAL_MEM_ACTIVATIONS);
    g_assert_true(be->flash_attention_fwd(be, d_out, d_lse, d_qkv, b, s, a, kv, hd));
    float *got_fo = download(be, d_out, nout * sizeof(float));
    float *got_lse = download(be, d_lse, nl * sizeof(float));
    char *label = g_strdup_printf("flash %s out", what);
    assert_close_to_max(got_fo, f_out, rows, (size_t)h, (size_t)h, ATTN_EXACT_TOL, label);
    g_free(label);
    assert_close(got_lse, f_lse, nl, LIBM_TOL, LIBM_TOL, "flash lse");
    /* The backward from the CPU's out and lse, so only the backward differs. */
    be->copy(be, d_out, f_out, nout * sizeof(float));
    be->copy(be, d_lse, f_lse, nl * sizeof(float));
    be->fill(be, d_dqkv, 0xff, nqkv * sizeof(float));
    g_assert_true(be->flash_attention_bwd(be, d_dqkv, d_dout, d_qkv, d_out, d_lse, b, s, a, kv,
                                          hd));
    float *got_fd = download(be, d_dqkv, nqkv * sizeof(float));
    g_assert_true(be->flash_attention_bwd(be, d_dqkv, d_dout, d_qkv, d_out, d_lse, b, s, a, kv,
                                          hd));
    float *again = download(be, d_dqkv, nqkv * sizeof(float));
    assert_same_bits(again, got_fd, nqkv * sizeof(float), "flash_attention_bwd repeated");
    for (int p = 0; p < 3; p++) {
        label = g_strdup_printf("flash %s %s", what, part[p]);
        assert_close_to_max(got_fd + off[p], f_dqkv + off[p], rows, width[p], (size_t)ld,
                            ATTN_EXACT_TOL, label);
        g_free(label);
    }
    be->free(be, d_qkv), be->free(be, d_out), be->free(be, d_probs), be->free(be, d_dout);
    be->free(be, d_dqkv), be->free(be, d_lse);
    cpu->attention_window = be->attention_window = 0;
    g_free(what), g_free(qkv), g_free(dout), g_free(out), g_free(dqkv), g_free(probs);
    g_free(got_out), g_free(got_dqkv), g_free(f_out), g_free(f_lse), g_free(f_dqkv);
    g_free(got_fo), g_free(got_lse), g_free(got_fd), g_free(again);
}

static void test_attention_gqa(void)
{
    /* Groups of 1 (multi-head), 2, 4 and all heads (multi-query); sequences ending inside a
     * 32-key block of the fused kernel, a single position, and a longer one; sliding windows
     * shorter than a block, between blocks, and as long as the sequence. */
    static const GqaShape shapes[] = {{2, 37, 4, 4, 16, 0},  {2, 37, 4, 2, 16, 0},
                                      {1, 129, 8, 2, 24, 0}, {3, 1, 4, 1, 8, 0},
                                      {1, 256, 12, 4, 64, 0}, {2, 70, 6, 1, 32, 0},
                                      {2, 70, 6, 2, 32, 20}, {1, 129, 8, 2, 24, 45},
                                      {2, 37, 4, 2, 16, 37}};
    for (int mode = 0; mode < 2; mode++)
        for (size_t i = 0; i < G_N_ELEMENTS(shapes); i++) {
            check_attention_gqa((RealCudaGemmMode)mode, shapes[i], REAL_DTYPE_F32);
            check_attention_gqa((RealCudaGemmMode)mode, shapes[i], REAL_DTYPE_BF16);
        }
    device_ok(gpu[0]);
    device_ok(gpu[1]);
}

/* ---- GELU ---- */

static void test_gelu(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    enum { N = 100003 };
    float *x = g_new(float, N), *dy = random_f32(N, 0.0, 1.0);
    for (size_t i = 0; i < N; i++)
        x[i] = -8.0f + 16.0f * (float)i / N;
    float *y = g_new(float, N), *dx = g_new(float, N);
    cpu->gelu_fwd(cpu, y, x, N);
    cpu->gelu_bwd(cpu, dx, dy, x, N);
    float *d_x = upload(be, x, N * sizeof(float)), *d_dy = upload(be, dy, N * sizeof(float));
    float *d_y = be->alloc(be, N * sizeof(float), REAL_MEM_WORKSPACE);
    be->gelu_fwd(be, d_y, d_x, N);
    be->gelu_bwd(be, d_dy, d_dy, d_x, N); /* in place, as the model calls it */
    float *got_y = download(be, d_y, N * sizeof(float)), *got_dx = download(be, d_dy, N * sizeof(float));
    assert_close(got_y, y, N, LIBM_TOL, LIBM_TOL, "gelu_fwd");
    /* The backward's terms reach |x| = 8 before cancelling: relative to max(1, |x|). */
    double *bound = g_new(double, N);
    for (size_t i = 0; i < N; i++)
        bound[i] = LIBM_TOL * fmax(1.0, fabs(x[i])) * fmax(1.0, fabs(dy[i]));
    assert_within(got_dx, dx, bound, N, "gelu_bwd");
    be->gelu_fwd(be, d_x, d_x, N);
    float *in_place = download(be, d_x, N * sizeof(float));
    assert_same_bits(in_place, got_y, N * sizeof(float), "gelu_fwd in place");
    be->free(be, d_x), be->free(be, d_dy), be->free(be, d_y);
    g_free(x), g_free(dy), g_free(y), g_free(dx), g_free(got_y), g_free(got_dx), g_free(bound);
    g_free(in_place);
    device_ok(be);
}

/* ---- loss ---- */

static void test_softmax_xent(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    static const int dims[][2] = {{37, 50257}, {5, 11}, {1031, 64}};
    const float scale = 0.7f;
    for (size_t d = 0; d < G_N_ELEMENTS(dims); d++) {
        const int rows = dims[d][0], vocab = dims[d][1];
        const size_t n = (size_t)rows * vocab;
        float *logits = random_f32(n, 0.0, 2.0);
        logits[vocab + 3] = 40.0f; /* a dominant logit must not overflow */
        int *targets = g_new(int, rows);
        for (int r = 0; r < rows; r++)
            targets[r] = r == 0 ? vocab - 1 : (int)g_rand_int_range(rng, 0, vocab);
        float *want = copy_of(logits, n * sizeof(float)), want_loss = 0, got_loss[2] = {0, 0};
        cpu->softmax_xent(cpu, want, targets, rows, vocab, scale, &want_loss);
        float *got[2];
        for (int run = 0; run < 2; run++) {
            float *d = upload(be, logits, n * sizeof(float));
            be->softmax_xent(be, d, targets, rows, vocab, scale, &got_loss[run]);
            got[run] = download(be, d, n * sizeof(float));
            be->free(be, d);
        }
        assert_same_bits(got[1], got[0], n * sizeof(float), "softmax_xent repeated");
        g_assert_true(got_loss[0] == got_loss[1]);
        g_test_message("softmax_xent %dx%d: loss %.9g vs %.9g", rows, vocab, got_loss[0], want_loss);
        g_assert_cmpfloat(fabs(got_loss[0] - want_loss), <=, XENT_LOSS_TOL * fabs(want_loss));
        assert_close(got[0], want, n, XENT_GRAD_TOL * scale / rows, 0.0, "softmax_xent gradient");
        g_free(logits), g_free(targets), g_free(want), g_free(got[0]), g_free(got[1]);
    }
    device_ok(be);
}

/* ---- optimizer ---- */

static void test_adam(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_FP32];
    enum { N = 100003 };
    float *master = random_f32(N, 0.0, 0.1);
    float *m = g_new0(float, N), *v = g_new0(float, N);
    RealBf16 *grad = random_bf16(N, 0.0, 1e-2), *param = g_new(RealBf16, N);
    float *d_master = upload(be, master, N * 4), *d_m = upload(be, m, N * 4);
    float *d_v = upload(be, v, N * 4);
    RealBf16 *d_grad = upload(be, grad, N * 2), *d_param = be->alloc(be, N * 2, REAL_MEM_PARAMS);
    RealAdamHyper hyper = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f, .grad_scale = 0.25f};
    for (hyper.step = 1; hyper.step <= 3; hyper.step++) {
        cpu->adam_step(cpu, &hyper, N, master, m, v, grad, param);
        be->adam_step(be, &hyper, N, d_master, d_m, d_v, d_grad, d_param);
    }
    float *got_master = download(be, d_master, N * 4), *got_m = download(be, d_m, N * 4);
    float *got_v = download(be, d_v, N * 4);
    RealBf16 *got_param = download(be, d_param, N * 2);
    assert_same_bits(got_master, master, N * 4, "adam master");
    assert_same_bits(got_m, m, N * 4, "adam m");
    assert_same_bits(got_v, v, N * 4, "adam v");
    assert_same_bits(got_param, param, N * 2, "adam param");
    be->free(be, d_master), be->free(be, d_m), be->free(be, d_v), be->free(be, d_grad);
    be->free(be, d_param);
    g_free(master), g_free(m), g_free(v), g_free(grad), g_free(param), g_free(got_master);
    g_free(got_m), g_free(got_v), g_free(got_param);
    device_ok(be);
}

/* ---- timing ---- */

static void test_timing(void)
{
    RealBackend *be = gpu[REAL_CUDA_GEMM_BF16];
    enum { M = 2048 };
    float *a = be->alloc(be, (size_t)M * M * 4, REAL_MEM_WORKSPACE);
    float *c = be->alloc(be, (size_t)M * M * 4, REAL_MEM_WORKSPACE);
    g_assert_nonnull(a);
    g_assert_nonnull(c);
    be->fill(be, a, 0, (size_t)M * M * 4);
    void *begin = be->mark(be);
    for (int i = 0; i < 10; i++)
        g_assert_true(be->gemm(be, false, false, M, M, M, 1.0f, REAL_DTYPE_F32, a, REAL_DTYPE_F32,
                               a, 0.0f, c));
    void *end = be->mark(be);
    g_assert_nonnull(begin);
    g_assert_nonnull(end);
    const double s = be->elapsed_s(be, begin, end);
    g_test_message("10 GEMMs of %d^3 (with operand rounding): %.3f ms, %.0f TFLOP/s", M, 1e3 * s,
                   10 * 2.0 * M * M * (double)M / s / 1e12);
    g_assert_cmpfloat(s, >, 0.0);
    g_assert_cmpfloat(s, <, 10.0);
    g_assert_cmpfloat(be->elapsed_s(be, NULL, NULL), ==, 0.0);
    be->free(be, a), be->free(be, c);
    device_ok(be);
}

/* ---- a whole micro-step of the model ---- */

/* One micro-batch forward and backward of real_gpt on `be` from host parameters; returns the
 * loss and each unit's gradients (host). */
static float model_step(RealBackend *be, const RealGptDims *d, RealBf16 *const *params,
                        const int *tokens, const int *targets, RealBf16 **grads_out)
{
    GError *error = NULL;
    const int n_units = real_gpt_n_units(d);
    RealGpt *gpt = real_gpt_new(be, d, &error);
    g_assert_no_error(error);
    RealBf16 *p[8], *g[8];
    g_assert_cmpint(n_units, <=, 8);
    for (int u = 0; u < n_units; u++) {
        const size_t bytes = real_gpt_unit_elems(d, u) * sizeof(RealBf16);
        p[u] = upload(be, params[u], bytes);
        g[u] = be->alloc(be, bytes, REAL_MEM_GRADS);
        be->fill(be, g[u], 0, bytes);
    }
    RealBf16 *x = be->alloc(be, real_gpt_checkpoint_bytes(d), REAL_MEM_WORKSPACE);
    float *dx = be->alloc(be, real_gpt_residual_grad_bytes(d), REAL_MEM_WORKSPACE);
    float loss = 0;
    g_assert_true(real_gpt_embed_forward(gpt, p[0], tokens, x, &error));
    for (int l = 0; l < d->layers; l++)
        g_assert_true(real_gpt_block_forward(gpt, l, p[l + 1], x, x, TRUE, &error));
    g_assert_true(real_gpt_head_forward_backward(gpt, p[d->layers + 1], p[0], x, targets, 1.0f,
                                                 &loss, dx, g[d->layers + 1], g[0], &error));
    for (int l = d->layers - 1; l >= 0; l--)
        g_assert_true(real_gpt_block_backward(gpt, l, p[l + 1], dx, dx, g[l + 1], &error));
    g_assert_true(real_gpt_embed_backward(gpt, tokens, dx, g[0], &error));
    g_assert_no_error(error);
    for (int u = 0; u < n_units; u++) {
        grads_out[u] = g_malloc(real_gpt_unit_elems(d, u) * sizeof(RealBf16));
        be->copy(be, grads_out[u], g[u], real_gpt_unit_elems(d, u) * sizeof(RealBf16));
        be->free(be, p[u]), be->free(be, g[u]);
    }
    be->free(be, x), be->free(be, dx);
    real_gpt_free(gpt);
    return loss;
}

/* The blocks a model step runs: GPT-2 (h = 80 and head_dim 16 are no multiples of 32, T = 111
 * tokens, awkward on purpose); Llama (grouped-query 4/2 heads of 20, SwiGLU, RMSNorm, rotary,
 * untied, no biases) eager and fused; Qwen2 (q/k/v biases, tied); GPT-NeoX (LayerNorm,
 * parallel residual, half of each head rotated, exact GELU, biases) eager and fused; GeGLU.
 * The eager Llama block has a sliding window of 9, the fused NeoX one a window of 12 and a
 * LayerNorm eps of 1e-3. */
enum { STEP_GPT2, STEP_LLAMA, STEP_LLAMA_FLASH, STEP_QWEN2, STEP_NEOX, STEP_NEOX_FLASH,
       STEP_GEGLU, STEP_N };

static RealGptDims step_dims(int which)
{
    if (which == STEP_GPT2)
        return real_gpt_dims_make(2, 80, 5, 37, 101, 3);
    RealGptDims d = real_gpt_dims_make(2, 80, 4, 37, 101, 3);
    d.kv_heads = 2, d.ffn_hidden = 72, d.swiglu = true, d.rmsnorm = true, d.untied = true;
    d.no_bias = REAL_GPT_NO_BIAS_ALL, d.rope_theta = 10000.0f, d.norm_eps = 1e-5f;
    d.flash = which == STEP_LLAMA_FLASH || which == STEP_NEOX_FLASH;
    d.attention_window = which == STEP_LLAMA ? 9 : 0;
    if (which == STEP_QWEN2) {
        d.no_bias = REAL_GPT_NO_BIAS_PROJ | REAL_GPT_NO_BIAS_MLP, d.untied = false;
        d.norm_eps = 1e-6f, d.rope_theta = 1e6f;
    } else if (which == STEP_NEOX || which == STEP_NEOX_FLASH) {
        d.kv_heads = 0, d.ffn_hidden = 320, d.swiglu = false, d.rmsnorm = false, d.no_bias = 0;
        d.norm_eps = 0, d.exact_gelu = true, d.parallel_residual = true, d.rotary_fraction = 0.5f;
        if (d.flash)
            d.attention_window = 12, d.norm_eps = 1e-3f;
    } else if (which == STEP_GEGLU) { /* and Llama 3.1's rotary rescaling */
        d.swiglu = false, d.geglu = true, d.exact_gelu = true;
        d.rope_scaling = REAL_ROPE_SCALING_LLAMA3, d.rope_factor = 8.0f;
        d.rope_low_freq_factor = 1.0f, d.rope_high_freq_factor = 4.0f;
        d.rope_original_positions = 1000;
    }
    return d;
}

static void test_model_step(gconstpointer data)
{
    const RealGptDims d = step_dims(GPOINTER_TO_INT(data));
    const int n_units = real_gpt_n_units(&d), T = d.micro_batch * d.seq_len;
    RealBf16 *params[8];
    GError *error = NULL;
    for (int u = 0; u < n_units; u++) {
        params[u] = g_new(RealBf16, real_gpt_unit_elems(&d, u));
        g_assert_true(real_gpt_init_params(&d, 77, u, params[u], &error));
    }
    int *tokens = g_new(int, T), *targets = g_new(int, T);
    for (int i = 0; i < T; i++)
        tokens[i] = (int)g_rand_int_range(rng, 0, d.vocab), targets[i] = (int)g_rand_int_range(rng, 0, d.vocab);
    RealBf16 *want[8];
    const float want_loss = model_step(cpu, &d, params, tokens, targets, want);
    for (int mode = 0; mode < 2; mode++) {
        RealBf16 *got[8], *again[8];
        const float loss = model_step(gpu[mode], &d, params, tokens, targets, got);
        const float loss_again = model_step(gpu[mode], &d, params, tokens, targets, again);
        device_ok(gpu[mode]);
        g_test_message("model %s: loss %.7f vs CPU %.7f", mode_name[mode], loss, want_loss);
        g_assert_true(loss == loss_again);
        g_assert_cmpfloat(fabs(loss - want_loss), <=, MODEL_LOSS_TOL * want_loss);
        const double tol = mode == REAL_CUDA_GEMM_FP32 ? MODEL_GRAD_TOL_EXACT : MODEL_GRAD_TOL_BF16;
        for (int u = 0; u < n_units; u++) {
            const size_t n = real_gpt_unit_elems(&d, u);
            assert_same_bits(again[u], got[u], n * sizeof(RealBf16), "model gradients repeated");
            double diff = 0.0, norm = 0.0;
            for (size_t i = 0; i < n; i++) {
                const double w = real_bf16_to_f32(want[u][i]), g = real_bf16_to_f32(got[u][i]);
                diff += (g - w) * (g - w);
                norm += w * w;
            }
            g_test_message("model %s unit %d: gradient difference %.3g of its norm",
                           mode_name[mode], u, sqrt(diff / norm));
            g_assert_cmpfloat(norm, >, 0.0);
            g_assert_cmpfloat(sqrt(diff / norm), <=, tol);
            g_free(got[u]), g_free(again[u]);
        }
    }
    for (int u = 0; u < n_units; u++)
        g_free(params[u]), g_free(want[u]);
    g_free(tokens), g_free(targets);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    GError *error = NULL;
    cpu = real_cpu_backend_new();
    for (int mode = 0; mode < 2; mode++)
        if (!(gpu[mode] = real_cuda_backend_new(0, (RealCudaGemmMode)mode, &error))) {
            g_printerr("test_cuda_backend: %s\n", error->message);
            g_clear_error(&error);
            return 1;
        }
    rng = g_rand_new_with_seed(20240607);
    g_test_add_func("/cuda/device_memory", test_device_memory); /* first: see its comment */
    g_test_add_func("/cuda/alloc_copy_fill", test_alloc_copy_fill);
    g_test_add_func("/cuda/pinned_copy_stream", test_pinned_copy_stream);
    g_test_add_func("/cuda/precision", test_precision);
    g_test_add_func("/cuda/gemm", test_gemm);
    g_test_add_func("/cuda/bias_add", test_bias_add);
    g_test_add_func("/cuda/embedding", test_embedding);
    g_test_add_func("/cuda/layernorm", test_layernorm);
    g_test_add_func("/cuda/attention", test_attention);
    g_test_add_func("/cuda/gelu", test_gelu);
    g_test_add_func("/cuda/softmax_xent", test_softmax_xent);
    g_test_add_func("/cuda/adam", test_adam);
    g_test_add_func("/cuda/timing", test_timing);
    g_test_add_func("/cuda/llama_elementwise", test_llama_elementwise);
    g_test_add_func("/cuda/rmsnorm", test_rmsnorm);
    g_test_add_func("/cuda/attention_gqa_and_fused", test_attention_gqa);
    static const char *const step_name[STEP_N] = {"gpt2", "llama", "llama-flash", "qwen2",
                                                  "neox", "neox-flash", "geglu"};
    for (int i = 0; i < STEP_N; i++) {
        char *path = g_strdup_printf("/cuda/model_step/%s", step_name[i]);
        g_test_add_data_func(path, GINT_TO_POINTER(i), test_model_step);
        g_free(path);
    }
    const int status = g_test_run();
    for (int mode = 0; mode < 2; mode++)
        gpu[mode]->destroy(gpu[mode]);
    cpu->destroy(cpu);
    g_rand_free(rng);
    return status;
}
