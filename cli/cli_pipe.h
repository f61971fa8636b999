/* cli_pipe: the 3D-parallel flags (--pp, --pp-schedule, --virtual-stages, --partition-method,
 * --sequence-parallel) into a plan, and the per-stage lines and rank placement of a result. */
#ifndef CLI_PIPE_H
#define CLI_PIPE_H

#include "sim_engine.h"
#include "zp_hw.h"
#include "zp_plan.h"

#include <glib.h>
#include <jansson.h>

typedef struct {
    char *pp, *schedule, *virtual_stages, *partition, *rank_order;
    gboolean sequence_parallel;
} CliPipeFlags;

/* The flags' entries (6 and the NULL end) for a GOption table. */
#define CLI_PIPE_ENTRIES(f)                                                                      \
    {"pp", 0, 0, G_OPTION_ARG_STRING, &(f)->pp,                                                  \
     "Pipeline-parallel stages P (default 1); DP = gpus / (MP x P)", "P"},                        \
        {"pp-schedule", 0, 0, G_OPTION_ARG_STRING, &(f)->schedule,                              \
         "Pipeline schedule 1f1b (default), gpipe or interleaved", "S"},                        \
        {"virtual-stages", 0, 0, G_OPTION_ARG_STRING, &(f)->virtual_stages,                     \
         "Model chunks per stage for the interleaved schedule (default 1)", "V"},               \
        {"partition-method", 0, 0, G_OPTION_ARG_STRING, &(f)->partition,                        \
         "Layers over stages: uniform (default) or parameters (DeepSpeed's)", "M"},             \
        {"sequence-parallel", 0, 0, G_OPTION_ARG_NONE, &(f)->sequence_parallel,                 \
         "Megatron's sequence parallelism over the tensor-parallel group", NULL},               \
        {"rank-order", 0, 0, G_OPTION_ARG_STRING, &(f)->rank_order,                             \
         "Where ranks sit, fastest first: tp-dp-pp (default: Megatron-Core's and DeepSpeed's) "  \
         "or tp-pp-dp (Megatron-Core's --use-tp-pp-dp-mapping)", "O"}

/* Pipeline stages from --pp (1 when absent); fails naming --pp when it is not a whole number
 * from 1 to 65535 or mp x pp does not divide gpus. */
gboolean cli_pipe_stages(const CliPipeFlags *f, int64_t gpus, int mp, int *pp, GError **error);

/* Fills plan->pipe, plan->sequence_parallel and plan->rank_order from the flags (after
 * cli_pipe_stages); fails naming the flag. */
gboolean cli_pipe_plan(const CliPipeFlags *f, int pp, ZpPlan *plan, GError **error);

/* Whether any of the flags was given. */
gboolean cli_pipe_given(const CliPipeFlags *f);

/* One line on where the ranks sit (the plan's ZpRankOrder) and which of the groups leave a
 * node. */
void cli_pipe_print_placement(const ZpPlan *plan, const ZpHw *hw);

/* With pipeline stages, a line per stage: peak memory, compute, bubble, bytes sent. */
void cli_pipe_print_stages(const SimResult *r);

/* {"pp", "virtual_stages", "pp_schedule", "sequence_parallel", "placement", "flush_s",
 * "stages": [{"peak_memory_bytes", "compute_s", "bubble_s", "bubble_fraction",
 * "comm_bytes": {"dp", "tp", "pp"}}]} into root. */
void cli_pipe_json(json_t *root, const ZpPlan *plan, const SimResult *r);

void cli_pipe_free(CliPipeFlags *f);

#endif
