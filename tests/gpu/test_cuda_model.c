/* test_cuda_model: a whole model micro-step (real_gpt forward and backward) on the CUDA
 * backend against the CPU backend, for each block zreal trains: GPT-2, Llama (eager and
 * flash), Qwen2, NeoX (eager and flash), GeGLU. */
#include "gpu_testutil.h"

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
    if (!gpu_testutil_init("test_cuda_model"))
        return 1;
    static const char *const step_name[STEP_N] = {"gpt2", "llama", "llama-flash", "qwen2",
                                                  "neox", "neox-flash", "geglu"};
    for (int i = 0; i < STEP_N; i++) {
        char *path = g_strdup_printf("/cuda/model_step/%s", step_name[i]);
        g_test_add_data_func(path, GINT_TO_POINTER(i), test_model_step);
        g_free(path);
    }
    return gpu_testutil_run();
}
