/* cli: zplan's command line — one function per subcommand (cli_memory, cli_maxmodel, ...)
 * in its own cli_NAME.c, plus the shared flag handling in cli.c. Errors end here: a
 * subcommand prints one line naming the flag, key or file and returns non-zero. */
#ifndef CLI_H
#define CLI_H

#include "zp_hw.h"
#include "zp_model.h"
#include "zp_plan.h"
#include "zp_alloc_replay.h"
#include "zp_search.h"
#include "sim_engine.h"

#include <glib.h>
#include <jansson.h>

/* Limits that reject absurd input with a clear message rather than overflow later. */
#define CLI_MAX_PARAMS 1e15 /* a thousand trillion parameters */
#define CLI_MAX_GPUS 1048576.0

/* Exit status of a command that worked and found that the plan does not fit in the GPU's
 * memory (plan, simulate, memory): distinct from bad input (1). */
#define CLI_EXIT_DOES_NOT_FIT 2
/* Exit status of `validate --tolerance P%` when a quantity misses by more than P. */
#define CLI_EXIT_OVER_TOLERANCE 3

typedef int (*CliCommand)(int argc, char **argv);

int cli_memory(int argc, char **argv);
int cli_maxmodel(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_sweep(int argc, char **argv);
int cli_simulate(int argc, char **argv);
int cli_schedule(int argc, char **argv);
int cli_validate(int argc, char **argv);
int cli_calibrate(int argc, char **argv);
int cli_report(int argc, char **argv);

/* What `simulate` computed for one plan, handed to a command that compares it with a
 * measurement (validate --torch-trace) instead of being printed; the timeline recorded. */
typedef struct {
    const ZpModel *model;
    const ZpHw *hw;
    const ZpPlan *plan;
    const ZpSchedule *sched;
    const SimResult *result;
    ZpAllocStats alloc; /* the schedule's sequence through the caching allocator */
} CliSimulated;
typedef int (*CliSimulatedFn)(const CliSimulated *s, void *ctx);

/* Runs `simulate`'s plan flags (and `extra`, NULL-terminated entries of the caller's) on
 * argv as `name`, simulates the plan and hands the result to fn, whose value is returned;
 * a bad flag fails as simulate's do. */
int cli_simulate_into(int argc, char **argv, const char *name, const char *summary,
                      const GOptionEntry *extra, CliSimulatedFn fn, void *ctx);

/* Data-parallel bytes a rank sends, of its bytes by group (ZP_GROUP_N of them: SimResult's
 * comm_bytes, a pipeline stage's stage_comm_bytes row, or a schedule's by zp_sched_comm_bytes):
 * the DP group's and those of ZeRO++'s and expert parallelism's subgroups of it (the
 * expert-data-parallel group's reductions and gathers; the EP group's all-to-alls are a
 * mixture of experts' own, apart). simulate's text, JSON, stage table and page, and memory's
 * comm_bytes_per_rank, all say this figure. */
double cli_dp_bytes(const double *comm_bytes);

/* A message (newly allocated) as one line of at most about 1,000 bytes for stderr: control
 * characters escaped (a newline in a flag's value or a JSON key), the middle of a longer one
 * (a 100 MB string echoed back) elided. */
char *cli_one_line(const char *message);

/* Prints "zplan CMD: message" on stderr as one line (cli_one_line), frees error, returns the
 * exit status (1). */
int cli_fail(const char *command, GError *error);

/* g_option_context_parse, but a flag without a value given one (--json=x) fails. */
gboolean cli_parse_options(GOptionContext *context, int *argc, char ***argv, GError **error);

/* Parses options; fails on a parse error or on a stray positional argument. */
gboolean cli_parse(GOptionContext *context, int *argc, char ***argv, GError **error);

/* --model NAME|PATH.json or --params P, exactly one of them. */
gboolean cli_model(const char *model_flag, const char *params_flag, ZpModel *model,
                   GError **error);

/* --cluster NAME|PATH.json or --gpu-memory BYTES (both: the cluster with that GPU memory);
 * *have is FALSE when neither was given and neither is required. */
gboolean cli_cluster(const char *cluster_flag, const char *memory_flag, gboolean required,
                     ZpHw *hw, gboolean *have, GError **error);

/* Parses a whole-number flag in [min, max], or returns `fallback` when text is NULL. */
gboolean cli_int(const char *text, const char *flag, double min, double max, int fallback,
                 int *out, GError **error);

/* --precision and --optimizer with their defaults: the model's torch_dtype where hw (NULL:
 * any GPU) computes in it, else fp16; adam. */
gboolean cli_precision_optimizer(const char *precision_flag, const char *optimizer_flag,
                                 const ZpModel *model, const ZpHw *hw, ZpPrecision *precision,
                                 ZpOptimizer *optimizer, GError **error);

/* The defaults a command took that shape its answer (the sequence, the precision, the
 * attention kernel), recorded by the flag helpers below as they fill them in, and printed as
 * one line near the top of the text output: "Defaults: sequence 4096 (...); bf16 (...). Change
 * with --seq, --precision." */
void cli_default_taken(const char *flag, const char *format, ...) G_GNUC_PRINTF(2, 3);
/* Withdraws what cli_default_taken said of a flag: a file read later decided it instead. */
void cli_default_retract(const char *flag);
/* That line, newly allocated, or NULL when no default was taken. */
char *cli_defaults_line(void);
/* Prints it on stdout, if any, then each note (cli_note), one a line. */
void cli_print_defaults(void);

/* A line the answer needs beside the defaults: what a DeepSpeed config's "auto" resolved to, a
 * feature the plan carries that does nothing here. Printed by cli_print_defaults. */
void cli_note(const char *format, ...) G_GNUC_PRINTF(1, 2);

/* The notes as a JSON array (a new reference; empty when none). */
json_t *cli_notes_json(void);

/* cli_notes.c: notes a plan from --ds-config FILE or the flags owes its reader: the "auto"
 * values of FILE as resolved (batch sizes, bucket sizes, precision), what its framework
 * would not run as given (Megatron's mixture of experts over TP without sequence
 * parallelism), and ZeRO++ features that do nothing on the plan's placement (qgZ within one
 * node). */
void cli_note_ds_config_auto(const char *path, const ZpPlan *plan);
void cli_note_inert_features(const ZpModel *model, const ZpPlan *plan);

/* The longest sequence taken by default: a config's max_position_embeddings above it is the
 * longest the model can read, not what a step is trained at. */
#define CLI_DEFAULT_SEQ_MAX 4096

/* --attention eager|flash|NAME (NULL: what PyTorch's scaled-dot-product attention picks on
 * hw at this precision; hw may be NULL) and --reduce-dtype fp32|bf16|fp16 (NULL: the
 * gradients' own dtype). */
/* --recompute none|selective|full, --checkpoint being full: sets the plan's recomputation;
 * the two flags disagreeing is refused. */
gboolean cli_recompute(const char *recompute_flag, gboolean checkpoint_flag, ZpPlan *plan,
                       GError **error);

/* zreal's --attention (and `schedule`'s, whose ops zreal runs): eager, or its own blockwise
 * fused kernel, which any fused name ("flash", "flash2", ...) means and which runs in any dtype,
 * so no FlashAttention check; withdraws a default the flag overrides. */
gboolean cli_attention_zreal(const char *attention_flag, ZpPlan *plan, GError **error);

/* DeepSpeed's size knobs given as flags (given[k]: the flag's text, or NULL) that the plan's
 * implementation has no setting for (zp_impl_unread_knobs: FSDP's, Megatron-Core's but its
 * bucket) are refused, naming the first, as ZeRO++ is under FSDP2, rather than dropped in
 * silence (zplan simulate and zreal). */
gboolean cli_knobs_read(ZpImplKind impl, const char *const given[ZP_KNOB_N], GError **error);

/* --kernels NAME: the kernel inventory (zp_inventory) a GPU profile's kernel_rates price, into
 * plan->kernels; without the flag plan->kernels stays "" (the one --impl names). An unknown
 * name fails naming the flag and listing the inventories. */
gboolean cli_kernels(const char *kernels_flag, ZpPlan *plan, GError **error);

/* No --attention: PyTorch SDPA's choice for the precision on the cluster's GPU
 * (zp_hw_attention_default; FlashAttention-2 without a cluster in 16 bits) into
 * plan->attention, said once on the defaults line (replacing what it said before). */
void cli_attention_default(const ZpHw *hw, ZpPrecision precision, ZpPlan *plan);

gboolean cli_attention_reduce(const char *attention_flag, const char *reduce_flag,
                              const ZpHw *hw, ZpPrecision precision, ZpPlan *plan,
                              GError **error);

/* --offload-optimizer cpu|nvme, --offload-param cpu|nvme and --nvme-path DIR (NULL: absent)
 * into zero's offload sections, checked against its stage (zp_offload_check), failing
 * naming the flag. */
/* --nvme-path into an offload section whose device is nvme (others keep none); fails when
 * the path is too long. */
gboolean cli_offload_nvme_path(const char *nvme_path, ZpOffload *offload, GError **error);

gboolean cli_offload(const char *optimizer_flag, const char *param_flag, const char *nvme_path,
                     ZpZeroConfig *zero, GError **error);

/* The three offload flags' GOptionEntry lines; targets are char **. */
#define CLI_OFFLOAD_ENTRIES(opt, param, path)                                                  \
    {"offload-optimizer", 0, 0, G_OPTION_ARG_STRING, (opt),                                    \
     "ZeRO-Offload: fp32 master, Adam moments and fp32 gradients to cpu or nvme (stage >= 1)", \
     "DEV"},                                                                                   \
    {"offload-param", 0, 0, G_OPTION_ARG_STRING, (param),                                      \
     "ZeRO-Infinity: the 16-bit parameter partitions to cpu or nvme (stage 3)", "DEV"},        \
    {"nvme-path", 0, 0, G_OPTION_ARG_FILENAME, (path),                                         \
     "Directory DeepSpeed swaps to with nvme (written to --ds-config)", "DIR"}

/* DeepSpeed's offload knobs that decide what host memory holds, on the command line as in a
 * ds_config: zero_optimization.sub_group_size, offload_param.max_in_cpu and the swap buffers'
 * buffer_count (both sections'). NULL: DeepSpeed's defaults (1e9, 1e9, 4 and 5). */
typedef struct {
    char *sub_group_size, *max_in_cpu, *buffer_count;
} CliOffloadTuning;

#define CLI_OFFLOAD_TUNING_ENTRIES(t)                                                          \
    {"sub-group-size", 0, 0, G_OPTION_ARG_STRING, &(t)->sub_group_size,                        \
     "Stage 3: elements the optimizer steps (and NVMe swaps) at once (default 1e9)", "N"},     \
    {"max-in-cpu", 0, 0, G_OPTION_ARG_STRING, &(t)->max_in_cpu,                                \
     "--offload-param nvme: parameter elements kept in host memory (default 1e9)", "N"},       \
    {"buffer-count", 0, 0, G_OPTION_ARG_STRING, &(t)->buffer_count,                            \
     "NVMe swap buffers of each offload section (default: DeepSpeed's 4 and 5)", "N"}

/* Applies them to zero (after cli_offload); fails naming the flag. */
gboolean cli_offload_tuning(const CliOffloadTuning *tuning, ZpZeroConfig *zero, GError **error);
void cli_offload_tuning_free(CliOffloadTuning *tuning);

/* A training budget: --tokens (1T) or --steps, and --gpu-hour-price, giving wall-clock days,
 * GPU-hours and cost from a step's time (llm-analysis's total training time). */
typedef struct {
    char *tokens_flag, *steps_flag, *price_flag;
    double tokens, steps, price; /* 0 when not given */
} CliBudget;

#define CLI_BUDGET_ENTRIES(b)                                                                  \
    {"tokens", 0, 0, G_OPTION_ARG_STRING, &(b)->tokens_flag,                                   \
     "Train on this many tokens (1T, 300B): prints the steps, days and GPU-hours", "T"},       \
    {"steps", 0, 0, G_OPTION_ARG_STRING, &(b)->steps_flag,                                     \
     "Or this many optimizer steps", "N"},                                                     \
    {"gpu-hour-price", 0, 0, G_OPTION_ARG_STRING, &(b)->price_flag,                            \
     "Price of one GPU-hour (2.50): adds the cost", "P"}

gboolean cli_budget_parse(CliBudget *budget, GError **error);
void cli_budget_free(CliBudget *budget);
/* The budget's figures for a step of step_s seconds that trains tokens_per_step tokens on gpus
 * GPUs, as one line (newly allocated; NULL without --tokens or --steps) and as JSON (NULL
 * likewise). */
char *cli_budget_line(const CliBudget *budget, double step_s, double tokens_per_step, int gpus);
json_t *cli_budget_json(const CliBudget *budget, double step_s, double tokens_per_step, int gpus);

/* --seq S (NULL: the model's own, max_position_embeddings for a Hugging Face config, at
 * most CLI_DEFAULT_SEQ_MAX; 8k is 8192):
 * sets model->seq_len and checks it against a learned position table; refused for a model
 * known only by its parameter count. */
gboolean cli_seq(const char *text, ZpModel *model, GError **error);

/* The --seq entry every command that takes a model shares; target is a char **. */
#define CLI_SEQ_ENTRY(target)                                                                  \
    {"seq", 0, 0, G_OPTION_ARG_STRING, (target),                                              \
     "Sequence length (default: the model's, at most 4096; max_position_embeddings for a "     \
     "Hugging Face config; 8k = 8192)", "S"}

/* --mp M against the GPU count and the model: M divides gpus and the model's heads. */
gboolean cli_check_mp(int mp, int64_t gpus, const ZpModel *model, GError **error);

/* cli_rank.c. The simulator as the planner's ranking (a ZpRankFn; ctx is a CliRankContext):
 * builds the plan's schedule and runs it folded; the bytes needed are the allocator's, as
 * `simulate` judges a fit (zp_alloc_replay_needed_bytes: the reserved peak, holes included), no
 * runtime reserve. With kept (cli_rank_keep), the runs that reach the end are kept, and a plan
 * asked again is answered from its run: plan's report prints the ranked plans' runs, and a
 * ZeRO++ parent stopped short is run again to the end. */
typedef struct {
    const ZpModel *model;
    const ZpHw *hw;
    GPtrArray *kept; /* NULL: nothing kept */
} CliRankContext;
gboolean cli_rank_by_simulation(const ZpPlan *plan, void *ctx, double stop_after_s,
                                double *step_time_s, double *peak_memory_bytes, GError **error);
void cli_rank_keep(CliRankContext *c);
/* The run kept of this plan, handed to the caller (who frees it), or NULL. */
SimResult *cli_rank_take(const CliRankContext *c, const ZpPlan *plan);
void cli_rank_clear(CliRankContext *c);
/* A plan's step folded (stopped past stop_after_s > 0); with `alloc`, also its allocations
 * replayed through the caching allocator against the GPU less its reserve (unless stopped). */
SimResult *cli_rank_simulate(const ZpModel *model, const ZpHw *hw, const ZpPlan *plan,
                             double stop_after_s, ZpAllocStats *alloc, GError **error);

/* The micro-steps a plan's schedule may be built short of and still give the full
 * schedule's result (whole steady periods, counted as virtual ones by the fold:
 * SimOptions.extend_micro_steps); 0 where the plan is too short to gain, or GPipe. Why these
 * numbers: cli_rank.c. */
int cli_rank_short_by(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw);
/* The run of the plan's schedule built cli_rank_short_by micro-steps short under base's
 * options, its missing periods counted as virtual ones: the full schedule's result in every
 * field but state_bytes and the fold's own (fold_*; tests/test_sim_extend.c), or NULL where
 * the fold did not count them all (nothing proven: the caller runs the full schedule). With
 * alloc, the allocator replay of the full schedule from the short one and the periods
 * inserted (*alloc_done FALSE where it could not: the caller replays the full schedule). With
 * built, the short schedule the result came from (the caller frees it; NULL with no result). */
SimResult *cli_rank_simulate_short(const ZpModel *model, const ZpHw *hw, const ZpPlan *plan,
                                   const SimOptions *base, ZpAllocStats *alloc,
                                   gboolean *alloc_done, ZpSchedule **built);

/* The simulator's placement model as the planner's bandwidth bound (a ZpBusBandwidthFn). */
double cli_bus_bytes_per_s(const ZpHw *hw, int dp, int mp, ZpGroup group);
/* And its time of one collective alone (a ZpCollTimeFn): sim_coll_cost's latency + transfer. */
double cli_coll_s(const ZpHw *hw, int dp, int mp, ZpGroup group, ZpCollKind kind, double bytes);

/* ZeRO++'s lossy options (qwZ, qgZ), which plan and sweep try only when asked: they change
 * what is trained (int8 parameters in the gathers, int4 gradients), and no one should be
 * handed them for a 0.01% faster step without asking (plan --zeropp lossy). */
#define CLI_LOSSY_ZEROPP (ZP_TECH_QWZ | ZP_TECH_QGZ)

/* A search spec for `plan` and `sweep`: the simulator ranks, its placement bounds. */
void cli_search_spec(ZpSearchSpec *spec, CliRankContext *context, const ZpModel *model,
                     const ZpHw *hw, int gpus);

/* Bytes per GPU a plan needs, the one figure memory, sweep --metric memory and plan's
 * screening agree on: with hw and an architecture, the plan's schedule's allocator-reserved
 * peak + hw's reserve (what `simulate` reports; INFINITY for a plan the simulator refuses);
 * otherwise (no hw, a bare --gpu-memory GPU without rates, or --params) the model states left on the GPU after offload + the residual in closed form.
 * Where the host memory or NVMe per node overflows, the GPU's memory + that shortfall, so the
 * plan does not fit. */
double cli_need_bytes(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw);

/* Model TFLOP/s per GPU of a simulated plan (recomputation not counted). */
double cli_plan_tflops(const ZpModel *model, const ZpCandidate *candidate);

/* A GPU's capacity as quoted: "80 GiB (85.9 GB)" (GB = 1e9 bytes). Newly allocated. */
char *cli_capacity(double bytes);

/* The verdict that opens a report: "Fits: WHAT needs 52.1 GB per GPU (DETAIL) of 80 GiB
 * (85.9 GB), 33.8 GB headroom." or "Does not fit: ... 215.3 GB short." Newly allocated. */
char *cli_verdict(const char *what, const char *detail, double needed_bytes,
                  double capacity_bytes);

/* "1,557,611,200" for the human tables. Returns a newly allocated string. */
char *cli_thousands(uint64_t value);

#endif
