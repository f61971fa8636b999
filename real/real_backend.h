/* real_backend: the one device interface zreal's model and ZeRO engine compute through.
 * A table of function pointers, so a CUDA backend can be added without touching either. */
#ifndef REAL_BACKEND_H
#define REAL_BACKEND_H

#include "real_alloc.h"
#include "real_bf16.h"
#include "real_rope.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Element type of an operand whose precision varies (GEMM inputs, attention probs). */
typedef enum {
    REAL_DTYPE_F32,
    REAL_DTYPE_BF16,
} RealDType;

/* The activation of an MLP: transformers' "silu", "gelu" (the exact x Phi(x), with erf) and
 * "gelu_new"/"gelu_pytorch_tanh" (the tanh approximation, GPT-2's). */
typedef enum {
    REAL_ACT_SILU,
    REAL_ACT_GELU_TANH,
    REAL_ACT_GELU_ERF,
} RealActivation;

/* AdamW hyper-parameters for one optimizer step. */
typedef struct {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay; /* decoupled (AdamW): master -= lr * weight_decay * master */
    float grad_scale;   /* every gradient is multiplied by this first (averaging, clipping) */
    int64_t step;       /* 1 for the first step; drives the bias correction */
} RealAdamHyper;

/* Device memory as the driver sees it, beside the tracker's counts: what a GPU process holds
 * that no buffer of the backend accounts for (context, libraries, NCCL, pool slack). */
typedef struct {
    uint64_t total_bytes;              /* the device's memory */
    uint64_t used_bytes;               /* in use now by every process: total - free */
    uint64_t context_bytes;            /* in use when the backend was made, before its first
                                        * allocation (CUDA context, cuBLAS, other processes) */
    uint64_t nccl_bytes;               /* taken by the NCCL communicator's set-up; 0 without */
    uint64_t pool_reserved_bytes;      /* the backend's allocation pool holds now */
    uint64_t pool_peak_reserved_bytes; /* the most the pool ever held */
} RealDeviceMemory;

typedef struct RealBackend RealBackend;

/* Conventions shared by every entry:
 *  - pointers are device memory from `alloc`, except token/target arrays, `loss_out` and
 *    the hyper-parameters, which are host memory (read or written before the call returns);
 *  - matrices are dense and row-major; `rows` = tokens (batch * seq_len) for activations;
 *  - arithmetic is fp32; bf16 appears only in storage (parameters, gradients, saved
 *    activations) and is widened on load and rounded to nearest-even on store;
 *  - "+=" outputs accumulate and must be initialised by the caller; "=" outputs are
 *    overwritten entirely;
 *  - results are deterministic: the same inputs give bit-identical outputs;
 *  - a device backend may return before its work is done: results are ready for the next
 *    call, and on the host after `copy` to host memory or `synchronize`.
 * Calls that may need backend workspace return false when it cannot be allocated (the
 * outputs are then unspecified); the others cannot fail on valid arguments. A device
 * backend's failures that no return value can carry (a faulting kernel) are reported by
 * `synchronize`. */
/* The first key query t attends to under attention_window w (0: no window). A macro, so
 * that CUDA kernels use it as the CPU does. */
#define REAL_FIRST_KEY(t, w) ((w) > 0 && (t) >= (w) ? (t) - (w) + 1 : 0)

/* LayerNorm's eps for this backend's model. */
#define REAL_LAYERNORM_EPS(be) ((be)->layernorm_eps > 0 ? (be)->layernorm_eps : 1e-5f)

struct RealBackend {
    const char *name;   /* "cpu", ... */
    RealAlloc *tracker; /* counts every allocation of this backend; owned by it */

    /* What the model tells the kernels, set by real_gpt_create before its first call (zero:
     * the defaults). attention_window: keys each query attends to, itself included (Mistral's
     * sliding_window, as transformers' masking_utils applies it: t - w < u <= t); 0 attends
     * to every earlier key. layernorm_eps: LayerNorm's eps; 0 is GPT-2's 1e-5. */
    int attention_window;
    float layernorm_eps;

    /* Memory. alloc: `bytes` (0 allowed) aligned to 64 bytes, counted under `cat`, NULL
     * when exhausted. free: NULL is ignored. fill: every byte of dst = byte_value.
     * copy: dst = src, the ranges may overlap; either side may also be host memory (that is
     * how parameters are uploaded and results read back: the host side is read or written
     * before copy returns). destroy: releases the backend's own workspace and tracker (free
     * every buffer first; read the tracker before). */
    void *(*alloc)(RealBackend *be, size_t bytes, RealMemCategory cat);
    void (*free)(RealBackend *be, void *ptr);
    void (*fill)(RealBackend *be, void *dst, int byte_value, size_t bytes);
    void (*copy)(RealBackend *be, void *dst, const void *src, size_t bytes);
    void (*destroy)(RealBackend *be);

    /* Precision. dst = widen(src); dst = round(src); x = widen(round(x)) in place (the
     * value a bf16 store would read back); dst = round(widen(dst) + src), the gradient
     * accumulation into bf16 storage; dst = round(widen(dst) + widen(src)), a bf16 sum added
     * in place (torch's bf16 add_); x = round(widen(x) * factor). */
    void (*bf16_to_f32)(RealBackend *be, float *dst, const RealBf16 *src, size_t n_elems);
    void (*f32_to_bf16)(RealBackend *be, RealBf16 *dst, const float *src, size_t n_elems);
    void (*round_bf16)(RealBackend *be, float *x, size_t n_elems);
    void (*accumulate_bf16)(RealBackend *be, RealBf16 *dst, const float *src, size_t n_elems);
    void (*add_bf16)(RealBackend *be, RealBf16 *dst, const RealBf16 *src, size_t n_elems);
    void (*scale_bf16)(RealBackend *be, RealBf16 *x, size_t n_elems, float factor);

    /* c[m,n] = alpha * op(a) op(b) + beta * c, with op(a) [m,k] and op(b) [k,n]; a is
     * stored [m,k] (or [k,m] when trans_a), b [k,n] (or [n,k] when trans_b). a and b may
     * each be fp32 or bf16 (weights, saved activations); the product accumulates in fp32.
     * beta = 0 ignores c's old contents. May need workspace (operands are converted). A
     * tensor-core backend may round fp32 operands to bf16 first, as autocast does (the CUDA
     * backend's default); the CPU backend and the CUDA backend's exact mode do not. */
    bool (*gemm)(RealBackend *be, bool trans_a, bool trans_b, int m, int n, int k,
                 float alpha, RealDType a_dtype, const void *a, RealDType b_dtype,
                 const void *b, float beta, float *c);

    /* y[r,c] += bias[c] over rows x cols; dbias[c] += sum_r dy[r,c]. */
    void (*bias_fwd)(RealBackend *be, float *y, const RealBf16 *bias, int rows, int cols);
    void (*bias_bwd)(RealBackend *be, float *dbias, const float *dy, int rows, int cols);

    /* out = a + b elementwise; out may alias a or b. */
    void (*add)(RealBackend *be, float *out, const float *a, const float *b, size_t n_elems);

    /* x[i*s+t,:] = wte[tokens[i*s+t],:] + wpe[t,:] for batch i, position t < seq_len.
     * Backward: dwte[token,:] += dx[row,:], dwpe[t,:] += dx[row,:]. Tokens must be in
     * [0, vocab) (the caller checks). */
    void (*embedding_fwd)(RealBackend *be, float *x, const int *tokens, const RealBf16 *wte,
                          const RealBf16 *wpe, int batch, int seq_len, int hidden);
    void (*embedding_bwd)(RealBackend *be, float *dwte, float *dwpe, const int *tokens,
                          const float *dx, int batch, int seq_len, int hidden);

    /* Layer norm over each row of cols values, eps layernorm_eps:
     * y = (x - mean) * rstd * gain + bias, with mean[r], rstd[r] = 1/sqrt(var + eps) saved.
     * Backward from those saved statistics: dx += d/dx, dgain += sum_r dy * xhat,
     * dbias += sum_r dy. dx must not alias dy or x. */
    void (*layernorm_fwd)(RealBackend *be, float *y, float *mean, float *rstd, const float *x,
                          const RealBf16 *gain, const RealBf16 *bias, int rows, int cols);
    void (*layernorm_bwd)(RealBackend *be, float *dx, float *dgain, float *dbias,
                          const float *dy, const float *x, const float *mean,
                          const float *rstd, const RealBf16 *gain, int rows, int cols);

    /* Causal multi-head self-attention on qkv [batch*seq_len, 3*heads*head_dim] (per row:
     * all heads' q, then k, then v; head j at columns j*head_dim within each third).
     * Forward: probs[i,j,t,u] = softmax_u<=t(q.k / sqrt(head_dim)) (0 for u > t and, under
     * attention_window w, for u <= t - w), stored
     * [batch, heads, seq_len, seq_len] in probs_dtype, and out [batch*seq_len, heads*
     * head_dim] = probs v computed from the probs as stored (rounded to probs_dtype), so a
     * backward that reads them back is exactly consistent (a backend whose GEMMs round fp32
     * operands to bf16 rounds fp32 probs too, as gemm says). probs may be NULL: nothing is
     * stored and out is the same. Backward: dqkv = d/dqkv given dout and the saved probs.
     * Both may need workspace (two seq_len^2 fp32 tiles). */
    bool (*attention_fwd)(RealBackend *be, float *out, void *probs, RealDType probs_dtype,
                          const float *qkv, int batch, int seq_len, int heads, int head_dim);
    bool (*attention_bwd)(RealBackend *be, float *dqkv, const float *dout, const float *qkv,
                          const void *probs, RealDType probs_dtype, int batch, int seq_len,
                          int heads, int head_dim);

    /* GPT-2's tanh GELU: y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); backward
     * dx = dy * gelu'(x). y may alias x, dx may alias dy. */
    void (*gelu_fwd)(RealBackend *be, float *y, const float *x, size_t n_elems);
    void (*gelu_bwd)(RealBackend *be, float *dx, const float *dy, const float *x,
                     size_t n_elems);

    /* Softmax cross-entropy over `vocab` logits per row, forward and backward at once:
     * *loss_out = mean over rows of -log softmax(logits)[target]; then logits is
     * overwritten with d(dloss_scale * mean loss)/d logits. Targets in [0, vocab). */
    void (*softmax_xent)(RealBackend *be, float *logits, const int *targets, int rows,
                         int vocab, float dloss_scale, float *loss_out);

    /* One AdamW step on a flat partition of n_elems: g = widen(grad) * grad_scale,
     * m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, master -= lr (mhat / (sqrt(vhat) + eps)
     * + weight_decay master) with bias-corrected mhat, vhat; then param = round(master). */
    void (*adam_step)(RealBackend *be, const RealAdamHyper *hyper, size_t n_elems,
                      float *master, float *m, float *v, const RealBf16 *grad,
                      RealBf16 *param);

    /* The Llama-family block (real_gpt_check_backend says which a model needs; a backend
     * that lacks one leaves it NULL and such models are refused on it):
     *
     * x[r,:] = wte[tokens[r],:] for rows tokens (no position table: rotary models);
     * backward dwte[tokens[r],:] += dx[r,:]. */
    void (*token_embedding_fwd)(RealBackend *be, float *x, const int *tokens,
                                const RealBf16 *wte, int rows, int hidden);
    void (*token_embedding_bwd)(RealBackend *be, float *dwte, const int *tokens,
                                const float *dx, int rows, int hidden);

    /* RMSNorm over each row: y = x rstd gain, rstd = 1/sqrt(mean(x^2) + eps). The backward
     * recomputes rstd from x (nothing is saved): dx += rstd (dxhat - xhat mean(dxhat xhat)),
     * dxhat = dy gain, dgain += sum_r dy xhat. dx must not alias dy or x. */
    void (*rmsnorm_fwd)(RealBackend *be, float *y, const float *x, const RealBf16 *gain,
                        int rows, int cols, float eps);
    void (*rmsnorm_bwd)(RealBackend *be, float *dx, float *dgain, const float *dy,
                        const float *x, const RealBf16 *gain, int rows, int cols, float eps);

    /* Rotary embeddings in place on the q and k parts of qkv rows [batch*seq_len, (heads +
     * 2 kv_heads) head_dim] (q heads, then k heads, then v heads): the first rope->rot_dim
     * (even, at most head_dim) dimensions of each head turn, the pair (c, c + r/2) (r =
     * rot_dim, c < r/2) by t real_rope_inv_freq(rope, c) at position t = row mod seq_len
     * (Hugging Face's rotate_half convention; rot_dim < head_dim is GPT-NeoX's partial rotary,
     * rotary_pct); the other dimensions stay. The angle is computed in double, its cosine and
     * sine rounded to float. inverse turns back by the same angle: the backward, applied to
     * dq and dk. rope is host memory. May need workspace (the frequencies, on a device). */
    bool (*rope)(RealBackend *be, float *qkv, int batch, int seq_len, int heads, int kv_heads,
                 int head_dim, const RealRope *rope, bool inverse);

    /* Gated MLP on gate_up [rows, 2 ffn] (gate in the first ffn columns, up in the last):
     * out [rows, ffn] = act(gate) up: SwiGLU with REAL_ACT_SILU (silu(g) = g / (1 + e^-g)),
     * GeGLU with a GELU. Backward: dgate_up = (dout up act'(gate), dout act(gate)),
     * overwritten; dgate_up may alias gate_up. */
    void (*glu_fwd)(RealBackend *be, float *out, const float *gate_up, int rows, int ffn,
                    RealActivation act);
    void (*glu_bwd)(RealBackend *be, float *dgate_up, const float *dout, const float *gate_up,
                    int rows, int ffn, RealActivation act);

    /* The exact GELU, y = x Phi(x) = x/2 (1 + erf(x / sqrt 2)) (GPT-NeoX's "gelu"), as
     * gelu_fwd/bwd: dx = dy (Phi(x) + x phi(x)); y may alias x, dx may alias dy. */
    void (*gelu_erf_fwd)(RealBackend *be, float *y, const float *x, size_t n_elems);
    void (*gelu_erf_bwd)(RealBackend *be, float *dx, const float *dy, const float *x,
                         size_t n_elems);

    /* attention_fwd/bwd with grouped-query attention: qkv rows hold heads query heads, then
     * kv_heads key heads, then kv_heads value heads; query head j reads key/value head
     * j / (heads / kv_heads). kv_heads = heads is attention_fwd/bwd. */
    bool (*attention_gqa_fwd)(RealBackend *be, float *out, void *probs, RealDType probs_dtype,
                              const float *qkv, int batch, int seq_len, int heads,
                              int kv_heads, int head_dim);
    bool (*attention_gqa_bwd)(RealBackend *be, float *dqkv, const float *dout,
                              const float *qkv, const void *probs, RealDType probs_dtype,
                              int batch, int seq_len, int heads, int kv_heads, int head_dim);

    /* Fused (FlashAttention-style) causal attention, qkv laid out as for attention_gqa: it
     * stores no seq_len^2 tensor. Forward: out = softmax(q k^T / sqrt(d)) v computed in key
     * blocks with a running maximum and sum, and lse [batch, heads, seq_len] (fp32) = the
     * log-sum-exp of each row's scaled scores. Backward recomputes the probabilities block by
     * block from q, k and lse: dqkv = d/dqkv (overwritten) given dout and the forward's out
     * (as the caller kept it). Workspace: a few block tiles, never seq_len^2. */
    bool (*flash_attention_fwd)(RealBackend *be, float *out, float *lse, const float *qkv,
                                int batch, int seq_len, int heads, int kv_heads, int head_dim);
    bool (*flash_attention_bwd)(RealBackend *be, float *dqkv, const float *dout,
                                const float *qkv, const float *out, const float *lse,
                                int batch, int seq_len, int heads, int kv_heads, int head_dim);

    /* Optional entries: NULL where the backend runs on the host, whose calls are finished
     * when they return and whose memory the tracker alone describes. */

    /* Waits until every call made so far has finished. Returns false when any device call
     * failed since the backend was made (errors are sticky: a failed device stays failed);
     * *error_text then describes the first failure (the backend's storage, valid until
     * destroy). */
    bool (*synchronize)(RealBackend *be, const char **error_text);

    /* Device timing: mark records a point in the stream of calls made so far and returns
     * its handle (NULL when it cannot, the failure then reported by synchronize).
     * elapsed_s waits until `end` is reached and returns the device time from `begin` to
     * `end` in seconds; it releases both handles (NULL ones give 0). */
    void *(*mark)(RealBackend *be);
    double (*elapsed_s)(RealBackend *be, void *begin, void *end);

    /* Fills *out from the driver now; false when the driver cannot be queried (the failure
     * then reported by synchronize). */
    bool (*device_memory)(RealBackend *be, RealDeviceMemory *out);

    /* Host tiers (ZeRO-Offload). pin_host page-locks `bytes` of host memory at `host` for
     * asynchronous copies (false when the driver refuses, reported by synchronize);
     * unpin_host undoes it before the memory is freed. copy_async: dst = src between host and
     * device on the backend's copy stream, after every call made so far, without the host
     * waiting. copy_wait: later calls wait for every copy_async made so far, and with `host`
     * true the host waits too (before it reads or frees their host side). */
    bool (*pin_host)(RealBackend *be, void *host, size_t bytes);
    void (*unpin_host)(RealBackend *be, void *host);
    void (*copy_async)(RealBackend *be, void *dst, const void *src, size_t bytes);
    void (*copy_wait)(RealBackend *be, bool host);
};

#endif
