/* zp_jsonstream: reads a JSON object too large to hold (a profiler trace of hundreds of MB,
 * plain or gzip) one top-level value, or one element of a top-level array, at a time. */
#ifndef ZP_JSONSTREAM_H
#define ZP_JSONSTREAM_H

#include <glib.h>

/* Called with each element (a json_t *, borrowed) of the array under `stream_key`, its index
 * and the byte offset (of the uncompressed text) where it starts; and with the value of every
 * other top-level key listed in `keep_keys` (index -1). Returning FALSE (with *error set) stops
 * the reading. */
typedef gboolean (*ZpJsonStreamFn)(const char *key, void *value, gint64 index, guint64 offset,
                                   void *ctx, GError **error);

/* Streams `path` (gzip is recognised by its magic bytes): its top level must be an object;
 * every other key's value is skipped without being held. One element or kept value may be at
 * most `max_value_bytes` of JSON text. Fails naming the file and the byte offset on malformed
 * or truncated JSON, a value over the bound, or when `stream_key` is missing or not an array. */
gboolean zp_json_stream(const char *path, const char *stream_key,
                        const char *const *keep_keys, gsize max_value_bytes, ZpJsonStreamFn fn,
                        void *ctx, GError **error);

/* zp_json_stream's reading, with two more choices. */
typedef struct {
    const char *stream_key;
    const char *const *keep_keys;
    gboolean keep_others; /* every other top-level key's value, listed in keep_keys or not */
    gsize max_value_bytes;
    /* Accept nothing zp_json_load_object refuses (a reader that falls back to it on failure
     * refuses the same files): plain text only (not gzip), no key twice in an object (the top
     * level's included), no nesting deeper than Jansson's JSON_PARSER_MAX_DEPTH counted from
     * the top, nothing but white space after the object. */
    gboolean strict;
} ZpJsonStreamOptions;

gboolean zp_json_stream_with(const char *path, const ZpJsonStreamOptions *options,
                             ZpJsonStreamFn fn, void *ctx, GError **error);

#endif
