/* real_moe: a mixture of experts' sparse MLP on zreal's backend — router, softmax, top-k,
 * capacity, permutation, the experts' SwiGLU and the weighted combine, forward and backward —
 * in the phases a schedule runs between its all-to-alls (dispatch, combine) over the EP group.
 *
 * Routing is DeepSpeed-MoE's (deepspeed/moe/sharded_moe.py topkgating / top2gating and
 * MOELayer.forward): each rank routes its own T tokens; every expert takes at most C copies from
 * a rank, C = ceil(T k / E x capacity_factor) (_capacity), filled first choices first, then
 * second choices, each in token order (locations = cumsum(mask) - 1, the second choices after
 * all the first); a copy past C is dropped. The dispatch buffer is the padded [E, C, h]
 * (einsum "sec,sm->ecm"), so both all-to-alls move E C h elements whatever the router does,
 * the sizes the schedule plans. A token's output is the sum of its kept copies' expert outputs
 * times the routing weights, the top-k softmax probabilities renormalised over the k
 * (modeling_mixtral.py MixtralSparseMoeBlock.forward: routing_weights /= sum); a dropped copy
 * adds nothing (DeepSpeed's mask).
 *
 * One sparse MLP, forward (x: the block's norm2 output [T, h]):
 *   route           logits = x Wr [T, E], fp32 softmax probabilities and int64 top-k indices
 *                   into the router buffer; send = x's copies in expert order [E, C, h]
 *   all-to-all      send -> recv: rank q's copies for this rank's E/ep experts at q
 *   experts_fwd     recv -> out (the experts' outputs, laid out as recv, to go back)
 *   all-to-all      out -> ret: this rank's copies back, [E, C, h]
 *   unpermute_fwd   y += sum of each token's kept copies x routing weights
 * and backward (dy = dL/dy [T, h]):
 *   unpermute_bwd   the copies' output gradients into send [E, C, h]; the routing weights'
 *                   gradients, through the renormalisation and the softmax, into the router
 *                   buffer (the logits' gradients, over the probabilities)
 *   all-to-all      send -> recv
 *   experts_bwd     recv -> out (the copies' input gradients); the experts' weight gradients
 *   all-to-all      out -> ret
 *   route_bwd       dx = sum of each token's copies' input gradients + dlogits Wr^T; the
 *                   router's weight gradient x^T dlogits
 * Saved for backward (real_moe_saved_bytes): the experts' inputs, gate and up, and the
 * product (R (h + 3 f_e) with R = E C received rows), and each token's k returned copies
 * (T k h) for the routing weights' gradient: zp_ep_activations' expert_act_bytes and
 * combine_act_bytes. */
#ifndef REAL_MOE_H
#define REAL_MOE_H

#include "real_backend.h"
#include "real_comm.h"

#include <glib.h>
#include <stdint.h>

typedef struct {
    int tokens;     /* T: token rows this rank routes (b s) */
    int hidden;     /* h */
    int experts;    /* E */
    int top_k;      /* k */
    int expert_ffn; /* f_e: one expert's gated MLP width */
    int capacity;   /* C: copies an expert takes from one rank (real_moe_capacity) */
    int ep;         /* experts split over ep ranks (0 or 1: all here) */
    int ep_rank;    /* this rank holds experts ep_rank E/ep .. (ep_rank + 1) E/ep - 1 */
    RealActivation act; /* the experts' gated unit: SiLU (SwiGLU) */
} RealMoeDims;

/* DeepSpeed's _capacity: ceil(T k / E x factor) copies per expert and rank; 0 when factor is
 * not positive (dropless routing, whose buffers the router sizes: zreal refuses it). */
int64_t real_moe_capacity(int64_t tokens, int64_t top_k, int64_t experts, double factor);

/* TRUE when every dimension is positive, k <= E, ep divides E, 0 <= ep_rank < ep and every
 * buffer's size fits; else one line naming the first that does not. */
gboolean real_moe_dims_check(const RealMoeDims *d, GError **error);

static inline int real_moe_ep(const RealMoeDims *d)
{
    return d->ep > 1 ? d->ep : 1;
}
static inline int real_moe_local_experts(const RealMoeDims *d)
{
    return d->experts / real_moe_ep(d);
}

/* Elements of the router [h, E], of this rank's experts' gate and up [E/ep][h, 2 f_e] and of
 * their down projections [E/ep][f_e, h] (weights stored [in, out], as real_gpt's). */
uint64_t real_moe_router_elems(const RealMoeDims *d);
uint64_t real_moe_fc1_elems(const RealMoeDims *d);
uint64_t real_moe_fc2_elems(const RealMoeDims *d);

/* Bytes of the router buffer: int64 indices [T, k], then fp32 probabilities [T, E] (8-byte
 * aligned where the buffer is). */
uint64_t real_moe_router_bytes(const RealMoeDims *d);
/* Elements of one all-to-all buffer, E C h (bf16). */
uint64_t real_moe_a2a_elems(const RealMoeDims *d);
/* Bytes one sparse MLP saves for backward: 2 (E C (h + 3 f_e) + T k h). */
uint64_t real_moe_saved_bytes(const RealMoeDims *d);

/* The sparse MLP's parameters (read) or their fp32 gradients (added to), this rank's. */
typedef struct {
    const RealBf16 *router, *fc1, *fc2;
} RealMoeParams;
typedef struct {
    float *router, *fc1, *fc2;
} RealMoeGrads;

typedef struct RealMoe RealMoe;

/* A runtime on backend `be` (borrowed). Its host scratch is sized by the dimensions. */
RealMoe *real_moe_new(RealBackend *be, const RealMoeDims *d, GError **error);
void real_moe_free(RealMoe *moe);
const RealMoeDims *real_moe_dims(const RealMoe *moe);

/* The phases above. x and dy, dx and y are fp32 [T, h]; router is the router buffer; send, recv,
 * out and ret hold real_moe_a2a_elems; saved is real_moe_saved_bytes (NULL: not saving:
 * experts_fwd and unpermute_fwd then compute the same outputs and keep nothing). x_bf16 is
 * the forward's x in bf16 (the block's saved norm2 output). out may alias recv. */
gboolean real_moe_route(RealMoe *moe, const RealMoeParams *p, const float *x, void *router,
                        RealBf16 *send, GError **error);
/* route in two: the router's outputs alone, then the copies of x into send (a schedule
 * allocates the dispatch buffer after the block's op, and the dispatch op fills it). */
gboolean real_moe_route_only(RealMoe *moe, const RealMoeParams *p, const float *x, void *router,
                             GError **error);
gboolean real_moe_permute(RealMoe *moe, const void *router, const float *x, RealBf16 *send,
                          GError **error);
gboolean real_moe_experts_fwd(RealMoe *moe, const RealMoeParams *p, const RealBf16 *recv,
                              void *saved, RealBf16 *out, GError **error);
gboolean real_moe_unpermute_fwd(RealMoe *moe, const void *router, const RealBf16 *ret,
                                void *saved, float *y, GError **error);
gboolean real_moe_unpermute_bwd(RealMoe *moe, void *router, const void *saved, const float *dy,
                                RealBf16 *send, GError **error);
gboolean real_moe_experts_bwd(RealMoe *moe, const RealMoeParams *p, const void *saved,
                              const RealBf16 *recv, const RealMoeGrads *g, RealBf16 *out,
                              GError **error);
gboolean real_moe_route_bwd(RealMoe *moe, const RealMoeParams *p, const void *router,
                            const RealBf16 *x_bf16, const RealBf16 *ret, float *dx,
                            const RealMoeGrads *g, GError **error);

/* The all-to-all between the phases over the EP group `ep` (its size the dims' ep; NULL with
 * ep 1: a copy). */
gboolean real_moe_alltoall(RealMoe *moe, RealComm *ep, const RealBf16 *send, RealBf16 *recv,
                           GError **error);

/* How many of the T k copies the last placement (route, or a phase that read a router buffer)
 * kept and dropped, for tests. */
void real_moe_route_counts(const RealMoe *moe, int *kept, int *dropped);

#endif
