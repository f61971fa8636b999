/* fuzz_schedule: the schedule readers (zreal --schedule's and simulate --schedule's graph) on
 * arbitrary bytes; what they accept must simulate, and small ones run a step of zreal's engine. */
#include "fuzz.h"
#include "real_comm.h"
#include "real_cpu.h"
#include "real_engine.h"
#include "sim_engine.h"
#include "zp_sched.h"

#include <glib.h>
#include <stdlib.h>

extern void openblas_set_num_threads(int threads);

/* An accepted schedule small enough to execute in a few milliseconds. */
static gboolean small(const ZpSchedule *s)
{
    return s->total_elems <= 200000 && s->plan.dp <= 8 && s->model.layers <= 4 &&
           s->model.vocab <= 1024 && s->model.seq_len <= 64 && s->plan.micro_batch <= 4 &&
           s->ops->len <= 4096;
}

static void run_engine(const ZpSchedule *s)
{
    RealBackend *be = real_cpu_backend_new();
    RealComm *comm = real_comm_emulated_new(be, s->plan.dp, s->plan.dp - 1);
    const RealTrainConfig cfg = {.lr = 1e-3f, .seed = 1};
    GError *error = NULL;
    RealEngine *engine = real_engine_new(s, be, comm, &cfg, &error);
    double loss;
    if (engine)
        real_engine_step(engine, 0, &loss, &error);
    g_clear_error(&error);
    real_engine_free(engine);
    comm->destroy(comm);
    be->destroy(be);
}

int fuzz_schedule(const uint8_t *data, size_t size)
{
    static ZpHw hw;
    static gboolean loaded;
    if (!loaded) {
        if (!(loaded = zp_hw_load("dgx-h100", &hw, NULL)))
            abort();
        openblas_set_num_threads(1);
    }
    GError *error = NULL;
    const char *path = fuzz_input_path("schedule", data, size);
    const SimOptions options = {.mode = SIM_MODE_FOLDED};
    /* The same bytes as an op graph (zplan simulate --schedule): what it accepts simulates. */
    ZpSchedule *graph = zp_sched_read_graph(path, &error);
    g_clear_error(&error);
    if (graph)
        sim_result_free(sim_engine_run(graph, &hw, &options, &error));
    g_clear_error(&error);
    zp_sched_free(graph);
    ZpSchedule *s = zp_sched_read_json(path, &error);
    g_clear_error(&error);
    if (!s)
        return 0;
    sim_result_free(sim_engine_run(s, &hw, &options, &error));
    g_clear_error(&error);
    if (small(s))
        run_engine(s);
    zp_sched_free(s);
    return 0;
}
FUZZ_ENTRY(fuzz_schedule)
