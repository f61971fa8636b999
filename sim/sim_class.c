/* sim_class: rank classes by colour refinement over the communicators' groups, and the
 * interner of word strings it (and the engine's flow table) names sets and tuples with. */
#include "sim_class.h"

#include <stdlib.h>
#include <string.h>

/* ---- the interner ---- */

void sim_interner_init(SimInterner *t)
{
    t->words = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    t->start = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const uint32_t zero = 0;
    g_array_append_val(t->start, zero);
    t->cap_slots = 64;
    t->slots = g_new0(uint32_t, t->cap_slots);
}

uint32_t sim_interner_count(const SimInterner *t)
{
    return t->start->len - 1;
}

const uint32_t *sim_interner_key(const SimInterner *t, uint32_t id, uint32_t *len)
{
    const uint32_t begin = g_array_index(t->start, uint32_t, id);
    *len = g_array_index(t->start, uint32_t, id + 1) - begin;
    return &g_array_index(t->words, uint32_t, begin);
}

static uint32_t hash_words(const uint32_t *key, uint32_t len)
{
    uint64_t h = 0x9e3779b97f4a7c15u ^ len;
    for (uint32_t i = 0; i < len; i++) {
        h = (h ^ key[i]) * 0xff51afd7ed558ccdu;
        h ^= h >> 29;
    }
    return (uint32_t)(h ^ (h >> 32));
}

/* The slot that holds key, or the empty one where it would go. */
static uint32_t *find_slot(const SimInterner *t, const uint32_t *key, uint32_t len)
{
    const uint32_t mask = t->cap_slots - 1;
    for (uint32_t at = hash_words(key, len) & mask;; at = (at + 1) & mask) {
        if (t->slots[at] == 0)
            return &t->slots[at];
        uint32_t other_len;
        const uint32_t *other = sim_interner_key(t, t->slots[at] - 1, &other_len);
        if (other_len == len && memcmp(other, key, len * sizeof *key) == 0)
            return &t->slots[at];
    }
}

static void grow_slots(SimInterner *t)
{
    const uint32_t n = sim_interner_count(t);
    g_free(t->slots);
    t->cap_slots *= 2;
    t->slots = g_new0(uint32_t, t->cap_slots);
    for (uint32_t id = 0; id < n; id++) {
        uint32_t len;
        const uint32_t *key = sim_interner_key(t, id, &len);
        *find_slot(t, key, len) = id + 1;
    }
}

uint32_t sim_interner_id(SimInterner *t, const uint32_t *key, uint32_t len)
{
    uint32_t *slot = find_slot(t, key, len);
    if (*slot != 0)
        return *slot - 1;
    const uint32_t id = sim_interner_count(t);
    g_array_append_vals(t->words, key, len);
    const uint32_t end = t->words->len;
    g_array_append_val(t->start, end);
    *slot = id + 1;
    if (2 * (id + 1) > t->cap_slots)
        grow_slots(t);
    return id;
}

void sim_interner_clear(SimInterner *t)
{
    g_array_free(t->words, TRUE);
    g_array_free(t->start, TRUE);
    g_free(t->slots);
}

/* ---- groups ---- */

static int compare_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The distinct values of of_rank over the members of g's group whose first member is first,
 * ascending; stamp ([values]) marks those seen with epoch, which must be new. */
static uint32_t distinct(const uint32_t *of_rank, const ZpCommGroup *g, uint32_t first,
                         uint32_t *stamp, uint32_t epoch, uint32_t *out)
{
    uint32_t n = 0;
    for (int64_t i = 0; i < g->ranks; i++) {
        const uint32_t r = (uint32_t)zp_group_member(g, first, i);
        if (stamp[of_rank[r]] != epoch) {
            stamp[of_rank[r]] = epoch;
            out[n++] = of_rank[r];
        }
    }
    qsort(out, n, sizeof *out, compare_u32);
    return n;
}

uint32_t sim_class_group(SimClasses *classes, const ZpCommGroup *g, uint32_t rank,
                         uint32_t *members)
{
    const uint32_t first = (uint32_t)zp_group_first(g, zp_group_index(g, rank));
    return distinct(classes->of_rank, g, first, classes->stamp, ++classes->epoch, members);
}

/* ---- refinement ---- */

/* Renumbers colour ([world]) in the order of first appearance into out; returns how many. */
static uint32_t renumber(SimClasses *out, const uint32_t *colour, uint32_t n_colours)
{
    uint32_t *id = g_new(uint32_t, n_colours);
    for (uint32_t c = 0; c < n_colours; c++)
        id[c] = UINT32_MAX;
    uint32_t n = 0;
    for (uint32_t r = 0; r < out->world; r++) {
        if (id[colour[r]] == UINT32_MAX)
            id[colour[r]] = n++;
        out->of_rank[r] = id[colour[r]];
    }
    g_free(id);
    return n;
}

/* Each group's set of classes as an id ([group]), one communicator. */
static void group_sets(const SimClasses *c, const ZpCommGroup *g, uint32_t *set_of,
                       uint32_t *stamp, uint32_t *epoch, uint32_t *scratch)
{
    SimInterner sets;
    sim_interner_init(&sets);
    for (uint32_t k = 0; k < c->world / (uint32_t)g->ranks; k++) {
        const uint32_t n = distinct(c->of_rank, g, (uint32_t)zp_group_first(g, k), stamp,
                                    ++*epoch, scratch);
        set_of[k] = sim_interner_id(&sets, scratch, n);
    }
    sim_interner_clear(&sets);
}

void sim_class_refine(SimClasses *out, uint32_t world, const uint32_t *colour,
                      uint32_t n_colours, const ZpCommGroup *groups, uint32_t n_groups)
{
    *out = (SimClasses){.world = world, .of_rank = g_new(uint32_t, world)};
    out->n = renumber(out, colour, n_colours);
    /* Groups of one rank tell nothing apart. */
    const ZpCommGroup *active[ZP_SCHED_MAX_GROUPS];
    uint32_t n_active = 0, largest = 1;
    for (uint32_t g = 0; g < n_groups; g++)
        if (groups[g].ranks > 1) {
            active[n_active++] = &groups[g];
            largest = MAX(largest, (uint32_t)groups[g].ranks);
        }
    uint32_t *set_of[ZP_SCHED_MAX_GROUPS];
    for (uint32_t a = 0; a < n_active; a++)
        set_of[a] = g_new(uint32_t, world / (uint32_t)active[a]->ranks);
    uint32_t *scratch = g_new(uint32_t, largest);
    uint32_t *next = g_new(uint32_t, world);
    uint32_t key[1 + ZP_SCHED_MAX_GROUPS];
    for (;;) {
        uint32_t *stamp = g_new0(uint32_t, out->n), epoch = 0;
        for (uint32_t a = 0; a < n_active; a++)
            group_sets(out, active[a], set_of[a], stamp, &epoch, scratch);
        g_free(stamp);
        SimInterner tuples;
        sim_interner_init(&tuples);
        for (uint32_t r = 0; r < world; r++) {
            key[0] = out->of_rank[r];
            for (uint32_t a = 0; a < n_active; a++)
                key[1 + a] = set_of[a][zp_group_index(active[a], r)];
            next[r] = sim_interner_id(&tuples, key, 1 + n_active);
        }
        const uint32_t n_next = sim_interner_count(&tuples);
        sim_interner_clear(&tuples);
        /* Each pass splits classes or none (a rank's class is part of its tuple): the same
         * count is the same partition, stable. */
        if (n_next == out->n)
            break;
        out->n = renumber(out, next, n_next);
    }
    for (uint32_t a = 0; a < n_active; a++)
        g_free(set_of[a]);
    g_free(scratch);
    g_free(next);
    out->first_rank = g_new(uint32_t, out->n);
    out->count = g_new0(uint32_t, out->n);
    out->stamp = g_new0(uint32_t, out->n);
    for (uint32_t r = world; r-- > 0;) {
        out->first_rank[out->of_rank[r]] = r;
        out->count[out->of_rank[r]]++;
    }
}

/* Whether dp rows d - 1 and d (row consecutive ranks each) agree rank by rank, index j with
 * index j: the same colour and the same group of every communicator in groups. */
static gboolean rows_agree(const uint32_t *colour, const ZpCommGroup *groups, uint32_t n_groups,
                           uint32_t row, uint32_t d)
{
    for (uint32_t r = d * row; r < (d + 1) * row; r++) {
        if (colour[r] != colour[r - row])
            return FALSE;
        for (uint32_t g = 0; g < n_groups; g++)
            if (zp_group_index(&groups[g], r) != zp_group_index(&groups[g], r - row))
                return FALSE;
    }
    return TRUE;
}

void sim_class_blocks(SimClasses *out, uint32_t world, uint32_t row, const uint32_t *colour,
                      const ZpCommGroup *groups, uint32_t n_groups)
{
    *out = (SimClasses){.world = world, .of_rank = g_new(uint32_t, world)};
    const uint32_t rows = world / row;
    GArray *first_row = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    uint32_t *block_of = g_new(uint32_t, MAX(rows, 1));
    for (uint32_t d = 0; d < rows; d++) {
        if (d == 0 || !rows_agree(colour, groups, n_groups, row, d))
            g_array_append_val(first_row, d);
        block_of[d] = first_row->len - 1;
    }
    const uint32_t n_blocks = first_row->len;
    out->n = n_blocks * row;
    out->first_rank = g_new(uint32_t, MAX(out->n, 1));
    out->count = g_new(uint32_t, MAX(out->n, 1));
    out->stamp = g_new0(uint32_t, MAX(out->n, 1));
    for (uint32_t b = 0; b < n_blocks; b++) {
        const uint32_t first = g_array_index(first_row, uint32_t, b);
        const uint32_t end = b + 1 < n_blocks ? g_array_index(first_row, uint32_t, b + 1) : rows;
        for (uint32_t j = 0; j < row; j++) {
            out->first_rank[b * row + j] = first * row + j;
            out->count[b * row + j] = end - first;
        }
    }
    for (uint32_t r = 0; r < world; r++)
        out->of_rank[r] = block_of[r / row] * row + r % row;
    g_free(block_of);
    g_array_free(first_row, TRUE);
}

void sim_class_clear(SimClasses *classes)
{
    g_free(classes->of_rank);
    g_free(classes->first_rank);
    g_free(classes->count);
    g_free(classes->stamp);
    *classes = (SimClasses){0};
}
