/* sim_fold_notes: the log a recorded period keeps, its sums replayed for the periods a jump
 * skips, and how far the jump moves the timeline cells it writes: each by its own step. */
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

/* ---- the sums replayed ----
 *
 * A skipped period adds to each sum what the recorded one added, in order. Where a sum and
 * its figures are whole numbers of 2^-30 (the clock's grid, sim_clock.h: busy and exposed
 * times are sums of durations and differences of times on it) and every partial sum stays
 * below 2^53 of them, no addition rounds: n periods add n times the period's total, the very
 * double the additions one by one give (an end of 0 is -0 only where the sum and every figure
 * were -0: x + -x is +0). A sum with a figure off the grid (a difference scaled by
 * contention) gets its figures one by one. */

/* x in whole units of 2^-30: *units, where |units| < 2^53; FALSE otherwise. */
static inline gboolean grid_units(double x, int64_t *units)
{
    const double scaled = x * 0x1p30; /* a power of two: exact short of overflow */
    if (!(scaled > -0x1p53 && scaled < 0x1p53) || scaled != (double)(int64_t)scaled)
        return FALSE;
    *units = (int64_t)scaled;
    return TRUE;
}

/* One sum's figures in a period: their total and the total of their sizes in grid units,
 * whether all were on the grid, and whether all were -0. */
typedef struct {
    double *field;
    int64_t total, magnitude;
    gboolean exact, negative_zeros;
} SumGroup;

static inline gboolean is_negative_zero(double x)
{
    return x == 0 && signbit(x);
}

/* The notes' sums (at most n: room for them made once, where a GArray's append took 104
 * instructions a sum), each note's group in group_of[k], their count in *n_groups. The index
 * is zp_u64map's open table, its probe inlined: GHashTable's lookup and insert cost about 115
 * instructions a note (Megatron 1T's jump: 4,758 notes of 840 sums, 0.55 M of its replay's
 * 0.97 M). */
static SumGroup *sum_groups(const Note *v, size_t n, uint32_t *group_of, size_t *n_groups)
{
    ZpU64Map index; /* field -> 1 + group */
    zp_u64map_init(&index, MIN(n, 4096));
    SumGroup *groups = g_new(SumGroup, n);
    size_t len = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t *g = zp_u64map_at(&index, (uint64_t)(uintptr_t)v[k].field, 0);
        if (*g == 0) {
            groups[len++] =
                (SumGroup){.field = v[k].field, .exact = TRUE, .negative_zeros = TRUE};
            *g = len;
        }
        group_of[k] = (uint32_t)*g - 1;
        SumGroup *sg = &groups[group_of[k]];
        sg->negative_zeros = sg->negative_zeros && is_negative_zero(v[k].x);
        int64_t units;
        if (sg->exact && grid_units(v[k].x, &units)) {
            sg->total += units; /* |total| <= magnitude < 2^54 here: no overflow */
            sg->magnitude += units < 0 ? -units : units;
            sg->exact = sg->magnitude < (INT64_C(1) << 53);
        } else {
            sg->exact = FALSE;
        }
    }
    zp_u64map_free(&index);
    *n_groups = len;
    return groups;
}

/* Sets group sg's sum to its end after `times` periods where every addition is exact: every
 * partial sum is at most |start| + times x magnitude from 0, below 2^53 units. FALSE (the sum
 * untouched) otherwise. */
static gboolean sum_exactly(SumGroup *sg, uint64_t times)
{
    int64_t start;
    if (!sg->exact || !grid_units(*sg->field, &start) ||
        (uint64_t)sg->magnitude > ((UINT64_C(1) << 53) - 1 - (uint64_t)llabs(start)) / times)
        return FALSE;
    const int64_t end = start + (int64_t)times * sg->total;
    if (end != 0)
        *sg->field = (double)end * 0x1p-30;
    else
        *sg->field = is_negative_zero(*sg->field) && sg->negative_zeros ? -0.0 : 0.0;
    return TRUE;
}

/* The fewest periods whose sums are grouped (below: one by one). */
#define REPLAY_GROUPED_FROM 16

/* Adds each of the n notes v[k] (NOTE_ADD) `times` times over, in order, as replay's loop
 * would, with the very doubles it would give. */
void sim_fold_replay_sums(const Note *v, size_t n, uint64_t times)
{
    if (times == 0 || n == 0)
        return;
    /* Grouping the notes by sum costs about 90 instructions a note (Megatron 1T's jump: 4,758
     * notes in 0.42 M), adding them about 2.5 a note and period: a jump of fewer periods adds
     * them one by one
     * (narayanan21-t1-529.6b's group jump, 3 periods of some 280,000 notes; grouped, its
     * earlier jumps inside groups of 2 or 3 periods took 60 M -> 76 M instructions), one of
     * more groups them (its jumps inside groups now, 43 periods of 1,330 notes: 5.21 M ->
     * 4.87 M in its replays). */
    if (times < REPLAY_GROUPED_FROM || n > UINT32_MAX) {
        /* Four notes a turn, in order (a note's sum may be the next one's): the loop's
         * count, test and branch were 4 of the 8 instructions an addition took */
        const Note *const end = v + n, *const end4 = v + (n & ~(size_t)3);
        for (uint64_t j = 0; j < times; j++) {
            const Note *q = v;
            for (; q < end4; q += 4) {
                *q[0].field += q[0].x;
                *q[1].field += q[1].x;
                *q[2].field += q[2].x;
                *q[3].field += q[3].x;
            }
            for (; q < end; q++)
                *q->field += q->x;
        }
        return;
    }
    uint32_t *group_of = g_new(uint32_t, n);
    size_t n_groups;
    SumGroup *gs = sum_groups(v, n, group_of, &n_groups);
    gboolean one_by_one = FALSE;
    for (size_t g = 0; g < n_groups; g++) {
        gs[g].exact = sum_exactly(&gs[g], times);
        one_by_one = one_by_one || !gs[g].exact;
    }
    for (uint64_t j = 0; one_by_one && j < times; j++)
        for (size_t k = 0; k < n; k++)
            if (!gs[group_of[k]].exact)
                *v[k].field += v[k].x;
    g_free(group_of);
    g_free(gs);
}
