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

/* The run's two all-to-all buffers, taken when its sparse MLP starts (REAL_MEM_EP_BUFFERS, as
 * the router's outputs are when the block saves nothing). */
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
        gpt->run.moe_router = be->alloc(be, real_gpt_moe_router_bytes(&gpt->dims),
                                        REAL_MEM_EP_BUFFERS);
        if (!gpt->run.moe_router)
            return real_gpt_nomem(error, "the router's outputs");
    }
    const RealMoeParams mp = params_of(p);
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
    const bool ok = real_moe_unpermute_fwd(gpt->moe, router_of(gpt, sv), gpt->run.moe_a,
                                           sv ? sv->moe : NULL, y, error);
    real_gpt_moe_run_end(gpt);
    return ok;
}

bool real_gpt_moe_fc2_bwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv, float *g,
                          const float *dy, GError **error)
{
    const RealMoeParams mp = params_of(p);
    const RealMoeGrads mg = grads_of(gpt, g);
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
    const bool ok = real_moe_route_bwd(gpt->moe, &mp, sv->router, sv->ln2, gpt->run.moe_a, dx,
                                       &mg, error);
    real_gpt_moe_run_end(gpt);
    return ok;
}
