/* test_fuzz_replay: every fuzz harness (tests/fuzz/) over its seed corpus (and
 * tests/fuzz/corpus/TARGET/ where the seeds live elsewhere) and every past crash input in
 * tests/fuzz/regressions/TARGET/, so a fixed crash stays fixed without a fuzzer. */
#include "fuzz.h"

#include <glib.h>
#include <string.h>

typedef struct {
    const char *name;
    FuzzTarget run;
    const char *seeds; /* directory of the seed corpus, under the source tree */
    guint min_seeds;   /* a corpus that went missing fails */
} Target;

static const Target targets[] = {
    {"model", fuzz_model, "models", 10},
    {"hfconfig", fuzz_hfconfig, "models/hf", 6},
    {"hwprofile", fuzz_hwprofile, "hwprofiles", 4},
    {"dsconfig", fuzz_dsconfig, "tests/fuzz/corpus/dsconfig", 3},
    {"schedule", fuzz_schedule, "tests/fuzz/corpus/schedule", 4},
    {"measured", fuzz_measured, "tests/fuzz/corpus/measured", 1},
    {"predicted", fuzz_predicted, "tests/fuzz/corpus/predicted", 1},
    {"microbench", fuzz_microbench, "tests/fuzz/corpus/microbench", 1},
    {"torchtrace", fuzz_torchtrace, "tests/fuzz/corpus/torchtrace", 3},
    {"megatronargs", fuzz_megatronargs, "tests/fuzz/corpus/megatronargs", 3},
};

/* Runs the target on every file of DATA_DIR/dir, and on DIR/config.json of every folder that
 * holds one (models/hf/NAME/, a Hugging Face checkpoint's layout); returns how many (0 when
 * dir is absent). */
static guint replay_dir(const Target *t, const char *dir)
{
    char *path = g_build_filename(ZP_DATA_DIR, dir, NULL);
    GDir *d = g_dir_open(path, 0, NULL);
    guint n = 0;
    const char *entry;
    while (d && (entry = g_dir_read_name(d))) {
        char *file = g_build_filename(path, entry, NULL), *data = NULL;
        gsize size = 0;
        if (g_file_test(file, G_FILE_TEST_IS_DIR)) {
            char *config = g_build_filename(file, "config.json", NULL);
            g_free(file);
            if (!g_file_test(config, G_FILE_TEST_IS_REGULAR)) {
                g_free(config);
                continue;
            }
            file = config;
        }
        g_assert_true(g_file_get_contents(file, &data, &size, NULL));
        g_test_message("%s: %s", t->name, file);
        t->run((const uint8_t *)data, size);
        g_free(data);
        g_free(file);
        n++;
    }
    if (d)
        g_dir_close(d);
    g_free(path);
    return n;
}

static void test_replay(gconstpointer data)
{
    const Target *t = data;
    g_assert_cmpuint(replay_dir(t, t->seeds), >=, t->min_seeds);
    /* Seeds of a target whose corpus is the shipped files (hwprofiles/) that those lack: a
     * calibrated profile with its collective table. */
    char *corpus = g_build_filename("tests/fuzz/corpus", t->name, NULL);
    if (strcmp(corpus, t->seeds) != 0)
        g_test_message("%s: %u more seeds in %s", t->name, replay_dir(t, corpus), corpus);
    g_free(corpus);
    char *regressions = g_build_filename("tests/fuzz/regressions", t->name, NULL);
    g_test_message("%s: %u past crash inputs", t->name, replay_dir(t, regressions));
    g_free(regressions);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(targets); i++) {
        char *name = g_strdup_printf("/fuzz-replay/%s", targets[i].name);
        g_test_add_data_func(name, &targets[i], test_replay);
        g_free(name);
    }
    return g_test_run();
}
