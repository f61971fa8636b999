/* sim_engine_step: one step simulated around sim_engine.c's event loop: the plan checked, the
 * run's state set up (ops, ranks, flows, the fold), the loop run, the result filled and freed. */
#include "sim_engine.h"
#include "sim_engine_internal.h"
#include "sim_fold.h"

#include <string.h>

static const char *const mode_names[] = {"folded", "explicit"};

const char *sim_mode_name(SimMode mode)
{
    return mode_names[mode];
}

static void sim_clear(Sim *sim)
{
    g_free(sim->ops);
    g_free(sim->dependents);
    g_free(sim->stream_first);
    g_free(sim->stream_len);
    g_free(sim->stream_pos);
    g_free(sim->class_ops);
    g_free(sim->stage_of);
    g_free(sim->first_rank);
    g_free(sim->rank_count);
    g_free(sim->stage_ranks);
    g_free(sim->peer);
    g_free(sim->slot_of);
    g_free(sim->link_alone);
    g_free(sim->members);
    g_free(sim->rows);
    g_free(sim->countdown);
    g_free(sim->free_rows);
    if (sim->roots)
        g_array_free(sim->roots, TRUE);
    g_free(sim->pending_wide);
    g_free(sim->stream);
    g_free(sim->link_load);
    g_free(sim->rank);
    g_free(sim->running);
    g_free(sim->unsettled);
    g_free(sim->busy);
    g_free(sim->op_type_sums);
    for (uint32_t k = 0; sim->mem_log && k < sim->sim_pp; k++)
        g_free(sim->mem_log[k].state);
    g_free(sim->mem_log);
    g_free(sim->log_pos);
    g_free(sim->mem_pos);
    g_free(sim->eager);
    g_free(sim->op_start_s);
    g_free(sim->op_end_s);
    g_free(sim->op_ready_s);
    g_free(sim->op_last_rank);
    g_free(sim->timeline_row);
    g_free(sim->timeline_ranks);
    g_free(sim->compute_scale);
    g_free(sim->flows);
    g_free(sim->affected);
    g_free(sim->fold_hi);
    g_free(sim->fold_far);
    g_free(sim->sum_slot);
    g_free(sim->sum_figure);
    sim_queue_clear(&sim->queue);
    g_free(sim->ready);
    g_clear_error(&sim->error);
}

static gboolean check_plan(const ZpSchedule *s, const ZpHw *hw, GError **error)
{
    const int P = MAX(s->stages, 1);
    if (s->plan.dp < 1 || s->plan.mp < 1 ||
        (int64_t)s->plan.dp * s->plan.mp * P != s->world || P > UINT16_MAX ||
        (P > 1 && !s->stage_state_bytes)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "schedule: world %d is not dp %d x mp %d x pp %d", s->world, s->plan.dp,
                    s->plan.mp, P);
        return FALSE;
    }
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(s, groups);
    for (int g = 0; g < n_groups; g++) {
        char *what = g_strdup_printf("schedule: group %s", groups[g].name);
        const gboolean tiles = zp_group_check(&groups[g], s->world, what, error);
        g_free(what);
        if (!tiles)
            return FALSE;
    }
    return sim_coll_check_placement(hw, s->plan.mp, error);
}

/* One step; *order_broken (with NULL and no error) where blocks met an order they cannot
 * stand for. */
static SimResult *run_step(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                           gboolean *order_broken, GError **error)
{
    if (!check_plan(sched, hw, error))
        return NULL;
    const gboolean explicit_ranks = options->mode == SIM_MODE_EXPLICIT;
    Sim sim = {
        .sched = sched,
        .n_ops = sched->ops->len,
        .sim_dp = explicit_ranks ? (uint32_t)sched->plan.dp : 1,
        .sim_mp = explicit_ranks ? (uint32_t)sched->plan.mp : 1,
        .sim_pp = (uint32_t)MAX(sched->stages, 1),
        .class_state = sched->stages > 1 ? sched->stage_state_bytes : sched->state_bytes,
        .queue = SIM_QUEUE_EMPTY,
        .stop_after_s = options->stop_after_s,
        .extend_micro_steps = options->extend_micro_steps,
        .extend_or_stop = options->extend_or_stop,
        .world = (uint32_t)sched->world,
        .taken_s = -1,
    };
    sim.ranks = sim.sim_dp * sim.sim_mp * sim.sim_pp;
    sim.n_groups = (uint32_t)zp_sched_groups(sched, sim.groups);
    /* Not cleared: sim_ops_build writes each op whole before anything reads it, and memory
     * the heap hands back (zp_malloc_keep_freed) would be cleared by calloc, 84 MB at 32,000
     * layers. Over huge pages: 40 bytes an op, 37 MB for gpt-1t at pp 64 (as
     * zp_build_pipe_reserve). */
    sim.ops = g_new(SimOp, sim.n_ops ? sim.n_ops : 1);
    zp_advise_huge_pages(sim.ops, (size_t)(sim.n_ops ? sim.n_ops : 1) * sizeof(SimOp));
    SimResult *result = g_new0(SimResult, 1);
    *result = (SimResult){.mode = options->mode, .world = sched->world,
                          .ranks_simulated = (int)sim.ranks, .n_ops = sim.n_ops,
                          .stages = (int)sim.sim_pp};
    result->stage_peak_bytes = g_new0(double, sim.sim_pp);
    result->stage_compute_s = g_new0(double, sim.sim_pp);
    result->stage_bubble_s = g_new0(double, sim.sim_pp);
    result->stage_comm_bytes = g_new0(double, (gsize)sim.sim_pp * ZP_GROUP_N);
    result->stage_category_peak_bytes = g_new0(double, (gsize)sim.sim_pp * ZP_MEM_N);
    Slowdowns slow = {0};
    SimClasses classes = {0};
    gboolean ok = sim_ops_build(&sim, hw, result, error) &&
                  (options->n_slow_ranks + options->n_slow_nodes == 0 ||
                   sim_ranks_read_slowdowns(options, &sched->plan, (uint32_t)sched->world,
                                            (uint32_t)hw->gpus_per_node, &slow, error));
    if (ok) {
        sim_ranks_build_units(&sim, &slow, explicit_ranks && !options->each_rank, &classes);
        result->ranks_simulated = (int)ranks_reported(&sim);
        result->units_simulated = (int)sim.ranks;
        ok = sim_ranks_alloc_state(&sim, options, error);
        sim.solo = sim.ranks == sim.sim_pp;
        for (uint32_t k = 0; k < sim.sim_pp && sim.solo; k++)
            sim.solo = sim.stage_ranks[k] == 1;
    }
    if (ok) {
        sim_ranks_build_flows(&sim, &classes);
        sim_ranks_apply_slowdowns(&sim, &slow);
    }
    sim_class_clear(&classes);
    g_free(slow.rank);
    g_free(slow.node);
    SimFoldReport fold_refused = {0};
    gboolean stopped_exact = FALSE;
    if (ok) {
        sim.fold = sim_fold_new(&sim, options->no_fold, &fold_refused);
        /* The fold refused for the plan (a rank class, ranks in blocks):
         * no virtual period will be counted, so with extend_or_stop the short schedule's run
         * is not worth its time (stopped at 0 s, none counted). */
        const gboolean refused = !sim.fold && options->extend_micro_steps > 0 &&
                                 options->extend_or_stop;
        if (!refused) {
            sim_engine_loop(&sim, options);
        }
        if (refused) {
            result->stopped = TRUE;
            result->step_time_s = 0;
        } else if (sim.order_broken) {
            *order_broken = TRUE;
            ok = FALSE;
        } else if (sim.error) {
            g_propagate_error(error, sim.error);
            sim.error = NULL;
            ok = FALSE;
        } else if (sim.stopped_s > 0) {
            result->stopped = TRUE;
            result->step_time_s = sim.stopped_s;
            stopped_exact = options->extend_or_stop && sim_fold_stopped_exact(sim.fold, &sim);
        } else {
            ok = sim_breakdown_check_end(&sim, error);
        }
    }
    if (ok && !result->stopped) {
        sim_breakdown_fill(&sim, result);
        if (sim.timeline_shared) { /* the reported rank's row alone */
            sim.timeline_ranks = g_new(uint32_t, 1);
            sim.timeline_ranks[0] = (uint32_t)result->report_rank;
            sim.n_timeline_ranks = 1;
        }
        if (sim.timeline_row)
            sim_ranks_gather_timeline(&sim);
        if (sim.weight)
            sim_ranks_expand_blocks(&sim);
        result->op_start_s = sim.op_start_s;
        result->op_end_s = sim.op_end_s;
        result->op_ready_s = sim.op_ready_s;
        result->op_last_rank = sim.op_last_rank;
        result->timeline_ranks = sim.timeline_ranks;
        result->n_timeline_ranks = sim.n_timeline_ranks;
        sim.timeline_ranks = NULL;
        result->first_rank = sim.first_rank;
        result->rank_count = sim.rank_count;
        sim.op_start_s = sim.op_end_s = sim.op_ready_s = NULL;
        sim.op_last_rank = NULL;
        sim.first_rank = sim.rank_count = NULL;
    }
    SimFoldReport fold = {0};
    if (sim.fold)
        sim_fold_free(sim.fold, &fold);
    else
        fold = fold_refused;
    result->fold_micro_steps = fold.micro_steps;
    result->fold_jumps = fold.jumps;
    g_strlcpy(result->fold_note, fold.note, sizeof result->fold_note);
    /* Stopped where the long schedule's run stops: its step time is that run's. */
    result->extended_micro_steps =
        stopped_exact ? options->extend_micro_steps : fold.virtual_micro_steps;
    result->extend_period = fold.extend_period;
    result->extend_room = fold.extend_room;
    if (ok)
        sim_sums_add_kept(&sim, result, fold.inserts,
                          !result->stopped && fold.virtual_micro_steps > 0);
    if (fold.inserts && fold.inserts->len > 0) {
        result->n_inserts = fold.inserts->len;
        result->inserts = (ZpOpInsert *)(void *)g_array_free(fold.inserts, FALSE);
    } else if (fold.inserts) {
        g_array_unref(fold.inserts);
    }
    sim_clear(&sim);
    if (!ok) {
        sim_result_free(result);
        return NULL;
    }
    return result;
}

SimResult *sim_engine_run(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                          GError **error)
{
    gboolean order_broken = FALSE;
    SimResult *result = run_step(sched, hw, options, &order_broken, error);
    if (!order_broken)
        return result;
    /* Blocks met an order they cannot stand for (above): every rank on its own. */
    SimOptions each = *options;
    each.each_rank = TRUE;
    return run_step(sched, hw, &each, &order_broken, error);
}
