/* fuzz_hfconfig: a Hugging Face config.json read as a model, through its directory as --model
 * DIR gives it; what it accepts must also give a parameter count and unit sizes. */
#include "fuzz.h"
#include "zp_model.h"

#include <glib.h>

int fuzz_hfconfig(const uint8_t *data, size_t size)
{
    ZpModel model;
    GError *error = NULL;
    char *dir = g_path_get_dirname(fuzz_input_path("config", data, size));
    if (zp_model_load(dir, &model, &error)) {
        volatile double params = (double)zp_model_param_count(&model);
        for (int u = 0; u < zp_model_n_units(&model) && u < 4; u++)
            params += (double)zp_model_unit_elems(&model, u);
        (void)params;
    }
    g_clear_error(&error);
    g_free(dir);
    return 0;
}
FUZZ_ENTRY(fuzz_hfconfig)
