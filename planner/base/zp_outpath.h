/* zp_outpath: where an output path leads and how every writer (schedule, trace, ds_config,
 * calibrated profile, measured.json, sweep) writes there, by one rule, so none destroys what it finds. */
#ifndef ZP_OUTPATH_H
#define ZP_OUTPATH_H

#include <glib.h>
#include <jansson.h>

/* How a path is written:
 *   ZP_OUT_FILE    a regular file or a new path: a temporary file beside it, then a rename, so a
 *                  reader never sees half a file (an existing file keeps its mode);
 *   ZP_OUT_STREAM  a FIFO or a character device (/dev/null, /dev/full, a terminal): opened and
 *                  written in place, never replaced;
 *   ZP_OUT_STDOUT  "-", or the file that is this process's standard output (/dev/stdout).
 * A symbolic link is followed to its target (a dangling one to the file it names), which the same
 * rule then classifies. A directory, a path ending in '/', an empty path, a block device and a
 * socket are refused. */
typedef enum { ZP_OUT_FILE, ZP_OUT_STREAM, ZP_OUT_STDOUT } ZpOutKind;

/* Classifies path (NULL is "-") and gives the path to write (*target, newly allocated; NULL for
 * ZP_OUT_STDOUT). A refusal names the path and why. */
gboolean zp_out_resolve(const char *path, ZpOutKind *kind, char **target, GError **error);

/* Writes `length` bytes of `contents` to path by the rule above; every write is checked. */
gboolean zp_out_write(const char *path, const char *contents, gsize length, GError **error);

/* Text too large to hold whole (a trace, a schedule of millions of ops), written piece by
 * piece by zp_out_write's rule: a regular file's pieces go to a temporary file beside it (its
 * mode as zp_out_write gives it), renamed over the target only by zp_out_stream_close, so a
 * failure leaves the target as it was and no temporary behind; a FIFO, a device or standard
 * output gets each piece as it comes. Small pieces are gathered into writes of
 * ZP_OUT_STREAM_BUFFER bytes (a piece as large goes straight out), so memory stays at that
 * whatever the text's length. */
#define ZP_OUT_STREAM_BUFFER (256u << 10)
typedef struct ZpOutStream ZpOutStream;

/* Opens path for writing, as zp_out_resolve classifies it; NULL, with the path and why, where
 * it cannot be (a refused path, a directory the temporary cannot be made in). */
ZpOutStream *zp_out_stream_open(const char *path, GError **error);

/* Appends length bytes. A failed write is reported here or by a later call, naming the path
 * and the system's reason; the stream must still be closed or aborted. */
gboolean zp_out_stream_write(ZpOutStream *out, const char *data, gsize length, GError **error);

/* Writes what is buffered, then for a regular file syncs it where the target existed (as
 * g_file_set_contents_full's G_FILE_SET_CONTENTS_CONSISTENT does) and renames it over the
 * target. FALSE if any write, the sync or the rename failed: the temporary is removed and the
 * target untouched. Frees out either way. */
gboolean zp_out_stream_close(ZpOutStream *out, GError **error);

/* Gives up: a regular file's temporary is removed, the target untouched. Frees out; NULL is
 * ignored. */
void zp_out_stream_abort(ZpOutStream *out);

/* An output path given by `flag`, checked before any work: zp_out_resolve accepts it, and for a
 * file, one can be created beside its target (a probe file is made and removed). */
gboolean zp_check_out_path(const char *path, const char *flag, GError **error);

/* Dumps JSON (indented, keys in insertion order) to path by zp_out_write's rule (NULL or "-":
 * standard output), streamed (zp_out_stream_open): the text is never held whole; a failed
 * write is an error. */
gboolean zp_json_write(json_t *value, const char *path, GError **error);

/* A document too large to build as one tree (a schedule's million ops), written a part at a
 * time in zp_json_write's exact text: its outer object and arrays by these, each part a small
 * tree dumped by zp_out_stream_json. `depth` is the nesting of what is written (the top
 * object's members are at 1). Each returns FALSE, with the path and why, where a write failed
 * (the stream must then be aborted).
 *
 * value (any JSON value) as zp_json_write dumps it nested `depth` deep: jansson's indent goes
 * by depth alone (a newline, then 2 spaces a level) and a string never holds a raw newline, so
 * the dump at depth 0 with 2 * depth spaces after each newline is the same text. Nothing is
 * written before or after it. */
gboolean zp_out_stream_json(ZpOutStream *out, json_t *value, int depth, GError **error);
/* What comes before the member `key` of an object (NULL: an element of an array) at `depth`:
 * a comma unless it is the first (index 0), a newline, the indent, and "\"key\": ". */
gboolean zp_out_stream_json_item(ZpOutStream *out, int depth, gsize index, const char *key,
                                 GError **error);
/* Closes an object ('}') or array (']') whose members are at `depth`, after `count` of them:
 * "[]" and "{}" stay on one line, as jansson writes them. The opening bracket is the
 * caller's to write. */
gboolean zp_out_stream_json_close(ZpOutStream *out, int depth, gsize count, char bracket,
                                  GError **error);

#endif
