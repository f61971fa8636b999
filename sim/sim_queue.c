/* sim_queue: the simulator's event queue, a binary heap of FIFO buckets of one time each, so that
 * ranks in lockstep queue and take their thousands of events of one instant in O(1) each. */
#include "sim_queue.h"

static gboolean bucket_before(const Queue *q, uint32_t a, uint32_t b)
{
    const Bucket *x = &q->buckets[a], *y = &q->buckets[b];
    return x->time_s < y->time_s || (x->time_s == y->time_s && x->seq < y->seq);
}

static void queue_sift_down(Queue *q, size_t i)
{
    const uint32_t moving = q->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= q->heap_len)
            break;
        if (child + 1 < q->heap_len && bucket_before(q, q->heap[child + 1], q->heap[child]))
            child++;
        if (!bucket_before(q, q->heap[child], moving))
            break;
        q->heap[i] = q->heap[child];
        i = child;
    }
    q->heap[i] = moving;
}

/* A bucket for time_s, newest of its time, in the heap. */
static uint32_t queue_new_bucket(Queue *q, double time_s)
{
    uint32_t b;
    if (q->n_spare > 0) {
        b = q->spare[--q->n_spare];
    } else {
        if (q->n_buckets == q->cap_buckets) {
            q->cap_buckets = q->cap_buckets ? 2 * q->cap_buckets : 64;
            q->buckets = g_renew(Bucket, q->buckets, q->cap_buckets);
            q->spare = g_renew(uint32_t, q->spare, q->cap_buckets);
            q->heap = g_renew(uint32_t, q->heap, q->cap_buckets);
        }
        b = q->n_buckets++;
        q->buckets[b] = (Bucket){0};
    }
    Bucket *bucket = &q->buckets[b];
    bucket->time_s = time_s;
    bucket->seq = q->next_seq++;
    bucket->head = bucket->len = 0;
    size_t i = q->heap_len++;
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (!bucket_before(q, b, q->heap[parent]))
            break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = b;
    return b;
}

Bucket *sim_queue_bucket_for(Queue *q, double time_s)
{
    uint32_t b = q->last;
    if (b == UINT32_MAX || q->buckets[b].time_s != time_s)
        b = q->last = queue_new_bucket(q, time_s);
    Bucket *bucket = &q->buckets[b];
    if (bucket->len == bucket->cap) {
        bucket->cap = bucket->cap ? 2 * bucket->cap : 16;
        bucket->items = g_renew(Event, bucket->items, bucket->cap);
    }
    return bucket;
}

Event sim_queue_pop(Queue *q, double *time_s)
{
    const uint32_t b = q->heap[0];
    Bucket *bucket = &q->buckets[b];
    const Event e = bucket->items[bucket->head++];
    *time_s = bucket->time_s;
    q->len--;
    if (bucket->head == bucket->len) {
        q->heap[0] = q->heap[--q->heap_len];
        if (q->heap_len > 0)
            queue_sift_down(q, 0);
        q->spare[q->n_spare++] = b;
        if (q->last == b)
            q->last = UINT32_MAX;
    }
    return e;
}

static int compare_buckets(const void *a, const void *b, void *ctx)
{
    const Queue *q = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return bucket_before(q, x, y) ? -1 : bucket_before(q, y, x) ? 1 : 0;
}

void sim_queue_events(const Queue *q, GArray *times, GArray *events)
{
    g_array_set_size(times, 0);
    g_array_set_size(events, 0);
    uint32_t *order = g_memdup2(q->heap, MAX(q->heap_len, 1) * sizeof *order);
    g_qsort_with_data(order, (gint)q->heap_len, sizeof *order, compare_buckets, (void *)q);
    for (uint32_t k = 0; k < q->heap_len; k++) {
        const Bucket *b = &q->buckets[order[k]];
        for (uint32_t i = b->head; i < b->len; i++) {
            g_array_append_val(times, b->time_s);
            g_array_append_val(events, b->items[i]);
        }
    }
    g_free(order);
}

void sim_queue_replace(Queue *q, const GArray *times, const GArray *events)
{
    for (uint32_t k = 0; k < q->heap_len; k++)
        q->spare[q->n_spare++] = q->heap[k];
    q->heap_len = 0;
    q->len = 0;
    q->last = UINT32_MAX;
    for (guint k = 0; k < events->len; k++) {
        const Event *e = &g_array_index(events, Event, k);
        Bucket *bucket = sim_queue_bucket_for(q, g_array_index(times, double, k));
        bucket->items[bucket->len++] = *e;
        q->len++;
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
