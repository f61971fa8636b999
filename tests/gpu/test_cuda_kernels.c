/* test_cuda_kernels: the CUDA backend's elementwise and row kernels against the CPU backend,
 * bit for bit where they compute as it does: bias and add, embeddings, layer norm, GELU, the
 * loss, Adam, and the Llama family's (token embedding, rotary, gated MLPs, RMSNorm). */
#include "gpu_testutil.h"

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

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    if (!gpu_testutil_init("test_cuda_kernels"))
        return 1;
    g_test_add_func("/cuda/bias_add", test_bias_add);
    g_test_add_func("/cuda/embedding", test_embedding);
    g_test_add_func("/cuda/layernorm", test_layernorm);
    g_test_add_func("/cuda/gelu", test_gelu);
    g_test_add_func("/cuda/softmax_xent", test_softmax_xent);
    g_test_add_func("/cuda/adam", test_adam);
    g_test_add_func("/cuda/llama_elementwise", test_llama_elementwise);
    g_test_add_func("/cuda/rmsnorm", test_rmsnorm);
    return gpu_testutil_run();
}
