/* test_real_backend: zreal's CPU backend kernels (bf16 rounding, layer norm, attention, GELU,
 * cross-entropy, GEMMs, Adam) against double-precision references, its tracking allocator,
 * and the synthetic data. */
#include "real_model_common.h"

/* bf16 values and their exact widening, so references see what the kernel sees. */
static void fill_bf16(TestRng *r, RealBf16 *x, double *widened, size_t n, double mean,
                      double std)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = real_bf16_from_f32((float)(mean + std * rng_normal(r)));
        widened[i] = real_bf16_to_f32(x[i]);
    }
}

/* d fn / d x[i] for every i. */
static void numeric_grad(ScalarFn fn, double *x, size_t n, double eps, void *ctx, double *out)
{
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + eps;
        double plus = fn(x, ctx);
        x[i] = saved - eps;
        double minus = fn(x, ctx);
        x[i] = saved;
        out[i] = (plus - minus) / (2.0 * eps);
    }
}

/* ---- (a) kernels against the references, fp32 throughout ---- */

typedef struct {
    int rows, cols;
    double *x, *gain, *bias, *w; /* J = sum w * layernorm(x) */
    int wrt;                     /* 0: x, 1: gain, 2: bias */
    double eps;
} LnCtx;

static double ln_objective(const double *v, void *ctx)
{
    LnCtx *c = ctx;
    size_t n = (size_t)c->rows * c->cols;
    double *y = g_new(double, n);
    ref_layernorm(c->wrt == 0 ? v : c->x, c->wrt == 1 ? v : c->gain, c->wrt == 2 ? v : c->bias,
                  y, c->rows, c->cols, c->eps);
    double j = 0.0;
    for (size_t i = 0; i < n; i++)
        j += c->w[i] * y[i];
    g_free(y);
    return j;
}

/* LayerNorm at the backend's eps: 0 is GPT-2's 1e-5; a large one shows that it is used. */
static void check_kernel_layernorm(float eps)
{
    enum { ROWS = 6, COLS = 20, N = ROWS * COLS };
    RealBackend *be = real_cpu_backend_new();
    be->layernorm_eps = eps;
    const double ref_eps = eps > 0 ? eps : 1e-5;
    TestRng rng = {1};
    float x[N], y[N], mean[ROWS], rstd[ROWS], w[N], dx[N], dgain[COLS], dbias[COLS];
    RealBf16 gain[COLS], bias[COLS];
    double gd[COLS], bd[COLS], yref[N];
    fill_normal(&rng, x, N, 0.5, 2.0);
    fill_normal(&rng, w, N, 0.0, 1.0);
    fill_bf16(&rng, gain, gd, COLS, 1.0, 0.3);
    fill_bf16(&rng, bias, bd, COLS, 0.0, 0.3);
    double *xd = to_double(x, N), *wd = to_double(w, N);

    be->layernorm_fwd(be, y, mean, rstd, x, gain, bias, ROWS, COLS);
    ref_layernorm(xd, gd, bd, yref, ROWS, COLS, ref_eps);
    g_assert_cmpfloat(max_abs_diff_fd(y, yref, N), <, 1e-5);

    /* Backward accumulates: start from non-zero outputs and subtract them afterwards. */
    float dx0[N], dgain0[COLS], dbias0[COLS];
    fill_normal(&rng, dx0, N, 0.0, 1.0);
    fill_normal(&rng, dgain0, COLS, 0.0, 1.0);
    fill_normal(&rng, dbias0, COLS, 0.0, 1.0);
    memcpy(dx, dx0, sizeof dx), memcpy(dgain, dgain0, sizeof dgain);
    memcpy(dbias, dbias0, sizeof dbias);
    be->layernorm_bwd(be, dx, dgain, dbias, w, x, mean, rstd, gain, ROWS, COLS);
    for (int i = 0; i < N; i++)
        dx[i] -= dx0[i];
    for (int i = 0; i < COLS; i++)
        dgain[i] -= dgain0[i], dbias[i] -= dbias0[i];

    LnCtx ctx = {ROWS, COLS, xd, gd, bd, wd, 0, ref_eps};
    double num_x[N], num_g[COLS], num_b[COLS];
    numeric_grad(ln_objective, xd, N, 1e-6, &ctx, num_x);
    ctx.wrt = 1;
    numeric_grad(ln_objective, gd, COLS, 1e-6, &ctx, num_g);
    ctx.wrt = 2;
    numeric_grad(ln_objective, bd, COLS, 1e-6, &ctx, num_b);
    /* fp32 kernel vs double differences: a few fp32 ulps of the O(1..10) sums. */
    g_assert_cmpfloat(max_abs_diff_fd(dx, num_x, N), <, 1e-4);
    g_assert_cmpfloat(max_abs_diff_fd(dgain, num_g, COLS), <, 1e-4);
    g_assert_cmpfloat(max_abs_diff_fd(dbias, num_b, COLS), <, 1e-4);
    g_free(xd), g_free(wd);
    be->destroy(be);
}

static void test_kernel_layernorm(void)
{
    check_kernel_layernorm(0.0f);
    check_kernel_layernorm(0.5f);
}

typedef struct {
    int batch, s, heads, hd;
    const double *w; /* J = sum w * attention(qkv) */
} AttnCtx;

static double attn_objective(const double *qkv, void *ctx)
{
    AttnCtx *c = ctx;
    size_t n = (size_t)c->batch * c->s * c->heads * c->hd;
    double *out = g_new(double, n);
    ref_attention(qkv, out, NULL, c->batch, c->s, c->heads, c->hd);
    double j = 0.0;
    for (size_t i = 0; i < n; i++)
        j += c->w[i] * out[i];
    g_free(out);
    return j;
}

static void test_kernel_attention(void)
{
    enum { B = 2, S = 6, A = 2, HD = 4, H = A * HD, NQKV = B * S * 3 * H, NOUT = B * S * H };
    enum { NP = B * A * S * S };
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {2};
    float qkv[NQKV], out[NOUT], probs[NP], w[NOUT], dqkv[NQKV];
    double out_ref[NOUT], probs_ref[NP];
    fill_normal(&rng, qkv, NQKV, 0.0, 1.0);
    fill_normal(&rng, w, NOUT, 0.0, 1.0);
    double *qd = to_double(qkv, NQKV), *wd = to_double(w, NOUT);

    g_assert_true(be->attention_fwd(be, out, probs, REAL_DTYPE_F32, qkv, B, S, A, HD));
    ref_attention(qd, out_ref, probs_ref, B, S, A, HD);
    g_assert_cmpfloat(max_abs_diff_fd(probs, probs_ref, NP), <, 1e-6);
    g_assert_cmpfloat(max_abs_diff_fd(out, out_ref, NOUT), <, 1e-5);
    for (int b = 0; b < B * A; b++) /* the future is masked exactly */
        for (int t = 0; t < S; t++)
            for (int u = t + 1; u < S; u++)
                g_assert_true(probs[((size_t)b * S + t) * S + u] == 0.0f);

    g_assert_true(be->attention_bwd(be, dqkv, w, qkv, probs, REAL_DTYPE_F32, B, S, A, HD));
    AttnCtx ctx = {B, S, A, HD, wd};
    double num[NQKV];
    numeric_grad(attn_objective, qd, NQKV, 1e-6, &ctx, num);
    g_assert_cmpfloat(max_abs_diff_fd(dqkv, num, NQKV), <, 1e-4);

    /* bf16 probs: stored rounded, and out is computed from exactly the stored values (the
     * same out whether or not they are stored). */
    RealBf16 probs16[NP];
    float out16[NOUT], out_nostore[NOUT];
    g_assert_true(be->attention_fwd(be, out16, probs16, REAL_DTYPE_BF16, qkv, B, S, A, HD));
    g_assert_true(be->attention_fwd(be, out_nostore, NULL, REAL_DTYPE_BF16, qkv, B, S, A, HD));
    g_assert_cmpmem(out16, sizeof out16, out_nostore, sizeof out_nostore);
    double expect[NOUT];
    for (int b = 0; b < B; b++)
        for (int a = 0; a < A; a++)
            for (int t = 0; t < S; t++)
                for (int i = 0; i < HD; i++) {
                    double acc = 0.0;
                    for (int u = 0; u < S; u++) {
                        size_t pi = (((size_t)b * A + a) * S + t) * S + u;
                        g_assert_true(probs16[pi] == real_bf16_from_f32(probs[pi]));
                        acc += real_bf16_to_f32(probs16[pi]) *
                               qkv[((size_t)b * S + u) * 3 * H + 2 * H + a * HD + i];
                    }
                    expect[((size_t)b * S + t) * H + a * HD + i] = acc;
                }
    g_assert_cmpfloat(max_abs_diff_fd(out16, expect, NOUT), <, 1e-5);
    g_free(qd), g_free(wd);
    be->destroy(be);
}

static double gelu_objective(const double *x, void *ctx)
{
    return ref_act(x[0], *(const RealActivation *)ctx);
}

/* Both GELUs (GPT-2's tanh form, the exact erf one) and the gated MLP with each activation,
 * against the double reference and its finite differences. */
static void test_kernel_gelu(void)
{
    enum { N = 81 };
    RealBackend *be = real_cpu_backend_new();
    float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++)
        x[i] = -6.0f + 0.15f * i, dy[i] = 0.5f + 0.01f * i;
    const RealActivation acts[] = {REAL_ACT_GELU_TANH, REAL_ACT_GELU_ERF, REAL_ACT_SILU};
    for (size_t k = 0; k < G_N_ELEMENTS(acts); k++) {
        RealActivation act = acts[k];
        if (act != REAL_ACT_SILU) {
            (act == REAL_ACT_GELU_TANH ? be->gelu_fwd : be->gelu_erf_fwd)(be, y, x, N);
            (act == REAL_ACT_GELU_TANH ? be->gelu_bwd : be->gelu_erf_bwd)(be, dx, dy, x, N);
            for (int i = 0; i < N; i++) {
                double xd = x[i], slope;
                numeric_grad(gelu_objective, &xd, 1, 1e-6, &act, &slope);
                g_assert_cmpfloat(fabs(y[i] - ref_act(x[i], act)), <, 1e-6);
                g_assert_cmpfloat(fabs(dx[i] - dy[i] * slope), <, 1e-5);
            }
        }
        /* Gated: rows of [gate | up] with up = dy, so out = act(x) dy, d gate = dy dy act'. */
        enum { F = 27, ROWS = N / F };
        float gate_up[2 * N], out[N], dgu[2 * N];
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < F; c++) {
                gate_up[r * 2 * F + c] = x[r * F + c];
                gate_up[r * 2 * F + F + c] = dy[r * F + c];
            }
        be->glu_fwd(be, out, gate_up, ROWS, F, act);
        be->glu_bwd(be, dgu, dy, gate_up, ROWS, F, act);
        for (int i = 0; i < N; i++) {
            const int r = i / F, c = i % F;
            double xd = x[i], slope;
            numeric_grad(gelu_objective, &xd, 1, 1e-6, &act, &slope);
            g_assert_cmpfloat(fabs(out[i] - ref_act(x[i], act) * dy[i]), <, 1e-5);
            g_assert_cmpfloat(fabs(dgu[r * 2 * F + c] - dy[i] * dy[i] * slope), <, 1e-5);
            g_assert_cmpfloat(fabs(dgu[r * 2 * F + F + c] - dy[i] * ref_act(x[i], act)), <,
                              1e-5);
        }
    }
    /* In place, as the model uses it. */
    be->gelu_fwd(be, y, x, N);
    be->gelu_fwd(be, x, x, N);
    g_assert_cmpmem(x, sizeof x, y, sizeof y);
    be->destroy(be);
}

typedef struct {
    const int *targets;
    int rows, vocab;
} XentCtx;

static double xent_objective(const double *logits, void *ctx)
{
    XentCtx *c = ctx;
    return ref_xent(logits, c->targets, c->rows, c->vocab);
}

static void test_kernel_cross_entropy(void)
{
    enum { ROWS = 5, V = 11, N = ROWS * V };
    const float scale = 0.7f;
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {3};
    float logits[N];
    int targets[ROWS] = {0, 10, 3, 3, 7};
    fill_normal(&rng, logits, N, 0.0, 2.0);
    logits[V + 10] = 40.0f; /* a dominant logit must not overflow */
    double *ld = to_double(logits, N);
    float loss;
    be->softmax_xent(be, logits, targets, ROWS, V, scale, &loss);
    XentCtx ctx = {targets, ROWS, V};
    g_assert_cmpfloat(fabs(loss - ref_xent(ld, targets, ROWS, V)), <, 1e-5);
    double num[N];
    numeric_grad(xent_objective, ld, N, 1e-6, &ctx, num);
    for (int i = 0; i < N; i++)
        num[i] *= scale;
    g_assert_cmpfloat(max_abs_diff_fd(logits, num, N), <, 1e-6);
    g_free(ld);
    be->destroy(be);
}

static void test_kernel_gemm(void)
{
    enum { M = 3, N = 4, K = 5 };
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {4};
    float a32[M * K], b32[K * N], c0[M * N];
    RealBf16 a16[M * K], b16[K * N];
    double ad[M * K], bd[K * N];
    fill_bf16(&rng, a16, ad, M * K, 0.0, 1.0);
    fill_bf16(&rng, b16, bd, K * N, 0.0, 1.0);
    for (int i = 0; i < M * K; i++)
        a32[i] = (float)ad[i];
    for (int i = 0; i < K * N; i++)
        b32[i] = (float)bd[i];
    fill_normal(&rng, c0, M * N, 0.0, 1.0);
    for (int variant = 0; variant < 8; variant++) {
        bool ta = variant & 1, tb = variant & 2, a_bf16 = variant & 4;
        /* The same numbers read as op(a) [M,K], op(b) [K,N] whatever the storage. */
        float c[M * N];
        memcpy(c, c0, sizeof c);
        g_assert_true(be->gemm(be, ta, tb, M, N, K, 0.5f, a_bf16 ? REAL_DTYPE_BF16 : REAL_DTYPE_F32,
                               a_bf16 ? (const void *)a16 : a32,
                               a_bf16 ? REAL_DTYPE_F32 : REAL_DTYPE_BF16,
                               a_bf16 ? (const void *)b32 : b16, 2.0f, c));
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double acc = 0.0;
                for (int k = 0; k < K; k++)
                    acc += ad[ta ? k * M + i : i * K + k] * bd[tb ? j * K + k : k * N + j];
                g_assert_cmpfloat(fabs(c[i * N + j] - (0.5 * acc + 2.0 * c0[i * N + j])), <,
                                  1e-5);
            }
    }
    be->destroy(be);
}

/* A bf16 B operand bigger than the CPU backend's 2^23-element staging panel is multiplied
 * panel by panel; every element must still be the whole product, in both storage orders, and
 * the staging must stay one panel. */
static void test_kernel_gemm_panels(void)
{
    enum { M = 2, K = 3000, N = 3001 }; /* K N = 9.0e6 elements: two panels of 2796 columns */
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {9};
    float *a = g_new(float, (size_t)M * K), *c = g_new(float, (size_t)M * N);
    RealBf16 *b = g_new(RealBf16, (size_t)K * N);
    double *ad = g_new(double, (size_t)M * K), *bd = g_new(double, (size_t)K * N);
    fill_bf16(&rng, b, bd, (size_t)K * N, 0.0, 1.0);
    fill_normal(&rng, a, (size_t)M * K, 0.0, 1.0);
    for (size_t i = 0; i < (size_t)M * K; i++)
        ad[i] = a[i];
    for (int tb = 0; tb <= 1; tb++) {
        g_assert_true(be->gemm(be, false, tb, M, N, K, 1.0f, REAL_DTYPE_F32, a, REAL_DTYPE_BF16,
                               b, 0.0f, c));
        const int cols[] = {0, 1, 1400, 2795, 2796, 2797, N - 1}; /* around the panel edge */
        for (int i = 0; i < M; i++)
            for (size_t q = 0; q < G_N_ELEMENTS(cols); q++) {
                const size_t j = (size_t)cols[q];
                double acc = 0.0;
                for (size_t k = 0; k < K; k++)
                    acc += ad[(size_t)i * K + k] * bd[tb ? j * K + k : k * N + j];
                g_assert_cmpfloat(fabs(c[(size_t)i * N + j] - acc), <, 1e-3);
            }
    }
    RealAllocStats st;
    real_alloc_stats(be->tracker, &st);
    g_assert_cmpuint(st.peak_bytes[REAL_MEM_WORKSPACE], <=, ((uint64_t)1 << 23) * sizeof(float));
    be->destroy(be);
    g_free(a), g_free(c), g_free(b), g_free(ad), g_free(bd);
}

static void test_kernel_adam(void)
{
    enum { N = 5 };
    RealBackend *be = real_cpu_backend_new();
    float master[N] = {0.5f, -1.0f, 0.0f, 2.0f, 1e-3f}, m[N] = {0}, v[N] = {0};
    double md[N], vd[N], wd[N];
    RealBf16 grad[N], param[N];
    const float g[N] = {0.1f, -0.2f, 0.0f, 3.0f, -1e-3f};
    for (int i = 0; i < N; i++)
        grad[i] = real_bf16_from_f32(g[i]), md[i] = vd[i] = 0.0, wd[i] = master[i];
    RealAdamHyper hyper = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f, .grad_scale = 0.5f};
    for (hyper.step = 1; hyper.step <= 3; hyper.step++) {
        be->adam_step(be, &hyper, N, master, m, v, grad, param);
        for (int i = 0; i < N; i++) {
            double gi = real_bf16_to_f32(grad[i]) * 0.5;
            md[i] = 0.9 * md[i] + 0.1 * gi;
            vd[i] = 0.95 * vd[i] + 0.05 * gi * gi;
            double mhat = md[i] / (1 - pow(0.9, hyper.step));
            double vhat = vd[i] / (1 - pow(0.95, hyper.step));
            wd[i] -= 1e-2 * (mhat / (sqrt(vhat) + 1e-8) + 0.1 * wd[i]);
            g_assert_cmpfloat(fabs(master[i] - wd[i]), <, 1e-6);
            g_assert_true(param[i] == real_bf16_from_f32(master[i]));
        }
    }
    be->destroy(be);
}

static void test_bf16_rounding(void)
{
    /* 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even 1;
     * 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): it goes up. */
    g_assert_cmpfloat(real_bf16_round_f32(1.0f + 0x1p-8f), ==, 1.0f);
    g_assert_cmpfloat(real_bf16_round_f32(1.0f + 3 * 0x1p-8f), ==, 1.0f + 0x1p-6f);
    g_assert_cmpfloat(real_bf16_round_f32(1.0f + 0x1p-8f + 0x1p-20f), ==, 1.0f + 0x1p-7f);
    g_assert_cmpfloat(real_bf16_round_f32(-2.5f), ==, -2.5f);
    g_assert_true(isnan(real_bf16_round_f32(NAN)));
    g_assert_true(isinf(real_bf16_round_f32(INFINITY)));
    g_assert_true(isinf(real_bf16_round_f32(3.4e38f))); /* beyond the largest bf16 */
}

/* ---- (e) memory accounting ---- */

/* Once a tracker exists, malloc keeps freed blocks for the next step, as a caching allocator
 * keeps them (real_alloc.c keep_freed_blocks): a 64 MiB block, over glibc's largest default
 * mmap threshold, which glibc would otherwise unmap when it is freed, stays held. malloc's own
 * block, not a tracked one: the tracker keeps its large blocks itself (real_alloc_release). */
static void test_alloc_keeps_freed_blocks(void)
{
#ifdef __SANITIZE_ADDRESS__
    g_test_skip("ASan's allocator stands in for glibc's malloc, whose heap this measures");
#else
    RealAlloc *t = real_alloc_new();
    const size_t bytes = (size_t)64 << 20;
    void *a = malloc(bytes);
    g_assert_nonnull(a);
    memset(a, 1, bytes);
    const uint64_t held = real_alloc_heap_held_bytes();
    g_assert_cmpuint(held, >=, bytes);
    free(a);
    g_assert_cmpuint(real_alloc_heap_held_bytes(), >=, held);
    real_alloc_free_tracker(t);
#endif
}

#ifndef __SANITIZE_ADDRESS__
/* Takes a block of `bytes` under `cat` from `t`, writes every page of it, and releases it:
 * the block the tracker then keeps (returned, no longer usable). */
static void *take_touched_and_release(RealAlloc *t, size_t bytes, RealMemCategory cat)
{
    void *block = real_alloc_take(t, bytes, cat);
    g_assert_nonnull(block);
    memset(block, 1, bytes);
    real_alloc_release(t, block);
    return block;
}
#endif

/* A released block of 4 MiB or more is kept for the next take of its size, as PyTorch's
 * caching allocator keeps its large blocks: the same block comes back for that size (and is
 * counted live again), not for another size, and two live blocks of one size stay two.
 * Skipped under ASan, which must see every large block freed. */
static void test_alloc_reuses_large_blocks(void)
{
#ifdef __SANITIZE_ADDRESS__
    g_test_skip("under ASan every block is freed, so that a use after free is found");
#else
    RealAlloc *t = real_alloc_new();
    const size_t big = (size_t)8 << 20;
    void *a = take_touched_and_release(t, big, REAL_MEM_GATHERED_PARAMS);
    void *other = real_alloc_take(t, big + 4096, REAL_MEM_GATHERED_PARAMS);
    g_assert_true(other != a);
    void *again = real_alloc_take(t, big, REAL_MEM_WORKSPACE);
    g_assert_true(again == a);
    RealAllocStats s;
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_bytes[REAL_MEM_WORKSPACE], ==, big);
    g_assert_cmpuint(s.live_total_bytes, ==, 2 * big + 4096);
    g_assert_cmpuint(s.live_allocs, ==, 2);
    real_alloc_release(t, again);
    real_alloc_release(t, other);
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_total_bytes, ==, 0);
    /* Two live blocks of one size are two blocks, each kept on release. */
    void *x = real_alloc_take(t, big, REAL_MEM_PARAMS), *y = real_alloc_take(t, big, REAL_MEM_PARAMS);
    g_assert_true(x != y && (x == a || y == a));
    real_alloc_release(t, x), real_alloc_release(t, y);
    real_alloc_free_tracker(t);
#endif
}

#ifndef __SANITIZE_ADDRESS__
/* The process's resident bytes (/proc/self/statm's second field). */
static uint64_t resident_bytes(void)
{
    unsigned long size_pages = 0, resident_pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    g_assert_nonnull(f);
    g_assert_cmpint(fscanf(f, "%lu %lu", &size_pages, &resident_pages), ==, 2);
    fclose(f);
    return (uint64_t)resident_pages * (uint64_t)sysconf(_SC_PAGESIZE);
}
#endif

/* Emptying the cache frees the kept blocks and gives malloc's free pages back to the system
 * (the pages, counted in resident bytes: the heap's span shrinks only when nothing sits above
 * the freed block, and mallinfo2's arena stayed at 134 MB here): the microbenchmark's phases,
 * each at its own sizes, must not add up. */
static void test_alloc_empty_cache(void)
{
#ifdef __SANITIZE_ADDRESS__
    g_test_skip("under ASan no block is kept, and ASan's allocator keeps its own heap");
#else
    RealAlloc *t = real_alloc_new();
    const size_t big = (size_t)64 << 20;
    take_touched_and_release(t, big, REAL_MEM_WORKSPACE);
    const uint64_t kept_bytes = resident_bytes();
    real_alloc_empty_cache(t);
    g_assert_cmpuint(resident_bytes() + big - ((size_t)1 << 20), <=, kept_bytes);
    void *again = real_alloc_take(t, big, REAL_MEM_WORKSPACE); /* still a working tracker */
    g_assert_nonnull(again);
    real_alloc_release(t, again);
    real_alloc_free_tracker(t);
#endif
}

/* A step's takes and releases, repeated, hold the same heap: nothing the tracker (or the
 * caching allocator's replay inside it) records per take outlives its release. Each replayed
 * take once kept its key and any block a merge retired until the tracker's end: tiny's heap
 * then grew by a step's activations every step (small long-lived chunks split the holes that
 * the step's larger blocks had left), and its blocks ran 15-25% slower on fresh pages. */
static void test_alloc_steady_heap(void)
{
#ifdef __SANITIZE_ADDRESS__
    g_test_skip("ASan's allocator keeps its own heap");
#else
    RealAlloc *t = real_alloc_new();
    const size_t sizes[] = {594 << 10, 1792 << 10, 594 << 10, 1792 << 10, 40 << 10, 300 << 10};
    void *blocks[G_N_ELEMENTS(sizes)];
    struct mallinfo2 before = {0};
    for (int step = 0; step < 200; step++) {
        if (step == 10)
            before = mallinfo2();
        /* forward: each block's activations kept, its workspace taken and given back */
        for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
            blocks[i] = real_alloc_take(t, sizes[i], REAL_MEM_ACTIVATIONS);
            g_assert_nonnull(blocks[i]);
            memset(blocks[i], 1, 64);
            if (i % 2) {
                real_alloc_release(t, blocks[i]);
                blocks[i] = NULL;
            }
        }
        for (size_t i = G_N_ELEMENTS(sizes); i-- > 0;) /* backward */
            real_alloc_release(t, blocks[i]);
    }
    const struct mallinfo2 after = mallinfo2();
    g_assert_cmpuint(after.uordblks, ==, before.uordblks);
    g_assert_cmpuint(after.arena, ==, before.arena);
    real_alloc_free_tracker(t);
#endif
}

static void test_alloc_tracker(void)
{
    RealAlloc *t = real_alloc_new();
    RealAllocStats s;
    void *a = real_alloc_take(t, 100, REAL_MEM_PARAMS);
    void *b = real_alloc_take(t, 0, REAL_MEM_GRADS);
    void *c = real_alloc_take(t, 1000, REAL_MEM_WORKSPACE);
    g_assert_nonnull(a);
    g_assert_nonnull(b);
    g_assert_nonnull(c);
    g_assert_cmpuint((uintptr_t)a % 64, ==, 0);
    g_assert_cmpuint((uintptr_t)b % 64, ==, 0);
    g_assert_cmpuint((uintptr_t)c % 64, ==, 0);
    memset(a, 1, 100), memset(c, 2, 1000);
    real_alloc_release(t, c);
    void *d = real_alloc_take(t, 300, REAL_MEM_ACTIVATIONS);
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_total_bytes, ==, 400);
    g_assert_cmpuint(s.peak_total_bytes, ==, 1100);
    g_assert_cmpuint(s.live_allocs, ==, 3);
    g_assert_cmpuint(s.peak_bytes[REAL_MEM_WORKSPACE], ==, 1000);
    g_assert_cmpuint(s.live_bytes[REAL_MEM_WORKSPACE], ==, 0);
    g_assert_cmpuint(s.at_peak_bytes[REAL_MEM_WORKSPACE], ==, 1000);
    g_assert_cmpuint(s.at_peak_bytes[REAL_MEM_ACTIVATIONS], ==, 0);
    g_assert_cmpuint(s.at_peak_bytes[REAL_MEM_PARAMS], ==, 100);
    real_alloc_reset_peaks(t);
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.peak_total_bytes, ==, 400);
    g_assert_cmpuint(s.peak_bytes[REAL_MEM_WORKSPACE], ==, 0);
    g_assert_cmpuint(s.at_peak_bytes[REAL_MEM_ACTIVATIONS], ==, 300);
    g_assert_null(real_alloc_take(t, 8, REAL_MEM_N_CATEGORIES));
    real_alloc_release(t, a), real_alloc_release(t, b), real_alloc_release(t, d);
    real_alloc_release(t, NULL);
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_total_bytes, ==, 0);
    g_assert_cmpuint(s.live_allocs, ==, 0);
    real_alloc_free_tracker(t);

    static const char *names[] = {"params", "grads", "master", "adam_m", "adam_v",
                                  "gathered_params", "buckets", "activations", "checkpoints",
                                  "workspace", "secondary_params", "ep_buffers"};
    G_STATIC_ASSERT(G_N_ELEMENTS(names) == REAL_MEM_N_CATEGORIES);
    for (int i = 0; i < REAL_MEM_N_CATEGORIES; i++)
        g_assert_cmpstr(real_alloc_category_name(i), ==, names[i]);
    g_assert_null(real_alloc_category_name(REAL_MEM_N_CATEGORIES));
}

/* Buffers another allocator made (a GPU backend's device memory) count exactly as taken
 * ones do, in the same totals and peaks, and are remembered until untracked. */
static void test_alloc_track_external(void)
{
    RealAlloc *t = real_alloc_new();
    RealAllocStats s;
    static char device_a[1], device_b[1]; /* stand-ins: the tracker never dereferences them */
    void *host = real_alloc_take(t, 50, REAL_MEM_PARAMS);
    g_assert_true(real_alloc_track(t, device_a, 200, REAL_MEM_ACTIVATIONS));
    g_assert_true(real_alloc_track(t, device_b, 0, REAL_MEM_WORKSPACE));
    g_assert_false(real_alloc_track(t, device_a, 7, REAL_MEM_PARAMS)); /* already tracked */
    g_assert_false(real_alloc_track(t, NULL, 7, REAL_MEM_PARAMS));
    g_assert_false(real_alloc_track(t, host, 7, REAL_MEM_N_CATEGORIES));
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_total_bytes, ==, 250);
    g_assert_cmpuint(s.live_allocs, ==, 3);
    g_assert_cmpuint(s.live_bytes[REAL_MEM_ACTIVATIONS], ==, 200);
    g_assert_true(real_alloc_untrack(t, device_a));
    g_assert_false(real_alloc_untrack(t, device_a)); /* no longer known */
    g_assert_false(real_alloc_untrack(t, NULL));
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_total_bytes, ==, 50);
    g_assert_cmpuint(s.live_allocs, ==, 2);
    g_assert_cmpuint(s.peak_total_bytes, ==, 250);
    g_assert_cmpuint(s.peak_bytes[REAL_MEM_ACTIVATIONS], ==, 200);
    g_assert_cmpuint(s.at_peak_bytes[REAL_MEM_ACTIVATIONS], ==, 200);
    g_assert_true(real_alloc_untrack(t, device_b));
    real_alloc_release(t, host);
    real_alloc_stats(t, &s);
    g_assert_cmpuint(s.live_total_bytes, ==, 0);
    g_assert_cmpuint(s.live_allocs, ==, 0);
    real_alloc_free_tracker(t);
}

/* ---- synthetic data ---- */

static void test_data_split_invariant(void)
{
    enum { S = 16, V = 50, B = 2, WORLD = 4, MICRO = 3, STEPS = 2 };
    GError *error = NULL;
    int tok_one[WORLD * B * S], tgt_one[WORLD * B * S], tok_r[B * S], tgt_r[B * S];
    for (int step = 0; step < STEPS; step++)
        for (int m = 0; m < MICRO; m++) {
            /* One rank with micro-batch WORLD * B ... */
            uint64_t first = real_data_first_sample(step, m, MICRO, 0, 1, WORLD * B);
            g_assert_true(real_data_batch(9, first, WORLD * B, S, V, tok_one, tgt_one, &error));
            for (int r = 0; r < WORLD; r++) {
                /* ... reads what WORLD ranks with micro-batch B read together. */
                uint64_t fr = real_data_first_sample(step, m, MICRO, r, WORLD, B);
                g_assert_true(real_data_batch(9, fr, B, S, V, tok_r, tgt_r, &error));
                g_assert_cmpmem(tok_r, sizeof tok_r, tok_one + r * B * S, sizeof tok_r);
                g_assert_cmpmem(tgt_r, sizeof tgt_r, tgt_one + r * B * S, sizeof tgt_r);
            }
        }
    g_assert_no_error(error);
    /* Consecutive micro-steps and steps read fresh samples. */
    g_assert_cmpuint(real_data_first_sample(1, 0, MICRO, 0, WORLD, B), ==, MICRO * WORLD * B);
    g_assert_false(real_data_batch(9, 0, 1, 0, V, tok_r, tgt_r, &error));
    g_assert_error(error, REAL_DATA_ERROR, REAL_DATA_ERROR_INVALID);
    g_clear_error(&error);
}

static void test_data_structure(void)
{
    enum { S = 64, V = 64, N = 200 };
    GError *error = NULL;
    int *tok = g_new(int, N * S), *tgt = g_new(int, N * S), *other = g_new(int, N * S);
    g_assert_true(real_data_batch(3, 0, N, S, V, tok, tgt, &error));
    g_assert_no_error(error);
    /* Bigram counts: the empirical conditional entropy is far below ln V. */
    double *count = g_new0(double, V * V), *row = g_new0(double, V);
    for (int i = 0; i < N; i++)
        for (int t = 0; t < S; t++) {
            int k = i * S + t;
            g_assert_true(tok[k] >= 0 && tok[k] < V);
            g_assert_true(tgt[k] >= 0 && tgt[k] < V);
            if (t + 1 < S)
                g_assert_cmpint(tgt[k], ==, tok[k + 1]);
            count[tok[k] * V + tgt[k]] += 1, row[tok[k]] += 1;
        }
    double h = 0.0;
    for (int i = 0; i < V * V; i++)
        if (count[i] > 0)
            h -= count[i] / (N * S) * log(count[i] / row[i / V]);
    g_test_message("empirical next-token entropy %.3f nats, bound %.3f, ln V %.3f", h,
                   real_data_entropy_nats(), log(V));
    g_assert_cmpfloat(h, <=, real_data_entropy_nats() + 0.05);
    g_assert_cmpfloat(real_data_entropy_nats(), <, 0.5 * log(V));
    /* Deterministic in the seed, and the seed matters. */
    real_data_batch(3, 0, N, S, V, other, tgt, &error);
    g_assert_cmpmem(other, N * S * sizeof(int), tok, N * S * sizeof(int));
    real_data_batch(4, 0, N, S, V, other, tgt, &error);
    g_assert_cmpint(memcmp(other, tok, N * S * sizeof(int)), !=, 0);
    g_free(tok), g_free(tgt), g_free(other), g_free(count), g_free(row);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/real/bf16/rounding", test_bf16_rounding);
    g_test_add_func("/real/kernel/layernorm", test_kernel_layernorm);
    g_test_add_func("/real/kernel/attention", test_kernel_attention);
    g_test_add_func("/real/kernel/gelu", test_kernel_gelu);
    g_test_add_func("/real/kernel/cross_entropy", test_kernel_cross_entropy);
    g_test_add_func("/real/kernel/gemm", test_kernel_gemm);
    g_test_add_func("/real/kernel/gemm_panels", test_kernel_gemm_panels);
    g_test_add_func("/real/kernel/adam", test_kernel_adam);
    g_test_add_func("/real/alloc/tracker", test_alloc_tracker);
    g_test_add_func("/real/alloc/keeps_freed_blocks", test_alloc_keeps_freed_blocks);
    g_test_add_func("/real/alloc/reuses_large_blocks", test_alloc_reuses_large_blocks);
    g_test_add_func("/real/alloc/steady_heap", test_alloc_steady_heap);
    g_test_add_func("/real/alloc/empty_cache", test_alloc_empty_cache);
    g_test_add_func("/real/alloc/track_external", test_alloc_track_external);
    g_test_add_func("/real/data/split_invariant", test_data_split_invariant);
    g_test_add_func("/real/data/structure", test_data_structure);
    return g_test_run();
}
