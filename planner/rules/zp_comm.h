/* zp_comm: the communication volume model — bytes each rank sends per training step for
 * ZeRO's data-parallel collectives and for Megatron tensor parallelism. */
#ifndef ZP_COMM_H
#define ZP_COMM_H

#include "zp_model.h"

/* Bytes a rank sends per step in data-parallel collectives: a ring all-reduce (or
 * reduce-scatter + all-gather) of psi elements sends 2 psi (N-1)/N elements per rank;
 * stage 3 adds a second all-gather for backward: 3 psi (N-1)/N. psi = params / mp. Gradient
 * passes move reduce_bytes per element (the reduction dtype), parameter passes param_bytes. */
double zp_comm_dp_bytes_per_rank(double params, int stage, int dp, int mp, double param_bytes,
                                 double reduce_bytes);

/* Bytes a rank sends per step per transformer block in tensor-parallel all-reduces of the
 * b*s*h activations: two in forward, two in backward, two more when the forward is
 * recomputed; each ring all-reduce sends 2 (M-1)/M of its elements. */
double zp_comm_tp_bytes_per_block(const ZpModel *model, int micro_batch, int mp,
                                  gboolean checkpoint, double elem_bytes);

/* Bytes a rank sends per micro-step for the vocab-parallel embedding and head: the sums of
 * the embedding's lookups and of the head's input gradient (two all-reduces of b*s*h) and the
 * all-gather of each rank's log-sum-exp and target logit, 2 fp32 per token:
 * (M-1) 8 b s. */
double zp_comm_tp_bytes_vocab(const ZpModel *model, int micro_batch, int mp, double elem_bytes);

#endif
