/* real_model_common: what zreal's model test programs (test_real_backend, test_real_model,
 * test_real_llama) share: a seeded random stream, double-precision references of every
 * kernel and of the whole model's loss, finite differences, the training fixture, and the
 * gradient checks GPT-2 and the Llama family run alike. */
#ifndef REAL_MODEL_COMMON_H
#define REAL_MODEL_COMMON_H

#include "real_alloc.h"
#include "real_cpu.h"
#include "real_data.h"
#include "real_engine.h"
#include "real_gpt.h"
#include "real_moe.h"
#include "real_opseq.h"
#include "testutil.h"
#include "zp_cost.h"
#include "zp_mem.h"
#include "zp_model.h"

#include <jansson.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    uint64_t state;
} TestRng;

uint64_t rng_next(TestRng *r);

double rng_uniform(TestRng *r);

double rng_normal(TestRng *r);

void fill_normal(TestRng *r, float *x, size_t n, double mean, double std);

double *to_double(const float *x, size_t n);

void ref_layernorm(const double *x, const double *gain, const double *bias, double *y,
                   int rows, int cols, double eps);

void ref_linear(const double *x, const double *w, const double *bias, double *y,
                int rows, int k, int n);

/* Causal attention where query head a reads key/value head a / (heads / kv), query t seeing
 * the keys t - window < u <= t (every u <= t when window is 0); probs [batch, heads, s, s]
 * and lse [batch, heads, s] (the log-sum-exp of each row's scaled scores) when not NULL. */
void ref_attention_gqa(const double *qkv, double *out, double *probs, double *lse,
                       int batch, int s, int heads, int kv, int hd, int window);

/* Causal multi-head attention (as many key/value heads as query heads). */
void ref_attention(const double *qkv, double *out, double *probs, int batch, int s,
                   int heads, int hd);

double ref_gelu(double x);

double ref_xent(const double *logits, const int *targets, int rows, int vocab);

/* The whole GPT-2 forward in double, from the documented layout, to the mean loss. */
double ref_model_loss(const RealGptDims *d, double *const *units, const int *tokens,
                      const int *targets);

void ref_rmsnorm(const double *x, const double *gain, double *y, int rows, int cols,
                 double eps);

/* Radians per position of pair c of `rot` rotated dimensions, written from transformers'
 * rotary initialisers: theta^(-2c/rot); "linear" divides it by the factor; "llama3"
 * (_compute_llama3_parameters) divides it where the wavelength 2 pi / inv exceeds
 * original / low_freq_factor, keeps it below original / high_freq_factor and blends the two
 * in between with weight (original / wavelength - low) / (high - low) on the kept one. */
double ref_inv_freq(const RealGptDims *d, int rot, int c);

/* Rotates the pair (c, c + rot/2) of every q and k head of row r by t ref_inv_freq(c) for
 * c < rot/2; a head's dimensions from rot on stay. */
void ref_rope(const RealGptDims *d, double *qkv, int rows, int heads, int kv, int hd,
              int rot);

double ref_act(double x, RealActivation act);

/* Tensor `name` of `unit` in the double copy of the parameters; NULL when the model lacks it.
 * By name: the names are the planner's contract (zp_model_tensors). */
const double *ref_tensor(const RealGptDims *d, double *const *units, int unit,
                         const char *name);

void ref_norm(const RealGptDims *d, double *const *units, int unit, const char *gain,
              const char *bias, const double *x, double *y, int rows);

/* out [T,h] = MLP(ln) of block unit u: gated act(ln Wg) (ln Wu) or plain act(ln W1), then W2. */
void ref_mlp(const RealGptDims *d, double *const *units, int u, const double *ln,
             double *out);

/* The whole forward in double, from the documented layout, to the mean loss. */
double ref_general_loss(const RealGptDims *d, double *const *units, const int *tokens,
                        const int *targets);

/* Central difference of f along direction dir (n elements of x), restoring x. */
typedef double (*ScalarFn)(const double *x, void *ctx);

double central_diff(ScalarFn fn, double *x, const double *dir, size_t n, double eps,
                    void *ctx);

double max_abs_diff_fd(const float *a, const double *b, size_t n);

#define MAX_UNITS 8

typedef struct {
    RealBackend *be;
    RealGpt *gpt;
    RealGptDims dims;
    int n_units;
    size_t elems[MAX_UNITS];
    RealBf16 *params[MAX_UNITS], *grads[MAX_UNITS];
    float *master[MAX_UNITS], *adam_m[MAX_UNITS], *adam_v[MAX_UNITS];
} Fixture;

void fx_init(Fixture *fx, const RealGptDims *dims, uint64_t seed);

void fx_free(Fixture *fx);

void fx_zero_grads(Fixture *fx);

/* One micro-batch forward and backward, accumulating into fx->grads; returns the loss.
 * checkpoint: blocks keep nothing in forward, their inputs are checkpointed and each block
 * is recomputed right before its backward. in_place: one dx buffer serves as both dx_out
 * and dx_in of every block backward. */
float fx_micro_batch(Fixture *fx, const int *tokens, const int *targets,
                     gboolean checkpoint, gboolean in_place);

void make_batch(const RealGptDims *d, uint64_t seed, uint64_t first, int **tokens,
                int **targets);

/* Replaces GPT-2's init (zero biases, unit gains) by random values of every kind, so a
 * gradient check exercises every term (a mixed-up gain and bias would pass at 1 and 0). */
void fx_randomize(Fixture *fx, TestRng *rng);

typedef struct {
    const RealGptDims *dims;
    double **units;
    int unit;
    const int *tokens, *targets;
} ModelCtx;

double model_objective(const double *unit_values, void *ctx);

/* The models the gradient check runs: GPT-2; a Llama block (grouped-query attention with 4
 * query and 2 key/value heads, SwiGLU, RMSNorm, rotary embeddings, untied head, no biases)
 * with the eager and the fused attention; Qwen2's (q, k and v biases only, tied head); a
 * GPT-NeoX block (LayerNorm, parallel residual, half the head rotated, exact GELU, every
 * bias, untied head) eager and fused; and a GeGLU block with the exact GELU. Qwen2's and
 * GeGLU's rotary embeddings are rescaled (linear, llama3). The eager Llama block attends
 * through a sliding window of 5 of its 8 positions (Mistral's) and the fused NeoX block
 * through one of 3, with a LayerNorm eps of 1e-3 (not GPT-2's 1e-5). The mixture of experts
 * is the eager Llama block whose MLPs are sparse: 4 SwiGLU experts of 8, top 2, capacity 8
 * copies an expert (some of the 32 dropped). */
enum { GRAD_GPT2, GRAD_LLAMA, GRAD_LLAMA_FLASH, GRAD_QWEN2, GRAD_NEOX, GRAD_NEOX_FLASH,
       GRAD_GEGLU, GRAD_MOE };

RealGptDims gradient_dims(int which);

void test_model_gradients(gconstpointer data);

/* Whether two fixtures' gradients hold the same values, bf16 for bf16 (a stored -0 equals
 * an accumulated +0). */
void assert_same_grads(const Fixture *a, const Fixture *b);

/* Gradients declared fresh (real_gpt_grads_fresh) over dirty buffers give, with no zeroing,
 * the values that zeroed buffers accumulate: the first write of each tensor stores it (the
 * tied wte's too, which the head writes first and the embedding's backward adds to), later
 * micro-batches add, and a step declared fresh again starts over. GPT-2 (tied) and Llama
 * (untied head). */
void test_fresh_gradients(gconstpointer data);

#endif
