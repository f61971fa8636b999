/* Tests that resources stay bounded and are said up front: absurd requests refused in one line
 * before they allocate, and deep models built in time linear in their layers. */
#include "testutil.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <string.h>
#include <time.h>

static char *tmp_dir;

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 100,000 layers under DeepSpeed's stage 3: the coordinator's trace found each unit's modules
 * by scanning every module (O(layers^2), 321 s); now one pass. Built in a subprocess so that a
 * quadratic build is cut off (60 s of wall clock on a shared machine) instead of hanging; the
 * bound is on CPU time, which other processes do not inflate. */
static void test_deepspeed_deep_model(void)
{
    if (g_test_subprocess()) {
        ZpModel m = tu_load_model("tiny");
        m.layers = 100000;
        ZpPlan p;
        zp_plan_defaults(&p, 3, 8, 1);
        p.micro_batch = 1;
        p.impl = ZP_IMPL_DEEPSPEED;
        const double wall0 = zp_now_s(), cpu0 = cpu_s();
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        const double cpu = cpu_s() - cpu0;
        g_printerr("# deepspeed stage 3, 100,000 layers: %u ops, %.2f s CPU, %.2f s wall\n",
                   s->ops->len, cpu, zp_now_s() - wall0);
        g_assert_cmpfloat(cpu, <, 5);
        zp_sched_free(s);
        return;
    }
    g_test_trap_subprocess(NULL, 60 * G_USEC_PER_SEC, G_TEST_SUBPROCESS_INHERIT_STDOUT | G_TEST_SUBPROCESS_INHERIT_STDERR);
    g_test_trap_assert_passed();
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zplan-limits-XXXXXX", NULL);
    g_test_add_func("/limits/deepspeed-deep-model", test_deepspeed_deep_model);
    const int status = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return status;
}
