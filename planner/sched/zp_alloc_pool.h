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
    ZpAllocHeap *heap;  /* free: its size's blocks in its pool (NULL: its size's one) */
    guint heap_pos;     /* free: its place there */
};

/* A pool's free blocks in (size, address) order, two levels deep: the sizes in a sorted
 * array, each with its one block or a ZpAllocHeap of that size's blocks, a binary min-heap by
 * address (each block knowing its place): the best fit is the smallest size's lowest address,
 * all a lower bound needs; insertion and removal move pointers in arrays, where GTrees of
 * sizes and of addresses allocated and freed a node each time (plan --3d gpt-1t/4096's
 * replays: 600,000 of each, 0.4 G instructions). The sizes are few: 7.2 at a time on average
 * in the 32,000-layer stage-3 replay, 57 at most, where 1,854 blocks are free on average;
 * 3.3 in Megatron 1T's, whose sizes are mostly a block's own (29,395 of its 43,806 inserts
 * made a size, 29,391 of its 43,673 removals took a size's last block): such a size holds its
 * block without a heap (`one`). The array ends in a size above any block's (UINT64_MAX: sizes
 * are multiples of 512), at sizes[n_sizes], where a scan of the few sizes stops. */
typedef struct {
    uint64_t size;
    ZpAllocHeap *heap; /* NULL: the size's one block is `one` */
    ZpAllocBlock *one;
} ZpAllocSize;

typedef struct {
    ZpAllocSize *sizes; /* by size, each holding at least one block, then the end's */
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
