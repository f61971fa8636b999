/* zp_model_arch: a transformer's architecture (zplan's models/NAME.json spec) and its exact
 * parameter count; zp_model.h adds the loader that also reads Hugging Face configs (zp_hf).
 * The parameter layout (units and tensors) is the contract shared by the planner, the
 * simulator's schedule and the real executor, so it is defined here and only here.
 *
 * Architecture (pre-norm decoder blocks; GPT-2 when every optional field is zero):
 *   unit 0       embeddings: token wte [V,h], learned positions wpe [P,h] (if learned_positions)
 *   unit 1..L    blocks: norm1, qkv [h, a d + 2 k d] (+ bias), proj [a d,h] (+ bias), norm2,
 *                MLP: plain  fc1 [h,f] (+ f), fc2 [f,h] (+ h)
 *                     gated  fc1 [h,2f] (gate and up, + 2f), fc2 [f,h] (+ h)
 *                with d the head dimension (h/a unless head_dim says), k the key/value heads (a: MHA, 1: MQA,
 *                between: GQA), a norm 2h (LayerNorm: gain and bias) or h (RMSNorm: gain)
 *   unit L+1     final norm, plus the LM head [V,h] when embeddings are untied
 * A mixture of experts (zp_model_moe.h) replaces a sparse block's fc1/fc2 by fc1.router,
 * fc1.experts [E h 2f_e], fc1.shared, fc2.experts, fc2.shared; latent attention replaces qkv by
 * qkv.q_a, qkv.q_b, qkv.kv_a, qkv.kv_b and their norms. Blocks then differ: count by unit.
 * GPT-2 (k = a, plain GELU MLP, LayerNorm, biases everywhere) gives a block of
 * 4h^2 + 2hf + 9h + f elements (12h^2 + 13h with f = 4h), which is how "12Lh^2" in the papers
 * comes about; Llama-2-7B (MHA, SwiGLU, RMSNorm, no biases) 4h^2 + 3hf + 2h. */
#ifndef ZP_MODEL_ARCH_H
#define ZP_MODEL_ARCH_H

#include "zp_model_moe.h"

#include <glib.h>
#include <stdint.h>

/* The MLP: GPT-2's fc1 -> GELU -> fc2, or a gated unit act(x Wg) * (x Wu) -> Wd (three
 * projections of f: SwiGLU with SiLU as in Llama, GeGLU with GELU). */
typedef enum { ZP_MLP_GELU, ZP_MLP_SWIGLU, ZP_MLP_GEGLU, ZP_MLP_N } ZpMlp;
typedef enum { ZP_NORM_LAYERNORM, ZP_NORM_RMSNORM, ZP_NORM_N } ZpNorm;

/* Linear layers WITHOUT a bias (a zero ZpModel has GPT-2's biases everywhere). */
enum { ZP_NO_BIAS_QKV = 1, ZP_NO_BIAS_PROJ = 2, ZP_NO_BIAS_MLP = 4 };

/* Rotary frequencies rescaled for a longer context (config.json's rope_scaling): none, linear
 * (positions / factor) or Llama 3.1's "llama3" (long wavelengths / factor, short ones kept, a
 * smooth ramp between, by original_max_position_embeddings). Other types (dynamic, yarn, ...)
 * are kept by name: they change no memory or time, and zreal refuses them. */
typedef enum {
    ZP_ROPE_SCALING_NONE,
    ZP_ROPE_SCALING_LINEAR,
    ZP_ROPE_SCALING_LLAMA3,
    ZP_ROPE_SCALING_OTHER,
} ZpRopeScalingType;

typedef struct {
    ZpRopeScalingType type;
    char name[24]; /* the rope_type as written */
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max_positions;
} ZpRopeScaling;

/* Every field that is zero takes GPT-2's choice, so a spec written before the Llama-family
 * fields existed means what it meant. */
typedef struct {
    char name[64];
    int64_t layers, hidden, heads, seq_len, vocab, ffn_hidden;
    int64_t kv_heads;           /* key/value heads; 0: heads (multi-head attention) */
    int64_t max_positions;      /* rows of the learned position table; 0: seq_len */
    int64_t head_dim;           /* each head's width d (Qwen3, Gemma, Mistral-Nemo set it apart
                                 * from h/a); 0: h/a */
    gboolean qk_norm;           /* an RMSNorm over d on each head's q and k (Qwen3's q_norm,
                                 * k_norm): 2d gains per block */
    ZpMlp mlp;
    gboolean exact_gelu;        /* GELU as x Phi(x) with erf (transformers' "gelu"), not GPT-2's
                                 * tanh approximation ("gelu_new"); the same cost, other values */
    ZpNorm norm;
    unsigned no_bias;           /* ZP_NO_BIAS_* flags */
    gboolean tied_embeddings;   /* LM head shares wte (default true) */
    gboolean learned_positions; /* a wpe table (default true; false for ALiBi/rotary) */
    gboolean parallel_residual; /* GPT-NeoX: attention and MLP both read the block input */
    gboolean dropout;           /* trained with dropout: changes activation memory */
    double rope_theta;          /* rotary embeddings' base; 0: no rotary embeddings */
    double rotary_fraction;     /* share of each head's dimensions rotated (NeoX: 0.25) */
    ZpRopeScaling rope_scaling;
    double norm_eps;            /* 0: 1e-5 */
    int64_t sliding_window;     /* keys each query attends to, itself included (Mistral's
                                 * sliding_window); 0: every earlier key */
    ZpMoe moe;                  /* a mixture of experts' sparse MLP; zero: every MLP dense */
    ZpMla mla;                  /* multi-head latent attention; zero: the fused qkv */
    double published_params;    /* the size the model is known by, 0 if not given */
    double params_only;         /* > 0: built from --params, no architecture known */
    char torch_dtype[16];       /* a Hugging Face config's torch_dtype ("bfloat16", ...): the
                                 * dtype the weights were trained and saved in, which the CLI
                                 * takes as the default precision; "" when not given */
} ZpModel;

/* A block's modules (the nn.Modules holding its parameters: DeepSpeed's stage 3 fetches,
 * computes and releases one at a time), in layout order; a tensor belongs to the module its
 * name starts with ("qkv.weight", "qkv.bias": qkv). The fused qkv and the gated MLP's gate and
 * up (fc1) are one module each, as the layout fuses them. */
typedef enum {
    ZP_MOD_LN1, ZP_MOD_QKV, ZP_MOD_PROJ, ZP_MOD_LN2, ZP_MOD_FC1, ZP_MOD_FC2, ZP_MOD_N
} ZpBlockModule;

/* "ln1", "qkv", "proj", "ln2", "fc1", "fc2", and back (-1 for an unknown name). */
const char *zp_model_module_name(ZpBlockModule module);
int zp_model_module_parse(const char *name);

/* How tensor parallelism splits a tensor (zp_model_tensor_tp_elems): not at all, its
 * elements, or its rows of h (the vocabulary's). */
typedef enum { ZP_TENSOR_WHOLE, ZP_TENSOR_SPLIT, ZP_TENSOR_SPLIT_ROWS } ZpTensorSplit;

typedef struct {
    const char *name; /* "wte", "qkv.weight", ... (static strings) */
    int unit;         /* 0 embeddings, 1..L blocks, L+1 final */
    uint64_t elems;
    gboolean matrix;  /* 2-D, the hidden size one of its sides (every weight matrix and
                       * embedding table); FALSE: 1-D (norms and biases) */
    /* Read off the name once, by zp_model_tensors (the search's schedules asked a deep
     * model's thousands of tensors by name again and again: plan --3d gpt-1t/4096 compared
     * 2.7 million names, 93 M instructions). */
    uint8_t split;    /* ZpTensorSplit */
    uint8_t expert;   /* a routed expert's (zp_model_tensor_is_expert) */
} ZpTensor;

/* Parses a model spec object; `what` names its file in messages. */
gboolean zp_model_from_json(void *json_object, const char *what, ZpModel *model,
                            GError **error);

/* Reads the optional "rope_scaling" object of `obj` (Hugging Face's spelling: rope_type or type,
 * factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) into
 * model->rope_scaling; absent or null is none. `what` names the file. */
gboolean zp_model_get_rope_scaling(void *json_object, const char *what, ZpModel *model,
                                   GError **error);

/* The checks every spec passes, whoever read it: key/value heads divide the heads, the
 * sequence fits a learned position table. `what` names the file. */
gboolean zp_model_check(const ZpModel *model, const char *what, GError **error);

/* A model known only by its parameter count (the paper's formula-only questions). */
void zp_model_from_params(double params, ZpModel *model);

gboolean zp_model_has_architecture(const ZpModel *model);

/* Derived dimensions: key/value heads (heads when 0), head dimension h/a, the width of the
 * fused qkv projection h + 2 k d, the first MLP projection's width (2f gated, f plain), the
 * learned position table's rows, and the norm's parameters per norm (2h or h). */
int64_t zp_model_kv_heads(const ZpModel *model);
int64_t zp_model_head_dim(const ZpModel *model);
/* a d: the queries' width, the attention output's and the output projection's input (h when
 * d = h/a). */
int64_t zp_model_attn_width(const ZpModel *model);
int64_t zp_model_qkv_width(const ZpModel *model);
int64_t zp_model_fc1_width(const ZpModel *model);
int64_t zp_model_positions(const ZpModel *model);
gboolean zp_model_gated(const ZpModel *model);
gboolean zp_model_has_bias(const ZpModel *model, unsigned which);

const char *zp_model_mlp_name(ZpMlp mlp);
const char *zp_model_norm_name(ZpNorm norm);

/* The share of causal attention's query-key pairs a sliding window keeps at the model's
 * sequence: sum over positions of min(t + 1, w) against sum of t + 1 (1 without a window or
 * when the window covers the sequence). A fused kernel skips the blocks outside the window
 * (FlashAttention-2's window_size), so its work scales by this; an eager one computes every
 * score and masks them, so its work does not. */
double zp_model_attention_share(const ZpModel *model);

/* Exact parameter count (or the given count for a params-only model). */
uint64_t zp_model_param_count(const ZpModel *model);
/* The parameters one token passes through: a sparse layer's top_k routed experts instead of
 * all of them (the count MoE models are published by as "active"); the total for a dense
 * model. */
uint64_t zp_model_active_param_count(const ZpModel *model);
/* Whether block unit `unit` (1..L) has the sparse MLP, and the elements of its routed experts
 * (all E of them; 0 in a dense block). */
gboolean zp_model_unit_sparse(const ZpModel *model, int unit);
uint64_t zp_model_unit_expert_elems(const ZpModel *model, int unit);

int zp_model_n_units(const ZpModel *model);
uint64_t zp_model_unit_elems(const ZpModel *model, int unit);

/* Elements of `unit` one rank of a tensor-parallel group of mp holds (Megatron's split): a
 * block's column-parallel qkv and fc1 (weights and biases) and row-parallel proj and fc2
 * weights divided by mp, its norms and the row-parallel biases whole; the word embedding and
 * an untied LM head split by vocabulary rows (VocabParallelEmbedding, the vocab-parallel
 * head), the position table and the final norm whole. Divisions round up. A params-only
 * model: the unit divided by mp, rounded up. */
uint64_t zp_model_unit_tp_elems(const ZpModel *model, int unit, int mp);

/* Expert parallelism keeps a sparse block's routed experts apart from the rest (zp_ep.h): the
 * unit's elements without them on a rank of the tensor group (the router, shared experts,
 * attention and norms: zp_model_unit_tp_elems for a dense unit), one routed expert's on such a
 * rank (its projections split, rounded up), and whether a tensor is the routed experts'. */
uint64_t zp_model_unit_dense_tp_elems(const ZpModel *model, int unit, int mp);
uint64_t zp_model_expert_tp_elems(const ZpModel *model, int mp);
gboolean zp_model_tensor_is_expert(const ZpTensor *tensor);

/* Elements of one tensor (zp_model_tensors) on a rank of that group: split ones ("wte",
 * "qkv.weight", "qkv.bias", "proj.weight", "fc1.weight", "fc1.bias", "fc2.weight",
 * "lm_head.weight") divided by mp, rounded up (by rows for wte and lm_head), the others
 * whole. */
uint64_t zp_model_tensor_tp_elems(const ZpModel *model, const ZpTensor *tensor, int mp);

/* The model's tensors in layout order; caller frees with g_array_unref. */
GArray *zp_model_tensors(const ZpModel *model);

/* zp_model_tensors of the model last asked, kept in `kept` (a caller's own, zero at first):
 * listed again only when another model comes. The table is a function of the model's fields
 * alone (the rows' names are static strings), and a ZpModel holds no pointer, so a model
 * equal byte for byte lists the same table. For callers that ask of one model at every plan
 * a search screens; the planner runs on one thread. The caller does not free the table; it
 * lives until `kept` is asked of another model. */
typedef struct {
    ZpModel model;
    GArray *tensors;
} ZpModelTensorsKept;
const GArray *zp_model_tensors_kept(ZpModelTensorsKept *kept, const ZpModel *model);


/* The spec as a JSON object (the keys of models/NAME.json); NULL for a params-only model. */
void *zp_model_to_json(const ZpModel *model);
#endif
