/* zp_offload: the tiers follow DeepSpeed v0.19.6 (deepspeed/runtime/zero/stage_1_and_2.py,
 * stage3.py, swap_tensor/), buffer by buffer; the transfers follow where those buffers are
 * filled and drained. Citations name the file and the attribute or function. */
#include "zp_offload.h"
#include "zp_impl.h"
#include "zp_mem_terms.h"
#include "zp_util.h"
#include "zp_zeror.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

gboolean zp_offload_any(const ZpPlan *plan)
{
    return plan->zero.offload_optimizer.device != ZP_OFFLOAD_NONE ||
           plan->zero.offload_param.device != ZP_OFFLOAD_NONE;
}

/* stage3.py _create_fp16_sub_groups: a rank's parameters in order, a sub-group closed once
 * it reaches sub_group_size elements; here ceil(P / sub_group_size) of them, one when it is
 * at least the partition (the default, 1e9). */
static double sub_groups(const ZpPlan *plan, double part, double *size)
{
    const double sg = plan->zero.sub_group_size;
    *size = sg > 0 && sg < part ? sg : part;
    return *size > 0 ? ceil(part / *size) : 1.0;
}

double zp_offload_io_aligned(double elems, double elem_bytes)
{
    const double align = ZP_OFFLOAD_AIO_ALIGNED_BYTES / elem_bytes;
    return ceil(elems / align) * align;
}

double zp_offload_gpu_elems(const ZpPlan *plan, double part)
{
    const ZpOffload *o = &plan->zero.offload_optimizer;
    if (o->device == ZP_OFFLOAD_NONE)
        return part;
    if (plan->zero.stage != 3)
        return 0.0;
    /* stage3.py _create_fp32_partitions: sub-group i steps on the CPU when
     * i >= int((1 - ratio) * n), the first ones on the GPU (Python's int truncates). */
    double size;
    const double n = sub_groups(plan, part, &size);
    return fmin((double)(int64_t)((1.0 - o->ratio) * n) * size, part);
}

double zp_offload_cpu_share(const ZpPlan *plan, double part)
{
    if (plan->zero.offload_optimizer.device == ZP_OFFLOAD_NONE)
        return 0.0;
    return part > 0 ? (part - zp_offload_gpu_elems(plan, part)) / part : 1.0;
}

double zp_offload_param_kept_elems(const ZpPlan *plan, double part)
{
    const double max_in_cpu = plan->zero.offload_param.max_in_cpu;
    if (zp_offload_param_tier(plan) != ZP_TIER_NVME || max_in_cpu >= part)
        return part;
    double size;
    sub_groups(plan, part, &size);
    return size > 0 ? floor(max_in_cpu / size) * size : 0.0;
}

ZpTier zp_offload_optimizer_tier(const ZpPlan *plan)
{
    /* stage_1_and_2.py sets cpu_offload for any device but none: NVMe is only swapped to by
     * stage3.py (_configure_tensor_swapping). */
    switch (plan->zero.offload_optimizer.device) {
    case ZP_OFFLOAD_CPU: return ZP_TIER_CPU;
    case ZP_OFFLOAD_NVME: return plan->zero.stage == 3 ? ZP_TIER_NVME : ZP_TIER_CPU;
    default: return ZP_TIER_GPU;
    }
}

ZpTier zp_offload_param_tier(const ZpPlan *plan)
{
    switch (plan->zero.offload_param.device) {
    case ZP_OFFLOAD_CPU: return ZP_TIER_CPU;
    case ZP_OFFLOAD_NVME: return ZP_TIER_NVME;
    default: return ZP_TIER_GPU;
    }
}

/* The largest single tensor per rank, which DeepSpeed's per-parameter staging buffers are
 * sized by (largest_param_numel): the token embedding or an MLP weight. */
static double largest_tensor_elems(const ZpModel *model, int mp)
{
    if (!zp_model_has_architecture(model))
        return 0.0;
    return fmax((double)model->vocab * (double)model->hidden,
                (double)model->hidden * (double)model->ffn_hidden) / mp;
}

static double row_bytes(const ZpTiers *t, ZpTier tier)
{
    double sum = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        sum += t->bytes[tier][c];
    return sum;
}

/* What offload_optimizer moves and adds (see the header). */
static void optimizer_offload(const ZpModel *model, const ZpPlan *plan, double part,
                              ZpTiers *t, double *pinned)
{
    const double r = zp_offload_cpu_share(plan, part);
    const double gpu_elems = zp_offload_gpu_elems(plan, part), cpu_elems = part - gpu_elems;
    const ZpTier tier = zp_offload_optimizer_tier(plan);
    const ZpOffload *o = &plan->zero.offload_optimizer;
    const double elem = zp_plan_elem_bytes(plan->precision);
    const int stage = plan->zero.stage;
    const double cpu_before = row_bytes(t, ZP_TIER_CPU);
    static const ZpMemCategory states[] = {ZP_MEM_MASTER, ZP_MEM_ADAM_M, ZP_MEM_ADAM_V};
    for (size_t i = 0; i < G_N_ELEMENTS(states); i++) { /* the GPU keeps its sub-groups' */
        const double b = t->bytes[ZP_TIER_GPU][states[i]];
        const double moved = part > 0 && gpu_elems > 0 ? b - gpu_elems * (b / part) : r * b;
        t->bytes[ZP_TIER_GPU][states[i]] -= moved;
        t->bytes[tier][states[i]] += moved;
    }
    /* DeepSpeed's stage 3 sums the whole gradient partition on the host in the 16-bit dtype
     * (zp_impl host_grad_accum); the sub-groups the GPU steps keep their fp32 .grad there
     * (stage3.py initialize_optimizer_states: subgroup_gradient_buffer.to(device)). */
    const gboolean host_accum = stage == 3 && zp_impl_get(plan->impl)->host_grad_accum;
    if (stage == 2)
        t->bytes[ZP_TIER_GPU][ZP_MEM_GRADS] = 0.0;
    else if (host_accum)
        t->bytes[ZP_TIER_GPU][ZP_MEM_GRADS] = gpu_elems * 4.0;
    else if (stage == 3)
        t->bytes[ZP_TIER_GPU][ZP_MEM_GRADS] *= 1.0 - r;
    const double fp32_grads = (stage == 3 ? cpu_elems : r * part) * 4.0;
    /* stage3.py initialize_optimizer_states: a sub-group the optimizer swaps to NVMe
     * (_swappable_optimizer_subgroup) gets no gradient buffer of its own: its .grad is a view
     * of one gradient_buffer of the largest sub-group's elements in the master dtype, on the
     * host and never pinned, and at the boundary its fp32 gradients go to NVMe
     * (_offload_grad_partition_at_boundary -> optimizer_swapper.swap_out_gradients), from
     * the 16-bit sum a slice at a time. Only a sub-group the CPU steps from host memory keeps
     * a subgroup_gradient_buffer of its own. An implementation that sums in fp32 on the host
     * (the paper's) keeps the fp32 partition there. */
    const gboolean nvme_grads = tier == ZP_TIER_NVME && host_accum;
    double shared_grad_buffer = 0;
    if (nvme_grads && cpu_elems > 0) {
        double largest;
        sub_groups(plan, part, &largest);
        shared_grad_buffer = largest * 4.0;
    }
    t->bytes[ZP_TIER_CPU][ZP_MEM_GRADS] += (nvme_grads ? shared_grad_buffer : fp32_grads) +
                                           (host_accum ? part * elem : 0.0);
    if (zp_offload_stage2_accum(plan)) /* accumulated_grads_in_cpu */
        t->bytes[ZP_TIER_CPU][ZP_MEM_GRADS] +=
            zp_offload_stage2_accum_max_elems(model, plan, part) * elem;
    double swap = 0;
    if (tier == ZP_TIER_NVME) {
        t->bytes[ZP_TIER_NVME][ZP_MEM_GRADS] += fp32_grads;
        /* PartitionedOptimizerSwapper's SwapBufferManager: buffer_count pinned fp32 buffers
         * of the largest sub-group, io-aligned (optimizer_utils.py OptimizerSwapper
         * .__init__: largest_numel = max(fp16_partitioned_groups_flat_numel), every
         * sub-group's whether the CPU or the GPU steps it) */
        double size;
        sub_groups(plan, part, &size);
        swap = o->buffer_count * zp_offload_io_aligned(size, 4.0) * 4.0;
        t->bytes[ZP_TIER_CPU][ZP_MEM_BUCKETS] += swap;
    }
    if (stage < 3) {
        const double largest = largest_tensor_elems(model, plan->mp) * elem;
        t->bytes[ZP_TIER_CPU][ZP_MEM_PARAMS] += part * elem;
        t->bytes[ZP_TIER_CPU][ZP_MEM_BUCKETS] += largest; /* temp_grad_buffer_for_cpu_offload */
        t->bytes[ZP_TIER_GPU][ZP_MEM_BUCKETS] += largest; /* temp_grad_buffer_for_gpu_offload */
    }
    /* Swap buffers are pinned whatever pin_memory says (SwapBufferManager); the rest is
     * pinned when pin_memory is set. */
    *pinned += swap + (o->pin_memory
                           ? row_bytes(t, ZP_TIER_CPU) - cpu_before - swap - shared_grad_buffer
                           : 0.0);
}

/* The model's tensors, kept (zp_model_tensors_kept): the search's screen asks the swap buffers
 * and stage 2's accumulation of every offload plan it measures, all of one model, and each
 * call listed them anew (plan --3d gpt-1t on 64 A100s: 7,500 lists). */
static const GArray *model_tensors(const ZpModel *model)
{
    static ZpModelTensorsKept kept;
    return zp_model_tensors_kept(&kept, model);
}

double zp_offload_param_swap_buffer_elems(const ZpModel *model, const ZpPlan *plan, double part)
{
    if (zp_offload_param_tier(plan) != ZP_TIER_NVME ||
        zp_offload_param_kept_elems(plan, part) >= part)
        return 0.0;
    const double elem = zp_plan_elem_bytes(plan->precision);
    double size;
    sub_groups(plan, part, &size);
    if (!zp_model_has_architecture(model)) /* no tensors: the sub-group's, unaligned */
        return fmin(size * plan->dp, (double)zp_model_param_count(model) / plan->mp);
    /* _create_fp16_sub_groups: tensors in order, a sub-group closed once its partition
     * elements (ceil(numel / dp) each) reach sub_group_size; the largest by partition
     * elements counts its tensors' full ds_numel, each io-aligned. */
    const GArray *tensors = model_tensors(model);
    GArray *numel = g_array_sized_new(FALSE, FALSE, sizeof(double), tensors->len);
    double total = 0;
    for (guint i = 0; i < tensors->len; i++) {
        const ZpTensor *t = &g_array_index(tensors, ZpTensor, i);
        const double n = (double)zp_model_tensor_tp_elems(model, t, plan->mp);
        g_array_append_val(numel, n);
        total += ceil(n / plan->dp);
    }
    double best_part = -1, best_full = 0, cur_part = 0, cur_full = 0;
    const double sg = plan->zero.sub_group_size;
    for (guint i = 0; i < numel->len; i++) {
        const double n = g_array_index(numel, double, i);
        cur_part += ceil(n / plan->dp);
        cur_full += zp_offload_io_aligned(n, elem);
        if ((sg < total && cur_part >= sg) || i + 1 == numel->len) {
            if (cur_part > best_part)
                best_part = cur_part, best_full = cur_full;
            cur_part = cur_full = 0;
        }
    }
    g_array_unref(numel);
    return best_full;
}

double zp_offload_param_swap_buffer_bytes(const ZpModel *model, const ZpPlan *plan, double part)
{
    return zp_offload_param_swap_buffer_elems(model, plan, part) *
           zp_plan_elem_bytes(plan->precision);
}

gboolean zp_offload_stage2_accum(const ZpPlan *plan)
{
    return plan->zero.stage == 2 && plan->grad_accum > 1 &&
           plan->zero.offload_optimizer.device != ZP_OFFLOAD_NONE &&
           zp_impl_get(plan->impl)->host_grad_accum;
}

/* The ranks whose partitions of `part` elements tensor [off, off + n) overlaps. */
static void overlapped_ranks(double off, double n, double part, int dp, int *first, int *last)
{
    *first = (int)MIN(floor(off / part), dp - 1);
    *last = (int)MIN(floor((off + n - 1) / part), dp - 1);
}

double zp_offload_stage2_accum_elems(const ZpModel *model, const ZpPlan *plan, double part,
                                     double lo, double hi, int rank)
{
    if (!zp_model_has_architecture(model))
        return rank < 0 ? fmin(hi - lo, part * plan->dp) : fmin(hi, (rank + 1) * part) -
                                                              fmax(lo, rank * part);
    const GArray *tensors = model_tensors(model);
    double off = 0, sum = 0;
    for (guint i = 0; i < tensors->len && off < hi; i++) {
        const ZpTensor *t = &g_array_index(tensors, ZpTensor, i);
        const double n = (double)zp_model_tensor_tp_elems(model, t, plan->mp);
        int first, last;
        overlapped_ranks(off, n, part, plan->dp, &first, &last);
        if (off >= lo && n > 0)
            sum += rank < 0 ? n * (last - first + 1) : rank >= first && rank <= last ? n : 0;
        off += n;
    }
    return sum;
}

double zp_offload_stage2_accum_max_elems(const ZpModel *model, const ZpPlan *plan, double part)
{
    if (!zp_model_has_architecture(model))
        return part;
    const GArray *tensors = model_tensors(model);
    double *held = g_new0(double, plan->dp), off = 0, most = 0;
    for (guint i = 0; i < tensors->len; i++) {
        const ZpTensor *t = &g_array_index(tensors, ZpTensor, i);
        const double n = (double)zp_model_tensor_tp_elems(model, t, plan->mp);
        int first, last;
        overlapped_ranks(off, n, part, plan->dp, &first, &last);
        for (int r = first; n > 0 && r <= last; r++)
            most = fmax(most, held[r] += n);
        off += n;
    }
    g_free(held);
    return most;
}

/* Rank q's part of the flat range [lo, hi): its overlap with [qP, (q+1)P). */
static double rank_part(double lo, double hi, double part, int q)
{
    return fmax(0.0, fmin(hi, (q + 1) * part) - fmax(lo, q * part));
}

/* Rank `rank`'s bytes of a stage 1-2 gradient transfer `op` after the reduction `coll`. */
static double rank_grad_bytes(const ZpSchedule *s, const ZpOp *op, const ZpOp *coll, int rank)
{
    const double part = (double)s->partition_elems, lo = (double)coll->elem_offset;
    const double hi = lo + (double)coll->elems;
    const ZpOp *before = zp_sched_op(s, zp_sched_deps(s, op)[0]);
    const gboolean fp32 = !zp_offload_stage2_accum(&s->plan) ||
                          (op->sub == ZP_XFER_D2H && before->kind == ZP_OP_TRANSFER &&
                           before->sub == ZP_XFER_D2H);
    if (fp32)
        return zp_offload_grad_d2h_bytes(&s->plan, rank_part(lo, hi, part, rank), part);
    return zp_offload_stage2_accum_elems(&s->model, &s->plan, part, lo, hi, rank) *
           zp_plan_elem_bytes(s->plan.precision);
}

void zp_offload_rank_transfer_bytes(const ZpSchedule *s, int rank, double bytes[ZP_XFER_N])
{
    memset(bytes, 0, ZP_XFER_N * sizeof *bytes);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i), *origin = op;
        if (op->kind != ZP_OP_TRANSFER)
            continue;
        while (origin && origin->kind == ZP_OP_TRANSFER)
            origin = origin->n_deps ? zp_sched_op(s, zp_sched_deps(s, origin)[0]) : NULL;
        const gboolean grads = origin && origin->kind == ZP_OP_COLLECTIVE && s->plan.zero.stage < 3;
        bytes[op->sub] += grads ? rank_grad_bytes(s, op, origin, rank) : op->bytes;
    }
}

static void param_offload(const ZpModel *model, const ZpPlan *plan, double part, ZpTiers *t,
                          double *pinned)
{
    const ZpOffload *o = &plan->zero.offload_param;
    const double elem = zp_plan_elem_bytes(plan->precision);
    const double bytes = t->bytes[ZP_TIER_GPU][ZP_MEM_PARAMS];
    t->bytes[ZP_TIER_GPU][ZP_MEM_PARAMS] = 0.0;
    if (zp_offload_param_tier(plan) == ZP_TIER_CPU) {
        t->bytes[ZP_TIER_CPU][ZP_MEM_PARAMS] += bytes;
        if (o->pin_memory)
            *pinned += bytes;
        return;
    }
    /* NVMe: a pinned flat buffer of min(P, max_in_cpu) elements, whatever of it the
     * sub-groups kept there fill (zp_offload_param_kept_elems); the parameter swapper's
     * pinned pool of buffer_count buffers of buffer_size elements, each io-aligned
     * (partitioned_param_swapper.py _configure_aio); and when a sub-group is not kept, its
     * partitioned_swap_buffer (zp_offload_param_swap_buffer_elems). */
    t->bytes[ZP_TIER_NVME][ZP_MEM_PARAMS] += bytes;
    const double kept = fmin(part, o->max_in_cpu) * elem;
    t->swap_buffer_bytes = zp_offload_param_swap_buffer_bytes(model, plan, part);
    const double pool = o->buffer_count * zp_offload_io_aligned(o->buffer_size, elem) * elem +
                        t->swap_buffer_bytes;
    t->bytes[ZP_TIER_CPU][ZP_MEM_PARAMS] += kept;
    t->bytes[ZP_TIER_CPU][ZP_MEM_BUCKETS] += pool;
    *pinned += kept + pool;
}

/* Applies the plan's offload to t's GPU row (filled with the states as if nothing were
 * offloaded) for a partition of `part` elements per rank. */
static void apply_offload(const ZpModel *model, const ZpPlan *plan, double part, ZpTiers *t)
{
    const int stage = plan->zero.stage;
    double pinned = 0;
    /* Pa+cpu (ZeRO-R): the checkpoint slices in host memory, pageable (zp_zeror). */
    t->bytes[ZP_TIER_CPU][ZP_MEM_CHECKPOINTS] = zp_zeror_host_bytes(model, plan);
    if (plan->zero.offload_optimizer.device != ZP_OFFLOAD_NONE && stage >= 1)
        optimizer_offload(model, plan, part, t, &pinned);
    if (plan->zero.offload_param.device != ZP_OFFLOAD_NONE && stage == 3)
        param_offload(model, plan, part, t, &pinned);
    if (row_bytes(t, ZP_TIER_NVME) > 0) /* the direct I/O buffer (see ZP_OFFLOAD_BOUNCE_BYTES) */
        t->bytes[ZP_TIER_CPU][ZP_MEM_BUCKETS] += ZP_OFFLOAD_BOUNCE_BYTES + ZP_OFFLOAD_PAGE_BYTES;
    for (int tier = 0; tier < ZP_TIER_N; tier++)
        t->total_bytes[tier] = row_bytes(t, (ZpTier)tier);
    t->pinned_bytes = pinned;
}

void zp_offload_tiers(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw, ZpTiers *t)
{
    memset(t, 0, sizeof *t);
    ZpPlan normalized = *plan; /* FSDP2's stage 2 holds stage 3's states */
    zp_impl_normalize_plan(&normalized);
    plan = &normalized;
    const int stage = plan->zero.stage;
    const double params = (double)zp_model_param_count(model);
    const ZpStateBytes sb = zp_impl_state_bytes(plan);
    const ZpModelStates m = zp_mem_model_states(params, stage, plan->dp, plan->mp, sb);
    const double psi = params / plan->mp, part = psi / plan->dp;
    const double optim_elems = stage == 0 ? psi : part;
    double master, mom1, mom2;
    zp_plan_optimizer_split(plan, &master, &mom1, &mom2);
    t->bytes[ZP_TIER_GPU][ZP_MEM_PARAMS] = m.params_bytes;
    t->bytes[ZP_TIER_GPU][ZP_MEM_GRADS] = m.grads_bytes;
    t->bytes[ZP_TIER_GPU][ZP_MEM_MASTER] = optim_elems * master;
    t->bytes[ZP_TIER_GPU][ZP_MEM_ADAM_M] = optim_elems * mom1;
    t->bytes[ZP_TIER_GPU][ZP_MEM_ADAM_V] = optim_elems * mom2;
    apply_offload(model, plan, part, t);
    const int world = plan->dp * plan->mp;
    t->ranks_per_node = hw && hw->gpus_per_node > 0 ? MIN(hw->gpus_per_node, world) : 1;
    t->cpu_node_bytes = t->ranks_per_node * t->total_bytes[ZP_TIER_CPU];
    t->nvme_node_bytes = t->ranks_per_node * t->total_bytes[ZP_TIER_NVME];
}

void zp_offload_layout(ZpSchedule *s)
{
    if (!zp_offload_any(&s->plan) && zp_zeror_host_bytes(&s->model, &s->plan) == 0)
        return;
    ZpTiers t = {0};
    memcpy(t.bytes[ZP_TIER_GPU], s->state_bytes, sizeof s->state_bytes);
    apply_offload(&s->model, &s->plan, (double)s->partition_elems, &t);
    memcpy(s->state_bytes, t.bytes[ZP_TIER_GPU], sizeof s->state_bytes);
    memcpy(s->host_bytes, t.bytes[ZP_TIER_CPU], sizeof s->host_bytes);
    memcpy(s->nvme_bytes, t.bytes[ZP_TIER_NVME], sizeof s->nvme_bytes);
}

void zp_offload_fetch(const ZpPlan *plan, double elems, double at, double partition_elems,
                      double *nvme_read_bytes, double *h2d_bytes)
{
    const double elem = zp_plan_elem_bytes(plan->precision);
    const ZpTier tier = zp_offload_param_tier(plan);
    *h2d_bytes = tier == ZP_TIER_GPU ? 0.0 : elems * elem;
    *nvme_read_bytes = 0;
    if (tier != ZP_TIER_NVME || partition_elems <= 0)
        return;
    /* The sub-groups the host keeps, the partition's first kept elements, are fetched from
     * it, the rest is read from NVMe first: exactly from `at`, else spread over the slices
     * evenly (exact with one sub-group: all or none). */
    const double kept = zp_offload_param_kept_elems(plan, partition_elems);
    *nvme_read_bytes = at >= 0 ? fmax(0.0, at + elems - fmax(at, kept)) * elem
                               : (partition_elems - kept) / partition_elems * elems * elem;
}

static const char *const tier_what[ZP_TIER_N] = {"GPU memory per GPU", "CPU memory per node",
                                                 "NVMe per node"};

const char *zp_tier_what(ZpTier tier)
{
    return tier_what[tier];
}

static void tier_need(const ZpTiers *t, double gpu_need_bytes, const ZpHw *hw,
                      double need[ZP_TIER_N], double have[ZP_TIER_N])
{
    need[ZP_TIER_GPU] = gpu_need_bytes, have[ZP_TIER_GPU] = hw->gpu_memory_bytes;
    need[ZP_TIER_CPU] = t->cpu_node_bytes, have[ZP_TIER_CPU] = hw->cpu_memory_bytes;
    need[ZP_TIER_NVME] = t->nvme_node_bytes, have[ZP_TIER_NVME] = hw->nvme_bytes;
}

ZpTier zp_offload_overflow(const ZpTiers *t, double gpu_need_bytes, const ZpHw *hw,
                           double *short_bytes)
{
    double need[ZP_TIER_N], have[ZP_TIER_N];
    tier_need(t, gpu_need_bytes, hw, need, have);
    for (int tier = 0; tier < ZP_TIER_N; tier++)
        if (need[tier] > have[tier]) {
            *short_bytes = need[tier] - have[tier];
            return (ZpTier)tier;
        }
    *short_bytes = 0;
    return ZP_TIER_N;
}

gboolean zp_offload_fit(const ZpTiers *t, double gpu_need_bytes, const ZpHw *hw, GError **error)
{
    double short_bytes, need[ZP_TIER_N], have[ZP_TIER_N];
    const ZpTier tier = zp_offload_overflow(t, gpu_need_bytes, hw, &short_bytes);
    if (tier == ZP_TIER_N)
        return TRUE;
    tier_need(t, gpu_need_bytes, hw, need, have);
    g_autofree char *swap = NULL;
    if (tier == ZP_TIER_CPU && t->swap_buffer_bytes > 0)
        swap = g_strdup_printf("; %.1f GB of it is offload_param's partitioned_swap_buffer, which "
                               "DeepSpeed pins for the largest sub-group's full parameters when a "
                               "sub-group is not kept in host memory: raise max_in_cpu to the "
                               "partition or lower sub_group_size",
                               t->ranks_per_node * t->swap_buffer_bytes / 1e9);
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s overflows: the plan needs %.1f GB of %s's %.1f GB (%.1f GB short)%s",
                tier_what[tier], need[tier] / 1e9, hw->name, have[tier] / 1e9, short_bytes / 1e9,
                swap ? swap : "");
    return FALSE;
}

void zp_offload_ds_estimate_zero2(double params, int gpus_per_node, int nodes,
                                  gboolean cpu_offload, double *cpu_bytes, double *gpu_bytes)
{
    const double total_gpus = (double)gpus_per_node * nodes, factor = 1.5;
    if (cpu_offload) {
        *gpu_bytes = 2 * params;
        *cpu_bytes = params * fmax(4 * total_gpus, 16) * factor;
    } else {
        *gpu_bytes = 4 * params + floor(16 * params / total_gpus);
        *cpu_bytes = params * 4 * gpus_per_node * factor;
    }
}

void zp_offload_ds_estimate_zero3(double params, double largest_layer_params,
                                  int gpus_per_node, int nodes, gboolean cpu_offload,
                                  gboolean cpu_offload_params, double *cpu_bytes,
                                  double *gpu_bytes)
{
    const double total_gpus = (double)gpus_per_node * nodes, gpus_factor = 1.0 / nodes;
    const double factor = 1.5, largest = 4 * largest_layer_params;
    if (cpu_offload && cpu_offload_params) {
        *gpu_bytes = largest;
        *cpu_bytes = params * 18 * gpus_factor * factor;
    } else if (cpu_offload) {
        *gpu_bytes = largest + floor(2 * params / total_gpus);
        *cpu_bytes = params * 16 * gpus_factor * factor;
    } else {
        *gpu_bytes = largest + floor(18 * params / total_gpus);
        *cpu_bytes = largest_layer_params * 4 * gpus_per_node * factor;
    }
}

/* ---- transfers ---- */

double zp_offload_cpu_adam_bytes(const ZpPlan *plan)
{
    const ZpStateBytes st = zp_plan_state_bytes(plan->precision, plan->optimizer);
    return 4.0 + 2.0 * st.optim_bytes + st.param_bytes;
}

double zp_offload_grad_d2h_bytes(const ZpPlan *plan, double elems, double part)
{
    return zp_offload_cpu_share(plan, part) * elems * 4.0;
}

int zp_offload_sub_group_count(const ZpPlan *plan, double part)
{
    double size;
    return plan->zero.stage == 3 ? (int)sub_groups(plan, part, &size) : 1;
}

void zp_offload_sub_group_step(const ZpPlan *plan, double part, int j, ZpOffloadStep *step)
{
    memset(step, 0, sizeof *step);
    double size = part;
    const int n = zp_offload_sub_group_count(plan, part);
    if (n > 1)
        sub_groups(plan, part, &size);
    step->offset_elems = j * size;
    step->elems = fmin(size, part - step->offset_elems);
    /* the CPU steps the last sub-groups (zp_offload_cpu_share), all with one */
    step->on_cpu = plan->zero.offload_optimizer.device != ZP_OFFLOAD_NONE &&
                   step->offset_elems >= zp_offload_gpu_elems(plan, part);
    const double e = step->on_cpu ? step->elems : 0.0;
    const double elem = zp_plan_elem_bytes(plan->precision);
    const ZpStateBytes st = zp_plan_state_bytes(plan->precision, plan->optimizer);
    if (zp_offload_optimizer_tier(plan) == ZP_TIER_NVME) {
        /* stage3.py _optimizer_states_and_gradient_swap_in / _swap_out: the states and the
         * fp32 gradients in, the states out. */
        step->nvme_read_bytes += e * (st.optim_bytes + 4.0);
        step->nvme_write_bytes += e * st.optim_bytes;
    }
    switch (zp_offload_param_tier(plan)) {
    case ZP_TIER_GPU: /* the updated 16-bit sub-group returns to the GPU */
        step->h2d_bytes = e * elem;
        break;
    case ZP_TIER_NVME: /* written back unless the host keeps it (_partitioned_params_swap_out) */
        if (step->offset_elems >= zp_offload_param_kept_elems(plan, part))
            step->nvme_write_bytes += step->elems * elem;
        break;
    default:
        break;
    }
}

double zp_offload_host_peak_bytes(const ZpSchedule *s)
{
    const ZpPlan *plan = &s->plan;
    const double part = (double)s->partition_elems;
    double sum = 0, most = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        sum += s->host_bytes[c];
    for (int j = 0; plan->zero.stage == 3 && zp_offload_param_tier(plan) == ZP_TIER_GPU &&
                    j < zp_offload_sub_group_count(plan, part);
         j++) { /* the largest sub-group the CPU steps */
        ZpOffloadStep step;
        zp_offload_sub_group_step(plan, part, j, &step);
        if (step.on_cpu)
            most = fmax(most, step.elems);
    }
    return sum + most * zp_plan_elem_bytes(plan->precision);
}

gboolean zp_offload_cpu_time_s(const ZpHw *hw, double bytes, int ranks_per_node,
                               double *seconds, GError **error)
{
    if (hw->cpu_adam_bytes_per_s_per_core <= 0 || hw->cpu_cores_per_node <= 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: optimizer offload needs \"cpu_adam_bytes_per_s_per_core\" and "
                    "\"cpu_cores_per_node\" in the hwprofile (zreal --microbench and zplan "
                    "calibrate measure the first)", hw->name);
        return FALSE;
    }
    *seconds = bytes / (hw->cpu_adam_bytes_per_s_per_core * hw->cpu_cores_per_node /
                        MAX(1, ranks_per_node));
    return TRUE;
}

double zp_offload_link_bytes_per_s(const ZpHw *hw, ZpTransferKind kind, int ranks_per_node)
{
    if (kind == ZP_XFER_D2H || kind == ZP_XFER_H2D)
        return hw->host_link_bytes_per_s;
    return hw->nvme_bytes_per_s / MAX(1, ranks_per_node);
}
