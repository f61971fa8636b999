/* zp_util: the small pieces every zplan module shares — the error domain, strict JSON
 * field readers that name the file and key, number parsing for flags. */
#ifndef ZP_UTIL_H
#define ZP_UTIL_H

#include <glib.h>
#include <jansson.h>
#include <stdint.h>


#define ZP_ERROR (zp_error_quark())
GQuark zp_error_quark(void);

typedef enum {
    ZP_ERROR_IO,      /* a file could not be read or written */
    ZP_ERROR_PARSE,   /* malformed JSON */
    ZP_ERROR_KEY,     /* missing, unknown or wrong-typed key */
    ZP_ERROR_VALUE,   /* a value out of its allowed range */
    ZP_ERROR_NOTFOUND /* an unknown model or cluster name */
} ZpErrorCode;

/* Directory that holds models/ and hwprofiles/: $ZPLAN_DATA_DIR if set, else the source
 * tree the binary was built from (ZP_DATA_DIR, set by the Makefile). */
const char *zp_data_dir(void);

/* Loads a JSON object from path. On a syntax error the message is "PATH:LINE:COL: text". */
json_t *zp_json_load_object(const char *path, GError **error);

/* Strict field readers. `what` names the file (or object) for messages; a missing
 * required key, a wrong type or a value outside [min, max] sets error naming the key. */
gboolean zp_json_get_int(json_t *obj, const char *what, const char *key, gboolean required,
                         int64_t min, int64_t max, int64_t *out, GError **error);
gboolean zp_json_get_number(json_t *obj, const char *what, const char *key, gboolean required,
                            double min, double max, double *out, GError **error);
gboolean zp_json_get_bool(json_t *obj, const char *what, const char *key, gboolean required,
                          gboolean *out, GError **error);
gboolean zp_json_get_string(json_t *obj, const char *what, const char *key, gboolean required,
                            const char **out, GError **error);

/* Fails naming the first key of obj that is not in the NULL-terminated `allowed` list,
 * so a typo in a spec file is never silently ignored. */
gboolean zp_json_check_keys(json_t *obj, const char *what, const char *const *allowed,
                            GError **error);

/* Every argument valid UTF-8 (GLib's option parser converts them and would fail without
 * naming the flag); else an error naming the flag the bad argument belongs to. */
gboolean zp_check_args_utf8(int argc, char **argv, GError **error);

/* Finds `text` in `names` (NULL-terminated) and stores its index. Otherwise fails with
 * "FLAG: unknown value 'X' (choose from a, b, c)"; a NULL `text` is unknown too. */
gboolean zp_parse_choice(const char *text, const char *flag, const char *const *names, int *out,
                         GError **error);

/* Parses a flag value as a finite number in [min, max] ("7.5e9", "64"). If `integral`,
 * the value must be a whole number. `flag` names the flag in the message. */
gboolean zp_parse_number(const char *text, const char *flag, double min, double max,
                         gboolean integral, double *out, GError **error);

/* What a size counts: parameters or elements (suffixes K, M, B, T: 1e3 to 1e12) or bytes
 * (KB, MB, GB, TB: 1e3 to 1e12; KiB, MiB, GiB, TiB: 2^10 to 2^40), each also in lower case
 * (7b, 80gib). */
typedef enum { ZP_SIZE_COUNT, ZP_SIZE_BYTES } ZpSizeUnit;

/* zp_parse_number with an optional suffix of `unit` ("7B", "1.5e9", "1T"; "80GB", "80GiB").
 * A value that is whole to within rounding after the suffix is rounded ("1.1K" is 1100). An
 * unknown suffix is "FLAG: '7Q' is not a number (suffixes: K, M, B, T)". */
gboolean zp_parse_size(const char *text, const char *flag, ZpSizeUnit unit, double min,
                       double max, gboolean integral, double *out, GError **error);

/* Parses a comma-separated list of whole numbers in [min, max] ("1,4,16"). */
GArray *zp_parse_int_list(const char *text, const char *flag, double min, double max,
                          GError **error);


/* Progress of long work, reported by library code to whoever shows it (the CLI): `fraction`
 * of the work is done, in [0, 1]. */
typedef void (*ZpProgressFn)(double fraction, void *ctx);

/* Seconds on the monotonic clock, for differences only: clock_gettime's nanoseconds, since
 * g_get_monotonic_time's microseconds are coarse for the shortest ops zreal times. */
double zp_now_s(void);

/* Asks the kernel for transparent huge pages over [data, data + bytes) (the 2 MiB pages
 * wholly inside it), for a large array about to be written once: faulting a hundred megabytes
 * in 4 KiB pages costs more than writing them. A hint: where it is declined (no THP, another
 * system), nothing changes. */
void zp_advise_huge_pages(void *data, size_t bytes);

/* Grows an array's room to `elems` elements (none past G_MAXUINT / 2), its length kept, over
 * transparent huge pages (zp_advise_huge_pages): an array of megabytes written once, whose
 * 4 KiB first-touch faults (and, grown by doubling, its copies) cost more than its writes.
 * Returns the room it made, elems, for zp_array_extend; 0 where it made none (elems within
 * the length already, or past G_MAXUINT / 2). */
guint zp_array_reserve_huge(GArray *array, guint64 elems);

/* Lengthens `array` (made without clear or zero termination) by n elements and returns the
 * first of them (elem_bytes each), uninitialised. *room is a length the array holds without growing: what
 * zp_array_reserve_huge reserved for it, 0 when unknown. Within it only `len` is set, which
 * is all that g_array_set_size does there for such an array (GArray's public len is
 * GRealArray's); past it the array is reserved to twice the length (as GLib's doubling) and
 * *room says so. An op builder's two arrays grew by GLib calls per op, each checking its room
 * with a 64-bit division (g_array_maybe_expand): 430 M instructions of plan --3d
 * gpt-1t/4096's 4.9 G. */
static inline void *zp_array_extend(GArray *array, guint n, gsize elem_bytes, guint *room)
{
    const guint len = array->len;
    if (G_UNLIKELY(n > *room || len > *room - n)) {
        const guint64 want = MAX((guint64)len + n, 2 * (guint64)len);
        if (want > G_MAXUINT / 2) { /* GLib's own call, which says why it cannot */
            g_array_set_size(array, len + n);
            return array->data + (gsize)len * elem_bytes;
        }
        *room = zp_array_reserve_huge(array, want);
    }
    array->len = len + n;
    return array->data + (gsize)len * elem_bytes;
}

/* The greatest common divisor of a and b (a where b is 0): Megatron's bucket padding's
 * lcm(dp, 128), a pipeline's period in whole micro-steps of two (cli_rank.c). */
static inline uint64_t zp_gcd_u64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        const uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* The first index of the ascending v[0, n) whose value is at least x (n: none), of 32-bit
 * values (an op's index) and of 64-bit ones (a tensor's flat offset: zp_impl_tensor_part_at):
 * one body for both. */
#define ZP_LOWER_BOUND(name, type)                                                               \
    static inline guint name(const type *v, guint n, type x)                                     \
    {                                                                                            \
        guint lo = 0, hi = n;                                                                    \
        while (lo < hi) {                                                                        \
            const guint mid = lo + (hi - lo) / 2;                                                \
            if (v[mid] < x)                                                                      \
                lo = mid + 1;                                                                    \
            else                                                                                 \
                hi = mid;                                                                        \
        }                                                                                        \
        return lo;                                                                               \
    }
ZP_LOWER_BOUND(zp_lower_bound_u32, uint32_t)
ZP_LOWER_BOUND(zp_lower_bound_u64, uint64_t)

/* Has glibc's malloc keep freed memory for the next allocation (mallopt M_MMAP_THRESHOLD and
 * M_TRIM_THRESHOLD at 1 GiB) instead of handing each large block back to the kernel, which
 * zeroes fresh pages again for the next one; and, where glibc took both, has the heap's first
 * 128 MiB (address space, not memory) fault in transparent huge pages. A process that
 * evaluates plans calls it first (zplan's main, the benches); elsewhere glibc's defaults
 * stay. */
void zp_malloc_keep_freed(void);

/* Resolves a spec given by name or path: a path ending in .json is returned as is, a name is
 * looked up as DATA_DIR/SUBDIR/NAME.json. An unknown name fails as "FLAG: unknown KIND 'NAME'
 * (known: ...; or give a PATH.json)". Returns a newly allocated path or NULL. */
char *zp_resolve_spec(const char *name_or_path, const char *subdir, const char *flag,
                      const char *kind, GError **error);

/* Lists the *.json base names (without extension) in a directory, and SUB/NAME for every
 * subdirectory's directory that holds a config.json (models/hf/), sorted, comma-joined. */
char *zp_list_json_names(const char *dir);

/* The name in names[0..n) closest to `word` by edit distance, when close enough to be a typo
 * (at most a third of its letters, or 2, away) and not `word` itself; else NULL. */
const char *zp_closest_name(const char *word, const char *const *names, size_t n);

/* FNV-1a over `bytes` (a multiple of 8) taken as 64-bit words, folded to a guint: the hash of
 * the search's memo keys, structs of doubles and integers compared as bytes (padding too, so
 * their makers zero or copy them whole). */
guint zp_hash_words64(const void *data, size_t bytes);

/* Appends " Did you mean 'NAME'?" to *error's message when zp_closest_name finds one. */
void zp_prefix_suggestion(GError **error, const char *word, const char *const *names, size_t n);

#endif
