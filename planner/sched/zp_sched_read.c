/* zp_sched_read: reads a schedule file back, validating every field (zreal executes what it
 * reads), and reads a schedule file as an op graph without its model (the simulator's). */
#include "zp_sched.h"
#include "zp_sched_json.h"
#include "zp_schedcheck.h"
#include "zp_schedsize.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

static gboolean name_index(json_t *o, const char *what, const char *key,
                           const char *const *names, int *out, GError **error);

/* One group of "groups": a name not yet taken, and ranks x stride dividing the world. */
static gboolean group_from_json(json_t *g, const char *what, int64_t world, ZpCommGroup *table,
                                int index, GError **error)
{
    static const char *const keys[] = {"name", "ranks", "stride", NULL};
    const char *name = NULL;
    int64_t ranks = 0, stride = 0;
    gboolean ok = json_is_object(g) && zp_json_check_keys(g, what, keys, error) &&
                  zp_json_get_string(g, what, "name", TRUE, &name, error) &&
                  zp_json_get_int(g, what, "ranks", TRUE, 1, INT32_MAX, &ranks, error) &&
                  zp_json_get_int(g, what, "stride", TRUE, 1, INT32_MAX, &stride, error);
    if (!ok) {
        if (error && !*error)
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
        return FALSE;
    }
    const char *problem = NULL;
    if (strlen(name) >= sizeof table->name)
        problem = "a group's name has at most 15 characters";
    for (int g = 0; !problem && g < index; g++)
        if (strcmp(table[g].name, name) == 0)
            problem = "a second group of that name";
    if (problem) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"name\": \"%s\": %s", what,
                    name, problem);
        return FALSE;
    }
    if (world % (ranks * stride) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %" G_GINT64_FORMAT " ranks %" G_GINT64_FORMAT " apart do not tile "
                    "the world of %" G_GINT64_FORMAT " (ranks x stride must divide it)",
                    what, ranks, stride, world);
        return FALSE;
    }
    table[index] = (ZpCommGroup){.ranks = (int)ranks, .stride = (int)stride};
    g_strlcpy(table[index].name, name, sizeof table->name);
    return TRUE;
}

/* Reads "groups" into dp, mp and the table: dp and tp, with the placement groups_json writes
 * (ranks tp-fastest), their sizes multiplying to world, and pp (a file's own, or the one
 * group of one rank a world without a pipeline has) go first in the table (ZpGroup); then,
 * where `others`, any other communicators in the file's order. */
static gboolean groups_from_json(json_t *groups, const char *path, int64_t world,
                                 gboolean others, ZpCommGroup table[ZP_SCHED_MAX_GROUPS],
                                 int *n_groups, int *dp, int *mp, GError **error)
{
    /* A planner's file: dp, tp, pp and ZeRO++'s subgroups where the plan has them. */
    const size_t most = others ? ZP_SCHED_MAX_GROUPS : ZP_GROUP_N;
    if (!json_is_array(groups) || json_array_size(groups) < 2 ||
        json_array_size(groups) > most) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"groups\" must be an array of dp, tp%s", path,
                    others ? " and at most 14 other groups"
                           : " and no other group than pp, hpz, qgz_node, qgz_cross, ep and edp");
        return FALSE;
    }
    ZpCommGroup read[ZP_SCHED_MAX_GROUPS];
    const int n = (int)json_array_size(groups);
    int at[ZP_GROUP_N]; /* where dp, tp, pp and ZeRO++'s groups are in the file */
    for (int g = 0; g < ZP_GROUP_N; g++)
        at[g] = -1;
    for (int i = 0; i < n; i++) {
        char *what = g_strdup_printf("%s: groups[%d]", path, i);
        const gboolean ok = group_from_json(json_array_get(groups, (size_t)i), what, world,
                                            read, i, error);
        g_free(what);
        if (!ok)
            return FALSE;
        for (int g = 0; g < ZP_GROUP_N; g++)
            if (strcmp(read[i].name, zp_sched_group_names[g]) == 0)
                at[g] = i;
    }
    if (at[ZP_GROUP_DP] < 0 || at[ZP_GROUP_TP] < 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"groups\" must hold a group named dp and one named tp", path);
        return FALSE;
    }
    table[ZP_GROUP_DP] = read[at[ZP_GROUP_DP]];
    table[ZP_GROUP_TP] = read[at[ZP_GROUP_TP]];
    if (at[ZP_GROUP_PP] >= 0) {
        table[ZP_GROUP_PP] = read[at[ZP_GROUP_PP]];
    } else {
        table[ZP_GROUP_PP] = (ZpCommGroup){.ranks = 1, .stride = table[ZP_GROUP_TP].ranks};
        g_strlcpy(table[ZP_GROUP_PP].name, zp_sched_group_names[ZP_GROUP_PP], sizeof table->name);
    }
    for (int g = ZP_GROUP_HPZ; g < ZP_GROUP_N; g++) { /* one rank each where absent */
        table[g] = at[g] >= 0 ? read[at[g]]
                              : (ZpCommGroup){.ranks = 1, .stride = table[ZP_GROUP_DP].stride};
        g_strlcpy(table[g].name, zp_sched_group_names[g], sizeof table->name);
    }
    *n_groups = ZP_GROUP_N;
    for (int i = 0; i < n; i++) {
        gboolean builtin = FALSE;
        for (int g = 0; g < ZP_GROUP_N; g++)
            builtin |= i == at[g];
        if (builtin)
            continue;
        if (!others) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                        "%s: key \"groups\": groups[%d] \"%s\" is no group of a plan's schedule",
                        path, i, read[i].name);
            return FALSE;
        }
        if (*n_groups == ZP_SCHED_MAX_GROUPS) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                        "%s: key \"groups\": at most %d groups in all", path,
                        ZP_SCHED_MAX_GROUPS);
            return FALSE;
        }
        table[(*n_groups)++] = read[i];
    }
    const int64_t ranks[2] = {table[ZP_GROUP_DP].ranks, table[ZP_GROUP_TP].ranks};
    const int64_t stride[2] = {table[ZP_GROUP_DP].stride, table[ZP_GROUP_TP].stride};
    /* A planner's pipeline stages sit between tp and dp; a graph's pp group is its own. */
    const int64_t pp = others ? 1 : table[ZP_GROUP_PP].ranks;
    if (ranks[ZP_GROUP_DP] * ranks[ZP_GROUP_TP] * pp != world || stride[ZP_GROUP_TP] != 1 ||
        stride[ZP_GROUP_DP] != ranks[ZP_GROUP_TP] * pp ||
        (pp > 1 && table[ZP_GROUP_PP].stride != ranks[ZP_GROUP_TP])) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"groups\": dp %" G_GINT64_FORMAT " x tp %" G_GINT64_FORMAT
                    " x pp %" G_GINT64_FORMAT " ranks must make the world of %" G_GINT64_FORMAT
                    ", tp with stride 1, pp with stride tp and dp with stride tp x pp (ranks "
                    "numbered tp-fastest)",
                    path, ranks[ZP_GROUP_DP], ranks[ZP_GROUP_TP], pp, world);
        return FALSE;
    }
    *dp = (int)ranks[ZP_GROUP_DP];
    *mp = (int)ranks[ZP_GROUP_TP];
    return TRUE;
}

static gboolean name_index(json_t *o, const char *what, const char *key,
                           const char *const *names, int *out, GError **error)
{
    const char *text;
    if (!zp_json_get_string(o, what, key, TRUE, &text, error))
        return FALSE;
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], text) == 0) {
            *out = i;
            return TRUE;
        }
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" has unknown value \"%s\"", what,
                key, text);
    return FALSE;
}

/* A collective's "group": the index of the schedule's communicator of that name. */
static gboolean group_index(const ZpSchedule *s, json_t *o, const char *what, int *out,
                            GError **error)
{
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    const char *names[ZP_SCHED_MAX_GROUPS + 1] = {NULL};
    const int n = zp_sched_groups(s, table);
    for (int g = 0; g < n; g++)
        names[g] = table[g].name;
    return name_index(o, what, "group", names, out, error);
}

/* One op. A schedule of the planner's (`layout`) names the unit, micro-step, buffer and
 * element range of its ops and depends only on earlier ops; a graph needs none of these, and
 * its dependencies may be any of its n_ops ops (zp_sched_read_graph then refuses cycles). */
/* A compute op's optional "module": a block module's name, on a block op only. */
static gboolean module_from_json(json_t *o, const char *what, int sub, ZpOp *op, GError **error)
{
    json_t *v = json_object_get(o, "module");
    if (!v)
        return TRUE;
    const int m = json_is_string(v) ? zp_model_module_parse(json_string_value(v)) : -1;
    const gboolean block =
        sub == ZP_COMP_BLOCK_FWD || sub == ZP_COMP_RECOMPUTE || sub == ZP_COMP_BLOCK_BWD;
    if (m < 0 || !block) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"module\" must be one of ln1, qkv, proj, ln2, fc1, fc2, on a "
                    "block_fwd, recompute or block_bwd op", what);
        return FALSE;
    }
    op->module = (uint8_t)(m + 1);
    return TRUE;
}

static gboolean op_from_json(ZpSchedule *s, json_t *o, guint index, guint n_ops,
                             gboolean layout, const char *path, GError **error)
{
    char *what = g_strdup_printf("%s: ops[%u]", path, index);
    ZpOp op = {0};
    int kind = 0, sub = 0, group = 0;
    int64_t unit = -1, micro = -1, buffer = -1, offset = 0, elems = 0;
    /* The keys op_to_json writes for each kind, and no others. */
    /* "stage" only in a pipeline's schedule (every op names the stage that runs it). */
    static const char *const keys[][14] = {
        [ZP_OP_COMPUTE] = {"kind", "unit", "micro", "deps", "op", "flops", "gemm_flops",
                           "attn_flops", "mem_bytes", "bytes", "stream", "stage", "module", NULL},
        [ZP_OP_COLLECTIVE] = {"kind", "unit", "micro", "deps", "op", "group", "buffer", "bytes",
                              "elem_offset", "elems", "stream", "stage", NULL},
        [ZP_OP_ALLOC] = {"kind", "unit", "micro", "deps", "category", "buffer", "bytes", "stage",
                         NULL},
        [ZP_OP_FREE] = {"kind", "unit", "micro", "deps", "category", "buffer", "bytes", "stage",
                        NULL},
        [ZP_OP_P2P] = {"kind", "unit", "micro", "deps", "op", "peer", "bytes", "elems", "stage",
                       NULL},
        [ZP_OP_TRANSFER] = {"kind", "unit", "micro", "deps", "op", "bytes", "stream", "stage",
                            NULL},
    };
    const int stages = MAX(s->stages, 1);
    int64_t stage = 0, peer = 0;
    gboolean ok =
        json_is_object(o) && name_index(o, what, "kind", zp_sched_kind_names, &kind, error);
    if (ok && kind == ZP_OP_P2P && stages == 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"kind\": p2p ops belong to pipeline schedules (plan.pipeline."
                    "stages > 1)", what);
        ok = FALSE;
    }
    ok = ok && zp_json_check_keys(o, what, keys[kind], error) &&
                  zp_json_get_int(o, what, "unit", layout, -1, INT32_MAX, &unit, error) &&
                  zp_json_get_int(o, what, "micro", layout, -1, INT32_MAX, &micro, error) &&
                  zp_json_get_int(o, what, "stage", stages > 1, 0, stages - 1, &stage, error);
    if (ok && kind == ZP_OP_P2P)
        ok = name_index(o, what, "op", zp_sched_p2p_names, &sub, error) &&
             zp_json_get_int(o, what, "peer", TRUE, 0, stages - 1, &peer, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error) &&
             zp_json_get_int(o, what, "elems", TRUE, 0, INT64_MAX, &elems, error);
    if (ok && kind == ZP_OP_COMPUTE)
        ok = name_index(o, what, "op", zp_sched_compute_names, &sub, error) &&
             zp_json_get_number(o, what, "flops", TRUE, 0, 1e30, &op.flops, error) &&
             zp_json_get_number(o, what, "gemm_flops", layout, 0, 1e30, &op.gemm_flops, error) &&
             zp_json_get_number(o, what, "attn_flops", FALSE, 0, 1e30, &op.attn_flops, error) &&
             zp_json_get_number(o, what, "mem_bytes", layout, 0, 1e30, &op.mem_bytes, error) &&
             zp_json_get_number(o, what, "bytes", FALSE, 0, 1e30, &op.bytes, error) &&
             module_from_json(o, what, sub, &op, error);
    else if (ok && kind == ZP_OP_COLLECTIVE)
        ok = name_index(o, what, "op", zp_sched_coll_names, &sub, error) &&
             group_index(s, o, what, &group, error) &&
             zp_json_get_int(o, what, "buffer", layout, -1, INT32_MAX, &buffer, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error) &&
             zp_json_get_int(o, what, "elem_offset", layout, 0, INT64_MAX, &offset, error) &&
             zp_json_get_int(o, what, "elems", layout, 0, INT64_MAX, &elems, error);
    else if (ok && kind == ZP_OP_TRANSFER)
        ok = name_index(o, what, "op", zp_sched_transfer_names, &sub, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error);
    else if (ok && kind != ZP_OP_P2P)
        ok = name_index(o, what, "category", zp_sched_mem_names, &sub, error) &&
             zp_json_get_int(o, what, "buffer", layout, -1, INT32_MAX, &buffer, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error);
    json_t *deps = json_object_get(o, "deps");
    if (ok && !json_is_array(deps)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"deps\" must be an array", what);
        ok = FALSE;
    }
    op.kind = (uint8_t)kind, op.sub = (uint8_t)sub, op.group = (uint8_t)group;
    int stream = zp_sched_json_default_stream(kind, sub, group);
    if (ok && json_object_get(o, "stream"))
        ok = name_index(o, what, "stream", zp_sched_stream_names, &stream, error);
    op.stream = (uint8_t)stream;
    op.unit = (int32_t)unit, op.micro = (int32_t)micro, op.buffer = (int32_t)buffer;
    op.stage = (uint32_t)stage;
    if (kind == ZP_OP_COLLECTIVE || kind == ZP_OP_P2P) /* a compute op's costs share their place */
        op.elem_offset = (uint64_t)offset, op.elems = (uint64_t)elems, op.peer = (uint32_t)peer;
    if (kind == ZP_OP_P2P)
        op.group = ZP_GROUP_PP;
    op.dep_start = s->deps->len;
    for (size_t i = 0; ok && i < json_array_size(deps); i++) {
        json_t *d = json_array_get(deps, i);
        /* A planner's dependencies point backwards: the list is in issue order, so the graph
         * is acyclic. A graph's may point anywhere among its ops, and so may a pipeline's
         * (stage k waits for stage k + 1's sends, listed after it), whose ops must then be
         * the builder's (same_as_built). */
        const gboolean backwards = layout && stages == 1;
        const json_int_t limit = backwards ? (json_int_t)index : (json_int_t)n_ops;
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) >= limit) {
            if (backwards)
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "%s: deps[%zu] must be the index of an earlier op", what, i);
            else
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "%s: key \"deps\": deps[%zu] is not the index of an op (0 to %u)",
                            what, i, n_ops - 1);
            ok = FALSE;
            break;
        }
        uint32_t dep = (uint32_t)json_integer_value(d);
        g_array_append_val(s->deps, dep);
        op.n_deps++;
    }
    if (ok)
        g_array_append_val(s->ops, op);
    else if (!json_is_object(o))
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
    g_free(what);
    return ok;
}

/* Reads a schedule: the model and plan are re-read strictly and the layout rebuilt from
 * them (a file cannot claim a layout its plan does not give); the ops are read strictly and
 * then checked against that layout (zp_schedcheck) before anything uses them. */
/* Whether the ops read equal the builder's in everything zreal executes (their costs aside). */
static gboolean same_as_built(const ZpSchedule *s, const GArray *ops, const GArray *deps,
                              const char *path, GError **error)
{
    guint i = 0;
    for (; i < MIN(s->ops->len, ops->len); i++) {
        const ZpOp *a = zp_sched_op(s, i), *b = &g_array_index(ops, ZpOp, i);
        if (a->kind != b->kind || a->sub != b->sub || a->stream != b->stream ||
            a->group != b->group || a->module != b->module || a->unit != b->unit ||
            a->micro != b->micro || a->buffer != b->buffer || a->bytes != b->bytes ||
            ((a->kind == ZP_OP_COLLECTIVE || a->kind == ZP_OP_P2P) &&
             (a->elem_offset != b->elem_offset || a->elems != b->elems || a->peer != b->peer)) ||
            a->stage != b->stage || a->n_deps != b->n_deps ||
            memcmp(zp_sched_deps(s, a), &g_array_index(deps, uint32_t, b->dep_start),
                   a->n_deps * sizeof(uint32_t)) != 0)
            break;
    }
    if (i == s->ops->len && i == ops->len)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: ops[%u]: differs from the %s schedule zplan builds for this model and "
                "plan (%u ops): zreal runs --impl %s schedules and pipelines' as zplan schedule "
                "writes them, and only --impl paper ones without pipeline stages edited",
                path, i, zp_impl_name(s->plan.impl), ops->len, zp_impl_name(s->plan.impl));
    return FALSE;
}

/* The file's "digest" (optional) against the ops read: s->digest says how they compare. */
static gboolean digest_from_json(ZpSchedule *s, json_t *digest, const char *path, GError **error)
{
    s->digest = ZP_DIGEST_ABSENT;
    if (!digest)
        return TRUE;
    if (!json_is_string(digest) || !g_str_has_prefix(json_string_value(digest), "sha256:")) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"digest\" must be a string \"sha256:HEX\"", path);
        return FALSE;
    }
    char *ours = zp_sched_digest(s);
    s->digest = strcmp(ours, json_string_value(digest)) == 0 ? ZP_DIGEST_MATCH
                                                             : ZP_DIGEST_MISMATCH;
    g_free(ours);
    return TRUE;
}

/* zp_sched_read_json of the file at path, parsed: root, which it takes. */
static ZpSchedule *read_json_root(json_t *root, const char *path, GError **error)
{
    ZpModel model;
    ZpPlan plan;
    const char *format = NULL;
    json_t *ops = json_object_get(root, "ops");
    gboolean ok = zp_json_get_string(root, path, "format", TRUE, &format, error);
    if (ok && strcmp(format, "zplan-schedule-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown format \"%s\"", path, format);
        ok = FALSE;
    }
    static const char *const keys[] = {"format", "model", "plan", "world", "elem_bytes",
                                       "state_bytes", "units", "total_elems", "padded_elems",
                                       "partition_elems", "ops", "groups", "stages",
                                       "digest", NULL};
    char *model_what = g_strdup_printf("%s: model", path);
    char *plan_what = g_strdup_printf("%s: plan", path);
    ok = ok && zp_json_check_keys(root, path, keys, error) &&
         json_is_object(json_object_get(root, "model")) &&
         zp_model_from_json(json_object_get(root, "model"), model_what, &model, error) &&
         json_is_object(json_object_get(root, "plan")) &&
         zp_plan_from_json(json_object_get(root, "plan"), plan_what, &plan, error);
    g_free(model_what);
    g_free(plan_what);
    if (ok && !json_is_array(ops)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an array", path);
        ok = FALSE;
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: keys \"model\" and \"plan\" must be objects",
                    path);
    json_t *groups = json_object_get(root, "groups");
    int dp = 0, mp = 0, n_groups = 0;
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    if (ok && groups) {
        ok = groups_from_json(groups, path, (int64_t)plan.dp * plan.mp * zp_plan_pp(&plan),
                              FALSE, table, &n_groups, &dp, &mp, error);
        if (ok && (dp != plan.dp || mp != plan.mp)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"groups\": dp %d x tp %d, but the plan has dp %d x mp %d",
                        path, dp, mp, plan.dp, plan.mp);
            ok = FALSE;
        }
    }
    ZpSchedule *s = ok ? zp_sched_build(&model, &plan, error) : NULL;
    /* A pipeline's stage views: those its plan gives (written for the reader's eyes). */
    json_t *stages = s && s->stages > 1 ? zp_sched_json_stages_json(s) : NULL;
    if (stages && !json_equal(stages, json_object_get(root, "stages"))) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"stages\": the %d stage views (state_bytes, units) must be those "
                    "of the plan's pipeline, as zplan schedule writes them", path, s->stages);
        zp_sched_free(s);
        s = NULL;
    }
    json_decref(stages);
    /* The builder's ops, which a schedule of another implementation than the paper's must
     * equal: zp_schedcheck checks ops against the paper's unit-level layout only. */
    GArray *built_ops = NULL, *built_deps = NULL;
    if (s) {
        if (plan.impl != ZP_IMPL_PAPER || s->stages > 1) {
            built_ops = g_array_copy(s->ops);
            built_deps = g_array_copy(s->deps);
        }
        g_array_set_size(s->ops, 0);
        g_array_set_size(s->deps, 0);
        for (size_t i = 0; s && i < json_array_size(ops); i++)
            if (!op_from_json(s, json_array_get(ops, i), (guint)i, (guint)json_array_size(ops),
                              TRUE, path, error)) {
                zp_sched_free(s);
                s = NULL;
            }
        if (s && !(built_ops ? same_as_built(s, built_ops, built_deps, path, error)
                             : zp_schedcheck_ops(s, path, error))) {
            zp_sched_free(s);
            s = NULL;
        }
    }
    if (s && !digest_from_json(s, json_object_get(root, "digest"), path, error)) {
        zp_sched_free(s);
        s = NULL;
    }
    if (built_ops)
        g_array_unref(built_ops), g_array_unref(built_deps);
    json_decref(root);
    return s;
}

ZpSchedule *zp_sched_read_json(const char *path, GError **error)
{
    json_t *root = zp_schedsize_check_file(path, error) ? zp_json_load_object(path, error) : NULL;
    return root ? read_json_root(root, path, error) : NULL;
}

/* Fails naming an op on a dependency cycle, if there is one (Kahn's algorithm; an op left
 * over has a dependency left over, and following those from it must come round). */
static gboolean check_acyclic(const ZpSchedule *s, const char *path, GError **error)
{
    const guint n = s->ops->len;
    uint32_t *left = g_new(uint32_t, n ? n : 1), *start = g_new0(uint32_t, n + 1);
    uint32_t *users = g_new(uint32_t, s->deps->len ? s->deps->len : 1);
    uint32_t *ready = g_new(uint32_t, n ? n : 1), *seen = g_new0(uint32_t, n ? n : 1);
    for (guint i = 0; i < n; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        left[i] = op->n_deps;
        for (uint32_t d = 0; d < op->n_deps; d++)
            start[zp_sched_deps(s, op)[d] + 1]++;
    }
    for (guint i = 0; i < n; i++)
        start[i + 1] += start[i];
    uint32_t *fill = g_memdup2(start, (n + 1) * sizeof *start);
    for (guint i = 0; i < n; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        for (uint32_t d = 0; d < op->n_deps; d++)
            users[fill[zp_sched_deps(s, op)[d]]++] = i;
    }
    guint n_ready = 0, done = 0;
    for (guint i = 0; i < n; i++)
        if (left[i] == 0)
            ready[n_ready++] = i;
    while (done < n_ready) {
        const uint32_t i = ready[done++];
        for (uint32_t k = start[i]; k < start[i + 1]; k++)
            if (--left[users[k]] == 0)
                ready[n_ready++] = users[k];
    }
    gboolean ok = done == n;
    if (!ok) {
        uint32_t at = 0;
        while (left[at] == 0)
            at++;
        while (!seen[at]) {
            seen[at] = 1;
            const ZpOp *op = zp_sched_op(s, at);
            uint32_t d = 0;
            while (left[zp_sched_deps(s, op)[d]] == 0)
                d++;
            at = zp_sched_deps(s, op)[d];
        }
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: ops[%u]: key \"deps\": the op is on a dependency cycle", path, at);
    }
    g_free(left);
    g_free(start);
    g_free(fill);
    g_free(users);
    g_free(ready);
    g_free(seen);
    return ok;
}

/* "state_bytes": any of the memory categories, bytes each rank holds all step (0 if absent). */
static gboolean state_from_json(json_t *o, const char *path, double state[ZP_MEM_N],
                                GError **error)
{
    char *what = g_strdup_printf("%s: state_bytes", path);
    gboolean ok = json_is_object(o) && zp_json_check_keys(o, what, zp_sched_mem_names, error);
    for (int c = 0; ok && c < ZP_MEM_N; c++)
        ok = zp_json_get_number(o, what, zp_sched_mem_names[c], FALSE, 0, 1e30, &state[c], error);
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
    g_free(what);
    return ok;
}

/* FLOPs in a fused attention kernel run at its measured rate for the model's head dimension
 * and sequence length; without the model there is no such rate, and without a fused kernel in
 * the plan they have no kernel to run in. A guess would time them wrongly, so they are
 * refused, naming the first op that has them. */
static gboolean check_attention(const ZpSchedule *s, gboolean has_model, const char *path,
                                GError **error)
{
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->attn_flops <= 0)
            continue;
        if (has_model && zp_plan_attention_rated(&s->plan))
            return TRUE;
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: ops[%u]: key \"attn_flops\": %s", path, i,
                    !has_model ? "a fused attention kernel's rate depends on the model's head "
                                 "dimension and sequence length: give the \"model\", or count "
                                 "these FLOPs in \"flops\" alone"
                               : "the plan runs eager attention: give a \"plan\" with a fused "
                                 "\"attention\" kernel, or count these FLOPs in \"flops\" "
                                 "alone");
        return FALSE;
    }
    return TRUE;
}

ZpSchedule *zp_sched_read_graph(const char *path, GError **error)
{
    json_t *root = zp_schedsize_check_file(path, error) ? zp_json_load_object(path, error) : NULL;
    if (!root)
        return NULL;
    /* A pipeline's file (`zplan schedule --out` with --pp: "stages", each stage's view of its
     * model states and units) is read as zreal reads it, its ops and views held to those its
     * model and plan build: the graph below has no stage views to give a rank class. */
    if (json_object_get(root, "stages"))
        return read_json_root(root, path, error);
    /* A planner's file simulates whatever its digest says: zreal is the one to refuse edits. */
    static const char *const keys[] = {"format", "world", "groups", "ops", "state_bytes",
                                       "precision", "model", "plan", "elem_bytes", "units",
                                       "total_elems", "padded_elems", "partition_elems",
                                       "digest", NULL};
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    s->elem_bytes = 2;
    const char *format = NULL, *precision = NULL;
    int64_t world = 0;
    int dp = 0, mp = 0;
    json_t *ops = json_object_get(root, "ops"), *model = json_object_get(root, "model");
    json_t *plan = json_object_get(root, "plan"), *state = json_object_get(root, "state_bytes");
    char *model_what = g_strdup_printf("%s: model", path);
    char *plan_what = g_strdup_printf("%s: plan", path);
    gboolean ok = zp_json_check_keys(root, path, keys, error) &&
                  zp_json_get_string(root, path, "format", TRUE, &format, error);
    if (ok && strcmp(format, "zplan-schedule-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown format \"%s\"", path, format);
        ok = FALSE;
    }
    ok = ok && zp_json_get_int(root, path, "world", TRUE, 1, INT32_MAX, &world, error) &&
         groups_from_json(json_object_get(root, "groups"), path, world, TRUE, s->groups,
                          &s->n_groups, &dp, &mp, error) &&
         zp_json_get_number(root, path, "elem_bytes", FALSE, 1, 8, &s->elem_bytes, error) &&
         zp_json_get_string(root, path, "precision", FALSE, &precision, error) &&
         (!state || state_from_json(state, path, s->state_bytes, error));
    if (ok && plan && precision) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"precision\": the plan gives it; give one of them", path);
        ok = FALSE;
    }
    if (ok && plan) {
        ok = json_is_object(plan) && zp_plan_from_json(plan, plan_what, &s->plan, error);
        if (ok && (s->plan.dp != dp || s->plan.mp != mp)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"groups\": dp %d x tp %d, but the plan has dp %d x mp %d",
                        path, dp, mp, s->plan.dp, s->plan.mp);
            ok = FALSE;
        }
    } else if (ok) {
        zp_plan_defaults(&s->plan, 0, dp, mp);
        ok = !precision ||
             zp_precision_parse(precision, "key \"precision\"", &s->plan.precision, error);
        if (!ok)
            g_prefix_error(error, "%s: ", path);
    }
    if (ok && model)
        ok = json_is_object(model) && zp_model_from_json(model, model_what, &s->model, error);
    else if (ok)
        g_snprintf(s->model.name, sizeof s->model.name, "%s", "schedule");
    if (ok && !json_is_array(ops)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an array", path);
        ok = FALSE;
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: keys \"model\" and \"plan\" must be objects", path);
    s->world = (int)world;
    for (size_t i = 0; ok && i < json_array_size(ops); i++)
        ok = op_from_json(s, json_array_get(ops, i), (guint)i, (guint)json_array_size(ops), FALSE,
                          path, error);
    ok = ok && check_acyclic(s, path, error) && check_attention(s, model != NULL, path, error);
    /* A planner's schedule (its model and plan given) also keeps the step's semantics. */
    ok = ok && (!model || !plan || zp_schedcheck_step(s, path, error));
    g_free(model_what);
    g_free(plan_what);
    json_decref(root);
    if (!ok) {
        zp_sched_free(s);
        return NULL;
    }
    return s;
}
