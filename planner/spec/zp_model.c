/* zp_model: finds a model spec by name or path and reads it as zplan's own (zp_model_arch) or
 * as a Hugging Face config (zp_hf), whichever it is. */
#include "zp_model.h"
#include "zp_hf.h"
#include "zp_util.h"

#include <jansson.h>

gboolean zp_model_load(const char *name_or_path, ZpModel *model, GError **error)
{
    if (!*name_or_path) { /* else models/ itself, a directory without a config.json */
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "--model: empty name (give a name in models/ or a PATH.json)");
        return FALSE;
    }
    /* A directory is a Hugging Face checkpoint's: its config.json is the model. */
    char *in_data = g_build_filename(zp_data_dir(), "models", name_or_path, NULL);
    const char *dir = g_file_test(name_or_path, G_FILE_TEST_IS_DIR) ? name_or_path
                      : !g_path_is_absolute(name_or_path) &&
                              g_file_test(in_data, G_FILE_TEST_IS_DIR)
                          ? in_data
                          : NULL;
    gboolean ok;
    if (dir) {
        ok = zp_hf_load_dir(dir, model, error);
    } else if (zp_hf_is_repo_id(name_or_path) && !g_file_test(name_or_path, G_FILE_TEST_EXISTS)) {
        /* ORG/NAME: a Hugging Face repository, from the local hub cache */
        ok = zp_hf_load_cached(name_or_path, model, error);
    } else {
        char *path = zp_resolve_spec(name_or_path, "models", "--model", "model", error);
        json_t *root = path ? zp_json_load_object(path, error) : NULL;
        ok = root && (json_object_get(root, "architectures")
                          ? zp_hf_from_json(root, path, model, error)
                          : zp_model_from_json(root, path, model, error));
        json_decref(root);
        g_free(path);
    }
    g_free(in_data);
    return ok;
}
