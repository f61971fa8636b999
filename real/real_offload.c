/* real_offload: the host tier is plain host memory (malloc through a tracker of its own), so
 * on the CPU backend the copies between tiers are real memory copies with conversions, as
 * DeepSpeed's are PCIe copies (stage_1_and_2.py: async_inplace_copy_grad_to_fp32_buffer
 * _from_gpu down, param_buffer_of_bit16_for_cpu_offload_groups up; stage3.py partition_grads,
 * _reassign_or_swap_out_partitioned_parameters); the NVMe tier is swap files (real_nvme). */
#include "real_offload.h"
#include "real_bf16.h"
#include "real_nvme.h"
#include "zp_impl.h"
#include "zp_offload.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

/* A fp32 gradient slice between its D2H and its swap-out: DeepSpeed's
 * grad_buffer.to(fp32) in offload_fp32_gradients (stage3.py
 * _offload_grad_partition_at_boundary), a transient outside the planned host tier. */
typedef struct {
    uint64_t at, n;
    float *f32;
} PendingGrad;

struct RealOffload {
    RealBackend *be;
    const ZpPlan *plan;    /* the schedule's */
    /* The step goes sub-group by sub-group (zp_offload_sub_group_step), its ops in order:
     * the next sub-group to step, and the one stepped last (which the write-backs move). */
    int n_sub, next_sub, stepped;
    /* Partial offload (zp_offload_gpu_elems): the first sub-groups, gpu_elems of the
     * partition from first_cpu's on, keep fp32 master, moments and gradients on the device
     * and step there; the host arrays hold the partition from gpu_elems. */
    uint64_t gpu_elems;
    int first_cpu;
    float *dev_master, *dev_m, *dev_v, *dev_grads;
    RealAlloc *host;
    int stage;
    uint64_t part;
    ZpTier opt_tier, param_tier;
    float *master, *m, *v; /* host arrays (cpu; with nvme the swap buffers, states_at) */
    float *grads;          /* the host's fp32 gradients (grad_partitions_flat_buffer); with
                            * DeepSpeed's optimizer on NVMe the one gradient_buffer of the
                            * largest sub-group its swapped sub-groups' .grad views */
    GArray *pending;       /* that case: PendingGrads, fp32 slices on their way to NVMe */
    RealBf16 *accum16;     /* DeepSpeed's stage 3: the 16-bit sum (grad_partitions_flat_buffer,
                            * the fp32 gradients being fp32_partitioned_groups_flat's .grad);
                            * stage 2 with accumulation: the whole tensors' 16-bit sums
                            * (accumulated_grads_in_cpu) */
    uint64_t accum_elems;
    RealBf16 *params;      /* the host's 16-bit copy or partition, NULL when it has none */
    uint64_t kept;         /* the partition's first elements the host keeps (all but with
                            * offload_param nvme: zp_offload_param_kept_elems) */
    RealBf16 *cpu_flat;    /* offload_param nvme: the flat buffer of max_in_cpu elements the
                            * one sub-group does not fit in, allocated all the same */
    RealBf16 *out16;       /* a transient 16-bit partition (init, or CPU Adam's output) */
    RealBf16 *host_staging, *device_staging; /* stages 1-2: temp_grad_buffer_for_*_offload */
    uint64_t staging_elems;
    float *swap;           /* optimizer swapper: master, m, v, gradients */
    uint64_t swap_stride;  /* elements of each of its buffers: the partition io-aligned */
    RealBf16 *pool;        /* parameter swapper's buffers */
    RealBf16 *part_swap;   /* its partitioned_swap_buffer (a sub-group not kept on the host):
                            * CPU Adam's 16-bit output on its way to NVMe */
    void *bounce_raw;      /* the swap files' direct I/O buffer, a page to spare to align it */
    uint64_t pool_elems;
    RealNvmeFile *file[ZP_MEM_N];
    void *pinned[8]; /* host buffers page-locked by a device backend (pin_memory) */
    int n_pinned;
    double moved[ZP_XFER_N];
};

/* The optimizer's swapped tensors, in the order of the swap buffers (and of the states_at
 * index, the GPU's sub-groups' arrays). */
static const ZpMemCategory swapped[] = {ZP_MEM_MASTER, ZP_MEM_ADAM_M, ZP_MEM_ADAM_V,
                                        ZP_MEM_GRADS};

static gboolean fail(GError **error, const char *what)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "offload: %s", what);
    return FALSE;
}

static gboolean supported(const ZpSchedule *s, RealBackend *be, uint64_t part, GError **error)
{
    const ZpZeroConfig *z = &s->plan.zero;
    const gboolean device = be->synchronize != NULL; /* else the host is the device */
    /* Partial offload: the GPU's sub-groups step with the CPU backend's Adam on fp32
     * gradients (real_offload_gpu_adam), the host's sum being DeepSpeed's (host_grad_accum). */
    const double share = zp_offload_cpu_share(&s->plan, (double)part);
    if (z->offload_optimizer.device != ZP_OFFLOAD_NONE && share == 0)
        return fail(error, "offload_optimizer.ratio: zreal steps some sub-groups on the CPU, "
                           "this ratio none");
    if (share > 0 && share < 1 &&
        (!zp_impl_get(s->plan.impl)->host_grad_accum || device ||
         zp_offload_optimizer_tier(&s->plan) != ZP_TIER_CPU ||
         zp_offload_param_tier(&s->plan) != ZP_TIER_GPU))
        return fail(error, "offload_optimizer.ratio: zreal steps sub-groups on the GPU under "
                           "DeepSpeed's stage 3 (--impl deepspeed) with the optimizer on cpu, "
                           "the parameters on the GPU and the cpu backend");
    const double kept = zp_offload_param_kept_elems(&s->plan, (double)part);
    if (kept > 0 && kept < (double)part && s->plan.impl != ZP_IMPL_DEEPSPEED)
        return fail(error, "offload_param.max_in_cpu: zreal keeps some of the sub-groups in "
                           "host memory under DeepSpeed's stage 3 only (--impl deepspeed)");
    const double swap = zp_offload_param_swap_buffer_elems(&s->model, &s->plan, (double)part);
    if (swap > 0 && swap < (double)part)
        return fail(error, "zreal initialises the partition in the partitioned_swap_buffer, "
                           "which holds less than it: a larger sub_group_size");
    if (device && (!be->copy_async || !be->pin_host))
        return fail(error, "the backend has no pinned host memory or copy stream");
    if (device && z->offload_param.device != ZP_OFFLOAD_NONE)
        return fail(error, "zreal offloads parameters on the cpu backend only");
    if (z->zero_quantized_weights || z->zero_hpz_partition_size > 1)
        return fail(error, "zreal executes offload without ZeRO++ (qwZ, hpZ)");
    const ZpOffload *p = &z->offload_param;
    if (p->device != ZP_OFFLOAD_NONE && z->offload_optimizer.device == ZP_OFFLOAD_NONE)
        return fail(error, "zreal offloads parameters together with the optimizer "
                           "(--offload-optimizer)");
    for (int u = 0; zp_offload_param_tier(&s->plan) != ZP_TIER_GPU && u < s->n_units; u++)
        if (zp_sched_unit_persistent(s, u))
            return fail(error, "zreal offloads parameters without persistent ones "
                               "(--persistence-threshold 0)");
    return TRUE;
}

/* One host buffer of the tier: its category, bytes and where it goes. */
typedef struct {
    ZpMemCategory cat;
    double bytes;
    void **slot;
} HostBuffer;

/* The host buffers the plan lays out (see the header), n of them into `out`. */
static int host_layout(RealOffload *o, const ZpSchedule *s, HostBuffer *out)
{
    const ZpZeroConfig *z = &s->plan.zero;
    const double part = (double)o->part, cpu = (double)(o->part - o->gpu_elems);
    int n = 0;
    if (o->opt_tier == ZP_TIER_CPU) {
        out[n++] = (HostBuffer){ZP_MEM_MASTER, 4 * cpu, (void **)&o->master};
        out[n++] = (HostBuffer){ZP_MEM_ADAM_M, 4 * cpu, (void **)&o->m};
        out[n++] = (HostBuffer){ZP_MEM_ADAM_V, 4 * cpu, (void **)&o->v};
    }
    ZpOffloadStep first;
    zp_offload_sub_group_step(&s->plan, part, 0, &first);
    const gboolean host_accum =
        o->opt_tier != ZP_TIER_GPU && o->stage == 3 && zp_impl_get(s->plan.impl)->host_grad_accum;
    /* zp_offload_tiers: DeepSpeed's swapped sub-groups share one fp32 gradient_buffer of the
     * largest sub-group (stage3.py initialize_optimizer_states) */
    if (o->opt_tier != ZP_TIER_GPU)
        out[n++] = (HostBuffer){ZP_MEM_GRADS,
                                o->opt_tier == ZP_TIER_NVME && host_accum
                                    ? (cpu > 0 ? 4 * first.elems : 0)
                                    : 4 * cpu,
                                (void **)&o->grads};
    if (host_accum) {
        o->accum_elems = o->part;
        if (o->opt_tier == ZP_TIER_NVME && !o->pending)
            o->pending = g_array_new(FALSE, FALSE, sizeof(PendingGrad));
    } else if (zp_offload_stage2_accum(&s->plan)) {
        o->accum_elems = (uint64_t)zp_offload_stage2_accum_max_elems(&s->model, &s->plan, part);
    }
    if (o->accum_elems > 0)
        out[n++] = (HostBuffer){ZP_MEM_GRADS, 2.0 * (double)o->accum_elems, (void **)&o->accum16};
    /* stage3.py _create_param_groups_fp16_flat_cpu_memory: min(P, max_in_cpu) elements,
     * the partition's when its sub-group fits (zp_offload_param_kept_elems) */
    const double flat = o->param_tier == ZP_TIER_NVME ? fmin(part, z->offload_param.max_in_cpu)
                        : o->stage < 3 || o->param_tier == ZP_TIER_CPU ? part
                                                                       : 0;
    const gboolean kept = zp_offload_param_kept_elems(&s->plan, part) == part;
    if (flat > 0)
        out[n++] = (HostBuffer){ZP_MEM_PARAMS, 2 * flat,
                                kept ? (void **)&o->params : (void **)&o->cpu_flat};
    if (o->stage < 3)
        out[n++] = (HostBuffer){ZP_MEM_BUCKETS, s->state_bytes[ZP_MEM_BUCKETS],
                                (void **)&o->host_staging};
    /* the swap buffers as DeepSpeed sizes them, io-aligned (zp_offload_tiers): the first
     * sub-group is the largest */
    o->swap_stride = (uint64_t)zp_offload_io_aligned(first.elems, sizeof(float));
    if (o->opt_tier == ZP_TIER_NVME)
        out[n++] = (HostBuffer){ZP_MEM_BUCKETS,
                                z->offload_optimizer.buffer_count * (double)o->swap_stride * 4,
                                (void **)&o->swap};
    if (o->param_tier == ZP_TIER_NVME) {
        o->pool_elems = (uint64_t)(z->offload_param.buffer_count *
                                   zp_offload_io_aligned(z->offload_param.buffer_size, 2));
        out[n++] = (HostBuffer){ZP_MEM_BUCKETS, 2.0 * (double)o->pool_elems, (void **)&o->pool};
    }
    const double part_swap = zp_offload_param_swap_buffer_elems(&s->model, &s->plan, part);
    if (part_swap > 0)
        out[n++] = (HostBuffer){ZP_MEM_BUCKETS, 2.0 * part_swap, (void **)&o->part_swap};
    double nvme = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        nvme += s->nvme_bytes[c];
    if (nvme > 0)
        out[n++] = (HostBuffer){ZP_MEM_BUCKETS, ZP_OFFLOAD_BOUNCE_BYTES + ZP_OFFLOAD_PAGE_BYTES,
                                &o->bounce_raw};
    return n;
}

static gboolean allocate_host(RealOffload *o, const ZpSchedule *s, GError **error)
{
    HostBuffer buf[12];
    const int n = host_layout(o, s, buf);
    double sum[ZP_MEM_N] = {0};
    for (int i = 0; i < n; i++)
        sum[buf[i].cat] += buf[i].bytes;
    for (int c = 0; c < ZP_MEM_N; c++)
        if (sum[c] != s->host_bytes[c])
            return fail(error, "the schedule's host tier is not the one zreal lays out");
    for (int i = 0; i < n; i++) {
        const size_t bytes = (size_t)buf[i].bytes;
        if (!(*buf[i].slot = real_alloc_take(o->host, bytes, (RealMemCategory)buf[i].cat)))
            return fail(error, "no memory for the host tier");
        memset(*buf[i].slot, 0, bytes);
        /* DeepSpeed pins the host tier when pin_memory is set (its swap buffers always). */
        if (o->be->pin_host && (s->plan.zero.offload_optimizer.pin_memory || o->swap) &&
            bytes > 0 && buf[i].slot != &o->bounce_raw) { /* the bounce is pageable */
            if (!o->be->pin_host(o->be, *buf[i].slot, bytes))
                return fail(error, "the driver refused to pin the host tier");
            o->pinned[o->n_pinned++] = *buf[i].slot;
        }
    }
    /* the four tensors of a sub-group are swapped in together (states_at) */
    if (o->swap && (double)s->plan.zero.offload_optimizer.buffer_count < 4)
        return fail(error, "zreal swaps the optimizer's master, moments and gradients of a "
                           "sub-group together: offload_optimizer.buffer_count at least 4");
    return TRUE;
}

/* A swap file for each category the schedule keeps on NVMe, under the tier's nvme_path. */
static gboolean open_files(RealOffload *o, const ZpSchedule *s, int rank, GError **error)
{
    const ZpZeroConfig *z = &s->plan.zero;
    const uintptr_t page = ZP_OFFLOAD_PAGE_BYTES;
    void *bounce = (void *)(((uintptr_t)o->bounce_raw + page - 1) / page * page);
    for (int c = 0; c < ZP_MEM_N; c++) {
        if (s->nvme_bytes[c] <= 0)
            continue;
        const char *dir = c == ZP_MEM_PARAMS ? z->offload_param.nvme_path
                                             : z->offload_optimizer.nvme_path;
        if (!(o->file[c] = real_nvme_file_new(dir, rank, zp_sched_mem_name((ZpMemCategory)c),
                                              (uint64_t)s->nvme_bytes[c], bounce, error)))
            return FALSE;
    }
    return TRUE;
}

RealOffload *real_offload_new(const ZpSchedule *s, RealBackend *be, int rank, uint64_t part,
                              GError **error)
{
    if (!supported(s, be, part, error))
        return NULL;
    RealOffload *o = g_new0(RealOffload, 1);
    o->be = be, o->host = real_alloc_new(), o->part = part, o->stage = s->plan.zero.stage;
    o->plan = &s->plan, o->n_sub = zp_offload_sub_group_count(&s->plan, (double)part);
    o->gpu_elems = (uint64_t)zp_offload_gpu_elems(&s->plan, (double)part);
    o->kept = (uint64_t)zp_offload_param_kept_elems(&s->plan, (double)part);
    for (ZpOffloadStep g = {0}; o->first_cpu < o->n_sub; o->first_cpu++) {
        zp_offload_sub_group_step(&s->plan, (double)part, o->first_cpu, &g);
        if (g.on_cpu)
            break;
    }
    o->next_sub = o->first_cpu;
    o->opt_tier = zp_offload_optimizer_tier(&s->plan);
    o->param_tier = zp_offload_param_tier(&s->plan);
    o->staging_elems = (uint64_t)(s->state_bytes[ZP_MEM_BUCKETS] / sizeof(RealBf16));
    gboolean ok = allocate_host(o, s, error) && open_files(o, s, rank, error);
    if (ok && o->stage < 3 &&
        !(o->device_staging = be->alloc(be, o->staging_elems * sizeof(RealBf16),
                                        REAL_MEM_BUCKETS)))
        ok = fail(error, "no memory for the device staging buffer");
    float **dev[] = {&o->dev_master, &o->dev_m, &o->dev_v, &o->dev_grads};
    for (size_t i = 0; ok && o->gpu_elems > 0 && i < G_N_ELEMENTS(dev); i++) {
        const size_t bytes = o->gpu_elems * sizeof(float);
        if (!(*dev[i] = be->alloc(be, bytes, (RealMemCategory)swapped[i])))
            ok = fail(error, "no device memory for the GPU's sub-groups");
        else
            be->fill(be, *dev[i], 0, bytes);
    }
    if (!ok) {
        real_offload_free(o);
        return NULL;
    }
    return o;
}

void real_offload_free(RealOffload *o)
{
    if (!o)
        return;
    void *host[] = {o->master, o->m,     o->v,         o->grads, o->accum16,
                    o->params, o->cpu_flat, o->out16,  o->host_staging,
                    o->swap,   o->pool,  o->part_swap, o->bounce_raw};
    for (guint i = 0; o->pending && i < o->pending->len; i++)
        g_free(g_array_index(o->pending, PendingGrad, i).f32);
    if (o->pending)
        g_array_unref(o->pending);
    for (int i = 0; i < o->n_pinned; i++)
        o->be->unpin_host(o->be, o->pinned[i]);
    for (size_t i = 0; i < G_N_ELEMENTS(host); i++)
        real_alloc_release(o->host, host[i]);
    real_alloc_free_tracker(o->host);
    for (int c = 0; c < ZP_MEM_N; c++)
        real_nvme_file_free(o->file[c]);
    o->be->free(o->be, o->device_staging);
    float *dev[] = {o->dev_master, o->dev_m, o->dev_v, o->dev_grads};
    for (size_t i = 0; i < G_N_ELEMENTS(dev); i++)
        o->be->free(o->be, dev[i]);
    g_free(o);
}

/* Sub-group j's range of the partition. */
static void sub_group(const RealOffload *o, int j, uint64_t *off, uint64_t *n)
{
    ZpOffloadStep g;
    zp_offload_sub_group_step(o->plan, (double)o->part, j, &g);
    *off = (uint64_t)g.offset_elems, *n = (uint64_t)g.elems;
}

/* Where sub-group [off, off + n)'s 16-bit values are on the host: in the host's partition
 * or its place in the flat buffer (a sub-group max_in_cpu keeps), at the head of the
 * partitioned_swap_buffer, or in a transient host copy of n (PARAMS). */
static RealBf16 *sub_group16(RealOffload *o, uint64_t off, uint64_t n)
{
    if (o->params)
        return o->params + off;
    if (o->cpu_flat && off < o->kept)
        return o->cpu_flat + off;
    if (o->part_swap)
        return o->part_swap;
    if (!o->out16)
        o->out16 = real_alloc_take(o->host, n * sizeof(RealBf16), REAL_MEM_PARAMS);
    return o->out16;
}

static void release16(RealOffload *o)
{
    real_alloc_release(o->host, o->out16);
    o->out16 = NULL;
}

RealBf16 *real_offload_param_init_buffer(RealOffload *o)
{
    return o->param_tier == ZP_TIER_GPU ? NULL : o->params ? o->params : o->part_swap;
}

RealBf16 *real_offload_host_params(RealOffload *o)
{
    return o->param_tier == ZP_TIER_GPU ? NULL : o->params;
}

/* Where the step's fp32 tensors of sub-group [off, ...) are: the host arrays (cpu) or the
 * swap buffers (nvme); i indexes `swapped`. */
static float *states_at(RealOffload *o, size_t i, uint64_t off);

gboolean real_offload_init(RealOffload *o, const RealBf16 *partition, GError **error)
{
    gboolean ok = TRUE;
    for (int j = 0; ok && j < o->n_sub; j++) { /* sub-group by sub-group, as the step */
        uint64_t off, n;
        sub_group(o, j, &off, &n);
        const RealBf16 *host = partition + off;
        if (off < o->gpu_elems) { /* a sub-group the GPU steps: its master there */
            o->be->bf16_to_f32(o->be, states_at(o, 0, off), host, n);
            continue;
        }
        if (o->param_tier == ZP_TIER_GPU) { /* the partition is on the device */
            RealBf16 *copy = sub_group16(o, off, n);
            if (!copy)
                return fail(error, "no host memory for a sub-group's 16-bit copy");
            o->be->copy(o->be, copy, host, n * sizeof(RealBf16));
            host = copy;
        }
        float *master = states_at(o, 0, off);
        for (uint64_t i = 0; i < n; i++)
            master[i] = real_bf16_to_f32(host[i]);
        /* the swap buffers are zero but for the master */
        for (size_t i = 0; ok && o->swap && i < G_N_ELEMENTS(swapped); i++)
            ok = real_nvme_write(o->file[swapped[i]], states_at(o, i, off), n * sizeof(float),
                                 off * sizeof(float), error);
        release16(o);
    }
    if (ok && o->file[ZP_MEM_PARAMS])
        ok = real_nvme_write(o->file[ZP_MEM_PARAMS], partition, o->part * sizeof(RealBf16), 0,
                             error);
    if (ok && o->cpu_flat && o->kept > 0) /* the kept sub-groups into the flat buffer */
        memcpy(o->cpu_flat, partition, o->kept * sizeof(RealBf16));
    return ok;
}

/* A copy between the tiers: on the backend's copy stream where it has one (the host does not
 * wait), else a plain copy. */
static void tier_copy(RealOffload *o, void *dst, const void *src, size_t bytes)
{
    if (o->be->copy_async)
        o->be->copy_async(o->be, dst, src, bytes);
    else
        o->be->copy(o->be, dst, src, bytes);
}

/* Later device calls (and with `host`, the host) wait for the tier copies so far. */
static void tier_wait(RealOffload *o, bool host)
{
    if (o->be->copy_wait)
        o->be->copy_wait(o->be, host);
}

/* Device scratch, counted as the workspace it is. */
static float *scratch(RealOffload *o, uint64_t n, GError **error)
{
    float *p = o->be->alloc(o->be, n * sizeof(float), REAL_MEM_WORKSPACE);
    if (!p)
        fail(error, "no device memory for a gradient slice's fp32 copy");
    return p;
}

gboolean real_offload_grads_down(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n,
                                 GError **error)
{
    if (o->stage == 3 && at < o->gpu_elems) { /* the GPU's sub-groups keep theirs */
        const uint64_t skip = MIN(n, o->gpu_elems - at);
        src += skip, at += skip, n -= skip;
    }
    o->moved[ZP_XFER_D2H] += 4.0 * (double)n;
    if (o->stage == 3 && n == 0)
        return TRUE;
    if (o->stage == 3) {
        at -= o->gpu_elems; /* the host's fp32 gradients begin there */
        float *f32 = scratch(o, n, error);
        if (!f32)
            return FALSE;
        o->be->bf16_to_f32(o->be, f32, src, n);
        float *dst = o->grads + at;
        PendingGrad pg = {at + o->gpu_elems, n, NULL};
        if (o->pending && !(dst = pg.f32 = g_try_new(float, n))) {
            o->be->free(o->be, f32);
            return fail(error, "no host memory for a gradient slice on its way to NVMe");
        }
        tier_copy(o, dst, f32, n * sizeof(float));
        tier_wait(o, false); /* before the scratch is freed (stream-ordered) */
        o->be->free(o->be, f32);
        if (o->pending)
            g_array_append_val(o->pending, pg);
        return TRUE;
    }
    /* Through both staging buffers, a largest tensor at a time, as DeepSpeed copies one
     * parameter's gradient at a time. */
    for (uint64_t done = 0; done < n; done += o->staging_elems) {
        const uint64_t k = MIN(o->staging_elems, n - done);
        o->be->copy(o->be, o->device_staging, src + done, k * sizeof(RealBf16));
        o->be->copy(o->be, o->host_staging, o->device_staging, k * sizeof(RealBf16));
        for (uint64_t i = 0; i < k; i++)
            o->grads[at + done + i] = real_bf16_to_f32(o->host_staging[i]);
    }
    return TRUE;
}

gboolean real_offload_grads_up_add(RealOffload *o, RealBf16 *dst, uint64_t at, uint64_t n,
                                   GError **error)
{
    float *sum = scratch(o, n, error);
    if (!sum)
        return FALSE;
    tier_copy(o, sum, o->grads + at, n * sizeof(float));
    tier_wait(o, false);
    o->be->accumulate_bf16(o->be, dst, sum, n);
    o->be->free(o->be, sum);
    o->moved[ZP_XFER_H2D] += 4.0 * (double)n;
    return TRUE;
}

void real_offload_accum_down(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n)
{
    tier_copy(o, o->accum16 + at, src, n * sizeof(RealBf16));
    tier_wait(o, false); /* before the reduced slice's buffer is freed (stream-ordered) */
    o->moved[ZP_XFER_D2H] += 2.0 * (double)n;
}

gboolean real_offload_accum_up(RealOffload *o, RealBf16 *dst, uint64_t at, uint64_t n,
                               gboolean add, GError **error)
{
    o->moved[ZP_XFER_H2D] += 2.0 * (double)n;
    if (!add) { /* grad_buffer.to(device): the same values the GPU has */
        tier_copy(o, dst, o->accum16 + at, n * sizeof(RealBf16));
        tier_wait(o, false);
        return TRUE;
    }
    RealBf16 *up = o->be->alloc(o->be, n * sizeof(RealBf16), REAL_MEM_WORKSPACE);
    if (!up)
        return fail(error, "no device memory for the host's gradient sum");
    float *sum = scratch(o, n, error);
    if (!sum)
        return o->be->free(o->be, up), FALSE;
    tier_copy(o, up, o->accum16 + at, n * sizeof(RealBf16));
    tier_wait(o, false);
    o->be->bf16_to_f32(o->be, sum, up, n); /* cuda_grad_buffer.add_(grad_partition) */
    o->be->accumulate_bf16(o->be, dst, sum, n);
    o->be->free(o->be, up), o->be->free(o->be, sum);
    return TRUE;
}

/* Stage 2's whole tensor [at, at + numel) of the host sums, its part [in, in + n) the
 * device's `own`: within the sums and the device staging buffer. */
static gboolean tensor_fits(const RealOffload *o, uint64_t at, uint64_t numel, uint64_t in,
                            uint64_t n, GError **error)
{
    if (o->stage != 2 || !o->accum16 || at + numel > o->accum_elems ||
        numel > o->staging_elems || in + n > numel)
        return fail(error, "a whole-tensor gradient sum outside the host's or the staging "
                           "buffer (stage 2 with --grad-accum > 1 only)");
    return TRUE;
}

gboolean real_offload_tensor_up_add(RealOffload *o, RealBf16 *own, uint64_t in, uint64_t n,
                                    uint64_t at, uint64_t numel, GError **error)
{
    if (!tensor_fits(o, at, numel, in, n, error))
        return FALSE;
    tier_copy(o, o->device_staging, o->accum16 + at, numel * sizeof(RealBf16));
    tier_wait(o, false);
    o->moved[ZP_XFER_H2D] += 2.0 * (double)numel;
    float *sum = scratch(o, n, error);
    if (!sum)
        return FALSE;
    o->be->bf16_to_f32(o->be, sum, o->device_staging + in, n); /* grad_accum.add_(dest_buffer) */
    o->be->accumulate_bf16(o->be, own, sum, n);
    o->be->free(o->be, sum);
    return TRUE;
}

gboolean real_offload_tensor_down(RealOffload *o, const RealBf16 *own, uint64_t in, uint64_t n,
                                  uint64_t at, uint64_t numel, GError **error)
{
    if (!tensor_fits(o, at, numel, in, n, error))
        return FALSE;
    o->be->copy(o->be, o->device_staging + in, own, n * sizeof(RealBf16));
    tier_copy(o, o->accum16 + at, o->device_staging, numel * sizeof(RealBf16));
    tier_wait(o, false); /* before the staging buffer is written again (stream-ordered) */
    o->moved[ZP_XFER_D2H] += 2.0 * (double)numel;
    return TRUE;
}

gboolean real_offload_grads_out(RealOffload *o, uint64_t at, uint64_t n, GError **error)
{
    if (!o->file[ZP_MEM_GRADS])
        return fail(error, "a gradient swap-out without the optimizer on NVMe");
    o->moved[ZP_XFER_NVME_WRITE] += 4.0 * (double)n;
    tier_wait(o, true); /* the slice has landed */
    if (!o->pending)
        return real_nvme_write(o->file[ZP_MEM_GRADS], o->grads + at, n * sizeof(float),
                               at * sizeof(float), error);
    for (guint i = 0; i < o->pending->len; i++) {
        PendingGrad *pg = &g_array_index(o->pending, PendingGrad, i);
        if (pg->at != at || pg->n != n)
            continue;
        const gboolean ok = real_nvme_write(o->file[ZP_MEM_GRADS], pg->f32, n * sizeof(float),
                                            at * sizeof(float), error);
        g_free(pg->f32);
        g_array_remove_index_fast(o->pending, i);
        return ok;
    }
    return fail(error, "a gradient swap-out of a slice that never came down");
}

static float *states_at(RealOffload *o, size_t i, uint64_t off)
{
    if (o->swap)
        return o->swap + i * o->swap_stride;
    float *const dev[] = {o->dev_master, o->dev_m, o->dev_v, o->dev_grads};
    if (off < o->gpu_elems)
        return dev[i] + off;
    float *const host[] = {o->master, o->m, o->v, o->grads};
    return host[i] + (off - o->gpu_elems);
}

gboolean real_offload_states_in(RealOffload *o, GError **error)
{
    if (!o->swap)
        return fail(error, "an optimizer swap-in without the optimizer on NVMe");
    uint64_t off, n;
    sub_group(o, o->next_sub, &off, &n);
    const uint64_t f4 = n * sizeof(float);
    for (size_t i = 0; i < G_N_ELEMENTS(swapped); i++) {
        if (!real_nvme_read(o->file[swapped[i]], states_at(o, i, off), f4, off * sizeof(float),
                            error))
            return FALSE;
        o->moved[ZP_XFER_NVME_READ] += (double)f4;
    }
    return TRUE;
}

gboolean real_offload_states_out(RealOffload *o, GError **error)
{
    uint64_t off, n;
    sub_group(o, o->stepped, &off, &n);
    const uint64_t f4 = n * sizeof(float);
    for (size_t i = 0; o->swap && i + 1 < G_N_ELEMENTS(swapped); i++) {
        if (!real_nvme_write(o->file[swapped[i]], states_at(o, i, off), f4, off * sizeof(float),
                             error))
            return FALSE;
        o->moved[ZP_XFER_NVME_WRITE] += (double)f4;
    }
    if (o->param_tier == ZP_TIER_NVME && off >= o->kept) { /* CPU Adam's 16-bit output */
        if (!o->part_swap)
            return fail(error, "a parameter swap-out without the partitioned swap buffer");
        const uint64_t b2 = n * sizeof(RealBf16);
        o->moved[ZP_XFER_NVME_WRITE] += (double)b2;
        return real_nvme_write(o->file[ZP_MEM_PARAMS], o->part_swap, b2, off * sizeof(RealBf16),
                               error);
    }
    return TRUE;
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
        if (param)
            param[i] = real_bf16_from_f32(w);
    }
}

gboolean real_offload_first_sub_group(const RealOffload *o)
{
    return o->next_sub == 0; /* with partial offload the GPU's step begins it */
}

void real_offload_gpu_adam(RealOffload *o, const RealAdamHyper *hyper, RealBf16 *params)
{
    real_offload_cpu_adam(hyper, o->gpu_elems, o->dev_master, o->dev_m, o->dev_v, o->dev_grads,
                          params);
}

void real_offload_grads_keep(RealOffload *o, const RealBf16 *src, uint64_t at, uint64_t n)
{
    if (at < o->gpu_elems)
        o->be->bf16_to_f32(o->be, o->dev_grads + at, src, MIN(n, o->gpu_elems - at));
}

gboolean real_offload_adam(RealOffload *o, const RealAdamHyper *hyper, GError **error)
{
    uint64_t off, n;
    sub_group(o, o->next_sub, &off, &n);
    RealBf16 *out = sub_group16(o, off, n);
    if (!out)
        return fail(error, "no host memory for CPU Adam's 16-bit output");
    tier_wait(o, true); /* every gradient slice has landed */
    real_offload_cpu_adam(hyper, n, states_at(o, 0, off), states_at(o, 1, off),
                          states_at(o, 2, off), states_at(o, 3, off), out);
    o->stepped = o->next_sub, o->next_sub = o->next_sub + 1 < o->n_sub ? o->next_sub + 1
                                                                        : o->first_cpu;
    return TRUE;
}

void real_offload_params_up(RealOffload *o, RealBf16 *dst)
{
    uint64_t off, n;
    sub_group(o, o->stepped, &off, &n);
    tier_copy(o, dst + off, sub_group16(o, off, n), n * sizeof(RealBf16));
    tier_wait(o, o->out16 != NULL); /* the host waits before freeing a transient source */
    o->moved[ZP_XFER_H2D] += 2.0 * (double)n;
    release16(o);
}

gboolean real_offload_param_read(RealOffload *o, uint64_t at, uint64_t n, uint64_t pool_at,
                                 GError **error)
{
    if (!o->file[ZP_MEM_PARAMS] || pool_at + n > o->pool_elems)
        return fail(error, "a parameter swap-in needs the parameters on NVMe and a slice "
                           "within offload_param's buffer_count x buffer_size");
    const uint64_t skip = MIN(n, o->kept > at ? o->kept - at : 0); /* the host's part */
    o->moved[ZP_XFER_NVME_READ] += 2.0 * (double)(n - skip);
    return skip == n ||
           real_nvme_read(o->file[ZP_MEM_PARAMS], o->pool + pool_at + skip,
                          (n - skip) * sizeof(RealBf16), (at + skip) * sizeof(RealBf16), error);
}

void real_offload_param_fetch(RealOffload *o, RealBf16 *dst, uint64_t at, uint64_t n,
                              uint64_t pool_at)
{
    /* the kept sub-groups' part from the host, the rest from the pool it was read into */
    const uint64_t host = MIN(n, o->kept > at ? o->kept - at : 0);
    if (host > 0)
        tier_copy(o, dst, o->params ? o->params + at : o->cpu_flat + at,
                  host * sizeof(RealBf16));
    if (host < n)
        tier_copy(o, dst + host, o->pool + pool_at + host, (n - host) * sizeof(RealBf16));
    tier_wait(o, true); /* before the gather, and before the pool is read into again */
    o->moved[ZP_XFER_H2D] += 2.0 * (double)n;
}

void real_offload_stats(const RealOffload *o, RealAllocStats *host, double moved[ZP_XFER_N],
                        double *direct_bytes)
{
    real_alloc_stats(o->host, host);
    memcpy(moved, o->moved, sizeof o->moved);
    *direct_bytes = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        if (o->file[c])
            *direct_bytes += real_nvme_direct_bytes(o->file[c]);
}

const char *real_offload_nvme_note(const RealOffload *o)
{
    for (int c = 0; c < ZP_MEM_N; c++)
        if (o->file[c] && real_nvme_buffered_reason(o->file[c]))
            return real_nvme_buffered_reason(o->file[c]);
    return NULL;
}
