/* zp_inventory: the frameworks' kernel inventories behind one table of functions, the sizes an
 * op's kernels take from the model and plan, and the builders and totals they share. */
#include "zp_inventory.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

static const ZpInventory *const inventories[] = {&zp_inventory_eager, &zp_inventory_megatron,
                                                 &zp_inventory_deepspeed};
#define N_INVENTORIES (sizeof inventories / sizeof inventories[0])

void zp_inventory_dims(const ZpModel *m, const ZpPlan *p, ZpInvDims *d)
{
    const double mp = p->mp > 0 ? p->mp : 1;
    memset(d, 0, sizeof *d);
    d->b = p->micro_batch;
    d->s = (double)m->seq_len;
    d->t = d->b * d->s;
    d->h = (double)m->hidden;
    d->mp = mp;
    d->e = zp_plan_elem_bytes(p->precision);
    d->hd = (double)zp_model_head_dim(m);
    d->ha = (double)zp_model_attn_width(m);
    d->heads = (double)m->heads / mp;
    d->kv_heads = (double)zp_model_kv_heads(m) / mp;
    d->q = (double)zp_model_qkv_width(m) / mp;
    d->f = (double)m->ffn_hidden / mp;
    d->f1 = (double)zp_model_fc1_width(m) / mp;
    d->v = (double)m->vocab / mp;
    d->t_norm = p->sequence_parallel ? d->t / mp : d->t;
    d->positions = (double)zp_model_positions(m);
    d->gated = zp_model_gated(m);
    d->rms = m->norm == ZP_NORM_RMSNORM;
    d->bias_qkv = zp_model_has_bias(m, ZP_NO_BIAS_QKV);
    d->bias_proj = zp_model_has_bias(m, ZP_NO_BIAS_PROJ);
    d->bias_mlp = zp_model_has_bias(m, ZP_NO_BIAS_MLP);
    d->learned = m->learned_positions;
    d->rope = m->rope_theta > 0;
    d->tied = m->tied_embeddings;
    d->head_shares_table = d->tied && zp_plan_pp(p) == 1;
    d->dropout = m->dropout;
    d->qk_norm = m->qk_norm;
    d->fp16 = p->precision == ZP_PREC_FP16;
    /* Time, not memory: a fused kernel without a rate (mem-efficient) launches as eager's
     * batched GEMMs and softmax here (zp_plan_attention_rated). */
    d->fused = zp_plan_attention_rated(p);
    d->main_grad = !p->no_main_grad;
    /* Over the step's micro-steps, not a short schedule's (zp_sched_build_short): a
     * micro-step's ops are the same in both. */
    const int micro_steps = zp_plan_step_grad_accum(p);
    d->accum_share = micro_steps > 1 ? (double)(micro_steps - 1) / micro_steps : 0.0;
    d->attention_share = d->fused ? zp_model_attention_share(m) : 1.0;
}

const ZpInventory *zp_inventory_find(const char *name, const char *flag, GError **error)
{
    GString *names = g_string_new(NULL);
    for (size_t i = 0; i < N_INVENTORIES; i++) {
        if (name && strcmp(name, inventories[i]->name) == 0) {
            g_string_free(names, TRUE);
            return inventories[i];
        }
        g_string_append_printf(names, "%s%s", i ? ", " : "", inventories[i]->name);
    }
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: unknown kernel inventory '%s' (known: %s)",
                flag, name ? name : "", names->str);
    g_string_free(names, TRUE);
    return NULL;
}

const ZpInventory *zp_inventory_for_plan(const ZpPlan *plan)
{
    const char *want = plan->kernels[0] ? plan->kernels : zp_impl_name(plan->impl);
    for (size_t i = 0; i < N_INVENTORIES; i++)
        if (strcmp(want, inventories[i]->name) == 0)
            return inventories[i];
    return &zp_inventory_eager;
}

void zp_inventory_op(const ZpInventory *inv, const ZpModel *model, const ZpPlan *plan,
                     ZpComputeKind kind, double optimizer_elems, ZpInvList *out)
{
    out->n = 0;
    switch (kind) { /* the kinds that need no dimensions first: the search's screen asks for
                     * every kind of each plan it costs */
    case ZP_COMP_EXPERT_FWD: /* a mixture of experts' own (zp_inventory_moe.c) */
    case ZP_COMP_EXPERT_BWD:
    case ZP_COMP_UNPERMUTE_FWD:
    case ZP_COMP_UNPERMUTE_BWD:
        zp_inventory_moe_op(model, plan, kind, out);
        return;
    case ZP_COMP_EMBED_FWD:
    case ZP_COMP_BLOCK_FWD:
    case ZP_COMP_RECOMPUTE:
    case ZP_COMP_HEAD:
    case ZP_COMP_BLOCK_BWD:
    case ZP_COMP_EMBED_BWD:
    case ZP_COMP_OPTIMIZER:
        break;
    default: /* not kernels of the model */
        return;
    }
    ZpInvDims d;
    zp_inventory_dims(model, plan, &d);
    d.amp = inv->autocast;
    switch (kind) {
    case ZP_COMP_EMBED_FWD:
        inv->embed_fwd(&d, out);
        break;
    case ZP_COMP_BLOCK_FWD:
        inv->block_fwd(&d, out);
        break;
    case ZP_COMP_RECOMPUTE:
        /* selective recomputation (Megatron's only, --impl megatron): core attention alone */
        if (plan->selective_recompute && !plan->checkpoint)
            zp_inventory_megatron_core_attention_fwd(&d, out);
        else
            inv->block_fwd(&d, out);
        break;
    case ZP_COMP_HEAD:
        inv->head(&d, out);
        break;
    case ZP_COMP_BLOCK_BWD:
        inv->block_bwd(&d, out);
        break;
    case ZP_COMP_EMBED_BWD:
        inv->embed_bwd(&d, out);
        break;
    case ZP_COMP_OPTIMIZER:
        if (optimizer_elems > 0)
            inv->optimizer(&d, optimizer_elems, out);
        break;
    default:
        break;
    }
}

void zp_inventory_totals(const ZpInvList *list, ZpInvTotals *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < list->n; i++) {
        const ZpInvKernel *k = &list->k[i];
        if (k->cls == ZP_KCLASS_COLLECTIVE)
            continue;
        out->launches += k->launches;
        if (k->cls == ZP_KCLASS_GEMM)
            out->gemm_flops += k->flops;
        else if (k->cls == ZP_KCLASS_ATTENTION)
            out->attention_flops += k->flops;
        else
            out->memory_bytes += k->read_bytes + k->write_bytes;
    }
}

static void add(ZpInvList *out, ZpInvKernel k)
{
    g_assert(out->n < ZP_INV_MAX);
    if (k.launches <= 0)
        k.launches = 1;
    out->k[out->n++] = k;
}

void zp_inv_gemm(ZpInvList *out, const char *name, double batch, double m, double n, double k,
                 double in_bytes, double out_bytes, const char *source)
{
    add(out, (ZpInvKernel){.name = name, .cls = ZP_KCLASS_GEMM, .batch = batch, .m = m, .n = n,
                           .k = k, .flops = 2 * batch * m * n * k,
                           .read_bytes = batch * (m * k + k * n) * in_bytes,
                           .write_bytes = batch * m * n * out_bytes, .source = source});
}

void zp_inv_mem(ZpInvList *out, const char *name, double read_bytes, double write_bytes,
                const char *source)
{
    add(out, (ZpInvKernel){.name = name, .cls = ZP_KCLASS_MEMORY, .read_bytes = read_bytes,
                           .write_bytes = write_bytes, .source = source});
}

void zp_inv_multi(ZpInvList *out, const char *name, double read_bytes, double write_bytes,
                  double launches, const char *source)
{
    add(out, (ZpInvKernel){.name = name, .cls = ZP_KCLASS_MEMORY, .read_bytes = read_bytes,
                           .write_bytes = write_bytes, .launches = launches, .source = source});
}

void zp_inv_qk_norm(ZpInvList *out, const ZpInvDims *d, int backward, const char *source)
{
    if (!d->qk_norm)
        return;
    const double qk = d->t * (d->heads + d->kv_heads) * d->hd * d->e;
    zp_inv_mem(out, backward ? "qk_norm_bwd" : "qk_norm", backward ? 2 * qk : qk, qk, source);
}

/* A fused kernel reads q, k, v (and o, do, the log-sum-exp backward) once and writes its
 * outputs: its own memory traffic, inside its published rate. */
void zp_inv_attention(ZpInvList *out, const ZpInvDims *d, int backward, const char *source)
{
    const double qkv = d->t * d->q * d->e, o = d->t * d->heads * d->hd * d->e;
    add(out, (ZpInvKernel){.name = backward ? "attention_bwd" : "attention_fwd",
                           .cls = ZP_KCLASS_ATTENTION, .backward = backward,
                           .flops = (backward ? 8 : 4) * d->b * d->s * d->s * d->ha / d->mp *
                                    d->attention_share,
                           .read_bytes = backward ? qkv + 2 * o : qkv,
                           .write_bytes = backward ? qkv : o, .source = source});
}

void zp_inv_collective(ZpInvList *out, const char *name, double bytes, const char *source)
{
    add(out, (ZpInvKernel){.name = name, .cls = ZP_KCLASS_COLLECTIVE, .read_bytes = bytes,
                           .source = source});
}

double zp_inv_multi_tensor_launches(double elems)
{
    return MAX(1.0, ceil(elems / (320.0 * 65536.0)));
}
