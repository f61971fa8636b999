/* cli_rank: the simulator as the planner's ranking (plan, sweep): each plan's schedule built and
 * run folded, its allocations replayed; the runs that reach the end kept for plan's report. */
#include "cli.h"
#include "sim_coll.h"
#include "sim_engine.h"
#include "zp_alloc_ops.h"
#include "zp_alloc_replay.h"
#include "zp_pipe.h"
#include "zp_schedsize.h"
#include "zp_util.h"

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

/* The micro-steps a plan's schedule may be built short of: k, a whole number of the periods
 * the fold counts virtual ones by (sim_fold.c: a virtual period is a whole period of the
 * builder's schedule), m - keep rounded down to them. What is kept is what the short run needs
 * to prove a repeat and the allocator replay needs to insert periods, the least measured on
 * every plan we have (bench_sim megatron's 18, bench_plan's, test_sim_fold's and
 * test_sim_extend's, and some 20 more of 1F1B, accumulation, interleaved and round trips; the
 * short run's simulate --json equal to --no-fold's byte for byte, fold report aside), so that
 * the short run rarely runs for nothing (a keep too small is never wrong: the fold does not
 * count the periods, and the caller runs the full schedule after it).
 *
 * 1F1B (and accumulation, below): pp + 8 kept where the blocks split evenly over the stages,
 * 2 pp + 8 otherwise, k even (the fold's shifts are 1 and 2 micro-steps). The fold proves the
 * repeat from about pp + 5 (each stage's warm-up, the settling and one period of snapshots;
 * its jump of virtual periods alone needs one period of room): every 1F1B plan of even
 * stages tried counts its virtual periods with pp + 6 kept (gpt3-175b pp 8, 16 and 32, with
 * checkpointing, selective recomputation, --p2p-sync, the distributed optimizer's overlapped
 * gather; gpt-1t pp 16 and 64; gpt-13b pp 4 and 8; gpt2-1.5b pp 8), and pp + 8 leaves two
 * spare. Uneven stages settle later: gpt-13b's 40 blocks over 16 stages count none with
 * pp + 16 kept and all with 2 pp + 8. The allocator replay pairs an inserted period's frees
 * by name (zp_alloc_ops.c), so it needs no more than the fold: until then it inserted a
 * period only where its frees paired as every later one's, which 1F1B's first stage reaches
 * only after pp steady periods, and 2 pp + 8 were kept for every plan (Megatron's 1T row
 * built 136 of its 512 micro-steps; now 72). Without a pipeline 8 are kept (2 pp + 6): of 218
 * plans of accumulation alone (gpt2-1.5b, gpt-13b,
 * gpt-60b, gpt3-175b; stages 0-3 over 12 to 40 micro-steps; overlap, checkpointing, Hugging
 * Face's hidden x hidden buckets, the optimizer offloaded to the CPU or NVMe, stage 3's
 * parameters too; simulate --json's fold report) every one 10 kept extended extends with 8,
 * where 6 lost every stage-3 plan with the optimizer offloaded (24 of 90); plan --3d
 * gpt-1t/4096, whose stage-3 plans over 16 micro-steps build 8 and count 8 virtual,
 * 4.391e9 -> 4.282e9 instructions (callgrind), its output byte for byte the same.
 *
 * Interleaved: 5 groups of pp kept, k whole groups (only the group's shift counts virtual
 * periods). The group's shift proves a repeat a group past the fill (a group and a quarter to
 * a half of warm-up), from 5 groups kept, and none with 4 (narayanan21-t1-529.6b and 310.1b,
 * gpt-13b pp 4 v 4 and pp 10 v 4, gpt3-175b pp 16 v 3, gpt-1t pp 32 v 4). 6 were kept while
 * the allocator replay paired an inserted group's frees as far back as its model's, which
 * held from 6 groups (from 5 on 1 of 16 shapes, pp 2-35, v 2-5); by name (zp_alloc_ops.c) they
 * pair from the fold's window (529.6b 545.4 M -> 476.9 M instructions, 310.1b 236.5 M ->
 * 206.8 M). And at least 2 groups short. A short run's jumps inside groups no longer wait for the
 * group's shift to count the virtual groups (sim_fold.c keeps the snapshots across them), so
 * 2 groups short gain (simulate --json, instructions by callgrind: narayanan21-t1-529.6b,
 * 8 groups of 35, 0.883e9 full -> 0.821e9, task-clock 100 -> 92 ms at load 4.8; gpt-1t pp 32
 * v 4 x 256 0.951e9 -> 0.876e9; gpt3-175b pp 16 v 3 x 128 0.348e9 -> 0.328e9; gpt-13b pp 10
 * v 4 x 80 73.5e6 -> 70.2e6), where 1 group does not (gpt-13b pp 10 v 4 x 70 even, gpt3-175b
 * pp 8 v 3 x 56 0.158e9 -> 0.161e9, narayanan21-t1-310.1b's shape over 7 groups 0.324e9 ->
 * 0.334e9: the shorter run counts one group where the full one jumps inside it). 3 were
 * needed while the short run held those jumps back (529.6b took 120 ms built 2 short against
 * 105 full), and 12 groups were kept before that. 5 groups kept do not count the virtual
 * ones on these plans (the caller runs the full schedule after: 529.6b 1.43e9).
 *
 * 1F1B over more than two stages whose tensor-parallel group spans nodes repeats only a
 * pipeline round trip on (pp micro-steps, sim_fold.c MAX_SHIFTS: the fill's disturbance comes
 * back every round trip): two snapshots a round trip apart past the fill prove it, and a jump
 * of virtual periods alone needs one round trip of room past the window, where a physical
 * jump needs three: 5 pp are kept (7 before; plan --3d gpt-1t/4096's pp 32 x tp 32 x 512
 * builds 160 and counts 352 virtual; 4 pp proved on none of four shapes, pp 4-32), k whole
 * round trips. A plan that folds by one micro-step anyway counts k all the same, and one that
 * folds by neither falls back to the full schedule.
 *
 * 1F1B over uneven stages (zp_pipe_heavy_stages: h of them a block more) repeats every h
 * micro-steps where tensor parallelism is 8 or more, by one where it is less: 2 pp + 2 h + 8
 * kept (2 pp + 8 proved none of mt-nlg-530b's over 16 stages with tp 8; + h missed gpt3-175b's
 * 96 blocks over 20 and bloom-176b's 70 over 12), k whole periods of 2 and of h, and of the
 * round trip's where that leaves some, though with the round trip it is h's shift that
 * proves (5 pp kept counted fewer on 14 shapes of 27, as many on the rest: gpt-1t pp 80 x tp
 * 16 x 1536 960 against 1,200). A plan that needs no such shift keeps 2 h more (gpt-13b pp 16,
 * 8 heavy: 72 virtual, 88 before).
 *
 * 0 where the plan is too short to gain, or GPipe, whose forward phase does not fold
 * (sim_fold_new counts no virtual periods there). Too short: k below half the kept micro-
 * steps (1F1B, accumulation) or 2 groups (interleaved, above). A short run the fold cannot
 * extend costs up to keep / m of a run on top of the full one (DeepSpeed's stage 1 without a
 * pipeline never folded until sim_fold.c's far ops: plan --3d gpt3-175b/1024's 8 such
 * evaluations of 24 micro-steps each ran 10 for nothing; now they count 14 virtual and run
 * no full schedule, 97 -> 89 full runs, 9.22e9 -> 8.69e9 instructions by callgrind), and one
 * that extends saves k / m: built 10 long to save 2 of 12,
 * plan's search of gpt3-175b on 256 GPUs took 0.185 s against main's 0.180 s, with the half
 * 0.173 s (least of 7, load 1.9). */
/* k for m micro-steps of which `keep` are built, in whole units; 0 where that is too few to
 * gain (below) */
static int short_by(int m, int keep, int unit, gboolean interleaved)
{
    const int k = m > keep ? (m - keep) / unit * unit : 0;
    return k >= (interleaved ? 2 * unit : MAX(unit, keep / 2)) ? k : 0;
}

int cli_rank_short_by(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw)
{
    const int pp = zp_plan_pp(plan), m = plan->grad_accum;
    if (pp > 1 && plan->pipe.schedule == ZP_PIPE_GPIPE)
        return 0;
    const gboolean interleaved = pp > 1 && plan->pipe.schedule == ZP_PIPE_INTERLEAVED;
    const gboolean round_trip = pp > 2 && plan->pipe.schedule == ZP_PIPE_1F1B &&
                                hw->gpus_per_node > 0 && plan->mp > hw->gpus_per_node;
    /* Megatron's uniform split (zp_pipe_partition): every stage the same blocks */
    const gboolean even = plan->pipe.partition == ZP_PARTITION_UNIFORM && pp > 0 &&
                          model->layers % (uint64_t)pp == 0;
    const int heavy = zp_pipe_heavy_stages(model, plan);
    const int keep = interleaved  ? 5 * pp
                     : heavy > 2  ? 2 * pp + 2 * heavy + 8
                     : round_trip ? 5 * pp
                     : pp > 1     ? (even ? pp : 2 * pp) + 8
                                  : 8;
    const int base = interleaved || round_trip ? pp : 2;
    if (heavy <= 2)
        return short_by(m, keep, base, interleaved);
    /* Uneven stages repeat every `heavy` micro-steps: k whole periods of that too (and of 2,
     * the shift of two micro-steps), and of the round trip's where that leaves some. */
    const int64_t period = heavy % 2 ? 2 * (int64_t)heavy : heavy;
    const int64_t both = base / (int64_t)zp_gcd_u64((uint64_t)base, (uint64_t)period) * period;
    const int k = both < m ? short_by(m, keep, (int)both, FALSE) : 0;
    return k > 0 ? k : short_by(m, keep, (int)period, FALSE);
}

/* The most micro-steps x units (layers + 2) the short path takes: its time grows with the
 * micro-steps (the fold's op sums and jumps), most on the plans measured where ZeRO-3 gathers
 * and reduces every micro-step: gpt-1t ZeRO-3 on 16,384 GPUs with checkpointing takes 0.14 s
 * at 3,800 micro-steps and 0.8-1.0 s at 20,000 (2.6e6), in 24 MB; Megatron 1T (pp 64) takes
 * 0.11-0.20 s from 3,800 to 100,000 micro-steps. 2.5e6 keeps an answer near a second, as
 * ZP_SCHED_MAX_UNIT_STEPS does for the full schedule (5e5). */
#define CLI_SHORT_MAX_UNIT_STEPS 2.5e6

/* The plan's schedule built k micro-steps short, in *sched (NULL where the builder refuses),
 * and its run counting them as virtual periods, stopping where they will not all be. */
static SimResult *run_short(const ZpModel *model, const ZpHw *hw, const ZpPlan *plan,
                            const SimOptions *base, int k, ZpSchedule **sched)
{
    *sched = zp_sched_build_short(model, plan, k, NULL);
    if (!*sched)
        return NULL;
    SimOptions options = *base;
    options.extend_micro_steps = (uint32_t)k;
    options.extend_or_stop = TRUE;
    return sim_engine_run(*sched, hw, &options, NULL);
}

/* Where a short run counted no virtual period for what its fold found of the period, the
 * micro-steps to build short by once more (0: none, the caller's full run then):
 * - the fold proved a period k is no whole number of (a found one, sim_fold.c): k rounded
 *   down to it (mt-nlg-530b pp 64 x tp 4 repeats every 40 micro-steps, k whole periods of
 *   82: 2,048 micro-steps built 288 long, not 2,048);
 * - a shift's whole state repeated but the short schedule ended before its proof had room
 *   (SimResult.extend_room): a period fewer, rounded down to it. The periods the heavy
 *   stages suggest (cli_rank_short_by) are measured on tp 8 and 16; deepseek-v3's 61 blocks
 *   repeat every 26 micro-steps over 32 stages with tp 4 (29 heavy), every 12 over 16 with
 *   tp 8 (13 heavy): 768 micro-steps were built whole, 556 and 319 ms each in `plan --3d`
 *   on 256 H100s, and 82 and 35 ms built short. */
static int short_again(int k, uint32_t period, uint32_t room)
{
    if (period > 0 && (uint32_t)k / period * period >= period)
        return (int)((uint32_t)k / period * period);
    if (room > 0 && (uint32_t)k > room && ((uint32_t)k - room) / room * room >= room)
        return (int)(((uint32_t)k - room) / room * room);
    return 0;
}

SimResult *cli_rank_simulate_short(const ZpModel *model, const ZpHw *hw, const ZpPlan *plan,
                                   const SimOptions *base, ZpAllocStats *alloc,
                                   gboolean *alloc_done, ZpSchedule **built)
{
    *alloc_done = FALSE;
    if (built)
        *built = NULL;
    int k = cli_rank_short_by(model, plan, hw);
    /* Not the long schedule's op cap (zp_schedsize_check_plan): what this path holds is the
     * short schedule and an allocator replay that lists the inserted periods' copies only
     * until they repeat, their buffers taken again (zp_alloc_ops_extended), not the long
     * one's ops (gpt-1t ZeRO-3 on 16,384 GPUs at grad-accum 3,800, about 6.3e7 ops: 0.09 s
     * and 24 MB; at 20,000 24 MB). Nor the long schedule's bound on micro-steps x units
     * (ZP_SCHED_MAX_UNIT_STEPS, which zp_sched_build holds to): its time grows with the
     * micro-steps far more slowly (the fold's op sums and jumps), so its own bound is
     * CLI_SHORT_MAX_UNIT_STEPS; past it, or where the replay's places would overflow, the
     * caller's full path refuses in one line. */
    const double unit_steps = (double)plan->grad_accum * (double)(model->layers + 2);
    if (k == 0 || unit_steps > CLI_SHORT_MAX_UNIT_STEPS ||
        zp_schedsize_estimate_ops(model, plan) >= ZP_ALLOC_OPS_MAX_PLACES)
        return NULL;
    ZpSchedule *sched = NULL;
    SimResult *result = run_short(model, hw, plan, base, k, &sched);
    const int again = result && result->extended_micro_steps != (uint32_t)k
                          ? short_again(k, result->extend_period, result->extend_room)
                          : 0;
    if (again > 0) { /* once more, built short by fewer */
        sim_result_free(result);
        zp_sched_free(sched);
        k = again;
        result = run_short(model, hw, plan, base, k, &sched);
    }
    if (!sched)
        return NULL;
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
