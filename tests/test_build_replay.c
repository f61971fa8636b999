/* test_build_replay: a schedule built with its fast writers (a block's ops in one pass,
 * Builder.blocks_direct; a pipeline's actions written again from the last of their kind,
 * zp_build_replay) equals the one built op by op through the emitters, op for op and
 * dependency for dependency, over 1F1B, GPipe and interleaved schedules, no pipeline at ZeRO
 * 1 and 2, recomputation full, selective and none, sequence parallelism, scatter/gather
 * exchanges and the plans the replay refuses. */
#include "zp_pipe.h"
#include "zp_sched.h"

#include "testutil.h"

#include <jansson.h>
#include <string.h>

static ZpModel replay_model(int layers)
{
    ZpModel m;
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", "replay-test", "layers",
                          layers, "hidden", 1024, "heads", 16, "seq_len", 512, "vocab", 5120);
    GError *error = NULL;
    g_assert_true(zp_model_from_json(o, "replay-test", &m, &error));
    g_assert_no_error(error);
    json_decref(o);
    return m;
}

/* The fields each kind of op has (a p2p op's union holds padding after its peer). */
static void assert_same_op(const ZpOp *a, const ZpOp *b, guint i)
{
    if (a->kind != b->kind || a->sub != b->sub || a->stream != b->stream ||
        a->group != b->group || a->module != b->module || a->unit != b->unit ||
        a->micro != b->micro || a->buffer != b->buffer || a->stage != b->stage ||
        a->bytes != b->bytes || a->dep_start != b->dep_start || a->n_deps != b->n_deps)
        g_error("op %u: kind %d/%d unit %d/%d micro %d/%d buffer %d/%d stage %u/%u deps %u+%u / "
                "%u+%u", i, a->kind, b->kind, a->unit, b->unit, a->micro, b->micro, a->buffer,
                b->buffer, a->stage, b->stage, a->dep_start, a->n_deps, b->dep_start, b->n_deps);
    if (a->kind == ZP_OP_COMPUTE)
        g_assert_true(a->flops == b->flops && a->gemm_flops == b->gemm_flops &&
                      a->attn_flops == b->attn_flops && a->mem_bytes == b->mem_bytes);
    else if (a->kind == ZP_OP_COLLECTIVE || a->kind == ZP_OP_P2P)
        g_assert_true(a->elem_offset == b->elem_offset && a->elems == b->elems &&
                      (a->kind != ZP_OP_P2P || a->peer == b->peer));
}

/* Builds the plan both ways and compares them whole; returns the ops. */
static guint assert_replay_equal(const ZpModel *m, const ZpPlan *p)
{
    GError *error = NULL;
    ZpSchedule *replayed = zp_sched_build(m, p, &error);
    g_assert_no_error(error);
    ZpSchedule *built = zp_sched_build_op_by_op(m, p, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(replayed->ops->len, ==, built->ops->len);
    g_assert_cmpuint(replayed->deps->len, ==, built->deps->len);
    for (guint i = 0; i < built->ops->len; i++)
        assert_same_op(zp_sched_op(replayed, i), zp_sched_op(built, i), i);
    g_assert_cmpmem(replayed->deps->data, replayed->deps->len * sizeof(uint32_t),
                    built->deps->data, built->deps->len * sizeof(uint32_t));
    const gsize states = (gsize)built->stages * ZP_MEM_N * sizeof(double);
    g_assert_cmpmem(replayed->stage_state_bytes, states, built->stage_state_bytes, states);
    g_assert_cmpmem(replayed->stage_host_bytes, states, built->stage_host_bytes, states);
    const guint n = built->ops->len;
    zp_sched_free(replayed);
    zp_sched_free(built);
    return n;
}

typedef struct {
    int pp, v, micro, mp, dp, stage;
    ZpPipeSchedule schedule;
    ZpImplKind impl;
    gboolean checkpoint, selective, sp, p2p_sync;
} Case;

static void test_replay_equals_built(void)
{
    const Case cases[] = {
        /* Megatron: full recomputation, scatter/gather exchanges (mp 2, no sequence
         * parallelism) */
        {4, 1, 12, 2, 1, 0, ZP_PIPE_1F1B, ZP_IMPL_MEGATRON, TRUE, FALSE, FALSE, FALSE},
        /* selective recomputation under sequence parallelism (sums of two collectives) */
        {4, 1, 12, 2, 1, 0, ZP_PIPE_1F1B, ZP_IMPL_MEGATRON, FALSE, TRUE, TRUE, FALSE},
        /* no recomputation: activations kept from the forward to the backward */
        {4, 1, 10, 2, 1, 0, ZP_PIPE_1F1B, ZP_IMPL_MEGATRON, FALSE, FALSE, TRUE, FALSE},
        {4, 1, 8, 1, 2, 1, ZP_PIPE_GPIPE, ZP_IMPL_DEEPSPEED, TRUE, FALSE, FALSE, FALSE},
        {4, 2, 16, 2, 1, 0, ZP_PIPE_INTERLEAVED, ZP_IMPL_MEGATRON, TRUE, FALSE, FALSE, FALSE},
        {2, 3, 12, 2, 2, 1, ZP_PIPE_INTERLEAVED, ZP_IMPL_MEGATRON, FALSE, TRUE, TRUE, FALSE},
        {8, 1, 24, 1, 2, 1, ZP_PIPE_1F1B, ZP_IMPL_DEEPSPEED, FALSE, FALSE, FALSE, FALSE},
        /* no pipeline: the blocks' one-pass writers alone, beside ZeRO 1's and 2's buckets */
        {1, 1, 4, 2, 2, 1, ZP_PIPE_1F1B, ZP_IMPL_DEEPSPEED, TRUE, FALSE, FALSE, FALSE},
        {1, 1, 3, 1, 4, 2, ZP_PIPE_1F1B, ZP_IMPL_DEEPSPEED, FALSE, FALSE, FALSE, FALSE},
        /* refused: p2p_sync's host waits and deferred sends (built op by op either way) */
        {4, 2, 8, 2, 1, 0, ZP_PIPE_INTERLEAVED, ZP_IMPL_MEGATRON, TRUE, FALSE, FALSE, TRUE},
    };
    const ZpModel m = replay_model(16);
    for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
        const Case *k = &cases[c];
        ZpPlan p;
        zp_plan_defaults(&p, k->stage, k->dp, k->mp);
        p.impl = k->impl;
        p.pipe.stages = k->pp;
        p.pipe.schedule = k->schedule;
        p.pipe.virtual_stages = k->v;
        p.grad_accum = k->micro;
        p.checkpoint = k->checkpoint;
        p.selective_recompute = k->selective;
        p.sequence_parallel = k->sp;
        p.p2p_sync = k->p2p_sync;
        g_test_message("case %u: pp %d v %d micro-steps %d", c, k->pp, k->v, k->micro);
        g_assert_cmpuint(assert_replay_equal(&m, &p), >, 0);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/build-replay/equals-built", test_replay_equals_built);
    return g_test_run();
}
