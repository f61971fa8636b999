/* sim_sums: the per-rank sums a schedule's ops add as sim_ops_build costs them (offload bytes,
 * recomputed and model FLOPs, bytes sent), and the same sums over the longer schedule a fold's
 * virtual periods stand for (sim_fold.c), in its order; private to sim/. */
#ifndef SIM_SUMS_H
#define SIM_SUMS_H

#include "sim_engine_internal.h"

#include <glib.h>
#include <stdint.h>

/* Where an op's figure goes: one of the result's sums, numbered as SimSums lays them out (a
 * slot), or SIM_SUM_NONE for an op that adds to none (allocs, frees, the optimizer). */
#define SIM_SUM_NONE 0u

/* The sums of one run, from sim_sums_begin to sim_sums_end: each slot's sum, and, where the run
 * may count virtual periods (Sim.extend_micro_steps), each op's slot and figure kept in
 * Sim.sum_slot and Sim.sum_figure instead of added, for sim_sums_add_kept to add in the order
 * of whichever schedule the run stands for at its end: a load and an add an op, where a second
 * pass over the ZpOps with each kind's dispatch (the sums added as built thrown away) was
 * 15.9 M of narayanan21-t1-529.6b's 482 M instructions. */
typedef struct {
    double **sum;    /* [slot]: the sum (SIM_SUM_NONE's: `none`, which nothing reads) */
    double none;
    double *stage_flops; /* [stage]: FLOPs of its ops, the optimizer's aside */
    uint32_t flops_base, comm_base, file_base, n_slots;
    uint32_t *slot;  /* Sim.sum_slot, or NULL: added at once */
    double *figure;  /* Sim.sum_figure */
} SimSums;

/* Sets sums up over `result` (its sums zero) for sim's ops; where sim counts virtual periods,
 * allocates Sim.sum_slot and Sim.sum_figure (one each an op) for sim_sums_put to fill. */
void sim_sums_begin(SimSums *sums, Sim *sim, SimResult *result);

/* The slots of offload bytes by kind, recomputed FLOPs, a stage's FLOPs, and a stage's bytes
 * sent on one of the pipeline's communicators (or, a schedule file's own, all stages'). */
static inline uint32_t sim_sums_offload(uint32_t kind)
{
    return 1 + kind;
}

static inline uint32_t sim_sums_recompute(void)
{
    return 1 + ZP_XFER_N;
}

static inline uint32_t sim_sums_stage_flops(const SimSums *sums, uint32_t stage)
{
    return sums->flops_base + stage;
}

static inline uint32_t sim_sums_comm(const SimSums *sums, uint32_t stage, uint32_t group)
{
    return group < ZP_GROUP_N ? sums->comm_base + stage * ZP_GROUP_N + group
                              : sums->file_base + group;
}

/* Op i's figure x goes to `slot`: added now, or kept (where sums->slot is set, every op's is:
 * the ops that add nothing with SIM_SUM_NONE). Once an op, in op order. */
static inline void sim_sums_put(const SimSums *sums, uint32_t i, uint32_t slot, double x)
{
    if (sums->slot) {
        sums->slot[i] = slot;
        sums->figure[i] = x;
    } else {
        *sums->sum[slot] += x;
    }
}

/* The sums added at once made whole (FLOPs averaged over the stages, the most bytes any stage
 * sends); frees what sim_sums_begin took but the kept figures. */
void sim_sums_end(SimSums *sums, const Sim *sim, SimResult *result);

/* sim_sums_add_kept, the run's end: sim_engine_internal.h */

#endif
