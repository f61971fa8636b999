/* sim_common: what the simulator's test programs (test_sim, test_sim_slow, test_sim_file,
 * test_sim_plan) share: the A100 profile and GPT-2 model they load, a temporary folder, and
 * schedules built by hand and run. */
#ifndef SIM_COMMON_H
#define SIM_COMMON_H

#include "sim_coll.h"
#include "sim_engine.h"
#include "zp_alloc_replay.h"
#include "zp_comm.h"
#include "zp_sched.h"
#include "zp_util.h"

#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#define GIB 1073741824.0
#define US 1e-6

extern ZpHw a100;
extern ZpModel gpt2;
extern char *sim_tmp_dir;

void assert_close(double got, double want, double rel);
/* assert_close for a simulated time against a hand computation of n_durations durations in
 * a row: each may be rounded to the clock's grid by half a quantum (SIM_CLOCK_HALF_Q_S). */
/* Every figure of two replays of the caching allocator, bit for bit; _events: and the
 * events they folded. */
void assert_same_alloc(const ZpAllocStats *f, const ZpAllocStats *u);
void assert_same_alloc_events(const ZpAllocStats *f, const ZpAllocStats *u);
void assert_close_grid(double got, double want, double rel, int n_durations);

ZpSchedule *hand_schedule(int dp, int mp);

/* A GPT of `layers` blocks, hidden 1024, 16 heads, sequence 1024 and `vocab` tokens: small
 * enough to build 64 stages of it quickly (test_sim_fold, test_sim_extend). */
ZpModel sim_gpt_model(int layers, int vocab);

uint32_t add_op(ZpSchedule *s, ZpOp op, const uint32_t *deps, uint32_t n_deps);
/* The most dependencies an op of s waits on (over 255: the engine's wide ops). */
uint32_t widest_op(const ZpSchedule *s);

ZpOp allreduce(double bytes, ZpGroup group, ZpStream stream);

SimResult *run(const ZpSchedule *s, const ZpHw *hw, SimMode mode);

typedef struct {
    int stage, dp, mp, accum;
    gboolean checkpoint, overlap;
} Case;

ZpSchedule *build_case(const Case *c);

/* The plans whose results test_sim_plan's /sim/plan/frozen-results holds frozen (models,
 * profiles, stages and degrees of all kinds): FROZEN_PLANS of them. */
typedef struct {
    const char *model, *hw;
    int stage, dp, mp, accum;
    gboolean checkpoint, overlap;
} FrozenPlan;

#define FROZEN_PLANS 15
extern const FrozenPlan frozen_plans[FROZEN_PLANS];

/* A frozen plan's schedule, and in *hw its profile at the line rates the figures were frozen
 * with. */
ZpSchedule *frozen_schedule(const FrozenPlan *c, ZpHw *hw);

/* Every figure of two results, bit for bit (the JSON prints nothing else of them; test_sim_scale,
 * test_sim_contend). */
void assert_same_figures(const SimResult *a, const SimResult *b);

/* n doubles equal as floats (g_assert_cmpfloat ==). */
void assert_same_doubles(const double *a, const double *b, size_t n);

/* The step's totals, bit for bit: step, compute, exposed comm, optimizer, idle, CPU optimizer,
 * offload transfer, model and recompute FLOPs, peak memory and model states, flush, all-to-all. */
void assert_same_totals(const SimResult *f, const SimResult *u);

/* The per-stream, per-group, per-category and per-stage figures of got, as want's, over want's
 * stages (test_sim_fold's fold against the unfolded run, test_sim_slow's rank classes against
 * every rank). */
void assert_same_breakdowns(const SimResult *got, const SimResult *want);

/* Loads the profile and the model and makes the folder (after g_test_init); runs the tests
 * and removes the folder, returning g_test_run's status. */
void sim_common_init(void);
int sim_common_run(void);

#endif
