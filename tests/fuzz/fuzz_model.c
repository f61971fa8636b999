/* fuzz_model: the model loader (models/NAME.json, --model PATH.json) on arbitrary bytes; what it
 * accepts must also give a parameter count and a schedule layout without overflow. */
#include "fuzz.h"
#include "zp_model.h"

#include <glib.h>

int fuzz_model(const uint8_t *data, size_t size)
{
    ZpModel model;
    GError *error = NULL;
    if (zp_model_load(fuzz_input_path("model", data, size), &model, &error)) {
        volatile double params = (double)zp_model_param_count(&model);
        for (int u = 0; u < zp_model_n_units(&model) && u < 4; u++)
            params += (double)zp_model_unit_elems(&model, u);
        (void)params;
    }
    g_clear_error(&error);
    return 0;
}
FUZZ_ENTRY(fuzz_model)
