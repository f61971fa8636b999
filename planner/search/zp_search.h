/* zp_search: the planner's search over ZeRO stage, batch, checkpointing, TP and bucket sizes:
 * a closed-form screen, then a ranking by a simulator the caller passes (no sim/ in planner/). */
#ifndef ZP_SEARCH_H
#define ZP_SEARCH_H

#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched.h"
#include "zp_search_screen.h"
#include "zp_util.h"

#include <glib.h>
#include <stdint.h>

/* Simulates one plan: its step time and the bytes per GPU it needs (what the caching
 * allocator reserves at the peak, holes included, as `simulate` judges a fit; the search
 * adds the hwprofile's runtime reserve to it). With stop_after_s > 0 (a step the plan cannot
 * win beyond) it may stop as soon as the step is known to exceed that: *step_time_s is then
 * a time past stop_after_s that the step does not undercut, and *peak_memory_bytes is
 * ZP_RANK_STOPPED (nothing was sized). */
typedef gboolean (*ZpRankFn)(const ZpPlan *plan, void *ctx, double stop_after_s,
                             double *step_time_s, double *peak_memory_bytes, GError **error);
#define ZP_RANK_STOPPED (-1.0)

/* Techniques a search may be told never to try (ZpSearchSpec.exclude): ZeRO++'s qwZ (int8
 * parameter gathers) and qgZ (int4 gradients), both lossy, and hpZ (lossless); ZeRO-R's Pa,
 * MD and Pa+cpu; activation checkpointing itself. */
typedef enum {
    ZP_TECH_QWZ = 1 << 0,
    ZP_TECH_QGZ = 1 << 1,
    ZP_TECH_HPZ = 1 << 2,
    ZP_TECH_PA = 1 << 3,
    ZP_TECH_MD = 1 << 4,
    ZP_TECH_PA_CPU = 1 << 5,
    ZP_TECH_CHECKPOINT = 1 << 6,
} ZpTechnique;

typedef struct {
    const ZpModel *model; /* with an architecture */
    const ZpHw *hw;
    int gpus;
    int64_t global_batch; /* 0: free, and a step is one micro-step (no accumulation) */
    int mp;               /* 0: every degree that divides gpus_per_node, the heads and gpus */
    /* 3D: also tensor parallelism over whole nodes (mp a multiple of gpus_per_node), and, with
     * a global batch, pipeline stages P (gpus / (mp P) the data-parallel degree) run 1F1B or
     * interleaved with V = 2 or 4 chunks a stage, ZeRO stages 0-1 only (DeepSpeed's rule). */
    gboolean three_d;
    int stage;            /* -1: stages 0 to 3 */
    int micro_batch;      /* 0: searched */
    ZpPrecision precision;
    ZpOptimizer optimizer;
    ZpAttention attention;      /* the kernel every plan uses (the caller resolves "flash") */
    ZpReduceDtype reduce_dtype; /* the dtype every plan reduces gradients in */
    ZpImplKind impl;            /* whose ZeRO every plan follows (its stages only) */
    char kernels[16];           /* every plan's kernel inventory (ZpPlan kernels): "" follows impl */
    /* Offload every plan uses (DeepSpeed's defaults otherwise); stages that cannot offload
     * that way (0 for the optimizer, 0-2 for parameters) are left out. */
    ZpOffloadDevice offload_optimizer, offload_param;
    unsigned exclude;     /* ZpTechnique bits never tried (0: every one) */
    int top_k;            /* how many ranked plans to keep */
    ZpRankFn rank;
    void *rank_ctx;
    /* NULL bounds every group by the intra-node link, which no busbw exceeds. */
    ZpBusBandwidthFn bus_bytes_per_s;
    /* NULL: a tensor-parallel all-reduce is bounded by its bytes at busbw alone. */
    ZpCollTimeFn coll_s;
    ZpProgressFn progress; /* NULL, or told the share of screened plans ranked so far */
    void *progress_ctx;
    /* TRUE: no branch and bound: every plan that passes the memory screen is simulated to
     * the end, whatever its bound (the ZeRO-R and ZeRO++ parent rules, which say which plans
     * are tried, still hold). What the pruned search must rank alike; tests set it. */
    gboolean exhaustive;
} ZpSearchSpec;

/* A spec that searches everything for model on gpus GPUs of hw: fp16 mixed precision with
 * Adam, eager attention, gradients reduced in their own dtype, free global batch, top 5; rank
 * (and rank_ctx) must still be set. */
void zp_search_spec_defaults(ZpSearchSpec *spec, const ZpModel *model, const ZpHw *hw, int gpus);

/* A candidate's base: the defaults at `stage`, dp and mp with the spec's precision, optimizer,
 * attention, gradient-reduction dtype, implementation and kernel source, which every search
 * (dense and MoE) carries into each plan it tries. */
void zp_search_plan_base(const ZpSearchSpec *spec, int stage, int dp, int mp, ZpPlan *plan);

typedef enum {
    ZP_FATE_OUT_OF_MEMORY, /* the closed form says it does not fit */
    ZP_FATE_CANNOT_WIN,    /* fits, but its time bound is no better than simulated plans */
    ZP_FATE_SIMULATED_OOM, /* passed the screen, but its simulated need does not fit */
    ZP_FATE_SIMULATED,     /* simulated, and it fits */
    ZP_FATE_N
} ZpFate;

typedef struct {
    ZpPlan plan;
    int buckets;              /* index of its bucket sizes (zp_search_buckets_name) */
    int parent;               /* the same plan with the ZeRO-R level before this one (a
                               * ZeRO++ plan at other buckets: at DeepSpeed's), tried first
                               * (this one only when that does not fit), or -1 */
    ZpFate fate;
    double memory_bytes;      /* closed form: model states + residual + runtime reserve */
    double bound_step_s;      /* closed-form lower bound of the simulated step time */
    double step_time_s;       /* simulated (0 when not simulated, -1 when its simulation
                               * stopped past what could win) */
    double peak_memory_bytes; /* simulated need (allocator-reserved peak) + runtime reserve
                               * (0 when not simulated) */
} ZpCandidate;

typedef struct {
    GArray *candidates;   /* ZpCandidate: every plan enumerated */
    GArray *ranked;       /* guint indices into candidates: fitting simulated plans, fastest
                           * per sample first, at most top_k */
    int stage_best[4][2]; /* [stage][checkpoint]: the fastest fitting simulated plan, or -1 */
    int stage_closest[4][2]; /* [stage][checkpoint]: the plan over memory by the least, or -1 */
    int closest;          /* the plan over memory by the least overall, or -1 */
    int pipe_best[2];     /* [checkpoint]: the fastest fitting simulated plan with pipeline
                           * stages (those are not in stage_best), or -1 */
    guint count[ZP_FATE_N];
    guint stopped; /* simulations stopped once the step passed what could win (those plans
                    * are ZP_FATE_CANNOT_WIN) */
    guint past_stop; /* stage-3 plans not simulated, their bound with the gathers the schedule
                      * plans already past where the simulation would stop (ZP_FATE_CANNOT_WIN,
                      * step_time_s -1 as if stopped) */
} ZpSearchResult;

/* Every plan the spec allows, with DeepSpeed's other defaults: ZpCandidate with fate and
 * figures unset (GArray, caller unrefs). Each plan with checkpointing comes with its ZeRO-R
 * levels (MD, Pa, Pa + MD, Pa+cpu where they apply), each the parent of the next; each stage-3
 * plan at DeepSpeed's buckets and overlap_comm with the ZeRO++ options that apply (qwZ, hpZ
 * over a node's data-parallel ranks, qgZ), every plan with the cluster's gpus_per_node. With a global batch B, a TP degree mp (and, 3D,
 * pipeline stages P) is tried when dp = gpus/(mp P) divides B, micro-batches are the divisors
 * of B/dp and accumulation (the pipeline's micro-batches) the rest;
 * without one, micro-batches are powers of two and accumulation 1. Fails naming the flag when
 * the spec leaves nothing to try: a global batch no data-parallel degree divides, a TP degree
 * that does not divide the heads, the GPUs or a node, a precision the GPU has no peak for. */
GArray *zp_search_enumerate(const ZpSearchSpec *spec, GError **error);

gboolean zp_search_screen_init(ZpScreen *screen, const ZpSearchSpec *spec, GError **error);


/* Enumerates (leaving out plans whose accumulation would make a schedule longer than
 * ZP_SCHED_MAX_UNIT_STEPS), screens, and simulates the plans that fit and might win: candidates in order of
 * their bound per sample, each simulated only while its bound is below the top_k-th simulated
 * time per sample or below the best of its stage x checkpointing group, so the ranking and
 * the per-stage bests are exact whenever the bound holds. A ZeRO-R level is simulated only
 * when its parent does not fit (it is the same plan with more work). A simulated plan whose
 * need plus reserve exceeds GPU memory is dropped (ZP_FATE_SIMULATED_OOM). A simulation stops
 * once its step passes both those times (with the twin tolerance to spare): that plan cannot
 * win either (ZP_FATE_CANNOT_WIN, its bound raised to where it stopped, step_time_s -1); should
 * a ZeRO++ plan at other buckets, tried only when its parent does not fit, come up after a
 * stopped parent, the parent runs to the end first. An empty ranking means nothing fits;
 * `closest` then says by how little. */
gboolean zp_search_run(const ZpSearchSpec *spec, ZpSearchResult *result, GError **error);

/* The note for what the search leaves out on GPUs that are not whole nodes (ZeRO++'s hpZ and
 * qgZ, which need them: zp_zeropp_check), or NULL when it leaves nothing out. Free with g_free. */
char *zp_search_whole_node_note(const ZpSearchSpec *spec);

void zp_search_result_clear(ZpSearchResult *result);

static inline const ZpCandidate *zp_search_candidate(const ZpSearchResult *r, int index)
{
    return &g_array_index(r->candidates, ZpCandidate, index);
}
static inline const ZpCandidate *zp_search_ranked(const ZpSearchResult *r, guint i)
{
    return zp_search_candidate(r, (int)g_array_index(r->ranked, guint, i));
}

/* Samples per optimizer step: micro_batch x grad_accum x dp. */
double zp_search_samples(const ZpPlan *plan);

/* Model FLOPs one GPU does per step: forward and backward, not recomputation (the MFU
 * definition; the simulator's SimResult.model_flops), a 1/P share with P pipeline stages. */
double zp_search_model_flops(const ZpModel *model, const ZpPlan *plan);


/* The ZeRO-R and ZeRO++ options a plan has on, as the search names them: "Pa", "Pa+cpu",
 * "cpu ckpt", "MD", "qwZ", "qgZ", "hpZ 8", comma-separated; "" for none. Newly allocated. */
char *zp_search_options_text(const ZpPlan *plan);

/* "deepspeed", "hf-auto", ...: the name of a bucket-size choice. */
const char *zp_search_buckets_name(int buckets);
const char *zp_search_fate_name(ZpFate fate);

#endif
