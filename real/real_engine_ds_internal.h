/* real_engine_ds_internal: what the DeepSpeed plug-in's two files share (real_engine_ds.c's
 * layout, set-up and gradient landing; real_engine_ds_comm.c's reductions, gathers and
 * transfers): its tensors, calls and buckets, and the helpers that read them. Private to real/. */
#ifndef REAL_ENGINE_DS_INTERNAL_H
#define REAL_ENGINE_DS_INTERNAL_H

#include "real_engine_base.h"
#include "real_offload.h"
#include "zp_sched.h"

/* The plug-in (real_engine_ds.h, which its files include: this header stays below it, so
 * that the plug-in and its parts form no circle). */
typedef struct RealDs RealDs;

typedef struct {
    int unit, k;            /* its unit and index in real_gpt_unit_tensors' list */
    uint64_t offset, elems; /* flat range (unpadded) and offset inside its unit */
    uint64_t in_unit;
    uint64_t slice;         /* stage 3: padded elements / dp */
    uint64_t part;          /* stage 3: where its slice sits in this rank's partition */
    int bucket;             /* the bucket that reduces it */
    /* stage 3: the buffer ids of its gathers (a tensor prefetched for a later use while
     * still held for this one has two; a freed buffer is NULL in the engine's table), and
     * where in each it starts (an all-reduced call's flat buffer holds it in place) */
    int gathered[4];
    uint64_t gathered_at[4];
    RealBf16 *persistent;   /* stage 3: its full copy when ds_persist */
    uint64_t sec;           /* hpZ: where its secondary slice sits in the secondary partition */
} Tensor;

/* Stage 3: one coalesced all-gather of a micro-step (zp_impl.h ZpFetch), its tensors in the
 * order of its flat buffer, over the data-parallel group or (hpZ, in backward) hpZ's. */
typedef struct {
    guint first, n;        /* its tensors: members[first .. first + n) */
    uint64_t per_rank;     /* the slices of every rank, one after another in the flat buffer */
    ZpGroup group;
    int ranks;
} Call;

/* A gradient handed on before its bucket had room in the held ipg buffer (an earlier bucket
 * still there): it waits in a buffer of its own, as autograd's param.grad waits for the hook
 * that copies it into the bucket (stage3.py reduce_independent_p_g_buckets_and_remove_grads
 * reduces the full bucket first, then __add_grad_to_ipg_bucket copies). The schedule lists
 * these buffers by the same rule (zp_sched.c hand_on, land_waits). */
typedef struct {
    guint tensor; /* NO_TENSOR: a sparse unit's experts (ZpImpl experts_in_buckets) */
    int micro;
    RealBf16 *grad;
    int bucket;            /* the experts': their bucket, where in its experts, how many */
    uint64_t at, elems;
} Pending;
#define NO_TENSOR G_MAXUINT

typedef struct {
    uint64_t lo, hi;  /* flat range of whole tensors */
    int landed_in;    /* the held buffer holding its gradients until reduced, -1 none */
    /* its experts' range of the expert space (ZpBucketExperts), after the dense part in its
     * place; it stays landed until their reduction over the EDP group */
    uint64_t xlo, xelems;
} Bucket;

struct RealDs {
    const ZpSchedule *s;
    RealBackend *be;
    RealComm *comm;
    void **buffers;
    RealBf16 *params;
    int stage, dp, rank, n_buckets, n_buffers;
    Tensor *t;
    guint n_t;
    Bucket *bk;
    int *bucket_buffer;   /* [micro * n_buckets + k]: the buffer bucket k lands in */
    gboolean *held;       /* per buffer id: reduces more than one bucket (an ipg buffer) */
    /* Gradients: stage 2's grads_in_partition (the whole tensors overlapping this rank's
     * partition from flat offset gip_lo; with accumulation the sum), the buffer id `gip` the
     * step's first reduction takes, or stage 3's partition, `grads`, held throughout.
     * grad_copy: per micro-step, the buffer id of the copy its reduced gradients land in
     * before they are added to the sum (zp_impl.h grad_copy_elems), -1 none. */
    RealBf16 *grads;
    int gip;
    uint64_t gip_lo, gip_hi, grad_elems;
    int *grad_copy;
    /* With optimizer offload the reduced slices go to real_offload's host tier from the
     * bucket (stage 2) or the concatenation copy (stage 3) and no gradients stay here. */
    gboolean host_grads;
    /* With parameter offload the partition is the host tier's: the transfers before a call
     * put this rank's slices in place (real_ds_param_transfer). */
    gboolean host_params;
    /* Stage 3: a micro-step's calls in issue order, the next one, the tensors they gather,
     * and the call whose flat buffer each buffer id holds (-1 none). */
    Call *calls;
    guint n_calls, next_call;
    guint *members;
    int *flat_call;
    /* qwZ: per gathered buffer id, the int8 buffer its call is gathered in (-1 none) */
    int *quant_of;
    /* Per micro-step: the buffer the tied head's wte gradient waits in until the embedding's
     * backward (zp_impl.h tied_grad_waits), or -1. */
    int *tied_grad;
    GArray *pending; /* Pending, in the order handed on */
    /* hpZ (real_ds_hpz): its group's communicator and this rank's secondary partition */
    RealComm *hpz_comm;
    RealBf16 *secondary;
};

#define fail real_engine_fail

/* A zeroed buffer of the category. */
static inline void *take(RealDs *ds, uint64_t bytes, ZpMemCategory cat, GError **error)
{
    void *p = real_engine_alloc(ds->be, ds->rank, bytes, cat, error);
    if (p)
        ds->be->fill(ds->be, p, 0, bytes);
    return p;
}

/* The tensor that starts at flat offset `offset`, or -1 (tensors are in flat order). */
static inline int tensor_at(const RealDs *ds, uint64_t offset)
{
    guint lo = 0, hi = ds->n_t;
    while (lo < hi) {
        const guint mid = (lo + hi) / 2;
        if (ds->t[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ds->n_t && ds->t[lo].offset == offset ? (int)lo : -1;
}

/* The bucket holding flat offset `at`, or -1. */
static inline int bucket_at(const RealDs *ds, uint64_t at)
{
    for (int k = 0; k < ds->n_buckets; k++)
        if (ds->bk[k].lo <= at && at < ds->bk[k].hi)
            return k;
    return -1;
}

/* Stage 2's grads_in_partition while the schedule holds it, else NULL. */
static inline RealBf16 *grads_in_partition(const RealDs *ds)
{
    return ds->gip >= 0 ? (RealBf16 *)ds->buffers[ds->gip] : NULL;
}

/* real_engine_ds.c: where bucket k's gradients of micro-step `micro` lie, its buffer taken
 * and zeroed when its first tensor lands; and the gradients that waited for their bucket's
 * room copied into it once it has some. */
RealBf16 *real_ds_land(RealDs *ds, int k, int micro, GError **error);
gboolean real_ds_land_pending(RealDs *ds, GError **error);

#endif
