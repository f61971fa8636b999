/* cli_moe: the mixture-of-experts flags (--ep, --capacity-factor, --expert-skew) shared by the
 * subcommands, and `memory`'s expert-parallel section (zp_ep's states, tokens and all-to-all). */
#ifndef CLI_MOE_H
#define CLI_MOE_H

#include "cli.h"
#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_moe_search.h"
#include "zp_search.h"

#include <glib.h>

#define CLI_MOE_ENTRIES(ep, capacity, skew)                                                    \
    {"ep", 0, 0, G_OPTION_ARG_STRING, (ep),                                                    \
     "Expert-parallel degree: the experts split over E data-parallel ranks (default 1)", "E"}, \
    {"capacity-factor", 0, 0, G_OPTION_ARG_STRING, (capacity),                                \
     "Tokens an expert takes over the mean (default: dropless)", "C"},                         \
    {"expert-skew", 0, 0, G_OPTION_ARG_STRING, (skew),                                         \
     "The busiest expert's load over the mean, >= 1 (default 1)", "S"}

/* Parses the three flags (NULL: their defaults) into `out`; any of them given for a model
 * that is not a mixture of experts is refused, naming the flag. */
gboolean cli_moe_parse(const ZpModel *model, const char *ep, const char *capacity,
                       const char *skew, ZpExpertConfig *out, GError **error);

/* Prints, for a mixture of experts at `gpus` GPUs with plans[stage] (the four stages), the
 * expert and dense model states per stage, the routed tokens, buffers and activations of a
 * sparse layer, and its all-to-all (hw may be NULL: no time). */
void cli_moe_print_memory(const ZpModel *model, const ZpPlan plans[4], const ZpHw *hw,
                          int gpus);

/* The model states per rank of a plan at `stage`: zp_ep_model_states for a mixture of experts,
 * the paper's formula otherwise. */
double cli_moe_states_bytes(const ZpModel *model, const ZpPlan *plan, int stage,
                            ZpStateBytes bytes);

/* The expert-parallel section as JSON (a json_t *) for a plan: EP, expert and dense parameters
 * per rank, a sparse layer's tokens and buffers, its all-to-all (hw may be NULL: no time). */
void *cli_moe_json(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw);

/* A candidate zp_moe_search_simulate timed: its all-to-all seconds and model FLOPs from its run
 * (alltoall_s, model_flops), as `simulate` reports them. */
void cli_moe_read_simulated(const ZpSearchSpec *spec, ZpMoeCandidate *c);
/* Its model TFLOP/s per GPU as `simulate` reports them (its run's model FLOPs over its step):
 * NAN where no run was read. */
double cli_moe_tflops(const ZpMoeCandidate *c);

/* What `plan` prints of a mixture of experts' search. */
typedef struct {
    int top_k;               /* the plans listed */
    gboolean json;           /* as JSON (`plan --json`'s keys where they mean the same) */
    const char *html;        /* the verdict and the top plans as a page (`plan --html`), or NULL */
    const CliBudget *budget; /* plan 1's --tokens/--steps/--gpu-hour-price figures, or NULL */
    const char *ds_config;   /* where plan 1's DeepSpeed config goes (--ds-config), or NULL */
} CliMoeOutput;

/* `plan` for a mixture of experts: zp_moe_search's candidates (ep > 0: that EP only), the top
 * out->top_k and the best plan of each EP degree, with memory, step, all-to-all share and
 * tokens/s, or as out asks. Returns the exit status: 0, or 2 when nothing fits; -1 with
 * *error where the search or an output failed. */
int cli_moe_plan(const ZpSearchSpec *spec, const ZpExpertConfig *experts, gboolean ep_given,
                 const CliMoeOutput *out, GError **error);

#endif
