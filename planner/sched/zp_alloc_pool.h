/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#ifndef ZP_ALLOC_POOL_H
#define ZP_ALLOC_POOL_H

#include <glib.h>
#include <stdint.h>

/* A block of a segment (zp_alloc_replay's; the pool reads its size and address and keeps
 * its place in `heap` at `heap_pos`). */
typedef struct ZpAllocBlock ZpAllocBlock;
typedef struct ZpAllocHeap ZpAllocHeap;
struct ZpAllocBlock {
    uint64_t addr, size;
    uint64_t id; /* allocated: its handle, its key in ZpAllocReplay.live (or by_id) */
    gboolean allocated, small;
    ZpAllocBlock *prev, *next; /* neighbours in the segment */
    ZpAllocHeap *heap;  /* free: its size's blocks in its pool */
    guint heap_pos;     /* free: its place there */
};

/* A pool's free blocks in (size, address) order, two levels deep: the sizes in a sorted
 * array, each with a ZpAllocHeap of that size's blocks, a binary min-heap by address (each
 * block knowing its place): the best fit is the smallest size's lowest address, all a
 * lower bound needs; insertion and removal move pointers in arrays, where GTrees of sizes
 * and of addresses allocated and freed a node each time (plan --3d gpt-1t/4096's replays:
 * 600,000 of each, 0.4 G instructions). The sizes are few: 7.2 at a time on average in the
 * 32,000-layer stage-3 replay, 57 at most, where 1,854 blocks are free on average. */
typedef struct {
    uint64_t size;
    ZpAllocHeap *heap;
} ZpAllocSize;

typedef struct {
    ZpAllocSize *sizes; /* by size, each heap holding at least one block */
    guint n_sizes, room;
    /* emptied heaps, kept for the next size: a stack linked through the heaps (a GPtrArray's
     * calls were 21 M instructions of plan --3d gpt-1t/4096's replays) */
    ZpAllocHeap *spare;
    guint n;            /* blocks */
} ZpAllocPool;

void zp_alloc_pool_init(ZpAllocPool *p);
void zp_alloc_pool_destroy(ZpAllocPool *p);
/* Adds free block b (its size and address set), or takes it out. */
void zp_alloc_pool_insert(ZpAllocPool *p, ZpAllocBlock *b);
void zp_alloc_pool_remove(ZpAllocPool *p, const ZpAllocBlock *b);
/* The best fit, taken out of the pool: the smallest block of at least size bytes, the lowest
 * address among those; NULL where none is that large. One search where a lookup and a removal
 * were two when its size goes with it (29,391 of the 43,672 removals in Megatron 1T's
 * replay). */
ZpAllocBlock *zp_alloc_pool_take_best(ZpAllocPool *p, uint64_t size);
/* The largest free block's size (0: none). */
uint64_t zp_alloc_pool_largest(const ZpAllocPool *p);
/* Appends to whole the free blocks that are a whole segment (no neighbours). */
void zp_alloc_pool_whole_segments(const ZpAllocPool *p, GPtrArray *whole);

#endif
