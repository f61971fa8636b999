/* zp_jsonstream: a bounded-buffer scanner over a JSON object's text that cuts out one value at a
 * time and hands it to Jansson. Jansson has no event (SAX) parser: json_load_callback builds
 * the whole tree, so a 500 MB trace would need several GB; cut element by element, memory is
 * the largest element. zlib's gzread reads gzip and plain files alike. Strict (a reader that
 * falls back to zp_json_load_object), it also refuses what that whole-tree load refuses. */
#include "zp_jsonstream.h"
#include "zp_util.h"

#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <zlib.h>

typedef struct {
    gzFile gz;
    const char *path;
    const ZpJsonStreamOptions *o;
    unsigned char buf[1 << 16];
    int len, pos;
    guint64 offset; /* of buf[pos] in the uncompressed text */
    gboolean eof, failed;
} Scan;

static int peek(Scan *s)
{
    if (s->pos == s->len && !s->eof) {
        s->offset += (guint64)s->len;
        s->len = gzread(s->gz, s->buf, sizeof s->buf);
        s->pos = 0;
        if (s->len <= 0) {
            int errnum = 0;
            gzerror(s->gz, &errnum);
            s->failed = s->len < 0 || (errnum != Z_OK && errnum != Z_BUF_ERROR);
            s->eof = TRUE;
            s->len = 0;
        }
    }
    return s->pos < s->len ? s->buf[s->pos] : -1;
}

static int next(Scan *s)
{
    const int c = peek(s);
    if (c >= 0)
        s->pos++;
    return c;
}

static guint64 where(const Scan *s)
{
    return s->offset + (guint64)s->pos;
}

static int skip_space(Scan *s)
{
    int c;
    while ((c = peek(s)) == ' ' || c == '\n' || c == '\r' || c == '\t')
        s->pos++;
    return c;
}

static gboolean fail(Scan *s, GError **error, const char *what)
{
    if (s->failed)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: read error at byte %" G_GUINT64_FORMAT
                    " (a damaged gzip stream?)", s->path, where(s));
    else if (peek(s) < 0)
        g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE,
                    "%s: truncated JSON: the text ends at byte %" G_GUINT64_FORMAT " %s",
                    s->path, where(s), what);
    else
        g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE,
                    "%s: malformed JSON at byte %" G_GUINT64_FORMAT ": %s", s->path, where(s),
                    what);
    return FALSE;
}

static void put(GString *out, int c)
{
    if (out)
        g_string_append_c(out, (char)c);
}

/* Whether out has grown past max (and then the error). */
static gboolean too_long(Scan *s, const GString *out, GError **error)
{
    const gsize max = s->o->max_value_bytes;
    if (!out || out->len <= max)
        return FALSE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: a value of more than %zu bytes at byte %" G_GUINT64_FORMAT
                ": not a profiler trace event", s->path, max, where(s));
    return TRUE;
}

/* Copies one string's text (the opening quote next) into out. */
static gboolean scan_string(Scan *s, GString *out, GError **error)
{
    put(out, next(s));
    for (;;) {
        if (too_long(s, out, error))
            return FALSE;
        const int c = next(s);
        if (c < 0)
            return fail(s, error, "inside a string");
        put(out, c);
        if (c == '"')
            return TRUE;
        if (c == '\\') {
            const int e = next(s);
            if (e < 0)
                return fail(s, error, "inside a string");
            put(out, e);
        }
    }
}

/* Copies one value's text into out (NULL: skips it), at most max_value_bytes of it. Brackets
 * are only counted here; Jansson checks the value. `above`: the containers the value is in
 * (strict: Jansson counts each value's depth from the top, itself and the scalars inside). */
static gboolean scan_value(Scan *s, GString *out, int above, GError **error)
{
    int c = skip_space(s), depth = 0;
    if (c < 0)
        return fail(s, error, "where a value should start");
    if (c != '{' && c != '[' && c != '"') { /* a number, true, false or null */
        while ((c = peek(s)) >= 0 && !strchr(",]} \n\r\t", c)) {
            put(out, next(s));
            if (too_long(s, out, error))
                return FALSE;
        }
        return TRUE;
    }
    do {
        c = peek(s);
        if (c == '"') {
            if (!scan_string(s, out, error))
                return FALSE;
        } else if (c < 0) {
            return fail(s, error, "inside a value");
        } else {
            depth += (c == '{' || c == '[') - (c == '}' || c == ']');
            put(out, next(s));
        }
        if (too_long(s, out, error))
            return FALSE;
        if (s->o->strict && above + depth + 1 > JSON_PARSER_MAX_DEPTH)
            return fail(s, error, "nested deeper than Jansson reads");
    } while (depth > 0);
    return TRUE;
}

static json_t *decode(Scan *s, GString *text, guint64 start, GError **error)
{
    json_error_t jerr;
    const size_t flags = JSON_DECODE_ANY | (s->o->strict ? JSON_REJECT_DUPLICATES : 0);
    json_t *v = json_loadb(text->str, text->len, flags, &jerr);
    if (!v)
        g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE,
                    "%s: malformed JSON in the value at byte %" G_GUINT64_FORMAT ": %s",
                    s->path, start, jerr.text);
    return v;
}

/* The array's elements, each decoded and handed to fn; the '[' is next. */
static gboolean stream_array(Scan *s, const char *key, GString *text, ZpJsonStreamFn fn,
                             void *ctx, GError **error)
{
    next(s);
    if (skip_space(s) == ']') {
        next(s);
        return TRUE;
    }
    for (gint64 index = 0;; index++) {
        g_string_truncate(text, 0);
        skip_space(s);
        const guint64 start = where(s);
        if (!scan_value(s, text, 2, error))
            return FALSE;
        json_t *v = decode(s, text, start, error);
        const gboolean ok = v && fn(key, v, index, start, ctx, error);
        json_decref(v);
        if (!ok)
            return FALSE;
        const int c = skip_space(s);
        next(s);
        if (c == ']')
            return TRUE;
        if (c != ',')
            return fail(s, error, "expected ',' or ']' after an element");
    }
}

static gboolean listed(const char *key, const char *const *keys)
{
    for (int i = 0; keys && keys[i]; i++)
        if (strcmp(keys[i], key) == 0)
            return TRUE;
    return FALSE;
}

/* Strict: whether key came before (Jansson's JSON_REJECT_DUPLICATES, at the top level). */
static gboolean seen_twice(Scan *s, GHashTable *seen, const char *key, GError **error)
{
    if (!seen || g_hash_table_add(seen, g_strdup(key)))
        return FALSE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE, "%s: key \"%s\" twice at the top level", s->path,
                key);
    return TRUE;
}

static gboolean stream_object(Scan *s, ZpJsonStreamFn fn, void *ctx, GError **error)
{
    const ZpJsonStreamOptions *o = s->o;
    GString *text = g_string_new(NULL);
    GHashTable *seen = o->strict ? g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL)
                                 : NULL;
    gboolean ok = TRUE, streamed = FALSE;
    if (skip_space(s) != '{')
        ok = fail(s, error, "the top level must be a JSON object");
    next(s);
    for (gboolean first = TRUE; ok; first = FALSE) {
        int c = skip_space(s);
        if (c == '}' && first) {
            next(s);
            break;
        }
        g_string_truncate(text, 0);
        const guint64 start = where(s);
        if (c != '"') {
            ok = fail(s, error, "expected a key");
            break;
        }
        json_t *k = (ok = scan_value(s, text, 1, error)) ? decode(s, text, start, error) : NULL;
        char *key = k ? g_strdup(json_string_value(k)) : NULL;
        json_decref(k);
        ok = key != NULL && !seen_twice(s, seen, key, error);
        if (ok && skip_space(s) != ':')
            ok = fail(s, error, "expected ':' after a key");
        next(s);
        if (ok && strcmp(key, o->stream_key) == 0) {
            if (skip_space(s) != '[') {
                g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be an array",
                            s->path, o->stream_key);
                ok = FALSE;
            }
            ok = ok && stream_array(s, key, text, fn, ctx, error);
            streamed = TRUE;
        } else if (ok && (o->keep_others || listed(key, o->keep_keys))) {
            g_string_truncate(text, 0);
            const guint64 at = (skip_space(s), where(s));
            json_t *v = (ok = scan_value(s, text, 1, error)) ? decode(s, text, at, error) : NULL;
            ok = v && fn(key, v, -1, at, ctx, error);
            json_decref(v);
        } else if (ok) {
            ok = scan_value(s, NULL, 1, error);
        }
        g_free(key);
        c = skip_space(s);
        next(s);
        if (ok && c == '}')
            break;
        if (ok && c != ',')
            ok = fail(s, error, "expected ',' or '}' after a value");
    }
    g_string_free(text, TRUE);
    if (seen)
        g_hash_table_unref(seen);
    if (ok && !streamed) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: no \"%s\" array (not a profiler trace)",
                    s->path, o->stream_key);
        ok = FALSE;
    }
    /* Jansson refuses anything after the value (its end-of-file check); a read error there
     * shows here. */
    if (ok && o->strict && skip_space(s) >= 0)
        ok = fail(s, error, "text after the object");
    if (ok && s->failed)
        ok = fail(s, error, "");
    return ok;
}

gboolean zp_json_stream(const char *path, const char *stream_key,
                        const char *const *keep_keys, gsize max_value_bytes, ZpJsonStreamFn fn,
                        void *ctx, GError **error)
{
    const ZpJsonStreamOptions options = {.stream_key = stream_key, .keep_keys = keep_keys,
                                         .max_value_bytes = max_value_bytes};
    return zp_json_stream_with(path, &options, fn, ctx, error);
}

gboolean zp_json_stream_with(const char *path, const ZpJsonStreamOptions *options,
                             ZpJsonStreamFn fn, void *ctx, GError **error)
{
    if (g_file_test(path, G_FILE_TEST_IS_DIR)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: is a directory, not a trace", path);
        return FALSE;
    }
    Scan *s = g_new0(Scan, 1);
    s->path = path;
    s->o = options;
    s->gz = gzopen(path, "rb");
    if (!s->gz) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path,
                    errno ? g_strerror(errno) : "cannot open");
        g_free(s);
        return FALSE;
    }
    gzbuffer(s->gz, 1 << 17);
    gboolean ok = TRUE;
    if (options->strict && !gzdirect(s->gz)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE, "%s: gzip-compressed, not plain JSON", path);
        ok = FALSE;
    }
    ok = ok && stream_object(s, fn, ctx, error);
    gzclose(s->gz);
    g_free(s);
    return ok;
}
