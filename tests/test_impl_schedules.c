/* test_impl_schedules: whole schedules of the implementations (planner/zp_impl_*.c): FSDP's,
 * every implementation's balanced at every stage, step copies, tied gradients' waits and
 * persistent refreshes, and `zplan memory` giving `zplan simulate`'s peak for one plan. */
#include "impl_common.h"

/* The step flattens the partition's gradients and converts them to fp32 (stage_1_and_2.py
 * step): at the step's peak the fp32 copy and the 16-bit flat copy are both live. Stage 3
 * builds the fp32 gradient one sub_group_size group at a time. */
static void test_step_copies(void)
{
    const ZpModel m = tu_load_model("gpt2-1.5b");
    ZpPlan p;
    zp_plan_defaults(&p, 2, 2, 1);
    p.checkpoint = TRUE; /* small activations: the step is the peak */
    ZpSchedule *s = build(&m, ZP_IMPL_DEEPSPEED, 2, 2, TRUE);
    const double part = (double)s->partition_elems;
    g_assert_cmpuint(count_allocs(s, ZP_MEM_WORKSPACE, -1, part * 4), ==, 1);
    g_assert_cmpuint(count_allocs(s, ZP_MEM_WORKSPACE, -1, part * 2), ==, 1);
    SimResult *r = simulate(s);
    g_assert_cmpfloat(r->peak_breakdown_bytes[ZP_MEM_WORKSPACE], ==, part * 6);
    sim_result_free(r);
    zp_sched_free(s);
    /* The paper has no step copies. */
    s = build(&m, ZP_IMPL_PAPER, 2, 2, TRUE);
    g_assert_cmpuint(count_allocs(s, ZP_MEM_WORKSPACE, -1, part * 4), ==, 0);
    zp_sched_free(s);
    /* Stage 3: the largest sub-group's fp32 gradient. */
    for (int k = 0; k < 2; k++) {
        zp_plan_defaults(&p, 3, 2, 1);
        p.zero.sub_group_size = k ? 1e8 : 1e9;
        s = zp_sched_build(&m, &p, NULL);
        const double group = fmin(p.zero.sub_group_size, (double)s->partition_elems);
        g_assert_cmpuint(count_allocs(s, ZP_MEM_WORKSPACE, -1, group * 4), ==, 1);
        zp_sched_free(s);
    }
}

/* The index of the first op of kind/sub at micro-step micro from op `from`. */
static guint find_op(const ZpSchedule *s, ZpOpKind kind, int sub, int micro, guint from)
{
    while (from < s->ops->len && !(zp_sched_op(s, from)->kind == kind &&
                                   zp_sched_op(s, from)->sub == sub &&
                                   zp_sched_op(s, from)->micro == micro))
        from++;
    return from;
}

/* A tied LM head's contribution to wte's gradient waits in autograd's input buffer of wte's
 * AccumulateGrad until the embedding's backward adds to it; only then does DeepSpeed's hook
 * copy the sum into the ipg buffer and drop it. gpt2-124m's wte (50257 x 768) is below the
 * 5e8-element bucket, so at stages 2 and 3 each micro-step holds one buffer of wte's
 * 16-bit gradient from before the head to after the embedding's backward. With a bucket
 * below wte, wte's gradient has a bucket of its own from the head on, and no second one;
 * the paper's ZeRO has none. */
static void test_tied_grad_waits(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    for (int stage = 2; stage <= 3; stage++)
        for (int variant = 0; variant < 3; variant++) {
            ZpPlan p;
            zp_plan_defaults(&p, stage, 8, 1);
            p.grad_accum = 2;
            p.impl = variant == 2 ? ZP_IMPL_PAPER : ZP_IMPL_DEEPSPEED;
            if (variant == 1)
                p.zero.reduce_bucket_size = 2e7;
            ZpSchedule *s = zp_sched_build(&m, &p, NULL);
            g_assert_nonnull(s);
            guint waits = 0;
            for (int micro = 0; micro < 2; micro++) {
                const ZpOp *head = zp_sched_op(s, find_op(s, ZP_OP_COMPUTE, ZP_COMP_HEAD, micro, 0));
                const guint embed = find_op(s, ZP_OP_COMPUTE, ZP_COMP_EMBED_BWD, micro, 0);
                for (uint32_t k = 0; k < head->n_deps; k++) {
                    const ZpOp *alloc = zp_sched_op(s, zp_sched_deps(s, head)[k]);
                    if (alloc->kind != ZP_OP_ALLOC || alloc->sub != ZP_MEM_BUCKETS ||
                        alloc->unit != 0)
                        continue;
                    gboolean reduced = FALSE; /* wte's own bucket, not autograd's buffer */
                    for (guint i = 0; i < s->ops->len; i++)
                        reduced |= zp_sched_op(s, i)->kind == ZP_OP_COLLECTIVE &&
                                   zp_sched_op(s, i)->buffer == alloc->buffer;
                    if (reduced)
                        continue;
                    waits++;
                    g_assert_cmpfloat(alloc->bytes, ==, 50257.0 * 768 * s->elem_bytes);
                    g_assert_cmpuint(free_of(s, alloc->buffer, 0), ==, embed + 1);
                }
            }
            g_assert_cmpuint(waits, ==, variant == 0 ? 2 : 0);
            zp_sched_free(s);
        }
}

/* FSDP: no stage 1; FULL_SHARD reduce-scatters one unit at a time and gathers each block
 * twice and the root unit once per micro-step. */
static void test_fsdp(void)
{
    const ZpModel m = tu_load_model("gpt2-1.5b");
    ZpPlan p;
    zp_plan_defaults(&p, 1, 8, 1);
    p.impl = ZP_IMPL_FSDP;
    GError *error = NULL;
    g_assert_null(zp_sched_build(&m, &p, &error));
    g_assert_nonnull(strstr(error->message, "no stage 1"));
    g_clear_error(&error);
    ZpSchedule *s = build(&m, ZP_IMPL_FSDP, 3, 8, FALSE);
    const double root =
        (double)(zp_sched_unit_padded(s, 0) + zp_sched_unit_padded(s, s->n_units - 1));
    double blocks = 0, grads = 0;
    for (int u = 1; u < s->n_units - 1; u++)
        blocks += (double)zp_sched_unit_padded(s, u);
    for (int u = 0; u < s->n_units; u++)
        grads += (double)zp_sched_unit_padded(s, u);
    const double want = (root + 2 * blocks + grads) * 2 * 7.0 / 8;
    g_assert_cmpfloat(fabs(zp_sched_comm_bytes(s, ZP_GROUP_DP) - want), <=, 1e-9 * want);
    guint rs = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        rs += op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_REDUCE_SCATTER;
    }
    g_assert_cmpuint(rs, ==, (guint)s->n_units);
    zp_sched_free(s);
}

/* Every implementation's schedule is well formed at every stage, with and without
 * checkpointing, accumulation and tensor parallelism: the simulator runs it (it refuses a
 * category that goes negative or does not return to the model states at the end) and every
 * unit's gradients are reduced once per reducing backward. */
static void test_schedules_balance(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpHw hw;
    g_assert_true(zp_hw_load("dgx-a100-80g", &hw, NULL));
    for (int impl = 0; impl < ZP_IMPL_N; impl++)
        for (int stage = 0; stage <= 3; stage++)
            for (int variant = 0; variant < 8; variant++) {
                if (!zp_impl_get((ZpImplKind)impl)->has_stage(stage))
                    continue;
                ZpPlan p;
                zp_plan_defaults(&p, stage, 4, variant & 4 ? 2 : 1);
                p.impl = (ZpImplKind)impl;
                p.checkpoint = variant & 1;
                p.grad_accum = variant & 2 ? 3 : 1;
                p.zero.reduce_bucket_size = 2e7; /* several buckets, wte bypassing */
                p.zero.overlap_comm = variant & 1;
                GError *error = NULL;
                ZpSchedule *s = zp_sched_build(&m, &p, &error);
                g_assert_no_error(error);
                SimOptions options = {0};
                SimResult *r = sim_engine_run(s, &hw, &options, &error);
                g_assert_no_error(error);
                sim_result_free(r);
                double reduced = 0;
                GHashTable *size = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL,
                                                         g_free);
                for (guint i = 0; i < s->ops->len; i++) {
                    const ZpOp *op = zp_sched_op(s, i);
                    if (op->kind == ZP_OP_ALLOC)
                        g_hash_table_insert(size, GINT_TO_POINTER(op->buffer),
                                            g_memdup2(&op->bytes, sizeof op->bytes));
                    /* a collective fits the buffer it works in */
                    if (op->kind == ZP_OP_COLLECTIVE && op->buffer >= 0)
                        g_assert_cmpfloat(op->bytes, <=,
                                          *(double *)g_hash_table_lookup(
                                              size, GINT_TO_POINTER(op->buffer)));
                    if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_DP &&
                        op->sub != ZP_COLL_ALLGATHER)
                        reduced += (double)op->elems;
                }
                const double backwards = stage >= 2 ? p.grad_accum : 1;
                g_assert_cmpfloat(reduced, ==, backwards * (double)s->total_elems);
                g_hash_table_unref(size);
                zp_sched_free(s);
            }
}

/* `zplan memory`'s need per stage is what `zplan simulate` judges its fit by: the larger of
 * the live peak and the caching allocator's reserved peak (after an out-of-memory from
 * fragmentation, at least the capacity less the reserve plus the failed request), + reserve,
 * for every stage x implementation x checkpointing over models and GPU counts. */
static void test_memory_is_simulate(void)
{
    const char *models[] = {"gpt2-124m", "gpt2-1.5b", "gpt-13b"};
    const char *impls[] = {"deepspeed", "fsdp", "paper"};
    const int gpus[] = {8, 64};
    ZpHw hw;
    g_assert_true(zp_hw_load("dgx-a100-80g", &hw, NULL));
    guint compared = 0;
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++)
        for (size_t ii = 0; ii < G_N_ELEMENTS(impls); ii++)
            for (int ckpt = 0; ckpt <= 1; ckpt++) {
                char *args = g_strdup_printf("memory --model %s --cluster dgx-a100-80g --gpus "
                                             "8,64 --impl %s --json%s", models[mi], impls[ii],
                                             ckpt ? " --checkpoint" : "");
                TuRun run = tu_zplan(args);
                json_t *mem = json_loads(run.out, 0, NULL);
                g_assert_nonnull(mem);
                tu_free(&run);
                for (size_t gi = 0; gi < G_N_ELEMENTS(gpus); gi++)
                    for (int stage = 0; stage <= 3; stage++) {
                        char key[16];
                        g_snprintf(key, sizeof key, "stage%d", stage);
                        json_t *need = json_object_get(
                            json_object_get(json_array_get(json_object_get(mem, "rows"), gi),
                                            "need_bytes"), key);
                        char *sim_args = g_strdup_printf(
                            "simulate --model %s --cluster dgx-a100-80g --gpus %d --stage %d "
                            "--micro-batch 1 --impl %s --json%s", models[mi], gpus[gi], stage,
                            impls[ii], ckpt ? " --checkpoint" : "");
                        TuRun sim = tu_zplan(sim_args);
                        json_t *r = json_loads(sim.out, 0, NULL);
                        if (json_is_null(need)) { /* a stage the implementation lacks */
                            g_assert_null(r);
                        } else {
                            g_assert_nonnull(r);
                            json_t *ca = json_object_get(r, "caching_allocator");
                            double peak = fmax(
                                json_number_value(json_object_get(r, "peak_memory_bytes")),
                                json_number_value(json_object_get(ca, "peak_reserved_bytes")));
                            if (json_is_true(json_object_get(ca, "oom_fragmented")))
                                peak = fmax(peak, hw.gpu_memory_bytes - hw.runtime_reserve_bytes +
                                                      json_number_value(json_object_get(
                                                          json_object_get(ca, "oom_at"),
                                                          "request_bytes")));
                            g_assert_cmpfloat(json_number_value(need), ==,
                                              peak + hw.runtime_reserve_bytes);
                            compared++;
                        }
                        json_decref(r);
                        tu_free(&sim);
                        g_free(sim_args);
                    }
                json_decref(mem);
                g_free(args);
            }
    g_assert_cmpuint(compared, ==, 3 * 3 * 2 * 2 * 4 - 3 * 2 * 2); /* FSDP has no stage 1 */
}

/* Walks s's refresh of the persistent copies after the optimizer: with `freed`, one free of
 * all of them (buffer -1) before the optimizer, so that none is live at it, and each all-gather
 * into a copy (buffer -1) right after the alloc (buffer -1) of its padded size; otherwise
 * neither. Every refresh is an all-gather of the whole group, unquantised. Returns the
 * refreshes. */
static guint check_refresh(const ZpSchedule *s, gboolean freed)
{
    const double state = s->state_bytes[ZP_MEM_GATHERED_PARAMS];
    double live = state, taken = 0, at_optimizer = -1;
    guint refreshes = 0, frees = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        const gboolean state_op = (op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE) &&
                                  op->buffer < 0;
        if (op->sub == ZP_MEM_GATHERED_PARAMS && op->kind == ZP_OP_ALLOC)
            live += op->bytes;
        if (op->sub == ZP_MEM_GATHERED_PARAMS && op->kind == ZP_OP_FREE)
            live -= op->bytes;
        if (state_op && op->kind == ZP_OP_FREE) {
            frees++;
            g_assert_cmpfloat(op->bytes, ==, state);
        }
        if (state_op && op->kind == ZP_OP_ALLOC)
            taken += op->bytes;
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_OPTIMIZER)
            at_optimizer = live;
        if (op->kind != ZP_OP_COLLECTIVE || op->buffer >= 0 || op->micro >= 0 ||
            op->group != ZP_GROUP_DP)
            continue;
        refreshes++;
        g_assert_cmpint(op->sub, ==, ZP_COLL_ALLGATHER);
        g_assert_cmpfloat(op->bytes, ==, op->elems * 2.0);
        const ZpOp *before = zp_sched_op(s, i - 1);
        g_assert_cmpint(before->kind == ZP_OP_ALLOC && before->buffer < 0, ==, freed);
        if (freed)
            g_assert_cmpfloat(before->bytes, ==, op->bytes);
    }
    g_assert_cmpuint(frees, ==, freed ? 1 : 0);
    g_assert_cmpfloat(taken, ==, freed ? state : 0);
    g_assert_cmpfloat(at_optimizer, >=, 0);
    if (freed) /* nothing else of the category is live at the step */
        g_assert_cmpfloat(at_optimizer, ==, 0);
    return refreshes;
}

/* DeepSpeed's step frees the persistent parameters' full copies (stage3.py step ->
 * _partition_all_parameters) and _post_step gathers each into a new buffer of its padded size
 * (_allgather_params_coalesced), as an all-gather also under use_all_reduce_for_fetch_params
 * and qwZ; the paper refreshes its persistent units in place. Tiny at 2 ranks with a
 * persistence threshold of 1000: the norms' and biases' tensors. */
static void test_persistent_refresh(void)
{
    ZpModel tiny = tu_load_model("tiny");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 2, 1);
    p.zero.stage3_param_persistence_threshold = 1000;
    GArray *kept = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    ZpSchedule *s = zp_sched_build(&tiny, &p, NULL);
    zp_impl_deepspeed.persistent(s, kept);
    g_assert_cmpuint(kept->len, >, 2);
    g_assert_cmpuint(check_refresh(s, TRUE), ==, kept->len);
    zp_sched_free(s);
    p.zero.stage3_use_all_reduce_for_fetch_params = TRUE;
    p.zero.zero_quantized_weights = TRUE;
    s = zp_sched_build(&tiny, &p, NULL);
    g_assert_cmpuint(check_refresh(s, TRUE), ==, kept->len);
    zp_sched_free(s);
    p = (ZpPlan){0};
    zp_plan_defaults(&p, 3, 2, 1);
    p.impl = ZP_IMPL_PAPER;
    p.zero.stage3_param_persistence_threshold = 1e5; /* the embedding and head units */
    s = zp_sched_build(&tiny, &p, NULL);
    g_assert_cmpuint(check_refresh(s, FALSE), >, 0);
    zp_sched_free(s);
    g_array_unref(kept);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/impl/tied-grad-waits", test_tied_grad_waits);
    g_test_add_func("/impl/step-copies", test_step_copies);
    g_test_add_func("/impl/persistent-refresh", test_persistent_refresh);
    g_test_add_func("/impl/fsdp", test_fsdp);
    g_test_add_func("/impl/schedules-balance", test_schedules_balance);
    g_test_add_func("/impl/memory-is-simulate", test_memory_is_simulate);
    return g_test_run();
}
