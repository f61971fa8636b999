/* real_zero_common: zreal under mpirun, its measured.json and the total-peak runs, shared by the
 * zreal test programs (real_zero_common.h). */
#include "real_zero_common.h"

char *tmp_dir;

/* Runs `mpirun -np n zreal ARGS` with ZREAL_COMM_TIMEOUT_S = timeout (NULL: unset);
 * returns the exit status, stderr in *err. */
int mpirun_timeout(int n, const char *args, const char *timeout, char **err)
{
    TuRun r = tu_zreal_mpirun(n, args, timeout);
    g_free(r.out);
    *err = r.err;
    return r.status;
}

int mpirun(int n, const char *args, char **err)
{
    return mpirun_timeout(n, args, NULL, err);
}

/* The measured JSON of `mpirun -np n zreal ARGS --out TMP/NAME.json`. */
json_t *zreal_measured(int n, const char *args, const char *name)
{
    char *path = g_strdup_printf("%s/%s.json", tmp_dir, name);
    json_t *root = tu_zreal_measured(n, args, path);
    g_free(path);
    return root;
}

double category(json_t *rank, const char *name)
{
    return json_number_value(json_object_get(json_object_get(rank, "category_peak_bytes"), name));
}

/* Runs build/zreal ARGS as one process (no mpirun), which must succeed, and returns the
 * measured.json it wrote to `path`. */
double number_at(json_t *object, const char *key)
{
    json_t *value = json_object_get(object, key);
    g_assert_true(json_is_number(value));
    return json_number_value(value);
}

int peak_ranks(const PeakRun *p)
{
    return p->ranks > 0 ? p->ranks : 4;
}

/* A PeakRun's plan, with zreal's CPU backend workspace listed (its run-long x, dx, staging
 * and GEMM buffers, each op's own, the logits: what `zplan simulate` lists for a profile
 * calibrated on that backend). */
ZpSchedule *peak_schedule(const PeakRun *p)
{
    ZpModel model = tu_load_model("tiny");
    model.dropout = FALSE;
    ZpPlan plan;
    zp_plan_defaults(&plan, p->stage, peak_ranks(p), 1);
    plan.impl = p->impl;
    plan.precision = ZP_PREC_BF16;
    plan.micro_batch = 4;
    plan.grad_accum = MAX(p->accum, 1);
    plan.checkpoint = p->checkpoint;
    if (!p->persistent)
        plan.zero.stage3_param_persistence_threshold = 0;
    if (p->bucket > 0)
        plan.zero.reduce_bucket_size = p->bucket;
    plan.zero.zero_quantized_weights = p->qwz;
    plan.zero.zero_hpz_partition_size = MAX(p->hpz, 1);
    plan.zero.zero_quantized_gradients = p->qgz;
    plan.gpus_per_node = p->per_node;
    if (p->regather)
        plan.zero.stage3_prefetch_bucket_size = plan.zero.stage3_max_reuse_distance = 0;
    plan.backend_workspace = TRUE;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&model, &plan, &error);
    g_assert_no_error(error);
    return s;
}

/* The simulator's result for a PeakRun's plan (peak_schedule). */
SimResult *peak_prediction(const PeakRun *p)
{
    ZpSchedule *s = peak_schedule(p);
    GError *error = NULL;
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    const SimOptions o = {.mode = SIM_MODE_FOLDED};
    SimResult *sim = sim_engine_run(s, &hw, &o, &error);
    g_assert_no_error(error);
    zp_sched_free(s);
    return sim;
}

/* A rank's total peak, every category at that moment and every category's own peak equal the
 * simulator's: no buffer the backend holds is missing from the schedule, and each is live at
 * the same op. */
void check_total_peak(json_t *rank, const SimResult *sim)
{
    json_t *at = json_object_get(rank, "peak_breakdown");
    g_assert_cmpfloat(number_at(rank, "peak_memory_bytes"), ==, sim->peak_memory_bytes);
    for (int c = 0; c < ZP_MEM_N; c++) {
        const char *name = zp_sched_mem_name(c);
        g_assert_cmpfloat(number_at(at, name), ==, sim->peak_breakdown_bytes[c]);
        g_assert_cmpfloat(category(rank, name), ==, sim->category_peak_bytes[c]);
    }
}

char *peak_args(const PeakRun *p)
{
    char *bucket = p->bucket > 0 ? g_strdup_printf(" --reduce-bucket-size %.0f", p->bucket)
                                 : g_strdup("");
    char *zeropp = g_strdup_printf("%s%s%s", p->qwz ? " --quantized-weights" : "",
                                   p->qgz ? " --quantized-gradients" : "",
                                   p->hpz > 1 ? " --hpz-partition-size" : "");
    char *hpz = p->hpz > 1 ? g_strdup_printf(" %d", p->hpz) : g_strdup("");
    char *node = p->per_node > 0 ? g_strdup_printf(" --ranks-per-node %d", p->per_node)
                                 : g_strdup("");
    char *args = g_strdup_printf("--model tiny --stage %d --impl %s --micro-batch 4 --steps 2 "
                                 "--grad-accum %d%s%s%s%s%s%s%s", p->stage, zp_impl_name(p->impl),
                                 MAX(p->accum, 1), p->checkpoint ? " --checkpoint" : "",
                                 p->persistent ? "" : " --persistence-threshold 0", bucket,
                                 zeropp, hpz, node,
                                 p->regather ? " --prefetch-bucket-size 0 --max-reuse-distance 0"
                                             : "");
    g_free(bucket), g_free(zeropp), g_free(hpz), g_free(node);
    return args;
}

void real_zero_common_init(void)
{
    tmp_dir = g_dir_make_tmp("zreal-test-XXXXXX", NULL);
}

int real_zero_common_run(void)
{
    int status = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return status;
}
