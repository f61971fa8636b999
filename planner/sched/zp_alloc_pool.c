/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#include "zp_alloc_pool.h"

#include <stdlib.h>

/* Keys are the integers themselves (GSIZE_TO_POINTER: sizes and addresses are 64-bit). */
static int key_cmp(gconstpointer a, gconstpointer b)
{
    const guintptr x = (guintptr)a, y = (guintptr)b;
    return x < y ? -1 : x > y;
}

#define KEY(v) ((gpointer)(guintptr)(v))
G_STATIC_ASSERT(sizeof(guintptr) >= sizeof(uint64_t));

/* One size's free blocks: a binary min-heap by address, block k's children at 2k+1 and
 * 2k+2, each block's heap_pos its index. */
struct ZpAllocHeap {
    ZpAllocBlock **at;
    guint n, room;
};

static void heap_destroy(gpointer data)
{
    ZpAllocHeap *h = data;
    g_free(h->at);
    g_free(h);
}

static void heap_place(ZpAllocHeap *h, guint k, ZpAllocBlock *b)
{
    h->at[k] = b;
    b->heap_pos = k;
}

/* Moves block b, at hole k, up past the parents of higher address, then down past the
 * children of lower address, to where the heap holds again. */
static void heap_settle(ZpAllocHeap *h, guint k, ZpAllocBlock *b)
{
    while (k > 0 && h->at[(k - 1) / 2]->addr > b->addr) {
        heap_place(h, k, h->at[(k - 1) / 2]);
        k = (k - 1) / 2;
    }
    for (;;) {
        guint c = 2 * k + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->at[c + 1]->addr < h->at[c]->addr)
            c++;
        if (h->at[c]->addr >= b->addr)
            break;
        heap_place(h, k, h->at[c]);
        k = c;
    }
    heap_place(h, k, b);
}

void zp_alloc_pool_init(ZpAllocPool *p)
{
    p->by_size = g_tree_new(key_cmp);
    p->spare = g_ptr_array_new_with_free_func(heap_destroy);
    p->n = 0;
}

/* GTraverseFunc: hands a heap (the value) to the spare ones, to be destroyed. */
static gboolean spare_value(gpointer key, gpointer value, gpointer spare)
{
    (void)key;
    g_ptr_array_add(spare, value);
    return FALSE;
}

void zp_alloc_pool_destroy(ZpAllocPool *p)
{
    g_tree_foreach(p->by_size, spare_value, p->spare);
    g_tree_destroy(p->by_size);
    g_ptr_array_unref(p->spare);
}

void zp_alloc_pool_insert(ZpAllocPool *p, ZpAllocBlock *b)
{
    ZpAllocHeap *h = g_tree_lookup(p->by_size, KEY(b->size));
    if (!h) {
        h = p->spare->len ? g_ptr_array_steal_index_fast(p->spare, p->spare->len - 1)
                          : g_new0(ZpAllocHeap, 1);
        g_tree_insert(p->by_size, KEY(b->size), h);
    }
    if (h->n == h->room) {
        h->room = MAX(2 * h->room, 8);
        h->at = g_renew(ZpAllocBlock *, h->at, h->room);
    }
    h->n++;
    heap_settle(h, h->n - 1, b);
    b->heap = h;
    p->n++;
}

void zp_alloc_pool_remove(ZpAllocPool *p, const ZpAllocBlock *b)
{
    ZpAllocHeap *h = b->heap;
    ZpAllocBlock *last = h->at[--h->n];
    if (last != b) /* the last block fills b's hole */
        heap_settle(h, b->heap_pos, last);
    if (h->n == 0) {
        g_tree_remove(p->by_size, KEY(b->size));
        g_ptr_array_add(p->spare, h);
    }
    p->n--;
}

/* The best fit: the smallest block of at least size bytes, the lowest address among those. */
ZpAllocBlock *zp_alloc_pool_best(const ZpAllocPool *p, uint64_t size)
{
    GTreeNode *node = g_tree_lower_bound(p->by_size, KEY(size));
    return node ? ((ZpAllocHeap *)g_tree_node_value(node))->at[0] : NULL;
}

uint64_t zp_alloc_pool_largest(const ZpAllocPool *p)
{
    GTreeNode *last = g_tree_node_last(p->by_size);
    return last ? (uint64_t)(guintptr)g_tree_node_key(last) : 0;
}

static int by_addr(const void *a, const void *b)
{
    const uint64_t x = (*(ZpAllocBlock *const *)a)->addr, y = (*(ZpAllocBlock *const *)b)->addr;
    return (x > y) - (x < y);
}

/* GTraverseFunc over the sizes: appends each one's blocks that are a whole segment, in
 * address order (as the address trees listed them). */
static gboolean collect_size(gpointer key, gpointer value, gpointer data)
{
    (void)key;
    const ZpAllocHeap *h = value;
    GPtrArray *whole = data;
    const guint from = whole->len;
    for (guint k = 0; k < h->n; k++)
        if (!h->at[k]->prev && !h->at[k]->next)
            g_ptr_array_add(whole, h->at[k]);
    qsort(whole->pdata + from, whole->len - from, sizeof(gpointer), by_addr);
    return FALSE;
}

void zp_alloc_pool_whole_segments(const ZpAllocPool *p, GPtrArray *whole)
{
    g_tree_foreach(p->by_size, collect_size, whole);
}
