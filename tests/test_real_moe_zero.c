/* test_real_moe_zero: zreal under mpirun trains the tiny mixture of experts (4 experts, top 2)
 * with its experts over EP ranks and ZeRO over dp / EP for them: the loss follows the one-rank
 * run, and every rank's bytes on each group and every memory category are the schedule's;
 * zplan validate compares a run with simulate's prediction. */
#include "real_zero_common.h"
#include "zp_impl.h"

#define MOE_MODEL "moe-tiny"
#define MOE_STEPS 6
#define MOE_BATCH 8   /* samples a step over all ranks */
#define NO_DROPS "2"  /* capacity factor E / k: no copy dropped, whatever the split */

/* The plan zreal builds from these flags, for the schedule's figures. */
static ZpSchedule *moe_schedule_buckets(int stage, int ranks, int ep, gboolean checkpoint,
                                        int accum, ZpImplKind impl, double bucket_elems,
                                        gboolean overlap);

static ZpSchedule *moe_schedule_impl(int stage, int ranks, int ep, gboolean checkpoint,
                                     int accum, ZpImplKind impl)
{
    return moe_schedule_buckets(stage, ranks, ep, checkpoint, accum, impl, 0, FALSE);
}

/* The same with reduce_bucket_size `bucket_elems` (0: the default) and overlap_comm on or not
 * (the default: off below stage 3). */
static ZpSchedule *moe_schedule_buckets(int stage, int ranks, int ep, gboolean checkpoint,
                                        int accum, ZpImplKind impl, double bucket_elems,
                                        gboolean overlap)
{
    ZpModel model;
    g_assert_true(zp_model_load(MOE_MODEL, &model, NULL));
    model.dropout = FALSE;
    ZpPlan plan;
    zp_plan_defaults(&plan, stage, ranks, 1);
    plan.impl = impl;
    plan.precision = ZP_PREC_BF16;
    plan.attention = ZP_ATTN_EAGER;
    plan.micro_batch = MOE_BATCH / ranks / accum;
    plan.grad_accum = accum;
    plan.zero.stage3_param_persistence_threshold = 0;
    plan.experts.ep = ep;
    plan.experts.capacity_factor = atof(NO_DROPS);
    plan.checkpoint = checkpoint;
    if (bucket_elems > 0)
        plan.zero.reduce_bucket_size = bucket_elems;
    if (overlap)
        plan.zero.overlap_comm = TRUE;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&model, &plan, &error);
    g_assert_no_error(error);
    return s;
}

static ZpSchedule *moe_schedule_run(int stage, int ranks, int ep, gboolean checkpoint,
                                    int accum)
{
    return moe_schedule_impl(stage, ranks, ep, checkpoint, accum, ZP_IMPL_PAPER);
}

static ZpSchedule *moe_schedule(int stage, int ranks, int ep)
{
    return moe_schedule_run(stage, ranks, ep, FALSE, 1);
}

/* MOE_BATCH samples a step over `ranks` ranks in `accum` micro-steps, under `impl`. */
static json_t *moe_train_impl(int stage, int ranks, int ep, gboolean checkpoint, int accum,
                              ZpImplKind impl, const char *name)
{
    char *args = g_strdup_printf("--model " MOE_MODEL " --stage %d --micro-batch %d "
                                 "--grad-accum %d --ep %d --capacity-factor " NO_DROPS
                                 " --steps %d --persistence-threshold 0 --impl %s%s",
                                 stage, MOE_BATCH / ranks / accum, accum, ep, MOE_STEPS,
                                 zp_impl_name(impl), checkpoint ? " --checkpoint" : "");
    json_t *m = zreal_measured(ranks, args, name);
    g_free(args);
    return m;
}

static json_t *moe_train_run(int stage, int ranks, int ep, gboolean checkpoint, int accum,
                             const char *name)
{
    return moe_train_impl(stage, ranks, ep, checkpoint, accum, ZP_IMPL_PAPER, name);
}

static json_t *moe_train(int stage, int ranks, int ep, const char *name)
{
    return moe_train_run(stage, ranks, ep, FALSE, 1, name);
}

/* Each rank's bytes on the dp, EP and EDP groups and every memory category but the backend's
 * workspace (its run-long x, dx and GEMM staging, which no schedule lists) are the schedule's
 * exactly: the model states, the all-to-all buffers and the saved activations included. */
static void assert_exact(json_t *m, const ZpSchedule *s, int ranks)
{
    double peak[ZP_MEM_N];
    tu_sequential_peak(s, NULL, peak);
    json_t *rs = json_object_get(m, "ranks");
    g_assert_cmpuint(json_array_size(rs), ==, (size_t)ranks);
    for (int r = 0; r < ranks; r++) {
        json_t *rank = json_array_get(rs, r);
        g_assert_cmpfloat(number_at(rank, "model_state_bytes"), ==,
                          zp_sched_model_state_bytes(s));
        for (int c = 0; c < ZP_MEM_N; c++)
            if (c != ZP_MEM_WORKSPACE)
                g_assert_cmpfloat(category(rank, zp_sched_mem_name(c)), ==, peak[c]);
        /* dp's bytes hold its subgroup's, the experts' reductions (as hpZ's) */
        g_assert_cmpfloat(number_at(rank, "comm_bytes"), ==,
                          zp_sched_comm_bytes(s, ZP_GROUP_DP) +
                              zp_sched_comm_bytes(s, ZP_GROUP_EDP));
        json_t *moe = json_object_get(rank, "moe_comm_bytes");
        g_assert_cmpfloat(number_at(moe, "ep"), ==, zp_sched_comm_bytes(s, ZP_GROUP_EP));
        g_assert_cmpfloat(number_at(moe, "edp"), ==, zp_sched_comm_bytes(s, ZP_GROUP_EDP));
    }
}

typedef struct {
    int ranks, ep;
    ZpImplKind impl;
    int top_stage; /* the grid's stages: 0 to top_stage */
} Grid;

/* Stages 0-3 at `ranks` ranks and EP `ep`: each run's loss within LOSS_REL_TOL of the one-rank
 * run's at every step, and its figures the schedule's. */
static void test_grid(gconstpointer data)
{
    const Grid *g = data;
    json_t *ref = moe_train(0, 1, 1, "moe_ref.json");
    json_t *ref_loss = json_object_get(ref, "loss");
    const double first = json_number_value(json_array_get(ref_loss, 0));
    const double last = json_number_value(json_array_get(ref_loss, MOE_STEPS - 1));
    g_assert_cmpfloat(fabs(first - log(256.0)), <, 0.15); /* untrained: ln V */
    g_assert_cmpfloat(last, <, 0.97 * first);             /* and it learns */
    for (int stage = 0; stage <= g->top_stage; stage++) {
        json_t *m = moe_train_impl(stage, g->ranks, g->ep, FALSE, 1, g->impl, "moe_run.json");
        json_t *loss = json_object_get(m, "loss");
        for (int i = 0; i < MOE_STEPS; i++) {
            const double a = json_number_value(json_array_get(loss, i));
            const double b = json_number_value(json_array_get(ref_loss, i));
            g_assert_cmpfloat(fabs(a - b) / b, <=, LOSS_REL_TOL);
        }
        ZpSchedule *s = moe_schedule_impl(stage, g->ranks, g->ep, FALSE, 1, g->impl);
        assert_exact(m, s, g->ranks);
        /* The all-to-alls moved something at EP > 1: four a sparse layer and step. */
        g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EP), >, 0);
        zp_sched_free(s);
        json_decref(m);
    }
    json_decref(ref);
}

/* With activation checkpointing: the forward keeps each block's input, the recomputed forward
 * repeats the experts and both all-to-alls (six a sparse layer and step); the loss is the
 * one-rank run's, the figures (checkpoints included) the schedule's. */
static void test_checkpointed(void)
{
    json_t *ref = moe_train(0, 1, 1, "moe_ref.json");
    json_t *ref_loss = json_object_get(ref, "loss");
    for (int stage = 0; stage <= 3; stage += 3) {
        json_t *m = moe_train_run(stage, 2, 2, TRUE, 1, "moe_ckpt.json");
        json_t *loss = json_object_get(m, "loss");
        for (int i = 0; i < MOE_STEPS; i++) {
            const double a = json_number_value(json_array_get(loss, i));
            const double b = json_number_value(json_array_get(ref_loss, i));
            g_assert_cmpfloat(fabs(a - b) / b, <=, LOSS_REL_TOL);
        }
        ZpSchedule *s = moe_schedule_run(stage, 2, 2, TRUE, 1);
        assert_exact(m, s, 2);
        ZpSchedule *plain = moe_schedule(stage, 2, 2);
        g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EP), ==,
                          1.5 * zp_sched_comm_bytes(plain, ZP_GROUP_EP));
        zp_sched_free(plain);
        zp_sched_free(s);
        json_decref(m);
    }
    json_decref(ref);
}

/* Two micro-steps a step on 4 ranks at EP 2: below stage 2 the paper's expert gradients
 * accumulate whole and are all-reduced over EDP once, from stage 2 each micro-step's are
 * reduce-scattered from their bucket and added into the partition; under DeepSpeed's plug-in
 * at stages 2-3 likewise beside its own accumulation (grads_in_partition's copy, stage 3's
 * partition); the loss is the one-rank run's, the figures the schedule's. */
typedef struct {
    ZpImplKind impl;
    int stages[2];
} Accum;

static void test_grad_accum(gconstpointer data)
{
    const Accum *a = data;
    json_t *ref = moe_train(0, 1, 1, "moe_ref.json");
    json_t *ref_loss = json_object_get(ref, "loss");
    for (int k = 0; k < 2; k++) {
        const int stage = a->stages[k];
        json_t *m = moe_train_impl(stage, 4, 2, FALSE, 2, a->impl, "moe_accum.json");
        json_t *loss = json_object_get(m, "loss");
        for (int i = 0; i < MOE_STEPS; i++) {
            const double x = json_number_value(json_array_get(loss, i));
            const double y = json_number_value(json_array_get(ref_loss, i));
            g_assert_cmpfloat(fabs(x - y) / y, <=, LOSS_REL_TOL);
        }
        ZpSchedule *s = moe_schedule_impl(stage, 4, 2, FALSE, 2, a->impl);
        assert_exact(m, s, 4);
        zp_sched_free(s);
        json_decref(m);
    }
    json_decref(ref);
}

/* DeepSpeed's stage 2 with the experts in the ipg buckets (stage_1_and_2.py
 * reduce_independent_p_g_buckets_and_remove_grads, average_tensor) at reduce_bucket_size
 * 30,000 on moe-tiny at EP 2 over 4 ranks, one micro-step a step, then two with overlap_comm: from the last gradient down, head and ln_f (16,448;
 * unit 2's 24,576 expert elements would pass the limit), unit 2's experts with its router, ln2
 * and proj, its qkv and ln1, unit 1's experts with the same three, the rest: buckets whose
 * experts come first, gradients waiting for the ipg buffer, a dense all-reduce over dp and an
 * expert one over EDP out of one bucket. The loss is the one-rank run's, every figure the
 * schedule's. */
static void test_ipg_buckets(void)
{
    json_t *ref = moe_train(0, 1, 1, "moe_ref.json");
    json_t *ref_loss = json_object_get(ref, "loss");
    /* one micro-step with one ipg buffer; two with overlap_comm's pair */
    for (int accum = 1; accum <= 2; accum++) {
        const gboolean overlap = accum == 2;
        char *args = g_strdup_printf("--model " MOE_MODEL " --stage 2 --micro-batch %d "
                                     "--grad-accum %d --ep 2 --capacity-factor " NO_DROPS
                                     " --steps %d --persistence-threshold 0 --impl deepspeed "
                                     "--reduce-bucket-size 30000%s",
                                     MOE_BATCH / 4 / accum, accum, MOE_STEPS,
                                     overlap ? " --overlap" : "");
        json_t *m = zreal_measured(4, args, "moe_ipg.json");
        g_free(args);
        json_t *loss = json_object_get(m, "loss");
        for (int i = 0; i < MOE_STEPS; i++) {
            const double x = json_number_value(json_array_get(loss, i));
            const double y = json_number_value(json_array_get(ref_loss, i));
            g_assert_cmpfloat(fabs(x - y) / y, <=, LOSS_REL_TOL);
        }
        ZpSchedule *s =
            moe_schedule_buckets(2, 4, 2, FALSE, accum, ZP_IMPL_DEEPSPEED, 30000, overlap);
        GArray *experts = zp_impl_bucket_experts(s);
        g_assert_nonnull(experts);
        guint on_top = 0;
        for (guint i = 0; i < experts->len; i++)
            on_top += g_array_index(experts, ZpBucketExperts, i).on_top;
        g_assert_cmpuint(on_top, ==, 2);
        g_array_unref(experts);
        assert_exact(m, s, 4);
        g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EDP), >, 0);
        zp_sched_free(s);
        json_decref(m);
    }
    json_decref(ref);
}

/* zplan validate on one case: simulate's prediction and zreal's measurement agree exactly on
 * the model states, the peaks of the buffers the engine allocates as the schedule says, and
 * the bytes on the dp, EP and EDP groups. */
static void test_validate(void)
{
    char *pred = g_strdup_printf("%s/moe-pred.json", tmp_dir);
    char *meas = g_strdup_printf("%s/moe-meas.json", tmp_dir);
    /* (a GPU's profile: the times differ, the bytes and buffers may not) */
    TuRun r = tu_zplan("simulate --model " MOE_MODEL " --cluster dgx-a100-80g --gpus 4 --ep 2 "
                       "--capacity-factor " NO_DROPS " --stage 1 --micro-batch 2 --precision bf16 "
                       "--attention eager --impl paper --no-dropout --persistence-threshold 0 "
                       "--json");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_true(g_file_set_contents(pred, r.out, -1, NULL));
    tu_free(&r);
    json_t *m = moe_train(1, 4, 2, "moe-meas.json");
    g_assert_cmpint(json_dump_file(m, meas, 0), ==, 0);
    json_decref(m);
    char *args = g_strdup_printf("validate %s %s --json", pred, meas);
    r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    json_t *report = json_loads(r.out, 0, NULL), *rows = json_object_get(report, "rows");
    int exact = 0;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        const char *q = json_string_value(json_object_get(row, "quantity"));
        const double p = json_number_value(json_object_get(row, "predicted"));
        const double v = json_number_value(json_object_get(row, "measured"));
        static const char *const same[] = {
            "model states", "bytes sent per rank", "bytes sent per rank (ep)",
            "bytes sent per rank (edp)", "peak params", "peak grads", "peak master",
            "peak ep_buffers", "peak activations"};
        for (size_t k = 0; k < G_N_ELEMENTS(same); k++)
            if (strcmp(q, same[k]) == 0) {
                g_assert_cmpfloat(p, ==, v);
                exact++;
            }
    }
    g_assert_cmpint(exact, ==, 9);
    json_decref(report);
    tu_free(&r);
    g_remove(pred), g_remove(meas);
    g_free(pred), g_free(meas), g_free(args);
}

/* One process emulating rank 1 of 4 at EP 2 (its EP and EDP groups emulated too) holds and
 * sends what the schedule says, as the real rank does: stage 2, whose expert gradients go
 * through their bucket and the EDP reduce-scatter. */
static void test_emulated_rank(void)
{
    char *path = g_strdup_printf("%s/moe-emulated.json", tmp_dir);
    json_t *m = tu_zreal_measured(0, "--model " MOE_MODEL " --emulate 4 --rank 1 --ep 2 "
                                     "--capacity-factor " NO_DROPS " --stage 2 --micro-batch 2 "
                                     "--steps 2 --persistence-threshold 0", path);
    ZpSchedule *s = moe_schedule(2, 4, 2);
    assert_exact(m, s, 1);
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EDP), >, 0);
    zp_sched_free(s);
    json_decref(m);
    g_free(path);
}

/* What zreal's sparse block does not run is refused in one line each. */
static void test_refusals(void)
{
    static const struct {
        const char *args, *message;
    } cases[] = {
        {"--model " MOE_MODEL " --ep 2 --steps 1", "--capacity-factor"},
        {"--model " MOE_MODEL " --ep 3 --capacity-factor 2 --steps 1", "does not divide"},
        {"--model tiny --ep 2 --steps 1", "is not a mixture of experts"},
        /* the framework plug-ins (real_engine_fw.h) do not run a sparse block, and FSDP2
         * has no expert parallelism to schedule */
        {"--model " MOE_MODEL " --ep 2 --capacity-factor 2 --impl megatron --steps 1",
         "--impl paper or deepspeed only"},
        {"--model " MOE_MODEL " --ep 2 --capacity-factor 2 --impl fsdp2 --stage 3 --steps 1",
         "no expert parallelism"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *err = NULL;
        g_assert_false(g_spawn_check_wait_status(mpirun(2, cases[i].args, &err), NULL));
        g_assert_nonnull(strstr(err, cases[i].message));
        g_free(err);
    }
    /* DeepSpeed's stage 1 keeps the expert gradients as the EDP partition, which holds no
     * earlier micro-step's whole gradients */
    char *err = NULL;
    g_assert_false(g_spawn_check_wait_status(
        mpirun(4, "--model " MOE_MODEL " --ep 2 --capacity-factor 2 --impl deepspeed --stage 1 "
                  "--micro-batch 1 --grad-accum 2 --steps 1", &err), NULL));
    g_assert_nonnull(strstr(err, "--grad-accum 1"));
    g_free(err);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    real_zero_common_init();
    static const Grid two_ep2 = {2, 2, ZP_IMPL_PAPER, 3}, four_ep4 = {4, 4, ZP_IMPL_PAPER, 3},
                      four_ep2 = {4, 2, ZP_IMPL_PAPER, 3};
    g_test_add_data_func("/zreal-moe/2-ranks-ep-2", &two_ep2, test_grid);
    g_test_add_data_func("/zreal-moe/4-ranks-ep-4", &four_ep4, test_grid);
    g_test_add_data_func("/zreal-moe/4-ranks-ep-2", &four_ep2, test_grid);
    /* DeepSpeed-MoE under its framework's own ZeRO (real_engine_ds) */
    static const Grid ds_two_ep2 = {2, 2, ZP_IMPL_DEEPSPEED, 3},
                      ds_four_ep2 = {4, 2, ZP_IMPL_DEEPSPEED, 3};
    g_test_add_data_func("/zreal-moe/deepspeed/2-ranks-ep-2", &ds_two_ep2, test_grid);
    g_test_add_data_func("/zreal-moe/deepspeed/4-ranks-ep-2", &ds_four_ep2, test_grid);
    g_test_add_func("/zreal-moe/deepspeed/ipg-buckets", test_ipg_buckets);
    g_test_add_func("/zreal-moe/checkpointed", test_checkpointed);
    static const Accum accum_paper = {ZP_IMPL_PAPER, {1, 3}},
                       accum_ds = {ZP_IMPL_DEEPSPEED, {2, 3}};
    g_test_add_data_func("/zreal-moe/grad-accum", &accum_paper, test_grad_accum);
    g_test_add_data_func("/zreal-moe/deepspeed/grad-accum", &accum_ds, test_grad_accum);
    g_test_add_func("/zreal-moe/validate", test_validate);
    g_test_add_func("/zreal-moe/emulated-rank", test_emulated_rank);
    g_test_add_func("/zreal-moe/refusals", test_refusals);
    return real_zero_common_run();
}
