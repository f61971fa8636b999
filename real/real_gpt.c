/* real_gpt: the GPT-2 and Llama-family models zreal trains, forward and backward.
 * All compute goes through RealBackend; fp32 math, bf16 storage, bit-identical recompute.
 * This file: dimensions, layout, memory sizes, initialisation and the runtime's state. */
#include "real_gpt.h"
#include "real_gpt_internal.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#define REAL_GPT_INIT_STD 0.02

G_DEFINE_QUARK(real-gpt-error-quark, real_gpt_error)

/* ---- dimensions and layout ---- */

RealGptDims real_gpt_dims_make(int layers, int hidden, int heads, int seq_len, int vocab,
                               int micro_batch)
{
    return (RealGptDims){.layers = layers, .hidden = hidden, .heads = heads,
                         .seq_len = seq_len, .vocab = vocab, .ffn_hidden = 4 * hidden,
                         .micro_batch = micro_batch};
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
    if (real_gpt_sparse(d)) {
        /* zreal's sparse block is Mixtral's: SwiGLU experts on an unsplit, sequential block. */
        if (!d->swiglu || real_gpt_tp(d) > 1 || d->parallel_residual) {
            g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID,
                        "a mixture of experts needs SwiGLU experts, no tensor parallelism and "
                        "a sequential residual");
            return FALSE;
        }
        const RealMoeDims m = real_gpt_moe_dims(d);
        if (!real_moe_dims_check(&m, error))
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
    if (real_gpt_sparse(d)) {
        /* The sparse MLP in the dense MLP's slots (real_gpt_dims.h): this rank's experts. */
        const RealMoeDims m = real_gpt_moe_dims(d);
        out[REAL_GPT_FC1_W] = (RealGptBlockSpec){"fc1.router.weight", real_moe_router_elems(&m),
                                                 REAL_GPT_INIT_NORMAL, true};
        out[REAL_GPT_FC1_B] = (RealGptBlockSpec){"fc1.experts.weight", real_moe_fc1_elems(&m),
                                                 REAL_GPT_INIT_NORMAL, true};
        out[REAL_GPT_FC2_W] = (RealGptBlockSpec){"fc2.experts.weight", real_moe_fc2_elems(&m),
                                                 REAL_GPT_INIT_NORMAL_RESIDUAL, true};
        out[REAL_GPT_FC2_B].present = false;
    }
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
void real_gpt_write_grad(RealGpt *gpt, int unit, int k, RealBf16 *dst, const float *src,
                         size_t n_elems)
{
    RealBackend *be = gpt->be;
    const gboolean store = gpt->fresh[unit] >> k & 1u;
    gpt->fresh[unit] &= ~(1u << k);
    if (gpt->grads_f32 && store)
        be->copy(be, dst, src, n_elems * sizeof(float));
    else if (gpt->grads_f32)
        be->add(be, (float *)(void *)dst, (const float *)(void *)dst, src, n_elems);
    else if (store)
        be->f32_to_bf16(be, dst, src, n_elems);
    else
        be->accumulate_bf16(be, dst, src, n_elems);
}

void real_gpt_set_grads_f32(RealGpt *gpt, gboolean f32)
{
    gpt->grads_f32 = f32;
}

/* dst's tensors first..last-1 of unit `unit` (laid out as unit `layout`) from src, that
 * unit's fp32 gradients laid out contiguously (src[0] is tensor first's first element). */
void real_gpt_accumulate(RealGpt *gpt, int layout, int unit, const RealGptTensors *dst,
                         const float *src, int first, int last)
{
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    real_gpt_unit_tensors(&gpt->dims, layout, t);
    for (int k = first; k < last; k++)
        real_gpt_write_grad(gpt, unit, k, dst->at[k],
                            src + (t[k].offset_elems - t[first].offset_elems), t[k].elems);
}

int real_gpt_n_tensors(const RealGptDims *d, int unit)
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
    return real_gpt_moe_saved_bytes(dims) + sizeof(float) * real_gpt_saved_f32_elems(dims) +
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
RealGptSaved real_gpt_saved_view(const RealGptDims *d, void *base)
{
    size_t t = real_gpt_tokens(d), h = d->hidden, f = real_gpt_ffn(d);
    RealGptSaved sv = {0};
    /* A sparse MLP's router buffer first (its int64 indices aligned), its tensors last. */
    if (real_gpt_sparse(d)) {
        sv.router = base;
        base = (char *)base + real_gpt_moe_router_bytes(d);
    }
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
    if (!d->flash)
        p += (size_t)d->micro_batch * real_gpt_heads(d) * d->seq_len * d->seq_len;
    if (real_gpt_sparse(d))
        sv.moe = p;
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
    whole.ep = 0, whole.ep_rank = 0;
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
        /* This rank's experts: the whole model's from expert ep_rank E / ep on. */
        const bool experts = strstr(t[k].name, ".experts.") != NULL;
        for (size_t e = lo; e < hi; e++) {
            const size_t in = e - t[k].offset_elems;
            const size_t at = (copy ? 0 : wt[k].offset_elems) +
                              (shard     ? real_gpt_tp_index(dims, &whole, kind[k], in)
                               : rows    ? rank * t[k].elems + in
                               : experts ? (size_t)dims->ep_rank * t[k].elems + in
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
    if (!real_gpt_moe_init(gpt, error)) {
        real_gpt_free(gpt);
        return NULL;
    }
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
    real_gpt_moe_run_end(gpt);
    real_moe_free(gpt->moe);
    g_free(gpt->saved);
    g_free(gpt->fresh);
    g_free(gpt);
}

/* A failed compute's error: the tensor group's sum's when it failed, else no memory. */
gboolean real_gpt_failed(RealGpt *gpt, GError **error, const char *what)
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

gboolean real_gpt_nomem(GError **error, const char *what)
{
    g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_NOMEM, "out of backend memory for %s",
                what);
    return FALSE;
}

gboolean real_gpt_check_layer(const RealGpt *gpt, int layer, GError **error)
{
    if (layer >= 0 && layer < gpt->dims.layers)
        return TRUE;
    g_set_error(error, REAL_GPT_ERROR, REAL_GPT_ERROR_INVALID, "layer %d out of range 0..%d",
                layer, gpt->dims.layers - 1);
    return FALSE;
}

/* Token ids index wte rows, so an out-of-range one would read or write out of bounds. */
gboolean real_gpt_check_tokens(const RealGpt *gpt, const int *tokens, const char *what,
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
float *real_gpt_workspace(RealGpt *gpt, size_t n_elems)
{
    return gpt->be->alloc(gpt->be, n_elems * sizeof(float), REAL_MEM_WORKSPACE);
}

/* Tensor parallelism: x[0..n) = the sum of every rank's x over the group (nothing at t = 1).
 * A failure is kept in gpt->tp_error for the public call to report. */
bool real_gpt_tp_sum(RealGpt *gpt, float *x, size_t n)
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
