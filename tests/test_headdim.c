/* test_headdim: a head dimension apart from hidden / heads (Qwen3, Gemma, Mistral-Nemo) — the
 * projections' shapes, counts, FLOPs, activations and kernels by hand; equal to h/a, nothing moves. */
#include "testutil.h"
#include "zp_hf.h"
#include "zp_inventory.h"
#include "zp_mem.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>

/* llama-tiny: h 128, 8 heads of 16, 2 key/value heads, SwiGLU of 352, RMSNorm, no biases. */
static ZpModel tiny(int64_t head_dim, gboolean qk_norm)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("llama-tiny", &m, &error));
    m.head_dim = head_dim;
    m.qk_norm = qk_norm;
    return m;
}

static ZpPlan plan_for(int mp, ZpAttention attention)
{
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, mp);
    p.micro_batch = 1;
    p.precision = ZP_PREC_BF16;
    p.attention = attention;
    return p;
}


static uint64_t tensor_elems(const ZpModel *m, const char *name, int unit)
{
    GArray *t = zp_model_tensors(m);
    uint64_t elems = 0;
    for (guint k = 0; k < t->len; k++) {
        const ZpTensor *x = &g_array_index(t, ZpTensor, k);
        if (x->unit == unit && strcmp(x->name, name) == 0)
            elems = x->elems;
    }
    g_array_unref(t);
    return elems;
}

static const ZpInventory *const inventories[] = {&zp_inventory_eager, &zp_inventory_megatron,
                                                 &zp_inventory_deepspeed};

/* head_dim = h/a given explicitly: every count, table row, activation term and kernel equal. */
static void test_equal_is_identical(void)
{
    const ZpModel a = tiny(0, FALSE), b = tiny(16, FALSE);
    g_assert_cmpuint(zp_model_param_count(&a), ==, zp_model_param_count(&b));
    g_assert_cmpuint(zp_model_param_count(&a), ==, 1401472);
    for (int mp = 1; mp <= 2; mp++)
        for (int u = 0; u < zp_model_n_units(&a); u++)
            g_assert_cmpuint(zp_model_unit_tp_elems(&a, u, mp), ==,
                             zp_model_unit_tp_elems(&b, u, mp));
    GArray *ta = zp_model_tensors(&a), *tb = zp_model_tensors(&b);
    g_assert_cmpuint(ta->len, ==, tb->len);
    g_assert_cmpint(memcmp(ta->data, tb->data, ta->len * sizeof(ZpTensor)), ==, 0);
    g_array_unref(ta);
    g_array_unref(tb);
    const ZpAttention attentions[] = {ZP_ATTN_EAGER, ZP_ATTN_FLASH2};
    for (size_t k = 0; k < G_N_ELEMENTS(attentions); k++) {
        const ZpPlan p = plan_for(2, attentions[k]);
        g_assert_cmpfloat(zp_mem_plan_activation_block_bytes(&a, &p), ==,
                          zp_mem_plan_activation_block_bytes(&b, &p));
        for (size_t i = 0; i < G_N_ELEMENTS(inventories); i++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const ZpComputeKind kind = bwd ? ZP_COMP_BLOCK_BWD : ZP_COMP_BLOCK_FWD;
                const ZpInvTotals x = tu_inv_totals(inventories[i], &a, &p, kind);
                const ZpInvTotals y = tu_inv_totals(inventories[i], &b, &p, kind);
                g_assert_cmpint(memcmp(&x, &y, sizeof x), ==, 0);
            }
    }
}

/* A Llama config whose head_dim equals hidden / heads reads as the same model as without it;
 * one apart from it is kept, and heads need not divide the hidden size then. */
static void test_hf_head_dim(void)
{
    char *dir = g_dir_make_tmp("zplan-headdim-XXXXXX", NULL);
    static const char keys[] =
        "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 4096, "
        "\"num_hidden_layers\": 2, \"intermediate_size\": 11008, \"vocab_size\": 32000, "
        "\"max_position_embeddings\": 4096, \"num_attention_heads\": 32";
    const char *extra[] = {"", ", \"head_dim\": 128", ", \"head_dim\": 160"};
    json_t *dumps[3];
    ZpModel m[3];
    for (int i = 0; i < 3; i++) {
        char *path = g_build_filename(dir, "config.json", NULL);
        char *text = g_strdup_printf("{%s%s}", keys, extra[i]);
        g_assert_true(g_file_set_contents(path, text, -1, NULL));
        GError *error = NULL;
        g_assert_true(zp_model_load(path, &m[i], &error));
        dumps[i] = zp_model_to_json(&m[i]);
        g_remove(path);
        g_free(path);
        g_free(text);
    }
    g_assert_true(json_equal(dumps[0], dumps[1]));
    g_assert_false(json_equal(dumps[0], dumps[2]));
    g_assert_cmpint(m[1].head_dim, ==, 0);
    g_assert_cmpint(m[2].head_dim, ==, 160);
    g_assert_cmpint(zp_model_attn_width(&m[2]), ==, 5120);
    /* q [4096, 5120] and k, v [4096, 5120] each (MHA): qkv 4096 x 15360; o 5120 x 4096. */
    g_assert_cmpuint(tensor_elems(&m[2], "qkv.weight", 1), ==, 4096ull * 15360);
    g_assert_cmpuint(tensor_elems(&m[2], "proj.weight", 1), ==, 5120ull * 4096);
    for (int i = 0; i < 3; i++)
        json_decref(dumps[i]);
    g_rmdir(dir);
    g_free(dir);
}

/* llama-tiny with heads of 32 (a d = 256 against h = 128): q 128 x 256, k and v 128 x 64 each,
 * o 256 x 128. A block: 2 x 128 norms + 128 x 384 + 256 x 128 + 3 x 128 x 352 = 217,344
 * (176,384 with heads of 16); q_norm and k_norm add 2 x 32. */
static void test_counts_by_hand(void)
{
    const ZpModel m = tiny(32, FALSE), q = tiny(32, TRUE);
    g_assert_cmpint(zp_model_qkv_width(&m), ==, 384);
    g_assert_cmpuint(tensor_elems(&m, "qkv.weight", 1), ==, 128 * 384);
    g_assert_cmpuint(tensor_elems(&m, "proj.weight", 1), ==, 256 * 128);
    g_assert_cmpuint(zp_model_unit_elems(&m, 1), ==, 217344);
    g_assert_cmpuint(zp_model_unit_elems(&q, 1), ==, 217344 + 64);
    g_assert_cmpuint(tensor_elems(&q, "qkv.q_norm.weight", 1), ==, 32);
    g_assert_cmpuint(tensor_elems(&q, "qkv.k_norm.weight", 1), ==, 32);
    /* Over a tensor group of 2 the norms stay whole: 256 + 64 + (217,344 - 256) / 2. */
    g_assert_cmpuint(zp_model_unit_tp_elems(&q, 1, 2), ==, 256 + 64 + (217344 - 256) / 2);
    const uint64_t ends = zp_model_unit_elems(&m, 0) + zp_model_unit_elems(&m, 3);
    g_assert_cmpuint(zp_model_param_count(&m), ==, ends + 2 * 217344);
    g_assert_cmpuint(zp_model_param_count(&q), ==, ends + 2 * (217344 + 64));
}

/* FLOPs and bytes against heads of 16, b 1, s 64, T 64, one rank: the GEMMs gain
 * 2 T h (384 - 192) for qkv and 2 T (256 - 128) h for o, 5,242,880; the fused attention's
 * 4 b s^2 a d doubles; Korthikanti's Q and attention-output terms (2 s b a d bytes each in
 * bf16) add 2 x 2 x 64 x 128 and K and V (2 s b k d each) 2 x 2 x 64 x 32: 40,960 bytes. */
static void test_flops_and_bytes_by_hand(void)
{
    const ZpModel a = tiny(0, FALSE), m = tiny(32, FALSE);
    const ZpPlan p = plan_for(1, ZP_ATTN_FLASH2);
    g_assert_cmpfloat(zp_mem_plan_activation_block_bytes(&m, &p) -
                          zp_mem_plan_activation_block_bytes(&a, &p), ==, 40960);
    for (size_t i = 0; i < G_N_ELEMENTS(inventories); i++) {
        const ZpInvTotals x = tu_inv_totals(inventories[i], &a, &p, ZP_COMP_BLOCK_FWD);
        const ZpInvTotals y = tu_inv_totals(inventories[i], &m, &p, ZP_COMP_BLOCK_FWD);
        g_test_message("%s: gemm %g -> %g, attention %g -> %g", inventories[i]->name,
                       x.gemm_flops, y.gemm_flops, x.attention_flops, y.attention_flops);
        g_assert_cmpfloat(y.gemm_flops - x.gemm_flops, ==, 5242880);
        g_assert_cmpfloat(y.attention_flops, ==, 2 * x.attention_flops);
        g_assert_cmpfloat(x.attention_flops, ==, 4.0 * 64 * 64 * 128);
    }
    /* q_norm and k_norm over the (8 + 2) heads of 32, T 64, bf16: q and k are 40,960 bytes;
     * read and written forward, read twice and written backward. */
    const ZpModel q = tiny(32, TRUE);
    for (size_t i = 0; i < G_N_ELEMENTS(inventories); i++)
        for (int bwd = 0; bwd < 2; bwd++) {
            const ZpComputeKind kind = bwd ? ZP_COMP_BLOCK_BWD : ZP_COMP_BLOCK_FWD;
            const ZpInvTotals x = tu_inv_totals(inventories[i], &m, &p, kind);
            const ZpInvTotals y = tu_inv_totals(inventories[i], &q, &p, kind);
            g_assert_cmpfloat(y.memory_bytes - x.memory_bytes, ==, (bwd ? 3 : 2) * 40960.0);
            g_assert_cmpfloat(y.gemm_flops, ==, x.gemm_flops);
        }
}

/* The schedule's block ops: llama-tiny's forward with heads of 32 gains the GEMMs' 5,242,880
 * FLOPs and core attention's 4 b s^2 (a d - h) = 2,097,152. Qwen3-30B-A3B's sparse block (s
 * 1024, T 1024) against heads of h/a = 64: qkv 2 T h (5120 - 2560), o 2 T (4096 - 2048) h,
 * attention 4 s^2 (4096 - 2048). */
static void test_schedule_ops(void)
{
    const ZpModel a = tiny(0, FALSE), m = tiny(32, FALSE);
    const ZpPlan p = plan_for(1, ZP_ATTN_FLASH2);
    ZpComputeOps x[ZP_COMP_N], y[ZP_COMP_N];
    zp_sched_compute_ops(&a, &p, x);
    zp_sched_compute_ops(&m, &p, y);
    g_assert_cmpfloat(y[ZP_COMP_BLOCK_FWD].flops - x[ZP_COMP_BLOCK_FWD].flops, ==,
                      5242880.0 + 2097152.0);
    g_assert_cmpfloat(y[ZP_COMP_BLOCK_FWD].attn_flops, ==, 2 * x[ZP_COMP_BLOCK_FWD].attn_flops);

    char *path = g_build_filename(zp_data_dir(), "models", "hf", "qwen3-30b-a3b", NULL);
    ZpModel q, q64;
    g_assert_true(zp_model_load(path, &q, NULL));
    g_free(path);
    q.seq_len = 1024;
    q64 = q;
    q64.head_dim = 0;
    double f, f64, bytes, bytes64;
    g_assert_true(zp_sched_unit_block_op(&q, &p, 1, ZP_COMP_BLOCK_FWD, &f, &bytes));
    g_assert_true(zp_sched_unit_block_op(&q64, &p, 1, ZP_COMP_BLOCK_FWD, &f64, &bytes64));
    const double T = 1024;
    g_assert_cmpfloat(f - f64, ==,
                      2 * T * 2048 * 2560 + 2 * T * 2048 * 2048 + 4 * T * T * 2048);
}

/* zreal's GPT has heads of h/a and no q/k norms: one line, exit 1, before it trains. */
static void test_zreal_refuses(void)
{
    char *dir = g_dir_make_tmp("zplan-headdim-XXXXXX", NULL);
    char *path = g_build_filename(dir, "hd-tiny.json", NULL);
    char *src = g_build_filename(zp_data_dir(), "models", "llama-tiny.json", NULL);
    char *text = NULL;
    g_assert_true(g_file_get_contents(src, &text, NULL, NULL));
    GString *spec = g_string_new(text);
    g_string_replace(spec, "\"name\": \"llama-tiny\"", "\"name\": \"hd-tiny\", \"head_dim\": 32",
                     1);
    g_assert_true(g_file_set_contents(path, spec->str, -1, NULL));
    char *cmd = g_strdup_printf("%s/zreal --model %s --steps 1 --emulate 1", ZP_BUILD_DIR, path);
    TuRun r = tu_run(cmd, NULL);
    g_test_message("%s", r.err);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "zreal runs heads of hidden / heads without q/k norms; hd-tiny "
                                   "has head_dim 32"));
    tu_free(&r);
    g_remove(path);
    g_rmdir(dir);
    g_free(cmd);
    g_string_free(spec, TRUE);
    g_free(text);
    g_free(src);
    g_free(path);
    g_free(dir);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/headdim/equal-is-identical", test_equal_is_identical);
    g_test_add_func("/headdim/hf", test_hf_head_dim);
    g_test_add_func("/headdim/counts-by-hand", test_counts_by_hand);
    g_test_add_func("/headdim/flops-and-bytes-by-hand", test_flops_and_bytes_by_hand);
    g_test_add_func("/headdim/schedule-ops", test_schedule_ops);
    g_test_add_func("/headdim/zreal-refuses", test_zreal_refuses);
    return g_test_run();
}
