/* test_alloc_pool: the caching-allocator replay's pools of free blocks (zp_alloc_pool) against a
 * plain list searched whole: best fit, removal, the largest size and the whole segments. */
#include "zp_alloc_pool.h"

#include <glib.h>

#define N_BLOCKS 512

/* The best fit the list holds for `size`: the smallest block of at least size bytes, the
 * lowest address among those (PyTorch's std::set lower bound); NULL where none is. */
static ZpAllocBlock *list_best(GPtrArray *list, uint64_t size)
{
    ZpAllocBlock *best = NULL;
    for (guint k = 0; k < list->len; k++) {
        ZpAllocBlock *b = g_ptr_array_index(list, k);
        if (b->size >= size &&
            (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)))
            best = b;
    }
    return best;
}

static uint64_t list_largest(GPtrArray *list)
{
    uint64_t most = 0;
    for (guint k = 0; k < list->len; k++)
        most = MAX(most, ((ZpAllocBlock *)g_ptr_array_index(list, k))->size);
    return most;
}

/* 100,000 inserts, removals of any free block and best-fit takes, drawn at random over sizes
 * few enough that a size holds one block for a while, then many (its heap), then none, and
 * over sizes of their own: every take is the list's best fit, and the count and the largest
 * size follow the list's. */
static void test_pool_as_list(void)
{
    GRand *rand = g_rand_new_with_seed(11);
    ZpAllocBlock *blocks = g_new0(ZpAllocBlock, N_BLOCKS);
    gboolean *in_pool = g_new0(gboolean, N_BLOCKS);
    GPtrArray *list = g_ptr_array_new();
    ZpAllocPool pool;
    zp_alloc_pool_init(&pool);
    guint taken = 0, none = 0, heaped = 0, cut = 0, most = 0, emptied = 0;
    for (guint k = 0; k < N_BLOCKS; k++)
        blocks[k].addr = ((uint64_t)k * 7919 % N_BLOCKS + 1) << 21; /* unique, out of order */
    for (guint step = 0; step < 100000; step++) {
        const guint k = (guint)g_rand_int_range(rand, 0, N_BLOCKS);
        const guint op = (guint)g_rand_int_range(rand, 0, 3);
        /* 4 common sizes, or one of 400 rarer ones, multiples of 512 */
        const uint64_t size = g_rand_int_range(rand, 0, 2) ? (uint64_t)g_rand_int_range(rand, 1, 5) << 20
                                                           : (uint64_t)g_rand_int_range(rand, 1, 400) << 9;
        if (op == 0 && !in_pool[k]) {
            blocks[k].size = size;
            zp_alloc_pool_insert(&pool, &blocks[k]);
            g_ptr_array_add(list, &blocks[k]);
            in_pool[k] = TRUE;
        } else if (op == 1 && in_pool[k]) {
            heaped += blocks[k].heap_up || blocks[k].heap_child;
            cut += blocks[k].heap_up != NULL; /* inside its heap, not its root */
            zp_alloc_pool_remove(&pool, &blocks[k]);
            g_ptr_array_remove_fast(list, &blocks[k]);
            in_pool[k] = FALSE;
        } else if (op == 2) {
            ZpAllocBlock *want = list_best(list, size);
            ZpAllocBlock *got = zp_alloc_pool_take_best(&pool, size);
            g_assert_true(got == want);
            if (got) {
                g_ptr_array_remove_fast(list, got);
                in_pool[got - blocks] = FALSE;
                taken++;
            } else {
                none++;
            }
        }
        g_assert_cmpuint(pool.n, ==, list->len);
        g_assert_cmpuint(zp_alloc_pool_largest(&pool), ==, list_largest(list));
        most = MAX(most, pool.n_sizes);
        emptied += pool.n_empty > 0;
    }
    /* not vacuous: takes found blocks and found none, removals took blocks out of heaps, from
     * inside them too, sizes were left empty (skipped, refilled, dropped), and more sizes than
     * the scan covers (16) were held, so the halving searched them as well */
    g_assert_cmpuint(taken, >, 10000);
    g_assert_cmpuint(none, >, 100);
    g_assert_cmpuint(heaped, >, 300);
    g_assert_cmpuint(cut, >, 100);
    g_assert_cmpuint(most, >, 32);
    g_assert_cmpuint(emptied, >, 10000);
    zp_alloc_pool_destroy(&pool);
    g_ptr_array_unref(list);
    g_free(in_pool);
    g_free(blocks);
    g_rand_free(rand);
}

/* The free blocks that are whole segments (no neighbours), in (size, address) order, sizes of
 * one block and of several alike. */
static void test_pool_whole_segments(void)
{
    ZpAllocBlock b[6] = {{.addr = 5 << 21, .size = 1 << 20}, {.addr = 3 << 21, .size = 1 << 20},
                         {.addr = 9 << 21, .size = 1 << 20}, {.addr = 1 << 21, .size = 2 << 20},
                         {.addr = 7 << 21, .size = 512},     {.addr = 2 << 21, .size = 512}};
    b[2].prev = &b[0]; /* a part of a segment: not whole */
    ZpAllocPool pool;
    zp_alloc_pool_init(&pool);
    for (int k = 0; k < 6; k++)
        zp_alloc_pool_insert(&pool, &b[k]);
    GPtrArray *whole = g_ptr_array_new();
    zp_alloc_pool_whole_segments(&pool, whole);
    const ZpAllocBlock *want[] = {&b[5], &b[4], &b[1], &b[0], &b[3]};
    g_assert_cmpuint(whole->len, ==, G_N_ELEMENTS(want));
    for (guint k = 0; k < whole->len; k++)
        g_assert_true(g_ptr_array_index(whole, k) == want[k]);
    g_ptr_array_unref(whole);
    zp_alloc_pool_destroy(&pool);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/alloc/pool/as-list", test_pool_as_list);
    g_test_add_func("/alloc/pool/whole-segments", test_pool_whole_segments);
    return g_test_run();
}
