/* real_alloc: a tracking host allocator that records live and peak bytes per memory category,
 * so zreal's measured memory can be compared term by term with the planner's model. It also
 * counts buffers allocated elsewhere (device memory), so every backend reports the same way. */
#ifndef REAL_ALLOC_H
#define REAL_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a buffer is for, in the planner's terms. */
typedef enum {
    REAL_MEM_PARAMS,          /* bf16 parameters this rank keeps */
    REAL_MEM_GRADS,           /* bf16 gradients */
    REAL_MEM_MASTER,          /* fp32 master weights */
    REAL_MEM_ADAM_M,          /* fp32 Adam first moment */
    REAL_MEM_ADAM_V,          /* fp32 Adam second moment */
    REAL_MEM_GATHERED_PARAMS, /* ZeRO-3 parameters gathered for one unit */
    REAL_MEM_BUCKETS,         /* communication buckets */
    REAL_MEM_ACTIVATIONS,     /* what blocks save for backward */
    REAL_MEM_CHECKPOINTS,     /* block inputs kept under activation checkpointing */
    REAL_MEM_WORKSPACE,       /* transient scratch: logits, fp32 copies, GEMM staging */
    REAL_MEM_SECONDARY_PARAMS, /* ZeRO++ hpZ: bf16 secondary partitions inside the node */
    REAL_MEM_EP_BUFFERS,      /* a mixture of experts' router outputs and all-to-all buffers */
    REAL_MEM_N_CATEGORIES
} RealMemCategory;

/* Counters of one tracker. Bytes are the bytes requested (alignment padding and the
 * allocator's own header are not counted), so they compare with the planner's formulas. */
typedef struct {
    uint64_t live_bytes[REAL_MEM_N_CATEGORIES];
    uint64_t peak_bytes[REAL_MEM_N_CATEGORIES];     /* each category's own maximum */
    uint64_t at_peak_bytes[REAL_MEM_N_CATEGORIES];  /* each category when the total peaked */
    uint64_t live_total_bytes;
    uint64_t peak_total_bytes;
    uint64_t live_allocs;                           /* allocations not yet released */
} RealAllocStats;

typedef struct RealAlloc RealAlloc;

/* The category's short name ("params", "grads", "master", "adam_m", "adam_v",
 * "gathered_params", "buckets", "activations", "checkpoints", "workspace"); NULL when
 * `cat` is out of range. */
const char *real_alloc_category_name(RealMemCategory cat);

/* A new tracker with all counters zero; free it with real_alloc_free_tracker(). The first
 * call tells the process's malloc to keep freed blocks for reuse, as a caching allocator
 * does, rather than return them to the system (real_alloc.c keep_freed_blocks). */
RealAlloc *real_alloc_new(void);

/* Frees the tracker itself and the released blocks it kept; buffers still live are not freed
 * (they stay usable until real_alloc_release, which must not be called after this). NULL is
 * ignored. */
void real_alloc_free_tracker(RealAlloc *tracker);

/* Allocates `bytes` (0 allowed) aligned to 64 bytes and counts them under `cat`: a block of
 * 4 MiB or more that a release kept at exactly this size when there is one, else malloc's
 * (which, when it fails, is asked again after every kept block is freed).
 * Returns NULL, counting nothing, when memory is exhausted or `cat` is out of range.
 * The contents are uninitialised. */
void *real_alloc_take(RealAlloc *tracker, size_t bytes, RealMemCategory cat);

/* Releases a buffer from real_alloc_take of the same tracker and uncounts it. A block of 4 MiB
 * or more is kept for the next take of its size, as a caching allocator keeps its large blocks
 * (freed at once under ASan, which must see every free); a smaller one goes back to malloc.
 * NULL is ignored. */
void real_alloc_release(RealAlloc *tracker, void *ptr);

/* Gives back what the process holds for reuse, as torch.cuda.empty_cache() does between
 * phases: every kept block is freed, and malloc returns its free pages to the system
 * (malloc_trim; keep_freed_blocks told it never to trim by itself). Live buffers stay. For a
 * process that goes on to work at other sizes (the microbenchmark's phases), not inside a
 * training step. */
void real_alloc_empty_cache(RealAlloc *tracker);

/* Counts a buffer another allocator made (device memory from a GPU backend) under `cat`,
 * exactly as real_alloc_take counts its own: `bytes` requested, peaks updated. The tracker
 * remembers (ptr, bytes, cat) until real_alloc_untrack. Returns false, counting nothing,
 * when ptr is NULL or already tracked, or `cat` is out of range. */
bool real_alloc_track(RealAlloc *tracker, const void *ptr, size_t bytes, RealMemCategory cat);

/* Uncounts a buffer counted by real_alloc_track (the caller frees the memory itself).
 * Returns false, changing nothing, for NULL and for pointers the tracker does not know. */
bool real_alloc_untrack(RealAlloc *tracker, const void *ptr);

/* What the process's malloc holds from the system now (mallinfo2: its heaps and mapped
 * blocks), every allocation of the process, tracked or not. With freed blocks kept, this is
 * about the most it has held. */
uint64_t real_alloc_heap_held_bytes(void);

/* Copies the current counters into `out`. */
void real_alloc_stats(const RealAlloc *tracker, RealAllocStats *out);

/* The tracker's own allocation sequence (every take and track, release and untrack, in
 * order, buffers of 0 bytes aside) replayed through the model of PyTorch's caching allocator
 * (zp_alloc_replay, no capacity limit): allocated and reserved peaks and the largest free
 * block at the allocated peak, over the tracker's whole life. */
typedef struct {
    double peak_allocated_bytes, peak_reserved_bytes, largest_free_at_peak_bytes;
} RealCachingStats;
void real_alloc_caching_stats(const RealAlloc *tracker, RealCachingStats *out);

/* Starts a new measuring window: every peak becomes the current live value, so the next
 * real_alloc_stats reports the peaks reached from now on. */
void real_alloc_reset_peaks(RealAlloc *tracker);

#endif
