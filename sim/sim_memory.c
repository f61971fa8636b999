/* sim_memory: the simulated ranks' memory: each rank class's log of states that ranks in
 * lockstep share, and a rank's own state once it leaves it; an alloc or free applied to one. */
#include "sim_memory.h"

static gboolean go_eager(Sim *sim, uint32_t rank, const MemLog *log, uint32_t pos);

/* Each class's log, room for every memory op of the class, and its ranks' state at the start:
 * what the schedule says they hold all step. A class of one rank (folded runs: every class)
 * has nothing to share: its rank keeps its own state from the start (the same additions in the
 * same order as along a log, so the same bits), and its log only the start (a log of a state
 * a memory op took 328 MB for a 32,000-layer model). */
gboolean sim_memory_alloc_logs(Sim *sim)
{
    sim->mem_log = g_new0(MemLog, sim->sim_pp);
    sim->log_pos = g_new(uint32_t, MAX(sim->n_ops, 1));
    sim->state_bytes += (uint64_t)sim->n_ops * sizeof *sim->log_pos;
    uint32_t *memory_ops = g_new0(uint32_t, sim->sim_pp);
    uint32_t *const log_pos = sim->log_pos; /* a local: its stores could alias sim->n_ops */
    const uint32_t n_ops = sim->n_ops;
    for (uint32_t i = 0; i < n_ops; i++)
        log_pos[i] = NOT_LOGGED;
    /* Counted for the logs only: a stage of one rank keeps none (below). */
    gboolean shared = FALSE;
    for (uint32_t k = 0; k < sim->sim_pp; k++)
        shared = shared || sim->stage_ranks[k] > 1;
    for (uint32_t i = 0; shared && i < sim->n_ops; i++)
        memory_ops[sim->ops[i].stage] += !op_on_stream(&sim->ops[i]);
    gboolean ok = TRUE;
    for (uint32_t k = 0; k < sim->sim_pp; k++) {
        MemLog *log = &sim->mem_log[k];
        const uint32_t entries = sim->stage_ranks[k] > 1 ? memory_ops[k] : 0;
        log->state = g_try_new(MemState, entries + 1);
        ok = ok && log->state;
        if (!ok)
            break;
        sim->state_bytes += entries * sizeof(MemState);
        MemState *m = &log->state[0];
        const double *state = &sim->class_state[k * ZP_MEM_N];
        *m = (MemState){0};
        for (int c = 0; c < ZP_MEM_N; c++) {
            m->total.live += state[c];
            if (is_model_state(c))
                m->states.live += state[c];
            m->category[c] = (LiveBytes){state[c], state[c]};
            m->peak_breakdown_bytes[c] = state[c];
        }
        m->total.peak = m->total.live;
        m->states.peak = m->states.live;
    }
    g_free(memory_ops);
    for (uint32_t r = 0; ok && r < sim->ranks; r++)
        if (sim->stage_ranks[rank_class(sim, r)] == 1)
            ok = go_eager(sim, r, &sim->mem_log[rank_class(sim, r)], 0);
    return ok;
}

void sim_memory_negative(Sim *sim, uint32_t rank, uint32_t i, double live_bytes)
{
    g_set_error(&sim->error, ZP_ERROR, ZP_ERROR_VALUE,
                "memory: %s goes negative (%.6g bytes) on rank %u at op %u",
                zp_sched_mem_name(sim->ops[i].sub), live_bytes, named_rank(sim, rank), i);
}

/* A rank leaves its class's log at position pos: its own copy of the state there. */
static gboolean go_eager(Sim *sim, uint32_t rank, const MemLog *log, uint32_t pos)
{
    if (sim->n_eager == sim->cap_eager) {
        MemState *eager = sim_grow_state(sim, sim->eager, &sim->cap_eager, sizeof(MemState),
                                         "memory states of ranks out of lockstep");
        if (!eager)
            return FALSE;
        sim->eager = eager;
    }
    sim->eager[sim->n_eager] = log->state[pos];
    sim->mem_pos[rank] = MEM_EAGER | sim->n_eager++;
    return TRUE;
}

/* Op i on rank's memory: a step along its class's log, a new entry at its end, or the rank's
 * own state (MemLog). */
gboolean sim_memory_step(Sim *sim, uint32_t rank, uint32_t i)
{
    uint32_t *pos = &sim->mem_pos[rank];
    /* A rank on its own state (every rank of a stage simulated alone; sim_memory_run applies
     * those itself) first: a log's places lie below MEM_EAGER, so neither test below could
     * hold. */
    if (*pos & MEM_EAGER)
        return sim_memory_apply(sim, &sim->eager[*pos & ~MEM_EAGER], rank, i);
    if (*pos == sim->log_pos[i]) {
        ++*pos;
        return TRUE;
    }
    MemLog *log = &sim->mem_log[sim->ops[i].stage];
    if (*pos == log->len) { /* it ran the whole log, so not op i: op i is not in it */
        log->state[*pos + 1] = log->state[*pos];
        if (!sim_memory_apply(sim, &log->state[*pos + 1], rank, i))
            return FALSE;
        sim->log_pos[i] = log->len++;
        ++*pos;
        return TRUE;
    }
    if (!go_eager(sim, rank, log, *pos))
        return FALSE;
    return sim_memory_apply(sim, &sim->eager[*pos & ~MEM_EAGER], rank, i);
}
