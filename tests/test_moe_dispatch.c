/* test_moe_dispatch: Megatron-Core's ways for a mixture of experts' tokens under tensor
 * parallelism, by hand — the all-to-all under sequence parallelism (the expert tensor group's
 * gather), the all-gather dispatcher over TP x EP, and whole experts (ETP 1). */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_sched.h"
#include "zp_schedcheck.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <unistd.h>

/* The schedule's forward expert ops, each checked to cost `flops`. */
static guint expert_fwd_ops(const ZpSchedule *s, double flops)
{
    guint n = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_EXPERT_FWD) {
            n++;
            g_assert_cmpfloat(op->flops, ==, flops);
        }
    }
    return n;
}

/* The 2-layer MoE's collectives over `group` of `kind` in its sparse units (1 and 2), each of
 * `bytes` where bytes > 0; the all-to-alls (dispatch and combine) where all_to_all. */
static guint sparse_colls(const ZpSchedule *s, gboolean all_to_all, ZpGroup group,
                          ZpCollKind kind, double bytes)
{
    guint n = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        const gboolean a2a = op->sub == ZP_COLL_EP_DISPATCH || op->sub == ZP_COLL_EP_COMBINE;
        if (op->kind != ZP_OP_COLLECTIVE || op->unit < 1 || op->unit > 2 ||
            (all_to_all ? !a2a : a2a || op->group != group || op->sub != kind))
            continue;
        n++;
        if (bytes > 0)
            g_assert_cmpfloat(op->bytes, ==, bytes);
    }
    return n;
}

/* Megatron-Core's experts under sequence parallelism (the only way it trains a mixture of
 * experts with TP > 1: moe_layer.py MoELayer.forward), on the 2-layer MoE at mp 2, dp 4, EP 2,
 * micro-batch 2 (b s = 32 tokens), by hand:
 * - each tensor rank routes its own 16 tokens: 32 copies dispatched, 32 received, an
 *   all-to-all of 32 x 64 bf16 = 4,096 bytes (8,192 without, each rank routing all 32);
 * - the expert tensor group all-gathers the two ranks' 32 before the experts and
 *   reduce-scatters their outputs after: 64 x 64 = 4,096 elements, 8,192 bytes, forward and
 *   backward (token_dispatcher.py dispatch_postprocess, combine_preprocess);
 * - so the experts compute 64 tokens either way: 2 x 64 x (64 x 2 x 16 + 16 x 64) = 393,216
 *   FLOPs forward, the same with and without sequence parallelism;
 * - a sparse block without shared experts keeps the attention's sum alone (a reduce-scatter
 *   and an all-gather of b s h = 2,048 elements), where without sequence parallelism it has
 *   the attention's and the MLP's all-reduces;
 * - each of the 4 dispatches waits for the sums before it (it overlapped them, sharing NVLink:
 *   the all-gather dispatcher's simulated collectives were 10% over their closed form at EP 4
 *   x TP 2 with whole experts, equal since). */
static void test_sequence_parallel_experts(void)
{
    ZpModel m;
    tu_small_moe(&m);
    for (int sp = 0; sp <= 1; sp++) {
        ZpPlan p;
        zp_plan_defaults(&p, 1, 4, 2);
        p.impl = ZP_IMPL_MEGATRON, p.precision = ZP_PREC_BF16, p.micro_batch = 2;
        p.experts.ep = 2, p.sequence_parallel = sp;
        zp_impl_plan_defaults(&p);
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        const guint experts = expert_fwd_ops(s, 393216);
        guint gathers = 0, scatters = 0, sums = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind != ZP_OP_COLLECTIVE)
                continue;
            if (op->sub == ZP_COLL_EP_DISPATCH || op->sub == ZP_COLL_EP_COMBINE)
                g_assert_cmpfloat(op->bytes, ==, sp ? 4096 : 8192);
            if (op->group != ZP_GROUP_TP || op->unit < 1 || op->unit > 2)
                continue;
            if (op->elems == 4096) { /* the expert tensor group's */
                g_assert_cmpfloat(op->bytes, ==, 8192);
                gathers += op->sub == ZP_COLL_ALLGATHER;
                scatters += op->sub == ZP_COLL_REDUCE_SCATTER;
                continue;
            }
            g_assert_cmpuint(op->elems, ==, 2048);
            if (sp && op->sub == ZP_COLL_ALLGATHER) /* a sum's second half (below) */
                continue;
            g_assert_cmpint(op->sub, ==, (sp ? ZP_COLL_REDUCE_SCATTER : ZP_COLL_ALLREDUCE));
            sums++;
            if (sp) /* each reduce-scatter's all-gather follows it */
                g_assert_cmpint(zp_sched_op(s, i + 1)->sub, ==, ZP_COLL_ALLGATHER);
        }
        /* Every dispatch waits for the tensor-parallel sums before it (the router reads the
         * attention's summed output; backward, the next layer's summed input gradient):
         * through the EP buffer's alloc, whose dependencies hold a TP collective. */
        guint dispatches = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind != ZP_OP_COLLECTIVE || op->sub != ZP_COLL_EP_DISPATCH)
                continue;
            gboolean after_sums = FALSE;
            const uint32_t *d = zp_sched_deps(s, op);
            for (uint32_t k = 0; k < op->n_deps; k++) {
                const ZpOp *alloc = zp_sched_op(s, d[k]);
                if (alloc->kind != ZP_OP_ALLOC || alloc->sub != ZP_MEM_EP_BUFFERS)
                    continue;
                const uint32_t *e = zp_sched_deps(s, alloc);
                for (uint32_t j = 0; j < alloc->n_deps; j++)
                    after_sums |= zp_sched_op(s, e[j])->kind == ZP_OP_COLLECTIVE &&
                                  zp_sched_op(s, e[j])->group == ZP_GROUP_TP;
            }
            g_assert_true(after_sums);
            dispatches++;
        }
        g_assert_cmpuint(dispatches, ==, 4);
        g_test_message("sequence parallel %d: %u expert ops, %u gathers, %u reduce-scatters, "
                       "%u block sums", sp, experts, gathers, scatters, sums);
        g_assert_cmpuint(experts, ==, 2);
        /* forward and backward, two sparse units */
        g_assert_cmpuint(gathers, ==, sp ? 4 : 0);
        g_assert_cmpuint(scatters, ==, sp ? 4 : 0);
        /* two blocks, forward and backward: one sum each with, two without */
        g_assert_cmpuint(sums, ==, sp ? 4 : 8);
        zp_sched_free(s);
    }
}

/* Megatron-Core's default dispatcher (token_dispatcher.py MoEAllGatherTokenDispatcher) on the
 * 2-layer MoE (h 64, E 4, top 2, f_e 32) at mp 2, dp 4, EP 2, micro-batch 2 under sequence
 * parallelism, by hand:
 * - each rank routes its T = 16 tokens; the TP x EP group of 4 ranks (consecutive, no
 *   pipeline) gathers G = 64 of them: the routing map, 64 x 4 bytes; the probabilities,
 *   64 x 4 bf16 = 512 bytes; the tokens, 64 x 64 = 4,096 elements, 8,192 bytes;
 * - the rank's 2 experts take their half of the 128 copies, split over t: t R = 64 tokens, so
 *   2 x 64 x (64 x 2 x 16 + 16 x 64) = 393,216 FLOPs forward, the all-to-all's own;
 * - unpermute zeroes 64 rows and scatter-adds 64 into them, e (G + 3 t R) h = 32,768 bytes,
 *   and the sum's 4,096 elements are reduce-scattered; backward the reduce-scatter's
 *   transpose gathers 8,192 bytes, and the tokens' and the probabilities' gradients are
 *   reduce-scattered (8,192 and 512): per layer 4 gathers and 3 reduce-scatters, no
 *   all-to-all and no expert tensor group gather;
 * - the buffers: t R h e + G E (e + 1) = 8,960 bytes dispatched, (t R + G) h e = 16,384
 *   combined, and the gathered tokens' G h e = 8,192 in Megatron's persistent "mpu" buffer, a
 *   state of the stage all step (17,152 dispatched while the layer ran, before); the block
 *   keeps the attention's sum alone;
 * - a rank sends 3/4 of (256 + 512 + 8,192 + 8,192 + 8,192 + 8,192 + 512) x 2 layers =
 *   51,072 bytes over TP x EP, in the simulation too, and the file reads back. */
static void test_allgather_dispatcher(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan p;
    zp_plan_defaults(&p, 1, 4, 2);
    p.impl = ZP_IMPL_MEGATRON, p.precision = ZP_PREC_BF16, p.micro_batch = 2;
    p.experts.ep = 2, p.sequence_parallel = TRUE;
    p.experts.dispatcher = ZP_DISPATCH_ALLGATHER;
    zp_impl_plan_defaults(&p);
    const ZpEpActivations a = zp_ep_activations(&m, &p);
    g_assert_cmpfloat(a.gathered_tokens, ==, 64);
    g_assert_cmpfloat(a.expert_tokens, ==, 64);
    g_assert_cmpfloat(a.dispatch_bytes, ==, 8960);
    g_assert_cmpfloat(a.combine_bytes, ==, 16384);
    g_assert_cmpfloat(a.global_buffer_bytes, ==, 8192);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    zp_sched_groups(s, groups);
    g_assert_cmpint(groups[ZP_GROUP_TPEP].ranks, ==, 4);
    g_assert_cmpint(groups[ZP_GROUP_TPEP].stride, ==, 1);
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_EP_BUFFERS], ==, 8192);
    const guint experts = expert_fwd_ops(s, 393216);
    guint gathers = 0, scatters = 0, sums = 0, unpermutes = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPERMUTE_FWD) {
            unpermutes++;
            g_assert_cmpfloat(op->mem_bytes, ==, 32768);
        }
        if (op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_EP_BUFFERS)
            g_assert_true(op->bytes == 8960 || op->bytes == 16384);
        if (op->kind != ZP_OP_COLLECTIVE)
            continue;
        g_assert_true(op->sub != ZP_COLL_EP_DISPATCH && op->sub != ZP_COLL_EP_COMBINE);
        if (op->group == ZP_GROUP_TPEP) {
            g_assert_cmpint(op->stream, ==, ZP_STREAM_COMPUTE);
            g_assert_true(op->bytes == 256 || op->bytes == 512 || op->bytes == 8192);
            gathers += op->sub == ZP_COLL_ALLGATHER;
            scatters += op->sub == ZP_COLL_REDUCE_SCATTER;
        } else if (op->group == ZP_GROUP_TP && op->unit >= 1 && op->unit <= 2) {
            g_assert_cmpuint(op->elems, ==, 2048); /* the attention's sum, no expert gather */
            sums += op->sub == ZP_COLL_REDUCE_SCATTER;
        }
    }
    g_assert_cmpuint(experts, ==, 2);
    g_assert_cmpuint(unpermutes, ==, 2);
    g_assert_cmpuint(gathers, ==, 8);
    g_assert_cmpuint(scatters, ==, 6);
    g_assert_cmpuint(sums, ==, 4);
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_TPEP), ==, 51072);
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EP), ==, 0);
    /* the checker names an all-reduce over tpep, and a tpep op in a plan of the all-to-all */
    for (guint i = 0; i < s->ops->len; i++) {
        ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->group == ZP_GROUP_TPEP && op->kind == ZP_OP_COLLECTIVE) {
            op->sub = ZP_COLL_ALLREDUCE;
            g_assert_false(zp_schedcheck_ops(s, "sum", &error));
            g_assert_nonnull(strstr(error->message, "allreduce: the allgather dispatcher gathers "
                                                    "and reduce-scatters"));
            g_clear_error(&error);
            op->sub = ZP_COLL_ALLGATHER;
            break;
        }
    }
    ZpPlan a2a = p;
    a2a.experts.dispatcher = ZP_DISPATCH_ALLTOALL;
    ZpSchedule *x = zp_sched_build(&m, &a2a, &error);
    g_assert_no_error(error);
    for (guint i = 0; i < x->ops->len; i++) {
        ZpOp *op = &g_array_index(x->ops, ZpOp, i);
        if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_EP_DISPATCH) {
            op->sub = ZP_COLL_ALLGATHER, op->group = ZP_GROUP_TPEP;
            break;
        }
    }
    g_assert_false(zp_schedcheck_ops(x, "a2a", &error));
    g_assert_nonnull(strstr(error->message, "tpep: only the allgather dispatcher's"));
    g_clear_error(&error);
    zp_sched_free(x);
    ZpHw hw = tu_load_hw("dgx-h100");
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(r->comm_bytes[ZP_GROUP_TPEP], ==, 51072);
    g_assert_cmpfloat(r->alltoall_s, >, 0);
    sim_result_free(r);
    char *path = NULL;
    const int fd = g_file_open_tmp("zp-moe-XXXXXX.json", &path, NULL);
    close(fd);
    g_assert_true(zp_sched_write_json(s, path, &error));
    for (int graph = 0; graph < 2; graph++) {
        ZpSchedule *t = graph ? zp_sched_read_graph(path, &error) : zp_sched_read_json(path, &error);
        g_assert_no_error(error);
        g_assert_cmpuint(t->ops->len, ==, s->ops->len);
        tu_assert_same_groups(s, t);
        g_assert_cmpfloat(zp_sched_comm_bytes(t, ZP_GROUP_TPEP), ==, 51072);
        zp_sched_free(t);
    }
    g_unlink(path);
    g_free(path);
    zp_sched_free(s);
    /* EP 1 at TP 2 (the tensor group), TP 1 at EP 4 over a pipeline (the EP group), TP 2 x EP 2
     * over a pipeline (the 2 tensor ranks of 2 dp ranks, mp P = 4 apart: runs, one run placed
     * under tp-dp-pp), and that under tp-pp-dp refused, naming the field */
    const struct {
        int mp, dp, pp, ep, ranks, stride, run, run_stride, placed_stride;
        ZpRankOrder order;
    } shapes[] = {{2, 4, 1, 1, 2, 1, 2, 2, 1, ZP_ORDER_TP_DP_PP},
                  {1, 4, 2, 4, 4, 2, 4, 8, 1, ZP_ORDER_TP_DP_PP},
                  {2, 2, 2, 2, 4, 1, 2, 4, 1, ZP_ORDER_TP_DP_PP},
                  {2, 2, 2, 2, 0, 0, 0, 0, 0, ZP_ORDER_TP_PP_DP}};
    for (size_t k = 0; k < G_N_ELEMENTS(shapes); k++) {
        ZpPlan q;
        zp_plan_defaults(&q, 1, shapes[k].dp, shapes[k].mp);
        q.impl = ZP_IMPL_MEGATRON, q.precision = ZP_PREC_BF16, q.micro_batch = 2;
        q.sequence_parallel = shapes[k].mp > 1, q.grad_accum = 4;
        q.pipe.stages = shapes[k].pp, q.rank_order = shapes[k].order;
        q.experts.ep = shapes[k].ep, q.experts.dispatcher = ZP_DISPATCH_ALLGATHER;
        zp_impl_plan_defaults(&q);
        s = zp_sched_build(&m, &q, &error);
        if (shapes[k].ranks == 0) {
            g_assert_null(s);
            /* Megatron itself asserts ETP x EP = TP there (zp_plan_etp_check) */
            g_assert_nonnull(strstr(error->message, "experts.etp: Megatron-Core under the "
                                                    "tp-pp-dp order (--use-tp-pp-dp-mapping) "
                                                    "with a pipeline of 2 stages needs ETP x EP "
                                                    "= TP"));
            g_clear_error(&error);
            continue;
        }
        g_assert_no_error(error);
        zp_sched_groups(s, groups);
        const ZpCommGroup *tpep = &groups[ZP_GROUP_TPEP];
        g_assert_cmpint(tpep->ranks, ==, shapes[k].ranks);
        g_assert_cmpint(tpep->stride, ==, shapes[k].stride);
        g_assert_cmpint(zp_group_run(tpep), ==, shapes[k].run);
        g_assert_cmpint(zp_group_run_stride(tpep), ==, shapes[k].run_stride);
        const ZpCommGroup placed = zp_sched_placed_group(s, tpep);
        g_assert_cmpint(zp_group_run(&placed), ==, shapes[k].ranks); /* one run */
        g_assert_cmpint(placed.stride, ==, shapes[k].placed_stride);
        g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_TPEP), >, 0);
        zp_sched_free(s);
    }
    p.impl = ZP_IMPL_DEEPSPEED;
    g_assert_null(zp_sched_build(&m, &p, &error));
    g_assert_nonnull(strstr(error->message, "allgather is Megatron-Core's dispatcher"));
    g_clear_error(&error);
}

/* Whole experts on each tensor rank (Megatron-Core's --expert-tensor-parallel-size 1) on the
 * 2-layer MoE (h 64, E 4, top 2, f_e 32) at mp 2, dp 2 under sequence parallelism, micro-batch
 * 2, by hand:
 * - the expert grid is EP x (mp dp / EP) over the stage's 4 ranks: at EP 4 the EP group is all
 *   4 consecutive ranks (across the tensor ranks), the expert-data-parallel group one rank;
 *   at EP 2, 2 consecutive ranks and 2 ranks 2 apart;
 * - each rank routes its T = 16 tokens, dispatches R = 32 copies (4,096 bytes) and its experts,
 *   whole (3 x 64 x 32 = 6,144 elements each, not halved), compute those 32 tokens: 2 x 32 x
 *   (64 x 64 + 32 x 64) = 393,216 FLOPs, with no gather over the tensor group and the block
 *   keeping the attention's sum alone;
 * - E / EP experts a rank: 6,144 elements a sparse unit at EP 4, 12,288 at EP 2; their model
 *   states move from the split experts' (EP 2) as the closed form's do (zp_ep_model_states over
 *   zp_plan_edp ranks; Megatron's dense bucket padding, which it leaves out, cancels);
 * - the plan's JSON carries "etp": 1 and reads back; over a pipeline the groups (below). */
static void test_whole_experts(void)
{
    ZpModel m;
    tu_small_moe(&m);
    for (int ep = 2; ep <= 4; ep *= 2) {
        ZpPlan p;
        zp_plan_defaults(&p, 1, 2, 2);
        p.impl = ZP_IMPL_MEGATRON, p.precision = ZP_PREC_BF16, p.micro_batch = 2;
        p.sequence_parallel = TRUE;
        p.experts.ep = ep, p.experts.etp = 1;
        zp_impl_plan_defaults(&p);
        g_assert_cmpint(zp_plan_edp(&p), ==, 4 / ep);
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
        zp_sched_groups(s, groups);
        g_assert_cmpint(groups[ZP_GROUP_EP].ranks, ==, ep);
        g_assert_cmpint(groups[ZP_GROUP_EP].stride, ==, 1);
        g_assert_cmpint(groups[ZP_GROUP_EDP].ranks, ==, 4 / ep);
        g_assert_cmpint(groups[ZP_GROUP_EDP].stride, ==, ep);
        const guint experts = expert_fwd_ops(s, 393216);
        const guint a2a = sparse_colls(s, TRUE, 0, 0, 4096);
        /* the attention's sums alone: no expert gather over TP (b s h e = 4,096 bytes each) */
        const guint sums = sparse_colls(s, FALSE, ZP_GROUP_TP, ZP_COLL_REDUCE_SCATTER, 4096);
        g_assert_cmpuint(sparse_colls(s, FALSE, ZP_GROUP_TP, ZP_COLL_ALLGATHER, 4096), ==, sums);
        g_assert_cmpuint(sparse_colls(s, FALSE, ZP_GROUP_TP, ZP_COLL_ALLREDUCE, 0), ==, 0);
        g_assert_cmpuint(experts, ==, 2);
        g_assert_cmpuint(a2a, ==, 8);
        g_assert_cmpuint(sums, ==, 4);
        const ZpSchedExperts x = zp_sched_experts(s);
        g_assert_cmpuint(x.total_elems, ==, 2 * (4 / ep) * 6144);
        const ZpStateBytes sb = zp_impl_state_bytes(&s->plan);
        const ZpEpStates want = zp_ep_model_states(&m, &s->plan, 1, sb);
        g_assert_cmpfloat(want.expert_params, ==, 2 * (4 / ep) * 6144);
        /* Megatron pads its dense buckets, which the closed form does not: against the same
         * plan with experts split over TP at EP 2 (the dense part the same), the schedule's
         * states move by what the closed form's do */
        ZpPlan split = p;
        split.experts.etp = 0, split.experts.ep = 2;
        ZpSchedule *t = zp_sched_build(&m, &split, &error);
        g_assert_no_error(error);
        const ZpEpStates base = zp_ep_model_states(&m, &t->plan, 1, sb);
        g_test_message("EP %d: states %.0f (split at EP 2: %.0f), closed form %.0f (%.0f)", ep,
                       zp_sched_model_state_bytes(s), zp_sched_model_state_bytes(t),
                       want.total.total_bytes, base.total.total_bytes);
        g_assert_cmpfloat(zp_sched_model_state_bytes(s) - zp_sched_model_state_bytes(t), ==,
                          want.total.total_bytes - base.total.total_bytes);
        /* EP 2: each rank's 2 experts whole, twice the split ones' states; EP 4: one whole
         * expert, what 2 split ones hold */
        g_assert_cmpint(want.total.total_bytes > base.total.total_bytes, ==, ep == 2);
        zp_sched_free(t);
        json_t *plan = zp_plan_to_json(&s->plan);
        g_assert_cmpint(json_integer_value(json_object_get(json_object_get(plan, "experts"),
                                                           "etp")), ==, 1);
        ZpPlan back;
        zp_plan_defaults(&back, 0, 1, 1);
        g_assert_true(zp_plan_from_json(plan, "plan", &back, &error));
        g_assert_no_error(error);
        g_assert_cmpint(back.experts.etp, ==, 1);
        json_decref(plan);
        zp_sched_free(s);
    }
    /* EP 1 with whole experts: the all-gather dispatcher's group is one rank, nothing sent */
    ZpPlan one;
    zp_plan_defaults(&one, 1, 2, 2);
    one.impl = ZP_IMPL_MEGATRON, one.precision = ZP_PREC_BF16, one.micro_batch = 2;
    one.sequence_parallel = TRUE, one.experts.etp = 1;
    one.experts.dispatcher = ZP_DISPATCH_ALLGATHER;
    zp_impl_plan_defaults(&one);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &one, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_TPEP), ==, 0);
    for (guint i = 0; i < s->ops->len; i++)
        g_assert_true(zp_sched_op(s, i)->group != ZP_GROUP_TPEP ||
                      zp_sched_op(s, i)->kind != ZP_OP_COLLECTIVE);
    zp_sched_free(s);
    /* Over a pipeline of 2 (mp 2 x pp 2 x dp 2, a dp rank mp P = 4 apart): EP 2, the tensor
     * group, and the dp ranks; EP 4, the tensor ranks of both dp ranks (runs of 2, 4 apart)
     * and one rank; at mp 4 x dp 2 (8 apart), EP 2 inside the tensor group and the ranks 2
     * apart in the tensor groups of both dp ranks (runs of 2, 8 apart); without a pipeline
     * DeepSpeed's whole experts as Megatron's (its default), and its split ones
     * (enable_expert_tensor_parallelism) EP 2 over the dp ranks, mp apart, as Megatron's; EP 4
     * under tp-pp-dp, the paper's whole experts and an ETP other than 1 and mp refused, naming
     * the field. */
    const struct {
        int pp, mp, ep, etp;
        ZpImplKind impl;
        ZpRankOrder order;
        ZpCommGroup ep_group, edp_group;
        const char *says; /* NULL: built */
    } shapes[] = {
        {2, 2, 2, 1, ZP_IMPL_MEGATRON, ZP_ORDER_TP_DP_PP, {"", 2, 1, 0, 0}, {"", 2, 4, 0, 0}, NULL},
        {2, 2, 2, 1, ZP_IMPL_MEGATRON, ZP_ORDER_TP_PP_DP, {"", 2, 1, 0, 0}, {"", 2, 4, 0, 0}, NULL},
        {2, 2, 4, 1, ZP_IMPL_MEGATRON, ZP_ORDER_TP_DP_PP, {"", 4, 1, 2, 4}, {"", 1, 8, 0, 0}, NULL},
        {2, 4, 2, 1, ZP_IMPL_MEGATRON, ZP_ORDER_TP_DP_PP, {"", 2, 1, 0, 0}, {"", 4, 2, 2, 8}, NULL},
        {2, 2, 4, 1, ZP_IMPL_MEGATRON, ZP_ORDER_TP_PP_DP, {"", 0, 0, 0, 0}, {"", 0, 0, 0, 0},
         "experts.etp: Megatron-Core under the tp-pp-dp order (--use-tp-pp-dp-mapping) with a "
         "pipeline of 2 stages needs ETP x EP = TP"},
        {2, 2, 4, 1, ZP_IMPL_DEEPSPEED, ZP_ORDER_TP_PP_DP, {"", 0, 0, 0, 0}, {"", 0, 0, 0, 0},
         "experts.etp: whole experts (1) with a pipeline of 2 stages and EP 4 over TP 2 under "
         "the tp-pp-dp order"},
        {1, 2, 4, 1, ZP_IMPL_DEEPSPEED, ZP_ORDER_TP_DP_PP, {"", 4, 1, 0, 0}, {"", 1, 4, 0, 0},
         NULL},
        {1, 2, 2, 2, ZP_IMPL_DEEPSPEED, ZP_ORDER_TP_DP_PP, {"", 2, 2, 0, 0}, {"", 1, 4, 0, 0},
         NULL},
        {1, 2, 4, 1, ZP_IMPL_PAPER, ZP_ORDER_TP_DP_PP, {"", 0, 0, 0, 0}, {"", 0, 0, 0, 0},
         "experts.etp: 1 is Megatron-Core's"},
        {1, 2, 2, 3, ZP_IMPL_MEGATRON, ZP_ORDER_TP_DP_PP, {"", 0, 0, 0, 0}, {"", 0, 0, 0, 0},
         "experts.etp: 3: experts split over the TP degree (2)"},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(shapes); k++) {
        ZpPlan q;
        zp_plan_defaults(&q, 1, shapes[k].pp == 1 ? 2 : 1, shapes[k].mp);
        q.impl = shapes[k].impl, q.precision = ZP_PREC_BF16, q.micro_batch = 2;
        q.sequence_parallel = shapes[k].impl == ZP_IMPL_MEGATRON, q.grad_accum = 4;
        q.pipe.stages = shapes[k].pp, q.rank_order = shapes[k].order;
        q.experts.ep = shapes[k].ep, q.experts.etp = shapes[k].etp;
        if (shapes[k].pp > 1) /* mp x pp 2 x dp 2 */
            q.dp = 2;
        zp_impl_plan_defaults(&q);
        s = zp_sched_build(&m, &q, &error);
        if (shapes[k].says) {
            g_assert_null(s);
            g_test_message("%s", error->message);
            g_assert_nonnull(strstr(error->message, shapes[k].says));
            g_clear_error(&error);
            continue;
        }
        g_assert_no_error(error);
        ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
        zp_sched_groups(s, groups);
        for (int g = ZP_GROUP_EP; g <= ZP_GROUP_EDP; g++) {
            const ZpCommGroup *want = g == ZP_GROUP_EP ? &shapes[k].ep_group
                                                       : &shapes[k].edp_group;
            g_assert_cmpint(groups[g].ranks, ==, want->ranks);
            g_assert_cmpint(groups[g].stride, ==, want->stride);
            g_assert_cmpint(zp_group_run(&groups[g]), ==, zp_group_run(want));
            g_assert_cmpint(zp_group_run_stride(&groups[g]), ==, zp_group_run_stride(want));
            g_assert_true(zp_group_tiles(&groups[g], s->world));
        }
        zp_sched_free(s);
    }
}

/* s's schedule file (holding `holds`, where not NULL) reads back by both readers with s's
 * communicators. */
static void assert_file_groups(const ZpSchedule *s, const char *holds)
{
    GError *error = NULL;
    char *dir = NULL;
    char *path = tu_tmp_file("groups", "sched.json", &dir);
    g_assert_true(zp_sched_write_json(s, path, &error));
    char *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
    g_assert_true(!holds || strstr(text, holds));
    g_free(text);
    for (int graph = 0; graph < 2; graph++) {
        ZpSchedule *t =
            graph ? zp_sched_read_graph(path, &error) : zp_sched_read_json(path, &error);
        g_assert_no_error(error);
        tu_assert_same_groups(s, t);
        zp_sched_free(t);
    }
    tu_tmp_file_remove(path, dir);
}

/* Megatron's expert groups under a pipeline, runs of zplan's ranks (zp_sched_graph.h), on the
 * 2-layer MoE at mp 2 x pp 2 x dp 2 on 8-GPU nodes: whole experts at EP 4 (the tensor ranks of
 * both dp ranks) under either dispatcher, and the all-gather dispatcher's TP x EP at EP 2.
 * Each simulated folded (a rank a stage) equals every rank simulated (--explicit, which walks
 * the groups' members), step, peak, bytes and dispatcher time; a runs group is costed as its
 * placement says: a graph's all-reduce over the runs {0, 1, 8, 9} of 16 ranks takes what one
 * over {0, 4, 8, 12} takes (both: 2 nodes, 4 groups on a node), and one over {0, 1, 2, 3}
 * less; and the schedule file writes the runs and reads them back, refusing a bad run, and
 * whole experts' edp at EP 1 (all of a stage's ranks) too. */
static void check_folded_is_explicit(const ZpModel *m, const ZpPlan *p, const ZpHw *hw,
                                     int folded_ranks)
{
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, p, &error);
    g_assert_no_error(error);
    SimResult *r[2];
    for (int e = 0; e < 2; e++) {
        const SimOptions options = {.mode = e ? SIM_MODE_EXPLICIT : SIM_MODE_FOLDED};
        r[e] = sim_engine_run(s, hw, &options, &error);
        g_assert_no_error(error);
    }
    g_assert_cmpint(r[0]->ranks_simulated, ==, folded_ranks);
    g_assert_cmpint(r[1]->ranks_simulated, ==, s->world);
    g_assert_cmpfloat(r[0]->step_time_s, ==, r[1]->step_time_s);
    g_assert_cmpfloat(r[0]->peak_memory_bytes, ==, r[1]->peak_memory_bytes);
    g_assert_cmpfloat(r[0]->alltoall_s, ==, r[1]->alltoall_s);
    g_assert_cmpfloat(r[0]->alltoall_s, >, 0);
    for (int g = 0; g < ZP_SCHED_MAX_GROUPS; g++)
        g_assert_cmpfloat(r[0]->comm_bytes[g], ==, r[1]->comm_bytes[g]);
    sim_result_free(r[0]);
    sim_result_free(r[1]);
    zp_sched_free(s);
}

static double graph_step_s(const char *group, const ZpHw *hw)
{
    char *dir = NULL;
    char *path = tu_tmp_file("runs", "graph.json", &dir);
    char *text = g_strdup_printf(
        "{\"format\": \"zplan-schedule-1\", \"world\": 16, \"groups\": ["
        "{\"name\": \"dp\", \"ranks\": 16, \"stride\": 1}, "
        "{\"name\": \"tp\", \"ranks\": 1, \"stride\": 1}, %s], \"precision\": \"bf16\", "
        "\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1e12, "
        "\"deps\": []}, {\"kind\": \"collective\", \"op\": \"allreduce\", \"group\": "
        "\"x\", \"bytes\": 64e6, \"deps\": [0]}]}",
        group);
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    g_free(text);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_graph(path, &error);
    double step_s = -1;
    if (s) {
        SimResult *r[2];
        for (int e = 0; e < 2; e++) {
            const SimOptions options = {.mode = e ? SIM_MODE_EXPLICIT : SIM_MODE_FOLDED};
            r[e] = sim_engine_run(s, hw, &options, &error);
            g_assert_no_error(error);
        }
        g_assert_cmpfloat(r[0]->step_time_s, ==, r[1]->step_time_s);
        step_s = r[0]->step_time_s;
        sim_result_free(r[0]);
        sim_result_free(r[1]);
        zp_sched_free(s);
    } else {
        g_test_message("%s", error->message);
        g_assert_nonnull(strstr(error->message, "groups[2]"));
        g_clear_error(&error);
    }
    tu_tmp_file_remove(path, dir);
    return step_s;
}

static void test_expert_runs(void)
{
    ZpModel m;
    tu_small_moe(&m);
    const ZpHw hw = tu_load_hw("dgx-h100");
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 2);
    p.impl = ZP_IMPL_MEGATRON, p.precision = ZP_PREC_BF16, p.micro_batch = 2;
    p.sequence_parallel = TRUE, p.grad_accum = 4, p.pipe.stages = 2;
    p.experts.ep = 4, p.experts.etp = 1;
    zp_impl_plan_defaults(&p);
    check_folded_is_explicit(&m, &p, &hw, 2);
    p.experts.dispatcher = ZP_DISPATCH_ALLGATHER;
    check_folded_is_explicit(&m, &p, &hw, 2);
    p.experts.ep = 2, p.experts.etp = 0;
    check_folded_is_explicit(&m, &p, &hw, 2);
    /* the file: runs written and read back, by both readers */
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    assert_file_groups(s, "\"run_stride\": 4");
    zp_sched_free(s);
    /* whole experts at EP 1 (all of a stage's tensor and dp ranks hold every expert): edp is
     * written, where the reader once took all of dp for it (Mixtral, 16 H100s, TP 2: the
     * plan 0.8664 s, its file read back 1.4393 s) */
    zp_plan_defaults(&p, 1, 2, 2);
    p.impl = ZP_IMPL_MEGATRON, p.precision = ZP_PREC_BF16, p.micro_batch = 2;
    p.sequence_parallel = TRUE, p.experts.etp = 1;
    zp_impl_plan_defaults(&p);
    s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    assert_file_groups(s, "\"edp\"");
    zp_sched_free(s);
    /* costed by placement */
    const double runs_s =
        graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 1, \"run\": 2, "
                     "\"run_stride\": 8}", &hw);
    const double apart_s = graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 4}", &hw);
    const double node_s = graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 1}", &hw);
    g_assert_cmpfloat(runs_s, >, 0);
    g_assert_cmpfloat(runs_s, ==, apart_s);
    g_assert_cmpfloat(node_s, <, runs_s);
    /* refused: run 3 not dividing 4, a run of 4 (all: leave it out), runs overlapping,
     * run_stride without run */
    g_assert_cmpfloat(graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 1, "
                                   "\"run\": 3, \"run_stride\": 8}", &hw), ==, -1);
    g_assert_cmpfloat(graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 1, "
                                   "\"run\": 4, \"run_stride\": 8}", &hw), ==, -1);
    g_assert_cmpfloat(graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 1, "
                                   "\"run\": 2, \"run_stride\": 1}", &hw), ==, -1);
    g_assert_cmpfloat(graph_step_s("{\"name\": \"x\", \"ranks\": 4, \"stride\": 1, "
                                   "\"run_stride\": 8}", &hw), ==, -1);
}

/* DeepSpeed's mixture of experts over TP 2 (deepspeed.moe.layer.MoE's defaults: whole
 * experts, enable_expert_tensor_parallelism False; EP groups of consecutive ranks across the
 * tensor ranks, groups._create_expert_and_data_parallel without mp_size; sharded_moe.py
 * MOELayer.forward drops the tensor ranks' duplicate tokens before the all-to-all and
 * all-gathers the combined slots over TP after it) on the 2-layer MoE (h 64, E 4, top 2,
 * f_e 32, both layers sparse) at mp 2 x dp 2, EP 4, micro-batch 2, capacity factor 1, by hand:
 * - every tensor rank routes the whole T = 32 tokens: capacity ceil(32 x 2 / 4) = 16 slots an
 *   expert, of which a rank keeps 8: R = 4 x 8 = 32 slots, each all-to-all 32 x 64 x 2 = 4,096
 *   bytes (at TP 1, dp 4: all 64, 8,192);
 * - the combined slots all-gathered over TP after the combine's all-to-all, and backward the
 *   dispatched slots' gradients after the dispatch's: 2 x 4,096 = 8,192 bytes, 2 a sparse
 *   block, 4 in all; the block keeps the attention's all-reduce alone (the experts' outputs
 *   come back whole): 1 forward, 1 backward;
 * - whole experts on the 32 slots: 2 x 32 x (64 x 64 + 32 x 64) = 393,216 FLOPs an expert op,
 *   the rank's one expert of each layer whole, 2 x 6,144 = 12,288 expert elements, its
 *   expert-data-parallel group 1 rank; the schedule file reads back;
 * - folded (one rank) equals every rank simulated; simulate says DeepSpeed's default in its
 *   Defaults line; and refuses what it does not model, naming the key: sequence parallelism
 *   (nothing duplicate to drop), slots TP does not divide; a dense model under DeepSpeed
 *   refuses none of that. */
static void test_deepspeed_whole_experts(void)
{
    ZpModel m;
    tu_small_moe(&m);
    const ZpHw hw = tu_load_hw("dgx-h100");
    for (int t = 1; t <= 2; t++) {
        ZpPlan p;
        zp_plan_defaults(&p, 1, 4 / t, t);
        p.precision = ZP_PREC_BF16, p.micro_batch = 2;
        p.experts.ep = 4, p.experts.capacity_factor = 1;
        zp_impl_plan_defaults(&p);
        g_assert_cmpint(zp_plan_etp(&p), ==, 1);
        g_assert_cmpint(zp_ep_tp_drop(&p), ==, t);
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        g_assert_cmpuint(expert_fwd_ops(s, 393216.0 * 2 / t), ==, 2);
        const guint a2a = sparse_colls(s, TRUE, 0, 0, 8192.0 / t);
        const guint regathers = sparse_colls(s, FALSE, ZP_GROUP_TP, ZP_COLL_ALLGATHER, 8192);
        const guint sums = sparse_colls(s, FALSE, ZP_GROUP_TP, ZP_COLL_ALLREDUCE, 0);
        g_test_message("TP %d: %u all-to-alls, %u all-gathers of the slots, %u block sums", t,
                       a2a, regathers, sums);
        g_assert_cmpuint(a2a, ==, 8);
        g_assert_cmpuint(regathers, ==, t == 2 ? 4 : 0);
        g_assert_cmpuint(sums, ==, t == 2 ? 4 : 0);
        g_assert_cmpuint(zp_sched_experts(s).total_elems, ==, 12288);
        ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
        zp_sched_groups(s, groups);
        g_assert_cmpint(groups[ZP_GROUP_EP].ranks, ==, 4);
        g_assert_cmpint(groups[ZP_GROUP_EP].stride, ==, 1);
        g_assert_cmpint(groups[ZP_GROUP_EDP].ranks, ==, 1);
        assert_file_groups(s, NULL); /* its ops checked against the plan's too */
        zp_sched_free(s);
        check_folded_is_explicit(&m, &p, &hw, 1);
    }
    /* A dense model lays no experts out: DeepSpeed's default ETP of 1 refuses nothing of it,
     * here over TP 2 x a pipeline of 2 under tp-pp-dp (it once refused every such plan) */
    ZpModel dense = m;
    dense.moe = (ZpMoe){0};
    ZpPlan q;
    zp_plan_defaults(&q, 1, 2, 2);
    q.pipe.stages = 2, q.grad_accum = 2, q.rank_order = ZP_ORDER_TP_PP_DP;
    zp_impl_plan_defaults(&q);
    g_assert_true(zp_plan_etp_check(&q, FALSE, "--expert-tp", NULL));
    g_assert_false(zp_plan_etp_check(&q, TRUE, "--expert-tp", NULL));
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&dense, &q, &error);
    g_assert_no_error(error);
    zp_sched_free(s);
    const char *common = "simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 16 --mp 2 "
                         "--ep 8 --stage 1 --micro-batch 1 --precision bf16";
    char *args = g_strdup_printf("%s --seq 512", common);
    TuRun run = tu_zplan(args);
    g_assert_cmpint(run.status, ==, 0);
    g_assert_nonnull(strstr(run.out, "whole experts on each tensor rank, each rank dispatching "
                                     "1/2 of the slots (DeepSpeed's default)"));
    g_assert_null(strstr(run.out, "which zplan does not model"));
    tu_free(&run);
    g_free(args);
    const struct {
        const char *flags, *says;
    } refused[] = {
        {"--seq 512 --sequence-parallel", "sequence_parallel: DeepSpeed's mixture of experts "
                                          "over TP 2 drops the tensor ranks' duplicate tokens"},
        {"--seq 1004 --capacity-factor 1", "capacity_factor: 1 gives each expert 251 slots"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(refused); i++) {
        args = g_strdup_printf("%s %s", common, refused[i].flags);
        tu_zplan_refused(args, refused[i].says);
        g_free(args);
    }
}

/* DeepSpeed's experts split over TP (deepspeed.moe.layer.MoE enable_expert_tensor_parallelism:
 * groups._create_expert_data_and_model_parallel takes EP from each tensor rank's data-parallel
 * ranks; sharded_moe.py MOELayer.forward still drops the tensor ranks' duplicate slots before
 * the all-to-all, gathers them back over TP before the experts and drops them again after;
 * Megatron-DeepSpeed's expert MLP all-reduces its row-parallel outputs) on the 2-layer MoE at
 * mp 2 x dp 2, EP 2, micro-batch 2, capacity factor 1, by hand:
 * - as whole experts, 16 slots an expert of which a rank dispatches 8: R = 32 slots, each
 *   all-to-all 4,096 bytes; the two tensor ranks' 32 gathered before the experts, 64 x 64 x 2
 *   = 8,192 bytes, and after them summed by an all-reduce of as many (forward fc2's output,
 *   backward fc1's input gradient), with the combined slots' regather of 8,192 after each
 *   combine: 4 all-gathers and 2 all-reduces of 8,192 a sparse block; the block keeps the
 *   attention's all-reduce of b s h = 4,096 bytes alone (the experts' outputs come back whole);
 * - the rank's E / EP = 2 experts split 2 ways (f_e / t = 16) over t R = 64 slots:
 *   2 x 64 x (64 x 32 + 16 x 64) = 393,216 FLOPs an expert op, 2 x 2 x 3 x 64 x 16 = 12,288
 *   expert elements; the saved expert activations 64 x (64 + 3 x 16) x 2 = 14,336 bytes and
 *   the dispatch's buffers (32 + 32 + 64) x 64 x 2 = 16,384;
 * - EP over the dp ranks, mp apart; one expert-data-parallel rank; the file reads back; folded
 *   equals every rank; and simulate takes --expert-tp 2 (the default note gone), refusing EP
 *   that does not divide the data-parallel degree, naming the flag. */
static void test_deepspeed_split_experts(void)
{
    ZpModel m;
    tu_small_moe(&m);
    const ZpHw hw = tu_load_hw("dgx-h100");
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 2);
    p.precision = ZP_PREC_BF16, p.micro_batch = 2;
    p.experts.ep = 2, p.experts.capacity_factor = 1, p.experts.etp = 2;
    zp_impl_plan_defaults(&p);
    g_assert_cmpint(zp_ep_tp_drop(&p), ==, 2);
    g_assert_cmpint(zp_ep_tp_gather(&p), ==, 2);
    g_assert_cmpint(zp_ep_tp_gather_back(&p), ==, ZP_COLL_ALLREDUCE);
    g_assert_false(zp_ep_sparse_mlp_sums(&m, &p));
    const ZpEpActivations a = zp_ep_activations(&m, &p);
    g_assert_cmpfloat(a.received_tokens, ==, 32);
    g_assert_cmpfloat(a.expert_tokens, ==, 64);
    g_assert_cmpfloat(a.expert_act_bytes, ==, 14336);
    g_assert_cmpfloat(a.dispatch_bytes, ==, 16384);
    g_assert_cmpfloat(a.regathered_bytes, ==, 8192);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(expert_fwd_ops(s, 393216.0), ==, 2);
    g_assert_cmpuint(sparse_colls(s, TRUE, 0, 0, 4096), ==, 8);
    g_assert_cmpuint(sparse_colls(s, FALSE, ZP_GROUP_TP, ZP_COLL_ALLGATHER, 8192), ==, 8);
    guint sums[2] = {0, 0}; /* the tensor group's all-reduces: the blocks', the experts' */
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_TP &&
            op->sub == ZP_COLL_ALLREDUCE && op->unit >= 1 && op->unit <= 2) {
            g_assert_true(op->bytes == 4096 || op->bytes == 8192);
            sums[op->bytes == 8192]++;
        }
    }
    g_assert_cmpuint(sums[0], ==, 4);
    g_assert_cmpuint(sums[1], ==, 4);
    g_assert_cmpuint(zp_sched_experts(s).total_elems, ==, 12288);
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    zp_sched_groups(s, groups);
    g_assert_cmpint(groups[ZP_GROUP_EP].ranks, ==, 2);
    g_assert_cmpint(groups[ZP_GROUP_EP].stride, ==, 2);
    g_assert_cmpint(groups[ZP_GROUP_EDP].ranks, ==, 1);
    assert_file_groups(s, NULL);
    zp_sched_free(s);
    check_folded_is_explicit(&m, &p, &hw, 1);
    const char *common = "simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 16 "
                         "--stage 1 --micro-batch 1 --precision bf16 --seq 512";
    char *args = g_strdup_printf("%s --mp 2 --ep 8 --expert-tp 2", common);
    TuRun run = tu_zplan(args);
    g_assert_cmpint(run.status, ==, 0);
    g_assert_null(strstr(run.out, "DeepSpeed's default"));
    tu_free(&run);
    g_free(args);
    args = g_strdup_printf("%s --mp 4 --ep 8 --expert-tp 4", common);
    tu_zplan_refused(args, "--ep: 8 does not divide the data-parallel degree 4");
    g_free(args);
}

/* Folded equals stepped (--no-fold) for Megatron's all-gather dispatcher over a pipeline,
 * every field but the event counts and the fold's note: Mixtral interleaved pp 4 (v 4), whose
 * jump by each rank's own step (SimFold.own_steps) once left the middle stages' bubble 2.2e-5 s
 * short (found by random testing), and 1F1B pp 4, whose two-snapshot jump still folds. */
static void test_allgather_fold_exact(void)
{
    const char *base = "simulate --model hf/mixtral-8x7b --cluster h200 --impl megatron --gpus 16 "
                       "--stage 1 --micro-batch 2 --mp 2 --pp 4 --grad-accum 16 "
                       "--moe-dispatcher allgather --capacity-factor 2 --seq 512 --json";
    const char *schedules[] = {"--pp-schedule interleaved --virtual-stages 4",
                               "--pp-schedule 1f1b"};
    for (size_t i = 0; i < G_N_ELEMENTS(schedules); i++) {
        json_t *run[2];
        for (int stepped = 0; stepped < 2; stepped++) {
            char *args = g_strdup_printf("%s %s%s", base, schedules[i],
                                         stepped ? " --no-fold" : "");
            run[stepped] = tu_zplan_json(args);
            g_free(args);
        }
        const char *note = json_string_value(json_object_get(json_object_get(run[0], "fold"),
                                                             "note"));
        g_test_message("%s: %s", schedules[i], note);
        g_assert_true(i == 0 || g_str_has_prefix(note, "folded"));
        for (int k = 0; k < 2; k++) {
            json_object_del(run[k], "op_events");
            json_object_del(run[k], "heap_events");
            json_object_del(run[k], "fold");
        }
        g_assert_true(json_equal(run[0], run[1]));
        json_decref(run[0]);
        json_decref(run[1]);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/moe-dispatch/sequence-parallel-experts", test_sequence_parallel_experts);
    g_test_add_func("/moe-dispatch/allgather-dispatcher", test_allgather_dispatcher);
    g_test_add_func("/moe-dispatch/whole-experts", test_whole_experts);
    g_test_add_func("/moe-dispatch/expert-runs", test_expert_runs);
    g_test_add_func("/moe-dispatch/deepspeed-whole-experts", test_deepspeed_whole_experts);
    g_test_add_func("/moe-dispatch/deepspeed-split-experts", test_deepspeed_split_experts);
    g_test_add_func("/moe-dispatch/allgather-fold-exact", test_allgather_fold_exact);
    return g_test_run();
}
