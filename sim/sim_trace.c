/* sim_trace: formats the trace by hand (a step on many ranks has millions of events, too many
 * for a JSON object tree) and streams it out a piece at a time (zp_out_stream_open). */
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
    case ZP_COMP_OPTIMIZER: g_string_append(out, zp_optimizer_name(s->plan.optimizer)); break;
    default: /* the experts, their unpermute, host copies, ZeRO++'s kernels, unpacks: the
              * kind's name ("expert_fwd" as "expert fwd"), and its block where it has one */
        g_string_append(out, zp_sched_compute_name((ZpComputeKind)op->sub));
        g_strdelimit(out->str, "_", ' ');
        if (op->unit >= 0) {
            g_string_append_c(out, ' ');
            append_unit(out, s, op->unit);
        }
        break;
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

/* Labels of every op (NULL for alloc and free), shared by all ranks; each distinct label is
 * kept once in `chunk` (a step repeats "fwd L12" every micro-step). */
static const char **op_labels(const ZpSchedule *s, GStringChunk *chunk)
{
    const char **labels = g_new0(const char *, s->ops->len);
    Ordinals n = {.micro = -2};
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        char *label = op->kind == ZP_OP_COMPUTE      ? compute_label(s, op)
                      : op->kind == ZP_OP_COLLECTIVE ? collective_label(s, op, &n)
                      : op->kind == ZP_OP_TRANSFER   ? g_strdup(transfer_labels[op->sub])
                                                     : NULL;
        if (label)
            labels[i] = g_string_chunk_insert_const(chunk, label);
        g_free(label);
    }
    return labels;
}

/* The text on its way out: event lines are gathered in `text` and written a buffer's worth
 * (ZP_OUT_STREAM_BUFFER) at a time, less the last line's ",\n", which the closing line
 * replaces. */
typedef struct {
    GString *text;
    ZpOutStream *out;
    gboolean failed; /* a write failed: the rest is not formatted; close says why */
    /* The ops of stage k, in order: by_stage[stage_start[k] .. stage_start[k + 1]) (a rank
     * reads its own stage's, not all: Megatron 1T's trace is 64 ranks of 917,000 ops). */
    uint32_t *by_stage, *stage_start;
} TraceOut;

/* Counts the ops of each stage, then places them (a counting sort, stable). */
static void index_stages(TraceOut *w, const ZpSchedule *s, uint32_t n_ops)
{
    const uint32_t stages = (uint32_t)MAX(s->stages, 1);
    w->stage_start = g_new0(uint32_t, stages + 1);
    w->by_stage = g_new(uint32_t, n_ops ? n_ops : 1);
    for (uint32_t i = 0; i < n_ops; i++)
        if (zp_sched_op(s, i)->stage < stages)
            w->stage_start[zp_sched_op(s, i)->stage + 1]++;
    for (uint32_t k = 0; k < stages; k++)
        w->stage_start[k + 1] += w->stage_start[k];
    uint32_t *next = g_memdup2(w->stage_start, stages * sizeof *next);
    for (uint32_t i = 0; i < n_ops; i++)
        if (zp_sched_op(s, i)->stage < stages)
            w->by_stage[next[zp_sched_op(s, i)->stage]++] = i;
    g_free(next);
}

static void spill(TraceOut *w)
{
    const gsize keep = 2; /* ",\n" */
    if (w->text->len < ZP_OUT_STREAM_BUFFER + keep || w->failed)
        return; /* (the stream writes a piece of its buffer's size straight out) */
    w->failed = !zp_out_stream_write(w->out, w->text->str, w->text->len - keep, NULL);
    g_string_erase(w->text, 0, (gssize)(w->text->len - keep));
}

/* Times go out as whole nanoseconds printed in microseconds, so an op's ts + dur is exactly
 * the next op's ts and the viewer never sees a sliver of overlap on one track. */
static int64_t to_ns(double seconds)
{
    return llround(seconds * 1e9);
}

/* Microseconds with three decimals, from whole nanoseconds; a negative value (none a run
 * writes) keeps its sign once, as valid JSON ("-3818.617", not "-3818.-617"). */
static void append_us(GString *out, const char *key, int64_t ns)
{
    const uint64_t mag = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    g_string_append_printf(out, ",\"%s\":%s%" PRIu64 ".%03u", key, ns < 0 ? "-" : "",
                           mag / 1000, (unsigned)(mag % 1000));
}

/* The pipeline stage a simulated rank runs: its first rank's (zplan's numbering: tp, then
 * stage, then dp; the label names the world's rank, zp_plan_placed_rank). */
static uint32_t stage_of(const ZpSchedule *s, const SimResult *r, int pid)
{
    return sim_result_rank_stage(r, (uint32_t)pid, s->plan.mp);
}

static void append_metadata(TraceOut *w, const ZpSchedule *s, const SimResult *r, int pid)
{
    GString *out = w->text;
    const uint32_t first = r->first_rank[pid], stages = (uint32_t)MAX(r->stages, 1);
    if (r->mode == SIM_MODE_FOLDED && r->rank_count[pid] < (uint32_t)s->world / stages)
        g_string_append_printf(out,
                               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                               "\"name\":\"rank %u (dp %u, tp %u, stage %u): a class of %u "
                               "alike rank(s)\"}},\n",
                               pid, (uint32_t)zp_plan_placed_rank(&s->plan, first),
                               first / (s->plan.mp * stages), first % s->plan.mp,
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
    const uint32_t stage = stage_of(s, r, pid);
    for (uint32_t k = w->stage_start[stage]; k < w->stage_start[stage + 1]; k++) {
        const ZpOp *op = zp_sched_op(s, w->by_stage[k]);
        if (op->kind != ZP_OP_ALLOC && op->kind != ZP_OP_FREE && op->stream < ZP_STREAM_N)
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

static void append_ops(TraceOut *w, const ZpSchedule *s, const SimResult *r, int pid,
                       const char **labels)
{
    GString *out = w->text;
    const size_t base = row_of(r, pid);
    const uint32_t stage = stage_of(s, r, pid);
    for (uint32_t k = w->stage_start[stage]; k < w->stage_start[stage + 1] && !w->failed; k++) {
        const uint32_t i = w->by_stage[k];
        const ZpOp *op = zp_sched_op(s, i);
        if (!labels[i]) /* an alloc or a free */
            continue;
        const int64_t start_ns = to_ns(r->op_start_s[base + i]);
        const int64_t ready_ns = to_ns(r->op_ready_s[base + i]);
        if (op->kind == ZP_OP_COLLECTIVE && ready_ns < start_ns) {
            /* This rank reached the collective first and waited for the last member (the
             * world's number for it: ZpRankOrder). */
            const uint32_t last = (uint32_t)zp_plan_placed_rank(
                &s->plan, r->first_rank[r->op_last_rank[base + i]]);
            g_string_append_printf(out, "{\"name\":\"wait for rank %u\",\"ph\":\"X\","
                                        "\"pid\":%d,\"tid\":%d",
                                   last, pid, op->stream);
            append_us(out, "ts", ready_ns);
            append_us(out, "dur", start_ns - ready_ns);
            g_string_append_printf(out, ",\"args\":{\"op\":%u,\"waited_for\":%u}},\n", i,
                                   last);
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
        spill(w);
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

/* The live bytes of each category after every instant at which some buffer changed, and
 * before them, where the instant's changes (in list order, as the simulator applies them)
 * passed through a higher total, that state too at the same time: the step's peak is often
 * such a moment (a buffer allocated before another is freed), and a trace that drew only
 * each instant's end showed 13.62 GB of a 1F1B stage that peaked at 14.47 GB. */
static void append_memory(TraceOut *w, const ZpSchedule *s, const SimResult *r, int pid,
                          MemoryChange *changes)
{
    const size_t base = row_of(r, pid);
    const uint32_t stage = stage_of(s, r, pid);
    size_t n = 0;
    for (uint32_t k = w->stage_start[stage]; k < w->stage_start[stage + 1]; k++) {
        const uint32_t i = w->by_stage[k];
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind == ZP_OP_ALLOC || op->kind == ZP_OP_FREE)
            changes[n++] = (MemoryChange){r->op_start_s[base + i], i};
    }
    qsort(changes, n, sizeof *changes, compare_changes);
    double live[ZP_MEM_N];
    memcpy(live, r->stages > 1 ? &s->stage_state_bytes[stage * ZP_MEM_N] : s->state_bytes,
           sizeof live);
    append_counter(w->text, pid, 0.0, live);
    double high[ZP_MEM_N], high_total = -1;
    for (size_t k = 0; k < n && !w->failed; k++) {
        const ZpOp *op = zp_sched_op(s, changes[k].op);
        live[op->sub] += op->kind == ZP_OP_ALLOC ? op->bytes : -op->bytes;
        double total = 0;
        for (int c = 0; c < ZP_MEM_N; c++)
            total += live[c];
        const gboolean last = k + 1 == n || changes[k + 1].time_s != changes[k].time_s;
        if (!last && total > high_total) {
            memcpy(high, live, sizeof high);
            high_total = total;
        }
        if (last) {
            if (high_total > total) /* the instant went higher than where it ends */
                append_counter(w->text, pid, changes[k].time_s, high);
            append_counter(w->text, pid, changes[k].time_s, live);
            high_total = -1;
            spill(w);
        }
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
    /* The text is streamed; what is held is a label pointer, a memory change and an index
     * entry an op, and the stream's buffer (said before, as the engine's own state is). */
    const double held_bytes =
        (double)result->n_ops * (sizeof(char *) + sizeof(MemoryChange) + sizeof(uint32_t)) +
        2.0 * ZP_OUT_STREAM_BUFFER;
    if (!zp_budget_check("the trace", result->n_ops, "ops", 0, NULL, held_bytes, error)) {
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
    TraceOut w = {.out = zp_out_stream_open(path, error)};
    if (!w.out) {
        g_array_free(ranks, TRUE);
        return FALSE;
    }
    GStringChunk *chunk = g_string_chunk_new(4096);
    const char **labels = op_labels(sched, chunk);
    index_stages(&w, sched, result->n_ops);
    MemoryChange *changes = g_new(MemoryChange, result->n_ops ? result->n_ops : 1);
    w.text = g_string_sized_new(ZP_OUT_STREAM_BUFFER + 4096);
    g_string_append(w.text, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    for (guint k = 0; k < ranks->len && !w.failed; k++) {
        const int pid = g_array_index(ranks, int, k);
        append_metadata(&w, sched, result, pid);
        append_ops(&w, sched, result, pid, labels);
        append_memory(&w, sched, result, pid, changes);
        if (progress)
            progress((double)(k + 1) / ranks->len, progress_ctx);
    }
    const guint ranks_traced = ranks->len;
    g_array_free(ranks, TRUE);
    /* Every event line ends in ",\n"; JSON allows no comma after the last one. */
    g_string_truncate(w.text, w.text->len - 2);
    g_string_append_printf(w.text,
                           "\n],\"otherData\":{\"step_time_s\":%.17g,\"mode\":\"%s\","
                           "\"ranks_simulated\":%d,\"ranks_traced\":%u}}\n",
                           result->step_time_s, sim_mode_name(result->mode),
                           result->ranks_simulated, ranks_traced);
    /* A failed write was kept by the stream: close reports it and removes the temporary. */
    if (!w.failed)
        zp_out_stream_write(w.out, w.text->str, w.text->len, NULL);
    const gboolean ok = zp_out_stream_close(w.out, error);
    g_string_free(w.text, TRUE);
    g_free(changes);
    g_free(labels);
    g_string_chunk_free(chunk);
    g_free(w.by_stage);
    g_free(w.stage_start);
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
