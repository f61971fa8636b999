/* cli_simulate_out: what `zplan simulate` prints of one simulated step (text, JSON, the HTML
 * page) from the plan, its schedule and the simulator's result; cli_simulate runs the command. */
#ifndef CLI_SIMULATE_OUT_H
#define CLI_SIMULATE_OUT_H

#include "cli.h"
#include "sim_engine.h"
#include "zp_alloc_replay.h"
#include "zp_sched.h"

/* One simulated step and what it was simulated from, all borrowed from the caller. */
typedef struct {
    const ZpModel *model;
    const ZpHw *hw;
    const ZpPlan *plan;
    const ZpSchedule *sched;
    const SimResult *r;
    double peak_flops;
    const SimOptions *options;
    const char *schedule_path; /* --schedule FILE, or NULL for a plan's schedule */
    const GPtrArray *defaults_taken; /* with --ds-config: what the file left to defaults */
    ZpAllocStats alloc; /* the schedule's sequence through the caching allocator */
    const CliBudget *budget;   /* --tokens/--steps and --gpu-hour-price */
} CliSimReport;

/* Prints the step as JSON on stdout; 0, or the CLI's exit status when it cannot be written. */
int cli_simulate_print_json(const CliSimReport *p);

/* Prints the step as text on stdout: the verdict, throughput, breakdown, bytes and memory. */
void cli_simulate_print_human(const CliSimReport *p);

/* Bytes by which the step's peak (or its host or NVMe tier) exceeds what the cluster has;
 * 0 or less when it fits. */
double cli_simulate_bytes_over(const CliSimReport *p);

/* --html: the step as one page (cli_report) at path, titled by the plan, opening with the
 * verdict. */
gboolean cli_simulate_write_html(const CliSimReport *p, const char *path, GError **error);

#endif
