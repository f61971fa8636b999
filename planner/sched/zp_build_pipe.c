/* zp_build_pipe: pipeline parallelism in the schedule: a stage's p2p sends of activations and
 * gradients to its neighbours, and the tied embedding's gradient exchange after the flush. */
#include "zp_build.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

/* Sends the chunk's output activations (forward) or its input gradients (backward) to the
 * neighbouring stage once the last compute op and its tensor-parallel all-reduces are done:
 * b s h elements, or b s h / t when sequence parallelism keeps the sequence split over the
 * TP group (Megatron's p2p_communication sends each rank's own part). */
/* Narayanan et al. 2021 section 4.1, the implementation's p2p_scatter_gather: each tensor
 * rank sends only its 1/t of the b s h activations over the network and the receiving ranks
 * all-gather them over NVLink; with sequence parallelism each rank's part is its own already. */
gboolean zp_build_p2p_scatter_gather(const ZpPlan *plan)
{
    return zp_impl_get(plan->impl)->p2p_scatter_gather && plan->mp > 1 &&
           !plan->sequence_parallel;
}

void zp_build_receive(Builder *b, int unit, int micro)
{
    const ZpSchedule *s = b->s;
    if (b->recv_key < 0 || !b->p2p_scatter_gather)
        return;
    const uint64_t elems = (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                           (uint64_t)s->model.hidden;
    const uint32_t gathered =
        zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_TP, unit, micro, -1, 0, elems,
                                 (double)elems * s->elem_bytes, &b->last_compute, 1);
    zp_build_sync_on(b, gathered);
}

uint64_t zp_build_send_elems(const ZpSchedule *s, gboolean scatter_gather)
{
    uint64_t elems = (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                     (uint64_t)s->model.hidden;
    if (s->plan.sequence_parallel || scatter_gather)
        elems /= (uint64_t)s->plan.mp;
    return elems;
}

/* The size from Builder.send_elems, worked out once a build: each send asked for it and for
 * the stage count through zp_plan_pp (narayanan21-t1-529.6b: 52 instructions a send besides
 * its op, 36,400 sends). */
void zp_build_send(Builder *b, int chunk, int micro, ZpP2pKind dir, int unit)
{
    const ZpSchedule *s = b->s;
    const uint64_t elems = b->send_elems;
    const int P = s->stages;
    const int peer = dir == ZP_P2P_SEND_NEXT ? (b->stage + 1) % P : (b->stage + P - 1) % P;
    b->send_op[zp_build_send_key(b, chunk, micro, dir)] = zp_build_emit_p2p(
        b, dir, unit, micro, (uint32_t)peer, elems, (double)elems * s->elem_bytes);
}

/* A tied word embedding under a pipeline: the first stage (the embedding) and the last (the
 * head's copy of it) each send the other its gradient once its last backward is done, and the
 * stage's next compute op or collective (its first gradient reduction, or its optimizer) waits
 * for the other's and adds it first. DeepSpeed's TrainSchedule runs ReduceTiedGrads before
 * ReduceGrads (deepspeed/runtime/pipe/schedule.py; engine.py _exec_reduce_tied_grads calls
 * module.py allreduce_tied_weight_gradients, an all-reduce over the TiedLayerSpec's group);
 * Megatron all-reduces word_embeddings' main_grad over its embedding group of the first and
 * last stage (megatron/core/distributed/finalize_model_grads.py
 * _allreduce_word_embedding_grads). Two ranks' all-reduce sends S each way, as here. */
void zp_build_tied_sync(Builder *b, const GArray *after)
{
    const ZpSchedule *s = b->s;
    const int P = zp_plan_pp(&s->plan), L = (int)s->model.layers;
    if (P == 1 || !s->model.tied_embeddings || (b->stage != 0 && b->stage != P - 1))
        return;
    const uint64_t elems = ((uint64_t)s->model.vocab + (uint64_t)s->plan.mp - 1) /
                           (uint64_t)s->plan.mp * (uint64_t)s->model.hidden;
    const gboolean first = b->stage == 0;
    const int chunk = first ? 0 : b->n_chunks - 1, last_micro = s->plan.grad_accum - 1;
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_array_append_val(deps, b->last_compute);
    g_array_append_vals(deps, b->sync_deps->data, b->n_sync);
    if (after) /* the reductions it follows (ZpImpl tied_sync_after_reduction) */
        g_array_append_vals(deps, after->data, after->len);
    ZpOp op = {.kind = ZP_OP_P2P, .sub = ZP_P2P_TIED, .stream = ZP_STREAM_PP,
               .group = ZP_GROUP_PP, .unit = first ? 0 : L + 1, .micro = last_micro,
               .buffer = -1, .peer = (uint32_t)(first ? P - 1 : 0),
               .bytes = (double)elems * b->state.grad_bytes, .elems = elems};
    b->send_op[zp_build_send_key(b, chunk, last_micro, ZP_P2P_TIED)] =
        zp_build_emit(b, op, (uint32_t *)deps->data, deps->len);
    g_array_unref(deps);
    b->recv_key = zp_build_send_key(b, first ? b->n_chunks - 1 : 0, last_micro, ZP_P2P_TIED);
}

/* Once stage 0 is built: room for every stage's ops and dependencies at stage 0's count
 * (the others differ by the embedding and the head), taken once, within the ops the budget
 * allows (Builder.max_ops; a schedule past them stops there anyway); and for the dependencies
 * on other stages' sends, which stage 0 has fewest of (its forwards receive none): twice its
 * count a stage (Megatron 1T grew that array 13 times, 0.17 M instructions of copies). */
void zp_build_pipe_reserve(Builder *b, int stages)
{
    ZpSchedule *s = b->s;
    const guint ops = s->ops->len, deps = s->deps->len;
    if (stages < 2 || ops == 0)
        return;
    const double want = fmin((double)ops * stages * 1.25 + 64, b->max_ops);
    if (want <= ops)
        return;
    b->ops_room = MAX(b->ops_room, zp_array_reserve_huge(s->ops, (guint64)want));
    b->deps_room = MAX(b->deps_room, zp_array_reserve_huge(
                                         s->deps, (guint64)(want * ((double)deps / ops + 0.25))));
    const double cross = fmin(2.0 * b->cross->len * stages + 64, want);
    b->cross_room = MAX(b->cross_room, zp_array_reserve_huge(b->cross, (guint64)cross));
}
