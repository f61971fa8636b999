/* cli_optable: fits the op-level cost table (zp_optable) from `zreal --microbench` runs and
 * measures how well it predicts the runs' own model-shaped kernels, op by op. */
#include "cli_optable.h"
#include "zp_optable.h"
#include "zp_util.h"

#include <gsl/gsl_fit.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define RESIDUAL_WARN 0.10

typedef struct {
    int which;      /* GEMM form, attention pass or elementwise class */
    double x, y;    /* grid coordinates (GEMMs and attention) */
    double z;       /* attention: log2 of the heads per sample (NAN: not recorded); else 0 */
    double batch;   /* attention: samples in the call; else 1 */
    double work;    /* FLOPs or bytes */
    double time_s;
    gboolean model; /* one of a model's own kernels ("ops"), not a sweep or grid point */
    guint run;      /* the run it came from (keep_fastest_run) */
} Sample;

typedef struct {
    GArray *launch;           /* double */
    GArray *launch_stream;    /* double: the runs that timed launch_stream_s */
    GArray *gemm, *attn, *ew; /* Sample */
    GArray *attn_kernels;     /* Sample: the model-shaped attention kernels ("kernels") */
    GArray *shapes;           /* ZpGemmShape: the model-shaped GEMMs ("gemm"), each key's least */
    GArray *adam;             /* Sample: bytes (the schedule's), time */
    GArray *contention;       /* double: with / without */
    GPtrArray *ops;           /* json_t rows of "ops", borrowed from `roots` */
    GPtrArray *roots;         /* json_t, owned */
    GPtrArray *runs;          /* base names */
    GArray *whole;            /* ZpOpTime: whole-op times, keyed by op, shape and ranks */
    GPtrArray *whole_times;   /* GArray of double per `whole` row: its time in each run */
    char backend[16];         /* the fitted runs' backend */
} Runs;

static int name_index(const char *name, const char *(*name_of)(int), int n)
{
    for (int i = 0; name && i < n; i++)
        if (strcmp(name, name_of(i)) == 0)
            return i;
    return -1;
}

static const char *form_name(int i) { return zp_gemm_form_name((ZpGemmForm)i); }
static const char *class_name(int i) { return zp_ew_class_name((ZpEwClass)i); }
static const char *pass_name(int i) { return i ? "backward" : "forward"; }
static const char *variant_name(int i)
{
    static const char *const names[ZP_GEMM_VARIANTS] = {"block", "head", "head_odd"};
    return names[i];
}

static gboolean bad(GError **error, const char *path, const char *what)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", path, what);
    return FALSE;
}

/* A sample's time and work; its kind's index from `key` through name_of. */
static gboolean sample(json_t *row, const char *path, const char *key, const char *work_key,
                       const char *(*name_of)(int), int n, Sample *s, GError **error)
{
    const char *name = NULL;
    if (!zp_json_get_string(row, path, key, TRUE, &name, error) ||
        !zp_json_get_number(row, path, work_key, TRUE, 1, 1e30, &s->work, error) ||
        !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &s->time_s, error))
        return FALSE;
    s->which = name_index(name, name_of, n);
    if (s->which < 0)
        return bad(error, path, "an op microbenchmark names an unknown form, pass or class");
    return TRUE;
}

/* An attention row's grid coordinates, heads per sample (`heads` where the row has none: 8 in
 * a grid that did not record them, NAN for a model's kernel) and batch (1 where none). */
static gboolean attention_coords(json_t *row, const char *path, double heads, Sample *s,
                                 GError **error)
{
    double seq, hd;
    s->batch = 1;
    if (!zp_json_get_number(row, path, "seq_len", TRUE, 1, 1e9, &seq, error) ||
        !zp_json_get_number(row, path, "head_dim", TRUE, 1, 1e6, &hd, error) ||
        !zp_json_get_number(row, path, "heads", FALSE, 1, 1e6, &heads, error) ||
        !zp_json_get_number(row, path, "batch", FALSE, 1, 1e9, &s->batch, error))
        return FALSE;
    s->x = log2(seq), s->y = log2(hd), s->z = log2(heads);
    return TRUE;
}

/* A device run's row kernels at a model's widths (real_microbench: rows of GPT-2's 768
 * columns, the loss over its 50,257-word vocabulary) as the samples of their elementwise
 * class, in the class's bytes (zp_ew_class_bytes_per_elem). A row kernel's rate moves with its
 * row width: the class sweeps (real_opbench) ran rows of 256 columns until 2026-11-30, on
 * which an H200 ran layer norm 1.85 times, its backward 1.52, the bias gradient 1.7 and the
 * loss 3.2 times slower than at these widths. Marked as a model's own (rate_fit fits them
 * alone where present). */
static const struct {
    const char *section, *kernel;
    ZpEwClass cls;
} row_kernels[] = {
    {"memory", "layernorm", ZP_EW_NORM_FWD},
    {"kernels", "layernorm_bwd", ZP_EW_NORM_BWD},
    {"kernels", "bias_bwd", ZP_EW_BIAS_BWD},
    {"kernels", "softmax_xent", ZP_EW_LOSS},
};

static gboolean read_row_kernels(json_t *root, const char *path, Runs *r, GError **error)
{
    if (json_array_size(json_object_get(root, "kernels")) == 0) /* a host run: its sweep */
        return TRUE;
    for (size_t k = 0; k < G_N_ELEMENTS(row_kernels); k++) {
        json_t *row;
        size_t i;
        json_array_foreach(json_object_get(root, row_kernels[k].section), i, row)
        {
            const char *name = json_string_value(json_object_get(row, "kernel"));
            Sample s = {.run = r->roots->len - 1, .which = row_kernels[k].cls, .model = TRUE};
            double elems;
            if (!name || strcmp(name, row_kernels[k].kernel) != 0)
                continue;
            if (!zp_json_get_number(row, path, "elems", TRUE, 1, 1e15, &elems, error) ||
                !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &s.time_s, error))
                return FALSE;
            s.work = elems * zp_ew_class_bytes_per_elem(row_kernels[k].cls, FALSE);
            g_array_append_val(r->ew, s);
        }
    }
    return TRUE;
}

/* The model-shaped GEMMs ("gemm": shape, form, m, n, k, time_s), each form, kind and shape's
 * least over the runs (ZpGemmShape; the LM head's are "lm_head"). */
static gboolean read_gemm_shapes(json_t *root, const char *path, Runs *r, GError **error)
{
    json_t *row;
    size_t i;
    json_array_foreach(json_object_get(root, "gemm"), i, row)
    {
        const char *shape = json_string_value(json_object_get(row, "shape"));
        const char *form = json_string_value(json_object_get(row, "form"));
        ZpGemmShape g = {.form = name_index(form, form_name, ZP_GEMM_N),
                         .head = shape && strcmp(shape, "lm_head") == 0};
        if (!shape || strcmp(shape, "square") == 0 || g.form < 0) /* the peak fit's squares */
            continue;
        if (!zp_json_get_number(row, path, "m", TRUE, 1, 1e9, &g.m, error) ||
            !zp_json_get_number(row, path, "n", TRUE, 1, 1e9, &g.n, error) ||
            !zp_json_get_number(row, path, "k", TRUE, 1, 1e9, &g.k, error) ||
            !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &g.time_s, error))
            return FALSE;
        guint at = 0;
        for (; at < r->shapes->len; at++) {
            ZpGemmShape *o = &g_array_index(r->shapes, ZpGemmShape, at);
            if (o->form == g.form && o->head == g.head && o->m == g.m && o->n == g.n &&
                o->k == g.k) {
                o->time_s = fmin(o->time_s, g.time_s);
                break;
            }
        }
        if (at == r->shapes->len) {
            if (r->shapes->len == ZP_OPTABLE_MAX_GEMM_SHAPES)
                return bad(error, path, "more model-shaped GEMMs than an op table holds");
            g_array_append_val(r->shapes, g);
        }
    }
    return TRUE;
}

static gboolean read_grid(json_t *root, const char *path, Runs *r, GError **error)
{
    if (!read_row_kernels(root, path, r, error) || !read_gemm_shapes(root, path, r, error))
        return FALSE;
    const guint run = r->roots->len - 1;
    json_t *row;
    size_t i;
    json_array_foreach(json_object_get(root, "gemm_grid"), i, row)
    {
        Sample s = {.run = run};
        const char *variant = "block";
        if (!sample(row, path, "form", "flops", form_name, ZP_GEMM_N, &s, error) ||
            !zp_json_get_number(row, path, "log2_mnk", TRUE, -1e3, 1e3, &s.x, error) ||
            !zp_json_get_number(row, path, "log2_aspect", TRUE, -1e3, 1e3, &s.y, error) ||
            !zp_json_get_string(row, path, "variant", FALSE, &variant, error))
            return FALSE;
        s.z = name_index(variant, variant_name, ZP_GEMM_VARIANTS);
        if (s.z < 0)
            return bad(error, path, "a gemm_grid row's variant is not block, head or head_odd");
        g_array_append_val(r->gemm, s);
    }
    json_array_foreach(json_object_get(root, "attention_grid"), i, row)
    {
        Sample s = {.run = run};
        if (!sample(row, path, "pass", "flops", pass_name, 2, &s, error) ||
            !attention_coords(row, path, 8, &s, error))
            return FALSE;
        g_array_append_val(r->attn, s);
    }
    json_array_foreach(json_object_get(root, "kernels"), i, row)
    {
        const char *kernel = json_string_value(json_object_get(row, "kernel"));
        Sample s = {.run = run, .which = kernel && strcmp(kernel, "attention_bwd") == 0};
        if (!kernel || (strcmp(kernel, "attention_fwd") != 0 && !s.which))
            continue;
        if (!zp_json_get_number(row, path, "flops", TRUE, 1, 1e30, &s.work, error) ||
            !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &s.time_s, error) ||
            !attention_coords(row, path, NAN, &s, error))
            return FALSE;
        g_array_append_val(r->attn_kernels, s);
    }
    json_array_foreach(json_object_get(root, "elementwise"), i, row)
    {
        Sample s = {.run = run};
        if (!sample(row, path, "class", "bytes", class_name, ZP_EW_N, &s, error))
            return FALSE;
        g_array_append_val(r->ew, s);
    }
    json_array_foreach(json_object_get(root, "memory"), i, row)
    {
        const char *kernel = json_string_value(json_object_get(row, "kernel"));
        Sample s = {.run = run};
        if (!kernel || strcmp(kernel, "adam") != 0)
            continue;
        if (!zp_json_get_number(row, path, "bytes", TRUE, 1, 1e30, &s.work, error) ||
            !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &s.time_s, error))
            return FALSE;
        g_array_append_val(r->adam, s);
    }
    return TRUE;
}

/* The run's whole-op times ("op_sequence"), keyed by op, shape and the run's rank count: every
 * run's, whatever its ranks, so that one profile holds the ops as 1, 2, ... ranks at once run
 * them (zp_cost picks the plan's). */
static gboolean read_whole_ops(json_t *root, const char *path, int ranks, Runs *r,
                               GError **error)
{
    json_t *row;
    size_t i;
    json_array_foreach(json_object_get(root, "op_sequence"), i, row)
    {
        ZpOpTime o = {.ranks = ranks};
        const char *op = NULL, *shape = NULL;
        if (!zp_json_get_string(row, path, "op", TRUE, &op, error) ||
            !zp_json_get_string(row, path, "shape", TRUE, &shape, error) ||
            !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &o.time_s, error))
            return FALSE;
        if (strlen(op) >= sizeof o.op || strlen(shape) >= sizeof o.shape)
            return bad(error, path, "an op_sequence row's op or shape is too long");
        g_strlcpy(o.op, op, sizeof o.op);
        g_strlcpy(o.shape, shape, sizeof o.shape);
        guint k = 0;
        for (; k < r->whole->len; k++) {
            ZpOpTime *w = &g_array_index(r->whole, ZpOpTime, k);
            if (w->ranks == o.ranks && strcmp(w->op, o.op) == 0 && strcmp(w->shape, o.shape) == 0)
                break;
        }
        if (k == r->whole->len) {
            g_array_append_val(r->whole, o);
            g_ptr_array_add(r->whole_times, g_array_new(FALSE, FALSE, sizeof(double)));
        }
        g_array_append_val(g_ptr_array_index(r->whole_times, k), o.time_s);
    }
    if (r->whole->len <= ZP_OPTABLE_MAX_OPS)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: more than %d whole-op times over the runs (an op table holds that many)",
                path, ZP_OPTABLE_MAX_OPS);
    return FALSE;
}

/* One run: its whole-op times; the rest skipped when it has no op microbenchmarks or another
 * rank count than `world`. */
static gboolean read_run(const char *path, int world, Runs *r, GError **error)
{
    json_t *root = zp_json_load_object(path, error);
    int64_t ranks = 0;
    double launch;
    if (!root || !zp_json_get_int(root, path, "world", TRUE, 1, 1 << 20, &ranks, error) ||
        !read_whole_ops(root, path, (int)ranks, r, error)) {
        json_decref(root);
        return FALSE;
    }
    if (ranks != world || !json_object_get(root, "gemm_grid")) {
        json_decref(root);
        return TRUE;
    }
    g_ptr_array_add(r->roots, root);
    g_ptr_array_add(r->runs, g_path_get_basename(path));
    const char *backend = json_string_value(json_object_get(root, "backend"));
    if (backend && strlen(backend) < sizeof r->backend)
        g_strlcpy(r->backend, backend, sizeof r->backend);
    if (!zp_json_get_number(root, path, "launch_s", TRUE, 0, 1, &launch, error) ||
        !read_grid(root, path, r, error))
        return FALSE;
    g_array_append_val(r->launch, launch);
    if (json_object_get(root, "launch_stream_s")) {
        if (!zp_json_get_number(root, path, "launch_stream_s", TRUE, 0, 1, &launch, error))
            return FALSE;
        g_array_append_val(r->launch_stream, launch);
    }
    json_t *c = json_object_get(root, "contention"), *ops = json_object_get(root, "ops");
    if (c) {
        double alone, with;
        if (!zp_json_get_number(c, path, "gemm_s", TRUE, 1e-12, 1e6, &alone, error) ||
            !zp_json_get_number(c, path, "gemm_with_collective_s", TRUE, 1e-12, 1e6, &with,
                                error))
            return FALSE;
        const double ratio = with / alone;
        g_array_append_val(r->contention, ratio);
    }
    json_t *row;
    size_t i;
    json_array_foreach(ops, i, row)
    {
        g_ptr_array_add(r->ops, row);
        const char *type = json_string_value(json_object_get(row, "type"));
        Sample s = {.model = TRUE, .run = r->roots->len - 1};
        if (type && strcmp(type, "elementwise") == 0) {
            if (!sample(row, path, "class", "bytes", class_name, ZP_EW_N, &s, error))
                return FALSE;
            g_array_append_val(r->ew, s);
        } else if (type && strcmp(type, "attention") == 0 &&
                   !json_is_true(json_object_get(row, "fused"))) {
            if (!zp_json_get_number(row, path, "flops", TRUE, 1, 1e30, &s.work, error) ||
                !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &s.time_s, error) ||
                !attention_coords(row, path, NAN, &s, error))
                return FALSE;
            s.which = json_is_true(json_object_get(row, "backward"));
            g_array_append_val(r->attn, s);
        }
    }
    return TRUE;
}

static double median(GArray *values)
{
    gsl_sort((double *)values->data, 1, values->len);
    return gsl_stats_median_from_sorted_data((double *)values->data, 1, values->len);
}

/* The least of the runs' times: each run's time of a thing is already its own repeats' median
 * (real_timing_median_s; an op_sequence row the mean of its calls, real_opseq), and on a
 * shared machine another process's load only ever adds time, so the fastest run is the least
 * disturbed. A median over runs still moves with the slow ones: two of three runs under load
 * give the loaded time (the collective table keeps each size's least alike, zp_colltab). */
static double least(const GArray *values)
{
    double t = INFINITY;
    for (guint i = 0; i < values->len; i++)
        t = fmin(t, g_array_index(values, double, i));
    return t;
}

static gboolean same_z(double a, double b)
{
    return a == b || (isnan(a) && isnan(b));
}

static gboolean same_point(const Sample *a, const Sample *b)
{
    return a->which == b->which && a->model == b->model && a->x == b->x && a->y == b->y &&
           same_z(a->z, b->z) && a->batch == b->batch && a->work == b->work;
}

/* Keeps, of every kind, grid point and size timed in more than one run, the samples of the run
 * that timed it fastest (least, above), and drops the other runs' (a model's kernel timed twice
 * in one run keeps both of that run). Without it, one run's slow spell lifted the grids' means
 * and pulled the rate fits, however fast the other runs were. */
static void keep_fastest_run(GArray *samples)
{
    const guint n = samples->len;
    guint *fastest = g_new(guint, n);
    for (guint i = 0; i < n; i++) {
        const Sample *s = &g_array_index(samples, Sample, i);
        double best = s->time_s;
        fastest[i] = s->run;
        for (guint j = 0; j < n; j++) {
            const Sample *o = &g_array_index(samples, Sample, j);
            if (o->time_s < best && same_point(s, o))
                best = o->time_s, fastest[i] = o->run;
        }
    }
    for (guint i = n; i-- > 0;)
        if (g_array_index(samples, Sample, i).run != fastest[i])
            g_array_remove_index(samples, i);
    g_free(fastest);
}

/* A sample of the grid at level z (GEMMs and elementwise: 0; attention: log2 heads): a grid
 * sample timed there, or a model's own kernel timed there or at heads not recorded. With one
 * level (`one_level`), every model kernel is the level's, whatever its heads: a table without
 * a heads axis takes the model's kernels as it always did. */
static gboolean in_level(const Sample *s, double z, gboolean one_level)
{
    return s->model ? one_level || isnan(s->z) || s->z == z : s->z == z;
}

/* The sorted distinct values of one coordinate (0 x, 1 y, 2 z) of the grid samples (not a
 * model's own) of kind `which` at level z (any level when `coord` is 2). */
static int axis(GArray *samples, int which, int coord, double z, double *out, int max)
{
    int n = 0;
    for (guint i = 0; i < samples->len; i++) {
        const Sample *s = &g_array_index(samples, Sample, i);
        const double v = coord == 2 ? s->z : coord ? s->y : s->x;
        int at = 0;
        if (s->which != which || s->model || (coord != 2 && s->z != z))
            continue;
        while (at < n && out[at] < v)
            at++;
        if (at < n && out[at] == v)
            continue;
        if (n == max)
            return max + 1;
        memmove(out + at + 1, out + at, (size_t)(n - at) * sizeof *out);
        out[at] = v, n++;
    }
    return n;
}

/* A grid of the rate at each point of level z (in_level; the fastest run's:
 * keep_fastest_run), net of the fixed time (work / (t - fixed), at most twice the raw rate),
 * so that fixed + work / rate gives the measured time back. A grid point a model's own kernels
 * were timed at takes their mean rate alone: those are the shapes costed. */
static gboolean grid(GArray *samples, int which, double fixed, double z, gboolean one_level,
                     const char *what, ZpGrid *g, GError **error)
{
    memset(g, 0, sizeof *g);
    g->nx = axis(samples, which, 0, z, g->x, ZP_GRID_MAX_X);
    g->ny = axis(samples, which, 1, z, g->y, ZP_GRID_MAX_Y);
    if (g->nx < 1 || g->nx > ZP_GRID_MAX_X || g->ny < 1 || g->ny > ZP_GRID_MAX_Y) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %d x %d grid points (need 1 to %d x 1 to %d)", what, g->nx, g->ny,
                    ZP_GRID_MAX_X, ZP_GRID_MAX_Y);
        return FALSE;
    }
    double count[ZP_GRID_MAX_X][ZP_GRID_MAX_Y] = {{0}};
    gboolean model[ZP_GRID_MAX_X][ZP_GRID_MAX_Y] = {{0}};
    for (int pass = 1; pass >= 0; pass--) /* the model's own samples first */
        for (guint k = 0; k < samples->len; k++) {
            const Sample *s = &g_array_index(samples, Sample, k);
            int i = 0, j = 0;
            if (s->which != which || s->model != pass || !in_level(s, z, one_level))
                continue;
            while (i < g->nx && g->x[i] != s->x)
                i++;
            while (j < g->ny && g->y[j] != s->y)
                j++;
            if (i == g->nx || j == g->ny) /* a model's kernel off the grid: only checked */
                continue;
            if (model[i][j] && !pass)
                continue;
            model[i][j] = pass;
            g->v[i][j] += s->work / fmax(s->time_s - fixed, s->time_s / 2);
            count[i][j]++;
        }
    for (int i = 0; i < g->nx; i++)
        for (int j = 0; j < g->ny; j++) {
            if (count[i][j] == 0) {
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "%s: no run measured grid point (%g, %g)%s", what, g->x[i], g->y[j],
                            one_level ? "" : " at one of its heads levels");
                return FALSE;
            }
            g->v[i][j] /= count[i][j];
        }
    return TRUE;
}

/* t = launch + work / rate over the samples of kind `which` (GSL's weighted fit through the
 * origin of t - launch against work, weights 1/t^2: relative error), and the RMS relative
 * residual. Where a model's own kernels of that kind were timed (`model` samples), they alone
 * are fitted: they are the sizes the table will cost, and a CPU's rate falls off its caches
 * between a size sweep's ends. */
static gboolean rate_fit(GArray *samples, int which, double launch, const char *what,
                         double *rate, double *rms, GError **error)
{
    GArray *x = g_array_new(FALSE, FALSE, sizeof(double)), *t = g_array_new(FALSE, FALSE, sizeof(double)),
           *w = g_array_new(FALSE, FALSE, sizeof(double)), *net = g_array_new(FALSE, FALSE, sizeof(double));
    gboolean model = FALSE;
    for (guint i = 0; i < samples->len; i++) {
        const Sample *s = &g_array_index(samples, Sample, i);
        model = model || (s->which == which && s->model);
    }
    for (guint i = 0; i < samples->len; i++) {
        const Sample *s = &g_array_index(samples, Sample, i);
        if (s->which != which || s->model != model)
            continue;
        const double wi = 1 / (s->time_s * s->time_s), ni = s->time_s - launch;
        g_array_append_val(x, s->work);
        g_array_append_val(t, s->time_s);
        g_array_append_val(w, wi);
        g_array_append_val(net, ni);
    }
    double c1 = 0, cov11, sumsq;
    gboolean ok = x->len >= 1 &&
                  gsl_fit_wmul((double *)x->data, 1, (double *)w->data, 1, (double *)net->data,
                               1, x->len, &c1, &cov11, &sumsq) == 0 &&
                  c1 > 0;
    double sum = 0;
    for (guint i = 0; ok && i < x->len; i++) {
        const double ti = g_array_index(t, double, i);
        sum += pow((launch + c1 * g_array_index(x, double, i) - ti) / ti, 2);
    }
    if (ok) {
        *rate = 1 / c1;
        *rms = sqrt(sum / x->len);
    } else {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %u samples that do not give a rate (time must grow with size); rerun "
                    "the microbenchmark", what, x->len);
    }
    g_array_unref(x), g_array_unref(t), g_array_unref(w), g_array_unref(net);
    return ok;
}

static void warn_because(const char *ops, double residual, const char *because)
{
    if (residual > RESIDUAL_WARN)
        fprintf(stderr, "zplan calibrate: warning: the op table misses %s by %.1f%% (over "
                        "%.0f%%): %s\n", ops, 100 * residual, 100 * RESIDUAL_WARN, because);
}

static void warn(const char *ops, double residual)
{
    warn_because(ops, residual, "rerun the microbenchmark on a quiet machine, or expect that "
                                "error in predictions");
}

/* A model-shaped kernel of an "ops" row as the table costs it; -1 when the table does not
 * cost it (a fused attention kernel: the profile's attention table does). */
static double predict(const ZpOpTable *t, json_t *row)
{
    const char *type = json_string_value(json_object_get(row, "type"));
    const double flops = json_number_value(json_object_get(row, "flops"));
    const double bytes = json_number_value(json_object_get(row, "bytes"));
    if (!type)
        return -1;
    if (strcmp(type, "gemm") == 0) {
        const int form = name_index(json_string_value(json_object_get(row, "form")), form_name,
                                    ZP_GEMM_N);
        const double m = json_number_value(json_object_get(row, "m"));
        const double n = json_number_value(json_object_get(row, "n"));
        const double k = json_number_value(json_object_get(row, "k"));
        const gboolean head = json_is_true(json_object_get(row, "head"));
        return form < 0 ? -1
                        : t->launch_s + flops / zp_optable_gemm_rate(t, form, head, m, n, k);
    }
    if (strcmp(type, "attention") == 0) {
        if (json_is_true(json_object_get(row, "fused")))
            return -1;
        const int pass = json_is_true(json_object_get(row, "backward"));
        const double heads = json_number_value(json_object_get(row, "heads"));
        return zp_optable_attention_s(t, pass, flops,
                                      log2(json_number_value(json_object_get(row, "seq_len"))),
                                      log2(json_number_value(json_object_get(row, "head_dim"))),
                                      heads > 0 ? log2(heads) : t->attn_log2_heads[0]);
    }
    const int c = name_index(json_string_value(json_object_get(row, "class")), class_name,
                             ZP_EW_N);
    return c < 0 ? -1 : t->launch_s + bytes / t->ew_bytes_per_s[c];
}

/* The table against the runs' model-shaped kernels: RMS relative error of the GEMMs and of
 * the attention kernels, and each compute op's relative error (its kernels summed). */
static json_t *check_ops(const ZpOpTable *t, GPtrArray *ops)
{
    double sq[2] = {0}, n[2] = {0};
    GHashTable *measured = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
    GHashTable *predicted = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
    for (guint i = 0; i < ops->len; i++) {
        json_t *row = g_ptr_array_index(ops, i);
        const char *op = json_string_value(json_object_get(row, "op"));
        const char *type = json_string_value(json_object_get(row, "type"));
        const double tm = json_number_value(json_object_get(row, "time_s"));
        const double tp = predict(t, row);
        if (!op || !type || tp < 0 || tm <= 0)
            continue;
        const int k = strcmp(type, "gemm") == 0 ? 0 : strcmp(type, "attention") == 0 ? 1 : -1;
        if (k >= 0)
            sq[k] += pow((tp - tm) / tm, 2), n[k]++;
        double *m = g_hash_table_lookup(measured, op), *p = g_hash_table_lookup(predicted, op);
        if (!m) {
            m = g_new0(double, 1), p = g_new0(double, 1);
            g_hash_table_insert(measured, (gpointer)op, m);
            g_hash_table_insert(predicted, (gpointer)op, p);
        }
        *m += tm, *p += tp;
    }
    json_t *out = json_object(), *per_op = json_object();
    if (n[0] > 0)
        json_object_set_new(out, "model_gemms_rms_rel_error", json_real(sqrt(sq[0] / n[0])));
    if (n[1] > 0)
        json_object_set_new(out, "model_attention_rms_rel_error", json_real(sqrt(sq[1] / n[1])));
    GHashTableIter it;
    gpointer key, value;
    g_hash_table_iter_init(&it, measured);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        const double m = *(double *)value, p = *(double *)g_hash_table_lookup(predicted, key);
        json_object_set_new(per_op, key, json_real((p - m) / m));
    }
    json_object_set_new(out, "ops_rel_error", per_op);
    g_hash_table_unref(measured);
    g_hash_table_unref(predicted);
    return out;
}

static void warn_checks(json_t *checks)
{
    const char *key;
    json_t *v;
    if (json_object_get(checks, "model_gemms_rms_rel_error"))
        warn("the model-shaped GEMMs (the GEMM surface between its grid points)",
             json_number_value(json_object_get(checks, "model_gemms_rms_rel_error")));
    if (json_object_get(checks, "kernels_attention_rms_rel_error"))
        warn_because("the model-shaped attention kernels of the device microbenchmark "
                     "(\"kernels\")",
                     json_number_value(json_object_get(checks, "kernels_attention_rms_rel_error")),
                     "their heads lie off the attention grid's heads levels (a run of zreal "
                     "before 2026-11-30 times 8 heads alone; rerun the microbenchmark with this "
                     "one), or the machine was busy");
    if (json_object_get(checks, "model_attention_rms_rel_error"))
        warn("the model-shaped attention kernels (eager_attention)",
             json_number_value(json_object_get(checks, "model_attention_rms_rel_error")));
    json_object_foreach(json_object_get(checks, "ops_rel_error"), key, v)
    {
        char *what = g_strdup_printf("the op %s (its kernels summed)", key);
        warn(what, fabs(json_number_value(v)));
        g_free(what);
    }
    json_object_foreach(json_object_get(checks, "elementwise_rms_rel_error"), key, v)
    {
        char *what = g_strdup_printf("the elementwise class %s", key);
        warn(what, json_number_value(v));
        g_free(what);
    }
    if (json_object_get(checks, "optimizer_rms_rel_error"))
        warn("the optimizer (Adam)",
             json_number_value(json_object_get(checks, "optimizer_rms_rel_error")));
}

/* Pairs of one attention point (pass, sequence, head dimension, heads) timed at two batches,
 * grid and model-shaped kernels alike (not a model's own): t = fixed + b t_sample gives each
 * pair's fixed time (b2 t1 - b1 t2) / (b2 - b1). Their median, at least the launch (a call
 * costs its launch); the launch where no point was timed at two batches. */
static double attention_fixed(const Runs *r, int pass, double launch)
{
    GArray *est = g_array_new(FALSE, FALSE, sizeof(double));
    const GArray *sets[] = {r->attn, r->attn_kernels};
    for (int u = 0; u < 2; u++)
        for (int v = u; v < 2; v++)
            for (guint i = 0; i < sets[u]->len; i++)
                for (guint j = u == v ? i + 1 : 0; j < sets[v]->len; j++) {
                    const Sample *a = &g_array_index(sets[u], Sample, i);
                    const Sample *b = &g_array_index(sets[v], Sample, j);
                    if (a->model || b->model || a->which != pass || b->which != pass ||
                        a->x != b->x || a->y != b->y || !same_z(a->z, b->z) ||
                        a->batch == b->batch)
                        continue;
                    const double e = (b->batch * a->time_s - a->batch * b->time_s) /
                                     (b->batch - a->batch);
                    g_array_append_val(est, e);
                }
    const double fixed = est->len ? fmax(launch, median(est)) : launch;
    g_array_unref(est);
    return fixed;
}

/* The eager-attention table: each pass's fixed time (attention_fixed), the heads levels the
 * grid was timed at (1 to ZP_ATTN_MAX_LEVELS) and a grid per level and pass; and how it
 * prices the model-shaped kernels the run also timed (checks "kernels_attention_rms_rel_error"). */
static gboolean attention_table(Runs *r, ZpOpTable *t, json_t *checks, GError **error)
{
    for (int p = 0; p < 2; p++)
        t->attn_fixed_s[p] = attention_fixed(r, p, t->launch_s);
    double z[ZP_ATTN_MAX_LEVELS + 1];
    const int n = axis(r->attn, 0, 2, 0, z, ZP_ATTN_MAX_LEVELS);
    if (n < 1 || n > ZP_ATTN_MAX_LEVELS || n != axis(r->attn, 1, 2, 0, z, ZP_ATTN_MAX_LEVELS)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "attention_grid: %d heads levels, or other levels forward and backward "
                    "(need 1 to %d, the same in both)", n, ZP_ATTN_MAX_LEVELS);
        return FALSE;
    }
    t->attn_levels = n;
    memcpy(t->attn_log2_heads, z, (size_t)n * sizeof *z);
    gboolean ok = TRUE;
    for (int l = 0; ok && l < n; l++)
        for (int p = 0; ok && p < 2; p++)
            ok = grid(r->attn, p, t->attn_fixed_s[p], z[l], n == 1, "attention_grid",
                      &t->eager_attention[l][p], error);
    double sq = 0;
    guint n_checked = 0;
    for (guint i = 0; ok && i < r->attn_kernels->len; i++) {
        const Sample *s = &g_array_index(r->attn_kernels, Sample, i);
        if (isnan(s->z)) /* heads not recorded: no level to price it at */
            continue;
        const double tp = zp_optable_attention_s(t, s->which, s->work, s->x, s->y, s->z);
        sq += pow((tp - s->time_s) / s->time_s, 2), n_checked++;
    }
    if (ok && n_checked)
        json_object_set_new(checks, "kernels_attention_rms_rel_error",
                            json_real(sqrt(sq / n_checked)));
    return ok;
}

static gboolean fit(Runs *r, ZpOpTable *t, json_t *checks, GError **error)
{
    t->n_gemm_shapes = (int)r->shapes->len;
    if (r->shapes->len)
        memcpy(t->gemm_shapes, r->shapes->data, r->shapes->len * sizeof(ZpGemmShape));
    t->launch_s = least(r->launch);
    t->launch_stream_s = r->launch_stream->len ? least(r->launch_stream) : t->launch_s;
    keep_fastest_run(r->gemm);
    keep_fastest_run(r->attn);
    keep_fastest_run(r->ew);
    keep_fastest_run(r->adam);
    gboolean ok = TRUE;
    for (int f = 0; ok && f < ZP_GEMM_N; f++) {
        char *what = g_strdup_printf("gemm_grid (%s)", form_name(f));
        ok = grid(r->gemm, f, t->launch_s, ZP_GEMM_BLOCK, TRUE, what, &t->gemm[f], error);
        g_free(what);
    }
    /* The LM head's surfaces, where the runs timed them (zreal since 2026-11-30). */
    for (guint i = 0; i < r->gemm->len; i++)
        t->has_gemm_head |= g_array_index(r->gemm, Sample, i).z != ZP_GEMM_BLOCK;
    for (int v = ZP_GEMM_HEAD; ok && t->has_gemm_head && v < ZP_GEMM_VARIANTS; v++)
        for (int f = 0; ok && f < ZP_GEMM_N; f++) {
            char *what = g_strdup_printf("gemm_grid (%s, %s)", form_name(f), variant_name(v));
            ok = grid(r->gemm, f, t->launch_s, v, TRUE, what, &t->gemm_head[v - 1][f], error);
            g_free(what);
        }
    keep_fastest_run(r->attn_kernels);
    t->has_eager_attention = r->attn->len > 0;
    ok = ok && (!t->has_eager_attention || attention_table(r, t, checks, error));
    json_t *ew = json_object();
    json_object_set_new(checks, "elementwise_rms_rel_error", ew);
    for (int c = 0; ok && c < ZP_EW_N; c++) {
        char *what = g_strdup_printf("elementwise (%s)", class_name(c));
        double rms;
        ok = rate_fit(r->ew, c, t->launch_s, what, &t->ew_bytes_per_s[c], &rms, error);
        if (ok)
            json_object_set_new(ew, class_name(c), json_real(rms));
        g_free(what);
    }
    double rms;
    ok = ok && rate_fit(r->adam, 0, t->launch_s, "memory (adam)", &t->optimizer_bytes_per_s,
                        &rms, error);
    if (ok)
        json_object_set_new(checks, "optimizer_rms_rel_error", json_real(rms));
    /* The contention stays the median over runs: a ratio of two times in one run, which load
     * can move either way (it slows the GEMM alone as well as the GEMM beside the collective). */
    t->contention = r->contention->len ? fmax(1.0, median(r->contention)) : 1.0;
    g_strlcpy(t->backend, r->backend, sizeof t->backend);
    t->n_ops = (int)r->whole->len;
    /* The fastest run's time of each op (least): this machine's speed swings by up to 2x
     * within minutes as other processes come and go, and a slow spell only adds time. */
    for (int k = 0; k < t->n_ops; k++) {
        t->ops[k] = g_array_index(r->whole, ZpOpTime, k);
        t->ops[k].time_s = least(g_ptr_array_index(r->whole_times, k));
    }
    return ok;
}

/* The copy curve (zp_optable's "copy") from every run's "copies": each size's least over the
 * runs' medians, its lower envelope (zp_colltab_curve_build); none when no run timed copies. */
static gboolean copy_curve(const Runs *r, ZpCollRow *row, GError **error)
{
    GArray *bytes = g_array_new(FALSE, FALSE, sizeof(double));
    GArray *time_s = g_array_new(FALSE, FALSE, sizeof(double));
    for (guint i = 0; i < r->roots->len; i++) {
        size_t k;
        json_t *c;
        json_array_foreach(json_object_get(g_ptr_array_index(r->roots, i), "copies"), k, c) {
            const double b = json_number_value(json_object_get(c, "bytes"));
            const double t = json_number_value(json_object_get(c, "time_s"));
            if (b >= 1 && t > 0)
                g_array_append_val(bytes, b), g_array_append_val(time_s, t);
        }
    }
    gboolean ok = TRUE;
    memset(row, 0, sizeof *row);
    if (bytes->len > 0)
        ok = zp_colltab_curve_build((const double *)bytes->data, (const double *)time_s->data,
                                    bytes->len, ZP_COLLTAB_LEAST, "copies", row, error);
    g_array_unref(bytes), g_array_unref(time_s);
    return ok;
}

/* The heads levels in words, for the table's note: "8 and 32 heads". */
static char *attention_levels_text(const ZpOpTable *t)
{
    GString *out = g_string_new(NULL);
    for (int l = 0; t->has_eager_attention && l < t->attn_levels; l++) {
        const char *sep = l == 0 ? "" : l + 1 == t->attn_levels ? " and " : ", ";
        g_string_append_printf(out, "%s%.0f", sep, exp2(t->attn_log2_heads[l]));
    }
    g_string_append(out, t->has_eager_attention ? " heads" : "none timed");
    return g_string_free(out, FALSE);
}

/* How each pass's fixed time was found, for the table's note. */
static char *attention_fixed_text(const ZpOpTable *t)
{
    if (!t->has_eager_attention)
        return g_strdup("none");
    if (t->attn_fixed_s[0] == t->launch_s && t->attn_fixed_s[1] == t->launch_s)
        return g_strdup("the launch: no point was timed at two batches");
    return g_strdup_printf("forward %.3g s, backward %.3g s: the median over the points timed "
                           "at two batches b1, b2 of (b2 t1 - b1 t2) / (b2 - b1), grid and "
                           "model-shaped kernels alike, at least the launch",
                           t->attn_fixed_s[0], t->attn_fixed_s[1]);
}

gboolean cli_optable_fit(char **paths, int n_paths, int world, void **op_costs,
                         void *calibration, void *notes, GError **error)
{
    Runs r = {.launch = g_array_new(FALSE, FALSE, sizeof(double)),
              .launch_stream = g_array_new(FALSE, FALSE, sizeof(double)),
              .gemm = g_array_new(FALSE, FALSE, sizeof(Sample)),
              .attn = g_array_new(FALSE, FALSE, sizeof(Sample)),
              .ew = g_array_new(FALSE, FALSE, sizeof(Sample)),
              .attn_kernels = g_array_new(FALSE, FALSE, sizeof(Sample)),
              .shapes = g_array_new(FALSE, FALSE, sizeof(ZpGemmShape)),
              .adam = g_array_new(FALSE, FALSE, sizeof(Sample)),
              .contention = g_array_new(FALSE, FALSE, sizeof(double)),
              .ops = g_ptr_array_new(),
              .roots = g_ptr_array_new_with_free_func((GDestroyNotify)json_decref),
              .runs = g_ptr_array_new_with_free_func(g_free),
              .whole = g_array_new(FALSE, FALSE, sizeof(ZpOpTime)),
              .whole_times = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref)};
    gboolean ok = TRUE;
    *op_costs = NULL;
    for (int i = 0; ok && i < n_paths; i++)
        ok = read_run(paths[i], world, &r, error);
    if (ok && r.roots->len > 0) {
        ZpOpTable t = {.present = TRUE};
        json_t *checks = json_object();
        g_ptr_array_add(r.runs, NULL);
        char *runs = g_strjoinv(", ", (char **)r.runs->pdata);
        g_snprintf(t.source, sizeof t.source, "zplan calibrate from %s", runs);
        ok = fit(&r, &t, checks, error) && copy_curve(&r, &t.copy, error);
        if (ok) {
            json_t *op_checks = check_ops(&t, r.ops);
            json_object_update(checks, op_checks);
            json_decref(op_checks);
            *op_costs = zp_optable_to_json(&t);
            json_object_set_new(calibration, "op_table", checks);
            warn_checks(checks);
            char *heads = attention_levels_text(&t), *fixed = attention_fixed_text(&t);
            char *note = g_strdup_printf(
                "measured on this machine and fitted by zplan calibrate from %s (%d ranks): "
                "GEMM rates at the grid points of each form's log2(m n k) x log2(aspect) grid "
                "(net of the launch); eager attention's log2(seq) x log2(head_dim) grid of one "
                "sample's rate at each heads level the runs timed (%s), net of each pass's "
                "fixed time per call (%s); "
                "each elementwise class t = c0 + bytes / rate by GSL weighted "
                "least squares (1/t^2) over its size sweep and the model's own kernels; the "
                "optimizer from Adam's runs; launch_s a one-element add timed alone, "
                "launch_stream_s one of 64 back to back (what a kernel costs in a step's "
                "stream; launch_s where no run timed it); each grid point, size "
                "and kernel the fastest run's time (each run's the median of its repeats: load "
                "only adds time); ops: each compute op "
                "timed whole inside a step's sequence of ops (real_opseq), the optimizer there "
                "at each ZeRO stage's partition (keyed by its elements), the least over runs "
                "per op, shape and ranks at once, which zp_cost takes before the sum of the "
                "op's kernels (the optimizer: before its fitted rate, linear in elements "
                "between two whole times); copy: one copy's median time at each size the "
                "runs timed it (the collectives' sizes and their shares per rank, every rank "
                "copying at once), the least over the runs, each size at most every larger "
                "size's, read for the copies around the "
                "collectives%s; contention %s",
                runs, world, heads, fixed,
                t.copy.n > 0 ? "" : " (none timed: the convert rate instead)",
                r.contention->len ? "the median ratio of a 512^3 GEMM's time while all-reduces "
                                    "of 4 MiB run to its time alone"
                                  : "1: not measured (one rank, or a device backend)");
            json_object_set_new(notes, "op_costs", json_string(note));
            g_free(note), g_free(heads), g_free(fixed);
        } else {
            json_decref(checks);
        }
        g_free(runs);
    }
    g_array_unref(r.launch), g_array_unref(r.launch_stream);
    g_array_unref(r.gemm), g_array_unref(r.attn);
    g_array_unref(r.attn_kernels), g_array_unref(r.shapes);
    g_array_unref(r.ew), g_array_unref(r.adam), g_array_unref(r.contention);
    g_ptr_array_unref(r.ops), g_ptr_array_unref(r.roots), g_ptr_array_unref(r.runs);
    g_array_unref(r.whole), g_ptr_array_unref(r.whole_times);
    return ok;
}
