/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#ifndef ZP_ALLOC_POOL_H
#define ZP_ALLOC_POOL_H

#include <glib.h>
#include <stdint.h>

/* A block of a segment (zp_alloc_replay's; the pool reads its size and address and, while
 * the block is free, links it into its size's heap). */
typedef struct ZpAllocBlock ZpAllocBlock;
struct ZpAllocBlock {
    uint64_t addr, size;
    uint64_t id; /* allocated: its handle, its key in ZpAllocReplay.live (or by_id) */
    gboolean allocated, small;
    ZpAllocBlock *prev, *next; /* neighbours in the segment */
    /* free: its first child and next sibling in its size's heap, and the block before it
     * there (its parent where it is a first child, else its left sibling; NULL: the root) */
    ZpAllocBlock *heap_child, *heap_next, *heap_up;
};

/* A pool's free blocks in (size, address) order, two levels deep: the sizes in a sorted
 * array, each with a pairing heap of that size's blocks by address (Fredman, Sedgewick,
 * Sleator and Tarjan 1986, linked through the blocks): the best fit is the smallest size's
 * root, all a lower bound needs; insertion and removal move pointers, where GTrees of sizes
 * and of addresses allocated and freed a node each time (plan --3d gpt-1t/4096's replays:
 * 600,000 of each, 0.4 G instructions). A binary heap in an array per size, before, climbed
 * its whole depth at most inserts and fell it at every removal: the allocator takes a size's
 * lowest address, so its frees come back low (in Megatron 1T's replay 10,685 of 14,605
 * inserts into a heap were its new lowest address, and all 14,474 removals from one took its
 * lowest, merging it with a neighbour freed), which a pairing heap links and unlinks at its
 * root. The sizes are few: 7.2 at a time on average in the 32,000-layer stage-3 replay, 57
 * at most, where 1,854 blocks are free on average; 3.3 in Megatron 1T's, whose sizes are
 * mostly a block's own (29,395 of its 43,806 inserts made a size): a size that loses its last
 * block stays in the array, empty, for its next (up to 4 of them, zp_alloc_pool.c's MAX_EMPTY),
 * so that the sizes above it do not move down and up again. The array ends in a size above
 * any block's (UINT64_MAX: sizes are multiples of 512), at sizes[n_sizes], where a scan of
 * the few sizes stops. */
typedef struct {
    uint64_t size;
    ZpAllocBlock *root; /* its lowest address (NULL: empty) */
} ZpAllocSize;

typedef struct {
    ZpAllocSize *sizes; /* by size, empty ones among them, then the end's */
    guint n_sizes, room;
    guint n_empty; /* of them */
    guint n; /* blocks */
} ZpAllocPool;

void zp_alloc_pool_init(ZpAllocPool *p);
void zp_alloc_pool_destroy(ZpAllocPool *p);
/* Adds free block b (its size and address set), or takes it out. */
void zp_alloc_pool_insert(ZpAllocPool *p, ZpAllocBlock *b);
void zp_alloc_pool_remove(ZpAllocPool *p, ZpAllocBlock *b);
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
