/* real_gpt: the models zreal trains — GPT-2 (pre-LN blocks, tied LM head), the Llama family
 * (RMSNorm, SwiGLU or GeGLU, rotary embeddings, grouped-query attention, untied head, no
 * biases, or Qwen2's q/k/v biases) and GPT-NeoX (parallel residual, partial rotary, exact
 * GELU) — forward and backward per parameter unit, so the ZeRO engine can run them on buffers it
 * chooses (gathered, ZeRO-3). */

/* Parameter layout (the contract shared with the planner's zp_model): each unit is one
 * flat contiguous bf16 array,
 *   unit 0      embeddings: wte [V,h], then wpe [P,h] (P >= s positions)   (V h + P h)
 *   unit 1..L   block l-1: ln1.weight [h], ln1.bias [h], qkv.weight [h,3h], qkv.bias [3h],
 *               proj.weight [h,h], proj.bias [h], ln2.weight [h], ln2.bias [h],
 *               fc1.weight [h,f], fc1.bias [f], fc2.weight [f,h], fc2.bias [h]
 *                                                          (4h^2 + 2hf + 9h + f)
 *   unit L+1    final layer norm: lnf.weight [h], lnf.bias [h]           (2h)
 * Weights are stored [in, out] (y = x W + b). The LM head is wte itself (no bias).
 * The Llama family changes that layout as zp_model_tensors does: no wpe (rotary positions),
 * norms without bias (RMSNorm), qkv [h, h + 2 k d] for k key/value heads of dimension d,
 * fc1 [h, 2f] (gate, then up), each linear bias present or not, and lm_head.weight [V,h]
 * after lnf.weight when untied.
 *
 * One micro-batch step, as the engine drives it (T = b s tokens, x_l bf16 [T,h], dx_l fp32
 * [T,h]; every buffer passed in is the caller's and must stay valid during the call only):
 *   embed_forward -> x_0; block_forward(l) x_l -> x_{l+1} for l = 0..L-1;
 *   head_forward_backward(x_L) -> loss, dx_L;
 *   for l = L-1..0: [recompute: block_forward(l, save) from the checkpointed x_l]
 *                   block_backward(l) dx_{l+1} -> dx_l;
 *   embed_backward(dx_0).
 * Backward and head calls ACCUMULATE into the bf16 gradient units (+=), so gradient
 * accumulation over micro-batches needs only zeroing once per step, or none where the
 * caller declares the step's gradients fresh (real_gpt_grads_fresh): then the first write
 * of each tensor stores it. The head and embed_backward both add to unit 0's wte gradient
 * (tied weights), so under ZeRO-3 unit 0 must be gathered for the head as well. Each call
 * has a _t form that takes the units as views (RealGptTensors) instead of contiguous
 * arrays. */
#ifndef REAL_GPT_H
#define REAL_GPT_H

#include "real_backend.h"
#include "real_gpt_dims.h"
#include "real_moe.h"

#include <glib.h>
#include <stdint.h>

typedef enum {
    REAL_GPT_ERROR_INVALID, /* bad dimensions, unit/layer index or token */
    REAL_GPT_ERROR_STATE,   /* calls out of order (backward without saved activations) */
    REAL_GPT_ERROR_NOMEM,   /* the backend could not allocate */
} RealGptError;

#define REAL_GPT_ERROR real_gpt_error_quark()
GQuark real_gpt_error_quark(void);

typedef struct RealGpt RealGpt;

/* Dimensions with the GPT-2 default ffn_hidden = 4 * hidden. Not checked. */
RealGptDims real_gpt_dims_make(int layers, int hidden, int heads, int seq_len, int vocab,
                               int micro_batch);

/* TRUE when every dimension is positive, heads divides hidden, kv_heads divides heads, the
 * rotated share of a head's dimensions is even and positive under rotary embeddings, a
 * position table holds the sequence, the attention window is not negative and every matrix
 * dimension (b s tokens included) fits an int. */
gboolean real_gpt_dims_check(const RealGptDims *dims, GError **error);

/* TRUE when `be` has every entry the model needs (RMSNorm, a gated MLP, the exact GELU,
 * rotary, grouped-query or fused attention); otherwise one line naming the backend and the
 * first entry it lacks. */
gboolean real_gpt_check_backend(const RealBackend *be, const RealGptDims *dims,
                                GError **error);

/* L + 2: embeddings, L blocks, final layer norm. */
int real_gpt_n_units(const RealGptDims *dims);

/* Elements of unit `unit` (see the layout above); 0 when unit is out of range. */
size_t real_gpt_unit_elems(const RealGptDims *dims, int unit);

/* Elements of all units together (GPT-2: L(4h^2 + 2hf + 9h + f) + Vh + sh + 2h). */
size_t real_gpt_param_elems(const RealGptDims *dims);

/* The tensors of `unit` in layout order into `out`; returns how many (0 when unit is out
 * of range). */
int real_gpt_unit_tensors(const RealGptDims *dims, int unit,
                          RealGptTensor out[REAL_GPT_MAX_UNIT_TENSORS]);

/* The view of unit `unit` laid out contiguously at base (NULL base: every entry NULL). */
void real_gpt_tensors_at(const RealGptDims *dims, int unit, const RealBf16 *base,
                         RealGptTensors *out);

/* Bytes one block keeps for backward when forwarded with save_activations, exactly what
 * real_gpt_block_forward allocates under REAL_MEM_ACTIVATIONS (one allocation, freed by
 * real_gpt_block_backward). With T = b s, q = h + 2 k d the qkv width and f1 = f (GELU) or 2f
 * (SwiGLU, GeGLU), r = 5 (or 4 with a parallel residual, whose norm2 reads the block input):
 *   bf16 [T,h] x r: block input (norm1 input), norm1 output, attention output before proj,
 *                   norm2 input (residual after attention; not with a parallel residual),
 *                   norm2 output
 *   bf16 [T,q]:     q, k, v (after the rotary embeddings)
 *   bf16 [T,f1]:    fc1 output (GELU input; gate and up)
 *   bf16 [T,f]:     the activation's output (GELU, or act(gate) up), fc2's input
 *   eager: bf16 [b,a,s,s] softmax probabilities (the masked half included)
 *   flash: fp32 [b,a,s] log-sum-exp per row and head
 *   LayerNorm only: fp32 [T] x4, both norms' mean and 1/std (RMSNorm recomputes its 1/rms)
 *   = 2T(r h + q + f1 + f) + (2 a b s^2 or 4 a b s) (+ 16T)
 * which is zp_mem_activation_block_bytes without dropout (plus the LayerNorm statistics):
 * s b h (32 + 2 a s / h) + 16 s b for GPT-2. */
uint64_t real_gpt_block_activation_bytes(const RealGptDims *dims);

/* Bytes of one block's checkpoint, its bf16 input [b s, h]: 2 s b h. Also the size of any
 * bf16 residual-stream buffer x_l. The engine allocates checkpoints (REAL_MEM_CHECKPOINTS). */
uint64_t real_gpt_checkpoint_bytes(const RealGptDims *dims);

/* Bytes of an fp32 residual-gradient buffer dx_l [b s, h]: 4 s b h. */
uint64_t real_gpt_residual_grad_bytes(const RealGptDims *dims);

/* Bytes of the fp32 logits [b s, V] the head allocates (REAL_MEM_WORKSPACE) while it runs,
 * turned into their gradient in place: 4 s b V. */
uint64_t real_gpt_logits_bytes(const RealGptDims *dims);

/* Writes unit `unit`'s initial parameters into out (real_gpt_unit_elems elements, host
 * memory). GPT-2 init: weights N(0, 0.02), proj.weight and fc2.weight N(0, 0.02/sqrt(2L)),
 * biases 0, layer-norm gains 1; wte and wpe N(0, 0.02). Deterministic in (seed, unit)
 * alone, so any rank can initialise any unit identically: each element's normal is drawn
 * by Box-Muller from hashes of (seed, unit, element index), not from a sequence. */
gboolean real_gpt_init_params(const RealGptDims *dims, uint64_t seed, int unit,
                              RealBf16 *out, GError **error);

/* Elements [first_elem, first_elem + n_elems) of what real_gpt_init_params writes, into
 * out[0 .. n_elems): bit-identical to that slice of the whole unit. Elements at or past the
 * unit's end (ZeRO padding) are 0. A ZeRO-3 rank draws only its own slice this way. */
gboolean real_gpt_init_params_range(const RealGptDims *dims, uint64_t seed, int unit,
                                    size_t first_elem, size_t n_elems, RealBf16 *out,
                                    GError **error);

/* A model runtime on backend `be` (borrowed; must outlive it). It owns only the saved
 * activations of blocks between their forward and backward. NULL on invalid dims. */
RealGpt *real_gpt_new(RealBackend *be, const RealGptDims *dims, GError **error);

/* The tensor group's collectives a runtime of dims.tp > 1 calls (with ctx); FALSE with
 * *error set when one fails. sum: x[0..n) = the sum over the group of every rank's x (device
 * memory of the runtime's backend). gather_host: in place on host memory buf of size x n
 * bytes, rank q's n bytes at q n afterwards (this rank's were there before). */
typedef struct RealGptTpOps {
    gboolean (*sum)(void *ctx, float *x, size_t n, GError **error);
    gboolean (*gather_host)(void *ctx, void *buf, size_t n, GError **error);
} RealGptTpOps;

/* Sets them (`ops` must outlive the runtime); a runtime of dims.tp > 1 fails without. */
void real_gpt_set_tp(RealGpt *gpt, const RealGptTpOps *ops, void *ctx);

/* A mixture of experts (dims.moe_experts > 0) with its experts over dims.ep > 1 ranks: the
 * expert-parallel group (borrowed; its size ep, this rank ep_rank in it) over which the block's
 * fc1 module dispatches its tokens and gathers the experts' outputs, and the fc2 module's
 * backward the gradients (real_moe_alltoall, four all-to-alls of E C h a block). */
void real_gpt_set_ep(RealGpt *gpt, RealComm *ep);
/* The sparse MLP's dimensions (real_moe.h) of a mixture of experts' dims. */
RealMoeDims real_gpt_moe_dims(const RealGptDims *d);

/* A schedule runs a sparse block as its ops (real_engine: block_fwd, ep_dispatch, expert_fwd,
 * ep_combine, unpermute_fwd; unpermute_bwd, ep_dispatch, expert_bwd, ep_combine, block_bwd),
 * the all-to-alls and their buffers its own: with split set, the block forward's fc1 module
 * only routes (the run stays open), real_gpt_moe_permute fills the dispatch buffer from it, the
 * experts run by the calls below, and the fc2 module sums the copies from the buffer bound by
 * real_gpt_moe_bind; backward's fc2 module writes the copies' gradients into the bound buffer,
 * the experts' backward runs (adding the experts' gradients), and the fc1 module reads the
 * returned input gradients from the bound buffer. Buffers hold real_moe_a2a_elems. */
void real_gpt_moe_set_split(RealGpt *gpt, bool split);
void real_gpt_moe_bind(RealGpt *gpt, RealBf16 *buffer);
gboolean real_gpt_moe_permute(RealGpt *gpt, int layer, RealBf16 *send, GError **error);
gboolean real_gpt_moe_experts_forward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                        const RealBf16 *recv, RealBf16 *out, GError **error);
gboolean real_gpt_moe_experts_backward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                         const RealBf16 *recv, const RealGptTensors *grads,
                                         RealBf16 *out, GError **error);

/* Frees the runtime and any activations still saved. NULL is ignored. */
void real_gpt_free(RealGpt *gpt);

/* Declares the gradient tensors in `tensors` (bit k: tensor k) of unit `unit` (-1: of every
 * unit) fresh: the next call that writes one stores its gradient over what is there, and the
 * calls after add to it. That is autograd's first backward into a .grad that DeepSpeed's
 * zero_grad left None (set_to_none) and its accumulation after, with no zeroing pass. The
 * engine declares a step's gradients fresh where it keeps them, or a unit's where it takes a
 * new buffer for them; a tensor that was not declared fresh is added to (the caller zeroes
 * it), which is also how a runtime starts. */
void real_gpt_grads_fresh(RealGpt *gpt, int unit, uint32_t tensors);

/* With `f32`, every gradient view the calls take (RealGptTensors' at[], the RealBf16 *
 * gradient arguments) points at fp32 storage: a gradient is stored or added in fp32 there,
 * never rounded (Megatron's fp32 main_grad, which gradient_accumulation_fusion's wgrad GEMMs
 * accumulate into). Off by default. */
void real_gpt_set_grads_f32(RealGpt *gpt, gboolean f32);

/* x0 [T,h] = wte[tokens] + wpe[position], rounded to bf16. tokens: host, b s of them, in
 * [0, V). */
gboolean real_gpt_embed_forward(RealGpt *gpt, const RealBf16 *embed_params, const int *tokens,
                                RealBf16 *x0, GError **error);
gboolean real_gpt_embed_forward_t(RealGpt *gpt, const RealGptTensors *embed, const int *tokens,
                                  RealBf16 *x0, GError **error);

/* Block `layer` (0..L-1, parameters = unit layer + 1): x_out = block(x_in). x_out may
 * alias x_in. With save_activations the block keeps real_gpt_block_activation_bytes for
 * its backward (an error if it already holds some); without, it keeps nothing and computes
 * bit-identical outputs, so a later save_activations call on the same x_in recomputes
 * exactly what backward needs. */
gboolean real_gpt_block_forward(RealGpt *gpt, int layer, const RealBf16 *block_params,
                                const RealBf16 *x_in, RealBf16 *x_out,
                                gboolean save_activations, GError **error);
gboolean real_gpt_block_forward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                  const RealBf16 *x_in, RealBf16 *x_out,
                                  gboolean save_activations, GError **error);

/* A block's modules (the planner's ZpBlockModule): module m holds tensors 2m and 2m + 1 of
 * the block's layout (weight or gain, then bias when present). */
enum {
    REAL_GPT_MOD_LN1, REAL_GPT_MOD_QKV, REAL_GPT_MOD_PROJ, REAL_GPT_MOD_LN2, REAL_GPT_MOD_FC1,
    REAL_GPT_MOD_FC2, REAL_GPT_N_MODULES
};

/* Bits of the tensors of module `module` in a block's view (RealGptTensors at[] indices). */
uint32_t real_gpt_module_tensors(const RealGptDims *dims, int module);

/* The block forward module by module, as DeepSpeed's stage 3 computes it (each module after
 * its own parameters' gather): modules ln1 .. fc2 in turn, each with the parameter-free work
 * that follows it (real_gpt_block.c real_gpt_fwd_module); `block` need hold only that module's
 * tensors. The first reads x_in (and allocates the saved activations and the workspace), the
 * last writes x_out (and frees the workspace); the calls of one block may not interleave with
 * another block's. Running all six is real_gpt_block_forward_t, bit for bit. */
gboolean real_gpt_block_forward_module_t(RealGpt *gpt, int layer, int module,
                                         const RealGptTensors *block, const RealBf16 *x_in,
                                         RealBf16 *x_out, gboolean save_activations,
                                         GError **error);

/* Final norm, LM head and mean cross-entropy over the b s tokens, forward and backward at
 * once: *loss_out = mean loss; dx_last [T,h] = d(dloss_scale * loss)/dx_last (overwritten);
 * final_ln_grads (unit L+1) += and, tied, the wte part of embed_grads (unit 0) += their
 * gradients of dloss_scale * loss. embed_params is unit 0 (wte is read) when tied; untied, the
 * head is unit L+1's lm_head and embed_params and embed_grads are not read (may be NULL).
 * targets: host, b s of them, in [0, V). */
gboolean real_gpt_head_forward_backward(RealGpt *gpt, const RealBf16 *final_ln_params,
                                        const RealBf16 *embed_params, const RealBf16 *x_last,
                                        const int *targets, float dloss_scale,
                                        float *loss_out, float *dx_last,
                                        RealBf16 *final_ln_grads, RealBf16 *embed_grads,
                                        GError **error);
/* The same on views (embed and embed_grads may be NULL untied). */
gboolean real_gpt_head_forward_backward_t(RealGpt *gpt, const RealGptTensors *final_ln,
                                          const RealGptTensors *embed, const RealBf16 *x_last,
                                          const int *targets, float dloss_scale,
                                          float *loss_out, float *dx_last,
                                          const RealGptTensors *final_ln_grads,
                                          const RealGptTensors *embed_grads, GError **error);

/* Backward of block `layer` from its saved activations (which it then frees):
 * dx_in = dL/dx_layer from dx_out = dL/dx_{layer+1} (dx_in may alias dx_out), and
 * block_grads (unit layer + 1) += dL/dparams. block_params must hold the same values the
 * forward used. */
gboolean real_gpt_block_backward(RealGpt *gpt, int layer, const RealBf16 *block_params,
                                 const float *dx_out, float *dx_in, RealBf16 *block_grads,
                                 GError **error);
gboolean real_gpt_block_backward_t(RealGpt *gpt, int layer, const RealGptTensors *block,
                                   const float *dx_out, float *dx_in,
                                   const RealGptTensors *block_grads, GError **error);

/* The block backward module by module, fc2 .. ln1 (real_gpt_block.c real_gpt_bwd_module): the
 * first reads dx_out, the last writes dx_in and frees the saved activations; each adds its
 * own tensors' gradients into block_grads (only those are read; NULL: none added), as
 * DeepSpeed's hooks hand each parameter's gradient on once its module's backward made it.
 * Running all six is real_gpt_block_backward_t, bit for bit. */
gboolean real_gpt_block_backward_module_t(RealGpt *gpt, int layer, int module,
                                          const RealGptTensors *block, const float *dx_out,
                                          float *dx_in, const RealGptTensors *block_grads,
                                          GError **error);

/* A pipeline stage forwards several micro-batches through a block before their backwards:
 * take_saved hands block `layer`'s saved activations (NULL when none) to the caller, who
 * keeps them (the backend's allocation, freed with be->free) and gives them back with
 * put_saved before that micro-batch's backward; put_saved fails if the block holds some. */
void *real_gpt_take_saved(RealGpt *gpt, int layer);
gboolean real_gpt_put_saved(RealGpt *gpt, int layer, void *saved, GError **error);

/* embed_grads (unit 0: wte and wpe) += the gradients given dx0 = dL/dx_0 and the tokens
 * of the forward. */
gboolean real_gpt_embed_backward(RealGpt *gpt, const int *tokens, const float *dx0,
                                 RealBf16 *embed_grads, GError **error);
gboolean real_gpt_embed_backward_t(RealGpt *gpt, const int *tokens, const float *dx0,
                                   const RealGptTensors *embed_grads, GError **error);

#endif
