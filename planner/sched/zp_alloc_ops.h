/* zp_alloc_ops: the allocs and frees the allocator replay walks for the longer schedule that
 * whole inserted steady periods make (zp_alloc_replay_schedule_extended). */
#ifndef ZP_ALLOC_OPS_H
#define ZP_ALLOC_OPS_H

#include "zp_sched.h"

#include <glib.h>
#include <stdint.h>

/* An alloc or free as the replay sees it: the op, its place (in the longer schedule where
 * periods are inserted), its micro-step and buffer there. */
typedef struct {
    const ZpOp *op;
    uint32_t at;
    int32_t micro, buffer;
} ZpAllocOp;

/* The longer schedule's allocs and frees: s's, with the inserted periods' copies (ZpOpInsert),
 * each copy's micro-steps numbered on and the ops after them by as many; NULL where a copy's
 * op is not what that implies: the caller replays the longer schedule. */
GArray *zp_alloc_ops_extended(const ZpSchedule *s, const ZpOpInsert *given, size_t n_ins);

#endif
