/* zp_model_moe: a mixture of experts' MLP (routed experts, shared experts, the router, which
 * layers are sparse) and DeepSeek's multi-head latent attention, counted exactly; ZpModel holds one
 * of each (zero: a dense MLP, ordinary attention), zp_model_arch sums them into its units. */
#ifndef ZP_MODEL_MOE_H
#define ZP_MODEL_MOE_H

#include <glib.h>
#include <stdint.h>

#define ZP_MOE_MAX_DENSE_LISTED 64

/* The sparse MLP of transformers' MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock and
 * DeepseekV3MoE: a router [E, h] (DeepSeek-V3 adds e_score_correction_bias [E]), E routed
 * experts each a gated MLP of width expert_ffn, and shared experts every token passes through
 * (shared_ffn wide in all; Qwen2-MoE gates them with a [1, h] sigmoid). Layer i (0-based) is
 * sparse when i >= first_dense, (i + step_phase) % step == 0 and i is not listed dense
 * (DeepseekV3: first_k_dense_replace, moe_layer_freq, phase 0; Qwen2Moe: decoder_sparse_step,
 * phase 1, mlp_only_layers). */
typedef struct {
    int64_t experts;        /* routed experts per sparse layer; 0: a dense model */
    int64_t top_k;          /* experts each token is routed to */
    int64_t expert_ffn;     /* one routed expert's intermediate width */
    int64_t shared_experts; /* experts every token passes through (they count as active) */
    int64_t shared_ffn;     /* their total intermediate width */
    gboolean shared_gate;   /* Qwen2-MoE's shared_expert_gate [1, h] */
    gboolean router_bias;   /* DeepSeek-V3's e_score_correction_bias [E] */
    int64_t first_dense;
    int64_t step;           /* 0 or 1: every layer from first_dense on */
    int64_t step_phase;
    int n_dense_listed;
    int64_t dense_listed[ZP_MOE_MAX_DENSE_LISTED];
} ZpMoe;

/* Multi-head latent attention (DeepseekV3Attention): q through a rank-q_lora_rank bottleneck
 * (q_a [h, r_q], its RMSNorm, q_b [r_q, H (d_nope + d_rope)]; a plain q [h, H (d_nope + d_rope)]
 * when q_lora_rank is 0), keys and values through kv_a [h, r_kv + d_rope], its RMSNorm and
 * kv_b [r_kv, H (d_nope + d_v)], the output projection [H d_v, h]. */
typedef struct {
    int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_dim; /* kv_lora_rank 0: off */
} ZpMla;

gboolean zp_moe_enabled(const ZpMoe *moe);
/* Whether block `layer` (0-based) has the sparse MLP. */
gboolean zp_moe_layer_sparse(const ZpMoe *moe, int64_t layer);
int64_t zp_moe_sparse_layers(const ZpMoe *moe, int64_t layers);

/* Elements of one routed expert: gate and up [h, 2 f_e] and down [f_e, h] (gated: every MoE
 * family zp_hf reads is SwiGLU), or [h, f_e] and [f_e, h] plain. */
uint64_t zp_moe_expert_elems(const ZpMoe *moe, int64_t hidden, gboolean gated);
/* A sparse MLP's elements beside its routed experts: the router, its bias, the shared experts
 * and their gate. */
uint64_t zp_moe_dense_part_elems(const ZpMoe *moe, int64_t hidden, gboolean gated);
/* The sparse MLP's elements with `experts` routed experts held (E: all, top_k: one token's),
 * as the part a tensor-parallel rank holds whole (the router, its bias, the shared gate) and the
 * part it splits (each routed and shared expert's projections: Megatron-Core's expert tensor
 * parallelism at the TP degree). */
void zp_moe_mlp_parts(const ZpMoe *moe, int64_t hidden, gboolean gated, int64_t experts,
                      uint64_t *whole, uint64_t *split);

gboolean zp_mla_enabled(const ZpMla *mla);
/* The attention's elements as Megatron-Core's MLASelfAttention splits them over a tensor group:
 * q_b (or q), kv_b and the output projection split, the down projections and norms whole. */
void zp_mla_parts(const ZpMla *mla, int64_t hidden, int64_t heads, uint64_t *whole,
                  uint64_t *split);
/* The q and kv_b widths, for the tensor table: H (d_nope + d_rope) and H (d_nope + d_v). */
int64_t zp_mla_q_width(const ZpMla *mla, int64_t heads);
int64_t zp_mla_kv_width(const ZpMla *mla, int64_t heads);

/* Bounds on what a spec may ask: the experts' elements, E x 3 h f_e over every layer, and the
 * latent attention's at most 1e15 (sizes stay exact in 64 bits), top_k at most E. `what` names
 * the file. */
gboolean zp_moe_check(const ZpMoe *moe, const ZpMla *mla, int64_t hidden, int64_t heads,
                      int64_t layers, const char *what, GError **error);

/* The "moe" and "mla" objects of zplan's model spec (and of a schedule's model): read when
 * present (`what` names the file), written when enabled. */
gboolean zp_moe_from_json(void *json_object, const char *what, ZpMoe *moe, ZpMla *mla,
                          GError **error);
void zp_moe_to_json(const ZpMoe *moe, const ZpMla *mla, void *json_object);

#endif
