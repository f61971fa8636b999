/* test_consistency: one story across commands (issue 39 item 3). A grid of flags goes through
 * memory, simulate (its verdict's need_bytes) and sweep --metric memory, which must give the
 * same bytes per GPU for the
 * same plan; maxmodel and sweep --metric maxmodel the same largest model; and plan's plan 1,
 * written as a DeepSpeed config, the same step and memory when simulate reads it back; zreal
 * --like-simulate the plan simulate wrote, for validate. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

static char *dir;

static double csv_cell(const char *path, int row, int column)
{
    char *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
    char **lines = g_strsplit(text, "\n", -1);
    char **cells = g_strsplit(lines[row], ",", -1);
    const double value = cells[column] && *cells[column] ? g_ascii_strtod(cells[column], NULL)
                                                          : NAN;
    g_strfreev(cells), g_strfreev(lines), g_free(text);
    return value;
}

/* memory's need per stage = simulate's (allocator-reserved peak + reserve) = sweep's, over a
 * grid: two models (GPT-2 and a Hugging Face Llama with its bf16 and flash defaults), two
 * clusters, micro-batch 1 and 2, with and without checkpointing, stages 1-3. */
static void test_memory_grid(void)
{
    const char *models[] = {"gpt2-1.5b", "hf/llama-3-8b"};
    const char *clusters[] = {"dgx2-v100", "dgx-a100-80g"};
    const int gpus = 16;
    guint compared = 0;
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++)
        for (size_t ci = 0; ci < G_N_ELEMENTS(clusters); ci++)
            for (int micro = 1; micro <= 2; micro++)
                for (int ckpt = 0; ckpt <= 1; ckpt++) {
                    char *common = g_strdup_printf("--model %s --cluster %s --micro-batch %d%s",
                                                   models[mi], clusters[ci], micro,
                                                   ckpt ? " --checkpoint" : "");
                    char *args = g_strdup_printf("memory %s --gpus %d --json", common, gpus);
                    json_t *memory = tu_zplan_json_fit_or_not(args);
                    json_t *needs = json_object_get(
                        json_array_get(json_object_get(memory, "rows"), 0), "need_bytes");
                    g_free(args);
                    args = g_strdup_printf("sweep --vary gpus --values %d --metric memory %s "
                                           "--out %s/grid", gpus, common, dir);
                    tu_zplan_ok(args);
                    g_free(args);
                    char *csv = g_build_filename(dir, "grid.csv", NULL);
                    for (int stage = 1; stage <= 3; stage++) {
                        char key[8];
                        g_snprintf(key, sizeof key, "stage%d", stage);
                        const double need = json_number_value(json_object_get(needs, key));
                        args = g_strdup_printf("simulate %s --gpus %d --stage %d --json", common,
                                               gpus, stage);
                        json_t *sim = tu_zplan_json_fit_or_not(args);
                        g_free(args);
                        const double simulated =
                            json_number_value(json_object_get(sim, "need_bytes"));
                        g_test_message("%s stage %d: memory %.0f, simulate %.0f, sweep %.6g GB",
                                       common, stage, need, simulated,
                                       csv_cell(csv, 1, 1 + stage));
                        g_assert_cmpfloat(need, ==, simulated);
                        g_assert_cmpfloat(fabs(csv_cell(csv, 1, 1 + stage) - need / 1e9), <=,
                                          1e-5 * need / 1e9);
                        json_decref(sim);
                        compared++;
                    }
                    g_remove(csv);
                    g_free(csv);
                    char *svg = g_build_filename(dir, "grid.svg", NULL);
                    g_remove(svg);
                    g_free(svg);
                    json_decref(memory);
                    g_free(common);
                }
    g_assert_cmpuint(compared, ==, 48);
}

/* maxmodel and sweep --metric maxmodel: the same largest model per stage (maxmodel left the
 * runtime reserve in, the sweep took it out: 137.4B against 133.4B on 64 V100s). */
static void test_maxmodel_agrees(void)
{
    json_t *m = tu_zplan_json_fit_or_not("maxmodel --cluster dgx2-v100 --gpus 64 --json");
    char *args = g_strdup_printf("sweep --vary gpus --values 64 --cluster dgx2-v100 --metric "
                                 "maxmodel --out %s/mm", dir);
    tu_zplan_ok(args);
    char *csv = g_build_filename(dir, "mm.csv", NULL);
    for (int stage = 0; stage <= 3; stage++) {
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        const double params = json_number_value(json_object_get(m, key)) / 1e9;
        g_assert_cmpfloat(fabs(csv_cell(csv, 1, 1 + stage) - params), <=, 1e-5 * params);
    }
    g_remove(csv);
    char *svg = g_build_filename(dir, "mm.svg", NULL);
    g_remove(svg);
    g_free(svg), g_free(csv), g_free(args);
    json_decref(m);
}

/* A mixture of experts' data-parallel bytes are one figure everywhere: simulate's "dp" (the
 * dense parameters' DP group and the experts' expert-data-parallel group), memory's
 * comm_bytes_per_rank (Mixtral-8x7B's 9.48 GB of 39.08 at stage 1 on 64 H100s with EP 8: the
 * DP group's alone) and a pipeline's stage table (its "dp" column left the expert group out,
 * 2.26 of 6.49 GB on Mixtral's stage 0 at pp 2). */
static void test_moe_bytes_agree(void)
{
    const char *common = "--model moe-tiny --cluster dgx-h100 --gpus 8 --micro-batch 2 --ep 2";
    char *args = g_strdup_printf("memory %s --json", common);
    json_t *memory = tu_zplan_json_fit_or_not(args);
    json_t *comm = json_object_get(json_array_get(json_object_get(memory, "rows"), 0),
                                   "comm_bytes_per_rank");
    g_free(args);
    for (int stage = 0; stage <= 3; stage++) {
        args = g_strdup_printf("simulate %s --stage %d --json", common, stage);
        json_t *sim = tu_zplan_json_fit_or_not(args);
        json_t *bytes = json_object_get(sim, "comm_bytes_per_rank");
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        const double dp = json_number_value(json_object_get(bytes, "dp"));
        g_test_message("%s: memory %.0f, simulate dp %.0f (edp %.0f)", args,
                       json_number_value(json_object_get(comm, key)), dp,
                       json_number_value(json_object_get(bytes, "edp")));
        g_assert_cmpfloat(json_number_value(json_object_get(bytes, "edp")), >, 0);
        g_assert_cmpfloat(json_number_value(json_object_get(comm, key)), ==, dp);
        json_decref(sim);
        g_free(args);
    }
    json_decref(memory);
    args = g_strdup_printf("simulate %s --stage 1 --grad-accum 4 --pp 2 --json", common);
    json_t *sim = tu_zplan_json_fit_or_not(args);
    json_t *stages = json_object_get(sim, "stages");
    double most = 0;
    for (size_t k = 0; k < json_array_size(stages); k++) {
        json_t *stage_comm = json_object_get(json_array_get(stages, k), "comm_bytes");
        most = MAX(most, json_number_value(json_object_get(stage_comm, "dp")));
    }
    g_assert_cmpfloat(most, ==,
                      json_number_value(json_object_get(json_object_get(sim, "comm_bytes_per_rank"),
                                                        "dp")));
    json_decref(sim);
    g_free(args);
}

/* With offload, memory --json says what its text's offload table says (it had Table 1's model
 * states only), and its host memory per GPU is simulate's per rank, stage by stage. */
static void test_offload_tiers_agree(void)
{
    const char *common = "--model gpt2-1.5b --cluster dgx-a100-80g --gpus 16 --micro-batch 2 "
                         "--offload-optimizer cpu";
    char *args = g_strdup_printf("memory %s --json", common);
    json_t *memory = tu_zplan_json_fit_or_not(args);
    json_t *offload =
        json_object_get(json_array_get(json_object_get(memory, "rows"), 0), "offload");
    g_assert_nonnull(offload);
    g_free(args);
    for (int stage = 1; stage <= 3; stage++) {
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        json_t *tiers = json_object_get(offload, key);
        args = g_strdup_printf("simulate %s --stage %d --json", common, stage);
        json_t *sim = tu_zplan_json_fit_or_not(args);
        json_t *host = json_object_get(sim, "offload");
        g_test_message("%s: memory host %.0f, simulate %.0f", args,
                       json_number_value(json_object_get(tiers, "host_bytes_per_gpu")),
                       json_number_value(json_object_get(host, "host_bytes_per_rank")));
        g_assert_cmpfloat(json_number_value(json_object_get(tiers, "host_bytes_per_gpu")), >, 0);
        g_assert_cmpfloat(json_number_value(json_object_get(tiers, "host_bytes_per_gpu")), ==,
                          json_number_value(json_object_get(host, "host_bytes_per_rank")));
        g_assert_cmpfloat(json_number_value(json_object_get(tiers, "host_bytes_per_node")), ==,
                          json_number_value(json_object_get(host, "host_bytes_per_node")));
        json_decref(sim);
        g_free(args);
    }
    json_decref(memory);
}

/* plan's plan 1 read back by simulate from the DeepSpeed config plan writes: the same step
 * time and bytes, the defaults (bf16 from torch_dtype, flash attention, sequence 4096) the
 * same in both. */
static void test_plan_round_trip(void)
{
    char *ds = g_build_filename(dir, "ds.json", NULL);
    char *args = g_strdup_printf("plan --model hf/llama-3-8b --cluster dgx-h100 --gpus 16 --top 1 "
                                 "--json --ds-config %s", ds);
    json_t *plan = tu_zplan_json_fit_or_not(args);
    json_t *best = json_object_get(plan, "best");
    g_free(args);
    args = g_strdup_printf("simulate --model hf/llama-3-8b --cluster dgx-h100 --gpus 16 "
                           "--ds-config %s --json", ds);
    json_t *sim = tu_zplan_json_fit_or_not(args);
    g_assert_cmpfloat(json_number_value(json_object_get(sim, "step_time_s")), ==,
                      json_number_value(json_object_get(best, "step_time_s")));
    const double reserved = json_number_value(
        json_object_get(json_object_get(sim, "caching_allocator"), "peak_reserved_bytes"));
    g_assert_cmpfloat(reserved + 1e9, ==,
                      json_number_value(json_object_get(best, "peak_memory_bytes")));
    g_remove(ds);
    g_free(ds), g_free(args);
    json_decref(plan), json_decref(sim);
}

/* The same with `plan --3d`'s plan 1 on an interleaved pipeline: the config holds its schedule
 * (zplan's keys; DeepSpeed's engine runs 1F1B, which plan says), so simulate reads back that
 * plan, not its 1F1B twin (33.60 s and 78.0 GB ranked, 35.23 s and 69.5 GB read back). */
static void test_plan_round_trip_pipeline(void)
{
    char *ds = g_build_filename(dir, "ds-3d.json", NULL);
    const char *common = "--model gpt3-175b --cluster dgx-a100-80g --gpus 512";
    char *args = g_strdup_printf("plan %s --global-batch 1536 --3d --top 1 --json --ds-config %s",
                                 common, ds);
    json_t *plan = tu_zplan_json_fit_or_not(args);
    json_t *best = json_object_get(plan, "best");
    json_t *pipe = json_object_get(best, "pipeline");
    g_assert_nonnull(pipe);
    g_assert_cmpstr(json_string_value(json_object_get(pipe, "schedule")), ==, "interleaved");
    g_free(args);
    args = g_strdup_printf("simulate %s --ds-config %s --json", common, ds);
    json_t *sim = tu_zplan_json_fit_or_not(args);
    g_assert_cmpfloat(json_number_value(json_object_get(sim, "step_time_s")), ==,
                      json_number_value(json_object_get(best, "step_time_s")));
    g_assert_cmpfloat(json_number_value(json_object_get(sim, "need_bytes")), ==,
                      json_number_value(json_object_get(best, "peak_memory_bytes")));
    g_assert_cmpstr(json_string_value(json_object_get(sim, "pp_schedule")), ==, "interleaved");
    g_free(args);
    args = g_strdup_printf("plan %s --global-batch 1536 --3d --top 1 --ds-config %s", common, ds);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "(its pipeline.schedule \"interleaved\" is zplan's key"));
    tu_free(&r);
    g_remove(ds);
    g_free(ds), g_free(args);
    json_decref(plan), json_decref(sim);
}

/* zreal --like-simulate runs the plan simulate wrote, with simulate's defaults (DeepSpeed's
 * semantics, the cluster's attention kernel), so validate compares the two as they are; the
 * same zreal run on its own defaults (the paper's semantics, eager) is refused as another
 * plan. */
static void test_zreal_like_simulate(void)
{
    char *predicted = g_build_filename(dir, "p.json", NULL);
    char *measured = g_build_filename(dir, "m.json", NULL);
    char *args = g_strdup_printf("%s/zplan simulate --model tiny --cluster dgx-h100 --gpus 2 "
                                 "--stage 3 --micro-batch 2 --precision bf16 --json",
                                 ZP_BUILD_DIR);
    TuRun r = tu_run(args, NULL);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_true(g_file_set_contents(predicted, r.out, -1, NULL));
    tu_free(&r);
    g_free(args);
    const char *modes[] = {"--like-simulate", NULL};
    for (size_t i = 0; i < G_N_ELEMENTS(modes); i++) {
        char *flag = modes[i] ? g_strdup_printf("%s %s", modes[i], predicted)
                              : g_strdup("--stage 3 --micro-batch 2");
        args = g_strdup_printf("%s/zreal --model tiny --emulate 2 --steps 2 %s --out %s",
                               ZP_BUILD_DIR, flag, measured);
        r = tu_run(args, NULL);
        g_test_message("%s: %s", args, r.err);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        tu_free(&r);
        g_free(args);
        args = g_strdup_printf("validate %s %s", predicted, measured);
        r = tu_zplan(args);
        g_test_message("validate: %s", r.err);
        if (modes[i]) {
            g_assert_true(g_spawn_check_wait_status(r.status, NULL));
            g_assert_nonnull(strstr(r.out, "  model states "));
        } else {
            g_assert_cmpint(WEXITSTATUS(r.status), ==, 1); /* not the same plan */
        }
        tu_free(&r);
        g_free(args), g_free(flag);
        g_remove(measured);
    }
    r = tu_run(ZP_BUILD_DIR "/zreal --model tiny --emulate 4 --steps 1 --like-simulate "
               "/dev/null", NULL);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r);
    g_remove(predicted);
    g_free(predicted), g_free(measured);
}

/* zreal computes in bf16 only (real/: RealBf16 activations, parameters and gradients; no
 * fp16 loss scaling, no fp32 path), so a plan simulate made in fp16 (a zplan model JSON
 * without torch_dtype: tiny) or fp32 is refused in one line naming the file, the flag, the
 * precision and the remedy, with status 1 and no measurement written; the same plan in bf16
 * runs (/consistency/zreal-like-simulate). A schedule file of an fp16 plan is refused too:
 * zreal ran it in bf16 and wrote a measurement named fp16. */
static void test_zreal_like_simulate_precision(void)
{
    static const char *const precisions[] = {"fp16", "fp32"};
    for (size_t i = 0; i < G_N_ELEMENTS(precisions); i++) {
        char *predicted = g_build_filename(dir, "p-prec.json", NULL);
        char *measured = g_build_filename(dir, "m-prec.json", NULL);
        char *args = g_strdup_printf("%s/zplan simulate --model tiny --cluster dgx-h100 --gpus 2 "
                                     "--stage 3 --micro-batch 2 --precision %s --json",
                                     ZP_BUILD_DIR, precisions[i]);
        TuRun r = tu_run(args, NULL);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        g_assert_true(g_file_set_contents(predicted, r.out, -1, NULL));
        tu_free(&r);
        g_free(args);
        args = g_strdup_printf("%s/zreal --model tiny --emulate 2 --steps 1 --like-simulate %s "
                               "--out %s", ZP_BUILD_DIR, predicted, measured);
        r = tu_run(args, NULL);
        g_assert_true(WIFEXITED(r.status));
        g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
        char *want = g_strdup_printf("--like-simulate: %s's plan computes in %s; zreal computes "
                                     "in bf16 (simulate with --precision bf16)\n",
                                     predicted, precisions[i]);
        g_assert_true(g_str_has_suffix(r.err, want));
        g_assert_false(g_file_test(measured, G_FILE_TEST_EXISTS));
        g_free(want);
        tu_free(&r);
        g_free(args);
        g_remove(predicted);
        g_free(predicted), g_free(measured);
    }
    char *sched = g_build_filename(dir, "s-fp16.json", NULL);
    char *measured = g_build_filename(dir, "m-fp16.json", NULL);
    char *args = g_strdup_printf("schedule --model tiny --gpus 2 --stage 1 --micro-batch 2 "
                                 "--no-dropout --attention eager --out %s", sched);
    tu_zplan_ok(args);
    g_free(args);
    args = g_strdup_printf("%s/zreal --schedule %s --emulate 2 --steps 1 --out %s", ZP_BUILD_DIR,
                           sched, measured);
    TuRun r = tu_run(args, NULL);
    g_assert_true(WIFEXITED(r.status));
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
    g_assert_nonnull(strstr(r.err, "zreal trains in bf16 with Adam; the schedule's plan has fp16, "
                                   "adam (build it with zplan schedule --precision bf16)"));
    g_assert_false(g_file_test(measured, G_FILE_TEST_EXISTS));
    tu_free(&r);
    g_free(args);
    g_remove(sched);
    g_free(sched), g_free(measured);
}

/* memory's model states are simulate's where the schedule holds them whole at rest: FSDP's
 * stage 3, and FSDP2's stages 2 and 3, whose fp32 shards are the master weights with no 16-bit
 * copy beside them (memory counted 2 + 4 + 12 bytes a parameter, 0.195 GB too many of
 * GPT-2 1.5B's 1.558 GB on 16 GPUs, where simulate held 4 + 12). */
static void test_memory_states_fsdp(void)
{
    static const struct {
        const char *impl;
        int stage;
    } plans[] = {{"fsdp", 3}, {"fsdp2", 2}, {"fsdp2", 3}};
    const char *common = "--model gpt2-1.5b --cluster dgx-h100 --gpus 16 --micro-batch 1";
    char *args = g_strdup_printf("memory %s --impl fsdp2 --json", common);
    json_t *fsdp2 = tu_zplan_json_fit_or_not(args);
    g_free(args);
    args = g_strdup_printf("memory %s --impl fsdp --json", common);
    json_t *fsdp = tu_zplan_json_fit_or_not(args);
    g_free(args);
    for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
        json_t *memory = g_str_equal(plans[i].impl, "fsdp2") ? fsdp2 : fsdp;
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", plans[i].stage);
        json_t *row = json_array_get(json_object_get(memory, "rows"), 0);
        const double states = json_number_value(json_object_get(
            json_object_get(json_object_get(row, "model_states"), key), "total_bytes"));
        args = g_strdup_printf("simulate %s --impl %s --stage %d --json", common, plans[i].impl,
                               plans[i].stage);
        json_t *sim = tu_zplan_json_fit_or_not(args);
        const double held = json_number_value(json_object_get(sim, "model_state_bytes"));
        g_test_message("%s: memory %.0f, simulate %.0f", args, states, held);
        g_assert_cmpfloat(states, ==, held);
        g_assert_cmpfloat(json_number_value(json_object_get(row, key)), ==, held);
        json_decref(sim);
        g_free(args);
    }
    json_decref(fsdp2), json_decref(fsdp);
    /* and the text says why its stages 2-3 hold less than its header's bytes per parameter */
    TuRun r = tu_zplan("memory --params 7B --gpus 16 --impl fsdp2");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "Stages 2-3 (fsdp2): the fp32 shards are the master weights, "
                                   "0 + 4 + 12.\n"));
    /* (FSDP2 has no stages 0 and 1: "n/a") */
    g_assert_nonnull(strstr(r.out, "       16      16        n/a        n/a      7.000      7.000"));
    tu_free(&r);
    /* nor Megatron stages 2 and 3, whose figures were printed as the paper's formula's */
    r = tu_zplan("memory --params 7B --gpus 16 --impl megatron --precision bf16");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "       16      16    126.000     47.250        n/a        n/a"));
    tu_free(&r);
    json_t *mg = tu_zplan_json("memory --params 7B --gpus 16 --impl megatron --precision bf16 "
                               "--json");
    json_t *row = json_array_get(json_object_get(mg, "rows"), 0);
    g_assert_cmpfloat(json_number_value(json_object_get(row, "stage1")), ==, 47.25e9);
    for (int stage = 2; stage <= 3; stage++) {
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        g_assert_true(json_is_null(json_object_get(row, key)));
        g_assert_true(json_is_null(json_object_get(json_object_get(row, "model_states"), key)));
        g_assert_true(json_is_null(json_object_get(json_object_get(row, "need_bytes"), key)));
    }
    json_decref(mg);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    dir = g_dir_make_tmp("zplan-consistency-XXXXXX", NULL);
    g_test_add_func("/consistency/memory-grid", test_memory_grid);
    g_test_add_func("/consistency/maxmodel-agrees", test_maxmodel_agrees);
    g_test_add_func("/consistency/memory-states-fsdp", test_memory_states_fsdp);
    g_test_add_func("/consistency/moe-bytes-agree", test_moe_bytes_agree);
    g_test_add_func("/consistency/offload-tiers-agree", test_offload_tiers_agree);
    g_test_add_func("/consistency/plan-round-trip", test_plan_round_trip);
    g_test_add_func("/consistency/plan-round-trip-pipeline", test_plan_round_trip_pipeline);
    g_test_add_func("/consistency/zreal-like-simulate", test_zreal_like_simulate);
    g_test_add_func("/consistency/zreal-like-simulate-precision",
                    test_zreal_like_simulate_precision);
    const int status = g_test_run();
    g_rmdir(dir);
    g_free(dir);
    return status;
}
