/* test_plan: `zplan plan` and `zplan sweep` end to end: known answers as memory shrinks,
 * DeepSpeed configs written and simulated, headroom and tokens, human output, bad input, and
 * the sweep's tables. */
#include "plan_common.h"

/* ---- running zplan --------------------------------------------------------------------- */

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

static json_t *parse_json(const char *text)
{
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    g_assert_nonnull(root);
    return root;
}

/* `zplan plan ... --json`: its JSON, and its exit status in *status. */
static json_t *plan_json(const char *args, int *status)
{
    char *full = g_strdup_printf("plan %s --json", args);
    TuRun r = tu_zplan(full);
    g_test_message("zplan %s -> %d %s", full, exit_status(&r), r.err);
    *status = exit_status(&r);
    json_t *root = parse_json(r.out);
    tu_free(&r);
    g_free(full);
    return root;
}

static double number(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    g_assert_true(json_is_number(v));
    return json_number_value(v);
}

/* A copy of a shipped hwprofile with another GPU memory size. */
static char *profile_with_memory(const char *cluster, double gpu_memory_bytes)
{
    char *src = g_strdup_printf("%s/hwprofiles/%s.json", zp_data_dir(), cluster);
    json_t *root = zp_json_load_object(src, NULL);
    g_assert_nonnull(root);
    json_object_set_new(root, "gpu_memory_bytes", json_real(gpu_memory_bytes));
    char *name = g_strdup_printf("%s-%.0f.json", cluster, gpu_memory_bytes);
    char *path = tmp_path(name);
    g_assert_true(zp_json_write(root, path, NULL));
    json_decref(root);
    g_free(name);
    g_free(src);
    return path;
}

/* ---- zplan plan ------------------------------------------------------------------------ */

static void check_fits(json_t *candidate, double gpu_memory_bytes)
{
    g_assert_cmpfloat(number(candidate, "peak_memory_bytes"), <=, gpu_memory_bytes);
    g_assert_cmpfloat(number(candidate, "step_time_s"), >, 0);
}

/* The best plan always fits, and so do all listed; with less GPU memory the answer still fits
 * (or nothing does, and then nothing does with even less), and is never faster. Once nothing
 * fits on the GPUs alone, plan offloads (to the host, then NVMe), and so with even less. */
static void test_best_fits_as_memory_shrinks(void)
{
    const double sizes[] = {34359738368.0, 24e9, 16e9, 12e9, 8e9, 4e9, 2e9};
    double previous_ps = 0;
    gboolean nothing_fits = FALSE, offloaded = FALSE;
    for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
        char *profile = profile_with_memory("dgx2-v100", sizes[i]);
        char *args = g_strdup_printf("--model gpt2-1.5b --cluster %s --gpus 64 --top 3", profile);
        int status;
        json_t *root = plan_json(args, &status);
        json_t *best = json_object_get(root, "best");
        if (json_is_null(best)) {
            g_assert_cmpint(status, ==, 2);
            nothing_fits = TRUE;
        } else {
            g_assert_cmpint(status, ==, 0);
            g_assert_false(nothing_fits && !offloaded);
            check_fits(best, sizes[i]);
            const gboolean offloads =
                strcmp(json_string_value(json_object_get(best, "offload_optimizer")), "none") != 0;
            g_assert_true(offloads || !offloaded);
            offloaded = offloads;
            nothing_fits = nothing_fits || offloads;
            json_t *c;
            size_t k;
            json_array_foreach(json_object_get(root, "candidates"), k, c) check_fits(c, sizes[i]);
            const double ps = number(best, "step_time_s") / number(best, "global_batch");
            g_assert_cmpfloat(ps, >=, previous_ps * (1 - 1e-9));
            previous_ps = ps;
        }
        json_decref(root);
        g_free(args);
        g_remove(profile);
        g_free(profile);
    }
    /* 2 GB cannot hold a 1.5B model's states over 64 GPUs without offload */
    g_assert_true(nothing_fits);
}

/* The ZeRO paper trains the 1.5B model on 32 GB V100s without ZeRO: some stage-0 plan fits,
 * and it needs activation checkpointing (without it, the closest is over). */
static void test_gpt2_fits_at_stage0(void)
{
    int status;
    json_t *root = plan_json("--model gpt2-1.5b --cluster dgx2-v100 --gpus 64", &status);
    g_assert_cmpint(status, ==, 0);
    json_t *stage0 = json_array_get(json_object_get(root, "stages"), 0);
    g_assert_true(json_is_true(json_object_get(stage0, "fits")));
    json_t *best0 = json_object_get(stage0, "best");
    g_assert_cmpint(json_integer_value(json_object_get(best0, "stage")), ==, 0);
    check_fits(best0, number(root, "gpu_memory_bytes"));
    g_assert_true(json_is_true(json_object_get(stage0, "checkpointing_needed")));
    g_assert_cmpfloat(number(json_object_get(stage0, "closest_over_memory"), "over_memory_bytes"),
                      >, 0);
    json_decref(root);
}

/* A trillion parameters need 16 TB of model states: 1 TB per GPU over one DGX-2's 16 GPUs at
 * best. Offload cannot help there: the node's 30.72 TB of NVMe would hold ZeRO-Infinity's 18
 * bytes a parameter, but DeepSpeed's host keeps the whole 16-bit gradient partition
 * (stage3.py grad_partitions_flat_buffer: 2 TB) beside its swap buffers, more than its
 * 1.5 TB. Four DGX-2 nodes (64 GPUs) and eight DGX A100 nodes hold it with both offloads on
 * NVMe, which plan proposes. */
static void test_1t_on_dgx2(void)
{
    const char *clusters[] = {"dgx2-v100"};
    for (size_t i = 0; i < G_N_ELEMENTS(clusters); i++) {
        char *args = g_strdup_printf("plan --model gpt-1t --cluster %s --gpus 16", clusters[i]);
        TuRun r = tu_zplan(args);
        g_assert_cmpint(exit_status(&r), ==, 2);
        g_assert_true(g_str_has_prefix(r.out, "Does not fit: the closest plan (stage "));
        g_assert_nonnull(strstr(r.err, "no plan fits"));
        g_assert_cmpint((int)(strchr(r.err, '\n') - r.err), ==, (int)strlen(r.err) - 1);
        g_assert_nonnull(strstr(r.out, "No plan fits"));
        for (int stage = 0; stage <= 3; stage++) {
            char line[64];
            g_snprintf(line, sizeof line, "%d out of memory", stage);
            g_assert_nonnull(strstr(r.out, line));
        }
        tu_free(&r);
        g_free(args);
    }
    int status;
    json_t *root = plan_json("--model gpt-1t --cluster dgx2-v100 --gpus 16", &status);
    g_assert_cmpint(status, ==, 2);
    g_assert_true(json_is_null(json_object_get(root, "best")));
    /* Stage 3 with all 16 GPUs sharing 16 bytes per parameter: at least 1 TB - 34 GB over. */
    g_assert_cmpfloat(number(json_object_get(root, "closest_over_memory"), "over_memory_bytes"),
                      >, 16 * 1e12 / 16 - 34.4e9);
    json_decref(root);
    const char *hold[] = {"--cluster dgx2-v100 --gpus 64", "--cluster dgx-a100-80g --gpus 64"};
    for (size_t i = 0; i < G_N_ELEMENTS(hold); i++) {
        char *args = g_strdup_printf("--model gpt-1t %s", hold[i]);
        root = plan_json(args, &status);
        g_assert_cmpint(status, ==, 0);
        json_t *best = json_object_get(root, "best");
        g_assert_cmpstr(json_string_value(json_object_get(best, "offload_optimizer")), ==, "nvme");
        g_assert_cmpstr(json_string_value(json_object_get(best, "offload_param")), ==, "nvme");
        json_decref(root);
        g_free(args);
    }
}

/* Without tensor parallelism a 13B model on 128 V100s needs ZeRO stage 2 or 3: stage 1 keeps
 * 4 bytes of parameters and gradients per parameter, 52 GB. */
static void test_13b_needs_stage2(void)
{
    int status;
    json_t *root = plan_json("--model gpt-13b --cluster dgx2-v100 --gpus 128 --mp 1", &status);
    g_assert_cmpint(status, ==, 0);
    json_t *stages = json_object_get(root, "stages");
    g_assert_false(json_is_true(json_object_get(json_array_get(stages, 0), "fits")));
    g_assert_false(json_is_true(json_object_get(json_array_get(stages, 1), "fits")));
    json_t *best = json_object_get(root, "best");
    g_assert_cmpint(json_integer_value(json_object_get(best, "stage")), >=, 2);
    g_assert_cmpint(json_integer_value(json_object_get(best, "mp")), ==, 1);
    check_fits(best, number(root, "gpu_memory_bytes"));
    json_decref(root);
}

/* --ds-config writes what DeepSpeed would run: the chosen stage and batch sizes as integers;
 * read back it is the best plan, and the simulator predicts the same step for it, through the
 * API and through `zplan simulate --ds-config`. */
static void test_ds_config_written_and_simulated(void)
{
    char *path = tmp_path("best.json");
    char *args = g_strdup_printf("--model gpt2-1.5b --cluster dgx2-v100 --gpus 64 "
                                 "--global-batch 512 --ds-config %s", path);
    int status;
    json_t *root = plan_json(args, &status);
    g_assert_cmpint(status, ==, 0);
    json_t *best = json_object_get(root, "best");
    const int stage = (int)json_integer_value(json_object_get(best, "stage"));
    const int micro = (int)json_integer_value(json_object_get(best, "micro_batch"));
    const int accum = (int)json_integer_value(json_object_get(best, "grad_accum"));
    const int mp = (int)json_integer_value(json_object_get(best, "mp"));
    json_t *ds = zp_json_load_object(path, NULL);
    g_assert_nonnull(ds);
    g_assert_true(json_is_integer(json_object_get(ds, "train_batch_size")));
    g_assert_cmpint(json_integer_value(json_object_get(ds, "train_batch_size")), ==, 512);
    g_assert_cmpint(json_integer_value(json_object_get(ds, "train_micro_batch_size_per_gpu")),
                    ==, micro);
    g_assert_cmpint(json_integer_value(json_object_get(ds, "gradient_accumulation_steps")), ==,
                    accum);
    json_t *zero = json_object_get(ds, "zero_optimization");
    g_assert_cmpint(json_integer_value(json_object_get(zero, "stage")), ==, stage);
    g_assert_true(json_is_integer(json_object_get(zero, "reduce_bucket_size")));
    g_assert_true(json_is_true(json_object_get(json_object_get(ds, "fp16"), "enabled")));
    json_decref(ds);

    ZpModel m = tu_load_model("gpt2-1.5b");
    ZpHw hw = tu_load_hw("dgx2-v100");
    const ZpPlan launch = launch_plan(64 / mp, mp);
    ZpPlan plan, expected;
    int64_t batch;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    g_assert_true(zp_dsconfig_read(path, &m, &launch, &plan, &batch, warnings, NULL));
    g_assert_true(zp_plan_from_json(json_object_get(best, "plan"), "best", &expected, NULL));
    plan.gpus_per_node = hw.gpus_per_node; /* the cluster's, not ds_config's (simulate) */
    g_assert_cmpint(memcmp(&plan, &expected, sizeof plan), ==, 0);
    CliRankContext sim = {&m, &hw, NULL};
    double step_s, peak;
    g_assert_true(cli_rank_by_simulation(&plan, &sim, 0, &step_s, &peak, NULL));
    g_assert_cmpfloat(step_s, ==, number(best, "step_time_s"));
    g_assert_cmpfloat(peak + hw.runtime_reserve_bytes, ==, number(best, "peak_memory_bytes"));
    g_ptr_array_unref(warnings);

    TuRun help = tu_zplan("simulate --help");
    if (strstr(help.out, "--ds-config")) {
        char *sim_args = g_strdup_printf("simulate --model gpt2-1.5b --cluster dgx2-v100 "
                                         "--gpus 64 --mp %d --ds-config %s --json", mp, path);
        TuRun r = tu_zplan(sim_args);
        g_assert_cmpint(exit_status(&r), ==, 0);
        json_t *s = parse_json(r.out);
        g_assert_cmpfloat(number(s, "step_time_s"), ==, number(best, "step_time_s"));
        g_assert_cmpint(json_integer_value(json_object_get(s, "stage")), ==, stage);
        json_decref(s);
        tu_free(&r);
        g_free(sim_args);
    }
    tu_free(&help);
    json_decref(root);
    g_remove(path);
    g_free(path);
    g_free(args);
}

/* The written ds_config records every choice, tensor parallelism included: for every stage and
 * tensor-parallel degrees 1, 2 and 4, `simulate --ds-config` of it (without --mp) predicts
 * exactly the step that `simulate` with the same choices as flags does; and `plan --mp 2`'s
 * best plan round-trips the same way. */
static void test_ds_config_round_trip_tp(void)
{
    char *path = tmp_path("tp.json");
    const int mps[] = {1, 2, 4};
    for (int stage = 0; stage <= 3; stage++)
        for (size_t i = 0; i < G_N_ELEMENTS(mps); i++) {
            ZpPlan plan;
            zp_plan_defaults(&plan, stage, 16 / mps[i], mps[i]);
            plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
            plan.micro_batch = 2;
            plan.grad_accum = 3;
            plan.checkpoint = stage % 2 == 1;
            plan.zero.reduce_bucket_size = 2.5e8;
            plan.precision = ZP_PREC_BF16;
            g_assert_true(zp_dsconfig_write(&plan, path, NULL));
            char *from_file = g_strdup_printf("simulate --model gpt2-124m --cluster dgx-a100-80g "
                                              "--gpus 16 --ds-config %s --json", path);
            char *from_flags = g_strdup_printf(
                "simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 16 --mp %d --stage %d "
                "--micro-batch 2 --grad-accum 3 %s --reduce-bucket-size 250M --precision bf16 "
                "--attention eager --json", mps[i],
                stage, plan.checkpoint ? "--checkpoint" : "");
            json_t *a = tu_zplan_json(from_file), *b = tu_zplan_json(from_flags);
            g_assert_cmpfloat(number(a, "step_time_s"), ==, number(b, "step_time_s"));
            g_assert_cmpfloat(number(a, "peak_memory_bytes"), ==, number(b, "peak_memory_bytes"));
            g_assert_cmpfloat(number(a, "mp"), ==, mps[i]);
            json_decref(a), json_decref(b);
            g_free(from_file), g_free(from_flags);
        }
    /* The planner's own best plan with TP 2. */
    char *args = g_strdup_printf("--model gpt2-124m --cluster dgx-a100-80g --gpus 16 --mp 2 "
                                 "--top 1 --ds-config %s", path);
    int status;
    json_t *root = plan_json(args, &status);
    g_assert_cmpint(status, ==, 0);
    json_t *best = json_object_get(root, "best");
    g_assert_cmpint(json_integer_value(json_object_get(best, "mp")), ==, 2);
    char *sim = g_strdup_printf("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 16 "
                                "--ds-config %s --json", path);
    json_t *s = tu_zplan_json(sim);
    g_assert_cmpfloat(number(s, "step_time_s"), ==, number(best, "step_time_s"));
    g_assert_cmpfloat(number(s, "mp"), ==, 2);
    json_decref(s);
    /* A launch that says another degree is refused, naming the key. */
    char *other = g_strdup_printf("simulate --model gpt2-124m --cluster dgx-a100-80g --gpus 16 "
                                  "--mp 4 --ds-config %s", path);
    TuRun r = tu_zplan(other);
    g_assert_cmpint(exit_status(&r), ==, 1);
    g_assert_nonnull(strstr(r.err, "tensor_parallel: autotp_size 2 disagrees with the launch's "
                                   "tensor-parallel degree 4"));
    tu_free(&r);
    json_decref(root);
    g_remove(path);
    g_free(path), g_free(args), g_free(sim), g_free(other);
}

/* --headroom keeps memory free: as GB, bytes with a suffix or a fraction, every listed plan
 * fits in what is left; tokens/s is samples/s times the sequence. */
static void test_headroom_and_tokens(void)
{
    const char *rooms[] = {"40", "40GB", "0.5"};
    const double capacity = 85899345920.0, left[] = {capacity - 40e9, capacity - 40e9,
                                                     0.5 * capacity};
    for (size_t i = 0; i < G_N_ELEMENTS(rooms); i++) {
        char *args = g_strdup_printf("--model gpt2-1.5b --cluster dgx-a100-80g --gpus 16 "
                                     "--headroom %s", rooms[i]);
        int status;
        json_t *root = plan_json(args, &status);
        g_assert_cmpint(status, ==, 0);
        g_assert_cmpfloat(fabs(number(root, "headroom_bytes") - (capacity - left[i])), <, 1);
        g_assert_cmpfloat(number(root, "gpu_memory_bytes"), ==, capacity);
        size_t k;
        json_t *c;
        json_array_foreach(json_object_get(root, "candidates"), k, c)
        {
            g_assert_cmpfloat(number(c, "peak_memory_bytes"), <=, left[i]);
            g_assert_cmpfloat(number(c, "tokens_per_s"), ==, number(c, "samples_per_s") * 1024);
            g_assert_cmpfloat(number(c, "tokens_per_s_per_gpu"), ==,
                              number(c, "tokens_per_s") / 16);
        }
        json_decref(root);
        g_free(args);
    }
    /* Without headroom the best plan uses more memory than any of them leaves: they bind. */
    int status;
    json_t *root = plan_json("--model gpt2-1.5b --cluster dgx-a100-80g --gpus 16", &status);
    g_assert_cmpfloat(number(json_object_get(root, "best"), "peak_memory_bytes"), >, left[0]);
    json_decref(root);
}

/* The human table: the top plans with memory, TFLOPs and MFU, and why the rest lost. */
static void test_human_output(void)
{
    TuRun r = tu_zplan("plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 64 --top 2");
    g_assert_cmpint(exit_status(&r), ==, 0);
    const char *expected[] = {"Top 2", "TFLOPs/GPU", "MFU", "Memory per GPU at the simulated peak",
                              "Why the other choices lost", "checkpointing", "tokens/s",
                              "tok/s/GPU", "per sample vs #1", "% slower"};
    for (size_t i = 0; i < G_N_ELEMENTS(expected); i++)
        g_assert_nonnull(strstr(r.out, expected[i]));
    g_assert_true(g_str_has_prefix(r.out, "Fits: plan 1 (stage "));
    g_assert_nonnull(strstr(r.out, "of 32 GiB (34.4 GB), "));
    g_assert_cmpstr(r.err, ==, "");
    tu_free(&r);
    r = tu_zplan("plan --help");
    g_assert_nonnull(strstr(r.out, "--ds-config"));
    tu_free(&r);
    r = tu_zplan("sweep --help");
    g_assert_nonnull(strstr(r.out, "--metric"));
    tu_free(&r);
}

static const struct {
    const char *args, *file, *message;
} bad_cases[] = {
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 64 --global-batch 1000", NULL,
     "--global-batch: 1000 is not a multiple of any data-parallel degree"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 64 --mp 2", NULL,
     "--mp: 2 does not divide the 25 attention heads"},
    {"plan --model gpt3-175b --cluster dgx-a100-80g --gpus 96 --mp 12", NULL,
     "--mp: tensor-parallel degree 12 must divide the 8 GPUs per node"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 60 --mp 8", NULL,
     "--mp: 8 does not divide --gpus 60"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100", NULL, "--gpus N is required"},
    {"plan --cluster dgx2-v100 --gpus 8", NULL, "--model NAME|PATH.json is required"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 8 --top 0", NULL, "--top: '0' is outside"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 8 --precision bf16", NULL,
     "--precision: dgx2-v100 (V100-SXM3-32GB) has no bf16 peak"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 8 --seq 0", NULL, "--seq: '0' is outside"},
    {"plan --model gpt2-1.5b --cluster dgx2-v100 --gpus 8 extra", NULL, "unexpected argument"},
    {"simulate --model gpt2-124m --cluster dgx2-v100 --gpus 8 --ds-config %s",
     "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": \"three\"}}",
     "key \"stage\" must be a whole number"},
    {"sweep --vary params --values 1e9,2e9 --cluster dgx2-v100 --metric tflops --gpus 8 --out x",
     NULL, "--vary params: tflops simulates steps"},
    {"sweep --vary gpus --values 8,16 --model gpt2-124m --metric maxmodel --out x", NULL,
     "give --cluster NAME|PATH.json or --gpu-memory BYTES"},
    {"sweep --vary size --values 8 --params 1e9 --out x", NULL, "--vary: unknown value 'size'"},
    {"sweep --vary gpus --values 8,0 --params 1e9 --metric memory --out x", NULL,
     "--values: '0' is outside"},
    {"sweep --vary gpus --values 8,16 --params 1e9 --metric memory", NULL, "--out PREFIX is required"},
    {"sweep --vary stage --values 0,1 --params 1e9 --metric memory --out x", NULL,
     "--gpus N is required unless --vary gpus"},
    {"sweep --vary gpus --values 8,12 --params 1e9 --metric memory --mp 8 --out x", NULL,
     "--values: at gpus = 12: --mp: 8 does not divide --gpus 12"},
};

static void test_bad_input(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        char *path = NULL;
        if (bad_cases[i].file) {
            path = tmp_path("bad.json");
            g_assert_true(g_file_set_contents(path, bad_cases[i].file, -1, NULL));
        }
        char *args = path ? g_strdup_printf(bad_cases[i].args, path) : g_strdup(bad_cases[i].args);
        TuRun r = tu_zplan(args);
        g_test_message("zplan %s -> %s", args, r.err);
        g_assert_cmpint(exit_status(&r), ==, 1);
        g_assert_nonnull(strstr(r.err, bad_cases[i].message));
        g_assert_cmpint((int)(strchr(r.err, '\n') - r.err), ==, (int)strlen(r.err) - 1);
        g_assert_cmpstr(r.out, ==, "");
        if (path)
            g_assert_nonnull(strstr(r.err, path));
        tu_free(&r);
        g_free(args);
        if (path)
            g_remove(path);
        g_free(path);
    }
}

/* ---- zplan sweep ----------------------------------------------------------------------- */

static char **sweep_rows(const char *args, const char *prefix)
{
    TuRun r = tu_zplan(args);
    g_test_message("zplan %s -> %s", args, r.err);
    g_assert_cmpint(exit_status(&r), ==, 0);
    tu_free(&r);
    char *csv_path = g_strconcat(prefix, ".csv", NULL), *svg_path = g_strconcat(prefix, ".svg", NULL);
    char *csv = NULL, *svg = NULL;
    g_assert_true(g_file_get_contents(csv_path, &csv, NULL, NULL));
    g_assert_true(g_file_get_contents(svg_path, &svg, NULL, NULL));
    g_assert_nonnull(strstr(svg, "<svg"));
    g_assert_nonnull(strstr(svg, "</svg>"));
    char **rows = g_strsplit(g_strchomp(csv), "\n", -1);
    g_remove(csv_path);
    g_remove(svg_path);
    g_free(csv), g_free(svg), g_free(csv_path), g_free(svg_path);
    return rows;
}

/* Memory of 7.5B's model states per GPU is the paper's Table 1 (exact: 16, 4 + 12/N, ...). */
static void test_sweep_memory_is_table1(void)
{
    char *prefix = tmp_path("memory");
    char *args = g_strdup_printf("sweep --vary gpus --values 1,4,64 --params 7.5e9 "
                                 "--metric memory --out %s", prefix);
    char **rows = sweep_rows(args, prefix);
    g_assert_cmpstr(rows[0], ==, "gpus,stage 0,stage 1,stage 2,stage 3");
    g_assert_cmpstr(rows[1], ==, "1,120,120,120,120");
    g_assert_cmpstr(rows[2], ==, "4,120,52.5,41.25,30");
    g_assert_cmpstr(rows[3], ==, "64,120,31.4062,16.6406,1.875");
    g_assert_null(rows[4]);
    g_strfreev(rows);
    g_free(args);
    /* The largest model: Table 2's MP-1 row (7.6B, 14.4B; --gpu-memory has no reserve). */
    args = g_strdup_printf("sweep --vary gpus --values 64 --gpu-memory 32e9 --metric maxmodel "
                           "--out %s", prefix);
    rows = sweep_rows(args, prefix);
    g_assert_cmpstr(rows[1], ==, "64,2,7.64179,14.4225,128");
    g_strfreev(rows);
    g_free(args);
    g_free(prefix);
}

/* TFLOPs per stage against GPUs: every stage that fits has a positive figure, and after the
 * plotted columns the ZeRO-R/ZeRO++ options of each stage's best plan (none below stage 3
 * for this small model, which needs no Pa and gets no ZeRO++ there). */
static void test_sweep_tflops(void)
{
    char *prefix = tmp_path("tflops");
    char *args = g_strdup_printf("sweep --vary gpus --values 8,16 --model gpt2-124m --cluster "
                                 "dgx-a100-80g --out %s", prefix);
    char **rows = sweep_rows(args, prefix);
    for (int i = 1; i <= 2; i++) {
        char **cells = g_strsplit(rows[i], ",", -1);
        g_assert_cmpuint(g_strv_length(cells), ==, 9);
        for (int stage = 1; stage <= 4; stage++)
            g_assert_cmpfloat(g_ascii_strtod(cells[stage], NULL), >, 1);
        for (int stage = 5; stage <= 7; stage++)
            g_assert_cmpstr(cells[stage], ==, "");
        g_strfreev(cells);
    }
    g_strfreev(rows);
    g_free(args);
    args = g_strdup_printf("sweep --vary stage --values 0,3 --gpus 8 --model gpt2-124m "
                           "--cluster dgx-a100-80g --out %s", prefix);
    rows = sweep_rows(args, prefix);
    g_assert_cmpstr(rows[0], ==, "stage,tflops_per_gpu,zero-r/zero++");
    g_assert_true(g_str_has_prefix(rows[2], "3,"));
    g_strfreev(rows);
    g_free(args);
    g_free(prefix);
}

/* What does not fit stays on the plot: memory above the GPU's is shaded and labelled, a stage
 * with no plan that fits is a cross on the axis with its own legend entry; the title says what
 * the sweep assumed; --vary stage names the stages; --png writes a PNG. */
static void test_sweep_shows_infeasible(void)
{
    const struct {
        const char *args;
        const char *expected[4];
    } cases[] = {
        {"sweep --vary gpus --values 1,64 --model gpt-7.5b --cluster dgx2-v100 --metric memory "
         "--checkpoint",
         {"shaded: does not fit in V100-SXM3-32GB (34.4 GB)", "checkpointing every block",
          "sequence 1024", "micro-batch 1"}},
        {"sweep --vary gpus --values 16,64 --model gpt-60b --cluster dgx2-v100",
         {"stage 0: no plan fits", "micro-batch searched", "sequence 1024", "stage 3"}},
        {"sweep --vary stage --values 0,1,2,3 --gpus 64 --model gpt-60b --cluster dgx2-v100 --seq 512",
         {"model TFLOP/s per GPU (best plan)", "0 (baseline)", "no plan fits", "sequence 512"}},
    };
    char *prefix = tmp_path("infeasible");
    char *csv_path = g_strconcat(prefix, ".csv", NULL), *svg_path = g_strconcat(prefix, ".svg", NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *args = g_strdup_printf("%s --out %s", cases[i].args, prefix);
        TuRun r = tu_zplan(args);
        g_test_message("zplan %s -> %s", args, r.err);
        g_assert_cmpint(exit_status(&r), ==, 0);
        char *svg = NULL;
        g_assert_true(g_file_get_contents(svg_path, &svg, NULL, NULL));
        for (size_t k = 0; k < G_N_ELEMENTS(cases[i].expected); k++) {
            g_test_message("expect '%s'", cases[i].expected[k]);
            g_assert_nonnull(strstr(svg, cases[i].expected[k]));
        }
        g_free(svg);
        tu_free(&r);
        g_free(args);
    }
    char *args = g_strdup_printf("%s --out %s --png", cases[0].args, prefix);
    TuRun r = tu_zplan(args);
    g_assert_cmpint(exit_status(&r), ==, 0);
    char *png_path = g_strconcat(prefix, ".png", NULL), *png = NULL;
    gsize length = 0;
    g_assert_true(g_file_get_contents(png_path, &png, &length, NULL));
    g_assert_cmpuint(length, >, 8);
    g_assert_cmpint(memcmp(png, "\x89PNG\r\n\x1a\n", 8), ==, 0);
    g_remove(png_path), g_remove(csv_path), g_remove(svg_path);
    g_free(png), g_free(png_path), g_free(args), g_free(csv_path), g_free(svg_path), g_free(prefix);
    tu_free(&r);
}

/* plan's kept runs (cli_rank): a plan run to the end is kept, and asked again answers from it
 * where a stop after its step could not have cut it; asked with a stop before its end, it is run
 * again and stops there; the report takes the kept run, once. */
static void test_rank_keeps_runs(void)
{
    ZpModel m = tu_load_model("gpt2-124m");
    ZpHw hw = tu_load_hw("dgx-a100-80g");
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 8, 1);
    plan.gpus_per_node = hw.gpus_per_node;
    CliRankContext runs = {&m, &hw, NULL};
    cli_rank_keep(&runs);
    double step_s, need, again_s, again_need, cut_s, cut_need;
    g_assert_true(cli_rank_by_simulation(&plan, &runs, 0, &step_s, &need, NULL));
    g_assert_cmpuint(runs.kept->len, ==, 1);
    g_assert_true(cli_rank_by_simulation(&plan, &runs, 2 * step_s, &again_s, &again_need, NULL));
    g_assert_cmpuint(runs.kept->len, ==, 1); /* answered from the kept run */
    g_assert_cmpfloat(again_s, ==, step_s);
    g_assert_cmpfloat(again_need, ==, need);
    g_assert_true(cli_rank_by_simulation(&plan, &runs, step_s / 2, &cut_s, &cut_need, NULL));
    g_assert_cmpfloat(cut_need, ==, ZP_RANK_STOPPED);
    g_assert_cmpfloat(cut_s, <, step_s);
    g_assert_cmpuint(runs.kept->len, ==, 1); /* a stopped run is not kept */
    SimResult *kept = cli_rank_take(&runs, &plan);
    g_assert_nonnull(kept);
    g_assert_cmpfloat(kept->step_time_s, ==, step_s);
    g_assert_null(cli_rank_take(&runs, &plan));
    sim_result_free(kept);
    cli_rank_clear(&runs);
    g_assert_null(runs.kept);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    plan_common_init();
    g_test_add_func("/plan/best-fits-as-memory-shrinks", test_best_fits_as_memory_shrinks);
    g_test_add_func("/plan/gpt2-1.5b-fits-at-stage-0", test_gpt2_fits_at_stage0);
    g_test_add_func("/plan/1t-on-dgx2", test_1t_on_dgx2);
    g_test_add_func("/plan/13b-without-tp-needs-stage-2", test_13b_needs_stage2);
    g_test_add_func("/plan/ds-config-written-and-simulated", test_ds_config_written_and_simulated);
    g_test_add_func("/plan/ds-config-round-trip-tp", test_ds_config_round_trip_tp);
    g_test_add_func("/plan/headroom-and-tokens", test_headroom_and_tokens);
    g_test_add_func("/plan/human-output", test_human_output);
    g_test_add_func("/plan/bad-input", test_bad_input);
    g_test_add_func("/sweep/memory-is-table1", test_sweep_memory_is_table1);
    g_test_add_func("/sweep/tflops", test_sweep_tflops);
    g_test_add_func("/sweep/shows-infeasible", test_sweep_shows_infeasible);
    g_test_add_func("/plan/rank-keeps-runs", test_rank_keeps_runs);
    return plan_common_run();
}
