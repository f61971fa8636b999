/* test_sim_fold_notes: the log a recorded period keeps, replayed for the periods a jump skips
 * (sim_fold_notes): its sums, bit for bit as the additions one by one give them. */
#include "sim_fold_notes.h"

#include <string.h>

/* A figure for test_replay_sums: mostly on the clock's grid (whole units of 2^-30, some
 * negative, some near 2^53 units so that the periods' sums leave the grid's range), else off
 * it, or a zero of either sign. */
static double replay_figure(GRand *r, gboolean off_grid)
{
    switch (g_rand_int_range(r, 0, off_grid ? 8 : 7)) {
    case 0:
        return 0.0;
    case 1:
        return -0.0;
    case 2:
        return -(double)g_rand_int_range(r, 1, 1 << 20) * 0x1p-30;
    case 3:
        return (double)g_rand_int_range(r, 1, 1 << 30) * 0x1p20 * 0x1p-30; /* ~2^50 units */
    case 7:
        return g_rand_double_range(r, 0, 1e-3);
    default:
        return (double)g_rand_int_range(r, 1, 1 << 30) * 0x1p-30;
    }
}

/* The fold's replayed sums (sim_fold_replay_sums: a period's additions times n at once where
 * they are exact) equal the additions one by one, bit for bit: sums on and off the grid,
 * zeros of both signs (x + -x is +0), totals past 2^53 units, and n from 0 to 500. */
static void test_replay_sums(void)
{
    GRand *r = g_rand_new_with_seed(40);
    const uint64_t times[] = {0, 1, 2, 3, 17, 443, 500};
    for (int trial = 0; trial < 400; trial++) {
        enum { FIELDS = 6, MOST_NOTES = 40 };
        double by_loop[FIELDS], at_once[FIELDS];
        const gboolean off_grid = trial % 4 == 3;
        for (int f = 0; f < FIELDS; f++)
            by_loop[f] = at_once[f] = replay_figure(r, off_grid);
        const int n = g_rand_int_range(r, 1, MOST_NOTES + 1);
        Note loop_notes[MOST_NOTES], once_notes[MOST_NOTES];
        for (int k = 0; k < n; k++) {
            const int f = g_rand_int_range(r, 0, trial % 5 == 0 ? 1 : FIELDS);
            const double x = replay_figure(r, off_grid);
            loop_notes[k] = (Note){.kind = NOTE_ADD, .field = &by_loop[f], .x = x};
            once_notes[k] = (Note){.kind = NOTE_ADD, .field = &at_once[f], .x = x};
        }
        const uint64_t t = times[trial % G_N_ELEMENTS(times)];
        for (uint64_t j = 0; j < t; j++)
            for (int k = 0; k < n; k++)
                *loop_notes[k].field += loop_notes[k].x;
        sim_fold_replay_sums(once_notes, (size_t)n, t);
        for (int f = 0; f < FIELDS; f++)
            if (memcmp(&by_loop[f], &at_once[f], sizeof(double)) != 0)
                g_error("trial %d, field %d, %d notes x %" G_GUINT64_FORMAT
                        ": %.17g one by one, %.17g at once",
                        trial, f, n, t, by_loop[f], at_once[f]);
    }
    g_rand_free(r);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/sim/fold-notes/replay-sums", test_replay_sums);
    return g_test_run();
}
