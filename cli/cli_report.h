/* cli_report: a simulated step as one self-contained HTML page (inline SVG, no script or
 * network), for `zplan report` and `zplan simulate --html`. */
#ifndef CLI_REPORT_H
#define CLI_REPORT_H

#include "sim_engine.h"
#include "zp_hw.h"
#include "zp_sched.h"

#include <glib.h>

/* Writes the page to path, atomically: the title and verdict, the reported rank's memory over
 * the step stacked by category with the GPU's capacity, its streams as a Gantt chart, time by
 * op class, bytes by group. r must have been run with record_timeline. */
gboolean cli_report_html(const char *path, const char *title, const char *verdict,
                         const ZpSchedule *s, const SimResult *r, const ZpHw *hw, GError **error);

/* One plan of `plan --html`'s page: its description and simulated figures. */
typedef struct {
    const char *what;     /* "stage 3, mp 1 x dp 16, micro 2 x accum 1, ..." */
    double step_s, samples_per_s, need_bytes, tflops; /* tflops NAN: not known (n/a) */
} CliReportPlan;

/* `plan --html`: the verdict, then the top plans side by side: a table and two bar charts,
 * samples/s and the memory each needs against the GPU's capacity. */
gboolean cli_report_plans_html(const char *path, const char *title, const char *verdict,
                               const CliReportPlan *plans, int n, double capacity_bytes,
                               GError **error);

#endif
