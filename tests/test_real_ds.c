/* test_real_ds: zreal running DeepSpeed's stages 2 and 3 and FSDP as their sources do them
 * (buckets, small buckets, schedule files, all-reduce fetches, dirty memory), and offload
 * matching the run without it. */
#include "real_zero_common.h"

/* zreal executes DeepSpeed's stages 0-1 (buckets of whole tensors, held ipg buffers of exactly
 * reduce_bucket_size, parameters larger than a bucket reduced in place, the all-reduce of every
 * gradient and the in-place all-gather after the step, the step's flattened and fp32 copies),
 * its stages 2-3 (real_engine_ds: gradients landing tensor by tensor in the held ipg buffer or
 * a large tensor's own bucket, stage 2's grads_in_partition of whole tensors and its second
 * copy with accumulation, stage 3's per-tensor persistence, gathers with prefetch, the live
 * limit and the reuse distance, the recompute's new gathers, the concatenation copy) and
 * FSDP's stages 0, 2 and 3 (a reduction per unit, the root unit gathered for the whole
 * micro-step, no persistent parameters). Each trains as the paper's semantics does, and the
 * bytes it sends and the buffers it allocates are the schedule's, exactly. */
typedef struct {
    ZpImplKind impl;
    int stage, grad_accum;
    gboolean checkpoint;
    double bucket;  /* reduce_bucket_size: small, so that qkv, fc1 and fc2 bypass it */
    gboolean knobs; /* stage 3's: persistence 1000 (norms and biases), prefetch 20000, at
                     * most 40000 live, reuse within 10000 */
} OtherRun;

static char *other_args(const OtherRun *r, int n, gboolean paper, const char *out)
{
    /* The bucket where the implementation has one (FSDP has none: zreal refuses it there) */
    const ZpImplKind kind = paper ? ZP_IMPL_PAPER : r->impl;
    char *bucket = zp_impl_unread_knobs(kind, 1u << ZP_KNOB_REDUCE_BUCKET)
                       ? g_strdup("")
                       : g_strdup_printf(" --reduce-bucket-size %.0f", r->bucket);
    char *args = g_strdup_printf(
        "--model tiny --stage %d --micro-batch %d --grad-accum %d --steps 4%s --impl %s%s%s "
        "--out %s",
        r->stage, GLOBAL_BATCH / n / r->grad_accum, r->grad_accum, bucket,
        paper ? "paper" : zp_impl_name(r->impl), r->checkpoint ? " --checkpoint" : "",
        r->knobs ? " --persistence-threshold 1000 --prefetch-bucket-size 20000"
                   " --max-live-parameters 40000 --max-reuse-distance 10000"
                 : "",
        out);
    g_free(bucket);
    return args;
}

static ZpSchedule *other_schedule(const ZpModel *model, const OtherRun *r, int n)
{
    ZpPlan plan;
    zp_plan_defaults(&plan, r->stage, n, 1);
    plan.impl = r->impl;
    plan.precision = ZP_PREC_BF16;
    plan.micro_batch = GLOBAL_BATCH / n / r->grad_accum;
    plan.grad_accum = r->grad_accum;
    plan.checkpoint = r->checkpoint;
    plan.zero.reduce_bucket_size = r->bucket;
    if (r->knobs) {
        plan.zero.stage3_param_persistence_threshold = 1000;
        plan.zero.stage3_prefetch_bucket_size = 20000;
        plan.zero.stage3_max_live_parameters = 40000;
        plan.zero.stage3_max_reuse_distance = 10000;
    }
    ZpSchedule *s = zp_sched_build(model, &plan, NULL);
    g_assert_nonnull(s);
    return s;
}

static void test_other_impls(void)
{
    ZpModel model;
    g_assert_true(zp_model_load("tiny", &model, NULL));
    model.dropout = FALSE;
    /* DeepSpeed's stages 2-3 at 5000, smaller than a block's gradients (49,984 elements) and
     * than qkv, fc1 and fc2 (which bypass the buckets): each stage-3 module op hands on its
     * own tensors' gradients, and those whose bucket has no room yet in the ipg buffer wait
     * until the bucket before is reduced (real_engine_ds.c grad_place, real_ds_land_pending). */
    static const OtherRun runs_of[] = {
        {ZP_IMPL_DEEPSPEED, 0, 1, FALSE, 10000, FALSE},
        {ZP_IMPL_DEEPSPEED, 1, 1, FALSE, 10000, FALSE},
        {ZP_IMPL_DEEPSPEED, 2, 1, FALSE, 5000, FALSE},
        {ZP_IMPL_DEEPSPEED, 2, 2, FALSE, 12000, FALSE},
        {ZP_IMPL_DEEPSPEED, 3, 1, FALSE, 5000, TRUE},
        {ZP_IMPL_DEEPSPEED, 3, 1, TRUE, 5000, TRUE},
        {ZP_IMPL_FSDP, 0, 1, FALSE, 10000, FALSE},
        {ZP_IMPL_FSDP, 2, 1, FALSE, 10000, FALSE},
        {ZP_IMPL_FSDP, 3, 1, FALSE, 10000, FALSE},
    };
    for (int n = 2; n <= 4; n *= 2)
        for (size_t k = 0; k < G_N_ELEMENTS(runs_of); k++) {
            const OtherRun *run = &runs_of[k];
            char *paths[2];
            json_t *runs[2];
            for (int other = 0; other <= 1; other++) {
                paths[other] = g_strdup_printf("%s/impl_%d_%zu_%d.json", tmp_dir, other, k, n);
                char *args = other_args(run, n, !other, paths[other]);
                char *err = NULL;
                const int status = mpirun(n, args, &err);
                if (!g_spawn_check_wait_status(status, NULL))
                    g_printerr("%s", err);
                g_assert_true(g_spawn_check_wait_status(status, NULL));
                g_free(err), g_free(args);
                runs[other] = json_load_file(paths[other], 0, NULL);
                g_assert_nonnull(runs[other]);
            }
            json_t *loss = json_object_get(runs[1], "loss");
            json_t *paper_loss = json_object_get(runs[0], "loss");
            for (int i = 0; i < 4; i++) {
                const double a = json_number_value(json_array_get(loss, i));
                const double b = json_number_value(json_array_get(paper_loss, i));
                g_assert_cmpfloat(fabs(a - b) / b, <=, LOSS_REL_TOL);
            }
            ZpSchedule *s = other_schedule(&model, run, n);
            double peak[ZP_MEM_N];
            tu_sequential_peak(s, NULL, peak);
            json_t *ranks = json_object_get(runs[1], "ranks");
            for (int r = 0; r < n; r++) {
                json_t *rank = json_array_get(ranks, r);
                g_assert_cmpfloat(json_number_value(json_object_get(rank, "model_state_bytes")),
                                  ==, zp_sched_model_state_bytes(s));
                g_assert_cmpfloat(category(rank, "grads"), ==, peak[ZP_MEM_GRADS]);
                g_assert_cmpfloat(category(rank, "buckets"), ==, peak[ZP_MEM_BUCKETS]);
                g_assert_cmpfloat(category(rank, "gathered_params"), ==,
                                  peak[ZP_MEM_GATHERED_PARAMS]);
                g_assert_cmpfloat(json_number_value(json_object_get(rank, "comm_bytes")), ==,
                                  zp_sched_comm_bytes(s, ZP_GROUP_DP));
            }
            if (run->impl == ZP_IMPL_DEEPSPEED && run->stage == 1) /* the held ipg buffer */
                g_assert_cmpfloat(peak[ZP_MEM_BUCKETS], ==, 10000 * 2);
            if (run->impl == ZP_IMPL_DEEPSPEED && run->stage >= 2) {
                /* the tied head's wte gradient (64 x 64) waits apart for the embedding's
                 * backward, and stage 3 unpacks coalesced all-gathers: zreal ran both */
                guint waits = 0, unpacks = 0, modules = 0;
                for (guint i = 0; i < s->ops->len; i++) {
                    const ZpOp *op = zp_sched_op(s, i);
                    modules += op->kind == ZP_OP_COMPUTE && zp_op_module(op) >= 0;
                    waits += op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_BUCKETS &&
                             op->unit == 0 && op->bytes == 64 * 64 * 2 &&
                             zp_sched_op(s, i + 1)->kind == ZP_OP_COMPUTE &&
                             zp_sched_op(s, i + 1)->sub == ZP_COMP_HEAD;
                    unpacks += op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK;
                }
                g_assert_cmpuint(waits, ==, (guint)run->grad_accum);
                g_assert_cmpuint(unpacks > 0, ==, run->stage == 3);
                /* stage 3 computed module by module: 6 ops per block forward, recompute and
                 * backward (tiny: 2 blocks), each after its own gathers; stage 2 each block's
                 * backward, whose modules hand their gradients on (grads_by_module) */
                const guint passes = run->stage == 3 ? (run->checkpoint ? 3 : 2) : 1;
                g_assert_cmpuint(modules, ==, ZP_MOD_N * 2 * (guint)run->grad_accum * passes);
            }
            zp_sched_free(s);
            for (int other = 0; other <= 1; other++) {
                json_decref(runs[other]);
                g_remove(paths[other]);
                g_free(paths[other]);
            }
        }
}

/* A rank's total peak, every category at it and every category's own peak equal the
 * schedule's walked in list order, as zreal executes it (a collective done before the next op
 * starts; the simulator may overlap a reduction, and the buffers it frees, with the next
 * op). */
static void check_sequential_peak(json_t *rank, const ZpSchedule *s)
{
    double own[ZP_MEM_N], at[ZP_MEM_N];
    const double peak = tu_sequential_peak(s, at, own);
    g_assert_cmpfloat(number_at(rank, "peak_memory_bytes"), ==, peak);
    json_t *breakdown = json_object_get(rank, "peak_breakdown");
    for (int c = 0; c < ZP_MEM_N; c++) {
        const char *name = zp_sched_mem_name(c);
        g_assert_cmpfloat(number_at(breakdown, name), ==, at[c]);
        g_assert_cmpfloat(category(rank, name), ==, own[c]);
    }
}

/* Any reduce_bucket_size in zreal, DeepSpeed's bucket launch timing and its waiting gradients:
 * stages 1 to 3 on tiny, 4 ranks (stage 1 reduces once, at the last micro-step), reduce_bucket_size 64 (each norm's weight and bias a bucket
 * of its own, so a module's second gradient waits for the one ipg buffer until the bucket
 * before it is reduced: zp_sched.c hand_on and land_waits, zreal's has_room) and 3,000, over
 * one and two micro-steps. The loss is the default buckets' within LOSS_REL_TOL and every rank
 * sends the schedule's bytes; its total peak, every category at it and every category's own
 * peak (the waiting gradients' workspace among them, and at stage 2 with two micro-steps the
 * second one's grads_in_partition copy: zp_impl.h grad_copy_elems) equal the schedule's in
 * list order (check_sequential_peak) and `simulate`'s (check_total_peak). A later micro-step
 * adds its reduced gradients in place, in bf16, as DeepSpeed does (real_engine_deliver). */
static void test_deepspeed_small_buckets(void)
{
    char *path = g_strdup_printf("%s/buckets.json", tmp_dir);
    static const double sizes[] = {64, 3000};
    for (int stage = 1; stage <= 3; stage++)
        for (int accum = 1; accum <= 2; accum++) {
            const PeakRun base = {.stage = stage, .impl = ZP_IMPL_DEEPSPEED, .accum = accum};
            char *base_args = peak_args(&base);
            json_t *ref = tu_zreal_measured(4, base_args, path);
            json_t *ref_loss = json_object_get(ref, "loss");
            for (size_t k = 0; k < G_N_ELEMENTS(sizes); k++) {
                const PeakRun p = {.stage = stage, .impl = ZP_IMPL_DEEPSPEED, .bucket = sizes[k],
                                   .accum = accum};
                char *args = peak_args(&p);
                json_t *m = tu_zreal_measured(4, args, path);
                json_t *loss = json_object_get(m, "loss");
                for (size_t i = 0; i < json_array_size(ref_loss); i++) {
                    const double a = json_number_value(json_array_get(loss, i));
                    const double b = json_number_value(json_array_get(ref_loss, i));
                    g_assert_cmpfloat(fabs(a - b) / b, <=, LOSS_REL_TOL);
                }
                ZpSchedule *s = peak_schedule(&p);
                SimResult *sim = peak_prediction(&p);
                double peak[ZP_MEM_N];
                tu_sequential_peak(s, NULL, peak);
                json_t *ranks = json_object_get(m, "ranks");
                g_assert_cmpuint(json_array_size(ranks), ==, 4);
                for (size_t r = 0; r < 4; r++) {
                    json_t *rank = json_array_get(ranks, r);
                    check_sequential_peak(rank, s);
                    check_total_peak(rank, sim);
                    g_assert_cmpfloat(category(rank, "buckets"), ==, peak[ZP_MEM_BUCKETS]);
                    g_assert_cmpfloat(category(rank, "gathered_params"), ==,
                                      peak[ZP_MEM_GATHERED_PARAMS]);
                    g_assert_cmpfloat(number_at(rank, "comm_bytes"), ==,
                                      zp_sched_comm_bytes(s, ZP_GROUP_DP));
                }
                json_t *rank0 = json_array_get(ranks, 0);
                g_test_message("stage %d, %d micro-step(s), reduce_bucket_size %.0f: %.0f bytes "
                               "a rank; peak %.0f, buckets' peak %.0f, workspace's peak %.0f "
                               "(schedule's %.0f)", stage, accum, sizes[k],
                               zp_sched_comm_bytes(s, ZP_GROUP_DP),
                               number_at(rank0, "peak_memory_bytes"), peak[ZP_MEM_BUCKETS],
                               category(rank0, "workspace"), peak[ZP_MEM_WORKSPACE]);
                sim_result_free(sim);
                zp_sched_free(s);
                json_decref(m);
                g_free(args);
            }
            json_decref(ref);
            g_free(base_args);
        }
    g_remove(path);
    g_free(path);
}

/* ZeRO-Offload and ZeRO-Infinity in zreal: a run with its optimizer (and parameters) off the
 * GPU against the same run without offload. */
typedef struct {
    int stage, ranks, accum;
    const char *impl;  /* both runs' --impl (deepspeed's with reduce_bucket_size 12000) */
    const char *flags; /* zreal's offload flags ("DIR": the test's NVMe directory) */
    const char *ds;    /* or ds_config offload sections, run as a zplan schedule */
} OffloadCase;

static const OffloadCase offload_cases[] = {
    {1, 2, 1, "paper", "--offload-optimizer cpu", NULL},
    {1, 2, 1, "paper", "--offload-optimizer nvme", NULL}, /* cpu at stages 1-2, as DeepSpeed */
    {2, 1, 2, "paper", "--offload-optimizer cpu", NULL},
    {2, 2, 2, "paper", "--offload-optimizer cpu", NULL},
    {3, 2, 2, "paper", "--offload-optimizer cpu", NULL},
    {3, 1, 1, "paper", "--offload-optimizer cpu --offload-param cpu", NULL},
    {3, 2, 2, "paper", "--offload-optimizer nvme --nvme-path DIR", NULL},
    /* DeepSpeed's own: stage 2 one micro-step, all-reduced and reduced to the owner;
     * stage 3 with its 16-bit host sum over 1 and 3 micro-steps, and on NVMe. */
    {2, 2, 1, "deepspeed", "--offload-optimizer cpu", NULL},
    {2, 2, 1, "deepspeed", NULL,
     "\"use_multi_rank_bucket_allreduce\": false, \"offload_optimizer\": {\"device\": \"cpu\"}"},
    /* stage 2 summing whole tensors on the host over 3 micro-steps, all-reduced and reduced
     * to the owner, and on one rank */
    {2, 2, 3, "deepspeed", "--offload-optimizer cpu", NULL},
    {2, 2, 2, "deepspeed", NULL,
     "\"use_multi_rank_bucket_allreduce\": false, \"offload_optimizer\": {\"device\": \"cpu\"}"},
    {2, 1, 2, "deepspeed", "--offload-optimizer cpu", NULL},
    {3, 2, 1, "deepspeed", "--offload-optimizer cpu", NULL},
    {3, 2, 3, "deepspeed", "--offload-optimizer cpu", NULL},
    {3, 2, 2, "deepspeed", "--offload-optimizer nvme --nvme-path DIR", NULL},
    {3, 2, 2, "paper", NULL,
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\"}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", \"max_in_cpu\": 0, "
     "\"buffer_count\": 2, \"buffer_size\": 20000}"},
    /* One sub-group (sub_group_size 1e9): ratio 0.5 offloads all of it, and max_in_cpu 1000,
     * less than the partition, keeps none of it on the host beside a flat buffer of 1000. */
    {3, 2, 1, "deepspeed", NULL, "\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}"},
    {3, 2, 2, "paper", NULL,
     "\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", \"max_in_cpu\": 1000, "
     "\"buffer_count\": 2, \"buffer_size\": 20000}"},
    /* DeepSpeed's stage 3 with its parameters on the host, and with both on NVMe: each
     * call's slices up (from NVMe first) into its place before the call's gather. */
    {3, 2, 2, "deepspeed", "--offload-optimizer cpu --offload-param cpu", NULL},
    {3, 2, 2, "deepspeed", NULL,
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\"}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", \"max_in_cpu\": 0, "
     "\"buffer_count\": 2, \"buffer_size\": 40000}"},
    /* Offloaded parameters fetched by all-reduce (stage3_use_all_reduce_for_fetch_params):
     * a call of more than one tensor zeroes its buffer and each slice comes up into its
     * place in its parameter's region (partition_parameters.py _all_gather_coalesced). */
    {3, 2, 2, "deepspeed", NULL,
     "\"stage3_use_all_reduce_for_fetch_params\": true, \"offload_optimizer\": {\"device\": "
     "\"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}"},
    {3, 2, 2, "deepspeed", NULL,
     "\"stage3_use_all_reduce_for_fetch_params\": true, "
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\"}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", \"max_in_cpu\": 0, "
     "\"buffer_count\": 2, \"buffer_size\": 40000}"},
    /* max_in_cpu 30000 keeps the first of two sub-groups of 30000 (stage3.py
     * _create_fp16_partitions_with_defragmentation) in the flat buffer: each call's slices
     * beyond it come from NVMe, the kept ones from the host, and only the second sub-group is
     * swapped out after the step; with the optimizer on cpu and on NVMe. */
    {3, 2, 2, "deepspeed", NULL,
     "\"sub_group_size\": 30000, \"offload_optimizer\": {\"device\": \"cpu\"}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", "
     "\"max_in_cpu\": 30000, \"buffer_count\": 2, \"buffer_size\": 40000}"},
    {3, 2, 1, "deepspeed", NULL,
     "\"sub_group_size\": 30000, "
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\"}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", "
     "\"max_in_cpu\": 30000, \"buffer_count\": 2, \"buffer_size\": 40000}"},
    /* DeepSpeed's partial offload by sub-groups of 20000 (stage3.py subgroup_to_device):
     * ratio 0.5 leaves int(1.5) = 1 on the GPU, 20000 elements, and the CPU steps 20000 and
     * 13120; ratio 0.3 leaves 2, the CPU steps the last 13120 alone. */
    {3, 2, 2, "deepspeed", NULL,
     "\"sub_group_size\": 20000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}"},
    {3, 2, 1, "deepspeed", NULL,
     "\"sub_group_size\": 20000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.3}"},
    /* Sub-groups below the partition of 53120 elements, stepped one by one (stage3.py
     * step): three with the parameters on the GPU; three swapped through buffers of one;
     * two with both on NVMe and none kept on the host. */
    {3, 2, 2, "paper", NULL,
     "\"sub_group_size\": 20000, \"offload_optimizer\": {\"device\": \"cpu\"}"},
    {3, 2, 2, "deepspeed", NULL,
     "\"sub_group_size\": 20000, "
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\"}"},
    {3, 2, 1, "paper", NULL,
     "\"sub_group_size\": 30000, "
     "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\"}, "
     "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nowhere\", \"max_in_cpu\": 0, "
     "\"buffer_count\": 2, \"buffer_size\": 20000}"},
};

#define OFFLOAD_BASE "--model tiny --micro-batch 2 --steps 4 --persistence-threshold 0"

/* Small, so that the reduction is split into several buckets. */
static int offload_bucket(const OffloadCase *c)
{
    return strcmp(c->impl, "deepspeed") == 0 ? 12000 : 20000;
}

/* The offload run's measured.json: with flags, or through zplan schedule --ds-config and
 * zreal --schedule, the NVMe tier under `dir`. */
static json_t *offload_run(const OffloadCase *c, const char *dir, const char *name)
{
    if (c->flags) {
        char **parts = g_strsplit(c->flags, "DIR", 2);
        char *flags = g_strjoinv(dir, parts);
        char *args = g_strdup_printf(OFFLOAD_BASE " --reduce-bucket-size %d --impl %s --stage %d "
                                     "--grad-accum %d %s", offload_bucket(c), c->impl, c->stage,
                                     c->accum, flags);
        json_t *m = zreal_measured(c->ranks, args, name);
        g_strfreev(parts), g_free(flags), g_free(args);
        return m;
    }
    char *ds = g_strdup_printf("%s/%s-ds.json", tmp_dir, name);
    char *sched = g_strdup_printf("%s/%s-s.json", tmp_dir, name);
    char *text = g_strdup_printf(
        "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, "
        "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": %d, "
        "\"reduce_bucket_size\": %d, \"stage3_param_persistence_threshold\": 0, %s}}",
        c->accum, c->stage, offload_bucket(c), c->ds);
    g_assert_true(g_file_set_contents(ds, text, -1, NULL));
    /* eager attention throughout: zreal's own default, which its runs by flags train with */
    char *zargs = g_strdup_printf("schedule --model tiny --gpus %d --attention eager --impl %s "
                                  "--ds-config %s --out %s", c->ranks, c->impl, ds, sched);
    TuRun r = tu_zplan(zargs);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r);
    char *args = g_strdup_printf("--schedule %s --steps 4 --nvme-path %s", sched, dir);
    json_t *m = zreal_measured(c->ranks, args, name);
    g_remove(ds), g_remove(sched);
    g_free(ds), g_free(sched), g_free(text), g_free(zargs), g_free(args);
    return m;
}

/* The losses equal the run without offload bit for bit (the same update from the same
 * values: later micro-steps add the host's sum to the reduced slice in bf16, as the GPU's
 * gradients would be); each rank's host bytes per category equal the schedule's host_bytes,
 * and its host peak zp_offload_host_peak_bytes (the direct I/O buffer included);
 * the bytes each rank moved per transfer kind equal the schedule's for that rank
 * (zp_offload_rank_transfer_bytes: a rank's slice of a stage 1-2 bucket is its part of the
 * unpadded range, DeepSpeed's stage-2 sums its whole tensors), and summed over the ranks the
 * transfer ops' dp x bytes; with the optimizer on NVMe at stage 3 the swap files were read
 * and written, and none is left in the directory. */
static void test_offload_matches(void)
{
    char *dir = g_strdup_printf("%s/nvme", tmp_dir);
    g_assert_cmpint(g_mkdir(dir, 0700), ==, 0);
    /* The runs without offload by their ranks and flags, each run once: cases share them
     * (the same command, whose losses an offload run must equal bit for bit). */
    GHashTable *plain_runs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                                   (GDestroyNotify)json_decref);
    for (size_t i = 0; i < G_N_ELEMENTS(offload_cases); i++) {
        const OffloadCase *c = &offload_cases[i];
        char *name = g_strdup_printf("offload_%zu", i);
        char *plain_args = g_strdup_printf(OFFLOAD_BASE " --reduce-bucket-size %d --impl %s "
                                           "--stage %d --grad-accum %d", offload_bucket(c),
                                           c->impl, c->stage, c->accum);
        char *plain_key = g_strdup_printf("%d %s", c->ranks, plain_args);
        json_t *plain = g_hash_table_lookup(plain_runs, plain_key);
        if (!plain) {
            plain = zreal_measured(c->ranks, plain_args, "offload_plain");
            g_hash_table_insert(plain_runs, g_strdup(plain_key), plain);
        }
        g_free(plain_key);
        json_t *off = offload_run(c, dir, name);
        g_assert_true(json_equal(json_object_get(plain, "loss"), json_object_get(off, "loss")));
        ZpModel model;
        ZpPlan plan;
        g_assert_true(zp_model_from_json(json_object_get(off, "model"), "model", &model, NULL));
        g_assert_true(zp_plan_from_json(json_object_get(off, "plan"), "plan", &plan, NULL));
        ZpSchedule *s = zp_sched_build(&model, &plan, NULL);
        g_assert_nonnull(s);
        double predicted[ZP_XFER_N] = {0}, measured[ZP_XFER_N] = {0};
        for (guint k = 0; k < s->ops->len; k++) {
            const ZpOp *op = zp_sched_op(s, k);
            if (op->kind == ZP_OP_TRANSFER)
                predicted[op->sub] += op->bytes * plan.dp;
        }
        g_assert_cmpfloat(predicted[ZP_XFER_D2H], >, 0);
        const gboolean nvme = c->stage == 3 && zp_offload_optimizer_tier(&plan) == ZP_TIER_NVME;
        g_assert_true(!nvme || (predicted[ZP_XFER_NVME_READ] > 0 &&
                                predicted[ZP_XFER_NVME_WRITE] > 0));
        json_t *ranks = json_object_get(off, "ranks");
        g_assert_cmpuint(json_array_size(ranks), ==, (size_t)c->ranks);
        for (size_t r = 0; r < json_array_size(ranks); r++) {
            json_t *rank = json_array_get(ranks, r);
            for (int cat = 0; cat < ZP_MEM_N; cat++)
                g_assert_cmpfloat(number_at(json_object_get(rank, "host_bytes"),
                                            zp_sched_mem_name(cat)), ==, s->host_bytes[cat]);
            g_assert_cmpfloat(number_at(rank, "host_peak_bytes"), ==,
                              zp_offload_host_peak_bytes(s));
            double mine[ZP_XFER_N];
            zp_offload_rank_transfer_bytes(s, (int)r, mine);
            for (int k = 0; k < ZP_XFER_N; k++) {
                const double moved = number_at(json_object_get(rank, "transfer_bytes"),
                                               zp_sched_transfer_name(k));
                g_assert_cmpfloat(moved, ==, mine[k]);
                measured[k] += moved;
            }
            g_assert_cmpfloat(number_at(rank, "model_state_bytes"), ==,
                              zp_sched_model_state_bytes(s));
        }
        for (int k = 0; k < ZP_XFER_N; k++)
            g_assert_cmpfloat(measured[k], ==, predicted[k]);
        GDir *d = g_dir_open(dir, 0, NULL);
        g_assert_null(g_dir_read_name(d)); /* the swap files are gone */
        g_dir_close(d);
        zp_sched_free(s);
        json_decref(off);
        g_free(name), g_free(plain_args);
    }
    g_hash_table_destroy(plain_runs);
    g_rmdir(dir);
    g_free(dir);
}

/* What zreal does not run of partial offload under the paper's stage 3 (its gradients have
 * no host sum of DeepSpeed's; its fetches spread the NVMe share over the units) is one line
 * naming offload_optimizer.ratio or offload_param.max_in_cpu, exit status 1..127. */
static void test_offload_partial_refused(void)
{
    const struct {
        const char *offload, *message;
    } cases[] = {
        {"\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}",
         "offload_optimizer.ratio: zreal steps sub-groups on the GPU under DeepSpeed's stage 3"},
        {"\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
         "\"nvme\", \"nvme_path\": \"/nowhere\", \"max_in_cpu\": 20000}",
         "offload_param.max_in_cpu: zreal keeps some of the sub-groups in host memory under "
         "DeepSpeed's stage 3 only"},
    };
    char *ds = g_strdup_printf("%s/partial-ds.json", tmp_dir);
    char *sched = g_strdup_printf("%s/partial-s.json", tmp_dir);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *text = g_strdup_printf(
            "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
            "\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0, "
            "\"sub_group_size\": 20000, %s}}", cases[i].offload);
        g_assert_true(g_file_set_contents(ds, text, -1, NULL));
        char *zargs = g_strdup_printf("schedule --model tiny --gpus 2 --attention eager "
                                      "--impl paper "
                                      "--ds-config %s --out %s", ds, sched);
        TuRun r = tu_zplan(zargs);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        tu_free(&r);
        char *args = g_strdup_printf("--schedule %s --steps 1 --nvme-path %s", sched, tmp_dir);
        r = tu_zreal_mpirun(2, args, NULL);
        g_assert_true(WIFEXITED(r.status));
        g_assert_cmpint(WEXITSTATUS(r.status), >=, 1);
        g_assert_cmpint(WEXITSTATUS(r.status), <=, 127);
        g_assert_nonnull(strstr(r.err, cases[i].message));
        tu_free(&r);
        g_free(text), g_free(zargs), g_free(args);
    }
    g_remove(ds), g_remove(sched);
    g_free(ds), g_free(sched);
}

/* zreal --schedule runs a deepspeed schedule file as zplan schedule wrote it: stage 3 with
 * checkpointing trains exactly as the same plan given by flags; stage 2 from a ds_config that
 * reduces each rank's slice to its owner (use_multi_rank_bucket_allreduce false) over two ipg
 * buffers (overlap_comm) trains as the paper's stage 2 and measures the file's buffers and
 * bytes exactly; a deepspeed file whose ops were edited is refused naming the op. */
static void test_deepspeed_schedule_file(void)
{
    char *sched = g_strdup_printf("%s/ds-sched.json", tmp_dir);
    char *meas = g_strdup_printf("%s/ds-sched-m.json", tmp_dir);
    char *flags_meas = g_strdup_printf("%s/ds-flags-m.json", tmp_dir);
    const char *knobs = "--stage 3 --checkpoint --reduce-bucket-size 12000 "
                        "--persistence-threshold 1000 --prefetch-bucket-size 20000 "
                        "--impl deepspeed";
    /* eager attention, zreal's own default, which the run by flags below trains with (zplan's
     * default without --cluster is flash2) */
    char *args = g_strdup_printf("schedule --model tiny --gpus 2 --micro-batch 8 --precision bf16 "
                                 "--attention eager --no-dropout %s --out %s", knobs, sched);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r), g_free(args);
    char *err = NULL;
    args = g_strdup_printf("--schedule %s --steps 3 --out %s", sched, meas);
    g_assert_true(g_spawn_check_wait_status(mpirun(2, args, &err), NULL));
    g_free(args), g_free(err);
    args = g_strdup_printf("--model tiny --micro-batch 8 --steps 3 %s --out %s", knobs, flags_meas);
    g_assert_true(g_spawn_check_wait_status(mpirun(2, args, &err), NULL));
    g_free(args), g_free(err);
    json_t *a = json_load_file(meas, 0, NULL), *b = json_load_file(flags_meas, 0, NULL);
    g_assert_true(json_equal(json_object_get(a, "loss"), json_object_get(b, "loss")));
    for (int q = 0; q < 2; q++) {
        json_t *x = json_array_get(json_object_get(a, "ranks"), q);
        json_t *y = json_array_get(json_object_get(b, "ranks"), q);
        g_assert_cmpfloat(number_at(x, "comm_bytes"), ==, number_at(y, "comm_bytes"));
        g_assert_true(json_equal(json_object_get(x, "category_peak_bytes"),
                                 json_object_get(y, "category_peak_bytes")));
    }
    json_decref(a), json_decref(b);

    /* An edited op: one gathered buffer two bytes larger. */
    json_t *root = json_load_file(sched, 0, NULL);
    json_t *op = json_array_get(json_object_get(root, "ops"), 0);
    json_object_set_new(op, "bytes", json_real(json_number_value(json_object_get(op, "bytes")) + 2));
    g_assert_cmpint(json_dump_file(root, sched, 0), ==, 0);
    json_decref(root);
    GError *error = NULL;
    g_assert_null(zp_sched_read_json(sched, &error));
    g_assert_nonnull(strstr(error->message, "ops[0]: differs from the deepspeed schedule zplan "
                                            "builds for this model and plan"));
    g_clear_error(&error);

    char *config = g_strdup_printf("%s/ds-config.json", tmp_dir);
    g_assert_true(g_file_set_contents(
        config, "{\"train_micro_batch_size_per_gpu\": 8, \"bf16\": {\"enabled\": true}, "
                "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 12000, "
                "\"overlap_comm\": true, \"use_multi_rank_bucket_allreduce\": false}}",
        -1, NULL));
    args = g_strdup_printf("schedule --model tiny --gpus 2 --attention eager --no-dropout "
                           "--ds-config %s --out %s", config, sched);
    r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r), g_free(args);
    args = g_strdup_printf("--schedule %s --steps 3 --out %s", sched, meas);
    g_assert_true(g_spawn_check_wait_status(mpirun(2, args, &err), NULL));
    g_free(args), g_free(err);
    args = g_strdup_printf("--model tiny --stage 2 --micro-batch 8 --steps 3 --out %s", flags_meas);
    g_assert_true(g_spawn_check_wait_status(mpirun(2, args, &err), NULL));
    g_free(args), g_free(err);
    ZpSchedule *s = zp_sched_read_json(sched, NULL);
    g_assert_nonnull(s);
    g_assert_false(s->plan.zero.use_multi_rank_bucket_allreduce);
    double peak[ZP_MEM_N];
    tu_sequential_peak(s, NULL, peak);
    a = json_load_file(meas, 0, NULL), b = json_load_file(flags_meas, 0, NULL);
    for (int i = 0; i < 3; i++) {
        const double x = json_number_value(json_array_get(json_object_get(a, "loss"), i));
        const double y = json_number_value(json_array_get(json_object_get(b, "loss"), i));
        g_assert_cmpfloat(fabs(x - y) / y, <=, LOSS_REL_TOL);
    }
    for (int q = 0; q < 2; q++) {
        json_t *rank = json_array_get(json_object_get(a, "ranks"), q);
        g_assert_cmpfloat(category(rank, "buckets"), ==, peak[ZP_MEM_BUCKETS]);
        g_assert_cmpfloat(category(rank, "grads"), ==, peak[ZP_MEM_GRADS]);
        g_assert_cmpfloat(number_at(rank, "comm_bytes"), ==, zp_sched_comm_bytes(s, ZP_GROUP_DP));
    }
    g_assert_cmpfloat(peak[ZP_MEM_BUCKETS], >=, 2 * 12000 * 2); /* the two ipg buffers */
    json_decref(a), json_decref(b);
    zp_sched_free(s);
    const char *files[] = {sched, meas, flags_meas, config};
    for (size_t i = 0; i < G_N_ELEMENTS(files); i++)
        g_remove(files[i]);
    g_free(sched), g_free(meas), g_free(flags_meas), g_free(config);
}

/* stage3_use_all_reduce_for_fetch_params: zreal all-reduces each coalesced call's zeroed flat
 * buffer (this rank's slices at their places) and reads the parameters in place. The sum of
 * zeros and one slice is exact, so the run trains bit for bit as the all-gathering one; each
 * rank sends the file's bytes (the all-reduces' second ring pass more) and holds its gathered
 * parameters exactly. */
static void test_deepspeed_allreduce_fetch(void)
{
    char *config = g_strdup_printf("%s/ds-ar.json", tmp_dir);
    char *sched = g_strdup_printf("%s/ds-ar-sched.json", tmp_dir);
    char *meas = g_strdup_printf("%s/ds-ar-m.json", tmp_dir);
    char *flags_meas = g_strdup_printf("%s/ds-ag-m.json", tmp_dir);
    g_assert_true(g_file_set_contents(
        config, "{\"train_micro_batch_size_per_gpu\": 8, \"bf16\": {\"enabled\": true}, "
                "\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 12000, "
                "\"stage3_param_persistence_threshold\": 1000, "
                "\"stage3_prefetch_bucket_size\": 20000, "
                "\"stage3_use_all_reduce_for_fetch_params\": true}}",
        -1, NULL));
    char *args = g_strdup_printf(
        "schedule --model tiny --gpus 2 --attention eager --no-dropout --ds-config %s --out %s",
        config, sched);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r), g_free(args);
    char *err = NULL;
    args = g_strdup_printf("--schedule %s --steps 3 --out %s", sched, meas);
    g_assert_true(g_spawn_check_wait_status(mpirun(2, args, &err), NULL));
    g_free(args), g_free(err);
    args = g_strdup_printf("--model tiny --micro-batch 8 --steps 3 --stage 3 --impl deepspeed "
                           "--reduce-bucket-size 12000 --persistence-threshold 1000 "
                           "--prefetch-bucket-size 20000 --out %s", flags_meas);
    g_assert_true(g_spawn_check_wait_status(mpirun(2, args, &err), NULL));
    g_free(args), g_free(err);
    ZpSchedule *s = zp_sched_read_json(sched, NULL);
    g_assert_nonnull(s);
    g_assert_true(s->plan.zero.stage3_use_all_reduce_for_fetch_params);
    guint fetches = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        fetches += op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLREDUCE &&
                   zp_sched_coll_fetches(s, op);
    }
    g_assert_cmpuint(fetches, >, 0);
    double peak[ZP_MEM_N];
    tu_sequential_peak(s, NULL, peak);
    json_t *a = json_load_file(meas, 0, NULL), *b = json_load_file(flags_meas, 0, NULL);
    g_assert_true(json_equal(json_object_get(a, "loss"), json_object_get(b, "loss")));
    for (int q = 0; q < 2; q++) {
        json_t *rank = json_array_get(json_object_get(a, "ranks"), q);
        json_t *gathering = json_array_get(json_object_get(b, "ranks"), q);
        g_assert_cmpfloat(category(rank, "gathered_params"), ==,
                          peak[ZP_MEM_GATHERED_PARAMS]);
        g_assert_cmpfloat(category(rank, "buckets"), ==, peak[ZP_MEM_BUCKETS]);
        g_assert_cmpfloat(number_at(rank, "comm_bytes"), ==, zp_sched_comm_bytes(s, ZP_GROUP_DP));
        g_assert_cmpfloat(number_at(rank, "comm_bytes"), >, number_at(gathering, "comm_bytes"));
    }
    json_decref(a), json_decref(b);
    zp_sched_free(s);
    const char *files[] = {sched, meas, flags_meas, config};
    for (size_t i = 0; i < G_N_ELEMENTS(files); i++)
        g_remove(files[i]);
    g_free(sched), g_free(meas), g_free(flags_meas), g_free(config);
}

/* DeepSpeed's stage 3 with one gradient bucket: the ipg buffer reduces it alone, and
 * backward adds the gradients into it, zeroed by real_engine_ds.c real_ds_land when the bucket
 * lands (the engine zeroes no buffer of unit -1). glibc's MALLOC_PERTURB_ leaves every allocation
 * dirty, so an unzeroed buffer would change the second step's loss; the losses are the clean
 * run's bit for bit. (ASan's allocator ignores MALLOC_PERTURB_.) */
static void test_deepspeed_dirty_memory(void)
{
    const char *args = "--model tiny --micro-batch 4 --steps 2 --stage 3 --impl deepspeed "
                       "--reduce-bucket-size 200000";
    char *path = g_strdup_printf("%s/ds-dirty.json", tmp_dir);
    json_t *clean = tu_zreal_measured(2, args, path);
    g_assert_true(g_setenv("MALLOC_PERTURB_", "165", TRUE));
    json_t *dirty = tu_zreal_measured(2, args, path);
    g_unsetenv("MALLOC_PERTURB_");
    g_assert_true(json_equal(json_object_get(clean, "loss"), json_object_get(dirty, "loss")));
    json_decref(clean), json_decref(dirty);
    g_free(path);
}

/* A run of DeepSpeed's stage 3 against its schedule: every rank sends the schedule's bytes
 * (the data-parallel group's and ZeRO++'s subgroups', hpZ's apart), and its total peak, every
 * category at it and every category's own peak are the schedule's walked in list order, as
 * zreal executes it; where `simulated`, the simulator's too. */
typedef enum {
    SIM_ALL,     /* the simulator's total peak, categories at it and own peaks */
    SIM_AT_PEAK, /* its total peak and the categories at it */
    SIM_NONE,
} SimCheck;

static void check_stage3(const PeakRun *p, SimCheck simulated)
{
    char *path = g_strdup_printf("%s/stage3.json", tmp_dir);
    char *args = peak_args(p);
    const int n = peak_ranks(p);
    json_t *m = tu_zreal_measured(n, args, path);
    ZpSchedule *s = peak_schedule(p);
    SimResult *sim = peak_prediction(p);
    const double hpz = sim->comm_bytes[ZP_GROUP_HPZ];
    const double sent = sim->comm_bytes[ZP_GROUP_DP] + hpz + sim->comm_bytes[ZP_GROUP_NODE] +
                        sim->comm_bytes[ZP_GROUP_XNODE];
    g_assert_cmpfloat(hpz > 0, ==, p->hpz > 1);
    g_assert_cmpfloat(sim->comm_bytes[ZP_GROUP_NODE] > 0, ==, p->qgz);
    json_t *ranks = json_object_get(m, "ranks");
    g_assert_cmpuint(json_array_size(ranks), ==, (size_t)n);
    for (int r = 0; r < n; r++) {
        json_t *rank = json_array_get(ranks, r);
        check_sequential_peak(rank, s);
        if (simulated == SIM_ALL)
            check_total_peak(rank, sim);
        if (simulated == SIM_AT_PEAK)
            for (int c = 0; c < ZP_MEM_N; c++)
                g_assert_cmpfloat(number_at(json_object_get(rank, "peak_breakdown"),
                                            zp_sched_mem_name(c)), ==,
                                  sim->peak_breakdown_bytes[c]);
        g_assert_cmpfloat(number_at(rank, "comm_bytes"), ==, sent);
        if (hpz > 0)
            g_assert_cmpfloat(number_at(rank, "hpz_comm_bytes"), ==, hpz);
    }
    json_t *rank0 = json_array_get(ranks, 0);
    g_test_message("%s: %.0f bytes sent (hpZ %.0f); peak %.0f, activations %.0f, workspace %.0f "
                   "at it", args, sent, hpz, number_at(rank0, "peak_memory_bytes"),
                   number_at(json_object_get(rank0, "peak_breakdown"), "activations"),
                   number_at(json_object_get(rank0, "peak_breakdown"), "workspace"));
    sim_result_free(sim);
    zp_sched_free(s);
    json_decref(m);
    g_free(args), g_free(path);
}

/* DeepSpeed's stage 3 in zreal at 2 and 4 ranks, with checkpointing, hpZ (groups of 2 ranks,
 * 2 ranks a node, each module gathered again in backward from the secondary partition:
 * partition_parameters.py _partition_param_sec, _all_gather_coalesced with
 * use_secondary_tensor), qwZ with it, qgZ (stage3.py __avg_scatter_grads ->
 * all_to_all_quant_reduce, in the buffers it allocates: zp_zeropp_qgz_tensor) and
 * reduce_bucket_size down to one element: each run's bytes and memory are its schedule's
 * exactly (check_stage3). The simulator runs some buffers on their own stream beside the
 * compute's, as DeepSpeed does, where zreal runs them in list order: with qwZ a prefetch's int8
 * buffers (that run is held to the list-order walk alone), with qgZ and small buckets a
 * bucket's quantised reduction beside the next module's backward (held to the simulator's total
 * peak and the categories at it). */
static void test_deepspeed_stage3_exact(void)
{
    static const struct {
        PeakRun run;
        SimCheck simulated;
    } cases[] = {
#define DS3 .stage = 3, .impl = ZP_IMPL_DEEPSPEED
#define HPZ .hpz = 2, .per_node = 2, .regather = TRUE
        {{DS3, .ranks = 2}, SIM_ALL},
        {{DS3, .ranks = 2, .checkpoint = TRUE}, SIM_ALL},
        {{DS3, .ranks = 2, .persistent = TRUE}, SIM_ALL},
        {{DS3, .ranks = 4, .persistent = TRUE}, SIM_ALL},
        {{DS3, .ranks = 2, .bucket = 1}, SIM_ALL},
        {{DS3, .ranks = 2, .bucket = 8, .accum = 2}, SIM_ALL},
        {{DS3, HPZ}, SIM_ALL},
        {{DS3, HPZ, .ranks = 2}, SIM_ALL},
        {{DS3, HPZ, .checkpoint = TRUE}, SIM_ALL},
        {{DS3, HPZ, .bucket = 3000}, SIM_ALL},
        {{DS3, HPZ, .qwz = TRUE}, SIM_NONE},
        {{DS3, .qgz = TRUE, .per_node = 2}, SIM_ALL},
        {{DS3, .qgz = TRUE, .per_node = 2, .bucket = 3000}, SIM_AT_PEAK},
        {{DS3, .qgz = TRUE, .per_node = 2, .bucket = 64, .accum = 2}, SIM_AT_PEAK},
        {{DS3, .qgz = TRUE, HPZ, .bucket = 3000}, SIM_AT_PEAK},
#undef DS3
#undef HPZ
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++)
        check_stage3(&cases[i].run, cases[i].simulated);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    real_zero_common_init();
    g_test_add_func("/zreal/deepspeed-and-fsdp", test_other_impls);
    g_test_add_func("/zreal/deepspeed-small-buckets", test_deepspeed_small_buckets);
    g_test_add_func("/zreal/deepspeed-schedule-file", test_deepspeed_schedule_file);
    g_test_add_func("/zreal/deepspeed-allreduce-fetch", test_deepspeed_allreduce_fetch);
    g_test_add_func("/zreal/deepspeed-dirty-memory", test_deepspeed_dirty_memory);
    g_test_add_func("/zreal/offload-matches", test_offload_matches);
    g_test_add_func("/zreal/offload-partial-refused", test_offload_partial_refused);
    g_test_add_func("/zreal/deepspeed-stage3-exact", test_deepspeed_stage3_exact);
    return real_zero_common_run();
}
