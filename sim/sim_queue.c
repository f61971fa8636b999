/* sim_queue: the simulator's event queue, a binary heap of FIFO buckets of one time each, so that
 * ranks in lockstep queue and take their thousands of events of one instant in O(1) each. */
#include "sim_queue.h"

#include <math.h>

/* What the heap keeps one past its last entry (heap[heap_len]): after every entry, so that a
 * walk down takes the earlier of two children without testing whether the second is there (a
 * test each level of every walk down). */
static const HeapEntry AFTER_ALL = {.time_s = INFINITY, .seq = UINT64_MAX, .bucket = UINT32_MAX};

static inline gboolean entry_before(const HeapEntry *x, const HeapEntry *y)
{
    return x->time_s < y->time_s || (x->time_s == y->time_s && x->seq < y->seq);
}

/* Where e goes in the heap, climbing from the free place i: the entries above that come after
 * it move down a level each (the heap's sift up). */
static inline size_t climb(HeapEntry *heap, size_t i, const HeapEntry *e)
{
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (!entry_before(e, &heap[parent]))
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    return i;
}

/* Where the vacant root's hole comes to rest going down the heap of n entries along the
 * earlier child, each child moving up a level: at a leaf, or (stop) above the first child
 * that does not come before *stop (the sift down). heap[n] must be AFTER_ALL. Inlined into
 * both callers, the test of stop folds away where it is NULL. */
G_ALWAYS_INLINE static inline size_t descend(HeapEntry *heap, size_t n, const HeapEntry *stop)
{
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (entry_before(&heap[child + 1], &heap[child])) /* at n: AFTER_ALL */
            child++;
        if (stop && !entry_before(&heap[child], stop))
            break;
        heap[i] = heap[child];
        i = child;
    }
    return i;
}

/* Fills the vacant root, the heap one entry shorter: the hole goes down along the earlier
 * child to a leaf, one comparison a level, and the last entry, which is rarely early, climbs
 * back from there (Floyd's variant of the sift down; the plain one compares twice a level on
 * the way down). */
void sim_queue_fill(Queue *q)
{
    q->hole = FALSE;
    const size_t n = --q->heap_len;
    HeapEntry *heap = q->heap;
    const HeapEntry moving = heap[n];
    heap[n] = AFTER_ALL;
    if (n > 0)
        heap[climb(heap, descend(heap, n, NULL), &moving)] = moving;
}

/* One bucket more, made spare with room for its first events (the arrays grown where full). */
static void queue_add_bucket(Queue *q)
{
    if (q->n_buckets == q->cap_buckets) {
        q->cap_buckets = q->cap_buckets ? 2 * q->cap_buckets : 64;
        q->buckets = g_renew(Bucket, q->buckets, q->cap_buckets);
        q->spare = g_renew(uint32_t, q->spare, q->cap_buckets);
        /* one more: AFTER_ALL past the last entry */
        q->heap = g_renew(HeapEntry, q->heap, (size_t)q->cap_buckets + 1);
        q->heap[q->heap_len] = AFTER_ALL;
    }
    q->buckets[q->n_buckets] = (Bucket){0};
    sim_queue_grow(&q->buckets[q->n_buckets]);
    q->spare[q->n_spare++] = q->n_buckets++;
}

void sim_queue_grow(Bucket *bucket)
{
    bucket->cap = bucket->cap ? 2 * bucket->cap : 16;
    bucket->items = g_renew(Event, bucket->items, bucket->cap);
}

/* sim_queue_push_new, a spare bucket at hand, which every spare bucket has room for an event
 * (queue_add_bucket gives it room, and a bucket keeps its items while spare). */
G_ALWAYS_INLINE static inline void push_new_spare(Queue *q, double time_s, Event e)
{
    const uint32_t b = q->spare[--q->n_spare];
    Bucket *bucket = &q->buckets[b];
    bucket->time_s = time_s;
    bucket->head = 0;
    bucket->len = 1;
    bucket->items[0] = e;
    q->last = b;
    q->last_time_s = time_s;
    q->len++;
    const HeapEntry entry = {.time_s = time_s, .seq = q->next_seq++, .bucket = b};
    HeapEntry *heap = q->heap;
    size_t i;
    if (q->hole) {
        q->hole = FALSE;
        i = descend(heap, q->heap_len, &entry);
    } else {
        i = climb(heap, q->heap_len++, &entry);
        heap[q->heap_len] = AFTER_ALL;
    }
    heap[i] = entry;
}

/* No spare bucket: one made first. Apart, so that the common path makes no call, and keeps
 * nothing on the stack across one (its entry and exit were a sixth of it). */
G_NO_INLINE static void push_new_add(Queue *q, double time_s, Event e)
{
    queue_add_bucket(q);
    push_new_spare(q, time_s, e);
}

/* A new bucket, the newest of its time, holding e, into the heap: down from the vacant root
 * (Queue.hole) as a sift down, since new events are often early, or up from a new leaf. */
void sim_queue_push_new(Queue *q, double time_s, Event e)
{
    if (G_UNLIKELY(q->n_spare == 0)) {
        push_new_add(q, time_s, e);
        return;
    }
    push_new_spare(q, time_s, e);
}

/* The buckets of the heap's n entries (heap[0] vacant where `hole`) in the order the queue
 * takes them, into order: the copy popped as sim_queue_pop and sim_queue_fill pop (every key is
 * unique, so that is the sorted order; qsort's merge sort was 0.7 M of narayanan21-t1-529.6b's
 * instructions over its 77 calls). Returns how many. */
static uint32_t heap_order(HeapEntry *heap, size_t n, gboolean hole, HeapEntry *order)
{
    uint32_t k = 0;
    for (;;) {
        if (hole) {
            if (--n == 0)
                return k;
            const HeapEntry moving = heap[n];
            heap[n] = AFTER_ALL;
            heap[climb(heap, descend(heap, n, NULL), &moving)] = moving;
        }
        order[k++] = heap[0];
        hole = TRUE;
    }
}

void sim_queue_events(const Queue *q, GArray *times, GArray *events)
{
    g_array_set_size(times, 0);
    g_array_set_size(events, 0);
    if (q->heap_len == 0)
        return;
    HeapEntry *heap = g_memdup2(q->heap, (q->heap_len + 1) * sizeof *heap); /* AFTER_ALL too */
    HeapEntry *order = g_new(HeapEntry, q->heap_len);
    const uint32_t n = heap_order(heap, q->heap_len, q->hole, order);
    g_free(heap);
    /* Sized once and written in place: an append each was a call (0.8 M of
     * narayanan21-t1-529.6b's 77 calls) */
    size_t count = 0;
    for (uint32_t k = 0; k < n; k++)
        count += q->buckets[order[k].bucket].len - q->buckets[order[k].bucket].head;
    g_array_set_size(times, (guint)count);
    g_array_set_size(events, (guint)count);
    double *time_s = (double *)(void *)times->data;
    Event *event = (Event *)(void *)events->data;
    for (uint32_t k = 0, at = 0; k < n; k++) {
        const Bucket *b = &q->buckets[order[k].bucket];
        for (uint32_t i = b->head; i < b->len; i++, at++) {
            time_s[at] = b->time_s;
            event[at] = b->items[i];
        }
    }
    g_free(order);
}

void sim_queue_replace(Queue *q, const GArray *times, const GArray *events)
{
    for (uint32_t k = q->hole ? 1 : 0; k < q->heap_len; k++)
        q->spare[q->n_spare++] = q->heap[k].bucket;
    q->heap_len = 0;
    if (q->heap)
        q->heap[0] = AFTER_ALL;
    q->hole = FALSE;
    q->len = 0;
    q->last = UINT32_MAX;
    q->last_time_s = NAN;
    for (guint k = 0; k < events->len; k++) {
        const Event *e = &g_array_index(events, Event, k);
        sim_queue_push(q, g_array_index(times, double, k), e->id, e->detail);
        q->buckets[q->last].items[q->buckets[q->last].len - 1].made = e->made;
    }
}

void sim_queue_clear(Queue *q)
{
    for (uint32_t b = 0; b < q->n_buckets; b++)
        g_free(q->buckets[b].items);
    g_free(q->buckets);
    g_free(q->spare);
    g_free(q->heap);
}
