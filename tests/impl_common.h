/* impl_common: what the implementation-semantics test programs (test_impl,
 * test_impl_schedules) share: schedules built for a plan, their allocs counted, simulated,
 * and a category's frees. */
#ifndef IMPL_COMMON_H
#define IMPL_COMMON_H

#include "sim_engine.h"
#include "testutil.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <jansson.h>
#include <math.h>

ZpSchedule *build(const ZpModel *m, ZpImplKind impl, int stage, int dp,
                  gboolean checkpoint);

guint count_allocs(const ZpSchedule *s, ZpMemCategory cat, int unit, double bytes);

SimResult *simulate(const ZpSchedule *s);

/* The simulated peak, each category live at it and each category's own peak are those of the
 * schedule's allocs and frees walked in list order (tu_sequential_peak), as zreal runs them
 * (test_impl, test_fsdp2). */
void assert_peaks_in_list_order(const ZpSchedule *s, const SimResult *r);

/* The free of buffer id after op `from`, or the op count. */
guint free_of(const ZpSchedule *s, int id, guint from);

#endif
