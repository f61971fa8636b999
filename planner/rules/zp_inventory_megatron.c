/* zp_inventory_megatron: the kernels Megatron-LM launches for a GPT block with its local
 * (non-Transformer-Engine) layer spec — fused layer norm, bias-GeLU, scale-mask-softmax and
 * bias-dropout-add, tensor-parallel linears with gradient-accumulation fusion — its vocabulary-
 * parallel cross entropy, and its mixed-precision optimizer with apex's FusedAdam. Every tensor
 * of the model is in the working precision; gradients accumulate into fp32 main_grad. */
#include "zp_inventory.h"

#include <math.h>

#define MC "Megatron-LM megatron/core/"
#define LAYER MC "transformer/transformer_layer.py TransformerLayer.forward"
#define FLN MC "fusions/fused_layer_norm.py FusedLayerNorm.forward (apex " \
            "fused_layer_norm_cuda / persist_layer_norm)"
#define FLN_BWD "apex csrc/layer_norm_cuda_kernel.cu cuComputeGradInput, " \
                "cuComputePartGradGammaBeta + cuComputeGradGammaBeta"
#define LIN MC "tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.forward"
#define LIN_BWD MC "tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication." \
                   "backward (grad_output.matmul(weight); wgrad_gemm_accum_fp32 into main_grad)"
#define DPA MC "transformer/dot_product_attention.py DotProductAttention.forward"
#define SOFTMAX MC "fusions/fused_softmax.py FusedScaleMaskSoftmax " \
                   "(scaled_upper_triang_masked_softmax_cuda)"
#define BDA MC "fusions/fused_bias_dropout.py bias_dropout_add_fused_train"
/* --qk-layernorm: q_layernorm and k_layernorm over each head's hd after the qkv split, before
 * RoPE (attention.py SelfAttention.get_query_key_value_tensors) */
#define QK_NORM MC "transformer/attention.py SelfAttention.get_query_key_value_tensors"
#define GELU MC "fusions/fused_bias_gelu.py bias_gelu_impl (GeLUFunction)"
#define SWIGLU MC "fusions/fused_bias_swiglu.py bias_swiglu_impl"
#define ROPE MC "models/common/embeddings/rotary_pos_embedding.py apply_rotary_pos_emb " \
               "(the fused kernel)"
#define DROP "aten/src/ATen/native/cuda/Dropout.cu fused_dropout"
#define ACCUM "torch/csrc/autograd/input_buffer.cpp InputBuffer::add (a tensor used twice)"
#define SUM "aten/src/ATen/native/cuda/ReduceSumProdKernel.cu (bias gradient)"
#define TP_AR MC "tensor_parallel/mappings.py _reduce (all-reduce over the tensor group)"
#define XENT MC "tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy"
#define EMB MC "models/common/embeddings/language_model_embedding.py " \
               "LanguageModelEmbedding.forward"
#define VPE MC "tensor_parallel/layers.py VocabParallelEmbedding.forward"
#define EMB_BWD "aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda"
#define HOOK MC "distributed/distributed_data_parallel.py _make_backward_post_hook " \
                "(param.main_grad.add_(param.grad))"
#define OPT MC "optimizer/optimizer.py MixedPrecisionOptimizer.step"
#define ACCUM_GRAD "torch/csrc/autograd/functions/accumulate_grad.h AccumulateGrad::" \
                   "accumulateGrad (variable_grad += new_grad; Megatron-LM de7dc40f " \
                   "megatron/mpu/layers.py F.linear, no main_grad)"
#define OPT_2021 "Megatron-LM de7dc40f megatron/optimizer/optimizer.py " \
                 "Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads " \
                 "(main_param.grad = model_param.grad.float(); zero_grad(set_to_none=True))"
#define ADAM "apex apex/optimizers/fused_adam.py FusedAdam.step (multi_tensor_adam)"
/* Local DDP without contiguous buffers, which the 2021 runs without a main_grad used: at the
 * step's end, after the backward, the 16-bit .grads are concatenated into one flat tensor,
 * divided by the data-parallel degree, all-reduced, and copied back tensor by tensor. These
 * kernels sit around the all-reduce, which nothing overlaps there; they are priced with the
 * step. (torch DDP, PyTorch 1.8 reducer.cpp, copies each gradient into its bucket divided in
 * one kernel, mark_variable_ready_dense's mul_out, and back, copy_bucket_to_grad: 8 of these
 * 12 bytes a parameter.) */
#define DDP_2021 "Megatron-LM de7dc40f megatron/model/distributed.py " \
                 "DistributedDataParallel.allreduce_gradients"

static void norm_fwd(ZpInvList *out, const ZpInvDims *d, const char *name)
{
    const double th = d->t_norm * d->h;
    const double params = (d->rms ? 1 : 2) * d->h * d->e; /* RMSNorm: a gain; LayerNorm: +bias */
    zp_inv_mem(out, name, th * d->e + params, th * d->e + 8 * d->t_norm, FLN);
}

static void norm_bwd(ZpInvList *out, const ZpInvDims *d, const char *name)
{
    const double th = d->t_norm * d->h;
    zp_inv_mem(out, name, 2 * th * d->e + 8 * d->t_norm + d->h * d->e, th * d->e, FLN_BWD);
    zp_inv_mem(out, name, 2 * th * d->e + 8 * d->t_norm, (d->rms ? 1 : 2) * d->h * 4, FLN_BWD);
}

/* A linear's GEMM; the bias, when added here (not fused downstream), is its own kernel. */
static void linear_fwd(ZpInvList *out, const ZpInvDims *d, const char *name, double n, double k,
                       gboolean bias_here)
{
    zp_inv_gemm(out, name, 1, d->t, n, k, d->e, d->e, LIN);
    if (bias_here)
        zp_inv_mem(out, "bias_add", d->t * n * d->e + n * d->e, d->t * n * d->e, LIN);
}

/* A fresh 16-bit gradient of `elems` elements added into the parameter's .grad where there is
 * no fp32 main_grad: on every micro-step after the first (the first assigns it), so at
 * accum_share of its bytes on average over a step's micro-steps. */
static void grad_accumulate(ZpInvList *out, const ZpInvDims *d, double elems)
{
    if (!d->main_grad && d->accum_share > 0)
        zp_inv_mem(out, "grad_accumulate", d->accum_share * 2 * elems * d->e,
                   d->accum_share * elems * d->e, ACCUM_GRAD);
}

/* dgrad, then wgrad: accumulated into the fp32 main_grad (read and written) by
 * gradient-accumulation fusion, or without a main_grad written in 16 bits and added into
 * .grad; then the bias gradient where the linear added its bias itself. */
static void linear_bwd(ZpInvList *out, const ZpInvDims *d, const char *name, double n, double k,
                       gboolean bias_here)
{
    zp_inv_gemm(out, name, 1, d->t, k, n, d->e, d->e, LIN_BWD);
    zp_inv_gemm(out, name, 1, k, n, d->t, d->e, d->main_grad ? 8 : d->e, LIN_BWD);
    grad_accumulate(out, d, k * n);
    if (bias_here)
        zp_inv_mem(out, "bias_grad", d->t * n * d->e, n * 4, SUM);
}

/* bias + dropout + residual in one kernel (its mask when training with dropout). */
static void bda_fwd(ZpInvList *out, const ZpInvDims *d, gboolean bias)
{
    const double th = d->t_norm * d->h;
    zp_inv_mem(out, "bias_dropout_add", 2 * th * d->e + (bias ? d->h * d->e : 0),
               th * d->e + (d->dropout ? th : 0), BDA);
}

static void bda_bwd(ZpInvList *out, const ZpInvDims *d, gboolean bias)
{
    const double th = d->t_norm * d->h;
    if (d->dropout)
        zp_inv_mem(out, "bias_dropout_add_bwd", th * (d->e + 1), th * d->e, BDA);
    if (bias)
        zp_inv_mem(out, "bias_grad", th * d->e, d->h * 4, SUM);
}

/* Of the b a s^2 scores, the elements the causal softmax kernels read: row i (from 0) reads
 * its first i + 1 in vectors of 4 (ELEMENTS_PER_LDG_STG), 4 ceil((i + 1) / 4) of them, and
 * writes all s, zeros above the diagonal (Megatron-LM de7dc40f
 * megatron/fused_kernels/scaled_upper_triang_masked_softmax.h
 * scaled_upper_triang_masked_softmax_warp_forward and _warp_backward, local_seq =
 * blockIdx.x + 1; the same kernel today as apex's scaled_upper_triang_masked_softmax_cuda).
 * The kernel needs s a multiple of 4 (fused_softmax.py: query_seq_len % 4 == 0): s / 4 groups
 * of 4 rows, group j reading 4 j each, 8 n (n + 1) for n = s / 4. */
static double causal_read_elems(const ZpInvDims *d)
{
    const double n = ceil(d->s / 4);
    return d->b * d->heads * MIN(8 * n * (n + 1), d->s * d->s);
}

void zp_inventory_megatron_core_attention_fwd(const ZpInvDims *d, ZpInvList *out)
{
    const double e = d->e, bh = d->b * d->heads, sc = bh * d->s * d->s;
    const double ha = d->heads * d->hd, th_a = d->t * ha, th_kv = d->t * d->kv_heads * d->hd;
    if (d->fused) {
        zp_inv_attention(out, d, 0, MC "transformer/dot_product_attention.py (a fused kernel "
                                    "in its place: flash-attn or Transformer Engine)");
        return;
    }
    if (d->kv_heads < d->heads)
        zp_inv_mem(out, "repeat_interleave_kv", 2 * th_kv * e, 2 * th_a * e, DPA);
    zp_inv_gemm(out, "baddbmm_scores", bh, d->s, d->s, d->hd, e, e, DPA);
    zp_inv_mem(out, "scale_mask_softmax", causal_read_elems(d) * e, sc * e, SOFTMAX);
    if (d->dropout)
        zp_inv_mem(out, "attention_dropout", sc * e, sc * (e + 1), DROP);
    zp_inv_gemm(out, "bmm_context", bh, d->s, d->hd, d->s, e, e, DPA);
    zp_inv_mem(out, "context_permute", th_a * e, th_a * e, DPA);
}

static void block_fwd(const ZpInvDims *d, ZpInvList *out)
{
    const double e = d->e;
    const double ha = d->heads * d->hd, th_a = d->t * ha, th_kv = d->t * d->kv_heads * d->hd;
    norm_fwd(out, d, "input_layernorm");
    if (d->mp > 1 && d->t_norm < d->t)
        zp_inv_collective(out, "sequence_parallel_all_gather", d->t * d->h * e, TP_AR);
    linear_fwd(out, d, "linear_qkv", d->q, d->h, d->bias_qkv);
    zp_inv_qk_norm(out, d, 0, QK_NORM);
    if (d->rope) {
        zp_inv_mem(out, "rope_q", th_a * e, th_a * e, ROPE);
        zp_inv_mem(out, "rope_k", th_kv * e, th_kv * e, ROPE);
    }
    zp_inventory_megatron_core_attention_fwd(d, out);
    linear_fwd(out, d, "linear_proj", d->h, ha, FALSE);
    if (d->mp > 1)
        zp_inv_collective(out, "linear_proj_all_reduce", d->t * d->h * e, TP_AR);
    bda_fwd(out, d, d->bias_proj);
    norm_fwd(out, d, "pre_mlp_layernorm");
    if (d->mp > 1 && d->t_norm < d->t)
        zp_inv_collective(out, "sequence_parallel_all_gather", d->t * d->h * e, TP_AR);
    linear_fwd(out, d, "linear_fc1", d->f1, d->h, FALSE);
    if (d->gated)
        zp_inv_mem(out, "bias_swiglu", 2 * d->t * d->f * e, d->t * d->f * e, SWIGLU);
    else
        zp_inv_mem(out, "bias_gelu", d->t * d->f * e + (d->bias_mlp ? d->f * e : 0),
                   d->t * d->f * e, GELU);
    linear_fwd(out, d, "linear_fc2", d->h, d->f, FALSE);
    if (d->mp > 1)
        zp_inv_collective(out, "linear_fc2_all_reduce", d->t * d->h * e, TP_AR);
    bda_fwd(out, d, d->bias_mlp);
}

static void block_bwd(const ZpInvDims *d, ZpInvList *out)
{
    const double e = d->e, bh = d->b * d->heads, sc = bh * d->s * d->s;
    const double ha = d->heads * d->hd, th_a = d->t * ha, th_kv = d->t * d->kv_heads * d->hd;
    const double th = d->t_norm * d->h;
    bda_bwd(out, d, d->bias_mlp);
    linear_bwd(out, d, "linear_fc2", d->h, d->f, FALSE);
    if (d->gated)
        zp_inv_mem(out, "bias_swiglu_bwd", 3 * d->t * d->f * e, 2 * d->t * d->f * e, SWIGLU);
    else
        zp_inv_mem(out, "bias_gelu_bwd", 2 * d->t * d->f * e + (d->bias_mlp ? d->f * e : 0),
                   d->t * d->f * e, GELU " (bias_gelu_back)");
    if (d->bias_mlp) /* GeLUFunction's bias gradient, summed over the tokens */
        zp_inv_mem(out, "fc1_bias_grad", d->t * d->f1 * e, d->f1 * 4, SUM);
    linear_bwd(out, d, "linear_fc1", d->f1, d->h, FALSE);
    if (d->mp > 1)
        zp_inv_collective(out, "linear_fc1_dgrad_all_reduce", d->t * d->h * e, LIN_BWD);
    norm_bwd(out, d, "pre_mlp_layernorm_bwd");
    zp_inv_mem(out, "residual_accumulate", 2 * th * e, th * e, ACCUM);
    bda_bwd(out, d, d->bias_proj);
    linear_bwd(out, d, "linear_proj", d->h, ha, FALSE);
    if (d->fused) {
        zp_inv_attention(out, d, 1, MC "transformer/dot_product_attention.py (the fused "
                                    "kernel's backward)");
    } else {
        zp_inv_mem(out, "context_permute_bwd", th_a * e, th_a * e, DPA);
        zp_inv_gemm(out, "bmm_context_bwd", bh, d->s, d->s, d->hd, e, e, DPA);
        zp_inv_gemm(out, "bmm_context_bwd", bh, d->s, d->hd, d->s, e, e, DPA);
        if (d->dropout)
            zp_inv_mem(out, "attention_dropout_bwd", sc * (e + 1), sc * e, DROP);
        zp_inv_mem(out, "scale_mask_softmax_bwd", 2 * causal_read_elems(d) * e, sc * e, SOFTMAX);
        zp_inv_gemm(out, "baddbmm_scores_bwd", bh, d->s, d->hd, d->s, e, e, DPA);
        zp_inv_gemm(out, "baddbmm_scores_bwd", bh, d->s, d->hd, d->s, e, e, DPA);
        if (d->kv_heads < d->heads)
            zp_inv_mem(out, "repeat_interleave_kv_bwd", 2 * th_a * e, 2 * th_kv * e, DPA);
    }
    if (d->rope) {
        zp_inv_mem(out, "rope_k_bwd", th_kv * e, th_kv * e, ROPE);
        zp_inv_mem(out, "rope_q_bwd", th_a * e, th_a * e, ROPE);
    }
    zp_inv_qk_norm(out, d, 1, QK_NORM);
    linear_bwd(out, d, "linear_qkv", d->q, d->h, d->bias_qkv);
    if (d->mp > 1)
        zp_inv_collective(out, "linear_qkv_dgrad_all_reduce", d->t * d->h * e, LIN_BWD);
    norm_bwd(out, d, "input_layernorm_bwd");
    zp_inv_mem(out, "residual_accumulate", 2 * th * e, th * e, ACCUM);
}

/* The final norm, the output layer, and the cross entropy on fp32 logits (megatron/model/
 * gpt_model.py post_language_model_processing: vocab_parallel_cross_entropy(output.float())
 * unless --fp16-lm-cross-entropy): the max, its subtraction, exp, the sum, the division that
 * leaves the softmax for the backward; backward the target's update and one multiply. */
static void head(const ZpInvDims *d, ZpInvList *out)
{
    const double e = d->e, t = d->t, tv = d->t * d->v;
    norm_fwd(out, d, "final_layernorm");
    zp_inv_gemm(out, "output_layer", 1, t, d->v, d->h, e, e, LIN);
    zp_inv_mem(out, "logits.float", tv * e, 4 * tv, "Megatron-LM megatron/model/gpt_model.py "
                                                    "post_language_model_processing");
    zp_inv_mem(out, "logits_max", 4 * tv, 4 * t, XENT ".forward");
    if (d->mp > 1)
        zp_inv_collective(out, "max_all_reduce", 4 * t, XENT ".forward");
    zp_inv_mem(out, "sub_max", 4 * tv + 4 * t, 4 * tv, XENT ".forward");
    zp_inv_mem(out, "exp", 4 * tv, 4 * tv, XENT ".forward");
    zp_inv_mem(out, "sum_exp", 4 * tv, 4 * t, XENT ".forward");
    if (d->mp > 1)
        zp_inv_collective(out, "sum_all_reduce", 4 * t, XENT ".forward");
    zp_inv_mem(out, "softmax_div", 4 * tv + 4 * t, 4 * tv, XENT ".forward");
    zp_inv_mem(out, "grad_target_update", 16 * t, 4 * t, XENT ".backward");
    zp_inv_mem(out, "grad_mul", 4 * tv + 4 * t, 4 * tv, XENT ".backward");
    zp_inv_mem(out, "logits.float_bwd", 4 * tv, tv * e, "tools/autograd/derivatives.yaml "
                                                       "_to_copy");
    zp_inv_gemm(out, "output_layer_dgrad", 1, t, d->h, d->v, e, e, LIN_BWD);
    if (d->mp > 1)
        zp_inv_collective(out, "output_layer_dgrad_all_reduce", t * d->h * e, LIN_BWD);
    zp_inv_gemm(out, "output_layer_wgrad", 1, d->v, d->h, t, e, d->main_grad ? 8 : e, LIN_BWD);
    /* Without a main_grad the head's weight gradient is added into its .grad like any other
     * (F.linear in Megatron-LM de7dc40f megatron/model/language_model.py parallel_lm_logits):
     * here when the head holds its own copy of the table (a pipeline's last stage, or
     * untied), else summed with the table's in its backward (table_grad). */
    if (!d->head_shares_table)
        grad_accumulate(out, d, d->v * d->h);
    norm_bwd(out, d, "final_layernorm_bwd");
}

/* Token rows (vocabulary-parallel: the out-of-range ids masked, their rows zeroed, summed over
 * the tensor group), learned positions added, the [s, b, h] transpose made contiguous, the
 * embedding dropout. */
static void embed_fwd(const ZpInvDims *d, ZpInvList *out)
{
    const double e = d->e, th = d->t * d->h;
    if (d->mp > 1)
        zp_inv_mem(out, "vocab_mask", 8 * d->t, 9 * d->t, VPE);
    zp_inv_mem(out, "word_embeddings", th * e + 8 * d->t, th * e, VPE);
    if (d->mp > 1) {
        zp_inv_mem(out, "vocab_mask_rows", th * e + d->t, th * e, VPE);
        zp_inv_collective(out, "word_embeddings_all_reduce", th * e, VPE);
    }
    if (d->learned) {
        zp_inv_mem(out, "position_embeddings", th * e + 8 * d->t, th * e, EMB);
        zp_inv_mem(out, "embeddings_add", 2 * th * e, th * e, EMB);
    }
    zp_inv_mem(out, "transpose_contiguous", th * e, th * e, EMB);
    if (d->dropout)
        zp_inv_mem(out, "embedding_dropout", th * e, th * (e + 1), DROP);
}

/* Backward: dropout, the rows' gradients (embedding_dense_backward: sort, zero, sum), and the
 * DDP hook adding each table's gradient into its fp32 main_grad (the embeddings have no
 * gradient-accumulation fusion). */
static void table_grad(ZpInvList *out, const ZpInvDims *d, double rows, const char *name)
{
    const double th = d->t * d->h, e = d->e;
    zp_inv_mem(out, name, 16 * d->t, 16 * d->t, EMB_BWD);
    zp_inv_mem(out, name, 0, rows * d->h * e, EMB_BWD);
    zp_inv_mem(out, name, th * e + 8 * d->t, th * e, EMB_BWD);
    if (d->main_grad)
        zp_inv_mem(out, "main_grad_add", rows * d->h * (4 + e), rows * d->h * 4, HOOK);
    grad_accumulate(out, d, rows * d->h);
}

/* Without a main_grad, a tied table on the head's rank gets two 16-bit gradients in one
 * backward, the head's weight gradient and the rows': autograd adds them before the weight's
 * AccumulateGrad, on every micro-step (InputBuffer::add). */
static void tied_grad_sum(ZpInvList *out, const ZpInvDims *d)
{
    if (!d->main_grad && d->head_shares_table)
        zp_inv_mem(out, "tied_grad_sum", 2 * d->v * d->h * d->e, d->v * d->h * d->e, ACCUM);
}

static void embed_bwd(const ZpInvDims *d, ZpInvList *out)
{
    const double th = d->t * d->h;
    if (d->dropout)
        zp_inv_mem(out, "embedding_dropout_bwd", th * (d->e + 1), th * d->e, DROP);
    zp_inv_mem(out, "transpose_contiguous_bwd", th * d->e, th * d->e, EMB);
    if (d->learned)
        table_grad(out, d, d->positions, "position_embeddings_bwd");
    tied_grad_sum(out, d);
    table_grad(out, d, d->v, "word_embeddings_bwd");
}

/* The step over n elements (MixedPrecisionOptimizer.step with fp32 main_grad): fp16's unscale
 * and inf check (_unscale_main_grads_and_check_for_nan:
 * torch._amp_foreach_non_finite_check_and_unscale_), the gradient norm (optimizer/clip_grads.py
 * clip_grad_norm_fp32: amp_C.multi_tensor_l2norm; the scaling by the clip coefficient runs
 * only when the norm exceeds the clip, so it is not counted), FusedAdam, the fp32 main
 * parameters copied into the 16-bit ones (_copy_main_params_to_model_params:
 * multi_tensor_scale), and the grad buffer zeroed for the next step
 * (distributed/param_and_grad_buffer.py reset: grad_data.zero_()). */
static void optimizer(const ZpInvDims *d, double n, ZpInvList *out)
{
    const double l = zp_inv_multi_tensor_launches(n);
    if (!d->main_grad) { /* the gradients through a flat buffer for their all-reduce */
        zp_inv_mem(out, "ddp_flatten", d->e * n, d->e * n, DDP_2021 " (_flatten_dense_tensors)");
        zp_inv_mem(out, "ddp_scale", d->e * n, d->e * n, DDP_2021 " (coalesced /= dp)");
        zp_inv_mem(out, "ddp_unflatten_copy", d->e * n, d->e * n, DDP_2021 " (buf.copy_(synced))");
    }
    if (!d->main_grad) /* .grad to fp32, tensor by tensor, before the unscale */
        zp_inv_mem(out, "copy_model_grads_to_main_grads", d->e * n, 4 * n, OPT_2021);
    if (d->fp16)
        zp_inv_multi(out, "unscale_and_check", 4 * n, 4 * n, l, OPT);
    zp_inv_multi(out, "grad_l2norm", 4 * n, 0, l, MC "optimizer/clip_grads.py clip_grad_norm_fp32");
    zp_inv_multi(out, "fused_adam", 16 * n, 12 * n, l, ADAM);
    zp_inv_multi(out, "copy_main_to_model", 4 * n, d->e * n, l, OPT);
    if (d->main_grad) /* without one, .grad is set to None: no kernel */
        zp_inv_mem(out, "zero_grad_buffer", 0, 4 * n, MC "distributed/param_and_grad_buffer.py");
}

const ZpInventory zp_inventory_megatron = {
    .name = "megatron",
    .about = "Megatron-LM's GPT with its local layer spec: fused layer norm, bias-GeLU, "
             "scale-mask-softmax and bias-dropout-add, gradient-accumulation fusion into fp32 "
             "main_grad, apex FusedAdam",
    .embed_fwd = embed_fwd,
    .block_fwd = block_fwd,
    .head = head,
    .block_bwd = block_bwd,
    .embed_bwd = embed_bwd,
    .optimizer = optimizer,
};
