/* zp_inventory_eager: the kernels PyTorch eager launches for a Hugging Face GPT-2 or Llama
 * decoder (modeling_gpt2.py, modeling_llama.py) and torch.optim.AdamW, op by op, in issue order.
 * Element sizes: e the working precision's; under autocast the residual stream, norms,
 * softmax and loss run in fp32 and every GEMM casts its fp32 operands first. */
#include "zp_inventory.h"

/* Sources, huggingface/transformers and pytorch/pytorch. */
#define GPT2 "transformers src/transformers/models/gpt2/modeling_gpt2.py "
#define LLAMA "transformers src/transformers/models/llama/modeling_llama.py "
/* q_norm, k_norm = Qwen3MoeRMSNorm(head_dim) on the projected q and k, before RoPE */
#define QK_NORM "transformers src/transformers/models/qwen3_moe/modeling_qwen3_moe.py " \
                "Qwen3MoeAttention.forward"
#define ADDMM "transformers src/transformers/pytorch_utils.py Conv1D.forward (torch.addmm; " \
              "the bias rides in cuBLASLt's epilogue, aten/src/ATen/native/cuda/Blas.cpp " \
              "addmm_out_cuda_impl)"
#define LINEAR "torch/nn/modules/linear.py Linear.forward (aten::linear -> cuBLAS)"
#define MM_BWD "tools/autograd/derivatives.yaml addmm/mm: mm_mat1_backward, mm_mat2_backward"
#define CAST "aten/src/ATen/autocast_mode.cpp cached_cast (autocast to the lower precision)"
#define CAST_BWD "tools/autograd/derivatives.yaml _to_copy: grad.to(self's dtype)"
#define LN_FWD "aten/src/ATen/native/cuda/layer_norm_kernel.cu LayerNormKernelImpl"
#define LN_BWD "aten/src/ATen/native/cuda/layer_norm_kernel.cu LayerNormBackwardKernelImpl " \
               "(ComputeInternalGradients + GammaBetaBackward)"
#define RMS LLAMA "LlamaRMSNorm.forward"
#define RMS_BWD "tools/autograd/derivatives.yaml (pow, mean, rsqrt, mul) through " RMS
#define GELU "transformers src/transformers/activations.py NewGELUActivation.forward"
#define GELU_BWD "tools/autograd/derivatives.yaml (mul, tanh, pow: FunctionsManual.cpp " \
                 "pow_backward) through " GELU
#define DROP "aten/src/ATen/native/cuda/Dropout.cu fused_dropout (output and a bool mask)"
#define DROP_BWD "aten/src/ATen/native/cuda/Dropout.cu masked_scale"
#define SOFTMAX "aten/src/ATen/native/cuda/SoftMax.cu host_softmax"
#define SOFTMAX_BWD "aten/src/ATen/native/cuda/SoftMax.cu host_softmax_backward"
#define ADD "aten/src/ATen/native/cuda/BinaryOps (add)"
#define ACCUM "torch/csrc/autograd/input_buffer.cpp InputBuffer::add (a tensor used twice)"
#define SUM "aten/src/ATen/native/cuda/ReduceSumProdKernel.cu (sum_to: bias gradient)"
#define EMB "aten/src/ATen/native/cuda/Indexing.cu index_select (F.embedding)"
#define EMB_BWD "aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda " \
                "(sort the indices, zero the table, sum each row's tokens)"
#define ROPE LLAMA "apply_rotary_pos_emb, rotate_half"
#define FOREACH "torch/optim/adam.py _multi_tensor_adam (AdamW: adamw.py), torch._foreach_* " \
                "through aten/src/ATen/native/cuda/MultiTensorApply.cuh"

/* Element sizes of one configuration. */
typedef struct {
    double e;  /* activations in the working precision */
    double r;  /* the residual stream, norms and softmax: fp32 under autocast */
    double w;  /* parameters and their gradients */
    gboolean casts; /* autocast casts each GEMM's fp32 operands */
} Sizes;

static Sizes sizes(const ZpInvDims *d)
{
    const gboolean casts = d->amp && d->e < 4;
    return (Sizes){.e = d->e, .r = casts ? 4 : d->e, .w = casts ? 4 : d->e, .casts = casts};
}

static void unary(ZpInvList *out, const char *name, double elems, double bytes, const char *src)
{
    zp_inv_mem(out, name, elems * bytes, elems * bytes, src);
}

static void binary(ZpInvList *out, const char *name, double elems, double bytes, const char *src)
{
    zp_inv_mem(out, name, 2 * elems * bytes, elems * bytes, src);
}

/* y = x W (+ b) over t rows: the autocast casts (an fp32 input, the weight and bias), then the
 * GEMM with the bias in its epilogue. autocast caches the casts of leaves (the weights, once
 * per forward) but not of activations: q, k and v (gate and up) each cast the norm's fp32
 * output again. */
static void linear_fwd(ZpInvList *out, const Sizes *z, const char *name, double t, double n,
                       double k, gboolean bias, gboolean fp32_input, const char *src)
{
    if (z->casts && fp32_input)
        zp_inv_mem(out, "cast_input", 4 * t * k, 2 * t * k, CAST);
    if (z->casts)
        zp_inv_mem(out, "cast_weight", 4 * (k * n + (bias ? n : 0)), 2 * (k * n + (bias ? n : 0)),
                   CAST);
    zp_inv_gemm(out, name, 1, t, n, k, z->e, z->e, src);
}

/* Its backward: the bias gradient (a sum over the rows), dx = dy W^T, dW = x^T dy, and the
 * casts back to the fp32 weight and input. */
static void linear_bwd(ZpInvList *out, const Sizes *z, const char *name, double t, double n,
                       double k, gboolean bias, gboolean fp32_input)
{
    if (bias)
        zp_inv_mem(out, "bias_grad", t * n * z->e, n * z->e, SUM);
    zp_inv_gemm(out, name, 1, t, k, n, z->e, z->e, MM_BWD);
    zp_inv_gemm(out, name, 1, k, n, t, z->e, z->e, MM_BWD);
    if (z->casts) {
        zp_inv_mem(out, "cast_weight_grad", 2 * (k * n + (bias ? n : 0)),
                   4 * (k * n + (bias ? n : 0)), CAST_BWD);
        if (fp32_input)
            zp_inv_mem(out, "cast_input_grad", 2 * t * k, 4 * t * k, CAST_BWD);
    }
}

static void norm_fwd(ZpInvList *out, const ZpInvDims *d, const Sizes *z, const char *name)
{
    const double th = d->t * d->h, t = d->t, r = z->r;
    if (!d->rms) {
        zp_inv_mem(out, name, th * r + 2 * d->h * z->w, th * r + 8 * t, LN_FWD);
        return;
    }
    if (r < 4)
        zp_inv_mem(out, "rms.to_fp32", th * r, 4 * th, RMS);
    unary(out, "rms.pow", th, 4, RMS);
    zp_inv_mem(out, "rms.mean", 4 * th, 4 * t, RMS);
    unary(out, "rms.add_eps", t, 4, RMS);
    unary(out, "rms.rsqrt", t, 4, RMS);
    zp_inv_mem(out, "rms.mul", 4 * th + 4 * t, 4 * th, RMS);
    if (r < 4)
        zp_inv_mem(out, "rms.to_input", 4 * th, th * r, RMS);
    zp_inv_mem(out, "rms.weight_mul", th * r + d->h * z->w, th * r, RMS);
}

static void norm_bwd(ZpInvList *out, const ZpInvDims *d, const Sizes *z, const char *name)
{
    const double th = d->t * d->h, t = d->t, r = z->r;
    if (!d->rms) {
        zp_inv_mem(out, name, 2 * th * r + 8 * t + d->h * z->w, th * r, LN_BWD);
        zp_inv_mem(out, name, 2 * th * r + 8 * t, 2 * d->h * 4, LN_BWD);
        return;
    }
    zp_inv_mem(out, "rms.weight_mul_bwd", th * r + d->h * z->w, th * r, RMS_BWD);
    zp_inv_mem(out, "rms.weight_grad_mul", 2 * th * r, 4 * th, RMS_BWD);
    zp_inv_mem(out, "rms.weight_grad_sum", 4 * th, d->h * 4, RMS_BWD);
    if (r < 4)
        zp_inv_mem(out, "rms.to_input_bwd", th * r, 4 * th, RMS_BWD);
    zp_inv_mem(out, "rms.mul_bwd", 4 * th + 4 * t, 4 * th, RMS_BWD);
    zp_inv_mem(out, "rms.rsqrt_grad_mul", 8 * th, 4 * th, RMS_BWD);
    zp_inv_mem(out, "rms.rsqrt_grad_sum", 4 * th, 4 * t, RMS_BWD);
    zp_inv_mem(out, "rms.rsqrt_bwd", 8 * t, 4 * t, RMS_BWD);
    zp_inv_mem(out, "rms.mean_bwd", 4 * t, 4 * th, RMS_BWD);
    unary(out, "rms.pow_bwd.pow", th, 4, RMS_BWD);
    unary(out, "rms.pow_bwd.scale", th, 4, RMS_BWD);
    binary(out, "rms.pow_bwd.mul", th, 4, RMS_BWD);
    binary(out, "rms.accumulate", th, 4, ACCUM);
    if (r < 4)
        zp_inv_mem(out, "rms.to_fp32_bwd", 4 * th, th * r, RMS_BWD);
}

static void dropout_fwd(ZpInvList *out, const char *name, double elems, double bytes)
{
    zp_inv_mem(out, name, elems * bytes, elems * (bytes + 1), DROP);
}

static void dropout_bwd(ZpInvList *out, const char *name, double elems, double bytes)
{
    zp_inv_mem(out, name, elems * (bytes + 1), elems * bytes, DROP_BWD);
}

/* The residual add: the branch's output (working precision) into the stream. */
static void residual_add(ZpInvList *out, const ZpInvDims *d, const Sizes *z, const char *src)
{
    const double th = d->t * d->h;
    zp_inv_mem(out, "residual_add", th * (z->e + z->r), th * z->r, src);
}

/* Rotary embedding of one tensor of `elems` (q or k): rotate_half's negation and cat, two
 * products and their sum; backward the two products' gradients, the negation's, the slices'
 * zero-padded gradients and their sums. */
static void rope_fwd(ZpInvList *out, double elems, double e)
{
    unary(out, "rope.neg", elems / 2, e, ROPE);
    unary(out, "rope.cat", elems, e, ROPE);
    binary(out, "rope.mul_cos", elems, e, ROPE);
    binary(out, "rope.mul_sin", elems, e, ROPE);
    binary(out, "rope.add", elems, e, ROPE);
}

static void rope_bwd(ZpInvList *out, double elems, double e)
{
    binary(out, "rope.mul_cos_bwd", elems, e, ROPE);
    binary(out, "rope.mul_sin_bwd", elems, e, ROPE);
    unary(out, "rope.neg_bwd", elems / 2, e, ROPE);
    zp_inv_mem(out, "rope.slice_bwd", elems / 2 * e, elems * e, ROPE);
    zp_inv_mem(out, "rope.slice_bwd", elems / 2 * e, elems * e, ROPE);
    binary(out, "rope.accumulate", elems, e, ACCUM);
    binary(out, "rope.accumulate", elems, e, ACCUM);
}

/* ---- attention ---- */

static void attention_fwd(ZpInvList *out, const ZpInvDims *d, const Sizes *z)
{
    const double e = z->e, bh = d->b * d->heads, sc = bh * d->s * d->s;
    const double th_a = d->t * d->heads * d->hd, th_kv = d->t * d->kv_heads * d->hd;
    const char *src = d->rms ? LLAMA "eager_attention_forward" : GPT2 "GPT2Attention._attn";
    if (d->rope) {
        rope_fwd(out, th_a, e);
        rope_fwd(out, th_kv, e);
    }
    if (d->fused) {
        zp_inv_attention(out, d, 0, "torch/nn/functional.py scaled_dot_product_attention "
                                    "(the fused backend, aten/src/ATen/native/transformers/"
                                    "cuda/sdp_utils.cpp)");
    } else {
        if (d->kv_heads < d->heads) /* repeat_kv: expand + reshape copies k and v */
            zp_inv_mem(out, "repeat_kv", 2 * th_kv * e, 2 * th_a * e, LLAMA "repeat_kv");
        zp_inv_gemm(out, "scores", bh, d->s, d->s, d->hd, e, e, src);
        unary(out, "scale", sc, e, src);
        /* GPT-2: torch.where(causal_mask, w, min) reads the bool mask; Llama adds its mask
         * of b s^2 in the working precision */
        zp_inv_mem(out, "mask", sc * e + (d->rms ? d->b * d->s * d->s * e : d->s * d->s),
                   sc * e, src);
        if (d->rms) { /* softmax(dim=-1, dtype=float32).to(q.dtype) */
            zp_inv_mem(out, "softmax", sc * e, 4 * sc, SOFTMAX);
            zp_inv_mem(out, "softmax.to", 4 * sc, sc * e, src);
        } else if (z->casts) { /* autocast runs softmax in fp32; .type(value.dtype) */
            zp_inv_mem(out, "softmax.cast", sc * e, 4 * sc, CAST);
            unary(out, "softmax", sc, 4, SOFTMAX);
            zp_inv_mem(out, "softmax.type", 4 * sc, sc * e, src);
        } else {
            unary(out, "softmax", sc, e, SOFTMAX);
        }
        if (d->dropout && !d->rms)
            dropout_fwd(out, "attn_dropout", sc, e);
        zp_inv_gemm(out, "context", bh, d->s, d->hd, d->s, e, e, src);
    }
    unary(out, "merge_heads", th_a, e, d->rms ? LLAMA "LlamaAttention.forward (transpose, "
                                                "contiguous)"
                                              : GPT2 "GPT2Attention._merge_heads");
}

static void attention_bwd(ZpInvList *out, const ZpInvDims *d, const Sizes *z)
{
    const double e = z->e, bh = d->b * d->heads, sc = bh * d->s * d->s;
    const double th_a = d->t * d->heads * d->hd, th_kv = d->t * d->kv_heads * d->hd;
    if (d->fused) {
        zp_inv_attention(out, d, 1, "the fused backend's backward (sdp_utils.cpp)");
    } else {
        zp_inv_gemm(out, "context_bwd", bh, d->s, d->s, d->hd, e, e, MM_BWD);
        zp_inv_gemm(out, "context_bwd", bh, d->s, d->hd, d->s, e, e, MM_BWD);
        if (d->dropout && !d->rms)
            dropout_bwd(out, "attn_dropout_bwd", sc, e);
        if (d->rms) {
            zp_inv_mem(out, "softmax.to_bwd", sc * e, 4 * sc, CAST_BWD);
            zp_inv_mem(out, "softmax_bwd", 8 * sc, sc * e, SOFTMAX_BWD);
        } else if (z->casts) {
            zp_inv_mem(out, "softmax.type_bwd", sc * e, 4 * sc, CAST_BWD);
            zp_inv_mem(out, "softmax_bwd", 8 * sc, 4 * sc, SOFTMAX_BWD);
            zp_inv_mem(out, "softmax.cast_bwd", 4 * sc, sc * e, CAST_BWD);
        } else {
            zp_inv_mem(out, "softmax_bwd", 2 * sc * e, sc * e, SOFTMAX_BWD);
        }
        zp_inv_mem(out, "mask_bwd", sc * e + (d->rms ? 0 : d->s * d->s), sc * e,
                   d->rms ? ADD : "tools/autograd/derivatives.yaml where");
        unary(out, "scale_bwd", sc, e, MM_BWD);
        zp_inv_gemm(out, "scores_bwd", bh, d->s, d->hd, d->s, e, e, MM_BWD);
        zp_inv_gemm(out, "scores_bwd", bh, d->s, d->hd, d->s, e, e, MM_BWD);
        if (d->kv_heads < d->heads)
            zp_inv_mem(out, "repeat_kv_bwd", 2 * th_a * e, 2 * th_kv * e, LLAMA "repeat_kv");
    }
    if (d->rope) {
        rope_bwd(out, th_kv, e);
        rope_bwd(out, th_a, e);
    }
    if (!d->rms) /* the split of c_attn's output into q, k, v: its gradients concatenated */
        unary(out, "split_bwd", d->t * d->q, e, GPT2 "GPT2Attention.forward (split)");
}

/* ---- the MLP's activation ---- */

static void act_fwd(ZpInvList *out, const ZpInvDims *d, double e)
{
    const double tf = d->t * d->f;
    if (d->gated) { /* down_proj(act_fn(gate_proj(x)) * up_proj(x)) */
        unary(out, "silu", tf, e, LLAMA "LlamaMLP.forward");
        binary(out, "gate_mul", tf, e, LLAMA "LlamaMLP.forward");
        return;
    }
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): six unary kernels, two binary */
    static const char *const unaries[] = {"gelu.pow", "gelu.mul_c", "gelu.mul_sqrt",
                                          "gelu.tanh", "gelu.add_1", "gelu.mul_half"};
    for (int i = 0; i < 6; i++) {
        unary(out, unaries[i], tf, e, GELU);
        if (i == 1)
            binary(out, "gelu.add_x", tf, e, GELU);
    }
    binary(out, "gelu.mul", tf, e, GELU);
}

static void act_bwd(ZpInvList *out, const ZpInvDims *d, double e)
{
    const double tf = d->t * d->f;
    if (d->gated) {
        binary(out, "gate_mul_bwd", tf, e, LLAMA "LlamaMLP.forward (mul backward)");
        binary(out, "gate_mul_bwd", tf, e, LLAMA "LlamaMLP.forward (mul backward)");
        binary(out, "silu_bwd", tf, e, "aten/src/ATen/native/cuda/ActivationSiluKernel.cu");
        return;
    }
    /* the product's two gradients, tanh's, the constants', pow's three kernels, 0.5 x's, and
     * the three paths into x summed */
    static const char *const names[] = {"gelu.mul_bwd",   "gelu.mul_bwd",      "gelu.tanh_bwd",
                                        "gelu.mul_sqrt_bwd", "gelu.mul_c_bwd", "gelu.pow_bwd",
                                        "gelu.pow_bwd",   "gelu.pow_bwd",      "gelu.half_bwd",
                                        "gelu.accumulate", "gelu.accumulate"};
    static const int is_binary[] = {1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1};
    for (int i = 0; i < 11; i++)
        (is_binary[i] ? binary : unary)(out, names[i], tf, e, GELU_BWD);
}

/* ---- the block ---- */

void zp_inventory_eager_block_fwd(const ZpInvDims *d, ZpInvList *out)
{
    const Sizes z = sizes(d);
    const double t = d->t, h = d->h, th = t * h, ha = d->heads * d->hd;
    const char *lin = d->rms ? LINEAR : ADDMM;
    norm_fwd(out, d, &z, "ln_1");
    if (d->rms) { /* q_proj, k_proj, v_proj */
        linear_fwd(out, &z, "q_proj", t, ha, h, d->bias_qkv, TRUE, lin);
        linear_fwd(out, &z, "k_proj", t, d->kv_heads * d->hd, h, d->bias_qkv, TRUE, lin);
        linear_fwd(out, &z, "v_proj", t, d->kv_heads * d->hd, h, d->bias_qkv, TRUE, lin);
        zp_inv_qk_norm(out, d, 0, QK_NORM);
    } else {
        linear_fwd(out, &z, "c_attn", t, d->q, h, d->bias_qkv, TRUE, lin);
    }
    attention_fwd(out, d, &z);
    linear_fwd(out, &z, "attn.c_proj", t, h, ha, d->bias_proj, FALSE, lin);
    if (d->dropout && !d->rms)
        dropout_fwd(out, "resid_dropout", th, z.e);
    residual_add(out, d, &z, d->rms ? LLAMA "LlamaDecoderLayer.forward"
                                    : GPT2 "GPT2Block.forward");
    norm_fwd(out, d, &z, "ln_2");
    if (d->gated) {
        linear_fwd(out, &z, "gate_proj", t, d->f, h, d->bias_mlp, TRUE, lin);
        linear_fwd(out, &z, "up_proj", t, d->f, h, d->bias_mlp, TRUE, lin);
    } else {
        linear_fwd(out, &z, "c_fc", t, d->f, h, d->bias_mlp, TRUE, lin);
    }
    act_fwd(out, d, z.e);
    linear_fwd(out, &z, "mlp.c_proj", t, h, d->f, d->bias_mlp, FALSE, lin);
    if (d->dropout && !d->rms)
        dropout_fwd(out, "mlp_dropout", th, z.e);
    residual_add(out, d, &z, d->rms ? LLAMA "LlamaDecoderLayer.forward"
                                    : GPT2 "GPT2Block.forward");
}

void zp_inventory_eager_block_bwd(const ZpInvDims *d, ZpInvList *out)
{
    const Sizes z = sizes(d);
    const double t = d->t, h = d->h, th = t * h, ha = d->heads * d->hd;
    if (d->dropout && !d->rms)
        dropout_bwd(out, "mlp_dropout_bwd", th, z.e);
    linear_bwd(out, &z, "mlp.c_proj", t, h, d->f, d->bias_mlp, FALSE);
    act_bwd(out, d, z.e);
    if (d->gated) {
        linear_bwd(out, &z, "up_proj", t, d->f, h, d->bias_mlp, TRUE);
        linear_bwd(out, &z, "gate_proj", t, d->f, h, d->bias_mlp, TRUE);
        binary(out, "mlp_input_accumulate", th, z.r, ACCUM);
    } else {
        linear_bwd(out, &z, "c_fc", t, d->f, h, d->bias_mlp, TRUE);
    }
    norm_bwd(out, d, &z, "ln_2_bwd");
    binary(out, "residual_accumulate", th, z.r, ACCUM);
    if (d->dropout && !d->rms)
        dropout_bwd(out, "resid_dropout_bwd", th, z.e);
    linear_bwd(out, &z, "attn.c_proj", t, h, ha, d->bias_proj, FALSE);
    attention_bwd(out, d, &z);
    if (d->rms) {
        zp_inv_qk_norm(out, d, 1, QK_NORM);
        linear_bwd(out, &z, "v_proj", t, d->kv_heads * d->hd, h, d->bias_qkv, TRUE);
        linear_bwd(out, &z, "k_proj", t, d->kv_heads * d->hd, h, d->bias_qkv, TRUE);
        linear_bwd(out, &z, "q_proj", t, ha, h, d->bias_qkv, TRUE);
        binary(out, "qkv_input_accumulate", th, z.r, ACCUM);
        binary(out, "qkv_input_accumulate", th, z.r, ACCUM);
    } else {
        linear_bwd(out, &z, "c_attn", t, d->q, h, d->bias_qkv, TRUE);
    }
    norm_bwd(out, d, &z, "ln_1_bwd");
    binary(out, "residual_accumulate", th, z.r, ACCUM);
}

/* ---- head and loss: the final norm, the logits, the loss in fp32 and their backward
 * (transformers src/transformers/loss/loss_utils.py ForCausalLMLoss: logits.float(), then
 * F.cross_entropy = log_softmax + nll_loss) ---- */

#define LOSS "transformers src/transformers/loss/loss_utils.py ForCausalLMLoss"

void zp_inventory_eager_head(const ZpInvDims *d, ZpInvList *out)
{
    const Sizes z = sizes(d);
    const double t = d->t, tv = d->t * d->v;
    norm_fwd(out, d, &z, "ln_f");
    linear_fwd(out, &z, "lm_head", t, d->v, d->h, FALSE, TRUE, LINEAR);
    zp_inv_mem(out, "logits.float", tv * z.e, 4 * tv, LOSS);
    unary(out, "log_softmax", tv, 4, "aten/src/ATen/native/cuda/SoftMax.cu log_softmax");
    zp_inv_mem(out, "nll_loss", 4 * t + 8 * t, 4, "aten/src/ATen/native/cuda/Loss.cu nll_loss");
    zp_inv_mem(out, "nll_loss_bwd", 8 * t, 4 * tv, "aten/src/ATen/native/cuda/Loss.cu "
                                                   "nll_loss_backward (zeros, then the targets)");
    zp_inv_mem(out, "log_softmax_bwd", 8 * tv, 4 * tv, SOFTMAX_BWD);
    zp_inv_mem(out, "logits.float_bwd", 4 * tv, tv * z.e, CAST_BWD);
    linear_bwd(out, &z, "lm_head", t, d->v, d->h, FALSE, TRUE);
    norm_bwd(out, d, &z, "ln_f_bwd");
}

/* ---- embeddings: token (and learned position) rows, their sum, dropout; backward the rows'
 * gradients summed by embedding_dense_backward, and a tied table's two gradients added ---- */

void zp_inventory_eager_embed_fwd(const ZpInvDims *d, ZpInvList *out)
{
    const Sizes z = sizes(d);
    const double th = d->t * d->h;
    zp_inv_mem(out, "wte", th * z.w + 8 * d->t, th * z.w, EMB);
    if (d->learned) {
        zp_inv_mem(out, "wpe", th * z.w + 8 * d->t, th * z.w, EMB);
        binary(out, "embed_add", th, z.w, GPT2 "GPT2Model.forward");
    }
    if (d->rope) /* cos and sin of the positions, once per forward */
        zp_inv_mem(out, "rotary_cos_sin", 8 * d->b * d->s, 4 * 4 * d->b * d->s * d->hd,
                   LLAMA "LlamaRotaryEmbedding.forward");
    if (d->dropout && !d->rms)
        dropout_fwd(out, "embd_dropout", th, z.w);
}

static void table_grad(ZpInvList *out, double rows, double th, double t, const Sizes *z,
                       const char *name)
{
    zp_inv_mem(out, name, 16 * t, 16 * t, EMB_BWD);        /* sort the indices */
    zp_inv_mem(out, name, 0, rows * z->w, EMB_BWD);        /* zero the table's gradient */
    zp_inv_mem(out, name, th * z->r + 8 * t, th * z->w, EMB_BWD); /* sum each row's tokens */
}

void zp_inventory_eager_embed_bwd(const ZpInvDims *d, ZpInvList *out)
{
    const Sizes z = sizes(d);
    const double th = d->t * d->h, vh = d->v * d->h;
    if (d->dropout && !d->rms)
        dropout_bwd(out, "embd_dropout_bwd", th, z.w);
    if (d->learned)
        table_grad(out, d->positions * d->h, th, d->t, &z, "wpe_bwd");
    table_grad(out, vh, th, d->t, &z, "wte_bwd");
    if (d->tied) /* the head's and the embedding's gradients of one table */
        binary(out, "tied_accumulate", vh, z.w, ACCUM);
}

/* ---- torch.optim.AdamW (foreach, the default on CUDA) over fp32 parameters: weight decay,
 * the two moments, the denominator, the update; gradient clipping before it (the Trainer's
 * max_grad_norm 1.0: torch/nn/utils/clip_grad.py clip_grad_norm_, _foreach_norm and
 * _foreach_mul_); fp16 adds GradScaler's unscale (torch/amp/grad_scaler.py unscale_,
 * _amp_foreach_non_finite_check_and_unscale_) ---- */

static void adamw(const ZpInvDims *d, double n, ZpInvList *out)
{
    const double l = zp_inv_multi_tensor_launches(n);
    if (d->fp16)
        zp_inv_multi(out, "grad_scaler.unscale", 4 * n, 4 * n, l,
                     "torch/amp/grad_scaler.py unscale_");
    zp_inv_multi(out, "clip.norm", 4 * n, 0, l, "torch/nn/utils/clip_grad.py clip_grad_norm_");
    zp_inv_multi(out, "clip.mul", 4 * n, 4 * n, l, "torch/nn/utils/clip_grad.py clip_grad_norm_");
    zp_inv_multi(out, "adamw.weight_decay", 4 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.lerp_exp_avg", 8 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.mul_exp_avg_sq", 4 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.addcmul_exp_avg_sq", 12 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.sqrt", 4 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.div_bias_correction", 4 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.add_eps", 4 * n, 4 * n, l, FOREACH);
    zp_inv_multi(out, "adamw.addcdiv", 12 * n, 4 * n, l, FOREACH);
}

static void optimizer(const ZpInvDims *d, double elems, ZpInvList *out)
{
    adamw(d, elems, out);
}

const ZpInventory zp_inventory_eager = {
    .name = "eager",
    .about = "PyTorch eager under torch.autocast over fp32 parameters, as Hugging Face's "
             "Trainer, llm-foundry and torchtitan without compile run a GPT-2 or Llama model, "
             "with torch.optim.AdamW (foreach)",
    .autocast = TRUE,
    .embed_fwd = zp_inventory_eager_embed_fwd,
    .block_fwd = zp_inventory_eager_block_fwd,
    .head = zp_inventory_eager_head,
    .block_bwd = zp_inventory_eager_block_bwd,
    .embed_bwd = zp_inventory_eager_embed_bwd,
    .optimizer = optimizer,
};
