/* sim_fold_notes: the log a recorded period keeps, and how far a jump moves the timeline cells
 * it writes for the periods it skips: each cell by its own step a period. */
#include "sim_fold_notes.h"
#include "zp_u64map.h"

#include <math.h>

/* A cell's key: its place (row x n_ops + op) and which of the timeline's arrays, + 1 (key 0
 * is the map's empty slot). */
static uint64_t cell_key(const Sim *sim, const Note *n, uint64_t at)
{
    const uint64_t array = n->field == sim->op_start_s ? 0 : n->field == sim->op_end_s ? 1 : 2;
    return (at * 3 + array) + 1;
}

/* A row and stage's key in the fallback map: a row is one unit's, or, where the stages share
 * rows, the k-th unit's of each stage (sim_ranks.c plan_shared_rows). */
static uint64_t row_stage_key(const Sim *sim, size_t at)
{
    const uint64_t row = at / sim->n_ops, op = at % sim->n_ops;
    return row * ((uint64_t)sim->sim_pp + 1) + sim->ops[op].stage + 1;
}

double *sim_fold_cell_steps(const Sim *sim, const Note *v, size_t n, size_t mid,
                            const int64_t *steps, double period_s)
{
    double *step = g_new(double, n ? n : 1);
    ZpU64Map later, found;
    zp_u64map_init(&later, n - mid + 1);
    zp_u64map_init(&found, 64);
    for (size_t k = mid; k < n; k++) /* a cell written twice in a period: its last value */
        if (v[k].kind == NOTE_CELL)
            zp_u64map_put(&later, cell_key(sim, &v[k], v[k].at), k);
    for (size_t k = 0; k < n; k++)
        step[k] = v[k].kind == NOTE_CELL ? NAN : 0;
    for (size_t k = 0; k < mid; k++) {
        if (v[k].kind != NOTE_CELL)
            continue;
        const uint32_t op = (uint32_t)(v[k].at % sim->n_ops);
        const int64_t to = (int64_t)v[k].at + steps[sim->ops[op].stage];
        const uint64_t j = zp_u64map_get(&later, cell_key(sim, &v[k], (uint64_t)to), UINT64_MAX);
        if (j == UINT64_MAX)
            continue;
        step[k] = step[j] = v[j].x - v[k].x;
        union { double d; uint64_t u; } bits = {.d = step[k]};
        zp_u64map_put(&found, row_stage_key(sim, v[k].at), bits.u);
    }
    for (size_t k = 0; k < n; k++) {
        if (!isnan(step[k]))
            continue;
        const uint64_t got = zp_u64map_get(&found, row_stage_key(sim, v[k].at), UINT64_MAX);
        union { uint64_t u; double d; } bits = {.u = got};
        step[k] = got == UINT64_MAX ? period_s : bits.d;
    }
    zp_u64map_free(&later);
    zp_u64map_free(&found);
    return step;
}
