/* real_rope: the rotary embeddings' inverse frequencies, in double, the one definition both
 * backends turn pairs by. */
#include "real_rope.h"

#include <math.h>

double real_rope_inv_freq(const RealRope *rope, int c)
{
    const double inv = pow((double)rope->theta, -2.0 * c / rope->rot_dim);
    if (rope->scaling == REAL_ROPE_SCALING_LINEAR)
        return inv / rope->factor;
    if (rope->scaling != REAL_ROPE_SCALING_LLAMA3)
        return inv;
    const double wavelen = 2.0 * M_PI / inv;
    const double original = rope->original_positions;
    const double low = rope->low_freq_factor, high = rope->high_freq_factor;
    if (wavelen < original / high)
        return inv;
    if (wavelen > original / low)
        return inv / rope->factor;
    const double smooth = (original / wavelen - low) / (high - low);
    return (1.0 - smooth) * inv / rope->factor + smooth * inv;
}
