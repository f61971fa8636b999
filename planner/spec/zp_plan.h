/* zp_plan: one training plan — ZeRO stage and DeepSpeed's knobs, parallel degrees, batch,
 * checkpointing, precision and optimizer — with DeepSpeed's real defaults. */
#ifndef ZP_PLAN_H
#define ZP_PLAN_H

#include <glib.h>

typedef enum { ZP_PREC_FP16, ZP_PREC_BF16, ZP_PREC_FP32 } ZpPrecision;
typedef enum { ZP_OPT_ADAM, ZP_OPT_SGD_MOMENTUM, ZP_OPT_SGD, ZP_OPT_ADAM_8BIT } ZpOptimizer;

/* The attention kernel. Eager is the unfused path that writes the s x s scores; every other
 * kernel is fused (FlashAttention 1 and its Triton port, FlashAttention-2 and -3, PyTorch's
 * memory-efficient kernel): it stores no s x s tensor, only its output and an fp32
 * log-sum-exp per row and head, recomputes the scores in backward, and is timed at its own
 * rate from the hwprofile's attention table. */
typedef enum {
    ZP_ATTN_EAGER,
    ZP_ATTN_FLASH1,
    ZP_ATTN_FLASH1_TRITON,
    ZP_ATTN_FLASH2,
    ZP_ATTN_FLASH3,
    ZP_ATTN_MEM_EFFICIENT,
    ZP_ATTN_N
} ZpAttention;

/* The dtype gradients are reduced in (DeepSpeed's communication_data_type, FSDP's
 * reduce_dtype); ZP_REDUCE_GRAD, the default, is the gradients' own. */
typedef enum { ZP_REDUCE_GRAD, ZP_REDUCE_FP32, ZP_REDUCE_BF16, ZP_REDUCE_FP16, ZP_REDUCE_N } ZpReduceDtype;

/* Whose ZeRO a plan follows (planner/rules/zp_impl.h): DeepSpeed v0.19.6 as its source does it
 * (the zero value, the default), PyTorch FSDP, the ZeRO paper's idealised volumes,
 * Megatron-Core's DistributedDataParallel and distributed optimizer, or PyTorch's FSDP2
 * (fully_shard). */
typedef enum {
    ZP_IMPL_DEEPSPEED,
    ZP_IMPL_FSDP,
    ZP_IMPL_PAPER,
    ZP_IMPL_MEGATRON,
    ZP_IMPL_FSDP2,
    ZP_IMPL_N
} ZpImplKind;

/* Bytes per parameter of each model-state term for a precision and optimizer. */
typedef struct {
    double param_bytes; /* the weights the forward reads (2 for fp16/bf16, 4 for fp32) */
    double grad_bytes;  /* gradients in the training precision */
    double optim_bytes; /* K: fp32 master copy (mixed precision) plus optimizer moments */
} ZpStateBytes;

/* Where offloaded model states live (DeepSpeed's OffloadDeviceEnum). */
typedef enum { ZP_OFFLOAD_NONE, ZP_OFFLOAD_CPU, ZP_OFFLOAD_NVME, ZP_OFFLOAD_N } ZpOffloadDevice;

/* zero_optimization.offload_optimizer / offload_param (deepspeed/runtime/zero/
 * offload_config.py, v0.19.6: DeepSpeedZeroOffloadOptimizerConfig and
 * DeepSpeedZeroOffloadParamConfig). Sizes in elements. buffer_size and max_in_cpu are
 * offload_param's only, ratio offload_optimizer's only (the share of the optimizer states
 * that goes to the CPU; ZeRO-3 keeps the rest on the GPU). nvme_path is "" when unset. */
typedef struct {
    ZpOffloadDevice device;
    gboolean pin_memory;
    double buffer_count;
    double buffer_size;
    double max_in_cpu;
    double ratio;
    char nvme_path[256];
} ZpOffload;

/* DeepSpeed's zero_optimization section, sizes in elements as DeepSpeed counts them. */
typedef struct {
    int stage;
    double reduce_bucket_size;
    double allgather_bucket_size;
    gboolean overlap_comm;
    gboolean contiguous_gradients;
    gboolean reduce_scatter;
    double stage3_prefetch_bucket_size;
    double stage3_param_persistence_threshold;
    double stage3_max_live_parameters;
    double stage3_max_reuse_distance;
    /* ZeRO++ (deepspeed/runtime/zero/config.py; stage 3 only): qwZ, the block-quantised int8
     * parameter all-gather; hpZ, a secondary parameter partition over this many ranks of a
     * node (1: none); qgZ, int4 gradients through the hierarchical all-to-all. */
    gboolean zero_quantized_weights;
    int zero_hpz_partition_size;
    gboolean zero_quantized_gradients;
    double sub_group_size; /* stage 3: elements of a partition the step handles at once */
    /* stages 1-2: all-reduce each gradient bucket (DeepSpeed's default) rather than reduce
     * each rank's slice to it */
    gboolean use_multi_rank_bucket_allreduce;
    /* stage 3, DeepSpeed: every parameter all-gathered on its own rather than one coalesced
     * all-gather per fetch (stage3_allgather_sequential, default false) */
    gboolean stage3_allgather_sequential;
    /* stage 3, DeepSpeed: a coalesced fetch all-reduces a zeroed flat buffer holding this
     * rank's slices instead of all-gathering (stage3_use_all_reduce_for_fetch_params) */
    gboolean stage3_use_all_reduce_for_fetch_params;
    ZpOffload offload_optimizer; /* fp32 master, moments and fp32 gradients (stages 1-3) */
    ZpOffload offload_param;     /* the 16-bit parameter partitions (stage 3) */
    /* FSDP2's reshard_after_forward=False (--impl fsdp2 --stage 2, which zp_impl_normalize_plan
     * turns into stage 3 with this set): stage 3's shards at rest, each block's gathered
     * parameters kept from its forward to its backward. */
    gboolean fsdp2_no_reshard_after_forward;
} ZpZeroConfig;

/* DeepSpeed's activation_checkpointing section (ZeRO-R;
 * deepspeed/runtime/activation_checkpointing/config.py), meaningful with checkpointing on. */
typedef struct {
    gboolean partition_activations;          /* Pa: 1/M of each checkpoint per TP rank */
    gboolean cpu_checkpointing;              /* Pa+cpu: the partition kept in host memory */
    gboolean contiguous_memory_optimization; /* MD: checkpoints in one pre-allocated region */
    int number_checkpoints;                  /* that region's slots; 0: one per block */
    gboolean synchronize_checkpoint_boundary; /* device synchronize at each checkpoint */
} ZpCheckpointConfig;

/* The order of the world's ranks, fastest first, as the frameworks lay them on nodes
 * (gpus_per_node consecutive ranks a node):
 * - tp-dp-pp, the zero value: Megatron-Core's default (parallel_state.py
 *   initialize_model_parallel, order "tp-cp-ep-dp-pp") and DeepSpeed's pipeline topology
 *   (topology.py PipeModelDataParallelTopology, axes pipe, data, model: model fastest);
 * - tp-pp-dp: Megatron-Core's --use-tp-pp-dp-mapping (order "tp-cp-ep-pp-dp").
 * zplan numbers its ranks tp-pp-dp whatever the order (rank = dp x mp P + stage x mp + tp:
 * the schedule's groups, the simulator's ranks, zreal's roles); the order says where each
 * sits, which a group's links and a pipeline send's depend on (zp_plan_placed_rank). */
typedef enum { ZP_ORDER_TP_DP_PP, ZP_ORDER_TP_PP_DP, ZP_ORDER_N } ZpRankOrder;

/* Pipeline parallelism (zp_pipe): the schedule a stage runs its micro-batches in, and how
 * the layers are split over the stages. */
typedef enum { ZP_PIPE_1F1B, ZP_PIPE_GPIPE, ZP_PIPE_INTERLEAVED, ZP_PIPE_N } ZpPipeSchedule;
typedef enum { ZP_PARTITION_UNIFORM, ZP_PARTITION_PARAMETERS, ZP_PARTITION_N } ZpPartition;

typedef struct {
    int stages;         /* P; 0 or 1: no pipeline */
    int virtual_stages; /* V model chunks per stage (interleaved 1F1B); 0 or 1: one */
    ZpPipeSchedule schedule;
    ZpPartition partition;
} ZpPipeConfig;

/* How a mixture of experts' tokens reach the experts (Megatron-Core's
 * --moe-token-dispatcher-type, token_dispatcher.py): an all-to-all over the EP group (its
 * MoEAlltoAllTokenDispatcher, and DeepSpeed's _AllToAll), or an all-gather of every token of
 * the TP x EP group to each of its ranks and a reduce-scatter of the experts' outputs back
 * (MoEAllGatherTokenDispatcher, Megatron-Core's default). */
typedef enum { ZP_DISPATCH_ALLTOALL, ZP_DISPATCH_ALLGATHER, ZP_DISPATCH_N } ZpDispatcher;

/* Expert parallelism for a mixture of experts (zp_ep.h); the zero value is EP 1, dropless
 * routing, a perfectly balanced router and the all-to-all dispatcher. */
typedef struct {
    int ep;                 /* experts split over ep ranks of the data-parallel group; 0: 1 */
    double capacity_factor; /* tokens an expert takes, over the mean (GShard, DeepSpeed's and
                             * Megatron-Core's get_capacity); 0: dropless */
    double skew;            /* the busiest expert's load over the mean; 0: 1 */
    ZpDispatcher dispatcher;
    /* Expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size): each expert
     * split over the TP degree's ranks (0: mp, Megatron's default), or 1: whole on each rank,
     * the experts' grid then EP x (mp dp / EP) over the stage's mp x dp ranks
     * (parallel_state's expert rank generator, order tp-ep-dp-pp with etp 1). */
    int etp;
} ZpExpertConfig;

typedef struct {
    ZpZeroConfig zero;
    int dp;               /* data-parallel degree N */
    int mp;               /* tensor (model) parallel degree M */
    int micro_batch;      /* samples per GPU per micro-step */
    int grad_accum;       /* micro-steps per optimizer step */
    gboolean checkpoint;  /* activation checkpointing at every block (--recompute full) */
    /* Megatron's selective recomputation (--recompute selective, recompute_granularity
     * "selective" with its default module core_attn): each block's core attention (scores,
     * softmax, dropout and the values' product; a fused kernel's whole call) is not saved but
     * recomputed in the block's backward (Korthikanti et al. 2022, section 5). Ignored
     * under checkpoint, which recomputes the whole block. */
    gboolean selective_recompute;
    /* Megatron's --overlap-param-gather (the distributed optimizer's, stage 1 of --impl
     * megatron): the updated parameters' all-gather is not run after the step but bucket by
     * bucket in the next forward, each bucket's issued when the one before it is waited for
     * (param_and_grad_buffer.py finish_param_sync -> next_param_gather_bucket_group). */
    gboolean overlap_param_gather;
    /* Megatron-LM without an fp32 main_grad (the zero value: with it, as Megatron-Core's DDP
     * always keeps one): the parameters' 16-bit .grad holds the gradients, as in Megatron-LM
     * 2021 with torch DDP, or local DDP without --use-contiguous-buffers-in-ddp (the SC21
     * runs, commit de7dc40f: megatron/model/distributed.py DistributedDataParallel, no
     * main_grad; megatron/mpu/layers.py F.linear, no gradient-accumulation fusion). Each
     * weight-gradient GEMM writes a fresh 16-bit gradient that autograd adds into .grad on
     * every micro-step after the first; the optimizer copies .grad to fp32 and sets it to
     * None. The megatron kernel inventory's; refused with another. */
    gboolean no_main_grad;
    /* Megatron-LM's pipeline exchanges waited for on the host (the zero value: sends beside
     * the next op, as Megatron-Core's interleaved schedule with overlap_p2p_comm, its
     * default): batch_isend_irecv, every request waited for, then torch.cuda.synchronize()
     * (Megatron-LM de7dc40f megatron/p2p_communication.py _communicate, as the SC21 runs ran
     * it; today --no-overlap-p2p-communication with batch_p2p_sync). A stage's next op waits
     * for its own sends and for all the exchange received; the interleaved schedule's steady
     * state sends a forward's output in one exchange with the next backward's gradients,
     * after both (schedules.py forward_backward_pipelining_with_interleaving:
     * send_forward_backward_recv_forward_backward). --impl megatron; nothing without a
     * pipeline. */
    gboolean p2p_sync;
    ZpCheckpointConfig ckpt; /* ZeRO-R's options for those checkpoints */
    ZpPrecision precision;
    ZpOptimizer optimizer;
    ZpAttention attention;     /* eager (the zero value) or a fused kernel */
    /* The fused kernel keeps no s x s scores (activation memory as any fused kernel's) but
     * the profile has no rate for it, so its work is counted and priced as eager attention's:
     * batched GEMMs and the softmax's passes (zp_attention_eager_work_unrated: mem-efficient).
     * FALSE (the zero value): a fused kernel is timed at its profile's rate. Set by
     * zp_hw_attention_unrated; in the plan's JSON only when TRUE. */
    gboolean attention_unrated;
    ZpReduceDtype reduce_dtype; /* the gradients' dtype (the zero value) or another */
    int gpus_per_node;    /* GPUs of a node (the cluster's), for ZeRO++'s node groups; 0:
                           * unknown, one node holds every data-parallel rank */
    ZpImplKind impl;            /* DeepSpeed (the zero value), FSDP or the paper */
    /* The kernel inventory (zp_inventory) the GPU's compute is costed from: "" follows impl;
     * else an inventory's name (--kernels). */
    char kernels[16];
    ZpPipeConfig pipe;          /* pipeline stages; the zero value is none */
    ZpRankOrder rank_order;     /* where the ranks sit: tp-dp-pp (the zero value) or tp-pp-dp */
    gboolean sequence_parallel; /* Megatron's sequence parallelism over the TP group */
    ZpExpertConfig experts;     /* expert parallelism (a mixture of experts only) */
    /* List zreal's own workspace on its CPU backend in the schedule (zp_cost_op_workspace_bytes,
     * zp_cost_resident_workspace_bytes): `simulate` sets it for a profile measured there. */
    gboolean backend_workspace;
    /* Compute every block as one op where the implementation computes it module by module
     * (DeepSpeed's stage 3: ZpImpl module_compute): the coarser schedule the module ops are
     * checked against (their costs sum to its block ops', their gathered peak is no higher
     * in the tests' plans). Not in the plan's JSON. */
    gboolean block_compute;
    /* Take every stage-3 gather's buffer only after the compute op before it, where the
     * implementation's host runs ahead (DeepSpeed's: ZpImpl host_runahead, zp_runahead.h): the
     * schedule the run-ahead's bound is taken from and checked against. Not in the plan's
     * JSON. */
    gboolean no_runahead;
    /* The micro-steps of the step a schedule built short stands for (zp_sched_build_short: the
     * fold counts the missing steady periods as virtual ones, sim_fold.c), which a cost
     * averaged over the step's micro-steps is taken over (ZpInvDims.accum_share), so that each
     * micro-step's ops cost what the long schedule's do. 0: grad_accum. Not in the plan's
     * JSON. */
    int step_grad_accum;
} ZpPlan;

/* The expert-parallel degree and the router's skew: at least 1 each. */
static inline int zp_plan_ep(const ZpPlan *plan)
{
    return plan->experts.ep > 1 ? plan->experts.ep : 1;
}
static inline double zp_plan_expert_skew(const ZpPlan *plan)
{
    return plan->experts.skew > 1 ? plan->experts.skew : 1.0;
}
/* The ranks each expert is split over (ZpExpertConfig.etp): as set, else the framework's
 * default: the TP degree under Megatron-Core (--expert-tensor-parallel-size defaults to it) and
 * the paper's, 1 under DeepSpeed (deepspeed.moe.layer.MoE's enable_expert_tensor_parallelism
 * is False by default, and AutoEP's routed experts are not TP-replicated: whole experts, the
 * EP group across the tensor ranks). */
static inline int zp_plan_etp(const ZpPlan *plan)
{
    return plan->experts.etp > 0           ? plan->experts.etp
           : plan->impl == ZP_IMPL_DEEPSPEED ? 1
                                             : plan->mp;
}
/* The expert-data-parallel degree: the ranks holding the same experts' same slices, the
 * stage's mp x dp ranks over ETP x EP (dp / EP where experts split over TP). */
static inline int zp_plan_edp(const ZpPlan *plan)
{
    return plan->mp * plan->dp / (zp_plan_etp(plan) * zp_plan_ep(plan));
}

/* The micro-steps of the step the plan's schedule stands for (ZpPlan.step_grad_accum). */
static inline int zp_plan_step_grad_accum(const ZpPlan *plan)
{
    return plan->step_grad_accum > 0 ? plan->step_grad_accum : plan->grad_accum;
}

/* Pipeline stages P and model chunks per stage V of a plan: at least 1 each. */
static inline int zp_plan_pp(const ZpPlan *plan)
{
    return plan->pipe.stages > 1 ? plan->pipe.stages : 1;
}

/* A rank i + inner (m + middle o) of the mixed radix (inner, middle, outer), its two outer
 * digits swapped: i + inner (o + outer m). */
static inline int64_t zp_rank_swap_outer(int64_t rank, int64_t inner, int64_t middle,
                                         int64_t outer)
{
    return rank % inner + inner * (rank / (inner * middle) + outer * (rank / inner % middle));
}
/* Where zplan's rank `rank` (tp fastest, then stage, then dp: ZpRankOrder) sits in the
 * world's `order`, with mp tensor ranks, dp replicas and pp stages: the same rank under
 * tp-pp-dp; under tp-dp-pp tp + mp (dp index + dp stage). zp_rank_of_placed is the inverse. */
static inline int64_t zp_rank_placed(ZpRankOrder order, int64_t mp, int64_t dp, int64_t pp,
                                     int64_t rank)
{
    return order == ZP_ORDER_TP_DP_PP ? zp_rank_swap_outer(rank, mp, pp, dp) : rank;
}
static inline int64_t zp_rank_of_placed(ZpRankOrder order, int64_t mp, int64_t dp, int64_t pp,
                                        int64_t placed)
{
    return order == ZP_ORDER_TP_DP_PP ? zp_rank_swap_outer(placed, mp, dp, pp) : placed;
}
static inline int64_t zp_plan_placed_rank(const ZpPlan *plan, int64_t rank)
{
    return zp_rank_placed(plan->rank_order, plan->mp, plan->dp, zp_plan_pp(plan), rank);
}
static inline int64_t zp_plan_rank_of_placed(const ZpPlan *plan, int64_t placed)
{
    return zp_rank_of_placed(plan->rank_order, plan->mp, plan->dp, zp_plan_pp(plan), placed);
}
/* The world's distance between a DP group's neighbours and a pipeline's stages under the
 * plan's order (zplan's own: mp P and mp). */
static inline int64_t zp_plan_placed_dp_stride(const ZpPlan *plan)
{
    return plan->rank_order == ZP_ORDER_TP_DP_PP ? plan->mp
                                                 : (int64_t)plan->mp * zp_plan_pp(plan);
}
static inline int64_t zp_plan_placed_pp_stride(const ZpPlan *plan)
{
    return plan->rank_order == ZP_ORDER_TP_DP_PP ? (int64_t)plan->mp * plan->dp : plan->mp;
}
static inline int zp_plan_vstages(const ZpPlan *plan)
{
    return plan->pipe.virtual_stages > 1 ? plan->pipe.virtual_stages : 1;
}

/* DeepSpeed's size knobs as command-line flags, in this order: --reduce-bucket-size,
 * --allgather-bucket-size, --prefetch-bucket-size, --max-live-parameters,
 * --persistence-threshold, --max-reuse-distance. Shared by zplan and zreal so both refuse the
 * same values. */
typedef enum {
    ZP_KNOB_REDUCE_BUCKET,
    ZP_KNOB_ALLGATHER_BUCKET,
    ZP_KNOB_PREFETCH_BUCKET,
    ZP_KNOB_MAX_LIVE,
    ZP_KNOB_PERSISTENCE,
    ZP_KNOB_MAX_REUSE,
    ZP_KNOB_N
} ZpZeroKnob;

/* The flag's name ("--reduce-bucket-size"). */
const char *zp_zero_knob_flag(ZpZeroKnob knob);

/* Sets the knob from a flag's text: a whole number of elements, at least DeepSpeed's least
 * value (1 for the all-gather bucket, which DeepSpeed divides by; 0 for the others), at most
 * 1e15.
 * Fails naming the flag. */
gboolean zp_zero_knob_set(ZpZeroConfig *zero, ZpZeroKnob knob, const char *text,
                          GError **error);

/* DeepSpeed's defaults (deepspeed/runtime/zero/config.py): buckets 5e8 elements, overlap_comm
 * true only for stage 3, prefetch 5e7, persistence 1e5, live/reuse 1e9; no offload, with
 * offload_config.py's defaults for when one is asked for (zp_offload_defaults). */
void zp_zero_config_defaults(ZpZeroConfig *zero, int stage);

/* offload_config.py's defaults: device none, pin_memory true (v0.19.6; older releases
 * defaulted to false), buffer_count 4 for the optimizer and 5 for parameters, buffer_size
 * 1e8, max_in_cpu 1e9, ratio 1. */
void zp_offload_defaults(ZpOffload *offload, gboolean param);

/* "none", "cpu", "nvme", and back; the parser fails naming the flag or key. */
const char *zp_offload_device_name(ZpOffloadDevice device);
gboolean zp_offload_device_parse(const char *text, const char *flag, ZpOffloadDevice *out,
                                 GError **error);

/* A plan with the given stage and degrees and DeepSpeed defaults elsewhere: micro-batch 1,
 * no accumulation, no checkpointing, fp16 mixed precision with Adam. */
void zp_plan_defaults(ZpPlan *plan, int stage, int dp, int mp);

ZpStateBytes zp_plan_state_bytes(ZpPrecision precision, ZpOptimizer optimizer);

/* Bytes an Adam-like step moves per element it updates: it reads the gradient, reads and
 * writes every optimizer state (the master copy included) and writes the parameter. */
double zp_plan_step_bytes(ZpStateBytes st);

/* K's optimizer part split into bytes per element of the fp32 master copy and the two
 * moments (the second 0 for optimizers with one), as the schedule and offload tiers hold them. */
void zp_plan_optimizer_split(const ZpPlan *plan, double *master, double *m, double *v);

/* Bytes of one element of the 16-bit (or 32-bit) working precision. */
double zp_plan_elem_bytes(ZpPrecision precision);

/* Bytes per element of the gradients on the wire and in the reduce buckets. */
double zp_plan_reduce_bytes(const ZpPlan *plan);

/* Whether the kernel keeps no s x s scores for backward (every kernel but eager): how
 * activation memory is sized. */
gboolean zp_attention_fused(ZpAttention attention);
/* Whether the kernel may run without a rate in the profile, its work counted as eager
 * attention's (mem-efficient); FlashAttention's kernels need their rate. */
gboolean zp_attention_eager_work_unrated(ZpAttention attention);
/* Whether the plan's attention FLOPs run at a fused kernel's table rate (attn_flops, the
 * fused share, no softmax bytes): a fused kernel that is not attention_unrated. How time is
 * counted; memory follows zp_attention_fused. */
gboolean zp_plan_attention_rated(const ZpPlan *plan);

/* Name <-> enum for flags and JSON; the parsers fail naming the flag and the choices. */
const char *zp_attention_name(ZpAttention attention);
gboolean zp_attention_parse(const char *text, const char *flag, ZpAttention *out,
                            GError **error);
const char *zp_reduce_dtype_name(ZpReduceDtype dtype);
gboolean zp_reduce_dtype_parse(const char *text, const char *flag, ZpReduceDtype *out,
                               GError **error);
const char *zp_impl_name(ZpImplKind impl);
/* Activation recomputation as --recompute names it: none, selective (Megatron's core
 * attention) or full (every block from its checkpoint, --checkpoint). */
typedef enum { ZP_RECOMPUTE_NONE, ZP_RECOMPUTE_SELECTIVE, ZP_RECOMPUTE_FULL } ZpRecompute;
const char *zp_recompute_name(ZpRecompute r);
gboolean zp_recompute_parse(const char *text, const char *flag, ZpRecompute *out,
                            GError **error);
ZpRecompute zp_plan_recompute(const ZpPlan *plan);
void zp_plan_set_recompute(ZpPlan *plan, ZpRecompute r);
gboolean zp_impl_parse(const char *text, const char *flag, ZpImplKind *out, GError **error);
const char *zp_precision_name(ZpPrecision precision);
const char *zp_optimizer_name(ZpOptimizer optimizer);
gboolean zp_precision_parse(const char *text, const char *flag, ZpPrecision *out,
                            GError **error);
gboolean zp_optimizer_parse(const char *text, const char *flag, ZpOptimizer *out,
                            GError **error);

/* The pipeline's schedule and partition method by name (zp_pipe uses them). */
const char *zp_pipe_schedule_name(ZpPipeSchedule schedule);
gboolean zp_pipe_schedule_parse(const char *text, const char *flag, ZpPipeSchedule *out,
                                GError **error);
const char *zp_partition_name(ZpPartition partition);
/* "tp-dp-pp" or "tp-pp-dp" (ZpRankOrder). */
const char *zp_rank_order_name(ZpRankOrder order);
const char *zp_dispatcher_name(ZpDispatcher dispatcher);
/* The all-gather dispatcher is Megatron-Core's (--impl megatron); its ETP x EP group under a
 * pipeline (ETP tensor ranks of each of EP dp ranks: runs, zp_sched_graph.h) is one run of
 * ranks on the nodes only under the tp-dp-pp order, which zplan's placement needs; else one
 * line naming `flag`. TRUE for the all-to-all. */
gboolean zp_plan_dispatcher_check(const ZpPlan *plan, const char *flag, GError **error);
/* Expert tensor parallelism: the TP degree or 1 (zp_plan_etp's defaults); whole experts (1)
 * under TP > 1 only for Megatron-Core and DeepSpeed; with a pipeline, EP a multiple or a
 * divisor of TP (its groups whole tensor groups of EP / TP dp ranks, or EP tensor ranks of
 * one), and unless EP is TP, the tp-dp-pp order (where those groups are runs of ranks on the nodes), and Megatron's
 * ETP x EP = TP with a pipeline under tp-pp-dp (which Megatron asserts); else one line naming
 * `flag`. `experts`: the model has a mixture of experts (without one, only a degree
 * other than 1 and TP fails). EP's divisibility is zp_ep_check's. */
gboolean zp_plan_etp_check(const ZpPlan *plan, gboolean experts, const char *flag,
                           GError **error);
/* "alltoall" or "allgather" (Megatron's names) into *out; else one line naming `flag`. */
gboolean zp_dispatcher_parse(const char *text, const char *flag, ZpDispatcher *out,
                             GError **error);
gboolean zp_rank_order_parse(const char *text, const char *flag, ZpRankOrder *out,
                             GError **error);
gboolean zp_partition_parse(const char *text, const char *flag, ZpPartition *out,
                            GError **error);

/* ---- the offload sections of zero_optimization ---- */

/* Checks the plan's offload settings: offload_optimizer needs stage >= 1, offload_param stage
 * 3, ratio below 1 stage 3 (DeepSpeed's own asserts); fails naming the setting. */
gboolean zp_offload_check(const ZpPlan *plan, GError **error);

/* Reads zero_optimization.offload_optimizer or .offload_param (`param`) into *offload:
 * device, pin_memory, buffer_count, buffer_size and max_in_cpu (param), ratio (optimizer),
 * nvme_path; the options zplan does not model (pipeline_read, pipeline_write, fast_init,
 * super_offload, cpuadam_cores_perc) warn. Unknown keys and bad values fail naming the key.
 * A missing section leaves the defaults. */
gboolean zp_offload_from_json(void *section, const char *what, gboolean param,
                              ZpOffload *offload, GPtrArray *warnings, GError **error);

/* Adds "offload_optimizer" and "offload_param" to a zero_optimization object (json_t *) as
 * DeepSpeed reads them, each only where its device is not none. */
void zp_offload_add_json(void *zero, const ZpOffload *optimizer, const ZpOffload *param);

/* The plan as JSON ({"stage", "dp", "mp", "micro_batch", "grad_accum", "checkpoint",
 * "precision", "optimizer", "attention", "reduce_dtype", "impl", "zero": {DeepSpeed's
 * zero_optimization keys}, "activation_checkpointing": {DeepSpeed's keys}}) and back; the
 * reader names the first missing, unknown or ill-typed key ("attention", "reduce_dtype",
 * "impl", "activation_checkpointing" and the ZeRO++ keys may be absent: eager, the
 * gradients', paper (the semantics of every file written before "impl" existed) and
 * DeepSpeed's defaults). */
void *zp_plan_to_json(const ZpPlan *plan);
gboolean zp_plan_from_json(void *json_object, const char *what, ZpPlan *plan, GError **error);

#endif
