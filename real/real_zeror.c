/* real_zeror: the checkpoints' host tier is plain host memory through a tracker of its own,
 * one buffer a block and micro-step (a pipeline stage has several in flight) from its forward
 * copy to its backward one (checkpointing.py keeps the
 * `.cpu()` tensor in ctx.deepspeed_saved_tensors until backward moves it to the device). */
#include "real_zeror.h"
#include "zp_util.h"

#include <string.h>

struct RealCkptHost {
    RealBackend *be;
    RealAlloc *host;
    int blocks, micros;
    void **slot; /* per micro-step and unit (blocks are units 1..L): its host copy, or NULL */
    uint64_t *slot_bytes;
    double down_bytes, up_bytes;
};

static gboolean fail(GError **error, const char *what)
{
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "cpu_checkpointing: %s", what);
    return FALSE;
}

gboolean real_zeror_new(const ZpSchedule *s, RealBackend *be, RealCkptHost **out,
                        GError **error)
{
    *out = NULL;
    if (!s->plan.checkpoint || !s->plan.ckpt.cpu_checkpointing)
        return TRUE;
    if (strcmp(be->name, "cpu") != 0)
        return fail(error, "zreal's host tier runs on the cpu backend only");
    RealCkptHost *h = g_new0(RealCkptHost, 1);
    h->be = be, h->host = real_alloc_new(), h->blocks = (int)s->model.layers;
    h->micros = s->plan.grad_accum;
    const gsize slots = (gsize)(h->blocks + 2) * (gsize)h->micros;
    h->slot = g_new0(void *, slots);
    h->slot_bytes = g_new0(uint64_t, slots);
    *out = h;
    return TRUE;
}

void real_zeror_free(RealCkptHost *h)
{
    if (!h)
        return;
    for (gsize i = 0; i < (gsize)(h->blocks + 2) * (gsize)h->micros; i++)
        real_alloc_release(h->host, h->slot[i]);
    real_alloc_free_tracker(h->host);
    g_free(h->slot), g_free(h->slot_bytes);
    g_free(h);
}

/* Block `block` of micro-step `micro`'s slot, or NULL outside the schedule's blocks. */
static void **slot_of(const RealCkptHost *h, int block, int micro, uint64_t **bytes)
{
    if (!h || block < 1 || block > h->blocks || micro < 0 || micro >= h->micros)
        return NULL;
    const gsize at = (gsize)micro * (gsize)(h->blocks + 2) + (gsize)block;
    if (bytes)
        *bytes = &h->slot_bytes[at];
    return &h->slot[at];
}

gboolean real_zeror_on_host(const RealCkptHost *h, int block, int micro)
{
    void **slot = slot_of(h, block, micro, NULL);
    return slot && *slot != NULL;
}

gboolean real_zeror_host_copy(RealCkptHost *h, int block, int micro, void *device,
                              uint64_t bytes, GError **error)
{
    uint64_t *kept = NULL;
    void **slot = slot_of(h, block, micro, &kept);
    if (!slot || !device)
        return fail(error, "a host copy of a checkpoint the schedule did not plan");
    if (!*slot) { /* forward: partition.cpu() */
        if (!(*slot = real_alloc_take(h->host, bytes, REAL_MEM_CHECKPOINTS)))
            return fail(error, "no host memory for a checkpoint");
        h->be->copy(h->be, *slot, device, bytes);
        *kept = bytes;
        h->down_bytes += (double)bytes;
        return TRUE;
    }
    if (bytes != *kept) /* backward: copied into the regathered buffer */
        return fail(error, "the copy back is not the size of the checkpoint kept");
    h->be->copy(h->be, device, *slot, bytes);
    real_alloc_release(h->host, *slot);
    *slot = NULL;
    h->up_bytes += (double)bytes;
    return TRUE;
}

void real_zeror_stats(const RealCkptHost *h, RealAllocStats *host, double *down_bytes,
                      double *up_bytes)
{
    real_alloc_stats(h->host, host);
    *down_bytes = h->down_bytes;
    *up_bytes = h->up_bytes;
}
