/* zp_impl_fsdp2: PyTorch's FSDP2 (torch/distributed/fsdp/_fully_shard/, fully_shard) as
 * torchtitan runs it: each transformer block and the root wrapped, per-parameter DTensor
 * shards kept in the parameters' own dtype, MixedPrecisionPolicy's param and reduce dtypes.
 * Stage 3 is reshard_after_forward=True, stage 2 reshard_after_forward=False (stage 3's
 * shards, each block gathered once a micro-step and held to its backward). */
#include "zp_impl.h"

#include <math.h>

/* fully_shard shards every parameter; reshard_after_forward says whether a block's unsharded
 * parameters are freed after its forward (True: gathered again for backward, ZeRO-3) or kept
 * to its backward (False: ZeRO-2's memory, the gradients and optimizer still sharded). There
 * is no unsharded mode (replicate() is DDP). */
static gboolean fsdp2_has_stage(int stage)
{
    return stage == 2 || stage == 3;
}

/* _fsdp_param.py FSDPParam: the sharded parameter keeps the module's dtype (fp32, also under
 * bf16 or fp16 mixed precision) and its .grad the same (_fsdp_collectives.py foreach_reduce
 * casts the reduce-scatter output to orig_dtype and views the sharded gradients out of it):
 * the gradient state is 4 bytes an element whatever the precision. */
static double fsdp2_grad_bytes(const ZpPlan *plan)
{
    (void)plan;
    return 4.0;
}

/* _fsdp_collectives.py foreach_reduce: the unsharded gradients are copied
 * (foreach_reduce_scatter_copy_in, chunk_cat into world_size rows) into reduce_scatter_input,
 * a new buffer of the padded unit in the reduce dtype, before the reduce-scatter; only then
 * are they freed ("Only after the copy-in finishes can we free the gradients"). */
static gboolean fsdp2_concat_copy(const ZpPlan *plan, const ZpBucketSpec *k)
{
    (void)k;
    return plan->zero.stage == 3;
}

static int fsdp2_bucket_buffers(const ZpPlan *plan, double *elems)
{
    (void)plan;
    *elems = 0;
    return 0;
}

/* fully_shard(model) on the root makes the parameters no child's fully_shard owns (the
 * embeddings, the final norm, an untied head) one FSDPParamGroup
 * (torch/distributed/fsdp/_fully_shard/_fully_shard.py fully_shard: _get_managed_modules
 * skips the sharded children, _get_managed_states, one FSDPParamGroup(params, ...)), and a
 * group is unsharded by one call and reduced by one (_fsdp_param_group.py unshard ->
 * _fsdp_collectives.py foreach_all_gather over all its fsdp_params; post_backward ->
 * foreach_reduce over all of them): units 0 and L + 1, not adjacent in the flat layout, are
 * gathered and reduce-scattered together (on the plain reduce-scatter's path: not with qgZ
 * or an offloaded optimizer, whose slices the builder takes bucket by bucket). */
gboolean zp_impl_fsdp2_root_joined(const ZpSchedule *s)
{
    const int L = (int)s->model.layers;
    return s->plan.impl == ZP_IMPL_FSDP2 && s->plan.zero.stage == 3 && s->n_units == L + 2 &&
           s->unit_elems[0] > 0 && s->unit_elems[L + 1] > 0 &&
           !s->plan.zero.zero_quantized_gradients &&
           s->plan.zero.offload_optimizer.device == ZP_OFFLOAD_NONE;
}

/* FSDP's unit buckets, the root's two (unit L + 1's, launched at unit 0, then unit 0's) one
 * reduction. */
static void fsdp2_plan_buckets(const ZpSchedule *s, GArray *buckets)
{
    zp_impl_fsdp_plan_buckets(s, buckets);
    if (!zp_impl_fsdp2_root_joined(s) || buckets->len < 2)
        return;
    ZpBucketSpec *k = (ZpBucketSpec *)buckets->data;
    const guint last = buckets->len - 1;
    if (k[0].low_unit == s->n_units - 1 && k[last].top_unit == 0 && k[0].launch_unit == 0)
        k[last].joins_previous = TRUE;
}

/* FSDP's unit fetches, each as one all-gather of the unit's parameters padded one by one
 * (_fsdp_param.py: each parameter's dim 0 is padded to the world size, _get_dim0_padded_size)
 * into one output buffer (_fsdp_collectives.py foreach_all_gather: all_gather_output, the
 * coalesced call's flat buffer), copied out into each parameter's own unsharded tensor when
 * first waited for (foreach_all_gather_copy_out: alloc_all_gather_outputs, then
 * split_with_sizes_copy; the schedule's unpack) and freed then: for that moment the unit
 * is held twice. Each tensor's elements are padded to the group (a lower bound of dim-0
 * padding, which pads whole rows). */
/* reshard_after_forward=False (ZpZeroConfig fsdp2_no_reshard_after_forward):
 * _fsdp_param_group.py post_forward reshards only with a post_forward_mesh_info, which False
 * leaves None: _fsdp_init.py _get_post_forward_mesh_info), so each block's forward gather
 * is held to its backward; pre_backward's unshard finds the parameters unsharded
 * (FSDPParamGroup.unshard: "if self.is_unsharded: return  # no-op") and gathers nothing,
 * and post_backward reshards once the gradients are reduce-scattered. The block's forward fetch
 * is freed after its backward; its backward fetch goes. */
static void keep_to_backward(const ZpSchedule *s, GArray *units)
{
    const int L = (int)s->model.layers;
    guint kept = 0;
    for (guint i = 0; i < units->len; i++) {
        ZpFetch f = g_array_index(units, ZpFetch, i);
        const gboolean block = f.unit >= 1 && f.unit <= L;
        if (block && f.use_pos != zp_pos_fwd(f.unit))
            continue;
        if (block)
            f.free_pos = zp_pos_bwd(L, f.unit);
        g_array_index(units, ZpFetch, kept++) = f;
    }
    g_array_set_size(units, kept);
}

/* The root group's call: unit L + 1's tensors join unit 0's call (same trigger, use and
 * free: zp_impl_fsdp_plan_fetches adds them one after the other). */
static void join_root(const ZpSchedule *s, GArray *fetches)
{
    if (!zp_impl_fsdp2_root_joined(s))
        return;
    const int L = (int)s->model.layers;
    ZpFetch *f = (ZpFetch *)fetches->data;
    for (guint i = 1; i < fetches->len; i++)
        if (f[i].unit == L + 1 && f[i - 1].unit == 0 && f[i].trigger_pos == f[i - 1].trigger_pos)
            f[i].joins_previous = TRUE;
}

static void fsdp2_plan_fetches(const ZpSchedule *s, GArray *fetches)
{
    GArray *units = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    zp_impl_fsdp_plan_fetches(s, units);
    if (s->plan.zero.fsdp2_no_reshard_after_forward)
        keep_to_backward(s, units);
    GArray *tensors = zp_impl_tensors(s);
    const ZpImplTensor *t = (const ZpImplTensor *)tensors->data;
    guint *first = g_new0(guint, (gsize)s->n_units + 1); /* tensors of unit u: [first[u], first[u+1]) */
    for (guint i = 0; i < tensors->len; i++)
        first[t[i].unit + 1] = i + 1;
    for (int u = 1; u <= s->n_units; u++)
        first[u] = MAX(first[u], first[u - 1]);
    for (guint i = 0; i < units->len; i++) {
        const ZpFetch *f = &g_array_index(units, ZpFetch, i);
        for (guint k = first[f->unit]; k < first[f->unit + 1]; k++) {
            ZpFetch g = *f;
            g.offset = t[k].offset;
            g.elems = zp_mem_padded_elems(t[k].elems, (uint64_t)s->plan.dp);
            g.numel = t[k].elems;
            g.joins_previous = k > first[f->unit];
            g_array_append_val(fetches, g);
        }
    }
    g_free(first);
    g_array_unref(tensors);
    g_array_unref(units);
    join_root(s, fetches);
}

static void fsdp2_persistent(const ZpSchedule *s, GArray *ranges)
{
    (void)s, (void)ranges; /* fully_shard shards every parameter */
}

static double fsdp2_grad_state_elems(const ZpSchedule *s)
{
    return zp_impl_partition_grad_elems(s);
}

/* FSDP's unit terms, with the reduce-scatter's copy-in buffer beside the unit being reduced
 * (one unsharded unit in the reduce dtype). */
static void fsdp2_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    zp_impl_fsdp_residual(model, plan, r);
    if (plan->zero.stage == 3)
        r->reduce_bucket_bytes *= 2.0;
    /* reshard_after_forward=False: every block's gathered parameters live from its forward
     * to its backward, so at the turn from forward to backward all of them are held with the
     * root's (keep_to_backward). */
    if (plan->zero.fsdp2_no_reshard_after_forward && zp_model_has_architecture(model)) {
        const double block = (double)zp_model_unit_elems(model, 1) / plan->mp;
        const double root = ((double)zp_model_unit_elems(model, 0) +
                             (double)zp_model_unit_elems(model, (int)model->layers + 1)) /
                            plan->mp;
        const ZpStateBytes bytes = zp_plan_state_bytes(plan->precision, plan->optimizer);
        r->stage3_gathered_bytes = (root + (double)model->layers * block) * bytes.param_bytes;
    }
}

const ZpImpl zp_impl_fsdp2 = {
    .kind = ZP_IMPL_FSDP2,
    .name = "fsdp2",
    .has_stage = fsdp2_has_stage,
    .stages = "stages 2 (reshard_after_forward=False) and 3 (reshard_after_forward=True)",
    .grad_bytes = fsdp2_grad_bytes,
    /* FSDPParam._init_sharded_param: the shard is a DTensor of the original parameter, the
     * optimizer's; FSDPParam.all_gather_inputs / _get_param_all_gather_inputs cast it to
     * param_dtype into the all-gather input (a transient copy of the shard). */
    .sharded_params_are_master = TRUE,
    /* Same all-gather and reduce-scatter points as FSDP1's: the root (embeddings, final
     * norm, head) is not resharded after forward (_fsdp_state.py _lazy_init: the root's
     * post_forward_mesh_info is None), each block is gathered one ahead in forward (the
     * implicit prefetch: the CPU issues the next module's all-gather on the all-gather stream
     * while the current one computes) and in backward (_fsdp_param_group.py's backward
     * prefetch of the next module), and reduce-scattered in its post-backward. */
    .grad_collective = zp_impl_fsdp_grad_collective,
    .plan_buckets = fsdp2_plan_buckets,
    .bucket_buffers = fsdp2_bucket_buffers,
    .concat_copy = fsdp2_concat_copy,
    .copy_held_to_next = TRUE,
    .post_step_gather_buffer = FALSE,
    .plan_fetches = fsdp2_plan_fetches,
    /* _fsdp_param_group.py wait_for_unshard calls foreach_all_gather_copy_out for every
     * call, whatever its parameter count: the output is copied into each parameter's own
     * unsharded tensor (split_with_sizes_copy), also for a group of one parameter. */
    .copy_out_single = TRUE,
    /* reshard_after_forward=int: _fsdp_param_group.py post_forward reshards each block to
     * its post-forward mesh (FSDPParam.to_sharded_post_forward: a new tensor of the rank's
     * 1/int of the unsharded parameter, copied from it), which pre_backward all-gathers and
     * frees (to_unsharded); the root is never resharded after forward. */
    .secondary_per_block = TRUE,
    .persistent = fsdp2_persistent,
    .unit_persistence = FALSE,
    .grad_state_elems = fsdp2_grad_state_elems,
    .step_buffers = zp_impl_no_step_buffers,
    .residual_buffers = fsdp2_residual,
    .gather_bound_elems = zp_impl_unit_gather_bound,
    .zero_knobs = 0,
};
