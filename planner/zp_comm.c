/* zp_comm: closed-form communication volumes (ZeRO paper section 7; Megatron-LM). The
 * simulator's collectives must add up to these, which the tests check. */
#include "zp_comm.h"

double zp_comm_dp_bytes_per_rank(double params, int stage, int dp, int mp, double elem_bytes)
{
    const double psi = params / mp;
    const double passes = stage >= 3 ? 3.0 : 2.0;
    return passes * psi * (dp - 1) / dp * elem_bytes;
}

double zp_comm_tp_bytes_per_block(const ZpModel *model, int micro_batch, int mp,
                                  gboolean checkpoint, double elem_bytes)
{
    const double elems = (double)micro_batch * model->seq_len * model->hidden;
    const double allreduces = checkpoint ? 6.0 : 4.0;
    return allreduces * 2.0 * (mp - 1) / mp * elems * elem_bytes;
}
