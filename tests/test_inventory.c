/* test_inventory: the frameworks' kernel inventories — per-block bytes against a hand count for
 * a GPT-2 and a Llama block, their GEMM FLOPs equal to the schedule's model FLOPs exactly, the
 * selection by name and by implementation, and `zplan simulate --kernels`. */
#include "testutil.h"
#include "zp_inventory.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

/* GPT-2 style: h 16, 2 heads (d 8), f 64, V 32, s 8, dropout; Llama style: h 16, 4 heads
 * (d 4) and 2 key/value heads, SwiGLU of 32, RMSNorm, rotary, no biases, untied. */
static const char *const gpt2_json =
    "{\"name\": \"gpt2-hand\", \"layers\": 2, \"hidden\": 16, \"heads\": 2, \"seq_len\": 8, "
    "\"vocab\": 32, \"ffn_hidden\": 64, \"dropout\": true}";
static const char *const llama_json =
    "{\"name\": \"llama-hand\", \"layers\": 2, \"hidden\": 16, \"heads\": 4, \"kv_heads\": 2, "
    "\"seq_len\": 8, \"vocab\": 32, \"ffn_hidden\": 32, \"mlp\": \"swiglu\", \"norm\": "
    "\"rmsnorm\", \"qkv_bias\": false, \"proj_bias\": false, \"mlp_bias\": false, "
    "\"tied_embeddings\": false, \"learned_positions\": false, \"rope_theta\": 10000, "
    "\"dropout\": false}";

static ZpModel model_from(const char *text)
{
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    g_assert_nonnull(j);
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_from_json(j, "test", &m, &error));
    g_assert_no_error(error);
    json_decref(j);
    return m;
}

static ZpPlan plan_for(int micro_batch, int mp)
{
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, mp);
    p.micro_batch = micro_batch;
    p.precision = ZP_PREC_BF16;
    return p;
}


/* Forward bytes of one GPT-2 block (b 2, s 8: t 16 tokens, e 2 bytes; scores b a s^2 = 256).
 * Megatron: two fused layer norms (read t h e + 2 h e, write t h e + 8 t: 1,216 each), the qkv
 * bias add (read t q e + q e, write t q e: 3,168), the fused causal scale-mask-softmax (896:
 * row i reads 4 ceil((i + 1) / 4) of the 8 scores, 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8 = 48 of 64
 * for each of b a = 4 heads, 384 bytes, and writes all 512), the attention dropout (read 512, write 512 + a 256-byte mask: 1,280), the context permute
 * (1,024), two bias-dropout-adds (read 2 t h e + h e, write t h e + t h mask: 1,824 each) and
 * the fused bias-GeLU (read t f e + f e, write t f e: 4,224): 16,672 bytes.
 * DeepSpeed (the module in 16 bits as eager runs it): two layer norms (2,432), the scale
 * (1,024), torch.where with the s^2 bool mask (1,088), softmax (1,024), attention dropout
 * (1,280), merge heads (1,024), two residual dropouts (2,560), two residual adds (read 4 t h,
 * write 2 t h bytes: 1,536 each) and gelu_new's six unary and two binary kernels over t f
 * (6 x 4,096 + 2 x 6,144 = 36,864): 50,368 bytes. */
static void test_gpt2_block_bytes(void)
{
    const ZpModel m = model_from(gpt2_json);
    const ZpPlan p = plan_for(2, 1);
    g_assert_cmpfloat(tu_inv_totals(&zp_inventory_megatron, &m, &p, ZP_COMP_BLOCK_FWD).memory_bytes, ==,
                      16672);
    g_assert_cmpfloat(tu_inv_totals(&zp_inventory_deepspeed, &m, &p, ZP_COMP_BLOCK_FWD).memory_bytes,
                      ==, 50368);
}

/* Forward bytes of one Llama block (b 1, s 8: t 8, e 2; 4 heads of 4, 2 key/value heads;
 * scores 256; f 32).
 * Megatron: two fused RMSNorms (read t h e + h e, write t h e + 8 t: 608 each), rotary on q
 * (2 x 128 x 2 = 512) and k (256), the key/value heads repeated (read 256, write 512), the
 * causal softmax (896: 48 of 64 scores read for each of 4 heads, all written), the context
 * permute (512), two bias-dropout-adds without bias or dropout (768 each) and the fused SwiGLU
 * (read 2 t f e, write t f e: 1,536): 7,232 bytes.
 * Eager under autocast (fp32 residual stream and parameters): two RMSNorms of six kernels in
 * fp32 (pow 1,024, mean 544, the eps add and rsqrt 64 each, the product 1,056, the weight
 * 1,088: 3,840 each), the casts of the fp32 norm output into q_proj, k_proj and v_proj (768
 * each: autocast caches no activation's cast) and into gate_proj and up_proj (768 each), of the
 * q, k, v, o, gate, up and down weights (1,536, 768, 768, 1,536, 3,072, 3,072, 3,072), rotary's
 * five kernels on q (3,072) and k (1,536), repeat_kv (768), the scale (1,024), the additive
 * mask (1,152), softmax into fp32 and back (1,536 + 1,536), the transpose (512), two residual
 * adds of bf16 into fp32 (1,280 each), SiLU (1,024) and the gate product (1,536): 41,600
 * bytes. */
static void test_llama_block_bytes(void)
{
    const ZpModel m = model_from(llama_json);
    const ZpPlan p = plan_for(1, 1);
    g_assert_cmpfloat(tu_inv_totals(&zp_inventory_megatron, &m, &p, ZP_COMP_BLOCK_FWD).memory_bytes, ==,
                      7232);
    g_assert_cmpfloat(tu_inv_totals(&zp_inventory_eager, &m, &p, ZP_COMP_BLOCK_FWD).memory_bytes, ==,
                      41600);
}

/* FLOPs of a GPT-2 block by hand: GEMMs 2 t (h q + h^2 + h f + f h) = 32 x 3,072 = 98,304 and
 * the attention's two batched GEMMs 4 b s^2 h = 8,192 forward, twice both backward. */
static void test_gpt2_block_flops(void)
{
    const ZpModel m = model_from(gpt2_json);
    const ZpPlan p = plan_for(2, 1);
    const ZpInventory *const all[] = {&zp_inventory_eager, &zp_inventory_megatron,
                                      &zp_inventory_deepspeed};
    for (size_t i = 0; i < G_N_ELEMENTS(all); i++) {
        g_assert_cmpfloat(tu_inv_totals(all[i], &m, &p, ZP_COMP_BLOCK_FWD).gemm_flops, ==, 98304 + 8192);
        g_assert_cmpfloat(tu_inv_totals(all[i], &m, &p, ZP_COMP_BLOCK_BWD).gemm_flops, ==,
                          2 * (98304 + 8192));
    }
}

/* The inventory's GEMM and attention FLOPs equal the schedule's model FLOPs (zp_sched's block,
 * head and embedding ops) exactly, for each framework, both models, eager and fused attention
 * and a tensor degree of 1 and 2. */
static void test_flops_equal_model(void)
{
    const char *const models[] = {gpt2_json, llama_json};
    const ZpInventory *const all[] = {&zp_inventory_eager, &zp_inventory_megatron,
                                      &zp_inventory_deepspeed};
    const ZpComputeKind kinds[] = {ZP_COMP_EMBED_FWD, ZP_COMP_BLOCK_FWD, ZP_COMP_HEAD,
                                   ZP_COMP_BLOCK_BWD, ZP_COMP_EMBED_BWD};
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++)
        for (int mp = 1; mp <= 2; mp++)
            for (int fused = 0; fused <= 1; fused++) {
                const ZpModel m = model_from(models[mi]);
                ZpPlan p = plan_for(2, mp);
                p.attention = fused ? ZP_ATTN_FLASH2 : ZP_ATTN_EAGER;
                ZpComputeOps ops[ZP_COMP_N];
                zp_sched_compute_ops(&m, &p, ops);
                for (size_t i = 0; i < G_N_ELEMENTS(all); i++)
                    for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++) {
                        const ZpInvTotals t = tu_inv_totals(all[i], &m, &p, kinds[k]);
                        g_assert_cmpfloat(t.gemm_flops + t.attention_flops, ==,
                                          ops[kinds[k]].flops);
                        g_assert_cmpfloat(t.attention_flops, ==, ops[kinds[k]].attn_flops);
                    }
            }
}

/* Every kernel of every op has a source, a class and positive bytes or FLOPs; the optimizers'
 * bytes per element: eager's clipping and AdamW 96 (ten foreach kernels), DeepSpeed's step 2 + 4 + 4 + 8 +
 * 28 + 4 + 2 = 52 with bf16, Megatron's 4 + 28 + 4 + 2 + 4 = 42 with bf16 (50 with fp16's
 * unscale). */
static void test_sources_and_optimizer(void)
{
    const ZpModel m = model_from(gpt2_json);
    ZpPlan p = plan_for(2, 1);
    const ZpInventory *const all[] = {&zp_inventory_eager, &zp_inventory_megatron,
                                      &zp_inventory_deepspeed};
    const double per_elem[] = {96, 42, 52};
    for (size_t i = 0; i < G_N_ELEMENTS(all); i++) {
        for (int k = 0; k < ZP_COMP_N; k++) {
            ZpInvList list;
            zp_inventory_op(all[i], &m, &p, (ZpComputeKind)k, 1000, &list);
            for (int j = 0; j < list.n; j++) {
                g_assert_nonnull(list.k[j].source);
                g_assert_cmpuint(strlen(list.k[j].source), >, 10);
                g_assert_true(list.k[j].read_bytes + list.k[j].write_bytes + list.k[j].flops > 0);
            }
        }
        g_assert_cmpfloat(tu_inv_totals(all[i], &m, &p, ZP_COMP_OPTIMIZER).memory_bytes, ==, 0);
        ZpInvList opt;
        zp_inventory_op(all[i], &m, &p, ZP_COMP_OPTIMIZER, 1000, &opt);
        ZpInvTotals t;
        zp_inventory_totals(&opt, &t);
        g_assert_cmpfloat(t.memory_bytes, ==, per_elem[i] * 1000);
    }
    p.precision = ZP_PREC_FP16;
    ZpInvList opt;
    zp_inventory_op(&zp_inventory_megatron, &m, &p, ZP_COMP_OPTIMIZER, 1000, &opt);
    ZpInvTotals t;
    zp_inventory_totals(&opt, &t);
    g_assert_cmpfloat(t.memory_bytes, ==, 50 * 1000);
    /* 320 blocks of 65,536 elements a launch */
    g_assert_cmpfloat(zp_inv_multi_tensor_launches(320.0 * 65536), ==, 1);
    g_assert_cmpfloat(zp_inv_multi_tensor_launches(320.0 * 65536 + 1), ==, 2);
}

/* Megatron-LM without an fp32 main_grad (--no-main-grad: the 2021 code of the SC21 runs, torch
 * DDP or local DDP without contiguous buffers): GPT-2's block of 3,072 weights (qkv 16 x 48,
 * proj 16 x 16, fc1 16 x 64, fc2 64 x 16) in fp16 gets a grad_accumulate kernel per weight
 * (read 2 e, write e) on 3 of 4 micro-steps: 3/4 x 6 x 3,072 = 13,824 bytes more in its
 * backward, none with one micro-step; its weight-gradient GEMMs write 2 bytes an element, not
 * the fused fp32 main_grad's 8 (read and written). The embedding's 640 table elements
 * (32 + 8 rows of 16) lose the DDP hook's main_grad add (10 bytes an element) and gain the
 * accumulation (4.5): 3,520 bytes fewer; the tied table's 512 elements also get the head's
 * weight gradient added to the rows' by autograd on every micro-step (read 4, write 2 bytes
 * an element: 3,072): 448 fewer in all. The head adds nothing of its own there; with the
 * table's copy on a pipeline's last stage (pp 2), or untied, its weight gradient is
 * accumulated like a block's: 3/4 x 6 x 512 = 2,304 bytes more in the head. The optimizer
 * copies .grad to fp32 (2 + 4 bytes) and zeroes no buffer (4), and local DDP's flat buffer
 * costs three passes of 2 + 2 bytes (flatten, divide by dp, copy back): fp16's 50 bytes an
 * element become 64. Another inventory refuses it. */
static void test_megatron_no_main_grad(void)
{
    const ZpModel m = model_from(gpt2_json);
    ZpPlan p = plan_for(2, 1);
    p.precision = ZP_PREC_FP16;
    p.grad_accum = 4;
    const ZpInventory *mg = &zp_inventory_megatron;
    const ZpInvTotals bwd = tu_inv_totals(mg, &m, &p, ZP_COMP_BLOCK_BWD);
    const ZpInvTotals emb = tu_inv_totals(mg, &m, &p, ZP_COMP_EMBED_BWD);
    ZpInvList list;
    zp_inventory_op(mg, &m, &p, ZP_COMP_OPTIMIZER, 1000, &list);
    ZpInvTotals opt;
    zp_inventory_totals(&list, &opt);
    p.no_main_grad = TRUE;
    g_assert_cmpfloat(tu_inv_totals(mg, &m, &p, ZP_COMP_BLOCK_BWD).memory_bytes - bwd.memory_bytes, ==,
                      13824);
    g_assert_cmpfloat(tu_inv_totals(mg, &m, &p, ZP_COMP_BLOCK_BWD).gemm_flops, ==, bwd.gemm_flops);
    g_assert_cmpfloat(emb.memory_bytes - tu_inv_totals(mg, &m, &p, ZP_COMP_EMBED_BWD).memory_bytes, ==,
                      448);
    {
        ZpModel untied = m;
        untied.tied_embeddings = FALSE;
        ZpPlan piped = p;
        piped.pipe.stages = 2;
        const double head = tu_inv_totals(mg, &m, &p, ZP_COMP_HEAD).memory_bytes;
        p.no_main_grad = FALSE;
        g_assert_cmpfloat(tu_inv_totals(mg, &m, &p, ZP_COMP_HEAD).memory_bytes, ==, head);
        p.no_main_grad = TRUE;
        g_assert_cmpfloat(tu_inv_totals(mg, &m, &piped, ZP_COMP_HEAD).memory_bytes - head, ==,
                          2304);
        g_assert_cmpfloat(tu_inv_totals(mg, &untied, &p, ZP_COMP_HEAD).memory_bytes - head, ==,
                          2304);
    }
    zp_inventory_op(mg, &m, &p, ZP_COMP_OPTIMIZER, 1000, &list);
    ZpInvTotals opt2;
    zp_inventory_totals(&list, &opt2);
    g_assert_cmpfloat(opt.memory_bytes, ==, 50 * 1000);
    g_assert_cmpfloat(opt2.memory_bytes, ==, 64 * 1000);
    for (int no_main = 0; no_main < 2; no_main++) { /* GEMMs writing an fp32 main_grad */
        p.no_main_grad = no_main;
        zp_inventory_op(mg, &m, &p, ZP_COMP_BLOCK_BWD, 0, &list);
        int fused = 0;
        for (int j = 0; j < list.n; j++)
            fused += list.k[j].cls == ZP_KCLASS_GEMM && list.k[j].batch == 1 &&
                     list.k[j].write_bytes == 8 * list.k[j].m * list.k[j].n;
        g_assert_cmpint(fused, ==, no_main ? 0 : 4);
    }
    p.grad_accum = 1;
    p.no_main_grad = FALSE;
    const double one = tu_inv_totals(mg, &m, &p, ZP_COMP_BLOCK_BWD).memory_bytes;
    p.no_main_grad = TRUE;
    g_assert_cmpfloat(tu_inv_totals(mg, &m, &p, ZP_COMP_BLOCK_BWD).memory_bytes, ==, one);
    /* the plan's JSON keeps it */
    json_t *j = zp_plan_to_json(&p);
    g_assert_true(json_is_false(json_object_get(j, "main_grad")));
    ZpPlan back;
    GError *error = NULL;
    g_assert_true(zp_plan_from_json(j, "test", &back, &error));
    g_assert_no_error(error);
    g_assert_true(back.no_main_grad);
    json_decref(j);
    TuRun r = tu_zplan("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 1 "
                       "--micro-batch 4 --no-main-grad");
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    g_assert_cmpstr(r.err, ==, "zplan simulate: main_grad: Megatron-LM's (--impl megatron or "
                               "--kernels megatron)\n");
    tu_free(&r);
}

/* --kernels NAME selects one, an unknown one is refused listing the names, and the default
 * follows --impl (DeepSpeed's; FSDP and the paper run the model as PyTorch eager does). */
static void test_selection(void)
{
    GError *error = NULL;
    g_assert_true(zp_inventory_find("megatron", "--kernels", &error) == &zp_inventory_megatron);
    g_assert_null(zp_inventory_find("jax", "--kernels", &error));
    g_assert_error(error, ZP_ERROR, ZP_ERROR_VALUE);
    g_assert_cmpstr(error->message, ==,
                    "--kernels: unknown kernel inventory 'jax' (known: eager, megatron, deepspeed)");
    g_clear_error(&error);
    ZpPlan p = plan_for(1, 1);
    p.impl = ZP_IMPL_DEEPSPEED;
    g_assert_true(zp_inventory_for_plan(&p) == &zp_inventory_deepspeed);
    p.impl = ZP_IMPL_FSDP;
    g_assert_true(zp_inventory_for_plan(&p) == &zp_inventory_eager);
    g_strlcpy(p.kernels, "megatron", sizeof p.kernels);
    g_assert_true(zp_inventory_for_plan(&p) == &zp_inventory_megatron);
}

/* `zplan simulate --kernels` on a profile with kernel rates: the cost model names the
 * inventory, the JSON lists the compute by class, a wrong name is one clear line. */
static void test_cli(void)
{
    const char *args = "simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 1 "
                       "--micro-batch 4 --json --kernels megatron";
    json_t *out = tu_zplan_json(args);
    const char *cost = json_string_value(json_object_get(out, "cost_model"));
    g_assert_true(g_str_has_prefix(cost, "kernel inventory 'megatron'"));
    json_t *by = json_object_get(out, "compute_by_class");
    g_assert_cmpstr(json_string_value(json_object_get(by, "inventory")), ==, "megatron");
    g_assert_cmpfloat(json_number_value(json_object_get(by, "gemm_s")), >, 0);
    g_assert_cmpfloat(json_number_value(json_object_get(by, "memory_s")), >, 0);
    g_assert_cmpfloat(json_number_value(json_object_get(by, "launches")), >, 0);
    json_decref(out);
    /* Under a pipeline a stage's share: within the step (it listed every stage's work). */
    out = tu_zplan_json("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --pp 4 "
                        "--stage 1 --micro-batch 4 --grad-accum 8 --json --kernels megatron");
    by = json_object_get(out, "compute_by_class");
    const double by_class_s = json_number_value(json_object_get(by, "gemm_s")) +
                              json_number_value(json_object_get(by, "memory_s")) +
                              json_number_value(json_object_get(by, "attention_s"));
    g_test_message("pipeline: %.6g s by class in a %.6g s step", by_class_s,
                   json_number_value(json_object_get(out, "step_time_s")));
    g_assert_cmpfloat(by_class_s, <, json_number_value(json_object_get(out, "step_time_s")));
    json_decref(out);
    TuRun r = tu_zplan("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --stage 1 "
                       "--micro-batch 4 --kernels jax");
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    g_assert_cmpstr(r.err, ==, "zplan simulate: --kernels: unknown kernel inventory 'jax' "
                               "(known: eager, megatron, deepspeed)\n");
    tu_free(&r);
}

/* The sweep's tflops row (stages 0-3) under --kernels NAME, from its CSV. */
static void sweep_row(const char *dir, const char *kernels, double *tflops)
{
    char *prefix = g_build_filename(dir, kernels, NULL);
    char *args = g_strdup_printf("sweep --model gpt2-124m --cluster dgx-a100-80g --vary gpus "
                                 "--values 8 --metric tflops --micro-batch 4 --mp 1 --out %s "
                                 "--kernels %s", prefix, kernels);
    TuRun r = tu_zplan(args);
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    tu_free(&r);
    char *csv_path = g_strdup_printf("%s.csv", prefix), *csv = NULL;
    g_assert_true(g_file_get_contents(csv_path, &csv, NULL, NULL));
    const char *row = strchr(csv, '\n') + 1;
    g_assert_cmpint(sscanf(row, "8,%lf,%lf,%lf,%lf", &tflops[0], &tflops[1], &tflops[2],
                           &tflops[3]), ==, 4);
    g_unlink(csv_path);
    char *svg = g_strdup_printf("%s.svg", prefix);
    g_unlink(svg);
    g_free(svg), g_free(csv), g_free(csv_path), g_free(args), g_free(prefix);
}

/* `zplan plan` and `zplan sweep` take --kernels as simulate does (they followed --impl
 * alone): gpt2-124m on 8 A100s, Megatron's fused kernels against PyTorch eager's, give
 * another best step and other TFLOP/s per stage; plan's header names the inventory; a wrong
 * name is one clear line. */
static void test_plan_sweep_kernels(void)
{
    double step_s[2];
    const char *names[2] = {"eager", "megatron"};
    for (int i = 0; i < 2; i++) {
        char *args = g_strdup_printf("plan --model gpt2-124m --cluster dgx-a100-80g --gpus 8 "
                                     "--mp 1 --top 1 --json --kernels %s", names[i]);
        json_t *out = tu_zplan_json(args);
        step_s[i] = json_number_value(json_object_get(json_object_get(out, "best"),
                                                      "step_time_s"));
        json_decref(out);
        g_free(args);
    }
    g_test_message("plan: best step %.4g s eager, %.4g s megatron", step_s[0], step_s[1]);
    g_assert_cmpfloat(step_s[0], >, 0);
    g_assert_cmpfloat(fabs(step_s[1] / step_s[0] - 1), >, 0.01);
    TuRun r = tu_zplan("plan --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --mp 1 --top 1 "
                       "--kernels megatron");
    g_assert_nonnull(strstr(r.out, ", megatron kernels, "));
    tu_free(&r);
    r = tu_zplan("plan --model gpt2-124m --cluster dgx-a100-80g --gpus 8 --kernels jax");
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    g_assert_cmpstr(r.err, ==, "zplan plan: --kernels: unknown kernel inventory 'jax' "
                               "(known: eager, megatron, deepspeed)\n");
    tu_free(&r);

    char *dir = g_dir_make_tmp("zplan-inventory-XXXXXX", NULL);
    double eager[4], megatron[4];
    sweep_row(dir, "eager", eager);
    sweep_row(dir, "megatron", megatron);
    for (int s = 0; s < 4; s++) {
        g_test_message("sweep stage %d: %.4g TFLOP/s eager, %.4g megatron", s, eager[s],
                       megatron[s]);
        g_assert_cmpfloat(fabs(megatron[s] / eager[s] - 1), >, 0.01);
    }
    r = tu_zplan("sweep --model gpt2-124m --cluster dgx-a100-80g --vary gpus --values 8 "
                 "--metric tflops --out x --kernels jax");
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    g_assert_cmpstr(r.err, ==, "zplan sweep: --kernels: unknown kernel inventory 'jax' "
                               "(known: eager, megatron, deepspeed)\n");
    tu_free(&r);
    g_rmdir(dir);
    g_free(dir);
}

/* `zplan validate` compares the compute by kernel class where the measurement has it (a GPU
 * run's profile summed by class): a measurement 10% over the prediction in each class reads
 * +10% on each class's row. */
static void test_validate_by_class(void)
{
    json_t *pred = tu_zplan_json("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 1 "
                                 "--stage 0 --micro-batch 4 --json --kernels eager");
    json_t *by = json_object_get(pred, "compute_by_class");
    json_t *ranks = json_pack("[{s:i, s:O, s:O, s:i, s:O, s:O, s:{}}]", "rank", 0,
                              "model_state_bytes", json_object_get(pred, "model_state_bytes"),
                              "peak_memory_bytes", json_object_get(pred, "peak_memory_bytes"),
                              "comm_bytes", 0, "step_time_s", json_object_get(pred, "step_time_s"),
                              "category_peak_bytes", json_object_get(pred, "category_peak_bytes"),
                              "ops");
    json_t *meas = json_pack("{s:s, s:i, s:O, s:O, s:o, s:{s:f, s:f, s:f}}", "format",
                             "zplan-measured-1", "world", 1, "step_time_s",
                             json_object_get(pred, "step_time_s"), "plan",
                             json_object_get(pred, "plan"), "ranks", ranks, "compute_by_class",
                             "gemm_s", 1.1 * json_number_value(json_object_get(by, "gemm_s")),
                             "attention_s", 1.1 * json_number_value(json_object_get(by, "attention_s")),
                             "memory_s", 1.1 * json_number_value(json_object_get(by, "memory_s")));
    char *dir = g_dir_make_tmp("zplan-inventory-XXXXXX", NULL);
    char *pred_path = g_build_filename(dir, "pred.json", NULL);
    char *meas_path = g_build_filename(dir, "meas.json", NULL);
    g_assert_cmpint(json_dump_file(pred, pred_path, 0), ==, 0);
    g_assert_cmpint(json_dump_file(meas, meas_path, 0), ==, 0);
    char *args = g_strdup_printf("validate %s %s --json", pred_path, meas_path);
    json_t *out = tu_zplan_json(args);
    json_t *rows = json_object_get(out, "rows");
    int found = 0;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        const char *q = json_string_value(json_object_get(row, "quantity"));
        if (g_str_has_prefix(q, "compute: ")) {
            g_assert_cmpfloat(fabs(json_number_value(json_object_get(row, "error")) - 0.1), <,
                              1e-9);
            found++;
        }
    }
    g_assert_cmpint(found, ==, 3);
    json_decref(out);
    g_unlink(pred_path);
    g_unlink(meas_path);
    g_rmdir(dir);
    g_free(args);
    g_free(pred_path);
    g_free(meas_path);
    g_free(dir);
    json_decref(meas);
    json_decref(pred);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/inventory/gpt2-block-bytes", test_gpt2_block_bytes);
    g_test_add_func("/inventory/llama-block-bytes", test_llama_block_bytes);
    g_test_add_func("/inventory/gpt2-block-flops", test_gpt2_block_flops);
    g_test_add_func("/inventory/flops-equal-model", test_flops_equal_model);
    g_test_add_func("/inventory/sources-and-optimizer", test_sources_and_optimizer);
    g_test_add_func("/inventory/megatron-no-main-grad", test_megatron_no_main_grad);
    g_test_add_func("/inventory/selection", test_selection);
    g_test_add_func("/inventory/cli", test_cli);
    g_test_add_func("/inventory/plan-sweep-kernels", test_plan_sweep_kernels);
    g_test_add_func("/inventory/validate-by-class", test_validate_by_class);
    return g_test_run();
}
