/* gpu_testutil: the CUDA backend tests' shared backends, random data, device round trips and
 * comparisons (gpu_testutil.h). */
#include "gpu_testutil.h"

RealBackend *cpu;
RealBackend *gpu[2];
const char *const mode_name[2] = {"bf16", "fp32"};
GRand *rng;

gboolean gpu_testutil_init(const char *program)
{
    GError *error = NULL;
    cpu = real_cpu_backend_new();
    for (int mode = 0; mode < 2; mode++)
        if (!(gpu[mode] = real_cuda_backend_new(0, (RealCudaGemmMode)mode, &error))) {
            g_printerr("%s: %s\n", program, error->message);
            g_clear_error(&error);
            return FALSE;
        }
    rng = g_rand_new_with_seed(20240607);
    return TRUE;
}

int gpu_testutil_run(void)
{
    const int status = g_test_run();
    for (int mode = 0; mode < 2; mode++)
        gpu[mode]->destroy(gpu[mode]);
    cpu->destroy(cpu);
    g_rand_free(rng);
    return status;
}

/* ---- host data ---- */

double normal(void)
{
    const double u1 = 1.0 - g_rand_double(rng), u2 = g_rand_double(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * G_PI * u2);
}

float *random_f32(size_t n, double mean, double std)
{
    float *x = g_new(float, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mean + std * normal());
    return x;
}

/* fp32 values that are exactly bf16 (as the model's activations are when GEMMs read them). */
float *random_bf16_values(size_t n, double std)
{
    float *x = random_f32(n, 0.0, std);
    for (size_t i = 0; i < n; i++)
        x[i] = real_bf16_round_f32(x[i]);
    return x;
}

RealBf16 *random_bf16(size_t n, double mean, double std)
{
    RealBf16 *x = g_new(RealBf16, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        x[i] = real_bf16_from_f32((float)(mean + std * normal()));
    return x;
}

void *copy_of(const void *src, size_t bytes)
{
    return g_memdup2(src, bytes ? bytes : 1);
}

/* ---- device data ---- */

void device_ok(RealBackend *be)
{
    const char *text = NULL;
    be->synchronize(be, &text);
    g_assert_cmpstr(text, ==, NULL);
}

void *upload(RealBackend *be, const void *host, size_t bytes)
{
    void *dev = be->alloc(be, bytes, REAL_MEM_WORKSPACE);
    g_assert_nonnull(dev);
    be->copy(be, dev, host, bytes);
    return dev;
}

void *download(RealBackend *be, const void *dev, size_t bytes)
{
    void *host = g_malloc(bytes ? bytes : 1);
    be->copy(be, host, dev, bytes);
    device_ok(be);
    return host;
}

/* ---- comparisons ---- */

void assert_same_bits(const void *got, const void *want, size_t bytes, const char *what)
{
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != w[i]) {
            g_test_message("%s: first difference at byte %zu of %zu", what, i, bytes);
            g_assert_cmpmem(got, bytes, want, bytes);
        }
}

/* |got - want| <= bound[i] for every i (NaN fails). */
void assert_within(const float *got, const float *want, const double *bound, size_t n,
                   const char *what)
{
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double ratio = fabs((double)got[i] - want[i]) / bound[i];
        if (!(ratio <= worst)) {
            worst = isnan(ratio) ? INFINITY : ratio;
            at = i;
        }
    }
    g_test_message("%s: worst difference %.3g of its tolerance (element %zu: %.9g vs %.9g)",
                   what, worst, at, n ? got[at] : 0.0f, n ? want[at] : 0.0f);
    g_assert_cmpfloat(worst, <=, 1.0);
}

/* |got - want| <= abs_tol + rel_tol |want|. */
void assert_close(const float *got, const float *want, size_t n, double abs_tol,
                  double rel_tol, const char *what)
{
    double *bound = g_new(double, n ? n : 1);
    for (size_t i = 0; i < n; i++)
        bound[i] = abs_tol + rel_tol * fabs(want[i]);
    assert_within(got, want, bound, n, what);
    g_free(bound);
}

/* |got - want| <= tol max|want|, over every `stride`-th run of `width` values (all zeros
 * when want is: the gradient of q and k when every row attends to itself only). */
void assert_close_to_max(const float *got, const float *want, size_t rows, size_t width,
                         size_t stride, double tol, const char *what)
{
    double max = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < width; c++)
            max = fmax(max, fabs(want[r * stride + c]));
    const double allowed = max > 0.0 ? tol * max : FLT_MIN;
    double worst = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < width; c++) {
            const double d = fabs((double)got[r * stride + c] - want[r * stride + c]) / allowed;
            worst = isnan(d) ? INFINITY : fmax(worst, d);
        }
    g_test_message("%s: worst difference %.3g of its tolerance (%.3g x max %.3g)", what, worst,
                   tol, max);
    g_assert_cmpfloat(worst, <=, 1.0);
}
