/* zp_kclass: the kernel classes' names and the hwprofile's "kernel_tables" section: its check
 * on load and the merge of a new measurement into an existing profile. */
#include "zp_kclass.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static const char *const class_names[] = {"gemm", "attention", "memory", "collective",
                                          "optimizer", "unknown"};

const char *zp_kclass_name(ZpKClass c)
{
    return class_names[c <= ZP_KCLASS_UNKNOWN ? c : ZP_KCLASS_UNKNOWN];
}

/* Each class's row: its keys (NULL-terminated), how many of the first identify a row, and
 * which are strings (the rest numbers, "count" whole). */
typedef struct {
    const char *keys[10];
    int id_keys;
    const char *strings[3];
} RowSpec;

static const RowSpec row_specs[ZP_KCLASS_N] = {
    [ZP_KCLASS_GEMM] = {{"m", "n", "k", "batch", "dtype", "time_s", "count", NULL}, 5, {"dtype"}},
    [ZP_KCLASS_ATTENTION] = {{"direction", "batch", "heads", "seq", "head_dim", "time_s", "count",
                              NULL}, 5, {"direction"}},
    [ZP_KCLASS_MEMORY] = {{"op", "bytes", "time_s", "count", NULL}, 2, {"op"}},
    [ZP_KCLASS_COLLECTIVE] = {{"op", "ranks", "bytes", "time_s", "count", NULL}, 3, {"op"}},
    [ZP_KCLASS_OPTIMIZER] = {{"op", "time_s", "count", NULL}, 1, {"op"}},
};

/* The identifying keys of every class, cut from row_specs (filled on first use). */
static const char *id_keys[ZP_KCLASS_N][10];

const char *const *zp_kclass_row_keys(ZpKClass c)
{
    return row_specs[c].keys;
}

const char *const *zp_kclass_row_id_keys(ZpKClass c)
{
    if (!id_keys[c][0])
        for (int i = 0; i < row_specs[c].id_keys; i++)
            id_keys[c][i] = row_specs[c].keys[i];
    return id_keys[c];
}

static gboolean is_string_key(const RowSpec *s, const char *key)
{
    for (size_t i = 0; i < G_N_ELEMENTS(s->strings) && s->strings[i]; i++)
        if (strcmp(s->strings[i], key) == 0)
            return TRUE;
    return FALSE;
}

static gboolean row_check(json_t *row, ZpKClass c, const char *what, GError **error)
{
    const RowSpec *s = &row_specs[c];
    if (!json_is_object(row)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
        return FALSE;
    }
    if (!zp_json_check_keys(row, what, s->keys, error))
        return FALSE;
    for (int i = 0; s->keys[i]; i++) {
        const char *key = s->keys[i], *text;
        double v;
        int64_t count;
        gboolean ok = is_string_key(s, key)
                          ? zp_json_get_string(row, what, key, TRUE, &text, error)
                      : strcmp(key, "count") == 0
                          ? zp_json_get_int(row, what, key, TRUE, 1, INT64_C(1) << 40, &count,
                                            error)
                      : strcmp(key, "time_s") == 0
                          ? zp_json_get_number(row, what, key, TRUE, 1e-12, 1e6, &v, error)
                          : zp_json_get_number(row, what, key, TRUE, 1, 1e18, &v, error);
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

gboolean zp_kclass_tables_check(void *json_object, const char *what, GError **error)
{
    json_t *t = json_object;
    static const char *const keys[] = {"gemm", "attention", "memory", "collective",
                                       "optimizer", "sources", NULL};
    char *inner = g_strdup_printf("%s: kernel_tables", what);
    gboolean ok = json_is_object(t);
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", inner);
    ok = ok && zp_json_check_keys(t, inner, keys, error);
    json_t *sources = ok ? json_object_get(t, "sources") : NULL;
    if (sources && !json_is_object(sources)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"sources\" must be an object of class -> source", inner);
        ok = FALSE;
    }
    for (int c = 0; ok && c < ZP_KCLASS_N; c++) {
        json_t *rows = json_object_get(t, class_names[c]);
        if (!rows)
            continue;
        if (!json_is_array(rows)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be an array", inner,
                        class_names[c]);
            ok = FALSE;
        }
        for (size_t i = 0; ok && i < json_array_size(rows); i++) {
            char *row_what = g_strdup_printf("%s.%s[%zu]", inner, class_names[c], i);
            ok = row_check(json_array_get(rows, i), c, row_what, error);
            g_free(row_what);
        }
    }
    g_free(inner);
    return ok;
}

static gboolean same_row(json_t *a, json_t *b, ZpKClass c)
{
    for (int i = 0; i < row_specs[c].id_keys; i++) {
        const char *key = row_specs[c].keys[i];
        if (!json_equal(json_object_get(a, key), json_object_get(b, key)))
            return FALSE;
    }
    return TRUE;
}

void zp_kclass_tables_merge(void *base_object, void *update_object)
{
    json_t *base = base_object, *update = update_object;
    json_t *sources = json_object_get(base, "sources");
    if (!json_is_object(sources)) {
        sources = json_object();
        json_object_set_new(base, "sources", sources);
    }
    for (int c = 0; c < ZP_KCLASS_N; c++) {
        json_t *rows = json_object_get(update, class_names[c]);
        if (json_array_size(rows) == 0)
            continue;
        json_t *into = json_object_get(base, class_names[c]);
        if (!json_is_array(into)) {
            into = json_array();
            json_object_set_new(base, class_names[c], into);
        }
        for (size_t i = 0; i < json_array_size(rows); i++) {
            json_t *row = json_array_get(rows, i);
            size_t j = 0;
            while (j < json_array_size(into) && !same_row(json_array_get(into, j), row, c))
                j++;
            if (j < json_array_size(into))
                json_array_set(into, j, row);
            else
                json_array_append(into, row);
        }
        json_t *source = json_object_get(json_object_get(update, "sources"), class_names[c]);
        if (source)
            json_object_set(sources, class_names[c], source);
    }
}
