/* zp_alloc_ops: the allocs and frees the allocator replay walks for the longer schedule that
 * whole inserted steady periods make (zp_alloc_replay_schedule_extended). */
#include "zp_alloc_ops.h"
#include "zp_u64map.h"
#include "zp_util.h"

#include <string.h>

/* Whether free_op may free what `alloc` allocated: an alloc of the same category and size
 * (else the inserted periods are not what they claim: refused). */
static gboolean same_alloc(const ZpOp *alloc, const ZpOp *free_op)
{
    return alloc && alloc->kind == ZP_OP_ALLOC && alloc->sub == free_op->sub &&
           alloc->bytes == free_op->bytes;
}

/* ---- an allocation's identity ----
 *
 * The builder allocates each micro-step's buffers the same way: on a stage, for a unit, of a
 * category, in the same order. So an allocation is named by its stage, micro-step, unit,
 * category and ordinal among that micro-step's allocations of that unit and category, in the
 * longer schedule as in this one, and a free frees the allocation of its own micro-step
 * named as its alloc here is. That is how a copy of a steady period pairs its frees, wherever
 * the allocations lie: in an earlier copy, or in the warm-up before the insertion (1F1B's
 * first stage frees its warm-up forwards' activations through its first pp steady periods,
 * each at another distance, so that pairing a copy's frees as far back as its model's held
 * only pp periods on, and the short schedule had to keep 2 pp + 1 micro-steps for the
 * replay where the simulator's fold needs about pp + 5: cli_rank.c cli_rank_short_by). */

/* The name, packed: a mark (bit 63: never 0, zp_u64map's empty slot), stage 15 bits, micro-step 24,
 * unit 16, category 4, ordinal 4. */
#define KEY_STAGE_LIMIT (1 << 15)
#define KEY_MICRO_LIMIT (1 << 24)
#define KEY_UNIT_LIMIT (1 << 16)
#define KEY_ORDINAL_LIMIT 16
G_STATIC_ASSERT(ZP_MEM_N <= 16);

/* inlined: name_role names each alloc (a call was 25 instructions) */
G_ALWAYS_INLINE static inline gboolean key_of(uint32_t stage, int64_t micro, int32_t unit,
                                              uint32_t sub, uint32_t ordinal, uint64_t *key)
{
    if (stage >= KEY_STAGE_LIMIT || micro < 0 || micro >= KEY_MICRO_LIMIT || unit < -1 ||
        unit + 1 >= KEY_UNIT_LIMIT || ordinal >= KEY_ORDINAL_LIMIT)
        return FALSE;
    *key = (uint64_t)1 << 63 | (uint64_t)stage << 48 | (uint64_t)micro << 24 |
           (uint64_t)(unit + 1) << 8 | (uint64_t)sub << 4 | ordinal;
    return TRUE;
}

/* ---- the ops the walks visit ----
 *
 * Of a pipeline schedule's ops a quarter or less are allocs and frees (Megatron 1T's short
 * schedule: 37,776 of 130,674), and three walks read every op (the highest buffer,
 * Period's frees after an insertion, the list itself, which names the allocs' roles): each
 * reads the allocs and frees, and the first op of each stage (where micro-step shifts
 * restart), listed once here. */
typedef struct {
    uint32_t *op;  /* op indices, increasing */
    guint n;
    guint allocs;  /* of them, allocs of a buffer at a micro-step (named: name_role) */
    int32_t most;  /* the highest buffer id of an alloc or free */
} Visits;

/* The counts in locals, stored once: through v, each op's index written might have been
 * one of them to the compiler, which loaded and stored them all at every op. The highest
 * buffer is an alloc's or free's only (what the list's fresh ids must pass and alloc_of
 * index; a collective's bucket is an alloc's buffer, and no collective is replayed), so that
 * an op of another kind in its stage costs a test of its kind and one of its stage: 10
 * instructions an op, from 14 (Megatron 1T's 93,000 such ops). */
static void visits_init(const ZpSchedule *s, Visits *v)
{
    const guint n = s->ops->len;
    uint32_t *visit = g_new(uint32_t, MAX(n, 1));
    guint n_visits = 0, allocs = 0;
    int32_t most = -1;
    uint32_t stage = UINT32_MAX;
    /* by pointer, its index worked out at a visit only */
    const ZpOp *first = n ? zp_sched_op(s, 0) : NULL, *end = first + n;
    G_STATIC_ASSERT(ZP_OP_FREE == ZP_OP_ALLOC + 1);
    for (const ZpOp *op = first; op < end; op++) {
        if ((uint8_t)(op->kind - ZP_OP_ALLOC) <= 1) {
            most = MAX(most, op->buffer);
            allocs += op->kind == ZP_OP_ALLOC && op->buffer >= 0 && op->micro >= 0;
        } else if (op->stage == stage) {
            continue;
        }
        visit[n_visits++] = (uint32_t)(op - first);
        stage = op->stage;
    }
    *v = (Visits){.op = visit, .n = n_visits, .allocs = allocs, .most = most};
}

/* The first visit at or after op `op` (v->n: none). */
static guint visit_at(const Visits *v, uint32_t op)
{
    return zp_lower_bound_u32(v->op, v->n, op);
}

/* The name of an alloc at micro-step `micro`, its name at micro-step 0 (its role, from
 * name_role) given: FALSE where it has none, or micro passes its bits. A name was 27
 * instructions from the op's fields (key_of), of 75,000 names for Megatron 1T. */
G_ALWAYS_INLINE static inline gboolean key_at(uint64_t role, int64_t micro, uint64_t *key)
{
    if (role == 0 || micro < 0 || micro >= KEY_MICRO_LIMIT)
        return FALSE;
    *key = role | (uint64_t)micro << 24;
    return TRUE;
}

/* The longer schedule's live allocations by name (-> its model op here and its buffer there:
 * name_value), the state a free needs to find its own, and the list being written: ops
 * (ZpAllocOp, list_add), the next place and the next fresh buffer. */
typedef struct {
    const ZpSchedule *s;
    const ZpOp *op0; /* s's ops: op i is op0 + i (zp_sched_op loaded s->ops and its data at
                      * every op, stores to the list between: 0.7 M of Megatron 1T's) */
    const Visits *visits;
    uint64_t *role; /* [alloc op]: its role (name_role), made as the list reaches it */
    ZpU64Map count; /* a buffer's name at its micro-step, ordinal 0 -> its allocs so far */
    int32_t *alloc_of; /* [buffer]: its latest alloc's op here (-1: none yet), at the list's
                        * place (period_init moves it on past the insertion, and back) */
    ZpU64Map live;
    /* The list: ops's elements up to `end` (its len set at the end, and where it grows), room
     * to `limit`: an op added with a comparison and a store (zp_array_extend loaded and
     * stored the length and tested the room twice: 0.8 M of Megatron 1T's 55,000 ops) */
    GArray *ops;
    ZpAllocOp *end, *limit;
    uint32_t at;
    int32_t fresh;
} Names;

static inline const ZpOp *model_op(const Names *n, uint32_t i)
{
    return n->op0 + i;
}

/* The ops listed so far. */
static guint list_len(const Names *n)
{
    return (guint)(n->end - (ZpAllocOp *)(void *)n->ops->data);
}

/* Room for one op more: the list grown (zp_array_extend's doubling over huge pages). */
static void list_grow(Names *n)
{
    const guint len = list_len(n);
    n->ops->len = len;
    guint room = len;
    zp_array_extend(n->ops, 1, sizeof(ZpAllocOp), &room);
    n->ops->len = len;
    n->end = (ZpAllocOp *)(void *)n->ops->data + len;
    n->limit = (ZpAllocOp *)(void *)n->ops->data + MAX(room, len + 1);
}

/* Adds op so to the list. */
G_ALWAYS_INLINE static inline void list_add(Names *n, ZpAllocOp so)
{
    if (G_UNLIKELY(n->end == n->limit))
        list_grow(n);
    *n->end++ = so;
}

static uint64_t name_value(uint32_t model, int32_t buffer)
{
    return (uint64_t)model << 32 | (uint32_t)buffer;
}

/* Makes alloc op i's role (op of a micro-step, micro >= 0), its name at micro-step 0: a
 * buffer's with its ordinal among its stage's and micro-step's allocs of its unit and
 * category here, a state's with ordinal 0 (0 where its fields pass the name's bits). FALSE
 * where a buffer's alloc passes the name's bits. Every role read is of an op before the
 * list's place (the model periods, a free's alloc), so the list makes them as it goes: a
 * walk of their own read Megatron 1T's 75,554 visited ops once more, a fifth of
 * zp_alloc_ops_extended's time (perf) in cache misses. The counts' table holds one name an
 * alloc at most: sized for them (Visits.allocs), it never grows (from 1,024 it grew five
 * times for Megatron 1T's 18,888 names, 2.3 M instructions). */
G_ALWAYS_INLINE static inline gboolean name_role(Names *n, uint32_t i, const ZpOp *op)
{
    uint64_t key;
    if (op->buffer < 0) {
        n->role[i] = key_of(op->stage, 0, op->unit, op->sub, 0, &key) ? key : 0;
        return TRUE;
    }
    if (!key_of(op->stage, op->micro, op->unit, op->sub, 0, &key))
        return FALSE;
    /* its count before this one, counted up: one probe; its role is the key with micro-step
     * 0 and that ordinal (the fields checked in it: a second key_of was 16 instructions at
     * each of Megatron 1T's 18,888 allocs) */
    const uint64_t seen = (*zp_u64map_at(&n->count, key, 0))++;
    n->role[i] = (key & ~((uint64_t)(KEY_MICRO_LIMIT - 1) << 24)) | seen;
    return seen < KEY_ORDINAL_LIMIT;
}

/* Names the alloc `op` (model op index `model`) at micro-step `micro` of the longer schedule,
 * its buffer there `buffer`. FALSE where the name does not fit its bits. */
G_ALWAYS_INLINE static inline gboolean name_alloc(Names *n, uint32_t model, int32_t micro,
                                                  int32_t buffer)
{
    const ZpOp *op = model_op(n, model);
    if (op->buffer < 0 || op->micro < 0)
        return TRUE; /* states and regions are not named: no free looks them up */
    uint64_t key;
    if (!key_at(n->role[model], micro, &key))
        return FALSE;
    zp_u64map_put(&n->live, key, name_value(model, buffer));
    return TRUE;
}

/* The buffer that free op `model`, at micro-step `micro` of the longer schedule, frees there:
 * the allocation named as its alloc here, moved to its micro-step (-1 where none is live, or
 * one of another size or category: the insert is not what it claims). */
G_ALWAYS_INLINE static inline int32_t named_buffer(Names *n, uint32_t model, int32_t micro)
{
    const ZpOp *free_op = model_op(n, model);
    uint64_t key;
    if (!key_at(n->role[n->alloc_of[free_op->buffer]], micro, &key))
        return -1;
    /* taken out at once (one probe): where it is not free_op's, nothing is listed at all */
    const uint64_t value = zp_u64map_take(&n->live, key, UINT64_MAX);
    if (value == UINT64_MAX || !same_alloc(model_op(n, (uint32_t)(value >> 32)), free_op))
        return -1;
    return (int32_t)(uint32_t)value;
}

/* Whether free op `model`'s alloc here is its own micro-step's (then it is paired by name). */
static gboolean pairs_by_name(const Names *n, const ZpOp *free_op)
{
    return free_op->buffer >= 0 && free_op->micro >= 0 && n->alloc_of[free_op->buffer] >= 0 &&
           model_op(n, (uint32_t)n->alloc_of[free_op->buffer])->micro == free_op->micro;
}

/* ---- copies left out ----
 *
 * A copy's free of its own micro-step's allocation finds it a fixed number of copies back
 * (delta: the model period's alloc of that name is delta periods' micro-steps later than the
 * free's micro-step) or, in the first copies, in the warm-up before the insertion. From copy
 * 1 + the most delta on, every copy's frees find their allocations in the copies only: each
 * copy is then its predecessor a period on, buffer for buffer, and the frees after the copies
 * look back no further than their last such copies. So the copies past those are left out
 * (ZpAllocRun), the live names of the listed ones moved as many copies on; where every alloc
 * of the period is freed by a free of it, their buffers are taken again a window of listed
 * copies on (each freed within it). */

/* Insert x's model period: its allocs (model ops, in order: their ordinal in the period) by
 * the name they have in every micro-step (micro-step 0 in the key: role), the most delta of
 * its frees and of the frees after it that look back into its copies (`back`), and whether
 * each of its allocs is freed by one of its frees. */
typedef struct {
    uint32_t *op, len; /* len: its allocs and frees */
    int32_t allocs;
    ZpU64Map role; /* name at micro-step 0 -> the first alloc of it (ordinal); more: next[] */
    int32_t *next;
    uint64_t back;
    gboolean all_freed, matched;
} Period;

static void period_free(Period *p)
{
    g_free(p->op);
    g_free(p->next);
    zp_u64map_free(&p->role);
}

/* The ordinal of the period's alloc named as alloc `a` whose micro-step is `micro` less whole
 * periods (micro_step apart) at the least, and how many periods (*delta); -1: none. */
static int32_t period_alloc(const Names *n, const Period *p, uint32_t a, int64_t micro,
                            uint32_t micro_step, uint64_t *delta)
{
    if (n->role[a] == 0)
        return -1;
    const uint64_t first = zp_u64map_get(&p->role, n->role[a], UINT64_MAX);
    for (int32_t j = first == UINT64_MAX ? -1 : (int32_t)first; j >= 0; j = p->next[j]) {
        const int64_t d = model_op(n, p->op[j])->micro - micro;
        if (d >= 0 && d % micro_step == 0) {
            *delta = (uint64_t)d / micro_step;
            return j;
        }
    }
    return -1;
}

/* The visits of insert x's model period: [*from, *to). */
static void period_visits(const Names *n, const ZpOpInsert *x, guint *from, guint *to)
{
    *from = visit_at(n->visits, x->at - x->step);
    *to = visit_at(n->visits, x->at);
}

/* Insert x's Period (its model period's visits [from, to)): its frees paired as append_copy
 * pairs them (n->alloc_of, at the insertion), then, where copies may be left out (1 + their
 * delta under x's periods), the frees after it to its stage's end each with its buffer's
 * latest alloc before it: n->alloc_of moved on through the allocs after the insertion, and
 * back at the end (moved[], the entries it overwrote). A table of every free's alloc, made
 * from a walk of all the visits, was 0.77 M instructions for Megatron 1T, where the walks
 * after its 64 insertions read its frees once each. */
static void period_init(Names *n, const ZpOpInsert *x, guint from, guint to, Period *p)
{
    const uint32_t micro_step = MAX(x->micro_steps, 1);
    const Visits *v = n->visits;
    const guint size = MAX(to - from, 1);
    *p = (Period){.op = g_new(uint32_t, size), .next = g_new(int32_t, size),
                  .all_freed = TRUE, .matched = TRUE};
    zp_u64map_init(&p->role, size);
    for (guint k = from; k < to; k++) {
        const uint32_t t = v->op[k];
        const ZpOp *op = model_op(n, t);
        p->len += op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE;
        if (op->kind != ZP_OP_ALLOC)
            continue;
        p->op[p->allocs] = t;
        p->next[p->allocs] = -1;
        if (op->micro >= 0 && n->role[t] != 0) {
            const uint64_t key = n->role[t];
            const uint64_t first = zp_u64map_get(&p->role, key, UINT64_MAX);
            if (first != UINT64_MAX) { /* after the last of its name */
                int32_t j = (int32_t)first;
                while (p->next[j] >= 0)
                    j = p->next[j];
                p->next[j] = p->allocs;
            } else {
                zp_u64map_put(&p->role, key, (uint64_t)p->allocs);
            }
        }
        p->allocs++;
    }
    gboolean *freed = g_new0(gboolean, MAX(p->allocs, 1));
    int32_t *moved = NULL; /* (buffer, its entry before) for each alloc after the insertion */
    guint n_moved = 0;
    const uint32_t stage = model_op(n, x->at - 1)->stage;
    /* Every stage's first op is visited, so its end is seen here as among all ops. */
    for (guint k = from; k < v->n; k++) {
        const uint32_t t = v->op[k];
        const ZpOp *op = model_op(n, t);
        const gboolean in_model = k < to;
        if (!in_model && op->stage != stage)
            break; /* the stage's end */
        if (k == to) { /* the frees after it: only where copies may be left out */
            if (!p->matched || p->len == 0 || 1 + p->back >= x->periods)
                break;
            moved = g_new(int32_t, 2 * (size_t)(v->n - to));
        }
        if (!in_model && op->kind == ZP_OP_ALLOC && op->buffer >= 0) {
            moved[2 * n_moved] = op->buffer;
            moved[2 * n_moved++ + 1] = n->alloc_of[op->buffer];
            n->alloc_of[op->buffer] = (int32_t)t;
        }
        if (op->kind != ZP_OP_FREE || op->buffer < 0 || op->micro < 0)
            continue;
        const uint32_t a =
            n->alloc_of[op->buffer] < 0 ? UINT32_MAX : (uint32_t)n->alloc_of[op->buffer];
        if (a == UINT32_MAX || model_op(n, a)->micro != op->micro)
            continue;
        if (!in_model && a >= x->at)
            continue; /* its alloc after the insertion: not in the copies */
        uint64_t delta;
        const int32_t j = period_alloc(n, p, a, op->micro, micro_step, &delta);
        if (in_model && (j < 0 || (delta == 0 && p->op[j] >= t))) {
            p->matched = FALSE; /* found before the insertion only: never steady */
            continue;
        }
        if (j < 0)
            continue;
        p->back = MAX(p->back, delta);
        if (in_model)
            freed[j] = TRUE;
    }
    while (n_moved > 0) { /* back, the latest first */
        n_moved--;
        n->alloc_of[moved[2 * n_moved]] = moved[2 * n_moved + 1];
    }
    g_free(moved);
    for (int32_t j = 0; j < p->allocs; j++)
        p->all_freed = p->all_freed && freed[j];
    g_free(freed);
}

/* The live names of insert x's listed copies 1 to `listed` (its micro-steps `shift` on,
 * buffers from `fresh`), moved `copies` copies on: what the copies left out leave live,
 * copy for copy (the frees after them look up only those). FALSE where a name passes its
 * bits. */
static gboolean move_names(Names *n, const ZpOpInsert *x, const Period *p, int32_t shift,
                           uint64_t listed, const ZpAllocRun *run)
{
    /* each name, moved: its key and value */
    uint64_t *moved = g_new(uint64_t, 2 * MAX(listed * (uint64_t)p->allocs, 1));
    guint n_moved = 0;
    gboolean ok = TRUE;
    for (uint64_t c = 1; ok && c <= listed; c++)
        for (int32_t j = 0; ok && j < p->allocs; j++) {
            const ZpOp *op = model_op(n, p->op[j]);
            uint64_t key, to = 0;
            if (op->micro < 0)
                continue;
            const int64_t micro = op->micro + shift + (int64_t)(c * x->micro_steps);
            ok = key_at(n->role[p->op[j]], micro, &key);
            const uint64_t value = ok ? zp_u64map_take(&n->live, key, UINT64_MAX) : UINT64_MAX;
            if (value == UINT64_MAX)
                continue;
            const int32_t buffer = zp_alloc_run_buffer((int32_t)(uint32_t)value, run->copies,
                                                       run->buffer_step, run->first_buffer,
                                                       run->buffer_window);
            ok = key_at(n->role[p->op[j]], micro + (int64_t)(run->copies * x->micro_steps), &to);
            moved[2 * n_moved] = to;
            moved[2 * n_moved++ + 1] = name_value(p->op[j], buffer);
        }
    for (guint k = 0; ok && k < n_moved; k++)
        zp_u64map_put(&n->live, moved[2 * k], moved[2 * k + 1]);
    g_free(moved);
    return ok;
}

static gint insert_cmp(gconstpointer x, gconstpointer y, gpointer unused)
{
    (void)unused;
    const ZpOpInsert *a = x, *b = y;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* Appends a copy (its micro-steps `shift` on) of insert x's model period (its visits [from,
 * to)), at places from n->at on; FALSE where one of its ops is not what a steady period's is
 * (a state or region op, a free of another micro-step's allocation or of none named). */
static gboolean append_copy(Names *n, const ZpOpInsert *x, guint from, guint to, int32_t shift)
{
    const uint32_t model = x->at - x->step, at = n->at;
    n->at += x->step;
    for (guint k = from; k < to; k++) {
        const uint32_t t = n->visits->op[k];
        const ZpOp *op = model_op(n, t);
        if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE)
            continue;
        if (op->buffer < 0)
            return FALSE; /* a state or retaken op inside a steady period */
        ZpAllocOp so = {op, at + (t - model), op->micro < 0 ? op->micro : op->micro + shift, -1};
        if (op->kind == ZP_OP_ALLOC) {
            so.buffer = n->fresh++;
            if (!name_alloc(n, t, so.micro, so.buffer))
                return FALSE;
        } else if (!pairs_by_name(n, op) || (so.buffer = named_buffer(n, t, so.micro)) < 0) {
            return FALSE;
        }
        list_add(n, so);
    }
    return TRUE;
}

/* Appends insert x's copies, its micro-steps `shift` on: every one, or where runs may be
 * made (may_leave_out) and a run pays, the first 1 + the most delta (Period) and a run
 * standing for the rest (appended to runs). FALSE where a copy is not what a steady period's
 * is, or a run's copies would not repeat the last listed one. */
static gboolean add_insert(Names *n, const ZpOpInsert *x, int32_t shift, gboolean may_leave_out,
                           GArray *runs)
{
    Period p = {0};
    uint64_t listed = x->periods;
    /* A run lists 1 + delta copies, and Period (its frees, and the frees after the
     * insertion to the stage's end) costs about as much as listing a few: with 8
     * periods or fewer it does not pay (interleaved schedules insert a few groups:
     * narayanan21-t1-529.6b's 3 took 476.8 M -> 489.8 M instructions, 310.1b's 4
     * 206.7 M -> 213.5 M, listing 2 of them). */
    const gboolean run_may_pay = may_leave_out && x->periods > 8;
    guint from, to;
    period_visits(n, x, &from, &to);
    if (run_may_pay) {
        period_init(n, x, from, to, &p);
        if (p.matched && p.len > 0)
            listed = MIN(listed, 1 + p.back);
    }
    const int32_t first_buffer = n->fresh;
    guint first = list_len(n);
    gboolean ok = TRUE;
    for (uint64_t c = 1; ok && c <= listed; c++) {
        first = list_len(n);
        ok = append_copy(n, x, from, to, shift + (int32_t)(c * x->micro_steps));
    }
    if (ok && listed < x->periods) {
        const ZpAllocRun run = {
            .after = list_len(n), .first = first, .len = p.len,
            .at_step = x->step, .micro_step = (int32_t)x->micro_steps,
            .buffer_step = p.allocs, .first_buffer = first_buffer,
            .buffer_window = p.all_freed ? (int32_t)listed * p.allocs : 0,
            .listed_copies = (uint32_t)listed, .copies = x->periods - listed};
        ok = list_len(n) - first == p.len && move_names(n, x, &p, shift, listed, &run);
        g_array_append_val(runs, run);
        n->at += (uint32_t)(run.copies * x->step);
        if (run.buffer_window == 0)
            n->fresh += (int32_t)run.copies * p.allocs;
    }
    if (run_may_pay)
        period_free(&p);
    return ok;
}

/* zp_array_extend's room for the list: this schedule's allocs and frees (visits) and each
 * insert's copies of its period's, all of them, or where copies may be left out (Period pays
 * above 8 periods, add_insert) as many as the stages (1F1B's first stage lists as many, a
 * later one fewer: Megatron 1T lists 54,924 where this room is 70,689). Where a list passed
 * its room, its growth copied it whole: a quarter of the ops (32,684 for Megatron 1T) was
 * 0.9 M instructions of memcpy where the heap could not grow it in place. */
static guint list_room(const ZpSchedule *s, const Visits *v, const ZpOpInsert *ins,
                       size_t n_ins, gboolean some_left_out)
{
    uint64_t room = v->n + 16;
    for (size_t k = 0; k < n_ins; k++) {
        const uint64_t listed = some_left_out && ins[k].periods > 8
                                    ? MIN(ins[k].periods, (uint64_t)MAX(s->stages, 1))
                                    : ins[k].periods;
        room += listed * (visit_at(v, ins[k].at) - visit_at(v, ins[k].at - ins[k].step));
    }
    /* a reservation (untouched until written), at most 1 GiB: a list past it grows */
    return (guint)MIN(room, (uint64_t)(G_MAXUINT / 4 / sizeof(ZpAllocOp)));
}

/* Lists the inserts from ins[*k] on whose places lie below `end`, their micro-steps
 * *micro_shift on; *inserted: the places the inserts before took (each insert's copies start
 * at its place that many on), and *micro_shift, both advanced past them. */
static gboolean add_inserts(Names *n, const ZpOpInsert *ins, size_t n_ins, size_t *k,
                            uint64_t end, int32_t *micro_shift, uint64_t *inserted,
                            gboolean may_leave_out, GArray *runs)
{
    gboolean ok = TRUE;
    for (; ok && *k < n_ins && ins[*k].at < end; (*k)++) {
        const ZpOpInsert *x = &ins[*k];
        n->at = (uint32_t)(x->at + *inserted);
        ok = add_insert(n, x, *micro_shift, may_leave_out, runs);
        *micro_shift += (int32_t)(x->periods * x->micro_steps);
        *inserted += x->periods * x->step;
    }
    return ok;
}

/* Lists visited op i (an alloc or free, or its stage's first op), at its place n->at. FALSE
 * where its name does not fit or a free finds none. */
static gboolean list_op(Names *n, int32_t *alloc_of, uint32_t i, int32_t micro_shift)
{
    const ZpOp *here = model_op(n, i);
    if (here->kind != ZP_OP_ALLOC && here->kind != ZP_OP_FREE)
        return TRUE;
    ZpAllocOp so = {here, n->at, here->micro < 0 ? here->micro : here->micro + micro_shift,
                    here->buffer};
    gboolean ok = TRUE;
    if (here->kind == ZP_OP_ALLOC) {
        if (here->buffer >= 0)
            alloc_of[here->buffer] = (int32_t)i;
        ok = (here->micro < 0 || name_role(n, i, here)) && name_alloc(n, i, so.micro, so.buffer);
    } else if (pairs_by_name(n, here)) {
        so.buffer = named_buffer(n, i, so.micro);
        ok = so.buffer >= 0;
    }
    list_add(n, so);
    return ok;
}

/* The longer schedule's allocs and frees: this one's, with the inserted periods' copies
 * (ZpOpInsert), each copy's micro-steps numbered on and the ops after them by as many. Each
 * allocation keeps its buffer, a copy's a new one. A free of its own micro-step's allocation
 * frees the one of that name in the longer schedule (above); any other free keeps its alloc:
 * a buffer held across the steady state (the step's buckets, say). NULL where a copy's op is
 * not what that implies (a free of another name or size, a state or region op inside a
 * period, names past their bits): the caller replays the longer schedule. With runs, where
 * each stage has one insert, the copies past 1 + the most delta of each (Period) are left
 * out (Megatron 1T's 64 stages insert 440 micro-steps each, of which its replay replays few:
 * over a million ops to list them all). */
GArray *zp_alloc_ops_extended(const ZpSchedule *s, const ZpOpInsert *given, size_t n_ins,
                              GArray *runs)
{
    const guint n = s->ops->len;
    Visits v;
    visits_init(s, &v);
    const int32_t most = v.most;
    uint64_t total = n;
    for (size_t k = 0; k < n_ins; k++)
        total += given[k].periods * given[k].step;
    gboolean fits = (uint64_t)most <= 4 * (uint64_t)n + 1024 &&
                    total < ZP_ALLOC_OPS_MAX_PLACES && (uint64_t)most + total < INT32_MAX;
    for (size_t k = 0; fits && k < n_ins; k++)
        fits = given[k].step > 0 && given[k].at >= given[k].step && given[k].at <= n;
    if (!fits) {
        g_free(v.op);
        return NULL;
    }
    ZpOpInsert *ins = g_memdup2(given, MAX(n_ins, 1) * sizeof *ins);
    if (n_ins > 1)
        g_qsort_with_data(ins, (gint)n_ins, sizeof *ins, insert_cmp, NULL);
    /* Copies left out where each stage has one insert (a second's names would shift the
     * first's) */
    gboolean leave_out = runs != NULL;
    for (size_t k = 1; leave_out && k < n_ins; k++)
        leave_out =
            zp_sched_op(s, ins[k].at - 1)->stage != zp_sched_op(s, ins[k - 1].at - 1)->stage;
    int32_t *alloc_of = g_new(int32_t, (size_t)most + 2);
    for (int32_t b = 0; b <= most; b++)
        alloc_of[b] = -1;
    gboolean some_left_out = FALSE;
    for (size_t j = 0; leave_out && j < n_ins; j++)
        some_left_out = some_left_out || ins[j].periods > 8;
    const guint room = list_room(s, &v, ins, n_ins, some_left_out);
    Names names = {.s = s, .op0 = n ? zp_sched_op(s, 0) : NULL, .visits = &v,
                   .role = g_new(uint64_t, MAX(n, 1)), .alloc_of = alloc_of,
                   .ops = g_array_sized_new(FALSE, FALSE, sizeof(ZpAllocOp), room),
                   .fresh = most + 1};
    names.end = (ZpAllocOp *)(void *)names.ops->data;
    names.limit = names.end + room;
    zp_u64map_init(&names.live, 1024);
    zp_u64map_init(&names.count, v.allocs);
    int32_t micro_shift = 0;
    uint64_t inserted = 0;
    uint32_t stage = UINT32_MAX;
    size_t k = 0;
    gboolean ok = TRUE;
    /* The visits only: between two, no op is an alloc or free or starts a stage, so an insert
     * there follows the visit before (its stage's micro-step shift). next_insert: the next
     * insert's place, tested here (a call a visit was 2.7 M instructions for Megatron 1T). */
    uint64_t next_insert = n_ins ? ins[0].at : UINT64_MAX;
    for (guint j = 0; ok && j < v.n; j++) {
        const uint32_t i = v.op[j];
        if (next_insert < i)
            ok = add_inserts(&names, ins, n_ins, &k, i, &micro_shift, &inserted,
                             some_left_out, runs);
        if (ok && names.op0[i].stage != stage) {
            stage = names.op0[i].stage;
            micro_shift = 0;
        }
        if (next_insert <= i) {
            ok = ok && add_inserts(&names, ins, n_ins, &k, (uint64_t)i + 1, &micro_shift,
                                   &inserted, some_left_out, runs);
            next_insert = k < n_ins ? ins[k].at : UINT64_MAX;
        }
        names.at = (uint32_t)(i + inserted);
        ok = ok && list_op(&names, alloc_of, i, micro_shift);
    }
    ok = ok && add_inserts(&names, ins, n_ins, &k, n, &micro_shift, &inserted, some_left_out,
                           runs);
    names.ops->len = list_len(&names);
    zp_u64map_free(&names.live);
    zp_u64map_free(&names.count);
    g_free(alloc_of);
    g_free(names.role);
    g_free(ins);
    g_free(v.op);
    if (!ok || k != n_ins) {
        g_array_unref(names.ops);
        if (runs)
            g_array_set_size(runs, 0);
        return NULL;
    }
    return names.ops;
}
