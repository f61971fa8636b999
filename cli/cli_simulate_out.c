/* cli_simulate_out: `zplan simulate`'s output of one step: the text report, the JSON, the
 * offload tiers and the HTML page, from the plan, its schedule and the simulator's result. */
#include "cli_simulate_out.h"
#include "cli_pipe.h"
#include "cli_report.h"
#include "zp_cost.h"
#include "zp_zeror.h"
#include "zp_offload.h"
#include "zp_outpath.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define GB 1e9

static void print_tiers(const CliSimReport *p);

/* Tokens one optimizer step trains: samples x sequence. */
static double tokens_per_step(const CliSimReport *p)
{
    return (double)p->plan->dp * p->plan->micro_batch * p->plan->grad_accum *
           (double)p->model->seq_len;
}


/* A rank's compute by kernel class: each kind's ops (zp_sched_compute_ops: the step's, over a
 * pipeline's stages; divided by the stages, a stage's mean) times its kernels' time by class,
 * the optimizer at the rank's elements; NULL unless the profile's kernel_rates cost the plan's
 * inventory. Interference with collectives is not in it (the breakdown's compute_s has it). */
static json_t *compute_by_class_json(const CliSimReport *p)
{
    /* The schedule's plan (normalized by the builder) with the step's micro-steps: a schedule
     * built short (cli_simulate.c simulate_short) has fewer, and the ops counted are the
     * step's. */
    ZpPlan plan = p->sched->plan;
    plan.grad_accum = p->plan->grad_accum;
    ZpCost c;
    if (!zp_model_has_architecture(p->model) ||
        !zp_cost_init(&c, p->hw, p->model, &plan, NULL) || !c.inventory)
        return NULL;
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(p->model, &plan, ops);
    double by_class[ZP_KCLASS_INVENTORY_N] = {0}, host = 0, launches = 0;
    for (int k = 0; k < ZP_COMP_N; k++) {
        const double n = k == ZP_COMP_OPTIMIZER ? (c.optimizer_elems > 0)
                                                : (double)ops[k].count / zp_plan_pp(&plan);
        for (int cls = 0; cls < ZP_KCLASS_INVENTORY_N; cls++)
            by_class[cls] += n * c.class_s[k][cls];
        host += n * c.host_s[k];
        launches += n * c.launches[k];
    }
    json_t *o = json_pack("{s:s}", "inventory", c.inv->name);
    for (int cls = 0; cls < ZP_KCLASS_COLLECTIVE; cls++) {
        char key[32];
        g_snprintf(key, sizeof key, "%s_s", zp_kclass_name((ZpKClass)cls));
        json_object_set_new(o, key, json_real(by_class[cls]));
    }
    json_object_set_new(o, "host_issue_s", json_real(host));
    json_object_set_new(o, "launches", json_real(launches));
    return o;
}


static double samples_per_s(const CliSimReport *p)
{
    return (double)p->plan->dp * p->plan->micro_batch * p->plan->grad_accum / p->r->step_time_s;
}

static double flops_per_gpu(const CliSimReport *p)
{
    return p->r->model_flops / p->r->step_time_s;
}

/* Bytes over the GPU's memory at the peak, counting the profile's CUDA-context reserve
 * (not a schedule buffer); zero or less when the step fits. The need is the allocator's
 * (zp_alloc_replay_needed_bytes), as every command judges it. */
double cli_simulate_bytes_over(const CliSimReport *p)
{
    const double capacity = p->hw->gpu_memory_bytes - p->hw->runtime_reserve_bytes;
    return zp_alloc_replay_needed_bytes(&p->alloc, p->r->peak_memory_bytes, capacity) - capacity;
}

static json_t *alloc_json(const ZpAllocStats *a)
{
    json_t *o = json_pack("{s:f, s:f, s:f, s:f, s:b, s:b}", "peak_allocated_bytes",
                          a->peak_allocated_bytes, "peak_reserved_bytes", a->peak_reserved_bytes,
                          "reserved_at_peak_bytes", a->reserved_at_peak_bytes,
                          "largest_free_at_peak_bytes", a->largest_free_at_peak_bytes, "oom",
                          a->oom, "oom_fragmented", a->oom_fragmented);
    if (a->oom)
        json_object_set_new(o, "oom_at", json_pack("{s:f, s:f, s:f, s:f}", "request_bytes",
                                                   a->oom_request_bytes, "allocated_bytes",
                                                   a->oom_allocated_bytes, "reserved_bytes",
                                                   a->oom_reserved_bytes, "largest_free_bytes",
                                                   a->oom_largest_free_bytes));
    return o;
}

/* Predicted seconds per step and op count by op type ("block_fwd", "allgather", ...) of the
 * reported rank: the figures `zplan validate` sets against zreal's. */
static json_t *ops_json(const CliSimReport *p)
{
    const SimResult *r = p->r;
    double seconds[SIM_OP_TYPES] = {0}, count[SIM_OP_TYPES] = {0};
    if (r->op_types_exact) {
        /* Summed by the engine as the ops ended: exact on the clock's grid, so the very bits
         * of the sum below (test_sim_scale /sim/scale/op-types). */
        memcpy(seconds, r->op_type_s, sizeof seconds);
        memcpy(count, r->op_type_count, sizeof count);
    } else {
        /* A step past the grid's end: the reported rank's timeline, which cli_simulate.c kept
         * for it (sim_trace_run), summed in op order. */
        size_t base = 0;
        const gboolean kept = sim_result_timeline_row(r, (uint32_t)r->report_rank, &base);
        g_assert(kept);
        const uint32_t stage =
            sim_result_rank_stage(r, (uint32_t)r->report_rank, p->plan->mp);
        for (uint32_t i = 0; i < r->n_ops; i++) {
            const ZpOp *op = zp_sched_op(p->sched, i);
            if ((op->kind != ZP_OP_COMPUTE && op->kind != ZP_OP_COLLECTIVE) ||
                op->stage != stage)
                continue;
            const int type = op->kind == ZP_OP_COMPUTE ? op->sub : ZP_COMP_N + op->sub;
            seconds[type] += r->op_end_s[base + i] - r->op_start_s[base + i];
            count[type] += 1;
        }
    }
    json_t *o = json_object();
    for (int k = 0; k < SIM_OP_TYPES; k++)
        if (count[k] > 0)
            json_object_set_new(o, k < ZP_COMP_N ? zp_sched_compute_name(k)
                                                 : zp_sched_coll_name(k - ZP_COMP_N),
                                json_pack("{s:f, s:f}", "count", count[k], "total_s", seconds[k]));
    return o;
}

/* Whether the steady state was advanced by whole periods (sim_fold.h; --no-fold), in a line:
 * the step's micro-steps of every stage not stepped one by one and in how many jumps, and how
 * many of them the schedule run did not even hold (built that many short, cli_simulate.c
 * simulate_short, and counted by the fold as virtual periods: SimResult.extended_micro_steps;
 * 0 where the step's own schedule ran). The engine's note speaks of the schedule it ran, so a
 * short one's is said here of the step. The caller frees it. */
static char *fold_note(const SimResult *r)
{
    const uint32_t virt = r->extended_micro_steps;
    if (virt == 0)
        return g_strdup(r->fold_note);
    return g_strdup_printf("folded: %u micro-steps of every stage skipped in %u jump%s, %u of "
                           "them virtual (the schedule built that many micro-steps short)",
                           r->fold_micro_steps + virt, r->fold_jumps,
                           r->fold_jumps == 1 ? "" : "s", virt);
}

/* The fold as JSON: micro_steps (virtual ones included), jumps, virtual_micro_steps and the
 * note (fold_note). */
static json_t *fold_json(const SimResult *r)
{
    const uint32_t virt = r->extended_micro_steps;
    char *note = fold_note(r);
    json_t *o = json_pack("{s:I, s:I, s:I, s:s}", "micro_steps",
                          (json_int_t)r->fold_micro_steps + virt, "jumps",
                          (json_int_t)r->fold_jumps, "virtual_micro_steps", (json_int_t)virt,
                          "note", note);
    g_free(note);
    return o;
}

/* The offload tiers and traffic the text's host-link and "offload:" lines print: the reported
 * rank's host link, NVMe and CPU optimizer busy, the bytes they moved, and the host memory and
 * NVMe a rank and a node hold. */
static json_t *offload_json(const CliSimReport *p)
{
    const SimResult *r = p->r;
    const ZpSchedule *s = p->sched;
    double host = 0, nvme = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        host += s->host_bytes[c], nvme += s->nvme_bytes[c];
    const int per_node = MIN(p->hw->gpus_per_node, s->world);
    return json_pack("{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                     "optimizer", zp_offload_device_name(p->plan->zero.offload_optimizer.device),
                     "parameters", zp_offload_device_name(p->plan->zero.offload_param.device),
                     "host_link_busy_s", r->stream_busy_s[ZP_STREAM_HOST],
                     "d2h_bytes", r->offload_bytes[ZP_XFER_D2H],
                     "h2d_bytes", r->offload_bytes[ZP_XFER_H2D],
                     "nvme_busy_s", r->stream_busy_s[ZP_STREAM_NVME],
                     "nvme_read_bytes", r->offload_bytes[ZP_XFER_NVME_READ],
                     "nvme_written_bytes", r->offload_bytes[ZP_XFER_NVME_WRITE],
                     "cpu_optimizer_busy_s", r->stream_busy_s[ZP_STREAM_CPU],
                     "host_bytes_per_rank", host, "host_bytes_per_node", per_node * host,
                     "checkpoint_host_bytes", s->host_bytes[ZP_MEM_CHECKPOINTS],
                     "nvme_bytes_per_rank", nvme, "nvme_bytes_per_node", per_node * nvme);
}

/* Every field is the step's own also where the schedule was built short (cli_simulate.c
 * simulate_short), field by field: the SimResult's figures (step time, breakdown, FLOPs,
 * bytes by group and stage, peaks and categories, the op sums, the pipeline's stages and
 * flush) are the long schedule's where the fold counted every missing micro-step
 * (SimResult.extended_micro_steps; tests/test_sim_extend.c), the event counts aside, which
 * count the virtual periods' events as if run; "ops" are the engine's sums (op_types_exact:
 * simulate_short keeps no run whose sums are not, so ops_json never walks the short
 * schedule's ops); the allocator's figures are the long
 * schedule's replay (zp_alloc_replay_schedule_extended); the plan, model, budget, slowdowns
 * and constant buffers come from the step's plan; of the schedule, only what its length does
 * not change: its world, its groups (from the degrees), backend_workspace (the plan's),
 * model_state_bytes (the layout's per-parameter states) and compute_by_class (from its plan,
 * with the step's micro-steps); the fold report says what was done (fold_json). */
int cli_simulate_print_json(const CliSimReport *p)
{
    const SimResult *r = p->r;
    json_t *root = json_pack(
        "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f,"
        " s:{s:f, s:f, s:f}, s:f, s:o, s:f, s:b, s:{s:f, s:f, s:f, s:f}, s:{s:f, s:f, s:f},"
        " s:i, s:i, s:s, s:I, s:I}",
        "model", p->model->name, "cluster", p->hw->name, "stage", p->plan->zero.stage,
        "gpus", p->sched->world, "dp", p->plan->dp, "mp", p->plan->mp, "micro_batch",
        p->plan->micro_batch, "grad_accum", p->plan->grad_accum, "step_time_s", r->step_time_s,
        "samples_per_s", samples_per_s(p), "tflops_per_gpu", flops_per_gpu(p) / 1e12, "mfu",
        flops_per_gpu(p) / p->peak_flops, "model_flops_per_gpu", r->model_flops,
        "recompute_flops_per_gpu", r->recompute_flops, "comm_bytes_per_rank", "dp",
        cli_dp_bytes(r->comm_bytes), "tp", r->comm_bytes[ZP_GROUP_TP], "pp",
        r->comm_bytes[ZP_GROUP_PP], "peak_memory_bytes",
        r->peak_memory_bytes, "peak_breakdown", zp_sched_categories_json(r->peak_breakdown_bytes),
        "peak_model_state_bytes", r->peak_model_state_bytes, "fits_in_gpu_memory",
        cli_simulate_bytes_over(p) <= 0, "breakdown", "compute_s",
        r->compute_s, "exposed_comm_s", r->exposed_comm_s, "optimizer_s", r->optimizer_s,
        "idle_s", r->idle_s, "stream_busy_s", "compute", r->stream_busy_s[ZP_STREAM_COMPUTE],
        "dp", r->stream_busy_s[ZP_STREAM_DP], "tp", r->stream_busy_s[ZP_STREAM_TP],
        "ranks_simulated", r->ranks_simulated, "report_rank",
        (int)zp_plan_placed_rank(p->plan, r->first_rank[r->report_rank]), "mode",
        sim_mode_name(r->mode), "op_events", (json_int_t)r->op_events, "heap_events",
        (json_int_t)r->heap_events);
    if (zp_offload_any(p->plan)) { /* the text's two rows more: the six add up to the step */
        json_t *breakdown = json_object_get(root, "breakdown");
        json_object_set_new(breakdown, "cpu_optimizer_s", json_real(r->cpu_optimizer_s));
        json_object_set_new(breakdown, "offload_transfer_s", json_real(r->offload_transfer_s));
    }
    json_object_set_new(root, "category_peak_bytes", zp_sched_categories_json(r->category_peak_bytes));
    json_object_set_new(root, "fold", fold_json(r));
    /* A schedule file's other communicators (a world group, node groups): their bytes too. */
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(p->sched, groups);
    json_t *comm = json_object_get(root, "comm_bytes_per_rank");
    for (int g = ZP_GROUP_N; g < n_groups; g++)
        json_object_set_new(comm, groups[g].name, json_real(r->comm_bytes[g]));
    if (zp_moe_enabled(&p->model->moe)) { /* expert parallelism's groups and all-to-all */
        json_object_set_new(comm, "ep", json_real(r->comm_bytes[ZP_GROUP_EP]));
        json_object_set_new(comm, "edp", json_real(r->comm_bytes[ZP_GROUP_EDP]));
        if (p->plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
            json_object_set_new(comm, "tpep", json_real(r->comm_bytes[ZP_GROUP_TPEP]));
            json_object_set_new(root, "moe_dispatcher",
                                json_string(zp_dispatcher_name(p->plan->experts.dispatcher)));
        }
        /* the dispatcher's collectives: the all-to-alls, or the all-gather dispatcher's */
        const double a2a = r->alltoall_s;
        json_object_set_new(root, "alltoall_s", json_real(a2a));
        json_object_set_new(root, "alltoall_share", json_real(a2a / r->step_time_s));
    }
    json_object_set_new(root, "cost_model", json_string(r->cost_model));
    json_t *by_class = compute_by_class_json(p);
    if (by_class)
        json_object_set_new(root, "compute_by_class", by_class);
    if (p->defaults_taken) {
        json_t *taken = json_array();
        for (guint i = 0; i < p->defaults_taken->len; i++)
            json_array_append_new(taken, json_string(g_ptr_array_index(p->defaults_taken, i)));
        json_object_set_new(root, "defaults_taken", taken);
    }
    json_object_set_new(root, "collective_model", json_string(r->collective_model));
    if (zp_offload_any(p->plan) || p->sched->host_bytes[ZP_MEM_CHECKPOINTS] > 0)
        json_object_set_new(root, "offload", offload_json(p));
    /* Whether zreal's CPU backend workspace is listed (zplan validate notes when not). */
    json_object_set_new(root, "backend_workspace", json_boolean(p->sched->plan.backend_workspace));
    json_object_set_new(root, "model_state_bytes",
                        json_real(zp_sched_model_state_bytes(p->sched)));
    json_object_set_new(root, "ops", ops_json(p));
    json_object_set_new(root, "caching_allocator", alloc_json(&p->alloc));
    if (zp_model_has_architecture(p->model)) { /* a graph without a model has no buckets */
        const ZpConstantBuffers cb = zp_zeror_constant_buffers(p->model, p->plan);
        json_object_set_new(root, "constant_buffers",
                            json_pack("{s:f, s:f, s:s?}", "constant_bytes", cb.constant_bytes,
                                      "model_sized_bytes", cb.model_sized_bytes,
                                      "model_sized_what", cb.model_sized_what));
    }
    json_object_set_new(root, "zeropp_comm_bytes_per_rank",
                        json_pack("{s:f, s:f, s:f, s:f}", "dp_group", r->comm_bytes[ZP_GROUP_DP],
                                  "hpz", r->comm_bytes[ZP_GROUP_HPZ], "node",
                                  r->comm_bytes[ZP_GROUP_NODE], "xnode",
                                  r->comm_bytes[ZP_GROUP_XNODE]));
    json_t *slow[2] = {json_array(), json_array()};
    for (uint32_t k = 0; k < p->options->n_slow_ranks; k++)
        json_array_append_new(slow[0], json_pack("[i, f]", (int)p->options->slow_ranks[k].index,
                                                 p->options->slow_ranks[k].factor));
    for (uint32_t k = 0; k < p->options->n_slow_nodes; k++)
        json_array_append_new(slow[1], json_pack("[i, f]", (int)p->options->slow_nodes[k].index,
                                                 p->options->slow_nodes[k].factor));
    json_object_set_new(root, "slow_ranks", slow[0]);
    json_object_set_new(root, "slow_links", slow[1]);
    json_object_set_new(root, "plan", zp_plan_to_json(p->plan));
    cli_pipe_json(root, p->plan, r);
    json_t *budget = cli_budget_json(p->budget, r->step_time_s, tokens_per_step(p),
                                     p->sched->world);
    if (budget)
        json_object_set_new(root, "budget", budget);
    json_object_set_new(root, "notes", cli_notes_json());
    /* the figure the verdict gives and memory's need_bytes: the allocator's need + reserve */
    json_object_set_new(root, "need_bytes", json_real(p->hw->gpu_memory_bytes + cli_simulate_bytes_over(p)));
    GError *error = NULL;
    const gboolean ok = zp_json_write(root, NULL, &error);
    json_decref(root);
    return ok ? 0 : cli_fail("simulate", error);
}

static void print_breakdown(const CliSimReport *p)
{
    const SimResult *r = p->r;
    const struct {
        const char *label;
        double seconds;
    } rows[] = {
        {"compute", r->compute_s},
        {"exposed communication", r->exposed_comm_s},
        {"optimizer", r->optimizer_s},
        {"CPU optimizer", r->cpu_optimizer_s},
        {"offload transfer", r->offload_transfer_s},
        {"idle", r->idle_s},
    };
    printf("\n  breakdown of the step (rank %u)   seconds    share\n", /* the world's number */
           (unsigned)zp_plan_placed_rank(p->plan, r->first_rank[r->report_rank]));
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++)
        if (i < 3 || i == G_N_ELEMENTS(rows) - 1 || zp_offload_any(p->plan))
            printf("    %-28s %10.4f %7.1f%%\n", rows[i].label, rows[i].seconds,
                   100.0 * rows[i].seconds / r->step_time_s);
    if (zp_offload_any(p->plan))
        printf("  host link %.4f s busy (%.3f GB down, %.3f GB up), NVMe %.4f s busy (%.3f GB "
               "read, %.3f GB written), CPU Adam %.4f s\n",
               r->stream_busy_s[ZP_STREAM_HOST], r->offload_bytes[ZP_XFER_D2H] / GB,
               r->offload_bytes[ZP_XFER_H2D] / GB, r->stream_busy_s[ZP_STREAM_NVME],
               r->offload_bytes[ZP_XFER_NVME_READ] / GB, r->offload_bytes[ZP_XFER_NVME_WRITE] / GB,
               r->stream_busy_s[ZP_STREAM_CPU]);
    printf("  streams busy: compute %.4f s, dp-comm %.4f s, tp-comm %.4f s\n",
           r->stream_busy_s[ZP_STREAM_COMPUTE], r->stream_busy_s[ZP_STREAM_DP],
           r->stream_busy_s[ZP_STREAM_TP]);
}

static void print_memory(const CliSimReport *p)
{
    const SimResult *r = p->r;
    char *capacity = cli_capacity(p->hw->gpu_memory_bytes);
    printf("\n  peak memory per rank           %10.3f GB (of %s), live at the peak:\n",
           r->peak_memory_bytes / GB, capacity);
    g_free(capacity);
    for (int c = 0; c < ZP_MEM_N; c++)
        if (r->peak_breakdown_bytes[c] > 0)
            printf("    %-28s %10.3f GB\n", zp_sched_mem_name(c), r->peak_breakdown_bytes[c] / GB);
    if (zp_model_has_architecture(p->model)) {
        const ZpConstantBuffers cb = zp_zeror_constant_buffers(p->model, p->plan);
        printf("  constant buffers (CB)          %10.3f GB of fixed-size buckets",
               cb.constant_bytes / GB);
        if (cb.model_sized_what)
            printf("; %.3f GB sized by the model (%s)", cb.model_sized_bytes / GB,
                   cb.model_sized_what);
        printf("\n");
    }
    const ZpAllocStats *a = &p->alloc;
    printf("  caching allocator (replay)     %10.3f GB allocated, %.3f GB reserved at that "
           "peak (largest free block %.3f GB); reserved peaks at %.3f GB\n",
           a->peak_allocated_bytes / GB, a->reserved_at_peak_bytes / GB,
           a->largest_free_at_peak_bytes / GB, a->peak_reserved_bytes / GB);
    if (a->oom)
        printf("  out of memory%s: a %.3f GB request with %.3f GB allocated and %.3f GB "
               "reserved; the largest free block is %.3f GB\n",
               a->oom_fragmented ? " from fragmentation" : "", a->oom_request_bytes / GB,
               a->oom_allocated_bytes / GB, a->oom_reserved_bytes / GB,
               a->oom_largest_free_bytes / GB);
    printf("  (model states peak at %.3f GB; the CUDA context and allocator reserve of %.1f GB "
           "come on top)\n",
           r->peak_model_state_bytes / GB, p->hw->runtime_reserve_bytes / GB);
}

/* A count as DeepSpeed's configs write it: "5e7", "2.3e8". */
static char *elems_text(double count)
{
    if (count < 1)
        return g_strdup_printf("%g", count);
    const int exponent = (int)floor(log10(count));
    return g_strdup_printf("%.2ge%d", count / pow(10, exponent), exponent);
}

/* Why a step that is mostly exposed communication is so, in one line: the first diagnosis
 * whose condition holds. */
static void print_exposed_reason(const CliSimReport *p)
{
    const SimResult *r = p->r;
    const ZpPlan *plan = p->plan;
    if (r->exposed_comm_s <= 0.5 * r->step_time_s)
        return;
    const double block_elems = p->sched->n_units > 2 ? (double)p->sched->unit_elems[1] : 0;
    char *why;
    if (plan->zero.stage == 3 && plan->zero.stage3_prefetch_bucket_size < block_elems) {
        char *prefetch = elems_text(plan->zero.stage3_prefetch_bucket_size);
        char *block = elems_text(block_elems);
        why = g_strdup_printf("stage-3 gathers are not prefetched: stage3_prefetch_bucket_size "
                              "%s is smaller than one block (%s elements)", prefetch, block);
        g_free(prefetch);
        g_free(block);
    } else if (!plan->zero.overlap_comm && plan->dp > 1)
        why = g_strdup("overlap_comm is off: the gradient reduction waits for the backward "
                       "pass instead of running beside it");
    else if (r->stream_busy_s[ZP_STREAM_TP] > r->stream_busy_s[ZP_STREAM_DP])
        why = g_strdup_printf("the tensor-parallel all-reduces (%.3f s) sit between compute "
                              "ops and cannot be hidden: use a smaller --mp",
                              r->stream_busy_s[ZP_STREAM_TP]);
    else
        why = g_strdup_printf("the data-parallel collectives (%.3f s) take longer than the "
                              "compute they could hide behind (%.3f s): a larger micro-batch or "
                              "more accumulation amortises them",
                              r->stream_busy_s[ZP_STREAM_DP], r->stream_busy_s[ZP_STREAM_COMPUTE]);
    printf("Mostly exposed communication (%.0f%% of the step): %s.\n",
           100 * r->exposed_comm_s / r->step_time_s, why);
    g_free(why);
}

/* --html: the page of this step (cli_report), titled by the plan, opening with the verdict. */
gboolean cli_simulate_write_html(const CliSimReport *p, const char *path, GError **error)
{
    char *detail = g_strdup_printf("allocator-reserved peak + %.1f GB reserve",
                                   p->hw->runtime_reserve_bytes / GB);
    char *verdict = cli_verdict("the step", detail, p->hw->gpu_memory_bytes + cli_simulate_bytes_over(p),
                                p->hw->gpu_memory_bytes);
    const int pp = zp_plan_pp(p->plan);
    char *stages = pp > 1 ? g_strdup_printf(" x PP %d", pp) : g_strdup("");
    char *title = g_strdup_printf("%s on %d x %s (%s): ZeRO stage %d, DP %d x MP %d%s, "
                                  "micro-batch %d x %d, %.4f s a step", p->model->name,
                                  p->sched->world, p->hw->gpu, p->hw->name,
                                  p->plan->zero.stage, p->plan->dp, p->plan->mp, stages,
                                  p->plan->micro_batch, p->plan->grad_accum, p->r->step_time_s);
    g_free(stages);
    const gboolean ok = cli_report_html(path, title, verdict, p->sched, p->r, p->hw, error);
    g_free(title), g_free(verdict), g_free(detail);
    return ok;
}

/* As for the JSON (cli_simulate_print_json), every line is the step's own also where the
 * schedule was built short (cli_simulate.c simulate_short): the SimResult's figures (the
 * verdict's peak, throughput, breakdown, streams, bytes by group and stage, peaks, the
 * pipeline's stages and flush, the event counts) are the long schedule's, the allocator's the
 * long schedule's replay; the plan, model, budget and constant buffers are the step's; of the
 * schedule only its world, its groups and its units (the exposed-communication line's block
 * size), which its length does not change. The lines that read more of it are not printed
 * there: the --schedule line (a file's schedule is run as it is) and the offload tiers (its
 * host and NVMe bytes; no short schedule where anything is offloaded). The fold line says how
 * many micro-steps were virtual (fold_note); /sim/fold/text-short compares the rest with
 * --no-fold's. */
void cli_simulate_print_human(const CliSimReport *p)
{
    const SimResult *r = p->r;
    const ZpPlan *plan = p->plan;
    char *detail = g_strdup_printf("allocator-reserved peak + %.1f GB reserve%s",
                                   p->hw->runtime_reserve_bytes / GB,
                                   p->alloc.oom_fragmented ? "; out of memory from fragmentation"
                                                           : "");
    char *verdict = cli_verdict("the step", detail,
                                p->hw->gpu_memory_bytes + cli_simulate_bytes_over(p),
                                p->hw->gpu_memory_bytes);
    printf("%s\n", verdict);
    g_free(verdict);
    g_free(detail);
    print_exposed_reason(p);
    cli_print_defaults();
    char *pipe_text = zp_plan_pp(plan) > 1
                          ? g_strdup_printf(" x PP %d (%s, %d chunk(s) a stage, %s partition)",
                                            zp_plan_pp(plan),
                                            zp_pipe_schedule_name(plan->pipe.schedule),
                                            zp_plan_vstages(plan),
                                            zp_partition_name(plan->pipe.partition))
                          : g_strdup("");
    if (p->schedule_path)
        printf("Simulated the schedule %s (%u ops a rank, %s) on %d x %s (%s): DP %d x MP %d.\n",
               p->schedule_path, p->sched->ops->len, zp_precision_name(plan->precision),
               p->sched->world, p->hw->gpu, p->hw->name, plan->dp, plan->mp);
    else
        printf("Simulated one step of %s on %d x %s (%s): ZeRO stage %d, DP %d x MP %d%s%s, "
               "micro-batch %d x %d accumulation step(s),\n%s %s, overlap_comm %s, %s.\n",
               p->model->name, p->sched->world, p->hw->gpu, p->hw->name, plan->zero.stage,
               plan->dp, plan->mp, pipe_text, plan->sequence_parallel ? " (sequence parallel)" : "",
               plan->micro_batch, plan->grad_accum,
               zp_precision_name(plan->precision), zp_optimizer_name(plan->optimizer),
               plan->zero.overlap_comm ? "on" : "off",
               plan->checkpoint ? "activation checkpointing" : "no activation checkpointing");
    g_free(pipe_text);
    cli_pipe_print_placement(plan, p->hw);
    printf("Compute costed by: %s.\n", r->cost_model);
    if (r->collective_model[0])
        printf("Collectives costed by: %s.\n", r->collective_model);
    if (r->mode == SIM_MODE_FOLDED && r->ranks_simulated > MAX(r->stages, 1))
        printf("Ranks: folded - %d simulated ranks stand for the %d, one for each class of "
               "alike ranks (the slowed ranks and those that wait for them differently are "
               "classes of their own); --explicit simulates every rank, with the same "
               "results.\n\n",
               r->ranks_simulated, r->world);
    else if (r->mode == SIM_MODE_FOLDED)
        printf("Ranks: folded - one simulated rank stands for each class of %d (every rank of "
               "a pipeline stage runs the same schedule and its groups are placed alike).\n\n",
               r->world);
    else
        printf("Ranks: explicit - all %d ranks simulated, collectives wait for their real "
               "group members.\n\n",
               r->ranks_simulated);
    for (uint32_t k = 0; k < p->options->n_slow_ranks; k++)
        printf("Slowed: rank %u computes %g times slower.\n", p->options->slow_ranks[k].index,
               p->options->slow_ranks[k].factor);
    for (uint32_t k = 0; k < p->options->n_slow_nodes; k++)
        printf("Slowed: node %u's network moves data %g times slower.\n",
               p->options->slow_nodes[k].index, p->options->slow_nodes[k].factor);
    if (p->options->n_slow_ranks + p->options->n_slow_nodes > 0)
        printf("\n");
    printf("  step time                      %10.4f s\n", r->step_time_s);
    printf("  samples/s                      %10.2f\n", samples_per_s(p));
    char *budget = cli_budget_line(p->budget, r->step_time_s, tokens_per_step(p),
                                   p->sched->world);
    if (budget)
        printf("  %s\n", budget);
    g_free(budget);
    printf("  model TFLOP/s per GPU          %10.1f   (model FLOPs: forward and backward, not "
           "recomputation or the optimizer)\n",
           flops_per_gpu(p) / 1e12);
    printf("  MFU                            %10.1f %% (of the %.0f TFLOP/s %s peak)\n",
           100.0 * flops_per_gpu(p) / p->peak_flops, p->peak_flops / 1e12,
           zp_precision_name(plan->precision));
    print_breakdown(p);
    printf("\n  bytes sent per rank            %10.3f GB data-parallel, %.3f GB tensor-parallel, "
           "%.3f GB pipeline",
           cli_dp_bytes(r->comm_bytes) / GB, r->comm_bytes[ZP_GROUP_TP] / GB, r->comm_bytes[ZP_GROUP_PP] / GB);
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(p->sched, groups);
    for (int g = ZP_GROUP_N; g < n_groups; g++)
        printf(", %.3f GB %s", r->comm_bytes[g] / GB, groups[g].name);
    printf("\n");
    if (zp_moe_enabled(&p->model->moe) && plan->experts.dispatcher == ZP_DISPATCH_ALLGATHER) {
        const double x = r->alltoall_s;
        printf("    expert parallelism           %10.3f GB gathered and reduce-scattered over TP "
               "x EP %d (the allgather dispatcher), %.3f GB over the expert-data-parallel group; "
               "the dispatcher's collectives %.4f s, %.1f%% of the step\n",
               r->comm_bytes[ZP_GROUP_TPEP] / GB, plan->mp * zp_plan_ep(plan),
               r->comm_bytes[ZP_GROUP_EDP] / GB, x, 100.0 * x / r->step_time_s);
    } else if (zp_moe_enabled(&p->model->moe)) {
        const double a2a = r->alltoall_s;
        printf("    expert parallelism           %10.3f GB all-to-all over EP %d, %.3f GB over the "
               "expert-data-parallel group; all-to-all %.4f s, %.1f%% of the step\n",
               r->comm_bytes[ZP_GROUP_EP] / GB, zp_plan_ep(plan),
               r->comm_bytes[ZP_GROUP_EDP] / GB, a2a, 100.0 * a2a / r->step_time_s);
    }
    if (r->comm_bytes[ZP_GROUP_HPZ] + r->comm_bytes[ZP_GROUP_NODE] +
            r->comm_bytes[ZP_GROUP_XNODE] > 0)
        printf("    ZeRO++ subgroups             %10.3f GB hpZ (in the node), %.3f GB qgZ in the "
               "node, %.3f GB qgZ across nodes\n",
               r->comm_bytes[ZP_GROUP_HPZ] / GB, r->comm_bytes[ZP_GROUP_NODE] / GB,
               r->comm_bytes[ZP_GROUP_XNODE] / GB);
    print_memory(p);
    cli_pipe_print_stages(r);
    print_tiers(p);
    printf("\n  %" G_GUINT64_FORMAT " op events on %d simulated rank(s), %" G_GUINT64_FORMAT
           " queue events\n",
           r->op_events, r->ranks_simulated, r->heap_events);
    char *fold = fold_note(r);
    printf("  %s\n", fold);
    g_free(fold);
}


/* Where offload puts the model states (and Pa+cpu the checkpoints): per rank and per node. */
static void print_tiers(const CliSimReport *p)
{
    const ZpSchedule *s = p->sched;
    const double ckpt_host = s->host_bytes[ZP_MEM_CHECKPOINTS];
    if (!zp_offload_any(p->plan) && ckpt_host == 0)
        return;
    const int per_node = MIN(p->hw->gpus_per_node, s->world);
    double host = 0, nvme = 0;
    for (int c = 0; c < ZP_MEM_N; c++)
        host += s->host_bytes[c], nvme += s->nvme_bytes[c];
    char *ckpt = ckpt_host > 0 ? g_strdup_printf(", checkpoints %.3f GB (cpu_checkpointing)",
                                                 ckpt_host / GB)
                               : g_strdup("");
    printf("  offload: optimizer %s, parameters %s%s; host memory %.3f GB per rank, %.1f GB per "
           "node of %.1f GB; NVMe %.3f GB per rank, %.1f GB per node of %.1f GB\n",
           zp_offload_device_name(p->plan->zero.offload_optimizer.device),
           zp_offload_device_name(p->plan->zero.offload_param.device), ckpt, host / GB,
           per_node * host / GB, p->hw->cpu_memory_bytes / GB, nvme / GB, per_node * nvme / GB,
           p->hw->nvme_bytes / GB);
    g_free(ckpt);
}
