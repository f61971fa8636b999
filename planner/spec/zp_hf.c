/* zp_hf: maps a Hugging Face config.json onto ZpModel through tables: which architectures
 * exist, how each family spells a dimension, and what it defaults to when a key is absent. */
#include "zp_hf.h"
#include "zp_util.h"

#include <jansson.h>
#include <string.h>

/* Families share their keys' spellings and defaults (transformers' *Config classes). */
typedef enum { HF_LLAMA, HF_GPT2, HF_NEOX, HF_N } HfFamily;

/* How an architecture reads "sliding_window": not at all, whenever it is not null
 * (MistralConfig), or only under "use_sliding_window" for the layers from
 * "max_window_layers" on (Qwen2Config, whose layer_types say "sliding_attention" there). */
typedef enum { HF_WINDOW_NONE, HF_WINDOW_MISTRAL, HF_WINDOW_QWEN2 } HfWindow;

/* A mixture of experts' keys (transformers' MixtralConfig, Qwen2MoeConfig, DeepseekV3Config and
 * their modeling files' sparse blocks): NULL where the family has no such key. The routed
 * expert's width is intermediate_size where expert_ffn is NULL (Mixtral); the shared experts'
 * width is shared_ffn's key, or shared_count's key times the expert width (DeepSeek); layer i
 * is sparse from first_dense on when (i + step_phase) % step == 0, and not in dense_list. */
typedef struct {
    const char *experts, *top_k, *expert_ffn, *shared_ffn, *shared_count;
    gboolean shared_gate, router_bias;
    const char *first_dense, *step;
    int64_t step_phase;
    const char *dense_list;
    gboolean mla; /* DeepSeek's q_lora_rank, kv_lora_rank, qk_nope/qk_rope/v_head_dim */
} HfMoeKeys;

/* MixtralSparseMoeBlock: gate [E, h] and E experts w1, w2, w3 (no shared expert). */
static const HfMoeKeys hf_moe_mixtral = {"num_local_experts", "num_experts_per_tok", NULL,
                                         NULL, NULL, FALSE, FALSE, NULL, NULL, 0, NULL, FALSE};
/* Qwen2MoeSparseMoeBlock: gate [E, h], experts of moe_intermediate_size, one shared_expert of
 * shared_expert_intermediate_size behind shared_expert_gate [1, h]; Qwen2MoeDecoderLayer is
 * sparse when layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0. */
static const HfMoeKeys hf_moe_qwen2 = {"num_experts", "num_experts_per_tok",
                                       "moe_intermediate_size", "shared_expert_intermediate_size",
                                       NULL, TRUE, FALSE, NULL, "decoder_sparse_step", 1,
                                       "mlp_only_layers", FALSE};
/* DeepseekV3MoE: gate [E, h] with e_score_correction_bias [E], experts of
 * moe_intermediate_size, shared_experts one MLP of n_shared_experts * moe_intermediate_size;
 * DeepseekV3DecoderLayer is sparse when layer_idx >= first_k_dense_replace (and, in DeepSeek's
 * own modeling_deepseek.py, layer_idx % moe_layer_freq == 0). */
/* Qwen3MoeSparseMoeBlock: gate [E, h] and experts of moe_intermediate_size, no shared expert;
 * Qwen3MoeDecoderLayer sparse as Qwen2's (huggingface/transformers
 * src/transformers/models/qwen3_moe/modeling_qwen3_moe.py). */
static const HfMoeKeys hf_moe_qwen3 = {"num_experts", "num_experts_per_tok",
                                       "moe_intermediate_size", NULL, NULL, FALSE, FALSE, NULL,
                                       "decoder_sparse_step", 1, "mlp_only_layers", FALSE};
static const HfMoeKeys hf_moe_deepseek3 = {"n_routed_experts", "num_experts_per_tok",
                                           "moe_intermediate_size", NULL, "n_shared_experts",
                                           FALSE, TRUE, "first_k_dense_replace", "moe_layer_freq",
                                           0, NULL, TRUE};

static const struct {
    const char *name;
    HfFamily family;
    gboolean qkv_bias; /* biases on q, k and v whatever the config says (Qwen2) */
    HfWindow window;
    const HfMoeKeys *moe; /* NULL: a dense MLP */
    /* q_norm and k_norm, RMSNorm(head_dim) on every head's q and k before RoPE
     * (modeling_qwen3_moe.py Qwen3MoeAttention.__init__ and forward) */
    gboolean qk_norm;
} hf_archs[] = {
    {"LlamaForCausalLM", HF_LLAMA, FALSE, HF_WINDOW_NONE, NULL, FALSE},
    {"MistralForCausalLM", HF_LLAMA, FALSE, HF_WINDOW_MISTRAL, NULL, FALSE},
    {"Qwen2ForCausalLM", HF_LLAMA, TRUE, HF_WINDOW_QWEN2, NULL, FALSE},
    {"GPT2LMHeadModel", HF_GPT2, FALSE, HF_WINDOW_NONE, NULL, FALSE},
    {"GPTNeoXForCausalLM", HF_NEOX, FALSE, HF_WINDOW_NONE, NULL, FALSE},
    {"MixtralForCausalLM", HF_LLAMA, FALSE, HF_WINDOW_MISTRAL, &hf_moe_mixtral, FALSE},
    {"Qwen2MoeForCausalLM", HF_LLAMA, TRUE, HF_WINDOW_QWEN2, &hf_moe_qwen2, FALSE},
    {"Qwen3MoeForCausalLM", HF_LLAMA, FALSE, HF_WINDOW_QWEN2, &hf_moe_qwen3, TRUE},
    {"DeepseekV3ForCausalLM", HF_LLAMA, FALSE, HF_WINDOW_NONE, &hf_moe_deepseek3, FALSE},
};

/* Whole-number dimensions: the key in each family (NULL: the family has none) and whether
 * it must be present. */
static const struct {
    size_t offset;
    const char *key[HF_N];
    gboolean required[HF_N];
    int64_t max;
} hf_dims[] = {
    {G_STRUCT_OFFSET(ZpModel, hidden), {"hidden_size", "n_embd", "hidden_size"},
     {TRUE, TRUE, TRUE}, 1000000},
    {G_STRUCT_OFFSET(ZpModel, layers), {"num_hidden_layers", "n_layer", "num_hidden_layers"},
     {TRUE, TRUE, TRUE}, 100000},
    {G_STRUCT_OFFSET(ZpModel, heads), {"num_attention_heads", "n_head", "num_attention_heads"},
     {TRUE, TRUE, TRUE}, 1000000},
    {G_STRUCT_OFFSET(ZpModel, kv_heads), {"num_key_value_heads", NULL, NULL},
     {FALSE, FALSE, FALSE}, 1000000},
    {G_STRUCT_OFFSET(ZpModel, ffn_hidden), {"intermediate_size", "n_inner", "intermediate_size"},
     {TRUE, FALSE, TRUE}, 16000000},
    {G_STRUCT_OFFSET(ZpModel, vocab), {"vocab_size", "vocab_size", "vocab_size"},
     {TRUE, TRUE, TRUE}, 100000000},
    {G_STRUCT_OFFSET(ZpModel, max_positions),
     {"max_position_embeddings", "n_positions", "max_position_embeddings"},
     {TRUE, TRUE, TRUE}, 10000000},
};

/* Everything else a family decides: its norm, its activation key and default, the eps key,
 * whether embeddings are tied by default, rotary or learned positions, the bias keys. */
typedef struct {
    ZpNorm norm;
    const char *act_key, *act_default;
    const char *eps_key;
    double eps_default;
    gboolean tied_default;
    const char *theta_key;    /* NULL: learned positions */
    const char *fraction_key; /* NULL: every dimension rotates */
    double fraction_default;
    const char *attention_bias_key; /* q, k, v and the output projection */
    gboolean attention_bias_default;
    const char *mlp_bias_key; /* NULL: the MLP has biases */
    const char *parallel_key; /* NULL: sequential residual */
    const char *dropout_keys[3];
    double dropout_default;
} HfFamilySpec;

static const HfFamilySpec hf_families[HF_N] = {
    [HF_LLAMA] = {ZP_NORM_RMSNORM, "hidden_act", "silu", "rms_norm_eps", 1e-6, FALSE,
                  "rope_theta", NULL, 1.0, "attention_bias", FALSE, "mlp_bias", NULL,
                  {"attention_dropout", NULL, NULL}, 0.0},
    [HF_GPT2] = {ZP_NORM_LAYERNORM, "activation_function", "gelu_new", "layer_norm_epsilon",
                 1e-5, TRUE, NULL, NULL, 0.0, NULL, TRUE, NULL, NULL,
                 {"resid_pdrop", "embd_pdrop", "attn_pdrop"}, 0.1},
    [HF_NEOX] = {ZP_NORM_LAYERNORM, "hidden_act", "gelu", "layer_norm_eps", 1e-5, FALSE,
                 "rotary_emb_base", "rotary_pct", 0.25, "attention_bias", TRUE, NULL,
                 "use_parallel_residual", {"attention_dropout", "hidden_dropout", NULL}, 0.0},
};

/* transformers' activation names (ACT2FN) and the MLP they make: gated in the Llama family,
 * plain in GPT-2 and NeoX; "gelu" is the exact erf form (GELUActivation), the others the tanh
 * approximation (NewGELUActivation, PytorchGELUTanh, FastGELUActivation). */
static const struct {
    const char *name;
    ZpMlp gated, plain;
    gboolean exact;
} hf_acts[] = {
    {"silu", ZP_MLP_SWIGLU, ZP_MLP_N, FALSE}, {"swish", ZP_MLP_SWIGLU, ZP_MLP_N, FALSE},
    {"gelu", ZP_MLP_GEGLU, ZP_MLP_GELU, TRUE}, {"gelu_new", ZP_MLP_GEGLU, ZP_MLP_GELU, FALSE},
    {"gelu_pytorch_tanh", ZP_MLP_GEGLU, ZP_MLP_GELU, FALSE},
    {"gelu_fast", ZP_MLP_GEGLU, ZP_MLP_GELU, FALSE},
};

/* A key that is absent or JSON null counts as absent (GPT-2 writes "n_inner": null). */
static gboolean present(json_t *obj, const char *key)
{
    json_t *v = key ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v);
}

static gboolean get_architecture(json_t *obj, const char *path, int *arch, GError **error)
{
    json_t *list = json_object_get(obj, "architectures");
    json_t *first = json_array_get(list, 0);
    if (!json_is_array(list) || json_array_size(list) != 1 || !json_is_string(first)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"architectures\" must be an array of one string", path);
        return FALSE;
    }
    const char *name = json_string_value(first);
    GString *known = g_string_new(NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(hf_archs); i++) {
        if (strcmp(name, hf_archs[i].name) == 0) {
            *arch = (int)i;
            g_string_free(known, TRUE);
            return TRUE;
        }
        g_string_append_printf(known, "%s%s", i ? ", " : "", hf_archs[i].name);
    }
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                "%s: architectures \"%s\" is not supported (supported: %s)", path, name,
                known->str);
    g_string_free(known, TRUE);
    return FALSE;
}

static gboolean get_bool(json_t *obj, const char *path, const char *key, gboolean fallback,
                         gboolean *out, GError **error)
{
    *out = fallback;
    return !present(obj, key) || zp_json_get_bool(obj, path, key, TRUE, out, error);
}

static gboolean get_number(json_t *obj, const char *path, const char *key, double fallback,
                           double min, double max, double *out, GError **error)
{
    *out = fallback;
    return !present(obj, key) || zp_json_get_number(obj, path, key, TRUE, min, max, out, error);
}

static gboolean get_mlp(json_t *obj, const char *path, HfFamily family, ZpModel *m,
                        GError **error)
{
    const char *key = hf_families[family].act_key, *act = hf_families[family].act_default;
    if (present(obj, key) && !zp_json_get_string(obj, path, key, TRUE, &act, error))
        return FALSE;
    for (size_t i = 0; i < G_N_ELEMENTS(hf_acts); i++) {
        const ZpMlp mlp = family == HF_LLAMA ? hf_acts[i].gated : hf_acts[i].plain;
        if (strcmp(act, hf_acts[i].name) == 0 && mlp != ZP_MLP_N) {
            m->mlp = mlp;
            m->exact_gelu = hf_acts[i].exact;
            return TRUE;
        }
    }
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: key \"%s\" = \"%s\" is not supported", path,
                key, act);
    return FALSE;
}

/* The sliding window, as transformers' masking_utils applies it: query t sees keys
 * t - w < u <= t. Qwen2 windows only the layers from max_window_layers on; a window on some
 * layers and not others is refused, as the model holds one window for every block. */
static gboolean get_sliding_window(json_t *obj, const char *path, HfWindow how, ZpModel *m,
                                   GError **error)
{
    gboolean on = how == HF_WINDOW_MISTRAL;
    if (how == HF_WINDOW_NONE ||
        (how == HF_WINDOW_QWEN2 && !get_bool(obj, path, "use_sliding_window", FALSE, &on, error)))
        return how == HF_WINDOW_NONE;
    if (!on || !present(obj, "sliding_window"))
        return TRUE;
    int64_t first_layer = 0; /* the first windowed layer */
    if (how == HF_WINDOW_QWEN2 && present(obj, "max_window_layers") &&
        !zp_json_get_int(obj, path, "max_window_layers", TRUE, 0, 100000, &first_layer, error))
        return FALSE;
    if (first_layer >= m->layers)
        return TRUE;
    if (first_layer > 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"max_window_layers\" = %" G_GINT64_FORMAT " windows only some of "
                    "the %" G_GINT64_FORMAT " layers (not supported: one window for every layer)",
                    path, first_layer, m->layers);
        return FALSE;
    }
    return zp_json_get_int(obj, path, "sliding_window", TRUE, 1, 10000000, &m->sliding_window,
                           error);
}

/* An optional whole-number key (absent or null: fallback). */
static gboolean get_int(json_t *obj, const char *path, const char *key, int64_t fallback,
                        int64_t min, int64_t max, int64_t *out, GError **error)
{
    *out = fallback;
    return !present(obj, key) || zp_json_get_int(obj, path, key, TRUE, min, max, out, error);
}

static gboolean get_dense_list(json_t *obj, const char *path, const char *key, ZpMoe *moe,
                               GError **error)
{
    json_t *list = key ? json_object_get(obj, key) : NULL;
    if (!list || json_is_null(list))
        return TRUE;
    if (!json_is_array(list) || json_array_size(list) > ZP_MOE_MAX_DENSE_LISTED) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                    "%s: key \"%s\" must be an array of at most %d layer indices", path, key,
                    ZP_MOE_MAX_DENSE_LISTED);
        return FALSE;
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *v = json_array_get(list, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_KEY,
                        "%s: key \"%s\" must hold layer indices (0 or more)", path, key);
            return FALSE;
        }
        moe->dense_listed[moe->n_dense_listed++] = (int64_t)json_integer_value(v);
    }
    return TRUE;
}

/* The mixture of experts and multi-head latent attention keys, by the architecture's table. */
static gboolean map_moe(json_t *obj, const char *path, const HfMoeKeys *k, ZpModel *m,
                        GError **error)
{
    ZpMoe *moe = &m->moe;
    if (!k)
        return TRUE;
    int64_t shared_count = 0;
    if (!zp_json_get_int(obj, path, k->experts, TRUE, 1, 1000000, &moe->experts, error) ||
        !zp_json_get_int(obj, path, k->top_k, TRUE, 1, moe->experts, &moe->top_k, error) ||
        !get_int(obj, path, k->expert_ffn, m->ffn_hidden, 1, 16000000, &moe->expert_ffn,
                 error) ||
        !get_int(obj, path, k->shared_ffn, 0, 0, 16000000, &moe->shared_ffn, error) ||
        !get_int(obj, path, k->shared_count, 0, 0, 1000000, &shared_count, error) ||
        !get_int(obj, path, k->first_dense, 0, 0, 100000, &moe->first_dense, error) ||
        !get_int(obj, path, k->step, 1, 1, 100000, &moe->step, error) ||
        !get_dense_list(obj, path, k->dense_list, moe, error))
        return FALSE;
    if (shared_count > 0)
        moe->shared_ffn = shared_count * moe->expert_ffn;
    moe->shared_experts = shared_count > 0 ? shared_count : moe->shared_ffn > 0;
    moe->shared_gate = k->shared_gate && moe->shared_ffn > 0;
    moe->router_bias = k->router_bias;
    moe->step_phase = k->step_phase;
    if (!k->mla)
        return TRUE;
    ZpMla *a = &m->mla;
    return get_int(obj, path, "q_lora_rank", 0, 0, 16000000, &a->q_lora_rank, error) &&
           zp_json_get_int(obj, path, "kv_lora_rank", TRUE, 1, 16000000, &a->kv_lora_rank,
                           error) &&
           zp_json_get_int(obj, path, "qk_nope_head_dim", TRUE, 1, 1000000, &a->qk_nope_dim,
                           error) &&
           zp_json_get_int(obj, path, "qk_rope_head_dim", TRUE, 1, 1000000, &a->qk_rope_dim,
                           error) &&
           zp_json_get_int(obj, path, "v_head_dim", TRUE, 1, 1000000, &a->v_dim, error);
}

/* The dimensions, then what the family's other keys say. */
static gboolean map_config(json_t *obj, const char *path, int arch, ZpModel *m, GError **error)
{
    const HfFamily family = hf_archs[arch].family;
    for (size_t i = 0; i < G_N_ELEMENTS(hf_dims); i++) {
        const char *key = hf_dims[i].key[family];
        if (!key || (!hf_dims[i].required[family] && !present(obj, key)))
            continue;
        if (!zp_json_get_int(obj, path, key, TRUE, 1, hf_dims[i].max,
                             G_STRUCT_MEMBER_P(m, hf_dims[i].offset), error))
            return FALSE;
    }
    const char *heads_key = hf_dims[2].key[family];
    int64_t head_dim = 0;
    /* head_dim, when given, sets each head's width apart from hidden / heads (Qwen3: 128 over
     * 2048 / 32); equal to it, it changes nothing, and the model stays as without it. */
    if (family == HF_LLAMA && present(obj, "head_dim") &&
        !zp_json_get_int(obj, path, "head_dim", TRUE, 1, 1000000, &head_dim, error))
        return FALSE;
    if (head_dim == 0 && m->hidden % m->heads != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"%s\" = %" G_GINT64_FORMAT " does not divide %s = %" G_GINT64_FORMAT,
                    path, heads_key, m->heads, hf_dims[0].key[family], m->hidden);
        return FALSE;
    }
    if (m->kv_heads > 0 && m->heads % m->kv_heads != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: key \"num_key_value_heads\" = %" G_GINT64_FORMAT
                    " does not divide num_attention_heads = %" G_GINT64_FORMAT,
                    path, m->kv_heads, m->heads);
        return FALSE;
    }
    if (head_dim > 0 && (m->hidden % m->heads != 0 || head_dim != m->hidden / m->heads))
        m->head_dim = head_dim;
    m->qk_norm = hf_archs[arch].qk_norm;
    if (!zp_model_get_rope_scaling(obj, path, m, error) ||
        !get_sliding_window(obj, path, hf_archs[arch].window, m, error) ||
        !map_moe(obj, path, hf_archs[arch].moe, m, error))
        return FALSE;
    if (!m->ffn_hidden)
        m->ffn_hidden = 4 * m->hidden; /* GPT-2's n_inner null */
    m->seq_len = m->max_positions;
    /* torch_dtype, when a string short enough to be a dtype's name (else none): the CLI's
     * default precision (cli_precision_optimizer). */
    const char *dtype = json_string_value(json_object_get(obj, "torch_dtype"));
    if (dtype && strlen(dtype) < sizeof m->torch_dtype)
        g_strlcpy(m->torch_dtype, dtype, sizeof m->torch_dtype);
    m->norm = hf_families[family].norm;
    m->learned_positions = hf_families[family].theta_key == NULL;

    const HfFamilySpec *f = &hf_families[family];
    gboolean attention_bias = f->attention_bias_default, mlp_bias = TRUE, qkv_bias;
    double dropout = 0;
    if (!get_mlp(obj, path, family, m, error) ||
        !get_bool(obj, path, "tie_word_embeddings", f->tied_default, &m->tied_embeddings,
                  error) ||
        !get_number(obj, path, f->eps_key, f->eps_default, 1e-12, 1, &m->norm_eps, error) ||
        (f->attention_bias_key && !get_bool(obj, path, f->attention_bias_key,
                                            f->attention_bias_default, &attention_bias, error)) ||
        (f->mlp_bias_key && !get_bool(obj, path, f->mlp_bias_key, FALSE, &mlp_bias, error)) ||
        !get_bool(obj, path, "qkv_bias", attention_bias || hf_archs[arch].qkv_bias, &qkv_bias,
                  error) ||
        (f->parallel_key &&
         !get_bool(obj, path, f->parallel_key, TRUE, &m->parallel_residual, error)) ||
        (f->theta_key &&
         !get_number(obj, path, f->theta_key, 10000.0, 1, 1e12, &m->rope_theta, error)) ||
        (f->theta_key && !get_number(obj, path, f->fraction_key, f->fraction_default, 0, 1,
                                     &m->rotary_fraction, error)))
        return FALSE;
    if (f->theta_key && !f->fraction_key)
        m->rotary_fraction = 1.0;
    for (size_t i = 0; i < G_N_ELEMENTS(f->dropout_keys) && f->dropout_keys[i]; i++) {
        double p;
        if (!get_number(obj, path, f->dropout_keys[i], f->dropout_default, 0, 1, &p, error))
            return FALSE;
        dropout = MAX(dropout, p);
    }
    m->dropout = dropout > 0;
    m->no_bias = (qkv_bias ? 0 : ZP_NO_BIAS_QKV) | (attention_bias ? 0 : ZP_NO_BIAS_PROJ) |
                 (mlp_bias ? 0 : ZP_NO_BIAS_MLP);
    return zp_model_check(m, path, error);
}

/* The model's name: the directory of a config.json, else the file's name without .json. */
static void model_name(const char *path, char *out, size_t size)
{
    char *base = g_path_get_basename(path);
    char *name;
    if (strcmp(base, "config.json") == 0) {
        char *dir = g_path_get_dirname(path);
        name = g_path_get_basename(dir);
        g_free(dir);
    } else {
        name = g_strndup(base, g_str_has_suffix(base, ".json") ? strlen(base) - 5 : strlen(base));
    }
    g_strlcpy(out, name, size);
    g_free(name);
    g_free(base);
}

gboolean zp_hf_from_json(void *json_object, const char *path, ZpModel *model, GError **error)
{
    json_t *obj = json_object;
    memset(model, 0, sizeof *model);
    int arch;
    if (!get_architecture(obj, path, &arch, error) || !map_config(obj, path, arch, model, error))
        return FALSE;
    model_name(path, model->name, sizeof model->name);
    return TRUE;
}

gboolean zp_hf_load_dir(const char *dir, ZpModel *model, GError **error)
{
    char *path = g_build_filename(dir, "config.json", NULL);
    gboolean ok = FALSE;
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_IO, "%s: no config.json in this directory", dir);
    } else {
        json_t *root = zp_json_load_object(path, error);
        ok = root && zp_hf_from_json(root, path, model, error);
        json_decref(root);
    }
    g_free(path);
    return ok;
}

gboolean zp_hf_is_repo_id(const char *name)
{
    const char *slash = strchr(name, '/');
    if (!slash || strchr(slash + 1, '/') || g_str_has_suffix(name, ".json"))
        return FALSE;
    char *org = g_strndup(name, (gsize)(slash - name));
    const char *repo = slash + 1;
    const gboolean ok = *org && *repo && strcmp(org, ".") && strcmp(org, "..") &&
                        strcmp(repo, ".") && strcmp(repo, "..");
    g_free(org);
    return ok;
}

char *zp_hf_cache_dir(void)
{
    const char *hub = g_getenv("HF_HUB_CACHE"), *home = g_getenv("HF_HOME");
    const char *xdg = g_getenv("XDG_CACHE_HOME");
    if (hub && *hub)
        return g_strdup(hub);
    if (home && *home)
        return g_build_filename(home, "hub", NULL);
    if (xdg && *xdg)
        return g_build_filename(xdg, "huggingface", "hub", NULL);
    return g_build_filename(g_get_home_dir(), ".cache", "huggingface", "hub", NULL);
}

static gint by_name(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The snapshot directory holding config.json: refs/main's revision, else the first by name. */
static char *cached_snapshot(const char *repo_dir)
{
    char *ref = g_build_filename(repo_dir, "refs", "main", NULL), *revision = NULL;
    char *found = NULL;
    if (g_file_get_contents(ref, &revision, NULL, NULL)) {
        char *dir = g_build_filename(repo_dir, "snapshots", g_strstrip(revision), NULL);
        char *config = g_build_filename(dir, "config.json", NULL);
        if (!strchr(g_strstrip(revision), '/') && g_file_test(config, G_FILE_TEST_IS_REGULAR))
            found = g_strdup(dir);
        g_free(config), g_free(dir);
    }
    g_free(revision), g_free(ref);
    char *snapshots = g_build_filename(repo_dir, "snapshots", NULL);
    GDir *d = found ? NULL : g_dir_open(snapshots, 0, NULL);
    GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
    for (const char *e; d && (e = g_dir_read_name(d));)
        g_ptr_array_add(names, g_strdup(e));
    if (d)
        g_dir_close(d);
    g_ptr_array_sort(names, by_name);
    for (guint i = 0; !found && i < names->len; i++) {
        char *dir = g_build_filename(snapshots, (const char *)g_ptr_array_index(names, i), NULL);
        char *config = g_build_filename(dir, "config.json", NULL);
        if (g_file_test(config, G_FILE_TEST_IS_REGULAR))
            found = g_strdup(dir);
        g_free(config), g_free(dir);
    }
    g_ptr_array_unref(names);
    g_free(snapshots);
    return found;
}

gboolean zp_hf_load_cached(const char *repo_id, ZpModel *model, GError **error)
{
    char *cache = zp_hf_cache_dir();
    char **parts = g_strsplit(repo_id, "/", 2);
    char *folder = g_strdup_printf("models--%s--%s", parts[0], parts[1]);
    char *repo_dir = g_build_filename(cache, folder, NULL);
    char *snapshot = cached_snapshot(repo_dir);
    gboolean ok = FALSE;
    if (!snapshot) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_NOTFOUND,
                    "--model: '%s' is not in the local Hugging Face cache (looked for "
                    "%s/snapshots/*/config.json; the cache is $HF_HUB_CACHE, $HF_HOME/hub or "
                    "~/.cache/huggingface/hub): download it with `huggingface-cli download %s "
                    "config.json`, or give a directory or PATH.json",
                    repo_id, repo_dir, repo_id);
    } else if ((ok = zp_hf_load_dir(snapshot, model, error))) {
        g_strlcpy(model->name, parts[1], sizeof model->name);
    }
    g_free(snapshot), g_free(repo_dir), g_free(folder), g_free(cache);
    g_strfreev(parts);
    return ok;
}
