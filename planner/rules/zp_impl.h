/* zp_impl: whose ZeRO a schedule follows — DeepSpeed v0.19.6, PyTorch FSDP, the ZeRO paper or
 * Megatron-Core — as a table of rules the one schedule builder (zp_sched.c) and the memory
 * model call through.
 *
 * One file per implementation (zp_impl_deepspeed.c, zp_impl_fsdp.c, zp_impl_paper.c,
 * zp_impl_megatron.c) fills a
 * ZpImpl; the builder never asks which implementation it runs. A new semantics (offload, ZeRO++)
 * is a new table or a wrapper of one: each rule is a function or a plain field. */
#ifndef ZP_IMPL_H
#define ZP_IMPL_H

#include "zp_mem_terms.h"
#include "zp_sched_graph.h"

#include <glib.h>
#include <stdint.h>

/* Compute positions of a micro-step, as the builder walks them: 0 embedding, 1..L blocks
 * forward, L+1 head, then per block l from L down to 1 its recompute (checkpointing; empty
 * otherwise) and its backward, and last the embedding's backward. */
static inline int zp_pos_fwd(int l) { return l; }
static inline int zp_pos_head(int L) { return L + 1; }
static inline int zp_pos_rec(int L, int l) { return L + 2 + 2 * (L - l); }
static inline int zp_pos_bwd(int L, int l) { return L + 3 + 2 * (L - l); }
static inline int zp_pos_embed_bwd(int L) { return 3 * L + 2; }
static inline int zp_pos_count(int L) { return 3 * L + 3; }

/* A position's compute ops, its steps: one, or under module compute (zp_impl_module_compute)
 * a block position's one per module, in the order the hooks run them: forward and recompute
 * ln1 .. fc2 (step k computes module k), backward fc2 .. ln1 (step k: module
 * ZP_MOD_N - 1 - k). A fetch names the step it is issued, used and freed at. */
#define ZP_POS_STEPS ZP_MOD_N
static inline int zp_step_module(gboolean backward, int step)
{
    return backward ? ZP_MOD_N - 1 - step : step;
}

/* One gradient reduction: the flat range [lo, hi) (unpadded) in bytes `bytes` on the wire. It
 * launches after unit launch_unit's backward, or with launch_module >= 0 (ZpBlockModule)
 * after that module's backward op of block launch_unit when the schedule computes the block's
 * backward module by module (zp_impl_module_backward; after the whole block's otherwise);
 * top_unit produces its first gradients (where a landing buffer is allocated at stages 2-3).
 * `bypass`: reduced from the gradient itself, no bucket buffer (DeepSpeed's parameter larger
 * than reduce_bucket_size). */
typedef struct {
    uint64_t lo, hi;
    double bytes;
    int top_unit, low_unit, launch_unit, launch_module;
    gboolean bypass;
    int n_items; /* the units or tensors it groups */
    /* Elements the bucket spans in its implementation's flat buffer, padding included
     * (Megatron's main_grad: each parameter's start and the bucket's end padded); 0: its
     * range padded to dp. Its reduction sends these and the post-step all-gather gathers
     * them. */
    uint64_t padded_elems;
    /* Reduced by one call with the bucket launched just before it (same launch unit): one
     * copy-in of both and one reduce-scatter over both ranges, which need not be adjacent
     * (FSDP2's root group: units 0 and L + 1, zp_impl_fsdp2_root_joined). */
    gboolean joins_previous;
} ZpBucketSpec;

/* The expert gradients a bucket holds beside its dense range (ZpImpl experts_in_buckets): the
 * range [lo, lo + elems) of the expert space, reduced over the expert-data-parallel group from
 * the same buffer after the dense part, which lies first; `on_top`: the bucket's top_unit's
 * experts are the first gradients it takes in backward order (so the bucket before it launches
 * after that unit's experts, ZP_LAUNCH_EXPERTS). */
typedef struct {
    uint64_t lo, elems;
    gboolean on_top;
} ZpBucketExperts;

/* ZpBucketSpec launch_module of a bucket launched after a sparse block's experts' backward
 * (beyond the block's modules). */
#define ZP_LAUNCH_EXPERTS ZP_MOD_N

/* One stage-3 all-gather: `elems` (padded to a multiple of dp) at flat offset `offset` of unit
 * `unit`, issued at the start of trigger_pos, needed by the compute at use_pos and freed after
 * the compute at free_pos (positions as above). `joins_previous`: gathered by the same
 * coalesced call as the fetch before it in the list (same trigger_pos), whose `numel`
 * elements (unpadded) it is copied out into when the call is first waited for. */
typedef struct {
    int unit;
    uint64_t offset, elems;
    int trigger_pos, use_pos, free_pos;
    gboolean joins_previous;
    uint64_t numel;
    int trigger_step, use_step, free_step; /* the steps of those positions (0: the first) */
} ZpFetch;

/* A buffer the step allocates around the optimizer: `bytes` of category `cat`, freed once the
 * next one is allocated (`transient`, as a flatten then a dtype conversion) or after the
 * optimizer. */
typedef struct {
    ZpMemCategory cat;
    double bytes;
    gboolean transient;
} ZpStepBuffer;

/* When the held bucket buffers (ZpImpl bucket_buffers) are taken and given back. */
typedef enum {
    ZP_HELD_PER_BACKWARD, /* by each reducing backward, freed after its last reduction */
    ZP_HELD_FROM_FIRST,   /* by micro-step 0's backward, kept to the end of the last reducing
                           * one (a stage that reduces at the last micro-step only) */
    ZP_HELD_ALL_STEP,     /* for the whole step: taken before its first op, freed after its
                           * last (a buffer kept from one step to the next) */
} ZpHeldSpan;

typedef struct ZpImpl {
    ZpImplKind kind;
    const char *name;
    /* Whether the implementation has this ZeRO stage (FSDP has no stage 1), and the stages it
     * has, in words, for the line that refuses another. */
    gboolean (*has_stage)(int stage);
    const char *stages;
    /* Bytes of one gradient element as the implementation keeps it in its gradient state
     * (Megatron's main_grad buffer); NULL: the training precision's (zp_plan_state_bytes). */
    double (*grad_bytes)(const ZpPlan *plan);
    /* The implementation's own defaults where DeepSpeed's differ, applied to a plan made from
     * flags before the flags that set them explicitly (NULL: none). */
    void (*plan_defaults)(ZpPlan *plan);
    /* Whether the implementation has Megatron's selective recomputation
     * (ZpPlan selective_recompute), so that the planner's search tries it. */
    gboolean selective_recompute;
    /* Whether DeepSpeed's own options apply, so that the search tries them: ZeRO-R's
     * activation_checkpointing (Pa, Pa+cpu, MD) with checkpointing, ZeRO++ at stage 3. */
    gboolean zero_r;
    /* Whether a pipeline send with tensor parallelism and no sequence parallelism goes as
     * each tensor rank's 1/t of the activations, all-gathered over the tensor group by the
     * receiver (Narayanan et al. 2021 section 4.1; zp_sched's scatter_gather). */
    gboolean p2p_scatter_gather;
    /* Stage 3: the sharded parameters are the fp32 master weights themselves (FSDP2 keeps
     * each parameter's shard in its original dtype and casts it for the all-gather): no
     * separate 16-bit partition is held. */
    gboolean sharded_params_are_master;
    /* Stages 1-2: the updated parameters are all-gathered one gradient bucket at a time, in
     * place (Megatron's start_param_sync over its bucket groups), rather than in
     * allgather_bucket_size chunks (DeepSpeed's all_gather_dp_groups). */
    gboolean param_gather_by_bucket;
    /* Stages 1-2: the elements of the flat buffer the parameters and the partition are laid
     * out in, padding included (Megatron's param_data and main_grad: every rank's shard is
     * 1/dp of it); NULL: the parameters padded to dp. */
    uint64_t (*flat_elems)(const ZpSchedule *s);
    /* The collective that reduces a gradient bucket at the plan's stage. */
    ZpCollKind (*grad_collective)(const ZpPlan *plan);
    /* Whether a mixture of experts' gradients go through the dense gradients' buckets
     * (ZpBucketSpec expert_lo, expert_elems; NULL: never, each sparse unit's are reduced on
     * their own). */
    gboolean (*experts_in_buckets)(const ZpSchedule *s);
    /* Then the experts each bucket of plan_buckets holds (GArray of ZpBucketExperts). */
    void (*bucket_experts)(const ZpSchedule *s, GArray *experts);
    /* The gradient reductions of one backward, in launch order (GArray of ZpBucketSpec). */
    void (*plan_buckets)(const ZpSchedule *s, GArray *buckets);
    /* Bucket buffers held for the whole reducing backward: their count (0: each bucket takes
     * its own buffer of its size while it is filled and reduced) and elements each. */
    int (*bucket_buffers)(const ZpPlan *plan, double *elems);
    /* When those are taken and given back (NULL: ZP_HELD_PER_BACKWARD). */
    ZpHeldSpan (*held_span)(const ZpPlan *plan);
    /* Whether a reducing backward's epilogue waits on the host for the whole device (its last
     * reduction) before the host issues anything more (NULL: never). */
    gboolean (*epilogue_syncs_device)(const ZpPlan *plan);
    /* Whether a reduce-scatter first concatenates bucket k into a copy of its size. */
    gboolean (*concat_copy)(const ZpPlan *plan, const ZpBucketSpec *k);
    /* Whether stages 1-2 all-gather the updated parameters through allgather_bucket_size
     * buffers (FALSE: in place, allocating nothing). */
    gboolean post_step_gather_buffer;
    /* Stages 2-3, a tied LM head: whether the head's contribution to wte's gradient waits in
     * a buffer of its own (autograd's) until the embedding's backward adds to it, when wte
     * is reduced through a held bucket buffer (the reduce hook fires once a parameter's
     * gradient is accumulated, so only then is it copied into the bucket). */
    gboolean tied_grad_waits;
    /* Stage 3: the micro-step's all-gathers (GArray of ZpFetch) in issue order. */
    void (*plan_fetches)(const ZpSchedule *s, GArray *fetches);
    /* Stage 3: the ranges kept whole on every rank (GArray of ZpFetch; only unit, offset and
     * elems), refreshed by an all-gather after the step. */
    void (*persistent)(const ZpSchedule *s, GArray *ranges);
    /* Stage 3: whether the persistent ranges' full copies are freed when the step begins and
     * each taken again, a buffer of its padded size, by its all-gather after the optimizer
     * (the schedule's alloc and free of buffer -1: the state's copies); FALSE: refreshed in
     * place. */
    gboolean persistent_freed_for_step;
    /* Whether those are whole units at or below the persistence threshold (the rule
     * zp_sched_unit_persistent answers in O(1)); FALSE when decided otherwise or never. */
    gboolean unit_persistence;
    /* Gradient elements kept as a model state (stage 2 may hold more than the partition). */
    double (*grad_state_elems)(const ZpSchedule *s);
    /* Whether that state is not held from the step's start but taken by the step's first
     * gradient reduction (before it) and freed after the optimizer; NULL or FALSE: held for
     * the whole step. */
    gboolean (*grads_taken_by_reduction)(const ZpPlan *plan);
    /* Stages 0-1: whether the full gradients backward accumulates in are no state but taken
     * unit by unit, before the op of micro-step 0 that produces the unit's first gradients,
     * each unit's freed once the reduction of its last bucket is issued, the state being what
     * the reductions copy out of them (grad_state_elems, grads_taken_by_reduction); NULL or
     * FALSE: the full gradients (zp_impl_partition_grad_elems) are the state. */
    gboolean (*full_grads_transient)(const ZpPlan *plan);
    /* With gradient accumulation: the elements of the copy each later micro-step's reduced
     * gradients land in, allocated by its first reduction and freed after its last, once
     * added into the state (which holds the earlier micro-steps' sum); NULL or 0: later
     * micro-steps add into the state directly. */
    double (*grad_copy_elems)(const ZpSchedule *s);
    /* The step's buffers around the optimizer (GArray of ZpStepBuffer). */
    void (*step_buffers)(const ZpSchedule *s, GArray *buffers);
    /* The closed-form buffer terms of the memory model (reduce and all-gather buckets, stage-3
     * gathered and persistent parameters, step buffers), from the same rules. */
    void (*residual_buffers)(const ZpModel *model, const ZpPlan *plan, ZpResidual *r);
    /* Stage 3: at most how many elements one micro-step gathers at the least (the search's
     * lower bound of the gathers' time; O(1)). */
    double (*gather_bound_elems)(const ZpModel *model, const ZpPlan *plan);
    /* Stage 3 with optimizer offload: the gradient partition is summed on the host in the
     * 16-bit gradient dtype, each micro-step's slice going down and the sum coming back up
     * to be added on the GPU, and goes down again in fp32 at the last micro-step into a
     * separate fp32 host buffer (DeepSpeed's stage3.py partition_grads). At stage 2 with
     * accumulation the same by whole tensors: each one overlapping the rank's partition goes
     * down in 16 bits, and on later micro-steps comes up to be added first
     * (zp_offload_stage2_accum_elems); FALSE: the host holds fp32 gradients only. */
    gboolean host_grad_accum;
    /* Stage 3: a block's compute is one op per module, each after its own parameters'
     * gathers and followed by their release (the positions' steps above); FALSE: one op per
     * block. */
    gboolean module_compute;
    /* Stage 3: the host issues gathers ahead of the compute, stopped only by the gates and the
     * allocator's bound of zp_runahead.h; FALSE: each gather's buffer is taken after the
     * compute op before it. */
    gboolean host_runahead;
    /* Whether the plan's gradients are handed on module by module as backward produces them
     * and a bucket is reduced the moment a gradient arrives that does not fit it
     * (plan_buckets' launch_module): then a block's backward is one op per module at stages
     * 1-2 too (zp_impl_module_backward), and at stages 2-3 a gradient whose held bucket
     * buffer still holds an earlier bucket waits in a buffer of its own (workspace, its
     * 16-bit size) until that bucket's reduction has read the buffer, then is copied in;
     * NULL or FALSE: a bucket launches after its lowest unit's whole backward (or as
     * plan_buckets says) and its gradients land in it directly. */
    gboolean (*grads_by_module)(const ZpPlan *plan);
    /* Whether the buffers a gradient reduction reads (a bucket's own buffer, its copies, the
     * gradients waiting for its held buffer) are freed once the host has issued the
     * reduction (after the compute op it follows; then the memory a step needs is that of the
     * ops in list order, as zreal holds it); FALSE: once the reduction has run. */
    gboolean frees_at_issue;
    /* Whether a reduction's concatenation copy is held until the next reduction is issued (or
     * the micro-step's last one has run), and the gradients copied into it are freed once
     * the reduction is issued (FSDP2's reduce_scatter_input and unsharded gradients); FALSE:
     * both are freed as frees_at_issue says. */
    gboolean copy_held_to_next;
    /* Stage 3 with qgZ: a bucket's gradients go tensor by tensor, a 2-D one of numel a
     * multiple of 2 dp through its own quantised all-to-all pair (zp_zeropp_qgz_tensor), the
     * others reduce-scattered alone, and only across more than one node
     * (zp_zeropp_qgz_across_nodes; on one the bucket is reduce-scattered whole); FALSE: each
     * bucket through one pair (zp_zeropp_qgz). */
    gboolean qgz_by_tensor;
    /* A mixture of experts' gradients over the expert-data-parallel group: the collective of
     * a sparse unit's experts; NULL: grad_collective, as an implementation whose expert
     * gradients share the dense ones' reduction path does it (DeepSpeed's stage_1_and_2.py
     * average_tensor, Megatron-Core's expert grad buffers). */
    ZpCollKind (*expert_grad_collective)(const ZpPlan *plan);
    /* Whether a mixture of experts' gradients are reduced once the backward is done, after the
     * dense ones, from flattened copies of at most the dense buckets' size over the
     * expert-data-parallel group (zp_build_moe_reduce_after_backward); NULL or FALSE: each
     * sparse unit's right after its experts' backward. */
    gboolean (*experts_after_backward)(const ZpPlan *plan);
    /* Stages 1-2: the elements of the optimizer's states (fp32 master, moments) on dp rank
     * `rank`, where the implementation keeps only its parameters' own elements within the
     * rank's range (Megatron's distributed optimizer: one shard_main_param per parameter
     * range); rank -1: the most any rank holds. NULL: the partition, padding included. */
    uint64_t (*rank_opt_elems)(const ZpSchedule *s, int rank);
    /* Stage 3: a call of one parameter is copied out of its all-gather's output too (FSDP2's
     * foreach_all_gather_copy_out runs for every call); FALSE: gathered into the parameter's
     * own buffer (DeepSpeed's _all_gather_sequential of one parameter). */
    gboolean copy_out_single;
    /* Stage 3 with hpZ's group: a block's secondary shard is not a state but taken when its
     * forward's gathered parameters are released (from them) and freed once its backward's
     * all-gather has read it, each micro-step; the root's units have none (FSDP2's
     * reshard_after_forward=int: _fsdp_param.py to_sharded_post_forward, and the root's
     * post_forward_mesh_info is None); FALSE: a state for every unit not kept whole. */
    gboolean secondary_per_block;
    /* A pipeline with a tied embedding: the first and last stages exchange the embedding's
     * gradient once the stage's data-parallel reductions are done (Megatron's
     * finalize_model_grads: finish_grad_sync, then _allreduce_embedding_grads); FALSE:
     * before them (DeepSpeed's ReduceTiedGrads before ReduceGrads). */
    gboolean tied_sync_after_reduction;
    /* DeepSpeed's size knobs (ZpZeroKnob bits) the implementation reads: every one for
     * DeepSpeed (and the paper's closed form); Megatron-Core's DDP the gradient bucket only
     * (bucket_size under overlap_grad_reduce); FSDP none (zp_impl_unread_knobs). */
    unsigned zero_knobs;
} ZpImpl;

extern const ZpImpl zp_impl_deepspeed, zp_impl_fsdp, zp_impl_paper, zp_impl_megatron,
    zp_impl_fsdp2;

const ZpImpl *zp_impl_get(ZpImplKind kind);

/* Of the knobs given (ZpZeroKnob bits), those the implementation has no setting for and never
 * reads (ZpImpl.zero_knobs): the caller says so rather than drop them in silence. */
unsigned zp_impl_unread_knobs(ZpImplKind kind, unsigned given);
#define ZP_ZERO_KNOBS_ALL ((1u << ZP_KNOB_N) - 1)

/* FSDP2 at stage 3: the root's units (0 and L + 1: embeddings, final norm, head) are one
 * FSDPParamGroup, gathered by one call and reduced by one (zp_impl_fsdp2.c). */
gboolean zp_impl_fsdp2_root_joined(const ZpSchedule *s);

/* The plan's model-state bytes per element: the precision and optimizer's, with the
 * gradients as the plan's implementation keeps them (ZpImpl grad_bytes). */
ZpStateBytes zp_impl_state_bytes(const ZpPlan *plan);

/* Whether the plan's sharded parameters are its master weights, with no 16-bit copy at rest:
 * stage 3 (after zp_impl_normalize_plan) of an implementation that keeps them so
 * (sharded_params_are_master: FSDP2) under mixed precision (a master copy to be). The
 * schedule's layout and `zplan memory` count the states by it. */
gboolean zp_impl_params_are_master(const ZpPlan *plan);
/* Whether DeepSpeed would train the plan with its BF16_Optimizer, which zplan does not model:
 * bf16 without ZeRO under pipeline parallelism (engine.py _do_optimizer_sanity_check;
 * bf16_optimizer.py keeps the fp32 master and Adam states partitioned over the data-parallel
 * ranks, a full gradient buffer beside the bf16 gradients, all-reduced, and all-gathers the
 * parameters after the step: not stage 0's replicated fp32 copy). The schedule refuses such
 * a plan and the search leaves it out. */
gboolean zp_impl_ds_bf16_optimizer(const ZpPlan *plan);

/* Applies the plan's implementation's defaults (ZpImpl plan_defaults), if it has any. */
void zp_impl_plan_defaults(ZpPlan *plan);

/* The plan as the schedule and the memory model run it: FSDP2's stage 2
 * (reshard_after_forward=False) is stage 3's sharding with the gathered blocks kept from
 * forward to backward (ZpZeroConfig fsdp2_no_reshard_after_forward). Idempotent. */
void zp_impl_normalize_plan(ZpPlan *plan);

/* ---- rules the implementations share ------------------------------------------------- */

/* A unit's elements padded to a multiple of dp (how stage 3 partitions it), and whether
 * stage 3 keeps the unit whole on every rank (at or below the persistence threshold, for an
 * implementation that decides persistence per unit: the paper's). */
uint64_t zp_sched_unit_padded(const ZpSchedule *sched, int unit);
gboolean zp_sched_unit_persistent(const ZpSchedule *sched, int unit);

/* Whether the schedule computes blocks module by module: stage 3 of an implementation with
 * module_compute, unless the plan asks for whole blocks (ZpPlan block_compute). */
gboolean zp_impl_module_compute(const ZpSchedule *s);

/* Whether the schedule computes a block's backward module by module: under module compute,
 * or for an implementation with grads_by_module at stages 1-2 when the gradients are reduced
 * during the backward (no pipeline) and the plan does not ask for whole blocks. */
gboolean zp_impl_module_backward(const ZpSchedule *s);

/* The plan's implementation's experts_in_buckets (FALSE without one or without experts). */
gboolean zp_impl_experts_in_buckets(const ZpSchedule *s);

/* A sparse unit's experts on this rank: E / EP experts, split over the tensor group (0: a dense
 * unit, or another pipeline stage's). */
uint64_t zp_impl_unit_expert_elems(const ZpSchedule *s, int unit);

/* zp_impl_group_buckets by tensor with each sparse unit's experts as one item, taken before the
 * unit's dense tensors in backward order (ZpImpl experts_in_buckets); `experts` (GArray of
 * ZpBucketExperts) gets one entry a bucket. */
void zp_impl_group_buckets_with_experts(const ZpSchedule *s, double limit, gboolean bypass_large,
                                        GArray *buckets, GArray *experts);

/* ZpImpl bucket_experts: one ZpBucketExperts per bucket of plan_buckets, or NULL where the
 * experts do not go through the buckets (caller unrefs). */
GArray *zp_impl_bucket_experts(const ZpSchedule *s);

/* The plan's implementation's expert_grad_collective, or its grad_collective without one. */
ZpCollKind zp_impl_expert_grad_collective(const ZpPlan *plan);

/* The plan's implementation's grads_by_module (FALSE without one). */
gboolean zp_impl_grads_by_module(const ZpPlan *plan);

/* A tensor as a rank holds it: its unit, flat offset and elements (its tensor-parallel share,
 * clipped to the unit's range), and the module it belongs to (tensors of one unit whose
 * names share the part before the '.': "qkv.weight" and "qkv.bias" are module "qkv"). */
typedef struct {
    int unit, module;
    uint64_t offset, elems;
    gboolean matrix; /* 2-D (ZpTensor's) */
} ZpImplTensor;

/* The schedule's tensors in layout order (GArray of ZpImplTensor; caller unrefs and does not
 * change it: it may be the one kept with the schedule). */
GArray *zp_impl_tensors(const ZpSchedule *s);

/* DeepSpeed's stage 3: where the tensor at flat offset lo begins in a rank's partition, each
 * tensor before it padded to dp (partition_parameters.py _partition_param): the elements of
 * the tensors below lo. During a build, by a binary search over the memo's sums (the
 * tensors' offsets ascend); a scan of every tensor, once per gather of each micro-step, was a
 * third of `plan --3d` gpt-1t on 64 A100s, whose plans keep some sub-groups on the host. */
double zp_impl_tensor_part_at(const ZpSchedule *s, uint64_t lo);

/* Stages 1-2: the flat range [*lo, *hi) that DeepSpeed's grads_in_partition spans on `rank`
 * (stage_1_and_2.py get_partition_info's params_in_partition: the whole tensors that overlap
 * the rank's partition), widened to the partition itself (its padding included). */
void zp_impl_params_in_partition(const ZpSchedule *s, int rank, uint64_t *lo, uint64_t *hi);

/* Buckets in backward order (from the last unit down): items (whole units, or whole tensors
 * with by_tensor) grouped up to limit elements; an item larger than limit is a bucket alone
 * (bypass when bypass_large). Stage 3 counts units padded to dp, tensors unpadded (DeepSpeed's
 * ds_numel); a bucket's bytes are its items' padded to dp at stage 3 either way (what its
 * reduce-scatter sends). */
void zp_impl_group_buckets(const ZpSchedule *s, gboolean by_tensor, double limit,
                           gboolean bypass_large, GArray *buckets);

/* Prefetch windows over fetches already listed with use_pos and free_pos: fetch k is issued
 * when fetch i's use starts, i the earliest with fetches i+1..k within the prefetch bucket and
 * i..k within max live (the paper's unit-level rule; a fetch too large goes just in time). */
void zp_impl_prefetch_window(const ZpSchedule *s, GArray *fetches);

/* Unit-level persistence: units at or below the threshold (the paper's rule). */
void zp_impl_persistent_units(const ZpSchedule *s, GArray *ranges);

/* The stage's partition of gradients: all (stages 0-1, padded at 1) or this rank's. */
double zp_impl_partition_grad_elems(const ZpSchedule *s);

/* The elements of the optimizer's states on dp rank `rank` (-1: the most any rank holds):
 * every parameter at stage 0, the implementation's rank_opt_elems at stages 1-2 where it has
 * one, the partition otherwise. The schedule's state is the most (the peak is the worst
 * rank's); zp_sched_rank_state_bytes gives a rank's own. */
uint64_t zp_impl_opt_elems(const ZpSchedule *s, int rank);

/* Rank `rank`'s own model-state bytes per category (ZP_MEM_N entries): the schedule's, with
 * the optimizer's states of zp_impl_opt_elems(s, rank). */
void zp_sched_rank_state_bytes(const ZpSchedule *s, int rank, double *bytes);

/* Nothing around the optimizer. */
void zp_impl_no_step_buffers(const ZpSchedule *s, GArray *buffers);

/* Every non-persistent block twice and the embedding once (unit-level persistence). */
double zp_impl_unit_gather_bound(const ZpModel *model, const ZpPlan *plan);

/* FSDP's unit rules, which FSDP1 (zp_impl_fsdp.c) and FSDP2 (zp_impl_fsdp2.c) share: the
 * reduction's collective (all-reduce without sharding, else reduce-scatter), one reduction
 * per unit as its backward ends (the root's after the embedding's), the units' gathers (the
 * root's from the start to the end of backward, each block one ahead in forward and in
 * backward) and their closed-form buffer terms. */
ZpCollKind zp_impl_fsdp_grad_collective(const ZpPlan *plan);
void zp_impl_fsdp_plan_buckets(const ZpSchedule *s, GArray *buckets);
void zp_impl_fsdp_plan_fetches(const ZpSchedule *s, GArray *fetches);
void zp_impl_fsdp_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r);

/* Megatron-Core's contiguous buffer (zp_impl_megatron.c): its buckets in buffer order
 * (param_and_grad_buffer.py: the parameters in reverse), each with padded_elems, into
 * `buckets` (may be NULL); where each tensor of zp_impl_tensors starts in the buffer into
 * tensor_start (may be NULL; one entry per tensor); returns the buffer's elements, padding
 * included. */
uint64_t zp_impl_megatron_layout(const ZpSchedule *s, GArray *buckets, uint64_t *tensor_start);

/* The paper's closed-form buffer terms (the unit-level schedule's). */
void zp_impl_paper_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r);

#endif
