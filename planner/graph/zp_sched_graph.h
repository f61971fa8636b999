/* zp_sched_graph: the per-rank schedule of one training step — compute, collective, alloc and
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
#ifndef ZP_SCHED_GRAPH_H
#define ZP_SCHED_GRAPH_H

#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>
#include <stdint.h>

/* ZP_OP_P2P: a pipeline send of one micro-batch's activations (forward) or their gradients
 * (backward) to the neighbouring stage; the op that consumes it on that stage depends on it.
 * ZP_OP_TRANSFER: an offload copy over the host link or to/from NVMe (rules/zp_offload.c). */
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

/* Offload transfers (ZeRO-Offload, ZeRO-Infinity; planner/rules/zp_offload.c decides them): over
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
    /* A mixture of experts' sparse block (zp_ep.h): its block_fwd / recompute / block_bwd op
     * is the dense part (attention, norms, shared experts, the router, its top-k and the
     * permutation of the token copies into expert order, and their backward), then: */
    ZP_COMP_EXPERT_FWD,  /* the routed experts' GEMMs over the tokens this rank's experts
                          * received (the busiest rank's under --expert-skew) */
    ZP_COMP_EXPERT_BWD,  /* their backward: input and weight gradients (2x the forward) */
    ZP_COMP_UNPERMUTE_FWD, /* after the combine: the returned copies put back in token order and
                            * summed with the routing weights (memory-bound) */
    ZP_COMP_UNPERMUTE_BWD, /* its backward, before the backward's dispatch: the copies'
                            * gradients and the routing weights' */
    ZP_COMP_N
} ZpComputeKind;

typedef enum {
    ZP_COLL_ALLREDUCE,
    ZP_COLL_REDUCE_SCATTER,
    ZP_COLL_ALLGATHER,
    ZP_COLL_ALLTOALL, /* qgZ: each rank sends (n-1)/n of S, a 1/n slice to every member */
    /* A mixture of experts' all-to-all over the EP group (ZP_GROUP_EP), as NCCL runs it:
     * ncclSend/ncclRecv of one slice to each member at once (point-to-point; no ring, no tree).
     * S (`bytes`) is the rank's whole send buffer, its own slice included: S/n to each member,
     * (n-1)/n S over the wire, as ZP_COLL_ALLTOALL. `unit` is the sparse block, `elems`
     * S / elem_bytes, elem_offset 0, buffer -1. Named by direction: */
    ZP_COLL_EP_DISPATCH, /* token side to the experts: the permuted token copies (forward,
                          * recomputed forward), the combine's output gradients (backward) */
    ZP_COLL_EP_COMBINE,  /* experts back to the token side: the experts' outputs (forward),
                          * their inputs' gradients (backward) */
    ZP_COLL_N
} ZpCollKind;

/* The data-parallel and tensor-parallel groups; ZP_GROUP_PP names a rank's pipeline
 * neighbours (p2p ops), not a collective's group; then ZeRO++'s subgroups of the data-parallel
 * group (zp_zeropp_group_ranks gives their sizes): hpZ's secondary partition (HPZ), a node's
 * data-parallel ranks (NODE) and the ranks of one local index across nodes (XNODE); then
 * expert parallelism's subgroups of the data-parallel group: EP consecutive data-parallel ranks
 * (EP: the experts split over them, the all-to-alls) and the dp/EP ranks holding the same
 * experts, EP data-parallel ranks apart (EDP: ZeRO over it for the expert parameters), as
 * DeepSpeed's groups._create_expert_and_data_parallel and Megatron-Core's parallel_state
 * (order tp-cp-ep-dp-pp) carve them (with whole experts, ZpExpertConfig.etp 1, EP consecutive
 * ranks of the stage's tp x dp grid and the ranks EP apart in it); and the TP x EP group the
 * all-gather dispatcher gathers every token over (TPEP: parallel_state's
 * _EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP, the expert tensor ranks of each of the EP group's;
 * with a pipeline between zplan's tensor and dp ranks, the tensor ranks of several dp ranks
 * are runs, ZpCommGroup.run). One rank each without experts. */
typedef enum {
    ZP_GROUP_DP,
    ZP_GROUP_TP,
    ZP_GROUP_PP,
    ZP_GROUP_HPZ,
    ZP_GROUP_NODE,
    ZP_GROUP_XNODE,
    ZP_GROUP_EP,
    ZP_GROUP_EDP,
    ZP_GROUP_TPEP,
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
    ZP_MEM_EP_BUFFERS,      /* a sparse block's router outputs and its all-to-alls' send and
                             * receive buffers (zp_ep_activations) */
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
    /* What only some kinds have, sharing one place (a deep model's millions of ops are written
     * once, and every byte of them is a fresh page: 96 bytes an op without it). Read a member
     * only on an op of its kind: a compute op's FLOPs are a collective's range. */
    union {
        struct { /* ZP_OP_COMPUTE */
            double flops;      /* floating-point operations */
            double gemm_flops; /* FLOPs of its typical GEMM (sets the GEMM efficiency) */
            double attn_flops; /* those of `flops` a fused attention kernel does */
            double mem_bytes;  /* bytes moved by its memory-bound kernels */
        };
        struct { /* ZP_OP_COLLECTIVE and ZP_OP_P2P */
            uint64_t elem_offset; /* collective: first element of the flat range it covers */
            uint64_t elems;       /* elements covered (S / element size) */
            uint32_t peer;        /* p2p: the stage it sends to */
        };
    };
    double bytes;      /* collective: whole array size S; alloc/free, p2p, transfer: bytes;
                        * compute: bytes over the host link (host_copy) */
    uint32_t dep_start, n_deps; /* dependencies: deps[dep_start .. dep_start+n_deps) */
} ZpOp;
_Static_assert(sizeof(ZpOp) == 72, "ZpOp: 72 bytes, its kinds' fields in one union");

/* A communicator: the world cut into world / ranks groups of `ranks` members. A group is one
 * run of members `stride` apart (members first + i * stride, first = b * ranks * stride + o,
 * o < stride), or, where `run` is set (1 < run < ranks), ranks / run such runs of `run`
 * members, the runs `run_stride` apart: member i is first + (i % run) * stride +
 * (i / run) * run_stride, with run_stride a multiple of run * stride. The second shape is
 * Megatron's expert groups under a pipeline: t tensor ranks of each of EP / t data-parallel
 * ranks, which zplan numbers tensor rank, stage, then dp (zp_sched_groups). Ops name a
 * communicator by its index in the schedule's table. */
#define ZP_SCHED_MAX_GROUPS 16
typedef struct {
    char name[16];
    int ranks, stride;
    int run, run_stride; /* 0, 0: one run */
} ZpCommGroup;

/* The members of one run: all of them in a group of one run. */
static inline int64_t zp_group_run(const ZpCommGroup *g)
{
    return g->run > 1 && g->run < g->ranks ? g->run : g->ranks;
}
/* Where the runs of a group of several lie: run_stride apart, else one run's span. */
static inline int64_t zp_group_run_stride(const ZpCommGroup *g)
{
    return zp_group_run(g) < g->ranks ? g->run_stride : (int64_t)g->ranks * g->stride;
}
/* The ranks a group's pattern repeats over: a multiple of it is cut into whole groups (with
 * first's offsets below it). */
static inline int64_t zp_group_span(const ZpCommGroup *g)
{
    return zp_group_run_stride(g) * (g->ranks / zp_group_run(g));
}
/* Member i of the group whose first member is first. */
static inline int64_t zp_group_member(const ZpCommGroup *g, int64_t first, int64_t i)
{
    const int64_t run = zp_group_run(g);
    return first + i % run * g->stride + i / run * zp_group_run_stride(g);
}
/* The number of rank's group, 0 to world / ranks - 1: rank with its two digits (place in its
 * run, its run's place) taken out, mixed radix. zp_group_first is its inverse. */
static inline int64_t zp_group_index(const ZpCommGroup *g, int64_t rank)
{
    const int64_t s = g->stride, run_span = zp_group_run(g) * s;
    const int64_t gaps = zp_group_run_stride(g) / run_span, span = zp_group_span(g);
    return rank % s + s * (rank / run_span % gaps + gaps * (rank / span));
}
static inline int64_t zp_group_first(const ZpCommGroup *g, int64_t index)
{
    const int64_t s = g->stride, run_span = zp_group_run(g) * s;
    const int64_t gaps = zp_group_run_stride(g) / run_span, span = zp_group_span(g);
    return index % s + run_span * (index / s % gaps) + span * (index / s / gaps);
}
/* A group of `run` members stride apart in each of `runs` runs run_stride apart, as one run
 * where the runs abut (run * stride == run_stride) or there is one. */
static inline ZpCommGroup zp_group_runs(int run, int stride, int runs, int run_stride)
{
    if (runs <= 1 || run <= 1 || (int64_t)run * stride == run_stride)
        return run <= 1 ? (ZpCommGroup){.ranks = runs, .stride = run_stride}
                        : (ZpCommGroup){.ranks = run * runs, .stride = stride};
    return (ZpCommGroup){.ranks = run * runs, .stride = stride, .run = run,
                         .run_stride = run_stride};
}
/* Whether g tiles a world of `world` ranks: a positive shape whose span divides the world
 * (runs: run divides ranks, run_stride a multiple of run * stride). */
static inline gboolean zp_group_tiles(const ZpCommGroup *g, int64_t world)
{
    if (g->ranks < 1 || g->stride < 1)
        return FALSE;
    const int64_t run = zp_group_run(g);
    if (run < g->ranks && (g->ranks % run != 0 || g->run_stride < 1 ||
                           g->run_stride % (run * g->stride) != 0))
        return FALSE;
    return zp_group_span(g) <= world && world % zp_group_span(g) == 0;
}

/* zp_group_tiles, else one line `what`: the shape and why it does not tile the world. */
gboolean zp_group_check(const ZpCommGroup *g, int64_t world, const char *what, GError **error);

/* A schedule file's "digest" against its ops (zp_sched_read_json). */
typedef enum {
    ZP_DIGEST_ABSENT,   /* built, or a file without one (older files, hand-written ones) */
    ZP_DIGEST_MATCH,    /* the ops are those zplan wrote */
    ZP_DIGEST_MISMATCH, /* the ops were edited after zplan wrote the file */
} ZpSchedDigest;

/* What the rules compute from a schedule's model and layout several times a build, kept with
 * it: zp_impl_tensors' answer (ZpImplTensor), and the layout it was for (unit offsets, then
 * unit elements), which tells when it is stale (each pipeline stage lays its units out anew);
 * and what it reads of the model alone, which no stage changes: the model's tensors
 * (zp_model_tensors) and what their names and units say (zp_impl.c ZpTensorNote, one an
 * entry and one past them, in one block), NULL until asked. With impl_tensors, for DeepSpeed's
 * stage 3 (zp_impl_tensor_part_at): each tensor's offset and the partition elements before it,
 * tensors + 1 of each (part_before[tensors] the whole), NULL until asked. */
typedef struct ZpTensorNote ZpTensorNote;
typedef struct {
    GArray *impl_tensors;
    uint64_t *layout;
    int n_units;
    uint64_t *part_offset;
    double *part_before;
    GArray *model_tensors;
    ZpTensorNote *tensor_notes;
} ZpSchedMemo;

typedef struct {
    ZpModel model;
    ZpPlan plan;
    int world;            /* dp * mp */
    ZpSchedDigest digest; /* read from a file: whether its ops are zplan's */
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
    ZpSchedMemo *memo; /* owned, while zp_sched_build builds it; NULL otherwise */
} ZpSchedule;

void zp_sched_free(ZpSchedule *sched);
/* Drops what the build kept (ZpSchedMemo): zp_sched_build's end. */
void zp_sched_memo_free(ZpSchedule *sched);

/* A memo held apart from a schedule (zp_sched_gathered_elems_kept's): drops its layout's
 * tensors (impl_tensors, layout), keeping the model's table; or frees it all (NULL: nothing). */
void zp_sched_memo_drop_layout(ZpSchedMemo *memo);
void zp_sched_memo_destroy(ZpSchedMemo *memo);

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

/* {"params": B, ..., "workspace": B}: one figure per memory category (a json_t *). */
void *zp_sched_categories_json(const double bytes[ZP_MEM_N]);

const char *zp_sched_compute_name(ZpComputeKind kind);
const char *zp_sched_op_kind_name(ZpOpKind kind);
const char *zp_sched_coll_name(ZpCollKind kind);
const char *zp_sched_mem_name(ZpMemCategory category);
const char *zp_sched_stream_name(ZpStream stream);
const char *zp_sched_transfer_name(ZpTransferKind kind);

/* The names above as NULL-terminated tables in enum order (the JSON reader's and writer's),
 * with the p2p directions' and the built-in groups'. */
extern const char *const zp_sched_compute_names[ZP_COMP_N + 1];
extern const char *const zp_sched_coll_names[ZP_COLL_N + 1];
extern const char *const zp_sched_mem_names[ZP_MEM_N + 1];
extern const char *const zp_sched_stream_names[ZP_STREAM_N + 1];
extern const char *const zp_sched_kind_names[];
extern const char *const zp_sched_p2p_names[ZP_P2P_N + 1];
extern const char *const zp_sched_transfer_names[ZP_XFER_N + 1];
extern const char *const zp_sched_group_names[ZP_GROUP_N + 1];

#endif
