/* real_microbench: times, on this backend and communicator, what the simulator's cost model has
 * constants for (GEMMs, Adam, the block's elementwise kernels, collectives) for `zplan
 * calibrate` to fit, and on a device backend every other kernel of a step, model-shaped. */
#include "real_microbench.h"
#include "real_nvme.h"
#include "real_offload.h"
#include "real_opbench.h"
#include "real_timing.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <unistd.h>

#define REPEATS REAL_TIMING_REPEATS

typedef RealTimedFn TimedFn;

/* The median of REPEATS calls after one warm-up call (page faults, library start-up). */
static gboolean median_time(RealBackend *be, RealComm *comm, TimedFn fn, void *ctx,
                            double *median_s, GError **error)
{
    return real_timing_median_s(be, comm, fn, ctx, REPEATS, median_s, error);
}

/* The sizes a backend is measured at: small on a CPU rank (whose GEMMs run at a few hundred
 * GFLOP/s), model-sized on a device. */
typedef struct {
    const int *gemm_squares;      /* CPU: square GEMMs */
    size_t n_gemm_squares;
    const int *hiddens, *tokens;  /* device: GPT-2 shaped GEMMs, hidden x tokens */
    size_t n_hiddens, n_tokens;
    const size_t *elems;          /* elementwise kernels and Adam */
    size_t n_elems;
    const size_t *coll_elems;     /* collectives, whole-buffer elements */
    size_t n_coll_elems;
} Sizes;

static const int cpu_squares[] = {32, 64, 128, 256, 512, 768};
static const size_t cpu_elems[] = {1u << 16, 1u << 18, 1u << 20, 1u << 22};
/* Collectives to 32 MiB (bf16): on a loaded CPU an 8 MiB one takes about as long as a waiting
 * rank's lost time slice (a few ms), the largest several times that, so that the fitted
 * bandwidths stand above that noise. */
static const size_t cpu_coll[] = {1u << 10, 1u << 14, 1u << 18, 1u << 21, 1u << 22, 1u << 24};
/* GPT-2 124M and 1.5B hidden sizes; micro-batches 1, 4 and 16 of 1,024 tokens. */
static const int device_hiddens[] = {768, 1600};
static const int device_tokens[] = {1024, 4096, 16384};
static const size_t device_elems[] = {1u << 20, 1u << 22, 1u << 24, 1u << 26};
static const size_t device_coll[] = {1u << 16, 1u << 20, 1u << 22, 1u << 24, 1u << 26};

static const Sizes cpu_sizes = {cpu_squares, G_N_ELEMENTS(cpu_squares), NULL, NULL, 0, 0,
                                cpu_elems, G_N_ELEMENTS(cpu_elems), cpu_coll,
                                G_N_ELEMENTS(cpu_coll)};
static const Sizes device_sizes = {NULL, 0, device_hiddens, device_tokens,
                                   G_N_ELEMENTS(device_hiddens), G_N_ELEMENTS(device_tokens),
                                   device_elems, G_N_ELEMENTS(device_elems), device_coll,
                                   G_N_ELEMENTS(device_coll)};

#define GPT2_VOCAB 50257
#define HEAD_DIM 64
#define SEQ_LEN 1024

typedef struct {
    RealBackend *be;
    RealComm *comm;
    GRand *rand;
    /* GEMM: c[m,n] = op(a) op(b), a and b in their dtypes */
    int m, n, k;
    bool trans_a, trans_b;
    RealDType a_dtype, b_dtype;
    float beta;
    void *a, *b;
    float *c;
    /* elementwise and Adam: n_elems over the buffers below; rows x cols for row kernels */
    size_t elems;
    int rows, cols, batch, heads;
    int op;
    float *f[4];       /* fp32 buffers */
    RealBf16 *h[2];    /* bf16 buffers */
    int *targets;      /* host */
} Ctx;

/* Random values in [-1, 1) (or [0, 1) when `positive`) into dst, uploaded through the
 * backend: timing zeros can flatter a kernel (and hides unwritten outputs). */
static void fill_random(Ctx *x, void *dst, RealDType dtype, size_t elems, gboolean positive)
{
    const size_t chunk = MIN(elems, (size_t)1 << 20);
    float *host = g_new(float, chunk);
    for (size_t i = 0; i < chunk; i++)
        host[i] = (float)(positive ? g_rand_double(x->rand)
                                   : g_rand_double_range(x->rand, -1.0, 1.0));
    float *stage = dtype == REAL_DTYPE_BF16
                       ? x->be->alloc(x->be, chunk * sizeof(float), REAL_MEM_WORKSPACE)
                       : NULL;
    for (size_t at = 0; at < elems; at += chunk) {
        const size_t n = MIN(chunk, elems - at);
        if (dtype == REAL_DTYPE_F32) {
            x->be->copy(x->be, (float *)dst + at, host, n * sizeof(float));
        } else if (stage) {
            x->be->copy(x->be, stage, host, n * sizeof(float));
            x->be->f32_to_bf16(x->be, (RealBf16 *)dst + at, stage, n);
        }
    }
    x->be->free(x->be, stage);
    g_free(host);
}

static size_t dtype_bytes(RealDType dtype)
{
    return dtype == REAL_DTYPE_BF16 ? sizeof(RealBf16) : sizeof(float);
}

/* ---- GEMMs ---- */

static gboolean run_gemm(void *p, GError **error)
{
    Ctx *x = p;
    if (!x->be->gemm(x->be, x->trans_a, x->trans_b, x->m, x->n, x->k, 1.0f, x->a_dtype, x->a,
                     x->b_dtype, x->b, x->beta, x->c)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "gemm %dx%dx%d: workspace allocation failed",
                    x->m, x->n, x->k);
        return FALSE;
    }
    return TRUE;
}

/* Times c[m,n] = op(a) op(b) as set in x, on fresh random operands. */
static gboolean time_gemm(Ctx *x, const char *shape, const char *form, json_t *out,
                          GError **error)
{
    const size_t a_bytes = (size_t)x->m * x->k * dtype_bytes(x->a_dtype);
    const size_t b_bytes = (size_t)x->k * x->n * dtype_bytes(x->b_dtype);
    x->a = x->be->alloc(x->be, a_bytes, REAL_MEM_WORKSPACE);
    x->b = x->be->alloc(x->be, b_bytes, REAL_MEM_WORKSPACE);
    x->c = x->be->alloc(x->be, (size_t)x->m * x->n * sizeof(float), REAL_MEM_WORKSPACE);
    gboolean ok = x->a && x->b && x->c;
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "gemm %dx%dx%d: out of memory", x->m, x->n,
                    x->k);
    double t = 0;
    if (ok) {
        fill_random(x, x->a, x->a_dtype, (size_t)x->m * x->k, FALSE);
        fill_random(x, x->b, x->b_dtype, (size_t)x->k * x->n, FALSE);
        fill_random(x, x->c, REAL_DTYPE_F32, (size_t)x->m * x->n, FALSE);
        ok = median_time(x->be, x->comm, run_gemm, x, &t, error);
    }
    x->be->free(x->be, x->a), x->be->free(x->be, x->b), x->be->free(x->be, x->c);
    if (ok)
        json_array_append_new(out, json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:f}", "shape",
                                             shape, "form", form, "m", x->m, "n", x->n, "k",
                                             x->k, "flops", 2.0 * x->m * x->n * x->k, "time_s",
                                             t));
    return ok;
}

/* The three GEMMs a step issues per linear layer, exactly as real_gpt issues them; m, n and k
 * are picked from the layer's tokens T, outputs N and inputs K. A block linear y = x W
 * (W [K,N]): forward (fp32 activations times bf16 weights), the input gradient dy W^T, and
 * the weight gradient x^T dy (saved bf16 activations times the fp32 output gradient,
 * accumulated). The tied LM head logits = y wte^T (wte [N = vocab, K = hidden]): forward,
 * dwte = dlogits^T y (both fp32) and dy = dlogits wte. */
enum { DIM_T, DIM_N, DIM_K };
typedef struct {
    const char *form;
    int m, n, k; /* DIM_* */
    bool ta, tb;
    RealDType a, b;
    float beta;
} GemmForm;

static const GemmForm linear_forms[] = {
    {"forward", DIM_T, DIM_N, DIM_K, false, false, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
    {"input_grad", DIM_T, DIM_K, DIM_N, false, true, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
    {"weight_grad", DIM_K, DIM_N, DIM_T, true, false, REAL_DTYPE_BF16, REAL_DTYPE_F32, 1.0f},
};
static const GemmForm head_forms[] = {
    {"forward", DIM_T, DIM_N, DIM_K, false, true, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
    {"weight_grad", DIM_N, DIM_K, DIM_T, true, false, REAL_DTYPE_F32, REAL_DTYPE_F32, 0.0f},
    {"input_grad", DIM_T, DIM_K, DIM_N, false, false, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
};

static gboolean bench_linear(Ctx *x, const char *shape, const GemmForm *forms, int tokens,
                             int n, int k, json_t *out, GError **error)
{
    const int dims[] = {[DIM_T] = tokens, [DIM_N] = n, [DIM_K] = k};
    for (size_t i = 0; i < 3; i++) {
        x->m = dims[forms[i].m], x->n = dims[forms[i].n], x->k = dims[forms[i].k];
        x->trans_a = forms[i].ta, x->trans_b = forms[i].tb;
        x->a_dtype = forms[i].a, x->b_dtype = forms[i].b, x->beta = forms[i].beta;
        if (!time_gemm(x, shape, forms[i].form, out, error))
            return FALSE;
    }
    return TRUE;
}

static gboolean bench_gemms(Ctx *x, const Sizes *sz, json_t *out, GError **error)
{
    for (size_t i = 0; i < sz->n_gemm_squares; i++) {
        const int s = sz->gemm_squares[i];
        x->m = x->n = x->k = s;
        x->trans_a = x->trans_b = false;
        x->a_dtype = REAL_DTYPE_F32, x->b_dtype = REAL_DTYPE_BF16, x->beta = 0.0f;
        if (!time_gemm(x, "square", "forward", out, error))
            return FALSE;
    }
    for (size_t hi = 0; hi < sz->n_hiddens; hi++)
        for (size_t ti = 0; ti < sz->n_tokens; ti++) {
            const int h = sz->hiddens[hi], t = sz->tokens[ti];
            const struct {
                const char *shape;
                const GemmForm *forms;
                int n, k;
            } linears[] = {{"qkv", linear_forms, 3 * h, h},
                           {"attn_proj", linear_forms, h, h},
                           {"fc1", linear_forms, 4 * h, h},
                           {"fc2", linear_forms, h, 4 * h},
                           {"lm_head", head_forms, GPT2_VOCAB, h}};
            for (size_t l = 0; l < G_N_ELEMENTS(linears); l++)
                if (!bench_linear(x, linears[l].shape, linears[l].forms, t, linears[l].n,
                                  linears[l].k, out, error))
                    return FALSE;
        }
    return TRUE;
}

/* ---- memory-bound kernels ---- */

static gboolean run_adam(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    const RealAdamHyper hyper = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .grad_scale = 1.0f, .step = 1};
    x->be->adam_step(x->be, &hyper, x->elems, x->f[0], x->f[1], x->f[2], x->h[0], x->h[1]);
    return TRUE;
}

static gboolean run_gelu(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->gelu_fwd(x->be, x->f[1], x->f[0], x->elems);
    return TRUE;
}

static gboolean run_gelu_bwd(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->gelu_bwd(x->be, x->f[2], x->f[1], x->f[0], x->elems);
    return TRUE;
}

static gboolean run_layernorm(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->layernorm_fwd(x->be, x->f[1], x->f[3], x->f[3] + x->rows, x->f[0], x->h[0],
                         x->h[0] + x->cols, x->rows, x->cols);
    return TRUE;
}

static gboolean run_layernorm_bwd(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    float *dgain = x->f[3] + 2 * (size_t)x->rows;
    x->be->layernorm_bwd(x->be, x->f[2], dgain, dgain + x->cols, x->f[1], x->f[0], x->f[3],
                         x->f[3] + x->rows, x->h[0], x->rows, x->cols);
    return TRUE;
}

static gboolean run_add(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->add(x->be, x->f[2], x->f[0], x->f[1], x->elems);
    return TRUE;
}

static gboolean run_bias_fwd(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->bias_fwd(x->be, x->f[0], x->h[0], x->rows, x->cols);
    return TRUE;
}

static gboolean run_bias_bwd(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->bias_bwd(x->be, x->f[3], x->f[0], x->rows, x->cols);
    return TRUE;
}

static gboolean run_to_bf16(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->f32_to_bf16(x->be, x->h[1], x->f[0], x->elems);
    return TRUE;
}

static gboolean run_to_f32(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->bf16_to_f32(x->be, x->f[1], x->h[1], x->elems);
    return TRUE;
}

static gboolean run_round(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->round_bf16(x->be, x->f[1], x->elems);
    return TRUE;
}

static gboolean run_accumulate(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->accumulate_bf16(x->be, x->h[1], x->f[0], x->elems);
    return TRUE;
}

/* Kernels with their bytes counted two ways. `schedule_bytes` is what the schedule counts
 * for them, so that a rate fitted to it means what the simulator divides by: Adam reads the
 * gradient, reads and writes master, m and v and writes the parameter (28 bytes per
 * element); GELU and layer norm read and write each element (2 x 2 bytes in the 16-bit
 * working precision); a residual add reads two and writes one (3 x 2). Those four are the
 * `memory` samples calibrate fits; the others (schedule_bytes 0) are recorded under
 * `kernels` with the bytes they really move (`bytes`, fp32 activations as zreal keeps
 * them), to explain a step op by op. */
static const struct {
    const char *name;
    TimedFn fn;
    double schedule_bytes, bytes; /* per element */
    gboolean rows;                /* a row kernel: rows of GPT-2's 768 columns */
} memory_kernels[] = {
    {"adam", run_adam, 28.0, 28.0, FALSE},
    {"gelu", run_gelu, 4.0, 8.0, FALSE},
    {"layernorm", run_layernorm, 4.0, 8.0, TRUE},
    {"add", run_add, 6.0, 12.0, FALSE},
    {"gelu_bwd", run_gelu_bwd, 0, 12.0, FALSE},
    {"layernorm_bwd", run_layernorm_bwd, 0, 12.0, TRUE},
    {"bias_fwd", run_bias_fwd, 0, 8.0, TRUE},
    {"bias_bwd", run_bias_bwd, 0, 4.0, TRUE},
    {"f32_to_bf16", run_to_bf16, 0, 6.0, FALSE},
    {"bf16_to_f32", run_to_f32, 0, 6.0, FALSE},
    {"round_bf16", run_round, 0, 8.0, FALSE},
    {"accumulate_bf16", run_accumulate, 0, 8.0, FALSE},
};

/* Buffers for the largest size: 4 fp32 and 2 bf16 arrays of max_elems (the fourth fp32 one
 * also holds layer-norm statistics and column sums). */
static gboolean alloc_memory_buffers(Ctx *x, size_t max_elems, GError **error)
{
    for (int i = 0; i < 4; i++) {
        x->f[i] = x->be->alloc(x->be, max_elems * sizeof(float), REAL_MEM_WORKSPACE);
        if (x->f[i])
            fill_random(x, x->f[i], REAL_DTYPE_F32, max_elems, i == 2);
    }
    for (int i = 0; i < 2; i++) {
        x->h[i] = x->be->alloc(x->be, max_elems * sizeof(RealBf16), REAL_MEM_WORKSPACE);
        if (x->h[i])
            fill_random(x, x->h[i], REAL_DTYPE_BF16, max_elems, FALSE);
    }
    if (x->f[0] && x->f[1] && x->f[2] && x->f[3] && x->h[0] && x->h[1])
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "microbench: no memory for %zu-element buffers",
                max_elems);
    return FALSE;
}

static void free_memory_buffers(Ctx *x)
{
    for (int i = 0; i < 4; i++)
        x->be->free(x->be, x->f[i]), x->f[i] = NULL;
    for (int i = 0; i < 2; i++)
        x->be->free(x->be, x->h[i]), x->h[i] = NULL;
}

static gboolean bench_memory(Ctx *x, const Sizes *sz, json_t *memory, json_t *kernels,
                             gboolean all_kernels, GError **error)
{
    /* Adam's v must not be negative (f[2] is drawn in [0, 1)). */
    for (size_t k = 0; k < G_N_ELEMENTS(memory_kernels); k++) {
        const gboolean fitted = memory_kernels[k].schedule_bytes > 0;
        if (!fitted && !all_kernels)
            continue;
        for (size_t i = 0; i < sz->n_elems; i++) {
            x->elems = sz->elems[i];
            x->cols = 768;
            x->rows = (int)(x->elems / (size_t)x->cols);
            double t;
            if (!median_time(x->be, x->comm, memory_kernels[k].fn, x, &t, error))
                return FALSE;
            const double elems = memory_kernels[k].rows ? (double)x->rows * x->cols
                                                         : (double)x->elems;
            json_t *row = json_pack("{s:s, s:I, s:f, s:f}", "kernel", memory_kernels[k].name,
                                    "elems", (json_int_t)elems, "bytes",
                                    (fitted ? memory_kernels[k].schedule_bytes
                                            : memory_kernels[k].bytes) * elems,
                                    "time_s", t);
            if (fitted)
                json_object_set_new(row, "device_bytes",
                                    json_real(memory_kernels[k].bytes * elems));
            json_array_append_new(fitted ? memory : kernels, row);
        }
    }
    return TRUE;
}

/* ---- CPU Adam (the optimizer offload's host step) ---- */

typedef struct {
    size_t elems;
    float *master, *m, *v, *grad;
    RealBf16 *param;
} CpuAdam;

static gboolean run_cpu_adam(void *p, GError **error)
{
    (void)error;
    CpuAdam *a = p;
    const RealAdamHyper hyper = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                 .grad_scale = 1.0f, .step = 1};
    real_offload_cpu_adam(&hyper, a->elems, a->master, a->m, a->v, a->grad, a->param);
    return TRUE;
}

/* The host's vectorised Adam on one core per rank (every rank at once, as the ranks of a
 * node share its memory in training), at the elementwise sizes, in host memory whatever the
 * backend: {elems, bytes (30 per element, zp_offload_cpu_adam_bytes), time_s}. */
static gboolean bench_cpu_adam(Ctx *x, const Sizes *sz, json_t *out, GError **error)
{
    const size_t n = sz->elems[sz->n_elems - 1];
    CpuAdam a = {.master = g_try_new0(float, n), .m = g_try_new0(float, n),
                 .v = g_try_new0(float, n), .grad = g_try_new0(float, n),
                 .param = g_try_new0(RealBf16, n)};
    gboolean ok = a.master && a.m && a.v && a.grad && a.param;
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "microbench: no host memory for CPU Adam");
    for (size_t i = 0; ok && i < n; i++)
        a.grad[i] = (float)g_rand_double_range(x->rand, -1, 1), a.master[i] = 0.5f;
    /* The host clock and the ranks' barrier, as for any host kernel. */
    RealBackend host_clock = *x->be;
    host_clock.mark = NULL, host_clock.synchronize = NULL;
    for (size_t i = 0; ok && i < sz->n_elems; i++) {
        a.elems = sz->elems[i];
        double t;
        ok = median_time(&host_clock, x->comm, run_cpu_adam, &a, &t, error);
        if (ok)
            json_array_append_new(out, json_pack("{s:I, s:f, s:f}", "elems",
                                                 (json_int_t)a.elems, "bytes",
                                                 30.0 * (double)a.elems, "time_s", t));
    }
    g_free(a.master), g_free(a.m), g_free(a.v), g_free(a.grad), g_free(a.param);
    return ok;
}

/* ---- NVMe (the ZeRO-Infinity tier's swap files) ---- */

/* Bytes each rank writes and reads back, every rank at once on its own swap file. */
static const double nvme_sizes[] = {4 << 20, 16 << 20, 48 << 20};

typedef struct {
    RealNvmeFile *file;
    void *buf;
    uint64_t bytes;
    gboolean write;
} NvmeIo;

static gboolean run_nvme(void *p, GError **error)
{
    NvmeIo *io = p;
    if (io->write)
        return real_nvme_write(io->file, io->buf, io->bytes, 0, error) &&
               real_nvme_sync(io->file, error);
    return real_nvme_read(io->file, io->buf, io->bytes, 0, error);
}

/* real_nvme's pwrite (then fdatasync) and pread of a swap file under `dir`, as zreal's NVMe
 * tier does them, by every rank at once (a node's ranks share its drives): {"path",
 * "direct" (O_DIRECT, else the reason it was refused: buffered reads may come from the page
 * cache), "ranks" (io_ranks: 1 when emulating), "write"/"read": [{bytes (the node's: all
 * ranks'), time_s (the slowest rank's)}]}. */
static gboolean bench_nvme(Ctx *x, const char *dir, int io_ranks, json_t **out,
                           GError **error)
{
    const uint64_t largest = (uint64_t)nvme_sizes[G_N_ELEMENTS(nvme_sizes) - 1];
    NvmeIo io = {.file = real_nvme_file_new(dir, x->comm->rank, "microbench", largest, NULL,
                                            error),
                 .buf = g_try_malloc(largest)};
    gboolean ok = io.file && io.buf;
    if (io.file && !io.buf)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "microbench: no host memory for NVMe I/O");
    if (ok)
        memset(io.buf, 0x5a, largest);
    json_t *rows[2] = {json_array(), json_array()};
    for (int w = 1; ok && w >= 0; w--) /* writes first: the reads read what they wrote */
        for (size_t i = 0; ok && i < G_N_ELEMENTS(nvme_sizes); i++) {
            io.bytes = (uint64_t)nvme_sizes[i], io.write = w;
            double t;
            RealBackend host_clock = *x->be;
            host_clock.mark = NULL, host_clock.synchronize = NULL;
            ok = median_time(&host_clock, x->comm, run_nvme, &io, &t, error);
            if (ok)
                json_array_append_new(rows[w], json_pack("{s:f, s:f}", "bytes",
                                                         nvme_sizes[i] * io_ranks,
                                                         "time_s", t));
        }
    const char *reason = io.file ? real_nvme_buffered_reason(io.file) : NULL;
    *out = ok ? json_pack("{s:s, s:o, s:i, s:o, s:o}", "path", dir, "direct",
                          reason ? json_string(reason) : json_true(), "ranks", io_ranks,
                          "write", rows[1], "read", rows[0])
              : NULL;
    if (!ok)
        json_decref(rows[0]), json_decref(rows[1]);
    real_nvme_file_free(io.file);
    g_free(io.buf);
    return ok;
}

/* ---- attention and the loss (device backends: model-shaped, for the record) ---- */

static gboolean run_attention_fwd(void *p, GError **error)
{
    Ctx *x = p;
    if (x->be->attention_fwd(x->be, x->f[1], x->h[0], REAL_DTYPE_BF16, x->f[0], x->batch,
                             SEQ_LEN, x->heads, HEAD_DIM))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "attention_fwd: workspace allocation failed");
    return FALSE;
}

static gboolean run_attention_bwd(void *p, GError **error)
{
    Ctx *x = p;
    if (x->be->attention_bwd(x->be, x->f[2], x->f[1], x->f[0], x->h[0], REAL_DTYPE_BF16,
                             x->batch, SEQ_LEN, x->heads, HEAD_DIM))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "attention_bwd: workspace allocation failed");
    return FALSE;
}

static gboolean run_softmax_xent(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    float loss;
    x->be->softmax_xent(x->be, x->f[0], x->targets, x->rows, GPT2_VOCAB, 1.0f, &loss);
    return TRUE;
}

/* Causal attention of GPT-2's two widths at 1,024 tokens, micro-batches 1 to 16: FLOPs of
 * its four (forward) or eight (backward) s x s x head_dim products, bytes of the s^2 tiles
 * it writes and reads (fp32 scores, bf16 probabilities). */
static gboolean bench_attention(Ctx *x, const Sizes *sz, json_t *out, GError **error)
{
    static const int batches[] = {1, 4, 16};
    for (size_t hi = 0; hi < sz->n_hiddens; hi++)
        for (size_t bi = 0; bi < G_N_ELEMENTS(batches); bi++) {
            x->heads = sz->hiddens[hi] / HEAD_DIM;
            x->batch = batches[bi];
            const double h = (double)x->heads * HEAD_DIM, tokens = (double)x->batch * SEQ_LEN;
            const double scores = (double)x->batch * x->heads * SEQ_LEN * SEQ_LEN;
            const size_t qkv = (size_t)(tokens * 3 * h);
            for (int i = 0; i < 3; i++)
                x->f[i] = x->be->alloc(x->be, qkv * sizeof(float), REAL_MEM_WORKSPACE);
            x->h[0] = x->be->alloc(x->be, (size_t)scores * sizeof(RealBf16), REAL_MEM_WORKSPACE);
            gboolean ok = x->f[0] && x->f[1] && x->f[2] && x->h[0];
            if (!ok)
                g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "attention: out of memory");
            if (ok)
                fill_random(x, x->f[0], REAL_DTYPE_F32, qkv, FALSE);
            const struct {
                const char *kernel;
                TimedFn fn;
                double flops, bytes;
            } passes[] = {
                {"attention_fwd", run_attention_fwd, 4.0 * scores * HEAD_DIM,
                 scores * (4 + 4 + 2 + 2) + tokens * h * 4 * 4},
                {"attention_bwd", run_attention_bwd, 8.0 * scores * HEAD_DIM,
                 scores * (4 + 4 + 2 + 2 + 2) + tokens * h * 4 * 8},
            };
            for (size_t k = 0; ok && k < G_N_ELEMENTS(passes); k++) {
                double t;
                ok = median_time(x->be, x->comm, passes[k].fn, x, &t, error);
                if (ok)
                    json_array_append_new(
                        out, json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f}", "kernel",
                                       passes[k].kernel, "batch", x->batch, "seq_len", SEQ_LEN,
                                       "heads", x->heads, "head_dim", HEAD_DIM, "flops",
                                       passes[k].flops, "bytes", passes[k].bytes, "time_s", t));
            }
            for (int i = 0; i < 3; i++)
                x->be->free(x->be, x->f[i]), x->f[i] = NULL;
            x->be->free(x->be, x->h[0]), x->h[0] = NULL;
            if (!ok)
                return FALSE;
        }
    return TRUE;
}

/* The loss over GPT-2's vocabulary for micro-batches 1 and 4 of 1,024 tokens: it reads the
 * logits three times and writes them twice (fp32). */
static gboolean bench_loss(Ctx *x, json_t *out, GError **error)
{
    static const int rows[] = {1024, 4096};
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++) {
        x->rows = rows[i];
        const size_t elems = (size_t)x->rows * GPT2_VOCAB;
        x->f[0] = x->be->alloc(x->be, elems * sizeof(float), REAL_MEM_WORKSPACE);
        x->targets = g_new(int, x->rows);
        for (int r = 0; r < x->rows; r++)
            x->targets[r] = g_rand_int_range(x->rand, 0, GPT2_VOCAB);
        gboolean ok = x->f[0] != NULL;
        double t = 0;
        if (!ok)
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "softmax_xent: out of memory");
        if (ok) {
            fill_random(x, x->f[0], REAL_DTYPE_F32, elems, FALSE);
            ok = median_time(x->be, x->comm, run_softmax_xent, x, &t, error);
        }
        if (ok)
            json_array_append_new(out, json_pack("{s:s, s:I, s:f, s:f}", "kernel",
                                                 "softmax_xent", "elems", (json_int_t)elems,
                                                 "bytes", 20.0 * elems, "time_s", t));
        x->be->free(x->be, x->f[0]), x->f[0] = NULL;
        g_free(x->targets), x->targets = NULL;
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

/* ---- collectives ---- */

static gboolean run_collective(void *p, GError **error)
{
    Ctx *x = p;
    RealComm *c = x->comm;
    const size_t per_rank = x->elems / (size_t)c->size;
    if (x->op == 0)
        return c->allreduce_bf16(c, x->h[0], x->elems, error);
    if (x->op == 1) {
        int *counts = g_new(int, c->size);
        for (int q = 0; q < c->size; q++)
            counts[q] = (int)per_rank;
        gboolean ok = c->reduce_scatter_bf16(c, x->h[0], counts, error);
        g_free(counts);
        return ok;
    }
    return c->allgather_bf16(c, x->h[1], per_rank, x->h[0], error);
}

/* The most of the model's own sizes timed: beyond them, every other one is dropped. */
#define MAX_MODEL_COLL_SIZES 12
/* Sizes closer than this (relative) are one size for the table. */
#define SAME_SIZE 0.05

typedef struct {
    size_t elems;
    gboolean model;
} CollSize;

static int by_elems(const void *a, const void *b)
{
    const CollSize *x = a, *y = b;
    return (x->elems > y->elems) - (x->elems < y->elems);
}

/* Cell c of the collectives' sweep into x: op c / sizes, the size c mod sizes (`sizes`, of
 * CollSize, each a multiple of the ranks). */
static void coll_cell(Ctx *x, const GArray *sizes, size_t c)
{
    x->op = (int)(c / sizes->len);
    x->elems = g_array_index(sizes, CollSize, c % sizes->len).elems;
}

/* The sizes of the data-parallel all-reduces, reduce-scatters and all-gathers that the model's
 * schedules run at ZeRO stages 0-3 on `ranks` ranks (plan otherwise as given), in bf16
 * elements of their bytes, those up to max_elems appended to `sizes`. */
static gboolean model_coll_sizes(const ZpModel *model, const ZpPlan *plan, int ranks,
                                 size_t max_elems, GArray *sizes, GError **error)
{
    if (plan->dp != ranks) /* a --mp that does not divide the ranks: no such DP group */
        return TRUE;
    for (int stage = 0; stage <= 3; stage++) {
        ZpPlan at = *plan;
        at.zero.stage = stage;
        ZpSchedule *sched = zp_sched_build(model, &at, error);
        if (!sched)
            return FALSE;
        for (guint i = 0; i < sched->ops->len; i++) {
            const ZpOp *op = zp_sched_op(sched, i);
            if (op->kind != ZP_OP_COLLECTIVE || op->group != ZP_GROUP_DP ||
                op->sub > ZP_COLL_ALLGATHER)
                continue;
            const size_t elems = (size_t)ceil(op->bytes / sizeof(RealBf16));
            if (elems <= max_elems)
                g_array_append_val(sizes, ((CollSize){elems, TRUE}));
        }
        zp_sched_free(sched);
    }
    return TRUE;
}

/* The most elements a model's collective is timed at: each of its two buffers at most 1/8 of
 * the rank's share of the memory that holds them (the device's, or the host's over the ranks),
 * so that a model too large for this machine still gets its microbenchmark; the table's
 * plateau (the largest size's bus bandwidth) covers what is left out. */
static size_t coll_max_elems(RealBackend *be, int ranks)
{
    RealDeviceMemory dm;
    const double bytes = be->device_memory && be->device_memory(be, &dm)
                             ? (double)dm.total_bytes
                             : (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE) /
                                   ranks;
    return (size_t)(bytes / 8 / sizeof(RealBf16));
}

/* `sizes` (sorted by elements) without those within SAME_SIZE of the one kept before them; a
 * model's size takes a grid size's place. */
static void drop_near(GArray *sizes)
{
    guint kept = 0;
    for (guint i = 1; i < sizes->len; i++) {
        CollSize *k = &g_array_index(sizes, CollSize, kept);
        const CollSize c = g_array_index(sizes, CollSize, i);
        if (c.elems > (1 + SAME_SIZE) * k->elems)
            g_array_index(sizes, CollSize, ++kept) = c;
        else if (c.model && !k->model)
            *k = c;
    }
    g_array_set_size(sizes, MIN(sizes->len, kept + 1));
}

/* The collectives' sizes (CollSize), increasing, each a multiple of the ranks: the backend's
 * grid and, with a model, the sizes its own schedules use (model_coll_sizes) up to max_elems,
 * which the calibrated table then holds exactly: on this host bandwidth moves with the message
 * (MPI's shared-memory copies leave the caches), and a size between two grid points would be
 * read off a curve drawn through them. Sizes within SAME_SIZE of a kept one are dropped, the
 * model's kept over the grid's; at most MAX_MODEL_COLL_SIZES of the model's, spread over its
 * range. */
static GArray *coll_sizes(const Sizes *sz, const ZpModel *model, const ZpPlan *plan,
                          int ranks, size_t max_elems, GError **error)
{
    GArray *model_sizes = g_array_new(FALSE, FALSE, sizeof(CollSize));
    if (model && !model_coll_sizes(model, plan, ranks, max_elems, model_sizes, error)) {
        g_array_unref(model_sizes);
        return NULL;
    }
    GArray *all = g_array_new(FALSE, FALSE, sizeof(CollSize));
    g_array_sort(model_sizes, by_elems);
    drop_near(model_sizes);
    const guint keep = MIN(model_sizes->len, MAX_MODEL_COLL_SIZES);
    for (guint j = 0; j < keep; j++) {
        const guint at = keep < 2 ? 0 : j * (model_sizes->len - 1) / (keep - 1);
        g_array_append_val(all, g_array_index(model_sizes, CollSize, at));
    }
    g_array_unref(model_sizes);
    for (size_t i = 0; i < sz->n_coll_elems; i++)
        g_array_append_val(all, ((CollSize){sz->coll_elems[i], FALSE}));
    for (guint i = 0; i < all->len; i++) {
        CollSize *c = &g_array_index(all, CollSize, i);
        c->elems = MAX(c->elems / (size_t)ranks, 1) * (size_t)ranks;
    }
    g_array_sort(all, by_elems);
    drop_near(all);
    return all;
}

/* Sets x up for cell c of a sweep over `sizes` (of CollSize). */
typedef void (*SweepCell)(Ctx *x, const GArray *sizes, size_t c);

/* The median of REPEATS timed calls of fn at each of `cells` cells, into medians[c], over two
 * bf16 buffers x->h[0] and x->h[1] of the largest size, random, freed after: a warm-up round,
 * then REPEATS rounds that go round every cell in turn. Load on a shared machine that comes
 * and goes (ranks that busy-poll for their peers wait out another process's time slice) then
 * lands on a repeat of many cells rather than on every repeat of a few, and the medians drop
 * it. `what` names the sweep in messages. */
static gboolean sweep_medians(Ctx *x, const GArray *sizes, size_t cells, SweepCell cell,
                              TimedFn fn, const char *what, double *medians, GError **error)
{
    const size_t max = g_array_index(sizes, CollSize, sizes->len - 1).elems;
    x->h[0] = x->be->alloc(x->be, max * sizeof(RealBf16), REAL_MEM_BUCKETS);
    x->h[1] = x->be->alloc(x->be, max * sizeof(RealBf16), REAL_MEM_BUCKETS);
    gboolean ok = x->h[0] && x->h[1];
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: out of memory", what);
    if (ok) {
        fill_random(x, x->h[0], REAL_DTYPE_BF16, max, FALSE);
        fill_random(x, x->h[1], REAL_DTYPE_BF16, max, FALSE);
    }
    double *times = g_new(double, cells * REPEATS);
    for (int r = -1; ok && r < REPEATS; r++) /* r = -1: the warm-up round */
        for (size_t c = 0; ok && c < cells; c++) {
            cell(x, sizes, c);
            double t = 0;
            ok = r < 0 ? fn(x, error) && real_timing_finished(x->be, error)
                       : real_timing_once_s(x->be, x->comm, fn, x, &t, error);
            if (ok && r >= 0)
                times[c * REPEATS + (size_t)r] = t;
        }
    for (size_t c = 0; ok && c < cells; c++)
        medians[c] = real_timing_median(times + c * REPEATS, REPEATS);
    g_free(times);
    x->be->free(x->be, x->h[0]), x->h[0] = NULL;
    x->be->free(x->be, x->h[1]), x->h[1] = NULL;
    return ok;
}

/* Over a real communicator, the real collectives; over an emulated one (one process playing
 * a rank of a node), the device-to-device copies that stand in for them. Each op and size is
 * a cell of sweep_medians. */
static gboolean bench_collectives(Ctx *x, const GArray *sizes, json_t *out, GError **error)
{
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather"};
    const size_t cells = 3 * sizes->len;
    double *medians = g_new(double, cells);
    const gboolean ok = sweep_medians(x, sizes, cells, coll_cell, run_collective, "collectives",
                                      medians, error);
    for (size_t c = 0; ok && c < cells; c++) {
        coll_cell(x, sizes, c);
        const int op = x->op;
        const size_t elems = x->elems;
        const double t = medians[c];
        /* Bus bandwidth as nccl-tests define it (doc/PERFORMANCE.md): the algorithm
         * bandwidth S / t times 2(n-1)/n for an all-reduce, (n-1)/n for the others. */
        const double n = x->comm->size, algbw = 2.0 * elems / t;
        const double busbw = algbw * (op == 0 ? 2 * (n - 1) / n : (n - 1) / n);
        json_array_append_new(out, json_pack("{s:s, s:i, s:f, s:f, s:f, s:f}", "op", names[op],
                                             "ranks", x->comm->size, "bytes", 2.0 * elems,
                                             "time_s", t, "algbw_bytes_per_s", algbw,
                                             "busbw_bytes_per_s", busbw));
    }
    g_free(medians);
    return ok;
}

static gboolean run_copy(void *p, GError **error)
{
    (void)error;
    Ctx *x = p;
    x->be->copy(x->be, x->h[1], x->h[0], x->elems * sizeof(RealBf16));
    return TRUE;
}

static void copy_cell(Ctx *x, const GArray *sizes, size_t c)
{
    x->elems = g_array_index(sizes, CollSize, c).elems;
}

/* The rank's own copies around the collectives (zp_cost_coll_passes: a bucket filled and
 * emptied, a share delivered), every rank copying at once as they do in training: one copy of
 * each collective size and of its share per rank, a cell each of sweep_medians, into `out` as
 * {bytes, time_s}. zplan calibrate makes the op table's copy curve of them: a plain copy
 * streams, where the convert class's kernels widen or round each element. */
static gboolean bench_copies(Ctx *x, const GArray *coll, int ranks, json_t *out,
                             GError **error)
{
    GArray *sizes = g_array_new(FALSE, FALSE, sizeof(CollSize));
    for (guint i = 0; i < coll->len; i++) {
        const CollSize c = g_array_index(coll, CollSize, i);
        g_array_append_val(sizes, c);
        if (ranks > 1)
            g_array_append_val(sizes, ((CollSize){MAX(c.elems / (size_t)ranks, 1), c.model}));
    }
    g_array_sort(sizes, by_elems);
    drop_near(sizes);
    double *medians = g_new(double, sizes->len ? sizes->len : 1);
    const gboolean ok = sizes->len == 0 || sweep_medians(x, sizes, sizes->len, copy_cell,
                                                         run_copy, "copies", medians, error);
    for (guint c = 0; ok && c < sizes->len; c++)
        json_array_append_new(out, json_pack("{s:f, s:f}", "bytes",
                                             2.0 * g_array_index(sizes, CollSize, c).elems,
                                             "time_s", medians[c]));
    g_free(medians);
    g_array_unref(sizes);
    return ok;
}

gboolean real_microbench_run(RealBackend *be, RealComm *comm, gboolean emulated,
                             const ZpModel *model, const ZpPlan *plan, const char *nvme_dir,
                             const char *path, GError **error)
{
    const gboolean device = be->mark != NULL;
    const Sizes *sz = device ? &device_sizes : &cpu_sizes;
    Ctx x = {.be = be, .comm = comm, .rand = g_rand_new_with_seed(1234)};
    json_t *gemm = json_array(), *memory = json_array(), *kernels = json_array();
    json_t *coll = json_array(), *cpu_adam = json_array(), *nvme = NULL;
    gboolean ok = bench_gemms(&x, sz, gemm, error) &&
                  bench_cpu_adam(&x, &cpu_sizes, cpu_adam, error) &&
                  bench_nvme(&x, nvme_dir, emulated ? 1 : comm->size, &nvme, error) &&
                  alloc_memory_buffers(&x, sz->elems[sz->n_elems - 1], error) &&
                  bench_memory(&x, sz, memory, kernels, device, error);
    free_memory_buffers(&x);
    ok = ok && (!device || (bench_attention(&x, sz, kernels, error) &&
                            bench_loss(&x, kernels, error)));
    GArray *coll_elems =
        ok ? coll_sizes(sz, model, plan, comm->size, coll_max_elems(be, comm->size), error)
           : NULL;
    json_t *copies = json_array();
    ok = ok && coll_elems && (comm->size < 2 || bench_collectives(&x, coll_elems, coll, error)) &&
         bench_copies(&x, coll_elems, comm->size, copies, error);
    if (coll_elems)
        g_array_unref(coll_elems);
    const double host_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
    json_t *root = json_pack("{s:s, s:s, s:i, s:b, s:f, s:o, s:o, s:o, s:o}", "format",
                             "zplan-microbench-1", "backend", be->name, "world", comm->size,
                             "emulated", emulated, "host_memory_bytes", host_bytes, "gemm", gemm,
                             "memory", memory, "kernels", kernels, "collectives", coll);
    RealDeviceMemory dm;
    if (ok && be->device_memory && be->device_memory(be, &dm))
        json_object_set_new(root, "device_memory",
                            json_pack("{s:f, s:f}", "total_bytes", (double)dm.total_bytes,
                                      "context_bytes", (double)dm.context_bytes));
    json_object_set_new(root, "cpu_adam", cpu_adam);
    json_object_set_new(root, "copies", copies);
    if (nvme)
        json_object_set_new(root, "nvme", nvme);
    json_object_set_new(root, "host_cores", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    ok = ok && real_opbench_run(be, comm, model, plan, root, error);
    if (ok && comm->rank == 0)
        ok = zp_json_write(root, path, error);
    json_decref(root);
    g_rand_free(x.rand);
    return ok;
}
