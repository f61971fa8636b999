/* zp_optable: reads and writes a profile's op-level cost table strictly (every key known,
 * every rate positive, grid axes increasing) and interpolates its grids. */
#include "zp_optable.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static const char *const gemm_forms[ZP_GEMM_N] = {"forward", "input_grad", "weight_grad"};
static const char *const ew_names[ZP_EW_N] = {
    "norm_fwd", "norm_bwd", "act_fwd", "act_bwd", "add", "bias_fwd",
    "bias_bwd", "rope",     "convert", "loss",    "embed"};

const char *zp_gemm_form_name(ZpGemmForm form)
{
    return gemm_forms[form];
}

const char *zp_ew_class_name(ZpEwClass ew)
{
    return ew_names[ew];
}

double zp_ew_class_bytes_per_elem(ZpEwClass c, gboolean gated)
{
    static const double per[ZP_EW_N] = {[ZP_EW_NORM_FWD] = 8, [ZP_EW_NORM_BWD] = 16,
                                        [ZP_EW_ACT_FWD] = 8,  [ZP_EW_ACT_BWD] = 12,
                                        [ZP_EW_ADD] = 12,     [ZP_EW_BIAS_FWD] = 8,
                                        [ZP_EW_BIAS_BWD] = 4, [ZP_EW_ROPE] = 8,
                                        [ZP_EW_CONVERT] = 8,  [ZP_EW_LOSS] = 20,
                                        [ZP_EW_EMBED] = 8};
    if (gated && c == ZP_EW_ACT_FWD)
        return 12;
    if (gated && c == ZP_EW_ACT_BWD)
        return 20;
    return per[c];
}

/* ---- interpolation ---- */

/* The cell index i (x[i] <= v <= x[i+1]) and the fraction across it, clamped. */
static void locate(const double *axis, int n, double v, int *i, double *frac)
{
    *i = 0, *frac = 0;
    if (n < 2 || v <= axis[0])
        return;
    if (v >= axis[n - 1]) {
        *i = n - 2, *frac = 1;
        return;
    }
    while (*i < n - 2 && v > axis[*i + 1])
        (*i)++;
    *frac = (v - axis[*i]) / (axis[*i + 1] - axis[*i]);
}

double zp_grid_at(const ZpGrid *g, double x, double y)
{
    int i, j;
    double fx, fy;
    locate(g->x, g->nx, x, &i, &fx);
    locate(g->y, g->ny, y, &j, &fy);
    const int i1 = g->nx > 1 ? i + 1 : i, j1 = g->ny > 1 ? j + 1 : j;
    const double low = g->v[i][j] + fx * (g->v[i1][j] - g->v[i][j]);
    const double high = g->v[i][j1] + fx * (g->v[i1][j1] - g->v[i][j1]);
    return low + fy * (high - low);
}

double zp_optable_attention_s(const ZpOpTable *t, int backward, double flops, double log2_seq,
                              double log2_head_dim, double log2_heads)
{
    int i;
    double f;
    locate(t->attn_log2_heads, t->attn_levels, log2_heads, &i, &f);
    const int i1 = t->attn_levels > 1 ? i + 1 : i;
    const double lo = zp_grid_at(&t->eager_attention[i][backward], log2_seq, log2_head_dim);
    const double hi = zp_grid_at(&t->eager_attention[i1][backward], log2_seq, log2_head_dim);
    return t->attn_fixed_s[backward] + flops / (lo + f * (hi - lo));
}

double zp_optable_stream_saving_s(const ZpOpTable *t)
{
    return t->launch_s - t->launch_stream_s;
}

ZpGemmVariant zp_gemm_variant(gboolean head, double m, double n, double k)
{
    if (!head)
        return ZP_GEMM_BLOCK;
    return fmod(m, 8) != 0 || fmod(n, 8) != 0 || fmod(k, 8) != 0 ? ZP_GEMM_HEAD_ODD
                                                                 : ZP_GEMM_HEAD;
}

double zp_optable_gemm_rate(const ZpOpTable *t, int form, gboolean head, double m, double n,
                            double k)
{
    const ZpGemmVariant v = zp_gemm_variant(head, m, n, k);
    const ZpGrid *g = v != ZP_GEMM_BLOCK && t->has_gemm_head ? &t->gemm_head[v - 1][form]
                                                             : &t->gemm[form];
    double x, y;
    zp_gemm_coords(m, n, k, &x, &y);
    return zp_grid_at(g, x, y);
}

void zp_gemm_coords(double m, double n, double k, double *log2_mnk, double *log2_aspect)
{
    *log2_mnk = log2(m) + log2(n) + log2(k);
    *log2_aspect = log2(MAX(m, MAX(n, k)) / MIN(m, MIN(n, k)));
}

/* ---- reading ---- */

static gboolean fail(GError **error, const char *what, const char *key, const char *must)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" must be %s", what, key, must);
    return FALSE;
}

/* An array of 1 to max increasing finite numbers. */
static gboolean axis(json_t *obj, const char *what, const char *key, int max, double *out,
                     int *n, GError **error)
{
    json_t *a = json_object_get(obj, key);
    const size_t len = json_array_size(a);
    gboolean ok = json_is_array(a) && len >= 1 && len <= (size_t)max;
    for (size_t i = 0; ok && i < len; i++) {
        json_t *v = json_array_get(a, i);
        out[i] = json_is_number(v) ? json_number_value(v) : NAN;
        ok = isfinite(out[i]) && fabs(out[i]) < 1e3 && (i == 0 || out[i] > out[i - 1]);
    }
    *n = (int)len;
    if (ok)
        return TRUE;
    char *must = g_strdup_printf("an array of 1 to %d increasing numbers", max);
    fail(error, what, key, must);
    g_free(must);
    return FALSE;
}

/* A [nx][ny] array `rows` of rates in [lo, hi] into g->v; `key` names it in messages. */
static gboolean values_of(json_t *rows, const char *what, const char *key, double lo, double hi,
                          ZpGrid *g, GError **error)
{
    gboolean ok = json_is_array(rows) && json_array_size(rows) == (size_t)g->nx;
    for (int i = 0; ok && i < g->nx; i++) {
        json_t *row = json_array_get(rows, (size_t)i);
        ok = json_is_array(row) && json_array_size(row) == (size_t)g->ny;
        for (int j = 0; ok && j < g->ny; j++) {
            json_t *v = json_array_get(row, (size_t)j);
            g->v[i][j] = json_is_number(v) ? json_number_value(v) : 0;
            ok = g->v[i][j] >= lo && g->v[i][j] <= hi;
        }
    }
    if (ok)
        return TRUE;
    char *must = g_strdup_printf("%d rows of %d rates in [%g, %g]", g->nx, g->ny, lo, hi);
    fail(error, what, key, must);
    g_free(must);
    return FALSE;
}

static gboolean values(json_t *obj, const char *what, const char *key, double lo, double hi,
                       ZpGrid *g, GError **error)
{
    return values_of(json_object_get(obj, key), what, key, lo, hi, g, error);
}

/* An object with two axes and one grid of rates per name in `names`. */
static gboolean grids(json_t *obj, const char *what, const char *xkey, const char *ykey,
                      const char *const *names, int n_names, ZpGrid *out, GError **error)
{
    const char *keys[8] = {xkey, ykey};
    for (int i = 0; i < n_names; i++)
        keys[2 + i] = names[i];
    keys[2 + n_names] = NULL;
    if (!json_is_object(obj))
        return fail(error, what, "", "an object");
    ZpGrid g = {0};
    if (!zp_json_check_keys(obj, what, keys, error) ||
        !axis(obj, what, xkey, ZP_GRID_MAX_X, g.x, &g.nx, error) ||
        !axis(obj, what, ykey, ZP_GRID_MAX_Y, g.y, &g.ny, error))
        return FALSE;
    for (int i = 0; i < n_names; i++) {
        out[i] = g;
        if (!values(obj, what, names[i], 1e3, 1e18, &out[i], error))
            return FALSE;
    }
    return TRUE;
}

/* "eager_attention": the sequence and head-dimension axes, optionally a heads axis (then each
 * pass is one grid per level) and the passes' fixed times (else the launch). */
static gboolean attention_table(json_t *obj, const char *what, ZpOpTable *t, GError **error)
{
    static const char *const keys[] = {"log2_seq", "log2_head_dim", "log2_heads", "fixed_s",
                                       "forward", "backward", NULL};
    static const char *const passes[] = {"forward", "backward"};
    if (!json_is_object(obj))
        return fail(error, what, "", "an object");
    ZpGrid g = {0};
    if (!zp_json_check_keys(obj, what, keys, error) ||
        !axis(obj, what, "log2_seq", ZP_GRID_MAX_X, g.x, &g.nx, error) ||
        !axis(obj, what, "log2_head_dim", ZP_GRID_MAX_Y, g.y, &g.ny, error))
        return FALSE;
    const gboolean levels = json_object_get(obj, "log2_heads") != NULL;
    t->attn_levels = 1, t->attn_log2_heads[0] = 3;
    if (levels && !axis(obj, what, "log2_heads", ZP_ATTN_MAX_LEVELS, t->attn_log2_heads,
                        &t->attn_levels, error))
        return FALSE;
    for (int p = 0; p < 2; p++) {
        json_t *v = json_object_get(obj, passes[p]);
        if (levels && json_array_size(v) != (size_t)t->attn_levels) {
            char *must = g_strdup_printf("%d grids, one per log2_heads level", t->attn_levels);
            fail(error, what, passes[p], must);
            g_free(must);
            return FALSE;
        }
        for (int l = 0; l < t->attn_levels; l++) {
            t->eager_attention[l][p] = g;
            if (!values_of(levels ? json_array_get(v, (size_t)l) : v, what, passes[p], 1e3,
                           1e18, &t->eager_attention[l][p], error))
                return FALSE;
        }
    }
    json_t *fixed = json_object_get(obj, "fixed_s");
    t->attn_fixed_s[0] = t->attn_fixed_s[1] = t->launch_s;
    if (!fixed)
        return TRUE;
    gboolean ok = json_array_size(fixed) == 2;
    for (int p = 0; ok && p < 2; p++) {
        json_t *v = json_array_get(fixed, (size_t)p);
        t->attn_fixed_s[p] = json_is_number(v) ? json_number_value(v) : -1;
        ok = t->attn_fixed_s[p] >= 0 && t->attn_fixed_s[p] <= 1;
    }
    return ok || fail(error, what, "fixed_s", "two times in [0, 1] s (forward, backward)");
}

/* One row of an optional array of objects, read into t's i-th entry; `sub` names the array. */
typedef gboolean (*RowFn)(json_t *row, const char *sub, size_t i, ZpOpTable *t,
                          GError **error);

/* The optional array `key` of at most `max` objects (`fields` says which, for the message),
 * each read by `read`. */
static gboolean object_rows(json_t *obj, const char *what, const char *key, size_t max,
                            const char *fields, RowFn read, ZpOpTable *t, GError **error)
{
    json_t *rows = json_object_get(obj, key);
    if (!rows)
        return TRUE;
    if (!json_is_array(rows) || json_array_size(rows) > max) {
        char *must = g_strdup_printf("an array of at most %zu {%s}", max, fields);
        fail(error, what, key, must);
        g_free(must);
        return FALSE;
    }
    char *sub = g_strdup_printf("%s.%s", what, key);
    gboolean ok = TRUE;
    for (size_t i = 0; ok && i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        ok = (json_is_object(row) || fail(error, sub, "[]", "an object")) &&
             read(row, sub, i, t, error);
    }
    g_free(sub);
    return ok;
}

/* An "ops" row: a whole-op time. */
static gboolean op_time(json_t *row, const char *sub, size_t i, ZpOpTable *t, GError **error)
{
    static const char *const keys[] = {"op", "shape", "ranks", "time_s", NULL};
    ZpOpTime *o = &t->ops[i];
    const char *op = NULL, *shape = NULL;
    int64_t ranks = 0;
    gboolean ok = zp_json_check_keys(row, sub, keys, error) &&
                  zp_json_get_string(row, sub, "op", TRUE, &op, error) &&
                  zp_json_get_string(row, sub, "shape", TRUE, &shape, error) &&
                  zp_json_get_int(row, sub, "ranks", TRUE, 1, 1 << 20, &ranks, error) &&
                  zp_json_get_number(row, sub, "time_s", TRUE, 1e-12, 1e6, &o->time_s, error);
    if (ok && (strlen(op) >= sizeof o->op || strlen(shape) >= sizeof o->shape))
        ok = fail(error, sub, "op", "a known op name with a shape under 160 characters");
    if (ok) {
        g_strlcpy(o->op, op, sizeof o->op);
        g_strlcpy(o->shape, shape, sizeof o->shape);
        o->ranks = (int)ranks;
        t->n_ops = (int)i + 1;
    }
    return ok;
}

/* A "gemm_shapes" row: one GEMM timed at its exact shape. */
static gboolean gemm_shape(json_t *row, const char *sub, size_t i, ZpOpTable *t,
                           GError **error)
{
    static const char *const keys[] = {"form", "head", "m", "n", "k", "time_s", NULL};
    ZpGemmShape *g = &t->gemm_shapes[i];
    const char *form = NULL;
    gboolean ok = zp_json_check_keys(row, sub, keys, error) &&
                  zp_json_get_string(row, sub, "form", TRUE, &form, error) &&
                  zp_json_get_bool(row, sub, "head", TRUE, &g->head, error) &&
                  zp_json_get_number(row, sub, "m", TRUE, 1, 1e9, &g->m, error) &&
                  zp_json_get_number(row, sub, "n", TRUE, 1, 1e9, &g->n, error) &&
                  zp_json_get_number(row, sub, "k", TRUE, 1, 1e9, &g->k, error) &&
                  zp_json_get_number(row, sub, "time_s", TRUE, 1e-12, 1e6, &g->time_s, error);
    g->form = -1;
    for (int f = 0; ok && f < ZP_GEMM_N; f++)
        if (strcmp(form, gemm_forms[f]) == 0)
            g->form = f;
    if (ok && g->form < 0)
        ok = fail(error, sub, "form", "forward, input_grad or weight_grad");
    if (ok)
        t->n_gemm_shapes = (int)i + 1;
    return ok;
}

const ZpGemmShape *zp_optable_gemm_shape(const ZpOpTable *t, int form, gboolean head, double m,
                                         double n, double k)
{
    for (int i = 0; i < t->n_gemm_shapes; i++) {
        const ZpGemmShape *g = &t->gemm_shapes[i];
        if (g->form == form && g->head == head && g->m == m && g->n == n && g->k == k)
            return g;
    }
    return NULL;
}

const ZpOpTime *zp_optable_op(const ZpOpTable *t, const char *op, const char *shape, int ranks)
{
    for (int i = 0; i < t->n_ops; i++)
        if (t->ops[i].ranks == ranks && strcmp(t->ops[i].op, op) == 0 &&
            strcmp(t->ops[i].shape, shape) == 0)
            return &t->ops[i];
    return NULL;
}

gboolean zp_optable_from_json(void *json, const char *what, ZpOpTable *t, GError **error)
{
    static const char *const keys[] = {"source", "launch_s", "launch_stream_s", "gemm",
                                       "gemm_head", "gemm_head_odd", "gemm_shapes",
                                       "eager_attention",
                                       "elementwise_bytes_per_s", "optimizer_bytes_per_s",
                                       "contention", "ops", "backend", "copy", NULL};
    json_t *obj = json;
    memset(t, 0, sizeof *t);
    t->contention = 1;
    char *inner = g_strdup_printf("%s: op_costs", what);
    const char *source = NULL;
    gboolean ok = json_is_object(obj) || fail(error, what, "op_costs", "an object");
    ok = ok && zp_json_check_keys(obj, inner, keys, error) &&
         zp_json_get_string(obj, inner, "source", TRUE, &source, error) &&
         zp_json_get_number(obj, inner, "launch_s", TRUE, 0, 1, &t->launch_s, error) &&
         zp_json_get_number(obj, inner, "optimizer_bytes_per_s", TRUE, 1e6, 1e15,
                            &t->optimizer_bytes_per_s, error) &&
         zp_json_get_number(obj, inner, "contention", FALSE, 1, 100, &t->contention, error);
    t->launch_stream_s = t->launch_s;
    ok = ok && zp_json_get_number(obj, inner, "launch_stream_s", FALSE, 0, 1, &t->launch_stream_s,
                                  error);
    const char *backend = "";
    ok = ok && zp_json_get_string(obj, inner, "backend", FALSE, &backend, error);
    if (ok && strlen(backend) >= sizeof t->backend)
        ok = fail(error, inner, "backend", "a backend's name (\"cpu\", \"cuda\")");
    if (ok) {
        g_strlcpy(t->source, source, sizeof t->source);
        g_strlcpy(t->backend, backend ? backend : "", sizeof t->backend);
    }
    char *sub = g_strdup_printf("%s.gemm", inner);
    ok = ok && grids(json_object_get(obj, "gemm"), sub, "log2_mnk", "log2_aspect", gemm_forms,
                     ZP_GEMM_N, t->gemm, error);
    g_free(sub);
    static const char *const head_keys[] = {"gemm_head", "gemm_head_odd"};
    t->has_gemm_head = json_object_get(obj, head_keys[0]) || json_object_get(obj, head_keys[1]);
    for (int v = 0; ok && t->has_gemm_head && v < 2; v++) {
        sub = g_strdup_printf("%s.%s", inner, head_keys[v]);
        ok = grids(json_object_get(obj, head_keys[v]), sub, "log2_mnk", "log2_aspect",
                   gemm_forms, ZP_GEMM_N, t->gemm_head[v], error);
        g_free(sub);
    }
    json_t *attn = json_object_get(obj, "eager_attention");
    sub = g_strdup_printf("%s.eager_attention", inner);
    if (ok && attn)
        ok = t->has_eager_attention = attention_table(attn, sub, t, error);
    g_free(sub);
    json_t *ew = json_object_get(obj, "elementwise_bytes_per_s");
    sub = g_strdup_printf("%s.elementwise_bytes_per_s", inner);
    if (ok && !json_is_object(ew))
        ok = fail(error, inner, "elementwise_bytes_per_s", "an object of op class -> bytes/s");
    const char *ew_keys[ZP_EW_N + 1] = {NULL};
    memcpy(ew_keys, ew_names, sizeof ew_names);
    ok = ok && zp_json_check_keys(ew, sub, ew_keys, error);
    for (int c = 0; ok && c < ZP_EW_N; c++)
        ok = zp_json_get_number(ew, sub, ew_names[c], TRUE, 1e6, 1e15, &t->ew_bytes_per_s[c],
                                error);
    g_free(sub);
    ok = ok &&
         object_rows(obj, inner, "ops", ZP_OPTABLE_MAX_OPS, "op, shape, ranks, time_s", op_time,
                     t, error) &&
         object_rows(obj, inner, "gemm_shapes", ZP_OPTABLE_MAX_GEMM_SHAPES,
                     "form, head, m, n, k, time_s", gemm_shape, t, error);
    json_t *copy = json_object_get(obj, "copy");
    sub = g_strdup_printf("%s.copy", inner);
    ok = ok && (!copy || zp_colltab_curve_from_json(copy, sub, &t->copy, error));
    g_free(sub);
    g_free(inner);
    t->present = ok;
    return ok;
}

/* ---- writing ---- */

static json_t *numbers(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

static json_t *grids_json(const char *xkey, const char *ykey, const char *const *names,
                          int n_names, const ZpGrid *g)
{
    json_t *o = json_pack("{s:o, s:o}", xkey, numbers(g[0].x, g[0].nx), ykey,
                          numbers(g[0].y, g[0].ny));
    for (int k = 0; k < n_names; k++) {
        json_t *rows = json_array();
        for (int i = 0; i < g[k].nx; i++)
            json_array_append_new(rows, numbers(g[k].v[i], g[k].ny));
        json_object_set_new(o, names[k], rows);
    }
    return o;
}

void *zp_optable_to_json(const ZpOpTable *t)
{
    static const char *const passes[] = {"forward", "backward"};
    json_t *ew = json_object();
    for (int c = 0; c < ZP_EW_N; c++)
        json_object_set_new(ew, ew_names[c], json_real(t->ew_bytes_per_s[c]));
    json_t *o = json_pack("{s:s, s:f, s:o, s:o, s:f, s:f}", "source", t->source, "launch_s",
                          t->launch_s, "gemm",
                          grids_json("log2_mnk", "log2_aspect", gemm_forms, ZP_GEMM_N, t->gemm),
                          "elementwise_bytes_per_s", ew, "optimizer_bytes_per_s",
                          t->optimizer_bytes_per_s, "contention", t->contention);
    if (t->has_gemm_head) {
        json_object_set_new(o, "gemm_head", grids_json("log2_mnk", "log2_aspect", gemm_forms,
                                                       ZP_GEMM_N, t->gemm_head[0]));
        json_object_set_new(o, "gemm_head_odd", grids_json("log2_mnk", "log2_aspect",
                                                           gemm_forms, ZP_GEMM_N,
                                                           t->gemm_head[1]));
    }
    if (t->has_eager_attention) {
        json_t *a = grids_json("log2_seq", "log2_head_dim", passes, 2, t->eager_attention[0]);
        json_object_set_new(a, "log2_heads", numbers(t->attn_log2_heads, t->attn_levels));
        json_object_set_new(a, "fixed_s", numbers(t->attn_fixed_s, 2));
        for (int p = 0; p < 2; p++) {
            json_t *levels = json_array();
            for (int l = 0; l < t->attn_levels; l++) {
                json_t *one = grids_json("x", "y", passes + p, 1, &t->eager_attention[l][p]);
                json_array_append(levels, json_object_get(one, passes[p]));
                json_decref(one);
            }
            json_object_set_new(a, passes[p], levels);
        }
        json_object_set_new(o, "eager_attention", a);
    }
    json_object_set_new(o, "launch_stream_s", json_real(t->launch_stream_s));
    if (t->backend[0])
        json_object_set_new(o, "backend", json_string(t->backend));
    if (t->n_ops > 0) {
        json_t *ops = json_array();
        for (int i = 0; i < t->n_ops; i++)
            json_array_append_new(ops, json_pack("{s:s, s:s, s:i, s:f}", "op", t->ops[i].op,
                                                 "shape", t->ops[i].shape, "ranks",
                                                 t->ops[i].ranks, "time_s",
                                                 t->ops[i].time_s));
        json_object_set_new(o, "ops", ops);
    }
    if (t->n_gemm_shapes > 0) {
        json_t *rows = json_array();
        for (int i = 0; i < t->n_gemm_shapes; i++) {
            const ZpGemmShape *g = &t->gemm_shapes[i];
            json_array_append_new(rows, json_pack("{s:s, s:b, s:f, s:f, s:f, s:f}", "form",
                                                  gemm_forms[g->form], "head", g->head, "m",
                                                  g->m, "n", g->n, "k", g->k, "time_s",
                                                  g->time_s));
        }
        json_object_set_new(o, "gemm_shapes", rows);
    }
    if (t->copy.n > 0)
        json_object_set_new(o, "copy", zp_colltab_curve_to_json(&t->copy));
    return o;
}
