/* fuzz_megatronargs: the Megatron-LM launch-flag reader (zplan simulate --megatron-args) on
 * arbitrary bytes, for llama-2-70b on 64 GPUs; a plan it accepts must pass the plan's checks. */
#include "fuzz.h"
#include "zp_megatron_args.h"

#include <glib.h>
#include <stdlib.h>

int fuzz_megatronargs(const uint8_t *data, size_t size)
{
    static ZpModel model;
    static gboolean loaded;
    if (!loaded && !(loaded = zp_model_load("hf/llama-2-70b", &model, NULL)))
        abort();
    ZpPlan plan;
    gboolean attention_set = FALSE;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    GError *error = NULL;
    if (zp_megatron_args_read(fuzz_input_path("megatronargs", data, size), &model, 64, &plan,
                              &attention_set, warnings, &error) &&
        (size_t)plan.mp * (size_t)plan.dp * (size_t)zp_plan_pp(&plan) != 64)
        __builtin_trap(); /* what it accepts places every GPU */
    g_clear_error(&error);
    g_ptr_array_unref(warnings);
    return 0;
}
FUZZ_ENTRY(fuzz_megatronargs)
