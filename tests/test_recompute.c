/* test_recompute: --recompute none|selective|full against Korthikanti et al. 2022 ("Reducing
 * Activation Recomputation in Large Transformer Models", arXiv 2205.05198): Table 2's
 * activation bytes per layer, Table 3's configurations fitting with sequence parallelism and
 * selective recomputation, and what the recompute op costs. */
#include "testutil.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_search.h"
#include "zp_inventory.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>

/* Korthikanti et al. Table 3 (the runs of Tables 4 and 5): heads, hidden, layers, pipeline
 * stages and batch (tensor parallel 8, sequence 2048, vocabulary 51200; one data-parallel
 * replica, so 8 x pp GPUs and a global batch of as many micro-batches; micro-batch 4 for 22B,
 * 1 otherwise). Checked against a transcription of Table 3 (22B 64/6144/48, TP 8, PP 1, 8 GPUs,
 * batch 4, micro-batch 4; 175B 96/12288/96, PP 8, 64, 64, 1; 530B 128/20480/105, PP 35, 280,
 * 280, 1; 1T 160/25600/128, PP 64, 512, 512, 1); the 530B and 1T shapes, TP 8 with PP 35 and
 * 64 and micro-batch 1 are also those of NVIDIA/Megatron-LM examples/sc21/run_table_1.sh
 * (Narayanan et al. 2021's runs, with larger global batches). */
typedef struct {
    const char *name;
    int heads, hidden, layers, pp, micro, global;
} Config;

static const Config configs[] = {
    {"22b", 64, 6144, 48, 1, 4, 4},
    {"175b", 96, 12288, 96, 8, 1, 64},
    {"530b", 128, 20480, 105, 35, 1, 280},
    {"1t", 160, 25600, 128, 64, 1, 512},
};

/* A GPT of the paper's shape (LayerNorm, GELU MLP 4h, biases, dropout, learned positions). */
static ZpModel config_model(const Config *c)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", c->name, "layers", c->layers,
                          "hidden", c->hidden, "heads", c->heads, "seq_len", 2048, "vocab",
                          51200);
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_from_json(o, c->name, &m, &error));
    g_assert_no_error(error);
    json_decref(o);
    g_assert_true(m.dropout && m.norm == ZP_NORM_LAYERNORM && m.ffn_hidden == 4 * m.hidden);
    return m;
}

/* Table 2, bytes per layer with t = 8, hand-computed from the paper's formulas:
 *   no parallelism               sbh (34 + 5as/h)          (t = 1)
 *   tensor parallel              sbh (10 + 24/t + 5as/(ht))
 *   + sequence parallel          sbh (34/t + 5as/(ht))
 *   tensor parallel + selective  sbh (10 + 24/t)
 *   + sequence parallel          sbh 34/t
 * Ours is each plus the term the paper leaves out: both LayerNorms' fp32 mean and 1/std,
 * 16 sb bytes (PyTorch's native_layer_norm saves them for its backward), over t with
 * sequence parallelism like the norms' inputs. */
static void test_table2(void)
{
    for (size_t i = 0; i < 2; i++) { /* 22B and 175B */
        const Config *c = &configs[i];
        const ZpModel m = config_model(c);
        const double s = 2048, b = c->micro, h = c->hidden, a = c->heads, t = 8;
        const double sbh = s * b * h, ln = 16 * s * b;
        const struct {
            int mp;
            gboolean sp, selective;
            double paper, named;
        } cases[] = {
            {1, FALSE, FALSE, sbh * (34 + 5 * a * s / h), ln},
            {8, FALSE, FALSE, sbh * (10 + 24 / t + 5 * a * s / (h * t)), ln},
            {8, TRUE, FALSE, sbh * (34 / t + 5 * a * s / (h * t)), ln / t},
            {8, FALSE, TRUE, sbh * (10 + 24 / t), ln},
            {8, TRUE, TRUE, sbh * 34 / t, ln / t},
        };
        for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
            ZpPlan p;
            zp_plan_defaults(&p, 0, 1, cases[k].mp);
            p.impl = ZP_IMPL_MEGATRON;
            p.micro_batch = c->micro;
            p.sequence_parallel = cases[k].sp;
            zp_plan_set_recompute(&p, cases[k].selective ? ZP_RECOMPUTE_SELECTIVE
                                                         : ZP_RECOMPUTE_NONE);
            const double ours = zp_mem_plan_activation_block_bytes(&m, &p);
            g_test_message("%s case %zu: ours %.0f, Table 2 %.0f + LayerNorm statistics %.0f",
                           c->name, k, ours, cases[k].paper, cases[k].named);
            g_assert_cmpfloat(fabs(ours - cases[k].paper - cases[k].named), <=, 1e-6 * ours);
            /* what selective recomputation drops is what its backward recomputes */
            const double core = zp_mem_core_attention_bytes(&m, &p);
            g_assert_cmpfloat(core, ==, cases[k].selective
                                            ? 5 * a * s * s * b / (cases[k].mp == 8 ? t : 1)
                                            : 0);
        }
    }
}

/* Table 3's four configurations trained (Table 5) with tensor and sequence parallelism and
 * selective recomputation on 80 GB A100s: they fit as Megatron runs them (--impl megatron,
 * its DDP without the distributed optimizer, 1F1B); without recomputation they do not. */
static void test_table5_fits(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(configs); i++) {
        const Config *c = &configs[i];
        char *path = g_strdup_printf("%s/recompute-%s-%d.json", g_get_tmp_dir(), c->name,
                                     (int)getpid());
        char *text = g_strdup_printf("{\"name\": \"k-%s\", \"layers\": %d, \"hidden\": %d, "
                                     "\"heads\": %d, \"seq_len\": 2048, \"vocab\": 51200}",
                                     c->name, c->layers, c->hidden, c->heads);
        g_assert_true(g_file_set_contents(path, text, -1, NULL));
        for (int selective = 0; selective <= 1; selective++) {
            char *args = g_strdup_printf(
                "simulate --model %s --cluster dgx-a100-80g --gpus %d --mp 8 --pp %d --stage 0 "
                "--micro-batch %d --grad-accum %d --sequence-parallel --attention eager "
                "--impl megatron --recompute %s --json",
                path, 8 * c->pp, c->pp, c->micro, c->global / c->micro,
                selective ? "selective" : "none");
            json_t *j = tu_zplan_json_exit(args, selective ? 0 : 2);
            const double peak = json_number_value(json_object_get(j, "peak_memory_bytes"));
            g_test_message("%s, recompute %s: peak %.1f GiB, step %.2f s", c->name,
                           selective ? "selective" : "none", peak / 1073741824.0,
                           json_number_value(json_object_get(j, "step_time_s")));
            g_assert_true(json_is_true(json_object_get(j, "fits_in_gpu_memory")) == selective);
            json_decref(j);
            g_free(args);
        }
        g_unlink(path);
        g_free(text);
        g_free(path);
    }
}

/* The schedule: selective recomputation adds one recompute op per block and micro-step,
 * core attention's forward alone (4 b s^2 h / t FLOPs, timed at the attention kernel's rate
 * for a fused kernel), its recomputed tensors live from it to the end of the block's
 * backward; full recomputation recomputes the whole block. */
static void test_schedule(void)
{
    const ZpModel m = config_model(&configs[0]);
    ZpPlan p;
    zp_plan_defaults(&p, 1, 1, 8);
    p.impl = ZP_IMPL_MEGATRON;
    p.micro_batch = 4;
    p.grad_accum = 2;
    p.sequence_parallel = TRUE;
    for (int fused = 0; fused <= 1; fused++) {
        p.attention = fused ? ZP_ATTN_FLASH2 : ZP_ATTN_EAGER;
        zp_plan_set_recompute(&p, ZP_RECOMPUTE_SELECTIVE);
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        int recomputes = 0;
        const double core_flops = 4.0 * 4 * 2048.0 * 2048 * 6144 / 8;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
            if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_RECOMPUTE)
                continue;
            recomputes++;
            g_assert_cmpfloat(op->flops, ==, core_flops);
            g_assert_cmpfloat(op->attn_flops, ==, fused ? core_flops : 0);
            g_assert_cmpfloat(op->gemm_flops, ==, 0);
        }
        g_assert_cmpint(recomputes, ==, 48 * 2);
        zp_sched_free(s);
        ZpComputeOps ops[ZP_COMP_N];
        zp_sched_compute_ops(&m, &p, ops);
        g_assert_cmpuint(ops[ZP_COMP_RECOMPUTE].count, ==, 96);
        g_assert_cmpfloat(ops[ZP_COMP_RECOMPUTE].flops, ==, core_flops);
        zp_plan_set_recompute(&p, ZP_RECOMPUTE_FULL);
        zp_sched_compute_ops(&m, &p, ops);
        g_assert_cmpfloat(ops[ZP_COMP_RECOMPUTE].flops, ==, ops[ZP_COMP_BLOCK_FWD].flops);
    }
}

/* The search tries selective recomputation where the implementation has it: every Megatron
 * plan comes in three kinds (none, selective, full), DeepSpeed's in two. */
static void test_search(void)
{
    const ZpModel m = config_model(&configs[0]);
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    for (int impl = 0; impl < 2; impl++) {
        ZpSearchSpec spec;
        zp_search_spec_defaults(&spec, &m, &hw, 8);
        spec.mp = 8;
        spec.stage = 0;
        spec.micro_batch = 4;
        spec.precision = ZP_PREC_BF16;
        spec.impl = impl ? ZP_IMPL_MEGATRON : ZP_IMPL_DEEPSPEED;
        GError *error = NULL;
        GArray *plans = zp_search_enumerate(&spec, &error);
        g_assert_no_error(error);
        int kinds[3] = {0, 0, 0};
        for (guint i = 0; i < plans->len; i++)
            kinds[zp_plan_recompute(&g_array_index(plans, ZpCandidate, i).plan)]++;
        g_test_message("%s: %d plans without recomputation, %d selective, %d full",
                       impl ? "megatron" : "deepspeed", kinds[0], kinds[1], kinds[2]);
        g_assert_cmpint(kinds[0], >, 0);
        g_assert_cmpint(kinds[1], ==, impl ? kinds[0] : 0);
        g_assert_cmpint(kinds[2], >=, kinds[0]);
        g_array_unref(plans);
    }
}

/* The plan's JSON keeps the recomputation and Megatron's overlap_param_gather ("recompute" and
 * "overlap_param_gather", written only when set, so older files read as before). */
static void test_plan_json(void)
{
    ZpPlan p, q;
    zp_plan_defaults(&p, 1, 8, 2);
    p.impl = ZP_IMPL_MEGATRON;
    zp_plan_set_recompute(&p, ZP_RECOMPUTE_SELECTIVE);
    p.overlap_param_gather = TRUE;
    json_t *o = zp_plan_to_json(&p);
    g_assert_cmpstr(json_string_value(json_object_get(o, "recompute")), ==, "selective");
    GError *error = NULL;
    g_assert_true(zp_plan_from_json(o, "plan", &q, &error));
    g_assert_no_error(error);
    g_assert_true(q.selective_recompute && !q.checkpoint && q.overlap_param_gather);
    g_assert_cmpint(q.impl, ==, ZP_IMPL_MEGATRON);
    json_decref(o);
    zp_plan_set_recompute(&p, ZP_RECOMPUTE_NONE);
    p.overlap_param_gather = FALSE;
    o = zp_plan_to_json(&p);
    g_assert_null(json_object_get(o, "recompute"));
    g_assert_null(json_object_get(o, "overlap_param_gather"));
    json_decref(o);
}

/* Priced by Megatron's kernel inventory (a profile with kernel rates), the selective
 * recompute op runs core attention's kernels alone: the fused kernel forward, or eager's
 * scores and context batched GEMMs with the scale-mask-softmax and dropout between them,
 * none of the block's linear layers or norms; full recomputation runs the whole block. */
static void test_inventory(void)
{
    const ZpModel m = config_model(&configs[0]);
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, 8);
    p.impl = ZP_IMPL_MEGATRON;
    p.micro_batch = 4;
    const ZpInventory *inv = zp_inventory_for_plan(&p);
    g_assert_cmpstr(inv->name, ==, "megatron");
    const double core_flops = 4.0 * 4 * 2048.0 * 2048 * 6144 / 8;
    for (int fused = 0; fused <= 1; fused++) {
        p.attention = fused ? ZP_ATTN_FLASH2 : ZP_ATTN_EAGER;
        zp_plan_set_recompute(&p, ZP_RECOMPUTE_SELECTIVE);
        ZpInvList list;
        zp_inventory_op(inv, &m, &p, ZP_COMP_RECOMPUTE, 0, &list);
        ZpInvTotals t;
        zp_inventory_totals(&list, &t);
        g_test_message("%s: %d kernels, GEMM %.3g FLOPs, attention %.3g FLOPs",
                       fused ? "fused" : "eager", list.n, t.gemm_flops, t.attention_flops);
        g_assert_cmpfloat(fused ? t.attention_flops : t.gemm_flops, ==, core_flops);
        g_assert_cmpfloat(fused ? t.gemm_flops : t.attention_flops, ==, 0);
        g_assert_cmpint(list.n, ==, fused ? 1 : 5); /* baddbmm, softmax, dropout, bmm, permute */
        zp_plan_set_recompute(&p, ZP_RECOMPUTE_FULL);
        ZpInvList full, fwd;
        zp_inventory_op(inv, &m, &p, ZP_COMP_RECOMPUTE, 0, &full);
        zp_inventory_op(inv, &m, &p, ZP_COMP_BLOCK_FWD, 0, &fwd);
        g_assert_cmpint(full.n, ==, fwd.n);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/recompute/korthikanti-table2", test_table2);
    g_test_add_func("/recompute/korthikanti-table5-fits", test_table5_fits);
    g_test_add_func("/recompute/schedule", test_schedule);
    g_test_add_func("/recompute/search", test_search);
    g_test_add_func("/recompute/plan-json", test_plan_json);
    g_test_add_func("/recompute/inventory", test_inventory);
    return g_test_run();
}
