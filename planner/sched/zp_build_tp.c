/* zp_build_tp: tensor parallelism in the schedule (Megatron): the all-reduces of a block's
 * row-parallel sums and the vocab-parallel embedding and head. */
#include "zp_build.h"

#include <string.h>

/* One tensor-parallel all-reduce of b*s*h activations or their gradients. With sequence
 * parallelism it is a reduce-scatter (into the sequence-split layer norm and dropout) and an
 * all-gather (back to the full sequence for the next tensor-parallel GEMM): the same bytes, in
 * two collectives. */
ZpTpSum zp_build_tp_sum_shape(const ZpSchedule *s)
{
    static const ZpCollKind plain[] = {ZP_COLL_ALLREDUCE};
    static const ZpCollKind split[] = {ZP_COLL_REDUCE_SCATTER, ZP_COLL_ALLGATHER};
    const uint64_t elems = (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                           (uint64_t)s->model.hidden;
    const gboolean sp = s->plan.sequence_parallel;
    const ZpCollKind *kinds = sp ? split : plain;
    ZpTpSum t = {.n = sp ? 2 : 1};
    for (int k = 0; k < t.n; k++) { /* each after the op before it alone */
        ZpOp *op = &t.ops[k];
        memset(op, 0, sizeof *op); /* as the emitters clear theirs (zp_build_emit.c) */
        op->kind = ZP_OP_COLLECTIVE, op->sub = (uint8_t)kinds[k];
        op->stream = ZP_STREAM_TP, op->group = ZP_GROUP_TP, op->buffer = -1;
        op->elems = elems, op->bytes = (double)elems * s->elem_bytes, op->n_deps = 1;
    }
    return t;
}

/* `sums` such sums, each after the last compute op: on the critical path, so the next compute
 * op waits for them. */
void zp_build_tp_sums(Builder *b, int unit, int micro, int sums)
{
    zp_build_emit_tp_chain(b, sums, unit, micro, b->last_compute);
}

/* The vocab-parallel head's loss, as zreal computes it: each rank's log-sum-exp over its
 * vocabulary rows and its logit of the target (0 when another rank's rows hold it), two fp32
 * per token, all-gathered over the tensor group (Megatron's vocab_parallel_cross_entropy
 * all-reduces the maximum, the target logit and the sum of exponentials instead: 3 x 4bs
 * bytes, the same as this at mp 2); then the sum of the head's input gradient, b*s*h
 * (the column-parallel head's backward). */
void zp_build_vocab_parallel_head(Builder *b, int micro)
{
    const ZpSchedule *s = b->s;
    if (s->plan.mp == 1)
        return;
    const uint64_t elems = 2 * (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                           (uint64_t)s->plan.mp;
    const int unit = (int)s->model.layers + 1;
    uint32_t after = zp_build_emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_TP, unit, micro, -1, 0,
                                              elems, 4.0 * (double)elems, &b->last_compute, 1);
    zp_build_sync_on(b, after);
    zp_build_tp_sums(b, unit, micro, 1);
}
