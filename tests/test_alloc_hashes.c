/* test_alloc_hashes: the allocator replay fold's table of probe hashes (zp_alloc_hashes), against
 * the GHashTable it replaced, which keyed the same 64-bit hashes by direct value. */
#include "zp_alloc_hashes.h"

#include <glib.h>

/* Every operation the fold makes (put, get, clear at MAX_HEADS or at a stage's head), drawn at
 * random over keys that share their low bits and their high bits, 0 and the largest key among
 * them: each get answers what the GHashTable answers, and the size matches, through growth to
 * 4,096 keys (8,192 slots from 64) and the clears that shrink the table back. */
static void test_hashes_as_ghashtable(void)
{
    GRand *rand = g_rand_new_with_seed(7);
    ZpAllocHashes h;
    zp_alloc_hashes_init(&h);
    GHashTable *ref = g_hash_table_new(g_direct_hash, g_direct_equal);
    guint clears = 0, found = 0, most = 0;
    for (uint64_t e = 0; e < 200000; e++) {
        const guint pick = (guint)g_rand_int_range(rand, 0, 20000);
        /* keys alike in their low 32 bits, or in their high ones, and the edges */
        const uint64_t key = pick == 0   ? 0
                             : pick == 1 ? UINT64_MAX
                             : pick % 2  ? (uint64_t)pick << 40
                                         : (uint64_t)pick;
        /* cleared as the fold clears: at a stage's head (here at random, for stretches of
         * every length) and when 4,096 are held (MAX_HEADS) */
        const guint op = (guint)g_rand_int_range(rand, 0, 20000);
        if (op == 0 || g_hash_table_size(ref) >= 4096) {
            zp_alloc_hashes_clear(&h);
            g_hash_table_remove_all(ref);
            clears++;
        } else if (op < 10000) {
            zp_alloc_hashes_put(&h, key, e);
            g_hash_table_replace(ref, GSIZE_TO_POINTER(key), GSIZE_TO_POINTER(e));
        } else {
            uint64_t at = UINT64_MAX;
            gpointer want;
            const gboolean has = zp_alloc_hashes_get(&h, key, &at);
            g_assert_cmpint(has, ==,
                            g_hash_table_lookup_extended(ref, GSIZE_TO_POINTER(key), NULL, &want));
            if (has)
                g_assert_cmpuint(at, ==, GPOINTER_TO_SIZE(want));
            found += has;
        }
        g_assert_cmpuint(zp_alloc_hashes_size(&h), ==, g_hash_table_size(ref));
        most = MAX(most, zp_alloc_hashes_size(&h));
    }
    /* not vacuous: the table grew far past its first size and was cleared from there */
    g_assert_cmpuint(most, ==, 4096);
    g_assert_cmpuint(clears, >, 10);
    g_assert_cmpuint(found, >, 10000);
    g_hash_table_destroy(ref);
    zp_alloc_hashes_destroy(&h);
    g_rand_free(rand);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/alloc/hashes/as-ghashtable", test_hashes_as_ghashtable);
    return g_test_run();
}
