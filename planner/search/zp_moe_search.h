/* zp_moe_search: the planner's search for a mixture of experts — expert-parallel degree with
 * ZeRO stage, tensor degree, micro-batch, checkpointing and (under --impl megatron) the token
 * dispatcher — screened in closed form (zp_ep's states and all-to-all, the allgather
 * dispatcher's collectives, the cost model over the schedule's compute ops), its shortlist then
 * simulated through the search's rank callback. */
#ifndef ZP_MOE_SEARCH_H
#define ZP_MOE_SEARCH_H

#include "zp_search.h"

#include <glib.h>

typedef struct {
    ZpPlan plan;
    double states_bytes;   /* model states per GPU (zp_ep_model_states) */
    double residual_bytes; /* activations, buffers and the reserve (zp_mem_residual) */
    double memory_bytes;   /* their sum */
    /* per optimizer step; alltoall_s the dispatcher's collectives (the all-to-alls, or the
     * allgather dispatcher's gathers and reduce-scatters) */
    double compute_s, tp_s, alltoall_s, dp_s, step_s;
    double tokens_per_s;
    gboolean fits;
    /* Re-ranked by the simulator (zp_moe_search_simulate): step_s, tokens_per_s, memory_bytes
     * (the allocator-reserved peak and the reserve) and fits are then its schedule's, the
     * closed form's kept in closed_step_s and closed_memory_bytes. */
    gboolean simulated;
    double closed_step_s, closed_memory_bytes;
    /* The simulated schedule's model FLOPs per GPU (forward and backward, the routed experts
     * included: SimResult.model_flops), where the caller read its run (cli_moe); 0 otherwise. */
    double model_flops;
} ZpMoeCandidate;

/* Every plan the spec allows: EP dividing the experts and the data-parallel degree, TP
 * dividing a node, the heads and the GPUs (spec->mp: that one), stages 0-3 (spec->stage: that
 * one), micro-batches dividing the global batch's share (spec->micro_batch: that one), with and
 * without checkpointing, under --impl megatron each with either dispatcher where the allgather
 * one communicates and zp_plan_dispatcher_check lets it; `skew` and `capacity_factor` as
 * ZpExpertConfig has them. Returns the
 * candidates (ZpMoeCandidate), those that fit in spec->hw->gpu_memory_bytes first by tokens/s,
 * then the rest by memory; the caller unrefs. NULL with error on a spec it cannot search
 * (a dense model, latent attention, a global batch the GPUs do not divide). */
GArray *zp_moe_search_run(const ZpSearchSpec *spec, double skew, double capacity_factor,
                          GError **error);

/* Times the closed form's shortlist with spec->rank (the simulator, as the dense search ranks
 * its plans): the first `top` that fit and the best ZP_MOE_SIMULATED_PER_EP fitting plans of
 * each EP degree (the closed form's screen misjudges stage 3's gathers); those it
 * times go first, by simulated tokens/s among those that fit, then the rest as they were.
 * Returns how many it timed; nothing without spec->rank. A plan the simulator refuses keeps
 * its closed form and does not fit. */
guint zp_moe_search_simulate(const ZpSearchSpec *spec, GArray *candidates, guint top);
#define ZP_MOE_SIMULATED_PER_EP 4
/* The same for each ZeRO stage's best (`zplan sweep`'s): where no candidate of the stage the
 * simulator timed fits, its fitting ones in the closed form's order are timed until one fits
 * when simulated, `tries` at most; then sorted as zp_moe_search_simulate sorts. Returns how
 * many it timed. */
guint zp_moe_search_simulate_stages(const ZpSearchSpec *spec, GArray *candidates, guint tries);

#endif
