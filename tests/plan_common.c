/* plan_common: the planner tests' folder and `zplan plan` runs (plan_common.h). */
#include "plan_common.h"

char *plan_tmp_dir;

char *tmp_path(const char *name)
{
    return g_build_filename(plan_tmp_dir, name, NULL);
}

ZpPlan launch_plan(int dp, int mp)
{
    ZpPlan launch;
    zp_plan_defaults(&launch, 0, dp, mp);
    return launch;
}

void plan_common_init(void)
{
    plan_tmp_dir = g_dir_make_tmp("zplan-plan-XXXXXX", NULL);
}

int plan_common_run(void)
{
    const int status = g_test_run();
    g_rmdir(plan_tmp_dir);
    g_free(plan_tmp_dir);
    return status;
}
