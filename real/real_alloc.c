/* real_alloc: a tracking host allocator that records live and peak bytes per memory category.
 * Each host buffer carries a 64-byte header with its size and category, so release needs no
 * map; buffers allocated elsewhere (device memory) are remembered in a table instead. */
#include "real_alloc.h"
#include "zp_alloc_replay.h"

#include <glib.h>
#include <limits.h>
#include <malloc.h>
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
    GHashTable *external; /* tracked pointer -> RealAllocHeader (g_new) */
    ZpAllocReplay *replay; /* the same sequence through the caching-allocator model */
    /* Freed large blocks kept for the next take of exactly their size (real_alloc_take):
     * block bytes (GSIZE_TO_POINTER) -> GSList of blocks. */
    GHashTable *kept;
};

/* Blocks of at least this many bytes are kept for their size when released. */
#define REAL_ALLOC_KEEP_BYTES ((size_t)4 << 20)

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
    [REAL_MEM_SECONDARY_PARAMS] = "secondary_params",
    [REAL_MEM_EP_BUFFERS] = "ep_buffers",
};

const char *real_alloc_category_name(RealMemCategory cat)
{
    if ((int)cat < 0 || cat >= REAL_MEM_N_CATEGORIES)
        return NULL;
    return real_alloc_names[cat];
}

/* Training takes and frees the same buffers every step, and a GPU framework keeps the freed
 * blocks for the next step in a caching allocator (PyTorch's CUDACachingAllocator returns
 * none to the driver during training). glibc by default serves a block over its mmap
 * threshold (which grows to at most 32 MiB) with a fresh mmap, unmaps it on free, and trims
 * the heap's free top: each step then touches every page of its large buffers for the first
 * time again, which on this project's VMs costs 1.95 us a page against 0.47 us to rewrite a
 * page already there (gpt2-124m at N = 1, 5 steps: 2.0 million faults a run, a step 8.66 s,
 * its all-reduce 455 ms; with the blocks kept 0.69 million, 7.85 s and 145 ms). Serving
 * every block up to 2 GiB from the heap, never trimmed, keeps them as a
 * caching allocator does; real_alloc_heap_held_bytes reports what that holds. Once per
 * process, for the whole process (mallopt has no narrower scope). */
static void keep_freed_blocks(void)
{
    static gsize done = 0;
    if (g_once_init_enter(&done)) {
        mallopt(M_MMAP_THRESHOLD, INT_MAX);
        mallopt(M_TRIM_THRESHOLD, INT_MAX);
        g_once_init_leave(&done, 1);
    }
}

uint64_t real_alloc_heap_held_bytes(void)
{
    const struct mallinfo2 mi = mallinfo2();
    return (uint64_t)mi.arena + (uint64_t)mi.hblkhd;
}

RealAlloc *real_alloc_new(void)
{
    keep_freed_blocks();
    RealAlloc *tracker = g_new0(RealAlloc, 1);
    tracker->external = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    tracker->replay = zp_alloc_replay_new(0);
    tracker->kept = g_hash_table_new(g_direct_hash, g_direct_equal);
    return tracker;
}

static void free_kept(gpointer size, gpointer blocks, gpointer unused)
{
    (void)size, (void)unused;
    g_slist_free_full(blocks, free);
}

/* Frees every kept block (the tracker's end, or malloc out of memory). */
static void free_all_kept(RealAlloc *tracker)
{
    g_hash_table_foreach(tracker->kept, free_kept, NULL);
    g_hash_table_remove_all(tracker->kept);
}

void real_alloc_empty_cache(RealAlloc *tracker)
{
    free_all_kept(tracker);
    malloc_trim(0);
}

void real_alloc_free_tracker(RealAlloc *tracker)
{
    if (!tracker)
        return;
    g_hash_table_destroy(tracker->external);
    free_all_kept(tracker);
    g_hash_table_destroy(tracker->kept);
    zp_alloc_replay_free_all(tracker->replay);
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

/* The inverse of real_alloc_count; peaks stay. */
static void real_alloc_uncount(RealAlloc *tracker, RealMemCategory cat, size_t bytes)
{
    RealAllocStats *s = &tracker->stats;
    s->live_bytes[cat] -= bytes;
    s->live_total_bytes -= bytes;
    s->live_allocs--;
}

/* A block's bytes: the header's unit and `bytes`, rounded up to the alignment (aligned_alloc
 * wants a multiple of it). `bytes` at most SIZE_MAX - 2 REAL_ALLOC_ALIGN_BYTES. */
static size_t block_bytes(size_t bytes)
{
    const size_t total = REAL_ALLOC_ALIGN_BYTES + bytes;
    return (total + REAL_ALLOC_ALIGN_BYTES - 1) / REAL_ALLOC_ALIGN_BYTES * REAL_ALLOC_ALIGN_BYTES;
}

/* Keeps a released block of REAL_ALLOC_KEEP_BYTES or more for the next take of its size, as
 * PyTorch's caching allocator keeps its large blocks; FALSE (the caller frees it) for a smaller
 * one, or under ASan, whose allocator must see every free to find a use after it. glibc's
 * heap alone, kept whole (keep_freed_blocks), fragmented under stage 3's changing sizes: with
 * gpt2-124m at N = 1 it grew by about 80 MB a step (a tied embedding's 77 MB block no longer
 * fit the space its last copy left, which smaller blocks had split), 20,000 pages touched
 * for the first time every step. Those smaller blocks were mostly the replay's own records,
 * which it kept until the end (zp_alloc_replay.c); with them freed, glibc's heap alone held
 * 3.10 GB at 3 and at 6 steps, and with large blocks kept 3.00 GB. A training step takes the
 * same sizes every step, so kept blocks of each size are reused, and none is split. */
static gboolean keep(RealAlloc *tracker, unsigned char *block, size_t total)
{
#ifdef __SANITIZE_ADDRESS__
    (void)tracker, (void)block, (void)total;
    return FALSE;
#else
    if (total < REAL_ALLOC_KEEP_BYTES)
        return FALSE;
    GSList *blocks = g_hash_table_lookup(tracker->kept, GSIZE_TO_POINTER(total));
    g_hash_table_insert(tracker->kept, GSIZE_TO_POINTER(total), g_slist_prepend(blocks, block));
    return TRUE;
#endif
}

/* A kept block of exactly `total` bytes, or NULL when none is kept. */
static unsigned char *take_kept(RealAlloc *tracker, size_t total)
{
    GSList *blocks = total >= REAL_ALLOC_KEEP_BYTES
                         ? g_hash_table_lookup(tracker->kept, GSIZE_TO_POINTER(total))
                         : NULL;
    if (!blocks)
        return NULL;
    unsigned char *block = blocks->data;
    GSList *rest = g_slist_delete_link(blocks, blocks);
    if (rest)
        g_hash_table_insert(tracker->kept, GSIZE_TO_POINTER(total), rest);
    else
        g_hash_table_remove(tracker->kept, GSIZE_TO_POINTER(total));
    return block;
}

void *real_alloc_take(RealAlloc *tracker, size_t bytes, RealMemCategory cat)
{
    if ((int)cat < 0 || cat >= REAL_MEM_N_CATEGORIES)
        return NULL;
    if (bytes > SIZE_MAX - 2 * REAL_ALLOC_ALIGN_BYTES)
        return NULL;
    const size_t total = block_bytes(bytes);
    unsigned char *block = take_kept(tracker, total);
    if (!block)
        block = aligned_alloc(REAL_ALLOC_ALIGN_BYTES, total);
    if (!block && g_hash_table_size(tracker->kept) > 0) {
        /* As PyTorch's allocator frees its cached blocks and retries before it fails. */
        free_all_kept(tracker);
        block = aligned_alloc(REAL_ALLOC_ALIGN_BYTES, total);
    }
    if (!block)
        return NULL;
    RealAllocHeader header = {.bytes = bytes, .cat = cat};
    memcpy(block, &header, sizeof header);
    real_alloc_count(tracker, cat, bytes);
    if (bytes > 0) /* PyTorch hands out no block for 0 bytes */
        zp_alloc_replay_malloc(tracker->replay, (uintptr_t)(block + REAL_ALLOC_ALIGN_BYTES),
                               (double)bytes);
    return block + REAL_ALLOC_ALIGN_BYTES;
}

void real_alloc_release(RealAlloc *tracker, void *ptr)
{
    if (!ptr)
        return;
    unsigned char *block = (unsigned char *)ptr - REAL_ALLOC_ALIGN_BYTES;
    RealAllocHeader header;
    memcpy(&header, block, sizeof header);
    real_alloc_uncount(tracker, header.cat, header.bytes);
    zp_alloc_replay_release(tracker->replay, (uintptr_t)ptr);
    if (!keep(tracker, block, block_bytes(header.bytes)))
        free(block);
}

bool real_alloc_track(RealAlloc *tracker, const void *ptr, size_t bytes, RealMemCategory cat)
{
    if (!ptr || (int)cat < 0 || cat >= REAL_MEM_N_CATEGORIES ||
        g_hash_table_contains(tracker->external, ptr))
        return false;
    RealAllocHeader *header = g_new(RealAllocHeader, 1);
    *header = (RealAllocHeader){.bytes = bytes, .cat = cat};
    g_hash_table_insert(tracker->external, (gpointer)ptr, header);
    real_alloc_count(tracker, cat, bytes);
    if (bytes > 0)
        zp_alloc_replay_malloc(tracker->replay, (uintptr_t)ptr, (double)bytes);
    return true;
}

bool real_alloc_untrack(RealAlloc *tracker, const void *ptr)
{
    const RealAllocHeader *header = ptr ? g_hash_table_lookup(tracker->external, ptr) : NULL;
    if (!header)
        return false;
    real_alloc_uncount(tracker, header->cat, header->bytes);
    zp_alloc_replay_release(tracker->replay, (uintptr_t)ptr);
    g_hash_table_remove(tracker->external, ptr);
    return true;
}

void real_alloc_stats(const RealAlloc *tracker, RealAllocStats *out)
{
    *out = tracker->stats;
}

void real_alloc_caching_stats(const RealAlloc *tracker, RealCachingStats *out)
{
    const ZpAllocStats st = zp_alloc_replay_stats(tracker->replay);
    *out = (RealCachingStats){st.peak_allocated_bytes, st.peak_reserved_bytes,
                              st.largest_free_at_peak_bytes};
}

void real_alloc_reset_peaks(RealAlloc *tracker)
{
    RealAllocStats *s = &tracker->stats;
    memcpy(s->peak_bytes, s->live_bytes, sizeof s->peak_bytes);
    memcpy(s->at_peak_bytes, s->live_bytes, sizeof s->at_peak_bytes);
    s->peak_total_bytes = s->live_total_bytes;
}
