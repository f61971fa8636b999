/* test_moe_sched: a mixture of experts in the schedule and the simulator — the EP group's
 * all-to-all ops (ep_dispatch, ep_combine), the expert and unpermute compute ops, their JSON form. */
#include "testutil.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>

static char *write_text(const char *text)
{
    char *path = NULL;
    const int fd = g_file_open_tmp("zp-moe-XXXXXX.json", &path, NULL);
    g_assert_cmpint(fd, >=, 0);
    close(fd);
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    return path;
}

/* A graph file's sparse block: dense part, dispatch over ep, experts, combine, unpermute; the
 * names read back as the enums, the all-to-alls on the compute stream by default, the ep and
 * edp groups placed as zp_sched_groups places them (EP consecutive dp ranks). */
static const char *graph_json =
    "{\"format\": \"zplan-schedule-1\", \"world\": 8,"
    " \"groups\": [{\"name\": \"dp\", \"ranks\": 8, \"stride\": 1},"
    "  {\"name\": \"tp\", \"ranks\": 1, \"stride\": 1},"
    "  {\"name\": \"ep\", \"ranks\": 4, \"stride\": 1},"
    "  {\"name\": \"edp\", \"ranks\": 2, \"stride\": 4}],"
    " \"state_bytes\": {\"ep_buffers\": 4096},"
    " \"ops\": ["
    "  {\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1e9, \"deps\": []},"
    "  {\"kind\": \"collective\", \"op\": \"ep_dispatch\", \"group\": \"ep\", \"bytes\": 8192,"
    "   \"unit\": 1, \"elems\": 4096, \"deps\": [0]},"
    "  {\"kind\": \"compute\", \"op\": \"expert_fwd\", \"flops\": 2e9, \"deps\": [1]},"
    "  {\"kind\": \"collective\", \"op\": \"ep_combine\", \"group\": \"ep\", \"bytes\": 8192,"
    "   \"deps\": [2]},"
    "  {\"kind\": \"compute\", \"op\": \"unpermute_fwd\", \"flops\": 0, \"mem_bytes\": 1e6,"
    "   \"deps\": [3]},"
    "  {\"kind\": \"compute\", \"op\": \"unpermute_bwd\", \"flops\": 0, \"deps\": [4]},"
    "  {\"kind\": \"compute\", \"op\": \"expert_bwd\", \"flops\": 4e9, \"deps\": [5]},"
    "  {\"kind\": \"collective\", \"op\": \"allreduce\", \"group\": \"edp\", \"bytes\": 64,"
    "   \"deps\": [6]}]}";

static void test_graph_names(void)
{
    char *path = write_text(graph_json);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(s->ops->len, ==, 8);
    static const struct {
        int kind, sub;
    } want[] = {{ZP_OP_COMPUTE, ZP_COMP_BLOCK_FWD},     {ZP_OP_COLLECTIVE, ZP_COLL_EP_DISPATCH},
                {ZP_OP_COMPUTE, ZP_COMP_EXPERT_FWD},    {ZP_OP_COLLECTIVE, ZP_COLL_EP_COMBINE},
                {ZP_OP_COMPUTE, ZP_COMP_UNPERMUTE_FWD}, {ZP_OP_COMPUTE, ZP_COMP_UNPERMUTE_BWD},
                {ZP_OP_COMPUTE, ZP_COMP_EXPERT_BWD},    {ZP_OP_COLLECTIVE, ZP_COLL_ALLREDUCE}};
    for (guint i = 0; i < s->ops->len; i++) {
        g_assert_cmpint(zp_sched_op(s, i)->kind, ==, want[i].kind);
        g_assert_cmpint(zp_sched_op(s, i)->sub, ==, want[i].sub);
    }
    /* Dispatch and combine run between the layer's kernels, on the compute stream. */
    g_assert_cmpint(zp_sched_op(s, 1)->stream, ==, ZP_STREAM_COMPUTE);
    g_assert_cmpint(zp_sched_op(s, 3)->stream, ==, ZP_STREAM_COMPUTE);
    g_assert_cmpint(zp_sched_op(s, 7)->stream, ==, ZP_STREAM_DP);
    g_assert_cmpint(zp_sched_op(s, 1)->group, ==, ZP_GROUP_EP);
    g_assert_cmpint(zp_sched_op(s, 7)->group, ==, ZP_GROUP_EDP);
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_EP_BUFFERS], ==, 4096);
    g_assert_cmpstr(zp_sched_coll_name(ZP_COLL_EP_DISPATCH), ==, "ep_dispatch");
    g_assert_cmpstr(zp_sched_coll_name(ZP_COLL_EP_COMBINE), ==, "ep_combine");
    g_assert_cmpstr(zp_sched_mem_name(ZP_MEM_EP_BUFFERS), ==, "ep_buffers");
    /* (n - 1) / n of each all-to-all's S over the wire: 2 x 3/4 x 8192. */
    g_assert_cmpfloat(zp_sched_comm_bytes(s, ZP_GROUP_EP), ==, 12288);

    /* Written and read again: the same ops and groups. */
    char *again = g_strconcat(path, ".out.json", NULL);
    g_assert_true(zp_sched_write_json(s, again, &error));
    g_assert_no_error(error);
    ZpSchedule *t = zp_sched_read_graph(again, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(t->ops->len, ==, s->ops->len);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *a = zp_sched_op(s, i), *b = zp_sched_op(t, i);
        g_assert_cmpint(a->kind, ==, b->kind);
        g_assert_cmpint(a->sub, ==, b->sub);
        g_assert_cmpint(a->group, ==, b->group);
        g_assert_cmpint(a->stream, ==, b->stream);
        g_assert_cmpfloat(a->bytes, ==, b->bytes);
    }
    ZpCommGroup g[ZP_SCHED_MAX_GROUPS];
    zp_sched_groups(t, g);
    g_assert_cmpint(g[ZP_GROUP_EP].ranks, ==, 4);
    g_assert_cmpint(g[ZP_GROUP_EDP].stride, ==, 4);
    zp_sched_free(t);
    zp_sched_free(s);
    g_unlink(again);
    g_free(again);
    g_unlink(path);
    g_free(path);
}

/* A plan's groups: EP 4 of dp 8 behind tp 2: ep 4 ranks 2 apart, edp 2 ranks 8 apart. */
static void test_plan_groups(void)
{
    ZpSchedule s = {0};
    zp_plan_defaults(&s.plan, 1, 8, 2);
    s.plan.experts.ep = 4;
    s.stages = 1;
    ZpCommGroup g[ZP_SCHED_MAX_GROUPS];
    g_assert_cmpint(zp_sched_groups(&s, g), ==, ZP_GROUP_N);
    g_assert_cmpint(g[ZP_GROUP_EP].ranks, ==, 4);
    g_assert_cmpint(g[ZP_GROUP_EP].stride, ==, 2);
    g_assert_cmpint(g[ZP_GROUP_EDP].ranks, ==, 2);
    g_assert_cmpint(g[ZP_GROUP_EDP].stride, ==, 8);
    g_assert_cmpstr(g[ZP_GROUP_EP].name, ==, "ep");
    g_assert_cmpstr(g[ZP_GROUP_EDP].name, ==, "edp");
}

/* A file's unknown all-to-all name is refused in one line naming the op and key. */
static void test_graph_refusals(void)
{
    char *text = g_strdup(graph_json);
    char *at = strstr(text, "ep_combine");
    memcpy(at, "ep_combin_", 10);
    char *path = write_text(text);
    GError *error = NULL;
    g_assert_null(zp_sched_read_graph(path, &error));
    g_assert_nonnull(error);
    g_assert_nonnull(strstr(error->message, "ops[3]: key \"op\" has unknown value \"ep_combin_\""));
    g_assert_null(strchr(error->message, '\n'));
    g_clear_error(&error);
    g_unlink(path);
    g_free(path);
    g_free(text);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/moe-sched/graph-names", test_graph_names);
    g_test_add_func("/moe-sched/plan-groups", test_plan_groups);
    g_test_add_func("/moe-sched/graph-refusals", test_graph_refusals);
    return g_test_run();
}
