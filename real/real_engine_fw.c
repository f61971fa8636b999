/* real_engine_fw: the table of framework plug-ins (real_engine_megatron.c,
 * real_engine_fsdp2.c) and the tensor index they share. */
#include "real_engine_fw.h"

static const RealFwOps *const plugins[] = {&real_fw_megatron, &real_fw_fsdp2};

const RealFwOps *real_engine_fw_find(const ZpSchedule *s)
{
    for (size_t i = 0; i < G_N_ELEMENTS(plugins); i++)
        if (plugins[i]->applies(s))
            return plugins[i];
    return NULL;
}

gboolean real_engine_fw_tensors(const ZpSchedule *s, RealFwTensors *out, GError **error)
{
    GArray *tensors = zp_impl_tensors(s);
    out->n_t = tensors->len;
    out->t = (ZpImplTensor *)g_array_free(tensors, FALSE);
    out->unit_first = g_new0(guint, (gsize)s->n_units + 1);
    const RealGptDims dims = real_engine_dims(&s->model, &s->plan);
    int k = 0;
    for (guint i = 0; i < out->n_t; i++) {
        const ZpImplTensor *z = &out->t[i];
        k = i > 0 && out->t[i - 1].unit == z->unit ? k + 1 : 0;
        RealGptTensor rt[REAL_GPT_MAX_UNIT_TENSORS];
        const int n = real_gpt_unit_tensors(&dims, z->unit, rt);
        if (k >= n || rt[k].offset_elems != z->offset - s->unit_offset[z->unit] ||
            rt[k].elems != z->elems)
            return real_engine_fail(error, "unit %d: the schedule's tensor %d (%" G_GUINT64_FORMAT
                                    " elements) is not the model's", z->unit, k, z->elems);
        out->unit_first[z->unit + 1] = i + 1;
    }
    for (int u = 1; u <= s->n_units; u++)
        out->unit_first[u] = MAX(out->unit_first[u], out->unit_first[u - 1]);
    return TRUE;
}

void real_engine_fw_tensors_clear(RealFwTensors *t)
{
    g_free(t->t);
    g_free(t->unit_first);
    *t = (RealFwTensors){0};
}
