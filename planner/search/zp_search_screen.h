/* zp_search_screen: the search's closed-form screen, a plan's memory and a lower bound of its
 * simulated step in O(1), that decides which plans the simulator ranks and in what order. */
#ifndef ZP_SEARCH_SCREEN_H
#define ZP_SEARCH_SCREEN_H

#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"

#include <glib.h>

/* The bus bandwidth (nccl-tests' busbw, bytes/s) that the DP or TP group of a world of
 * dp x mp ranks gets from its bottleneck link; the simulator's placement model says. */
typedef double (*ZpBusBandwidthFn)(const ZpHw *hw, int dp, int mp, ZpGroup group);

/* The time the simulator gives one collective of `kind` over `bytes` on that group when
 * nothing else runs: its latency and transfer at full busbw. Contention only stretches the
 * transfer, so every simulated one takes at least this long. */
typedef double (*ZpCollTimeFn)(const ZpHw *hw, int dp, int mp, ZpGroup group, ZpCollKind kind,
                               double bytes);

/* The closed-form screen's per-search constants (zp_search.h zp_search_screen_init makes them
 * from a search's spec). compute_memo: NULL (as zp_search_screen_init leaves it: the screen
 * allocates nothing), or the compute seconds by kind of the plans screened so far, by every
 * field the compute costing reads (compute_key), which zp_search_run keeps for one search
 * (zp_search_screen_keep_costs). */
typedef struct {
    const ZpModel *model;
    const ZpHw *hw;
    double params;
    double block_elems_min; /* the smallest block's elements (units 1..L) */
    ZpBusBandwidthFn bus_bytes_per_s;
    ZpCollTimeFn coll_s;
    GHashTable *compute_memo;
    GHashTable *gather_memo; /* stage 3's gathered elements by gather_key, as compute_memo */
    ZpSchedMemo *tensor_memo; /* the model's tensor table for those (zp_sched.h), as they */
    struct ZpCostMemo *cost_memo; /* the inventory's op times on compute_memo's misses, as they */
} ZpScreen;

/* Screens one plan in O(1) without allocating: *memory_bytes = model states + every residual
 * term + the runtime reserve (zp_mem); *bound_step_s = a lower bound of the simulated step:
 * the step's compute ops at their exact simulated duration (zp_sched_compute_ops), the
 * tensor-parallel all-reduces that sit between them, and the data-parallel collectives at the
 * group's busbw, ignoring latencies; what overlap_comm overlaps counts once:
 *   max(compute + TP (forward, recompute) + max(TP after backward, overlap ? 0 : reductions),
 *       reductions + stage-3 gathers)
 *   + the stage 1-2 parameter all-gather after the optimizer.
 * ZeRO++ lowers the volumes below what it sends: qwZ one byte a gathered element, hpZ half
 * the gathers inside the node, qgZ half a byte a gradient element through its two
 * all-to-alls, the node parts at the intra-node link's rate.
 * With P pipeline stages (V chunks each, m micro-batches) a stage does 1/P of the compute
 * and TP work, its forward and backward stretched by the bubble to (V m + P - 1) / (V m)
 * (not the optimizer, after the flush), and reduces 1/P of the
 * parameters (sends and stage imbalance only add); the memory is the first stage's: its
 * embedding and blocks, and the activations of the micro-batches it holds at once (1F1B:
 * min(P, m); interleaved: Megatron's warm-up plus one, in chunks). */
void zp_search_screen(const ZpScreen *screen, const ZpPlan *plan, double *memory_bytes,
                      double *bound_step_s);

/* The screen's bound with the gathers the schedule plans (zp_sched_gathered_elems: O(tensors),
 * not O(1) as the screen must be): a stage-3 plan's, without hpZ, a pipeline or offloaded
 * parameters; 0 for every other. */
double zp_search_screen_gathers_bound_s(const ZpScreen *screen, const ZpPlan *plan);

/* Keeps the compute costs of the plans screened from here on (compute_memo) and their
 * stage-3 gathered elements (gather_memo), until
 * zp_search_screen_clear: for one search, which screens each shape with its bucket, overlap,
 * ZeRO++ and ZeRO-R choices. */
void zp_search_screen_keep_costs(ZpScreen *screen);
void zp_search_screen_clear(ZpScreen *screen);

#endif
