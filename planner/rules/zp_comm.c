/* zp_comm: closed-form communication volumes (ZeRO paper section 7; Megatron-LM). The
 * simulator's collectives must add up to these, which the tests check. */
#include "zp_comm.h"

double zp_comm_dp_bytes_per_rank(double params, int stage, int dp, int mp, double param_bytes,
                                 double reduce_bytes)
{
    const double psi = params / mp;
    /* Stage 0 all-reduces gradients (a reduce-scatter and an all-gather of them); stages 1-2
     * reduce-scatter gradients and all-gather parameters; stage 3 gathers parameters twice. */
    const double gradient_passes = stage == 0 ? 2.0 : 1.0;
    const double param_passes = stage == 0 ? 0.0 : stage == 3 ? 2.0 : 1.0;
    return psi * (dp - 1) / dp * (gradient_passes * reduce_bytes + param_passes * param_bytes);
}

double zp_comm_tp_bytes_per_block(const ZpModel *model, int micro_batch, int mp,
                                  gboolean checkpoint, double elem_bytes)
{
    const double elems = (double)micro_batch * model->seq_len * model->hidden;
    const double allreduces = checkpoint ? 6.0 : 4.0;
    return allreduces * 2.0 * (mp - 1) / mp * elems * elem_bytes;
}

double zp_comm_tp_bytes_vocab(const ZpModel *model, int micro_batch, int mp, double elem_bytes)
{
    const double tokens = (double)micro_batch * model->seq_len;
    return 2 * 2.0 * (mp - 1) / mp * tokens * model->hidden * elem_bytes +
           (mp - 1) * 8.0 * tokens;
}
