/* test_real_moe: zreal's mixture-of-experts MLP (real_moe) on the CPU backend — its forward and
 * every gradient (router included) against a double-precision reference with the same routing
 * and capacity drops, expert parallelism over two in-process ranks against one rank, and the
 * communicators' all-to-all. */
#include "real_model_common.h"
#include "real_moe.h"
#include "zp_ep.h"

/* A small sparse MLP: 4 experts, top-2, as the tiny MoE model's. */
enum { T = 16, H = 16, E = 4, K = 2, FE = 8 };

typedef struct {
    RealMoeDims d;
    double *x, *router, *fc1, *fc2, *r; /* r: J = sum r . y */
} Ref;

static int ref_capacity(double factor)
{
    return (int)real_moe_capacity(T, K, E, factor);
}

/* y [T, H] in double: softmax, top-k (ties to the lower expert), DeepSpeed's placement (first
 * choices first, in token order, C per expert), weights renormalised over the k, SwiGLU experts. */
static void ref_forward(const Ref *f, double *y, int *dropped)
{
    const int C = f->d.capacity;
    int filled[E] = {0}, idx[T][K];
    double p[T][E];
    *dropped = 0;
    for (int t = 0; t < T; t++) {
        double z[E], most = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) {
            z[e] = 0;
            for (int i = 0; i < H; i++)
                z[e] += f->x[t * H + i] * f->router[i * E + e];
            most = fmax(most, z[e]);
        }
        for (int e = 0; e < E; e++)
            sum += exp(z[e] - most);
        for (int e = 0; e < E; e++)
            p[t][e] = exp(z[e] - most) / sum;
        for (int c = 0; c < K; c++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if ((c == 0 || idx[t][0] != e) && (best < 0 || p[t][e] > p[t][best]))
                    best = e;
            idx[t][c] = best;
        }
    }
    gboolean kept[T][K];
    for (int c = 0; c < K; c++)
        for (int t = 0; t < T; t++) {
            kept[t][c] = filled[idx[t][c]] < C;
            filled[idx[t][c]] += kept[t][c];
            *dropped += !kept[t][c];
        }
    memset(y, 0, sizeof(double) * T * H);
    for (int t = 0; t < T; t++) {
        const double s = p[t][idx[t][0]] + p[t][idx[t][1]];
        for (int c = 0; c < K; c++) {
            if (!kept[t][c])
                continue;
            const int e = idx[t][c];
            const double *w1 = f->fc1 + (size_t)e * H * 2 * FE, *w2 = f->fc2 + (size_t)e * FE * H;
            double act[FE];
            for (int j = 0; j < FE; j++) {
                double g = 0, u = 0;
                for (int i = 0; i < H; i++) {
                    g += f->x[t * H + i] * w1[i * 2 * FE + j];
                    u += f->x[t * H + i] * w1[i * 2 * FE + FE + j];
                }
                act[j] = g / (1 + exp(-g)) * u;
            }
            for (int i = 0; i < H; i++) {
                double o = 0;
                for (int j = 0; j < FE; j++)
                    o += act[j] * w2[j * H + i];
                y[t * H + i] += p[t][e] / s * o;
            }
        }
    }
}

static double ref_objective(void *ctx)
{
    const Ref *f = ctx;
    double y[T * H], j = 0;
    int dropped;
    ref_forward(f, y, &dropped);
    for (int i = 0; i < T * H; i++)
        j += f->r[i] * y[i];
    return j;
}

/* d J / d v[i] for every i (v is one of the reference's arrays, perturbed in place). */
static void numeric_grad(double *v, size_t n, double eps, const Ref *f, double *out)
{
    for (size_t i = 0; i < n; i++) {
        const double saved = v[i];
        v[i] = saved + eps;
        const double plus = ref_objective((void *)f);
        v[i] = saved - eps;
        const double minus = ref_objective((void *)f);
        v[i] = saved;
        out[i] = (plus - minus) / (2.0 * eps);
    }
}

/* Relative error of a against b in the 2-norm. */
static double rel_err(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* bf16 values of N(0, std) in both precisions. */
static RealBf16 *bf16_normal(TestRng *rng, double **widened, size_t n, double std)
{
    RealBf16 *b = g_new(RealBf16, n);
    *widened = g_new(double, n);
    for (size_t i = 0; i < n; i++) {
        b[i] = real_bf16_from_f32((float)(std * rng_normal(rng)));
        (*widened)[i] = real_bf16_to_f32(b[i]);
    }
    return b;
}

/* Every phase of one rank's sparse MLP with an exchange `a2a` between them (NULL: the ep-1
 * copy): y from x, then dx and the gradients from dy. */
typedef void (*Exchange)(RealBf16 *const send[], RealBf16 *const recv[], size_t n, int ranks);

typedef struct {
    RealMoe *moe;
    RealMoeParams p;
    RealMoeGrads g;
    float *x, *y, *dy, *dx;
    RealBf16 *xb, *send, *recv, *ret;
    void *router, *saved;
} Rank;

static Rank rank_new(RealBackend *be, const RealMoeDims *d)
{
    Rank r = {0};
    r.moe = real_moe_new(be, d, NULL);
    g_assert_nonnull(r.moe);
    const size_t n = real_moe_a2a_elems(d);
    r.send = g_new0(RealBf16, n);
    r.recv = g_new0(RealBf16, n);
    r.ret = g_new0(RealBf16, n);
    r.router = g_malloc0(real_moe_router_bytes(d));
    r.saved = g_malloc0(real_moe_saved_bytes(d));
    r.y = g_new0(float, T * H);
    r.dx = g_new0(float, T * H);
    r.xb = g_new0(RealBf16, T * H);
    r.g.router = g_new0(float, real_moe_router_elems(d));
    r.g.fc1 = g_new0(float, real_moe_fc1_elems(d));
    r.g.fc2 = g_new0(float, real_moe_fc2_elems(d));
    return r;
}

static void rank_free(Rank *r)
{
    real_moe_free(r->moe);
    g_free(r->send), g_free(r->recv), g_free(r->ret), g_free(r->router), g_free(r->saved);
    g_free(r->y), g_free(r->dx), g_free(r->xb);
    g_free(r->g.router), g_free(r->g.fc1), g_free(r->g.fc2);
}

/* recv_r [q n ..] = send_q [r n ..]: the all-to-all between in-process ranks. */
static void exchange(Rank *ranks, int n_ranks, RealBf16 *(*from)(Rank *), RealBf16 *(*to)(Rank *))
{
    const size_t n = real_moe_a2a_elems(real_moe_dims(ranks[0].moe)) / (size_t)n_ranks;
    for (int r = 0; r < n_ranks; r++)
        for (int q = 0; q < n_ranks; q++)
            memcpy(to(&ranks[r]) + (size_t)q * n, from(&ranks[q]) + (size_t)r * n,
                   n * sizeof(RealBf16));
}
static RealBf16 *send_of(Rank *r) { return r->send; }
static RealBf16 *recv_of(Rank *r) { return r->recv; }
static RealBf16 *ret_of(Rank *r) { return r->ret; }

/* The forward and backward of n_ranks ranks in lock step, exchanging between the phases. */
static void run_ranks(Rank *ranks, int n_ranks)
{
    GError *error = NULL;
    for (int r = 0; r < n_ranks; r++) {
        Rank *k = &ranks[r];
        for (int i = 0; i < T * H; i++)
            k->xb[i] = real_bf16_from_f32(k->x[i]);
        g_assert_true(real_moe_route(k->moe, &k->p, k->x, k->router, k->send, &error));
    }
    exchange(ranks, n_ranks, send_of, recv_of);
    for (int r = 0; r < n_ranks; r++)
        g_assert_true(real_moe_experts_fwd(ranks[r].moe, &ranks[r].p, ranks[r].recv,
                                           ranks[r].saved, ranks[r].recv, &error));
    exchange(ranks, n_ranks, recv_of, ret_of);
    for (int r = 0; r < n_ranks; r++)
        g_assert_true(real_moe_unpermute_fwd(ranks[r].moe, ranks[r].router, ranks[r].ret,
                                             ranks[r].saved, ranks[r].y, &error));
    for (int r = 0; r < n_ranks; r++)
        g_assert_true(real_moe_unpermute_bwd(ranks[r].moe, ranks[r].router, ranks[r].saved,
                                             ranks[r].dy, ranks[r].send, &error));
    exchange(ranks, n_ranks, send_of, recv_of);
    for (int r = 0; r < n_ranks; r++)
        g_assert_true(real_moe_experts_bwd(ranks[r].moe, &ranks[r].p, ranks[r].saved,
                                           ranks[r].recv, &ranks[r].g, ranks[r].recv, &error));
    exchange(ranks, n_ranks, recv_of, ret_of);
    for (int r = 0; r < n_ranks; r++)
        g_assert_true(real_moe_route_bwd(ranks[r].moe, &ranks[r].p, ranks[r].router,
                                         ranks[r].xb, ranks[r].ret, ranks[r].dx, &ranks[r].g,
                                         &error));
    g_assert_no_error(error);
}

/* The forward and every gradient against the double reference (finite differences of its
 * objective), with copies dropped (factor 1) and without (factor E / k). */
static void test_reference(gconstpointer data)
{
    const double factor = *(const double *)data;
    TestRng rng = {7};
    RealBackend *be = real_cpu_backend_new();
    Ref f = {.d = {.tokens = T, .hidden = H, .experts = E, .top_k = K, .expert_ffn = FE,
                   .capacity = ref_capacity(factor), .act = REAL_ACT_SILU}};
    RealBf16 *xb = bf16_normal(&rng, &f.x, T * H, 1.0);
    RealBf16 *router = bf16_normal(&rng, &f.router, H * E, 0.5);
    RealBf16 *fc1 = bf16_normal(&rng, &f.fc1, (size_t)E * H * 2 * FE, 0.3);
    RealBf16 *fc2 = bf16_normal(&rng, &f.fc2, (size_t)E * FE * H, 0.3);
    f.r = g_new(double, T * H);
    float *dy = g_new(float, T * H), *x = g_new(float, T * H);
    for (int i = 0; i < T * H; i++) {
        f.r[i] = rng_normal(&rng);
        dy[i] = (float)f.r[i];
        x[i] = (float)f.x[i];
    }
    Rank k = rank_new(be, &f.d);
    k.p = (RealMoeParams){router, fc1, fc2};
    k.x = x, k.dy = dy;
    run_ranks(&k, 1);
    double y[T * H];
    int dropped, kept, moe_dropped;
    ref_forward(&f, y, &dropped);
    real_moe_route_counts(k.moe, &kept, &moe_dropped);
    g_assert_cmpint(moe_dropped, ==, dropped);
    g_assert_cmpint(kept + moe_dropped, ==, T * K);
    if (factor < 2)
        g_assert_cmpint(dropped, >, 0); /* the drops are exercised */
    else
        g_assert_cmpint(dropped, ==, 0);
    g_assert_cmpfloat(rel_err(k.y, y, T * H), <, 1e-2);
    /* bf16 storage of the experts' inputs, gate and up, product, outputs and gradients in
     * transit: a few bf16 roundings (2^-9 each) against the exact derivative. */
    struct {
        double *v;
        size_t n;
        const float *got;
    } wrt[] = {{f.x, T * H, k.dx},
               {f.router, H * E, k.g.router},
               {f.fc1, (size_t)E * H * 2 * FE, k.g.fc1},
               {f.fc2, (size_t)E * FE * H, k.g.fc2}};
    for (size_t w = 0; w < G_N_ELEMENTS(wrt); w++) {
        double *num = g_new(double, wrt[w].n);
        numeric_grad(wrt[w].v, wrt[w].n, 1e-5, &f, num);
        const double err = rel_err(wrt[w].got, num, wrt[w].n);
        if (g_test_verbose())
            g_printerr("gradient %zu: relative error %.2e\n", w, err);
        g_assert_cmpfloat(err, <, 2e-2);
        g_free(num);
    }
    rank_free(&k);
    g_free(xb), g_free(router), g_free(fc1), g_free(fc2);
    g_free(f.x), g_free(f.router), g_free(f.fc1), g_free(f.fc2), g_free(f.r);
    g_free(dy), g_free(x);
    be->destroy(be);
}

/* Two ranks at EP 2, each routing its own tokens to the other's experts through the
 * all-to-alls, compute what one rank holding every expert computes for each rank's tokens:
 * the same outputs and input gradients, and the experts' gradients summed over both. */
static void test_ep_matches_one_rank(void)
{
    TestRng rng = {11};
    RealBackend *be = real_cpu_backend_new();
    const RealMoeDims one = {.tokens = T, .hidden = H, .experts = E, .top_k = K,
                             .expert_ffn = FE, .capacity = ref_capacity(1.0),
                             .act = REAL_ACT_SILU};
    double *wide;
    RealBf16 *router = bf16_normal(&rng, &wide, H * E, 0.5);
    g_free(wide);
    RealBf16 *fc1 = bf16_normal(&rng, &wide, (size_t)E * H * 2 * FE, 0.3);
    g_free(wide);
    RealBf16 *fc2 = bf16_normal(&rng, &wide, (size_t)E * FE * H, 0.3);
    g_free(wide);
    float *x[2], *dy[2];
    for (int r = 0; r < 2; r++) {
        x[r] = g_new(float, T * H);
        dy[r] = g_new(float, T * H);
        for (int i = 0; i < T * H; i++) {
            x[r][i] = real_bf16_to_f32(real_bf16_from_f32((float)rng_normal(&rng)));
            dy[r][i] = (float)rng_normal(&rng);
        }
    }
    /* One rank, every expert, each token set in turn (gradients accumulating). */
    Rank solo = rank_new(be, &one);
    solo.p = (RealMoeParams){router, fc1, fc2};
    float *y1[2], *dx1[2];
    for (int r = 0; r < 2; r++) {
        solo.x = x[r], solo.dy = dy[r];
        memset(solo.y, 0, sizeof(float) * T * H);
        run_ranks(&solo, 1);
        y1[r] = g_memdup2(solo.y, sizeof(float) * T * H);
        dx1[r] = g_memdup2(solo.dx, sizeof(float) * T * H);
    }
    /* EP 2: rank r holds experts 2r, 2r + 1. */
    Rank ranks[2];
    int total_dropped = 0;
    for (int r = 0; r < 2; r++) {
        RealMoeDims d = one;
        d.ep = 2, d.ep_rank = r;
        ranks[r] = rank_new(be, &d);
        ranks[r].p = (RealMoeParams){router, fc1 + real_moe_fc1_elems(&d) * r,
                                     fc2 + real_moe_fc2_elems(&d) * r};
        ranks[r].x = x[r], ranks[r].dy = dy[r];
    }
    run_ranks(ranks, 2);
    for (int r = 0; r < 2; r++) {
        int kept, dropped;
        real_moe_route_counts(ranks[r].moe, &kept, &dropped);
        total_dropped += dropped;
        for (int i = 0; i < T * H; i++) {
            g_assert_cmpfloat(fabsf(ranks[r].y[i] - y1[r][i]), <=, 1e-6f * (1 + fabsf(y1[r][i])));
            g_assert_cmpfloat(fabsf(ranks[r].dx[i] - dx1[r][i]), <=,
                              1e-6f * (1 + fabsf(dx1[r][i])));
        }
        const uint64_t n1 = real_moe_fc1_elems(real_moe_dims(ranks[r].moe));
        const uint64_t n2 = real_moe_fc2_elems(real_moe_dims(ranks[r].moe));
        for (uint64_t i = 0; i < n1; i++)
            g_assert_cmpfloat(fabsf(ranks[r].g.fc1[i] - solo.g.fc1[n1 * r + i]), <=,
                              1e-5f * (1 + fabsf(solo.g.fc1[n1 * r + i])));
        for (uint64_t i = 0; i < n2; i++)
            g_assert_cmpfloat(fabsf(ranks[r].g.fc2[i] - solo.g.fc2[n2 * r + i]), <=,
                              1e-5f * (1 + fabsf(solo.g.fc2[n2 * r + i])));
    }
    g_assert_cmpint(total_dropped, >, 0);
    for (int i = 0; i < H * E; i++) /* each rank's router gradient is its tokens' */
        g_assert_cmpfloat(fabsf(ranks[0].g.router[i] + ranks[1].g.router[i] - solo.g.router[i]),
                          <=, 1e-5f * (1 + fabsf(solo.g.router[i])));
    for (int r = 0; r < 2; r++) {
        rank_free(&ranks[r]);
        g_free(x[r]), g_free(dy[r]), g_free(y1[r]), g_free(dx1[r]);
    }
    rank_free(&solo);
    g_free(router), g_free(fc1), g_free(fc2);
    be->destroy(be);
}

/* The emulated communicator's all-to-all: every stand-in sends this rank its own piece, and
 * it counts (n-1)/n of the buffer, the schedule's all-to-all bytes. */
static void test_emulated_alltoall(void)
{
    RealBackend *be = real_cpu_backend_new();
    RealComm *c = real_comm_emulated_new(be, 4, 1);
    g_assert_nonnull(c->alltoall_bf16);
    RealBf16 send[8], recv[8];
    for (int i = 0; i < 8; i++)
        send[i] = real_bf16_from_f32((float)i);
    g_assert_true(c->alltoall_bf16(c, send, recv, 2, NULL));
    for (int q = 0; q < 4; q++) {
        g_assert_cmpfloat(real_bf16_to_f32(recv[2 * q]), ==, 2.0);
        g_assert_cmpfloat(real_bf16_to_f32(recv[2 * q + 1]), ==, 3.0);
    }
    g_assert_cmpfloat(c->sent_bytes, ==, 3.0 / 4 * 16);
    c->destroy(c);
    be->destroy(be);
}

/* Refusals: top-k past the experts, EP not dividing them, no capacity (dropless). */
static void test_dims_refused(void)
{
    const RealMoeDims good = {.tokens = T, .hidden = H, .experts = E, .top_k = K,
                              .expert_ffn = FE, .capacity = 8, .ep = 2, .ep_rank = 1};
    g_assert_true(real_moe_dims_check(&good, NULL));
    RealMoeDims bad[4] = {good, good, good, good};
    bad[0].top_k = E + 1;
    bad[1].ep = 3;
    bad[2].capacity = 0;
    bad[3].ep_rank = 2;
    for (int i = 0; i < 4; i++) {
        GError *error = NULL;
        g_assert_false(real_moe_dims_check(&bad[i], &error));
        g_assert_nonnull(error);
        g_assert_null(strchr(error->message, '\n'));
        g_error_free(error);
    }
    g_assert_cmpint(real_moe_capacity(16, 2, 4, 1.0), ==, 8);
    g_assert_cmpint(real_moe_capacity(16, 2, 4, 1.25), ==, 10);
    g_assert_cmpint(real_moe_capacity(16, 2, 4, 0), ==, 0);
}

/* The tiny MoE model's layout is the planner's (zp_model_tensors) at EP 1 and holds E/EP of
 * the experts at EP 2; a sparse block saves what zp_ep_activations plans for it: attention and
 * norms, the router's fp32 probabilities and int64 indices, the experts' inputs, gate, up and
 * product over the E C received rows, the T k returned copies. */
static void test_layout_and_activations(void)
{
    ZpModel model;
    g_assert_true(zp_model_load("moe-tiny", &model, NULL));
    ZpPlan plan;
    zp_plan_defaults(&plan, 0, 4, 1);
    plan.precision = ZP_PREC_BF16;
    plan.attention = ZP_ATTN_EAGER;
    plan.micro_batch = 2;
    plan.experts.capacity_factor = 2.0;
    plan.experts.ep = 1;
    RealGptDims d = real_engine_dims(&model, &plan);
    g_assert_true(real_gpt_dims_check(&d, NULL));
    GArray *tensors = zp_model_tensors(&model);
    guint k = 0;
    for (int u = 0; u < real_gpt_n_units(&d); u++) {
        RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
        const int n = real_gpt_unit_tensors(&d, u, t);
        for (int i = 0; i < n; i++, k++) {
            const ZpTensor *zt = &g_array_index(tensors, ZpTensor, k);
            g_assert_cmpstr(t[i].name, ==, zt->name);
            g_assert_cmpuint(t[i].elems, ==, zt->elems);
        }
        g_assert_cmpuint(real_gpt_unit_elems(&d, u), ==, zp_model_unit_elems(&model, u));
    }
    g_assert_cmpuint(k, ==, tensors->len);
    g_array_unref(tensors);
    g_assert_cmpuint(real_gpt_param_elems(&d), ==, 156480); /* zplan memory's count */
    const ZpEpActivations a = zp_ep_activations(&model, &plan);
    g_assert_cmpfloat(a.expert_capacity, ==, d.moe_capacity); /* ceil(64 x 2 / 4 x 2) = 64 */
    g_assert_cmpint(d.moe_capacity, ==, 64);
    g_assert_cmpfloat((double)real_gpt_block_activation_bytes(&d), ==, a.sparse_layer_bytes);
    plan.experts.ep = 2;
    RealGptDims d2 = real_engine_dims(&model, &plan);
    d2.ep_rank = 1;
    for (int u = 1; u <= 2; u++)
        g_assert_cmpuint(real_gpt_unit_elems(&d2, u), ==,
                         zp_model_unit_elems(&model, u) - zp_model_unit_expert_elems(&model, u) / 2);
    /* Rank 1's experts are the second half of the whole model's, drawn where it has them. */
    const size_t n1 = real_gpt_unit_elems(&d, 1), n2 = real_gpt_unit_elems(&d2, 1);
    RealBf16 *whole = g_new(RealBf16, n1), *half = g_new(RealBf16, n2);
    g_assert_true(real_gpt_init_params(&d, 3, 1, whole, NULL));
    g_assert_true(real_gpt_init_params(&d2, 3, 1, half, NULL));
    RealGptTensor tw[REAL_GPT_MAX_UNIT_TENSORS], th[REAL_GPT_MAX_UNIT_TENSORS];
    const int nt = real_gpt_unit_tensors(&d, 1, tw);
    g_assert_cmpint(real_gpt_unit_tensors(&d2, 1, th), ==, nt);
    for (int i = 0; i < nt; i++) {
        const size_t skip = strstr(tw[i].name, ".experts.") ? th[i].elems : 0;
        g_assert_cmpmem(whole + tw[i].offset_elems + skip, th[i].elems * sizeof(RealBf16),
                        half + th[i].offset_elems, th[i].elems * sizeof(RealBf16));
    }
    g_free(whole), g_free(half);
}

/* One sparse block forward run as a schedule's ops (split): modules ln1 to fc1, the dispatch's
 * permutation, the experts (EP 1: the all-to-alls are copies), the combine's buffer bound,
 * fc2. */
static void split_forward(Fixture *fx, int l, const RealBf16 *x_in, RealBf16 *x_out,
                          gboolean save, RealBf16 *a, RealBf16 *b)
{
    GError *error = NULL;
    RealGptTensors p;
    real_gpt_tensors_at(&fx->dims, l + 1, fx->params[l + 1], &p);
    for (int m = REAL_GPT_MOD_LN1; m <= REAL_GPT_MOD_FC1; m++)
        g_assert_true(real_gpt_block_forward_module_t(fx->gpt, l, m, &p, x_in, x_out, save,
                                                      &error));
    g_assert_true(real_gpt_moe_permute(fx->gpt, l, a, &error));
    g_assert_true(real_gpt_moe_experts_forward_t(fx->gpt, l, &p, a, b, &error));
    real_gpt_moe_bind(fx->gpt, b);
    g_assert_true(real_gpt_block_forward_module_t(fx->gpt, l, REAL_GPT_MOD_FC2, &p, x_in, x_out,
                                                  save, &error));
    g_assert_no_error(error);
}

static void split_backward(Fixture *fx, int l, float *dx, RealBf16 *a, RealBf16 *b)
{
    GError *error = NULL;
    RealGptTensors p, g;
    real_gpt_tensors_at(&fx->dims, l + 1, fx->params[l + 1], &p);
    real_gpt_tensors_at(&fx->dims, l + 1, fx->grads[l + 1], &g);
    real_gpt_moe_bind(fx->gpt, a);
    g_assert_true(real_gpt_block_backward_module_t(fx->gpt, l, REAL_GPT_MOD_FC2, &p, dx, dx,
                                                   NULL, &error));
    g_assert_true(real_gpt_moe_experts_backward_t(fx->gpt, l, &p, a, &g, b, &error));
    real_gpt_moe_bind(fx->gpt, b);
    for (int m = REAL_GPT_MOD_FC1; m >= REAL_GPT_MOD_LN1; m--)
        g_assert_true(real_gpt_block_backward_module_t(fx->gpt, l, m, &p, dx, dx, &g, &error));
    g_assert_no_error(error);
}

/* The sparse blocks run as a schedule's separate ops (real_gpt_moe_set_split) compute what the
 * whole block computes, bit for bit: the loss and every gradient, saving activations and
 * recomputing from checkpoints. */
static void test_split_matches_whole(gconstpointer data)
{
    const gboolean checkpoint = GPOINTER_TO_INT(data);
    RealGptDims dims = gradient_dims(GRAD_MOE);
    Fixture whole, split;
    fx_init(&whole, &dims, 7);
    fx_init(&split, &dims, 7);
    TestRng r1 = {5}, r2 = {5};
    fx_randomize(&whole, &r1);
    fx_randomize(&split, &r2);
    int *tokens, *targets;
    make_batch(&dims, 11, 0, &tokens, &targets);
    const float loss = fx_micro_batch(&whole, tokens, targets, checkpoint, TRUE);

    RealBackend *be = split.be;
    RealGpt *gpt = split.gpt;
    GError *error = NULL;
    const int L = dims.layers;
    real_gpt_moe_set_split(gpt, true);
    const RealMoeDims md = real_gpt_moe_dims(&dims);
    const size_t n = real_moe_a2a_elems(&md) * sizeof(RealBf16);
    RealBf16 *a = be->alloc(be, n, REAL_MEM_EP_BUFFERS), *b = be->alloc(be, n, REAL_MEM_EP_BUFFERS);
    const uint64_t x_bytes = real_gpt_checkpoint_bytes(&dims);
    RealBf16 *x = be->alloc(be, x_bytes, REAL_MEM_WORKSPACE), *ckpt[MAX_UNITS] = {0};
    float *dx = be->alloc(be, real_gpt_residual_grad_bytes(&dims), REAL_MEM_WORKSPACE);
    g_assert_true(real_gpt_embed_forward(gpt, split.params[0], tokens, x, &error));
    for (int l = 0; l < L; l++) {
        if (checkpoint) {
            ckpt[l] = be->alloc(be, x_bytes, REAL_MEM_CHECKPOINTS);
            be->copy(be, ckpt[l], x, x_bytes);
        }
        split_forward(&split, l, x, x, !checkpoint, a, b);
    }
    float split_loss = NAN;
    g_assert_true(real_gpt_head_forward_backward(gpt, split.params[L + 1], split.params[0], x,
                                                 targets, 1.0f, &split_loss, dx,
                                                 split.grads[L + 1], split.grads[0], &error));
    for (int l = L - 1; l >= 0; l--) {
        if (checkpoint) {
            split_forward(&split, l, ckpt[l], x, TRUE, a, b);
            be->free(be, ckpt[l]);
        }
        split_backward(&split, l, dx, a, b);
    }
    g_assert_true(real_gpt_embed_backward(gpt, tokens, dx, split.grads[0], &error));
    g_assert_no_error(error);
    g_assert_cmpfloat(split_loss, ==, loss);
    assert_same_grads(&whole, &split);
    /* Out of order: the experts' forward with no block forward open is refused in one line. */
    RealGptTensors p;
    real_gpt_tensors_at(&dims, 1, split.params[1], &p);
    g_assert_false(real_gpt_moe_experts_forward_t(gpt, 0, &p, a, b, &error));
    g_assert_nonnull(strstr(error->message, "outside the block's"));
    g_clear_error(&error);
    be->free(be, a), be->free(be, b), be->free(be, x), be->free(be, dx);
    g_free(tokens), g_free(targets);
    fx_free(&whole), fx_free(&split);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    static const double drops = 1.0, no_drops = 2.0;
    g_test_add_data_func("/real-moe/reference-drops", &drops, test_reference);
    g_test_add_data_func("/real-moe/reference-no-drops", &no_drops, test_reference);
    g_test_add_func("/real-moe/ep-matches-one-rank", test_ep_matches_one_rank);
    g_test_add_func("/real-moe/emulated-alltoall", test_emulated_alltoall);
    g_test_add_func("/real-moe/dims-refused", test_dims_refused);
    g_test_add_func("/real-moe/layout-and-activations", test_layout_and_activations);
    g_test_add_data_func("/real-moe/split-matches-whole", GINT_TO_POINTER(FALSE),
                         test_split_matches_whole);
    g_test_add_data_func("/real-moe/split-matches-whole-checkpointed", GINT_TO_POINTER(TRUE),
                         test_split_matches_whole);
    g_test_add_data_func("/real-moe/model-gradients", GINT_TO_POINTER(GRAD_MOE),
                         test_model_gradients);
    return g_test_run();
}
