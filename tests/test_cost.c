/* test_cost: the op-level cost model — a profile's op table read back as written, the GEMM
 * surface exact at its grid points and monotone between them, the fallback to the roofline
 * said out loud, no contention without overlap, and op times a hand computation gives. */
#include "cost_common.h"

/* dgx-h100's profile with an op table, written to a temporary file: `root` and `table` stay
 * open for a test to change and write again (table_file_write). */
typedef struct {
    json_t *root, *table;
    char *dir, *path;
} TableFile;

static void table_file_write(TableFile *f)
{
    GError *error = NULL;
    g_assert_true(zp_json_write(f->root, f->path, &error));
    g_assert_no_error(error);
}

static TableFile table_file(const ZpOpTable *t)
{
    GError *error = NULL;
    char *src = g_build_filename(zp_data_dir(), "hwprofiles", "dgx-h100.json", NULL);
    TableFile f = {.root = zp_json_load_object(src, &error), .table = zp_optable_to_json(t),
                   .dir = g_dir_make_tmp("test_cost-XXXXXX", NULL)};
    g_assert_no_error(error);
    g_free(src);
    json_object_set(f.root, "op_costs", f.table);
    f.path = g_build_filename(f.dir, "profile.json", NULL);
    table_file_write(&f);
    return f;
}

static void table_file_free(TableFile *f)
{
    g_unlink(f->path);
    g_rmdir(f->dir);
    json_decref(f->table);
    json_decref(f->root);
    g_free(f->path), g_free(f->dir);
}

/* A profile with an op table, written to JSON, loads back to the same table. */
static void test_round_trip(void)
{
    GError *error = NULL;
    const ZpOpTable t = synthetic_table();
    TableFile f = table_file(&t);
    ZpHw hw;
    load_hw(f.path, &hw);
    g_assert_true(hw.op_costs.present);
    g_assert_cmpstr(hw.op_costs.source, ==, t.source);
    g_assert_true(memcmp(&hw.op_costs, &t, sizeof t) == 0);
    /* A table with a missing class is refused naming it. */
    json_object_del(json_object_get(f.table, "elementwise_bytes_per_s"), "rope");
    table_file_write(&f);
    g_assert_false(zp_hw_load(f.path, &hw, &error));
    g_assert_nonnull(strstr(error->message, "rope"));
    g_clear_error(&error);
    table_file_free(&f);
}

/* Eager attention at heads levels: a call is its fixed time plus its FLOPs at the rate of the
 * heads per sample, linear in log2 heads between two levels and held beyond them; zp_cost asks
 * at the model's heads over the tensor degree. The levels and fixed times are written and read
 * back, and a table without them (the format before) is one level of 8 heads with the launch
 * as fixed time. */
static void test_attention_heads_levels(void)
{
    ZpOpTable t = synthetic_table();
    t.attn_levels = 2, t.attn_log2_heads[0] = 1, t.attn_log2_heads[1] = 3; /* 2 and 8 heads */
    for (int p = 0; p < 2; p++) {
        t.eager_attention[1][p] = t.eager_attention[0][p];
        t.eager_attention[0][p].v[0][0] = (p + 1) * 1e9;
        t.eager_attention[1][p].v[0][0] = (p + 1) * 3e9;
        t.attn_fixed_s[p] = (p + 1) * 2e-6;
    }
    const double F = 6e6;
    for (int p = 0; p < 2; p++) {
        const double fixed = (p + 1) * 2e-6, rate = (p + 1) * 1e9;
        g_assert_cmpfloat(fabs(zp_optable_attention_s(&t, p, F, 5, 4, 2) -
                               (fixed + F / (2 * rate))), <, 1e-15);
        g_assert_cmpfloat(zp_optable_attention_s(&t, p, F, 5, 4, 0), ==, fixed + F / rate);
        g_assert_cmpfloat(zp_optable_attention_s(&t, p, F, 5, 4, 7), ==, fixed + F / (3 * rate));
    }
    /* zp_cost: tiny has 4 heads, 2 a rank at tensor degree 2; in a step's stream each kernel
     * costs launch_stream_s where a kernel timed alone cost launch_s. */
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    tiny_setup(&hw, &m, &p, 0, 1, 1, TRUE);
    t.launch_stream_s = 0.25e-6;
    hw.op_costs = t;
    for (int mp = 1; mp <= 2; mp++) {
        p.mp = mp;
        ZpCost c;
        g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
        g_assert_true(c.table);
        g_assert_cmpfloat(c.log2_heads, ==, mp == 1 ? 2 : 1);
        const ZpKernel k = {.kind = ZP_KERNEL_ATTENTION, .sub = 1, .flops = F};
        g_assert_cmpfloat(fabs(zp_cost_kernel_s(&c, &k) -
                               (zp_optable_attention_s(&t, 1, F, c.log2_seq, c.log2_head_dim,
                                                       mp == 1 ? 2 : 1) -
                                0.75e-6)), <, 1e-18);
        const ZpKernel add = {.kind = ZP_KERNEL_EW, .sub = ZP_EW_ADD, .bytes = 5e3};
        g_assert_cmpfloat(fabs(zp_cost_kernel_s(&c, &add) - (0.25e-6 + 5e3 / 5e9)), <, 1e-18);
    }
    /* Written and read back; the format without levels; a level count the grids do not have. */
    GError *error = NULL;
    TableFile f = table_file(&t);
    load_hw(f.path, &hw);
    g_assert_true(memcmp(&hw.op_costs, &t, sizeof t) == 0);
    json_t *attn = json_object_get(f.table, "eager_attention");
    json_object_del(attn, "fixed_s");
    json_object_del(attn, "log2_heads");
    json_object_set_new(attn, "forward", json_pack("[[f]]", 5e9));
    json_object_set_new(attn, "backward", json_pack("[[f]]", 6e9));
    table_file_write(&f);
    load_hw(f.path, &hw);
    g_assert_cmpint(hw.op_costs.attn_levels, ==, 1);
    g_assert_cmpfloat(hw.op_costs.attn_log2_heads[0], ==, 3);
    g_assert_cmpfloat(hw.op_costs.attn_fixed_s[0], ==, t.launch_s);
    g_assert_cmpfloat(hw.op_costs.attn_fixed_s[1], ==, t.launch_s);
    g_assert_cmpfloat(zp_optable_attention_s(&hw.op_costs, 1, F, 5, 4, 6), ==,
                      t.launch_s + F / 6e9);
    json_object_set_new(attn, "log2_heads", json_pack("[f, f]", 1.0, 3.0));
    table_file_write(&f);
    g_assert_false(zp_hw_load(f.path, &hw, &error));
    g_assert_nonnull(strstr(error->message, "\"forward\" must be 2 grids, one per log2_heads"));
    g_clear_error(&error);
    json_object_del(attn, "log2_heads");
    json_object_set_new(attn, "fixed_s", json_pack("[f]", 1e-6));
    table_file_write(&f);
    g_assert_false(zp_hw_load(f.path, &hw, &error));
    g_assert_nonnull(strstr(error->message, "\"fixed_s\" must be two times"));
    g_clear_error(&error);
    table_file_free(&f);
}

/* A GEMM timed at its exact shape: zp_cost takes that time (less what a stream saves of its
 * launch) for the LM head's GEMM of that form and shape, and the surface for a block linear's
 * of the same dimensions; the shapes are written and read back, and a form not known fails. */
static void test_gemm_shapes(void)
{
    ZpOpTable t = synthetic_table();
    t.launch_stream_s = 0.5e-6;
    t.n_gemm_shapes = 1;
    t.gemm_shapes[0] = (ZpGemmShape){.form = ZP_GEMM_FORWARD, .head = TRUE, .m = 32, .n = 64,
                                     .k = 64, .time_s = 4e-3};
    t.has_gemm_head = TRUE; /* the head's surfaces: a half and a third of the block's rates */
    for (int v = 0; v < 2; v++)
        for (int f = 0; f < ZP_GEMM_N; f++) {
            t.gemm_head[v][f] = t.gemm[f];
            for (int i = 0; i < t.gemm[f].nx; i++)
                for (int j = 0; j < t.gemm[f].ny; j++)
                    t.gemm_head[v][f].v[i][j] /= 2 + v;
        }
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    tiny_setup(&hw, &m, &p, 0, 1, 1, TRUE);
    hw.op_costs = t;
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    ZpKernel k = {.kind = ZP_KERNEL_GEMM, .sub = ZP_GEMM_FORWARD, .m = 32, .n = 64, .k = 64,
                  .flops = 2.0 * 32 * 64 * 64, .head = TRUE};
    g_assert_cmpfloat(fabs(zp_cost_kernel_s(&c, &k) - (4e-3 - 0.5e-6)), <, 1e-18);
    k.head = FALSE;
    double x, y;
    zp_gemm_coords(32, 64, 64, &x, &y);
    g_assert_cmpfloat(fabs(zp_cost_kernel_s(&c, &k) -
                           (0.5e-6 + k.flops / zp_grid_at(&t.gemm[ZP_GEMM_FORWARD], x, y))),
                      <, 1e-18);
    /* A head's GEMM timed at no exact shape: its own surface, the odd one for a dimension no
     * multiple of 8. */
    k.head = TRUE, k.n = 65, k.flops = 2.0 * 32 * 65 * 64;
    zp_gemm_coords(32, 65, 64, &x, &y);
    g_assert_cmpfloat(fabs(zp_cost_kernel_s(&c, &k) -
                           (0.5e-6 + k.flops / zp_grid_at(&t.gemm_head[1][ZP_GEMM_FORWARD], x, y))),
                      <, 1e-18);
    /* tiny's head marks its three GEMMs, the forward the shape above (32 tokens, 64 x 64). */
    ZpKernels ks;
    zp_cost_kernels(&m, &p, ZP_COMP_HEAD, &ks);
    int heads = 0;
    for (int i = 0; i < ks.n; i++)
        heads += ks.k[i].kind == ZP_KERNEL_GEMM && ks.k[i].head;
    g_assert_cmpint(heads, ==, 3);
    GError *error = NULL;
    TableFile f = table_file(&t);
    load_hw(f.path, &hw);
    g_assert_true(memcmp(&hw.op_costs, &t, sizeof t) == 0);
    json_object_set_new(json_array_get(json_object_get(f.table, "gemm_shapes"), 0), "form",
                        json_string("sideways"));
    table_file_write(&f);
    g_assert_false(zp_hw_load(f.path, &hw, &error));
    g_assert_nonnull(strstr(error->message, "gemm_shapes: key \"form\" must be forward"));
    g_clear_error(&error);
    table_file_free(&f);
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
    g_assert_cmpstr(c.why, ==,
                    "roofline (the fallback): the profile has no op_costs table and no "
                    "kernel_rates");
    /* The roofline's figure, unchanged. */
    const double peak = zp_hw_peak_flops(&hw, p.precision);
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_BLOCK_FWD, -1, 1e12, 1e10, 0, 1e9), ==,
                      zp_hw_compute_time_s(&hw, peak, 1e12, 1e10, 0, 0, 1e9, FALSE));
    /* A table without eager attention cannot cost an eager plan. */
    hw.op_costs = synthetic_table();
    hw.op_costs.has_eager_attention = FALSE;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_false(c.table);
    g_assert_cmpstr(c.why, ==, "roofline (the fallback): the op table has no eager_attention "
                               "rates and no kernel_rates");
    /* The V100's profile has neither an op table nor kernel rates (no published V100 figures
     * were found for them): `zplan simulate` says the roofline is the fallback. */
    json_t *out = tu_zplan_json("simulate --model tiny --cluster dgx2-v100 --gpus 2 --stage 1 "
                                "--micro-batch 1 --json");
    g_assert_cmpstr(json_string_value(json_object_get(out, "cost_model")), ==,
                    "roofline (the fallback): the profile has no op_costs table and no "
                    "kernel_rates");
    g_assert_null(json_object_get(out, "compute_by_class"));
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
    g_test_add_func("/cost/attention-heads-levels", test_attention_heads_levels);
    g_test_add_func("/cost/gemm-shapes", test_gemm_shapes);
    g_test_add_func("/cost/fallback-reported", test_fallback_reported);
    g_test_add_func("/cost/hand-computed", test_hand_computed);
    g_test_add_func("/cost/contention", test_contention);
    g_test_add_func("/cost/whole-op", test_whole_op);
    g_test_add_func("/cost/whole-optimizer", test_whole_optimizer);
    g_test_add_func("/cost/module-shares", test_module_shares);
    g_test_add_func("/cost/backend-workspace", test_backend_workspace);
    g_test_add_func("/cost/contention-every-stream", test_contention_every_stream);
    g_test_add_func("/cost/ops-in-line", test_ops_in_line);
    return g_test_run();
}
