/* zp_sched: builds one optimizer step's op graph for a rank, in the order the host would
 * issue the ops (so in-order streams behave like CUDA streams), and reads/writes it as JSON.
 *
 * The step: for each micro-step, forward (embedding, blocks, head), backward (blocks in
 * reverse, embedding), gradient buckets launched where the implementation's rules put them
 * (after the unit or module op whose gradients complete or overflow them); after
 * the last micro-step the optimizer on this rank's partition and, for stages 1-2, the
 * all-gather of the updated parameters. Stage 3 gathers parameters before use and frees them
 * after. Which buckets, buffers, gathers and step buffers: the plan's implementation's rules
 * (zp_impl.h), which this one builder calls through. */
#include "zp_sched.h"
#include "zp_cost_kernels.h"
#include "zp_impl.h"
#include "zp_mem.h"
#include "zp_pipe.h"
#include "zp_offload.h"
#include "zp_runahead.h"
#include "zp_schedcheck.h"
#include "zp_util.h"
#include "zp_zeror.h"
#include "zp_zeropp.h"

#include <math.h>
#include <string.h>

#define NONE UINT32_MAX
/* A dependency on another stage's p2p send, filled in once every stage is built. */
#define CROSS (UINT32_MAX - 1)

typedef struct {
    ZpBucketSpec spec;
    int buffer;          /* bucket buffer id once allocated, -1 before (or none) */
    uint32_t alloc_op, coll_op;
    uint32_t drain_op;   /* the op after which its buffer is free: the collective, or the
                          * copy of its slice to the host (optimizer offload) */
    int slot;            /* the held buffer it is reduced through (held_slot), -1 none */
} Bucket;

/* A gradient handed on while its held bucket buffer still holds an earlier bucket (ZpImpl
 * grads_by_module): it waits in workspace buffer `buffer` of `bytes` until it is copied in. */
typedef struct {
    guint bucket;
    int buffer, unit;
    double bytes;
} Wait;

/* A stage-3 gather, one of its coalesced call's (zp_impl.h ZpFetch: joins_previous). The
 * call's fields are its first gather's (`call` names it). */
typedef struct {
    ZpFetch fetch;
    int buffer;            /* its parameters' buffer */
    double bytes;          /* and that buffer's size */
    uint32_t coll_op;      /* what its compute waits for: the call's gather, or its unpack */
    guint call, n;         /* its call's first gather; that one: the call's gathers */
    uint64_t call_elems;   /* the call's elements (each gather padded to its group) */
    int flat;              /* the call's flat buffer until its last gather's use (n > 1) */
    int last_use;          /* the call's last gather's use (its step key: step_key) */
    int quant_buffer;      /* qwZ: the call's gathered int8 and scales, until dequantised */
    gboolean unpacked;
} Gather;

/* Items listed by the compute step they belong to: items[start[k] .. start[k+1]), k the
 * step's key (step_key). */
typedef struct {
    guint *start, *items;
} PosIndex;

typedef struct {
    ZpSchedule *s;
    const ZpImpl *impl;
    ZpStateBytes state;
    int next_buffer;
    uint32_t last_compute;  /* last compute op emitted */
    uint32_t last_on_stream[ZP_STREAM_N]; /* last compute or collective op of each stream */
    GArray *sync_deps;      /* collectives the next compute op must wait for (overlap off) */
    GArray *pos_last_op;    /* per position of the micro-step: its last compute op */
    GArray *buckets;        /* Bucket */
    GArray *tensors;        /* zp_impl_tensors, once a bucket is reduced tensor by tensor */
    guint *unit_first, *unit_last; /* per unit: the buckets holding its gradients */
    GArray *launch;         /* buckets by launch unit: launch[start[u] .. start[u+1]) */
    guint *launch_start;
    int n_ipg;              /* bucket buffers held through the backward (0: per bucket) */
    double ipg_bytes;
    int ipg[2];             /* their buffer ids */
    uint32_t ipg_alloc[2], ipg_last[2]; /* their alloc ops and last collectives */
    int occupant[2];        /* the bucket whose gradients a held buffer holds, -1 none */
    GArray *waits;          /* Wait, in the order the gradients were handed on */
    int grad_copy;          /* a later micro-step's gradient copy (ZpImpl grad_copy_elems) */
    int grad_state;         /* the gradient state once the step's first reduction took it
                             * (ZpImpl grads_taken_by_reduction), -1 before and after */
    double grad_state_bytes; /* its size; 0: the state is held for the whole step */
    gboolean full_by_unit;  /* stages 0-1: the full gradients are taken unit by unit (ZpImpl
                             * full_grads_transient), not the state */
    int *unit_grad;         /* and per unit its buffer while taken, -1 before and after */
    GArray *gathers;        /* Gather */
    PosIndex by_trigger, by_use, by_free; /* gathers by step, in list order */
    int step;               /* the step of the position being built (zp_impl.h) */
    /* The host's run-ahead (ZpImpl host_runahead, zp_runahead.h): the last three events of
     * the allgather stream (the ops the last waited parameters' computes wait for) and of the
     * reductions (buckets' drains), the host's latest wait on each (NONE: none yet), its last
     * gathered alloc, and the gathered allocs zp_runahead_bound bounds (op indices). */
    gboolean runahead;
    uint32_t fetch_event[3], reduce_event[3];
    guint n_fetch_events, n_reduce_events;
    uint32_t fetch_gate, reduce_gate, host_alloc;
    GArray *gated;
    /* Pipelines: the stage being built, the chunks' first units (zp_pipe_partition; chunk c
     * sits on stage c mod P), the send op of every (chunk, micro, direction), the send the
     * next compute op waits for (its send_key; -1: none) and where such dependencies sit in
     * the deps array with the keys they wait for. */
    int stage, n_chunks;
    int *first_unit;
    uint32_t *send_op;
    int64_t recv_key;
    GArray *cross_at, *cross_key; /* uint32_t deps positions, int64_t keys */
    GArray *offloaded;      /* gradient transfers to the host the CPU step waits for */
    int resident;           /* backend_workspace: the run-long workspace's buffer, or -1 */
    int tied_grad;          /* the tied head's wte gradient waiting for the embedding's
                             * backward (ZpImpl tied_grad_waits), or -1 */
    double tied_grad_bytes;
    uint32_t workspace_free; /* and the last op workspace's free (NONE: none yet) */
    /* backend_workspace, a block computed module by module: the workspace its first module's
     * op takes and its last one's frees (zreal's real_gpt run.ws, held through the block's
     * modules), -1 when none is held; `module_step`: the step being emitted, -1 outside
     * such a block */
    int block_workspace, module_step;
    /* backend_workspace under a pipeline: micro-step m's head output gradient, which zreal
     * keeps aside (real_engine.c keep_head_dx) when the stage's next compute op is another
     * micro-step's, until m's backward (-1: none kept) */
    int *head_grad;
} Builder;

/* ---- op emission ---------------------------------------------------------------------- */

/* A compute op's cost: its FLOPs, its typical GEMM's, those of them a fused attention
 * kernel does, and the bytes its memory-bound kernels move. */
typedef struct {
    double flops, gemm_flops, attn_flops, mem_bytes;
} Cost;

static uint32_t emit(Builder *b, ZpOp op, const uint32_t *deps, guint n_deps)
{
    ZpSchedule *s = b->s;
    op.stage = (uint32_t)b->stage;
    op.dep_start = s->deps->len;
    op.n_deps = 0;
    if (b->recv_key >= 0 && (op.kind == ZP_OP_COMPUTE || op.kind == ZP_OP_COLLECTIVE)) {
        /* The first dependency: another stage's send, filled in once it is built. */
        const uint32_t cross = CROSS, at = s->deps->len;
        g_array_append_val(s->deps, cross);
        g_array_append_val(b->cross_at, at);
        g_array_append_val(b->cross_key, b->recv_key);
        b->recv_key = -1;
        op.n_deps++;
    }
    /* The dependencies that are ops, written in place (one resize, not one call each). With
     * none, the array is not touched: an empty GArray's data is NULL, and even a zero offset
     * from it is undefined (clang's UBSan stopped the schedule fuzzer on it). */
    guint n = 0;
    if (n_deps > 0) {
        const guint at = s->deps->len;
        g_array_set_size(s->deps, at + n_deps);
        uint32_t *out = &g_array_index(s->deps, uint32_t, at);
        for (guint i = 0; i < n_deps; i++)
            if (deps[i] != NONE)
                out[n++] = deps[i];
        g_array_set_size(s->deps, at + n);
    }
    op.n_deps += n;
    g_array_append_val(s->ops, op);
    if (op.kind == ZP_OP_COMPUTE || op.kind == ZP_OP_COLLECTIVE)
        b->last_on_stream[op.stream] = s->ops->len - 1;
    return s->ops->len - 1;
}

static uint32_t emit_alloc(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                           int *buffer, const uint32_t *deps, guint n_deps);
static uint32_t emit_free(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                          int buffer, uint32_t after);

/* backend_workspace: the workspace zreal's CPU backend holds from the first compute op to the
 * end of the run (the engine's, unit 0 micro-step 0, so that the engine allocates nothing for
 * it: real_engine.c needed_bytes), then each op's own around it. */
static void workspace_before(Builder *b, ZpComputeKind kind, int unit, int micro,
                             GArray *all, int *buffer)
{
    const ZpSchedule *s = b->s;
    *buffer = -1;
    if (!s->plan.backend_workspace)
        return;
    if (b->resident < 0) {
        const uint32_t at = emit_alloc(b, ZP_MEM_WORKSPACE,
                                       zp_cost_resident_workspace_bytes(&s->model, &s->plan), 0,
                                       0, &b->resident, NULL, 0);
        g_array_append_val(all, at);
    }
    const double bytes = zp_cost_op_workspace_bytes(&s->model, &s->plan, kind);
    if (b->module_step > 0) /* a later module of a block: the first one's is held */
        return;
    if (b->workspace_free != NONE) /* one op's at a time, as the backend runs them */
        g_array_append_val(all, b->workspace_free);
    if (bytes > 0) {
        const uint32_t at = emit_alloc(b, ZP_MEM_WORKSPACE, bytes, unit, micro, buffer,
                                       (const uint32_t *)all->data, all->len);
        g_array_append_val(all, at);
    }
}

static uint32_t emit_compute(Builder *b, ZpComputeKind kind, int unit, int micro, Cost cost,
                             const uint32_t *deps,
                             guint n_deps)
{
    GArray *all = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    int workspace;
    g_array_append_vals(all, deps, n_deps);
    g_array_append_vals(all, b->sync_deps->data, b->sync_deps->len);
    g_array_set_size(b->sync_deps, 0);
    workspace_before(b, kind, unit, micro, all, &workspace);
    ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = kind, .stream = ZP_STREAM_COMPUTE, .unit = unit,
               .micro = micro, .buffer = -1, .flops = cost.flops,
               .gemm_flops = cost.gemm_flops, .attn_flops = cost.attn_flops,
               .mem_bytes = cost.mem_bytes};
    b->last_compute = emit(b, op, (uint32_t *)all->data, all->len);
    g_array_unref(all);
    if (b->module_step == 0)
        b->block_workspace = workspace;
    if (b->module_step == ZP_POS_STEPS - 1)
        workspace = b->block_workspace, b->block_workspace = -1;
    if (workspace >= 0 && (b->module_step < 0 || b->module_step == ZP_POS_STEPS - 1))
        b->workspace_free = emit_free(b, ZP_MEM_WORKSPACE,
                                      zp_cost_op_workspace_bytes(&b->s->model, &b->s->plan,
                                                                 kind),
                                      unit, micro, workspace, b->last_compute);
    return b->last_compute;
}

static uint32_t emit_collective(Builder *b, ZpCollKind kind, ZpGroup group, int unit, int micro,
                                int buffer, uint64_t offset, uint64_t elems, double bytes,
                                const uint32_t *deps, guint n_deps)
{
    ZpOp op = {.kind = ZP_OP_COLLECTIVE, .sub = kind,
               .stream = group == ZP_GROUP_TP ? ZP_STREAM_TP : ZP_STREAM_DP, .group = group,
               .unit = unit, .micro = micro, .buffer = buffer, .bytes = bytes,
               .elem_offset = offset, .elems = elems};
    return emit(b, op, deps, n_deps);
}

/* Emits an alloc; returns the op index and stores the new buffer id in *buffer. */
static uint32_t emit_alloc(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                           int *buffer, const uint32_t *deps, guint n_deps)
{
    *buffer = b->next_buffer++;
    ZpOp op = {.kind = ZP_OP_ALLOC, .sub = cat, .unit = unit, .micro = micro,
               .buffer = *buffer, .bytes = bytes};
    return emit(b, op, deps, n_deps);
}

static uint32_t emit_free(Builder *b, ZpMemCategory cat, double bytes, int unit, int micro,
                          int buffer, uint32_t after)
{
    ZpOp op = {.kind = ZP_OP_FREE, .sub = cat, .unit = unit, .micro = micro, .buffer = buffer,
               .bytes = bytes};
    return emit(b, op, &after, 1);
}

/* A transfer of `bytes` (none when 0: returns `after`) after `after`. */
static uint32_t emit_transfer(Builder *b, ZpTransferKind kind, double bytes, int unit, int micro,
                              uint32_t after)
{
    if (bytes <= 0)
        return after;
    const ZpStream stream =
        kind == ZP_XFER_D2H || kind == ZP_XFER_H2D ? ZP_STREAM_HOST : ZP_STREAM_NVME;
    ZpOp op = {.kind = ZP_OP_TRANSFER, .sub = kind, .stream = stream, .unit = unit,
               .micro = micro, .buffer = -1, .bytes = bytes};
    return emit(b, op, &after, 1);
}

/* An event recorded on a stream after op (a ring of the last three), and the op whose event
 * the host synchronises before recording another, `gate` until three are outstanding:
 * DeepSpeed lets 2 be outstanding (partitioned_param_coordinator.py __max_ongoing_fetch_events,
 * stage3.py max_param_reduce_events) and synchronises the oldest of more (zp_runahead.h). */
static void record_event(uint32_t ring[3], guint *n, uint32_t op)
{
    ring[(*n)++ % 3] = op;
}

static uint32_t host_sync(const uint32_t ring[3], guint n, uint32_t gate)
{
    return n >= 3 ? ring[n % 3] : gate;
}

/* ---- costs of the compute ops ----------------------------------------------------------- */

/* FLOPs and memory-bound bytes of one block's forward on this rank (tensor degree mp), with
 * q = h + 2kd the fused qkv width and f1 = f (plain MLP) or 2f (gated: gate and up):
 * GEMMs 2bs(hq + h^2 + h f1 + f h)/mp, attention scores and values 4bs^2h/mp (the s^2 counted
 * whole, as Megatron's model FLOPs count it). Elementwise work reads and writes: two norms
 * (4bsh), two residual adds (6bsh), the activation (2bsf/mp; a gated unit reads gate and up
 * and writes their product, 3bsf/mp), the eager softmax (2bas^2/mp), in the working
 * precision. A fused attention kernel's work is its own (attn_flops, timed at the kernel's
 * rate, which covers its memory traffic), so it moves no s^2 bytes here. Bias adds ride in
 * the GEMM epilogues. The typical GEMM is the mean of the block's four (five gated). */
static Cost block_forward_cost(const ZpSchedule *s)
{
    const ZpModel *m = &s->model;
    const double b = s->plan.micro_batch, sq = m->seq_len, h = m->hidden, f = m->ffn_hidden;
    const double a = m->heads, mp = s->plan.mp, e = s->elem_bytes;
    const double q = (double)zp_model_qkv_width(m), f1 = (double)zp_model_fc1_width(m);
    const gboolean gated = zp_model_gated(m), fused = zp_attention_fused(s->plan.attention);
    const double gemm = 2 * b * sq * (h * q + h * h + h * f1 + f * h) / mp;
    const double attention =
        4 * b * sq * sq * h / mp * (fused ? zp_model_attention_share(m) : 1.0);
    const double softmax = fused ? 0.0 : 2 * b * a * sq * sq / mp;
    return (Cost){.flops = gemm + attention,
                  .gemm_flops = gemm / (gated ? 5 : 4),
                  .attn_flops = fused ? attention : 0.0,
                  .mem_bytes = e * (10 * b * sq * h / (s->plan.sequence_parallel ? mp : 1) +
                                    (gated ? 3 : 2) * b * sq * f / mp + softmax)};
}

/* A block's backward from its own ops (zp_cost_kernels): the data-gradient and
 * weight-gradient GEMMs of every linear (as many FLOPs as the forward's, each), the attention
 * backward (twice the forward's), and the elementwise traffic of the backward's own kernels
 * (norm and activation backward, bias gradients, the eager softmax's backward), not twice the
 * forward's. */
static Cost block_backward_cost(const ZpSchedule *s)
{
    const Cost fwd = block_forward_cost(s);
    ZpKernels bwd;
    zp_cost_kernels(&s->model, &s->plan, ZP_COMP_BLOCK_BWD, &bwd);
    return (Cost){2 * fwd.flops, fwd.gemm_flops, 2 * fwd.attn_flops,
                  s->elem_bytes * zp_cost_accesses(&bwd)};
}

/* LM head: logits GEMM 2bshV/mp forward and twice that backward; the fp32 softmax and loss
 * read and write the logits four times. */
static Cost head_cost(const ZpSchedule *s)
{
    const ZpModel *m = &s->model;
    const double b = s->plan.micro_batch, sq = m->seq_len, h = m->hidden, V = m->vocab;
    const double logits_gemm = 2 * b * sq * h * V / s->plan.mp;
    return (Cost){.flops = 3 * logits_gemm, .gemm_flops = logits_gemm, .attn_flops = 0,
                  .mem_bytes = 16 * b * sq * V / s->plan.mp};
}

/* Embedding lookup or its scatter-add backward: read token and position rows, write bsh. */
static Cost embed_cost(const ZpSchedule *s)
{
    const double b = s->plan.micro_batch, sq = s->model.seq_len, h = s->model.hidden;
    return (Cost){.flops = 0, .gemm_flops = 0, .attn_flops = 0,
                  .mem_bytes = 3 * b * sq * h * s->elem_bytes};
}

/* Adam-like update (zp_plan_step_bytes). */
static Cost optimizer_cost(const Builder *b, double elems)
{
    return (Cost){.flops = 0, .gemm_flops = 0, .attn_flops = 0,
                  .mem_bytes = elems * zp_plan_step_bytes(b->state)};
}

/* ---- layout and model states --------------------------------------------------------- */

gboolean zp_sched_fetch_allreduce(const ZpPlan *plan, guint n, ZpGroup group)
{
    return plan->impl == ZP_IMPL_DEEPSPEED && plan->zero.stage == 3 &&
           plan->zero.stage3_use_all_reduce_for_fetch_params && n > 1 &&
           !plan->zero.zero_quantized_weights && group == ZP_GROUP_DP;
}

gboolean zp_sched_coll_fetches(const ZpSchedule *s, const ZpOp *op)
{
    return op->kind == ZP_OP_COLLECTIVE &&
           (op->sub == ZP_COLL_ALLGATHER ||
            (op->sub == ZP_COLL_ALLREDUCE && op->group == ZP_GROUP_DP &&
             s->plan.zero.stage == 3));
}

/* The chunk that holds a unit (one chunk without a pipeline). */
static int unit_chunk(const Builder *b, int unit)
{
    int c = 0;
    while (c + 1 < b->n_chunks && b->first_unit[c + 1] <= unit)
        c++;
    return c;
}

/* Whether the stage being built holds the unit: chunk c sits on stage c mod P. */
static gboolean unit_held(const Builder *b, int unit)
{
    return unit_chunk(b, unit) % zp_plan_pp(&b->s->plan) == b->stage;
}

/* A unit's elements on the stage being built, this rank's share of the tensor-parallel group
 * (zp_model_unit_tp_elems): 0 for another stage's. A last stage without
 * the embedding keeps its own copy of a tied word embedding for the LM head (Megatron's
 * pipeline: the first and last stages each hold word_embeddings). */
static uint64_t held_elems(const Builder *b, int unit)
{
    if (!unit_held(b, unit))
        return 0;
    const ZpModel *m = &b->s->model;
    uint64_t elems = zp_model_unit_tp_elems(m, unit, b->s->plan.mp);
    if (unit == (int)m->layers + 1 && m->tied_embeddings && !unit_held(b, 0))
        elems += ((uint64_t)m->vocab + (uint64_t)b->s->plan.mp - 1) / (uint64_t)b->s->plan.mp *
                 (uint64_t)m->hidden; /* its vocabulary rows */
    return elems;
}

/* Unit offsets in the flat space of unit_elems, its total, padding and partition. */
static void place_units(ZpSchedule *s)
{
    const uint64_t dp = (uint64_t)s->plan.dp;
    uint64_t offset = 0, partition3 = 0;
    for (int u = 0; u < s->n_units; u++) {
        s->unit_offset[u] = offset;
        offset += s->unit_elems[u];
        partition3 += zp_sched_unit_padded(s, u) / dp;
    }
    s->total_elems = offset;
    s->padded_elems = zp_mem_padded_elems(offset, dp);
    s->partition_elems = s->plan.zero.stage == 3 ? partition3 : s->padded_elems / dp;
}

/* The flat layout of the units the stage being built holds (all of them without a
 * pipeline): ZeRO partitions each stage's own parameters over its data-parallel group. */
static void layout(Builder *b)
{
    ZpSchedule *s = b->s;
    const int stage = s->plan.zero.stage;
    s->n_units = zp_model_n_units(&s->model);
    g_free(s->unit_offset);
    g_free(s->unit_elems);
    s->unit_offset = g_new0(uint64_t, s->n_units);
    s->unit_elems = g_new0(uint64_t, s->n_units);
    for (int u = 0; u < s->n_units; u++)
        s->unit_elems[u] = held_elems(b, u);
    if (s->stage_unit_elems)
        memcpy(&s->stage_unit_elems[(gsize)b->stage * (gsize)s->n_units], s->unit_elems,
               sizeof(uint64_t) * (gsize)s->n_units);
    place_units(s);

    const double total = (double)s->total_elems, padded = (double)s->padded_elems;
    const double part = (double)s->partition_elems;
    const double p = b->state.param_bytes, g = b->state.grad_bytes;
    double master, m, v;
    zp_plan_optimizer_split(&s->plan, &master, &m, &v);
    const double params_elems[4] = {total, padded, padded, part};
    const double optim_elems = stage == 0 ? total : part;
    s->state_bytes[ZP_MEM_PARAMS] = params_elems[stage] * p;
    const double grads = b->impl->grad_state_elems(s) * g;
    const gboolean taken = b->impl->grads_taken_by_reduction &&
                           b->impl->grads_taken_by_reduction(&s->plan);
    s->state_bytes[ZP_MEM_GRADS] = taken ? 0 : grads;
    b->grad_state_bytes = taken ? grads : 0;
    b->full_by_unit = b->impl->full_grads_transient && b->impl->full_grads_transient(&s->plan);
    s->state_bytes[ZP_MEM_MASTER] = optim_elems * master;
    s->state_bytes[ZP_MEM_ADAM_M] = optim_elems * m;
    s->state_bytes[ZP_MEM_ADAM_V] = optim_elems * v;
    if (stage == 3) { /* the full copies of persistent parameters, hpZ's secondary partition */
        GArray *kept = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
        b->impl->persistent(s, kept);
        double elems = 0;
        for (guint i = 0; i < kept->len; i++)
            elems += (double)g_array_index(kept, ZpFetch, i).elems;
        s->state_bytes[ZP_MEM_GATHERED_PARAMS] = elems * p;
        s->state_bytes[ZP_MEM_SECONDARY_PARAMS] = zp_zeropp_secondary_bytes(s, elems);
        g_array_unref(kept);
    }
    zp_offload_layout(s);
}





double zp_sched_model_state_bytes(const ZpSchedule *s)
{
    return s->state_bytes[ZP_MEM_PARAMS] + s->state_bytes[ZP_MEM_GRADS] +
           s->state_bytes[ZP_MEM_MASTER] + s->state_bytes[ZP_MEM_ADAM_M] +
           s->state_bytes[ZP_MEM_ADAM_V];
}

/* ---- gradient buckets ------------------------------------------------------------------ */

static Bucket *bucket(Builder *b, guint i)
{
    return &g_array_index(b->buckets, Bucket, i);
}

static gboolean own_buffer(const Builder *b, const Bucket *k);

/* The held buffer a bucket is reduced through, -1 none: the buckets that use them take them
 * in turn, in launch order (which is bucket order); a bypassing bucket takes its own at
 * stages 2-3 and none at stages 0-1 (reduced in place). `held`: those counted so far. */
static int held_slot(const Builder *b, const Bucket *k, guint *held)
{
    if (b->n_ipg == 0 || own_buffer(b, k) || k->spec.bypass)
        return -1;
    return (int)((*held)++ % (guint)b->n_ipg);
}

/* The implementation's buckets, indexed by the units they hold and the unit after whose
 * backward they launch. */
static void plan_buckets(Builder *b)
{
    const ZpSchedule *s = b->s;
    GArray *specs = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
    b->impl->plan_buckets(s, specs);
    for (guint i = 0; i < specs->len; i++) {
        Bucket k = {g_array_index(specs, ZpBucketSpec, i), -1, NONE, NONE, NONE, -1};
        g_array_append_val(b->buckets, k);
    }
    g_array_unref(specs);
    memset(b->launch_start, 0, sizeof(guint) * ((gsize)s->n_units + 1));
    for (int u = 0; u < s->n_units; u++)
        b->unit_first[u] = G_MAXUINT, b->unit_last[u] = 0;
    for (guint i = 0; i < b->buckets->len; i++) {
        const ZpBucketSpec *k = &bucket(b, i)->spec;
        for (int u = k->low_unit; u <= k->top_unit; u++) {
            b->unit_first[u] = MIN(b->unit_first[u], i);
            b->unit_last[u] = MAX(b->unit_last[u], i);
        }
        b->launch_start[k->launch_unit + 1]++;
    }
    for (int u = 0; u < s->n_units; u++)
        b->launch_start[u + 1] += b->launch_start[u];
    guint *next = g_memdup2(b->launch_start, sizeof(guint) * (gsize)s->n_units);
    g_array_set_size(b->launch, b->buckets->len);
    for (guint i = 0; i < b->buckets->len; i++)
        g_array_index(b->launch, guint, next[bucket(b, i)->spec.launch_unit]++) = i;
    g_free(next);
    b->n_ipg = b->impl->bucket_buffers(&s->plan, &b->ipg_bytes);
    b->ipg_bytes *= zp_plan_reduce_bytes(&s->plan);
    guint held = 0;
    for (guint i = 0; i < b->buckets->len; i++)
        bucket(b, i)->slot = held_slot(b, bucket(b, i), &held);
}

/* When the implementation's held bucket buffers are taken and given back (zp_impl.h). */
static ZpHeldSpan held_span(const Builder *b)
{
    return b->impl->held_span ? b->impl->held_span(&b->s->plan) : ZP_HELD_PER_BACKWARD;
}

/* Each micro-step's buckets start unlaunched; held buffers taken for the whole step stay. */
static void reset_buckets(Builder *b)
{
    for (guint i = 0; i < b->buckets->len; i++) {
        bucket(b, i)->buffer = -1;
        bucket(b, i)->alloc_op = bucket(b, i)->coll_op = bucket(b, i)->drain_op = NONE;
    }
    const gboolean keep = held_span(b) == ZP_HELD_ALL_STEP;
    for (int i = 0; i < 2; i++) {
        if (!keep || b->ipg[i] < 0)
            b->ipg[i] = -1, b->ipg_alloc[i] = b->ipg_last[i] = NONE;
        b->occupant[i] = -1;
    }
    g_array_set_size(b->waits, 0);
}

/* Whether a bucket takes a buffer of its own: always without held buffers; with them, only
 * a bypassing bucket at stages 2-3 (the gradient autograd allocated, kept until reduced;
 * stages 0-1 reduce a bypassing bucket straight from the full gradients). */
static gboolean own_buffer(const Builder *b, const Bucket *k)
{
    return b->n_ipg == 0 || (k->spec.bypass && b->s->plan.zero.stage >= 2);
}

/* Double buffering: bucket i may take memory only once bucket i-2's collective was issued
 * (DeepSpeed waits on the older ipg buffer before refilling it). */
static uint32_t bucket_backpressure(Builder *b, guint i)
{
    return i >= 2 ? bucket(b, i - 2)->drain_op : NONE;
}

/* The held bucket buffers, allocated as the reducing backward starts (DeepSpeed allocates
 * its ipg buffer pair at the first gradient hook, stage_1_and_2.py setup_buckets), before
 * the step (ZP_HELD_ALL_STEP), or at the first reduction when it runs apart from the backward
 * (a pipeline's, after its flush). */
static void alloc_held_buckets(Builder *b, int micro)
{
    for (int i = 0; i < b->n_ipg && b->ipg[i] < 0; i++)
        b->ipg_alloc[i] = emit_alloc(b, ZP_MEM_BUCKETS, b->ipg_bytes, -1, micro, &b->ipg[i],
                                     &b->last_compute, 1);
}

/* Frees them after their last reduction, or after op `after` when it is not NONE. */
static void free_held_buckets(Builder *b, int micro, uint32_t after)
{
    for (int i = 0; i < b->n_ipg && b->ipg[i] >= 0; i++) {
        const uint32_t read = b->ipg_last[i] != NONE ? b->ipg_last[i] : b->ipg_alloc[i];
        emit_free(b, ZP_MEM_BUCKETS, b->ipg_bytes, -1, micro, b->ipg[i],
                  after != NONE ? after : read);
        b->ipg[i] = -1;
    }
}

/* A bucket's own buffer: a bypassing one's at stage 3 is the parameter's gradient, ds_numel
 * (stage3.py __add_grad_to_ipg_bucket leaves it outside the flat buffer; only
 * reduce_scatter_coalesced's copy pads it), any other one the size it is reduced at. */
static double own_bytes(const Builder *b, const Bucket *k)
{
    return k->spec.bypass && b->s->plan.zero.stage == 3
               ? (double)(k->spec.hi - k->spec.lo) * zp_plan_reduce_bytes(&b->s->plan)
               : k->spec.bytes;
}

/* Stages 2-3 keep no full gradient: backward writes a unit's gradients straight into the
 * buckets that cover it, so those taking their own buffer are allocated before the unit's
 * producing op. */
static void alloc_landing_buckets(Builder *b, int unit, int micro, GArray *deps)
{
    for (guint i = b->unit_first[unit]; i <= b->unit_last[unit] && i < b->buckets->len; i++) {
        Bucket *k = bucket(b, i);
        if (k->buffer >= 0 || !own_buffer(b, k))
            continue;
        uint32_t adeps[2] = {b->last_compute, bucket_backpressure(b, i)};
        k->alloc_op = emit_alloc(b, ZP_MEM_BUCKETS, own_bytes(b, k), k->spec.top_unit, micro,
                                 &k->buffer, adeps, 2);
        g_array_append_val(deps, k->alloc_op);
    }
}

/* ZpImpl full_grads_transient: unit u's full gradients, taken before the first op that
 * produces them (autograd allocates a parameter's .grad when its first gradient arrives; the
 * unit's together), kept until its last bucket is reduced (launch_bucket). */
static void take_unit_grads(Builder *b, int u, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    if (!b->full_by_unit || b->unit_grad[u] >= 0 || s->unit_elems[u] == 0)
        return;
    const uint32_t at = emit_alloc(b, ZP_MEM_GRADS,
                                   (double)s->unit_elems[u] * b->state.grad_bytes, u, micro,
                                   &b->unit_grad[u], &b->last_compute, 1);
    g_array_append_val(deps, at);
}

/* A memory-bound ZeRO++ kernel (zp_zeropp) on `stream`, after `after`. */
static uint32_t emit_quantize(Builder *b, ZpStream stream, int unit, int micro, double mem_bytes,
                              const uint32_t *after, guint n_after)
{
    ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_QUANTIZE, .stream = stream, .unit = unit,
               .micro = micro, .buffer = -1, .mem_bytes = mem_bytes};
    return emit(b, op, after, n_after);
}

/* qgZ's ops on `elems` gradient elements at flat offset lo of bucket k, after deps: its int4
 * buffers' alloc (workspace from the quantisation to the end), the quantisation on the
 * reduce stream, the all-to-all inside the node (naming the bucket it reads, released after
 * it), the node's reduction, the all-to-all across nodes, the dequantisation (k->coll_op).
 * DeepSpeed sends each stage's int4 data and its scales by two all_to_all_single calls of
 * one group, one after the other: one op here. Returns the intra-node all-to-all, after
 * which the gradients were read. */
static uint32_t qgz_ops(Builder *b, Bucket *k, uint64_t lo, uint64_t elems, const ZpQgz *q,
                        int unit, int micro, const uint32_t *deps, guint n_deps)
{
    int work;
    const double work_bytes = q->intra_bytes * 2 + q->inter_bytes;
    const uint32_t alloc = emit_alloc(b, ZP_MEM_WORKSPACE, work_bytes, k->spec.top_unit, micro,
                                      &work, deps, n_deps);
    uint32_t op = emit_quantize(b, ZP_STREAM_DP, unit, micro, q->quantize_mem_bytes, &alloc, 1);
    const uint32_t read = emit_collective(b, ZP_COLL_ALLTOALL, ZP_GROUP_NODE, unit, micro,
                                          k->buffer, lo, elems, q->intra_bytes, &op, 1);
    op = emit_quantize(b, ZP_STREAM_DP, unit, micro, q->reduce_mem_bytes, &read, 1);
    op = emit_collective(b, ZP_COLL_ALLTOALL, ZP_GROUP_XNODE, unit, micro, -1, lo, elems,
                         q->inter_bytes, &op, 1);
    k->coll_op = emit_quantize(b, ZP_STREAM_DP, unit, micro, q->dequantize_mem_bytes, &op, 1);
    emit_free(b, ZP_MEM_WORKSPACE, work_bytes, k->spec.top_unit, micro, work, k->coll_op);
    return read;
}

/* qgZ (zp_zeropp_qgz) on the whole bucket: one pair of all-to-alls. */
static uint32_t qgz_reduce(Builder *b, Bucket *k, int unit, int micro, const uint32_t cdeps[3])
{
    const ZpSchedule *s = b->s;
    const ZpQgz q = zp_zeropp_qgz(&s->plan, k->spec.bytes / zp_plan_reduce_bytes(&s->plan),
                                  (double)s->model.hidden / s->plan.mp,
                                  zp_plan_reduce_bytes(&s->plan));
    return qgz_ops(b, k, k->spec.lo, k->spec.hi - k->spec.lo, &q, unit, micro, cdeps, 3);
}

/* A copy the bucket's reduction writes into (reduce_scatter_coalesced's concatenation). */
typedef struct {
    int buffer;
    double bytes;
    uint32_t alloc; /* its alloc op */
} Copy;

/* A Copy of `bytes` after deps, listed in `copies` to be freed once the reduced slices are
 * taken. */
static uint32_t bucket_copy(Builder *b, const Bucket *k, double bytes, int micro,
                            const uint32_t *deps, guint n_deps, GArray *copies)
{
    int copy;
    const uint32_t op = emit_alloc(b, ZP_MEM_BUCKETS, bytes, k->spec.top_unit, micro, &copy,
                                   deps, n_deps);
    const Copy c = {copy, bytes, op};
    g_array_append_val(copies, c);
    return op;
}

/* DeepSpeed's qgZ (zp_impl.h qgz_by_tensor): the bucket's tensors in flat order
 * (__reduce_and_partition_ipg_grads sorts them by ds_id), one after another on the reduce
 * stream. A quantised one goes through qgz_ops in zp_zeropp_qgz_tensor's figures; another
 * is reduce-scattered over the data-parallel ranks alone, padded to them
 * (reduce_scatter_coalesced([tensor]): in place when no padding is needed, else through a
 * padded copy). Returns the last op that read the bucket. */
static uint32_t qgz_by_tensor(Builder *b, Bucket *k, int unit, int micro, uint32_t after,
                              GArray *copies)
{
    const ZpSchedule *s = b->s;
    const double rb = zp_plan_reduce_bytes(&s->plan);
    if (!b->tensors)
        b->tensors = zp_impl_tensors(s);
    uint32_t prev = NONE, read = NONE;
    for (guint i = 0; i < b->tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(b->tensors, ZpImplTensor, i);
        if (t->offset < k->spec.lo || t->offset >= k->spec.hi)
            continue;
        uint32_t deps[5] = {k->alloc_op, b->last_compute, after, prev, NONE};
        if (zp_zeropp_qgz_quantizes(&s->plan, t->elems, t->matrix)) {
            const ZpQgz q = zp_zeropp_qgz_tensor(&s->plan, (double)t->elems,
                                                 (double)s->model.hidden, rb);
            read = qgz_ops(b, k, t->offset, t->elems, &q, unit, micro, deps, 4);
            prev = k->coll_op;
            continue;
        }
        const double padded = (double)zp_mem_padded_elems(t->elems, (uint64_t)s->plan.dp);
        if (t->elems % (uint64_t)s->plan.dp != 0)
            deps[4] = bucket_copy(b, k, padded * rb, micro, deps, 4, copies);
        read = prev = k->coll_op =
            emit_collective(b, ZP_COLL_REDUCE_SCATTER, ZP_GROUP_DP, unit, micro, k->buffer,
                            t->offset, t->elems, padded * rb, deps, 5);
    }
    return read;
}

/* Optimizer offload: this rank's slice of bucket k streams to the host as the bucket is
 * reduced; returns the op after which the slice has left the GPU (the collective without
 * offload). The paper's way: later micro-steps first bring the host's fp32 sum up to add to
 * it (DeepSpeed's stage 2 accumulates on the GPU so: async_accumulate_grad_in_cpu_via_gpu),
 * then the fp32 slice goes down. An implementation with host_grad_accum (DeepSpeed's stage
 * 3, stage3.py partition_grads): the 16-bit slice goes down into grad_partitions_flat_buffer
 * and comes back up (grad_buffer.to(device)) at micro-step 0; later ones bring the 16-bit
 * sum up, add on the GPU and copy it down again; at the last micro-step the sum goes down
 * once more as fp32 (_offload_grad_partition_at_boundary). */
/* DeepSpeed's stage 3: where the tensor at flat offset lo begins in a rank's partition,
 * each tensor before it padded to dp (partition_parameters.py _partition_param). */
static double tensor_part_at(const ZpSchedule *s, uint64_t lo)
{
    GArray *tensors = zp_impl_tensors(s);
    double at = 0;
    for (guint i = 0; i < tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(tensors, ZpImplTensor, i);
        if (t->offset < lo)
            at += (double)(zp_mem_padded_elems(t->elems, (uint64_t)s->plan.dp) /
                           (uint64_t)s->plan.dp);
    }
    g_array_unref(tensors);
    return at;
}

/* DeepSpeed's stage 3 under partial offload: the fp32 bytes of this rank's slice of a bucket
 * at flat offset lo (its tensors' slices one after the other from the first's place in the
 * partition, each tensor padded to dp) that belong to the sub-groups the CPU steps; the
 * others' go to their fp32 .grad on the GPU (stage3.py _offload_grad_partition_at_boundary
 * copies into fp32_partitioned_groups_flat[i].grad wherever subgroup_to_device put it). */
static double tensor_part_at(const ZpSchedule *s, uint64_t lo);

static double partial_d2h_bytes(const ZpSchedule *s, uint64_t lo, double elems)
{
    const double at = tensor_part_at(s, lo);
    const double gpu = zp_offload_gpu_elems(&s->plan, (double)s->partition_elems);
    return fmax(0.0, at + elems - fmax(at, gpu)) * 4.0;
}

static uint32_t offload_grad_slice(Builder *b, const Bucket *k, int unit, int micro)
{
    const ZpSchedule *s = b->s;
    const double elems = k->spec.bytes / zp_plan_reduce_bytes(&s->plan) / s->plan.dp;
    const double part = (double)s->partition_elems;
    const gboolean partial = s->plan.zero.stage == 3 && b->impl->host_grad_accum &&
                             zp_offload_cpu_share(&s->plan, part) > 0 &&
                             zp_offload_gpu_elems(&s->plan, part) > 0;
    const double slice = partial ? partial_d2h_bytes(s, k->spec.lo, elems)
                                 : zp_offload_grad_d2h_bytes(&s->plan, elems, part);
    uint32_t drained = k->coll_op;
    if (slice <= 0 && !partial)
        return drained;
    const gboolean last = micro == s->plan.grad_accum - 1;
    if (s->plan.zero.stage == 3 && b->impl->host_grad_accum) {
        /* every sub-group's, those the GPU steps too (the buffer is the host's) */
        const double half = elems * zp_plan_elem_bytes(s->plan.precision);
        const ZpTransferKind first = micro == 0 ? ZP_XFER_D2H : ZP_XFER_H2D;
        drained = emit_transfer(b, first, half, unit, micro, drained);
        drained = emit_transfer(b, first == ZP_XFER_D2H ? ZP_XFER_H2D : ZP_XFER_D2H, half, unit,
                                micro, drained);
        drained = emit_transfer(b, ZP_XFER_D2H, last ? slice : 0, unit, micro, drained);
    } else if (zp_offload_stage2_accum(&s->plan)) {
        /* DeepSpeed's stage 2 by whole tensors (zp_offload_stage2_accum_elems), the mean over
         * the ranks: stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu brings the host's
         * 16-bit sum up and adds it on later micro-steps, then copies the sum down; at the
         * last, async_inplace_copy_grad_to_fp32_buffer_from_gpu sends the rank's part in
         * fp32 */
        const double whole = zp_offload_stage2_accum_elems(&s->model, &s->plan,
                                                           (double)s->partition_elems,
                                                           (double)k->spec.lo,
                                                           (double)k->spec.hi, -1) /
                             s->plan.dp * zp_plan_elem_bytes(s->plan.precision);
        drained = emit_transfer(b, ZP_XFER_H2D, micro > 0 ? whole : 0, unit, micro, drained);
        drained = emit_transfer(b, ZP_XFER_D2H, whole, unit, micro, drained);
        drained = emit_transfer(b, ZP_XFER_D2H, last ? slice : 0, unit, micro, drained);
    } else {
        drained = emit_transfer(b, ZP_XFER_H2D, s->plan.zero.stage >= 2 && micro > 0 ? slice : 0,
                                unit, micro, drained);
        drained = emit_transfer(b, ZP_XFER_D2H, slice, unit, micro, drained);
    }
    g_array_append_val(b->offloaded, drained);
    /* ZeRO-Infinity: at the last micro-step the fp32 slice goes on to the optimizer's swap
     * file (stage3.py partition_grads -> optimizer_swapper.swap_out_gradients), to be swapped
     * in with the states at the step. */
    if (zp_offload_optimizer_tier(&s->plan) == ZP_TIER_NVME && last) {
        const uint32_t out = emit_transfer(b, ZP_XFER_NVME_WRITE, slice, unit, micro, drained);
        g_array_append_val(b->offloaded, out);
    }
    return drained;
}

/* The waiting gradients copied into their held buffers as those empty, in the order they were
 * handed on (a bucket's only once no earlier bucket's wait: buckets fill in turn), each freed
 * after `after` (the reduction that empties the buffer, or the op after which the host
 * issued it: ZpImpl frees_at_issue). */
static void land_waits(Builder *b, int micro, uint32_t after)
{
    guint n = 0;
    for (; n < b->waits->len; n++) {
        const Wait *w = &g_array_index(b->waits, Wait, n);
        int *occupant = &b->occupant[bucket(b, w->bucket)->slot];
        if (*occupant >= 0 && *occupant != (int)w->bucket)
            break;
        *occupant = (int)w->bucket;
        emit_free(b, ZP_MEM_WORKSPACE, w->bytes, w->unit, micro, w->buffer, after);
    }
    g_array_remove_range(b->waits, 0, n);
}

/* The bucket holding flat offset `at` among those holding unit u's gradients. */
static guint bucket_holding(Builder *b, int u, uint64_t at)
{
    guint i = b->unit_first[u];
    while (i < b->unit_last[u] && !(bucket(b, i)->spec.lo <= at && at < bucket(b, i)->spec.hi))
        i++;
    return i;
}

/* The first of `tensors` (in flat order) at or after flat offset `at`. */
static guint first_tensor_at(const GArray *tensors, uint64_t at)
{
    guint lo = 0, hi = tensors->len;
    while (lo < hi) {
        const guint mid = lo + (hi - lo) / 2;
        if (g_array_index(tensors, ZpImplTensor, mid).offset < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ZpImpl grads_by_module at stages 2-3, a reducing backward: the gradients unit u's op (its
 * module `module`'s, -1: all of the unit's) hands on, from its last tensor down as autograd's
 * hooks run (zreal's real_engine_ds.c view): one lands in its held bucket buffer when its
 * bucket is there already, or when the buffer is empty and no earlier bucket's gradient
 * waits; otherwise it waits (Wait), its buffer allocated before the op (in deps). */
static void hand_on(Builder *b, int u, int module, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    if (!zp_impl_grads_by_module(&s->plan) || s->plan.zero.stage < 2 || b->n_ipg == 0)
        return;
    if (!b->tensors)
        b->tensors = zp_impl_tensors(s);
    const ZpImplTensor *t = (const ZpImplTensor *)b->tensors->data;
    const guint first = first_tensor_at(b->tensors, s->unit_offset[u]);
    const guint end = first_tensor_at(b->tensors, s->unit_offset[u] + s->unit_elems[u]);
    for (guint x = end; x-- > first;) {
        if (module >= 0 && t[x].module - t[first].module != module)
            continue;
        const guint i = bucket_holding(b, u, t[x].offset);
        const int slot = bucket(b, i)->slot;
        if (slot < 0)
            continue;
        int *occupant = &b->occupant[slot];
        const gboolean earlier = b->waits->len > 0 &&
                                 g_array_index(b->waits, Wait, 0).bucket < i;
        if (*occupant == (int)i || (*occupant < 0 && !earlier)) {
            *occupant = (int)i;
            continue;
        }
        Wait w = {i, -1, u, (double)t[x].elems * s->elem_bytes};
        const uint32_t at = emit_alloc(b, ZP_MEM_WORKSPACE, w.bytes, u, micro, &w.buffer,
                                       &b->last_compute, 1);
        g_array_append_val(deps, at);
        g_array_append_val(b->waits, w);
    }
}

/* The bytes of micro-step `micro`'s gradient copy (ZpImpl grad_copy_elems; 0: none). */
static double grad_copy_bytes(const Builder *b, int micro)
{
    if (micro == 0 || !b->impl->grad_copy_elems)
        return 0;
    return b->impl->grad_copy_elems(b->s) * b->state.grad_bytes;
}

static void launch_bucket(Builder *b, guint i, int unit, int micro, GArray *launched)
{
    const ZpSchedule *s = b->s;
    const ZpCollKind kind = b->impl->grad_collective(&s->plan);
    Bucket *k = bucket(b, i);
    /* stage3.py __reduce_and_partition_ipg_grads: the host waits for the reduction three
     * buckets back before launching this one */
    b->reduce_gate = host_sync(b->reduce_event, b->n_reduce_events, b->reduce_gate);
    uint32_t after = NONE; /* what the collective waits for besides the gradients */
    int held = -1;
    /* A bypassing bucket at stages 0-1 is reduced in place in the full gradients: no buffer. */
    const gboolean in_place = k->spec.bypass && s->plan.zero.stage < 2;
    if (!in_place && own_buffer(b, k) && k->buffer < 0) {
        /* stages 0-1: copy the finished gradients into a bucket */
        uint32_t adeps[2] = {b->last_compute, bucket_backpressure(b, i)};
        k->alloc_op = emit_alloc(b, ZP_MEM_BUCKETS, k->spec.bytes, k->spec.top_unit, micro,
                                 &k->buffer, adeps, 2);
    } else if (k->slot >= 0) {
        alloc_held_buckets(b, micro);
        /* the gradients are copied into the next held buffer once its last reduction ran */
        held = k->slot;
        k->buffer = b->ipg[held];
        after = b->ipg_last[held] != NONE ? b->ipg_last[held] : b->ipg_alloc[held];
    }
    /* the gradient state, taken by the step's first reduction (ZpImpl
     * grads_taken_by_reduction), and a later micro-step's gradient copy, by its first: the
     * reduced gradients are copied into them */
    if (b->grad_state_bytes > 0 && b->grad_state < 0)
        emit_alloc(b, ZP_MEM_GRADS, b->grad_state_bytes, -1, micro, &b->grad_state,
                   &b->last_compute, 1);
    const double copy_bytes = grad_copy_bytes(b, micro);
    if (copy_bytes > 0 && i == 0)
        emit_alloc(b, ZP_MEM_GRADS, copy_bytes, -1, micro, &b->grad_copy, &b->last_compute, 1);
    uint32_t read = NONE; /* qgZ: the op after which the bucket's gradients were read */
    GArray *copies = g_array_new(FALSE, FALSE, sizeof(Copy));
    const gboolean qgz = s->plan.zero.stage == 3 && s->plan.zero.zero_quantized_gradients;
    if (qgz && b->impl->qgz_by_tensor && zp_zeropp_qgz_across_nodes(&s->plan)) {
        read = qgz_by_tensor(b, k, unit, micro, after, copies);
    } else if (qgz && !b->impl->qgz_by_tensor) {
        /* qgZ replaces the reduce-scatter and its concatenated copy */
        const uint32_t cdeps[3] = {k->alloc_op, b->last_compute, after};
        read = qgz_reduce(b, k, unit, micro, cdeps);
    } else {
        uint32_t copy_op = NONE;
        if (kind == ZP_COLL_REDUCE_SCATTER && b->impl->concat_copy(&s->plan, &k->spec)) {
            /* stage3.py __avg_scatter_grads -> reduce_scatter_coalesced concatenates the
             * bucket's padded partitions into one tensor first */
            uint32_t adeps[2] = {b->last_compute, after};
            copy_op = bucket_copy(b, k, k->spec.bytes, micro, adeps, 2, copies);
        }
        uint32_t cdeps[4] = {k->alloc_op, b->last_compute, after, copy_op};
        k->coll_op = emit_collective(b, kind, ZP_GROUP_DP, unit, micro, k->buffer, k->spec.lo,
                                     k->spec.hi - k->spec.lo, k->spec.bytes, cdeps, 4);
    }
    const uint32_t drained = offload_grad_slice(b, k, unit, micro);
    /* the reduced slices are views of the copies until they went down */
    for (guint c = 0; c < copies->len; c++) {
        const Copy *x = &g_array_index(copies, Copy, c);
        emit_free(b, ZP_MEM_BUCKETS, x->bytes, k->spec.top_unit, micro, x->buffer,
                  b->impl->frees_at_issue ? x->alloc : drained);
    }
    g_array_unref(copies);
    k->drain_op = drained;
    record_event(b->reduce_event, &b->n_reduce_events, drained);
    if (read == NONE)
        read = drained;
    if (held >= 0) {
        b->ipg_last[held] = read;
        if (b->occupant[held] == (int)i)
            b->occupant[held] = -1;
        land_waits(b, micro, b->impl->frees_at_issue ? b->last_compute : read);
    } else if (k->buffer >= 0) {
        /* at issue: once the later of its alloc and the compute the reduction follows */
        const uint32_t issued = MAX(k->alloc_op, b->last_compute);
        emit_free(b, ZP_MEM_BUCKETS, own_bytes(b, k), k->spec.top_unit, micro, k->buffer,
                  b->impl->frees_at_issue ? issued : read);
    }
    /* the full gradients of the units whose last bucket this is: each was copied into its
     * bucket and dropped (ZpImpl full_grads_transient), freed once the host issued it */
    for (int u = k->spec.low_unit; u <= k->spec.top_unit; u++)
        if (b->unit_grad[u] >= 0 && b->unit_last[u] == i) {
            emit_free(b, ZP_MEM_GRADS, (double)s->unit_elems[u] * b->state.grad_bytes, u, micro,
                      b->unit_grad[u], b->last_compute);
            b->unit_grad[u] = -1;
        }
    if (copy_bytes > 0 && i + 1 == b->buckets->len) /* added into the state, then freed */
        emit_free(b, ZP_MEM_GRADS, copy_bytes, -1, micro, b->grad_copy, drained);
    if (!s->plan.zero.overlap_comm)
        g_array_append_val(b->sync_deps, k->coll_op);
    g_array_append_val(launched, k->coll_op);
}

/* Launches the buckets that wait for this unit's gradients and are not launched yet: those
 * whose launch module is `module` (ZpBucketSpec launch_module; after that module's op), or
 * with module -1 (after the unit's whole backward) every one left. */
static void launch_buckets(Builder *b, int unit, int module, int micro, GArray *launched)
{
    for (guint j = b->launch_start[unit]; j < b->launch_start[unit + 1]; j++) {
        const guint i = g_array_index(b->launch, guint, j);
        if (bucket(b, i)->coll_op == NONE &&
            (module < 0 || bucket(b, i)->spec.launch_module == module))
            launch_bucket(b, i, unit, micro, launched);
    }
}

/* ---- stage-3 gathers ------------------------------------------------------------------- */

/* A step of a position as one index: pos * ZP_POS_STEPS + step. */
static int step_key(int pos, int step)
{
    return pos * ZP_POS_STEPS + step;
}

/* What a step's gather buffers are allocated after: the previous position's last compute op
 * for a position's first step, the previous step's op for a later one. */
static uint32_t step_after(const Builder *b, int key)
{
    const int pos = key / ZP_POS_STEPS;
    return key % ZP_POS_STEPS > 0 || pos == 0 ? b->last_compute
                                               : g_array_index(b->pos_last_op, uint32_t, pos - 1);
}

/* A stage-3 gather's buffer, taken by the host at step `key`: after the compute op before the
 * step, or where the host runs ahead (zp_runahead.h) after its latest waits on the allgather
 * stream and the reductions and its previous such alloc, that compute op being the first
 * dependency zp_runahead_bound moves. */
static uint32_t gather_alloc(Builder *b, double bytes, int unit, int micro, int *buffer, int key)
{
    const uint32_t after = step_after(b, key);
    if (!b->runahead)
        return emit_alloc(b, ZP_MEM_GATHERED_PARAMS, bytes, unit, micro, buffer, &after, 1);
    const uint32_t deps[4] = {after, b->fetch_gate, b->reduce_gate, b->host_alloc};
    b->host_alloc = emit_alloc(b, ZP_MEM_GATHERED_PARAMS, bytes, unit, micro, buffer, deps, 4);
    if (after != NONE)
        g_array_append_val(b->gated, b->host_alloc);
    return b->host_alloc;
}

static ZpGroup gather_group(const Builder *b, const Gather *g);

/* The gathers in the implementation's calls. With hpZ a call's parameters that hold a
 * secondary partition (those used in backward) are gathered inside the node by a call of
 * their own, before the others (partitioned_param_coordinator.py __all_gather_params_). */
static void plan_gathers(Builder *b)
{
    GArray *fetches = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    b->impl->plan_fetches(b->s, fetches);
    const ZpFetch *f = (const ZpFetch *)fetches->data;
    for (guint i = 0, j; i < fetches->len; i = j) {
        for (j = i + 1; j < fetches->len && f[j].joins_previous; j++)
            ;
        for (int pass = 0; pass < 2; pass++) {
            const ZpGroup want = pass == 0 ? ZP_GROUP_HPZ : ZP_GROUP_DP;
            guint first = b->gathers->len;
            for (guint k = i; k < j; k++) {
                Gather g = {f[k], -1, 0, NONE, first, 0, 0, -1,
                            step_key(f[k].use_pos, f[k].use_step), -1, FALSE};
                if (gather_group(b, &g) != want)
                    continue;
                g_array_append_val(b->gathers, g);
                Gather *c = &g_array_index(b->gathers, Gather, first);
                c->n++;
                c->call_elems += f[k].elems;
                c->last_use = MAX(c->last_use, step_key(f[k].use_pos, f[k].use_step));
            }
        }
    }
    g_array_unref(fetches);
}

/* The step key of a fetch's position and step fields (offsets into ZpFetch). */
static int fetch_key(const Gather *g, size_t pos_field, size_t step_field)
{
    return step_key(G_STRUCT_MEMBER(int, &g->fetch, pos_field),
                    G_STRUCT_MEMBER(int, &g->fetch, step_field));
}

/* Lists the gathers by the step their fetch's fields name (a counting sort, so each step
 * keeps list order). */
static PosIndex index_gathers(const Builder *b, size_t pos_field, size_t step_field, int n_pos)
{
    const GArray *gathers = b->gathers;
    const int n_keys = n_pos * ZP_POS_STEPS;
    PosIndex ix = {g_new0(guint, (gsize)n_keys + 1), g_new(guint, MAX(gathers->len, 1))};
    for (guint k = 0; k < gathers->len; k++)
        ix.start[fetch_key(&g_array_index(gathers, Gather, k), pos_field, step_field) + 1]++;
    for (int p = 0; p < n_keys; p++)
        ix.start[p + 1] += ix.start[p];
    guint *next = g_memdup2(ix.start, sizeof(guint) * (gsize)n_keys);
    for (guint k = 0; k < gathers->len; k++)
        ix.items[next[fetch_key(&g_array_index(gathers, Gather, k), pos_field, step_field)]++] =
            k;
    g_free(next);
    return ix;
}

static void free_pos_index(PosIndex *ix)
{
    g_free(ix->start);
    g_free(ix->items);
}

static Gather *gather_at(Builder *b, const PosIndex *ix, guint i)
{
    return &g_array_index(b->gathers, Gather, ix->items[i]);
}

ZpGroup zp_sched_fetch_group(const ZpSchedule *s, int use_pos)
{
    return s->plan.zero.zero_hpz_partition_size > 1 && use_pos > zp_pos_head((int)s->model.layers)
               ? ZP_GROUP_HPZ
               : ZP_GROUP_DP;
}

/* hpZ: backward gathers from the secondary partitions, inside the node; forward ones over
 * the whole group (zp_sched_fetch_group). */
static ZpGroup gather_group(const Builder *b, const Gather *g)
{
    return zp_sched_fetch_group(b->s, g->fetch.use_pos);
}

/* stage3_use_all_reduce_for_fetch_params: a call's parameters are views of its zeroed flat
 * buffer (partition_parameters.py _all_gather_coalesced: param.data = flat_tensor.narrow),
 * so the buffer is freed with the last of them to be released; the call's gather that is
 * freed last (by position, then module step: by_free's key) holds it, the others nothing. */
static void own_by_last_free(Gather *c, int buffer, double bytes)
{
    guint last = 0;
    for (guint k = 0; k < c->n; k++) {
        c[k].buffer = -1, c[k].bytes = 0;
        const ZpFetch *f = &c[k].fetch, *l = &c[last].fetch;
        if (f->free_pos > l->free_pos ||
            (f->free_pos == l->free_pos && f->free_step >= l->free_step))
            last = k; /* freed later: a later position, or a later module step in it */
    }
    c[last].buffer = buffer, c[last].bytes = bytes;
}

/* One call's all-gather. A call of one parameter gathers into that parameter's buffer, of
 * its padded size (partition_parameters.py _all_gather_sequential); a call of more into one
 * flat buffer of their padded partitions, every rank's in turn (_all_gather_dtype: the
 * partitions concatenated, partition_sz * world_size elements), the parameters copied out
 * when the call is first waited for (unpack_call). With stage3_use_all_reduce_for_fetch_params
 * (zp_sched_fetch_allreduce) a call of more is an all-reduce of a zeroed buffer of the same
 * size, parameter by parameter, each rank's slices at their places: nothing to unpack. */
static void issue_call(Builder *b, Gather *c, int key, int micro)
{
    const ZpSchedule *s = b->s;
    const double bytes = (double)c->call_elems * b->state.param_bytes;
    const ZpGroup group = gather_group(b, c);
    const int ranks = zp_zeropp_group_ranks(&s->plan, group);
    const gboolean reduced = zp_sched_fetch_allreduce(&s->plan, c->n, group);
    const double wire = reduced ? bytes
                                : zp_zeropp_gather_bytes(&s->plan, c->call_elems, ranks,
                                                         b->state.param_bytes);
    int buffer;
    uint32_t alloc = gather_alloc(b, bytes, c->fetch.unit, micro, &buffer, key);
    c->unpacked = c->n == 1 || reduced;
    c->flat = c->unpacked ? -1 : buffer;
    if (c->n == 1)
        c->buffer = buffer, c->bytes = bytes;
    if (reduced) /* the parameters are views of the buffer: freed with the last of them */
        own_by_last_free(c, buffer, bytes);
    /* Parameter offload: the partition comes up from the host (and NVMe) first. */
    double nvme_bytes = 0, h2d_bytes = 0;
    const double part = (double)s->partition_elems;
    const double kept = zp_offload_param_kept_elems(&s->plan, part);
    if (s->plan.impl == ZP_IMPL_DEEPSPEED && kept > 0 && kept < part) {
        /* some sub-groups kept on the host: each tensor's slice from its place (the call's
         * gathers are its tensors) */
        for (guint k = 0; k < c->n; k++) {
            double nvme, h2d;
            zp_offload_fetch(&s->plan, (double)c[k].fetch.elems / s->plan.dp,
                             tensor_part_at(s, c[k].fetch.offset), part, &nvme, &h2d);
            nvme_bytes += nvme, h2d_bytes += h2d;
        }
    } else {
        zp_offload_fetch(&s->plan, (double)c->call_elems / s->plan.dp, -1, part, &nvme_bytes,
                         &h2d_bytes);
    }
    const uint32_t read = emit_transfer(b, ZP_XFER_NVME_READ, nvme_bytes, c->fetch.unit, micro,
                                        alloc);
    alloc = emit_transfer(b, ZP_XFER_H2D, h2d_bytes, c->fetch.unit, micro, read);
    if (s->plan.zero.zero_quantized_weights) { /* this rank's partition into int8 */
        uint32_t qalloc = emit_alloc(b, ZP_MEM_WORKSPACE, wire, c->fetch.unit, micro,
                                     &c->quant_buffer, &alloc, 1);
        const uint64_t part = c->call_elems / (uint64_t)ranks;
        alloc = emit_quantize(b, ZP_STREAM_DP, c->fetch.unit, micro,
                              zp_zeropp_quantize_mem_bytes(part), &qalloc, 1);
    }
    const uint32_t coll = emit_collective(b, reduced ? ZP_COLL_ALLREDUCE : ZP_COLL_ALLGATHER,
                                          group, c->fetch.unit, micro, buffer, c->fetch.offset,
                                          c->call_elems, wire, &alloc, 1);
    for (guint k = 0; k < c->n; k++)
        c[k].coll_op = coll;
}

/* The calls triggered at step `key`: those its compute needs (`now`), or its prefetches.
 * fetch_sub_module (partitioned_param_coordinator.py) gathers the module's own parameters,
 * waits for them on the gather stream, and only then issues the prefetch, so a prefetch
 * queues behind the wait's copies, never the wait behind the prefetch. */
static void issue_gathers(Builder *b, int key, int micro, gboolean now)
{
    for (guint i = b->by_trigger.start[key]; i < b->by_trigger.start[key + 1]; i++) {
        Gather *g = gather_at(b, &b->by_trigger, i);
        if (g == &g_array_index(b->gathers, Gather, g->call) &&
            (step_key(g->fetch.use_pos, g->fetch.use_step) == key) == now)
            issue_call(b, g, key, micro);
    }
}

/* A coalesced call waited for (AllGatherCoalescedHandle.wait): every parameter of the call
 * gets a buffer of its own elements (torch.cat of its slices out of the flat buffer, on the
 * gather stream), all at once, whichever of them is needed first. */
static void unpack_call(Builder *b, Gather *c, int key, int micro)
{
    uint32_t *deps = g_new(uint32_t, c->n + 1);
    double bytes = 0;
    deps[0] = c->coll_op;
    for (guint k = 0; k < c->n; k++) {
        c[k].bytes = (double)c[k].fetch.numel * b->state.param_bytes;
        deps[k + 1] = gather_alloc(b, c[k].bytes, c[k].fetch.unit, micro, &c[k].buffer, key);
        bytes += c[k].bytes;
    }
    ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_UNPACK, .stream = ZP_STREAM_DP,
               .unit = c->fetch.unit, .micro = micro, .buffer = -1, .mem_bytes = 2 * bytes};
    const uint32_t unpack = emit(b, op, deps, c->n + 1);
    for (guint k = 0; k < c->n; k++)
        c[k].coll_op = unpack;
    c->unpacked = TRUE;
    g_free(deps);
}

/* The gathers the compute op of step `key` needs. With qwZ each call is dequantised first, on the
 * compute stream when it is waited for (AllGatherCoalescedHandle.wait); a coalesced call is
 * unpacked, and its flat buffer freed once its last parameter is waited for (the handle,
 * which holds the buffer, leaves the inflight registry with that parameter:
 * partitioned_param_coordinator.py fetch_sub_module). The host waits for each parameter after
 * the allgather stream's event three parameters back, and records one after it (the op its
 * compute waits for: _fetch_sub_module_impl's __ongoing_fetch_events). */
static void gathers_used_at(Builder *b, int key, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    for (guint i = b->by_use.start[key]; i < b->by_use.start[key + 1]; i++) {
        Gather *g = gather_at(b, &b->by_use, i);
        Gather *c = &g_array_index(b->gathers, Gather, g->call);
        b->fetch_gate = host_sync(b->fetch_event, b->n_fetch_events, b->fetch_gate);
        if (c->quant_buffer >= 0) {
            const int ranks = zp_zeropp_group_ranks(&s->plan, gather_group(b, c));
            const uint32_t after[2] = {c->coll_op, b->last_compute};
            const uint32_t op = emit_quantize(
                b, ZP_STREAM_COMPUTE, c->fetch.unit, micro,
                zp_zeropp_dequantize_mem_bytes(c->call_elems, ranks), after, 2);
            emit_free(b, ZP_MEM_WORKSPACE,
                      zp_zeropp_gather_bytes(&s->plan, c->call_elems, ranks,
                                             b->state.param_bytes),
                      c->fetch.unit, micro, c->quant_buffer, op);
            c->quant_buffer = -1;
            for (guint k = 0; k < c->n; k++)
                c[k].coll_op = op;
        }
        if (!c->unpacked)
            unpack_call(b, c, key, micro);
        if (c->flat >= 0 && key == c->last_use) {
            emit_free(b, ZP_MEM_GATHERED_PARAMS, (double)c->call_elems * b->state.param_bytes,
                      c->fetch.unit, micro, c->flat, c->coll_op);
            c->flat = -1;
        }
        g_array_append_val(deps, g->coll_op);
        record_event(b->fetch_event, &b->n_fetch_events, g->coll_op);
    }
}

static void free_gathers(Builder *b, int key, int micro)
{
    for (guint i = b->by_free.start[key]; i < b->by_free.start[key + 1]; i++) {
        const Gather *g = gather_at(b, &b->by_free, i);
        if (g->buffer >= 0)
            emit_free(b, ZP_MEM_GATHERED_PARAMS, g->bytes, g->fetch.unit, micro, g->buffer,
                      b->last_compute);
    }
}

/* ---- the step -------------------------------------------------------------------------- */

/* A step's gathers, as fetch_sub_module issues them; deps gets what its compute waits for. */
static void step_begin(Builder *b, int pos, int step, int micro, GArray *deps)
{
    g_array_set_size(deps, 0);
    b->step = step;
    if (b->s->plan.zero.stage == 3) {
        const int key = step_key(pos, step);
        issue_gathers(b, key, micro, TRUE);
        gathers_used_at(b, key, micro, deps);
        issue_gathers(b, key, micro, FALSE);
    }
}

static void position_begin(Builder *b, int pos, int micro, GArray *deps)
{
    step_begin(b, pos, 0, micro, deps);
}

/* After the position's last step: what that step releases (release_sub_module). */
static void position_end(Builder *b, int pos, int micro)
{
    g_array_index(b->pos_last_op, uint32_t, pos) = b->last_compute;
    if (b->s->plan.zero.stage == 3)
        free_gathers(b, step_key(pos, b->step), micro);
}

/* One tensor-parallel all-reduce of b*s*h activations or their gradients: on the critical
 * path, so the next compute op waits for it. With sequence parallelism it is a reduce-scatter
 * (into the sequence-split layer norm and dropout) and an all-gather (back to the full
 * sequence for the next tensor-parallel GEMM): the same bytes, in two collectives. */
static void tp_sum(Builder *b, int unit, int micro)
{
    const ZpSchedule *s = b->s;
    const uint64_t elems = (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                           (uint64_t)s->model.hidden;
    static const ZpCollKind plain[] = {ZP_COLL_ALLREDUCE};
    static const ZpCollKind split[] = {ZP_COLL_REDUCE_SCATTER, ZP_COLL_ALLGATHER};
    const ZpCollKind *kinds = s->plan.sequence_parallel ? split : plain;
    uint32_t after = b->last_compute;
    for (int k = 0; k < (s->plan.sequence_parallel ? 2 : 1); k++) {
        after = emit_collective(b, kinds[k], ZP_GROUP_TP, unit, micro, -1, 0, elems,
                                (double)elems * s->elem_bytes, &after, 1);
        g_array_append_val(b->sync_deps, after);
    }
}

/* Megatron's two all-reduces of a block: after the row-parallel attention projection and
 * MLP output in forward (and recompute), of the column-parallel qkv's and fc1's input
 * gradients in backward. */
static void tp_allreduces(Builder *b, int unit, int micro)
{
    if (b->s->plan.mp == 1)
        return;
    tp_sum(b, unit, micro);
    tp_sum(b, unit, micro);
}

/* The vocab-parallel head's loss, as zreal computes it: each rank's log-sum-exp over its
 * vocabulary rows and its logit of the target (0 when another rank's rows hold it), two fp32
 * per token, all-gathered over the tensor group (Megatron's vocab_parallel_cross_entropy
 * all-reduces the maximum, the target logit and the sum of exponentials instead: 3 x 4bs
 * bytes, the same as this at mp 2); then the sum of the head's input gradient, b*s*h
 * (the column-parallel head's backward). */
static void vocab_parallel_head(Builder *b, int micro)
{
    const ZpSchedule *s = b->s;
    if (s->plan.mp == 1)
        return;
    const uint64_t elems = 2 * (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                           (uint64_t)s->plan.mp;
    const int unit = (int)s->model.layers + 1;
    uint32_t after = emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_TP, unit, micro, -1, 0,
                                     elems, 4.0 * (double)elems, &b->last_compute, 1);
    g_array_append_val(b->sync_deps, after);
    tp_sum(b, unit, micro);
}

typedef struct {
    int *act, *ckpt; /* buffer ids per micro-step and block: [micro * (L + 1) + l] */
    double act_bytes;
    ZpCkptRule rule; /* what a checkpoint is and where it lives (zp_zeror) */
} Activations;

static int *act_slot(const Builder *b, int *ids, int micro, int l)
{
    return &ids[(gsize)micro * (gsize)(b->s->model.layers + 1) + (gsize)l];
}

/* synchronize_checkpoint_boundary: CheckpointFunction's forward and backward begin and end
 * with a device synchronize, so the next compute op waits for everything issued so far on
 * every stream (in-flight gathers and reductions included). */
static void checkpoint_boundary(Builder *b)
{
    if (!b->s->plan.checkpoint || !b->s->plan.ckpt.synchronize_checkpoint_boundary)
        return;
    for (int stream = 0; stream < ZP_STREAM_N; stream++)
        g_array_append_val(b->sync_deps, b->last_on_stream[stream]);
}

/* Pa+cpu (zp_zeror): the synchronous copy of a block's checkpoint slice over the host link,
 * on the compute stream as DeepSpeed's `.cpu()` and `copy_()` are. */
static void host_copy(Builder *b, int unit, int micro, double bytes)
{
    const Cost none = {0};
    const uint32_t op = emit_compute(b, ZP_COMP_HOST_COPY, unit, micro, none, &b->last_compute, 1);
    g_array_index(b->s->ops, ZpOp, op).bytes = bytes;
}

/* Forward keeps the block input: whole, its 1/M slice (Pa) on the GPU, or the slice copied
 * to the host (Pa+cpu), before the block runs (CheckpointFunction.forward). */
static void keep_checkpoint(Builder *b, int l, int micro, Activations *a, GArray *deps)
{
    int *slot = act_slot(b, a->ckpt, micro, l);
    *slot = -1;
    if (a->rule.copy_bytes > 0)
        host_copy(b, l, micro, a->rule.copy_bytes);
    if (a->rule.gpu_bytes > 0) {
        uint32_t alloc = emit_alloc(b, ZP_MEM_CHECKPOINTS, a->rule.gpu_bytes, l, micro, slot,
                                    &b->last_compute, 1);
        g_array_append_val(deps, alloc);
    }
}

/* Before the recompute, Pa and Pa+cpu rebuild the whole input in a new GPU buffer
 * (gather_partitioned_activations): the slice copied in from the host, then the all-gather
 * of b*s*h over the tensor group; the slice kept on the GPU is released then. */
static void regather_checkpoint(Builder *b, int l, int micro, Activations *a)
{
    if (!a->rule.regathered)
        return;
    int *slot = act_slot(b, a->ckpt, micro, l);
    const int kept = *slot;
    uint32_t alloc = emit_alloc(b, ZP_MEM_CHECKPOINTS, a->rule.full_bytes, l, micro, slot,
                                &b->last_compute, 1);
    g_array_append_val(b->sync_deps, alloc);
    if (a->rule.copy_bytes > 0)
        host_copy(b, l, micro, a->rule.copy_bytes);
    if (a->rule.gather_elems > 0) {
        const uint32_t after[2] = {alloc, b->last_compute};
        uint32_t coll = emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_TP, l, micro, -1, 0,
                                        a->rule.gather_elems, a->rule.full_bytes, after, 2);
        g_array_append_val(b->sync_deps, coll);
        if (kept >= 0)
            emit_free(b, ZP_MEM_CHECKPOINTS, a->rule.gpu_bytes, l, micro, kept, coll);
    } else if (kept >= 0) {
        emit_free(b, ZP_MEM_CHECKPOINTS, a->rule.gpu_bytes, l, micro, kept, b->last_compute);
    }
}

/* A block op's cost split over its modules by their kernels' shares (zp_cost_kernel_shares):
 * FLOPs, fused-attention FLOPs and memory-bound bytes, so that the modules' ops sum to the
 * block's; each keeps the block's typical GEMM (the efficiency the block's time has), so that
 * their times sum to its time too. */
static void module_costs(const Builder *b, ZpComputeKind kind, Cost whole, Cost parts[ZP_MOD_N])
{
    ZpModuleShares sh;
    zp_cost_kernel_shares(&b->s->model, &b->s->plan, kind, NULL, NULL, &sh);
    for (int m = 0; m < ZP_MOD_N; m++)
        parts[m] = (Cost){whole.flops * sh.flops[m], whole.gemm_flops,
                          whole.attn_flops * sh.attn_flops[m], whole.mem_bytes * sh.accesses[m]};
}

/* Whether module m ends with one of Megatron's tensor-parallel sums: the row-parallel proj and
 * fc2 in forward, the column-parallel fc1 and qkv (their input gradients) in backward. */
static gboolean module_sums(int m, gboolean backward)
{
    return backward ? m == ZP_MOD_FC1 || m == ZP_MOD_QKV : m == ZP_MOD_PROJ || m == ZP_MOD_FC2;
}

/* A block's forward, recompute or backward at position pos, its first step's gathers begun
 * and its dependencies in deps: one op, or under module compute (a backward under
 * zp_impl_module_backward) one per module (the positions' steps, zp_impl.h), each after its
 * own gathers (fetch_sub_module) and releasing what the step before it used first
 * (release_sub_module); the position's last step's release is position_end's. A reducing
 * backward (`launched` not NULL) hands its gradients on (hand_on) and launches, after each
 * module's op, the buckets that module's gradients launch. */
static void block_compute(Builder *b, ZpComputeKind kind, int l, int micro, int pos, Cost cost,
                          GArray *deps, GArray *launched)
{
    const gboolean backward = kind == ZP_COMP_BLOCK_BWD;
    if (!zp_impl_module_compute(b->s) && !(backward && zp_impl_module_backward(b->s))) {
        if (launched)
            hand_on(b, l, -1, micro, deps);
        emit_compute(b, kind, l, micro, cost, (uint32_t *)deps->data, deps->len);
        tp_allreduces(b, l, micro);
        return;
    }
    Cost parts[ZP_MOD_N];
    module_costs(b, kind, cost, parts);
    for (int k = 0; k < ZP_POS_STEPS; k++) {
        const int m = zp_step_module(backward, k);
        if (k > 0) {
            if (b->s->plan.zero.stage == 3)
                free_gathers(b, step_key(pos, k - 1), micro);
            step_begin(b, pos, k, micro, deps);
        }
        if (launched)
            hand_on(b, l, m, micro, deps);
        b->module_step = k;
        const uint32_t op = emit_compute(b, kind, l, micro, parts[m], (uint32_t *)deps->data,
                                         deps->len);
        b->module_step = -1;
        g_array_index(b->s->ops, ZpOp, op).module = (uint8_t)(m + 1);
        if (b->s->plan.mp > 1 && module_sums(m, backward))
            tp_sum(b, l, micro);
        if (launched)
            launch_buckets(b, l, m, micro, launched);
    }
}

/* The units [lo, hi) of one model chunk (all of them without a pipeline). */
typedef struct {
    int lo, hi;
} Range;

static void forward(Builder *b, int micro, Activations *a, GArray *deps, Range r)
{
    const ZpSchedule *s = b->s;
    const int L = (int)s->model.layers;
    const gboolean ckpt = s->plan.checkpoint;
    const Cost embed = embed_cost(s), block = block_forward_cost(s);
    if (r.lo == 0) {
        position_begin(b, zp_pos_fwd(0), micro, deps);
        emit_compute(b, ZP_COMP_EMBED_FWD, 0, micro, embed, (uint32_t *)deps->data, deps->len);
        if (s->plan.mp > 1) /* VocabParallelEmbedding sums its rows' lookups */
            tp_sum(b, 0, micro);
        position_end(b, zp_pos_fwd(0), micro);
    }
    for (int l = MAX(r.lo, 1); l <= MIN(r.hi - 1, L); l++) {
        position_begin(b, zp_pos_fwd(l), micro, deps);
        if (ckpt) {
            checkpoint_boundary(b);
            keep_checkpoint(b, l, micro, a, deps);
        } else {
            uint32_t alloc = emit_alloc(b, ZP_MEM_ACTIVATIONS, a->act_bytes, l, micro,
                                        act_slot(b, a->act, micro, l), &b->last_compute, 1);
            g_array_append_val(deps, alloc);
        }
        block_compute(b, ZP_COMP_BLOCK_FWD, l, micro, zp_pos_fwd(l), block, deps, NULL);
        if (ckpt)
            checkpoint_boundary(b);
        position_end(b, zp_pos_fwd(l), micro);
    }
}

/* ZpImpl tied_grad_waits: when the tied head's wte gradient is reduced through a held bucket
 * buffer, the head writes it into a buffer of its own (wte's elements in the gradients'
 * dtype, kept until the embedding's backward has added to it and it is copied into the
 * bucket). A bucket buffer of wte's own is already allocated at the head. */
static void alloc_tied_grad(Builder *b, int micro, GArray *deps)
{
    const ZpSchedule *s = b->s;
    if (!b->impl->tied_grad_waits || !s->model.tied_embeddings || !unit_held(b, 0))
        return;
    const uint64_t wte = s->unit_offset[0];
    for (guint i = b->unit_first[0]; i <= b->unit_last[0] && i < b->buckets->len; i++)
        if (bucket(b, i)->spec.lo <= wte && wte < bucket(b, i)->spec.hi &&
            own_buffer(b, bucket(b, i)))
            return;
    if (b->tied_grad_bytes == 0) { /* wte's share, the same every micro-step */
        GArray *tensors = zp_impl_tensors(s);
        b->tied_grad_bytes =
            (double)g_array_index(tensors, ZpImplTensor, 0).elems * s->elem_bytes;
        g_array_unref(tensors);
    }
    const uint32_t alloc = emit_alloc(b, ZP_MEM_BUCKETS, b->tied_grad_bytes, 0, micro,
                                      &b->tied_grad, &b->last_compute, 1);
    g_array_append_val(deps, alloc);
}

/* The head output gradient's fp32 b s h bytes, kept from the head to its backward. */
static double head_grad_bytes(const ZpSchedule *s)
{
    return 4.0 * s->plan.micro_batch * (double)s->model.seq_len * (double)s->model.hidden;
}

/* Before micro-step `micro`'s first backward op: its kept head gradient goes back (freed). */
static void release_head_grad(Builder *b, int micro)
{
    if (b->head_grad[micro] < 0)
        return;
    const uint32_t free_op =
        emit_free(b, ZP_MEM_WORKSPACE, head_grad_bytes(b->s), (int)b->s->model.layers + 1, micro,
                  b->head_grad[micro], b->last_compute);
    g_array_append_val(b->sync_deps, free_op);
    b->head_grad[micro] = -1;
}

/* The head (forward and backward in one op); `keep`: its output gradient is kept aside. */
static void head(Builder *b, int micro, gboolean reduce, gboolean keep, GArray *deps,
                 GArray *launched)
{
    const ZpSchedule *s = b->s;
    const int L = (int)s->model.layers;
    const Cost c = head_cost(s);
    const double logits_bytes = 4.0 * s->plan.micro_batch * (double)s->model.seq_len *
                                (double)s->model.vocab / s->plan.mp;
    if (reduce || (held_span(b) == ZP_HELD_FROM_FIRST && zp_plan_pp(&s->plan) == 1))
        alloc_held_buckets(b, micro); /* a no-op once taken */
    position_begin(b, zp_pos_head(L), micro, deps);
    int logits;
    uint32_t alloc = emit_alloc(b, ZP_MEM_WORKSPACE, logits_bytes, L + 1, micro, &logits,
                                &b->last_compute, 1);
    g_array_append_val(deps, alloc);
    take_unit_grads(b, L + 1, micro, deps);
    if (s->model.tied_embeddings) /* the tied LM head's wte gradient */
        take_unit_grads(b, 0, micro, deps);
    if (reduce && s->plan.zero.stage >= 2) {
        alloc_landing_buckets(b, L + 1, micro, deps);
        if (s->model.tied_embeddings) /* the tied LM head's wte gradient */
            alloc_landing_buckets(b, 0, micro, deps);
        alloc_tied_grad(b, micro, deps);
    }
    if (reduce)
        hand_on(b, L + 1, -1, micro, deps);
    emit_compute(b, ZP_COMP_HEAD, L + 1, micro, c,
                 (uint32_t *)deps->data, deps->len);
    const uint32_t head_op = b->last_compute;
    vocab_parallel_head(b, micro);
    const uint32_t freed[2] = {
        emit_free(b, ZP_MEM_WORKSPACE, logits_bytes, L + 1, micro, logits, head_op),
        b->workspace_free};
    if (keep)
        emit_alloc(b, ZP_MEM_WORKSPACE, head_grad_bytes(s), L + 1, micro, &b->head_grad[micro],
                   freed, 2);
    position_end(b, zp_pos_head(L), micro);
    if (reduce)
        launch_buckets(b, L + 1, -1, micro, launched);
}

static void backward(Builder *b, int micro, gboolean reduce, Activations *a, GArray *deps,
                     GArray *launched, Range r)
{
    const ZpSchedule *s = b->s;
    const int L = (int)s->model.layers;
    const gboolean ckpt = s->plan.checkpoint;
    const Cost fwd = block_forward_cost(s), bwd = block_backward_cost(s), embed = embed_cost(s);
    for (int l = MIN(r.hi - 1, L); l >= MAX(r.lo, 1); l--) {
        int *act = act_slot(b, a->act, micro, l);
        /* The recompute has a position of its own (empty without checkpointing): an
         * implementation may gather for it and again for the backward. */
        position_begin(b, zp_pos_rec(L, l), micro, deps);
        if (ckpt) {
            checkpoint_boundary(b);
            regather_checkpoint(b, l, micro, a);
            uint32_t alloc = emit_alloc(b, ZP_MEM_ACTIVATIONS, a->act_bytes, l, micro, act,
                                        &b->last_compute, 1);
            g_array_append_val(deps, alloc);
            block_compute(b, ZP_COMP_RECOMPUTE, l, micro, zp_pos_rec(L, l), fwd, deps, NULL);
        }
        position_end(b, zp_pos_rec(L, l), micro);
        const int pos = zp_pos_bwd(L, l);
        position_begin(b, pos, micro, deps);
        if (reduce && s->plan.zero.stage >= 2)
            alloc_landing_buckets(b, l, micro, deps);
        take_unit_grads(b, l, micro, deps);
        block_compute(b, ZP_COMP_BLOCK_BWD, l, micro, pos, bwd, deps, reduce ? launched : NULL);
        if (ckpt)
            checkpoint_boundary(b);
        emit_free(b, ZP_MEM_ACTIVATIONS, a->act_bytes, l, micro, *act, b->last_compute);
        if (ckpt && *act_slot(b, a->ckpt, micro, l) >= 0)
            emit_free(b, ZP_MEM_CHECKPOINTS,
                      a->rule.regathered ? a->rule.full_bytes : a->rule.gpu_bytes, l, micro,
                      *act_slot(b, a->ckpt, micro, l), b->last_compute);
        position_end(b, pos, micro);
        if (reduce)
            launch_buckets(b, l, -1, micro, launched);
    }
    if (r.lo != 0)
        return;
    position_begin(b, zp_pos_embed_bwd(L), micro, deps);
    if (reduce && s->plan.zero.stage >= 2 && !s->model.tied_embeddings)
        alloc_landing_buckets(b, 0, micro, deps); /* untied: wte's gradient starts here */
    take_unit_grads(b, 0, micro, deps);
    if (reduce)
        hand_on(b, 0, -1, micro, deps);
    emit_compute(b, ZP_COMP_EMBED_BWD, 0, micro, embed, (uint32_t *)deps->data, deps->len);
    if (b->tied_grad >= 0) {
        emit_free(b, ZP_MEM_BUCKETS, b->tied_grad_bytes, 0, micro, b->tied_grad,
                  b->last_compute);
        b->tied_grad = -1;
    }
    position_end(b, zp_pos_embed_bwd(L), micro);
    if (reduce) {
        launch_buckets(b, 0, -1, micro, launched);
        if (held_span(b) != ZP_HELD_ALL_STEP)
            free_held_buckets(b, micro, NONE);
        /* the engine's epilogue (stage3.py independent_gradient_partition_epilogue)
         * synchronises the reductions' stream: the host waits for the last of them */
        if (b->n_reduce_events > 0)
            b->reduce_gate = b->reduce_event[(b->n_reduce_events - 1) % 3];
        b->n_reduce_events = 0;
    }
}

/* ---- pipeline sends -------------------------------------------------------------------- */

/* The send of (chunk, micro, direction): its index among every stage's sends. */
static int64_t send_key(const Builder *b, int chunk, int micro, ZpP2pKind dir)
{
    return ((int64_t)chunk * b->s->plan.grad_accum + micro) * ZP_P2P_N + dir;
}

/* Sends the chunk's output activations (forward) or its input gradients (backward) to the
 * neighbouring stage once the last compute op and its tensor-parallel all-reduces are done:
 * b s h elements, or b s h / t when sequence parallelism keeps the sequence split over the
 * TP group (Megatron's p2p_communication sends each rank's own part). */
static void send(Builder *b, int chunk, int micro, ZpP2pKind dir, int unit)
{
    const ZpSchedule *s = b->s;
    uint64_t elems = (uint64_t)s->plan.micro_batch * (uint64_t)s->model.seq_len *
                     (uint64_t)s->model.hidden;
    if (s->plan.sequence_parallel)
        elems /= (uint64_t)s->plan.mp;
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_array_append_val(deps, b->last_compute);
    g_array_append_vals(deps, b->sync_deps->data, b->sync_deps->len);
    const int P = zp_plan_pp(&s->plan);
    const int peer = dir == ZP_P2P_SEND_NEXT ? (b->stage + 1) % P : (b->stage + P - 1) % P;
    ZpOp op = {.kind = ZP_OP_P2P, .sub = dir, .stream = ZP_STREAM_PP, .group = ZP_GROUP_PP,
               .unit = unit, .micro = micro, .buffer = -1, .peer = (uint32_t)peer,
               .bytes = (double)elems * s->elem_bytes, .elems = elems};
    b->send_op[send_key(b, chunk, micro, dir)] = emit(b, op, (uint32_t *)deps->data, deps->len);
    g_array_unref(deps);
}

/* A tied word embedding under a pipeline: the first stage (the embedding) and the last (the
 * head's copy of it) each send the other its gradient once its last backward is done, and the
 * stage's next compute op or collective (its first gradient reduction, or its optimizer) waits
 * for the other's and adds it first. DeepSpeed's TrainSchedule runs ReduceTiedGrads before
 * ReduceGrads (deepspeed/runtime/pipe/schedule.py; engine.py _exec_reduce_tied_grads calls
 * module.py allreduce_tied_weight_gradients, an all-reduce over the TiedLayerSpec's group);
 * Megatron all-reduces word_embeddings' main_grad over its embedding group of the first and
 * last stage (megatron/core/distributed/finalize_model_grads.py
 * _allreduce_word_embedding_grads). Two ranks' all-reduce sends S each way, as here. */
static void tied_sync(Builder *b)
{
    const ZpSchedule *s = b->s;
    const int P = zp_plan_pp(&s->plan), L = (int)s->model.layers;
    if (P == 1 || !s->model.tied_embeddings || (b->stage != 0 && b->stage != P - 1))
        return;
    const uint64_t elems = ((uint64_t)s->model.vocab + (uint64_t)s->plan.mp - 1) /
                           (uint64_t)s->plan.mp * (uint64_t)s->model.hidden;
    const gboolean first = b->stage == 0;
    const int chunk = first ? 0 : b->n_chunks - 1, last_micro = s->plan.grad_accum - 1;
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_array_append_val(deps, b->last_compute);
    g_array_append_vals(deps, b->sync_deps->data, b->sync_deps->len);
    ZpOp op = {.kind = ZP_OP_P2P, .sub = ZP_P2P_TIED, .stream = ZP_STREAM_PP,
               .group = ZP_GROUP_PP, .unit = first ? 0 : L + 1, .micro = last_micro,
               .buffer = -1, .peer = (uint32_t)(first ? P - 1 : 0),
               .bytes = (double)elems * b->state.grad_bytes, .elems = elems};
    b->send_op[send_key(b, chunk, last_micro, ZP_P2P_TIED)] =
        emit(b, op, (uint32_t *)deps->data, deps->len);
    g_array_unref(deps);
    b->recv_key = send_key(b, first ? b->n_chunks - 1 : 0, last_micro, ZP_P2P_TIED);
}

/* A step-level op (unit and micro-step -1) after deps[0 .. n). */
static uint32_t emit_step_op(Builder *b, ZpOp op, const uint32_t *deps, guint n)
{
    op.unit = -1, op.micro = -1, op.buffer = -1;
    op.stream = op.kind == ZP_OP_TRANSFER ? (op.sub == ZP_XFER_H2D ? ZP_STREAM_HOST
                                                                   : ZP_STREAM_NVME)
                                          : ZP_STREAM_CPU;
    return emit(b, op, deps, n);
}

/* Optimizer offload: CPU Adam on the host's share once every gradient slice has arrived,
 * sub-group by sub-group (zp_offload_sub_group_step): its states swapped in from NVMe
 * (ZeRO-Infinity) once the previous sub-group's are out of the swap buffers, the step after
 * the previous one, then its 16-bit parameters back to the GPU (or NVMe) and its states out.
 * It overlaps nothing: DeepSpeed steps after backward, the GPU's share (`gpu_opt`, partial
 * offload) before the host's. Returns the op the parameter all-gathers wait for (the last
 * transfer up, which follows the ones before it). */
static uint32_t cpu_optimizer_step(Builder *b, double elems, GArray *launched, uint32_t gpu_opt)
{
    const ZpPlan *plan = &b->s->plan;
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_array_append_vals(deps, launched->data, launched->len);
    g_array_append_vals(deps, b->offloaded->data, b->offloaded->len);
    g_array_append_val(deps, gpu_opt);
    uint32_t adam = NONE, out = NONE, up = NONE; /* the last of each so far */
    const double adam_bytes = zp_offload_cpu_adam_bytes(plan);
    for (int j = 0; j < zp_offload_sub_group_count(plan, elems); j++) {
        ZpOffloadStep step;
        zp_offload_sub_group_step(plan, elems, j, &step);
        uint32_t done = gpu_opt; /* what its parameters' write-back follows */
        if (step.on_cpu) {
            const uint32_t before[2] = {out, adam};
            g_array_append_vals(deps, before, 2);
            if (step.nvme_read_bytes > 0) {
                const ZpOp read = {.kind = ZP_OP_TRANSFER, .sub = ZP_XFER_NVME_READ,
                                   .bytes = step.nvme_read_bytes};
                const uint32_t r = emit_step_op(b, read, (uint32_t *)deps->data, deps->len);
                g_array_append_val(deps, r);
            }
            const ZpOp op = {.kind = ZP_OP_COMPUTE, .sub = ZP_COMP_CPU_OPTIMIZER,
                             .mem_bytes = step.elems * adam_bytes};
            done = adam = emit_step_op(b, op, (uint32_t *)deps->data, deps->len);
            g_array_set_size(deps, 0);
        }
        const uint32_t after[2] = {done, out}, after_up[2] = {done, up};
        if (step.nvme_write_bytes > 0)
            out = emit_step_op(b, (ZpOp){.kind = ZP_OP_TRANSFER, .sub = ZP_XFER_NVME_WRITE,
                                         .bytes = step.nvme_write_bytes}, after, 2);
        if (step.h2d_bytes > 0)
            up = emit_step_op(b, (ZpOp){.kind = ZP_OP_TRANSFER, .sub = ZP_XFER_H2D,
                                        .bytes = step.h2d_bytes}, after_up, 2);
    }
    g_array_unref(deps);
    return up != NONE ? up : adam != NONE ? adam : gpu_opt;
}

/* The implementation's buffers around the optimizer, then the optimizer on this rank's
 * partition, then (stages 1-2) the all-gather of the updated 16-bit partitions in
 * allgather_bucket_size chunks. For those all-gathers elem_offset is the offset inside every
 * rank's partition and elems the gathered total. Stage 3 refreshes the full copies of its
 * persistent parameters. */
static void optimizer_step(Builder *b, GArray *launched)
{
    const ZpSchedule *s = b->s;
    const int stage = s->plan.zero.stage;
    GArray *kept = g_array_new(FALSE, FALSE, sizeof(ZpFetch));
    if (stage == 3)
        b->impl->persistent(s, kept);
    const gboolean freed = b->impl->persistent_freed_for_step && kept->len > 0;
    if (freed) { /* the step-long copies (buffer -1), freed when the step begins */
        ZpOp op = {.kind = ZP_OP_FREE, .sub = ZP_MEM_GATHERED_PARAMS, .unit = -1, .micro = -1,
                   .buffer = -1, .bytes = s->state_bytes[ZP_MEM_GATHERED_PARAMS]};
        const uint32_t release = emit(b, op, (uint32_t *)launched->data, launched->len);
        g_array_append_val(launched, release);
    }
    const double elems = stage == 0 ? (double)s->total_elems : (double)s->partition_elems;
    const double cpu_share = zp_offload_cpu_share(&s->plan, elems);
    const Cost c = optimizer_cost(b, (1.0 - cpu_share) * elems);
    GArray *step = g_array_new(FALSE, FALSE, sizeof(ZpStepBuffer));
    if (cpu_share < 1.0) /* the GPU's step (all of it without optimizer offload) */
        b->impl->step_buffers(s, step);
    int *ids = g_new(int, step->len + 1);
    uint32_t previous = NONE;
    for (guint i = 0; i < step->len; i++) {
        const ZpStepBuffer *sb = &g_array_index(step, ZpStepBuffer, i);
        g_array_append_val(launched, previous);
        previous = emit_alloc(b, sb->cat, sb->bytes, -1, -1, &ids[i], (uint32_t *)launched->data,
                              launched->len);
        g_array_set_size(launched, launched->len - 1);
        if (i > 0 && g_array_index(step, ZpStepBuffer, i - 1).transient)
            emit_free(b, g_array_index(step, ZpStepBuffer, i - 1).cat,
                      g_array_index(step, ZpStepBuffer, i - 1).bytes, -1, -1, ids[i - 1],
                      previous);
    }
    g_array_append_val(launched, previous);
    uint32_t opt = cpu_share < 1.0 ? emit_compute(b, ZP_COMP_OPTIMIZER, -1, -1, c,
                                                  (uint32_t *)launched->data, launched->len)
                                   : NONE;
    g_array_set_size(launched, launched->len - 1);
    for (guint i = 0; i < step->len; i++) {
        const ZpStepBuffer *sb = &g_array_index(step, ZpStepBuffer, i);
        if (!sb->transient || i + 1 == step->len)
            emit_free(b, sb->cat, sb->bytes, -1, -1, ids[i], opt);
    }
    if (b->grad_state >= 0) { /* the gradient state the first reduction took */
        emit_free(b, ZP_MEM_GRADS, b->grad_state_bytes, -1, -1, b->grad_state, opt);
        b->grad_state = -1;
    }
    g_free(ids);
    g_array_unref(step);
    if (cpu_share > 0)
        opt = cpu_optimizer_step(b, elems, launched, opt);
    if (stage == 3) {
        /* Persistent parameters are never gathered before use, so their full copies (buffer
         * -1: the step-long state) are refreshed from the updated partitions here, each into
         * a buffer taken again just before its all-gather when they were freed. */
        for (guint i = 0; i < kept->len; i++) {
            const ZpFetch *f = &g_array_index(kept, ZpFetch, i);
            const double bytes = (double)f->elems * b->state.param_bytes;
            ZpOp op = {.kind = ZP_OP_ALLOC, .sub = ZP_MEM_GATHERED_PARAMS, .unit = f->unit,
                       .micro = -1, .buffer = -1, .bytes = bytes};
            const uint32_t taken = freed ? emit(b, op, &opt, 1) : opt;
            emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_DP, f->unit, -1, -1, f->offset,
                            f->elems, bytes, &taken, 1);
        }
        g_array_unref(kept);
        return;
    }
    g_array_unref(kept);
    if (stage != 1 && stage != 2)
        return;
    const uint64_t dp = (uint64_t)s->plan.dp;
    const uint64_t chunk = MAX((uint64_t)1, (uint64_t)(s->plan.zero.allgather_bucket_size / dp));
    const gboolean buffered = b->impl->post_step_gather_buffer;
    /* One chunk's buffer at a time, as the memory model counts it: a chunk takes its
     * buffer only when the previous chunk's all-gather is done. In place (no buffer), the
     * chunks still go one after another on the stream. */
    previous = NONE;
    for (uint64_t off = 0; off < s->partition_elems; off += chunk) {
        const uint64_t n = MIN(chunk, s->partition_elems - off) * dp;
        const double bytes = (double)n * b->state.param_bytes;
        int buffer = -1;
        const uint32_t adeps[2] = {opt, previous};
        uint32_t alloc = buffered ? emit_alloc(b, ZP_MEM_BUCKETS, bytes, -1, -1, &buffer, adeps, 2)
                                  : NONE;
        const uint32_t cdeps[2] = {alloc, buffered ? NONE : opt};
        previous = emit_collective(b, ZP_COLL_ALLGATHER, ZP_GROUP_DP, -1, -1, buffer, off, n,
                                   bytes, cdeps, 2);
        if (buffered)
            emit_free(b, ZP_MEM_BUCKETS, bytes, -1, -1, buffer, previous);
    }
}

static gboolean check_plan(const ZpModel *model, const ZpPlan *p, GError **error)
{
    const char *bad = NULL;
    if (!zp_model_has_architecture(model))
        bad = "model: a schedule needs an architecture (--model, not --params)";
    else if (p->zero.stage < 0 || p->zero.stage > 3)
        bad = "stage: must be 0, 1, 2 or 3";
    else if (p->impl < 0 || p->impl >= ZP_IMPL_N)
        bad = "impl: must be deepspeed, fsdp or paper";
    else if (!zp_impl_get(p->impl)->has_stage(p->zero.stage))
        bad = "stage: --impl fsdp has stages 0 (NO_SHARD), 2 (SHARD_GRAD_OP) and 3 (FULL_SHARD), "
              "no stage 1";


    else if (p->dp < 1 || p->mp < 1)
        bad = "gpus/mp: data- and tensor-parallel degrees must be at least 1";
    else if (model->heads % p->mp != 0)
        bad = "mp: the tensor-parallel degree must divide the attention heads";
    else if (p->micro_batch < 1 || p->grad_accum < 1)
        bad = "micro-batch/grad-accum: must be at least 1";
    /* DeepSpeed takes 0 for the reduce bucket (every parameter then bypasses it) and the
     * stage-3 sizes (no prefetch, nothing persistent, nothing kept live ahead), but divides by
     * allgather_bucket_size (runtime/utils.py all_gather_dp_groups). */
    else if (p->zero.reduce_bucket_size < 0 || p->zero.allgather_bucket_size < 1)
        bad = "reduce_bucket_size/allgather_bucket_size: must be >= 0 and >= 1 element";
    else if (p->zero.stage3_prefetch_bucket_size < 0 || p->zero.stage3_max_live_parameters < 0 ||
             p->zero.stage3_param_persistence_threshold < 0 || p->zero.sub_group_size < 0)
        bad = "stage3_*/sub_group_size: must be >= 0";


    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s", bad);
        return FALSE;
    }
    if (!zp_zeror_check(model, p, error) || !zp_zeropp_check(p, error))
        return FALSE;
    if (!zp_pipe_check(model, p, error))
        return FALSE;
    if ((int64_t)p->dp * p->mp * zp_plan_pp(p) > INT32_MAX) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "gpus: dp %d x mp %d x pp %d ranks is more than a schedule numbers", p->dp,
                    p->mp, zp_plan_pp(p));
        return FALSE;
    }
    if (!zp_offload_check(p, error))
        return FALSE;
    const double unit_steps = (double)p->grad_accum * (double)(model->layers + 2);
    if (unit_steps > ZP_SCHED_MAX_UNIT_STEPS) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "grad-accum: %d micro-steps x %" G_GINT64_FORMAT " units = %.4g exceeds the "
                    "%.0e a schedule holds (each micro-step's ops are built and simulated one "
                    "by one); raise the micro-batch or lower the accumulation",
                    p->grad_accum, model->layers + 2, unit_steps, ZP_SCHED_MAX_UNIT_STEPS);
        return FALSE;
    }
    return TRUE;
}

/* Whether the action's backward launches gradient reductions: stages 0-1 keep full gradients
 * and reduce once, in the last micro-step; stages 2-3 every micro-step. */
static gboolean reduces(const ZpPlan *plan, int micro)
{
    return plan->zero.stage >= 2 || micro == plan->grad_accum - 1;
}

/* One action of the stage: a forward (with the head on the last chunk) and the send of its
 * output, or a backward and the send of its input gradients, each first waiting for the
 * neighbour's send when there is one. `next`: the stage's action after it, or NULL. */
static void run_action(Builder *b, const ZpPipeAction *x, const ZpPipeAction *next,
                       Activations *a, GArray *deps, GArray *launched)
{
    const ZpPlan *plan = &b->s->plan;
    const Range r = {b->first_unit[x->chunk], b->first_unit[x->chunk + 1]};
    /* A pipeline reduces after its flush (below), not during its backwards. */
    const gboolean last = x->chunk == b->n_chunks - 1;
    const gboolean reduce = zp_plan_pp(plan) == 1 && reduces(plan, x->micro);
    if (plan->zero.stage >= 2 && !x->backward) { /* buckets and launches per micro-step */
        reset_buckets(b);
        g_array_set_size(launched, 0);
    }
    if (!x->backward) {
        b->recv_key = x->chunk > 0 ? send_key(b, x->chunk - 1, x->micro, ZP_P2P_SEND_NEXT) : -1;
        forward(b, x->micro, a, deps, r);
        if (last)
            head(b, x->micro, reduce,
                 plan->backend_workspace && zp_plan_pp(plan) > 1 &&
                     (!next || next->micro != x->micro),
                 deps, launched);
        else
            send(b, x->chunk, x->micro, ZP_P2P_SEND_NEXT, r.hi - 1);
        return;
    }
    b->recv_key = !last ? send_key(b, x->chunk + 1, x->micro, ZP_P2P_SEND_PREV) : -1;
    release_head_grad(b, x->micro);
    backward(b, x->micro, reduce, a, deps, launched, r);
    if (x->chunk > 0)
        send(b, x->chunk, x->micro, ZP_P2P_SEND_PREV, r.lo);
}

/* Pa+cpu: the host tier holds a block's checkpoint slice of a micro-step from its forward
 * host copy to its backward one (partition.cpu() kept in ctx.deepspeed_saved_tensors); the
 * peak over the ops [first, end) of one stage is what its ranks hold: every block's slice
 * without a pipeline, with one the stage's own blocks times the micro-steps in flight there. */
static double host_checkpoint_peak(const ZpSchedule *s, guint first)
{
    GHashTable *held = g_hash_table_new(NULL, NULL);
    double live = 0, peak = 0;
    for (guint i = first; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->kind != ZP_OP_COMPUTE || op->sub != ZP_COMP_HOST_COPY)
            continue;
        const gpointer key = GSIZE_TO_POINTER(1 + (gsize)op->unit +
                                              (gsize)(s->model.layers + 2) * (gsize)op->micro);
        if (g_hash_table_remove(held, key)) {
            live -= op->bytes;
        } else {
            g_hash_table_add(held, key);
            live += op->bytes;
            peak = MAX(peak, live);
        }
    }
    g_hash_table_destroy(held);
    return peak;
}

/* One stage's ops: its layout and buckets, its actions in pipeline order, its optimizer. */
static void build_stage(Builder *b, Activations *a, GArray *deps, GArray *launched)
{
    ZpSchedule *s = b->s;
    const ZpPlan *plan = &s->plan;
    const int P = zp_plan_pp(plan);
    const guint first = s->ops->len;
    b->last_compute = NONE;
    b->resident = -1; /* each stage's ranks hold their own workspace */
    b->workspace_free = NONE;
    g_array_set_size(b->sync_deps, 0);
    g_array_set_size(b->buckets, 0);
    layout(b);
    plan_buckets(b);
    b->ipg[0] = b->ipg[1] = -1; /* none held yet: reset_buckets keeps only those */
    reset_buckets(b);
    b->grad_state = -1;
    for (int u = 0; u < s->n_units; u++)
        b->unit_grad[u] = -1;
    if (held_span(b) == ZP_HELD_ALL_STEP) /* before the step's first op */
        alloc_held_buckets(b, 0);
    g_array_set_size(launched, 0);
    GArray *actions = P > 1 ? zp_pipe_actions(plan->pipe.schedule, P, zp_plan_vstages(plan),
                                              plan->grad_accum, b->stage)
                            : zp_pipe_actions(ZP_PIPE_GPIPE, 1, 1, 0, 0);
    /* Without a pipeline: forward and backward of each micro-step in turn. */
    for (int micro = 0; P == 1 && micro < plan->grad_accum; micro++) {
        const ZpPipeAction f = {micro, 0, FALSE}, w = {micro, 0, TRUE};
        g_array_append_val(actions, f);
        g_array_append_val(actions, w);
    }
    for (guint i = 0; i < actions->len; i++)
        run_action(b, &g_array_index(actions, ZpPipeAction, i),
                   i + 1 < actions->len ? &g_array_index(actions, ZpPipeAction, i + 1) : NULL, a,
                   deps, launched);
    g_array_unref(actions);
    tied_sync(b);
    /* DeepSpeed's pipeline engine reduces the stage's gradients once its last backward is
     * done (TrainSchedule's ReduceGrads after the flush, deepspeed/runtime/pipe/schedule.py),
     * over the stage's own data-parallel group, bucket by bucket from the last unit down. */
    for (int u = s->n_units - 1; P > 1 && u >= 0; u--)
        if (s->unit_elems[u] > 0)
            launch_buckets(b, u, -1, plan->grad_accum - 1, launched);
    if (P > 1 && held_span(b) != ZP_HELD_ALL_STEP)
        free_held_buckets(b, plan->grad_accum - 1, NONE);
    optimizer_step(b, launched);
    if (b->resident >= 0)
        emit_free(b, ZP_MEM_WORKSPACE, zp_cost_resident_workspace_bytes(&s->model, plan), 0, 0,
                  b->resident, b->last_compute);
    if (held_span(b) == ZP_HELD_ALL_STEP) /* after the step's last op */
        free_held_buckets(b, -1, s->ops->len - 1);
    s->host_bytes[ZP_MEM_CHECKPOINTS] = host_checkpoint_peak(s, first);
    memcpy(&s->stage_state_bytes[(gsize)b->stage * ZP_MEM_N], s->state_bytes,
           sizeof s->state_bytes);
    memcpy(&s->stage_host_bytes[(gsize)b->stage * ZP_MEM_N], s->host_bytes,
           sizeof s->host_bytes);
}

/* With a pipeline, host_bytes is the most any stage's ranks hold of each category. */
static void most_host_bytes(ZpSchedule *s)
{
    for (int k = 0; k < s->stages; k++)
        for (int c = 0; c < ZP_MEM_N; c++)
            s->host_bytes[c] = MAX(s->host_bytes[c], s->stage_host_bytes[(gsize)k * ZP_MEM_N + c]);
}

/* Points every receiving op at the send it waits for, now that all stages are built. */
static void link_sends(Builder *b)
{
    for (guint i = 0; i < b->cross_at->len; i++)
        g_array_index(b->s->deps, uint32_t, g_array_index(b->cross_at, uint32_t, i)) =
            b->send_op[g_array_index(b->cross_key, int64_t, i)];
}

ZpSchedule *zp_sched_build(const ZpModel *model, const ZpPlan *plan, GError **error)
{
    if (!check_plan(model, plan, error))
        return NULL;
    const int P = zp_plan_pp(plan), chunks = P * zp_plan_vstages(plan);
    int *first_unit = g_new(int, chunks + 1);
    if (!zp_pipe_partition(model, chunks, plan->pipe.partition, first_unit, error)) {
        g_free(first_unit);
        return NULL;
    }
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->model = *model;
    s->plan = *plan;
    s->world = plan->dp * plan->mp * P;
    s->stages = P;
    s->stage_state_bytes = g_new0(double, (gsize)P * ZP_MEM_N);
    s->stage_host_bytes = g_new0(double, (gsize)P * ZP_MEM_N);
    if (P > 1)
        s->stage_unit_elems = g_new0(uint64_t, (gsize)P * (gsize)zp_model_n_units(model));
    s->elem_bytes = zp_plan_elem_bytes(plan->precision);
    s->ops = g_array_new(FALSE, FALSE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    const int L = (int)model->layers;
    Builder b = {.s = s, .impl = zp_impl_get(plan->impl),
                 .state = zp_plan_state_bytes(plan->precision, plan->optimizer),
                 .last_compute = NONE,
                 .sync_deps = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .pos_last_op = g_array_new(FALSE, TRUE, sizeof(uint32_t)),
                 .buckets = g_array_new(FALSE, FALSE, sizeof(Bucket)),
                 .waits = g_array_new(FALSE, FALSE, sizeof(Wait)),
                 .unit_first = g_new0(guint, (gsize)L + 2),
                 .unit_last = g_new0(guint, (gsize)L + 2),
                 .unit_grad = g_new(int, (gsize)L + 2),
                 .launch = g_array_new(FALSE, FALSE, sizeof(guint)),
                 .launch_start = g_new0(guint, (gsize)L + 3),
                 .gathers = g_array_new(FALSE, FALSE, sizeof(Gather)),
                 .n_chunks = chunks, .first_unit = first_unit,
                 .send_op = g_new(uint32_t, (gsize)chunks * (gsize)plan->grad_accum * ZP_P2P_N),
                 .recv_key = -1,
                 .cross_at = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .cross_key = g_array_new(FALSE, FALSE, sizeof(int64_t)),
                 .offloaded = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .resident = -1, .workspace_free = NONE, .tied_grad = -1,
                 .block_workspace = -1, .module_step = -1,
                 .runahead = plan->zero.stage == 3 && zp_impl_get(plan->impl)->host_runahead &&
                             !plan->no_runahead,
                 .fetch_gate = NONE, .reduce_gate = NONE, .host_alloc = NONE,
                 .gated = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                 .head_grad = g_new(int, (gsize)plan->grad_accum)};
    for (int m = 0; m < plan->grad_accum; m++)
        b.head_grad[m] = -1;
    for (int stream = 0; stream < ZP_STREAM_N; stream++)
        b.last_on_stream[stream] = NONE;
    const int n_pos = zp_pos_count(L);
    g_array_set_size(b.pos_last_op, (guint)n_pos);
    if (plan->zero.stage == 3) { /* never with a pipeline (zp_pipe_check) */
        layout(&b);
        plan_gathers(&b);
        b.by_trigger = index_gathers(&b, G_STRUCT_OFFSET(ZpFetch, trigger_pos),
                                     G_STRUCT_OFFSET(ZpFetch, trigger_step), n_pos);
        b.by_use = index_gathers(&b, G_STRUCT_OFFSET(ZpFetch, use_pos),
                                 G_STRUCT_OFFSET(ZpFetch, use_step), n_pos);
        b.by_free = index_gathers(&b, G_STRUCT_OFFSET(ZpFetch, free_pos),
                                  G_STRUCT_OFFSET(ZpFetch, free_step), n_pos);
    }
    const gsize slots = (gsize)plan->grad_accum * (gsize)(L + 1);
    Activations a = {g_new0(int, slots), g_new0(int, slots),
                     zp_mem_plan_activation_block_bytes(model, plan),
                     zp_zeror_checkpoint(model, plan)};
    GArray *deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    GArray *launched = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (b.stage = 0; b.stage < P; b.stage++)
        build_stage(&b, &a, deps, launched);
    if (b.runahead)
        zp_runahead_bound(s, b.gated);
    g_array_unref(b.gated);
    most_host_bytes(s);
    link_sends(&b);
    g_array_unref(deps);
    g_array_unref(launched);
    g_free(a.act);
    g_free(a.ckpt);
    g_array_unref(b.sync_deps);
    g_array_unref(b.pos_last_op);
    g_array_unref(b.buckets);
    g_array_unref(b.waits);
    if (b.tensors)
        g_array_unref(b.tensors);
    g_free(b.unit_first);
    g_free(b.unit_last);
    g_free(b.unit_grad);
    g_array_unref(b.launch);
    g_free(b.launch_start);
    g_array_unref(b.gathers);
    g_free(b.first_unit);
    g_free(b.send_op);
    g_free(b.head_grad);
    g_array_unref(b.cross_at);
    g_array_unref(b.cross_key);
    g_array_unref(b.offloaded);
    free_pos_index(&b.by_trigger);
    free_pos_index(&b.by_use);
    free_pos_index(&b.by_free);
    return s;
}

/* As layout() pads them, from the three unit sizes (the blocks are identical) instead of a
 * walk over every unit. */
uint64_t zp_sched_optimizer_elems(const ZpModel *model, const ZpPlan *plan)
{
    const uint64_t dp = (uint64_t)plan->dp;
    const uint64_t L = (uint64_t)model->layers;
    const uint64_t first = zp_model_unit_tp_elems(model, 0, plan->mp);
    const uint64_t block = zp_model_unit_tp_elems(model, 1, plan->mp);
    const uint64_t last = zp_model_unit_tp_elems(model, (int)L + 1, plan->mp);
    const uint64_t total = first + L * block + last;
    if (plan->zero.stage == 0)
        return total;
    if (plan->zero.stage == 3)
        return (zp_mem_padded_elems(first, dp) + L * zp_mem_padded_elems(block, dp) +
                zp_mem_padded_elems(last, dp)) / dp;
    return zp_mem_padded_elems(total, dp) / dp;
}

void zp_sched_compute_ops(const ZpModel *model, const ZpPlan *plan,
                          ZpComputeOps ops[ZP_COMP_N])
{
    const ZpSchedule s = {.model = *model, .plan = *plan,
                          .elem_bytes = zp_plan_elem_bytes(plan->precision)};
    const Builder b = {.state = zp_plan_state_bytes(plan->precision, plan->optimizer)};
    const uint64_t L = (uint64_t)model->layers;
    const Cost fwd = block_forward_cost(&s), bwd = block_backward_cost(&s);
    const Cost embed = embed_cost(&s), head = head_cost(&s);
    const double opt_elems = (double)zp_sched_optimizer_elems(model, plan);
    const double cpu_share = zp_offload_cpu_share(plan, opt_elems);
    const Cost opt = optimizer_cost(&b, (1.0 - cpu_share) * opt_elems);
    const Cost cpu_opt = {.mem_bytes = cpu_share * opt_elems * zp_offload_cpu_adam_bytes(plan)};
    const uint64_t micro = (uint64_t)plan->grad_accum;
    const struct {
        uint64_t count;
        Cost cost;
    } kinds[ZP_COMP_N] = {
        [ZP_COMP_EMBED_FWD] = {micro, embed},
        [ZP_COMP_BLOCK_FWD] = {micro * L, fwd},
        [ZP_COMP_HEAD] = {micro, head},
        [ZP_COMP_RECOMPUTE] = {plan->checkpoint ? micro * L : 0, fwd},
        [ZP_COMP_BLOCK_BWD] = {micro * L, bwd},
        [ZP_COMP_EMBED_BWD] = {micro, embed},
        [ZP_COMP_OPTIMIZER] = {cpu_share < 1.0, opt},
        [ZP_COMP_CPU_OPTIMIZER] = {cpu_share > 0, cpu_opt},
        [ZP_COMP_HOST_COPY] = {zp_zeror_checkpoint(model, plan).copy_bytes > 0 ? 2 * micro * L : 0,
                               {0}},
    };
    for (int k = 0; k < ZP_COMP_N; k++)
        ops[k] = (ZpComputeOps){kinds[k].count, kinds[k].cost.flops, kinds[k].cost.gemm_flops,
                                kinds[k].cost.attn_flops, kinds[k].cost.mem_bytes,
                                k == ZP_COMP_HOST_COPY ? zp_zeror_checkpoint(model, plan).copy_bytes
                                                       : 0.0};
}

ZpSchedule *zp_sched_stage_view(const ZpSchedule *s, int stage)
{
    g_return_val_if_fail(stage >= 0 && stage < MAX(s->stages, 1), NULL);
    ZpSchedule *v = g_memdup2(s, sizeof *s);
    v->ops = g_array_ref(s->ops);
    v->deps = g_array_ref(s->deps);
    v->view_stage = stage;
    const gsize n = (gsize)s->n_units, stages = (gsize)MAX(s->stages, 1);
    v->stage_state_bytes = g_memdup2(s->stage_state_bytes, sizeof(double) * stages * ZP_MEM_N);
    v->stage_host_bytes = g_memdup2(s->stage_host_bytes, sizeof(double) * stages * ZP_MEM_N);
    v->stage_unit_elems = s->stage_unit_elems
                              ? g_memdup2(s->stage_unit_elems, sizeof(uint64_t) * stages * n)
                              : NULL;
    v->unit_offset = g_new0(uint64_t, n);
    v->unit_elems = g_memdup2(s->stage_unit_elems ? &s->stage_unit_elems[(gsize)stage * n]
                                                  : s->unit_elems,
                              sizeof(uint64_t) * n);
    place_units(v);
    if (s->stage_state_bytes) /* a schedule read from a file has one stage, its own */
        memcpy(v->state_bytes, &s->stage_state_bytes[(gsize)stage * ZP_MEM_N],
               sizeof v->state_bytes);
    if (s->stage_host_bytes)
        memcpy(v->host_bytes, &s->stage_host_bytes[(gsize)stage * ZP_MEM_N],
               sizeof v->host_bytes);
    return v;
}

/* Ring volumes: what one member of an n-rank group sends; a p2p send moves its bytes once.
 * With pipeline stages, the most any stage's rank sends. */
double zp_sched_comm_bytes(const ZpSchedule *s, ZpGroup group)
{
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(s, groups);
    const double n = (int)group < n_groups ? groups[group].ranks : 1;
    double *total = g_new0(double, MAX(s->stages, 1)), most = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        if (op->group != group || (op->kind != ZP_OP_COLLECTIVE && op->kind != ZP_OP_P2P))
            continue;
        const double factor = op->sub == ZP_COLL_ALLREDUCE ? 2.0 : 1.0;
        total[op->stage] += op->kind == ZP_OP_P2P ? op->bytes : factor * (n - 1) / n * op->bytes;
    }
    for (int k = 0; k < MAX(s->stages, 1); k++)
        most = MAX(most, total[k]);
    g_free(total);
    return most;
}

/* ---- names and JSON -------------------------------------------------------------------- */

int zp_sched_groups(const ZpSchedule *s, ZpCommGroup out[ZP_SCHED_MAX_GROUPS])
{
    if (s->n_groups > 0) {
        memcpy(out, s->groups, (size_t)s->n_groups * sizeof *out);
        return s->n_groups;
    }
    /* Ranks are tp-fastest, then pipeline stage, then dp (Megatron's order). */
    const int stages = MAX(s->stages, 1);
    out[ZP_GROUP_DP] = (ZpCommGroup){.ranks = s->plan.dp, .stride = s->plan.mp * stages};
    out[ZP_GROUP_TP] = (ZpCommGroup){.ranks = s->plan.mp, .stride = 1};
    out[ZP_GROUP_PP] = (ZpCommGroup){.ranks = stages, .stride = s->plan.mp};
    /* ZeRO++'s subgroups of dp (zp_zeropp_group_ranks; one rank each where unused): hpZ's
     * and a node's consecutive dp ranks, and one dp rank of each node. */
    const int dp_stride = s->plan.mp * stages;
    const int local = zp_zeropp_group_ranks(&s->plan, ZP_GROUP_NODE);
    out[ZP_GROUP_HPZ] = (ZpCommGroup){.ranks = zp_zeropp_group_ranks(&s->plan, ZP_GROUP_HPZ),
                                      .stride = dp_stride};
    out[ZP_GROUP_NODE] = (ZpCommGroup){.ranks = local, .stride = dp_stride};
    out[ZP_GROUP_XNODE] = (ZpCommGroup){.ranks = zp_zeropp_group_ranks(&s->plan, ZP_GROUP_XNODE),
                                        .stride = dp_stride * local};
    for (int g = 0; g < ZP_GROUP_N; g++)
        g_strlcpy(out[g].name, zp_sched_group_names[g], sizeof out->name);
    return ZP_GROUP_N;
}

/* Compute runs on the compute stream (CPU Adam on the CPU's), a collective on its group's
 * (tp's on the tp stream, every other group's on NCCL's dp stream), a transfer on the host
 * link's or the NVMe's, a pipeline send on the pp stream, unless "stream" says otherwise
 * (written only then). */
static ZpStream default_stream(int kind, int sub, int group)
{
    if (kind == ZP_OP_TRANSFER)
        return sub == ZP_XFER_D2H || sub == ZP_XFER_H2D ? ZP_STREAM_HOST : ZP_STREAM_NVME;
    if (kind == ZP_OP_COMPUTE)
        return sub == ZP_COMP_CPU_OPTIMIZER ? ZP_STREAM_CPU : ZP_STREAM_COMPUTE;
    if (kind == ZP_OP_P2P)
        return ZP_STREAM_PP;
    if (kind != ZP_OP_COLLECTIVE)
        return ZP_STREAM_COMPUTE;
    return group == ZP_GROUP_TP ? ZP_STREAM_TP : ZP_STREAM_DP;
}

static json_t *op_to_json(const ZpSchedule *s, const ZpCommGroup *groups, const ZpOp *op)
{
    json_t *deps = json_array();
    const uint32_t *d = zp_sched_deps(s, op);
    for (uint32_t i = 0; i < op->n_deps; i++)
        json_array_append_new(deps, json_integer(d[i]));
    json_t *o = json_pack("{s:s, s:i, s:i}", "kind", zp_sched_kind_names[op->kind], "unit", op->unit,
                          "micro", op->micro);
    switch (op->kind) {
    case ZP_OP_COMPUTE:
        json_object_set_new(o, "op", json_string(zp_sched_compute_names[op->sub]));
        json_object_set_new(o, "flops", json_real(op->flops));
        json_object_set_new(o, "gemm_flops", json_real(op->gemm_flops));
        json_object_set_new(o, "attn_flops", json_real(op->attn_flops));
        json_object_set_new(o, "mem_bytes", json_real(op->mem_bytes));
        if (op->bytes > 0)
            json_object_set_new(o, "bytes", json_real(op->bytes));
        if (zp_op_module(op) >= 0)
            json_object_set_new(o, "module", json_string(zp_model_module_name(zp_op_module(op))));
        break;
    case ZP_OP_COLLECTIVE:
        json_object_set_new(o, "op", json_string(zp_sched_coll_names[op->sub]));
        json_object_set_new(o, "group", json_string(groups[op->group].name));
        json_object_set_new(o, "buffer", json_integer(op->buffer));
        json_object_set_new(o, "bytes", json_real(op->bytes));
        json_object_set_new(o, "elem_offset", json_integer((json_int_t)op->elem_offset));
        json_object_set_new(o, "elems", json_integer((json_int_t)op->elems));
        break;
    case ZP_OP_TRANSFER:
        json_object_set_new(o, "op", json_string(zp_sched_transfer_names[op->sub]));
        json_object_set_new(o, "bytes", json_real(op->bytes));
        break;
    case ZP_OP_P2P:
        json_object_set_new(o, "op", json_string(zp_sched_p2p_names[op->sub]));
        json_object_set_new(o, "peer", json_integer(op->peer));
        json_object_set_new(o, "bytes", json_real(op->bytes));
        json_object_set_new(o, "elems", json_integer((json_int_t)op->elems));
        break;
    default:
        json_object_set_new(o, "category", json_string(zp_sched_mem_names[op->sub]));
        json_object_set_new(o, "buffer", json_integer(op->buffer));
        json_object_set_new(o, "bytes", json_real(op->bytes));
    }
    if ((op->kind <= ZP_OP_COLLECTIVE || op->kind == ZP_OP_TRANSFER) &&
        op->stream != default_stream(op->kind, op->sub, op->group))
        json_object_set_new(o, "stream", json_string(zp_sched_stream_names[op->stream]));
    if (s->stages > 1) /* the rank class that runs it */
        json_object_set_new(o, "stage", json_integer(op->stage));
    json_object_set_new(o, "deps", deps);
    return o;
}

static gboolean name_index(json_t *o, const char *what, const char *key,
                           const char *const *names, int *out, GError **error);

/* The communicators and where their members sit: ranks are numbered tp-fastest, so a TP
 * group is mp consecutive ranks and a DP group every mp-th rank; a graph's own follow. */
static json_t *groups_json(const ZpCommGroup *groups, int n_groups)
{
    json_t *a = json_array();
    for (int g = 0; g < n_groups; g++)
        /* No pipeline, no ZeRO++ subgroup: none of those groups written. */
        if (g < ZP_GROUP_PP || g >= ZP_GROUP_N || groups[g].ranks > 1)
            json_array_append_new(a, json_pack("{s:s, s:i, s:i}", "name", groups[g].name,
                                               "ranks", groups[g].ranks, "stride",
                                               groups[g].stride));
    return a;
}

/* One group of "groups": a name not yet taken, and ranks x stride dividing the world. */
static gboolean group_from_json(json_t *g, const char *what, int64_t world, ZpCommGroup *table,
                                int index, GError **error)
{
    static const char *const keys[] = {"name", "ranks", "stride", NULL};
    const char *name = NULL;
    int64_t ranks = 0, stride = 0;
    gboolean ok = json_is_object(g) && zp_json_check_keys(g, what, keys, error) &&
                  zp_json_get_string(g, what, "name", TRUE, &name, error) &&
                  zp_json_get_int(g, what, "ranks", TRUE, 1, INT32_MAX, &ranks, error) &&
                  zp_json_get_int(g, what, "stride", TRUE, 1, INT32_MAX, &stride, error);
    if (!ok) {
        if (error && !*error)
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
        return FALSE;
    }
    const char *problem = NULL;
    if (strlen(name) >= sizeof table->name)
        problem = "a group's name has at most 15 characters";
    for (int g = 0; !problem && g < index; g++)
        if (strcmp(table[g].name, name) == 0)
            problem = "a second group of that name";
    if (problem) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"name\": \"%s\": %s", what,
                    name, problem);
        return FALSE;
    }
    if (world % (ranks * stride) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %" G_GINT64_FORMAT " ranks %" G_GINT64_FORMAT " apart do not tile "
                    "the world of %" G_GINT64_FORMAT " (ranks x stride must divide it)",
                    what, ranks, stride, world);
        return FALSE;
    }
    table[index] = (ZpCommGroup){.ranks = (int)ranks, .stride = (int)stride};
    g_strlcpy(table[index].name, name, sizeof table->name);
    return TRUE;
}

/* Reads "groups" into dp, mp and the table: dp and tp, with the placement groups_json writes
 * (ranks tp-fastest), their sizes multiplying to world, and pp (a file's own, or the one
 * group of one rank a world without a pipeline has) go first in the table (ZpGroup); then,
 * where `others`, any other communicators in the file's order. */
static gboolean groups_from_json(json_t *groups, const char *path, int64_t world,
                                 gboolean others, ZpCommGroup table[ZP_SCHED_MAX_GROUPS],
                                 int *n_groups, int *dp, int *mp, GError **error)
{
    /* A planner's file: dp, tp, pp and ZeRO++'s subgroups where the plan has them. */
    const size_t most = others ? ZP_SCHED_MAX_GROUPS : ZP_GROUP_N;
    if (!json_is_array(groups) || json_array_size(groups) < 2 ||
        json_array_size(groups) > most) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"groups\" must be an array of dp, tp%s", path,
                    others ? " and at most 14 other groups"
                           : " and no other group than pp, hpz, qgz_node and qgz_cross");
        return FALSE;
    }
    ZpCommGroup read[ZP_SCHED_MAX_GROUPS];
    const int n = (int)json_array_size(groups);
    int at[ZP_GROUP_N]; /* where dp, tp, pp and ZeRO++'s groups are in the file */
    for (int g = 0; g < ZP_GROUP_N; g++)
        at[g] = -1;
    for (int i = 0; i < n; i++) {
        char *what = g_strdup_printf("%s: groups[%d]", path, i);
        const gboolean ok = group_from_json(json_array_get(groups, (size_t)i), what, world,
                                            read, i, error);
        g_free(what);
        if (!ok)
            return FALSE;
        for (int g = 0; g < ZP_GROUP_N; g++)
            if (strcmp(read[i].name, zp_sched_group_names[g]) == 0)
                at[g] = i;
    }
    if (at[ZP_GROUP_DP] < 0 || at[ZP_GROUP_TP] < 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"groups\" must hold a group named dp and one named tp", path);
        return FALSE;
    }
    table[ZP_GROUP_DP] = read[at[ZP_GROUP_DP]];
    table[ZP_GROUP_TP] = read[at[ZP_GROUP_TP]];
    if (at[ZP_GROUP_PP] >= 0) {
        table[ZP_GROUP_PP] = read[at[ZP_GROUP_PP]];
    } else {
        table[ZP_GROUP_PP] = (ZpCommGroup){.ranks = 1, .stride = table[ZP_GROUP_TP].ranks};
        g_strlcpy(table[ZP_GROUP_PP].name, zp_sched_group_names[ZP_GROUP_PP], sizeof table->name);
    }
    for (int g = ZP_GROUP_HPZ; g < ZP_GROUP_N; g++) { /* one rank each where absent */
        table[g] = at[g] >= 0 ? read[at[g]]
                              : (ZpCommGroup){.ranks = 1, .stride = table[ZP_GROUP_DP].stride};
        g_strlcpy(table[g].name, zp_sched_group_names[g], sizeof table->name);
    }
    *n_groups = ZP_GROUP_N;
    for (int i = 0; i < n; i++) {
        gboolean builtin = FALSE;
        for (int g = 0; g < ZP_GROUP_N; g++)
            builtin |= i == at[g];
        if (builtin)
            continue;
        if (!others) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                        "%s: key \"groups\": groups[%d] \"%s\" is no group of a plan's schedule",
                        path, i, read[i].name);
            return FALSE;
        }
        if (*n_groups == ZP_SCHED_MAX_GROUPS) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                        "%s: key \"groups\": at most %d groups in all", path,
                        ZP_SCHED_MAX_GROUPS);
            return FALSE;
        }
        table[(*n_groups)++] = read[i];
    }
    const int64_t ranks[2] = {table[ZP_GROUP_DP].ranks, table[ZP_GROUP_TP].ranks};
    const int64_t stride[2] = {table[ZP_GROUP_DP].stride, table[ZP_GROUP_TP].stride};
    /* A planner's pipeline stages sit between tp and dp; a graph's pp group is its own. */
    const int64_t pp = others ? 1 : table[ZP_GROUP_PP].ranks;
    if (ranks[ZP_GROUP_DP] * ranks[ZP_GROUP_TP] * pp != world || stride[ZP_GROUP_TP] != 1 ||
        stride[ZP_GROUP_DP] != ranks[ZP_GROUP_TP] * pp ||
        (pp > 1 && table[ZP_GROUP_PP].stride != ranks[ZP_GROUP_TP])) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"groups\": dp %" G_GINT64_FORMAT " x tp %" G_GINT64_FORMAT
                    " x pp %" G_GINT64_FORMAT " ranks must make the world of %" G_GINT64_FORMAT
                    ", tp with stride 1, pp with stride tp and dp with stride tp x pp (ranks "
                    "numbered tp-fastest)",
                    path, ranks[ZP_GROUP_DP], ranks[ZP_GROUP_TP], pp, world);
        return FALSE;
    }
    *dp = (int)ranks[ZP_GROUP_DP];
    *mp = (int)ranks[ZP_GROUP_TP];
    return TRUE;
}

static json_t *units_json(const ZpSchedule *s)
{
    json_t *units = json_array();
    for (int u = 0; u < s->n_units; u++)
        json_array_append_new(units, json_pack("[I, I]", (json_int_t)s->unit_offset[u],
                                               (json_int_t)s->unit_elems[u]));
    return units;
}

/* A pipeline's stage views (zp_sched_stage_view): each stage's model states and unit layout,
 * [{"state_bytes", "units"}] by stage. */
static json_t *stages_json(const ZpSchedule *s)
{
    json_t *stages = json_array();
    for (int k = 0; k < s->stages; k++) {
        ZpSchedule *view = zp_sched_stage_view(s, k);
        json_array_append_new(stages,
                              json_pack("{s:o, s:o}", "state_bytes",
                                        zp_sched_categories_json(view->state_bytes), "units",
                                        units_json(view)));
        zp_sched_free(view);
    }
    return stages;
}

gboolean zp_sched_write_json(const ZpSchedule *s, const char *path, GError **error)
{
    json_t *state = zp_sched_categories_json(s->state_bytes), *units = units_json(s);
    json_t *ops = json_array();
    ZpCommGroup groups[ZP_SCHED_MAX_GROUPS];
    const int n_groups = zp_sched_groups(s, groups);
    for (guint i = 0; i < s->ops->len; i++)
        json_array_append_new(ops, op_to_json(s, groups, zp_sched_op(s, i)));
    json_t *root = json_pack("{s:s, s:o, s:o, s:i, s:f, s:o, s:o, s:I, s:I, s:I, s:o}", "format",
                             "zplan-schedule-1", "model", zp_model_to_json(&s->model), "plan",
                             zp_plan_to_json(&s->plan), "world", s->world, "elem_bytes",
                             s->elem_bytes, "state_bytes", state, "units", units, "total_elems",
                             (json_int_t)s->total_elems, "padded_elems",
                             (json_int_t)s->padded_elems, "partition_elems",
                             (json_int_t)s->partition_elems, "ops", ops);
    json_object_set_new(root, "groups", groups_json(groups, n_groups));
    if (s->stages > 1)
        json_object_set_new(root, "stages", stages_json(s));
    /* A graph read without a model (zp_sched_read_graph) has no units, and writes none. */
    if (s->n_units == 0)
        json_object_del(root, "model");
    gboolean ok = zp_json_write(root, path, error);
    json_decref(root);
    return ok;
}

static gboolean name_index(json_t *o, const char *what, const char *key,
                           const char *const *names, int *out, GError **error)
{
    const char *text;
    if (!zp_json_get_string(o, what, key, TRUE, &text, error))
        return FALSE;
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], text) == 0) {
            *out = i;
            return TRUE;
        }
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" has unknown value \"%s\"", what,
                key, text);
    return FALSE;
}

/* A collective's "group": the index of the schedule's communicator of that name. */
static gboolean group_index(const ZpSchedule *s, json_t *o, const char *what, int *out,
                            GError **error)
{
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    const char *names[ZP_SCHED_MAX_GROUPS + 1] = {NULL};
    const int n = zp_sched_groups(s, table);
    for (int g = 0; g < n; g++)
        names[g] = table[g].name;
    return name_index(o, what, "group", names, out, error);
}

/* One op. A schedule of the planner's (`layout`) names the unit, micro-step, buffer and
 * element range of its ops and depends only on earlier ops; a graph needs none of these, and
 * its dependencies may be any of its n_ops ops (zp_sched_read_graph then refuses cycles). */
/* A compute op's optional "module": a block module's name, on a block op only. */
static gboolean module_from_json(json_t *o, const char *what, int sub, ZpOp *op, GError **error)
{
    json_t *v = json_object_get(o, "module");
    if (!v)
        return TRUE;
    const int m = json_is_string(v) ? zp_model_module_parse(json_string_value(v)) : -1;
    const gboolean block =
        sub == ZP_COMP_BLOCK_FWD || sub == ZP_COMP_RECOMPUTE || sub == ZP_COMP_BLOCK_BWD;
    if (m < 0 || !block) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"module\" must be one of ln1, qkv, proj, ln2, fc1, fc2, on a "
                    "block_fwd, recompute or block_bwd op", what);
        return FALSE;
    }
    op->module = (uint8_t)(m + 1);
    return TRUE;
}

static gboolean op_from_json(ZpSchedule *s, json_t *o, guint index, guint n_ops,
                             gboolean layout, const char *path, GError **error)
{
    char *what = g_strdup_printf("%s: ops[%u]", path, index);
    ZpOp op = {0};
    int kind = 0, sub = 0, group = 0;
    int64_t unit = -1, micro = -1, buffer = -1, offset = 0, elems = 0;
    /* The keys op_to_json writes for each kind, and no others. */
    /* "stage" only in a pipeline's schedule (every op names the stage that runs it). */
    static const char *const keys[][14] = {
        [ZP_OP_COMPUTE] = {"kind", "unit", "micro", "deps", "op", "flops", "gemm_flops",
                           "attn_flops", "mem_bytes", "bytes", "stream", "stage", "module", NULL},
        [ZP_OP_COLLECTIVE] = {"kind", "unit", "micro", "deps", "op", "group", "buffer", "bytes",
                              "elem_offset", "elems", "stream", "stage", NULL},
        [ZP_OP_ALLOC] = {"kind", "unit", "micro", "deps", "category", "buffer", "bytes", "stage",
                         NULL},
        [ZP_OP_FREE] = {"kind", "unit", "micro", "deps", "category", "buffer", "bytes", "stage",
                        NULL},
        [ZP_OP_P2P] = {"kind", "unit", "micro", "deps", "op", "peer", "bytes", "elems", "stage",
                       NULL},
        [ZP_OP_TRANSFER] = {"kind", "unit", "micro", "deps", "op", "bytes", "stream", "stage",
                            NULL},
    };
    const int stages = MAX(s->stages, 1);
    int64_t stage = 0, peer = 0;
    gboolean ok = json_is_object(o) && name_index(o, what, "kind", zp_sched_kind_names, &kind, error);
    if (ok && kind == ZP_OP_P2P && stages == 1) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"kind\": p2p ops belong to pipeline schedules (plan.pipeline."
                    "stages > 1)", what);
        ok = FALSE;
    }
    ok = ok && zp_json_check_keys(o, what, keys[kind], error) &&
                  zp_json_get_int(o, what, "unit", layout, -1, INT32_MAX, &unit, error) &&
                  zp_json_get_int(o, what, "micro", layout, -1, INT32_MAX, &micro, error) &&
                  zp_json_get_int(o, what, "stage", stages > 1, 0, stages - 1, &stage, error);
    if (ok && kind == ZP_OP_P2P)
        ok = name_index(o, what, "op", zp_sched_p2p_names, &sub, error) &&
             zp_json_get_int(o, what, "peer", TRUE, 0, stages - 1, &peer, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error) &&
             zp_json_get_int(o, what, "elems", TRUE, 0, INT64_MAX, &elems, error);
    if (ok && kind == ZP_OP_COMPUTE)
        ok = name_index(o, what, "op", zp_sched_compute_names, &sub, error) &&
             zp_json_get_number(o, what, "flops", TRUE, 0, 1e30, &op.flops, error) &&
             zp_json_get_number(o, what, "gemm_flops", layout, 0, 1e30, &op.gemm_flops, error) &&
             zp_json_get_number(o, what, "attn_flops", FALSE, 0, 1e30, &op.attn_flops, error) &&
             zp_json_get_number(o, what, "mem_bytes", layout, 0, 1e30, &op.mem_bytes, error) &&
             zp_json_get_number(o, what, "bytes", FALSE, 0, 1e30, &op.bytes, error) &&
             module_from_json(o, what, sub, &op, error);
    else if (ok && kind == ZP_OP_COLLECTIVE)
        ok = name_index(o, what, "op", zp_sched_coll_names, &sub, error) &&
             group_index(s, o, what, &group, error) &&
             zp_json_get_int(o, what, "buffer", layout, -1, INT32_MAX, &buffer, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error) &&
             zp_json_get_int(o, what, "elem_offset", layout, 0, INT64_MAX, &offset, error) &&
             zp_json_get_int(o, what, "elems", layout, 0, INT64_MAX, &elems, error);
    else if (ok && kind == ZP_OP_TRANSFER)
        ok = name_index(o, what, "op", zp_sched_transfer_names, &sub, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error);
    else if (ok && kind != ZP_OP_P2P)
        ok = name_index(o, what, "category", zp_sched_mem_names, &sub, error) &&
             zp_json_get_int(o, what, "buffer", layout, -1, INT32_MAX, &buffer, error) &&
             zp_json_get_number(o, what, "bytes", TRUE, 0, 1e30, &op.bytes, error);
    json_t *deps = json_object_get(o, "deps");
    if (ok && !json_is_array(deps)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"deps\" must be an array", what);
        ok = FALSE;
    }
    op.kind = (uint8_t)kind, op.sub = (uint8_t)sub, op.group = (uint8_t)group;
    int stream = default_stream(kind, sub, group);
    if (ok && json_object_get(o, "stream"))
        ok = name_index(o, what, "stream", zp_sched_stream_names, &stream, error);
    op.stream = (uint8_t)stream;
    op.unit = (int32_t)unit, op.micro = (int32_t)micro, op.buffer = (int32_t)buffer;
    op.elem_offset = (uint64_t)offset, op.elems = (uint64_t)elems;
    op.stage = (uint32_t)stage, op.peer = (uint32_t)peer;
    if (kind == ZP_OP_P2P)
        op.group = ZP_GROUP_PP;
    op.dep_start = s->deps->len;
    for (size_t i = 0; ok && i < json_array_size(deps); i++) {
        json_t *d = json_array_get(deps, i);
        /* A planner's dependencies point backwards: the list is in issue order, so the graph
         * is acyclic. A graph's may point anywhere among its ops, and so may a pipeline's
         * (stage k waits for stage k + 1's sends, listed after it), whose ops must then be
         * the builder's (same_as_built). */
        const gboolean backwards = layout && stages == 1;
        const json_int_t limit = backwards ? (json_int_t)index : (json_int_t)n_ops;
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) >= limit) {
            if (backwards)
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "%s: deps[%zu] must be the index of an earlier op", what, i);
            else
                g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                            "%s: key \"deps\": deps[%zu] is not the index of an op (0 to %u)",
                            what, i, n_ops - 1);
            ok = FALSE;
            break;
        }
        uint32_t dep = (uint32_t)json_integer_value(d);
        g_array_append_val(s->deps, dep);
        op.n_deps++;
    }
    if (ok)
        g_array_append_val(s->ops, op);
    else if (!json_is_object(o))
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
    g_free(what);
    return ok;
}

/* Reads a schedule: the model and plan are re-read strictly and the layout rebuilt from
 * them (a file cannot claim a layout its plan does not give); the ops are read strictly and
 * then checked against that layout (zp_schedcheck) before anything uses them. */
/* Whether the ops read equal the builder's in everything zreal executes (their costs aside). */
static gboolean same_as_built(const ZpSchedule *s, const GArray *ops, const GArray *deps,
                              const char *path, GError **error)
{
    guint i = 0;
    for (; i < MIN(s->ops->len, ops->len); i++) {
        const ZpOp *a = zp_sched_op(s, i), *b = &g_array_index(ops, ZpOp, i);
        if (a->kind != b->kind || a->sub != b->sub || a->stream != b->stream ||
            a->group != b->group || a->module != b->module || a->unit != b->unit ||
            a->micro != b->micro || a->buffer != b->buffer || a->bytes != b->bytes ||
            a->elem_offset != b->elem_offset || a->elems != b->elems || a->stage != b->stage || a->peer != b->peer ||
            a->n_deps != b->n_deps ||
            memcmp(zp_sched_deps(s, a), &g_array_index(deps, uint32_t, b->dep_start),
                   a->n_deps * sizeof(uint32_t)) != 0)
            break;
    }
    if (i == s->ops->len && i == ops->len)
        return TRUE;
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: ops[%u]: differs from the %s schedule zplan builds for this model and "
                "plan (%u ops): zreal runs --impl %s schedules and pipelines' as zplan schedule "
                "writes them, and only --impl paper ones without pipeline stages edited",
                path, i, zp_impl_name(s->plan.impl), ops->len, zp_impl_name(s->plan.impl));
    return FALSE;
}

ZpSchedule *zp_sched_read_json(const char *path, GError **error)
{
    json_t *root = zp_json_load_object(path, error);
    if (!root)
        return NULL;
    ZpModel model;
    ZpPlan plan;
    const char *format = NULL;
    json_t *ops = json_object_get(root, "ops");
    gboolean ok = zp_json_get_string(root, path, "format", TRUE, &format, error);
    if (ok && strcmp(format, "zplan-schedule-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown format \"%s\"", path, format);
        ok = FALSE;
    }
    static const char *const keys[] = {"format", "model", "plan", "world", "elem_bytes",
                                       "state_bytes", "units", "total_elems", "padded_elems",
                                       "partition_elems", "ops", "groups", "stages", NULL};
    char *model_what = g_strdup_printf("%s: model", path);
    char *plan_what = g_strdup_printf("%s: plan", path);
    ok = ok && zp_json_check_keys(root, path, keys, error) &&
         json_is_object(json_object_get(root, "model")) &&
         zp_model_from_json(json_object_get(root, "model"), model_what, &model, error) &&
         json_is_object(json_object_get(root, "plan")) &&
         zp_plan_from_json(json_object_get(root, "plan"), plan_what, &plan, error);
    g_free(model_what);
    g_free(plan_what);
    if (ok && !json_is_array(ops)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an array", path);
        ok = FALSE;
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: keys \"model\" and \"plan\" must be objects",
                    path);
    json_t *groups = json_object_get(root, "groups");
    int dp = 0, mp = 0, n_groups = 0;
    ZpCommGroup table[ZP_SCHED_MAX_GROUPS];
    if (ok && groups) {
        ok = groups_from_json(groups, path, (int64_t)plan.dp * plan.mp * zp_plan_pp(&plan),
                              FALSE, table, &n_groups, &dp, &mp, error);
        if (ok && (dp != plan.dp || mp != plan.mp)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"groups\": dp %d x tp %d, but the plan has dp %d x mp %d",
                        path, dp, mp, plan.dp, plan.mp);
            ok = FALSE;
        }
    }
    ZpSchedule *s = ok ? zp_sched_build(&model, &plan, error) : NULL;
    /* A pipeline's stage views: those its plan gives (written for the reader's eyes). */
    json_t *stages = s && s->stages > 1 ? stages_json(s) : NULL;
    if (stages && !json_equal(stages, json_object_get(root, "stages"))) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"stages\": the %d stage views (state_bytes, units) must be those "
                    "of the plan's pipeline, as zplan schedule writes them", path, s->stages);
        zp_sched_free(s);
        s = NULL;
    }
    json_decref(stages);
    /* The builder's ops, which a schedule of another implementation than the paper's must
     * equal: zp_schedcheck checks ops against the paper's unit-level layout only. */
    GArray *built_ops = NULL, *built_deps = NULL;
    if (s) {
        if (plan.impl != ZP_IMPL_PAPER || s->stages > 1) {
            built_ops = g_array_copy(s->ops);
            built_deps = g_array_copy(s->deps);
        }
        g_array_set_size(s->ops, 0);
        g_array_set_size(s->deps, 0);
        for (size_t i = 0; s && i < json_array_size(ops); i++)
            if (!op_from_json(s, json_array_get(ops, i), (guint)i, (guint)json_array_size(ops),
                              TRUE, path, error)) {
                zp_sched_free(s);
                s = NULL;
            }
        if (s && !(built_ops ? same_as_built(s, built_ops, built_deps, path, error)
                             : zp_schedcheck_ops(s, path, error))) {
            zp_sched_free(s);
            s = NULL;
        }
    }
    if (built_ops)
        g_array_unref(built_ops), g_array_unref(built_deps);
    json_decref(root);
    return s;
}

/* ---- a graph: a schedule file without its model ----------------------------------------- */

/* Fails naming an op on a dependency cycle, if there is one (Kahn's algorithm; an op left
 * over has a dependency left over, and following those from it must come round). */
static gboolean check_acyclic(const ZpSchedule *s, const char *path, GError **error)
{
    const guint n = s->ops->len;
    uint32_t *left = g_new(uint32_t, n ? n : 1), *start = g_new0(uint32_t, n + 1);
    uint32_t *users = g_new(uint32_t, s->deps->len ? s->deps->len : 1);
    uint32_t *ready = g_new(uint32_t, n ? n : 1), *seen = g_new0(uint32_t, n ? n : 1);
    for (guint i = 0; i < n; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        left[i] = op->n_deps;
        for (uint32_t d = 0; d < op->n_deps; d++)
            start[zp_sched_deps(s, op)[d] + 1]++;
    }
    for (guint i = 0; i < n; i++)
        start[i + 1] += start[i];
    uint32_t *fill = g_memdup2(start, (n + 1) * sizeof *start);
    for (guint i = 0; i < n; i++) {
        const ZpOp *op = zp_sched_op(s, i);
        for (uint32_t d = 0; d < op->n_deps; d++)
            users[fill[zp_sched_deps(s, op)[d]]++] = i;
    }
    guint n_ready = 0, done = 0;
    for (guint i = 0; i < n; i++)
        if (left[i] == 0)
            ready[n_ready++] = i;
    while (done < n_ready) {
        const uint32_t i = ready[done++];
        for (uint32_t k = start[i]; k < start[i + 1]; k++)
            if (--left[users[k]] == 0)
                ready[n_ready++] = users[k];
    }
    gboolean ok = done == n;
    if (!ok) {
        uint32_t at = 0;
        while (left[at] == 0)
            at++;
        while (!seen[at]) {
            seen[at] = 1;
            const ZpOp *op = zp_sched_op(s, at);
            uint32_t d = 0;
            while (left[zp_sched_deps(s, op)[d]] == 0)
                d++;
            at = zp_sched_deps(s, op)[d];
        }
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: ops[%u]: key \"deps\": the op is on a dependency cycle", path, at);
    }
    g_free(left);
    g_free(start);
    g_free(fill);
    g_free(users);
    g_free(ready);
    g_free(seen);
    return ok;
}

/* "state_bytes": any of the memory categories, bytes each rank holds all step (0 if absent). */
static gboolean state_from_json(json_t *o, const char *path, double state[ZP_MEM_N],
                                GError **error)
{
    char *what = g_strdup_printf("%s: state_bytes", path);
    gboolean ok = json_is_object(o) && zp_json_check_keys(o, what, zp_sched_mem_names, error);
    for (int c = 0; ok && c < ZP_MEM_N; c++)
        ok = zp_json_get_number(o, what, zp_sched_mem_names[c], FALSE, 0, 1e30, &state[c], error);
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: must be an object", what);
    g_free(what);
    return ok;
}

/* FLOPs in a fused attention kernel run at its measured rate for the model's head dimension
 * and sequence length; without the model there is no such rate, and without a fused kernel in
 * the plan they have no kernel to run in. A guess would time them wrongly, so they are
 * refused, naming the first op that has them. */
static gboolean check_attention(const ZpSchedule *s, gboolean has_model, const char *path,
                                GError **error)
{
    for (guint i = 0; i < s->ops->len; i++) {
        if (zp_sched_op(s, i)->attn_flops <= 0)
            continue;
        if (has_model && zp_attention_fused(s->plan.attention))
            return TRUE;
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: ops[%u]: key \"attn_flops\": %s", path, i,
                    !has_model ? "a fused attention kernel's rate depends on the model's head "
                                 "dimension and sequence length: give the \"model\", or count "
                                 "these FLOPs in \"flops\" alone"
                               : "the plan runs eager attention: give a \"plan\" with a fused "
                                 "\"attention\" kernel, or count these FLOPs in \"flops\" "
                                 "alone");
        return FALSE;
    }
    return TRUE;
}

ZpSchedule *zp_sched_read_graph(const char *path, GError **error)
{
    json_t *root = zp_json_load_object(path, error);
    if (!root)
        return NULL;
    static const char *const keys[] = {"format", "world", "groups", "ops", "state_bytes",
                                       "precision", "model", "plan", "elem_bytes", "units",
                                       "total_elems", "padded_elems", "partition_elems", NULL};
    ZpSchedule *s = g_new0(ZpSchedule, 1);
    s->ops = g_array_new(FALSE, TRUE, sizeof(ZpOp));
    s->deps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    s->elem_bytes = 2;
    const char *format = NULL, *precision = NULL;
    int64_t world = 0;
    int dp = 0, mp = 0;
    json_t *ops = json_object_get(root, "ops"), *model = json_object_get(root, "model");
    json_t *plan = json_object_get(root, "plan"), *state = json_object_get(root, "state_bytes");
    char *model_what = g_strdup_printf("%s: model", path);
    char *plan_what = g_strdup_printf("%s: plan", path);
    gboolean ok = zp_json_check_keys(root, path, keys, error) &&
                  zp_json_get_string(root, path, "format", TRUE, &format, error);
    if (ok && strcmp(format, "zplan-schedule-1") != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown format \"%s\"", path, format);
        ok = FALSE;
    }
    ok = ok && zp_json_get_int(root, path, "world", TRUE, 1, INT32_MAX, &world, error) &&
         groups_from_json(json_object_get(root, "groups"), path, world, TRUE, s->groups,
                          &s->n_groups, &dp, &mp, error) &&
         zp_json_get_number(root, path, "elem_bytes", FALSE, 1, 8, &s->elem_bytes, error) &&
         zp_json_get_string(root, path, "precision", FALSE, &precision, error) &&
         (!state || state_from_json(state, path, s->state_bytes, error));
    if (ok && plan && precision) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"precision\": the plan gives it; give one of them", path);
        ok = FALSE;
    }
    if (ok && plan) {
        ok = json_is_object(plan) && zp_plan_from_json(plan, plan_what, &s->plan, error);
        if (ok && (s->plan.dp != dp || s->plan.mp != mp)) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "%s: key \"groups\": dp %d x tp %d, but the plan has dp %d x mp %d",
                        path, dp, mp, s->plan.dp, s->plan.mp);
            ok = FALSE;
        }
    } else if (ok) {
        zp_plan_defaults(&s->plan, 0, dp, mp);
        ok = !precision ||
             zp_precision_parse(precision, "key \"precision\"", &s->plan.precision, error);
        if (!ok)
            g_prefix_error(error, "%s: ", path);
    }
    if (ok && model)
        ok = json_is_object(model) && zp_model_from_json(model, model_what, &s->model, error);
    else if (ok)
        g_snprintf(s->model.name, sizeof s->model.name, "%s", "schedule");
    if (ok && !json_is_array(ops)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY, "%s: key \"ops\" must be an array", path);
        ok = FALSE;
    }
    if (!ok && error && !*error)
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: keys \"model\" and \"plan\" must be objects", path);
    s->world = (int)world;
    for (size_t i = 0; ok && i < json_array_size(ops); i++)
        ok = op_from_json(s, json_array_get(ops, i), (guint)i, (guint)json_array_size(ops), FALSE,
                          path, error);
    ok = ok && check_acyclic(s, path, error) && check_attention(s, model != NULL, path, error);
    g_free(model_what);
    g_free(plan_what);
    json_decref(root);
    if (!ok) {
        zp_sched_free(s);
        return NULL;
    }
    return s;
}
