/* test_cost: the op-level cost model — a profile's op table read back as written, the GEMM
 * surface exact at its grid points and monotone between them, the fallback to the roofline
 * said out loud, no contention without overlap, and op times a hand computation gives. */
#include "sim_coll.h"
#include "sim_engine.h"
#include "testutil.h"
#include "zp_colltab.h"
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
    /* A whole-op time at a shape no model here has: read back, never used. */
    t.n_ops = 1;
    t.ops[0] = (ZpOpTime){.op = "block_fwd", .shape = "b1 s1 (none)", .ranks = 3, .time_s = 9};
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

/* tiny on the H100 profile, with the synthetic op table when `table`, and a plan of `stage` on
 * `dp` ranks at micro-batch `micro_batch` (0: the default). */
static void tiny_setup(ZpHw *hw, ZpModel *m, ZpPlan *p, int stage, int dp, int micro_batch,
                       gboolean table)
{
    load_hw("dgx-h100", hw);
    load_model("tiny", m);
    if (table)
        hw->op_costs = synthetic_table();
    zp_plan_defaults(p, stage, dp, 1);
    if (micro_batch)
        p->micro_batch = micro_batch;
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
    tiny_setup(&hw, &m, &p, 1, 2, 0, FALSE);
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_false(c.table);
    g_assert_cmpstr(c.why, ==, "roofline: the profile has no op_costs table");
    /* The roofline's figure, unchanged. */
    const double peak = zp_hw_peak_flops(&hw, p.precision);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_BLOCK_FWD, -1, 1e12, 1e10, 0, 1e9), ==,
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
    tiny_setup(&hw, &m, &p, 1, 2, 1, TRUE);
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_true(c.table);
    char *said = g_strdup_printf("op table: no op measured whole (2 ranks at once); the sum of "
                                 "their kernels for embed_fwd, block_fwd, head, recompute, "
                                 "block_bwd, embed_bwd; the optimizer's %.0f elements at its "
                                 "fitted rate (no whole times around them) (synthetic",
                                 (double)zp_sched_optimizer_elems(&m, &p));
    g_assert_nonnull(strstr(c.why, said));
    g_free(said);
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
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_OPTIMIZER, -1, 0, 0, 0, 4e9), ==, L + 1);
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
    zp_plan_defaults(&p, 1, 4, 1);
    p.zero.reduce_bucket_size = 1e5; /* a bucket per block, reduced while the next computes */
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpfloat(zp_cost_contention(&c, 0), ==, 1);
    g_assert_cmpfloat(zp_cost_contention(&c, 1), ==, 1.5);
    p.zero.overlap_comm = FALSE;
    g_assert_cmpfloat(step_s(&m, &p, &hw), ==, step_s(&m, &p, &calm));
    p.zero.overlap_comm = TRUE;
    g_assert_cmpfloat(step_s(&m, &p, &hw), >, step_s(&m, &p, &calm));
}

/* Whole-op times measured at the plan's shape and ranks at once are taken before the sum of
 * the op's kernels, op by op, and said; another rank count's, or another shape's, are not. */
static void test_whole_op(void)
{
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    tiny_setup(&hw, &m, &p, 1, 2, 0, TRUE);
    ZpCost kernels, c;
    g_assert_true(zp_cost_init(&kernels, &hw, &m, &p, NULL));
    char fwd[ZP_OPTABLE_SHAPE_LEN], recompute[ZP_OPTABLE_SHAPE_LEN], head[ZP_OPTABLE_SHAPE_LEN];
    char other[ZP_OPTABLE_SHAPE_LEN];
    zp_cost_op_shape(&m, &p, ZP_COMP_BLOCK_FWD, fwd);
    zp_cost_op_shape(&m, &p, ZP_COMP_RECOMPUTE, recompute);
    zp_cost_op_shape(&m, &p, ZP_COMP_HEAD, head);
    g_assert_cmpstr(fwd, ==, recompute); /* both save their activations without checkpointing */
    g_assert_cmpstr(fwd, !=, head);
    p.micro_batch++;
    zp_cost_op_shape(&m, &p, ZP_COMP_BLOCK_BWD, other);
    p.micro_batch--;
    g_assert_cmpstr(other, !=, head);
    ZpOpTable *t = &hw.op_costs;
    t->n_ops = 3;
    t->ops[0] = (ZpOpTime){.op = "block_fwd", .ranks = 2, .time_s = 0.25};
    t->ops[1] = (ZpOpTime){.op = "head", .ranks = 1, .time_s = 0.5}; /* one rank: not ours */
    t->ops[2] = (ZpOpTime){.op = "block_bwd", .ranks = 2, .time_s = 0.75};
    g_strlcpy(t->ops[0].shape, fwd, sizeof t->ops[0].shape);
    g_strlcpy(t->ops[1].shape, head, sizeof t->ops[1].shape);
    g_strlcpy(t->ops[2].shape, other, sizeof t->ops[2].shape); /* another micro-batch's */
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpint(c.ranks, ==, 2);
    g_assert_true(c.whole[ZP_COMP_BLOCK_FWD]);
    g_assert_false(c.whole[ZP_COMP_HEAD] || c.whole[ZP_COMP_BLOCK_BWD]);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_BLOCK_FWD, -1, 0, 0, 0, 0), ==, 0.25);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_HEAD, -1, 0, 0, 0, 0), ==,
                      kernels.kind_s[ZP_COMP_HEAD]);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_BLOCK_BWD, -1, 0, 0, 0, 0), ==,
                      kernels.kind_s[ZP_COMP_BLOCK_BWD]);
    g_assert_nonnull(strstr(c.why, "op table: block_fwd measured whole (2 ranks at once); the "
                                   "sum of their kernels for embed_fwd, head, recompute, "
                                   "block_bwd, embed_bwd"));
    /* Under checkpointing the block forward keeps nothing: another shape, its kernels' sum. */
    p.checkpoint = TRUE;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_false(c.whole[ZP_COMP_BLOCK_FWD]);
    /* On one rank the head's own time. */
    zp_plan_defaults(&p, 1, 1, 1);
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_true(c.whole[ZP_COMP_HEAD]);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_HEAD, -1, 0, 0, 0, 0), ==, 0.5);
}

/* The step's optimizer op, as zp_sched_build emits it for tiny at `stage` on `dp` ranks, costed
 * with c. */
static double sched_optimizer_s(const ZpModel *m, const ZpPlan *plan, const ZpCost *c)
{
    ZpSchedule *s = zp_sched_build(m, plan, NULL);
    g_assert_nonnull(s);
    double t = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *o = zp_sched_op(s, i);
        if (o->kind == ZP_OP_COMPUTE && o->sub == ZP_COMP_OPTIMIZER)
            t = zp_cost_op_s(c, o->sub, zp_op_module(o), o->flops, o->gemm_flops, o->attn_flops,
                             o->mem_bytes);
    }
    zp_sched_free(s);
    return t;
}

/* The optimizer timed whole: a plan finds its own partition's time (stage 0's every parameter,
 * stage 3's share, on 2 ranks and on 1), a partition between two timed ones the straight line
 * between them, one outside them the fitted rate; the path is said in c.why. Hand-computed
 * from the synthetic table (launch 1 us, 4e9 B/s; fp16 Adam moves 2 + 2 + 2 x 12 = 28 bytes an
 * element). */
static void test_whole_optimizer(void)
{
    ZpHw hw;
    ZpModel m;
    ZpPlan p0, p3, one;
    tiny_setup(&hw, &m, &p0, 0, 2, 0, TRUE);
    zp_plan_defaults(&p3, 3, 2, 1);
    zp_plan_defaults(&one, 0, 1, 1);
    const double e0 = (double)zp_sched_optimizer_elems(&m, &p0);
    const double e3 = (double)zp_sched_optimizer_elems(&m, &p3);
    g_assert_cmpfloat(e0, ==, (double)zp_sched_optimizer_elems(&m, &one));
    g_assert_cmpfloat(e3, <, e0);
    ZpOpTable *t = &hw.op_costs;
    const struct {
        double elems;
        int ranks;
        double time_s;
    } rows[] = {{e0, 2, 0.004}, {e3, 2, 0.003}, {e0, 1, 0.010}};
    t->n_ops = 1 + (int)G_N_ELEMENTS(rows); /* after the synthetic block_fwd */
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++) {
        t->ops[1 + i] = (ZpOpTime){.op = "optimizer", .ranks = rows[i].ranks,
                                   .time_s = rows[i].time_s};
        zp_cost_optimizer_shape(rows[i].elems, t->ops[1 + i].shape);
    }
    ZpCost c;
    const ZpPlan *plans[] = {&p0, &p3, &one};
    for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
        g_assert_true(zp_cost_init(&c, &hw, &m, plans[i], NULL));
        g_assert_true(c.whole[ZP_COMP_OPTIMIZER]);
        g_assert_cmpfloat(sched_optimizer_s(&m, plans[i], &c), ==, rows[i].time_s);
        char *said = g_strdup_printf("; the optimizer measured whole at its %.0f elements (",
                                     rows[i].elems);
        g_assert_nonnull(strstr(c.why, said));
        g_free(said);
    }
    /* Between the two 2-rank times, and below them (the fitted rate). */
    g_assert_true(zp_cost_init(&c, &hw, &m, &p0, NULL));
    const double mid = (e0 + e3) / 2, low = e3 / 2;
    g_assert_cmpfloat(fabs(zp_cost_op_s(&c, ZP_COMP_OPTIMIZER, -1, 0, 0, 0, 28 * mid) - 0.0035),
                      <, 1e-15);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_OPTIMIZER, -1, 0, 0, 0, 28 * low), ==,
                      1e-6 + 28 * low / 4e9);
    /* Stage 3's own time gone, a time at a quarter of stage 0's: stage 3 on the line between. */
    const double quarter = floor(e0 / 4);
    zp_cost_optimizer_shape(quarter, t->ops[2].shape);
    t->ops[2].time_s = 0.001;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p3, NULL));
    g_assert_false(c.whole[ZP_COMP_OPTIMIZER]);
    const double line = 0.001 + (e3 - quarter) * (0.004 - 0.001) / (e0 - quarter);
    g_assert_cmpfloat(fabs(sched_optimizer_s(&m, &p3, &c) - line), <, 1e-15);
    char *said = g_strdup_printf("; the optimizer's %.0f elements between its whole times at "
                                 "%.0f and %.0f (", e3, quarter, e0);
    g_assert_nonnull(strstr(c.why, said));
    g_free(said);
    /* No whole times on 4 ranks: the fitted rate, said. */
    ZpPlan p4;
    zp_plan_defaults(&p4, 3, 4, 1);
    g_assert_true(zp_cost_init(&c, &hw, &m, &p4, NULL));
    const double e4 = (double)zp_sched_optimizer_elems(&m, &p4);
    g_assert_cmpfloat(sched_optimizer_s(&m, &p4, &c), ==, 1e-6 + 28 * e4 / 4e9);
    said = g_strdup_printf("; the optimizer's %.0f elements at its fitted rate (no whole times "
                           "around them) (", e4);
    g_assert_nonnull(strstr(c.why, said));
    g_free(said);
}

/* With a measured copy curve (op_costs "copy", built as a collective's row: each size's
 * median), the collectives' copies are read off it, a launch each, while an add in place stays
 * at the convert rate (9e9 in the synthetic table); the curve round-trips, and a malformed one
 * is refused naming its key. */
static void test_copy_curve(void)
{
    const double B = 1e6;
    const double bytes[] = {B / 4, B / 4, B / 4, B, B, 4 * B};
    const double times[] = {3e-5, 1e-5, 2e-5, 1e-4, 1e-4, 3e-4};
    GError *error = NULL;
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    ZpCost c;
    tiny_setup(&hw, &m, &p, 0, 1, 0, FALSE);
    hw.op_costs = synthetic_table();
    ZpCollRow *curve = &hw.op_costs.copy;
    g_assert_true(zp_colltab_curve_build(bytes, times, G_N_ELEMENTS(bytes), "copies", curve,
                                         &error));
    g_assert_cmpint(curve->n, ==, 3);
    g_assert_cmpfloat(curve->time_s[0], ==, 2e-5);
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL) && c.table);
    ZpOp op = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLREDUCE, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 0, 4), ==, 2 * (1e-6 + 1e-4));
    op = (ZpOp){.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_REDUCE_SCATTER, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 2, 4), ==, 1e-6 + 2e-5); /* the share */
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 1, 4), ==, (1e-6 + 1e-4) + (1e-6 + 2e-5));
    op.micro = 1; /* the share added in place: the convert rate */
    g_assert_cmpfloat(fabs(zp_cost_coll_copy_s(&c, &op, 2, 4) - (1e-6 + 3 * B / 4 / 9e9)), <,
                      1e-15);
    /* Between two sizes, log-log; the unpack's copies (mem_bytes read and written) too. */
    const double mid = zp_cost_op_s(&c, ZP_COMP_UNPACK, -1, 0, 0, 0, 2 * 2 * B);
    g_assert_cmpfloat(mid, >, 1e-6 + 1e-4);
    g_assert_cmpfloat(mid, <, 1e-6 + 3e-4);
    json_t *j = zp_optable_to_json(&hw.op_costs);
    ZpOpTable back;
    g_assert_true(zp_optable_from_json(j, "t.json", &back, &error));
    g_assert_no_error(error);
    g_assert_true(memcmp(&back, &hw.op_costs, sizeof back) == 0);
    json_object_set_new(j, "copy", json_pack("{s:[f, f], s:[f, f]}", "bytes", 2.0, 1.0, "time_s",
                                             1.0, 1.0));
    g_assert_false(zp_optable_from_json(j, "t.json", &back, &error));
    g_assert_nonnull(strstr(error->message, "t.json: op_costs.copy"));
    g_clear_error(&error);
    json_decref(j);
}

/* The rank's own copies around a collective (real_engine_comm.c), by hand for a 1 MB array on 4
 * ranks, and their time at the copy rate (convert: 9e9 in the synthetic table); none without
 * a table. */
static void test_collective_copies(void)
{
    const double B = 1e6;
    ZpOp op = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLREDUCE, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 0, 1), ==, 4 * B); /* into the bucket, back */
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 1, 4), ==, 4 * B);
    op.buffer = -1; /* in place */
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 0, 1), ==, 0);
    op = (ZpOp){.sub = ZP_COLL_REDUCE_SCATTER, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 1, 4), ==, 2 * B + 2 * B / 4);
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 2, 4), ==, 2 * B / 4);
    op.micro = 1; /* accumulated: added in place in bf16 (both read, one written) */
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 2, 4), ==, 3 * B / 4);
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 1, 4), ==, 2 * B + 2 * B / 4);
    op = (ZpOp){.sub = ZP_COLL_ALLGATHER, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 1, 4), ==, 2 * B);
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 3, 1), ==, 2 * B); /* MPI's copy, alone */
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 1, 1), ==, 4 * B); /* MPI's, then placed */
    g_assert_cmpfloat(zp_cost_coll_copy_bytes(&op, 3, 4), ==, 0);
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    ZpCost c;
    tiny_setup(&hw, &m, &p, 0, 1, 0, FALSE);
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL) && !c.table);
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 1, 4), ==, 0);
    hw.op_costs = synthetic_table();
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpfloat(fabs(zp_cost_coll_copy_s(&c, &op, 1, 4) - (1e-6 + 2 * B / 9e9)), <, 1e-15);
    /* A coalesced gather's unpack is copies too: the same launch and copy rate. */
    g_assert_cmpfloat(fabs(zp_cost_op_s(&c, ZP_COMP_UNPACK, -1, 0, 0, 0, 2 * B) -
                           (1e-6 + 2 * B / 9e9)), <, 1e-15);
    /* A one-rank step without overlap is its compute ops and its collectives' copies. */
    zp_plan_defaults(&p, 1, 1, 1);
    p.zero.overlap_comm = FALSE;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    double sum = 0, copies = 0;
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *o = zp_sched_op(s, i);
        if (o->kind == ZP_OP_COMPUTE)
            sum += zp_cost_op_s(&c, o->sub, zp_op_module(o), o->flops, o->gemm_flops,
                                o->attn_flops, o->mem_bytes);
        else if (o->kind == ZP_OP_COLLECTIVE)
            copies += zp_cost_coll_copy_s(&c, o, 1, 1);
    }
    zp_sched_free(s);
    g_assert_cmpfloat(copies, >, 0);
    g_assert_cmpfloat(fabs(step_s(&m, &p, &hw) - (sum + copies)), <, 1e-9 * (sum + copies));
}

/* The CPU backend's workspace as real_gpt.c, real_engine.c and real_cpu.c allocate it, by hand
 * for tiny at micro-batch 8 (T 256 tokens, h 64, 4 heads, s 32, f 256, q 192, V 64), and the
 * schedule listing it: the run-long part plus one op's at a time, the largest the block
 * backward's, which is what zreal measures (1,748,224 bytes). Only for a profile measured on
 * that backend. */
static void test_backend_workspace(void)
{
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    tiny_setup(&hw, &m, &p, 0, 1, 8, FALSE);
    const double T = 256, h = 64, block = 4 * h * h + 2 * h * 256 + 9 * h + 256;
    g_assert_cmpfloat(zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_EMBED_FWD), ==, 4 * T * h);
    g_assert_cmpfloat(zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_BLOCK_FWD), ==,
                      4 * (T * (3 * h + 192 + 256 + 256 + 4) + 8 * 4 * 32));
    const double bwd = 4 * (block + T * (2 * 256 + 3 * h + 2 * 192));
    g_assert_cmpfloat(zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_BLOCK_BWD), ==, bwd);
    g_assert_cmpfloat(zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_HEAD), ==,
                      4 * (T * (2 * h + 2) + h * (64 + 2)));
    g_assert_cmpfloat(zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_OPTIMIZER), ==, 0);
    /* x and dx; fc2's weight gradient widens its bf16 input (f x T); fc1's weights (h x f) are
     * the largest bf16 second operand; two s x s attention tiles. */
    const double resident = 2 * T * h + 4 * T * h + 4 * (256 * T + h * 256 + 2 * 32 * 32);
    g_assert_cmpfloat(zp_cost_resident_workspace_bytes(&m, &p), ==, resident);
    g_assert_cmpfloat(resident + bwd, ==, 1748224);
    g_assert_false(zp_cost_cpu_backend(&hw));
    hw.op_costs = synthetic_table();
    g_assert_false(zp_cost_cpu_backend(&hw));
    g_strlcpy(hw.op_costs.backend, "cpu", sizeof hw.op_costs.backend);
    g_assert_true(zp_cost_cpu_backend(&hw));
    p.backend_workspace = TRUE;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    double listed = 0;
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *o = zp_sched_op(s, i);
        if (o->kind == ZP_OP_ALLOC && o->sub == ZP_MEM_WORKSPACE)
            listed += o->bytes;
    }
    const double logits = 4 * T * 64;
    g_assert_cmpfloat(listed, ==, resident + logits +
                                      zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_EMBED_FWD) +
                                      2 * zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_BLOCK_FWD) +
                                      zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_HEAD) +
                                      2 * bwd +
                                      zp_cost_op_workspace_bytes(&m, &p, ZP_COMP_EMBED_BWD));
    GError *error = NULL;
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(r->category_peak_bytes[ZP_MEM_WORKSPACE], ==, 1748224);
    sim_result_free(r);
    zp_sched_free(s);
}

/* A microbenchmark run whose every time a known table gives: t = launch + work / rate. */
static double grid_rate(int form, double x, double y)
{
    return (form + 1) * 1e9 * (x - 11) / (y + 1);
}

static json_t *synthetic_run(double add_slowdown)
{
    const double launch = 1e-6;
    json_t *gemm = json_array(), *memory = json_array(), *coll = json_array();
    json_t *grid = json_array(), *attn = json_array(), *ew = json_array();
    for (int i = 1; i <= 3; i++) {
        const double f = 2e6 * i * i * i;
        json_array_append_new(gemm, json_pack("{s:f, s:f}", "flops", f, "time_s", 1e-5 + f / 1e10));
        const double b = 1e6 * i;
        json_array_append_new(memory, json_pack("{s:s, s:f, s:f}", "kernel", "adam", "bytes", b,
                                                "time_s", launch + b / 2e9));
        json_array_append_new(memory, json_pack("{s:s, s:f, s:f}", "kernel", "gelu", "bytes", b,
                                                "time_s", 1e-6 + b / 1e9));
        static const char *const ops[] = {"allreduce", "reduce_scatter", "allgather"};
        for (int k = 0; k < 3; k++)
            json_array_append_new(coll, json_pack("{s:s, s:i, s:f, s:f}", "op", ops[k], "ranks", 2,
                                                  "bytes", b, "time_s",
                                                  1e-5 + (k ? 0.5 : 1.0) * b / 1e9));
    }
    for (int form = 0; form < ZP_GEMM_N; form++)
        for (int x = 12; x <= 18; x += 3)
            for (int y = 0; y <= 2; y += 2) {
                const double flops = pow(2, x + 1);
                json_array_append_new(grid, json_pack("{s:s, s:i, s:i, s:f, s:f}", "form",
                                                      zp_gemm_form_name(form), "log2_mnk", x,
                                                      "log2_aspect", y, "flops", flops, "time_s",
                                                      launch + flops / grid_rate(form, x, y)));
            }
    for (int pass = 0; pass < 2; pass++)
        for (int seq = 32; seq <= 64; seq *= 2)
            for (int hd = 16; hd <= 32; hd *= 2) {
                const double flops = 4.0 * (1 + pass) * seq * seq * hd * 8;
                json_array_append_new(attn, json_pack("{s:s, s:i, s:i, s:f, s:f}", "pass",
                                                      pass ? "backward" : "forward", "seq_len",
                                                      seq, "head_dim", hd, "flops", flops,
                                                      "time_s", launch + flops / (1e9 * (pass + 1))));
            }
    for (int c = 0; c < ZP_EW_N; c++)
        for (int i = 1; i <= 3; i++) {
            const double bytes = 1e5 * i;
            const double slow = c == ZP_EW_ADD && i == 3 ? add_slowdown : 1;
            json_array_append_new(ew, json_pack("{s:s, s:f, s:f}", "class", zp_ew_class_name(c),
                                                "bytes", bytes, "time_s",
                                                slow * (launch + bytes / ((c + 1) * 1e9))));
        }
    return json_pack("{s:s, s:s, s:i, s:f, s:o, s:o, s:o, s:f, s:o, s:o, s:o, s:{s:f, s:f}}",
                     "format", "zplan-microbench-1", "backend", "cpu", "world", 2,
                     "host_memory_bytes", 8e9, "gemm", gemm, "memory", memory, "collectives",
                     coll, "launch_s", launch, "gemm_grid", grid, "attention_grid", attn,
                     "elementwise", ew, "contention", "gemm_s", 1.0, "gemm_with_collective_s",
                     1.25);
}

static gboolean close_to(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fabs(b);
}

/* `zplan calibrate` turns runs into the table that made them: the grids exact at their
 * points, each class at its rate, launch and contention; the profile loads back to it; a
 * sample off by half is a warning on stderr naming its class. */
static void test_calibrated_round_trip(void)
{
    GError *error = NULL;
    char *dir = g_dir_make_tmp("test_cost-XXXXXX", NULL);
    char *run = g_build_filename(dir, "run.json", NULL);
    char *prof = g_build_filename(dir, "prof.json", NULL);
    json_t *root = synthetic_run(1);
    g_assert_true(zp_json_write(root, run, &error));
    json_decref(root);
    char *args = g_strdup_printf("calibrate %s --out %s", run, prof);
    TuRun r = tu_zplan(args);
    g_test_message("%s%s", r.out, r.err);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_null(strstr(r.err, "op table misses"));
    tu_free(&r);
    ZpHw hw;
    load_hw(prof, &hw);
    const ZpOpTable *t = &hw.op_costs;
    g_assert_true(t->present);
    g_assert_cmpstr(t->backend, ==, "cpu");
    g_assert_cmpfloat(t->launch_s, ==, 1e-6);
    g_assert_cmpfloat(t->contention, ==, 1.25);
    g_assert_true(close_to(t->optimizer_bytes_per_s, 2e9));
    for (int form = 0; form < ZP_GEMM_N; form++) {
        const ZpGrid *g = &t->gemm[form];
        g_assert_cmpint(g->nx, ==, 3);
        g_assert_cmpint(g->ny, ==, 2);
        for (int i = 0; i < g->nx; i++)
            for (int j = 0; j < g->ny; j++)
                g_assert_true(close_to(zp_grid_at(g, g->x[i], g->y[j]),
                                       grid_rate(form, g->x[i], g->y[j])));
    }
    g_assert_true(t->has_eager_attention);
    g_assert_true(close_to(zp_grid_at(&t->eager_attention[1], 5, 4), 2e9));
    for (int c = 0; c < ZP_EW_N; c++)
        g_assert_true(close_to(t->ew_bytes_per_s[c], (c + 1) * 1e9));
    /* Written and read again: the same table. */
    json_t *again = zp_json_load_object(prof, &error);
    g_assert_no_error(error);
    json_object_set_new(again, "op_costs", zp_optable_to_json(t));
    g_assert_true(zp_json_write(again, prof, &error));
    json_decref(again);
    ZpHw back;
    load_hw(prof, &back);
    g_assert_true(memcmp(&back.op_costs, t, sizeof *t) == 0);
    /* One residual add 1.5 times slower: over 10% off its class's line, said on stderr. */
    root = synthetic_run(1.5);
    g_assert_true(zp_json_write(root, run, &error));
    json_decref(root);
    r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "warning: the op table misses the elementwise class add"));
    g_assert_null(strstr(r.err, "class norm_fwd"));
    tu_free(&r);
    g_unlink(run);
    g_unlink(prof);
    g_rmdir(dir);
    g_free(args), g_free(run), g_free(prof), g_free(dir);
}

/* Whole-op times: every run's, whatever its rank count, kept per op, shape and ranks (the
 * median over runs of the same: 3 of 1, 3 and 11 s, where the mean would be 5), and what
 * zp_cost then finds for a plan of that shape. */
static void test_calibrated_whole_ops(void)
{
    GError *error = NULL;
    ZpModel m;
    ZpPlan p;
    load_model("tiny", &m);
    zp_plan_defaults(&p, 0, 2, 1);
    char shape[ZP_OPTABLE_SHAPE_LEN], opt[ZP_OPTABLE_SHAPE_LEN];
    zp_cost_op_shape(&m, &p, ZP_COMP_HEAD, shape);
    const double elems = (double)zp_sched_optimizer_elems(&m, &p);
    zp_cost_optimizer_shape(elems, opt);
    char *dir = g_dir_make_tmp("test_cost-XXXXXX", NULL);
    const int worlds[4] = {2, 2, 1, 2};
    const double times[4] = {1.0, 11.0, 5.0, 3.0};
    GString *args = g_string_new("calibrate");
    for (int i = 0; i < 4; i++) {
        json_t *root = synthetic_run(1);
        json_object_set_new(root, "world", json_integer(worlds[i]));
        json_object_set_new(root, "op_sequence",
                            json_pack("[{s:s, s:s, s:b, s:i, s:f}, {s:s, s:s, s:i, s:f}]", "op",
                                      "head", "shape", shape, "checkpoint", 0, "calls", 3,
                                      "time_s", times[i], "op", "optimizer", "shape", opt,
                                      "calls", 6, "time_s", times[i] / 100));
        char *name = g_strdup_printf("run%d.json", i);
        char *path = g_build_filename(dir, name, NULL);
        g_assert_true(zp_json_write(root, path, &error));
        g_string_append_printf(args, " %s", path);
        json_decref(root);
        g_free(name), g_free(path);
    }
    char *prof = g_build_filename(dir, "prof.json", NULL);
    g_string_append_printf(args, " --ranks 2 --out %s", prof);
    TuRun r = tu_zplan(args->str);
    g_test_message("%s: %s%s", args->str, r.out, r.err);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r);
    ZpHw hw;
    load_hw(prof, &hw);
    g_assert_cmpint(hw.op_costs.n_ops, ==, 4);
    g_assert_cmpfloat(zp_optable_op(&hw.op_costs, "head", shape, 2)->time_s, ==, 3.0);
    g_assert_cmpfloat(zp_optable_op(&hw.op_costs, "head", shape, 1)->time_s, ==, 5.0);
    g_assert_null(zp_optable_op(&hw.op_costs, "block_fwd", shape, 2));
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_HEAD, -1, 0, 0, 0, 0), ==, 3.0);
    /* The optimizer's time at its elements, kept per ranks like the others. */
    g_assert_true(c.whole[ZP_COMP_OPTIMIZER]);
    const double step_bytes = zp_plan_step_bytes(zp_plan_state_bytes(p.precision, p.optimizer));
    g_assert_true(close_to(zp_cost_op_s(&c, ZP_COMP_OPTIMIZER, -1, 0, 0, 0, step_bytes * elems),
                           0.03));
    double t1, around[2];
    g_assert_cmpint(zp_cost_optimizer_whole(&hw.op_costs, elems, 1, &t1, around), ==,
                    ZP_OPT_PATH_WHOLE);
    g_assert_true(close_to(t1, 0.05));
    for (int i = 0; i < 4; i++) {
        char *name = g_strdup_printf("run%d.json", i);
        char *path = g_build_filename(dir, name, NULL);
        g_unlink(path);
        g_free(name), g_free(path);
    }
    g_unlink(prof);
    g_rmdir(dir);
    g_free(prof), g_free(dir);
    g_string_free(args, TRUE);
}

/* `zplan calibrate` of one synthetic run whose collective timings are `coll`: its outcome
 * (the caller frees it) and, when it wrote one, the profile's object (NULL otherwise). */
static json_t *calibrate_collectives(json_t *coll, TuRun *r)
{
    GError *error = NULL;
    char *dir = g_dir_make_tmp("test_cost-XXXXXX", NULL);
    char *run = g_build_filename(dir, "run.json", NULL), *prof = g_build_filename(dir, "p.json", NULL);
    json_t *root = synthetic_run(1);
    json_object_set_new(root, "collectives", coll);
    g_assert_true(zp_json_write(root, run, &error));
    json_decref(root);
    char *args = g_strdup_printf("calibrate %s --out %s", run, prof);
    *r = tu_zplan(args);
    g_test_message("%s: %s%s", args, r->out, r->err);
    json_t *profile = json_load_file(prof, 0, NULL);
    g_unlink(run), g_unlink(prof), g_rmdir(dir);
    g_free(args), g_free(run), g_free(prof), g_free(dir);
    return profile;
}

/* Timings {op, ranks, bytes, time_s} of the three collectives at five sizes (2 KB to 8 MB, the
 * CPU microbenchmark's) on `ranks`, t[kind][size]. */
static void add_timings(json_t *coll, int ranks, const double t[3][5])
{
    static const char *const ops[] = {"allreduce", "reduce_scatter", "allgather"};
    static const double bytes[] = {2048, 32768, 524288, 4194304, 8388608};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 5; i++)
            json_array_append_new(coll, json_pack("{s:s, s:i, s:f, s:f}", "op", ops[k], "ranks",
                                                  ranks, "bytes", bytes[i], "time_s", t[k][i]));
}

/* The collectives' ring model is a non-negative fit: exact timings give back the model that
 * made them; the timings of a loaded machine (two busy-polling ranks sharing the cores with
 * other work: small collectives as slow as large ones, and an all-gather whose 8 MB took
 * less than its 2 KB), on which the unconstrained fit gave the all-gather a negative
 * bandwidth and calibrate failed, now give the best non-negative fit, the all-gather the
 * lowest bandwidth fitted for another kind, and warnings; timings with no growth at all fail
 * saying there is no signal. */
static void test_calibrated_collectives(void)
{
    static const double bytes[] = {2048, 32768, 524288, 4194304, 8388608};
    const double base = 2e-5, hop = 5e-6, bw[3] = {1e9, 2e9, 3e9};
    json_t *coll = json_array();
    for (int ranks = 2; ranks <= 4; ranks += 2) {
        double t[3][5];
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 5; i++)
                t[k][i] = base + hop * (k ? 1 : 2) * (ranks - 1) +
                          (k ? 1.0 : 2.0) * (ranks - 1) / ranks * bytes[i] / bw[k];
        add_timings(coll, ranks, t);
    }
    TuRun r;
    json_t *profile = calibrate_collectives(coll, &r);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_null(strstr(r.err, "collective"));
    tu_free(&r);
    json_t *fit = json_object_get(profile, "collective_fit");
    g_assert_cmpfloat(fabs(json_number_value(json_object_get(fit, "base_latency_s")) / base - 1),
                      <, 1e-6);
    g_assert_cmpfloat(fabs(json_number_value(json_object_get(profile, "intra_node_latency_s")) /
                               hop - 1), <, 1e-6);
    static const char *const kinds[] = {"allreduce", "reduce_scatter", "allgather"};
    for (int k = 0; k < 3; k++)
        g_assert_cmpfloat(fabs(json_number_value(json_object_get(
                                   json_object_get(fit, "bus_bytes_per_s"), kinds[k])) / bw[k] - 1),
                          <, 1e-6);
    /* The table holds every timing (one run: each size's median is itself). A group of 2
     * ranks, on one machine of the profile's 2 (the run's world), reads its collectives off it,
     * exactly at a timed size; 4 ranks span two machines and take the fitted ring, though the
     * table has a row for them. */
    ZpHw hw;
    GError *error = NULL;
    g_assert_true(zp_hw_from_json(profile, "p.json", &hw, &error));
    g_assert_cmpint(hw.gpus_per_node, ==, 2);
    g_assert_cmpint(hw.collective_table.n_rows, ==, 6);
    const SimCollGroup g = sim_coll_group(&hw, 2, 1, ZP_GROUP_DP);
    for (int k = 0; k < 3; k++) {
        const ZpCollRow *row = zp_colltab_find(&hw.collective_table, k, 2);
        g_assert_nonnull(row);
        g_assert_true(g.measured[k] == row);
        g_assert_cmpint(row->n, ==, 5);
        for (int i = 0; i < 5; i++) {
            const double want = base + hop * (k ? 1 : 2) + (k ? 0.5 : 1.0) * bytes[i] / bw[k];
            const SimCollCost c = sim_coll_cost(k, bytes[i], &g);
            g_assert_cmpfloat(fabs(c.latency_s + c.transfer_s - want), <=, 1e-12 * want);
        }
    }
    g_assert_true(g.measured[ZP_COLL_ALLTOALL] == g.measured[ZP_COLL_ALLGATHER]);
    char how[256];
    sim_coll_describe(&g, 1u << ZP_COLL_ALLREDUCE | 1u << ZP_COLL_ALLGATHER, how, sizeof how);
    g_assert_cmpstr(how, ==, "2 ranks: all-reduce, all-gather from the profile's measured table "
                             "(time by size)");
    g_assert_nonnull(zp_colltab_find(&hw.collective_table, ZP_COLL_REDUCE_SCATTER, 4));
    const SimCollGroup far = sim_coll_group(&hw, 4, 1, ZP_GROUP_DP);
    g_assert_cmpint(far.nodes, ==, 2);
    g_assert_null(far.measured[ZP_COLL_REDUCE_SCATTER]);
    sim_coll_describe(&far, 1u << ZP_COLL_REDUCE_SCATTER, how, sizeof how);
    g_assert_cmpstr(how, ==, "4 ranks: reduce-scatter by its fitted ring");
    json_decref(profile);

    /* Loaded: 4-8 ms whatever the size. */
    const double loaded[3][5] = {{0.0078, 0.0048, 0.0069, 0.0070, 0.0140},
                                 {0.0065, 0.0074, 0.0044, 0.0061, 0.0090},
                                 {0.0048, 0.0073, 0.0055, 0.0018, 0.0045}};
    coll = json_array();
    add_timings(coll, 2, loaded);
    profile = calibrate_collectives(coll, &r);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "warning: the allgather timings tie no time to their bytes"));
    g_assert_nonnull(strstr(r.err, "warning: the fit of the collectives"));
    tu_free(&r);
    fit = json_object_get(profile, "collective_fit");
    json_t *fitted = json_object_get(fit, "bus_bytes_per_s");
    const double ar = json_number_value(json_object_get(fitted, "allreduce"));
    const double rs = json_number_value(json_object_get(fitted, "reduce_scatter"));
    g_assert_cmpfloat(ar, >, rs); /* reduce-scatter grows faster with bytes here: the lowest */
    g_assert_cmpfloat(json_number_value(json_object_get(fitted, "allgather")), ==, rs);
    g_assert_cmpfloat(json_number_value(json_object_get(fit, "base_latency_s")), >=, 0);
    g_assert_cmpfloat(json_number_value(json_object_get(profile, "intra_node_latency_s")), >=, 0);
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(profile, "calibration"),
                                                        "collective_rms_rel_error")), >, 0.10);
    json_decref(profile);

    /* No growth anywhere: nothing to fit, said. */
    double flat[3][5];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 5; i++)
            flat[k][i] = 5e-3;
    coll = json_array();
    add_timings(coll, 2, flat);
    profile = calibrate_collectives(coll, &r);
    g_assert_null(profile);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "collectives: no signal: no collective's time grows with the "
                                   "bytes it sends"));
    tu_free(&r);
}

/* The collective table: built from timings, each size's median, pooled to non-decreasing;
 * read off exactly at a measured size, monotone between two, a latency floor below the
 * smallest and the largest's bus bandwidth above; written and read back as it was; and a
 * malformed row refused naming its key. */
static void test_collective_table(void)
{
    /* All-reduce on 2 ranks: 1 KB three times (median 10 us), 1 MB (1 ms), 4 MB twice
     * (median of 3 and 5 ms: 4 ms) and 2 MB at 5 ms, slower than 4 MB: pooled, 2 and 4 MB take
     * their mean 4.5 ms. One all-gather on 4 ranks, and a 1-rank timing that has no row. */
    const int kind[] = {0, 0, 0, 0, 0, 0, 0, 0, 2, 0};
    const int ranks[] = {2, 2, 2, 2, 2, 2, 2, 2, 4, 1};
    const double bytes[] = {1e3, 1e3, 1e3, 1e6, 4e6, 4e6, 2e6, 1e6, 8e6, 1e3};
    const double time_s[] = {12e-6, 9e-6, 10e-6, 1e-3, 3e-3, 5e-3, 5e-3, 1e-3, 2e-3, 1.0};
    ZpCollTable t;
    GError *error = NULL;
    g_assert_true(zp_colltab_build(kind, ranks, bytes, time_s, G_N_ELEMENTS(kind), &t, &error));
    g_assert_cmpint(t.n_rows, ==, 2);
    const ZpCollRow *ar = zp_colltab_find(&t, ZP_COLL_ALLREDUCE, 2);
    g_assert_nonnull(ar);
    g_assert_null(zp_colltab_find(&t, ZP_COLL_ALLREDUCE, 4));
    g_assert_null(zp_colltab_find(&t, ZP_COLL_ALLREDUCE, 1));
    g_assert_nonnull(zp_colltab_find(&t, ZP_COLL_ALLGATHER, 4));
    g_assert_cmpint(ar->n, ==, 4);
    const double want_bytes[] = {1e3, 1e6, 2e6, 4e6}, want_s[] = {10e-6, 1e-3, 4.5e-3, 4.5e-3};
    for (int i = 0; i < 4; i++) {
        g_assert_cmpfloat(ar->bytes[i], ==, want_bytes[i]);
        g_assert_cmpfloat(fabs(ar->time_s[i] / want_s[i] - 1), <, 1e-12);
        g_assert_cmpfloat(zp_colltab_time_s(ar, ar->bytes[i]), ==, ar->time_s[i]);
    }
    /* Between two sizes: log-log, so 31.6 KB (half-way in log) is the geometric mean. */
    g_assert_cmpfloat(fabs(zp_colltab_time_s(ar, sqrt(1e3 * 1e6)) / sqrt(10e-6 * 1e-3) - 1), <,
                      1e-12);
    for (int i = 0; i + 1 < ar->n; i++) {
        double before = ar->time_s[i];
        for (int step = 1; step < 64; step++) {
            const double b = ar->bytes[i] * pow(ar->bytes[i + 1] / ar->bytes[i], step / 64.0);
            const double s = zp_colltab_time_s(ar, b);
            g_assert_cmpfloat(s, >=, before);
            g_assert_cmpfloat(s, <=, ar->time_s[i + 1] * (1 + 1e-12));
            before = s;
        }
    }
    g_assert_cmpfloat(zp_colltab_time_s(ar, 10), ==, 10e-6);
    g_assert_cmpfloat(fabs(zp_colltab_time_s(ar, 8e6) / 9e-3 - 1), <, 1e-12);

    json_t *j = zp_colltab_to_json(&t);
    ZpCollTable back;
    g_assert_true(zp_colltab_from_json(j, "t.json", &back, &error));
    g_assert_cmpmem(&back, sizeof back, &t, sizeof t);

    static const struct {
        const char *row, *says;
    } bad[] = {
        {"{\"op\": \"broadcast\", \"ranks\": 2, \"bytes\": [1], \"time_s\": [1]}",
         "t.json: collective_table[1]: key \"op\": unknown value 'broadcast'"},
        {"{\"op\": \"allreduce\", \"ranks\": 1, \"bytes\": [1], \"time_s\": [1]}",
         "t.json: collective_table[1]: key \"ranks\""},
        {"{\"op\": \"allreduce\", \"ranks\": 4, \"bytes\": [1, 2], \"time_s\": [2, 1]}",
         "t.json: collective_table[1]: keys \"bytes\" and \"time_s\" must be arrays"},
        {"{\"op\": \"allreduce\", \"ranks\": 4, \"bytes\": [2, 1], \"time_s\": [1, 2]}",
         "t.json: collective_table[1]: keys \"bytes\" and \"time_s\""},
        {"{\"op\": \"allreduce\", \"ranks\": 4, \"bytes\": [1, 2], \"time_s\": [1]}",
         "t.json: collective_table[1]: keys \"bytes\" and \"time_s\""},
        {"{\"op\": \"allreduce\", \"ranks\": 2, \"bytes\": [1], \"time_s\": [1]}",
         "t.json: collective_table[1]: a second row of allreduce at 2 ranks"},
        {"{\"op\": \"allreduce\", \"ranks\": 4, \"bytes\": [1], \"time_s\": [1], "
         "\"busbw\": 1}", "t.json: collective_table[1]"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        json_t *a = json_array();
        json_array_append(a, json_array_get(j, 0));
        json_array_append_new(a, json_loads(bad[i].row, 0, NULL));
        g_assert_false(zp_colltab_from_json(a, "t.json", &back, &error));
        g_test_message("%s", error->message);
        g_assert_true(g_str_has_prefix(error->message, bad[i].says));
        g_clear_error(&error);
        json_decref(a);
    }
    json_decref(j);

    /* More sizes than a row holds: refused, saying so. */
    int k[ZP_COLLTAB_MAX_POINTS + 1], r[ZP_COLLTAB_MAX_POINTS + 1];
    double b[ZP_COLLTAB_MAX_POINTS + 1], s[ZP_COLLTAB_MAX_POINTS + 1];
    for (int i = 0; i <= ZP_COLLTAB_MAX_POINTS; i++)
        k[i] = 1, r[i] = 2, b[i] = 1e3 * (i + 1), s[i] = 1e-5 * (i + 1);
    g_assert_false(zp_colltab_build(k, r, b, s, G_N_ELEMENTS(k), &t, &error));
    g_assert_nonnull(strstr(error->message, "reduce_scatter on 2 ranks was timed at more than"));
    g_clear_error(&error);
}

/* gpt2-124m's schedule at stage 3 on 2 ranks, micro-batch 1, DeepSpeed's implementation (the
 * default), and in *hw the H100 profile with the synthetic op table. */
static ZpSchedule *gpt2_stage3_on_table(ZpHw *hw)
{
    ZpModel m;
    ZpPlan p;
    tiny_setup(hw, &m, &p, 3, 2, 1, TRUE);
    load_model("gpt2-124m", &m);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* Contention slows the compute op of every stream of a rank: gpt2-124m at DeepSpeed's stage 3
 * unpacks gathered buckets on the gather stream beside the compute stream's blocks. The
 * simulator kept one running compute op per rank, lost the first one's end when the second
 * started, and stopped ("schedule deadlock: rank 0 ran 111 of 489 ops"). With the synthetic
 * table's 1.5 the step runs, a little longer than with no contention. */
static void test_contention_every_stream(void)
{
    ZpHw hw;
    ZpSchedule *s = gpt2_stage3_on_table(&hw);
    GError *error = NULL;
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    double step_s[2];
    for (int slowed = 0; slowed <= 1; slowed++) {
        hw.op_costs.contention = slowed ? 1.5 : 1;
        SimResult *r = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        step_s[slowed] = r->step_time_s;
        sim_result_free(r);
    }
    g_test_message("step %.9g s without contention, %.9g s with", step_s[0], step_s[1]);
    g_assert_cmpfloat(step_s[1], >, step_s[0]);
    zp_sched_free(s);
}

/* A profile whose op table was measured on zreal's CPU backend runs a rank's ops in line: at
 * stage 3 the prefetched all-gathers, which overlap compute on a GPU's streams, add to the step
 * there, which is then the one stream's busy time (nothing of a rank overlaps), every collective
 * exposed; the output says so. Another backend's table keeps the streams apart. */
static void test_ops_in_line(void)
{
    ZpHw hw;
    ZpSchedule *s = gpt2_stage3_on_table(&hw);
    GError *error = NULL;
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r[2];
    for (int cpu = 0; cpu <= 1; cpu++) {
        g_strlcpy(hw.op_costs.backend, cpu ? "cpu" : "cuda", sizeof hw.op_costs.backend);
        g_assert_true(zp_cost_cpu_backend(&hw) == cpu);
        r[cpu] = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        g_test_message("%s: step %.6g s, compute stream %.6g s, dp stream %.6g s, exposed %.6g s",
                       hw.op_costs.backend, r[cpu]->step_time_s,
                       r[cpu]->stream_busy_s[ZP_STREAM_COMPUTE],
                       r[cpu]->stream_busy_s[ZP_STREAM_DP], r[cpu]->exposed_comm_s);
    }
    g_assert_cmpfloat(r[0]->stream_busy_s[ZP_STREAM_DP], >, 0);
    g_assert_cmpfloat(r[0]->exposed_comm_s, <, r[0]->stream_busy_s[ZP_STREAM_DP]);
    g_assert_cmpfloat(r[1]->stream_busy_s[ZP_STREAM_DP], ==, 0);
    g_assert_cmpfloat(fabs(r[1]->step_time_s - r[1]->stream_busy_s[ZP_STREAM_COMPUTE]), <=,
                      1e-9 * r[1]->step_time_s);
    g_assert_cmpfloat(r[1]->step_time_s, >, r[0]->step_time_s);
    g_assert_true(g_str_has_prefix(r[1]->collective_model, "in line with compute"));
    g_assert_null(strstr(r[0]->collective_model, "in line"));
    sim_result_free(r[0]), sim_result_free(r[1]);
    zp_sched_free(s);
}

/* A block op's module shares come from its kernels: each block op's kernels sum, per module,
 * to the module's share, and with the op table (kernel sums, and a whole-op time split the same
 * way) and on the roofline a stage-3 DeepSpeed schedule's module ops take exactly the block
 * op's time: tiny at stage 3 with checkpointing, where the module ops of each block op sum to
 * the time of that op in the whole-block schedule. */
static void test_module_shares(void)
{
    for (int table = 0; table <= 1; table++) {
        ZpHw hw;
        ZpModel m;
        ZpPlan p;
        tiny_setup(&hw, &m, &p, 3, 2, 2, table);
        p.checkpoint = TRUE;
        ZpCost c;
        g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
        g_assert_true(c.table == table);
        const ZpComputeKind kinds[] = {ZP_COMP_BLOCK_FWD, ZP_COMP_RECOMPUTE, ZP_COMP_BLOCK_BWD};
        for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++) {
            ZpModuleShares sh;
            zp_cost_module_shares(&m, &p, kinds[k], &c, &sh);
            double sum[4] = {0};
            for (int mod = 0; mod < ZP_MOD_N; mod++) {
                sum[0] += sh.flops[mod], sum[1] += sh.accesses[mod], sum[2] += sh.time[mod];
                sum[3] += sh.attn_flops[mod];
            }
            for (int f = 0; f < 4; f++)
                g_assert_cmpfloat(fabs(sum[f] - 1), <, 1e-12);
            /* the attention core rides with qkv forward and with proj backward */
            g_assert_cmpfloat(sh.attn_flops[kinds[k] == ZP_COMP_BLOCK_BWD ? ZP_MOD_PROJ
                                                                          : ZP_MOD_QKV], ==, 1);
            g_assert_cmpfloat(sh.flops[ZP_MOD_LN1], ==, 0);
            g_assert_cmpfloat(sh.flops[ZP_MOD_LN2], ==, 0);
        }
        ZpSchedule *split = zp_sched_build(&m, &p, NULL);
        p.block_compute = TRUE;
        ZpSchedule *whole = zp_sched_build(&m, &p, NULL);
        double split_s = 0, whole_s = 0;
        guint n_split = 0, n_whole = 0;
        for (int pass = 0; pass < 2; pass++) {
            const ZpSchedule *s = pass ? whole : split;
            for (guint i = 0; i < s->ops->len; i++) {
                const ZpOp *o = zp_sched_op(s, i);
                if (o->kind != ZP_OP_COMPUTE || (o->sub != ZP_COMP_BLOCK_FWD &&
                                                 o->sub != ZP_COMP_RECOMPUTE &&
                                                 o->sub != ZP_COMP_BLOCK_BWD))
                    continue;
                const double t = zp_cost_op_s(&c, o->sub, zp_op_module(o), o->flops,
                                              o->gemm_flops, o->attn_flops, o->mem_bytes);
                *(pass ? &whole_s : &split_s) += t;
                (*(pass ? &n_whole : &n_split))++;
            }
        }
        g_assert_cmpuint(n_split, ==, ZP_MOD_N * n_whole);
        g_test_message("%s: module ops %.9g s, block ops %.9g s", table ? "table" : "roofline",
                       split_s, whole_s);
        g_assert_cmpfloat(fabs(split_s - whole_s), <=, 1e-12 * whole_s);
        zp_sched_free(split);
        zp_sched_free(whole);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/cost/round-trip", test_round_trip);
    g_test_add_func("/cost/interpolation", test_interpolation);
    g_test_add_func("/cost/fallback-reported", test_fallback_reported);
    g_test_add_func("/cost/hand-computed", test_hand_computed);
    g_test_add_func("/cost/contention", test_contention);
    g_test_add_func("/cost/whole-op", test_whole_op);
    g_test_add_func("/cost/whole-optimizer", test_whole_optimizer);
    g_test_add_func("/cost/module-shares", test_module_shares);
    g_test_add_func("/cost/collective-copies", test_collective_copies);
    g_test_add_func("/cost/copy-curve", test_copy_curve);
    g_test_add_func("/cost/backend-workspace", test_backend_workspace);
    g_test_add_func("/cost/calibrated-round-trip", test_calibrated_round_trip);
    g_test_add_func("/cost/calibrated-whole-ops", test_calibrated_whole_ops);
    g_test_add_func("/cost/calibrated-collectives", test_calibrated_collectives);
    g_test_add_func("/cost/collective-table", test_collective_table);
    g_test_add_func("/cost/contention-every-stream", test_contention_every_stream);
    g_test_add_func("/cost/ops-in-line", test_ops_in_line);
    return g_test_run();
}
