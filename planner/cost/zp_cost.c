/* zp_cost: a compute op's time from the profile's op table, kernel by kernel (zp_cost_kernels)
 * or whole; else from its framework's kernel inventory (zp_inventory) at the profile's
 * per-class kernel rates (zp_kernrate); else the roofline. */
#include "zp_cost.h"
#include "zp_offload.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

gboolean zp_cost_cpu_backend(const ZpHw *hw)
{
    return hw->op_costs.present && strcmp(hw->op_costs.backend, "cpu") == 0;
}

/* A kernel's time from the op table, for zp_cost_kernel_shares. */
static double table_kernel_s(const void *c, const ZpKernel *k)
{
    return zp_cost_kernel_s(c, k);
}

void zp_cost_module_shares(const ZpModel *model, const ZpPlan *plan, ZpComputeKind kind,
                           const ZpCost *c, ZpModuleShares *out)
{
    zp_cost_kernel_shares(model, plan, kind, c && c->table ? table_kernel_s : NULL, c, out);
}

void zp_cost_optimizer_shape(double elems, char out[ZP_OPTABLE_SHAPE_LEN])
{
    g_snprintf(out, ZP_OPTABLE_SHAPE_LEN, "n%.0f", elems);
}

ZpOptPath zp_cost_optimizer_whole(const ZpOpTable *t, double elems, int ranks, double *time_s,
                                  double around[2])
{
    const char *name = zp_sched_compute_name(ZP_COMP_OPTIMIZER);
    const ZpOpTime *below = NULL, *above = NULL;
    double lo = -INFINITY, hi = INFINITY;
    for (int i = 0; i < t->n_ops; i++) {
        const ZpOpTime *o = &t->ops[i];
        char *end = NULL;
        const double n = o->shape[0] == 'n' ? g_ascii_strtod(o->shape + 1, &end) : NAN;
        if (o->ranks != ranks || strcmp(o->op, name) != 0 || !end || *end || !(n > 0))
            continue;
        if (n <= elems && n > lo)
            lo = n, below = o;
        if (n >= elems && n < hi)
            hi = n, above = o;
    }
    around[0] = lo, around[1] = hi;
    if (below && fabs(elems - lo) <= 0.5) {
        *time_s = below->time_s;
        return ZP_OPT_PATH_WHOLE;
    }
    if (above && fabs(hi - elems) <= 0.5) {
        *time_s = above->time_s;
        return ZP_OPT_PATH_WHOLE;
    }
    if (!below || !above)
        return ZP_OPT_PATH_FITTED;
    *time_s = below->time_s + (elems - lo) * (above->time_s - below->time_s) / (hi - lo);
    return ZP_OPT_PATH_INTERPOLATED;
}

/* ---- times ---- */

double zp_cost_kernel_s(const ZpCost *c, const ZpKernel *k)
{
    const ZpOpTable *t = &c->hw->op_costs;
    double rate = 0, work = k->flops;
    if (k->kind == ZP_KERNEL_GEMM) {
        const ZpGemmShape *exact = zp_optable_gemm_shape(t, k->sub, k->head, k->m, k->n, k->k);
        if (exact)
            return exact->time_s - zp_optable_stream_saving_s(t);
        rate = zp_optable_gemm_rate(t, k->sub, k->head, k->m, k->n, k->k);
    } else if (k->kind == ZP_KERNEL_ATTENTION && c->attn_flops_per_s > 0) {
        rate = c->attn_flops_per_s;
    } else if (k->kind == ZP_KERNEL_ATTENTION) {
        return zp_optable_attention_s(t, k->sub, k->flops, c->log2_seq, c->log2_head_dim,
                                      c->log2_heads) -
               zp_optable_stream_saving_s(t);
    } else {
        rate = t->ew_bytes_per_s[k->sub];
        work = k->bytes;
    }
    /* The table's rates are net of launch_s, a kernel timed alone; in a step's stream it
     * costs launch_stream_s (zp_optable_stream_saving_s). */
    return t->launch_s - zp_optable_stream_saving_s(t) + work / rate;
}

static double kernels_s(const ZpCost *c, const ZpKernels *ks)
{
    double total = 0;
    for (int i = 0; i < ks->n; i++)
        total += zp_cost_kernel_s(c, &ks->k[i]);
    return total;
}

/* Why the table cannot cost this plan, or NULL when it can. */
static const char *table_gap(const ZpHw *hw, const ZpModel *model, const ZpPlan *plan)
{
    if (!hw->op_costs.present)
        return "the profile has no op_costs table";
    if (!zp_model_has_architecture(model))
        return "the model has no architecture (its ops have no shapes)";
    if (!zp_plan_attention_rated(plan) && !hw->op_costs.has_eager_attention)
        return "the op table has no eager_attention rates";
    return NULL;
}

/* How the plan's optimizer is costed (c->whole[ZP_COMP_OPTIMIZER] when measured whole at
 * its elements), in words. */
static char *optimizer_path(ZpCost *c, const ZpModel *model, const ZpPlan *plan)
{
    const double all = (double)zp_sched_optimizer_elems(model, plan);
    const double elems = (1.0 - zp_offload_cpu_share(plan, all)) * all;
    double t, around[2];
    if (elems <= 0)
        return g_strdup("no optimizer on the device (offloaded)");
    if (zp_plan_pp(plan) > 1)
        return g_strdup("the optimizer by each pipeline stage's elements: a whole time there, "
                        "else its fitted rate");
    const ZpOptPath path = zp_cost_optimizer_whole(&c->hw->op_costs, elems, c->ranks, &t, around);
    c->whole[ZP_COMP_OPTIMIZER] = path == ZP_OPT_PATH_WHOLE;
    if (path == ZP_OPT_PATH_WHOLE)
        return g_strdup_printf("the optimizer measured whole at its %.0f elements", elems);
    if (path == ZP_OPT_PATH_INTERPOLATED)
        return g_strdup_printf("the optimizer's %.0f elements between its whole times at %.0f "
                               "and %.0f", elems, around[0], around[1]);
    return g_strdup_printf("the optimizer's %.0f elements at its fitted rate (no whole times "
                           "around them)", elems);
}

/* ---- the kernel inventory on the profile's per-class rates ---- */

double zp_cost_inv_kernel_s(const ZpCost *c, const ZpInvKernel *k)
{
    const ZpKernRates *r = &c->hw->kernel_rates;
    switch (k->cls) {
    case ZP_KCLASS_GEMM:
        if (c->gemm_surface)
            return zp_kernrate_gemm_s(r, c->hw->hbm_bytes_per_s, k->batch, k->m, k->n, k->k,
                                      k->read_bytes + k->write_bytes);
        return k->flops / (c->peak_flops * zp_hw_gemm_efficiency(c->hw, k->flops / k->batch));
    case ZP_KCLASS_ATTENTION:
        return c->attn_flops_per_s > 0 ? k->flops / c->attn_flops_per_s : 0;
    case ZP_KCLASS_MEMORY:
        return zp_kernrate_memory_s(r, c->hw->hbm_bytes_per_s, k->read_bytes + k->write_bytes,
                                    k->launches);
    default:
        return 0;
    }
}

double zp_cost_inv_op_s(const ZpCost *c, const ZpInvList *list,
                        double by_class[ZP_KCLASS_INVENTORY_N], double *host_s)
{
    double device = 0, launches = 0;
    if (by_class)
        memset(by_class, 0, ZP_KCLASS_INVENTORY_N * sizeof by_class[0]);
    for (int i = 0; i < list->n; i++) {
        const double s = zp_cost_inv_kernel_s(c, &list->k[i]);
        device += s;
        if (by_class)
            by_class[list->k[i].cls] += s;
        if (list->k[i].cls != ZP_KCLASS_COLLECTIVE)
            launches += list->k[i].launches;
    }
    const double host = launches * c->hw->kernel_rates.launch_host_s;
    if (host_s)
        *host_s = host;
    return MAX(device, host);
}

/* The data-parallel group spans one node when its ranks, zp_plan_placed_dp_stride apart in the
 * plan's order (ZpRankOrder: mp under Megatron-Core's default tp-dp-pp, mp P under tp-pp-dp),
 * and their tensor groups fit in one. */
static ZpLinkClass dp_link(const ZpHw *hw, const ZpPlan *plan)
{
    const double span =
        (double)(plan->dp - 1) * (double)zp_plan_placed_dp_stride(plan) + plan->mp;
    return hw->gpus_per_node > 0 && span <= hw->gpus_per_node ? ZP_LINK_NVLINK : ZP_LINK_NETWORK;
}

/* A mixture of experts' or latent attention's block ops by their own kernels
 * (zp_inventory_moe_block): the first dense and the first sparse unit's, forward, backward
 * and (full checkpointing) the recomputed forward. */
static void block_variants(ZpCost *c, const ZpModel *model, const ZpPlan *plan)
{
    static const ZpComputeKind kinds[] = {ZP_COMP_BLOCK_FWD, ZP_COMP_RECOMPUTE,
                                          ZP_COMP_BLOCK_BWD};
    gboolean seen[2] = {FALSE, FALSE};
    for (int u = 1; u <= model->layers && c->n_blocks < 2; u++) {
        const int sparse = zp_moe_enabled(&model->moe) && zp_model_unit_sparse(model, u);
        if (seen[sparse])
            continue;
        seen[sparse] = TRUE;
        const int v = c->n_blocks++;
        for (int k = 0; k < ZP_COMP_N; k++)
            c->block_flops[v][k] = -1; /* kinds never matched */
        for (size_t i = 0; i < G_N_ELEMENTS(kinds); i++) {
            const ZpComputeKind k = kinds[i];
            double flops = 0, bytes = 0;
            if ((k == ZP_COMP_RECOMPUTE && !plan->checkpoint) ||
                !zp_sched_unit_block_op(model, plan, u, k, &flops, &bytes))
                continue;
            ZpInvList list;
            zp_inventory_moe_block(model, plan, u, k == ZP_COMP_BLOCK_BWD, &list);
            c->block_flops[v][k] = flops, c->block_mem_bytes[v][k] = bytes;
            c->block_s[v][k] = zp_cost_inv_op_s(c, &list, NULL, NULL);
        }
    }
}

/* An inventory op's times under everything they read: zp_inventory_op's kernels of a dense
 * op come from the inventory's functions, which read a ZpInvDims (amp set from the inventory)
 * and the optimizer's elements, and no plan or model (zp_inventory.h), the recompute's choice
 * besides (selective_recompute && !checkpoint: core attention alone); zp_cost_inv_op_s and
 * zp_cost_inv_kernel_s read the list and c's hw, gemm_surface, peak_flops and
 * attn_flops_per_s; zp_inventory_totals the list. The key is zeroed before it is filled, so
 * equal bytes are equal fields; c->dims comes zeroed from zp_inventory_dims, padding too. */
typedef struct {
    const ZpHw *hw;
    const ZpInventory *inv;
    ZpInvDims dims;
    double peak_flops, attn_flops_per_s, optimizer_elems;
    int kind, gemm_surface, core_attention_alone, unused;
} InvOpKey;

typedef struct {
    InvOpKey key;
    double kind_s, host_s, launches;
    double class_s[ZP_KCLASS_INVENTORY_N];
} InvOpTime;

struct ZpCostMemo {
    GHashTable *ops; /* InvOpTime by its key */
};

static guint inv_op_key_hash(gconstpointer p)
{
    G_STATIC_ASSERT(sizeof(InvOpKey) % sizeof(guint64) == 0);
    return zp_hash_words64(p, sizeof(InvOpKey));
}

static gboolean inv_op_key_equal(gconstpointer a, gconstpointer b)
{
    return memcmp(a, b, sizeof(InvOpKey)) == 0;
}

ZpCostMemo *zp_cost_memo_new(void)
{
    ZpCostMemo *m = g_new0(ZpCostMemo, 1);
    m->ops = g_hash_table_new_full(inv_op_key_hash, inv_op_key_equal, g_free, NULL);
    return m;
}

void zp_cost_memo_free(ZpCostMemo *m)
{
    if (!m)
        return;
    g_hash_table_destroy(m->ops);
    g_free(m);
}

/* The kinds whose inventory is the inventory's own functions' (a mixture of experts' expert
 * and unpermute ops read the model and plan: zp_inventory_moe_op). */
static gboolean inv_op_from_dims(ZpComputeKind k)
{
    return k == ZP_COMP_EMBED_FWD || k == ZP_COMP_BLOCK_FWD || k == ZP_COMP_RECOMPUTE ||
           k == ZP_COMP_HEAD || k == ZP_COMP_BLOCK_BWD || k == ZP_COMP_EMBED_BWD ||
           k == ZP_COMP_OPTIMIZER;
}

/* c's kind_s, class_s, host_s and launches of kind k from the plan's inventory, kept in memo
 * (may be NULL) under InvOpKey. */
static void inventory_op_time(ZpCost *c, const ZpModel *model, const ZpPlan *plan,
                              ZpComputeKind k, ZpCostMemo *memo)
{
    InvOpKey key;
    const gboolean keyed = memo && inv_op_from_dims(k);
    if (keyed) {
        memset(&key, 0, sizeof key);
        key.hw = c->hw, key.inv = c->inv;
        memcpy(&key.dims, &c->dims, sizeof key.dims);
        key.peak_flops = c->peak_flops, key.attn_flops_per_s = c->attn_flops_per_s;
        key.optimizer_elems = k == ZP_COMP_OPTIMIZER ? c->optimizer_elems : 0;
        key.kind = k, key.gemm_surface = c->gemm_surface;
        key.core_attention_alone =
            k == ZP_COMP_RECOMPUTE && plan->selective_recompute && !plan->checkpoint;
        const InvOpTime *t = g_hash_table_lookup(memo->ops, &key);
        if (t) {
            c->kind_s[k] = t->kind_s, c->host_s[k] = t->host_s, c->launches[k] = t->launches;
            memcpy(c->class_s[k], t->class_s, sizeof t->class_s);
            return;
        }
    }
    ZpInvList list;
    zp_inventory_op(c->inv, model, plan, k, c->optimizer_elems, &list);
    c->kind_s[k] = zp_cost_inv_op_s(c, &list, c->class_s[k], &c->host_s[k]);
    ZpInvTotals tot;
    zp_inventory_totals(&list, &tot);
    c->launches[k] = tot.launches;
    if (keyed) {
        InvOpTime *t = g_new(InvOpTime, 1);
        t->key = key;
        t->kind_s = c->kind_s[k], t->host_s = c->host_s[k], t->launches = c->launches[k];
        memcpy(t->class_s, c->class_s[k], sizeof t->class_s);
        g_hash_table_add(memo->ops, t);
    }
}

static void inventory_init(ZpCost *c, const ZpModel *model, const ZpPlan *plan,
                           const ZpComputeOps *known_ops, ZpCostMemo *memo, gboolean explain)
{
    const ZpHw *hw = c->hw;
    const ZpKernRates *r = &hw->kernel_rates;
    c->inventory = TRUE;
    c->inv = zp_inventory_for_plan(plan);
    zp_inventory_dims(model, plan, &c->dims);
    c->dims.amp = c->inv->autocast;
    c->optimizer_elem_bytes =
        zp_plan_step_bytes(zp_plan_state_bytes(plan->precision, plan->optimizer));
    const double all = (double)zp_sched_optimizer_elems(model, plan);
    c->optimizer_elems = (1.0 - zp_offload_cpu_share(plan, all)) * all;
    c->dp_link = dp_link(hw, plan);
    ZpComputeOps own[ZP_COMP_N];
    if (!known_ops)
        zp_sched_compute_ops(model, plan, own);
    const ZpComputeOps *ops = known_ops ? known_ops : own;
    for (int k = 0; k < ZP_COMP_N; k++) {
        c->op_flops[k] = ops[k].flops;
        c->op_mem_bytes[k] = ops[k].mem_bytes;
        inventory_op_time(c, model, plan, (ZpComputeKind)k, memo);
        /* The inventories launch one uniform block (a dense MLP ffn_hidden wide, the fused
         * qkv); a mixture of experts' or latent attention's blocks differ from it and from each
         * other (zp_build_unit_block_cost), so their ops are priced by their own kernels
         * (block_variants), never by those. */
        const gboolean block = k == ZP_COMP_BLOCK_FWD || k == ZP_COMP_RECOMPUTE ||
                               k == ZP_COMP_BLOCK_BWD;
        if (block && (zp_moe_enabled(&model->moe) || zp_mla_enabled(&model->mla)))
            c->launches[k] = 0;
        if (!explain)
            continue;
        ZpModuleShares shares;
        zp_cost_module_shares(model, plan, (ZpComputeKind)k, NULL, &shares);
        memcpy(c->module_share[k], shares.flops, sizeof shares.flops);
    }
    if (!explain) {
        if (zp_moe_enabled(&model->moe) || zp_mla_enabled(&model->mla))
            block_variants(c, model, plan);
        return;
    }
    g_snprintf(c->why, sizeof c->why,
               "kernel inventory '%s' on the profile's kernel_rates: GEMMs %s, memory-bound "
               "kernels by the HBM efficiency curve, attention %s, %s, compute beside the "
               "data-parallel group's collectives (%s) %.3fx slower",
               c->inv->name,
               c->gemm_surface ? "on the wave and tile surface under the published best rate"
               : r->has_gemm   ? "on the fp32 roofline (the profile's GEMM surface is a 16-bit "
                                 "tensor-core rate; PyTorch's fp32 matmuls do not use TF32 by "
                                 "default, torch.backends.cuda.matmul.allow_tf32 False since 1.12)"
                               : "on the roofline (the profile has no GEMM surface)",
               c->attn_flops_per_s > 0 ? "at the fused kernel's table rate"
                                       : "as batched GEMMs and softmax kernels",
               r->launch_host_s > 0 ? "no op faster than its kernels' host issue"
                                    : "no host issue cost (none in the profile)",
               zp_link_class_name(c->dp_link),
               zp_kernrate_interference(r, c->dp_link, 1));
    if (zp_moe_enabled(&model->moe) || zp_mla_enabled(&model->mla)) {
        block_variants(c, model, plan);
        g_strlcat(c->why, "; blocks with experts or latent attention by their own kernels "
                  "(attention and latent projections, shared experts, router, softmax and "
                  "top-k, permute), the experts' grouped GEMMs and unpermute by theirs "
                  "(zp_inventory_moe)", sizeof c->why);
    }
}

/* zp_cost_init; `explain` FALSE (zp_cost_init_whole_ops) leaves c->why empty and
 * module_share zero, which only the explanation and a module's op (module >= 0) read; `ops`
 * (may be NULL) are zp_sched_compute_ops(model, plan) already computed. */
static gboolean cost_init(ZpCost *c, const ZpHw *hw, const ZpModel *model, const ZpPlan *plan,
                          const ZpComputeOps *ops, ZpCostMemo *memo, gboolean explain,
                          GError **error)
{
    memset(c, 0, sizeof *c);
    c->hw = hw;
    c->peak_flops = zp_hw_peak_flops(hw, plan->precision);
    c->gemm_surface = hw->kernel_rates.has_gemm && plan->precision != ZP_PREC_FP32;
    if (c->peak_flops <= 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s (%s) has no %s peak in its profile",
                    hw->name, hw->gpu, zp_precision_name(plan->precision));
        return FALSE;
    }
    if (zp_plan_attention_rated(plan)) {
        c->attn_flops_per_s = zp_hw_attention_flops_per_s(
            hw, plan->attention, (double)zp_model_head_dim(model), (double)model->seq_len);
        if (c->attn_flops_per_s <= 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                        "attention: %s has no rate for '%s' in its attention table", hw->name,
                        zp_attention_name(plan->attention));
            return FALSE;
        }
    }
    const char *gap = table_gap(hw, model, plan);
    /* A schedule file may name no model (a zero one): no shapes for an inventory either. */
    const gboolean shapes =
        zp_model_has_architecture(model) && model->layers > 0 && model->hidden > 0;
    if (gap && hw->kernel_rates.present && shapes) {
        inventory_init(c, model, plan, ops, memo, explain);
        return TRUE;
    }
    if (gap && !explain)
        return TRUE;
    if (gap) {
        g_snprintf(c->why, sizeof c->why, "roofline (the fallback): %s%s", gap,
                   !hw->kernel_rates.present ? " and no kernel_rates"
                                             : "; its kernel_rates need the model's shapes");
        return TRUE;
    }
    c->table = TRUE;
    c->optimizer_elem_bytes =
        zp_plan_step_bytes(zp_plan_state_bytes(plan->precision, plan->optimizer));
    c->log2_seq = log2((double)model->seq_len);
    c->log2_head_dim = log2((double)zp_model_head_dim(model));
    c->log2_heads = log2(MAX(1.0, (double)model->heads / plan->mp));
    const int world = plan->dp * plan->mp * zp_plan_pp(plan);
    c->ranks = hw->gpus_per_node > 0 ? MIN(world, hw->gpus_per_node) : world;
    GString *whole = g_string_new(NULL), *summed = g_string_new(NULL);
    for (int k = 0; k < ZP_COMP_N; k++) {
        ZpKernels ks;
        zp_cost_kernels(model, plan, (ZpComputeKind)k, &ks);
        c->kind_s[k] = k == ZP_COMP_OPTIMIZER ? hw->op_costs.launch_s : kernels_s(c, &ks);
        if (ks.n == 0)
            continue;
        char shape[ZP_OPTABLE_SHAPE_LEN];
        zp_cost_op_shape(model, plan, (ZpComputeKind)k, shape);
        const ZpOpTime *t = zp_optable_op(&hw->op_costs, zp_sched_compute_name(k), shape,
                                          c->ranks);
        c->whole[k] = t != NULL;
        if (t)
            c->kind_s[k] = t->time_s;
        if (!explain)
            continue;
        ZpModuleShares shares;
        zp_cost_module_shares(model, plan, (ZpComputeKind)k, c, &shares);
        memcpy(c->module_share[k], shares.time, sizeof shares.time);
        GString *list = t ? whole : summed;
        g_string_append_printf(list, "%s%s", list->len ? ", " : "", zp_sched_compute_name(k));
    }
    char *opt = optimizer_path(c, model, plan); /* sets c->whole[ZP_COMP_OPTIMIZER] */
    if (!explain) {
        g_free(opt);
        g_string_free(whole, TRUE);
        g_string_free(summed, TRUE);
        return TRUE;
    }
    g_snprintf(c->why, sizeof c->why,
               "op table: %s measured whole (%d rank%s at once)%s%s; %s (%s)",
               whole->len ? whole->str : "no op", c->ranks, c->ranks == 1 ? "" : "s",
               summed->len ? "; the sum of their kernels for " : "", summed->str, opt,
               hw->op_costs.source);
    g_free(opt);
    g_string_free(whole, TRUE);
    g_string_free(summed, TRUE);
    return TRUE;
}

gboolean zp_cost_init(ZpCost *c, const ZpHw *hw, const ZpModel *model, const ZpPlan *plan,
                      GError **error)
{
    return cost_init(c, hw, model, plan, NULL, NULL, TRUE, error);
}

gboolean zp_cost_init_whole_ops(ZpCost *c, const ZpHw *hw, const ZpModel *model,
                                const ZpPlan *plan, const ZpComputeOps ops[ZP_COMP_N],
                                ZpCostMemo *memo, GError **error)
{
    return cost_init(c, hw, model, plan, ops, memo, FALSE, error);
}

/* Moving `bytes` (read and written) on a backend with an op table: one launch at its measured
 * convert rate (conversions, rounding, adds in place). */
static double convert_s(const ZpCost *c, double bytes)
{
    const ZpOpTable *t = &c->hw->op_costs;
    return t->launch_s + bytes / t->ew_bytes_per_s[ZP_EW_CONVERT];
}

/* One copy of an array of `bytes`: one launch and the table's measured copy time at that size
 * (zp_optable's "copy"), or without one at the convert rate over its bytes read and written. */
static double copy_s(const ZpCost *c, double bytes)
{
    const ZpOpTable *t = &c->hw->op_costs;
    return t->copy.n > 0 ? t->launch_s + zp_colltab_time_s(&t->copy, bytes)
                         : convert_s(c, 2 * bytes);
}

static gboolean same(double a, double b)
{
    return fabs(a - b) <= 1e-9 * MAX(fabs(a), fabs(b));
}

double zp_cost_op_s(const ZpCost *c, ZpComputeKind kind, int module, double flops,
                    double gemm_flops, double attn_flops, double mem_bytes)
{
    const gboolean optimizer = kind == ZP_COMP_OPTIMIZER;
    /* A coalesced gather's unpack is copies: the table's measured copy rate, as the
     * collectives' own copies (not the block kernels' elementwise rate, a tenth of it on a
     * CPU). ZeRO++'s (de)quantisation kernels move bytes that differ op by op (a bucket's, a
     * unit's) in kernels the table does not time, so they stay on the roofline. */
    if (c->table && kind == ZP_COMP_UNPACK)
        return copy_s(c, mem_bytes / 2);
    if (c->inventory && kind == ZP_COMP_OPTIMIZER && mem_bytes > 0) {
        /* Only n set: the list's builders write each kernel whole and its readers read the
         * first n (zp_inventory_op empties it alike). `= {0}` cleared all ZP_INV_MAX kernels,
         * 23 KB, at every call: 106 M instructions of plan --3d gpt-1t/4096's 5.29 G. */
        ZpInvList list;
        list.n = 0;
        c->inv->optimizer(&c->dims, mem_bytes / c->optimizer_elem_bytes, &list);
        return zp_cost_inv_op_s(c, &list, NULL, NULL);
    }
    for (int v = 0; c->inventory && module < 0 && v < c->n_blocks; v++)
        if (same(flops, c->block_flops[v][kind]) && same(mem_bytes, c->block_mem_bytes[v][kind]))
            return c->block_s[v][kind];
    if (c->inventory && c->launches[kind] > 0 &&
        (module >= 0 || (same(flops, c->op_flops[kind]) && same(mem_bytes, c->op_mem_bytes[kind]))))
        return c->kind_s[kind] * (module >= 0 ? c->module_share[kind][module] : 1.0);
    if (!c->table || kind == ZP_COMP_QUANTIZE)
        return zp_hw_compute_time_s(c->hw, c->peak_flops, flops, gemm_flops, attn_flops,
                                    c->attn_flops_per_s, mem_bytes, optimizer);
    double whole_s, around[2];
    if (optimizer && zp_cost_optimizer_whole(&c->hw->op_costs, mem_bytes / c->optimizer_elem_bytes,
                                             c->ranks, &whole_s, around) != ZP_OPT_PATH_FITTED)
        return whole_s;
    return c->kind_s[kind] * (module >= 0 ? c->module_share[kind][module] : 1.0) +
           (optimizer ? mem_bytes / c->hw->op_costs.optimizer_bytes_per_s : 0);
}

int zp_cost_coll_passes(const ZpOp *op, int stage, int ranks,
                        ZpCollPass out[ZP_COLL_PASSES_MAX])
{
    const double share = op->bytes / MAX(ranks, 1);
    /* this rank's share delivered: copied, or at stages 2-3 after the first micro-step added
     * in place in bf16 (real_engine_base.c real_engine_deliver) */
    const ZpCollPass deliver = {share, stage >= 2 && op->micro > 0};
    const ZpCollPass whole = {op->bytes, FALSE};
    if (op->buffer < 0 && !(op->sub == ZP_COLL_ALLGATHER && stage == 3))
        return 0;
    int n = 0;
    switch ((ZpCollKind)op->sub) {
    case ZP_COLL_ALLREDUCE: /* into the bucket and back */
        out[n++] = whole, out[n++] = whole;
        break;
    case ZP_COLL_REDUCE_SCATTER:
        if (stage < 2)
            out[n++] = whole;
        out[n++] = deliver;
        break;
    case ZP_COLL_ALLGATHER: /* alone, MPI copies the rank's slice into the bucket itself */
        if (ranks == 1)
            out[n++] = whole;
        if (stage < 3)
            out[n++] = whole;
        break;
    default:
        break;
    }
    return n;
}

double zp_cost_coll_copy_bytes(const ZpOp *op, int stage, int ranks)
{
    ZpCollPass p[ZP_COLL_PASSES_MAX];
    const int n = zp_cost_coll_passes(op, stage, ranks, p);
    double bytes = 0;
    for (int i = 0; i < n; i++) /* an add reads 2 + 2 and writes 2 per 2-byte element */
        bytes += (p[i].add ? 3 : 2) * p[i].bytes;
    return bytes;
}

double zp_cost_coll_copy_s(const ZpCost *c, const ZpOp *op, int stage, int ranks)
{
    ZpCollPass p[ZP_COLL_PASSES_MAX];
    const int n = c->table ? zp_cost_coll_passes(op, stage, ranks, p) : 0;
    double s = 0;
    for (int i = 0; i < n; i++)
        if (p[i].bytes > 0)
            s += p[i].add ? convert_s(c, 3 * p[i].bytes) : copy_s(c, p[i].bytes);
    return s;
}

double zp_cost_contention(const ZpCost *c, int overlapping)
{
    if (c->inventory)
        return zp_kernrate_interference(&c->hw->kernel_rates, c->dp_link, overlapping);
    return c->table && overlapping > 0 ? c->hw->op_costs.contention : 1.0;
}
