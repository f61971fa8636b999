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

/* Copies of an inserted period the list leaves out: `copies` more of its last listed one,
 * ops[first, first + len) (listed_copies listed, their buffers from first_buffer on), each
 * `at_step` places, `micro_step` micro-steps and `buffer_step` buffers (a period's allocs) on
 * from the one before, every free one of the copies' buffers; they come before ops[after].
 * buffer_window (> 0): the copies' buffers cycle through that many from first_buffer
 * (zp_alloc_run_buffer), each freed before its next copy takes it again. */
typedef struct {
    uint32_t after, first, len, at_step;
    int32_t micro_step, buffer_step, first_buffer, buffer_window;
    uint32_t listed_copies;
    uint64_t copies;
} ZpAllocRun;

/* Buffer b of a run's last listed copy, g copies on. */
static inline int32_t zp_alloc_run_buffer(int32_t b, uint64_t g, int32_t step, int32_t first,
                                          int32_t window)
{
    const int64_t on = (int64_t)(b - first) + (int64_t)g * step;
    return first + (int32_t)(window > 0 ? on % window : on);
}

/* The most places (ops) the longer schedule may hold: its places are 32-bit. */
#define ZP_ALLOC_OPS_MAX_PLACES (UINT32_MAX / 2)

/* The longer schedule's allocs and frees: s's, with the inserted periods' copies (ZpOpInsert),
 * each copy's micro-steps numbered on and the ops after them by as many; NULL where a copy's
 * op is not what that implies: the caller replays the longer schedule. runs (ZpAllocRun, or
 * NULL: every copy listed): where it takes them, the copies past those whose frees reach
 * back before the period's insertion (and every later one's of the copies), which repeat
 * their last listed one buffer for buffer a period on. */
GArray *zp_alloc_ops_extended(const ZpSchedule *s, const ZpOpInsert *given, size_t n_ins,
                              GArray *runs);

#endif
