/* sim_engine: a discrete-event simulation of one training step — every op of a ZpSchedule
 * timed on every rank's streams, collectives synchronised across their groups, memory tracked. */
#ifndef SIM_ENGINE_H
#define SIM_ENGINE_H

#include "sim_clock.h"
#include "zp_hw.h"
#include "zp_sched.h"
#include "zp_util.h"

#include <glib.h>
#include <stdint.h>

typedef enum {
    SIM_MODE_FOLDED,   /* one rank stands for each class of identical ranks (sim_class) */
    SIM_MODE_EXPLICIT, /* every rank of the world, collectives wait for every real member */
} SimMode;

/* One slowed rank or node: its index and how many times longer its work takes. */
typedef struct {
    uint32_t index;
    double factor; /* >= 1 */
} SimSlow;

/* Rows a reported rank's timeline (SimOptions.timeline_report_rank) may take: each n_ops
 * wide, as the one row of each of the two runs it saves. */
#define SIM_REPORT_ROWS_MAX 4

/* The op types SimResult.op_type_s sums by: a compute op's ZpComputeKind, then
 * ZP_COMP_N + a collective's ZpCollKind. */
#define SIM_OP_TYPES (ZP_COMP_N + ZP_COLL_N)

typedef struct SimOptions {
    SimMode mode;
    gboolean record_timeline; /* keep every op's start and end (for sim_trace) */
    /* Without record_timeline: keep the timeline of these reported ranks only (the result's
     * numbering, SimResult.first_rank; those past the last are left out), or of every rank
     * where there are no more than timeline_every_rank_upto. Its memory is then n x ops,
     * not ranks x ops: what `--trace` (three ranks) and, past the clock's grid, `--json`
     * (the reported rank) read (sim_trace_run picks them). */
    const uint32_t *timeline_ranks;
    uint32_t n_timeline_ranks;
    uint32_t timeline_every_rank_upto;
    /* Without record_timeline: keep the reported rank's timeline, whichever rank finishes
     * last, in one run (what `--json` reads past the clock's grid, where op_type_s is not
     * exact; the rank is known only at the end). A unit writes the cells
     * of its own stage's ops only, so units of different stages share a row and the rows are
     * the most units one stage has; past SIM_REPORT_ROWS_MAX of them, timeline_ranks' are
     * kept instead (sim_trace_run then runs again). The result's timeline_ranks is then the
     * reported rank alone. */
    gboolean timeline_report_rank;
    ZpProgressFn progress;    /* NULL, or told the share of ops done now and then */
    void *progress_ctx;
    /* Stragglers: a slow rank's compute ops take factor times as long; a slow node's network
     * link moves data factor times slower, so every collective whose group crosses nodes
     * through it transfers that much slower (a ring or tree is as fast as its slowest link).
     * Both count the world's ranks, gpus_per_node consecutive ranks to a node, in the plan's
     * order (ZpRankOrder: a slow rank's index is the world's). Folded, the ranks they set
     * apart (the slow ones, and those whose groups wait for them differently) are simulated
     * as rank classes, one rank each, with the results of every rank simulated. */
    const SimSlow *slow_ranks, *slow_nodes;
    uint32_t n_slow_ranks, n_slow_nodes;
    /* Explicit: step every rank on its own. Without it, the ranks of one (pipeline stage, tp
     * index) in a block of consecutive dp rows that agree in every slowdown and every group
     * across rows (dp's, hpZ's), and so run in lockstep, are stepped as one unit, with the
     * same results for every rank (sim_engine.c says why and where it does so); the tests
     * that check that, and the benchmark, set it. */
    gboolean each_rank;
    /* > 0: stop once an op ends later than this (the caller, a search, has no use for a
     * step longer than it); the result is then `stopped`, with nothing but step_time_s. */
    double stop_after_s;
    /* Step every period of a pipeline's steady state (and every identical micro-step of
     * gradient accumulation) instead of advancing by whole periods where they repeat exactly
     * (sim_fold.h): the same results bit for bit, slower; what the tests compare with. */
    gboolean no_fold;
    /* > 0: the schedule is one built with this many fewer micro-steps (grad_accum) than the
     * step to simulate, all of them whole periods of its steady state (the builder inserts
     * steady periods, op for op, as grad_accum grows: tests/test_sim_extend.c). The fold
     * counts them as virtual periods in its jumps (times, sums and event counts as if they
     * had run; op indices moved by the physical ones only), so that the result is the long
     * schedule's in every field but state_bytes and the fold's own (fold_*). Where the fold
     * does not count them all (no exact repeat, the clock's grid ending, a stop time, a
     * straggler, a timeline kept), SimResult.extended_micro_steps says fewer: the result is
     * then the short schedule's, and the caller must run the long one. */
    uint32_t extend_micro_steps;
    /* With extend_micro_steps: stop (stopped, extended_micro_steps < extend_micro_steps) at
     * the first jump that cannot count all of them (the clock's grid ends it first; its later
     * jumps would need steady ops the short schedule lacks), once the first stage's last
     * micro-step begins with some not counted, and before the first event where the fold is
     * refused for the plan (step_time_s 0): what a caller that then runs the long schedule
     * wants, not the short run's rest. Where only stop_after_s keeps a jump from counting
     * them all, the run goes on to the stop time instead: stopped there on steady periods
     * alone (sim_fold_stopped_exact), it stopped as the long schedule's run does, at the same
     * step_time_s, and says so with extended_micro_steps = extend_micro_steps (the search's
     * early stop needs no long schedule: plan --3d mt-nlg-530b/1024, 13.5e9 -> 7.2e9
     * instructions); otherwise as above. */
    gboolean extend_or_stop;
} SimOptions;

typedef struct SimResult {
    SimMode mode;
    char cost_model[768]; /* how compute ops were costed: the op table or the roofline, why */
    char collective_model[512]; /* how each communicator's collectives were costed
                                 * (sim_coll_describe), "" when no group has two ranks */
    int world;            /* dp * mp ranks the step runs on */
    int ranks_simulated;  /* world in explicit mode; folded, one a stage or rank class */
    /* The units the engine stepped: ranks_simulated, or fewer in explicit mode, where a
     * block's ranks of one (stage, tp index) are one unit (SimOptions.each_rank). */
    int units_simulated;
    double step_time_s;   /* when the last op of any rank ends */
    /* SimOptions.stop_after_s passed: step_time_s is when the first op ended past it (the
     * step ends no sooner), and every other figure is unset. */
    gboolean stopped;

    /* Busy time and breakdown of report_rank, the simulated rank that finishes last. The six
     * terms add up to step_time_s: compute (all GPU compute ops but the optimizer), exposed
     * communication (no GPU compute op running while a collective of this rank is in
     * flight), optimizer, CPU optimizer (CPU Adam running and neither of those), offload
     * transfer (a host-link or NVMe transfer in flight and none of those), and idle. */
    int report_rank;
    double stream_busy_s[ZP_STREAM_N]; /* compute op durations; collective start to end */
    double compute_s, exposed_comm_s, optimizer_s, idle_s;
    /* Of the reported rank's time, its mixture of experts' dispatcher's collectives (the EP
     * all-to-alls' dispatch and combine, or the all-gather dispatcher's gathers and
     * reduce-scatters over TP x EP; start to end; on the compute stream, inside compute_s and
     * exposed_comm_s' span) */
    double alltoall_s;
    double cpu_optimizer_s, offload_transfer_s;
    double offload_bytes[ZP_XFER_N]; /* bytes one rank moves per step, by ZpTransferKind */

    /* Per rank per step. Model FLOPs are the forward and backward compute ops' FLOPs:
     * recomputation and the optimizer are not the model's work (the MFU definition). */
    double model_flops;
    double recompute_flops;
    /* Bytes one rank sends (ring algorithms; p2p sends once), by the schedule's group index
     * (ZpGroup for dp, tp and pp; a schedule file's other communicators after them), the
     * most any stage's rank sends. */
    double comm_bytes[ZP_SCHED_MAX_GROUPS];

    /* The highest per-rank total of live bytes, what each category held at that moment, and
     * the highest total of the model-state categories (params, grads, master, Adam m, v). */
    double peak_memory_bytes;
    double peak_breakdown_bytes[ZP_MEM_N];
    double category_peak_bytes[ZP_MEM_N]; /* each category's own maximum on that rank */
    double peak_model_state_bytes;

    /* Pipeline stages (1 without): per stage, its ranks' highest peak of live bytes, the
     * compute busy time (optimizer excluded) of its busiest rank, its bubble — the time
     * before the flush its compute stream idles — and the bytes one of its ranks sends by
     * ZpGroup ([stage * ZP_GROUP_N + group]). flush_s: when the last forward or backward
     * ended on any rank. Without a pipeline the bubble is the compute stream's idle time. */
    int stages;
    double flush_s;
    double *stage_peak_bytes, *stage_compute_s, *stage_bubble_s, *stage_comm_bytes;
    double *stage_category_peak_bytes; /* [stage * ZP_MEM_N + c]: each category's own maximum */

    /* The reported rank's compute ops and collectives by type (SIM_OP_TYPES): seconds
     * (end - start, a collective's from when its group started it) and how many, summed as
     * each ends (what `--json`'s "ops" prints, with no timeline kept). op_types_exact: every
     * duration summed was on the clock's grid and every sum stays below 2^22 s, so the sums
     * are exact integer arithmetic in quanta and equal a sum over the timeline in op order
     * bit for bit; where FALSE (a step past the grid's end), only a timeline gives those. */
    double op_type_s[SIM_OP_TYPES], op_type_count[SIM_OP_TYPES];
    gboolean op_types_exact;

    uint64_t op_events;   /* ops executed, summed over simulated ranks */
    uint64_t heap_events; /* timed events taken from the queue (stale ones included) */
    uint64_t state_bytes; /* per-rank state the run allocated (timeline included) */
    /* Micro-steps of every stage the run advanced by in whole periods of its steady state
     * instead of stepping them (sim_fold.h), in how many jumps, and a line saying so or why
     * it did not fold. */
    uint32_t fold_micro_steps, fold_jumps;
    char fold_note[192];
    /* SimOptions.extend_micro_steps counted as virtual periods: the result stands for the
     * longer schedule only where this equals it (a stopped one, for the longer schedule's
     * run stopped at the same stop_after_s: SimOptions.extend_or_stop). */
    uint32_t extended_micro_steps;
    /* Where they were not all counted because they are no whole number of the period the
     * fold proved (micro-steps: a heavy stages' or a found one, sim_fold.c), that period: the
     * short schedule built that many fewer short, rounded down to it, counts them (cli_rank.c
     * cli_rank_simulate_short); 0 otherwise. */
    uint32_t extend_period;
    /* Where none was counted because the short schedule ended too soon: a shift whose whole
     * state repeated (snapshots and countdowns) but whose ops ran out before a period past
     * the proof's window (the short schedule's drain came first), in micro-steps; built
     * short by that period fewer, rounded down to it, the proof has a period more of room
     * (cli_rank_simulate_short); 0 otherwise. */
    uint32_t extend_room;
    /* Where: the periods the longer schedule has and this one lacks, sorted by op (what its
     * allocator replay needs, zp_alloc_replay_schedule_extended); NULL where none. */
    ZpOpInsert *inserts;
    uint32_t n_inserts;

    /* With record_timeline: op i of simulated rank r ran over [op_start_s[r * n_ops + i],
     * op_end_s[r * n_ops + i]] (equal for alloc and free); NULL otherwise. A collective's
     * start is when its group started it, not when this rank reached it. */
    uint32_t n_ops;
    double *op_start_s, *op_end_s;
    /* With record_timeline, who waited for whom: when rank r reached op i (its own arrival
     * at a collective, which starts when the last member arrives), op_ready_s[r * n_ops + i],
     * and for a collective the member whose arrival started it, op_last_rank[r * n_ops + i]. */
    double *op_ready_s;
    uint32_t *op_last_rank;
    /* With SimOptions.timeline_ranks (and more ranks than timeline_every_rank_upto): the
     * ranks whose rows the timeline holds, ascending, row k rank timeline_ranks[k]; NULL
     * where row r is rank r's (sim_result_timeline_row reads either). */
    uint32_t *timeline_ranks;
    uint32_t n_timeline_ranks;
    /* Simulated rank r stands for rank_count[r] world ranks, the lowest first_rank[r]
     * (zplan's numbering: tp fastest, then stage, then dp; ZpRankOrder places it): itself
     * explicit. */
    uint32_t *first_rank, *rank_count;
} SimResult;

/* Simulates one step of `sched` on `hw`. The schedule's plan supplies dp, mp and precision
 * (whose tensor-core peak must exist on hw); mp must divide hw->gpus_per_node or be a multiple
 * of it. Each of the schedule's communicators (zp_sched_groups) must tile the world; where its
 * groups sit on hw's nodes sets its collectives' cost (sim_coll_group_placed). Pipeline stages
 * are rank classes: each runs its own ops, and a p2p send takes the sender's NVLink or its
 * share of the NICs (no contention with collectives). Fails on an
 * invalid schedule (naming the op), on a deadlock (naming an op that never ran), if memory
 * of a category goes negative or does not return to sched->state_bytes by the end, or if
 * the explicit ranks' state does not fit in memory. */
SimResult *sim_engine_run(const ZpSchedule *sched, const ZpHw *hw, const SimOptions *options,
                          GError **error);

void sim_result_free(SimResult *result);

/* Where rank's row of the timeline starts (row x n_ops) in *base: FALSE where the result has
 * no timeline or none for that rank. */
gboolean sim_result_timeline_row(const SimResult *result, uint32_t rank, size_t *base);

/* The pipeline stage simulated rank `rank` runs (0 without a pipeline): its first world
 * rank's, world ranks numbered tp fastest (mp of them), then stage, then dp. */
uint32_t sim_result_rank_stage(const SimResult *result, uint32_t rank, int mp);

/* Seconds one compute op takes (zp_hw_compute_time_s): flops other than attn_flops at peak x
 * GEMM efficiency at gemm_flops, attn_flops at the fused kernel's attn_flops_per_s, plus
 * mem_bytes / zp_hw_memory_bytes_per_s, with the peak of the plan's precision. */
double sim_engine_compute_time_s(const ZpOp *op, const ZpHw *hw, double peak_flops,
                                 double attn_flops_per_s);

/* The fused attention kernel's rate on hw for a schedule's model and plan
 * (zp_hw_attention_flops_per_s); 0 for eager. Fails when hw lists no rate for the kernel. */
gboolean sim_engine_attention_flops_per_s(const ZpModel *model, const ZpPlan *plan,
                                          const ZpHw *hw, double *flops_per_s, GError **error);

/* The tensor-core (or fp32) peak for a precision; fails if hw has none (bf16 on V100). */
gboolean sim_engine_peak_flops(const ZpHw *hw, ZpPrecision precision, double *peak_flops,
                               GError **error);

const char *sim_mode_name(SimMode mode);

/* Parses "INDEX:FACTOR" (a --slow-rank or --slow-link value): INDEX a whole number below
 * count (the ranks or nodes there are, named by `what`), FACTOR a number from 1 to 1e6. */
gboolean sim_slow_parse(const char *text, uint32_t count, const char *what, SimSlow *slow,
                        GError **error);

#endif
