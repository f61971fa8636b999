/* zp_build_step: one micro-step's compute in the schedule — forward, head and backward, block
 * by block or module by module, with activations kept and gradients handed on. */
#include "zp_build.h"
#include "zp_cost_kernels.h"

/* Stage 3: a step's gathers, as fetch_sub_module issues them; deps gets what its compute waits
 * for. */
static void step_gathers(Builder *b, int pos, int step, int micro, GArray *deps)
{
    const int key = zp_build_step_key(pos, step);
    zp_build_issue_gathers(b, key, micro, TRUE);
    zp_build_gathers_used_at(b, key, micro, deps);
    zp_build_issue_gathers(b, key, micro, FALSE);
}

/* A step begins (inline: two or three a block op, and nothing more below stage 3). */
G_ALWAYS_INLINE static inline void step_begin(Builder *b, int pos, int step, int micro,
                                              GArray *deps)
{
    /* An array without clear function or terminator (zp_sched_build): emptied by its length,
     * as g_array_set_size does, without its call and g_array_remove_range's (plan --3d
     * gpt-1t/4096: 307,716 of them, 18 M instructions) */
    deps->len = 0;
    b->step = step;
    if (b->s->plan.zero.stage == 3)
        step_gathers(b, pos, step, micro, deps);
}

G_ALWAYS_INLINE static inline void position_begin(Builder *b, int pos, int micro, GArray *deps)
{
    step_begin(b, pos, 0, micro, deps);
}

/* After the position's last step: what that step releases (release_sub_module). */
static void position_end(Builder *b, int pos, int micro)
{
    g_array_index(b->pos_last_op, uint32_t, pos) = b->last_compute;
    if (b->s->plan.zero.stage == 3)
        zp_build_free_gathers(b, zp_build_step_key(pos, b->step), micro);
}

/* A block op's cost split over its modules by their kernels' shares (zp_cost_kernel_shares):
 * FLOPs, fused-attention FLOPs and memory-bound bytes, so that the modules' ops sum to the
 * block's; each keeps the block's typical GEMM (the efficiency the block's time has), so that
 * their times sum to its time too. */
static void module_costs(Builder *b, ZpComputeKind kind, Cost whole, Cost parts[ZP_MOD_N])
{
    if (!b->block_shares_set[kind]) {
        zp_cost_kernel_shares(&b->s->model, &b->s->plan, kind, NULL, NULL, &b->block_shares[kind]);
        b->block_shares_set[kind] = TRUE;
    }
    const ZpModuleShares sh = b->block_shares[kind];
    if (b->varied_blocks) {
        /* A block of widths of its own (zp_build_unit_block_cost): the shares are the uniform
         * block's kernels', so its attention and its other FLOPs are split apart, each by its
         * own share (the uniform block's FLOPs less its attention's, module by module), and
         * a module never gets more attention FLOPs than FLOPs. */
        const Cost uniform = zp_build_block_forward_cost(b->s);
        double other[ZP_MOD_N], sum = 0;
        for (int m = 0; m < ZP_MOD_N; m++) {
            other[m] = MAX(0.0, sh.flops[m] * uniform.flops - sh.attn_flops[m] * uniform.attn_flops);
            sum += other[m];
        }
        for (int m = 0; m < ZP_MOD_N; m++) {
            const double attn = whole.attn_flops * sh.attn_flops[m];
            parts[m] = (Cost){(whole.flops - whole.attn_flops) * (sum > 0 ? other[m] / sum : 0.0) +
                                  attn,
                              whole.gemm_flops, attn, whole.mem_bytes * sh.accesses[m]};
        }
        return;
    }
    for (int m = 0; m < ZP_MOD_N; m++)
        parts[m] = (Cost){whole.flops * sh.flops[m], whole.gemm_flops,
                          whole.attn_flops * sh.attn_flops[m], whole.mem_bytes * sh.accesses[m]};
}

/* A block's cost (zp_build_unit_block_cost), worked out once a build where every block is
 * alike (no experts, no latent attention: then it depends on the model and plan alone).
 * Inlined: a call returning the cost through memory was 30 instructions a block op. */
G_ALWAYS_INLINE static inline Cost block_cost(Builder *b, int unit, ZpComputeKind kind)
{
    if (b->varied_blocks)
        return zp_build_unit_block_cost(b->s, unit, kind);
    if (!b->block_cost_set[kind]) {
        b->block_cost[kind] = zp_build_unit_block_cost(b->s, unit, kind);
        b->block_cost_set[kind] = TRUE;
    }
    return b->block_cost[kind];
}

/* A block's activations (zp_build_unit_act_bytes): the uniform block's where blocks are alike
 * (Builder.varied_blocks), without a call a block; likewise the experts' entry points
 * (zp_build_moe_forward and the rest), which have nothing to do there, are not called. */
static inline double unit_act_bytes(const Builder *b, int l, const Activations *a)
{
    return b->varied_blocks ? zp_build_unit_act_bytes(b, l, a->act_bytes) : a->act_bytes;
}

/* Whether module m ends with one of Megatron's tensor-parallel sums: the row-parallel proj and
 * fc2 in forward, the column-parallel fc1 and qkv (their input gradients) in backward. */
static gboolean module_sums(int m, gboolean backward)
{
    return backward ? m == ZP_MOD_FC1 || m == ZP_MOD_QKV : m == ZP_MOD_PROJ || m == ZP_MOD_FC2;
}

/* A block's forward, recompute or backward at position pos, its first step's gathers begun
 * and its dependencies in deps: one op, or under module compute (a backward under
 * zp_impl_module_backward) one per module (the positions' steps, zp_impl.h), each after its
 * own gathers (fetch_sub_module) and releasing what the step before it used first
 * (release_sub_module); the position's last step's release is position_end's. A reducing
 * backward (`launched` not NULL) hands its gradients on (zp_build_hand_on) and launches, after
 * each module's op, the buckets that module's gradients launch. */
static void block_compute(Builder *b, ZpComputeKind kind, int l, int micro, int pos, Cost cost,
                          GArray *deps, GArray *launched)
{
    const gboolean backward = kind == ZP_COMP_BLOCK_BWD;
    if (!b->module_forward && !(backward && b->module_backward)) {
        if (launched)
            zp_build_hand_on(b, l, -1, micro, deps);
        zp_build_emit_block_op(b, kind, l, micro, &cost, (uint32_t *)deps->data, deps->len,
                               zp_build_block_tp_sums(b, l));
        return;
    }
    Cost parts[ZP_MOD_N];
    module_costs(b, kind, cost, parts);
    for (int k = 0; k < ZP_POS_STEPS; k++) {
        const int m = zp_step_module(backward, k);
        if (k > 0) {
            if (b->s->plan.zero.stage == 3)
                zp_build_free_gathers(b, zp_build_step_key(pos, k - 1), micro);
            step_begin(b, pos, k, micro, deps);
        }
        if (launched)
            zp_build_hand_on(b, l, m, micro, deps);
        b->module_step = k;
        const uint32_t op =
            zp_build_emit_compute(b, kind, l, micro, parts[m], (uint32_t *)deps->data, deps->len);
        b->module_step = -1;
        g_array_index(b->s->ops, ZpOp, op).module = (uint8_t)(m + 1);
        if (b->s->plan.mp > 1 && module_sums(m, backward) &&
            (m == ZP_MOD_PROJ || m == ZP_MOD_QKV || zp_build_moe_mlp_sums(b->s, l)))
            zp_build_tp_sums(b, l, micro, 1);
        if (launched)
            zp_build_launch_buckets(b, l, m, micro, launched);
    }
}

/* Whether this micro-step's block ops may be written in one pass each (Builder.blocks_direct):
 * no p2p_sync exchange pending (a compute op then waits for a second send) and no overlapped
 * parameter gather to wait for (micro-step 0's, zp_build_wait_param_gathers). */
static inline gboolean blocks_direct(const Builder *b, int micro)
{
    return b->blocks_direct && b->recv_key_sync < 0 &&
           !(micro == 0 && b->s->plan.overlap_param_gather);
}

void zp_build_forward(Builder *b, int micro, Activations *a, GArray *deps, Range r)
{
    const ZpSchedule *s = b->s;
    const int L = (int)s->model.layers;
    const gboolean ckpt = s->plan.checkpoint;
    if (r.lo == 0) {
        position_begin(b, zp_pos_fwd(0), micro, deps);
        zp_build_wait_param_gathers(b, 0, micro);
        zp_build_emit_compute(b, ZP_COMP_EMBED_FWD, 0, micro, zp_build_embed_cost(s),
                              (uint32_t *)deps->data, deps->len);
        if (s->plan.mp > 1) /* VocabParallelEmbedding sums its rows' lookups */
            zp_build_tp_sums(b, 0, micro, 1);
        position_end(b, zp_pos_fwd(0), micro);
    }
    const gboolean direct = blocks_direct(b, micro);
    for (int l = MAX(r.lo, 1); l <= MIN(r.hi - 1, L); l++) {
        position_begin(b, zp_pos_fwd(l), micro, deps);
        if (direct) {
            const Cost cost = block_cost(b, l, ZP_COMP_BLOCK_FWD);
            if (zp_build_emit_block_kept(
                    b, ZP_COMP_BLOCK_FWD, l, micro,
                    ckpt ? ZP_MEM_CHECKPOINTS : ZP_MEM_ACTIVATIONS,
                    ckpt ? a->rule.gpu_bytes : a->act_bytes,
                    zp_build_act_slot(b, ckpt ? a->ckpt : a->act, micro, l), &cost,
                    zp_build_block_tp_sums(b, l))) {
                position_end(b, zp_pos_fwd(l), micro);
                continue;
            }
        }
        if (ckpt) {
            zp_build_checkpoint_boundary(b);
            zp_build_keep_checkpoint(b, l, micro, a, deps);
        } else {
            uint32_t alloc = zp_build_emit_alloc(
                b, ZP_MEM_ACTIVATIONS, unit_act_bytes(b, l, a), l, micro,
                zp_build_act_slot(b, a->act, micro, l), &b->last_compute, 1);
            zp_build_put_dep(b, deps, alloc);
        }
        zp_build_wait_param_gathers(b, l, micro);
        block_compute(b, ZP_COMP_BLOCK_FWD, l, micro, zp_pos_fwd(l),
                      block_cost(b, l, ZP_COMP_BLOCK_FWD), deps, NULL);
        if (b->varied_blocks) /* a sparse block's experts (none without: not asked) */
            zp_build_moe_forward(b, l, micro);
        if (ckpt)
            zp_build_checkpoint_boundary(b);
        position_end(b, zp_pos_fwd(l), micro);
    }
}

/* ZpImpl tied_grad_waits: when the tied head's wte gradient is reduced through a held bucket
 * buffer, the head writes it into a buffer of its own (wte's elements in the gradients'
 * dtype, kept until the embedding's backward has added to it and it is copied into the
 * bucket). A bucket buffer of wte's own is already allocated at the head. */
static void alloc_tied_grad(Builder *b, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    if (!b->impl->tied_grad_waits || !s->model.tied_embeddings || !zp_build_unit_held(b, 0))
        return;
    const uint64_t wte = s->unit_offset[0];
    for (guint i = b->unit_first[0]; i <= b->unit_last[0] && i < b->buckets->len; i++)
        if (zp_build_bucket(b, i)->spec.lo <= wte && wte < zp_build_bucket(b, i)->spec.hi &&
            zp_build_own_buffer(b, zp_build_bucket(b, i)))
            return;
    if (b->tied_grad_bytes == 0) { /* wte's share, the same every micro-step */
        GArray *tensors = zp_impl_tensors(s);
        b->tied_grad_bytes =
            (double)g_array_index(tensors, ZpImplTensor, 0).elems * s->elem_bytes;
        g_array_unref(tensors);
    }
    const uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_BUCKETS, b->tied_grad_bytes, 0, micro,
                                               &b->tied_grad, &b->last_compute, 1);
    zp_build_put_dep(b, deps, alloc);
}

/* The head output gradient's fp32 b s h bytes, kept from the head to its backward. */
static double head_grad_bytes(const ZpSchedule *s)
{
    return 4.0 * s->plan.micro_batch * (double)s->model.seq_len * (double)s->model.hidden;
}

/* Before micro-step `micro`'s first backward op: its kept head gradient goes back (freed). */
void zp_build_release_head_grad(Builder *b, int micro)
{
    if (b->head_grad[micro] < 0)
        return;
    const uint32_t free_op =
        zp_build_emit_free(b, ZP_MEM_WORKSPACE, head_grad_bytes(b->s), (int)b->s->model.layers + 1,
                           micro, b->head_grad[micro], b->last_compute);
    zp_build_sync_on(b, free_op);
    b->head_grad[micro] = -1;
}

/* The head (forward and backward in one op); `keep`: its output gradient is kept aside. */
void zp_build_head(Builder *b, int micro, gboolean reduce, gboolean keep, GArray *deps,
                   GArray *launched)
{
    const ZpSchedule *s = b->s;
    const int L = (int)s->model.layers;
    const Cost c = zp_build_head_cost(s);
    const double logits_bytes = 4.0 * s->plan.micro_batch * (double)s->model.seq_len *
                                (double)s->model.vocab / s->plan.mp;
    if (reduce || (zp_build_held_span(b) == ZP_HELD_FROM_FIRST && zp_plan_pp(&s->plan) == 1))
        zp_build_alloc_held_buckets(b, micro); /* a no-op once taken */
    position_begin(b, zp_pos_head(L), micro, deps);
    int logits;
    uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, logits_bytes, L + 1, micro, &logits,
                                         &b->last_compute, 1);
    zp_build_put_dep(b, deps, alloc);
    zp_build_take_unit_grads(b, L + 1, micro, deps);
    if (s->model.tied_embeddings) /* the tied LM head's wte gradient */
        zp_build_take_unit_grads(b, 0, micro, deps);
    if (reduce && s->plan.zero.stage >= 2) {
        zp_build_alloc_landing_buckets(b, L + 1, micro, deps);
        if (s->model.tied_embeddings) /* the tied LM head's wte gradient */
            zp_build_alloc_landing_buckets(b, 0, micro, deps);
        alloc_tied_grad(b, micro, deps);
    }
    if (reduce)
        zp_build_hand_on(b, L + 1, -1, micro, deps);
    zp_build_wait_param_gathers(b, L + 1, micro);
    zp_build_emit_compute(b, ZP_COMP_HEAD, L + 1, micro, c,
                          (uint32_t *)deps->data, deps->len);
    const uint32_t head_op = b->last_compute;
    zp_build_vocab_parallel_head(b, micro);
    const uint32_t freed[2] = {
        zp_build_emit_free(b, ZP_MEM_WORKSPACE, logits_bytes, L + 1, micro, logits, head_op),
        b->workspace_free};
    if (keep)
        zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, head_grad_bytes(s), L + 1, micro,
                            &b->head_grad[micro], freed, 2);
    position_end(b, zp_pos_head(L), micro);
    if (reduce)
        zp_build_launch_buckets(b, L + 1, -1, micro, launched);
}

void zp_build_backward(Builder *b, int micro, gboolean reduce, Activations *a, GArray *deps,
                       GArray *launched, Range r)
{
    const ZpSchedule *s = b->s;
    const int L = (int)s->model.layers;
    const gboolean ckpt = s->plan.checkpoint;
    const gboolean direct = !reduce && blocks_direct(b, micro);
    const gboolean selective = zp_build_selective(&s->plan);
    const Cost core_cost = selective ? zp_build_recompute_cost(s) : (Cost){0};
    for (int l = MIN(r.hi - 1, L); l >= MAX(r.lo, 1); l--) {
        int *act = zp_build_act_slot(b, a->act, micro, l);
        const double act_bytes = unit_act_bytes(b, l, a);
        /* The recompute has a position of its own (empty without checkpointing): an
         * implementation may gather for it and again for the backward. */
        position_begin(b, zp_pos_rec(L, l), micro, deps);
        gboolean written = FALSE;
        if (ckpt && direct) {
            const Cost cost = block_cost(b, l, ZP_COMP_BLOCK_FWD);
            written = zp_build_emit_block_kept(b, ZP_COMP_RECOMPUTE, l, micro, ZP_MEM_ACTIVATIONS,
                                               act_bytes, act, &cost, zp_build_block_tp_sums(b, l));
        }
        if (ckpt && !written) {
            zp_build_checkpoint_boundary(b);
            zp_build_regather_checkpoint(b, l, micro, a);
            uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_ACTIVATIONS, act_bytes, l, micro, act,
                                                 &b->last_compute, 1);
            zp_build_put_dep(b, deps, alloc);
            block_compute(b, ZP_COMP_RECOMPUTE, l, micro, zp_pos_rec(L, l),
                          block_cost(b, l, ZP_COMP_BLOCK_FWD), deps, NULL);
            if (b->varied_blocks) /* the recomputed forward's experts */
                zp_build_moe_forward(b, l, micro);
        }
        int core = -1; /* selective: core attention's recomputed tensors */
        if (selective && direct)
            written = zp_build_emit_block_kept(b, ZP_COMP_RECOMPUTE, l, micro,
                                               ZP_MEM_ACTIVATIONS, a->core_bytes, &core,
                                               &core_cost, 0);
        if (selective && !written) {
            uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_ACTIVATIONS, a->core_bytes, l, micro,
                                                 &core, &b->last_compute, 1);
            zp_build_put_dep(b, deps, alloc);
            zp_build_emit_compute(b, ZP_COMP_RECOMPUTE, l, micro, core_cost,
                                  (uint32_t *)deps->data, deps->len);
        }
        position_end(b, zp_pos_rec(L, l), micro);
        const int pos = zp_pos_bwd(L, l);
        position_begin(b, pos, micro, deps);
        if (reduce && s->plan.zero.stage >= 2)
            zp_build_alloc_landing_buckets(b, l, micro, deps);
        zp_build_take_unit_grads(b, l, micro, deps);
        const int returned = b->varied_blocks ? zp_build_moe_backward(b, l, micro, reduce) : -1;
        if (reduce) /* a bucket the experts' gradients do not fit (ZP_LAUNCH_EXPERTS) */
            zp_build_launch_buckets(b, l, ZP_LAUNCH_EXPERTS, micro, launched);
        const Cost cost = block_cost(b, l, ZP_COMP_BLOCK_BWD);
        /* blocks_direct: no experts' buffer returned, no re-gathered checkpoint, no
         * boundary's syncs */
        if (!(direct &&
              zp_build_emit_block_backward(b, l, micro, &cost, (uint32_t *)deps->data, deps->len,
                                           act_bytes, *act, a->core_bytes, core,
                                           a->rule.gpu_bytes,
                                           ckpt ? *zp_build_act_slot(b, a->ckpt, micro, l)
                                                : -1))) {
            block_compute(b, ZP_COMP_BLOCK_BWD, l, micro, pos, cost, deps,
                          reduce ? launched : NULL);
            if (returned >= 0)
                zp_build_moe_free_backward(b, l, micro, returned);
            if (ckpt)
                zp_build_checkpoint_boundary(b);
            zp_build_emit_free(b, ZP_MEM_ACTIVATIONS, act_bytes, l, micro, *act,
                               b->last_compute);
            if (core >= 0)
                zp_build_emit_free(b, ZP_MEM_ACTIVATIONS, a->core_bytes, l, micro, core,
                                   b->last_compute);
            if (ckpt && *zp_build_act_slot(b, a->ckpt, micro, l) >= 0)
                zp_build_emit_free(b, ZP_MEM_CHECKPOINTS,
                                   a->rule.regathered ? a->rule.full_bytes : a->rule.gpu_bytes,
                                   l, micro, *zp_build_act_slot(b, a->ckpt, micro, l),
                                   b->last_compute);
        }
        position_end(b, pos, micro);
        if (reduce)
            zp_build_launch_buckets(b, l, -1, micro, launched);
    }
    if (r.lo != 0)
        return;
    position_begin(b, zp_pos_embed_bwd(L), micro, deps);
    if (reduce && s->plan.zero.stage >= 2 && !s->model.tied_embeddings)
        zp_build_alloc_landing_buckets(b, 0, micro, deps); /* untied: wte's gradient starts here */
    zp_build_take_unit_grads(b, 0, micro, deps);
    if (reduce)
        zp_build_hand_on(b, 0, -1, micro, deps);
    zp_build_emit_compute(b, ZP_COMP_EMBED_BWD, 0, micro, zp_build_embed_cost(s),
                          (uint32_t *)deps->data, deps->len);
    if (b->tied_grad >= 0) {
        zp_build_emit_free(b, ZP_MEM_BUCKETS, b->tied_grad_bytes, 0, micro, b->tied_grad,
                           b->last_compute);
        b->tied_grad = -1;
    }
    position_end(b, zp_pos_embed_bwd(L), micro);
    if (reduce) {
        zp_build_launch_buckets(b, 0, -1, micro, launched);
        zp_build_moe_reduce_after_backward(b, micro);
        if (zp_build_held_span(b) != ZP_HELD_ALL_STEP)
            zp_build_free_held_buckets(b, micro, NONE);
        /* the engine's epilogue (stage3.py independent_gradient_partition_epilogue)
         * synchronises the reductions' stream: the host waits for the last of them */
        if (b->n_reduce_events > 0)
            b->reduce_gate = b->reduce_event[(b->n_reduce_events - 1) % 3];
        /* stage_1_and_2.py's epilogue synchronises the whole device (ZpImpl
         * epilogue_syncs_device): the host issues nothing more before the last reduction */
        if (b->n_reduce_events > 0 && b->impl->epilogue_syncs_device &&
            b->impl->epilogue_syncs_device(&b->s->plan))
            b->host_sync = b->reduce_event[(b->n_reduce_events - 1) % 3];
        b->n_reduce_events = 0;
    }
}
