/* test_memory: the planner's memory and communication model against the ZeRO paper's
 * Tables 1 and 2 at the paper's own rounding, and the models' parameter counts. */
#include "zp_comm.h"
#include "zp_mem.h"
#include "zp_model.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

static const ZpStateBytes fp16_adam = {2, 2, 12};

/* Decimal places in a printed number: "52.5" -> 1, "4187" -> 0. */
static int decimals(const char *printed)
{
    const char *dot = strchr(printed, '.');
    return dot ? (int)strlen(dot + 1) : 0;
}

/* Table 1 of the paper, per-device GB (1e9), columns Pos, Pos+g, Pos+g+p. */
static const struct {
    double params;
    gboolean truncated; /* 128B and 1T columns are truncated; 7.5B is rounded */
    const char *cells[6][3];
} table1[] = {
    {7.5e9, FALSE, {{"120", "120", "120"}, {"52.5", "41.3", "30"}, {"35.6", "21.6", "7.5"},
                    {"31.4", "16.6", "1.88"}, {"30.4", "15.4", "0.47"}, {"30.1", "15.1", "0.12"}}},
    {128e9, TRUE, {{"2048", "2048", "2048"}, {"896", "704", "512"}, {"608", "368", "128"},
                   {"536", "284", "32"}, {"518", "263", "8"}, {"513", "257", "2"}}},
    {1e12, TRUE, {{"16000", "16000", "16000"}, {"7000", "5500", "4000"},
                  {"4750", "2875", "1000"}, {"4187", "2218", "250"}, {"4046", "2054", "62.5"},
                  {"4011", "2013", "15.6"}}},
};
static const int table1_dp[6] = {1, 4, 16, 64, 256, 1024};

static void test_table1(void)
{
    int checked = 0;
    for (size_t m = 0; m < G_N_ELEMENTS(table1); m++)
        for (int row = 0; row < 6; row++)
            for (int stage = 1; stage <= 3; stage++) {
                const char *printed = table1[m].cells[row][stage - 1];
                const double paper = g_ascii_strtod(printed, NULL);
                const double unit = pow(10, -decimals(printed));
                const double ours = zp_mem_model_states(table1[m].params, stage,
                                                        table1_dp[row], 1, fp16_adam)
                                        .total_bytes / 1e9;
                if (table1[m].truncated) {
                    g_assert_cmpfloat(ours, >=, paper - 1e-9);
                    g_assert_cmpfloat(ours, <, paper + unit);
                } else {
                    g_assert_cmpfloat(fabs(ours - paper), <=, unit / 2 + 1e-9);
                }
                checked++;
            }
    g_assert_cmpint(checked, ==, 54);
}

/* The exact figures for 7.5B at N = 64. */
static void test_exact_7_5b(void)
{
    const double expected[4] = {120e9, 31.40625e9, 16.640625e9, 1.875e9};
    for (int stage = 0; stage <= 3; stage++) {
        ZpModelStates m = zp_mem_model_states(7.5e9, stage, 64, 1, fp16_adam);
        g_assert_cmpfloat(m.total_bytes, ==, expected[stage]);
        g_assert_cmpfloat(m.params_bytes + m.grads_bytes + m.optim_bytes, ==, m.total_bytes);
    }
    /* Per term at stage 2: 2 psi + 2 psi/N + 12 psi/N. */
    ZpModelStates m = zp_mem_model_states(7.5e9, 2, 64, 1, fp16_adam);
    g_assert_cmpfloat(m.params_bytes, ==, 15e9);
    g_assert_cmpfloat(m.grads_bytes, ==, 2 * 7.5e9 / 64);
    g_assert_cmpfloat(m.optim_bytes, ==, 12 * 7.5e9 / 64);
}

/* Table 2, theoretical columns: DP 64, 32e9 bytes per GPU, MP 1..16. The paper multiplies
 * its rounded MP-1 row by MP, so the tolerance is MP x half a unit of the MP-1 cell plus
 * half a unit of the cell itself. */
static void test_table2(void)
{
    const char *rows[5][4] = {{"2", "7.6", "14.4", "128"},
                              {"4", "15.2", "28.8", "256"},
                              {"8", "30.4", "57.6", "500"},
                              {"16", "60.8", "115.2", "1000"},
                              {"32", "121.6", "230.4", "2000"}};
    /* Cell print units in billions: "0.5T" and "1T", "2T" are printed to 0.1T / 1T. */
    const double own_unit[5][4] = {{1, .1, .1, 1}, {1, .1, .1, 1}, {1, .1, .1, 100},
                                   {1, .1, .1, 1000}, {1, .1, .1, 1000}};
    const double mp1_unit[4] = {1, .1, .1, 1};
    for (int r = 0; r < 5; r++) {
        const int mp = 1 << r;
        for (int stage = 0; stage <= 3; stage++) {
            const double ours = zp_mem_max_params(32e9, stage, 64, mp, fp16_adam) / 1e9;
            const double paper = g_ascii_strtod(rows[r][stage], NULL);
            const double tol = mp * mp1_unit[stage] / 2 + own_unit[r][stage] / 2;
            g_assert_cmpfloat(fabs(ours - paper), <=, tol + 1e-9);
        }
    }
    /* And exactly: stage 3 at DP 64 fits 32e9 / (16/64) = 128e9 parameters per MP rank. */
    g_assert_cmpfloat(zp_mem_max_params(32e9, 3, 64, 1, fp16_adam), ==, 128e9);
}

/* K from precision and optimizer. */
static void test_state_bytes_table(void)
{
    const struct {
        ZpPrecision p;
        ZpOptimizer o;
        double param, grad, optim;
    } cases[] = {
        {ZP_PREC_FP16, ZP_OPT_ADAM, 2, 2, 12},    {ZP_PREC_BF16, ZP_OPT_ADAM, 2, 2, 12},
        {ZP_PREC_FP32, ZP_OPT_ADAM, 4, 4, 8},     {ZP_PREC_FP16, ZP_OPT_SGD_MOMENTUM, 2, 2, 8},
        {ZP_PREC_FP32, ZP_OPT_SGD_MOMENTUM, 4, 4, 4}, {ZP_PREC_FP16, ZP_OPT_SGD, 2, 2, 4},
        {ZP_PREC_FP32, ZP_OPT_SGD, 4, 4, 0},
        {ZP_PREC_BF16, ZP_OPT_ADAM_8BIT, 2, 2, 6 + 8.0 / 2048},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpStateBytes b = zp_plan_state_bytes(cases[i].p, cases[i].o);
        g_assert_cmpfloat(b.param_bytes, ==, cases[i].param);
        g_assert_cmpfloat(b.grad_bytes, ==, cases[i].grad);
        g_assert_cmpfloat(b.optim_bytes, ==, cases[i].optim);
    }
    /* fp32 Adam at stage 3 over 8 ranks: 16 psi / 8 = 2 bytes per parameter. */
    ZpModelStates m = zp_mem_model_states(1e9, 3, 8, 1, zp_plan_state_bytes(ZP_PREC_FP32, ZP_OPT_ADAM));
    g_assert_cmpfloat(m.total_bytes, ==, 2e9);
    /* Tensor parallelism divides the states: MP 4 at stage 0 is 16 psi / 4. */
    g_assert_cmpfloat(zp_mem_model_states(8e9, 0, 1, 4, fp16_adam).total_bytes, ==, 32e9);
}

static void test_comm_volume(void)
{
    const double psi = 1e9;
    g_assert_cmpfloat(zp_comm_dp_bytes_per_rank(psi, 0, 1, 1, 2, 2), ==, 0);
    for (int n = 2; n <= 1024; n *= 4) {
        const double s0 = zp_comm_dp_bytes_per_rank(psi, 0, n, 1, 2, 2);
        g_assert_cmpfloat(s0, ==, 2 * psi * (n - 1) / n * 2);
        g_assert_cmpfloat(zp_comm_dp_bytes_per_rank(psi, 1, n, 1, 2, 2), ==, s0);
        g_assert_cmpfloat(zp_comm_dp_bytes_per_rank(psi, 2, n, 1, 2, 2), ==, s0);
        g_assert_cmpfloat(zp_comm_dp_bytes_per_rank(psi, 3, n, 1, 2, 2) / s0, ==, 1.5);
    }
    ZpModel m = {.seq_len = 1024, .hidden = 1000};
    /* MP 2: each all-reduce of b s h elements sends half of them; 4 all-reduces. */
    g_assert_cmpfloat(zp_comm_tp_bytes_per_block(&m, 2, 2, FALSE, 2), ==,
                      4 * 2 * 0.5 * 2 * 1024 * 1000 * 2.0);
    g_assert_cmpfloat(zp_comm_tp_bytes_per_block(&m, 2, 1, TRUE, 2), ==, 0);
    /* The vocab-parallel embedding and head: two all-reduces of b s h and 8 bytes a token. */
    g_assert_cmpfloat(zp_comm_tp_bytes_vocab(&m, 2, 2, 2), ==,
                      2 * 2 * 0.5 * 2 * 1024 * 1000 * 2.0 + 8.0 * 2 * 1024);
    g_assert_cmpfloat(zp_comm_tp_bytes_vocab(&m, 2, 1, 2), ==, 0);
}

/* Independent count: the textbook GPT formula L(12h^2 + 13h) + Vh + sh + 2h (f = 4h,
 * tied), the tensor table's sum, and the published size within 2%. */
static void test_param_counts(void)
{
    char *dir = g_build_filename(zp_data_dir(), "models", NULL);
    GDir *d = g_dir_open(dir, 0, NULL);
    g_assert_nonnull(d);
    const char *entry;
    int models = 0;
    while ((entry = g_dir_read_name(d))) {
        if (!g_str_has_suffix(entry, ".json"))
            continue;
        char *path = g_build_filename(dir, entry, NULL);
        ZpModel m;
        GError *error = NULL;
        g_assert_true(zp_model_load(path, &m, &error));
        g_assert_no_error(error);
        const double L = m.layers, h = m.hidden, V = m.vocab, s = m.seq_len, f = m.ffn_hidden;
        const double kd = (double)zp_model_kv_heads(&m) * (double)zp_model_head_dim(&m);
        /* GPT-2 blocks, or Llama blocks (SwiGLU, RMSNorm, no biases, rotary positions). */
        const gboolean llama = m.mlp == ZP_MLP_SWIGLU;
        g_assert_true(llama ? m.norm == ZP_NORM_RMSNORM && m.no_bias == 7 && !m.learned_positions
                            : m.norm == ZP_NORM_LAYERNORM && m.no_bias == 0 && kd == h);
        /* A mixture of experts (moe-tiny, every layer sparse): E SwiGLU experts and the
         * router [h, E] in place of the MLP. */
        const double E = (double)m.moe.experts, fe = (double)m.moe.expert_ffn;
        const double mlp = zp_moe_enabled(&m.moe) ? E * 3 * h * fe + h * E : 3 * h * f;
        const double textbook =
            llama ? L * (2 * h * h + 2 * h * kd + mlp + 2 * h) + V * h + h +
                        (m.tied_embeddings ? 0 : V * h)
                  : L * (4 * h * h + 2 * h * f + 9 * h + f) + V * h +
                        (m.learned_positions ? s * h : 0) + 2 * h + (m.tied_embeddings ? 0 : V * h);
        const uint64_t count = zp_model_param_count(&m);
        g_assert_cmpfloat((double)count, ==, textbook);
        GArray *tensors = zp_model_tensors(&m);
        uint64_t sum = 0;
        for (guint i = 0; i < tensors->len; i++)
            sum += g_array_index(tensors, ZpTensor, i).elems;
        g_array_unref(tensors);
        g_assert_cmpuint(sum, ==, count);
        if (m.published_params > 0)
            g_assert_cmpfloat(fabs((double)count / m.published_params - 1), <=, 0.02);
        g_free(path);
        models++;
    }
    g_dir_close(d);
    g_free(dir);
    g_assert_cmpint(models, >=, 9);
    /* Two published exact counts (Hugging Face gpt2 and gpt2-xl). */
    ZpModel m;
    g_assert_true(zp_model_load("gpt2-124m", &m, NULL));
    g_assert_cmpuint(zp_model_param_count(&m), ==, 124439808);
    g_assert_true(zp_model_load("gpt2-1.5b", &m, NULL));
    g_assert_cmpuint(zp_model_param_count(&m), ==, 1557611200);
    g_assert_true(zp_model_load("llama-tiny", &m, NULL));
    g_assert_cmpuint(zp_model_param_count(&m), ==, 1401472);
}

/* Activation memory: Korthikanti's sbh(34 + 5as/h) at t = 1 with dropout, plus the two
 * LayerNorms' fp32 mean and 1/std, 16sb, which the paper leaves out and PyTorch keeps; the
 * checkpointed total is L checkpoints of 2sbh plus one recomputed block. */
static void test_activation_terms(void)
{
    ZpModel m;
    g_assert_true(zp_model_load("gpt2-1.5b", &m, NULL));
    const double s = 1024, b = 4, h = 1600, a = 25;
    g_assert_cmpfloat(fabs(zp_mem_activation_block_bytes(&m, 4, 1, 2, ZP_ATTN_EAGER) -
                           s * b * h * (34 + 5 * a * s / h) - 16 * s * b), <, 1e-3);
    m.dropout = FALSE;
    g_assert_cmpfloat(fabs(zp_mem_activation_block_bytes(&m, 4, 1, 2, ZP_ATTN_EAGER) -
                           s * b * h * (32 + 2 * a * s / h) - 16 * s * b), <, 1e-3);
    m.dropout = TRUE;
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 64, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.micro_batch = 4;
    plan.checkpoint = TRUE;
    ZpResidual r = zp_mem_residual(&m, &plan, NULL);
    g_assert_cmpfloat(r.activations_bytes, ==, 0);
    g_assert_cmpfloat(r.checkpoint_bytes, ==, 48 * 2 * s * b * h);
    g_assert_cmpfloat(r.recompute_bytes, ==, r.activation_block_bytes);
    /* Stage 3 buffers: one 5e8-element bucket capped by the model; prefetch + largest unit. */
    g_assert_cmpfloat(r.reduce_bucket_bytes, ==, 5e8 * 2);
    g_assert_cmpfloat(r.allgather_bucket_bytes, ==, 0);
    /* The tied embedding (82M) kept from the head to its backward, a block (31M) and the
     * 5e7-element prefetch. */
    const double embed = (double)zp_model_unit_elems(&m, 0), block = (double)zp_model_unit_elems(&m, 1);
    g_assert_cmpfloat(r.stage3_gathered_bytes, ==, (embed + block + 5e7) * 2);
    /* Stage 1 with overlap_comm doubles the gradient bucket (DeepSpeed's ipg buffers). */
    zp_plan_defaults(&plan, 1, 64, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.zero.overlap_comm = TRUE;
    r = zp_mem_residual(&m, &plan, NULL);
    g_assert_cmpfloat(r.reduce_bucket_bytes, ==, 2 * 5e8 * 2);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/memory/table1-54-cells", test_table1);
    g_test_add_func("/memory/exact-7.5b-at-64", test_exact_7_5b);
    g_test_add_func("/memory/table2-theoretical", test_table2);
    g_test_add_func("/memory/state-bytes-by-precision-optimizer", test_state_bytes_table);
    g_test_add_func("/memory/activation-and-buffer-terms", test_activation_terms);
    g_test_add_func("/comm/volume-by-stage", test_comm_volume);
    g_test_add_func("/model/param-counts", test_param_counts);
    return g_test_run();
}
