/* real_gpt_moe: a mixture of experts' block — its MLP is real_moe's sparse one, run inside the
 * block's fc1 and fc2 modules with the all-to-alls over the expert-parallel group between. */
#include "real_gpt.h"
#include "real_gpt_internal.h"
#include "real_moe.h"

RealMoeDims real_gpt_moe_dims(const RealGptDims *d)
{
    return (RealMoeDims){.tokens = (int)real_gpt_tokens(d), .hidden = d->hidden,
                         .experts = d->moe_experts, .top_k = d->moe_top_k,
                         .expert_ffn = d->moe_ffn, .capacity = d->moe_capacity, .ep = d->ep,
                         .ep_rank = d->ep_rank, .act = REAL_ACT_SILU};
}

uint64_t real_gpt_moe_saved_bytes(const RealGptDims *d)
{
    if (!real_gpt_sparse(d))
        return 0;
    const RealMoeDims m = real_gpt_moe_dims(d);
    return real_moe_router_bytes(&m) + real_moe_saved_bytes(&m);
}

uint64_t real_gpt_moe_router_bytes(const RealGptDims *d)
{
    const RealMoeDims m = real_gpt_moe_dims(d);
    return real_gpt_sparse(d) ? real_moe_router_bytes(&m) : 0;
}

bool real_gpt_moe_init(RealGpt *gpt, GError **error)
{
    if (!real_gpt_sparse(&gpt->dims))
        return true;
    const RealMoeDims m = real_gpt_moe_dims(&gpt->dims);
    gpt->moe = real_moe_new(gpt->be, &m, error);
    return gpt->moe != NULL;
}

void real_gpt_set_ep(RealGpt *gpt, RealComm *ep)
{
    gpt->ep = ep;
}

/* The sparse MLP's tensors in a block's view: the router in fc1.weight's slot, the experts'
 * gate and up in fc1.bias's, their down projections in fc2.weight's (real_gpt_dims.h). */
static RealMoeParams params_of(RealBf16 *const *p)
{
    return (RealMoeParams){p[REAL_GPT_FC1_W], p[REAL_GPT_FC1_B], p[REAL_GPT_FC2_W]};
}

static RealMoeGrads grads_of(const RealGpt *gpt, float *g)
{
    const size_t *off = gpt->block_offset;
    return (RealMoeGrads){g + off[REAL_GPT_FC1_W], g + off[REAL_GPT_FC1_B],
                          g + off[REAL_GPT_FC2_W]};
}

/* The run's two all-to-all buffers, taken when its sparse MLP starts (REAL_MEM_EP_BUFFERS). */
static bool take_a2a(RealGpt *gpt, GError **error)
{
    RealBackend *be = gpt->be;
    const RealMoeDims m = real_gpt_moe_dims(&gpt->dims);
    const size_t bytes = real_moe_a2a_elems(&m) * sizeof(RealBf16);
    gpt->run.moe_a = be->alloc(be, bytes, REAL_MEM_EP_BUFFERS);
    gpt->run.moe_b = be->alloc(be, bytes, REAL_MEM_EP_BUFFERS);
    return (gpt->run.moe_a && gpt->run.moe_b) || real_gpt_nomem(error, "the all-to-all buffers");
}

void real_gpt_moe_run_end(RealGpt *gpt)
{
    RealBackend *be = gpt->be;
    be->free(be, gpt->run.moe_router);
    be->free(be, gpt->run.moe_a);
    be->free(be, gpt->run.moe_b);
    gpt->run.moe_router = NULL;
    gpt->run.moe_a = gpt->run.moe_b = NULL;
}

static void *router_of(RealGpt *gpt, const RealGptSaved *sv)
{
    return sv ? sv->router : gpt->run.moe_router;
}

bool real_gpt_moe_fc1_fwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv,
                          const float *x, GError **error)
{
    RealBackend *be = gpt->be;
    if (!sv) {
        /* scratch until the fc2 module: a forward that saves nothing keeps nothing */
        gpt->run.moe_router = be->alloc(be, real_gpt_moe_router_bytes(&gpt->dims),
                                        REAL_MEM_WORKSPACE);
        if (!gpt->run.moe_router)
            return real_gpt_nomem(error, "the router's outputs");
    }
    const RealMoeParams mp = params_of(p);
    if (gpt->moe_split) /* the dispatch op permutes, the ops between run the experts */
        return real_moe_route_only(gpt->moe, &mp, x, router_of(gpt, sv), error);
    RealBf16 *a = NULL, *b = NULL;
    if (!take_a2a(gpt, error))
        return false;
    a = gpt->run.moe_a, b = gpt->run.moe_b;
    /* send (a) -> the experts' rows (b) -> their outputs (b) -> this rank's copies back (a) */
    return real_moe_route(gpt->moe, &mp, x, router_of(gpt, sv), a, error) &&
           real_moe_alltoall(gpt->moe, gpt->ep, a, b, error) &&
           real_moe_experts_fwd(gpt->moe, &mp, b, sv ? sv->moe : NULL, b, error) &&
           real_moe_alltoall(gpt->moe, gpt->ep, b, a, error);
}

bool real_gpt_moe_fc2_fwd(RealGpt *gpt, const RealGptSaved *sv, float *y, GError **error)
{
    RealBackend *be = gpt->be;
    be->fill(be, y, 0, real_gpt_tokens(&gpt->dims) * (size_t)gpt->dims.hidden * sizeof(float));
    const bool ok = real_moe_unpermute_fwd(gpt->moe, router_of(gpt, sv),
                                           gpt->moe_split ? gpt->moe_bound : gpt->run.moe_a,
                                           sv ? sv->moe : NULL, y, error);
    real_gpt_moe_run_end(gpt);
    return ok;
}

bool real_gpt_moe_fc2_bwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv, float *g,
                          const float *dy, GError **error)
{
    const RealMoeParams mp = params_of(p);
    const RealMoeGrads mg = grads_of(gpt, g);
    if (gpt->moe_split) /* into the bound buffer, which the dispatch op sends */
        return real_moe_unpermute_bwd(gpt->moe, sv->router, sv->moe, dy, gpt->moe_bound, error);
    if (!take_a2a(gpt, error))
        return false;
    RealBf16 *a = gpt->run.moe_a, *b = gpt->run.moe_b;
    /* the copies' output gradients (a) -> the experts (b) -> their inputs' (b) -> back (a) */
    return real_moe_unpermute_bwd(gpt->moe, sv->router, sv->moe, dy, a, error) &&
           real_moe_alltoall(gpt->moe, gpt->ep, a, b, error) &&
           real_moe_experts_bwd(gpt->moe, &mp, sv->moe, b, &mg, b, error) &&
           real_moe_alltoall(gpt->moe, gpt->ep, b, a, error);
}

bool real_gpt_moe_fc1_bwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv, float *g,
                          float *dx, GError **error)
{
    const RealMoeParams mp = params_of(p);
    const RealMoeGrads mg = grads_of(gpt, g);
    const bool ok = real_moe_route_bwd(gpt->moe, &mp, sv->router, sv->ln2,
                                       gpt->moe_split ? gpt->moe_bound : gpt->run.moe_a, dx,
                                       &mg, error);
    real_gpt_moe_run_end(gpt);
    return ok;
}

/* ---- a schedule's ops between the block's (real_gpt_moe_set_split) ---- */

uint32_t real_gpt_moe_expert_tensors(const RealGpt *gpt)
{
    uint32_t bits = 0;
    for (int i = 0, k = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++)
        if (gpt->block_has[i])
            bits |= (i == REAL_GPT_FC1_B || i == REAL_GPT_FC2_W ? 1u : 0u) << k++;
    return real_gpt_sparse(&gpt->dims) ? bits : 0;
}

void real_gpt_moe_set_split(RealGpt *gpt, bool split)
{
    gpt->moe_split = split;
}

void real_gpt_moe_bind(RealGpt *gpt, RealBf16 *buffer)
{
    gpt->moe_bound = buffer;
}

/* The layer's saved activations: its forward run's (open until the fc2 module), or those put
 * back for its backward; NULL when the forward saves nothing. */
static bool layer_saved(RealGpt *gpt, int layer, bool backward, RealGptSaved *sv,
                        GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error))
        return false;
    if (!real_gpt_sparse(&gpt->dims)) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d has no sparse MLP", layer);
        return false;
    }
    const bool open = gpt->run.layer == layer && gpt->run.backward == backward;
    void *base = backward ? gpt->saved[layer] : open ? gpt->run.saved : NULL;
    if ((backward && !base) || (!backward && !open)) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d: its experts' %s outside the block's (its %s first)", layer,
                    backward ? "backward" : "forward",
                    backward ? "activations put back" : "forward up to fc1");
        return false;
    }
    *sv = base ? real_gpt_saved_view(&gpt->dims, base) : (RealGptSaved){0};
    return true;
}

gboolean real_gpt_moe_permute(RealGpt *gpt, int layer, RealBf16 *send, GError **error)
{
    RealGptSaved sv;
    if (!layer_saved(gpt, layer, false, &sv, error))
        return FALSE;
    /* norm2's output, fp32 in the open forward's workspace (real_gpt_block.c's RealGptFwdBufs
     * .a: after the block's input x, which the workspace holds first) */
    const float *x = gpt->run.ws + real_gpt_tokens(&gpt->dims) * (size_t)gpt->dims.hidden;
    return real_moe_permute(gpt->moe, router_of(gpt, gpt->run.saved ? &sv : NULL), x, send,
                            error);
}

/* A block view's sparse-MLP tensors, in RealGptBlockTensor order (absent tensors skipped). */
static void block_ptrs(const RealGpt *gpt, const RealGptTensors *v,
                       RealBf16 *out[REAL_GPT_N_BLOCK_TENSORS], int index[REAL_GPT_N_BLOCK_TENSORS])
{
    for (int i = 0, k = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++) {
        index[i] = gpt->block_has[i] ? k : -1;
        out[i] = gpt->block_has[i] ? v->at[k++] : NULL;
    }
}

gboolean real_gpt_moe_experts_forward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                        const RealBf16 *recv, RealBf16 *out, GError **error)
{
    RealGptSaved sv;
    if (!layer_saved(gpt, layer, false, &sv, error))
        return FALSE;
    RealBf16 *p[REAL_GPT_N_BLOCK_TENSORS];
    int index[REAL_GPT_N_BLOCK_TENSORS];
    block_ptrs(gpt, block, p, index);
    const RealMoeParams mp = params_of(p);
    return real_moe_experts_fwd(gpt->moe, &mp, recv, gpt->run.saved ? sv.moe : NULL, out, error);
}

gboolean real_gpt_moe_experts_backward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                         const RealBf16 *recv, const RealGptTensors *grads,
                                         RealBf16 *out, GError **error)
{
    RealGptSaved sv;
    if (!layer_saved(gpt, layer, true, &sv, error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealMoeDims m = real_gpt_moe_dims(&gpt->dims);
    const uint64_t n1 = real_moe_fc1_elems(&m), n2 = real_moe_fc2_elems(&m);
    RealBf16 *p[REAL_GPT_N_BLOCK_TENSORS], *g[REAL_GPT_N_BLOCK_TENSORS];
    int index[REAL_GPT_N_BLOCK_TENSORS];
    block_ptrs(gpt, block, p, index);
    block_ptrs(gpt, grads, g, index);
    float *ws = real_gpt_workspace(gpt, n1 + n2);
    if (!ws)
        return real_gpt_nomem(error, "the experts' gradients");
    be->fill(be, ws, 0, (n1 + n2) * sizeof(float));
    const RealMoeParams mp = params_of(p);
    const RealMoeGrads mg = {NULL, ws, ws + n1};
    const gboolean ok = real_moe_experts_bwd(gpt->moe, &mp, sv.moe, recv, &mg, out, error);
    if (ok) { /* the experts' gradients, stored where fresh, else added */
        real_gpt_write_grad(gpt, layer + 1, index[REAL_GPT_FC1_B], g[REAL_GPT_FC1_B], ws, n1);
        real_gpt_write_grad(gpt, layer + 1, index[REAL_GPT_FC2_W], g[REAL_GPT_FC2_W], ws + n1,
                            n2);
    }
    be->free(be, ws);
    return ok;
}
