/* fuzz_dsconfig: the DeepSpeed config reader (zplan simulate --ds-config) on arbitrary bytes,
 * for gpt2-124m on 8 ranks; what it accepts is written back as a ds_config. */
#include "fuzz.h"
#include "zp_dsconfig.h"

#include <glib.h>
#include <jansson.h>
#include <stdlib.h>

int fuzz_dsconfig(const uint8_t *data, size_t size)
{
    static ZpModel model;
    static gboolean loaded;
    if (!loaded && !(loaded = zp_model_load("gpt2-124m", &model, NULL)))
        abort();
    ZpPlan launch, plan;
    zp_plan_defaults(&launch, 0, 8, 1);
    int64_t train_batch = 0;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    GError *error = NULL;
    if (zp_dsconfig_read(fuzz_input_path("dsconfig", data, size), &model, &launch, &plan,
                         &train_batch, warnings, &error))
        json_decref(zp_dsconfig_to_json(&plan));
    g_clear_error(&error);
    g_ptr_array_unref(warnings);
    return 0;
}
FUZZ_ENTRY(fuzz_dsconfig)
