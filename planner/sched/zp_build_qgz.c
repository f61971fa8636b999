/* zp_build_qgz: ZeRO++'s quantised gradient reduction (qgZ) in the schedule: the quantize
 * kernels and the all-to-all pairs of a bucket, whole or tensor by tensor (zp_zeropp). */
#include "zp_build.h"
#include "zp_mem.h"
#include "zp_zeropp.h"

/* A memory-bound ZeRO++ kernel (zp_zeropp) on `stream`, after `after`. */
uint32_t zp_build_emit_quantize(Builder *b, ZpStream stream, int unit, int micro, double mem_bytes,
                                const uint32_t *after, guint n_after)
{
    ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_QUANTIZE, .stream = stream, .unit = unit,
               .micro = micro, .buffer = -1, .mem_bytes = mem_bytes};
    return zp_build_emit(b, op, after, n_after);
}

/* qgZ's ops on `elems` gradient elements at flat offset lo of bucket k, after deps: its
 * buffers' alloc (workspace from the quantisation to the end, q->work_bytes), the output it
 * leaves (q->output_bytes, a bucket buffer listed in `copies`, freed once the bucket's reduced
 * slices are taken), the quantisation on the reduce stream, the all-to-all inside the node
 * (naming the bucket it reads and depending on the output's alloc, which zreal writes;
 * released after it), the node's reduction, the all-to-all across nodes, the dequantisation
 * (k->coll_op). DeepSpeed sends each stage's int4 data and its scales by two
 * all_to_all_single calls of one group, one after the other: one op here. Returns the
 * intra-node all-to-all, after which the gradients were read. */
static uint32_t qgz_ops(Builder *b, Bucket *k, uint64_t lo, uint64_t elems, const ZpQgz *q,
                        int unit, int micro, const uint32_t *deps, guint n_deps, GArray *copies)
{
    int work;
    uint32_t node_deps[2] = {NONE, NONE};
    if (q->output_bytes > 0)
        node_deps[1] = zp_build_bucket_copy(b, k, q->output_bytes, micro, deps, n_deps, copies);
    const uint32_t alloc = zp_build_emit_alloc(b, ZP_MEM_WORKSPACE, q->work_bytes,
                                               k->spec.top_unit, micro, &work, deps, n_deps);
    node_deps[0] =
        zp_build_emit_quantize(b, ZP_STREAM_DP, unit, micro, q->quantize_mem_bytes, &alloc, 1);
    const uint32_t read =
        zp_build_emit_collective(b, ZP_COLL_ALLTOALL, ZP_GROUP_NODE, unit, micro, k->buffer, lo,
                                 elems, q->intra_bytes, node_deps, q->output_bytes > 0 ? 2 : 1);
    uint32_t op =
        zp_build_emit_quantize(b, ZP_STREAM_DP, unit, micro, q->reduce_mem_bytes, &read, 1);
    op = zp_build_emit_collective(b, ZP_COLL_ALLTOALL, ZP_GROUP_XNODE, unit, micro, -1, lo, elems,
                                  q->inter_bytes, &op, 1);
    k->coll_op =
        zp_build_emit_quantize(b, ZP_STREAM_DP, unit, micro, q->dequantize_mem_bytes, &op, 1);
    zp_build_emit_free(b, ZP_MEM_WORKSPACE, q->work_bytes, k->spec.top_unit, micro, work,
                       k->coll_op);
    return read;
}

/* qgZ (zp_zeropp_qgz) on the whole bucket: one pair of all-to-alls. */
uint32_t zp_build_qgz_reduce(Builder *b, Bucket *k, int unit, int micro, const uint32_t cdeps[3])
{
    const ZpSchedule *s = b->s;
    const ZpQgz q = zp_zeropp_qgz(&s->plan, k->spec.bytes / zp_plan_reduce_bytes(&s->plan),
                                  (double)s->model.hidden / s->plan.mp,
                                  zp_plan_reduce_bytes(&s->plan));
    return qgz_ops(b, k, k->spec.lo, k->spec.hi - k->spec.lo, &q, unit, micro, cdeps, 3, NULL);
}

/* DeepSpeed's qgZ (zp_impl.h qgz_by_tensor): the bucket's tensors in flat order
 * (__reduce_and_partition_ipg_grads sorts them by ds_id), one after another on the reduce
 * stream. A quantised one goes through qgz_ops in zp_zeropp_qgz_tensor's figures; another
 * is reduce-scattered over the data-parallel ranks alone, padded to them
 * (reduce_scatter_coalesced([tensor]): in place when no padding is needed, else through a
 * padded copy). Returns the last op that read the bucket. */
uint32_t zp_build_qgz_by_tensor(Builder *b, Bucket *k, int unit, int micro, uint32_t after,
                                GArray *copies)
{
    const ZpSchedule *s = b->s;
    const double rb = zp_plan_reduce_bytes(&s->plan);
    if (!b->tensors)
        b->tensors = zp_impl_tensors(s);
    uint32_t prev = NONE, read = NONE;
    for (guint i = 0; i < b->tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(b->tensors, ZpImplTensor, i);
        if (t->offset < k->spec.lo || t->offset >= k->spec.hi)
            continue;
        uint32_t deps[5] = {k->alloc_op, b->last_compute, after, prev, NONE};
        if (zp_zeropp_qgz_quantizes(&s->plan, t->elems, t->matrix)) {
            const ZpQgz q = zp_zeropp_qgz_tensor(&s->plan, (double)t->elems,
                                                 (double)s->model.hidden, rb);
            read = qgz_ops(b, k, t->offset, t->elems, &q, unit, micro, deps, 4, copies);
            prev = k->coll_op;
            continue;
        }
        const double padded = (double)zp_mem_padded_elems(t->elems, (uint64_t)s->plan.dp);
        if (t->elems % (uint64_t)s->plan.dp != 0)
            deps[4] = zp_build_bucket_copy(b, k, padded * rb, micro, deps, 4, copies);
        read = prev = k->coll_op =
            zp_build_emit_collective(b, ZP_COLL_REDUCE_SCATTER, ZP_GROUP_DP, unit, micro, k->buffer,
                                     t->offset, t->elems, padded * rb, deps, 5);
    }
    return read;
}
