/* real_zero_common: what the zreal-under-mpirun test programs (test_real_zero, test_real_ds,
 * test_real_faults) share: a temporary folder, mpirun with and without a timeout, the
 * measured.json a run writes, and the total-peak runs and their predictions. */
#ifndef REAL_ZERO_COMMON_H
#define REAL_ZERO_COMMON_H

#include "zp_mem.h"
#include "testutil.h"
#include "zp_sched.h"
#include "zp_offload.h"
#include "zp_comm.h"
#include "sim_engine.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#define GLOBAL_BATCH 16

extern char *tmp_dir;

/* Runs `mpirun -np n zreal ARGS` with ZREAL_COMM_TIMEOUT_S = timeout (NULL: unset);
 * returns the exit status, stderr in *err. */
int mpirun_timeout(int n, const char *args, const char *timeout, char **err);

int mpirun(int n, const char *args, char **err);

/* The measured JSON of `mpirun -np n zreal ARGS --out TMP/NAME.json`. */
json_t *zreal_measured(int n, const char *args, const char *name);

double category(json_t *rank, const char *name);

/* Tolerance on the loss: the N-rank runs sum bf16 gradients across ranks (each partial sum
 * rounded to bf16, relative error up to 2^-9) where one rank rounds the full-batch gradient
 * once; Adam's normalised update carries such differences into the weights at about that
 * size, so the losses may differ by up to about one bf16 rounding step, 2^-9 ~ 0.2%,
 * relative. The runs measured here differ by about 1e-4. */
#define LOSS_REL_TOL (1.0 / 512)

/* Runs build/zreal ARGS as one process (no mpirun), which must succeed, and returns the
 * measured.json it wrote to `path`. */
double number_at(json_t *object, const char *key);

/* One run of the total-peak cases: tiny at 4 ranks (or `ranks`), micro-batch 4, 2 steps. */
typedef struct {
    int stage;
    ZpImplKind impl;
    gboolean checkpoint, persistent; /* persistent: DeepSpeed's default threshold, else 0 */
    double bucket;                   /* reduce_bucket_size, 0: the default */
    int accum;                       /* micro-steps, 0: one */
    int ranks;                       /* data-parallel ranks, 0: 4 */
    /* ZeRO++: qwZ, hpZ's group (0 or 1: none) and qgZ, with `per_node` ranks a node (0: all
     * in one) for their node groups (zreal's --ranks-per-node, the plan's gpus_per_node) */
    gboolean qwz;
    int hpz;
    gboolean qgz;
    int per_node;
    /* stage3_prefetch_bucket_size and stage3_max_reuse_distance 0: each module is released
     * after its forward and gathered again in backward (where hpZ gathers inside its group) */
    gboolean regather;
} PeakRun;

/* A PeakRun's ranks (4 unless it says). */
int peak_ranks(const PeakRun *p);

/* A PeakRun's plan, with zreal's CPU backend workspace listed (its run-long x, dx, staging
 * and GEMM buffers, each op's own, the logits: what `zplan simulate` lists for a profile
 * calibrated on that backend). */
ZpSchedule *peak_schedule(const PeakRun *p);

/* The simulator's result for a PeakRun's plan (peak_schedule). */
SimResult *peak_prediction(const PeakRun *p);

/* A rank's total peak, every category at that moment and every category's own peak equal the
 * simulator's: no buffer the backend holds is missing from the schedule, and each is live at
 * the same op. */
void check_total_peak(json_t *rank, const SimResult *sim);

char *peak_args(const PeakRun *p);

/* Makes the folder the runs write in (after g_test_init); runs the tests and removes it,
 * returning g_test_run's status. */
void real_zero_common_init(void);
int real_zero_common_run(void);

#endif
