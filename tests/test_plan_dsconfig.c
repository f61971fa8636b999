/* test_plan_dsconfig: DeepSpeed config I/O in the planner: defaults and "auto", the batch
 * rule, refusals, warnings, and its round trip through the simulator. */
#include "plan_common.h"

/* ---- DeepSpeed configs ----------------------------------------------------------------- */

static gboolean read_ds(const char *text, const ZpModel *m, const ZpPlan *launch, ZpPlan *plan,
                        int64_t *batch, GPtrArray *warnings, GError **error)
{
    char *path = tmp_path("ds_config.json");
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    const gboolean ok = zp_dsconfig_read(path, m, launch, plan, batch, warnings, error);
    g_free(path);
    return ok;
}

static void test_dsconfig_defaults_and_auto(void)
{
    ZpModel m = tu_load_model("gpt2-1.5b");
    ZpPlan launch = launch_plan(64, 1), plan;
    launch.micro_batch = 4;
    launch.grad_accum = 2;
    int64_t batch = 0;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    GError *error = NULL;
    /* Absent keys take DeepSpeed's defaults: overlap_comm off below stage 3, on at 3. */
    g_assert_true(read_ds("{\"train_batch_size\": 256, \"zero_optimization\": {\"stage\": 2}}",
                          &m, &launch, &plan, &batch, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpint(plan.zero.stage, ==, 2);
    g_assert_false(plan.zero.overlap_comm);
    g_assert_cmpfloat(plan.zero.reduce_bucket_size, ==, 5e8);
    g_assert_cmpint(plan.micro_batch, ==, 4);
    g_assert_cmpint(plan.grad_accum, ==, 1);
    g_assert_cmpint(batch, ==, 256);
    g_assert_cmpint(plan.precision, ==, ZP_PREC_FP32); /* neither fp16 nor bf16 */
    g_assert_false(plan.checkpoint);
    g_assert_cmpuint(warnings->len, ==, 0);
    g_assert_true(read_ds("{\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": "
                          "true}, \"zero_optimization\": {\"stage\": 3}, "
                          "\"activation_checkpointing\": {}}",
                          &m, &launch, &plan, &batch, warnings, &error));
    g_assert_true(plan.zero.overlap_comm);
    g_assert_true(plan.checkpoint);
    g_assert_cmpint(plan.precision, ==, ZP_PREC_FP16);
    g_assert_cmpint(batch, ==, 128);
    /* "auto" as the Hugging Face Trainer resolves it: h = 1600. */
    g_assert_true(read_ds("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\":"
                          " \"auto\", \"gradient_accumulation_steps\": \"auto\", \"bf16\": "
                          "{\"enabled\": \"auto\"}, \"zero_optimization\": {\"stage\": 3, "
                          "\"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": "
                          "\"auto\", \"stage3_param_persistence_threshold\": \"auto\"}}",
                          &m, &launch, &plan, &batch, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpfloat(plan.zero.reduce_bucket_size, ==, 1600.0 * 1600);
    g_assert_cmpfloat(plan.zero.stage3_prefetch_bucket_size, ==, 2304000);
    g_assert_cmpfloat(plan.zero.stage3_param_persistence_threshold, ==, 16000);
    g_assert_cmpint(plan.micro_batch, ==, 4);
    g_assert_cmpint(plan.grad_accum, ==, 2);
    g_assert_cmpint(batch, ==, 4 * 2 * 64);
    g_assert_cmpint(plan.precision, ==, ZP_PREC_FP32); /* the launch is fp16, not bf16 */
    /* 5e8 and 500000000 are the same number; the stage3_* keys have DeepSpeed's short names. */
    ZpPlan other;
    g_assert_true(read_ds("{\"train_batch_size\": 64, \"zero_optimization\": {\"stage\": 3, "
                          "\"reduce_bucket_size\": 5e8, \"max_live_parameters\": 2e8}}",
                          &m, &launch, &plan, &batch, warnings, &error));
    g_assert_true(read_ds("{\"train_batch_size\": 64, \"zero_optimization\": {\"stage\": 3, "
                          "\"reduce_bucket_size\": 500000000, \"stage3_max_live_parameters\": "
                          "200000000}}",
                          &m, &launch, &other, &batch, warnings, &error));
    g_assert_cmpint(memcmp(&plan, &other, sizeof plan), ==, 0);
    g_assert_cmpfloat(plan.zero.stage3_max_live_parameters, ==, 2e8);
    g_assert_cmpuint(warnings->len, ==, 0);
    g_ptr_array_unref(warnings);
}

/* DeepSpeed's batch rule: any two of the three give the third. */
static void test_dsconfig_batch_rule(void)
{
    ZpModel m = tu_load_model("gpt2-124m");
    const ZpPlan launch = launch_plan(8, 1);
    const struct {
        const char *json;
        int micro, accum;
        int64_t batch;
    } cases[] = {
        {"{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2}", 2, 4, 64},
        {"{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 2}", 4, 2, 64},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3}", 2, 3, 48},
        {"{\"train_batch_size\": 64}", 8, 1, 64},
        {"{\"train_micro_batch_size_per_gpu\": 5}", 5, 1, 40},
        {"{\"train_batch_size\": 48, \"train_micro_batch_size_per_gpu\": 2, "
         "\"gradient_accumulation_steps\": 3}", 2, 3, 48},
    };
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpPlan plan;
        int64_t batch = 0;
        GError *error = NULL;
        g_assert_true(read_ds(cases[i].json, &m, &launch, &plan, &batch, warnings, &error));
        g_assert_no_error(error);
        g_assert_cmpint(plan.micro_batch, ==, cases[i].micro);
        g_assert_cmpint(plan.grad_accum, ==, cases[i].accum);
        g_assert_cmpint(batch, ==, cases[i].batch);
    }
    g_ptr_array_unref(warnings);
}

/* Each bad config fails with one line naming the key at fault. */
static void test_dsconfig_refusals(void)
{
    ZpModel m = tu_load_model("gpt2-124m");
    const ZpPlan launch = launch_plan(8, 1);
    const struct {
        const char *json, *message;
    } cases[] = {
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"stage\": \"three\"}}",
         "key \"stage\" must be a whole number"},
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"stage\": 4}}", "key \"stage\" = 4"},
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"stag\": 2}}",
         "unknown key \"zero_optimization.stag\""},
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"overlap_comm\": 1}}",
         "key \"overlap_comm\" must be true or false"},
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"reduce_bucket_size\": 2.5}}",
         "key \"reduce_bucket_size\" must be a whole number"},
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"allgather_bucket_size\": "
         "\"auto\"}}", "key \"allgather_bucket_size\" = \"auto\" has no Hugging Face rule"},
        {"{\"train_batch_size\": 64, \"zero_optimization\": {\"max_live_parameters\": 1, "
         "\"stage3_max_live_parameters\": 1}}", "name the same setting"},
        {"{\"train_batch_size\": 64, \"zero_optimization\": 2}",
         "key \"zero_optimization\" must be an object"},
        {"{\"train_batch_size\": 64, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": "
         "true}}", "fp16.enabled and bf16.enabled are both true"},
        {"{\"train_batch_size\": 60, \"train_micro_batch_size_per_gpu\": 2}",
         "train_batch_size = 60 is not a multiple of train_micro_batch_size_per_gpu 2 x the "
         "data-parallel degree 8"},
        {"{\"train_batch_size\": 4}", "train_batch_size = 4 is not a multiple of the "
         "data-parallel degree 8"},
        {"{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2, "
         "\"gradient_accumulation_steps\": 2}", "train_batch_size = 64 but "
         "train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x the data-parallel "
         "degree 8 = 32"},
        {"{\"gradient_accumulation_steps\": 2}", "give train_batch_size or "
         "train_micro_batch_size_per_gpu"},
        {"{\"train_batch_size\": -8}", "key \"train_batch_size\" = -8 is outside"},
        {"[]", "top level must be a JSON object"},
    };
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpPlan plan;
        int64_t batch;
        GError *error = NULL;
        g_assert_false(read_ds(cases[i].json, &m, &launch, &plan, &batch, warnings, &error));
        g_test_message("%s -> %s", cases[i].json, error->message);
        g_assert_nonnull(strstr(error->message, cases[i].message));
        g_assert_nonnull(strstr(error->message, "ds_config.json"));
        g_assert_null(strchr(error->message, '\n'));
        g_clear_error(&error);
    }
    /* "auto" sizes need an architecture. */
    ZpModel params_only;
    zp_model_from_params(1e9, &params_only);
    ZpPlan plan;
    int64_t batch;
    GError *error = NULL;
    g_assert_false(read_ds("{\"train_batch_size\": 8, \"zero_optimization\": "
                           "{\"reduce_bucket_size\": \"auto\"}}",
                           &params_only, &launch, &plan, &batch, warnings, &error));
    g_assert_nonnull(strstr(error->message, "hidden size"));
    g_clear_error(&error);
    g_ptr_array_unref(warnings);
}

/* Keys DeepSpeed knows and zplan does not model are listed in one warning line; unknown
 * top-level keys, which DeepSpeed ignores, in another; other warnings say why. */
static void test_dsconfig_warnings(void)
{
    ZpModel m = tu_load_model("gpt2-124m");
    const ZpPlan launch = launch_plan(8, 1);
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    ZpPlan plan;
    int64_t batch;
    GError *error = NULL;
    g_assert_true(read_ds(
        "{\"train_batch_size\": 64, \"optimizer\": {\"type\": \"AdamW\"}, \"scheduler\": {}, "
        "\"gradient_clipping\": 1.0, \"steps_per_print\": 10, \"wall_clock_breakdown\": false, "
        "\"trian_batch_size\": 64, "
        "\"fp16\": {\"enabled\": true, \"loss_scale\": 0}, \"zero_optimization\": {\"stage\": 3,"
        " \"offload_optimizer\": {\"device\": \"cpu\", \"pipeline_read\": true}, "
        "\"allgather_partitions\": false, "
        "\"sub_group_size\": 1e9}, \"activation_checkpointing\": {\"partition_activations\": "
        "true, \"cpu_checkpointing\": false, \"profile\": true}}",
        &m, &launch, &plan, &batch, warnings, &error));
    g_assert_no_error(error);
    const char *expected[] = {
        "read but not modeled (ignored): scheduler, gradient_clipping, "
        "steps_per_print, wall_clock_breakdown, fp16.loss_scale",
        "unknown top-level keys, which DeepSpeed ignores: trian_batch_size",
        "zero_optimization.offload_optimizer: \"pipeline_read\" ignored",
        "\"zero_optimization.allgather_partitions\" ignored",
        "\"activation_checkpointing.profile\" ignored",
    };
    /* ZeRO-R's options are modeled: read into the plan, no warning. */
    g_assert_true(plan.checkpoint && plan.ckpt.partition_activations);
    g_assert_false(plan.ckpt.cpu_checkpointing);
    GString *all = g_string_new(NULL);
    for (guint i = 0; i < warnings->len; i++) {
        const char *w = g_ptr_array_index(warnings, i);
        g_assert_null(strchr(w, '\n'));
        g_string_append_printf(all, "%s\n", w);
    }
    g_test_message("%s", all->str);
    for (size_t i = 0; i < G_N_ELEMENTS(expected); i++)
        g_assert_nonnull(strstr(all->str, expected[i]));
    g_assert_cmpuint(warnings->len, ==, G_N_ELEMENTS(expected)); /* sub_group_size: default */
    g_assert_cmpint(plan.zero.offload_optimizer.device, ==, ZP_OFFLOAD_CPU); /* modeled now */
    g_string_free(all, TRUE);
    g_ptr_array_unref(warnings);
}

/* Reads the config at path back over the launch (its degrees), which must take it without a
 * warning; returns its batch. */
static int64_t read_back(const char *path, const ZpModel *m, ZpPlan launch, ZpPlan *back)
{
    int64_t batch = 0;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    GError *error = NULL;
    g_assert_true(zp_dsconfig_read(path, m, &launch, back, &batch, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpuint(warnings->len, ==, 0);
    g_ptr_array_unref(warnings);
    return batch;
}

/* Every plan the search can produce survives write -> read unchanged. */
static void test_dsconfig_round_trip(void)
{
    ZpModel m = tu_load_model("gpt2-1.5b");
    ZpHw hw = tu_load_hw("dgx-a100-80g");
    ZpSearchSpec spec;
    zp_search_spec_defaults(&spec, &m, &hw, 32);
    spec.global_batch = 256;
    GArray *plans = zp_search_enumerate(&spec, NULL);
    g_assert_nonnull(plans);
    char *path = tmp_path("round_trip.json");
    for (guint i = 0; i < plans->len; i += 7) {
        const ZpPlan *p = &g_array_index(plans, ZpCandidate, i).plan;
        g_assert_true(zp_dsconfig_write(p, path, NULL));
        ZpPlan back;
        g_assert_cmpint(read_back(path, &m, launch_plan(p->dp, p->mp), &back), ==, 256);
        back.gpus_per_node = hw.gpus_per_node; /* the cluster's, not ds_config's (simulate) */
        g_assert_cmpint(memcmp(p, &back, sizeof back), ==, 0);
    }
    g_remove(path);
    g_free(path);
    g_array_unref(plans);
}

/* A pipeline plan reads back as written, its schedule too: DeepSpeed's PipelineEngine runs
 * 1F1B, so the file named no schedule and `plan --3d`'s interleaved plan 1 came back as 1F1B
 * (gpt3-175b on 512 A100s: 33.60 s and 78.0 GB written, 35.23 s and 69.5 GB read back). A
 * 1F1B plan's section is as before; a chunk count without the interleaved schedule, or the
 * interleaved schedule without one, is refused naming the file. */
static void test_dsconfig_pipeline_round_trip(void)
{
    ZpModel m = tu_load_model("gpt2-1.5b");
    const struct {
        ZpPipeSchedule schedule;
        int virtual_stages;
    } pipes[] = {{ZP_PIPE_1F1B, 1}, {ZP_PIPE_GPIPE, 1}, {ZP_PIPE_INTERLEAVED, 2},
                 {ZP_PIPE_INTERLEAVED, 4}};
    char *path = tmp_path("pipe_round_trip.json");
    for (size_t i = 0; i < G_N_ELEMENTS(pipes); i++) {
        ZpPlan p = launch_plan(8, 2);
        p.zero.stage = 1;
        p.micro_batch = 1;
        p.grad_accum = 16;
        p.pipe.stages = 4;
        p.pipe.schedule = pipes[i].schedule;
        p.pipe.virtual_stages = pipes[i].virtual_stages;
        g_assert_true(zp_dsconfig_write(&p, path, NULL));
        char *text = NULL;
        g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
        g_assert_true((strstr(text, "\"schedule\"") != NULL) == (i > 0));
        g_free(text);
        ZpPlan back;
        read_back(path, &m, launch_plan(32, 2), &back);
        back.gpus_per_node = p.gpus_per_node;
        g_assert_cmpint(back.pipe.stages, ==, 4);
        g_assert_cmpint(back.dp, ==, 8);
        g_assert_cmpint(back.pipe.schedule, ==, pipes[i].schedule);
        g_assert_cmpint(zp_plan_vstages(&back), ==, pipes[i].virtual_stages);
    }
    static const char *const bad[] = {
        "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 16, "
        "\"pipeline\": {\"stages\": 4, \"schedule\": \"interleaved\"}}",
        "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 16, "
        "\"pipeline\": {\"stages\": 4, \"virtual_stages\": 2}}",
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_assert_true(g_file_set_contents(path, bad[i], -1, NULL));
        const ZpPlan launch = launch_plan(32, 2);
        ZpPlan back;
        int64_t batch;
        GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
        GError *error = NULL;
        g_assert_false(zp_dsconfig_read(path, &m, &launch, &back, &batch, warnings, &error));
        g_test_message("%s", error->message);
        g_assert_true(g_str_has_prefix(error->message, path));
        g_assert_nonnull(strstr(error->message, "virtual_stages"));
        g_clear_error(&error);
        g_ptr_array_unref(warnings);
    }
    g_remove(path);
    g_free(path);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    plan_common_init();
    g_test_add_func("/dsconfig/defaults-and-auto", test_dsconfig_defaults_and_auto);
    g_test_add_func("/dsconfig/batch-rule", test_dsconfig_batch_rule);
    g_test_add_func("/dsconfig/refusals", test_dsconfig_refusals);
    g_test_add_func("/dsconfig/warnings", test_dsconfig_warnings);
    g_test_add_func("/dsconfig/round-trip", test_dsconfig_round_trip);
    g_test_add_func("/dsconfig/pipeline-round-trip", test_dsconfig_pipeline_round_trip);
    return plan_common_run();
}
