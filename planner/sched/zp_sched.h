/* zp_sched: the builder of the per-rank schedule of one training step (zp_sched_graph.h: the
 * op graph it emits, the contract sim/ and real/ execute), and its JSON reader and writer.
 *
 * The builder is a core (zp_sched.c: the plan's checks, each stage's walk) and one file per
 * part it plugs in (zp_build.h): op emission, layout, gradient buckets, qgZ, offload, stage-3
 * gathers, a micro-step's compute, tensor parallelism, checkpoints, pipeline sends, the
 * optimizer step. */
#ifndef ZP_SCHED_H
#define ZP_SCHED_H

#include "zp_hw.h"
#include "zp_impl.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"
#include "zp_util.h"

#include <glib.h>
#include <stdint.h>

/* Whole steady periods a schedule lacks against a longer one of the same plan (more
 * micro-steps): `periods` copies of one stage's ops [at - step, at), a period of
 * `micro_steps` micro-steps, which the longer schedule has before op `at` of this one (the
 * builder inserts steady periods op for op as grad_accum grows; sim_fold.c counts them as
 * virtual periods, zp_alloc_replay replays them). */
typedef struct {
    uint32_t at, step, micro_steps;
    uint64_t periods;
} ZpOpInsert;

/* The most micro-steps x units (layers + 2) one schedule holds: a schedule lists every
 * micro-step's ops (about 6 to 13 per unit), so this bounds a build and its simulation to
 * about 1.5 s and 1 GB (stage 3 with checkpointing, the most ops per unit). Larger plans are
 * refused naming grad-accum. */
#define ZP_SCHED_MAX_UNIT_STEPS 5e5

/* Builds the schedule of one optimizer step (grad_accum micro-steps) for a rank.
 * The model must have an architecture. Fails naming the plan field that is invalid. */
ZpSchedule *zp_sched_build(const ZpModel *model, const ZpPlan *plan, GError **error);
/* The plan's schedule built `shorter` micro-steps short (0 < shorter < grad_accum): the long
 * one's with whole steady periods fewer, op for op, every op costing what the long one's does
 * (ZpPlan.step_grad_accum): what the fold extends by virtual periods (SimOptions.
 * extend_micro_steps). The builder's schedule of m micro-steps is its schedule of m - k with
 * whole steady periods inserted (tests/test_sim_extend.c). */
ZpSchedule *zp_sched_build_short(const ZpModel *model, const ZpPlan *plan, int shorter,
                                 GError **error);
/* zp_sched_build with every op written through the emitters one by one: no block written in
 * one pass (Builder.blocks_direct), no pipeline action written again from the last of its kind
 * (zp_build_replay): the schedule zp_sched_build must equal, op for op (tests). */
ZpSchedule *zp_sched_build_op_by_op(const ZpModel *model, const ZpPlan *plan, GError **error);

/* What a rank of pipeline stage `stage` (0 <= stage < sched->stages) executes: the same ops
 * (shared; a rank runs those with op->stage == stage and receives what the others send it),
 * with that stage's layout, padding and model states in place of the last stage's. Free it
 * with zp_sched_free. */
ZpSchedule *zp_sched_stage_view(const ZpSchedule *sched, int stage);

/* The compute ops of one step in closed form (ZpComputeOps, zp_sched_graph.h), as
 * zp_sched_build emits them. */

/* ZeRO++'s quantize kernels are not among them: the search plans no ZeRO++. */
void zp_sched_compute_ops(const ZpModel *model, const ZpPlan *plan,
                          ZpComputeOps ops[ZP_COMP_N]);

/* One block op of unit `unit` (1..L) as zp_sched_build emits it for a model whose blocks
 * differ (a mixture of experts, latent attention): its FLOPs and bytes (kind block_fwd,
 * recompute under full checkpointing, or block_bwd). FALSE for a model of uniform blocks. */
gboolean zp_sched_unit_block_op(const ZpModel *model, const ZpPlan *plan, int unit,
                                ZpComputeKind kind, double *flops, double *mem_bytes);

/* The elements one rank's optimizer steps without a pipeline, as zp_sched_build lays them
 * out (before optimizer offload takes its share): every parameter at stage 0, the padded
 * total's 1/dp at stages 1-2, the sum of each unit's padded 1/dp at stage 3. */
uint64_t zp_sched_optimizer_elems(const ZpModel *model, const ZpPlan *plan);

/* Stage 3 without a pipeline: the elements one micro-step's parameter all-gathers cover, as
 * zp_sched_build plans them (the implementation's fetches, their prefetch and reuse, padding
 * included), without building the schedule: O(tensors). Each micro-step of the built
 * schedule gathers at least that (test_search_prune). */
double zp_sched_gathered_elems(const ZpModel *model, const ZpPlan *plan);

/* The same, with `memo` (NULL: none) keeping the model's tensor table and what their names
 * say (ZpSchedMemo model_tensors, tensor_notes) from one call to the next: a memo serves one
 * model only (the search's screen: plan --3d gpt-1t/4096 named 128 layers' tensors at each
 * stage-3 shape). */
double zp_sched_gathered_elems_kept(const ZpModel *model, const ZpPlan *plan,
                                    ZpSchedMemo *memo);

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
/* Group g as its members sit in the world's order (the plan's ZpRankOrder; g counts zplan's
 * ranks): under tp-dp-pp with stages, dp's groups (and their subgroups) mp P times closer,
 * the pipeline's mp dp apart, and runs of tensor ranks of several dp ranks one run where they
 * then abut (Megatron's expert groups); else g. zp_sched_placed_stride: its stride. */
ZpCommGroup zp_sched_placed_group(const ZpSchedule *sched, const ZpCommGroup *g);
int zp_sched_placed_stride(const ZpSchedule *sched, const ZpCommGroup *g);

/* A mixture of experts under expert parallelism keeps each sparse block's routed experts out
 * of the flat layout above (unit_elems holds the rest: attention, norms, router, shared
 * experts): a rank holds E / EP experts of each sparse unit, split over the tensor group,
 * in an expert space of their own, which ZeRO partitions over the expert-data-parallel group
 * (ZP_GROUP_EDP, dp / EP ranks) as the flat space over dp: its total, padded (to a multiple of
 * dp / EP, each unit at stage 3) and per-rank partition elements. Expert collectives (the
 * gradients' reduction, stage 3's gathers, stages 1-2's gather of updated parameters) name
 * ranges of this space in elem_offset and elems. All zero for a dense model. */
typedef struct {
    uint64_t total_elems, padded_elems, partition_elems;
} ZpSchedExperts;
ZpSchedExperts zp_sched_experts(const ZpSchedule *sched);
/* A unit's experts on this rank (0: a dense unit, another stage's) and where they start. */
uint64_t zp_sched_unit_expert_elems(const ZpSchedule *sched, int unit);
uint64_t zp_sched_unit_expert_offset(const ZpSchedule *sched, int unit);
/* Whether the expert gradients are kept as this rank's partition of the expert space (and so
 * reduce-scattered over EDP): from stage 2, and at stage 1 where the implementation keeps the
 * dense ones so (DeepSpeed's grads_in_partition); whole otherwise (all-reduced). */
gboolean zp_sched_expert_grads_partitioned(const ZpSchedule *sched);

/* JSON round trip (`zplan schedule --out`); the reader validates every field, since zreal
 * executes what it reads: an --impl paper schedule through zp_schedcheck (it may be edited),
 * one of another implementation by equality with the builder's ops for its model and plan. */
gboolean zp_sched_write_json(const ZpSchedule *sched, const char *path, GError **error);
/* The same, telling `progress` (or NULL) the share of the ops written: a million-op schedule
 * takes seconds (zplan schedule --out). */
gboolean zp_sched_write_json_progress(const ZpSchedule *sched, const char *path,
                                      ZpProgressFn progress, void *progress_ctx, GError **error);
/* "sha256:HEX": GLib's SHA-256 of the ops' canonical serialisation (each op as the compact
 * JSON object zp_sched_write_json writes, keys sorted, one a line), which the writer stores as
 * "digest" and zp_sched_read_json compares (ZpSchedule.digest): an edit that keeps every check
 * still shows. Free with g_free. */
char *zp_sched_digest(const ZpSchedule *sched);
/* The same, telling `progress` (or NULL) the share of the ops hashed. */
char *zp_sched_digest_progress(const ZpSchedule *sched, ZpProgressFn progress,
                               void *progress_ctx);
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
 * reads back to the same ops, so it simulates exactly as the plan does; a pipeline's (its
 * "stages") is read by zp_sched_read_json, which holds it to its model and plan. */
ZpSchedule *zp_sched_read_graph(const char *path, GError **error);

/* How zp_sched_read_file reads a file. AUTO, as zp_sched_read_json and _graph: "ops" streamed
 * element by element (zp_jsonstream), each op converted as it comes, the other keys held as
 * trees; and the whole file as one Jansson tree where the stream gives up (anything the tree
 * reader may refuse, which it then refuses in its own words; a file that cannot be read twice,
 * a FIFO). TREE: the whole tree alone. STREAM: the stream alone, failing where AUTO falls back
 * (tests hold the two readings to the same schedules and refusals). `graph`: _graph's
 * reading, else _json's. */
typedef enum { ZP_SCHED_READ_AUTO, ZP_SCHED_READ_TREE, ZP_SCHED_READ_STREAM } ZpSchedRead;
ZpSchedule *zp_sched_read_file(const char *path, gboolean graph, ZpSchedRead how,
                               ZpProgressFn progress, void *progress_ctx, GError **error);
/* zp_sched_read_graph telling `progress` (or NULL) how far it is: the ops read (by the bytes
 * of the file passed), then those checked against its digest. A million-op file takes
 * seconds. */
ZpSchedule *zp_sched_read_graph_progress(const char *path, ZpProgressFn progress,
                                         void *progress_ctx, GError **error);

#endif
