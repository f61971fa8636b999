/* zp_sched_json: writes a schedule as JSON (`zplan schedule --out`): its ops, groups, layout
 * and states, every op's stream written only where it is not its kind's default. */
#include "zp_sched.h"
#include "zp_sched_json.h"
#include "zp_budget.h"
#include "zp_schedsize.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <jansson.h>

/* Compute runs on the compute stream (CPU Adam on the CPU's), a collective on its group's
 * (tp's on the tp stream, every other group's on NCCL's dp stream), a transfer on the host
 * link's or the NVMe's, a pipeline send on the pp stream, unless "stream" says otherwise
 * (written only then). A mixture of experts' dispatch and combine run on the compute stream:
 * Megatron-Core's token dispatchers (token_dispatcher.py, all_to_all on the current stream)
 * and DeepSpeed's _AllToAll (sharded_moe.py) issue them between the layer's kernels, and so
 * does the all-gather dispatcher its gathers and reduce-scatters over TP x EP (tpep). */
ZpStream zp_sched_json_default_stream(int kind, int sub, int group)
{
    if (kind == ZP_OP_TRANSFER)
        return sub == ZP_XFER_D2H || sub == ZP_XFER_H2D ? ZP_STREAM_HOST : ZP_STREAM_NVME;
    if (kind == ZP_OP_COMPUTE)
        return sub == ZP_COMP_CPU_OPTIMIZER ? ZP_STREAM_CPU : ZP_STREAM_COMPUTE;
    if (kind == ZP_OP_P2P)
        return ZP_STREAM_PP;
    if (kind != ZP_OP_COLLECTIVE || sub == ZP_COLL_EP_DISPATCH || sub == ZP_COLL_EP_COMBINE ||
        group == ZP_GROUP_TPEP)
        return ZP_STREAM_COMPUTE;
    return group == ZP_GROUP_TP ? ZP_STREAM_TP : ZP_STREAM_DP;
}

static json_t *op_to_json(const ZpSchedule *s, const ZpCommGroup *groups, const ZpOp *op)
{
    json_t *deps = json_array();
    const uint32_t *d = zp_sched_deps(s, op);
    for (uint32_t i = 0; i < op->n_deps; i++)
        json_array_append_new(deps, json_integer(d[i]));
    json_t *o = json_pack("{s:s, s:i, s:i}", "kind", zp_sched_kind_names[op->kind], "unit",
                          op->unit, "micro", op->micro);
    switch (op->kind) {
    case ZP_OP_COMPUTE:
        json_object_set_new(o, "op", json_string(zp_sched_compute_names[op->sub]));
        json_object_set_new(o, "flops", json_real(op->flops));
        json_object_set_new(o, "gemm_flops", json_real(op->gemm_flops));
        json_object_set_new(o, "attn_flops", json_real(op->attn_flops));
        json_object_set_new(o, "mem_bytes", json_real(op->mem_bytes));
        if (op->bytes > 0)
            json_object_set_new(o, "bytes", json_real(op->bytes));
        if (zp_op_module(op) >= 0)
            json_object_set_new(o, "module", json_string(zp_model_module_name(zp_op_module(op))));
        break;
    case ZP_OP_COLLECTIVE:
        json_object_set_new(o, "op", json_string(zp_sched_coll_names[op->sub]));
        json_object_set_new(o, "group", json_string(groups[op->group].name));
        json_object_set_new(o, "buffer", json_integer(op->buffer));
        json_object_set_new(o, "bytes", json_real(op->bytes));
        json_object_set_new(o, "elem_offset", json_integer((json_int_t)op->elem_offset));
        json_object_set_new(o, "elems", json_integer((json_int_t)op->elems));
        break;
    case ZP_OP_TRANSFER:
        json_object_set_new(o, "op", json_string(zp_sched_transfer_names[op->sub]));
        json_object_set_new(o, "bytes", json_real(op->bytes));
        break;
    case ZP_OP_P2P:
        json_object_set_new(o, "op", json_string(zp_sched_p2p_names[op->sub]));
        json_object_set_new(o, "peer", json_integer(op->peer));
        json_object_set_new(o, "bytes", json_real(op->bytes));
        json_object_set_new(o, "elems", json_integer((json_int_t)op->elems));
        break;
    default:
        json_object_set_new(o, "category", json_string(zp_sched_mem_names[op->sub]));
        json_object_set_new(o, "buffer", json_integer(op->buffer));
        json_object_set_new(o, "bytes", json_real(op->bytes));
    }
    if ((op->kind <= ZP_OP_COLLECTIVE || op->kind == ZP_OP_TRANSFER) &&
        op->stream != zp_sched_json_default_stream(op->kind, op->sub, op->group))
        json_object_set_new(o, "stream", json_string(zp_sched_stream_names[op->stream]));
    if (s->stages > 1) /* the rank class that runs it */
        json_object_set_new(o, "stage", json_integer(op->stage));
    json_object_set_new(o, "deps", deps);
    return o;
}

/* The communicators and where their members sit: ranks are numbered tp-fastest, so a TP
 * group is mp consecutive ranks and a DP group every mp-th rank; a graph's own follow. */
static json_t *groups_json(const ZpCommGroup *groups, int n_groups)
{
    json_t *a = json_array();
    /* edp at EP 1 is all of dp, as the reader takes it where absent, unless the experts are
     * whole over TP (then all of a stage's tensor and dp ranks): written then */
    const ZpCommGroup *dp = &groups[ZP_GROUP_DP], *edp = &groups[ZP_GROUP_EDP];
    const gboolean edp_as_read = n_groups > ZP_GROUP_EDP && groups[ZP_GROUP_EP].ranks == 1 &&
                                 edp->ranks == dp->ranks && edp->stride == dp->stride &&
                                 zp_group_run(edp) == edp->ranks;
    for (int g = 0; g < n_groups; g++)
        /* No pipeline, no ZeRO++ subgroup, no experts: none of those groups written */
        if (g < ZP_GROUP_PP || g >= ZP_GROUP_N ||
            (groups[g].ranks > 1 && (g != ZP_GROUP_EDP || !edp_as_read))) {
            json_t *o = json_pack("{s:s, s:i, s:i}", "name", groups[g].name, "ranks",
                                  groups[g].ranks, "stride", groups[g].stride);
            if (zp_group_run(&groups[g]) < groups[g].ranks) { /* runs (zp_sched_graph.h) */
                json_object_set_new(o, "run", json_integer(groups[g].run));
                json_object_set_new(o, "run_stride", json_integer(groups[g].run_stride));
            }
            json_array_append_new(a, o);
        }
    return a;
}

static json_t *units_json(const ZpSchedule *s)
{
    json_t *units = json_array();
    for (int u = 0; u < s->n_units; u++)
        json_array_append_new(units, json_pack("[I, I]", (json_int_t)s->unit_offset[u],
                                               (json_int_t)s->unit_elems[u]));
    return units;
}

/* A pipeline's stage views (zp_sched_stage_view): each stage's model states and unit layout,
 * [{"state_bytes", "units"}] by stage. */
json_t *zp_sched_json_stages_json(const ZpSchedule *s)
{
    json_t *stages = json_array();
    for (int k = 0; k < s->stages; k++) {
        ZpSchedule *view = zp_sched_stage_view(s, k);
        json_array_append_new(stages,
                              json_pack("{s:o, s:o}", "state_bytes",
                                        zp_sched_categories_json(view->state_bytes), "units",
                                        units_json(view)));
        zp_sched_free(view);
    }
    return stages;
}

/* One op's line of the digest: its compact JSON, keys sorted. */
static void digest_op(GChecksum *sum, json_t *o)
{
    char *text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    g_assert(text); /* jansson fails only when out of memory, as GLib would abort */
    g_checksum_update(sum, (const guchar *)text, (gssize)strlen(text));
    g_checksum_update(sum, (const guchar *)"\n", 1);
    free(text);
}

static char *digest_finish(GChecksum *sum)
{
    char *digest = g_strconcat("sha256:", g_checksum_get_string(sum), NULL);
    g_checksum_free(sum);
    return digest;
}

char *zp_sched_digest(const ZpSchedule *s)
{
    return zp_sched_digest_progress(s, NULL, NULL);
}

char *zp_sched_digest_progress(const ZpSchedule *s, ZpProgressFn progress, void *progress_ctx)
{
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    zp_sched_groups(s, groups);
    GChecksum *sum = g_checksum_new(G_CHECKSUM_SHA256);
    for (guint i = 0; i < s->ops->len; i++) {
        json_t *o = op_to_json(s, groups, zp_sched_op(s, i));
        digest_op(sum, o);
        json_decref(o);
        if (progress && (i + 1) % 4096 == 0)
            progress((double)(i + 1) / s->ops->len, progress_ctx);
    }
    return digest_finish(sum);
}

/* Writes the root object's next member, `"key": value`, at depth 1; takes value's
 * reference. */
static gboolean put_member(ZpOutStream *out, gsize *members, const char *key, json_t *value,
                           GError **error)
{
    const gboolean ok = zp_out_stream_json_item(out, 1, (*members)++, key, error) &&
                        zp_out_stream_json(out, value, 1, error);
    json_decref(value);
    return ok;
}

/* "ops": each op's object made, dumped (into the file and the digest) and freed in turn, so
 * the schedule is never a tree whole; *digest is the ops' zp_sched_digest. */
typedef struct {
    ZpProgressFn fn;
    void *ctx;
} WriteProgress;

static gboolean put_ops(ZpOutStream *out, gsize *members, const ZpSchedule *s,
                        const ZpCommGroup *groups, const WriteProgress *progress, char **digest,
                        GError **error)
{
    if (!zp_out_stream_json_item(out, 1, (*members)++, "ops", error) ||
        !zp_out_stream_write(out, "[", 1, error))
        return FALSE;
    GChecksum *sum = g_checksum_new(G_CHECKSUM_SHA256);
    gboolean ok = TRUE;
    for (guint i = 0; ok && i < s->ops->len; i++) {
        json_t *o = op_to_json(s, groups, zp_sched_op(s, i));
        digest_op(sum, o);
        ok = zp_out_stream_json_item(out, 2, i, NULL, error) &&
             zp_out_stream_json(out, o, 2, error);
        json_decref(o);
        if (progress->fn && (i + 1) % 4096 == 0)
            progress->fn((double)(i + 1) / s->ops->len, progress->ctx);
    }
    *digest = digest_finish(sum);
    return ok && zp_out_stream_json_close(out, 2, s->ops->len, ']', error);
}

/* The root object's members in zp_json_write's text, the ops streamed (put_ops) and the rest
 * small trees: format, model (none for a graph read without one: it has no units), plan,
 * world, elem_bytes, state_bytes, units, total_elems, padded_elems, partition_elems, ops,
 * groups, digest, and a pipeline's stages. */
static gboolean put_root(ZpOutStream *out, const ZpSchedule *s, const WriteProgress *progress,
                         GError **error)
{
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(s, groups);
    gsize n = 0;
    char *digest = NULL;
    const gboolean ok =
        zp_out_stream_write(out, "{", 1, error) &&
        put_member(out, &n, "format", json_string("zplan-schedule-1"), error) &&
        (s->n_units == 0 || put_member(out, &n, "model", zp_model_to_json(&s->model), error)) &&
        put_member(out, &n, "plan", zp_plan_to_json(&s->plan), error) &&
        put_member(out, &n, "world", json_integer(s->world), error) &&
        put_member(out, &n, "elem_bytes", json_real(s->elem_bytes), error) &&
        put_member(out, &n, "state_bytes", zp_sched_categories_json(s->state_bytes), error) &&
        put_member(out, &n, "units", units_json(s), error) &&
        put_member(out, &n, "total_elems", json_integer((json_int_t)s->total_elems), error) &&
        put_member(out, &n, "padded_elems", json_integer((json_int_t)s->padded_elems), error) &&
        put_member(out, &n, "partition_elems", json_integer((json_int_t)s->partition_elems),
                   error) &&
        put_ops(out, &n, s, groups, progress, &digest, error) &&
        put_member(out, &n, "groups", groups_json(groups, n_groups), error) &&
        put_member(out, &n, "digest", json_string(digest), error) &&
        (s->stages <= 1 || put_member(out, &n, "stages", zp_sched_json_stages_json(s), error)) &&
        zp_out_stream_json_close(out, 1, n, '}', error) && zp_out_stream_write(out, "\n", 1, error);
    g_free(digest);
    return ok;
}

gboolean zp_sched_write_json(const ZpSchedule *s, const char *path, GError **error)
{
    return zp_sched_write_json_progress(s, path, NULL, NULL, error);
}

gboolean zp_sched_write_json_progress(const ZpSchedule *s, const char *path,
                                      ZpProgressFn progress, void *progress_ctx, GError **error)
{
    /* What is held: the stream's buffer, one op's object and text, and the small trees, of
     * which the units' layout (by stage in a pipeline) is the largest. */
    const double units = (double)s->n_units * (s->stages > 1 ? s->stages + 1 : 1);
    if (!zp_budget_check("writing the schedule as JSON", units, "units", 0, NULL,
                         ZP_OUT_STREAM_BUFFER + units * ZP_SCHED_JSON_UNIT_BYTES, error))
        return FALSE;
    ZpOutStream *out = zp_out_stream_open(path, error);
    if (!out)
        return FALSE;
    const WriteProgress told = {progress, progress_ctx};
    if (!put_root(out, s, &told, error)) {
        zp_out_stream_abort(out);
        return FALSE;
    }
    return zp_out_stream_close(out, error);
}
