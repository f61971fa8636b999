/* zp_hf: a Hugging Face config.json (Llama 2/3/3.1, Mistral, Qwen2, GPT-2, GPT-NeoX; Mixtral,
 * Qwen2-MoE and DeepSeek-V3, mixtures of experts, with zp_model_moe) read as a
 * ZpModel: the keys that bear on memory or time mapped, the rest ignored, the others refused. */
#ifndef ZP_HF_H
#define ZP_HF_H

#include "zp_model_arch.h"

#include <glib.h>

/* Reads DIR/config.json; the model is named after the directory. A directory without
 * config.json fails naming it. */
gboolean zp_hf_load_dir(const char *dir, ZpModel *model, GError **error);

/* Whether `name` reads as a Hugging Face repository id, ORG/NAME (one slash, neither part
 * empty, "." or "..", no ".json"). */
gboolean zp_hf_is_repo_id(const char *name);

/* The local Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (huggingface_hub's
 * constants.py order). Newly allocated. */
char *zp_hf_cache_dir(void);

/* Reads the config.json of repository `repo_id` (ORG/NAME) from the cache's layout,
 * models--ORG--NAME/snapshots/REVISION/config.json: the revision refs/main names, else the
 * first snapshot holding one (by name). The model is named NAME. Fails saying where it
 * looked when there is none. */
gboolean zp_hf_load_cached(const char *repo_id, ZpModel *model, GError **error);

/* Maps a parsed config object (json_t *) read from `path` (which names it in messages, and
 * whose directory names the model when the file is config.json). An architecture outside the
 * supported list is refused naming the "architectures" value; a missing or ill-typed key that
 * matters is named. The default sequence length is max_position_embeddings. */
gboolean zp_hf_from_json(void *json_object, const char *path, ZpModel *model, GError **error);

#endif
