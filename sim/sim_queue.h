/* sim_queue: the simulator's event queue, a binary heap of FIFO buckets of one time each, so that
 * ranks in lockstep queue and take their thousands of events of one instant in O(1) each. */
#ifndef SIM_QUEUE_H
#define SIM_QUEUE_H

#include <glib.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* A queued event, 12 bytes and no pointer: the flow bit of id tells a flow's end (id the flow
 * slot, detail its version when queued) from an op's (id the rank, detail the op); made, the
 * instant it was queued at (Queue.instant), tells blocks' order check (check_order) which
 * events one instant queued. */
typedef struct {
    uint32_t id, detail, made;
} Event;

#define EVENT_FLOW 0x80000000u
/* Event.made of the compute ends an instant's contention queues at its end (sim_engine.c,
 * settle_contention): after every handling of the instant, in no strip of one. */
#define MADE_SETTLED 0x80000000u

/* Events of one time in the order they were queued. */
typedef struct {
    double time_s;
    Event *items;
    uint32_t head, len, cap;
} Bucket;

/* A bucket in the heap with its key, (time, seq), beside it: the heap's walks compare keys
 * without a load through the bucket (seq: among buckets of one time, the order they were
 * made in). */
typedef struct {
    double time_s;
    uint64_t seq;
    uint32_t bucket;
} HeapEntry;

/* The event queue, in (time, queue order) like one binary heap of events, but with the events
 * in FIFO buckets and only the buckets in the heap: ranks in lockstep queue thousands of
 * events at one time, and each goes to the bucket the last event went to, in O(1), when its
 * time is that bucket's. Any other bucket of that time was made earlier and was never pushed
 * to since, so it holds only earlier events: buckets taken by (time, seq) and each in order
 * give exactly the order of the one heap. */
typedef struct {
    Bucket *buckets;
    uint32_t n_buckets, cap_buckets;
    uint32_t *spare; /* buckets not in use (their items kept for reuse) */
    uint32_t n_spare;
    HeapEntry *heap; /* a min-heap by (time_s, seq); heap[heap_len] after all (sim_queue.c) */
    uint32_t heap_len;
    /* The root's bucket was emptied by the last pop and the root left vacant (heap_len still
     * counts it): the next new bucket goes down from there, one walk instead of the pop's and
     * its own (most handlings queue one new event); a pop, or a copy of the heap, fills it
     * (sim_queue_fill) first (sim_queue_next_time reads the root's children). */
    gboolean hole;
    uint32_t last; /* the bucket the last event went to; UINT32_MAX after it emptied */
    /* last's time, NaN where there is none (which no time equals): a push tests it without
     * a load through the buckets (most of a pipeline's make a bucket of their own). */
    double last_time_s;
    uint32_t instant; /* the distinct times taken so far (0 while seeding): Event.made */
    uint32_t made_mark; /* OR'd into Event.made: MADE_SETTLED while contention settles */
    uint64_t next_seq;
    size_t len; /* events queued */
} Queue;

/* A queue with nothing in it. */
#define SIM_QUEUE_EMPTY {.last = UINT32_MAX, .last_time_s = NAN}

/* Queues e at time_s in a new bucket, the newest of its time; and room for one more event in
 * a full bucket (both apart from sim_queue_push, whose common cases stay small enough to
 * inline). */
void sim_queue_push_new(Queue *q, double time_s, Event e);
void sim_queue_grow(Bucket *bucket);

/* Queues event (id, detail) at time_s, after every event queued before at that time. */
G_ALWAYS_INLINE static inline void sim_queue_push(Queue *q, double time_s, uint32_t id,
                                                  uint32_t detail)
{
    const Event e = {id, detail, q->instant | q->made_mark};
    if (q->last_time_s == time_s) { /* false where there is no last bucket */
        Bucket *bucket = &q->buckets[q->last];
        if (G_UNLIKELY(bucket->len == bucket->cap))
            sim_queue_grow(bucket);
        bucket->items[bucket->len++] = e;
        q->len++;
        return;
    }
    sim_queue_push_new(q, time_s, e);
}

/* Fills the vacant root (Queue.hole) with the heap's last entry. */
void sim_queue_fill(Queue *q);

/* The time of the earliest event; the queue must not be empty. With the root vacant, the
 * earlier of its children's (every other entry lies below one of them), the root left
 * vacant: the next new bucket then fills it (sim_queue_push_new), where a fill was a walk
 * to a leaf and back of its own (the loop asks this at every instant's end, before its
 * contention settles and queues its compute ends). */
static inline double sim_queue_next_time(const Queue *q)
{
    const HeapEntry *heap = q->heap;
    if (!q->hole)
        return heap[0].time_s;
    return q->heap_len > 2 && heap[2].time_s < heap[1].time_s ? heap[2].time_s
                                                                : heap[1].time_s;
}

/* The earliest event, its time in *time_s; the queue must not be empty. Inlined into the
 * event loop, its one caller: as a call, its entry and exit were a fifth of it. */
G_ALWAYS_INLINE static inline Event sim_queue_pop(Queue *q, double *time_s)
{
    if (q->hole)
        sim_queue_fill(q);
    const uint32_t b = q->heap[0].bucket;
    Bucket *bucket = &q->buckets[b];
    const Event e = bucket->items[bucket->head++];
    *time_s = bucket->time_s;
    q->len--;
    if (bucket->head == bucket->len) {
        q->hole = TRUE;
        q->spare[q->n_spare++] = b;
        if (q->last == b) {
            q->last = UINT32_MAX;
            q->last_time_s = NAN;
        }
    }
    return e;
}

/* The queue's events in the order they will be taken, with their times (both arrays emptied
 * first); the queue replaced by these events in this order (sim_fold's jumps). */
void sim_queue_events(const Queue *q, GArray *times, GArray *events);
void sim_queue_replace(Queue *q, const GArray *times, const GArray *events);

/* Frees the queue's arrays. */
void sim_queue_clear(Queue *q);

#endif
