/* test_real_pipe: zreal runs pipelines under mpirun — GPipe and 1F1B over 2 and 4 stages,
 * interleaved, 2 data-parallel replicas of 2 stages at ZeRO-0 and -1, and tensor parallelism
 * of 2 inside each stage (TP 2 x PP 2, DP 2 x TP 2 x PP 2), and GPT-2's tiny with its tied
 * embedding (the first and last stages exchange its gradient; also at TP 2, its LayerNorms,
 * row-parallel biases and position table whole on each tensor rank) train to the loss of one rank,
 * and every stage holds and sends exactly what the simulator predicts for it (with
 * cpu_checkpointing, its host tier what its stage's schedule counts); a pipeline's schedule
 * file (zplan schedule --out) runs as its flags do. */
#include "sim_engine.h"
#include "testutil.h"
#include "zp_mem.h"
#include "zp_pipe.h"
#include "zp_sched.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#define MODEL ZP_DATA_DIR "/tests/data/llama-pp.json"
#define STEPS 6
#define MICRO_STEPS 4
#define GLOBAL_MICRO_BATCH 2 /* samples per micro-step over the data-parallel replicas */

/* test_real_zero's tolerance: the stages exchange gradients in bf16 (as Megatron and
 * DeepSpeed do) where one rank keeps them in fp32, about one bf16 rounding step. */
#define LOSS_REL_TOL (1.0 / 512)

static char *tmp_dir;

typedef struct {
    int ranks, pp, mp, zero, virtual_stages;
    const char *schedule;
    int checkpoint;    /* FALSE, TRUE, or CPU_CHECKPOINTING (with its host tier) */
    const char *model; /* NULL: MODEL (untied); "tiny": GPT-2's, its embedding tied */
    const char *order; /* NULL: the default rank order (tp-dp-pp), else --rank-order's */
} PipeRun;

#define CPU_CHECKPOINTING 2

static const char *model_of(const PipeRun *p)
{
    return p->model ? p->model : MODEL;
}

/* measured.json of zreal on `model` for STEPS steps of MICRO_STEPS micro-steps. */
static json_t *run_zreal(int ranks, const char *model, const char *args, const char *name)
{
    char *path = g_strdup_printf("%s/%s.json", tmp_dir, name);
    char *full = g_strdup_printf("--model %s --grad-accum %d --steps %d %s", model, MICRO_STEPS,
                                 STEPS, args);
    json_t *root = tu_zreal_measured(ranks, full, path);
    g_free(full);
    g_free(path);
    return root;
}

static double number(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    g_assert_nonnull(v);
    return json_number_value(v);
}

static ZpSchedule *build(const PipeRun *p, int dp)
{
    ZpModel model = tu_load_model(model_of(p));
    model.dropout = FALSE;
    ZpPlan plan;
    zp_plan_defaults(&plan, p->zero, dp, p->mp);
    plan.impl = ZP_IMPL_PAPER; /* zreal's default */
    plan.precision = ZP_PREC_BF16;
    plan.micro_batch = GLOBAL_MICRO_BATCH / dp;
    plan.grad_accum = MICRO_STEPS;
    plan.checkpoint = p->checkpoint != FALSE;
    plan.ckpt.cpu_checkpointing = p->checkpoint == CPU_CHECKPOINTING;
    plan.pipe.stages = p->pp;
    plan.pipe.virtual_stages = p->virtual_stages;
    plan.backend_workspace = TRUE; /* zreal's CPU backend's x, dx, staging and op buffers */
    g_assert_true(zp_pipe_schedule_parse(p->schedule, "--pp-schedule", &plan.pipe.schedule, NULL));
    if (p->order)
        g_assert_true(zp_rank_order_parse(p->order, "--rank-order", &plan.rank_order, NULL));
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&model, &plan, &error);
    g_assert_no_error(error);
    return s;
}

/* The categories zreal allocates as the schedule says, each stage's peak exact. */
static const ZpMemCategory exact_categories[] = {
    ZP_MEM_PARAMS, ZP_MEM_GRADS, ZP_MEM_MASTER, ZP_MEM_ADAM_M, ZP_MEM_ADAM_V, ZP_MEM_BUCKETS,
    ZP_MEM_ACTIVATIONS, ZP_MEM_CHECKPOINTS};

/* Rank r's figures against its stage's predictions: model states from the stage's layout,
 * each category's peak and the bytes sent (its DP group's collectives, its p2p sends) from the
 * simulator's per-stage results. */
static void check_rank(json_t *rank, const ZpSchedule *s, const SimResult *sim, int dp)
{
    const int r = (int)number(rank, "rank");
    json_t *pipe = json_object_get(rank, "pipeline");
    g_assert_nonnull(pipe);
    const int stage = (int)number(pipe, "stage");
    /* the world's rank r is zplan's rank_of_placed(r): TP, then PP, then DP (ZpRankOrder) */
    g_assert_cmpint(stage, ==, (zp_plan_rank_of_placed(&s->plan, r) / s->plan.mp) % s->stages);
    ZpSchedule *view = zp_sched_stage_view(s, stage);
    g_assert_cmpfloat(number(rank, "model_state_bytes"), ==, zp_sched_model_state_bytes(view));
    /* cpu_checkpointing: the host tier holds the stage's own blocks' inputs of the
     * micro-batches in flight there (its view's host bytes), each copied down and up once. */
    json_t *host = json_object_get(rank, "checkpoint_host");
    g_assert_true((host != NULL) == s->plan.ckpt.cpu_checkpointing);
    double copied = 0;
    for (guint i = 0; host && i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->stage == (uint32_t)stage && op->kind == ZP_OP_COMPUTE &&
            op->sub == ZP_COMP_HOST_COPY)
            copied += op->bytes / 2;
    }
    if (host) {
        g_assert_cmpfloat(number(host, "peak_bytes"), ==, view->host_bytes[ZP_MEM_CHECKPOINTS]);
        g_assert_cmpfloat(number(host, "down_bytes"), ==, copied);
        g_assert_cmpfloat(number(host, "up_bytes"), ==, copied);
    }
    zp_sched_free(view);
    json_t *peaks = json_object_get(rank, "category_peak_bytes");
    for (size_t i = 0; i < G_N_ELEMENTS(exact_categories); i++) {
        const ZpMemCategory c = exact_categories[i];
        g_assert_cmpfloat(number(peaks, zp_sched_mem_name(c)), ==,
                          sim->stage_category_peak_bytes[stage * ZP_MEM_N + c]);
    }
    /* The workspace (the CPU backend's x, dx and staging buffers, each op's own, the logits,
     * a head's output gradient kept until its backward; with TP 2 also each tensor-parallel
     * sum's bf16 buffer) and the total at its peak. */
    const double *cat = &sim->stage_category_peak_bytes[stage * ZP_MEM_N];
    g_test_message("rank %d (stage %d): workspace peak %.0f bytes (predicted %.0f), total "
                   "peak %.0f", r, stage, number(peaks, "workspace"), cat[ZP_MEM_WORKSPACE],
                   number(rank, "peak_memory_bytes"));
    g_assert_cmpfloat(number(peaks, "workspace"), ==, cat[ZP_MEM_WORKSPACE]);
    g_assert_cmpfloat(number(rank, "peak_memory_bytes"), ==, sim->stage_peak_bytes[stage]);
    const double *sent = &sim->stage_comm_bytes[stage * ZP_GROUP_N];
    g_assert_cmpfloat(number(pipe, "p2p_bytes"), ==, sent[ZP_GROUP_PP]);
    g_assert_cmpfloat(number(rank, "comm_bytes"), ==, sent[ZP_GROUP_DP]);
    g_assert_cmpfloat(number(rank, "tp_comm_bytes"), ==, sent[ZP_GROUP_TP]);
    g_assert_cmpfloat(sent[ZP_GROUP_PP], >, 0);
    g_assert_true((sent[ZP_GROUP_DP] > 0) == (dp > 1));
    g_assert_true((sent[ZP_GROUP_TP] > 0) == (s->plan.mp > 1));
    /* Among the p2p bytes: a tied embedding's gradient, V / mp rows of h in bf16, which the
     * first and last stages each send the other once a step. */
    double tied = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_P2P && op->sub == ZP_P2P_TIED && (int)op->stage == stage)
            tied += op->bytes;
    }
    const gboolean ends = stage == 0 || stage == s->stages - 1;
    g_assert_cmpfloat(tied, ==, s->model.tied_embeddings && ends
                                    ? 2.0 * s->model.vocab / s->plan.mp * s->model.hidden
                                    : 0.0);
}

static void test_pipe_matches_one_rank(gconstpointer data)
{
    const PipeRun *p = data;
    const char *ckpt = p->checkpoint == CPU_CHECKPOINTING ? "--checkpoint --cpu-checkpointing"
                       : p->checkpoint                    ? "--checkpoint"
                                                          : "";
    char *ref_args = g_strdup_printf("--micro-batch %d %s", GLOBAL_MICRO_BATCH, ckpt);
    json_t *ref = run_zreal(1, model_of(p), ref_args, "ref");
    const int dp = p->ranks / (p->pp * p->mp);
    char *args = g_strdup_printf("--micro-batch %d --stage %d --pp %d --mp %d --pp-schedule %s "
                                 "--virtual-stages %d %s%s%s", GLOBAL_MICRO_BATCH / dp, p->zero,
                                 p->pp, p->mp, p->schedule, p->virtual_stages, ckpt,
                                 p->order ? " --rank-order " : "", p->order ? p->order : "");
    json_t *m = run_zreal(p->ranks, model_of(p), args, "pipe");
    json_t *ref_loss = json_object_get(ref, "loss"), *loss = json_object_get(m, "loss");
    g_assert_cmpuint(json_array_size(loss), ==, STEPS);
    for (int i = 0; i < STEPS; i++) {
        const double a = json_number_value(json_array_get(loss, i));
        const double b = json_number_value(json_array_get(ref_loss, i));
        g_assert_cmpfloat(fabs(a - b) / b, <=, LOSS_REL_TOL);
    }
    /* And it learns. */
    g_assert_cmpfloat(json_number_value(json_array_get(loss, STEPS - 1)), <,
                      0.97 * json_number_value(json_array_get(loss, 0)));
    ZpSchedule *s = build(p, dp);
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    const SimOptions o = {.mode = SIM_MODE_FOLDED};
    GError *error = NULL;
    SimResult *sim = sim_engine_run(s, &hw, &o, &error);
    g_assert_no_error(error);
    json_t *ranks = json_object_get(m, "ranks");
    g_assert_cmpuint(json_array_size(ranks), ==, (size_t)p->ranks);
    for (int r = 0; r < p->ranks; r++)
        check_rank(json_array_get(ranks, (size_t)r), s, sim, dp);
    sim_result_free(sim);
    zp_sched_free(s);
    json_decref(m);
    json_decref(ref);
    g_free(args);
    g_free(ref_args);
}

/* `zplan schedule --out` writes a pipeline's schedule with its stage views, and zreal
 * --schedule runs that file as it runs the flags: the same losses and, rank by rank, the same
 * model states, peaks and bytes. A file whose stage views are not the plan's is refused. */
static void test_schedule_file(void)
{
    static const char *const plan = "--pp 2 --mp 2 --pp-schedule 1f1b --stage 1 "
                                    "--micro-batch 2 --grad-accum 4";
    static const char *const figures[] = {"model_state_bytes", "comm_bytes", "tp_comm_bytes",
                                          "category_peak_bytes", "pipeline"};
    char *path = g_strdup_printf("%s/pipe-schedule.json", tmp_dir);
    char *out = g_strdup_printf("%s/pipe-measured.json", tmp_dir);
    /* eager attention, zreal's own default, which the run by flags below trains with (zplan's
     * default without --cluster is flash2) */
    char *args = g_strdup_printf("schedule --model tiny --gpus 4 --precision bf16 --impl paper "
                                 "--attention eager --no-dropout %s --out %s", plan, path);
    TuRun w = tu_zplan(args);
    g_assert_true(g_spawn_check_wait_status(w.status, NULL));
    g_assert_nonnull(strstr(w.out, "over 2 pipeline stages of 2 ranks each"));
    tu_free(&w);
    char *from_file = g_strdup_printf("--schedule %s --steps 3", path);
    char *from_flags = g_strdup_printf("--model tiny %s --steps 3", plan);
    json_t *a = tu_zreal_measured(4, from_file, out), *b = tu_zreal_measured(4, from_flags, out);
    g_assert_true(json_equal(json_object_get(a, "loss"), json_object_get(b, "loss")));
    for (size_t r = 0; r < 4; r++) {
        json_t *x = json_array_get(json_object_get(a, "ranks"), r);
        json_t *y = json_array_get(json_object_get(b, "ranks"), r);
        for (size_t f = 0; f < G_N_ELEMENTS(figures); f++) {
            json_t *fx = json_object_get(x, figures[f]), *fy = json_object_get(y, figures[f]);
            if (strcmp(figures[f], "pipeline") == 0) /* its waits are timings */
                fx = json_object_get(fx, "p2p_bytes"), fy = json_object_get(fy, "p2p_bytes");
            g_assert_true(fx && json_equal(fx, fy));
        }
    }
    /* Stage views that are not the plan's. */
    json_t *file = json_load_file(path, 0, NULL);
    json_t *stages = json_object_get(file, "stages");
    g_assert_cmpuint(json_array_size(stages), ==, 2);
    json_t *state = json_object_get(json_array_get(stages, 0), "state_bytes");
    json_object_set_new(state, "params", json_real(1.0));
    g_assert_cmpint(json_dump_file(file, path, 0), ==, 0);
    TuRun r = tu_zreal_mpirun(1, from_file, NULL);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "key \"stages\": the 2 stage views"));
    tu_free(&r);
    g_remove(path);
    json_decref(file), json_decref(a), json_decref(b);
    g_free(from_file), g_free(from_flags), g_free(args), g_free(out), g_free(path);
}

/* What zreal's pipelines do not run, refused on every rank with one line. */
static void test_pipe_refusals(void)
{
    static const struct {
        int ranks;
        const char *args, *message;
    } cases[] = {
        {2, "--model " MODEL " --pp 2 --stage 2", "ZeRO-2 and ZeRO-3 are incompatible"},
        {3, "--model " MODEL " --pp 2", "--pp: MP 1 x PP 2 = 2 does not divide"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        TuRun r = tu_zreal_mpirun(cases[i].ranks, cases[i].args, NULL);
        g_assert_false(g_spawn_check_wait_status(r.status, NULL));
        g_assert_nonnull(strstr(r.err, cases[i].message));
        tu_free(&r);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zreal-pipe-XXXXXX", NULL);
    static const struct {
        const char *name;
        PipeRun run;
    } runs[] = {
        {"/real-pipe/gpipe-2", {2, 2, 1, 0, 1, "gpipe", FALSE, NULL, NULL}},
        {"/real-pipe/1f1b-2", {2, 2, 1, 0, 1, "1f1b", FALSE, NULL, NULL}},
        {"/real-pipe/gpipe-4", {4, 4, 1, 0, 1, "gpipe", FALSE, NULL, NULL}},
        {"/real-pipe/1f1b-4", {4, 4, 1, 0, 1, "1f1b", FALSE, NULL, NULL}},
        {"/real-pipe/1f1b-4-checkpoint", {4, 4, 1, 0, 1, "1f1b", TRUE, NULL, NULL}},
        {"/real-pipe/1f1b-2-cpu-checkpointing",
         {2, 2, 1, 0, 1, "1f1b", CPU_CHECKPOINTING, NULL, NULL}},
        {"/real-pipe/interleaved-2x2", {2, 2, 1, 0, 2, "interleaved", FALSE, NULL, NULL}},
        {"/real-pipe/dp2-pp2-zero0", {4, 2, 1, 0, 1, "1f1b", FALSE, NULL, NULL}},
        {"/real-pipe/dp2-pp2-zero1", {4, 2, 1, 1, 1, "1f1b", FALSE, NULL, NULL}},
        {"/real-pipe/dp2-pp2-zero1-gpipe", {4, 2, 1, 1, 1, "gpipe", FALSE, NULL, NULL}},
        {"/real-pipe/tp2-pp2-1f1b", {4, 2, 2, 0, 1, "1f1b", FALSE, NULL, NULL}},
        {"/real-pipe/dp2-tp2-pp2-zero1", {8, 2, 2, 1, 1, "1f1b", FALSE, NULL, NULL}},
        /* Megatron-Core's --use-tp-pp-dp-mapping: world ranks 0, 1 the first replica's stages,
         * where the default puts ranks 0, 1 in stage 0 */
        {"/real-pipe/dp2-pp2-zero1-tp-pp-dp", {4, 2, 1, 1, 1, "1f1b", FALSE, NULL, "tp-pp-dp"}},
        {"/real-pipe/tied-1f1b-2", {2, 2, 1, 0, 1, "1f1b", FALSE, "tiny", NULL}},
        {"/real-pipe/tied-dp2-pp2-zero1-gpipe", {4, 2, 1, 1, 1, "gpipe", FALSE, "tiny", NULL}},
        {"/real-pipe/tied-tp2-pp2-1f1b", {4, 2, 2, 0, 1, "1f1b", FALSE, "tiny", NULL}},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(runs); i++)
        g_test_add_data_func(runs[i].name, &runs[i].run, test_pipe_matches_one_rank);
    g_test_add_func("/real-pipe/schedule-file", test_schedule_file);
    g_test_add_func("/real-pipe/refusals", test_pipe_refusals);
    const int status = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return status;
}
