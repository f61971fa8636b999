/* real_gpt_internal: what the model's three files share (real_gpt.c's dimensions, layout,
 * initialisation and runtime; real_gpt_ends.c's embeddings and head; real_gpt_block.c's
 * transformer block): the model's state, its derived dimensions, and the runtime helpers. */
#ifndef REAL_GPT_INTERNAL_H
#define REAL_GPT_INTERNAL_H

#include "real_gpt_dims.h"
#include "real_moe.h"

#include <glib.h>
#include <stdbool.h>

/* The runtime and its tensor-parallel ops (real_gpt.h, which the files include: this header
 * stays below it, so that real_gpt and its parts form no circle). */
typedef struct RealGpt RealGpt;
typedef struct RealGptTpOps RealGptTpOps;

/* How a tensor starts out. */
typedef enum {
    REAL_GPT_INIT_ONES,
    REAL_GPT_INIT_ZEROS,
    REAL_GPT_INIT_NORMAL,          /* N(0, 0.02) */
    REAL_GPT_INIT_NORMAL_RESIDUAL, /* N(0, 0.02 / sqrt(2L)): layers writing the residual */
} RealGptInit;

/* A block's tensors, in layout order (indices into its tensor table). */
typedef enum {
    REAL_GPT_LN1_G,
    REAL_GPT_LN1_B,
    REAL_GPT_QKV_W,
    REAL_GPT_QKV_B,
    REAL_GPT_PROJ_W,
    REAL_GPT_PROJ_B,
    REAL_GPT_LN2_G,
    REAL_GPT_LN2_B,
    REAL_GPT_FC1_W,
    REAL_GPT_FC1_B,
    REAL_GPT_FC2_W,
    REAL_GPT_FC2_B,
    REAL_GPT_N_BLOCK_TENSORS
} RealGptBlockTensor;

G_STATIC_ASSERT(REAL_GPT_N_BLOCK_TENSORS == REAL_GPT_MAX_UNIT_TENSORS);

/* Pointers into one block's saved activations (a single allocation; fp32 first). */
typedef struct {
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd; /* LayerNorm only */
    float *lse;                                       /* fused attention only */
    RealBf16 *x, *ln1, *qkv, *probs, *att, *x2, *ln2, *fc1, *gelu; /* probs: eager only,
                                                                     * x2: sequential only */
    void *router, *moe; /* a sparse MLP's router buffer (first in the allocation) and its
                         * saved tensors (last; real_moe_saved_bytes) */
} RealGptSaved;

struct RealGpt {
    RealBackend *be;
    RealGptDims dims;
    size_t block_offset[REAL_GPT_N_BLOCK_TENSORS]; /* element offsets inside a block unit */
    bool block_has[REAL_GPT_N_BLOCK_TENSORS];      /* biases and norm biases may be absent */
    size_t block_elems;
    void **saved; /* [layers]: saved activations between forward and backward, or NULL */
    const RealGptTpOps *tp_ops; /* tensor parallelism: the group's collectives (real_gpt_set_tp) */
    void *tp_ctx;
    GError *tp_error; /* the first failed collective's, until the call that made it returns */
    gboolean grads_f32; /* gradient storage is fp32 (real_gpt_set_grads_f32) */
    uint32_t *fresh; /* [layers + 2]: bit k, unit u's tensor k is overwritten by its next write
                      * (real_gpt_grads_fresh), not added to */
    /* A block forward or backward run module by module (real_gpt_block_*_module_t): its
     * layer (-1: none under way), the modules done, its workspace and (forward) the saved
     * activations it fills. */
    struct {
        int layer, done;
        bool backward;
        float *ws;
        void *saved;
        /* a sparse MLP's router buffer when not saving, and its two all-to-all buffers */
        void *moe_router;
        RealBf16 *moe_a, *moe_b;
    } run;
    struct RealMoe *moe; /* the sparse MLP (real_gpt_sparse), its routing on the host */
    bool moe_split;      /* the all-to-alls and the experts are the caller's ops
                          * (real_gpt_moe_set_split), the buffer each phase uses bound: */
    RealBf16 *moe_bound;
    struct RealComm *ep; /* the expert-parallel group (real_gpt_set_ep); NULL: ep 1 */
};

/* The tensor-parallel degree t (1 without): a block's shapes below are one rank's shard. */
static inline int real_gpt_tp(const RealGptDims *d)
{
    return d->tp > 1 ? d->tp : 1;
}

/* Query heads and key/value heads of this rank: a / t and k / t. */
static inline int real_gpt_heads(const RealGptDims *d)
{
    return d->heads / real_gpt_tp(d);
}

static inline int real_gpt_kv(const RealGptDims *d)
{
    return (d->kv_heads > 0 ? d->kv_heads : d->heads) / real_gpt_tp(d);
}

static inline int real_gpt_head_dim(const RealGptDims *d)
{
    return d->hidden / d->heads;
}

/* Width of this rank's attention output, the row-parallel projection's input: h / t. */
static inline size_t real_gpt_att_width(const RealGptDims *d)
{
    return (size_t)real_gpt_heads(d) * real_gpt_head_dim(d);
}

/* Width of the fused qkv projection: (h + 2 k d) / t. */
static inline size_t real_gpt_qkv_width(const RealGptDims *d)
{
    return real_gpt_att_width(d) + 2 * (size_t)real_gpt_kv(d) * real_gpt_head_dim(d);
}

/* This rank's rows of the vocabulary, V / t, from row tp_rank V / t on. */
static inline int real_gpt_vocab(const RealGptDims *d)
{
    return d->vocab / real_gpt_tp(d);
}

/* A mixture of experts: every block's MLP is real_moe's (real_gpt_moe.c). */
static inline bool real_gpt_sparse(const RealGptDims *d)
{
    return d->moe_experts > 0;
}

/* This rank's dense MLP width f / t (0 where the MLP is sparse: no dense MLP tensors). */
static inline int real_gpt_ffn(const RealGptDims *d)
{
    return real_gpt_sparse(d) ? 0 : d->ffn_hidden / real_gpt_tp(d);
}

static inline bool real_gpt_gated(const RealGptDims *d)
{
    return d->swiglu || d->geglu;
}

/* Width of fc1: f, or 2f for a gated MLP's gate and up. */
static inline size_t real_gpt_fc1_width(const RealGptDims *d)
{
    return (real_gpt_gated(d) ? 2 : 1) * (size_t)real_gpt_ffn(d);
}

/* The MLP's activation. */
static inline RealActivation real_gpt_act(const RealGptDims *d)
{
    return d->swiglu ? REAL_ACT_SILU : d->exact_gelu ? REAL_ACT_GELU_ERF : REAL_ACT_GELU_TANH;
}

/* Dimensions of each head the rotary embeddings turn: int(d * fraction), as transformers'
 * GPT-NeoX computes rotary_ndims. */
static inline int real_gpt_rot_dim(const RealGptDims *d)
{
    const int hd = d->hidden / d->heads;
    return d->rotary_fraction > 0 ? (int)((float)hd * d->rotary_fraction) : hd;
}

/* The rotary embeddings as the backends take them. */
static inline RealRope real_gpt_rope(const RealGptDims *d)
{
    return (RealRope){.theta = d->rope_theta, .rot_dim = real_gpt_rot_dim(d),
                      .scaling = d->rope_scaling, .factor = d->rope_factor,
                      .low_freq_factor = d->rope_low_freq_factor,
                      .high_freq_factor = d->rope_high_freq_factor,
                      .original_positions = d->rope_original_positions};
}

/* Rows of the learned position table. */
static inline int real_gpt_positions(const RealGptDims *d)
{
    return d->positions > 0 ? d->positions : d->seq_len;
}

static inline float real_gpt_eps(const RealGptDims *d)
{
    return d->norm_eps > 0 ? d->norm_eps : 1e-5f;
}

static inline size_t real_gpt_tokens(const RealGptDims *d)
{
    return (size_t)d->micro_batch * d->seq_len;
}

/* real_gpt_moe.c: a sparse block's MLP (real_moe) inside the block's modules — its saved
 * bytes, the runtime it makes, the fc1 module's forward (route, dispatch, experts, combine:
 * x is norm2's output) and the fc2 module's (the weighted sum into y, then y += x2), and
 * backward the fc2 module's (into the experts' gradients in g) and the fc1 module's (the
 * router's, dx = dL/d norm2's output). */
RealMoeDims real_gpt_moe_dims(const RealGptDims *d);
uint64_t real_gpt_moe_saved_bytes(const RealGptDims *d);
uint64_t real_gpt_moe_router_bytes(const RealGptDims *d);
bool real_gpt_moe_init(RealGpt *gpt, GError **error);
bool real_gpt_moe_fc1_fwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv,
                          const float *x, GError **error);
bool real_gpt_moe_fc2_fwd(RealGpt *gpt, const RealGptSaved *sv, float *y, GError **error);
bool real_gpt_moe_fc2_bwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv, float *g,
                          const float *dy, GError **error);
bool real_gpt_moe_fc1_bwd(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv, float *g,
                          float *dx, GError **error);
/* Bits of a sparse block's expert tensors in its view (0 for a dense one). */
uint32_t real_gpt_moe_expert_tensors(const RealGpt *gpt);
/* Frees the run's sparse-MLP buffers (router when not saving, all-to-all buffers). */
void real_gpt_moe_run_end(RealGpt *gpt);

/* real_gpt.c: the runtime helpers the ends and the block share, and how many tensors a unit
 * has. */
int real_gpt_n_tensors(const RealGptDims *d, int unit);

/* Token ids index wte rows, so an out-of-range one would read or write out of bounds. */
gboolean real_gpt_check_tokens(const RealGpt *gpt, const int *tokens, const char *what,
                               GError **error);

/* Tensor k of unit `unit` (laid out as unit `layout`: 1 for any block) from the fp32
 * gradients in src: stored over dst when fresh (real_gpt_grads_fresh), which it then no
 * longer is, else added to it. */
void real_gpt_write_grad(RealGpt *gpt, int unit, int k, RealBf16 *dst, const float *src,
                         size_t n_elems);

/* dst's tensors first..last-1 of unit `unit` (laid out as unit `layout`) from src, that
 * unit's fp32 gradients laid out contiguously (src[0] is tensor first's first element). */
void real_gpt_accumulate(RealGpt *gpt, int layout, int unit, const RealGptTensors *dst,
                         const float *src, int first, int last);

/* Carves one block's saved-activation allocation into its tensors. */
RealGptSaved real_gpt_saved_view(const RealGptDims *d, void *base);

/* A failed compute's error: the tensor group's sum's when it failed, else no memory. */
gboolean real_gpt_failed(RealGpt *gpt, GError **error, const char *what);

gboolean real_gpt_nomem(GError **error, const char *what);

gboolean real_gpt_check_layer(const RealGpt *gpt, int layer, GError **error);

/* An fp32 workspace of n_elems, NULL when the backend has no memory left. */
float *real_gpt_workspace(RealGpt *gpt, size_t n_elems);

/* Tensor parallelism: x[0..n) = the sum of every rank's x over the group (nothing at t = 1).
 * A failure is kept in gpt->tp_error for the public call to report. */
bool real_gpt_tp_sum(RealGpt *gpt, float *x, size_t n);

#endif
