/* test_cost_calibrated: the cost model on calibrated tables — round trips of a calibrated
 * profile, whole ops and collectives as measured, the collective table, and the copies around
 * a collective and their copy curve. */
#include "cost_common.h"

/* With a measured copy curve (op_costs "copy", built as a collective's row: each size's
 * least over the runs), the collectives' copies are read off it, a launch each, while an add
 * in place stays at the convert rate (9e9 in the synthetic table); the curve round-trips, and a
 * malformed one is refused naming its key. */
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
    g_assert_true(zp_colltab_curve_build(bytes, times, G_N_ELEMENTS(bytes), ZP_COLLTAB_LEAST,
                                         "copies", curve, &error));
    g_assert_cmpint(curve->n, ==, 3);
    g_assert_cmpfloat(curve->time_s[0], ==, 1e-5);
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL) && c.table);
    ZpOp op = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_ALLREDUCE, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 0, 4), ==, 2 * (1e-6 + 1e-4));
    op = (ZpOp){.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_REDUCE_SCATTER, .buffer = 0, .bytes = B};
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 2, 4), ==, 1e-6 + 1e-5); /* the share */
    g_assert_cmpfloat(zp_cost_coll_copy_s(&c, &op, 1, 4), ==, (1e-6 + 1e-4) + (1e-6 + 1e-5));
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
    int durations = 0;
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *o = zp_sched_op(s, i);
        if (o->kind == ZP_OP_COMPUTE)
            sum += zp_cost_op_s(&c, o->sub, zp_op_module(o), o->flops, o->gemm_flops,
                                o->attn_flops, o->mem_bytes);
        else if (o->kind == ZP_OP_COLLECTIVE)
            copies += zp_cost_coll_copy_s(&c, o, 1, 1);
        durations += o->kind == ZP_OP_COMPUTE || o->kind == ZP_OP_COLLECTIVE;
    }
    zp_sched_free(s);
    g_assert_cmpfloat(copies, >, 0);
    /* Each op's duration is rounded to the simulator's clock grid (half a quantum at most). */
    g_assert_cmpfloat(fabs(step_s(&m, &p, &hw) - (sum + copies)), <,
                      1e-9 * (sum + copies) + durations * SIM_CLOCK_HALF_Q_S);
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
    g_assert_cmpfloat(t->launch_stream_s, ==, 1e-6); /* the run did not time it */
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
    g_assert_true(close_to(zp_grid_at(&t->eager_attention[0][1], 5, 4), 2e9));
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

/* A temporary folder with a run's and a profile's paths, and calibrate's arguments for them. */
typedef struct {
    char *dir, *run, *prof, *args;
} CalFiles;

static CalFiles cal_files(void)
{
    CalFiles f = {.dir = g_dir_make_tmp("test_cost-XXXXXX", NULL)};
    f.run = g_build_filename(f.dir, "run.json", NULL);
    f.prof = g_build_filename(f.dir, "prof.json", NULL);
    f.args = g_strdup_printf("calibrate %s --out %s", f.run, f.prof);
    return f;
}

/* Writes `root` (taken) as the run and calibrates it, which must succeed. */
static TuRun cal_files_run(const CalFiles *f, json_t *root)
{
    GError *error = NULL;
    g_assert_true(zp_json_write(root, f->run, &error));
    g_assert_no_error(error);
    json_decref(root);
    TuRun r = tu_zplan(f->args);
    g_test_message("%s%s", r.out, r.err);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    return r;
}

static void cal_files_free(CalFiles *f)
{
    g_unlink(f->run);
    g_unlink(f->prof);
    g_rmdir(f->dir);
    g_free(f->args), g_free(f->run), g_free(f->prof), g_free(f->dir);
}

/* A sample's attention rate at log2 heads z: linear in z, so that the table's interpolation
 * between the levels 3 and 5 is exact at z = 4. */
static double attn_rate(int pass, double z)
{
    return (pass + 1) * 1e9 * (1 + z / 4);
}

static double attn_time(int pass, int batch, int heads, int seq, int hd, double fixed_scale)
{
    const double sample = 4.0 * (1 + pass) * seq * seq * hd * heads;
    return fixed_scale * (pass + 1) * 3e-6 + batch * sample / attn_rate(pass, log2(heads));
}

/* Eager attention timed at 8 and 32 heads, the 8-head points also at batch 4, and the
 * model-shaped kernels of a device run at 16 heads: calibrate finds each pass's fixed time
 * (3 and 6 us, not the 1 us launch) from the batch pairs, a grid per heads level, and prices
 * the 16-head kernels exactly between the levels; a kernel 1.5 times slower is a warning. The
 * run's launch_stream_s is the table's. */
static void test_calibrated_attention(void)
{
    CalFiles f = cal_files();
    for (int slow = 0; slow < 2; slow++) {
        json_t *root = synthetic_run(1), *attn = json_array(), *kernels = json_array();
        for (int pass = 0; pass < 2; pass++)
            for (int heads = 8; heads <= 32; heads *= 4)
                for (int seq = 32; seq <= 64; seq *= 2)
                    for (int hd = 16; hd <= 32; hd *= 2)
                        for (int batch = 1; batch <= (heads == 8 ? 4 : 1); batch *= 4)
                            json_array_append_new(
                                attn, json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f}", "pass",
                                                pass ? "backward" : "forward", "batch", batch,
                                                "heads", heads, "seq_len", seq, "head_dim", hd,
                                                "flops", 4.0 * (1 + pass) * batch * seq * seq *
                                                             hd * heads,
                                                "time_s",
                                                attn_time(pass, batch, heads, seq, hd, 1)));
        for (int pass = 0; pass < 2; pass++)
            json_array_append_new(
                kernels, json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f}", "kernel",
                                   pass ? "attention_bwd" : "attention_fwd", "batch", 2,
                                   "seq_len", 64, "heads", 16, "head_dim", 32, "flops",
                                   4.0 * (1 + pass) * 2 * 64 * 64 * 32 * 16, "time_s",
                                   (slow && pass ? 1.5 : 1) *
                                       attn_time(pass, 2, 16, 64, 32, 1)));
        json_object_set_new(root, "attention_grid", attn);
        json_object_set_new(root, "kernels", kernels);
        json_object_set_new(root, "launch_stream_s", json_real(0.4e-6));
        TuRun r = cal_files_run(&f, root);
        const char *warning = "op table misses the model-shaped attention kernels";
        if (slow) {
            g_assert_nonnull(strstr(r.err, warning));
            tu_free(&r);
            break;
        }
        g_assert_null(strstr(r.err, warning));
        tu_free(&r);
        ZpHw hw;
        load_hw(f.prof, &hw);
        const ZpOpTable *t = &hw.op_costs;
        g_assert_cmpfloat(t->launch_stream_s, ==, 0.4e-6);
        g_assert_cmpint(t->attn_levels, ==, 2);
        g_assert_cmpfloat(t->attn_log2_heads[0], ==, 3);
        g_assert_cmpfloat(t->attn_log2_heads[1], ==, 5);
        for (int pass = 0; pass < 2; pass++) {
            g_assert_true(close_to(t->attn_fixed_s[pass], (pass + 1) * 3e-6));
            for (int l = 0; l < 2; l++)
                g_assert_true(close_to(zp_grid_at(&t->eager_attention[l][pass], 6, 5),
                                       attn_rate(pass, 3 + 2 * l)));
            const double flops = 4.0 * (1 + pass) * 2 * 64 * 64 * 32 * 16;
            g_assert_true(close_to(zp_optable_attention_s(t, pass, flops, 6, 5, 4),
                                   attn_time(pass, 2, 16, 64, 32, 1)));
        }
    }
    cal_files_free(&f);
}

/* A device run's model-shaped kernels: its row kernels at a model's widths are their classes'
 * samples, not the sweep's narrow rows (a layer norm here 2 times and the loss 3 times faster
 * than the sweep: the table takes their rates), and its model-shaped GEMMs are kept at their
 * exact shapes, the LM head's apart from a block linear's of the same dimensions, for zp_cost
 * to take before the GEMM surface. A host run (no "kernels") keeps its sweep. */
static void test_calibrated_model_shaped(void)
{
    CalFiles f = cal_files();
    json_t *root = synthetic_run(1);
    const double launch = 1e-6, norm_rate = 2 * 1e9, loss_rate = 3 * 10e9;
    json_t *kernels = json_array(), *memory = json_object_get(root, "memory");
    for (int i = 1; i <= 3; i++) {
        const double elems = 1e6 * i;
        json_array_append_new(memory, json_pack("{s:s, s:f, s:f, s:f}", "kernel", "layernorm",
                                                "elems", elems, "bytes", 4 * elems, "time_s",
                                                launch + 8 * elems / norm_rate));
        json_array_append_new(kernels, json_pack("{s:s, s:f, s:f, s:f}", "kernel",
                                                 "softmax_xent", "elems", elems, "bytes",
                                                 20 * elems, "time_s",
                                                 launch + 20 * elems / loss_rate));
    }
    json_object_set_new(root, "kernels", kernels);
    json_t *gemm = json_object_get(root, "gemm");
    json_array_append_new(gemm, json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:f}", "shape",
                                          "lm_head", "form", "forward", "m", 64, "n", 257,
                                          "k", 32, "flops", 2.0 * 64 * 257 * 32, "time_s",
                                          7e-5));
    json_array_append_new(gemm, json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:f}", "shape", "fc1",
                                          "form", "weight_grad", "m", 32, "n", 128, "k", 64,
                                          "flops", 2.0 * 32 * 128 * 64, "time_s", 3e-5));
    TuRun r = cal_files_run(&f, root);
    tu_free(&r);
    ZpHw hw;
    load_hw(f.prof, &hw);
    const ZpOpTable *t = &hw.op_costs;
    g_assert_true(close_to(t->ew_bytes_per_s[ZP_EW_NORM_FWD], norm_rate));
    g_assert_true(close_to(t->ew_bytes_per_s[ZP_EW_LOSS], loss_rate));
    g_assert_true(close_to(t->ew_bytes_per_s[ZP_EW_ADD], 5e9)); /* the sweep's */
    g_assert_cmpint(t->n_gemm_shapes, ==, 2);
    const ZpGemmShape *head = zp_optable_gemm_shape(t, ZP_GEMM_FORWARD, TRUE, 64, 257, 32);
    g_assert_nonnull(head);
    g_assert_cmpfloat(head->time_s, ==, 7e-5);
    g_assert_null(zp_optable_gemm_shape(t, ZP_GEMM_FORWARD, FALSE, 64, 257, 32));
    g_assert_nonnull(zp_optable_gemm_shape(t, ZP_GEMM_WEIGHT_GRAD, FALSE, 32, 128, 64));
    /* Without "kernels" (a host run) the layer norm rows are the roofline's alone. */
    root = synthetic_run(1);
    json_t *mem = json_object_get(root, "memory");
    json_array_append_new(mem, json_pack("{s:s, s:f, s:f, s:f}", "kernel", "layernorm", "elems",
                                         1e6, "bytes", 4e6, "time_s", launch + 8e6 / norm_rate));
    json_object_set_new(root, "kernels", json_array());
    r = cal_files_run(&f, root);
    tu_free(&r);
    load_hw(f.prof, &hw);
    g_assert_true(close_to(hw.op_costs.ew_bytes_per_s[ZP_EW_NORM_FWD], 1e9));
    cal_files_free(&f);
}

/* The LM head's GEMM surfaces: a run that times the head's variants (aligned and with an odd
 * vocabulary) gives the table both, and a head's GEMM is priced on its own variant's, a block
 * linear's on the block surface; a run without them leaves the head on the block surface. */
static void test_calibrated_head_gemms(void)
{
    CalFiles f = cal_files();
    const double launch = 1e-6;
    json_t *root = synthetic_run(1), *grid = json_object_get(root, "gemm_grid");
    static const char *const variants[] = {"head", "head_odd"};
    for (int v = 0; v < 2; v++)
        for (int form = 0; form < ZP_GEMM_N; form++)
            for (int x = 12; x <= 18; x += 3)
                for (int y = 0; y <= 2; y += 2) {
                    const double flops = pow(2, x + 1);
                    json_array_append_new(
                        grid, json_pack("{s:s, s:s, s:i, s:i, s:f, s:f}", "form",
                                        zp_gemm_form_name(form), "variant", variants[v],
                                        "log2_mnk", x, "log2_aspect", y, "flops", flops,
                                        "time_s",
                                        launch + flops / (grid_rate(form, x, y) / (2 + v))));
                }
    TuRun r = cal_files_run(&f, root);
    tu_free(&r);
    ZpHw hw;
    load_hw(f.prof, &hw);
    const ZpOpTable *t = &hw.op_costs;
    g_assert_true(t->has_gemm_head);
    for (int form = 0; form < ZP_GEMM_N; form++) {
        /* 2^5 x 2^5 x 2^5: a grid point (15, 0) */
        g_assert_true(close_to(zp_optable_gemm_rate(t, form, FALSE, 32, 32, 32),
                               grid_rate(form, 15, 0)));
        g_assert_true(close_to(zp_optable_gemm_rate(t, form, TRUE, 32, 32, 32),
                               grid_rate(form, 15, 0) / 2));
        g_assert_true(close_to(zp_grid_at(&t->gemm_head[1][form], 15, 0),
                               grid_rate(form, 15, 0) / 3));
    }
    g_assert_cmpint(zp_gemm_variant(TRUE, 32, 50257, 32), ==, ZP_GEMM_HEAD_ODD);
    g_assert_cmpint(zp_gemm_variant(TRUE, 32, 32000, 32), ==, ZP_GEMM_HEAD);
    g_assert_cmpint(zp_gemm_variant(FALSE, 32, 50257, 32), ==, ZP_GEMM_BLOCK);
    root = synthetic_run(1);
    r = cal_files_run(&f, root);
    tu_free(&r);
    load_hw(f.prof, &hw);
    g_assert_false(hw.op_costs.has_gemm_head);
    g_assert_true(close_to(zp_optable_gemm_rate(&hw.op_costs, 0, TRUE, 32, 32, 32),
                           grid_rate(0, 15, 0)));
    cal_files_free(&f);
}

/* Whole-op times: every run's, whatever its rank count, kept per op, shape and ranks (the
 * fastest run's of the same: 1 of 1, 3 and 11 s, where the median would be 3), and what
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
    g_assert_cmpfloat(zp_optable_op(&hw.op_costs, "head", shape, 2)->time_s, ==, 1.0);
    g_assert_cmpfloat(zp_optable_op(&hw.op_costs, "head", shape, 1)->time_s, ==, 5.0);
    g_assert_null(zp_optable_op(&hw.op_costs, "block_fwd", shape, 2));
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL));
    g_assert_cmpfloat(zp_cost_op_s(&c, ZP_COMP_HEAD, -1, 0, 0, 0, 0), ==, 1.0);
    /* The optimizer's time at its elements, kept per ranks like the others. */
    g_assert_true(c.whole[ZP_COMP_OPTIMIZER]);
    const double step_bytes = zp_plan_step_bytes(zp_plan_state_bytes(p.precision, p.optimizer));
    g_assert_true(close_to(zp_cost_op_s(&c, ZP_COMP_OPTIMIZER, -1, 0, 0, 0, step_bytes * elems),
                           0.01));
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

/* Two microbenchmark runs of one machine, the first under another process's load: its head op
 * 2.5 times, one GEMM grid point 3 times, its largest residual add 1.5 times, its launch 5
 * times, a GEMM, an Adam step and an NVMe write of the roofline's fits twice the second's.
 * Load only adds time, so the profile takes the second run's every figure (a median of two,
 * their mean, gave the head 1.75 s; the fits went through both runs' samples), whichever run
 * comes first. */
static void test_calibrated_fastest_run(void)
{
    GError *error = NULL;
    ZpModel m;
    ZpPlan p;
    load_model("tiny", &m);
    zp_plan_defaults(&p, 0, 2, 1);
    char shape[ZP_OPTABLE_SHAPE_LEN];
    zp_cost_op_shape(&m, &p, ZP_COMP_HEAD, shape);
    char *dir = g_dir_make_tmp("test_cost-XXXXXX", NULL);
    char *path[2] = {g_build_filename(dir, "a.json", NULL), g_build_filename(dir, "b.json", NULL)};
    char *prof = g_build_filename(dir, "prof.json", NULL);
    for (int order = 0; order < 2; order++) {
        for (int i = 0; i < 2; i++) {
            const gboolean slow = i == order;
            json_t *root = synthetic_run(slow ? 1.5 : 1);
            json_object_set_new(root, "op_sequence",
                                json_pack("[{s:s, s:s, s:i, s:f}]", "op", "head", "shape", shape,
                                          "calls", 3, "time_s", slow ? 2.5 : 1.0));
            json_t *nvme = json_pack("{s:s, s:b, s:i, s:[], s:[]}", "path", "/tmp", "direct", 1,
                                     "ranks", 1, "write", "read");
            for (int k = 1; k <= 3; k++) {
                json_array_append_new(json_object_get(nvme, "write"),
                                      json_pack("{s:f, s:f}", "bytes", 1e6 * k, "time_s", 1e-3 * k));
                json_array_append_new(json_object_get(nvme, "read"),
                                      json_pack("{s:f, s:f}", "bytes", 1e6 * k, "time_s", 1e-3 * k));
            }
            json_object_set_new(root, "nvme", nvme);
            if (slow) {
                json_t *point = json_array_get(json_object_get(root, "gemm_grid"), 0);
                json_object_set_new(point, "time_s",
                                    json_real(3 * json_number_value(json_object_get(point, "time_s"))));
                json_object_set_new(root, "launch_s", json_real(5e-6));
                json_t *rows[] = {json_array_get(json_object_get(root, "gemm"), 2),
                                  json_array_get(json_object_get(root, "memory"), 0),
                                  json_array_get(json_object_get(nvme, "write"), 1)};
                for (size_t k = 0; k < G_N_ELEMENTS(rows); k++)
                    json_object_set_new(rows[k], "time_s",
                                        json_real(2 * json_number_value(json_object_get(rows[k], "time_s"))));
            }
            g_assert_true(zp_json_write(root, path[i], &error));
            json_decref(root);
        }
        char *args = g_strdup_printf("calibrate %s %s --out %s", path[0], path[1], prof);
        TuRun r = tu_zplan(args);
        g_test_message("%s: %s%s", args, r.out, r.err);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        g_assert_null(strstr(r.err, "op table misses"));
        tu_free(&r);
        g_free(args);
        ZpHw hw;
        load_hw(prof, &hw);
        const ZpOpTable *t = &hw.op_costs;
        g_assert_cmpfloat(t->launch_s, ==, 1e-6);
        g_assert_cmpfloat(zp_optable_op(t, "head", shape, 2)->time_s, ==, 1.0);
        for (int form = 0; form < ZP_GEMM_N; form++) {
            const ZpGrid *g = &t->gemm[form];
            for (int x = 0; x < g->nx; x++)
                for (int y = 0; y < g->ny; y++)
                    g_assert_true(close_to(zp_grid_at(g, g->x[x], g->y[y]),
                                           grid_rate(form, g->x[x], g->y[y])));
        }
        for (int c = 0; c < ZP_EW_N; c++)
            g_assert_true(close_to(t->ew_bytes_per_s[c], (c + 1) * 1e9));
        json_t *root = zp_json_load_object(prof, &error);
        g_assert_no_error(error);
        g_assert_true(close_to(json_number_value(json_object_get(root, "peak_fp32_flops")), 1e10));
        g_assert_true(close_to(json_number_value(json_object_get(root, "hbm_bytes_per_s")), 2e9));
        g_assert_true(close_to(json_number_value(json_object_get(root, "nvme_bytes_per_s")), 1e9));
        json_decref(root);
    }
    for (int i = 0; i < 2; i++) {
        g_unlink(path[i]);
        g_free(path[i]);
    }
    g_unlink(prof);
    g_rmdir(dir);
    g_free(prof), g_free(dir);
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

/* Two microbenchmark runs of tiny's all-gathers on 2 ranks under load (load average 15):
 * the first timed 256 B at 7.5 ms, the second at 26 us, each size otherwise 6 us to 29 ms
 * alike. The table from both holds every size at or below the faster run's timing, so the 7.5
 * ms spell neither lifts 256 B nor, as a mean-pooled fit did (every size to 512 KB at 0.58
 * ms: tiny's seven gathers 4.5 ms against 0.14 ms measured, issue 43), its neighbours. */
static void test_collective_table_noise(void)
{
    const double bytes[] = {256, 2048, 12288, 32768, 99968, 212480, 524288, 4194304, 8388608,
                            33554432};
    const double slow[] = {7.46e-3, 6.42e-6, 2.74e-5, 1.22e-5, 2.69e-5, 6.28e-5, 1.30e-4,
                           7.21e-4, 3.43e-3, 2.88e-2};
    const double fast[] = {2.62e-5, 6.39e-6, 3.16e-5, 1.51e-5, 3.22e-5, 7.78e-5, 1.97e-4,
                           1.03e-3, 7.00e-3, 1.99e-2};
    enum { SIZES = G_N_ELEMENTS(bytes) };
    int kind[2 * SIZES], ranks[2 * SIZES];
    double b[2 * SIZES], s[2 * SIZES];
    for (int i = 0; i < SIZES; i++) {
        kind[i] = kind[SIZES + i] = ZP_COLL_ALLGATHER;
        ranks[i] = ranks[SIZES + i] = 2;
        b[i] = b[SIZES + i] = bytes[i];
        s[i] = slow[i], s[SIZES + i] = fast[i];
    }
    ZpCollTable t;
    GError *error = NULL;
    g_assert_true(zp_colltab_build(kind, ranks, b, s, 2 * SIZES, ZP_COLLTAB_LEAST, &t, &error));
    const ZpCollRow *ag = zp_colltab_find(&t, ZP_COLL_ALLGATHER, 2);
    g_assert_nonnull(ag);
    g_assert_cmpint(ag->n, ==, SIZES);
    double seven_small_s = 0;
    for (int i = 0; i < SIZES; i++) {
        g_assert_cmpfloat(ag->time_s[i], <=, MIN(slow[i], fast[i]));
        if (i > 0)
            g_assert_cmpfloat(ag->time_s[i], >=, ag->time_s[i - 1]);
        if (bytes[i] <= 524288)
            seven_small_s += ag->time_s[i];
    }
    g_assert_cmpfloat(ag->time_s[0], ==, 6.39e-6); /* 2 KB's, the larger size's bound */
    g_assert_cmpfloat(seven_small_s, <, 0.3e-3);
}

/* The collective table: built from timings (each a run's median), each size's least, its lower
 * envelope;
 * read off exactly at a measured size, monotone between two, a latency floor below the
 * smallest and the largest's bus bandwidth above; written and read back as it was; and a
 * malformed row refused naming its key. */
static void test_collective_table(void)
{
    /* All-reduce on 2 ranks: 1 KB in three runs (the least 9 us), 1 MB (1 ms), 4 MB twice (the
     * faster of 3 and 5 ms), and 2 MB at 5 ms, slower than 4 MB: it takes 4 MB's 3 ms (a mean
     * pooled fit gave both 4.5). One all-gather on 4 ranks, and a 1-rank timing that has no row. */
    const int kind[] = {0, 0, 0, 0, 0, 0, 0, 0, 2, 0};
    const int ranks[] = {2, 2, 2, 2, 2, 2, 2, 2, 4, 1};
    const double bytes[] = {1e3, 1e3, 1e3, 1e6, 4e6, 4e6, 2e6, 1e6, 8e6, 1e3};
    const double time_s[] = {12e-6, 9e-6, 10e-6, 1e-3, 3e-3, 5e-3, 5e-3, 1e-3, 2e-3, 1.0};
    ZpCollTable t;
    GError *error = NULL;
    g_assert_true(zp_colltab_build(kind, ranks, bytes, time_s, G_N_ELEMENTS(kind),
                                   ZP_COLLTAB_LEAST, &t, &error));
    g_assert_cmpint(t.n_rows, ==, 2);
    const ZpCollRow *ar = zp_colltab_find(&t, ZP_COLL_ALLREDUCE, 2);
    g_assert_nonnull(ar);
    g_assert_null(zp_colltab_find(&t, ZP_COLL_ALLREDUCE, 4));
    g_assert_null(zp_colltab_find(&t, ZP_COLL_ALLREDUCE, 1));
    g_assert_nonnull(zp_colltab_find(&t, ZP_COLL_ALLGATHER, 4));
    g_assert_cmpint(ar->n, ==, 4);
    const double want_bytes[] = {1e3, 1e6, 2e6, 4e6}, want_s[] = {9e-6, 1e-3, 3e-3, 3e-3};
    for (int i = 0; i < 4; i++) {
        g_assert_cmpfloat(ar->bytes[i], ==, want_bytes[i]);
        g_assert_cmpfloat(fabs(ar->time_s[i] / want_s[i] - 1), <, 1e-12);
        g_assert_cmpfloat(zp_colltab_time_s(ar, ar->bytes[i]), ==, ar->time_s[i]);
    }
    /* Between two sizes: log-log, so 31.6 KB (half-way in log) is the geometric mean. */
    g_assert_cmpfloat(fabs(zp_colltab_time_s(ar, sqrt(1e3 * 1e6)) / sqrt(9e-6 * 1e-3) - 1), <,
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
    g_assert_cmpfloat(zp_colltab_time_s(ar, 10), ==, 9e-6);
    g_assert_cmpfloat(fabs(zp_colltab_time_s(ar, 8e6) / 6e-3 - 1), <, 1e-12);
    /* One instance each (a profiler trace's kernels): the median of each size, 4 MB's 4 ms,
     * and 2 MB's 5 ms under it. */
    ZpCollTable med;
    g_assert_true(zp_colltab_build(kind, ranks, bytes, time_s, G_N_ELEMENTS(kind),
                                   ZP_COLLTAB_MEDIAN, &med, &error));
    const ZpCollRow *mr = zp_colltab_find(&med, ZP_COLL_ALLREDUCE, 2);
    const double want_median_s[] = {10e-6, 1e-3, 4e-3, 4e-3};
    for (int i = 0; i < 4; i++)
        g_assert_cmpfloat(fabs(mr->time_s[i] / want_median_s[i] - 1), <, 1e-12);

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
    g_assert_false(zp_colltab_build(k, r, b, s, G_N_ELEMENTS(k), ZP_COLLTAB_LEAST, &t, &error));
    g_assert_nonnull(strstr(error->message, "reduce_scatter on 2 ranks was timed at more than"));
    g_clear_error(&error);
}

/* zp_cost_init_whole_ops, the screen's, times every whole op (module -1) as zp_cost_init does,
 * bit for bit, on the op table, the kernel inventory (dense and with experts, whose blocks
 * take their own kernels) and the roofline, with and without a memo of the inventory's op
 * times; it writes no explanation. */
static void assert_whole_ops_pass(const ZpHw *hw, const ZpModel *m, const ZpPlan *p,
                                  ZpCostMemo *memo)
{
    ZpCost full, whole;
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(m, p, ops);
    g_assert_true(zp_cost_init(&full, hw, m, p, NULL));
    g_assert_true(zp_cost_init_whole_ops(&whole, hw, m, p, ops, memo, NULL));
    g_assert_cmpint(full.table, ==, whole.table);
    g_assert_cmpint(full.inventory, ==, whole.inventory);
    g_assert_cmpint(full.n_blocks, ==, whole.n_blocks);
    g_assert_cmpstr(whole.why, ==, "");
    g_assert_cmpuint(strlen(full.why), >, 0);
    for (int k = 0; k < ZP_COMP_N; k++) {
        const ZpComputeOps *o = &ops[k];
        const double a = zp_cost_op_s(&full, (ZpComputeKind)k, -1, o->flops, o->gemm_flops,
                                      o->attn_flops, o->mem_bytes);
        const double b = zp_cost_op_s(&whole, (ZpComputeKind)k, -1, o->flops, o->gemm_flops,
                                      o->attn_flops, o->mem_bytes);
        g_assert_cmpmem(&a, sizeof a, &b, sizeof b);
        g_assert_cmpmem(full.class_s[k], sizeof full.class_s[k], whole.class_s[k],
                        sizeof whole.class_s[k]);
    }
    for (int n = 0; n < 3; n++)
        g_assert_cmpfloat(zp_cost_contention(&full, n), ==, zp_cost_contention(&whole, n));
}

/* Without a memo, then with one twice (a miss, then a hit); memo lives with one hw. */
static void assert_whole_ops_same(const ZpHw *hw, const ZpModel *m, const ZpPlan *p,
                                  ZpCostMemo *memo)
{
    assert_whole_ops_pass(hw, m, p, NULL);
    assert_whole_ops_pass(hw, m, p, memo);
    assert_whole_ops_pass(hw, m, p, memo);
}

static void test_whole_ops_init(void)
{
    ZpHw hw;
    ZpModel m;
    ZpPlan p;
    ZpCostMemo *memo = zp_cost_memo_new();
    tiny_setup(&hw, &m, &p, 0, 1, 0, TRUE); /* the op table */
    g_assert_true(hw.op_costs.present);
    assert_whole_ops_same(&hw, &m, &p, memo);
    zp_cost_memo_free(memo);
    memo = zp_cost_memo_new();
    tiny_setup(&hw, &m, &p, 3, 4, 2, FALSE);
    p.checkpoint = TRUE;
    assert_whole_ops_same(&hw, &m, &p, memo);
    zp_cost_memo_free(memo);
    memo = zp_cost_memo_new();
    hw.kernel_rates.present = FALSE; /* the roofline */
    hw.op_costs.present = FALSE;
    assert_whole_ops_same(&hw, &m, &p, memo);
    zp_cost_memo_free(memo);
    memo = zp_cost_memo_new(); /* one memo over the profile's plans, as a search's */
    load_hw("dgx-a100-80g", &hw);
    load_model("moe-tiny", &m);
    zp_plan_defaults(&p, 2, 8, 1);
    ZpCost c;
    g_assert_true(zp_cost_init(&c, &hw, &m, &p, NULL) && c.inventory && c.n_blocks > 0);
    assert_whole_ops_same(&hw, &m, &p, memo);
    load_model("gpt-13b", &m);
    /* stages 1 to 3 share every op's dimensions but the optimizer's elements */
    for (int stage = 1; stage <= 3; stage++) {
        zp_plan_defaults(&p, stage, 8, 8);
        p.checkpoint = TRUE;
        assert_whole_ops_same(&hw, &m, &p, memo);
        p.checkpoint = FALSE;
        p.selective_recompute = TRUE;
        assert_whole_ops_same(&hw, &m, &p, memo);
    }
    zp_cost_memo_free(memo);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/cost/collective-copies", test_collective_copies);
    g_test_add_func("/cost/whole-ops-init", test_whole_ops_init);
    g_test_add_func("/cost/copy-curve", test_copy_curve);
    g_test_add_func("/cost/calibrated-round-trip", test_calibrated_round_trip);
    g_test_add_func("/cost/calibrated-attention", test_calibrated_attention);
    g_test_add_func("/cost/calibrated-model-shaped", test_calibrated_model_shaped);
    g_test_add_func("/cost/calibrated-head-gemms", test_calibrated_head_gemms);
    g_test_add_func("/cost/calibrated-whole-ops", test_calibrated_whole_ops);
    g_test_add_func("/cost/calibrated-fastest-run", test_calibrated_fastest_run);
    g_test_add_func("/cost/calibrated-collectives", test_calibrated_collectives);
    g_test_add_func("/cost/collective-table", test_collective_table);
    g_test_add_func("/cost/collective-table-noise", test_collective_table_noise);
    return g_test_run();
}
