/* zp_ep: expert parallelism for a mixture of experts — which EP degrees a plan may take, the
 * model states per rank (experts over EP, ZeRO over the expert-data-parallel group), the
 * tokens, buffers and activations of a sparse layer, and its all-to-all dispatch and combine. */
#ifndef ZP_EP_H
#define ZP_EP_H

#include "zp_hw.h"
#include "zp_sched_graph.h"
#include "zp_mem_terms.h"
#include "zp_model.h"
#include "zp_plan.h"

#include <glib.h>

/* EP must divide the routed experts and the data-parallel degree (DeepSpeed's
 * groups._create_expert_and_data_parallel and Megatron-Core's parallel_state carve the EP group
 * out of the data-parallel ranks); EP > 1 needs a mixture of experts. `flag` names the option
 * in the one-line refusal. */
gboolean zp_ep_check(const ZpModel *model, const ZpPlan *plan, const char *flag, GError **error);

/* The dispatcher (ZpDispatcher): the all-gather one needs a mixture of experts, then
 * zp_plan_dispatcher_check (Megatron's; TP 1, EP 1 or no pipeline). `flag` names the option
 * in the refusal. */
gboolean zp_ep_dispatcher_check(const ZpModel *model, const ZpPlan *plan, const char *flag,
                                GError **error);

/* Elements of all routed experts of all sparse layers (the expert parameters; the rest, router
 * and shared experts included, are dense parameters). */
double zp_ep_expert_params(const ZpModel *model);

typedef struct {
    double expert_params; /* per rank: expert elements / (EP ETP) */
    double dense_params;  /* per rank: the rest / mp */
    ZpModelStates expert, dense, total;
} ZpEpStates;

/* Model states per rank: the dense parameters under ZeRO `stage` over the dp ranks, the
 * expert parameters (E/EP experts a rank, split over ETP) under the same stage over the
 * zp_plan_edp ranks of the expert-data-parallel group (dp/EP; mp dp/EP with whole experts),
 * as DeepSpeed's stage_1_and_2.py _configure_moe_settings (real_dp_process_group =
 * expert_dp_process_group) and Megatron-Core's get_megatron_optimizer (the expert parameters'
 * optimizer over the expert data-parallel group) partition them. */
ZpEpStates zp_ep_model_states(const ZpModel *model, const ZpPlan *plan, int stage,
                              ZpStateBytes bytes);

typedef struct {
    double tokens;           /* T: tokens a rank routes per micro-batch and sparse layer */
    double routed_tokens;    /* T k: the copies it dispatches */
    double expert_capacity;  /* tokens an expert takes from one rank; 0: dropless */
    double received_tokens;  /* R: tokens the busiest rank's all-to-all receives */
    double expert_tokens;    /* tokens its experts compute: R, or t R where the expert tensor
                              * group gathers what its t ranks received (zp_ep_tp_gather: each
                              * rank routed its own T = b s / t, or dropped all but its 1/t
                              * of the slots), and ETP R
                              * under the all-gather dispatcher (its E/EP experts' share of
                              * the ETP x EP group's tokens) */
    double gathered_tokens;  /* G = ETP EP T: the ETP x EP group's tokens the all-gather
                              * dispatcher gathers to each rank; 0 under the all-to-all */
    double global_buffer_bytes; /* the all-gather dispatcher's gathered tokens, G h e, which
                                 * Megatron keeps in its persistent "mpu" buffer (zp_ep.c); 0
                                 * where it gathers nothing */
    double regathered_bytes; /* DeepSpeed's all-gather over TP of the slots its ranks dropped
                              * (zp_ep_tp_drop t > 1): t R h e, every slot of every expert; 0
                              * elsewhere */
    double router_bytes;     /* fp32 router probabilities [T, E] and int64 top-k indices [T, k] */
    double dispatch_bytes;   /* the dispatch's send and receive buffers, (T k + R) h e, or
                              * 2 R h e with a capacity factor (the send buffer padded too),
                              * and the tensor group's gather, t R h e, where it gathers; the
                              * all-gather dispatcher's probabilities and routing map and
                              * the experts' permuted input, t R h e + G E (e + 1) (its
                              * gathered tokens are global_buffer_bytes) */
    double combine_bytes;    /* the combine's, the same sizes the other way; the all-gather
                              * dispatcher's expert outputs and their unpermuted sum, which it
                              * reduce-scatters: (t R + G) h e */
    double expert_act_bytes; /* the experts' saved inputs and gated MLP over the tokens they
                              * compute: expert_tokens (h + 3 f_e / ETP) e */
    double combine_act_bytes; /* the expert outputs kept for the routing weights' gradient */
    double sparse_layer_bytes; /* one sparse layer's saved activations: attention, shared
                                * experts, router, experts, combine */
    double dense_layer_bytes;  /* one dense layer's (zp_mem_plan_activation_block_bytes, with
                                * latent attention's own tensors where the model has it) */
    double activations_bytes;  /* every layer's, kept for backward (no checkpointing) */
} ZpEpActivations;

/* t where the expert tensor group all-gathers what its ranks' all-to-all received before the
 * experts (and sums their outputs back after, zp_ep_tp_gather_back): the all-to-all
 * dispatcher with experts split over t = ETP > 1 tensor ranks that each dispatched tokens of
 * their own, Megatron-Core's under sequence parallelism and DeepSpeed's after its drop
 * (zp_ep_tp_drop; sharded_moe.py MOELayer.forward gather_tokens where the expert model
 * parallel world size is over 1); else 1 (whole experts take what they received; the
 * all-gather dispatcher's TP x EP gather spans the expert tensor group itself). */
int zp_ep_tp_gather(const ZpPlan *plan);
/* How that gather's t R outputs come back after the experts (and their input gradients
 * before them): Megatron-Core's reduce-scatter, DeepSpeed's all-reduce (its expert's
 * row-parallel fc2 forward, its column-parallel fc1's input gradient backward). */
ZpCollKind zp_ep_tp_gather_back(const ZpPlan *plan);

/* t where DeepSpeed's MoE layer drops the tensor ranks' duplicate tokens (sharded_moe.py
 * MOELayer.forward: with TP > 1 every tensor rank holds the whole sequence, and drop_tokens
 * keeps 1/t of each expert's slots before the all-to-all, whole experts or split; after the
 * combine's all-to-all gather_tokens all-gathers them over TP for the combine, and backward
 * the drop's backward all-gathers the dispatched slots' gradients): DeepSpeed over TP t > 1;
 * else 1. R then counts the rank's 1/t. */
int zp_ep_tp_drop(const ZpPlan *plan);
/* What that drop needs: the duplicate tokens it drops (no sequence parallelism, whose tensor
 * ranks hold their own tokens: DeepSpeed's MoE layer does not know it and would drop them
 * too), and with a capacity factor each expert's slots a multiple of t (mappings.py
 * _drop_tokens asserts it); else one line naming the key. TRUE where nothing drops. */
gboolean zp_ep_drop_check(const ZpModel *model, const ZpPlan *plan, GError **error);

/* Whether a sparse block's MLP ends in a tensor-parallel sum (Megatron's row-parallel fc2):
 * with shared experts it does (Megatron-Core's SharedExpertMLP: its fc1 gathers the sequence,
 * its fc2 reduce-scatters it), and under the all-to-all dispatcher without sequence
 * parallelism experts split over TP leave partial outputs summed over the tensor group; else
 * the expert tensor group (zp_ep_tp_gather) or the all-gather dispatcher's TP x EP group
 * sums them itself, or whole experts (ETP 1) return them whole, and the block keeps
 * the attention's sum alone. TRUE at TP 1. */
gboolean zp_ep_sparse_mlp_sums(const ZpModel *model, const ZpPlan *plan);

/* One collective of the all-gather dispatcher over its ETP x EP group (ZP_GROUP_TPEP): its
 * kind and its whole G-row buffer (an all-gather's output, a reduce-scatter's input). */
typedef struct {
    ZpCollKind kind;
    double elems, bytes;
} ZpEpGatherColl;

/* A sparse layer's all-gather dispatcher collectives in one direction, in order, around the
 * experts (token_dispatcher.py MoEAllGatherTokenDispatcher): forward the routing map (a byte
 * an element), the probabilities (the logits' dtype, the model's) and the tokens gathered
 * before, the unpermuted tokens' sum reduce-scattered after; backward (the transposes) the
 * outputs' gradients gathered before, the tokens' and the probabilities' gradients
 * reduce-scattered after (the routing map has none). None over one rank (ETP x EP 1: the
 * dispatcher communicates only where the expert tensor group or EP is above 1). The
 * schedule's ops (zp_build_moe.c), its checker and the search's closed form all read it. */
typedef struct {
    ZpEpGatherColl before[3], after[2];
    int n_before, n_after;
} ZpEpGatherPass;

ZpEpGatherPass zp_ep_gather_pass(const ZpModel *model, const ZpPlan *plan, gboolean backward);

/* A plan's sparse-layer tokens, buffers and activations per rank (16-bit activations in the
 * plan's precision; T = b s, over t with sequence parallelism). */
ZpEpActivations zp_ep_activations(const ZpModel *model, const ZpPlan *plan);

typedef struct {
    double send_bytes;       /* a rank's buffer for one all-to-all (busiest rank: x skew) */
    double intra_bytes;      /* of it, to peers on its node */
    double inter_bytes;      /* to peers on other nodes */
    double time_s;           /* one all-to-all */
    int calls_per_layer;     /* per sparse layer and micro-batch: dispatch and combine, forward
                              * and backward (and the recomputed forward's two) */
    double step_bytes;       /* a rank's all-to-all bytes sent per optimizer step */
    double step_time_s;      /* their time per step (not overlapped) */
} ZpEpAlltoall;

/* The all-to-all of a sparse layer over the EP group, as NCCL runs it: ncclSend/ncclRecv to
 * each peer at once (no ring, no tree). Peers on the node go over NVLink at the GPU's
 * intra-node rate; peers on other nodes through the node's NICs, which every GPU of the node
 * shares. The slowest rank sets the pace, so the skew scales the busiest rank's bytes. */
ZpEpAlltoall zp_ep_alltoall(const ZpModel *model, const ZpPlan *plan, const ZpHw *hw);

/* One such all-to-all of `send_bytes` a rank (its own slice included) over `ranks` members,
 * `on_node` of them on each member's node, while `node_ranks` GPUs of every node run one at
 * once: max(NVLink's chunks at intra_node_bytes_per_s, the node's inter-node chunks at
 * inter_node_bytes_per_s) plus one hop's latency per level crossed. 0 for one rank. */
double zp_ep_alltoall_time_s(const ZpHw *hw, double send_bytes, int ranks, int on_node,
                             int node_ranks);

#endif
