/* test_cli: zplan's command line end to end — the JSON figures, help for every
 * subcommand, and every bad-input case: one stderr line naming the fault, non-zero exit. */
#include "zp_util.h"

#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

static char *tmp_dir;

static char *write_tmp(const char *name, const char *contents)
{
    char *path = g_build_filename(tmp_dir, name, NULL);
    g_assert_true(g_file_set_contents(path, contents, -1, NULL));
    return path;
}

static void test_memory_json_figures(void)
{
    json_t *root = tu_zplan_json("memory --params 7.5e9 --gpus 64 --json");
    g_assert_cmpint(json_integer_value(json_object_get(root, "params")), ==, 7500000000);
    json_t *row = json_array_get(json_object_get(root, "rows"), 0);
    g_assert_cmpint(json_integer_value(json_object_get(row, "gpus")), ==, 64);
    const double expected[4] = {120e9, 31.40625e9, 16.640625e9, 1.875e9};
    for (int stage = 0; stage <= 3; stage++) {
        char key[8];
        g_snprintf(key, sizeof key, "stage%d", stage);
        g_assert_cmpfloat(json_number_value(json_object_get(row, key)), ==, expected[stage]);
    }
    json_decref(root);
}

/* --no-dropout: the activations of a block fall from s b h (34 + 5 a s/h) to s b h
 * (32 + 2 a s/h) bytes (Korthikanti et al. without the masks and dropout outputs); for
 * GPT-2 124M (a = 12, s = 1024, h = 768) that is 114 to 64 per s b h, beside the LayerNorms'
 * fp32 statistics (16 s b a block) either way, with nothing else. */
static void test_no_dropout(void)
{
    const char *args = "simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 1 "
                       "--micro-batch 4 --attention eager --json";
    char *no_dropout = g_strdup_printf("%s --no-dropout", args);
    json_t *with = tu_zplan_json(args), *without = tu_zplan_json(no_dropout);
    const double sbh_L = 1024.0 * 4 * 768 * 12, ln_stats = 16 * 1024.0 * 4 * 12;
    const char *keys[] = {"category_peak_bytes", "activations"};
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(with, keys[0]), keys[1])),
                      ==, 114 * sbh_L + ln_stats);
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(without, keys[0]), keys[1])),
                      ==, 64 * sbh_L + ln_stats);
    json_decref(with), json_decref(without);
    g_free(no_dropout);
}

static void test_maxmodel_json(void)
{
    json_t *root = tu_zplan_json("maxmodel --gpu-memory 32e9 --gpus 64 --json");
    g_assert_cmpfloat(json_number_value(json_object_get(root, "stage0")), ==, 2e9);
    g_assert_cmpfloat(json_number_value(json_object_get(root, "stage3")), ==, 128e9);
    json_decref(root);
    root = tu_zplan_json("maxmodel --cluster dgx2-v100 --gpus 1024 --mp 16 --json");
    g_assert_cmpint(json_integer_value(json_object_get(root, "dp")), ==, 64);
    json_decref(root);
}

static void test_human_tables(void)
{
    TuRun r = tu_zplan("memory --model gpt2-1.5b --cluster dgx2-v100 --gpus 64");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "GB = 1e9 bytes"));
    g_assert_nonnull(strstr(r.out, "1,557,611,200"));
    g_assert_nonnull(strstr(r.out, "fits in GPU memory?"));
    tu_free(&r);
}

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
}

/* The verdict first: simulate and memory open with whether it fits, the need against the
 * GPU's capacity in GB and GiB, and the headroom or shortfall; exit status 2 when it does not
 * fit, in JSON too, and nothing on stderr. */
static void test_verdict_first(void)
{
    const struct {
        const char *args;
        int status;
        const char *first_line;
    } cases[] = {
        {"simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --stage 2 --micro-batch 4 "
         "--impl paper",
         2, "Does not fit: the step needs 723.9 GB per GPU (allocator-reserved peak + 1.0 GB "
            "reserve) of 80 GiB (85.9 GB), 638.0 GB short.\n"},
        {"simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --stage 3 --micro-batch 1 "
         "--checkpoint --impl paper", 0,
         "Fits: the step needs 61.7 GB per GPU (allocator-reserved peak + 1.0 GB reserve) of "
         "80 GiB (85.9 GB), 24.2 GB headroom.\n"},
        /* memory's need is simulate's for the same plan: the allocator-reserved peak +
         * reserve (simulate --stage 3 --micro-batch 1 says 139.6 GB too) */
        {"memory --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --impl paper", 2,
         "Does not fit: stage 3 on 64 GPUs needs 139.6 GB per GPU"},
        {"memory --model gpt2-1.5b --cluster dgx2-v100 --gpus 64 --impl paper", 0,
         "Fits: stage 3 on 64 GPUs needs 12.0 GB per GPU"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        TuRun r = tu_zplan(cases[i].args);
        g_test_message("zplan %s -> %d", cases[i].args, exit_status(&r));
        g_assert_cmpint(exit_status(&r), ==, cases[i].status);
        g_assert_true(g_str_has_prefix(r.out, cases[i].first_line));
        g_assert_cmpstr(r.err, ==, "");
        tu_free(&r);
        char *json = g_strdup_printf("%s --json", cases[i].args);
        r = tu_zplan(json);
        g_assert_cmpint(exit_status(&r), ==, cases[i].status);
        json_t *root = json_loads(r.out, 0, NULL);
        g_assert_nonnull(root);
        json_decref(root);
        tu_free(&r);
        g_free(json);
    }
    /* What does not fit for its activations says that checkpointing would fit it, needing
     * what `simulate` says of that plan (the second case: 61.7 GB). */
    TuRun m = tu_zplan("memory --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --impl paper");
    g_assert_nonnull(strstr(m.out, ".\nWith --checkpoint it fits: stage 3 needs 61.7 GB per GPU, "
                                   "24.2 GB headroom.\n"));
    tu_free(&m);
    m = tu_zplan("memory --model gpt3-175b --cluster dgx-a100-80g --gpus 8 --checkpoint");
    g_assert_true(g_str_has_prefix(m.out, "Does not fit: stage 3 on 8 GPUs"));
    g_assert_null(strstr(m.out, "With --checkpoint"));
    tu_free(&m);
    /* A step that is mostly exposed communication says why on its second line. */
    TuRun r = tu_zplan("simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --mp 8 "
                       "--stage 3 --micro-batch 1 --checkpoint");
    g_assert_cmpint(exit_status(&r), ==, 0);
    char **lines = g_strsplit(r.out, "\n", 3);
    g_assert_true(g_str_has_prefix(lines[1], "Mostly exposed communication ("));
    g_assert_true(g_str_has_suffix(lines[1], "stage-3 gathers are not prefetched: "
                                             "stage3_prefetch_bucket_size 5e7 is smaller than "
                                             "one block (2.3e8 elements)."));
    g_strfreev(lines);
    tu_free(&r);
}

/* Sizes take suffixes: counts K, M, B, T; bytes KB ... TB and KiB ... TiB. */
static void test_size_suffixes(void)
{
    const struct {
        const char *text;
        ZpSizeUnit unit;
        double value;
    } good[] = {
        {"7B", ZP_SIZE_COUNT, 7e9},         {"1.5e9", ZP_SIZE_COUNT, 1.5e9},
        {"175B", ZP_SIZE_COUNT, 175e9},     {"1T", ZP_SIZE_COUNT, 1e12},
        {"1.1K", ZP_SIZE_COUNT, 1100},      {"80GB", ZP_SIZE_BYTES, 80e9},
        {"80GiB", ZP_SIZE_BYTES, 85899345920.0}, {"32e9", ZP_SIZE_BYTES, 32e9},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(good); i++) {
        double v = 0;
        GError *error = NULL;
        g_assert_true(zp_parse_size(good[i].text, "--x", good[i].unit, 1, 1e15, TRUE, &v, &error));
        g_assert_no_error(error);
        g_assert_cmpfloat(v, ==, good[i].value);
    }
    const struct {
        const char *text;
        ZpSizeUnit unit;
        const char *message;
    } bad[] = {
        {"7Q", ZP_SIZE_COUNT, "--x: '7Q' is not a number (suffixes: K, M, B, T)"},
        {"-1B", ZP_SIZE_COUNT, "--x: '-1B' is outside [1, 1e+15]"},
        {"1e400", ZP_SIZE_COUNT, "--x: '1e400' is not a number (suffixes: K, M, B, T)"},
        {"80GB", ZP_SIZE_COUNT, "--x: '80GB' is not a number"},
        {"7B", ZP_SIZE_BYTES, "--x: '7B' is not a number (suffixes: KB, MB, GB, TB, KiB, MiB, GiB, TiB)"},
        {"1.5K", ZP_SIZE_BYTES, "is not a number"},
        {"B", ZP_SIZE_COUNT, "--x: 'B' is not a number"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        double v = -1;
        GError *error = NULL;
        g_assert_false(zp_parse_size(bad[i].text, "--x", bad[i].unit, 1, 1e15, TRUE, &v, &error));
        g_assert_nonnull(strstr(error->message, bad[i].message));
        g_assert_cmpfloat(v, ==, -1);
        g_clear_error(&error);
    }
    /* On the command line: --params, --gpu-memory. */
    json_t *root = tu_zplan_json("memory --params 7B --gpus 64 --json");
    g_assert_cmpint(json_integer_value(json_object_get(root, "params")), ==, 7000000000);
    json_decref(root);
    root = tu_zplan_json("maxmodel --gpu-memory 80GiB --gpus 64 --json");
    json_t *same = tu_zplan_json("maxmodel --gpu-memory 85899345920 --gpus 64 --json");
    g_assert_true(json_equal(root, same));
    json_decref(root), json_decref(same);
}

static char *replace(const char *text, const char *placeholder, const char *value)
{
    char **parts = g_strsplit(text, placeholder, -1);
    char *out = g_strjoinv(value, parts);
    g_strfreev(parts);
    return out;
}

/* Every command that takes a model takes --seq, and the answer follows it: the output (or the
 * file written) differs between two sequence lengths. */
static void test_seq_everywhere(void)
{
    const struct {
        const char *command; /* {D} the directory, {S} the sequence length */
        const char *file;    /* what is compared, NULL: stdout */
    } cases[] = {
        {"zplan memory --model gpt2-124m --cluster dgx-h100 --gpus 8 --json --seq {S}", NULL},
        {"zplan simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --json --seq {S}", NULL},
        {"zplan plan --model gpt2-124m --cluster dgx-h100 --gpus 8 --top 1 --json --seq {S}", NULL},
        {"zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 1 --seq {S} --out {D}/s.json", "s.json"},
        {"zplan sweep --vary gpus --values 8,16 --model gpt2-124m --cluster dgx-h100 --metric memory --seq {S} --out {D}/sw", "sw.csv"},
        {"zreal --model tiny --emulate 2 --steps 1 --seq {S} --out {D}/m.json", "m.json"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *outputs[2];
        const int seqs[2] = {16, 32};
        for (int k = 0; k < 2; k++) {
            char seq[16];
            g_snprintf(seq, sizeof seq, "%d", seqs[k]);
            char *args = replace(cases[i].command, "{D}", tmp_dir);
            char *with_seq = replace(args, "{S}", seq);
            char *command = g_strdup_printf("%s/%s", ZP_BUILD_DIR, with_seq);
            g_free(with_seq);
            TuRun r = tu_run(command, NULL);
            g_test_message("%s -> %s", args, r.err);
            g_assert_true(g_spawn_check_wait_status(r.status, NULL));
            if (cases[i].file) {
                char *path = g_build_filename(tmp_dir, cases[i].file, NULL);
                g_assert_true(g_file_get_contents(path, &outputs[k], NULL, NULL));
                g_remove(path);
                g_free(path);
            } else {
                outputs[k] = g_strdup(r.out);
            }
            tu_free(&r);
            g_free(command);
            g_free(args);
        }
        g_assert_cmpstr(outputs[0], !=, outputs[1]);
        g_free(outputs[0]), g_free(outputs[1]);
    }
    char *svg = g_build_filename(tmp_dir, "sw.svg", NULL);
    g_remove(svg);
    g_free(svg);
}

/* validate's rows come largest miss first (rows without both figures last), in JSON and in
 * the table alike; swapped files are named as swapped (tests/test_bad_input). */
static void test_validate_sorted(void)
{
    const char *files = ZP_DATA_DIR "/tests/fuzz/corpus/predicted/predicted-tiny.json "
                        ZP_DATA_DIR "/tests/fuzz/corpus/measured/measured-tiny.json";
    char *args = g_strdup_printf("validate %s --json", files);
    json_t *root = tu_zplan_json(args);
    json_t *rows = json_object_get(root, "rows");
    g_assert_cmpuint(json_array_size(rows), >, 5);
    double last = INFINITY;
    gboolean some_miss = FALSE;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        json_t *pv = json_object_get(row, "predicted"), *mv = json_object_get(row, "measured");
        const double p = json_number_value(pv), m = json_number_value(mv);
        const double miss = !json_is_number(pv) || !json_is_number(mv) ? -1
                            : p == m                                    ? 0
                            : p == 0                                    ? INFINITY
                                                                        : fabs((m - p) / p);
        g_assert_cmpfloat(miss, <=, last);
        last = miss;
        some_miss = some_miss || miss > 0;
    }
    g_assert_true(some_miss);
    json_decref(root);
    g_free(args);
    args = g_strdup_printf("validate %s", files);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "largest miss first"));
    tu_free(&r);
    g_free(args);
}

/* A calibration fit whose residual is over 10% warns on stderr, naming the ops, one line each;
 * the profile is still written and stdout says so. The corpus run is a noisy one. */
static void test_calibrate_warns(void)
{
    char *out = g_build_filename(tmp_dir, "cal.json", NULL);
    char *args = g_strdup_printf("calibrate " ZP_DATA_DIR "/tests/fuzz/corpus/microbench/"
                                 "microbench-2.json --out %s", out);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_true(g_str_has_prefix(r.out, "wrote "));
    json_t *profile = json_load_file(out, 0, NULL);
    json_t *cal = json_object_get(profile, "calibration");
    const struct {
        const char *key, *ops;
    } fits[] = {
        {"gemm_rms_rel_error", "the fit of the GEMMs (the peak FLOP/s)"},
        {"memory_rms_rel_error", "the fit of the optimizer step, Adam (hbm_bytes_per_s)"},
        {"elementwise_rms_rel_error", "the fit of the block kernels, GELU, layer norm and "
                                      "residual add (elementwise_bytes_per_s)"},
        {"collective_rms_rel_error", "the fit of the collectives, all-reduce, reduce-scatter "
                                     "and all-gather (collective_fit)"},
    };
    int warned = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(fits); i++) {
        const double rms = json_number_value(json_object_get(cal, fits[i].key));
        char *line = g_strdup_printf("%s misses its samples by %.1f%%", fits[i].ops, 100 * rms);
        g_assert_true((strstr(r.err, line) != NULL) == (rms > 0.10));
        warned += rms > 0.10;
        g_free(line);
    }
    g_assert_cmpint(warned, >, 0);
    char **lines = g_strsplit(g_strstrip(r.err), "\n", -1);
    g_assert_cmpint((int)g_strv_length(lines), ==, warned);
    g_strfreev(lines);
    json_decref(profile);
    g_remove(out);
    tu_free(&r);
    g_free(args), g_free(out);
}

/* Progress goes to stderr only: forced on (ZPLAN_PROGRESS=always, as on a terminal after two
 * seconds), --json output still parses with stderr kept apart, and the progress line is on
 * stderr; without a terminal and unforced there is none. */
static void test_progress_off_stdout(void)
{
    const char *commands[] = {
        "simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --stage 3 --micro-batch 1 "
        "--checkpoint --explicit --json",
        "plan --model gpt3-175b --cluster dgx-a100-80g --gpus 64 --json",
    };
    const char *what[] = {"zplan simulate: 64 rank(s) of ", "zplan plan: simulating"};
    char **forced = g_environ_setenv(g_get_environ(), "ZPLAN_PROGRESS", "always", TRUE);
    char **plain = g_environ_unsetenv(g_get_environ(), "ZPLAN_PROGRESS");
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++) {
        char *command = g_strdup_printf("%s/zplan %s", ZP_BUILD_DIR, commands[i]);
        TuRun r = tu_run(command, forced);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        json_t *root = json_loads(r.out, 0, NULL);
        g_assert_nonnull(root);
        json_decref(root);
        g_assert_nonnull(strstr(r.err, what[i]));
        g_assert_null(strstr(r.out, what[i]));
        tu_free(&r);
        r = tu_run(command, plain);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        g_assert_cmpstr(r.err, ==, "");
        tu_free(&r);
        g_free(command);
    }
    g_strfreev(forced);
    g_strfreev(plain);
}

static void test_help(void)
{
    const char *commands[] = {"memory", "maxmodel"};
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++) {
        char *args = g_strdup_printf("%s --help", commands[i]);
        TuRun r = tu_zplan(args);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        g_assert_nonnull(strstr(r.out, "--json"));
        tu_free(&r);
        g_free(args);
    }
    TuRun r = tu_zplan("--help");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "maxmodel"));
    tu_free(&r);
}

/* Each case: arguments (with %s replaced by a temp file's path where given), the file's
 * contents, and a substring the single error line must contain. */
static const struct {
    const char *args, *file, *message;
} bad_cases[] = {
    {"memory --model %s --gpus 4", "{\"name\": \"x\", \"layers\": 2,\n \"hidden\": }", ":2:12: malformed JSON"},
    {"memory --model %s --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8}", "missing key \"hidden\""},
    {"memory --model %s --gpus 4", "{\"name\": \"x\", \"layers\": \"2\", \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8}", "key \"layers\" must be a whole number"},
    {"memory --model %s --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8, \"hiden\": 3}", "unknown key \"hiden\""},
    {"memory --model %s --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"hidden\": 8, \"heads\": 3, \"seq_len\": 8, \"vocab\": 8}", "does not divide hidden"},
    {"memory --model %s --gpus 4", "{\"name\": \"x\", \"layers\": -2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8}", "key \"layers\" = -2 is outside"},
    {"memory --model %s --gpus 4", "[1, 2]", "top level must be a JSON object"},
    {"memory --model nosuch --gpus 4", NULL, "unknown model 'nosuch' (known: "},
    /* The shipped Hugging Face configs are listed by the name --model takes. */
    {"memory --model llama-2-70b --gpus 4", NULL, ", hf/llama-2-70b, "},
    {"memory --model gpt2-1.5b --cluster nosuch --gpus 4", NULL, "unknown cluster 'nosuch' (known: "},
    {"memory --model gpt2-1.5b --cluster %s --gpus 4", "{\"name\": \"c\"}", "missing key \"gpu\""},
    {"memory --model gpt2-1.5b --cluster %s --gpus 4", "{\"name\": \"c\", \"gpu\": \"g\", \"gpus_per_node\": 0}", "key \"gpus_per_node\" = 0 is outside"},
    {"memory --params 1e30 --gpus 4", NULL, "--params: '1e30' is outside"},
    {"memory --params 0 --gpus 4", NULL, "--params: '0' is outside"},
    {"memory --params -5e9 --gpus 4", NULL, "--params: '-5e9' is outside"},
    {"memory --params lots --gpus 4", NULL, "--params: 'lots' is not a number"},
    {"memory --params 1e9 --gpus 0", NULL, "--gpus: '0' is outside"},
    {"memory --params 1e9 --gpus -8", NULL, "--gpus: '-8' is outside"},
    {"memory --params 1e9 --gpus 4.5", NULL, "--gpus: '4.5' must be a whole number"},
    {"memory --params 1e9 --gpus 1e9", NULL, "--gpus: '1e9' is outside"},
    {"memory --params 1e9", NULL, "--gpus N[,N...] is required"},
    {"memory --gpus 4", NULL, "give exactly one of --model"},
    {"memory --params 1e9 --model gpt2-1.5b --gpus 4", NULL, "give exactly one of --model"},
    {"memory --params 1e9 --gpus 64 --mp 3", NULL, "--mp: 3 does not divide --gpus 64"},
    {"memory --model gpt2-1.5b --gpus 64 --mp 2", NULL, "--mp: 2 does not divide the 25 attention heads"},
    {"memory --params 1e9 --gpus 4 --precision fp8", NULL, "--precision: unknown value 'fp8'"},
    {"memory --params 1e9 --gpus 4 --optimizer lion", NULL, "--optimizer: unknown value 'lion'"},
    {"memory --params 1e9 --gpus 4 stray", NULL, "unexpected argument 'stray'"},
    {"memory --params 1e9 --gpus 4 --frobnicate", NULL, "Unknown option --frobnicate"},
    {"maxmodel --gpus 64", NULL, "give --cluster NAME|PATH.json or --gpu-memory BYTES"},
    {"maxmodel --gpu-memory -1 --gpus 64", NULL, "--gpu-memory: '-1' is outside"},
    {"maxmodel --gpu-memory 32e9", NULL, "--gpus N is required"},
    {"maxmodel --gpu-memory 32e9 --gpus 0", NULL, "--gpus: '0' is outside"},
    {"maxmodel --gpu-memory 32e9 --cluster dgx2-v100 --gpus 8 --cpu-memory 1TB", NULL, "--cpu-memory: --cluster dgx2-v100 has its own host sizes"},
    {"frobnicate", NULL, "unknown command 'frobnicate'"},
};

static void test_bad_input(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        char *path = bad_cases[i].file ? write_tmp("spec.json", bad_cases[i].file) : NULL;
        char *args = path ? g_strdup_printf(bad_cases[i].args, path) : g_strdup(bad_cases[i].args);
        TuRun r = tu_zplan(args);
        g_test_message("case: zplan %s -> %s", args, r.err);
        g_assert_false(g_spawn_check_wait_status(r.status, NULL));
        g_assert_nonnull(strstr(r.err, bad_cases[i].message));
        /* One line on stderr, nothing on stdout. */
        g_assert_cmpint((int)(strchr(r.err, '\n') - r.err), ==, (int)strlen(r.err) - 1);
        g_assert_cmpstr(r.out, ==, "");
        if (path) /* a file error names the file */
            g_assert_true(strstr(r.err, path) || !strstr(bad_cases[i].message, "key"));
        tu_free(&r);
        g_free(args);
        g_free(path);
    }
}

/* Every shipped profile loads, and every number in it has its source in "notes". */
static void test_hwprofiles_have_sources(void)
{
    char *dir = g_build_filename(zp_data_dir(), "hwprofiles", NULL);
    GDir *d = g_dir_open(dir, 0, NULL);
    const char *entry;
    int profiles = 0;
    while ((entry = g_dir_read_name(d))) {
        if (!g_str_has_suffix(entry, ".json"))
            continue;
        char *path = g_build_filename(dir, entry, NULL);
        json_t *root = zp_json_load_object(path, NULL);
        g_assert_nonnull(root);
        json_t *notes = json_object_get(root, "notes");
        g_assert_true(json_is_object(notes));
        const char *key;
        json_t *value;
        json_object_foreach(root, key, value)
        {
            if (json_is_number(value)) {
                g_test_message("%s: %s", entry, key);
                g_assert_true(json_is_string(json_object_get(notes, key)));
            }
        }
        json_decref(root);
        char *name = g_strndup(entry, strlen(entry) - 5);
        char *args = g_strdup_printf("maxmodel --cluster %s --gpus 8 --json", name);
        json_decref(tu_zplan_json(args));
        g_free(args);
        g_free(name);
        g_free(path);
        profiles++;
    }
    g_dir_close(d);
    g_free(dir);
    g_assert_cmpint(profiles, >=, 4);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zplan-test-XXXXXX", NULL);
    g_test_add_func("/cli/memory-json-figures", test_memory_json_figures);
    g_test_add_func("/cli/maxmodel-json", test_maxmodel_json);
    g_test_add_func("/cli/no-dropout", test_no_dropout);
    g_test_add_func("/cli/human-tables", test_human_tables);
    g_test_add_func("/cli/help", test_help);
    g_test_add_func("/cli/verdict-first", test_verdict_first);
    g_test_add_func("/cli/size-suffixes", test_size_suffixes);
    g_test_add_func("/cli/seq-everywhere", test_seq_everywhere);
    g_test_add_func("/cli/validate-sorted", test_validate_sorted);
    g_test_add_func("/cli/calibrate-warns", test_calibrate_warns);
    g_test_add_func("/cli/progress-off-stdout", test_progress_off_stdout);
    g_test_add_func("/cli/bad-input", test_bad_input);
    g_test_add_func("/cli/hwprofiles-have-sources", test_hwprofiles_have_sources);
    int status = g_test_run();
    char *spec = g_build_filename(tmp_dir, "spec.json", NULL);
    g_remove(spec);
    g_rmdir(tmp_dir);
    g_free(spec);
    g_free(tmp_dir);
    return status;
}
