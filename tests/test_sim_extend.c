/* test_sim_extend: a short schedule (fewer micro-steps) whose fold counts the missing steady
 * periods as virtual ones gives the long schedule's result in every field (sim_fold.c); and
 * the structural fact it rests on: the builder's long schedule is the short one with whole
 * steady periods inserted, op for op. */
#include "cli.h"
#include "sim_common.h"
#include "zp_alloc_ops.h"
#include "zp_alloc_replay.h"
#include "zp_alloc_seq.h"

typedef struct {
    const char *what;
    int stage, dp, mp, pp, v;
    ZpPipeSchedule schedule;
    gboolean checkpoint;
    int accum, short_accum; /* the long schedule's micro-steps, and the short one's */
    uint32_t period;        /* micro-steps a steady period holds */
} ExtCase;

static ZpSchedule *ext_schedule(const ExtCase *c, int accum)
{
    const ZpModel m = sim_gpt_model(64, 32000);
    ZpPlan p;
    zp_plan_defaults(&p, c->stage, c->dp, c->mp);
    p.pipe.stages = c->pp;
    p.pipe.schedule = c->schedule;
    p.pipe.virtual_stages = c->v;
    p.grad_accum = accum;
    p.checkpoint = c->checkpoint;
    p.gpus_per_node = a100.gpus_per_node;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    return s;
}

static const ExtCase cases[] = {
    {"1f1b pp 2", 0, 1, 1, 2, 1, ZP_PIPE_1F1B, FALSE, 96, 32, 1},
    {"1f1b pp 4 tp 2 dp 2", 1, 2, 2, 4, 1, ZP_PIPE_1F1B, TRUE, 64, 32, 1},
    {"1f1b pp 8", 0, 1, 1, 8, 1, ZP_PIPE_1F1B, FALSE, 128, 48, 1},
    {"1f1b pp 16", 0, 1, 1, 16, 1, ZP_PIPE_1F1B, FALSE, 192, 64, 1},
    {"interleaved pp 4 v 2", 0, 2, 1, 4, 2, ZP_PIPE_INTERLEAVED, FALSE, 256, 96, 4},
    {"accumulation, stage 2", 2, 16, 1, 1, 1, ZP_PIPE_1F1B, FALSE, 64, 24, 1},
    {"accumulation, stage 3", 3, 8, 1, 1, 1, ZP_PIPE_1F1B, FALSE, 48, 20, 1},
    /* DeepSpeed's ipg buffer held from micro-step 0 to the last (sim_fold.c's far ops) */
    {"accumulation, stage 1", 1, 16, 1, 1, 1, ZP_PIPE_1F1B, FALSE, 64, 24, 1},
    {"gpipe pp 4", 0, 1, 1, 4, 1, ZP_PIPE_GPIPE, FALSE, 64, 32, 1},
};

/* Whether op b (long) is op a (short) moved: every field but micro and buffer, its
 * dependencies mapped by map (short index -> long index), or past the inserted ops (shift). */
static gboolean same_moved(const ZpSchedule *s, uint32_t i, const ZpSchedule *l, uint32_t j,
                           const uint32_t *map, const uint32_t *shift)
{
    const ZpOp *a = zp_sched_op(s, i), *b = zp_sched_op(l, j);
    if (a->kind != b->kind || a->sub != b->sub || a->stream != b->stream ||
        a->group != b->group || a->module != b->module || a->unit != b->unit ||
        a->stage != b->stage || a->peer != b->peer || a->flops != b->flops ||
        a->gemm_flops != b->gemm_flops || a->attn_flops != b->attn_flops ||
        a->mem_bytes != b->mem_bytes || a->bytes != b->bytes ||
        a->elem_offset != b->elem_offset || a->elems != b->elems || a->n_deps != b->n_deps)
        return FALSE;
    const uint32_t *da = zp_sched_deps(s, a), *db = zp_sched_deps(l, b);
    /* A dependency inside the steady periods may lie on either side of the insertion: the
     * ops just before it are the inserted ones' copies. */
    for (uint32_t k = 0; k < a->n_deps; k++)
        if (map[da[k]] != db[k] && map[da[k]] + shift[da[k]] != db[k])
            return FALSE;
    return TRUE;
}

/* The long schedule is the short one with whole periods inserted, stage by stage: each
 * stage's ops are the short stage's up to some op X, then (long - short) micro-steps' worth of
 * ops each repeating the op a period (q ops) before it, then the short stage's from X on;
 * dependencies map alike (an op at or past X moves by the inserted ops, across stages too). */
static void assert_inserted(const ExtCase *c)
{
    ZpSchedule *s = ext_schedule(c, c->short_accum), *l = ext_schedule(c, c->accum);
    const uint32_t P = (uint32_t)MAX(s->stages, 1);
    uint32_t *ss = g_new0(uint32_t, P + 1), *ls = g_new0(uint32_t, P + 1);
    for (guint i = 0; i < s->ops->len; i++)
        ss[zp_sched_op(s, i)->stage + 1]++;
    for (guint i = 0; i < l->ops->len; i++)
        ls[zp_sched_op(l, i)->stage + 1]++;
    for (uint32_t t = 0; t < P; t++) {
        ss[t + 1] += ss[t];
        ls[t + 1] += ls[t];
    }
    g_assert_cmpuint(ss[P], ==, s->ops->len);
    /* Each stage's X: its longest prefix of equal statics (a first guess, the dependencies
     * checked after), and the inserted ops D. */
    uint32_t *x = g_new(uint32_t, P), *map = g_new(uint32_t, s->ops->len);
    uint32_t *shift = g_new0(uint32_t, s->ops->len);
    const uint32_t periods = (uint32_t)(c->accum - c->short_accum) / c->period;
    for (uint32_t t = 0; t < P; t++) {
        const uint32_t n = ss[t + 1] - ss[t], d = ls[t + 1] - ls[t] - n;
        g_assert_cmpuint(d % periods, ==, 0);
        /* X: where the short stage's steady periods end (its cool-down begins while the
         * long one's steady state goes on): the longest prefix of equal kinds and sizes. */
        uint32_t prefix = 0;
        while (prefix < n &&
               zp_sched_op(s, ss[t] + prefix)->kind == zp_sched_op(l, ls[t] + prefix)->kind &&
               zp_sched_op(s, ss[t] + prefix)->sub == zp_sched_op(l, ls[t] + prefix)->sub &&
               zp_sched_op(s, ss[t] + prefix)->bytes == zp_sched_op(l, ls[t] + prefix)->bytes)
            prefix++;
        x[t] = prefix;
        for (uint32_t i = 0; i < n; i++) {
            map[ss[t] + i] = ls[t] + i + (i >= x[t] ? d : 0);
            shift[ss[t] + i] = i < x[t] ? d : 0;
        }
    }
    for (uint32_t t = 0; t < P; t++) {
        const uint32_t n = ss[t + 1] - ss[t], d = ls[t + 1] - ls[t] - n, q = d / periods;
        for (uint32_t i = 0; i < n; i++)
            g_assert_true(same_moved(s, ss[t] + i, l, map[ss[t] + i], map, shift));
        /* The inserted ops: each the op q before it, dependencies q before theirs. */
        g_assert_cmpuint(x[t], >=, q);
        for (uint32_t j = ls[t] + x[t]; j < ls[t] + x[t] + d; j++) {
            const ZpOp *a = zp_sched_op(l, j - q), *b = zp_sched_op(l, j);
            g_assert_cmpint(a->kind, ==, b->kind);
            g_assert_cmpint(a->sub, ==, b->sub);
            g_assert_cmpfloat(a->flops, ==, b->flops);
            g_assert_cmpfloat(a->bytes, ==, b->bytes);
            g_assert_cmpuint(a->n_deps, ==, b->n_deps);
            const uint32_t *da = zp_sched_deps(l, a), *db = zp_sched_deps(l, b);
            for (uint32_t k = 0; k < a->n_deps; k++) {
                /* a dependency on another stage's op moves by that stage's q */
                const uint32_t u = zp_sched_op(l, da[k])->stage;
                const uint32_t qu = (ls[u + 1] - ls[u] - (ss[u + 1] - ss[u])) / periods;
                g_assert_cmpuint(db[k], ==, da[k] + qu);
            }
        }
    }
    g_free(x);
    g_free(map);
    g_free(shift);
    g_free(ss);
    g_free(ls);
    zp_sched_free(s);
    zp_sched_free(l);
}

static void test_extend_structure(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        if (cases[k].schedule == ZP_PIPE_GPIPE)
            continue; /* two phases grow: inserted in both (no virtual periods: below) */
        g_test_message("%s", cases[k].what);
        assert_inserted(&cases[k]);
    }
}

static SimResult *run_ext(const ZpSchedule *s, SimOptions o)
{
    GError *error = NULL;
    SimResult *r = sim_engine_run(s, &a100, &o, &error);
    g_assert_no_error(error);
    return r;
}

/* Every field of the result but state_bytes and the fold's own. */
static void assert_same_all(const SimResult *f, const SimResult *u)
{
    assert_same_totals(f, u);
    assert_same_doubles(f->offload_bytes, u->offload_bytes, ZP_XFER_N);
    g_assert_cmpint(f->stages, ==, u->stages);
    assert_same_breakdowns(f, u);
    g_assert_cmpint(f->mode, ==, u->mode);
    g_assert_cmpstr(f->cost_model, ==, u->cost_model);
    g_assert_cmpstr(f->collective_model, ==, u->collective_model);
    g_assert_cmpint(f->world, ==, u->world);
    g_assert_cmpint(f->ranks_simulated, ==, u->ranks_simulated);
    g_assert_cmpint(f->units_simulated, ==, u->units_simulated);
    g_assert_cmpint(f->stopped, ==, u->stopped);
    g_assert_cmpint(f->report_rank, ==, u->report_rank);
    g_assert_cmpuint(f->op_events, ==, u->op_events);
    g_assert_cmpuint(f->heap_events, ==, u->heap_events);
    g_assert_cmpuint(f->n_ops, ==, u->n_ops);
    for (int r = 0; r < u->ranks_simulated; r++) {
        g_assert_cmpuint(f->first_rank[r], ==, u->first_rank[r]);
        g_assert_cmpuint(f->rank_count[r], ==, u->rank_count[r]);
    }
}

/* The allocator replay of the long schedule from the short one and the periods its run
 * inserted: FALSE where it refuses (a period's frees do not pair as steady periods do,
 * zp_alloc_ops.c; its caller then replays the long schedule), else equal to the long
 * schedule's own, unbounded and against a capacity below its reserved peak (the
 * out-of-memory replay, where one comes: reusing freed blocks can keep 90% enough). */
static gboolean alloc_extends_as_long(const ZpSchedule *s, const ZpSchedule *l,
                                      const SimResult *ext, gboolean *oom_at_capacity)
{
    g_assert_cmpuint(ext->n_inserts, >, 0);
    ZpAllocStats got;
    if (!zp_alloc_replay_schedule_extended(s, 0, ext->inserts, ext->n_inserts, &got))
        return FALSE;
    const ZpAllocStats want = zp_alloc_replay_schedule(l, 0);
    assert_same_alloc_events(&got, &want);
    const double capacity = 0.9 * want.peak_reserved_bytes;
    g_assert_true(
        zp_alloc_replay_schedule_extended(s, capacity, ext->inserts, ext->n_inserts, &got));
    const ZpAllocStats oom = zp_alloc_replay_schedule(l, capacity);
    *oom_at_capacity = oom.oom;
    assert_same_alloc_events(&got, &oom);
    return TRUE;
}

/* The same where the replay must extend, and the capacity is out of memory. */
static void assert_alloc_extends(const ZpSchedule *s, const ZpSchedule *l, const SimResult *ext)
{
    gboolean oom;
    g_assert_true(alloc_extends_as_long(s, l, ext, &oom));
    g_assert_true(oom);
}

/* The short schedule, its missing micro-steps counted as virtual periods, equals the long
 * one folded and stepped, in every field; without them counted it is another step (shorter,
 * fewer events): the virtual periods are what make it the long one. GPipe counts none (its
 * forward phase, which does not fold, would be short too). */
static void test_extend_equal(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        const ExtCase *c = &cases[k];
        ZpSchedule *s = ext_schedule(c, c->short_accum), *l = ext_schedule(c, c->accum);
        const uint32_t missing = (uint32_t)(c->accum - c->short_accum);
        SimResult *ext = run_ext(s, (SimOptions){.extend_micro_steps = missing});
        SimResult *plain = run_ext(s, (SimOptions){0});
        SimResult *full = run_ext(l, (SimOptions){0});
        SimResult *stepped = run_ext(l, (SimOptions){.no_fold = TRUE});
        g_test_message("%s: %u of %u micro-steps virtual; %s", c->what,
                       ext->extended_micro_steps, missing, ext->fold_note);
        if (c->schedule == ZP_PIPE_GPIPE) {
            /* none counted: the short schedule's run, its sums added from the figures kept
             * (sim_sums.h) with nothing inserted */
            g_assert_cmpuint(ext->extended_micro_steps, ==, 0);
            assert_same_all(ext, plain);
        } else {
            g_assert_cmpuint(ext->extended_micro_steps, ==, missing);
            assert_same_all(ext, full);
            assert_same_all(ext, stepped);
            assert_alloc_extends(s, l, ext);
            g_assert_cmpuint(ext->op_events, >, plain->op_events);
            g_assert_cmpfloat(ext->step_time_s, >, plain->step_time_s);
        }
        sim_result_free(ext);
        sim_result_free(plain);
        sim_result_free(full);
        sim_result_free(stepped);
        zp_sched_free(s);
        zp_sched_free(l);
    }
}

/* Whether op w of the whole list is op m of the listed one, g copies on (run x; NULL, g 0:
 * listed), its buffer the one m's stands for (by[]: the whole list's buffer -> the listed
 * one's, held[]: the listed one's -> the whole one's it holds now, -1 none): an alloc takes a
 * buffer no other holds (a run's copies take theirs again only once freed), a free frees the
 * one its alloc took. */
static void assert_same_alloc_op(const ZpAllocOp *w, const ZpAllocOp *m, const ZpAllocRun *x,
                                 uint64_t g, GHashTable *by, GHashTable *held)
{
    g_assert_true(w->op == m->op);
    g_assert_cmpuint(w->at, ==, m->at + (x ? g * x->at_step : 0));
    g_assert_cmpint(w->micro, ==,
                    m->micro < 0 || !x ? m->micro : m->micro + (int32_t)g * x->micro_step);
    const int32_t b = x ? zp_alloc_run_buffer(m->buffer, g, x->buffer_step, x->first_buffer,
                                              x->buffer_window)
                        : m->buffer;
    if (w->buffer < 0) {
        g_assert_cmpint(b, ==, w->buffer);
        return;
    }
    gpointer key = GINT_TO_POINTER(w->buffer + 1), listed = GINT_TO_POINTER(b + 1);
    if (w->op->kind == ZP_OP_ALLOC) {
        const gpointer holder = g_hash_table_lookup(held, listed);
        g_assert_true(holder == NULL || holder == key);
        g_hash_table_insert(by, key, listed);
        g_hash_table_insert(held, listed, key);
    } else {
        g_assert_true(g_hash_table_lookup(by, key) == listed);
        const gpointer holder = g_hash_table_lookup(held, listed);
        g_assert_true(holder == NULL || holder == key);
        g_hash_table_remove(held, listed);
    }
}

/* The longer schedule's allocs and frees with runs of copies left out (ZpAllocRun) are, the
 * runs' copies put back (each its run's last listed copy a copy on: places, micro-steps and
 * buffers), the whole list op for op, buffers renamed one to one while held; and they do
 * leave copies out, fewer listed than half where a pipeline's 1F1B stages insert most of
 * their micro-steps, and take buffers again where every alloc of a period is freed
 * (zp_alloc_ops.c). */
/* Case c's short schedule extended by the simulator's fold (*ext), and the allocator's lists
 * of its longer schedule: every copy (*all), and the copies listed with runs left out. */
typedef struct {
    ZpSchedule *s;
    SimResult *ext;
    GArray *runs, *all, *listed;
} AllocLists;

static AllocLists alloc_lists(const ExtCase *c)
{
    AllocLists l = {.s = ext_schedule(c, c->short_accum)};
    l.ext = run_ext(l.s, (SimOptions){.extend_micro_steps = (uint32_t)(c->accum - c->short_accum)});
    l.runs = g_array_new(FALSE, FALSE, sizeof(ZpAllocRun));
    l.all = zp_alloc_ops_extended(l.s, l.ext->inserts, l.ext->n_inserts, NULL);
    l.listed = zp_alloc_ops_extended(l.s, l.ext->inserts, l.ext->n_inserts, l.runs);
    g_assert_nonnull(l.all);
    g_assert_nonnull(l.listed);
    return l;
}

static void alloc_lists_free(AllocLists *l)
{
    g_array_unref(l->all);
    g_array_unref(l->listed);
    g_array_unref(l->runs);
    sim_result_free(l->ext);
    zp_sched_free(l->s);
}

static void test_extend_alloc_runs(void)
{
    for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
        const ExtCase *c = &cases[k];
        if (c->schedule == ZP_PIPE_GPIPE)
            continue;
        AllocLists l = alloc_lists(c);
        GArray *runs = l.runs, *all = l.all, *listed = l.listed;
        GHashTable *by = g_hash_table_new(g_direct_hash, g_direct_equal);
        GHashTable *held = g_hash_table_new(g_direct_hash, g_direct_equal);
        guint j = 0, r = 0, windows = 0;
        int32_t most_all = -1, most_listed = -1;
        for (guint i = 0; i <= listed->len; i++) {
            for (; r < runs->len && g_array_index(runs, ZpAllocRun, r).after == i; r++) {
                const ZpAllocRun *x = &g_array_index(runs, ZpAllocRun, r);
                windows += x->buffer_window > 0;
                for (uint64_t g = 1; g <= x->copies; g++)
                    for (uint32_t o = 0; o < x->len; o++, j++)
                        assert_same_alloc_op(&g_array_index(all, ZpAllocOp, j),
                                             &g_array_index(listed, ZpAllocOp, x->first + o),
                                             x, g, by, held);
            }
            if (i == listed->len)
                break;
            assert_same_alloc_op(&g_array_index(all, ZpAllocOp, j++),
                                 &g_array_index(listed, ZpAllocOp, i), NULL, 0, by, held);
        }
        for (guint i = 0; i < all->len; i++)
            most_all = MAX(most_all, g_array_index(all, ZpAllocOp, i).buffer);
        for (guint i = 0; i < listed->len; i++)
            most_listed = MAX(most_listed, g_array_index(listed, ZpAllocOp, i).buffer);
        g_test_message("%s: %u of %u allocs and frees listed, %u runs (%u taking buffers "
                       "again), buffers to %d of %d",
                       c->what, listed->len, all->len, runs->len, windows, most_listed,
                       most_all);
        g_assert_cmpuint(r, ==, runs->len);
        g_assert_cmpuint(j, ==, all->len);
        if (c->pp >= 8)
            g_assert_cmpuint(listed->len, <, all->len / 2);
        if (c->pp == 1) /* accumulation: every micro-step frees what it takes */
            g_assert_cmpuint(windows, ==, runs->len);
        g_hash_table_destroy(by);
        g_hash_table_destroy(held);
        alloc_lists_free(&l);
    }
}

/* The allocator's sequence (zp_alloc_seq_build) leaves a run's copies out only where each
 * repeats the last listed copy: the runs zp_alloc_ops_extended makes pass and the sequence
 * counts every copy's events; a run whose copies would step the micro-steps by another
 * count, or whose copy is longer than what is listed before it, is refused (the caller then
 * lists every copy: zp_alloc_replay_schedule_extended). No plan makes such a run, so it is
 * made here by hand. */
static gboolean seq_refuses(const ZpSchedule *s, GArray *ops, const GArray *runs, uint64_t *n_ev)
{
    ZpAllocSeq q = {.s = s, .ops = ops, .op_runs = runs};
    zp_alloc_seq_build(&q);
    const gboolean refused = q.runs_refused;
    *n_ev = q.n_ev;
    zp_alloc_seq_clear(&q);
    return refused;
}

static void test_extend_alloc_runs_refused(void)
{
    AllocLists l = alloc_lists(&cases[3]); /* pp 16: every stage's insert leaves copies out */
    ZpSchedule *s = l.s;
    GArray *runs = l.runs, *listed = l.listed;
    g_assert_cmpuint(runs->len, >, 0);
    uint64_t n_ev = 0;
    g_assert_false(seq_refuses(s, listed, runs, &n_ev));
    g_assert_cmpuint(n_ev, ==, l.all->len);
    ZpAllocRun *first = &g_array_index(runs, ZpAllocRun, 0);
    const ZpAllocRun kept = *first;
    first->micro_step += 1; /* copies a micro-step further apart than the listed ones */
    g_assert_true(seq_refuses(s, listed, runs, &n_ev));
    *first = kept;
    first->len = first->after + 1; /* a copy longer than every op listed before it */
    g_assert_true(seq_refuses(s, listed, runs, &n_ev));
    *first = kept;
    g_assert_false(seq_refuses(s, listed, runs, &n_ev));
    alloc_lists_free(&l);
}

/* A slow rank among its stage's peers (rank classes) refuses the fold: no virtual periods
 * counted, so the caller runs the long schedule (with extend_or_stop the short one is not
 * run at all). So does a kept timeline. */
static void test_extend_refused(void)
{
    const ExtCase *c = &cases[1]; /* pp 4, tp 2, dp 2 */
    ZpSchedule *s = ext_schedule(c, c->short_accum);
    const uint32_t missing = (uint32_t)(c->accum - c->short_accum);
    const SimSlow slow = {.index = 5, .factor = 1.5};
    SimResult *r = run_ext(s, (SimOptions){.slow_ranks = &slow, .n_slow_ranks = 1,
                                       .extend_micro_steps = missing});
    g_assert_cmpuint(r->extended_micro_steps, ==, 0);
    sim_result_free(r);
    /* With extend_or_stop, the run stops before its first event: the fold was refused. */
    r = run_ext(s, (SimOptions){.slow_ranks = &slow, .n_slow_ranks = 1,
                                .extend_micro_steps = missing, .extend_or_stop = TRUE});
    g_assert_true(r->stopped);
    g_assert_cmpuint(r->extended_micro_steps, ==, 0);
    g_assert_cmpuint(r->op_events, ==, 0);
    sim_result_free(r);
    r = run_ext(s, (SimOptions){.record_timeline = TRUE, .extend_micro_steps = missing});
    g_assert_cmpuint(r->fold_jumps, >, 0);
    g_assert_cmpuint(r->extended_micro_steps, ==, 0);
    sim_result_free(r);
    zp_sched_free(s);
}

/* extend_or_stop. 1F1B pp 2 short by 64 of 96 micro-steps: one jump counts all 64, with
 * extend_or_stop or without. With a stop time at 0.6 of the long step the jump is trimmed to
 * end before it (the search's early stop), so it counts fewer: without extend_or_stop the run
 * goes on and stops at that time, 0 < counted < 64; with it the run goes on too, on steady
 * periods alone, and its stop is the long schedule's, at the same time: it says so by
 * counting all 64 (sim_fold_stopped_exact), and cli_rank.c builds no long schedule. */
static void test_extend_or_stop(void)
{
    const ExtCase c = {"1f1b pp 2 x 96", 0, 1, 1, 2, 1, ZP_PIPE_1F1B, FALSE, 96, 32, 1};
    ZpSchedule *s = ext_schedule(&c, c.short_accum);
    SimResult *r = run_ext(s, (SimOptions){.extend_micro_steps = 64});
    SimResult *or_stop = run_ext(s, (SimOptions){.extend_micro_steps = 64, .extend_or_stop = TRUE});
    g_assert_false(r->stopped || or_stop->stopped);
    g_assert_cmpuint(r->extended_micro_steps, ==, 64);
    g_assert_cmpuint(or_stop->extended_micro_steps, ==, 64);
    g_assert_cmpfloat(or_stop->step_time_s, ==, r->step_time_s);
    const double stop_s = 0.6 * r->step_time_s;
    sim_result_free(r);
    sim_result_free(or_stop);
    r = run_ext(s, (SimOptions){.extend_micro_steps = 64, .stop_after_s = stop_s});
    or_stop = run_ext(s, (SimOptions){.extend_micro_steps = 64, .stop_after_s = stop_s,
                                      .extend_or_stop = TRUE});
    g_test_message("stopped at %.3f s: %u of 64 counted; with extend_or_stop %u, %s", stop_s,
                   r->extended_micro_steps, or_stop->extended_micro_steps, or_stop->fold_note);
    g_assert_true(r->stopped);
    g_assert_cmpuint(r->extended_micro_steps, >, 0);
    g_assert_cmpuint(r->extended_micro_steps, <, 64);
    g_assert_true(or_stop->stopped);
    g_assert_cmpuint(or_stop->extended_micro_steps, ==, 64);
    ZpSchedule *l = ext_schedule(&c, c.accum);
    SimResult *long_run = run_ext(l, (SimOptions){.stop_after_s = stop_s});
    g_assert_true(long_run->stopped);
    g_assert_cmpfloat(or_stop->step_time_s, ==, long_run->step_time_s);
    g_assert_cmpfloat(or_stop->step_time_s, >, stop_s);
    sim_result_free(long_run);
    zp_sched_free(l);
    sim_result_free(r);
    sim_result_free(or_stop);
    zp_sched_free(s);
    /* 1F1B pp 8 over 10 micro-steps: too few steady ones to prove a repeat, so no jump (12
     * prove one since a jump of virtual periods alone needs no room for physical ones).
     * Without extend_or_stop the run goes to its end, none counted; with it, it stops once
     * the first stage's last micro-step begins (no jump can come after). */
    const ExtCase few = {"1f1b pp 8 x 10", 0, 1, 1, 8, 1, ZP_PIPE_1F1B, FALSE, 18, 10, 1};
    s = ext_schedule(&few, few.short_accum);
    r = run_ext(s, (SimOptions){.extend_micro_steps = 8});
    or_stop = run_ext(s, (SimOptions){.extend_micro_steps = 8, .extend_or_stop = TRUE});
    g_assert_cmpuint(r->fold_jumps, ==, 0);
    g_assert_false(r->stopped);
    g_assert_cmpuint(r->extended_micro_steps, ==, 0);
    g_assert_true(or_stop->stopped);
    g_assert_cmpfloat(or_stop->step_time_s, <, r->step_time_s);
    g_assert_nonnull(strstr(or_stop->fold_note, "before the last micro-step"));
    sim_result_free(r);
    sim_result_free(or_stop);
    zp_sched_free(s);
}

/* Short schedules whose first proof after the fill counts every virtual period, each equal
 * to the long schedule's run, stepped, in every field: a jump of virtual periods alone needs
 * the ops to repeat one period past the window, not the three a physical jump needs (1F1B
 * pp 8 from 12 of 20 micro-steps, interleaved pp 8 v 2 from 5 of 8 groups: none counted
 * before); an interleaved run counts them only by its group's shift, and waits for it (a
 * shift inside a group repeats one chunk's micro-step, not a micro-step of the long schedule:
 * pp 4 v 4 from 6 of 8 groups counted 8 so, and its step came out shorter than the long
 * schedule's). */
static void test_extend_short(void)
{
    static const ExtCase shorts[] = {
        {"1f1b pp 8 x 20 from 12", 0, 1, 1, 8, 1, ZP_PIPE_1F1B, FALSE, 20, 12, 1},
        {"interleaved pp 8 v 2 x 64 from 40", 0, 2, 1, 8, 2, ZP_PIPE_INTERLEAVED, FALSE, 64, 40, 8},
        {"interleaved pp 4 v 4 x 32 from 24", 0, 2, 1, 4, 4, ZP_PIPE_INTERLEAVED, FALSE, 32, 24, 4},
    };
    for (size_t k = 0; k < G_N_ELEMENTS(shorts); k++) {
        const ExtCase *c = &shorts[k];
        ZpSchedule *s = ext_schedule(c, c->short_accum), *l = ext_schedule(c, c->accum);
        const uint32_t missing = (uint32_t)(c->accum - c->short_accum);
        SimResult *ext = run_ext(s, (SimOptions){.extend_micro_steps = missing,
                                                 .extend_or_stop = TRUE});
        SimResult *full = run_ext(l, (SimOptions){.no_fold = TRUE});
        g_test_message("%s: %u of %u micro-steps virtual; %s", c->what,
                       ext->extended_micro_steps, missing, ext->fold_note);
        g_assert_cmpuint(ext->extended_micro_steps, ==, missing);
        assert_same_all(ext, full);
        sim_result_free(ext);
        sim_result_free(full);
        zp_sched_free(s);
        zp_sched_free(l);
    }
}

/* The search's evaluation (cli_rank_simulate) of a 1F1B pp 8 plan of 48 micro-steps builds
 * 16 (pp + 8, short by 32) and counts 32 virtual: its result and allocator figures are the
 * full schedule's, field for field (what plan's report prints from the kept run). */
/* The search's evaluation of plan p (cli_rank_simulate) counts virtual_steps micro-steps
 * virtual, and its result and allocator figures are those of the full schedule's own run and
 * replay, field for field (with the events the replay folded where events). The full run's
 * fold and the replay's out-of-memory are handed back for the caller's own checks. */
static void assert_rank_is_full_on(const ZpHw *hw, const ZpModel *m, const ZpPlan *p,
                                   uint32_t virtual_steps, gboolean events,
                                   uint32_t *full_folded, gboolean *oom)
{
    ZpAllocStats alloc;
    GError *error = NULL;
    SimResult *ranked = cli_rank_simulate(m, hw, p, 0, &alloc, &error);
    g_assert_no_error(error);
    ZpSchedule *l = zp_sched_build(m, p, &error);
    g_assert_no_error(error);
    SimResult *full = sim_engine_run(l, hw, &(SimOptions){0}, &error);
    g_assert_no_error(error);
    const ZpAllocStats want =
        zp_alloc_replay_schedule(l, hw->gpu_memory_bytes - hw->runtime_reserve_bytes);
    g_test_message("%u micro-steps virtual, %.6f s; full run %s", ranked->extended_micro_steps,
                   ranked->step_time_s, full->fold_note);
    g_assert_cmpuint(ranked->extended_micro_steps, ==, virtual_steps);
    g_assert_cmpuint(full->extended_micro_steps, ==, 0);
    assert_same_all(ranked, full);
    if (events)
        assert_same_alloc_events(&alloc, &want);
    else
        assert_same_alloc(&alloc, &want);
    *full_folded = full->fold_micro_steps;
    *oom = want.oom;
    sim_result_free(ranked);
    sim_result_free(full);
    zp_sched_free(l);
}

static void assert_rank_is_full(const ZpModel *m, const ZpPlan *p, uint32_t virtual_steps,
                                gboolean events, uint32_t *full_folded, gboolean *oom)
{
    assert_rank_is_full_on(&a100, m, p, virtual_steps, events, full_folded, oom);
}

static void test_extend_rank(void)
{
    const ExtCase c = {"1f1b pp 8 x 48", 0, 1, 1, 8, 1, ZP_PIPE_1F1B, FALSE, 48, 40, 1};
    ZpSchedule *l = ext_schedule(&c, c.accum);
    const ZpModel m = sim_gpt_model(64, 32000);
    uint32_t folded;
    gboolean oom;
    assert_rank_is_full(&m, &l->plan, 32, TRUE, &folded, &oom);
    zp_sched_free(l);
}

/* Megatron's 1T shape (pp 64 x tp 8 x dp 6, 512 micro-batches, issue 40's row), with
 * checkpointing and without (175 GB live: the allocator's out-of-memory replay too): the
 * search's evaluation builds 72 micro-steps and counts 440 virtual; its result and allocator
 * figures are the full schedule's, field for field. */
static void test_extend_megatron_1t(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt-1t", &m, &error));
    for (int ckpt = 1; ckpt >= 0; ckpt--) {
        ZpPlan p;
        zp_plan_defaults(&p, 0, 6, 8);
        p.impl = ZP_IMPL_MEGATRON;
        p.pipe.stages = 64;
        p.grad_accum = 512;
        p.checkpoint = ckpt;
        p.gpus_per_node = a100.gpus_per_node;
        uint32_t folded;
        gboolean oom;
        assert_rank_is_full(&m, &p, 440, TRUE, &folded, &oom);
        g_assert_cmpint(oom, ==, !ckpt);
    }
}

/* 1F1B whose tensor-parallel group spans nodes folds by pipeline round trips (sim_fold.c
 * MAX_SHIFTS): gpt3-175b pp 4 x tp 16 x dp 2 over 64 micro-batches, through the search's
 * evaluation, builds 20 micro-steps (5 pp) and counts 44 virtual (a multiple of pp), its
 * SimResult and allocator figures equal to the full schedule's. With 2 pp + 24 kept and k a
 * multiple of 4 (32 virtual) its short run never jumped, and it ran the full schedule; with
 * 9 pp kept (three snapshots a round trip apart, sim_fold.c) it counted 28, with 7 pp 36. */
static void test_extend_round_trip(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt3-175b", &m, &error));
    ZpPlan p;
    zp_plan_defaults(&p, 1, 2, 16);
    p.pipe.stages = 4;
    p.grad_accum = 64;
    p.gpus_per_node = a100.gpus_per_node;
    g_assert_cmpint(p.mp, >, a100.gpus_per_node);
    uint32_t folded;
    gboolean oom;
    assert_rank_is_full(&m, &p, 44, FALSE, &folded, &oom);
    g_assert_cmpuint(folded % 4, ==, 0); /* whole round trips */
}

/* DeepSpeed's stage 1 without a pipeline, as plan --3d gpt3-175b/1024 evaluates it (tp 8 x
 * dp 128, 24 micro-batches), with one ipg buffer and overlap_comm's two: the search's
 * evaluation builds 8 micro-steps and counts 16 virtual, its result and allocator figures
 * the full schedule's, field for field. Before the fold kept the last micro-step's reduction,
 * waiting on micro-step 0's ipg buffer, out of its window (sim_fold.c's far ops) such a run
 * never folded: the short run counted none, and the full schedule ran after it. */
static void test_extend_held_buckets(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt3-175b", &m, &error));
    for (int overlap = 0; overlap < 2; overlap++) {
        ZpPlan p;
        zp_plan_defaults(&p, 1, 128, 8);
        p.grad_accum = 24;
        p.zero.overlap_comm = overlap;
        p.gpus_per_node = a100.gpus_per_node;
        uint32_t folded;
        gboolean oom;
        assert_rank_is_full(&m, &p, 16, TRUE, &folded, &oom);
        g_assert_cmpuint(folded, >, 0); /* the full schedule folds too */
    }
}

/* Hugging Face's DeepSpeed integration sets reduce_bucket_size "auto", hidden x hidden (26.2 M
 * for gpt-13b; zp_dsconfig_hf_auto): the step's optimizer then waits on some 320 reductions,
 * over 255 dependencies (sim_fold.c's wide ops), and the fold refused every such plan: the
 * search's evaluation ran the short schedule, counted nothing, and ran the full one after it.
 * gpt-13b on 64 GPUs at stage 2 (16 and 64 micro-batches) and stage 1 (overlap_comm's two
 * buffers, 24): the evaluation builds 8 micro-steps and counts the rest virtual, its result
 * and allocator figures the full schedule's, field for field, and the full schedule folds
 * too. */
static void test_extend_wide_ops(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt-13b", &m, &error));
    static const struct {
        int stage, accum;
        gboolean overlap;
        uint32_t virtual_steps;
    } plans[] = {{2, 16, FALSE, 8}, {2, 64, FALSE, 56}, {1, 24, TRUE, 16}};
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
        ZpPlan p;
        zp_plan_defaults(&p, plans[k].stage, 64, 1);
        p.grad_accum = plans[k].accum;
        p.zero.overlap_comm = plans[k].overlap;
        p.zero.reduce_bucket_size = (double)m.hidden * m.hidden;
        p.gpus_per_node = a100.gpus_per_node;
        ZpSchedule *l = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        const uint32_t widest = widest_op(l);
        g_test_message("stage %d x %d: an op of %u dependencies", plans[k].stage, plans[k].accum,
                       widest);
        g_assert_cmpuint(widest, >, 255);
        zp_sched_free(l);
        uint32_t folded;
        gboolean oom;
        assert_rank_is_full(&m, &p, plans[k].virtual_steps, TRUE, &folded, &oom);
        g_assert_cmpuint(folded, >, 0);
    }
}

/* A cost averaged over the step's micro-steps is the long step's in the short schedule too.
 * Megatron-LM without an fp32 main_grad adds each fresh 16-bit gradient into .grad on every
 * micro-step after the first, which its kernel inventory charges every micro-step's backward
 * (grad_accum - 1) / grad_accum of (zp_inventory_megatron.c grad_accumulate). A schedule built
 * 24 micro-steps short of 32 charged 7/8 of it, not 31/32, and the 24 virtual micro-steps
 * counted those cheaper backwards: simulate --json gave 3.4224 s where --no-fold gave
 * 3.4445 s (gpt-13b, tp 4, 32 micro-batches of 2 on H100s, found by a random comparison of the
 * two). zp_sched_build_short keeps the step's count (ZpPlan.step_grad_accum). On a profile
 * with kernel rates, as the inventory prices only there: without a pipeline, and over 4
 * stages. */
static void test_extend_averaged_costs(void)
{
    ZpHw h100;
    GError *error = NULL;
    g_assert_true(zp_hw_load("dgx-h100", &h100, &error));
    g_assert_true(h100.kernel_rates.present);
    static const struct {
        const char *model;
        int dp, mp, pp, micro_batch;
        uint32_t virtual_steps;
    } plans[] = {{"gpt-13b", 1, 4, 1, 2, 24}, {"gpt-60b", 8, 4, 4, 1, 20}};
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
        ZpModel m;
        g_assert_true(zp_model_load(plans[k].model, &m, &error));
        ZpPlan p;
        zp_plan_defaults(&p, 1, plans[k].dp, plans[k].mp);
        p.impl = ZP_IMPL_MEGATRON;
        p.no_main_grad = TRUE;
        p.micro_batch = plans[k].micro_batch;
        p.grad_accum = 32;
        p.pipe.stages = plans[k].pp;
        p.gpus_per_node = h100.gpus_per_node;
        uint32_t folded;
        gboolean oom;
        assert_rank_is_full_on(&h100, &m, &p, plans[k].virtual_steps, TRUE, &folded, &oom);
        g_assert_false(oom);
        /* The schedule built short costs its micro-steps as the step's, not its own count. */
        ZpSchedule *s = zp_sched_build_short(&m, &p, 8, &error);
        g_assert_no_error(error);
        g_assert_cmpint(s->plan.grad_accum, ==, 24);
        g_assert_cmpint(zp_plan_step_grad_accum(&s->plan), ==, 32);
        zp_sched_free(s);
    }
    /* Built short by none, or by all of its micro-steps: refused, naming grad-accum. */
    ZpModel m;
    g_assert_true(zp_model_load("gpt-13b", &m, &error));
    ZpPlan p;
    zp_plan_defaults(&p, 1, 1, 4);
    p.grad_accum = 8;
    for (int shorter = 0; shorter <= 8; shorter += 8) {
        g_assert_null(zp_sched_build_short(&m, &p, shorter, &error));
        g_assert_nonnull(strstr(error->message, "grad-accum"));
        g_clear_error(&error);
    }
}

/* The short schedule s (l built `shorter` micro-steps longer) run as the search runs it, with
 * extend_or_stop and a stop time stop_s: where it says it stopped as the long schedule does
 * (every virtual micro-step counted: sim_fold_stopped_exact, or all counted before the stop),
 * its step time is the long schedule's stopped without a fold, bit for bit. 1 where it says
 * so. */
static int stops_as_long(const ZpSchedule *s, const ZpSchedule *l, uint32_t shorter,
                         double stop_s)
{
    SimResult *r = run_ext(s, (SimOptions){.extend_micro_steps = shorter,
                                           .extend_or_stop = TRUE, .stop_after_s = stop_s});
    const gboolean claimed = r->extended_micro_steps == shorter;
    if (claimed) {
        g_assert_true(r->stopped);
        SimResult *stepped = run_ext(l, (SimOptions){.no_fold = TRUE, .stop_after_s = stop_s});
        g_assert_true(stepped->stopped);
        g_assert_cmpfloat(r->step_time_s, ==, stepped->step_time_s);
        sim_result_free(stepped);
    }
    sim_result_free(r);
    return claimed;
}

/* Whatever the shape, an extension the fold counts is exact: random plans (a fixed seed, so a
 * failure names its trial) over pp 1-8, 1F1B, interleaved and GPipe, ZeRO stages 0-3 (0-1
 * with a pipeline), tensor parallelism inside and across nodes, checkpointing, DeepSpeed and
 * Megatron, each built short by a random count of micro-steps: where the short run counts
 * them all as virtual periods, its result equals the long schedule stepped without a fold in
 * every field, and its allocator replay, where that extends too, the long one's. Where the
 * fold cannot prove them it says so (fewer counted), and where the replay cannot it refuses:
 * the caller then runs or replays the long schedule, so the search's keep sizes
 * (cli_rank_short_by) make an evaluation faster or slower, never different. */
static void test_extend_random(void)
{
    /* ZP_EXTEND_SEED and ZP_EXTEND_TRIALS run other trials (a stress run): the counts below
     * that say the test is not vacuous hold for its own seed. */
    const char *seed_env = g_getenv("ZP_EXTEND_SEED"), *trials_env = g_getenv("ZP_EXTEND_TRIALS");
    const guint32 seed = seed_env ? (guint32)g_ascii_strtoull(seed_env, NULL, 10) : 40;
    const int n_trials = trials_env ? (int)g_ascii_strtoll(trials_env, NULL, 10) : 120;
    GRand *rand = g_rand_new_with_seed(seed);
    /* The reduction buckets from a stream of their own (the other draws' stream is the one it
     * was): DeepSpeed's default (5e8), or, in a third of the trials,
     * Hugging Face's "auto" (hidden x hidden) on DeepSpeed over 40 layers, 1 or 2 stages and
     * 2 or 4 data-parallel ranks, where the optimizer waits on over 255 reductions (sim_fold.c's
     * wide ops). */
    GRand *buckets = g_rand_new_with_seed(seed ^ 0x5bd1e995u);
    /* ZeRO-Offload from a stream of its own too: on DeepSpeed at stages 1-3, in a quarter of
     * those trials, the optimizer to the CPU or NVMe (and at stage 3 the parameters with it in
     * half), where the CPU step waits on every micro-step's copies (sim_fold.c's sinks). */
    GRand *offloads = g_rand_new_with_seed(seed ^ 0x27d4eb2fu);
    /* The search's stop time, as a share of the step, from a stream of its own too. */
    GRand *stops = g_rand_new_with_seed(seed ^ 0x165667b1u);
    static const int pps[] = {1, 2, 3, 4, 6, 8}, mps[] = {1, 2, 16}, layers[] = {8, 12, 16, 24};
    int proven = 0, trials = 0, replayed = 0, wide = 0, wide_proven = 0, offloaded = 0,
        offloaded_proven = 0, stops_exact = 0;
    for (int trial = 0; trial < n_trials; trial++) {
        const gboolean small_buckets = g_rand_int_range(buckets, 0, 3) == 0;
        const int pp_drawn = pps[g_rand_int_range(rand, 0, G_N_ELEMENTS(pps))];
        const int pp = small_buckets ? g_rand_int_range(buckets, 1, 3) : pp_drawn;
        const int mp = mps[g_rand_int_range(rand, 0, G_N_ELEMENTS(mps))];
        const int L_drawn = layers[g_rand_int_range(rand, 0, G_N_ELEMENTS(layers))];
        const int L = small_buckets ? 40 : L_drawn;
        const int dp_drawn = 1 << g_rand_int_range(rand, 0, 3);
        const int dp = small_buckets ? 2 << g_rand_int_range(buckets, 0, 2) : dp_drawn;
        ZpPlan p;
        zp_plan_defaults(&p, g_rand_int_range(rand, 0, pp > 1 ? 2 : 4), dp, mp);
        p.impl = g_rand_boolean(rand) && !small_buckets ? ZP_IMPL_MEGATRON : ZP_IMPL_DEEPSPEED;
        p.pipe.stages = pp;
        const int pick = g_rand_int_range(rand, 0, 8);
        p.pipe.schedule = pp == 1 || pick < 5 ? ZP_PIPE_1F1B
                          : pick < 7          ? ZP_PIPE_INTERLEAVED
                                              : ZP_PIPE_GPIPE;
        p.pipe.virtual_stages = p.pipe.schedule == ZP_PIPE_INTERLEAVED ? 2 : 1;
        if (p.pipe.schedule == ZP_PIPE_INTERLEAVED && L % (2 * pp) != 0)
            p.pipe.schedule = ZP_PIPE_1F1B, p.pipe.virtual_stages = 1;
        p.checkpoint = g_rand_boolean(rand);
        p.gpus_per_node = a100.gpus_per_node;
        if (small_buckets)
            p.zero.reduce_bucket_size = 1024.0 * 1024.0; /* sim_gpt_model's hidden, squared */
        const gboolean offload = g_rand_int_range(offloads, 0, 4) == 0 &&
                                 p.impl == ZP_IMPL_DEEPSPEED && p.zero.stage >= 1;
        const ZpOffloadDevice device = g_rand_boolean(offloads) ? ZP_OFFLOAD_CPU : ZP_OFFLOAD_NVME;
        const gboolean with_params = g_rand_boolean(offloads);
        if (offload) {
            p.zero.offload_optimizer.device = device;
            if (p.zero.stage == 3 && with_params)
                p.zero.offload_param.device = device;
        }
        /* Interleaving runs micro-batches in groups of pp: whole groups. */
        const int unit = p.pipe.schedule == ZP_PIPE_INTERLEAVED ? pp : 1;
        const int m = unit * g_rand_int_range(rand, (pp + 2 + unit - 1) / unit, (4 * pp + 40) / unit);
        const int shorter = unit * g_rand_int_range(rand, 1, m / unit);
        const ZpModel model = sim_gpt_model(L, 32000);
        p.grad_accum = m;
        GError *error = NULL;
        ZpSchedule *l = zp_sched_build(&model, &p, &error);
        ZpSchedule *s = l ? zp_sched_build_short(&model, &p, shorter, &error) : NULL;
        if (!s) { /* a plan the builder refuses (its own tests say which): not a trial */
            g_test_message("trial %d: %s", trial, error->message);
            g_clear_error(&error);
            zp_sched_free(l);
            continue;
        }
        trials++;
        offloaded += offload && p.zero.stage >= 2;
        uint32_t widest = 0;
        for (guint i = 0; i < l->ops->len; i++)
            widest = MAX(widest, zp_sched_op(l, i)->n_deps);
        wide += widest > 255;
        SimResult *ext = run_ext(s, (SimOptions){.extend_micro_steps = (uint32_t)shorter});
        g_test_message("trial %d: pp %d v %d (%s) tp %d dp %d stage %d%s, %d layers, %d "
                       "micro-steps, %d virtual, widest op %u: %u counted; %s",
                       trial, pp, p.pipe.virtual_stages, p.pipe.schedule == ZP_PIPE_GPIPE ? "gpipe" : "",
                       mp, dp, p.zero.stage, offload ? " offloaded" : "", L, m, shorter, widest,
                       ext->extended_micro_steps, ext->fold_note);
        g_assert_cmpuint(ext->extended_micro_steps, <=, (uint32_t)shorter);
        /* Stopped by the search at a share of the step: every trial, proven or not. */
        SimResult *whole_step = run_ext(l, (SimOptions){.no_fold = TRUE});
        stops_exact += stops_as_long(s, l, (uint32_t)shorter,
                                     g_rand_double_range(stops, 0.2, 0.98) *
                                         whole_step->step_time_s);
        sim_result_free(whole_step);
        if (ext->extended_micro_steps == (uint32_t)shorter) {
            SimResult *stepped = run_ext(l, (SimOptions){.no_fold = TRUE});
            assert_same_all(ext, stepped);
            gboolean oom;
            replayed += alloc_extends_as_long(s, l, ext, &oom);
            sim_result_free(stepped);
            proven++;
            wide_proven += widest > 255;
            offloaded_proven += offload && p.zero.stage >= 2;
        }
        sim_result_free(ext);
        zp_sched_free(s);
        zp_sched_free(l);
    }
    g_rand_free(rand);
    g_rand_free(buckets);
    g_rand_free(offloads);
    g_rand_free(stops);
    g_test_message("%d of %d trials counted every virtual micro-step, the allocator replay "
                   "extended in %d of them; %d of %d with an op of over 255 dependencies; %d "
                   "of the %d offloaded at stages 2-3; %d stopped as the long schedule",
                   proven, trials, replayed, wide_proven, wide, offloaded_proven, offloaded,
                   stops_exact);
    /* Not vacuous: most trials are built and a fair share of them proven (37 of 117 with
     * keep sizes as random as these). */
    if (seed_env || trials_env)
        return;
    g_assert_cmpint(trials, >=, 90);
    g_assert_cmpint(proven, >=, trials / 4);
    g_assert_cmpint(replayed, >=, proven / 2);
    g_assert_cmpint(wide_proven, >=, 5); /* 11 of 17 */
    g_assert_cmpint(offloaded_proven, >=, 2); /* 3 of 5 (stage 1's, 4 of 6, extended before) */
    g_assert_cmpint(stops_exact, >=, proven / 2);
}


/* ZeRO-Offload with accumulation, as plan's search evaluates it (gpt-13b on 64 GPUs, 16
 * micro-batches): the CPU optimizer waits on every micro-step's gradient copies to the host
 * (zp_build_cpu_optimizer_step; sim_fold.c's sinks), so at stages 2 and 3 no state repeated
 * and the short run counted none (the full schedule ran after it). The evaluation builds 8
 * micro-steps and counts 8 virtual, its result and allocator figures the full schedule's,
 * field for field, and the full schedule folds too: stage 1 (whose CPU step waits on the last
 * micro-step only, and extended before), stage 2 to the CPU and to NVMe, stage 3 with the
 * parameters offloaded too. */
static void test_extend_offload(void)
{
    ZpModel m;
    GError *error = NULL;
    g_assert_true(zp_model_load("gpt-13b", &m, &error));
    static const struct {
        int stage;
        ZpOffloadDevice optimizer, param;
    } plans[] = {{1, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE},
                 {2, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NONE},
                 {2, ZP_OFFLOAD_NVME, ZP_OFFLOAD_NONE},
                 {3, ZP_OFFLOAD_CPU, ZP_OFFLOAD_CPU}};
    for (size_t k = 0; k < G_N_ELEMENTS(plans); k++) {
        ZpPlan p;
        zp_plan_defaults(&p, plans[k].stage, 64, 1);
        p.grad_accum = 16;
        p.zero.offload_optimizer.device = plans[k].optimizer;
        p.zero.offload_param.device = plans[k].param;
        p.gpus_per_node = a100.gpus_per_node;
        g_assert_cmpint(cli_rank_short_by(&m, &p, &a100), ==, 8);
        uint32_t folded;
        gboolean oom;
        assert_rank_is_full(&m, &p, 8, TRUE, &folded, &oom);
        g_assert_cmpuint(folded, >, 0);
    }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    sim_common_init();
    g_test_add_func("/sim/extend/structure", test_extend_structure);
    g_test_add_func("/sim/extend/equal", test_extend_equal);
    g_test_add_func("/sim/extend/alloc-runs", test_extend_alloc_runs);
    g_test_add_func("/sim/extend/alloc-runs-refused", test_extend_alloc_runs_refused);
    g_test_add_func("/sim/extend/refused", test_extend_refused);
    g_test_add_func("/sim/extend/or-stop", test_extend_or_stop);
    g_test_add_func("/sim/extend/short", test_extend_short);
    g_test_add_func("/sim/extend/rank", test_extend_rank);
    g_test_add_func("/sim/extend/megatron-1t", test_extend_megatron_1t);
    g_test_add_func("/sim/extend/round-trip", test_extend_round_trip);
    g_test_add_func("/sim/extend/held-buckets", test_extend_held_buckets);
    g_test_add_func("/sim/extend/wide-ops", test_extend_wide_ops);
    g_test_add_func("/sim/extend/averaged-costs", test_extend_averaged_costs);
    g_test_add_func("/sim/extend/random", test_extend_random);
    g_test_add_func("/sim/extend/offload", test_extend_offload);
    return sim_common_run();
}
