/* zp_alloc_replay: segments hold blocks in address order (a doubly linked list per
 * segment); each pool's free blocks are ordered by (size, address), so best fit is a lower
 * bound, as PyTorch's std::set of blocks does it. Sizes are whole bytes. */
#include "zp_alloc_replay.h"
#include "zp_alloc_ops.h"
#include "zp_alloc_repeat.h"
#include "zp_alloc_seq.h"
#include "zp_alloc_slots.h"
#include "zp_u64map.h"
#include "zp_alloc_pool.h"
#include "zp_util.h"
#include "zp_zeror.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef ZpAllocBlock Block;

struct ZpAllocReplay {
    double capacity_bytes;
    uint64_t next_addr;
    ZpAllocPool pools[2];      /* [0] large, [1] small: free blocks */
    /* id -> Block. Every Block is in a pool or here (or by_id) until a neighbour absorbs it or it goes
     * back whole: zreal replays each step's allocations for as long as it trains, so nothing
     * may be kept per allocation (each key and merged Block once was, until the end: about
     * 900 bytes a step with tiny, whose small long-lived chunks split the holes glibc had
     * left, and its heap grew by a step's activations every step). */
    GHashTable *live;
    /* ids below n_dense (a schedule's buffer ids, index_ids) are kept here,
     * by_id[id], not in `live`: a lookup without hashing; n_live counts both. */
    Block **by_id;
    size_t n_dense;
    guint n_live;
    /* Blocks come from chunks of BLOCK_CHUNK and go back to a free list (linked by next):
     * one malloc per chunk, not per block, and no more than the most blocks ever at once. */
    Block *spare;
    GPtrArray *chunks;
    /* Each segment's first block (which stays its first until the segment goes back), in
     * address order: the blocks in address order without a sort. */
    GPtrArray *segments;
    uint64_t last_addr; /* where the last allocation went */
    ZpAllocStats stats;
};

#define BLOCK_CHUNK 1024

ZpAllocReplay *zp_alloc_replay_new(double capacity_bytes)
{
    ZpAllocReplay *a = g_new0(ZpAllocReplay, 1);
    a->capacity_bytes = capacity_bytes;
    a->next_addr = 1 << 21;
    for (int p = 0; p < 2; p++)
        zp_alloc_pool_init(&a->pools[p]);
    a->live = g_hash_table_new(g_int64_hash, g_int64_equal); /* keyed by the Blocks' ids */
    a->segments = g_ptr_array_new();
    a->chunks = g_ptr_array_new_with_free_func(g_free);
    return a;
}

/* Indexes the ids below n_ids (dense: a schedule's buffers) by an array, not the hash. Only
 * while no block is live. */
static void index_ids(ZpAllocReplay *a, size_t n_ids)
{
    g_assert(a->n_live == 0);
    g_free(a->by_id);
    a->by_id = n_ids ? g_new0(Block *, n_ids) : NULL;
    a->n_dense = n_ids;
}

static Block *live_get(const ZpAllocReplay *a, uint64_t id)
{
    return id < a->n_dense ? a->by_id[id] : g_hash_table_lookup(a->live, &id);
}

/* Block b, allocated, under its id (whose key is b's own: none allocated). */
G_ALWAYS_INLINE static inline void live_put(ZpAllocReplay *a, Block *b)
{
    if (b->id < a->n_dense) {
        a->n_live += !a->by_id[b->id];
        a->by_id[b->id] = b;
    } else {
        a->n_live += !g_hash_table_contains(a->live, &b->id);
        g_hash_table_replace(a->live, &b->id, b);
    }
}

static void live_remove(ZpAllocReplay *a, uint64_t id)
{
    if (id < a->n_dense) {
        a->n_live -= a->by_id[id] != NULL;
        a->by_id[id] = NULL;
    } else {
        a->n_live -= g_hash_table_remove(a->live, &id);
    }
}

void zp_alloc_replay_free_all(ZpAllocReplay *a)
{
    if (!a)
        return;
    for (int p = 0; p < 2; p++)
        zp_alloc_pool_destroy(&a->pools[p]);
    g_hash_table_destroy(a->live);
    g_free(a->by_id);
    g_ptr_array_unref(a->segments);
    g_ptr_array_unref(a->chunks); /* every block, pooled, live or spare */
    g_free(a);
}

/* inlined, as live_put: a call each malloc and split of the replay */
G_ALWAYS_INLINE static inline Block *new_block(ZpAllocReplay *a, uint64_t addr, uint64_t size,
                                               gboolean small)
{
    if (!a->spare) {
        Block *chunk = g_new(Block, BLOCK_CHUNK);
        g_ptr_array_add(a->chunks, chunk);
        for (int k = 0; k < BLOCK_CHUNK; k++) {
            chunk[k].next = a->spare;
            a->spare = &chunk[k];
        }
    }
    Block *b = a->spare;
    a->spare = b->next;
    *b = (Block){.addr = addr, .size = size, .small = small};
    return b;
}

static void drop_block(ZpAllocReplay *a, Block *b)
{
    b->next = a->spare;
    a->spare = b;
}

/* round_size(): at least 512 bytes, a multiple of 512. The whole bytes rounded up: the
 * truncation, one more where it fell short (ceil's, for the positive sizes asked for, without
 * its rounding-mode code: 20 instructions a malloc). */
static uint64_t round_size(double bytes)
{
    uint64_t n = (uint64_t)bytes;
    n += (double)n < bytes;
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
    for (int p = 0; p < 2; p++)
        largest = fmax(largest, (double)zp_alloc_pool_largest(&a->pools[p]));
    return largest;
}

/* release_cached_blocks(): every free block that is a whole segment goes back to CUDA. */
static void release_cached(ZpAllocReplay *a)
{
    GPtrArray *whole = g_ptr_array_new();
    for (int p = 0; p < 2; p++) {
        zp_alloc_pool_whole_segments(&a->pools[p], whole);
        for (guint i = 0; i < whole->len; i++) {
            Block *b = g_ptr_array_index(whole, i);
            zp_alloc_pool_remove(&a->pools[p], b);
            g_ptr_array_remove(a->segments, b);
            a->stats.reserved_bytes -= (double)b->size;
            drop_block(a, b);
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
    return b->small ? rest >= (uint64_t)ZP_ALLOC_MIN_BLOCK_BYTES
                    : rest > (uint64_t)ZP_ALLOC_SMALL_SIZE_BYTES;
}

G_ALWAYS_INLINE static inline void record_peak(ZpAllocReplay *a)
{
    ZpAllocStats *s = &a->stats;
    if (s->reserved_bytes > s->peak_reserved_bytes) /* fmax, not called (neither is NaN) */
        s->peak_reserved_bytes = s->reserved_bytes;
    if (s->allocated_bytes >= s->peak_allocated_bytes) {
        s->peak_allocated_bytes = s->allocated_bytes;
        s->reserved_at_peak_bytes = s->reserved_bytes;
        s->largest_free_at_peak_bytes = largest_free(a);
    }
}

/* zp_alloc_replay_malloc, inlined where a schedule's sequence is replayed (replay_event:
 * a call each of the 500,000 allocs and frees of plan --3d gpt-1t/4096's replays) */
G_ALWAYS_INLINE static inline gboolean replay_malloc(ZpAllocReplay *a, uint64_t id, double bytes)
{
    const uint64_t size = round_size(bytes);
    const gboolean small = size <= (uint64_t)ZP_ALLOC_SMALL_SIZE_BYTES;
    ZpAllocPool *pool = &a->pools[small];
    Block *b = zp_alloc_pool_take_best(pool, size);
    if (!b) {
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
        b = new_block(a, a->next_addr, seg, small);
        g_ptr_array_add(a->segments, b);
        /* Segments never touch, so blocks merge only inside their own. */
        a->next_addr += seg + (uint64_t)ZP_ALLOC_SMALL_BUFFER_BYTES;
        a->stats.reserved_bytes += (double)seg;
        a->stats.segments_allocated++;
    }
    if (should_split(b, size)) {
        Block *rest = new_block(a, b->addr + size, b->size - size, small);
        rest->prev = b;
        rest->next = b->next;
        if (b->next)
            b->next->prev = rest;
        b->next = rest;
        b->size = size;
        zp_alloc_pool_insert(pool, rest);
    }
    b->allocated = TRUE;
    b->id = id;
    a->last_addr = b->addr;
    a->stats.allocated_bytes += (double)b->size;
    live_put(a, b);
    record_peak(a);
    return TRUE;
}

/* Merges free neighbour n into b (n directly after b in the segment). Inlined, as
 * replay_malloc: a call at 14,600 of Megatron 1T's frees. */
G_ALWAYS_INLINE static inline void absorb(ZpAllocReplay *a, Block *b, Block *n)
{
    zp_alloc_pool_remove(&a->pools[n->small], n);
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    drop_block(a, n);
}

gboolean zp_alloc_replay_malloc(ZpAllocReplay *a, uint64_t id, double bytes)
{
    return replay_malloc(a, id, bytes);
}

/* zp_alloc_replay_release, inlined as replay_malloc */
G_ALWAYS_INLINE static inline gboolean replay_release(ZpAllocReplay *a, uint64_t id)
{
    Block *b;
    if (id < a->n_dense) { /* found: dropped without loading it again (live_remove's test) */
        b = a->by_id[id];
        if (!b)
            return FALSE;
        a->by_id[id] = NULL;
        a->n_live--;
    } else {
        b = g_hash_table_lookup(a->live, &id);
        if (!b)
            return FALSE;
        live_remove(a, id); /* before b can be merged away below */
    }
    b->allocated = FALSE;
    a->stats.allocated_bytes -= (double)b->size;
    if (b->next && !b->next->allocated)
        absorb(a, b, b->next);
    if (b->prev && !b->prev->allocated) {
        Block *p = b->prev;
        zp_alloc_pool_remove(&a->pools[p->small], p);
        p->size += b->size;
        p->next = b->next;
        if (b->next)
            b->next->prev = p;
        drop_block(a, b);
        b = p;
    }
    zp_alloc_pool_insert(&a->pools[b->small], b);
    return TRUE;
}

gboolean zp_alloc_replay_release(ZpAllocReplay *a, uint64_t id)
{
    return replay_release(a, id);
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

/* ---- the sequence folded ----
 *
 * A pipeline stage's steady state allocates and frees the same sizes in the same order every
 * micro-step. Where the allocator's state at the head of one micro-step is the state at the
 * head of one k micro-steps before (the same blocks at the same addresses, each live block's
 * handle either the same one or the one allocated a period of k micro-steps later: shifted)
 * and the sequence from there on repeats the period before it event for event (the same
 * sizes; each free frees the handle a period after the one the free a period before freed,
 * never a handle that stayed), then each further period does to the state exactly what the
 * last one did: the same blocks chosen and split and merged, the same allocated and reserved
 * bytes at every event. Its peaks are then those already recorded (a maximum met again
 * changes nothing; the reserved bytes and largest free block at the peak are those of the
 * same point of the same state), and the periods are skipped whole: the live handles renamed
 * to those allocated n periods on, nothing else changed. k is rarely 1: a stage keeping m
 * micro-batches' activations hands the block the oldest freed to the newest, so that their
 * blocks turn round once in m micro-steps (1F1B's stage s keeps pp - s). GPipe never
 * repeats here: its forward phase keeps every micro-batch's activations and its backward
 * phase frees them one micro-step at a time, so the allocated bytes at its heads rise, then
 * fall, by a micro-step's activations each (the simulator folds its backward phase, whose
 * times repeat; the allocator's state does not). */

/* A block of the state at a head: where it lies and, allocated, whose it is (the alloc
 * event of a buffer's handle, or the handle itself for the states and regions: fixed). */
typedef struct {
    uint64_t addr, size;
    uint8_t allocated, small, special;
    uint64_t handle;
} HeadBlock;

typedef struct {
    uint64_t at; /* the event it is the head of */
    double allocated_bytes, reserved_bytes;
    uint64_t segments, next_addr;
    guint live, free_large, free_small;
    GArray *blocks; /* HeadBlock by address, or NULL: not taken */
} Head;

/* A stage's steady heads so far: the last `group` heads' figures (a ring: recent[taken %
 * group] is the one `group` heads back); each state's probe hash (probe_hash) -> the last head
 * that had it, MAX_HEADS at most; and a candidate: a head whose hash an earlier one had,
 * `period` events before, with its blocks, to compare exactly with the head a period after
 * it. group is 1, or pp for an interleaved schedule: its micro-steps run in groups of pp
 * through each chunk (zp_pipe.c interleaved_action), so that a head's figures are those of
 * the head a group before, not the one before (the group's last head holds one block more
 * and its free blocks differ: every group's edge looked like a transient, and the heads a
 * period apart were dropped before they met). */
#define MAX_HEADS 4096

typedef struct {
    Head *recent;
    uint32_t group;
    uint64_t taken;
    ZpU64Map by_hash;
    Head candidate;
    uint64_t period;
    GArray *slot_undo; /* zp_alloc_slots_skip's changes (uint32_t slots) */
} Heads;

/* The allocations whose addresses a head's probe hash takes, and the segments it probes
 * (probe_hash). */
#define RECENT 8
#define PROBES 8

typedef struct {
    const ZpAllocSeq *seq; /* the events */
    ZpAllocReplay *a;
    gboolean ok;
    gboolean ckpt_taken, grad_taken;
    GHashTable *in_region; /* buffer + 1: a slot in a region, not a block of its own */
    uint8_t *in_region_at; /* [buffer + 1], the same, where ids are indexed (foldable) */
    int64_t *alloc_event; /* [buffer]: the event of its live alloc */
    uint64_t folded; /* events skipped */
    uint64_t recent[RECENT]; /* where the last RECENT allocations went (a ring) */
    uint64_t n_recent;
    guint probe_n, probe_at[PROBES]; /* probe_places': for probe_n segments */
} Seq;

/* Whether buffer's free frees a region's slot (then no longer one), not a block. */
G_ALWAYS_INLINE static inline gboolean region_take(Seq *q, int32_t buffer)
{
    if (q->in_region_at) {
        const gboolean was = q->in_region_at[buffer + 1];
        q->in_region_at[buffer + 1] = 0;
        return was;
    }
    /* Most frees are of no region's slot: an empty table needs no hashing. */
    return g_hash_table_size(q->in_region) > 0 &&
           g_hash_table_remove(q->in_region, GINT_TO_POINTER(buffer + 1));
}

/* Replays event e (v), as PyTorch's allocator would see it (inlined: once an event). */
G_ALWAYS_INLINE static inline void replay_event(Seq *q, uint64_t e, const ZpAllocEvent *v)
{
    if (v->kind == ZP_OP_FREE) {
        if (!region_take(q, v->buffer))
            replay_release(q->a, v->buffer >= 0 ? (uint64_t)v->buffer : STATE_HANDLE(v->sub));
        return;
    }
    if (v->flags & (ZP_ALLOC_EV_CKPT | ZP_ALLOC_EV_GRAD)) {
        const gboolean ckpt = v->flags & ZP_ALLOC_EV_CKPT;
        gboolean *taken = ckpt ? &q->ckpt_taken : &q->grad_taken;
        if (!*taken)
            q->ok = zp_alloc_replay_malloc(q->a, ckpt ? REGION_CKPT : REGION_GRAD,
                                           ckpt ? q->seq->ckpt_region : q->seq->grad_region);
        *taken = TRUE;
        if (q->in_region_at)
            q->in_region_at[v->buffer + 1] = 1;
        else
            g_hash_table_add(q->in_region, GINT_TO_POINTER(v->buffer + 1));
        return;
    }
    if (v->bytes > 0) {
        const uint64_t id = v->buffer >= 0 ? (uint64_t)v->buffer : RETAKEN_HANDLE(v->op);
        q->ok = replay_malloc(q->a, id, v->bytes);
        q->recent[q->n_recent++ % RECENT] = q->a->last_addr;
        if (q->alloc_event && v->buffer >= 0)
            q->alloc_event[v->buffer] = (int64_t)e;
    }
}

/* The allocator's cheap figures at event e. */
static void head_take(const Seq *q, Head *h, uint64_t e)
{
    const ZpAllocReplay *a = q->a;
    *h = (Head){.at = e, .allocated_bytes = a->stats.allocated_bytes,
                .reserved_bytes = a->stats.reserved_bytes,
                .segments = a->stats.segments_allocated, .next_addr = a->next_addr,
                .live = a->n_live, .free_large = a->pools[0].n,
                .free_small = a->pools[1].n};
}

/* Block b as a head sees it: allocated, whose (a buffer's alloc event, or the handle). */
static HeadBlock head_block(const Seq *q, const Block *b)
{
    HeadBlock hb = {.addr = b->addr, .size = b->size, .allocated = (uint8_t)b->allocated,
                    .small = (uint8_t)b->small};
    if (b->allocated) {
        const gboolean buffer = b->id < q->seq->n_buffers && q->alloc_event[b->id] >= 0;
        hb.special = (uint8_t)!buffer;
        hb.handle = buffer ? (uint64_t)q->alloc_event[b->id] : b->id;
    }
    return hb;
}

/* Every block in address order, into `blocks` (room: zp_array_extend's; GLib's append was
 * 68 instructions a block, 1.2 M of Megatron 1T's replay). */
static void walk_blocks(const Seq *q, GArray *blocks, guint room)
{
    const ZpAllocReplay *a = q->a;
    for (guint k = 0; k < a->segments->len; k++)
        for (const Block *b = g_ptr_array_index(a->segments, k); b; b = b->next)
            *(HeadBlock *)zp_array_extend(blocks, 1, sizeof(HeadBlock), &room) =
                head_block(q, b);
}

#define FNV_PRIME 1099511628211u

/* A probed block's flags as head_block makes them (allocated, small, special): the handle,
 * which the hash does not take, not looked up. Under the fold every block allocated under a
 * buffer's id has its alloc event (replay_event sets it as it allocates, skip as it renames),
 * so special is an id past the buffers' (n_buffers), with no load of alloc_event[id]; a
 * block's allocated and small are 0 or 1 (TRUE, FALSE and comparisons set them), taken as
 * they are: 5 instructions a probe, from 9 (0.75 M of Megatron 1T's 82,480 probes, with a miss
 * on alloc_event as often as not). */
G_ALWAYS_INLINE static inline uint64_t probe_flags(const Block *b, uint64_t n_buffers)
{
    const uint64_t allocated = (uint64_t)b->allocated;
    return allocated | (uint64_t)b->small << 1 | (allocated & (b->id >= n_buffers)) << 2;
}

/* The probes' places among n segments, kept while the count stays (it changes only where a
 * segment is made or released: the division and the HeadBlock made whole at each probe were
 * 60 instructions a head, 0.6 M of Megatron 1T's 10,310). */
static const guint *probe_places(Seq *q, guint n)
{
    if (n != q->probe_n) {
        const guint probes = MIN(n, PROBES);
        for (guint k = 0; k < probes; k++)
            q->probe_at[k] = probes > 1 ? (guint)((uint64_t)k * (n - 1) / (probes - 1)) : 0;
        q->probe_n = n;
    }
    return q->probe_at;
}

/* A few segments' first blocks (at most PROBES, spread over them: where they lie, how large,
 * whether taken; not whose, since a handle held all along ages) and where the last RECENT
 * allocations went, hashed: what two heads whose states repeat share, at a cost that does not
 * grow with the blocks (a stage can keep thousands; the recent addresses tell apart the turns
 * of a stage's blocks round its micro-batches). Heads with equal probes are compared whole,
 * a period later (try_fold). */
static uint64_t probe_hash(Seq *q)
{
    const GPtrArray *segments = q->a->segments;
    uint64_t hash = 14695981039346656037u; /* FNV-1a's basis and prime */
    hash = (hash ^ segments->len) * FNV_PRIME;
    const guint n = segments->len, probes = MIN(n, PROBES);
    const guint *at = probe_places(q, n);
    const uint64_t n_buffers = q->seq->n_buffers;
    for (guint k = 0; k < probes; k++) {
        const Block *b = g_ptr_array_index(segments, at[k]);
        hash = (hash ^ b->addr) * FNV_PRIME;
        hash = (hash ^ b->size) * FNV_PRIME;
        hash = (hash ^ probe_flags(b, n_buffers)) * FNV_PRIME;
    }
    /* the ring from its oldest, as recent[(n_recent + k) % RECENT] for k from 0 */
    const uint64_t oldest = q->n_recent % RECENT;
    for (uint64_t k = oldest; k < RECENT; k++)
        hash = (hash ^ q->recent[k]) * FNV_PRIME;
    for (uint64_t k = 0; k < oldest; k++)
        hash = (hash ^ q->recent[k]) * FNV_PRIME;
    return hash;
}

static void take_blocks(const Seq *q, Head *h)
{
    const guint room = h->live + h->free_large + h->free_small;
    h->blocks = g_array_sized_new(FALSE, FALSE, sizeof(HeadBlock), room);
    walk_blocks(q, h->blocks, room);
}

static void head_clear(Head *h)
{
    if (h->blocks)
        g_array_free(h->blocks, TRUE);
    h->blocks = NULL;
}

static gboolean same_figures(const Head *x, const Head *y)
{
    return x->allocated_bytes == y->allocated_bytes && x->reserved_bytes == y->reserved_bytes &&
           x->segments == y->segments && x->next_addr == y->next_addr && x->live == y->live &&
           x->free_large == y->free_large && x->free_small == y->free_small;
}

/* Whether the allocator's blocks at head e are head x's a period (e - x->at) on: the same
 * blocks, each allocated one held by the same handle (kept in `fixed`, sorted) or by the one
 * allocated a period later. Read from the segments as walk_blocks lists them, not taken into
 * a Head first (that copy was 6,300 instructions a try, 0.4 M of Megatron 1T's replay). */
static gboolean same_blocks(const Seq *q, const Head *x, uint64_t e, GArray *fixed)
{
    const uint64_t period = e - x->at;
    const ZpAllocReplay *r = q->a;
    const guint n = x->blocks->len;
    guint k = 0;
    g_array_set_size(fixed, 0);
    for (guint g = 0; g < r->segments->len; g++)
        for (const Block *blk = g_ptr_array_index(r->segments, g); blk; blk = blk->next, k++) {
            if (k == n)
                return FALSE;
            const HeadBlock *a = &g_array_index(x->blocks, HeadBlock, k);
            const HeadBlock b = head_block(q, blk);
            if (a->addr != b.addr || a->size != b.size || a->allocated != b.allocated ||
                a->small != b.small || a->special != b.special)
                return FALSE;
            if (!a->allocated)
                continue;
            if (a->handle == b.handle) {
                if (!a->special)
                    g_array_append_val(fixed, a->handle);
            } else if (a->special || b.handle != a->handle + period) {
                return FALSE;
            }
        }
    if (k != n)
        return FALSE;
    zp_alloc_repeat_sort(fixed);
    return TRUE;
}

/* Skips `periods` periods: every live handle that is not fixed becomes the one allocated
 * that many periods on (the renaming is one to one; old and new names may meet, so the new
 * table is built whole). FALSE, nothing changed, where a target is not a buffer's alloc
 * (which the checks above rule out). */
static gboolean skip(Seq *q, uint64_t periods, uint64_t period, const GArray *fixed)
{
    ZpAllocReplay *a = q->a;
    const guint n = a->n_live;
    uint64_t *ids = g_new(uint64_t, MAX(n, 1)), *events = g_new(uint64_t, MAX(n, 1));
    Block **blocks = g_new(Block *, MAX(n, 1));
    guint k = 0;
    gboolean ok = TRUE;
    /* the targets lie in a few stretches and runs: each looked up from the last (a search of
     * the runs and the event built was 126 instructions a block in Megatron 1T's 64 skips) */
    ZpAllocCursor at = ZP_ALLOC_CURSOR_INIT;
    /* The live blocks: the segments' allocated ones that their ids find (an alloc over a
     * live id leaves the block before it allocated, held by nothing). */
    for (guint g = 0; g < a->segments->len && k < n; g++)
        for (Block *b = g_ptr_array_index(a->segments, g); b && k < n; b = b->next) {
            if (!b->allocated || live_get(a, b->id) != b)
                continue;
            uint64_t id = b->id;
            events[k] = UINT64_MAX;
            if (id < q->seq->n_buffers && q->alloc_event[id] >= 0 &&
                !zp_alloc_repeat_fixed(fixed, (uint64_t)q->alloc_event[id])) {
                const uint64_t to = (uint64_t)q->alloc_event[id] + periods * period;
                ZpAllocEvent tmp;
                const ZpAllocEvent *v =
                    to < q->seq->n_ev ? zp_alloc_seq_cursor_event(q->seq, &at, to, &tmp) : NULL;
                ok = ok && v && v->kind == ZP_OP_ALLOC && v->buffer >= 0;
                id = ok ? (uint64_t)v->buffer : id;
                events[k] = to;
            }
            ids[k] = id;
            blocks[k++] = b;
        }
    if (ok) {
        /* Old and new names may meet: every old one goes before any new one comes. A handle
         * past the dense ids (a state's or region's, in the hash table) keeps its block, and
         * no new name is one (they are buffers'): left as it is, not removed and put back
         * (four hash table calls, 0.2 M of Megatron 1T's 64 skips). */
        for (guint j = 0; j < n; j++)
            if (ids[j] != blocks[j]->id || ids[j] < a->n_dense)
                live_remove(a, blocks[j]->id);
        for (guint j = 0; j < n; j++) {
            if (ids[j] == blocks[j]->id && ids[j] >= a->n_dense)
                continue;
            blocks[j]->id = ids[j];
            live_put(a, blocks[j]);
            if (events[j] != UINT64_MAX)
                q->alloc_event[ids[j]] = (int64_t)events[j];
        }
    }
    g_free(ids);
    g_free(events);
    g_free(blocks);
    return ok;
}

/* Drops the candidate and the hashes: the heads before cannot be a fold's. */
static void candidates_clear(Heads *h)
{
    head_clear(&h->candidate);
    h->candidate.at = UINT64_MAX;
    zp_u64map_clear(&h->by_hash);
}

static void heads_clear(Heads *h)
{
    candidates_clear(h);
    h->taken = 0;
}

/* Tries the fold at head e, the candidate's head a period on: where the blocks are the
 * candidate's a period on and the events from e on repeat the period before for whole
 * periods, those are skipped. The next event. */
static uint64_t try_fold(Seq *q, Heads *h, GArray *fixed, uint64_t e)
{
    if (!same_blocks(q, &h->candidate, e, fixed))
        return e;
    const uint64_t periods =
        zp_alloc_repeat_events(q->seq, e, h->period, fixed, q->ckpt_taken, q->grad_taken) /
        h->period;
    if (periods == 0 ||
        !zp_alloc_slots_skip(q->seq, q->in_region_at, e, e + periods * h->period, h->slot_undo))
        return e;
    if (!skip(q, periods, h->period, fixed)) {
        zp_alloc_slots_undo(q->in_region_at, h->slot_undo);
        return e;
    }
    q->folded += periods * h->period;
    return e + periods * h->period;
}

/* At head e, in a steady state (its figures are those of the head a group before): where a
 * head before had the same hash, this one becomes the candidate, tried (try_fold) at the head
 * a period on. The next event. */
static uint64_t at_head(Seq *q, Heads *h, GArray *fixed, uint64_t e)
{
    Head now;
    head_take(q, &now, e);
    Head *back = &h->recent[h->taken % h->group];
    const gboolean steady = h->taken >= h->group && same_figures(back, &now);
    *back = now; /* figures only: blocks are never taken for it */
    h->taken++;
    if (!steady) {
        candidates_clear(h); /* not (yet) a steady state */
        return e;
    }
    if (h->candidate.at != UINT64_MAX && e >= h->candidate.at + h->period) {
        uint64_t next = e;
        if (e == h->candidate.at + h->period)
            next = try_fold(q, h, fixed, e);
        head_clear(&h->candidate);
        h->candidate.at = UINT64_MAX;
        if (next != e) {
            heads_clear(h);
            return next;
        }
    }
    const uint64_t hash = probe_hash(q);
    uint64_t before; /* its last head; this one in its place (one probe, not a get and a put) */
    if (zp_u64map_size(&h->by_hash) >= MAX_HEADS) {
        before = zp_u64map_get(&h->by_hash, hash, UINT64_MAX);
        zp_u64map_clear(&h->by_hash);
        zp_u64map_put(&h->by_hash, hash, e);
    } else {
        uint64_t *at = zp_u64map_at(&h->by_hash, hash, UINT64_MAX);
        before = *at;
        *at = e;
    }
    if (h->candidate.at == UINT64_MAX && before != UINT64_MAX) {
        h->candidate = now;
        h->period = e - before;
        take_blocks(q, &h->candidate);
    }
    return e;
}

/* Event e (v) where a fold is looked for (q->alloc_event): at a head, the heads taken and a
 * fold tried (at_head). The next event: e, or past the periods folded. */
G_ALWAYS_INLINE static inline uint64_t event_head(Seq *q, Heads *heads, GArray *fixed, uint64_t e,
                                                 const ZpAllocEvent *v)
{
    if (!q->alloc_event || !(v->flags & ZP_ALLOC_EV_HEAD))
        return e;
    if (v->flags & ZP_ALLOC_EV_STAGE)
        heads_clear(heads);
    return at_head(q, heads, fixed, e);
}

/* Replays the listed events from e (v) to `end`, the next one where v + 1 is, or to a fold
 * or an out-of-memory: the next event. A stretch walked by pointer, not by the cursor (its
 * tests and its event's address were 15 instructions an event, 0.9 M of Megatron 1T's
 * replay), whether to fold read once, not an event (0.55 M). */
static uint64_t replay_listed(Seq *q, Heads *heads, GArray *fixed, uint64_t e, uint64_t end,
                              const ZpAllocEvent *v)
{
    const gboolean fold = q->alloc_event != NULL;
    for (const ZpAllocEvent *last = v + (end - e); v < last; v++, e++) {
        if (fold && (v->flags & ZP_ALLOC_EV_HEAD)) {
            const uint64_t next = event_head(q, heads, fixed, e, v);
            if (next != e)
                return next;
        }
        replay_event(q, e, v);
        if (G_UNLIKELY(!q->ok))
            return e + 1;
    }
    return e;
}

/* Replays run x's events from e (in it) to its end, or to a fold or an out-of-memory: the
 * next event. Each made from its listed event copy by copy, as zp_alloc_seq_run_event makes
 * it, not through the cursor (its tests, a search and two divisions an event). */
static uint64_t replay_run(Seq *q, Heads *heads, GArray *fixed, uint64_t e,
                           const ZpAllocEventRun *x)
{
    const gboolean fold = q->alloc_event != NULL;
    uint64_t g = (e - x->start) / x->len + 1; /* the copy, from 1 */
    uint32_t o = (uint32_t)((e - x->start) % x->len);
    while (e < x->end) {
        ZpAllocEvent v = q->seq->ev[x->first + o];
        v.buffer = zp_alloc_run_buffer(v.buffer, g, x->buffer_step, x->buffer_first,
                                       x->buffer_window);
        v.op += (uint32_t)g * x->op_step;
        if (fold && (v.flags & ZP_ALLOC_EV_HEAD)) {
            const uint64_t next = event_head(q, heads, fixed, e, &v);
            if (next != e)
                return next;
        }
        replay_event(q, e, &v);
        e++;
        if (G_UNLIKELY(!q->ok))
            return e;
        if (++o == x->len) {
            o = 0;
            g++;
        }
    }
    return e;
}

/* Replays the sequence (q: its events, and whether to fold) against capacity_bytes. */
static ZpAllocStats replay_once(const ZpAllocSeq *events, double capacity_bytes, gboolean fold,
                                uint64_t *folded)
{
    const ZpSchedule *s = events->s;
    Seq q = {.seq = events};
    q.a = zp_alloc_replay_new(capacity_bytes);
    index_ids(q.a, events->foldable ? q.seq->n_buffers : 0);
    q.ok = TRUE;
    q.in_region = g_hash_table_new(g_direct_hash, g_direct_equal);
    q.in_region_at = events->foldable ? g_new0(uint8_t, q.seq->n_buffers + 1) : NULL;
    q.alloc_event = NULL;
    if (fold && events->foldable) {
        q.alloc_event = g_new(int64_t, MAX(q.seq->n_buffers, 1));
        for (size_t b = 0; b < q.seq->n_buffers; b++)
            q.alloc_event[b] = -1;
    }
    for (int c = 0; q.ok && c < ZP_MEM_N; c++)
        if (s->state_bytes[c] > 0)
            q.ok = zp_alloc_replay_malloc(q.a, STATE_HANDLE(c), s->state_bytes[c]);
    const gboolean interleaved = s->plan.pipe.schedule == ZP_PIPE_INTERLEAVED;
    Heads heads = {.candidate.at = UINT64_MAX,
                   .group = (uint32_t)MAX(interleaved ? zp_plan_pp(&s->plan) : 1, 1),
                   .slot_undo = g_array_new(FALSE, FALSE, sizeof(uint32_t))};
    zp_u64map_init(&heads.by_hash, 32); /* a steady stretch holds a few heads */
    heads.recent = g_new0(Head, heads.group);
    GArray *fixed = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    ZpAllocCursor at = ZP_ALLOC_CURSOR_INIT;
    for (uint64_t e = 0; q.ok && e < q.seq->n_ev;) {
        ZpAllocEvent tmp;
        const ZpAllocEvent *v = zp_alloc_seq_cursor_event(q.seq, &at, e, &tmp);
        /* listed: the stretch to at.to, else the run's events, walked without the cursor */
        e = v != &tmp ? replay_listed(&q, &heads, fixed, e, at.to, v)
                      : replay_run(&q, &heads, fixed, e, at.run);
    }
    heads_clear(&heads);
    zp_u64map_free(&heads.by_hash);
    g_free(heads.recent);
    g_array_free(heads.slot_undo, TRUE);
    g_array_free(fixed, TRUE);
    g_hash_table_destroy(q.in_region);
    g_free(q.in_region_at);
    g_free(q.alloc_event);
    ZpAllocStats stats = zp_alloc_replay_stats(q.a);
    zp_alloc_replay_free_all(q.a);
    *folded += q.folded;
    return stats;
}

/* Replays ops (ZpAllocOp, the longer schedule's, and the runs of copies they leave out,
 * ZpAllocRun; NULL: the schedule's own, read from it without a copy) as
 * zp_alloc_replay_schedule_folded says. *refused, nothing replayed, where a run would not
 * repeat its last listed copy (zp_alloc_seq_build). */
static ZpAllocStats replay_ops(const ZpSchedule *s, GArray *ops, const GArray *runs,
                               double capacity_bytes, gboolean fold, gboolean *refused)
{
    ZpAllocSeq events = {.s = s, .ops = ops, .op_runs = runs};
    events.ckpt_gpu_bytes = zp_zeror_checkpoint(&s->model, &s->plan).gpu_bytes;
    events.ckpt_region = zp_zeror_contiguous_region_bytes(&s->model, &s->plan);
    events.grad_contiguous = s->plan.zero.contiguous_gradients;
    zp_alloc_seq_build(&events);
    *refused = events.runs_refused;
    if (*refused) {
        zp_alloc_seq_clear(&events);
        return (ZpAllocStats){0};
    }
    /* The peaks come from a run without a limit; the out-of-memory from one with it, which
     * is fragmentation's fault only when the step's allocated peak would fit. */
    uint64_t folded = 0;
    ZpAllocStats stats = replay_once(&events, 0.0, fold, &folded);
    if (capacity_bytes > 0 && stats.peak_reserved_bytes > capacity_bytes) {
        const ZpAllocStats bounded = replay_once(&events, capacity_bytes, fold, &folded);
        stats.oom = bounded.oom;
        stats.oom_request_bytes = bounded.oom_request_bytes;
        stats.oom_allocated_bytes = bounded.oom_allocated_bytes;
        stats.oom_reserved_bytes = bounded.oom_reserved_bytes;
        stats.oom_largest_free_bytes = bounded.oom_largest_free_bytes;
        stats.oom_fragmented = bounded.oom && stats.peak_allocated_bytes <= capacity_bytes;
    }
    zp_alloc_seq_clear(&events);
    stats.folded_events = folded;
    return stats;
}

ZpAllocStats zp_alloc_replay_schedule_folded(const ZpSchedule *s, double capacity_bytes,
                                             gboolean fold)
{
    gboolean refused;
    return replay_ops(s, NULL, NULL, capacity_bytes, fold, &refused);
}

gboolean zp_alloc_replay_schedule_extended(const ZpSchedule *s, double capacity_bytes,
                                           const ZpOpInsert *inserts, size_t n_inserts,
                                           ZpAllocStats *stats)
{
    /* The copies past those whose frees look back before them left out (ZpAllocRun), and
     * all of them listed where those would not repeat event for event. */
    GArray *runs = g_array_new(FALSE, FALSE, sizeof(ZpAllocRun));
    GArray *ops = zp_alloc_ops_extended(s, inserts, n_inserts, runs);
    gboolean refused = FALSE;
    if (ops)
        *stats = replay_ops(s, ops, runs, capacity_bytes, TRUE, &refused);
    g_array_unref(runs);
    if (ops && refused) {
        g_array_unref(ops);
        ops = zp_alloc_ops_extended(s, inserts, n_inserts, NULL);
        if (ops)
            *stats = replay_ops(s, ops, NULL, capacity_bytes, TRUE, &refused);
    }
    if (!ops)
        return FALSE;
    g_array_unref(ops);
    return TRUE;
}

ZpAllocStats zp_alloc_replay_schedule(const ZpSchedule *s, double capacity_bytes)
{
    return zp_alloc_replay_schedule_folded(s, capacity_bytes, TRUE);
}

double zp_alloc_replay_needed_bytes(const ZpAllocStats *stats, double live_peak_bytes,
                                    double capacity_bytes)
{
    const double needed = fmax(live_peak_bytes, stats->peak_reserved_bytes);
    return stats->oom_fragmented ? fmax(needed, capacity_bytes + stats->oom_request_bytes)
                                 : needed;
}
