/* test_kernrate: a profile's per-class kernel rates — the GEMM surface hand-computed at tile and
 * wave boundaries and monotone in K, the memory curve's steps, the interference (1 when nothing
 * overlaps; a synthetic profile's compute under a concurrent all-gather as a hand computation
 * gives it), the shipped profiles' tables (FlashAttention-3's on Hopper) and refused malformed
 * ones. */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_cost.h"
#include "zp_hw.h"
#include "zp_kernrate.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

static void assert_close(double got, double want, double rel)
{
    g_assert_cmpfloat(fabs(got - want), <=, rel * fabs(want) + 1e-18);
}

/* A simulated time against a hand computation of n_durations durations in a row, each of
 * which the engine may have rounded to its clock's grid by half a quantum. */
static void assert_close_grid(double got, double want, double rel, int n_durations)
{
    g_assert_cmpfloat(fabs(got - want), <=,
                      rel * fabs(want) + n_durations * SIM_CLOCK_HALF_Q_S + 1e-18);
}

/* 4 SMs of 1e12 FLOP/s each, 128 x 128 tiles, K in steps of 16; memory never binds. */
static ZpKernRates synthetic(void)
{
    return (ZpKernRates){.present = TRUE, .has_gemm = TRUE, .gemm_best_flops_per_s = 4e12,
                         .sms = 4, .tile_m = 128, .tile_n = 128, .tile_k = 16, .n_memory = 1,
                         .memory_min_bytes = {0}, .memory_efficiency = {1.0},
                         .processor_usage = {0.25, 0.05}};
}

/* One tile of 128 x 128 x 64 takes 2 x 128 x 128 x 64 / 1e12 = 2.097152 us; four fill one wave
 * of the four SMs at the best rate; a fifth tile (m 257, or n 384, or a second batch of
 * 256 x 256 less three tiles) is a second wave; K 65 pads to 80. */
static void test_gemm_boundaries(void)
{
    const ZpKernRates r = synthetic();
    const double hbm = 1e18, tile_s = 2.0 * 128 * 128 * 64 / 1e12;
    assert_close(zp_kernrate_gemm_s(&r, hbm, 1, 256, 256, 64, 0), tile_s, 1e-12);
    assert_close(2.0 * 256 * 256 * 64 / zp_kernrate_gemm_s(&r, hbm, 1, 256, 256, 64, 0), 4e12,
                 1e-12);
    assert_close(zp_kernrate_gemm_s(&r, hbm, 1, 257, 256, 64, 0), 2 * tile_s, 1e-12);
    assert_close(zp_kernrate_gemm_s(&r, hbm, 1, 256, 384, 64, 0), 2 * tile_s, 1e-12);
    assert_close(zp_kernrate_gemm_s(&r, hbm, 2, 256, 256, 64, 0), 2 * tile_s, 1e-12);
    assert_close(zp_kernrate_gemm_s(&r, hbm, 1, 128, 128, 64, 0), tile_s, 1e-12); /* 1/4 used */
    assert_close(zp_kernrate_gemm_s(&r, hbm, 1, 256, 256, 65, 0), tile_s * 80 / 64, 1e-12);
    assert_close(zp_kernrate_gemm_s(&r, hbm, 1, 256, 256, 80, 0), tile_s * 80 / 64, 1e-12);
}

/* Time never falls as K grows, at any M and N; a thin GEMM is bound by its bytes. */
static void test_gemm_monotone_and_memory_bound(void)
{
    ZpKernRates r = synthetic();
    const double sizes[] = {1, 100, 128, 129, 1000, 4096};
    for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
        double last = 0;
        for (double k = 1; k <= 3000; k += 7) {
            const double bytes = 2 * (sizes[i] * k + k * 256) + 2 * sizes[i] * 256;
            const double t = zp_kernrate_gemm_s(&r, 1e12, 1, sizes[i], 256, k, bytes);
            g_assert_cmpfloat(t, >=, last);
            last = t;
        }
    }
    /* 16 x 16 x 1e6: 64,000,512 bytes at 0.5 of 1e9 B/s = 0.128001024 s, over the one wave's
     * 2 x 128 x 128 x 1e6 / 1e12 = 0.032768 s */
    r.memory_efficiency[0] = 0.5;
    const double bytes = (16 * 1e6 + 1e6 * 16) * 2 + 16 * 16 * 2;
    assert_close(zp_kernrate_gemm_s(&r, 1e9, 1, 16, 16, 1e6, bytes), 0.128001024, 1e-12);
}

/* Calculon's steps as dgx-a100-80g has them: 0.90 from 100 MB, 0.75 from 10 MB, 0.60 from 1 MB,
 * 0.30 below; a multi-tensor kernel's launches each move their share. */
static void test_memory_curve(void)
{
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    const ZpKernRates *r = &hw.kernel_rates;
    g_assert_true(r->present);
    g_assert_cmpfloat(zp_kernrate_memory_efficiency(r, 1e8), ==, 0.90);
    g_assert_cmpfloat(zp_kernrate_memory_efficiency(r, 1e8 - 1), ==, 0.75);
    g_assert_cmpfloat(zp_kernrate_memory_efficiency(r, 1e7), ==, 0.75);
    g_assert_cmpfloat(zp_kernrate_memory_efficiency(r, 1e6), ==, 0.60);
    g_assert_cmpfloat(zp_kernrate_memory_efficiency(r, 999999), ==, 0.30);
    g_assert_cmpfloat(zp_kernrate_memory_efficiency(r, 0), ==, 0.30);
    assert_close(zp_kernrate_memory_s(r, 2e12, 2e8, 2), 2e8 / (2e12 * 0.90), 1e-15);
    assert_close(zp_kernrate_memory_s(r, 2e12, 2e8, 4), 2e8 / (2e12 * 0.75), 1e-15);
    g_assert_cmpfloat(zp_kernrate_memory_s(r, 2e12, 0, 1), ==, 0);
}

/* 1 when nothing overlaps or the profile has no rates; 1 / (1 - u) by link otherwise. */
static void test_interference_factor(void)
{
    ZpKernRates r = synthetic();
    g_assert_cmpfloat(zp_kernrate_interference(&r, ZP_LINK_NVLINK, 0), ==, 1);
    g_assert_cmpfloat(zp_kernrate_interference(&r, ZP_LINK_NETWORK, 0), ==, 1);
    g_assert_cmpfloat(zp_kernrate_interference(&r, ZP_LINK_NVLINK, 1), ==, 1 / 0.75);
    g_assert_cmpfloat(zp_kernrate_interference(&r, ZP_LINK_NETWORK, 2), ==, 1 / 0.95);
    r.present = FALSE;
    g_assert_cmpfloat(zp_kernrate_interference(&r, ZP_LINK_NVLINK, 1), ==, 1);
}

/* ---- the simulator: compute beside an all-gather ---- */

static ZpSchedule *hand_schedule(const ZpModel *model, int dp)
{
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->model = *model;
    zp_plan_defaults(&s->plan, 0, dp, 1);
    s->plan.impl = ZP_IMPL_PAPER;
    s->world = dp;
    s->elem_bytes = 2;
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    return s;
}

static void add_op(ZpSchedule *s, ZpOp op)
{
    op.dep_start = s->deps->len;
    op.n_deps = 0;
    g_array_append_val(s->ops, op);
}

static double step_s(ZpSchedule *s, const ZpHw *hw)
{
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    const double t = r->step_time_s;
    sim_result_free(r);
    return t;
}

/* A synthetic profile (dgx-a100-80g with the synthetic rates: a collective over NVLink takes a
 * quarter of the GPU) and 8 ranks of one node. A compute op of 4e12 FLOPs (not the model's
 * op: the roofline's 4e12 / (0.807 x 312e12) = C) starts with a 1 GiB all-gather of A seconds
 * beside it: for A it runs at 3/4 speed, then at full speed, ending at C + A / 4. Without
 * the all-gather it takes C; across nodes (a network collective, u 0.05) C + 0.05 A. */
static void test_compute_beside_allgather(void)
{
    ZpHw hw = tu_load_hw("dgx-a100-80g");
    hw.kernel_rates = synthetic();
    const ZpModel model = tu_load_model("gpt2-124m");
    const ZpOp math = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_BLOCK_FWD, .flops = 4e12,
                       .unit = -1, .buffer = -1};
    const ZpOp gather = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLGATHER,
                         .stream = ZP_STREAM_DP, .group = ZP_GROUP_DP, .unit = -1,
                         .buffer = -1, .bytes = 1073741824.0};
    for (int nodes = 1; nodes <= 2; nodes++) {
        const int dp = 8 * nodes;
        const double u = nodes == 1 ? 0.25 : 0.05;
        ZpSchedule *alone = hand_schedule(&model, dp), *coll = hand_schedule(&model, dp);
        ZpSchedule *both = hand_schedule(&model, dp);
        add_op(alone, math);
        add_op(coll, gather);
        add_op(both, math);
        add_op(both, gather);
        const double c = step_s(alone, &hw), a = step_s(coll, &hw);
        assert_close_grid(c, 4e12 / (0.807 * 312e12), 1e-12, 1);
        g_assert_cmpfloat(c, >, a); /* the compute outlasts the gather */
        g_test_message("%d node(s): compute %.9g s, all-gather %.9g s", nodes, c, a);
        /* The gather's latency and transfer, and the compute's end set again at each. */
        assert_close_grid(step_s(both, &hw), c + u * a, 1e-9, 4);
        /* no rates: no interference, the two overlap freely */
        ZpHw plain = hw;
        plain.kernel_rates.present = FALSE;
        assert_close_grid(step_s(both, &plain), c, 1e-12, 1);
        zp_sched_free(alone);
        zp_sched_free(coll);
        zp_sched_free(both);
    }
}

/* An op takes the longer of its kernels' device time and the host's time to issue them:
 * tiny's block forward on the A100 profile is device-bound with no issue cost, and with 1 ms a
 * launch exactly its launches in milliseconds. */
static void test_host_issue_bound(void)
{
    ZpHw hw = tu_load_hw("dgx-a100-80g");
    const ZpModel m = tu_load_model("tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 0, 1, 1);
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_true(c.inventory);
    double device = 0;
    for (int k = 0; k < ZP_KCLASS_INVENTORY_N; k++)
        device += c.class_s[ZP_COMP_BLOCK_FWD][k];
    g_assert_cmpfloat(c.host_s[ZP_COMP_BLOCK_FWD], ==, 0);
    assert_close(c.kind_s[ZP_COMP_BLOCK_FWD], device, 1e-12);
    hw.kernel_rates.launch_host_s = 1e-3;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpfloat(c.launches[ZP_COMP_BLOCK_FWD], >, 10);
    g_assert_cmpfloat(c.kind_s[ZP_COMP_BLOCK_FWD], ==, c.launches[ZP_COMP_BLOCK_FWD] * 1e-3);
    g_assert_cmpfloat(c.kind_s[ZP_COMP_BLOCK_FWD], >, device);
    g_assert_true(strstr(c.why, "no op faster than its kernels' host issue") != NULL);
}

/* A schedule file that names no model has no shapes for an inventory: its compute stays on the
 * roofline, and the cost model says why. */
static void test_schedule_without_model(void)
{
    char *path = g_build_filename(zp_data_dir(), "tests", "data", "schedule-example.json", NULL);
    char *args = g_strdup_printf("simulate --schedule %s --cluster dgx-a100-80g --json", path);
    json_t *out = tu_zplan_json(args);
    g_assert_cmpstr(json_string_value(json_object_get(out, "cost_model")), ==,
                    "roofline (the fallback): the profile has no op_costs table; its "
                    "kernel_rates need the model's shapes");
    g_assert_null(json_object_get(out, "compute_by_class"));
    json_decref(out);
    g_free(args);
    g_free(path);
}

/* ---- profiles ---- */

/* The shipped GPU profiles' tables (the V100's has none: no published figures) and a cost
 * model that says which model it used. */
static void test_shipped_profiles(void)
{
    const struct {
        const char *name;
        double best;
        double sms;
    } cases[] = {{"dgx-a100-80g", 271.2e12, 108}, {"dgx-h100", 794.5e12, 132},
                 {"h200", 794.5e12, 132}};
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        const ZpHw hw = tu_load_hw(cases[i].name);
        g_assert_true(hw.kernel_rates.present && hw.kernel_rates.has_gemm);
        g_assert_cmpfloat(hw.kernel_rates.gemm_best_flops_per_s, ==, cases[i].best);
        g_assert_cmpfloat(hw.kernel_rates.sms, ==, cases[i].sms);
        g_assert_cmpfloat(hw.kernel_rates.processor_usage[ZP_LINK_NVLINK], ==, 0.15);
        g_assert_cmpfloat(hw.kernel_rates.processor_usage[ZP_LINK_NETWORK], ==, 0.02);
    }
    const ZpHw v100 = tu_load_hw("dgx2-v100");
    g_assert_false(v100.kernel_rates.present);
}

/* Attention seconds of one simulated step: the inventory's fused-attention kernels. */
static double attention_s(const char *args)
{
    json_t *out = tu_zplan_json(args);
    const double s = json_number_value(
        json_object_get(json_object_get(out, "compute_by_class"), "attention_s"));
    json_decref(out);
    return s;
}

/* FlashAttention-3 on the Hopper profiles: the step's attention time is the model's attention
 * FLOPs (12 b s^2 h a layer, forward + backward) over the table's rate x 12/7 (the table counts
 * 3.5 x 4 b s^2 h / 2), at the row of the nearest head dimension, log2-interpolated in s and held
 * at 16k's rate past it; an A100 profile refuses it in one line. */
static void test_flash3_attention(void)
{
    const double to_model = 12.0 / 7.0;
    /* Llama-2-7B (32 layers, h 4096, head dim 128) at s 4096: 514.0 TFLOP/s. */
    const double llama = 32 * 12 * 4096.0 * 4096.0 * 4096.0 / (514.0e12 * to_model);
    assert_close(attention_s("simulate --model hf/llama-2-7b --cluster dgx-h100 --gpus 8 "
                             "--stage 3 --micro-batch 1 --attention flash3 --json"),
                 llama, 1e-12);
    /* Pythia-160M (12 layers, h 768, head dim 64) at s 3000, between 2048 (348.6) and 4096
     * (405.3) on the H200, which takes the H100's table. */
    const double x = log2(3000.0 / 2048.0);
    const double rate = (348.6e12 + x * (405.3e12 - 348.6e12)) * to_model;
    assert_close(attention_s("simulate --model hf/pythia-160m --seq 3000 --cluster h200 "
                             "--gpus 8 --stage 3 --micro-batch 1 --attention flash3 --json"),
                 12 * 12 * 3000.0 * 3000.0 * 768 / rate, 1e-12);
    /* Past 16k the published figures stop: s 32768 is held at 16k's 457.2 TFLOP/s. */
    assert_close(attention_s("simulate --model hf/pythia-160m --seq 32768 --cluster dgx-h100 "
                             "--gpus 8 --stage 3 --micro-batch 1 --attention flash3 --json"),
                 12 * 12 * 32768.0 * 32768.0 * 768 / (457.2e12 * to_model), 1e-12);
    /* PyTorch's SDPA runs FlashAttention-2 there: flash3 is opt-in, not the default. */
    assert_close(attention_s("simulate --model hf/llama-2-7b --cluster dgx-h100 --gpus 8 "
                             "--stage 3 --micro-batch 1 --json"),
                 32 * 12 * 4096.0 * 4096.0 * 4096.0 / (294e12 * to_model), 1e-12);
    TuRun r = tu_zplan("simulate --model hf/llama-2-7b --cluster dgx-a100-80g --gpus 8 "
                       "--stage 3 --micro-batch 1 --attention flash3");
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    g_assert_cmpstr(r.err, ==, "zplan simulate: --attention: dgx-a100-80g has no rate for "
                               "'flash3' in its attention table (choose from eager, flash, "
                               "flash1-triton, flash2, mem-efficient)\n");
    g_assert_cmpstr(r.out, ==, "");
    tu_free(&r);
}

static void expect_refused(const char *rates, const char *message)
{
    char *text = g_strdup_printf(
        "{\"name\": \"x\", \"gpu\": \"x\", \"gpus_per_node\": 8, \"gpu_memory_bytes\": 1e10, "
        "\"peak_fp16_flops\": 1e14, \"peak_bf16_flops\": 1e14, \"peak_fp32_flops\": 1e13, "
        "\"hbm_bytes_per_s\": 1e12, \"intra_node_bytes_per_s\": 1e11, "
        "\"intra_node_latency_s\": 1e-6, \"inter_node_bytes_per_s\": 1e10, "
        "\"inter_node_latency_s\": 1e-6, \"host_link_bytes_per_s\": 1e10, "
        "\"cpu_memory_bytes\": 1e11, \"runtime_reserve_bytes\": 1e9, \"gemm_efficiency_max\": 0.8, "
        "\"gemm_half_efficiency_flops\": 1e9, "
        "\"kernel_rates\": %s}", rates);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    g_assert_nonnull(j);
    ZpHw hw;
    GError *error = NULL;
    g_assert_false(zp_hw_from_json(j, "p.json", &hw, &error));
    g_assert_nonnull(error);
    g_assert_cmpstr(error->message, ==, message);
    g_error_free(error);
    json_decref(j);
    g_free(text);
}

/* An fp32 plan's GEMMs are not priced on the GEMM surface: it is a 16-bit tensor-core rate
 * (a bf16 MAMF search), and PyTorch's fp32 matmuls run without TF32 by default. Before, an
 * fp32 step on dgx-h100 priced its 188 TFLOP of GEMMs in 0.36 s: MFU 293% of the fp32 peak. */
static void test_fp32_gemms_off_the_surface(void)
{
    json_t *out = tu_zplan_json("simulate --model hf/llama-2-7b --cluster dgx-h100 --gpus 8 "
                                "--stage 3 --micro-batch 1 --precision fp32 --json");
    const double flops = json_real_value(json_object_get(out, "model_flops_per_gpu"));
    const double gemm_s = json_real_value(
        json_object_get(json_object_get(out, "compute_by_class"), "gemm_s"));
    g_assert_cmpfloat(flops, >, 1e14);
    /* the GEMMs carry nearly all of the step's FLOPs (attention is batched GEMMs here), and
     * none runs above the 67 TFLOP/s fp32 peak */
    g_assert_cmpfloat(gemm_s * 67e12, >=, 0.95 * flops);
    g_assert_cmpfloat(json_real_value(json_object_get(out, "mfu")), <=, 1.0);
    g_assert_nonnull(strstr(json_string_value(json_object_get(out, "cost_model")),
                            "on the fp32 roofline"));
    json_decref(out);
    /* bf16 keeps the surface */
    out = tu_zplan_json("simulate --model hf/llama-2-7b --cluster dgx-h100 --gpus 8 "
                        "--stage 3 --micro-batch 1 --json");
    g_assert_nonnull(strstr(json_string_value(json_object_get(out, "cost_model")),
                            "on the wave and tile surface"));
    json_decref(out);
}

static void test_refused(void)
{
    expect_refused("{\"memory_efficiency\": [[1e6, 0.5], [1e7, 0.6], [0, 0.3]], "
                   "\"interference\": {\"nvlink\": 0.1, \"network\": 0.0}}",
                   "p.json: kernel_rates.memory_efficiency[1] must be [min_bytes, efficiency] "
                   "with min_bytes decreasing to 0 and efficiency in (0, 1]");
    expect_refused("{\"memory_efficiency\": [[0, 0.3]]}",
                   "p.json: kernel_rates: missing key \"interference\"");
    expect_refused("{\"memory_efficiency\": [[0, 0.3]], \"interference\": {\"nvlink\": 1, "
                   "\"network\": 0}}",
                   "p.json: kernel_rates.interference: key \"nvlink\" = 1 is outside [0, 0.9]");
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/kernrate/gemm-boundaries", test_gemm_boundaries);
    g_test_add_func("/kernrate/gemm-monotone-and-memory-bound",
                    test_gemm_monotone_and_memory_bound);
    g_test_add_func("/kernrate/memory-curve", test_memory_curve);
    g_test_add_func("/kernrate/interference-factor", test_interference_factor);
    g_test_add_func("/kernrate/compute-beside-allgather", test_compute_beside_allgather);
    g_test_add_func("/kernrate/host-issue-bound", test_host_issue_bound);
    g_test_add_func("/kernrate/schedule-without-model", test_schedule_without_model);
    g_test_add_func("/kernrate/shipped-profiles", test_shipped_profiles);
    g_test_add_func("/kernrate/refused", test_refused);
    g_test_add_func("/kernrate/fp32-gemms-off-the-surface", test_fp32_gemms_off_the_surface);
    g_test_add_func("/kernrate/flash3-attention", test_flash3_attention);
    return g_test_run();
}
