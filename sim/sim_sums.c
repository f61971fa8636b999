/* sim_sums: the per-rank sums a schedule's ops add (offload bytes, FLOPs, bytes sent), added
 * as sim_ops_build costs each op, or kept and added at the run's end in the order of the
 * longer schedule a fold's virtual periods stand for. */
#include "sim_sums.h"
#include "sim_engine.h"

#include <string.h>

/* The slots' sums over result and stage_flops (SimSums' layout: none, offload bytes by kind,
 * recomputed FLOPs, each stage's FLOPs, each stage's bytes by pipeline communicator, each
 * communicator's of a schedule file). */
static void lay_out(SimSums *sums, const Sim *sim, SimResult *result, double *stage_flops)
{
    const uint32_t stages = sim->sim_pp;
    sums->stage_flops = stage_flops;
    sums->flops_base = 2 + ZP_XFER_N;
    sums->comm_base = sums->flops_base + stages;
    sums->file_base = sums->comm_base + stages * ZP_GROUP_N;
    sums->n_slots = sums->file_base + ZP_SCHED_MAX_GROUPS;
    sums->sum = g_new(double *, sums->n_slots);
    sums->none = 0;
    sums->sum[SIM_SUM_NONE] = &sums->none;
    for (uint32_t k = 0; k < ZP_XFER_N; k++)
        sums->sum[sim_sums_offload(k)] = &result->offload_bytes[k];
    sums->sum[sim_sums_recompute()] = &result->recompute_flops;
    for (uint32_t s = 0; s < stages; s++) {
        sums->sum[sim_sums_stage_flops(sums, s)] = &stage_flops[s];
        for (uint32_t g = 0; g < ZP_GROUP_N; g++)
            sums->sum[sim_sums_comm(sums, s, g)] = &result->stage_comm_bytes[s * ZP_GROUP_N + g];
    }
    for (uint32_t g = 0; g < ZP_SCHED_MAX_GROUPS; g++)
        sums->sum[sums->file_base + g] = &result->comm_bytes[g];
}

void sim_sums_begin(SimSums *sums, Sim *sim, SimResult *result)
{
    *sums = (SimSums){0};
    lay_out(sums, sim, result, g_new0(double, sim->sim_pp));
    if (sim->extend_micro_steps == 0)
        return;
    /* 12 bytes an op, written once in op order (as the SimOps: zp_advise_huge_pages) */
    const size_t n = MAX(sim->n_ops, 1);
    sim->sum_slot = sums->slot = g_new(uint32_t, n);
    sim->sum_figure = sums->figure = g_new(double, n);
    zp_advise_huge_pages(sums->slot, n * sizeof *sums->slot);
    zp_advise_huge_pages(sums->figure, n * sizeof *sums->figure);
}

/* Per rank: FLOPs averaged over the stages (MFU is the mean GPU's), the bytes of the stage
 * that sends most (all of them without a pipeline). */
static void finish(const SimSums *sums, const Sim *sim, SimResult *result)
{
    result->recompute_flops /= sim->sim_pp;
    for (uint32_t k = 0; k < sim->sim_pp; k++) {
        result->model_flops += sums->stage_flops[k] / sim->sim_pp;
        for (int g = 0; g < ZP_GROUP_N; g++)
            result->comm_bytes[g] =
                MAX(result->comm_bytes[g], result->stage_comm_bytes[k * ZP_GROUP_N + g]);
    }
}

static void drop(SimSums *sums)
{
    g_free(sums->sum);
    g_free(sums->stage_flops);
    sums->sum = NULL;
    sums->stage_flops = NULL;
}

void sim_sums_end(SimSums *sums, const Sim *sim, SimResult *result)
{
    if (!sums->slot) /* else kept: sim_sums_add_kept finishes them */
        finish(sums, sim, result);
    drop(sums);
}

/* ---- the longer schedule's order ---- */

/* Whole numbers below 2^53 add exactly, in any order: a double holds each, and their sum
 * too while it stays below (a true sum at or past 2^53 rounds to at least 2^53: not whole). */
#define EXACT_SUM_LIMIT 9007199254740992.0 /* 2^53 */

/* x is a whole number below 2^53 (converted to an integer and back where it is one: floor()
 * was a call, 3.7 M of narayanan21-t1-529.6b's sums) */
static inline gboolean whole(double x)
{
    return x >= 0 && x < EXACT_SUM_LIMIT && (double)(int64_t)x == x;
}

/* A slot's part in one period (add_periods): not in it yet, or its figures' total exact (or
 * not) so far. */
enum { PERIOD_UNSEEN, PERIOD_EXACT, PERIOD_ONE_BY_ONE };

/* A figure added one by one: its slot and itself. */
typedef struct {
    uint32_t slot;
    double x;
} Listed;

/* Per slot, the period's total and state, and the slots the period touched (to clear); the
 * period's figures added one by one, listed, then grouped by slot in their order (room for
 * the longest period's each), and where each slot's group lies in one_by_one. */
typedef struct {
    double *total;
    uint8_t *state;
    uint32_t *touched;
    uint32_t n_touched;
    Listed *listed; /* the figures added one by one, in op order */
    double *one_by_one;
    uint32_t *group_start, *group_end; /* [slot]: its group in one_by_one */
} PeriodTotals;

/* sum + x[0] + .. + x[n - 1], the n figures in their order, `periods` times over: the few
 * figures of a period (Megatron 1T: 2 or 4 a sum) held in registers, not loaded again for
 * each addition. */
static double add_repeated(double sum, const double *x, size_t n, uint64_t periods)
{
    switch (n) {
    case 1:
        for (uint64_t r = 0; r < periods; r++)
            sum += x[0];
        return sum;
    case 2:
        for (uint64_t r = 0; r < periods; r++)
            sum = sum + x[0] + x[1];
        return sum;
    case 4:
        for (uint64_t r = 0; r < periods; r++)
            sum = sum + x[0] + x[1] + x[2] + x[3];
        return sum;
    default:
        for (uint64_t r = 0; r < periods; r++)
            for (size_t k = 0; k < n; k++)
                sum += x[k];
        return sum;
    }
}

/* The figures of the slots add_periods left PERIOD_ONE_BY_ONE, again one by one, `periods`
 * times: listed first, grouped by slot in their order, so that each sum takes its own figures
 * period after period in a register, the very additions in the very order that the periods
 * over all of them give it (no two slots share a sum). One list for all, a load and a store
 * through a pointer an addition, was 1.3 M of Megatron 1T's instructions. */
static void add_one_by_one(const SimSums *sums, const Sim *sim, const SimFoldInsert *x,
                           PeriodTotals *p)
{
    const uint32_t *slot = sim->sum_slot;
    const double *figure = sim->sum_figure;
    /* Listed in one pass over the period, then grouped: a period's ops are many (Megatron
     * 529.6b: 1,575), its figures added one by one few (4 or 6) */
    uint32_t n = 0;
    for (uint32_t j = x->at - x->step; j < x->at; j++)
        if (p->state[slot[j]] == PERIOD_ONE_BY_ONE)
            p->listed[n++] = (Listed){slot[j], figure[j]};
    if (n == 0)
        return;
    for (uint32_t k = 0; k < p->n_touched; k++)
        p->group_end[p->touched[k]] = 0; /* first each slot's count */
    for (uint32_t m = 0; m < n; m++)
        p->group_end[p->listed[m].slot]++;
    uint32_t at = 0;
    for (uint32_t k = 0; k < p->n_touched; k++) {
        const uint32_t t = p->touched[k], count = p->group_end[t];
        p->group_start[t] = p->group_end[t] = at;
        at += count;
    }
    for (uint32_t m = 0; m < n; m++)
        p->one_by_one[p->group_end[p->listed[m].slot]++] = p->listed[m].x;
    for (uint32_t k = 0; k < p->n_touched; k++) {
        const uint32_t t = p->touched[k];
        if (p->state[t] != PERIOD_ONE_BY_ONE)
            continue;
        const double *const from = &p->one_by_one[p->group_start[t]];
        const size_t count = p->group_end[t] - p->group_start[t];
        *sums->sum[t] = add_repeated(*sums->sum[t], from, count, x->periods);
    }
}

/* Adds an insert's `periods` periods (the kept figures of ops [at - step, at), again) to the
 * sums. A sum whose figures are whole numbers, and stays below 2^53, gets periods x one
 * period's: no addition rounds, so their order does not matter and that is the very double
 * the op-by-op additions give (the figures are not negative: each partial sum lies between
 * the start and the end). Any other sum (the recomputed FLOPs, summed over every stage, pass
 * 2^53 on Megatron's 1T) gets the period's figures again one by one, in order, `periods`
 * times: the same additions. */
static void add_periods(const SimSums *sums, const Sim *sim, const SimFoldInsert *x,
                        PeriodTotals *p)
{
    if (x->step == 0 || x->at < x->step)
        return; /* no period before it */
    const uint32_t first = x->at - x->step;
    const uint32_t *slot = sim->sum_slot;
    const double *figure = sim->sum_figure;
    p->n_touched = 0;
    for (uint32_t j = first; j < x->at; j++) {
        const uint32_t t = slot[j];
        if (t == SIM_SUM_NONE)
            continue;
        if (p->state[t] == PERIOD_UNSEEN) {
            p->state[t] = whole(*sums->sum[t]) ? PERIOD_EXACT : PERIOD_ONE_BY_ONE;
            p->total[t] = 0;
            p->touched[p->n_touched++] = t;
        }
        p->total[t] += figure[j];
        if (p->state[t] == PERIOD_EXACT && !(whole(figure[j]) && whole(p->total[t])))
            p->state[t] = PERIOD_ONE_BY_ONE;
    }
    const double periods = (double)x->periods;
    for (uint32_t k = 0; k < p->n_touched; k++) {
        const uint32_t t = p->touched[k];
        /* the end: whole and below 2^53, so every step was */
        if (p->state[t] == PERIOD_EXACT && p->total[t] > 0 &&
            !whole(*sums->sum[t] + periods * p->total[t]))
            p->state[t] = PERIOD_ONE_BY_ONE;
        if (p->state[t] == PERIOD_EXACT)
            *sums->sum[t] += periods * p->total[t];
    }
    /* The rest one by one (most of a period's ops add to exact sums, or none: Megatron 1T's
     * 64 inserts walked 3.2 M ops for 0.7 M additions) */
    add_one_by_one(sums, sim, x, p);
    for (uint32_t k = 0; k < p->n_touched; k++)
        p->state[p->touched[k]] = PERIOD_UNSEEN;
}

/* The result's sums from the kept figures over the schedule with the n inserts. */
static void replay(const Sim *sim, SimResult *result, const SimFoldInsert *inserts,
                   size_t n_inserts)
{
    memset(result->offload_bytes, 0, sizeof result->offload_bytes);
    memset(result->comm_bytes, 0, sizeof result->comm_bytes);
    memset(result->stage_comm_bytes, 0,
           (size_t)sim->sim_pp * ZP_GROUP_N * sizeof *result->stage_comm_bytes);
    result->recompute_flops = result->model_flops = 0;
    SimSums sums = {0};
    lay_out(&sums, sim, result, g_new0(double, sim->sim_pp));
    /* SIM_SUM_NONE's state stays PERIOD_UNSEEN: add_periods skips it */
    uint32_t longest = 1;
    for (size_t k = 0; k < n_inserts; k++)
        longest = MAX(longest, inserts[k].step);
    PeriodTotals p = {.total = g_new(double, sums.n_slots),
                      .state = g_new0(uint8_t, sums.n_slots),
                      .touched = g_new(uint32_t, sums.n_slots),
                      .listed = g_new(Listed, MIN(longest, MAX(sim->n_ops, 1))),
                      .one_by_one = g_new(double, MIN(longest, MAX(sim->n_ops, 1))),
                      .group_start = g_new(uint32_t, sums.n_slots),
                      .group_end = g_new(uint32_t, sums.n_slots)};
    double *const *sum = sums.sum;
    const uint32_t *slot = sim->sum_slot;
    const double *figure = sim->sum_figure;
    const uint32_t n_ops = sim->n_ops;
    /* The ops up to the next insert's, then the inserts there (an insert at or past the end
     * has no op to come before) */
    size_t k = 0;
    for (uint32_t i = 0; i < n_ops;) {
        const uint32_t next = k < n_inserts ? MIN(inserts[k].at, n_ops) : n_ops;
        for (; i < next; i++)
            *sum[slot[i]] += figure[i]; /* SIM_SUM_NONE's: into `none` */
        for (; i < n_ops && k < n_inserts && inserts[k].at == i; k++)
            add_periods(&sums, sim, &inserts[k], &p);
    }
    finish(&sums, sim, result);
    drop(&sums);
    g_free(p.total);
    g_free(p.state);
    g_free(p.touched);
    g_free(p.listed);
    g_free(p.one_by_one);
    g_free(p.group_start);
    g_free(p.group_end);
}

void sim_sums_add_kept(const Sim *sim, SimResult *result, const GArray *inserts,
                       gboolean extended)
{
    g_assert(sim->sum_slot || !extended); /* virtual periods: the figures were kept */
    if (!sim->sum_slot)
        return; /* added as sim_ops_build costed the ops */
    const SimFoldInsert *at =
        extended ? (const SimFoldInsert *)(const void *)inserts->data : NULL;
    const size_t n = extended ? inserts->len : 0;
    replay(sim, result, at, n);
    uint64_t ops = result->n_ops;
    for (size_t k = 0; k < n; k++)
        ops += at[k].periods * at[k].step;
    result->n_ops = (uint32_t)MIN(ops, (uint64_t)UINT32_MAX);
}
