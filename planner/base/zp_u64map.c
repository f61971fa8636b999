/* zp_u64map: the map's table made, grown, cleared and freed; its probes are inline in
 * zp_u64map.h. */
#include "zp_u64map.h"

#include <string.h>

static void table_alloc(ZpU64Map *m, uint64_t slots)
{
    m->key = g_new0(uint64_t, slots);
    m->value = g_new(uint64_t, slots);
    m->mask = slots - 1;
    m->grow_at = slots / 2;
    m->n = 0;
}

void zp_u64map_init(ZpU64Map *m, uint64_t expect)
{
    uint64_t slots = 16;
    while (slots < 2 * expect)
        slots <<= 1;
    table_alloc(m, slots);
    m->first_slots = slots;
    m->has_zero = FALSE;
}

void zp_u64map_free(ZpU64Map *m)
{
    g_free(m->key);
    g_free(m->value);
    m->key = m->value = NULL;
}

void zp_u64map_clear(ZpU64Map *m)
{
    m->has_zero = FALSE;
    if (m->n == 0)
        return;
    if (m->mask + 1 > m->first_slots) {
        zp_u64map_free(m);
        table_alloc(m, m->first_slots);
        return;
    }
    memset(m->key, 0, (m->mask + 1) * sizeof *m->key);
    m->n = 0;
}

void zp_u64map_grow(ZpU64Map *m)
{
    ZpU64Map bigger = *m;
    table_alloc(&bigger, 2 * (m->mask + 1));
    for (uint64_t i = 0; i <= m->mask; i++)
        if (m->key[i])
            *zp_u64map_at(&bigger, m->key[i], 0) = m->value[i];
    zp_u64map_free(m);
    *m = bigger;
}
