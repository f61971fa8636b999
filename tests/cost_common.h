/* cost_common: what the cost-model test programs (test_cost, test_cost_calibrated) share: a
 * synthetic op table, the profiles and models they load, a tiny plan, and a schedule's step
 * time. */
#ifndef COST_COMMON_H
#define COST_COMMON_H

#include "sim_coll.h"
#include "sim_engine.h"
#include "testutil.h"
#include "zp_colltab.h"
#include "zp_cost.h"
#include "zp_hw.h"
#include "zp_model.h"
#include "zp_optable.h"
#include "zp_sched.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

/* A synthetic table: GEMM rates rising with size and falling with aspect ratio (a 4 x 3 grid),
 * every elementwise class at its own rate, eager attention flat. */
ZpOpTable synthetic_table(void);

void load_hw(const char *name, ZpHw *hw);

void load_model(const char *name, ZpModel *m);

/* tiny on the H100 profile, with the synthetic op table when `table`, and a plan of `stage` on
 * `dp` ranks at micro-batch `micro_batch` (0: the default). */
void tiny_setup(ZpHw *hw, ZpModel *m, ZpPlan *p, int stage, int dp, int micro_batch,
                gboolean table);

double step_s(const ZpModel *m, const ZpPlan *p, const ZpHw *hw);

#endif
