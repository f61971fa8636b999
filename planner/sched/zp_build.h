/* zp_build: what the schedule builder's files share (sched/zp_build_*.c, zp_sched.c): the
 * builder's state and its records, and the entry points each file offers the others. */
#ifndef ZP_BUILD_H
#define ZP_BUILD_H

#include "zp_cost_kernels.h"
#include "zp_ep.h"
#include "zp_impl.h"
#include "zp_pipe.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"
#include "zp_util.h"
#include "zp_zeror.h"

#include <glib.h>
#include <stdint.h>

#define NONE UINT32_MAX

/* A copy the bucket's reduction writes into (reduce_scatter_coalesced's concatenation). */
typedef struct {
    int buffer;
    double bytes;
    uint32_t alloc; /* its alloc op */
} Copy;
/* A dependency on another stage's p2p send, filled in once every stage is built. */
#define CROSS (UINT32_MAX - 1)

typedef struct {
    ZpBucketSpec spec;
    int buffer;          /* bucket buffer id once allocated, -1 before (or none) */
    uint32_t alloc_op, coll_op;
    uint32_t drain_op;   /* the op after which its buffer is free: the collective, or the
                          * copy of its slice to the host (optimizer offload) */
    int slot;            /* the held buffer it is reduced through (held_slot), -1 none */
    ZpBucketExperts experts; /* expert gradients it holds (ZpImpl experts_in_buckets) */
} Bucket;

/* A gradient handed on while its held bucket buffer still holds an earlier bucket (ZpImpl
 * grads_by_module): it waits in workspace buffer `buffer` of `bytes` until it is copied in. */
typedef struct {
    guint bucket;
    int buffer, unit;
    double bytes;
} Wait;

/* A stage-3 gather, one of its coalesced call's (zp_impl.h ZpFetch: joins_previous). The
 * call's fields are its first gather's (`call` names it). */
typedef struct {
    ZpFetch fetch;
    int buffer;            /* its parameters' buffer */
    double bytes;          /* and that buffer's size */
    uint32_t coll_op;      /* what its compute waits for: the call's gather, or its unpack */
    guint call, n;         /* its call's first gather; that one: the call's gathers */
    uint64_t call_elems;   /* the call's elements (each gather padded to its group) */
    int flat;              /* the call's flat buffer until its last gather's use (n > 1) */
    int last_use;          /* the call's last gather's use (its zp_build_step_key) */
    int quant_buffer;      /* qwZ: the call's gathered int8 and scales, until dequantised */
    gboolean unpacked;
    /* The call's group, ranks, kind and bytes (on the wire, read from NVMe, copied up from
     * the host): functions of the plan and the call alone, worked out at its first issue
     * (issue_call) instead of at each micro-step's. `costed` says they are. */
    gboolean costed, reduced;
    ZpGroup group;
    int ranks;
    double wire_bytes, nvme_bytes, h2d_bytes;
} Gather;

/* Items listed by the compute step they belong to: items[start[k] .. start[k+1]), k the
 * step's key (zp_build_step_key). */
typedef struct {
    guint *start, *items;
} PosIndex;

/* A compute op's cost: its FLOPs, its typical GEMM's, those of them a fused attention
 * kernel does, and the bytes its memory-bound kernels move. */
typedef struct {
    double flops, gemm_flops, attn_flops, mem_bytes;
} Cost;

/* A dependency on another stage's send: its position in the schedule's deps and the send's
 * key (zp_build_send_key), filled in once every stage is built (zp_sched.c link_sends). */
typedef struct {
    uint32_t at;
    int64_t key;
} ZpCrossDep;

/* A tensor-parallel sum's n collectives; ops[k]: the k-th as zp_build_emit_collective writes
 * it, but for its unit, micro-step, stage and dependencies (zp_build_emit.c's
 * block_op_direct and zp_build_emit_tp_chain copy it). */
typedef struct {
    int n;
    ZpOp ops[2];
} ZpTpSum;

typedef struct {
    ZpSchedule *s;
    const ZpImpl *impl;
    ZpStateBytes state;
    int next_buffer;
    uint32_t last_compute;  /* last compute op emitted */
    uint32_t last_on_stream[ZP_STREAM_N]; /* last compute or collective op of each stream */
    /* What the next compute op must wait for (collectives with overlap off, tensor-parallel
     * sums, frees): sync_deps[0 .. n_sync), added by zp_build_sync_on. The array is room kept
     * at its longest, so that adding one makes no GArray call once it is long enough (each
     * checks the room with a 64-bit division; Megatron 1T's build adds 400,000). */
    GArray *sync_deps;
    guint n_sync;
    GArray *compute_deps;   /* zp_build_emit_compute's list of a compute op's dependencies,
                             * one reused rather than one made and freed an op */
    GArray *pos_last_op;    /* per position of the micro-step: its last compute op */
    GArray *buckets;        /* Bucket */
    GArray *tensors;        /* zp_impl_tensors, once a bucket is reduced tensor by tensor */
    /* zp_build_hand_on's last unit's tensors, tensors[first .. end), and the unit's flat
     * range they were found for (a block's modules each hand on from the same range) */
    struct {
        uint64_t lo, hi;
        guint first, end;
    } unit_tensors;
    guint *unit_first, *unit_last; /* per unit: the buckets holding its gradients */
    GArray *launch;         /* buckets by launch unit: launch[start[u] .. start[u+1]) */
    guint *launch_start;
    int n_ipg;              /* bucket buffers held through the backward (0: per bucket) */
    double ipg_bytes;
    int ipg[2];             /* their buffer ids */
    uint32_t ipg_alloc[2], ipg_last[2]; /* their alloc ops and last collectives */
    int occupant[2];        /* the bucket whose gradients a held buffer holds, -1 none */
    GArray *waits;          /* Wait, in the order the gradients were handed on */
    int grad_copy;          /* a later micro-step's gradient copy (ZpImpl grad_copy_elems) */
    /* ZpImpl grad_copy_elems of the stage's layout (< 0: not asked yet), a walk of every
     * tensor for every data-parallel rank that each bucket's launch asked again (plan --3d
     * gpt-1t/4096: 1,116 walks, 30 M instructions) */
    double grad_copy_elems;
    /* a bucket launch's copies (Copy), kept emptied for the next launch: an array made and
     * dropped at each was 13 M instructions of plan --3d gpt-1t/4096; NULL while one is using it */
    GArray *launch_copies;
    /* the dependencies of the step being built (zp_sched_build's; zp_build_put_dep) and what
     * they hold without growing */
    GArray *step_deps;
    guint step_deps_room;
    int grad_state;         /* the gradient state once the step's first reduction took it
                             * (ZpImpl grads_taken_by_reduction), -1 before and after */
    double grad_state_bytes; /* its size; 0: the state is held for the whole step */
    gboolean full_by_unit;  /* stages 0-1: the full gradients are taken unit by unit (ZpImpl
                             * full_grads_transient), not the state */
    int *unit_grad;         /* and per unit its buffer while taken, -1 before and after */
    GArray *gathers;        /* Gather */
    PosIndex by_trigger, by_use, by_free; /* gathers by step, in list order */
    int step;               /* the step of the position being built (zp_impl.h) */
    /* The host's run-ahead (ZpImpl host_runahead, zp_runahead.h): the last three events of
     * the allgather stream (the ops the last waited parameters' computes wait for) and of the
     * reductions (buckets' drains), the host's latest wait on each (NONE: none yet), its last
     * gathered alloc, and the gathered allocs zp_runahead_bound bounds (op indices). */
    gboolean runahead;
    uint32_t fetch_event[3], reduce_event[3];
    guint n_fetch_events, n_reduce_events;
    uint32_t fetch_gate, reduce_gate, host_alloc;
    /* The op the host last waited for on the whole device (ZpImpl epilogue_syncs_device), or
     * NONE: every op emitted after it depends on it until the next compute op, which the ops
     * after that follow (the compute stream runs in order). */
    uint32_t host_sync;
    GArray *gated;
    /* Without run-ahead: the last op of the waits of step waited_key's own coalesced calls
     * (their unpacks and flat buffers' frees), which its prefetches' buffers follow, and the
     * last gathered buffer freed after a compute op, which every later one follows. */
    uint32_t waited, released;
    int waited_key;
    /* ZpImpl copy_held_to_next: the last reduction's copy, freed by the next (buffer -1:
     * none), its unit and micro-step. */
    Copy held_copy;
    int held_copy_unit, held_copy_micro;
    /* Pipelines: the stage being built, the chunks' first units (zp_pipe_partition; chunk c
     * sits on stage c mod P), the send op of every (chunk, micro, direction), the send the
     * next compute op waits for (its send_key; -1: none) and where such dependencies sit in
     * the deps array with the keys they wait for. */
    int stage, n_chunks;
    int *first_unit;
    int *unit_chunk; /* per unit: the chunk holding it (zp_build_unit_chunks) */
    uint32_t *send_op;
    int64_t recv_key;
    /* ZpPlan p2p_sync: a second send the next compute op waits for (the gradient an
     * interleaved exchange received for the backward after it; -1: none), and the forward
     * whose output waits for the next backward's exchange (deferred_chunk -1: none). */
    int64_t recv_key_sync;
    int deferred_chunk, deferred_micro, deferred_unit;
    GArray *cross; /* ZpCrossDep: the deps positions that wait for other stages' sends */
    GArray *offloaded;      /* gradient transfers to the host the CPU step waits for */
    int resident;           /* backend_workspace: the run-long workspace's buffer, or -1 */
    int tied_grad;          /* the tied head's wte gradient waiting for the embedding's
                             * backward (ZpImpl tied_grad_waits), or -1 */
    double tied_grad_bytes;
    uint32_t workspace_free; /* and the last op workspace's free (NONE: none yet) */
    /* backend_workspace, a block computed module by module: the workspace its first module's
     * op takes and its last one's frees (zreal's real_gpt run.ws, held through the block's
     * modules), -1 when none is held; `module_step`: the step being emitted, -1 outside
     * such a block */
    int block_workspace, module_step;
    /* backend_workspace under a pipeline: micro-step m's head output gradient, which zreal
     * keeps aside (real_engine.c keep_head_dx) when the stage's next compute op is another
     * micro-step's, until m's backward (-1: none kept) */
    int *head_grad;
    /* ZpImpl secondary_per_block: each unit's secondary shard being held (-1: none) and the
     * op that took it */
    int *secondary;
    uint32_t *secondary_op;
    /* Ops past max_ops (zp_schedsize_max_ops) are not stored: the estimate missed what
     * multiplies them, and the build fails at its end instead of taking the machine. */
    double max_ops;
    gboolean over_ops;
    uint64_t ops_cap; /* the ops below max_ops: ceil(max_ops), for a run's integer test */
    /* The ops and dependencies the schedule's arrays hold without growing (zp_array_extend) */
    guint ops_room, deps_room;
    /* and those the run-ahead's gated allocs and the cross-stage dependencies hold (per-op
     * g_array_append_val: a 64-bit division each in g_array_maybe_expand) */
    guint gated_room, cross_room;
    ZpOp unstored_op; /* where an op past max_ops is written (zp_build_emit.c op_slot) */
    /* overlap_param_gather: each bucket's all-gather in the next forward (NONE: none, as for
     * an empty one), how many are issued and how many waited for, in forward order */
    GArray *param_gathers; /* uint32_t */
    guint param_gathers_issued, param_gathers_waited;
    /* A mixture of experts' tokens, buffers and activations per sparse block (zp_ep), and
     * latent attention's activations: zero for a dense model. */
    ZpEpActivations moe;
    /* DeepSpeed's backward all-gather of the dropped slots' gradients (zp_build_moe.c
     * tp_regather): its buffer (-1: none), freed with the experts' returned buffer after the
     * block's backward reads both (zp_build_moe_free_backward). */
    int moe_regathered;
    /* A uniform block's cost by kind (zp_build_block_cost) and its modules' kernel shares by
     * kind (module_costs): functions of the model and plan alone, worked out once a build
     * instead of once a block op (a 1F1B pipeline of 512 micro-batches has 100,000 of those;
     * they were a tenth of its build). Flags say which kinds are set. */
    Cost block_cost[ZP_COMP_N];
    ZpModuleShares block_shares[ZP_COMP_N];
    gboolean block_cost_set[ZP_COMP_N], block_shares_set[ZP_COMP_N];
    /* Decided once a build (zp_sched_build), not once a block op: whether blocks differ
     * (experts or latent attention: zp_build_unit_block_cost by block), and whether a
     * forward and a backward run module by module (zp_impl_module_compute, _backward), and
     * whether gradients are handed on tensor by tensor (zp_build_hand_on). */
    gboolean varied_blocks, module_forward, module_backward, hands_on;
    /* And whether a block's forward, recompute and backward ops, with the allocs and frees
     * around them, may be written in one pass each (zp_build_emit_block_kept and _backward):
     * blocks alike and whole, below stage 3, without workspaces, checkpoint boundaries'
     * syncs, or checkpoints copied to the host or re-gathered. */
    gboolean blocks_direct;
    /* Likewise functions of the model and plan alone, asked per block op and per pipeline
     * exchange: a tensor-parallel sum's collectives (zp_build_tp_sum_shape), and whether a
     * received activation is all-gathered over the tensor group (zp_build_pipe.c
     * scatter_gather). */
    ZpTpSum tp_sum;
    gboolean p2p_scatter_gather;
    uint64_t send_elems; /* what each pipeline send moves (zp_build_send_elems) */
    /* A pipeline's actions written again from the last of their kind (zp_build_replay.c);
     * NULL without a pipeline. */
    struct ZpReplay *replay;
} Builder;


typedef struct {
    int *act, *ckpt; /* buffer ids per micro-step and block: [micro * (L + 1) + l] */
    double act_bytes;
    ZpCkptRule rule; /* what a checkpoint is and where it lives (zp_zeror) */
    double core_bytes; /* selective recomputation: core attention's recomputed tensors */
} Activations;

/* The units [lo, hi) of one model chunk (all of them without a pipeline). */
typedef struct {
    int lo, hi;
} Range;

/* ---- zp_build_emit.c ---- */

uint32_t zp_build_emit(Builder *b, ZpOp op, const uint32_t *deps, guint n_deps);
uint32_t zp_build_emit_compute(Builder *b, ZpComputeKind kind, int unit, int micro, Cost cost,
                               const uint32_t *deps, guint n_deps);
uint32_t zp_build_emit_collective(Builder *b, ZpCollKind kind, ZpGroup group, int unit, int micro,
                                  int buffer, uint64_t offset, uint64_t elems, double bytes,
                                  const uint32_t *deps, guint n_deps);
uint32_t zp_build_emit_alloc(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                             int *buffer, const uint32_t *deps, guint n_deps);
uint32_t zp_build_emit_free(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                            int buffer, uint32_t after);
uint32_t zp_build_emit_transfer(Builder *b, ZpTransferKind kind, double bytes, int unit, int micro,
                                uint32_t after);
void zp_build_sync_on(Builder *b, uint32_t op);
/* `chains` chains of the build's tensor-parallel sum's collectives (Builder.tp_sum), each
 * collective after the one before it in its chain (the first after `after`) and each
 * synchronised with the next compute op; returns the last one. */
uint32_t zp_build_emit_tp_chain(Builder *b, int chains, int unit, int micro, uint32_t after);
/* A compute op (as zp_build_emit_compute) and then `sums` tensor-parallel sums after it (as
 * zp_build_tp_sums): a whole block's op. */
uint32_t zp_build_emit_block_op(Builder *b, ZpComputeKind kind, int unit, int micro,
                                const Cost *cost, const uint32_t *deps, guint n_deps, int sums);
/* A block's ops in one pass, where the build allows (Builder.blocks_direct; FALSE, with
 * nothing written, where they would pass max_ops): its forward or recompute (kind, `sums`
 * tensor-parallel sums after it: none for selective recomputation's core attention) with the
 * alloc of what it keeps (cat, bytes, its id into *buffer) after the last compute op first;
 * its backward after deps and the frees of its activations, core attention's recomputed
 * tensors and its checkpoint (core, ckpt -1: none) after it. */
gboolean zp_build_emit_block_kept(Builder *b, ZpComputeKind kind, int unit, int micro,
                                  ZpMemCategory cat, double bytes, int *buffer,
                                  const Cost *cost, int sums);
gboolean zp_build_emit_block_backward(Builder *b, int unit, int micro, const Cost *cost,
                                      const uint32_t *deps, guint n_deps, double act_bytes,
                                      int act, double core_bytes, int core, double ckpt_bytes,
                                      int ckpt);
/* A pipeline p2p op (ZpP2pKind dir) to stage `peer`, after the last compute op and the
 * collectives that op synchronises with (sync_deps, which stay). */
uint32_t zp_build_emit_p2p(Builder *b, ZpP2pKind dir, int unit, int micro, uint32_t peer,
                           uint64_t elems, double bytes);

/* Appends op to deps, within the room kept for the step's own (Builder.step_deps): a GLib
 * append checks the room with a 64-bit division (g_array_maybe_expand), 400,000 of them in
 * plan --3d gpt-1t/4096. */
static inline void zp_build_put_dep(Builder *b, GArray *deps, uint32_t op)
{
    if (deps == b->step_deps)
        *(uint32_t *)zp_array_extend(deps, 1, sizeof op, &b->step_deps_room) = op;
    else
        g_array_append_val(deps, op);
}
void zp_build_record_event(uint32_t ring[3], guint *n, uint32_t op);
uint32_t zp_build_host_sync(const uint32_t ring[3], guint n, uint32_t gate);
Cost zp_build_block_forward_cost(const ZpSchedule *s);
Cost zp_build_block_backward_cost(const ZpSchedule *s);
/* What a block's recompute op recomputes: the whole forward from the checkpoint (full
 * recomputation), or core attention alone (Megatron's selective recomputation,
 * zp_build_selective: attention.py's checkpointed core attention). */
gboolean zp_build_selective(const ZpPlan *plan);
Cost zp_build_recompute_cost(const ZpSchedule *s);
Cost zp_build_head_cost(const ZpSchedule *s);
Cost zp_build_embed_cost(const ZpSchedule *s);
Cost zp_build_optimizer_cost(const Builder *b, double elems);

/* ---- zp_build_layout.c ---- */

/* Each of the n_units units' chunk, given the chunks' first units (zp_pipe_partition). */
int *zp_build_unit_chunks(const int *first_unit, int n_chunks, int n_units);
gboolean zp_build_unit_held(const Builder *b, int unit);
void zp_build_layout(Builder *b);

/* ---- zp_build_buckets.c ---- */

Bucket *zp_build_bucket(Builder *b, guint i);
void zp_build_plan_buckets(Builder *b);
ZpHeldSpan zp_build_held_span(const Builder *b);
void zp_build_reset_buckets(Builder *b);
gboolean zp_build_own_buffer(const Builder *b, const Bucket *k);
void zp_build_alloc_held_buckets(Builder *b, int micro);
void zp_build_free_held_buckets(Builder *b, int micro, uint32_t after);
void zp_build_alloc_landing_buckets(Builder *b, int unit, int micro, GArray *deps);
void zp_build_take_unit_grads(Builder *b, int u, int micro, GArray *deps);
uint32_t zp_build_bucket_copy(Builder *b, const Bucket *k, double bytes, int micro,
                              const uint32_t *deps, guint n_deps, GArray *copies);
void zp_build_hand_on(Builder *b, int u, int module, int micro, GArray *deps);
uint32_t zp_build_hand_on_experts(Builder *b, int u, int micro);
void zp_build_launch_buckets(Builder *b, int unit, int module, int micro, GArray *launched);

/* ---- zp_build_qgz.c ---- */

uint32_t zp_build_emit_quantize(Builder *b, ZpStream stream, int unit, int micro, double mem_bytes,
                                const uint32_t *after, guint n_after);
uint32_t zp_build_qgz_reduce(Builder *b, Bucket *k, int unit, int micro, const uint32_t cdeps[3]);
uint32_t zp_build_qgz_by_tensor(Builder *b, Bucket *k, int unit, int micro, uint32_t after,
                                GArray *copies);

/* ---- zp_build_offload.c ---- */

uint32_t zp_build_offload_grad_slice(Builder *b, const Bucket *k, int unit, int micro);
uint32_t zp_build_cpu_optimizer_step(Builder *b, double elems, GArray *launched, uint32_t gpu_opt);

/* ---- zp_build_gathers.c ---- */

/* A step of a position as one index: pos * ZP_POS_STEPS + step (inline: each block's steps
 * asked for it across files, 420,000 calls in plan --3d gpt-1t/4096). */
static inline int zp_build_step_key(int pos, int step)
{
    return pos * ZP_POS_STEPS + step;
}
void zp_build_plan_gathers(Builder *b);
PosIndex zp_build_index_gathers(const Builder *b, size_t pos_field, size_t step_field, int n_pos,
                                gboolean calls_only);
void zp_build_free_pos_index(PosIndex *ix);
void zp_build_issue_gathers(Builder *b, int key, int micro, gboolean now);
void zp_build_gathers_used_at(Builder *b, int key, int micro, GArray *deps);
void zp_build_free_gathers(Builder *b, int key, int micro);

/* ---- zp_build_tp.c ---- */

/* One tensor-parallel sum's collectives and sizes (kept in Builder.tp_sum for the build). */
ZpTpSum zp_build_tp_sum_shape(const ZpSchedule *s);
/* `sums` tensor-parallel sums after the last compute op, which the next compute op waits for. */
void zp_build_tp_sums(Builder *b, int unit, int micro, int sums);
/* Whether unit's MLP ends in a tensor-parallel sum (zp_build_moe.c): a dense block's does, a
 * sparse block's as zp_ep_sparse_mlp_sums says. */
gboolean zp_build_moe_mlp_sums(const ZpSchedule *s, int unit);
/* Elements a sparse block's permute reads and writes (in its block op): the rank's T_r tokens
 * read and their T_r k copies written under the all-to-all; the experts' t R rows picked out
 * of the gathered tokens under the all-gather dispatcher (moe_utils.py permute). */
double zp_build_moe_permute_elems(const ZpModel *m, const ZpPlan *plan);
/* The sums after a whole block's op at unit (0 without tensor parallelism): Megatron's two
 * all-reduces of a block, after the row-parallel attention projection and MLP output in
 * forward (and recompute), of the column-parallel qkv's and fc1's input gradients in
 * backward; the attention's alone where the MLP has none (zp_build_moe_mlp_sums). Inline:
 * asked once a block op (Megatron 1T: 27,648 calls, 0.17 M instructions). */
static inline int zp_build_block_tp_sums(const Builder *b, int unit)
{
    if (b->s->plan.mp == 1)
        return 0;
    return b->varied_blocks && !zp_build_moe_mlp_sums(b->s, unit) ? 1 : 2;
}
void zp_build_vocab_parallel_head(Builder *b, int micro);

/* ---- zp_build_ckpt.c ---- */

/* Block l's buffer id of micro-step `micro` in ids (Activations act, ckpt); inline: asked
 * three times a block op. */
static inline int *zp_build_act_slot(const Builder *b, int *ids, int micro, int l)
{
    return &ids[(gsize)micro * (gsize)(b->s->model.layers + 1) + (gsize)l];
}
/* A checkpointed block's boundary: with synchronize_checkpoint_boundary, the next compute op
 * waits for every stream's last op (zp_build_checkpoint_sync). The test inline: four a block
 * and micro-step, most of them without it (Megatron 1T: 36,864 calls, 0.3 M instructions). */
void zp_build_checkpoint_sync(Builder *b);
static inline void zp_build_checkpoint_boundary(Builder *b)
{
    if (b->s->plan.checkpoint && b->s->plan.ckpt.synchronize_checkpoint_boundary)
        zp_build_checkpoint_sync(b);
}
void zp_build_keep_checkpoint(Builder *b, int l, int micro, Activations *a, GArray *deps);
void zp_build_regather_checkpoint(Builder *b, int l, int micro, Activations *a);

/* ---- zp_build_step.c ---- */

void zp_build_forward(Builder *b, int micro, Activations *a, GArray *deps, Range r);
void zp_build_release_head_grad(Builder *b, int micro);
void zp_build_head(Builder *b, int micro, gboolean reduce, gboolean keep, GArray *deps,
                   GArray *launched);
void zp_build_backward(Builder *b, int micro, gboolean reduce, Activations *a, GArray *deps,
                       GArray *launched, Range r);

/* ---- zp_build_moe.c ---- */

/* Whether the unit is a sparse block of a mixture of experts. */
gboolean zp_build_moe_sparse(const ZpSchedule *s, int unit);
/* The expert space's model states added to state_bytes (after the dense layout's). */
void zp_build_moe_states(Builder *b);
/* Where the implementation reduces the expert gradients after the backward (ZpImpl
 * experts_after_backward): those all-reduces, after the dense buckets' (micro-step `micro`'s). */
void zp_build_moe_reduce_after_backward(Builder *b, int micro);
/* The expert elements this rank's optimizer steps (all of them at stage 0, else its
 * partition over the expert-data-parallel group). */
double zp_build_moe_optimizer_elems(const ZpSchedule *s);
/* A block op's cost (kind: forward, recompute or backward) and a block's saved activations,
 * unit by unit: a model with experts or latent attention has blocks of two kinds and widths
 * of its own; a uniform one the zp_build_block_*_cost and `uniform`. */
Cost zp_build_unit_block_cost(const ZpSchedule *s, int unit, ZpComputeKind kind);
double zp_build_unit_act_bytes(const Builder *b, int unit, double uniform);
/* After a sparse block's forward (or recomputed forward) op: its dispatch, experts, combine
 * and unpermute with their buffers (and stage 3's expert gather). Nothing for another unit. */
void zp_build_moe_forward(Builder *b, int unit, int micro);
/* Before a sparse block's backward op: unpermute's backward, the dispatch of the output
 * gradients, the experts' backward, the combine of their input gradients and, when `reduce`,
 * the experts' gradient reduction over the expert-data-parallel group; returns the buffer the
 * combine filled, which zp_build_moe_free_backward frees after the block's backward op (-1:
 * none). */
int zp_build_moe_backward(Builder *b, int unit, int micro, gboolean reduce);
void zp_build_moe_free_backward(Builder *b, int unit, int micro, int buffer);
/* zp_sched_optimizer_elems for a mixture of experts: the dense units' as the flat layout pads
 * them over dp, the experts' as the expert space pads them over dp / EP. */
uint64_t zp_build_moe_optimizer_elems_of(const ZpModel *model, const ZpPlan *plan);
/* zp_sched_compute_ops for a model with experts or latent attention: its blocks' ops by their
 * mean cost over the units, the experts' and unpermute's ops (nothing for a uniform model). */
void zp_build_moe_compute_ops(const ZpModel *model, const ZpPlan *plan,
                              ZpComputeOps ops[ZP_COMP_N]);
/* Stages 1-2: the updated expert partitions all-gathered after the optimizer op `after`. */
void zp_build_moe_param_gather(Builder *b, uint32_t after);

/* ---- zp_build_pipe.c ---- */

/* The send of (chunk, micro, direction): its index among every stage's sends (inline: a
 * pipeline's every action asks for one or two). */
static inline int64_t zp_build_send_key(const Builder *b, int chunk, int micro, ZpP2pKind dir)
{
    return ((int64_t)chunk * b->s->plan.grad_accum + micro) * ZP_P2P_N + dir;
}
/* The received tensor's all-gather over the tensor group under scatter/gather (ZpImpl
 * p2p_scatter_gather), which takes the send as its dependency (the emitter's recv_key) and,
 * as p2p_communication.py runs it in line, the compute before it; the next compute op waits
 * for it. Nothing otherwise. */
void zp_build_receive(Builder *b, int unit, int micro);
/* Whether the plan's pipeline sends 1/t of an activation and all-gathers it on receipt
 * (kept in Builder.p2p_scatter_gather for the build). */
gboolean zp_build_p2p_scatter_gather(const ZpPlan *plan);
/* The elements a pipeline send moves: b s h, or b s h / t under sequence parallelism or
 * scatter_gather (kept in Builder.send_elems for the build). */
uint64_t zp_build_send_elems(const ZpSchedule *s, gboolean scatter_gather);
void zp_build_send(Builder *b, int chunk, int micro, ZpP2pKind dir, int unit);
/* The tied embedding's gradient exchange, after the collectives in `after` too (NULL: none). */
void zp_build_tied_sync(Builder *b, const GArray *after);
/* After stage 0 of `stages`: the op and dependency arrays' room for all of them (at most
 * max_ops ops), over huge pages. */
void zp_build_pipe_reserve(Builder *b, int stages);

/* ---- zp_build_replay.c ---- */

/* A pipeline stage's actions, each a micro-batch's forward or backward of a chunk, written
 * again from the last one of their kind (chunk, backward) that was built op by op: its ops
 * copied, their micro-step, allocated buffers, dependencies and sends moved on, where the
 * builder reads nothing else for it that differs between micro-batches and finds the same
 * shape on entry (the same dependencies NONE, as many synchronised collectives). */
typedef struct ZpReplay ZpReplay;
ZpReplay *zp_build_replay_new(int vstages);
void zp_build_replay_free(ZpReplay *r);
/* A stage's first action: the templates are another stage's. */
void zp_build_replay_reset(ZpReplay *r, const Builder *b);
/* Writes action x from its template and returns TRUE; FALSE where it must be built op by op,
 * after which zp_build_replay_record makes the template of it where it may. */
gboolean zp_build_replay(ZpReplay *r, Builder *b, Activations *a, const ZpPipeAction *x);
void zp_build_replay_record(ZpReplay *r, Builder *b, Activations *a, const ZpPipeAction *x);

/* ---- zp_build_optimizer.c ---- */

uint32_t zp_build_emit_step_op(Builder *b, ZpOp op, const uint32_t *deps, guint n);
void zp_build_optimizer_step(Builder *b, GArray *launched);
/* Megatron's overlap_param_gather: before unit `unit`'s first forward compute of the step,
 * waits for the buckets that hold its parameters (the next compute op depends on their
 * all-gathers) and dispatches the bucket after the last of them; nothing otherwise. */
void zp_build_wait_param_gathers(Builder *b, int unit, int micro);

#endif
