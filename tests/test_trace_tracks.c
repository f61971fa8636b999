/* test_trace_tracks: the Perfetto trace names what it shows (issue 39 item 9): a block op split
 * per module is named with its module ("fwd L1 qkv") and carries it in its args, and no track
 * is declared that holds nothing (a declared empty nvme or pp-send track read as a stream that
 * idled all step). */
#include "testutil.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static void test_modules_and_tracks(void)
{
    char *dir;
    char *path = tu_tmp_file("trace", "t.json", &dir);
    char *args = g_strdup_printf("simulate --model gpt2-124m --cluster dgx-h100 --gpus 16 "
                                 "--stage 3 --micro-batch 1 --trace %s", path);
    tu_zplan_ok(args);
    json_t *root = json_load_file(path, 0, NULL);
    g_assert_nonnull(root);
    json_t *events = json_object_get(root, "traceEvents");
    gboolean declared[64] = {FALSE}, used[64] = {FALSE}, qkv = FALSE;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e)
    {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        const json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        if (tid < 0 || tid >= 64)
            continue;
        if (strcmp(ph, "M") == 0 && strcmp(name, "thread_name") == 0)
            declared[tid] = TRUE;
        if (strcmp(ph, "X") == 0) {
            used[tid] = TRUE;
            if (strcmp(name, "fwd L1 qkv") == 0) {
                qkv = TRUE;
                json_t *a = json_object_get(e, "args");
                g_assert_cmpstr(json_string_value(json_object_get(a, "module")), ==, "qkv");
                g_assert_cmpint(json_integer_value(json_object_get(a, "unit")), ==, 1);
            }
        }
    }
    g_assert_true(qkv);
    guint tracks = 0;
    for (int t = 0; t < 64; t++) {
        g_assert_true(!declared[t] || used[t]); /* no declared track without an op */
        tracks += declared[t];
    }
    g_assert_cmpuint(tracks, ==, 2); /* compute and dp-comm: no tp, pp, host or NVMe here */
    json_decref(root);
    tu_tmp_file_remove(path, dir);
    g_free(args);
}

/* The memory counters reach the peaks simulate reports: each pipeline stage's (its process)
 * and, without a pipeline, the step's. The trace drew each instant's end state only, and a
 * step's peak is often inside an instant (a buffer allocated before another is freed): 13.62
 * GB of gpt-13b's 1F1B stage 3 that peaked at 14.47 GB, 19.48 of 19.69 GB at stage 3. */
static void test_memory_peaks(void)
{
    static const char *const plans[] = {
        "--model gpt-13b --cluster dgx-h100 --gpus 32 --stage 1 --micro-batch 1 --grad-accum 16 "
        "--pp 4 --mp 2",
        "--model gpt-13b --cluster dgx-a100-80g --gpus 32 --stage 3 --micro-batch 2 --grad-accum 4 "
        "--mp 2",
    };
    for (size_t p = 0; p < G_N_ELEMENTS(plans); p++) {
        char *dir;
        char *path = tu_tmp_file("trace", "m.json", &dir);
        char *args = g_strdup_printf("simulate %s --json --trace %s", plans[p], path);
        json_t *sim = tu_zplan_json(args);
        json_t *root = json_load_file(path, 0, NULL);
        g_assert_nonnull(root);
        double peak[64] = {0};
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(root, "traceEvents"), i, e)
        {
            const json_int_t pid = json_integer_value(json_object_get(e, "pid"));
            if (strcmp(json_string_value(json_object_get(e, "ph")), "C") != 0 || pid < 0 ||
                pid >= 64)
                continue;
            double total = 0;
            const char *key;
            json_t *v;
            json_object_foreach(json_object_get(e, "args"), key, v)
                total += json_number_value(v);
            peak[pid] = MAX(peak[pid], total);
        }
        json_t *stages = json_object_get(sim, "stages");
        const size_t n = json_integer_value(json_object_get(sim, "pp")) > 1
                             ? json_array_size(stages) : 1;
        for (size_t k = 0; k < n; k++) {
            const double want = json_number_value(json_object_get(
                n > 1 ? json_array_get(stages, k) : sim, "peak_memory_bytes"));
            g_test_message("%s: process %zu: trace %.0f, simulate %.0f", plans[p], k, peak[k],
                           want);
            g_assert_cmpfloat(fabs(peak[k] - want), <=, 1e-12 * want);
        }
        json_decref(root), json_decref(sim);
        tu_tmp_file_remove(path, dir);
        g_free(args);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/trace/modules-and-tracks", test_modules_and_tracks);
    g_test_add_func("/trace/memory-peaks", test_memory_peaks);
    return g_test_run();
}
