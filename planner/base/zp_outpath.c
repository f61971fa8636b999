/* zp_outpath: one rule for every output path. A file is replaced atomically; a FIFO, a device or
 * standard output is written in place; a link is followed; a directory is refused. */
#include "zp_outpath.h"

#include "zp_util.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Linux's own limit on links followed in one lookup (path_resolution(7)). */
#define MAX_LINK_HOPS 40

/* The file a dangling chain of links ends at: each link read and joined to its directory, so
 * the write creates what the last link names instead of replacing the link. */
static char *follow_dangling(const char *path, GError **error)
{
    char *cur = g_strdup(path);
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
            return cur;
        if (hops == MAX_LINK_HOPS) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: too many levels of symbolic links",
                        path);
            g_free(cur);
            return NULL;
        }
        char *link = g_file_read_link(cur, error);
        if (!link) {
            g_free(cur);
            return NULL;
        }
        char *next = link;
        if (!g_path_is_absolute(link)) {
            char *dir = g_path_get_dirname(cur);
            next = g_build_filename(dir, link, NULL);
            g_free(dir);
            g_free(link);
        }
        g_free(cur);
        cur = next;
    }
}

static gboolean is_stdout(const struct stat *st)
{
    struct stat out;
    return fstat(STDOUT_FILENO, &out) == 0 && out.st_dev == st->st_dev &&
           out.st_ino == st->st_ino;
}

gboolean zp_out_resolve(const char *path, ZpOutKind *kind, char **target, GError **error)
{
    *target = NULL;
    if (!path || strcmp(path, "-") == 0) {
        *kind = ZP_OUT_STDOUT;
        return TRUE;
    }
    if (!*path || g_str_has_suffix(path, G_DIR_SEPARATOR_S)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "'%s' is not a file name: it ends in '/'", path);
        return FALSE;
    }
    /* stat follows every link, /proc's fd links too (/dev/stdout leads to a pipe, a terminal or
     * the file the shell opened), which reading the links one by one cannot. */
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, g_strerror(errno));
            return FALSE;
        }
        *kind = ZP_OUT_FILE;
        *target = follow_dangling(path, error);
        return *target != NULL;
    }
    const char *refused = S_ISDIR(st.st_mode)    ? "is a directory"
                          : S_ISBLK(st.st_mode)  ? "is a block device"
                          : S_ISSOCK(st.st_mode) ? "is a socket"
                                                 : NULL;
    if (refused) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "'%s' is not a file name: it %s", path, refused);
        return FALSE;
    }
    if (is_stdout(&st)) {
        *kind = ZP_OUT_STDOUT;
        return TRUE;
    }
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        *kind = ZP_OUT_STREAM;
        *target = g_strdup(path);
        return TRUE;
    }
    /* A regular file: the rename must land on the link's target, not on the link. */
    char *real = realpath(path, NULL);
    if (!real) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, g_strerror(errno));
        return FALSE;
    }
    *kind = ZP_OUT_FILE;
    *target = g_strdup(real);
    free(real);
    return TRUE;
}

struct ZpOutStream {
    ZpOutKind kind;
    int fd;           /* ZP_OUT_STREAM and ZP_OUT_FILE; -1 for standard output */
    char *target;     /* the path written, or renamed onto (NULL for standard output) */
    char *temporary;  /* ZP_OUT_FILE: the file written until the rename */
    gboolean existed; /* ZP_OUT_FILE: the target was there (synced before the rename) */
    GError *failed;   /* the first failed write: later ones are not tried */
    gsize used;
    char buffer[];
};

static const char *stream_name(const ZpOutStream *out)
{
    return out->target ? out->target : "standard output";
}

/* Writes every byte at once (write(2) may write fewer, or be interrupted). */
static gboolean write_all(int fd, const char *data, gsize length)
{
    while (length > 0) {
        const ssize_t n = write(fd, data, length);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            return FALSE;
        }
        data += n, length -= (gsize)n;
    }
    return TRUE;
}

/* Writes data out now; the first failure is kept, and nothing is tried after it. */
static gboolean stream_put(ZpOutStream *out, const char *data, gsize length)
{
    if (out->failed || length == 0)
        return !out->failed;
    const gboolean ok = out->fd < 0 ? fwrite(data, 1, length, stdout) == length
                                    : write_all(out->fd, data, length);
    if (!ok)
        g_set_error(&out->failed, ZP_ERROR, ZP_ERROR_IO, "%s%s: %s",
                    out->fd < 0 ? "writing to " : "", stream_name(out), g_strerror(errno));
    return ok;
}

/* FALSE, with the first failed write's error, where one failed. */
static gboolean stream_ok(ZpOutStream *out, GError **error)
{
    if (out->failed && error)
        *error = g_error_copy(out->failed);
    return !out->failed;
}

static gboolean stream_flush(ZpOutStream *out)
{
    const gsize used = out->used;
    out->used = 0;
    return stream_put(out, out->buffer, used);
}

ZpOutStream *zp_out_stream_open(const char *path, GError **error)
{
    ZpOutKind kind;
    char *target = NULL;
    if (!zp_out_resolve(path, &kind, &target, error))
        return NULL;
    ZpOutStream *out = g_malloc0(sizeof *out + ZP_OUT_STREAM_BUFFER);
    out->kind = kind;
    out->target = target;
    out->fd = -1;
    if (kind == ZP_OUT_STREAM) {
        /* In place, as `cat > path` would: a FIFO blocks until its reader opens it. */
        out->fd = g_open(target, O_WRONLY | O_CLOEXEC, 0);
    } else if (kind == ZP_OUT_FILE) {
        /* As g_file_set_contents_full: a file that exists keeps its permission bits. */
        struct stat st;
        out->existed = stat(target, &st) == 0;
        out->temporary = g_strdup_printf("%s.XXXXXX", target);
        out->fd = g_mkstemp_full(out->temporary, O_WRONLY | O_CLOEXEC,
                                 out->existed ? (int)(st.st_mode & 07777) : 0666);
    }
    if (kind != ZP_OUT_STDOUT && out->fd < 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", target, g_strerror(errno));
        g_free(out->temporary);
        out->temporary = NULL; /* nothing was made */
        zp_out_stream_abort(out);
        return NULL;
    }
    return out;
}

gboolean zp_out_stream_write(ZpOutStream *out, const char *data, gsize length, GError **error)
{
    if (length >= ZP_OUT_STREAM_BUFFER) {
        /* Already a whole write (a trace's gathered lines): not copied through the buffer. */
        stream_flush(out);
        stream_put(out, data, length);
    } else {
        if (length > ZP_OUT_STREAM_BUFFER - out->used)
            stream_flush(out);
        memcpy(out->buffer + out->used, data, length);
        out->used += length;
    }
    return stream_ok(out, error);
}

void zp_out_stream_abort(ZpOutStream *out)
{
    if (!out)
        return;
    if (out->fd >= 0)
        close(out->fd);
    if (out->temporary)
        g_unlink(out->temporary);
    if (out->failed)
        g_error_free(out->failed);
    g_free(out->temporary);
    g_free(out->target);
    g_free(out);
}

gboolean zp_out_stream_close(ZpOutStream *out, GError **error)
{
    gboolean ok = stream_flush(out);
    if (ok && out->fd < 0 && fflush(stdout) == EOF) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "writing to standard output: %s",
                    g_strerror(errno));
        zp_out_stream_abort(out);
        return FALSE;
    }
    if (!ok) {
        g_propagate_error(error, out->failed);
        out->failed = NULL;
        zp_out_stream_abort(out);
        return FALSE;
    }
    const char *step = NULL;
    if (out->kind == ZP_OUT_FILE && out->existed && fsync(out->fd) != 0)
        step = "sync";
    const int fd = out->fd;
    out->fd = -1;
    if (fd >= 0 && close(fd) != 0 && !step)
        step = "close";
    if (!step && out->kind == ZP_OUT_FILE && g_rename(out->temporary, out->target) != 0)
        step = "rename";
    if (step) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s failed: %s", out->target, step,
                    g_strerror(errno));
        zp_out_stream_abort(out);
        return FALSE;
    }
    g_free(out->temporary);
    out->temporary = NULL; /* renamed: the target now */
    zp_out_stream_abort(out);
    return TRUE;
}

gboolean zp_out_write(const char *path, const char *contents, gsize length, GError **error)
{
    ZpOutStream *out = zp_out_stream_open(path, error);
    if (!out)
        return FALSE;
    zp_out_stream_write(out, contents, length, NULL); /* a failure: close reports it */
    return zp_out_stream_close(out, error);
}

gboolean zp_check_out_path(const char *path, const char *flag, GError **error)
{
    ZpOutKind kind;
    char *target = NULL;
    if (!path || !zp_out_resolve(path, &kind, &target, error)) {
        if (!path)
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: no file name", flag);
        else
            g_prefix_error(error, "%s: ", flag);
        return FALSE;
    }
    if (kind != ZP_OUT_FILE) {
        const gboolean writable = kind == ZP_OUT_STDOUT || access(target, W_OK) == 0;
        if (!writable)
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: cannot write to '%s': %s", flag,
                        target, g_strerror(errno));
        g_free(target);
        return writable;
    }
    /* The truth about a directory is whether a file can be made in it (root ignores mode
     * bits; a read-only mount or a full quota does not). */
    char *dir = g_path_get_dirname(target);
    char *probe = g_build_filename(dir, ".zplan-probe-XXXXXX", NULL);
    const int fd = g_mkstemp(probe);
    const int saved = errno;
    if (fd >= 0) {
        close(fd);
        g_unlink(probe);
    } else {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: cannot write in directory '%s': %s", flag,
                    dir, g_strerror(saved));
    }
    g_free(probe);
    g_free(dir);
    g_free(target);
    return fd >= 0;
}

/* jansson's flags for every JSON file zplan writes: indented, keys in insertion order, reals
 * round-tripping; any value (a part of a document may be a string or a number). */
#define JSON_WRITE_FLAGS \
    (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17) | JSON_ENCODE_ANY)

/* Enough for any depth a writer nests to (a longer indent is written in several pieces). */
static const char SPACES[] = "                                                                ";

static gboolean put_indent(ZpOutStream *out, int depth)
{
    for (gsize left = 2 * (gsize)depth; left > 0;) {
        const gsize n = MIN(left, sizeof SPACES - 1);
        if (!zp_out_stream_write(out, SPACES, n, NULL))
            return FALSE;
        left -= n;
    }
    return TRUE;
}

typedef struct {
    ZpOutStream *out;
    int depth;
} DumpAt;

/* jansson's pieces, each newline followed by the indent of `depth` levels. */
static int dump_piece(const char *buffer, size_t size, void *data)
{
    const DumpAt *at = data;
    while (size > 0) {
        const char *newline = at->depth > 0 ? memchr(buffer, '\n', size) : NULL;
        const gsize n = newline ? (gsize)(newline - buffer) + 1 : size;
        if (!zp_out_stream_write(at->out, buffer, n, NULL) ||
            (newline && !put_indent(at->out, at->depth)))
            return -1;
        buffer += n, size -= n;
    }
    return 0;
}

gboolean zp_out_stream_json(ZpOutStream *out, json_t *value, int depth, GError **error)
{
    DumpAt at = {out, depth};
    /* A failed write stops the dump; jansson fails on its own only out of memory or on a
     * value it cannot write (a NaN). */
    const int dumped = json_dump_callback(value, dump_piece, &at, JSON_WRITE_FLAGS);
    if (!stream_ok(out, error))
        return FALSE;
    if (dumped != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "could not serialise JSON");
        return FALSE;
    }
    return TRUE;
}

gboolean zp_out_stream_json_item(ZpOutStream *out, int depth, gsize index, const char *key,
                                 GError **error)
{
    if (index > 0)
        zp_out_stream_write(out, ",", 1, NULL);
    zp_out_stream_write(out, "\n", 1, NULL);
    put_indent(out, depth);
    if (key) {
        json_t *name = json_string(key); /* escaped as jansson escapes a key */
        const gboolean ok = zp_out_stream_json(out, name, 0, error);
        json_decref(name);
        if (!ok)
            return FALSE;
        zp_out_stream_write(out, ": ", 2, NULL);
    }
    return stream_ok(out, error);
}

gboolean zp_out_stream_json_close(ZpOutStream *out, int depth, gsize count, char bracket,
                                  GError **error)
{
    if (count > 0) {
        zp_out_stream_write(out, "\n", 1, NULL);
        put_indent(out, depth - 1);
    }
    zp_out_stream_write(out, &bracket, 1, NULL);
    return stream_ok(out, error);
}

gboolean zp_json_write(json_t *value, const char *path, GError **error)
{
    ZpOutStream *out = zp_out_stream_open(path, error);
    if (!out)
        return FALSE;
    /* Streamed: json_dumps held the whole text (a schedule of 3.8 million ops is about 1.5 GB
     * of it) on top of the tree. */
    if (!zp_out_stream_json(out, value, 0, error) ||
        !zp_out_stream_write(out, "\n", 1, error)) {
        zp_out_stream_abort(out);
        return FALSE;
    }
    return zp_out_stream_close(out, error);
}
