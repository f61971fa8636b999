/* cli_rank: the simulator as the planner's ranking (plan, sweep): each plan's schedule built and
 * run folded, its allocations replayed; the runs that reach the end kept for plan's report. */
#include "cli.h"
#include "sim_coll.h"
#include "sim_engine.h"
#include "zp_alloc_replay.h"

#include <string.h>

/* A plan simulated to the end, and its allocator replay. */
typedef struct {
    ZpPlan plan;
    SimResult *result; /* NULL once taken (cli_rank_take) */
    ZpAllocStats alloc;
} KeptRun;

static void kept_run_free(gpointer p)
{
    KeptRun *k = p;
    sim_result_free(k->result);
    g_free(k);
}

/* The kept run of this very plan (byte for byte: candidates hand their own copy), or NULL. */
static KeptRun *find_kept(const CliRankContext *c, const ZpPlan *plan)
{
    for (guint i = 0; c->kept && i < c->kept->len; i++) {
        KeptRun *k = g_ptr_array_index(c->kept, i);
        if (k->result && memcmp(&k->plan, plan, sizeof *plan) == 0)
            return k;
    }
    return NULL;
}

/* The micro-steps a plan's schedule may be built short of: whole steady periods (an
 * interleaved group of pp micro-steps, else one), k a multiple of 4 (of 4 pp interleaved) so
 * that the fold's jumps of one or two periods of one or two micro-steps (groups) add up to
 * it. The short schedule keeps every stage's warm-up and cool-down, the settle transient and
 * the fold's snapshots (three periods, and two before each), and the allocator replay's
 * steady periods: 2 pp + 24 micro-steps for 1F1B and plain accumulation (1F1B's first stage
 * frees its warm-up forwards' activations through its first pp steady periods, and only past
 * them does an inserted period pair its frees as every later one does: with pp + 16 kept,
 * Megatron's 1T row extended in the simulator but its allocator replay fell back to the full
 * schedule, 112 against 82 ms an evaluation on a fixed-grid clock), 12 groups of pp
 * interleaved (a group's jump needs 6 of them in one stretch of the clock, sim_fold.c
 * group_first). 0 where the plan is too short to gain, or GPipe, whose forward phase does not
 * fold (sim_fold_new counts no virtual periods there).
 *
 * 1F1B over more than two stages whose tensor-parallel group spans nodes repeats only a
 * pipeline round trip on (pp micro-steps, sim_fold.c MAX_SHIFTS: the fill's disturbance comes
 * back every round trip): its first jump comes after three round trips of snapshots past the
 * fill (two snapshots a round trip apart, sim_fold.c; five with three snapshots) and needs
 * three more ahead of it, so 7 pp are kept (9 before) and k is a multiple of pp; with 2 pp +
 * 24 kept the short run could not jump at all (plan --3d gpt-1t/4096's 1F1B pp 32 x tp 32 x
 * 512: 12 ms spent before the full schedule's 127 ms; 7 pp kept: 224 built, 288 virtual).
 * Shapes seen so far: tp 16 or 32 across nodes at pp 4-32 fold by round trips,
 * tp 4 or 8 in a node by one micro-step; a plan that folds by one anyway counts k all the
 * same, and one that folds by neither falls back to the full schedule, as before. */
int cli_rank_short_by(const ZpPlan *plan, const ZpHw *hw)
{
    const int pp = zp_plan_pp(plan), m = plan->grad_accum;
    if (pp > 1 && plan->pipe.schedule == ZP_PIPE_GPIPE)
        return 0;
    const gboolean interleaved = pp > 1 && plan->pipe.schedule == ZP_PIPE_INTERLEAVED;
    const gboolean round_trip = pp > 2 && plan->pipe.schedule == ZP_PIPE_1F1B &&
                                hw->gpus_per_node > 0 && plan->mp > hw->gpus_per_node;
    const int unit = interleaved ? 4 * pp : round_trip ? pp : 4;
    const int keep = interleaved ? 12 * pp : round_trip ? 7 * pp : 2 * pp + 24;
    const int k = m > keep ? (m - keep) / unit * unit : 0;
    return k >= unit ? k : 0;
}

SimResult *cli_rank_simulate_short(const ZpModel *model, const ZpHw *hw, const ZpPlan *plan,
                                   const SimOptions *base, ZpAllocStats *alloc,
                                   gboolean *alloc_done, ZpSchedule **built)
{
    *alloc_done = FALSE;
    if (built)
        *built = NULL;
    const int k = cli_rank_short_by(plan, hw);
    if (k == 0)
        return NULL;
    ZpPlan shorter = *plan;
    shorter.grad_accum -= k;
    ZpSchedule *sched = zp_sched_build(model, &shorter, NULL);
    if (!sched)
        return NULL;
    SimOptions options = *base;
    options.extend_micro_steps = (uint32_t)k;
    options.extend_or_stop = TRUE;
    SimResult *result = sim_engine_run(sched, hw, &options, NULL);
    if (result && result->extended_micro_steps != (uint32_t)k) {
        sim_result_free(result);
        result = NULL;
    }
    if (result && !result->stopped && alloc)
        *alloc_done = zp_alloc_replay_schedule_extended(
            sched, hw->gpu_memory_bytes - hw->runtime_reserve_bytes, result->inserts,
            result->n_inserts, alloc);
    if (result && built)
        *built = sched;
    else
        zp_sched_free(sched);
    return result;
}

SimResult *cli_rank_simulate(const ZpModel *model, const ZpHw *hw, const ZpPlan *plan,
                             double stop_after_s, ZpAllocStats *alloc, GError **error)
{
    gboolean alloc_done;
    const SimOptions base = {.mode = SIM_MODE_FOLDED, .stop_after_s = stop_after_s};
    SimResult *result = cli_rank_simulate_short(model, hw, plan, &base, alloc, &alloc_done, NULL);
    if (result && (result->stopped || !alloc || alloc_done))
        return result;
    ZpSchedule *sched = zp_sched_build(model, plan, error);
    if (!sched) {
        sim_result_free(result);
        return NULL;
    }
    const SimOptions options = {.mode = SIM_MODE_FOLDED, .stop_after_s = stop_after_s};
    if (!result)
        result = sim_engine_run(sched, hw, &options, error);
    if (result && !result->stopped && alloc)
        *alloc = zp_alloc_replay_schedule(sched, hw->gpu_memory_bytes - hw->runtime_reserve_bytes);
    zp_sched_free(sched);
    return result;
}

/* A run kept to the end stands for one stopped past stop_after_s only where it ended before:
 * then no op ended past it, and the stopped run is the same run (SimOptions.stop_after_s). */
gboolean cli_rank_by_simulation(const ZpPlan *plan, void *ctx, double stop_after_s,
                                double *step_time_s, double *needed_bytes, GError **error)
{
    const CliRankContext *c = ctx;
    const KeptRun *kept = find_kept(c, plan);
    ZpAllocStats alloc;
    SimResult *result = NULL;
    if (kept && (stop_after_s <= 0 || kept->result->step_time_s <= stop_after_s)) {
        alloc = kept->alloc;
    } else {
        kept = NULL;
        result = cli_rank_simulate(c->model, c->hw, plan, stop_after_s, &alloc, error);
        if (!result)
            return FALSE;
    }
    const SimResult *r = kept ? kept->result : result;
    *step_time_s = r->step_time_s;
    if (r->stopped) {
        *needed_bytes = ZP_RANK_STOPPED;
        sim_result_free(result);
        return TRUE;
    }
    /* The fit `simulate` judges: the allocator-reserved peak. */
    *needed_bytes = zp_alloc_replay_needed_bytes(
        &alloc, r->peak_memory_bytes, c->hw->gpu_memory_bytes - c->hw->runtime_reserve_bytes);
    if (result && c->kept) {
        KeptRun *k = g_new(KeptRun, 1);
        *k = (KeptRun){.result = result, .alloc = alloc};
        memcpy(&k->plan, plan, sizeof *plan);
        g_ptr_array_add(c->kept, k);
    } else {
        sim_result_free(result);
    }
    return TRUE;
}

void cli_rank_keep(CliRankContext *c)
{
    if (!c->kept)
        c->kept = g_ptr_array_new_with_free_func(kept_run_free);
}

SimResult *cli_rank_take(const CliRankContext *c, const ZpPlan *plan)
{
    KeptRun *k = find_kept(c, plan);
    if (!k)
        return NULL;
    SimResult *r = k->result;
    k->result = NULL;
    return r;
}

void cli_rank_clear(CliRankContext *c)
{
    if (c->kept)
        g_ptr_array_unref(c->kept);
    c->kept = NULL;
}

double cli_bus_bytes_per_s(const ZpHw *hw, int dp, int mp, ZpGroup group)
{
    return sim_coll_group(hw, dp, mp, group).bus_bytes_per_s;
}

double cli_coll_s(const ZpHw *hw, int dp, int mp, ZpGroup group, ZpCollKind kind, double bytes)
{
    const SimCollGroup g = sim_coll_group(hw, dp, mp, group);
    const SimCollCost c = sim_coll_cost(kind, bytes, &g);
    return c.latency_s + c.transfer_s;
}

void cli_search_spec(ZpSearchSpec *spec, CliRankContext *context, const ZpModel *model,
                     const ZpHw *hw, int gpus)
{
    *context = (CliRankContext){model, hw, NULL};
    zp_search_spec_defaults(spec, model, hw, gpus);
    spec->rank = cli_rank_by_simulation;
    spec->rank_ctx = context;
    spec->bus_bytes_per_s = cli_bus_bytes_per_s;
    spec->coll_s = cli_coll_s;
}
