/* zp_sched_graph: the op graph's names (the JSON schedule's spelling of every enum) and the
 * release of a schedule; what builds one lives in sched/, what reads one in sim/ and real/. */
#include "zp_sched_graph.h"
#include "zp_util.h"

#include <jansson.h>

const char *const zp_sched_compute_names[] = {"embed_fwd", "block_fwd", "head", "recompute",
                                              "block_bwd", "embed_bwd", "optimizer",
                                              "cpu_optimizer", "host_copy", "quantize", "unpack",
                                              "expert_fwd", "expert_bwd", "unpermute_fwd",
                                              "unpermute_bwd", NULL};
const char *const zp_sched_coll_names[] = {"allreduce", "reduce_scatter", "allgather", "alltoall",
                                           "ep_dispatch", "ep_combine", NULL};
const char *const zp_sched_mem_names[] = {"params", "grads", "master", "adam_m", "adam_v",
                                          "gathered_params", "buckets", "activations",
                                          "checkpoints", "workspace", "secondary_params",
                                          "ep_buffers", NULL};
const char *const zp_sched_stream_names[] = {"compute", "dp", "tp", "pp", "host", "nvme", "cpu",
                                           NULL};
const char *const zp_sched_kind_names[] = {"compute", "collective", "alloc", "free", "p2p",
                                           "transfer", NULL};
const char *const zp_sched_p2p_names[] = {"send_next", "send_prev", "tied", NULL};
const char *const zp_sched_transfer_names[] = {"d2h", "h2d", "nvme_read", "nvme_write", NULL};
/* ZeRO++'s built-in groups carry names of their own, so a file's groups ("node", "world")
 * keep theirs. */
const char *const zp_sched_group_names[] = {"dp", "tp", "pp", "hpz", "qgz_node", "qgz_cross",
                                            "ep", "edp", "tpep", NULL};

const char *zp_sched_compute_name(ZpComputeKind kind) { return zp_sched_compute_names[kind]; }
const char *zp_sched_op_kind_name(ZpOpKind kind) { return zp_sched_kind_names[kind]; }
const char *zp_sched_coll_name(ZpCollKind kind) { return zp_sched_coll_names[kind]; }
const char *zp_sched_mem_name(ZpMemCategory category) { return zp_sched_mem_names[category]; }
const char *zp_sched_stream_name(ZpStream stream) { return zp_sched_stream_names[stream]; }
const char *zp_sched_transfer_name(ZpTransferKind kind) { return zp_sched_transfer_names[kind]; }

gboolean zp_group_check(const ZpCommGroup *g, int64_t world, const char *what, GError **error)
{
    if (zp_group_tiles(g, world))
        return TRUE;
    if (zp_group_run(g) < g->ranks)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %d ranks in runs of %d ranks %d apart, the runs %d apart, do not tile "
                    "the world of %" G_GINT64_FORMAT " (run must divide ranks, run_stride be a "
                    "multiple of run x stride, and run_stride x ranks / run divide the world)",
                    what, g->ranks, g->run, g->stride, g->run_stride, world);
    else
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %d ranks %d apart do not tile the world of %" G_GINT64_FORMAT
                    " (ranks x stride must divide it)", what, g->ranks, g->stride, world);
    return FALSE;
}

void *zp_sched_categories_json(const double bytes[ZP_MEM_N])
{
    json_t *o = json_object();
    for (int c = 0; c < ZP_MEM_N; c++)
        json_object_set_new(o, zp_sched_mem_names[c], json_real(bytes[c]));
    return o;
}

void zp_sched_memo_drop_layout(ZpSchedMemo *memo)
{
    if (memo->impl_tensors)
        g_array_unref(memo->impl_tensors);
    g_free(memo->layout);
    g_free(memo->part_offset);
    g_free(memo->part_before);
    memo->impl_tensors = NULL;
    memo->layout = NULL;
    memo->part_offset = NULL;
    memo->part_before = NULL;
    memo->n_units = 0;
}

void zp_sched_memo_destroy(ZpSchedMemo *memo)
{
    if (!memo)
        return;
    zp_sched_memo_drop_layout(memo);
    if (memo->model_tensors)
        g_array_unref(memo->model_tensors);
    g_free(memo->tensor_notes);
    g_free(memo);
}

void zp_sched_memo_free(ZpSchedule *s)
{
    zp_sched_memo_destroy(s->memo);
    s->memo = NULL;
}

void zp_sched_free(ZpSchedule *s)
{
    if (!s)
        return;
    g_array_unref(s->ops);
    g_array_unref(s->deps);
    g_free(s->unit_offset);
    g_free(s->unit_elems);
    g_free(s->stage_state_bytes);
    g_free(s->stage_host_bytes);
    g_free(s->stage_unit_elems);
    zp_sched_memo_free(s);
    g_free(s);
}
