/* zp_alloc_repeat: for the allocator replay's fold (zp_alloc_replay.c try_fold), how many
 * events from a head on repeat those a period before them, and the handles held across it. */
#ifndef ZP_ALLOC_REPEAT_H
#define ZP_ALLOC_REPEAT_H

#include "zp_alloc_seq.h"

#include <glib.h>
#include <stdint.h>

/* Sorts `fixed` (uint64_t: the alloc events of the handles two heads a period apart share)
 * for zp_alloc_repeat_fixed. */
void zp_alloc_repeat_sort(GArray *fixed);

/* Whether `handle` is one of the sorted fixed ones. */
gboolean zp_alloc_repeat_fixed(const GArray *fixed, uint64_t handle);

/* How many events of q from e on repeat the event a period before each: plain events (each
 * free's alloc as far back, none a fixed handle's), and a region's slot events that leave the
 * allocator alone (its region taken already: ckpt_taken, grad_taken). */
uint64_t zp_alloc_repeat_events(const ZpAllocSeq *q, uint64_t e, uint64_t period,
                                const GArray *fixed, gboolean ckpt_taken, gboolean grad_taken);

#endif
