/* sim_fold_snap: the fold's snapshots of the run and the tests three of them a period apart
 * must pass to prove a repeat (sim_fold.c says why these make a jump exact). */
#include "sim_fold_snap.h"
#include "sim_clock.h"

#include <math.h>
#include <string.h>

Snap *sim_snap_new(uint32_t micro, double now_s)
{
    Snap *s = g_new0(Snap, 1);
    s->micro = micro;
    s->now_s = now_s;
    return s;
}

void sim_snap_free(gpointer p)
{
    Snap *s = p;
    g_free(s->d.d);
    g_free(s->i.i);
    g_free(s->lin.i);
    g_free(s->status.i);
    g_free(s->refs.i);
    g_free(s->bytes.i);
    g_free(s->peaks.i);
    g_free(s->moves.i);
    g_free(s->first.d);
    g_free(s);
}


static gboolean same_ints(const Vec *a, const Vec *b)
{
    return a->len == b->len && memcmp(a->i, b->i, a->len * sizeof(int64_t)) == 0;
}

/* A reference of stage `stage` that moved by `step` ops: none, or the one step every moving
 * reference of that stage takes (steps[stage], 0 while unknown); FALSE otherwise, or where a
 * reference to no op moved. */
static gboolean stage_step(int64_t *steps, int64_t stage, int64_t step)
{
    if (step == 0)
        return TRUE;
    if (stage == REF_NONE)
        return FALSE;
    if (steps[stage] == 0)
        steps[stage] = step;
    return steps[stage] == step;
}

/* Every op reference either names one op in both or moves by its stage's step, the same for
 * every moving reference of the stage (steps: [stage], 0 unknown). */
static gboolean same_refs(const Snap *b, Snap *c, int64_t *steps)
{
    if (b->refs.len != c->refs.len)
        return FALSE;
    c->moves.len = 0;
    const int64_t *y = b->refs.i, *z = c->refs.i;
    for (size_t k = 0; k < c->refs.len; k += 2) {
        if (y[k] != z[k])
            return FALSE;
        const int64_t step = z[k + 1] - y[k + 1];
        if (!stage_step(steps, y[k], step))
            return FALSE;
        vec_int(&c->moves, step);
    }
    return TRUE;
}

/* A time moved from y to z by a period of period_s: not at all (a time the period did not
 * write, stale alike in both) or by the period itself, which is what makes z the state y moved
 * (sim_fold.c). */
static gboolean moved_by_period(double y, double z, double period_s)
{
    return z == y || z - y == period_s;
}

gboolean sim_snap_same_steps(const Vec *y, const Vec *z)
{
    if (y->len != z->len || z->len == 0 || !(z->d[0] > y->d[0]))
        return FALSE;
    const double period_s = z->d[0] - y->d[0];
    for (size_t k = 1; k < z->len; k++)
        if (!moved_by_period(y->d[k], z->d[k], period_s))
            return FALSE;
    return TRUE;
}

gboolean sim_snap_repeats(int64_t *steps, uint32_t stages, const Snap *b, Snap *c)
{
    memset(steps, 0, stages * sizeof *steps);
    if (!same_ints(&b->i, &c->i) || b->d.len != c->d.len || b->bytes.len != c->bytes.len ||
        !same_ints(&b->bytes, &c->bytes) || !same_refs(b, c, steps))
        return FALSE;
    const double period_s = c->now_s - b->now_s;
    if (!(period_s > 0))
        return FALSE;
    for (size_t k = 0, n = 0; k < c->d.len; k++) {
        const gboolean bytes = n < c->bytes.len && c->bytes.i[n] == (int64_t)k;
        n += bytes;
        if (!bytes && !moved_by_period(b->d.d[k], c->d.d[k], period_s))
            return FALSE;
    }
    /* Bytes move by the period's net allocation, the same each period (its ops equal op for
     * op), and a peak with them: one that rose since b was set in the period, so rises
     * alike in each, by its live count's rise; one that stayed put stays while its live
     * count does not rise (a live count rising under a still peak would pass it one day). */
    if (!same_ints(&b->peaks, &c->peaks))
        return FALSE;
    for (size_t n = 0; n < c->peaks.len; n++) {
        const size_t k = (size_t)c->peaks.i[n];
        const double peak = c->d.d[k] - b->d.d[k], live = c->d.d[k - 1] - b->d.d[k - 1];
        if (peak == 0 ? live > 0 : peak != live)
            return FALSE;
    }
    return TRUE;
}

/* The three-snapshot test, for states that are no moved copy: each value moving by its own
 * constant amount, twice. */
/* Every op reference either names one op in all three or moves twice by its stage's step,
 * the same for every moving reference of the stage (steps: [stage], 0 unknown). */
static gboolean same_refs3(const Snap *a, const Snap *b, Snap *c, int64_t *steps)
{
    if (a->refs.len != c->refs.len || b->refs.len != c->refs.len)
        return FALSE;
    c->moves.len = 0;
    const int64_t *x = a->refs.i, *y = b->refs.i, *z = c->refs.i;
    for (size_t k = 0; k < c->refs.len; k += 2) {
        if (x[k] != y[k] || y[k] != z[k])
            return FALSE;
        const int64_t step = y[k + 1] - x[k + 1];
        if (z[k + 1] - y[k + 1] != step || !stage_step(steps, x[k], step))
            return FALSE;
        vec_int(&c->moves, step);
    }
    return TRUE;
}

gboolean sim_snap_same_steps3(const Vec *x, const Vec *y, const Vec *z)
{
    if (x->len != z->len || y->len != z->len)
        return FALSE;
    for (size_t k = 0; k < z->len; k++)
        if (z->d[k] - y->d[k] != y->d[k] - x->d[k])
            return FALSE;
    return TRUE;
}

gboolean sim_snap_repeats3(int64_t *steps, uint32_t stages, const Snap *a, const Snap *b,
                           Snap *c)
{
    memset(steps, 0, stages * sizeof *steps);
    if (!same_ints(&a->i, &b->i) || !same_ints(&b->i, &c->i) || a->d.len != c->d.len ||
        b->d.len != c->d.len || !same_refs3(a, b, c, steps))
        return FALSE;
    for (size_t k = 0; k < c->lin.len; k++)
        if (c->lin.i[k] - b->lin.i[k] != b->lin.i[k] - a->lin.i[k])
            return FALSE;
    for (size_t k = 0; k < c->d.len; k++)
        if (c->d.d[k] - b->d.d[k] != b->d.d[k] - a->d.d[k])
            return FALSE;
    return TRUE;
}

/* A value that moves is a time on the clock's grid, at c and at the jump's end (sim_clock.h:
 * a whole number of quanta below 2^22 s; times only grow, so every value between is too), or
 * a count of bytes, a whole number below 2^53. */
uint64_t sim_snap_periods_exact(const Snap *b, const Snap *c, uint32_t span, gboolean *grid_end)
{
    uint64_t most = UINT64_MAX;
    for (size_t k = 0, n_bytes = 0; k < c->d.len && most > 0; k++) {
        const gboolean bytes = n_bytes < c->bytes.len && c->bytes.i[n_bytes] == (int64_t)k;
        n_bytes += bytes;
        const double x = b->d.d[k], z = c->d.d[k];
        const double step = (z - x) / span; /* exact: a difference on one grid, halved */
        if (step == 0)
            continue;
        if (step < 0 && bytes && x == floor(x) && step == floor(step) && x < 0x1p53 && z >= 0) {
            /* Bytes that fall period by period (GPipe's backward phase frees a micro-step's
             * activations each): whole numbers, exact down to zero. */
            double n = floor(z / -step);
            while (n > 0 && z + n * step < 0)
                n--;
            most = MIN(most, n > 1e9 ? (uint64_t)1e9 : (uint64_t)n);
            continue;
        }
        if (step < 0 || x < 0) {
            most = 0;
            break;
        }
        double limit;
        if (bytes) {
            if (x != floor(x) || step != floor(step) || z >= 0x1p53) {
                most = 0;
                break;
            }
            limit = 0x1p53;
        } else {
            if (!sim_clock_on_grid(x) || !sim_clock_on_grid(z)) {
                /* Past the grid's end (below it, every time the engine makes is on it). */
                *grid_end = *grid_end || z >= SIM_CLOCK_GRID_END_S;
                most = 0;
                break;
            }
            limit = SIM_CLOCK_GRID_END_S;
        }
        double n = floor((limit - z) / step);
        while (n > 0 && z + n * step >= limit)
            n--;
        if (!bytes && n < 2)
            *grid_end = TRUE;
        most = MIN(most, n > 1e9 ? (uint64_t)1e9 : (uint64_t)n);
    }
    return most;
}
