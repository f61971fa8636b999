/* test_trace_tracks: the Perfetto trace names what it shows (issue 39 item 9): a block op split
 * per module is named with its module ("fwd L1 qkv") and carries it in its args, and no track
 * is declared that holds nothing (a declared empty nvme or pp-send track read as a stream that
 * idled all step). */
#include "testutil.h"

#include <jansson.h>
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

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/trace/modules-and-tracks", test_modules_and_tracks);
    return g_test_run();
}
