/* zp_alloc_slots: the contiguous regions' slot marks as the allocator replay's fold skips
 * whole periods (zp_alloc_replay.c try_fold): each checkpoint or bucket slot in a region is
 * marked while taken, not a block of its own. */
#ifndef ZP_ALLOC_SLOTS_H
#define ZP_ALLOC_SLOTS_H

#include "zp_alloc_seq.h"

#include <glib.h>
#include <stdint.h>

/* The marks (region[buffer + 1], 1: a slot taken) as the events [from, to) of q leave them,
 * each change's slot appended to undo (emptied first); FALSE, the marks as they were, where a
 * slot's free finds no mark (it would release a block: not the no-op the fold counts on). */
gboolean zp_alloc_slots_skip(const ZpAllocSeq *q, uint8_t *region, uint64_t from, uint64_t to,
                             GArray *undo);

/* Puts back the marks zp_alloc_slots_skip changed (undo: the slots, each change a flip). */
void zp_alloc_slots_undo(uint8_t *region, const GArray *undo);

#endif
