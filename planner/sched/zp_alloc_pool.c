/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#include "zp_alloc_pool.h"

#include <stdlib.h>
#include <string.h>

/* Two heaps' roots melded: the lower address the root, the other its first child. The
 * root's heap_up and heap_next are the caller's to set. */
G_ALWAYS_INLINE static inline ZpAllocBlock *heap_meld(ZpAllocBlock *x, ZpAllocBlock *y)
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

/* A removed root's children (first: the first, linked by heap_next) melded into one heap,
 * its root returned (NULL: none): in pairs from the first, then the pairs from the last
 * (the two passes that give the pairing heap its logarithmic amortised removal). One child,
 * as a lowest address inserted and then taken left, is the root at once. */
static ZpAllocBlock *heap_meld_children(ZpAllocBlock *first)
{
    ZpAllocBlock *pairs = NULL; /* the pairs melded, the last first, linked by heap_next */
    while (first) {
        ZpAllocBlock *x = first, *y = x->heap_next;
        if (!y) {
            x->heap_next = pairs;
            pairs = x;
            break;
        }
        first = y->heap_next;
        ZpAllocBlock *m = heap_meld(x, y);
        m->heap_next = pairs;
        pairs = m;
    }
    if (!pairs)
        return NULL;
    ZpAllocBlock *root = pairs;
    for (pairs = pairs->heap_next; pairs;) {
        ZpAllocBlock *next = pairs->heap_next;
        root = heap_meld(root, pairs);
        pairs = next;
    }
    root->heap_up = root->heap_next = NULL;
    return root;
}

/* Takes b, not a root, out of its heap: its children, melded, take its place among its
 * siblings (all above its parent's address, as b was), so the root stays. */
static void heap_cut(ZpAllocBlock *b)
{
    ZpAllocBlock *sub = heap_meld_children(b->heap_child);
    ZpAllocBlock *before = b->heap_up, *after = b->heap_next;
    ZpAllocBlock *in = sub ? sub : after; /* what follows `before` now */
    if (sub) {
        sub->heap_up = before;
        sub->heap_next = after;
    }
    if (after)
        after->heap_up = sub ? sub : before;
    if (before->heap_child == b) /* b was a first child: `before` is its parent */
        before->heap_child = in;
    else
        before->heap_next = in;
}

void zp_alloc_pool_init(ZpAllocPool *p)
{
    *p = (ZpAllocPool){.room = 16};
    p->sizes = g_new(ZpAllocSize, p->room);
    p->sizes[0] = (ZpAllocSize){.size = UINT64_MAX, .root = NULL}; /* the end's */
}

void zp_alloc_pool_destroy(ZpAllocPool *p)
{
    g_free(p->sizes);
}

/* Sizes that lost their last block kept, empty, up to this many: Megatron 1T's replay freed
 * a block of a size of its own and took it back 29,000 times, the sizes above it moved up
 * and down each time. */
#define MAX_EMPTY 4

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

void zp_alloc_pool_insert(ZpAllocPool *p, ZpAllocBlock *b)
{
    const guint i = size_at_least(p, b->size);
    ZpAllocSize *z = &p->sizes[i];
    p->n++;
    b->heap_child = b->heap_up = b->heap_next = NULL;
    if (z->size == b->size) { /* the end's is no block's size */
        p->n_empty -= !z->root;
        z->root = z->root ? heap_meld(z->root, b) : b;
        z->root->heap_up = z->root->heap_next = NULL;
        return;
    }
    /* a size of its own, at i: an empty size's place where one lies beside it (its size
     * above b's, and the one before it below; or the one before, below b's), else the sizes
     * from i on and the end's moved up */
    if (i < p->n_sizes && !z->root) {
        p->n_empty--;
    } else if (i > 0 && !z[-1].root) {
        p->n_empty--;
        z--;
    } else {
        if (p->n_sizes + 2 > p->room) {
            p->room *= 2;
            p->sizes = g_renew(ZpAllocSize, p->sizes, p->room);
        }
        memmove(&p->sizes[i + 1], &p->sizes[i], (p->n_sizes - i + 1) * sizeof *p->sizes);
        p->n_sizes++;
        z = &p->sizes[i];
    }
    *z = (ZpAllocSize){.size = b->size, .root = b};
}

/* The empty sizes dropped, the end's moved down with the rest. */
static void sizes_compact(ZpAllocPool *p)
{
    guint k = 0;
    for (guint i = 0; i < p->n_sizes; i++)
        if (p->sizes[i].root)
            p->sizes[k++] = p->sizes[i];
    p->sizes[k] = p->sizes[p->n_sizes];
    p->n_sizes = k;
    p->n_empty = 0;
}

/* Takes b out; at: its size's place among the sizes, or G_MAXUINT (found if b is its root). */
G_ALWAYS_INLINE static inline void pool_take(ZpAllocPool *p, ZpAllocBlock *b, guint at)
{
    p->n--;
    if (b->heap_up) {
        heap_cut(b);
        return;
    }
    const guint i = at != G_MAXUINT ? at : size_at_least(p, b->size);
    p->sizes[i].root = heap_meld_children(b->heap_child);
    if (!p->sizes[i].root && ++p->n_empty > MAX_EMPTY) /* b was its size's last */
        sizes_compact(p);
}

void zp_alloc_pool_remove(ZpAllocPool *p, ZpAllocBlock *b)
{
    pool_take(p, b, G_MAXUINT);
}

ZpAllocBlock *zp_alloc_pool_take_best(ZpAllocPool *p, uint64_t size)
{
    guint i = size_at_least(p, size);
    while (i < p->n_sizes && !p->sizes[i].root)
        i++;
    if (i == p->n_sizes)
        return NULL;
    ZpAllocBlock *b = p->sizes[i].root;
    pool_take(p, b, i);
    return b;
}

uint64_t zp_alloc_pool_largest(const ZpAllocPool *p)
{
    for (guint i = p->n_sizes; i-- > 0;)
        if (p->sizes[i].root)
            return p->sizes[i].size;
    return 0;
}

static int by_addr(const void *a, const void *b)
{
    const uint64_t x = (*(ZpAllocBlock *const *)a)->addr, y = (*(ZpAllocBlock *const *)b)->addr;
    return (x > y) - (x < y);
}

/* Each size's blocks that are a whole segment, in (size, address) order. */
void zp_alloc_pool_whole_segments(const ZpAllocPool *p, GPtrArray *whole)
{
    GPtrArray *todo = g_ptr_array_new(); /* the heap's blocks still to visit */
    for (guint i = 0; i < p->n_sizes; i++) {
        const guint from = whole->len;
        if (!p->sizes[i].root)
            continue;
        g_ptr_array_add(todo, p->sizes[i].root);
        while (todo->len > 0) {
            const ZpAllocBlock *b = g_ptr_array_remove_index_fast(todo, todo->len - 1);
            if (b->heap_next)
                g_ptr_array_add(todo, b->heap_next);
            if (b->heap_child)
                g_ptr_array_add(todo, b->heap_child);
            if (!b->prev && !b->next)
                g_ptr_array_add(whole, (gpointer)b);
        }
        /* An empty GPtrArray's pdata is NULL, which qsort's declaration says it never is. */
        if (whole->len - from > 1)
            qsort(whole->pdata + from, whole->len - from, sizeof(gpointer), by_addr);
    }
    g_ptr_array_unref(todo);
}
