/* bench_gemm: how fast the model's own matmuls run through zreal's CPU backend, as a fraction
 * of OpenBLAS's large-GEMM rate on this machine (issue 5's GEMM benchmark). Prints figures.
 * `bench_gemm --probe` prints only a 512^3 sgemm's GFLOP/s over 0.3 s: the host's speed now,
 * which bench/validate_cpu.sh reads beside every calibration and every case. */
#include "real_cpu.h"
#include "zp_model.h"
#include "zp_util.h"

#include <gsl/gsl_cblas.h>
#include <stdio.h>
#include <string.h>

/* Repeats a GEMM for at least 0.3 s and returns its FLOP/s. */
static double rate(RealBackend *be, int m, int n, int k, RealDType b_dtype)
{
    float *a = be->alloc(be, (size_t)m * k * 4, REAL_MEM_WORKSPACE);
    float *c = be->alloc(be, (size_t)m * n * 4, REAL_MEM_WORKSPACE);
    void *b = be->alloc(be, (size_t)k * n * 4, REAL_MEM_WORKSPACE);
    be->fill(be, a, 0, (size_t)m * k * 4);
    be->fill(be, b, 0, (size_t)k * n * 4);
    be->gemm(be, false, false, m, n, k, 1.0f, REAL_DTYPE_F32, a, b_dtype, b, 0.0f, c);
    int reps = 0;
    const double t0 = zp_now_s();
    double elapsed = 0;
    while (elapsed < 0.3) {
        be->gemm(be, false, false, m, n, k, 1.0f, REAL_DTYPE_F32, a, b_dtype, b, 0.0f, c);
        reps++;
        elapsed = zp_now_s() - t0;
    }
    be->free(be, a), be->free(be, b), be->free(be, c);
    return 2.0 * m * n * k * reps / elapsed;
}

int main(int argc, char **argv)
{
    RealBackend *be = real_cpu_backend_new();
    if (argc == 2 && strcmp(argv[1], "--probe") == 0) {
        printf("%.2f\n", rate(be, 512, 512, 512, REAL_DTYPE_F32) / 1e9);
        be->destroy(be);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "bench_gemm: unknown argument '%s' (only --probe)\n", argv[1]);
        be->destroy(be);
        return 1;
    }
    const double peak = rate(be, 2048, 2048, 2048, REAL_DTYPE_F32);
    printf("OpenBLAS large GEMM (2048^3 fp32 sgemm): %.1f GFLOP/s\n\n", peak / 1e9);
    printf("%-12s %-26s %10s %10s %9s\n", "model", "GEMM (tokens x in x out)", "MFLOP",
           "GFLOP/s", "fraction");
    const struct {
        const char *model;
        int micro_batch;
    } runs[] = {{"tiny", 8}, {"cpu-small", 4}, {"gpt2-124m", 1}};
    for (size_t r = 0; r < G_N_ELEMENTS(runs); r++) {
        ZpModel m;
        if (!zp_model_load(runs[r].model, &m, NULL))
            continue;
        const int T = runs[r].micro_batch * (int)m.seq_len, h = (int)m.hidden;
        const int f = (int)m.ffn_hidden, s = (int)m.seq_len, d = h / (int)m.heads;
        /* The block's four linear layers (bf16 weights, as the model stores them) and one
         * head's attention scores (fp32 q k^T, s x d x s). */
        const struct {
            const char *name;
            int m, k, n;
            RealDType b;
        } shapes[] = {{"qkv", T, h, 3 * h, REAL_DTYPE_BF16}, {"proj", T, h, h, REAL_DTYPE_BF16},
                      {"fc1", T, h, f, REAL_DTYPE_BF16},     {"fc2", T, f, h, REAL_DTYPE_BF16},
                      {"attn q.k", s, d, s, REAL_DTYPE_F32}};
        double flops = 0, seconds = 0;
        for (size_t i = 0; i < G_N_ELEMENTS(shapes); i++) {
            const double g = rate(be, shapes[i].m, shapes[i].n, shapes[i].k, shapes[i].b);
            const double work = 2.0 * shapes[i].m * shapes[i].n * shapes[i].k;
            char label[64];
            g_snprintf(label, sizeof label, "%s %dx%dx%d", shapes[i].name, shapes[i].m,
                       shapes[i].k, shapes[i].n);
            printf("%-12s %-26s %10.2f %10.1f %8.1f%%\n", runs[r].model, label, work / 1e6,
                   g / 1e9, 100 * g / peak);
            if (i < 4) {
                flops += work;
                seconds += work / g;
            }
        }
        printf("%-12s %-26s %10.2f %10.1f %8.1f%%\n\n", runs[r].model, "block linears together",
               flops / 1e6, flops / seconds / 1e9, 100 * flops / seconds / peak);
    }
    be->destroy(be);
    return 0;
}
