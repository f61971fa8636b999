/* zp_mem: model states follow the ZeRO paper's formulas term by term, in double: 1e15
 * parameters x 16 bytes is 1.6e16, exact in a double's 53-bit mantissa for our inputs. */
#include "zp_mem.h"
#include "zp_zeror.h"

#include <math.h>

ZpModelStates zp_mem_model_states(double params, int stage, int dp, int mp, ZpStateBytes bytes)
{
    const double psi = params / mp, n = dp;
    ZpModelStates m;
    m.params_bytes = bytes.param_bytes * psi / (stage >= 3 ? n : 1.0);
    m.grads_bytes = bytes.grad_bytes * psi / (stage >= 2 ? n : 1.0);
    m.optim_bytes = bytes.optim_bytes * psi / (stage >= 1 ? n : 1.0);
    m.total_bytes = m.params_bytes + m.grads_bytes + m.optim_bytes;
    return m;
}

double zp_mem_max_params(double budget_bytes, int stage, int dp, int mp, ZpStateBytes bytes)
{
    /* Model states are linear in psi: bytes(psi) = psi * bytes(1). */
    const ZpModelStates per_param = zp_mem_model_states(1.0, stage, dp, mp, bytes);
    return budget_bytes / per_param.total_bytes;
}

uint64_t zp_mem_padded_elems(uint64_t elems, uint64_t multiple)
{
    return multiple ? (elems + multiple - 1) / multiple * multiple : elems;
}

/* The block's bytes with the replicated terms (norms, dropout masks) divided by `spread`:
 * 1 without sequence parallelism, t with it. */
static double block_bytes(const ZpModel *model, int micro_batch, int mp, double elem_bytes,
                          ZpAttention attention, double spread)
{
    const double s = model->seq_len, b = micro_batch, h = model->hidden, a = model->heads;
    const double t = mp, f = model->ffn_hidden;
    const double kd = (double)zp_model_kv_heads(model) * (double)zp_model_head_dim(model);
    const double replicated = model->parallel_residual ? 3 * h : 4 * h;
    const double split = 2 * h + 2 * kd + (zp_model_gated(model) ? 3 : 2) * f;
    const gboolean fused = zp_attention_fused(attention);
    const double scores = fused ? 0.0 : (model->dropout ? 5.0 : 2.0) * a * s * s * b / t;
    const double masks = model->dropout ? 2.0 * s * b * h / spread : 0.0;
    const double sixteen_bit = 2.0 * s * b * (replicated / spread + split / t) + masks + scores;
    const double lse = fused ? 4.0 * a * s * b / t : 0.0;
    return sixteen_bit * elem_bytes / 2.0 + lse;
}

double zp_mem_activation_block_bytes(const ZpModel *model, int micro_batch, int mp,
                                     double elem_bytes, ZpAttention attention)
{
    return block_bytes(model, micro_batch, mp, elem_bytes, attention, 1.0);
}

double zp_mem_plan_activation_block_bytes(const ZpModel *model, const ZpPlan *plan)
{
    return block_bytes(model, plan->micro_batch, plan->mp, zp_plan_elem_bytes(plan->precision),
                       plan->attention, plan->sequence_parallel ? plan->mp : 1.0);
}

double zp_mem_checkpoint_bytes(const ZpModel *model, const ZpPlan *plan)
{
    return (double)model->seq_len * plan->micro_batch * (double)model->hidden *
           zp_plan_elem_bytes(plan->precision) / (plan->sequence_parallel ? plan->mp : 1);
}

/* A model's units come in three sizes: the embedding (unit 0), L identical blocks and the
 * final unit. Walking these classes gives the sums a walk over every unit gives, in O(1):
 * the planner's search screens a million plans a second through zp_mem_residual. */
typedef struct {
    int unit;     /* a unit of the class */
    double count; /* units in the class */
} UnitClass;

static int unit_classes(const ZpModel *model, UnitClass classes[3])
{
    if (!zp_model_has_architecture(model))
        return 0;
    classes[0] = (UnitClass){0, 1.0};
    classes[1] = (UnitClass){1, (double)model->layers};
    classes[2] = (UnitClass){(int)model->layers + 1, 1.0};
    return 3;
}

/* Stage-3 parameters kept whole on every rank. DeepSpeed decides per tensor (those of at most
 * stage3_param_persistence_threshold elements); zplan decides per unit, the granularity its
 * schedule gathers at, so the memory model and the schedule agree. The difference is the
 * biases and norms inside each block (9h + f elements, under 0.1% of a block). */
static double persistent_elems(const ZpModel *model, double threshold, int mp)
{
    UnitClass classes[3];
    const int n = unit_classes(model, classes);
    double total = 0;
    for (int c = 0; c < n; c++) {
        const double elems = (double)zp_model_unit_elems(model, classes[c].unit) / mp;
        if (elems <= threshold)
            total += classes[c].count * elems;
    }
    return total;
}

static double largest_unit_elems(const ZpModel *model)
{
    UnitClass classes[3];
    const int n = unit_classes(model, classes);
    double largest = 0;
    for (int c = 0; c < n; c++)
        largest = fmax(largest, (double)zp_model_unit_elems(model, classes[c].unit));
    return largest;
}

static void add_activation_terms(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    const double s = model->seq_len, b = plan->micro_batch;
    r->activation_block_bytes = zp_mem_plan_activation_block_bytes(model, plan);
    if (plan->checkpoint) {
        /* A checkpoint is the block input, 2sbh in 16 bits, replicated across the tensor
         * group (split over it with sequence parallelism) unless Pa partitions it (zp_zeror);
         * backward recomputes one block at a time, so one block's set is live, beside the
         * re-gathered input under Pa. */
        const ZpCkptRule rule = zp_zeror_checkpoint(model, plan);
        r->checkpoint_bytes = (double)model->layers * rule.gpu_bytes;
        r->checkpoint_host_bytes = (double)model->layers * rule.host_bytes;
        r->recompute_bytes = r->activation_block_bytes + (rule.regathered ? rule.full_bytes : 0);
    } else {
        r->activations_bytes = (double)model->layers * r->activation_block_bytes;
    }
    /* Korthikanti's output layer term: 4 s b V / t bytes of fp32 logits for the loss. */
    r->logits_bytes = 4.0 * s * b * (double)model->vocab / plan->mp;
}

static void add_buffer_terms(const ZpModel *model, const ZpPlan *plan, ZpStateBytes bytes,
                             ZpResidual *r)
{
    const ZpZeroConfig *z = &plan->zero;
    const double psi = (double)zp_model_param_count(model) / plan->mp;
    /* Stages 1-2 double-buffer the gradient bucket when overlap_comm is on (DeepSpeed's
     * ipg_buffer pair); stages 0 and 3 use one. A bucket holds whole units (a larger unit
     * gets a bucket of its own) and never exceeds the model. */
    const double buffers = (z->stage == 1 || z->stage == 2) && z->overlap_comm ? 2.0 : 1.0;
    const double bucket_elems =
        zp_model_has_architecture(model)
            ? fmax(z->reduce_bucket_size, largest_unit_elems(model) / plan->mp)
            : z->reduce_bucket_size;
    r->reduce_bucket_bytes = fmin(bucket_elems, psi) * zp_plan_reduce_bytes(plan) * buffers;
    if (z->stage == 1 || z->stage == 2)
        r->allgather_bucket_bytes = fmin(z->allgather_bucket_size, psi) * bytes.param_bytes;
    if (z->stage == 3 && zp_model_has_architecture(model)) {
        /* The schedule's worst moment is in backward: the tied embedding, gathered for the
         * head, is kept until the embedding's own backward, beside the block being worked on
         * and what is prefetched after it (an untied head leaves the embedding alone). */
        const double threshold = z->stage3_param_persistence_threshold;
        const double embed = (double)zp_model_unit_elems(model, 0) / plan->mp;
        const double block = (double)zp_model_unit_elems(model, 1) / plan->mp;
        const double kept = embed <= threshold || !model->tied_embeddings ? 0.0 : embed;
        const double working = block <= threshold ? 0.0 : block;
        r->stage3_gathered_bytes =
            (kept + fmin(z->stage3_max_live_parameters, working + z->stage3_prefetch_bucket_size)) *
            bytes.param_bytes;
        r->stage3_persistent_bytes =
            persistent_elems(model, z->stage3_param_persistence_threshold, plan->mp) *
            bytes.param_bytes;
        /* hpZ (zp_zeropp_secondary_bytes, without the schedule's per-unit padding). */
        if (z->zero_hpz_partition_size > 1)
            r->hpz_secondary_bytes = (psi - persistent_elems(model, threshold, plan->mp)) *
                                     bytes.param_bytes / z->zero_hpz_partition_size;
    }
}

ZpResidual zp_mem_residual(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw)
{
    ZpResidual r = {0};
    const ZpStateBytes bytes = zp_plan_state_bytes(plan->precision, plan->optimizer);
    if (zp_model_has_architecture(model))
        add_activation_terms(model, plan, &r);
    add_buffer_terms(model, plan, bytes, &r);
    r.reserve_bytes = hw ? hw->runtime_reserve_bytes : 0.0;
    r.total_bytes = r.activations_bytes + r.checkpoint_bytes + r.recompute_bytes +
                    r.logits_bytes + r.reduce_bucket_bytes + r.allgather_bucket_bytes +
                    r.stage3_gathered_bytes + r.stage3_persistent_bytes + r.hpz_secondary_bytes +
                    r.reserve_bytes;
    return r;
}
