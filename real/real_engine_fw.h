/* real_engine_fw: the engine's plug-ins for frameworks that lay the model states out their
 * own way (Megatron-Core's contiguous buffers, FSDP2's per-parameter shards), one file each
 * behind this table of functions, as real_comm.h's communicators are: the engine calls the
 * table of the plug-in that applies (real_engine_fw_find) and never asks which it is. */
#ifndef REAL_ENGINE_FW_H
#define REAL_ENGINE_FW_H

#include "real_backend.h"
#include "real_comm.h"
#include "real_engine_base.h"
#include "real_gpt.h"
#include "zp_impl.h"
#include "zp_sched.h"

#include <glib.h>

/* Writes elements [first, first + count) of unit u's initial parameters to dst. */
typedef gboolean (*RealFwInitFn)(void *engine, int unit, uint64_t first, uint64_t count,
                                 RealBf16 *dst, GError **error);

/* What a plug-in is handed: the engine's backend, data-parallel communicator and model
 * (borrowed), and its buffers by schedule id (the plug-in stores the buffers it takes
 * there, so that the engine's free ops release them). */
typedef struct {
    const ZpSchedule *s;
    RealBackend *be;
    RealComm *comm;
    RealGpt *gpt;
    void **buffers;
} RealFwEnv;

typedef struct {
    const char *name;
    /* Whether the plug-in executes the schedule (its implementation's). */
    gboolean (*applies)(const ZpSchedule *s);
    /* Its state, the model states allocated (params, grads, master, adam_m, adam_v) as the
     * framework lays them out; NULL with an error naming what it cannot lay out. */
    void *(*create)(const RealFwEnv *env, GError **error);
    void (*destroy)(void *fw);
    /* Draws the parameters it holds (init) and its master weights from them. */
    gboolean (*init_params)(void *fw, RealFwInitFn init, void *engine, GError **error);
    /* As the step begins (its gradients' state for the first write). */
    void (*start_step)(void *fw);
    /* Unit u's parameters as a compute op reads them, and where micro-step `micro`'s
     * backward accumulates their gradients. */
    gboolean (*params)(void *fw, int unit, RealGptTensors *out, GError **error);
    gboolean (*grads)(void *fw, int unit, int micro, RealGptTensors *out, GError **error);
    /* An alloc op: *handled FALSE leaves it to the engine (activations, its workspace). */
    gboolean (*alloc)(void *fw, const ZpOp *op, gboolean *handled, GError **error);
    /* Before the engine frees a buffer by schedule id (NULL: nothing to forget). */
    void (*release)(void *fw, const ZpOp *op);
    /* A collective op of the data-parallel group. */
    gboolean (*collective)(void *fw, const ZpOp *op, GError **error);
    /* The optimizer op, on the states it holds. */
    gboolean (*optimizer)(void *fw, const RealAdamHyper *hyper, GError **error);
    /* hpZ's group (zero_hpz_partition_size; FSDP2's reshard_after_forward=int): its
     * communicator and each unit's secondary shard, which the engine allocates as the
     * schedule's secondary_params state (all NULL where the schedule takes them op by op:
     * ZpImpl secondary_per_block); NULL: refused. */
    gboolean (*hpz)(void *fw, RealComm *hpz_comm, RealBf16 **secondary, GError **error);
    /* An unpack op (a gather's flat buffer copied out); NULL: the schedule has none. */
    gboolean (*unpack)(void *fw, const ZpOp *op, GError **error);
} RealFwOps;

/* The schedule's tensors (zp_impl_tensors) matched to real_gpt's, what the plug-ins share:
 * tensor i of unit u is t[unit_first[u] + k] for k below unit_first[u + 1] - unit_first[u],
 * real_gpt's tensor k of the unit. */
typedef struct {
    ZpImplTensor *t;
    guint n_t;
    guint *unit_first; /* n_units + 1 entries */
} RealFwTensors;

/* Fails naming the first tensor that is not the model's. */
gboolean real_engine_fw_tensors(const ZpSchedule *s, RealFwTensors *out, GError **error);
void real_engine_fw_tensors_clear(RealFwTensors *t);

extern const RealFwOps real_fw_megatron, real_fw_fsdp2;

/* The plug-in that executes the schedule, NULL: the engine's own (or real_engine_ds). */
const RealFwOps *real_engine_fw_find(const ZpSchedule *s);

#endif
