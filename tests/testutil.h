/* testutil: what the tests share — running build/zplan (or any program) and collecting its
 * exit status, stdout and stderr, and loading a shipped model or profile. Linked into every
 * test program. */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include "zp_hw.h"
#include "zp_inventory.h"
#include "zp_model.h"
#include "zp_sched.h"

#include <glib.h>

typedef struct {
    int status; /* wait status, for g_spawn_check_wait_status */
    char *out, *err;
} TuRun;

/* Runs build/zplan with `args` (split as a shell would) and waits for it. */
TuRun tu_zplan(const char *args);

/* Runs `command` (split as a shell would; found on PATH) with environment `envp` (NULL: this
 * process's) and waits for it. */
TuRun tu_run(const char *command, char **envp);

void tu_free(TuRun *run);

/* This process's environment for mpirun (g_strfreev it): as root too, one BLAS thread a rank,
 * Open MPI's ob1 pml named and a failed job torn down without pausing, unless the environment
 * names its own OMPI_MCA_odls_base_sigkill_timeout (a test of stopped ranks:
 * tu_stopped_teardown). */
char **tu_mpirun_environ(void);

/* For the tests whose ranks are stopped or killed: mpirun's default teardown of a failed job
 * (tu_mpirun_environ), set in this process's environment before their runs. */
void tu_stopped_teardown(void);

/* Runs `mpirun --oversubscribe -np n build/zreal ARGS` (as root too, one BLAS thread a rank)
 * with ZREAL_COMM_TIMEOUT_S = timeout (NULL: unset) and waits for it. */
TuRun tu_zreal_mpirun(int n, const char *args, const char *timeout);

/* Runs build/zreal with `args --out path` under `mpirun -np n` (tu_zreal_mpirun), or as one
 * process (n = 0: --emulate, one BLAS thread), which must succeed (its stderr printed when
 * not), and returns the measured.json it wrote (a json_t *, which the caller decrefs), the
 * file removed. */
void *tu_zreal_measured(int n, const char *args, const char *path);

/* Runs build/zplan with `args`, which must succeed, and parses its stdout as JSON
 * (a json_t *, which the caller decrefs). */
void *tu_zplan_json(const char *args);

/* The same for a command that must exit with `exit_status` (2: the plan does not fit). */
void *tu_zplan_json_exit(const char *args, int exit_status);

/* Both schedules' communicators (zp_sched_groups) are the same: names, ranks, and where a group
 * has more than one rank, its shape (strides and runs). */
void tu_assert_same_groups(const ZpSchedule *a, const ZpSchedule *b);

/* The schedule's allocs and frees walked in list order, as zreal executes them: the total
 * peak (returned), each category live at it (`at`, unless NULL) and each category's own peak
 * (`own`). */
double tu_sequential_peak(const ZpSchedule *s, double at[ZP_MEM_N], double own[ZP_MEM_N]);

/* The same for a command that must exit with 0 or 2 (does not fit). */
void *tu_zplan_json_fit_or_not(const char *args);

/* A 2-layer mixture of experts small enough to count by hand (test_moe, test_moe_sched):
 * h 64, 4 heads (MHA), SwiGLU, RMSNorm, no biases, an untied 128-word vocabulary, sequence
 * 16; 4 experts of 32, top 2, both layers sparse. */
void tu_small_moe(ZpModel *m);

/* `name` in a fresh temporary folder (zplan-PREFIX-XXXXXX), its path returned and the folder
 * in *dir; tu_tmp_file_remove removes both and frees both strings. */
char *tu_tmp_file(const char *prefix, const char *name, char **dir);
void tu_tmp_file_remove(char *path, char *dir);

/* Runs build/zplan with `args`, which must succeed, and frees what it printed. */
void tu_zplan_ok(const char *args);
/* Runs build/zplan with `args`, which must be refused as bad input: exit status 1, one line on
 * stderr holding `says`, nothing on stdout. */
void tu_zplan_refused(const char *args, const char *says);

/* A shipped model or hwprofile by name (or path); a load that fails fails the test. */
ZpModel tu_load_model(const char *name);
ZpHw tu_load_hw(const char *name);

/* The bytes and FLOPs of the kernels inventory `inv` lists for op `kind` of layer 0. */
ZpInvTotals tu_inv_totals(const ZpInventory *inv, const ZpModel *m, const ZpPlan *p,
                          ZpComputeKind kind);

#endif
