/* zp_model: a model spec by name or path — zplan's own (zp_model_arch) or a Hugging Face
 * config.json (zp_hf) — with everything zp_model_arch.h says about its architecture. */
#ifndef ZP_MODEL_H
#define ZP_MODEL_H

#include "zp_model_arch.h"

#include <glib.h>

/* Resolves `name_or_path`: a directory (or DATA_DIR/models/NAME that is one) holding a
 * Hugging Face config.json, a file that is a Hugging Face config (it has "architectures"),
 * a path ending in .json read as zplan's own spec, or DATA_DIR/models/NAME.json. An unknown
 * name lists the models that exist. */
gboolean zp_model_load(const char *name_or_path, ZpModel *model, GError **error);

#endif
