/* test_offload: ZeRO-Offload and ZeRO-Infinity — the tiers' bytes from formulas stated here,
 * DeepSpeed's own estimators beside them, the fit check naming the tier, the schedule's
 * transfers and CPU Adam in the simulator, ds_config round trips, and `plan` proposing it. */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_dsconfig.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_offload.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void assert_close(double got, double want)
{
    g_assert_cmpfloat(fabs(got - want), <=, 1e-9 * fabs(want) + 1e-3);
}

/* The largest single tensor (DeepSpeed's largest_param_numel): the token embedding or an MLP
 * weight. */
static double largest(const ZpModel *m)
{
    return fmax((double)m->vocab * m->hidden, (double)m->hidden * m->ffn_hidden);
}

static const char *const models[] = {"gpt-13b", "gpt3-175b"};
static const int gpu_counts[] = {1, 8, 64};

/* Optimizer offload to the CPU at stage 2 (ZeRO-Offload), fp16 Adam, on dgx2-v100 (16 GPUs a
 * node), P = psi/N the partition:
 *   GPU  = 2 psi (the 16-bit parameters stay; stage 2 keeps no gradient partition on the GPU)
 *          + 2 L (temp_grad_buffer_for_gpu_offload, L the largest tensor)
 *   host = 4P master + 8P moments + 4P fp32 gradients + 2P 16-bit copy + 2 L staging
 *        = 18 P + 2 L per rank, times the node's ranks, min(16, N).
 * DeepSpeed's estimate_zero2_model_states_mem_needs(cpu_offload=True) says GPU 2 psi and host
 * psi max(4 N_total, 16) x 1.5 per node. They differ: (1) DeepSpeed's estimator leaves out
 * the two largest-tensor staging buffers; (2) its host figure grows with the total GPU count,
 * because it budgets 4 bytes per parameter per process for the whole fp32 model each process
 * loads before partitioning (an initialisation peak, and counted against one node whatever
 * the node count), and adds 50% for buffers; zplan counts the steady state of the step, which
 * shrinks as 18 psi / N per rank. At 1 GPU they are 18 psi (+2 L) against 24 psi. */
static void test_zero_offload_cpu(void)
{
    const ZpHw hw = tu_load_hw("dgx2-v100");
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++) {
        const ZpModel m = tu_load_model(models[mi]);
        const double psi = (double)zp_model_param_count(&m), L = largest(&m);
        for (size_t gi = 0; gi < G_N_ELEMENTS(gpu_counts); gi++) {
            const int n = gpu_counts[gi], per_node = MIN(16, n);
            ZpPlan plan;
            zp_plan_defaults(&plan, 2, n, 1);
            plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
            plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
            ZpTiers t;
            zp_offload_tiers(&m, &plan, &hw, &t);
            const double part = psi / n;
            assert_close(t.total_bytes[ZP_TIER_GPU], 2 * psi + 2 * L);
            assert_close(t.total_bytes[ZP_TIER_CPU], 18 * part + 2 * L);
            assert_close(t.cpu_node_bytes, per_node * (18 * part + 2 * L));
            assert_close(t.pinned_bytes, t.total_bytes[ZP_TIER_CPU]); /* pin_memory: true */
            g_assert_cmpfloat(t.nvme_node_bytes, ==, 0);
            double ds_cpu, ds_gpu;
            const int nodes = (n + 15) / 16;
            zp_offload_ds_estimate_zero2(psi, per_node, nodes, TRUE, &ds_cpu, &ds_gpu);
            assert_close(ds_gpu, 2 * psi);
            assert_close(ds_cpu, psi * fmax(4.0 * per_node * nodes, 16) * 1.5);
            g_assert_cmpfloat(t.cpu_node_bytes, <, ds_cpu); /* see the comment above */
        }
    }
}

/* a rounded up to DeepSpeed's aio alignment, 1024 bytes of elements of `bytes`. */
static double aligned(double a, double bytes)
{
    return ceil(a * bytes / 1024) * 1024 / bytes;
}

/* DeepSpeed's partitioned_swap_buffer in elements when a sub-group is not kept on the host:
 * stage3.py groups the tensors in order until their partitions (ceil(numel / n) each) reach
 * 1e9 elements, and reserve_partitioned_swap_space sizes the buffer by the largest group's
 * tensors' full numel, each aligned to 512 16-bit elements. */
static double swap_buffer(const ZpModel *m, int n)
{
    GArray *t = zp_model_tensors(m);
    double total = 0, best = -1, full = 0, group = 0, group_full = 0;
    for (guint i = 0; i < t->len; i++)
        total += ceil((double)g_array_index(t, ZpTensor, i).elems / n);
    for (guint i = 0; i < t->len; i++) {
        const double e = (double)g_array_index(t, ZpTensor, i).elems;
        group += ceil(e / n), group_full += aligned(e, 2);
        if ((total > 1e9 && group >= 1e9) || i + 1 == t->len) {
            if (group > best)
                best = group, full = group_full;
            group = group_full = 0;
        }
    }
    g_array_unref(t);
    return full;
}

/* DeepSpeed's stage 3 with the optimizer on NVMe holds no fp32 gradient partition in host
 * memory: a swapped sub-group's .grad views one gradient_buffer of the largest sub-group
 * (stage3.py initialize_optimizer_states, unpinned), its fp32 gradients go to NVMe
 * (_offload_grad_partition_at_boundary -> swap_out_gradients). What the host keeps of the
 * gradients is the 16-bit grad_partitions_flat_buffer (2 P, pinned with pin_memory) and that
 * one 4 x 1e9-byte buffer: gpt3-175b on one DGX-2, P = 10.9e9, 25.9 GB where zplan counted
 * 6 P = 65.6 GB. One DGX-2 then holds 310B at stage 3 (it said 114B), still host-bound. */
static void test_nvme_grads_not_on_host(void)
{
    const ZpHw hw = tu_load_hw("dgx2-v100");
    const ZpModel m = tu_load_model("gpt3-175b");
    const double part = (double)zp_model_param_count(&m) / 16;
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 16, 1);
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
    plan.zero.offload_param.device = ZP_OFFLOAD_NVME;
    ZpTiers t;
    zp_offload_tiers(&m, &plan, &hw, &t);
    assert_close(t.bytes[ZP_TIER_CPU][ZP_MEM_GRADS], 2 * part + 4 * 1e9);
    assert_close(t.bytes[ZP_TIER_NVME][ZP_MEM_GRADS], 4 * part);
    g_assert_cmpfloat(t.total_bytes[ZP_TIER_CPU] - t.pinned_bytes, >=, 4e9); /* not pinned */
    /* With the optimizer on the CPU each sub-group keeps its own fp32 buffer there. */
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    zp_offload_tiers(&m, &plan, &hw, &t);
    assert_close(t.bytes[ZP_TIER_CPU][ZP_MEM_GRADS], 2 * part + 4 * part);
    json_t *j = tu_zplan_json("maxmodel --cluster dgx2-v100 --gpus 16 --offload-optimizer nvme "
                              "--offload-param nvme --json");
    g_assert_cmpfloat(json_number_value(json_object_get(j, "stage3")), >, 300e9);
    g_assert_cmpstr(json_string_value(json_object_get(json_object_get(j, "limit"), "stage3")), ==,
                    "host");
    json_decref(j);
}

/* Both offloads to NVMe at stage 3 (ZeRO-Infinity), defaults buffer_count 4 (optimizer) and
 * 5 x buffer_size 1e8 (parameters), max_in_cpu 1e9, sub_group_size 1e9, each swap buffer
 * aligned to 1024 bytes (aio's default):
 *   GPU  = 0 model states (gathered units are residual terms)
 *   NVMe = 12P master + moments + 4P fp32 gradients (swap_out_gradients) + 2P parameters
 *        = 18 P per rank
 *   host = 4P fp32 gradients (the paper's engine sums them there; DeepSpeed's keeps one
 *          sub-group's: /offload/nvme-grads-not-on-host) + 4 x min(1e9, P) x 4 optimizer
 *          swap buffers + 2 min(P, 1e9) parameters kept in memory + 5 x 1e8 x 2 swap pool
 *          + zreal's 1 MiB direct I/O buffer and the page that aligns it
 *          + when P > 1e9 (a sub-group left on NVMe) the partitioned_swap_buffer, 2 x the
 *          largest sub-group's full tensors (swap_buffer): about N x 2e9 bytes, since
 *          DeepSpeed sizes it by ds_numel, the whole parameter, not its partition.
 * DeepSpeed's estimate_zero3_model_states_mem_needs(cpu_offload, cpu_offload_params) knows no
 * NVMe; its host figure, 18 psi / nodes x 1.5, is what the same plan puts on the host with
 * device cpu: zplan's 18 P per rank x the node's ranks is 18 psi / nodes exactly, without the
 * 50% buffer factor. Its GPU figure, 4 x the largest layer, is the gathered parameters and
 * their gradient, which zplan counts among the residual terms, not the model states. */
static void test_zero_infinity_nvme(void)
{
    const ZpHw hw = tu_load_hw("dgx2-v100");
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++) {
        const ZpModel m = tu_load_model(models[mi]);
        const double psi = (double)zp_model_param_count(&m), L = largest(&m);
        for (size_t gi = 0; gi < G_N_ELEMENTS(gpu_counts); gi++) {
            const int n = gpu_counts[gi], per_node = MIN(16, n), nodes = (n + 15) / 16;
            ZpPlan plan;
            zp_plan_defaults(&plan, 3, n, 1);
            plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
            plan.zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
            plan.zero.offload_param.device = ZP_OFFLOAD_NVME;
            ZpTiers t;
            zp_offload_tiers(&m, &plan, &hw, &t);
            const double part = psi / n;
            assert_close(t.total_bytes[ZP_TIER_GPU], 0);
            assert_close(t.total_bytes[ZP_TIER_NVME], 18 * part);
            assert_close(t.nvme_node_bytes, per_node * 18 * part);
            const double swap = part > 1e9 ? 2 * swap_buffer(&m, n) : 0;
            assert_close(t.total_bytes[ZP_TIER_CPU],
                         4 * part + 16 * aligned(fmin(1e9, part), 4) + 2 * fmin(part, 1e9) +
                             10 * aligned(1e8, 2) + swap + (1 << 20) + 4096);
            g_assert_true(part <= 1e9 || (swap >= n * 2e9 && swap <= 2.01 * (n * 1e9 + L)));
            /* The same plan with device cpu against DeepSpeed's estimator. */
            plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
            plan.zero.offload_param.device = ZP_OFFLOAD_CPU;
            zp_offload_tiers(&m, &plan, &hw, &t);
            double ds_cpu, ds_gpu;
            zp_offload_ds_estimate_zero3(psi, L, per_node, nodes, TRUE, TRUE, &ds_cpu, &ds_gpu);
            assert_close(t.cpu_node_bytes * 1.5, ds_cpu);
            assert_close(ds_gpu, 4 * L);
            assert_close(t.total_bytes[ZP_TIER_GPU], 0);
            /* Optimizer only: the 16-bit partition stays on the GPU, 16 psi / nodes host. */
            plan.zero.offload_param.device = ZP_OFFLOAD_NONE;
            zp_offload_tiers(&m, &plan, &hw, &t);
            zp_offload_ds_estimate_zero3(psi, L, per_node, nodes, TRUE, FALSE, &ds_cpu, &ds_gpu);
            assert_close(t.cpu_node_bytes * 1.5, ds_cpu);
            assert_close(t.total_bytes[ZP_TIER_GPU], 2 * part);
            assert_close(ds_gpu, 4 * L + floor(2 * psi / n));
        }
    }
}

/* Partial offload (ratio, stage 3) goes by whole sub-groups (stage3.py _create_fp32_partitions):
 * of n = ceil(P / sub_group_size), the first int((1 - ratio) n) stay on the GPU with their
 * optimizer states and gradients, c the share of P left to the CPU. With one sub-group (the
 * default 1e9 at least P) any ratio above 0 offloads everything. */
static void test_ratio(void)
{
    const ZpModel m = tu_load_model("gpt-13b");
    const double psi = (double)zp_model_param_count(&m);
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 8, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    plan.zero.offload_optimizer.ratio = 0.25;
    plan.zero.sub_group_size = 1e8;
    ZpTiers t;
    zp_offload_tiers(&m, &plan, NULL, &t);
    const double part = psi / 8, n = ceil(part / 1e8);
    const double c = (part - (int)(0.75 * n) * 1e8) / part;
    g_assert_cmpfloat(c, >, 0.25);
    g_assert_cmpfloat(c, <, 0.26);
    assert_close(t.total_bytes[ZP_TIER_GPU], 2 * part + (1 - c) * (2 + 12) * part);
    assert_close(t.total_bytes[ZP_TIER_CPU], c * 12 * part + c * 4 * part);
    plan.zero.sub_group_size = 2e9; /* one sub-group of P = 1.6e9 */
    zp_offload_tiers(&m, &plan, NULL, &t);
    assert_close(t.total_bytes[ZP_TIER_GPU], 2 * part);
    assert_close(t.total_bytes[ZP_TIER_CPU], 16 * part);
    g_assert_true(zp_offload_check(&plan, NULL));
    plan.zero.stage = 2;
    GError *error = NULL;
    g_assert_false(zp_offload_check(&plan, &error));
    g_assert_nonnull(strstr(error->message, "offload_optimizer.ratio"));
    g_clear_error(&error);
    plan.zero.offload_optimizer.ratio = 1;
    plan.zero.offload_param.device = ZP_OFFLOAD_CPU;
    g_assert_false(zp_offload_check(&plan, &error));
    g_assert_nonnull(strstr(error->message, "offload_param"));
    g_clear_error(&error);
}

/* gpt3-175b with both offloads to the host on 8 dgx2-v100 GPUs of one node needs 18 psi =
 * 3.2 TB of host memory, over the node's 1.5 TB: refused, naming the tier. */
static void test_cpu_overflow_refused(void)
{
    const ZpModel m = tu_load_model("gpt3-175b");
    const ZpHw hw = tu_load_hw("dgx2-v100");
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 8, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    plan.zero.offload_param.device = ZP_OFFLOAD_CPU;
    ZpTiers t;
    zp_offload_tiers(&m, &plan, &hw, &t);
    GError *error = NULL;
    g_assert_false(zp_offload_fit(&t, 10e9, &hw, &error));
    g_assert_nonnull(strstr(error->message, "CPU memory per node"));
    g_clear_error(&error);
    TuRun r = tu_zplan("simulate --model gpt3-175b --cluster dgx2-v100 --gpus 8 --stage 3 "
                       "--micro-batch 1 --checkpoint --offload-optimizer cpu --offload-param cpu");
    g_assert_true(WIFEXITED(r.status));
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 2);
    g_assert_nonnull(strstr(r.err, "CPU memory per node overflows"));
    g_assert_cmpstr(r.out, ==, "");
    tu_free(&r);
    /* With NVMe the same plan fits the host, and its 3.2 TB fit the node's 30 TB of NVMe
     * (the DGX-2 datasheet's data drives); on the 1.92 TB of its two OS drives alone they
     * would overflow, naming the tier. */
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
    plan.zero.offload_param.device = ZP_OFFLOAD_NVME;
    zp_offload_tiers(&m, &plan, &hw, &t);
    g_assert_true(zp_offload_fit(&t, 10e9, &hw, NULL));
    ZpHw os_drives = hw;
    os_drives.nvme_bytes = 1.92e12;
    g_assert_false(zp_offload_fit(&t, 10e9, &os_drives, &error));
    g_assert_nonnull(strstr(error->message, "NVMe per node"));
    g_clear_error(&error);
}

/* gpt-1t on 512 dgx-a100-80g with both offloads to NVMe: P = 1.95e9 elements make two
 * sub-groups of the default sub_group_size 1e9, the default max_in_cpu 1e9 keeps only the first
 * in host memory, so DeepSpeed pins a partitioned_swap_buffer of the largest sub-group's full
 * parameters (stage3.py _create_fp16_partitions_with_defragmentation ->
 * reserve_partitioned_swap_space): about 512 x 1e9 x 2 B per rank. The refusal says so and
 * names the settings; max_in_cpu of the whole partition keeps both sub-groups and fits. */
static void test_swap_buffer_overflow_named(void)
{
    const char *plan = "simulate --model gpt-1t --cluster dgx-a100-80g --gpus 512 --stage 3 "
                       "--micro-batch 2 --checkpoint --offload-optimizer nvme --offload-param nvme";
    TuRun r = tu_zplan(plan);
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 2);
    g_assert_nonnull(strstr(r.err, "CPU memory per node overflows"));
    g_assert_nonnull(strstr(r.err, "partitioned_swap_buffer"));
    g_assert_nonnull(strstr(r.err, "raise max_in_cpu"));
    g_assert_cmpstr(r.out, ==, "");
    tu_free(&r);
    const ZpModel m = tu_load_model("gpt-1t");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 512, 1);
    p.zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
    p.zero.offload_param.device = ZP_OFFLOAD_NVME;
    const double part = (double)zp_model_param_count(&m) / 512;
    g_assert_cmpfloat(zp_offload_param_swap_buffer_bytes(&m, &p, part), >, 512 * 0.9e9 * 2);
    p.zero.offload_param.max_in_cpu = 2e9;
    g_assert_cmpfloat(zp_offload_param_swap_buffer_bytes(&m, &p, part), ==, 0);
}

/* The schedule's step buffers (workspace allocs of no unit and no micro-step) of the fp32
 * gradient, the partition's elements x 4 bytes here (one sub-group). */
static guint fp32_step_buffers(const ZpModel *m, const ZpPlan *p)
{
    ZpSchedule *s = zp_sched_build(m, p, NULL);
    g_assert_nonnull(s);
    guint n = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        n += op->kind == ZP_OP_ALLOC && op->sub == ZP_MEM_WORKSPACE && op->unit < 0 &&
             op->micro < 0 && op->bytes == (double)s->partition_elems * 4;
    }
    zp_sched_free(s);
    return n;
}

/* DeepSpeed's stage 3 builds the fp32 gradient of a sub-group on the GPU for its step only
 * without optimizer offload (stage3.py _prepare_sub_group: "elif not self.offload_optimizer"):
 * the closed form (`memory`) and the schedule (`simulate`) both leave it out under offload.
 * gpt2-124m on 8 GPUs, bf16. */
static void test_no_step_buffer_under_offload(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan p;
    zp_plan_defaults(&p, 3, 8, 1);
    const double part = (double)zp_model_param_count(&m) / 8;
    ZpResidual r = zp_mem_residual(&m, &p, NULL);
    g_assert_cmpfloat(fabs(r.step_buffer_bytes - part * 4), <=, 8 * 4);
    g_assert_cmpuint(fp32_step_buffers(&m, &p), ==, 1);
    p.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    r = zp_mem_residual(&m, &p, NULL);
    g_assert_cmpfloat(r.step_buffer_bytes, ==, 0);
    g_assert_cmpuint(fp32_step_buffers(&m, &p), ==, 0);
}

/* The schedule moves what the tiers say: every gradient slice down once per micro-step
 * (4 bytes, fp32), the second micro-step's sums back up first, the updated 16-bit partition
 * up after CPU Adam; NVMe states in and out around it. The simulator's breakdown adds up. */
static void test_schedule_transfers(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    const ZpHw hw = tu_load_hw("dgx2-v100");
    ZpPlan plan;
    zp_plan_defaults(&plan, 2, 4, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.grad_accum = 2;
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &plan, &error);
    g_assert_no_error(error);
    const double part = (double)s->partition_elems;
    double moved[ZP_XFER_N] = {0};
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_TRANSFER)
            moved[op->sub] += op->bytes;
    }
    /* Buckets reduce the unpadded space: their slices sum to total/dp per micro-step. */
    const double slices = (double)s->total_elems / plan.dp;
    assert_close(moved[ZP_XFER_D2H], 2 * 4 * slices);
    assert_close(moved[ZP_XFER_H2D], 4 * slices + 2 * part);
    g_assert_cmpfloat(moved[ZP_XFER_NVME_READ] + moved[ZP_XFER_NVME_WRITE], ==, 0);
    assert_close(s->host_bytes[ZP_MEM_MASTER] + s->host_bytes[ZP_MEM_ADAM_M] +
                     s->host_bytes[ZP_MEM_ADAM_V],
                 12 * part);
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_MASTER], ==, 0);
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    SimResult *r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(r->cpu_optimizer_s, >, 0);
    assert_close(r->compute_s + r->exposed_comm_s + r->optimizer_s + r->cpu_optimizer_s +
                     r->offload_transfer_s + r->idle_s,
                 r->step_time_s);
    g_assert_cmpfloat(r->optimizer_s, ==, 0); /* the whole partition steps on the host */
    /* CPU Adam: 30 bytes per element at 5.3e9 x 48 cores / 4 ranks. */
    assert_close(r->stream_busy_s[ZP_STREAM_CPU], 30 * part / (5.3e9 * 48 / 4));
    assert_close(r->offload_bytes[ZP_XFER_D2H], moved[ZP_XFER_D2H]);
    sim_result_free(r);
    /* The schedule file round trip keeps the transfers. */
    char *name = g_strdup_printf("zplan-offload-sched-%d.json", (int)getpid());
    char *path = g_build_filename(g_get_tmp_dir(), name, NULL);
    g_free(name);
    g_assert_true(zp_sched_write_json(s, path, &error));
    ZpSchedule *back = zp_sched_read_json(path, &error);
    g_assert_no_error(error);
    g_assert_cmpuint(back->ops->len, ==, s->ops->len);
    g_assert_cmpint(memcmp(back->ops->data, s->ops->data, s->ops->len * sizeof(ZpOp)), ==, 0);
    g_remove(path);
    g_free(path);
    zp_sched_free(back);
    zp_sched_free(s);

    /* ZeRO-Infinity: the fp32 gradient slices swapped out as their buckets are reduced
     * (4 bytes an element), states and gradients read from NVMe and states and the 16-bit
     * partition written back, the 16-bit partition fetched before every gather (forward and
     * backward). */
    zp_plan_defaults(&plan, 3, 4, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
    plan.zero.offload_param.device = ZP_OFFLOAD_NVME;
    plan.zero.offload_param.max_in_cpu = 0;
    s = zp_sched_build(&m, &plan, &error);
    g_assert_no_error(error);
    memset(moved, 0, sizeof moved);
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_TRANSFER)
            moved[op->sub] += op->bytes;
    }
    const double p3 = (double)s->partition_elems;
    g_assert_cmpfloat(moved[ZP_XFER_NVME_READ], >, (12 + 4) * p3); /* + parameter fetches */
    assert_close(moved[ZP_XFER_NVME_WRITE], 4 * p3 + 12 * p3 + 2 * p3);
    assert_close(moved[ZP_XFER_NVME_READ] - (12 + 4) * p3, moved[ZP_XFER_H2D]);
    r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(r->stream_busy_s[ZP_STREAM_NVME], >, 0);
    /* NVMe is the node's, shared by its 4 ranks: each moves at a quarter of its bytes/s. */
    assert_close(r->stream_busy_s[ZP_STREAM_NVME],
                 (moved[ZP_XFER_NVME_READ] + moved[ZP_XFER_NVME_WRITE]) /
                     (hw.nvme_bytes_per_s / 4));
    sim_result_free(r);
    zp_sched_free(s);

    /* Sub-groups of a third of the partition (rounded up): stage3.py step swaps in, steps and
     * writes back one at a time, so three swap-ins of 16 bytes an element of its sub-group,
     * three CPU Adams of 30 bytes an element, each after the one before, and the same bytes
     * as one sub-group in all. */
    plan.zero.sub_group_size = ceil(p3 / 3);
    s = zp_sched_build(&m, &plan, &error);
    g_assert_no_error(error);
    const double sg = plan.zero.sub_group_size;
    const double sizes[3] = {sg, sg, p3 - 2 * sg};
    int reads = 0, adams = 0;
    uint32_t last_adam = 0;
    double written = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->unit >= 0)
            continue;
        if (op->kind == ZP_OP_TRANSFER && op->sub == ZP_XFER_NVME_READ)
            assert_close(op->bytes, 16 * sizes[reads++]);
        if (op->kind == ZP_OP_TRANSFER && op->sub == ZP_XFER_NVME_WRITE)
            written += op->bytes;
        if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_CPU_OPTIMIZER) {
            assert_close(op->mem_bytes, 30 * sizes[adams]);
            gboolean after = adams == 0;
            for (guint d = 0; d < op->n_deps; d++)
                after = after || zp_sched_deps(s, op)[d] == last_adam;
            g_assert_true(after);
            last_adam = i, adams++;
        }
    }
    g_assert_cmpint(reads, ==, 3);
    g_assert_cmpint(adams, ==, 3);
    assert_close(written, 12 * p3 + 2 * p3);
    zp_sched_free(s);
}

/* DeepSpeed's partial offload at stage 3 (stage3.py): gpt2-124m on 4 ranks in sub-groups of
 * a third of P (rounded up), ratio 0.5: int(0.5 x 3) = 1 sub-group of sg elements stays on
 * the GPU (_create_fp32_partitions: subgroup_to_device) with its fp32 master, moments and
 * gradients (4 bytes each an element); the host holds the other P - sg in fp32 and the whole
 * 16-bit sum (grad_partitions_flat_buffer, on the host whichever device steps). The 16-bit
 * sum goes down and up for all of P; at the boundary only the CPU's sub-groups' P - sg go
 * down in fp32 (_offload_grad_partition_at_boundary), and only they come up after CPU Adam,
 * two of them. The GPU's step has no fp32 step buffer (_prepare_sub_group skips
 * _prepare_fp32_grad_for_sub_group under offload_optimizer). The host's transient 16-bit copy
 * is the largest sub-group the CPU steps: sg, and with ratio 0.3 (int(0.7 x 3) = 2 on the
 * GPU) the last, P - 2 sg. */
static void test_partial_schedule(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 4, 1);
    plan.impl = ZP_IMPL_DEEPSPEED;
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_CPU;
    plan.zero.offload_optimizer.ratio = 0.5;
    ZpSchedule *s = zp_sched_build(&m, &plan, NULL);
    const double p = (double)s->partition_elems, sg = ceil(p / 3);
    zp_sched_free(s);
    plan.zero.sub_group_size = sg;
    GError *error = NULL;
    s = zp_sched_build(&m, &plan, &error);
    g_assert_no_error(error);
    g_assert_cmpfloat(zp_offload_gpu_elems(&plan, p), ==, sg);
    double moved[ZP_XFER_N] = {0}, workspace = 0;
    int adams = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_TRANSFER)
            moved[op->sub] += op->bytes;
        adams += op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_CPU_OPTIMIZER;
        if (op->kind == ZP_OP_ALLOC && op->unit < 0 && op->sub == ZP_MEM_WORKSPACE)
            workspace += op->bytes;
    }
    g_assert_cmpint(adams, ==, 2);
    g_assert_cmpfloat(workspace, ==, 0);
    g_assert_cmpfloat(moved[ZP_XFER_D2H], ==, 2 * p + 4 * (p - sg));
    g_assert_cmpfloat(moved[ZP_XFER_H2D], ==, 2 * p + 2 * (p - sg));
    const ZpMemCategory states[] = {ZP_MEM_MASTER, ZP_MEM_ADAM_M, ZP_MEM_ADAM_V};
    for (size_t i = 0; i < G_N_ELEMENTS(states); i++) {
        g_assert_cmpfloat(s->state_bytes[states[i]], ==, 4 * sg);
        g_assert_cmpfloat(s->host_bytes[states[i]], ==, 4 * (p - sg));
    }
    g_assert_cmpfloat(s->state_bytes[ZP_MEM_GRADS], ==, 4 * sg);
    g_assert_cmpfloat(s->host_bytes[ZP_MEM_GRADS], ==, 4 * (p - sg) + 2 * p);
    double host = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        host += s->host_bytes[c];
    g_assert_cmpfloat(zp_offload_host_peak_bytes(s), ==, host + 2 * sg);
    zp_sched_free(s);
    plan.zero.offload_optimizer.ratio = 0.3;
    s = zp_sched_build(&m, &plan, &error);
    g_assert_no_error(error);
    host = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        host += s->host_bytes[c];
    g_assert_cmpfloat(zp_offload_host_peak_bytes(s), ==, host + 2 * (p - 2 * sg));
    zp_sched_free(s);
    /* offload_param nvme with max_in_cpu of one sub-group keeps [0, sg) on the host
     * (_create_fp16_partitions_with_defragmentation): a slice of 100 from sg - 40 reads its
     * last 60 from NVMe, and all 100 go up; not knowing where it lies, the NVMe share. */
    plan.zero.offload_optimizer.ratio = 1;
    plan.zero.offload_param.device = ZP_OFFLOAD_NVME;
    plan.zero.offload_param.max_in_cpu = sg + 1;
    g_assert_cmpfloat(zp_offload_param_kept_elems(&plan, p), ==, sg);
    double nvme, h2d;
    zp_offload_fetch(&plan, 100, sg - 40, p, &nvme, &h2d);
    g_assert_cmpfloat(nvme, ==, 2 * 60);
    g_assert_cmpfloat(h2d, ==, 2 * 100);
    zp_offload_fetch(&plan, 100, -1, p, &nvme, &h2d);
    assert_close(nvme, 2 * 100 * (p - sg) / p);
}

/* offload_optimizer and offload_param are read, written and read back as they were; the
 * unmodeled pipelining options warn; DeepSpeed's own constraints fail naming the key. */
static void test_dsconfig_round_trip(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan plan;
    zp_plan_defaults(&plan, 3, 8, 1);
    plan.impl = ZP_IMPL_PAPER; /* these figures are the paper's */
    plan.zero.offload_optimizer.device = ZP_OFFLOAD_NVME;
    plan.zero.offload_optimizer.ratio = 0.5;
    plan.zero.offload_optimizer.pin_memory = FALSE;
    g_strlcpy(plan.zero.offload_optimizer.nvme_path, "/local_nvme",
              sizeof plan.zero.offload_optimizer.nvme_path);
    plan.zero.offload_param.device = ZP_OFFLOAD_CPU;
    plan.zero.offload_param.buffer_count = 7;
    plan.zero.offload_param.max_in_cpu = 2e9;
    char *name = g_strdup_printf("zplan-offload-ds-%d.json", (int)getpid());
    char *path = g_build_filename(g_get_tmp_dir(), name, NULL);
    g_free(name);
    GError *error = NULL;
    g_assert_true(zp_dsconfig_write(&plan, path, &error));
    ZpPlan launch, back;
    zp_plan_defaults(&launch, 0, 8, 1);
    int64_t batch;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    g_assert_true(zp_dsconfig_read(path, &m, &launch, &back, &batch, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpuint(warnings->len, ==, 0);
    g_assert_cmpint(memcmp(&back.zero, &plan.zero, sizeof plan.zero), ==, 0);
    /* Plan JSON too (schedule files carry it). */
    json_t *j = zp_plan_to_json(&plan);
    ZpPlan again;
    g_assert_true(zp_plan_from_json(j, "plan", &again, &error));
    json_decref(j);
    g_assert_cmpint(memcmp(&again.zero, &plan.zero, sizeof plan.zero), ==, 0);

    static const struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}",
         "offload_param: needs ZeRO stage 3"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"gpu\"}}}",
         "zero_optimization.offload_optimizer: key \"device\": unknown value 'gpu'"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"ratio\": 2}}}",
         "ratio"},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"speed\": 2}}}",
         "speed"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_assert_true(g_file_set_contents(path, bad[i].json, -1, NULL));
        g_assert_false(zp_dsconfig_read(path, &m, &launch, &back, &batch, warnings, &error));
        g_test_message("%s", error->message);
        g_assert_nonnull(strstr(error->message, bad[i].expect));
        g_clear_error(&error);
    }
    g_assert_true(g_file_set_contents(
        path, "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
              "\"nvme\", \"pipeline_read\": true}}}", -1, NULL));
    g_assert_true(zp_dsconfig_read(path, &m, &launch, &back, &batch, warnings, &error));
    g_assert_cmpuint(warnings->len, ==, 2); /* pipeline_read; nvme without nvme_path */
    g_ptr_array_unref(warnings);
    g_remove(path);
    g_free(path);
}

/* gpt-13b does not fit one 32 GB V100 on the GPU alone; `plan` proposes optimizer offload
 * (the ZeRO-Offload paper's case) and says what it costs; with --offload-* it keeps to
 * that offload. */
static void test_plan_proposes_offload(void)
{
    TuRun r = tu_zplan("plan --model gpt-13b --cluster dgx2-v100 --gpus 1 --top 1");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_true(g_str_has_prefix(r.out, "Fits: plan 1"));
    g_assert_nonnull(strstr(r.out, "Nothing fits on the GPUs alone: plan 1 offloads the "
                                   "optimizer to cpu"));
    g_assert_nonnull(strstr(r.out, "longer than the same plan with everything on the GPU"));
    tu_free(&r);
    r = tu_zplan("memory --model gpt-13b --cluster dgx2-v100 --gpus 1 --checkpoint");
    g_assert_cmpint(WEXITSTATUS(r.status), ==, 2);
    tu_free(&r);
    r = tu_zplan("memory --model gpt-13b --cluster dgx2-v100 --gpus 1 --checkpoint "
                 "--offload-optimizer cpu");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "host memory per node"));
    tu_free(&r);
    r = tu_zplan("plan --model gpt2-124m --cluster dgx2-v100 --gpus 2 --top 1 "
                 "--offload-optimizer cpu --offload-param cpu");
    g_assert_true(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.out, "0 not searched: --offload-param needs stage 3"));
    tu_free(&r);
}

/* --json says what the text says of an offloaded step: the breakdown's "CPU optimizer" and
 * "offload transfer" rows (without them its four keys added up to 1.112 s of gpt-13b's 1.639 s
 * step at stage 2 with the optimizer on the CPU), and the host link, CPU Adam and host memory
 * of the text's offload lines. */
static void test_json_breakdown(void)
{
    static const char *const plans[] = {
        "--model gpt-13b --cluster dgx-a100-80g --gpus 16 --stage 2 --micro-batch 2 "
        "--offload-optimizer cpu",
        "--model gpt-13b --cluster dgx-a100-80g --gpus 16 --stage 3 --micro-batch 1 "
        "--offload-optimizer nvme --offload-param nvme",
    };
    for (size_t i = 0; i < G_N_ELEMENTS(plans); i++) {
        char *args = g_strdup_printf("simulate %s --json", plans[i]);
        json_t *j = tu_zplan_json(args);
        json_t *b = json_object_get(j, "breakdown");
        const double step = json_number_value(json_object_get(j, "step_time_s"));
        double sum = 0;
        const char *key;
        json_t *value;
        json_object_foreach(b, key, value)
            sum += json_number_value(value);
        g_test_message("%s: breakdown %.9f s of %.9f s", plans[i], sum, step);
        g_assert_cmpfloat(fabs(sum - step), <=, 1e-9 * step);
        g_assert_cmpfloat(json_number_value(json_object_get(b, "cpu_optimizer_s")), >, 0);
        g_free(args);
        args = g_strdup_printf("simulate %s", plans[i]);
        TuRun r = tu_zplan(args);
        g_assert_true(g_spawn_check_wait_status(r.status, NULL));
        json_t *o = json_object_get(j, "offload");
        char *cpu = g_strdup_printf("    CPU optimizer                %10.4f",
                                    json_number_value(json_object_get(b, "cpu_optimizer_s")));
        char *xfer = g_strdup_printf("    offload transfer             %10.4f",
                                     json_number_value(json_object_get(b, "offload_transfer_s")));
        char *link = g_strdup_printf("  host link %.4f s busy (%.3f GB down, %.3f GB up)",
                                     json_number_value(json_object_get(o, "host_link_busy_s")),
                                     json_number_value(json_object_get(o, "d2h_bytes")) / 1e9,
                                     json_number_value(json_object_get(o, "h2d_bytes")) / 1e9);
        char *host = g_strdup_printf("host memory %.3f GB per rank",
                                     json_number_value(json_object_get(o, "host_bytes_per_rank")) /
                                         1e9);
        g_assert_nonnull(strstr(r.out, cpu));
        g_assert_nonnull(strstr(r.out, xfer));
        g_assert_nonnull(strstr(r.out, link));
        g_assert_nonnull(strstr(r.out, host));
        tu_free(&r);
        g_free(cpu), g_free(xfer), g_free(link), g_free(host), g_free(args);
        json_decref(j);
    }
}

/* zp_impl_tensor_part_at (where a tensor begins in a rank's stage-3 partition, each tensor
 * before it padded to dp) by the build's memo, a binary search over its sums, is the scan of
 * every tensor it replaced, at each tensor's offset, one past it and the ends: gpt-13b and
 * llama-2-7b at dp 6 and 16 (padding each tensor). */
static void test_tensor_part_at(void)
{
    static const char *const models[] = {"gpt-13b", "hf/llama-2-7b"};
    static const int dps[] = {6, 16};
    for (size_t mi = 0; mi < G_N_ELEMENTS(models); mi++)
        for (size_t di = 0; di < G_N_ELEMENTS(dps); di++) {
            const ZpModel m = tu_load_model(models[mi]);
            ZpPlan plan;
            zp_plan_defaults(&plan, 3, dps[di], 1);
            ZpSchedule *s = zp_sched_build(&m, &plan, NULL);
            g_assert_nonnull(s);
            g_assert_null(s->memo); /* the build's own: dropped at its end */
            GArray *tensors = zp_impl_tensors(s);
            g_assert_cmpuint(tensors->len, >, 100);
            GArray *at = g_array_new(FALSE, FALSE, sizeof(uint64_t));
            const uint64_t ends[] = {0, 1, s->total_elems, s->total_elems + 1, G_MAXUINT64};
            g_array_append_vals(at, ends, G_N_ELEMENTS(ends));
            for (guint i = 0; i < tensors->len; i++) {
                const uint64_t o = g_array_index(tensors, ZpImplTensor, i).offset;
                g_array_append_val(at, o);
                const uint64_t next = o + 1;
                g_array_append_val(at, next);
            }
            double *scanned = g_new(double, at->len);
            for (guint k = 0; k < at->len; k++)
                scanned[k] = zp_impl_tensor_part_at(s, g_array_index(at, uint64_t, k));
            s->memo = g_new0(ZpSchedMemo, 1);
            for (guint k = 0; k < at->len; k++)
                g_assert_cmpfloat(zp_impl_tensor_part_at(s, g_array_index(at, uint64_t, k)), ==,
                                  scanned[k]);
            g_assert_nonnull(s->memo->part_before); /* the memo's index answered */
            g_assert_cmpfloat(scanned[0], ==, 0);
            g_assert_cmpfloat(scanned[2], >, 0);
            zp_sched_memo_free(s);
            g_free(scanned);
            g_array_unref(at);
            g_array_unref(tensors);
            zp_sched_free(s);
        }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/offload/zero_offload_cpu", test_zero_offload_cpu);
    g_test_add_func("/offload/tensor-part-at", test_tensor_part_at);
    g_test_add_func("/offload/zero_infinity_nvme", test_zero_infinity_nvme);
    g_test_add_func("/offload/nvme-grads-not-on-host", test_nvme_grads_not_on_host);
    g_test_add_func("/offload/ratio", test_ratio);
    g_test_add_func("/offload/cpu_overflow_refused", test_cpu_overflow_refused);
    g_test_add_func("/offload/swap-buffer-overflow-named", test_swap_buffer_overflow_named);
    g_test_add_func("/offload/no-step-buffer-under-offload", test_no_step_buffer_under_offload);
    g_test_add_func("/offload/schedule_transfers", test_schedule_transfers);
    g_test_add_func("/offload/partial_schedule", test_partial_schedule);
    g_test_add_func("/offload/dsconfig_round_trip", test_dsconfig_round_trip);
    g_test_add_func("/offload/plan_proposes_offload", test_plan_proposes_offload);
    g_test_add_func("/offload/json-breakdown", test_json_breakdown);
    return g_test_run();
}
