/* zp_zeropp: the figures follow DeepSpeed's code paths named in the header; each function is
 * a closed form of one of them, so the schedule, its checker and the tests agree. */
#include "zp_zeropp.h"
#include "zp_impl.h"
#include "zp_util.h"

#include <math.h>

static int node_ranks(const ZpPlan *plan)
{
    const int per_node = plan->gpus_per_node > 0 ? plan->gpus_per_node / plan->mp : plan->dp;
    return MAX(1, MIN(per_node, plan->dp));
}

int zp_zeropp_group_ranks(const ZpPlan *plan, ZpGroup group)
{
    switch (group) {
    case ZP_GROUP_TP:
        return plan->mp;
    case ZP_GROUP_HPZ:
        return plan->zero.zero_hpz_partition_size;
    case ZP_GROUP_NODE:
        return node_ranks(plan);
    case ZP_GROUP_XNODE:
        return plan->dp / node_ranks(plan);
    default:
        return plan->dp;
    }
}

/* A ZeRO++ group that needs whole nodes, on data-parallel ranks that are not. */
static gboolean not_whole(GError **error, const char *what, int group_ranks, int dp)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s %d ranks do not tile the %d data-parallel ranks: it needs whole nodes, and "
                "these GPUs are not a whole number of them (drop it, or use a multiple of %d)",
                what, group_ranks, dp, group_ranks);
    return FALSE;
}

gboolean zp_zeropp_check(const ZpPlan *plan, GError **error)
{
    const ZpZeroConfig *z = &plan->zero;
    const int hpz = z->zero_hpz_partition_size, local = node_ranks(plan);
    const char *bad = NULL;
    const gboolean any = z->zero_quantized_weights || z->zero_quantized_gradients || hpz > 1;
    /* FSDP2's reshard_after_forward=int (_fsdp_param.py to_sharded_post_forward: after
     * forward each parameter keeps a 16-bit shard over int ranks of the node, which backward
     * all-gathers inside the node) is hpZ's secondary partition by another name; its
     * quantised collectives do not exist there. */
    const gboolean quantized = z->zero_quantized_weights || z->zero_quantized_gradients;
    if (any && plan->impl == ZP_IMPL_FSDP)
        bad = "zero_quantized_weights/zero_hpz_partition_size/zero_quantized_gradients "
              "(--quantized-weights, --hpz-partition-size, --quantized-gradients): ZeRO++ is "
              "DeepSpeed's; --impl fsdp has none of it (use --impl deepspeed or paper)";
    else if (quantized && plan->impl == ZP_IMPL_FSDP2)
        bad = "zero_quantized_weights/zero_quantized_gradients (--quantized-weights, "
              "--quantized-gradients): ZeRO++'s quantisation is DeepSpeed's; --impl fsdp2 has "
              "none of it (its reshard_after_forward=int is --hpz-partition-size)";
    else if (any && z->stage != 3)
        bad = "zero_quantized_weights/zero_hpz_partition_size/zero_quantized_gradients: ZeRO++ "
              "works on stage 3's partitioned parameters (stage 3 only)";
    else if (hpz < 1 || (hpz > 1 && local % hpz != 0))
        bad = "zero_hpz_partition_size: must divide the data-parallel ranks of one node "
              "(GPUs per node / mp), so the secondary partition stays inside the node";
    /* DeepSpeed builds hpZ's groups over the world in blocks of the partition size
     * (utils/groups.py _create_zero_param_parallel_group asserts world_size % group_size
     * == 0): a GPU count that is not a whole number of such blocks has no hpZ. */
    else if (hpz > 1 && plan->dp % hpz != 0)
        return not_whole(error, "zero_hpz_partition_size (--hpz-partition-size): hpZ's groups of",
                         hpz, plan->dp);
    /* DeepSpeed's qgZ reduces over the whole world, not the data-parallel group: stage3.py
     * __avg_scatter_grads takes num_nodes from dist.get_world_size(), and
     * coalesced_collectives.py all_to_all_quant_reduce all-to-alls over groups.py
     * _get_local_all_to_all_group's groups (every rank of a node, then one local index across
     * all nodes), which ignore tensor parallelism: it would sum different tensor shards'
     * gradients and hand each rank a world-sized slice where its partition is dp-sized.
     * (Pipelines never meet it: they refuse stage 3, zp_pipe_check.) */
    else if (z->zero_quantized_gradients && plan->impl == ZP_IMPL_DEEPSPEED && plan->mp > 1)
        bad = "zero_quantized_gradients (--quantized-gradients) with --mp > 1 "
              "(tensor_parallel.autotp_size): DeepSpeed's qgZ all-to-alls span every rank of "
              "the world and ignore tensor parallelism, so they cannot reduce a tensor-parallel "
              "model's gradients; use --mp 1 or drop qgZ";
    else if (z->zero_quantized_gradients && plan->dp % local != 0)
        return not_whole(error, "zero_quantized_gradients (--quantized-gradients): qgZ's "
                         "hierarchical all-to-all, a node's", local, plan->dp);
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
        return FALSE;
    }
    return TRUE;
}

/* The least divisor of m that is at least `least` (m itself if none is smaller): the
 * divisors pair up around sqrt(m), so trial division up to it finds it. */
static uint64_t least_divisor_from(uint64_t m, uint64_t least)
{
    uint64_t root = (uint64_t)sqrt((double)m);
    while (root * root > m)
        root--;
    while ((root + 1) * (root + 1) <= m)
        root++;
    /* Up to the root, the first divisor from `least` is the least: every co-divisor m / d of
     * a smaller d exceeds m / least >= root. */
    for (uint64_t d = MAX(least, 1); d <= root; d++)
        if (m % d == 0)
            return d;
    /* Past it, the least co-divisor m / d >= least is that of the largest such d. */
    for (uint64_t d = MIN(root, m / MAX(least, 1)); d >= 1; d--)
        if (m % d == 0)
            return m / d;
    return m;
}

/* CUDAQuantizer.quantize with target_group_size 8000: its first loop steps groups up from
 * ceil(n / 8000) to the first with 8 x groups dividing n, i.e. the least divisor of n / 8 at
 * least that. DeepSpeed asserts 8 | n; for other n the first guess stands. */
uint64_t zp_zeropp_qwz_groups(uint64_t n)
{
    if (n == 0)
        return 0;
    uint64_t groups = (n + 7999) / 8000;
    if (n % 8 == 0)
        groups = least_divisor_from(n / 8, groups);
    while (n % (16 * groups) == 0 && (double)n / (double)groups > 8000)
        groups *= 2;
    return groups;
}

double zp_zeropp_gather_bytes(const ZpPlan *plan, uint64_t elems, int ranks, double param_bytes)
{
    if (!plan->zero.zero_quantized_weights)
        return (double)elems * param_bytes;
    const uint64_t part = elems / (uint64_t)ranks;
    return (double)ranks * ((double)part + 4.0 * (double)zp_zeropp_qwz_groups(part));
}

double zp_zeropp_quantize_mem_bytes(uint64_t partition_elems)
{
    /* Read 2 bytes, write 1, and 4 per group. */
    return 3.0 * (double)partition_elems + 4.0 * (double)zp_zeropp_qwz_groups(partition_elems);
}

double zp_zeropp_dequantize_mem_bytes(uint64_t elems, int ranks)
{
    const uint64_t part = elems / (uint64_t)ranks;
    return 3.0 * (double)elems + 4.0 * (double)ranks * (double)zp_zeropp_qwz_groups(part);
}

double zp_zeropp_secondary_bytes(const ZpSchedule *s, double persistent_elems)
{
    const int hpz = s->plan.zero.zero_hpz_partition_size;
    if (s->plan.zero.stage != 3 || hpz <= 1)
        return 0.0;
    const ZpStateBytes st = zp_plan_state_bytes(s->plan.precision, s->plan.optimizer);
    double elems = -persistent_elems;
    for (int u = 0; u < s->n_units; u++)
        elems += (double)zp_sched_unit_padded(s, u);
    return elems / hpz * st.param_bytes;
}

/* swizzle_quant reads the gradients and writes int4; quantized_reduction reads the node's
 * int4 and writes 1/local of it; dequantize writes 16-bit elements of 1/local, whose node
 * chunks are summed into this rank's partition. */
static void qgz_kernels(ZpQgz *q, double elems, double grad_bytes, double local)
{
    q->quantize_mem_bytes = elems * grad_bytes + q->intra_bytes;
    q->reduce_mem_bytes = q->intra_bytes + q->inter_bytes;
    q->dequantize_mem_bytes = q->inter_bytes + 2 * elems / local * grad_bytes;
}

ZpQgz zp_zeropp_qgz(const ZpPlan *plan, double elems, double hidden, double grad_bytes)
{
    const double world = plan->dp, local = node_ranks(plan);
    ZpQgz q;
    /* swizzle_quant lays each rank's partition out as whole groups: the groups rounded up to
     * a multiple of the world, each partition's int4 bytes whole (DeepSpeed asserts
     * elems % (2 world) == 0, where a half byte never arises). */
    const double per_part = ceil(fmax(world, ceil(elems / hidden)) / world);
    q.groups = per_part * world;
    q.intra_bytes = world * (ceil(elems / world / 2) + 4 * per_part);
    q.inter_bytes = q.intra_bytes / local;
    q.work_bytes = 2 * q.intra_bytes + q.inter_bytes;
    q.output_bytes = 0;
    qgz_kernels(&q, elems, grad_bytes, local);
    return q;
}

gboolean zp_zeropp_qgz_across_nodes(const ZpPlan *plan)
{
    return plan->dp / node_ranks(plan) > 1;
}

gboolean zp_zeropp_qgz_quantizes(const ZpPlan *plan, uint64_t elems, gboolean matrix)
{
    return matrix && elems % (2 * (uint64_t)plan->dp) == 0;
}

ZpQgz zp_zeropp_qgz_tensor(const ZpPlan *plan, double elems, double hidden, double grad_bytes)
{
    const double world = plan->dp, local = node_ranks(plan);
    ZpQgz q;
    /* all_to_all_quant_reduce: intra_quant_group = max(shape[0], shape[1], world),
     * inter_quant_group = intra_quant_group // local_world_size; pt_binding.cpp
     * ds_swizzle_quant and quantized_reduction allocate that many fp32 scales each
     * (Symmetric: one a group) beside numel / 2 and numel / (2 local) int4 bytes. */
    q.groups = fmax(fmax(elems / hidden, hidden), world);
    q.intra_bytes = elems / 2 + 4 * q.groups;
    q.inter_bytes = elems / (2 * local) + 4 * floor(q.groups / local);
    /* dequantize's output and the sums over its chunks are fp16, 2 bytes, whatever the
     * gradients' dtype (csrc/quantization/pt_binding.cpp dequantize allocates kFloat16 unless
     * instantiated for float) */
    const double fp16 = 2, slice_bytes = elems / world * fp16;
    q.work_bytes = 2 * q.intra_bytes + 2 * q.inter_bytes + elems / local * fp16 + slice_bytes;
    q.output_bytes = slice_bytes;
    qgz_kernels(&q, elems, grad_bytes, local);
    return q;
}
