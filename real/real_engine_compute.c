/* real_engine_compute: the engine's allocs and frees (buffers by schedule id, buckets mapped
 * onto gradients) and compute ops (blocks forward and backward, the head, the optimizer, qwZ). */
#include "real_engine_internal.h"
#include "real_engine.h"
#include "real_engine_ds.h"
#include "real_offload.h"
#include "zp_impl.h"
#include "zp_offload.h"
#include "real_data.h"
#include "real_gpt.h"
#include "real_pipe.h"
#include "real_zeropp.h"
#include "real_zeror.h"
#include "zp_zeropp.h"
#include "zp_zeror.h"
#include "zp_mem.h"
#include "zp_util.h"

#include <string.h>

#include <string.h>

/* ---- alloc and free ---------------------------------------------------------------------- */

/* A new buffer of `bytes` for the gradients of unit u from its start: the unit's tensors are
 * declared fresh, so backward's first write stores them (no zeroing pass, as autograd's
 * into a .grad that is None), and only what lies beyond them, the padding that the
 * reductions and the step read, is zeroed. */
static void fresh_unit_grads(RealEngine *e, int u, RealBf16 *at, uint64_t bytes)
{
    const uint64_t used = MIN(bytes, e->s->unit_elems[u] * sizeof(RealBf16));
    /* a sparse unit's experts are not in its buffer: their own op stores them */
    real_gpt_grads_fresh(e->gpt, u, ALL_TENSORS & ~real_engine_moe_expert_tensors(e, u));
    e->be->fill(e->be, (char *)at + used, 0, bytes - used);
}

/* The units a landing bucket covers and, for stage 3, each unit's offset inside it (units
 * padded), their gradients fresh; the bucket's bytes that no unit covers are zeroed. */
static void map_landing_bucket(RealEngine *e, int id, uint64_t bytes)
{
    const ZpSchedule *s = e->s;
    const size_t b2 = sizeof(RealBf16);
    RealBf16 *bucket = e->buffers[id];
    uint64_t offset = 0, end = 0; /* end: bytes covered so far, in order */
    for (int u = 0; u < s->n_units; u++) {
        if (s->unit_offset[u] < e->bucket_lo[id] || s->unit_offset[u] >= e->bucket_hi[id])
            continue;
        const uint64_t at = e->stage == 3 ? offset : s->unit_offset[u] - e->bucket_lo[id];
        const uint64_t room = e->stage == 3 ? unit_padded(e, u) : s->unit_elems[u];
        const uint64_t from = MIN(at * b2, bytes), to = MIN((at + room) * b2, bytes);
        if (from > end)
            e->be->fill(e->be, (char *)bucket + end, 0, from - end);
        e->unit_grads[u] = bucket + at;
        fresh_unit_grads(e, u, bucket + at, to - from);
        end = MAX(end, to);
        offset += unit_padded(e, u);
    }
    if (end < bytes)
        e->be->fill(e->be, (char *)bucket + end, 0, bytes - end);
}

static const RealBf16 *step_grads(const RealEngine *e);

/* DeepSpeed's step copies of the reduced partition (stage_1_and_2.py step): the flattened
 * 16-bit gradients, or their fp32 conversion, by the buffer's size; at stage 3 the fp32
 * gradient of a sub_group_size group (stage3.py _prepare_fp32_grad_for_sub_group), the first:
 * the schedule has one buffer of the largest group around one optimizer op. */
static void step_copy(RealEngine *e, void *dst, uint64_t bytes)
{
    const uint64_t part = e->s->partition_elems;
    const RealBf16 *grad = step_grads(e);
    if (bytes == part * sizeof(float) || e->stage == 3)
        e->be->bf16_to_f32(e->be, dst, grad, MIN(part, bytes / sizeof(float)));
    else
        e->be->copy(e->be, dst, grad, bytes);
}

/* Whether Pa splits each checkpoint over the tensor group (mp > 1). */
static gboolean pa_splits(const RealEngine *e)
{
    return e->ckpt_slice_bytes < real_gpt_checkpoint_bytes(&e->dims);
}

/* Bytes the engine needs for the buffer an alloc op asks for; 0 for the buffers the model
 * allocates itself (activations, logits), whose sizes the tracker measures instead. */
static uint64_t needed_bytes(const RealEngine *e, const ZpOp *op)
{
    const size_t b2 = sizeof(RealBf16);
    switch (op->sub) {
    case ZP_MEM_GATHERED_PARAMS: /* a unit, or with real_engine_ds one tensor it checks */
        return e->ds ? (uint64_t)op->bytes : unit_padded(e, op->unit) * b2;
    case ZP_MEM_CHECKPOINTS: /* Pa's slice kept in forward, or a whole block input */
        return op->bytes == (double)e->ckpt_slice_bytes ? e->ckpt_slice_bytes
                                                        : real_gpt_checkpoint_bytes(&e->dims);
    case ZP_MEM_BUCKETS:
        return (uint64_t)op->bytes; /* its size follows from the collective that uses it */
    case ZP_MEM_GRADS: /* real_engine_ds's grads_in_partition and copies, which it checks,
                        * or stage 1's (index_stage1_grads) */
        return e->ds || e->full_by_unit ? (uint64_t)op->bytes : 0;
    case ZP_MEM_WORKSPACE: /* the step's gradient copies (unit and micro-step -1) */
        return op->unit == -1 && op->micro == -1 ? (uint64_t)op->bytes : 0;
    default:
        return 0;
    }
}

/* Whether op `index` is one of qgZ's all-to-alls. */
static gboolean is_alltoall(const ZpSchedule *s, guint index)
{
    return index < s->ops->len && zp_sched_op(s, index)->kind == ZP_OP_COLLECTIVE &&
           zp_sched_op(s, index)->sub == ZP_COLL_ALLTOALL;
}

gboolean real_engine_do_alloc(RealEngine *e, guint index, const ZpOp *op, GError **error)
{
    gboolean experts = FALSE; /* a sparse block's all-to-all buffer, or its experts' gather */
    if (!real_engine_moe_alloc(e, index, op, &experts, error) || experts)
        return !experts || e->buffers[op->buffer] != NULL;
    if (op->buffer < 0) /* the step-long state's: DeepSpeed's persistent copies */
        return e->ds ? real_ds_state_op(e->ds, op,
                                        index + 1 < e->s->ops->len ? zp_sched_op(e->s, index + 1)
                                                                   : NULL,
                                        error)
                     : fail(error, "schedule op %u: an alloc of the step-long state outside "
                                   "DeepSpeed's stage 3", index);
    /* qwZ's int8 buffer: the workspace a quantize op follows (zp_sched's issue_gathers). */
    /* qgZ's int4 buffers likewise, the quantize op then followed by its all-to-all. */
    const ZpSchedule *s = e->s;
    gboolean handled = FALSE;
    if (e->fw && e->fw_ops->alloc && !e->fw_ops->alloc(e->fw, op, &handled, error))
        return FALSE;
    if (handled)
        return TRUE;
    if (op->sub == ZP_MEM_WORKSPACE && index + 1 < s->ops->len &&
        zp_sched_op(s, index + 1)->kind == ZP_OP_COMPUTE &&
        zp_sched_op(s, index + 1)->sub == ZP_COMP_QUANTIZE) {
        if (is_alltoall(s, index + 2))
            e->qgz_work = op->buffer, e->qgz_work_bytes = (uint64_t)op->bytes;
        return (e->buffers[op->buffer] = take(e, (uint64_t)op->bytes, op->sub, error)) != NULL;
    }
    const uint64_t need = needed_bytes(e, op);
    if (need == 0)
        return TRUE;
    if ((double)need != op->bytes)
        return fail(error, "schedule op %u: a %s buffer of %.0f bytes; the engine needs %" G_GUINT64_FORMAT,
                    index, zp_sched_mem_name(op->sub), op->bytes, need);
    if (!(e->buffers[op->buffer] = take(e, need, op->sub, error)))
        return FALSE;
    if (op->sub == ZP_MEM_GRADS && op->unit >= 0 && !e->ds) { /* a unit's gradients */
        e->unit_grads[op->unit] = e->buffers[op->buffer];
        fresh_unit_grads(e, op->unit, e->buffers[op->buffer], need);
    } else if (op->sub == ZP_MEM_GRADS) { /* read whole (real_engine_ds adds into its own) */
        e->be->fill(e->be, e->buffers[op->buffer], 0, need);
    }
    if (op->sub == ZP_MEM_CHECKPOINTS) /* Pa's slice in forward, or a whole input */
        (pa_splits(e) && need == e->ckpt_slice_bytes ? e->ckpt_slice
                                                     : e->ckpt_buffer)[slot(e, op->unit,
                                                                            op->micro)] = op->buffer;
    if (op->sub == ZP_MEM_BUCKETS && e->stage >= 2 && op->unit >= 0) {
        /* Stages 2-3: backward writes straight into the bucket (real_engine_ds maps its
         * tensors itself, zeroing the bucket where they land). */
        if (e->ds)
            e->be->fill(e->be, e->buffers[op->buffer], 0, need);
        else
            map_landing_bucket(e, op->buffer, need);
    }
    if (op->sub == ZP_MEM_WORKSPACE)
        step_copy(e, e->buffers[op->buffer], need);
    return TRUE;
}

gboolean real_engine_do_free(RealEngine *e, const ZpOp *op, GError **error)
{
    if (op->buffer < 0)
        return e->ds ? real_ds_state_op(e->ds, op, NULL, error)
                     : fail(error, "a free of the step-long state outside DeepSpeed's stage 3");
    void *p = e->buffers[op->buffer];
    if (!p)
        return TRUE;
    if (e->fw && e->fw_ops->release)
        e->fw_ops->release(e->fw, op);
    if (op->sub == ZP_MEM_GRADS && op->unit >= 0 && e->unit_grads[op->unit] == p)
        e->unit_grads[op->unit] = NULL;
    if (op->sub == ZP_MEM_GATHERED_PARAMS && e->unit_params[op->unit] == p)
        e->unit_params[op->unit] = NULL;
    real_engine_moe_freed(e, p);
    e->be->free(e->be, p);
    e->buffers[op->buffer] = NULL;
    return TRUE;
}

/* ---- compute ----------------------------------------------------------------------------- */

/* Unit u's parameters as a compute op reads them, and where it accumulates its gradients:
 * the tensors in `used` (bit k: tensor k of the unit) or all (ALL_TENSORS). */
static gboolean params_of(RealEngine *e, int u, uint32_t used, RealGptTensors *v,
                          GError **error)
{
    if (e->ds) {
        if (!real_ds_params(e->ds, u, used, v, error))
            return FALSE;
        real_engine_moe_view_experts(e, u, FALSE, v);
        return TRUE;
    }
    if (e->fw)
        return e->fw_ops->params(e->fw, u, v, error);
    const RealBf16 *p = e->stage < 3          ? e->params + e->s->unit_offset[u]
                        : e->persistent[u] ? e->persistent[u]
                                           : e->unit_params[u];
    if (!p)
        return fail(error, "rank %d: unit %d is used but was not gathered", e->rank, u);
    if (real_engine_moe_sparse(e, u))
        return real_engine_moe_view(e, u, p, FALSE, v, error);
    real_gpt_tensors_at(&e->dims, u, p, v);
    return TRUE;
}

static gboolean grads_of(RealEngine *e, int u, uint32_t used, int micro, RealGptTensors *v,
                         GError **error)
{
    if (e->ds) {
        if (!real_ds_grads(e->ds, u, used, micro, v, error))
            return FALSE;
        real_engine_moe_view_experts(e, u, TRUE, v);
        return TRUE;
    }
    if (e->fw)
        return e->fw_ops->grads(e->fw, u, micro, v, error);
    RealBf16 *g = e->stage < 2 && !e->full_by_unit ? e->grads + e->s->unit_offset[u]
                                                   : e->unit_grads[u];
    if (!g)
        return fail(error, "rank %d: no gradient bucket holds unit %d", e->rank, u);
    if (real_engine_moe_sparse(e, u))
        return real_engine_moe_view(e, u, g, TRUE, v, error);
    real_gpt_tensors_at(&e->dims, u, g, v);
    return TRUE;
}

/* A pipeline's tied word embedding gradient on this stage: wte's (the first stage) or the
 * head's copy of it (the last), this rank's vocabulary rows. */
gboolean real_engine_tied_grads(RealEngine *e, RealBf16 **grads, size_t *n, GError **error)
{
    const int u = e->dims.tied_copy ? e->L + 1 : 0;
    RealGptTensor t[REAL_GPT_MAX_UNIT_TENSORS];
    const int n_tensors = real_gpt_unit_tensors(&e->dims, u, t);
    const int k = e->dims.tied_copy ? n_tensors - 1 : 0; /* lm_head.weight last, wte first */
    RealGptTensors g;
    if (!grads_of(e, u, ALL_TENSORS, e->s->plan.grad_accum - 1, &g, error))
        return FALSE;
    *grads = g.at[k];
    *n = t[k].elems;
    return TRUE;
}

/* This rank's reduced partition gradients, as the step reads them. */
static const RealBf16 *step_grads(const RealEngine *e)
{
    if (e->ds)
        return real_ds_step_grads(e->ds);
    if (e->gip_id >= 0)
        return e->buffers[e->gip_id] ? (const RealBf16 *)e->buffers[e->gip_id] +
                                           (e->part_base - e->gip_lo)
                                     : NULL;
    return e->grads + (e->stage == 1 ? e->part_base : 0);
}

static gboolean load_micro_batch(RealEngine *e, int micro, GError **error)
{
    const ZpSchedule *s = e->s;
    uint64_t first = real_data_first_sample(e->step, micro, s->plan.grad_accum, e->rank, e->dp,
                                            s->plan.micro_batch);
    return real_data_batch(e->cfg.seed, first, s->plan.micro_batch, (int)s->model.seq_len,
                           (int)s->model.vocab, e->tokens, e->targets, error);
}

/* The optimizer's settings; `next` for a new step (a CPU step's later sub-groups are not). */
static RealAdamHyper adam_hyper(RealEngine *e, gboolean next)
{
    e->adam_step += next;
    return (RealAdamHyper){
        .lr = e->cfg.lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
        .weight_decay = e->cfg.weight_decay,
        /* Each micro-step's loss is a mean over its tokens; the step's is their mean. */
        .grad_scale = 1.0f / (float)(e->dp * e->s->plan.grad_accum),
        .step = e->adam_step};
}

static gboolean optimizer(RealEngine *e, GError **error)
{
    const RealAdamHyper hyper = adam_hyper(e, TRUE);
    if (e->fw)
        return e->fw_ops->optimizer(e->fw, &hyper, error);
    if (e->offload) { /* partial offload: the GPU's sub-groups */
        real_offload_gpu_adam(e->offload, &hyper, e->params + e->part_base);
        return TRUE;
    }
    const RealBf16 *grad = step_grads(e);
    e->be->adam_step(e->be, &hyper, e->opt_elems, e->master, e->adam_m, e->adam_v, grad,
                     e->params + e->part_base);
    real_engine_moe_optimizer(e, &hyper); /* the expert space's partition, in the same op */
    return TRUE;
}

/* qwZ before the gather that follows it in the list (zp_sched's issue_gathers: the int8
 * buffer's alloc, the quantize op, the gather): this rank's source, quantised into its place
 * of the int8 buffer in CUDAQuantizer.quantize's groups. */
static gboolean qwz_quantize(RealEngine *e, const ZpOp *op, GError **error)
{
    const int u = op->unit;
    const ZpSchedule *s = e->s;
    const guint index = (guint)(op - zp_sched_op(s, 0));
    const ZpOp *gather_op = index + 1 < s->ops->len ? zp_sched_op(s, index + 1) : NULL;
    const ZpOp *alloc = op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0]) : NULL;
    if (!gather_op || gather_op->kind != ZP_OP_COLLECTIVE || gather_op->unit != u ||
        gather_op->buffer < 0 || !alloc || alloc->kind != ZP_OP_ALLOC ||
        !e->buffers[alloc->buffer])
        return fail(error, "a quantize op must follow its int8 buffer's alloc and precede its "
                    "unit's gather");
    RealComm *c = gather_comm(e, (ZpGroup)gather_op->group);
    if (!c)
        return fail(error, "an hpZ gather without zero_hpz_partition_size");
    const uint64_t n = unit_padded(e, u) / (uint64_t)c->size;
    const uint64_t groups = zp_zeropp_qwz_groups(n);
    uint8_t *buf = e->buffers[alloc->buffer];
    real_zeropp_quantize(gather_source(e, u, (ZpGroup)gather_op->group), n, groups,
                         buf + (size_t)c->rank * real_zeropp_quantized_bytes(n, groups));
    e->quant_of[gather_op->buffer] = alloc->buffer;
    e->quant_group[gather_op->buffer] = gather_op->group;
    return TRUE;
}

/* qwZ when the gathered unit is needed (its first dependency is the gather): every rank's
 * int8 and scales into the unit's bf16 buffer. */
static gboolean qwz_dequantize(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    const int u = op->unit;
    const ZpOp *gather_op = op->n_deps > 0 ? zp_sched_op(s, zp_sched_deps(s, op)[0]) : NULL;
    const int target = gather_op && gather_op->kind == ZP_OP_COLLECTIVE ? gather_op->buffer : -1;
    if (target < 0 || e->quant_of[target] < 0 || !e->buffers[e->quant_of[target]])
        return fail(error, "a dequantize op with no gathered int8 buffer for unit %d", u);
    const ZpGroup group = (ZpGroup)e->quant_group[target];
    const int ranks = gather_comm(e, group)->size;
    const uint64_t n = unit_padded(e, u) / (uint64_t)ranks, groups = zp_zeropp_qwz_groups(n);
    const uint8_t *buf = e->buffers[e->quant_of[target]];
    RealBf16 *dst = e->buffers[target];
    for (int q = 0; q < ranks; q++)
        real_zeropp_dequantize(buf + (size_t)q * real_zeropp_quantized_bytes(n, groups), n,
                               groups, dst + (uint64_t)q * n);
    e->unit_params[u] = dst;
    e->quant_of[target] = -1;
    keep_secondary(e, u, group, dst);
    return TRUE;
}

/* After a head: when this stage's next compute op is not its micro-step's backward (GPipe's
 * and the interleaved schedule's last stage forward other micro-steps first), its output
 * gradient is kept aside (workspace: 4 b s h bytes each). */
static gboolean keep_head_dx(RealEngine *e, const ZpOp *op, GError **error)
{
    const ZpSchedule *s = e->s;
    guint i = (guint)(op - zp_sched_op(s, 0)) + 1;
    while (i < s->ops->len && (zp_sched_op(s, i)->stage != (uint32_t)s->view_stage ||
                               zp_sched_op(s, i)->kind != ZP_OP_COMPUTE))
        i++;
    const ZpOp *next = i < s->ops->len ? zp_sched_op(s, i) : NULL;
    if (!next || next->micro == op->micro)
        return TRUE;
    const uint64_t bytes = real_gpt_residual_grad_bytes(&e->dims);
    if (!(e->head_dx[op->micro] = take(e, bytes, ZP_MEM_WORKSPACE, error)))
        return FALSE;
    e->be->copy(e->be, e->head_dx[op->micro], e->dx, bytes);
    return TRUE;
}

/* Before a backward op: the micro-step's kept head output gradient, if any, back into dx. */
static void restore_head_dx(RealEngine *e, int micro)
{
    float **kept = &e->head_dx[micro];
    if (!*kept)
        return;
    e->be->copy(e->be, e->dx, *kept, real_gpt_residual_grad_bytes(&e->dims));
    e->be->free(e->be, *kept);
    *kept = NULL;
}

/* Where forward keeps block l's checkpoint on the GPU: Pa's slice, or the whole input. */
static void *kept_checkpoint(const RealEngine *e, int l, int micro)
{
    return e->buffers[(pa_splits(e) ? e->ckpt_slice : e->ckpt_buffer)[slot(e, l, micro)]];
}

/* A block op: one of its modules (DeepSpeed's stage 3: real_gpt's per-module entry points,
 * with that module's tensors only, backward adding that module's gradients) or the whole
 * block. */
static gboolean block_forward(RealEngine *e, const ZpOp *op, const RealBf16 *x_in,
                              gboolean save, GError **error)
{
    const int m = zp_op_module(op), l = op->unit;
    RealGptTensors p;
    if (real_engine_moe_sparse(e, l)) /* up to the router: the experts' ops follow */
        return params_of(e, l, m < 0 ? ALL_TENSORS : real_gpt_module_tensors(&e->dims, m), &p,
                         error) &&
               real_engine_moe_block_forward(e, op, &p, x_in, save, error);
    if (m < 0)
        return params_of(e, l, ALL_TENSORS, &p, error) &&
               real_gpt_block_forward_t(e->gpt, l - 1, &p, x_in, e->x, save, error);
    return params_of(e, l, real_gpt_module_tensors(&e->dims, m), &p, error) &&
           real_gpt_block_forward_module_t(e->gpt, l - 1, m, &p, x_in, e->x, save, error);
}

static gboolean block_backward(RealEngine *e, const ZpOp *op, GError **error)
{
    const int m = zp_op_module(op), l = op->unit;
    RealGptTensors p, g;
    const uint32_t used = m < 0 ? ALL_TENSORS : real_gpt_module_tensors(&e->dims, m);
    if (!params_of(e, l, used, &p, error) || !grads_of(e, l, used, op->micro, &g, error))
        return FALSE;
    if (real_engine_moe_sparse(e, l)) /* from the router: the experts' ops came first */
        return real_engine_moe_block_backward(e, op, &p, &g, error);
    if (m < 0)
        return real_gpt_block_backward_t(e->gpt, l - 1, &p, e->dx, e->dx, &g, error);
    return real_gpt_block_backward_module_t(e->gpt, l - 1, m, &p, e->dx, e->dx, &g, error);
}

gboolean real_engine_do_compute(RealEngine *e, const ZpOp *op, GError **error)
{
    const int l = op->unit, L = e->L, micro = op->micro;
    RealGptTensors p, g;
    float loss = 0;
    switch ((ZpComputeKind)op->sub) {
    case ZP_COMP_EMBED_FWD:
        return load_micro_batch(e, op->micro, error) && params_of(e, 0, ALL_TENSORS, &p, error) &&
               real_gpt_embed_forward_t(e->gpt, &p, e->tokens, e->x, error);
    case ZP_COMP_BLOCK_FWD: {
        const int m = zp_op_module(op);
        /* cpu_checkpointing: a host_copy did */
        if (e->s->plan.checkpoint && !e->ckpt_host && m <= REAL_GPT_MOD_LN1)
            e->be->copy(e->be, kept_checkpoint(e, l, op->micro), block_input_slice(e, e->x),
                        e->ckpt_slice_bytes);
        if (!block_forward(e, op, e->x, !e->s->plan.checkpoint, error))
            return FALSE;
        /* (a sparse block's saved activations are kept by its unpermute op) */
        if (!e->s->plan.checkpoint && (m < 0 || m == REAL_GPT_MOD_FC2) &&
            !real_engine_moe_sparse(e, l))
            e->stash[slot(e, l, op->micro)] = real_gpt_take_saved(e->gpt, l - 1);
        return TRUE;
    }
    case ZP_COMP_HEAD: {
        /* A pipeline's last stage reads the micro-batch's targets itself. */
        if (e->s->stages > 1 && !load_micro_batch(e, op->micro, error))
            return FALSE;
        /* A tied head reads and updates the embedding (unit 0) too; an untied one only its
         * own unit. */
        const gboolean tied = !e->dims.untied;
        RealGptTensors emb = {0}, gemb = {0};
        gboolean ok = params_of(e, L + 1, ALL_TENSORS, &p, error) &&
                      (!tied || params_of(e, 0, WTE_ONLY, &emb, error)) &&
                      grads_of(e, L + 1, ALL_TENSORS, micro, &g, error) &&
                      (!tied || grads_of(e, 0, WTE_ONLY, micro, &gemb, error)) &&
                      real_gpt_head_forward_backward_t(e->gpt, &p, &emb, e->x, e->targets, 1.0f,
                                                       &loss, e->dx, &g, &gemb, error);
        e->loss_sum += loss;
        return ok && (e->s->stages == 1 || keep_head_dx(e, op, error));
    }
    case ZP_COMP_RECOMPUTE:
        restore_head_dx(e, op->micro);
        /* The recomputed block's output is not needed: the residual stream is scratch now. */
        return block_forward(e, op, e->buffers[e->ckpt_buffer[slot(e, l, op->micro)]], TRUE,
                             error);
    case ZP_COMP_BLOCK_BWD:
        restore_head_dx(e, op->micro);
        /* the block's activations back for its backward, which fc2's op begins */
        if (!e->s->plan.checkpoint && !real_engine_moe_sparse(e, l) &&
            (zp_op_module(op) < 0 || zp_op_module(op) == REAL_GPT_MOD_FC2)) {
            void **saved = &e->stash[slot(e, l, op->micro)];
            if (!real_gpt_put_saved(e->gpt, l - 1, *saved, error))
                return FALSE;
            *saved = NULL;
        }
        return block_backward(e, op, error);
    case ZP_COMP_EMBED_BWD:
        /* A pipeline's first stage has forwarded later micro-batches since: their tokens. */
        return (e->s->stages == 1 || load_micro_batch(e, op->micro, error)) &&
               grads_of(e, 0, ALL_TENSORS, micro, &g, error) &&
               real_gpt_embed_backward_t(e->gpt, e->tokens, e->dx, &g, error);
    case ZP_COMP_OPTIMIZER:
        return optimizer(e, error);
    case ZP_COMP_CPU_OPTIMIZER: {
        const RealAdamHyper hyper = adam_hyper(e, real_offload_first_sub_group(e->offload));
        return real_offload_adam(e->offload, &hyper, error);
    }
    case ZP_COMP_QUANTIZE: {
        /* qgZ's kernels sit around its all-to-alls, whose op does their work (qgz_reduce) */
        const guint index = (guint)(op - zp_sched_op(e->s, 0));
        if (is_alltoall(e->s, index + 1) || (index > 0 && is_alltoall(e->s, index - 1)))
            return TRUE;
        if (e->ds)
            return real_ds_qwz(e->ds, op, error);
        return op->stream == ZP_STREAM_DP ? qwz_quantize(e, op, error)
                                          : qwz_dequantize(e, op, error);
    }
    case ZP_COMP_UNPACK:
        if (e->fw && e->fw_ops->unpack)
            return e->fw_ops->unpack(e->fw, op, error);
        return e->ds ? real_ds_unpack(e->ds, op, error)
                     : fail(error, "an unpack op outside DeepSpeed's and FSDP2's stage 3");
    case ZP_COMP_EXPERT_FWD:
    case ZP_COMP_EXPERT_BWD:
    case ZP_COMP_UNPERMUTE_FWD:
    case ZP_COMP_UNPERMUTE_BWD: /* a sparse block's ops between its own, which read only
                                 * the experts (DeepSpeed's stage 3 gathers no dense tensor
                                 * for them) */
        return params_of(e, l, real_engine_moe_expert_tensors(e, l), &p, error) &&
               (op->sub != ZP_COMP_EXPERT_BWD ||
                grads_of(e, l, real_engine_moe_expert_tensors(e, l), micro, &g, error)) &&
               real_engine_moe_compute(e, op, &p, &g, error);
    case ZP_COMP_HOST_COPY: /* the block input (its slice) down, or back into the
                             * recompute's buffer (Pa: at the slice's place, then gathered) */
        return real_zeror_host_copy(
            e->ckpt_host, l, micro,
            block_input_slice(e, real_zeror_on_host(e->ckpt_host, l, micro)
                                     ? e->buffers[e->ckpt_buffer[slot(e, l, micro)]]
                                     : e->x),
            (uint64_t)op->bytes, error);
    default:
        return fail(error, "unknown compute op %d", op->sub);
    }
}
