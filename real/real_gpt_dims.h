/* real_gpt_dims: the shapes of the models zreal trains and their tensor tables — what
 * real_gpt.h's API takes, here below real_gpt's files so that its private header
 * (real_gpt_internal.h) need not include real_gpt.h. */
#ifndef REAL_GPT_DIMS_H
#define REAL_GPT_DIMS_H

#include "real_backend.h"

#include <stddef.h>

/* Linear layers without a bias (the planner's ZP_NO_BIAS_* values): Llama has none, Qwen2
 * only q, k and v's (REAL_GPT_NO_BIAS_PROJ | REAL_GPT_NO_BIAS_MLP). */
enum { REAL_GPT_NO_BIAS_QKV = 1, REAL_GPT_NO_BIAS_PROJ = 2, REAL_GPT_NO_BIAS_MLP = 4,
       REAL_GPT_NO_BIAS_ALL = 7 };

typedef struct {
    int layers;      /* L */
    int hidden;      /* h */
    int heads;       /* a; divides h */
    int seq_len;     /* s */
    int vocab;       /* V */
    int ffn_hidden;  /* f; 4h by default */
    int micro_batch; /* b: samples per forward/backward call */
    /* The Llama family, Qwen2 and GPT-NeoX; all zero is GPT-2. */
    int kv_heads;     /* key/value heads (0: heads); divides heads */
    bool swiglu;      /* gated MLP silu(x Wg) (x Wu) Wd instead of GELU */
    bool geglu;       /* gated MLP gelu(x Wg) (x Wu) Wd (Gemma-style "gelu" in the Llama family) */
    bool exact_gelu;  /* GELU (plain or GeGLU) is the exact erf form, not the tanh one */
    bool rmsnorm;     /* RMSNorm (gain only) instead of LayerNorm */
    bool untied;      /* an LM head of its own in the last unit */
    bool tied_copy;   /* with untied: that head is a pipeline's last stage's copy of a tied
                       * wte (Megatron's), drawn from wte's initial values */
    unsigned no_bias; /* REAL_GPT_NO_BIAS_* flags: linear layers without a bias */
    bool parallel_residual; /* GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x)) */
    float rope_theta; /* rotary embeddings' base instead of a position table (0: none) */
    float rotary_fraction; /* share of each head's dimensions rotated (0: all; NeoX 0.25) */
    RealRopeScaling rope_scaling; /* config.json's rope_scaling, with RealRope's parameters: */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_positions;
    int positions;    /* rows of the learned position table (0: seq_len; >= seq_len) */
    float norm_eps;   /* the norm's eps, RMSNorm or LayerNorm (0: 1e-5) */
    int attention_window; /* keys each query attends to, itself included (0: all earlier) */
    bool flash;       /* fused attention: no s x s tensor kept, an fp32 log-sum-exp instead */
    /* Tensor parallelism (Megatron's split; 0 or 1: none): this runtime is rank tp_rank of tp,
     * dividing heads, kv_heads, ffn_hidden and vocab. Its blocks hold their shard: qkv and
     * fc1 column-parallel (this rank's q, k and v heads; its gate and up columns), proj and
     * fc2 row-parallel, norms and the row-parallel biases whole; wte and an untied lm_head
     * hold this rank's V / tp vocabulary rows (from tp_rank V / tp on), wpe and the final
     * norm whole. Through real_gpt_set_tp's collectives: a block sums the row-parallel
     * outputs in forward and the column-parallel input gradients in backward, two sums of
     * [b s, h] each way; the embedding sums its rows' lookups; the head gathers each rank's
     * per-token log-sum-exp and target logit (2 fp32 per token) for the loss, then sums its
     * input gradient. */
    int tp, tp_rank;
    /* A mixture of experts (moe_experts 0: a dense MLP): every block's MLP is real_moe's sparse
     * one, moe_experts SwiGLU experts of width moe_ffn, each token routed to moe_top_k of them,
     * at most moe_capacity copies an expert and rank; the experts split over ep ranks, this
     * rank holding ep_rank's E / ep (real_moe.h). The block's fc1.weight, fc1.bias and
     * fc2.weight slots hold the router [h, E], the experts' gate and up [E/ep][h, 2 f_e] and
     * their down projections [E/ep][f_e, h] (the planner's fc1.router.weight,
     * fc1.experts.weight, fc2.experts.weight); fc2.bias is absent. */
    int moe_experts, moe_top_k, moe_ffn, moe_capacity, ep, ep_rank;
} RealGptDims;

/* One named tensor inside a unit. Names are the planner's (zp_model_tensors). */
typedef struct {
    const char *name; /* static string */
    size_t offset_elems;
    size_t elems;
} RealGptTensor;

#define REAL_GPT_MAX_UNIT_TENSORS 12

/* One unit's tensors wherever they lie: tensor k of real_gpt_unit_tensors' list at at[k].
 * A contiguous unit is one view (real_gpt_tensors_at); an engine that keeps each tensor in
 * its own buffer (DeepSpeed's stage-3 per-parameter gathers, its gradients landing tensor by
 * tensor in buckets) passes its own. Parameters are only read through a view. */
typedef struct {
    RealBf16 *at[REAL_GPT_MAX_UNIT_TENSORS];
} RealGptTensors;

#endif
