/* real_gpt: the GPT-2 and Llama-family models zreal trains, forward and backward.
 * All compute goes through RealBackend; fp32 math, bf16 storage, bit-identical recompute. */
#include "real_gpt.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#define REAL_GPT_INIT_STD 0.02

G_DEFINE_QUARK(real-gpt-error-quark, real_gpt_error)

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
    } run;
};

/* ---- dimensions and layout ---- */

RealGptDims real_gpt_dims_make(int layers, int hidden, int heads, int seq_len, int vocab,
                               int micro_batch)
{
    return (RealGptDims){.layers = layers, .hidden = hidden, .heads = heads,
                         .seq_len = seq_len, .vocab = vocab, .ffn_hidden = 4 * hidden,
                         .micro_batch = micro_batch};
}

/* The tensor-parallel degree t (1 without): a block's shapes below are one rank's shard. */
static int real_gpt_tp(const RealGptDims *d)
{
    return d->tp > 1 ? d->tp : 1;
}

/* Query heads and key/value heads of this rank: a / t and k / t. */
static int real_gpt_heads(const RealGptDims *d)
{
    return d->heads / real_gpt_tp(d);
}

static int real_gpt_kv(const RealGptDims *d)
{
    return (d->kv_heads > 0 ? d->kv_heads : d->heads) / real_gpt_tp(d);
}

static int real_gpt_head_dim(const RealGptDims *d)
{
    return d->hidden / d->heads;
}

/* Width of this rank's attention output, the row-parallel projection's input: h / t. */
static size_t real_gpt_att_width(const RealGptDims *d)
{
    return (size_t)real_gpt_heads(d) * real_gpt_head_dim(d);
}

/* Width of the fused qkv projection: (h + 2 k d) / t. */
static size_t real_gpt_qkv_width(const RealGptDims *d)
{
    return real_gpt_att_width(d) + 2 * (size_t)real_gpt_kv(d) * real_gpt_head_dim(d);
}

/* This rank's rows of the vocabulary, V / t, from row tp_rank V / t on. */
static int real_gpt_vocab(const RealGptDims *d)
{
    return d->vocab / real_gpt_tp(d);
}

/* This rank's MLP width f / t. */
static int real_gpt_ffn(const RealGptDims *d)
{
    return d->ffn_hidden / real_gpt_tp(d);
}

static bool real_gpt_gated(const RealGptDims *d)
{
    return d->swiglu || d->geglu;
}

/* Width of fc1: f, or 2f for a gated MLP's gate and up. */
static size_t real_gpt_fc1_width(const RealGptDims *d)
{
    return (real_gpt_gated(d) ? 2 : 1) * (size_t)real_gpt_ffn(d);
}

/* The MLP's activation. */
static RealActivation real_gpt_act(const RealGptDims *d)
{
    return d->swiglu ? REAL_ACT_SILU : d->exact_gelu ? REAL_ACT_GELU_ERF : REAL_ACT_GELU_TANH;
}

/* Dimensions of each head the rotary embeddings turn: int(d * fraction), as transformers'
 * GPT-NeoX computes rotary_ndims. */
static int real_gpt_rot_dim(const RealGptDims *d)
{
    const int hd = d->hidden / d->heads;
    return d->rotary_fraction > 0 ? (int)((float)hd * d->rotary_fraction) : hd;
}

/* The rotary embeddings as the backends take them. */
static RealRope real_gpt_rope(const RealGptDims *d)
{
    return (RealRope){.theta = d->rope_theta, .rot_dim = real_gpt_rot_dim(d),
                      .scaling = d->rope_scaling, .factor = d->rope_factor,
                      .low_freq_factor = d->rope_low_freq_factor,
                      .high_freq_factor = d->rope_high_freq_factor,
                      .original_positions = d->rope_original_positions};
}

/* Rows of the learned position table. */
static int real_gpt_positions(const RealGptDims *d)
{
    return d->positions > 0 ? d->positions : d->seq_len;
}

static float real_gpt_eps(const RealGptDims *d)
{
    return d->norm_eps > 0 ? d->norm_eps : 1e-5f;
}

gboolean real_gpt_dims_check(const RealGptDims *d, GError **error)
{
    if (d->layers <= 0 || d->hidden <= 0 || d->heads <= 0 || d->seq_len <= 0 ||
        d->vocab <= 0 || d->ffn_hidden <= 0 || d->micro_batch <= 0) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "model dimensions must be positive (L=%d h=%d a=%d s=%d V=%d f=%d b=%d)",
                    d->layers, d->hidden, d->heads, d->seq_len, d->vocab, d->ffn_hidden,
                    d->micro_batch);
        return FALSE;
    }
    if (d->hidden % d->heads != 0) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "heads = %d does not divide hidden = %d", d->heads, d->hidden);
        return FALSE;
    }
    const int t = real_gpt_tp(d), kv = d->kv_heads > 0 ? d->kv_heads : d->heads;
    if (d->tp < 0 || d->tp_rank < 0 || d->tp_rank >= t || kv % t != 0 || d->heads % t != 0 ||
        d->ffn_hidden % t != 0 || d->vocab % t != 0) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "tensor parallelism: rank %d of %d, which must divide heads %d, kv_heads %d, "
                    "ffn_hidden %d and vocab %d", d->tp_rank, d->tp, d->heads, kv,
                    d->ffn_hidden, d->vocab);
        return FALSE;
    }
    if (d->kv_heads < 0 || d->heads % kv != 0) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "kv_heads = %d must divide heads = %d", d->kv_heads, d->heads);
        return FALSE;
    }
    if (d->rope_theta > 0 && (d->rotary_fraction < 0 || d->rotary_fraction > 1 ||
                              real_gpt_rot_dim(d) % 2 != 0 || real_gpt_rot_dim(d) <= 0)) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "rotary embeddings turn pairs: %g of head dimension %d is %d dimensions, "
                    "which must be even and positive", d->rotary_fraction,
                    real_gpt_head_dim(d), real_gpt_rot_dim(d));
        return FALSE;
    }
    const bool llama3 = d->rope_scaling == REAL_ROPE_SCALING_LLAMA3;
    if (d->rope_scaling != REAL_ROPE_SCALING_NONE &&
        (!(d->rope_factor > 0) ||
         (llama3 && !(d->rope_low_freq_factor > 0 &&
                      d->rope_low_freq_factor < d->rope_high_freq_factor &&
                      d->rope_original_positions > 0)))) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "rope scaling needs factor > 0 (%g) and, llama3, 0 < low_freq_factor (%g) < "
                    "high_freq_factor (%g) and original positions > 0 (%d)", d->rope_factor,
                    d->rope_low_freq_factor, d->rope_high_freq_factor,
                    d->rope_original_positions);
        return FALSE;
    }
    if (d->rope_theta <= 0 && (d->positions < 0 || real_gpt_positions(d) < d->seq_len)) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "the position table's %d rows do not hold seq_len = %d", d->positions,
                    d->seq_len);
        return FALSE;
    }
    if (d->attention_window < 0 || d->norm_eps < 0) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "the attention window (%d) and the norm's eps (%g) must not be negative",
                    d->attention_window, d->norm_eps);
        return FALSE;
    }
    if (d->swiglu && d->geglu) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "an MLP is SwiGLU or GeGLU, not both");
        return FALSE;
    }
    /* GEMM dimensions are ints: tokens b s, 3h and f must fit. */
    const int64_t tokens = (int64_t)d->micro_batch * d->seq_len;
    if (tokens > INT_MAX || d->hidden > INT_MAX / 3 || (int64_t)d->ffn_hidden > INT_MAX / 2) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "micro_batch %d x seq_len %d = %" G_GINT64_FORMAT " tokens, 3 x hidden "
                    "%d or 2 x ffn_hidden %d exceeds the int range of a GEMM dimension",
                    d->micro_batch, d->seq_len, tokens, d->hidden, d->ffn_hidden);
        return FALSE;
    }
    /* The largest buffers' byte counts must fit 64 bits: a block's saved attention scores
     * (b a s^2, with room for the rest of its tensors) and the logits (b s V, fp32). */
    guint64 scores, logits;
    if (!g_uint64_checked_mul(&scores, (guint64)tokens, (guint64)d->heads * (guint64)d->seq_len) ||
        !g_uint64_checked_mul(&scores, scores, 16) ||
        !g_uint64_checked_mul(&logits, (guint64)tokens, (guint64)d->vocab * 16)) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "micro_batch %d x heads %d x seq_len %d^2 (or x vocab %d) bytes overflow "
                    "64 bits", d->micro_batch, d->heads, d->seq_len, d->vocab);
        return FALSE;
    }
    return TRUE;
}

gboolean real_gpt_check_backend(const RealBackend *be, const RealGptDims *d, GError **error)
{
    const bool gqa = real_gpt_kv(d) != real_gpt_heads(d);
    const struct {
        bool needed, present;
        const char *entry, *why;
    } needs[] = {
        {d->rmsnorm, be->rmsnorm_fwd && be->rmsnorm_bwd, "rmsnorm_fwd/bwd", "RMSNorm"},
        {real_gpt_gated(d), be->glu_fwd && be->glu_bwd, "glu_fwd/bwd", "a gated MLP"},
        {d->exact_gelu && !real_gpt_gated(d), be->gelu_erf_fwd && be->gelu_erf_bwd,
         "gelu_erf_fwd/bwd", "the exact GELU"},
        {d->rope_theta > 0, be->rope && be->token_embedding_fwd && be->token_embedding_bwd,
         "rope and token_embedding_fwd/bwd", "rotary embeddings"},
        {real_gpt_tp(d) > 1, be->token_embedding_fwd && be->token_embedding_bwd,
         "token_embedding_fwd/bwd", "tensor parallelism's vocabulary rows"},
        {gqa && !d->flash, be->attention_gqa_fwd && be->attention_gqa_bwd,
         "attention_gqa_fwd/bwd", "grouped-query attention"},
        {d->flash, be->flash_attention_fwd && be->flash_attention_bwd,
         "flash_attention_fwd/bwd", "fused attention (--attention flash)"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(needs); i++)
        if (needs[i].needed && !needs[i].present) {
            g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                        "the %s backend has no %s yet, which %s needs", be->name,
                        needs[i].entry, needs[i].why);
            return FALSE;
        }
    return TRUE;
}

int real_gpt_n_units(const RealGptDims *dims)
{
    return dims->layers + 2;
}

/* Appends a tensor to a table being built, placing it right after the previous one. */
static void real_gpt_push(RealGptTensor *out, RealGptInit *init, int *n, const char *name,
                          size_t elems, RealGptInit how)
{
    size_t offset = *n ? out[*n - 1].offset_elems + out[*n - 1].elems : 0;
    out[*n] = (RealGptTensor){.name = name, .offset_elems = offset, .elems = elems};
    init[*n] = how;
    (*n)++;
}

/* A block's twelve tensors in layout order (RealGptBlockTensor), with whether the model has
 * each: the single definition of a block's layout. */
typedef struct {
    const char *name;
    size_t elems;
    RealGptInit init;
    bool present;
} RealGptBlockSpec;

static void real_gpt_block_spec(const RealGptDims *d,
                                RealGptBlockSpec out[REAL_GPT_N_BLOCK_TENSORS])
{
    const size_t h = d->hidden, f = real_gpt_ffn(d), q = real_gpt_qkv_width(d);
    const size_t f1 = real_gpt_fc1_width(d), att = real_gpt_att_width(d);
    const bool ln = !d->rmsnorm, qkv_bias = !(d->no_bias & REAL_GPT_NO_BIAS_QKV);
    const bool proj_bias = !(d->no_bias & REAL_GPT_NO_BIAS_PROJ);
    const bool mlp_bias = !(d->no_bias & REAL_GPT_NO_BIAS_MLP);
    const RealGptBlockSpec spec[REAL_GPT_N_BLOCK_TENSORS] = {
        [REAL_GPT_LN1_G] = {"ln1.weight", h, REAL_GPT_INIT_ONES, true},
        [REAL_GPT_LN1_B] = {"ln1.bias", h, REAL_GPT_INIT_ZEROS, ln},
        [REAL_GPT_QKV_W] = {"qkv.weight", q * h, REAL_GPT_INIT_NORMAL, true},
        [REAL_GPT_QKV_B] = {"qkv.bias", q, REAL_GPT_INIT_ZEROS, qkv_bias},
        [REAL_GPT_PROJ_W] = {"proj.weight", att * h, REAL_GPT_INIT_NORMAL_RESIDUAL, true},
        [REAL_GPT_PROJ_B] = {"proj.bias", h, REAL_GPT_INIT_ZEROS, proj_bias},
        [REAL_GPT_LN2_G] = {"ln2.weight", h, REAL_GPT_INIT_ONES, true},
        [REAL_GPT_LN2_B] = {"ln2.bias", h, REAL_GPT_INIT_ZEROS, ln},
        [REAL_GPT_FC1_W] = {"fc1.weight", h * f1, REAL_GPT_INIT_NORMAL, true},
        [REAL_GPT_FC1_B] = {"fc1.bias", f1, REAL_GPT_INIT_ZEROS, mlp_bias},
        [REAL_GPT_FC2_W] = {"fc2.weight", f * h, REAL_GPT_INIT_NORMAL_RESIDUAL, true},
        [REAL_GPT_FC2_B] = {"fc2.bias", h, REAL_GPT_INIT_ZEROS, mlp_bias},
    };
    memcpy(out, spec, sizeof spec);
}

/* The tensor table of a unit with each tensor's initialisation; the single definition of
 * the layout (zp_model_tensors is the planner's copy, and a test checks they agree). */
static int real_gpt_layout(const RealGptDims *d, int unit,
                           RealGptTensor out[REAL_GPT_MAX_UNIT_TENSORS],
                           RealGptInit init[REAL_GPT_MAX_UNIT_TENSORS])
{
    size_t h = d->hidden;
    int n = 0;
    if (unit == 0) {
        real_gpt_push(out, init, &n, "wte", (size_t)real_gpt_vocab(d) * h, REAL_GPT_INIT_NORMAL);
        if (d->rope_theta <= 0)
            real_gpt_push(out, init, &n, "wpe", (size_t)real_gpt_positions(d) * h,
                          REAL_GPT_INIT_NORMAL);
    } else if (unit >= 1 && unit <= d->layers) {
        RealGptBlockSpec spec[REAL_GPT_N_BLOCK_TENSORS];
        real_gpt_block_spec(d, spec);
        for (int i = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++)
            if (spec[i].present)
                real_gpt_push(out, init, &n, spec[i].name, spec[i].elems, spec[i].init);
    } else if (unit == d->layers + 1) {
        real_gpt_push(out, init, &n, "lnf.weight", h, REAL_GPT_INIT_ONES);
        if (!d->rmsnorm)
            real_gpt_push(out, init, &n, "lnf.bias", h, REAL_GPT_INIT_ZEROS);
        if (d->untied)
            real_gpt_push(out, init, &n, "lm_head.weight", (size_t)real_gpt_vocab(d) * h,
                          REAL_GPT_INIT_NORMAL);
    }
    return n;
}

int real_gpt_unit_tensors(const RealGptDims *dims, int unit,
                          RealGptTensor out[REAL_GPT_MAX_UNIT_TENSORS])
{
    RealGptInit init[REAL_GPT_MAX_UNIT_TENSORS];
    return real_gpt_layout(dims, unit, out, init);
}

size_t real_gpt_unit_elems(const RealGptDims *dims, int unit)
{
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    int n = real_gpt_unit_tensors(dims, unit, t);
    return n ? t[n - 1].offset_elems + t[n - 1].elems : 0;
}

void real_gpt_tensors_at(const RealGptDims *dims, int unit, const RealBf16 *base,
                         RealGptTensors *out)
{
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    const int n = real_gpt_unit_tensors(dims, unit, t);
    memset(out, 0, sizeof *out);
    for (int k = 0; base && k < n; k++)
        out->at[k] = (RealBf16 *)base + t[k].offset_elems;
}

/* Tensor k of unit `unit` (laid out as unit `layout`: 1 for any block) from the fp32
 * gradients in src: stored over dst when fresh (real_gpt_grads_fresh), which it then no
 * longer is, else added to it. */
static void real_gpt_write_grad(RealGpt *gpt, int unit, int k, RealBf16 *dst, const float *src,
                                size_t n_elems)
{
    RealBackend *be = gpt->be;
    if (gpt->fresh[unit] >> k & 1u) {
        gpt->fresh[unit] &= ~(1u << k);
        be->f32_to_bf16(be, dst, src, n_elems);
    } else {
        be->accumulate_bf16(be, dst, src, n_elems);
    }
}

/* dst's tensors first..last-1 of unit `unit` (laid out as unit `layout`) from src, that
 * unit's fp32 gradients laid out contiguously (src[0] is tensor first's first element). */
static void real_gpt_accumulate(RealGpt *gpt, int layout, int unit, const RealGptTensors *dst,
                                const float *src, int first, int last)
{
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    real_gpt_unit_tensors(&gpt->dims, layout, t);
    for (int k = first; k < last; k++)
        real_gpt_write_grad(gpt, unit, k, dst->at[k],
                            src + (t[k].offset_elems - t[first].offset_elems), t[k].elems);
}

static int real_gpt_n_tensors(const RealGptDims *d, int unit)
{
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    return real_gpt_unit_tensors(d, unit, t);
}

uint32_t real_gpt_module_tensors(const RealGptDims *dims, int module)
{
    RealGptBlockSpec spec[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_spec(dims, spec);
    uint32_t bits = 0;
    for (int i = 0, k = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++)
        if (spec[i].present)
            bits |= (i / 2 == module ? 1u : 0u) << k++;
    return bits;
}

size_t real_gpt_param_elems(const RealGptDims *dims)
{
    size_t total = 0;
    for (int u = 0; u < real_gpt_n_units(dims); u++)
        total += real_gpt_unit_elems(dims, u);
    return total;
}

/* ---- memory sizes ---- */

static size_t real_gpt_tokens(const RealGptDims *d)
{
    return (size_t)d->micro_batch * d->seq_len;
}

/* fp32 elements of the saved tensors (LayerNorm statistics, the log-sum-exp), which come
 * first in the allocation. */
static uint64_t real_gpt_saved_f32_elems(const RealGptDims *d)
{
    return (d->rmsnorm ? 0 : 4 * (uint64_t)real_gpt_tokens(d)) +
           (d->flash ? (uint64_t)d->micro_batch * real_gpt_heads(d) * d->seq_len : 0);
}

static uint64_t real_gpt_saved_bf16_elems(const RealGptDims *d)
{
    uint64_t t = real_gpt_tokens(d);
    return t * ((d->parallel_residual ? 3 : 4) * (uint64_t)d->hidden + real_gpt_att_width(d) +
                real_gpt_qkv_width(d) + real_gpt_fc1_width(d) + (uint64_t)real_gpt_ffn(d)) +
           (d->flash ? 0
                     : (uint64_t)d->micro_batch * real_gpt_heads(d) * d->seq_len * d->seq_len);
}

uint64_t real_gpt_block_activation_bytes(const RealGptDims *dims)
{
    return sizeof(float) * real_gpt_saved_f32_elems(dims) +
           sizeof(RealBf16) * real_gpt_saved_bf16_elems(dims);
}

uint64_t real_gpt_checkpoint_bytes(const RealGptDims *dims)
{
    return sizeof(RealBf16) * real_gpt_tokens(dims) * dims->hidden;
}

uint64_t real_gpt_residual_grad_bytes(const RealGptDims *dims)
{
    return sizeof(float) * real_gpt_tokens(dims) * dims->hidden;
}

uint64_t real_gpt_logits_bytes(const RealGptDims *dims)
{
    return sizeof(float) * real_gpt_tokens(dims) * real_gpt_vocab(dims);
}

/* Carves one block's saved-activation allocation into its tensors. */
static RealGptSaved real_gpt_saved_view(const RealGptDims *d, void *base)
{
    size_t t = real_gpt_tokens(d), h = d->hidden, f = real_gpt_ffn(d);
    RealGptSaved sv = {0};
    float *stats = base;
    if (!d->rmsnorm) {
        sv.ln1_mean = stats;
        sv.ln1_rstd = stats + t;
        sv.ln2_mean = stats + 2 * t;
        sv.ln2_rstd = stats + 3 * t;
        stats += 4 * t;
    }
    if (d->flash) {
        sv.lse = stats;
        stats += (size_t)d->micro_batch * real_gpt_heads(d) * d->seq_len;
    }
    RealBf16 *p = (RealBf16 *)stats;
    sv.x = p, p += t * h;
    sv.ln1 = p, p += t * h;
    sv.qkv = p, p += t * real_gpt_qkv_width(d);
    sv.att = p, p += t * real_gpt_att_width(d);
    if (!d->parallel_residual)
        sv.x2 = p, p += t * h;
    sv.ln2 = p, p += t * h;
    sv.fc1 = p, p += t * real_gpt_fc1_width(d);
    sv.gelu = p, p += t * f;
    sv.probs = d->flash ? NULL : p;
    return sv;
}

/* ---- initialisation ---- */

/* SplitMix64's output function: a bijective mix of 64 bits. */
static uint64_t real_gpt_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A uniform double in (0, 1) from 53 bits of a hash. */
static double real_gpt_uniform(uint64_t bits)
{
    return ((double)(bits >> 11) + 0.5) * 0x1.0p-53;
}

/* The standard normal of element `index` of a unit whose stream key is `key`, by Box-Muller
 * on two hashes of (key, index). A counter, not a sequence: any element can be drawn alone,
 * so a rank initialises its own ZeRO-3 slice without drawing the rest of the unit. */
static double real_gpt_normal_at(uint64_t key, uint64_t index)
{
    const uint64_t golden = 0x9e3779b97f4a7c15ull;
    double u1 = real_gpt_uniform(real_gpt_mix64(key + (2 * index + 1) * golden));
    double u2 = real_gpt_uniform(real_gpt_mix64(key + (2 * index + 2) * golden));
    return sqrt(-2.0 * log(u1)) * cos(2.0 * G_PI * u2);
}

/* Column c of this rank's shard of a column-parallel matrix whose columns are `n` segments
 * of widths w[] (q, k, v; gate, up), each split into t pieces: its column in the whole. */
static size_t real_gpt_tp_column(size_t c, const size_t *w, int n, int t, int rank)
{
    size_t base = 0;
    int i = 0;
    for (; i < n - 1 && c >= w[i] / (size_t)t; i++) {
        c -= w[i] / (size_t)t;
        base += w[i];
    }
    return base + (size_t)rank * (w[i] / (size_t)t) + c;
}

/* Element e of tensor `k` of a block's shard (dims.tp > 1): its index in the whole tensor,
 * whose table `whole` is of the dimensions without tensor parallelism. */
static size_t real_gpt_tp_index(const RealGptDims *d, const RealGptDims *whole, int k,
                                size_t e)
{
    const int t = real_gpt_tp(d), r = d->tp_rank;
    const size_t h = d->hidden, kd = (size_t)real_gpt_kv(whole) * real_gpt_head_dim(d);
    const size_t f = whole->ffn_hidden;
    const size_t qkv[3] = {h, kd, kd}, fc1[2] = {f, f};
    const size_t *w = k == REAL_GPT_QKV_W || k == REAL_GPT_QKV_B ? qkv : fc1;
    const int n = k == REAL_GPT_QKV_W || k == REAL_GPT_QKV_B ? 3 : real_gpt_gated(d) ? 2 : 1;
    size_t cols = 0, local = 0;
    for (int i = 0; i < n; i++)
        cols += w[i], local += w[i] / (size_t)t;
    switch (k) {
    case REAL_GPT_QKV_W:
    case REAL_GPT_FC1_W: /* [h, cols] stored [in, out]: row e / local of this rank's columns */
        return e / local * cols + real_gpt_tp_column(e % local, w, n, t, r);
    case REAL_GPT_QKV_B:
    case REAL_GPT_FC1_B:
        return real_gpt_tp_column(e, w, n, t, r);
    case REAL_GPT_PROJ_W: /* [a d, h]: this rank's rows, contiguous */
        return (size_t)r * (h / (size_t)t) * h + e;
    case REAL_GPT_FC2_W:
        return (size_t)r * (f / (size_t)t) * h + e;
    default: /* replicated */
        return e;
    }
}

gboolean real_gpt_init_params_range(const RealGptDims *dims, uint64_t seed, int unit,
                                    size_t first_elem, size_t n_elems, RealBf16 *out,
                                    GError **error)
{
    if (!real_gpt_dims_check(dims, error))
        return FALSE;
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    RealGptInit init[REAL_GPT_MAX_UNIT_TENSORS];
    int n = real_gpt_layout(dims, unit, t, init);
    if (n == 0) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                    "unit %d out of range 0..%d", unit, dims->layers + 1);
        return FALSE;
    }
    const uint64_t key = real_gpt_mix64(seed ^ real_gpt_mix64((uint64_t)unit + 1));
    const uint64_t wte_key = real_gpt_mix64(seed ^ real_gpt_mix64(1)); /* unit 0's */
    const double residual_std = REAL_GPT_INIT_STD / sqrt(2.0 * dims->layers);
    const double std_of[] = {[REAL_GPT_INIT_NORMAL] = REAL_GPT_INIT_STD,
                             [REAL_GPT_INIT_NORMAL_RESIDUAL] = residual_std};
    const size_t end = first_elem + n_elems;
    /* A tensor-parallel shard draws each element where the whole model has it, so the
     * group's shards are the single-rank model's parameters. */
    RealGptDims whole = *dims;
    whole.tp = 0, whole.tp_rank = 0;
    RealGptTensor wt[REAL_GPT_MAX_UNIT_TENSORS];
    RealGptInit winit[REAL_GPT_MAX_UNIT_TENSORS];
    real_gpt_layout(&whole, unit, wt, winit);
    const bool shard = real_gpt_tp(dims) > 1 && unit >= 1 && unit <= dims->layers;
    const size_t rank = (size_t)dims->tp_rank;
    RealGptBlockSpec spec[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_spec(dims, spec);
    int kind[REAL_GPT_MAX_UNIT_TENSORS]; /* a block's tensor k: its RealGptBlockTensor */
    for (int i = 0, k = 0; shard && i < REAL_GPT_N_BLOCK_TENSORS; i++)
        if (spec[i].present)
            kind[k++] = i;
    for (size_t i = 0; i < n_elems; i++)
        out[i] = 0; /* +0.0 in bf16: padding past the unit's end stays 0 */
    for (int k = 0; k < n; k++) {
        const size_t lo = MAX(first_elem, t[k].offset_elems);
        const size_t hi = MIN(end, t[k].offset_elems + t[k].elems);
        /* The word embedding and LM head: this rank's vocabulary rows, contiguous. */
        const bool head = strcmp(t[k].name, "lm_head.weight") == 0;
        const bool rows = strcmp(t[k].name, "wte") == 0 || head;
        /* A tied wte's copy: wte's values (unit 0's key, wte at its offset 0). */
        const bool copy = head && dims->tied_copy;
        for (size_t e = lo; e < hi; e++) {
            const size_t in = e - t[k].offset_elems;
            const size_t at = (copy ? 0 : wt[k].offset_elems) +
                              (shard  ? real_gpt_tp_index(dims, &whole, kind[k], in)
                               : rows ? rank * t[k].elems + in
                                      : in);
            double value = init[k] == REAL_GPT_INIT_ONES    ? 1.0
                           : init[k] == REAL_GPT_INIT_ZEROS ? 0.0
                                                           : std_of[init[k]] *
                                                                 real_gpt_normal_at(
                                                                     copy ? wte_key : key, at);
            out[e - first_elem] = real_bf16_from_f32((float)value);
        }
    }
    return TRUE;
}

gboolean real_gpt_init_params(const RealGptDims *dims, uint64_t seed, int unit,
                              RealBf16 *out, GError **error)
{
    return real_gpt_init_params_range(dims, seed, unit, 0, real_gpt_unit_elems(dims, unit), out,
                                      error);
}

/* ---- runtime ---- */

RealGpt *real_gpt_new(RealBackend *be, const RealGptDims *dims, GError **error)
{
    if (!real_gpt_dims_check(dims, error) || !real_gpt_check_backend(be, dims, error))
        return NULL;
    RealGpt *gpt = g_new0(RealGpt, 1);
    gpt->be = be;
    gpt->dims = *dims;
    be->attention_window = dims->attention_window;
    be->layernorm_eps = dims->rmsnorm ? 0.0f : real_gpt_eps(dims);
    RealGptBlockSpec spec[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_spec(dims, spec);
    size_t offset = 0;
    for (int i = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++) {
        gpt->block_has[i] = spec[i].present;
        gpt->block_offset[i] = offset;
        offset += spec[i].present ? spec[i].elems : 0;
    }
    gpt->block_elems = real_gpt_unit_elems(dims, 1);
    gpt->saved = g_new0(void *, dims->layers);
    gpt->fresh = g_new0(uint32_t, (gsize)dims->layers + 2);
    gpt->run.layer = -1;
    return gpt;
}

void real_gpt_grads_fresh(RealGpt *gpt, int unit, uint32_t tensors)
{
    for (int u = 0; u < gpt->dims.layers + 2; u++)
        if (unit < 0 || u == unit)
            gpt->fresh[u] |= tensors;
}

void real_gpt_set_tp(RealGpt *gpt, const RealGptTpOps *ops, void *ctx)
{
    gpt->tp_ops = ops;
    gpt->tp_ctx = ctx;
}

void real_gpt_free(RealGpt *gpt)
{
    if (!gpt)
        return;
    for (int l = 0; l < gpt->dims.layers; l++)
        gpt->be->free(gpt->be, gpt->saved[l]);
    gpt->be->free(gpt->be, gpt->run.ws); /* a block run module by module, left unfinished */
    if (!gpt->run.backward)
        gpt->be->free(gpt->be, gpt->run.saved);
    g_free(gpt->saved);
    g_free(gpt->fresh);
    g_free(gpt);
}

/* A failed compute's error: the tensor group's sum's when it failed, else no memory. */
static gboolean real_gpt_failed(RealGpt *gpt, GError **error, const char *what)
{
    if (gpt->tp_error) {
        g_propagate_error(error, gpt->tp_error);
        gpt->tp_error = NULL;
        return FALSE;
    }
    g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_NOMEM, "out of backend memory for %s",
                what);
    return FALSE;
}

static gboolean real_gpt_nomem(GError **error, const char *what)
{
    g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_NOMEM, "out of backend memory for %s",
                what);
    return FALSE;
}

static gboolean real_gpt_check_layer(const RealGpt *gpt, int layer, GError **error)
{
    if (layer >= 0 && layer < gpt->dims.layers)
        return TRUE;
    g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID, "layer %d out of range 0..%d",
                layer, gpt->dims.layers - 1);
    return FALSE;
}

/* Token ids index wte rows, so an out-of-range one would read or write out of bounds. */
static gboolean real_gpt_check_tokens(const RealGpt *gpt, const int *tokens, const char *what,
                                      GError **error)
{
    size_t n = real_gpt_tokens(&gpt->dims);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= gpt->dims.vocab) {
            g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                        "%s[%zu] = %d is outside the vocabulary 0..%d", what, i, tokens[i],
                        gpt->dims.vocab - 1);
            return FALSE;
        }
    }
    return TRUE;
}

/* An fp32 workspace of n_elems, NULL when the backend has no memory left. */
static float *real_gpt_workspace(RealGpt *gpt, size_t n_elems)
{
    return gpt->be->alloc(gpt->be, n_elems * sizeof(float), REAL_MEM_WORKSPACE);
}

/* Tensor parallelism: x[0..n) = the sum of every rank's x over the group (nothing at t = 1).
 * A failure is kept in gpt->tp_error for the public call to report. */
static bool real_gpt_tp_sum(RealGpt *gpt, float *x, size_t n)
{
    if (real_gpt_tp(&gpt->dims) == 1)
        return true;
    if (!gpt->tp_ops) {
        g_set_error(&gpt->tp_error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "tensor parallelism without the group's collectives (real_gpt_set_tp)");
        return false;
    }
    return gpt->tp_ops->sum(gpt->tp_ctx, x, n, &gpt->tp_error);
}

/* Tokens as rows of this rank's vocabulary shard (host arrays of b s): local[i] = tokens[i] -
 * tp_rank V / t, or row 0 with mine[i] false where another rank's rows hold the token. */
static void real_gpt_local_tokens(const RealGptDims *d, const int *tokens, int *local,
                                  bool *mine)
{
    const int v = real_gpt_vocab(d), lo = d->tp_rank * v;
    for (size_t i = 0; i < real_gpt_tokens(d); i++) {
        mine[i] = tokens[i] >= lo && tokens[i] < lo + v;
        local[i] = mine[i] ? tokens[i] - lo : 0;
    }
}

/* Zeroes the rows [T, h] of x whose token another rank's rows hold. */
static void real_gpt_zero_others(RealGpt *gpt, float *x, const bool *mine)
{
    const size_t h = gpt->dims.hidden;
    for (size_t i = 0; i < real_gpt_tokens(&gpt->dims); i++)
        if (!mine[i])
            gpt->be->fill(gpt->be, x + i * h, 0, h * sizeof(float));
}

/* Positions of the rows, t for row i s + t (host array of b s). */
static int *real_gpt_positions_of(const RealGptDims *d)
{
    int *pos = g_new(int, real_gpt_tokens(d));
    for (size_t i = 0; i < real_gpt_tokens(d); i++)
        pos[i] = (int)(i % (size_t)d->seq_len);
    return pos;
}

/* VocabParallelEmbedding: xf = the sum over the group of each rank's lookup of the tokens in
 * its rows (0 elsewhere), plus wpe[position] (whole on every rank) after the sum. */
static bool real_gpt_embed_fwd_tp(RealGpt *gpt, const RealGptTensors *embed,
                                  const int *tokens, float *xf)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const size_t n = real_gpt_tokens(d), th = n * d->hidden;
    int *local = g_new(int, n), *pos = real_gpt_positions_of(d);
    bool *mine = g_new(bool, n);
    real_gpt_local_tokens(d, tokens, local, mine);
    be->token_embedding_fwd(be, xf, local, embed->at[0], (int)n, d->hidden);
    real_gpt_zero_others(gpt, xf, mine);
    bool ok = real_gpt_tp_sum(gpt, xf, th);
    if (ok && d->rope_theta <= 0) {
        float *wpe_rows = real_gpt_workspace(gpt, th);
        ok = wpe_rows != NULL;
        if (ok) {
            be->token_embedding_fwd(be, wpe_rows, pos, embed->at[1], (int)n, d->hidden);
            be->add(be, xf, xf, wpe_rows, th);
        }
        be->free(be, wpe_rows);
    }
    g_free(local), g_free(pos), g_free(mine);
    return ok;
}

/* Its backward into the fp32 unit gradients: this rank's rows from the tokens they hold,
 * wpe's from every row. */
static bool real_gpt_embed_bwd_tp(RealGpt *gpt, const int *tokens, const float *dx0,
                                  float *grads)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const size_t n = real_gpt_tokens(d), th = n * d->hidden;
    float *dx = real_gpt_workspace(gpt, th);
    if (!dx)
        return false;
    int *local = g_new(int, n), *pos = real_gpt_positions_of(d);
    bool *mine = g_new(bool, n);
    real_gpt_local_tokens(d, tokens, local, mine);
    be->copy(be, dx, dx0, th * sizeof(float));
    real_gpt_zero_others(gpt, dx, mine);
    be->token_embedding_bwd(be, grads, local, dx, (int)n, d->hidden);
    if (d->rope_theta <= 0)
        be->token_embedding_bwd(be, grads + (size_t)real_gpt_vocab(d) * d->hidden, pos, dx0,
                                (int)n, d->hidden);
    be->free(be, dx);
    g_free(local), g_free(pos), g_free(mine);
    return true;
}

/* The vocab-parallel cross-entropy over logits [rows, v] of this rank's vocabulary rows, as
 * softmax_xent does for the whole vocabulary: each rank's per-row log-sum-exp and target
 * logit (0 where another rank holds the target) gathered over the group (2 fp32 per row),
 * the loss from their combination, and the logits turned into their gradient. Computed on
 * the host (copied there and back on a device backend). */
static bool real_gpt_vocab_xent(RealGpt *gpt, float *logits, const int *targets, int rows,
                                float scale, float *loss_out)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const int v = real_gpt_vocab(d), t = real_gpt_tp(d), lo = d->tp_rank * v;
    const size_t n = (size_t)rows * v;
    float *z = g_try_new(float, n), *stats = g_try_new(float, (size_t)2 * rows * t);
    double *lse = g_try_new(double, rows);
    bool ok = z && stats && lse;
    if (ok) {
        be->copy(be, z, logits, n * sizeof(float));
        float *own = stats + (size_t)2 * rows * d->tp_rank;
        for (int i = 0; i < rows; i++) {
            const float *row = z + (size_t)i * v;
            float max = row[0];
            for (int j = 1; j < v; j++)
                max = fmaxf(max, row[j]);
            double sum = 0;
            for (int j = 0; j < v; j++)
                sum += exp((double)row[j] - max);
            const int target = targets[i] - lo;
            own[2 * i] = (float)(max + log(sum));
            own[2 * i + 1] = target >= 0 && target < v ? row[target] : 0.0f;
        }
        ok = gpt->tp_ops->gather_host(gpt->tp_ctx, stats, (size_t)2 * rows * sizeof(float),
                                      &gpt->tp_error);
    }
    double loss = 0;
    for (int i = 0; ok && i < rows; i++) {
        double max = -INFINITY, sum = 0, target_logit = 0;
        for (int q = 0; q < t; q++)
            max = fmax(max, stats[(size_t)2 * rows * q + 2 * i]);
        for (int q = 0; q < t; q++) {
            sum += exp(stats[(size_t)2 * rows * q + 2 * i] - max);
            target_logit += stats[(size_t)2 * rows * q + 2 * i + 1];
        }
        lse[i] = max + log(sum);
        loss += lse[i] - target_logit;
    }
    for (int i = 0; ok && i < rows; i++)
        for (int j = 0; j < v; j++) {
            float *g = z + (size_t)i * v + j;
            const double p = exp((double)*g - lse[i]) - (j + lo == targets[i] ? 1.0 : 0.0);
            *g = (float)(p * scale / rows);
        }
    if (ok) {
        be->copy(be, logits, z, n * sizeof(float));
        *loss_out = (float)(loss / rows);
    }
    g_free(z), g_free(stats), g_free(lse);
    return ok;
}

/* ---- embeddings ---- */

gboolean real_gpt_embed_forward(RealGpt *gpt, const RealBf16 *embed_params, const int *tokens,
                                RealBf16 *x0, GError **error)
{
    RealGptTensors v;
    real_gpt_tensors_at(&gpt->dims, 0, embed_params, &v);
    return real_gpt_embed_forward_t(gpt, &v, tokens, x0, error);
}

gboolean real_gpt_embed_forward_t(RealGpt *gpt, const RealGptTensors *embed, const int *tokens,
                                  RealBf16 *x0, GError **error)
{
    if (!real_gpt_check_tokens(gpt, tokens, "tokens", error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    size_t n = real_gpt_tokens(d) * d->hidden;
    float *xf = real_gpt_workspace(gpt, n);
    if (!xf)
        return real_gpt_nomem(error, "the embedding output");
    if (real_gpt_tp(d) > 1) {
        if (!real_gpt_embed_fwd_tp(gpt, embed, tokens, xf)) {
            be->free(be, xf);
            return real_gpt_failed(gpt, error, "the embedding output");
        }
    } else if (d->rope_theta > 0) {
        be->token_embedding_fwd(be, xf, tokens, embed->at[0], (int)real_gpt_tokens(d),
                                d->hidden);
    } else {
        be->embedding_fwd(be, xf, tokens, embed->at[0], embed->at[1], d->micro_batch,
                          d->seq_len, d->hidden);
    }
    be->f32_to_bf16(be, x0, xf, n);
    be->free(be, xf);
    return TRUE;
}

gboolean real_gpt_embed_backward(RealGpt *gpt, const int *tokens, const float *dx0,
                                 RealBf16 *embed_grads, GError **error)
{
    RealGptTensors v;
    real_gpt_tensors_at(&gpt->dims, 0, embed_grads, &v);
    return real_gpt_embed_backward_t(gpt, tokens, dx0, &v, error);
}

gboolean real_gpt_embed_backward_t(RealGpt *gpt, const int *tokens, const float *dx0,
                                   const RealGptTensors *embed_grads, GError **error)
{
    if (!real_gpt_check_tokens(gpt, tokens, "tokens", error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    size_t n = real_gpt_unit_elems(d, 0);
    float *grads = real_gpt_workspace(gpt, n);
    if (!grads)
        return real_gpt_nomem(error, "the embedding gradients");
    be->fill(be, grads, 0, n * sizeof(float));
    bool ok = true;
    if (real_gpt_tp(d) > 1)
        ok = real_gpt_embed_bwd_tp(gpt, tokens, dx0, grads);
    else if (d->rope_theta > 0)
        be->token_embedding_bwd(be, grads, tokens, dx0, (int)real_gpt_tokens(d), d->hidden);
    else
        be->embedding_bwd(be, grads, grads + (size_t)d->vocab * d->hidden, tokens, dx0,
                          d->micro_batch, d->seq_len, d->hidden);
    if (ok)
        real_gpt_accumulate(gpt, 0, 0, embed_grads, grads, 0, real_gpt_n_tensors(d, 0));
    be->free(be, grads);
    return ok ? TRUE : real_gpt_nomem(error, "the embedding gradients");
}

/* ---- transformer block ---- */

/* Rounds a freshly computed activation to bf16 (every activation tensor is bf16 in mixed
 * precision) and, when saving, stores it: later ops and the backward then see the same
 * values, whether or not activations were saved. */
static void real_gpt_keep(RealBackend *be, float *x, RealBf16 *saved, size_t n_elems)
{
    be->round_bf16(be, x, n_elems);
    if (saved)
        be->f32_to_bf16(be, saved, x, n_elems);
}

/* y[T,n] = x[T,k] W[k,n] + bias, W and bias taken from the block's parameters. A
 * row-parallel layer (proj, fc2) sums its partial products over the tensor group before its
 * bias, which every rank holds whole and adds once to the sum (Megatron's
 * RowParallelLinear). */
static bool real_gpt_linear(RealGpt *gpt, RealBf16 *const *params, RealGptBlockTensor weight,
                            const float *x, float *y, int n, int k)
{
    RealBackend *be = gpt->be;
    int t = (int)real_gpt_tokens(&gpt->dims);
    if (!be->gemm(be, false, false, t, n, k, 1.0f, REAL_DTYPE_F32, x, REAL_DTYPE_BF16,
                  params[weight], 0.0f, y))
        return false;
    const bool row_parallel = weight == REAL_GPT_PROJ_W || weight == REAL_GPT_FC2_W;
    if (row_parallel && !real_gpt_tp_sum(gpt, y, (size_t)t * n))
        return false;
    if (gpt->block_has[weight + 1])
        be->bias_fwd(be, y, params[weight + 1], t, n);
    return true;
}

/* A block's norm forward: LayerNorm (gain, bias; statistics kept in mean and rstd) or
 * RMSNorm (gain; nothing kept). */
static void real_gpt_norm_fwd(RealGpt *gpt, RealBf16 *const *p, RealGptBlockTensor gain,
                              float *y, float *mean, float *rstd, const float *x)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden;
    if (d->rmsnorm)
        be->rmsnorm_fwd(be, y, x, p[gain], t, h, real_gpt_eps(d));
    else
        be->layernorm_fwd(be, y, mean, rstd, x, p[gain],
                          p[gain + 1], t, h);
}

/* Its backward: dx += d/dx, the gain's (and bias's) gradients into g. */
static void real_gpt_norm_bwd(RealGpt *gpt, RealBf16 *const *p, float *g,
                              RealGptBlockTensor gain, float *dx, const float *dy,
                              const float *x, const float *mean, const float *rstd)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden;
    const size_t *off = gpt->block_offset;
    if (d->rmsnorm)
        be->rmsnorm_bwd(be, dx, g + off[gain], dy, x, p[gain], t, h, real_gpt_eps(d));
    else
        be->layernorm_bwd(be, dx, g + off[gain], g + off[gain + 1], dy, x, mean, rstd,
                          p[gain], t, h);
}

/* The block forward's fp32 workspace, T(3h + q + f1 + f + 4) + b a s floats, and where the
 * norm statistics and the log-sum-exp go (into the saved activations when saving). */
typedef struct {
    float *x, *a, *qkv, *x2, *u, *act;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} RealGptFwdBufs;

static size_t real_gpt_fwd_ws_elems(const RealGptDims *d)
{
    return real_gpt_tokens(d) * (3 * (size_t)d->hidden + real_gpt_qkv_width(d) +
                                 real_gpt_fc1_width(d) + real_gpt_ffn(d) + 4) +
           (size_t)d->micro_batch * real_gpt_heads(d) * d->seq_len;
}

static RealGptFwdBufs real_gpt_fwd_bufs(const RealGptDims *d, float *ws, const RealGptSaved *sv)
{
    size_t t = real_gpt_tokens(d), th = t * d->hidden;
    RealGptFwdBufs b = {.x = ws, .a = ws + th, .qkv = ws + 2 * th};
    b.x2 = b.qkv + t * real_gpt_qkv_width(d);
    b.u = b.x2 + th;
    b.act = real_gpt_gated(d) ? b.u + t * real_gpt_fc1_width(d) : b.u; /* GELU: in place */
    float *stats = b.u + t * real_gpt_fc1_width(d) + t * real_gpt_ffn(d);
    const bool saved_stats = sv && !d->rmsnorm;
    b.ln1_mean = saved_stats ? sv->ln1_mean : stats;
    b.ln1_rstd = saved_stats ? sv->ln1_rstd : stats + t;
    b.ln2_mean = saved_stats ? sv->ln2_mean : stats + 2 * t;
    b.ln2_rstd = saved_stats ? sv->ln2_rstd : stats + 3 * t;
    b.lse = sv && d->flash ? sv->lse : stats + 4 * t;
    return b;
}

/* The attention of qkv into out: fused (keeping the log-sum-exp), grouped-query or, with as
 * many key/value heads as heads, the original entry (which every backend has). */
static bool real_gpt_attention_fwd(RealGpt *gpt, float *out, RealBf16 *probs, float *lse,
                                   const float *qkv)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const int b = d->micro_batch, s = d->seq_len, a = real_gpt_heads(d), k = real_gpt_kv(d);
    const int hd = real_gpt_head_dim(d);
    if (d->flash)
        return be->flash_attention_fwd(be, out, lse, qkv, b, s, a, k, hd);
    if (k != a)
        return be->attention_gqa_fwd(be, out, probs, REAL_DTYPE_BF16, qkv, b, s, a, k, hd);
    return be->attention_fwd(be, out, probs, REAL_DTYPE_BF16, qkv, b, s, a, hd);
}

/* Module m of the block forward in its workspace (RealGptFwdBufs), with the parameter-free
 * work that follows it up to the next module (zp_cost.c block_fwd tags the same kernels):
 *   ln1   x = x_in (fp32, and kept whole when saving), a = norm1(x)
 *   qkv   qkv = a Wqkv + b (rotated), a = attention(qkv)
 *   proj  x2 = x + a Wp + bp
 *   ln2   a = norm2(y), y = x2, or the block input x under a parallel residual
 *   fc1   u = a W1 + b1, act = GELU(u) or the gated unit (in place for GELU)
 *   fc2   x = x2 + act W2 + b2 (x is dead once norm2 has read it), x_out = x
 * sv NULL when not saving. */
static bool real_gpt_fwd_module(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv,
                                const RealGptFwdBufs *b, int m, const RealBf16 *x_in,
                                RealBf16 *x_out)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden, q = (int)real_gpt_qkv_width(d);
    int f = real_gpt_ffn(d), f1 = (int)real_gpt_fc1_width(d);
    size_t th = (size_t)t * h, tf = (size_t)t * f;
    const RealRope rope = real_gpt_rope(d);
    switch (m) {
    case REAL_GPT_MOD_LN1:
        be->bf16_to_f32(be, b->x, x_in, th);
        if (sv)
            be->copy(be, sv->x, x_in, th * sizeof(RealBf16));
        real_gpt_norm_fwd(gpt, p, REAL_GPT_LN1_G, b->a, b->ln1_mean, b->ln1_rstd, b->x);
        real_gpt_keep(be, b->a, sv ? sv->ln1 : NULL, th);
        return true;
    case REAL_GPT_MOD_QKV:
        if (!real_gpt_linear(gpt, p, REAL_GPT_QKV_W, b->a, b->qkv, q, h))
            return false;
        if (d->rope_theta > 0 &&
            !be->rope(be, b->qkv, d->micro_batch, d->seq_len, real_gpt_heads(d),
                      real_gpt_kv(d), real_gpt_head_dim(d), &rope, false))
            return false;
        real_gpt_keep(be, b->qkv, sv ? sv->qkv : NULL, (size_t)t * q);
        if (!real_gpt_attention_fwd(gpt, b->a, sv ? sv->probs : NULL, b->lse, b->qkv))
            return false;
        real_gpt_keep(be, b->a, sv ? sv->att : NULL, th);
        return true;
    case REAL_GPT_MOD_PROJ:
        if (!real_gpt_linear(gpt, p, REAL_GPT_PROJ_W, b->a, b->x2, h,
                             (int)real_gpt_att_width(d)))
            return false;
        be->add(be, b->x2, b->x2, b->x, th);
        real_gpt_keep(be, b->x2, sv ? sv->x2 : NULL, th); /* sv->x2 NULL: parallel residual */
        return true;
    case REAL_GPT_MOD_LN2:
        real_gpt_norm_fwd(gpt, p, REAL_GPT_LN2_G, b->a, b->ln2_mean, b->ln2_rstd,
                          d->parallel_residual ? b->x : b->x2);
        real_gpt_keep(be, b->a, sv ? sv->ln2 : NULL, th);
        return true;
    case REAL_GPT_MOD_FC1:
        if (!real_gpt_linear(gpt, p, REAL_GPT_FC1_W, b->a, b->u, f1, h))
            return false;
        real_gpt_keep(be, b->u, sv ? sv->fc1 : NULL, (size_t)t * f1);
        if (real_gpt_gated(d))
            be->glu_fwd(be, b->act, b->u, t, f, real_gpt_act(d));
        else if (d->exact_gelu)
            be->gelu_erf_fwd(be, b->act, b->u, tf);
        else
            be->gelu_fwd(be, b->act, b->u, tf);
        real_gpt_keep(be, b->act, sv ? sv->gelu : NULL, tf);
        return true;
    default:
        if (!real_gpt_linear(gpt, p, REAL_GPT_FC2_W, b->act, b->x, h, f))
            return false;
        be->add(be, b->x, b->x, b->x2, th);
        be->f32_to_bf16(be, x_out, b->x, th);
        return true;
    }
}

/* A block's view indexed by RealGptBlockTensor (absent tensors NULL). */
static void real_gpt_block_ptrs(const RealGpt *gpt, const RealGptTensors *v,
                                RealBf16 *out[REAL_GPT_N_BLOCK_TENSORS])
{
    for (int i = 0, k = 0; i < REAL_GPT_N_BLOCK_TENSORS; i++)
        out[i] = gpt->block_has[i] ? v->at[k++] : NULL;
}

gboolean real_gpt_block_forward(RealGpt *gpt, int layer, const RealBf16 *block_params,
                                const RealBf16 *x_in, RealBf16 *x_out,
                                gboolean save_activations, GError **error)
{
    RealGptTensors v;
    real_gpt_tensors_at(&gpt->dims, 1, block_params, &v);
    return real_gpt_block_forward_t(gpt, layer, &v, x_in, x_out, save_activations, error);
}

/* Whether module m of block `layer` is the next of a run in that direction (a new run starts
 * at the direction's first module when none is under way). */
static gboolean real_gpt_run_next(RealGpt *gpt, int layer, int m, bool backward, GError **error)
{
    const int step = backward ? REAL_GPT_N_MODULES - 1 - m : m;
    const bool fresh = gpt->run.layer < 0 && step == 0;
    if (m < 0 || m >= REAL_GPT_N_MODULES ||
        !(fresh || (gpt->run.layer == layer && gpt->run.backward == backward &&
                    gpt->run.done == step))) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d: module %d of its %s out of order", layer, m,
                    backward ? "backward" : "forward");
        return FALSE;
    }
    return TRUE;
}

/* Ends a run: its workspace freed; on failure its saved activations (forward) too. */
static gboolean real_gpt_run_end(RealGpt *gpt, bool ok, const char *what, GError **error)
{
    RealBackend *be = gpt->be;
    be->free(be, gpt->run.ws);
    if (!ok && !gpt->run.backward)
        be->free(be, gpt->run.saved);
    gpt->run.layer = -1;
    gpt->run.ws = NULL;
    gpt->run.saved = NULL;
    return ok ? TRUE : real_gpt_failed(gpt, error, what);
}

gboolean real_gpt_block_forward_module_t(RealGpt *gpt, int layer, int module,
                                         const RealGptTensors *block, const RealBf16 *x_in,
                                         RealBf16 *x_out, gboolean save_activations,
                                         GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error) ||
        !real_gpt_run_next(gpt, layer, module, false, error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    if (module == REAL_GPT_MOD_LN1) {
        if (save_activations && gpt->saved[layer]) {
            g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                        "block %d already holds saved activations (forward twice?)", layer);
            return FALSE;
        }
        void *saved = NULL;
        if (save_activations) {
            saved = be->alloc(be, real_gpt_block_activation_bytes(d), REAL_MEM_ACTIVATIONS);
            if (!saved)
                return real_gpt_nomem(error, "saved activations");
        }
        gpt->run.layer = layer, gpt->run.done = 0, gpt->run.backward = false;
        gpt->run.saved = saved;
        gpt->run.ws = real_gpt_workspace(gpt, real_gpt_fwd_ws_elems(d));
        if (!gpt->run.ws)
            return real_gpt_run_end(gpt, false, "the block forward workspace", error);
    }
    RealGptSaved sv = {0};
    if (gpt->run.saved)
        sv = real_gpt_saved_view(d, gpt->run.saved);
    const RealGptFwdBufs b = real_gpt_fwd_bufs(d, gpt->run.ws, gpt->run.saved ? &sv : NULL);
    RealBf16 *p[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_ptrs(gpt, block, p);
    if (!real_gpt_fwd_module(gpt, p, gpt->run.saved ? &sv : NULL, &b, module, x_in, x_out))
        return real_gpt_run_end(gpt, false, "the block forward workspace", error);
    if (++gpt->run.done < REAL_GPT_N_MODULES)
        return TRUE;
    gpt->saved[layer] = gpt->run.saved;
    return real_gpt_run_end(gpt, true, NULL, error);
}

gboolean real_gpt_block_forward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                  const RealBf16 *x_in, RealBf16 *x_out,
                                  gboolean save_activations, GError **error)
{
    for (int m = 0; m < REAL_GPT_N_MODULES; m++)
        if (!real_gpt_block_forward_module_t(gpt, layer, m, block, x_in, x_out,
                                             save_activations, error))
            return FALSE;
    return TRUE;
}

void *real_gpt_take_saved(RealGpt *gpt, int layer)
{
    g_return_val_if_fail(layer >= 0 && layer < gpt->dims.layers, NULL);
    void *saved = gpt->saved[layer];
    gpt->saved[layer] = NULL;
    return saved;
}

gboolean real_gpt_put_saved(RealGpt *gpt, int layer, void *saved, GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error))
        return FALSE;
    if (gpt->saved[layer]) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d already holds saved activations", layer);
        return FALSE;
    }
    gpt->saved[layer] = saved;
    return TRUE;
}

/* dW += x^T dy for a weight [k,n] given x [T,k] (bf16 saved) and dy [T,n] (fp32); bias
 * gradient too; writes into the unit's fp32 gradient scratch g. */
static bool real_gpt_linear_param_grads(RealGpt *gpt, float *g, RealGptBlockTensor weight,
                                        const RealBf16 *x, const float *dy, int n, int k)
{
    RealBackend *be = gpt->be;
    int t = (int)real_gpt_tokens(&gpt->dims);
    if (!be->gemm(be, true, false, k, n, t, 1.0f, REAL_DTYPE_BF16, x, REAL_DTYPE_F32, dy, 1.0f,
                  g + gpt->block_offset[weight]))
        return false;
    if (gpt->block_has[weight + 1])
        be->bias_bwd(be, g + gpt->block_offset[weight + 1], dy, t, n);
    return true;
}

/* dx[T,k] = dy[T,n] W^T for a block weight W [k,n]. */
static bool real_gpt_linear_input_grad(RealGpt *gpt, RealBf16 *const *p,
                                       RealGptBlockTensor weight, const float *dy, float *dx,
                                       int n, int k)
{
    RealBackend *be = gpt->be;
    int t = (int)real_gpt_tokens(&gpt->dims);
    return be->gemm(be, false, true, t, k, n, 1.0f, REAL_DTYPE_F32, dy, REAL_DTYPE_BF16,
                    p[weight], 0.0f, dx);
}

/* The block backward's fp32 workspace, unit + T(2 f1 + 3h + 2q) floats: the unit's parameter
 * gradients gather in g and reach the bf16 gradients in one accumulation. */
typedef struct {
    float *g, *df, *uf, *dh, *xh, *dx2, *qkv, *dqkv;
} RealGptBwdBufs;

static size_t real_gpt_bwd_ws_elems(const RealGpt *gpt)
{
    const RealGptDims *d = &gpt->dims;
    return gpt->block_elems +
           real_gpt_tokens(d) * (2 * real_gpt_fc1_width(d) + 3 * (size_t)d->hidden +
                                 2 * real_gpt_qkv_width(d));
}

static RealGptBwdBufs real_gpt_bwd_bufs(const RealGpt *gpt, float *ws)
{
    const RealGptDims *d = &gpt->dims;
    size_t t = real_gpt_tokens(d), th = t * d->hidden, tf1 = t * real_gpt_fc1_width(d);
    RealGptBwdBufs b = {.g = ws, .df = ws + gpt->block_elems};
    b.uf = b.df + tf1;
    b.dh = b.uf + tf1;
    b.xh = b.dh + th;
    b.dx2 = b.xh + th;
    b.qkv = b.dx2 + th;
    b.dqkv = b.qkv + t * real_gpt_qkv_width(d);
    return b;
}

/* dqkv from dout and the saved attention: the fused kernel's backward (which reads the
 * forward's output, widened into out_scratch), the grouped-query one or the original. */
static bool real_gpt_attention_bwd(RealGpt *gpt, const RealGptSaved *sv, float *dqkv,
                                   const float *dout, const float *qkv, float *out_scratch)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    const int b = d->micro_batch, s = d->seq_len, a = real_gpt_heads(d), k = real_gpt_kv(d);
    const int hd = real_gpt_head_dim(d);
    if (d->flash) {
        be->bf16_to_f32(be, out_scratch, sv->att, real_gpt_tokens(d) * real_gpt_att_width(d));
        return be->flash_attention_bwd(be, dqkv, dout, qkv, out_scratch, sv->lse, b, s, a, k,
                                       hd);
    }
    if (k != a)
        return be->attention_gqa_bwd(be, dqkv, dout, qkv, sv->probs, REAL_DTYPE_BF16, b, s, a,
                                     k, hd);
    return be->attention_bwd(be, dqkv, dout, qkv, sv->probs, REAL_DTYPE_BF16, b, s, a, hd);
}

/* Module m of the block backward in its workspace (RealGptBwdBufs), with the parameter-free
 * backward that precedes it up to the previous module (zp_cost.c block_bwd tags the same
 * kernels), in the order fc2, fc1, ln2, proj, qkv, ln1:
 *   fc2   g = 0; fc2's gradients from dy, df = dy W2^T, then the activation's backward
 *   fc1   fc1's gradients, dh = dfc1 W1^T (summed over the tensor group)
 *   ln2   dx2 = dy + norm2's backward of dh (the MLP's part of dL/dz, z = x2 or x)
 *   proj  proj's gradients from datt = dx2 (dy under a parallel residual), dh = datt Wp^T,
 *         then the attention's and rotary backward into dqkv
 *   qkv   qkv's gradients, dh = dqkv Wqkv^T (summed over the tensor group)
 *   ln1   dx = dx2 + norm1's backward of dh
 * dy is last read (ln2, or proj under a parallel residual) before dx is first written (ln1),
 * so they may alias. */
static bool real_gpt_bwd_module(RealGpt *gpt, RealBf16 *const *p, const RealGptSaved *sv,
                                const RealGptBwdBufs *b, int m, const float *dy, float *dx)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden, f = real_gpt_ffn(d);
    int f1 = (int)real_gpt_fc1_width(d), q = (int)real_gpt_qkv_width(d);
    int att = (int)real_gpt_att_width(d);
    size_t th = (size_t)t * h;
    float *dfc1 = real_gpt_gated(d) ? b->uf : b->df;
    const RealRope rope = real_gpt_rope(d);
    switch (m) {
    case REAL_GPT_MOD_FC2:
        be->fill(be, b->g, 0, gpt->block_elems * sizeof(float));
        if (!real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_FC2_W, sv->gelu, dy, h, f) ||
            !real_gpt_linear_input_grad(gpt, p, REAL_GPT_FC2_W, dy, b->df, h, f))
            return false;
        /* dfc1: GELU's backward in place over df, or the gated one over the widened gate
         * and up. */
        be->bf16_to_f32(be, b->uf, sv->fc1, (size_t)t * f1);
        if (real_gpt_gated(d))
            be->glu_bwd(be, b->uf, b->df, b->uf, t, f, real_gpt_act(d));
        else if (d->exact_gelu)
            be->gelu_erf_bwd(be, b->df, b->df, b->uf, (size_t)t * f);
        else
            be->gelu_bwd(be, b->df, b->df, b->uf, (size_t)t * f);
        return true;
    case REAL_GPT_MOD_FC1:
        /* Column-parallel fc1: its input gradient is summed over the tensor group. */
        return real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_FC1_W, sv->ln2, dfc1, f1, h) &&
               real_gpt_linear_input_grad(gpt, p, REAL_GPT_FC1_W, dfc1, b->dh, f1, h) &&
               real_gpt_tp_sum(gpt, b->dh, th);
    case REAL_GPT_MOD_LN2:
        be->bf16_to_f32(be, b->xh, d->parallel_residual ? sv->x : sv->x2, th);
        be->copy(be, b->dx2, dy, th * sizeof(float));
        real_gpt_norm_bwd(gpt, p, b->g, REAL_GPT_LN2_G, b->dx2, b->dh, b->xh, sv->ln2_mean,
                          sv->ln2_rstd);
        return true;
    case REAL_GPT_MOD_PROJ: {
        const float *datt = d->parallel_residual ? dy : b->dx2;
        if (!real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_PROJ_W, sv->att, datt, h, att) ||
            !real_gpt_linear_input_grad(gpt, p, REAL_GPT_PROJ_W, datt, b->dh, h, att))
            return false;
        be->bf16_to_f32(be, b->qkv, sv->qkv, (size_t)t * q);
        if (!real_gpt_attention_bwd(gpt, sv, b->dqkv, b->dh, b->qkv, b->xh))
            return false;
        return d->rope_theta <= 0 ||
               be->rope(be, b->dqkv, d->micro_batch, d->seq_len, real_gpt_heads(d),
                        real_gpt_kv(d), real_gpt_head_dim(d), &rope, true);
    }
    case REAL_GPT_MOD_QKV:
        /* Column-parallel qkv: its input gradient is summed over the tensor group. */
        return real_gpt_linear_param_grads(gpt, b->g, REAL_GPT_QKV_W, sv->ln1, b->dqkv, q, h) &&
               real_gpt_linear_input_grad(gpt, p, REAL_GPT_QKV_W, b->dqkv, b->dh, q, h) &&
               real_gpt_tp_sum(gpt, b->dh, th);
    default:
        be->bf16_to_f32(be, b->xh, sv->x, th);
        be->copy(be, dx, b->dx2, th * sizeof(float));
        real_gpt_norm_bwd(gpt, p, b->g, REAL_GPT_LN1_G, dx, b->dh, b->xh, sv->ln1_mean,
                          sv->ln1_rstd);
        return true;
    }
}

gboolean real_gpt_block_backward(RealGpt *gpt, int layer, const RealBf16 *block_params,
                                 const float *dx_out, float *dx_in, RealBf16 *block_grads,
                                 GError **error)
{
    RealGptTensors p, g;
    real_gpt_tensors_at(&gpt->dims, 1, block_params, &p);
    real_gpt_tensors_at(&gpt->dims, 1, block_grads, &g);
    return real_gpt_block_backward_t(gpt, layer, &p, dx_out, dx_in, &g, error);
}

/* Writes module m's gradients (its tensors are consecutive in the block's list) from the
 * workspace g into dst of block `layer`: stored where fresh, else added. */
static void real_gpt_add_module_grads(RealGpt *gpt, int layer, int m,
                                      const RealGptTensors *dst, const float *g)
{
    const RealGptDims *d = &gpt->dims;
    const uint32_t bits = real_gpt_module_tensors(d, m);
    if (!bits)
        return;
    const int first = g_bit_nth_lsf(bits, -1);
    int last = first;
    while (last < 32 && (bits >> last & 1u))
        last++;
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    real_gpt_unit_tensors(d, 1, t);
    real_gpt_accumulate(gpt, 1, layer + 1, dst, g + t[first].offset_elems, first, last);
}

gboolean real_gpt_block_backward_module_t(RealGpt *gpt, int layer, int module,
                                          const RealGptTensors *block, const float *dx_out,
                                          float *dx_in, const RealGptTensors *block_grads,
                                          GError **error)
{
    if (!real_gpt_check_layer(gpt, layer, error) ||
        !real_gpt_run_next(gpt, layer, module, true, error))
        return FALSE;
    if (!gpt->saved[layer]) {
        g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_STATE,
                    "block %d has no saved activations: forward it with save_activations "
                    "(recompute) before its backward",
                    layer);
        return FALSE;
    }
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    if (module == REAL_GPT_MOD_FC2) {
        gpt->run.layer = layer, gpt->run.done = 0, gpt->run.backward = true;
        gpt->run.ws = real_gpt_workspace(gpt, real_gpt_bwd_ws_elems(gpt));
        if (!gpt->run.ws)
            return real_gpt_run_end(gpt, false, "the block backward workspace", error);
    }
    const RealGptSaved sv = real_gpt_saved_view(d, gpt->saved[layer]);
    const RealGptBwdBufs b = real_gpt_bwd_bufs(gpt, gpt->run.ws);
    RealBf16 *p[REAL_GPT_N_BLOCK_TENSORS];
    real_gpt_block_ptrs(gpt, block, p);
    if (!real_gpt_bwd_module(gpt, p, &sv, &b, module, dx_out, dx_in))
        return real_gpt_run_end(gpt, false, "the block backward workspace", error);
    if (block_grads)
        real_gpt_add_module_grads(gpt, layer, module, block_grads, b.g);
    if (++gpt->run.done < REAL_GPT_N_MODULES)
        return TRUE;
    real_gpt_run_end(gpt, true, NULL, error);
    be->free(be, gpt->saved[layer]);
    gpt->saved[layer] = NULL;
    return TRUE;
}

gboolean real_gpt_block_backward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                   const float *dx_out, float *dx_in,
                                   const RealGptTensors *block_grads, GError **error)
{
    for (int m = REAL_GPT_N_MODULES - 1; m >= 0; m--)
        if (!real_gpt_block_backward_module_t(gpt, layer, m, block, dx_out, dx_in, block_grads,
                                              error))
            return FALSE;
    return TRUE;
}

/* ---- head: final norm, LM head (tied or its own), loss ---- */

/* The head in workspace ws (T(2h + 2) + h(V + 2) floats) and logits [T,V]; wte is the head
 * weight (unit 0's when tied, unit L+1's lm_head when not) and gwte_out its gradient. */
static bool real_gpt_head_compute(RealGpt *gpt, const RealGptTensors *lnf, const RealBf16 *wte,
                                  const RealBf16 *x_last, const int *targets, float dloss_scale,
                                  float *loss_out, float *dx_last,
                                  const RealGptTensors *final_ln_grads, RealBf16 *gwte_out,
                                  float *ws, float *logits)
{
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    int t = (int)real_gpt_tokens(d), h = d->hidden, v = real_gpt_vocab(d);
    size_t th = (size_t)t * h;
    float *xf = ws, *y = xf + th, *mean = y + th, *rstd = mean + t, *gwte = rstd + t;
    float *gln = gwte + (size_t)v * h;
    const int norm_tensors = d->rmsnorm ? 1 : 2;

    be->bf16_to_f32(be, xf, x_last, th);
    if (d->rmsnorm)
        be->rmsnorm_fwd(be, y, xf, lnf->at[0], t, h, real_gpt_eps(d));
    else
        be->layernorm_fwd(be, y, mean, rstd, xf, lnf->at[0], lnf->at[1], t, h);
    /* The LM-head GEMM reads the normalised stream as a bf16 tensor, as mixed precision
     * does; its backward uses the same rounded values. */
    be->round_bf16(be, y, th);
    if (!be->gemm(be, false, true, t, v, h, 1.0f, REAL_DTYPE_F32, y, REAL_DTYPE_BF16, wte, 0.0f,
                  logits))
        return false;
    /* Tensor parallelism: the logits of this rank's vocabulary rows (Megatron's
     * vocab-parallel head). */
    if (real_gpt_tp(d) > 1) {
        if (!real_gpt_vocab_xent(gpt, logits, targets, t, dloss_scale, loss_out))
            return false;
    } else {
        be->softmax_xent(be, logits, targets, t, v, dloss_scale, loss_out);
    }
    /* logits = y wte^T: dwte = dlogits^T y, then dy = dlogits wte into y's buffer (y is
     * dead once dwte is formed), summed over the tensor group. */
    if (!be->gemm(be, true, false, v, h, t, 1.0f, REAL_DTYPE_F32, logits, REAL_DTYPE_F32, y,
                  0.0f, gwte))
        return false;
    real_gpt_write_grad(gpt, d->untied ? d->layers + 1 : 0,
                        d->untied ? real_gpt_n_tensors(d, d->layers + 1) - 1 : 0, gwte_out, gwte,
                        (size_t)v * h);
    if (!be->gemm(be, false, false, t, h, v, 1.0f, REAL_DTYPE_F32, logits, REAL_DTYPE_BF16, wte,
                  0.0f, y) ||
        !real_gpt_tp_sum(gpt, y, th))
        return false;
    be->fill(be, gln, 0, 2 * (size_t)h * sizeof(float));
    be->fill(be, dx_last, 0, th * sizeof(float));
    if (d->rmsnorm)
        be->rmsnorm_bwd(be, dx_last, gln, y, xf, lnf->at[0], t, h, real_gpt_eps(d));
    else
        be->layernorm_bwd(be, dx_last, gln, gln + h, y, xf, mean, rstd, lnf->at[0], t, h);
    real_gpt_accumulate(gpt, d->layers + 1, d->layers + 1, final_ln_grads, gln, 0, norm_tensors);
    return true;
}

gboolean real_gpt_head_forward_backward(RealGpt *gpt, const RealBf16 *final_ln_params,
                                        const RealBf16 *embed_params, const RealBf16 *x_last,
                                        const int *targets, float dloss_scale,
                                        float *loss_out, float *dx_last,
                                        RealBf16 *final_ln_grads, RealBf16 *embed_grads,
                                        GError **error)
{
    const int last = gpt->dims.layers + 1;
    RealGptTensors lnf, emb, glnf, gemb;
    real_gpt_tensors_at(&gpt->dims, last, final_ln_params, &lnf);
    real_gpt_tensors_at(&gpt->dims, 0, embed_params, &emb);
    real_gpt_tensors_at(&gpt->dims, last, final_ln_grads, &glnf);
    real_gpt_tensors_at(&gpt->dims, 0, embed_grads, &gemb);
    return real_gpt_head_forward_backward_t(gpt, &lnf, &emb, x_last, targets, dloss_scale,
                                            loss_out, dx_last, &glnf, &gemb, error);
}

gboolean real_gpt_head_forward_backward_t(RealGpt *gpt, const RealGptTensors *final_ln,
                                          const RealGptTensors *embed, const RealBf16 *x_last,
                                          const int *targets, float dloss_scale,
                                          float *loss_out, float *dx_last,
                                          const RealGptTensors *final_ln_grads,
                                          const RealGptTensors *embed_grads, GError **error)
{
    if (!real_gpt_check_tokens(gpt, targets, "targets", error))
        return FALSE;
    RealBackend *be = gpt->be;
    const RealGptDims *d = &gpt->dims;
    size_t t = real_gpt_tokens(d), h = d->hidden;
    /* untied: lm_head is unit L+1's last tensor; tied: wte, unit 0's first */
    const int lm_head = real_gpt_n_tensors(d, d->layers + 1) - 1;
    const RealBf16 *head = d->untied ? final_ln->at[lm_head] : embed->at[0];
    RealBf16 *ghead = d->untied ? final_ln_grads->at[lm_head] : embed_grads->at[0];
    float *logits = be->alloc(be, real_gpt_logits_bytes(d), REAL_MEM_WORKSPACE);
    float *ws = real_gpt_workspace(gpt, t * (2 * h + 2) + h * ((size_t)real_gpt_vocab(d) + 2));
    bool ok = logits && ws &&
              real_gpt_head_compute(gpt, final_ln, head, x_last, targets, dloss_scale,
                                    loss_out, dx_last, final_ln_grads, ghead, ws, logits);
    be->free(be, ws);
    be->free(be, logits);
    if (!ok)
        return real_gpt_failed(gpt, error, "the head workspace");
    return TRUE;
}
