/* zp_model: reads model specs and counts their parameters exactly from the architecture.
 * Sizes are uint64_t: a 1T-parameter model's block holds ~8e9 elements, beyond int32. */
#include "zp_model.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

static const char *const model_keys[] = {
    "name", "layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "tied_embeddings",
    "learned_positions", "dropout", "published_params", "notes", NULL};

/* Bounds that reject absurd specs while admitting anything trained to date with margin. */
#define MAX_LAYERS 100000
#define MAX_HIDDEN 1000000
#define MAX_SEQ 10000000
#define MAX_VOCAB 100000000

gboolean zp_model_from_json(void *json_object, const char *what, ZpModel *model, GError **error)
{
    json_t *obj = json_object;
    memset(model, 0, sizeof *model);
    model->tied_embeddings = TRUE;
    model->learned_positions = TRUE;
    model->dropout = TRUE;
    const char *name = NULL;
    int64_t ffn = 0;
    if (!zp_json_check_keys(obj, what, model_keys, error) ||
        !zp_json_get_string(obj, what, "name", TRUE, &name, error) ||
        !zp_json_get_int(obj, what, "layers", TRUE, 1, MAX_LAYERS, &model->layers, error) ||
        !zp_json_get_int(obj, what, "hidden", TRUE, 1, MAX_HIDDEN, &model->hidden, error) ||
        !zp_json_get_int(obj, what, "heads", TRUE, 1, MAX_HIDDEN, &model->heads, error) ||
        !zp_json_get_int(obj, what, "seq_len", TRUE, 1, MAX_SEQ, &model->seq_len, error) ||
        !zp_json_get_int(obj, what, "vocab", TRUE, 1, MAX_VOCAB, &model->vocab, error) ||
        !zp_json_get_int(obj, what, "ffn_hidden", FALSE, 1, 16 * MAX_HIDDEN, &ffn, error) ||
        !zp_json_get_bool(obj, what, "tied_embeddings", FALSE, &model->tied_embeddings, error) ||
        !zp_json_get_bool(obj, what, "learned_positions", FALSE, &model->learned_positions,
                          error) ||
        !zp_json_get_bool(obj, what, "dropout", FALSE, &model->dropout, error) ||
        !zp_json_get_number(obj, what, "published_params", FALSE, 1, 1e15,
                            &model->published_params, error))
        return FALSE;
    if (strlen(name) == 0 || strlen(name) >= sizeof model->name) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"name\" must be 1 to %zu characters", what,
                    sizeof model->name - 1);
        return FALSE;
    }
    if (model->hidden % model->heads != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"heads\" = %" G_GINT64_FORMAT " does not divide hidden = %"
                    G_GINT64_FORMAT,
                    what, model->heads, model->hidden);
        return FALSE;
    }
    g_strlcpy(model->name, name, sizeof model->name);
    model->ffn_hidden = ffn ? ffn : 4 * model->hidden;
    return TRUE;
}

gboolean zp_model_load(const char *name_or_path, ZpModel *model, GError **error)
{
    char *path = zp_resolve_spec(name_or_path, "models", "--model", "model", error);
    json_t *root = path ? zp_json_load_object(path, error) : NULL;
    gboolean ok = root && zp_model_from_json(root, path, model, error);
    json_decref(root);
    g_free(path);
    return ok;
}

void zp_model_from_params(double params, ZpModel *model)
{
    memset(model, 0, sizeof *model);
    g_snprintf(model->name, sizeof model->name, "%.4g params", params);
    model->params_only = params;
    model->published_params = params;
}

gboolean zp_model_has_architecture(const ZpModel *model)
{
    return model->params_only <= 0;
}

int zp_model_n_units(const ZpModel *model)
{
    return zp_model_has_architecture(model) ? (int)model->layers + 2 : 0;
}

/* The per-unit tensor table: one row per tensor, sizes as products of the dimensions. */
GArray *zp_model_tensors(const ZpModel *model)
{
    GArray *t = g_array_new(FALSE, FALSE, sizeof(ZpTensor));
    if (!zp_model_has_architecture(model))
        return t;
    const uint64_t h = (uint64_t)model->hidden, f = (uint64_t)model->ffn_hidden;
    const uint64_t V = (uint64_t)model->vocab, s = (uint64_t)model->seq_len;
    const int L = (int)model->layers;
    ZpTensor wte = {"wte", 0, V * h}, wpe = {"wpe", 0, s * h};
    g_array_append_val(t, wte);
    if (model->learned_positions)
        g_array_append_val(t, wpe);
    for (int l = 1; l <= L; l++) {
        const ZpTensor block[] = {
            {"ln1.weight", l, h},      {"ln1.bias", l, h},  {"qkv.weight", l, 3 * h * h},
            {"qkv.bias", l, 3 * h},    {"proj.weight", l, h * h}, {"proj.bias", l, h},
            {"ln2.weight", l, h},      {"ln2.bias", l, h},  {"fc1.weight", l, h * f},
            {"fc1.bias", l, f},        {"fc2.weight", l, f * h},  {"fc2.bias", l, h},
        };
        g_array_append_vals(t, block, G_N_ELEMENTS(block));
    }
    const ZpTensor lnf_w = {"lnf.weight", L + 1, h}, lnf_b = {"lnf.bias", L + 1, h};
    const ZpTensor head = {"lm_head.weight", L + 1, V * h};
    g_array_append_val(t, lnf_w);
    g_array_append_val(t, lnf_b);
    if (!model->tied_embeddings)
        g_array_append_val(t, head);
    return t;
}

/* Closed form of the tensor table's per-unit sums (tests check the two agree); the
 * planner's search calls this in its inner loop, so it must not build the table. */
uint64_t zp_model_unit_elems(const ZpModel *model, int unit)
{
    const uint64_t h = (uint64_t)model->hidden, f = (uint64_t)model->ffn_hidden;
    const uint64_t V = (uint64_t)model->vocab, s = (uint64_t)model->seq_len;
    if (!zp_model_has_architecture(model) || unit < 0 || unit > model->layers + 1)
        return 0;
    if (unit == 0)
        return V * h + (model->learned_positions ? s * h : 0);
    if (unit <= model->layers)
        return 4 * h * h + 2 * h * f + 9 * h + f;
    return 2 * h + (model->tied_embeddings ? 0 : V * h);
}

uint64_t zp_model_param_count(const ZpModel *model)
{
    if (!zp_model_has_architecture(model))
        return (uint64_t)model->params_only;
    /* The L blocks are identical, so the count is O(1) (zp_mem_residual, which the planner's
     * search calls in its inner loop, needs it). */
    const uint64_t L = (uint64_t)model->layers;
    return zp_model_unit_elems(model, 0) + L * zp_model_unit_elems(model, 1) +
           zp_model_unit_elems(model, (int)L + 1);
}

void *zp_model_to_json(const ZpModel *model)
{
    if (!zp_model_has_architecture(model))
        return NULL;
    json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:b}", "name",
                          model->name, "layers", (json_int_t)model->layers, "hidden",
                          (json_int_t)model->hidden, "heads", (json_int_t)model->heads,
                          "seq_len", (json_int_t)model->seq_len, "vocab",
                          (json_int_t)model->vocab, "ffn_hidden", (json_int_t)model->ffn_hidden,
                          "tied_embeddings", model->tied_embeddings, "learned_positions",
                          model->learned_positions, "dropout", model->dropout);
    if (model->published_params > 0)
        json_object_set_new(o, "published_params", json_real(model->published_params));
    return o;
}
