/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#include "zp_alloc_pool.h"

#include <stdlib.h>
#include <string.h>

/* A removed root's children (first: the first, linked by heap_next) melded into one heap,
 * its root returned (NULL: none): in pairs from the first, then the pairs from the last
 * (the two passes that give the pairing heap its logarithmic amortised removal). One child,
 * as a lowest address inserted and then taken left, is the root at once. */
ZpAllocBlock *zp_alloc_pool_meld_children(ZpAllocBlock *first)
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
        ZpAllocBlock *m = zp_alloc_pool_meld(x, y);
        m->heap_next = pairs;
        pairs = m;
    }
    if (!pairs)
        return NULL;
    ZpAllocBlock *root = pairs;
    for (pairs = pairs->heap_next; pairs;) {
        ZpAllocBlock *next = pairs->heap_next;
        root = zp_alloc_pool_meld(root, pairs);
        pairs = next;
    }
    root->heap_up = root->heap_next = NULL;
    return root;
}

/* Takes b, not a root, out of its heap: its children, melded, take its place among its
 * siblings (all above its parent's address, as b was), so the root stays. */
void zp_alloc_pool_cut(ZpAllocBlock *b)
{
    ZpAllocBlock *sub = zp_alloc_pool_meld_children(b->heap_child);
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

/* A size of its own for b at sizes[i] (b's place: the first size above b's, or the end's):
 * an empty size's place where one lies beside it (its size above b's, and the one before it
 * below; or the one before, below b's), else the sizes from i on and the end's moved up. */
void zp_alloc_pool_new_size(ZpAllocPool *p, ZpAllocBlock *b, guint i)
{
    ZpAllocSize *z = &p->sizes[i];
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
void zp_alloc_pool_compact(ZpAllocPool *p)
{
    guint k = 0;
    for (guint i = 0; i < p->n_sizes; i++)
        if (p->sizes[i].root)
            p->sizes[k++] = p->sizes[i];
    p->sizes[k] = p->sizes[p->n_sizes];
    p->n_sizes = k;
    p->n_empty = 0;
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
