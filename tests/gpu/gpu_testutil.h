/* gpu_testutil: what the CUDA backend's test programs share: the CPU backend and a CUDA
 * backend in each GEMM mode, random host data, device round trips, comparisons, and the
 * tolerances every comparison uses (with why). Linked into every tests/gpu/test_* program. */
#ifndef GPU_TESTUTIL_H
#define GPU_TESTUTIL_H

#include "real_cpu.h"
#include "real_cuda.h"
#include "real_gpt.h"

#include <float.h>
#include <glib.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* Tolerances, and why. Where the CUDA kernel performs the CPU's operations in the CPU's order
 * (conversions, bias, add, embedding, Adam: --fmad=false keeps a * b + c rounded twice, as the
 * CPU's C does), the results must be bit-identical. Elsewhere they differ by
 *  - the order of a sum: both orders are within (n-1) eps sum|x| of the exact sum (the
 *    worst case; about sqrt(n) eps sum|x| in practice), eps = FLT_EPSILON = 2^-23;
 *  - libm: CUDA's expf and tanhf are within 2 ulps, glibc's within 1: 3 ulps apart, 4e-7;
 *  - in bf16 GEMM mode, fp32 operands rounded to bf16 (relative 2^-9 each, so 2^-8 for a
 *    product), which the CPU does not do. */
#define EPS ((double)FLT_EPSILON)
/* A reduction over a column of n values: the worst case is (n-1) eps sum|x|, but rounding
 * errors of random data add up like a random walk, to about sqrt(n) eps sum|x| even when the
 * partial sums grow steadily; 4 sqrt(n) eps sum|x| leaves 4x margin. A dropped or doubled row
 * changes the sum by about sum|x| / n, more than that for every n < 16,000 (n^1.5 < 1 /
 * (4 eps)); the sums tested have n <= 4,100. */
#define COLUMN_TOL(n) (4.0 * sqrt((double)(n)) * EPS)
/* GEMM, element (i,j): |cuda - cpu| <= tol |alpha| sum_k |a_ik b_kj| + 4 eps |beta c_ij|, with
 * tol = 2 k eps for the worst-case fp32 summation of both sides (tensor cores truncate where
 * IEEE rounds: at most 1 ulp per add instead of 1/2) plus 2^-7 in bf16 mode (operand
 * rounding, 2^-8, with a factor 2 of margin). */
#define GEMM_ROUNDING_TOL (1.0 / 128)
/* Elementwise libm-based results (GELU): 3 ulps of libm difference plus the same again from
 * the few roundings around it: 16 eps relative, and absolute 16 eps near zero. */
#define LIBM_TOL (16.0 * EPS)
/* Attention, relative to the largest magnitude of the output part compared: exact mode with
 * fp32 probabilities differs by summation order in GEMMs of k = head_dim or s and in the
 * softmax sums, about (head_dim + s) eps = 2e-5 here: 1e-4. With bf16 probabilities a value
 * within that distance of a rounding boundary may round the other way (one bf16 ulp, 2^-8
 * relative, of a probability that then multiplies v): 2^-7 of max|v|. bf16 GEMM mode rounds
 * probabilities and dout, dS to bf16 for the products (2^-9 each, summed with weights that
 * add up to about 1): forward 2^-6, backward 2^-5 of the largest magnitude. A wrong head,
 * offset or transpose is off by the order of the largest magnitude itself. */
#define ATTN_EXACT_TOL 1e-4
#define ATTN_BF16_PROBS_TOL (1.0 / 128)
#define ATTN_BF16_FWD_TOL (1.0 / 64)
#define ATTN_BF16_BWD_TOL (1.0 / 32)
/* Cross-entropy: the loss differs by libm (expf) and double summation order: 1e-6
 * relative; each gradient element is exp(l - max) / sum * grad_scale, 3 ulps of expf plus
 * the sum's relative difference: 4e-6 of grad_scale, absolute. */
#define XENT_LOSS_TOL 1e-6
#define XENT_GRAD_TOL 4e-6
/* Layer norm forward: statistics in double as on the CPU, so y differs only when a double
 * sum in another order rounds to another float: 1e-6 relative to max(1, |y|). */
#define LN_FWD_TOL 1e-6
/* Layer-norm dx: fp32 row sums over cols (tree vs sequential), each feeding every element of
 * the row: 4 sqrt(cols) eps relative to the row's largest |dx| term, cols <= 1601 here. */
#define LN_DX_TOL(cols) (4.0 * sqrt((double)(cols)) * EPS)
/* Whole model micro-step (2 layers), relative to the norm of each parameter unit's
 * gradient: both backends store activations and gradients in bf16, so an ulp-level
 * difference in fp32 (summation order, libm) occasionally rounds a stored value the other
 * way (2^-9 relative); the CPU model test measures 1% against a double reference for all of
 * bf16 rounding, so a few such flips stay well under 1% (exact mode). bf16 GEMM mode also
 * rounds the gradient operands of every backward GEMM (2^-9 relative each, on two layers,
 * accumulating like the storage rounding itself): 3%. The loss: forward GEMM inputs are bf16
 * values in both modes, so only flips count: 5e-4 relative. */
#define MODEL_GRAD_TOL_EXACT 1e-2
#define MODEL_GRAD_TOL_BF16 3e-2
#define MODEL_LOSS_TOL 5e-4

#define MIB (1024.0 * 1024.0)

extern RealBackend *cpu;
extern RealBackend *gpu[2]; /* indexed by RealCudaGemmMode */
extern const char *const mode_name[2];
extern GRand *rng;

/* Makes the backends (one CUDA backend per GEMM mode on device 0) and the random stream,
 * after g_test_init; FALSE, with a line naming `program`, where there is no device. */
gboolean gpu_testutil_init(const char *program);
/* Runs the tests, then destroys what gpu_testutil_init made; g_test_run's status. */
int gpu_testutil_run(void);

double normal(void);
float *random_f32(size_t n, double mean, double std);
float *random_bf16_values(size_t n, double std);
RealBf16 *random_bf16(size_t n, double mean, double std);
void *copy_of(const void *src, size_t bytes);
void device_ok(RealBackend *be);
void *upload(RealBackend *be, const void *host, size_t bytes);
void *download(RealBackend *be, const void *dev, size_t bytes);
void assert_same_bits(const void *got, const void *want, size_t bytes, const char *what);
void assert_within(const float *got, const float *want, const double *bound, size_t n,
                   const char *what);
void assert_close(const float *got, const float *want, size_t n, double abs_tol,
                  double rel_tol, const char *what);
void assert_close_to_max(const float *got, const float *want, size_t rows, size_t width,
                         size_t stride, double tol, const char *what);

#endif
