/* plan_common: what the planner's test programs (test_plan, test_search, test_plan_dsconfig)
 * share: a temporary folder and paths in it, and `zplan plan` run. */
#ifndef PLAN_COMMON_H
#define PLAN_COMMON_H

#include "cli.h"
#include "zp_dsconfig.h"
#include "zp_mem.h"
#include "zp_sched.h"
#include "zp_search.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

extern char *plan_tmp_dir;

char *tmp_path(const char *name);

ZpPlan launch_plan(int dp, int mp);

/* Makes the folder (after g_test_init); runs the tests and removes it, returning
 * g_test_run's status. */
void plan_common_init(void);
int plan_common_run(void);

#endif
