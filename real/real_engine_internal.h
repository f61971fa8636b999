/* real_engine_internal: what the engine's files share (real_engine.c's set-up and step,
 * real_engine_compute.c's allocs, frees and compute ops, real_engine_comm.c's collectives and
 * offload transfers): the engine's state and the helpers that read it. Private to real/. */
#ifndef REAL_ENGINE_INTERNAL_H
#define REAL_ENGINE_INTERNAL_H

#include "real_engine_base.h"
#include "real_engine_ds.h"
#include "real_engine_fw.h"
#include "real_offload.h"
#include "real_zeror.h"
#include "zp_mem.h"
#include "zp_sched.h"

typedef struct RealEngineMoe RealEngineMoe;

struct RealEngine {
    const ZpSchedule *s;
    RealBackend *be;
    RealComm *comm;
    RealGpt *gpt;
    RealGptDims dims;
    RealTrainConfig cfg;
    int stage, dp, rank, L;
    uint64_t step;
    int64_t adam_step;

    /* Model states, laid out as zp_sched's layout() says. */
    RealBf16 *params, *grads;
    float *master, *adam_m, *adam_v;
    uint64_t opt_elems;   /* elements of the optimizer partition */
    uint64_t part_base;   /* stages 1-2: offset of this rank's partition in params/grads */
    uint64_t *part_off;   /* stage 3: offset of unit u's slice in the partition arrays */
    RealBf16 **persistent; /* stage 3: full copies of persistent units */

    /* Buffers by schedule id, and the flat range a bucket id covers. */
    void **buffers;
    uint64_t *bucket_lo, *bucket_hi;
    int n_buffers;
    int *ckpt_buffer;       /* per (micro-step, unit): its checkpoint buffer id (slot()) */
    int *ckpt_slice;        /* Pa at mp > 1: per (micro-step, unit) the id of the GPU buffer
                             * holding this rank's slice from forward to the gather */
    uint64_t ckpt_slice_off, ckpt_slice_bytes; /* this rank's slice of a block input: at
                             * tp_rank x 2bsh/M with Pa at mp > 1, the whole input at 0 else */
    void **stash;           /* per (micro-step, unit): a block's saved activations from its
                             * forward to its backward (without checkpointing) */
    float **head_dx;        /* per micro-step: a pipeline's head output gradient kept until
                             * the micro-step's backward, when other forwards come first */
    RealBf16 **unit_params; /* where each unit's full parameters are now */
    RealBf16 **unit_grads;  /* where backward accumulates each unit's gradients */

    /* ZeRO++ (qwZ, hpZ): hpZ's node communicator and secondary partitions per unit; per
     * gathered buffer id, qwZ's int8 buffer id and the gather's group, from the quantize op
     * to the dequantize op (a unit may have two gathers in flight). */
    RealComm *hpz_comm;
    RealBf16 **secondary;
    int *quant_of, *quant_group;
    RealComm *qgz_node, *qgz_cross; /* qgZ: the node's ranks; this node index's, a node each */
    int qgz_work;                   /* qgZ: the bucket's int4 workspace buffer id */
    uint64_t qgz_work_bytes;        /* and its size */

    RealBf16 *x;  /* residual stream [b s, h] */
    float *dx;    /* its gradient */
    int *tokens, *targets;
    double loss_sum;
    RealOpTiming timing[REAL_ENGINE_N_OP_TYPES];
    GArray *marks; /* this step's device-timed ops (PendingMark), resolved at its end */
    double model_state_bytes;
    RealOffload *offload; /* the host and NVMe tiers, with offload */
    gboolean host_grads;  /* stages 2-3 with optimizer offload: no gradient partition here */
    gboolean host_params; /* stage 3 with parameter offload: the partition is off the GPU */
    RealDs *ds;           /* DeepSpeed's stages 2-3 (real_engine_ds): its gradients, gathers */
    /* A framework's plug-in (real_engine_fw.h: Megatron's, FSDP2's), which holds the model
     * states as the framework lays them out, and its state; NULL: none. */
    const RealFwOps *fw_ops;
    void *fw;
    /* Stage 1 whose full gradients the schedule takes and frees unit by unit (zp_impl.h
     * full_grads_transient; unit_grads while taken): full_by_unit, and the buffer id of
     * grads_in_partition, which the reductions copy this rank's partition into, from flat
     * offset gip_lo (the first tensor overlapping the partition), -1 none. */
    gboolean full_by_unit;
    int gip_id;
    uint64_t gip_lo;
    RealCkptHost *ckpt_host; /* the checkpoints' host tier, with cpu_checkpointing */
    RealEngineMoe *moe;      /* a mixture of experts (real_engine_moe.c); NULL: dense */
};

#define fail real_engine_fail

/* Sets of a unit's tensors, bit k for tensor k. */
#define ALL_TENSORS UINT32_MAX
#define WTE_ONLY 1u /* a tied LM head's use of the embeddings */

static inline uint64_t unit_padded(const RealEngine *e, int u)
{
    return zp_mem_padded_elems(e->s->unit_elems[u], (uint64_t)e->dp);
}

/* The index of unit u in micro-step `micro` of a per-(micro-step, unit) array: a pipeline
 * stage has several micro-steps between their forwards and backwards. */
static inline gsize slot(const RealEngine *e, int u, int micro)
{
    return (gsize)micro * (gsize)(e->L + 2) + (gsize)u;
}

static inline gboolean is_persistent(const RealEngine *e, int u)
{
    return zp_sched_unit_persistent(e->s, u);
}

static inline void *take(RealEngine *e, uint64_t bytes, ZpMemCategory cat, GError **error)
{
    return real_engine_alloc(e->be, e->rank, bytes, cat, error);
}

/* hpZ: a unit gathered whole over the DP group leaves this rank its 1/size slice in the
 * node (_partition_param_sec: secondary_start = its size x rank in the group). */
static inline void keep_secondary(RealEngine *e, int u, ZpGroup group, const RealBf16 *full)
{
    if (!e->hpz_comm || group != ZP_GROUP_DP || !e->secondary[u])
        return;
    const uint64_t n = unit_padded(e, u) / (uint64_t)e->hpz_comm->size;
    e->be->copy(e->be, e->secondary[u], full + (uint64_t)e->hpz_comm->rank * n,
                n * sizeof(RealBf16));
}

/* The communicator of a stage-3 gather on `group`. */
static inline RealComm *gather_comm(RealEngine *e, ZpGroup group)
{
    return group == ZP_GROUP_HPZ ? e->hpz_comm : e->comm;
}

/* What this rank contributes to a stage-3 gather of unit u: its partition (the DP group) or
 * its secondary slice (hpZ's group in backward). */
static inline const RealBf16 *gather_source(RealEngine *e, int u, ZpGroup group)
{
    return group == ZP_GROUP_HPZ ? e->secondary[u] : e->params + e->part_off[u];
}

/* This rank's slice of a block input held at `input` (the whole input without Pa). */
static inline void *block_input_slice(const RealEngine *e, void *input)
{
    return (char *)input + e->ckpt_slice_off;
}

/* real_engine_compute.c: an alloc or free op (the index is the op's in the schedule), a
 * compute op, and the tied embeddings' gradients the step sums over the pipeline. */
gboolean real_engine_do_alloc(RealEngine *e, guint index, const ZpOp *op, GError **error);
gboolean real_engine_do_free(RealEngine *e, const ZpOp *op, GError **error);
gboolean real_engine_do_compute(RealEngine *e, const ZpOp *op, GError **error);
gboolean real_engine_tied_grads(RealEngine *e, RealBf16 **grads, size_t *n, GError **error);

/* real_engine_moe.c: a mixture of experts — its groups (before the model is made: they set
 * dims.ep_rank), its expert space's states, a sparse unit's view (dense tensors from `dense`,
 * the experts from the expert space), its allocs, collectives over the EP and EDP groups and
 * compute ops (the block's forward up to fc1, the experts, unpermute, the block's backward
 * from fc1), the experts' Adam step, and the step's fresh expert gradients. `handled`: the op
 * was the experts' (the caller does nothing more). */
gboolean real_engine_moe_groups(RealEngine *e, GError **error);
gboolean real_engine_moe_states(RealEngine *e, GError **error);
void real_engine_moe_free(RealEngine *e);
gboolean real_engine_moe_sparse(const RealEngine *e, int u);
uint32_t real_engine_moe_expert_tensors(const RealEngine *e, int u);
gboolean real_engine_moe_view(RealEngine *e, int u, const RealBf16 *dense, gboolean grads,
                              RealGptTensors *v, GError **error);
/* The experts' slots of a DeepSpeed plug-in's view of unit u (its dense slots left as they
 * are): the expert space is the engine's under every implementation. */
void real_engine_moe_view_experts(RealEngine *e, int u, gboolean grads, RealGptTensors *v);
gboolean real_engine_moe_alloc(RealEngine *e, guint index, const ZpOp *op, gboolean *handled,
                               GError **error);
void real_engine_moe_freed(RealEngine *e, const void *p);
gboolean real_engine_moe_collective(RealEngine *e, const ZpOp *op, gboolean *handled,
                                    GError **error);
gboolean real_engine_moe_block_forward(RealEngine *e, const ZpOp *op, const RealGptTensors *p,
                                       const RealBf16 *x_in, gboolean save, GError **error);
gboolean real_engine_moe_block_backward(RealEngine *e, const ZpOp *op, const RealGptTensors *p,
                                        const RealGptTensors *g, GError **error);
gboolean real_engine_moe_compute(RealEngine *e, const ZpOp *op, const RealGptTensors *p,
                                 const RealGptTensors *g, GError **error);
void real_engine_moe_optimizer(RealEngine *e, const RealAdamHyper *hyper);
void real_engine_moe_start_step(RealEngine *e);

/* real_engine_comm.c: a collective op, and an offload transfer op. */
gboolean real_engine_do_collective(RealEngine *e, const ZpOp *op, GError **error);
gboolean real_engine_do_transfer(RealEngine *e, const ZpOp *op, GError **error);

#endif
