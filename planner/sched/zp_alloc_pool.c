/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#include "zp_alloc_pool.h"

#include <stdlib.h>
#include <string.h>

/* One size's free blocks: a binary min-heap by address, block k's children at 2k+1 and
 * 2k+2, each block's heap_pos its index. */
struct ZpAllocHeap {
    ZpAllocBlock **at;
    guint n, room;
    ZpAllocHeap *next_spare; /* ZpAllocPool.spare's next, while spare */
};

static void heap_destroy(ZpAllocHeap *h)
{
    g_free(h->at);
    g_free(h);
}

static void heap_place(ZpAllocHeap *h, guint k, ZpAllocBlock *b)
{
    h->at[k] = b;
    b->heap_pos = k;
}

/* Moves block b, at hole k, up past the parents of higher address, to where the heap holds
 * again (below k it does: k is a leaf, or b came from above). */
G_ALWAYS_INLINE static inline void heap_climb(ZpAllocHeap *h, guint k, ZpAllocBlock *b)
{
    while (k > 0 && h->at[(k - 1) / 2]->addr > b->addr) {
        heap_place(h, k, h->at[(k - 1) / 2]);
        k = (k - 1) / 2;
    }
    heap_place(h, k, b);
}

/* Fills hole k (its block taken out, h->n counted down) with the last block: the hole goes
 * down to a leaf past the lower child at each level, one comparison a level, and the last
 * block climbs back from there (Floyd's), where settling it down from k compared it too at
 * every level. The block taken out was its size's lowest address at all 14,474 of Megatron
 * 1T's removals from a heap (the last block, a leaf's, rarely climbs far). */
static void heap_fill(ZpAllocHeap *h, guint k)
{
    ZpAllocBlock *last = h->at[h->n];
    for (;;) {
        guint c = 2 * k + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->at[c + 1]->addr < h->at[c]->addr)
            c++;
        heap_place(h, k, h->at[c]);
        k = c;
    }
    heap_climb(h, k, last);
}

/* The blocks of size z: its heap's, or its one. */
static ZpAllocBlock *const *size_blocks(const ZpAllocSize *z, guint *n)
{
    *n = z->heap ? z->heap->n : 1;
    return z->heap ? z->heap->at : &z->one;
}

void zp_alloc_pool_init(ZpAllocPool *p)
{
    *p = (ZpAllocPool){.room = 16};
    p->sizes = g_new(ZpAllocSize, p->room);
    p->sizes[0] = (ZpAllocSize){.size = UINT64_MAX}; /* the end's */
}

void zp_alloc_pool_destroy(ZpAllocPool *p)
{
    for (guint i = 0; i < p->n_sizes; i++)
        if (p->sizes[i].heap)
            heap_destroy(p->sizes[i].heap);
    g_free(p->sizes);
    while (p->spare) {
        ZpAllocHeap *h = p->spare;
        p->spare = h->next_spare;
        heap_destroy(h);
    }
}

/* Up to this many sizes are scanned from the smallest, not halved: Megatron 1T's replay held
 * 3.3 on average, where the halving took 34 instructions a search (2.96 M of 87,600). */
#define SCAN_SIZES 16

/* The first of the pool's sizes that is at least `size` (n_sizes: none). */
G_ALWAYS_INLINE static inline guint size_at_least(const ZpAllocPool *p, uint64_t size)
{
    const ZpAllocSize *z = p->sizes;
    if (p->n_sizes <= SCAN_SIZES) {
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

/* A size of its own for b, at i, holding b alone. */
static void size_open(ZpAllocPool *p, guint i, ZpAllocBlock *b)
{
    if (p->n_sizes + 2 > p->room) {
        p->room *= 2;
        p->sizes = g_renew(ZpAllocSize, p->sizes, p->room);
    }
    /* the sizes from i on and the end's */
    memmove(&p->sizes[i + 1], &p->sizes[i], (p->n_sizes - i + 1) * sizeof *p->sizes);
    p->n_sizes++;
    p->sizes[i] = (ZpAllocSize){.size = b->size, .heap = NULL, .one = b};
    b->heap = NULL;
}

/* Adds b to heap h. */
static void heap_push(ZpAllocHeap *h, ZpAllocBlock *b)
{
    if (h->n == h->room) {
        h->room = MAX(2 * h->room, 8);
        h->at = g_renew(ZpAllocBlock *, h->at, h->room);
    }
    h->n++;
    heap_climb(h, h->n - 1, b);
    b->heap = h;
}

void zp_alloc_pool_insert(ZpAllocPool *p, ZpAllocBlock *b)
{
    const guint i = size_at_least(p, b->size);
    ZpAllocSize *z = &p->sizes[i];
    p->n++;
    if (z->size != b->size) { /* the end's is no block's size */
        size_open(p, i, b);
        return;
    }
    if (!z->heap) { /* its one block and b: a heap */
        ZpAllocHeap *h = p->spare;
        if (h)
            p->spare = h->next_spare;
        else
            h = g_new0(ZpAllocHeap, 1);
        z->heap = h;
        heap_push(h, z->one);
    }
    heap_push(z->heap, b);
}

/* Takes b out; at: its size's place among the sizes, or G_MAXUINT (found if it goes). */
G_ALWAYS_INLINE static inline void pool_take(ZpAllocPool *p, const ZpAllocBlock *b, guint at)
{
    p->n--;
    ZpAllocHeap *h = b->heap;
    if (h) {
        if (b->heap_pos != --h->n) /* the last block fills b's hole */
            heap_fill(h, b->heap_pos);
        if (h->n > 0)
            return;
        h->next_spare = p->spare;
        p->spare = h;
    }
    /* its size goes (b was its last: found at its size), the end's moved down with the rest */
    const guint i = at != G_MAXUINT ? at : size_at_least(p, b->size);
    memmove(&p->sizes[i], &p->sizes[i + 1], (p->n_sizes - i) * sizeof *p->sizes);
    p->n_sizes--;
}

void zp_alloc_pool_remove(ZpAllocPool *p, const ZpAllocBlock *b)
{
    pool_take(p, b, G_MAXUINT);
}

ZpAllocBlock *zp_alloc_pool_take_best(ZpAllocPool *p, uint64_t size)
{
    const guint i = size_at_least(p, size);
    if (i == p->n_sizes)
        return NULL;
    const ZpAllocSize *z = &p->sizes[i];
    ZpAllocBlock *b = z->heap ? z->heap->at[0] : z->one;
    pool_take(p, b, i);
    return b;
}

uint64_t zp_alloc_pool_largest(const ZpAllocPool *p)
{
    return p->n_sizes ? p->sizes[p->n_sizes - 1].size : 0;
}

static int by_addr(const void *a, const void *b)
{
    const uint64_t x = (*(ZpAllocBlock *const *)a)->addr, y = (*(ZpAllocBlock *const *)b)->addr;
    return (x > y) - (x < y);
}

/* Each size's blocks that are a whole segment, in (size, address) order. */
void zp_alloc_pool_whole_segments(const ZpAllocPool *p, GPtrArray *whole)
{
    for (guint i = 0; i < p->n_sizes; i++) {
        guint n;
        ZpAllocBlock *const *at = size_blocks(&p->sizes[i], &n);
        const guint from = whole->len;
        for (guint k = 0; k < n; k++)
            if (!at[k]->prev && !at[k]->next)
                g_ptr_array_add(whole, at[k]);
        /* An empty GPtrArray's pdata is NULL, which qsort's declaration says it never is. */
        if (whole->len - from > 1)
            qsort(whole->pdata + from, whole->len - from, sizeof(gpointer), by_addr);
    }
}
