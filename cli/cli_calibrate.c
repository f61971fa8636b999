/* cli_calibrate: `zplan calibrate MICROBENCH.json... --out PROFILE.json` fits a hwprofile of
 * the machine the microbenchmarks ran on (GEMM rate, memory bandwidth, collectives) by least
 * squares with GSL, so that zplan simulate can predict zreal on that machine. */
#include "cli.h"
#include "cli_optable.h"
#include "cli_torchtrace.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <gsl/gsl_errno.h>
#include <gsl/gsl_fit.h>
#include <gsl/gsl_multifit.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Samples from every run. Times span orders of magnitude, so every fit weights a sample by
 * 1/t^2: it minimises relative, not absolute, error. Ranks share the machine's cores, so GEMM
 * and memory rates depend on how many run at once: they are fitted from the runs with the
 * most ranks (the rank count the profile describes); collectives pool every run. */
typedef struct {
    GArray *gemm_flops, *gemm_s, *gemm_world; /* double, double, int: exact GEMMs (fp32) */
    GArray *tc_flops, *tc_s, *tc_world;       /* tensor-core GEMMs (bf16 operands) */
    GArray *mem_bytes, *mem_s, *mem_world;    /* the optimizer (Adam): double, double, int */
    GArray *ew_bytes, *ew_s, *ew_world;       /* block kernels (GELU, norm, add): same */
    GArray *coll_kind, *coll_ranks; /* int */
    GArray *coll_bytes, *coll_s;    /* double */
    int max_world;
    GPtrArray *runs;                /* file names */
    /* From runs on a device backend (their device_memory): the device's memory and what the
     * process held before its first allocation (CUDA context, cuBLAS). 0 on CPU runs. */
    double device_total_bytes, device_context_bytes;
    double host_memory_bytes; /* of the machine the runs measured (0: not recorded) */
    /* The host's CPU Adam (optimizer offload), one core per rank, and the host's cores, from
     * runs that recorded them; empty otherwise. */
    GArray *cpu_adam_bytes, *cpu_adam_s; /* double, double */
    double host_cores;
    /* The NVMe tier's swap-file reads and writes (the node's bytes, the slowest rank's time)
     * and where and how they were measured, from runs that recorded them. */
    GArray *nvme_bytes, *nvme_s; /* double, double */
    char *nvme_source;
    /* What else tells two samples of one size apart (int): the block kernel's name (its
     * g_str_hash), the NVMe sample's direction (0 write, 1 read). */
    GArray *ew_kernel, *nvme_kind;
} Samples;

/* The first sample of this run in each family (add_sample): the families' lengths before it. */
typedef struct {
    guint gemm, tc, mem, ew, cpu_adam, nvme;
} RunStart;


/* Backends whose GEMMs round their operands to bf16 (tensor cores); the others (cpu,
 * cuda-exact) compute in fp32 and give the fp32 peak. */
static gboolean tensor_core_backend(const char *backend)
{
    return strcmp(backend, "cuda") == 0;
}

static const char *const coll_names[] = {"allreduce", "reduce_scatter", "allgather"};

static gboolean same_int(const GArray *a, guint i, int v)
{
    return !a || g_array_index(a, int, i) == v;
}

/* One timing (x, t; world and tag where the family has them) onto its family, unless an earlier
 * run timed the same size (same world and tag): then the two keep the lesser time. Each run's
 * timing is already the median of its repeats, and another process's load on a shared machine
 * only adds time, so the fastest run is the least disturbed; a fit through every run's samples
 * followed a slow run as much as a quiet one (the op table and the collective table keep the
 * least alike: cli_optable, zp_colltab). `from` is the family's length before this run. */
static void add_sample(GArray *x, GArray *t, GArray *world, GArray *tag, guint from, double xv,
                       double tv, int wv, int tagv)
{
    for (guint i = 0; i < from; i++)
        if (g_array_index(x, double, i) == xv && same_int(world, i, wv) &&
            same_int(tag, i, tagv)) {
            double *ti = &g_array_index(t, double, i);
            *ti = fmin(*ti, tv);
            return;
        }
    g_array_append_val(x, xv);
    g_array_append_val(t, tv);
    if (world)
        g_array_append_val(world, wv);
    if (tag)
        g_array_append_val(tag, tagv);
}

static gboolean read_array(json_t *root, const char *path, const char *key, json_t **out,
                           GError **error)
{
    *out = json_object_get(root, key);
    if (!json_is_array(*out))
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"%s\" must be an array", path, key);
    return json_is_array(*out);
}

/* Rows of {bytes, time_s} (none when `rows` is NULL) onto `bytes` and `seconds` (add_sample:
 * this run's from `from` on, each tagged `tagv` where `tag` is given). */
static gboolean read_byte_samples(json_t *rows, const char *path, GArray *bytes,
                                  GArray *seconds, GArray *tag, int tagv, guint from,
                                  GError **error)
{
    for (size_t i = 0; i < json_array_size(rows); i++) {
        double b, t;
        json_t *row = json_array_get(rows, i);
        if (!zp_json_get_number(row, path, "bytes", TRUE, 1, 1e30, &b, error) ||
            !zp_json_get_number(row, path, "time_s", TRUE, 1e-12, 1e6, &t, error))
            return FALSE;
        add_sample(bytes, seconds, NULL, tag, from, b, t, 0, tagv);
    }
    return TRUE;
}

/* A run's "nvme" section: its write and read samples, and its source for the notes. */
static gboolean read_nvme(json_t *nvme, const char *path, Samples *s, guint from,
                          GError **error)
{
    static const char *const kinds[] = {"write", "read"};
    for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++) {
        json_t *rows;
        if (!read_array(nvme, path, kinds[k], &rows, error) ||
            !read_byte_samples(rows, path, s->nvme_bytes, s->nvme_s, s->nvme_kind, (int)k,
                               from, error))
            return FALSE;
    }
    json_t *dir = json_object_get(nvme, "path"), *direct = json_object_get(nvme, "direct");
    g_free(s->nvme_source);
    s->nvme_source = g_strdup_printf(
        "%s, %s, %" JSON_INTEGER_FORMAT " rank(s) at once",
        json_is_string(dir) ? json_string_value(dir) : "?",
        json_is_true(direct) ? "O_DIRECT"
        : json_is_string(direct) ? json_string_value(direct) : "?",
        json_integer_value(json_object_get(nvme, "ranks")));
    return TRUE;
}

static gboolean read_run(const char *path, Samples *s, GError **error)
{
    json_t *root = zp_json_load_object(path, error), *gemm, *mem, *coll;
    const char *format = NULL, *backend = NULL;
    const RunStart from = {s->gemm_s->len, s->tc_s->len, s->mem_s->len, s->ew_s->len,
                           s->cpu_adam_s->len, s->nvme_s->len};
    int64_t world;
    gboolean ok = root && zp_json_get_string(root, path, "format", TRUE, &format, error);
    if (ok && strcmp(format, "zplan-microbench-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: format \"%s\" is not zplan-microbench-1 (zreal --microbench --out)", path,
                    format);
        ok = FALSE;
    }
    ok = ok && zp_json_get_string(root, path, "backend", TRUE, &backend, error);
    ok = ok && zp_json_get_int(root, path, "world", TRUE, 1, 1 << 20, &world, error) &&
         read_array(root, path, "gemm", &gemm, error) &&
         read_array(root, path, "memory", &mem, error) &&
         read_array(root, path, "collectives", &coll, error);
    for (size_t i = 0; ok && i < json_array_size(gemm); i++) {
        double f, t;
        json_t *g = json_array_get(gemm, i);
        ok = zp_json_get_number(g, path, "flops", TRUE, 1, 1e30, &f, error) &&
             zp_json_get_number(g, path, "time_s", TRUE, 1e-12, 1e6, &t, error);
        if (!ok)
            break;
        if (tensor_core_backend(backend))
            add_sample(s->tc_flops, s->tc_s, s->tc_world, NULL, from.tc, f, t, (int)world, 0);
        else
            add_sample(s->gemm_flops, s->gemm_s, s->gemm_world, NULL, from.gemm, f, t,
                       (int)world, 0);
    }
    json_t *cpu_adam = ok ? json_object_get(root, "cpu_adam") : NULL;
    ok = ok && read_byte_samples(cpu_adam, path, s->cpu_adam_bytes, s->cpu_adam_s, NULL, 0,
                                 from.cpu_adam, error);
    json_t *nvme = ok ? json_object_get(root, "nvme") : NULL;
    if (nvme && !read_nvme(nvme, path, s, from.nvme, error))
        ok = FALSE;
    if (ok && json_object_get(root, "host_cores"))
        ok = zp_json_get_number(root, path, "host_cores", TRUE, 1, 1e6, &s->host_cores, error);
    if (ok && json_object_get(root, "host_memory_bytes"))
        ok = zp_json_get_number(root, path, "host_memory_bytes", TRUE, 1, 1e18,
                                &s->host_memory_bytes, error);
    json_t *device = ok ? json_object_get(root, "device_memory") : NULL;
    if (device)
        ok = zp_json_get_number(device, path, "total_bytes", TRUE, 1, 1e15,
                                &s->device_total_bytes, error) &&
             zp_json_get_number(device, path, "context_bytes", TRUE, 0, 1e15,
                                &s->device_context_bytes, error);
    for (size_t i = 0; ok && i < json_array_size(mem); i++) {
        double b, t;
        json_t *m = json_array_get(mem, i);
        ok = zp_json_get_number(m, path, "bytes", TRUE, 1, 1e30, &b, error) &&
             zp_json_get_number(m, path, "time_s", TRUE, 1e-12, 1e6, &t, error);
        const char *kernel = NULL;
        ok = ok && zp_json_get_string(m, path, "kernel", TRUE, &kernel, error);
        if (!ok)
            break;
        if (strcmp(kernel, "adam") == 0)
            add_sample(s->mem_bytes, s->mem_s, s->mem_world, NULL, from.mem, b, t, (int)world,
                       0);
        else
            add_sample(s->ew_bytes, s->ew_s, s->ew_world, s->ew_kernel, from.ew, b, t,
                       (int)world, (int)g_str_hash(kernel));
    }
    for (size_t i = 0; ok && i < json_array_size(coll); i++) {
        json_t *c = json_array_get(coll, i);
        const char *op = NULL;
        int64_t ranks;
        double b, t;
        int kind = -1;
        ok = zp_json_get_string(c, path, "op", TRUE, &op, error) &&
             zp_json_get_int(c, path, "ranks", TRUE, 2, 1 << 20, &ranks, error) &&
             zp_json_get_number(c, path, "bytes", TRUE, 1, 1e30, &b, error) &&
             zp_json_get_number(c, path, "time_s", TRUE, 1e-12, 1e6, &t, error);
        for (int k = 0; ok && k < 3; k++)
            if (strcmp(op, coll_names[k]) == 0)
                kind = k;
        if (ok && kind < 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown collective \"%s\"", path, op);
            ok = FALSE;
        }
        if (!ok)
            break;
        int n = (int)ranks;
        g_array_append_val(s->coll_kind, kind);
        g_array_append_val(s->coll_ranks, n);
        g_array_append_val(s->coll_bytes, b);
        g_array_append_val(s->coll_s, t);
    }
    if (ok) {
        s->max_world = MAX(s->max_world, (int)world);
        g_ptr_array_add(s->runs, g_path_get_basename(path));
    }
    json_decref(root);
    return ok;
}

/* Drops the samples of runs with fewer ranks than the most (and their tags, where given). */
static void keep_max_world(GArray *x, GArray *t, GArray *world, GArray *tag, int max_world)
{
    for (guint i = x->len; i-- > 0;)
        if (g_array_index(world, int, i) != max_world) {
            g_array_remove_index(x, i);
            g_array_remove_index(t, i);
            g_array_remove_index(world, i);
            if (tag)
                g_array_remove_index(tag, i);
        }
}

/* t = c0 + c1 x, weighted by 1/t^2 (relative error) or, with `by_time`, unweighted: the
 * block kernels run together in a fixed mix, so each should count by the time it takes,
 * not be fitted to its own rate (a fast residual add would set the rate of a slow GELU). */
static gboolean fit_line(GArray *x, GArray *t, const char *what, gboolean by_time, double *c0,
                         double *c1, GError **error)
{
    if (x->len < 2) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: need at least two samples", what);
        return FALSE;
    }
    double *w = g_new(double, x->len), cov00, cov01, cov11, chisq;
    for (guint i = 0; i < x->len; i++)
        w[i] = by_time ? 1.0 : 1.0 / pow(g_array_index(t, double, i), 2);
    const int status = gsl_fit_wlinear((double *)x->data, 1, w, 1, (double *)t->data, 1, x->len,
                                       c0, c1, &cov00, &cov01, &cov11, &chisq);
    g_free(w);
    if (status != GSL_SUCCESS) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: the fit failed: %s", what,
                    gsl_strerror(status));
        return FALSE;
    }
    if (!(*c1 > 0)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: time does not grow with size (slope %g); rerun the benchmark", what, *c1);
        return FALSE;
    }
    *c0 = fmax(*c0, 0.0);
    return TRUE;
}

/* Ring model: t = base + hop * steps + sent / bw[kind], linear in (base, hop, 1/bw[0..2]),
 * every coefficient non-negative. `alone` names the kinds whose own timings gave no
 * bandwidth, which take another kind's (fit_collectives). */
typedef struct {
    double base_s, hop_s, bytes_per_s[3];
    double rms_rel_error;
    char alone[64];
} CollFit;

#define COLL_COEFFS 5 /* base, hop, a bandwidth per kind */

static double ring_steps(int kind, int n)
{
    return (kind == 0 ? 2.0 : 1.0) * (n - 1);
}

static double ring_sent(int kind, int n, double bytes)
{
    return (kind == 0 ? 2.0 : 1.0) * (n - 1) / n * bytes;
}

/* The weighted least-squares fit (GSL, weights w) of y on the columns of X in `mask`, the
 * others held at 0: into c (all COLL_COEFFS) and *chisq; FALSE when GSL fails or a
 * coefficient comes out negative. */
static gboolean fit_subset(const gsl_matrix *X, const gsl_vector *w, const gsl_vector *y,
                           unsigned mask, double c[COLL_COEFFS], double *chisq)
{
    size_t k = 0, cols[COLL_COEFFS];
    for (size_t j = 0; j < COLL_COEFFS; j++)
        if (mask & (1u << j))
            cols[k++] = j;
    gsl_matrix *sub = gsl_matrix_alloc(X->size1, k), *cov = gsl_matrix_alloc(k, k);
    gsl_vector *cs = gsl_vector_alloc(k);
    for (size_t j = 0; j < k; j++) {
        gsl_vector_const_view col = gsl_matrix_const_column(X, cols[j]);
        gsl_matrix_set_col(sub, j, &col.vector);
    }
    gsl_multifit_linear_workspace *ws = gsl_multifit_linear_alloc(X->size1, k);
    gboolean ok = gsl_multifit_wlinear(sub, w, y, cs, cov, chisq, ws) == GSL_SUCCESS;
    memset(c, 0, COLL_COEFFS * sizeof *c);
    for (size_t j = 0; ok && j < k; j++)
        ok = (c[cols[j]] = gsl_vector_get(cs, j)) >= 0;
    gsl_multifit_linear_free(ws);
    gsl_matrix_free(sub), gsl_matrix_free(cov);
    gsl_vector_free(cs);
    return ok;
}

/* Sample i's row of the ring model's design: 1, its ring steps, its bytes sent in its kind's
 * column. */
static void coll_row(const Samples *s, guint i, double row[COLL_COEFFS])
{
    const int kind = g_array_index(s->coll_kind, int, i);
    const int ranks = g_array_index(s->coll_ranks, int, i);
    memset(row, 0, COLL_COEFFS * sizeof *row);
    row[0] = 1.0;
    row[1] = ring_steps(kind, ranks);
    row[2 + kind] = ring_sent(kind, ranks, g_array_index(s->coll_bytes, double, i));
}

/* A fit's chi-square (the sum of squared relative misses) a sample that is rounding, not a
 * better fit: an RMS relative miss of 1e-10, far below any timer's resolution. */
#define CHISQ_ROUNDING 1e-20

/* The ring model over every collective timing by non-negative least squares on the system
 * weighted by 1/t^2 (relative error): every subset of the coefficients is fitted free by
 * GSL's weighted least squares with the rest at 0, and the best fit whose coefficients are
 * all >= 0 is kept (all 0 when none beats that). That is exact (the constrained optimum is
 * the unconstrained fit on its own non-zero set, by the Karush-Kuhn-Tucker conditions, and
 * that set is one of them) and cheap for five coefficients (31 fits). */
static void collective_nnls(const Samples *s, double c[COLL_COEFFS])
{
    const size_t n = s->coll_s->len;
    gsl_matrix *X = gsl_matrix_alloc(n, COLL_COEFFS);
    gsl_vector *y = gsl_vector_alloc(n), *w = gsl_vector_alloc(n);
    double best = (double)n; /* every coefficient 0: each sample misses by all of itself */
    for (guint i = 0; i < n; i++) {
        double row[COLL_COEFFS];
        const double t = g_array_index(s->coll_s, double, i);
        coll_row(s, i, row);
        for (size_t j = 0; j < COLL_COEFFS; j++)
            gsl_matrix_set(X, i, j, row[j]);
        gsl_vector_set(y, i, t);
        gsl_vector_set(w, i, 1.0 / (t * t));
    }
    memset(c, 0, COLL_COEFFS * sizeof *c);
    /* Fewest coefficients first; a larger set replaces the best only where it fits better by
     * more than rounding (CHISQ_ROUNDING a sample): timings with no signal in the bytes (all
     * alike) fit base alone exactly, and base with a byte coefficient of 1e-25 s/B just as
     * well, the pick between them the BLAS's rounding (GSL's gslcblas kept the second,
     * OpenBLAS the first). */
    const double rounding = CHISQ_ROUNDING * (double)n;
    for (unsigned size = 1; size <= COLL_COEFFS; size++)
        for (unsigned mask = 1; mask < 1u << COLL_COEFFS; mask++) {
            double fit[COLL_COEFFS], chisq;
            if ((unsigned)__builtin_popcount(mask) == size &&
                fit_subset(X, w, y, mask, fit, &chisq) && chisq < best - rounding) {
                best = chisq;
                memcpy(c, fit, sizeof fit);
            }
        }
    gsl_matrix_free(X);
    gsl_vector_free(y), gsl_vector_free(w);
}

/* The ring model, a bandwidth per kind. Noisy timings (ranks that share busy cores: small
 * collectives as slow as large ones) get the closest non-negative model and a large residual,
 * which calibrate warns of, never a negative bandwidth. A kind whose own timings tie no time
 * to its bytes (its bandwidth coefficient 0 at the optimum: infinitely fast) takes the lowest
 * bus bandwidth fitted for a kind that has one, and a warning: bus bandwidth as nccl-tests
 * define it is one hardware figure for every collective (doc/PERFORMANCE.md), and the lowest
 * never predicts a kind measured as noise faster than one measured. Only when no kind has a
 * bandwidth is there nothing to fit, and calibrate says so. The residual is the final model's
 * RMS relative miss. */
static gboolean fit_collectives(const Samples *s, CollFit *fit, GError **error)
{
    const size_t n = s->coll_s->len;
    if (n < COLL_COEFFS) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "collectives: %zu samples, need at least %d (run the microbenchmark with "
                    "mpirun -np 2 or more)", n, COLL_COEFFS);
        return FALSE;
    }
    double c[COLL_COEFFS], slowest = 0;
    collective_nnls(s, c);
    fit->alone[0] = '\0';
    for (int k = 0; k < 3; k++) {
        slowest = fmax(slowest, c[2 + k]);
        if (c[2 + k] > 0)
            continue;
        if (fit->alone[0])
            g_strlcat(fit->alone, ", ", sizeof fit->alone);
        g_strlcat(fit->alone, coll_names[k], sizeof fit->alone);
    }
    for (int k = 0; k < 3; k++)
        c[2 + k] = c[2 + k] > 0 ? c[2 + k] : slowest;
    double sum = 0;
    for (guint i = 0; i < n; i++) {
        double row[COLL_COEFFS], t = 0;
        coll_row(s, i, row);
        for (size_t j = 0; j < COLL_COEFFS; j++)
            t += c[j] * row[j];
        sum += pow(t / g_array_index(s->coll_s, double, i) - 1, 2);
    }
    fit->base_s = c[0];
    fit->hop_s = c[1];
    fit->rms_rel_error = sqrt(sum / (double)n);
    for (int k = 0; k < 3; k++)
        fit->bytes_per_s[k] = slowest > 0 ? 1.0 / c[2 + k] : 0;
    if (slowest > 0)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "collectives: no signal: no collective's time grows with the bytes it sends "
                "(the best non-negative fit of t = base + steps x hop + bytes / bandwidth, "
                "%.0f%% off, leaves the bytes out); rerun the microbenchmark on a quieter "
                "machine", 100 * fit->rms_rel_error);
    return FALSE;
}

/* The fits whose RMS relative residual the profile's "calibration" records, and the ops each
 * concerns; above RESIDUAL_WARN a warning on stderr names them. */
#define RESIDUAL_WARN 0.10
static const struct {
    const char *key, *ops;
} fit_residuals[] = {
    {"gemm_rms_rel_error", "the GEMMs (the peak FLOP/s)"},
    {"fp32_gemm_rms_rel_error", "the fp32 GEMMs (peak_fp32_flops)"},
    {"memory_rms_rel_error", "the optimizer step, Adam (hbm_bytes_per_s)"},
    {"elementwise_rms_rel_error",
     "the block kernels, GELU, layer norm and residual add (elementwise_bytes_per_s)"},
    {"collective_rms_rel_error",
     "the collectives, all-reduce, reduce-scatter and all-gather (collective_fit)"},
};

static void warn_residuals(json_t *calibration)
{
    for (size_t i = 0; i < G_N_ELEMENTS(fit_residuals); i++) {
        json_t *v = json_object_get(calibration, fit_residuals[i].key);
        if (json_is_number(v) && json_number_value(v) > RESIDUAL_WARN)
            fprintf(stderr, "zplan calibrate: warning: the fit of %s misses its samples by "
                            "%.1f%% (RMS relative residual, over %.0f%%): its rate is uncertain; "
                            "rerun the microbenchmark on a quiet machine\n",
                    fit_residuals[i].ops, 100 * json_number_value(v), 100 * RESIDUAL_WARN);
    }
}

static double rms_rel_line(GArray *x, GArray *t, double c0, double c1)
{
    double sum = 0;
    for (guint i = 0; i < x->len; i++) {
        const double ti = g_array_index(t, double, i);
        sum += pow((c0 + c1 * g_array_index(x, double, i) - ti) / ti, 2);
    }
    return sqrt(sum / x->len);
}

/* The all-reduce bus bandwidth as nccl-tests define it (algbw x 2(n-1)/n, algbw = S / t) at
 * the largest message of the runs with the most ranks: the median over those samples. */
static double allreduce_busbw(const Samples *s, int *ranks, double *bytes)
{
    *ranks = 0, *bytes = 0;
    for (guint i = 0; i < s->coll_s->len; i++)
        if (g_array_index(s->coll_kind, int, i) == 0) {
            const int n = g_array_index(s->coll_ranks, int, i);
            const double b = g_array_index(s->coll_bytes, double, i);
            if (n > *ranks || (n == *ranks && b > *bytes))
                *ranks = n, *bytes = b;
        }
    GArray *bw = g_array_new(FALSE, FALSE, sizeof(double));
    for (guint i = 0; i < s->coll_s->len; i++)
        if (g_array_index(s->coll_kind, int, i) == 0 &&
            g_array_index(s->coll_ranks, int, i) == *ranks &&
            g_array_index(s->coll_bytes, double, i) == *bytes) {
            const double v = *bytes / g_array_index(s->coll_s, double, i) * 2 * (*ranks - 1) /
                             *ranks;
            g_array_append_val(bw, v);
        }
    gsl_sort((double *)bw->data, 1, bw->len);
    const double median = bw->len ? gsl_stats_median_from_sorted_data((double *)bw->data, 1,
                                                                      bw->len)
                                  : 0;
    g_array_unref(bw);
    return median;
}

/* What the fits gave, in the profile's terms. */
typedef struct {
    double peak_tc_flops, peak_fp32_flops; /* asymptotic GEMM rates, 1/c1 */
    double half_flops;                     /* c0/c1 of the GEMM fit that sets the curve */
    double gemm_rms, fp32_rms;
    guint gemm_n, fp32_n;
    double mem_bytes_per_s, ew_bytes_per_s;
    CollFit coll;
    double busbw_bytes_per_s, busbw_bytes; /* all-reduce, nccl-tests' definition */
    int busbw_ranks;
} Fitted;

static json_t *profile_json(const char *name, const char *gpu, const Samples *s,
                            const Fitted *f, double memory_bytes)
{
    const gboolean device = s->device_total_bytes > 0;
    char *runs = g_strjoinv(", ", (char **)s->runs->pdata);
    char *from = g_strdup_printf("fitted by zplan calibrate from %s", runs);
    json_t *bw = json_object();
    for (int k = 0; k < 3; k++)
        json_object_set_new(bw, coll_names[k], json_real(f->coll.bytes_per_s[k]));
    json_t *notes = json_object();
    const char *coll_source = device ? "the emulated communicator's device-to-device copies "
                                       "that stand in for a node's collectives"
                                     : "the collectives";
    const struct {
        const char *key;
        char *text;
    } note_rows[] = {
        {"gpu_memory_bytes", device ? g_strdup_printf("the device's memory as the driver reports it (cudaMemGetInfo total) in %s", runs)
                                    : g_strdup_printf("this machine's physical memory over its %d ranks (or --memory-bytes)", s->max_world)},
        {"peak_fp16_flops", device ? g_strdup_printf("%s: asymptotic rate 1/c1 of t = c0 + c1 F over the %u model-shaped GEMMs of the tensor-core backend (bf16 operands, fp32 accumulation; operand conversions included, as zreal pays them; each size's fastest run); fp16 taken to run at the bf16 rate, as on the datasheet", from, f->gemm_n)
                                   : g_strdup_printf("%s: asymptotic GEMM rate 1/c1 of t = c0 + c1 F over the %u GEMMs of the runs with the most ranks (each size's fastest run); the CPU backend computes in fp32 whatever the storage, so one peak serves every precision", from, f->gemm_n)},
        {"peak_bf16_flops", g_strdup("the same fitted GEMM rate")},
        {"peak_fp32_flops", device ? g_strdup_printf("%s: asymptotic rate 1/c1 over the %u GEMMs of the exact backend (fp32 operands, ZREAL_CUDA_GEMM=fp32; each size's fastest run)", from, f->fp32_n)
                                   : g_strdup("the same fitted GEMM rate")},
        {"gemm_efficiency_max", g_strdup("1: the peak is the fitted asymptotic GEMM rate itself")},
        {"gemm_half_efficiency_flops", g_strdup_printf("%s: c0/c1 of the %s GEMM fit, the GEMM size whose fixed cost equals its FLOP time", from, device ? "tensor-core" : "")},
        {"hbm_bytes_per_s", g_strdup_printf("%s: 1/slope of the Adam step's time against its bytes (%u sizes, each its fastest run)", from, s->mem_s->len)},
        {"elementwise_bytes_per_s", g_strdup_printf("%s: 1/slope of GELU, layer norm and residual add times against their bytes as the schedule counts them, unweighted so each kernel counts by its time (%u kernels and sizes, each its fastest run)", from, s->ew_s->len)},
        {"gpus_per_node", g_strdup_printf("the ranks the profile describes (%d: --ranks, or the most of any run), every rank on this one machine; compute rates come from the runs with that many ranks, which shared the cores as they will", s->max_world)},
        {"intra_node_bytes_per_s", g_strdup_printf("measured: the all-reduce bus bandwidth of %s as nccl-tests define it (algbw x 2(n-1)/n, algbw = bytes / time; nccl-tests doc/PERFORMANCE.md) at the largest message, %.0f bytes over %d ranks, the median over %s (collective_fit holds the fitted ring model the simulator uses for these collectives)", coll_source, f->busbw_bytes, f->busbw_ranks, runs)},
        {"intra_node_latency_s", g_strdup_printf("%s: per-step latency of the fitted ring model", from)},
        {"inter_node_bytes_per_s", g_strdup("one machine, no network: set to the intra-node figure")},
        {"inter_node_latency_s", g_strdup("one machine, no network: set to the intra-node figure")},
        {"host_link_bytes_per_s", device ? g_strdup("not measured by the microbenchmark (no offload is modelled from this profile): the device memory bandwidth fitted from Adam")
                                         : g_strdup("host and device memory are one: the fitted memory bandwidth")},
        {"cpu_memory_bytes", g_strdup(s->host_memory_bytes > 0 ? "the measured machine's physical memory (sysconf), as the microbenchmark recorded it" : "this machine's physical memory (sysconf)")},
        {"runtime_reserve_bytes", device ? g_strdup_printf("measured: device memory in use before the backend's first allocation (CUDA context, cuBLAS), in %s", runs)
                                         : g_strdup("0: no CUDA context on a CPU rank")},
        {"collective_fit", g_strdup_printf("%s: t = base + steps x hop + bytes sent / bus_bytes_per_s[kind] over %u timings of %s, weighted by 1/t^2, every coefficient non-negative (GSL's weighted least squares on each subset of them, the best non-negative fit kept)%s%s%s", from, s->coll_s->len, coll_source, f->coll.alone[0] ? "; the timings of " : "", f->coll.alone, f->coll.alone[0] ? " tie no time to their bytes, so they take the lowest bus bandwidth fitted for another kind" : "")},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(note_rows); i++) {
        json_object_set_new(notes, note_rows[i].key, json_string(note_rows[i].text));
        g_free(note_rows[i].text);
    }
    json_t *runs_json = json_array();
    for (guint i = 0; i < s->runs->len; i++)
        json_array_append_new(runs_json, json_string(g_ptr_array_index(s->runs, i)));
    const double phys = s->host_memory_bytes > 0
                            ? s->host_memory_bytes
                            : (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
    const double gpu_memory = memory_bytes > 0 ? memory_bytes
                              : device         ? s->device_total_bytes
                                               : phys / s->max_world;
    json_t *root = json_pack(
        "{s:s, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f,"
        " s:f, s:f, s:{s:f, s:o}, s:{s:o, s:f, s:f, s:f}, s:o}",
        "name", name, "gpu", gpu ? gpu : device ? "CUDA device" : "CPU rank (OpenBLAS)",
        "gpus_per_node", s->max_world, "gpu_memory_bytes", gpu_memory,
        "peak_fp16_flops", f->peak_tc_flops, "peak_bf16_flops", f->peak_tc_flops,
        "peak_fp32_flops", f->peak_fp32_flops, "hbm_bytes_per_s", f->mem_bytes_per_s,
        "intra_node_bytes_per_s", f->busbw_bytes_per_s, "intra_node_latency_s", f->coll.hop_s,
        "inter_node_bytes_per_s", f->busbw_bytes_per_s, "inter_node_latency_s", f->coll.hop_s,
        "host_link_bytes_per_s", f->mem_bytes_per_s, "cpu_memory_bytes", phys,
        "runtime_reserve_bytes", s->device_context_bytes, "elementwise_bytes_per_s",
        f->ew_bytes_per_s, "gemm_efficiency_max", 1.0,
        "gemm_half_efficiency_flops", f->half_flops, "collective_fit", "base_latency_s",
        f->coll.base_s, "bus_bytes_per_s", bw, "calibration", "runs", runs_json,
        "gemm_rms_rel_error", f->gemm_rms, "memory_rms_rel_error", 0.0,
        "collective_rms_rel_error", f->coll.rms_rel_error, "notes", notes);
    if (device)
        json_object_set_new(json_object_get(root, "calibration"), "fp32_gemm_rms_rel_error",
                            json_real(f->fp32_rms));
    g_free(runs);
    g_free(from);
    return root;
}

/* The GEMM fits: on a CPU the exact GEMMs give every peak; on a device the tensor-core
 * GEMMs give the fp16/bf16 peak and the efficiency curve, and exact ones the fp32 peak. */
static gboolean fit_gemms(const Samples *s, Fitted *f, GError **error)
{
    const gboolean device = s->device_total_bytes > 0;
    double c0, c1, x0, x1;
    if (!device) {
        if (!fit_line(s->gemm_flops, s->gemm_s, "gemm", FALSE, &c0, &c1, error))
            return FALSE;
        f->peak_tc_flops = f->peak_fp32_flops = 1.0 / c1;
        f->half_flops = c0 / c1;
        f->gemm_rms = rms_rel_line(s->gemm_flops, s->gemm_s, c0, c1);
        f->gemm_n = s->gemm_s->len;
        return TRUE;
    }
    if (s->tc_s->len < 2 || s->gemm_s->len < 2) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "a device profile needs a run of the tensor-core backend (cuda) and one of "
                    "the exact backend (cuda-exact, ZREAL_CUDA_GEMM=fp32) for the fp32 peak; "
                    "have %u and %u GEMMs", s->tc_s->len, s->gemm_s->len);
        return FALSE;
    }
    if (!fit_line(s->tc_flops, s->tc_s, "gemm (tensor cores)", FALSE, &c0, &c1, error) ||
        !fit_line(s->gemm_flops, s->gemm_s, "gemm (fp32)", FALSE, &x0, &x1, error))
        return FALSE;
    f->peak_tc_flops = 1.0 / c1;
    f->half_flops = c0 / c1;
    f->gemm_rms = rms_rel_line(s->tc_flops, s->tc_s, c0, c1);
    f->gemm_n = s->tc_s->len;
    f->peak_fp32_flops = 1.0 / x1;
    f->fp32_rms = rms_rel_line(s->gemm_flops, s->gemm_s, x0, x1);
    f->fp32_n = s->gemm_s->len;
    return TRUE;
}

/* The profile must load: a fit outside the loader's own bounds (runs of absurd sizes or
 * times) is refused, naming the constant, its bound and where it was fitted from (its note). */
static gboolean check_loadable(json_t *profile, GError **error)
{
    ZpHw hw;
    GError *local = NULL;
    if (zp_hw_from_json(profile, "the fitted profile", &hw, &local))
        return TRUE;
    const char *source = "";
    const char *key;
    json_t *note;
    json_object_foreach(json_object_get(profile, "notes"), key, note)
    {
        if (strstr(local->message, key)) {
            source = json_string_value(note);
            break;
        }
    }
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--out: nothing written: %s (%s)",
                local->message, source);
    g_error_free(local);
    return FALSE;
}

/* The node's NVMe rate (1/slope of the swap files' read and write times together against the
 * node's bytes: the simulator has one rate for both), with its source in the notes. */
static gboolean add_nvme(json_t *profile, const Samples *s, GError **error)
{
    if (s->nvme_bytes->len == 0)
        return TRUE;
    double c0, c1;
    if (!fit_line(s->nvme_bytes, s->nvme_s, "nvme", FALSE, &c0, &c1, error))
        return FALSE;
    json_object_set_new(profile, "nvme_bytes_per_s", json_real(1.0 / c1));
    char *note = g_strdup_printf("zreal --microbench: 1/slope of pwrite+fdatasync and pread "
                                 "times of swap files against the node's bytes, reads and "
                                 "writes together, each size's fastest run (%s)", s->nvme_source);
    json_object_set_new(json_object_get(profile, "notes"), "nvme_bytes_per_s",
                        json_string(note));
    g_free(note);
    json_object_set_new(json_object_get(profile, "calibration"), "nvme_rms_rel_error",
                        json_real(rms_rel_line(s->nvme_bytes, s->nvme_s, c0, c1)));
    return TRUE;
}

/* The host's CPU Adam rate per core (1/slope of its time against the bytes it moves, one
 * core per rank) and the host's cores, with their notes, when the runs measured them. */
static gboolean add_cpu_adam(json_t *profile, const Samples *s, GError **error)
{
    if (s->cpu_adam_bytes->len == 0 || s->host_cores <= 0)
        return TRUE;
    double c0, c1;
    if (!fit_line(s->cpu_adam_bytes, s->cpu_adam_s, "cpu adam", FALSE, &c0, &c1, error))
        return FALSE;
    json_object_set_new(profile, "cpu_adam_bytes_per_s_per_core", json_real(1.0 / c1));
    json_object_set_new(profile, "cpu_cores_per_node", json_real(s->host_cores));
    json_t *notes = json_object_get(profile, "notes");
    json_object_set_new(notes, "cpu_adam_bytes_per_s_per_core",
                        json_string("zreal --microbench: 1/slope of the vectorised CPU Adam's "
                                    "time against its bytes (30 per element), one core per rank, "
                                    "each size's fastest run"));
    json_object_set_new(notes, "cpu_cores_per_node",
                        json_string("zreal --microbench: the cores online on the machine"));
    json_object_set_new(json_object_get(profile, "calibration"), "cpu_adam_rms_rel_error",
                        json_real(rms_rel_line(s->cpu_adam_bytes, s->cpu_adam_s, c0, c1)));
    return TRUE;
}

/* "collective_table": each collective's least time over the runs at each size it was timed
 * at, per rank count, made non-decreasing by its lower envelope (zp_colltab_build), with its
 * note; the simulator reads a
 * group's collectives off it before the fitted ring. */
static gboolean add_collective_table(json_t *profile, const Samples *s, int *rows,
                                     GError **error)
{
    ZpCollTable table;
    if (!zp_colltab_build((const int *)s->coll_kind->data, (const int *)s->coll_ranks->data,
                          (const double *)s->coll_bytes->data, (const double *)s->coll_s->data,
                          s->coll_s->len, ZP_COLLTAB_LEAST, &table, error))
        return FALSE;
    *rows = table.n_rows;
    json_object_set_new(profile, "collective_table", zp_colltab_to_json(&table));
    char *runs = g_strjoinv(", ", (char **)s->runs->pdata);
    char *note = g_strdup_printf(
        "zreal --microbench (%s): each collective's time at every size it was timed at (a "
        "grid, and the sizes of the model's own collectives at ZeRO stages 0-3), the least "
        "over the runs (each a run's median of its repeats), each size at most every larger "
        "size's time (the lower envelope); per "
        "collective and rank count; read in log time against log size between sizes, at the "
        "largest's bus bandwidth beyond it",
        runs);
    json_object_set_new(json_object_get(profile, "notes"), "collective_table",
                        json_string(note));
    g_free(note);
    g_free(runs);
    return TRUE;
}

/* --name and --gpu become the profile's "name" and "gpu", which hold 1 to 63 bytes
 * (ZpHw): refused here, by flag, not once the fit is done by the profile's key. */
static gboolean check_label(const char *text, const char *flag, GError **error)
{
    if (!text || (*text && strlen(text) < sizeof ((ZpHw *)0)->name))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: '%.40s%s' must be 1 to %zu characters",
                flag, text, strlen(text) > 40 ? "..." : "", sizeof ((ZpHw *)0)->name - 1);
    return FALSE;
}

int cli_calibrate(int argc, char **argv)
{
    char *out = NULL, *name = NULL, *memory = NULL, *gpu = NULL, *ranks = NULL, *cluster = NULL;
    char **torch_traces = NULL;
    GOptionEntry entries[] = {
        {"out", 0, 0, G_OPTION_ARG_FILENAME, &out, "Write the fitted hwprofile here (required)", "FILE"},
        {"name", 0, 0, G_OPTION_ARG_STRING, &name, "Profile name (default: the file's base name)", "NAME"},
        {"memory-bytes", 0, 0, G_OPTION_ARG_STRING, &memory, "Memory per rank (default: the device's, or physical memory / ranks)", "BYTES"},
        {"ranks", 0, 0, G_OPTION_ARG_STRING, &ranks, "The rank count the profile describes: compute rates from the runs with that many ranks, collectives from every run (default: the most of any run)", "N"},
        {"gpu", 0, 0, G_OPTION_ARG_STRING, &gpu, "The device's name for the profile's \"gpu\" (default: CUDA device, or CPU rank)", "NAME"},
        {"torch-trace", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &torch_traces, "Calibrate from a PyTorch profiler trace (Kineto JSON, .json or .json.gz, record_shapes=True) instead of microbenchmarks; repeat for more ranks or steps (docs/calibrate.md)", "TRACE"},
        {"cluster", 0, 0, G_OPTION_ARG_STRING, &cluster, "With --torch-trace: the hwprofile the trace's kernel tables are merged into", "NAME|PATH.json"},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("MICROBENCH.json...");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Fits a hardware profile from `mpirun -np N zreal --microbench --out FILE` runs:\n"
        "GEMM rate and size of half efficiency, memory bandwidth, and a ring model of the\n"
        "collectives (latency per step and bus bandwidth per collective), by weighted least\n"
        "squares. Runs at two or more rank counts separate the per-step latency. On a GPU:\n"
        "`zreal --backend cuda --emulate 8 --microbench` once in each GEMM mode (default and\n"
        "ZREAL_CUDA_GEMM=fp32) gives the bf16 and fp32 peaks.\n\n"
        "With --torch-trace TRACE --cluster BASE: the kernels of a PyTorch profiler trace\n"
        "by class (GEMM by m, n, k; attention; memory-bound by bytes; NCCL collectives;\n"
        "the optimizer), their median times merged into BASE's kernel tables.");
    GError *error = NULL;
    /* GSL's default handler aborts; its errors are returned and reported here instead. */
    gsl_set_error_handler_off();
    Samples s = {g_array_new(FALSE, FALSE, sizeof(double)), g_array_new(FALSE, FALSE, sizeof(double)),
                 g_array_new(FALSE, FALSE, sizeof(int)),
                 g_array_new(FALSE, FALSE, sizeof(double)), g_array_new(FALSE, FALSE, sizeof(double)),
                 g_array_new(FALSE, FALSE, sizeof(int)),
                 g_array_new(FALSE, FALSE, sizeof(double)), g_array_new(FALSE, FALSE, sizeof(double)),
                 g_array_new(FALSE, FALSE, sizeof(int)),
                 g_array_new(FALSE, FALSE, sizeof(double)), g_array_new(FALSE, FALSE, sizeof(double)),
                 g_array_new(FALSE, FALSE, sizeof(int)),
                 g_array_new(FALSE, FALSE, sizeof(int)), g_array_new(FALSE, FALSE, sizeof(int)),
                 g_array_new(FALSE, FALSE, sizeof(double)), g_array_new(FALSE, FALSE, sizeof(double)),
                 0, g_ptr_array_new_with_free_func(g_free), 0, 0, 0,
                 g_array_new(FALSE, FALSE, sizeof(double)), g_array_new(FALSE, FALSE, sizeof(double)),
                 0, g_array_new(FALSE, FALSE, sizeof(double)),
                 g_array_new(FALSE, FALSE, sizeof(double)), NULL,
                 g_array_new(FALSE, FALSE, sizeof(int)), g_array_new(FALSE, FALSE, sizeof(int))};
    double memory_bytes = 0, mem_c0, mem_c1, ew_c0, ew_c1;
    Fitted fitted = {0};
    CollFit fit;
    gboolean ok = cli_parse_options(context, &argc, &argv, &error) &&
                  check_label(name, "--name", &error) && check_label(gpu, "--gpu", &error);
    if (ok && torch_traces) {
        if (argc > 1)
            g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "give either MICROBENCH.json files or "
                        "--torch-trace, not both ('%s')", argv[1]);
        else if (!out)
            g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "give --out FILE (see --help)");
        ok = argc <= 1 && out && cli_torch_calibrate(torch_traces, cluster, out, name, &error);
        goto done;
    }
    if (ok && cluster) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "--cluster goes with --torch-trace");
        ok = FALSE;
    }
    if (ok && (!out || argc < 2)) {
        g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE,
                    "give --out FILE and at least one MICROBENCH.json (see --help)");
        ok = FALSE;
    }
    if (ok && memory)
        ok = zp_parse_size(memory, "--memory-bytes", ZP_SIZE_BYTES, 1e6, 1e15, FALSE,
                           &memory_bytes, &error);
    ok = ok && zp_check_out_path(out, "--out", &error);
    for (int i = 1; ok && i < argc; i++)
        ok = read_run(argv[i], &s, &error);
    int world = 0;
    ok = ok && cli_int(ranks, "--ranks", 1, 1 << 20, 0, &world, &error);
    if (ok && world > 0) {
        gboolean seen = FALSE;
        for (guint i = 0; i < s.gemm_world->len; i++)
            seen = seen || g_array_index(s.gemm_world, int, i) == world;
        for (guint i = 0; i < s.tc_world->len; i++)
            seen = seen || g_array_index(s.tc_world, int, i) == world;
        if (!seen)
            g_set_error(&error, ZP_ERROR, ZP_ERROR_VALUE, "--ranks: no run has %d ranks", world);
        ok = seen;
        s.max_world = world;
    }
    if (ok) {
        keep_max_world(s.gemm_flops, s.gemm_s, s.gemm_world, NULL, s.max_world);
        keep_max_world(s.tc_flops, s.tc_s, s.tc_world, NULL, s.max_world);
        keep_max_world(s.mem_bytes, s.mem_s, s.mem_world, NULL, s.max_world);
        keep_max_world(s.ew_bytes, s.ew_s, s.ew_world, s.ew_kernel, s.max_world);
    }
    ok = ok && fit_gemms(&s, &fitted, &error) &&
         fit_line(s.mem_bytes, s.mem_s, "memory (adam)", FALSE, &mem_c0, &mem_c1, &error) &&
         fit_line(s.ew_bytes, s.ew_s, "memory (block kernels)", TRUE, &ew_c0, &ew_c1, &error) &&
         fit_collectives(&s, &fit, &error);
    if (ok) {
        g_ptr_array_add(s.runs, NULL);
        char *base = g_path_get_basename(out);
        if (g_str_has_suffix(base, ".json"))
            base[strlen(base) - 5] = '\0';
        fitted.mem_bytes_per_s = 1.0 / mem_c1;
        fitted.ew_bytes_per_s = 1.0 / ew_c1;
        fitted.coll = fit;
        fitted.busbw_bytes_per_s = allreduce_busbw(&s, &fitted.busbw_ranks, &fitted.busbw_bytes);
        json_t *profile = profile_json(name ? name : base, gpu, &s, &fitted, memory_bytes);
        void *op_costs = NULL;
        ok = cli_optable_fit(argv + 1, argc - 1, s.max_world, &op_costs,
                             json_object_get(profile, "calibration"),
                             json_object_get(profile, "notes"), &error);
        if (op_costs)
            json_object_set_new(profile, "op_costs", op_costs);
        json_object_set_new(json_object_get(profile, "calibration"), "memory_rms_rel_error",
                            json_real(rms_rel_line(s.mem_bytes, s.mem_s, mem_c0, mem_c1)));
        json_object_set_new(json_object_get(profile, "calibration"), "elementwise_rms_rel_error",
                            json_real(rms_rel_line(s.ew_bytes, s.ew_s, ew_c0, ew_c1)));
        int table_rows = 0;
        ok = ok && add_cpu_adam(profile, &s, &error) && add_nvme(profile, &s, &error) &&
             add_collective_table(profile, &s, &table_rows, &error) &&
             check_loadable(profile, &error) &&
             zp_json_write(profile, out, &error);
        if (ok)
            warn_residuals(json_object_get(profile, "calibration"));
        if (ok && fit.alone[0])
            fprintf(stderr, "zplan calibrate: warning: the %s timings tie no time to their "
                            "bytes (noise): they take the lowest bus bandwidth fitted for "
                            "another collective; rerun the microbenchmark on a quiet "
                            "machine\n", fit.alone);
        if (ok)
            printf("wrote %s: GEMM %.1f GFLOP/s (fp32 %.1f; half at %.3g FLOP), Adam %.2f GB/s, "
                   "block kernels %.2f GB/s, "
                   "collectives base %.1f us + %.2f us/step, all-reduce %.2f, reduce-scatter "
                   "%.2f, all-gather %.2f GB/s; %d collective table rows (time by size)\n",
                   out, 1e-9 * fitted.peak_tc_flops, 1e-9 * fitted.peak_fp32_flops,
                   fitted.half_flops, 1e-9 / mem_c1, 1e-9 / ew_c1, fit.base_s * 1e6,
                   fit.hop_s * 1e6, fit.bytes_per_s[0] / 1e9, fit.bytes_per_s[1] / 1e9,
                   fit.bytes_per_s[2] / 1e9, table_rows);
        json_decref(profile);
        g_free(base);
    }
done:;
    int status = ok ? 0 : cli_fail("calibrate", error);
    GArray *arrays[] = {s.gemm_flops, s.gemm_s, s.gemm_world, s.tc_flops, s.tc_s, s.tc_world,
                        s.mem_bytes, s.mem_s, s.mem_world,
                        s.ew_bytes, s.ew_s, s.ew_world, s.coll_kind, s.coll_ranks,
                        s.coll_bytes, s.coll_s, s.cpu_adam_bytes, s.cpu_adam_s,
                        s.nvme_bytes, s.nvme_s, s.ew_kernel, s.nvme_kind};
    for (size_t i = 0; i < G_N_ELEMENTS(arrays); i++)
        g_array_unref(arrays[i]);
    g_ptr_array_unref(s.runs);
    g_free(s.nvme_source);
    g_option_context_free(context);
    g_free(out), g_free(name), g_free(memory), g_free(gpu), g_free(ranks), g_free(cluster);
    g_strfreev(torch_traces);
    return status;
}
