/* zp_alloc_pool: the caching allocator's pools of free blocks, in (size, address) order, so
 * that best fit is a lower bound, as PyTorch's std::set of blocks does it (zp_alloc_replay). */
#include "zp_alloc_pool.h"

/* Keys are the integers themselves (GSIZE_TO_POINTER: sizes and addresses are 64-bit). */
static int key_cmp(gconstpointer a, gconstpointer b)
{
    const guintptr x = (guintptr)a, y = (guintptr)b;
    return x < y ? -1 : x > y;
}

#define KEY(v) ((gpointer)(guintptr)(v))
G_STATIC_ASSERT(sizeof(guintptr) >= sizeof(uint64_t));

void zp_alloc_pool_init(ZpAllocPool *p)
{
    p->by_size = g_tree_new(key_cmp);
    p->spare = g_ptr_array_new_with_free_func((GDestroyNotify)g_tree_destroy);
    p->n = 0;
}

/* GTraverseFunc: hands an address tree (the value) to the spare ones, to be destroyed. */
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
    GTree *at = g_tree_lookup(p->by_size, KEY(b->size));
    if (!at) {
        at = p->spare->len ? g_ptr_array_steal_index_fast(p->spare, p->spare->len - 1)
                           : g_tree_new(key_cmp);
        g_tree_insert(p->by_size, KEY(b->size), at);
    }
    g_tree_insert(at, KEY(b->addr), b);
    b->bucket = at;
    p->n++;
}

void zp_alloc_pool_remove(ZpAllocPool *p, const ZpAllocBlock *b)
{
    GTree *at = b->bucket;
    g_tree_remove(at, KEY(b->addr));
    if (g_tree_nnodes(at) == 0) {
        g_tree_remove(p->by_size, KEY(b->size));
        g_ptr_array_add(p->spare, at);
    }
    p->n--;
}

/* The best fit: the smallest block of at least size bytes, the lowest address among those. */
ZpAllocBlock *zp_alloc_pool_best(const ZpAllocPool *p, uint64_t size)
{
    GTreeNode *node = g_tree_lower_bound(p->by_size, KEY(size));
    return node ? g_tree_node_value(g_tree_node_first(g_tree_node_value(node))) : NULL;
}

uint64_t zp_alloc_pool_largest(const ZpAllocPool *p)
{
    GTreeNode *last = g_tree_node_last(p->by_size);
    return last ? (uint64_t)(guintptr)g_tree_node_key(last) : 0;
}

/* GTraverseFunc over a size's address tree: adds the blocks that are a whole segment. */
static gboolean collect_whole(gpointer key, gpointer value, gpointer data)
{
    (void)key;
    ZpAllocBlock *b = value;
    if (!b->prev && !b->next)
        g_ptr_array_add(data, b);
    return FALSE;
}

/* GTraverseFunc over the sizes: walks each one's blocks. */
static gboolean collect_size(gpointer key, gpointer value, gpointer data)
{
    (void)key;
    g_tree_foreach(value, collect_whole, data);
    return FALSE;
}

void zp_alloc_pool_whole_segments(const ZpAllocPool *p, GPtrArray *whole)
{
    g_tree_foreach(p->by_size, collect_size, whole);
}
