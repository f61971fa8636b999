/* real_alloc: a tracking host allocator that records live and peak bytes per memory category.
 * Each buffer carries a 64-byte header with its size and category, so release needs no map. */
#include "real_alloc.h"

#include <glib.h>
#include <stdlib.h>
#include <string.h>

#define REAL_ALLOC_ALIGN_BYTES 64

/* Sits in the first REAL_ALLOC_ALIGN_BYTES of every block, just before the user pointer;
 * a whole alignment unit keeps the user pointer 64-byte aligned. */
typedef struct {
    size_t bytes;
    RealMemCategory cat;
} RealAllocHeader;

G_STATIC_ASSERT(sizeof(RealAllocHeader) <= REAL_ALLOC_ALIGN_BYTES);

struct RealAlloc {
    RealAllocStats stats;
};

static const char *const real_alloc_names[REAL_MEM_N_CATEGORIES] = {
    [REAL_MEM_PARAMS] = "params",
    [REAL_MEM_GRADS] = "grads",
    [REAL_MEM_MASTER] = "master",
    [REAL_MEM_ADAM_M] = "adam_m",
    [REAL_MEM_ADAM_V] = "adam_v",
    [REAL_MEM_GATHERED_PARAMS] = "gathered_params",
    [REAL_MEM_BUCKETS] = "buckets",
    [REAL_MEM_ACTIVATIONS] = "activations",
    [REAL_MEM_CHECKPOINTS] = "checkpoints",
    [REAL_MEM_WORKSPACE] = "workspace",
};

const char *real_alloc_category_name(RealMemCategory cat)
{
    if ((int)cat < 0 || cat >= REAL_MEM_N_CATEGORIES)
        return NULL;
    return real_alloc_names[cat];
}

RealAlloc *real_alloc_new(void)
{
    return g_new0(RealAlloc, 1);
}

void real_alloc_free_tracker(RealAlloc *tracker)
{
    g_free(tracker);
}

/* Counts an allocation and, when the total reaches a new high, snapshots every category
 * so the composition of the peak (not just its size) can be reported. */
static void real_alloc_count(RealAlloc *tracker, RealMemCategory cat, size_t bytes)
{
    RealAllocStats *s = &tracker->stats;
    s->live_bytes[cat] += bytes;
    s->live_total_bytes += bytes;
    s->live_allocs++;
    if (s->live_bytes[cat] > s->peak_bytes[cat])
        s->peak_bytes[cat] = s->live_bytes[cat];
    if (s->live_total_bytes > s->peak_total_bytes) {
        s->peak_total_bytes = s->live_total_bytes;
        memcpy(s->at_peak_bytes, s->live_bytes, sizeof s->at_peak_bytes);
    }
}

void *real_alloc_take(RealAlloc *tracker, size_t bytes, RealMemCategory cat)
{
    if ((int)cat < 0 || cat >= REAL_MEM_N_CATEGORIES)
        return NULL;
    if (bytes > SIZE_MAX - 2 * REAL_ALLOC_ALIGN_BYTES)
        return NULL;
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t total = REAL_ALLOC_ALIGN_BYTES + bytes;
    total = (total + REAL_ALLOC_ALIGN_BYTES - 1) / REAL_ALLOC_ALIGN_BYTES * REAL_ALLOC_ALIGN_BYTES;
    unsigned char *block = aligned_alloc(REAL_ALLOC_ALIGN_BYTES, total);
    if (!block)
        return NULL;
    RealAllocHeader header = {.bytes = bytes, .cat = cat};
    memcpy(block, &header, sizeof header);
    real_alloc_count(tracker, cat, bytes);
    return block + REAL_ALLOC_ALIGN_BYTES;
}

void real_alloc_release(RealAlloc *tracker, void *ptr)
{
    if (!ptr)
        return;
    unsigned char *block = (unsigned char *)ptr - REAL_ALLOC_ALIGN_BYTES;
    RealAllocHeader header;
    memcpy(&header, block, sizeof header);
    RealAllocStats *s = &tracker->stats;
    s->live_bytes[header.cat] -= header.bytes;
    s->live_total_bytes -= header.bytes;
    s->live_allocs--;
    free(block);
}

void real_alloc_stats(const RealAlloc *tracker, RealAllocStats *out)
{
    *out = tracker->stats;
}

void real_alloc_reset_peaks(RealAlloc *tracker)
{
    RealAllocStats *s = &tracker->stats;
    memcpy(s->peak_bytes, s->live_bytes, sizeof s->peak_bytes);
    memcpy(s->at_peak_bytes, s->live_bytes, sizeof s->at_peak_bytes);
    s->peak_total_bytes = s->live_total_bytes;
}
