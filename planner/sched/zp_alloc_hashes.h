/* zp_alloc_hashes: the allocator replay's fold (zp_alloc_replay.c) remembers each steady head's
 * probe hash with the last event that had it: a set of 64-bit keys, each with an event. */
#ifndef ZP_ALLOC_HASHES_H
#define ZP_ALLOC_HASHES_H

#include <glib.h>
#include <stdint.h>

/* Open addressing with linear probing, a power-of-two table at most half full; any 64-bit key
 * (a hash), an event (stored + 1: 0 marks an empty slot). Only put, get and clear, which is
 * what the fold asks: GHashTable's replace was 270 instructions a head (5,155 heads of
 * Megatron 1T's replay, 1.4 M). */
typedef struct {
    uint64_t *key, *event_1; /* event_1: the event + 1, 0: empty */
    guint mask, n;
} ZpAllocHashes;

void zp_alloc_hashes_init(ZpAllocHashes *h);
void zp_alloc_hashes_destroy(ZpAllocHashes *h);
/* Sets key's event (replacing one it had). */
void zp_alloc_hashes_put(ZpAllocHashes *h, uint64_t key, uint64_t event);
/* Whether key has an event, and which (*event). */
gboolean zp_alloc_hashes_get(const ZpAllocHashes *h, uint64_t key, uint64_t *event);
/* Drops every key. */
void zp_alloc_hashes_clear(ZpAllocHashes *h);

static inline guint zp_alloc_hashes_size(const ZpAllocHashes *h)
{
    return h->n;
}

#endif
