/* zp_model_arch: reads zplan's model specs and counts their parameters exactly from the
 * architecture.
 * Sizes are uint64_t: a 1T-parameter model's block holds ~8e9 elements, beyond int32. */
#include "zp_model_arch.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

static const char *const model_keys[] = {
    "name", "layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "tied_embeddings",
    "learned_positions", "dropout", "published_params", "notes", "kv_heads", "max_positions",
    "mlp", "norm", "qkv_bias", "proj_bias", "mlp_bias", "parallel_residual", "rope_theta",
    "rotary_fraction", "norm_eps", "exact_gelu", "rope_scaling", "sliding_window", "moe", "mla",
    "head_dim", "qk_norm", NULL};

static const char *const mlp_names[] = {"gelu", "swiglu", "geglu", NULL};
static const char *const norm_names[] = {"layernorm", "rmsnorm", NULL};

const char *zp_model_mlp_name(ZpMlp mlp)
{
    return mlp_names[mlp];
}

const char *zp_model_norm_name(ZpNorm norm)
{
    return norm_names[norm];
}

static const char *const module_names[ZP_MOD_N] = {"ln1", "qkv", "proj", "ln2", "fc1", "fc2"};

const char *zp_model_module_name(ZpBlockModule module)
{
    return module_names[module];
}

int zp_model_module_parse(const char *name)
{
    for (int m = 0; m < ZP_MOD_N; m++)
        if (strcmp(name, module_names[m]) == 0)
            return m;
    return -1;
}

/* An optional string key that must be one of `names`; *out keeps its value when absent. */
static gboolean get_choice(json_t *obj, const char *what, const char *key,
                           const char *const *names, int *out, GError **error)
{
    const char *text = NULL;
    if (!zp_json_get_string(obj, what, key, FALSE, &text, error))
        return FALSE;
    if (!text)
        return TRUE;
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], text) == 0) {
            *out = i;
            return TRUE;
        }
    char *choices = g_strjoinv(", ", (char **)names);
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" = \"%s\" is not one of %s",
                what, key, text, choices);
    g_free(choices);
    return FALSE;
}

/* The optional bias keys (true when absent) into model->no_bias. */
static gboolean get_biases(json_t *obj, const char *what, ZpModel *model, GError **error)
{
    static const struct {
        const char *key;
        unsigned flag;
    } keys[] = {{"qkv_bias", ZP_NO_BIAS_QKV}, {"proj_bias", ZP_NO_BIAS_PROJ},
                {"mlp_bias", ZP_NO_BIAS_MLP}};
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++) {
        gboolean present = TRUE;
        if (!zp_json_get_bool(obj, what, keys[i].key, FALSE, &present, error))
            return FALSE;
        if (!present)
            model->no_bias |= keys[i].flag;
    }
    return TRUE;
}

/* Bounds that reject absurd specs while admitting anything trained to date with margin. */
#define MAX_LAYERS 100000
#define MAX_HIDDEN 1000000
#define MAX_SEQ 10000000
#define MAX_VOCAB 100000000

gboolean zp_model_get_rope_scaling(void *json_object, const char *what, ZpModel *model,
                                   GError **error)
{
    static const struct {
        const char *name;
        ZpRopeScalingType type;
    } types[] = {{"default", ZP_ROPE_SCALING_NONE},
                 {"linear", ZP_ROPE_SCALING_LINEAR},
                 {"llama3", ZP_ROPE_SCALING_LLAMA3}};
    json_t *obj = json_object_get(json_object, "rope_scaling");
    ZpRopeScaling *r = &model->rope_scaling;
    memset(r, 0, sizeof *r);
    if (!obj || json_is_null(obj))
        return TRUE;
    if (!json_is_object(obj)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"rope_scaling\" must be an object or null", what);
        return FALSE;
    }
    char *inner = g_strdup_printf("%s: rope_scaling", what);
    const char *name = NULL;
    const char *type_key = json_object_get(obj, "rope_type") ? "rope_type" : "type";
    gboolean ok = zp_json_get_string(obj, inner, type_key, TRUE, &name, error);
    if (ok) {
        g_strlcpy(r->name, name, sizeof r->name);
        r->type = ZP_ROPE_SCALING_OTHER;
        for (size_t i = 0; i < G_N_ELEMENTS(types); i++)
            if (strcmp(name, types[i].name) == 0)
                r->type = types[i].type;
    }
    /* The keys of the two types zreal implements; other types' keys are not read. */
    const gboolean llama3 = r->type == ZP_ROPE_SCALING_LLAMA3;
    ok = ok && (r->type == ZP_ROPE_SCALING_OTHER || r->type == ZP_ROPE_SCALING_NONE ||
                (zp_json_get_number(obj, inner, "factor", TRUE, 1e-3, 1e6, &r->factor, error) &&
                 zp_json_get_number(obj, inner, "low_freq_factor", llama3, 1e-6, 1e6,
                                    &r->low_freq_factor, error) &&
                 zp_json_get_number(obj, inner, "high_freq_factor", llama3, 1e-6, 1e6,
                                    &r->high_freq_factor, error) &&
                 zp_json_get_int(obj, inner, "original_max_position_embeddings", llama3, 1,
                                 MAX_SEQ, &r->original_max_positions, error)));
    if (ok && llama3 && r->low_freq_factor >= r->high_freq_factor) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"low_freq_factor\" = %g must be below high_freq_factor = %g", inner,
                    r->low_freq_factor, r->high_freq_factor);
        ok = FALSE;
    }
    g_free(inner);
    return ok;
}

gboolean zp_model_from_json(void *json_object, const char *what, ZpModel *model, GError **error)
{
    json_t *obj = json_object;
    memset(model, 0, sizeof *model);
    model->tied_embeddings = TRUE;
    model->learned_positions = TRUE;
    model->dropout = TRUE;
    const char *name = NULL;
    int64_t ffn = 0;
    int mlp = ZP_MLP_GELU, norm = ZP_NORM_LAYERNORM;
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
                            &model->published_params, error) ||
        !zp_json_get_int(obj, what, "kv_heads", FALSE, 1, MAX_HIDDEN, &model->kv_heads, error) ||
        !zp_json_get_int(obj, what, "max_positions", FALSE, 1, MAX_SEQ, &model->max_positions,
                         error) ||
        !zp_json_get_int(obj, what, "head_dim", FALSE, 1, MAX_HIDDEN, &model->head_dim, error) ||
        !zp_json_get_bool(obj, what, "qk_norm", FALSE, &model->qk_norm, error) ||
        !get_choice(obj, what, "mlp", mlp_names, &mlp, error) ||
        !get_choice(obj, what, "norm", norm_names, &norm, error) ||
        !get_biases(obj, what, model, error) ||
        !zp_json_get_bool(obj, what, "parallel_residual", FALSE, &model->parallel_residual,
                          error) ||
        !zp_json_get_number(obj, what, "rope_theta", FALSE, 1, 1e12, &model->rope_theta,
                            error) ||
        !zp_json_get_number(obj, what, "rotary_fraction", FALSE, 0, 1, &model->rotary_fraction,
                            error) ||
        !zp_json_get_number(obj, what, "norm_eps", FALSE, 1e-12, 1, &model->norm_eps, error) ||
        !zp_json_get_bool(obj, what, "exact_gelu", FALSE, &model->exact_gelu, error) ||
        !zp_json_get_int(obj, what, "sliding_window", FALSE, 1, MAX_SEQ, &model->sliding_window,
                         error) ||
        !zp_model_get_rope_scaling(obj, what, model, error) ||
        !zp_moe_from_json(obj, what, &model->moe, &model->mla, error))
        return FALSE;
    model->mlp = (ZpMlp)mlp;
    model->norm = (ZpNorm)norm;
    if (model->rope_theta > 0 && model->rotary_fraction == 0)
        model->rotary_fraction = 1.0;
    if (strlen(name) == 0 || strlen(name) >= sizeof model->name) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"name\" must be 1 to %zu characters", what,
                    sizeof model->name - 1);
        return FALSE;
    }
    if (model->head_dim == 0 && model->hidden % model->heads != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"heads\" = %" G_GINT64_FORMAT " does not divide hidden = %"
                    G_GINT64_FORMAT,
                    what, model->heads, model->hidden);
        return FALSE;
    }
    g_strlcpy(model->name, name, sizeof model->name);
    model->ffn_hidden = ffn ? ffn : 4 * model->hidden;
    return zp_model_check(model, what, error);
}

gboolean zp_model_check(const ZpModel *model, const char *what, GError **error)
{
    if (!zp_moe_check(&model->moe, &model->mla, model->hidden, model->heads, model->layers,
                      what, error))
        return FALSE;
    const int64_t kv = zp_model_kv_heads(model);
    if (model->heads % kv != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: %" G_GINT64_FORMAT " key/value heads do not divide the %" G_GINT64_FORMAT
                    " attention heads", what, kv, model->heads);
        return FALSE;
    }
    if (model->learned_positions && model->seq_len > zp_model_positions(model)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: sequence %" G_GINT64_FORMAT " is longer than the %" G_GINT64_FORMAT
                    " learned positions", what, model->seq_len, zp_model_positions(model));
        return FALSE;
    }
    return TRUE;
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

int64_t zp_model_kv_heads(const ZpModel *model)
{
    return model->kv_heads > 0 ? model->kv_heads : model->heads;
}

int64_t zp_model_head_dim(const ZpModel *model)
{
    if (model->head_dim > 0)
        return model->head_dim;
    return model->heads > 0 ? model->hidden / model->heads : 0;
}

int64_t zp_model_attn_width(const ZpModel *model)
{
    return model->head_dim > 0 ? model->heads * model->head_dim : model->hidden;
}

int64_t zp_model_qkv_width(const ZpModel *model)
{
    return zp_model_attn_width(model) + 2 * zp_model_kv_heads(model) * zp_model_head_dim(model);
}

gboolean zp_model_gated(const ZpModel *model)
{
    return model->mlp != ZP_MLP_GELU;
}

int64_t zp_model_fc1_width(const ZpModel *model)
{
    return (zp_model_gated(model) ? 2 : 1) * model->ffn_hidden;
}

int64_t zp_model_positions(const ZpModel *model)
{
    return model->max_positions > 0 ? model->max_positions : model->seq_len;
}

double zp_model_attention_share(const ZpModel *model)
{
    const double s = (double)model->seq_len, w = (double)model->sliding_window;
    if (w <= 0 || w >= s)
        return 1.0;
    /* Positions t < w see t + 1 keys, the s - w later ones w each. */
    return (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2);
}

gboolean zp_model_has_bias(const ZpModel *model, unsigned which)
{
    return !(model->no_bias & which);
}

int zp_model_n_units(const ZpModel *model)
{
    return zp_model_has_architecture(model) ? (int)model->layers + 2 : 0;
}

/* The split and expert flags of a tensor named `name` (ZpTensor.split, .expert). */
static void classify_tensor(ZpTensor *tensor)
{
    static const char *const split[] = {
        "qkv.weight", "qkv.bias", "proj.weight", "fc1.weight", "fc1.bias", "fc2.weight",
        "qkv.q_b.weight", "qkv.q.weight", "qkv.kv_b.weight", "fc1.experts.weight",
        "fc1.shared.weight", "fc2.experts.weight", "fc2.shared.weight"};
    static const char *const rows[] = {"wte", "lm_head.weight"};
    static const char *const experts[] = {"fc1.experts.weight", "fc2.experts.weight"};
    const char *name = tensor->name;
    tensor->split = ZP_TENSOR_WHOLE;
    tensor->expert = FALSE;
    /* the first letters first: a one-block model's table (ds_residual's, at every plan the
     * search screens) names each tensor once */
    for (size_t i = 0; i < G_N_ELEMENTS(split); i++)
        if (split[i][0] == name[0] && strcmp(name, split[i]) == 0)
            tensor->split = ZP_TENSOR_SPLIT;
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++)
        if (rows[i][0] == name[0] && strcmp(name, rows[i]) == 0)
            tensor->split = ZP_TENSOR_SPLIT_ROWS;
    for (size_t i = 0; i < G_N_ELEMENTS(experts); i++)
        if (experts[i][0] == name[0] && strcmp(name, experts[i]) == 0)
            tensor->expert = TRUE;
}

/* A row of the tensor table: a ZpTensor's name, unit, elements and matrix flag (its split
 * and expert flags are read off the name as zp_model_tensors appends it), and whether the
 * model has it. */
typedef struct {
    const char *name;
    int unit;
    uint64_t elems;
    gboolean matrix;
} TensorSpec;

typedef struct {
    TensorSpec tensor;
    gboolean present;
} TensorRow;

/* The flags of the names classified so far in one table, by the name's pointer: every block
 * repeats its rows' static names, so a deep model's table reads each name once. */
#define NAMES_SEEN 64
typedef struct {
    guint room; /* the rows the table holds (zp_array_extend's; 0 when unreserved) */
    guint n;
    ZpTensor seen[NAMES_SEEN];
} NamesSeen;

static void append_rows(GArray *t, const TensorRow *rows, size_t n, NamesSeen *names)
{
    for (size_t i = 0; i < n; i++)
        if (rows[i].present) {
            const TensorSpec *r = &rows[i].tensor;
            ZpTensor tensor = {.name = r->name, .unit = r->unit, .elems = r->elems,
                               .matrix = r->matrix};
            guint k = 0;
            while (k < names->n && names->seen[k].name != r->name)
                k++;
            if (k < names->n) {
                tensor.split = names->seen[k].split;
                tensor.expert = names->seen[k].expert;
            } else {
                classify_tensor(&tensor);
                if (names->n < NAMES_SEEN)
                    names->seen[names->n++] = tensor;
            }
            *(ZpTensor *)zp_array_extend(t, 1, sizeof tensor, &names->room) = tensor;
        }
}

/* ln1 and the attention: the fused qkv, or multi-head latent attention's projections (named
 * under "qkv." so that they form the qkv module); the output projection. */
static void append_attention(const ZpModel *model, int l, GArray *t, NamesSeen *names)
{
    const uint64_t h = (uint64_t)model->hidden, q = (uint64_t)zp_model_qkv_width(model);
    const gboolean ln = model->norm == ZP_NORM_LAYERNORM, mla = zp_mla_enabled(&model->mla);
    const ZpMla *a = &model->mla;
    const uint64_t rq = (uint64_t)a->q_lora_rank, rkv = (uint64_t)a->kv_lora_rank;
    const uint64_t qw = (uint64_t)zp_mla_q_width(a, model->heads);
    const uint64_t kvw = (uint64_t)zp_mla_kv_width(a, model->heads);
    const uint64_t out =
        mla ? (uint64_t)model->heads * (uint64_t)a->v_dim : (uint64_t)zp_model_attn_width(model);
    const uint64_t d = (uint64_t)zp_model_head_dim(model);
    const TensorRow rows[] = {
        {{"ln1.weight", l, h, FALSE}, TRUE},
        {{"ln1.bias", l, h, FALSE}, ln},
        {{"qkv.weight", l, q * h, TRUE}, !mla},
        {{"qkv.bias", l, q, FALSE}, !mla && zp_model_has_bias(model, ZP_NO_BIAS_QKV)},
        {{"qkv.q_norm.weight", l, d, FALSE}, !mla && model->qk_norm},
        {{"qkv.k_norm.weight", l, d, FALSE}, !mla && model->qk_norm},
        {{"qkv.q_a.weight", l, h * rq, TRUE}, mla && rq > 0},
        {{"qkv.q_a_norm.weight", l, rq, FALSE}, mla && rq > 0},
        {{"qkv.q_b.weight", l, rq * qw, TRUE}, mla && rq > 0},
        {{"qkv.q.weight", l, h * qw, TRUE}, mla && rq == 0},
        {{"qkv.kv_a.weight", l, h * (rkv + (uint64_t)a->qk_rope_dim), TRUE}, mla},
        {{"qkv.kv_a_norm.weight", l, rkv, FALSE}, mla},
        {{"qkv.kv_b.weight", l, rkv * kvw, TRUE}, mla},
        {{"proj.weight", l, out * h, TRUE}, TRUE},
        {{"proj.bias", l, h, FALSE}, zp_model_has_bias(model, ZP_NO_BIAS_PROJ)},
    };
    append_rows(t, rows, G_N_ELEMENTS(rows), names);
}

/* ln2 and the MLP: dense, or sparse with its router (under "fc1." so that the router, the
 * experts' gate and up and the shared expert form the fc1 module, and the down projections fc2). */
static void append_mlp(const ZpModel *model, int l, GArray *t, NamesSeen *names)
{
    const uint64_t h = (uint64_t)model->hidden, f = (uint64_t)model->ffn_hidden;
    const uint64_t f1 = (uint64_t)zp_model_fc1_width(model);
    const gboolean ln = model->norm == ZP_NORM_LAYERNORM, gated = zp_model_gated(model);
    const gboolean sparse = zp_model_unit_sparse(model, l);
    const gboolean bias = zp_model_has_bias(model, ZP_NO_BIAS_MLP);
    const ZpMoe *m = &model->moe;
    const uint64_t E = (uint64_t)m->experts, fe = (uint64_t)m->expert_ffn;
    const uint64_t fs = (uint64_t)m->shared_ffn, g = gated ? 2 : 1;
    const TensorRow rows[] = {
        {{"ln2.weight", l, h, FALSE}, TRUE},
        {{"ln2.bias", l, h, FALSE}, ln},
        {{"fc1.weight", l, h * f1, TRUE}, !sparse},
        {{"fc1.bias", l, f1, FALSE}, !sparse && bias},
        {{"fc1.router.weight", l, E * h, TRUE}, sparse},
        {{"fc1.router.bias", l, E, FALSE}, sparse && m->router_bias},
        {{"fc1.experts.weight", l, E * h * g * fe, TRUE}, sparse},
        {{"fc1.shared.weight", l, h * g * fs, TRUE}, sparse && fs > 0},
        {{"fc1.shared_gate.weight", l, h, FALSE}, sparse && m->shared_gate},
        {{"fc2.weight", l, f * h, TRUE}, !sparse},
        {{"fc2.bias", l, h, FALSE}, !sparse && bias},
        {{"fc2.experts.weight", l, E * fe * h, TRUE}, sparse},
        {{"fc2.shared.weight", l, fs * h, TRUE}, sparse && fs > 0},
    };
    append_rows(t, rows, G_N_ELEMENTS(rows), names);
}

/* The per-unit tensor table: one row per tensor, sizes as products of the dimensions; a
 * row whose flag is off (a bias the model lacks, a norm's bias under RMSNorm) is left out. */
GArray *zp_model_tensors(const ZpModel *model)
{
    GArray *t = g_array_new(FALSE, FALSE, sizeof(ZpTensor));
    if (!zp_model_has_architecture(model))
        return t;
    NamesSeen names;
    names.n = 0; /* only the first n are read */
    /* room for every row (2 embeddings, 15 attention and 13 MLP rows a block, 3 last) */
    names.room = zp_array_reserve_huge(t, 5 + 28 * (guint64)model->layers);
    const uint64_t h = (uint64_t)model->hidden;
    const uint64_t V = (uint64_t)model->vocab, P = (uint64_t)zp_model_positions(model);
    const gboolean ln = model->norm == ZP_NORM_LAYERNORM;
    const int L = (int)model->layers;
    const TensorRow embed[] = {{{"wte", 0, V * h, TRUE}, TRUE},
                               {{"wpe", 0, P * h, TRUE}, model->learned_positions}};
    append_rows(t, embed, G_N_ELEMENTS(embed), &names);
    for (int l = 1; l <= L; l++) {
        append_attention(model, l, t, &names);
        append_mlp(model, l, t, &names);
    }
    const TensorRow last[] = {{{"lnf.weight", L + 1, h, FALSE}, TRUE},
                              {{"lnf.bias", L + 1, h, FALSE}, ln},
                              {{"lm_head.weight", L + 1, V * h, TRUE}, !model->tied_embeddings}};
    append_rows(t, last, G_N_ELEMENTS(last), &names);
    return t;
}

const GArray *zp_model_tensors_kept(ZpModelTensorsKept *kept, const ZpModel *model)
{
    if (!kept->tensors || memcmp(&kept->model, model, sizeof *model) != 0) {
        if (kept->tensors)
            g_array_unref(kept->tensors);
        kept->tensors = zp_model_tensors(model);
        memcpy(&kept->model, model, sizeof *model);
    }
    return kept->tensors;
}

gboolean zp_model_unit_sparse(const ZpModel *model, int unit)
{
    return unit >= 1 && unit <= model->layers && zp_moe_layer_sparse(&model->moe, unit - 1);
}

/* A block's elements with `experts` routed experts in a sparse MLP, as the part a tensor rank
 * holds whole (norms, row-parallel biases, the router, MLA's down projections) and the part
 * Megatron splits (column-parallel qkv and fc1 with their biases, row-parallel proj and fc2,
 * every expert's projections). */
static void block_parts(const ZpModel *model, int unit, int64_t experts, uint64_t *whole,
                        uint64_t *split)
{
    const uint64_t h = (uint64_t)model->hidden, f = (uint64_t)model->ffn_hidden;
    const uint64_t norm = model->norm == ZP_NORM_LAYERNORM ? 2 * h : h;
    const uint64_t q = (uint64_t)zp_model_qkv_width(model);
    const uint64_t f1 = (uint64_t)zp_model_fc1_width(model);
    uint64_t w = 2 * norm + (zp_model_has_bias(model, ZP_NO_BIAS_PROJ) ? h : 0), sp = 0;
    if (zp_mla_enabled(&model->mla)) {
        uint64_t aw, as;
        zp_mla_parts(&model->mla, model->hidden, model->heads, &aw, &as);
        w += aw, sp += as;
    } else {
        const uint64_t ha = (uint64_t)zp_model_attn_width(model);
        sp += q * h + ha * h + (zp_model_has_bias(model, ZP_NO_BIAS_QKV) ? q : 0);
        /* q_norm and k_norm: one gain of d each, shared by every head and so whole on each
         * tensor rank (modeling_qwen3_moe.py Qwen3MoeAttention.__init__). */
        w += model->qk_norm ? 2 * (uint64_t)zp_model_head_dim(model) : 0;
    }
    if (zp_model_unit_sparse(model, unit)) {
        uint64_t mw, ms;
        zp_moe_mlp_parts(&model->moe, model->hidden, zp_model_gated(model), experts, &mw, &ms);
        w += mw, sp += ms;
    } else {
        const gboolean bias = zp_model_has_bias(model, ZP_NO_BIAS_MLP);
        sp += h * f1 + f * h + (bias ? f1 : 0);
        w += bias ? h : 0;
    }
    *whole = w, *split = sp;
}

uint64_t zp_model_unit_expert_elems(const ZpModel *model, int unit)
{
    if (!zp_model_unit_sparse(model, unit))
        return 0;
    return (uint64_t)model->moe.experts *
           zp_moe_expert_elems(&model->moe, model->hidden, zp_model_gated(model));
}

/* Closed form of the tensor table's per-unit sums (tests check the two agree); the
 * planner's search calls this in its inner loop, so it must not build the table. */
uint64_t zp_model_unit_elems(const ZpModel *model, int unit)
{
    const uint64_t h = (uint64_t)model->hidden;
    const uint64_t V = (uint64_t)model->vocab;
    if (!zp_model_has_architecture(model) || unit < 0 || unit > model->layers + 1)
        return 0;
    const uint64_t norm = model->norm == ZP_NORM_LAYERNORM ? 2 * h : h;
    if (unit == 0)
        return V * h + (model->learned_positions ? (uint64_t)zp_model_positions(model) * h : 0);
    if (unit <= model->layers) {
        uint64_t whole, split;
        block_parts(model, unit, model->moe.experts, &whole, &split);
        return whole + split;
    }
    return norm + (model->tied_embeddings ? 0 : V * h);
}

uint64_t zp_model_unit_tp_elems(const ZpModel *model, int unit, int mp)
{
    const uint64_t full = zp_model_unit_elems(model, unit), t = (uint64_t)MAX(mp, 1);
    if (!zp_model_has_architecture(model))
        return (full + t - 1) / t;
    const uint64_t h = (uint64_t)model->hidden;
    const uint64_t V = (uint64_t)model->vocab, vocab_rows = (V + t - 1) / t;
    if (unit == 0)
        return full - V * h + vocab_rows * h;
    if (unit == model->layers + 1)
        return model->tied_embeddings ? full : full - V * h + vocab_rows * h;
    if (unit < 1 || unit > model->layers)
        return 0;
    uint64_t whole, split;
    block_parts(model, unit, model->moe.experts, &whole, &split);
    return whole + (split + t - 1) / t;
}

uint64_t zp_model_unit_dense_tp_elems(const ZpModel *model, int unit, int mp)
{
    if (!zp_model_unit_sparse(model, unit))
        return zp_model_unit_tp_elems(model, unit, mp);
    const uint64_t t = (uint64_t)MAX(mp, 1);
    uint64_t whole, split;
    block_parts(model, unit, 0, &whole, &split);
    return whole + (split + t - 1) / t;
}

uint64_t zp_model_expert_tp_elems(const ZpModel *model, int mp)
{
    const uint64_t t = (uint64_t)MAX(mp, 1);
    return (zp_moe_expert_elems(&model->moe, model->hidden, zp_model_gated(model)) + t - 1) / t;
}

gboolean zp_model_tensor_is_expert(const ZpTensor *tensor)
{
    return tensor->expert;
}

uint64_t zp_model_tensor_tp_elems(const ZpModel *model, const ZpTensor *tensor, int mp)
{
    const uint64_t t = (uint64_t)MAX(mp, 1), h = (uint64_t)model->hidden;
    /* Without tensor parallelism every tensor is whole (the vocabulary's rows are whole rows
     * of h). */
    if (t == 1 && h > 0 && tensor->elems % h == 0)
        return tensor->elems;
    if (tensor->split == ZP_TENSOR_SPLIT)
        return (tensor->elems + t - 1) / t;
    if (tensor->split == ZP_TENSOR_SPLIT_ROWS)
        return (tensor->elems / h + t - 1) / t * h;
    return tensor->elems;
}

/* The blocks' sum with `experts` routed experts in each sparse MLP. Dense blocks are
 * identical, so a dense model's count is O(1) (zp_mem_residual, which the planner's search
 * calls in its inner loop, needs it); a mixture of experts walks its layers once. */
static uint64_t count_params(const ZpModel *model, int64_t experts)
{
    const uint64_t L = (uint64_t)model->layers;
    uint64_t blocks = 0;
    if (!zp_moe_enabled(&model->moe)) {
        blocks = L * zp_model_unit_elems(model, 1);
    } else {
        for (int unit = 1; unit <= (int)L; unit++) {
            uint64_t whole, split;
            block_parts(model, unit, experts, &whole, &split);
            blocks += whole + split;
        }
    }
    return zp_model_unit_elems(model, 0) + blocks + zp_model_unit_elems(model, (int)L + 1);
}

uint64_t zp_model_param_count(const ZpModel *model)
{
    if (!zp_model_has_architecture(model))
        return (uint64_t)model->params_only;
    return count_params(model, model->moe.experts);
}

uint64_t zp_model_active_param_count(const ZpModel *model)
{
    if (!zp_model_has_architecture(model))
        return (uint64_t)model->params_only;
    return count_params(model, model->moe.top_k);
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
    json_object_set_new(o, "kv_heads", json_integer((json_int_t)zp_model_kv_heads(model)));
    json_object_set_new(o, "max_positions", json_integer((json_int_t)zp_model_positions(model)));
    if (model->head_dim > 0)
        json_object_set_new(o, "head_dim", json_integer((json_int_t)model->head_dim));
    if (model->qk_norm)
        json_object_set_new(o, "qk_norm", json_true());
    json_object_set_new(o, "mlp", json_string(mlp_names[model->mlp]));
    json_object_set_new(o, "norm", json_string(norm_names[model->norm]));
    json_object_set_new(o, "exact_gelu", json_boolean(model->exact_gelu));
    json_object_set_new(o, "qkv_bias", json_boolean(zp_model_has_bias(model, ZP_NO_BIAS_QKV)));
    json_object_set_new(o, "proj_bias", json_boolean(zp_model_has_bias(model, ZP_NO_BIAS_PROJ)));
    json_object_set_new(o, "mlp_bias", json_boolean(zp_model_has_bias(model, ZP_NO_BIAS_MLP)));
    json_object_set_new(o, "parallel_residual", json_boolean(model->parallel_residual));
    if (model->rope_theta > 0) {
        json_object_set_new(o, "rope_theta", json_real(model->rope_theta));
        json_object_set_new(o, "rotary_fraction", json_real(model->rotary_fraction));
    }
    const ZpRopeScaling *r = &model->rope_scaling;
    if (r->type == ZP_ROPE_SCALING_LINEAR || r->type == ZP_ROPE_SCALING_LLAMA3) {
        json_t *scaling = json_pack("{s:s, s:f}", "rope_type", r->name, "factor", r->factor);
        if (r->type == ZP_ROPE_SCALING_LLAMA3)
            json_object_update_new(scaling,
                                   json_pack("{s:f, s:f, s:I}", "low_freq_factor",
                                             r->low_freq_factor, "high_freq_factor",
                                             r->high_freq_factor,
                                             "original_max_position_embeddings",
                                             (json_int_t)r->original_max_positions));
        json_object_set_new(o, "rope_scaling", scaling);
    } else if (r->type == ZP_ROPE_SCALING_OTHER) {
        json_object_set_new(o, "rope_scaling", json_pack("{s:s}", "rope_type", r->name));
    }
    if (model->norm_eps > 0)
        json_object_set_new(o, "norm_eps", json_real(model->norm_eps));
    if (model->sliding_window > 0)
        json_object_set_new(o, "sliding_window", json_integer((json_int_t)model->sliding_window));
    if (model->published_params > 0)
        json_object_set_new(o, "published_params", json_real(model->published_params));
    zp_moe_to_json(&model->moe, &model->mla, o);
    return o;
}
