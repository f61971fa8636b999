/* zp_schedsize: how big a schedule will be, estimated before it is built or read, and the caps
 * that keep a request's memory bounded (zp_budget); and the bytes a schedule's buffers take. */
#ifndef ZP_SCHEDSIZE_H
#define ZP_SCHEDSIZE_H

#include "zp_model.h"
#include "zp_plan.h"
#include "zp_sched_graph.h"

#include <glib.h>

/* Ops a built schedule may hold (8 GB at ZP_SCHED_OP_BYTES): 100,000 layers under DeepSpeed's
 * stage 3 with checkpointing make 4.6 million a micro-step. */
#define ZP_SCHED_MAX_OPS 5e7
/* Bytes an op costs while it is built: 88 for ZpOp, its dependencies and the builder's per-op
 * state (137 measured at 3.8 million ops); the simulator checks its own state (sim_engine). */
#define ZP_SCHED_OP_BYTES 160.0
/* Ops a schedule file may hold, and what reading one may take an op. The readers stream
 * "ops" (zp_sched_read_file: under 200 bytes an op, the op read and zreal's reading's copy
 * of the builder's to compare; 151 MB for Megatron 1T's 921,794, simulated), but a file the
 * stream gives up on (one the tree reader may refuse, a FIFO) is read as one Jansson tree,
 * each op an object of some ten keys, about 1 KB (a file of 10^7 ops took 10 GB to read):
 * the check budgets that. */
#define ZP_SCHED_FILE_MAX_OPS 4e6
#define ZP_SCHED_FILE_OP_BYTES 1024.0
/* Bytes a unit's [offset, elems] costs while zp_sched_write_json holds it as JSON (an array
 * and two integers, with malloc's overhead); its ops are written one at a time, so hold
 * nothing an op. */
#define ZP_SCHED_JSON_UNIT_BYTES 256.0

/* An upper estimate of the ops zp_sched_build makes for model and plan, from what multiplies
 * them: the units (128 ops each a micro-step, their gradient buckets included; DeepSpeed's
 * stage 3 with checkpointing makes 46), stage 1-2's all-gather chunks (allgather_bucket_size)
 * and stage 3's optimizer sub-groups (sub_group_size), 4 ops each. */
double zp_schedsize_estimate_ops(const ZpModel *model, const ZpPlan *plan);

/* The op count zp_sched_build may reach for this machine: ZP_SCHED_MAX_OPS, or fewer where the
 * memory available holds fewer at ZP_SCHED_OP_BYTES. */
double zp_schedsize_max_ops(void);

/* Refuses, before anything is allocated, a plan whose estimate is past the cap or the memory
 * available: "the schedule of MODEL: about N ops (X GB), past the cap ...". */
gboolean zp_schedsize_check_plan(const ZpModel *model, const ZpPlan *plan, GError **error);

/* Refuses a regular schedule file before it is parsed (a FIFO or a device is left to the
 * loader: it cannot be read twice): its ops counted by streaming the text for
 * "kind" keys (a few MB of buffer whatever the file's size), against ZP_SCHED_FILE_MAX_OPS and
 * the memory available at ZP_SCHED_FILE_OP_BYTES (the whole-tree reading's, which a file the
 * streamed reading gives up on takes). */
gboolean zp_schedsize_check_file(const char *path, GError **error);

/* The most bytes a rank holds at once running the schedule in list order: the step-long state
 * plus the allocs less the frees so far (zreal's engine allocates exactly these). */
double zp_schedsize_peak_bytes(const ZpSchedule *s);

#endif
