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

/* An output path given by `flag`, checked before any work: zp_out_resolve accepts it, and for a
 * file, one can be created beside its target (a probe file is made and removed). */
gboolean zp_check_out_path(const char *path, const char *flag, GError **error);

/* Dumps JSON (indented, keys in insertion order) to path by zp_out_write's rule (NULL or "-":
 * standard output); a failed write is an error. */
gboolean zp_json_write(json_t *value, const char *path, GError **error);

#endif
