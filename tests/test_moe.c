/* test_moe: mixtures of experts — Hugging Face MoE configs (Mixtral, Qwen2-MoE, DeepSeek-V3 with
 * its latent attention) counted exactly, total and active, and their bad keys refused; expert
 * parallelism's states, tokens, buffers and all-to-all by hand; --ep's refusals. */
#include "testutil.h"
#include "zp_ep.h"
#include "zp_hf.h"
#include "zp_inventory.h"
#include "zp_mem.h"
#include "zp_moe_search.h"
#include "zp_model.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

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

/* Qwen3-30B-A3B: h 2048, 48 layers, 32 heads of 128 (a d = 4096, twice h) and 4 key/value
 * heads, q_norm and k_norm of 128, 128 experts of 768 (SwiGLU), top 8, no shared expert,
 * untied embeddings of 151936. Attention: q 2048 x 4096 + k, v 2048 x 512 each + o 4096 x 2048
 * + 2 x 128 = 18,874,624; a block adds 2 x 2048 norms, the router 128 x 2048 and 128 experts
 * of 3 x 2048 x 768 = 4,718,592: 623,120,640. Total 48 x 623,120,640 + 2 x 151936 x 2048 +
 * 2048 = 30,532,122,624, the published "30.5B" (29,909,792,768 without the two embedding
 * tables: the model card's "29.9B non-embedding"). Active: 8 experts, 56,889,600 a block:
 * 3,353,032,704, the published "3.3B" (both embedding tables counted; 2,730,702,848 without
 * them). Heads of h/a = 64 would give 30,079,131,648, 453M short. */
static void test_qwen3_moe(void)
{
    ZpModel m;
    load("qwen3-30b-a3b", &m);
    g_assert_cmpint(zp_model_head_dim(&m), ==, 128);
    g_assert_cmpint(zp_model_attn_width(&m), ==, 4096);
    g_assert_true(m.qk_norm && !m.tied_embeddings);
    g_assert_cmpint(m.moe.experts, ==, 128);
    g_assert_cmpint(m.moe.top_k, ==, 8);
    g_assert_cmpint(m.moe.expert_ffn, ==, 768);
    g_assert_cmpint(m.moe.shared_ffn, ==, 0);
    g_assert_false(m.moe.shared_gate || m.moe.router_bias);
    g_assert_cmpint(zp_moe_sparse_layers(&m.moe, m.layers), ==, 48);
    g_assert_cmpuint(zp_model_unit_elems(&m, 1), ==, 623120640ull);
    g_assert_cmpuint(zp_model_param_count(&m), ==, 30532122624ull);
    g_assert_cmpuint(table_sum(&m), ==, 30532122624ull);
    g_assert_cmpuint(zp_model_active_param_count(&m), ==, 3353032704ull);
    assert_units_agree(&m);
    /* The block's kernels: core attention at 4 b s^2 a d (b 1, s the config's 40960), the
     * output projection's GEMM reading a d, and the q/k norms over (32 + 4) heads of 128. */
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, 1);
    p.micro_batch = 1;
    p.precision = ZP_PREC_BF16;
    p.attention = ZP_ATTN_FLASH2;
    ZpInvList list;
    zp_inventory_moe_block(&m, &p, 1, FALSE, &list);
    const double s = (double)m.seq_len, T = s;
    gboolean norm = FALSE, proj = FALSE, attention = FALSE;
    for (int k = 0; k < list.n; k++) {
        const ZpInvKernel *x = &list.k[k];
        if (strcmp(x->name, "qk_norm") == 0)
            norm = x->read_bytes == T * 36 * 128 * 2;
        else if (strcmp(x->name, "proj") == 0)
            proj = x->flops == 2 * T * 2048 * 4096;
        else if (strcmp(x->name, "attention_fwd") == 0)
            attention = x->flops == 4 * s * s * 4096;
    }
    g_assert_true(norm && proj && attention);
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

/* The layer keys through zp_hf. Qwen1.5-MoE with decoder_sparse_step 2 and mlp_only_layers [1]:
 * layers 3, 5, ..., 23 sparse (11 of them, Qwen2MoeDecoderLayer's (i + 1) % 2 == 0 less layer
 * 1), 13 dense of 16,783,360 + 4,096 + 3 x 2048 x 5632 = 51,390,464: 622,331,904 +
 * 11 x 570,560,512 + 13 x 51,390,464 = 7,566,573,568. DeepSeek-V3 with moe_layer_freq 2:
 * layers 4, 6, ..., 60 sparse (29): 29 x 11,507,286,272 + 32 x 583,483,392 + 1,853,365,248
 * = 354,236,135,680. */
static void test_layer_keys(void)
{
    static const struct {
        const char *model, *edits;
        int64_t sparse;
        uint64_t params;
    } cases[] = {
        {"qwen1.5-moe-a2.7b", "{\"decoder_sparse_step\": 2, \"mlp_only_layers\": [1]}", 11,
         7566573568ull},
        {"deepseek-v3", "{\"moe_layer_freq\": 2}", 29, 354236135680ull},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *path = g_build_filename(zp_data_dir(), "models", "hf", cases[i].model,
                                      "config.json", NULL);
        json_t *root = json_load_file(path, 0, NULL);
        json_t *edits = json_loads(cases[i].edits, 0, NULL);
        json_object_update(root, edits);
        ZpModel m;
        GError *error = NULL;
        g_assert_true(zp_hf_from_json(root, path, &m, &error));
        g_assert_no_error(error);
        g_assert_cmpint(zp_moe_sparse_layers(&m.moe, m.layers), ==, cases[i].sparse);
        g_assert_cmpuint(zp_model_param_count(&m), ==, cases[i].params);
        g_assert_cmpuint(table_sum(&m), ==, cases[i].params);
        json_decref(edits);
        json_decref(root);
        g_free(path);
    }
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
        /* 1e6 experts of 14336 over 32 layers of 4096: 5.6e18 elements, past the bound that
         * keeps sizes exact in 64 bits. */
        {"num_local_experts", "1000000", "the experts would hold more than 1e+15 elements"},
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

/* tu_small_moe's 2-layer mixture of experts, counted by hand: embeddings 8,192; a block: norms
 * 128, attention 4 h^2 = 16,384, router 256, experts 4 x 3 x 64 x 32 = 24,576: 41,344; the
 * final unit 64 + 8,192. Total 99,136: experts 49,152, dense 49,984.
 * Model states per rank at 8 data-parallel ranks, fp16 Adam (2 + 2 + 12), EP 1, 2 and 4:
 * dense Psi_d = 49,984 under the stage over 8 ranks, experts Psi_e / EP over 8 / EP ranks.
 * E.g. EP 2, stage 1: 4 x 49,984 + 12 x 49,984 / 8 = 274,912 and 4 x 24,576 + 12 x 24,576 / 4
 * = 172,032: 446,944. Stage 3 is 16 (Psi_d + Psi_e) / 8 whatever EP. */
static void test_states_by_hand(void)
{
    ZpModel m;
    tu_small_moe(&m);
    g_assert_cmpuint(zp_model_param_count(&m), ==, 99136);
    g_assert_cmpfloat(zp_ep_expert_params(&m), ==, 49152);
    static const struct {
        int ep;
        double bytes[4];
    } want[] = {
        {1, {1586176, 545248, 371760, 198272}},
        {2, {1192960, 446944, 322608, 198272}},
        {4, {996352, 397792, 298032, 198272}},
    };
    const ZpStateBytes sb = zp_plan_state_bytes(ZP_PREC_FP16, ZP_OPT_ADAM);
    for (size_t i = 0; i < G_N_ELEMENTS(want); i++)
        for (int stage = 0; stage <= 3; stage++) {
            ZpPlan plan;
            zp_plan_defaults(&plan, stage, 8, 1);
            plan.experts.ep = want[i].ep;
            g_assert_true(zp_ep_check(&m, &plan, "--ep", NULL));
            const ZpEpStates s = zp_ep_model_states(&m, &plan, stage, sb);
            g_test_message("EP %d stage %d: %.0f", want[i].ep, stage, s.total.total_bytes);
            g_assert_cmpfloat(s.total.total_bytes, ==, want[i].bytes[stage]);
            g_assert_cmpfloat(s.expert_params, ==, 49152.0 / want[i].ep);
            g_assert_cmpfloat(s.dense_params, ==, 49984);
        }
}

/* A sparse layer's tokens and buffers, micro-batch 1, fp16: T = 16, T k = 32. Dropless and
 * balanced R = 32: router 4 T E + 8 T k = 512, dispatch (32 + 32) x 64 x 2 = 8,192, experts
 * R (h + 3 f_e) 2 = 10,240, combine's kept outputs 32 x 64 x 2 = 4,096. Capacity factor 1.25:
 * ceil(32 / 4 x 1.25) = 10 an expert, R = 40. Dropless with skew 1.5: R = 48. */
static void test_tokens_by_hand(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan plan;
    zp_plan_defaults(&plan, 1, 8, 1);
    ZpEpActivations a = zp_ep_activations(&m, &plan);
    g_assert_cmpfloat(a.tokens, ==, 16);
    g_assert_cmpfloat(a.routed_tokens, ==, 32);
    g_assert_cmpfloat(a.received_tokens, ==, 32);
    g_assert_cmpfloat(a.router_bytes, ==, 512);
    g_assert_cmpfloat(a.dispatch_bytes, ==, 8192);
    g_assert_cmpfloat(a.combine_bytes, ==, 8192);
    g_assert_cmpfloat(a.expert_act_bytes, ==, 10240);
    g_assert_cmpfloat(a.combine_act_bytes, ==, 4096);
    /* Both layers sparse: the attention's share (the block at f = 0) and the MoE terms. */
    ZpModel attention_only = m;
    attention_only.ffn_hidden = 0;
    const double attention = zp_mem_plan_activation_block_bytes(&attention_only, &plan);
    g_assert_cmpfloat(a.sparse_layer_bytes, ==, attention + 512 + 10240 + 4096);
    g_assert_cmpfloat(a.activations_bytes, ==, 2 * a.sparse_layer_bytes);
    /* The residual carries them: all layers' activations and one layer's buffers. */
    const ZpResidual r = zp_mem_residual(&m, &plan, NULL);
    g_assert_cmpfloat(r.activations_bytes, ==, a.activations_bytes);
    g_assert_cmpfloat(r.moe_buffer_bytes, ==, 8192);
    /* Checkpointed, the one block recomputed is the larger of the two kinds. */
    ZpPlan ckpt = plan;
    ckpt.checkpoint = TRUE;
    const ZpResidual rc = zp_mem_residual(&m, &ckpt, NULL);
    g_assert_cmpfloat(rc.recompute_bytes, ==, a.sparse_layer_bytes);
    g_assert_cmpfloat(rc.activations_bytes, ==, 0);
    plan.experts.capacity_factor = 1.25;
    a = zp_ep_activations(&m, &plan);
    g_assert_cmpfloat(a.expert_capacity, ==, 10);
    g_assert_cmpfloat(a.received_tokens, ==, 40);
    g_assert_cmpfloat(a.dispatch_bytes, ==, (40 + 40) * 128); /* [E, C, h] sent, as received */
    g_assert_cmpfloat(a.expert_act_bytes, ==, 40 * 160 * 2);
    plan.experts.capacity_factor = 0;
    plan.experts.skew = 1.5;
    a = zp_ep_activations(&m, &plan);
    g_assert_cmpfloat(a.received_tokens, ==, 48);
}

/* The all-to-all at EP 4, TP 1, on nodes of 2 GPUs (NVLink 100 GB/s a GPU, 50 GB/s a node's
 * NICs, no latency): a rank sends T k h e = 4,096 bytes, a quarter to each rank of its group:
 * 1,024 to its node's other GPU, 2,048 to the two on the other node. NVLink takes
 * 1,024 / 1e11 s; the NICs carry both GPUs' 2,048: 4,096 / 5e10 = 81.92 ns, which sets the
 * time. Four a layer (dispatch and combine, forward and backward), two layers: 24,576 bytes a
 * step; six with checkpointing. Skew 1.5 dropless: the busiest rank moves 6,144. */
static void test_alltoall_by_hand(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan plan;
    zp_plan_defaults(&plan, 2, 8, 1);
    plan.experts.ep = 4;
    ZpHw hw = {.gpus_per_node = 2, .intra_node_bytes_per_s = 100e9,
               .inter_node_bytes_per_s = 50e9};
    ZpEpAlltoall x = zp_ep_alltoall(&m, &plan, &hw);
    g_assert_cmpfloat(x.send_bytes, ==, 4096);
    g_assert_cmpfloat(x.intra_bytes, ==, 1024);
    g_assert_cmpfloat(x.inter_bytes, ==, 2048);
    g_assert_cmpfloat_with_epsilon(x.time_s, 4096.0 / 50e9, 1e-18);
    g_assert_cmpint(x.calls_per_layer, ==, 4);
    g_assert_cmpfloat(x.step_bytes, ==, 4 * 2 * 3072);
    plan.checkpoint = TRUE;
    g_assert_cmpint(zp_ep_alltoall(&m, &plan, &hw).calls_per_layer, ==, 6);
    plan.checkpoint = FALSE;
    plan.experts.skew = 1.5;
    g_assert_cmpfloat(zp_ep_alltoall(&m, &plan, &hw).send_bytes, ==, 6144);
    /* A capacity factor of 0.5 pads each expert to ceil(32 / 4 x 0.5) = 4 tokens from a rank
     * and drops the rest: 4 experts x 4 x 64 x 2 = 2,048 bytes, whatever the skew. */
    plan.experts.capacity_factor = 0.5;
    g_assert_cmpfloat(zp_ep_alltoall(&m, &plan, &hw).send_bytes, ==, 2048);
    plan.experts.capacity_factor = 0;
    /* One node holding the whole group: NVLink alone. EP 1: nothing to send. */
    plan.experts.skew = 1;
    hw.gpus_per_node = 8;
    x = zp_ep_alltoall(&m, &plan, &hw);
    g_assert_cmpfloat(x.intra_bytes, ==, 3072);
    g_assert_cmpfloat(x.inter_bytes, ==, 0);
    g_assert_cmpfloat_with_epsilon(x.time_s, 3072 / 100e9, 1e-18);
    plan.experts.ep = 1;
    g_assert_cmpfloat(zp_ep_alltoall(&m, &plan, &hw).step_bytes, ==, 0);
}

/* EP must divide the experts and the data-parallel degree, and needs experts: one line each,
 * naming the flag; the CLI exits 1 with it. */
static void test_ep_refusals(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan plan;
    zp_plan_defaults(&plan, 0, 8, 1);
    static const struct {
        int ep, dp;
        gboolean dense;
        const char *message;
    } cases[] = {
        {3, 6, FALSE, "--ep: 3 does not divide the 4 experts of moe-2l"},
        {4, 2, FALSE, "--ep: 4 does not divide the data-parallel degree 2"},
        {2, 8, TRUE, "--ep: 2 needs a mixture of experts"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpModel model = m;
        if (cases[i].dense)
            model.moe.experts = 0;
        plan.experts.ep = cases[i].ep, plan.dp = cases[i].dp;
        GError *error = NULL;
        g_assert_false(zp_ep_check(&model, &plan, "--ep", &error));
        g_test_message("%s", error->message);
        g_assert_true(g_str_has_prefix(error->message, cases[i].message));
        g_assert_null(strchr(error->message, '\n'));
        g_error_free(error);
    }
    static const struct {
        const char *args, *message;
    } cli[] = {
        /* Megatron splits experts over TP, EP over dp; DeepSpeed keeps them whole, EP over
         * a stage's TP x DP ranks */
        {"memory --model hf/mixtral-8x7b --gpus 32 --mp 8 --ep 8 --impl megatron",
         "--ep: 8 does not divide the data-parallel degree 4"},
        {"memory --model hf/mixtral-8x7b --gpus 4 --mp 2 --ep 8",
         "--ep: 8 does not divide the 4 ranks of a stage (TP 2 x DP 2"},
        {"memory --model hf/mixtral-8x7b --gpus 64 --ep 3",
         "--ep: 3 does not divide the 8 experts"},
        {"memory --model hf/mixtral-8x7b --gpus 64 --ep 0", "--ep"},
        {"memory --model hf/mixtral-8x7b --gpus 64 --expert-skew 0.5", "--expert-skew"},
        {"memory --model hf/llama-3-8b --gpus 8 --capacity-factor 1.25",
         "--capacity-factor: llama-3-8b is not a mixture of experts"},
        {"plan --model hf/llama-3-8b --cluster dgx-h100 --gpus 8 --ep 2",
         "--ep: llama-3-8b is not a mixture of experts"},
        /* Schedules refuse what they do not model for a mixture of experts. */
        {"simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 8 --stage 2 --seq 512 "
         "--micro-batch 1 --impl fsdp",
         "impl: --impl fsdp and fsdp2 have no expert parallelism"},
        {"simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 8 --stage 3 --seq 512 "
         "--micro-batch 1 --ep 2 --quantized-weights",
         "zero: ZeRO++ (qwZ, qgZ, hpZ) with a mixture of experts is not scheduled"},
        {"simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 8 --stage 2 --seq 512 "
         "--micro-batch 1 --ep 2 --offload-optimizer cpu",
         "offload: offloading a mixture of experts' states is not scheduled"},
        {"simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 8 --stage 3 --seq 512 "
         "--micro-batch 1 --ep 3",
         "ep: 3 does not divide the 8 experts of mixtral-8x7b"},
        /* beside --ds-config, --ep is the model code's (deepspeed.moe.layer.MoE's ep_size) */
        {"simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 8 --seq 512 "
         "--ep 3 --ds-config tests/data/ds_config/dse_leaf_zero3.json",
         "--ep: 3 does not divide the 8 experts of mixtral-8x7b"},
        {"plan --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 64 --seq 512 "
         "--offload-optimizer cpu",
         "--offload-*: not yet for a mixture of experts"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cli); i++)
        tu_zplan_refused(cli[i].args, cli[i].message);
}

/* `zplan memory` on Mixtral-8x7B at 64 GPUs, TP 8, EP 8, experts split over TP (the paper's
 * layout, Megatron's default): each rank holds one expert of each layer split 8 ways,
 * 32 x 176,160,768 / 8 = 704,643,072 elements, whose 16 bytes each (over an expert
 * data-parallel group of 1) are the expert states at every stage. DeepSpeed keeps experts
 * whole (zp_plan_etp): its EP group 8 consecutive ranks across the tensor group, each rank one
 * whole expert of each layer, 8 times as many elements, over an expert data-parallel group of
 * 8 (64 / 8): 8 x the expert states at stage 0, the same at stage 3. */
static void test_memory_mixtral(void)
{
    const double dense = (46702792704.0 - 32 * 8 * 176160768.0) / 8;
    const double expert = 32 * 176160768.0 / 8;
    json_t *ds = tu_zplan_json("memory --model hf/mixtral-8x7b --gpus 64 --mp 8 --ep 8 --json");
    json_t *whole = json_array_get(json_object_get(ds, "rows"), 0);
    g_assert_cmpfloat_with_epsilon(json_number_value(json_object_get(whole, "stage0")),
                                   16 * (dense + 8 * expert), 1);
    g_assert_cmpfloat_with_epsilon(json_number_value(json_object_get(whole, "stage3")),
                                   16 * dense / 8 + 16 * expert, 1);
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(whole, "moe"),
                                                        "expert_params_per_rank")),
                      ==, 8 * expert);
    json_decref(ds);
    json_t *root =
        tu_zplan_json("memory --model hf/mixtral-8x7b --gpus 64 --mp 8 --ep 8 --impl paper --json");
    json_t *row = json_array_get(json_object_get(root, "rows"), 0);
    g_assert_cmpfloat_with_epsilon(json_number_value(json_object_get(row, "stage0")),
                                   16 * (dense + expert), 1);
    g_assert_cmpfloat_with_epsilon(json_number_value(json_object_get(row, "stage3")),
                                   16 * dense / 8 + 16 * expert, 1);
    /* The expert-parallel section: one expert of each layer a rank; a sparse layer of 4096
     * tokens (the default sequence: the smaller of the config's 32768 and 4096) sends
     * 2 x 4096 x 4096 x 2 bytes in each all-to-all. */
    json_t *moe = json_object_get(row, "moe");
    g_assert_cmpint(json_integer_value(json_object_get(moe, "ep")), ==, 8);
    g_assert_cmpfloat(json_number_value(json_object_get(moe, "expert_params_per_rank")), ==,
                      expert);
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(moe, "alltoall"),
                                                        "send_bytes")),
                      ==, 2.0 * 4096 * 4096 * 2);
    json_decref(root);
}

/* Latent attention's saved tensors, per token, 16-bit: q_a's and its norm's outputs (r_q = 16
 * each), kv_a's (r_kv + d_rope = 8 + 4) and its norm's (8), whole on every tensor rank; Q and K
 * of H (8 + 4) = 48, V and the output of H 8 = 32 each, split over t: 16 + 16 + 12 + 8 = 52
 * whole, 160 split, instead of the fused qkv's Q, K, V and output, 4 h = 256 split. At TP 1:
 * 16 tokens x 2 bytes x (52 + 160 - 256) = -1,408 bytes a layer; at TP 2: 32 x (52 - 48) =
 * 128. */
static void test_mla_activations(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpModel mla = m;
    mla.mla = (ZpMla){.q_lora_rank = 16, .kv_lora_rank = 8, .qk_nope_dim = 8, .qk_rope_dim = 4,
                      .v_dim = 8};
    for (int t = 1; t <= 2; t++) {
        ZpPlan plan;
        zp_plan_defaults(&plan, 1, 8, t);
        const ZpEpActivations a = zp_ep_activations(&m, &plan);
        const ZpEpActivations b = zp_ep_activations(&mla, &plan);
        const double want = t == 1 ? -1408.0 : 128.0;
        g_assert_cmpfloat(b.sparse_layer_bytes - a.sparse_layer_bytes, ==, want);
        g_assert_cmpfloat(b.dense_layer_bytes - a.dense_layer_bytes, ==, want);
        /* Checkpointed, the block recomputed is latent attention's too. */
        plan.checkpoint = TRUE;
        const ZpEpActivations c = zp_ep_activations(&mla, &plan);
        g_assert_cmpfloat(zp_mem_residual(&mla, &plan, NULL).recompute_bytes, ==,
                          fmax(c.sparse_layer_bytes, c.dense_layer_bytes));
    }
}

/* plan's search for a mixture of experts (Mixtral-8x7B, 64 H100s, 512 x 4096 tokens a step):
 * every candidate a plan the rules allow, judged consistently; the fitting first, fastest
 * first; the skew slows every plan; the all-to-all costs only where EP > 1 (DeepSpeed's
 * all-gathers of the dropped slots over TP count with the tensor group's collectives). */
static void test_search_mixtral(void)
{
    ZpModel m;
    load("mixtral-8x7b", &m);
    m.seq_len = 4096;
    ZpHw hw = tu_load_hw("dgx-h100");
    ZpSearchSpec spec;
    zp_search_spec_defaults(&spec, &m, &hw, 64);
    spec.global_batch = 512;
    GError *error = NULL;
    GArray *c = zp_moe_search_run(&spec, 1.0, 0.0, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(c->len, >, 0);
    gboolean fitting = TRUE;
    double last_rate = INFINITY;
    for (guint i = 0; i < c->len; i++) {
        const ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        const ZpPlan *p = &x->plan;
        g_assert_cmpint(p->dp * p->mp * zp_plan_pp(p), ==, 64);
        g_assert_cmpint(8 % zp_plan_ep(p), ==, 0);
        /* EP from dp, or with DeepSpeed's whole experts over TP from a stage's TP x DP */
        g_assert_cmpint((zp_plan_etp(p) == 1 ? p->mp * p->dp : p->dp) % zp_plan_ep(p), ==, 0);
        g_assert_cmpint(8 % p->mp, ==, 0);
        g_assert_cmpint((int64_t)p->dp * p->micro_batch * p->grad_accum, ==, 512);
        g_assert_true(zp_ep_check(&m, p, "--ep", NULL));
        g_assert_cmpfloat(x->memory_bytes, ==, x->states_bytes + x->residual_bytes);
        g_assert_cmpint(x->fits, ==, x->memory_bytes <= hw.gpu_memory_bytes);
        g_assert_cmpfloat(x->step_s, >=, x->compute_s + x->tp_s + x->alltoall_s);
        g_assert_cmpfloat_with_epsilon(x->tokens_per_s * x->step_s, 512.0 * 4096, 1e-3);
        g_assert_cmpint(x->alltoall_s > 0, ==, zp_plan_ep(p) > 1);
        if (!x->fits)
            fitting = FALSE;
        else
            g_assert_true(fitting); /* no fitting plan after one that does not fit */
        if (x->fits) {
            g_assert_cmpfloat(x->tokens_per_s, <=, last_rate);
            last_rate = x->tokens_per_s;
        }
    }
    const ZpMoeCandidate best = g_array_index(c, ZpMoeCandidate, 0);
    g_assert_true(best.fits);
    g_test_message("best: EP %d TP %d stage %d micro %d accum %d ckpt %d: %.1f GB, %.3f s, "
                   "a2a %.3f s, %.0f tokens/s", zp_plan_ep(&best.plan), best.plan.mp,
                   best.plan.zero.stage, best.plan.micro_batch, best.plan.grad_accum,
                   best.plan.checkpoint, best.memory_bytes / 1e9, best.step_s, best.alltoall_s,
                   best.tokens_per_s);
    /* The same plans with the busiest expert at twice the mean: each is slower. */
    GArray *skewed = zp_moe_search_run(&spec, 2.0, 0.0, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(skewed->len, ==, c->len);
    for (guint i = 0; i < skewed->len; i++) {
        const ZpMoeCandidate *y = &g_array_index(skewed, ZpMoeCandidate, i);
        for (guint j = 0; j < c->len; j++) {
            const ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, j);
            if (zp_plan_ep(&x->plan) == zp_plan_ep(&y->plan) && x->plan.mp == y->plan.mp &&
                zp_plan_etp(&x->plan) == zp_plan_etp(&y->plan) &&
                zp_plan_pp(&x->plan) == zp_plan_pp(&y->plan) &&
                x->plan.zero.stage == y->plan.zero.stage &&
                x->plan.micro_batch == y->plan.micro_batch &&
                x->plan.checkpoint == y->plan.checkpoint)
                g_assert_cmpfloat(y->compute_s, >, x->compute_s);
        }
    }
    g_array_unref(skewed);
    g_array_unref(c);
    /* Under Megatron every TP > 1 plan runs with sequence parallelism (MoELayer.forward
     * refuses to train without it); DeepSpeed's plans have none. */
    for (int megatron = 0; megatron <= 1; megatron++) {
        spec.impl = megatron ? ZP_IMPL_MEGATRON : ZP_IMPL_DEEPSPEED;
        GArray *e = zp_moe_search_run(&spec, 1.0, 0.0, &error);
        g_assert_no_error(error);
        guint split = 0;
        for (guint i = 0; i < e->len; i++) {
            const ZpPlan *p = &g_array_index(e, ZpMoeCandidate, i).plan;
            g_assert_cmpint(p->sequence_parallel, ==, megatron && p->mp > 1);
            split += p->mp > 1;
        }
        g_assert_cmpuint(split, >, 0);
        g_array_unref(e);
    }
    spec.impl = ZP_IMPL_DEEPSPEED;
    /* Latent attention is timed by its own projections (DeepSeek-V3 gets a step), a dense
     * model is refused in one line. */
    ZpModel ds;
    load("deepseek-v3", &ds);
    ds.seq_len = 4096;
    spec.model = &ds;
    GArray *d = zp_moe_search_run(&spec, 1.0, 0.0, &error);
    g_assert_no_error(error);
    const ZpMoeCandidate *dbest = &g_array_index(d, ZpMoeCandidate, 0);
    g_assert_true(isfinite(dbest->step_s) && dbest->compute_s > 0 && dbest->tokens_per_s > 0);
    g_array_unref(d);
    ZpModel dense;
    load("llama-3-8b", &dense);
    spec.model = &dense;
    g_assert_null(zp_moe_search_run(&spec, 1.0, 0.0, &error));
    g_assert_nonnull(strstr(error->message, "not a mixture of experts"));
    g_assert_null(strchr(error->message, '\n'));
    g_clear_error(&error);
}

/* plan tries pipelines: an 8-block MoE whose dense part dominates (h 256, 4 heads, 4 experts
 * of f_e 8, top 2, s 16) on 4 GPUs at stage 1, TP 1, the paper's ZeRO, no runtime reserve.
 * A block: attention 4 h^2 = 262,144, two RMSNorms 512, the router 4 h = 1,024 (263,680
 * dense), experts 4 x 3 x 256 x 8 = 24,576; the embedding and the untied head 128 x 256 =
 * 32,768 each, the final norm 256. Without a pipeline (dp 4) the dense states are at least
 * 4 + 12/4 = 7 bytes an element of 2,205,952 (15.4 MB); PP 4 (dp 1, two blocks a stage) keeps
 * 16 bytes of the first stage's 32,768 + 2 x 288,256 = 609,280 (9,748,480 B of states; with
 * activations and buffers 12.5 MB, PP 2 16.7 MB, PP 1 25.7 MB). With 14 MB a GPU only PP 4 fits, and the search's best is one; without a global batch (no
 * micro-batches to fill a pipeline) none is tried and nothing fits. */
static void test_search_tries_pipelines(void)
{
    ZpModel m;
    memset(&m, 0, sizeof m);
    g_strlcpy(m.name, "moe-8l", sizeof m.name);
    m.layers = 8, m.hidden = 256, m.heads = 4, m.seq_len = 16, m.vocab = 128;
    m.ffn_hidden = 8, m.mlp = ZP_MLP_SWIGLU, m.norm = ZP_NORM_RMSNORM;
    m.no_bias = ZP_NO_BIAS_QKV | ZP_NO_BIAS_PROJ | ZP_NO_BIAS_MLP;
    m.rope_theta = 10000, m.rotary_fraction = 1;
    m.moe = (ZpMoe){.experts = 4, .top_k = 2, .expert_ffn = 8, .step = 1};
    g_assert_cmpuint(zp_model_param_count(&m), ==, 8 * (263680 + 24576) + 2 * 32768 + 256);
    ZpHw hw = tu_load_hw("dgx-h100");
    hw.runtime_reserve_bytes = 0;
    hw.gpu_memory_bytes = 14e6;
    ZpSearchSpec spec;
    zp_search_spec_defaults(&spec, &m, &hw, 4);
    spec.stage = 1, spec.mp = 1, spec.impl = ZP_IMPL_PAPER, spec.micro_batch = 1;
    spec.global_batch = 16;
    GError *error = NULL;
    GArray *c = zp_moe_search_run(&spec, 1.0, 0.0, &error);
    g_assert_no_error(error);
    gboolean pp4 = FALSE;
    for (guint i = 0; i < c->len; i++) {
        const ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        const ZpPlan *p = &x->plan;
        g_assert_cmpint(p->dp * zp_plan_pp(p), ==, 4);
        g_assert_cmpint(p->grad_accum, >=, zp_plan_pp(p)); /* micro-batches fill the pipe */
        if (zp_plan_pp(p) == 1)
            g_assert_false(x->fits);
        if (zp_plan_pp(p) == 4) {
            g_assert_cmpfloat_with_epsilon(x->states_bytes, 16.0 * 609280, 1e-3);
            pp4 = TRUE;
        }
    }
    g_assert_true(pp4);
    const ZpMoeCandidate *best = &g_array_index(c, ZpMoeCandidate, 0);
    g_assert_true(best->fits);
    g_assert_cmpint(zp_plan_pp(&best->plan), >, 1);
    g_test_message("best: PP %d EP %d: %.2f MB, %.3g s", zp_plan_pp(&best->plan),
                   zp_plan_ep(&best->plan), best->memory_bytes / 1e6, best->step_s);
    g_array_unref(c);
    spec.global_batch = 0;
    c = zp_moe_search_run(&spec, 1.0, 0.0, &error);
    g_assert_no_error(error);
    for (guint i = 0; i < c->len; i++) {
        const ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        g_assert_cmpint(zp_plan_pp(&x->plan), ==, 1);
        g_assert_false(x->fits);
    }
    g_array_unref(c);
}

/* A skewed dropless router still sends whole tokens: the busiest rank's R is routed x skew
 * rounded up (2 x 16 x 2 = 64 copies at skew 1.2: 77, not 76.8), and a pipeline of the tiny
 * MoE under DeepSpeed at skew 1.2 (which once left -1.8e-12 bytes of ep_buffers live at the
 * peak: fractional bytes allocated and freed) reports whole, non-negative bytes. */
static void test_skew_whole_tokens(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 1);
    p.micro_batch = 2, p.experts.ep = 2, p.experts.skew = 1.2;
    const ZpEpActivations a = zp_ep_activations(&m, &p);
    g_assert_cmpfloat(a.routed_tokens, ==, 64);
    g_assert_cmpfloat(a.received_tokens, ==, 77);
    p.experts.skew = 1.5; /* exact products are not rounded up further */
    g_assert_cmpfloat(zp_ep_activations(&m, &p).received_tokens, ==, 96);
    json_t *j = tu_zplan_json("simulate --model moe-tiny --cluster h100-measured --gpus 8 "
                              "--stage 1 --micro-batch 1 --mp 2 --pp 2 --expert-skew 1.2 --json");
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(j, "peak_breakdown"), key, v) {
        const double bytes = json_number_value(v);
        g_assert_cmpfloat(bytes, >=, 0);
        g_assert_cmpfloat(bytes, ==, floor(bytes));
    }
    json_decref(j);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/moe/mixtral-8x7b", test_mixtral);
    g_test_add_func("/moe/qwen1.5-moe-a2.7b", test_qwen2_moe);
    g_test_add_func("/moe/qwen3-30b-a3b", test_qwen3_moe);
    g_test_add_func("/moe/deepseek-v3", test_deepseek_v3);
    g_test_add_func("/moe/sparse-layers", test_sparse_layers);
    g_test_add_func("/moe/layer-keys", test_layer_keys);
    g_test_add_func("/moe/bad-configs", test_bad_moe_configs);
    g_test_add_func("/ep/states-by-hand", test_states_by_hand);
    g_test_add_func("/ep/tokens-by-hand", test_tokens_by_hand);
    g_test_add_func("/ep/alltoall-by-hand", test_alltoall_by_hand);
    g_test_add_func("/ep/mla-activations", test_mla_activations);
    g_test_add_func("/ep/refusals", test_ep_refusals);
    g_test_add_func("/ep/memory-mixtral", test_memory_mixtral);
    g_test_add_func("/ep/search-mixtral", test_search_mixtral);
    g_test_add_func("/ep/search-tries-pipelines", test_search_tries_pipelines);
    g_test_add_func("/ep/skew-whole-tokens", test_skew_whole_tokens);
    return g_test_run();
}
