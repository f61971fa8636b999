/* zp_search: enumeration from tables, an O(1) screen (zp_search_screen.c), and branch and
 * bound over the caller's simulator for the ranking. */
#include "zp_search.h"
#include "zp_offload.h"
#include "zp_dsconfig.h"
#include "zp_impl.h"
#include "zp_sched.h"
#include "zp_util.h"
#include "zp_zeropp.h"
#include "zp_zeror.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Without a global batch, micro-batches 1, 2, 4, ... up to this; memory stops them sooner. */
#define FREE_MICRO_MAX 1024

/* Bucket sizes tried, in elements: DeepSpeed's defaults, half and twice them, and the Hugging
 * Face Trainer's "auto" values (which leave allgather_bucket_size at DeepSpeed's default). */
typedef struct {
    const char *name;
    gboolean hf_auto;
    double reduce, allgather, prefetch, persistence;
} Buckets;

static const Buckets bucket_choices[] = {
    {"ds-default", FALSE, 5e8, 5e8, 5e7, 1e5},
    {"hf-auto", TRUE, 0, 5e8, 0, 0},
    {"ds-half", FALSE, 2.5e8, 2.5e8, 2.5e7, 1e5},
    {"ds-double", FALSE, 1e9, 1e9, 1e8, 1e5},
};

static const char *const fate_names[ZP_FATE_N] = {"out of memory", "cannot win",
                                                  "out of memory (simulated)", "simulated"};

char *zp_search_options_text(const ZpPlan *plan)
{
    GString *s = g_string_new(NULL);
    const struct {
        gboolean on;
        const char *name;
    } options[] = {
        {plan->ckpt.partition_activations && !plan->ckpt.cpu_checkpointing, "Pa"},
        {plan->ckpt.partition_activations && plan->ckpt.cpu_checkpointing, "Pa+cpu"},
        {!plan->ckpt.partition_activations && plan->ckpt.cpu_checkpointing, "cpu ckpt"},
        {plan->ckpt.contiguous_memory_optimization, "MD"},
        {plan->zero.zero_quantized_weights, "qwZ"},
        {plan->zero.zero_quantized_gradients, "qgZ"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(options); i++)
        if (options[i].on)
            g_string_append_printf(s, "%s%s", s->len ? ", " : "", options[i].name);
    if (plan->zero.zero_hpz_partition_size > 1)
        g_string_append_printf(s, "%shpZ %d", s->len ? ", " : "",
                               plan->zero.zero_hpz_partition_size);
    return g_string_free(s, FALSE);
}

const char *zp_search_buckets_name(int buckets)
{
    return bucket_choices[buckets].name;
}

const char *zp_search_fate_name(ZpFate fate)
{
    return fate_names[fate];
}

void zp_search_plan_base(const ZpSearchSpec *spec, int stage, int dp, int mp, ZpPlan *plan)
{
    zp_plan_defaults(plan, stage, dp, mp);
    plan->precision = spec->precision;
    plan->optimizer = spec->optimizer;
    plan->attention = spec->attention;
    plan->attention_unrated = zp_hw_attention_unrated(spec->hw, spec->attention);
    plan->reduce_dtype = spec->reduce_dtype;
    plan->impl = spec->impl;
    g_strlcpy(plan->kernels, spec->kernels, sizeof plan->kernels);
}

void zp_search_spec_defaults(ZpSearchSpec *spec, const ZpModel *model, const ZpHw *hw, int gpus)
{
    *spec = (ZpSearchSpec){.model = model, .hw = hw, .gpus = gpus, .stage = -1,
                           .precision = ZP_PREC_FP16, .optimizer = ZP_OPT_ADAM, .top_k = 5};
}

double zp_search_samples(const ZpPlan *plan)
{
    return (double)plan->micro_batch * plan->grad_accum * plan->dp;
}

double zp_search_model_flops(const ZpModel *model, const ZpPlan *plan)
{
    static const ZpComputeKind model_work[] = {ZP_COMP_EMBED_FWD, ZP_COMP_BLOCK_FWD,
                                               ZP_COMP_HEAD, ZP_COMP_BLOCK_BWD,
                                               ZP_COMP_EMBED_BWD};
    ZpComputeOps ops[ZP_COMP_N];
    zp_sched_compute_ops(model, plan, ops);
    double flops = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(model_work); i++)
        flops += (double)ops[model_work[i]].count * ops[model_work[i]].flops;
    return flops / zp_plan_pp(plan); /* a pipeline's stages share a replica's work */
}

/* ---- enumeration ----------------------------------------------------------------------- */

/* Two bucket choices are the same plan when they differ only in sizes the stage never uses:
 * stage 0 all-reduces gradient buckets only; stages 1-2 add the parameter all-gather; stage 3
 * reduce-scatters and prefetches, and keeps small units whole. */
static gboolean same_for_stage(const ZpZeroConfig *a, const ZpZeroConfig *b, int stage)
{
    if (a->reduce_bucket_size != b->reduce_bucket_size)
        return FALSE;
    if (stage == 1 || stage == 2)
        return a->allgather_bucket_size == b->allgather_bucket_size;
    if (stage == 3)
        return a->stage3_prefetch_bucket_size == b->stage3_prefetch_bucket_size &&
               a->stage3_param_persistence_threshold == b->stage3_param_persistence_threshold;
    return TRUE;
}

static void apply_buckets(const ZpModel *model, int choice, ZpZeroConfig *zero)
{
    const Buckets *c = &bucket_choices[choice];
    zero->allgather_bucket_size = c->allgather;
    if (c->hf_auto) {
        zp_dsconfig_hf_auto(model, zero);
        return;
    }
    zero->reduce_bucket_size = c->reduce;
    zero->stage3_prefetch_bucket_size = c->prefetch;
    zero->stage3_param_persistence_threshold = c->persistence;
}

/* ZeRO-R's checkpoint options, in order of the time they add: none; MD, which adds none (it
 * only moves the checkpoints into one region); Pa, an all-gather before each recompute; Pa
 * with MD; Pa+cpu, host copies besides (cpu_checkpointing alone with M = 1, where Pa splits
 * nothing). zp_search_run tries each only when the one before it does not fit, so the first
 * that fits is the fastest of them. */
typedef struct {
    gboolean pa, md, cpu;
} CkptLevel;

static const CkptLevel ckpt_levels[] = {
    {FALSE, FALSE, FALSE}, {FALSE, TRUE, FALSE}, {TRUE, FALSE, FALSE},
    {TRUE, TRUE, FALSE},   {TRUE, FALSE, TRUE},
};

/* Whether a level is a plan of its own here: Pa needs tensor parallelism (with M = 1 only
 * Pa+cpu's host copy remains), a pipeline's screen counts no host tier (no cpu), and
 * DeepSpeed must accept it (zp_zeror_check). */
static gboolean ckpt_level_applies(const ZpSearchSpec *spec, const ZpPlan *plan,
                                   const CkptLevel *l)
{
    const unsigned x = spec->exclude;
    if ((l->cpu && (x & ZP_TECH_PA_CPU)) || (l->pa && !l->cpu && (x & ZP_TECH_PA)) ||
        (l->md && (x & ZP_TECH_MD)))
        return FALSE;
    return (plan->mp > 1 || !l->pa || l->cpu) && (zp_plan_pp(plan) == 1 || !l->cpu) &&
           zp_zeror_check(spec->model, plan, NULL);
}

/* ZeRO++ at stage 3 (not FSDP's): qwZ, hpZ over a node's data-parallel ranks, qgZ, each on
 * or off, with overlap_comm. hpZ is tried only when the data-parallel group spans nodes
 * (within one node the secondary partition is the primary); zp_zeropp_check must accept the
 * rest. DeepSpeed's ZeRO++ leaves the bucket sizes their meaning: qgZ quantises a reduce
 * bucket's gradients tensor by tensor, each with its own groups (stage3.py
 * __avg_scatter_grads, coalesced_collectives.py all_to_all_quant_reduce),
 * qwZ and hpZ quantise or redirect the gathers the prefetch bucket issues
 * (partition_parameters.py all_gather_coalesced), so the bytes do not change with them, only
 * the buckets' memory and the overlap (smaller reduce buckets launch a little earlier, as
 * DeepSpeed's hooks reduce them), by well under 1% of the step where ZeRO++ pays. So
 * ZeRO++ is tried at DeepSpeed's buckets and at the choices that are smaller in every size
 * (half of them), these only when the same plan at DeepSpeed's does not fit (their parent):
 * smaller buckets and prefetch can make it fit. */
#define ZEROPP_COMBOS 8
static gboolean zeropp_buckets(int buckets)
{
    const Buckets *c = &bucket_choices[buckets], *ds = &bucket_choices[0];
    return buckets == 0 || (!c->hf_auto && c->reduce <= ds->reduce &&
                            c->allgather <= ds->allgather && c->prefetch <= ds->prefetch);
}

static gboolean zeropp_apply(const ZpSearchSpec *spec, int combo, int buckets, ZpPlan *plan)
{
    const int node_dp = zp_zeropp_group_ranks(plan, ZP_GROUP_NODE);
    if (combo != 0 && (plan->zero.stage != 3 || !zp_impl_get(spec->impl)->zero_r ||
                       !zeropp_buckets(buckets) || !plan->zero.overlap_comm))
        return FALSE;
    if ((combo & 2) && (node_dp <= 1 || node_dp >= plan->dp))
        return FALSE;
    if (((combo & 1) && (spec->exclude & ZP_TECH_QWZ)) ||
        ((combo & 2) && (spec->exclude & ZP_TECH_HPZ)) ||
        ((combo & 4) && (spec->exclude & ZP_TECH_QGZ)))
        return FALSE;
    plan->zero.zero_quantized_weights = (combo & 1) != 0;
    plan->zero.zero_hpz_partition_size = combo & 2 ? node_dp : 1;
    plan->zero.zero_quantized_gradients = (combo & 4) != 0;
    return zp_zeropp_check(plan, NULL);
}

char *zp_search_whole_node_note(const ZpSearchSpec *spec)
{
    /* zeropp_apply's hpZ spans a node's data-parallel ranks and qgZ's all-to-all every node
     * alike: zp_zeropp_check refuses both unless the GPUs are whole nodes (past one node). */
    const int per_node = spec->hw->gpus_per_node;
    if (spec->impl == ZP_IMPL_FSDP || (spec->stage >= 0 && spec->stage != 3) || per_node <= 0 ||
        spec->gpus <= per_node || spec->gpus % per_node == 0)
        return NULL;
    return g_strdup_printf("Note: ZeRO++ hpZ and qgZ left out: they need whole nodes, and %d GPUs "
                           "are not a whole number of %d-GPU nodes (qwZ was searched)",
                           spec->gpus, per_node);
}

#define CKPT_LEVELS ((int)G_N_ELEMENTS(ckpt_levels))

/* One plan with every ZeRO++ choice that applies, each with its chain of ZeRO-R levels (with
 * checkpointing), a level's parent the one before it; but a ZeRO++ plan at other buckets than
 * DeepSpeed's has the same plan at DeepSpeed's for parent. at_default[combo * CKPT_LEVELS +
 * level]: those plans' indices, which buckets 0 records (-1: none). */
static void add_variants(const ZpSearchSpec *spec, const ZpPlan *base, int buckets,
                         int *at_default, GArray *out)
{
    for (int combo = 0; combo < ZEROPP_COMBOS; combo++) {
        ZpPlan plan = *base;
        if (!zeropp_apply(spec, combo, buckets, &plan))
            continue;
        int parent = -1;
        /* FSDP and Megatron have none of DeepSpeed's activation_checkpointing options. */
        const size_t levels =
            plan.checkpoint && zp_impl_get(spec->impl)->zero_r ? G_N_ELEMENTS(ckpt_levels) : 1;
        for (size_t k = 0; k < levels; k++) {
            const CkptLevel *l = &ckpt_levels[k];
            plan.ckpt.partition_activations = l->pa && plan.mp > 1;
            plan.ckpt.contiguous_memory_optimization = l->md;
            plan.ckpt.cpu_checkpointing = l->cpu;
            if (!ckpt_level_applies(spec, &plan, l))
                continue;
            int *same = &at_default[combo * CKPT_LEVELS + (int)k];
            ZpCandidate c = {.plan = plan, .buckets = buckets,
                             .parent = combo != 0 && buckets != 0 ? *same : parent};
            parent = (int)out->len;
            if (buckets == 0)
                *same = parent;
            g_array_append_val(out, c);
        }
    }
}

/* Every plan of one (mp, pipeline, micro-batch, accumulation). */
static void add_plans(const ZpSearchSpec *spec, int mp, ZpPipeConfig pipe, int micro, int accum,
                      GArray *out)
{
    const int P = pipe.stages > 1 ? pipe.stages : 1;
    int lo = spec->stage >= 0 ? spec->stage : 0;
    const int hi = MIN(spec->stage >= 0 ? spec->stage : 3, P > 1 ? 1 : 3); /* DeepSpeed's */
    if (spec->offload_optimizer != ZP_OFFLOAD_NONE)
        lo = MAX(lo, 1);
    if (spec->offload_param != ZP_OFFLOAD_NONE)
        lo = MAX(lo, 3);
    /* Offload is searched on data parallelism alone: the pipeline screen's per-stage memory
     * does not count host tiers, and nothing fitting without them is what tries offload. */
    if (P > 1 && (spec->offload_optimizer != ZP_OFFLOAD_NONE ||
                  spec->offload_param != ZP_OFFLOAD_NONE))
        return;
    int at_default[ZEROPP_COMBOS * CKPT_LEVELS];
    for (int stage = lo; stage <= hi; stage++)
        for (int recompute = ZP_RECOMPUTE_NONE;
             recompute <= ZP_RECOMPUTE_FULL && zp_impl_get(spec->impl)->has_stage(stage);
             recompute++)
            for (int choice = 0; choice < (int)G_N_ELEMENTS(bucket_choices); choice++) {
                /* selective recomputation where the implementation has it (Megatron's) */
                if (recompute == ZP_RECOMPUTE_SELECTIVE &&
                    !zp_impl_get(spec->impl)->selective_recompute)
                    break;
                if (recompute == ZP_RECOMPUTE_FULL && (spec->exclude & ZP_TECH_CHECKPOINT))
                    break;
                if (choice == 0)
                    memset(at_default, 0xff, sizeof at_default);
                ZpPlan plan;
                zp_search_plan_base(spec, stage, spec->gpus / (mp * P), mp, &plan);
                plan.pipe = pipe;
                plan.micro_batch = micro;
                plan.grad_accum = accum;
                zp_plan_set_recompute(&plan, (ZpRecompute)recompute);
                plan.zero.offload_optimizer.device = spec->offload_optimizer;
                plan.zero.offload_param.device = spec->offload_param;
                plan.gpus_per_node = spec->hw->gpus_per_node; /* ZeRO++'s node groups */
                zp_impl_plan_defaults(&plan);
                if (zp_impl_ds_bf16_optimizer(&plan)) /* not modeled: the schedule refuses */
                    break;
                apply_buckets(spec->model, choice, &plan.zero);
                if (choice == 0) /* the implementation's own defaults, DeepSpeed's for it */
                    zp_impl_plan_defaults(&plan);
                /* A pipeline reduces after its flush: buckets and overlap_comm change
                 * nothing that matters, so only DeepSpeed's defaults. */
                gboolean seen = P > 1 && choice > 0;
                for (int earlier = 0; earlier < choice && !seen; earlier++) {
                    ZpZeroConfig other = plan.zero;
                    apply_buckets(spec->model, earlier, &other);
                    seen = same_for_stage(&plan.zero, &other, stage);
                }
                for (int overlap = 0; overlap <= (P > 1 ? 0 : 1) && !seen; overlap++) {
                    plan.zero.overlap_comm = overlap;
                    add_variants(spec, &plan, choice, at_default, out);
                }
            }
}

static gboolean check_spec(const ZpSearchSpec *spec, GError **error)
{
    const ZpModel *m = spec->model;
    const char *bad = NULL;
    char *owned = NULL;
    GError *kernel_error = NULL; /* the attention kernel's refusal, a plan that cannot launch */
    if (!zp_model_has_architecture(m))
        bad = "--model: planning simulates steps, which needs an architecture (not --params)";
    else if (zp_moe_enabled(&m->moe) || zp_mla_enabled(&m->mla))
        bad = "--model: a mixture of experts or latent attention is searched by its own search "
              "(zp_moe_search: `zplan plan`, `zplan sweep --metric tflops`), not the dense one";
    else if (spec->gpus < 1)
        bad = "--gpus: must be at least 1";
    else if (spec->top_k < 1)
        bad = "--top: must be at least 1";
    else if (spec->global_batch < 0)
        bad = "--global-batch: must be positive";
    else if (spec->stage < -1 || spec->stage > 3)
        bad = "--stage: must be 0, 1, 2 or 3";
    else if (spec->micro_batch < 0)
        bad = "--micro-batch: must be positive";
    else if (zp_hw_peak_flops(spec->hw, spec->precision) <= 0)
        bad = owned = g_strdup_printf("--precision: %s (%s) has no %s peak in its profile",
                                      spec->hw->name, spec->hw->gpu,
                                      zp_precision_name(spec->precision));
    else if (!zp_hw_attention_runs(spec->hw, spec->attention, spec->precision, "--attention",
                                   &kernel_error))
        bad = owned = g_strdup(kernel_error->message);
    else if (spec->mp > 0 && (m->heads % spec->mp || spec->gpus % spec->mp ||
                              (spec->hw->gpus_per_node % spec->mp &&
                               (!spec->three_d || spec->mp % spec->hw->gpus_per_node))))
        bad = owned = g_strdup_printf(
            "--mp: %d must divide the %" G_GINT64_FORMAT " attention heads of %s, the %d GPUs "
            "and the %d GPUs of a %s node (tensor parallelism stays inside a node; --3d lets "
            "it span whole nodes)",
            spec->mp, m->heads, m->name, spec->gpus, spec->hw->gpus_per_node, spec->hw->name);
    if (bad)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
    g_free(owned);
    g_clear_error(&kernel_error);
    return bad == NULL;
}

/* The micro-batches to try at one data-parallel degree: with a global batch the divisors of
 * its per-rank share, without one powers of two; --micro-batch keeps only itself. */
static GArray *micro_batches(const ZpSearchSpec *spec, int64_t dp)
{
    GArray *out = g_array_new(FALSE, FALSE, sizeof(int));
    const int64_t B = spec->global_batch;
    if (B == 0 && spec->micro_batch > 0) {
        g_array_append_val(out, spec->micro_batch);
        return out;
    }
    if (B > 0 && B % dp != 0)
        return out;
    for (int64_t micro = 1; micro <= (B > 0 ? B / dp : FREE_MICRO_MAX);
         micro = B > 0 ? micro + 1 : micro * 2) {
        const int m = (int)micro;
        if ((B == 0 || (B / dp) % micro == 0) && (spec->micro_batch == 0 || m == spec->micro_batch))
            g_array_append_val(out, m);
    }
    return out;
}

/* The pipelines tried at one TP degree: none, and (3D with a global batch) every P that
 * leaves whole data-parallel ranks, each 1F1B and interleaved with 2 and 4 chunks a stage. */
static GArray *pipelines(const ZpSearchSpec *spec, int mp)
{
    GArray *out = g_array_new(FALSE, FALSE, sizeof(ZpPipeConfig));
    const ZpPipeConfig none = {0}; /* the plan's zero value: no pipeline */
    g_array_append_val(out, none);
    const int64_t L = spec->model->layers;
    for (int P = 2; spec->three_d && spec->global_batch > 0 && P <= L; P++) {
        if (spec->gpus % ((int64_t)mp * P) != 0)
            continue;
        for (int v = 1; v <= 4 && (int64_t)P * v <= L; v *= 2) {
            const ZpPipeConfig c = {P, v, v > 1 ? ZP_PIPE_INTERLEAVED : ZP_PIPE_1F1B,
                                    ZP_PARTITION_UNIFORM};
            g_array_append_val(out, c);
        }
    }
    return out;
}

/* Whether a tensor-parallel degree can be placed: inside a node, or (3D) over whole nodes. */
static gboolean placeable_mp(const ZpSearchSpec *spec, int mp)
{
    const int gpn = spec->hw->gpus_per_node;
    return gpn % mp == 0 || (spec->three_d && mp % gpn == 0);
}

GArray *zp_search_enumerate(const ZpSearchSpec *spec, GError **error)
{
    if (!check_spec(spec, error))
        return NULL;
    GArray *out = g_array_new(FALSE, FALSE, sizeof(ZpCandidate));
    GString *degrees = g_string_new(NULL);
    const int64_t B = spec->global_batch;
    guint too_long = 0; /* (mp, micro-batch) pairs whose schedule would exceed the cap */
    const int mp_max = spec->three_d ? (int)MIN(spec->model->heads, spec->gpus)
                                     : spec->hw->gpus_per_node;
    for (int mp = 1; mp <= mp_max; mp++) {
        if ((spec->mp > 0 && mp != spec->mp) || !placeable_mp(spec, mp) ||
            spec->model->heads % mp || spec->gpus % mp)
            continue;
        GArray *pipes = pipelines(spec, mp);
        for (guint k = 0; k < pipes->len; k++) {
            const ZpPipeConfig pipe = g_array_index(pipes, ZpPipeConfig, k);
            const int P = pipe.stages > 1 ? pipe.stages : 1;
            const int64_t dp = spec->gpus / ((int64_t)mp * P);
            if (k == 0)
                g_string_append_printf(degrees, "%s%" G_GINT64_FORMAT, degrees->len ? ", " : "",
                                       dp);
            GArray *micros = micro_batches(spec, dp);
            for (guint i = 0; i < micros->len; i++) {
                const int micro = g_array_index(micros, int, i);
                const int accum = B > 0 ? (int)(B / dp / micro) : 1;
                if (P > 1 && (accum < P ||
                              (pipe.virtual_stages > 1 && accum % P != 0)))
                    continue; /* a pipeline needs micro-batches to fill it (Megatron's check) */
                /* A plan is ranked by simulating its schedule, which lists every micro-step. */
                if ((double)accum * (double)(spec->model->layers + 2) > ZP_SCHED_MAX_UNIT_STEPS)
                    too_long++;
                else
                    add_plans(spec, mp, pipe, micro, accum, out);
            }
            g_array_unref(micros);
        }
        g_array_unref(pipes);
    }
    if (out->len == 0) {
        if (too_long > 0)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "--global-batch: %" G_GINT64_FORMAT " needs so much accumulation that "
                        "every plan's schedule exceeds %.0e micro-steps x units (data-parallel "
                        "degrees %s); use more GPUs or a smaller batch", B,
                        ZP_SCHED_MAX_UNIT_STEPS, degrees->str);
        else if (spec->micro_batch > 0 && B > 0)
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "--micro-batch: %d x the data-parallel degree (%s) divides no "
                        "--global-batch %" G_GINT64_FORMAT, spec->micro_batch, degrees->str, B);
        else
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "--global-batch: %" G_GINT64_FORMAT " is not a multiple of any "
                        "data-parallel degree gpus/mp (%s)", B, degrees->str);
        g_array_unref(out);
        out = NULL;
    }
    g_string_free(degrees, TRUE);
    return out;
}

/* ---- the screen ------------------------------------------------------------------------ */

gboolean zp_search_screen_init(ZpScreen *screen, const ZpSearchSpec *spec, GError **error)
{
    if (!check_spec(spec, error))
        return FALSE;
    *screen = (ZpScreen){.model = spec->model, .hw = spec->hw,
                         .params = (double)zp_model_param_count(spec->model),
                         .block_elems_min = INFINITY,
                         .bus_bytes_per_s = spec->bus_bytes_per_s, .coll_s = spec->coll_s};
    for (int64_t u = 1; u <= spec->model->layers; u++)
        screen->block_elems_min =
            fmin(screen->block_elems_min, (double)zp_model_unit_elems(spec->model, (int)u));
    return TRUE;
}

/* ---- ranking --------------------------------------------------------------------------- */

static double per_sample(const ZpCandidate *c, double step_s)
{
    return step_s / zp_search_samples(&c->plan);
}

static gint by_bound(gconstpointer a, gconstpointer b, gpointer data)
{
    const GArray *candidates = data;
    const ZpCandidate *x = &g_array_index(candidates, ZpCandidate, *(const guint *)a);
    const ZpCandidate *y = &g_array_index(candidates, ZpCandidate, *(const guint *)b);
    const double bx = per_sample(x, x->bound_step_s), by = per_sample(y, y->bound_step_s);
    if (bx != by)
        return bx < by ? -1 : 1;
    return *(const guint *)a < *(const guint *)b ? -1 : 1;
}

/* Bytes a plan needs: its simulated (reserved) peak when simulated, else the closed form. */
static double needed_bytes(const ZpCandidate *c)
{
    return c->fate == ZP_FATE_SIMULATED_OOM ? c->peak_memory_bytes : c->memory_bytes;
}

/* Remembers the plan over memory by the least, in its group and overall. */
static void note_shortfall(ZpSearchResult *r, int index)
{
    const ZpCandidate *c = zp_search_candidate(r, index);
    int *slots[2] = {&r->closest, &r->stage_closest[c->plan.zero.stage][c->plan.checkpoint]};
    for (int i = 0; i < (zp_plan_pp(&c->plan) > 1 ? 1 : 2); i++) /* pipelines: overall only */
        if (*slots[i] < 0 || needed_bytes(c) < needed_bytes(zp_search_candidate(r, *slots[i])))
            *slots[i] = index;
}

/* How far a plan strays from DeepSpeed's defaults: other bucket sizes, overlap_comm flipped,
 * each ZeRO-R and ZeRO++ option on. */
static int deviation(const ZpCandidate *c)
{
    const ZpPlan *p = &c->plan;
    return (c->buckets != 0) + (p->zero.overlap_comm != (p->zero.stage == 3)) +
           p->ckpt.partition_activations + p->ckpt.cpu_checkpointing +
           p->ckpt.contiguous_memory_optimization + p->zero.zero_quantized_weights +
           (p->zero.zero_hpz_partition_size > 1) + p->zero.zero_quantized_gradients;
}

/* Plans of one shape (stage, degrees, batch, checkpointing) that the simulator times and sizes
 * alike, to 0.01%, differ only in knobs that did not matter. */
#define TWIN_TOLERANCE 1e-4
static gboolean twins(const ZpCandidate *a, const ZpCandidate *b)
{
    const ZpPlan *p = &a->plan, *q = &b->plan;
    return p->zero.stage == q->zero.stage && p->mp == q->mp && p->micro_batch == q->micro_batch &&
           memcmp(&p->pipe, &q->pipe, sizeof p->pipe) == 0 &&
           p->grad_accum == q->grad_accum && p->checkpoint == q->checkpoint &&
           p->selective_recompute == q->selective_recompute &&
           fabs(a->step_time_s - b->step_time_s) <= TWIN_TOLERANCE * b->step_time_s &&
           fabs(a->peak_memory_bytes - b->peak_memory_bytes) <=
               TWIN_TOLERANCE * b->peak_memory_bytes;
}

/* Keeps r->ranked sorted by time per sample (equal times to TWIN_TOLERANCE: the plan with more
 * memory left first) and at most top_k long; of twins it keeps the one closest to DeepSpeed's
 * defaults, so the top K are K different choices. */
static void insert_ranked(ZpSearchResult *r, guint index, int top_k)
{
    const ZpCandidate *c = zp_search_candidate(r, (int)index);
    for (guint i = 0; i < r->ranked->len; i++) {
        const ZpCandidate *o = zp_search_ranked(r, i);
        if (!twins(c, o))
            continue;
        if (deviation(c) < deviation(o))
            g_array_index(r->ranked, guint, i) = index;
        return;
    }
    const double t = per_sample(c, c->step_time_s);
    guint at = r->ranked->len;
    while (at > 0) {
        const ZpCandidate *o = zp_search_ranked(r, at - 1);
        const double u = per_sample(o, o->step_time_s);
        const gboolean tie = fabs(u - t) <= TWIN_TOLERANCE * t;
        if (tie ? o->peak_memory_bytes <= c->peak_memory_bytes : u < t)
            break;
        at--;
    }
    if (at >= (guint)top_k)
        return;
    g_array_insert_val(r->ranked, at, index);
    if (r->ranked->len > (guint)top_k)
        g_array_set_size(r->ranked, (guint)top_k);
}

/* The slot of a plan's group's best: pipelined plans apart from the stages'. */
static int *group_best(ZpSearchResult *r, const ZpPlan *plan)
{
    return zp_plan_pp(plan) > 1 ? &r->pipe_best[plan->checkpoint]
                                : &r->stage_best[plan->zero.stage][plan->checkpoint];
}

static double group_best_per_sample(ZpSearchResult *r, const ZpPlan *plan)
{
    const int best = *group_best(r, plan);
    if (best < 0)
        return DBL_MAX;
    const ZpCandidate *b = zp_search_candidate(r, best);
    return per_sample(b, b->step_time_s);
}

/* Simulates a plan, stopping once its step passes stop_after_s (> 0): then the plan cannot
 * win, and its bound is where the simulation stopped. */
static gboolean simulate(const ZpSearchSpec *spec, ZpSearchResult *r, guint index,
                         double stop_after_s, GError **error)
{
    ZpCandidate *c = &g_array_index(r->candidates, ZpCandidate, index);
    double step_s = 0, peak_bytes = 0;
    if (!spec->rank(&c->plan, spec->rank_ctx, stop_after_s, &step_s, &peak_bytes, error))
        return FALSE;
    if (peak_bytes == ZP_RANK_STOPPED) {
        c->bound_step_s = fmax(c->bound_step_s, step_s);
        c->step_time_s = -1; /* stopped: cannot win, its need unknown */
        r->stopped++;
        return TRUE;
    }
    c->step_time_s = step_s;
    c->peak_memory_bytes = peak_bytes + spec->hw->runtime_reserve_bytes;
    if (c->peak_memory_bytes > spec->hw->gpu_memory_bytes) {
        c->fate = ZP_FATE_SIMULATED_OOM;
        note_shortfall(r, (int)index);
        return TRUE;
    }
    c->fate = ZP_FATE_SIMULATED;
    if (per_sample(c, step_s) < group_best_per_sample(r, &c->plan))
        *group_best(r, &c->plan) = (int)index;
    insert_ranked(r, index, spec->top_k);
    return TRUE;
}

/* Whether a ZeRO-R level's parent fits or could not win: either way the level, no faster,
 * cannot win (it stays ZP_FATE_CANNOT_WIN). The parent was decided first (by_bound). A ZeRO++
 * plan at smaller buckets than its parent's is there for the memory they save: it is left
 * out too when the parent's simulated need, less the bytes the closed form says they save,
 * still does not fit. */
static gboolean parent_fits(const ZpSearchResult *r, const ZpCandidate *c, double gpu_bytes)
{
    if (c->parent < 0)
        return FALSE;
    const ZpCandidate *parent = zp_search_candidate(r, c->parent);
    return parent->fate == ZP_FATE_SIMULATED || parent->fate == ZP_FATE_CANNOT_WIN ||
           (c->buckets != parent->buckets && parent->fate == ZP_FATE_SIMULATED_OOM &&
            parent->peak_memory_bytes - (parent->memory_bytes - c->memory_bytes) > gpu_bytes);
}

/* Whether a stage-3 plan about to be simulated is known, by its bound with the gathers the
 * schedule plans (zp_search_screen_gathers_bound_s: O(tensors), not O(1) as the screen must
 * be, so only here), to step past stop_s (> 0): then its simulation would have stopped, and it
 * is left as one stopped (step_time_s -1, its bound raised), which changes nothing the search
 * decides. A plan that re-gathers its blocks (the recompute's, every micro-step's) is one:
 * the screen's bound counts each block's weights once a micro-step. Not with hpZ, whose
 * screen splits the gathers half and half between the node and the data-parallel group. */
static gboolean past_stop(const ZpScreen *sc, ZpSearchResult *r, guint index, double stop_s)
{
    ZpCandidate *c = &g_array_index(r->candidates, ZpCandidate, index);
    if (stop_s <= 0)
        return FALSE;
    const double bound_s = zp_search_screen_gathers_bound_s(sc, &c->plan);
    if (!(bound_s > stop_s))
        return FALSE;
    c->bound_step_s = fmax(c->bound_step_s, bound_s);
    c->step_time_s = -1; /* as a simulation stopped there */
    r->past_stop++;
    return TRUE;
}

gboolean zp_search_run(const ZpSearchSpec *spec, ZpSearchResult *result, GError **error)
{
    memset(result, 0, sizeof *result);
    memset(result->stage_best, 0xff, sizeof result->stage_best);
    memset(result->stage_closest, 0xff, sizeof result->stage_closest);
    memset(result->pipe_best, 0xff, sizeof result->pipe_best);
    result->closest = -1;
    ZpScreen screen;
    if (!zp_search_screen_init(&screen, spec, error) ||
        !(result->candidates = zp_search_enumerate(spec, error)))
        return FALSE;
    zp_search_screen_keep_costs(&screen);
    result->ranked = g_array_new(FALSE, FALSE, sizeof(guint));
    GArray *survivors = g_array_new(FALSE, FALSE, sizeof(guint));
    for (guint i = 0; i < result->candidates->len; i++) {
        ZpCandidate *c = &g_array_index(result->candidates, ZpCandidate, i);
        zp_search_screen(&screen, &c->plan, &c->memory_bytes, &c->bound_step_s);
        if (c->memory_bytes > spec->hw->gpu_memory_bytes) {
            c->fate = ZP_FATE_OUT_OF_MEMORY;
            note_shortfall(result, (int)i);
        } else {
            c->fate = ZP_FATE_CANNOT_WIN; /* until it is simulated */
            g_array_append_val(survivors, i);
        }
    }
    /* A ZeRO-R level is the same plan with more work (a gather, host copies) or none more:
     * its step is at least its parent's, so at least the parent's bound, which orders it
     * after the parent (equal bounds go by index). */
    for (guint i = 0; i < result->candidates->len; i++) {
        ZpCandidate *c = &g_array_index(result->candidates, ZpCandidate, i);
        if (c->parent >= 0)
            c->bound_step_s =
                fmax(c->bound_step_s, zp_search_candidate(result, c->parent)->bound_step_s);
    }
    g_array_sort_with_data(survivors, by_bound, result->candidates);
    gboolean ok = TRUE;
    for (guint s = 0; ok && s < survivors->len; s++) {
        const guint i = g_array_index(survivors, guint, s);
        const ZpCandidate *c = zp_search_candidate(result, (int)i);
        const double bound = per_sample(c, c->bound_step_s);
        const double kth =
            result->ranked->len < (guint)spec->top_k
                ? DBL_MAX
                : per_sample(zp_search_ranked(result, result->ranked->len - 1),
                             zp_search_ranked(result, result->ranked->len - 1)->step_time_s);
        const double beat =
            spec->exhaustive ? DBL_MAX : fmax(kth, group_best_per_sample(result, &c->plan));
        /* A ZeRO++ plan at other buckets is tried when its parent does not fit, which a
         * parent stopped short has not said: it runs to the end now (it cannot win). */
        if (bound < beat && c->parent >= 0 &&
            zp_search_candidate(result, c->parent)->step_time_s < 0 &&
            zp_search_candidate(result, c->parent)->buckets != c->buckets)
            ok = simulate(spec, result, (guint)c->parent, 0, error);
        /* A step longer than `beat`, a twin's tolerance over it, neither ranks nor replaces
         * a twin (insert_ranked) nor is its group's best. */
        const double stop_s =
            beat == DBL_MAX ? 0 : beat * (1 + 2 * TWIN_TOLERANCE) * zp_search_samples(&c->plan);
        if (ok && bound < beat && !parent_fits(result, c, spec->hw->gpu_memory_bytes) &&
            !past_stop(&screen, result, i, stop_s)) {
            if (spec->exhaustive) /* the bound past_stop uses, there to be checked */
                g_array_index(result->candidates, ZpCandidate, i).bound_step_s =
                    fmax(c->bound_step_s, zp_search_screen_gathers_bound_s(&screen, &c->plan));
            ok = simulate(spec, result, i, stop_s, error);
        }
        if (spec->progress)
            spec->progress((double)(s + 1) / survivors->len, spec->progress_ctx);
    }
    g_array_unref(survivors);
    zp_search_screen_clear(&screen);
    for (guint i = 0; i < result->candidates->len; i++)
        result->count[zp_search_candidate(result, (int)i)->fate]++;
    return ok;
}

void zp_search_result_clear(ZpSearchResult *result)
{
    if (result->candidates)
        g_array_unref(result->candidates);
    if (result->ranked)
        g_array_unref(result->ranked);
    result->candidates = result->ranked = NULL;
}
