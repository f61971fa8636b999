/* test_sched_read: a schedule file read with its ops streamed (zp_sched_read_file, STREAM) is
 * the schedule the whole-tree reader gives, op for op, whatever the order of its keys; what
 * the tree reader refuses the stream refuses, and the readers say it in the tree's words. */
#include "testutil.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <zlib.h>

static char *tmp_dir;

static char *tmp_path(const char *name)
{
    return g_build_filename(tmp_dir, name, NULL);
}

static char *write_text(const char *name, const char *text, gssize len)
{
    char *path = tmp_path(name);
    g_assert_true(g_file_set_contents(path, text, len, NULL));
    return path;
}

/* root (taken) written with its keys in the order it holds them. */
static char *write_json(const char *name, json_t *root)
{
    char *path = tmp_path(name);
    g_assert_cmpint(json_dump_file(root, path, JSON_INDENT(1)), ==, 0);
    json_decref(root);
    return path;
}

static char *read_text(const char *path)
{
    char *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
    return text;
}

static void assert_same_schedule(const ZpSchedule *a, const ZpSchedule *b)
{
    g_assert_cmpuint(a->ops->len, ==, b->ops->len);
    g_assert_cmpint(memcmp(a->ops->data, b->ops->data, a->ops->len * sizeof(ZpOp)), ==, 0);
    g_assert_cmpuint(a->deps->len, ==, b->deps->len);
    g_assert_cmpint(memcmp(a->deps->data, b->deps->data, a->deps->len * sizeof(uint32_t)), ==,
                    0);
    tu_assert_same_groups(a, b);
    g_assert_cmpint(a->world, ==, b->world);
    g_assert_cmpint(a->stages, ==, b->stages);
    g_assert_cmpint(a->digest, ==, b->digest);
    g_assert_cmpfloat(a->elem_bytes, ==, b->elem_bytes);
    g_assert_cmpint(memcmp(a->state_bytes, b->state_bytes, sizeof a->state_bytes), ==, 0);
    g_assert_cmpstr(a->model.name, ==, b->model.name);
    g_assert_cmpint(a->plan.dp, ==, b->plan.dp);
    g_assert_cmpint(a->plan.mp, ==, b->plan.mp);
    g_assert_cmpint(a->plan.precision, ==, b->plan.precision);
    char *da = zp_sched_digest(a), *db = zp_sched_digest(b);
    g_assert_cmpstr(da, ==, db);
    g_free(da);
    g_free(db);
}

static ZpSchedule *read_how(const char *path, gboolean graph, ZpSchedRead how, char **message)
{
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_file(path, graph, how, NULL, NULL, &error);
    g_assert_true((s == NULL) == (error != NULL));
    *message = error ? g_strdup(error->message) : NULL;
    g_clear_error(&error);
    return s;
}

/* path read by the tree, by the stream and as the readers do (AUTO): the same schedule from
 * all three, or a refusal from all three, AUTO's in the tree's words. Returns the tree's
 * schedule (NULL: refused). */
static ZpSchedule *assert_same_reading(const char *path, gboolean graph)
{
    char *tree_message, *stream_message, *auto_message;
    ZpSchedule *tree = read_how(path, graph, ZP_SCHED_READ_TREE, &tree_message);
    ZpSchedule *streamed = read_how(path, graph, ZP_SCHED_READ_STREAM, &stream_message);
    ZpSchedule *read = read_how(path, graph, ZP_SCHED_READ_AUTO, &auto_message);
    g_test_message("%s (%s): %s; streamed: %s", path, graph ? "graph" : "json",
                   tree_message ? tree_message : "read", stream_message ? stream_message : "read");
    if (tree) {
        g_assert_cmpstr(stream_message, ==, NULL); /* a file the tree reads streams */
        assert_same_schedule(tree, streamed);
        assert_same_schedule(tree, read);
    } else {
        g_assert_null(streamed);
        g_assert_null(read);
        g_assert_cmpstr(auto_message, ==, tree_message);
    }
    zp_sched_free(streamed);
    zp_sched_free(read);
    g_free(tree_message);
    g_free(stream_message);
    g_free(auto_message);
    return tree;
}

/* The file at path rewritten with its keys in `order` (the others after, as they were). */
static char *reordered(const char *path, const char *name, const char *const *order)
{
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, NULL), *out = json_object();
    g_assert_nonnull(root);
    for (int i = 0; order[i]; i++)
        if (json_object_get(root, order[i]))
            json_object_set(out, order[i], json_object_get(root, order[i]));
    const char *key;
    json_t *value;
    json_object_foreach (root, key, value)
        json_object_set(out, key, value); /* keeps a key set above where it is */
    json_decref(root);
    return write_json(name, out);
}

/* The file's keys reversed, "ops" first, and "ops" last: each read as the file is. */
static void assert_any_order(const char *path, gboolean graph, const ZpSchedule *want)
{
    json_t *root = json_load_file(path, 0, NULL);
    const char *keys[32], *key;
    int n = 0;
    json_t *value;
    json_object_foreach (root, key, value)
        keys[n++] = key;
    const char *reversed[33], *ops_first[] = {"ops", NULL}, *ops_last[33];
    int m = 0;
    for (int i = 0; i < n; i++) {
        reversed[i] = keys[n - 1 - i];
        if (strcmp(keys[i], "ops") != 0)
            ops_last[m++] = keys[i];
    }
    reversed[n] = NULL;
    ops_last[m++] = "ops";
    ops_last[m] = NULL;
    const char *const *orders[] = {reversed, ops_first, ops_last};
    for (size_t o = 0; o < G_N_ELEMENTS(orders); o++) {
        char *other = reordered(path, "order.json", orders[o]);
        ZpSchedule *s = assert_same_reading(other, graph);
        g_assert_nonnull(s);
        assert_same_schedule(want, s);
        zp_sched_free(s);
        g_remove(other);
        g_free(other);
    }
    json_decref(root);
}

/* The schedule zplan builds for a model and plan, written as `zplan schedule --out` does. */
static char *write_built(const char *model_name, const ZpPlan *plan, const char *name)
{
    ZpModel model;
    g_assert_true(zp_model_load(model_name, &model, NULL));
    GError *error = NULL;
    ZpSchedule *built = zp_sched_build(&model, plan, &error);
    g_assert_no_error(error);
    char *path = tmp_path(name);
    g_assert_true(zp_sched_write_json(built, path, &error));
    g_assert_no_error(error);
    zp_sched_free(built);
    return path;
}

/* gpt2-124m over 4 pipeline stages (its file has "stages", after its ops). */
static char *write_pipeline(void)
{
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 1);
    p.pipe.stages = 4;
    p.grad_accum = 4;
    return write_built("gpt2-124m", &p, "pipeline.json");
}

static const char *const corpus[] = {"tiny-stage0.json", "tiny-stage1.json", "tiny-stage2.json",
                                     "tiny-stage3.json", "tiny-stage3-ckpt-accum.json",
                                     "tiny-stage3-offload-nvme.json", "tiny-tp.json", NULL};

/* zplan's files (the fuzz corpus's planner files, a pipeline's, hand-written graphs with
 * other communicators): streamed, each reads as the tree does, in any order of its keys. */
static void test_same_schedules(void)
{
    GPtrArray *paths = g_ptr_array_new_with_free_func(g_free);
    for (int i = 0; corpus[i]; i++)
        g_ptr_array_add(paths, g_build_filename(ZP_DATA_DIR, "tests/fuzz/corpus/schedule",
                                                corpus[i], NULL));
    char *pipeline = write_pipeline();
    g_ptr_array_add(paths, pipeline);
    const guint planned = paths->len;
    g_ptr_array_add(paths, g_strdup(ZP_DATA_DIR "/tests/data/schedule-example.json"));
    g_ptr_array_add(paths, g_strdup(ZP_DATA_DIR "/tests/data/schedule-groups.json"));
    for (guint i = 0; i < paths->len; i++)
        for (int graph = i >= planned; graph < 2; graph++) {
            const char *path = g_ptr_array_index(paths, i);
            ZpSchedule *s = assert_same_reading(path, graph);
            /* The corpus's older files have no "groups": no graph (the same streamed). */
            g_assert_true(s || (graph && i < planned - 1));
            if (s)
                assert_any_order(path, graph, s);
            zp_sched_free(s);
        }
    g_remove(pipeline);
    g_ptr_array_unref(paths);
}

/* One op of a file's JSON. */
static json_t *op_at(json_t *root, size_t i)
{
    return json_array_get(json_object_get(root, "ops"), i);
}

/* Edits of a planner's file, a pipeline's and a graph's, in their JSON and in their text:
 * each read the same streamed as whole (refused alike, or read to the same schedule). */
static void test_same_refusals(void)
{
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 1);
    char *tiny = write_built("tiny", &p, "tiny.json"), *pipeline = write_pipeline();
    char *groups = g_strdup(ZP_DATA_DIR "/tests/data/schedule-groups.json");
    GPtrArray *edits = g_ptr_array_new_with_free_func(g_free);
    json_t *root;

    /* An op lost, and two swapped. */
    root = json_load_file(tiny, 0, NULL);
    json_array_remove(json_object_get(root, "ops"), 5);
    g_ptr_array_add(edits, write_json("lost.json", root));
    root = json_load_file(tiny, 0, NULL);
    json_t *op = json_incref(op_at(root, 2));
    json_array_remove(json_object_get(root, "ops"), 2);
    json_array_insert_new(json_object_get(root, "ops"), 3, op);
    g_ptr_array_add(edits, write_json("swapped.json", root));
    /* A dependency ahead, past the end, no ops, "ops" no array, none. */
    root = json_load_file(tiny, 0, NULL);
    json_array_append_new(json_object_get(op_at(root, 3), "deps"), json_integer(10));
    g_ptr_array_add(edits, write_json("ahead.json", root));
    root = json_load_file(tiny, 0, NULL);
    json_array_clear(json_object_get(root, "ops"));
    g_ptr_array_add(edits, write_json("no-ops.json", root));
    root = json_load_file(tiny, 0, NULL);
    json_object_set_new(root, "ops", json_object());
    g_ptr_array_add(edits, write_json("ops-object.json", root));
    root = json_load_file(tiny, 0, NULL);
    json_object_del(root, "ops");
    g_ptr_array_add(edits, write_json("ops-none.json", root));
    /* A key unknown after the ops, an edited digest, a model after the ops that is wrong. */
    root = json_load_file(tiny, 0, NULL);
    json_object_set_new(root, "extra", json_true());
    g_ptr_array_add(edits, write_json("extra.json", root));
    root = json_load_file(tiny, 0, NULL);
    json_object_set_new(root, "digest", json_string("sha256:00"));
    g_ptr_array_add(edits, write_json("digest.json", root));
    root = json_load_file(tiny, 0, NULL);
    json_t *model = json_incref(json_object_get(root, "model"));
    json_object_del(root, "model");
    json_object_set_new(model, "layers", json_integer(3));
    json_object_set_new(root, "model", model);
    g_ptr_array_add(edits, write_json("model-last.json", root));

    /* A pipeline's: without its "stages" (a graph's reading, once taken for a pipeline's), an
     * edited dependency. */
    root = json_load_file(pipeline, 0, NULL);
    json_object_del(root, "stages");
    g_ptr_array_add(edits, write_json("no-stages.json", root));
    root = json_load_file(pipeline, 0, NULL);
    json_t *deps = json_object_get(op_at(root, 5), "deps");
    json_array_clear(deps);
    json_array_append_new(deps, json_integer(10000000));
    g_ptr_array_add(edits, write_json("pipeline-dep.json", root));

    /* Text the tree refuses: a key twice at the top and inside an op, text after the object,
     * the file cut short, gzip, "units" nested past Jansson's depth (and just within it). */
    char *text = read_text(tiny);
    const size_t len = strlen(text);
    char *end = strrchr(text, '}');
    *end = '\0';
    char *twice = g_strdup_printf("%s, \"ops\": []}", text);
    g_ptr_array_add(edits, write_text("twice.json", twice, -1));
    *end = '}';
    char *in_op = g_strdup(text);
    char *kind = strstr(strstr(in_op, "\"ops\""), "\"kind\"");
    char *dup = g_strdup_printf("%.*s\"kind\": \"free\", %s", (int)(kind - in_op), in_op, kind);
    g_ptr_array_add(edits, write_text("kind-twice.json", dup, -1));
    char *after = g_strdup_printf("%s x", text);
    g_ptr_array_add(edits, write_text("after.json", after, -1));
    char *white = g_strdup_printf("%s \n\t", text);
    g_ptr_array_add(edits, write_text("white.json", white, -1));
    g_ptr_array_add(edits, write_text("cut.json", text, (gssize)(len / 2)));
    char *gz = tmp_path("gzip.json");
    gzFile f = gzopen(gz, "wb");
    g_assert_cmpint(gzwrite(f, text, (unsigned)len), ==, (int)len);
    g_assert_cmpint(gzclose(f), ==, Z_OK);
    g_ptr_array_add(edits, gz);
    for (int depth = 2040; depth <= 2048; depth += 8) { /* "units" nested: the top is 1 */
        root = json_load_file(tiny, 0, NULL);
        json_object_set_new(root, "units", json_string("DEEP"));
        char *path = write_json("deep.json", root), *plain = read_text(path);
        char *open = g_strnfill((gsize)depth, '['), *close = g_strnfill((gsize)depth, ']');
        char *at = strstr(plain, "\"DEEP\"");
        char *deep = g_strdup_printf("%.*s%s%s%s", (int)(at - plain), plain, open, close,
                                     at + strlen("\"DEEP\""));
        char *name = g_strdup_printf("deep-%d.json", depth);
        g_ptr_array_add(edits, write_text(name, deep, -1));
        g_remove(path);
        g_free(path);
        g_free(plain);
        g_free(name);
        g_free(deep);
        g_free(open);
        g_free(close);
    }

    /* A graph's: its groups in another order (its ops' names renumbered), a group unknown, a
     * dependency past the end, a cycle. */
    root = json_load_file(groups, 0, NULL);
    json_t *table = json_object_get(root, "groups"), *reversed = json_array();
    for (size_t i = json_array_size(table); i-- > 0;)
        json_array_append(reversed, json_array_get(table, i));
    json_object_set_new(root, "groups", reversed);
    g_ptr_array_add(edits, write_json("groups-reversed.json", root));
    root = json_load_file(groups, 0, NULL);
    json_object_set_new(op_at(root, 5), "group", json_string("nosuch"));
    g_ptr_array_add(edits, write_json("group-unknown.json", root));
    root = json_load_file(groups, 0, NULL);
    json_array_append_new(json_object_get(op_at(root, 2), "deps"), json_integer(7));
    g_ptr_array_add(edits, write_json("past-end.json", root));
    root = json_load_file(groups, 0, NULL);
    json_array_append_new(json_object_get(op_at(root, 0), "deps"), json_integer(6));
    g_ptr_array_add(edits, write_json("cycle.json", root));

    /* And the fuzzer's past crash inputs (issue 11's hostile files). */
    const guint made = edits->len;
    char *regressions = g_build_filename(ZP_DATA_DIR, "tests/fuzz/regressions/schedule", NULL);
    GDir *dir = g_dir_open(regressions, 0, NULL);
    for (const char *name; dir && (name = g_dir_read_name(dir));)
        g_ptr_array_add(edits, g_build_filename(regressions, name, NULL));
    g_assert_cmpuint(edits->len, >=, made + 4);
    g_dir_close(dir);
    g_free(regressions);

    int refused = 0;
    for (guint i = 0; i < edits->len; i++)
        for (int graph = 0; graph < 2; graph++) {
            ZpSchedule *s = assert_same_reading(g_ptr_array_index(edits, i), graph);
            refused += s == NULL;
            zp_sched_free(s);
            /* Keys in another order: the same again. */
            const char *ops_first[] = {"ops", NULL};
            json_t *parsed = json_load_file(g_ptr_array_index(edits, i), JSON_REJECT_DUPLICATES,
                                            NULL);
            if (parsed && json_is_object(parsed)) {
                char *other = reordered(g_ptr_array_index(edits, i), "edit-order.json", ops_first);
                zp_sched_free(assert_same_reading(other, graph));
                g_remove(other);
                g_free(other);
            }
            json_decref(parsed);
        }
    g_assert_cmpint(refused, >=, 30); /* the edits mostly break something */
    for (guint i = 0; i < made; i++)
        g_remove(g_ptr_array_index(edits, i));
    g_ptr_array_unref(edits);
    g_free(text);
    g_free(twice);
    g_free(in_op);
    g_free(dup);
    g_free(after);
    g_free(white);
    g_remove(tiny);
    g_remove(pipeline);
    g_free(tiny);
    g_free(pipeline);
    g_free(groups);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zplan-sched-read-XXXXXX", NULL);
    g_test_add_func("/sched-read/same-schedules", test_same_schedules);
    g_test_add_func("/sched-read/same-refusals", test_same_refusals);
    const int status = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return status;
}
