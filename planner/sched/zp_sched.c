/* zp_sched: builds one optimizer step's op graph for a rank, in the order the host would
 * issue the ops (so in-order streams behave like CUDA streams). This is the builder's core:
 * the plan's checks, each stage's walk and the step's totals; the parts it calls are one file
 * each (zp_build.h), its JSON writer and reader zp_sched_json.c and zp_sched_read.c.
 *
 * The step: for each micro-step, forward (embedding, blocks, head), backward (blocks in
 * reverse, embedding), gradient buckets launched where the implementation's rules put them
 * (after the unit or module op whose gradients complete or overflow them); after
 * the last micro-step the optimizer on this rank's partition and, for stages 1-2, the
 * all-gather of the updated parameters. Stage 3 gathers parameters before use and frees them
 * after. Which buckets, buffers, gathers and step buffers: the plan's implementation's rules
 * (zp_impl.h), which this one builder calls through. */
#include "zp_sched.h"
#include "zp_build.h"
#include "zp_cost_kernels.h"
#include "zp_ep.h"
#include "zp_inventory.h"
#include "zp_mem.h"
#include "zp_pipe.h"
#include "zp_offload.h"
#include "zp_runahead.h"
#include "zp_schedsize.h"
#include "zp_util.h"
#include "zp_zeror.h"
#include "zp_zeropp.h"

#include <math.h>
#include <string.h>

/* A mixture of experts: EP dividing the experts and dp (zp_ep_check), under the
 * implementations whose expert parallelism the builder follows (DeepSpeed-MoE's groups, the
 * paper's ZeRO over them, Megatron-Core's expert data-parallel optimizer); what it does not
 * model is refused in one line. */
static gboolean check_experts(const ZpModel *model, const ZpPlan *p, GError **error)
{
    if (!zp_plan_etp_check(p, zp_moe_enabled(&model->moe), "experts.etp", error) ||
        !zp_ep_check(model, p, "ep", error) ||
        !zp_ep_dispatcher_check(model, p, "experts.dispatcher", error))
        return FALSE;
    if (!zp_moe_enabled(&model->moe))
        return TRUE;
    const char *bad = NULL;
    if (p->impl == ZP_IMPL_FSDP || p->impl == ZP_IMPL_FSDP2)
        bad = "impl: --impl fsdp and fsdp2 have no expert parallelism; a mixture of experts "
              "is scheduled under deepspeed, megatron or paper";
    else if (p->zero.zero_quantized_weights || p->zero.zero_quantized_gradients ||
             p->zero.zero_hpz_partition_size > 1)
        bad = "zero: ZeRO++ (qwZ, qgZ, hpZ) with a mixture of experts is not scheduled";
    else if (p->zero.offload_optimizer.device != ZP_OFFLOAD_NONE ||
             p->zero.offload_param.device != ZP_OFFLOAD_NONE || p->ckpt.cpu_checkpointing)
        bad = "offload: offloading a mixture of experts' states is not scheduled";
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s (%s)", bad, model->name);
        return FALSE;
    }
    return zp_ep_drop_check(model, p, error);
}

static gboolean check_plan(const ZpModel *model, const ZpPlan *p, GError **error)
{
    const char *bad = NULL;
    if (!zp_model_has_architecture(model))
        bad = "model: a schedule needs an architecture (--model, not --params)";
    else if (p->zero.stage < 0 || p->zero.stage > 3)
        bad = "stage: must be 0, 1, 2 or 3";
    else if (p->impl < 0 || p->impl >= ZP_IMPL_N)
        bad = "impl: must be deepspeed, fsdp, paper, megatron or fsdp2";
    else if (p->zero.fsdp2_no_reshard_after_forward &&
             (p->impl != ZP_IMPL_FSDP2 || p->zero.stage != 3))
        bad = "fsdp2_no_reshard_after_forward: FSDP2's reshard_after_forward=False "
              "(--impl fsdp2 --stage 2)";
    else if (p->zero.fsdp2_no_reshard_after_forward && p->zero.zero_hpz_partition_size > 1)
        bad = "zero_hpz_partition_size (--hpz-partition-size): FSDP2's reshard_after_forward "
              "is False (--stage 2) or an int (--stage 3 --hpz-partition-size), not both";
    else if (!zp_impl_get(p->impl)->has_stage(p->zero.stage)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "stage: --impl %s has %s",
                    zp_impl_get(p->impl)->name, zp_impl_get(p->impl)->stages);
        return FALSE;
    }
    else if (p->selective_recompute && !p->checkpoint &&
             !zp_impl_get(p->impl)->selective_recompute)
        bad = "recompute: selective recomputation is Megatron's (--impl megatron)";
    else if (p->overlap_param_gather && (p->impl != ZP_IMPL_MEGATRON || p->zero.stage != 1))
        bad = "overlap_param_gather: the distributed optimizer's (--impl megatron, stage 1)";
    else if (p->no_main_grad && strcmp(zp_inventory_for_plan(p)->name, "megatron") != 0)
        bad = "main_grad: Megatron-LM's (--impl megatron or --kernels megatron)";
    else if (p->p2p_sync && p->impl != ZP_IMPL_MEGATRON)
        bad = "p2p_sync: Megatron-LM's pipeline exchanges (--impl megatron)";
    else if (zp_impl_ds_bf16_optimizer(p))
        bad = "stage: 0 with bf16 and a pipeline runs DeepSpeed's BF16_Optimizer (its master "
              "weights and Adam states partitioned over the data-parallel ranks), which is not "
              "modeled; stage 1 (ZeRO-1) or fp16 is";
    else if (p->dp < 1 || p->mp < 1)
        bad = "gpus/mp: data- and tensor-parallel degrees must be at least 1";
    else if (model->heads % p->mp != 0)
        bad = "mp: the tensor-parallel degree must divide the attention heads";
    else if (p->micro_batch < 1 || p->grad_accum < 1)
        bad = "micro-batch/grad-accum: must be at least 1";
    else if (p->step_grad_accum != 0 && p->step_grad_accum < p->grad_accum)
        bad = "step_grad_accum: the step's micro-steps, at least the schedule's grad-accum";
    /* DeepSpeed takes 0 for the reduce bucket (every parameter then bypasses it) and the
     * stage-3 sizes (no prefetch, nothing persistent, nothing kept live ahead), but divides by
     * allgather_bucket_size (runtime/utils.py all_gather_dp_groups). */
    else if (p->zero.reduce_bucket_size < 0 || p->zero.allgather_bucket_size < 1)
        bad = "reduce_bucket_size/allgather_bucket_size: must be >= 0 and >= 1 element";
    else if (p->zero.stage3_prefetch_bucket_size < 0 || p->zero.stage3_max_live_parameters < 0 ||
             p->zero.stage3_param_persistence_threshold < 0 || p->zero.sub_group_size < 0)
        bad = "stage3_*/sub_group_size: must be >= 0";


    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
        return FALSE;
    }
    if (!zp_zeror_check(model, p, error) || !zp_zeropp_check(p, error))
        return FALSE;
    if (!zp_pipe_check(model, p, error))
        return FALSE;
    if (!check_experts(model, p, error))
        return FALSE;
    if ((int64_t)p->dp * p->mp * zp_plan_pp(p) > INT32_MAX) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "gpus: dp %d x mp %d x pp %d ranks is more than a schedule numbers", p->dp,
                    p->mp, zp_plan_pp(p));
        return FALSE;
    }
    if (!zp_offload_check(p, error))
        return FALSE;
    const double unit_steps = (double)p->grad_accum * (double)(model->layers + 2);
    if (unit_steps > ZP_SCHED_MAX_UNIT_STEPS) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "grad-accum: %d micro-steps x %" G_GINT64_FORMAT " units = %.4g exceeds the "
                    "%.0e a schedule holds (each micro-step's ops are built and simulated one "
                    "by one); raise the micro-batch or lower the accumulation",
                    p->grad_accum, model->layers + 2, unit_steps, ZP_SCHED_MAX_UNIT_STEPS);
        return FALSE;
    }
    return TRUE;
}

/* Whether the action's backward launches gradient reductions: stages 0-1 keep full gradients
 * and reduce once, in the last micro-step; stages 2-3 every micro-step. */
static gboolean reduces(const ZpPlan *plan, int micro)
{
    return plan->zero.stage >= 2 || micro == plan->grad_accum - 1;
}

/* ZpPlan p2p_sync: the stage's sends so far in this exchange are waited for on the host
 * (p2p_communication.py _communicate: req.wait() for each, then torch.cuda.synchronize()),
 * so every op after them follows the last (one stream: it ends after the others). */
static void exchange_waited(Builder *b, int chunk, int micro, ZpP2pKind dir)
{
    if (b->s->plan.p2p_sync)
        b->host_sync = b->send_op[zp_build_send_key(b, chunk, micro, dir)];
}

/* ZpPlan p2p_sync under the interleaved schedule: an exchange before a steady forward (the
 * last warm-up one's, and each steady backward's) also receives the gradients of the
 * backward after it (`after_next`), and that forward waits for them too
 * (send_forward_backward_recv_forward_backward waits for all four requests). Not where
 * every forward is warm-up (m = P): each exchange then only sends and receives forward
 * (send_forward_recv_forward), and the last forward waiting on the first backward's
 * gradients deadlocked the step. */
static void exchange_received(Builder *b, const ZpPipeAction *next, gboolean next_steady,
                              const ZpPipeAction *after_next)
{
    const ZpPlan *plan = &b->s->plan;
    if (!plan->p2p_sync || plan->pipe.schedule != ZP_PIPE_INTERLEAVED || !next ||
        next->backward || !next_steady || !after_next || !after_next->backward ||
        after_next->chunk == b->n_chunks - 1)
        return;
    b->recv_key_sync = zp_build_send_key(b, after_next->chunk + 1, after_next->micro,
                                         ZP_P2P_SEND_PREV);
}

/* One action of the stage: a forward (with the head on the last chunk) and the send of its
 * output, or a backward and the send of its input gradients, each first waiting for the
 * neighbour's send when there is one. `next`, `after_next`: the stage's actions after it, or
 * NULL; `k`: its index in the stage's actions less the warm-up forwards (zp_pipe_warmup):
 * from 0 a forward is a steady one, paired with the backward after it. With p2p_sync, the
 * interleaved steady state's forward sends its output after the backward that follows it, in
 * that backward's exchange (Megatron-LM de7dc40f megatron/schedules.py
 * forward_backward_pipelining_with_interleaving: forward_step_helper, backward_step_helper,
 * then send_forward_backward_recv_forward_backward); a warm-up forward sends at once
 * (send_forward_recv_forward), the last one too where every forward is warm-up (m = P,
 * all_warmup_microbatches): deferred behind the backward that waits on it, it deadlocked the
 * step. */
static void run_action(Builder *b, const ZpPipeAction *x, int64_t k,
                       const ZpPipeAction *next, const ZpPipeAction *after_next, Activations *a,
                       GArray *deps, GArray *launched)
{
    const ZpPlan *plan = &b->s->plan;
    const Range r = {b->first_unit[x->chunk], b->first_unit[x->chunk + 1]};
    /* A pipeline reduces after its flush (below), not during its backwards. */
    const gboolean last = x->chunk == b->n_chunks - 1;
    const gboolean reduce = zp_plan_pp(plan) == 1 && reduces(plan, x->micro);
    if (plan->zero.stage >= 2 && !x->backward) { /* buckets and launches per micro-step */
        zp_build_reset_buckets(b);
        g_array_set_size(launched, 0);
    }
    if (!x->backward) {
        b->recv_key =
            x->chunk > 0 ? zp_build_send_key(b, x->chunk - 1, x->micro, ZP_P2P_SEND_NEXT) : -1;
        zp_build_receive(b, r.lo, x->micro);
        zp_build_forward(b, x->micro, a, deps, r);
        if (last) {
            zp_build_head(b, x->micro, reduce,
                          plan->backend_workspace && zp_plan_pp(plan) > 1 &&
                              (!next || next->micro != x->micro),
                          deps, launched);
        } else if (plan->p2p_sync && plan->pipe.schedule == ZP_PIPE_INTERLEAVED && k >= 0 &&
                   next && next->backward) {
            b->deferred_chunk = x->chunk, b->deferred_micro = x->micro;
            b->deferred_unit = r.hi - 1;
        } else {
            zp_build_send(b, x->chunk, x->micro, ZP_P2P_SEND_NEXT, r.hi - 1);
            exchange_waited(b, x->chunk, x->micro, ZP_P2P_SEND_NEXT);
        }
        exchange_received(b, next, k + 1 >= 0, after_next);
        return;
    }
    b->recv_key = !last ? zp_build_send_key(b, x->chunk + 1, x->micro, ZP_P2P_SEND_PREV) : -1;
    zp_build_receive(b, r.hi - 1, x->micro);
    zp_build_release_head_grad(b, x->micro);
    zp_build_backward(b, x->micro, reduce, a, deps, launched, r);
    if (x->chunk > 0) {
        zp_build_send(b, x->chunk, x->micro, ZP_P2P_SEND_PREV, r.lo);
        exchange_waited(b, x->chunk, x->micro, ZP_P2P_SEND_PREV);
    }
    if (b->deferred_chunk >= 0) {
        zp_build_send(b, b->deferred_chunk, b->deferred_micro, ZP_P2P_SEND_NEXT,
                      b->deferred_unit);
        exchange_waited(b, b->deferred_chunk, b->deferred_micro, ZP_P2P_SEND_NEXT);
        b->deferred_chunk = -1;
    }
    exchange_received(b, next, k + 1 >= 0, after_next);
}

/* Pa+cpu: the host tier holds a block's checkpoint slice of a micro-step from its forward
 * host copy to its backward one (partition.cpu() kept in ctx.deepspeed_saved_tensors); the
 * peak over the ops [first, end) of one stage is what its ranks hold: every block's slice
 * without a pipeline, with one the stage's own blocks times the micro-steps in flight there. */
static double host_checkpoint_peak(const ZpSchedule *s, guint first)
{
    if (!(zp_zeror_checkpoint(&s->model, &s->plan).copy_bytes > 0))
        return 0; /* no host copies (zp_build_keep_checkpoint): no pass over the ops */
    GHashTable *held = g_hash_table_new(NULL, NULL);
    double live = 0, peak = 0;
    for (guint i = first; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_HOST_COPY)
            continue;
        const gpointer key = GSIZE_TO_POINTER(1 + (gsize)op->unit +
                                              (gsize)(s->model.layers + 2) * (gsize)op->micro);
        if (g_hash_table_remove(held, key)) {
            live -= op->bytes;
        } else {
            g_hash_table_add(held, key);
            live += op->bytes;
            peak = MAX(peak, live);
        }
    }
    g_hash_table_destroy(held);
    return peak;
}

/* One stage's ops: its layout and buckets, its actions in pipeline order, its optimizer. */
static void build_stage(Builder *b, Activations *a, GArray *deps, GArray *launched)
{
    ZpSchedule *s = b->s;
    const ZpPlan *plan = &s->plan;
    const int P = zp_plan_pp(plan);
    const guint first = s->ops->len;
    b->last_compute = NONE;
    b->resident = -1; /* each stage's ranks hold their own workspace */
    b->workspace_free = NONE;
    b->n_sync = 0;
    g_array_set_size(b->buckets, 0);
    /* Stage 3 has one stage (zp_pipe_check), laid out before its gathers were planned
     * (zp_sched_build) and not moved since: laying it out again walked every tensor once more
     * for DeepSpeed's persistent parameters (10 ms at 32,000 layers). */
    if (plan->zero.stage != 3)
        zp_build_layout(b);
    zp_build_plan_buckets(b);
    b->param_gathers_issued = b->param_gathers_waited = 0;
    b->ipg[0] = b->ipg[1] = -1; /* none held yet: reset_buckets keeps only those */
    zp_build_reset_buckets(b);
    b->grad_state = -1;
    for (int u = 0; u < s->n_units; u++)
        b->unit_grad[u] = -1;
    if (zp_build_held_span(b) == ZP_HELD_ALL_STEP) /* before the step's first op */
        zp_build_alloc_held_buckets(b, 0);
    g_array_set_size(launched, 0);
    GArray *actions = P > 1 ? zp_pipe_actions(plan->pipe.schedule, P, zp_plan_vstages(plan),
                                              plan->grad_accum, b->stage)
                            : zp_pipe_actions(ZP_PIPE_GPIPE, 1, 1, 0, 0);
    /* Without a pipeline: forward and backward of each micro-step in turn. */
    for (int micro = 0; P == 1 && micro < plan->grad_accum; micro++) {
        const ZpPipeAction f = {micro, 0, FALSE}, w = {micro, 0, TRUE};
        g_array_append_val(actions, f);
        g_array_append_val(actions, w);
    }
    if (b->replay)
        zp_build_replay_reset(b->replay, b);
    /* The warm-up forwards come first in the list (zp_pipe_actions). */
    const guint warmup = P > 1 ? (guint)zp_pipe_warmup(plan->pipe.schedule, P,
                                                       zp_plan_vstages(plan), plan->grad_accum,
                                                       b->stage)
                               : 0;
    for (guint i = 0; i < actions->len; i++) {
        const ZpPipeAction *x = &g_array_index(actions, ZpPipeAction, i);
        if (b->replay && zp_build_replay(b->replay, b, a, x))
            continue;
        run_action(b, x, (int64_t)i - (int64_t)warmup,
                   i + 1 < actions->len ? &g_array_index(actions, ZpPipeAction, i + 1) : NULL,
                   i + 2 < actions->len ? &g_array_index(actions, ZpPipeAction, i + 2) : NULL, a,
                   deps, launched);
        if (b->replay)
            zp_build_replay_record(b->replay, b, a, x);
    }
    g_array_unref(actions);
    if (!b->impl->tied_sync_after_reduction)
        zp_build_tied_sync(b, NULL);
    /* DeepSpeed's pipeline engine reduces the stage's gradients once its last backward is
     * done (TrainSchedule's ReduceGrads after the flush, deepspeed/runtime/pipe/schedule.py),
     * over the stage's own data-parallel group, bucket by bucket from the last unit down. */
    for (int u = s->n_units - 1; P > 1 && u >= 0; u--)
        if (s->unit_elems[u] > 0)
            zp_build_launch_buckets(b, u, -1, plan->grad_accum - 1, launched);
    if (P > 1 && zp_build_held_span(b) != ZP_HELD_ALL_STEP)
        zp_build_free_held_buckets(b, plan->grad_accum - 1, NONE);
    if (b->impl->tied_sync_after_reduction)
        zp_build_tied_sync(b, launched);
    zp_build_optimizer_step(b, launched);
    if (b->resident >= 0)
        zp_build_emit_free(b, ZP_MEM_WORKSPACE, zp_cost_resident_workspace_bytes(&s->model, plan),
                           0, 0, b->resident, b->last_compute);
    if (zp_build_held_span(b) == ZP_HELD_ALL_STEP) /* after the step's last op */
        zp_build_free_held_buckets(b, -1, s->ops->len - 1);
    s->host_bytes[ZP_MEM_CHECKPOINTS] = host_checkpoint_peak(s, first);
    memcpy(&s->stage_state_bytes[(gsize)b->stage * ZP_MEM_N], s->state_bytes,
           sizeof s->state_bytes);
    memcpy(&s->stage_host_bytes[(gsize)b->stage * ZP_MEM_N], s->host_bytes,
           sizeof s->host_bytes);
}

/* With a pipeline, host_bytes is the most any stage's ranks hold of each category. */
static void most_host_bytes(ZpSchedule *s)
{
    for (int k = 0; k < s->stages; k++)
        for (int c = 0; c < ZP_MEM_N; c++)
            s->host_bytes[c] = MAX(s->host_bytes[c], s->stage_host_bytes[(gsize)k * ZP_MEM_N + c]);
}

/* Points every receiving op at the send it waits for, now that all stages are built. */
static void link_sends(Builder *b)
{
    for (guint i = 0; i < b->cross->len; i++) {
        const ZpCrossDep *c = &g_array_index(b->cross, ZpCrossDep, i);
        g_array_index(b->s->deps, uint32_t, c->at) = b->send_op[c->key];
    }
}

/* `fast`: a block's ops written in one pass each (Builder.blocks_direct) and a pipeline's
 * actions written again from the last of their kind (zp_build_replay), where the plan lets
 * them; without, every op through the emitters one by one, the schedule they must equal. */
static ZpSchedule *build(const ZpModel *model, const ZpPlan *plan, gboolean fast,
                         GError **error)
{
    ZpPlan normalized = *plan;
    zp_impl_normalize_plan(&normalized);
    plan = &normalized;
    if (!check_plan(model, plan, error) || !zp_schedsize_check_plan(model, plan, error))
        return NULL;
    const int P = zp_plan_pp(plan), chunks = P * zp_plan_vstages(plan);
    int *first_unit = g_new(int, chunks + 1);
    if (!zp_pipe_partition(model, chunks, plan->pipe.partition, first_unit, error)) {
        g_free(first_unit);
        return NULL;
    }
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->model = *model;
    s->plan = *plan;
    s->memo = g_new0(ZpSchedMemo, 1);
    s->world = plan->dp * plan->mp * P;
    s->stages = P;
    s->stage_state_bytes = g_new0(double, (gsize)P * ZP_MEM_N);
    s->stage_host_bytes = g_new0(double, (gsize)P * ZP_MEM_N);
    if (P > 1)
        s->stage_unit_elems = g_new0(uint64_t, (gsize)P * (gsize)zp_model_n_units(model));
    s->elem_bytes = zp_plan_elem_bytes(plan->precision);
    s->ops = g_array_new(FALSE, FALSE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const int L = (int)model->layers;
    Builder b = {.s = s, .impl = zp_impl_get(plan->impl),
                 .state = zp_impl_state_bytes(plan),
                 .last_compute = NONE,
                 .grad_copy_elems = -1, /* not asked yet (grad_copy_bytes) */
                 .sync_deps = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .compute_deps = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .pos_last_op = g_array_new(FALSE, TRUE, sizeof(uint32_t)),
                 .buckets = g_array_new(FALSE, FALSE, sizeof(Bucket)),
                 .param_gathers = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .waits = g_array_new(FALSE, FALSE, sizeof(Wait)),
                 .unit_first = g_new0(guint, (gsize)L + 2),
                 .unit_last = g_new0(guint, (gsize)L + 2),
                 .unit_grad = g_new(int, (gsize)L + 2),
                 .launch = g_array_new(FALSE, FALSE, sizeof(guint)),
                 .launch_start = g_new0(guint, (gsize)L + 3),
                 .gathers = g_array_new(FALSE, FALSE, sizeof(Gather)),
                 .n_chunks = chunks, .first_unit = first_unit,
                 .unit_chunk = zp_build_unit_chunks(first_unit, chunks, L + 2),
                 .send_op = g_new(uint32_t, (gsize)chunks * (gsize)plan->grad_accum * ZP_P2P_N),
                 .recv_key = -1, .recv_key_sync = -1, .deferred_chunk = -1,
                 .cross = g_array_new(FALSE, FALSE, sizeof(ZpCrossDep)),
                 .offloaded = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .resident = -1, .workspace_free = NONE, .tied_grad = -1,
                 .block_workspace = -1, .module_step = -1,
                 .runahead = plan->zero.stage == 3 && zp_impl_get(plan->impl)->host_runahead &&
                             !plan->no_runahead,
                 .fetch_gate = NONE, .reduce_gate = NONE, .host_alloc = NONE,
                 .waited = NONE, .released = NONE, .waited_key = -1,
                 .held_copy = {-1, 0, NONE},
                 .host_sync = NONE,
                 .gated = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .head_grad = g_new(int, (gsize)plan->grad_accum),
                 .secondary = g_new(int, (gsize)L + 2),
                 .secondary_op = g_new(uint32_t, (gsize)L + 2),
                 .max_ops = zp_schedsize_max_ops(),
                 .moe = zp_ep_activations(model, plan), .moe_regathered = -1};
    /* One stage: room for the ops the plan's estimate allows (an upper bound, 2x DeepSpeed's
     * stage 3; address space only, the pages touched as ops are written) and as many
     * dependencies, over huge pages: the deep stage-3 model's 2.1 million ops grown in place
     * faulted 90,000 4 KiB pages, half of its build (perf: exc_page_fault, clear_page_erms and
     * memory-cgroup charges under g_array_append_vals). A pipeline's arrays are sized after
     * its stage 0 (zp_build_pipe_reserve). */
    if (P == 1) {
        const double want = fmin(zp_schedsize_estimate_ops(model, plan), b.max_ops);
        b.ops_room = zp_array_reserve_huge(s->ops, (guint64)want);
        b.deps_room = zp_array_reserve_huge(s->deps, (guint64)want);
    }
    b.ops_cap = b.max_ops > 0 ? (uint64_t)ceil(b.max_ops) : 0; /* max_ops: 5e7 at most */
    b.varied_blocks = zp_moe_enabled(&s->model.moe) || zp_mla_enabled(&s->model.mla);
    b.module_forward = zp_impl_module_compute(s);
    b.module_backward = zp_impl_module_backward(s);
    b.hands_on = zp_impl_grads_by_module(plan) && plan->zero.stage >= 2;
    b.tp_sum = zp_build_tp_sum_shape(s);
    b.p2p_scatter_gather = zp_build_p2p_scatter_gather(plan);
    b.send_elems = zp_build_send_elems(s, b.p2p_scatter_gather);
    for (int m = 0; m < plan->grad_accum; m++)
        b.head_grad[m] = -1;
    for (int u = 0; u < L + 2; u++)
        b.secondary[u] = -1;
    for (int stream = 0; stream < ZP_STREAM_N; stream++)
        b.last_on_stream[stream] = NONE;
    const int n_pos = zp_pos_count(L);
    g_array_set_size(b.pos_last_op, (guint)n_pos);
    if (plan->zero.stage == 3) { /* never with a pipeline (zp_pipe_check) */
        zp_build_layout(&b);
        zp_build_plan_gathers(&b);
        b.by_trigger = zp_build_index_gathers(&b, G_STRUCT_OFFSET(ZpFetch, trigger_pos),
                                              G_STRUCT_OFFSET(ZpFetch, trigger_step), n_pos, TRUE);
        b.by_use = zp_build_index_gathers(&b, G_STRUCT_OFFSET(ZpFetch, use_pos),
                                          G_STRUCT_OFFSET(ZpFetch, use_step), n_pos, FALSE);
        b.by_free = zp_build_index_gathers(&b, G_STRUCT_OFFSET(ZpFetch, free_pos),
                                           G_STRUCT_OFFSET(ZpFetch, free_step), n_pos, FALSE);
    }
    const gsize slots = (gsize)plan->grad_accum * (gsize)(L + 1);
    Activations a = {g_new0(int, slots), g_new0(int, slots),
                     zp_mem_plan_activation_block_bytes(model, plan),
                     zp_zeror_checkpoint(model, plan), zp_mem_core_attention_bytes(model, plan)};
    b.blocks_direct = fast && !b.varied_blocks && !b.module_forward && !b.module_backward &&
                      plan->zero.stage != 3 && !plan->backend_workspace &&
                      (!plan->checkpoint || (!plan->ckpt.synchronize_checkpoint_boundary &&
                                             !(a.rule.copy_bytes > 0) && !a.rule.regathered &&
                                             a.rule.gpu_bytes > 0));
    b.replay = fast && P > 1 ? zp_build_replay_new(zp_plan_vstages(plan)) : NULL;
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    b.step_deps = deps, b.step_deps_room = 0; /* zp_build_put_dep */
    GArray *launched = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (b.stage = 0; b.stage < P; b.stage++) {
        build_stage(&b, &a, deps, launched);
        if (b.stage == 0)
            zp_build_pipe_reserve(&b, P);
    }
    if (b.runahead)
        zp_runahead_bound(s, b.gated);
    g_array_unref(b.gated);
    most_host_bytes(s);
    link_sends(&b);
    g_array_unref(deps);
    g_array_unref(launched);
    g_free(a.act);
    g_free(a.ckpt);
    g_array_unref(b.sync_deps);
    g_array_unref(b.compute_deps);
    g_array_unref(b.pos_last_op);
    g_array_unref(b.buckets);
    g_array_unref(b.param_gathers);
    g_array_unref(b.waits);
    if (b.tensors)
        g_array_unref(b.tensors);
    g_free(b.unit_first);
    g_free(b.unit_last);
    g_free(b.unit_grad);
    g_array_unref(b.launch);
    g_free(b.launch_start);
    g_array_unref(b.gathers);
    g_free(b.first_unit);
    g_free(b.unit_chunk);
    g_free(b.send_op);
    g_free(b.head_grad);
    g_free(b.secondary);
    g_free(b.secondary_op);
    g_array_unref(b.cross);
    zp_build_replay_free(b.replay);
    g_array_unref(b.offloaded);
    if (b.launch_copies)
        g_array_unref(b.launch_copies);
    zp_build_free_pos_index(&b.by_trigger);
    zp_build_free_pos_index(&b.by_use);
    zp_build_free_pos_index(&b.by_free);
    zp_sched_memo_free(s); /* the build's only: its tensors are 20 MB at 32,000 layers */
    if (b.over_ops) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "the schedule of %s: more than %.3g ops (ZP_SCHED_MAX_OPS, or the memory "
                    "available at %.0f bytes an op)", model->name, b.max_ops, ZP_SCHED_OP_BYTES);
        zp_sched_free(s);
        return NULL;
    }
    return s;
}

ZpSchedule *zp_sched_build(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    return build(model, plan, TRUE, error);
}

ZpSchedule *zp_sched_build_short(const ZpModel *model, const ZpPlan *plan, int shorter,
                                 GError **error)
{
    if (shorter <= 0 || shorter >= plan->grad_accum) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "grad-accum: %d micro-steps cannot be built %d short", plan->grad_accum,
                    shorter);
        return NULL;
    }
    ZpPlan short_plan = *plan;
    short_plan.step_grad_accum = zp_plan_step_grad_accum(plan);
    short_plan.grad_accum -= shorter;
    return build(model, &short_plan, TRUE, error);
}

ZpSchedule *zp_sched_build_op_by_op(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    return build(model, plan, FALSE, error);
}

/* As zp_build_layout pads them, from the three unit sizes (the blocks are identical) instead of a
 * walk over every unit. */
uint64_t zp_sched_optimizer_elems(const ZpModel *model, const ZpPlan *plan)
{
    if (zp_moe_enabled(&model->moe))
        return zp_build_moe_optimizer_elems_of(model, plan);
    const uint64_t dp = (uint64_t)plan->dp;
    const uint64_t L = (uint64_t)model->layers;
    const uint64_t first = zp_model_unit_tp_elems(model, 0, plan->mp);
    const uint64_t block = zp_model_unit_tp_elems(model, 1, plan->mp);
    const uint64_t last = zp_model_unit_tp_elems(model, (int)L + 1, plan->mp);
    const uint64_t total = first + L * block + last;
    if (plan->zero.stage == 0)
        return total;
    if (plan->zero.stage == 3)
        return (zp_mem_padded_elems(first, dp) + L * zp_mem_padded_elems(block, dp) +
                zp_mem_padded_elems(last, dp)) / dp;
    return zp_mem_padded_elems(total, dp) / dp;
}

void zp_sched_compute_ops(const ZpModel *model, const ZpPlan *plan,
                          ZpComputeOps ops[ZP_COMP_N])
{
    const ZpSchedule s = {.model = *model, .plan = *plan,
                          .elem_bytes = zp_plan_elem_bytes(plan->precision)};
    const Builder b = {.state = zp_impl_state_bytes(plan)};
    const uint64_t L = (uint64_t)model->layers;
    const Cost fwd = zp_build_block_forward_cost(&s), bwd = zp_build_block_backward_cost(&s);
    const Cost embed = zp_build_embed_cost(&s), head = zp_build_head_cost(&s);
    const double opt_elems = (double)zp_sched_optimizer_elems(model, plan);
    const double cpu_share = zp_offload_cpu_share(plan, opt_elems);
    const Cost opt = zp_build_optimizer_cost(&b, (1.0 - cpu_share) * opt_elems);
    const Cost cpu_opt = {.mem_bytes = cpu_share * opt_elems * zp_offload_cpu_adam_bytes(plan)};
    const uint64_t micro = (uint64_t)plan->grad_accum;
    const struct {
        uint64_t count;
        Cost cost;
    } kinds[ZP_COMP_N] = {
        [ZP_COMP_EMBED_FWD] = {micro, embed},
        [ZP_COMP_BLOCK_FWD] = {micro * L, fwd},
        [ZP_COMP_HEAD] = {micro, head},
        [ZP_COMP_RECOMPUTE] = {plan->checkpoint || zp_build_selective(plan) ? micro * L : 0,
                               zp_build_recompute_cost(&s)},
        [ZP_COMP_BLOCK_BWD] = {micro * L, bwd},
        [ZP_COMP_EMBED_BWD] = {micro, embed},
        [ZP_COMP_OPTIMIZER] = {cpu_share < 1.0, opt},
        [ZP_COMP_CPU_OPTIMIZER] = {cpu_share > 0, cpu_opt},
        [ZP_COMP_HOST_COPY] = {zp_zeror_checkpoint(model, plan).copy_bytes > 0 ? 2 * micro * L : 0,
                               {0}},
    };
    for (int k = 0; k < ZP_COMP_N; k++)
        ops[k] = (ZpComputeOps){kinds[k].count, kinds[k].cost.flops, kinds[k].cost.gemm_flops,
                                kinds[k].cost.attn_flops, kinds[k].cost.mem_bytes,
                                k == ZP_COMP_HOST_COPY ? zp_zeror_checkpoint(model, plan).copy_bytes
                                                       : 0.0};
    zp_build_moe_compute_ops(model, plan, ops);
}

/* Ring volumes: what one member of an n-rank group sends; a p2p send moves its bytes once.
 * With pipeline stages, the most any stage's rank sends. */
double zp_sched_comm_bytes(const ZpSchedule *s, ZpGroup group)
{
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(s, groups);
    const double n = (int)group < n_groups ? groups[group].ranks : 1;
    double *total = g_new0(double, MAX(s->stages, 1)), most = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->group != group || (op->kind != ZP_OP_COLLECTIVE && op->kind != ZP_OP_P2P))
            continue;
        const double factor = op->sub == ZP_COLL_ALLREDUCE ? 2.0 : 1.0;
        total[op->stage] += op->kind == ZP_OP_P2P ? op->bytes : factor * (n - 1) / n * op->bytes;
    }
    for (int k = 0; k < MAX(s->stages, 1); k++)
        most = MAX(most, total[k]);
    g_free(total);
    return most;
}

/* A logical distance's placed one under tp-dp-pp with a pipeline: dp's multiples (a dp rank is
 * mp P apart, placed mp), the pipeline's stage (mp apart, placed mp dp), or inside a stage's
 * tensor group, which both orders keep together. */
static int64_t placed_distance(const ZpSchedule *s, int64_t distance, int ranks)
{
    const int64_t mp = s->plan.mp, P = MAX(s->stages, 1);
    if (distance % (mp * P) == 0)
        return distance / P;
    if (distance == mp && ranks == P)
        return mp * s->plan.dp;
    return distance;
}

ZpCommGroup zp_sched_placed_group(const ZpSchedule *s, const ZpCommGroup *g)
{
    if (s->plan.rank_order != ZP_ORDER_TP_DP_PP || MAX(s->stages, 1) == 1)
        return *g;
    const int run = (int)zp_group_run(g);
    const int stride = (int)placed_distance(s, g->stride, run == g->ranks ? g->ranks : 0);
    if (run == g->ranks) {
        ZpCommGroup placed = *g;
        placed.stride = stride;
        return placed;
    }
    /* Runs (Megatron's expert groups: tensor ranks of several dp ranks): the runs' distance, a
     * multiple of dp's, placed; one run where they then abut (zp_group_runs). */
    ZpCommGroup placed = zp_group_runs(run, stride, g->ranks / run,
                                       (int)placed_distance(s, g->run_stride, 0));
    g_strlcpy(placed.name, g->name, sizeof placed.name);
    return placed;
}

int zp_sched_placed_stride(const ZpSchedule *s, const ZpCommGroup *g)
{
    return zp_sched_placed_group(s, g).stride;
}

int zp_sched_groups(const ZpSchedule *s, ZpCommGroup out[ZP_SCHED_MAX_GROUPS])
{
    if (s->n_groups > 0) {
        memcpy(out, s->groups, (size_t)s->n_groups * sizeof *out);
        return s->n_groups;
    }
    /* zplan's ranks are tp-fastest, then pipeline stage, then dp, whatever the plan's order
     * (ZpRankOrder; zp_sched_placed_stride says where a group's members sit). */
    const int stages = MAX(s->stages, 1);
    out[ZP_GROUP_DP] = (ZpCommGroup){.ranks = s->plan.dp, .stride = s->plan.mp * stages};
    out[ZP_GROUP_TP] = (ZpCommGroup){.ranks = s->plan.mp, .stride = 1};
    out[ZP_GROUP_PP] = (ZpCommGroup){.ranks = stages, .stride = s->plan.mp};
    /* ZeRO++'s subgroups of dp (zp_zeropp_group_ranks), each only where its technique is on
     * (one rank otherwise: 12 GPUs on 8-GPU nodes have no node group to tile without qgZ):
     * hpZ's and a node's consecutive dp ranks, and one dp rank of each node. */
    const int dp_stride = s->plan.mp * stages;
    const gboolean qgz = s->plan.zero.zero_quantized_gradients;
    const int local = qgz ? zp_zeropp_group_ranks(&s->plan, ZP_GROUP_NODE) : 1;
    out[ZP_GROUP_HPZ] = (ZpCommGroup){.ranks = zp_zeropp_group_ranks(&s->plan, ZP_GROUP_HPZ),
                                      .stride = dp_stride};
    out[ZP_GROUP_NODE] = (ZpCommGroup){.ranks = local, .stride = dp_stride};
    out[ZP_GROUP_XNODE] = (ZpCommGroup){
        .ranks = qgz ? zp_zeropp_group_ranks(&s->plan, ZP_GROUP_XNODE) : 1,
        .stride = dp_stride * local};
    /* Expert parallelism's subgroups of dp (zp_sched_graph.h): EP consecutive dp ranks, and
     * the dp / EP ranks EP apart that hold the same experts. */
    const int ep = zp_plan_ep(&s->plan), edp = zp_plan_edp(&s->plan), mp = s->plan.mp;
    const gboolean whole = zp_plan_etp(&s->plan) == 1 && mp > 1 && zp_moe_enabled(&s->model.moe);
    if (!whole) { /* split experts, or a dense model (its expert groups unused, laid out so) */
        out[ZP_GROUP_EP] = (ZpCommGroup){.ranks = ep, .stride = dp_stride};
        out[ZP_GROUP_EDP] = (ZpCommGroup){.ranks = s->plan.dp / ep, .stride = dp_stride * ep};
    } else if (ep % mp == 0) {
        /* Whole experts (ETP 1), Megatron's expert grid over the stage's tensor x dp ranks
         * (parallel_state.py, expert ranks tp-ep-dp): EP / mp whole tensor groups of
         * consecutive dp ranks, runs where a pipeline parts them (one run without: dp_stride
         * is mp), and the ranks EP apart in that grid, dp ranks EP / mp apart */
        out[ZP_GROUP_EP] = zp_group_runs(mp, 1, ep / mp, dp_stride);
        out[ZP_GROUP_EDP] = (ZpCommGroup){.ranks = edp, .stride = dp_stride * (ep / mp)};
    } else if (mp % ep == 0) {
        /* EP consecutive tensor ranks, and those EP apart in the tensor group of each dp rank */
        out[ZP_GROUP_EP] = (ZpCommGroup){.ranks = ep, .stride = 1};
        out[ZP_GROUP_EDP] = zp_group_runs(mp / ep, ep, s->plan.dp, dp_stride);
    } else {
        /* neither (zp_plan_etp_check allows it without a pipeline only): EP consecutive ranks
         * of the stage's grid, and the ranks EP apart in it */
        out[ZP_GROUP_EP] = (ZpCommGroup){.ranks = ep, .stride = 1};
        out[ZP_GROUP_EDP] = (ZpCommGroup){.ranks = edp, .stride = ep};
    }
    /* The all-gather dispatcher's TP x EP group (the expert tensor ranks of each EP rank: ETP
     * EP ranks): the EP group where ETP = 1, else the tensor groups of EP consecutive dp
     * ranks, runs where a pipeline parts them. One rank under the all-to-all dispatcher. */
    const gboolean gathers = s->plan.experts.dispatcher == ZP_DISPATCH_ALLGATHER;
    const int etp = zp_plan_etp(&s->plan);
    out[ZP_GROUP_TPEP] = !gathers  ? (ZpCommGroup){.ranks = 1, .stride = mp == 1 ? dp_stride : 1}
                         : etp == 1 ? out[ZP_GROUP_EP]
                                    : zp_group_runs(etp, 1, ep, dp_stride);
    for (int g = 0; g < ZP_GROUP_N; g++)
        g_strlcpy(out[g].name, zp_sched_group_names[g], sizeof out->name);
    return ZP_GROUP_N;
}
