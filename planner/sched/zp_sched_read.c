/* zp_sched_read: reads a schedule file back, validating every field (zreal executes what it
 * reads), or as an op graph without its model (the simulator's), its ops streamed one by one. */
#include "zp_jsonstream.h"
#include "zp_sched.h"
#include "zp_sched_json.h"
#include "zp_schedcheck.h"
#include "zp_schedsize.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>

static gboolean name_index(json_t *o, const char *what, const char *key,
                           const char *const *names, int *out, GError **error);

/* One group of "groups": a name not yet taken, and a shape that tiles the world (ranks x
 * stride dividing it; with "run" and "run_stride", runs of run members: zp_group_tiles). */
static gboolean group_from_json(json_t *g, const char *what, int64_t world, ZpCommGroup *table,
                                int index, GError **error)
{
    static const char *const keys[] = {"name", "ranks", "stride", "run", "run_stride", NULL};
    const char *name = NULL;
    int64_t ranks = 0, stride = 0, run = 0, run_stride = 0;
    gboolean ok = json_is_object(g) && zp_json_check_keys(g, what, keys, error) &&
                  zp_json_get_string(g, what, "name", TRUE, &name, error) &&
                  zp_json_get_int(g, what, "ranks", TRUE, 1, INT32_MAX, &ranks, error) &&
                  zp_json_get_int(g, what, "stride", TRUE, 1, INT32_MAX, &stride, error) &&
                  zp_json_get_int(g, what, "run", FALSE, 1, INT32_MAX, &run, error) &&
                  zp_json_get_int(g, what, "run_stride", run > 0, 1, INT32_MAX, &run_stride,
                                  error);
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
    const ZpCommGroup shape = {.ranks = (int)ranks, .stride = (int)stride, .run = (int)run,
                               .run_stride = (int)run_stride};
    if (run == 0 && run_stride > 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"run_stride\" without \"run\" (the members per run)", what);
        return FALSE;
    }
    if (run > 0 && (run < 2 || run >= ranks)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"run\": %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT " ranks (a "
                    "run has more than 1 and fewer than the group's ranks; leave it out for one "
                    "run)", what, run, ranks);
        return FALSE;
    }
    if (!zp_group_check(&shape, world, what, error))
        return FALSE;
    table[index] = shape;
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
    /* But edp, where absent, is the dp ranks EP apart, as zp_sched_groups places it: all
     * of dp without experts split (EP 1), which groups_json leaves out. One rank, it made a
     * MoE plan's expert gradient all-reduces free: simulate --schedule of moe-tiny's file
     * gave 0.3772 ms, the plan 0.3980 ms. */
    if (at[ZP_GROUP_EDP] < 0 && table[ZP_GROUP_DP].ranks % table[ZP_GROUP_EP].ranks == 0) {
        table[ZP_GROUP_EDP].ranks = table[ZP_GROUP_DP].ranks / table[ZP_GROUP_EP].ranks;
        table[ZP_GROUP_EDP].stride = table[ZP_GROUP_DP].stride * table[ZP_GROUP_EP].ranks;
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

/* The names a collective's "group" may take, by index: the schedule's communicators; or,
 * `open` (a graph streamed before its "groups"), the built-in ones at their indices (a
 * graph's table has them there) and any other name at the next index as it first comes,
 * mapped onto the file's table once it is read (remap_groups). */
typedef struct {
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    const char *names[ZP_SCHED_MAX_GROUPS + 1];
    int n;
    gboolean open;
} GroupNames;

static void group_names_init(GroupNames *g, const ZpSchedule *s, gboolean open)
{
    *g = (GroupNames){.open = open};
    g->n = open ? ZP_GROUP_N : zp_sched_groups(s, g->table);
    for (int i = 0; i < g->n; i++) {
        if (open)
            g_strlcpy(g->table[i].name, zp_sched_group_names[i], sizeof g->table->name);
        g->names[i] = g->table[i].name;
    }
}

static int group_names_find(const GroupNames *g, const char *name)
{
    for (int i = 0; i < g->n; i++)
        if (strcmp(g->names[i], name) == 0)
            return i;
    return -1;
}

/* A collective's "group": the index of the communicator of that name. */
static gboolean group_index(GroupNames *g, json_t *o, const char *what, int *out,
                            GError **error)
{
    const char *name = NULL;
    if (g->open && g->n < ZP_SCHED_MAX_GROUPS &&
        zp_json_get_string(o, what, "group", TRUE, &name, NULL) &&
        strlen(name) < sizeof g->table->name && group_names_find(g, name) < 0) {
        g_strlcpy(g->table[g->n].name, name, sizeof g->table->name);
        g->names[g->n] = g->table[g->n].name;
        g->n++;
    }
    return name_index(o, what, "group", g->names, out, error);
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

static gboolean op_from_json(ZpSchedule *s, GroupNames *groups, json_t *o, guint index,
                             guint n_ops, gboolean layout, const char *path, GError **error)
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
             group_index(groups, o, what, &group, error) &&
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
/* How far a streamed reading is, told to its caller: the ops read, by the bytes of the file
 * passed, as the first READ_SHARE; the digest's ops hashed as the rest. */
#define READ_SHARE 0.6
typedef struct {
    ZpProgressFn fn; /* NULL: nobody asked */
    void *ctx;
    double file_bytes;
} ReadProgress;

static void digest_progress(double fraction, void *ctx)
{
    const ReadProgress *p = ctx;
    p->fn(READ_SHARE + (1 - READ_SHARE) * fraction, p->ctx);
}

static gboolean digest_from_json(ZpSchedule *s, json_t *digest, const char *path,
                                 const ReadProgress *progress, GError **error)
{
    s->digest = ZP_DIGEST_ABSENT;
    if (!digest)
        return TRUE;
    if (!json_is_string(digest) || !g_str_has_prefix(json_string_value(digest), "sha256:")) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"digest\" must be a string \"sha256:HEX\"", path);
        return FALSE;
    }
    char *ours = progress && progress->fn
                     ? zp_sched_digest_progress(s, digest_progress, (void *)progress)
                     : zp_sched_digest(s);
    s->digest = strcmp(ours, json_string_value(digest)) == 0 ? ZP_DIGEST_MATCH
                                                             : ZP_DIGEST_MISMATCH;
    g_free(ours);
    return TRUE;
}

/* zp_sched_read_json's reading, in steps: json_head (the format, the keys, the model and plan,
 * "ops" an array), json_groups, json_build (the plan's schedule, whose layout, stage views and
 * ops the file's are held to), json_stages, the ops (into the built schedule, emptied of its
 * own), json_finish (the ops against the builder's, the digest). The tree reader takes them in
 * that order; the streamed one reads the ops as they come (zplan writes them before "groups",
 * "digest" and "stages") and takes the steps on the keys after them once they are read. */
typedef struct {
    ZpModel model;
    ZpPlan plan;
    ZpSchedule *s;
    GArray *built_ops, *built_deps; /* what the file's ops must equal (NULL: zp_schedcheck's) */
    json_t *stages;                 /* the plan's stage views (NULL without a pipeline) */
    const ReadProgress *progress;   /* the streamed reading's (NULL: none) */
} JsonRead;

static gboolean json_head(json_t *root, const char *path, JsonRead *r, GError **error)
{
    const char *format = NULL;
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
         zp_model_from_json(json_object_get(root, "model"), model_what, &r->model, error) &&
         json_is_object(json_object_get(root, "plan")) &&
         zp_plan_from_json(json_object_get(root, "plan"), plan_what, &r->plan, error);
    g_free(model_what);
    g_free(plan_what);
    if (ok && !json_is_array(json_object_get(root, "ops"))) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an array", path);
        ok = FALSE;
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: keys \"model\" and \"plan\" must be objects",
                    path);
    return ok;
}

static gboolean json_groups(json_t *root, const char *path, const ZpPlan *plan, GError **error)
{
    json_t *groups = json_object_get(root, "groups");
    int dp = 0, mp = 0, n_groups = 0;
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    if (!groups)
        return TRUE;
    if (!groups_from_json(groups, path, (int64_t)plan->dp * plan->mp * zp_plan_pp(plan), FALSE,
                          table, &n_groups, &dp, &mp, error))
        return FALSE;
    if (dp != plan->dp || mp != plan->mp) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"groups\": dp %d x tp %d, but the plan has dp %d x mp %d", path, dp,
                    mp, plan->dp, plan->mp);
        return FALSE;
    }
    return TRUE;
}

static gboolean json_build(JsonRead *r, GError **error)
{
    r->s = zp_sched_build(&r->model, &r->plan, error);
    if (!r->s)
        return FALSE;
    /* A pipeline's stage views: those its plan gives (written for the reader's eyes). */
    r->stages = r->s->stages > 1 ? zp_sched_json_stages_json(r->s) : NULL;
    /* The builder's ops, which a schedule of another implementation than the paper's must
     * equal: zp_schedcheck checks ops against the paper's unit-level layout only. */
    if (r->plan.impl != ZP_IMPL_PAPER || r->s->stages > 1) {
        r->built_ops = g_array_copy(r->s->ops);
        r->built_deps = g_array_copy(r->s->deps);
    }
    g_array_set_size(r->s->ops, 0);
    g_array_set_size(r->s->deps, 0);
    return TRUE;
}

static gboolean json_stages(json_t *root, const JsonRead *r, const char *path, GError **error)
{
    if (!r->stages || json_equal(r->stages, json_object_get(root, "stages")))
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: key \"stages\": the %d stage views (state_bytes, units) must be those "
                "of the plan's pipeline, as zplan schedule writes them", path, r->s->stages);
    return FALSE;
}

static gboolean json_finish(JsonRead *r, json_t *root, const char *path, GError **error)
{
    return (r->built_ops ? same_as_built(r->s, r->built_ops, r->built_deps, path, error)
                         : zp_schedcheck_ops(r->s, path, error)) &&
           digest_from_json(r->s, json_object_get(root, "digest"), path, r->progress, error);
}

/* The schedule read, where `take`; what else the reading held is freed. */
static ZpSchedule *json_read_end(JsonRead *r, gboolean take)
{
    ZpSchedule *s = take ? r->s : NULL;
    if (!take)
        zp_sched_free(r->s);
    json_decref(r->stages);
    if (r->built_ops)
        g_array_unref(r->built_ops), g_array_unref(r->built_deps);
    *r = (JsonRead){0};
    return s;
}

/* zp_sched_read_json of the file at path, parsed: root, which it takes. */
static ZpSchedule *read_json_root(json_t *root, const char *path, GError **error)
{
    JsonRead r = {0};
    json_t *ops = json_object_get(root, "ops");
    gboolean ok = json_head(root, path, &r, error) && json_groups(root, path, &r.plan, error) &&
                  json_build(&r, error) && json_stages(root, &r, path, error);
    GroupNames groups;
    if (ok)
        group_names_init(&groups, r.s, FALSE);
    for (size_t i = 0; ok && i < json_array_size(ops); i++)
        ok = op_from_json(r.s, &groups, json_array_get(ops, i), (guint)i,
                          (guint)json_array_size(ops), TRUE, path, error);
    ok = ok && json_finish(&r, root, path, error);
    json_decref(root);
    return json_read_end(&r, ok);
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

/* zp_sched_read_graph's reading of a file without "stages", in steps as zp_sched_read_json's:
 * graph_head (the keys, format, world, groups, precision, states, plan and model, "ops" an
 * array, into s), the ops, graph_finish (no cycle, no attention FLOPs without a rate, a
 * planner's step kept). */
static ZpSchedule *graph_new(void)
{
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    s->elem_bytes = 2;
    return s;
}

static gboolean graph_head(json_t *root, const char *path, ZpSchedule *s, GError **error)
{
    /* A planner's file simulates whatever its digest says: zreal is the one to refuse edits. */
    static const char *const keys[] = {"format", "world", "groups", "ops", "state_bytes",
                                       "precision", "model", "plan", "elem_bytes", "units",
                                       "total_elems", "padded_elems", "partition_elems",
                                       "digest", NULL};
    const char *format = NULL, *precision = NULL;
    int64_t world = 0;
    int dp = 0, mp = 0;
    json_t *model = json_object_get(root, "model"), *plan = json_object_get(root, "plan");
    json_t *state = json_object_get(root, "state_bytes");
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
    if (ok && !json_is_array(json_object_get(root, "ops"))) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an array", path);
        ok = FALSE;
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: keys \"model\" and \"plan\" must be objects", path);
    s->world = (int)world;
    g_free(model_what);
    g_free(plan_what);
    return ok;
}

static gboolean graph_finish(json_t *root, const ZpSchedule *s, const char *path,
                             GError **error)
{
    const gboolean model = json_object_get(root, "model") != NULL;
    /* A planner's schedule (its model and plan given) also keeps the step's semantics. */
    return check_acyclic(s, path, error) && check_attention(s, model, path, error) &&
           (!model || !json_object_get(root, "plan") || zp_schedcheck_step(s, path, error));
}

/* zp_sched_read_graph of the file at path, parsed: root, which it takes. */
static ZpSchedule *read_graph_root(json_t *root, const char *path, GError **error)
{
    /* A pipeline's file (`zplan schedule --out` with --pp: "stages", each stage's view of its
     * model states and units) is read as zreal reads it, its ops and views held to those its
     * model and plan build: the graph below has no stage views to give a rank class. */
    if (json_object_get(root, "stages"))
        return read_json_root(root, path, error);
    ZpSchedule *s = graph_new();
    json_t *ops = json_object_get(root, "ops");
    GroupNames groups;
    gboolean ok = graph_head(root, path, s, error);
    if (ok)
        group_names_init(&groups, s, FALSE);
    for (size_t i = 0; ok && i < json_array_size(ops); i++)
        ok = op_from_json(s, &groups, json_array_get(ops, i), (guint)i,
                          (guint)json_array_size(ops), FALSE, path, error);
    ok = ok && graph_finish(root, s, path, error);
    json_decref(root);
    if (!ok) {
        zp_sched_free(s);
        return NULL;
    }
    return s;
}

/* ---- the streamed reading ---- */

/* How the streamed reader takes the ops: not decided yet, skipped (the model and plan they
 * are read against come after them: a second pass reads them), or into zp_sched_read_json's
 * schedule or a graph's. */
typedef enum { OPS_UNDECIDED, OPS_SKIP, OPS_JSON, OPS_GRAPH } OpsHow;

typedef struct {
    const char *path;
    gboolean graph; /* zp_sched_read_graph's reading, else zp_sched_read_json's */
    json_t *root;   /* the top-level keys, "ops" as [] */
    OpsHow how;
    gboolean guess; /* the graph's reading guessed from the keys before the ops */
    guint n_ops;
    JsonRead json; /* OPS_JSON: its s is the schedule read */
    ZpSchedule *s; /* the schedule the ops go into */
    GroupNames groups;
    ReadProgress progress;
} Streamed;

/* Reading the ops as `how`: the steps before them, on the keys root has. A graph's groups
 * come after its ops (zplan writes "groups" after "ops"): their names are taken open. */
static gboolean begin_ops(Streamed *r, OpsHow how, GError **error)
{
    r->how = how;
    if (how == OPS_JSON && json_head(r->root, r->path, &r->json, error) &&
        json_build(&r->json, error)) {
        r->s = r->json.s;
        group_names_init(&r->groups, r->s, FALSE);
    } else if (how == OPS_GRAPH) {
        r->s = graph_new();
        group_names_init(&r->groups, r->s, TRUE);
    }
    return how == OPS_SKIP || r->s;
}

static void end_ops(Streamed *r)
{
    if (r->how == OPS_JSON)
        json_read_end(&r->json, FALSE);
    else if (r->how == OPS_GRAPH)
        zp_sched_free(r->s);
    r->s = NULL;
    r->how = OPS_UNDECIDED;
}

/* How the keys that came before the ops say to read them: zp_sched_read_json's way, into the
 * schedule its model and plan build; or, for zp_sched_read_graph, a graph's, unless "stages"
 * came, or a plan with pipeline stages (whose file has "stages", after its ops). */
static OpsHow ops_how(const Streamed *r)
{
    json_t *plan = json_object_get(r->root, "plan");
    gboolean pipeline = json_object_get(r->root, "stages") != NULL;
    ZpPlan p;
    if (r->graph && !pipeline && json_is_object(plan))
        pipeline = zp_plan_from_json(plan, r->path, &p, NULL) && zp_plan_pp(&p) > 1;
    if (r->graph && !pipeline)
        return OPS_GRAPH;
    return json_object_get(r->root, "format") && json_object_get(r->root, "model") && plan
               ? OPS_JSON
               : OPS_SKIP;
}

static gboolean on_value(const char *key, void *value, gint64 index, guint64 offset, void *ctx,
                         GError **error)
{
    Streamed *r = ctx;
    if (r->progress.fn && index >= 0 && (index + 1) % 4096 == 0)
        r->progress.fn(READ_SHARE * MIN(1.0, (double)offset / r->progress.file_bytes),
                       r->progress.ctx);
    if (index < 0) {
        json_object_set(r->root, key, value);
        return TRUE;
    }
    if (index >= G_MAXUINT32) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: more ops than an index holds", r->path);
        return FALSE;
    }
    r->n_ops = (guint)index + 1;
    gboolean ok = TRUE;
    if (r->how == OPS_UNDECIDED) {
        json_object_set_new(r->root, "ops", json_array());
        /* zp_sched_read_graph's reading is sure only once "stages" came. */
        r->guess = r->graph && !json_object_get(r->root, "stages");
        ok = begin_ops(r, ops_how(r), error);
    }
    /* Dependencies on ops that have not come yet are bounded once all have (deps_in). */
    ok = ok && (r->how == OPS_SKIP || op_from_json(r->s, &r->groups, value, (guint)index,
                                                   G_MAXUINT32, r->how == OPS_JSON, r->path,
                                                   error));
    if (ok || !r->guess)
        return ok;
    /* Refused as guessed, perhaps wrongly: the ops are read again once all keys are known. */
    g_clear_error(error);
    end_ops(r);
    r->how = OPS_SKIP;
    return TRUE;
}

static gboolean deps_in(const ZpSchedule *s, guint n_ops, const char *path, GError **error)
{
    for (guint i = 0; i < s->deps->len; i++)
        if (g_array_index(s->deps, uint32_t, i) >= n_ops) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: a dependency past the last op",
                        path);
            return FALSE;
        }
    return TRUE;
}

/* A graph's ops, their groups numbered as the names first came, numbered as its table. */
static gboolean remap_groups(const GroupNames *g, ZpSchedule *s, const char *path,
                             GError **error)
{
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    const int n = zp_sched_groups(s, table);
    uint8_t to[ZP_SCHED_MAX_GROUPS];
    for (int i = 0; i < g->n; i++) {
        int j = 0;
        while (j < n && strcmp(table[j].name, g->names[i]) != 0)
            j++;
        if (j == n) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: no group \"%s\" in \"groups\"",
                        path, g->names[i]);
            return FALSE;
        }
        to[i] = (uint8_t)j;
    }
    for (guint i = 0; i < s->ops->len; i++) {
        ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->kind == ZP_OP_COLLECTIVE)
            op->group = to[op->group];
    }
    return TRUE;
}

/* The file read with "ops" streamed (zp_jsonstream), each op converted as it comes and never
 * held as JSON, the other keys kept as trees; NULL where it gives up: on anything the tree
 * reader may refuse (it then says why, word for word), and on a file that changed between
 * two passes (the ops came before the keys they are read against: they are read again). */
static ZpSchedule *read_streamed(const char *path, gboolean graph, const ReadProgress *progress,
                                 GError **error)
{
    Streamed r = {.path = path, .graph = graph, .root = json_object(), .progress = *progress};
    ZpJsonStreamOptions options = {.stream_key = "ops", .keep_others = TRUE,
                                   .max_value_bytes = G_MAXSIZE, .strict = TRUE};
    gboolean ok = zp_json_stream_with(path, &options, on_value, &r, error);
    json_object_set_new(r.root, "ops", json_array());
    const OpsHow how = graph && !json_object_get(r.root, "stages") ? OPS_GRAPH : OPS_JSON;
    if (ok && r.how != how) {
        /* The ops came before the keys they are read against, or were taken for the other
         * reading: they are read again, those keys known. */
        const guint n_ops = r.n_ops;
        end_ops(&r);
        r.guess = FALSE;
        ok = begin_ops(&r, how, error);
        options.keep_others = FALSE;
        r.n_ops = 0;
        ok = ok && (n_ops == 0 || zp_json_stream_with(path, &options, on_value, &r, error));
        if (ok && r.n_ops != n_ops) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: changed while read", path);
            ok = FALSE;
        }
    }
    ok = ok && deps_in(r.s, r.n_ops, path, error);
    r.json.progress = &r.progress;
    if (how == OPS_JSON)
        ok = ok && json_head(r.root, path, &r.json, error) &&
             json_groups(r.root, path, &r.json.plan, error) &&
             json_stages(r.root, &r.json, path, error) &&
             json_finish(&r.json, r.root, path, error);
    else
        ok = ok && graph_head(r.root, path, r.s, error) &&
             remap_groups(&r.groups, r.s, path, error) && graph_finish(r.root, r.s, path, error);
    ZpSchedule *s = NULL;
    if (ok)
        s = r.s, r.s = NULL, r.json.s = NULL;
    end_ops(&r);
    json_decref(r.root);
    return s;
}

ZpSchedule *zp_sched_read_file(const char *path, gboolean graph, ZpSchedRead how,
                               ZpProgressFn progress, void *progress_ctx, GError **error)
{
    if (!zp_schedsize_check_file(path, error))
        return NULL;
    /* A regular file is streamed. Where the stream gives up, and a file that cannot be read
     * twice (a FIFO), the whole file is read as one tree: its refusals are the same. */
    const gboolean regular = g_file_test(path, G_FILE_TEST_IS_REGULAR);
    if (how != ZP_SCHED_READ_TREE && regular) {
        GError *gave_up = NULL;
        GStatBuf st;
        const ReadProgress told = {
            progress, progress_ctx,
            g_stat(path, &st) == 0 && st.st_size > 0 ? (double)st.st_size : 1.0};
        ZpSchedule *s = read_streamed(path, graph, &told, &gave_up);
        if (s || how == ZP_SCHED_READ_STREAM) {
            if (!s)
                g_propagate_error(error, gave_up);
            return s;
        }
        g_clear_error(&gave_up);
    } else if (how == ZP_SCHED_READ_STREAM) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: not a regular file: read whole", path);
        return NULL;
    }
    json_t *root = zp_json_load_object(path, error);
    if (!root)
        return NULL;
    return graph ? read_graph_root(root, path, error) : read_json_root(root, path, error);
}

ZpSchedule *zp_sched_read_json(const char *path, GError **error)
{
    return zp_sched_read_file(path, FALSE, ZP_SCHED_READ_AUTO, NULL, NULL, error);
}

ZpSchedule *zp_sched_read_graph(const char *path, GError **error)
{
    return zp_sched_read_file(path, TRUE, ZP_SCHED_READ_AUTO, NULL, NULL, error);
}

ZpSchedule *zp_sched_read_graph_progress(const char *path, ZpProgressFn progress,
                                         void *progress_ctx, GError **error)
{
    return zp_sched_read_file(path, TRUE, ZP_SCHED_READ_AUTO, progress, progress_ctx, error);
}
