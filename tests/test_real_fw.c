/* test_real_fw: zreal running the frameworks that lay the model states out their own way
 * (real_engine_fw.h's plug-ins: Megatron-Core's DDP and distributed optimizer) at 1, 2 and 4
 * ranks: every rank's bytes sent, model states, total peak and every category are the
 * schedule's exactly, and the losses the one-rank run's. */
#include "real_zero_common.h"

/* One run: tiny, the global batch over n ranks, 4 steps. bucket: reduce_bucket_size with
 * overlap_comm (Megatron's overlap_grad_reduce: buckets of that many elements), 0: without
 * (one bucket). */
typedef struct {
    ZpImplKind impl;
    int stage, ranks, accum;
    double bucket;
    gboolean checkpoint;
    const char *reduce_dtype; /* --reduce-dtype, NULL: the implementation's default */
    int hpz;                  /* FSDP2's reshard_after_forward=int (hpZ's group), 0: none */
    int mp;                   /* tensor parallelism (Megatron's split), 0: none */
    const char *model;        /* NULL: tiny */
    gboolean param_gather;    /* Megatron's overlap_param_gather */
} FwRun;

static const char *fw_model(const FwRun *r)
{
    return r->model ? r->model : "tiny";
}

/* Data-parallel ranks of a run. */
static int fw_dp(const FwRun *r)
{
    return r->ranks / MAX(r->mp, 1);
}

#define FW_STEPS 4

static char *fw_args(const FwRun *r)
{
    char *bucket = r->bucket > 0
                       ? g_strdup_printf(" --overlap --reduce-bucket-size %.0f", r->bucket)
                       : g_strdup("");
    char *args = g_strdup_printf("--model %s --impl %s --stage %d --micro-batch %d "
                                 "--grad-accum %d --steps %d%s%s%s%s --hpz-partition-size %d "
                                 "--mp %d%s", fw_model(r), zp_impl_name(r->impl), r->stage,
                                 GLOBAL_BATCH / fw_dp(r) / r->accum, r->accum, FW_STEPS, bucket,
                                 r->checkpoint ? " --checkpoint" : "",
                                 r->reduce_dtype ? " --reduce-dtype " : "",
                                 r->reduce_dtype ? r->reduce_dtype : "", MAX(r->hpz, 1),
                                 MAX(r->mp, 1), r->param_gather ? " --overlap-param-gather" : "");
    g_free(bucket);
    return args;
}

/* The run's schedule with zreal's CPU workspace listed (real_zero_common.h peak_schedule). */
static ZpSchedule *fw_schedule(const FwRun *r)
{
    ZpModel model = tu_load_model(fw_model(r));
    model.dropout = FALSE;
    ZpPlan plan;
    zp_plan_defaults(&plan, r->stage, fw_dp(r), MAX(r->mp, 1));
    plan.impl = r->impl;
    plan.precision = ZP_PREC_BF16;
    zp_impl_plan_defaults(&plan); /* as zreal's plan: Megatron's fp32 main_grad */
    if (r->reduce_dtype)
        g_assert_true(zp_reduce_dtype_parse(r->reduce_dtype, "--reduce-dtype", &plan.reduce_dtype,
                                            NULL));
    plan.micro_batch = GLOBAL_BATCH / fw_dp(r) / r->accum;
    plan.grad_accum = r->accum;
    plan.checkpoint = r->checkpoint;
    plan.zero.zero_hpz_partition_size = MAX(r->hpz, 1);
    plan.overlap_param_gather = r->param_gather;
    plan.backend_workspace = TRUE;
    if (r->bucket > 0) {
        plan.zero.overlap_comm = TRUE;
        plan.zero.reduce_bucket_size = r->bucket;
    }
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&model, &plan, &error);
    g_assert_no_error(error);
    return s;
}

/* Each rank of the measured run against the schedule walked in list order: the model
 * states, the total peak, every category at it and every category's own peak, the bytes
 * sent; the losses against the reference's. */
static void check_run(const FwRun *r, json_t *ref_loss, const char *path)
{
    char *args = fw_args(r);
    json_t *m = tu_zreal_measured(r->ranks, args, path);
    json_t *loss = json_object_get(m, "loss");
    g_assert_cmpuint(json_array_size(loss), ==, FW_STEPS);
    for (size_t i = 0; i < FW_STEPS; i++) {
        const double a = json_number_value(json_array_get(loss, i));
        const double b = json_number_value(json_array_get(ref_loss, i));
        g_assert_cmpfloat(fabs(a - b) / b, <=, LOSS_REL_TOL);
    }
    ZpSchedule *s = fw_schedule(r);
    double own[ZP_MEM_N], at[ZP_MEM_N];
    const double peak = tu_sequential_peak(s, at, own);
    /* and the simulator's timeline of the same schedule (real_zero_common.h) */
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    const SimOptions o = {.mode = SIM_MODE_FOLDED};
    GError *error = NULL;
    SimResult *sim = sim_engine_run(s, &hw, &o, &error);
    g_assert_no_error(error);
    json_t *ranks = json_object_get(m, "ranks");
    g_assert_cmpuint(json_array_size(ranks), ==, (size_t)r->ranks);
    for (int q = 0; q < r->ranks; q++) {
        json_t *rank = json_array_get(ranks, q);
        /* the rank's own optimizer states (Megatron's: its parameters' elements in its
         * shard, zp_impl_opt_elems), held all run: every figure lower by the difference */
        double mine[ZP_MEM_N], less[ZP_MEM_N], less_total = 0;
        zp_sched_rank_state_bytes(s, q / MAX(r->mp, 1), mine);
        for (int c = 0; c < ZP_MEM_N; c++)
            less_total += less[c] = s->state_bytes[c] - mine[c];
        g_assert_cmpfloat(number_at(rank, "model_state_bytes"), ==,
                          zp_sched_model_state_bytes(s) - less_total);
        /* hpZ's group's bytes count in the data-parallel communicator's total */
        g_assert_cmpfloat(number_at(rank, "comm_bytes"), ==,
                          zp_sched_comm_bytes(s, ZP_GROUP_DP) +
                              zp_sched_comm_bytes(s, ZP_GROUP_HPZ));
        g_assert_cmpfloat(number_at(rank, "tp_comm_bytes"), ==,
                          zp_sched_comm_bytes(s, ZP_GROUP_TP));
        g_assert_cmpfloat(number_at(rank, "peak_memory_bytes"), ==, peak - less_total);
        g_assert_cmpfloat(sim->peak_memory_bytes, ==, peak);
        json_t *breakdown = json_object_get(rank, "peak_breakdown");
        for (int c = 0; c < ZP_MEM_N; c++) {
            g_assert_cmpfloat(number_at(breakdown, zp_sched_mem_name(c)), ==, at[c] - less[c]);
            g_assert_cmpfloat(category(rank, zp_sched_mem_name(c)), ==, own[c] - less[c]);
            g_assert_cmpfloat(sim->peak_breakdown_bytes[c], ==, at[c]);
            g_assert_cmpfloat(sim->category_peak_bytes[c], ==, own[c]);
        }
        if (less_total > 0)
            g_test_message("rank %d holds %.0f bytes of optimizer states less than the most",
                           q, less_total);
    }
    sim_result_free(sim);
    g_test_message("%s: %s stage %d, %d rank(s), %d micro-step(s), bucket %.0f, reduce %s%s, "
                   "hpz %d, mp %d: %.0f bytes sent a rank, model states %.0f, peak %.0f, "
                   "loss %.4f",
                   fw_model(r), zp_impl_name(r->impl), r->stage, r->ranks, r->accum, r->bucket,
                   zp_reduce_dtype_name(s->plan.reduce_dtype),
                   r->checkpoint ? ", checkpointing" : "", r->hpz, MAX(r->mp, 1),
                   zp_sched_comm_bytes(s, ZP_GROUP_DP) + zp_sched_comm_bytes(s, ZP_GROUP_HPZ),
                   zp_sched_model_state_bytes(s), peak,
                   json_number_value(json_array_get(loss, FW_STEPS - 1)));
    zp_sched_free(s);
    json_decref(m);
    g_free(args);
}

/* The one-rank reference: the paper's stage 0 (of `model`, NULL: tiny). */
static json_t *reference(const char *path, const char *model)
{
    const FwRun one = {ZP_IMPL_PAPER, 0, 1, 1, 0, FALSE, NULL, 0, 0, model, FALSE};
    char *args = fw_args(&one);
    json_t *ref = tu_zreal_measured(1, args, path);
    g_free(args);
    return ref;
}

/* Each of runs[0..n) against one rank's reference run of tiny. */
static void check_runs(const FwRun *runs, size_t n)
{
    char *path = g_strdup_printf("%s/fw.json", tmp_dir);
    json_t *ref = reference(path, NULL);
    json_t *ref_loss = json_object_get(ref, "loss");
    for (size_t k = 0; k < n; k++)
        check_run(&runs[k], ref_loss, path);
    json_decref(ref);
    g_free(path);
}

/* Megatron-Core (real_engine_megatron.c): DDP (stage 0: each bucket all-reduced in place in
 * main_grad) and the distributed optimizer (stage 1: param_data and main_grad padded, each
 * bucket reduce-scattered into this rank's shard, Adam on the shard bucket by bucket, the
 * updated shards all-gathered in place bucket by bucket). main_grad in fp32 (its default
 * under bf16: grad_reduce_in_fp32, backward accumulating into it in fp32, fp32 sums) at
 * every stage, rank count and bucket size: one bucket (no overlap_grad_reduce), 3000
 * elements (a few per block) and 64 (a tensor each, each padded at its end to
 * lcm(dp, 128): 1,024 elements of padding, which param_data, main_grad and the shards hold
 * and the collectives send); in bf16 (--reduce-dtype bf16) with the step's fp32 copy of the
 * shard's gradients; two micro-steps, whose gradients main_grad sums before the last one's
 * reduction; TP 2 x DP 2; and overlap_param_gather, the updated shards all-gathered bucket by
 * bucket in the next step's forward (before each bucket's first module) instead. */
static void test_megatron(void)
{
    char *path = g_strdup_printf("%s/fw.json", tmp_dir);
    json_t *ref = reference(path, NULL);
    json_t *ref_loss = json_object_get(ref, "loss");
    static const double buckets[] = {0, 3000, 64};
    for (int stage = 0; stage <= 1; stage++)
        for (int n = 1; n <= 4; n *= 2)
            for (size_t k = 0; k < G_N_ELEMENTS(buckets); k++) {
                const FwRun r = {ZP_IMPL_MEGATRON, stage, n, 1, buckets[k], FALSE, NULL,
                                 0, 0, NULL, FALSE};
                check_run(&r, ref_loss, path);
            }
    static const FwRun others[] = {
        {ZP_IMPL_MEGATRON, 1, 2, 1, 64, FALSE, "bf16", 0, 0, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 1, 4, 1, 64, FALSE, "bf16", 0, 0, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 0, 4, 1, 3000, FALSE, "bf16", 0, 0, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 1, 4, 2, 3000, FALSE, "bf16", 0, 0, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 1, 4, 2, 3000, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 1, 4, 1, 3000, FALSE, NULL, 0, 2, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 0, 4, 1, 3000, FALSE, NULL, 0, 2, NULL, FALSE},
        {ZP_IMPL_MEGATRON, 1, 4, 1, 3000, FALSE, NULL, 0, 0, NULL, TRUE},
        {ZP_IMPL_MEGATRON, 1, 2, 2, 64, FALSE, NULL, 0, 0, NULL, TRUE},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(others); k++)
        check_run(&others[k], ref_loss, path);
    json_decref(ref);
    g_free(path);
}

/* FSDP2 (real_engine_fsdp2.c) at reshard_after_forward=True (stage 3): each unit
 * all-gathered from its fp32 shards cast into the flat output, copied out per parameter,
 * gathered again for backward (and for the recompute with checkpointing), its gradients
 * copied into the reduce-scatter's input and reduced into the fp32 sharded gradients (added
 * at a second micro-step), Adam on the fp32 shards with no 16-bit copy; and at
 * reshard_after_forward=2 on 4 ranks (the schedule's hpZ group): after each block's forward
 * each rank keeps half of its unsharded parameters (the post-forward shard, taken then and
 * freed once backward's gather inside its pair has read it, each micro-step; none for the
 * root), also with two micro-steps and with checkpointing. */
static void test_fsdp2(void)
{
    static const FwRun runs[] = {
        {ZP_IMPL_FSDP2, 3, 1, 1, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 2, 1, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 4, 1, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 4, 2, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 2, 1, 0, TRUE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 4, 1, 0, FALSE, NULL, 2, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 4, 2, 0, FALSE, NULL, 2, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 4, 1, 0, TRUE, NULL, 2, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 3, 4, 1, 0, FALSE, NULL, 0, 2, NULL, FALSE},
    };
    check_runs(runs, G_N_ELEMENTS(runs));
}

/* FSDP2 at reshard_after_forward=False (--stage 2; zp_impl_normalize_plan): the fp32 shards
 * at rest as at True, each block all-gathered once a micro-step in its forward and held to
 * its backward (no backward gather), its gradients reduce-scattered every micro-step, no
 * post-step all-gather: one rank, 2 ranks, 4 ranks with two micro-steps, 2 ranks with
 * checkpointing (the recompute reads the held block). zreal refused it before. */
static void test_fsdp2_no_reshard(void)
{
    static const FwRun runs[] = {
        {ZP_IMPL_FSDP2, 2, 1, 1, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 2, 2, 1, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 2, 4, 2, 0, FALSE, NULL, 0, 0, NULL, FALSE},
        {ZP_IMPL_FSDP2, 2, 2, 1, 0, TRUE, NULL, 0, 0, NULL, FALSE},
    };
    check_runs(runs, G_N_ELEMENTS(runs));
}

/* llama-tiny (RMSNorm, SwiGLU, rotary, no biases, an untied head): Megatron's distributed
 * optimizer and FSDP2 at 2 ranks, whose embedding unit is one parameter, copied out of its
 * all-gather's output as every call is (foreach_all_gather_copy_out). */
static void test_llama(void)
{
    char *path = g_strdup_printf("%s/fw.json", tmp_dir);
    json_t *ref = reference(path, "llama-tiny");
    json_t *ref_loss = json_object_get(ref, "loss");
    static const FwRun runs[] = {
        {ZP_IMPL_MEGATRON, 1, 2, 1, 3000, FALSE, NULL, 0, 0, "llama-tiny", FALSE},
        {ZP_IMPL_FSDP2, 3, 2, 1, 0, FALSE, NULL, 0, 0, "llama-tiny", FALSE},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(runs); k++)
        check_run(&runs[k], ref_loss, path);
    json_decref(ref);
    g_free(path);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    real_zero_common_init();
    g_test_add_func("/zreal/megatron", test_megatron);
    g_test_add_func("/zreal/fsdp2", test_fsdp2);
    g_test_add_func("/zreal/fsdp2-no-reshard", test_fsdp2_no_reshard);
    g_test_add_func("/zreal/fw-llama", test_llama);
    return real_zero_common_run();
}
