/* test_sched: the schedule against the memory and communication models it must agree
 * with, its memory bookkeeping, and its JSON round trip. */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_alloc_replay.h"
#include "zp_comm.h"
#include "zp_mem.h"
#include "zp_sched.h"
#include "zp_schedcheck.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* A CI-sized GPT whose units (6144, 49984 and 128 elements) divide by 1, 2 and 4 ranks, so
 * no padding hides a difference from the closed forms. */
static ZpModel small_model(void)
{
    ZpModel m = {.name = "small", .layers = 2, .hidden = 64, .heads = 4, .seq_len = 32,
                 .vocab = 64, .ffn_hidden = 256, .tied_embeddings = TRUE,
                 .learned_positions = TRUE, .dropout = FALSE};
    return m;
}

static ZpSchedule *build(const ZpModel *m, int stage, int dp, int accum, gboolean ckpt)
{
    ZpPlan p;
    zp_plan_defaults(&p, stage, dp, 1);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.grad_accum = accum;
    p.checkpoint = ckpt;
    p.zero.stage3_param_persistence_threshold = 0; /* gather every unit */
    p.zero.reduce_bucket_size = 20000;              /* several buckets */
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, &p, &error);
    g_assert_no_error(error);
    return s;
}

static void test_states_and_comm_match_models(void)
{
    ZpModel m = small_model();
    const double psi = (double)zp_model_param_count(&m);
    const ZpStateBytes sb = zp_plan_state_bytes(ZP_PREC_FP16, ZP_OPT_ADAM);
    for (int stage = 0; stage <= 3; stage++)
        for (int dp = 1; dp <= 4; dp *= 2) {
            ZpSchedule *s = build(&m, stage, dp, 1, FALSE);
            g_assert_cmpfloat(zp_sched_model_state_bytes(s), ==,
                              zp_mem_model_states(psi, stage, dp, 1, sb).total_bytes);
            /* Stage 3 gathers each unit twice, except the final norm: the head op runs its
             * forward and backward together on one gather (2h elements, here 128). */
            const double final_norm = stage == 3 ? 128.0 * (dp - 1) / dp * 2 : 0;
            g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_DP), ==,
                              zp_comm_dp_bytes_per_rank(psi, stage, dp, 1, 2, 2) - final_norm);
            g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_TP), ==, 0);
            zp_sched_free(s);
        }
}

/* Walks the ops in list order: every buffer is freed once with the bytes it was allocated
 * with, dependencies point backwards, and nothing is left at the end of the step. */
static void check_bookkeeping(const ZpSchedule *s)
{
    GHashTable *live = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    double bytes = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        const uint32_t *d = zp_sched_deps(s, op);
        for (uint32_t j = 0; j < op->n_deps; j++)
            g_assert_cmpuint(d[j], <, i);
        if (op->kind == ZP_OP_ALLOC) {
            g_assert_false(g_hash_table_contains(live, GINT_TO_POINTER(op->buffer + 1)));
            g_hash_table_insert(live, GINT_TO_POINTER(op->buffer + 1), g_memdup2(op, sizeof *op));
            bytes += op->bytes;
        } else if (op->kind == ZP_OP_FREE) {
            ZpOp *a = g_hash_table_lookup(live, GINT_TO_POINTER(op->buffer + 1));
            g_assert_nonnull(a);
            g_assert_cmpfloat(a->bytes, ==, op->bytes);
            g_assert_cmpint(a->sub, ==, op->sub);
            g_hash_table_remove(live, GINT_TO_POINTER(op->buffer + 1));
            bytes -= op->bytes;
        }
        g_assert_cmpfloat(bytes, >=, -1e-6);
    }
    g_assert_cmpuint(g_hash_table_size(live), ==, 0);
    g_hash_table_unref(live);
}

static void test_bookkeeping(void)
{
    ZpModel m = small_model();
    for (int stage = 0; stage <= 3; stage++)
        for (int accum = 1; accum <= 2; accum++)
            for (int ckpt = 0; ckpt <= 1; ckpt++) {
                ZpSchedule *s = build(&m, stage, 4, accum, ckpt);
                check_bookkeeping(s);
                zp_sched_free(s);
            }
}

/* Op counts that follow from the plan: L forward blocks per micro-step, L backward blocks,
 * L recomputes with checkpointing, one optimizer; stage 3 gathers every block twice per
 * micro-step and the embedding twice (the head keeps it for the embedding backward). */
static void test_structure(void)
{
    ZpModel m = small_model();
    for (int stage = 0; stage <= 3; stage++) {
        ZpSchedule *s = build(&m, stage, 4, 2, TRUE);
        int count[ZP_COMP_N] = {0}, gathers = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind == ZP_OP_COMPUTE)
                count[op->sub]++;
            if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLGATHER && op->unit >= 0)
                gathers++;
        }
        g_assert_cmpint(count[ZP_COMP_BLOCK_FWD], ==, 2 * 2);
        g_assert_cmpint(count[ZP_COMP_BLOCK_BWD], ==, 2 * 2);
        g_assert_cmpint(count[ZP_COMP_RECOMPUTE], ==, 2 * 2);
        g_assert_cmpint(count[ZP_COMP_OPTIMIZER], ==, 1);
        g_assert_cmpint(gathers, ==, stage == 3 ? 2 * (2 * 2 + 2 + 1) : 0);
        zp_sched_free(s);
    }
    /* Tensor parallelism: two all-reduces per block forward and backward, two per recompute;
     * the vocab-parallel embedding's and head's. */
    ZpPlan p;
    zp_plan_defaults(&p, 0, 2, 2);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.checkpoint = TRUE;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_TP), ==,
                      2 * zp_comm_tp_bytes_per_block(&m, 1, 2, TRUE, 2) +
                          zp_comm_tp_bytes_vocab(&m, 1, 2, 2));
    zp_sched_free(s);
}

/* The file at path is jansson's own dump of what it holds, byte for byte: the writer streams
 * it op by op (zp_out_stream_json), and an op indented at the wrong depth, a space or a
 * comma out of place, or a missing newline at the end would show here. */
static void assert_jansson_text(const char *path)
{
    char *text = NULL;
    gsize length = 0;
    g_assert_true(g_file_get_contents(path, &text, &length, NULL));
    json_error_t json_error;
    json_t *root = json_loadb(text, length, 0, &json_error);
    g_assert_nonnull(root);
    char *dump = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    char *expected = g_strconcat(dump, "\n", NULL);
    g_assert_cmpuint(length, ==, strlen(expected));
    g_assert_cmpint(memcmp(text, expected, length), ==, 0);
    g_free(expected);
    free(dump);
    json_decref(root);
    g_free(text);
}

/* Writes s to path and reads it back: the same ops, dependencies and model states, in the
 * text jansson writes. */
static void assert_round_trip(const ZpSchedule *s, const char *path)
{
    GError *error = NULL;
    g_assert_true(zp_sched_write_json(s, path, &error));
    assert_jansson_text(path);
    ZpSchedule *r = zp_sched_read_json(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(r->ops->len, ==, s->ops->len);
    g_assert_cmpuint(r->deps->len, ==, s->deps->len);
    g_assert_cmpint(memcmp(r->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    g_assert_cmpint(memcmp(r->deps->data, s->deps->data, s->deps->len * sizeof(uint32_t)), ==, 0);
    g_assert_cmpfloat(zp_sched_model_state_bytes(r), ==, zp_sched_model_state_bytes(s));
    zp_sched_free(r);
}

/* Sets ops[index]'s key to a string in the schedule file at path. */
static void set_op_key(const char *path, guint index, const char *key, const char *value)
{
    json_t *root = json_load_file(path, 0, NULL);
    g_assert_nonnull(root);
    json_object_set_new(json_array_get(json_object_get(root, "ops"), index), key,
                        json_string(value));
    g_assert_cmpint(json_dump_file(root, path, 0), ==, 0);
    json_decref(root);
}

/* DeepSpeed's stage-3 schedule computes blocks module by module: each module op's "module"
 * reads back as written, and a file whose module differs from the builder's, names an
 * unknown module or puts one on an op other than a block's is refused naming the op. */
static void check_module_round_trip(const char *path)
{
    ZpModel m = small_model();
    ZpPlan p;
    zp_plan_defaults(&p, 3, 2, 1);
    p.checkpoint = TRUE;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    g_assert_nonnull(s);
    guint first = 0, modules = 0, embed = 0;
    for (guint i = s->ops->len; i-- > 0;) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE && zp_op_module(op) >= 0)
            first = i, modules++;
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_EMBED_FWD)
            embed = i;
    }
    g_assert_cmpuint(modules, ==, 2 * 3 * ZP_MOD_N);
    g_assert_cmpint(zp_op_module(zp_sched_op(s, first)), ==, ZP_MOD_LN1);
    GError *error = NULL;
    assert_round_trip(s, path);
    const struct {
        guint op;
        const char *module, *message;
    } cases[] = {
        {first, "fc2", "differs from the deepspeed schedule"},
        {first, "attn", "key \"module\" must be one of"},
        {embed, "ln1", "key \"module\" must be one of"},
    };
    for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
        g_assert_true(zp_sched_write_json(s, path, &error));
        set_op_key(path, cases[c].op, "module", cases[c].module);
        g_assert_null(zp_sched_read_json(path, &error));
        g_test_message("%s", error->message);
        g_assert_nonnull(strstr(error->message, cases[c].message));
        g_clear_error(&error);
    }
    zp_sched_free(s);
}

/* Pipelines (Megatron's 1F1B and interleaved: sends, each op's stage, "stages" after the
 * digest) read back to the same ops, in jansson's text. */
static void check_pipeline_round_trip(const char *path)
{
    ZpModel m = small_model();
    m.layers = 4; /* a block for each of 2 stages x 2 chunks */
    for (int virtual = 1; virtual <= 2; virtual++) {
        ZpPlan p;
        zp_plan_defaults(&p, 1, 2, 1);
        p.impl = ZP_IMPL_MEGATRON, p.pipe.stages = 2, p.grad_accum = 4;
        if (virtual > 1)
            p.pipe.schedule = ZP_PIPE_INTERLEAVED, p.pipe.virtual_stages = virtual;
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        g_assert_cmpint(s->stages, ==, 2);
        assert_round_trip(s, path);
        zp_sched_free(s);
    }
}

/* A graph read without its model (zp_sched_read_graph: no units) writes no "model", and its
 * file is still jansson's text and reads back to the same ops. */
static void check_graph_round_trip(const ZpSchedule *s, const char *path)
{
    GError *error = NULL;
    g_assert_true(zp_sched_write_json(s, path, &error));
    ZpSchedule *g = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpint(g->n_units, ==, 0);
    g_assert_true(zp_sched_write_json(g, path, &error));
    assert_jansson_text(path);
    json_t *root = json_load_file(path, 0, NULL);
    g_assert_null(json_object_get(root, "model"));
    json_decref(root);
    ZpSchedule *again = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(again->ops->len, ==, s->ops->len);
    g_assert_cmpint(memcmp(again->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    g_assert_cmpuint(again->deps->len, ==, s->deps->len);
    g_assert_cmpint(memcmp(again->deps->data, s->deps->data, s->deps->len * sizeof(uint32_t)),
                    ==, 0);
    zp_sched_free(again);
    zp_sched_free(g);
}

static void test_json_round_trip(void)
{
    ZpModel m = small_model();
    ZpSchedule *s = build(&m, 3, 4, 2, TRUE);
    char *dir = g_dir_make_tmp("zplan-sched-XXXXXX", NULL);
    char *path = g_build_filename(dir, "s.json", NULL);
    GError *error = NULL;
    assert_round_trip(s, path);
    check_module_round_trip(path);
    check_pipeline_round_trip(path);
    check_graph_round_trip(s, path);
    /* A dependency on a later op is refused, naming the op. */
    g_assert_true(g_file_set_contents(path, "{\"format\": \"zplan-schedule-1\"}", -1, NULL));
    g_assert_null(zp_sched_read_json(path, &error));
    g_assert_nonnull(strstr(error->message, "\"model\""));
    g_clear_error(&error);
    g_remove(path);
    g_rmdir(dir);
    g_free(path);
    g_free(dir);
    zp_sched_free(s);
}

static void test_bad_plans(void)
{
    ZpModel m = small_model();
    ZpPlan p;
    GError *error = NULL;
    zp_plan_defaults(&p, 4, 2, 1);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    g_assert_null(zp_sched_build(&m, &p, &error));
    g_assert_nonnull(strstr(error->message, "stage"));
    g_clear_error(&error);
    zp_plan_defaults(&p, 1, 2, 3);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    g_assert_null(zp_sched_build(&m, &p, &error));
    g_assert_nonnull(strstr(error->message, "mp"));
    g_clear_error(&error);
    ZpModel params_only;
    zp_model_from_params(1e9, &params_only);
    zp_plan_defaults(&p, 1, 2, 1);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    g_assert_null(zp_sched_build(&params_only, &p, &error));
    g_clear_error(&error);
}

/* Every schedule the builder makes passes the validator: stages, accumulation,
 * checkpointing, tensor parallelism, overlap, bucket sizes, persistence and padding, with a
 * tied LM head (which reads the embedding's weights) and an untied one (which does not). */
static void test_check_accepts_built(void)
{
    ZpModel m = small_model();
    for (int untied = 0; untied < 2; untied++)
    for (int stage = 0; stage <= 3; stage++)
        for (int variant = 0; variant < 16; variant++) {
            m.tied_embeddings = !untied;
            ZpPlan p;
            const int mp = variant & 1 ? 2 : 1, dp = variant & 8 ? 3 : 2;
            zp_plan_defaults(&p, stage, dp, mp);
            p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
            p.checkpoint = (variant & 2) != 0;
            p.grad_accum = variant & 4 ? 3 : 1;
            p.zero.overlap_comm = !p.zero.overlap_comm;
            p.zero.reduce_bucket_size = variant & 4 ? 20000 : 5e8;
            p.zero.allgather_bucket_size = variant & 8 ? 7000 : 5e8;
            p.zero.stage3_param_persistence_threshold = variant & 2 ? 0 : 1e5;
            GError *error = NULL;
            ZpSchedule *s = zp_sched_build(&m, &p, &error);
            g_assert_no_error(error);
            g_assert_true(zp_schedcheck_ops(s, "built", &error));
            g_assert_no_error(error);
            zp_sched_free(s);
        }
}

/* Hostile edits of a valid schedule: each names the op and the field. */
static ZpOp *nth_op(ZpSchedule *s, ZpOpKind kind, int sub, int nth)
{
    for (guint i = 0; i < s->ops->len; i++) {
        ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->kind == kind && (sub < 0 || op->sub == sub) && nth-- == 0)
            return op;
    }
    g_assert_not_reached();
}

static void edit_unit_beyond(ZpOp *op) { op->unit = 99; }
static void edit_block_zero(ZpOp *op) { op->unit = 0; }
static void edit_buffer_max(ZpOp *op) { op->buffer = G_MAXINT32; }
static void edit_bytes_zero(ZpOp *op) { op->bytes = 0; }
static void edit_bytes_double(ZpOp *op) { op->bytes *= 2; }
static void edit_elems_more(ZpOp *op) { op->elems += 1; }
static void edit_offset_far(ZpOp *op) { op->elem_offset = G_MAXUINT64 - 3; }
static void edit_module(ZpOp *op)
{
    op->module = ZP_MOD_QKV + 1;
}

static void edit_micro_late(ZpOp *op) { op->micro = 7; }
static void edit_tp(ZpOp *op) { op->group = ZP_GROUP_TP; }
static void edit_category(ZpOp *op) { op->sub = ZP_MEM_PARAMS; }
static void edit_allreduce(ZpOp *op) { op->sub = ZP_COLL_ALLREDUCE; }
static void edit_free_other(ZpOp *op) { op->buffer = 0; }

static void test_check_refuses_hostile(void)
{
    const struct {
        int stage;
        ZpOpKind kind;
        int sub, nth;
        void (*edit)(ZpOp *op);
        const char *message;
    } cases[] = {
        {3, ZP_OP_COMPUTE, ZP_COMP_BLOCK_FWD, 0, edit_unit_beyond, "key \"unit\" = 99 is outside"},
        {3, ZP_OP_COMPUTE, ZP_COMP_BLOCK_BWD, 0, edit_block_zero, "key \"unit\" = 0 is not a unit"},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_REDUCE_SCATTER, 0, edit_buffer_max, "key \"buffer\" = 2147483647"},
        {3, ZP_OP_ALLOC, ZP_MEM_GATHERED_PARAMS, 0, edit_bytes_zero, "key \"bytes\" = 0; the layout gives"},
        {3, ZP_OP_ALLOC, ZP_MEM_GATHERED_PARAMS, 1, edit_unit_beyond, "key \"unit\" = 99"},
        {3, ZP_OP_ALLOC, ZP_MEM_BUCKETS, 0, edit_bytes_double, "key \"bytes\""},
        {3, ZP_OP_ALLOC, ZP_MEM_BUCKETS, 0, edit_buffer_max, "key \"buffer\" = 2147483647"},
        {3, ZP_OP_ALLOC, ZP_MEM_CHECKPOINTS, 0, edit_bytes_zero, "key \"bytes\" = 0"},
        {3, ZP_OP_ALLOC, ZP_MEM_ACTIVATIONS, 0, edit_category, "key \"category\" params"},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_ALLGATHER, 2, edit_elems_more, "key \"elems\""},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_ALLGATHER, 0, edit_bytes_double, "key \"bytes\""},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_REDUCE_SCATTER, 0, edit_elems_more, "key \"elems\""},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_REDUCE_SCATTER, 1, edit_offset_far, "key \"elems\""},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_REDUCE_SCATTER, 0, edit_tp, "key \"group\" tp"},
        {3, ZP_OP_COLLECTIVE, ZP_COLL_REDUCE_SCATTER, 0, edit_allreduce, "key \"op\" allreduce"},
        {3, ZP_OP_FREE, ZP_MEM_GATHERED_PARAMS, 1, edit_free_other, "key \"buffer\" = 0"},
        {3, ZP_OP_FREE, ZP_MEM_BUCKETS, 0, edit_bytes_double, "key \"bytes\""},
        {3, ZP_OP_COMPUTE, ZP_COMP_EMBED_FWD, 0, edit_micro_late, "key \"micro\" = 7"},
        {3, ZP_OP_COMPUTE, ZP_COMP_BLOCK_FWD, 0, edit_module, "key \"module\" = qkv"},
        {1, ZP_OP_COLLECTIVE, ZP_COLL_ALLGATHER, 0, edit_elems_more, "key \"elems\""},
        {1, ZP_OP_COLLECTIVE, ZP_COLL_ALLGATHER, 0, edit_offset_far, "key \"elem_offset\""},
        {1, ZP_OP_COLLECTIVE, ZP_COLL_REDUCE_SCATTER, 0, edit_elems_more, "key \"elems\""},
        {0, ZP_OP_COLLECTIVE, ZP_COLL_ALLREDUCE, 0, edit_buffer_max, "key \"buffer\""},
        {2, ZP_OP_ALLOC, ZP_MEM_BUCKETS, 1, edit_unit_beyond, "key \"unit\" = 99"},
    };
    ZpModel m = small_model();
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpSchedule *s = build(&m, cases[i].stage, 2, 1, TRUE);
        ZpOp *op = nth_op(s, cases[i].kind, cases[i].sub, cases[i].nth);
        const guint index = (guint)(op - (ZpOp *)s->ops->data);
        cases[i].edit(op);
        GError *error = NULL;
        g_assert_false(zp_schedcheck_ops(s, "f.json", &error));
        char *where = g_strdup_printf("f.json: ops[%u]: %s", index, cases[i].message);
        g_test_message("case %zu: %s", i, error->message);
        g_assert_nonnull(strstr(error->message, where));
        g_free(where);
        g_clear_error(&error);
        zp_sched_free(s);
    }
    /* A buffer id allocated twice: a gathered buffer's free becomes a bucket's alloc again. */
    ZpSchedule *s = build(&m, 3, 2, 1, FALSE);
    *nth_op(s, ZP_OP_FREE, ZP_MEM_GATHERED_PARAMS, 0) = *nth_op(s, ZP_OP_ALLOC, ZP_MEM_BUCKETS, 0);
    GError *error = NULL;
    g_assert_false(zp_schedcheck_ops(s, "f.json", &error));
    g_assert_nonnull(strstr(error->message, "was allocated before"));
    g_clear_error(&error);
    zp_sched_free(s);
}

/* The model limit, 100,000 layers, at stage 3 with checkpointing: the gather bookkeeping is
 * linear in layers (quadratic, it took minutes), and every block is gathered twice. The
 * accumulation that would list more than ZP_SCHED_MAX_UNIT_STEPS is refused, naming it. */
static void test_deep_and_long_bounded(void)
{
    ZpModel m = small_model();
    m.layers = 100000;
    ZpPlan p;
    zp_plan_defaults(&p, 3, 8, 1);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.checkpoint = TRUE;
    p.zero.stage3_param_persistence_threshold = 0;
    const double t0 = g_get_monotonic_time() / 1e6;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const double build_s = g_get_monotonic_time() / 1e6 - t0;
    g_test_message("100,000-layer stage-3 schedule: %u ops in %.2f s", s->ops->len, build_s);
    /* A guard against the quadratic bookkeeping, not a speed target: it builds in about
     * 0.5 s, 10 s under ASan on a loaded machine, and took minutes when quadratic. */
    g_assert_cmpfloat(build_s, <, 60);
    guint gathers = 0;
    for (guint i = 0; i < s->ops->len; i++)
        gathers += zp_sched_op(s, i)->kind == ZP_OP_COLLECTIVE &&
                   zp_sched_op(s, i)->sub == ZP_COLL_ALLGATHER;
    g_assert_cmpuint(gathers, ==, 2 * 100000 + 3);
    g_assert_true(zp_schedcheck_ops(s, "deep", &error));
    zp_sched_free(s);
    m.layers = 48;
    p.grad_accum = 1000000;
    g_assert_null(zp_sched_build(&m, &p, &error));
    g_assert_nonnull(strstr(error->message, "grad-accum: 1000000 micro-steps x 50 units"));
    g_clear_error(&error);
}

/* ZpOp's union: the bytes an op's kind leaves unused (all of it for alloc, free and transfer
 * ops; a collective's peer and what follows it; a p2p op's after its peer) set to 0xff, which
 * is NaN as a double and past every range as an integer. The simulation (its checks, costs,
 * memory and totals), the allocator replay, the schedule check and the digest must not move:
 * none reads a field on an op of the wrong kind. */
static void poison_unused(ZpSchedule *s)
{
    const size_t lo = offsetof(ZpOp, flops), hi = offsetof(ZpOp, bytes);
    const size_t after_peer = offsetof(ZpOp, peer) + sizeof(uint32_t);
    for (guint i = 0; i < s->ops->len; i++) {
        ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        const size_t from = op->kind == ZP_OP_COMPUTE      ? hi
                            : op->kind == ZP_OP_COLLECTIVE ? offsetof(ZpOp, peer)
                            : op->kind == ZP_OP_P2P        ? after_peer
                                                           : lo;
        memset((char *)op + from, 0xff, hi - from);
    }
}

static void test_op_union_by_kind(void)
{
    ZpModel m = small_model();
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    ZpPlan plans[5];
    zp_plan_defaults(&plans[0], 3, 4, 1); /* DeepSpeed's: unpacks, gathers, persistent copies */
    plans[0].checkpoint = TRUE;
    zp_plan_defaults(&plans[1], 2, 2, 2); /* the paper's, tensor-parallel, accumulating */
    plans[1].impl = ZP_IMPL_PAPER, plans[1].grad_accum = 2;
    zp_plan_defaults(&plans[2], 1, 2, 1); /* Megatron's pipeline: sends, the tied exchange */
    plans[2].impl = ZP_IMPL_MEGATRON, plans[2].pipe.stages = 2, plans[2].grad_accum = 4;
    zp_plan_defaults(&plans[3], 3, 2, 1); /* ZeRO-Infinity: transfers, CPU Adam */
    plans[3].zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
    plans[3].zero.offload_param.device = ZP_OFFLOAD_NVME;
    zp_plan_defaults(&plans[4], 3, 4, 1); /* ZeRO++: quantize ops, hpZ, qgZ's all-to-alls */
    plans[4].zero.zero_quantized_weights = plans[4].zero.zero_quantized_gradients = TRUE;
    plans[4].zero.zero_hpz_partition_size = 2;
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
        GError *error = NULL;
        SimResult *r[2];
        ZpAllocStats replay[2];
        char *digest[2];
        for (int poisoned = 0; poisoned < 2; poisoned++) {
            ZpSchedule *s = zp_sched_build(&m, &plans[k], &error);
            g_assert_no_error(error);
            if (poisoned)
                poison_unused(s);
            const SimOptions options = {.mode = SIM_MODE_FOLDED};
            r[poisoned] = sim_engine_run(s, &hw, &options, &error);
            g_assert_no_error(error);
            replay[poisoned] = zp_alloc_replay_schedule(s, 80e9);
            digest[poisoned] = zp_sched_digest(s);
            if (plans[k].impl == ZP_IMPL_PAPER) /* zp_schedcheck holds the paper's */
                g_assert_true(zp_schedcheck_ops(s, "built", &error));
            g_assert_no_error(error);
            zp_sched_free(s);
        }
        g_assert_cmpfloat(r[1]->step_time_s, ==, r[0]->step_time_s);
        g_assert_cmpfloat(r[1]->compute_s, ==, r[0]->compute_s);
        g_assert_cmpfloat(r[1]->exposed_comm_s, ==, r[0]->exposed_comm_s);
        g_assert_cmpfloat(r[1]->model_flops, ==, r[0]->model_flops);
        g_assert_cmpfloat(r[1]->peak_memory_bytes, ==, r[0]->peak_memory_bytes);
        g_assert_cmpint(memcmp(r[1]->comm_bytes, r[0]->comm_bytes, sizeof r[0]->comm_bytes), ==, 0);
        g_assert_cmpfloat(replay[1].peak_reserved_bytes, ==, replay[0].peak_reserved_bytes);
        g_assert_cmpstr(digest[1], ==, digest[0]);
        for (int i = 0; i < 2; i++) {
            sim_result_free(r[i]);
            g_free(digest[i]);
        }
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/sched/states-and-comm-match-models", test_states_and_comm_match_models);
    g_test_add_func("/sched/bookkeeping", test_bookkeeping);
    g_test_add_func("/sched/structure", test_structure);
    g_test_add_func("/sched/json-round-trip", test_json_round_trip);
    g_test_add_func("/sched/bad-plans", test_bad_plans);
    g_test_add_func("/sched/check-accepts-built", test_check_accepts_built);
    g_test_add_func("/sched/check-refuses-hostile", test_check_refuses_hostile);
    g_test_add_func("/sched/deep-and-long-bounded", test_deep_and_long_bounded);
    g_test_add_func("/sched/op-union-by-kind", test_op_union_by_kind);
    return g_test_run();
}
