/* zp_dsconfig_engine: what DeepSpeed's engine makes of a config's optimizer and gradient
 * accumulation (engine.py _configure_basic_optimizer, _do_optimizer_sanity_check). */
#include "zp_dsconfig_engine.h"
#include "zp_util.h"

#include <string.h>

/* optimizer.type (runtime/config.py: DeepSpeed's own names whatever their case, else a
 * torch.optim class by its name; engine.py _configure_basic_optimizer): Adam and AdamW
 * (FusedAdam, DeepSpeedCPUAdam) keep two fp32 moments; torch.optim.SGD a momentum buffer
 * where params.momentum is above 0, none where not. The rest (Lamb, Lion, Adagrad, 1-bit
 * Adam, Muon, ...) keep other states and are refused naming the key. Without a type the
 * model's code brings its optimizer: the launch's (--optimizer) stands. */
static gboolean read_optimizer(json_t *section, const char *what, ZpPlan *p, GError **error)
{
    const char *type = NULL;
    char *key = g_strdup_printf("%s: optimizer", what);
    gboolean ok = !section || zp_json_get_string(section, key, "type", FALSE, &type, error);
    if (!ok || !type) {
        g_free(key);
        return ok;
    }
    if (g_ascii_strcasecmp(type, "adam") == 0 || g_ascii_strcasecmp(type, "adamw") == 0) {
        p->optimizer = ZP_OPT_ADAM;
    } else if (strcmp(type, "SGD") == 0) {
        json_t *params = json_object_get(section, "params");
        double momentum = 0;
        char *params_key = g_strdup_printf("%s.params", key);
        ok = !json_is_object(params) ||
             zp_json_get_number(params, params_key, "momentum", FALSE, 0, 1e6, &momentum, error);
        g_free(params_key);
        p->optimizer = momentum > 0 ? ZP_OPT_SGD_MOMENTUM : ZP_OPT_SGD;
    } else if (g_ascii_strcasecmp(type, "sgd") == 0) { /* getattr(torch.optim, type) fails */
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s.type: %s is no DeepSpeed optimizer and "
                    "no torch.optim class (SGD is)", key, type);
        ok = FALSE;
    } else {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s.type: %s keeps optimizer states zplan "
                    "does not model (Adam, AdamW and torch.optim's SGD are)", key, type);
        ok = FALSE;
    }
    g_free(key);
    return ok;
}

/* data_types.grad_accum_dtype (runtime/config.py; engine.py get_data_types: the model's dtype
 * when absent), as engine.py _do_optimizer_sanity_check takes it: with ZeRO, bf16 accumulated
 * in fp32 at stage 1 without a CPU-offloaded optimizer takes DeepSpeed's BF16_Optimizer
 * (bf16_optimizer.py: a full fp32 gradient buffer beside the bf16 gradients, all-reduced at
 * the boundary), which zplan does not model, and every other ZeRO plan the ZeRO optimizer,
 * which accumulates in the model's dtype (the key changes nothing there); without ZeRO a
 * dtype other than the model's raises NotImplementedError ("unsupported mix"). The names
 * are DtypeEnum's. */
static gboolean read_data_types(json_t *section, const char *what, const ZpPlan *p,
                                GError **error)
{
    static const struct {
        const char *name;
        ZpPrecision precision;
    } dtypes[] = {{"fp16", ZP_PREC_FP16},          {"float16", ZP_PREC_FP16},
                  {"half", ZP_PREC_FP16},          {"torch.float16", ZP_PREC_FP16},
                  {"fp32", ZP_PREC_FP32},          {"float32", ZP_PREC_FP32},
                  {"float", ZP_PREC_FP32},         {"torch.float32", ZP_PREC_FP32},
                  {"bf16", ZP_PREC_BF16},          {"bfloat16", ZP_PREC_BF16},
                  {"bfloat", ZP_PREC_BF16},        {"torch.bfloat16", ZP_PREC_BF16}};
    const char *dtype = NULL;
    char *key = g_strdup_printf("%s: data_types", what);
    gboolean ok = !section || zp_json_get_string(section, key, "grad_accum_dtype", FALSE,
                                                 &dtype, error);
    g_free(key);
    if (!ok || !dtype)
        return ok;
    int found = -1;
    for (size_t i = 0; i < G_N_ELEMENTS(dtypes); i++)
        if (strcmp(dtype, dtypes[i].name) == 0)
            found = (int)i;
    const char *model = zp_precision_name(p->precision);
    const int stage = p->zero.stage;
    if (found < 0)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: data_types.grad_accum_dtype: '%s' "
                    "is no dtype DeepSpeed names (fp32, fp16, bf16)", what, dtype);
    else if (stage == 0 && dtypes[found].precision != p->precision)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: data_types.grad_accum_dtype: %s "
                    "with a %s model and no ZeRO is an unsupported mix (engine.py "
                    "_do_optimizer_sanity_check raises)", what, dtype, model);
    else if (stage == 1 && p->precision == ZP_PREC_BF16 &&
             dtypes[found].precision == ZP_PREC_FP32 &&
             p->zero.offload_optimizer.device != ZP_OFFLOAD_CPU)
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: data_types.grad_accum_dtype: fp32 "
                    "under bf16 at stage 1 runs DeepSpeed's BF16_Optimizer (a full fp32 "
                    "gradient buffer, all-reduced), which is not modeled; stage 1's ZeRO "
                    "optimizer runs without the key", what);
    else
        return TRUE;
    return FALSE;
}

gboolean zp_dsconfig_engine_read(json_t *data_types, json_t *optimizer, const char *what,
                                 ZpPlan *p, GError **error)
{
    return read_data_types(data_types, what, p, error) &&
           read_optimizer(optimizer, what, p, error);
}
