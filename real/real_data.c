/* real_data: a deterministic synthetic token stream with learnable structure for zreal.
 * Built on the splitmix64 mixer: stateless hashing, so no table and no order dependence. */
#include "real_data.h"

#include <math.h>

/* Successor j is taken with weight[j] / REAL_DATA_WEIGHT_TOTAL. */
static const int real_data_weights[REAL_DATA_FANOUT] = {7, 1, 1, 1};
#define REAL_DATA_WEIGHT_TOTAL 10

G_DEFINE_QUARK(real-data-error-quark, real_data_error)

/* splitmix64's output function: a bijective 64-bit mixer with good avalanche. */
static uint64_t real_data_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The j-th successor of token v in the chain of `seed`. */
static int real_data_successor(uint64_t seed, int v, int j, int vocab)
{
    uint64_t key = real_data_mix(seed) + (uint64_t)v * REAL_DATA_FANOUT + (uint64_t)j;
    return (int)(real_data_mix(key) % (uint64_t)vocab);
}

/* Which successor a uniform draw in [0, REAL_DATA_WEIGHT_TOTAL) selects. */
static int real_data_pick(int draw)
{
    int j = 0;
    while (draw >= real_data_weights[j]) {
        draw -= real_data_weights[j];
        j++;
    }
    return j;
}

/* One walk of seq_len + 1 tokens; the sample's own random stream is splitmix64 seeded
 * from (seed, index). */
static void real_data_sample(uint64_t seed, uint64_t index, int seq_len, int vocab,
                             int *tokens, int *targets)
{
    uint64_t state = real_data_mix(seed ^ real_data_mix(index ^ 0x5851f42d4c957f2dull));
    int current = (int)(real_data_mix(state) % (uint64_t)vocab);
    for (int t = 0; t < seq_len; t++) {
        state += 0x9e3779b97f4a7c15ull;
        int draw = (int)(real_data_mix(state) % REAL_DATA_WEIGHT_TOTAL);
        int next = real_data_successor(seed, current, real_data_pick(draw), vocab);
        tokens[t] = current;
        targets[t] = next;
        current = next;
    }
}

uint64_t real_data_first_sample(uint64_t step, int micro_step, int n_micro_steps, int rank,
                                int world, int micro_batch)
{
    uint64_t micro_index = step * (uint64_t)n_micro_steps + (uint64_t)micro_step;
    return (micro_index * (uint64_t)world + (uint64_t)rank) * (uint64_t)micro_batch;
}

gboolean real_data_batch(uint64_t seed, uint64_t first_sample, int n_samples, int seq_len,
                         int vocab, int *tokens, int *targets, GError **error)
{
    if (n_samples < 0 || seq_len < 1 || vocab < 2) {
        g_set_error(error, REAL_DATA_ERROR, REAL_DATA_ERROR_INVALID,
                    "synthetic data needs n_samples >= 0, seq_len >= 1 and vocab >= 2 "
                    "(got %d, %d, %d)",
                    n_samples, seq_len, vocab);
        return FALSE;
    }
    for (int i = 0; i < n_samples; i++) {
        size_t row = (size_t)i * seq_len;
        real_data_sample(seed, first_sample + (uint64_t)i, seq_len, vocab, tokens + row,
                         targets + row);
    }
    return TRUE;
}

double real_data_entropy_nats(void)
{
    double h = 0.0;
    for (int j = 0; j < REAL_DATA_FANOUT; j++) {
        double p = (double)real_data_weights[j] / REAL_DATA_WEIGHT_TOTAL;
        h -= p * log(p);
    }
    return h;
}
