/* real_moe: a mixture of experts' sparse MLP forward and backward on a RealBackend, in the
 * phases between its dispatch and combine all-to-alls (real_moe.h says which and why). */
#include "real_moe.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* The routing of one sparse MLP on the host, rebuilt from its router buffer in each phase
 * (the buffer is the backend's; several layers' are live at once). */
struct RealMoe {
    RealBackend *be;
    RealMoeDims d;
    float *probs;   /* [T, E] softmax probabilities (fp32, modeling_mixtral's dtype=float) */
    int64_t *index; /* [T, k] chosen experts, most probable first */
    int *slot;      /* [T, k] the copy's row in the [E, C, h] buffer, -1 when dropped */
    float *weight;  /* [T, k] routing weights renormalised over the k */
    float *dweight; /* [T, k] their gradients (backward) */
    int kept, dropped;
};

int64_t real_moe_capacity(int64_t tokens, int64_t top_k, int64_t experts, double factor)
{
    if (!(factor > 0) || experts <= 0)
        return 0;
    return (int64_t)ceil((double)tokens * (double)top_k / (double)experts * factor);
}

static uint64_t rows_received(const RealMoeDims *d)
{
    return (uint64_t)d->experts * (uint64_t)d->capacity;
}

gboolean real_moe_dims_check(const RealMoeDims *d, GError **error)
{
    const int ep = real_moe_ep(d);
    if (d->tokens <= 0 || d->hidden <= 0 || d->experts <= 0 || d->top_k <= 0 ||
        d->expert_ffn <= 0 || d->capacity <= 0 || d->top_k > d->experts) {
        g_set_error(error, REAL_COMM_ERROR, 0,
                    "mixture of experts: tokens %d, hidden %d, experts %d, top_k %d, expert_ffn "
                    "%d and capacity %d must be positive, top_k at most the experts",
                    d->tokens, d->hidden, d->experts, d->top_k, d->expert_ffn, d->capacity);
        return FALSE;
    }
    if (d->ep < 0 || d->experts % ep != 0 || d->ep_rank < 0 || d->ep_rank >= ep) {
        g_set_error(error, REAL_COMM_ERROR, 0,
                    "mixture of experts: rank %d of an expert-parallel group of %d, which must "
                    "divide the %d experts", d->ep_rank, ep, d->experts);
        return FALSE;
    }
    /* GEMM dimensions are ints: a local expert's rows ep C, 2 f_e, and the T k copies. */
    const int64_t rows = (int64_t)ep * d->capacity, copies = (int64_t)d->tokens * d->top_k;
    guint64 bytes;
    if (rows > INT_MAX || copies > INT_MAX || d->expert_ffn > INT_MAX / 3 ||
        !g_uint64_checked_mul(&bytes, rows_received(d),
                              (guint64)d->hidden + 3 * (guint64)d->expert_ffn) ||
        !g_uint64_checked_mul(&bytes, bytes, 8)) {
        g_set_error(error, REAL_COMM_ERROR, 0,
                    "mixture of experts: %d experts x capacity %d rows of width %d + 3 x %d "
                    "overflow a GEMM dimension or 64-bit sizes", d->experts, d->capacity,
                    d->hidden, d->expert_ffn);
        return FALSE;
    }
    return TRUE;
}

uint64_t real_moe_router_elems(const RealMoeDims *d)
{
    return (uint64_t)d->hidden * (uint64_t)d->experts;
}

uint64_t real_moe_fc1_elems(const RealMoeDims *d)
{
    return (uint64_t)real_moe_local_experts(d) * d->hidden * 2 * (uint64_t)d->expert_ffn;
}

uint64_t real_moe_fc2_elems(const RealMoeDims *d)
{
    return (uint64_t)real_moe_local_experts(d) * d->expert_ffn * (uint64_t)d->hidden;
}

uint64_t real_moe_router_bytes(const RealMoeDims *d)
{
    return (uint64_t)d->tokens * (4 * (uint64_t)d->experts + 8 * (uint64_t)d->top_k);
}

uint64_t real_moe_a2a_elems(const RealMoeDims *d)
{
    return rows_received(d) * (uint64_t)d->hidden;
}

uint64_t real_moe_saved_bytes(const RealMoeDims *d)
{
    return sizeof(RealBf16) *
           (rows_received(d) * ((uint64_t)d->hidden + 3 * (uint64_t)d->expert_ffn) +
            (uint64_t)d->tokens * d->top_k * (uint64_t)d->hidden);
}

/* The saved tensors, bf16: the experts' inputs [E/ep][ep C][h], gate and up [.., 2 f_e], the
 * gated product [.., f_e], and each token's k returned copies [T k][h]. */
typedef struct {
    RealBf16 *in, *gate_up, *act, *combined;
} Saved;

static Saved saved_view(const RealMoeDims *d, const void *base)
{
    const uint64_t r = rows_received(d);
    Saved s = {.in = (RealBf16 *)base};
    s.gate_up = s.in + r * d->hidden;
    s.act = s.gate_up + r * 2 * (uint64_t)d->expert_ffn;
    s.combined = s.act + r * (uint64_t)d->expert_ffn;
    return s;
}

RealMoe *real_moe_new(RealBackend *be, const RealMoeDims *d, GError **error)
{
    if (!real_moe_dims_check(d, error))
        return NULL;
    RealMoe *m = g_new0(RealMoe, 1);
    const size_t copies = (size_t)d->tokens * d->top_k;
    m->be = be;
    m->d = *d;
    m->probs = g_new(float, (size_t)d->tokens * d->experts);
    m->index = g_new(int64_t, copies);
    m->slot = g_new(int, copies);
    m->weight = g_new(float, copies);
    m->dweight = g_new(float, copies);
    return m;
}

void real_moe_free(RealMoe *m)
{
    if (!m)
        return;
    g_free(m->probs);
    g_free(m->index);
    g_free(m->slot);
    g_free(m->weight);
    g_free(m->dweight);
    g_free(m);
}

const RealMoeDims *real_moe_dims(const RealMoe *m)
{
    return &m->d;
}

void real_moe_route_counts(const RealMoe *m, int *kept, int *dropped)
{
    *kept = m->kept;
    *dropped = m->dropped;
}

static gboolean nomem(GError **error, const char *what)
{
    g_set_error(error, REAL_COMM_ERROR, 0, "mixture of experts: no memory left for %s", what);
    return FALSE;
}

static float *workspace(RealMoe *m, uint64_t floats)
{
    return m->be->alloc(m->be, floats * sizeof(float), REAL_MEM_WORKSPACE);
}

/* Slots and weights from probs and index: every expert's copies in DeepSpeed's order (all
 * first choices in token order, then all second choices, ...), the first C kept. */
static void place(RealMoe *m)
{
    const RealMoeDims *d = &m->d;
    const int T = d->tokens, k = d->top_k, E = d->experts;
    int *filled = g_new0(int, E);
    m->kept = m->dropped = 0;
    for (int c = 0; c < k; c++)
        for (int t = 0; t < T; t++) {
            const int e = (int)m->index[(size_t)t * k + c];
            int *slot = &m->slot[(size_t)t * k + c];
            if (filled[e] < d->capacity) {
                *slot = e * d->capacity + filled[e]++;
                m->kept++;
            } else {
                *slot = -1;
                m->dropped++;
            }
        }
    g_free(filled);
    for (int t = 0; t < T; t++) {
        double sum = 0;
        for (int c = 0; c < k; c++)
            sum += m->probs[(size_t)t * E + m->index[(size_t)t * k + c]];
        for (int c = 0; c < k; c++)
            m->weight[(size_t)t * k + c] =
                (float)(m->probs[(size_t)t * E + m->index[(size_t)t * k + c]] / sum);
    }
}

/* The router buffer's parts: int64 [T, k] first (aligned wherever the buffer is), then fp32
 * [T, E]. */
static float *router_probs(const RealMoe *m, const void *router)
{
    return (float *)((char *)router + sizeof(int64_t) * (size_t)m->d.tokens * m->d.top_k);
}
static int64_t *router_index(const RealMoe *m, const void *router)
{
    (void)m;
    return (int64_t *)router;
}

/* Reads the routing back from the backend's router buffer and places the copies. */
static void load_routing(RealMoe *m, const void *router)
{
    const RealMoeDims *d = &m->d;
    m->be->copy(m->be, m->probs, router_probs(m, router),
                sizeof(float) * (size_t)d->tokens * d->experts);
    m->be->copy(m->be, m->index, router_index(m, router),
                sizeof(int64_t) * (size_t)d->tokens * d->top_k);
    place(m);
}

/* Softmax of each row of logits (in double, stored fp32) and its top k, ties to the lower
 * expert (torch.topk's order for distinct values). */
static void softmax_topk(RealMoe *m, const float *logits)
{
    const RealMoeDims *d = &m->d;
    const int E = d->experts, k = d->top_k;
    for (int t = 0; t < d->tokens; t++) {
        const float *z = logits + (size_t)t * E;
        float *p = m->probs + (size_t)t * E;
        double most = z[0], sum = 0;
        for (int e = 1; e < E; e++)
            most = fmax(most, z[e]);
        for (int e = 0; e < E; e++)
            sum += exp((double)z[e] - most);
        for (int e = 0; e < E; e++)
            p[e] = (float)(exp((double)z[e] - most) / sum);
        for (int c = 0; c < k; c++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                gboolean taken = FALSE;
                for (int j = 0; j < c; j++)
                    taken = taken || m->index[(size_t)t * k + j] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            m->index[(size_t)t * k + c] = best;
        }
    }
}

gboolean real_moe_route_only(RealMoe *m, const RealMoeParams *p, const float *x, void *router,
                             GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int T = d->tokens, E = d->experts, h = d->hidden, k = d->top_k;
    float *logits = workspace(m, (uint64_t)T * E);
    if (!logits)
        return nomem(error, "the router's logits");
    gboolean ok = be->gemm(be, false, false, T, E, h, 1.0f, REAL_DTYPE_F32, x, REAL_DTYPE_BF16,
                           p->router, 0.0f, logits);
    if (ok) {
        float *host = g_new(float, (size_t)T * E);
        be->copy(be, host, logits, sizeof(float) * (size_t)T * E);
        softmax_topk(m, host);
        g_free(host);
        place(m);
        be->copy(be, router_probs(m, router), m->probs, sizeof(float) * (size_t)T * E);
        be->copy(be, router_index(m, router), m->index, sizeof(int64_t) * (size_t)T * k);
    }
    be->free(be, logits);
    return ok ? TRUE : nomem(error, "the router's GEMM");
}

gboolean real_moe_permute(RealMoe *m, const void *router, const float *x, RealBf16 *send,
                          GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int T = d->tokens, h = d->hidden, k = d->top_k;
    const size_t th = (size_t)T * h;
    load_routing(m, router);
    RealBf16 *xb = be->alloc(be, th * sizeof(RealBf16), REAL_MEM_WORKSPACE);
    if (!xb)
        return nomem(error, "the permutation");
    /* The padded dispatch buffer: zeros, then each kept copy of x (bf16) at its slot. */
    be->f32_to_bf16(be, xb, x, th);
    be->fill(be, send, 0, real_moe_a2a_elems(d) * sizeof(RealBf16));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < k; c++) {
            const int s = m->slot[(size_t)t * k + c];
            if (s >= 0)
                be->copy(be, send + (size_t)s * h, xb + (size_t)t * h,
                         (size_t)h * sizeof(RealBf16));
        }
    be->free(be, xb);
    return TRUE;
}

gboolean real_moe_route(RealMoe *m, const RealMoeParams *p, const float *x, void *router,
                        RealBf16 *send, GError **error)
{
    return real_moe_route_only(m, p, x, router, error) &&
           real_moe_permute(m, router, x, send, error);
}

/* The rows of local expert j from source rank q: in an all-to-all's buffer [ep][E/ep][C][h]
 * at (q E/ep + j) C, in the experts' own [E/ep][ep C][h] at (j ep + q) C. */
static size_t a2a_row(const RealMoeDims *d, int q, int j)
{
    return ((size_t)q * real_moe_local_experts(d) + (size_t)j) * (size_t)d->capacity;
}
static size_t expert_row(const RealMoeDims *d, int q, int j)
{
    return ((size_t)j * real_moe_ep(d) + (size_t)q) * (size_t)d->capacity;
}

gboolean real_moe_experts_fwd(RealMoe *m, const RealMoeParams *p, const RealBf16 *recv,
                              void *saved, RealBf16 *out, GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int ep = real_moe_ep(d), El = real_moe_local_experts(d), h = d->hidden;
    const int fe = d->expert_ffn, rows = ep * d->capacity;
    /* Not saving: the saved tensors go to a workspace of the same size. */
    void *base = saved ? saved : be->alloc(be, real_moe_saved_bytes(d), REAL_MEM_WORKSPACE);
    float *ws = workspace(m, (uint64_t)rows * (3 * (uint64_t)fe + h));
    if (!base || !ws) {
        if (!saved)
            be->free(be, base);
        be->free(be, ws);
        return nomem(error, "the experts' forward");
    }
    const Saved s = saved_view(d, base);
    float *u = ws, *act = u + (size_t)rows * 2 * fe, *o = act + (size_t)rows * fe;
    const size_t block = (size_t)d->capacity * h;
    for (int q = 0; q < ep; q++)
        for (int j = 0; j < El; j++)
            be->copy(be, s.in + expert_row(d, q, j) * h, recv + a2a_row(d, q, j) * h,
                     block * sizeof(RealBf16));
    gboolean ok = TRUE;
    for (int j = 0; ok && j < El; j++) {
        const size_t row0 = expert_row(d, 0, j);
        const RealBf16 *w1 = p->fc1 + (size_t)j * h * 2 * fe, *w2 = p->fc2 + (size_t)j * fe * h;
        ok = be->gemm(be, false, false, rows, 2 * fe, h, 1.0f, REAL_DTYPE_BF16,
                      s.in + row0 * h, REAL_DTYPE_BF16, w1, 0.0f, u);
        if (!ok)
            break;
        /* Rounded to bf16 as stored, so a recomputed forward and the backward see the same. */
        be->round_bf16(be, u, (size_t)rows * 2 * fe);
        be->f32_to_bf16(be, s.gate_up + row0 * 2 * fe, u, (size_t)rows * 2 * fe);
        be->glu_fwd(be, act, u, rows, fe, d->act);
        be->round_bf16(be, act, (size_t)rows * fe);
        be->f32_to_bf16(be, s.act + row0 * fe, act, (size_t)rows * fe);
        ok = be->gemm(be, false, false, rows, h, fe, 1.0f, REAL_DTYPE_F32, act, REAL_DTYPE_BF16,
                      w2, 0.0f, o);
        for (int q = 0; ok && q < ep; q++)
            be->f32_to_bf16(be, out + a2a_row(d, q, j) * h, o + (size_t)q * block, block);
    }
    be->free(be, ws);
    if (!saved)
        be->free(be, base);
    return ok ? TRUE : nomem(error, "the experts' GEMMs");
}

/* Each token's k routing weights as a device array [T, k] (fp32), from the host's. */
static float *device_weights(RealMoe *m, const float *host)
{
    const size_t n = (size_t)m->d.tokens * m->d.top_k;
    float *w = workspace(m, n);
    if (w)
        m->be->copy(m->be, w, host, n * sizeof(float));
    return w;
}

gboolean real_moe_unpermute_fwd(RealMoe *m, const void *router, const RealBf16 *ret,
                                void *saved, float *y, GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int T = d->tokens, k = d->top_k, h = d->hidden;
    load_routing(m, router);
    RealBf16 *comb = saved ? saved_view(d, saved).combined
                           : be->alloc(be, sizeof(RealBf16) * (size_t)T * k * h,
                                       REAL_MEM_WORKSPACE);
    float *w = device_weights(m, m->weight);
    gboolean ok = comb && w;
    for (int t = 0; ok && t < T; t++) {
        for (int c = 0; c < k; c++) {
            const int s = m->slot[(size_t)t * k + c];
            RealBf16 *row = comb + ((size_t)t * k + c) * h;
            if (s >= 0)
                be->copy(be, row, ret + (size_t)s * h, (size_t)h * sizeof(RealBf16));
            else
                be->fill(be, row, 0, (size_t)h * sizeof(RealBf16));
        }
        /* y[t] += w[t, :] comb[t] ([1, k] x [k, h]): the combine's einsum "sec,ecm->sm". */
        ok = be->gemm(be, false, false, 1, h, k, 1.0f, REAL_DTYPE_F32, w + (size_t)t * k,
                      REAL_DTYPE_BF16, comb + (size_t)t * k * h, 1.0f, y + (size_t)t * h);
    }
    if (!saved)
        be->free(be, comb);
    be->free(be, w);
    return ok ? TRUE : nomem(error, "the combine");
}

/* The logits' gradient from the routing weights' (host, in place over probs):
 * w_c = p_c / S with S the sum of the k chosen probabilities, so dp_c = (dw_c - sum_j dw_j w_j)
 * / S for the chosen, 0 for the rest; then the softmax's dz_e = p_e (dp_e - sum_j p_j dp_j). */
static void router_grad(RealMoe *m)
{
    const RealMoeDims *d = &m->d;
    const int E = d->experts, k = d->top_k;
    double *dp = g_new(double, E);
    for (int t = 0; t < d->tokens; t++) {
        float *p = m->probs + (size_t)t * E;
        const int64_t *idx = m->index + (size_t)t * k;
        const float *w = m->weight + (size_t)t * k, *dw = m->dweight + (size_t)t * k;
        double sum = 0, dot = 0, pdp = 0;
        for (int c = 0; c < k; c++) {
            sum += p[idx[c]];
            dot += (double)dw[c] * w[c];
        }
        for (int e = 0; e < E; e++)
            dp[e] = 0;
        for (int c = 0; c < k; c++)
            dp[idx[c]] = ((double)dw[c] - dot) / sum;
        for (int e = 0; e < E; e++)
            pdp += p[e] * dp[e];
        for (int e = 0; e < E; e++)
            p[e] = (float)(p[e] * (dp[e] - pdp));
    }
    g_free(dp);
}

gboolean real_moe_unpermute_bwd(RealMoe *m, void *router, const void *saved, const float *dy,
                                RealBf16 *send, GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int T = d->tokens, k = d->top_k, h = d->hidden;
    load_routing(m, router);
    const Saved s = saved_view(d, saved);
    float *w = device_weights(m, m->weight);
    float *ws = workspace(m, (size_t)T * k + (size_t)k * h);
    gboolean ok = w && ws;
    float *dw = ws, *drow = ws + (size_t)T * k;
    if (ok)
        be->fill(be, send, 0, real_moe_a2a_elems(d) * sizeof(RealBf16));
    for (int t = 0; ok && t < T; t++) {
        const float *dyt = dy + (size_t)t * h;
        /* dw[t, c] = comb[t, c] . dy[t]; the copies' gradients w[t, c] dy[t]. */
        ok = be->gemm(be, false, true, k, 1, h, 1.0f, REAL_DTYPE_BF16,
                      s.combined + (size_t)t * k * h, REAL_DTYPE_F32, dyt, 0.0f,
                      dw + (size_t)t * k) &&
             be->gemm(be, false, false, k, h, 1, 1.0f, REAL_DTYPE_F32, w + (size_t)t * k,
                      REAL_DTYPE_F32, dyt, 0.0f, drow);
        for (int c = 0; ok && c < k; c++) {
            const int slot = m->slot[(size_t)t * k + c];
            if (slot >= 0)
                be->f32_to_bf16(be, send + (size_t)slot * h, drow + (size_t)c * h, (size_t)h);
        }
    }
    if (ok) {
        be->copy(be, m->dweight, dw, sizeof(float) * (size_t)T * k);
        router_grad(m);
        be->copy(be, router_probs(m, router), m->probs, sizeof(float) * (size_t)T * d->experts);
    }
    be->free(be, w);
    be->free(be, ws);
    return ok ? TRUE : nomem(error, "the combine's backward");
}

gboolean real_moe_experts_bwd(RealMoe *m, const RealMoeParams *p, const void *saved,
                              const RealBf16 *recv, const RealMoeGrads *g, RealBf16 *out,
                              GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int ep = real_moe_ep(d), El = real_moe_local_experts(d), h = d->hidden;
    const int fe = d->expert_ffn, rows = ep * d->capacity;
    const Saved s = saved_view(d, saved);
    const size_t block = (size_t)d->capacity * h;
    float *ws = workspace(m, (uint64_t)rows * (2 * (uint64_t)h + 3 * (uint64_t)fe));
    if (!ws)
        return nomem(error, "the experts' backward");
    float *dout = ws, *dact = dout + (size_t)rows * h, *u = dact + (size_t)rows * fe;
    float *dx = u + (size_t)rows * 2 * fe;
    gboolean ok = TRUE;
    for (int j = 0; ok && j < El; j++) {
        const size_t row0 = expert_row(d, 0, j);
        const RealBf16 *w1 = p->fc1 + (size_t)j * h * 2 * fe, *w2 = p->fc2 + (size_t)j * fe * h;
        for (int q = 0; q < ep; q++)
            be->bf16_to_f32(be, dout + (size_t)q * block, recv + a2a_row(d, q, j) * h, block);
        be->bf16_to_f32(be, u, s.gate_up + row0 * 2 * fe, (size_t)rows * 2 * fe);
        ok = be->gemm(be, true, false, fe, h, rows, 1.0f, REAL_DTYPE_BF16, s.act + row0 * fe,
                      REAL_DTYPE_F32, dout, 1.0f, g->fc2 + (size_t)j * fe * h) &&
             be->gemm(be, false, true, rows, fe, h, 1.0f, REAL_DTYPE_F32, dout, REAL_DTYPE_BF16,
                      w2, 0.0f, dact);
        if (!ok)
            break;
        be->glu_bwd(be, u, dact, u, rows, fe, d->act);
        ok = be->gemm(be, true, false, h, 2 * fe, rows, 1.0f, REAL_DTYPE_BF16, s.in + row0 * h,
                      REAL_DTYPE_F32, u, 1.0f, g->fc1 + (size_t)j * h * 2 * fe) &&
             be->gemm(be, false, true, rows, h, 2 * fe, 1.0f, REAL_DTYPE_F32, u,
                      REAL_DTYPE_BF16, w1, 0.0f, dx);
        for (int q = 0; ok && q < ep; q++)
            be->f32_to_bf16(be, out + a2a_row(d, q, j) * h, dx + (size_t)q * block, block);
    }
    be->free(be, ws);
    return ok ? TRUE : nomem(error, "the experts' backward GEMMs");
}

gboolean real_moe_route_bwd(RealMoe *m, const RealMoeParams *p, const void *router,
                            const RealBf16 *x_bf16, const RealBf16 *ret, float *dx,
                            const RealMoeGrads *g, GError **error)
{
    RealBackend *be = m->be;
    const RealMoeDims *d = &m->d;
    const int T = d->tokens, E = d->experts, k = d->top_k, h = d->hidden;
    /* The router buffer holds the logits' gradient now (unpermute_bwd); the index is kept. */
    be->copy(be, m->index, router_index(m, router), sizeof(int64_t) * (size_t)T * k);
    float *ws = workspace(m, (size_t)h);
    if (!ws)
        return nomem(error, "the router's backward");
    const float *dlogits = router_probs(m, router);
    gboolean ok = be->gemm(be, false, true, T, h, E, 1.0f, REAL_DTYPE_F32, dlogits,
                           REAL_DTYPE_BF16, p->router, 0.0f, dx) &&
                  be->gemm(be, true, false, h, E, T, 1.0f, REAL_DTYPE_BF16, x_bf16,
                           REAL_DTYPE_F32, dlogits, 1.0f, g->router);
    /* The slots of the forward: place() reads only the index (its weights are not used). */
    int *filled = g_new0(int, E);
    for (int c = 0; ok && c < k; c++)
        for (int t = 0; t < T; t++) {
            const int e = (int)m->index[(size_t)t * k + c];
            if (filled[e] >= d->capacity)
                continue;
            const size_t slot = (size_t)e * d->capacity + (size_t)filled[e]++;
            be->bf16_to_f32(be, ws, ret + slot * h, (size_t)h);
            be->add(be, dx + (size_t)t * h, dx + (size_t)t * h, ws, (size_t)h);
        }
    g_free(filled);
    be->free(be, ws);
    return ok ? TRUE : nomem(error, "the router's backward GEMMs");
}

gboolean real_moe_alltoall(RealMoe *m, RealComm *ep, const RealBf16 *send, RealBf16 *recv,
                           GError **error)
{
    const RealMoeDims *d = &m->d;
    const uint64_t n = real_moe_a2a_elems(d) / (uint64_t)real_moe_ep(d);
    if (!ep) {
        if (real_moe_ep(d) != 1) {
            g_set_error(error, REAL_COMM_ERROR, 0,
                        "mixture of experts: an expert-parallel group of %d needs a "
                        "communicator", real_moe_ep(d));
            return FALSE;
        }
        m->be->copy(m->be, recv, send, n * sizeof(RealBf16));
        return TRUE;
    }
    if (ep->size != real_moe_ep(d) || ep->rank != d->ep_rank || !ep->alltoall_bf16) {
        g_set_error(error, REAL_COMM_ERROR, 0,
                    "mixture of experts: the expert-parallel communicator (rank %d of %d%s) is "
                    "not rank %d of %d", ep->rank, ep->size,
                    ep->alltoall_bf16 ? "" : ", without an all-to-all", d->ep_rank,
                    real_moe_ep(d));
        return FALSE;
    }
    return ep->alltoall_bf16(ep, send, recv, (size_t)n, error);
}
