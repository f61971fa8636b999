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

static gboolean write_stdout(const char *contents, gsize length, GError **error)
{
    if (fwrite(contents, 1, length, stdout) != length || fflush(stdout) == EOF) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "writing to standard output: %s",
                    g_strerror(errno));
        return FALSE;
    }
    return TRUE;
}

/* In place, as `cat > path` would: a FIFO blocks until its reader opens it. */
static gboolean write_stream(const char *path, const char *contents, gsize length, GError **error)
{
    const int fd = g_open(path, O_WRONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, g_strerror(errno));
        return FALSE;
    }
    gsize done = 0;
    while (done < length) {
        const ssize_t n = write(fd, contents + done, length - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path,
                        n < 0 ? g_strerror(errno) : "wrote nothing");
            close(fd);
            return FALSE;
        }
        done += (gsize)n;
    }
    if (close(fd) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, g_strerror(errno));
        return FALSE;
    }
    return TRUE;
}

/* A temporary file beside path and a rename (g_file_set_contents_full); a file that exists keeps
 * its permission bits. */
static gboolean write_file(const char *path, const char *contents, gsize length, GError **error)
{
    struct stat st;
    const int mode = stat(path, &st) == 0 ? (int)(st.st_mode & 07777) : 0666;
    return g_file_set_contents_full(path, contents, (gssize)length,
                                    G_FILE_SET_CONTENTS_CONSISTENT, mode, error);
}

gboolean zp_out_write(const char *path, const char *contents, gsize length, GError **error)
{
    ZpOutKind kind;
    char *target = NULL;
    if (!zp_out_resolve(path, &kind, &target, error))
        return FALSE;
    gboolean ok;
    switch (kind) {
    case ZP_OUT_STDOUT:
        ok = write_stdout(contents, length, error);
        break;
    case ZP_OUT_STREAM:
        ok = write_stream(target, contents, length, error);
        break;
    default:
        ok = write_file(target, contents, length, error);
        break;
    }
    g_free(target);
    return ok;
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

gboolean zp_json_write(json_t *value, const char *path, GError **error)
{
    char *text = json_dumps(value, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (!text) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "could not serialise JSON");
        return FALSE;
    }
    /* The newline goes onto Jansson's own buffer: a copy would hold the text twice (a schedule
     * of 3.8 million ops is about 1.5 GB of it). */
    const size_t length = strlen(text);
    char *line = realloc(text, length + 2);
    if (!line) {
        free(text);
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "could not serialise JSON: out of memory");
        return FALSE;
    }
    line[length] = '\n', line[length + 1] = '\0';
    const gboolean ok = zp_out_write(path, line, length + 1, error);
    free(line);
    return ok;
}
