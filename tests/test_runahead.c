/* test_runahead: DeepSpeed's stage-3 host running ahead of the GPU (planner/zp_runahead.h) — the
 * allocator's bound by hand, the reductions' gate, the gathered peak kept and the gathers
 * overlapping the compute before them. */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_runahead.h"
#include "zp_sched.h"

#include <math.h>

#define GB 1e9
#define NONE UINT32_MAX

/* Appends an op with up to two dependencies (NONE: fewer). */
static void add(ZpSchedule *s, ZpOp op, uint32_t d0, uint32_t d1)
{
    op.dep_start = s->deps->len;
    op.n_deps = 0;
    const uint32_t d[2] = {d0, d1};
    for (int k = 0; k < 2; k++)
        if (d[k] != NONE)
            g_array_append_val(s->deps, d[k]), op.n_deps++;
    g_array_append_val(s->ops, op);
}

static void compute(ZpSchedule *s, uint32_t after)
{
    add(s, (ZpOp){.kind = ZP_OP_COMPUTE, .stream = ZP_STREAM_COMPUTE, .buffer = -1}, after,
        NONE);
}

static void memory(ZpSchedule *s, ZpOpKind kind, int buffer, double bytes, uint32_t after)
{
    add(s, (ZpOp){.kind = kind, .sub = ZP_MEM_GATHERED_PARAMS, .buffer = buffer,
                  .bytes = bytes}, after, NONE);
}

/* A 300-byte gather, then three of 100, each taken after the compute before it; the second's
 * release waits for a collective (an unpack's place), so it counts with the next compute op.
 * Live when each is taken: 300 (nothing back yet), 400 - 300 = 100 (after op 2), 500 - 400 =
 * 100 (after op 7), 600 - 500 = 100 (after op 9): the pool R is 300. With it the first needs
 * no compute op, and the other three only op 2 (300 back): 400 - 300, 500 - 300 and 600 - 300
 * are all within 300. */
static void test_hand_bound(void)
{
    ZpSchedule s = {.ops = g_array_new(FALSE, FALSE, sizeof(ZpOp)),
                    .deps = g_array_new(FALSE, FALSE, sizeof(uint32_t))};
    compute(&s, NONE);                          /* 0 */
    memory(&s, ZP_OP_ALLOC, 0, 300, 0);         /* 1 */
    compute(&s, 1);                             /* 2 */
    memory(&s, ZP_OP_FREE, 0, 300, 2);          /* 3 */
    memory(&s, ZP_OP_ALLOC, 1, 100, 2);         /* 4 */
    add(&s, (ZpOp){.kind = ZP_OP_COLLECTIVE, .stream = ZP_STREAM_DP, .buffer = 1}, 4,
        NONE);                                  /* 5 */
    memory(&s, ZP_OP_FREE, 1, 100, 5);          /* 6 */
    compute(&s, 5);                             /* 7 */
    memory(&s, ZP_OP_ALLOC, 2, 100, 7);         /* 8 */
    compute(&s, 8);                             /* 9 */
    memory(&s, ZP_OP_FREE, 2, 100, 9);          /* 10 */
    memory(&s, ZP_OP_ALLOC, 3, 100, 9);         /* 11 */
    compute(&s, 11);                            /* 12 */
    memory(&s, ZP_OP_FREE, 3, 100, 12);         /* 13 */
    GArray *gated = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const uint32_t allocs[] = {1, 4, 8, 11};
    g_array_append_vals(gated, allocs, G_N_ELEMENTS(allocs));
    g_assert_cmpfloat(zp_runahead_bound(&s, gated), ==, 300);
    g_assert_cmpuint(zp_sched_op(&s, 1)->n_deps, ==, 0);
    for (int k = 1; k < 4; k++) {
        const ZpOp *op = zp_sched_op(&s, allocs[k]);
        g_assert_cmpuint(op->n_deps, ==, 1);
        g_assert_cmpuint(zp_sched_deps(&s, op)[0], ==, 2);
    }
    g_array_unref(gated);
    g_array_unref(s.ops);
    g_array_unref(s.deps);
}

static gboolean gathered_alloc(const ZpOp *op)
{
    return op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_GATHERED_PARAMS && op->micro >= 0 &&
           op->buffer >= 0;
}

static gboolean has_dep(const ZpSchedule *s, const ZpOp *op, uint32_t dep)
{
    for (uint32_t d = 0; d < op->n_deps; d++)
        if (zp_sched_deps(s, op)[d] == dep)
            return TRUE;
    return FALSE;
}

/* stage3.py __reduce_and_partition_ipg_grads: with more than max_param_reduce_events = 2
 * reductions outstanding the host synchronises the oldest before launching a bucket, and the
 * epilogue synchronises all of them, so a gather taken after the m-th reduce-scatter of a
 * backward (m >= 4) waits for the (m-3)-th, and one of the next micro-step for the last. Small
 * buckets give many reductions a backward, no prefetch and no reuse distance gathers in it,
 * and two micro-steps cross an epilogue. */
static void test_reduce_gate(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 4, 1);
    p.grad_accum = 2;
    p.zero.reduce_bucket_size = 2e6;
    p.zero.stage3_max_reuse_distance = 0;
    p.zero.stage3_prefetch_bucket_size = 0;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    GArray *rs = g_array_new(FALSE, FALSE, sizeof(uint32_t)); /* this backward's */
    int rs_micro = -1;
    guint gated = 0, after_epilogue = 0;
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_REDUCE_SCATTER) {
            if (op->micro != rs_micro)
                g_array_set_size(rs, 0), rs_micro = op->micro;
            g_array_append_val(rs, i);
            continue;
        }
        if (!gathered_alloc(op) || rs->len == 0)
            continue;
        const uint32_t *r = (const uint32_t *)rs->data;
        if (op->micro > rs_micro) {
            g_assert_true(has_dep(s, op, r[rs->len - 1]));
            after_epilogue++;
        } else if (rs->len >= 4) {
            g_assert_true(has_dep(s, op, r[rs->len - 4]));
            gated++;
        }
    }
    g_test_message("%u gathers behind a reduction three back, %u behind an epilogue", gated,
                   after_epilogue);
    g_assert_cmpuint(gated, >, 10);
    g_assert_cmpuint(after_epilogue, >, 0);
    g_array_unref(rs);
    zp_sched_free(s);
}

/* Whether op is what a module's compute waits for of a gather: its all-gather, or its call's
 * unpack. */
static gboolean fetch_event(const ZpOp *op)
{
    return (op->kind == ZP_OP_COLLECTIVE && op->sub == ZP_COLL_ALLGATHER) ||
           (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_UNPACK);
}

/* partitioned_param_coordinator.py _fetch_sub_module_impl: before waiting for the n-th
 * parameter, with more than __max_ongoing_fetch_events = 2 events outstanding, the host
 * synchronises the oldest, the one recorded after parameter n-3's wait. So a gather taken
 * after the computes that waited for N parameters (N >= 4) waits for the event of one at least
 * N-4 back (the host has waited for N at least: its last wait's gate is 3 back from it). No
 * prefetch and no reuse distance: every use gathers its own. */
static void test_fetch_gate(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 4, 1);
    p.checkpoint = TRUE;
    p.zero.stage3_max_reuse_distance = 0;
    p.zero.stage3_prefetch_bucket_size = 0;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    GArray *events = g_array_new(FALSE, FALSE, sizeof(uint32_t)); /* in wait order */
    guint checked = 0;
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE && op->stream == ZP_STREAM_COMPUTE) {
            for (uint32_t d = 0; d < op->n_deps; d++)
                if (fetch_event(zp_sched_op(s, zp_sched_deps(s, op)[d])))
                    g_array_append_val(events, zp_sched_deps(s, op)[d]);
            continue;
        }
        if (!gathered_alloc(op) || events->len < 4)
            continue;
        gboolean gated = FALSE;
        for (guint j = events->len - 4; j < events->len && !gated; j++)
            gated = has_dep(s, op, g_array_index(events, uint32_t, j));
        for (uint32_t d = 0; d < op->n_deps && !gated; d++) /* or a later one of its own step */
            gated = fetch_event(zp_sched_op(s, zp_sched_deps(s, op)[d])) &&
                    zp_sched_deps(s, op)[d] > g_array_index(events, uint32_t, events->len - 1);
        g_assert_true(gated);
        checked++;
    }
    g_test_message("%u gathers behind the allgather stream's event three waits back", checked);
    g_assert_cmpuint(checked, >, 100);
    g_array_unref(events);
    zp_sched_free(s);
}

static SimResult *simulate(const ZpSchedule *s, gboolean timeline)
{
    ZpHw hw = tu_load_hw("dgx-a100-80g");
    /* Without the interference of the profile's kernel rates: a gather issued earlier slows
     * the compute it then overlaps, so the run-ahead's step is bounded by the synchronous one
     * only without it (with it, 10.8358754 s both, the run-ahead's a few ulps longer). */
    hw.kernel_rates.present = FALSE;
    const SimOptions options = {.record_timeline = timeline};
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    return r;
}

static ZpSchedule *build(const char *model, int gpus, int mp, gboolean checkpoint,
                         gboolean no_runahead)
{
    const ZpModel m = tu_load_model(model);
    ZpPlan p;
    zp_plan_defaults(&p, 3, gpus / mp, mp);
    p.micro_batch = 1;
    p.checkpoint = checkpoint;
    p.no_runahead = no_runahead;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* The pool R of a schedule built without the run-ahead (zp_runahead_bound over its gathers,
 * each then taken after the compute op before it), beside the persistent parameters' copies. */
static double pool_bytes(ZpSchedule *s)
{
    GArray *gated = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (gathered_alloc(op) && op->n_deps > 0)
            g_array_append_val(gated, i);
    }
    const double pool = zp_runahead_bound(s, gated);
    g_array_unref(gated);
    return pool + s->state_bytes[ZP_MEM_GATHERED_PARAMS];
}

/* gpt3-175b on 64 A100s with and without checkpointing, gpt-1t on 1,024 with (micro-batch 1):
 * the gathered parameters live at once stay within the pool R beside the persistent copies,
 * the most the schedule without the run-ahead holds (its simulated peak of them, which that
 * is), while the step gets no longer, and shorter for gpt-1t; the step's peak falls by less
 * than a gigabyte, and grows by less than the pool R of gathers it may take early (gpt3-175b:
 * 328.58 against 326.47 GB, 2.11 GB of gathers for the backward's first blocks, 60.56 against
 * 59.31 GB checkpointed, now that the buffers a reduction reads count as freed when it is
 * issued: zp_impl.h frees_at_issue). (gpt3-175b's steps are equal since its gradient buckets launch module by
 * module, as DeepSpeed's hooks do: no reduction queued at a block's end holds the next
 * block's gathers back any more, so running ahead gains it nothing.) */
static void test_bounded(void)
{
    const struct {
        const char *model;
        int gpus;
        gboolean checkpoint, shorter;
    } cases[] = {{"gpt3-175b", 64, FALSE, FALSE},
                 {"gpt3-175b", 64, TRUE, FALSE},
                 {"gpt-1t", 1024, TRUE, TRUE}};
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpSchedule *ahead = build(cases[i].model, cases[i].gpus, 1, cases[i].checkpoint, FALSE);
        ZpSchedule *sync = build(cases[i].model, cases[i].gpus, 1, cases[i].checkpoint, TRUE);
        SimResult *a = simulate(ahead, FALSE), *b = simulate(sync, FALSE);
        const double pool = pool_bytes(sync);
        const double have = a->category_peak_bytes[ZP_MEM_GATHERED_PARAMS];
        g_test_message("%s on %d GPUs%s: step %.4f s against %.4f s; gathered at most %.3f GB "
                       "(R and the persistent %.3f GB, %.3f GB without); peak %.3f GB against "
                       "%.3f GB",
                       cases[i].model, cases[i].gpus, cases[i].checkpoint ? " checkpointed" : "",
                       a->step_time_s, b->step_time_s, have / GB, pool / GB,
                       b->category_peak_bytes[ZP_MEM_GATHERED_PARAMS] / GB,
                       a->peak_memory_bytes / GB, b->peak_memory_bytes / GB);
        g_assert_cmpfloat(pool, ==, b->category_peak_bytes[ZP_MEM_GATHERED_PARAMS]);
        g_assert_cmpfloat(have, <=, pool);
        g_assert_cmpfloat(a->step_time_s, <=, b->step_time_s);
        if (cases[i].shorter)
            g_assert_cmpfloat(a->step_time_s, <, b->step_time_s);
        /* gathers taken early: at most the pool R of them */
        g_assert_cmpfloat(a->peak_memory_bytes - b->peak_memory_bytes, <=, pool);
        g_assert_cmpfloat(b->peak_memory_bytes - a->peak_memory_bytes, <, 1 * GB);
        sim_result_free(a);
        sim_result_free(b);
        zp_sched_free(ahead);
        zp_sched_free(sync);
    }
}

/* gpt-13b on 16 GPUs, TP 2, checkpointed, with no prefetch (stage3_prefetch_bucket_size 0):
 * every gather is its module's own, issued by its fetch_sub_module. Running ahead, such a
 * gather starts before the compute op ahead of its module's has ended; without, none does. */
static guint overlapped(gboolean no_runahead)
{
    const ZpModel m = tu_load_model("gpt-13b");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 8, 2);
    p.checkpoint = TRUE;
    p.zero.stage3_prefetch_bucket_size = 0;
    p.no_runahead = no_runahead;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    SimResult *r = simulate(s, TRUE);
    guint n = 0;
    uint32_t previous = NONE; /* the compute op before, in list (stream) order */
    for (uint32_t i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->stream != ZP_STREAM_COMPUTE)
            continue;
        for (uint32_t d = 0; d < op->n_deps && previous != NONE; d++) {
            const uint32_t g = zp_sched_deps(s, op)[d];
            if (zp_sched_op(s, g)->sub == ZP_COLL_ALLGATHER &&
                zp_sched_op(s, g)->kind == ZP_OP_COLLECTIVE &&
                r->op_start_s[g] < r->op_end_s[previous])
                n++;
        }
        previous = i;
    }
    g_test_message("%u own gathers began under the compute before them (%s)", n,
                   no_runahead ? "no run-ahead" : "running ahead");
    sim_result_free(r);
    zp_sched_free(s);
    return n;
}

static void test_overlap(void)
{
    g_assert_cmpuint(overlapped(TRUE), ==, 0);
    g_assert_cmpuint(overlapped(FALSE), >, 100);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/runahead/hand-bound", test_hand_bound);
    g_test_add_func("/runahead/fetch-gate", test_fetch_gate);
    g_test_add_func("/runahead/reduce-gate", test_reduce_gate);
    g_test_add_func("/runahead/bounded", test_bounded);
    g_test_add_func("/runahead/overlap", test_overlap);
    return g_test_run();
}
