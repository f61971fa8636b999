/* zp_colltab: the measured table of collective time against message size (per collective and
 * rank count), built from microbenchmark timings, read and written as JSON, and interpolated. */
#include "zp_colltab.h"
#include "zp_util.h"

#include <gsl/gsl_statistics_double.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The collectives a table has rows for, those the microbenchmark times, in ZpCollKind's order
 * (zp_sched.h's names). */
static const char *const kind_names[] = {"allreduce", "reduce_scatter", "allgather", NULL};
#define TABLE_KINDS ((int)G_N_ELEMENTS(kind_names) - 1)

/* r's "bytes" and "time_s" into row's points, checked: sizes increasing, times positive and
 * non-decreasing. */
static gboolean points_from_json(json_t *r, const char *what, ZpCollRow *row, GError **error)
{
    json_t *b = json_object_get(r, "bytes"), *t = json_object_get(r, "time_s");
    const size_t n = json_array_size(b);
    gboolean ok = json_is_array(b) && json_is_array(t) && n >= 1 &&
                  n <= ZP_COLLTAB_MAX_POINTS && json_array_size(t) == n;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *bi = json_array_get(b, i), *ti = json_array_get(t, i);
        row->bytes[i] = json_is_number(bi) ? json_number_value(bi) : 0;
        row->time_s[i] = json_is_number(ti) ? json_number_value(ti) : 0;
        ok = row->bytes[i] >= 1 && row->bytes[i] < 1e15 && row->time_s[i] > 0 &&
             row->time_s[i] < 1e6 &&
             (i == 0 || (row->bytes[i] > row->bytes[i - 1] &&
                         row->time_s[i] >= row->time_s[i - 1]));
    }
    row->n = ok ? (int)n : 0;
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: keys \"bytes\" and \"time_s\" must be arrays of 1 to %d numbers alike, "
                    "the sizes increasing and the times positive and non-decreasing",
                    what, ZP_COLLTAB_MAX_POINTS);
    return ok;
}

static gboolean row_from_json(json_t *r, const char *what, ZpCollRow *row, GError **error)
{
    static const char *const keys[] = {"op", "ranks", "bytes", "time_s", NULL};
    const char *op = NULL;
    int64_t ranks = 0;
    if (!json_is_object(r)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
        return FALSE;
    }
    char *op_key = g_strdup_printf("%s: key \"op\"", what);
    const gboolean named = zp_json_check_keys(r, what, keys, error) &&
                           zp_json_get_string(r, what, "op", TRUE, &op, error) &&
                           zp_parse_choice(op, op_key, kind_names, &row->kind, error) &&
                           zp_json_get_int(r, what, "ranks", TRUE, 2, 1 << 20, &ranks, error);
    g_free(op_key);
    if (!named)
        return FALSE;
    row->ranks = (int)ranks;
    return points_from_json(r, what, row, error);
}

gboolean zp_colltab_from_json(void *json_array, const char *what, ZpCollTable *t,
                              GError **error)
{
    json_t *a = json_array;
    memset(t, 0, sizeof *t);
    if (!json_is_array(a) || json_array_size(a) > ZP_COLLTAB_MAX_ROWS) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"collective_table\" must be an array of at most %d rows", what,
                    ZP_COLLTAB_MAX_ROWS);
        return FALSE;
    }
    for (size_t i = 0; i < json_array_size(a); i++) {
        char *inner = g_strdup_printf("%s: collective_table[%zu]", what, i);
        ZpCollRow *row = &t->rows[i];
        gboolean ok = row_from_json(json_array_get(a, i), inner, row, error);
        if (ok && zp_colltab_find(t, row->kind, row->ranks)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: a second row of %s at %d ranks",
                        inner, kind_names[row->kind], row->ranks);
            ok = FALSE;
        }
        g_free(inner);
        if (!ok)
            return FALSE;
        t->n_rows++;
    }
    return TRUE;
}

void *zp_colltab_to_json(const ZpCollTable *t)
{
    json_t *a = json_array();
    for (int i = 0; i < t->n_rows; i++) {
        const ZpCollRow *row = &t->rows[i];
        json_t *o = zp_colltab_curve_to_json(row);
        json_object_set_new(o, "op", json_string(kind_names[row->kind]));
        json_object_set_new(o, "ranks", json_integer(row->ranks));
        json_array_append_new(a, o);
    }
    return a;
}

gboolean zp_colltab_curve_from_json(void *json, const char *what, ZpCollRow *row,
                                    GError **error)
{
    static const char *const keys[] = {"bytes", "time_s", NULL};
    json_t *o = json;
    *row = (ZpCollRow){.kind = -1};
    if (!json_is_object(o)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object {bytes, time_s}", what);
        return FALSE;
    }
    return zp_json_check_keys(o, what, keys, error) && points_from_json(o, what, row, error);
}

void *zp_colltab_curve_to_json(const ZpCollRow *row)
{
    json_t *b = json_array(), *s = json_array();
    for (int j = 0; j < row->n; j++) {
        json_array_append_new(b, json_real(row->bytes[j]));
        json_array_append_new(s, json_real(row->time_s[j]));
    }
    return json_pack("{s:o, s:o}", "bytes", b, "time_s", s);
}

const ZpCollRow *zp_colltab_find(const ZpCollTable *t, int kind, int ranks)
{
    for (int i = 0; i < t->n_rows; i++)
        if (t->rows[i].kind == kind && t->rows[i].ranks == ranks)
            return &t->rows[i];
    return NULL;
}

double zp_colltab_time_s(const ZpCollRow *row, double bytes)
{
    const int last = row->n - 1;
    if (bytes <= row->bytes[0])
        return row->time_s[0];
    if (bytes >= row->bytes[last])
        return row->time_s[last] * bytes / row->bytes[last];
    int i = 0;
    while (row->bytes[i + 1] <= bytes)
        i++;
    if (bytes == row->bytes[i])
        return row->time_s[i];
    const double f = log(bytes / row->bytes[i]) / log(row->bytes[i + 1] / row->bytes[i]);
    return row->time_s[i] * pow(row->time_s[i + 1] / row->time_s[i], f);
}

/* ---- building a table from timings ---- */

typedef struct {
    double bytes, time_s;
} Timing;

static int by_bytes_then_time(const void *a, const void *b)
{
    const Timing *x = a, *y = b;
    if (x->bytes != y->bytes)
        return (x->bytes > y->bytes) - (x->bytes < y->bytes);
    return (x->time_s > y->time_s) - (x->time_s < y->time_s);
}

/* v[0..n) made non-decreasing from above: each size takes the least time of it and every
 * larger size. A collective of fewer bytes costs no more than one of more (it could send the
 * larger message's prefix), and on a shared host the noise in a timing only adds time (another
 * process's time slice; a rank that yields while it waits for a peer): the larger size's
 * timing bounds the smaller one's from above. A mean-pooled fit (pool adjacent violators) let
 * one slow timing lift its neighbours instead: tiny's all-gathers on 2 ranks, 6-30 us at 256 B
 * to 512 KB in one microbenchmark and 7.5 ms at 256 B in the next (load average 15), were all
 * pooled to 0.58 ms, and a step's seven gathers were predicted at 4.5 ms against 0.14 ms
 * measured (issue 43). */
static void lower_envelope(double *v, int n)
{
    for (int i = n - 2; i >= 0; i--)
        v[i] = MIN(v[i], v[i + 1]);
}

/* Row (kind, ranks) from the `m` timings in `timings` (sorted by size, then time): each
 * size's as `pick` says, made non-decreasing by its lower envelope. ZP_COLLTAB_LEAST: each
 * timing is already a microbenchmark run's median of its repeats (real_microbench
 * sweep_medians), so a within-run outlier is gone; between runs minutes apart the host's load
 * differs, and it only adds time: the fastest run's median is the op's own cost. On a 2-vCPU
 * host shared by eight jobs (load 10-11), two runs of tiny's reduce-scatter on 2 ranks timed
 * 2.5 ms and 56 ms at 212 KB, cpu-small's all-reduce 17 us and 20 ms at 2 KB; a median of six
 * runs at 512 KB was 11 ms against the least 1.5 ms. */
static gboolean build_row(int kind, int ranks, const char *name, Timing *timings, size_t m,
                          ZpCollPick pick, ZpCollRow *row, GError **error)
{
    *row = (ZpCollRow){.kind = kind, .ranks = ranks};
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && timings[j].bytes == timings[i].bytes)
            j++;
        if (row->n == ZP_COLLTAB_MAX_POINTS) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s was timed at more than %d sizes, more than a table holds", name,
                        ZP_COLLTAB_MAX_POINTS);
            return FALSE;
        }
        row->bytes[row->n] = timings[i].bytes;
        /* sorted by time within a size: every other double of timings[i..j) */
        row->time_s[row->n++] =
            pick == ZP_COLLTAB_LEAST
                ? timings[i].time_s
                : gsl_stats_median_from_sorted_data(&timings[i].time_s,
                                                    sizeof(Timing) / sizeof(double), j - i);
        i = j;
    }
    lower_envelope(row->time_s, row->n);
    return TRUE;
}

gboolean zp_colltab_build(const int *kind, const int *ranks, const double *bytes,
                          const double *time_s, size_t n, ZpCollPick pick, ZpCollTable *t,
                          GError **error)
{
    memset(t, 0, sizeof *t);
    Timing *timings = g_new(Timing, n ? n : 1);
    gboolean ok = TRUE;
    /* Rows in order of first appearance of each (kind, ranks). */
    for (size_t first = 0; ok && first < n; first++) {
        if (kind[first] < 0 || kind[first] >= TABLE_KINDS || ranks[first] < 2 ||
            zp_colltab_find(t, kind[first], ranks[first]))
            continue;
        if (t->n_rows == ZP_COLLTAB_MAX_ROWS) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "collectives: timings of more than %d collectives and rank counts, "
                        "more than a table holds", ZP_COLLTAB_MAX_ROWS);
            ok = FALSE;
            break;
        }
        size_t m = 0;
        for (size_t i = first; i < n; i++)
            if (kind[i] == kind[first] && ranks[i] == ranks[first])
                timings[m++] = (Timing){bytes[i], time_s[i]};
        qsort(timings, m, sizeof *timings, by_bytes_then_time);
        char *name = g_strdup_printf("collectives: %s on %d ranks", kind_names[kind[first]],
                                     ranks[first]);
        ok = build_row(kind[first], ranks[first], name, timings, m, pick, &t->rows[t->n_rows],
                       error);
        g_free(name);
        t->n_rows += ok;
    }
    g_free(timings);
    return ok;
}

gboolean zp_colltab_curve_build(const double *bytes, const double *time_s, size_t n,
                                ZpCollPick pick, const char *name, ZpCollRow *row,
                                GError **error)
{
    Timing *timings = g_new(Timing, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        timings[i] = (Timing){bytes[i], time_s[i]};
    qsort(timings, n, sizeof *timings, by_bytes_then_time);
    const gboolean ok = build_row(-1, 0, name, timings, n, pick, row, error);
    g_free(timings);
    return ok;
}
