/* zp_alloc_replay: a model of PyTorch's CUDA caching allocator (c10/cuda/
 * CUDACachingAllocator.cpp) replaying an allocation sequence — reserved beside allocated
 * bytes, the largest free block, and out-of-memory from fragmentation. */
#ifndef ZP_ALLOC_REPLAY_H
#define ZP_ALLOC_REPLAY_H

#include "zp_sched.h"

#include <glib.h>
#include <stdint.h>

/* PyTorch's constants (CUDACachingAllocator.cpp): sizes round up to 512 bytes; requests of
 * at most 1 MiB come from the small pool, carved from 2 MiB segments; larger ones from the
 * large pool, from a 20 MiB segment below 10 MiB and otherwise a segment of the request
 * rounded up to 2 MiB. */
#define ZP_ALLOC_MIN_BLOCK_BYTES 512.0
#define ZP_ALLOC_SMALL_SIZE_BYTES 1048576.0
#define ZP_ALLOC_SMALL_BUFFER_BYTES 2097152.0
#define ZP_ALLOC_LARGE_BUFFER_BYTES 20971520.0
#define ZP_ALLOC_MIN_LARGE_ALLOC_BYTES 10485760.0
#define ZP_ALLOC_ROUND_LARGE_BYTES 2097152.0

typedef struct {
    double allocated_bytes;      /* now: blocks handed out (rounded sizes) */
    double reserved_bytes;       /* now: segments taken from cudaMalloc */
    double peak_allocated_bytes; /* the highest allocated */
    double peak_reserved_bytes;  /* the highest reserved */
    double reserved_at_peak_bytes;   /* reserved when allocated peaked */
    double largest_free_at_peak_bytes; /* the largest cached free block then */
    uint64_t segments_allocated;     /* cudaMalloc calls */
    gboolean oom;                /* a request neither a free block nor a new segment served */
    gboolean oom_fragmented;     /* ... although allocated + the request fit the capacity */
    double oom_request_bytes, oom_allocated_bytes, oom_reserved_bytes;
    double oom_largest_free_bytes; /* the largest cached free block when it failed */
    /* zp_alloc_replay_schedule: the allocs and frees not replayed one by one, in periods
     * skipped whole (a pipeline's steady state); every figure above is the full replay's */
    uint64_t folded_events;
} ZpAllocStats;

typedef struct ZpAllocReplay ZpAllocReplay;

/* An empty allocator with capacity_bytes for its segments (what cudaMalloc can give it;
 * 0 or less: unlimited). */
ZpAllocReplay *zp_alloc_replay_new(double capacity_bytes);
void zp_alloc_replay_free_all(ZpAllocReplay *a);

/* Allocates `bytes` (> 0) under handle `id` (unused so far) as PyTorch's malloc does: the
 * best-fitting cached block of the pool (smallest, then lowest address), split when the
 * rest is at least 512 bytes (small pool) or over 1 MiB (large pool); else a new segment;
 * when that exceeds the capacity, the wholly free segments are released
 * (release_cached_blocks) and it is tried once more. FALSE on out-of-memory, recorded in
 * the stats; nothing is allocated then. */
gboolean zp_alloc_replay_malloc(ZpAllocReplay *a, uint64_t id, double bytes);

/* Frees handle `id` (FALSE if it is not allocated): its block goes back to its pool,
 * merged with free neighbours of the same segment. Segments are never compacted. */
gboolean zp_alloc_replay_release(ZpAllocReplay *a, uint64_t id);

ZpAllocStats zp_alloc_replay_stats(const ZpAllocReplay *a);

/* The schedule's allocation sequence for one rank, in issue order (the order the host
 * makes its requests, which is what the caching allocator sees; one stream): the model
 * states first, one block per category, then every alloc and free op. With
 * contiguous_memory_optimization the kept checkpoints come from one region of
 * number_checkpoints slots allocated at the first checkpoint (DeepSpeed's
 * contiguous_data_buffers); with contiguous_gradients the gradient buckets come from one
 * region the size of the most bucket bytes ever live, allocated at the first bucket
 * (DeepSpeed's ipg buffers). The peaks are those of the whole sequence with no limit;
 * where the reserved peak exceeds capacity_bytes (> 0), the sequence is replayed against it
 * and the out-of-memory recorded, as from fragmentation when the allocated peak fits. */
ZpAllocStats zp_alloc_replay_schedule(const ZpSchedule *sched, double capacity_bytes);

/* The same, with the fold turned off (fold FALSE: every event replayed, for the tests and the
 * benchmark) or on. The fold skips whole periods of a stage's steady state where the state
 * at one micro-step's head provably repeats the one before's (zp_alloc_replay.c). */
ZpAllocStats zp_alloc_replay_schedule_folded(const ZpSchedule *sched, double capacity_bytes,
                                             gboolean fold);

/* The folded replay of the longer schedule that `inserts` describe (this one with whole steady
 * periods inserted: ZpOpInsert, from SimResult.inserts), into *stats: what
 * zp_alloc_replay_schedule gives for that schedule, without building it. FALSE where the
 * inserted ops do not pair up as steady periods do (tests/test_sim_extend.c): replay the
 * longer schedule itself. */
gboolean zp_alloc_replay_schedule_extended(const ZpSchedule *sched, double capacity_bytes,
                                           const ZpOpInsert *inserts, size_t n_inserts,
                                           ZpAllocStats *stats);

/* The bytes a step needs from the GPU, the runtime reserve aside, as `memory`, `simulate`,
 * `plan` and `sweep` all judge a fit: what the caching allocator reserves at its peak (its
 * segments, holes included), at least the schedule's live peak; after an out-of-memory from
 * fragmentation against capacity_bytes, at least capacity_bytes plus the request that failed
 * (such a step does not fit whatever the sums say). */
double zp_alloc_replay_needed_bytes(const ZpAllocStats *stats, double live_peak_bytes,
                                    double capacity_bytes);

#endif
