/* test_zeropp: ZeRO++'s volumes per rank in the schedule, the paper's and DeepSpeed's, against
 * plain stage 3 at 64 GPUs, 8 per node, each from a formula stated with its test; ds_config. */
#include "zp_dsconfig.h"
#include "zp_mem.h"
#include "zp_model.h"
#include "zp_sched.h"
#include "zp_util.h"
#include "zp_zeropp.h"

#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

static ZpModel model(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt2-1.5b", &m, &error));
    g_assert_no_error(error);
    return m;
}

static ZpPlan plan64_impl(ZpImplKind impl)
{
    ZpPlan p;
    zp_plan_defaults(&p, 3, 64, 1);
    p.impl = impl;
    p.micro_batch = 2;
    p.gpus_per_node = 8;
    return p;
}

/* The paper's unit-level schedule, which the first tests were written against. */
static ZpPlan plan64(void)
{
    return plan64_impl(ZP_IMPL_PAPER);
}

static ZpSchedule *build(const ZpPlan *p)
{
    ZpModel m = model();
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, p, &error);
    g_assert_no_error(error);
    return s;
}

/* The collectives of a schedule, in order. */
static GPtrArray *collectives(const ZpSchedule *s)
{
    GPtrArray *out = g_ptr_array_new();
    for (guint i = 0; i < s->ops->len; i++)
        if (zp_sched_op(s, i)->kind == ZP_OP_COLLECTIVE)
            g_ptr_array_add(out, (gpointer)zp_sched_op(s, i));
    return out;
}

static double sent(double bytes, double n)
{
    return (n - 1) / n * bytes;
}

/* qwZ: every stage-3 gather of E elements (a unit's under the paper's schedule, a fetch
 * group's of parameters under DeepSpeed's) carries E int8 bytes plus a 4-byte scale per
 * quantisation group of each of the 64 partitions, S = E + 4 * 64 * groups(E / 64), against
 * 2E: about half. The persistent units' post-step refresh stays 16-bit. Run for each `impl`. */
static void test_qwz(gconstpointer impl)
{
    ZpPlan p = plan64_impl(GPOINTER_TO_INT(impl));
    ZpSchedule *plain = build(&p);
    p.zero.zero_quantized_weights = TRUE;
    ZpSchedule *q = build(&p);
    GPtrArray *a = collectives(plain), *b = collectives(q);
    g_assert_cmpuint(a->len, ==, b->len);
    double plain_gather = 0, q_gather = 0;
    int quantised = 0;
    for (guint i = 0; i < a->len; i++) {
        const ZpOp *x = g_ptr_array_index(a, i), *y = g_ptr_array_index(b, i);
        g_assert_cmpint(x->sub, ==, y->sub);
        if (x->sub != ZP_COLL_ALLGATHER || x->buffer < 0) {
            g_assert_cmpfloat(y->bytes, ==, x->bytes);
            continue;
        }
        const uint64_t e = x->elems;
        g_assert_cmpfloat(x->bytes, ==, 2.0 * (double)e);
        g_assert_cmpfloat(y->bytes, ==, (double)e + 4.0 * 64 * (double)zp_zeropp_qwz_groups(e / 64));
        g_assert_cmpfloat(y->bytes, <, 0.51 * x->bytes);
        plain_gather += sent(x->bytes, 64);
        q_gather += sent(y->bytes, 64);
        quantised++;
    }
    g_assert_cmpint(quantised, >, 0);
    const double saved = zp_sched_comm_bytes(plain, ZP_GROUP_DP) - zp_sched_comm_bytes(q, ZP_GROUP_DP);
    g_assert_cmpfloat(fabs(saved - (plain_gather - q_gather)), <, 1e-9 * saved);
    /* DeepSpeed's grouping: about 8000 elements a group, 8 x groups dividing n. */
    g_assert_cmpuint(zp_zeropp_qwz_groups(480000), ==, 60);
    g_assert_cmpuint(zp_zeropp_qwz_groups(8000 * 8 * 7), ==, 56);
    g_ptr_array_unref(a);
    g_ptr_array_unref(b);
    zp_sched_free(plain);
    zp_sched_free(q);
}

/* hpZ with 8: backward's block gathers run in the 8-rank node group, sending 7/8 S each,
 * instead of 63/64 S over all 64; forward's stay on the whole group; every rank keeps the
 * secondary partitions, 2 bytes x E / 8 for each non-persistent unit (2 psi / 8). */
static void test_hpz(void)
{
    ZpPlan p = plan64();
    ZpSchedule *plain = build(&p);
    p.zero.zero_hpz_partition_size = 8;
    ZpSchedule *h = build(&p);
    GPtrArray *a = collectives(plain), *b = collectives(h);
    g_assert_cmpuint(a->len, ==, b->len);
    double moved = 0, in_node = 0;
    int backward = 0;
    for (guint i = 0; i < a->len; i++) {
        const ZpOp *x = g_ptr_array_index(a, i), *y = g_ptr_array_index(b, i);
        g_assert_cmpfloat(y->bytes, ==, x->bytes);
        if (y->group == ZP_GROUP_HPZ) {
            g_assert_cmpint(x->group, ==, ZP_GROUP_DP);
            g_assert_cmpint(y->unit, >=, 1); /* blocks, in backward */
            moved += sent(x->bytes, 64);
            in_node += sent(y->bytes, 8);
            backward++;
        }
    }
    g_assert_cmpint(backward, ==, 48); /* one per block */
    g_assert_cmpfloat(zp_sched_comm_bytes(h, ZP_GROUP_HPZ), ==, in_node);
    g_assert_cmpfloat(fabs(zp_sched_comm_bytes(plain, ZP_GROUP_DP) -
                           zp_sched_comm_bytes(h, ZP_GROUP_DP) - moved), <, 1e-6 * moved);
    double secondary = 0;
    for (int u = 0; u < h->n_units; u++)
        if (!zp_sched_unit_persistent(h, u))
            secondary += 2.0 * (double)zp_sched_unit_padded(h, u) / 8;
    g_assert_cmpfloat(h->state_bytes[ZP_MEM_SECONDARY_PARAMS], ==, secondary);
    g_assert_cmpfloat(plain->state_bytes[ZP_MEM_SECONDARY_PARAMS], ==, 0);
    /* The memory model's closed form: 2 psi / 8, the units unpadded (within 0.1%). */
    ZpModel m = model();
    const ZpResidual r = zp_mem_residual(&m, &p, NULL);
    g_assert_cmpfloat(fabs(r.hpz_secondary_bytes - secondary), <, 1e-3 * secondary);
    g_ptr_array_unref(a);
    g_ptr_array_unref(b);
    zp_sched_free(plain);
    zp_sched_free(h);
}

/* qgZ: a bucket of N gradient elements, reduce-scattered as 2N bytes over 64 ranks, goes
 * instead as int4 with a 4-byte scale per group, g = ceil(max(64, N / h) / 64) groups in each
 * of the 64 partitions of N / 64 elements: S1 = 64 (ceil(N / 128) + 4 g) through the
 * all-to-all inside the node (8 ranks), then S1 / 8 once across the 8 nodes. Per rank
 * 7/8 S1 + 7/8 S1/8 against 63/64 2N: a quarter of the bytes, plus the scales (the paper's
 * buckets). */
static void test_qgz(gconstpointer impl)
{
    ZpPlan p = plan64_impl(GPOINTER_TO_INT(impl));
    ZpSchedule *plain = build(&p);
    p.zero.zero_quantized_gradients = TRUE;
    ZpSchedule *g = build(&p);
    GPtrArray *a = collectives(plain), *b = collectives(g);
    GArray *sizes = g_array_new(FALSE, FALSE, sizeof(double));
    double plain_bytes = 0;
    for (guint i = 0; i < a->len; i++) {
        const ZpOp *x = g_ptr_array_index(a, i);
        if (x->sub == ZP_COLL_REDUCE_SCATTER) {
            const double n = x->bytes / 2;
            g_array_append_val(sizes, n);
            plain_bytes += sent(x->bytes, 64);
        }
    }
    guint k = 0, crossings = 0;
    double expected = 0;
    for (guint i = 0; i < b->len; i++) {
        const ZpOp *y = g_ptr_array_index(b, i);
        g_assert_cmpint(y->sub, !=, ZP_COLL_REDUCE_SCATTER);
        if (y->group == ZP_GROUP_NODE) {
            const double n = g_array_index(sizes, double, k++);
            const double s1 = 64 * (ceil(n / 128) + 4 * ceil(fmax(64, ceil(n / 1600)) / 64));
            g_assert_cmpfloat(y->bytes, ==, s1);
            const ZpOp *next = g_ptr_array_index(b, i + 1);
            g_assert_cmpint(next->group, ==, ZP_GROUP_XNODE);
            g_assert_cmpfloat(next->bytes, ==, s1 / 8);
            expected += sent(s1, 8) + sent(s1 / 8, 8);
        }
        crossings += y->group == ZP_GROUP_XNODE;
    }
    g_assert_cmpuint(sizes->len, >, 0);
    g_assert_cmpuint(k, ==, sizes->len);
    g_assert_cmpuint(crossings, ==, sizes->len); /* across nodes once a bucket */
    const double got = zp_sched_comm_bytes(g, ZP_GROUP_NODE) + zp_sched_comm_bytes(g, ZP_GROUP_XNODE);
    g_assert_cmpfloat(fabs(got - expected), <, 1e-9 * expected);
    g_assert_cmpfloat(got, <, 0.3 * plain_bytes);
    g_assert_cmpfloat(got, >, 0.25 * 63.0 / 64 * 7.0 / 8 * plain_bytes);
    g_array_unref(sizes);
    g_ptr_array_unref(a);
    g_ptr_array_unref(b);
    zp_sched_free(plain);
    zp_sched_free(g);
}

/* DeepSpeed's qgZ (stage3.py __avg_scatter_grads -> coalesced_collectives.py
 * all_to_all_quant_reduce), gpt2-1.5b (h 1600) on 8 nodes of 8: tensor by tensor. A 2-D one
 * of N elements with N % 128 == 0 (the position table and each block's four matrices: 4 x 48
 * + 1 = 193) goes through its own pair: S1 = N / 2 + 4 g with g = max(N / h, h, 64) scales
 * inside the node, S2 = N / 16 + 4 floor(g / 8) across the nodes. The rest are
 * reduce-scattered alone over the 64 ranks: wte (80,411,200 elements, which 128 does not
 * divide), the 8 vectors of each block and the final norm's 2 (48 x 8 + 3 = 387), each
 * 2 x N bytes (all of them multiples of 64, so unpadded). On one node (64 GPUs a node)
 * DeepSpeed does not use qgZ: the schedule's collectives are plain stage 3's. */
static void test_qgz_deepspeed(void)
{
    ZpPlan p = plan64_impl(ZP_IMPL_DEEPSPEED);
    p.zero.zero_quantized_gradients = TRUE;
    ZpSchedule *g = build(&p);
    GPtrArray *b = collectives(g);
    guint pairs = 0, alone = 0;
    double expected = 0;
    for (guint i = 0; i < b->len; i++) {
        const ZpOp *y = g_ptr_array_index(b, i);
        if (y->group == ZP_GROUP_NODE) {
            const double n = (double)y->elems, groups = fmax(fmax(n / 1600, 1600), 64);
            g_assert_cmpfloat(fmod(n, 128), ==, 0);
            g_assert_cmpfloat(y->bytes, ==, n / 2 + 4 * groups);
            const ZpOp *next = g_ptr_array_index(b, i + 1);
            g_assert_cmpint(next->group, ==, ZP_GROUP_XNODE);
            g_assert_cmpuint(next->elem_offset, ==, y->elem_offset);
            g_assert_cmpfloat(next->bytes, ==, n / 16 + 4 * floor(groups / 8));
            expected += sent(y->bytes, 8) + sent(next->bytes, 8);
            pairs++;
        } else if (y->sub == ZP_COLL_REDUCE_SCATTER) {
            g_assert_true(y->elems == 80411200 || y->elems <= 6400);
            g_assert_cmpfloat(y->bytes, ==, 2.0 * (double)y->elems);
            expected += sent(y->bytes, 64);
            alone++;
        }
    }
    g_assert_cmpuint(pairs, ==, 193);
    g_assert_cmpuint(alone, ==, 387);
    const double got = zp_sched_comm_bytes(g, ZP_GROUP_NODE) +
                       zp_sched_comm_bytes(g, ZP_GROUP_XNODE) +
                       zp_sched_comm_bytes(g, ZP_GROUP_DP);
    ZpPlan plain_plan = plan64_impl(ZP_IMPL_DEEPSPEED);
    ZpSchedule *plain = build(&plain_plan);
    double gathers = 0;
    for (guint i = 0; i < plain->ops->len; i++) {
        const ZpOp *x = zp_sched_op(plain, i);
        if (x->kind == ZP_OP_COLLECTIVE && x->sub == ZP_COLL_ALLGATHER)
            gathers += sent(x->bytes, 64);
    }
    g_test_message("gradients: %.6g bytes a rank", got - gathers);
    g_assert_cmpfloat(fabs(got - gathers - expected), <, 1e-9 * expected);
    /* one node: no qgZ */
    p.gpus_per_node = plain_plan.gpus_per_node = 64;
    ZpSchedule *one = build(&p), *one_plain = build(&plain_plan);
    g_assert_cmpuint(one->ops->len, ==, one_plain->ops->len);
    for (guint i = 0; i < one->ops->len; i++) {
        g_assert_cmpint(zp_sched_op(one, i)->kind, ==, zp_sched_op(one_plain, i)->kind);
        g_assert_cmpint(zp_sched_op(one, i)->group, ==, zp_sched_op(one_plain, i)->group);
        g_assert_cmpfloat(zp_sched_op(one, i)->bytes, ==, zp_sched_op(one_plain, i)->bytes);
    }
    zp_sched_free(one);
    zp_sched_free(one_plain);
    zp_sched_free(plain);
    g_ptr_array_unref(b);
    zp_sched_free(g);
}

/* qgZ with tensor parallelism: DeepSpeed's all-to-alls span the whole world (groups.py
 * _get_local_all_to_all_group), so --impl deepspeed refuses it naming the flags, and the
 * planner's search (zp_zeropp_check) never offers it; the paper's idealised qgZ over the
 * data-parallel group stays. */
static void test_qgz_tensor_parallel(void)
{
    ZpModel m = model();
    static const ZpImplKind impls[] = {ZP_IMPL_DEEPSPEED, ZP_IMPL_PAPER};
    for (size_t i = 0; i < G_N_ELEMENTS(impls); i++) {
        const ZpImplKind impl = impls[i];
        ZpPlan p = plan64_impl(impl);
        p.dp = 16, p.mp = 5; /* gpt2-1.5b has 25 heads; 2 data-parallel ranks a node */
        p.gpus_per_node = 10;
        p.zero.zero_quantized_gradients = TRUE;
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_cmpint(zp_zeropp_check(&p, NULL), ==, impl != ZP_IMPL_DEEPSPEED);
        if (impl == ZP_IMPL_DEEPSPEED) {
            g_assert_null(s);
            g_assert_nonnull(strstr(error->message, "--quantized-gradients) with --mp > 1"));
            g_clear_error(&error);
            p.mp = 1, p.dp = 80; /* the same world without tensor parallelism runs */
            s = zp_sched_build(&m, &p, &error);
        }
        g_assert_no_error(error);
        g_assert_nonnull(s);
        zp_sched_free(s);
    }
}

/* Marks the all-gathers a compute op after the head (a backward op) waits for. */
static gboolean *backward_gathers(const ZpSchedule *s)
{
    gboolean *marked = g_new0(gboolean, s->ops->len), after_head = FALSE;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE)
            continue;
        const uint32_t *d = zp_sched_deps(s, op);
        for (uint32_t k = 0; after_head && k < op->n_deps; k++)
            marked[d[k]] |= zp_sched_op(s, d[k])->kind == ZP_OP_COLLECTIVE &&
                            zp_sched_op(s, d[k])->sub == ZP_COLL_ALLGATHER;
        after_head |= op->sub == ZP_COMP_HEAD;
    }
    return marked;
}

/* hpZ with 8 under DeepSpeed's schedule: the gathers backward's compute ops wait for run in
 * the 8-rank node group, sending 7/8 S each instead of 63/64 S, and the
 * forward's stay on all 64; the op lists are otherwise identical. DeepSpeed keeps parameters
 * of at most 1e5 elements whole (stage3_param_persistence_threshold), so gpt2-1.5b's
 * secondary partition holds its weight matrices only, each padded to a multiple of 64 (all
 * already are): 2 bytes x (48 blocks x (h x 3h + h^2 + 2 x h x 4h) + V h + s h) / 8, with
 * h = 1600, V = 50257, s = 1024 (tied embeddings) = 389,152,400 bytes. */
static void test_hpz_deepspeed(void)
{
    ZpPlan p = plan64_impl(ZP_IMPL_DEEPSPEED);
    ZpSchedule *plain = build(&p);
    p.zero.zero_hpz_partition_size = 8;
    ZpSchedule *h = build(&p);
    g_assert_cmpuint(plain->ops->len, ==, h->ops->len);
    gboolean *in_backward = backward_gathers(plain);
    double moved = 0, in_node = 0;
    int n_backward = 0, n_forward = 0;
    for (guint i = 0; i < h->ops->len; i++) {
        const ZpOp *x = zp_sched_op(plain, i), *y = zp_sched_op(h, i);
        g_assert_cmpint(x->kind, ==, y->kind);
        g_assert_cmpfloat(x->bytes, ==, y->bytes);
        if (y->kind != ZP_OP_COLLECTIVE || y->sub != ZP_COLL_ALLGATHER)
            continue;
        g_assert_cmpint(x->group, ==, ZP_GROUP_DP);
        g_assert_cmpint(y->group, ==, in_backward[i] ? ZP_GROUP_HPZ : ZP_GROUP_DP);
        if (in_backward[i]) {
            moved += sent(x->bytes, 64);
            in_node += sent(y->bytes, 8);
            n_backward++;
        } else {
            n_forward++;
        }
    }
    g_test_message("deepspeed: %d forward gathers on dp, %d backward in the node", n_forward,
                   n_backward);
    g_assert_cmpint(n_backward, >, 0);
    g_assert_cmpint(n_forward, >, 0);
    g_assert_cmpfloat(zp_sched_comm_bytes(h, ZP_GROUP_HPZ), ==, in_node);
    g_assert_cmpfloat(fabs(zp_sched_comm_bytes(plain, ZP_GROUP_DP) -
                           zp_sched_comm_bytes(h, ZP_GROUP_DP) - moved), <, 1e-6 * moved);
    const double hd = 1600, blocks = 48 * (hd * 3 * hd + hd * hd + 2 * hd * 4 * hd);
    const double secondary = 2.0 * (blocks + 50257 * hd + 1024 * hd) / 8;
    g_assert_cmpfloat(secondary, ==, 389152400.0);
    g_assert_cmpfloat(h->state_bytes[ZP_MEM_SECONDARY_PARAMS], ==, secondary);
    g_assert_cmpfloat(plain->state_bytes[ZP_MEM_SECONDARY_PARAMS], ==, 0);
    g_free(in_backward);
    zp_sched_free(plain);
    zp_sched_free(h);
}

/* The three keys read from ds_config's zero_optimization and written back; refused below
 * stage 3 and for an hpZ size that leaves the node. */
static void test_keys(void)
{
    ZpModel m = model();
    char *dir = g_dir_make_tmp("zplan-zeropp-XXXXXX", NULL);
    char *path = g_build_filename(dir, "ds.json", NULL);
    g_assert_true(g_file_set_contents(
        path, "{\"train_batch_size\": 128, \"train_micro_batch_size_per_gpu\": 2, "
              "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true, "
              "\"zero_hpz_partition_size\": 8, \"zero_quantized_gradients\": true}}", -1, NULL));
    ZpPlan launch = plan64(), plan;
    int64_t batch;
    GError *error = NULL;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    g_assert_true(zp_dsconfig_read(path, &m, &launch, &plan, &batch, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpuint(warnings->len, ==, 0);
    g_assert_true(plan.zero.zero_quantized_weights && plan.zero.zero_quantized_gradients);
    g_assert_cmpint(plan.zero.zero_hpz_partition_size, ==, 8);
    g_assert_true(zp_dsconfig_write(&plan, path, &error));
    ZpPlan again;
    g_assert_true(zp_dsconfig_read(path, &m, &launch, &again, &batch, warnings, &error));
    g_assert_true(again.zero.zero_quantized_weights && again.zero.zero_quantized_gradients);
    g_assert_cmpint(again.zero.zero_hpz_partition_size, ==, 8);
    plan.zero.stage = 2;
    g_assert_null(zp_sched_build(&m, &plan, &error));
    g_assert_nonnull(strstr(error->message, "stage 3 only"));
    g_clear_error(&error);
    plan.zero.stage = 3;
    plan.zero.zero_hpz_partition_size = 16;
    g_assert_null(zp_sched_build(&m, &plan, &error));
    g_assert_nonnull(strstr(error->message, "zero_hpz_partition_size"));
    g_clear_error(&error);
    g_ptr_array_unref(warnings);
    g_unlink(path);
    g_rmdir(dir);
    g_free(path);
    g_free(dir);
}

/* Schedules with every ZeRO-R and ZeRO++ option write and read back op for op, through the
 * reader's checks (zp_schedcheck). */
static void test_round_trip(void)
{
    ZpModel m = model();
    ZpPlan plans[2] = {plan64(), plan64()};
    plans[0].zero.zero_quantized_weights = plans[0].zero.zero_quantized_gradients = TRUE;
    plans[0].zero.zero_hpz_partition_size = 8;
    plans[0].checkpoint = TRUE;
    plans[1].zero.stage = 2;
    plans[1].dp = 16, plans[1].mp = 5; /* gpt2-1.5b has 25 heads */
    plans[1].checkpoint = TRUE;
    plans[1].ckpt = (ZpCheckpointConfig){.partition_activations = TRUE, .cpu_checkpointing = TRUE,
                                         .contiguous_memory_optimization = TRUE,
                                         .synchronize_checkpoint_boundary = TRUE};
    char *dir = g_dir_make_tmp("zplan-zeropp-XXXXXX", NULL);
    char *path = g_build_filename(dir, "s.json", NULL);
    for (int i = 0; i < 2; i++) {
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &plans[i], &error);
        g_assert_no_error(error);
        g_assert_true(zp_sched_write_json(s, path, &error));
        ZpSchedule *back = zp_sched_read_json(path, &error);
        g_assert_no_error(error);
        g_assert_cmpuint(back->ops->len, ==, s->ops->len);
        for (guint k = 0; k < s->ops->len; k++) {
            const ZpOp *x = zp_sched_op(s, k), *y = zp_sched_op(back, k);
            g_assert_cmpint(x->kind, ==, y->kind);
            g_assert_cmpint(x->sub, ==, y->sub);
            g_assert_cmpint(x->group, ==, y->group);
            g_assert_cmpint(x->stream, ==, y->stream);
            g_assert_cmpfloat(x->bytes, ==, y->bytes);
            if (x->kind == ZP_OP_COMPUTE)
                g_assert_cmpfloat(x->mem_bytes, ==, y->mem_bytes);
        }
        for (int c = 0; c < ZP_MEM_N; c++)
            g_assert_cmpfloat(back->state_bytes[c], ==, s->state_bytes[c]);
        zp_sched_free(s);
        zp_sched_free(back);
    }
    g_unlink(path);
    g_rmdir(dir);
    g_free(path);
    g_free(dir);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_data_func("/zeropp/qwz", GINT_TO_POINTER(ZP_IMPL_PAPER), test_qwz);
    g_test_add_func("/zeropp/hpz", test_hpz);
    g_test_add_data_func("/zeropp/qgz", GINT_TO_POINTER(ZP_IMPL_PAPER), test_qgz);
    g_test_add_data_func("/zeropp/deepspeed/qwz", GINT_TO_POINTER(ZP_IMPL_DEEPSPEED), test_qwz);
    g_test_add_func("/zeropp/deepspeed/hpz", test_hpz_deepspeed);
    g_test_add_func("/zeropp/deepspeed/qgz", test_qgz_deepspeed);
    g_test_add_func("/zeropp/deepspeed/qgz-tensor-parallel", test_qgz_tensor_parallel);
    g_test_add_func("/zeropp/keys", test_keys);
    g_test_add_func("/zeropp/round-trip", test_round_trip);
    return g_test_run();
}
