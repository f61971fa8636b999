/* zp_pipe: where the stage boundaries fall and in what order a stage runs its forwards and
 * backwards; the schedule builder (zp_sched) turns each action into ops and p2p sends. */
#include "zp_pipe.h"
#include "zp_util.h"

#include <string.h>

/* ---- partition ------------------------------------------------------------------------- */

/* A run of units [i, j) may form a chunk when it holds a block: not the embedding or the
 * head alone. */
static gboolean has_block(int i, int j, int n)
{
    return !(j - i == 1 && (i == 0 || i == n - 1));
}

/* DeepSpeed's partition_balanced solves the linear partition problem (the heaviest part as
 * light as can be) by dynamic programming; so does this, over the units' parameter counts,
 * with every chunk holding a block. O(chunks n^2) for n = L + 2 units. */
static void balance(const ZpModel *model, int chunks, int *first_unit)
{
    const int n = (int)model->layers + 2;
    double *prefix = g_new0(double, n + 1);
    for (int u = 0; u < n; u++)
        prefix[u + 1] = prefix[u] + (double)zp_model_unit_elems(model, u);
    /* best[k * (n + 1) + j]: the lightest bottleneck of units [0, j) in k chunks. */
    double *best = g_new(double, (gsize)(chunks + 1) * (gsize)(n + 1));
    int *cut = g_new0(int, (gsize)(chunks + 1) * (gsize)(n + 1));
    for (gsize i = 0; i < (gsize)(chunks + 1) * (gsize)(n + 1); i++)
        best[i] = G_MAXDOUBLE;
    best[0] = 0;
    for (int k = 1; k <= chunks; k++)
        for (int j = 1; j <= n; j++)
            for (int i = k - 1; i < j; i++) {
                const double before = best[(k - 1) * (n + 1) + i];
                if (before == G_MAXDOUBLE || !has_block(i, j, n))
                    continue;
                const double heaviest = MAX(before, prefix[j] - prefix[i]);
                if (heaviest < best[k * (n + 1) + j]) {
                    best[k * (n + 1) + j] = heaviest;
                    cut[k * (n + 1) + j] = i;
                }
            }
    first_unit[chunks] = n;
    for (int k = chunks; k > 0; k--)
        first_unit[k - 1] = cut[k * (n + 1) + first_unit[k]];
    g_free(prefix);
    g_free(best);
    g_free(cut);
}

gboolean zp_pipe_partition(const ZpModel *model, int chunks, ZpPartition method, int *first_unit,
                           GError **error)
{
    const int L = (int)model->layers;
    if (chunks < 1 || chunks > L) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "pp: %d pipeline chunks (stages x virtual stages) for %d layers; every "
                    "chunk needs at least one block", chunks, L);
        return FALSE;
    }
    if (method == ZP_PARTITION_PARAMETERS) {
        balance(model, chunks, first_unit);
        return TRUE;
    }
    /* Blocks evenly, the first L mod chunks chunks one more; the embedding joins chunk 0 and
     * the head the last (Megatron's placement). */
    first_unit[0] = 0;
    int block = 1;
    for (int c = 1; c < chunks; c++) {
        block += L / chunks + (c - 1 < L % chunks ? 1 : 0);
        first_unit[c] = block;
    }
    first_unit[chunks] = L + 2;
    return TRUE;
}

int zp_pipe_heavy_stages(const ZpModel *model, const ZpPlan *plan)
{
    const int pp = zp_plan_pp(plan);
    if (pp < 2 || plan->pipe.schedule != ZP_PIPE_1F1B ||
        plan->pipe.partition != ZP_PARTITION_UNIFORM || model->layers < (int64_t)pp)
        return 0;
    return (int)(model->layers % pp);
}

/* ---- schedules ------------------------------------------------------------------------- */

/* The actions being listed: the 2 m V of them are made room for at once and written through
 * a cursor (a GLib append each checked the room by a division and grew the array by copies:
 * plan --3d gpt-1t/4096 lists 121,000; zp_array_extend's room check and the array's length
 * stored each action were 10 of narayanan21-t1-529.6b's 28 instructions an action). Past
 * G_MAXUINT / 2 actions (more than an array's length holds) the cursor is none and GLib's
 * append says why it cannot. */
typedef struct {
    GArray *a;
    ZpPipeAction *at; /* the next action's place; NULL: appended */
} Actions;

G_ALWAYS_INLINE static inline void push(Actions *x, int micro, int chunk, gboolean backward)
{
    const ZpPipeAction action = {micro, chunk, backward};
    if (G_LIKELY(x->at))
        *x->at++ = action;
    else
        g_array_append_val(x->a, action);
}

/* The list made, its length that of the actions written. */
static GArray *listed(Actions *x)
{
    if (x->at)
        x->a->len = (guint)(x->at - (ZpPipeAction *)x->a->data);
    return x->a;
}

/* Megatron's get_model_chunk_id and microbatch id for the k-th forward or backward of an
 * interleaved stage: groups of P micro-batches go through chunk 0, 1, .. V-1 (backwards
 * through V-1 .. 0). A cursor walks k's group, chunk and micro-batch in the group in turn, where
 * each action divided k by P V and P (narayanan21-t1-529.6b: 29,400 actions, 55 instructions
 * each). */
typedef struct {
    int group, v, i; /* k = (group V + v) P + i */
} Interleaved;

static Interleaved interleaved_at(int k, int P, int V)
{
    const int in_group = k % (P * V);
    return (Interleaved){k / (P * V), in_group / P, in_group % P};
}

/* Pushes the cursor's action and moves it on to k + 1. */
G_ALWAYS_INLINE static inline void interleaved_push(Actions *a, Interleaved *c, int P, int V,
                                                    int stage, gboolean backward)
{
    const int v = backward ? V - 1 - c->v : c->v;
    push(a, c->group * P + c->i, v * P + stage, backward);
    if (++c->i == P) {
        c->i = 0;
        if (++c->v == V)
            c->v = 0, c->group++;
    }
}

int zp_pipe_warmup(ZpPipeSchedule schedule, int stages, int virtual_stages, int micro, int stage)
{
    const int P = stages, m = MAX(micro, 0);
    if (schedule == ZP_PIPE_GPIPE)
        return m;
    if (schedule == ZP_PIPE_1F1B)
        return MIN(P - stage - 1, m);
    const int V = MAX(virtual_stages, 1), total = m * V;
    return m == P ? total : MIN((P - stage - 1) * 2 + (V - 1) * P, total);
}

GArray *zp_pipe_actions(ZpPipeSchedule schedule, int stages, int virtual_stages, int micro,
                        int stage)
{
    Actions x = {g_array_new(FALSE, FALSE, sizeof(ZpPipeAction)), NULL};
    Actions *a = &x;
    const int P = stages, m = micro;
    const guint64 n = 2 * (guint64)MAX(m, 0) *
                      (guint64)(schedule == ZP_PIPE_INTERLEAVED ? MAX(virtual_stages, 1) : 1);
    if (n <= G_MAXUINT / 2) { /* each schedule below lists exactly n */
        g_array_set_size(x.a, (guint)n);
        x.at = (ZpPipeAction *)x.a->data;
    }
    if (schedule == ZP_PIPE_GPIPE) {
        for (int i = 0; i < m; i++)
            push(a, i, stage, FALSE);
        for (int i = 0; i < m; i++)
            push(a, i, stage, TRUE);
        return listed(a);
    }
    if (schedule == ZP_PIPE_1F1B) {
        const int warmup = zp_pipe_warmup(schedule, P, 1, m, stage);
        for (int i = 0; i < warmup; i++)
            push(a, i, stage, FALSE);
        for (int i = 0; i < m - warmup; i++) {
            push(a, warmup + i, stage, FALSE);
            push(a, i, stage, TRUE);
        }
        for (int i = m - warmup; i < m; i++)
            push(a, i, stage, TRUE);
        return listed(a);
    }
    const int V = virtual_stages, total = m * V;
    const int warmup = zp_pipe_warmup(schedule, P, V, m, stage);
    Interleaved fwd = interleaved_at(0, P, V), bwd = fwd; /* the next forward's, backward's k */
    for (int k = 0; k < warmup; k++)
        interleaved_push(a, &fwd, P, V, stage, FALSE);
    for (int i = 0; i < total - warmup; i++) {
        interleaved_push(a, &fwd, P, V, stage, FALSE);
        interleaved_push(a, &bwd, P, V, stage, TRUE);
    }
    for (int k = total - warmup; k < total; k++)
        interleaved_push(a, &bwd, P, V, stage, TRUE);
    return listed(a);
}

gboolean zp_pipe_check(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    const int P = zp_plan_pp(plan), V = zp_plan_vstages(plan);
    const char *bad = NULL;
    if (plan->pipe.stages < 0 || plan->pipe.virtual_stages < 0)
        bad = "pp/virtual-stages: must be at least 1";
    else if (plan->pipe.schedule >= ZP_PIPE_N || plan->pipe.partition >= ZP_PARTITION_N)
        bad = "pp-schedule: unknown schedule or partition method";
    else if (V > 1 && plan->pipe.schedule != ZP_PIPE_INTERLEAVED)
        bad = "virtual-stages: more than one model chunk per stage needs --pp-schedule "
              "interleaved";
    else if (plan->pipe.schedule == ZP_PIPE_INTERLEAVED && P > 1 && V < 2)
        bad = "pp-schedule: interleaved needs --virtual-stages of 2 or more";
    else if (plan->pipe.schedule == ZP_PIPE_INTERLEAVED && P > 1 && plan->grad_accum % P != 0)
        bad = "grad-accum: the interleaved schedule needs the number of micro-batches to be a "
              "multiple of the pipeline stages (Megatron's check)";
    else if (P > 1 && plan->zero.stage >= 2)
        /* deepspeed/runtime/pipe/engine.py PipelineEngine.__init__:
         * assert self.zero_optimization_stage() < ZeroStageEnum.gradients,
         * "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" */
        bad = "stage: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (DeepSpeed's "
              "PipelineEngine refuses them: deepspeed/runtime/pipe/engine.py; zplan's pipelines "
              "take ZeRO as it does, under every --impl); use stage 0 or 1 with --pp";
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
        return FALSE;
    }
    if (P * V > model->layers) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "pp: %d stages x %d virtual stages exceed the model's %" G_GINT64_FORMAT
                    " layers; every model chunk needs at least one block",
                    P, V, model->layers);
        return FALSE;
    }
    return TRUE;
}
