/* zp_schedcheck: the validator every reader of a schedule file runs before using it, so that
 * nothing downstream (zreal's engine, the simulator) indexes an array with an unchecked value.
 *
 * It walks the ops in list order, as zreal executes them, and checks each against the model,
 * the plan and the buffers live at that point: unit and micro-step ranges, each compute op's
 * unit, gathered parameters, landing buckets and checkpoints being live where it needs them,
 * each collective's element range against the flat layout and its bucket, byte counts against
 * what the layout gives, buffer ids that are allocated once, used while live and freed once
 * with the size and category they were allocated with. It needs the schedule's layout (units,
 * offsets, partition), which zp_sched_read_json rebuilds from the file's model and plan. */
#ifndef ZP_SCHEDCHECK_H
#define ZP_SCHEDCHECK_H

#include "zp_sched_graph.h"

#include <glib.h>

/* TRUE when every op is one the engine and the simulator can run; else one error,
 * "WHAT: ops[I]: key \"FIELD\" ...", naming the op index and the field at fault. */
gboolean zp_schedcheck_ops(const ZpSchedule *sched, const char *what, GError **error);

/* The step's semantics, which zp_schedcheck_ops checks too and a graph file with a model and a
 * plan needs no layout for: each unit's forward and backward (and recompute, with
 * checkpointing) once per micro-step, a backward after its forward and (one rank class)
 * before the optimizer; one optimizer op per stage's partition a step, and with optimizer
 * offload one cpu_optimizer op per sub-group the host steps (where the layout is known). A
 * repeated or out-of-place op is named, "WHAT: ops[I]: key \"op\" ...", a missing one
 * described. */
gboolean zp_schedcheck_step(const ZpSchedule *sched, const char *what, GError **error);

#endif
