/* cli_moe: parses the expert-parallel flags and prints what zp_ep says of a plan's mixture of
 * experts: where its states go, what a sparse layer routes and buffers, what its all-to-all
 * moves and costs. */
#include "cli_moe.h"
#include "cli.h"
#include "cli_report.h"
#include "sim_engine.h"
#include "zp_sched.h"
#include "zp_dsconfig.h"
#include "zp_ep.h"
#include "zp_moe_search.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>

#define GB 1e9

gboolean cli_moe_parse(const ZpModel *model, const char *ep, const char *capacity,
                       const char *skew, ZpExpertConfig *out, GError **error)
{
    double e = 1, c = 0, s = 1;
    const char *given = ep         ? "--ep"
                        : capacity ? "--capacity-factor"
                        : skew     ? "--expert-skew"
                                   : NULL;
    if (given && !zp_moe_enabled(&model->moe)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s is not a mixture of experts", given,
                    model->name);
        return FALSE;
    }
    if ((ep && !zp_parse_number(ep, "--ep", 1, 1048576, TRUE, &e, error)) ||
        (capacity &&
         !zp_parse_number(capacity, "--capacity-factor", 0.01, 1000, FALSE, &c, error)) ||
        (skew && !zp_parse_number(skew, "--expert-skew", 1, 1000, FALSE, &s, error)))
        return FALSE;
    out->ep = (int)e;
    out->capacity_factor = c;
    out->skew = s;
    return TRUE;
}

double cli_moe_states_bytes(const ZpModel *model, const ZpPlan *plan, int stage,
                            ZpStateBytes bytes)
{
    if (zp_moe_enabled(&model->moe))
        return zp_ep_model_states(model, plan, stage, bytes).total.total_bytes;
    return zp_mem_model_states((double)zp_model_param_count(model), stage, plan->dp, plan->mp,
                               bytes).total_bytes;
}

void cli_moe_print_memory(const ZpModel *model, const ZpPlan plans[4], const ZpHw *hw, int gpus)
{
    const ZpPlan *p = &plans[0];
    const ZpMoe *moe = &model->moe;
    const int ep = zp_plan_ep(p);
    const ZpStateBytes sb = zp_plan_state_bytes(p->precision, p->optimizer);
    printf("\nMixture of experts at %d GPUs: %" G_GINT64_FORMAT " experts, top %" G_GINT64_FORMAT
           ", %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT " layers sparse; EP %d (%" G_GINT64_FORMAT
           " experts a rank), expert data-parallel %d, DP %d (GB):\n",
           gpus, moe->experts, moe->top_k, zp_moe_sparse_layers(moe, model->layers),
           model->layers, ep, moe->experts / ep, zp_plan_edp(p), p->dp);
    printf("  %-28s %9s %9s %9s %9s\n", "term", "stage 0", "stage 1", "stage 2", "stage 3");
    ZpEpStates s[4];
    for (int stage = 0; stage <= 3; stage++)
        s[stage] = zp_ep_model_states(model, &plans[stage], stage, sb);
    printf("  %-28s %9.3f %9.3f %9.3f %9.3f\n", "expert states (over DP/EP)",
           s[0].expert.total_bytes / GB, s[1].expert.total_bytes / GB,
           s[2].expert.total_bytes / GB, s[3].expert.total_bytes / GB);
    printf("  %-28s %9.3f %9.3f %9.3f %9.3f\n", "dense states (over DP)",
           s[0].dense.total_bytes / GB, s[1].dense.total_bytes / GB,
           s[2].dense.total_bytes / GB, s[3].dense.total_bytes / GB);
    const ZpEpActivations a = zp_ep_activations(model, p);
    printf("  expert parameters per rank %.4g, dense %.4g (router and shared experts among them)\n",
           s[0].expert_params, s[0].dense_params);
    printf("  a sparse layer per micro-batch: %.0f tokens routed to %.0f copies; the busiest "
           "rank's experts take %.0f (%s)\n",
           a.tokens, a.routed_tokens, a.received_tokens,
           p->experts.capacity_factor > 0 ? "capacity factor, padded" : "dropless, x skew");
    printf("  %-44s %9.3f\n", "router probabilities and indices", a.router_bytes / GB);
    printf("  %-44s %9.3f\n", "dispatch buffers (send + receive)", a.dispatch_bytes / GB);
    printf("  %-44s %9.3f\n", "combine buffers (send + receive)", a.combine_bytes / GB);
    printf("  %-44s %9.3f\n", "expert activations", a.expert_act_bytes / GB);
    printf("  %-44s %9.3f\n", "one sparse layer's saved activations", a.sparse_layer_bytes / GB);
    printf("  %-44s %9.3f\n", "one dense layer's saved activations", a.dense_layer_bytes / GB);
    const ZpEpAlltoall x = zp_ep_alltoall(model, p, hw);
    if (ep == 1) {
        printf("  no all-to-all at EP 1: every rank holds every expert\n");
        return;
    }
    printf("  all-to-all per sparse layer: %d a micro-batch of %.4g MB a rank (%.4g MB to its "
           "node, %.4g MB across nodes)",
           x.calls_per_layer, x.send_bytes / 1e6, x.intra_bytes / 1e6, x.inter_bytes / 1e6);
    if (hw)
        printf(", %.3f ms each on %s; %.3f s a step", x.time_s * 1e3, hw->name, x.step_time_s);
    printf("\n");
}

/* A simulated candidate's all-to-all seconds and model FLOPs, as `simulate` reports them: the
 * search's own run of it, kept (cli_rank_keep: the ranking callback returns the step and the
 * memory only), or where none was kept a run as the search makes one (cli_rank_simulate: built
 * short where the fold counts the rest); the closed form's all-to-all where the schedule
 * cannot be built or timed. Each printed candidate's whole schedule built and stepped again was
 * half of `plan` deepseek-v3 on 256 GPUs' time. */
void cli_moe_read_simulated(const ZpSearchSpec *spec, ZpMoeCandidate *c)
{
    SimResult *r = spec->rank == cli_rank_by_simulation
                       ? cli_rank_take((const CliRankContext *)spec->rank_ctx, &c->plan)
                       : NULL;
    if (!r)
        r = cli_rank_simulate(spec->model, spec->hw, &c->plan, 0, NULL, NULL);
    if (r) {
        c->alltoall_s = r->alltoall_s;
        c->model_flops = r->model_flops;
    }
    sim_result_free(r);
}

static void print_candidate(int rank, const ZpMoeCandidate *c)
{
    const ZpPlan *p = &c->plan;
    printf("  %4d %4d %4d %4d %4d %5d %5d %5d %4s %9s %9.1f %9.3f %7.1f%% %12.0f %9s%s\n",
           rank, zp_plan_ep(p), p->mp, zp_plan_etp(p), zp_plan_pp(p), p->zero.stage,
           p->micro_batch, p->grad_accum,
           p->checkpoint ? "full" : p->selective_recompute ? "sel" : "no",
           zp_dispatcher_name(p->experts.dispatcher), c->memory_bytes / GB, c->step_s,
           100.0 * c->alltoall_s / c->step_s, c->tokens_per_s,
           c->simulated ? "simulated" : "closed", c->fits ? "" : "  (does not fit)");
}

/* "ETP" the ranks each expert is split over (the TP degree, or 1: whole), "dispatch" the
 * tokens' way to the experts (ZpDispatcher), "comm" its collectives' share of the step (the
 * all-to-alls, or the all-gather dispatcher's gathers and reduce-scatters). */
static void print_header(void)
{
    printf("  %4s %4s %4s %4s %4s %5s %5s %5s %4s %9s %9s %9s %8s %12s %9s\n", "#", "EP", "TP",
           "ETP", "PP", "stage", "micro", "accum", "ckpt", "dispatch", "GB/GPU", "step s", "comm",
           "tokens/s", "judged");
}

/* The best plan of each EP (or PP) degree, as ranked: why the others lost. */
static void print_best_of(const GArray *c, const char *what, gboolean pp)
{
    printf("\nThe best plan of each %s degree (why the others lost):\n", what);
    print_header();
    for (guint i = 0; i < c->len; i++) {
        const ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        const int degree = pp ? zp_plan_pp(&x->plan) : zp_plan_ep(&x->plan);
        gboolean first = TRUE;
        for (guint j = 0; j < i && first; j++) {
            const ZpPlan *y = &g_array_index(c, ZpMoeCandidate, j).plan;
            first = (pp ? zp_plan_pp(y) : zp_plan_ep(y)) != degree;
        }
        if (first)
            print_candidate((int)i + 1, x);
    }
}

double cli_moe_tflops(const ZpMoeCandidate *c)
{
    return c->model_flops > 0 ? c->model_flops / c->step_s / 1e12 : NAN;
}

/* Samples a step of plan x trains. */
static double step_samples(const ZpMoeCandidate *x)
{
    return (double)x->plan.dp * x->plan.micro_batch * x->plan.grad_accum;
}

/* A candidate as `plan --json` lists it: the dense plans' keys where they mean the same. */
static json_t *candidate_json(const ZpSearchSpec *spec, const ZpMoeCandidate *x)
{
    const ZpPlan *p = &x->plan;
    const double samples = step_samples(x);
    const double tokens_per_s = samples * (double)spec->model->seq_len / x->step_s;
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:b, s:s}", "ep",
                          zp_plan_ep(p), "mp", p->mp, "dp", p->dp, "pp", zp_plan_pp(p), "stage",
                          p->zero.stage, "micro_batch", p->micro_batch, "grad_accum",
                          p->grad_accum, "global_batch", (json_int_t)samples, "checkpoint",
                          p->checkpoint,
                          "judged", x->simulated ? "simulated" : "closed form");
    if (p->selective_recompute && !p->checkpoint)
        json_object_set_new(o, "recompute", json_string("selective"));
    json_object_set_new(o, "step_time_s", json_real(x->step_s));
    json_object_set_new(o, "samples_per_s", json_real(samples / x->step_s));
    json_object_set_new(o, "tokens_per_s", json_real(tokens_per_s));
    json_object_set_new(o, "tokens_per_s_per_gpu", json_real(tokens_per_s / spec->gpus));
    const double tflops = cli_moe_tflops(x);
    if (!isnan(tflops)) { /* its run read: as simulate reports it */
        json_object_set_new(o, "tflops_per_gpu", json_real(tflops));
        json_object_set_new(o, "mfu", json_real(tflops * 1e12 /
                                                zp_hw_peak_flops(spec->hw, p->precision)));
    }
    json_object_set_new(o, "alltoall_s", json_real(x->alltoall_s));
    json_object_set_new(o, "need_bytes", json_real(x->memory_bytes));
    json_object_set_new(o, "fits", json_boolean(x->fits));
    if (x->simulated) {
        json_object_set_new(o, "closed_form_step_time_s", json_real(x->closed_step_s));
        json_object_set_new(o, "closed_form_need_bytes", json_real(x->closed_memory_bytes));
    }
    json_object_set_new(o, "plan", zp_plan_to_json(p));
    return o;
}

/* `plan --json` for a mixture of experts: the top `top_k`, the first of them "best" where it
 * fits, with its budget. Returns the exit status as cli_moe_plan does, or -1 with *error where
 * writing failed. */
static int print_json(const ZpSearchSpec *spec, const ZpExpertConfig *experts, const GArray *c,
                      guint screened, guint timed, const CliMoeOutput *out, GError **error)
{
    const int top_k = out->top_k;
    const ZpModel *m = spec->model;
    json_t *candidates = json_array();
    for (guint i = 0; i < c->len && (int)i < top_k; i++)
        json_array_append_new(candidates,
                              candidate_json(spec, &g_array_index(c, ZpMoeCandidate, i)));
    const gboolean any = c->len > 0 && g_array_index(c, ZpMoeCandidate, 0).fits;
    json_t *root = json_pack(
        "{s:s, s:I, s:I, s:s, s:s, s:i, s:f, s:s, s:s, s:{s:I, s:I, s:f, s:o}, s:i, s:i}",
        "model", m->name, "params", (json_int_t)zp_model_param_count(m), "seq_len",
        (json_int_t)m->seq_len, "cluster", spec->hw->name, "gpu", spec->hw->gpu, "gpus",
        spec->gpus, "gpu_memory_bytes", spec->hw->gpu_memory_bytes, "precision",
        zp_precision_name(spec->precision), "optimizer", zp_optimizer_name(spec->optimizer),
        "experts", "experts", (json_int_t)m->moe.experts, "top_k", (json_int_t)m->moe.top_k,
        "skew", MAX(experts->skew, 1.0), "capacity_factor",
        experts->capacity_factor > 0 ? json_real(experts->capacity_factor) : json_null(),
        "screened", (int)screened, "simulated", (int)timed);
    json_object_set_new(root, "global_batch", spec->global_batch > 0
                                                  ? json_integer(spec->global_batch)
                                                  : json_null());
    json_object_set_new(root, "best",
                        any ? json_incref(json_array_get(candidates, 0)) : json_null());
    json_object_set_new(root, "candidates", candidates);
    const ZpMoeCandidate *best = any ? &g_array_index(c, ZpMoeCandidate, 0) : NULL;
    json_t *budget = best && out->budget
                         ? cli_budget_json(out->budget, best->step_s,
                                           step_samples(best) * (double)m->seq_len, spec->gpus)
                         : NULL;
    if (budget)
        json_object_set_new(root, "budget", budget);
    const gboolean ok = zp_json_write(root, NULL, error);
    json_decref(root);
    return !ok ? -1 : any ? 0 : 2;
}

/* `plan --html` for a mixture of experts: the verdict on plan 1 and the top `top_k` side by
 * side (cli_report), each as the table lists it. */
static gboolean write_html(const ZpSearchSpec *spec, const GArray *c, int top_k,
                           const char *path, GError **error)
{
    const int n = (int)MIN(c->len, (guint)MAX(top_k, 0));
    CliReportPlan *plans = g_new0(CliReportPlan, MAX(n, 1));
    char **whats = g_new0(char *, n + 1);
    for (int i = 0; i < n; i++) {
        const ZpMoeCandidate *x = &g_array_index(c, ZpMoeCandidate, i);
        const ZpPlan *p = &x->plan;
        whats[i] = g_strdup_printf("stage %d, EP %d x TP %d%s x PP %d, micro %d x accum %d, "
                                   "%s%s",
                                   p->zero.stage, zp_plan_ep(p), p->mp,
                                   p->sequence_parallel ? " (SP)" : "", zp_plan_pp(p),
                                   p->micro_batch, p->grad_accum,
                                   p->checkpoint             ? "ckpt"
                                   : p->selective_recompute ? "selective"
                                                            : "no ckpt",
                                   x->simulated ? "" : " (closed form)");
        const double samples = (double)p->dp * p->micro_batch * p->grad_accum;
        plans[i] = (CliReportPlan){whats[i], x->step_s, samples / x->step_s, x->memory_bytes,
                                   cli_moe_tflops(x)};
    }
    const ZpMoeCandidate *first = c->len ? &g_array_index(c, ZpMoeCandidate, 0) : NULL;
    char *what = g_strdup_printf("%s (stage %d, EP %d)",
                                 first && first->fits ? "plan 1" : "the closest plan",
                                 first ? first->plan.zero.stage : 0,
                                 first ? zp_plan_ep(&first->plan) : 1);
    char *verdict = first ? cli_verdict(what, first->simulated
                                                  ? "allocator-reserved peak + reserve"
                                                  : "closed form + reserve",
                                        first->memory_bytes, spec->hw->gpu_memory_bytes)
                          : g_strdup("No plan.");
    char *title = g_strdup_printf("Plans for %s (a mixture of experts) on %d x %s (%s)",
                                  spec->model->name, spec->gpus, spec->hw->gpu, spec->hw->name);
    const gboolean ok = cli_report_plans_html(path, title, verdict, plans, n,
                                              spec->hw->gpu_memory_bytes, error);
    g_free(title), g_free(verdict), g_free(what), g_free(plans);
    g_strfreev(whats);
    return ok;
}

/* Where plan 1's DeepSpeed config went and where its experts are set: AutoEP's
 * expert_parallel section in the file, dropless (zp_dsconfig_to_json), or with a capacity
 * factor a deepspeed.moe.layer.MoE's ep_size and capacity_factor in the model's code, which
 * simulate takes as flags beside the file. */
static void print_ds_config_written(const char *path, const ZpPlan *plan)
{
    printf("\nDeepSpeed config of plan 1 written to %s", path);
    const int ep = zp_plan_ep(plan);
    if (ep > 1 && plan->experts.capacity_factor <= 0)
        printf(" (its expert_parallel section is AutoEP's, autoep_size %d: every token "
               "routed)\n", ep);
    else if (ep > 1)
        printf("\n  (EP %d with capacity factor %g is deepspeed.moe.layer.MoE's ep_size and "
               "capacity_factor, in the model's code: simulate --ds-config %s --ep %d "
               "--capacity-factor %g)\n",
               ep, plan->experts.capacity_factor, path, ep, plan->experts.capacity_factor);
    else
        printf("\n");
}

int cli_moe_plan(const ZpSearchSpec *spec, const ZpExpertConfig *experts, gboolean ep_given,
                 const CliMoeOutput *out, GError **error)
{
    const int top_k = out->top_k;
    GArray *all = zp_moe_search_run(spec, MAX(experts->skew, 1.0), experts->capacity_factor,
                                     error);
    if (!all)
        return -1;
    /* The closed form's shortlist timed by the simulator, as the dense search ranks plans. */
    const guint timed = zp_moe_search_simulate(spec, all, (guint)MAX(top_k, 1) * 4);
    for (guint i = 0; i < timed; i++)
        cli_moe_read_simulated(spec, &g_array_index(all, ZpMoeCandidate, i));
    GArray *c = g_array_new(FALSE, FALSE, sizeof(ZpMoeCandidate));
    for (guint i = 0; i < all->len; i++) {
        const ZpMoeCandidate *x = &g_array_index(all, ZpMoeCandidate, i);
        if (!ep_given || zp_plan_ep(&x->plan) == MAX(experts->ep, 1))
            g_array_append_val(c, *x);
    }
    const guint screened = all->len;
    g_array_unref(all);
    const gboolean any = c->len > 0 && g_array_index(c, ZpMoeCandidate, 0).fits;
    if ((out->html && !write_html(spec, c, top_k, out->html, error)) ||
        (out->ds_config && any &&
         !zp_dsconfig_write(&g_array_index(c, ZpMoeCandidate, 0).plan, out->ds_config, error))) {
        g_array_unref(c);
        return -1;
    }
    if (out->json) {
        const int status = print_json(spec, experts, c, screened, timed, out, error);
        g_array_unref(c);
        return status;
    }
    const ZpModel *m = spec->model;
    printf("Plans for %s (a mixture of experts: %" G_GINT64_FORMAT " experts, top %" G_GINT64_FORMAT
           ") on %d GPUs of %s, sequence %" G_GINT64_FORMAT ", skew %g, %s.\n"
           "Screened in closed form: memory as zp_ep and zp_mem count it; compute by the cost\n"
           "model over the schedule's compute ops (dense and sparse blocks, the busiest rank's\n"
           "experts); the all-to-all as NCCL's grouped send/recv (zp_ep)%s; dense gradients\n"
           "reduced over DP, expert gradients over DP/EP; pipelines (1F1B, uniform split, with\n"
           "--global-batch) by their busiest stage and bubble. %u plans, the best and each EP\n"
           "and PP degree's best few, then simulated: their step, memory and all-to-all are their schedules'.\n%s\n",
           m->name, m->moe.experts, m->moe.top_k, spec->gpus, spec->hw->name, m->seq_len,
           MAX(experts->skew, 1.0),
           experts->capacity_factor > 0 ? "capacity factor" : "dropless",
           spec->impl == ZP_IMPL_MEGATRON
               ? ", and Megatron's\nallgather dispatcher as ring gathers and reduce-scatters "
                 "over TP x EP"
               : "",
           timed,
           spec->impl == ZP_IMPL_MEGATRON
               ? "TP > 1 runs with sequence parallelism, as Megatron-Core trains a mixture of "
                 "experts, its experts split over TP or whole (ETP 1).\n"
           : spec->impl == ZP_IMPL_DEEPSPEED && spec->mp != 1
               ? "TP > 1 keeps DeepSpeed's experts whole on each tensor rank (ETP 1, EP "
                 "across the tensor ranks) or\nsplit over TP (enable_expert_tensor_parallelism, "
                 "the slots gathered over TP before them), each rank\ndispatching 1/TP of the "
                 "slots and the combined slots all-gathered over TP (sharded_moe.py).\n"
               : "");
    print_header();
    for (guint i = 0; i < c->len && (int)i < top_k; i++)
        print_candidate((int)i + 1, &g_array_index(c, ZpMoeCandidate, i));
    print_best_of(c, "EP", FALSE);
    print_best_of(c, "PP", TRUE);
    if (any) {
        const ZpMoeCandidate *b = &g_array_index(c, ZpMoeCandidate, 0);
        printf("\nPlan 1: %.1f GB a GPU of %.1f%s (closed form: states %.1f, activations, "
               "buffers and reserve %.1f); a step of %.3f s%s, %s %.3f s; closed form "
               "compute %.3f, TP all-reduces %.3f, data-parallel %.3f beside them.\n",
               b->memory_bytes / GB, spec->hw->gpu_memory_bytes / GB,
               b->simulated ? " simulated" : "", b->states_bytes / GB, b->residual_bytes / GB,
               b->step_s, b->simulated ? " simulated" : "",
               b->plan.experts.dispatcher == ZP_DISPATCH_ALLGATHER
                   ? "the all-gather dispatcher's gathers and reduce-scatters"
                   : "all-to-all",
               b->alltoall_s, b->compute_s, b->tp_s, b->dp_s);
        const int P = zp_plan_pp(&b->plan);
        if (P > 1)
            printf("PP %d: 1F1B, the %" G_GINT64_FORMAT " blocks split uniformly (the busiest "
                   "stage %" G_GINT64_FORMAT "), %d micro-batches a step: a bubble of (P - 1) / "
                   "m = %.1f%% of the ideal.\n",
                   P, spec->model->layers, (spec->model->layers + P - 1) / P,
                   b->plan.grad_accum, 100.0 * (P - 1) / b->plan.grad_accum);
        char *budget = out->budget ? cli_budget_line(out->budget, b->step_s,
                                                     step_samples(b) * (double)m->seq_len,
                                                     spec->gpus)
                                   : NULL;
        if (budget)
            printf("Plan 1: %s\n", budget);
        g_free(budget);
        if (out->ds_config)
            print_ds_config_written(out->ds_config, &b->plan);
    } else {
        printf("\nNo plan fits in %.1f GB a GPU.\n", spec->hw->gpu_memory_bytes / GB);
    }
    g_array_unref(c);
    return any ? 0 : 2;
}

void *cli_moe_json(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw)
{
    const ZpStateBytes sb = zp_plan_state_bytes(plan->precision, plan->optimizer);
    const ZpEpStates s = zp_ep_model_states(model, plan, plan->zero.stage, sb);
    const ZpEpActivations a = zp_ep_activations(model, plan);
    const ZpEpAlltoall x = zp_ep_alltoall(model, plan, hw);
    json_t *alltoall = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "calls_per_layer",
                                 x.calls_per_layer, "send_bytes", x.send_bytes, "intra_bytes",
                                 x.intra_bytes, "inter_bytes", x.inter_bytes, "step_bytes",
                                 x.step_bytes, "step_time_s", x.step_time_s);
    json_object_set_new(alltoall, "time_s", hw ? json_real(x.time_s) : json_null());
    return json_pack("{s:i, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
                     "s:o}",
                     "ep", zp_plan_ep(plan), "experts", (json_int_t)model->moe.experts,
                     "top_k", (json_int_t)model->moe.top_k, "expert_params_per_rank",
                     s.expert_params, "dense_params_per_rank", s.dense_params, "tokens",
                     a.tokens, "routed_tokens", a.routed_tokens, "received_tokens",
                     a.received_tokens, "expert_tokens", a.expert_tokens, "router_bytes",
                     a.router_bytes, "dispatch_bytes",
                     a.dispatch_bytes, "combine_bytes", a.combine_bytes, "expert_act_bytes",
                     a.expert_act_bytes, "sparse_layer_bytes", a.sparse_layer_bytes, "alltoall",
                     alltoall);
}
