/* test_real_llama: the Llama family in zreal (Llama, Qwen2, NeoX, GeGLU, Mistral's window):
 * gradients against finite differences, attention kernels, rotary embeddings and the
 * backend check, layout and memory. */
#include "real_model_common.h"

/* The fused kernel against the eager one and the double reference, with grouped-query heads
 * and a sequence that ends inside a key block: outputs, log-sum-exp and every gradient. */
static void test_llama_attention_kernels(void)
{
    enum { B = 2, S = 37, A = 4, KV = 2, D = 8, LD = (A + 2 * KV) * D, H = A * D };
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {21};
    const size_t nq = (size_t)B * S * LD, no = (size_t)B * S * H, nl = (size_t)B * A * S;
    float *qkv = g_new(float, nq), *dout = g_new(float, no);
    float *out_e = g_new(float, no), *out_f = g_new(float, no), *lse = g_new(float, nl);
    float *dq_e = g_new(float, nq), *dq_f = g_new(float, nq);
    float *probs = g_new(float, (size_t)B * A * S * S);
    fill_normal(&rng, qkv, nq, 0.0, 1.0);
    fill_normal(&rng, dout, no, 0.0, 1.0);
    double *qkv_d = to_double(qkv, nq), *out_d = g_new(double, no), *lse_d = g_new(double, nl);
    ref_attention_gqa(qkv_d, out_d, NULL, lse_d, B, S, A, KV, D, 0);
    g_assert_true(be->attention_gqa_fwd(be, out_e, probs, REAL_DTYPE_F32, qkv, B, S, A, KV, D));
    g_assert_true(be->flash_attention_fwd(be, out_f, lse, qkv, B, S, A, KV, D));
    g_assert_cmpfloat(max_abs_diff_fd(out_e, out_d, no), <, 1e-5);
    g_assert_cmpfloat(max_abs_diff_fd(out_f, out_d, no), <, 1e-5);
    g_assert_cmpfloat(max_abs_diff_fd(lse, lse_d, nl), <, 1e-5);
    g_assert_true(be->attention_gqa_bwd(be, dq_e, dout, qkv, probs, REAL_DTYPE_F32, B, S, A, KV,
                                        D));
    g_assert_true(be->flash_attention_bwd(be, dq_f, dout, qkv, out_f, lse, B, S, A, KV, D));
    double *dq_e_d = to_double(dq_e, nq), worst = 0.0, largest = 0.0;
    for (size_t i = 0; i < nq; i++)
        largest = fmax(largest, fabs(dq_e_d[i]));
    worst = max_abs_diff_fd(dq_f, dq_e_d, nq);
    g_test_message("fused vs eager gradients: worst %.2e of largest %.2e", worst, largest);
    g_assert_cmpfloat(largest, >, 0.1);
    g_assert_cmpfloat(worst, <, 1e-5 * largest);
    /* With as many key/value heads as heads the grouped entry is the original one. */
    float *out_m = g_new(float, (size_t)B * S * H);
    float *qkv_m = g_new(float, (size_t)B * S * 3 * H);
    fill_normal(&rng, qkv_m, (size_t)B * S * 3 * H, 0.0, 1.0);
    g_assert_true(be->attention_fwd(be, out_e, NULL, REAL_DTYPE_F32, qkv_m, B, S, A, D));
    g_assert_true(be->attention_gqa_fwd(be, out_m, NULL, REAL_DTYPE_F32, qkv_m, B, S, A, A, D));
    g_assert_cmpmem(out_e, no * sizeof(float), out_m, no * sizeof(float));
    g_free(qkv), g_free(dout), g_free(out_e), g_free(out_f), g_free(lse), g_free(dq_e);
    g_free(dq_f), g_free(probs), g_free(qkv_d), g_free(out_d), g_free(lse_d), g_free(dq_e_d);
    g_free(out_m), g_free(qkv_m);
    be->destroy(be);
}

/* A sliding window (Mistral's): eager and fused attention agree with the double reference
 * that sees keys t - w < u <= t, the eager probabilities are 0 outside the window, the two
 * backwards agree, and a window as long as the sequence changes nothing. */
static void test_attention_window(void)
{
    enum { B = 2, S = 37, A = 4, KV = 2, D = 8, LD = (A + 2 * KV) * D, H = A * D, W = 6 };
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {23};
    const size_t nq = (size_t)B * S * LD, no = (size_t)B * S * H, nl = (size_t)B * A * S;
    const size_t np = (size_t)B * A * S * S;
    float *qkv = g_new(float, nq), *dout = g_new(float, no), *lse = g_new(float, nl);
    float *out_e = g_new(float, no), *out_f = g_new(float, no), *out_full = g_new(float, no);
    float *dq_e = g_new(float, nq), *dq_f = g_new(float, nq), *probs = g_new(float, np);
    fill_normal(&rng, qkv, nq, 0.0, 1.0);
    fill_normal(&rng, dout, no, 0.0, 1.0);
    double *qkv_d = to_double(qkv, nq), *out_d = g_new(double, no), *probs_d = g_new(double, np);
    ref_attention_gqa(qkv_d, out_d, probs_d, NULL, B, S, A, KV, D, W);
    be->attention_window = W;
    g_assert_true(be->attention_gqa_fwd(be, out_e, probs, REAL_DTYPE_F32, qkv, B, S, A, KV, D));
    g_assert_true(be->flash_attention_fwd(be, out_f, lse, qkv, B, S, A, KV, D));
    g_assert_cmpfloat(max_abs_diff_fd(out_e, out_d, no), <, 1e-5);
    g_assert_cmpfloat(max_abs_diff_fd(out_f, out_d, no), <, 1e-5);
    g_assert_cmpfloat(max_abs_diff_fd(probs, probs_d, np), <, 1e-6);
    for (int t = W; t < S; t++) /* key t - W is the last one before query t's window */
        g_assert_cmpfloat(probs[(size_t)t * S + (t - W)], ==, 0.0f);
    g_assert_true(be->attention_gqa_bwd(be, dq_e, dout, qkv, probs, REAL_DTYPE_F32, B, S, A, KV,
                                        D));
    g_assert_true(be->flash_attention_bwd(be, dq_f, dout, qkv, out_f, lse, B, S, A, KV, D));
    double *dq_e_d = to_double(dq_e, nq), largest = 0.0;
    for (size_t i = 0; i < nq; i++)
        largest = fmax(largest, fabs(dq_e_d[i]));
    g_assert_cmpfloat(largest, >, 0.1);
    g_assert_cmpfloat(max_abs_diff_fd(dq_f, dq_e_d, nq), <, 1e-5 * largest);
    /* The window leaves out keys: the output differs from full attention's... */
    be->attention_window = 0;
    g_assert_true(be->flash_attention_fwd(be, out_full, lse, qkv, B, S, A, KV, D));
    double differs = 0.0;
    for (size_t i = 0; i < no; i++)
        differs = fmax(differs, fabs(out_full[i] - out_f[i]));
    g_assert_cmpfloat(differs, >, 1e-3);
    /* ...and a window of the whole sequence is full attention, bit for bit. */
    be->attention_window = S;
    g_assert_true(be->flash_attention_fwd(be, out_f, lse, qkv, B, S, A, KV, D));
    g_assert_cmpmem(out_f, no * sizeof(float), out_full, no * sizeof(float));
    g_free(qkv), g_free(dout), g_free(lse), g_free(out_e), g_free(out_f), g_free(out_full);
    g_free(dq_e), g_free(dq_f), g_free(probs), g_free(qkv_d), g_free(out_d), g_free(probs_d);
    g_free(dq_e_d);
    be->destroy(be);
}

/* Rotary embeddings turn back exactly, keep each pair's length and leave position 0 and v
 * alone; a backend without an entry the model needs refuses it in one line. */
static void test_llama_rope_and_backend(void)
{
    enum { B = 2, S = 5, A = 4, KV = 2, D = 6, LD = (A + 2 * KV) * D };
    RealBackend *be = real_cpu_backend_new();
    TestRng rng = {3};
    const size_t n = (size_t)B * S * LD;
    float *x = g_new(float, n), *y = g_new(float, n);
    fill_normal(&rng, x, n, 0.0, 1.0);
    memcpy(y, x, n * sizeof(float));
    const RealRope whole = {.theta = 10000.0f, .rot_dim = D};
    g_assert_true(be->rope(be, y, B, S, A, KV, D, &whole, false));
    for (int r = 0; r < B * S; r++)
        for (int c = 0; c < LD; c++) {
            const size_t i = (size_t)r * LD + c;
            if (r % S == 0 || c >= (A + KV) * D) /* position 0 and v are not turned */
                g_assert_cmpfloat(y[i], ==, x[i]);
        }
    for (int r = 0; r < B * S; r++)
        for (int j = 0; j < A + KV; j++)
            for (int c = 0; c < D / 2; c++) {
                const size_t i = (size_t)r * LD + (size_t)j * D + c, k = i + D / 2;
                g_assert_cmpfloat(fabs(hypot(y[i], y[k]) - hypot(x[i], x[k])), <, 1e-5);
            }
    g_assert_true(be->rope(be, y, B, S, A, KV, D, &whole, true));
    for (size_t i = 0; i < n; i++)
        g_assert_cmpfloat(fabs(y[i] - x[i]), <, 1e-5);
    /* Partial rotary (GPT-NeoX's rotary_pct): only the first 4 of each head's 6 turn, as the
     * double reference turns them. */
    double *yd = to_double(x, n);
    memcpy(y, x, n * sizeof(float));
    const RealRope partial = {.theta = 10000.0f, .rot_dim = 4};
    g_assert_true(be->rope(be, y, B, S, A, KV, D, &partial, false));
    RealGptDims rd = {.seq_len = S, .rope_theta = 10000.0f};
    ref_rope(&rd, yd, B * S, A, KV, D, 4);
    g_assert_cmpfloat(max_abs_diff_fd(y, yd, n), <, 1e-5);
    for (int r = 0; r < B * S; r++)
        for (int j = 0; j < A + KV; j++)
            for (int c = 4; c < D; c++) {
                const size_t i = (size_t)r * LD + (size_t)j * D + c;
                g_assert_cmpfloat(y[i], ==, x[i]);
            }
    g_free(yd);
    g_free(x), g_free(y);
    /* Rescaled frequencies, 8 pairs of 16 dimensions over wavelengths 6 to 20,000 positions:
     * Llama 3.1's rescaling against 2,000 original positions keeps pairs 0-3, blends 4 and 5,
     * divides 6 and 7; linear divides all. */
    enum { D16 = 16, LD16 = (A + 2 * KV) * D16 };
    const size_t n16 = (size_t)B * S * LD16;
    float *x16 = g_new(float, n16);
    fill_normal(&rng, x16, n16, 0.0, 1.0);
    for (int scaling = REAL_ROPE_SCALING_LINEAR; scaling <= REAL_ROPE_SCALING_LLAMA3; scaling++) {
        const RealRope scaled = {.theta = 10000.0f, .rot_dim = D16,
                                 .scaling = (RealRopeScaling)scaling, .factor = 8.0f,
                                 .low_freq_factor = 1.0f, .high_freq_factor = 4.0f,
                                 .original_positions = 2000};
        RealGptDims sd = {.seq_len = S, .rope_theta = 10000.0f,
                          .rope_scaling = (RealRopeScaling)scaling, .rope_factor = 8.0f,
                          .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                          .rope_original_positions = 2000};
        for (int c = 0; c < D16 / 2; c++) {
            const double unscaled = pow(10000.0, -2.0 * c / D16);
            const double ratio = real_rope_inv_freq(&scaled, c) / unscaled;
            g_assert_cmpfloat(fabs(real_rope_inv_freq(&scaled, c) - ref_inv_freq(&sd, D16, c)), <=,
                              1e-12 * unscaled);
            if (scaling == REAL_ROPE_SCALING_LLAMA3)
                g_assert_true(c <= 3   ? ratio == 1.0
                              : c <= 5 ? ratio > 1.0 / 8 && ratio < 1.0
                                       : fabs(ratio - 1.0 / 8) < 1e-15);
        }
        float *y16 = g_memdup2(x16, n16 * sizeof(float));
        double *y16d = to_double(x16, n16);
        g_assert_true(be->rope(be, y16, B, S, A, KV, D16, &scaled, false));
        ref_rope(&sd, y16d, B * S, A, KV, D16, D16);
        g_assert_cmpfloat(max_abs_diff_fd(y16, y16d, n16), <, 1e-5);
        g_free(y16), g_free(y16d);
    }
    g_free(x16);
    RealGptDims d = gradient_dims(GRAD_LLAMA);
    be->rmsnorm_fwd = NULL; /* a backend that has not implemented RMSNorm yet */
    GError *error = NULL;
    g_assert_null(real_gpt_new(be, &d, &error));
    g_assert_cmpstr(error->message, ==, "the cpu backend has no rmsnorm_fwd/bwd yet, which RMSNorm needs");
    g_clear_error(&error);
    be->destroy(be);
}

/* The layout of llama-tiny, the tiny Qwen2, GPT-NeoX and Mistral and the published configs is
 * the planner's, tensor by tensor, and a block keeps exactly the activation bytes the planner
 * counts, eager and fused (a parallel residual keeps one [T,h] tensor fewer). */
static void test_llama_layout_memory(void)
{
    const char *models[] = {"llama-tiny", "hf/llama-2-7b", "hf/llama-2-70b", "hf/qwen2-tiny",
                            "hf/neox-tiny", "hf/qwen2-0.5b", "hf/pythia-160m", "hf/gpt2",
                            "hf/mistral-tiny"};
    for (size_t m = 0; m < G_N_ELEMENTS(models); m++) {
        ZpModel model;
        g_assert_true(zp_model_load(models[m], &model, NULL));
        model.dropout = FALSE; /* GPT-2's config has it; zreal trains without */
        for (int fused = 0; fused <= 1; fused++) {
            ZpPlan plan;
            zp_plan_defaults(&plan, 0, 1, 1);
            plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
            plan.micro_batch = 2;
            plan.attention = fused ? ZP_ATTN_FLASH2 : ZP_ATTN_EAGER;
            RealGptDims dims = real_engine_dims(&model, &plan);
            g_assert_cmpuint(real_gpt_param_elems(&dims), ==, zp_model_param_count(&model));
            GArray *tensors = zp_model_tensors(&model);
            guint k = 0;
            for (int u = 0; u < real_gpt_n_units(&dims); u++) {
                RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
                int n = real_gpt_unit_tensors(&dims, u, t);
                for (int i = 0; i < n; i++, k++) {
                    const ZpTensor *zt = &g_array_index(tensors, ZpTensor, k);
                    g_assert_cmpstr(t[i].name, ==, zt->name);
                    g_assert_cmpuint(t[i].elems, ==, zt->elems);
                }
            }
            g_assert_cmpuint(k, ==, tensors->len);
            g_array_unref(tensors);
            /* A LayerNorm model's both norms' fp32 mean and 1/std, 16 bytes a token, are in
             * the planner's formula too. */
            g_assert_cmpfloat((double)real_gpt_block_activation_bytes(&dims), ==,
                              zp_mem_activation_block_bytes(&model, 2, 1, 2.0, plan.attention));
        }
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_data_func("/real/llama/fresh-gradients", GINT_TO_POINTER(GRAD_LLAMA),
                         test_fresh_gradients);
    g_test_add_data_func("/real/llama/gradients-eager", GINT_TO_POINTER(GRAD_LLAMA),
                         test_model_gradients);
    g_test_add_data_func("/real/llama/gradients-flash", GINT_TO_POINTER(GRAD_LLAMA_FLASH),
                         test_model_gradients);
    g_test_add_data_func("/real/qwen2/gradients", GINT_TO_POINTER(GRAD_QWEN2),
                         test_model_gradients);
    g_test_add_data_func("/real/neox/gradients-eager", GINT_TO_POINTER(GRAD_NEOX),
                         test_model_gradients);
    g_test_add_data_func("/real/neox/gradients-flash", GINT_TO_POINTER(GRAD_NEOX_FLASH),
                         test_model_gradients);
    g_test_add_data_func("/real/geglu/gradients", GINT_TO_POINTER(GRAD_GEGLU),
                         test_model_gradients);
    g_test_add_func("/real/llama/attention-kernels", test_llama_attention_kernels);
    g_test_add_func("/real/mistral/attention-window", test_attention_window);
    g_test_add_func("/real/llama/rope-and-backend-check", test_llama_rope_and_backend);
    g_test_add_func("/real/llama/layout-and-memory", test_llama_layout_memory);
    return g_test_run();
}
