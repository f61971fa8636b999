/* real_microbench: GEMMs shaped like the model's (fp32 activations times bf16 weights), the
 * memory-bound Adam step, and the three collectives at several sizes. */
#include "real_microbench.h"
#include "zp_util.h"

#include <jansson.h>
#include <time.h>

#define REPEATS 5

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The slowest rank's time of one call, as collectives and synchronous training see it. */
typedef gboolean (*TimedFn)(void *ctx, GError **error);

/* A device backend returns before its work is done: the timed region waits for it. */
static gboolean finished(RealBackend *be, GError **error)
{
    const char *text = NULL;
    if (!be->synchronize || be->synchronize(be, &text))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s", text);
    return FALSE;
}

static gboolean median_time(RealBackend *be, RealComm *comm, TimedFn fn, void *ctx,
                            double *median_s, GError **error)
{
    double times[REPEATS];
    if (!fn(ctx, error) || !finished(be, error)) /* warm-up: page faults, BLAS start-up */
        return FALSE;
    for (int i = 0; i < REPEATS; i++) {
        double zero = 0;
        if (!comm->allreduce_host_f64(comm, &zero, 1, error)) /* line the ranks up */
            return FALSE;
        const double t0 = zp_now_s();
        if (!fn(ctx, error) || !finished(be, error))
            return FALSE;
        double elapsed[1] = {zp_now_s() - t0};
        double *all = g_new0(double, comm->size);
        gboolean ok = comm->gather_host_f64(comm, elapsed, 1, all, error);
        times[i] = 0;
        for (int r = 0; ok && r < comm->size; r++)
            times[i] = MAX(times[i], all[r]);
        g_free(all);
        if (!ok)
            return FALSE;
    }
    qsort(times, REPEATS, sizeof times[0], compare_doubles);
    *median_s = times[REPEATS / 2];
    return TRUE;
}

typedef struct {
    RealBackend *be;
    RealComm *comm;
    int m, n, k, op;
    size_t elems;
    float *a, *c, *master, *mom, *var;
    RealBf16 *w, *grad, *param;
} Ctx;

static gboolean run_gemm(void *p, GError **error)
{
    Ctx *x = p;
    if (!x->be->gemm(x->be, false, false, x->m, x->n, x->k, 1.0f, REAL_DTYPE_F32, x->a,
                     REAL_DTYPE_BF16, x->w, 0.0f, x->c)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "gemm workspace allocation failed");
        return FALSE;
    }
    return TRUE;
}

static gboolean run_adam(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    const RealAdamHyper hyper = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .grad_scale = 1.0f, .step = 1};
    x->be->adam_step(x->be, &hyper, x->elems, x->master, x->mom, x->var, x->grad, x->param);
    return TRUE;
}

static gboolean run_collective(void *p, GError **error)
{
    Ctx *x = p;
    RealComm *c = x->comm;
    const size_t per_rank = x->elems / (size_t)c->size;
    if (x->op == 0)
        return c->allreduce_bf16(c, x->grad, x->elems, error);
    if (x->op == 1) {
        int *counts = g_new(int, c->size);
        for (int q = 0; q < c->size; q++)
            counts[q] = (int)per_rank;
        gboolean ok = c->reduce_scatter_bf16(c, x->grad, counts, error);
        g_free(counts);
        return ok;
    }
    return c->allgather_bf16(c, x->param, per_rank, x->grad, error);
}

static gboolean bench_gemms(Ctx *x, json_t *out, GError **error)
{
    static const int sizes[] = {32, 64, 128, 256, 512, 768};
    for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
        const int s = sizes[i];
        x->m = x->n = x->k = s;
        x->a = x->be->alloc(x->be, (size_t)s * s * 4, REAL_MEM_WORKSPACE);
        x->c = x->be->alloc(x->be, (size_t)s * s * 4, REAL_MEM_WORKSPACE);
        x->w = x->be->alloc(x->be, (size_t)s * s * 2, REAL_MEM_WORKSPACE);
        x->be->fill(x->be, x->a, 0, (size_t)s * s * 4);
        x->be->fill(x->be, x->w, 0, (size_t)s * s * 2);
        double t;
        gboolean ok = median_time(x->be, x->comm, run_gemm, x, &t, error);
        x->be->free(x->be, x->a), x->be->free(x->be, x->c), x->be->free(x->be, x->w);
        if (!ok)
            return FALSE;
        json_array_append_new(out, json_pack("{s:i, s:i, s:i, s:f, s:f}", "m", s, "n", s, "k",
                                             s, "flops", 2.0 * s * s * s, "time_s", t));
    }
    return TRUE;
}

/* Buffers for the Adam and collective benchmarks, the largest size. */
#define MAX_ELEMS (1u << 22)

/* The model's elementwise kernels on rows of 256 values (a hidden size's worth). */
static gboolean run_gelu(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->gelu_fwd(x->be, x->mom, x->master, x->elems);
    return TRUE;
}

static gboolean run_layernorm(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    const int cols = 256, rows = (int)(x->elems / (size_t)cols);
    x->be->layernorm_fwd(x->be, x->mom, x->var, x->var + rows, x->master, x->param,
                         x->param + cols, rows, cols);
    return TRUE;
}

static gboolean run_add(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->add(x->be, x->mom, x->master, x->var, x->elems);
    return TRUE;
}

/* Memory-bound kernels with their bytes counted as the schedule counts them, so that the
 * fitted rate means what the simulator divides by: Adam reads the gradient, reads and writes
 * master, m and v and writes the parameter (28 bytes per element); GELU and layer norm read
 * and write each element (2 x 2 bytes in the 16-bit working precision); a residual add reads
 * two and writes one (3 x 2). */
static gboolean bench_memory(Ctx *x, json_t *out, GError **error)
{
    static const size_t sizes[] = {1u << 16, 1u << 18, 1u << 20, 1u << 22};
    static const struct {
        const char *name;
        TimedFn fn;
        double bytes_per_elem;
    } kernels[] = {
        {"adam", run_adam, 28.0},
        {"gelu", run_gelu, 4.0},
        {"layernorm", run_layernorm, 4.0},
        {"add", run_add, 6.0},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(kernels); k++)
        for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
            x->elems = sizes[i];
            double t;
            if (!median_time(x->be, x->comm, kernels[k].fn, x, &t, error))
                return FALSE;
            json_array_append_new(out, json_pack("{s:s, s:I, s:f, s:f}", "kernel",
                                                 kernels[k].name, "elems", (json_int_t)x->elems,
                                                 "bytes", kernels[k].bytes_per_elem * x->elems,
                                                 "time_s", t));
        }
    return TRUE;
}

static gboolean bench_collectives(Ctx *x, json_t *out, GError **error)
{
    static const size_t sizes[] = {1u << 10, 1u << 14, 1u << 18, 1u << 21, 1u << 22};
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather"};
    for (int op = 0; op < 3 && x->comm->size > 1; op++)
        for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
            x->op = op;
            x->elems = sizes[i] / (size_t)x->comm->size * (size_t)x->comm->size;
            double t;
            if (!median_time(x->be, x->comm, run_collective, x, &t, error))
                return FALSE;
            json_array_append_new(out, json_pack("{s:s, s:i, s:f, s:f}", "op", names[op],
                                                 "ranks", x->comm->size, "bytes",
                                                 2.0 * x->elems, "time_s", t));
        }
    return TRUE;
}

gboolean real_microbench_run(RealBackend *be, RealComm *comm, const char *path, GError **error)
{
    Ctx x = {.be = be, .comm = comm};
    x.master = be->alloc(be, MAX_ELEMS * 4, REAL_MEM_MASTER);
    x.mom = be->alloc(be, MAX_ELEMS * 4, REAL_MEM_ADAM_M);
    x.var = be->alloc(be, MAX_ELEMS * 4, REAL_MEM_ADAM_V);
    x.grad = be->alloc(be, MAX_ELEMS * 2, REAL_MEM_GRADS);
    x.param = be->alloc(be, MAX_ELEMS * 2, REAL_MEM_PARAMS);
    void *bufs[] = {x.master, x.mom, x.var, x.grad, x.param};
    const size_t sizes[] = {MAX_ELEMS * 4, MAX_ELEMS * 4, MAX_ELEMS * 4, MAX_ELEMS * 2,
                            MAX_ELEMS * 2};
    for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
        be->fill(be, bufs[i], 0, sizes[i]);
    json_t *gemm = json_array(), *memory = json_array(), *coll = json_array();
    gboolean ok = bench_gemms(&x, gemm, error) && bench_memory(&x, memory, error) &&
                  bench_collectives(&x, coll, error);
    for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
        be->free(be, bufs[i]);
    json_t *root = json_pack("{s:s, s:s, s:i, s:o, s:o, s:o}", "format", "zplan-microbench-1",
                             "backend", be->name, "world", comm->size, "gemm", gemm, "memory",
                             memory, "collectives", coll);
    if (ok && comm->rank == 0)
        ok = zp_json_write(root, path, error);
    json_decref(root);
    return ok;
}
