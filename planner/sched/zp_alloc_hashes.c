/* zp_alloc_hashes: a set of 64-bit probe hashes, each with the last event that had it, for the
 * allocator replay's fold (zp_alloc_replay.c at_head). */
#include "zp_alloc_hashes.h"

#include <string.h>

/* The table's slots when new or cleared: a stage's steady stretch holds a few heads at a time
 * (2.3 on average between clears in Megatron 1T's replay), so a clear writes this many, not the
 * most a long stretch grew it to (MAX_HEADS, 4,096: 8,192 slots). */
#define HASHES_FIRST_SLOTS 64

static void hashes_alloc(ZpAllocHashes *h, guint slots)
{
    h->key = g_new(uint64_t, slots);
    h->event_1 = g_new0(uint64_t, slots);
    h->mask = slots - 1;
    h->n = 0;
}

void zp_alloc_hashes_init(ZpAllocHashes *h)
{
    hashes_alloc(h, HASHES_FIRST_SLOTS);
}

void zp_alloc_hashes_destroy(ZpAllocHashes *h)
{
    g_free(h->key);
    g_free(h->event_1);
}

/* The slot of key, or of the empty slot where it would go. */
static guint slot_of(const ZpAllocHashes *h, uint64_t key)
{
    guint i = (guint)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 32) & h->mask;
    while (h->event_1[i] != 0 && h->key[i] != key)
        i = (i + 1) & h->mask;
    return i;
}

static void grow(ZpAllocHashes *h)
{
    ZpAllocHashes bigger;
    hashes_alloc(&bigger, 2 * (h->mask + 1));
    for (guint i = 0; i <= h->mask; i++)
        if (h->event_1[i] != 0)
            zp_alloc_hashes_put(&bigger, h->key[i], h->event_1[i] - 1);
    zp_alloc_hashes_destroy(h);
    *h = bigger;
}

void zp_alloc_hashes_put(ZpAllocHashes *h, uint64_t key, uint64_t event)
{
    if (2 * (h->n + 1) > h->mask + 1)
        grow(h);
    const guint i = slot_of(h, key);
    h->n += h->event_1[i] == 0;
    h->key[i] = key;
    h->event_1[i] = event + 1;
}

gboolean zp_alloc_hashes_get(const ZpAllocHashes *h, uint64_t key, uint64_t *event)
{
    const guint i = slot_of(h, key);
    if (h->event_1[i] == 0)
        return FALSE;
    *event = h->event_1[i] - 1;
    return TRUE;
}

void zp_alloc_hashes_clear(ZpAllocHashes *h)
{
    if (h->n == 0)
        return;
    if (h->mask + 1 > HASHES_FIRST_SLOTS) {
        zp_alloc_hashes_destroy(h);
        hashes_alloc(h, HASHES_FIRST_SLOTS);
        return;
    }
    memset(h->event_1, 0, (h->mask + 1) * sizeof *h->event_1);
    h->n = 0;
}
