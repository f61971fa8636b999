/* impl_common: schedules built, counted and simulated for the implementation tests
 * (impl_common.h). */
#include "impl_common.h"

ZpSchedule *build(const ZpModel *m, ZpImplKind impl, int stage, int dp,
                  gboolean checkpoint)
{
    ZpPlan p;
    zp_plan_defaults(&p, stage, dp, 1);
    p.impl = impl;
    p.checkpoint = checkpoint;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, &p, &error);
    g_assert_no_error(error);
    return s;
}

guint count_allocs(const ZpSchedule *s, ZpMemCategory cat, int unit, double bytes)
{
    guint count = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        count += op->kind == ZP_OP_ALLOC && op->sub == cat && op->unit == unit &&
                 op->bytes == bytes;
    }
    return count;
}

SimResult *simulate(const ZpSchedule *s)
{
    ZpHw hw;
    GError *error = NULL;
    g_assert_true(zp_hw_load("dgx-a100-80g", &hw, &error));
    /* The profile's kernel rates too (its per-class rates, not the roofline): the schedule's
     * orders, not the op times, must make the simulated peak zreal's list-order peak. */
    SimOptions options = {0};
    SimResult *r = sim_engine_run(s, &hw, &options, &error);
    g_assert_no_error(error);
    return r;
}

/* The free of buffer id after op `from`, or the op count. */
guint free_of(const ZpSchedule *s, int id, guint from)
{
    guint i = from;
    while (i < s->ops->len && !(zp_sched_op(s, i)->kind == ZP_OP_FREE &&
                                zp_sched_op(s, i)->buffer == id))
        i++;
    return i;
}

void assert_peaks_in_list_order(const ZpSchedule *s, const SimResult *r)
{
    double at[ZP_MEM_N], own[ZP_MEM_N];
    const double peak = tu_sequential_peak(s, at, own);
    g_test_message("simulated peak %.0f, in list order %.0f", r->peak_memory_bytes, peak);
    g_assert_cmpfloat(r->peak_memory_bytes, ==, peak);
    for (int c = 0; c < ZP_MEM_N; c++) {
        g_assert_cmpfloat(r->peak_breakdown_bytes[c], ==, at[c]);
        g_assert_cmpfloat(r->category_peak_bytes[c], ==, own[c]);
    }
}
