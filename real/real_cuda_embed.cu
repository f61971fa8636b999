/* real_cuda_embed: the CUDA backend's kernels at the model's ends and positions: token and
 * position embeddings and their backward, rotary positions, the softmax cross-entropy loss. */
#include "real_cuda_internal.cuh"

/* ---- embedding ---- */

__global__ void real_cuda_k_embedding_fwd(float *x, const int *tokens, const RealBf16 *wte,
                                          const RealBf16 *wpe, size_t n, int seq_len, int hidden)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)hidden;
        const int c = (int)(i % (size_t)hidden), t = (int)(row % (size_t)seq_len);
        x[i] = real_cuda_widen(wte[(size_t)tokens[row] * hidden + c]) +
               real_cuda_widen(wpe[(size_t)t * hidden + c]);
    }
}

static void real_cuda_embedding_fwd(RealBackend *be, float *x, const int *tokens,
                                    const RealBf16 *wte, const RealBf16 *wpe, int batch,
                                    int seq_len, int hidden)
{
    RealCuda *cu = real_cuda_of(be);
    const size_t rows = (size_t)batch * seq_len, n = rows * hidden;
    if (n == 0)
        return;
    const int *dev_tokens = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_TOKENS, tokens, rows);
    if (!dev_tokens)
        return;
    real_cuda_k_embedding_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        x, dev_tokens, wte, wpe, n, seq_len, hidden);
    real_cuda_launched(cu, "embedding_fwd");
}

/* dwpe[t,c] += dx[i s + t, c] for i = 0, 1, ...: the CPU's order, so the same bits. */
__global__ void real_cuda_k_embedding_bwd_pos(float *dwpe, const float *dx, int batch,
                                              int seq_len, int hidden)
{
    const size_t n = (size_t)seq_len * hidden;
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        float sum = dwpe[i];
        for (int b = 0; b < batch; b++)
            sum += dx[(size_t)b * n + i];
        dwpe[i] = sum;
    }
}

/* dwte[token,:] += dx[row,:] over the rows holding each token, in row order: block
 * (segment j, column tile) owns one distinct token's row of dwte, so no two threads add to
 * the same element and the order is the CPU's. index = [rows by token, then row; segment
 * starts (n_segments + 1); segment tokens (n_segments)]. */
__global__ void real_cuda_k_embedding_bwd_tok(float *dwte, const float *dx, const int *index,
                                              int rows, int n_segments, int hidden)
{
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int segment = blockIdx.x;
    if (c >= hidden)
        return;
    const int *order = index, *start = index + rows, *token = start + n_segments + 1;
    float *out = dwte + (size_t)token[segment] * hidden + c;
    float sum = *out;
    for (int j = start[segment]; j < start[segment + 1]; j++)
        sum += dx[(size_t)order[j] * hidden + c];
    *out = sum;
}

static int real_cuda_compare_pairs(const void *pa, const void *pb)
{
    const int *a = (const int *)pa, *b = (const int *)pb;
    if (a[0] != b[0])
        return (a[0] > b[0]) - (a[0] < b[0]);
    return (a[1] > b[1]) - (a[1] < b[1]);
}

/* dwte[tokens[r],:] += dx[r,:] for rows r < rows (rows, hidden > 0). */
static void real_cuda_embedding_bwd_tokens(RealCuda *cu, float *dwte, const int *tokens,
                                           const float *dx, int rows, int hidden)
{
    /* The token index is built on the host, where the tokens are: (token, row) pairs sorted,
     * then cut into one segment per distinct token. */
    int *pairs = g_new(int, 2 * (size_t)rows);
    for (int r = 0; r < rows; r++)
        pairs[2 * r] = tokens[r], pairs[2 * r + 1] = r;
    qsort(pairs, (size_t)rows, 2 * sizeof(int), real_cuda_compare_pairs);
    int *index = g_new(int, 3 * (size_t)rows + 1);
    int *start = index + rows, n_segments = 0;
    for (int r = 0; r < rows; r++) {
        index[r] = pairs[2 * r + 1];
        if (r == 0 || pairs[2 * r] != pairs[2 * r - 2])
            start[n_segments++] = r;
    }
    start[n_segments] = rows;
    int *segment_token = start + n_segments + 1;
    for (int j = 0; j < n_segments; j++)
        segment_token[j] = pairs[2 * start[j]];
    const int *dev_index = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_INDEX, index,
                                                 (size_t)rows + 2 * (size_t)n_segments + 1);
    g_free(pairs);
    g_free(index);
    if (!dev_index)
        return;
    const dim3 grid((unsigned)n_segments,
                    (unsigned)((hidden + REAL_CUDA_THREADS - 1) / REAL_CUDA_THREADS));
    real_cuda_k_embedding_bwd_tok<<<grid, REAL_CUDA_THREADS, 0, cu->stream>>>(
        dwte, dx, dev_index, rows, n_segments, hidden);
    real_cuda_launched(cu, "embedding_bwd (tokens)");
}

static void real_cuda_embedding_bwd(RealBackend *be, float *dwte, float *dwpe, const int *tokens,
                                    const float *dx, int batch, int seq_len, int hidden)
{
    RealCuda *cu = real_cuda_of(be);
    const int rows = batch * seq_len;
    if (rows <= 0 || hidden <= 0)
        return;
    const size_t pos_elems = (size_t)seq_len * hidden;
    real_cuda_k_embedding_bwd_pos<<<real_cuda_blocks(pos_elems), REAL_CUDA_THREADS, 0,
                                    cu->stream>>>(dwpe, dx, batch, seq_len, hidden);
    real_cuda_launched(cu, "embedding_bwd (positions)");
    real_cuda_embedding_bwd_tokens(cu, dwte, tokens, dx, rows, hidden);
}

/* ---- the Llama family: token embedding, RMSNorm, rotary, gated MLP, exact GELU ---- */

__global__ void real_cuda_k_token_embedding_fwd(float *x, const int *tokens, const RealBf16 *wte,
                                                size_t n, int hidden)
{
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)hidden;
        x[i] = real_cuda_widen(wte[(size_t)tokens[row] * hidden + i % (size_t)hidden]);
    }
}

static void real_cuda_token_embedding_fwd(RealBackend *be, float *x, const int *tokens,
                                          const RealBf16 *wte, int rows, int hidden)
{
    RealCuda *cu = real_cuda_of(be);
    const size_t n = (size_t)MAX(rows, 0) * (size_t)MAX(hidden, 0);
    if (n == 0)
        return;
    const int *dev_tokens = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_TOKENS, tokens,
                                                  (size_t)rows);
    if (!dev_tokens)
        return;
    real_cuda_k_token_embedding_fwd<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        x, dev_tokens, wte, n, hidden);
    real_cuda_launched(cu, "token_embedding_fwd");
}

static void real_cuda_token_embedding_bwd(RealBackend *be, float *dwte, const int *tokens,
                                          const float *dx, int rows, int hidden)
{
    if (rows > 0 && hidden > 0)
        real_cuda_embedding_bwd_tokens(real_cuda_of(be), dwte, tokens, dx, rows, hidden);
}

/* The frequencies of up to REAL_CUDA_ROPE_MAX_PAIRS pairs (head dimensions up to 512; every
 * published model's are 256 at most), passed by value as a kernel parameter: no copy, no
 * synchronisation. */
#define REAL_CUDA_ROPE_MAX_PAIRS 256

struct RealCudaRopeFreqs {
    double inv_freq[REAL_CUDA_ROPE_MAX_PAIRS];
};

/* A thread per (row, q or k head, pair c < rot_dim/2): the CPU's angle t inv_freq[c] in double
 * (the same table, real_rope_inv_freq), its cosine and sine rounded to float, then the same
 * float rotation. */
__global__ void real_cuda_k_rope(float *qkv, size_t n, int seq_len, int heads_qk, int ld,
                                 int head_dim, int rot_dim, RealCudaRopeFreqs freqs, bool inverse)
{
    const int half = rot_dim / 2;
    REAL_CUDA_GRID_STRIDE(i, n)
    {
        const int c = (int)(i % (size_t)half);
        const int j = (int)(i / (size_t)half % (size_t)heads_qk);
        const size_t r = i / ((size_t)half * heads_qk);
        const int t = (int)(r % (size_t)seq_len);
        const double angle = t * freqs.inv_freq[c];
        const float cs = (float)cos(angle), sn = (float)(inverse ? -sin(angle) : sin(angle));
        float *x = qkv + r * ld + (size_t)j * head_dim;
        const float a = x[c], b = x[c + half];
        x[c] = a * cs - b * sn;
        x[c + half] = b * cs + a * sn;
    }
}

static bool real_cuda_rope(RealBackend *be, float *qkv, int batch, int seq_len, int heads,
                           int kv_heads, int head_dim, const RealRope *rope, bool inverse)
{
    RealCuda *cu = real_cuda_of(be);
    const int half = rope->rot_dim / 2;
    if (batch <= 0 || seq_len <= 0 || half < 1)
        return !cu->failed;
    if (half > REAL_CUDA_ROPE_MAX_PAIRS) {
        real_cuda_fail(cu, "rope: %d rotated dimensions, more than the %d this backend turns",
                       rope->rot_dim, 2 * REAL_CUDA_ROPE_MAX_PAIRS);
        return false;
    }
    RealCudaRopeFreqs freqs;
    for (int c = 0; c < half; c++)
        freqs.inv_freq[c] = real_rope_inv_freq(rope, c);
    const size_t n = (size_t)batch * seq_len * (size_t)(heads + kv_heads) * (size_t)half;
    real_cuda_k_rope<<<real_cuda_blocks(n), REAL_CUDA_THREADS, 0, cu->stream>>>(
        qkv, n, seq_len, heads + kv_heads, (heads + 2 * kv_heads) * head_dim, head_dim,
        rope->rot_dim, freqs, inverse);
    return real_cuda_launched(cu, "rope") && !cu->failed;
}

/* ---- loss ---- */

/* One block per row, two passes over the logits (they are the largest tensor of a step:
 * GPT-2's 50257-wide rows). Pass 1: each thread keeps the running maximum of its entries and
 * the sum of exp(x - max) in double, rescaled when its maximum grows; the block combines
 * them at the row's maximum in a fixed tree. Pass 2 writes the gradient exp(x - max) / sum
 * (times grad_scale) as the CPU does, then the target's -grad_scale. Only the sum's rounding
 * differs from the CPU's three passes. row_loss[r] = log(sum) + max - logit[target]. */
__global__ void real_cuda_k_softmax_xent(float *logits, const int *targets, int vocab,
                                         float grad_scale, double *row_loss)
{
    __shared__ float shared_f[32];
    __shared__ double shared_d[32];
    const size_t r = blockIdx.x;
    float *row = logits + r * vocab;
    const int target = targets[r];
    const float target_logit = row[target]; /* read by all before any write (the max syncs) */
    float local_max = -INFINITY;
    double local_sum = 0.0;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        const float x = row[c];
        if (x > local_max) {
            local_sum *= exp((double)local_max - (double)x);
            local_max = x;
        }
        local_sum += expf(x - local_max);
    }
    const float max = real_cuda_block_max(local_max, shared_f);
    const double sum = real_cuda_block_sum(
        local_max == -INFINITY ? 0.0 : local_sum * exp((double)local_max - (double)max), shared_d);
    const float scale = (float)(1.0 / sum) * grad_scale;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x)
        row[c] = expf(row[c] - max) * scale;
    __syncthreads(); /* the target's entry may be another thread's */
    if (threadIdx.x == 0) {
        row[target] -= grad_scale;
        row_loss[r] = log(sum) + max - target_logit;
    }
}

/* *total = sum of n doubles, one block in a fixed order. */
__global__ void real_cuda_k_sum_doubles(double *total, const double *values, int n)
{
    __shared__ double shared[32];
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        sum += values[i];
    sum = real_cuda_block_sum(sum, shared);
    if (threadIdx.x == 0)
        *total = sum;
}

static void real_cuda_softmax_xent(RealBackend *be, float *logits, const int *targets, int rows,
                                   int vocab, float dloss_scale, float *loss_out)
{
    RealCuda *cu = real_cuda_of(be);
    *loss_out = NAN; /* what a failure leaves; synchronize reports it */
    if (rows <= 0 || vocab <= 0)
        return;
    const int *dev_targets = real_cuda_upload_ints(cu, REAL_CUDA_STAGE_TOKENS, targets,
                                                   (size_t)rows);
    double *row_loss = (double *)real_cuda_scratch(cu, (size_t)rows * sizeof(double));
    if (!dev_targets || !row_loss) {
        real_cuda_fail(cu, "no scratch memory for the loss of %d rows", rows);
        real_cuda_free(be, row_loss);
        return;
    }
    const float grad_scale = dloss_scale / (float)rows;
    real_cuda_k_softmax_xent<<<(unsigned)rows, REAL_CUDA_THREADS, 0, cu->stream>>>(
        logits, dev_targets, vocab, grad_scale, row_loss);
    real_cuda_launched(cu, "softmax_xent");
    real_cuda_k_sum_doubles<<<1, REAL_CUDA_THREADS, 0, cu->stream>>>(cu->loss_sum, row_loss, rows);
    real_cuda_launched(cu, "softmax_xent (sum)");
    real_cuda_free(be, row_loss);
    double loss_sum = NAN;
    if (real_cuda_copy_host(cu, &loss_sum, cu->loss_sum, sizeof loss_sum))
        *loss_out = (float)(loss_sum / rows);
}

/* Its entries of the backend's table. */
void real_cuda_install_embed(RealBackend *be)
{
    be->embedding_fwd = real_cuda_embedding_fwd;
    be->embedding_bwd = real_cuda_embedding_bwd;
    be->token_embedding_fwd = real_cuda_token_embedding_fwd;
    be->token_embedding_bwd = real_cuda_token_embedding_bwd;
    be->rope = real_cuda_rope;
    be->softmax_xent = real_cuda_softmax_xent;
}
