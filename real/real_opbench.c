/* real_opbench: times, on this backend, the kernels zp_cost costs op by op — the GEMM grid,
 * eager attention, each elementwise class, a launch, contention — and a plan's own kernels. */
#include "real_opbench.h"
#include "real_timing.h"
#include "real_opseq.h"
#include "zp_cost.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

/* A kernel is timed 7 times, or 3 when one call takes longer than this (the LM head of
 * GPT-2 on a CPU core takes seconds). */
#define SLOW_KERNEL_S 0.1

typedef struct {
    RealBackend *be;
    RealComm *comm;
    GRand *rand;
    size_t cap;         /* elements of each buffer below */
    float *f[4];        /* fp32 */
    RealBf16 *h[2];     /* bf16 */
    int *tokens;        /* host: tokens and targets, cap of them */
    /* the kernel being timed */
    int form, cls;
    int variant;        /* GEMM: ZpGemmVariant */
    int m, n, k;        /* GEMM */
    int rows, cols;     /* row kernels; elems = rows x cols */
    size_t elems;
    int batch, seq, heads, kv_heads, head_dim;
    gboolean rms, swiglu, fused, backward;
    RealActivation act; /* the MLP's (gated: of its gate; plain: GELU's form) */
} Bench;

/* ---- buffers ---- */

/* Positive random values (an Adam v, a norm's rstd and a layer norm's statistics must not be
 * negative) into dst: 2^20 of them drawn once and repeated, as real_microbench's fill_random
 * does. Drawn whole, the 2^29-element buffers of the attention grid took 3.2 billion draws and
 * a 2 GiB host array per buffer; no kernel here reads its values in a way their repeating
 * changes. */
static void fill_random(Bench *x, void *dst, gboolean bf16, size_t elems)
{
    const size_t chunk = MIN(elems, (size_t)1 << 20);
    float *host = g_new(float, chunk);
    for (size_t i = 0; i < chunk; i++)
        host[i] = (float)g_rand_double_range(x->rand, 0.01, 1.0);
    float *stage = bf16 ? x->be->alloc(x->be, chunk * sizeof(float), REAL_MEM_WORKSPACE) : NULL;
    for (size_t at = 0; at < elems; at += chunk) {
        const size_t n = MIN(chunk, elems - at);
        if (!bf16) {
            x->be->copy(x->be, (float *)dst + at, host, n * sizeof(float));
        } else if (stage) {
            x->be->copy(x->be, stage, host, n * sizeof(float));
            x->be->f32_to_bf16(x->be, (RealBf16 *)dst + at, stage, n);
        }
    }
    x->be->free(x->be, stage);
    g_free(host);
}

/* The buffers go back, and so does what the tracker keeps for their size
 * (real_alloc_empty_cache): no later take asks for it again, neither a larger buffer nor the op
 * sequence. Kept, every size grown through stayed held: gpt2-124m's ops, grown to its LM head's
 * 38.6 million elements, reached 4.0 GB (1.4 GB now), and one rank's microbenchmark 6.7 GB,
 * where its training step peaks at 2.75 GB, so four ranks did not fit a 23 GB machine. */
static void free_buffers(Bench *x)
{
    for (int i = 0; i < 4; i++)
        x->be->free(x->be, x->f[i]), x->f[i] = NULL;
    for (int i = 0; i < 2; i++)
        x->be->free(x->be, x->h[i]), x->h[i] = NULL;
    g_free(x->tokens), x->tokens = NULL;
    x->cap = 0;
    real_alloc_empty_cache(x->be->tracker);
}

/* Buffers of at least `elems` each (grown, never shrunk), filled with positive values (an
 * Adam v, a norm's rstd and a layer norm's statistics must not be negative). */
static gboolean buffers(Bench *x, size_t elems, GError **error)
{
    if (elems <= x->cap)
        return TRUE;
    free_buffers(x);
    gboolean ok = TRUE;
    for (int i = 0; ok && i < 4; i++)
        ok = (x->f[i] = x->be->alloc(x->be, elems * sizeof(float), REAL_MEM_WORKSPACE)) != NULL;
    for (int i = 0; ok && i < 2; i++)
        ok = (x->h[i] = x->be->alloc(x->be, elems * sizeof(RealBf16), REAL_MEM_WORKSPACE)) != NULL;
    if (!ok) {
        free_buffers(x);
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "opbench: no memory for %zu-element buffers",
                    elems);
        return FALSE;
    }
    for (int i = 0; i < 4; i++)
        fill_random(x, x->f[i], FALSE, elems);
    for (int i = 0; i < 2; i++)
        fill_random(x, x->h[i], TRUE, elems);
    x->tokens = g_new(int, elems);
    x->cap = elems;
    return TRUE;
}

/* Times fn on x: 7 repeats, or 3 for a slow kernel. Every rank must make the same calls, so
 * they decide together, on the mean of their first timings. */
static gboolean timed(Bench *x, RealTimedFn fn, double *t, GError **error)
{
    if (!real_timing_median_s(x->be, x->comm, fn, x, 1, t, error))
        return FALSE;
    double mean_s = *t;
    if (!x->comm->allreduce_host_f64(x->comm, &mean_s, 1, error))
        return FALSE;
    mean_s /= x->comm->size;
    return real_timing_median_s(x->be, x->comm, fn, x, mean_s > SLOW_KERNEL_S ? 3 : 7, t,
                                error);
}

/* ---- GEMMs: the three forms as real_gpt.c issues them ---- */

typedef struct {
    bool ta, tb;
    RealDType a, b;
    float beta;
} GemmForm;

/* A block linear's (real_gpt_block.c) and the LM head's (real_gpt_ends.c
 * real_gpt_head_compute: logits = y wte^T, dwte = dlogits^T y from two fp32 operands,
 * dy = dlogits wte); both head variants, aligned or odd, issue the head's. */
static const GemmForm gemm_forms[2][ZP_GEMM_N] = {
    {
        [ZP_GEMM_FORWARD] = {false, false, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
        [ZP_GEMM_INPUT_GRAD] = {false, true, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
        [ZP_GEMM_WEIGHT_GRAD] = {true, false, REAL_DTYPE_BF16, REAL_DTYPE_F32, 1.0f},
    },
    {
        [ZP_GEMM_FORWARD] = {false, true, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
        [ZP_GEMM_INPUT_GRAD] = {false, false, REAL_DTYPE_F32, REAL_DTYPE_BF16, 0.0f},
        [ZP_GEMM_WEIGHT_GRAD] = {true, false, REAL_DTYPE_F32, REAL_DTYPE_F32, 0.0f},
    },
};

static gboolean run_gemm(void *p, GError **error)
{
    Bench *x = p;
    const GemmForm *f = &gemm_forms[x->variant != ZP_GEMM_BLOCK][x->form];
    const void *pa = f->a == REAL_DTYPE_BF16 ? (const void *)x->h[0] : (const void *)x->f[0];
    const void *pb = f->b == REAL_DTYPE_BF16 ? (const void *)x->h[1] : (const void *)x->f[1];
    if (x->be->gemm(x->be, f->ta, f->tb, x->m, x->n, x->k, 1.0f, f->a, pa, f->b, pb, f->beta,
                    x->f[2]))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "gemm %dx%dx%d: workspace allocation failed",
                x->m, x->n, x->k);
    return FALSE;
}

static gboolean time_gemm(Bench *x, int variant, int form, int m, int n, int k, double *t,
                          GError **error)
{
    x->variant = variant, x->form = form, x->m = m, x->n = n, x->k = k;
    const size_t need = MAX((size_t)m * k, MAX((size_t)k * n, (size_t)m * n));
    return buffers(x, need, error) && timed(x, run_gemm, t, error);
}

/* The grid zp_optable's surface is read on: log2(m n k) from lo to hi in steps of 3, log2
 * aspect 0 to aspect_hi in steps of 2, so that every dimension is a power of two: the shortest
 * 2^((V - 1.5A)/3), the middle one 2^(A/2) longer, the longest 2^A longer. The longest is the
 * token dimension (m of a forward or input gradient, k of a weight gradient), as in a
 * transformer. The LM head's variants (ZP_GEMM_HEAD, ZP_GEMM_HEAD_ODD) take its layouts and
 * dtypes and put the vocabulary longest, the tokens in the middle and the width shortest
 * (logits [T, V] = y [T, h] wte^T; dwte [V, h]; dy [T, h] over V), the odd one's vocabulary
 * one longer: a vocabulary no multiple of 8 (GPT-2's 50,257) leaves cuBLAS its slower kernels,
 * which an H200 ran 1.4 to 3.3 times as long as the block grid priced. */
static gboolean bench_gemm_grid(Bench *x, int lo, int hi, int aspect_hi, json_t *out,
                                GError **error)
{
    static const char *const variants[] = {"block", "head", "head_odd"};
    for (int var = 0; var < ZP_GEMM_VARIANTS; var++)
        for (int form = 0; form < ZP_GEMM_N; form++)
            for (int v = lo; v <= hi; v += 3)
                for (int a = 0; a <= aspect_hi; a += 2) {
                    const int e = (v - 3 * a / 2) / 3;
                    if (e < 0)
                        continue;
                    const int shortest = 1 << e, middle = shortest << (a / 2);
                    const int longest = (shortest << a) + (var == ZP_GEMM_HEAD_ODD);
                    const gboolean wgrad = form == ZP_GEMM_WEIGHT_GRAD;
                    int m = wgrad ? middle : longest, n = wgrad ? shortest : middle;
                    int k = wgrad ? longest : shortest;
                    if (var != ZP_GEMM_BLOCK) {
                        m = form == ZP_GEMM_WEIGHT_GRAD ? longest : middle;
                        n = form == ZP_GEMM_FORWARD ? longest : shortest;
                        k = form == ZP_GEMM_FORWARD       ? shortest
                            : form == ZP_GEMM_WEIGHT_GRAD ? middle
                                                          : longest;
                    }
                    double t;
                    if (!time_gemm(x, var, form, m, n, k, &t, error))
                        return FALSE;
                    json_array_append_new(
                        out, json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f}", "form",
                                       zp_gemm_form_name(form), "variant", variants[var], "m",
                                       m, "n", n, "k", k, "log2_mnk", v, "log2_aspect", a,
                                       "flops", 2.0 * m * n * k, "time_s", t));
                }
    return TRUE;
}

/* ---- attention ---- */

static gboolean run_attention(void *p, GError **error)
{
    Bench *x = p;
    RealBackend *be = x->be;
    bool ok;
    float *qkv = x->f[0], *out = x->f[1], *dqkv = x->f[2];
    /* The backward reads the forward's output as its upstream gradient too: timing only. */
    if (x->fused)
        ok = x->backward ? be->flash_attention_bwd(be, dqkv, out, qkv, out, x->f[3], x->batch,
                                                   x->seq, x->heads, x->kv_heads, x->head_dim)
                         : be->flash_attention_fwd(be, out, x->f[3], qkv, x->batch, x->seq,
                                                   x->heads, x->kv_heads, x->head_dim);
    else if (x->kv_heads != x->heads)
        ok = x->backward ? be->attention_gqa_bwd(be, dqkv, out, qkv, x->h[0], REAL_DTYPE_BF16,
                                                 x->batch, x->seq, x->heads, x->kv_heads,
                                                 x->head_dim)
                         : be->attention_gqa_fwd(be, out, x->h[0], REAL_DTYPE_BF16, qkv,
                                                 x->batch, x->seq, x->heads, x->kv_heads,
                                                 x->head_dim);
    else
        ok = x->backward ? be->attention_bwd(be, dqkv, out, qkv, x->h[0], REAL_DTYPE_BF16,
                                             x->batch, x->seq, x->heads, x->head_dim)
                         : be->attention_fwd(be, out, x->h[0], REAL_DTYPE_BF16, qkv, x->batch,
                                             x->seq, x->heads, x->head_dim);
    if (!ok)
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "attention: workspace allocation failed");
    return ok;
}

/* The model's FLOPs: 4 b s^2 h forward, 8 backward (the s^2 counted whole). */
static double attention_flops(const Bench *x)
{
    return (x->backward ? 8.0 : 4.0) * x->batch * (double)x->seq * x->seq * x->heads *
           x->head_dim;
}

static gboolean time_attention(Bench *x, double *t, GError **error)
{
    const size_t tokens = (size_t)x->batch * x->seq;
    const size_t need = MAX(tokens * (size_t)(x->heads + 2 * x->kv_heads) * x->head_dim,
                            (size_t)x->batch * x->heads * x->seq * x->seq);
    if (!buffers(x, need, error))
        return FALSE;
    if (x->backward) { /* the probabilities (or statistics) a forward leaves */
        x->backward = FALSE;
        if (!run_attention(x, error))
            return FALSE;
        x->backward = TRUE;
    }
    return timed(x, run_attention, t, error);
}

static gboolean attention_point(Bench *x, int pass, int batch, int heads, int s, int head_dim,
                                json_t *out, GError **error)
{
    x->batch = batch, x->seq = 1 << s, x->heads = x->kv_heads = heads;
    x->head_dim = head_dim, x->backward = pass, x->fused = FALSE;
    double t;
    if (!time_attention(x, &t, error))
        return FALSE;
    json_array_append_new(out, json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f}", "pass",
                                         pass ? "backward" : "forward", "batch", batch, "heads",
                                         heads, "seq_len", 1 << s, "head_dim", head_dim,
                                         "flops", attention_flops(x), "time_s", t));
    return TRUE;
}

/* Eager multi-head attention over sequence lengths 2^s_lo..2^s_hi and head dimensions 16 to
 * 128, batch 1, at each of `n_heads` head counts (zp_optable's heads levels: a sample's heads
 * run at once, so its rate grows with them); and, where `pairs`, the 8-head points to 2^10 at
 * batch 4 too: a call's samples run one after another, and two batches at one point give the
 * call's fixed time (cli_optable's attention_fixed). */
static gboolean bench_attention_grid(Bench *x, int s_lo, int s_hi, const int *heads,
                                     int n_heads, gboolean pairs, json_t *out, GError **error)
{
    static const int head_dims[] = {16, 32, 64, 128};
    for (int pass = 0; pass < 2; pass++)
        for (int h = 0; h < n_heads; h++)
            for (size_t d = 0; d < G_N_ELEMENTS(head_dims); d++)
                for (int s = s_lo; s <= s_hi; s++)
                    if (!attention_point(x, pass, 1, heads[h], s, head_dims[d], out, error) ||
                        (pairs && heads[h] == 8 && s <= 10 &&
                         !attention_point(x, pass, 4, 8, s, head_dims[d], out, error)))
                        return FALSE;
    return TRUE;
}

/* ---- elementwise classes ---- */

static gboolean run_ew(void *p, GError **error)
{
    Bench *x = p;
    RealBackend *be = x->be;
    float **f = x->f;
    const int r = x->rows, c = x->cols;
    switch ((ZpEwClass)x->cls) {
    case ZP_EW_NORM_FWD:
        if (x->rms)
            be->rmsnorm_fwd(be, f[1], f[0], x->h[0], r, c, 1e-5f);
        else
            be->layernorm_fwd(be, f[1], f[3], f[3] + r, f[0], x->h[0], x->h[0] + c, r, c);
        break;
    case ZP_EW_NORM_BWD:
        if (x->rms)
            be->rmsnorm_bwd(be, f[2], f[3] + 2 * (size_t)r, f[1], f[0], x->h[0], r, c, 1e-5f);
        else
            be->layernorm_bwd(be, f[2], f[3] + 2 * (size_t)r, f[3] + 2 * (size_t)r + c, f[1],
                              f[0], f[3], f[3] + r, x->h[0], r, c);
        break;
    case ZP_EW_ACT_FWD:
        if (x->swiglu)
            be->glu_fwd(be, f[1], f[0], r, c, x->act);
        else if (x->act == REAL_ACT_GELU_ERF)
            be->gelu_erf_fwd(be, f[1], f[0], x->elems);
        else
            be->gelu_fwd(be, f[1], f[0], x->elems);
        break;
    case ZP_EW_ACT_BWD:
        if (x->swiglu)
            be->glu_bwd(be, f[2], f[1], f[0], r, c, x->act);
        else if (x->act == REAL_ACT_GELU_ERF)
            be->gelu_erf_bwd(be, f[2], f[1], f[0], x->elems);
        else
            be->gelu_bwd(be, f[2], f[1], f[0], x->elems);
        break;
    case ZP_EW_ADD:
        be->add(be, f[2], f[0], f[1], x->elems);
        break;
    case ZP_EW_BIAS_FWD:
        be->bias_fwd(be, f[0], x->h[0], r, c);
        break;
    case ZP_EW_BIAS_BWD:
        be->bias_bwd(be, f[3], f[0], r, c);
        break;
    case ZP_EW_ROPE: {
        /* Every dimension turned, unscaled: a rescaling changes the angles, not the work. */
        const RealRope rope = {.theta = 10000.0f, .rot_dim = x->head_dim};
        if (!be->rope(be, f[0], 1, r, x->heads, x->kv_heads, x->head_dim, &rope, false)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "rope: the backend failed");
            return FALSE;
        }
        break;
    }
    case ZP_EW_CONVERT:
        be->round_bf16(be, f[1], x->elems);
        break;
    case ZP_EW_LOSS: {
        float loss;
        be->softmax_xent(be, f[0], x->tokens, r, c, 1.0f, &loss);
        break;
    }
    case ZP_EW_EMBED:
        be->embedding_fwd(be, f[1], x->tokens, x->h[0], x->h[1], 1, r, c);
        break;
    case ZP_EW_N:
        break;
    }
    return TRUE;
}

/* Bytes a class's kernel moves per element of its rows x cols (zp_cost's counting): the
 * rotary kernel's elements are the rotated q and k values, the activation's its outputs. */
static double ew_bytes_per_elem(const Bench *x, ZpEwClass c)
{
    return zp_ew_class_bytes_per_elem(c, x->swiglu);
}

/* Times class cls over `elems` elements in rows of `cols` (for the rotary kernel, rows of
 * heads + kv_heads rotated heads); returns the bytes it moves. */
static gboolean time_ew(Bench *x, ZpEwClass cls, size_t elems, int cols, double *bytes,
                        double *t, GError **error)
{
    x->cls = cls;
    const int per_row = cls == ZP_EW_ROPE ? (x->heads + x->kv_heads) * x->head_dim : cols;
    x->cols = cls == ZP_EW_ROPE ? x->heads * x->head_dim : cols;
    x->rows = (int)MAX((size_t)1, elems / (size_t)per_row);
    x->elems = (size_t)x->rows * per_row;
    const size_t row_width = cls == ZP_EW_ROPE
                                 ? (size_t)(x->heads + 2 * x->kv_heads) * x->head_dim
                             : x->swiglu && (cls == ZP_EW_ACT_FWD || cls == ZP_EW_ACT_BWD)
                                 ? 2 * (size_t)cols
                                 : (size_t)cols;
    if (!buffers(x, (size_t)x->rows * row_width + 4 * (size_t)x->rows + 4 * (size_t)cols,
                 error))
        return FALSE;
    for (int i = 0; i < x->rows; i++) /* tokens and targets: rows of a vocabulary of cols */
        x->tokens[i] = g_rand_int_range(x->rand, 0, MAX(1, MIN(cols, x->rows)));
    *bytes = ew_bytes_per_elem(x, cls) * (double)x->elems;
    return timed(x, run_ew, t, error);
}

/* Every class at sizes 2^lo..2^hi elements, rows of `cols` (the loss's of `vocab`). */
static gboolean bench_ew_classes(Bench *x, int lo, int hi, int cols, int vocab, json_t *out,
                                 GError **error)
{
    for (int c = 0; c < ZP_EW_N; c++)
        for (int e = lo; e <= hi; e += 2) {
            if ((c == ZP_EW_ROPE && !x->be->rope) || (x->rms && !x->be->rmsnorm_fwd) ||
                (x->swiglu && !x->be->glu_fwd))
                continue;
            double bytes, t;
            /* The loss and the embedding need a vocabulary: rows of cols over cols tokens. */
            if (!time_ew(x, (ZpEwClass)c, (size_t)1 << e, c == ZP_EW_LOSS ? vocab : cols,
                         &bytes, &t, error))
                return FALSE;
            json_array_append_new(out, json_pack("{s:s, s:I, s:f, s:f}", "class",
                                                 zp_ew_class_name(c), "elems",
                                                 (json_int_t)x->elems, "bytes", bytes,
                                                 "time_s", t));
        }
    return TRUE;
}

/* ---- contention: a GEMM while all-reduces run ---- */

typedef struct {
    Bench *x;
    double t;
    gint done;
    GError *error;
} GemmThread;

static gpointer gemm_thread(gpointer p)
{
    GemmThread *g = p;
    const double t0 = zp_now_s();
    if (!run_gemm(g->x, &g->error))
        g->t = -1;
    else
        g->t = zp_now_s() - t0;
    g_atomic_int_set(&g->done, 1);
    return NULL;
}

/* The GEMM alone, then in a thread while this thread all-reduces a 4 MiB buffer over and over
 * (MPI is called from this thread only); the medians of 5 of each. Host backends only: a
 * device's streams are not driven from two host threads here. */
static gboolean bench_contention(Bench *x, json_t *root, GError **error)
{
    const int size = 512;
    const size_t coll_elems = (size_t)1 << 21;
    double t_alone;
    if (x->comm->size < 2 || x->be->mark ||
        !time_gemm(x, ZP_GEMM_BLOCK, ZP_GEMM_FORWARD, size, size, size, &t_alone, error))
        return x->comm->size < 2 || x->be->mark;
    RealBf16 *buf = x->be->alloc(x->be, coll_elems * sizeof(RealBf16), REAL_MEM_BUCKETS);
    if (!buf) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "contention: out of memory");
        return FALSE;
    }
    fill_random(x, buf, TRUE, coll_elems);
    double times[5];
    gboolean ok = TRUE;
    for (int i = 0; ok && i < 5; i++) {
        GemmThread g = {.x = x};
        double zero = 0;
        ok = x->comm->allreduce_host_f64(x->comm, &zero, 1, error);
        GThread *th = ok ? g_thread_new("opbench-gemm", gemm_thread, &g) : NULL;
        /* Every rank all-reduces until every rank's GEMM is done: each round first agrees
         * whether any is still running, so all ranks make the same calls. */
        double busy = 1;
        while (ok && busy > 0) {
            busy = g_atomic_int_get(&g.done) ? 0 : 1;
            ok = x->comm->allreduce_host_f64(x->comm, &busy, 1, error);
            if (ok && busy > 0)
                ok = x->comm->allreduce_bf16(x->comm, buf, coll_elems, error);
        }
        if (th)
            g_thread_join(th);
        if (g.error) {
            g_propagate_error(error, g.error);
            ok = FALSE;
        }
        times[i] = g.t;
    }
    x->be->free(x->be, buf);
    if (!ok)
        return FALSE;
    double sorted[5];
    memcpy(sorted, times, sizeof sorted);
    for (int i = 0; i < 5; i++) /* insertion sort of five */
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            const double tmp = sorted[j];
            sorted[j] = sorted[j - 1], sorted[j - 1] = tmp;
        }
    json_object_set_new(root, "contention",
                        json_pack("{s:f, s:f, s:f, s:i}", "gemm_s", t_alone,
                                  "gemm_with_collective_s", sorted[2], "collective_bytes",
                                  (double)coll_elems * sizeof(RealBf16), "gemm_size", size));
    return TRUE;
}

/* ---- a plan's own kernels ---- */

/* The MLP's activation as real_gpt picks it: SiLU for SwiGLU, else GELU, exact or tanh. */
static RealActivation mlp_activation(const ZpModel *model)
{
    return model->mlp == ZP_MLP_SWIGLU ? REAL_ACT_SILU
           : model->exact_gelu         ? REAL_ACT_GELU_ERF
                                       : REAL_ACT_GELU_TANH;
}

static gboolean time_kernel(Bench *x, const ZpKernel *k, double *t, GError **error)
{
    if (k->kind == ZP_KERNEL_GEMM)
        return time_gemm(x, zp_gemm_variant(k->head, k->m, k->n, k->k), k->sub, (int)k->m,
                         (int)k->n, (int)k->k, t, error);
    if (k->kind == ZP_KERNEL_ATTENTION) {
        x->backward = k->sub;
        return time_attention(x, t, error);
    }
    double bytes;
    const size_t elems = (size_t)MAX(1.0, k->bytes / ew_bytes_per_elem(x, k->sub));
    const int cols = k->sub == ZP_EW_LOSS ? x->cols : x->m;
    return time_ew(x, k->sub, elems, cols, &bytes, t, error);
}

static gboolean bench_ops(Bench *x, const ZpModel *model, const ZpPlan *plan, json_t *out,
                          GError **error)
{
    static const char *const types[] = {"gemm", "attention", "elementwise"};
    for (int kind = 0; kind < ZP_COMP_N; kind++) {
        if (kind == ZP_COMP_OPTIMIZER)
            continue;
        ZpKernels ks;
        zp_cost_kernels(model, plan, (ZpComputeKind)kind, &ks);
        for (int i = 0; i < ks.n; i++) {
            const ZpKernel *k = &ks.k[i];
            /* the shapes of the model (time_kernel reads them from x) */
            x->batch = plan->micro_batch, x->seq = (int)model->seq_len;
            x->heads = (int)(model->heads / plan->mp);
            x->kv_heads = (int)(zp_model_kv_heads(model) / plan->mp);
            x->head_dim = (int)zp_model_head_dim(model);
            x->rms = model->norm == ZP_NORM_RMSNORM;
            x->swiglu = zp_model_gated(model);
            x->act = mlp_activation(model);
            x->fused = zp_attention_fused(plan->attention);
            x->m = (int)model->hidden; /* the row width of the block's row kernels */
            x->cols = (int)(model->vocab / plan->mp);
            double t;
            if (!time_kernel(x, k, &t, error))
                return FALSE;
            json_t *row = json_pack("{s:s, s:i, s:s, s:f, s:f, s:f}", "op",
                                    zp_sched_compute_name(kind), "kernel", i, "type",
                                    types[k->kind], "flops", k->flops, "bytes", k->bytes,
                                    "time_s", t);
            if (k->kind == ZP_KERNEL_GEMM) {
                json_object_set_new(row, "form", json_string(zp_gemm_form_name(k->sub)));
                json_object_set_new(row, "m", json_real(k->m));
                json_object_set_new(row, "n", json_real(k->n));
                json_object_set_new(row, "k", json_real(k->k));
                json_object_set_new(row, "head", json_boolean(k->head));
            } else if (k->kind == ZP_KERNEL_ATTENTION) {
                json_object_set_new(row, "seq_len", json_integer(x->seq));
                json_object_set_new(row, "head_dim", json_integer(x->head_dim));
                json_object_set_new(row, "heads", json_integer(x->heads));
                json_object_set_new(row, "batch", json_integer(x->batch));
                json_object_set_new(row, "backward", json_boolean(k->sub));
                json_object_set_new(row, "fused", json_boolean(x->fused));
            } else if (k->kind == ZP_KERNEL_EW) {
                json_object_set_new(row, "class", json_string(zp_ew_class_name(k->sub)));
            }
            json_array_append_new(out, row);
        }
    }
    return TRUE;
}

static gboolean run_launch(void *p, GError **error)
{
    (void)error;
    Bench *x = p;
    x->be->add(x->be, x->f[2], x->f[0], x->f[1], 1);
    return TRUE;
}

/* Kernels in a row for launch_stream_s: enough that one call's start and end are a small part
 * of the time. */
#define STREAM_LAUNCHES 64

/* STREAM_LAUNCHES one-element adds back to back: a kernel's cost among others in a stream,
 * where its launch overlaps the kernel before (on a device, the host's issue interval or the
 * device's least time a kernel, whichever is longer). */
static gboolean run_launch_stream(void *p, GError **error)
{
    (void)error;
    Bench *x = p;
    for (int i = 0; i < STREAM_LAUNCHES; i++)
        x->be->add(x->be, x->f[2], x->f[0], x->f[1], 1);
    return TRUE;
}

gboolean real_opbench_run(RealBackend *be, RealComm *comm, const ZpModel *model,
                          const ZpPlan *plan, void *root_json, GError **error)
{
    json_t *root = root_json;
    const gboolean device = be->mark != NULL;
    Bench x = {.be = be, .comm = comm, .rand = g_rand_new_with_seed(4321)};
    json_t *grid = json_array(), *attn = json_array(), *ew = json_array(), *ops = json_array();
    double launch_s = 0, launch_stream_s = 0;
    static const int attention_heads[] = {8, 32};
    /* The grids: up to 2^30 (a 1024^3 GEMM, 2 GFLOP) on a CPU core, 2^42 on a device;
     * aspects to 2^8 on a CPU (an LM head over a large vocabulary and few tokens: GPT-2's
     * 50,257 x 768 over 256 tokens is 2^7.6; a device's tokens keep it within 2^6), the
     * extra row costing little at these sizes. Attention: sequences to 1,024 at 8 heads on a
     * CPU (its cores share a sample's heads alike); on a device to 4,096 at 8 and 32 heads,
     * with the 8-head points to 1,024 also at batch 4. A device timed 8 heads alone to 8,192
     * until its model-shaped kernels (real_microbench's, at 12 and 25 heads) ran 24-63%
     * faster than that grid priced them (reports/gpu/h200); 32 heads to 4,096 holds the
     * largest buffers (2^29 elements) that 8 heads to 8,192 did. */
    gboolean ok = buffers(&x, 64, error) &&
                  real_timing_median_s(be, comm, run_launch, &x, 7, &launch_s, error) &&
                  real_timing_median_s(be, comm, run_launch_stream, &x, 7, &launch_stream_s,
                                       error) &&
                  bench_gemm_grid(&x, device ? 24 : 12, device ? 42 : 30, device ? 6 : 8, grid,
                                  error) &&
                  bench_attention_grid(&x, device ? 8 : 5, device ? 12 : 10, attention_heads,
                                       device ? 2 : 1, device, attn, error);
    /* Elementwise classes (a model's own norm and activation when given), 2^12 to 2^20
     * elements on a CPU, 2^16 to 2^26 on a device. A row kernel's rate moves with its width:
     * a device runs rows of 1,024 and the loss over 32,768 words (on an H200, rows of 256 ran
     * layer norm 1.85 times and the loss 3.2 times slower than GPT-2's 768 and 50,257); a
     * CPU keeps rows of 256, its runs' model kernels standing for the model's widths. */
    x.heads = x.kv_heads = 4, x.head_dim = 64;
    x.rms = model && model->norm == ZP_NORM_RMSNORM;
    x.swiglu = model && zp_model_gated(model);
    x.act = model ? mlp_activation(model) : REAL_ACT_GELU_TANH;
    ok = ok && bench_ew_classes(&x, device ? 16 : 12, device ? 26 : 20, device ? 1024 : 256,
                                device ? 32768 : 256, ew, error) &&
         bench_contention(&x, root, error);
    ok = ok && (!model || bench_ops(&x, model, plan, ops, error));
    /* The op sequence takes a step's own buffers: the kernels' go back first (its 3.5 GB
     * for gpt2-124m is now the microbenchmark's most). */
    free_buffers(&x);
    ok = ok && (!model || real_opseq_run(be, comm, model, plan, root, error));
    g_rand_free(x.rand);
    json_object_set_new(root, "launch_s", json_real(launch_s));
    json_object_set_new(root, "launch_stream_s", json_real(launch_stream_s / STREAM_LAUNCHES));
    json_object_set_new(root, "gemm_grid", grid);
    json_object_set_new(root, "attention_grid", attn);
    json_object_set_new(root, "elementwise", ew);
    if (model) {
        json_object_set_new(root, "ops", ops);
        json_object_set_new(root, "model", zp_model_to_json(model));
        json_object_set_new(root, "plan", zp_plan_to_json(plan));
    } else {
        json_decref(ops);
    }
    return ok;
}
