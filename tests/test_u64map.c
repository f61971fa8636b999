/* test_u64map: zp_u64map, the allocator replay's map of names and of probe hashes, against a
 * GHashTable keyed by the same 64-bit values, through every operation its users make. */
#include "zp_u64map.h"

#include <glib.h>

/* Puts, gets, removes, takes and clears drawn at random over keys that share their low bits or their
 * high bits, 0 and the largest key: each get answers what the GHashTable answers and the size
 * matches, through growth to 4,096 keys (8,192 slots from 64), the removals that shift probe
 * runs back (keys alike in their high bits share homes), and the clears that shrink the table
 * back (the replay's fold clears at a stage's head and at 4,096 heads). */
static void test_u64map_as_ghashtable(void)
{
    GRand *rand = g_rand_new_with_seed(7);
    ZpU64Map m;
    zp_u64map_init(&m, 32);
    GHashTable *ref = g_hash_table_new(g_direct_hash, g_direct_equal);
    guint clears = 0, found = 0, removed = 0, taken = 0, most = 0;
    for (uint64_t e = 0; e < 300000; e++) {
        const guint pick = (guint)g_rand_int_range(rand, 0, 20000);
        const uint64_t key = pick == 0   ? 0
                             : pick == 1 ? UINT64_MAX
                             : pick % 2  ? (uint64_t)pick << 40
                                         : (uint64_t)pick;
        const guint op = (guint)g_rand_int_range(rand, 0, 20000);
        if (op == 0 || g_hash_table_size(ref) >= 4096) {
            zp_u64map_clear(&m);
            g_hash_table_remove_all(ref);
            clears++;
        } else if (op < 9000) {
            zp_u64map_put(&m, key, e);
            g_hash_table_replace(ref, GSIZE_TO_POINTER(key), GSIZE_TO_POINTER(e));
        } else if (op < 10500) {
            removed += g_hash_table_remove(ref, GSIZE_TO_POINTER(key));
            zp_u64map_remove(&m, key);
        } else if (op < 12000) { /* a free's name: its value, and gone */
            gpointer want;
            const gboolean has =
                g_hash_table_lookup_extended(ref, GSIZE_TO_POINTER(key), NULL, &want);
            g_assert_cmpuint(zp_u64map_take(&m, key, UINT64_MAX), ==,
                             has ? GPOINTER_TO_SIZE(want) : UINT64_MAX);
            g_hash_table_remove(ref, GSIZE_TO_POINTER(key));
            taken += has;
        } else {
            gpointer want;
            const uint64_t at = zp_u64map_get(&m, key, UINT64_MAX);
            const gboolean has =
                g_hash_table_lookup_extended(ref, GSIZE_TO_POINTER(key), NULL, &want);
            g_assert_cmpuint(at, ==, has ? GPOINTER_TO_SIZE(want) : UINT64_MAX);
            found += has;
        }
        g_assert_cmpuint(zp_u64map_size(&m), ==, g_hash_table_size(ref));
        most = MAX(most, (guint)zp_u64map_size(&m));
    }
    /* not vacuous: the table grew far past its first size, lost keys and was cleared */
    g_assert_cmpuint(most, ==, 4096);
    g_assert_cmpuint(clears, >, 10);
    g_assert_cmpuint(found, >, 10000);
    g_assert_cmpuint(removed, >, 1000);
    g_assert_cmpuint(taken, >, 1000);
    g_hash_table_destroy(ref);
    zp_u64map_free(&m);
    g_rand_free(rand);
}

/* zp_u64map_at: a key's place, set to `fresh` once (name_role counts ordinals through it). */
static void test_u64map_count(void)
{
    ZpU64Map m;
    zp_u64map_init(&m, 4);
    for (uint64_t k = 0; k < 1000; k++)
        for (uint64_t t = 0; t <= k % 5; t++)
            g_assert_cmpuint((*zp_u64map_at(&m, k << 32, 0))++, ==, t);
    for (uint64_t k = 0; k < 1000; k++)
        g_assert_cmpuint(zp_u64map_get(&m, k << 32, 99), ==, k % 5 + 1);
    g_assert_cmpuint(zp_u64map_size(&m), ==, 1000);
    zp_u64map_free(&m);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/u64map/as-ghashtable", test_u64map_as_ghashtable);
    g_test_add_func("/u64map/count", test_u64map_count);
    return g_test_run();
}
