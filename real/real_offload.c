/* real_offload: the host tier is plain host memory (malloc through a tracker of its own), so
 * on the CPU backend the copies between tiers are real memory copies with conversions, as
 * DeepSpeed's are PCIe copies (stage_1_and_2.py: async_inplace_copy_grad_to_fp32_buffer
 * _from_gpu down, param_buffer_of_bit16_for_cpu_offload_groups up). */
#include "real_offload.h"
#include "real_bf16.h"
#include "zp_offload.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

struct RealOffload {
    RealBackend *be;
    RealAlloc *host;
    uint64_t part;
    float *master, *m, *v, *grads;
    RealBf16 *params;        /* the 16-bit copy CPU Adam writes */
    RealBf16 *host_staging;  /* temp_grad_buffer_for_cpu_offload */
    RealBf16 *device_staging; /* temp_grad_buffer_for_gpu_offload */
    uint64_t staging_elems;
    double moved[ZP_XFER_N];
};

static gboolean fail(GError **error, const char *what)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "offload: %s", what);
    return FALSE;
}

static gboolean supported(const ZpSchedule *s, RealBackend *be, uint64_t part, GError **error)
{
    const ZpZeroConfig *z = &s->plan.zero;
    if (z->stage != 1 || z->offload_param.device != ZP_OFFLOAD_NONE ||
        zp_offload_cpu_share(&s->plan) != 1.0)
        return fail(error, "zreal executes optimizer offload at ZeRO stage 1 only (stage 2 "
                           "keeps no gradient partition on the GPU, stage 3 swaps to NVMe: "
                           "simulate those)");
    if (strcmp(be->name, "cpu") != 0)
        return fail(error, "zreal's host tier runs on the cpu backend only");
    const double want[ZP_MEM_N] = {[ZP_MEM_PARAMS] = 2.0 * part, [ZP_MEM_GRADS] = 4.0 * part,
                                   [ZP_MEM_MASTER] = 4.0 * part, [ZP_MEM_ADAM_M] = 4.0 * part,
                                   [ZP_MEM_ADAM_V] = 4.0 * part};
    for (int c = ZP_MEM_PARAMS; c <= ZP_MEM_ADAM_V; c++)
        if (s->host_bytes[c] != want[c])
            return fail(error, "the schedule's host tier is not the partition's fp32 states "
                               "and 16-bit copy");
    return TRUE;
}

RealOffload *real_offload_new(const ZpSchedule *s, RealBackend *be, uint64_t part,
                              GError **error)
{
    if (!supported(s, be, part, error))
        return NULL;
    RealOffload *o = g_new0(RealOffload, 1);
    o->be = be, o->host = real_alloc_new(), o->part = part;
    void **slots[ZP_MEM_N] = {[ZP_MEM_PARAMS] = (void **)&o->params,
                              [ZP_MEM_GRADS] = (void **)&o->grads,
                              [ZP_MEM_MASTER] = (void **)&o->master,
                              [ZP_MEM_ADAM_M] = (void **)&o->m, [ZP_MEM_ADAM_V] = (void **)&o->v,
                              [ZP_MEM_BUCKETS] = (void **)&o->host_staging};
    gboolean ok = TRUE;
    for (int c = 0; ok && c < ZP_MEM_N; c++) {
        if (!slots[c])
            continue;
        const size_t bytes = (size_t)s->host_bytes[c];
        ok = (*slots[c] = real_alloc_take(o->host, bytes, (RealMemCategory)c)) != NULL;
        if (ok)
            memset(*slots[c], 0, bytes);
    }
    o->staging_elems = (uint64_t)(s->state_bytes[ZP_MEM_BUCKETS] / sizeof(RealBf16));
    ok = ok && o->staging_elems > 0 &&
         (o->device_staging = be->alloc(be, o->staging_elems * sizeof(RealBf16),
                                        REAL_MEM_BUCKETS)) != NULL;
    if (!ok) {
        real_offload_free(o);
        fail(error, "no memory for the host tier");
        return NULL;
    }
    return o;
}

void real_offload_free(RealOffload *o)
{
    if (!o)
        return;
    void *host[] = {o->params, o->grads, o->master, o->m, o->v, o->host_staging};
    for (size_t i = 0; i < G_N_ELEMENTS(host); i++)
        real_alloc_release(o->host, host[i]);
    real_alloc_free_tracker(o->host);
    o->be->free(o->be, o->device_staging);
    g_free(o);
}

float *real_offload_master(RealOffload *o) { return o->master; }
float *real_offload_adam_m(RealOffload *o) { return o->m; }
float *real_offload_adam_v(RealOffload *o) { return o->v; }

void real_offload_grads_down(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n)
{
    /* Through both staging buffers, a largest tensor at a time, as DeepSpeed copies one
     * parameter's gradient at a time. */
    for (uint64_t done = 0; done < n; done += o->staging_elems) {
        const uint64_t k = MIN(o->staging_elems, n - done);
        o->be->copy(o->be, o->device_staging, src + done, k * sizeof(RealBf16));
        memcpy(o->host_staging, o->device_staging, k * sizeof(RealBf16));
        for (uint64_t i = 0; i < k; i++)
            o->grads[at + done + i] = real_bf16_to_f32(o->host_staging[i]);
    }
    o->moved[ZP_XFER_D2H] += 4.0 * (double)n;
}

void real_offload_cpu_adam(const RealAdamHyper *hyper, size_t n, float *restrict master,
                           float *restrict m, float *restrict v, const float *restrict grad,
                           RealBf16 *restrict param)
{
    const float b1 = hyper->beta1, b2 = hyper->beta2;
    const float correct1 = (float)(1.0 - pow(b1, (double)hyper->step));
    const float correct2 = (float)(1.0 - pow(b2, (double)hyper->step));
    const float scale = hyper->grad_scale, lr = hyper->lr, eps = hyper->eps;
    const float decay = hyper->weight_decay;
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * scale;
        const float mi = b1 * m[i] + (1.0f - b1) * g;
        const float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi, v[i] = vi;
        const float update = (mi / correct1) / (sqrtf(vi / correct2) + eps);
        const float w = master[i] - lr * (update + decay * master[i]);
        master[i] = w;
        param[i] = real_bf16_from_f32(w);
    }
}

void real_offload_adam(RealOffload *o, const RealAdamHyper *hyper)
{
    real_offload_cpu_adam(hyper, o->part, o->master, o->m, o->v, o->grads, o->params);
}

void real_offload_params_up(RealOffload *o, RealBf16 *dst)
{
    o->be->copy(o->be, dst, o->params, o->part * sizeof(RealBf16));
    o->moved[ZP_XFER_H2D] += 2.0 * (double)o->part;
}

void real_offload_stats(const RealOffload *o, RealAllocStats *host, double moved[ZP_XFER_N])
{
    real_alloc_stats(o->host, host);
    memcpy(moved, o->moved, sizeof o->moved);
}
