/* zp_sched: the per-rank schedule of one training step — compute, collective, alloc and
 * free ops with dependencies. It is the contract: sim/ times these ops, real/ runs them.
 *
 * Every data-parallel and tensor-parallel rank runs the same op list (ZeRO pads partitions
 * so that all ranks hold equal sizes), so one list describes every rank; the simulator
 * replicates it per rank (--explicit) or folds identical ranks into one. With pipeline
 * stages (zp_pipe) each stage is a rank class with its own ops (those with its `stage`); an
 * op may depend on another stage's p2p send.
 *
 * Ops run on streams, in list order within a stream (like CUDA streams): an op starts when
 * it is the next op of its stream, the previous op of its stream has finished, and all its
 * dependencies have finished. Alloc and free ops take no time and run on no stream; they
 * happen as soon as their dependencies are done. A collective op starts on all members of
 * its group together, when every member has reached it. */
#ifndef ZP_SCHED_H
#define ZP_SCHED_H

#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>
#include <stdint.h>

/* ZP_OP_P2P: a pipeline send of one micro-batch's activations (forward) or their gradients
 * (backward) to the neighbouring stage; the op that consumes it on that stage depends on it.
 * ZP_OP_TRANSFER: an offload copy over the host link or to/from NVMe (planner/zp_offload.c). */
typedef enum {
    ZP_OP_COMPUTE, ZP_OP_COLLECTIVE, ZP_OP_ALLOC, ZP_OP_FREE, ZP_OP_P2P, ZP_OP_TRANSFER
} ZpOpKind;

/* A p2p op's direction (its sub): to the next stage (activations) or the previous (gradients).
 * Interleaved chunks wrap: the last stage sends chunk v's output to stage 0's chunk v + 1.
 * ZP_P2P_TIED: a tied word embedding's gradient (this rank's vocabulary rows), which the first
 * and last stages exchange after the flush and each adds to its own: the all-reduce of a
 * two-rank embedding group (Megatron's _allreduce_word_embedding_grads, DeepSpeed's
 * ReduceTiedGrads), with the same bytes, S each way. */
typedef enum { ZP_P2P_SEND_NEXT, ZP_P2P_SEND_PREV, ZP_P2P_TIED, ZP_P2P_N } ZpP2pKind;

/* Offload transfers (ZeRO-Offload, ZeRO-Infinity; planner/zp_offload.c decides them): over
 * the GPU's host link, or between host memory and the node's NVMe. `bytes` is what this rank
 * moves. */
typedef enum {
    ZP_XFER_D2H,        /* GPU to host: gradient slices as buckets are reduced */
    ZP_XFER_H2D,        /* host to GPU: updated 16-bit parameters, offloaded partitions */
    ZP_XFER_NVME_READ,  /* NVMe to host: swapped optimizer states, gradients, parameters */
    ZP_XFER_NVME_WRITE, /* host to NVMe */
    ZP_XFER_N
} ZpTransferKind;

/* Where a model state lives: the GPU, the node's host memory, the node's NVMe. */
typedef enum { ZP_TIER_GPU, ZP_TIER_CPU, ZP_TIER_NVME, ZP_TIER_N } ZpTier;

typedef enum {
    ZP_COMP_EMBED_FWD,   /* token + position embedding of one micro-batch */
    ZP_COMP_BLOCK_FWD,   /* one transformer block forward */
    ZP_COMP_HEAD,        /* final norm, LM head, loss and their backward */
    ZP_COMP_RECOMPUTE,   /* block forward again before its backward (checkpointing) */
    ZP_COMP_BLOCK_BWD,   /* one block backward (2x the forward's FLOPs) */
    ZP_COMP_EMBED_BWD,   /* embedding backward */
    ZP_COMP_OPTIMIZER,   /* Adam on this rank's partition: memory-bound */
    ZP_COMP_CPU_OPTIMIZER, /* CPU Adam on the offloaded partition (mem_bytes at the CPU rate) */
    ZP_COMP_HOST_COPY,   /* a synchronous copy over the host link (Pa+cpu's checkpoints):
                          * its `bytes`, at the hwprofile's host_link_bytes_per_s */
    ZP_COMP_QUANTIZE,    /* ZeRO++'s memory-bound (de)quantisation kernels (zp_zeropp) */
    ZP_COMP_UNPACK,      /* DeepSpeed's stage 3: a coalesced all-gather's parameters copied out
                          * of its flat buffer (memory-bound, on the gather stream) */
    ZP_COMP_N
} ZpComputeKind;

typedef enum {
    ZP_COLL_ALLREDUCE,
    ZP_COLL_REDUCE_SCATTER,
    ZP_COLL_ALLGATHER,
    ZP_COLL_ALLTOALL, /* qgZ: each rank sends (n-1)/n of S, a 1/n slice to every member */
    ZP_COLL_N
} ZpCollKind;

/* The data-parallel and tensor-parallel groups; ZP_GROUP_PP names a rank's pipeline
 * neighbours (p2p ops), not a collective's group; then ZeRO++'s subgroups of the data-parallel
 * group (zp_zeropp_group_ranks gives their sizes): hpZ's secondary partition (HPZ), a node's
 * data-parallel ranks (NODE) and the ranks of one local index across nodes (XNODE). */
typedef enum {
    ZP_GROUP_DP,
    ZP_GROUP_TP,
    ZP_GROUP_PP,
    ZP_GROUP_HPZ,
    ZP_GROUP_NODE,
    ZP_GROUP_XNODE,
    ZP_GROUP_N
} ZpGroup;

typedef enum {
    ZP_STREAM_COMPUTE, /* kernels */
    ZP_STREAM_DP,      /* data-parallel collectives (NCCL's own stream) */
    ZP_STREAM_TP,      /* tensor-parallel all-reduces */
    ZP_STREAM_PP,      /* pipeline sends (asynchronous, as isend) */
    ZP_STREAM_HOST,    /* copies over the GPU's host link (offload) */
    ZP_STREAM_NVME,    /* asynchronous NVMe reads and writes (ZeRO-Infinity's aio) */
    ZP_STREAM_CPU,     /* the host's optimizer step (CPU Adam) */
    ZP_STREAM_N
} ZpStream;

/* Memory categories: what a buffer is, as the real executor's tracking allocator counts it. */
typedef enum {
    ZP_MEM_PARAMS,          /* 16-bit parameters this rank keeps (all, or its partition) */
    ZP_MEM_GRADS,           /* 16-bit gradients this rank keeps */
    ZP_MEM_MASTER,          /* fp32 master weights of the partition */
    ZP_MEM_ADAM_M,          /* fp32 first moment */
    ZP_MEM_ADAM_V,          /* fp32 second moment */
    ZP_MEM_GATHERED_PARAMS, /* stage 3: a unit's gathered parameters, or the persistent ones */
    ZP_MEM_BUCKETS,         /* gradient reduce buckets and parameter all-gather buckets */
    ZP_MEM_ACTIVATIONS,     /* what a block keeps for its backward */
    ZP_MEM_CHECKPOINTS,     /* block inputs kept under activation checkpointing */
    ZP_MEM_WORKSPACE,       /* logits and other scratch */
    ZP_MEM_SECONDARY_PARAMS, /* hpZ: the 16-bit secondary partitions inside the node */
    ZP_MEM_N
} ZpMemCategory;

typedef struct {
    uint8_t kind;      /* ZpOpKind */
    uint8_t sub;       /* ZpComputeKind, ZpCollKind or ZpTransferKind; alloc/free: ZpMemCategory */
    uint8_t stream;    /* ZpStream (compute and collective ops) */
    uint8_t group;     /* ZpGroup (collectives; ZP_GROUP_PP for p2p) */
    uint8_t module;    /* compute: 1 + the block module (ZpBlockModule) of a block op split
                        * per module (zp_op_module); 0: the whole op */
    int32_t unit;      /* model unit the op concerns (-1: none / the whole partition) */
    int32_t micro;     /* micro-step, 0..grad_accum-1 (-1: after the last) */
    int32_t buffer;    /* alloc/free: buffer id, or -1: the category's step-long state (a
                        * free of all of it, allocs taking it back piece by piece: DeepSpeed's
                        * persistent copies around the step); collective: the bucket it
                        * reduces or -1 */
    uint32_t stage;    /* the pipeline stage (rank class) that runs it; 0 without a pipeline */
    uint32_t peer;     /* p2p: the stage it sends to (0 for other ops) */
    double flops;      /* compute: floating-point operations */
    double gemm_flops; /* compute: FLOPs of its typical GEMM (sets the GEMM efficiency) */
    double attn_flops; /* compute: those of `flops` a fused attention kernel does */
    double mem_bytes;  /* compute: bytes moved by its memory-bound kernels */
    double bytes;      /* collective: whole array size S; alloc/free, p2p, transfer: bytes;
                        * compute: bytes over the host link (host_copy) */
    uint64_t elem_offset; /* collective: first element of the flat range it covers */
    uint64_t elems;       /* collective: elements covered (S / element size) */
    uint32_t dep_start, n_deps; /* dependencies: deps[dep_start .. dep_start+n_deps) */
} ZpOp;

/* A communicator: the world cut into world / ranks groups of `ranks` members `stride` apart
 * (members first + i * stride, first = b * ranks * stride + o, o < stride). Ops name it by
 * its index in the schedule's table. */
#define ZP_SCHED_MAX_GROUPS 16
typedef struct {
    char name[16];
    int ranks, stride;
} ZpCommGroup;

typedef struct {
    ZpModel model;
    ZpPlan plan;
    int world;            /* dp * mp */
    /* The communicators ops name by index: dp (ZP_GROUP_DP) and tp (ZP_GROUP_TP) and, in a
     * graph read from a file, any others it declares (the world, node groups, pipeline
     * neighbours). n_groups 0: dp and tp as the plan places them (zp_sched_groups). */
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    int n_groups;
    double elem_bytes;    /* 16-bit or 32-bit working precision */
    GArray *ops;          /* ZpOp */
    GArray *deps;         /* uint32_t op indices */
    /* Model states each rank holds on its GPU for the whole step (allocated before op 0). */
    double state_bytes[ZP_MEM_N];
    /* With offload, what each rank holds in the node's host memory and on its NVMe for the
     * whole step (zp_offload_tiers' CPU and NVMe rows; Pa+cpu's checkpoints: the peak of the
     * slices its host copies hold); zero otherwise. With a pipeline, the most any stage's
     * ranks hold, and stage k's own in stage_host_bytes[k * ZP_MEM_N + c] (a stage's view
     * holds its own). */
    double host_bytes[ZP_MEM_N], nvme_bytes[ZP_MEM_N];
    /* Flat layout: unit u occupies [unit_offset[u], unit_offset[u] + unit_elems[u]) of the
     * concatenated parameter space; stage 3 partitions each unit on its own, padded to a
     * multiple of dp; stages 0-2 partition the whole flat space padded to a multiple of dp. */
    uint64_t *unit_offset, *unit_elems;
    uint64_t total_elems, padded_elems, partition_elems;
    int n_units;
    /* Pipeline stages: the ops of stage k carry stage = k (one op list per rank class, in
     * one array), and stage k's ranks hold stage_state_bytes[k * ZP_MEM_N + c] of category c
     * all step. Without a pipeline stages = 1 and that is state_bytes. With one, state_bytes
     * and the layout above are the last stage's. */
    int stages;
    double *stage_state_bytes, *stage_host_bytes;
    /* Each stage's unit_elems ([stage * n_units + u]; NULL without a pipeline), and in a
     * stage's view (zp_sched_stage_view) the stage whose layout and states the fields above
     * hold, 0 otherwise. */
    uint64_t *stage_unit_elems;
    int view_stage;
} ZpSchedule;

/* The most micro-steps x units (layers + 2) one schedule holds: a schedule lists every
 * micro-step's ops (about 6 to 13 per unit), so this bounds a build and its simulation to
 * about 1.5 s and 1 GB (stage 3 with checkpointing, the most ops per unit). Larger plans are
 * refused naming grad-accum. */
#define ZP_SCHED_MAX_UNIT_STEPS 5e5

/* Builds the schedule of one optimizer step (grad_accum micro-steps) for a rank.
 * The model must have an architecture. Fails naming the plan field that is invalid. */
ZpSchedule *zp_sched_build(const ZpModel *model, const ZpPlan *plan, GError **error);
void zp_sched_free(ZpSchedule *sched);

/* What a rank of pipeline stage `stage` (0 <= stage < sched->stages) executes: the same ops
 * (shared; a rank runs those with op->stage == stage and receives what the others send it),
 * with that stage's layout, padding and model states in place of the last stage's. Free it
 * with zp_sched_free. */
ZpSchedule *zp_sched_stage_view(const ZpSchedule *sched, int stage);

static inline const ZpOp *zp_sched_op(const ZpSchedule *s, uint32_t i)
{
    return &g_array_index(s->ops, ZpOp, i);
}
/* The block module a compute op computes, -1 for a whole op. */
static inline int zp_op_module(const ZpOp *op)
{
    return (int)op->module - 1;
}
static inline const uint32_t *zp_sched_deps(const ZpSchedule *s, const ZpOp *op)
{
    return &g_array_index(s->deps, uint32_t, op->dep_start);
}

/* The compute ops of one step in closed form, as zp_sched_build emits them: every op of a
 * kind costs the same, so a kind is its count and one op's cost (a block computed module by
 * module, DeepSpeed's stage 3, counts as one op of its kind: its modules' ops sum to it). O(1) and allocation-free:
 * the planner's search bounds a step's compute time with it a million times a second. */
typedef struct {
    uint64_t count;    /* ops of this kind in the step */
    double flops;      /* each op's */
    double gemm_flops; /* each op's typical GEMM */
    double attn_flops; /* each op's FLOPs in the fused attention kernel */
    double mem_bytes;  /* each op's memory-bound bytes */
    double host_bytes; /* each op's bytes over the host link (host_copy) */
} ZpComputeOps;

/* ZeRO++'s quantize kernels are not among them: the search plans no ZeRO++. */
void zp_sched_compute_ops(const ZpModel *model, const ZpPlan *plan,
                          ZpComputeOps ops[ZP_COMP_N]);

/* The elements one rank's optimizer steps without a pipeline, as zp_sched_build lays them
 * out (before optimizer offload takes its share): every parameter at stage 0, the padded
 * total's 1/dp at stages 1-2, the sum of each unit's padded 1/dp at stage 3. */
uint64_t zp_sched_optimizer_elems(const ZpModel *model, const ZpPlan *plan);

/* A unit's elements padded to a multiple of dp (how stage 3 partitions it), and whether
 * stage 3 keeps the unit whole on every rank (at or below the persistence threshold, for an
 * implementation that decides persistence per unit: the paper's). */
uint64_t zp_sched_unit_padded(const ZpSchedule *sched, int unit);
gboolean zp_sched_unit_persistent(const ZpSchedule *sched, int unit);

/* DeepSpeed's stage 3 with stage3_use_all_reduce_for_fetch_params: whether a coalesced call of
 * n parameters over `group` fetches them by an all-reduce of a zeroed flat buffer of their
 * padded sizes, each rank's slices at its place (partition_parameters.py
 * all_gather_coalesced -> _all_gather_coalesced: more than one parameter, not quantised
 * (qwZ), not from hpZ's secondary partition); otherwise it all-gathers. */
gboolean zp_sched_fetch_allreduce(const ZpPlan *plan, guint n, ZpGroup group);

/* Stage 3: the group a fetch for position use_pos gathers over: with hpZ a backward use
 * gathers inside hpZ's group from the secondary partition (DeepSpeed's
 * all_gather_coalesced with use_secondary_tensor), every other over the data-parallel group. */
ZpGroup zp_sched_fetch_group(const ZpSchedule *sched, int use_pos);

/* Whether a collective fetches parameters: an all-gather, or at stage 3 a data-parallel
 * all-reduce (stage 3 reduce-scatters gradients, so that is a fetch_allreduce call). */
gboolean zp_sched_coll_fetches(const ZpSchedule *sched, const ZpOp *op);

/* Per-rank model-state bytes with the schedule's padding (what real/ measures exactly):
 * stage 3 pads every unit to a multiple of dp, stages 0-2 pad the flat space. */
double zp_sched_model_state_bytes(const ZpSchedule *sched);

/* Bytes this rank sends in the step's collectives (ring algorithms): all-reduce
 * 2(n-1)/n S, reduce-scatter, all-gather and all-to-all (n-1)/n S, per its group's size n
 * (zp_zeropp_group_ranks). */
double zp_sched_comm_bytes(const ZpSchedule *sched, ZpGroup group);

/* The schedule's communicators into out, returning how many: its table, or dp (dp ranks mp
 * apart) and tp (mp consecutive ranks) when it has none. */
int zp_sched_groups(const ZpSchedule *sched, ZpCommGroup out[ZP_SCHED_MAX_GROUPS]);

/* JSON round trip (`zplan schedule --out`); the reader validates every field, since zreal
 * executes what it reads: an --impl paper schedule through zp_schedcheck (it may be edited),
 * one of another implementation by equality with the builder's ops for its model and plan. */
gboolean zp_sched_write_json(const ZpSchedule *sched, const char *path, GError **error);
ZpSchedule *zp_sched_read_json(const char *path, GError **error);

/* A schedule file as an op graph, for the simulator: no model needed. It needs "format",
 * "world", "groups" (dp and tp: their ranks and stride, tp-fastest; then any other
 * communicators, each a name, ranks and a stride whose product divides the world) and "ops"
 * (kind, op or category, group for collectives by name, flops or bytes, deps: indices of any
 * ops); a collective of a group other than dp and tp runs on the dp stream unless "stream"
 * says otherwise. "attn_flops" need the "model" (a fused kernel's rate depends on its head
 * dimension and sequence length) and a "plan" with a fused attention kernel. "state_bytes",
 * "precision" (or a "plan") and a "model" are optional, the planner's layout keys ignored.
 * Fails with one error naming the op index and key at fault: a dangling dependency, a
 * dependency cycle, an unknown group, a negative size. A file `zplan schedule --out` wrote
 * reads back to the same ops, so it simulates exactly as the plan does. */
ZpSchedule *zp_sched_read_graph(const char *path, GError **error);

/* {"params": B, ..., "workspace": B}: one figure per memory category (a json_t *). */
void *zp_sched_categories_json(const double bytes[ZP_MEM_N]);

const char *zp_sched_compute_name(ZpComputeKind kind);
const char *zp_sched_op_kind_name(ZpOpKind kind);
const char *zp_sched_coll_name(ZpCollKind kind);
const char *zp_sched_mem_name(ZpMemCategory category);
const char *zp_sched_stream_name(ZpStream stream);
const char *zp_sched_transfer_name(ZpTransferKind kind);

#endif
