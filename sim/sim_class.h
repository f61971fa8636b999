/* sim_class: rank classes — the world's ranks split into classes whose members run the same
 * step at the same times, so that the simulator runs one rank of each (issue 19). */
#ifndef SIM_CLASS_H
#define SIM_CLASS_H

#include "zp_sched.h"

#include <glib.h>
#include <stdint.h>

/* A partition of the world's ranks, classes numbered in the order of their first rank. */
typedef struct {
    uint32_t world, n;
    uint32_t *of_rank;    /* [world]: each rank's class */
    uint32_t *first_rank; /* [n]: the lowest rank of each class */
    uint32_t *count;      /* [n]: ranks in each class */
    uint32_t *stamp, epoch; /* sim_class_group's scratch */
} SimClasses;

/* The coarsest partition that splits the ranks `colour` ([world], any numbers below
 * n_colours) tells apart and, for every communicator in groups (each tiling the world),
 * puts ranks whose groups hold different sets of classes into different classes: the
 * classes of a rank's groups then depend on its class alone, so all ranks of a class wait
 * for the same classes at every collective (colour refinement over the groups). */
void sim_class_refine(SimClasses *out, uint32_t world, const uint32_t *colour,
                      uint32_t n_colours, const ZpCommGroup *groups, uint32_t n_groups);

/* The blocks of explicit ranks the engine steps as units (sim_engine.c): the world's dp rows
 * (row consecutive ranks, a model-parallel group's: every pipeline stage's tensor-parallel
 * ranks) split into maximal runs of consecutive rows that agree rank by rank (the same colour,
 * [world], and the same group of every communicator in groups); a block's ranks of one index
 * in the row are one class. Classes are numbered block by block, index in the row fastest, so
 * in the order of their first ranks: class b * row + j holds ranks (d * row + j) for the
 * block's rows d. With rows of one rank, the runs of consecutive ranks that agree. */
void sim_class_blocks(SimClasses *out, uint32_t world, uint32_t row, const uint32_t *colour,
                      const ZpCommGroup *groups, uint32_t n_groups);

/* The classes in rank's group of communicator g, ascending, into members (room for the
 * group's ranks); returns how many. */
uint32_t sim_class_group(SimClasses *classes, const ZpCommGroup *g, uint32_t rank,
                         uint32_t *members);

void sim_class_clear(SimClasses *classes);

/* Interns variable-length keys of 32-bit words: equal keys get equal ids, 0, 1, ... in the
 * order first seen. */
typedef struct {
    GArray *words; /* the keys back to back */
    GArray *start; /* [id]: where key id begins in words; one more entry for the end */
    uint32_t *slots; /* open addressing over ids + 1 (0: empty) */
    uint32_t cap_slots;
} SimInterner;

void sim_interner_init(SimInterner *t);
uint32_t sim_interner_id(SimInterner *t, const uint32_t *key, uint32_t len);
uint32_t sim_interner_count(const SimInterner *t);
/* Key id's words and their count. */
const uint32_t *sim_interner_key(const SimInterner *t, uint32_t id, uint32_t *len);
void sim_interner_clear(SimInterner *t);

#endif
