/* test_moe: mixtures of experts — Hugging Face MoE configs (Mixtral, Qwen2-MoE, DeepSeek-V3 with
 * its latent attention) counted exactly, total and active, and their bad keys refused. */
#include "testutil.h"
#include "zp_hf.h"
#include "zp_model.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

static void load(const char *name, ZpModel *model)
{
    char *path = g_build_filename(zp_data_dir(), "models", "hf", name, NULL);
    GError *error = NULL;
    gboolean ok = zp_model_load(path, model, &error);
    g_test_message("%s: %s", path, error ? error->message : "ok");
    g_assert_true(ok);
    g_free(path);
}

static uint64_t table_sum(const ZpModel *m)
{
    GArray *t = zp_model_tensors(m);
    uint64_t sum = 0;
    for (guint k = 0; k < t->len; k++)
        sum += g_array_index(t, ZpTensor, k).elems;
    g_array_unref(t);
    return sum;
}

/* Each unit's closed form equals its tensors' sum, whole and split over a tensor group of 4. */
static void assert_units_agree(const ZpModel *m)
{
    GArray *t = zp_model_tensors(m);
    for (int u = 0; u < zp_model_n_units(m); u++) {
        uint64_t sum = 0, tp = 0;
        for (guint k = 0; k < t->len; k++) {
            const ZpTensor *x = &g_array_index(t, ZpTensor, k);
            if (x->unit == u) {
                sum += x->elems;
                tp += zp_model_tensor_tp_elems(m, x, 4);
            }
        }
        g_assert_cmpuint(sum, ==, zp_model_unit_elems(m, u));
        /* The closed form rounds the block's split part up once, the table each tensor. */
        g_assert_cmpuint(tp, >=, zp_model_unit_tp_elems(m, u, 4));
        g_assert_cmpuint(tp, <=, zp_model_unit_tp_elems(m, u, 4) + 16);
    }
    g_array_unref(t);
}

/* Mixtral-8x7B: h 4096, 32 layers, GQA 32/8, 8 experts of 14336, top 2, untied 32000 vocab.
 * A block: attention 2 h^2 + 2 h (8 x 128) = 41,943,040, norms 8,192, router 8 x 4096 = 32,768,
 * experts 8 x 3 x 4096 x 14336 = 1,409,286,144: 1,451,270,144; x 32 + 2 x 32000 x 4096 + 4096
 * = 46,702,792,704. Active: two experts, 394,305,536 a block: 12,879,925,248 (Mistral AI's
 * "12.9B active"). */
static void test_mixtral(void)
{
    ZpModel m;
    load("mixtral-8x7b", &m);
    g_assert_cmpint(m.moe.experts, ==, 8);
    g_assert_cmpint(m.moe.top_k, ==, 2);
    g_assert_cmpint(m.moe.expert_ffn, ==, 14336);
    g_assert_cmpint(m.moe.shared_ffn, ==, 0);
    g_assert_cmpint(zp_moe_sparse_layers(&m.moe, m.layers), ==, 32);
    g_assert_cmpuint(zp_model_param_count(&m), ==, 46702792704ull);
    g_assert_cmpuint(table_sum(&m), ==, 46702792704ull);
    g_assert_cmpuint(zp_model_active_param_count(&m), ==, 12879925248ull);
    g_assert_cmpuint(zp_model_unit_elems(&m, 1), ==, 1451270144ull);
    g_assert_cmpuint(zp_model_unit_expert_elems(&m, 1), ==, 1409286144ull);
    assert_units_agree(&m);
}

/* Qwen1.5-MoE-A2.7B: h 2048, 24 layers, MHA 16 with q, k, v biases, 60 experts of 1408, top 4,
 * a shared expert of 5632 behind a [1, h] gate. A block: attention 4 h^2 + 3 h = 16,783,360,
 * norms 4,096, router 60 h = 122,880, experts 60 x 3 x 2048 x 1408 = 519,045,120, shared
 * 3 x 2048 x 5632 = 34,603,008, gate 2,048: 570,560,512; x 24 + 2 x 151936 x 2048 + 2048 =
 * 14,315,784,192 (Qwen's "14.3B"). Active: 4 experts and the shared one, 86,118,400 a block:
 * 2,689,173,504 ("2.7B activated"). */
static void test_qwen2_moe(void)
{
    ZpModel m;
    load("qwen1.5-moe-a2.7b", &m);
    g_assert_cmpint(m.moe.experts, ==, 60);
    g_assert_cmpint(m.moe.shared_ffn, ==, 5632);
    g_assert_true(m.moe.shared_gate && !m.moe.router_bias);
    g_assert_cmpuint(zp_model_param_count(&m), ==, 14315784192ull);
    g_assert_cmpuint(table_sum(&m), ==, 14315784192ull);
    g_assert_cmpuint(zp_model_active_param_count(&m), ==, 2689173504ull);
    assert_units_agree(&m);
}

/* DeepSeek-V3: h 7168, 61 layers of which the first 3 dense (18432 wide), 256 routed experts of
 * 2048 and one shared, top 8, MLA with ranks 1536 (q) and 512 (kv), 128 heads of 128 + 64 (q, k)
 * and 128 (v). Attention: q_a 7168 x 1536 + 1536 + q_b 1536 x 128 x 192 + kv_a 7168 x 576 + 512
 * + kv_b 512 x 128 x 256 + o 16384 x 7168 = 187,107,328. A dense block 583,483,392; a sparse
 * one 11,507,286,272 (router 256 x 7168 and its 256 biases, 257 experts of 44,040,192). Total
 * 3 x 583,483,392 + 58 x 11,507,286,272 + 2 x 129280 x 7168 + 7168 = 671,026,419,200: the
 * published 671B, which (as the technical report says) leaves out the multi-token-prediction
 * module (num_nextn_predict_layers = 1, 14B more in the 685B checkpoint); zplan does not model
 * it. Active: 9 experts, 585,318,656 a sparse block: 37,552,297,472 against the published 37B
 * (the difference: both embedding tables counted here; without the input embedding, a lookup,
 * 36,625,618,432). */
static void test_deepseek_v3(void)
{
    ZpModel m;
    load("deepseek-v3", &m);
    g_assert_cmpint(m.moe.experts, ==, 256);
    g_assert_cmpint(m.moe.shared_experts, ==, 1);
    g_assert_cmpint(m.moe.shared_ffn, ==, 2048);
    g_assert_cmpint(m.moe.first_dense, ==, 3);
    g_assert_true(m.moe.router_bias && !m.moe.shared_gate);
    g_assert_cmpint(m.mla.kv_lora_rank, ==, 512);
    g_assert_false(zp_model_unit_sparse(&m, 3));
    g_assert_true(zp_model_unit_sparse(&m, 4));
    g_assert_cmpint(zp_moe_sparse_layers(&m.moe, m.layers), ==, 58);
    g_assert_cmpuint(zp_model_unit_elems(&m, 1), ==, 583483392ull);
    g_assert_cmpuint(zp_model_unit_elems(&m, 4), ==, 11507286272ull);
    g_assert_cmpuint(zp_model_param_count(&m), ==, 671026419200ull);
    g_assert_cmpuint(table_sum(&m), ==, 671026419200ull);
    g_assert_cmpuint(zp_model_active_param_count(&m), ==, 37552297472ull);
    assert_units_agree(&m);
}

/* decoder_sparse_step and mlp_only_layers (Qwen2MoeDecoderLayer), moe_layer_freq (DeepSeek):
 * which layers are sparse. */
static void test_sparse_layers(void)
{
    ZpMoe q = {.experts = 4, .top_k = 2, .expert_ffn = 8, .step = 2, .step_phase = 1,
               .n_dense_listed = 1, .dense_listed = {3}};
    const gboolean want_q[] = {FALSE, TRUE, FALSE, FALSE, FALSE, TRUE};
    for (int l = 0; l < 6; l++)
        g_assert_cmpint(zp_moe_layer_sparse(&q, l), ==, want_q[l]);
    ZpMoe d = {.experts = 4, .top_k = 2, .expert_ffn = 8, .first_dense = 1, .step = 2};
    const gboolean want_d[] = {FALSE, FALSE, TRUE, FALSE, TRUE};
    for (int l = 0; l < 5; l++)
        g_assert_cmpint(zp_moe_layer_sparse(&d, l), ==, want_d[l]);
    g_assert_cmpint(zp_moe_sparse_layers(&d, 5), ==, 2);
}

/* A key of a MoE config that is missing, out of range or ill-typed is named. */
static void test_bad_moe_configs(void)
{
    static const struct {
        const char *edit_key, *edit_value, *message;
    } cases[] = {
        {"num_local_experts", NULL, "num_local_experts"},
        {"num_experts_per_tok", "9", "num_experts_per_tok"},
        {"num_local_experts", "0", "num_local_experts"},
        {"num_experts_per_tok", "\"two\"", "num_experts_per_tok"},
    };
    char *path = g_build_filename(zp_data_dir(), "models", "hf", "mixtral-8x7b", "config.json",
                                  NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        json_t *root = json_load_file(path, 0, NULL);
        g_assert_nonnull(root);
        if (cases[i].edit_value)
            json_object_set_new(root, cases[i].edit_key,
                                json_loads(cases[i].edit_value, JSON_DECODE_ANY, NULL));
        else
            json_object_del(root, cases[i].edit_key);
        ZpModel m;
        GError *error = NULL;
        g_assert_false(zp_hf_from_json(root, path, &m, &error));
        g_test_message("%s", error->message);
        g_assert_nonnull(strstr(error->message, cases[i].message));
        g_error_free(error);
        json_decref(root);
    }
    g_free(path);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/moe/mixtral-8x7b", test_mixtral);
    g_test_add_func("/moe/qwen1.5-moe-a2.7b", test_qwen2_moe);
    g_test_add_func("/moe/deepseek-v3", test_deepseek_v3);
    g_test_add_func("/moe/sparse-layers", test_sparse_layers);
    g_test_add_func("/moe/bad-configs", test_bad_moe_configs);
    return g_test_run();
}
