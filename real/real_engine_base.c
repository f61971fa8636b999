/* real_engine_base: the engine's error domain and the pieces its plug-ins call back into —
 * allocating a buffer, delivering reduced gradients, qgZ's reduction — and the dims it trains. */
#include "real_engine_base.h"
#include "real_moe.h"
#include "real_zeropp.h"
#include "zp_mem.h"
#include "zp_util.h"

#include <limits.h>

G_DEFINE_QUARK(real-engine-error-quark, real_engine_error)

gboolean real_engine_fail(GError **error, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    char *message = g_strdup_vprintf(format, args);
    va_end(args);
    g_set_error_literal(error, REAL_ENGINE_ERROR, 0, message);
    g_free(message);
    return FALSE;
}

void *real_engine_alloc(RealBackend *be, int rank, uint64_t bytes, ZpMemCategory cat,
                        GError **error)
{
    void *p = be->alloc(be, bytes, (RealMemCategory)cat);
    if (!p)
        real_engine_fail(error,
                         "rank %d: out of memory allocating %" G_GUINT64_FORMAT " bytes of %s",
                         rank, bytes, zp_sched_mem_name(cat));
    return p;
}

RealGptDims real_engine_dims(const ZpModel *m, const ZpPlan *plan)
{
    RealGptDims d = real_gpt_dims_make((int)m->layers, (int)m->hidden, (int)m->heads,
                                       (int)m->seq_len, (int)m->vocab, plan->micro_batch);
    d.ffn_hidden = (int)m->ffn_hidden;
    d.kv_heads = (int)zp_model_kv_heads(m);
    d.swiglu = m->mlp == ZP_MLP_SWIGLU;
    d.geglu = m->mlp == ZP_MLP_GEGLU;
    d.exact_gelu = m->exact_gelu;
    d.rmsnorm = m->norm == ZP_NORM_RMSNORM;
    d.untied = !m->tied_embeddings;
    d.no_bias = m->no_bias; /* the same flags (real_gpt.h) */
    d.parallel_residual = m->parallel_residual;
    d.rope_theta = (float)m->rope_theta;
    d.rotary_fraction = (float)m->rotary_fraction;
    const ZpRopeScaling *r = &m->rope_scaling;
    d.rope_scaling = r->type == ZP_ROPE_SCALING_LINEAR   ? REAL_ROPE_SCALING_LINEAR
                     : r->type == ZP_ROPE_SCALING_LLAMA3 ? REAL_ROPE_SCALING_LLAMA3
                                                         : REAL_ROPE_SCALING_NONE;
    d.rope_factor = (float)r->factor;
    d.rope_low_freq_factor = (float)r->low_freq_factor;
    d.rope_high_freq_factor = (float)r->high_freq_factor;
    d.rope_original_positions = (int)r->original_max_positions; /* <= 10^7: zp_model's bound */
    d.positions = m->learned_positions ? (int)zp_model_positions(m) : 0;
    d.norm_eps = (float)m->norm_eps;
    d.attention_window = (int)MIN(m->sliding_window, (int64_t)m->seq_len);
    d.flash = zp_attention_fused(plan->attention);
    d.tp = plan->mp;
    if (zp_moe_enabled(&m->moe)) { /* the experts split over EP: the engine sets ep_rank */
        const int64_t tokens = (int64_t)plan->micro_batch * m->seq_len;
        d.moe_experts = (int)m->moe.experts;
        d.moe_top_k = (int)m->moe.top_k;
        d.moe_ffn = (int)m->moe.expert_ffn;
        d.moe_capacity = (int)MIN(real_moe_capacity(tokens, m->moe.top_k, m->moe.experts,
                                                    plan->experts.capacity_factor),
                                  (int64_t)INT_MAX);
        d.ep = zp_plan_ep(plan);
    }
    return d;
}

void real_engine_deliver(RealBackend *be, RealBf16 *dst, const RealBf16 *src, uint64_t n,
                         gboolean accumulate)
{
    if (accumulate)
        be->add_bf16(be, dst, src, n);
    else
        be->copy(be, dst, src, n * sizeof(RealBf16));
}

gboolean real_engine_qgz(RealBackend *be, int rank, RealComm *total, RealComm *node,
                         RealComm *cross, const float *pieces, uint64_t part, uint64_t groups,
                         uint8_t *work, RealBf16 *mine, GError **error)
{
    const int nodes = cross->size;
    float *acc = real_engine_alloc(be, rank, (uint64_t)nodes * part * sizeof(float),
                                   ZP_MEM_WORKSPACE, error);
    float *out = acc ? real_engine_alloc(be, rank, part * sizeof(float), ZP_MEM_WORKSPACE, error)
                     : NULL;
    const double before = node->sent_bytes + cross->sent_bytes;
    gboolean ok = out && real_zeropp_qgz_reduce(node, cross, pieces, part, groups, work, acc,
                                                out, error);
    total->sent_bytes += node->sent_bytes + cross->sent_bytes - before;
    for (uint64_t k = 0; ok && k < part; k++)
        mine[k] = real_bf16_from_f32(out[k]);
    be->free(be, acc);
    be->free(be, out);
    return ok;
}
