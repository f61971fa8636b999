/* zp_cost: the time of one compute op of the schedule. With an op table in the profile
 * (zp_optable), each op is the sum of its kernels as real/'s backends issue them — every GEMM
 * of forward, data gradient and weight gradient with its own shape, attention, each
 * elementwise kernel by its real bytes, a launch cost each; without one, with the profile's
 * kernel_rates, the kernels the plan's framework launches (zp_inventory) at their class's rate;
 * without either, the roofline. */
#ifndef ZP_COST_H
#define ZP_COST_H

#include "zp_cost_kernels.h"
#include "zp_hw.h"
#include "zp_inventory.h"
#include "zp_model.h"
#include "zp_optable.h"
#include "zp_plan.h"
#include "zp_sched.h"

#include <glib.h>

/* zp_cost_kernel_shares with each module's time from c's op table (c NULL or without a
 * table: no times). */
struct ZpCost;
void zp_cost_module_shares(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                           const struct ZpCost *c, ZpModuleShares *out);

/* The key of the optimizer's whole-op time: the elements one rank's step covers
 * ("n<elems>"), with the ranks at once beside it as for every whole op. */
void zp_cost_optimizer_shape(double elems, char out[ZP_OPTABLE_SHAPE_LEN]);

/* How the optimizer's time over `elems` comes out of a table: a whole time at exactly that
 * many elements, linear between the whole times at the nearest element counts below and
 * above (`around`), or none (its fitted rate). */
typedef enum { ZP_OPT_PATH_FITTED, ZP_OPT_PATH_WHOLE, ZP_OPT_PATH_INTERPOLATED } ZpOptPath;
ZpOptPath zp_cost_optimizer_whole(const ZpOpTable *t, double elems, int ranks, double *time_s,
                                  double around[2]);

/* How a profile costs a plan's compute ops. */
typedef struct ZpCost {
    const ZpHw *hw;
    gboolean table;             /* the profile's op table, op by op */
    char why[768];              /* which model was used (per op: whole-op times or kernel
                                 * sums; the optimizer's path), and why not the table */
    int ranks;                  /* ranks sharing one machine: the whole-op times' key */
    gboolean whole[ZP_COMP_N];  /* table: this kind's time was measured whole */
    double peak_flops;          /* roofline: the plan's precision's peak */
    /* The profile's GEMM surface prices this plan's GEMMs: it is a 16-bit tensor-core rate
     * (its source: a bf16 MAMF search), so an fp32 plan's GEMMs keep the fp32 roofline. */
    gboolean gemm_surface;
    double attn_flops_per_s;    /* a fused kernel's rate from the profile's attention table */
    /* where the eager kernel lies on its table: sequence, head dimension and query heads
     * per sample on this rank (the model's over the tensor degree) */
    double log2_seq, log2_head_dim, log2_heads;
    double kind_s[ZP_COMP_N];   /* table: one op of each kind (the optimizer: its launch) */
    double optimizer_elem_bytes; /* the schedule's optimizer bytes per element stepped */
    /* table: a block op's share of its time per module (ZpModuleShares time) */
    double module_share[ZP_COMP_N][ZP_MOD_N];
    /* Without a table, with the profile's kernel_rates: the plan's kernel inventory, each
     * kernel at its class's rate (zp_cost_inv_kernel_s); kind_s holds each op's time, class_s
     * its split by class (the optimizer's at the plan's elements, for the report) and
     * module_share the FLOPs' split by module. */
    gboolean inventory;
    const ZpInventory *inv;
    ZpInvDims dims;
    double class_s[ZP_COMP_N][ZP_KCLASS_INVENTORY_N]; /* device seconds by kernel class */
    double host_s[ZP_COMP_N];           /* seconds to issue the op's kernels */
    double launches[ZP_COMP_N];
    double optimizer_elems;             /* the plan's rank's, for class_s */
    /* Each kind's op as the plan's schedule has it (zp_sched_compute_ops): an op of a
     * schedule file that differs is not the model's, and keeps the roofline. */
    double op_flops[ZP_COMP_N], op_mem_bytes[ZP_COMP_N];
    ZpLinkClass dp_link;                /* the data-parallel group's link: its collectives
                                         * overlap compute */
    /* A mixture of experts' or latent attention's blocks by their own kernels
     * (zp_inventory_moe_block): a dense and a sparse unit's block ops (ZP_COST_BLOCKS
     * variants, n_blocks of them), each kind's FLOPs, bytes and seconds; an op matching one
     * is priced so. */
    int n_blocks;
    double block_flops[2][ZP_COMP_N], block_mem_bytes[2][ZP_COMP_N], block_s[2][ZP_COMP_N];
} ZpCost;

/* Chooses the table when hw has one (and for each op of the model and plan its whole-op time,
 * measured with as many ranks at once as the plan puts on a machine, before the sum of its
 * kernels; for the optimizer, zp_cost_optimizer_whole's path at the elements the plan's rank
 * steps (zp_sched_optimizer_elems less an offloaded share; with a pipeline each stage's op
 * takes its own), said in c->why), the model an architecture and the table covers the
 * plan's attention kernel (eager needs "eager_attention", a fused kernel the profile's
 * "attention" entry); else the roofline, saying why in c->why. The table describes the kernels
 * as the backend that was measured runs them, operand dtypes included, whatever the plan's
 * precision. Fails only as the roofline would: no peak for the plan's precision, no rate for a
 * fused kernel. */
gboolean zp_cost_init(ZpCost *c, const ZpHw *hw, const ZpModel *model, const ZpPlan *plan,
                      GError **error);

/* A kernel inventory's op times kept across zp_cost_init_whole_ops calls (memo NULL: none),
 * under every field they read (zp_cost.c InvOpKey): a search's plans share most of their ops'
 * dimensions. The key holds the profile by its address: its contents stay as they are while
 * the memo lives. */
typedef struct ZpCostMemo ZpCostMemo;
ZpCostMemo *zp_cost_memo_new(void);
void zp_cost_memo_free(ZpCostMemo *memo);

/* zp_cost_init for a caller that times whole ops only (zp_cost_op_s with module -1) and never
 * reads c->why, as the search's screen for each plan it bounds: the same times, without the
 * explanation (c->why stays empty) or the per-module shares (module_share stays zero), a
 * tenth of zp_cost_init's instructions in plan --3d gpt-1t/4096. `ops` are the caller's
 * zp_sched_compute_ops(model, plan), which it times with c (an inventory reads their FLOPs and
 * bytes), so that neither computes them twice; memo (may be NULL) keeps the inventory's op
 * times across calls. */
gboolean zp_cost_init_whole_ops(ZpCost *c, const ZpHw *hw, const ZpModel *model,
                                const ZpPlan *plan, const ZpComputeOps ops[ZP_COMP_N],
                                ZpCostMemo *memo, GError **error);

/* Seconds of one compute op of `kind` with the schedule's cost fields, of one block module
 * (ZpBlockModule; -1: the whole op). Table: the kind's whole-op time, else its kernels, times
 * the module's share; the optimizer's whole time at its elements (mem_bytes over the
 * schedule's bytes per element) as zp_cost_optimizer_whole finds it, else launch + mem_bytes at
 * the optimizer rate; roofline:
 * zp_hw_compute_time_s (the fields are the module's already). */
double zp_cost_op_s(const ZpCost *c, ZpComputeKind kind, int module, double flops,
                    double gemm_flops, double attn_flops, double mem_bytes);

/* Seconds of one inventory kernel on the profile's kernel_rates (a GEMM without a "gemm"
 * surface: the roofline's peak x efficiency; a fused attention kernel: its table's rate); 0
 * for a collective, which the schedule's own ops price. */
double zp_cost_inv_kernel_s(const ZpCost *c, const ZpInvKernel *k);

/* Seconds of an inventory op: its kernels' device time, or the host's time to issue them where
 * that is longer; by_class (may be NULL) gets the device time by class. */
double zp_cost_inv_op_s(const ZpCost *c, const ZpInvList *list,
                        double by_class[ZP_KCLASS_INVENTORY_N], double *host_s);

/* Seconds of one kernel from the op table as it runs in a step's stream (its fixed cost
 * launch_stream_s: zp_optable_stream_saving_s); c must use the table. */
double zp_cost_kernel_s(const ZpCost *c, const ZpKernel *k);

/* How much slower a compute op runs while `overlapping` collectives of its rank are in
 * flight: the table's contention factor, 1 when none overlaps or there is no table. */
double zp_cost_contention(const ZpCost *c, int overlapping);

/* Whether a profile's op table was measured on zreal's CPU backend. Two things follow:
 * - the schedule lists that backend's workspace (the two functions above);
 * - a rank's ops run one at a time in the schedule's order (real_engine_step runs each op to
 *   its end, and a collective is MPI's, on the rank's own thread and cores: Open MPI
 *   progresses it only inside its calls), where a GPU's streams overlap compute with NCCL's
 *   kernels; the simulator then runs a rank's compute, collectives and transfers on one
 *   stream. */
gboolean zp_cost_cpu_backend(const ZpHw *hw);

/* The rank's own memory passes around collective `op` as zreal's engine (real_engine.c
 * reduce_flat, reduce_units, gather) performs them at ZeRO stage `stage` on `ranks` ranks: a
 * bucketed all-reduce copies the gradients into its bucket and back, as DeepSpeed does
 * whatever the world size (runtime/engine.py allreduce_bucket flattens the bucket,
 * allreduce_and_copy copies the result back); a reduce-scatter copies into the bucket (stage
 * 1) and delivers this rank's share (a copy, or at stages 2-3 after the first micro-step a
 * widen and add in place); an all-gather copies the buckets' chunks into place (stages 1-2)
 * and, on one rank, MPI copies the slice into the gathered buffer (a table has no one-rank
 * collectives). In-place collectives (no bucket) copy nothing. Fills out[] and returns how
 * many passes. */
#define ZP_COLL_PASSES_MAX 2
typedef struct {
    double bytes; /* the array's */
    gboolean add; /* added in place in bf16, else copied */
} ZpCollPass;
int zp_cost_coll_passes(const ZpOp *op, int stage, int ranks,
                        ZpCollPass out[ZP_COLL_PASSES_MAX]);

/* Bytes those passes move, read plus written (a copy 2 per byte of its array, an add 3). */
double zp_cost_coll_copy_bytes(const ZpOp *op, int stage, int ranks);

/* Seconds of those passes: a copy off the op table's copy curve ("copy", measured by size),
 * or without one at its convert rate, as an add always is; a launch each; 0 without a table
 * (the roofline's collectives stay as NCCL's model has them). */
double zp_cost_coll_copy_s(const ZpCost *c, const ZpOp *op, int stage, int ranks);

#endif
