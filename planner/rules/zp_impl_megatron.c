/* zp_impl_megatron: Megatron-Core's data parallelism as its source does it (NVIDIA/Megatron-LM
 * megatron/core/distributed/{distributed_data_parallel,param_and_grad_buffer}.py,
 * megatron/core/optimizer/{optimizer,distrib_optimizer}.py, megatron/training/arguments.py):
 * stage 0 is DistributedDataParallel with the mixed-precision optimizer
 * (Float16OptimizerWithFloat16Params), stage 1 the same with --use-distributed-optimizer. */
#include "zp_impl.h"
#include "zp_util.h"

#include <math.h>

/* Megatron-Core's DistributedDataParallel wraps every optimizer: the states are replicated
 * (stage 0) or sharded by the distributed optimizer, ZeRO-1 over the fp32 master weights and
 * Adam's moments (stage 1). Its gradients stay whole in the main_grad buffer either way. */
static gboolean mg_has_stage(int stage)
{
    return stage == 0 || stage == 1;
}

/* param_and_grad_buffer.py _ParamAndGradBucketGroup.start_grad_sync: reduce-scatter of each
 * bucket with the distributed optimizer, all-reduce without it. */
static ZpCollKind mg_grad_collective(const ZpPlan *plan)
{
    return plan->zero.stage == 1 ? ZP_COLL_REDUCE_SCATTER : ZP_COLL_ALLREDUCE;
}

/* distributed_data_parallel.py DistributedDataParallel.__init__ (_allocate_buffers_for_
 * parameters): grad_dtype = torch.float if ddp_config.grad_reduce_in_fp32 else param.dtype.
 * The buffer is kept, accumulated and reduced in that dtype, the plan's reduce dtype
 * (mg_plan_defaults makes it fp32 where Megatron does). */
static double mg_grad_bytes(const ZpPlan *plan)
{
    return zp_plan_reduce_bytes(plan);
}

/* Megatron's defaults where DeepSpeed's differ:
 * - training/arguments.py validate_args: bf16 sets accumulate_allreduce_grads_in_fp32 (the
 *   DDP config's grad_reduce_in_fp32): "bfloat16 requires gradient accumulation and
 *   all-reduce to be done in fp32"; fp16 keeps its 16-bit main_grad;
 * - distributed_data_parallel.py __init__: bucket_size = max(40000000, 1000000 * dp) elements
 *   (larger buckets at large dp keep the ring's chunks bandwidth-bound);
 * and --overlap-grad-reduce off unless asked for, as overlap_comm is at stages 0-1. */
static void mg_plan_defaults(ZpPlan *plan)
{
    if (plan->precision == ZP_PREC_BF16 && plan->reduce_dtype == ZP_REDUCE_GRAD)
        plan->reduce_dtype = ZP_REDUCE_FP32;
    plan->zero.reduce_bucket_size = fmax(4e7, 1e6 * plan->dp);
}

static uint64_t pad_up(uint64_t n, uint64_t divisor)
{
    return (n + divisor - 1) / divisor * divisor;
}

/* Whether tensor i is the stage's shared embedding weight: with a tied head under a pipeline
 * (LanguageModule.setup_embeddings_and_output_layer sets shared_embedding only when the
 * pipeline has more than one stage) the first stage's word embedding (unit 0's first tensor,
 * wte) and the last stage's output-layer copy of it (what unit L + 1 holds beyond its own
 * tensors, zp_impl_tensors: this rank's vocabulary rows). */
static gboolean mg_shared_embedding(const ZpSchedule *s, const ZpImplTensor *t, guint n,
                                    guint i)
{
    const int L = (int)s->model.layers;
    if (zp_plan_pp(&s->plan) == 1 || !s->model.tied_embeddings)
        return FALSE;
    if (t[i].unit == 0)
        return i == 0 || t[i - 1].unit != 0;
    const uint64_t rows = ((uint64_t)s->model.vocab + (uint64_t)s->plan.mp - 1) /
                          (uint64_t)s->plan.mp;
    return t[i].unit == L + 1 && s->unit_elems[0] == 0 && (i + 1 == n || t[i + 1].unit != L + 1) &&
           t[i].elems == rows * (uint64_t)s->model.hidden;
}

/* Closes bucket k at buffer element `end`, padded to `divisor` (0: none); returns where the
 * next bucket starts. */
static uint64_t close_bucket(ZpBucketSpec *k, uint64_t bucket_start, uint64_t end,
                             uint64_t divisor, double bytes, GArray *buckets)
{
    const uint64_t bucket_end = divisor ? pad_up(end, divisor) : end;
    k->bytes = (double)(bucket_end - bucket_start) * bytes;
    k->padded_elems = bucket_end - bucket_start;
    if (buckets)
        g_array_append_val(buckets, *k);
    return bucket_end;
}

/* param_and_grad_buffer.py _ParamAndGradBuffer.__init__: parameters are laid out in reverse
 * (roughly backward order); with the distributed optimizer each parameter starts at a
 * multiple of 64 elements (_pad_start_of_param_if_needed) and each bucket ends at a multiple
 * of lcm(dp, 128) (_pad_end_of_bucket_if_needed, pad_buckets_for_high_nccl_busbw off), so
 * that every rank's shard is equal. A bucket is closed once it holds bucket_size elements or
 * more (the parameter that crosses the size stays in it); without overlap_grad_reduce
 * bucket_size is None (distributed_data_parallel.py: one bucket). With the distributed
 * optimizer the shared embedding weight (mg_shared_embedding) is a bucket of its own: the one
 * before it is closed and its own closed after it (_does_param_require_new_bucket, "so that
 * the first and last pipeline stage partition optimizer state for the shared embedding
 * parameters the same way across DP replicas, allowing the DP reduce-scatter to be before the
 * embedding all-reduce"). Fills `buckets` (may be NULL) and returns the buffer's elements,
 * padding included. */
uint64_t zp_impl_megatron_layout(const ZpSchedule *s, GArray *buckets, uint64_t *tensor_start)
{
    const ZpPlan *p = &s->plan;
    const gboolean dist = p->zero.stage == 1;
    const double limit = p->zero.overlap_comm ? p->zero.reduce_bucket_size : INFINITY;
    const uint64_t dp = (uint64_t)p->dp;
    const uint64_t end_divisor = dp / zp_gcd_u64(dp, 128) * 128;
    const double bytes = zp_plan_reduce_bytes(p);
    GArray *tensors = zp_impl_tensors(s);
    const ZpImplTensor *t = (const ZpImplTensor *)tensors->data;
    uint64_t start = 0, bucket_start = 0, end = 0;
    ZpBucketSpec k = {0};
    gboolean open = FALSE;
    const uint64_t divisor = dist ? end_divisor : 0;
    for (int i = (int)tensors->len - 1; i >= 0; i--) {
        start = dist ? pad_up(start, 64) : start;
        const gboolean alone = dist && mg_shared_embedding(s, t, tensors->len, (guint)i);
        if (alone && open) {
            bucket_start = start = close_bucket(&k, bucket_start, start, divisor, bytes, buckets);
            open = FALSE;
        }
        end = start + t[i].elems;
        if (tensor_start)
            tensor_start[i] = start;
        if (!open) {
            /* Buckets are views of the main_grad buffer, reduced in place: no buffer of
             * their own (the schedule's bypass at stages 0-1). */
            k = (ZpBucketSpec){t[i].offset, t[i].offset + t[i].elems, 0, t[i].unit, t[i].unit,
                               t[i].unit, -1, TRUE, 0, 0, FALSE};
            open = TRUE;
        }
        k.lo = t[i].offset;
        k.low_unit = k.launch_unit = t[i].unit;
        k.n_items++;
        start = end;
        if ((double)(end - bucket_start) >= limit || i == 0 || alone) {
            bucket_start = start = end = close_bucket(&k, bucket_start, end, divisor, bytes,
                                                      buckets);
            open = FALSE;
        }
    }
    g_array_unref(tensors);
    return end;
}

/* Adds to pad[r] the elements of the gap [lo, hi) of bucket [start, end) that fall in dp
 * rank r's shard of it (1/dp of the bucket, rank-major). */
static void add_gap(uint64_t lo, uint64_t hi, uint64_t start, uint64_t end, uint64_t dp,
                    uint64_t *pad)
{
    if (lo >= hi)
        return;
    const uint64_t shard = (end - start) / dp;
    for (uint64_t r = (lo - start) / shard; r < dp && start + r * shard < hi; r++)
        pad[r] += MIN(hi, start + (r + 1) * shard) - MAX(lo, start + r * shard);
}

/* The padding each dp rank's shards hold with the distributed optimizer: the gaps before
 * each parameter's padded start and at each bucket's padded end, as they fall in the ranks'
 * 1/dp of each bucket (pad: dp entries, zeroed by the caller). */
static void mg_rank_padding(const ZpSchedule *s, uint64_t *pad)
{
    const uint64_t dp = (uint64_t)s->plan.dp;
    GArray *buckets = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    GArray *tensors = zp_impl_tensors(s);
    uint64_t *at = g_new0(uint64_t, MAX(tensors->len, 1));
    zp_impl_megatron_layout(s, buckets, at);
    const ZpImplTensor *t = (const ZpImplTensor *)tensors->data;
    uint64_t start = 0, end = 0, cursor = 0;
    guint k = 0;
    if (buckets->len)
        end = g_array_index(buckets, ZpBucketSpec, 0).padded_elems;
    for (int i = (int)tensors->len - 1; i >= 0; i--) { /* the buffer's order */
        while (at[i] >= end && k + 1 < buckets->len) {
            add_gap(cursor, end, start, end, dp, pad);
            start = cursor = end;
            end += g_array_index(buckets, ZpBucketSpec, ++k).padded_elems;
        }
        add_gap(cursor, at[i], start, end, dp, pad);
        cursor = at[i] + t[i].elems;
    }
    if (buckets->len)
        add_gap(cursor, end, start, end, dp, pad);
    g_free(at);
    g_array_unref(tensors);
    g_array_unref(buckets);
}

/* distrib_optimizer.py _build_model_gbuf_param_range_map: each parameter's range is
 * intersected with the rank's range of its bucket (gbuf_world_range, 1/dp of the padded
 * bucket), and _build_model_and_main_param_groups makes one fp32 shard_main_param of each
 * intersection (shard_model_param.clone().float()), which Adam's exp_avg and exp_avg_sq
 * follow: a rank's optimizer holds its shard less the padding in it, which differs from rank
 * to rank (the bucket's end padding falls in the last ranks' shards). Stage 0 has no padding
 * and holds every parameter (zp_impl_opt_elems). */
static uint64_t mg_rank_opt_elems(const ZpSchedule *s, int rank)
{
    const int dp = s->plan.dp;
    uint64_t *pad = g_new0(uint64_t, dp);
    mg_rank_padding(s, pad);
    uint64_t least = pad[0];
    for (int r = 1; r < dp; r++)
        least = MIN(least, pad[r]);
    const uint64_t own = rank >= 0 && rank < dp ? pad[rank] : least;
    g_free(pad);
    return s->partition_elems - own;
}

/* _ParamAndGradBucketGroup.register_grad_ready: a bucket's reduction is issued
 * (start_grad_sync) once every parameter in it has its gradient, i.e. after the backward of
 * the unit holding its lowest tensor (launch_unit; the schedule launches after a unit's
 * whole backward at stages 0-1). Without overlap_grad_reduce the one bucket is reduced by
 * finish_grad_sync after the backward. */
static void mg_plan_buckets(const ZpSchedule *s, GArray *buckets)
{
    zp_impl_megatron_layout(s, buckets, NULL);
}

/* param_and_grad_buffer.py _ParamAndGradBuffer.__init__: with the distributed optimizer
 * param_data is allocated beside grad_data with the same numel, padding included
 * (torch.zeros(self.numel, dtype=self.param_dtype)), and each rank's shard is 1/dp of each
 * bucket of it (shard_buffer); without it there is no padding (numel == numel_unpadded). */
static uint64_t mg_flat_elems(const ZpSchedule *s)
{
    return zp_impl_megatron_layout(s, NULL, NULL);
}

/* No bucket buffers: each bucket is a view of the main_grad buffer (_ParamAndGradBucket
 * grad_data). */
static int mg_bucket_buffers(const ZpPlan *plan, double *elems)
{
    (void)plan;
    *elems = 0;
    return 0;
}

static gboolean mg_concat_copy(const ZpPlan *plan, const ZpBucketSpec *k)
{
    (void)plan, (void)k;
    return FALSE;
}

/* The main_grad buffer: every gradient, with the distributed optimizer's padding (mg_layout),
 * kept for the whole run (_ParamAndGradBuffer.grad_data, allocated once in __init__). */
static double mg_grad_state_elems(const ZpSchedule *s)
{
    return (double)zp_impl_megatron_layout(s, NULL, NULL);
}

/* The step's copies: optimizer.py Float16OptimizerWithFloat16Params.
 * _copy_model_grads_to_main_grads sets main_param.grad = model_param.main_grad.float(), and
 * distrib_optimizer.py DistributedOptimizer._copy_model_grads_to_main_grads
 * shard_main_param.grad = shard_model_grad.float(): an fp32 copy of the gradients the rank
 * steps (all of them, or its shard) where main_grad is 16-bit; none where it is fp32
 * (.float() of an fp32 tensor is the tensor itself). Kept through the optimizer. */
static double mg_step_grad_bytes(const ZpPlan *plan, double elems)
{
    const gboolean mixed = plan->precision != ZP_PREC_FP32;
    return mixed && mg_grad_bytes(plan) < 4.0 ? elems * 4.0 : 0.0;
}

static void mg_step_buffers(const ZpSchedule *s, GArray *buffers)
{
    /* per parameter range, as the master (the most any rank holds) */
    const double bytes = mg_step_grad_bytes(&s->plan, (double)zp_impl_opt_elems(s, -1));
    if (bytes > 0) {
        ZpStepBuffer fp32 = {ZP_MEM_WORKSPACE, bytes, FALSE};
        g_array_append_val(buffers, fp32);
    }
}

/* The closed form: no bucket or gather buffers (views of the contiguous buffers; the
 * distributed optimizer's all-gather writes into param_data in place,
 * start_param_sync's all_gather_into_tensor of each bucket's shard), the step's fp32 copy. */
static void mg_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    const double psi = (double)zp_model_param_count(model) / plan->mp;
    r->reduce_bucket_bytes = 0;
    r->allgather_bucket_bytes = 0;
    r->step_buffer_bytes = mg_step_grad_bytes(plan, plan->zero.stage == 1 ? psi / plan->dp : psi);
}

const ZpImpl zp_impl_megatron = {
    .kind = ZP_IMPL_MEGATRON,
    .name = "megatron",
    .has_stage = mg_has_stage,
    .stages = "stages 0 (DistributedDataParallel) and 1 (--use-distributed-optimizer)",
    .grad_bytes = mg_grad_bytes,
    /* megatron/core/distributed/finalize_model_grads.py finalize_model_grads: each chunk's
     * finish_grad_sync (the DP reductions, waited for), then _allreduce_embedding_grads ->
     * _allreduce_word_embedding_grads all-reduces the shared weight's whole main_grad over
     * the embedding group (parallel_state's first and last pipeline stage); the optimizer
     * step follows. */
    .tied_sync_after_reduction = TRUE,
    .plan_defaults = mg_plan_defaults,
    .selective_recompute = TRUE,
    /* megatron/p2p_communication.py _communicate: with scatter_gather_tensors_in_pipeline
     * (arguments.py: on unless --no-scatter-gather-tensors-in-pipeline) each tensor rank sends
     * split_tensor_into_1d_equal_chunks of the tensor and the receiver rebuilds it with
     * gather_split_1d_tensor (an all-gather over the tensor group); overridden under
     * sequence parallelism, whose tensors are split already. */
    .p2p_scatter_gather = TRUE,
    .grad_collective = mg_grad_collective,
    .plan_buckets = mg_plan_buckets,
    .bucket_buffers = mg_bucket_buffers,
    .concat_copy = mg_concat_copy,
    /* distrib_optimizer.py: the updated shard is copied into param_data and all-gathered in
     * place (start_param_sync). */
    .post_step_gather_buffer = FALSE,
    /* distrib_optimizer.py step_with_ready_grads -> start_param_sync of each bucket group
     * (param_and_grad_buffer.py: all_gather_into_tensor of the bucket's param_data shard) */
    .param_gather_by_bucket = TRUE,
    .flat_elems = mg_flat_elems,
    /* No stage 3 (has_stage): the stage-3 rules are never asked; the shared unit-level ones
     * stand for them. */
    .persistent = zp_impl_persistent_units,
    .gather_bound_elems = zp_impl_unit_gather_bound,
    .grad_state_elems = mg_grad_state_elems,
    .step_buffers = mg_step_buffers,
    .residual_buffers = mg_residual,
    .rank_opt_elems = mg_rank_opt_elems,
    .zero_knobs = 1u << ZP_KNOB_REDUCE_BUCKET,
};
