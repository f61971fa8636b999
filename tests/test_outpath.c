/* Tests of the output-path rule (zp_outpath): a FIFO, a character device and standard output are
 * written in place, a link is followed, a directory is refused, through every zplan writer; a
 * streamed file appears whole or not at all. */
#include "testutil.h"
#include "zp_outpath.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define SCHEDULE "schedule --model tiny --gpus 2 --stage 1 --micro-batch 2 --out "

static char *make_tmp_dir(void)
{
    char *dir = g_dir_make_tmp("zplan-outpath-XXXXXX", NULL);
    g_assert_nonnull(dir);
    return dir;
}

static void remove_tree(const char *dir)
{
    char *cmd = g_strdup_printf("rm -rf %s", dir);
    TuRun r = tu_run(cmd, NULL);
    tu_free(&r);
    g_free(cmd);
}

static mode_t lmode(const char *path)
{
    struct stat st;
    g_assert_cmpint(lstat(path, &st), ==, 0);
    return st.st_mode;
}

static gboolean ran_ok(const TuRun *r)
{
    if (!g_spawn_check_wait_status(r->status, NULL))
        g_test_message("stderr: %s", r->err);
    return g_spawn_check_wait_status(r->status, NULL);
}

static int exit_status(const TuRun *r)
{
    return WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
}

/* Reads a FIFO to its end in a thread, as `cat FIFO` would. */
static gpointer read_fifo(gpointer path)
{
    char *text = NULL;
    gsize n = 0;
    if (!g_file_get_contents(path, &text, &n, NULL))
        return NULL;
    return text;
}

static void test_fifo(void)
{
    char *dir = make_tmp_dir();
    char *fifo = g_build_filename(dir, "pipe", NULL);
    g_assert_cmpint(mkfifo(fifo, 0600), ==, 0);
    GThread *reader = g_thread_new("fifo-reader", read_fifo, fifo);
    char *args = g_strconcat(SCHEDULE, fifo, NULL);
    TuRun r = tu_zplan(args);
    g_assert_true(ran_ok(&r));
    /* Still the FIFO (before main's rename, a regular file took its place and the reader hung). */
    g_assert_true(S_ISFIFO(lmode(fifo)));
    char *text = g_thread_join(reader);
    g_assert_nonnull(text);
    g_assert_true(g_str_has_prefix(text, "{"));
    g_assert_nonnull(strstr(text, "zplan-schedule"));
    g_free(text);
    tu_free(&r);
    g_free(args);
    remove_tree(dir);
    g_free(fifo);
    g_free(dir);
}

/* A private copy of /dev/null (1, 3) and of /dev/full (1, 7), made with mknod where allowed. */
static void test_char_device(void)
{
    char *dir = make_tmp_dir();
    char *null_dev = g_build_filename(dir, "null", NULL);
    char *full_dev = g_build_filename(dir, "full", NULL);
    if (mknod(null_dev, S_IFCHR | 0666, makedev(1, 3)) != 0 ||
        mknod(full_dev, S_IFCHR | 0666, makedev(1, 7)) != 0) {
        g_test_skip("mknod needs root (CAP_MKNOD)");
        remove_tree(dir);
        g_free(null_dev), g_free(full_dev), g_free(dir);
        return;
    }
    char *args = g_strconcat(SCHEDULE, null_dev, NULL);
    TuRun r = tu_zplan(args);
    g_assert_true(ran_ok(&r));
    g_assert_true(S_ISCHR(lmode(null_dev)));
    tu_free(&r);
    g_free(args);
    /* A full device is written in place and its error said: no success in silence. */
    args = g_strconcat("simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 "
                       "--micro-batch 1 --trace ", full_dev, NULL);
    r = tu_zplan(args);
    g_assert_cmpint(exit_status(&r), ==, 1);
    g_assert_nonnull(strstr(r.err, "No space left on device"));
    g_assert_true(S_ISCHR(lmode(full_dev)));
    tu_free(&r);
    g_free(args);
    remove_tree(dir);
    g_free(null_dev), g_free(full_dev), g_free(dir);
}

/* A link is followed: the target gets the text (keeping its mode), the link stays a link; a
 * dangling link creates the file it names. Through every zplan writer that takes a path. */
static void test_symlink(void)
{
    char *dir = make_tmp_dir();
    struct {
        const char *command; /* {L}: the link */
        const char *expect;  /* in the target */
    } writers[] = {
        {SCHEDULE "{L}", "zplan-schedule"},
        {"simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 "
         "--trace {L}", "traceEvents"},
        {"plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --ds-config {L}",
         "zero_optimization"},
        {"calibrate " ZP_DATA_DIR "/tests/fuzz/corpus/microbench/microbench-2.json --out {L}",
         "\"name\""},
    };
    for (guint i = 0; i < G_N_ELEMENTS(writers); i++) {
        for (int dangling = 0; dangling <= 1; dangling++) {
            char *target = g_strdup_printf("%s/target-%u-%d.json", dir, i, dangling);
            char *link = g_strdup_printf("%s/link-%u-%d.json", dir, i, dangling);
            if (!dangling) {
                g_assert_true(g_file_set_contents(target, "old", -1, NULL));
                g_assert_cmpint(g_chmod(target, 0600), ==, 0);
            }
            /* Relative, as `ln -s target-… link-…` makes it. */
            char *base = g_path_get_basename(target);
            g_assert_cmpint(symlink(base, link), ==, 0);
            g_free(base);
            char **parts = g_strsplit(writers[i].command, "{L}", -1);
            char *args = g_strjoinv(link, parts);
            g_strfreev(parts);
            TuRun r = tu_zplan(args);
            g_assert_true(ran_ok(&r));
            g_assert_true(S_ISLNK(lmode(link)));
            g_assert_true(S_ISREG(lmode(target)));
            if (!dangling)
                g_assert_cmpint(lmode(target) & 0777, ==, 0600);
            char *text = NULL;
            g_assert_true(g_file_get_contents(target, &text, NULL, NULL));
            g_assert_nonnull(strstr(text, writers[i].expect));
            g_free(text);
            tu_free(&r);
            g_free(args), g_free(target), g_free(link);
        }
    }
    remove_tree(dir);
    g_free(dir);
}

/* A directory, or a name that ends in '/', is refused in one line and nothing is written. */
static void test_directory(void)
{
    char *dir = make_tmp_dir();
    const char *commands[] = {
        SCHEDULE "{D}",
        SCHEDULE "{D}/",
        "simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --trace {D}",
        "plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --ds-config {D}/",
        "sweep --vary gpus --values 1,2 --params 1e9 --metric memory --out {D}/",
        "sweep --vary gpus --values 1,2 --params 1e9 --metric memory --out /",
    };
    for (guint i = 0; i < G_N_ELEMENTS(commands); i++) {
        char **parts = g_strsplit(commands[i], "{D}", -1);
        char *args = g_strjoinv(dir, parts);
        g_strfreev(parts);
        TuRun r = tu_zplan(args);
        g_test_message("%s: %s", args, r.err);
        g_assert_cmpint(exit_status(&r), ==, 1);
        g_assert_nonnull(strstr(r.err, "is not a file name") ?: strstr(r.err, "has no file name"));
        g_assert_cmpint(strchr(r.err, '\n') - r.err, ==, (long)strlen(r.err) - 1);
        tu_free(&r);
        g_free(args);
    }
    /* Nothing appeared: neither DIR/.csv nor /.csv. */
    GDir *d = g_dir_open(dir, 0, NULL);
    g_assert_null(g_dir_read_name(d));
    g_dir_close(d);
    g_assert_false(g_file_test("/.csv", G_FILE_TEST_EXISTS));
    remove_tree(dir);
    g_free(dir);
}

/* "-" and a link to /proc/self/fd/1 (what /dev/stdout is; a private one, so that a build that
 * renames over it replaces nothing of the system's) go down the pipe; the same link with stdout
 * redirected to a file writes that file, the one the shell opened. */
static void test_stdout(void)
{
    char *dir = make_tmp_dir();
    char *out_link = g_build_filename(dir, "stdout", NULL);
    g_assert_cmpint(symlink("/proc/self/fd/1", out_link), ==, 0);
    const char *paths[] = {"-", out_link};
    for (guint i = 0; i < G_N_ELEMENTS(paths); i++) {
        char *args = g_strconcat(SCHEDULE, paths[i], NULL);
        TuRun r = tu_zplan(args);
        g_assert_true(ran_ok(&r));
        g_assert_nonnull(strstr(r.out, "zplan-schedule"));
        tu_free(&r);
        g_free(args);
    }
    g_assert_true(S_ISLNK(lmode(out_link)));
    char *file = g_build_filename(dir, "out.json", NULL);
    char *cmd = g_strdup_printf("sh -c '%s/zplan " SCHEDULE "%s > %s'", ZP_BUILD_DIR, out_link,
                                file);
    TuRun r = tu_run(cmd, NULL);
    g_assert_true(ran_ok(&r));
    char *text = NULL;
    g_assert_true(g_file_get_contents(file, &text, NULL, NULL));
    g_assert_nonnull(strstr(text, "zplan-schedule"));
    g_free(text);
    tu_free(&r);
    remove_tree(dir);
    g_free(cmd), g_free(file), g_free(out_link), g_free(dir);
}

/* The function itself: how each kind of path is classified. */
static void test_resolve(void)
{
    char *dir = make_tmp_dir();
    char *file = g_build_filename(dir, "f", NULL);
    char *link = g_build_filename(dir, "l", NULL);
    char *loop = g_build_filename(dir, "loop", NULL);
    g_assert_true(g_file_set_contents(file, "x", -1, NULL));
    g_assert_cmpint(symlink("f", link), ==, 0);
    g_assert_cmpint(symlink("loop", loop), ==, 0);
    ZpOutKind kind;
    char *target = NULL;
    GError *error = NULL;
    g_assert_true(zp_out_resolve(link, &kind, &target, &error));
    g_assert_cmpint(kind, ==, ZP_OUT_FILE);
    g_assert_true(g_str_has_suffix(target, "/f"));
    g_free(target);
    g_assert_true(zp_out_resolve("/dev/null", &kind, &target, &error));
    g_assert_cmpint(kind, ==, ZP_OUT_STREAM);
    g_free(target);
    g_assert_true(zp_out_resolve("-", &kind, &target, &error));
    g_assert_cmpint(kind, ==, ZP_OUT_STDOUT);
    g_assert_false(zp_out_resolve(dir, &kind, &target, &error));
    g_assert_nonnull(strstr(error->message, "is a directory"));
    g_clear_error(&error);
    g_assert_false(zp_out_resolve(loop, &kind, &target, &error));
    g_assert_nonnull(error);
    g_clear_error(&error);
    remove_tree(dir);
    g_free(file), g_free(link), g_free(loop), g_free(dir);
}

static char *read_text(const char *path, gsize *length)
{
    char *text = NULL;
    g_assert_true(g_file_get_contents(path, &text, length, NULL));
    return text;
}

static guint dir_entries(const char *dir)
{
    GDir *d = g_dir_open(dir, 0, NULL);
    guint n = 0;
    while (g_dir_read_name(d))
        n++;
    g_dir_close(d);
    return n;
}

/* The stream itself: pieces smaller and larger than its buffer arrive whole and in order; the
 * target appears only at close and keeps its mode; an abort leaves the target as it was and
 * no temporary behind. */
static void test_stream(void)
{
    char *dir = make_tmp_dir();
    char *path = g_build_filename(dir, "out.txt", NULL);
    g_assert_true(g_file_set_contents(path, "old", -1, NULL));
    g_assert_cmpint(g_chmod(path, 0640), ==, 0);
    GString *expect = g_string_new(NULL);
    GError *error = NULL;
    ZpOutStream *out = zp_out_stream_open(path, &error);
    g_assert_no_error(error);
    const gsize sizes[] = {1, 17, ZP_OUT_STREAM_BUFFER - 5, 3 * ZP_OUT_STREAM_BUFFER + 1, 9,
                           ZP_OUT_STREAM_BUFFER, 0, 2};
    for (guint i = 0; i < G_N_ELEMENTS(sizes); i++) {
        char *piece = g_malloc(sizes[i] + 1);
        for (gsize k = 0; k < sizes[i]; k++)
            piece[k] = (char)('a' + (i * 7 + k) % 26);
        g_assert_true(zp_out_stream_write(out, piece, sizes[i], &error));
        g_string_append_len(expect, piece, (gssize)sizes[i]);
        g_free(piece);
    }
    gsize length = 0;
    char *text = read_text(path, &length);
    g_assert_cmpstr(text, ==, "old"); /* not yet: the pieces went to a temporary */
    g_free(text);
    g_assert_true(zp_out_stream_close(out, &error));
    g_assert_no_error(error);
    text = read_text(path, &length);
    g_assert_cmpuint(length, ==, expect->len);
    g_assert_true(memcmp(text, expect->str, length) == 0);
    g_free(text);
    g_assert_cmpint(lmode(path) & 0777, ==, 0640);
    g_assert_cmpuint(dir_entries(dir), ==, 1);
    out = zp_out_stream_open(path, &error);
    g_assert_true(zp_out_stream_write(out, "new", 3, &error));
    zp_out_stream_abort(out);
    text = read_text(path, &length);
    g_assert_cmpuint(length, ==, expect->len); /* as it was */
    g_free(text);
    g_assert_cmpuint(dir_entries(dir), ==, 1);
    g_string_free(expect, TRUE);
    remove_tree(dir);
    g_free(path), g_free(dir);
}

/* A document written in parts (zp_out_stream_json_item, _json and _close, as the schedule's
 * writer writes its ops) is jansson's dump of the whole, byte for byte: members and elements
 * written one by one around small trees dumped at their depth, an empty array closed by
 * parts and one dumped whole, a key and a string that need escaping (a newline among them),
 * and arrays nested by parts past the 32 levels one piece of indent covers. */
static void test_json_parts(void)
{
    const size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17);
    json_t *element = json_pack("{s:[], s:s, s:f, s:{s:[i, i]}}", "b", "c", "x\ny \"z\"", "d",
                                0.1, "e", "f", 1, 2);
    enum { NESTED = 40 };
    json_t *nested = json_pack("{s:O}", "g", element);
    for (int d = 0; d < NESTED; d++)
        nested = json_pack("[o]", nested);
    json_t *whole = json_pack("{s:s, s:[O, i, O], s:[], s:o, s:{}}", "format", "parts",
                              "a \"quoted\"\nkey", element, 7, element, "empty", "deep", nested,
                              "none");
    char *dir = make_tmp_dir();
    char *path = g_build_filename(dir, "parts.json", NULL);
    GError *error = NULL;
    ZpOutStream *out = zp_out_stream_open(path, &error);
    g_assert_no_error(error);
    g_assert_true(zp_out_stream_write(out, "{", 1, &error));
    gsize n = 0;
    json_t *format = json_string("parts");
    g_assert_true(zp_out_stream_json_item(out, 1, n++, "format", &error));
    g_assert_true(zp_out_stream_json(out, format, 1, &error));
    json_decref(format);
    g_assert_true(zp_out_stream_json_item(out, 1, n++, "a \"quoted\"\nkey", &error));
    g_assert_true(zp_out_stream_write(out, "[", 1, &error));
    json_t *items = json_pack("[O, i, O]", element, 7, element);
    for (gsize i = 0; i < json_array_size(items); i++) {
        g_assert_true(zp_out_stream_json_item(out, 2, i, NULL, &error));
        g_assert_true(zp_out_stream_json(out, json_array_get(items, i), 2, &error));
    }
    g_assert_true(zp_out_stream_json_close(out, 2, json_array_size(items), ']', &error));
    json_decref(items);
    g_assert_true(zp_out_stream_json_item(out, 1, n++, "empty", &error));
    g_assert_true(zp_out_stream_write(out, "[", 1, &error));
    g_assert_true(zp_out_stream_json_close(out, 2, 0, ']', &error));
    g_assert_true(zp_out_stream_json_item(out, 1, n++, "deep", &error));
    for (int d = 0; d < NESTED; d++) {
        g_assert_true(zp_out_stream_write(out, "[", 1, &error));
        g_assert_true(zp_out_stream_json_item(out, d + 2, 0, NULL, &error));
    }
    json_t *inner = json_pack("{s:O}", "g", element);
    g_assert_true(zp_out_stream_json(out, inner, NESTED + 1, &error));
    json_decref(inner);
    for (int d = NESTED; d > 0; d--)
        g_assert_true(zp_out_stream_json_close(out, d + 1, 1, ']', &error));
    json_t *none = json_object();
    g_assert_true(zp_out_stream_json_item(out, 1, n++, "none", &error));
    g_assert_true(zp_out_stream_json(out, none, 1, &error));
    json_decref(none);
    g_assert_true(zp_out_stream_json_close(out, 1, n, '}', &error));
    g_assert_true(zp_out_stream_close(out, &error));
    g_assert_no_error(error);
    char *expect = json_dumps(whole, flags);
    gsize length = 0;
    char *text = read_text(path, &length);
    g_assert_cmpstr(text, ==, expect);
    g_free(text);
    free(expect);
    remove_tree(dir);
    g_free(path), g_free(dir);
    json_decref(whole);
    json_decref(element);
}

/* A write that fails part way into a regular file (here past `ulimit -f`, as a full disk
 * would): one line naming the file and the reason, exit 1, the file as it was and no
 * temporary left beside it. Through the trace's writer and JSON's (schedule --out). */
static void test_failed_write(void)
{
    char *dir = make_tmp_dir();
    const char *commands[] = {
        "simulate --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 2 "
        "--trace {F}",
        "schedule --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 2 "
        "--out {F}",
    };
    for (guint i = 0; i < G_N_ELEMENTS(commands); i++) {
        char *file = g_strdup_printf("%s/out-%u.json", dir, i);
        g_assert_true(g_file_set_contents(file, "old", -1, NULL));
        char **parts = g_strsplit(commands[i], "{F}", -1);
        char *args = g_strjoinv(file, parts);
        g_strfreev(parts);
        /* 64 blocks of 1,024 bytes (bash's unit; dash's is 512): both texts are larger.
         * SIGXFSZ ignored, so the write fails with EFBIG instead of killing the process. */
        char *cmd = g_strdup_printf("sh -c 'ulimit -f 64; trap \"\" XFSZ; exec %s/zplan %s'",
                                    ZP_BUILD_DIR, args);
        TuRun r = tu_run(cmd, NULL);
        g_test_message("%s: %s", args, r.err);
        g_assert_cmpint(exit_status(&r), ==, 1);
        g_assert_nonnull(strstr(r.err, file));
        g_assert_nonnull(strstr(r.err, g_strerror(EFBIG)));
        g_assert_cmpint(strchr(r.err, '\n') - r.err, ==, (long)strlen(r.err) - 1);
        char *text = read_text(file, NULL);
        g_assert_cmpstr(text, ==, "old");
        g_free(text);
        g_assert_cmpuint(dir_entries(dir), ==, i + 1);
        tu_free(&r);
        g_free(cmd), g_free(args), g_free(file);
    }
    remove_tree(dir);
    g_free(dir);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/outpath/fifo", test_fifo);
    g_test_add_func("/outpath/char-device", test_char_device);
    g_test_add_func("/outpath/symlink", test_symlink);
    g_test_add_func("/outpath/directory", test_directory);
    g_test_add_func("/outpath/stdout", test_stdout);
    g_test_add_func("/outpath/resolve", test_resolve);
    g_test_add_func("/outpath/stream", test_stream);
    g_test_add_func("/outpath/json-parts", test_json_parts);
    g_test_add_func("/outpath/failed-write", test_failed_write);
    return g_test_run();
}
