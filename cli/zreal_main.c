/* zreal: trains the GPT of a plan's schedule on MPI ranks (one process per rank, launched by
 * `mpirun -np N build/zreal ...`) and writes what it measured beside what was planned. */
#include "cli.h"
#include "cli_moe.h"
#include "cli_pipe.h"
#include "zp_offload.h"
#include "real_comm.h"
#include "real_cpu.h"
#include "real_engine.h"
#include "real_pipe.h"
#include "real_microbench.h"
#include "real_tp.h"
#include "real_watch.h"
#include "zp_budget.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_sched.h"
#include "zp_schedsize.h"
#include "zp_outpath.h"
#include "zp_util.h"
#include "real_cuda_load.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* OpenBLAS's own thread control; the GSL CBLAS header does not declare it. */
extern void openblas_set_num_threads(int threads);

/* Fault injection for the tests (hidden flags): at the start of step --fault-step, rank
 * --fault-rank kills itself, stops itself (SIGSTOP, as `kill -STOP` would) or sleeps
 * FAULT_SLEEP_S (a slow step). */
typedef enum { FAULT_KILL, FAULT_STOP, FAULT_SLEEP } FaultAction;
static const char *const fault_actions[] = {"kill", "stop", "sleep", NULL};
#define FAULT_SLEEP_S 2.0

/* How long a rank that leaves a job-wide failure to the rank that reports it waits before
 * aborting, so the report is written before the job is torn down. */
#define QUIET_RANK_WAIT_US 200000

/* A step slower than this many times the median step is flagged. */
#define SLOW_STEP_FACTOR 10.0

typedef struct {
    char *model, *schedule, *out, *backend, *attention, *seq, *impl;
    char *reduce_dtype; /* --reduce-dtype, NULL: the implementation's default */
    char *like_simulate; /* --like-simulate PREDICTED.json: its plan, not the plan flags */
    int stage, micro_batch, grad_accum, steps, fault_rank, fault_step;
    int hpz, ranks_per_node; /* ZeRO++ hpZ's group size, and the ranks a node holds (0: all) */
    gboolean quantized_weights, quantized_gradients; /* ZeRO++ qwZ, qgZ */
    gboolean cpu_checkpointing, partition_activations; /* ZeRO-R: checkpoints in host memory,
                                                        * split over the tensor group */
    int mp; /* tensor-parallel degree; --microbench: the degree whose shapes are timed */
    FaultAction fault_action;
    int emulate, emulate_rank; /* --emulate N --rank r; emulate 0: real MPI ranks */
    gboolean checkpoint, microbench;
    gboolean overlap; /* overlap_comm (Megatron's overlap_grad_reduce: its buckets) */
    gboolean overlap_param_gather; /* Megatron's distributed optimizer's gathers in forward */
    gboolean schedule_edited; /* --schedule-edited: run a --schedule whose digest differs */
    double lr;
    char *knobs[ZP_KNOB_N]; /* DeepSpeed's size knobs as given, NULL when absent */
    char *offload_optimizer, *offload_param; /* cpu|nvme, NULL when absent */
    char *nvme_path;         /* --nvme-path DIR: where the NVMe tier's swap files go */
    CliPipeFlags pipe;       /* --pp, --pp-schedule, ... */
    char *ep, *capacity_factor; /* a mixture of experts' --ep and --capacity-factor */
    gint64 seed;
} Args;

/* Per-rank figures gathered to rank 0, one fixed-layout vector of doubles each. */
enum {
    F_STATE, F_PEAK, F_STEP_S, F_COMM, F_TP_COMM,
    F_AT_PEAK, F_CAT_PEAK = F_AT_PEAK + ZP_MEM_N,
    F_OP_COUNT = F_CAT_PEAK + ZP_MEM_N, F_OP_S = F_OP_COUNT + REAL_ENGINE_N_OP_TYPES,
    F_OFFLOAD = F_OP_S + REAL_ENGINE_N_OP_TYPES, /* 1 when the host tier's fields follow */
    F_HOST = F_OFFLOAD + 1, F_MOVED = F_HOST + ZP_MEM_N,
    F_DIRECT = F_MOVED + ZP_XFER_N, /* the NVMe tier's O_DIRECT bytes, the whole run */
    F_HOST_PEAK,                    /* the host tier's peak, all categories together */
    F_DEVICE, /* 1 when the device_memory fields follow */
    F_DEV_TOTAL, F_DEV_USED, F_DEV_CONTEXT, F_DEV_NCCL, F_DEV_POOL, F_DEV_POOL_PEAK,
    F_CA_ALLOCATED, F_CA_RESERVED, F_CA_LARGEST_FREE, /* the tracker's caching-allocator replay */
    F_HEAP_HELD, /* what the process's malloc holds after the steps */
    F_CKPT_HOST, F_CKPT_HOST_PEAK, F_CKPT_DOWN, F_CKPT_UP, /* cpu_checkpointing's host tier */
    F_PIPE, /* 1 when the pipeline fields follow */
    F_STAGE, F_P2P, F_RECV_S, F_SEND_S,
    F_HPZ, F_HPZ_COMM, /* 1 when hpZ's group is there, and the bytes sent in it */
    F_MOE, F_EP_COMM, F_EDP_COMM, /* 1 for a mixture of experts, its EP and EDP groups' bytes */
    F_LOSS
};

/* Ranks share the machine's cores: each gets cores / ranks-on-this-node BLAS threads
 * unless OPENBLAS_NUM_THREADS says otherwise. */
static void set_blas_threads(void)
{
    if (g_getenv("OPENBLAS_NUM_THREADS"))
        return;
    const char *local = g_getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const long ranks = local ? MAX(1, atol(local)) : 1;
    openblas_set_num_threads((int)MAX(1, cores / ranks));
}

/* The model and plan of --model and the plan flags, on `world` ranks of tensor degree a->mp
 * (1 but for --microbench, which times the kernels of that degree's shapes). */
/* --like-simulate: the plan `zplan simulate --json` wrote, every choice as simulate made it
 * (its defaults: DeepSpeed's semantics, the cluster's attention, the model's precision), so
 * `zplan validate` compares the two without flags matched by hand. It must fit this world
 * and what zreal computes in (bf16). */
static gboolean plan_like_simulate(const char *path, int world, ZpPlan *plan, GError **error)
{
    json_t *root = zp_json_load_object(path, error);
    json_t *p = root ? json_object_get(root, "plan") : NULL;
    gboolean ok = root != NULL;
    if (ok && !json_is_object(p)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "--like-simulate: %s has no \"plan\" "
                    "(give zplan simulate --json's output)", path);
        ok = FALSE;
    }
    ok = ok && zp_plan_from_json(p, path, plan, error);
    if (ok && plan->dp * plan->mp * zp_plan_pp(plan) != world) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--like-simulate: %s's plan runs on %d "
                    "ranks (dp %d x mp %d x pp %d), this run has %d", path,
                    plan->dp * plan->mp * zp_plan_pp(plan), plan->dp, plan->mp, zp_plan_pp(plan),
                    world);
        ok = FALSE;
    }
    if (ok && plan->precision != ZP_PREC_BF16) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--like-simulate: %s's plan computes in %s; "
                    "zreal computes in bf16 (simulate with --precision bf16)", path,
                    zp_precision_name(plan->precision));
        ok = FALSE;
    }
    json_decref(root);
    return ok;
}

static gboolean make_plan(const Args *a, int world, ZpModel *model, ZpPlan *plan,
                          GError **error)
{
    if (!zp_model_load(a->model, model, error) || !cli_seq(a->seq, model, error))
        return FALSE;
    model->dropout = FALSE; /* zreal's GPT trains without dropout */
    if (a->like_simulate)
        return plan_like_simulate(a->like_simulate, world, plan, error);
    /* --mp (--microbench's) need not divide the world; --pp must, with it. */
    int pp = 1;
    if (a->pipe.pp && !cli_pipe_stages(&a->pipe, world, a->mp, &pp, error))
        return FALSE;
    zp_plan_defaults(plan, a->stage, a->pipe.pp ? world / (a->mp * pp) : world, a->mp);
    if (!cli_pipe_plan(&a->pipe, pp, plan, error))
        return FALSE;
    /* The paper's semantics unless --impl says otherwise (the engine executes the three at
     * every stage; DeepSpeed's stages 2-3 through real/real_engine_ds.c). */
    plan->impl = ZP_IMPL_PAPER;
    if (a->impl && !zp_impl_parse(a->impl, "--impl", &plan->impl, error))
        return FALSE;
    plan->zero.overlap_comm = plan->zero.overlap_comm || a->overlap;
    plan->overlap_param_gather = a->overlap_param_gather;
    plan->precision = ZP_PREC_BF16;
    /* The implementation's own defaults, as zplan's (Megatron under bf16: main_grad in fp32,
     * grad_reduce_in_fp32; its bucket size), then the flags. FSDP2 reduces in its
     * param_dtype, bf16 (mp_policy's reduce_dtype None). */
    zp_impl_plan_defaults(plan);
    if (a->reduce_dtype &&
        !zp_reduce_dtype_parse(a->reduce_dtype, "--reduce-dtype", &plan->reduce_dtype, error))
        return FALSE;
    plan->micro_batch = a->micro_batch;
    plan->grad_accum = a->grad_accum;
    plan->checkpoint = a->checkpoint;
    plan->ckpt.cpu_checkpointing = a->cpu_checkpointing;
    plan->ckpt.partition_activations = a->partition_activations;
    plan->zero.zero_quantized_weights = a->quantized_weights;
    plan->zero.zero_quantized_gradients = a->quantized_gradients;
    plan->zero.zero_hpz_partition_size = a->hpz;
    plan->gpus_per_node = a->ranks_per_node;
    /* zreal's kernels: eager, or the blockwise fused one (any fused name means it). Its own
     * kernel runs in any dtype, fp32 on the CPU included: no FlashAttention dtype check here
     * (zp_hw_attention_choose's is for the GPU kernels zplan prices). */
    if (a->attention && !cli_attention_zreal(a->attention, plan, error))
        return FALSE;
    for (int k = 0; k < ZP_KNOB_N; k++)
        if (a->knobs[k] && !zp_zero_knob_set(&plan->zero, (ZpZeroKnob)k, a->knobs[k], error))
            return FALSE;
    if (!cli_knobs_read(plan->impl, (const char *const *)a->knobs, error))
        return FALSE;
    if (!cli_offload(a->offload_optimizer, a->offload_param, a->nvme_path, &plan->zero, error))
        return FALSE;
    /* zreal's transformer (real_gpt) has the fused qkv: latent attention would lay out tensors
     * it does not execute. A mixture of experts runs real_moe's sparse MLP, split over --ep
     * ranks, routed with DeepSpeed's capacity (real_engine_moe checks the rest). */
    if (zp_mla_enabled(&model->mla)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--model: %s has latent attention; zreal runs the fused qkv only",
                    model->name);
        return FALSE;
    }
    if (!cli_moe_parse(model, a->ep, a->capacity_factor, NULL, &plan->experts, error) ||
        !zp_ep_check(model, plan, "--ep", error))
        return FALSE;
    if (zp_moe_enabled(&model->moe) && !a->capacity_factor) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--capacity-factor: %s is a mixture of experts; zreal routes with a capacity "
                    "factor (DeepSpeed's fixed-size all-to-all), give one (E / top_k drops "
                    "nothing)", model->name);
        return FALSE;
    }
    if (a->mp > 1 && (model->heads % a->mp || zp_model_kv_heads(model) % a->mp ||
                      model->ffn_hidden % a->mp || model->vocab % a->mp)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--mp: %d does not divide the heads, key/value heads, MLP width and "
                    "vocabulary of %s", a->mp, model->name);
        return FALSE;
    }
    return TRUE;
}

static ZpSchedule *make_schedule(const Args *a, int world, GError **error)
{
    if (a->schedule) { /* --nvme-path: where this machine's swap files go */
        ZpSchedule *s = zp_sched_read_json(a->schedule, error);
        if (!s)
            return NULL;
        if (s->plan.attention == ZP_ATTN_MEM_EFFICIENT) {
            /* zreal's fused path is its own blockwise kernel, not PyTorch's mem_eff_attention */
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "--schedule %s: key \"plan\": \"attention\": zreal does not run "
                        "mem-efficient (PyTorch's memory-efficient SDPA kernel); write the "
                        "schedule with eager or flash", a->schedule);
            return zp_sched_free(s), NULL;
        }
        /* Checked (zp_schedcheck), but not the ops zplan wrote: run only when told. */
        if (s->digest == ZP_DIGEST_MISMATCH && !a->schedule_edited) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "--schedule %s: key \"digest\": its ops are not the ones zplan wrote "
                        "(the file was edited); --schedule-edited runs it anyway", a->schedule);
            return zp_sched_free(s), NULL;
        }
        ZpOffload *tiers[] = {&s->plan.zero.offload_optimizer, &s->plan.zero.offload_param};
        for (size_t i = 0; a->nvme_path && i < G_N_ELEMENTS(tiers); i++)
            if (!cli_offload_nvme_path(a->nvme_path, tiers[i], error))
                return zp_sched_free(s), NULL;
        return s;
    }
    ZpModel model;
    ZpPlan plan;
    return make_plan(a, world, &model, &plan, error) ? zp_sched_build(&model, &plan, error)
                                                      : NULL;
}

/* --microbench: with --model, also every kernel of that model's plan. */
static gboolean microbench(const Args *a, RealBackend *be, RealComm *comm, GError **error)
{
    ZpModel model;
    ZpPlan plan;
    if (a->model && !make_plan(a, comm->size, &model, &plan, error))
        return FALSE;
    return real_microbench_run(be, comm, a->emulate > 0, a->model ? &model : NULL,
                               a->model ? &plan : NULL,
                               a->nvme_path ? a->nvme_path : g_get_tmp_dir(), a->out, error);
}

/* What this rank runs: without a pipeline the schedule over the world; with one its stage's
 * view of it (zp_sched_stage_view) over its stage's DP group, and its pipe. */
typedef struct {
    ZpSchedule *full, *run;
    RealPipe *pipe;
    RealComm *dp;
} RankPlan;

static void rank_plan_clear(RankPlan *r)
{
    if (r->run != r->full)
        zp_sched_free(r->run);
    zp_sched_free(r->full);
    real_pipe_free(r->pipe);
}

/* Takes `full`; borrows `groups` (real_groups_split's for its degrees). */
static gboolean place_rank(ZpSchedule *full, RealComm *world, RealBackend *be,
                           const RealGroups *groups, RankPlan *r, GError **error)
{
    *r = (RankPlan){full, full, NULL, groups->dp};
    if (full->stages == 1)
        return TRUE;
    if (!(r->pipe = real_pipe_new(world, be, full, groups, error)))
        return FALSE;
    r->run = zp_sched_stage_view(full, real_pipe_stage(r->pipe));
    r->dp = real_pipe_dp_comm(r->pipe);
    return TRUE;
}

/* The pipeline's figures of this rank (v[F_PIPE] stays 0 without one). */
static void collect_pipe(const RealPipe *pipe, int timed_steps, int steps, double *v)
{
    if (!pipe)
        return;
    v[F_PIPE] = 1;
    v[F_STAGE] = real_pipe_stage(pipe);
    v[F_P2P] = steps > 0 ? real_pipe_sent_bytes(pipe) / steps : 0;
    v[F_RECV_S] = real_pipe_recv_s(pipe) / timed_steps;
    v[F_SEND_S] = real_pipe_send_s(pipe) / timed_steps;
}

static gboolean collect(RealEngine *engine, RealBackend *be, const RealComm *dp,
                        const RealComm *tp, double step_s,
                        int timed_steps, const double *local_loss, int steps, double *v,
                        GError **error)
{
    RealAllocStats st;
    real_alloc_stats(be->tracker, &st);
    RealOpTiming t[REAL_ENGINE_N_OP_TYPES];
    real_engine_timings(engine, t);
    v[F_STATE] = real_engine_model_state_bytes(engine);
    v[F_PEAK] = (double)st.peak_total_bytes;
    v[F_STEP_S] = step_s;
    /* Every step sends the same. */
    v[F_COMM] = steps > 0 ? dp->sent_bytes / steps : 0;
    v[F_TP_COMM] = steps > 0 && tp ? tp->sent_bytes / steps : 0;
    for (int c = 0; c < ZP_MEM_N; c++) {
        v[F_AT_PEAK + c] = (double)st.at_peak_bytes[c];
        v[F_CAT_PEAK + c] = (double)st.peak_bytes[c];
    }
    for (int k = 0; k < REAL_ENGINE_N_OP_TYPES; k++) {
        v[F_OP_COUNT + k] = (double)t[k].count / timed_steps;
        v[F_OP_S + k] = t[k].total_s / timed_steps;
    }
    for (int i = 0; i < steps; i++)
        v[F_LOSS + i] = local_loss[i];
    RealCachingStats ca;
    real_alloc_caching_stats(be->tracker, &ca);
    v[F_CA_ALLOCATED] = ca.peak_allocated_bytes;
    v[F_CA_RESERVED] = ca.peak_reserved_bytes;
    v[F_CA_LARGEST_FREE] = ca.largest_free_at_peak_bytes;
    v[F_HEAP_HELD] = (double)real_alloc_heap_held_bytes();
    RealAllocStats host;
    if (real_engine_offload_stats(engine, &host, v + F_MOVED, v + F_DIRECT)) {
        v[F_OFFLOAD] = 1;
        for (int c = 0; c < ZP_MEM_N; c++)
            v[F_HOST + c] = (double)host.live_bytes[c];
        v[F_HOST_PEAK] = (double)host.peak_total_bytes;
        for (int k = 0; k < ZP_XFER_N; k++) /* per step, as the schedule counts them */
            v[F_MOVED + k] /= MAX(1, steps);
    }
    if (real_engine_has_experts(engine)) {
        v[F_MOE] = 1;
        v[F_EP_COMM] = steps > 0 ? real_engine_moe_sent_bytes(engine, ZP_GROUP_EP) / steps : 0;
        v[F_EDP_COMM] = steps > 0 ? real_engine_moe_sent_bytes(engine, ZP_GROUP_EDP) / steps : 0;
    }
    double hpz_sent = 0;
    if (real_engine_hpz_sent_bytes(engine, &hpz_sent)) {
        v[F_HPZ] = 1;
        v[F_HPZ_COMM] = steps > 0 ? hpz_sent / steps : 0;
    }
    RealAllocStats ckpt_host;
    double down = 0, up = 0;
    if (real_engine_ckpt_host_stats(engine, &ckpt_host, &down, &up)) {
        v[F_CKPT_HOST] = 1;
        v[F_CKPT_HOST_PEAK] = (double)ckpt_host.peak_total_bytes;
        v[F_CKPT_DOWN] = down / MAX(1, steps); /* per step, as the schedule counts them */
        v[F_CKPT_UP] = up / MAX(1, steps);
    }
    RealDeviceMemory dm;
    if (!be->device_memory)
        return TRUE;
    if (!be->device_memory(be, &dm)) {
        const char *text = NULL;
        be->synchronize(be, &text);
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "the device memory query failed: %s",
                    text ? text : "no reason given");
        return FALSE;
    }
    const double device[] = {1, (double)dm.total_bytes, (double)dm.used_bytes,
                             (double)dm.context_bytes, (double)dm.nccl_bytes,
                             (double)dm.pool_reserved_bytes, (double)dm.pool_peak_reserved_bytes};
    memcpy(v + F_DEVICE, device, sizeof device);
    return TRUE;
}

/* A measured time, or null when no step ran (--steps 0 measures memory only). */
static json_t *time_json(double seconds, int steps)
{
    return steps > 0 ? json_real(seconds) : json_null();
}

static json_t *rank_json(int rank, const double *v, int steps)
{
    json_t *ops = json_object(), *loss = json_array();
    for (int k = 0; k < REAL_ENGINE_N_OP_TYPES; k++)
        if (v[F_OP_COUNT + k] > 0)
            json_object_set_new(ops, real_engine_op_type_name(k),
                                json_pack("{s:f, s:f}", "count", v[F_OP_COUNT + k], "total_s",
                                          v[F_OP_S + k]));
    for (int i = 0; i < steps; i++)
        json_array_append_new(loss, json_real(v[F_LOSS + i]));
    json_t *out = json_pack("{s:i, s:f, s:f, s:o, s:o, s:o, s:f, s:f, s:o, s:o}", "rank", rank,
                            "model_state_bytes", v[F_STATE], "peak_memory_bytes", v[F_PEAK],
                            "peak_breakdown", zp_sched_categories_json(v + F_AT_PEAK),
                            "category_peak_bytes", zp_sched_categories_json(v + F_CAT_PEAK),
                            "step_time_s", time_json(v[F_STEP_S], steps), "comm_bytes",
                            v[F_COMM], "tp_comm_bytes", v[F_TP_COMM], "ops", ops, "loss", loss);
    /* Its own allocation sequence through the caching-allocator model (zp_alloc_replay). */
    if (v[F_PIPE] > 0) /* its stage, what it sent to other stages, its waits on them */
        json_object_set_new(out, "pipeline",
                            json_pack("{s:i, s:f, s:f, s:f}", "stage", (int)v[F_STAGE],
                                      "p2p_bytes", v[F_P2P], "recv_wait_s", v[F_RECV_S],
                                      "send_s", v[F_SEND_S]));
    json_object_set_new(out, "caching_allocator",
                        json_pack("{s:f, s:f, s:f}", "peak_allocated_bytes", v[F_CA_ALLOCATED],
                                  "peak_reserved_bytes", v[F_CA_RESERVED],
                                  "largest_free_at_peak_bytes", v[F_CA_LARGEST_FREE]));
    /* The host heap that kept the freed blocks (real_alloc keep_freed_blocks): on the CPU
     * backend the held counterpart of the tracked peak, with the process's other mallocs. */
    json_object_set_new(out, "host_heap_held_bytes", json_real(v[F_HEAP_HELD]));
    if (v[F_OFFLOAD] > 0) { /* the host tier and what crossed between the tiers per step */
        json_t *moved = json_object();
        for (int k = 0; k < ZP_XFER_N; k++)
            json_object_set_new(moved, zp_sched_transfer_name(k), json_real(v[F_MOVED + k]));
        json_object_set_new(out, "host_bytes", zp_sched_categories_json(v + F_HOST));
        json_object_set_new(out, "host_peak_bytes", json_real(v[F_HOST_PEAK]));
        json_object_set_new(out, "transfer_bytes", moved);
        json_object_set_new(out, "nvme_direct_bytes", json_real(v[F_DIRECT]));
    }
    if (v[F_MOE] > 0) /* the all-to-alls over EP, the experts' reductions over dp / EP */
        json_object_set_new(out, "moe_comm_bytes",
                            json_pack("{s:f, s:f}", "ep", v[F_EP_COMM], "edp", v[F_EDP_COMM]));
    if (v[F_HPZ] > 0) /* the part of comm_bytes sent in hpZ's group */
        json_object_set_new(out, "hpz_comm_bytes", json_real(v[F_HPZ_COMM]));
    if (v[F_CKPT_HOST] > 0) /* cpu_checkpointing: the host tier's peak, bytes each way a step */
        json_object_set_new(out, "checkpoint_host",
                            json_pack("{s:f, s:f, s:f}", "peak_bytes", v[F_CKPT_HOST_PEAK],
                                      "down_bytes", v[F_CKPT_DOWN], "up_bytes", v[F_CKPT_UP]));
    /* The driver's view beside the tracker's, after the last step (device backends only). */
    if (v[F_DEVICE] > 0)
        json_object_set_new(out, "device_memory",
                            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "total_bytes",
                                      v[F_DEV_TOTAL], "used_bytes", v[F_DEV_USED],
                                      "context_bytes", v[F_DEV_CONTEXT], "nccl_bytes",
                                      v[F_DEV_NCCL], "pool_reserved_bytes", v[F_DEV_POOL],
                                      "pool_peak_reserved_bytes", v[F_DEV_POOL_PEAK]));
    return out;
}

/* Writes measured.json: `all` holds the figures of n_ranks processes, ranks first_rank on
 * (all of a real world, or the one rank an emulating process plays). */
static gboolean write_measured(const char *path, const ZpSchedule *s, const char *backend,
                               const double *all, const RealComm *comm, int n_ranks,
                               int first_rank, int steps, const double *loss, json_t *slow,
                               GError **error)
{
    const int n = F_LOSS + steps;
    json_t *ranks = json_array(), *global = json_array();
    double step_s = 0;
    for (int r = 0; r < n_ranks; r++) {
        json_array_append_new(ranks, rank_json(first_rank + r, all + (size_t)r * n, steps));
        step_s = MAX(step_s, all[(size_t)r * n + F_STEP_S]);
    }
    for (int i = 0; i < steps; i++)
        json_array_append_new(global, json_real(loss[i]));
    json_t *root = json_pack("{s:s, s:s, s:i, s:b, s:i, s:o, s:o, s:o, s:f, s:o, s:o}",
                             "format", "zplan-measured-1", "backend", backend, "world",
                             comm->size, "emulated", n_ranks < comm->size, "steps", steps,
                             "model", zp_model_to_json(&s->model), "plan",
                             zp_plan_to_json(&s->plan), "step_time_s", time_json(step_s, steps),
                             "predicted_model_state_bytes", zp_sched_model_state_bytes(s),
                             "loss", global, "ranks", ranks);
    json_object_set(root, "slow_steps", slow);
    if (zp_offload_any(&s->plan))
        json_object_set_new(root, "predicted_host_bytes", zp_sched_categories_json(s->host_bytes));
    gboolean ok = zp_json_write(root, path, error);
    json_decref(root);
    return ok;
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The steps whose wall time exceeds SLOW_STEP_FACTOR x the median of the timed steps (all
 * but the warm-up step 0 when there are more): [{"step", "time_s", "median_s"}], each also
 * one line on stderr when `warn` (a stalled rank makes every rank's step slow). */
static json_t *slow_steps(const double *step_s, int steps, gboolean warn)
{
    json_t *slow = json_array();
    const int first = steps > 1 ? 1 : 0, n = steps - first;
    if (n <= 0)
        return slow;
    double *sorted = g_memdup2(step_s + first, sizeof(double) * (gsize)n);
    qsort(sorted, (size_t)n, sizeof(double), compare_doubles);
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    g_free(sorted);
    for (int i = first; i < steps; i++) {
        if (step_s[i] <= SLOW_STEP_FACTOR * median)
            continue;
        json_array_append_new(slow, json_pack("{s:i, s:f, s:f}", "step", i, "time_s", step_s[i],
                                              "median_s", median));
        if (warn)
            fprintf(stderr, "zreal: warning: step %d took %.3g s, %.0f x the median step "
                            "(%.3g s): a rank stalled\n", i, step_s[i], step_s[i] / median, median);
    }
    return slow;
}

static void inject_fault(const Args *a, int step, int rank)
{
    if (step != a->fault_step || rank != a->fault_rank)
        return;
    if (a->fault_action == FAULT_SLEEP)
        g_usleep((gulong)(FAULT_SLEEP_S * 1e6));
    else
        raise(a->fault_action == FAULT_STOP ? SIGSTOP : SIGKILL);
}

/* The schedule of --schedule, of --model with --pp (on the world), or of --model on the
 * data-parallel group, and the groups its tensor degree and stages split the world into. */
static ZpSchedule *schedule_and_groups(const Args *a, RealComm *world, RealGroups *g,
                                       GError **error)
{
    const gboolean whole = a->schedule || a->pipe.pp;
    ZpSchedule *s = whole ? make_schedule(a, world->size, error) : NULL;
    if (whole && !s)
        return NULL;
    if (!real_groups_split(world, s ? s->plan.mp : a->mp, s ? MAX(s->stages, 1) : 1,
                           s ? s->plan.rank_order : ZP_ORDER_TP_DP_PP, g, error)) {
        zp_sched_free(s);
        return NULL;
    }
    if (!s && !(s = make_schedule(a, g->dp->size, error)))
        real_groups_free(g);
    return s;
}

/* What a --schedule without zplan's digest is (on stderr, from one rank): older files and
 * hand-written ones have none, and run as checked; an edited one runs only when told. */
static void schedule_note(const Args *a, const ZpSchedule *s, gboolean speaks)
{
    if (!a->schedule || !speaks || s->digest == ZP_DIGEST_MATCH)
        return;
    fprintf(stderr, "zreal: note: --schedule %s %s: its ops passed the schedule checks, but are "
                    "not known to be zplan's\n", a->schedule,
            s->digest == ZP_DIGEST_ABSENT ? "has no digest (written before zplan wrote one, or "
                                            "by hand)"
                                          : "was edited (--schedule-edited)");
}

/* zreal allocates the schedule's buffers as it runs them: a rank's peak (zp_schedsize), times
 * the ranks this machine runs, is checked against its available memory before the first
 * (--micro-batch 1048576 of tiny took past 12 GB in 26 s). On the host backend only: a
 * device's allocator says when the device is full. */
static gboolean buffers_fit(const Args *a, const ZpSchedule *s, const RealComm *comm,
                            const RealBackend *be, GError **error)
{
    if (strcmp(be->name, "cpu") != 0)
        return TRUE;
    const char *local = g_getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const double ranks = a->emulate ? 1 : local && atoi(local) > 0 ? atoi(local) : comm->size;
    /* The schedule's buffers, and the per-step figures a rank keeps (loss, times) and rank 0
     * gathers from every rank. */
    const double rank_bytes = zp_schedsize_peak_bytes(s) +
                              (double)a->steps * sizeof(double) * (3.0 + comm->size);
    char *what = a->schedule
                     ? g_strdup_printf("--schedule %s: a rank's buffers peak at %.1f GB",
                                       a->schedule, rank_bytes / 1e9)
                     : g_strdup_printf("--micro-batch %d (--model %s, --stage %d, --grad-accum %d): "
                                       "a rank's buffers peak at %.1f GB",
                                       a->micro_batch, a->model, a->stage, a->grad_accum,
                                       rank_bytes / 1e9);
    const gboolean ok = zp_budget_check(what, ranks, "rank(s) on this machine", 0, NULL,
                                        ranks * rank_bytes, error);
    g_free(what);
    return ok;
}

static gboolean train(const Args *a, RealBackend *be, RealComm *comm, gboolean *every_rank,
                      GError **error)
{
    RealGroups groups = {0};
    RankPlan rp = {0};
    /* Its stage's view over its stage's DP group with a pipeline; else the whole schedule
     * over the DP group the tensor degree leaves. A refusal here (the plan, its schedule, the
     * buffers it needs) is every rank's alike: *every_rank. */
    *every_rank = TRUE;
    ZpSchedule *full = schedule_and_groups(a, comm, &groups, error);
    if (full && !buffers_fit(a, full, comm, be, error)) {
        zp_sched_free(full); /* place_rank, which would own it, is not reached */
        full = NULL;
    }
    if (!full || !place_rank(full, comm, be, &groups, &rp, error)) {
        rank_plan_clear(&rp);
        real_groups_free(&groups);
        return FALSE;
    }
    const ZpSchedule *s = rp.full;
    RealTp *tp = groups.tp ? real_tp_new(groups.tp, be) : NULL;
    RealTrainConfig cfg = {.lr = (float)a->lr, .weight_decay = 0.0f, .seed = (uint64_t)a->seed,
                           .tp = tp, .pipe = rp.pipe};
    /* the engine's checks of what it executes read the schedule alone (real_engine.c) */
    RealEngine *engine = real_engine_new(rp.run, be, rp.dp, &cfg, error);
    gboolean ok = engine != NULL;
    *every_rank = !ok;
    if (ok) /* once the schedule is known to run here: a refusal stays one line */
        schedule_note(a, s, a->emulate || comm->rank == 0);
    double *loss = g_new0(double, a->steps), *local = g_new0(double, a->steps);
    double *step_s = g_new0(double, a->steps);
    double timed_s = 0;
    /* Tokens the whole world trains on per step (an emulated rank stands for its world). */
    const double tokens_per_step = (double)s->plan.dp * s->plan.micro_batch *
                                   s->plan.grad_accum * (double)s->model.seq_len;
    if (ok)
        real_alloc_reset_peaks(be->tracker);
    const char *note = ok ? real_engine_nvme_note(engine) : NULL;
    if (note && (a->emulate || comm->rank == 0))
        fprintf(stderr, "zreal: --nvme-path %s: buffered reads and writes (%s)\n",
                s->plan.zero.offload_optimizer.nvme_path[0]
                    ? s->plan.zero.offload_optimizer.nvme_path
                    : s->plan.zero.offload_param.nvme_path, note);
    for (int step = 0; ok && step < a->steps; step++) {
        inject_fault(a, step, comm->rank);
        const double t0 = zp_now_s();
        ok = real_engine_step(engine, (uint64_t)step, &loss[step], error);
        /* Only the last stage has the loss: the pipeline group shares it. */
        if (ok && rp.pipe)
            ok = real_pipe_pp_comm(rp.pipe)->allreduce_host_f64(real_pipe_pp_comm(rp.pipe),
                                                                &loss[step], 1, error);
        step_s[step] = zp_now_s() - t0;
        /* The first step pays one-time costs (page faults, BLAS start-up): neither its step
         * time nor its op times are counted when there are later steps. */
        if (step > 0 || a->steps == 1)
            timed_s += zp_now_s() - t0;
        if (step == 0 && a->steps > 1) {
            real_engine_reset_timings(engine);
            if (rp.pipe)
                real_pipe_reset_timings(rp.pipe);
        }
        local[step] = loss[step];
        if (ok && (a->emulate || comm->rank == 0))
            fprintf(stderr, "step %3d  loss %.4f  %.3f s  %.0f tokens/s\n", step, loss[step],
                    step_s[step], tokens_per_step / step_s[step]);
    }
    const gboolean writer = a->emulate || comm->rank == 0;
    json_t *slow = ok ? slow_steps(step_s, a->steps, writer) : NULL;
    if (ok && a->out) {
        const int n = F_LOSS + a->steps;
        double *mine = g_new0(double, n), *all = g_new0(double, (size_t)n * comm->size);
        const int timed_steps = MAX(1, a->steps - 1);
        ok = collect(engine, be, rp.dp, groups.tp, timed_s / timed_steps, timed_steps, local, a->steps,
                     mine, error);
        collect_pipe(rp.pipe, timed_steps, a->steps, mine);
        if (ok && a->emulate) /* one process: its own figures are the measurement */
            ok = write_measured(a->out, s, be->name, mine, comm, 1, comm->rank, a->steps, loss,
                                slow, error);
        else if (ok)
            ok = comm->gather_host_f64(comm, mine, (size_t)n, all, error) &&
                 (comm->rank != 0 || write_measured(a->out, s, be->name, all, comm, comm->size,
                                                    0, a->steps, loss, slow, error));
        g_free(mine);
        g_free(all);
    }
    json_decref(slow);
    g_free(loss);
    g_free(local);
    g_free(step_s);
    real_engine_free(engine);
    real_tp_free(tp);
    real_groups_free(&groups);
    rank_plan_clear(&rp);
    return ok;
}

/* The backend and communicator --backend names: the CPU with MPI, or the GPU numbered by
 * this rank's place on its node (modulo the node's GPUs) with NCCL; with --emulate, the
 * emulated communicator on either. */
static gboolean make_backend(const Args *a, RealBackend **be, RealComm **comm, GError **error)
{
    if (strcmp(a->backend, "cpu") == 0) {
        *be = real_cpu_backend_new();
        *comm = a->emulate ? real_comm_emulated_new(*be, a->emulate, a->emulate_rank)
                           : real_comm_mpi_new(error);
        return *comm != NULL;
    }
    RealCudaEntries cuda;
    RealCudaGemmMode mode;
    const char *local_rank = g_getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!real_cuda_load(&cuda, error) || !cuda.gemm_mode_from_env(&mode, error) ||
        !(*be = cuda.backend_new(local_rank ? atoi(local_rank) : 0, mode, error))) {
        g_prefix_error(error, "--backend cuda: ");
        return FALSE;
    }
    *comm = a->emulate ? real_comm_emulated_new(*be, a->emulate, a->emulate_rank)
                       : cuda.comm_nccl_new(*be, error);
    return *comm != NULL;
}

/* A device backend's own failure, when it has one, added to an error that may only show
 * its consequence (a model call that could not proceed). Not after a communicator error:
 * the device may be stuck in the collective that failed. */
static void add_device_error(RealBackend *be, GError *error)
{
    const char *text = NULL;
    if (!be || !be->synchronize || !error || error->domain == REAL_COMM_ERROR ||
        be->synchronize(be, &text) || strstr(error->message, text))
        return;
    char *message = g_strdup_printf("%s (device: %s)", error->message, text);
    g_free(error->message);
    error->message = message;
}

static gboolean parse_args(int *argc, char ***argv, Args *a, GError **error)
{
    char *stage = NULL, *micro = NULL, *accum = NULL, *steps = NULL, *lr = NULL;
    char *emulate = NULL, *rank = NULL, *fault_action = NULL, *hpz = NULL, *per_node = NULL;
    char *mp = NULL;
    *a = (Args){.stage = 0, .mp = 1, .micro_batch = 4, .grad_accum = 1, .steps = 20, .hpz = 1,
                .fault_rank = -1,
                .fault_step = -1, .lr = 3e-3, .seed = 1234};
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &a->model, "Model name in models/ or a PATH.json", "M"},
        {"backend", 0, 0, G_OPTION_ARG_STRING, &a->backend, "cpu (MPI) or cuda (a GPU per rank, NCCL; GEMMs in bf16, or fp32 with ZREAL_CUDA_GEMM=fp32); default cpu", "B"},
        {"schedule", 0, 0, G_OPTION_ARG_FILENAME, &a->schedule, "Run this schedule (zplan schedule --out) instead of building one", "FILE"},
        {"schedule-edited", 0, 0, G_OPTION_ARG_NONE, &a->schedule_edited, "Run a --schedule whose ops differ from the digest zplan wrote into it (an edited file; it is still checked)", NULL},
        {"like-simulate", 0, 0, G_OPTION_ARG_FILENAME, &a->like_simulate, "Run the plan of this zplan simulate --json output (simulate's defaults, for zplan validate), in place of the plan flags", "PREDICTED"},
        {"stage", 0, 0, G_OPTION_ARG_STRING, &stage, "ZeRO stage 0-3 (default 0)", "S"},
        {"micro-batch", 0, 0, G_OPTION_ARG_STRING, &micro, "Samples per rank per micro-step (default 4)", "B"},
        {"grad-accum", 0, 0, G_OPTION_ARG_STRING, &accum, "Micro-steps per optimizer step (default 1)", "G"},
        {"steps", 0, 0, G_OPTION_ARG_STRING, &steps, "Optimizer steps (default 20; 0 sets up the model states, measures them and stops)", "N"},
        {"checkpoint", 0, 0, G_OPTION_ARG_NONE, &a->checkpoint, "Activation checkpointing", NULL},
        {"reduce-dtype", 0, 0, G_OPTION_ARG_STRING, &a->reduce_dtype, "Gradient reduction dtype bf16 or fp32 (default: the implementation's; fp32 only under --impl megatron, whose default it is: main_grad in fp32, CPU backend)", "D"},
        {"overlap-param-gather", 0, 0, G_OPTION_ARG_NONE, &a->overlap_param_gather, "Megatron's distributed optimizer (--impl megatron --stage 1): the updated parameters all-gathered bucket by bucket before each bucket's first forward, not after the step", NULL},
        {"overlap", 0, 0, G_OPTION_ARG_NONE, &a->overlap, "overlap_comm on (with --impl megatron: overlap_grad_reduce, gradients in --reduce-bucket-size buckets; without it one bucket)", NULL},
        {"partition-activations", 0, 0, G_OPTION_ARG_NONE, &a->partition_activations, "ZeRO-R Pa: each tensor rank keeps 1/T of each checkpoint, all-gathered over the tensor group before the recompute (with --checkpoint and --mp T)", NULL},
        {"cpu-checkpointing", 0, 0, G_OPTION_ARG_NONE, &a->cpu_checkpointing, "ZeRO-R: each checkpoint copied to host memory in forward and back before the recompute (with --checkpoint; CPU backend)", NULL},
        {"quantized-weights", 0, 0, G_OPTION_ARG_NONE, &a->quantized_weights, "ZeRO++ qwZ: stage-3 all-gathers in block-quantised int8 with fp32 scales (CPU backend)", NULL},
        {"quantized-gradients", 0, 0, G_OPTION_ARG_NONE, &a->quantized_gradients, "ZeRO++ qgZ: stage-3 gradients reduced as int4 with fp32 scales through an all-to-all inside the node, then one across nodes (CPU backend, MPI)", NULL},
        {"hpz-partition-size", 0, 0, G_OPTION_ARG_STRING, &hpz, "ZeRO++ hpZ: backward gathers from secondary partitions over this many ranks of a node (default 1: none)", "N"},
        {"ranks-per-node", 0, 0, G_OPTION_ARG_STRING, &per_node, "Ranks a node holds, for ZeRO++'s node groups on one machine (default: all)", "N"},
        CLI_SEQ_ENTRY(&a->seq),
        CLI_PIPE_ENTRIES(&a->pipe),
        {"attention", 0, 0, G_OPTION_ARG_STRING, &a->attention, "eager (default) or flash: blockwise attention that keeps no s x s tensor, only the log-sum-exp", "K"},
        {"impl", 0, 0, G_OPTION_ARG_STRING, &a->impl, "Whose ZeRO: paper (default), fsdp or deepspeed (DeepSpeed v0.19.6's buckets, grads_in_partition and per-tensor gathers); megatron (Megatron-Core's DDP at stage 0, its distributed optimizer at stage 1) or fsdp2 (fully_shard: stage 3 reshard_after_forward=True, or an int as --hpz-partition-size; stage 2 False; CPU backend)", "I"},
        {"lr", 0, 0, G_OPTION_ARG_STRING, &lr, "Learning rate (default 3e-3)", "LR"},
        {"seed", 0, 0, G_OPTION_ARG_INT64, &a->seed, "Initialisation and data seed", "S"},
        {"reduce-bucket-size", 0, 0, G_OPTION_ARG_STRING, &a->knobs[ZP_KNOB_REDUCE_BUCKET], "Elements per gradient bucket (DeepSpeed default 5e8)", "E"},
        {"allgather-bucket-size", 0, 0, G_OPTION_ARG_STRING, &a->knobs[ZP_KNOB_ALLGATHER_BUCKET], "Elements per all-gather bucket", "E"},
        {"prefetch-bucket-size", 0, 0, G_OPTION_ARG_STRING, &a->knobs[ZP_KNOB_PREFETCH_BUCKET], "stage3_prefetch_bucket_size", "E"},
        {"max-live-parameters", 0, 0, G_OPTION_ARG_STRING, &a->knobs[ZP_KNOB_MAX_LIVE], "stage3_max_live_parameters", "E"},
        {"persistence-threshold", 0, 0, G_OPTION_ARG_STRING, &a->knobs[ZP_KNOB_PERSISTENCE], "stage3_param_persistence_threshold (default 1e5)", "E"},
        {"max-reuse-distance", 0, 0, G_OPTION_ARG_STRING, &a->knobs[ZP_KNOB_MAX_REUSE], "stage3_max_reuse_distance (default 1e9)", "E"},
        {"offload-optimizer", 0, 0, G_OPTION_ARG_STRING, &a->offload_optimizer, "ZeRO-Offload at stages 1-3: fp32 master, Adam moments and fp32 gradients in a tracked host tier (cpu) or swap files (nvme, stage 3; cpu at stages 1-2, as in DeepSpeed), CPU Adam", "DEV"},
        {"offload-param", 0, 0, G_OPTION_ARG_STRING, &a->offload_param, "ZeRO-Infinity at stage 3 (with --offload-optimizer): the 16-bit partition in the host tier (cpu) or a swap file (nvme), fetched before each all-gather", "DEV"},
        {"nvme-path", 0, 0, G_OPTION_ARG_FILENAME, &a->nvme_path, "Directory for the nvme tier's swap files (created, O_DIRECT where the file system allows it, removed at exit); overrides a --schedule's nvme_path; with --microbench, where the NVMe bandwidth is measured (default the temporary directory)", "DIR"},
        {"emulate", 0, 0, G_OPTION_ARG_STRING, &emulate, "One process plays one rank of a world of N: its partitions and buffers, collectives as local copies (run without mpirun)", "N"},
        {"rank", 0, 0, G_OPTION_ARG_STRING, &rank, "The rank --emulate plays (default 0)", "R"},
        {"out", 0, 0, G_OPTION_ARG_FILENAME, &a->out, "Write measured.json here (rank 0, atomically)", "FILE"},
        {"microbench", 0, 0, G_OPTION_ARG_NONE, &a->microbench, "Time GEMMs (a shape grid), attention, every elementwise op class, Adam, a launch, collectives and compute under a collective for zplan calibrate (needs --out; with --emulate N the collectives are the local copies that stand in for them); with --model, also every kernel of that model's plan (--micro-batch, --mp, --checkpoint, --attention)", NULL},
        {"ep", 0, 0, G_OPTION_ARG_STRING, &a->ep, "A mixture of experts: its experts split over EP consecutive data-parallel ranks, ZeRO over the dp / EP holding the same ones (default 1)", "EP"},
        {"capacity-factor", 0, 0, G_OPTION_ARG_STRING, &a->capacity_factor, "A mixture of experts: copies an expert takes from a rank, over the mean (DeepSpeed's capacity_factor; E / top_k drops nothing); required for one", "F"},
        {"mp", 0, 0, G_OPTION_ARG_STRING, &mp, "Tensor-parallel degree T (Megatron's split of each block over T consecutive ranks; data parallelism over the others); with --microbench, the degree whose shapes are timed (default 1)", "T"},
        {"fault-rank", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_INT, &a->fault_rank, "Fault injection: this rank fails", "R"},
        {"fault-step", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_INT, &a->fault_step, "Fault injection: at the start of this step", "N"},
        {"fault-action", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_STRING, &fault_action, "Fault injection: kill (default), stop or sleep", "A"},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("- train a GPT under ZeRO on MPI ranks");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Launch with mpirun -np N build/zreal --model tiny --stage 3 --steps 20 --out m.json;\n"
        "it runs the schedule zplan simulates and writes what it measured. With --emulate N,\n"
        "one process (no mpirun) measures one rank of an N-rank world.");
    double value;
    gboolean ok = zp_check_args_utf8(*argc, *argv, error) &&
                  cli_parse_options(context, argc, argv, error);
    if (ok && *argc > 1)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "unexpected argument '%s'", (*argv)[1]), FALSE);
    if (ok && a->microbench && !a->out)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--microbench needs --out FILE"), FALSE);
    if (ok && !a->microbench && !!a->model == !!a->schedule)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "give one of --model and --schedule"), FALSE);
    if (ok && a->like_simulate && !a->model)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--like-simulate needs --model "
                          "(the model simulate was given)"), FALSE);
    if (ok && mp && a->schedule)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--mp needs --model (a --schedule "
                          "has its own tensor-parallel degree)"), FALSE);
    if (ok && a->schedule_edited && !a->schedule)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--schedule-edited needs --schedule"), FALSE);
    if (ok && a->seq && !a->model)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--seq needs --model (a --schedule "
                          "has its own sequence length)"), FALSE);
    if (ok && !a->backend)
        a->backend = g_strdup("cpu");
    if (ok && strcmp(a->backend, "cpu") != 0 && strcmp(a->backend, "cuda") != 0)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--backend: '%s' is neither cpu nor cuda",
                          a->backend), FALSE);
    struct { const char *text, *flag; double min, max; int *out; } ints[] = {
        {stage, "--stage", 0, 3, &a->stage}, {micro, "--micro-batch", 1, 1 << 20, &a->micro_batch},
        {accum, "--grad-accum", 1, 1 << 20, &a->grad_accum}, {steps, "--steps", 0, 1 << 24, &a->steps},
        {emulate, "--emulate", 1, 1 << 20, &a->emulate},
        {hpz, "--hpz-partition-size", 1, 1 << 16, &a->hpz},
        {per_node, "--ranks-per-node", 1, 1 << 16, &a->ranks_per_node},
        {mp, "--mp", 1, 1024, &a->mp}};
    for (size_t i = 0; ok && i < G_N_ELEMENTS(ints); i++)
        if (ints[i].text && (ok = zp_parse_number(ints[i].text, ints[i].flag, ints[i].min,
                                                  ints[i].max, TRUE, &value, error)))
            *ints[i].out = (int)value;
    if (ok && lr && (ok = zp_parse_number(lr, "--lr", 1e-9, 10, FALSE, &value, error)))
        a->lr = value;
    if (ok && rank && !a->emulate)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--rank needs --emulate N"), FALSE);
    if (ok && rank && (ok = zp_parse_number(rank, "--rank", 0, a->emulate - 1, TRUE, &value, error)))
        a->emulate_rank = (int)value;
    for (int i = 0; ok && fault_action && fault_actions[i]; i++)
        if (strcmp(fault_action, fault_actions[i]) == 0) {
            a->fault_action = (FaultAction)i;
            g_clear_pointer(&fault_action, g_free);
        }
    if (ok && fault_action)
        ok = (g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--fault-action: '%s' is not kill, "
                          "stop or sleep", fault_action), FALSE);
    if (ok && a->out)
        ok = zp_check_out_path(a->out, "--out", error);
    g_option_context_free(context);
    g_free(stage), g_free(micro), g_free(accum), g_free(steps), g_free(lr);
    g_free(emulate), g_free(rank), g_free(fault_action), g_free(hpz), g_free(per_node);
    g_free(mp);
    return ok;
}

/* An emulating process is one process: launched under mpirun with others, it would only
 * repeat the same measurement, so that is refused. */
static gboolean check_emulate_launch(const Args *a, GError **error)
{
    const char *world = g_getenv("OMPI_COMM_WORLD_SIZE");
    if (!a->emulate || !world || atoi(world) <= 1)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "--emulate runs as one process; start it without mpirun (%s processes here)",
                world);
    return FALSE;
}

static void free_args(Args *a)
{
    cli_pipe_free(&a->pipe);
    g_free(a->model), g_free(a->schedule), g_free(a->out), g_free(a->backend);
    g_free(a->ep), g_free(a->capacity_factor);
    g_free(a->like_simulate);
    g_free(a->attention), g_free(a->seq), g_free(a->offload_optimizer), g_free(a->impl);
    g_free(a->reduce_dtype);
    g_free(a->offload_param), g_free(a->nvme_path);
    for (int k = 0; k < ZP_KNOB_N; k++)
        g_free(a->knobs[k]);
}

int main(int argc, char **argv)
{
    Args a;
    GError *error = NULL;
    RealBackend *be = NULL;
    RealComm *comm = NULL;
    gboolean every_rank = FALSE; /* a failure every rank reaches alike (train) */
    /* Flags first: an emulating process never starts MPI. */
    gboolean ok = parse_args(&argc, &argv, &a, &error) && check_emulate_launch(&a, &error);
    int rank = a.emulate_rank;
    /* The whole process is watched, from before MPI_Init to after MPI_Finalize: a rank that
     * stops anywhere ends the job with one line naming it (real_watch.h). */
    double timeout_s = 0;
    if (ok && !a.emulate)
        ok = real_comm_timeout_s(&timeout_s, &error) && real_watch_start(timeout_s, &error) &&
             real_watch_test_stop(REAL_WATCH_INIT, &error);
    if (!ok) {
        const char *mpi_rank = g_getenv("OMPI_COMM_WORLD_RANK");
        char *line = cli_one_line(error->message);
        fprintf(stderr, "zreal rank %s: %s\n", mpi_rank ? mpi_rank : "0", line);
        g_free(line);
        g_clear_error(&error);
        free_args(&a);
        return 1;
    }
    if (!a.emulate) {
        MPI_Init(&argc, &argv);
        real_watch_phase(REAL_WATCH_RUN);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    }
    set_blas_threads();
    ok = make_backend(&a, &be, &comm, &error);
    if (ok && a.microbench)
        ok = microbench(&a, be, comm, &error);
    else if (ok)
        ok = train(&a, be, comm, &every_rank, &error);
    /* One line naming the rank. A peer's failure that every rank sees (a collective timed out,
     * a peer died), or a refusal every rank reaches alike (the plan, its schedule, what the
     * engine executes: mpirun -np 4 printed the same line four times), is said by one rank
     * only; the others wait a moment for it to be said. */
    if (!ok && error && (error->domain == REAL_COMM_ERROR || every_rank) &&
        !real_watch_claim_report())
        g_usleep(QUIET_RANK_WAIT_US);
    else if (!ok) {
        add_device_error(be, error);
        char *line = cli_one_line(error ? error->message : "failed");
        fprintf(stderr, "zreal rank %d: %s\n", rank, line);
        g_free(line);
    }
    /* Everything is freed, except a device backend after a failure: its streams may be stuck
     * in the operation that failed, and tearing them down could block; exit releases them. */
    const gboolean teardown = ok || !be || !be->synchronize;
    g_clear_error(&error);
    if (comm && teardown)
        comm->destroy(comm);
    if (be && teardown)
        be->destroy(be);
    free_args(&a);
    int world = 1;
    if (!a.emulate)
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    /* A failed rank of a job aborts it, so no peer waits forever in a collective; a lone
     * process just ends. */
    if (!ok && world > 1)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (!a.emulate) {
        real_watch_phase(REAL_WATCH_FINALIZE);
        real_watch_test_stop(REAL_WATCH_FINALIZE, NULL); /* parsed before MPI_Init */
        MPI_Finalize();
        real_watch_finish();
    }
    return ok ? 0 : 1;
}
