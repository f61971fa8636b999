/* cli_plan: `zplan plan` searches ZeRO stage, batch, checkpointing, tensor parallelism and
 * bucket sizes for a model on N GPUs, ranks by simulation, and says why the rest lost. */
#include "cli.h"
#include "cli_moe.h"
#include "cli_progress.h"
#include "cli_report.h"
#include "sim_coll.h"
#include "sim_engine.h"
#include "zp_alloc_replay.h"
#include "zp_dsconfig.h"
#include "zp_impl.h"
#include "zp_inventory.h"
#include "zp_mem.h"
#include "zp_pipe.h"
#include "zp_offload.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <math.h>
#include <stdio.h>

#define GB 1e9

typedef struct {
    ZpModel model;
    ZpHw hw;
    int gpus, top_k, mp, seq;
    int64_t global_batch;
    ZpPrecision precision;
    ZpOptimizer optimizer;
    ZpPlan kernels; /* its attention and reduce_dtype: every plan's */
    ZpImplKind impl;
    gboolean json, three_d;
    char *ds_config;
    char *html;            /* --html OUT.html: the top plans side by side */
    double capacity_bytes; /* the GPU's memory; hw.gpu_memory_bytes is it less --headroom */
    ZpZeroConfig offload;  /* --offload-optimizer/--offload-param: searched with these only */
    gboolean offload_given;
    char *offload_note;    /* when offload was proposed: what it costs, printed after line 1 */
    char *whole_node_note; /* ZeRO++ left out of the search: it needs whole nodes */
    unsigned exclude;      /* ZpTechnique bits: --zeropp and --exclude */
    guint dominated;       /* ranked plans left out: another is as fast with no more memory */
    /* When plan 1 offloads: the GPU-only search's closest plan per stage (its shortfall
     * is why the stage lost), -1 where none; and the GPUs the states alone would need. */
    double gpu_only_short_bytes[4];
    /* When nothing fits even with offload: each offload level's closest plan's shortfall
     * per GPU (0: not tried). */
    double offload_short_bytes[3];
    CliBudget budget; /* --tokens or --steps, --gpu-hour-price: for plan 1 */
    CliRankContext runs; /* its kept runs: the search's, which the report prints */
} PlanArgs;

/* The offload levels plan tries in turn when nothing fits on the GPUs: optimizer to the host,
 * parameters too, then both to NVMe (ZeRO-Offload, then ZeRO-Infinity). */
static const ZpOffloadDevice offload_levels[][2] = {
    {ZP_OFFLOAD_NONE, ZP_OFFLOAD_NONE},
    {ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE},
    {ZP_OFFLOAD_CPU, ZP_OFFLOAD_CPU},
    {ZP_OFFLOAD_NVME, ZP_OFFLOAD_NVME},
};
static const char *const offload_level_names[] = {
    "", "optimizer to the host", "optimizer and parameters to the host",
    "optimizer and parameters to NVMe"};

/* --exclude's names (and --zeropp's sets), each a ZpTechnique. */
static const struct {
    const char *name;
    unsigned bits;
} techniques[] = {
    {"qwz", ZP_TECH_QWZ}, {"qgz", ZP_TECH_QGZ}, {"hpz", ZP_TECH_HPZ},
    {"pa", ZP_TECH_PA}, {"md", ZP_TECH_MD}, {"pa-cpu", ZP_TECH_PA_CPU},
    {"checkpoint", ZP_TECH_CHECKPOINT},
};

/* --zeropp none|lossless|lossy (default lossless: hpZ only) and --exclude A,B,... */
static gboolean parse_techniques(const char *zeropp, const char *exclude, unsigned *bits,
                                 GError **error)
{
    static const char *const zeropp_names[] = {"none", "lossless", "lossy", NULL};
    static const unsigned zeropp_bits[] = {CLI_LOSSY_ZEROPP | ZP_TECH_HPZ, CLI_LOSSY_ZEROPP, 0};
    int z = 1;
    if (zeropp && !zp_parse_choice(zeropp, "--zeropp", zeropp_names, &z, error))
        return FALSE;
    *bits = zeropp_bits[z];
    if (!zeropp) /* said, since they can be worth much (qwZ: 22% on gpt3-175b, 256 A100s) */
        cli_note("Lossy ZeRO++ (qwZ's int8 parameter gathers, qgZ's int4 gradients) is not "
                 "searched: it changes the training; --zeropp lossy tries it.");
    char **names = g_strsplit(exclude ? exclude : "", ",", -1);
    const char *known[G_N_ELEMENTS(techniques) + 1];
    for (size_t k = 0; k < G_N_ELEMENTS(techniques); k++)
        known[k] = techniques[k].name;
    known[G_N_ELEMENTS(techniques)] = NULL;
    gboolean ok = TRUE;
    for (char **n = names; ok && *n; n++) {
        char *name = g_ascii_strdown(g_strstrip(*n), -1);
        int k;
        ok = zp_parse_choice(name, "--exclude", known, &k, error);
        if (ok)
            *bits |= techniques[k].bits;
        g_free(name);
    }
    g_strfreev(names);
    return ok;
}

/* Drops from the ranked list every plan that an earlier (no slower) one beats on memory or
 * ties: nobody should pick it. The list is sorted by time per sample, so "earlier" is "at
 * least as fast". Plan 1 always stays. Returns how many were dropped. */
static guint drop_dominated(ZpSearchResult *r)
{
    guint dropped = 0;
    for (guint i = 1; i < r->ranked->len;) {
        const ZpCandidate *c = zp_search_ranked(r, i);
        gboolean beaten = FALSE;
        for (guint j = 0; j < i && !beaten; j++)
            beaten = zp_search_ranked(r, j)->peak_memory_bytes <= c->peak_memory_bytes;
        if (beaten) {
            g_array_remove_index(r->ranked, i);
            dropped++;
        } else {
            i++;
        }
    }
    return dropped;
}

double cli_plan_tflops(const ZpModel *model, const ZpCandidate *c)
{
    return zp_search_model_flops(model, &c->plan) / c->step_time_s / 1e12;
}

/* ---- descriptions ---------------------------------------------------------------------- */

/* "mp 8 x dp 32, micro 4 x accum 12, ckpt, overlap, hf-auto[, Pa, MD, qwZ, hpZ 8]" (the
 * stage is said beside it). */
static char *describe(const ZpCandidate *c)
{
    const ZpPlan *p = &c->plan;
    char *pipe = zp_plan_pp(p) > 1 ? g_strdup_printf(" x pp %d (%s%s)", zp_plan_pp(p),
                                                     zp_pipe_schedule_name(p->pipe.schedule),
                                                     zp_plan_vstages(p) == 2   ? " v2"
                                                     : zp_plan_vstages(p) == 4 ? " v4"
                                                                               : "")
                                   : g_strdup("");
    char *options = zp_search_options_text(p);
    char *text = g_strdup_printf("mp %d%s x dp %d, micro %d x accum %d, %s, %s, %s%s%s", p->mp,
                                 pipe, p->dp, p->micro_batch, p->grad_accum,
                                 p->checkpoint ? "ckpt"
                                 : p->selective_recompute ? "selective"
                                                          : "no ckpt",
                                 p->zero.overlap_comm ? "overlap" : "no overlap",
                                 zp_search_buckets_name(c->buckets), *options ? ", " : "",
                                 options);
    g_free(pipe);
    g_free(options);
    return text;
}

static double needed_bytes(const ZpCandidate *c)
{
    return c->fate == ZP_FATE_SIMULATED_OOM ? c->peak_memory_bytes : c->memory_bytes;
}

/* The faster (per sample) of a stage's best plans with and without checkpointing. */
static int stage_best(const ZpSearchResult *r, int stage)
{
    const int a = r->stage_best[stage][0], b = r->stage_best[stage][1];
    if (a < 0 || b < 0)
        return a < 0 ? b : a;
    const ZpCandidate *x = zp_search_candidate(r, a), *y = zp_search_candidate(r, b);
    return x->step_time_s / zp_search_samples(&x->plan) <=
                   y->step_time_s / zp_search_samples(&y->plan)
               ? a
               : b;
}

/* The plan of a stage that missed memory by the least. */
static int stage_closest(const ZpSearchResult *r, int stage)
{
    const int a = r->stage_closest[stage][0], b = r->stage_closest[stage][1];
    if (a < 0 || b < 0)
        return a < 0 ? b : a;
    return needed_bytes(zp_search_candidate(r, a)) <= needed_bytes(zp_search_candidate(r, b))
               ? a
               : b;
}

static double slowdown(const ZpCandidate *c, const ZpCandidate *best)
{
    return (c->step_time_s / zp_search_samples(&c->plan)) /
               (best->step_time_s / zp_search_samples(&best->plan)) -
           1.0;
}

/* A relative time per sample in words: "16.0% slower", "3.2% faster", "as fast". */
static char *relative(double d)
{
    if (fabs(d) < 0.0005)
        return g_strdup("as fast");
    return g_strdup_printf("%.1f%% %s", 100 * fabs(d), d > 0 ? "slower" : "faster");
}

/* Whether checkpointing was needed at a stage and what it cost or saved. */
static char *checkpoint_verdict(const ZpSearchResult *r, const PlanArgs *a, int stage)
{
    const int without = r->stage_best[stage][0], with = r->stage_best[stage][1];
    if (without < 0 && with < 0)
        return g_strdup("-");
    if (without < 0) {
        const int over = r->stage_closest[stage][0];
        return over < 0 ? g_strdup("needed")
                        : g_strdup_printf("needed (without: +%.1f GB over)",
                                          (needed_bytes(zp_search_candidate(r, over)) -
                                           a->hw.gpu_memory_bytes) / GB);
    }
    if (with < 0)
        return g_strdup("not needed");
    const ZpCandidate *x = zp_search_candidate(r, without), *y = zp_search_candidate(r, with);
    const double d = slowdown(y, x);
    char *how = relative(d >= 0 ? d : slowdown(x, y));
    char *verdict = d >= 0 ? g_strdup_printf("not needed (with it %s)", how)
                           : g_strdup_printf("helps (without it %s)", how);
    g_free(how);
    return verdict;
}

/* ---- human output ---------------------------------------------------------------------- */

static void print_header(const PlanArgs *a, const ZpSearchResult *r)
{
    char *params = cli_thousands(zp_model_param_count(&a->model));
    char *capacity = cli_capacity(a->capacity_bytes);
    printf("Plans for %s (%s parameters, sequence %" G_GINT64_FORMAT ") on %d x %s (%s, "
           "%s each",
           a->model.name, params, a->model.seq_len, a->gpus, a->hw.gpu, a->hw.name, capacity);
    if (a->hw.gpu_memory_bytes < a->capacity_bytes)
        printf("; --headroom keeps %.1f GB free, plans fit in %.1f GB",
               (a->capacity_bytes - a->hw.gpu_memory_bytes) / GB, a->hw.gpu_memory_bytes / GB);
    printf("),\n");
    g_free(capacity);
    g_free(params);
    if (a->global_batch > 0)
        printf("global batch %" G_GINT64_FORMAT, a->global_batch);
    else
        printf("global batch free (one micro-step per step)");
    /* the reduce dtype as the implementation resolves it (Megatron: fp32 under bf16) */
    ZpPlan resolved;
    zp_plan_defaults(&resolved, 0, 1, 1);
    resolved.precision = a->precision, resolved.impl = a->impl;
    resolved.reduce_dtype = a->kernels.reduce_dtype;
    g_strlcpy(resolved.kernels, a->kernels.kernels, sizeof resolved.kernels);
    zp_impl_plan_defaults(&resolved);
    /* the inventory the profile's kernel rates price (--kernels, else --impl's) */
    if (a->hw.kernel_rates.present)
        printf(", %s kernels", zp_inventory_for_plan(&resolved)->name);
    printf(", %s + %s, %s attention, gradients reduced in %s. %u plans: %u out of memory (closed form), %u cannot win (time bound),\n"
           "%u simulated and fit, %u over memory when simulated. GB = 1e9 bytes.\n",
           zp_precision_name(a->precision), zp_optimizer_name(a->optimizer),
           zp_attention_name(a->kernels.attention),
           resolved.reduce_dtype == ZP_REDUCE_GRAD ? zp_precision_name(a->precision)
                                                   : zp_reduce_dtype_name(resolved.reduce_dtype),
           r->candidates->len, r->count[ZP_FATE_OUT_OF_MEMORY], r->count[ZP_FATE_CANNOT_WIN],
           r->count[ZP_FATE_SIMULATED], r->count[ZP_FATE_SIMULATED_OOM]);
}

/* Memory columns: the simulated peak's categories, merged where the table would be wide. */
static const struct {
    const char *label;
    ZpMemCategory first, last; /* inclusive range of categories */
} memory_columns[] = {
    {"params", ZP_MEM_PARAMS, ZP_MEM_PARAMS},
    {"grads", ZP_MEM_GRADS, ZP_MEM_GRADS},
    {"optim", ZP_MEM_MASTER, ZP_MEM_ADAM_V},
    {"gathered", ZP_MEM_GATHERED_PARAMS, ZP_MEM_GATHERED_PARAMS},
    {"buckets", ZP_MEM_BUCKETS, ZP_MEM_BUCKETS},
    {"activ", ZP_MEM_ACTIVATIONS, ZP_MEM_ACTIVATIONS},
    {"ckpts", ZP_MEM_CHECKPOINTS, ZP_MEM_CHECKPOINTS},
    {"logits", ZP_MEM_WORKSPACE, ZP_MEM_WORKSPACE},
};

static void print_ranked(const PlanArgs *a, const ZpSearchResult *r, SimResult **sims)
{
    const double peak = zp_hw_peak_flops(&a->hw, a->precision);
    printf("\nTop %u (simulated step, ranked by samples/s; plans the simulator cannot tell "
           "apart are listed once,\nby the one closest to DeepSpeed's defaults):\n",
           r->ranked->len + a->dominated);
    printf("  %2s %5s %3s %5s %5s %5s %4s %7s %-10s %9s %10s %10s %9s %10s %6s %8s%s  %s\n",
           "#", "stage", "mp", "dp", "micro", "accum", "ckpt", "overlap", "buckets", "step s",
           "samples/s", "tokens/s", "tok/s/GPU", "TFLOPs/GPU", "MFU", "need GB",
           a->three_d ? "  pipeline" : "", "ZeRO-R/ZeRO++");
    for (guint i = 0; i < r->ranked->len; i++) {
        const ZpCandidate *c = zp_search_ranked(r, i);
        const ZpPlan *p = &c->plan;
        const double tflops = cli_plan_tflops(&a->model, c);
        const double samples_per_s = zp_search_samples(p) / c->step_time_s;
        const double tokens_per_s = samples_per_s * (double)a->model.seq_len;
        char *pipe = !a->three_d ? g_strdup("")
                     : zp_plan_pp(p) > 1
                         ? g_strdup_printf("  pp %d %s v%d", zp_plan_pp(p),
                                           zp_pipe_schedule_name(p->pipe.schedule),
                                           zp_plan_vstages(p))
                         : g_strdup("  none");
        char *options = zp_search_options_text(p);
        printf("  %2u %5d %3d %5d %5d %5d %4s %7s %-10s %9.3f %10.2f %10.0f %9.0f %10.1f %5.1f%% "
               "%8.2f%s  %s\n",
               i + 1, p->zero.stage, p->mp, p->dp, p->micro_batch, p->grad_accum,
               p->checkpoint ? "yes" : p->selective_recompute ? "sel" : "no",
               p->zero.overlap_comm ? "yes" : "no",
               zp_search_buckets_name(c->buckets), c->step_time_s, samples_per_s, tokens_per_s,
               tokens_per_s / a->gpus, tflops, 100 * tflops * 1e12 / peak,
               c->peak_memory_bytes / GB, pipe, *options ? options : "none");
        g_free(pipe);
        g_free(options);
    }
    if (a->dominated)
        printf("  (%u more plans left out: each is no faster than one above and needs no less "
               "memory.)\n", a->dominated);
    printf("\nMemory per GPU at the simulated peak (GB; optim = fp32 master + Adam moments; total:\n"
           "the allocator-reserved peak, holes included, + reserve):\n");
    printf("  %2s", "#");
    for (size_t k = 0; k < G_N_ELEMENTS(memory_columns); k++)
        printf(" %8s", memory_columns[k].label);
    printf(" %8s %8s %8s\n", "reserve", "total", "of");
    for (guint i = 0; i < r->ranked->len; i++) {
        printf("  %2u", i + 1);
        for (size_t k = 0; k < G_N_ELEMENTS(memory_columns); k++) {
            double bytes = 0;
            for (int m = memory_columns[k].first; m <= (int)memory_columns[k].last; m++)
                bytes += sims[i]->peak_breakdown_bytes[m];
            printf(" %8.2f", bytes / GB);
        }
        printf(" %8.2f %8.2f %8.1f\n", a->hw.runtime_reserve_bytes / GB,
               zp_search_ranked(r, i)->peak_memory_bytes / GB, a->hw.gpu_memory_bytes / GB);
    }
}

static void print_stages(const PlanArgs *a, const ZpSearchResult *r)
{
    const ZpCandidate *best = r->ranked->len ? zp_search_ranked(r, 0) : NULL;
    printf("\nWhy the other choices lost (the best plan of each stage):\n");
    printf("  %5s %-60s %9s %14s  %s\n", "stage", "best plan", "step s", "per sample vs #1",
           "checkpointing");
    for (int stage = 0; stage <= 3; stage++) {
        const int b = stage_best(r, stage);
        char *verdict = checkpoint_verdict(r, a, stage);
        if (b >= 0) {
            const ZpCandidate *c = zp_search_candidate(r, b);
            char *what = describe(c);
            char *vs = c == best ? g_strdup("#1") : relative(slowdown(c, best));
            printf("  %5d %-60s %9.3f %16s  %s\n", stage, what, c->step_time_s, vs, verdict);
            g_free(vs);
            g_free(what);
        } else if (stage_closest(r, stage) < 0 &&
                   !zp_impl_get(a->impl)->has_stage(stage)) { /* the implementation lacks it */
            printf("  %5d not a stage of --impl %s\n", stage, zp_impl_name(a->impl));
        } else if (stage_closest(r, stage) < 0 && a->gpu_only_short_bytes[stage] > 0) {
            /* The offload search left the stage out; what stopped it is the GPU's memory,
             * which the search without offload found it short of. */
            const gboolean param = best && best->plan.zero.offload_param.device != ZP_OFFLOAD_NONE;
            printf("  %5d out of GPU memory: without offload its closest plan needs %.1f GB more "
                   "than %.1f GB;\n        %s offload, which plan 1 needs, is DeepSpeed's from "
                   "stage %d\n",
                   stage, a->gpu_only_short_bytes[stage] / GB, a->hw.gpu_memory_bytes / GB,
                   param ? "parameter" : "optimizer", param ? 3 : 1);
        } else if (stage_closest(r, stage) < 0) { /* the offload flags leave the stage out */
            const gboolean param = a->offload.offload_param.device != ZP_OFFLOAD_NONE;
            printf("  %5d not searched: --offload-%s needs stage %d or above\n", stage,
                   param ? "param" : "optimizer", param ? 3 : 1);
        } else { /* a stage searched without a fit has a closest plan */
            const ZpCandidate *c = zp_search_candidate(r, stage_closest(r, stage));
            char *what = describe(c);
            printf("  %5d out of memory: the closest plan needs %.1f GB more than %.1f GB\n"
                   "        (%s%s)\n",
                   stage, (needed_bytes(c) - a->hw.gpu_memory_bytes) / GB,
                   a->hw.gpu_memory_bytes / GB, what,
                   c->fate == ZP_FATE_SIMULATED_OOM ? ", reserved peak" : "");
            g_free(what);
        }
        g_free(verdict);
    }
    for (int ckpt = 0; a->three_d && ckpt < 2; ckpt++) {
        const int b = r->pipe_best[ckpt];
        if (b < 0)
            continue;
        const ZpCandidate *c = zp_search_candidate(r, b);
        char *what = describe(c);
        char *vs = c == best ? g_strdup("#1") : relative(slowdown(c, best));
        printf("  %5s %-60s %9.3f %16s  %s\n", ckpt ? "3D+ck" : "3D", what, c->step_time_s, vs,
               "(stage 1 or 0 with pipeline stages)");
        g_free(vs);
        g_free(what);
    }
    if (best)
        printf("  Plans that fit but were not simulated could not beat these: their lower "
               "bound on the step\n  (exact compute + collectives at full bandwidth) was "
               "already slower.\n");
}

/* The first line: whether plan 1 (or, when nothing fits, the closest plan) fits the GPU. */
static char *verdict_text(const PlanArgs *a, const ZpSearchResult *r)
{
    const ZpCandidate *c = r->ranked->len ? zp_search_ranked(r, 0)
                                          : zp_search_candidate(r, r->closest);
    char *shape = describe(c);
    char *what = g_strdup_printf("%s (stage %d, %s)", r->ranked->len ? "plan 1" : "the closest plan",
                                 c->plan.zero.stage, shape);
    const gboolean simulated = c->fate == ZP_FATE_SIMULATED || c->fate == ZP_FATE_SIMULATED_OOM;
    char *verdict = cli_verdict(what, simulated ? "allocator-reserved peak + reserve"
                                                : "closed form + reserve",
                                simulated ? c->peak_memory_bytes : c->memory_bytes,
                                a->capacity_bytes);
    g_free(what), g_free(shape);
    return verdict;
}

static void print_verdict(const PlanArgs *a, const ZpSearchResult *r)
{
    char *verdict = verdict_text(a, r);
    printf("%s\n", verdict);
    g_free(verdict);
}

/* --html: the verdict and the listed plans side by side (cli_report). */
static gboolean write_html(const PlanArgs *a, const ZpSearchResult *r, GError **error)
{
    const int n = (int)r->ranked->len;
    CliReportPlan *plans = g_new0(CliReportPlan, MAX(n, 1));
    char **whats = g_new0(char *, n + 1);
    for (int i = 0; i < n; i++) {
        const ZpCandidate *c = zp_search_ranked(r, i);
        char *shape = describe(c);
        whats[i] = g_strdup_printf("stage %d, %s", c->plan.zero.stage, shape);
        g_free(shape);
        plans[i] = (CliReportPlan){whats[i], c->step_time_s,
                                   zp_search_samples(&c->plan) / c->step_time_s,
                                   c->peak_memory_bytes, cli_plan_tflops(&a->model, c)};
    }
    char *verdict = verdict_text(a, r);
    char *title = g_strdup_printf("Plans for %s on %d x %s (%s)", a->model.name, a->gpus,
                                  a->hw.gpu, a->hw.name);
    const gboolean ok = cli_report_plans_html(a->html, title, verdict, plans, n,
                                              a->capacity_bytes, error);
    g_free(title), g_free(verdict), g_free(plans);
    g_strfreev(whats);
    return ok;
}

/* ---- JSON ------------------------------------------------------------------------------ */

static json_t *candidate_json(const PlanArgs *a, const ZpCandidate *c, const SimResult *sim)
{
    const ZpPlan *p = &c->plan;
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:I, s:b, s:b, s:s, s:s, s:f, s:f}",
                          "stage", p->zero.stage, "dp", p->dp, "mp", p->mp, "micro_batch",
                          p->micro_batch, "grad_accum", p->grad_accum, "global_batch",
                          (json_int_t)zp_search_samples(p), "checkpoint", p->checkpoint,
                          "overlap_comm", p->zero.overlap_comm, "buckets",
                          zp_search_buckets_name(c->buckets), "fate",
                          zp_search_fate_name(c->fate), "screen_memory_bytes", c->memory_bytes,
                          "bound_step_time_s", c->bound_step_s);
    if (p->selective_recompute && !p->checkpoint)
        json_object_set_new(o, "recompute", json_string("selective"));
    if (zp_plan_pp(p) > 1)
        json_object_set_new(o, "pipeline",
                            json_pack("{s:i, s:i, s:s}", "stages", zp_plan_pp(p),
                                      "virtual_stages", zp_plan_vstages(p), "schedule",
                                      zp_pipe_schedule_name(p->pipe.schedule)));
    if (c->fate == ZP_FATE_SIMULATED || c->fate == ZP_FATE_SIMULATED_OOM) {
        const double tflops = cli_plan_tflops(&a->model, c);
        json_object_set_new(o, "step_time_s", json_real(c->step_time_s));
        json_object_set_new(o, "samples_per_s",
                            json_real(zp_search_samples(p) / c->step_time_s));
        const double tokens_per_s =
            zp_search_samples(p) / c->step_time_s * (double)a->model.seq_len;
        json_object_set_new(o, "tokens_per_s", json_real(tokens_per_s));
        json_object_set_new(o, "tokens_per_s_per_gpu", json_real(tokens_per_s / a->gpus));
        json_object_set_new(o, "tflops_per_gpu", json_real(tflops));
        json_object_set_new(o, "mfu",
                            json_real(tflops * 1e12 / zp_hw_peak_flops(&a->hw, p->precision)));
        json_object_set_new(o, "peak_memory_bytes", json_real(c->peak_memory_bytes));
    }
    if (c->fate != ZP_FATE_SIMULATED)
        json_object_set_new(o, "over_memory_bytes",
                            json_real(fmax(0, needed_bytes(c) - a->hw.gpu_memory_bytes)));
    if (sim) {
        json_t *breakdown = json_object();
        for (int m = 0; m < ZP_MEM_N; m++)
            json_object_set_new(breakdown, zp_sched_mem_name(m),
                                json_real(sim->peak_breakdown_bytes[m]));
        json_object_set_new(breakdown, "reserve", json_real(a->hw.runtime_reserve_bytes));
        json_object_set_new(o, "memory_breakdown_bytes", breakdown);
    }
    json_object_set_new(o, "offload_optimizer",
                        json_string(zp_offload_device_name(p->zero.offload_optimizer.device)));
    json_object_set_new(o, "offload_param",
                        json_string(zp_offload_device_name(p->zero.offload_param.device)));
    char *options = zp_search_options_text(p);
    json_object_set_new(o, "zero_r_zeropp", json_string(options)); /* "" when none */
    g_free(options);
    json_object_set_new(o, "plan", zp_plan_to_json(p));
    return o;
}

static json_t *maybe_candidate(const PlanArgs *a, const ZpSearchResult *r, int index)
{
    return index < 0 ? json_null() : candidate_json(a, zp_search_candidate(r, index), NULL);
}

static int print_json(const PlanArgs *a, const ZpSearchResult *r, SimResult **sims)
{
    json_t *candidates = json_array(), *stages = json_array();
    for (guint i = 0; i < r->ranked->len; i++)
        json_array_append_new(candidates, candidate_json(a, zp_search_ranked(r, i), sims[i]));
    for (int stage = 0; stage <= 3; stage++) {
        const int best = stage_best(r, stage);
        json_array_append_new(
            stages, json_pack("{s:i, s:b, s:o, s:o, s:o, s:b, s:o}", "stage", stage, "fits",
                              best >= 0, "best", maybe_candidate(a, r, best),
                              "best_without_checkpointing",
                              maybe_candidate(a, r, r->stage_best[stage][0]),
                              "best_with_checkpointing",
                              maybe_candidate(a, r, r->stage_best[stage][1]),
                              "checkpointing_needed",
                              r->stage_best[stage][0] < 0 && r->stage_best[stage][1] >= 0,
                              "closest_over_memory",
                              maybe_candidate(a, r, stage_closest(r, stage))));
    }
    json_t *root = json_pack(
        "{s:s, s:I, s:I, s:s, s:s, s:i, s:f, s:s, s:s, s:{s:i, s:i, s:i, s:i, s:i}}", "model",
        a->model.name, "params", (json_int_t)zp_model_param_count(&a->model), "seq_len",
        (json_int_t)a->model.seq_len, "cluster", a->hw.name, "gpu", a->hw.gpu, "gpus", a->gpus,
        "gpu_memory_bytes", a->capacity_bytes, "precision", zp_precision_name(a->precision),
        "optimizer", zp_optimizer_name(a->optimizer), "screened", "plans",
        (int)r->candidates->len, "out_of_memory", (int)r->count[ZP_FATE_OUT_OF_MEMORY],
        "cannot_win", (int)r->count[ZP_FATE_CANNOT_WIN], "simulated",
        (int)r->count[ZP_FATE_SIMULATED], "simulated_out_of_memory",
        (int)r->count[ZP_FATE_SIMULATED_OOM]);
    json_object_set_new(root, "headroom_bytes", json_real(a->capacity_bytes - a->hw.gpu_memory_bytes));
    json_object_set_new(root, "global_batch",
                        a->global_batch > 0 ? json_integer(a->global_batch) : json_null());
    json_object_set_new(root, "best",
                        r->ranked->len ? json_incref(json_array_get(candidates, 0)) : json_null());
    json_object_set_new(root, "candidates", candidates);
    json_object_set_new(root, "stages", stages);
    json_object_set_new(root, "closest_over_memory",
                        r->ranked->len ? json_null() : maybe_candidate(a, r, r->closest));
    GError *error = NULL;
    if (a->offload_note) /* what offloading costs plan 1, when nothing fit without it */
        json_object_set_new(root, "offload_note", json_string(a->offload_note));
    if (a->whole_node_note) /* what the search left out */
        json_object_set_new(root, "whole_node_note", json_string(a->whole_node_note));
    if (r->ranked->len) { /* plan 1's --tokens/--steps budget */
        const ZpCandidate *best = zp_search_ranked(r, 0);
        json_t *budget = cli_budget_json(&a->budget, best->step_time_s,
                                         zp_search_samples(&best->plan) * (double)a->model.seq_len,
                                         a->gpus);
        if (budget)
            json_object_set_new(root, "budget", budget);
    }
    const gboolean ok = zp_json_write(root, NULL, &error);
    json_decref(root);
    return ok ? 0 : cli_fail("plan", error);
}

/* ---- the command ----------------------------------------------------------------------- */

/* Stage 3 spreads all model states over every GPU, so this is the fewest GPUs of this size
 * that could hold them on the GPUs alone, before any activation or buffer. */
static double gpus_for_states(const PlanArgs *a, double *states_bytes)
{
    const ZpStateBytes sb = zp_plan_state_bytes(a->precision, a->optimizer);
    *states_bytes = zp_mem_model_states((double)zp_model_param_count(&a->model), 3, 1, 1, sb)
                        .total_bytes;
    return ceil(*states_bytes / (a->hw.gpu_memory_bytes - a->hw.runtime_reserve_bytes));
}

/* When nothing fits even with offload: each level's closest plan's shortfall. */
static void print_offload_tried(const PlanArgs *a)
{
    if (a->offload_short_bytes[0] <= 0 && a->offload_short_bytes[2] <= 0)
        return;
    printf("With offload, the closest plans still need per GPU:");
    for (size_t i = 0; i < G_N_ELEMENTS(a->offload_short_bytes); i++)
        if (a->offload_short_bytes[i] > 0)
            printf("%s %.1f GB more (%s)", i ? ";" : "", a->offload_short_bytes[i] / GB,
                   offload_level_names[i + 1]);
    printf(".\n");
}

static int report(const PlanArgs *a, const ZpSearchResult *r)
{
    GError *error = NULL;
    SimResult **sims = g_new0(SimResult *, r->ranked->len + 1);
    gboolean ok = TRUE;
    for (guint i = 0; ok && i < r->ranked->len; i++) {
        const ZpPlan *plan = &zp_search_ranked(r, i)->plan;
        sims[i] = cli_rank_take(&a->runs, plan);
        if (!sims[i])
            sims[i] = cli_rank_simulate(&a->model, &a->hw, plan, 0, NULL, &error);
        ok = sims[i] != NULL;
    }
    if (ok && a->ds_config && r->ranked->len)
        ok = zp_dsconfig_write(&zp_search_ranked(r, 0)->plan, a->ds_config, &error);
    if (ok && a->html && r->ranked->len)
        ok = write_html(a, r, &error);
    int status = ok ? 0 : cli_fail("plan", error);
    if (ok && a->json) {
        status = print_json(a, r, sims);
    } else if (ok) {
        print_verdict(a, r);
        double states = 0;
        const double needed = gpus_for_states(a, &states);
        if (a->offload_note)
            printf("%s\nWithout offload, the %.0f GB of model states alone need at least %.0f "
                   "GPUs of this size (%d given).\n",
                   a->offload_note, states / GB, needed, a->gpus);
        if (a->whole_node_note)
            printf("%s\n", a->whole_node_note);
        cli_print_defaults();
        const ZpCandidate *best = r->ranked->len ? zp_search_ranked(r, 0) : NULL;
        char *budget = best ? cli_budget_line(&a->budget, best->step_time_s,
                                              zp_search_samples(&best->plan) *
                                                  (double)a->model.seq_len,
                                              a->gpus)
                            : NULL;
        if (budget)
            printf("Plan 1: %s\n", budget);
        g_free(budget);
        print_header(a, r);
        if (r->ranked->len)
            print_ranked(a, r, sims);
        print_stages(a, r);
        if (a->ds_config && r->ranked->len) {
            printf("\nDeepSpeed config of plan 1 written to %s\n", a->ds_config);
            /* DeepSpeed's PipelineEngine runs 1F1B whatever the file says: the schedule is
             * zplan's key, for simulate --ds-config, not a setting DeepSpeed has. */
            const ZpPlan *best = &zp_search_ranked(r, 0)->plan;
            if (zp_plan_pp(best) > 1 && best->pipe.schedule != ZP_PIPE_1F1B)
                printf("  (its pipeline.schedule \"%s\" is zplan's key, read back by simulate "
                       "--ds-config: DeepSpeed's PipelineEngine runs 1F1B)\n",
                       zp_pipe_schedule_name(best->pipe.schedule));
        }
    }
    if (status == 0 && r->ranked->len == 0) {
        /* Nothing ranked means every plan was over memory, so the closest one is set. */
        const ZpCandidate *c = zp_search_candidate(r, r->closest);
        fprintf(stderr, "zplan plan: no plan fits: %s on %d GPUs needs at least %.1f GB more "
                        "per GPU than the %.1f GB of %s\n",
                a->model.name, a->gpus, (needed_bytes(c) - a->hw.gpu_memory_bytes) / GB,
                a->hw.gpu_memory_bytes / GB, a->hw.name);
        double states = 0;
        const double needed = gpus_for_states(a, &states);
        if (!a->json) {
            printf("\nNo plan fits in %.1f GB per GPU. Even at stage 3, which spreads the %.0f "
                   "GB of model states\nover all GPUs, they alone need at least %.0f GPUs of "
                   "this size (%d given).\n",
                   a->hw.gpu_memory_bytes / GB, states / GB, needed, a->gpus);
            print_offload_tried(a);
        }
        status = CLI_EXIT_DOES_NOT_FIT;
    }
    for (guint i = 0; i < r->ranked->len; i++)
        sim_result_free(sims[i]);
    g_free(sims);
    return status;
}

/* --headroom: a fraction of the GPU's memory below 1 ("0.1"), GB without a suffix ("8"), or
 * bytes with one ("8GB", "8GiB"); the plans must fit in what is left. */
static gboolean headroom(const char *text, PlanArgs *a, GError **error)
{
    a->capacity_bytes = a->hw.gpu_memory_bytes;
    if (!text)
        return TRUE;
    double value, bytes;
    char *end = NULL;
    const double plain = g_ascii_strtod(text, &end);
    if (end != text && *end == '\0' && plain >= 0 && plain < 1) {
        bytes = plain * a->capacity_bytes;
    } else if (end != text && *end == '\0') {
        if (!zp_parse_number(text, "--headroom", 0, 1e5, FALSE, &value, error))
            return FALSE;
        bytes = value * GB;
    } else if (!zp_parse_size(text, "--headroom", ZP_SIZE_BYTES, 0, 1e14, FALSE, &bytes, error)) {
        return FALSE;
    }
    if (bytes >= a->capacity_bytes - a->hw.runtime_reserve_bytes) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "--headroom: '%s' (%.1f GB) leaves nothing "
                    "of the %.1f GB GPU beyond its %.1f GB reserve", text, bytes / GB,
                    a->capacity_bytes / GB, a->hw.runtime_reserve_bytes / GB);
        return FALSE;
    }
    a->hw.gpu_memory_bytes -= bytes;
    return TRUE;
}

static gboolean parse_args(PlanArgs *a, const char *model, const char *cluster,
                           const char *gpus, const char *global_batch, const char *seq,
                           const char *top, const char *mp, const char *precision,
                           const char *optimizer, const char *attention, const char *reduce,
                           const char *room, const char *gpu_memory, GError **error)
{
    gboolean have_hw = FALSE;
    int batch = 0;
    if (!model || !cluster || !gpus) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s is required",
                    !model ? "--model NAME|PATH.json"
                           : !cluster ? "--cluster NAME|PATH.json" : "--gpus N");
        return FALSE;
    }
    if (!(zp_model_load(model, &a->model, error) &&
          cli_cluster(cluster, gpu_memory, TRUE, &a->hw, &have_hw, error) &&
          cli_int(gpus, "--gpus", 1, CLI_MAX_GPUS, 0, &a->gpus, error) &&
          cli_int(global_batch, "--global-batch", 1, 1 << 24, 0, &batch, error) &&
          cli_seq(seq, &a->model, error) &&
          cli_int(top, "--top", 1, 1000, 5, &a->top_k, error) &&
          cli_int(mp, "--mp", 1, 65536, 0, &a->mp, error) &&
          (a->mp == 0 || cli_check_mp(a->mp, a->gpus, &a->model, error)) &&
          cli_precision_optimizer(precision, optimizer, &a->model, &a->hw, &a->precision,
                                  &a->optimizer, error) &&
          cli_attention_reduce(attention, reduce, &a->hw, a->precision, &a->kernels, error) &&
          headroom(room, a, error)))
        return FALSE;
    a->global_batch = batch;
    a->seq = (int)a->model.seq_len;
    if (a->mp > 0 && !sim_coll_check_placement(&a->hw, a->mp, error)) {
        g_prefix_error(error, "--mp: ");
        return FALSE;
    }
    return TRUE;
}

static gboolean search(PlanArgs *a, ZpOffloadDevice optimizer, ZpOffloadDevice param,
                       ZpSearchResult *result, GError **error)
{
    ZpSearchSpec spec;
    CliRankContext rank;
    cli_search_spec(&spec, &rank, &a->model, &a->hw, a->gpus);
    rank.kept = a->runs.kept;
    spec.global_batch = a->global_batch;
    spec.mp = a->mp;
    spec.top_k = a->top_k;
    spec.precision = a->precision;
    spec.optimizer = a->optimizer;
    spec.attention = a->kernels.attention;
    spec.reduce_dtype = a->kernels.reduce_dtype;
    spec.impl = a->impl;
    g_strlcpy(spec.kernels, a->kernels.kernels, sizeof spec.kernels);
    spec.three_d = a->three_d;
    spec.offload_optimizer = optimizer;
    spec.offload_param = param;
    spec.exclude = a->exclude;
    CliProgress *progress = cli_progress_new("zplan plan: simulating the plans that fit");
    spec.progress = cli_progress_update;
    spec.progress_ctx = progress;
    const gboolean searched = zp_search_run(&spec, result, error);
    cli_progress_free(progress);
    if (!a->whole_node_note)
        a->whole_node_note = zp_search_whole_node_note(&spec);
    return searched;
}

/* What offloading costs plan 1: the same plan with everything on the GPU, simulated (it
 * does not fit, so its time is what the GPU would take if it had the memory). */
static char *offload_cost(const PlanArgs *a, const ZpSearchResult *r, GError **error)
{
    const ZpCandidate *best = zp_search_ranked(r, 0);
    ZpPlan plain = best->plan;
    zp_offload_defaults(&plain.zero.offload_optimizer, FALSE);
    zp_offload_defaults(&plain.zero.offload_param, TRUE);
    CliRankContext ctx = {&a->model, &a->hw, NULL};
    double plain_step_s, plain_need_bytes;
    if (!cli_rank_by_simulation(&plain, &ctx, 0, &plain_step_s, &plain_need_bytes, error))
        return NULL;
    ZpTiers t;
    zp_offload_tiers(&a->model, &best->plan, &a->hw, &t);
    char *note = g_strdup_printf(
        "Nothing fits on the GPUs alone: plan 1 offloads the optimizer to %s and the parameters "
        "to %s (host memory %.1f GB and NVMe %.1f GB per node).\nIts step takes %.3f s, %.1f%% "
        "longer than the same plan with everything on the GPU (%.3f s), which would need "
        "%.1f GB more per GPU than %s has.",
        zp_offload_device_name(best->plan.zero.offload_optimizer.device),
        best->plan.zero.offload_param.device == ZP_OFFLOAD_NONE
            ? "none (they stay on the GPU)"
            : zp_offload_device_name(best->plan.zero.offload_param.device),
        t.cpu_node_bytes / GB,
        t.nvme_node_bytes / GB, best->step_time_s,
        100.0 * (best->step_time_s / plain_step_s - 1.0), plain_step_s,
        (plain_need_bytes + a->hw.runtime_reserve_bytes - a->hw.gpu_memory_bytes) / GB,
        a->hw.name);
    return note;
}

/* The search: with the offload flags, that offload only; without, everything on the GPUs,
 * and when nothing fits, optimizer offload to the host, then parameters too, then both to
 * NVMe, until something fits (ZeRO-Offload, then ZeRO-Infinity). */
static gboolean search_with_offload(PlanArgs *a, ZpSearchResult *result, GError **error)
{
    if (a->offload_given)
        return search(a, a->offload.offload_optimizer.device, a->offload.offload_param.device,
                      result, error);
    const ZpOffloadDevice(*levels)[2] = offload_levels;
    ZpSearchResult plain;
    if (!search(a, levels[0][0], levels[0][1], &plain, error))
        return FALSE;
    if (plain.ranked->len > 0 || a->hw.cpu_adam_bytes_per_s_per_core <= 0) {
        *result = plain;
        return TRUE;
    }
    for (size_t i = 1; i < G_N_ELEMENTS(offload_levels); i++) {
        if (!search(a, levels[i][0], levels[i][1], result, error)) {
            zp_search_result_clear(&plain);
            return FALSE;
        }
        if (result->ranked->len > 0) {
            for (int stage = 0; stage <= 3; stage++) {
                const int c = stage_closest(&plain, stage);
                a->gpu_only_short_bytes[stage] =
                    c < 0 ? 0
                          : needed_bytes(zp_search_candidate(&plain, c)) - a->hw.gpu_memory_bytes;
            }
            zp_search_result_clear(&plain);
            return (a->offload_note = offload_cost(a, result, error)) != NULL;
        }
        if (result->closest >= 0)
            a->offload_short_bytes[i - 1] =
                needed_bytes(zp_search_candidate(result, result->closest)) -
                a->hw.gpu_memory_bytes;
        if (i + 1 < G_N_ELEMENTS(offload_levels))
            zp_search_result_clear(result);
    }
    /* Nothing fits even with NVMe: report the search without offload. */
    zp_search_result_clear(result);
    *result = plain;
    return TRUE;
}

/* The offload flags: the search then keeps to that offload. */
static gboolean plan_offload(PlanArgs *a, const char *opt, const char *param, const char *path,
                             GError **error)
{
    a->offload_given = opt || param;
    zp_zero_config_defaults(&a->offload, 3);
    return cli_offload(opt, param, path, &a->offload, error);
}

/* A mixture of experts: zp_moe_search's closed-form screen, its shortlist simulated. */
static int moe_plan(const PlanArgs *a, const ZpExpertConfig *experts, gboolean ep_given,
                    gboolean offload, GError **error)
{
    /* --3d adds nothing here: the MoE search tries pipelines whenever --global-batch is set. */
    if (offload) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--offload-*: not yet for a mixture of experts (its schedule offloads no "
                    "experts)");
        return cli_fail("plan", *error);
    }
    ZpSearchSpec spec;
    CliRankContext rank;
    cli_search_spec(&spec, &rank, &a->model, &a->hw, a->gpus);
    spec.global_batch = a->global_batch;
    spec.mp = a->mp;
    spec.precision = a->precision;
    spec.optimizer = a->optimizer;
    spec.attention = a->kernels.attention;
    spec.reduce_dtype = a->kernels.reduce_dtype;
    spec.impl = a->impl;
    spec.exclude = a->exclude; /* checkpoint: the rest are techniques it never schedules */
    g_strlcpy(spec.kernels, a->kernels.kernels, sizeof spec.kernels);
    cli_rank_keep(&rank); /* the shortlist's runs, whose all-to-all the table prints */
    const CliMoeOutput out = {a->top_k, a->json, a->html, &a->budget, a->ds_config};
    const int status = cli_moe_plan(&spec, experts, ep_given, &out, error);
    cli_rank_clear(&rank);
    return status < 0 ? cli_fail("plan", *error) : status;
}

int cli_plan(int argc, char **argv)
{
    char *model = NULL, *cluster = NULL, *gpus = NULL, *global_batch = NULL, *seq = NULL;
    char *top = NULL, *mp = NULL, *precision = NULL, *optimizer = NULL, *attention = NULL;
    char *reduce = NULL, *room = NULL, *impl = NULL, *kernels = NULL, *offload_opt = NULL;
    char *offload_param = NULL, *nvme_path = NULL, *zeropp = NULL, *exclude = NULL;
    char *gpu_memory = NULL;
    char *ep = NULL, *capacity = NULL, *skew = NULL;
    ZpExpertConfig experts = {0};
    PlanArgs a = {0};
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &model, "Model name in models/ or a PATH.json (required)", "M"},
        {"cluster", 0, 0, G_OPTION_ARG_STRING, &cluster, "Hardware profile (required)", "C"},
        {"gpu-memory", 0, 0, G_OPTION_ARG_STRING, &gpu_memory, "The cluster's GPUs with this memory instead (40GB, 40GiB)", "BYTES"},
        {"gpus", 0, 0, G_OPTION_ARG_STRING, &gpus, "GPU count (required)", "N"},
        {"global-batch", 0, 0, G_OPTION_ARG_STRING, &global_batch, "Samples per optimizer step = micro x accum x dp (default: free, no accumulation)", "B"},
        CLI_SEQ_ENTRY(&seq),
        {"attention", 0, 0, G_OPTION_ARG_STRING, &attention, "eager, flash (the profile's fused kernel), a kernel its attention table lists, or mem-efficient (SDPA's memory-efficient kernel: a fused kernel's memory, eager's time where unrated) (default: what PyTorch's SDPA picks there for the dtype; mem-efficient in fp32)", "K"},
        {"reduce-dtype", 0, 0, G_OPTION_ARG_STRING, &reduce, "Gradient reduction dtype fp32, bf16 or fp16 (default: the gradients')", "D"},
        {"headroom", 0, 0, G_OPTION_ARG_STRING, &room, "Memory to leave free on each GPU: GB (8), bytes with a suffix (8GB, 8GiB) or a fraction below 1 (0.1)", "GB"},
        {"top", 0, 0, G_OPTION_ARG_STRING, &top, "How many plans to list (default 5)", "K"},
        {"mp", 0, 0, G_OPTION_ARG_STRING, &mp, "Only this tensor-parallel degree (default: all that fit a node)", "M"},
        {"precision", 0, 0, G_OPTION_ARG_STRING, &precision, "fp16, bf16 or fp32 (default: the model's torch_dtype where the GPU has it, else fp16)", "P"},
        {"optimizer", 0, 0, G_OPTION_ARG_STRING, &optimizer, "adam (default), sgd-momentum, sgd or adam-8bit", "O"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &a.json, "Print JSON: best, candidates, stages", NULL},
        {"ds-config", 0, 0, G_OPTION_ARG_FILENAME, &a.ds_config, "Write the best plan's DeepSpeed config to OUT", "OUT"},
        {"html", 0, 0, G_OPTION_ARG_FILENAME, &a.html, "Write the top plans side by side as one HTML page", "OUT.html"},
        {"impl", 0, 0, G_OPTION_ARG_STRING, &impl, "Whose ZeRO: deepspeed (default), fsdp, paper, megatron or fsdp2", "I"},
        {"kernels", 0, 0, G_OPTION_ARG_STRING, &kernels, "The kernel inventory a GPU profile's kernel_rates price: eager, megatron or deepspeed (default: the one --impl names, else eager)", "NAME"},
        {"3d", 0, 0, G_OPTION_ARG_NONE, &a.three_d, "Also search pipeline stages (1F1B, interleaved with 2 or 4 chunks; needs --global-batch) and tensor parallelism over whole nodes", NULL},
        CLI_OFFLOAD_ENTRIES(&offload_opt, &offload_param, &nvme_path),
        CLI_BUDGET_ENTRIES(&a.budget),
        {"zeropp", 0, 0, G_OPTION_ARG_STRING, &zeropp, "ZeRO++ to search: none, lossless (default: hpZ) or lossy (also qwZ's int8 parameter gathers and qgZ's int4 gradients, which change the training)", "SET"},
        {"exclude", 0, 0, G_OPTION_ARG_STRING, &exclude, "Techniques never to try, comma-separated: qwz, qgz, hpz, pa, md, pa-cpu, checkpoint", "A,B"},
        CLI_MOE_ENTRIES(&ep, &capacity, &skew),
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GOptionContext *context = g_option_context_new("- the best ZeRO plans for a model on N GPUs");
    g_option_context_add_main_entries(context, entries, NULL);
    g_option_context_set_summary(context,
        "Searches ZeRO stage 0-3, micro-batch, gradient accumulation, activation checkpointing,\n"
        "tensor-parallel degree, overlap_comm and bucket sizes; drops what cannot fit (closed\n"
        "form) or cannot win (a lower bound on the step), ranks the rest by simulating one step,\n"
        "and shows why the best plan of every other stage lost. Opens with whether plan 1 fits\n"
        "and its headroom; tokens/s = samples/s x sequence. When nothing fits on the GPUs\n"
        "alone it tries optimizer offload to the host, then parameter offload, then NVMe,\n"
        "and says what the offload costs (--offload-* search that offload only).\n"
        "Exit status 2: nothing fits.");
    GError *error = NULL;
    int status;
    if (!cli_parse(context, &argc, &argv, &error) ||
        !parse_args(&a, model, cluster, gpus, global_batch, seq, top, mp, precision, optimizer,
                    attention, reduce, room, gpu_memory, &error) ||
        (impl && !zp_impl_parse(impl, "--impl", &a.impl, &error)) ||
        !cli_kernels(kernels, &a.kernels, &error) ||
        !parse_techniques(zeropp, exclude, &a.exclude, &error) ||
        !cli_budget_parse(&a.budget, &error) ||
        (a.ds_config && !zp_check_out_path(a.ds_config, "--ds-config", &error)) ||
        (a.html && !zp_check_out_path(a.html, "--html", &error)) ||
        !cli_moe_parse(&a.model, ep, capacity, skew, &experts, &error)) {
        status = cli_fail("plan", error);
    } else if (zp_moe_enabled(&a.model.moe)) {
        status = moe_plan(&a, &experts, ep != NULL, offload_opt || offload_param, &error);
    } else if (!plan_offload(&a, offload_opt, offload_param, nvme_path, &error)) {
        status = cli_fail("plan", error);
    } else {
        ZpSearchResult result = {0};
        cli_rank_keep(&a.runs);
        const gboolean searched = search_with_offload(&a, &result, &error);
        if (searched)
            a.dominated = drop_dominated(&result);
        status = searched ? report(&a, &result) : cli_fail("plan", error);
        zp_search_result_clear(&result);
    }
    g_option_context_free(context);
    g_free(model), g_free(cluster), g_free(gpus), g_free(global_batch), g_free(seq);
    g_free(top), g_free(mp), g_free(precision), g_free(optimizer), g_free(a.ds_config);
    g_free(a.html);
    g_free(attention), g_free(reduce), g_free(room), g_free(offload_opt), g_free(impl);
    g_free(kernels), g_free(offload_param), g_free(nvme_path), g_free(a.offload_note);
    g_free(a.whole_node_note), g_free(ep), g_free(capacity), g_free(skew);
    g_free(zeropp), g_free(exclude), g_free(gpu_memory);
    cli_budget_free(&a.budget);
    cli_rank_clear(&a.runs);
    return status;
}
