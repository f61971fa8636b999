/* zp_util: error domain, strict JSON readers, and flag number parsing.
 * Every message names the file, key or flag at fault so the CLI can print it as one line. */
#include "zp_util.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef ZP_DATA_DIR
#define ZP_DATA_DIR "."
#endif

G_DEFINE_QUARK(zp-error-quark, zp_error)

const char *zp_data_dir(void)
{
    const char *env = g_getenv("ZPLAN_DATA_DIR");
    return (env && *env) ? env : ZP_DATA_DIR;
}

json_t *zp_json_load_object(const char *path, GError **error)
{
    if (g_file_test(path, G_FILE_TEST_IS_DIR)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: is a directory, not a JSON file", path);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* Jansson reports a missing file as a parse error at line -1. */
        if (jerr.line < 0)
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: %s", path, jerr.text);
        else
            g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE, "%s:%d:%d: malformed JSON: %s", path,
                        jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_PARSE, "%s: top level must be a JSON object", path);
        json_decref(root);
        return NULL;
    }
    return root;
}

static json_t *get_field(json_t *obj, const char *what, const char *key, gboolean required,
                         GError **error, gboolean *present)
{
    json_t *v = json_object_get(obj, key);
    *present = v != NULL && !json_is_null(v);
    if (!*present && required)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: missing key \"%s\"", what, key);
    return v;
}

gboolean zp_json_get_int(json_t *obj, const char *what, const char *key, gboolean required,
                         int64_t min, int64_t max, int64_t *out, GError **error)
{
    gboolean present;
    json_t *v = get_field(obj, what, key, required, error, &present);
    if (!present)
        return !required;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
                                  : (json_is_real(v) ? json_real_value(v) : NAN);
    if (!json_is_number(v) || d != floor(d)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be a whole number", what,
                    key);
        return FALSE;
    }
    if (d < (double)min || d > (double)max) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"%s\" = %.17g is outside [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                    "]",
                    what, key, d, min, max);
        return FALSE;
    }
    *out = (int64_t)d;
    return TRUE;
}

gboolean zp_json_get_number(json_t *obj, const char *what, const char *key, gboolean required,
                            double min, double max, double *out, GError **error)
{
    gboolean present;
    json_t *v = get_field(obj, what, key, required, error, &present);
    if (!present)
        return !required;
    if (!json_is_number(v)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be a number", what, key);
        return FALSE;
    }
    double d = json_number_value(v);
    if (!isfinite(d) || d < min || d > max) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" = %g is outside [%.15g, %.15g]",
                    what, key, d, min, max);
        return FALSE;
    }
    *out = d;
    return TRUE;
}

gboolean zp_json_get_bool(json_t *obj, const char *what, const char *key, gboolean required,
                          gboolean *out, GError **error)
{
    gboolean present;
    json_t *v = get_field(obj, what, key, required, error, &present);
    if (!present)
        return !required;
    if (!json_is_boolean(v)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be true or false", what,
                    key);
        return FALSE;
    }
    *out = json_is_true(v);
    return TRUE;
}

gboolean zp_json_get_string(json_t *obj, const char *what, const char *key, gboolean required,
                            const char **out, GError **error)
{
    gboolean present;
    json_t *v = get_field(obj, what, key, required, error, &present);
    if (!present)
        return !required;
    if (!json_is_string(v)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be a string", what, key);
        return FALSE;
    }
    *out = json_string_value(v);
    return TRUE;
}

gboolean zp_json_check_keys(json_t *obj, const char *what, const char *const *allowed,
                            GError **error)
{
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value)
    {
        gboolean known = FALSE;
        for (const char *const *a = allowed; *a && !known; a++)
            known = strcmp(*a, key) == 0;
        if (!known) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: unknown key \"%s\"", what, key);
            return FALSE;
        }
    }
    return TRUE;
}

gboolean zp_check_args_utf8(int argc, char **argv, GError **error)
{
    for (int i = 1; i < argc; i++) {
        if (g_utf8_validate(argv[i], -1, NULL))
            continue;
        /* The flag is the argument itself (--flag=value) or the one before it. */
        const char *flag = g_str_has_prefix(argv[i], "-") ? argv[i] : i > 1 ? argv[i - 1] : "";
        const size_t len = strcspn(flag, "=");
        char *name = g_utf8_make_valid(flag, (gssize)len);
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: argument %d is not valid UTF-8",
                    g_str_has_prefix(name, "-") ? name : "argument", i);
        g_free(name);
        return FALSE;
    }
    return TRUE;
}

/* The checks a parsed flag value passes: whole when asked, inside [min, max]. */
static gboolean check_number(const char *text, const char *flag, double d, double min,
                             double max, gboolean integral, double *out, GError **error)
{
    if (integral && d != floor(d)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: '%s' must be a whole number", flag,
                    text);
        return FALSE;
    }
    if (d < min || d > max) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: '%s' is outside [%.15g, %.15g]", flag, text,
                    min, max);
        return FALSE;
    }
    *out = d;
    return TRUE;
}

gboolean zp_parse_number(const char *text, const char *flag, double min, double max,
                         gboolean integral, double *out, GError **error)
{
    char *end = NULL;
    errno = 0;
    double d = text ? strtod(text, &end) : NAN;
    if (!text || end == text || *end != '\0' || errno == ERANGE || !isfinite(d)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: '%s' is not a number", flag,
                    text ? text : "");
        return FALSE;
    }
    return check_number(text, flag, d, min, max, integral, out, error);
}

static const struct {
    ZpSizeUnit unit;
    const char *suffix;
    double factor;
} size_suffixes[] = {
    {ZP_SIZE_COUNT, "K", 1e3},    {ZP_SIZE_COUNT, "M", 1e6},
    {ZP_SIZE_COUNT, "B", 1e9},    {ZP_SIZE_COUNT, "T", 1e12},
    {ZP_SIZE_BYTES, "KB", 1e3},   {ZP_SIZE_BYTES, "MB", 1e6},
    {ZP_SIZE_BYTES, "GB", 1e9},   {ZP_SIZE_BYTES, "TB", 1e12},
    {ZP_SIZE_BYTES, "KiB", 0x1p10}, {ZP_SIZE_BYTES, "MiB", 0x1p20},
    {ZP_SIZE_BYTES, "GiB", 0x1p30}, {ZP_SIZE_BYTES, "TiB", 0x1p40},
};

gboolean zp_parse_size(const char *text, const char *flag, ZpSizeUnit unit, double min,
                       double max, gboolean integral, double *out, GError **error)
{
    char *end = NULL;
    errno = 0;
    double d = text ? strtod(text, &end) : NAN;
    double factor = end != text && text && *end == '\0' ? 1 : 0;
    /* Each suffix as written or all in lower case (7b, 8k, 80gb, 80gib), never mixed (80Gib):
     * a mixed case is more likely a typo than a unit. */
    for (size_t i = 0; factor == 0 && end != text && i < G_N_ELEMENTS(size_suffixes); i++) {
        char *lower = g_ascii_strdown(size_suffixes[i].suffix, -1);
        if (size_suffixes[i].unit == unit &&
            (strcmp(end, size_suffixes[i].suffix) == 0 || strcmp(end, lower) == 0))
            factor = size_suffixes[i].factor;
        g_free(lower);
    }
    d *= factor;
    if (factor == 0 || errno == ERANGE || !isfinite(d)) {
        GString *known = g_string_new(NULL);
        for (size_t i = 0; i < G_N_ELEMENTS(size_suffixes); i++)
            if (size_suffixes[i].unit == unit)
                g_string_append_printf(known, "%s%s", known->len ? ", " : "",
                                       size_suffixes[i].suffix);
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: '%s' is not a number (suffixes: %s)",
                    flag, text ? text : "", known->str);
        g_string_free(known, TRUE);
        return FALSE;
    }
    if (factor != 1 && fabs(d - nearbyint(d)) <= 1e-9 * fabs(d))
        d = nearbyint(d); /* 1.1K is 1100.0000000000002 in binary */
    return check_number(text, flag, d, min, max, integral, out, error);
}

GArray *zp_parse_int_list(const char *text, const char *flag, double min, double max,
                          GError **error)
{
    GArray *values = g_array_new(FALSE, FALSE, sizeof(int64_t));
    char **parts = g_strsplit(text ? text : "", ",", -1);
    for (char **p = parts; *p; p++) {
        double d;
        if (!zp_parse_number(g_strstrip(*p), flag, min, max, TRUE, &d, error)) {
            g_strfreev(parts);
            g_array_unref(values);
            return NULL;
        }
        int64_t v = (int64_t)d;
        g_array_append_val(values, v);
    }
    g_strfreev(parts);
    if (values->len == 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: empty list", flag);
        g_array_unref(values);
        return NULL;
    }
    return values;
}

/* Levenshtein distance (insertions, deletions and substitutions, each 1), over two rows. */
static size_t edit_distance(const char *a, const char *b)
{
    const size_t n = strlen(b);
    size_t *row = g_new(size_t, n + 1), *next = g_new(size_t, n + 1);
    for (size_t j = 0; j <= n; j++)
        row[j] = j;
    for (size_t i = 0; a[i]; i++) {
        next[0] = i + 1;
        for (size_t j = 0; j < n; j++) {
            const size_t substitute = row[j] + (a[i] != b[j]);
            next[j + 1] = MIN(substitute, MIN(row[j + 1], next[j]) + 1);
        }
        size_t *swap = row;
        row = next, next = swap;
    }
    const size_t d = row[n];
    g_free(row), g_free(next);
    return d;
}

const char *zp_closest_name(const char *word, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = 0;
    const size_t len = word ? strlen(word) : 0;
    for (size_t i = 0; word && i < n; i++) {
        const size_t d = edit_distance(word, names[i]);
        if (!best || d < best_d)
            best = names[i], best_d = d;
    }
    /* A third of the word's letters (at least 2) wrong is still a typo; more is another name. */
    return best && best_d > 0 && best_d <= MAX(2, len / 3) ? best : NULL;
}

void zp_prefix_suggestion(GError **error, const char *word, const char *const *names, size_t n)
{
    const char *closest = zp_closest_name(word, names, n);
    if (error && *error && closest) {
        char *message = g_strdup_printf("%s Did you mean '%s'?", (*error)->message, closest);
        g_free((*error)->message);
        (*error)->message = message;
    }
}

static gint compare_strings(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds "SUB/NAME" for every directory dir/SUB/NAME that holds a config.json (models/hf/'s
 * Hugging Face checkpoints, which --model takes by that name). */
static void add_config_dirs(const char *dir, GPtrArray *names)
{
    GDir *d = g_dir_open(dir, 0, NULL);
    const char *sub;
    while (d && (sub = g_dir_read_name(d))) {
        char *subdir = g_build_filename(dir, sub, NULL);
        GDir *s = g_dir_open(subdir, 0, NULL);
        const char *entry;
        while (s && (entry = g_dir_read_name(s))) {
            char *config = g_build_filename(subdir, entry, "config.json", NULL);
            if (g_file_test(config, G_FILE_TEST_IS_REGULAR))
                g_ptr_array_add(names, g_build_filename(sub, entry, NULL));
            g_free(config);
        }
        if (s)
            g_dir_close(s);
        g_free(subdir);
    }
    if (d)
        g_dir_close(d);
}

/* The names zp_list_json_names lists, sorted, NULL-terminated. */
static GPtrArray *json_names(const char *dir)
{
    GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
    GDir *d = g_dir_open(dir, 0, NULL);
    const char *entry;
    while (d && (entry = g_dir_read_name(d)))
        if (g_str_has_suffix(entry, ".json"))
            g_ptr_array_add(names, g_strndup(entry, strlen(entry) - 5));
    if (d)
        g_dir_close(d);
    add_config_dirs(dir, names);
    g_ptr_array_sort(names, compare_strings);
    g_ptr_array_add(names, NULL);
    return names;
}

char *zp_list_json_names(const char *dir)
{
    GPtrArray *names = json_names(dir);
    char *joined = g_strjoinv(", ", (char **)names->pdata);
    g_ptr_array_unref(names);
    return joined;
}

char *zp_resolve_spec(const char *name_or_path, const char *subdir, const char *flag,
                      const char *kind, GError **error)
{
    if (g_str_has_suffix(name_or_path, ".json"))
        return g_strdup(name_or_path);
    char *file = g_strconcat(name_or_path, ".json", NULL);
    char *path = g_build_filename(zp_data_dir(), subdir, file, NULL);
    g_free(file);
    if (!strchr(name_or_path, '/') && g_file_test(path, G_FILE_TEST_EXISTS))
        return path;
    char *dir = g_build_filename(zp_data_dir(), subdir, NULL);
    GPtrArray *known = json_names(dir);
    char *names = g_strjoinv(", ", (char **)known->pdata);
    g_set_error(error, ZP_ERROR, ZP_ERROR_NOTFOUND,
                "%s: unknown %s '%s' (known: %s; or give a PATH.json).", flag, kind, name_or_path,
                names);
    zp_prefix_suggestion(error, name_or_path, (const char *const *)known->pdata, known->len - 1);
    g_ptr_array_unref(known);
    g_free(names);
    g_free(dir);
    g_free(path);
    return NULL;
}

double zp_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

gboolean zp_parse_choice(const char *text, const char *flag, const char *const *names, int *out,
                         GError **error)
{
    for (int i = 0; names[i]; i++)
        if (text && strcmp(text, names[i]) == 0) {
            *out = i;
            return TRUE;
        }
    char *choices = g_strjoinv(", ", (char **)names);
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown value '%s' (choose from %s).", flag,
                text ? text : "", choices);
    zp_prefix_suggestion(error, text, names, g_strv_length((char **)names));
    g_free(choices);
    return FALSE;
}

void zp_advise_huge_pages(void *data, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20, start = (uintptr_t)data;
    const uintptr_t from = (start + huge - 1) & ~(huge - 1), to = (start + bytes) & ~(huge - 1);
    if (to > from)
        (void)madvise((void *)from, to - from, MADV_HUGEPAGE); /* a hint: a refusal is fine */
#else
    (void)data, (void)bytes;
#endif
}

/* The heap's first HEAP_HUGE_BYTES: taken from the kernel at once (address space only, nothing
 * is touched) and handed back to malloc's free top, which M_TRIM_THRESHOLD keeps; advised as
 * transparent huge pages before anything lives there, so every block malloc later carves from
 * it faults in 2 MiB pages. What glibc's own glibc.malloc.hugetlb=1 tunable does for each sbrk,
 * but a tunable is read only from the environment at exec. Why: on a virtual machine a 4 KiB
 * first-touch fault costs microseconds (this development VM: 64 MiB touched in 4 KiB pages
 * 185 ms, in 2 MiB pages 4-9 ms), and each array zp_advise_huge_pages did not reach (a
 * GArray grown by doubling, the engine's smaller arrays, the allocator replay's) faulted so:
 * `plan --3d` gpt-1t/4096 faulted ~9,000 times, a fifth to a quarter of its CPU time, and ~600
 * with this (bench/bench_plan). 128 MiB holds a search's and a simulation's evaluations; at
 * 256 MiB Megatron 1T's --trace, whose heap passes it, peaked 62 MiB higher (bench_io: a
 * 2 MiB page is resident whole once any byte of it is touched). Past it the heap grows as
 * before. */
#define HEAP_HUGE_BYTES ((size_t)128 << 20)

static void advise_heap_huge(void)
{
#ifdef MADV_HUGEPAGE
    char *low = malloc(1);
    /* volatile: a malloc freed unused may be left out by the compiler */
    char *volatile reserve = malloc(HEAP_HUGE_BYTES);
    const long page_bytes = sysconf(_SC_PAGESIZE);
    const uintptr_t page = page_bytes > 0 ? (uintptr_t)page_bytes : 4096;
    const uintptr_t from = ((uintptr_t)low + page - 1) & ~(page - 1);
    const uintptr_t top = (uintptr_t)sbrk(0) & ~(page - 1);
    /* Only where both came from the one brk heap, the reserve above the small block (not a
     * mapping of its own, nor another allocator's: ASan's, valgrind's) */
    const gboolean in_heap = low && reserve && (uintptr_t)reserve > (uintptr_t)low &&
                             (uintptr_t)reserve + HEAP_HUGE_BYTES <= top;
    free(reserve);
    if (in_heap)
        (void)madvise((void *)from, top - from, MADV_HUGEPAGE); /* a hint, as above */
    free(low);
#endif
}

/* By default glibc maps each block over its dynamic threshold (at most 32 MiB) on its own and
 * unmaps it when freed, and trims the heap's free top past 128 KiB: an evaluation's phases
 * (build, simulation, allocator replay) free tens of megabytes that the next phase asks for
 * again as fresh pages, which the kernel zeroes (clear_page_erms and its faults: a fifth to a
 * third of the 32,000-layer stage-3 case's CPU time). Kept in the heap, that case's run faults
 * ~170 huge pages and ~7,000 small ones in place of ~230 and ~23,000 (340 MiB zeroed in place
 * of 550 MiB); bench_sim deep 32000: build + simulation 0.405-0.444 s -> 0.368-0.391 s,
 * replay 0.162 -> 0.130 s; Megatron 1T's evaluation 55-60 -> 45-49 ms; `plan --3d` 0.47 ->
 * 0.43 CPU s. The price is peak RSS: 336 -> 366 MiB at 32,000 layers, 56 -> 71 MB for
 * `plan --3d` (freed blocks no later request fits); the --json and --trace targets' RSS is
 * unchanged (7, 8 and 36 MiB). Memory stays bounded: the heap holds at most what the process
 * used at its peak. mallopt takes an int: 1 GiB. A refusal (another libc) leaves the
 * defaults. */
void zp_malloc_keep_freed(void)
{
#ifdef M_MMAP_THRESHOLD
    if (mallopt(M_MMAP_THRESHOLD, 1 << 30) && mallopt(M_TRIM_THRESHOLD, 1 << 30))
        advise_heap_huge(); /* kept: not trimmed back */
#endif
}

/* The ops of a deep pipeline were a hundred megabytes written once, and faulting them in
 * 4 KiB pages was 40% of gpt-1t's pp 64 build (perf: exc_page_fault, clear_page and
 * memory-cgroup charges under g_array_append_vals). */
guint zp_array_reserve_huge(GArray *array, guint64 elems)
{
    const guint len = array->len;
    if (elems <= len || elems > G_MAXUINT / 2)
        return 0;
    g_array_set_size(array, (guint)elems);
    g_array_set_size(array, len);
    zp_advise_huge_pages(array->data, (size_t)elems * g_array_get_element_size(array));
    return (guint)elems;
}

guint zp_hash_words64(const void *data, size_t bytes)
{
    guint64 h = 14695981039346656037u; /* FNV-1a's offset basis and prime */
    for (size_t i = 0; i + sizeof(guint64) <= bytes; i += sizeof(guint64)) {
        guint64 word;
        memcpy(&word, (const char *)data + i, sizeof word);
        h = (h ^ word) * 1099511628211u;
    }
    return (guint)(h ^ (h >> 32));
}
