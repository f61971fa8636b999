/* zp_u64map: a map of 64-bit keys to 64-bit values for the allocator replay's hot paths (names
 * of allocations, probe hashes of the allocator's state), its probes inlined at the callers. */
#ifndef ZP_U64MAP_H
#define ZP_U64MAP_H

#include <glib.h>
#include <stdint.h>

/* Open addressing with linear probing in a power-of-two table kept at most half full; a
 * removal shifts the probe run back (no tombstones). Key 0 marks an empty slot, so key 0
 * itself is held aside (has_zero, zero_value). GHashTable's insert and remove were 300
 * instructions a name (130,000 names for Megatron 1T's long schedule, a fifth of its
 * evaluation), its replace 270 a probe hash. */
typedef struct {
    uint64_t *key; /* 0: empty */
    uint64_t *value;
    uint64_t mask, n; /* n: the keys in the table (key 0 aside) */
    uint64_t grow_at; /* n at which a put doubles the table (half its slots): one comparison */
    uint64_t first_slots; /* the table's size from zp_u64map_init, which clear goes back to */
    gboolean has_zero;
    uint64_t zero_value;
} ZpU64Map;

/* A table for about `expect` keys (it grows past them). */
void zp_u64map_init(ZpU64Map *m, uint64_t expect);
void zp_u64map_free(ZpU64Map *m);
/* Drops every key; the table back to its first size (a large one is not kept for the few
 * keys a cleared map holds again). */
void zp_u64map_clear(ZpU64Map *m);
/* Doubles the table (zp_u64map_slot_for's). */
void zp_u64map_grow(ZpU64Map *m);

static inline uint64_t zp_u64map_size(const ZpU64Map *m)
{
    return m->n + (m->has_zero ? 1 : 0);
}

static inline uint64_t zp_u64map_home(const ZpU64Map *m, uint64_t key)
{
    return (key * UINT64_C(0x9e3779b97f4a7c15)) >> 20 & m->mask;
}

/* The slot of key (not 0), or of the empty slot where it would go. */
static inline uint64_t zp_u64map_slot(const ZpU64Map *m, uint64_t key)
{
    uint64_t i = zp_u64map_home(m, key);
    while (m->key[i] != 0 && m->key[i] != key)
        i = (i + 1) & m->mask;
    return i;
}

/* key's value, set to `fresh` first where key has none: its place, valid till the next put. */
G_ALWAYS_INLINE static inline uint64_t *zp_u64map_at(ZpU64Map *m, uint64_t key, uint64_t fresh)
{
    if (key == 0) {
        if (!m->has_zero)
            m->has_zero = TRUE, m->zero_value = fresh;
        return &m->zero_value;
    }
    if (m->n >= m->grow_at)
        zp_u64map_grow(m);
    const uint64_t i = zp_u64map_slot(m, key);
    if (m->key[i] == 0) {
        m->n++;
        m->key[i] = key;
        m->value[i] = fresh;
    }
    return &m->value[i];
}

/* Sets key's value. */
G_ALWAYS_INLINE static inline void zp_u64map_put(ZpU64Map *m, uint64_t key, uint64_t value)
{
    *zp_u64map_at(m, key, value) = value;
}

/* key's value, or `absent` where it has none. */
static inline uint64_t zp_u64map_get(const ZpU64Map *m, uint64_t key, uint64_t absent)
{
    if (key == 0)
        return m->has_zero ? m->zero_value : absent;
    const uint64_t i = zp_u64map_slot(m, key);
    return m->key[i] ? m->value[i] : absent;
}

/* Empties slot i (a key's), moving back the entries after it whose probe passed it. */
G_ALWAYS_INLINE static inline void zp_u64map_remove_slot(ZpU64Map *m, uint64_t i)
{
    m->n--;
    for (uint64_t j = (i + 1) & m->mask;; j = (j + 1) & m->mask) {
        if (m->key[j] == 0)
            break;
        const uint64_t home = zp_u64map_home(m, m->key[j]);
        /* j's entry stays where its home lies cyclically in (i, j] */
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        m->key[i] = m->key[j];
        m->value[i] = m->value[j];
        i = j;
    }
    m->key[i] = 0;
}

/* Removes key (where it is). */
G_ALWAYS_INLINE static inline void zp_u64map_remove(ZpU64Map *m, uint64_t key)
{
    if (key == 0) {
        m->has_zero = FALSE;
        return;
    }
    const uint64_t i = zp_u64map_slot(m, key);
    if (m->key[i] != 0)
        zp_u64map_remove_slot(m, i);
}

/* key's value, removed (one probe, not a get and a remove: a free's name is looked up once,
 * to be dropped), or `absent` where it has none. */
G_ALWAYS_INLINE static inline uint64_t zp_u64map_take(ZpU64Map *m, uint64_t key, uint64_t absent)
{
    if (key == 0) {
        const uint64_t value = m->has_zero ? m->zero_value : absent;
        m->has_zero = FALSE;
        return value;
    }
    const uint64_t i = zp_u64map_slot(m, key);
    if (m->key[i] == 0)
        return absent;
    const uint64_t value = m->value[i];
    zp_u64map_remove_slot(m, i);
    return value;
}

#endif
