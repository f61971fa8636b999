/* zp_model: transformer model specs (models/NAME.json) and their exact parameter count.
 * The parameter layout (units and tensors) is the contract shared by the planner, the
 * simulator's schedule and the real executor, so it is defined here and only here.
 *
 * Architecture (GPT-2 family, pre-LN, every linear layer with a bias):
 *   unit 0       embeddings: token wte [V,h], learned positions wpe [s,h] (if learned_positions)
 *   unit 1..L    blocks: ln1 (2h), qkv (3h*h + 3h), proj (h*h + h), ln2 (2h),
 *                fc1 (h*f + f), fc2 (f*h + h)           = 4h^2 + 2hf + 9h + f elements
 *   unit L+1     final layer norm (2h), plus the LM head [V,h] when embeddings are untied
 * Total = L(4h^2 + 2hf + 9h + f) + Vh + sh + 2h (+ Vh untied); with f = 4h a block is
 * 12h^2 + 13h, which is how "12Lh^2" in the papers comes about. */
#ifndef ZP_MODEL_H
#define ZP_MODEL_H

#include <glib.h>
#include <stdint.h>

typedef struct {
    char name[64];
    int64_t layers, hidden, heads, seq_len, vocab, ffn_hidden;
    gboolean tied_embeddings;   /* LM head shares wte (default true) */
    gboolean learned_positions; /* a wpe table (default true; false for ALiBi/rotary) */
    gboolean dropout;           /* trained with dropout: changes activation memory */
    double published_params;    /* the size the model is known by, 0 if not given */
    double params_only;         /* > 0: built from --params, no architecture known */
} ZpModel;

typedef struct {
    const char *name; /* "wte", "qkv.weight", ... (static strings) */
    int unit;         /* 0 embeddings, 1..L blocks, L+1 final */
    uint64_t elems;
} ZpTensor;

/* Resolves `name_or_path`: a path ending in .json is read as is; otherwise
 * DATA_DIR/models/NAME.json. An unknown name lists the models that exist. */
gboolean zp_model_load(const char *name_or_path, ZpModel *model, GError **error);

/* Parses a model spec object; `what` names its file in messages. */
gboolean zp_model_from_json(void *json_object, const char *what, ZpModel *model,
                            GError **error);

/* A model known only by its parameter count (the paper's formula-only questions). */
void zp_model_from_params(double params, ZpModel *model);

gboolean zp_model_has_architecture(const ZpModel *model);

/* Exact parameter count (or the given count for a params-only model). */
uint64_t zp_model_param_count(const ZpModel *model);

int zp_model_n_units(const ZpModel *model);
uint64_t zp_model_unit_elems(const ZpModel *model, int unit);

/* The model's tensors in layout order; caller frees with g_array_unref. */
GArray *zp_model_tensors(const ZpModel *model);



/* The spec as a JSON object (the keys of models/NAME.json); NULL for a params-only model. */
void *zp_model_to_json(const ZpModel *model);
#endif
