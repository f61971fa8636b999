/* zp_alloc_slots: the contiguous regions' slot marks (zp_alloc_replay's in_region_at) moved
 * over the events a fold skips, without replaying them one by one. */
#include "zp_alloc_slots.h"

#include <string.h>

void zp_alloc_slots_undo(uint8_t *marks, const GArray *undo)
{
    for (guint k = undo->len; k-- > 0;) {
        const uint32_t slot = g_array_index(undo, uint32_t, k);
        marks[slot] = !marks[slot];
    }
}

/* Sets slot's mark to `mark`, the change in undo. */
static void set_mark(uint8_t *marks, uint32_t slot, gboolean mark, GArray *undo)
{
    if (marks[slot] != mark) {
        g_array_append_val(undo, slot);
        marks[slot] = (uint8_t)mark;
    }
}

/* Run x's window of buffers (its copies take them again) turned `copies` copies on: where
 * the window's k-th buffer is then. */
static uint32_t window_slot(const ZpAllocEventRun *x, uint64_t copies, int64_t k)
{
    const uint64_t window = (uint64_t)x->buffer_window;
    const uint64_t turn = copies % window * (uint64_t)x->buffer_step % window;
    return (uint32_t)(x->buffer_first + (int64_t)(((uint64_t)k + turn) % window) + 1);
}

/* The marks of run x's window at the head of its copy `copies` (from 0), turned back by as
 * many copies, into now[]; TRUE where they are `was` (the copy before's, turned back
 * likewise): each copy then leaves the marks as the one before did, turned a copy on, its
 * frees finding theirs as that one's did. */
static gboolean window_marks_repeat(const uint8_t *marks, const ZpAllocEventRun *x,
                                    uint64_t copies, uint8_t *now, const uint8_t *was)
{
    for (int64_t k = 0; k < x->buffer_window; k++)
        now[k] = marks[window_slot(x, copies, k)];
    return was && memcmp(now, was, (size_t)x->buffer_window) == 0;
}

/* The region slots' marks (region[buffer + 1]) as the events [from, to) leave them: each
 * slot's alloc marks it, each slot's free unmarks it; FALSE, the marks as they were, where a
 * slot's free finds no mark (it would release a block: not the no-op zp_alloc_repeat_events
 * counted on). The plain frees skipped find no mark: a buffer's plain alloc comes only after
 * its slot's free (zp_alloc_seq_build), which unmarked it. Inside a run whose copies take
 * their buffers again, from the copy whose head's marks are the one before's turned a copy on
 * (window_marks_repeat) to its last whole copy in range, the marks are those turned on (each
 * buffer is freed before it is taken again, so they repeat within a window's copies: gpt-1t
 * ZeRO-3's contiguous gradient buckets over 20,000 micro-steps were 128 M events a fold, and
 * a change each in the undo list, 268 MB). */
gboolean zp_alloc_slots_skip(const ZpAllocSeq *q, uint8_t *region, uint64_t from, uint64_t to,
                             GArray *undo)
{
    g_array_set_size(undo, 0);
    gboolean ok = TRUE;
    ZpAllocCursor at = ZP_ALLOC_CURSOR_INIT;
    uint8_t *seen[2] = {NULL, NULL}; /* a window's, turned back: now and the copy before */
    const ZpAllocEventRun *marked = NULL;
    uint64_t marked_at = 0;
    for (uint64_t j = from; ok && j < to; j++) {
        ZpAllocEvent tmp;
        const ZpAllocEvent *v = zp_alloc_seq_cursor_event(q, &at, j, &tmp);
        const ZpAllocEventRun *x = v == &tmp ? at.run : NULL;
        if (x && !x->slots) { /* a run without slots changes none */
            j = MIN(to, x->end) - 1;
            continue;
        }
        if (x && x->buffer_window > 0 && (j - x->start) % x->len == 0) {
            const uint64_t copies = (j - x->start) / x->len;
            const uint64_t last = (MIN(to, x->end) - x->start) / x->len;
            const gboolean after = marked == x && marked_at + x->len == j;
            if (marked != x) {
                g_free(seen[0]);
                g_free(seen[1]);
                seen[0] = g_new(uint8_t, x->buffer_window);
                seen[1] = g_new(uint8_t, x->buffer_window);
            }
            uint8_t *was = seen[1];
            seen[1] = seen[0];
            seen[0] = was;
            marked = x;
            marked_at = j;
            if (window_marks_repeat(region, x, copies, seen[1], after ? seen[0] : NULL) &&
                last > copies) {
                for (int64_t k = 0; k < x->buffer_window; k++)
                    set_mark(region, window_slot(x, last, k), seen[1][k], undo);
                marked = NULL;
                j = x->start + last * x->len - 1;
                continue;
            }
        }
        if (!(v->flags & (ZP_ALLOC_EV_CKPT | ZP_ALLOC_EV_GRAD)))
            continue;
        const uint32_t slot = (uint32_t)(v->buffer + 1);
        ok = v->kind == ZP_OP_ALLOC || region[slot];
        if (ok)
            set_mark(region, slot, v->kind == ZP_OP_ALLOC, undo);
    }
    g_free(seen[0]);
    g_free(seen[1]);
    if (!ok)
        zp_alloc_slots_undo(region, undo);
    return ok;
}
