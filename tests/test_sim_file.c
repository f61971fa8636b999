/* test_sim_file: schedule files: a simulated schedule written and read back, the shipped
 * example, streams and groups of a file, bad input, and `zplan simulate --schedule`. */
#include "sim_common.h"

/* ---- schedule files ---- */

/* A planner's schedule written and read back as a graph is the same op list, bit for bit,
 * and simulates to the same figures; the model-bound reader still reads the file. */
/* The file at path rewritten as root (taken), then read as a graph: refused, the error
 * naming `needle`. */
static void assert_edit_refused(const char *path, json_t *root, const char *needle)
{
    GError *error = NULL;
    g_assert_cmpint(json_dump_file(root, path, 0), ==, 0);
    json_decref(root);
    g_assert_null(zp_sched_read_graph(path, &error));
    g_assert_nonnull(strstr(error->message, needle));
    g_clear_error(&error);
}

static void test_schedule_file_round_trip(void)
{
    ZpPlan p;
    zp_plan_defaults(&p, 3, 8, 2);
    p.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    p.checkpoint = TRUE;
    p.grad_accum = 2;
    p.attention = ZP_ATTN_FLASH2; /* FLOPs in the fused kernel: timed from the file's model */
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&gpt2, &p, &error);
    g_assert_no_error(error);
    double attn_flops = 0;
    for (guint i = 0; i < s->ops->len; i++)
        if (zp_sched_op(s, i)->kind == ZP_OP_COMPUTE) /* others' ranges share the place */
            attn_flops += zp_sched_op(s, i)->attn_flops;
    g_assert_cmpfloat(attn_flops, >, 0);
    char *path = g_build_filename(sim_tmp_dir, "round-trip.json", NULL);
    g_assert_true(zp_sched_write_json(s, path, &error));
    ZpSchedule *g = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(g->ops->len, ==, s->ops->len);
    g_assert_cmpint(memcmp(g->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    g_assert_cmpuint(g->deps->len, ==, s->deps->len);
    g_assert_cmpint(memcmp(g->deps->data, s->deps->data, s->deps->len * sizeof(uint32_t)), ==, 0);
    g_assert_cmpint(memcmp(g->state_bytes, s->state_bytes, sizeof s->state_bytes), ==, 0);
    g_assert_cmpint(g->world, ==, 16);
    for (int mode = 0; mode < 2; mode++) {
        SimResult *a = run(s, &a100, mode), *b = run(g, &a100, mode);
        g_assert_cmpfloat(a->step_time_s, ==, b->step_time_s);
        g_assert_cmpfloat(a->peak_memory_bytes, ==, b->peak_memory_bytes);
        g_assert_cmpfloat(a->exposed_comm_s, ==, b->exposed_comm_s);
        sim_result_free(a);
        sim_result_free(b);
    }
    ZpSchedule *full = zp_sched_read_json(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(full->ops->len, ==, s->ops->len);
    zp_sched_free(full);
    /* Without its model the fused kernel has no rate: refused, not guessed. */
    json_t *root = json_load_file(path, 0, NULL);
    json_object_del(root, "model");
    assert_edit_refused(path, root, "key \"attn_flops\": a fused attention kernel's");
    zp_sched_free(g);
    zp_sched_free(s);
    g_remove(path);
    g_free(path);
}

/* tests/data/schedule-example.json, by hand: 16 ranks on 2 nodes, bf16. A 64 MB all-gather
 * (c1), block_fwd 1e12 FLOPs (a), block_bwd 2e12 (2a) and then a 64 MB reduce-scatter (c2):
 * the step is c1 + 3a + c2; the peak is the states plus the gathered 64 MB. */
/* A pipeline's file (its "stages": each stage's view) simulates as its plan does: the graph
 * reader hands it to zp_sched_read_json, where it once refused the key it did not know. */
static void test_schedule_file_pipeline(void)
{
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 1);
    p.pipe.stages = 4;
    p.grad_accum = 8;
    p.checkpoint = TRUE;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&gpt2, &p, &error);
    g_assert_no_error(error);
    g_assert_cmpint(s->stages, ==, 4);
    char *path = g_build_filename(sim_tmp_dir, "pipeline.json", NULL);
    g_assert_true(zp_sched_write_json(s, path, &error));
    ZpSchedule *g = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpint(g->stages, ==, 4);
    g_assert_cmpuint(g->ops->len, ==, s->ops->len);
    g_assert_cmpint(memcmp(g->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    SimResult *a = run(s, &a100, SIM_MODE_FOLDED), *b = run(g, &a100, SIM_MODE_FOLDED);
    g_assert_cmpfloat(a->step_time_s, ==, b->step_time_s);
    g_assert_cmpfloat(a->peak_memory_bytes, ==, b->peak_memory_bytes);
    for (int k = 0; k < 4; k++)
        g_assert_cmpfloat(a->stage_peak_bytes[k], ==, b->stage_peak_bytes[k]);
    sim_result_free(a);
    sim_result_free(b);
    zp_sched_free(g);
    /* Its ops are held to its plan's: an edited dependency is refused, naming the op. */
    json_t *root = json_load_file(path, 0, NULL);
    json_t *deps = json_object_get(json_array_get(json_object_get(root, "ops"), 5), "deps");
    json_array_clear(deps);
    json_array_append_new(deps, json_integer(10000000));
    assert_edit_refused(path, root, "ops[5]");
    g_remove(path);
    g_free(path);
    zp_sched_free(s);
}

static void test_schedule_file_example(void)
{
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_graph(ZP_DATA_DIR "/tests/data/schedule-example.json", &error);
    g_assert_no_error(error);
    g_assert_cmpint(s->plan.precision, ==, ZP_PREC_BF16);
    const SimCollGroup g = sim_coll_group(&a100, 16, 1, ZP_GROUP_DP);
    const SimCollCost gather = sim_coll_cost(ZP_COLL_ALLGATHER, 64e6, &g);
    const SimCollCost scatter = sim_coll_cost(ZP_COLL_REDUCE_SCATTER, 64e6, &g);
    const double a_s = 1e12 / (312e12 * 0.807);
    for (int mode = 0; mode < 2; mode++) {
        SimResult *r = run(s, &a100, mode);
        /* Seven durations: each collective's latency and transfer, three compute ops. */
        assert_close_grid(r->step_time_s, gather.latency_s + gather.transfer_s + 3 * a_s +
                                              scatter.latency_s + scatter.transfer_s,
                          1e-12, 7);
        g_assert_cmpfloat(r->peak_memory_bytes, ==, 5e9 + 64e6);
        sim_result_free(r);
    }
    zp_sched_free(s);
    /* The second example declares the world, node groups and pipeline neighbours too: every
     * rank simulated or one folded, the same step; each group's ring bytes. */
    s = zp_sched_read_graph(ZP_DATA_DIR "/tests/data/schedule-groups.json", &error);
    g_assert_no_error(error);
    g_assert_cmpint(s->n_groups, ==, ZP_GROUP_N + 2); /* the file's two after the built-ins */
    SimResult *all = run(s, &a100, SIM_MODE_EXPLICIT), *one = run(s, &a100, SIM_MODE_FOLDED);
    g_assert_cmpfloat(all->step_time_s, ==, one->step_time_s);
    g_assert_cmpfloat(all->comm_bytes[ZP_GROUP_N], ==, 2.0 * 63 / 64 * 1e6);
    g_assert_cmpfloat(all->comm_bytes[ZP_GROUP_N + 1], ==, 7.0 / 8 * 256e6);
    g_assert_cmpfloat(all->comm_bytes[ZP_GROUP_PP], ==, 0.5 * 16e6);
    sim_result_free(all);
    sim_result_free(one);
    zp_sched_free(s);
}

/* Two 1 GiB all-reduces over a node's 8 ranks, the second put on the tp stream by its
 * "stream" key: in flight together they share NVLink (test_bandwidth_sharing's case). */
static void test_schedule_file_streams(void)
{
    char *path = g_build_filename(sim_tmp_dir, "streams.json", NULL);
    g_assert_true(g_file_set_contents(
        path,
        "{\"format\": \"zplan-schedule-1\", \"world\": 8, \"groups\": [{\"name\": \"dp\", "
        "\"ranks\": 8, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 1, \"stride\": 1}], "
        "\"ops\": [{\"kind\": \"collective\", \"op\": \"allreduce\", \"group\": \"dp\", "
        "\"bytes\": 1073741824, \"deps\": []}, {\"kind\": \"collective\", \"op\": \"allreduce\", "
        "\"group\": \"dp\", \"stream\": \"tp\", \"bytes\": 1073741824, \"deps\": []}]}",
        -1, NULL));
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpint(zp_sched_op(s, 1)->stream, ==, ZP_STREAM_TP);
    SimResult *r = run(s, &a100, SIM_MODE_EXPLICIT);
    /* Four durations: each all-reduce's latency and transfer. */
    assert_close_grid(r->step_time_s, 8.4 * US + 14 * 3.4 * US + 2 * (2.0 * 7 / 8 * GIB / 230e9),
                      1e-12, 4);
    sim_result_free(r);
    /* Written back, the stream that is not the group's own is kept. */
    g_assert_true(zp_sched_write_json(s, path, &error));
    ZpSchedule *again = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpint(memcmp(again->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    zp_sched_free(again);
    zp_sched_free(s);
    g_remove(path);
    g_free(path);
}

/* A graph's own communicators: the world, node groups and pipeline neighbours beside dp and
 * tp, each timed by NCCL's model for its placement, and written back as read. */
static void test_schedule_file_groups(void)
{
    char *path = g_build_filename(sim_tmp_dir, "groups.json", NULL);
    g_assert_true(g_file_set_contents(
        path,
        "{\"format\": \"zplan-schedule-1\", \"world\": 32, \"groups\": ["
        "{\"name\": \"dp\", \"ranks\": 16, \"stride\": 2}, {\"name\": \"tp\", \"ranks\": 2, "
        "\"stride\": 1}, {\"name\": \"world\", \"ranks\": 32, \"stride\": 1}, {\"name\": "
        "\"node\", \"ranks\": 8, \"stride\": 1}, {\"name\": \"pp\", \"ranks\": 2, "
        "\"stride\": 16}], "
        "\"ops\": [{\"kind\": \"collective\", \"op\": \"allreduce\", \"group\": \"world\", "
        "\"bytes\": 1073741824, \"deps\": []}, {\"kind\": \"collective\", \"op\": "
        "\"allreduce\", \"group\": \"node\", \"bytes\": 67108864, \"deps\": [0]}, "
        "{\"kind\": \"collective\", \"op\": \"allgather\", \"group\": \"pp\", "
        "\"stream\": \"tp\", \"bytes\": 16777216, \"deps\": [1]}]}",
        -1, NULL));
    GError *error = NULL;
    ZpSchedule *s = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    /* dp, tp, pp and ZeRO++'s (ZpGroup), then world and node */
    g_assert_cmpint(s->n_groups, ==, ZP_GROUP_N + 2);
    g_assert_cmpint(zp_sched_op(s, 0)->group, ==, ZP_GROUP_N);
    g_assert_cmpint(zp_sched_op(s, 0)->stream, ==, ZP_STREAM_DP);
    /* The world spans 4 nodes, alone on their NICs; a node group stays on NVLink; a pair
     * 16 ranks apart sits on two nodes, one rank each, 8 pairs sharing each node's NICs. */
    const SimCollGroup world = sim_coll_group_placed(&a100, 32, 32, 1);
    const SimCollGroup node = sim_coll_group_placed(&a100, 32, 8, 1);
    const SimCollGroup pp = sim_coll_group_placed(&a100, 32, 2, 16);
    g_assert_cmpint(world.nodes, ==, 4);
    g_assert_cmpfloat(world.bus_bytes_per_s, ==, 192e9);
    g_assert_cmpint(node.nodes, ==, 1);
    g_assert_cmpfloat(node.bus_bytes_per_s, ==, 230e9);
    g_assert_cmpint(pp.ranks_per_node, ==, 1);
    g_assert_cmpfloat(pp.bus_bytes_per_s, ==, 24e9);
    const SimCollCost c[] = {sim_coll_cost(ZP_COLL_ALLREDUCE, GIB, &world),
                             sim_coll_cost(ZP_COLL_ALLREDUCE, 67108864, &node),
                             sim_coll_cost(ZP_COLL_ALLGATHER, 16777216, &pp)};
    const double want_s = c[0].latency_s + c[0].transfer_s + c[1].latency_s + c[1].transfer_s +
                          c[2].latency_s + c[2].transfer_s;
    for (int mode = 0; mode < 2; mode++) {
        SimResult *r = run(s, &a100, mode);
        /* Six durations: each collective's latency and transfer. */
        assert_close_grid(r->step_time_s, want_s, 1e-12, 6);
        g_assert_cmpfloat(r->comm_bytes[ZP_GROUP_N], ==, 2.0 * 31 / 32 * GIB);
        g_assert_cmpfloat(r->comm_bytes[ZP_GROUP_PP], ==, 0.5 * 16777216);
        sim_result_free(r);
    }
    g_assert_true(zp_sched_write_json(s, path, &error));
    ZpSchedule *again = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpint(again->n_groups, ==, ZP_GROUP_N + 2);
    g_assert_cmpint(memcmp(again->groups, s->groups, sizeof s->groups), ==, 0);
    g_assert_cmpint(memcmp(again->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    zp_sched_free(again);
    zp_sched_free(s);
    /* dp and tp anywhere in the list: they take the first places, the others keep their order. */
    g_assert_true(g_file_set_contents(
        path,
        "{\"format\": \"zplan-schedule-1\", \"world\": 8, \"groups\": [{\"name\": \"world\", "
        "\"ranks\": 8, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 1, \"stride\": 1}, "
        "{\"name\": \"dp\", \"ranks\": 8, \"stride\": 1}], \"ops\": [{\"kind\": \"collective\", "
        "\"op\": \"allreduce\", \"group\": \"dp\", \"bytes\": 1, \"deps\": []}, {\"kind\": "
        "\"collective\", \"op\": \"allreduce\", \"group\": \"world\", \"bytes\": 1, \"deps\": []}]}",
        -1, NULL));
    s = zp_sched_read_graph(path, &error);
    g_assert_no_error(error);
    g_assert_cmpstr(s->groups[ZP_GROUP_DP].name, ==, "dp");
    g_assert_cmpstr(s->groups[ZP_GROUP_PP].name, ==, "pp"); /* one rank: no pipeline */
    g_assert_cmpint(s->groups[ZP_GROUP_PP].ranks, ==, 1);
    g_assert_cmpstr(s->groups[ZP_GROUP_N].name, ==, "world");
    g_assert_cmpint(zp_sched_op(s, 0)->group, ==, ZP_GROUP_DP);
    g_assert_cmpint(zp_sched_op(s, 1)->group, ==, ZP_GROUP_N);
    zp_sched_free(s);
    g_remove(path);
    g_free(path);
}

/* One line naming the op index and key for each fault in a graph file. */
static void test_schedule_file_bad_input(void)
{
    static const char *const head =
        "{\"format\": \"zplan-schedule-1\", \"world\": 4, \"groups\": [{\"name\": \"dp\", "
        "\"ranks\": 4, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 1, \"stride\": 1}], ";
    static const struct {
        const char *ops, *message;
    } cases[] = {
        {"\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1, \"deps\": [7]}]}",
         "ops[0]: key \"deps\": deps[0] is not the index of an op (0 to 0)"},
        {"\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1, \"deps\": []}, "
         "{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1, \"deps\": [0, 2]}, "
         "{\"kind\": \"compute\", \"op\": \"block_bwd\", \"flops\": 1, \"deps\": [1]}]}",
         "ops[1]: key \"deps\": the op is on a dependency cycle"},
        /* (ep and edp are built in since a mixture of experts' groups: test_moe_sched) */
        {"\"ops\": [{\"kind\": \"collective\", \"op\": \"allgather\", \"group\": \"xp\", "
         "\"bytes\": 1, \"deps\": []}]}",
         "ops[0]: key \"group\" has unknown value \"xp\""},
        {"\"ops\": [{\"kind\": \"alloc\", \"category\": \"buckets\", \"bytes\": -5, \"deps\": []}]}",
         "ops[0]: key \"bytes\" = -5 is outside"},
        {"\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": -1, \"deps\": []}]}",
         "ops[0]: key \"flops\" = -1 is outside"},
        {"\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1, \"deps\": [], "
         "\"colour\": 1}]}",
         "ops[0]: unknown key \"colour\""},
        {"\"precision\": \"fp8\", \"ops\": []}", "precision"},
        {"\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 1, \"deps\": [], "
         "\"stream\": \"ep\"}]}",
         "ops[0]: key \"stream\" has unknown value \"ep\""},
        /* A fused kernel's rate needs the model's head dimension and sequence length. */
        {"\"ops\": [{\"kind\": \"compute\", \"op\": \"block_fwd\", \"flops\": 4, "
         "\"attn_flops\": 1, \"deps\": []}]}",
         "ops[0]: key \"attn_flops\": a fused attention kernel's rate depends on the model"},
        {"\"plan\": 7, \"ops\": []}", "keys \"model\" and \"plan\" must be objects"},
    };
    char *path = g_build_filename(sim_tmp_dir, "bad-graph.json", NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *text = g_strconcat(head, cases[i].ops, NULL);
        g_assert_true(g_file_set_contents(path, text, -1, NULL));
        GError *error = NULL;
        g_assert_null(zp_sched_read_graph(path, &error));
        g_assert_nonnull(error);
        g_test_message("case %zu: %s", i, error->message);
        g_assert_nonnull(strstr(error->message, cases[i].message));
        g_error_free(error);
        g_free(text);
    }
    /* Communicators beyond dp and tp: named once, tiling the world. */
    static const struct {
        const char *groups, *message;
    } group_cases[] = {
        {"{\"name\": \"tp\", \"ranks\": 1, \"stride\": 1}, {\"name\": \"pp\", \"ranks\": 4, "
         "\"stride\": 1}", "key \"groups\" must hold a group named dp and one named tp"},
        {"{\"name\": \"dp\", \"ranks\": 4, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 1, "
         "\"stride\": 1}, {\"name\": \"dp\", \"ranks\": 2, \"stride\": 1}",
         "groups[2]: key \"name\": \"dp\": a second group of that name"},
        {"{\"name\": \"dp\", \"ranks\": 4, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 1, "
         "\"stride\": 1}, {\"name\": \"pp\", \"ranks\": 3, \"stride\": 1}",
         "groups[2]: 3 ranks 1 apart do not tile the world of 4"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(group_cases); i++) {
        char *text = g_strdup_printf("{\"format\": \"zplan-schedule-1\", \"world\": 4, "
                                     "\"groups\": [%s], \"ops\": []}",
                                     group_cases[i].groups);
        g_assert_true(g_file_set_contents(path, text, -1, NULL));
        GError *error = NULL;
        g_assert_null(zp_sched_read_graph(path, &error));
        g_test_message("group case %zu: %s", i, error->message);
        g_assert_nonnull(strstr(error->message, group_cases[i].message));
        g_error_free(error);
        g_free(text);
    }
    /* The groups must be placed as the simulator lays them out. */
    g_assert_true(g_file_set_contents(
        path,
        "{\"format\": \"zplan-schedule-1\", \"world\": 8, \"groups\": [{\"name\": \"dp\", "
        "\"ranks\": 4, \"stride\": 1}, {\"name\": \"tp\", \"ranks\": 2, \"stride\": 1}], \"ops\": []}",
        -1, NULL));
    GError *error = NULL;
    g_assert_null(zp_sched_read_graph(path, &error));
    g_assert_nonnull(strstr(error->message, "key \"groups\": dp 4 x tp 2"));
    g_clear_error(&error);
    /* zplan simulate --schedule: one line, nothing on stdout. */
    char *args = g_strdup_printf("simulate --schedule %s --cluster dgx-a100-80g", path);
    TuRun r = tu_zplan(args);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--schedule: "));
    g_assert_nonnull(strstr(r.err, "key \"groups\""));
    g_assert_cmpint((int)(strchr(r.err, '\n') - r.err), ==, (int)strlen(r.err) - 1);
    g_assert_cmpstr(r.out, ==, "");
    tu_free(&r);
    g_free(args);
    g_remove(path);
    g_free(path);
}

/* `zplan schedule --out` then `zplan simulate --schedule`: the same JSON as simulating the
 * plan itself. */
static void test_schedule_file_cli(void)
{
    char *path = g_build_filename(sim_tmp_dir, "cli-schedule.json", NULL);
    const char *plan = "--model gpt2-124m --cluster dgx-a100-80g --gpus 16 --mp 2 --stage 3 "
                       "--micro-batch 2 --checkpoint";
    char *args = g_strdup_printf("schedule %s --out %s", plan, path);
    TuRun r = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("simulate --schedule %s --cluster dgx-a100-80g --explicit --json", path);
    json_t *from_file = tu_zplan_json(args);
    g_free(args);
    args = g_strdup_printf("simulate %s --explicit --json", plan);
    json_t *from_plan = tu_zplan_json(args);
    g_free(args);
    g_assert_true(json_equal(from_file, from_plan));
    json_decref(from_file);
    json_decref(from_plan);
    g_remove(path);
    g_free(path);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_test_add_func("/sim/file/round-trip", test_schedule_file_round_trip);
    g_test_add_func("/sim/file/pipeline", test_schedule_file_pipeline);
    g_test_add_func("/sim/file/example", test_schedule_file_example);
    g_test_add_func("/sim/file/streams", test_schedule_file_streams);
    g_test_add_func("/sim/file/groups", test_schedule_file_groups);
    g_test_add_func("/sim/file/bad-input", test_schedule_file_bad_input);
    g_test_add_func("/sim/file/cli", test_schedule_file_cli);
    return sim_common_run();
}
