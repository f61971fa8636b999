/* cli_pipe: the pipeline, sequence-parallel and rank-order flags, and what simulate prints of
 * the stages and of where the plan's rank order puts each group. */
#include "cli_pipe.h"
#include "cli.h"
#include "zp_pipe.h"
#include "zp_util.h"

#include <stdio.h>

#define GB 1e9

gboolean cli_pipe_stages(const CliPipeFlags *f, int64_t gpus, int mp, int *pp, GError **error)
{
    if (!cli_int(f->pp, "--pp", 1, 65535, 1, pp, error))
        return FALSE;
    if (gpus % ((int64_t)mp * *pp) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--pp: MP %d x PP %d = %" G_GINT64_FORMAT " does not divide --gpus %"
                    G_GINT64_FORMAT, mp, *pp, (int64_t)mp * *pp, gpus);
        return FALSE;
    }
    return TRUE;
}

gboolean cli_pipe_plan(const CliPipeFlags *f, int pp, ZpPlan *plan, GError **error)
{
    int v = 1;
    plan->pipe.stages = pp;
    plan->sequence_parallel = f->sequence_parallel;
    if (!cli_int(f->virtual_stages, "--virtual-stages", 1, 65535, 1, &v, error) ||
        (f->rank_order &&
         !zp_rank_order_parse(f->rank_order, "--rank-order", &plan->rank_order, error)) ||
        (f->schedule &&
         !zp_pipe_schedule_parse(f->schedule, "--pp-schedule", &plan->pipe.schedule, error)) ||
        (f->partition &&
         !zp_partition_parse(f->partition, "--partition-method", &plan->pipe.partition, error)))
        return FALSE;
    plan->pipe.virtual_stages = v;
    if (pp == 1 && (f->schedule || v > 1 || f->partition)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--pp-schedule/--virtual-stages/--partition-method: need --pp of 2 or more");
        return FALSE;
    }
    if (f->sequence_parallel && plan->mp == 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--sequence-parallel: splits the sequence over the tensor-parallel group; "
                    "needs --mp of 2 or more");
        return FALSE;
    }
    return TRUE;
}

gboolean cli_pipe_given(const CliPipeFlags *f)
{
    return f->pp || f->schedule || f->virtual_stages || f->partition || f->sequence_parallel ||
           f->rank_order;
}

/* Nodes a group of `ranks` members `stride` ranks apart spans (consecutive ranks fill a node). */
static int64_t group_nodes(int64_t ranks, int64_t stride, int gpus_per_node)
{
    const int64_t span = (ranks - 1) * stride + 1;
    return span <= gpus_per_node ? 1 : MIN(ranks, (span + gpus_per_node - 1) / gpus_per_node);
}

/* Whether all, some or no neighbouring stages share a node when stage k sits at +stride k. */
static const char *neighbours_on_node(int64_t stride, int P, int gpus_per_node)
{
    return stride * P <= gpus_per_node ? "all" : stride >= gpus_per_node ? "no" : "some";
}

void cli_pipe_print_placement(const ZpPlan *plan, const ZpHw *hw)
{
    const int P = zp_plan_pp(plan), gpn = hw->gpus_per_node;
    const gboolean dp_inside = plan->rank_order == ZP_ORDER_TP_DP_PP;
    const int64_t dp_apart = zp_plan_placed_dp_stride(plan);
    const int64_t pp_apart = zp_plan_placed_pp_stride(plan);
    const int64_t tp_nodes = group_nodes(plan->mp, 1, gpn);
    const int64_t dp_nodes = group_nodes(plan->dp, dp_apart, gpn);
    printf("Placement: %s (TP innermost, ranks r..r+%d; %s), a TP group spans %" G_GINT64_FORMAT
           " node(s)%s, a DP group %" G_GINT64_FORMAT,
           zp_rank_order_name(plan->rank_order), plan->mp - 1,
           dp_inside ? "Megatron-Core's default and DeepSpeed's pipeline topology"
                     : "Megatron-Core's --use-tp-pp-dp-mapping",
           tp_nodes, tp_nodes > 1 ? " (its all-reduces cross the NIC)" : "", dp_nodes);
    if (P > 1)
        printf(" (its ranks %" G_GINT64_FORMAT " apart), and %s stage neighbours (%" G_GINT64_FORMAT
               " ranks apart) sit on one node.\n",
               dp_apart, neighbours_on_node(pp_apart, P, gpn), pp_apart);
    else
        printf(".\n");
}

void cli_pipe_print_stages(const SimResult *r)
{
    if (r->stages <= 1)
        return;
    printf("\n  pipeline stage   peak memory    compute     bubble (of %.4f s to the flush)  "
           "bytes sent dp / tp / pp\n", r->flush_s);
    for (int k = 0; k < r->stages; k++) {
        const double *bytes = &r->stage_comm_bytes[k * ZP_GROUP_N];
        printf("    %3d          %9.3f GB %9.4f s %9.4f s %5.1f%%           %.3f / %.3f / %.3f GB\n",
               k, r->stage_peak_bytes[k] / GB, r->stage_compute_s[k], r->stage_bubble_s[k],
               r->flush_s > 0 ? 100 * r->stage_bubble_s[k] / r->flush_s : 0.0,
               cli_dp_bytes(bytes) / GB, bytes[ZP_GROUP_TP] / GB,
               bytes[ZP_GROUP_PP] / GB);
    }
}

/* Stage k's object, built key by key as json_pack("{s:f, s:f, s:f, s:f, s:{s:f, s:f, s:f}}")
 * built it, without the format read anew each stage (64 stages: 0.62 M instructions of
 * Megatron 1T's JSON, 9,600 a stage); NULL where a figure is no finite number, as json_pack
 * gave (json_real refuses one), which then adds no stage. */
static json_t *stage_json(const SimResult *r, int k)
{
    static const char *const keys[] = {"peak_memory_bytes", "compute_s", "bubble_s",
                                       "bubble_fraction", "dp", "tp", "pp"};
    const double *bytes = &r->stage_comm_bytes[k * ZP_GROUP_N];
    const double figures[G_N_ELEMENTS(keys)] = {
        r->stage_peak_bytes[k], r->stage_compute_s[k], r->stage_bubble_s[k],
        r->flush_s > 0 ? r->stage_bubble_s[k] / r->flush_s : 0.0,
        cli_dp_bytes(bytes), bytes[ZP_GROUP_TP], bytes[ZP_GROUP_PP]};
    json_t *reals[G_N_ELEMENTS(keys)];
    gboolean finite = TRUE;
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++)
        finite = (reals[i] = json_real(figures[i])) != NULL && finite;
    if (!finite) {
        for (size_t i = 0; i < G_N_ELEMENTS(keys); i++)
            json_decref(reals[i]);
        return NULL;
    }
    json_t *stage = json_object(), *comm = json_object();
    for (size_t i = 0; i < 4; i++)
        json_object_set_new_nocheck(stage, keys[i], reals[i]);
    for (size_t i = 4; i < G_N_ELEMENTS(keys); i++)
        json_object_set_new_nocheck(comm, keys[i], reals[i]);
    json_object_set_new_nocheck(stage, "comm_bytes", comm);
    return stage;
}

void cli_pipe_json(json_t *root, const ZpPlan *plan, const SimResult *r)
{
    json_t *stages = json_array();
    for (int k = 0; k < r->stages; k++)
        json_array_append_new(stages, stage_json(r, k));
    json_object_set_new(root, "pp", json_integer(zp_plan_pp(plan)));
    json_object_set_new(root, "virtual_stages", json_integer(zp_plan_vstages(plan)));
    json_object_set_new(root, "pp_schedule",
                        json_string(zp_pipe_schedule_name(plan->pipe.schedule)));
    json_object_set_new(root, "sequence_parallel", json_boolean(plan->sequence_parallel));
    json_object_set_new(root, "placement",
                        json_string(plan->rank_order == ZP_ORDER_TP_DP_PP
                                        ? "tp, dp, pp (tp fastest)"
                                        : "tp, pp, dp (tp fastest)"));
    json_object_set_new(root, "flush_s", json_real(r->flush_s));
    json_object_set_new(root, "stages", stages);
}

void cli_pipe_free(CliPipeFlags *f)
{
    g_free(f->pp);
    g_free(f->schedule);
    g_free(f->virtual_stages);
    g_free(f->partition);
    g_free(f->rank_order);
}
