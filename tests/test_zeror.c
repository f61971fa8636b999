/* test_zeror: ZeRO-R — partitioned activation checkpoints (Pa, Pa+cpu) in the memory model
 * and the schedule, the ZeRO paper's 100B run, and the caching-allocator replay. */
#include "real_alloc.h"
#include "testutil.h"
#include "zp_alloc_replay.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_model.h"
#include "zp_sched.h"
#include "zp_util.h"
#include "zp_zeror.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB 1048576.0

/* The ZeRO paper's 100B run (section 10): 125 layers, hidden 8192, MP 16, stage 2,
 * micro-batch 32 per GPU on 400 GPUs (DP 25), checkpointing every block. */
static ZpPlan paper_100b_plan(ZpModel *m)
{
    GError *error = NULL;
    g_assert_true(zp_model_load("zero-100b", m, &error));
    g_assert_no_error(error);
    ZpPlan p;
    zp_plan_defaults(&p, 2, 25, 16);
    p.impl = ZP_IMPL_PAPER; /* the paper's figures */
    p.micro_batch = 32;
    p.checkpoint = TRUE;
    return p;
}

typedef struct {
    int kept_allocs, full_allocs, tp_gathers, host_copies;
    double host_bytes;
} Counts;

static Counts count_ops(const ZpSchedule *s, double kept_bytes, double full_bytes)
{
    Counts c = {0};
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_CHECKPOINTS) {
            c.kept_allocs += op->bytes == kept_bytes;
            c.full_allocs += op->bytes == full_bytes;
        }
        /* A block's regathered checkpoint (not the vocab-parallel head's loss statistics). */
        if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_TP &&
            op->sub == ZP_COLL_ALLGATHER && op->unit >= 1 && op->unit <= (int)s->model.layers) {
            c.tp_gathers++;
            g_assert_cmpfloat(op->bytes, ==, full_bytes);
        }
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_HOST_COPY) {
            c.host_copies++;
            c.host_bytes += op->bytes;
        }
    }
    return c;
}

/* Pa with M = 16: each rank keeps 1/16 of every checkpoint, and backward all-gathers each
 * block's b*s*h input over the tensor group once before its recompute, which sends
 * (M-1)/M * 2bsh bytes more per block (ring all-gather). */
static void test_partition_activations(void)
{
    ZpModel m;
    ZpPlan p = paper_100b_plan(&m);
    const double L = 125, bsh = 32.0 * 1024 * 8192, full = 2 * bsh;
    GError *error = NULL;
    ZpSchedule *plain = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const ZpResidual r0 = zp_mem_residual(&m, &p, NULL);
    p.ckpt.partition_activations = TRUE;
    ZpSchedule *pa = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const ZpResidual r1 = zp_mem_residual(&m, &p, NULL);
    g_assert_cmpfloat(r0.checkpoint_bytes, ==, L * full);
    g_assert_cmpfloat(r1.checkpoint_bytes, ==, L * full / 16);
    g_assert_cmpfloat(r1.recompute_bytes, ==, r0.recompute_bytes + full);
    const Counts c0 = count_ops(plain, full / 16, full), c1 = count_ops(pa, full / 16, full);
    g_assert_cmpint(c0.tp_gathers, ==, 0);
    g_assert_cmpint(c1.tp_gathers, ==, (int)L);
    g_assert_cmpint(c1.kept_allocs, ==, (int)L); /* forward: the 1/16 slices */
    g_assert_cmpint(c1.full_allocs, ==, (int)L); /* backward: the re-gathered inputs */
    const double extra = zp_sched_comm_bytes(pa, ZP_GROUP_TP) - zp_sched_comm_bytes(plain, ZP_GROUP_TP);
    g_assert_cmpfloat(fabs(extra - L * 15.0 / 16.0 * full), <, 1e-6 * extra);
    zp_sched_free(plain);
    zp_sched_free(pa);
}

/* Pa+cpu: nothing of the checkpoints stays on the GPU between forward and backward; each
 * block's 1/16 slice goes to the host and comes back, 2L copies of 2bsh/16 bytes. */
static void test_cpu_checkpointing(void)
{
    ZpModel m;
    ZpPlan p = paper_100b_plan(&m);
    p.ckpt.partition_activations = TRUE;
    p.ckpt.cpu_checkpointing = TRUE;
    const double L = 125, full = 2 * 32.0 * 1024 * 8192;
    const ZpResidual r = zp_mem_residual(&m, &p, NULL);
    g_assert_cmpfloat(r.checkpoint_bytes, ==, 0);
    g_assert_cmpfloat(r.checkpoint_host_bytes, ==, L * full / 16);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const Counts c = count_ops(s, full / 16, full);
    g_assert_cmpint(c.kept_allocs, ==, 0);
    g_assert_cmpint(c.full_allocs, ==, (int)L);
    g_assert_cmpint(c.tp_gathers, ==, (int)L);
    g_assert_cmpint(c.host_copies, ==, 2 * (int)L);
    g_assert_cmpfloat(c.host_bytes, ==, 2 * L * full / 16);
    zp_sched_free(s);
    /* The options need checkpointing, and Pa a b*s*h the tensor group divides. */
    p.checkpoint = FALSE;
    g_assert_null(zp_sched_build(&m, &p, &error));
    g_assert_error(error, ZP_ERROR, ZP_ERROR_VALUE);
    g_assert_nonnull(strstr(error->message, "activation_checkpointing"));
    g_clear_error(&error);
}

static double jnum(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    g_assert_nonnull(v);
    return json_number_value(v);
}

/* A copy of a shipped hwprofile with one number changed, in a temporary file the caller
 * unlinks and frees. */
static char *profile_with(const char *name, const char *key, double value)
{
    char *src = g_strdup_printf(ZP_DATA_DIR "/hwprofiles/%s.json", name);
    json_error_t jerr;
    json_t *profile = json_load_file(src, 0, &jerr);
    g_free(src);
    g_assert_nonnull(profile);
    json_object_set_new(profile, key, json_real(value));
    char *path = NULL;
    const int fd = g_file_open_tmp("zp-profile-XXXXXX.json", &path, NULL);
    g_assert_cmpint(fd, >=, 0);
    close(fd);
    g_assert_cmpint(json_dump_file(profile, path, 0), ==, 0);
    json_decref(profile);
    return path;
}

/* Pa+cpu's slices are in issue 16's host tier: per rank L x 2bsh/16 bytes of checkpoints in
 * the CPU row (zp_offload_tiers and the schedule's host bytes alike), 16 ranks' worth per
 * DGX-2 node (67.1 GB for the 100B run); on a node with 50 GB of host memory `simulate`
 * refuses the plan naming the tier, and `memory` finds it does not fit. */
static void test_cpu_checkpointing_host_tier(void)
{
    ZpModel m;
    ZpPlan p = paper_100b_plan(&m);
    p.ckpt.partition_activations = TRUE;
    p.ckpt.cpu_checkpointing = TRUE;
    const double per_rank = 125 * 2 * 32.0 * 1024 * 8192 / 16;
    const ZpHw hw = tu_load_hw("dgx2-v100");
    ZpTiers t;
    zp_offload_tiers(&m, &p, &hw, &t);
    g_assert_cmpfloat(t.bytes[ZP_TIER_CPU][ZP_MEM_CHECKPOINTS], ==, per_rank);
    g_assert_cmpfloat(t.total_bytes[ZP_TIER_CPU], ==, per_rank);
    g_assert_cmpfloat(t.pinned_bytes, ==, 0); /* .cpu(): pageable */
    g_assert_cmpfloat(t.cpu_node_bytes, ==, 16 * per_rank);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(s->host_bytes[ZP_MEM_CHECKPOINTS], ==, per_rank);
    zp_sched_free(s);

    char *path = profile_with("dgx2-v100", "cpu_memory_bytes", 50e9);
    char *args = g_strdup_printf("simulate --model zero-100b --cluster %s --gpus 400 --mp 16 "
                                 "--stage 2 --micro-batch 32 --checkpoint --impl paper "
                                 "--partition-activations --cpu-checkpointing", path);
    TuRun run = tu_zplan(args);
    g_free(args);
    g_assert_true(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 2);
    g_assert_nonnull(strstr(run.err, "CPU memory per node overflows"));
    g_assert_nonnull(strstr(run.err, "67.1 GB"));
    tu_free(&run);
    args = g_strdup_printf("memory --model zero-100b --cluster %s --gpus 400 --mp 16 "
                           "--micro-batch 32 --checkpoint --impl paper --partition-activations "
                           "--cpu-checkpointing --json", path);
    json_t *mem = tu_zplan_json_exit(args, 2);
    g_free(args);
    json_t *need = json_object_get(json_array_get(json_object_get(mem, "rows"), 0), "need_bytes");
    g_assert_cmpfloat(jnum(need, "stage2"), >, jnum(mem, "gpu_memory_bytes"));
    json_decref(mem);
    g_unlink(path);
    g_free(path);
}

/* The ZeRO paper's 100B run fits 32 GB V100s with Pa and does not without: `zplan simulate`
 * exits 0 with it and 2 (does not fit) without, and the fit counts the allocator's
 * reserved bytes, at least its allocated ones. */
static void test_paper_100b_fits_with_pa(void)
{
    const char *base = "simulate --model zero-100b --cluster dgx2-v100 --gpus 400 --mp 16 "
                       "--stage 2 --micro-batch 32 --checkpoint --impl paper --json";
    json_t *without = tu_zplan_json_exit(base, 2);
    char *args = g_strdup_printf("%s --partition-activations", base);
    json_t *with = tu_zplan_json(args);
    g_free(args);
    json_t *runs[2] = {without, with};
    for (int i = 0; i < 2; i++) {
        json_t *a = json_object_get(runs[i], "caching_allocator");
        g_assert_cmpfloat(json_real_value(json_object_get(a, "peak_reserved_bytes")), >=,
                          json_real_value(json_object_get(a, "peak_allocated_bytes")));
    }
    g_assert_false(json_boolean_value(json_object_get(without, "fits_in_gpu_memory")));
    g_assert_true(json_boolean_value(json_object_get(with, "fits_in_gpu_memory")));
    json_decref(without);
    json_decref(with);
}

/* Compute ops that wait on a data-parallel collective (a dependency on one). */
static int compute_waiting_on_dp(const ZpSchedule *s)
{
    int n = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        const uint32_t *d = zp_sched_deps(s, op);
        gboolean waits = FALSE;
        for (uint32_t k = 0; op->kind == ZP_OP_COMPUTE && k < op->n_deps; k++)
            waits |= zp_sched_op(s, d[k])->kind == ZP_OP_COLLECTIVE &&
                     zp_sched_op(s, d[k])->stream == ZP_STREAM_DP;
        n += waits;
    }
    return n;
}

/* synchronize_checkpoint_boundary: each checkpointed block's forward and backward waits for
 * what every stream has in flight, so at stage 2 with overlap_comm the backward blocks wait
 * for the gradient reductions launched before them, which otherwise only the optimizer does. */
static void test_synchronize_boundary(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt2-1.5b", &m, &error));
    ZpPlan p;
    zp_plan_defaults(&p, 2, 64, 1);
    p.impl = ZP_IMPL_PAPER; /* written against the paper's schedule */
    p.checkpoint = TRUE;
    p.zero.overlap_comm = TRUE;
    p.zero.reduce_bucket_size = 5e7;
    ZpSchedule *plain = zp_sched_build(&m, &p, &error);
    p.ckpt.synchronize_checkpoint_boundary = TRUE;
    ZpSchedule *sync = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    /* Without it only the optimizer waits for the reductions; with it the blocks do too. */
    g_assert_cmpint(compute_waiting_on_dp(plain), ==, 1);
    g_assert_cmpint(compute_waiting_on_dp(sync), >, 1);
    zp_sched_free(plain);
    zp_sched_free(sync);
}

/* A hand-built sequence (MiB) under an 80 MiB capacity: a 60 MiB temporary is freed, then
 * short-lived s0, s1 and long-lived l0, l1 (12 each) are carved from its segment in turn.
 * Freeing s0 and s1 leaves three separate 12 MiB holes, so a 24 MiB request needs a new
 * segment (60 + 24 > 80) although only 24 MiB is allocated: out of memory from
 * fragmentation, with a 12 MiB largest free block. With MD the long-lived ones sit in one
 * 24 MiB region allocated at the first of them, the holes merge, and the request fits. */
static void test_fragmentation(void)
{
    ZpAllocReplay *a = zp_alloc_replay_new(80 * MIB);
    g_assert_true(zp_alloc_replay_malloc(a, 0, 60 * MIB));
    g_assert_true(zp_alloc_replay_release(a, 0));
    const uint64_t order[] = {1, 2, 3, 4}; /* s0, l0, s1, l1 */
    for (int i = 0; i < 4; i++)
        g_assert_true(zp_alloc_replay_malloc(a, order[i], 12 * MIB));
    g_assert_true(zp_alloc_replay_release(a, 1));
    g_assert_true(zp_alloc_replay_release(a, 3));
    g_assert_false(zp_alloc_replay_malloc(a, 5, 24 * MIB));
    ZpAllocStats st = zp_alloc_replay_stats(a);
    g_assert_true(st.oom && st.oom_fragmented);
    g_assert_cmpfloat(st.oom_largest_free_bytes, ==, 12 * MIB);
    g_assert_cmpfloat(st.oom_allocated_bytes, ==, 24 * MIB);
    g_assert_cmpfloat(st.oom_reserved_bytes, ==, 60 * MIB);
    zp_alloc_replay_free_all(a);

    a = zp_alloc_replay_new(80 * MIB);
    g_assert_true(zp_alloc_replay_malloc(a, 0, 60 * MIB));
    g_assert_true(zp_alloc_replay_release(a, 0));
    g_assert_true(zp_alloc_replay_malloc(a, 1, 12 * MIB));  /* s0 */
    g_assert_true(zp_alloc_replay_malloc(a, 10, 24 * MIB)); /* the region for l0 and l1 */
    g_assert_true(zp_alloc_replay_malloc(a, 3, 12 * MIB));  /* s1 */
    g_assert_true(zp_alloc_replay_release(a, 1));
    g_assert_true(zp_alloc_replay_release(a, 3));
    g_assert_true(zp_alloc_replay_malloc(a, 5, 24 * MIB));
    st = zp_alloc_replay_stats(a);
    g_assert_false(st.oom);
    g_assert_cmpfloat(st.reserved_bytes, ==, 60 * MIB);
    zp_alloc_replay_free_all(a);
}

/* PyTorch's size classes: 1000 bytes round to 1024 in a 2 MiB small segment; 5 MiB takes a
 * 20 MiB segment, whose other 15 MiB then serve 11 MiB + 1 byte; 16 MiB gets a segment of
 * its own, and once freed serves 15 MiB whole (a 1 MiB rest is not split off). */
static void test_size_classes(void)
{
    ZpAllocReplay *a = zp_alloc_replay_new(0);
    g_assert_true(zp_alloc_replay_malloc(a, 1, 1000));
    ZpAllocStats st = zp_alloc_replay_stats(a);
    g_assert_cmpfloat(st.allocated_bytes, ==, 1024);
    g_assert_cmpfloat(st.reserved_bytes, ==, 2 * MIB);
    g_assert_true(zp_alloc_replay_malloc(a, 2, 5 * MIB));
    g_assert_cmpfloat(zp_alloc_replay_stats(a).reserved_bytes, ==, 22 * MIB);
    g_assert_true(zp_alloc_replay_malloc(a, 3, 11 * MIB + 1));
    g_assert_cmpfloat(zp_alloc_replay_stats(a).reserved_bytes, ==, 22 * MIB);
    g_assert_cmpfloat(zp_alloc_replay_stats(a).allocated_bytes, ==, 1024 + 16 * MIB + 512);
    g_assert_true(zp_alloc_replay_malloc(a, 4, 16 * MIB));
    g_assert_cmpfloat(zp_alloc_replay_stats(a).reserved_bytes, ==, 38 * MIB);
    g_assert_true(zp_alloc_replay_release(a, 4));
    g_assert_false(zp_alloc_replay_release(a, 4));
    g_assert_true(zp_alloc_replay_malloc(a, 5, 15 * MIB));
    st = zp_alloc_replay_stats(a);
    g_assert_cmpfloat(st.reserved_bytes, ==, 38 * MIB);
    g_assert_cmpfloat(st.allocated_bytes, ==, 1024 + 32 * MIB + 512);
    g_assert_cmpfloat(st.reserved_bytes, >=, st.allocated_bytes);
    zp_alloc_replay_free_all(a);
}

/* A schedule's replay reserves at least what it allocates. GPT-3 175B at stage 3 on 64 GPUs
 * with checkpointing interleaves long-lived checkpoints with short-lived gathers and
 * activations, leaving holes in the segments at the peak; with MD the checkpoints sit in one
 * region allocated at the first of them, and the reserved bytes above the allocated shrink. */
static void test_schedule_replay(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt3-175b", &m, &error));
    ZpPlan p;
    zp_plan_defaults(&p, 3, 64, 1);
    p.impl = ZP_IMPL_PAPER; /* written against the paper's schedule */
    p.micro_batch = 2;
    p.checkpoint = TRUE;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const ZpAllocStats plain = zp_alloc_replay_schedule(s, 0);
    zp_sched_free(s);
    p.ckpt.contiguous_memory_optimization = TRUE;
    s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const ZpAllocStats md = zp_alloc_replay_schedule(s, 0);
    zp_sched_free(s);
    g_test_message("175B stage 3: reserved %.4g allocated %.4g; with MD reserved %.4g "
                   "allocated %.4g", plain.reserved_at_peak_bytes, plain.peak_allocated_bytes,
                   md.reserved_at_peak_bytes, md.peak_allocated_bytes);
    g_assert_cmpfloat(plain.peak_reserved_bytes, >=, plain.peak_allocated_bytes);
    g_assert_cmpfloat(md.peak_reserved_bytes, >=, md.peak_allocated_bytes);
    g_assert_false(plain.oom || md.oom);
    const double gap = plain.reserved_at_peak_bytes - plain.peak_allocated_bytes;
    const double md_gap = md.reserved_at_peak_bytes - md.peak_allocated_bytes;
    g_assert_cmpfloat(gap, >, 100 * MIB);
    g_assert_cmpfloat(md_gap, <, gap / 10);
}

/* One answer for the fit: `simulate`, `memory` and `plan` all judge a plan by the bytes the
 * caching allocator reserves at the peak (at least the live peak) plus the reserve. GPT-3
 * 175B at stage 3 on 64 GPUs, micro-batch 2, checkpointing: its live peak is below its
 * reserved peak, so on a GPU whose memory lies halfway between the two (plus the reserve)
 * `simulate` and `memory` both say it does not fit, with the same need; and `plan`'s best plan
 * needs what `simulate` of its ds_config says. */
static void test_one_answer(void)
{
    const char *shape = "--model gpt3-175b --gpus 64 --micro-batch 2 --checkpoint";
    char *args = g_strdup_printf("simulate %s --cluster dgx-a100-80g --stage 3 --json", shape);
    json_t *sim = tu_zplan_json(args);
    g_free(args);
    const double live = jnum(sim, "peak_memory_bytes");
    const double reserved = jnum(json_object_get(sim, "caching_allocator"), "peak_reserved_bytes");
    json_decref(sim);
    g_assert_cmpfloat(reserved, >, live + 1e9); /* the gap the test stands on */

    const double reserve = tu_load_hw("dgx-a100-80g").runtime_reserve_bytes;
    char *path = profile_with("dgx-a100-80g", "gpu_memory_bytes", 0.5 * (live + reserved) + reserve);

    args = g_strdup_printf("simulate %s --cluster %s --stage 3 --json", shape, path);
    sim = tu_zplan_json_exit(args, 2);
    g_free(args);
    g_assert_false(json_boolean_value(json_object_get(sim, "fits_in_gpu_memory")));
    json_decref(sim);
    args = g_strdup_printf("memory %s --cluster %s --json", shape, path);
    json_t *mem = tu_zplan_json_exit(args, 2);
    g_free(args);
    json_t *need = json_object_get(json_array_get(json_object_get(mem, "rows"), 0), "need_bytes");
    g_assert_cmpfloat(fabs(jnum(need, "stage3") - (reserved + reserve)),
                      <=, 1e-9 * reserved);
    json_decref(mem);
    g_unlink(path);
    g_free(path);

    /* plan's need for its best plan is simulate's for the same ds_config. */
    char *ds = g_strdup_printf("%s/zp-one-answer-%d.json", g_get_tmp_dir(), (int)getpid());
    args = g_strdup_printf("plan --model gpt3-175b --gpus 64 --mp 1 --cluster dgx-a100-80g "
                           "--json --ds-config %s", ds);
    json_t *plan = tu_zplan_json(args);
    g_free(args);
    const double planned = jnum(json_object_get(plan, "best"), "peak_memory_bytes");
    json_decref(plan);
    args = g_strdup_printf("simulate --model gpt3-175b --gpus 64 --cluster dgx-a100-80g "
                           "--ds-config %s --json", ds);
    sim = tu_zplan_json(args);
    g_free(args);
    const double sim_need =
        fmax(jnum(sim, "peak_memory_bytes"),
             jnum(json_object_get(sim, "caching_allocator"), "peak_reserved_bytes")) + reserve;
    json_decref(sim);
    g_unlink(ds);
    g_free(ds);
    g_assert_cmpfloat(fabs(planned - sim_need), <=, 1e-9 * sim_need);
}

/* zreal's tracker replays its own sequence: a 5 MiB buffer reserves a 20 MiB segment, and
 * 1000 bytes a 2 MiB small one; releasing keeps the segments (no compaction). */
static void test_tracker_replay(void)
{
    RealAlloc *t = real_alloc_new();
    void *a = real_alloc_take(t, 5 * 1048576, REAL_MEM_WORKSPACE);
    void *b = real_alloc_take(t, 1000, REAL_MEM_BUCKETS);
    real_alloc_release(t, a);
    real_alloc_release(t, b);
    RealCachingStats st;
    real_alloc_caching_stats(t, &st);
    g_assert_cmpfloat(st.peak_allocated_bytes, ==, 5 * MIB + 1024);
    g_assert_cmpfloat(st.peak_reserved_bytes, ==, 22 * MIB);
    g_assert_cmpfloat(st.largest_free_at_peak_bytes, ==, 15 * MIB);
    real_alloc_free_tracker(t);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/zeror/partition-activations", test_partition_activations);
    g_test_add_func("/zeror/cpu-checkpointing", test_cpu_checkpointing);
    g_test_add_func("/zeror/cpu-checkpointing-host-tier", test_cpu_checkpointing_host_tier);
    g_test_add_func("/zeror/paper-100b", test_paper_100b_fits_with_pa);
    g_test_add_func("/zeror/synchronize-boundary", test_synchronize_boundary);
    g_test_add_func("/alloc/fragmentation", test_fragmentation);
    g_test_add_func("/alloc/size-classes", test_size_classes);
    g_test_add_func("/alloc/schedule", test_schedule_replay);
    g_test_add_func("/alloc/zreal-tracker", test_tracker_replay);
    g_test_add_func("/alloc/one-answer", test_one_answer);
    return g_test_run();
}
