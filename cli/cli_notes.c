/* cli_notes: the lines an answer owes its reader about a plan it was handed: what a DeepSpeed
 * config's "auto" values resolved to, and features the plan carries that do nothing where it
 * runs (cli_note prints them after the defaults). */
#include "cli.h"
#include "zp_impl.h"
#include "zp_util.h"
#include "zp_zeropp.h"

#include <math.h>
#include <string.h>

/* The keys of a DeepSpeed config that may say "auto" and bear on the plan, with what they
 * resolved to (the Hugging Face Trainer's rules, zp_dsconfig_hf_auto, and the flags). */
void cli_note_ds_config_auto(const char *path, const ZpPlan *plan)
{
    json_t *root = zp_json_load_object(path, NULL);
    if (!root)
        return;
    json_t *zero = json_object_get(root, "zero_optimization");
    const struct {
        json_t *section;
        const char *key;
        double value;
    } keys[] = {
        {root, "train_micro_batch_size_per_gpu", plan->micro_batch},
        {root, "gradient_accumulation_steps", plan->grad_accum},
        {root, "train_batch_size", (double)plan->micro_batch * plan->grad_accum * plan->dp},
        {zero, "reduce_bucket_size", plan->zero.reduce_bucket_size},
        {zero, "allgather_bucket_size", plan->zero.allgather_bucket_size},
        {zero, "stage3_prefetch_bucket_size", plan->zero.stage3_prefetch_bucket_size},
        {zero, "stage3_param_persistence_threshold", plan->zero.stage3_param_persistence_threshold},
        {zero, "sub_group_size", plan->zero.sub_group_size},
    };
    GString *line = g_string_new(NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++) {
        const char *v = json_string_value(json_object_get(keys[i].section, keys[i].key));
        if (!v || strcmp(v, "auto") != 0)
            continue;
        char *n = cli_thousands((uint64_t)llround(keys[i].value));
        g_string_append_printf(line, "%s%s %s", line->len ? ", " : "", keys[i].key, n);
        g_free(n);
    }
    const char *precision_keys[] = {"fp16", "bf16"};
    for (size_t i = 0; i < G_N_ELEMENTS(precision_keys); i++) {
        const char *v = json_string_value(
            json_object_get(json_object_get(root, precision_keys[i]), "enabled"));
        if (v && strcmp(v, "auto") == 0)
            g_string_append_printf(line, "%s%s.enabled %s", line->len ? ", " : "",
                                   precision_keys[i],
                                   plan->precision == (i == 0 ? ZP_PREC_FP16 : ZP_PREC_BF16)
                                       ? "true"
                                       : "false");
    }
    if (line->len)
        cli_note("%s's \"auto\" resolved as the Hugging Face Trainer would (its rules, the "
                 "flags and the model): %s.", path, line->str);
    g_string_free(line, TRUE);
    json_decref(root);
}

/* What a plan carries that its framework would not run as given (a mixture of experts over
 * TP without sequence parallelism, under Megatron), and ZeRO++ features that do nothing on
 * this placement: said rather than dropped silently. */
void cli_note_inert_features(const ZpModel *model, const ZpPlan *plan)
{
    if (plan->impl == ZP_IMPL_MEGATRON && zp_moe_enabled(&model->moe) && plan->mp > 1 &&
        !plan->sequence_parallel)
        cli_note("Megatron-Core does not train a mixture of experts over TP %d without "
                 "--sequence-parallel (megatron/core/transformer/moe/moe_layer.py MoELayer.forward "
                 "raises): simulated as given, every tensor rank routing the whole sequence.",
                 plan->mp);
    if (plan->zero.stage == 3 && plan->zero.zero_quantized_gradients &&
        zp_impl_get(plan->impl)->qgz_by_tensor && !zp_zeropp_qgz_across_nodes(plan))
        cli_note("zero_quantized_gradients (qgZ) does nothing here: DeepSpeed quantises "
                 "gradients only across nodes (stage3.py __avg_scatter_grads: num_nodes > 1), "
                 "and the %d data-parallel ranks are on one node, so they are reduce-scattered "
                 "unquantised.", plan->dp);
}
