/* test_cuda_attention: the CUDA backend's attention against the CPU backend's, in both GEMM
 * modes and probability dtypes: eager causal attention, grouped-query attention with and
 * without a sliding window, and the fused kernel. */
#include "gpu_testutil.h"

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

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    if (!gpu_testutil_init("test_cuda_attention"))
        return 1;
    g_test_add_func("/cuda/attention", test_attention);
    g_test_add_func("/cuda/attention_gqa_and_fused", test_attention_gqa);
    return gpu_testutil_run();
}
