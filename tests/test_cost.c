/* test_cost: the op-level cost model — a profile's op table read back as written, the GEMM
 * surface exact at its grid points and monotone between them, the fallback to the roofline
 * said out loud, no contention without overlap, and op times a hand computation gives. */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_cost.h"
#include "zp_hw.h"
#include "zp_model.h"
#include "zp_optable.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

/* A synthetic table: GEMM rates rising with size and falling with aspect ratio (a 4 x 3 grid),
 * every elementwise class at its own rate, eager attention flat. */
static ZpOpTable synthetic_table(void)
{
    ZpOpTable t = {.present = TRUE, .launch_s = 1e-6, .optimizer_bytes_per_s = 4e9,
                   .contention = 1.5, .has_eager_attention = TRUE};
    g_strlcpy(t.source, "synthetic (test_cost)", sizeof t.source);
    for (int f = 0; f < ZP_GEMM_N; f++) {
        ZpGrid *g = &t.gemm[f];
        *g = (ZpGrid){.nx = 4, .ny = 3, .x = {12, 18, 24, 30}, .y = {0, 2, 4}};
        for (int i = 0; i < g->nx; i++)
            for (int j = 0; j < g->ny; j++)
                g->v[i][j] = (1 + f) * 1e9 * (i + 1) / (j + 1);
    }
    for (int p = 0; p < 2; p++)
        t.eager_attention[p] = (ZpGrid){.nx = 1, .ny = 1, .x = {5}, .y = {4},
                                        .v = {{p ? 2e9 : 3e9}}};
    for (int c = 0; c < ZP_EW_N; c++)
        t.ew_bytes_per_s[c] = (c + 1) * 1e9;
    return t;
}

static void load_hw(const char *name, ZpHw *hw)
{
    GError *error = NULL;
    g_assert_true(zp_hw_load(name, hw, &error));
    g_assert_no_error(error);
}

static void load_model(const char *name, ZpModel *m)
{
    GError *error = NULL;
    g_assert_true(zp_model_load(name, m, &error));
    g_assert_no_error(error);
}

/* A profile with an op table, written to JSON, loads back to the same table. */
static void test_round_trip(void)
{
    GError *error = NULL;
    char *src = g_build_filename(zp_data_dir(), "hwprofiles", "dgx-h100.json", NULL);
    json_t *root = zp_json_load_object(src, &error);
    g_assert_no_error(error);
    const ZpOpTable t = synthetic_table();
    json_object_set_new(root, "op_costs", zp_optable_to_json(&t));
    char *dir = g_dir_make_tmp("test_cost-XXXXXX", NULL);
    char *path = g_build_filename(dir, "profile.json", NULL);
    g_assert_true(zp_json_write(root, path, &error));
    ZpHw hw;
    load_hw(path, &hw);
    g_assert_true(hw.op_costs.present);
    g_assert_cmpstr(hw.op_costs.source, ==, t.source);
    g_assert_true(memcmp(&hw.op_costs, &t, sizeof t) == 0);
    /* A table with a missing class is refused naming it. */
    json_object_del(json_object_get(json_object_get(root, "op_costs"), "elementwise_bytes_per_s"),
                    "rope");
    g_assert_true(zp_json_write(root, path, &error));
    g_assert_false(zp_hw_load(path, &hw, &error));
    g_assert_nonnull(strstr(error->message, "rope"));
    g_clear_error(&error);
    g_unlink(path);
    g_rmdir(dir);
    json_decref(root);
    g_free(path);
    g_free(dir);
    g_free(src);
}

/* The surface is exact at every grid point; between two neighbours along either axis it stays
 * between their values and moves one way. */
static void test_interpolation(void)
{
    const ZpGrid *g = &synthetic_table().gemm[ZP_GEMM_WEIGHT_GRAD];
    for (int i = 0; i < g->nx; i++)
        for (int j = 0; j < g->ny; j++)
            g_assert_cmpfloat(zp_grid_at(g, g->x[i], g->y[j]), ==, g->v[i][j]);
    for (int i = 0; i + 1 < g->nx; i++)
        for (int j = 0; j + 1 < g->ny; j++) {
            double prev_x = g->v[i][j], prev_y = g->v[i][j];
            for (int s = 1; s < 16; s++) {
                const double fx = zp_grid_at(g, g->x[i] + s * (g->x[i + 1] - g->x[i]) / 16,
                                             g->y[j]);
                const double fy = zp_grid_at(g, g->x[i], g->y[j] + s * (g->y[j + 1] - g->y[j]) / 16);
                g_assert_cmpfloat(fx, >, prev_x); /* rate rises with size */
                g_assert_cmpfloat(fx, <, g->v[i + 1][j]);
                g_assert_cmpfloat(fy, <, prev_y); /* and falls with aspect */
                g_assert_cmpfloat(fy, >, g->v[i][j + 1]);
                prev_x = fx, prev_y = fy;
            }
        }
    /* Outside the grid: clamped to the edge. */
    g_assert_cmpfloat(zp_grid_at(g, 100, 100), ==, g->v[g->nx - 1][g->ny - 1]);
    g_assert_cmpfloat(zp_grid_at(g, -5, -5), ==, g->v[0][0]);
    double x, y;
    zp_gemm_coords(64, 256, 16, &x, &y);
    g_assert_cmpfloat(x, ==, 18);
    g_assert_cmpfloat(y, ==, 4);
}

/* Without a table (every shipped GPU profile today) the roofline is used and says why; the
 * simulator's result and `zplan simulate` say so too. */
static void test_fallback_reported(void)
{
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    load_hw("dgx-h100", &hw);
    load_model("tiny", &m);
    zp_plan_defaults(&p, 1, 2, 1);
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_false(c.table);
    g_assert_cmpstr(c.why, ==, "roofline: the profile has no op_costs table");
    /* The roofline's figure, unchanged. */
    const double peak = zp_hw_peak_flops(&hw, p.precision);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_BLOCK_FWD, 1e12, 1e10, 0, 1e9), ==,
                      zp_hw_compute_time_s(&hw, peak, 1e12, 1e10, 0, 0, 1e9, FALSE));
    /* A table without eager attention cannot cost an eager plan. */
    hw.op_costs = synthetic_table();
    hw.op_costs.has_eager_attention = FALSE;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_false(c.table);
    g_assert_cmpstr(c.why, ==, "roofline: the op table has no eager_attention rates");
    json_t *out = tu_zplan_json("simulate --model tiny --cluster dgx-h100 --gpus 2 --stage 1 "
                                "--micro-batch 1 --json");
    g_assert_cmpstr(json_string_value(json_object_get(out, "cost_model")), ==,
                    "roofline: the profile has no op_costs table");
    json_decref(out);
}

/* Kernel by kernel, the op times a hand computation gives for tiny (h 64, 4 heads, s 32, f 256,
 * V 64, GPT-2 style) at micro-batch 1, T = 32 tokens. */
static void test_hand_computed(void)
{
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    load_hw("dgx-h100", &hw);
    load_model("tiny", &m);
    hw.op_costs = synthetic_table();
    zp_plan_defaults(&p, 1, 2, 1);
    p.micro_batch = 1;
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_true(c.table);
    g_assert_nonnull(strstr(c.why, "op table (synthetic"));
    const double L = 1e-6, th = 32 * 64;
    /* Embedding forward: the lookup (bf16 token and position rows in, fp32 out: 8 th bytes at
     * embed's 11e9) and the conversion to bf16 (6 th at convert's 9e9). */
    g_assert_cmpfloat(fabs(c.kind_s[ZP_COMP_EMBED_FWD] - (2 * L + 8 * th / 11e9 + 6 * th / 9e9)),
                      <, 1e-15);
    /* Embedding backward: zero the fp32 gradients of wte and wpe ((64 + 32) x 64 elements),
     * scatter-add (20 th), accumulate into bf16 (8 bytes an element). */
    const double embed = 96 * 64;
    g_assert_cmpfloat(fabs(c.kind_s[ZP_COMP_EMBED_BWD] -
                           (3 * L + 4 * embed / 9e9 + 20 * th / 11e9 + 8 * embed / 9e9)), <, 1e-15);
    /* Head: logits GEMM 32x64x64 forward (2^17 mnk, aspect 2: log2 17, 1 -> between grid
     * rows 12 and 18: rate 1e9 (1 + 5/6) at aspect 0 and (1 + 5/6)/2... bilinear). */
    double x, y;
    zp_gemm_coords(32, 64, 64, &x, &y);
    g_assert_cmpfloat(x, ==, 17);
    g_assert_cmpfloat(y, ==, 1);
    const double fwd_rate = 1e9 * (1 + 5.0 / 6) * (1 + 0.5 * (1.0 / 2 - 1)); /* y 1 of 0..2 */
    zp_gemm_coords(64, 64, 32, &x, &y); /* weight gradient: same coordinates, its own grid */
    const double flops = 2.0 * 32 * 64 * 64;
    const double head = 11 * L + 6 * th / 9e9 + 8 * th / 1e9 + 8 * th / 9e9 + flops / fwd_rate +
                        20 * 32 * 64 / 10e9 + flops / (2 * fwd_rate) + 8 * 64 * 64 / 9e9 +
                        flops / (3 * fwd_rate) + 4 * (2 * 64 + th) / 9e9 + 16 * th / 2e9 +
                        8 * 128 / 9e9;
    g_assert_cmpfloat(fabs(c.kind_s[ZP_COMP_HEAD] - head) / head, <, 1e-12);
    /* The optimizer: its launch plus its bytes at the optimizer rate. */
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_OPTIMIZER, 0, 0, 0, 4e9), ==, L + 1);
    /* The block backward's GEMMs: every linear's weight and input gradient, each as many
     * FLOPs as its forward; attention backward twice the forward's FLOPs. */
    ZpKernels fwd, bwd;
    zp_cost_kernels(&m, &p, ZP_COMP_BLOCK_FWD, &fwd);
    zp_cost_kernels(&m, &p, ZP_COMP_BLOCK_BWD, &bwd);
    double gf = 0, gb = 0, af = 0, ab = 0;
    int nf = 0, nb = 0;
    for (int i = 0; i < fwd.n; i++)
        gf += fwd.k[i].kind == ZP_KERNEL_GEMM ? fwd.k[i].flops : 0,
        af += fwd.k[i].kind == ZP_KERNEL_ATTENTION ? fwd.k[i].flops : 0,
        nf += fwd.k[i].kind == ZP_KERNEL_GEMM;
    for (int i = 0; i < bwd.n; i++)
        gb += bwd.k[i].kind == ZP_KERNEL_GEMM ? bwd.k[i].flops : 0,
        ab += bwd.k[i].kind == ZP_KERNEL_ATTENTION ? bwd.k[i].flops : 0,
        nb += bwd.k[i].kind == ZP_KERNEL_GEMM;
    g_assert_cmpint(nf, ==, 4);
    g_assert_cmpint(nb, ==, 8);
    g_assert_cmpfloat(gf, ==, 2 * 32 * 64 * (192 + 64 + 256 + 256.0));
    g_assert_cmpfloat(gb, ==, 2 * gf);
    g_assert_cmpfloat(af, ==, 4.0 * 32 * 32 * 64);
    g_assert_cmpfloat(ab, ==, 2 * af);
    /* The backward's elementwise traffic is its own, not twice the forward's: two norm
     * backwards (4 th each), GELU's (3 T f), four bias gradients, the softmax's (3 b a s^2). */
    g_assert_cmpfloat(zp_cost_accesses(&bwd), ==,
                      8 * th + 3 * 32 * 256.0 + 32 * (192 + 64 + 256 + 64.0) + 3 * 4 * 32 * 32.0);
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_BLOCK_BWD)
            g_assert_cmpfloat(op->mem_bytes, ==, s->elem_bytes * zp_cost_accesses(&bwd));
    }
    zp_sched_free(s);
}

static double step_s(const ZpModel *m, const ZpPlan *p, const ZpHw *hw)
{
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, p, &error);
    g_assert_no_error(error);
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r = sim_engine_run(s, hw, &options, &error);
    g_assert_no_error(error);
    const double t = r->step_time_s;
    g_assert_nonnull(strstr(r->cost_model, "op table"));
    sim_result_free(r);
    zp_sched_free(s);
    return t;
}

/* Contention slows only compute that overlaps a collective: with overlap off (every compute
 * op waits for the collectives before it) the step is the same at any factor; with overlap on
 * it is slower. */
static void test_contention(void)
{
    ZpHw hw, calm;
    ZpModel m;
    ZpPlan p;
    load_hw("dgx-h100", &hw);
    load_model("cpu-small", &m);
    hw.op_costs = synthetic_table();
    calm = hw;
    calm.op_costs.contention = 1;
    ZpCost c;
    zp_plan_defaults(&p, 2, 4, 1);
    p.zero.reduce_bucket_size = 1e5; /* a bucket per block, reduced while the next computes */
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpfloat(zp_cost_contention(&c, 0), ==, 1);
    g_assert_cmpfloat(zp_cost_contention(&c, 1), ==, 1.5);
    p.zero.overlap_comm = FALSE;
    g_assert_cmpfloat(step_s(&m, &p, &hw), ==, step_s(&m, &p, &calm));
    p.zero.overlap_comm = TRUE;
    g_assert_cmpfloat(step_s(&m, &p, &hw), >, step_s(&m, &p, &calm));
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/cost/round-trip", test_round_trip);
    g_test_add_func("/cost/interpolation", test_interpolation);
    g_test_add_func("/cost/fallback-reported", test_fallback_reported);
    g_test_add_func("/cost/hand-computed", test_hand_computed);
    g_test_add_func("/cost/contention", test_contention);
    return g_test_run();
}
