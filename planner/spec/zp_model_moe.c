/* zp_model_moe: counts a mixture of experts' MLP and multi-head latent attention exactly, from
 * the shapes of transformers' modeling_mixtral, modeling_qwen2_moe and modeling_deepseek_v3. */
#include "zp_model_moe.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

gboolean zp_moe_enabled(const ZpMoe *moe)
{
    return moe->experts > 0;
}

gboolean zp_moe_layer_sparse(const ZpMoe *moe, int64_t layer)
{
    if (!zp_moe_enabled(moe) || layer < moe->first_dense)
        return FALSE;
    const int64_t step = MAX(moe->step, 1);
    if ((layer + moe->step_phase) % step != 0)
        return FALSE;
    for (int i = 0; i < moe->n_dense_listed; i++)
        if (moe->dense_listed[i] == layer)
            return FALSE;
    return TRUE;
}

int64_t zp_moe_sparse_layers(const ZpMoe *moe, int64_t layers)
{
    int64_t n = 0;
    if (zp_moe_enabled(moe))
        for (int64_t l = 0; l < layers; l++)
            n += zp_moe_layer_sparse(moe, l);
    return n;
}

uint64_t zp_moe_expert_elems(const ZpMoe *moe, int64_t hidden, gboolean gated)
{
    return (gated ? 3u : 2u) * (uint64_t)hidden * (uint64_t)moe->expert_ffn;
}

/* The router and its bias (whole on every rank), and the shared experts with their gate. */
static uint64_t router_elems(const ZpMoe *moe, int64_t hidden)
{
    const uint64_t E = (uint64_t)moe->experts;
    return E * (uint64_t)hidden + (moe->router_bias ? E : 0) +
           (moe->shared_gate ? (uint64_t)hidden : 0);
}

static uint64_t shared_elems(const ZpMoe *moe, int64_t hidden, gboolean gated)
{
    return (gated ? 3u : 2u) * (uint64_t)hidden * (uint64_t)moe->shared_ffn;
}

uint64_t zp_moe_dense_part_elems(const ZpMoe *moe, int64_t hidden, gboolean gated)
{
    return router_elems(moe, hidden) + shared_elems(moe, hidden, gated);
}

void zp_moe_mlp_parts(const ZpMoe *moe, int64_t hidden, gboolean gated, int64_t experts,
                      uint64_t *whole, uint64_t *split)
{
    *whole = router_elems(moe, hidden);
    *split = shared_elems(moe, hidden, gated) +
             (uint64_t)experts * zp_moe_expert_elems(moe, hidden, gated);
}

gboolean zp_mla_enabled(const ZpMla *mla)
{
    return mla->kv_lora_rank > 0;
}

int64_t zp_mla_q_width(const ZpMla *mla, int64_t heads)
{
    return heads * (mla->qk_nope_dim + mla->qk_rope_dim);
}

int64_t zp_mla_kv_width(const ZpMla *mla, int64_t heads)
{
    return heads * (mla->qk_nope_dim + mla->v_dim);
}

void zp_mla_parts(const ZpMla *mla, int64_t hidden, int64_t heads, uint64_t *whole,
                      uint64_t *split)
{
    const uint64_t h = (uint64_t)hidden, rq = (uint64_t)mla->q_lora_rank;
    const uint64_t rkv = (uint64_t)mla->kv_lora_rank, dr = (uint64_t)mla->qk_rope_dim;
    const uint64_t q = (uint64_t)zp_mla_q_width(mla, heads);
    const uint64_t kv = (uint64_t)zp_mla_kv_width(mla, heads);
    const uint64_t out = (uint64_t)heads * (uint64_t)mla->v_dim * h;
    *whole = h * (rkv + dr) + rkv + (rq ? h * rq + rq : 0);
    *split = (rq ? rq * q : h * q) + rkv * kv + out;
}

#define MAX_DIM 16000000
#define MAX_ELEMS 1e15

gboolean zp_moe_check(const ZpMoe *moe, const ZpMla *mla, int64_t hidden, int64_t heads,
                      int64_t layers, const char *what, GError **error)
{
    const double L = (double)layers, h = (double)hidden;
    const double experts = (double)(moe->experts + moe->top_k) * 3.0 * h *
                           (double)moe->expert_ffn + 3.0 * h * (double)moe->shared_ffn;
    const double q = (double)heads * (double)(mla->qk_nope_dim + mla->qk_rope_dim + mla->v_dim);
    const double latent = (h + q) * (double)(mla->q_lora_rank + mla->kv_lora_rank + 1) + h * q;
    if (zp_moe_enabled(moe) && moe->top_k > moe->experts) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: top_k %" G_GINT64_FORMAT " is more than the %" G_GINT64_FORMAT
                    " experts", what, moe->top_k, moe->experts);
        return FALSE;
    }
    if (experts * L > MAX_ELEMS || (zp_mla_enabled(mla) && latent * L > MAX_ELEMS)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: the %s would hold more than %.0e elements", what,
                    experts * L > MAX_ELEMS ? "experts" : "latent attention", MAX_ELEMS);
        return FALSE;
    }
    return TRUE;
}

static gboolean get_dense_listed(json_t *obj, const char *what, ZpMoe *moe, GError **error)
{
    json_t *list = json_object_get(obj, "dense_layers");
    if (!list || json_is_null(list))
        return TRUE;
    if (!json_is_array(list) || json_array_size(list) > ZP_MOE_MAX_DENSE_LISTED) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"dense_layers\" must be an array of at most %d layer indices", what,
                    ZP_MOE_MAX_DENSE_LISTED);
        return FALSE;
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *v = json_array_get(list, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                        "%s: key \"dense_layers\" must hold layer indices (0 or more)", what);
            return FALSE;
        }
        moe->dense_listed[moe->n_dense_listed++] = (int64_t)json_integer_value(v);
    }
    return TRUE;
}

gboolean zp_moe_from_json(void *json_object, const char *what, ZpMoe *moe, ZpMla *mla,
                          GError **error)
{
    static const char *const moe_keys[] = {
        "experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn", "shared_gate",
        "router_bias", "first_dense", "step", "step_phase", "dense_layers", NULL};
    static const char *const mla_keys[] = {"q_lora_rank", "kv_lora_rank", "qk_nope_dim",
                                           "qk_rope_dim", "v_dim", NULL};
    json_t *m = json_object_get(json_object, "moe"), *a = json_object_get(json_object, "mla");
    memset(moe, 0, sizeof *moe);
    memset(mla, 0, sizeof *mla);
    gboolean ok = TRUE;
    char *inner = g_strdup_printf("%s: moe", what);
    if (m && !json_is_null(m)) {
        ok = zp_json_check_keys(m, inner, moe_keys, error) &&
             zp_json_get_int(m, inner, "experts", TRUE, 1, 1000000, &moe->experts, error) &&
             zp_json_get_int(m, inner, "top_k", TRUE, 1, moe->experts, &moe->top_k, error) &&
             zp_json_get_int(m, inner, "expert_ffn", TRUE, 1, MAX_DIM, &moe->expert_ffn, error) &&
             zp_json_get_int(m, inner, "shared_experts", FALSE, 0, 1000000, &moe->shared_experts,
                             error) &&
             zp_json_get_int(m, inner, "shared_ffn", FALSE, 0, MAX_DIM, &moe->shared_ffn, error) &&
             zp_json_get_bool(m, inner, "shared_gate", FALSE, &moe->shared_gate, error) &&
             zp_json_get_bool(m, inner, "router_bias", FALSE, &moe->router_bias, error) &&
             zp_json_get_int(m, inner, "first_dense", FALSE, 0, 100000, &moe->first_dense,
                             error) &&
             zp_json_get_int(m, inner, "step", FALSE, 1, 100000, &moe->step, error) &&
             zp_json_get_int(m, inner, "step_phase", FALSE, 0, 100000, &moe->step_phase, error) &&
             get_dense_listed(m, inner, moe, error);
    }
    g_free(inner);
    inner = g_strdup_printf("%s: mla", what);
    if (ok && a && !json_is_null(a)) {
        ok = zp_json_check_keys(a, inner, mla_keys, error) &&
             zp_json_get_int(a, inner, "q_lora_rank", FALSE, 0, MAX_DIM, &mla->q_lora_rank,
                             error) &&
             zp_json_get_int(a, inner, "kv_lora_rank", TRUE, 1, MAX_DIM, &mla->kv_lora_rank,
                             error) &&
             zp_json_get_int(a, inner, "qk_nope_dim", TRUE, 1, MAX_DIM, &mla->qk_nope_dim,
                             error) &&
             zp_json_get_int(a, inner, "qk_rope_dim", TRUE, 1, MAX_DIM, &mla->qk_rope_dim,
                             error) &&
             zp_json_get_int(a, inner, "v_dim", TRUE, 1, MAX_DIM, &mla->v_dim, error);
    }
    g_free(inner);
    return ok;
}

void zp_moe_to_json(const ZpMoe *moe, const ZpMla *mla, void *json_object)
{
    if (zp_moe_enabled(moe)) {
        json_t *list = json_array();
        for (int i = 0; i < moe->n_dense_listed; i++)
            json_array_append_new(list, json_integer((json_int_t)moe->dense_listed[i]));
        json_object_set_new(
            json_object, "moe",
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:I, s:I, s:I, s:o}", "experts",
                      (json_int_t)moe->experts, "top_k", (json_int_t)moe->top_k, "expert_ffn",
                      (json_int_t)moe->expert_ffn, "shared_experts",
                      (json_int_t)moe->shared_experts, "shared_ffn", (json_int_t)moe->shared_ffn,
                      "shared_gate", moe->shared_gate, "router_bias", moe->router_bias,
                      "first_dense", (json_int_t)moe->first_dense, "step",
                      (json_int_t)MAX(moe->step, 1), "step_phase", (json_int_t)moe->step_phase,
                      "dense_layers", list));
    }
    if (zp_mla_enabled(mla))
        json_object_set_new(json_object, "mla",
                            json_pack("{s:I, s:I, s:I, s:I, s:I}", "q_lora_rank",
                                      (json_int_t)mla->q_lora_rank, "kv_lora_rank",
                                      (json_int_t)mla->kv_lora_rank, "qk_nope_dim",
                                      (json_int_t)mla->qk_nope_dim, "qk_rope_dim",
                                      (json_int_t)mla->qk_rope_dim, "v_dim",
                                      (json_int_t)mla->v_dim));
}
