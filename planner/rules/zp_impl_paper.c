/* zp_impl_paper: the ZeRO paper's idealised semantics (arXiv 1910.02054, sections 5 and 7):
 * reduce-scatter of gradients, whole units gathered with the unit-level prefetch window. */
#include "zp_impl.h"

#include <math.h>

static gboolean paper_has_stage(int stage)
{
    return stage >= 0 && stage <= 3;
}

/* Stage 0 all-reduces gradients; stages 1-3 reduce-scatter them (paper section 7.2). */
static ZpCollKind paper_grad_collective(const ZpPlan *plan)
{
    return plan->zero.stage == 0 ? ZP_COLL_ALLREDUCE : ZP_COLL_REDUCE_SCATTER;
}

/* The paper has no experts: their gradients are reduced as they are kept, whole below stage 2
 * (all-reduce), partitioned from it (reduce-scatter) over the expert-data-parallel group. */
static ZpCollKind paper_expert_grad_collective(const ZpPlan *plan)
{
    return plan->zero.stage >= 2 ? ZP_COLL_REDUCE_SCATTER : ZP_COLL_ALLREDUCE;
}

/* Whole units grouped up to reduce_bucket_size, a larger unit alone. */
static void paper_plan_buckets(const ZpSchedule *s, GArray *buckets)
{
    zp_impl_group_buckets(s, FALSE, s->plan.zero.reduce_bucket_size, FALSE, buckets);
}

static int paper_bucket_buffers(const ZpPlan *plan, double *elems)
{
    (void)plan;
    *elems = 0;
    return 0;
}

static gboolean paper_concat_copy(const ZpPlan *plan, const ZpBucketSpec *k)
{
    (void)plan, (void)k;
    return FALSE;
}

static void add_fetch(const ZpSchedule *s, GArray *fetches, int unit, int use_pos, int free_pos)
{
    if (zp_sched_unit_persistent(s, unit))
        return;
    ZpFetch f = {unit, s->unit_offset[unit], zp_sched_unit_padded(s, unit), use_pos, use_pos,
                 free_pos, FALSE, s->unit_elems[unit], 0, 0, 0};
    g_array_append_val(fetches, f);
}

/* Each unit gathered before its forward, again before its backward (before the recompute
 * with checkpointing, kept through the backward), the head's tied embedding kept until the
 * embedding's backward, which needs it again. */
static void paper_plan_fetches(const ZpSchedule *s, GArray *fetches)
{
    const int L = (int)s->model.layers;
    add_fetch(s, fetches, 0, zp_pos_fwd(0), zp_pos_fwd(0));
    for (int l = 1; l <= L; l++)
        add_fetch(s, fetches, l, zp_pos_fwd(l), zp_pos_fwd(l));
    add_fetch(s, fetches, L + 1, zp_pos_head(L), zp_pos_head(L));
    if (s->model.tied_embeddings) /* the head reads wte */
        add_fetch(s, fetches, 0, zp_pos_head(L), zp_pos_embed_bwd(L));
    for (int l = L; l >= 1; l--)
        add_fetch(s, fetches, l, s->plan.checkpoint ? zp_pos_rec(L, l) : zp_pos_bwd(L, l),
                  zp_pos_bwd(L, l));
    zp_impl_prefetch_window(s, fetches);
}

static double paper_grad_state_elems(const ZpSchedule *s)
{
    return zp_impl_partition_grad_elems(s);
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

/* Stage-3 parameters kept whole on every rank, per unit as the paper's schedule gathers. */
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

void zp_impl_paper_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    const ZpZeroConfig *z = &plan->zero;
    const ZpStateBytes bytes = zp_plan_state_bytes(plan->precision, plan->optimizer);
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
    }
}

double zp_impl_unit_gather_bound(const ZpModel *model, const ZpPlan *plan)
{
    const double threshold = plan->zero.stage3_param_persistence_threshold, mp = plan->mp;
    const double block = ceil((double)zp_model_unit_elems(model, 1) / mp);
    const double embedding = ceil((double)zp_model_unit_elems(model, 0) / mp);
    return (block > threshold ? 2 * (double)model->layers * block : 0) +
           (embedding > threshold ? embedding : 0);
}

const ZpImpl zp_impl_paper = {
    .kind = ZP_IMPL_PAPER,
    .name = "paper",
    .has_stage = paper_has_stage,
    .stages = "stages 0, 1, 2 and 3",
    .zero_r = TRUE,
    .grad_collective = paper_grad_collective,
    .expert_grad_collective = paper_expert_grad_collective,
    .plan_buckets = paper_plan_buckets,
    .bucket_buffers = paper_bucket_buffers,
    .concat_copy = paper_concat_copy,
    .post_step_gather_buffer = TRUE,
    .plan_fetches = paper_plan_fetches,
    .persistent = zp_impl_persistent_units,
    .unit_persistence = TRUE,
    .grad_state_elems = paper_grad_state_elems,
    .step_buffers = zp_impl_no_step_buffers,
    .residual_buffers = zp_impl_paper_residual,
    .gather_bound_elems = zp_impl_unit_gather_bound,
    .zero_knobs = ZP_ZERO_KNOBS_ALL,
};
