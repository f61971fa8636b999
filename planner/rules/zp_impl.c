/* zp_impl: the implementation table by kind, and the rules more than one implementation shares
 * (bucket grouping, the prefetch window, unit-level persistence). */
#include "zp_impl.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

const ZpImpl *zp_impl_get(ZpImplKind kind)
{
    static const ZpImpl *const table[ZP_IMPL_N] = {
        [ZP_IMPL_DEEPSPEED] = &zp_impl_deepspeed,
        [ZP_IMPL_FSDP] = &zp_impl_fsdp,
        [ZP_IMPL_PAPER] = &zp_impl_paper,
        [ZP_IMPL_MEGATRON] = &zp_impl_megatron,
        [ZP_IMPL_FSDP2] = &zp_impl_fsdp2,
    };
    return table[kind];
}

ZpStateBytes zp_impl_state_bytes(const ZpPlan *plan)
{
    ZpStateBytes st = zp_plan_state_bytes(plan->precision, plan->optimizer);
    const ZpImpl *impl = zp_impl_get(plan->impl);
    if (impl->grad_bytes)
        st.grad_bytes = impl->grad_bytes(plan);
    return st;
}

gboolean zp_impl_params_are_master(const ZpPlan *plan)
{
    double master, m, v;
    zp_plan_optimizer_split(plan, &master, &m, &v);
    return plan->zero.stage == 3 && zp_impl_get(plan->impl)->sharded_params_are_master &&
           master > 0;
}

gboolean zp_impl_ds_bf16_optimizer(const ZpPlan *plan)
{
    return plan->impl == ZP_IMPL_DEEPSPEED && zp_plan_pp(plan) > 1 && plan->zero.stage == 0 &&
           plan->precision == ZP_PREC_BF16;
}

void zp_impl_plan_defaults(ZpPlan *plan)
{
    const ZpImpl *impl = zp_impl_get(plan->impl);
    if (impl->plan_defaults)
        impl->plan_defaults(plan);
}

uint64_t zp_impl_opt_elems(const ZpSchedule *s, int rank)
{
    const int stage = s->plan.zero.stage;
    const ZpImpl *impl = zp_impl_get(s->plan.impl);
    if (stage == 0)
        return s->total_elems;
    if ((stage == 1 || stage == 2) && impl->rank_opt_elems)
        return impl->rank_opt_elems(s, rank);
    return s->partition_elems;
}

void zp_sched_rank_state_bytes(const ZpSchedule *s, int rank, double *bytes)
{
    memcpy(bytes, s->state_bytes, sizeof s->state_bytes);
    if (s->plan.zero.offload_optimizer.device != ZP_OFFLOAD_NONE)
        return; /* the host holds them (zp_offload_layout) */
    double master, m, v;
    zp_plan_optimizer_split(&s->plan, &master, &m, &v);
    const double own = (double)zp_impl_opt_elems(s, rank);
    const double most = (double)zp_impl_opt_elems(s, -1);
    bytes[ZP_MEM_MASTER] -= (most - own) * master;
    bytes[ZP_MEM_ADAM_M] -= (most - own) * m;
    bytes[ZP_MEM_ADAM_V] -= (most - own) * v;
}

/* torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py: whatever reshard_after_forward
 * says, FSDPParamGroup keeps only the sharded parameters at rest (FSDPParam._sharded_param_data,
 * the original dtype), all-gathers them in pre_forward (unshard) every micro-step, and in
 * post_forward reshards only if post_forward_mesh_info is set (reshard_after_forward=False
 * makes it None: _fsdp_init.py _get_post_forward_mesh_info), so the unsharded block lives to
 * its backward, where pre_backward's unshard finds it unsharded and gathers nothing;
 * post_backward then reduce-scatters into the sharded .grad and reshards. That is ZeRO-3's
 * states with longer-lived gathers, not ZeRO-2 (no 16-bit parameter state, no post-step
 * all-gather). */
void zp_impl_normalize_plan(ZpPlan *plan)
{
    if (plan->impl == ZP_IMPL_FSDP2 && plan->zero.stage == 2) {
        plan->zero.stage = 3;
        plan->zero.fsdp2_no_reshard_after_forward = TRUE;
    }
}

/* A bucket item: a unit, or a tensor of one (the flat layout is unit-major and tensor-ordered
 * inside a unit, so a tensor's range is its unit's offset plus the tensors before it). */
typedef struct {
    int unit;
    uint64_t lo, elems;
    double count; /* elements it counts for against the bucket's limit */
    double sent;  /* elements it adds to the bucket's reduction (stage 3: padded) */
    gboolean experts; /* a sparse unit's experts: lo is in the expert space */
} Item;

static gboolean same_module(const char *a, const char *b)
{
    const size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    return la == lb && strncmp(a, b, la) == 0;
}

unsigned zp_impl_unread_knobs(ZpImplKind kind, unsigned given)
{
    return given & ~zp_impl_get(kind)->zero_knobs & ZP_ZERO_KNOBS_ALL;
}

/* Unit-level persistence, for the implementations that decide it so (zp_impl.h). */
gboolean zp_sched_unit_persistent(const ZpSchedule *s, int unit)
{
    return s->plan.zero.stage == 3 && zp_impl_get(s->plan.impl)->unit_persistence &&
           (double)s->unit_elems[unit] <= s->plan.zero.stage3_param_persistence_threshold;
}

uint64_t zp_sched_unit_padded(const ZpSchedule *s, int unit)
{
    return zp_mem_padded_elems(s->unit_elems[unit], (uint64_t)s->plan.dp);
}

gboolean zp_impl_module_compute(const ZpSchedule *s)
{
    return s->plan.zero.stage == 3 && zp_impl_get(s->plan.impl)->module_compute &&
           !s->plan.block_compute;
}

gboolean zp_impl_grads_by_module(const ZpPlan *plan)
{
    const ZpImpl *impl = zp_impl_get(plan->impl);
    return impl->grads_by_module && impl->grads_by_module(plan);
}

gboolean zp_impl_module_backward(const ZpSchedule *s)
{
    const int stage = s->plan.zero.stage;
    return zp_impl_module_compute(s) ||
           (zp_impl_grads_by_module(&s->plan) && (stage == 1 || stage == 2) &&
            zp_plan_pp(&s->plan) == 1 && !s->plan.block_compute);
}

/* Whether the memo's tensors were listed for s's layout. */
static gboolean memo_fresh(const ZpSchedule *s)
{
    const ZpSchedMemo *memo = s->memo;
    const size_t n = (size_t)s->n_units;
    return memo->impl_tensors && memo->n_units == s->n_units &&
           memcmp(memo->layout, s->unit_offset, n * sizeof(uint64_t)) == 0 &&
           memcmp(memo->layout + n, s->unit_elems, n * sizeof(uint64_t)) == 0;
}

static GArray *list_tensors(const ZpSchedule *s);

/* A build asks for the list seven times or more (buckets, fetches, persistent parameters,
 * grads_in_partition, the head...), each walk of every tensor by name: kept with the
 * schedule (ZpSchedMemo) while its layout stays (a 32,000-layer model's build: 0.13 s). */
GArray *zp_impl_tensors(const ZpSchedule *s)
{
    if (!s->memo)
        return list_tensors(s);
    if (!memo_fresh(s)) {
        ZpSchedMemo *memo = s->memo;
        const size_t n = (size_t)s->n_units;
        if (memo->impl_tensors)
            g_array_unref(memo->impl_tensors);
        g_clear_pointer(&memo->part_offset, g_free); /* zp_impl_tensor_part_at's, of the old */
        g_clear_pointer(&memo->part_before, g_free);
        memo->impl_tensors = list_tensors(s);
        if (!memo->layout || memo->n_units != s->n_units) { /* a pipeline's next stage: as many */
            g_free(memo->layout);
            memo->layout = g_new(uint64_t, MAX(2 * n, 1));
        }
        memcpy(memo->layout, s->unit_offset, n * sizeof(uint64_t));
        memcpy(memo->layout + n, s->unit_elems, n * sizeof(uint64_t));
        memo->n_units = s->n_units;
    }
    return g_array_ref(s->memo->impl_tensors);
}

/* A tensor's share of a rank's partition: its elements padded to dp, over dp. */
static double tensor_part_elems(const ZpImplTensor *t, int dp)
{
    return (double)(zp_mem_padded_elems(t->elems, (uint64_t)dp) / (uint64_t)dp);
}

/* The memo's offsets and partition elements before each tensor, where the tensors lie in
 * ascending offsets (layout order: the builder's); FALSE otherwise (and nothing kept). */
static gboolean part_index(const ZpSchedule *s, const GArray *tensors)
{
    ZpSchedMemo *memo = s->memo;
    uint64_t *offset = g_new(uint64_t, tensors->len + 1);
    double *before = g_new(double, tensors->len + 1);
    before[0] = 0;
    for (guint i = 0; i < tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(tensors, ZpImplTensor, i);
        if (i > 0 && t->offset < offset[i - 1]) {
            g_free(offset);
            g_free(before);
            return FALSE;
        }
        offset[i] = t->offset;
        before[i + 1] = before[i] + tensor_part_elems(t, s->plan.dp); /* the scan's order */
    }
    memo->part_offset = offset;
    memo->part_before = before;
    return TRUE;
}

double zp_impl_tensor_part_at(const ZpSchedule *s, uint64_t lo)
{
    GArray *tensors = zp_impl_tensors(s);
    double at = 0;
    if (s->memo && (s->memo->part_before || part_index(s, tensors))) {
        /* the tensors below lo: those before the first at or past it */
        at = s->memo->part_before[zp_lower_bound_u64(s->memo->part_offset, tensors->len, lo)];
    } else {
        for (guint i = 0; i < tensors->len; i++) {
            const ZpImplTensor *t = &g_array_index(tensors, ZpImplTensor, i);
            if (t->offset < lo)
                at += tensor_part_elems(t, s->plan.dp);
        }
    }
    g_array_unref(tensors);
    return at;
}

/* What list_tensors reads of a tensor's name, worked out once for the model: whether it is
 * an expert's (the expert space's, zp_sched_experts), and whether it starts a module (its
 * name's first part differs from that of the tensor before it in its unit that is no expert's;
 * a module is a name's first part); and of its place: the end of the run of tensors of its
 * unit it is in, and how many tensors before it are no expert's, with which a unit another
 * pipeline stage holds is passed in one step (its tensors each count a module, list nothing). */
enum { TENSOR_EXPERT = 1, TENSOR_NEW_NAME = 2 };

struct ZpTensorNote {
    uint32_t run_end, dense_before;
    uint8_t flags;
};

static ZpTensorNote *tensor_notes(const GArray *tensors)
{
    const guint n = tensors->len;
    ZpTensorNote *notes = g_new(ZpTensorNote, (gsize)n + 1);
    int unit = -1;
    const char *module_name = "";
    uint32_t dense = 0;
    for (guint i = 0; i < n; i++) {
        const ZpTensor *t = &g_array_index(tensors, ZpTensor, i);
        notes[i].dense_before = dense;
        if (zp_model_tensor_is_expert(t)) {
            notes[i].flags = TENSOR_EXPERT;
            continue;
        }
        dense++;
        if (t->unit != unit)
            unit = t->unit, module_name = "";
        notes[i].flags = same_module(t->name, module_name) ? 0 : TENSOR_NEW_NAME;
        module_name = t->name; /* the same first part, when it was the same module */
    }
    notes[n].dense_before = dense;
    for (guint i = n; i-- > 0;) { /* from the last: each run's end, the one after its last */
        const gboolean last = i + 1 == n || g_array_index(tensors, ZpTensor, i + 1).unit !=
                                                g_array_index(tensors, ZpTensor, i).unit;
        notes[i].run_end = last ? i + 1 : notes[i + 1].run_end;
    }
    return notes;
}

/* The model's tensors and their notes: the memo's, kept for the build (a pipeline lists its
 * tensors once a stage: Megatron 1T's 64 stages named its 1,500 tensors 64 times, 7% of its
 * build), or the caller's own (*own TRUE: its to free). */
static GArray *model_tensors(const ZpSchedule *s, const ZpTensorNote **notes, gboolean *own)
{
    ZpSchedMemo *memo = s->memo;
    *own = memo == NULL;
    if (memo && memo->model_tensors) {
        *notes = memo->tensor_notes;
        return memo->model_tensors;
    }
    GArray *tensors = zp_model_tensors(&s->model);
    ZpTensorNote *made = tensor_notes(tensors);
    *notes = made;
    if (memo)
        memo->model_tensors = tensors, memo->tensor_notes = made;
    return tensors;
}

static GArray *list_tensors(const ZpSchedule *s)
{
    const ZpTensorNote *notes;
    gboolean own;
    GArray *tensors = model_tensors(s, &notes, &own);
    GArray *out = g_array_new(FALSE, FALSE, sizeof(ZpImplTensor));
    /* at most one entry a tensor and one a unit (zp_array_extend's room: 0 when unreserved) */
    guint room = zp_array_reserve_huge(out, tensors->len + (guint64)s->n_units);
    int unit = -1, module = -1;
    uint64_t inside = 0;
    for (guint i = 0; i <= tensors->len; i++) {
        const ZpTensor *t = i < tensors->len ? &g_array_index(tensors, ZpTensor, i) : NULL;
        if (unit >= 0 && (!t || t->unit != unit) && inside < s->unit_elems[unit]) {
            /* What a unit holds beyond its tensors: a pipeline's last stage's own copy of the
             * tied word embedding, a module of its own. */
            ZpImplTensor rest = {unit, ++module, s->unit_offset[unit] + inside,
                                 s->unit_elems[unit] - inside, TRUE};
            *(ZpImplTensor *)zp_array_extend(out, 1, sizeof rest, &room) = rest;
        }
        if (!t)
            break;
        if (notes[i].flags & TENSOR_EXPERT) /* the expert space's (zp_sched_experts) */
            continue;
        if (t->unit != unit)
            unit = t->unit, inside = 0;
        if ((notes[i].flags & TENSOR_NEW_NAME) || inside == 0)
            module++;
        /* Nothing of it in the unit's range (another pipeline stage's unit, whose range is
         * empty): what the clip below would find, without the name lookup (64 stages of
         * Megatron 1T each walked the whole model's tensors by name). */
        if (inside >= s->unit_elems[unit]) {
            if (s->unit_elems[unit] == 0) {
                /* the run's other tensors alike (inside stays 0): each no expert's counts a
                 * module, none is listed; and so the runs after it of units as empty (a
                 * pipeline stage holds few of the model's units: Megatron 1T's stages
                 * walked 128 runs each, 50 instructions a run); the walk goes on past them,
                 * its unit the last of them (an empty one: nothing left of it to list) */
                uint32_t end = notes[i].run_end;
                while (end < tensors->len &&
                       s->unit_elems[g_array_index(tensors, ZpTensor, end).unit] == 0)
                    end = notes[end].run_end;
                module += (int)(notes[end].dense_before - notes[i + 1].dense_before);
                unit = g_array_index(tensors, ZpTensor, end - 1).unit;
                i = end - 1;
            }
            continue;
        }
        /* A tensor's share of a tensor-parallel rank; clipped to its unit's range. */
        uint64_t elems = zp_model_tensor_tp_elems(&s->model, t, s->plan.mp);
        if (inside + elems > s->unit_elems[unit])
            elems = s->unit_elems[unit] - inside;
        if (elems == 0)
            continue;
        ZpImplTensor it = {unit, module, s->unit_offset[unit] + inside, elems, t->matrix};
        inside += elems;
        *(ZpImplTensor *)zp_array_extend(out, 1, sizeof it, &room) = it;
    }
    if (own) {
        g_array_unref(tensors);
        g_free((ZpTensorNote *)notes);
    }
    return out;
}

void zp_impl_params_in_partition(const ZpSchedule *s, int rank, uint64_t *lo, uint64_t *hi)
{
    const uint64_t part_lo = (uint64_t)rank * s->partition_elems;
    const uint64_t part_hi = part_lo + s->partition_elems;
    GArray *tensors = zp_impl_tensors(s);
    *lo = part_lo, *hi = part_hi;
    for (guint i = 0; i < tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(tensors, ZpImplTensor, i);
        if (t->offset < part_hi && t->offset + t->elems > part_lo) {
            *lo = MIN(*lo, t->offset);
            *hi = MAX(*hi, t->offset + t->elems);
        }
    }
    g_array_unref(tensors);
}

uint64_t zp_impl_unit_expert_elems(const ZpSchedule *s, int unit)
{
    if (!zp_moe_enabled(&s->model.moe) || !zp_model_unit_sparse(&s->model, unit) ||
        !s->unit_elems || s->unit_elems[unit] == 0)
        return 0; /* a dense unit, or another pipeline stage's */
    return (uint64_t)(s->model.moe.experts / zp_plan_ep(&s->plan)) *
           zp_model_expert_tp_elems(&s->model, zp_plan_etp(&s->plan));
}

gboolean zp_impl_experts_in_buckets(const ZpSchedule *s)
{
    const ZpImpl *impl = zp_impl_get(s->plan.impl);
    return zp_moe_enabled(&s->model.moe) && impl->experts_in_buckets &&
           impl->experts_in_buckets(s);
}

/* Each sparse unit's experts as one item after the unit's last tensor (so before its dense
 * tensors in backward order: the experts' backward runs first), the expert space's offsets. */
static GArray *with_expert_items(const ZpSchedule *s, GArray *items)
{
    GArray *out = g_array_sized_new(FALSE, FALSE, sizeof(Item), items->len + (guint)s->n_units);
    uint64_t expert_lo = 0;
    for (guint i = 0; i < items->len; i++) {
        const Item *it = &g_array_index(items, Item, i);
        g_array_append_val(out, *it);
        const gboolean last = i + 1 == items->len ||
                              g_array_index(items, Item, i + 1).unit != it->unit;
        const uint64_t n = last ? zp_impl_unit_expert_elems(s, it->unit) : 0;
        if (n > 0) {
            const Item x = {it->unit, expert_lo, n, (double)n, (double)n, TRUE};
            g_array_append_val(out, x);
            expert_lo += n;
        }
    }
    g_array_unref(items);
    return out;
}

static GArray *bucket_items(const ZpSchedule *s, gboolean by_tensor)
{
    GArray *tensors = by_tensor ? zp_impl_tensors(s) : NULL;
    GArray *items = g_array_new(FALSE, FALSE, sizeof(Item));
    /* one each (zp_array_extend's room: a GLib append each checked it by a division) */
    guint room = zp_array_reserve_huge(items, by_tensor ? tensors->len : (guint)s->n_units);
    const gboolean padded = s->plan.zero.stage == 3;
    if (!by_tensor) {
        for (int u = 0; u < s->n_units; u++) {
            if (s->unit_elems[u] == 0) /* another pipeline stage's unit */
                continue;
            const double sent =
                (double)(padded ? zp_sched_unit_padded(s, u) : s->unit_elems[u]);
            const Item it = {u, s->unit_offset[u], s->unit_elems[u], sent, sent, FALSE};
            *(Item *)zp_array_extend(items, 1, sizeof it, &room) = it;
        }
        return items;
    }
    for (guint i = 0; i < tensors->len; i++) {
        const ZpImplTensor *t = &g_array_index(tensors, ZpImplTensor, i);
        /* DeepSpeed's hooks count a parameter's numel (stage3.py
         * reduce_independent_p_g_buckets_and_remove_grads: bucket.elements + param.ds_numel >
         * reduce_bucket_size; stage_1_and_2.py's: param.numel()); stage 3's
         * reduce_scatter_coalesced pads each to the group */
        const Item it = {t->unit, t->offset, t->elems, (double)t->elems,
                         (double)(padded ? zp_mem_padded_elems(t->elems, (uint64_t)s->plan.dp)
                                         : t->elems),
                         FALSE};
        *(Item *)zp_array_extend(items, 1, sizeof it, &room) = it;
    }
    g_array_unref(tensors);
    return items;
}

/* Item it into bucket k (its experts x): a dense one lowers the dense range's start (items come
 * from the last down), an expert one the expert range's. */
static void bucket_add(const ZpSchedule *s, ZpBucketSpec *k, ZpBucketExperts *x, const Item *it)
{
    if (it->experts) {
        x->lo = it->lo;
        x->elems += it->elems;
        x->on_top |= k->n_items == 0;
        /* a bucket whose experts come first has an empty dense range until the unit's
         * tensors: it starts at the unit's end */
        if (k->n_items == 0)
            k->lo = k->hi = s->unit_offset[it->unit] + s->unit_elems[it->unit];
    } else {
        k->lo = it->lo;
        if (k->n_items == 0)
            k->hi = it->lo + it->elems;
    }
    k->n_items++;
    k->low_unit = k->launch_unit = it->unit;
}

static void group_items(const ZpSchedule *s, GArray *items, double limit, gboolean bypass_large,
                        GArray *buckets, GArray *experts)
{
    const Item *it = (const Item *)items->data;
    const double bytes = zp_plan_reduce_bytes(&s->plan);
    /* Room made once for the buckets of most plans (Megatron 1T's stages hold 6; at most one
     * an item), past it doubled as GLib does (zp_array_extend): GLib's appends grew each
     * pipeline stage's array from empty, 400 instructions a bucket. */
    guint room = buckets->len + MIN(items->len, 64u);
    g_array_set_size(buckets, room);
    g_array_set_size(buckets, room - MIN(items->len, 64u));
    for (int i = (int)items->len - 1; i >= 0;) {
        ZpBucketSpec k = {0, 0, 0, it[i].unit, it[i].unit, it[i].unit, -1, FALSE, 0, 0, FALSE};
        ZpBucketExperts x = {0, 0, FALSE};
        double elems = it[i].count, sent = it[i].sent;
        k.bypass = !it[i].experts && bypass_large && elems > limit;
        bucket_add(s, &k, &x, &it[i]);
        for (i--; !k.bypass && i >= 0; i--) {
            if (elems + it[i].count > limit)
                break;
            elems += it[i].count;
            sent += it[i].sent;
            bucket_add(s, &k, &x, &it[i]);
        }
        k.bytes = sent * bytes;
        *(ZpBucketSpec *)zp_array_extend(buckets, 1, sizeof k, &room) = k;
        if (experts)
            g_array_append_val(experts, x);
    }
    g_array_unref(items);
}

void zp_impl_group_buckets(const ZpSchedule *s, gboolean by_tensor, double limit,
                           gboolean bypass_large, GArray *buckets)
{
    group_items(s, bucket_items(s, by_tensor), limit, bypass_large, buckets, NULL);
}

void zp_impl_group_buckets_with_experts(const ZpSchedule *s, double limit, gboolean bypass_large,
                                        GArray *buckets, GArray *experts)
{
    group_items(s, with_expert_items(s, bucket_items(s, TRUE)), limit, bypass_large, buckets,
                experts);
}

GArray *zp_impl_bucket_experts(const ZpSchedule *s)
{
    if (!zp_impl_experts_in_buckets(s))
        return NULL;
    GArray *experts = g_array_new(FALSE, FALSE, sizeof(ZpBucketExperts));
    zp_impl_get(s->plan.impl)->bucket_experts(s, experts);
    return experts;
}

void zp_impl_prefetch_window(const ZpSchedule *s, GArray *fetches)
{
    const double prefetch = s->plan.zero.stage3_prefetch_bucket_size;
    const double live = s->plan.zero.stage3_max_live_parameters;
    ZpFetch *g = (ZpFetch *)fetches->data;
    const guint n = fetches->len;
    /* sum[k]: elements of fetches 0..k-1 (whole numbers below 2^53: exact in a double). */
    double *sum = g_new(double, n + 1);
    sum[0] = 0;
    for (guint k = 0; k < n; k++)
        sum[k + 1] = sum[k] + (double)g[k].elems;
    /* Fetch k may be prefetched while fetch i < k is in use when, for every j in i+1..k,
     * fetches j..k fit the prefetch bucket and j-1..k the live limit. That holds for a run
     * of j ending at k, whose start only moves forward as k grows: two pointers, O(n). */
    guint j = 1;
    for (guint k = 0; k < n; k++) {
        while (j <= k && !(sum[k + 1] - sum[j] <= prefetch && sum[k + 1] - sum[j - 1] <= live))
            j++;
        const guint i = j - 1 < k ? j - 1 : k;
        /* Issued when fetch i's use starts, and never before the previous fetch. */
        g[k].trigger_pos = MAX(g[i].use_pos, k > 0 ? g[k - 1].trigger_pos : 0);
    }
    g_free(sum);
}

void zp_impl_persistent_units(const ZpSchedule *s, GArray *ranges)
{
    for (int u = 0; u < s->n_units; u++)
        if ((double)s->unit_elems[u] <= s->plan.zero.stage3_param_persistence_threshold) {
            ZpFetch f = {u, s->unit_offset[u], zp_sched_unit_padded(s, u), -1, -1, -1, FALSE,
                         s->unit_elems[u], 0, 0, 0};
            g_array_append_val(ranges, f);
        }
}

double zp_impl_partition_grad_elems(const ZpSchedule *s)
{
    const int stage = s->plan.zero.stage;
    /* Stage 1 keeps full gradients in a buffer padded like the parameters, so that each
     * rank's reduce-scatter output lands in place at its partition. */
    return stage == 0 ? (double)s->total_elems
           : stage == 1 ? (double)s->padded_elems
                        : (double)s->partition_elems;
}

void zp_impl_no_step_buffers(const ZpSchedule *s, GArray *buffers)
{
    (void)s, (void)buffers;
}

ZpCollKind zp_impl_expert_grad_collective(const ZpPlan *plan)
{
    const ZpImpl *impl = zp_impl_get(plan->impl);
    return impl->expert_grad_collective ? impl->expert_grad_collective(plan)
                                        : impl->grad_collective(plan);
}
