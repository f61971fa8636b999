/* zp_impl_deepspeed: DeepSpeed v0.19.6's ZeRO as its source does it (deepspeed/runtime/zero/
 * stage_1_and_2.py, stage3.py, partitioned_param_coordinator.py, runtime/utils.py, engine.py);
 * each rule below names the file and function it follows. */
#include "zp_impl.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

static gboolean ds_has_stage(int stage)
{
    return stage >= 0 && stage <= 3;
}

/* Stage 0: engine.py DeepSpeedEngine.allreduce_gradients -> buffered_allreduce_fallback
 * all-reduces flattened buckets. Stages 1-2: stage_1_and_2.py average_tensor with
 * use_multi_rank_bucket_allreduce (default true) all-reduces each bucket and every rank keeps
 * its slice; with false it dist.reduce()s each rank's slice to that rank, which sends what a
 * reduce-scatter sends ((n-1)/n of the bucket per rank) and is timed as one. Stage 3: stage3.py
 * __avg_scatter_grads reduce-scatters the bucket. */
static ZpCollKind ds_grad_collective(const ZpPlan *plan)
{
    const int stage = plan->zero.stage;
    if (stage == 3 || ((stage == 1 || stage == 2) && !plan->zero.use_multi_rank_bucket_allreduce))
        return ZP_COLL_REDUCE_SCATTER;
    return ZP_COLL_ALLREDUCE;
}

/* When each bucket is reduced. Stages 2-3, and stage 1 with overlap_comm at the last
 * micro-step, reduce from the gradient hooks: stage_1_and_2.py and stage3.py
 * reduce_independent_p_g_buckets_and_remove_grads reduce the bucket being filled when the
 * parameter whose hook runs does not fit it (`bucket.elements + param.numel() >
 * reduce_bucket_size`), before adding that parameter; the last bucket is reduced by the
 * epilogue after the backward (independent_gradient_partition_epilogue). A hook runs as its
 * module's backward produces the gradient, so bucket i launches after the backward of the
 * module holding the tensor below its range (bucket i+1's first gradient). Stage 0
 * (engine.py allreduce_gradients -> buffered_allreduce_fallback) and stage 1 without
 * overlap_comm (stage_1_and_2.py reduce_gradients, which walks every parameter once the
 * backward is done) reduce after the whole backward. */
static gboolean ds_grads_by_module(const ZpPlan *plan)
{
    return plan->zero.stage >= 2 || (plan->zero.stage == 1 && plan->zero.overlap_comm);
}

static void ds_launch_points(const ZpSchedule *s, GArray *buckets, const GArray *experts)
{
    ZpBucketSpec *k = (ZpBucketSpec *)buckets->data;
    const gboolean hooks = ds_grads_by_module(&s->plan);
    if (buckets->len == 0)
        return;
    const int last = k[buckets->len - 1].low_unit;
    GArray *tensors = hooks ? zp_impl_tensors(s) : NULL;
    const ZpImplTensor *t = tensors ? (const ZpImplTensor *)tensors->data : NULL;
    guint x = tensors ? tensors->len : 0; /* tensors from the last down, as buckets go */
    for (guint i = 0; i + 1 < buckets->len; i++) {
        k[i].launch_unit = last;
        if (!hooks)
            continue;
        if (experts && g_array_index(experts, ZpBucketExperts, i + 1).on_top) {
            /* the next gradient is a sparse unit's experts' */
            k[i].launch_unit = k[i + 1].top_unit;
            k[i].launch_module = ZP_LAUNCH_EXPERTS;
            continue;
        }
        while (x > 0 && t[x - 1].offset >= k[i].lo)
            x--;
        /* x - 1: the tensor just below the bucket, the next gradient handed on */
        const ZpImplTensor *next = &t[x - 1];
        k[i].launch_unit = next->unit;
        const gboolean block = next->unit >= 1 && next->unit <= (int)s->model.layers;
        int first = (int)x - 1;
        while (first > 0 && t[first - 1].unit == next->unit)
            first--;
        k[i].launch_module = block ? next->module - t[first].module : -1;
    }
    if (tensors)
        g_array_unref(tensors);
}

/* Buckets hold whole parameters in backward order up to reduce_bucket_size elements
 * (stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads, stage3.py
 * reduce_independent_p_g_buckets_and_remove_grads). A parameter larger than the bucket is
 * reduced from its own gradient (extra_large_param_to_reduce; stage 3's __add_grad_to_ipg_bucket
 * leaves it outside the flat buffer). Stage 0's buffered_allreduce_fallback flattens every
 * bucket, a large tensor alone, into a copy. */
static void ds_group(const ZpSchedule *s, GArray *buckets, GArray *experts)
{
    const gboolean bypass = s->plan.zero.stage >= 1 && s->plan.zero.contiguous_gradients;
    if (experts)
        zp_impl_group_buckets_with_experts(s, s->plan.zero.reduce_bucket_size, bypass, buckets,
                                           experts);
    else
        zp_impl_group_buckets(s, TRUE, s->plan.zero.reduce_bucket_size, bypass, buckets);
    ds_launch_points(s, buckets, experts);
}

static void ds_plan_buckets(const ZpSchedule *s, GArray *buckets)
{
    GArray *experts = zp_impl_experts_in_buckets(s)
                          ? g_array_new(FALSE, FALSE, sizeof(ZpBucketExperts))
                          : NULL;
    ds_group(s, buckets, experts);
    if (experts)
        g_array_unref(experts);
}

static void ds_bucket_experts(const ZpSchedule *s, GArray *experts)
{
    GArray *buckets = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    ds_group(s, buckets, experts);
    g_array_unref(buckets);
}

/* Stage 2: the expert gradients fill the same ipg buffer as the dense ones. stage_1_and_2.py
 * reduce_independent_p_g_buckets_and_remove_grads counts every parameter with a gradient hook,
 * an expert one too, against reduce_bucket_size and copies it into bucket.buffer (marking
 * has_moe_params); average_tensor then reduces each gradient slice over its parameter's group
 * (an expert parameter's expert_dp_process_group, _configure_moe_settings' real_dp_process_group
 * of its param group), one allreduce_and_scatter per group (bucket_key ("allreduce",
 * process_group)): a dense and an expert reduction out of one bucket. Here a sparse unit's
 * experts count as one item (DeepSpeed counts each expert parameter: a boundary may fall
 * between them there), so this holds where each unit's experts fit the bucket, with more than
 * one expert-data-parallel rank (with one, nothing of theirs is reduced), without a pipeline
 * (whose reductions run after its flush) and with the held ipg buffers (contiguous_gradients).
 * Stage 3 (stage3.py reduce_independent_p_g_buckets_and_remove_grads: a parameter of another
 * partition group than the bucket's forces __reduce_and_partition_ipg_grads first) and stage 1
 * keep their own rule (zp_build_moe_backward). */
static gboolean ds_experts_in_buckets(const ZpSchedule *s)
{
    const ZpPlan *plan = &s->plan;
    if (plan->zero.stage != 2 || !plan->zero.contiguous_gradients || zp_plan_pp(plan) > 1 ||
        zp_plan_edp(plan) <= 1)
        return FALSE;
    for (int u = 0; u < s->n_units; u++)
        if ((double)zp_impl_unit_expert_elems(s, u) > plan->zero.reduce_bucket_size)
            return FALSE;
    return TRUE;
}

/* Stage 0: engine.py allreduce_gradients -> buffered_allreduce_fallback at the accumulation
 * boundary reduces the non-expert gradients (_reduce_non_expert_gradients), then
 * _reduce_expert_gradients: each expert group's gradients, in named_parameters order, by
 * allreduce_no_retain over groups._get_expert_data_parallel_group, buckets of
 * elements_per_buffer flattened into copies (allreduce_and_copy). Stages 1-2 put the expert
 * gradients in the ipg buckets (stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads,
 * average_tensor: an expert parameter's slices over expert_dp_process_group). */
static gboolean ds_experts_after_backward(const ZpPlan *plan)
{
    return plan->zero.stage == 0;
}

/* Stages 1-2 with contiguous_gradients: stage_1_and_2.py DeepSpeedZeroOptimizer.backward
 * allocates ipg_buffer, one tensor of exactly reduce_bucket_size elements, two with
 * overlap_comm. Stage 3: stage3.py DeepSpeedZeroOptimizer_Stage3.__init__ allocates one
 * __ipg_bucket_flat_buffer of reduce_bucket_size. Otherwise each bucket is flattened on its own. */
static int ds_bucket_buffers(const ZpPlan *plan, double *elems)
{
    const ZpZeroConfig *z = &plan->zero;
    *elems = z->reduce_bucket_size;
    if (z->stage == 3)
        return 1;
    if ((z->stage == 1 || z->stage == 2) && z->contiguous_gradients)
        return z->overlap_comm ? 2 : 1;
    *elems = 0;
    return 0;
}

/* When the ipg buffers are taken. Stage 3: stage3.py DeepSpeedZeroOptimizer_Stage3.__init__
 * allocates bucket.buffer once ("# IPG", with contiguous_gradients) and no code path of a step
 * frees it. Stages 1-2: stage_1_and_2.py setup_buckets (process_gradients, the first gradient
 * hook of a backward while not ready_for_gradients) allocates them and
 * independent_gradient_partition_epilogue's _release_ipg_buffers drops them with
 * ready_for_gradients = False. At stage 2 the epilogue ends every backward (engine.py
 * allreduce_gradients: overlapping_partition_gradients_reduce_epilogue); at stage 1 only the
 * last micro-step's (reduce_gradients at the accumulation boundary), so the buffers micro-step
 * 0's first hook took (create_gradient_handling_hooks: with contiguous_gradients the hooks
 * exist without overlap_comm too) are kept through the accumulation. */
static ZpHeldSpan ds_held_span(const ZpPlan *plan)
{
    const int stage = plan->zero.stage;
    return stage == 3 ? ZP_HELD_ALL_STEP : stage == 1 ? ZP_HELD_FROM_FIRST : ZP_HELD_PER_BACKWARD;
}

/* Stages 1-2 with overlap_comm: stage_1_and_2.py independent_gradient_partition_epilogue
 * (engine.py allreduce_gradients -> overlapping_partition_gradients_reduce_epilogue, after each
 * reducing backward) calls get_accelerator().synchronize() before _release_ipg_buffers: the
 * host waits there for every reduction of the backward, so the next micro-step's forward (or
 * the step) is issued only after the last one and after the ipg buffers are dropped. Stage 3's
 * epilogue synchronises the reduce_and_partition_stream alone (zp_build_step's reduce_gate,
 * for the host's gathers). */
static gboolean ds_epilogue_syncs_device(const ZpPlan *plan)
{
    return (plan->zero.stage == 1 || plan->zero.stage == 2) && plan->zero.overlap_comm;
}

/* stage3.py __avg_scatter_grads -> comm/coalesced_collectives.py reduce_scatter_coalesced
 * concatenates the bucket's padded partitions into one tensor before reducing, but for one
 * tensor that needs no padding, reduced in place ("if there's only one tensor being reduced
 * and we don't need to pad we have an opportunity to avoid a memory allocation"). */
static gboolean ds_concat_copy(const ZpPlan *plan, const ZpBucketSpec *k)
{
    return plan->zero.stage == 3 && (k->n_items > 1 || (k->hi - k->lo) % (uint64_t)plan->dp != 0);
}

/* ---- stage 3: the partitioned-parameter coordinator, replayed on the module trace -------- */

typedef struct {
    int module, pos, step; /* step: the compute op of pos that uses it (zp_impl.h) */
} Use;

typedef struct {
    const ZpSchedule *s;
    GArray *tensors;      /* ZpImplTensor */
    guint *module_start;  /* tensors of module m: [module_start[m], module_start[m+1]) */
    double *module_numel; /* elements of each module's tensors (ds_numel, persistent too) */
    gboolean *persist;    /* per tensor */
    GArray *uses;         /* Use, in trace order */
    /* what uses and the fetches being listed hold without growing (zp_array_extend: a GLib
     * append an entry checked the room with a 64-bit division, 15 M instructions of plan
     * --3d gpt-1t/4096) */
    guint uses_room, fetches_room;
    int *unit_first, *unit_last; /* modules of unit u (by its first tensor): -1 when none */
    int n_units;
    /* For kept(): [use] the next use of its module (uses->len for none), and the elements of
     * the modules of the uses before it (exact: integers below 2^53). */
    guint *next_use;
    double *numel_before;
} Trace;

static void add_use(Trace *t, int module, int pos, int step)
{
    const Use u = {module, pos, step};
    *(Use *)zp_array_extend(t->uses, 1, sizeof u, &t->uses_room) = u;
}

/* Modules of unit u, forward or reverse; under module compute a block's i-th module used is
 * its position's step i (parameter_offload.py's pre-forward and pre-backward hooks fetch each
 * module right before its own compute). */
static void add_unit(Trace *t, int unit, int pos, gboolean reverse)
{
    const int first = unit < t->n_units ? t->unit_first[unit] : -1;
    const int last = unit < t->n_units ? t->unit_last[unit] : -1;
    const gboolean split = unit >= 1 && unit <= t->s->model.layers &&
                           zp_impl_module_compute(t->s);
    /* Module m of a block is step m forward and ZP_MOD_N - 1 - m backward (zp_step_module);
     * a sparse block's last module, fc2, holds only experts (the expert space's, gathered
     * over the expert-data-parallel group by zp_build_moe.c), so its dense modules stop at
     * fc1's router and the backward's steps are not counted from the unit's last module. */
    for (int i = 0; first >= 0 && i <= last - first; i++) {
        const int m = reverse ? last - i - first : i;
        add_use(t, first + m, pos, !split ? 0 : reverse ? ZP_MOD_N - 1 - m : m);
    }
}

static int module_of_first_tensor(const Trace *t, int unit)
{
    for (guint i = 0; i < t->tensors->len; i++)
        if (g_array_index(t->tensors, ZpImplTensor, i).unit == unit)
            return g_array_index(t->tensors, ZpImplTensor, i).module;
    return -1;
}

/* The trace a micro-step records (parameter_offload.py hooks every module's forward and
 * backward; partitioned_param_coordinator.py record_module): embeddings, each block's
 * modules, the final norm and the LM head (the tied embedding's weight), their backward in
 * reverse, each block's recompute in forward order before its backward (checkpointing runs
 * the block's forward hooks again), the embeddings last. */
static void build_trace(Trace *t)
{
    const ZpSchedule *s = t->s;
    const int L = (int)s->model.layers;
    add_unit(t, 0, zp_pos_fwd(0), FALSE);
    for (int l = 1; l <= L; l++)
        add_unit(t, l, zp_pos_fwd(l), FALSE);
    add_unit(t, L + 1, zp_pos_head(L), FALSE);
    const int wte = module_of_first_tensor(t, 0);
    if (s->model.tied_embeddings)
        add_use(t, wte, zp_pos_head(L), 0), add_use(t, wte, zp_pos_head(L), 0);
    add_unit(t, L + 1, zp_pos_head(L), TRUE);
    for (int l = L; l >= 1; l--) {
        if (s->plan.checkpoint)
            add_unit(t, l, zp_pos_rec(L, l), FALSE);
        add_unit(t, l, zp_pos_bwd(L, l), TRUE);
    }
    add_unit(t, 0, zp_pos_embed_bwd(L), TRUE);
}

typedef struct {
    gboolean avail;
    int fetch;          /* its live fetch, -1 when none */
    int fetched_for;    /* __most_recent_step_id_param_fetched_for */
} TensorState;

/* Adds tensor x to the coalesced call being listed (`*opened`: a call already has members),
 * or with stage3_allgather_sequential to a call of its own (partition_parameters.py
 * all_gather_coalesced: allgather_sequential -> _all_gather_sequential). */
static void fetch(Trace *t, GArray *fetches, TensorState *st, guint x, const Use *trigger,
                  const Use *use, double *n_avail, gboolean *opened)
{
    const ZpImplTensor *ten = &g_array_index(t->tensors, ZpImplTensor, x);
    ZpFetch f = {ten->unit, ten->offset, zp_mem_padded_elems(ten->elems, (uint64_t)t->s->plan.dp),
                 trigger->pos, use->pos, use->pos, *opened, ten->elems,
                 trigger->step, use->step, use->step};
    *opened = !t->s->plan.zero.stage3_allgather_sequential;
    *(ZpFetch *)zp_array_extend(fetches, 1, sizeof f, &t->fetches_room) = f;
    st[x].avail = TRUE;
    st[x].fetch = (int)fetches->len - 1;
    *n_avail += (double)ten->elems;
}

/* Fetch k's parameters are released after use u's compute (release_sub_module). */
static void free_at(GArray *fetches, int k, const Use *u)
{
    ZpFetch *f = &g_array_index(fetches, ZpFetch, k);
    f->free_pos = u->pos;
    f->free_step = u->step;
}

/* Whether a parameter of use i is kept: a later use already prefetched for it, or
 * partitioned_param_coordinator.py __params_to_release: a module within
 * stage3_max_reuse_distance elements of the modules after it uses it again (the walk stops
 * once the elements passed reach the distance). A use in the same position is kept too: the
 * schedule computes a position other than a block's as one op (the head's, which uses the
 * tied embedding twice). */
static gboolean kept(const Trace *t, const TensorState *st, guint x, guint i)
{
    const Use *u = (const Use *)t->uses->data;
    if (st[x].fetched_for > (int)i)
        return TRUE;
    /* The walk from use i + 1 on, without walking (a 32,000-layer model took 0.17 s): it
     * stops at the module's next use k (x's module is use i's), kept unless the elements
     * passed before some earlier use reached the distance (they only grow: the use just
     * before k), or, at k in another position, before k itself. */
    const guint k = t->next_use[i];
    if (k == t->uses->len)
        return FALSE;
    const double distance = t->s->plan.zero.stage3_max_reuse_distance;
    const double from = t->numel_before[i + 1];
    if (k > i + 1 && t->numel_before[k - 1] - from >= distance)
        return FALSE;
    return u[k].pos == u[i].pos || t->numel_before[k] - from < distance;
}

/* Trace.next_use and numel_before, for kept(). */
static void index_uses(Trace *t)
{
    const Use *u = (const Use *)t->uses->data;
    const guint n = t->uses->len;
    const guint last = t->tensors->len - 1;
    const int n_modules = (int)g_array_index(t->tensors, ZpImplTensor, last).module + 1;
    guint *seen = g_new(guint, (gsize)n_modules);
    for (int m = 0; m < n_modules; m++)
        seen[m] = n;
    t->next_use = g_new(guint, (gsize)n + 1);
    zp_advise_huge_pages(t->next_use, ((gsize)n + 1) * sizeof(guint));
    for (guint k = n; k-- > 0;) {
        t->next_use[k] = seen[u[k].module];
        seen[u[k].module] = k;
    }
    g_free(seen);
    t->numel_before = g_new(double, (gsize)n + 1);
    zp_advise_huge_pages(t->numel_before, ((gsize)n + 1) * sizeof(double));
    t->numel_before[0] = 0;
    for (guint k = 0; k < n; k++)
        t->numel_before[k + 1] = t->numel_before[k] + t->module_numel[u[k].module];
}

static int by_offset(const void *a, const void *b)
{
    const uint64_t x = ((const ZpFetch *)a)->offset, y = ((const ZpFetch *)b)->offset;
    return (x > y) - (x < y);
}

/* partition_parameters.py all_gather_coalesced orders a call's parameters by ds_id (their
 * order in the model, so in the flat layout) before flattening them: each run of fetches
 * joined to the one before is sorted by offset, its first one opening the call. */
static void sort_calls(GArray *fetches)
{
    ZpFetch *f = (ZpFetch *)fetches->data;
    for (guint i = 0, j; i < fetches->len; i = j) {
        for (j = i + 1; j < fetches->len && f[j].joins_previous; j++)
            ;
        if (j - i > 1) /* most calls are one parameter's: a qsort call each (10 M instructions) */
            qsort(f + i, j - i, sizeof *f, by_offset);
        for (guint k = i; k < j; k++)
            f[k].joins_previous = k > i;
    }
}

/* partitioned_param_coordinator.py fetch_sub_module, replayed: the current module's missing
 * parameters are gathered, by one call of __all_gather_params; then, walking the parameter
 * queue in trace order, parameters are prefetched while the elements prefetched stay below
 * min(stage3_max_live_parameters - live, stage3_prefetch_bucket_size) (so the last one
 * overshoots), all of them by a second call; release_sub_module frees what is not kept. Each
 * call is one coalesced all-gather (__all_gather_params_ -> partition_parameters.py
 * all_gather_coalesced; the builder, zp_sched.c issue_call, lays out its buffers). */
static void ds_plan_fetches(const ZpSchedule *s, GArray *fetches)
{
    Trace t = {.s = s, .tensors = zp_impl_tensors(s),
               .uses = g_array_new(FALSE, FALSE, sizeof(Use))};
    const guint n_t = t.tensors->len;
    const int n_modules = (int)g_array_index(t.tensors, ZpImplTensor, n_t - 1).module + 1;
    t.module_start = g_new0(guint, (gsize)n_modules + 1);
    t.module_numel = g_new0(double, (gsize)n_modules);
    t.persist = g_new0(gboolean, n_t);
    const ZpZeroConfig *z = &s->plan.zero;
    double n_avail = 0;
    for (guint x = 0; x < n_t; x++) {
        const ZpImplTensor *ten = &g_array_index(t.tensors, ZpImplTensor, x);
        t.module_start[ten->module + 1] = x + 1;
        t.module_numel[ten->module] += (double)ten->elems;
        /* partition_parameters.py _convert_to_deepspeed_param: ds_persist when
         * ds_numel <= param_persistence_threshold */
        t.persist[x] = (double)ten->elems <= z->stage3_param_persistence_threshold;
        if (t.persist[x])
            n_avail += (double)ten->elems;
    }
    /* Each unit's first and last module, in one pass: add_unit looked them up by scanning every
     * module for every unit, O(layers^2) (100,000 layers took 321 s). */
    t.n_units = 0;
    for (guint x = 0; x < n_t; x++)
        t.n_units = MAX(t.n_units, g_array_index(t.tensors, ZpImplTensor, x).unit + 1);
    t.unit_first = g_new(int, (gsize)t.n_units);
    t.unit_last = g_new(int, (gsize)t.n_units);
    for (int unit = 0; unit < t.n_units; unit++)
        t.unit_first[unit] = t.unit_last[unit] = -1;
    for (int m = 0; m < n_modules; m++) {
        const int unit = g_array_index(t.tensors, ZpImplTensor, t.module_start[m]).unit;
        if (t.unit_first[unit] < 0)
            t.unit_first[unit] = m;
        t.unit_last[unit] = m;
    }
    /* the trace uses a module at most three times (forward, recomputation, backward), the
     * tied embedding twice more */
    t.uses_room = zp_array_reserve_huge(t.uses, 3 * (guint64)n_modules + 2);
    build_trace(&t);
    index_uses(&t);
    const Use *u = (const Use *)t.uses->data;
    const guint n_u = t.uses->len;
    TensorState *st = g_new(TensorState, n_t);
    zp_advise_huge_pages(st, n_t * sizeof *st);
    for (guint x = 0; x < n_t; x++)
        st[x] = (TensorState){t.persist[x], -1, -1};
    /* The parameter queue (record_parameters: every use's parameters in trace order, a
     * module's by ds_id, so in layout order): use i's start at queue[use_start[i]]. */
    guint *use_start = g_new(guint, n_u + 1);
    zp_advise_huge_pages(use_start, (n_u + 1) * sizeof(guint));
    use_start[0] = 0;
    for (guint i = 0; i < n_u; i++)
        use_start[i + 1] = use_start[i] + t.module_start[u[i].module + 1] -
                           t.module_start[u[i].module];
    /* each place in the queue is fetched once at most */
    t.fetches_room = zp_array_reserve_huge(fetches, fetches->len + (guint64)use_start[n_u]);
    guint head = 0, head_use = 0; /* the queue's next parameter, and its use */
    for (guint i = 0; i < n_u; i++) {
        const int m = u[i].module;
        gboolean opened = FALSE;
        for (guint x = t.module_start[m]; x < t.module_start[m + 1]; x++)
            if (!st[x].avail)
                fetch(&t, fetches, st, x, &u[i], &u[i], &n_avail, &opened);
            else if (st[x].fetch >= 0) /* kept or prefetched: live until this use at least */
                free_at(fetches, st[x].fetch, &u[i]);
        for (guint x = t.module_start[m]; x < t.module_start[m + 1]; x++)
            st[x].fetched_for = MAX(st[x].fetched_for, (int)i);
        /* the current module's parameters leave the queue (those not prefetched yet) */
        head = MAX(head, use_start[i + 1]);
        const double budget = fmin(z->stage3_max_live_parameters - n_avail,
                                   z->stage3_prefetch_bucket_size);
        double prefetching = 0;
        opened = FALSE;
        /* one parameter at a time: a module's may be split between two prefetches */
        while (z->stage3_prefetch_bucket_size > 0 && head < use_start[n_u] &&
               prefetching < budget) {
            while (use_start[head_use + 1] <= head)
                head_use++;
            const guint x = t.module_start[u[head_use].module] + (head - use_start[head_use]);
            st[x].fetched_for = MAX(st[x].fetched_for, (int)head_use);
            if (!st[x].avail) {
                fetch(&t, fetches, st, x, &u[i], &u[head_use], &n_avail, &opened);
                prefetching += (double)g_array_index(t.tensors, ZpImplTensor, x).elems;
            }
            head++;
        }
        for (guint x = t.module_start[m]; x < t.module_start[m + 1]; x++)
            if (!t.persist[x] && st[x].avail && !kept(&t, st, x, i)) {
                free_at(fetches, st[x].fetch, &u[i]);
                st[x].avail = FALSE;
                st[x].fetch = -1;
                n_avail -= (double)g_array_index(t.tensors, ZpImplTensor, x).elems;
            }
    }
    sort_calls(fetches);
    g_free(use_start);
    g_free(st);
    g_free(t.module_start);
    g_free(t.unit_first);
    g_free(t.unit_last);
    g_free(t.module_numel);
    g_free(t.persist);
    g_free(t.next_use);
    g_free(t.numel_before);
    g_array_unref(t.uses);
    g_array_unref(t.tensors);
}

/* Per parameter (partition_parameters.py _convert_to_deepspeed_param: ds_persist). */
static void ds_persistent(const ZpSchedule *s, GArray *ranges)
{
    GArray *tensors = zp_impl_tensors(s);
    /* at most one each (zp_array_extend's room: a GLib append each checked it by a division) */
    guint room = zp_array_reserve_huge(ranges, ranges->len + (guint64)tensors->len);
    for (guint i = 0; i < tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(tensors, ZpImplTensor, i);
        if ((double)t->elems <= s->plan.zero.stage3_param_persistence_threshold) {
            const ZpFetch f = {t->unit, t->offset,
                               zp_mem_padded_elems(t->elems, (uint64_t)s->plan.dp), -1, -1, -1,
                               FALSE, t->elems, 0, 0, 0};
            *(ZpFetch *)zp_array_extend(ranges, 1, sizeof f, &room) = f;
        }
    }
    g_array_unref(tensors);
}

/* Stage 2: stage_1_and_2.py copy_grads_in_partition sizes grads_in_partition as the whole
 * parameters that overlap the rank's partition (get_partition_info's params_in_partition), on
 * the rank where that is largest (every rank runs one schedule; the largest sets what fits).
 * Where it is allocated depends on the rank too: at the rank's first copy, which
 * reduce_ipg_grads makes once average_tensor has issued a bucket's reduction, for each of the
 * bucket's parameters that is_param_in_current_partition. Buckets go in backward order from
 * the last parameter, so the rank holding it copies at the first reduction and rank 0 near
 * the backward's end. The one schedule takes the largest size at the earliest of those times,
 * the step's first reduction (every parameter starts in some rank's partition, so some rank
 * copies there; ds_grads_taken_by_reduction): a bound on every rank, exact for the rank
 * holding the last parameter where its size is the largest. The later rank of the largest
 * size is not taken: every rank's copies would need the buffer from their own first copy
 * (zreal's real_engine_ds.c executes one schedule on every rank). */
static double grads_in_partition_elems(const ZpSchedule *s)
{
    GArray *tensors = zp_impl_tensors(s);
    const ZpImplTensor *t = (const ZpImplTensor *)tensors->data;
    const uint64_t part = s->partition_elems;
    uint64_t worst = 0;
    guint first = 0;
    for (int r = 0; r < s->plan.dp; r++) {
        const uint64_t lo = (uint64_t)r * part, hi = lo + part;
        while (first < tensors->len && t[first].offset + t[first].elems <= lo)
            first++;
        uint64_t sum = 0;
        for (guint i = first; i < tensors->len && t[i].offset < hi; i++)
            sum += t[i].elems;
        worst = MAX(worst, sum);
    }
    g_array_unref(tensors);
    return (double)worst;
}

/* Stage 1 with contiguous_gradients, the gradients on the GPU, no pipeline: autograd
 * allocates each parameter's .grad in micro-step 0's backward (the previous step's
 * free_grad_in_param_list left them None) and accumulates into it through the later ones.
 * At the accumulation boundary (reduce_gradients, or the hooks with overlap_comm)
 * reduce_independent_p_g_buckets_and_remove_grads copies each into the ipg buffer and
 * points .grad at it (grad_reduc.data = new_grad_tensor.data), dropping the full gradient,
 * and reduce_ipg_grads copies the rank's params_in_partition out of the reduced bucket into
 * grads_in_partition ("zero stage 1 - partition only optimizer state":
 * copy_grads_in_partition), allocated at the first copy as at stage 2. So each unit's full
 * gradients are taken before the op of micro-step 0 that produces them (autograd's per
 * parameter, the unit's together here) and freed once the reduction of the unit's last bucket
 * is issued (a parameter's once copied into its bucket, before the bucket's reduction: here
 * after it, as zreal copies them then), and the state kept through the step is
 * grads_in_partition (averaged_gradients, views of it, until step). Without
 * contiguous_gradients nothing is copied out and the full gradients are the state. */
static gboolean ds_full_grads_transient(const ZpPlan *plan)
{
    return plan->zero.stage == 1 && plan->zero.contiguous_gradients &&
           plan->zero.offload_optimizer.device == ZP_OFFLOAD_NONE && zp_plan_pp(plan) == 1;
}

/* Stages 1-2: grads_in_partition (stage 1: with full_grads_transient), micro-step 0's,
 * kept to the step (with accumulation at stage 2, the sum of every micro-step's: below). */
static double ds_grad_state_elems(const ZpSchedule *s)
{
    return s->plan.zero.stage == 2 || ds_full_grads_transient(&s->plan)
               ? grads_in_partition_elems(s)
               : zp_impl_partition_grad_elems(s);
}

/* Stage 2 with the gradients on the GPU: grads_in_partition is None when a step begins (the
 * previous step's _release_ipg_buffers, then step: free_grad_in_param_list and
 * averaged_gradients = None drop its last views), so copy_grads_in_partition allocates it in
 * micro-step 0's backward, at the first reduction (grads_in_partition_elems); step frees it
 * once its fp32 copy is made, before _optimizer_step (the schedule frees it after the
 * optimizer, which allocates nothing in between, so no peak moves). Under cpu_offload
 * copy_grads_in_partition returns first and there is none. Stage 3's partition,
 * grad_partitions_flat_buffer, is allocated in stage3.py __init__ (_setup_for_real_optimizer)
 * and kept. */
static gboolean ds_grads_taken_by_reduction(const ZpPlan *plan)
{
    return (plan->zero.stage == 2 && plan->zero.offload_optimizer.device == ZP_OFFLOAD_NONE) ||
           ds_full_grads_transient(plan);
}

/* Stage 2 with accumulation, the gradients on the GPU (copy_grads_in_partition returns before
 * touching grads_in_partition under cpu_offload): stage_1_and_2.py
 * independent_gradient_partition_epilogue keeps micro-step 0's grads_in_partition as the sum
 * (all_grad_tensors, the parameters' .grad, views of it) while _release_ipg_buffers drops the
 * buffer itself (grads_in_partition = None). So each later micro-step's first
 * copy_grads_in_partition (reduce_ipg_grads, after its first bucket's average_tensor)
 * allocates a new grads_in_partition, and its epilogue, after the last bucket, adds it into
 * the sum in place (accumulated_grad.add_(new_avg_grad), in the gradient accumulation dtype,
 * the model's by default: engine.py get_data_types) and frees it (_clear_param_grad_only
 * drops its last views). The sum is kept to the step (averaged_gradients). Stage 3 adds each
 * reduced partition straight into its gradient buffer (stage3.py partition_grads: copy_ at
 * micro_step_id 0, add_ after), with no copy. Its size and time are those of micro-step 0's
 * grads_in_partition, per rank as there: the largest at the micro-step's first reduction
 * (grads_in_partition_elems). */
static double ds_grad_copy_elems(const ZpSchedule *s)
{
    const ZpPlan *p = &s->plan;
    return p->zero.stage == 2 && p->grad_accum > 1 &&
                   p->zero.offload_optimizer.device == ZP_OFFLOAD_NONE
               ? grads_in_partition_elems(s)
               : 0;
}

/* Stages 1-2: stage_1_and_2.py DeepSpeedZeroOptimizer.step flattens the partition's gradients
 * (flatten_dense_tensors_aligned, a 16-bit copy) and converts it to the fp32 master's dtype
 * (single_grad_partition, kept through the optimizer). Stage 3: stage3.py
 * _prepare_fp32_grad_for_sub_group builds the fp32 gradient of one sub_group_size group at a
 * time (the largest group is what is live at the peak); not under optimizer offload
 * (_prepare_sub_group: "elif not self.offload_optimizer"), where the sub-groups the GPU
 * steps (partial offload) keep their fp32 .grad (zp_offload_tiers' GPU gradients): the
 * stage-3 term is ds_stage3_step_grad_bytes, 0 where there is none. */
static double ds_stage3_step_grad_bytes(const ZpPlan *plan, double part)
{
    const gboolean mixed = plan->precision != ZP_PREC_FP32;
    return mixed && plan->zero.offload_optimizer.device == ZP_OFFLOAD_NONE
               ? fmin(plan->zero.sub_group_size, part) * 4.0
               : 0.0;
}

/* The step's buffers by the rules above: the schedule's (ds_residual's closed form counts
 * the same). */
static void ds_step_buffers(const ZpSchedule *s, GArray *buffers)
{
    const int stage = s->plan.zero.stage;
    const gboolean mixed = s->plan.precision != ZP_PREC_FP32;
    const double part = (double)s->partition_elems;
    const double grad = zp_plan_elem_bytes(s->plan.precision);
    if (stage == 1 || stage == 2) {
        ZpStepBuffer flat = {ZP_MEM_WORKSPACE, part * grad, mixed};
        g_array_append_val(buffers, flat);
        if (mixed) {
            ZpStepBuffer fp32 = {ZP_MEM_WORKSPACE, part * 4.0, FALSE};
            g_array_append_val(buffers, fp32);
        }
    } else if (stage == 3 && ds_stage3_step_grad_bytes(&s->plan, part) > 0) {
        ZpStepBuffer fp32 = {ZP_MEM_WORKSPACE, ds_stage3_step_grad_bytes(&s->plan, part), FALSE};
        g_array_append_val(buffers, fp32);
    }
}

/* zp_model_tensors of `one`, kept while the model asked is the same (zp_model_tensors_kept):
 * the search's screen asks ds_residual at every plan it measures, all of one model, and each
 * call listed the one-block table anew (plan --3d gpt-1t/4096: 5,616 tables, 47 M
 * instructions). The caller does not free the table. */
static const GArray *one_block_tensors(const ZpModel *one)
{
    static ZpModelTensorsKept kept; /* its own: the offload rules keep the whole model's */
    return zp_model_tensors_kept(&kept, one);
}

/* Elements kept whole per rank under per-parameter persistence (the tensors of the embedding,
 * of one block times L and of the final unit, from a one-block copy of the model), and the
 * largest tensor a rank holds. */
static double persistent_elems(const ZpModel *model, const ZpPlan *plan, double *largest)
{
    ZpModel one;
    memcpy(&one, model, sizeof one); /* padding too: one_block_tensors compares the bytes */
    one.layers = 1;
    const GArray *tensors = one_block_tensors(&one);
    double total = 0;
    *largest = 0;
    for (guint i = 0; i < tensors->len; i++) {
        const ZpTensor *t = &g_array_index(tensors, ZpTensor, i);
        const double elems = (double)zp_model_tensor_tp_elems(model, t, plan->mp);
        *largest = fmax(*largest, elems);
        if (elems <= plan->zero.stage3_param_persistence_threshold)
            total += elems * (t->unit == 1 ? (double)model->layers : 1.0);
    }
    return total;
}

static void ds_residual(const ZpModel *model, const ZpPlan *plan, ZpResidual *r)
{
    /* Start from the unit-level terms, then put DeepSpeed's own where they differ. */
    zp_impl_paper_residual(model, plan, r);
    const ZpZeroConfig *z = &plan->zero;
    const double reduce = zp_plan_reduce_bytes(plan);
    const double psi = (double)zp_model_param_count(model) / plan->mp;
    double elems;
    const int held = ds_bucket_buffers(plan, &elems);
    double largest = 0, kept = 0;
    if (zp_model_has_architecture(model))
        kept = persistent_elems(model, plan, &largest);
    if (held > 0)
        r->reduce_bucket_bytes = held * elems * reduce * (z->stage == 3 ? 2.0 : 1.0);
    else if (largest > 0) /* a bucket flattened on its own: whole tensors, a larger one alone */
        r->reduce_bucket_bytes = fmin(fmax(z->reduce_bucket_size, largest), psi) * reduce;
    r->allgather_bucket_bytes = 0; /* runtime/utils.py all_gather_dp_groups: in place */
    const double part = z->stage == 0 ? 0 : psi / plan->dp;
    const double elem = zp_plan_elem_bytes(plan->precision);
    const gboolean mixed = plan->precision != ZP_PREC_FP32;
    if (z->stage == 3 && zp_model_has_architecture(model))
        r->stage3_persistent_bytes =
            kept * zp_plan_state_bytes(plan->precision, plan->optimizer).param_bytes;
    /* Stages 1-2 under optimizer offload step on the host (stage_1_and_2.py: cpu_offload's
     * fp32 partitions are the host's): no GPU step buffers, as ds_step_buffers emits none
     * there (zp_build_optimizer: the CPU steps all of the partition). */
    if ((z->stage == 1 || z->stage == 2) && z->offload_optimizer.device == ZP_OFFLOAD_NONE)
        r->step_buffer_bytes = part * (elem + (mixed ? 4.0 : 0.0));
    else if (z->stage == 3)
        r->step_buffer_bytes = ds_stage3_step_grad_bytes(plan, part); /* as ds_step_buffers */
}

/* Each block's weights above the persistence threshold once (stage3_max_reuse_distance may
 * keep everything else gathered): qkv, proj, fc1, fc2. */
static double ds_gather_bound(const ZpModel *model, const ZpPlan *plan)
{
    const double h = (double)model->hidden, f = (double)model->ffn_hidden, mp = plan->mp;
    const double weights[] = {h * (double)zp_model_qkv_width(model), h * h,
                              h * (double)zp_model_fc1_width(model), f * h};
    double block = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(weights); i++)
        if (ceil(weights[i] / mp) > plan->zero.stage3_param_persistence_threshold)
            block += floor(weights[i] / mp);
    return (double)model->layers * block;
}

const ZpImpl zp_impl_deepspeed = {
    .kind = ZP_IMPL_DEEPSPEED,
    .name = "deepspeed",
    .has_stage = ds_has_stage,
    .stages = "stages 0, 1, 2 and 3",
    .zero_r = TRUE,
    .grad_collective = ds_grad_collective,
    .experts_in_buckets = ds_experts_in_buckets,
    .bucket_experts = ds_bucket_experts,
    .plan_buckets = ds_plan_buckets,
    .bucket_buffers = ds_bucket_buffers,
    .held_span = ds_held_span,
    .epilogue_syncs_device = ds_epilogue_syncs_device,
    .concat_copy = ds_concat_copy,
    .post_step_gather_buffer = FALSE,
    /* stage3.py create_reduce_and_remove_grad_hooks and stage_1_and_2.py's hook on the
     * parameter's AccumulateGrad: autograd sums the head's and the embedding's contributions
     * to wte in the node's input buffer and runs AccumulateGrad once, after the embedding's
     * backward; the hook then copies param.grad into the ipg buffer and drops it
     * (__add_grad_to_ipg_bucket, reduce_independent_p_g_buckets_and_remove_grads). */
    .tied_grad_waits = TRUE,
    /* ds_launch_points' rule. The waiting gradients: autograd's param.grad, kept until the
     * hook's copy into the ipg buffer, which with one buffer (stage 3, or stages 1-2 without
     * overlap_comm) or both in use runs after the reduction that empties it (stage3.py
     * __add_grad_to_ipg_bucket copies on the reduce stream after
     * __reduce_and_partition_ipg_grads; stage_1_and_2.py swaps ipg buffers only with
     * overlap_comm). */
    .grads_by_module = ds_grads_by_module,
    /* The hooks issue a reduction and drop what it reads at once, before the next module's
     * backward allocates: stage3.py __add_grad_to_ipg_bucket (param.grad.data = the bucket's
     * view), partition_grads (param.grad = None, a bypassing parameter's own gradient),
     * reduce_scatter_coalesced's concatenation dropped on return; stage_1_and_2.py
     * reduce_ipg_grads likewise. torch counts them freed then (memory_allocated); their blocks
     * wait for the reduction's stream (record_stream) only before they are handed out again,
     * and the caching allocator, short of memory, waits for such events rather than fail
     * (CUDACachingAllocator.cpp release_cached_blocks -> synchronize_and_free_events): the
     * reduction's time may stall the next allocation, never add to the memory a step needs. */
    .frees_at_issue = TRUE,
    .plan_fetches = ds_plan_fetches,
    .persistent = ds_persistent,
    /* stage3.py step -> _partition_all_parameters -> partitioned_param_coordinator.py
     * release_and_reset_all partitions every parameter, the persistent ones too (free_param:
     * their full data freed); _post_step -> persistent_parameters[0].all_gather ->
     * partition_parameters.py _all_gather (async_op False) -> _allgather_params_coalesced
     * (or _allgather_params_sequential) allocates one buffer of ds_numel padded to the group
     * per parameter, all_gather_into_tensor into it, and param.data is a view of it: nothing
     * else is allocated, and use_all_reduce_for_fetch_params and qwZ do not apply there. */
    .persistent_freed_for_step = TRUE,
    .unit_persistence = FALSE, /* per parameter */
    .grad_state_elems = ds_grad_state_elems,
    .grads_taken_by_reduction = ds_grads_taken_by_reduction,
    .full_grads_transient = ds_full_grads_transient,
    .grad_copy_elems = ds_grad_copy_elems,
    .step_buffers = ds_step_buffers,
    .residual_buffers = ds_residual,
    .gather_bound_elems = ds_gather_bound,
    .experts_after_backward = ds_experts_after_backward,
    /* stage3.py _setup_for_real_optimizer: grad_partitions_flat_buffer of every parameter's
     * partition on the host (self.device is cpu under offload_optimizer) in
     * gradient_accumulation_dtype, the model's dtype unless data_types.grad_accum_dtype says
     * otherwise (engine.py get_data_types); initialize_optimizer_states: the fp32
     * fp32_partitioned_groups_flat[i].grad beside it. */
    .host_grad_accum = TRUE,
    /* parameter_offload.py _pre_forward_module_hook / _pre_backward_module_hook call
     * partitioned_param_coordinator.py fetch_sub_module for each module right before its own
     * compute, and the post hooks release_sub_module right after it. */
    .module_compute = TRUE,
    /* partitioned_param_coordinator.py _fetch_sub_module_impl gates the host on the allgather
     * stream only, stage3.py __reduce_and_partition_ipg_grads on the reductions (zp_runahead.h) */
    .host_runahead = TRUE,
    /* stage3.py __avg_scatter_grads takes comm/coalesced_collectives.py
     * all_to_all_quant_reduce when all2all_process_group is set (engine.py: qgZ) and
     * num_nodes = world // device_count() > 1, else reduce_scatter_coalesced of the whole
     * bucket; all_to_all_quant_reduce loops over the bucket's tensors, each 2-D one with
     * numel % (2 world) == 0 through swizzle_quant and its two all-to-all stages, each other
     * one through reduce_scatter_coalesced([tensor]). */
    .qgz_by_tensor = TRUE,
    .zero_knobs = ZP_ZERO_KNOBS_ALL,
};
