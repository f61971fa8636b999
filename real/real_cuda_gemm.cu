/* real_cuda_gemm: the CUDA backend's GEMMs through cuBLAS, operands converted (bf16 or fp32
 * mode) and padded to aligned leading dimensions in workspace, strided batches for attention. */
#include "real_cuda_internal.cuh"

/* ---- GEMMs ---- */

/* The element type GEMM operands must have in this mode, and its size. */
RealDType real_cuda_gemm_dtype(const RealCuda *cu)
{
    return cu->mode == REAL_CUDA_GEMM_BF16 ? REAL_DTYPE_BF16 : REAL_DTYPE_F32;
}

size_t real_cuda_dtype_bytes(RealDType dtype)
{
    return dtype == REAL_DTYPE_BF16 ? sizeof(RealBf16) : sizeof(float);
}

/* An operand of n elements in the GEMM dtype: itself when it already is, else converted
 * into `scratch` (which the caller sized for n elements of the GEMM dtype). */
const void *real_cuda_as_gemm_dtype(RealCuda *cu, RealDType dtype, const void *data,
                                    size_t n, void *scratch)
{
    if (dtype == real_cuda_gemm_dtype(cu))
        return data;
    if (dtype == REAL_DTYPE_F32)
        real_cuda_f32_to_bf16(&cu->base, (RealBf16 *)scratch, (const float *)data, n);
    else
        real_cuda_bf16_to_f32(&cu->base, (float *)scratch, (const RealBf16 *)data, n);
    return scratch;
}

/* Row-major, strided-batched: for each of `batch` problems, c[m,n] (row stride ldc) =
 * alpha op(a) op(b) + beta c, a and b in the GEMM dtype with row strides lda, ldb; stride_*
 * is the element distance between problems. cuBLAS is column-major, and a row-major matrix
 * is its transpose there, so the row-major C = op(A) op(B) is computed as the column-major
 * C^T = op(B)^T op(A)^T: the operands swap places and keep their transpose flags. */
bool real_cuda_gemm_strided(RealCuda *cu, bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const void *a, int lda, long long stride_a,
                            const void *b, int ldb, long long stride_b, float beta,
                            float *c, int ldc, long long stride_c, int batch)
{
    const bool bf16 = cu->mode == REAL_CUDA_GEMM_BF16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    /* Pedantic: no TF32, no reduced-precision shortcuts, whatever NVIDIA_TF32_OVERRIDE says. */
    const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t status;
    if (batch == 1)
        status = cublasGemmEx(cu->blas, op_b, op_a, n, m, k, &alpha, b, type, ldb, a, type, lda,
                              &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT);
    else
        status = cublasGemmStridedBatchedEx(cu->blas, op_b, op_a, n, m, k, &alpha, b, type, ldb,
                                            stride_b, a, type, lda, stride_a, &beta, c,
                                            CUDA_R_32F, ldc, stride_c, batch, compute,
                                            CUBLAS_GEMM_DEFAULT);
    return real_cuda_check_blas(cu, status, batch == 1 ? "cublasGemmEx"
                                                       : "cublasGemmStridedBatchedEx");
}

__global__ void real_cuda_k_scale_f32(float *c, size_t n, float beta)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

/* cuBLAS picks its fast kernels (on Hopper, tensor-core kernels fed by the TMA) only when
 * every matrix's row stride is a multiple of 16 bytes and the output's extents m and n are
 * multiples of 8; otherwise it falls back to "align1" kernels. Measured on an H100 (Nsight
 * Compute): GPT-2's tied LM head, vocabulary 50257, ran its three GEMMs in 15.5 ms of a
 * 66 ms step through align1 kernels, and still did with only the strides padded. So m, n
 * and k are rounded up to multiples of 8, like the vocabulary padding of nanoGPT and
 * Megatron but invisible to the caller: an operand that must grow, change dtype or stride
 * is staged in scratch, and the output is computed into padded scratch and copied out, a
 * band of rows at a time (so that the padding costs at most REAL_CUDA_PAD_C_BYTES). Each
 * output element reads only its own row of op(A) and column of op(B), so the rows and
 * columns added (left as the scratch holds them) reach only outputs that are dropped. */
#define REAL_CUDA_LD_ALIGN_BYTES 16
#define REAL_CUDA_EXTENT_ALIGN 8
#define REAL_CUDA_PAD_C_BYTES ((size_t)128 << 20)

static int real_cuda_round_up(int value, int multiple)
{
    return (int)(((size_t)value + multiple - 1) / multiple * multiple);
}

/* The smallest row stride >= cols elements of elem_bytes that is a multiple of 16 bytes. */
static int real_cuda_padded_ld(int cols, size_t elem_bytes)
{
    return real_cuda_round_up(cols, (int)(REAL_CUDA_LD_ALIGN_BYTES / elem_bytes));
}

/* dst[r, c] (row stride ld_dst, the GEMM dtype) = src[r, c] (row stride cols, src_dtype),
 * for c < cols; the padding columns are left as they are (no GEMM reads them). */
template <typename Dst, typename Src>
__global__ void real_cuda_k_convert_2d(Dst *dst, int ld_dst, const Src *src, int rows, int cols)
{
    for (int r = blockIdx.y; r < rows; r += gridDim.y)
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
            real_cuda_store(dst + (size_t)r * ld_dst + c, real_cuda_load(src + (size_t)r * cols + c));
}

static void real_cuda_convert_2d(RealCuda *cu, void *dst, int ld_dst, RealDType src_dtype,
                                 const void *src, int rows, int cols)
{
    const dim3 grid((unsigned)MIN((cols + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS, 64),
                    (unsigned)MIN(rows, 65535));
    if (src_dtype == REAL_DTYPE_F32)
        real_cuda_k_convert_2d<<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
            (RealBf16 *)dst, ld_dst, (const float *)src, rows, cols);
    else
        real_cuda_k_convert_2d<<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
            (float *)dst, ld_dst, (const RealBf16 *)src, rows, cols);
    real_cuda_launched(cu, "gemm operand conversion");
}

/* A GEMM operand stored rows x cols (row-major, row stride cols) in `dtype`, as cuBLAS will
 * read it: in the GEMM dtype, rows_ext x cols_ext (>= rows x cols), row stride *ld a
 * multiple of 16 bytes; with zero_pad, what lies outside rows x cols is +0 (padding along
 * k, which every output sums over). *out is the operand itself when it already is, else
 * *tmp, scratch the caller frees. False when scratch cannot be had. */
static bool real_cuda_gemm_operand(RealCuda *cu, RealDType dtype, const void *data, int rows,
                                   int cols, int rows_ext, int cols_ext, bool zero_pad,
                                   const void **out, int *ld, void **tmp)
{
    const RealDType want = real_cuda_gemm_dtype(cu);
    const size_t want_bytes = real_cuda_dtype_bytes(want);
    *ld = real_cuda_padded_ld(cols_ext, want_bytes);
    *tmp = NULL;
    *out = data;
    if (dtype == want && *ld == cols && rows_ext == rows &&
        real_cuda_aligned(data, REAL_CUDA_LD_ALIGN_BYTES))
        return true;
    const size_t tmp_bytes = (size_t)rows_ext * *ld * want_bytes;
    *tmp = real_cuda_scratch(cu, tmp_bytes);
    if (!*tmp)
        return false;
    *out = *tmp;
    if (zero_pad && (rows_ext != rows || cols_ext != cols))
        real_cuda_check(cu, cudaMemsetAsync(*tmp, 0, tmp_bytes, cu->stream), "cudaMemsetAsync");
    if (*ld == cols && dtype == want) /* staged only to add rows, or to align the pointer */
        real_cuda_check(cu, cudaMemcpyAsync(*tmp, data, (size_t)rows * cols * want_bytes,
                                            cudaMemcpyDeviceToDevice, cu->stream),
                        "cudaMemcpyAsync");
    else if (*ld == cols)
        real_cuda_as_gemm_dtype(cu, dtype, data, (size_t)rows * cols, *tmp);
    else if (dtype == want)
        real_cuda_check(cu, cudaMemcpy2DAsync(*tmp, (size_t)*ld * want_bytes, data,
                                              (size_t)cols * want_bytes,
                                              (size_t)cols * want_bytes, (size_t)rows,
                                              cudaMemcpyDeviceToDevice, cu->stream),
                        "cudaMemcpy2DAsync");
    else
        real_cuda_convert_2d(cu, *tmp, *ld, dtype, data, rows, cols);
    return true;
}

/* Copies an fp32 matrix of rows x cols between row strides (elements). */
static bool real_cuda_copy_2d(RealCuda *cu, float *dst, int ld_dst, const float *src, int ld_src,
                              int rows, int cols)
{
    return real_cuda_check(cu, cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src,
                                                 (size_t)ld_src * sizeof(float),
                                                 (size_t)cols * sizeof(float), (size_t)rows,
                                                 cudaMemcpyDeviceToDevice, cu->stream),
                           "cudaMemcpy2DAsync");
}

static bool real_cuda_gemm(RealBackend *be, bool trans_a, bool trans_b, int m, int n, int k,
                           float alpha, RealDType a_dtype, const void *a, RealDType b_dtype,
                           const void *b, float beta, float *c)
{
    RealCuda *cu = real_cuda_of(be);
    if (m <= 0 || n <= 0)
        return !cu->failed;
    if (k <= 0) { /* the product is empty (and cuBLAS rejects leading dimensions of 0) */
        const size_t elems = (size_t)m * n;
        real_cuda_k_scale_f32<<<real_cuda_blocks(elems), REAL_CUDA_THREADS, 0, cu->stream>>>(
            c, elems, beta);
        return real_cuda_launched(cu, "gemm (k = 0)") && !cu->failed;
    }
    const int mp = real_cuda_round_up(m, REAL_CUDA_EXTENT_ALIGN);
    const int np = real_cuda_round_up(n, REAL_CUDA_EXTENT_ALIGN);
    const int kp = real_cuda_round_up(k, REAL_CUDA_EXTENT_ALIGN);
    const void *ag = NULL, *bg = NULL;
    int lda = 0, ldb = 0;
    void *scratch[3] = {NULL, NULL, NULL};
    /* op(A) is m x k: A stored [m,k], or [k,m] when transposed; op(B) is k x n likewise. k
     * grows with zeros in both operands, so the sums gain only exact zeros. */
    bool ok = real_cuda_gemm_operand(cu, a_dtype, a, trans_a ? k : m, trans_a ? m : k,
                                     trans_a ? kp : mp, trans_a ? mp : kp, kp != k, &ag, &lda,
                                     &scratch[0]) &&
              real_cuda_gemm_operand(cu, b_dtype, b, trans_b ? n : k, trans_b ? k : n,
                                     trans_b ? np : kp, trans_b ? kp : np, kp != k, &bg, &ldb,
                                     &scratch[1]);
    const bool direct = mp == m && np == n && real_cuda_aligned(c, REAL_CUDA_LD_ALIGN_BYTES);
    if (ok && direct)
        ok = real_cuda_gemm_strided(cu, trans_a, trans_b, m, n, kp, alpha, ag, lda, 0, bg, ldb,
                                    0, beta, c, n, 0, 1);
    /* Otherwise bands of rows of the padded output; rows of C are rows of op(A): rows of A,
     * or columns when A is transposed. */
    const int band = real_cuda_round_up(
        (int)MAX((size_t)1, REAL_CUDA_PAD_C_BYTES / ((size_t)np * sizeof(float))),
        REAL_CUDA_EXTENT_ALIGN);
    if (ok && !direct)
        ok = (scratch[2] = real_cuda_scratch(cu, (size_t)MIN(band, mp) * np * sizeof(float))) !=
             NULL;
    const size_t a_bytes = real_cuda_dtype_bytes(real_cuda_gemm_dtype(cu));
    for (int r0 = 0; ok && !direct && r0 < mp; r0 += band) {
        const int rows = MIN(band, mp - r0), kept = MIN(rows, m - r0);
        const char *a_band = (const char *)ag + (trans_a ? (size_t)r0 : (size_t)r0 * lda) * a_bytes;
        float *cg = (float *)scratch[2];
        ok = (beta == 0.0f || real_cuda_copy_2d(cu, cg, np, c + (size_t)r0 * n, n, kept, n)) &&
             real_cuda_gemm_strided(cu, trans_a, trans_b, rows, np, kp, alpha, a_band, lda, 0, bg,
                                    ldb, 0, beta, cg, np, 0, 1) &&
             real_cuda_copy_2d(cu, c + (size_t)r0 * n, n, cg, np, kept, n);
    }
    real_cuda_free_all(cu, scratch, G_N_ELEMENTS(scratch));
    return ok && !cu->failed;
}

/* Its entries of the backend's table. */
void real_cuda_install_gemm(RealBackend *be)
{
    be->gemm = real_cuda_gemm;
}
