/* sim_trace: formats the trace by hand into one string (a step on many ranks has millions of
 * events, too many for a JSON object tree) and writes it through a temporary file and rename. */
#include "sim_trace.h"
#include "zp_budget.h"
#include "zp_outpath.h"
#include "zp_util.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Stream tracks, in ZpStream order. */
static const char *const thread_names[ZP_STREAM_N] = {"compute", "dp-comm", "tp-comm",
                                                       "pp-send", "host-link", "nvme",
                                                       "cpu-optimizer"};
static const char *const transfer_labels[ZP_XFER_N] = {"grads to host", "to GPU",
                                                       "nvme read", "nvme write"};
static const char *const coll_labels[ZP_COLL_N] = {"allreduce", "reduce-scatter", "allgather",
                                                   "all-to-all", "ep-dispatch", "ep-combine"};

/* Unit 0 is the embedding, 1..L the blocks, L+1 the final norm and LM head. */
static void append_unit(GString *out, const ZpSchedule *s, int unit)
{
    if (unit == 0)
        g_string_append(out, "embed");
    else if (unit == s->n_units - 1)
        g_string_append(out, "head");
    else
        g_string_append_printf(out, "L%d", unit);
}

static char *compute_label(const ZpSchedule *s, const ZpOp *op)
{
    GString *out = g_string_new(NULL);
    switch (op->sub) {
    case ZP_COMP_EMBED_FWD: g_string_append(out, "embed fwd"); break;
    case ZP_COMP_BLOCK_FWD: g_string_append(out, "fwd "); append_unit(out, s, op->unit); break;
    case ZP_COMP_HEAD: g_string_append(out, "head fwd+bwd"); break;
    case ZP_COMP_RECOMPUTE: g_string_append(out, "recompute "); append_unit(out, s, op->unit); break;
    case ZP_COMP_BLOCK_BWD: g_string_append(out, "bwd "); append_unit(out, s, op->unit); break;
    case ZP_COMP_EMBED_BWD: g_string_append(out, "embed bwd"); break;
    case ZP_COMP_CPU_OPTIMIZER: g_string_append(out, "cpu "); /* fall through */
    default: g_string_append(out, zp_optimizer_name(s->plan.optimizer)); break;
    }
    if (op->module > 0) /* a block op split per module, as DeepSpeed's stage 3 runs it */
        g_string_append_printf(out, " %s", zp_model_module_name((ZpBlockModule)(op->module - 1)));
    return g_string_free(out, FALSE);
}

/* Gradient reductions are numbered in launch order within their micro-step; the stage 1-2
 * parameter all-gathers after the optimizer (unit -1) in issue order. */
typedef struct {
    int micro, buckets, chunks;
} Ordinals;

static char *collective_label(const ZpSchedule *s, const ZpOp *op, Ordinals *n)
{
    GString *out = g_string_new(coll_labels[op->sub]);
    if (op->micro != n->micro) {
        n->micro = op->micro;
        n->buckets = 0;
    }
    if (op->group > ZP_GROUP_TP) { /* a schedule file's own communicator: its name */
        ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
        zp_sched_groups(s, groups);
        g_string_prepend_c(out, ' ');
        g_string_prepend(out, groups[op->group].name);
    } else if (op->group == ZP_GROUP_TP) {
        g_string_prepend(out, "tp ");
        g_string_append_c(out, ' ');
        append_unit(out, s, op->unit);
    } else if (!zp_sched_coll_fetches(s, op)) {
        g_string_append_printf(out, " bucket %d", n->buckets++);
    } else if (op->unit >= 0) {
        g_string_append_c(out, ' ');
        append_unit(out, s, op->unit);
    } else {
        g_string_append_printf(out, " params %d", n->chunks++);
    }
    return g_string_free(out, FALSE);
}

/* Labels of every op (NULL for alloc and free), shared by all ranks. */
static char **op_labels(const ZpSchedule *s)
{
    char **labels = g_new0(char *, s->ops->len);
    Ordinals n = {.micro = -2};
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_COMPUTE)
            labels[i] = compute_label(s, op);
        else if (op->kind == ZP_OP_COLLECTIVE)
            labels[i] = collective_label(s, op, &n);
        else if (op->kind == ZP_OP_TRANSFER)
            labels[i] = g_strdup(transfer_labels[op->sub]);
    }
    return labels;
}

/* Times go out as whole nanoseconds printed in microseconds, so an op's ts + dur is exactly
 * the next op's ts and the viewer never sees a sliver of overlap on one track. */
static int64_t to_ns(double seconds)
{
    return llround(seconds * 1e9);
}

static void append_us(GString *out, const char *key, int64_t ns)
{
    g_string_append_printf(out, ",\"%s\":%" PRId64 ".%03d", key, ns / 1000, (int)(ns % 1000));
}

/* The pipeline stage a simulated rank runs: its first world rank's (tp, then stage, then
 * dp). */
static uint32_t stage_of(const ZpSchedule *s, const SimResult *r, int pid)
{
    return (r->first_rank[pid] / (uint32_t)s->plan.mp) % (uint32_t)MAX(r->stages, 1);
}

static void append_metadata(GString *out, const ZpSchedule *s, const SimResult *r, int pid)
{
    const uint32_t first = r->first_rank[pid], stages = (uint32_t)MAX(r->stages, 1);
    if (r->mode == SIM_MODE_FOLDED && r->rank_count[pid] < (uint32_t)s->world / stages)
        g_string_append_printf(out,
                               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                               "\"name\":\"rank %u (dp %u, tp %u, stage %u): a class of %u "
                               "alike rank(s)\"}},\n",
                               pid, first, first / (s->plan.mp * stages), first % s->plan.mp,
                               stage_of(s, r, pid), r->rank_count[pid]);
    else if (r->stages > 1)
        g_string_append_printf(out,
                               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                               "\"name\":\"pipeline stage %u%s\"}},\n",
                               pid, stage_of(s, r, pid),
                               r->mode == SIM_MODE_FOLDED ? " (folded)" : "");
    else if (r->mode == SIM_MODE_FOLDED)
        g_string_append_printf(out,
                               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                               "\"name\":\"ranks 0-%d (folded: one simulated rank)\"}},\n",
                               pid, s->world - 1);
    else
        g_string_append_printf(out,
                               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                               "\"name\":\"rank %d (dp %d, tp %d)\"}},\n",
                               pid, pid, pid / s->plan.mp, pid % s->plan.mp);
    /* Only the tracks this rank's stage puts an op on: a declared empty track reads as a
     * stream that idled all step. */
    gboolean used[ZP_STREAM_N] = {FALSE};
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE && op->stream < ZP_STREAM_N &&
            op->stage == stage_of(s, r, pid))
            used[op->stream] = TRUE;
    }
    for (int t = 0; t < ZP_STREAM_N; t++)
        if (used[t])
            g_string_append_printf(out,
                                   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,"
                                   "\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n",
                                   pid, t, thread_names[t]);
}

/* Where pid's row of the timeline starts: sim_trace_write traces only ranks that have one. */
static size_t row_of(const SimResult *r, int pid)
{
    size_t base = 0;
    const gboolean kept = sim_result_timeline_row(r, (uint32_t)pid, &base);
    g_assert(kept);
    return base;
}

static void append_ops(GString *out, const ZpSchedule *s, const SimResult *r, int pid,
                       char **labels)
{
    const size_t base = row_of(r, pid);
    for (uint32_t i = 0; i < r->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (!labels[i] || op->stage != stage_of(s, r, pid)) /* another stage's op */
            continue;
        const int64_t start_ns = to_ns(r->op_start_s[base + i]);
        const int64_t ready_ns = to_ns(r->op_ready_s[base + i]);
        if (op->kind == ZP_OP_COLLECTIVE && ready_ns < start_ns) {
            /* This rank reached the collective first and waited for the last member. */
            g_string_append_printf(out, "{\"name\":\"wait for rank %u\",\"ph\":\"X\","
                                        "\"pid\":%d,\"tid\":%d",
                                   r->first_rank[r->op_last_rank[base + i]], pid, op->stream);
            append_us(out, "ts", ready_ns);
            append_us(out, "dur", start_ns - ready_ns);
            g_string_append_printf(out, ",\"args\":{\"op\":%u,\"waited_for\":%u}},\n", i,
                                   r->first_rank[r->op_last_rank[base + i]]);
        }
        g_string_append_printf(out, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d",
                               labels[i], pid, op->stream);
        append_us(out, "ts", start_ns);
        append_us(out, "dur", to_ns(r->op_end_s[base + i]) - start_ns);
        g_string_append_printf(out, ",\"args\":{\"op\":%u,\"micro\":%d,", i, op->micro);
        if (op->unit >= 0)
            g_string_append_printf(out, "\"unit\":%d,", op->unit);
        if (op->kind == ZP_OP_COMPUTE && op->module > 0)
            g_string_append_printf(out, "\"module\":\"%s\",",
                                   zp_model_module_name((ZpBlockModule)(op->module - 1)));
        if (op->kind == ZP_OP_COMPUTE)
            g_string_append_printf(out, "\"flops\":%.6g}},\n", op->flops);
        else
            g_string_append_printf(out, "\"bytes\":%.6g}},\n", op->bytes);
    }
}

typedef struct {
    double time_s;
    uint32_t op;
} MemoryChange;

static int compare_changes(const void *a, const void *b)
{
    const MemoryChange *x = a, *y = b;
    if (x->time_s != y->time_s)
        return x->time_s < y->time_s ? -1 : 1;
    return x->op < y->op ? -1 : x->op > y->op;
}

static void append_counter(GString *out, int pid, double time_s, const double *live)
{
    g_string_append_printf(out, "{\"name\":\"memory\",\"ph\":\"C\",\"pid\":%d", pid);
    append_us(out, "ts", to_ns(time_s));
    g_string_append(out, ",\"args\":{");
    for (int c = 0; c < ZP_MEM_N; c++)
        g_string_append_printf(out, "%s\"%s\":%.17g", c ? "," : "", zp_sched_mem_name(c),
                               live[c]);
    g_string_append(out, "}},\n");
}

/* The live bytes of each category after every instant at which some buffer changed. */
static void append_memory(GString *out, const ZpSchedule *s, const SimResult *r, int pid,
                          MemoryChange *changes)
{
    const size_t base = row_of(r, pid);
    size_t n = 0;
    for (uint32_t i = 0; i < r->n_ops; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if ((op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE) && op->stage == stage_of(s, r, pid))
            changes[n++] = (MemoryChange){r->op_start_s[base + i], i};
    }
    qsort(changes, n, sizeof *changes, compare_changes);
    double live[ZP_MEM_N];
    memcpy(live, r->stages > 1 ? &s->stage_state_bytes[stage_of(s, r, pid) * ZP_MEM_N]
                               : s->state_bytes, sizeof live);
    append_counter(out, pid, 0.0, live);
    for (size_t k = 0; k < n; k++) {
        const ZpOp *op = zp_sched_op(s, changes[k].op);
        live[op->sub] += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
        if (k + 1 == n || changes[k + 1].time_s != changes[k].time_s)
            append_counter(out, pid, changes[k].time_s, live);
    }
}

static int compare_ints(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Every rank up to SIM_TRACE_ALL_RANKS; past that rank 0, the rank that finished last, and
 * the rank rank 0 waited for longest in all (a straggler, if there is one). */
static GArray *traced_ranks(const ZpSchedule *s, const SimResult *r)
{
    GArray *ranks = g_array_new(FALSE, FALSE, sizeof(int));
    if (r->ranks_simulated <= SIM_TRACE_ALL_RANKS) {
        for (int pid = 0; pid < r->ranks_simulated; pid++)
            g_array_append_val(ranks, pid);
        return ranks;
    }
    double *waited_s = g_new0(double, r->ranks_simulated);
    int most = 0;
    const size_t base = row_of(r, 0);
    for (uint32_t i = 0; i < r->n_ops; i++)
        if (zp_sched_op(s, i)->kind == ZP_OP_COLLECTIVE) {
            const uint32_t last = r->op_last_rank[base + i];
            waited_s[last] += r->op_start_s[base + i] - r->op_ready_s[base + i];
            if (waited_s[last] > waited_s[most])
                most = (int)last;
        }
    g_free(waited_s);
    const int picks[] = {0, r->report_rank, most};
    for (size_t k = 0; k < G_N_ELEMENTS(picks); k++) {
        gboolean seen = FALSE;
        for (guint j = 0; j < ranks->len; j++)
            seen = seen || g_array_index(ranks, int, j) == picks[k];
        if (!seen)
            g_array_append_val(ranks, picks[k]);
    }
    g_array_sort(ranks, compare_ints);
    return ranks;
}

gboolean sim_trace_write(const ZpSchedule *sched, const SimResult *result, const char *path,
                         ZpProgressFn progress, void *progress_ctx, GError **error)
{
    size_t base;
    if (!sim_result_timeline_row(result, 0, &base)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "trace: the simulation was run without recording its timeline");
        return FALSE;
    }
    GArray *ranks = traced_ranks(sched, result);
    /* The trace's text is built whole (zp_out_write replaces a file atomically): said before,
     * at about 150 bytes an event line and at most two lines an op (its span, a memory
     * counter) for each rank traced. */
    const double events = 2.0 * result->n_ops * ranks->len;
    if (!zp_budget_check("the trace", events, "events", 0, NULL, events * 160.0, error)) {
        g_array_free(ranks, TRUE);
        return FALSE;
    }
    for (guint k = 0; k < ranks->len; k++)
        if (!sim_result_timeline_row(result, (uint32_t)g_array_index(ranks, int, k), &base)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "trace: the simulation kept no timeline for rank %d (sim_trace_run "
                        "keeps those the trace writes)",
                        g_array_index(ranks, int, k));
            g_array_free(ranks, TRUE);
            return FALSE;
        }
    char **labels = op_labels(sched);
    MemoryChange *changes = g_new(MemoryChange, result->n_ops ? result->n_ops : 1);
    GString *out = g_string_new("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    for (guint k = 0; k < ranks->len; k++) {
        const int pid = g_array_index(ranks, int, k);
        append_metadata(out, sched, result, pid);
        append_ops(out, sched, result, pid, labels);
        append_memory(out, sched, result, pid, changes);
        if (progress)
            progress((double)(k + 1) / ranks->len, progress_ctx);
    }
    const guint ranks_traced = ranks->len;
    g_array_free(ranks, TRUE);
    /* Every event line ends in ",\n"; JSON allows no comma after the last one. */
    g_string_truncate(out, out->len - 2);
    g_string_append_printf(out,
                           "\n],\"otherData\":{\"step_time_s\":%.17g,\"mode\":\"%s\","
                           "\"ranks_simulated\":%d,\"ranks_traced\":%u}}\n",
                           result->step_time_s, sim_mode_name(result->mode),
                           result->ranks_simulated, ranks_traced);
    const gboolean ok = zp_out_write(path, out->str, out->len, error);
    g_string_free(out, TRUE);
    g_free(changes);
    for (uint32_t i = 0; i < result->n_ops; i++)
        g_free(labels[i]);
    g_free(labels);
    return ok;
}

/* Halves of one progress line: the first pass's, then the second's. */
typedef struct {
    ZpProgressFn progress;
    void *ctx;
    double from;
} PassProgress;

static void pass_progress(double fraction, void *ctx)
{
    const PassProgress *p = ctx;
    p->progress(p->from + fraction / 2, p->ctx);
}

SimResult *sim_trace_run(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                         gboolean trace, GError **error)
{
    /* Pass one keeps rank 0's timeline (every rank's, up to SIM_TRACE_ALL_RANKS, for a
     * trace): it names the rank that finished last and the rank rank 0 waited for. */
    const uint32_t rank_0 = 0;
    PassProgress halves = {options->progress, options->progress_ctx, 0};
    SimOptions o = *options;
    o.record_timeline = FALSE;
    o.timeline_ranks = &rank_0;
    o.n_timeline_ranks = 1;
    o.timeline_every_rank_upto = trace ? SIM_TRACE_ALL_RANKS : 0;
    /* JSON: the reported rank's, whoever it is, where the stages' units share few rows. */
    o.timeline_report_rank = !trace;
    /* Halves where a second pass is likely (a trace's ranks); without a trace one pass
     * mostly does (timeline_report_rank), and a second one, past its bound, counts again. */
    if (options->progress && trace) {
        o.progress = pass_progress;
        o.progress_ctx = &halves;
    }
    SimResult *first = sim_engine_run(sched, hw, &o, error);
    if (!first || first->stopped)
        return first;
    GArray *wanted = trace ? traced_ranks(sched, first) : g_array_new(FALSE, FALSE, sizeof(int));
    if (!trace)
        g_array_append_val(wanted, first->report_rank);
    gboolean kept = TRUE;
    size_t base;
    for (guint k = 0; k < wanted->len; k++)
        kept = kept && sim_result_timeline_row(first, (uint32_t)g_array_index(wanted, int, k),
                                               &base);
    if (kept) {
        g_array_free(wanted, TRUE);
        return first;
    }
    /* Pass two, the same run (the engine is deterministic) keeping those ranks' timelines. */
    uint32_t *ranks = g_new(uint32_t, wanted->len);
    for (guint k = 0; k < wanted->len; k++)
        ranks[k] = (uint32_t)g_array_index(wanted, int, k);
    o.timeline_ranks = ranks;
    o.n_timeline_ranks = wanted->len;
    halves.from = 0.5;
    SimResult *second = sim_engine_run(sched, hw, &o, error);
    if (second && (second->step_time_s != first->step_time_s ||
                   second->report_rank != first->report_rank)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "simulate: the second pass (keeping %u ranks' timelines) differed from the "
                    "first",
                    wanted->len);
        sim_result_free(second);
        second = NULL;
    }
    g_free(ranks);
    g_array_free(wanted, TRUE);
    sim_result_free(first);
    return second;
}
