/* test_impl: the implementation semantics (planner/zp_impl_*.c), DeepSpeed's as its source
 * does them: bytes on the wire at stages 1-3, bucket buffers and launches, coalesced gathers,
 * module ops and waits, the stage-3 ipg buffer and bucket numel, grad copies and the
 * reduction's peak. */
#include "impl_common.h"

#define GB 1e9

static double dp_bytes(const char *model, ZpImplKind impl, int stage, gboolean checkpoint)
{
    const ZpModel m = tu_load_model(model);
    ZpSchedule *s = build(&m, impl, stage, 64, checkpoint);
    const double bytes = zp_sched_comm_bytes(s, ZP_GROUP_DP);
    zp_sched_free(s);
    return bytes;
}

static void assert_within(double have, double want, double tolerance)
{
    g_test_message("%.6g against %.6g", have, want);
    g_assert_cmpfloat(fabs(have - want), <=, tolerance * want);
}

/* Stages 1 and 2 all-reduce the gradients bucket by bucket (use_multi_rank_bucket_allreduce)
 * and all-gather the updated partitions: 3 psi (N-1)/N 16-bit elements per rank, against the
 * paper's 2 psi. */
static void test_deepspeed_stage12_bytes(void)
{
    const struct {
        const char *model;
        double gb;
    } cases[] = {{"gpt2-1.5b", 9.20}, {"gpt-13b", 75.88}, {"gpt3-175b", 1031.26}};
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++)
        for (int stage = 1; stage <= 2; stage++) {
            assert_within(dp_bytes(cases[i].model, ZP_IMPL_DEEPSPEED, stage, FALSE) / GB,
                          cases[i].gb, 0.005);
            /* The paper's Pos and Pos+g move 2 psi: two thirds of DeepSpeed's. */
            assert_within(dp_bytes(cases[i].model, ZP_IMPL_PAPER, stage, FALSE) / GB,
                          cases[i].gb * 2 / 3, 0.005);
        }
    /* With use_multi_rank_bucket_allreduce false each slice is reduced to its owner: the
     * paper's volume again. */
    const ZpModel m = tu_load_model("gpt2-1.5b");
    ZpPlan p;
    zp_plan_defaults(&p, 2, 64, 1);
    p.zero.use_multi_rank_bucket_allreduce = FALSE;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    assert_within(zp_sched_comm_bytes(s, ZP_GROUP_DP) / GB, 9.20 * 2 / 3, 0.005);
    zp_sched_free(s);
}

/* Stage 3 on gpt3-175b at 64 GPUs, derived from the coordinator's rules as zplan replays them
 * (h = 12288, V = 50257, P = 2048, L = 96; every tensor divides by 64, so nothing pads):
 *   gradients: one reduce-scatter of every parameter, psi;
 *   persistent parameters (norms and biases, at most 1e5 elements: 13h a block and the final
 *   norm's 2h) are never gathered in a micro-step and refreshed once after the step;
 *   without checkpointing each block's four weights W = 12h^2 are gathered for its forward and
 *   again for its backward (stage3_max_reuse_distance, 1e9, is shorter than the ~1.2e9 of the
 *   LM head between a block's forward and backward), wte three times (embedding, tied head,
 *   embedding backward: the head keeps it through its own backward) and wpe twice;
 *   with checkpointing the recompute gathers the block again, and its backward reuses only
 *   fc2 (4h^2, used right after its recompute): fc1 sits 1.2e9 elements later, beyond the
 *   reuse distance, so the backward gathers qkv, proj and fc1 (8h^2) again. */
static void test_deepspeed_stage3_bytes(void)
{
    const double h = 12288, V = 50257, P = 2048, L = 96, n = 64;
    const double W = 12 * h * h, persistent = L * 13 * h + 2 * h;
    const double psi = L * (W + 13 * h) + V * h + P * h + 2 * h;
    const double sent = 2.0 * (n - 1) / n; /* bytes per element sent per rank */
    const double plain = psi + persistent + L * 2 * W + 3 * V * h + 2 * P * h;
    const double ckpt = psi + persistent + L * (W + W + 8 * h * h) + 3 * V * h + 2 * P * h;
    const double have_plain = dp_bytes("gpt3-175b", ZP_IMPL_DEEPSPEED, 3, FALSE);
    const double have_ckpt = dp_bytes("gpt3-175b", ZP_IMPL_DEEPSPEED, 3, TRUE);
    g_assert_cmpfloat(fabs(have_plain - plain * sent), <=, 1e-9 * plain * sent);
    g_assert_cmpfloat(fabs(have_ckpt - ckpt * sent), <=, 1e-9 * ckpt * sent);
    /* The figures a replay of the coordinator on a GPT-2 module trace gave. */
    assert_within(have_plain / GB, 1032.44, 0.005);
    assert_within(have_ckpt / GB, 1260.75, 0.005);
    /* The paper's Pos+g+p: 3 psi, with or without checkpointing. */
    const ZpModel m = tu_load_model("gpt3-175b");
    const double psi_model = (double)zp_model_param_count(&m);
    assert_within(dp_bytes("gpt3-175b", ZP_IMPL_PAPER, 3, TRUE), 3 * psi_model * sent / 2 * 2,
                  0.005);
}

/* Stage 1-2 gradient buffers are exactly reduce_bucket_size elements, two with overlap_comm
 * (stage_1_and_2.py backward's ipg_buffer), held through the reducing backward; no other
 * bucket buffer exists but the gradients of parameters larger than a bucket; the post-step
 * all-gather allocates nothing. */
static void test_deepspeed_bucket_buffers(void)
{
    const ZpModel m = tu_load_model("gpt2-1.5b");
    for (int stage = 1; stage <= 2; stage++)
        for (int overlap = 0; overlap <= 1; overlap++) {
            ZpPlan p;
            zp_plan_defaults(&p, stage, 8, 1);
            p.zero.overlap_comm = overlap;
            p.zero.reduce_bucket_size = 3e7; /* below wte (80M): it bypasses the bucket */
            p.grad_accum = 2;
            ZpSchedule *s = zp_sched_build(&m, &p, NULL);
            const guint backwards = stage == 2 ? 2 : 1; /* stage 1 keeps them through both */
            g_assert_cmpuint(count_allocs(s, ZP_MEM_BUCKETS, -1, 3e7 * 2), ==,
                             backwards * (overlap ? 2 : 1));
            guint other = 0, post = 0;
            for (guint i = 0; i < s->ops->len; i++) {
                const ZpOp *op = zp_sched_op(s, i);
                /* stage 1: taken by micro-step 0's first hook, given back by the last's
                 * epilogue (setup_buckets, _release_ipg_buffers) */
                if (stage == 1 && op->sub == ZP_MEM_BUCKETS && op->unit == -1 &&
                    (op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE))
                    g_assert_cmpint(op->micro, ==, (op->kind == ZP_OP_ALLOC ? 0 : 1));
                if (op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_BUCKETS && op->unit != -1) {
                    other++;
                    g_assert_cmpfloat(op->bytes, >, 3e7 * 2); /* a bypassing parameter's */
                }
                post += op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLGATHER;
            }
            g_assert_cmpuint(other, ==, stage == 2 ? backwards : 0); /* wte, at stage 2 */
            g_assert_cmpuint(post, >, 0);
            zp_sched_free(s);
        }
}

/* The index of the first op of `kind` and `sub` at micro-step `micro` (-1: any), or the
 * number of ops when there is none. */
static guint first_op(const ZpSchedule *s, ZpOpKind kind, int sub, int micro)
{
    guint i = 0;
    while (i < s->ops->len && !(zp_sched_op(s, i)->kind == kind &&
                                (int)zp_sched_op(s, i)->sub == sub &&
                                (micro < 0 || zp_sched_op(s, i)->micro == micro)))
        i++;
    return i;
}

/* Stage 2 (stage_1_and_2.py copy_grads_in_partition, independent_gradient_partition_epilogue,
 * step): grads_in_partition is no state held from the step's start. The step's first
 * reduction, in micro-step 0's backward, takes it (whole tensors: more than the partition's
 * 16-bit gradients), and it is the sum kept to the step, freed after the optimizer; so
 * during micro-step 0's forward no gradient is live. Each later micro-step's first reduction
 * allocates a new grads_in_partition of that size, freed after its last reduction once added
 * into the sum. Nothing else, nor at stage 3 (stage3.py partition_grads adds in place into the
 * partition it holds from __init__), under optimizer offload, or under the paper's
 * semantics. */
static void test_deepspeed_grad_copy(void)
{
    const ZpModel m = tu_load_model("gpt2-1.5b");
    double one_step = 0;
    for (int accum = 1; accum <= 3; accum += 2) {
        ZpPlan p;
        zp_plan_defaults(&p, 2, 8, 1);
        p.zero.reduce_bucket_size = 3e7;
        p.grad_accum = accum;
        ZpSchedule *s = zp_sched_build(&m, &p, NULL);
        g_assert_cmpfloat(s->state_bytes[ZP_MEM_GRADS], ==, 0);
        int copy[3] = {-1, -1, -1};
        guint taken[3] = {0}, last[3] = {0}, freed[3] = {0};
        double size = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_GRADS) {
                g_assert_cmpint(copy[op->micro], ==, -1);
                if (op->micro == 0)
                    size = op->bytes;
                g_assert_cmpfloat(op->bytes, ==, size);
                copy[op->micro] = op->buffer;
                taken[op->micro] = i;
            }
            if (op->kind == ZP_OP_FREE && op->sub == ZP_MEM_GRADS)
                freed[op->micro < 0 ? 0 : op->micro] = i;
            if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLREDUCE && op->micro >= 0) {
                last[op->micro] = i;
                /* the first reduction lands in the copy: allocated before it */
                g_assert_cmpint(copy[op->micro], >=, 0);
            }
        }
        if (accum == 1)
            one_step = size;
        g_assert_cmpfloat(size, ==, one_step);
        g_assert_cmpfloat(size, >, (double)s->partition_elems * 2);
        /* micro-step 0's: after its forward (the head), kept to after the optimizer */
        g_assert_cmpuint(taken[0], >, first_op(s, ZP_OP_COMPUTE, ZP_COMP_HEAD, 0));
        g_assert_cmpuint(freed[0], >, first_op(s, ZP_OP_COMPUTE, ZP_COMP_OPTIMIZER, -1));
        for (int micro = 1; micro < accum; micro++)
            g_assert_cmpuint(freed[micro], >, last[micro]);
        /* nothing of it live in the op-order walk up to micro-step 0's head */
        double live = s->state_bytes[ZP_MEM_GRADS];
        for (guint i = 0; i < first_op(s, ZP_OP_COMPUTE, ZP_COMP_HEAD, 0); i++)
            if (zp_sched_op(s, i)->sub == ZP_MEM_GRADS)
                live += zp_sched_op(s, i)->kind == ZP_OP_ALLOC ? zp_sched_op(s, i)->bytes
                        : zp_sched_op(s, i)->kind == ZP_OP_FREE ? -zp_sched_op(s, i)->bytes
                                                                : 0;
        g_assert_cmpfloat(live, ==, 0);
        zp_sched_free(s);
    }
    /* none at stage 3, under optimizer offload, or in the paper's schedule */
    for (int k = 0; k < 3; k++) {
        ZpPlan p;
        zp_plan_defaults(&p, k == 0 ? 3 : 2, 8, 1);
        p.grad_accum = 3;
        p.impl = k == 2 ? ZP_IMPL_PAPER : ZP_IMPL_DEEPSPEED;
        if (k == 1)
            p.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
        ZpSchedule *s = zp_sched_build(&m, &p, NULL);
        g_assert_nonnull(s);
        g_assert_cmpuint(first_op(s, ZP_OP_ALLOC, ZP_MEM_GRADS, -1), ==, s->ops->len);
        zp_sched_free(s);
    }
}

/* The op-order walk's live bytes of category `cat` just before op `end`. */
static double live_before(const ZpSchedule *s, ZpMemCategory cat, guint end)
{
    double live = s->state_bytes[cat];
    for (guint i = 0; i < end; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->sub == cat && (op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE))
            live += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
    }
    return live;
}

/* Stage 1 with accumulation (stage_1_and_2.py, contiguous_gradients): autograd's full
 * gradients are taken in micro-step 0's backward, a unit's before the op producing them, and
 * dropped as the last micro-step's reductions copy them into the ipg buffer; those copy this
 * rank's params_in_partition out into grads_in_partition (copy_grads_in_partition), taken at
 * the first reduction, stage 2's size, and kept through the step, where the full gradients
 * are gone. Without
 * contiguous_gradients the full gradients are the state, as under the paper's semantics. */
static void test_deepspeed_stage1_grads(void)
{
    const ZpModel m = tu_load_model("gpt2-1.5b");
    ZpPlan p;
    zp_plan_defaults(&p, 2, 8, 1);
    p.zero.reduce_bucket_size = 3e7;
    p.grad_accum = 3;
    ZpSchedule *two = zp_sched_build(&m, &p, NULL);
    const double gip = zp_sched_op(two, first_op(two, ZP_OP_ALLOC, ZP_MEM_GRADS, 0))->bytes;
    p.zero.stage = 1;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    const double full = (double)s->total_elems * 2, L = (double)m.layers;
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_GRADS], ==, 0);
    /* a unit's before the op producing them: the head's (and tied wte's) at the head */
    const guint head = first_op(s, ZP_OP_COMPUTE, ZP_COMP_HEAD, 0);
    g_assert_cmpfloat(live_before(s, ZP_MEM_GRADS, head), ==,
                      (double)(s->unit_elems[0] + s->unit_elems[(int)L + 1]) * 2);
    g_assert_cmpfloat(live_before(s, ZP_MEM_GRADS, first_op(s, ZP_OP_COMPUTE, ZP_COMP_EMBED_FWD,
                                                            1)), ==, full);
    const guint reduced = first_op(s, ZP_OP_COLLECTIVE, ZP_COLL_ALLREDUCE, 2);
    guint copied = reduced;
    while (copied > 0 && !(zp_sched_op(s, copied)->kind == ZP_OP_ALLOC &&
                           zp_sched_op(s, copied)->sub == ZP_MEM_GRADS))
        copied--;
    g_assert_cmpint(zp_sched_op(s, copied)->unit, ==, -1);
    g_assert_cmpfloat(zp_sched_op(s, copied)->bytes, ==, gip);
    g_assert_cmpfloat(live_before(s, ZP_MEM_GRADS, copied), ==, full);
    g_assert_cmpuint(first_op(s, ZP_OP_ALLOC, ZP_MEM_GRADS, 1), ==, s->ops->len);
    /* at the step: grads_in_partition alone */
    const guint step = first_op(s, ZP_OP_COMPUTE, ZP_COMP_OPTIMIZER, -1);
    g_assert_cmpfloat(live_before(s, ZP_MEM_GRADS, step), ==, gip);
    g_assert_cmpfloat(live_before(s, ZP_MEM_GRADS, s->ops->len), ==, 0);
    zp_sched_free(s);
    zp_sched_free(two);
    for (int k = 0; k < 2; k++) {
        p.zero.contiguous_gradients = k == 1;
        p.impl = k == 0 ? ZP_IMPL_DEEPSPEED : ZP_IMPL_PAPER;
        s = zp_sched_build(&m, &p, NULL);
        g_assert_cmpfloat(s->state_bytes[ZP_MEM_GRADS], ==, (double)s->padded_elems * 2);
        g_assert_cmpuint(first_op(s, ZP_OP_ALLOC, ZP_MEM_GRADS, -1), ==, s->ops->len);
        zp_sched_free(s);
    }
}

/* Stage 3's ipg buffer: stage3.py __init__ allocates one bucket.buffer of reduce_bucket_size
 * and keeps it, so the schedule takes it once, before the step's first op, and gives it back
 * after its last, however many micro-steps reduce through it. */
static void test_deepspeed_stage3_ipg_buffer(void)
{
    const ZpModel m = tu_load_model("gpt2-1.5b");
    for (int accum = 1; accum <= 2; accum++) {
        ZpPlan p;
        zp_plan_defaults(&p, 3, 8, 1);
        p.zero.reduce_bucket_size = 3e7;
        p.grad_accum = accum;
        ZpSchedule *s = zp_sched_build(&m, &p, NULL);
        const double bytes = 3e7 * 2;
        g_assert_cmpuint(count_allocs(s, ZP_MEM_BUCKETS, -1, bytes), ==, 1);
        const guint at = first_op(s, ZP_OP_ALLOC, ZP_MEM_BUCKETS, -1);
        g_assert_cmpfloat(zp_sched_op(s, at)->bytes, ==, bytes);
        g_assert_cmpuint(at, <, first_op(s, ZP_OP_COMPUTE, ZP_COMP_EMBED_FWD, 0));
        const ZpOp *last = zp_sched_op(s, s->ops->len - 1);
        g_assert_true(last->kind == ZP_OP_FREE && last->sub == ZP_MEM_BUCKETS &&
                      last->buffer == zp_sched_op(s, at)->buffer);
        zp_sched_free(s);
    }
}

/* Checks every unpack of s as partition_parameters.py _all_gather_dtype and
 * AllGatherCoalescedHandle.wait lay it out: it follows its call's all-gather into a flat
 * buffer of the parameters' padded partitions and allocates each parameter's own elements;
 * the flat buffer is freed after it. Returns the unpacks, and in *spanning those whose flat
 * buffer outlives a compute op (a prefetch for later modules). */
static guint check_unpacks(const ZpSchedule *s, guint *spanning)
{
    guint unpacks = 0;
    *spanning = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_UNPACK)
            continue;
        unpacks++;
        const uint32_t *deps = zp_sched_deps(s, op);
        const ZpOp *coll = zp_sched_op(s, deps[0]);
        g_assert_cmpint(coll->kind, ==, ZP_OP_COLLECTIVE);
        g_assert_cmpint(coll->sub, ==, ZP_COLL_ALLGATHER);
        g_assert_cmpuint(op->n_deps, >=, 3); /* a lone parameter is gathered in its buffer */
        double padded = 0, own = 0;
        for (uint32_t k = 1; k < op->n_deps; k++) {
            const ZpOp *alloc = zp_sched_op(s, deps[k]);
            g_assert_cmpint(alloc->kind, ==, ZP_OP_ALLOC);
            g_assert_cmpint(alloc->sub, ==, ZP_MEM_GATHERED_PARAMS);
            own += alloc->bytes;
            padded += (double)zp_mem_padded_elems((uint64_t)alloc->bytes / 2,
                                                  (uint64_t)s->plan.dp) * 2;
        }
        g_assert_cmpfloat(coll->bytes, ==, padded);
        g_assert_cmpfloat(coll->elems * 2.0, ==, padded);
        g_assert_cmpfloat(op->mem_bytes, ==, 2 * own);
        const guint freed = free_of(s, coll->buffer, i);
        g_assert_cmpuint(freed, <, s->ops->len);
        g_assert_cmpfloat(zp_sched_op(s, freed)->bytes, ==, padded);
        for (guint k = i + 1; k < freed; k++)
            if (zp_sched_op(s, k)->kind == ZP_OP_COMPUTE &&
                zp_sched_op(s, k)->stream == ZP_STREAM_COMPUTE) {
                (*spanning)++;
                break;
            }
    }
    return unpacks;
}

/* Checks every stage-3 fetch all-reduce of s as partition_parameters.py _all_gather_coalesced
 * lays it out under use_all_reduce_for_fetch_params: a zeroed buffer of the call's padded
 * sizes allocated just before it, freed later whole, and no unpack. The data-parallel bytes
 * are `gathered`'s (those of the same plan all-gathering; < 0: unchecked) plus a second ring
 * pass of each all-reduce. Returns the all-reduces. */
static guint check_fetch_allreduces(const ZpSchedule *s, double gathered)
{
    guint n = 0;
    double extra = 0;
    const double dp = s->plan.dp;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        g_assert_false(op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK && gathered >= 0);
        if (op->kind != ZP_OP_COLLECTIVE || op->sub != ZP_COLL_ALLREDUCE ||
            op->group != ZP_GROUP_DP)
            continue;
        n++;
        g_assert_true(zp_sched_coll_fetches(s, op));
        g_assert_cmpfloat(op->bytes, ==, op->elems * 2.0);
        const ZpOp *alloc = zp_sched_op(s, zp_sched_deps(s, op)[0]);
        g_assert_cmpint(alloc->kind, ==, ZP_OP_ALLOC);
        g_assert_cmpint(alloc->sub, ==, ZP_MEM_GATHERED_PARAMS);
        g_assert_cmpint(alloc->buffer, ==, op->buffer);
        g_assert_cmpfloat(alloc->bytes, ==, op->bytes);
        const guint freed = free_of(s, op->buffer, i);
        g_assert_cmpuint(freed, <, s->ops->len);
        g_assert_cmpfloat(zp_sched_op(s, freed)->bytes, ==, op->bytes);
        extra += (dp - 1) / dp * op->bytes;
    }
    if (gathered >= 0)
        g_assert_cmpfloat(fabs(zp_sched_comm_bytes(s, ZP_GROUP_DP) - (gathered + extra)), <=,
                          1e-9 * gathered);
    return n;
}

/* DeepSpeed's stage 3 gathers with one coalesced all-gather per fetch_sub_module call: the
 * current module's missing parameters, then everything it prefetches, one parameter of the
 * queue at a time (partitioned_param_coordinator.py __all_gather_params_ ->
 * all_gather_coalesced). gpt-1t on 1024 GPUs with checkpointing: fc1's bias (4h = 102400
 * elements) is above the persistence threshold (1e5). In forward and recompute the module
 * before fc1 (ln2, persistent) prefetches fc1's weight alone (it overshoots the 5e7 bucket),
 * and fc1 then fetches its bias alone; in backward fc2's gathered weight (4h^2) leaves no room
 * under stage3_max_live_parameters (1e9) to prefetch, so fc1 fetches weight and bias in one
 * call of two, the flat buffer freed as soon as both are copied out: one such call per block.
 * Every other call holds one parameter, gathered into its own padded buffer. The bytes sent
 * are the per-parameter gathers', so 1,260.75 GB for gpt3-175b stays
 * (test_deepspeed_stage3_bytes). On tiny with a prefetch bucket of 20000 a prefetch gathers
 * parameters of later modules in one call, whose buffer lives until the last of them is
 * waited for. */
static void test_deepspeed_coalesced(void)
{
    const ZpModel m = tu_load_model("gpt-1t");
    ZpSchedule *s = build(&m, ZP_IMPL_DEEPSPEED, 3, 1024, TRUE);
    const double h = 25600, fc1 = 4 * h * h + 4 * h;
    guint spanning;
    g_assert_cmpuint(check_unpacks(s, &spanning), ==, 128);
    g_assert_cmpuint(spanning, ==, 0);
    guint coalesced = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK)
            coalesced += zp_sched_op(s, zp_sched_deps(s, op)[0])->kind == ZP_OP_COLLECTIVE &&
                         zp_sched_op(s, zp_sched_deps(s, op)[0])->elems == fc1;
    }
    g_assert_cmpuint(coalesced, ==, 128);
    zp_sched_free(s);

    ZpModel tiny = tu_load_model("tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 2, 1);
    p.zero.stage3_param_persistence_threshold = 1000;
    p.zero.stage3_prefetch_bucket_size = 20000;
    p.zero.stage3_max_live_parameters = 40000;
    p.zero.stage3_max_reuse_distance = 10000;
    s = zp_sched_build(&tiny, &p, NULL);
    const guint calls = check_unpacks(s, &spanning);
    g_assert_cmpuint(calls, >, 0);
    g_assert_cmpuint(spanning, >, 0);
    const double sent = zp_sched_comm_bytes(s, ZP_GROUP_DP);
    zp_sched_free(s);
    /* stage3_use_all_reduce_for_fetch_params: every coalesced call all-reduces its zeroed flat
     * buffer instead (twice the ring's bytes), read in place: no unpack; qwZ keeps gathering. */
    p.zero.stage3_use_all_reduce_for_fetch_params = TRUE;
    s = zp_sched_build(&tiny, &p, NULL);
    g_assert_cmpuint(check_fetch_allreduces(s, sent), ==, calls);
    zp_sched_free(s);
    p.zero.zero_quantized_weights = TRUE;
    s = zp_sched_build(&tiny, &p, NULL);
    g_assert_cmpuint(check_fetch_allreduces(s, -1), ==, 0);
    zp_sched_free(s);
    p.zero.zero_quantized_weights = FALSE;
    /* stage3_allgather_sequential: each parameter its own all-gather, the same bytes. */
    p.zero.stage3_allgather_sequential = TRUE;
    s = zp_sched_build(&tiny, &p, NULL);
    g_assert_cmpuint(check_unpacks(s, &spanning), ==, 0);
    g_assert_cmpuint(check_fetch_allreduces(s, sent), ==, 0);
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_DP), ==, sent);
    zp_sched_free(s);
}

/* Bytes of gathered parameters live at once, walking the ops in list order. */
static double gathered_peak(const ZpSchedule *s)
{
    double own[ZP_MEM_N];
    tu_sequential_peak(s, NULL, own);
    return own[ZP_MEM_GATHERED_PARAMS];
}

static gboolean block_op(const ZpOp *op)
{
    return op->kind == ZP_OP_COMPUTE && (op->sub == ZP_COMP_BLOCK_FWD ||
                                         op->sub == ZP_COMP_RECOMPUTE ||
                                         op->sub == ZP_COMP_BLOCK_BWD);
}

/* The block ops of a schedule in list order. */
static GArray *block_ops(const ZpSchedule *s)
{
    GArray *out = g_array_new(FALSE, FALSE, sizeof(ZpOp));
    for (guint i = 0; i < s->ops->len; i++)
        if (block_op(zp_sched_op(s, i)))
            g_array_append_val(out, *zp_sched_op(s, i));
    return out;
}

static void assert_sums_to(double parts, double whole)
{
    g_assert_cmpfloat(fabs(parts - whole), <=, 1e-12 * whole);
}

/* DeepSpeed's stage 3 computes a block module by module (parameter_offload.py's hooks around
 * each module; partitioned_param_coordinator.py fetch_sub_module / release_sub_module): six
 * ops per block forward, recompute and backward, ln1 qkv proj ln2 fc1 fc2 and backward the
 * reverse, for GPT-2 and the Llama family (fused qkv, gate and up in fc1), whose FLOPs,
 * attention FLOPs and bytes sum to the block op's that a whole-block schedule has (the
 * plan's block_compute, zreal's), with the block's typical GEMM; the same bytes sent, the
 * same tensor-parallel sums, and no more gathered parameters live at once. */
static void test_deepspeed_module_ops(void)
{
    const char *models[] = {"gpt2-124m", "llama-tiny"};
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++)
        for (int mp = 1; mp <= 2; mp++)
            for (int ckpt = 0; ckpt <= 1; ckpt++) {
                const ZpModel m = tu_load_model(models[mi]);
                ZpPlan p;
                zp_plan_defaults(&p, 3, 4, mp);
                p.checkpoint = ckpt;
                p.grad_accum = 2;
                ZpSchedule *split = zp_sched_build(&m, &p, NULL);
                p.block_compute = TRUE;
                ZpSchedule *whole = zp_sched_build(&m, &p, NULL);
                g_assert_nonnull(split);
                g_assert_nonnull(whole);
                GArray *a = block_ops(split), *b = block_ops(whole);
                const guint blocks = (guint)m.layers * 2 * (ckpt ? 3 : 2);
                g_assert_cmpuint(b->len, ==, blocks);
                g_assert_cmpuint(a->len, ==, ZP_MOD_N * blocks);
                for (guint k = 0; k < b->len; k++) {
                    const ZpOp *w = &g_array_index(b, ZpOp, k);
                    g_assert_cmpint(zp_op_module(w), ==, -1);
                    double flops = 0, attn = 0, mem = 0;
                    for (int j = 0; j < ZP_MOD_N; j++) {
                        const ZpOp *o = &g_array_index(a, ZpOp, k * ZP_MOD_N + j);
                        g_assert_cmpint(o->sub, ==, w->sub);
                        g_assert_cmpint(o->unit, ==, w->unit);
                        g_assert_cmpint(o->micro, ==, w->micro);
                        g_assert_cmpint(zp_op_module(o), ==,
                                        zp_step_module(w->sub == ZP_COMP_BLOCK_BWD, j));
                        g_assert_cmpfloat(o->gemm_flops, ==, w->gemm_flops);
                        flops += o->flops, attn += o->attn_flops, mem += o->mem_bytes;
                    }
                    assert_sums_to(flops, w->flops);
                    assert_sums_to(attn, w->attn_flops);
                    assert_sums_to(mem, w->mem_bytes);
                }
                g_array_unref(a);
                g_array_unref(b);
                for (int g = ZP_GROUP_DP; g <= ZP_GROUP_TP; g++)
                    g_assert_cmpfloat(zp_sched_comm_bytes(split, g), ==,
                                      zp_sched_comm_bytes(whole, g));
                g_test_message("%s mp %d ckpt %d: gathered peak %.0f against %.0f whole",
                               models[mi], mp, ckpt, gathered_peak(split), gathered_peak(whole));
                g_assert_cmpfloat(gathered_peak(split), <=, gathered_peak(whole));
                zp_sched_free(split);
                zp_sched_free(whole);
            }
}

/* The compute op a gradient collective was launched after (its one compute dependency). */
static const ZpOp *launched_after(const ZpSchedule *s, const ZpOp *coll)
{
    const ZpOp *after = NULL;
    for (uint32_t d = 0; d < coll->n_deps; d++) {
        const ZpOp *x = zp_sched_op(s, zp_sched_deps(s, coll)[d]);
        if (x->kind == ZP_OP_COMPUTE) {
            g_assert_null(after);
            after = x;
        }
    }
    g_assert_nonnull(after);
    return after;
}

/* Where DeepSpeed's hooks launch the bucket starting at flat offset lo: after the backward op
 * of the module that hands on the tensor just below it (a block's module op, the head, the
 * embedding's backward), the last bucket after the embedding's backward. Checks `after`. */
static void assert_launch_point(const ZpSchedule *s, const GArray *tensors, uint64_t lo,
                                const ZpOp *after)
{
    const int L = (int)s->model.layers;
    guint x = 0, first = 0;
    while (x + 1 < tensors->len && g_array_index(tensors, ZpImplTensor, x + 1).offset < lo)
        x++;
    const ZpImplTensor *next = lo > 0 ? &g_array_index(tensors, ZpImplTensor, x) : NULL;
    if (!next || next->unit == 0) {
        g_assert_cmpint(after->sub, ==, ZP_COMP_EMBED_BWD);
        return;
    }
    if (next->unit == L + 1) {
        g_assert_cmpint(after->sub, ==, ZP_COMP_HEAD);
        return;
    }
    while (g_array_index(tensors, ZpImplTensor, first).unit != next->unit)
        first++;
    g_assert_cmpint(after->sub, ==, ZP_COMP_BLOCK_BWD);
    g_assert_cmpint(after->unit, ==, next->unit);
    g_assert_cmpint(zp_op_module(after), ==,
                    next->module - g_array_index(tensors, ZpImplTensor, first).module);
}

/* tiny's DeepSpeed buckets on 4 ranks: a plan at `stage` with overlap_comm `overlap`,
 * reduce_bucket_size `bucket`, `accum` micro-steps and every parameter partitioned. */
static ZpPlan bucket_plan(int stage, int overlap, double bucket, int accum)
{
    ZpPlan p;
    zp_plan_defaults(&p, stage, 4, 1);
    p.zero.overlap_comm = overlap;
    p.zero.reduce_bucket_size = bucket;
    p.zero.stage3_param_persistence_threshold = 0;
    p.grad_accum = accum;
    return p;
}

/* Bucket launch timing. DeepSpeed reduces a bucket in the hook of the first gradient that
 * does not fit it (stage_1_and_2.py and stage3.py reduce_independent_p_g_buckets_and_remove_
 * grads): at stages 2-3, and 1 with overlap_comm, a block's backward is one op per module and
 * each bucket's reduction follows the op of the module handing on the tensor below it; stage
 * 1 without overlap_comm reduces after the whole backward (reduce_gradients), its blocks
 * whole. On tiny with
 * reduce_bucket_size 64 (each norm's weight and bias are buckets of their own, through one
 * ipg buffer) gradients wait for the buffer in workspace buffers of their own, each freed
 * once a reduction has read the buffer; two buffers (overlap_comm at stage 2) hold them all.
 * The paper launches after the lowest unit's whole block op, with no module op and no wait. */
static void test_deepspeed_bucket_launch(void)
{
    const ZpModel m = tu_load_model("tiny");
    const int L = (int)m.layers;
    static const double sizes[] = {64, 3000};
    for (int impl = 0; impl < 2; impl++)
        for (int stage = 1; stage <= 3; stage++)
            for (int overlap = 0; overlap <= 1; overlap++)
                for (size_t z = 0; z < G_N_ELEMENTS(sizes); z++) {
                    ZpPlan p = bucket_plan(stage, overlap, sizes[z], 2);
                    p.impl = impl ? ZP_IMPL_PAPER : ZP_IMPL_DEEPSPEED;
                    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
                    g_assert_nonnull(s);
                    GArray *tensors = zp_impl_tensors(s);
                    const gboolean hooks = !impl && (stage >= 2 || overlap);
                    const ZpCollKind kind = zp_impl_get(p.impl)->grad_collective(&p);
                    guint launches = 0, waits = 0, modules = 0;
                    for (guint i = 0; i < s->ops->len; i++) {
                        const ZpOp *op = zp_sched_op(s, i);
                        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_BLOCK_BWD)
                            modules += zp_op_module(op) >= 0;
                        if (op->kind == ZP_OP_FREE && op->sub == ZP_MEM_WORKSPACE &&
                            op->micro >= 0 && op->unit >= 0 && op->unit <= L) {
                            /* not the head's logits nor the step's copies: a waiting
                             * gradient, freed once the host has issued the reduction that
                             * empties its buffer (zp_sched.c land_waits): after the
                             * compute op that reduction follows, listed after it */
                            const uint32_t host = zp_sched_deps(s, op)[0];
                            g_assert_cmpint(zp_sched_op(s, host)->kind, ==, ZP_OP_COMPUTE);
                            guint j = i;
                            while (j > host && !(zp_sched_op(s, j)->kind == ZP_OP_COLLECTIVE &&
                                                 zp_sched_op(s, j)->sub == kind))
                                j--;
                            g_assert_cmpuint(j, >, host);
                            waits++;
                        }
                        if (op->kind != ZP_OP_COLLECTIVE || op->group != ZP_GROUP_DP ||
                            op->sub != kind || op->micro < 0)
                            continue;
                        const ZpOp *after = launched_after(s, op);
                        launches++;
                        if (hooks)
                            assert_launch_point(s, tensors, op->elem_offset, after);
                        else if (!impl)
                            g_assert_cmpint(after->sub, ==, ZP_COMP_EMBED_BWD);
                        else
                            g_assert_cmpint(zp_op_module(after), ==, -1);
                    }
                    const guint backwards = stage >= 2 ? 2 : 1;
                    g_test_message("%s stage %d overlap %d bucket %.0f: %u launches, %u waits",
                                   zp_impl_name(p.impl), stage, overlap, sizes[z], launches,
                                   waits);
                    g_assert_cmpuint(launches, >, impl ? 0 : backwards * 4);
                    g_assert_cmpuint(modules, ==, hooks ? 2 * L * ZP_MOD_N : 0);
                    /* waits: one ipg buffer at stages 2-3 with a 64-element bucket */
                    const gboolean one_buffer = stage == 3 || !overlap;
                    if (!impl && stage >= 2 && sizes[z] == 64 && one_buffer)
                        g_assert_cmpuint(waits, >, 0);
                    if (impl || stage == 1 || sizes[z] > 64)
                        g_assert_cmpuint(waits, ==, 0);
                    g_array_unref(tensors);
                    zp_sched_free(s);
                }
}

/* Stage 3 fills a bucket by the parameters' ds_numel (stage3.py
 * reduce_independent_p_g_buckets_and_remove_grads), and its reduce-scatter sends them padded
 * to the group (reduce_scatter_coalesced). tiny on 3 ranks, reduce_bucket_size 128: the final
 * norm's weight and bias (64 elements each, 66 padded) fill one bucket exactly, sent as 132
 * elements (counted padded, 132 > 128, they would be two); a parameter larger than a bucket
 * (fc1's or fc2's weight, 16,384 elements) is reduced from its own gradient of 16,384
 * elements through a concatenation copy of 16,386, and in place on 4 ranks. */
static void test_deepspeed_stage3_bucket_numel(void)
{
    const ZpModel m = tu_load_model("tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 3, 1);
    p.zero.reduce_bucket_size = 128;
    p.zero.stage3_param_persistence_threshold = 0;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    g_assert_nonnull(s);
    GArray *specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    zp_impl_deepspeed.plan_buckets(s, specs);
    const ZpBucketSpec *k = (const ZpBucketSpec *)specs->data;
    const int L = (int)m.layers;
    g_assert_cmpint(k[0].top_unit, ==, L + 1);
    g_assert_cmpuint(k[0].hi - k[0].lo, ==, 128);
    g_assert_cmpfloat(k[0].bytes, ==, 132 * 2);
    g_assert_false(k[0].bypass);
    g_assert_cmpuint(k[1].hi - k[1].lo, ==, 64); /* fc2's bias alone: its weight does not fit */
    g_assert_true(k[2].bypass);
    g_assert_cmpuint(k[2].hi - k[2].lo, ==, 16384);
    g_assert_cmpfloat(k[2].bytes, ==, 16386 * 2);
    for (guint i = 0; i < specs->len; i++)
        g_assert_true(k[i].bypass || k[i].hi - k[i].lo <= 128);
    /* fc1's and fc2's weights of the last block: each gradient, then its padded copy */
    g_assert_cmpuint(count_allocs(s, ZP_MEM_BUCKETS, L, 16384 * 2), ==, 2);
    g_assert_cmpuint(count_allocs(s, ZP_MEM_BUCKETS, L, 16386 * 2), ==, 2);
    g_array_unref(specs);
    zp_sched_free(s);
    /* On 4 ranks they need no padding: each is reduced in place, with no copy (a lone tensor
     * of numel % world 0 in reduce_scatter_coalesced); a bucket of two tensors is copied. */
    p.dp = 4;
    s = zp_sched_build(&m, &p, NULL);
    g_assert_nonnull(s);
    g_assert_cmpuint(count_allocs(s, ZP_MEM_BUCKETS, L, 16384 * 2), ==, 2);
    g_assert_cmpuint(count_allocs(s, ZP_MEM_BUCKETS, L + 1, 128 * 2), ==, 1);
    zp_sched_free(s);
}

/* One peak for DeepSpeed's reductions: `simulate` (so `memory`) and the schedule walked in
 * list order (zreal's) agree exactly, every category at the peak and every category's own
 * peak too, on zreal's tiny plans with 4 ranks (bf16, micro-batch 4, its backend workspace
 * listed), reduce_bucket_size 64 (gradients waiting for the ipg buffer) and 3,000, with and
 * without overlap_comm, over one and two micro-steps. What a reduction reads is freed once the
 * host has issued it (ZpImpl frees_at_issue); freed once it had run, the simulator held it
 * beside the next module's buffers, 256 bytes above zreal at stage 3 (issue 14). */
static void test_deepspeed_reduction_peak(void)
{
    ZpModel m = tu_load_model("tiny");
    m.dropout = FALSE;
    static const double sizes[] = {64, 3000};
    for (int stage = 2; stage <= 3; stage++)
        for (int accum = 1; accum <= 2; accum++)
            for (int overlap = 0; overlap <= 1; overlap++)
                for (size_t z = 0; z < G_N_ELEMENTS(sizes); z++) {
                    ZpPlan p = bucket_plan(stage, overlap, sizes[z], accum);
                    p.precision = ZP_PREC_BF16;
                    p.micro_batch = 4;
                    p.backend_workspace = TRUE;
                    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
                    g_assert_nonnull(s);
                    SimResult *r = simulate(s);
                    g_test_message("stage %d, %d micro-step(s), overlap %d, bucket %.0f", stage,
                                   accum, overlap, sizes[z]);
                    assert_peaks_in_list_order(s, r);
                    sim_result_free(r);
                    zp_sched_free(s);
                }
}

/* The end of the last collective of micro-step `micro` and the start of micro-step micro + 1's
 * first compute op, on rank 0 of a simulation with a timeline. */
static void micro_boundary(const ZpSchedule *s, const SimResult *r, int micro, double *coll_end_s,
                           double *next_start_s)
{
    *coll_end_s = 0, *next_start_s = -1;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COLLECTIVE && op->micro == micro)
            *coll_end_s = MAX(*coll_end_s, r->op_end_s[i]);
        if (op->kind == ZP_OP_COMPUTE && op->micro == micro + 1 && *next_start_s < 0)
            *next_start_s = r->op_start_s[i];
    }
}

/* DeepSpeed's stage 1-2 epilogue with overlap_comm synchronises the device
 * (stage_1_and_2.py independent_gradient_partition_epilogue: get_accelerator().synchronize()
 * before _release_ipg_buffers), so micro-step 1's forward starts only once micro-step 0's
 * last reduction has ended (stage 1 reduces at the last micro-step only: nothing to wait
 * for). Tiny, 4 ranks, reduce_bucket_size 64, on the A100 profile's kernel
 * rates: without the wait the next forward ran beside the reductions and held micro-step 0's
 * two ipg buffers beside micro-step 1's, 256 bytes above zreal's list-order peak. */
static void test_deepspeed_epilogue_sync(void)
{
    ZpModel m = tu_load_model("tiny");
    m.dropout = FALSE;
    ZpHw hw;
    g_assert_true(zp_hw_load("dgx-a100-80g", &hw, NULL));
    for (int stage = 1; stage <= 2; stage++) {
        ZpPlan p = bucket_plan(stage, 1, 64, 2);
        p.precision = ZP_PREC_BF16;
        p.micro_batch = 4;
        ZpSchedule *s = zp_sched_build(&m, &p, NULL);
        g_assert_nonnull(s);
        SimOptions options = {.record_timeline = TRUE};
        GError *error = NULL;
        SimResult *r = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        double coll_end_s, next_start_s;
        micro_boundary(s, r, 0, &coll_end_s, &next_start_s);
        g_test_message("stage %d: micro-step 0's reductions end %.3g us, micro-step 1 starts "
                       "%.3g us", stage, 1e6 * coll_end_s, 1e6 * next_start_s);
        g_assert_cmpfloat(next_start_s, >=, coll_end_s);
        sim_result_free(r);
        zp_sched_free(s);
    }
}

/* Each module op waits for its own module's gather only: gpt3-175b on 64 GPUs gathers every
 * weight by a call of its own (biases and norms are persistent), so a module op depends on at
 * most one all-gather, of its own module's weight, and a norm on none; the gathered
 * parameters live at once (in list order) drop from 6.04 to 3.45 GB. */
static void test_deepspeed_module_waits(void)
{
    const ZpModel m = tu_load_model("gpt3-175b");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 64, 1);
    p.checkpoint = TRUE;
    ZpSchedule *s = zp_sched_build(&m, &p, NULL);
    GArray *tensors = zp_impl_tensors(s);
    guint waits = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (!block_op(op))
            continue;
        g_assert_cmpint(zp_op_module(op), >=, 0);
        /* the module's first tensor, its weight: the unit's k-th module's */
        const ZpImplTensor *w = NULL;
        int first = -1;
        for (guint t = 0; t < tensors->len && !w; t++) {
            const ZpImplTensor *x = &g_array_index(tensors, ZpImplTensor, t);
            if (x->unit == op->unit && first < 0)
                first = x->module;
            if (x->unit == op->unit && x->module == first + zp_op_module(op))
                w = x;
        }
        g_assert_nonnull(w);
        guint gathers = 0;
        for (uint32_t d = 0; d < op->n_deps; d++) {
            const ZpOp *dep = zp_sched_op(s, zp_sched_deps(s, op)[d]);
            if (dep->kind == ZP_OP_COLLECTIVE && dep->sub == ZP_COLL_ALLGATHER) {
                g_assert_cmpuint(dep->elem_offset, ==, w->offset);
                gathers++;
            }
            /* the one call of two: the embedding's prefetch of wpe and block 1's qkv */
            if (dep->kind == ZP_OP_COMPUTE && dep->sub == ZP_COMP_UNPACK) {
                g_assert_cmpint(op->unit, ==, 1);
                g_assert_cmpint(zp_op_module(op), ==, ZP_MOD_QKV);
                gathers++;
            }
        }
        const gboolean norm = zp_op_module(op) == ZP_MOD_LN1 || zp_op_module(op) == ZP_MOD_LN2;
        g_assert_cmpuint(gathers, <=, norm ? 0 : 1);
        waits += gathers;
    }
    g_assert_cmpuint(waits, >, 0);
    const double split = gathered_peak(s);
    zp_sched_free(s);
    p.block_compute = TRUE;
    s = zp_sched_build(&m, &p, NULL);
    g_test_message("gathered peak %.4g GB against %.4g GB whole", split / GB,
                   gathered_peak(s) / GB);
    g_assert_cmpfloat(split, <, gathered_peak(s));
    zp_sched_free(s);
    g_array_unref(tensors);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/impl/deepspeed-stage12-bytes", test_deepspeed_stage12_bytes);
    g_test_add_func("/impl/deepspeed-stage3-bytes", test_deepspeed_stage3_bytes);
    g_test_add_func("/impl/deepspeed-bucket-buffers", test_deepspeed_bucket_buffers);
    g_test_add_func("/impl/deepspeed-coalesced-gathers", test_deepspeed_coalesced);
    g_test_add_func("/impl/deepspeed-module-ops", test_deepspeed_module_ops);
    g_test_add_func("/impl/deepspeed-module-waits", test_deepspeed_module_waits);
    g_test_add_func("/impl/deepspeed-bucket-launch", test_deepspeed_bucket_launch);
    g_test_add_func("/impl/deepspeed-stage3-bucket-numel", test_deepspeed_stage3_bucket_numel);
    g_test_add_func("/impl/deepspeed-reduction-peak", test_deepspeed_reduction_peak);
    g_test_add_func("/impl/deepspeed-epilogue-sync", test_deepspeed_epilogue_sync);
    g_test_add_func("/impl/deepspeed-grad-copy", test_deepspeed_grad_copy);
    g_test_add_func("/impl/deepspeed-stage3-ipg-buffer", test_deepspeed_stage3_ipg_buffer);
    g_test_add_func("/impl/deepspeed-stage1-grads", test_deepspeed_stage1_grads);
    return g_test_run();
}
