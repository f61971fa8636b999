/* test_fsdp2: --impl fsdp2 (torch/distributed/fsdp/_fully_shard/) against FSDP1 and its
 * source: fp32 shards that are the master weights, fp32 sharded gradients, the reduce-scatter's
 * copy-in buffer, reshard_after_forward, and the stages it has. */
#include "impl_common.h"
#include "sim_engine.h"
#include "testutil.h"
#include "zp_impl.h"

#include <math.h>
#include <string.h>

static ZpSchedule *fsdp2_build(const ZpModel *m, ZpImplKind impl, int stage)
{
    ZpPlan p;
    zp_plan_defaults(&p, stage, 8, 1);
    p.impl = impl;
    p.precision = ZP_PREC_BF16;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* Model states at stage 3 under bf16: FSDP2 keeps each shard in fp32 and steps it in place
 * (FSDPParam's sharded DTensor is the optimizer's parameter), so no 16-bit partition: 4
 * (shard) + 4 (fp32 sharded .grad) + 8 (Adam) = 16 bytes per partition element, where FSDP1's
 * flat parameter holds a 16-bit shard, a 16-bit gradient, and the optimizer's fp32 copy and
 * moments, 2 + 2 + 12. Same total, other split: FSDP2 has no 16-bit param state at all. */
static void test_states(void)
{
    const ZpModel m = tu_load_model("models/hf/llama-2-7b");
    ZpSchedule *two = fsdp2_build(&m, ZP_IMPL_FSDP2, 3), *one = fsdp2_build(&m, ZP_IMPL_FSDP, 3);
    const double part = (double)two->partition_elems;
    g_assert_cmpfloat(two->state_bytes[ZP_MEM_PARAMS], ==, 0);
    g_assert_cmpfloat(two->state_bytes[ZP_MEM_GRADS], ==, 4 * part);
    g_assert_cmpfloat(two->state_bytes[ZP_MEM_MASTER], ==, 4 * part);
    g_assert_cmpfloat(zp_sched_model_state_bytes(two), ==, 16 * part);
    g_assert_cmpfloat(one->state_bytes[ZP_MEM_PARAMS], ==, 2 * part);
    g_assert_cmpfloat(one->state_bytes[ZP_MEM_GRADS], ==, 2 * part);
    g_assert_cmpfloat(zp_sched_model_state_bytes(one), ==, 16 * part);
    zp_sched_free(two);
    zp_sched_free(one);
}

/* _fsdp_collectives.py foreach_reduce: each unit's unsharded gradients are copied into
 * reduce_scatter_input (its padded size in the reduce dtype) before the reduce-scatter, so
 * every reduction of FSDP2's stage 3 takes a buffer of the unit's size besides the gradients
 * backward wrote; FSDP1's reduces the flat gradient in place. */
static void test_copy_in(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    for (int impl = 0; impl < 2; impl++) {
        ZpSchedule *s = fsdp2_build(&m, impl ? ZP_IMPL_FSDP2 : ZP_IMPL_FSDP, 3);
        int reductions = 0, bucket_allocs = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
            if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_DP &&
                op->sub == ZP_COLL_REDUCE_SCATTER)
                reductions++;
            if (op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_BUCKETS)
                bucket_allocs++;
        }
        g_test_message("%s: %d reductions, %d bucket buffers", impl ? "fsdp2" : "fsdp",
                       reductions, bucket_allocs);
        g_assert_cmpint(reductions, ==, 14); /* 12 blocks, the root's embedding and head units */
        g_assert_cmpint(bucket_allocs, ==, (impl ? 2 : 1) * reductions);
        zp_sched_free(s);
    }
}

/* reshard_after_forward: True (stage 3) gathers each block for its forward and again for its
 * backward, the root once; False (stage 2) keeps the parameters from forward to backward, so
 * a step sends about 3 psi (two gathers and the reduce-scatter) against 2 psi. */
static void test_reshard_after_forward(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpSchedule *three = fsdp2_build(&m, ZP_IMPL_FSDP2, 3), *two = fsdp2_build(&m, ZP_IMPL_FSDP2, 2);
    const double sent3 = zp_sched_comm_bytes(three, ZP_GROUP_DP);
    const double sent2 = zp_sched_comm_bytes(two, ZP_GROUP_DP);
    g_test_message("sent %.0f bytes resharding after forward, %.0f not", sent3, sent2);
    g_assert_cmpfloat(sent3 / sent2, >, 1.3);
    g_assert_cmpfloat(sent3 / sent2, <, 1.5);
    zp_sched_free(three);
    zp_sched_free(two);
}

/* foreach_all_gather / foreach_all_gather_copy_out: a unit's all-gather lands in one output
 * buffer (each parameter padded to the group) and is copied out into the parameters' own
 * unsharded tensors when first waited for: one unpack per gather, moving the unit twice (read
 * and write), its output buffer and the unit's tensors both held at that moment. FSDP1
 * gathers into its flat parameter and uses it as is. */
static void test_copy_out(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    const double block_bytes = 2.0 * (double)zp_model_unit_elems(&m, 1);
    for (int impl = 0; impl < 2; impl++) {
        ZpSchedule *s = fsdp2_build(&m, impl ? ZP_IMPL_FSDP2 : ZP_IMPL_FSDP, 3);
        int unpacks = 0, block_unpacks = 0, gathers = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
            if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK) {
                unpacks++;
                block_unpacks += op->mem_bytes == 2 * block_bytes;
            }
            if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLGATHER &&
                op->group == ZP_GROUP_DP && op->micro >= 0)
                gathers++;
        }
        g_test_message("%s: %d all-gathers, %d copy-outs", impl ? "fsdp2" : "fsdp", gathers,
                       unpacks);
        /* the root's two units, then each block for its forward and its backward */
        g_assert_cmpint(gathers, ==, 2 + 2 * 12);
        g_assert_cmpint(unpacks, ==, impl ? gathers : 0);
        g_assert_cmpint(block_unpacks, ==, impl ? 2 * 12 : 0);
        zp_sched_free(s);
    }
}

/* reshard_after_forward=8 on two nodes (dp 16): after forward each block keeps a 16-bit shard
 * over the 8 ranks of its node (2 psi / 8, the schedule's secondary partition), and backward
 * all-gathers from it inside the node; the forward gathers still span the 16 ranks. */
static void test_reshard_to_node(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 16, 1);
    p.impl = ZP_IMPL_FSDP2;
    p.precision = ZP_PREC_BF16;
    p.gpus_per_node = 8;
    p.zero.zero_hpz_partition_size = 8;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    int node = 0, world = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->kind != ZP_OP_COLLECTIVE || op->sub != ZP_COLL_ALLGATHER || op->micro < 0)
            continue;
        node += op->group == ZP_GROUP_HPZ;
        world += op->group == ZP_GROUP_DP;
    }
    g_test_message("%d gathers inside the node, %d over all ranks", node, world);
    g_assert_cmpint(node, ==, 12);      /* each block's backward */
    g_assert_cmpint(world, ==, 2 + 12); /* the root's units, each block's forward */
    double units = 0;
    for (int u = 0; u < s->n_units; u++)
        units += (double)zp_sched_unit_padded(s, u);
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_SECONDARY_PARAMS], ==, 2 * units / 8);
    zp_sched_free(s);
}

/* The simulator's timeline holds what the list order holds, as FSDP2's host orders it:
 * a module's copy-out buffers are taken after the module before resharded (post_forward, then
 * the next pre_forward's wait_for_unshard), a prefetch's flat buffer after the module's own
 * copy-out freed its flat buffer (_fsdp_param_group.py pre_backward: unshard,
 * wait_for_unshard, then _backward_prefetch), the unsharded gradients are dropped once their
 * copy-in is issued and the reduce-scatter's input is held until the next post_backward
 * (comm_ctx.reduce_scatter_state) or the backward's end. Before, the simulator took the next
 * block's buffers first: 312,448 bytes of gathered parameters and of buckets for tiny on one
 * GPU, 212,480 in list order (and in zreal, test_real_fw). */
static void test_timeline_peak(void)
{
    ZpModel m = tu_load_model("tiny");
    m.dropout = FALSE;
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    for (int dp = 1; dp <= 8; dp *= 2)
        for (int accum = 1; accum <= 2; accum++)
            for (int ckpt = 0; ckpt <= 1; ckpt++) {
                ZpPlan p;
                zp_plan_defaults(&p, 3, dp, 1);
                p.impl = ZP_IMPL_FSDP2;
                p.precision = ZP_PREC_BF16;
                p.micro_batch = 4;
                p.grad_accum = accum;
                p.checkpoint = ckpt;
                p.backend_workspace = TRUE;
                GError *error = NULL;
                ZpSchedule *s = zp_sched_build(&m, &p, &error);
                g_assert_no_error(error);
                const SimOptions o = {.mode = SIM_MODE_FOLDED};
                SimResult *r = sim_engine_run(s, &hw, &o, &error);
                g_assert_no_error(error);
                g_test_message("dp %d, %d micro-step(s), checkpointing %d", dp, accum, ckpt);
                assert_peaks_in_list_order(s, r);
                sim_result_free(r);
                zp_sched_free(s);
            }
}

static void test_cli(void)
{
    TuRun r = tu_zplan("simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 1 "
                       "--micro-batch 1 --impl fsdp2");
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--impl fsdp2 has stages 2 (reshard_after_forward=False) "
                                   "and 3"));
    tu_free(&r);
    r = tu_zplan("simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 3 "
                 "--micro-batch 1 --impl fsdp2 --quantized-weights");
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--impl fsdp2 has none of it"));
    tu_free(&r);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/fsdp2/states", test_states);
    g_test_add_func("/fsdp2/reduce-scatter-copy-in", test_copy_in);
    g_test_add_func("/fsdp2/reshard-after-forward", test_reshard_after_forward);
    g_test_add_func("/fsdp2/all-gather-copy-out", test_copy_out);
    g_test_add_func("/fsdp2/reshard-after-forward-int", test_reshard_to_node);
    g_test_add_func("/fsdp2/timeline-peak", test_timeline_peak);
    g_test_add_func("/fsdp2/cli", test_cli);
    return g_test_run();
}
