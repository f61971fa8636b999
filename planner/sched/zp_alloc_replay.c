/* zp_alloc_replay: segments hold blocks in address order (a doubly linked list per
 * segment); each pool's free blocks sit in a GTree ordered by (size, address), so best fit
 * is a lower bound, as PyTorch's std::set of blocks does it. Sizes are whole bytes. */
#include "zp_alloc_replay.h"
#include "zp_zeror.h"

#include <math.h>

typedef struct Block Block;
struct Block {
    uint64_t addr, size;
    gboolean allocated, small;
    Block *prev, *next; /* neighbours in the segment */
};

struct ZpAllocReplay {
    double capacity_bytes;
    uint64_t next_addr;
    GTree *pools[2];    /* [0] large, [1] small: free blocks */
    /* id -> Block. Every Block is in a pool or here until a neighbour absorbs it or it goes
     * back whole: zreal replays each step's allocations for as long as it trains, so nothing
     * may be kept per allocation (each key and merged Block once was, until the end: about
     * 900 bytes a step with tiny, whose small long-lived chunks split the holes glibc had
     * left, and its heap grew by a step's activations every step). */
    GHashTable *live;
    ZpAllocStats stats;
};

static int block_cmp(gconstpointer a, gconstpointer b)
{
    const Block *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

ZpAllocReplay *zp_alloc_replay_new(double capacity_bytes)
{
    ZpAllocReplay *a = g_new0(ZpAllocReplay, 1);
    a->capacity_bytes = capacity_bytes;
    a->next_addr = 1 << 21;
    for (int p = 0; p < 2; p++)
        a->pools[p] = g_tree_new(block_cmp);
    a->live = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    return a;
}

/* GTraverseFunc: frees a pool's block (the key). */
static gboolean free_key(gpointer key, gpointer value, gpointer unused)
{
    (void)value, (void)unused;
    g_free(key);
    return FALSE;
}

/* GHFunc: frees an allocated block (the value; the table frees its key). */
static void free_value(gpointer key, gpointer value, gpointer unused)
{
    (void)key, (void)unused;
    g_free(value);
}

void zp_alloc_replay_free_all(ZpAllocReplay *a)
{
    if (!a)
        return;
    for (int p = 0; p < 2; p++) {
        g_tree_foreach(a->pools[p], free_key, NULL);
        g_tree_destroy(a->pools[p]);
    }
    g_hash_table_foreach(a->live, free_value, NULL);
    g_hash_table_destroy(a->live);
    g_free(a);
}

static Block *new_block(uint64_t addr, uint64_t size, gboolean small)
{
    Block *b = g_new0(Block, 1);
    *b = (Block){.addr = addr, .size = size, .small = small};
    return b;
}

/* round_size(): at least 512 bytes, a multiple of 512. */
static uint64_t round_size(double bytes)
{
    const uint64_t n = (uint64_t)ceil(bytes);
    const uint64_t m = (uint64_t)ZP_ALLOC_MIN_BLOCK_BYTES;
    return n < m ? m : (n + m - 1) / m * m;
}

/* get_allocation_size(): the segment a request that found no cached block gets. */
static uint64_t segment_size(uint64_t size)
{
    if (size <= ZP_ALLOC_SMALL_SIZE_BYTES)
        return (uint64_t)ZP_ALLOC_SMALL_BUFFER_BYTES;
    if (size < ZP_ALLOC_MIN_LARGE_ALLOC_BYTES)
        return (uint64_t)ZP_ALLOC_LARGE_BUFFER_BYTES;
    const uint64_t r = (uint64_t)ZP_ALLOC_ROUND_LARGE_BYTES;
    return (size + r - 1) / r * r;
}

static double largest_free(const ZpAllocReplay *a)
{
    double largest = 0;
    for (int p = 0; p < 2; p++) {
        GTreeNode *last = g_tree_node_last(a->pools[p]);
        if (last)
            largest = fmax(largest, (double)((Block *)g_tree_node_key(last))->size);
    }
    return largest;
}

/* release_cached_blocks(): every free block that is a whole segment goes back to CUDA. */
static gboolean collect_whole(gpointer key, gpointer value, gpointer data)
{
    (void)value;
    Block *b = key;
    if (!b->prev && !b->next)
        g_ptr_array_add(data, b);
    return FALSE;
}

static void release_cached(ZpAllocReplay *a)
{
    GPtrArray *whole = g_ptr_array_new();
    for (int p = 0; p < 2; p++) {
        g_tree_foreach(a->pools[p], collect_whole, whole);
        for (guint i = 0; i < whole->len; i++) {
            Block *b = g_ptr_array_index(whole, i);
            g_tree_remove(a->pools[p], b);
            a->stats.reserved_bytes -= (double)b->size;
            g_free(b);
        }
        g_ptr_array_set_size(whole, 0);
    }
    g_ptr_array_unref(whole);
}

static gboolean fits(const ZpAllocReplay *a, uint64_t seg)
{
    return a->capacity_bytes <= 0 || a->stats.reserved_bytes + (double)seg <= a->capacity_bytes;
}

/* should_split(): what remains must be worth a block of its pool. */
static gboolean should_split(const Block *b, uint64_t size)
{
    const uint64_t rest = b->size - size;
    return b->small ? rest >= ZP_ALLOC_MIN_BLOCK_BYTES : rest > ZP_ALLOC_SMALL_SIZE_BYTES;
}

static void record_peak(ZpAllocReplay *a)
{
    ZpAllocStats *s = &a->stats;
    s->peak_reserved_bytes = fmax(s->peak_reserved_bytes, s->reserved_bytes);
    if (s->allocated_bytes >= s->peak_allocated_bytes) {
        s->peak_allocated_bytes = s->allocated_bytes;
        s->reserved_at_peak_bytes = s->reserved_bytes;
        s->largest_free_at_peak_bytes = largest_free(a);
    }
}

gboolean zp_alloc_replay_malloc(ZpAllocReplay *a, uint64_t id, double bytes)
{
    const uint64_t size = round_size(bytes);
    const gboolean small = size <= ZP_ALLOC_SMALL_SIZE_BYTES;
    GTree *pool = a->pools[small];
    Block key = {.addr = 0, .size = size};
    GTreeNode *node = g_tree_lower_bound(pool, &key);
    Block *b = node ? g_tree_node_key(node) : NULL;
    if (b) {
        g_tree_remove(pool, b);
    } else {
        const uint64_t seg = segment_size(size);
        if (!fits(a, seg))
            release_cached(a);
        if (!fits(a, seg)) {
            ZpAllocStats *s = &a->stats;
            s->oom = TRUE;
            s->oom_request_bytes = (double)size;
            s->oom_allocated_bytes = s->allocated_bytes;
            s->oom_reserved_bytes = s->reserved_bytes;
            s->oom_largest_free_bytes = largest_free(a);
            s->oom_fragmented = s->allocated_bytes + (double)size <= a->capacity_bytes;
            return FALSE;
        }
        b = new_block(a->next_addr, seg, small);
        /* Segments never touch, so blocks merge only inside their own. */
        a->next_addr += seg + (uint64_t)ZP_ALLOC_SMALL_BUFFER_BYTES;
        a->stats.reserved_bytes += (double)seg;
        a->stats.segments_allocated++;
    }
    if (should_split(b, size)) {
        Block *rest = new_block(b->addr + size, b->size - size, small);
        rest->prev = b;
        rest->next = b->next;
        if (b->next)
            b->next->prev = rest;
        b->next = rest;
        b->size = size;
        g_tree_insert(pool, rest, rest);
    }
    b->allocated = TRUE;
    a->stats.allocated_bytes += (double)b->size;
    uint64_t *k = g_new(uint64_t, 1);
    *k = id;
    g_hash_table_insert(a->live, k, b);
    record_peak(a);
    return TRUE;
}

/* Merges free neighbour n into b (n directly after b in the segment). */
static void absorb(ZpAllocReplay *a, Block *b, Block *n)
{
    g_tree_remove(a->pools[n->small], n);
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    g_free(n);
}

gboolean zp_alloc_replay_release(ZpAllocReplay *a, uint64_t id)
{
    Block *b = g_hash_table_lookup(a->live, &id);
    if (!b)
        return FALSE;
    g_hash_table_remove(a->live, &id); /* its key, not b */
    b->allocated = FALSE;
    a->stats.allocated_bytes -= (double)b->size;
    if (b->next && !b->next->allocated)
        absorb(a, b, b->next);
    if (b->prev && !b->prev->allocated) {
        Block *p = b->prev;
        g_tree_remove(a->pools[p->small], p);
        p->size += b->size;
        p->next = b->next;
        if (b->next)
            b->next->prev = p;
        g_free(b);
        b = p;
    }
    g_tree_insert(a->pools[b->small], b, b);
    return TRUE;
}

ZpAllocStats zp_alloc_replay_stats(const ZpAllocReplay *a)
{
    return a->stats;
}

/* ---- a schedule's sequence ---- */

/* Handles: schedule buffers by id; the model states and the regions above them. */
#define STATE_HANDLE(c) ((uint64_t)1 << 40 | (uint64_t)(c))
#define REGION_CKPT ((uint64_t)1 << 41)
#define REGION_GRAD ((uint64_t)1 << 41 | 1)
/* A state's copy taken again by op i after its category's state was freed (buffer -1). */
#define RETAKEN_HANDLE(i) ((uint64_t)1 << 42 | (uint64_t)(i))

/* The most bytes of a category live at once, walking the ops in order. */
static double most_live(const ZpSchedule *s, ZpMemCategory category)
{
    double live = 0, most = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->sub != category || (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE))
            continue;
        live += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
        most = fmax(most, live);
    }
    return most;
}

static ZpAllocStats replay_once(const ZpSchedule *s, double capacity_bytes)
{
    ZpAllocReplay *a = zp_alloc_replay_new(capacity_bytes);
    gboolean ok = TRUE;
    for (int c = 0; ok && c < ZP_MEM_N; c++)
        if (s->state_bytes[c] > 0)
            ok = zp_alloc_replay_malloc(a, STATE_HANDLE(c), s->state_bytes[c]);
    const ZpCkptRule rule = zp_zeror_checkpoint(&s->model, &s->plan);
    const double ckpt_region = zp_zeror_contiguous_region_bytes(&s->model, &s->plan);
    const double grad_region = s->plan.zero.contiguous_gradients ? most_live(s, ZP_MEM_BUCKETS) : 0;
    gboolean ckpt_taken = FALSE, grad_taken = FALSE;
    GHashTable *in_region = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (guint i = 0; ok && i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE)
            continue;
        const gboolean ckpt = ckpt_region > 0 && op->sub == ZP_MEM_CHECKPOINTS &&
                              op->bytes == rule.gpu_bytes;
        const gboolean grad = grad_region > 0 && op->sub == ZP_MEM_BUCKETS;
        const gpointer key = GINT_TO_POINTER(op->buffer + 1);
        const uint64_t id = op->buffer >= 0             ? (uint64_t)op->buffer
                            : op->kind == ZP_OP_FREE ? STATE_HANDLE(op->sub)
                                                     : RETAKEN_HANDLE(i);
        if (op->kind == ZP_OP_FREE) {
            if (!g_hash_table_remove(in_region, key))
                zp_alloc_replay_release(a, id);
            continue;
        }
        if (ckpt || grad) {
            gboolean *taken = ckpt ? &ckpt_taken : &grad_taken;
            if (!*taken)
                ok = zp_alloc_replay_malloc(a, ckpt ? REGION_CKPT : REGION_GRAD,
                                            ckpt ? ckpt_region : grad_region);
            *taken = TRUE;
            g_hash_table_add(in_region, key);
            continue;
        }
        if (op->bytes > 0)
            ok = zp_alloc_replay_malloc(a, id, op->bytes);
    }
    g_hash_table_destroy(in_region);
    const ZpAllocStats stats = zp_alloc_replay_stats(a);
    zp_alloc_replay_free_all(a);
    return stats;
}

ZpAllocStats zp_alloc_replay_schedule(const ZpSchedule *s, double capacity_bytes)
{
    /* The peaks come from a run without a limit; the out-of-memory from one with it, which
     * is fragmentation's fault only when the step's allocated peak would fit. */
    ZpAllocStats stats = replay_once(s, 0.0);
    if (capacity_bytes > 0 && stats.peak_reserved_bytes > capacity_bytes) {
        const ZpAllocStats bounded = replay_once(s, capacity_bytes);
        stats.oom = bounded.oom;
        stats.oom_request_bytes = bounded.oom_request_bytes;
        stats.oom_allocated_bytes = bounded.oom_allocated_bytes;
        stats.oom_reserved_bytes = bounded.oom_reserved_bytes;
        stats.oom_largest_free_bytes = bounded.oom_largest_free_bytes;
        stats.oom_fragmented = bounded.oom && stats.peak_allocated_bytes <= capacity_bytes;
    }
    return stats;
}

double zp_alloc_replay_needed_bytes(const ZpAllocStats *stats, double live_peak_bytes,
                                    double capacity_bytes)
{
    const double needed = fmax(live_peak_bytes, stats->peak_reserved_bytes);
    return stats->oom_fragmented ? fmax(needed, capacity_bytes + stats->oom_request_bytes)
                                 : needed;
}
