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
/* The largest free block's size (0: none). */
uint64_t zp_alloc_pool_largest(const ZpAllocPool *p);
/* Appends to whole the free blocks that are a whole segment (no neighbours). */
void zp_alloc_pool_whole_segments(const ZpAllocPool *p, GPtrArray *whole);

/* The out-of-line parts of the inline operations below: a size of its own for b at sizes[i]
 * (zp_alloc_pool_insert's), a removed root's children melded (its new root, NULL: none), b
 * (not a root) cut out of its heap, and the empty sizes dropped. */
void zp_alloc_pool_new_size(ZpAllocPool *p, ZpAllocBlock *b, guint i);
ZpAllocBlock *zp_alloc_pool_meld_children(ZpAllocBlock *first);
void zp_alloc_pool_cut(ZpAllocBlock *b);
void zp_alloc_pool_compact(ZpAllocPool *p);

/* Sizes that lost their last block kept, empty, up to this many: Megatron 1T's replay freed
 * a block of a size of its own and took it back 29,000 times, the sizes above it moved up
 * and down each time. */
#define ZP_ALLOC_POOL_MAX_EMPTY 4

/* Up to this many sizes are scanned from the smallest, not halved: Megatron 1T's replay held
 * 3.3 on average, where the halving took 34 instructions a search (2.96 M of 87,600). */
#define ZP_ALLOC_POOL_SCAN_SIZES 16

/* The operations below are inline (the replay's malloc and free call them once or twice
 * each: a call's entry and exit were 15 instructions, 1.1 M of Megatron 1T's replay), their
 * rarer parts out of line. */

/* Two heaps' roots melded: the lower address the root, the other its first child. The
 * root's heap_up and heap_next are the caller's to set. */
G_ALWAYS_INLINE static inline ZpAllocBlock *zp_alloc_pool_meld(ZpAllocBlock *x, ZpAllocBlock *y)
{
    if (y->addr < x->addr) {
        ZpAllocBlock *t = x;
        x = y;
        y = t;
    }
    y->heap_next = x->heap_child;
    if (x->heap_child)
        x->heap_child->heap_up = y;
    y->heap_up = x;
    x->heap_child = y;
    return x;
}

/* The first of the pool's sizes that is at least `size` (n_sizes: none). */
G_ALWAYS_INLINE static inline guint zp_alloc_pool_size_at_least(const ZpAllocPool *p,
                                                                uint64_t size)
{
    const ZpAllocSize *z = p->sizes;
    if (p->n_sizes <= ZP_ALLOC_POOL_SCAN_SIZES) {
        guint i = 0;
        while (z[i].size < size) /* the end's stops it */
            i++;
        return i;
    }
    guint lo = 0, hi = p->n_sizes;
    while (lo < hi) {
        const guint mid = lo + (hi - lo) / 2;
        if (z[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Adds free block b (its size and address set). */
G_ALWAYS_INLINE static inline void zp_alloc_pool_insert(ZpAllocPool *p, ZpAllocBlock *b)
{
    const guint i = zp_alloc_pool_size_at_least(p, b->size);
    ZpAllocSize *z = &p->sizes[i];
    p->n++;
    b->heap_child = b->heap_up = b->heap_next = NULL;
    if (z->size != b->size) { /* the end's is no block's size */
        zp_alloc_pool_new_size(p, b, i);
        return;
    }
    p->n_empty -= !z->root;
    z->root = z->root ? zp_alloc_pool_meld(z->root, b) : b;
    z->root->heap_up = z->root->heap_next = NULL;
}

/* Takes b out; at: its size's place among the sizes, or G_MAXUINT (found if b is its root). */
G_ALWAYS_INLINE static inline void zp_alloc_pool_take(ZpAllocPool *p, ZpAllocBlock *b, guint at)
{
    p->n--;
    if (b->heap_up) {
        zp_alloc_pool_cut(b);
        return;
    }
    const guint i = at != G_MAXUINT ? at : zp_alloc_pool_size_at_least(p, b->size);
    ZpAllocBlock *child = b->heap_child;
    if (child && !child->heap_next) /* one child (the meld's case, without a call) */
        child->heap_up = NULL;
    else if (child)
        child = zp_alloc_pool_meld_children(child);
    p->sizes[i].root = child;
    if (!p->sizes[i].root && ++p->n_empty > ZP_ALLOC_POOL_MAX_EMPTY) /* b was its size's last */
        zp_alloc_pool_compact(p);
}

/* Takes free block b out of the pool. */
G_ALWAYS_INLINE static inline void zp_alloc_pool_remove(ZpAllocPool *p, ZpAllocBlock *b)
{
    zp_alloc_pool_take(p, b, G_MAXUINT);
}

/* The best fit, taken out of the pool: the smallest block of at least size bytes, the lowest
 * address among those; NULL where none is that large. One search where a lookup and a removal
 * were two when its size goes with it (29,391 of the 43,672 removals in Megatron 1T's
 * replay). */
G_ALWAYS_INLINE static inline ZpAllocBlock *zp_alloc_pool_take_best(ZpAllocPool *p,
                                                                    uint64_t size)
{
    guint i = zp_alloc_pool_size_at_least(p, size);
    while (i < p->n_sizes && !p->sizes[i].root)
        i++;
    if (i == p->n_sizes)
        return NULL;
    ZpAllocBlock *b = p->sizes[i].root;
    zp_alloc_pool_take(p, b, i);
    return b;
}

#endif
