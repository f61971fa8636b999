/* zp_zeror: ZeRO-R as DeepSpeed implements it. The rules are closed forms over the plan, so
 * the memory model, the schedule builder and the CLI all ask this file the same question. */
#include "zp_zeror.h"
#include "zp_mem_terms.h"
#include "zp_util.h"

#include <math.h>

/* Pa splits what each tensor-parallel rank holds whole; with sequence parallelism each rank's
 * checkpoint is already its own 1/M of the sequence (zp_mem_checkpoint_bytes), so Pa has
 * nothing left to split. */
static gboolean splits(const ZpPlan *plan)
{
    return plan->ckpt.partition_activations && plan->mp > 1 && !plan->sequence_parallel;
}

ZpCkptRule zp_zeror_checkpoint(const ZpModel *model, const ZpPlan *plan)
{
    ZpCkptRule r = {0};
    if (!plan->checkpoint)
        return r;
    const ZpCheckpointConfig *c = &plan->ckpt;
    r.full_bytes = zp_mem_checkpoint_bytes(model, plan);
    const double kept = splits(plan) ? r.full_bytes / plan->mp : r.full_bytes;
    r.gpu_bytes = c->cpu_checkpointing ? 0.0 : kept;
    r.host_bytes = c->cpu_checkpointing ? kept : 0.0;
    r.copy_bytes = r.host_bytes;
    r.gather_elems = splits(plan) ? (uint64_t)plan->micro_batch * (uint64_t)model->seq_len *
                                        (uint64_t)model->hidden
                                  : 0;
    /* With M = 1 the slice is the whole input and gather_partitioned_activations only views
     * it; a host copy always comes back into a new GPU buffer. */
    r.regathered = splits(plan) || c->cpu_checkpointing;
    return r;
}

double zp_zeror_host_bytes(const ZpModel *model, const ZpPlan *plan)
{
    return (double)model->layers * zp_zeror_checkpoint(model, plan).host_bytes;
}

gboolean zp_zeror_check(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    const ZpCheckpointConfig *c = &plan->ckpt;
    const char *bad = NULL;
    const gboolean any = c->partition_activations || c->cpu_checkpointing ||
                         c->contiguous_memory_optimization || c->synchronize_checkpoint_boundary ||
                         c->number_checkpoints;
    const uint64_t elems = (uint64_t)plan->micro_batch * (uint64_t)model->seq_len *
                           (uint64_t)model->hidden;
    if (any && !plan->checkpoint)
        bad = "activation_checkpointing: partition_activations, cpu_checkpointing and the other "
              "options need checkpointing on (--checkpoint)";
    else if (c->number_checkpoints < 0)
        bad = "activation_checkpointing.number_checkpoints: must be at least 0";
    else if (splits(plan) && elems % (uint64_t)plan->mp != 0)
        bad = "activation_checkpointing.partition_activations: micro-batch x seq x hidden must be "
              "a multiple of the tensor-parallel degree (DeepSpeed's get_partition_size asserts)";
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
        return FALSE;
    }
    return TRUE;
}

double zp_zeror_contiguous_region_bytes(const ZpModel *model, const ZpPlan *plan)
{
    if (!plan->checkpoint || !plan->ckpt.contiguous_memory_optimization)
        return 0.0;
    const ZpCkptRule r = zp_zeror_checkpoint(model, plan);
    const double slots = plan->ckpt.number_checkpoints > 0 ? plan->ckpt.number_checkpoints
                                                           : (double)model->layers;
    return slots * r.gpu_bytes;
}

ZpConstantBuffers zp_zeror_constant_buffers(const ZpModel *model, const ZpPlan *plan)
{
    ZpConstantBuffers cb = {0};
    const ZpZeroConfig *z = &plan->zero;
    const ZpStateBytes bytes = zp_plan_state_bytes(plan->precision, plan->optimizer);
    const double psi = (double)zp_model_param_count(model) / plan->mp;
    const double buffers = (z->stage == 1 || z->stage == 2) && z->overlap_comm ? 2.0 : 1.0;
    double largest = 0;
    if (zp_model_has_architecture(model))
        for (int u = 0; u < 3; u++) {
            const int unit = u == 0 ? 0 : u == 1 ? 1 : (int)model->layers + 1;
            largest = fmax(largest, (double)zp_model_unit_elems(model, unit) / plan->mp);
        }
    /* The reduce bucket (zp_mem_residual's rule): fixed at reduce_bucket_size unless a unit
     * is larger (it gets a bucket of its own) or the model is smaller than the bucket. */
    const double reduce = zp_plan_reduce_bytes(plan) * buffers;
    if (largest > z->reduce_bucket_size) {
        cb.model_sized_bytes += fmin(largest, psi) * reduce;
        cb.model_sized_what = "a unit larger than reduce_bucket_size gets a bucket of its own";
    } else if (psi < z->reduce_bucket_size) {
        cb.model_sized_bytes += psi * reduce;
        cb.model_sized_what = "the model is smaller than reduce_bucket_size: one bucket holds it";
    } else {
        cb.constant_bytes += z->reduce_bucket_size * reduce;
    }
    if (z->stage == 1 || z->stage == 2) {
        if (psi < z->allgather_bucket_size) {
            cb.model_sized_bytes += psi * bytes.param_bytes;
            cb.model_sized_what = cb.model_sized_what ? cb.model_sized_what
                                                      : "the model is smaller than the buckets";
        } else {
            cb.constant_bytes += z->allgather_bucket_size * bytes.param_bytes;
        }
    }
    return cb;
}
