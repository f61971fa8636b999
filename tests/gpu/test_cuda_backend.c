/* test_cuda_backend: the CUDA backend's plumbing against the CPU backend and the driver:
 * device memory and the tracker, allocation, copies and fill, the pinned host copy stream,
 * bf16 conversions, GEMMs in both modes on awkward sizes, and the device clock. */
#include "gpu_testutil.h"

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

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    if (!gpu_testutil_init("test_cuda_backend"))
        return 1;
    g_test_add_func("/cuda/device_memory", test_device_memory); /* first: see its comment */
    g_test_add_func("/cuda/alloc_copy_fill", test_alloc_copy_fill);
    g_test_add_func("/cuda/pinned_copy_stream", test_pinned_copy_stream);
    g_test_add_func("/cuda/precision", test_precision);
    g_test_add_func("/cuda/gemm", test_gemm);
    g_test_add_func("/cuda/timing", test_timing);
    return gpu_testutil_run();
}
