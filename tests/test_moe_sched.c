/* test_moe_sched: a mixture of experts in the schedule and the simulator — the EP group's
 * all-to-all ops (ep_dispatch, ep_combine), the expert and unpermute compute ops, their JSON form. */
#include "cli.h"
#include "sim_engine.h"
#include "zp_moe_search.h"
#include "testutil.h"
#include "zp_cost.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_inventory.h"
#include "zp_sched.h"
#include "zp_schedcheck.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

static char *write_text(const char *text)
{
    char *path = NULL;
    const int fd = g_file_open_tmp("zp-moe-XXXXXX.json", &path, NULL);
    g_assert_cmpint(fd, >=, 0);
    close(fd);
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    return path;
}

/* A graph file's sparse block: dense part, dispatch over ep, experts, combine, unpermute; the
 * names read back as the enums, the all-to-alls on the compute stream by default, the ep and
 * edp groups placed as zp_sched_groups places them (EP consecutive dp ranks). */
static const char *graph_json =
    "{\"format\": \"zplan-schedule-1\", \"world\": 8,"
    " \"groups\": [{\"name\": \"dp\", \"ranks\": 8, \"stride\": 1},"
    "  {\"name\": \"tp\", \"ranks\": 1, \"stride\": 1},"
    "  {\"name\": \"ep\", \"ranks\": 4, \"stride\": 1},"
    "  {\"name\": \"edp\", \"ranks\": 2, \"stride\": 4}],"
    " \"state_bytes\": {\"ep_buffers\": 4096},"
    " \"ops\": ["
    "  {\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1e9, \"deps\": []},"
    "  {\"kind\": \"collective\", \"op\": \"ep_dispatch\", \"group\": \"ep\", \"bytes\": 8192,"
    "   \"unit\": 1, \"elems\": 4096, \"deps\": [0]},"
    "  {\"kind\": \"compute\", \"op\": \"expert_fwd\", \"flops\": 2e9, \"deps\": [1]},"
    "  {\"kind\": \"collective\", \"op\": \"ep_combine\", \"group\": \"ep\", \"bytes\": 8192,"
    "   \"deps\": [2]},"
    "  {\"kind\": \"compute\", \"op\": \"unpermute_fwd\", \"flops\": 0, \"mem_bytes\": 1e6,"
    "   \"deps\": [3]},"
    "  {\"kind\": \"compute\", \"op\": \"unpermute_bwd\", \"flops\": 0, \"deps\": [4]},"
    "  {\"kind\": \"compute\", \"op\": \"expert_bwd\", \"flops\": 4e9, \"deps\": [5]},"
    "  {\"kind\": \"collective\", \"op\": \"allreduce\", \"group\": \"edp\", \"bytes\": 64,"
    "   \"deps\": [6]}]}";

static void test_graph_names(void)
{
    char *path = write_text(graph_json);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(s->ops->len, ==, 8);
    static const struct {
        int kind, sub;
    } want[] = {{ZP_OP_COMPUTE, ZP_COMP_BLOCK_FWD},     {ZP_OP_COLLECTIVE, ZP_COLL_EP_DISPATCH},
                {ZP_OP_COMPUTE, ZP_COMP_EXPERT_FWD},    {ZP_OP_COLLECTIVE, ZP_COLL_EP_COMBINE},
                {ZP_OP_COMPUTE, ZP_COMP_UNPERMUTE_FWD}, {ZP_OP_COMPUTE, ZP_COMP_UNPERMUTE_BWD},
                {ZP_OP_COMPUTE, ZP_COMP_EXPERT_BWD},    {ZP_OP_COLLECTIVE, ZP_COLL_ALLREDUCE}};
    for (guint i = 0; i < s->ops->len; i++) {
        g_assert_cmpint(zp_sched_op(s, i)->kind, ==, want[i].kind);
        g_assert_cmpint(zp_sched_op(s, i)->sub, ==, want[i].sub);
    }
    /* Dispatch and combine run between the layer's kernels, on the compute stream. */
    g_assert_cmpint(zp_sched_op(s, 1)->stream, ==, ZP_STREAM_COMPUTE);
    g_assert_cmpint(zp_sched_op(s, 3)->stream, ==, ZP_STREAM_COMPUTE);
    g_assert_cmpint(zp_sched_op(s, 7)->stream, ==, ZP_STREAM_DP);
    g_assert_cmpint(zp_sched_op(s, 1)->group, ==, ZP_GROUP_EP);
    g_assert_cmpint(zp_sched_op(s, 7)->group, ==, ZP_GROUP_EDP);
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_EP_BUFFERS], ==, 4096);
    g_assert_cmpstr(zp_sched_coll_name(ZP_COLL_EP_DISPATCH), ==, "ep_dispatch");
    g_assert_cmpstr(zp_sched_coll_name(ZP_COLL_EP_COMBINE), ==, "ep_combine");
    g_assert_cmpstr(zp_sched_mem_name(ZP_MEM_EP_BUFFERS), ==, "ep_buffers");
    /* (n - 1) / n of each all-to-all's S over the wire: 2 x 3/4 x 8192. */
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EP), ==, 12288);

    /* Written and read again: the same ops and groups. */
    char *again = g_strconcat(path, ".out.json", NULL);
    g_assert_true(zp_sched_write_json(s, again, &error));
    g_assert_no_error(error);
    ZpSchedule *t = zp_sched_read_graph(again, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(t->ops->len, ==, s->ops->len);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *a = zp_sched_op(s, i), *b = zp_sched_op(t, i);
        g_assert_cmpint(a->kind, ==, b->kind);
        g_assert_cmpint(a->sub, ==, b->sub);
        g_assert_cmpint(a->group, ==, b->group);
        g_assert_cmpint(a->stream, ==, b->stream);
        g_assert_cmpfloat(a->bytes, ==, b->bytes);
    }
    ZpCommGroup g[ZP_SCHED_MAX_GROUPS];
    zp_sched_groups(t, g);
    g_assert_cmpint(g[ZP_GROUP_EP].ranks, ==, 4);
    g_assert_cmpint(g[ZP_GROUP_EDP].stride, ==, 4);
    zp_sched_free(t);
    zp_sched_free(s);
    g_unlink(again);
    g_free(again);
    g_unlink(path);
    g_free(path);
}

/* A plan's groups: EP 4 of dp 8 behind tp 2: ep 4 ranks 2 apart, edp 2 ranks 8 apart. */
static void test_plan_groups(void)
{
    ZpSchedule s = {0};
    zp_plan_defaults(&s.plan, 1, 8, 2);
    s.plan.experts.ep = 4;
    s.stages = 1;
    ZpCommGroup g[ZP_SCHED_MAX_GROUPS];
    g_assert_cmpint(zp_sched_groups(&s, g), ==, ZP_GROUP_N);
    g_assert_cmpint(g[ZP_GROUP_EP].ranks, ==, 4);
    g_assert_cmpint(g[ZP_GROUP_EP].stride, ==, 2);
    g_assert_cmpint(g[ZP_GROUP_EDP].ranks, ==, 2);
    g_assert_cmpint(g[ZP_GROUP_EDP].stride, ==, 8);
    g_assert_cmpstr(g[ZP_GROUP_EP].name, ==, "ep");
    g_assert_cmpstr(g[ZP_GROUP_EDP].name, ==, "edp");
}

/* A file's unknown all-to-all name is refused in one line naming the op and key. */
static void test_graph_refusals(void)
{
    char *text = g_strdup(graph_json);
    char *at = strstr(text, "ep_combine");
    memcpy(at, "ep_combin_", 10);
    char *path = write_text(text);
    GError *error = NULL;
    g_assert_null(zp_sched_read_graph(path, &error));
    g_assert_nonnull(error);
    g_assert_nonnull(strstr(error->message, "ops[3]: key \"op\" has unknown value \"ep_combin_\""));
    g_assert_null(strchr(error->message, '\n'));
    g_clear_error(&error);
    g_unlink(path);
    g_free(path);
    g_free(text);
}

static ZpSchedule *build(const ZpModel *m, int impl, int stage, int dp, int ep, int micro,
                         gboolean ckpt)
{
    ZpPlan p;
    zp_plan_defaults(&p, stage, dp, 1);
    p.impl = impl;
    p.precision = ZP_PREC_BF16;
    p.micro_batch = micro;
    p.checkpoint = ckpt;
    p.experts.ep = ep;
    zp_impl_plan_defaults(&p);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* The all-to-alls of the 2-layer MoE at dp 8, micro-batch 2, by hand: T = 2 x 16 = 32 tokens,
 * T k = 64 copies of h = 64 bf16 values, S = 64 x 64 x 2 = 8,192 bytes a call. Four calls a
 * sparse layer (dispatch and combine, forward and backward), six with the recomputed forward:
 * 8 (12) calls, each (EP - 1)/EP of S over the wire: EP 2 32,768 B (49,152), EP 4 49,152 B
 * (73,728), none at EP 1. The experts' forward: 2 x 64 x (64 x 64 + 32 x 64) = 786,432 FLOPs
 * on the busiest rank (R = T k without skew), 1,572,864 with --expert-skew 2. */
/* How the expert gradients of the 2-layer MoE at dp 4, EP 2 are reduced over the
 * expert-data-parallel group (2 ranks), by hand: each sparse unit holds 4 / 2 experts of
 * 3 x 64 x 32 = 6,144 elements, 12,288 a unit, 24,576 (49,152 bf16 bytes) in all.
 * - The paper's stage 0 and 1: each unit's all-reduced in place after its experts' backward.
 * - DeepSpeed's stage 0 (engine.py buffered_allreduce_fallback -> _reduce_expert_gradients):
 *   once the dense bucket is reduced, one flattened copy of all 24,576, all-reduced.
 * - DeepSpeed's stage 1 (grads_in_partition, as at stage 2): each unit's reduce-scattered out
 *   of a bucket of its 24,576 bytes. */
static void test_expert_reductions(void)
{
    static const struct {
        int impl, stage, calls;
        ZpCollKind kind;
        uint64_t elems;
        gboolean bucket, whole;
    } cases[] = {
        {ZP_IMPL_PAPER, 0, 2, ZP_COLL_ALLREDUCE, 12288, FALSE, FALSE},
        {ZP_IMPL_PAPER, 1, 2, ZP_COLL_ALLREDUCE, 12288, FALSE, FALSE},
        {ZP_IMPL_DEEPSPEED, 0, 1, ZP_COLL_ALLREDUCE, 24576, TRUE, TRUE},
        /* stage 1 keeps the partition: each unit's bucket all-reduced (allreduce_and_scatter,
         * use_multi_rank_bucket_allreduce's default), the rank keeping its slice */
        {ZP_IMPL_DEEPSPEED, 1, 2, ZP_COLL_ALLREDUCE, 12288, TRUE, FALSE},
    };
    ZpModel m;
    tu_small_moe(&m);
    for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
        ZpSchedule *s = build(&m, cases[c].impl, cases[c].stage, 4, 2, 1, FALSE);
        int calls = 0;
        guint last_dp = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind != ZP_OP_COLLECTIVE)
                continue;
            if (op->group == ZP_GROUP_DP && op->sub != ZP_COLL_ALLGATHER)
                last_dp = i;
            if (op->group != ZP_GROUP_EDP || op->sub == ZP_COLL_ALLGATHER)
                continue;
            calls++;
            g_assert_cmpint(op->sub, ==, cases[c].kind);
            g_assert_cmpuint(op->elems, ==, cases[c].elems);
            g_assert_cmpfloat(op->bytes, ==, 2.0 * (double)cases[c].elems);
            g_assert_cmpint(op->unit < 0, ==, cases[c].whole);
            g_assert_cmpint(op->buffer >= 0, ==, cases[c].bucket);
            if (cases[c].whole) /* after the dense gradients' reduction */
                g_assert_cmpuint(i, >, last_dp);
            for (guint j = 0; cases[c].bucket && j < i; j++) {
                const ZpOp *a = zp_sched_op(s, j);
                if (a->kind == ZP_OP_ALLOC && a->buffer == op->buffer) {
                    g_assert_cmpint(a->sub, ==, ZP_MEM_BUCKETS);
                    g_assert_cmpfloat(a->bytes, ==, 2.0 * (double)cases[c].elems);
                }
            }
        }
        g_assert_cmpint(calls, ==, cases[c].calls);
        zp_sched_free(s);
    }
}

static void test_alltoall_bytes(void)
{
    ZpModel m;
    tu_small_moe(&m);
    static const struct {
        int ep;
        gboolean ckpt;
        guint calls;
        double wire_bytes;
    } cases[] = {{1, FALSE, 0, 0},     {2, FALSE, 8, 32768}, {4, FALSE, 8, 49152},
                 {1, TRUE, 0, 0},      {2, TRUE, 12, 49152}, {4, TRUE, 12, 73728}};
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpSchedule *s = build(&m, ZP_IMPL_DEEPSPEED, 1, 8, cases[i].ep, 2, cases[i].ckpt);
        guint calls = 0, dispatch = 0, experts = 0;
        for (guint k = 0; k < s->ops->len; k++) {
            const ZpOp *op = zp_sched_op(s, k);
            if (op->kind == ZP_OP_COLLECTIVE &&
                (op->sub == ZP_COLL_EP_DISPATCH || op->sub == ZP_COLL_EP_COMBINE)) {
                calls++;
                dispatch += op->sub == ZP_COLL_EP_DISPATCH;
                g_assert_cmpfloat(op->bytes, ==, 8192);
                g_assert_cmpint(op->group, ==, ZP_GROUP_EP);
                g_assert_cmpint(op->stream, ==, ZP_STREAM_COMPUTE);
            }
            if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_EXPERT_FWD) {
                experts++;
                g_assert_cmpfloat(op->flops, ==, 786432);
            }
        }
        g_assert_cmpuint(calls, ==, cases[i].calls);
        g_assert_cmpuint(dispatch * 2, ==, calls);
        g_assert_cmpuint(experts, ==, cases[i].ckpt ? 4 : 2);
        g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EP), ==, cases[i].wire_bytes);
        /* zp_ep's closed form agrees: its step bytes are the schedule's */
        g_assert_cmpfloat(zp_ep_alltoall(&s->model, &s->plan, NULL).step_bytes, ==,
                          cases[i].wire_bytes);
        zp_sched_free(s);
    }
    ZpSchedule *s = build(&m, ZP_IMPL_DEEPSPEED, 1, 8, 2, 2, FALSE);
    zp_sched_free(s);
    ZpPlan p;
    zp_plan_defaults(&p, 1, 8, 1);
    p.precision = ZP_PREC_BF16, p.micro_batch = 2, p.experts.ep = 4, p.experts.skew = 2;
    GError *error = NULL;
    s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    for (guint k = 0; k < s->ops->len; k++) {
        const ZpOp *op = zp_sched_op(s, k);
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_EXPERT_FWD)
            g_assert_cmpfloat(op->flops, ==, 1572864);
        if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_EP_DISPATCH)
            g_assert_cmpfloat(op->bytes, ==, 16384); /* the busiest rank's buffer, x 2 */
    }
    zp_sched_free(s);
}

/* The schedule's model states are zp_ep's closed form exactly (sizes that divide evenly: no
 * padding), at EP 1, 2, 4 and stages 0-3, under the paper's and DeepSpeed's rules; its
 * experts' reductions and gathers go over the expert-data-parallel group (dp / EP ranks). */
static void test_states_match_closed_form(void)
{
    ZpModel m;
    tu_small_moe(&m);
    const int impls[] = {ZP_IMPL_PAPER, ZP_IMPL_DEEPSPEED};
    for (size_t i = 0; i < G_N_ELEMENTS(impls); i++)
        for (int ep = 1; ep <= 4; ep *= 2)
            for (int stage = 0; stage <= 3; stage++) {
                ZpSchedule *s = build(&m, impls[i], stage, 8, ep, 1, FALSE);
                const ZpStateBytes sb = zp_impl_state_bytes(&s->plan);
                const ZpEpStates want = zp_ep_model_states(&m, &s->plan, stage, sb);
                const ZpSchedExperts x = zp_sched_experts(s);
                g_test_message("impl %d EP %d stage %d: %.0f against %.0f", impls[i], ep, stage,
                               zp_sched_model_state_bytes(s), want.total.total_bytes);
                if (impls[i] == ZP_IMPL_PAPER)
                    g_assert_cmpfloat(zp_sched_model_state_bytes(s), ==, want.total.total_bytes);
                else if (stage == 1 || stage == 2) /* DeepSpeed partitions gradients, experts
                                      * too; the dense ones the reduction takes (transient) */
                    g_assert_cmpfloat(s->state_bytes[ZP_MEM_GRADS], ==,
                                      (double)x.partition_elems * sb.grad_bytes);
                else
                    g_assert_cmpfloat(zp_sched_model_state_bytes(s), ==, want.total.total_bytes);
                g_assert_cmpuint(x.total_elems, ==, 2 * 4 / ep * 6144);
                guint edp = 0, dp_expert = 0;
                for (guint k = 0; k < s->ops->len; k++) {
                    const ZpOp *op = zp_sched_op(s, k);
                    edp += op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_EDP;
                    dp_expert += op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_DP &&
                                 op->elem_offset + op->elems > s->padded_elems;
                }
                /* dp / EP ranks hold each expert: 8 at EP 1, 4 at EP 2, 2 at EP 4 */
                g_assert_cmpuint(edp, >, 0);
                g_assert_cmpuint(dp_expert, ==, 0);
                zp_sched_free(s);
            }
}

/* simulate's all-to-all on a synthetic profile, by hand: 4 GPUs a node, NVLink 100 GB/s a GPU,
 * 200 GB/s of NICs a node, hops 2 and 5 us. EP 8 over dp 8 spans two nodes; one dispatch of
 * S = 64 MB sends 3/8 S = 24 MB to the node's peers (240 us) and 4/8 S = 32 MB to the other
 * node's, whose NICs carry the node's 4 GPUs' at once: 4 x 32 MB / 200 GB/s = 640 us. The
 * slower of the two and both hops: 647 us, the step and its all-to-all time. */
static void test_simulated_alltoall(void)
{
    ZpHw hw = tu_load_hw("dgx-h100");
    hw.gpus_per_node = 4;
    hw.intra_node_bytes_per_s = 100e9, hw.inter_node_bytes_per_s = 200e9;
    hw.intra_node_latency_s = 2e-6, hw.inter_node_latency_s = 5e-6;
    ZpModel m;
    tu_small_moe(&m);
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->model = m;
    zp_plan_defaults(&s->plan, 0, 8, 1);
    s->plan.experts.ep = 8;
    s->world = 8, s->elem_bytes = 2, s->stages = 1;
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const ZpOp a2a = {.kind = ZP_OP_COLLECTIVE, .sub = ZP_COLL_EP_DISPATCH,
                      .stream = ZP_STREAM_COMPUTE, .group = ZP_GROUP_EP, .unit = 1, .buffer = -1,
                      .bytes = 64e6, .elems = 32000000};
    g_array_append_val(s->ops, a2a);
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    g_test_message("step %.9f s, all-to-all %.9f s", r->step_time_s, r->alltoall_s);
    g_assert_cmpfloat_with_epsilon(r->step_time_s, 647e-6, 1e-9);
    g_assert_cmpfloat_with_epsilon(r->alltoall_s, 647e-6, 1e-9);
    g_assert_cmpfloat(r->comm_bytes[ZP_GROUP_EP], ==, 7.0 / 8 * 64e6);
    sim_result_free(r);
    /* Within one node (8 GPUs a node): 7/8 S over NVLink, 560 us, one hop. */
    hw.gpus_per_node = 8;
    r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat_with_epsilon(r->step_time_s, 562e-6, 1e-9);
    sim_result_free(r);
    zp_sched_free(s);
}

/* A schedule with experts written by `zplan schedule --out` reads back (zp_sched_read_json:
 * the builder's ops under DeepSpeed and Megatron, the checker's under the paper). */
static void test_json_round_trip(void)
{
    ZpModel m;
    tu_small_moe(&m);
    const int impls[] = {ZP_IMPL_PAPER, ZP_IMPL_DEEPSPEED, ZP_IMPL_MEGATRON};
    for (size_t i = 0; i < G_N_ELEMENTS(impls); i++)
        for (int stage = 0; stage <= 7; stage++) {
            /* EP 2, then EP 1, whose edp the file leaves out (it is all of dp): read back
             * as one rank, it made the expert gradients' all-reduces free. */
            const int ep = stage < 4 ? 2 : 1;
            if (!zp_impl_get(impls[i])->has_stage(stage % 4)) /* Megatron: stages 0 and 1 */
                continue;
            ZpSchedule *s = build(&m, impls[i], stage % 4, 4, ep, 1, stage % 4 == 2);
            char *path = NULL;
            const int fd = g_file_open_tmp("zp-moe-XXXXXX.json", &path, NULL);
            close(fd);
            GError *error = NULL;
            g_assert_true(zp_sched_write_json(s, path, &error));
            ZpSchedule *t = zp_sched_read_json(path, &error);
            g_test_message("impl %d stage %d ep %d", impls[i], stage % 4, ep);
            g_assert_no_error(error);
            g_assert_cmpuint(t->ops->len, ==, s->ops->len);
            g_assert_cmpint(t->digest, ==, ZP_DIGEST_MATCH);
            zp_sched_free(t);
            /* Both readers (zreal's, and simulate --schedule's graph) place every group as
             * the plan's schedule does. */
            for (int graph = 0; graph < 2; graph++) {
                t = graph ? zp_sched_read_graph(path, &error) : zp_sched_read_json(path, &error);
                g_assert_no_error(error);
                tu_assert_same_groups(s, t);
                ZpCommGroup gt[ZP_SCHED_MAX_GROUPS];
                zp_sched_groups(t, gt);
                g_assert_cmpint(gt[ZP_GROUP_EDP].ranks, ==, 4 / ep);
                for (int g = ZP_GROUP_EP; g <= ZP_GROUP_EDP; g++)
                    g_assert_cmpfloat(zp_sched_comm_bytes(t, g), ==, zp_sched_comm_bytes(s, g));
                g_assert_cmpfloat(zp_sched_comm_bytes(t, ZP_GROUP_EDP), >, 0);
                zp_sched_free(t);
            }
            zp_sched_free(s);
            g_unlink(path);
            g_free(path);
        }
}

/* A sparse block's op is priced by its own kernels, never as the kernel inventory's uniform
 * block (a dense MLP ffn_hidden wide: Mixtral's 14,336, a third expert on top of the two routed
 * ones): on dgx-h100's kernel rates, Mixtral's whole-block ops cost what zp_inventory_moe_block's
 * kernels cost (attention, router, softmax and top-k, permute), their module ops the roofline;
 * the experts' op is its kernels' (zp_inventory_moe:
 * two grouped GEMMs of E/EP = 1 expert over R = T k = 1,024 tokens and the SwiGLU), whose
 * GEMM FLOPs are the op's. */
static void test_blocks_not_inventory(void)
{
    ZpModel m = tu_load_model("hf/mixtral-8x7b");
    m.seq_len = 512;
    ZpHw hw = tu_load_hw("dgx-h100");
    ZpSchedule *s = build(&m, ZP_IMPL_DEEPSPEED, 3, 8, 8, 1, FALSE);
    s->plan.attention = ZP_ATTN_EAGER; /* no fused kernel: attention in the FLOPs' roofline */
    ZpCost cost;
    GError *error = NULL;
    g_assert_true(zp_cost_init(&cost, &hw, &s->model, &s->plan, &error));
    g_assert_true(cost.inventory);
    g_assert_cmpfloat(cost.launches[ZP_COMP_BLOCK_FWD], ==, 0);
    g_assert_cmpfloat(cost.launches[ZP_COMP_BLOCK_BWD], ==, 0);
    guint priced = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || (op->sub != ZP_COMP_BLOCK_FWD &&
                                          op->sub != ZP_COMP_BLOCK_BWD))
            continue;
        double want = zp_hw_compute_time_s(&hw, cost.peak_flops, op->flops, op->gemm_flops,
                                           op->attn_flops, cost.attn_flops_per_s, op->mem_bytes,
                                           FALSE);
        if (zp_op_module(op) < 0) {
            ZpInvList kernels;
            zp_inventory_moe_block(&s->model, &s->plan, op->unit, op->sub == ZP_COMP_BLOCK_BWD,
                                   &kernels);
            want = zp_cost_inv_op_s(&cost, &kernels, NULL, NULL);
            g_assert_cmpfloat(want, !=, zp_hw_compute_time_s(&hw, cost.peak_flops, op->flops,
                                                             op->gemm_flops, op->attn_flops,
                                                             cost.attn_flops_per_s,
                                                             op->mem_bytes, FALSE));
        }
        g_assert_cmpfloat(zp_cost_op_s(&cost, op->sub, zp_op_module(op), op->flops,
                                       op->gemm_flops, op->attn_flops, op->mem_bytes), ==, want);
        priced++;
    }
    g_assert_cmpuint(priced, >, 0);
    ZpInvList list = {0};
    zp_inventory_op(cost.inv, &s->model, &s->plan, ZP_COMP_EXPERT_FWD, 0, &list);
    ZpInvTotals tot;
    zp_inventory_totals(&list, &tot);
    g_assert_cmpint(list.n, ==, 3);
    g_assert_cmpfloat(list.k[0].batch, ==, 1);
    g_assert_cmpfloat(list.k[0].m, ==, 1024);
    g_assert_cmpfloat(cost.launches[ZP_COMP_EXPERT_FWD], ==, 3);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_EXPERT_FWD)
            continue;
        g_assert_cmpfloat(tot.gemm_flops, ==, op->flops);
        g_assert_cmpfloat(zp_cost_op_s(&cost, op->sub, -1, op->flops, op->gemm_flops,
                                       op->attn_flops, op->mem_bytes), ==,
                          cost.kind_s[ZP_COMP_EXPERT_FWD]);
    }
    zp_sched_free(s);
}

/* Selective recomputation with experts (Megatron's core attention only, as for a dense
 * model): the 2-layer MoE at dp 4, EP 2, micro-batch 2, eager attention, --impl megatron. Each
 * block's backward recomputes its core attention, 4 b s^2 h = 4 x 2 x 16^2 x 64 = 131,072
 * FLOPs with the softmax's 2 b a s^2 reads and writes (2 x 2 x 4 x 256 x 2 B = 8,192 B), the
 * experts none; the closed form's ops agree; the saved activations lose each block's scores
 * (2 a s^2 b 16-bit values, 4,096 B a block), one block's kept for its recompute. */
static void test_selective_recompute(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan p;
    zp_plan_defaults(&p, 1, 4, 1);
    p.impl = ZP_IMPL_MEGATRON;
    p.precision = ZP_PREC_BF16;
    p.micro_batch = 2;
    p.experts.ep = 2;
    p.attention = ZP_ATTN_EAGER;
    zp_impl_plan_defaults(&p);
    ZpPlan full = p;
    p.selective_recompute = TRUE;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    guint recomputed = 0, experts = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE)
            continue;
        experts += op->sub == ZP_COMP_EXPERT_FWD;
        if (op->sub != ZP_COMP_RECOMPUTE)
            continue;
        g_assert_cmpfloat(op->flops, ==, 131072);
        g_assert_cmpfloat(op->mem_bytes, ==, 8192);
        recomputed++;
    }
    g_assert_cmpuint(recomputed, ==, 2);
    g_assert_cmpuint(experts, ==, 2); /* the forward's only */
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(&m, &p, ops);
    g_assert_cmpuint(ops[ZP_COMP_RECOMPUTE].count, ==, 2);
    g_assert_cmpfloat(ops[ZP_COMP_RECOMPUTE].flops, ==, 131072);
    g_assert_cmpuint(ops[ZP_COMP_EXPERT_FWD].count, ==, 2);
    const ZpResidual sel = zp_mem_residual(&m, &p, NULL), none = zp_mem_residual(&m, &full, NULL);
    g_assert_cmpfloat(none.activations_bytes - sel.activations_bytes, ==, 2 * 4096);
    g_assert_cmpfloat(sel.recompute_bytes, ==, 4096);
    zp_sched_free(s);
}

/* The experts' gradients reduced as the implementation reduces the dense buckets: the 2-layer
 * MoE at dp 8, EP 2 (expert data-parallel 4), each sparse unit's 2 local experts of 3 x 64 x 32
 * = 6,144 elements, 12,288 a reduction. DeepSpeed all-reduces them at stages 1-2
 * (stage_1_and_2.py average_tensor, use_multi_rank_bucket_allreduce), Megatron-Core
 * reduce-scatters with its distributed optimizer (stage 1), the paper's rule keeps
 * all-reduce below stage 2; without overlap_comm the next compute op waits for each (the
 * reduction runs on the current stream), with it none does. */
static void test_expert_grad_reduction(void)
{
    ZpModel m;
    tu_small_moe(&m);
    const struct {
        int impl, stage;
        gboolean overlap;
        ZpCollKind kind;
        uint64_t elems; /* each reduction's */
        guint reductions, waited; /* and those the next compute op waits for */
    } cases[] = {
        {ZP_IMPL_DEEPSPEED, 1, FALSE, ZP_COLL_ALLREDUCE, 12288, 2, 2},
        /* stage 2: both units' experts in the one 5e8-element ipg bucket, reduced once by
         * the epilogue, which the step waits for with or without overlap_comm
         * (test_experts_in_ipg_buckets) */
        {ZP_IMPL_DEEPSPEED, 2, FALSE, ZP_COLL_ALLREDUCE, 24576, 1, 1},
        {ZP_IMPL_DEEPSPEED, 2, TRUE, ZP_COLL_ALLREDUCE, 24576, 1, 1},
        {ZP_IMPL_DEEPSPEED, 3, TRUE, ZP_COLL_REDUCE_SCATTER, 12288, 2, 0},
        {ZP_IMPL_MEGATRON, 1, FALSE, ZP_COLL_REDUCE_SCATTER, 12288, 2, 2},
        {ZP_IMPL_PAPER, 1, FALSE, ZP_COLL_ALLREDUCE, 12288, 2, 2},
        {ZP_IMPL_PAPER, 2, FALSE, ZP_COLL_REDUCE_SCATTER, 12288, 2, 2},
    };
    for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
        ZpPlan p;
        zp_plan_defaults(&p, cases[c].stage, 8, 1);
        p.impl = cases[c].impl;
        p.precision = ZP_PREC_BF16;
        p.micro_batch = 2;
        p.experts.ep = 2;
        zp_impl_plan_defaults(&p);
        p.zero.overlap_comm = cases[c].overlap;
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        if (p.impl == ZP_IMPL_PAPER) { /* zp_schedcheck's layout is the paper's */
            g_assert_true(zp_schedcheck_ops(s, "test", &error));
            g_assert_no_error(error);
        }
        guint reductions = 0, waited = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind != ZP_OP_COLLECTIVE || op->group != ZP_GROUP_EDP || op->unit < 0 ||
                op->sub == ZP_COLL_ALLGATHER)
                continue;
            g_assert_cmpint(op->sub, ==, cases[c].kind);
            g_assert_cmpuint(op->elems, ==, cases[c].elems);
            reductions++;
            for (guint j = i + 1; j < s->ops->len; j++) { /* the next compute op */
                const ZpOp *next = zp_sched_op(s, j);
                if (next->kind != ZP_OP_COMPUTE)
                    continue;
                const uint32_t *deps = zp_sched_deps(s, next);
                gboolean waits = FALSE;
                for (uint32_t d = 0; d < next->n_deps; d++)
                    waits |= deps[d] == i;
                waited += waits;
                break;
            }
        }
        g_test_message("impl %d stage %d overlap %d: %u reductions, %u waited for", cases[c].impl,
                       cases[c].stage, cases[c].overlap, reductions, waited);
        g_assert_cmpuint(reductions, ==, cases[c].reductions);
        g_assert_cmpuint(waited, ==, cases[c].waited);
        zp_sched_free(s);
    }
}

/* DeepSpeed's stage 2 puts the expert gradients in the dense ones' ipg buckets
 * (stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads counts every parameter
 * against reduce_bucket_size) and reduces each bucket's slices over their parameters' groups
 * (average_tensor: one allreduce_and_scatter per process group). By hand for the 2-layer MoE at
 * dp 4, EP 2 (EDP 2), reduce_bucket_size 20,000: units 0-3 hold 8,192 | 16,768 | 16,768 | 8,256
 * dense elements at offsets 0, 8,192, 24,960, 41,728 (a block: ln1 64, qkv 12,288, proj 4,096,
 * ln2 64, router 256), and each block 2 experts x 3 x 64 x 32 = 12,288 expert elements, unit 1's
 * at 0 and unit 2's at 12,288 of the expert space, handed on before the block's own. From the
 * last gradient down:
 *   0: head 8,192 + ln_f 64 = 8,256 (unit 2's experts would make 20,544): [41,728, 49,984);
 *   1: unit 2's experts 12,288 + router, ln2, proj 4,416 (qkv would make 28,992);
 *   2: qkv 12,288 + ln1 64 = 12,352 (unit 1's experts would make 24,640): [24,960, 37,312);
 *   3: unit 1's experts + 4,416: [20,544, 24,960); 4: [8,192, 20,544); 5: wte [0, 8,192).
 * Each bucket's dense range all-reduced over dp, then its experts over EDP, from the one held
 * 40,000-byte ipg buffer; no bucket of the experts' own. */
static void test_experts_in_ipg_buckets(void)
{
    ZpModel m;
    tu_small_moe(&m);
    ZpPlan p;
    zp_plan_defaults(&p, 2, 4, 1);
    p.impl = ZP_IMPL_DEEPSPEED;
    p.precision = ZP_PREC_BF16;
    p.micro_batch = 1;
    p.experts.ep = 2;
    zp_impl_plan_defaults(&p);
    p.zero.reduce_bucket_size = 20000;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    static const struct {
        uint64_t lo, hi, expert_lo, expert_elems;
        gboolean on_top;
    } want[] = {
        {41728, 49984, 0, 0, FALSE},   {37312, 41728, 12288, 12288, TRUE},
        {24960, 37312, 0, 0, FALSE},   {20544, 24960, 0, 12288, TRUE},
        {8192, 20544, 0, 0, FALSE},    {0, 8192, 0, 0, FALSE},
    };
    GArray *specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    zp_impl_get(p.impl)->plan_buckets(s, specs);
    GArray *experts = zp_impl_bucket_experts(s);
    g_assert_nonnull(experts);
    g_assert_cmpuint(specs->len, ==, G_N_ELEMENTS(want));
    g_assert_cmpuint(experts->len, ==, G_N_ELEMENTS(want));
    for (guint i = 0; i < specs->len; i++) {
        const ZpBucketSpec *k = &g_array_index(specs, ZpBucketSpec, i);
        const ZpBucketExperts *x = &g_array_index(experts, ZpBucketExperts, i);
        g_assert_cmpuint(k->lo, ==, want[i].lo);
        g_assert_cmpuint(k->hi, ==, want[i].hi);
        g_assert_cmpuint(x->elems, ==, want[i].expert_elems);
        if (x->elems > 0)
            g_assert_cmpuint(x->lo, ==, want[i].expert_lo);
        g_assert_cmpint(x->on_top, ==, want[i].on_top);
        g_assert_cmpfloat(k->bytes, ==, 2.0 * (double)(k->hi - k->lo + x->elems));
        /* the bucket before one whose experts come first launches after those experts */
        if (i + 1 < specs->len && want[i + 1].on_top)
            g_assert_cmpint(k->launch_module, ==, ZP_LAUNCH_EXPERTS);
    }
    g_array_unref(experts);
    g_array_unref(specs);
    /* the reductions in order: each bucket's dense range over dp, its experts over EDP */
    static const struct {
        ZpGroup group;
        uint64_t offset, elems;
    } colls[] = {
        {ZP_GROUP_DP, 41728, 8256},  {ZP_GROUP_DP, 37312, 4416}, {ZP_GROUP_EDP, 12288, 12288},
        {ZP_GROUP_DP, 24960, 12352}, {ZP_GROUP_DP, 20544, 4416}, {ZP_GROUP_EDP, 0, 12288},
        {ZP_GROUP_DP, 8192, 12352},  {ZP_GROUP_DP, 0, 8192},
    };
    guint n = 0, bucket_allocs = 0;
    int ipg = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_BUCKETS) {
            g_assert_cmpfloat(op->bytes, ==, 40000); /* the held ipg buffer, alone */
            ipg = op->buffer;
            bucket_allocs++;
        }
        if (op->kind != ZP_OP_COLLECTIVE || op->sub == ZP_COLL_ALLGATHER ||
            (op->group != ZP_GROUP_DP && op->group != ZP_GROUP_EDP))
            continue;
        g_assert_cmpuint(n, <, G_N_ELEMENTS(colls));
        g_assert_cmpint(op->sub, ==, ZP_COLL_ALLREDUCE);
        g_assert_cmpint(op->group, ==, colls[n].group);
        g_assert_cmpuint(op->elem_offset, ==, colls[n].offset);
        g_assert_cmpuint(op->elems, ==, colls[n].elems);
        g_assert_cmpfloat(op->bytes, ==, 2.0 * (double)colls[n].elems);
        g_assert_cmpint(op->buffer, ==, ipg);
        n++;
    }
    g_assert_cmpuint(n, ==, G_N_ELEMENTS(colls));
    g_assert_cmpuint(bucket_allocs, ==, 1);
    zp_sched_free(s);
}

/* A block's own kernels (zp_inventory_moe_block) against the op the builder emits, by hand for
 * Mixtral-8x7B at s 512, micro-batch 1, bf16, TP 1 (T = 512 tokens): the router's GEMM
 * [512, 4096] x [4096, 8] is 2 x 512 x 8 x 4096 = 33,554,432 FLOPs; softmax and top-k read and
 * write the [512, 8] logits, 8,192 B each; permute reads the 512 tokens (4,194,304 B) and
 * writes their 2 copies (8,388,608 B). Every block's kernels sum to its op's FLOPs and bytes,
 * forward and backward, for Mixtral and for DeepSeek-V3's dense (unit 1) and sparse (unit 4)
 * blocks with latent attention, at TP 1 and 2, fused and eager attention. */
static void test_block_kernels(void)
{
    ZpModel m = tu_load_model("hf/mixtral-8x7b");
    m.seq_len = 512;
    ZpPlan p;
    zp_plan_defaults(&p, 1, 8, 1);
    p.precision = ZP_PREC_BF16;
    p.micro_batch = 1;
    p.experts.ep = 8;
    p.attention = ZP_ATTN_FLASH2;
    ZpInvList list;
    zp_inventory_moe_block(&m, &p, 1, FALSE, &list);
    guint found = 0;
    for (int i = 0; i < list.n; i++) {
        const ZpInvKernel *k = &list.k[i];
        if (strcmp(k->name, "router") == 0) {
            g_assert_cmpint(k->cls, ==, ZP_KCLASS_GEMM);
            g_assert_cmpfloat(k->flops, ==, 33554432.0);
            found++;
        } else if (strcmp(k->name, "router.softmax_topk") == 0) {
            g_assert_cmpfloat(k->read_bytes, ==, 8192);
            g_assert_cmpfloat(k->write_bytes, ==, 8192);
            found++;
        } else if (strcmp(k->name, "permute") == 0) {
            g_assert_cmpfloat(k->read_bytes, ==, 4194304);
            g_assert_cmpfloat(k->write_bytes, ==, 8388608);
            g_assert_nonnull(strstr(k->source, "moe_utils.py permute"));
            found++;
        }
    }
    g_assert_cmpuint(found, ==, 3);
    ZpModel ds = tu_load_model("hf/deepseek-v3");
    ds.seq_len = 512;
    const struct {
        const ZpModel *model;
        int unit, mp;
        ZpAttention attention;
        gboolean sp;
        ZpDispatcher dispatcher;
    } cases[] = {{&m, 1, 1, ZP_ATTN_FLASH2, FALSE, 0},  {&m, 1, 2, ZP_ATTN_EAGER, FALSE, 0},
                 {&m, 1, 2, ZP_ATTN_FLASH2, TRUE, 0},   {&ds, 1, 1, ZP_ATTN_FLASH2, FALSE, 0},
                 {&ds, 4, 1, ZP_ATTN_FLASH2, FALSE, 0}, {&ds, 4, 2, ZP_ATTN_EAGER, FALSE, 0},
                 {&ds, 4, 2, ZP_ATTN_EAGER, TRUE, 0},
                 {&m, 1, 2, ZP_ATTN_FLASH2, TRUE, ZP_DISPATCH_ALLGATHER},
                 {&ds, 4, 2, ZP_ATTN_EAGER, TRUE, ZP_DISPATCH_ALLGATHER}};
    for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
        ZpPlan q = p;
        q.mp = cases[c].mp, q.dp = 8 / cases[c].mp, q.experts.ep = q.dp;
        q.attention = cases[c].attention, q.sequence_parallel = cases[c].sp;
        q.experts.dispatcher = cases[c].dispatcher;
        for (int bwd = 0; bwd <= 1; bwd++) {
            double flops = 0, bytes = 0;
            g_assert_true(zp_sched_unit_block_op(cases[c].model, &q, cases[c].unit,
                                                 bwd ? ZP_COMP_BLOCK_BWD : ZP_COMP_BLOCK_FWD,
                                                 &flops, &bytes));
            zp_inventory_moe_block(cases[c].model, &q, cases[c].unit, bwd, &list);
            ZpInvTotals tot;
            zp_inventory_totals(&list, &tot);
            g_test_message("%s unit %d TP %d%s %s %s: %d kernels, %.6g FLOPs, %.6g B",
                           cases[c].model->name, cases[c].unit, q.mp, q.sequence_parallel ? " SP" : "",
                           zp_attention_name(q.attention), bwd ? "bwd" : "fwd", list.n, flops,
                           bytes);
            g_assert_cmpfloat(fabs(tot.gemm_flops + tot.attention_flops - flops), <=,
                              1e-9 * flops);
            g_assert_cmpfloat(fabs(tot.memory_bytes - bytes), <=, 1e-9 * bytes);
        }
    }
    ZpModel dense = tu_load_model("hf/llama-3-8b");
    zp_inventory_moe_block(&dense, &p, 1, FALSE, &list);
    g_assert_cmpint(list.n, ==, 0); /* uniform blocks: the framework's inventory */
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/moe-sched/graph-names", test_graph_names);
    g_test_add_func("/moe-sched/plan-groups", test_plan_groups);
    g_test_add_func("/moe-sched/graph-refusals", test_graph_refusals);
    g_test_add_func("/moe-sched/alltoall-bytes", test_alltoall_bytes);
    g_test_add_func("/moe-sched/expert-reductions", test_expert_reductions);
    g_test_add_func("/moe-sched/states-match-closed-form", test_states_match_closed_form);
    g_test_add_func("/moe-sched/simulated-alltoall", test_simulated_alltoall);
    g_test_add_func("/moe-sched/json-round-trip", test_json_round_trip);
    g_test_add_func("/moe-sched/blocks-not-inventory", test_blocks_not_inventory);
    g_test_add_func("/moe-sched/selective-recompute", test_selective_recompute);
    g_test_add_func("/moe-sched/expert-grad-reduction", test_expert_grad_reduction);
    g_test_add_func("/moe-sched/block-kernels", test_block_kernels);
    g_test_add_func("/moe-sched/experts-in-ipg-buckets", test_experts_in_ipg_buckets);
    return g_test_run();
}
