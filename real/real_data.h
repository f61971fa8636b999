/* real_data: a deterministic synthetic token stream with learnable structure for zreal.
 * Sample i depends only on (seed, i), so any split of samples over ranks sees the same data. */

/* The stream is a fixed random sparse Markov chain over the vocabulary: every token v has
 * REAL_DATA_FANOUT successors succ(v, j) = hash(seed, v, j) mod V, taken with probability
 * 0.7, 0.1, 0.1, 0.1. A sample is a walk of seq_len + 1 tokens from a uniform first token;
 * tokens are its first seq_len, targets the last seq_len (the next token at every position).
 * The best attainable loss is the chain's entropy, at most real_data_entropy_nats() = 0.94
 * nats, well below the ln(V) of an untrained model, so a falling loss is visible quickly. */
#ifndef REAL_DATA_H
#define REAL_DATA_H

#include <glib.h>
#include <stdint.h>

#define REAL_DATA_FANOUT 4

#define REAL_DATA_ERROR real_data_error_quark()
GQuark real_data_error_quark(void);

typedef enum {
    REAL_DATA_ERROR_INVALID, /* bad sizes */
} RealDataError;

/* Index of the first sample rank `rank` of `world` reads at (step, micro_step): the global
 * batch of a step is n_micro_steps * world * micro_batch consecutive samples; micro-step m
 * takes the next world * micro_batch of them and rank r the r-th micro_batch of those. So
 * one rank with micro_batch world * b reads exactly the samples world ranks with b read. */
uint64_t real_data_first_sample(uint64_t step, int micro_step, int n_micro_steps, int rank,
                                int world, int micro_batch);

/* Fills tokens and targets ([n_samples, seq_len] each, row-major, host memory) with
 * samples first_sample .. first_sample + n_samples - 1 of the stream of `seed`. Needs
 * n_samples >= 0, seq_len >= 1 and vocab >= 2. */
gboolean real_data_batch(uint64_t seed, uint64_t first_sample, int n_samples, int seq_len,
                         int vocab, int *tokens, int *targets, GError **error);

/* Entropy of the successor distribution in nats: the loss of a perfect model when the
 * successors of a token are distinct (an upper bound on it otherwise). */
double real_data_entropy_nats(void);

#endif
