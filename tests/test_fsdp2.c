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
        /* 12 blocks, the root's embedding and head units: FSDP1 reduces the root's two flat
         * units apart, FSDP2 its one group (one copy-in for both units' gradients) */
        g_assert_cmpint(reductions, ==, impl ? 13 : 14);
        g_assert_cmpint(bucket_allocs, ==, impl ? 14 + 13 : 14);
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
        /* the root (FSDP1's two units, FSDP2's one group), then each block for its forward
         * and its backward */
        g_assert_cmpint(gathers, ==, (impl ? 1 : 2) + 2 * 12);
        g_assert_cmpint(unpacks, ==, impl ? gathers : 0);
        g_assert_cmpint(block_unpacks, ==, impl ? 2 * 12 : 0);
        zp_sched_free(s);
    }
}

/* reshard_after_forward=False (stage 2) is not ZeRO-2: _fsdp_param_group.py keeps only the
 * fp32 shards at rest whatever reshard_after_forward says, and with False post_forward does
 * not reshard (post_forward_mesh_info is None) and pre_backward's unshard finds the block
 * unsharded. With two micro-steps: stage 3's states exactly (no 16-bit parameter state, the
 * fp32 shards the master), each micro-step gathering the root's two units and each block
 * once (copied out each time), no backward and no post-step all-gather, the gradients
 * reduce-scattered every micro-step; and `memory` on a cluster needs what `simulate` does.
 * The schedule had ZeRO-2's 2 psi of 16-bit parameters and one all-gather after the step. */
static void test_no_reshard(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpSchedule *sched[2];
    for (int k = 0; k < 2; k++) {
        ZpPlan p;
        zp_plan_defaults(&p, 2 + k, 8, 1);
        p.impl = ZP_IMPL_FSDP2;
        p.precision = ZP_PREC_BF16;
        p.grad_accum = 2;
        GError *error = NULL;
        sched[k] = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
    }
    ZpSchedule *two = sched[0], *three = sched[1];
    g_assert_true(two->plan.zero.fsdp2_no_reshard_after_forward);
    for (int c = 0; c < ZP_MEM_N; c++)
        g_assert_cmpfloat(two->state_bytes[c], ==, three->state_bytes[c]);
    g_assert_cmpfloat(two->state_bytes[ZP_MEM_PARAMS], ==, 0);
    int gathers[2] = {0, 0}, post_step = 0, unpacks = 0, reductions = 0;
    for (guint i = 0; i < two->ops->len; i++) {
        const ZpOp *op = &g_array_index(two->ops, ZpOp, i);
        if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLGATHER) {
            if (op->micro < 0)
                post_step++;
            else
                gathers[op->micro]++;
        }
        reductions += op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_REDUCE_SCATTER;
        unpacks += op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK;
    }
    g_test_message("reshard_after_forward=False: %d and %d all-gathers a micro-step, %d after "
                   "the step, %d copy-outs, %d reduce-scatters", gathers[0], gathers[1],
                   post_step, unpacks, reductions);
    g_assert_cmpint(gathers[0], ==, 1 + 12); /* the root's group, each block */
    g_assert_cmpint(gathers[1], ==, 1 + 12);
    g_assert_cmpint(post_step, ==, 0);
    g_assert_cmpint(unpacks, ==, 2 * (1 + 12));
    g_assert_cmpint(reductions, ==, 2 * 13);
    zp_sched_free(two);
    zp_sched_free(three);

    const char *common = "--model gpt2-124m --cluster dgx-a100-80g --gpus 8 --micro-batch 2 "
                         "--impl fsdp2 --json";
    char *args = g_strdup_printf("memory %s", common);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    json_t *memory = json_loads(r.out, 0, NULL);
    g_assert_nonnull(memory);
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("simulate %s --stage 2", common);
    r = tu_zplan(args);
    json_t *sim = json_loads(r.out, 0, NULL);
    g_assert_nonnull(sim);
    tu_free(&r);
    g_free(args);
    const double need = json_number_value(json_object_get(
        json_object_get(json_array_get(json_object_get(memory, "rows"), 0), "need_bytes"),
        "stage2"));
    const double simulated = json_number_value(json_object_get(sim, "need_bytes"));
    g_test_message("stage 2: memory needs %.0f, simulate %.0f", need, simulated);
    g_assert_cmpfloat(need, ==, simulated);
    json_decref(memory);
    json_decref(sim);

    r = tu_zplan("simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 2 "
                 "--micro-batch 1 --impl fsdp2 --hpz-partition-size 2");
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "reshard_after_forward is False (--stage 2) or an int"));
    tu_free(&r);
}

/* _fsdp_param_group.py wait_for_unshard runs foreach_all_gather_copy_out for every call:
 * every all-gather has its copy-out, whose buffers are the unpadded tensors. (llama-tiny's
 * embedding unit, wte alone, was a call of one tensor gathered in place, DeepSpeed's
 * _all_gather_sequential; it is now in the root's group, with the final norm and the head.) */
static void test_copy_out_single(void)
{
    ZpModel m = tu_load_model("llama-tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 2, 1);
    p.impl = ZP_IMPL_FSDP2;
    p.precision = ZP_PREC_BF16;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const double root_bytes = 2.0 * (double)(zp_model_unit_elems(&m, 0) +
                                             zp_model_unit_elems(&m, (int)m.layers + 1));
    int gathers = 0, unpacks = 0, wte = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        gathers += op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLGATHER && op->micro >= 0;
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK) {
            unpacks++;
            wte += op->unit == 0 && op->mem_bytes == 2 * root_bytes;
        }
    }
    g_test_message("llama-tiny: %d all-gathers, %d copy-outs, the root's %d", gathers, unpacks,
                   wte);
    g_assert_cmpint(unpacks, ==, gathers);
    g_assert_cmpint(wte, ==, 1);
    zp_sched_free(s);
}

/* fully_shard(model) makes the root's parameters one FSDPParamGroup (_fully_shard.py
 * fully_shard: one FSDPParamGroup of _get_managed_states), unsharded by one
 * foreach_all_gather and reduced by one foreach_reduce (_fsdp_collectives.py). tiny (2
 * blocks, hidden 64, vocab 64, 32 positions, tied head) at 4 ranks: the root is wte (64 x
 * 64), wpe (32 x 64) and ln_f (64 + 64), 4,096 + 2,048 + 128 = 6,272 elements, each tensor
 * a multiple of 4 (no padding): one all-gather and one reduce-scatter of 12,544 bytes (bf16)
 * a pass, where the schedule had two of each (12,288 and 256 bytes). A pass: 1 + 2 + 2
 * all-gathers (the root, each block's forward and backward), 1 + 2 reduce-scatters. */
static void test_root_one_group(void)
{
    const ZpModel m = tu_load_model("tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 4, 1);
    p.impl = ZP_IMPL_FSDP2;
    p.precision = ZP_PREC_BF16;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    int gathers = 0, reductions = 0, root_gathers = 0, root_reductions = 0;
    double sent_bytes = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->kind != ZP_OP_COLLECTIVE || op->micro < 0)
            continue;
        const gboolean root = op->bytes == 12544 && op->elems == 6272 && op->elem_offset == 0;
        if (op->sub == ZP_COLL_ALLGATHER) {
            gathers++;
            root_gathers += root;
        }
        if (op->sub == ZP_COLL_REDUCE_SCATTER) {
            reductions++;
            root_reductions += root;
        }
        if (op->unit == 0 || op->unit == (int)m.layers + 1)
            sent_bytes += op->bytes;
    }
    g_test_message("tiny, 4 ranks: %d all-gathers (the root's %d), %d reduce-scatters (the "
                   "root's %d), %.0f bytes of the root's calls", gathers, root_gathers,
                   reductions, root_reductions, sent_bytes);
    g_assert_cmpint(gathers, ==, 1 + 2 + 2);
    g_assert_cmpint(reductions, ==, 1 + 2);
    g_assert_cmpint(root_gathers, ==, 1);
    g_assert_cmpint(root_reductions, ==, 1);
    g_assert_cmpfloat(sent_bytes, ==, 2 * 12544);
    zp_sched_free(s);
}

/* reshard_after_forward=8 on two nodes (dp 16): after forward each block keeps a 16-bit shard
 * over the 8 ranks of its node, and backward all-gathers from it inside the node; the forward
 * gathers still span the 16 ranks. The shard is no state: _fsdp_param.py
 * to_sharded_post_forward allocates it in post_forward (copied from the unsharded block) and
 * to_unsharded frees it once backward's all-gather read it, each micro-step, and the root,
 * never resharded after forward, has none: at most the 12 blocks' shards are held, at the
 * turn from forward to backward (the schedule held every unit's, the root's included, as a
 * step-long state). */
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
    g_assert_cmpint(world, ==, 1 + 12); /* the root's group, each block's forward */
    double blocks = 0;
    for (int u = 1; u <= 12; u++)
        blocks += (double)(zp_sched_unit_padded(s, u) / 8);
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_SECONDARY_PARAMS], ==, 0);
    int allocs = 0, frees = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        allocs += op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_SECONDARY_PARAMS;
        frees += op->kind == ZP_OP_FREE && op->sub == ZP_MEM_SECONDARY_PARAMS;
    }
    double at[ZP_MEM_N], own[ZP_MEM_N];
    tu_sequential_peak(s, at, own);
    g_test_message("%d secondary shards taken, %d freed, at most %.0f bytes held", allocs,
                   frees, own[ZP_MEM_SECONDARY_PARAMS]);
    g_assert_cmpint(allocs, ==, 12);
    g_assert_cmpint(frees, ==, 12);
    g_assert_cmpfloat(own[ZP_MEM_SECONDARY_PARAMS], ==, 2 * blocks);
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
    for (int stage = 2; stage <= 4; stage++) /* 4: stage 3 at reshard_after_forward=2 */
        for (int dp = stage == 4 ? 2 : 1; dp <= 8; dp *= 2)
            for (int accum = 1; accum <= 2; accum++)
                for (int ckpt = 0; ckpt <= 1; ckpt++) {
                    ZpPlan p;
                    zp_plan_defaults(&p, MIN(stage, 3), dp, 1);
                    p.zero.zero_hpz_partition_size = stage == 4 ? 2 : 1;
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
                    g_test_message("stage %d, dp %d, %d micro-step(s), checkpointing %d", stage,
                                   dp, accum, ckpt);
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
    /* DeepSpeed's size knobs likewise, under FSDP and FSDP2 (and under Megatron but its
     * gradient bucket): simulate and zreal took them and changed nothing */
    static const struct {
        const char *args, *message;
    } knobs[] = {
        {"simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 "
         "--impl fsdp2 --prefetch-bucket-size 1e6",
         "--prefetch-bucket-size: a DeepSpeed ZeRO setting, which --impl fsdp2 has none of"},
        {"simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 2 --micro-batch 1 "
         "--impl fsdp --reduce-bucket-size 1e6",
         "--reduce-bucket-size: a DeepSpeed ZeRO setting, which --impl fsdp has none of"},
        {"simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 "
         "--impl megatron --persistence-threshold 10",
         "--persistence-threshold: a DeepSpeed ZeRO setting, which --impl megatron has none of"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(knobs); i++) {
        r = tu_zplan(knobs[i].args);
        g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
        g_assert_nonnull(strstr(r.err, knobs[i].message));
        g_assert_null(strchr(strchr(r.err, '\n') + 1, '\n')); /* one line */
        tu_free(&r);
    }
    r = tu_zplan("simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 1 "
                 "--micro-batch 1 --impl megatron --overlap --reduce-bucket-size 1e6");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL)); /* its bucket_size */
    tu_free(&r);
    char *zreal = g_strdup_printf("%s/zreal --model tiny --impl fsdp2 --stage 3 --emulate 2 "
                                  "--steps 1 --max-live-parameters 100", ZP_BUILD_DIR);
    r = tu_run(zreal, NULL);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--max-live-parameters: a DeepSpeed ZeRO setting"));
    tu_free(&r);
    g_free(zreal);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/fsdp2/states", test_states);
    g_test_add_func("/fsdp2/reduce-scatter-copy-in", test_copy_in);
    g_test_add_func("/fsdp2/reshard-after-forward", test_reshard_after_forward);
    g_test_add_func("/fsdp2/all-gather-copy-out", test_copy_out);
    g_test_add_func("/fsdp2/all-gather-copy-out-single", test_copy_out_single);
    g_test_add_func("/fsdp2/reshard-after-forward-int", test_reshard_to_node);
    g_test_add_func("/fsdp2/root-one-group", test_root_one_group);
    g_test_add_func("/fsdp2/reshard-after-forward-false", test_no_reshard);
    g_test_add_func("/fsdp2/timeline-peak", test_timeline_peak);
    g_test_add_func("/fsdp2/cli", test_cli);
    return g_test_run();
}
