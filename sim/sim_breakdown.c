/* sim_breakdown: the end of a run: whether every rank ran every op and ended with the memory it
 * began with, and the result's breakdown (step time, busy, exposed and idle times, peaks). */
#include "sim_engine.h"
#include "sim_engine_internal.h"

#include <math.h>
#include <string.h>

/* ---- the run ---- */

/* How many ops of its stream a rank has started. */
static uint32_t stream_head(const Sim *sim, uint32_t rank, uint32_t stream)
{
    const uint32_t next = sim->stream[rank].next[stream];
    return next == NO_OP ? sim->stream_len[rank_class(sim, rank) * ZP_STREAM_N + stream]
                         : sim->stream_pos[next];
}

/* Whether stream op i has finished on rank (its stream passed it, and is not running it). */
static gboolean stream_op_finished(const Sim *sim, uint32_t i, uint32_t rank)
{
    const uint32_t stream = sim->ops[i].stream;
    return sim->stream_pos[i] + sim->stream[rank].busy[stream] < stream_head(sim, rank, stream);
}

/* Whether an alloc or free ran on rank, once the queue is empty. One with a single dependency
 * keeps no count (Dependent.counted): it ran if that dependency finished, on the rank that
 * released it. Followed along chains of such ops, n_ops steps at most: a cycle never ran. */
static gboolean memory_op_ran(const Sim *sim, uint32_t op, uint32_t rank)
{
    for (uint32_t step = 0; step <= sim->n_ops; step++) {
        const SimOp *o = &sim->ops[op];
        if (o->n_deps != 1)
            return pending_of(sim, op, rank) == 0;
        const uint32_t dep = zp_sched_deps(sim->sched, zp_sched_op(sim->sched, op))[0];
        const SimOp *d = &sim->ops[dep];
        rank = peer_rank(sim, rank, o->stage, d->stage);
        if (op_on_stream(d))
            return stream_op_finished(sim, dep, rank);
        op = dep;
    }
    return FALSE;
}

/* The first op of a rank that never started: a stream op its stream never reached, or an
 * alloc or free whose dependencies never finished. Called only when one exists. */
static uint32_t first_unrun_op(const Sim *sim, uint32_t rank)
{
    uint32_t i = 0;
    for (; i + 1 < sim->n_ops; i++) {
        const SimOp *o = &sim->ops[i];
        if (o->stage != rank_class(sim, rank))
            continue;
        const gboolean ran = op_on_stream(o)
                                 ? sim->stream_pos[i] < stream_head(sim, rank, o->stream)
                                 : memory_op_ran(sim, i, rank);
        if (!ran)
            break;
    }
    return i;
}

/* Ops done on a rank once the queue is empty: its finished compute ops and collectives (those
 * its streams passed, less one still running or waiting on a busy stream), and the allocs and
 * frees whose dependencies all finished (each ran as soon as they had). */
static uint32_t ops_done(const Sim *sim, uint32_t rank)
{
    uint32_t done = 0;
    for (int s = 0; s < ZP_STREAM_N; s++) /* a busy stream's last op has not finished */
        done += stream_head(sim, rank, (uint32_t)s) - sim->stream[rank].busy[s];
    for (uint32_t i = 0; i < sim->n_ops; i++)
        done += sim->ops[i].stage == rank_class(sim, rank) && !op_on_stream(&sim->ops[i]) &&
                memory_op_ran(sim, i, rank);
    return done;
}

/* The ops the simulated ranks run in a full step, each its class's: what op_events counts
 * up to. */
uint64_t sim_breakdown_rank_ops(const Sim *sim)
{
    uint64_t rank_ops = 0;
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        rank_ops += (uint64_t)sim->class_ops[k] * sim->stage_ranks[k];
    return rank_ops;
}

gboolean sim_breakdown_check_end(Sim *sim, GError **error)
{
    /* Each rank does each op of its class at most once, so a full count means that no rank
     * fell short. The virtual periods' ops are not the schedule's: without them, an extended
     * run (SimOptions.extend_micro_steps) went through the slow count below, op by op on every
     * rank (a seventh of Megatron 1T's evaluation). */
    const gboolean all_done =
        sim->op_events - sim->virtual_op_events == sim_breakdown_rank_ops(sim);
    if (!all_done) /* the count below reads each op's place in its stream */
        sim_ops_stream_places(sim);
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const uint32_t k = rank_class(sim, r);
        const uint32_t done = all_done ? sim->class_ops[k] : ops_done(sim, r);
        if (done < sim->class_ops[k]) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "schedule deadlock: rank %u ran %u of %u ops; op %u never ran",
                        named_rank(sim, r), done, sim->class_ops[k], first_unrun_op(sim, r));
            return FALSE;
        }
        const double *state = &sim->class_state[k * ZP_MEM_N];
        for (int c = 0; c < ZP_MEM_N; c++) {
            const double live = mem_state(sim, r)->category[c].live;
            if (fabs(live - state[c]) > sim->mem_tolerance_bytes) {
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "memory: %s ends the step at %.6g bytes on rank %u, not the "
                            "%.6g it started with",
                            zp_sched_mem_name(c), live, named_rank(sim, r), state[c]);
                return FALSE;
            }
        }
    }
    return TRUE;
}

/* The GPU's compute time but the optimizer's, each instant once: the busy sums count an op on
 * a communication stream (unpack, quantisation) and the compute it overlaps both, so that the
 * breakdown's terms would add up to more than the step. */
static double gpu_compute_s(const RankState *rs, const RankBusy *rb)
{
    return rb->compute_s - rs->gpu_overlap_s;
}

/* The ops the ranks of the blocks ran: each all of its class's (sim_breakdown_check_end found
 * none short); op_events counted each unit's once. */
static uint64_t ops_of_blocks(const Sim *sim)
{
    uint64_t ops = 0;
    for (uint32_t u = 0; u < sim->ranks; u++)
        ops += (uint64_t)sim->class_ops[rank_class(sim, u)] * sim->weight[u];
    return ops;
}

void sim_breakdown_fill(const Sim *sim, SimResult *result)
{
    /* The peak rank: the lowest of those whose total rose highest. */
    uint32_t last = 0, peak = 0;
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const MemState *m = mem_state(sim, r);
        if (sim->rank[r].end_s > sim->rank[last].end_s)
            last = r;
        if (m->total.peak > mem_state(sim, peak)->total.peak)
            peak = r;
        result->peak_model_state_bytes = MAX(result->peak_model_state_bytes, m->states.peak);
    }
    const MemState *top = mem_state(sim, peak);
    const RankState *rs = &sim->rank[last];
    const RankBusy *rb = &sim->busy[last];
    result->step_time_s = rs->end_s;
    result->report_rank = (int)named_rank(sim, last);
    memcpy(result->stream_busy_s, rb->busy_s, sizeof rb->busy_s);
    result->compute_s = gpu_compute_s(rs, rb);
    result->optimizer_s = rb->optimizer_s;
    result->alltoall_s = rb->alltoall_s;
    result->exposed_comm_s = rs->exposed_s;
    result->cpu_optimizer_s = rs->cpu_optimizer_s;
    result->offload_transfer_s = rs->transfer_s;
    result->idle_s = MAX(0.0, rs->end_s - result->compute_s - rb->optimizer_s - rs->exposed_s -
                                  rs->cpu_optimizer_s - rs->transfer_s);
    /* Every addition a whole number of quanta (the step on the grid) and every sum below
     * 2^22 s: all of them positive, no partial sum passes its total, so each is exact. */
    const double *sums = &sim->op_type_sums[(size_t)last * 2 * SIM_OP_TYPES];
    memcpy(result->op_type_s, sums, sizeof result->op_type_s);
    memcpy(result->op_type_count, sums + SIM_OP_TYPES, sizeof result->op_type_count);
    result->op_types_exact = rs->end_s < SIM_CLOCK_GRID_END_S;
    for (int t = 0; t < SIM_OP_TYPES; t++)
        result->op_types_exact = result->op_types_exact && sums[t] < SIM_CLOCK_GRID_END_S;
    result->peak_memory_bytes = top->total.peak;
    memcpy(result->peak_breakdown_bytes, top->peak_breakdown_bytes,
           sizeof result->peak_breakdown_bytes);
    for (int c = 0; c < ZP_MEM_N; c++)
        result->category_peak_bytes[c] = top->category[c].peak;
    result->op_events = sim->weight ? ops_of_blocks(sim) : sim->op_events;
    result->heap_events = sim->heap_events;
    result->state_bytes = sim->state_bytes + (uint64_t)sim->cap_rows * sim->ranks +
                          (uint64_t)sim->cap_eager * sizeof(MemState);
    for (uint32_t r = 0; r < sim->ranks; r++)
        result->flush_s = MAX(result->flush_s, sim->rank[r].flush_s);
    /* A stage's bubble: the time its rank neither computes nor waits for its own
     * communication, over the step up to the flush or the rank's end, whichever is later
     * (after the flush a rank reduces and steps without waiting on other stages). The rank
     * of the stage with the least stands for it. */
    for (int k = 0; k < result->stages; k++)
        result->stage_bubble_s[k] = G_MAXDOUBLE;
    for (uint32_t r = 0; r < sim->ranks; r++) {
        const uint32_t k = rank_class(sim, r);
        const RankState *rs = &sim->rank[r];
        const RankBusy *rb = &sim->busy[r];
        const MemState *m = mem_state(sim, r);
        result->stage_peak_bytes[k] = MAX(result->stage_peak_bytes[k], m->total.peak);
        for (int c = 0; c < ZP_MEM_N; c++)
            result->stage_category_peak_bytes[k * ZP_MEM_N + c] =
                MAX(result->stage_category_peak_bytes[k * ZP_MEM_N + c], m->category[c].peak);
        const double compute_s = gpu_compute_s(rs, rb);
        result->stage_compute_s[k] = MAX(result->stage_compute_s[k], compute_s);
        const double idle_s = MAX(rs->end_s, result->flush_s) - compute_s - rb->optimizer_s -
                              rs->exposed_s;
        result->stage_bubble_s[k] = MIN(result->stage_bubble_s[k], MAX(0.0, idle_s));
    }
}

void sim_result_free(SimResult *result)
{
    if (!result)
        return;
    g_free(result->op_start_s);
    g_free(result->op_end_s);
    g_free(result->op_ready_s);
    g_free(result->op_last_rank);
    g_free(result->timeline_ranks);
    g_free(result->first_rank);
    g_free(result->rank_count);
    g_free(result->inserts);
    g_free(result->stage_peak_bytes);
    g_free(result->stage_compute_s);
    g_free(result->stage_bubble_s);
    g_free(result->stage_comm_bytes);
    g_free(result->stage_category_peak_bytes);
    g_free(result);
}

uint32_t sim_result_rank_stage(const SimResult *result, uint32_t rank, int mp)
{
    return (result->first_rank[rank] / (uint32_t)MAX(mp, 1)) % (uint32_t)MAX(result->stages, 1);
}

gboolean sim_result_timeline_row(const SimResult *result, uint32_t rank, size_t *base)
{
    if (!result->op_start_s || rank >= (uint32_t)result->ranks_simulated)
        return FALSE;
    uint32_t row = rank;
    if (result->timeline_ranks) {
        /* ascending */
        const uint32_t lo =
            zp_lower_bound_u32(result->timeline_ranks, result->n_timeline_ranks, rank);
        if (lo == result->n_timeline_ranks || result->timeline_ranks[lo] != rank)
            return FALSE;
        row = lo;
    }
    *base = (size_t)row * result->n_ops;
    return TRUE;
}
