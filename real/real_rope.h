/* real_rope: the rotary embeddings' frequencies, from the base theta and a long-context
 * rescaling (config.json's rope_scaling), computed on the host for every backend. */
#ifndef REAL_ROPE_H
#define REAL_ROPE_H

/* The rescalings zreal implements: none, linear (positions divided by factor) and Llama 3.1's
 * "llama3". */
typedef enum {
    REAL_ROPE_SCALING_NONE,
    REAL_ROPE_SCALING_LINEAR,
    REAL_ROPE_SCALING_LLAMA3,
} RealRopeScaling;

/* Rotary embeddings of a model: the first rot_dim (even) dimensions of each head turn. */
typedef struct {
    float theta;
    int rot_dim;
    RealRopeScaling scaling;
    float factor;                  /* linear and llama3 */
    float low_freq_factor;         /* llama3 */
    float high_freq_factor;        /* llama3, above low_freq_factor */
    int original_positions;        /* llama3: original_max_position_embeddings */
} RealRope;

/* Radians per position of the pair (c, c + rot_dim/2), c < rot_dim/2: inv = theta^(-2c/r),
 * divided by factor (linear), or as transformers' _compute_llama3_parameters rescales it:
 * wavelengths 2 pi / inv above original / low_freq_factor divided by factor, below
 * original / high_freq_factor kept, between a linear ramp in original / wavelength. */
double real_rope_inv_freq(const RealRope *rope, int c);

#endif
