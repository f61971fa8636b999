/* sim_memory: an alloc or free applied to a simulated rank's memory, inlined into the event
 * loop where the rank keeps its own state (folded runs: every rank); private to sim/. */
#ifndef SIM_MEMORY_H
#define SIM_MEMORY_H

#include "sim_engine_internal.h"

/* sim_memory.c: sim->error for op i, which took its category below zero on rank. */
void sim_memory_negative(Sim *sim, uint32_t rank, uint32_t i, double live_bytes);

/* Alloc or free op i on a rank's memory m; FALSE (and sim->error) if a category goes
 * negative. */
G_ALWAYS_INLINE static inline gboolean sim_memory_apply(Sim *sim, MemState *m, uint32_t rank,
                                                         uint32_t i)
{
    const SimOp *op = &sim->ops[i];
    const double delta = op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
    LiveBytes *category = &m->category[op->sub];
    category->live += delta;
    category->peak = MAX(category->peak, category->live);
    m->total.live += delta;
    if (is_model_state(op->sub)) {
        m->states.live += delta;
        m->states.peak = MAX(m->states.peak, m->states.live);
    }
    if (G_UNLIKELY(category->live < -sim->mem_tolerance_bytes)) {
        sim_memory_negative(sim, rank, i, category->live);
        return FALSE;
    }
    if (m->total.live > m->total.peak) {
        m->total.peak = m->total.live;
        for (int c = 0; c < ZP_MEM_N; c++)
            m->peak_breakdown_bytes[c] = m->category[c].live;
    }
    return TRUE;
}

/* Op i on rank's memory (sim_memory_step): a rank on its own state, every rank of a stage
 * simulated alone, applied here, not through a call (its entry and exit were a third of it). */
G_ALWAYS_INLINE static inline gboolean sim_memory_run(Sim *sim, uint32_t rank, uint32_t i)
{
    const uint32_t pos = sim->mem_pos[rank];
    if (pos & MEM_EAGER)
        return sim_memory_apply(sim, &sim->eager[pos & ~MEM_EAGER], rank, i);
    return sim_memory_step(sim, rank, i);
}

#endif
