/* test_dsconfig: real-world DeepSpeed configs (tests/data/ds_config/, the Hugging Face Trainer's
 * examples and DeepSpeedExamples') through `zplan simulate --ds-config`: accepted with one
 * warning line for what is not modeled, "auto" resolved from the flags, the verdict first and
 * exit 2 when the plan does not fit. */
#include "testutil.h"
#include "zp_dsconfig.h"

#include <jansson.h>
#include <math.h>
#include <glib/gstdio.h>
#include <string.h>

typedef struct {
    const char *file, *flags;
    int status;            /* 0 fits, 2 does not */
    int mp, micro, accum;  /* the plan the config and flags resolve to */
    const char *precision;
    gboolean checkpoint;
    const char *unmodeled; /* one key the warning line lists */
} ConfigCase;

static const ConfigCase cases[] = {
    /* "auto" batch keys and fp16/bf16 "auto" from --micro-batch, --grad-accum, --precision */
    {"hf_zero2.json", "--model gpt2-1.5b --gpus 8 --micro-batch 4 --grad-accum 2 --precision bf16",
     0, 1, 4, 2, "bf16", FALSE, "fp16.loss_scale_window"},
    /* no batch keys (the launcher's), buckets 0 as DeepSpeed allows, CPU offload of the
     * optimizer and parameters; 175B's activations without checkpointing: too big */
    {"hf_zero3.json", "--model gpt3-175b --gpus 64 --micro-batch 1", 2, 1, 1, 1, "fp16", FALSE,
     "zero_optimization.stage3_gather_fp16_weights_on_model_save"},
    /* AutoTP: tensor_parallel.autotp_size 4 is the tensor-parallel degree; --checkpoint */
    {"dse_autotp_zero2.json", "--model hf/llama-2-7b --gpus 8 --micro-batch 2 --checkpoint", 0, 4,
     2, 1, "fp32", TRUE, "scheduler"},
    /* concrete batch 64 = 1 x 8 x dp 8 */
    {"dse_neox20b_zero3.json", "--model gpt-13b --gpus 8", 0, 1, 1, 8, "bf16", FALSE,
     "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
    /* fields of releases after v0.19.6: ZenFlow (train batch 32 = 4 x 1 x dp 8) and ZeRO-3
     * leaf modules (a MoE config, here on a dense model) */
    {"dse_zenflow_zero2.json", "--model gpt2-1.5b --gpus 8", 0, 1, 4, 1, "bf16", FALSE,
     "zero_optimization.zenflow"},
    {"dse_leaf_zero3.json", "--model hf/qwen2-0.5b --gpus 8 --seq 2048", 0, 1, 2, 1, "bf16",
     FALSE, "zero_optimization.leaf_module"},
};

static void test_real_world_configs(void)
{
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        const ConfigCase *c = &cases[i];
        char *args = g_strdup_printf("simulate --cluster dgx-a100-80g --ds-config "
                                     "tests/data/ds_config/%s %s", c->file, c->flags);
        TuRun r = tu_zplan(args);
        g_test_message("zplan %s -> %d\n%s", args, WEXITSTATUS(r.status), r.err);
        g_assert_true(WIFEXITED(r.status));
        g_assert_cmpint(WEXITSTATUS(r.status), ==, c->status);
        /* The verdict first. */
        g_assert_true(g_str_has_prefix(r.out, c->status == 0 ? "Fits: " : "Does not fit: "));
        /* One warning line for every key read but not modeled. */
        char **lines = g_strsplit(r.err, "\n", -1);
        guint listed = 0;
        for (char **l = lines; *l; l++)
            if (strstr(*l, "read but not modeled (ignored): ")) {
                listed++;
                g_assert_nonnull(strstr(*l, c->unmodeled));
            }
        g_assert_cmpuint(listed, ==, 1);
        g_strfreev(lines);
        tu_free(&r);
        char *json = g_strdup_printf("%s --json", args);
        json_t *root = tu_zplan_json_exit(json, c->status);
        json_t *plan = json_object_get(root, "plan");
        g_assert_cmpint(json_integer_value(json_object_get(plan, "mp")), ==, c->mp);
        g_assert_cmpint(json_integer_value(json_object_get(plan, "dp")) * c->mp, ==,
                        strstr(c->flags, "--gpus 64") ? 64 : 8);
        g_assert_cmpint(json_integer_value(json_object_get(plan, "micro_batch")), ==, c->micro);
        g_assert_cmpint(json_integer_value(json_object_get(plan, "grad_accum")), ==, c->accum);
        g_assert_cmpstr(json_string_value(json_object_get(plan, "precision")), ==, c->precision);
        g_assert_cmpint(json_is_true(json_object_get(plan, "checkpoint")), ==, c->checkpoint);
        g_assert_cmpstr(json_string_value(json_object_get(plan, "impl")), ==, "deepspeed");
        json_decref(root);
        g_free(json);
        g_free(args);
    }
}

/* A flag that contradicts a concrete value of the file is an error naming both; what zplan
 * does not model is refused by name. */
static void test_contradictions(void)
{
    const struct {
        const char *args, *message;
    } bad[] = {
        {"--ds-config tests/data/ds_config/dse_neox20b_zero3.json --model gpt-13b --gpus 8 "
         "--micro-batch 2", "--micro-batch 2 contradicts tests/data/ds_config/dse_neox20b_zero3.json's "
         "train_micro_batch_size_per_gpu 1"},
        {"--ds-config tests/data/ds_config/dse_neox20b_zero3.json --model gpt-13b --gpus 8 "
         "--grad-accum 2", "--grad-accum 2 contradicts"},
        {"--ds-config tests/data/ds_config/dse_neox20b_zero3.json --model gpt-13b --gpus 8 "
         "--precision fp16", "--precision fp16 contradicts tests/data/ds_config/dse_neox20b_zero3.json's "
         "bf16.enabled"},
        {"--ds-config tests/data/ds_config/hf_zero2.json --model gpt2-1.5b --gpus 8 "
         "--reduce-bucket-size 1e6", "--reduce-bucket-size: the plan comes from --ds-config"},
        /* Ulysses: refused by name, not by the batch check it would otherwise fail */
        {"--ds-config tests/data/ds_config/dse_autosp_zero0.json --model gpt2-1.5b --gpus 2",
         "dse_autosp_zero0.json: sequence_parallel_size 2 (DeepSpeed-Ulysses sequence "
         "parallelism) is not modeled"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        char *args = g_strdup_printf("simulate --cluster dgx-a100-80g %s", bad[i].args);
        TuRun r = tu_zplan(args);
        g_test_message("zplan %s -> %s", args, r.err);
        g_assert_true(WIFEXITED(r.status));
        g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
        g_assert_nonnull(strstr(r.err, bad[i].message));
        tu_free(&r);
        g_free(args);
    }
}

/* stage3_use_all_reduce_for_fetch_params (and its field name) is read and modelled: the plan
 * carries it, the warning does not list it, and `simulate` sends more (the fetches'
 * all-reduces); a value that is not a boolean is an error naming the key. */
static void test_all_reduce_fetch(void)
{
    char *dir = g_dir_make_tmp("zplan-dsconfig-XXXXXX", NULL);
    char *path = g_build_filename(dir, "ds.json", NULL);
    const char *values[] = {"false", "true", "\"yes\""};
    const char *keys[] = {"stage3_use_all_reduce_for_fetch_params",
                          "use_all_reduce_for_fetch_params"};
    double sent_off = 0;
    for (size_t k = 0; k < G_N_ELEMENTS(keys); k++)
        for (size_t v = 0; v < G_N_ELEMENTS(values); v++) {
            char *text = g_strdup_printf(
                "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, "
                "\"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": 1e7, "
                "\"%s\": %s}}", keys[k], values[v]);
            g_assert_true(g_file_set_contents(path, text, -1, NULL));
            char *args = g_strdup_printf("simulate --cluster dgx-a100-80g --model gpt2-1.5b "
                                         "--gpus 8 --ds-config %s --json", path);
            TuRun r = tu_zplan(args);
            g_assert_true(WIFEXITED(r.status));
            if (v == 2) {
                g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
                g_assert_nonnull(strstr(r.err, keys[k]));
                g_assert_nonnull(strstr(r.err, "must be true or false"));
            } else {
                g_assert_cmpint(WEXITSTATUS(r.status), ==, 0);
                g_assert_null(strstr(r.err, "all_reduce_for_fetch"));
                json_t *root = json_loads(r.out, 0, NULL);
                g_assert_nonnull(root);
                json_t *zero = json_object_get(json_object_get(root, "plan"), "zero");
                g_assert_cmpint(json_is_true(json_object_get(
                                    zero, "stage3_use_all_reduce_for_fetch_params")), ==, v == 1);
                const double sent = json_number_value(
                    json_object_get(json_object_get(root, "comm_bytes_per_rank"), "dp"));
                if (v == 0)
                    sent_off = sent;
                else
                    g_assert_cmpfloat(sent, >, sent_off);
                json_decref(root);
            }
            tu_free(&r);
            g_free(args), g_free(text);
        }
    g_remove(path);
    g_rmdir(dir);
    g_free(path), g_free(dir);
}

/* One `simulate --ds-config` run of `config` (written to path) with `flags`: its step time
 * (NAN where it failed), its stderr in *err (g_free) and its exit status in *status. */
static double ds_step_s(const char *path, const char *config, const char *flags, char **err,
                        int *status)
{
    g_assert_true(g_file_set_contents(path, config, -1, NULL));
    char *args = g_strdup_printf("simulate --cluster dgx-h100 --seq 512 --ds-config %s %s --json",
                                 path, flags);
    TuRun r = tu_zplan(args);
    g_free(args);
    g_assert_true(WIFEXITED(r.status));
    *status = WEXITSTATUS(r.status);
    json_t *root = *status == 1 ? NULL : json_loads(r.out, 0, NULL);
    const double step_s = root ? json_number_value(json_object_get(root, "step_time_s")) : NAN;
    json_decref(root);
    *err = g_strdup(r.err);
    tu_free(&r);
    return step_s;
}

/* data_types.grad_accum_dtype as DeepSpeed's engine takes it (engine.py
 * _do_optimizer_sanity_check): under ZeRO's optimizer it changes nothing, the step the same
 * as without the key (bf16 at stage 3, fp16 at stage 1); bf16 accumulated in fp32 at stage 1
 * (BF16_Optimizer) is refused as not modeled, a dtype other than the model's without ZeRO as
 * DeepSpeed's unsupported mix, and a name DeepSpeed does not know; each in one line naming
 * the key, exit 1. */
static void test_grad_accum_dtype(void)
{
    char *dir = NULL;
    char *path = tu_tmp_file("dtypes", "ds.json", &dir);
    const char *base = "{\"train_micro_batch_size_per_gpu\": 1, \"%s\": {\"enabled\": true}, "
                       "\"zero_optimization\": {\"stage\": %d}%s}";
    const char *key = ", \"data_types\": {\"grad_accum_dtype\": \"%s\"}";
    const struct {
        const char *precision;
        int stage;
        const char *dtype, *says; /* NULL: the step without the key */
    } cases[] = {
        {"bf16", 3, "fp32", NULL},
        {"fp16", 1, "float32", NULL},
        {"bf16", 1, "bf16", NULL},
        {"bf16", 1, "fp32", "data_types.grad_accum_dtype: fp32 under bf16 at stage 1 runs "
                            "DeepSpeed's BF16_Optimizer"},
        {"bf16", 0, "fp32", "data_types.grad_accum_dtype: fp32 with a bf16 model and no ZeRO is "
                            "an unsupported mix"},
        {"fp16", 2, "float64", "data_types.grad_accum_dtype: 'float64' is no dtype"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *with_key = g_strdup_printf(key, cases[i].dtype);
        char *config = g_strdup_printf(base, cases[i].precision, cases[i].stage, with_key);
        char *plain = g_strdup_printf(base, cases[i].precision, cases[i].stage, "");
        char *err = NULL;
        int status;
        const double step_s = ds_step_s(path, config, "--model gpt2-124m --gpus 8", &err, &status);
        g_test_message("%s -> %d %s", config, status, err);
        if (cases[i].says) {
            g_assert_cmpint(status, ==, 1);
            g_assert_nonnull(strstr(err, cases[i].says));
            g_assert_true(strchr(err, '\n') == NULL || strchr(err, '\n')[1] == '\0');
        } else {
            g_assert_cmpint(status, ==, 0);
            g_assert_null(strstr(err, "data_types"));
            char *plain_err = NULL;
            int plain_status;
            g_assert_cmpfloat(ds_step_s(path, plain, "--model gpt2-124m --gpus 8", &plain_err,
                                        &plain_status), ==, step_s);
            g_free(plain_err);
        }
        g_free(err), g_free(config), g_free(plain), g_free(with_key);
    }
    tu_tmp_file_remove(path, dir);
}

/* optimizer.type (engine.py _configure_basic_optimizer) sets the optimizer: torch.optim's SGD
 * with momentum the step and model states of --optimizer sgd-momentum beside a config without
 * the section, without momentum sgd's, AdamW Adam's; a flag that contradicts it, a type whose
 * states zplan does not model and a name neither DeepSpeed nor torch.optim knows each fail in
 * one line naming the key; a written config keeps SGD. */
static void test_optimizer_type(void)
{
    char *dir = NULL;
    char *path = tu_tmp_file("optimizer", "ds.json", &dir);
    const char *base = "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, "
                       "\"zero_optimization\": {\"stage\": 1}%s}";
    const struct {
        const char *section, *flags, *says; /* says NULL: the step of `flags` without it */
    } cases[] = {
        {"\"type\": \"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": 0.9}",
         "--optimizer sgd-momentum", NULL},
        {"\"type\": \"SGD\", \"params\": {\"lr\": 0.1}", "--optimizer sgd", NULL},
        {"\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}", "--optimizer adam", NULL},
        {"\"type\": \"SGD\"", "--optimizer adam",
         "--optimizer adam contradicts"},
        {"\"type\": \"Lion\"", "", "optimizer.type: Lion keeps optimizer states zplan does "
                                   "not model"},
        {"\"type\": \"sgd\"", "", "optimizer.type: sgd is no DeepSpeed optimizer"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *section = g_strdup_printf(", \"optimizer\": {%s}", cases[i].section);
        char *config = g_strdup_printf(base, section);
        char *plain = g_strdup_printf(base, "");
        char *flags = g_strdup_printf("--model gpt2-124m --gpus 8 %s", cases[i].flags);
        char *err = NULL;
        int status;
        const double step_s = ds_step_s(path, config,
                                        cases[i].says ? flags : "--model gpt2-124m --gpus 8",
                                        &err, &status);
        g_test_message("%s -> %d %s", config, status, err);
        if (cases[i].says) {
            g_assert_cmpint(status, ==, 1);
            g_assert_nonnull(strstr(err, cases[i].says));
        } else {
            g_assert_cmpint(status, ==, 0);
            g_assert_null(strstr(err, "(ignored)")); /* not listed as unmodeled */
            char *plain_err = NULL;
            int plain_status;
            g_assert_cmpfloat(ds_step_s(path, plain, flags, &plain_err, &plain_status), ==,
                              step_s);
            g_free(plain_err);
        }
        g_free(err), g_free(config), g_free(plain), g_free(flags), g_free(section);
    }
    tu_tmp_file_remove(path, dir);
    ZpPlan p;
    zp_plan_defaults(&p, 1, 8, 1);
    p.optimizer = ZP_OPT_SGD_MOMENTUM;
    json_t *written = zp_dsconfig_to_json(&p);
    json_t *optimizer = json_object_get(written, "optimizer");
    g_assert_cmpstr(json_string_value(json_object_get(optimizer, "type")), ==, "SGD");
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(optimizer, "params"),
                                                        "momentum")), >, 0);
    json_decref(written);
}

/* expert_parallel (DeepSpeed's AutoEP) sets the expert-parallel degree: the same step as
 * --ep's, and as --ep beside a config without the section (a deepspeed.moe.layer.MoE's
 * ep_size, in the model's code); what contradicts it fails in one line naming the key, and
 * what zplan does not model of it warns. */
static void test_expert_parallel(void)
{
    char *dir;
    char *path = tu_tmp_file("dsconfig", "ds.json", &dir);
    const char *head = "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, "
                       "\"zero_optimization\": {\"stage\": 1}";
    const char *mixtral = "--model hf/mixtral-8x7b --gpus 16";
    char *err;
    int status;
    char *config = g_strdup_printf("%s, \"expert_parallel\": {\"enabled\": true, "
                                   "\"autoep_size\": 4, \"preset_model\": \"mixtral\"}}", head);
    const double autoep_s = ds_step_s(path, config, mixtral, &err, &status);
    g_assert_cmpint(status, ==, 0);
    g_assert_null(strstr(err, "expert_parallel")); /* preset_model finds layers: silent */
    g_free(err);
    char *plain = g_strdup_printf("%s}", head);
    char *flags = g_strdup_printf("%s --ep 4", mixtral);
    g_assert_cmpfloat(ds_step_s(path, plain, flags, &err, &status), ==, autoep_s);
    g_free(err);
    g_assert_cmpfloat(ds_step_s(path, plain, mixtral, &err, &status), !=, autoep_s); /* EP 1 */
    g_free(err);
    char *ep_flags = g_strdup_printf("simulate --cluster dgx-h100 --seq 512 %s --stage 1 "
                                     "--micro-batch 1 --precision bf16 --ep 4 --json", mixtral);
    json_t *by_flags = tu_zplan_json(ep_flags);
    g_assert_cmpfloat(json_number_value(json_object_get(by_flags, "step_time_s")), ==, autoep_s);
    json_decref(by_flags);
    g_free(ep_flags);
    const struct {
        const char *section, *flags, *message;
    } bad[] = {
        {"\"enabled\": true, \"autoep_size\": 4", "--ep 2",
         "expert_parallel: autoep_size 4 disagrees with the launch's expert-parallel degree 2"},
        {"\"enabled\": true, \"autoep_size\": 4", "--capacity-factor 1.25",
         "AutoEP routes every token"},
        {"\"enabled\": true, \"autoep_size\": 3", "", "autoep_size 3 must divide the 8 experts"},
        {"\"enabled\": true, \"top_k\": 1", "", "top_k 1 is not mixtral-8x7b's 2"},
        {"\"enabled\": true, \"expert_tensor_parallel_size\": 2", "",
         "expert_tensor_parallel_size 2 is not modeled"},
        {"\"enabled\": true, \"autoep_sise\": 4", "",
         "unknown key \"expert_parallel.autoep_sise\""},
        {"\"enabled\": \"yes\"", "", "key \"enabled\" must be true or false"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        char *text = g_strdup_printf("%s, \"expert_parallel\": {%s}}", head, bad[i].section);
        char *more = g_strdup_printf("%s %s", mixtral, bad[i].flags);
        ds_step_s(path, text, more, &err, &status);
        g_test_message("%s %s -> %s", text, more, err);
        g_assert_cmpint(status, ==, 1);
        g_assert_nonnull(strstr(err, bad[i].message));
        g_assert_true(strchr(err, '\n') == err + strlen(err) - 1); /* one line */
        g_free(err), g_free(text), g_free(more);
    }
    const struct {
        const char *model, *section, *warning;
    } warned[] = {
        {"--model gpt-13b --gpus 16", "\"enabled\": true, \"autoep_size\": 4",
         "gpt-13b is dense: AutoEP finds no MoE block to replace"},
        {mixtral, "\"enabled\": true, \"autoep_size\": 4, \"use_grouped_mm\": false",
         "an expert's GEMMs one by one are not modeled"},
        {mixtral, "\"enabled\": true, \"autoep_size\": 4, \"score_func\": \"sigmoid\"",
         "read but not modeled (ignored): expert_parallel.score_func"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(warned); i++) {
        char *text = g_strdup_printf("%s, \"expert_parallel\": {%s}}", head, warned[i].section);
        ds_step_s(path, text, warned[i].model, &err, &status);
        g_assert_cmpint(status, ==, 0);
        g_assert_nonnull(strstr(err, warned[i].warning));
        g_free(err), g_free(text);
    }
    g_free(config), g_free(plain), g_free(flags);
    tu_tmp_file_remove(path, dir);
}

/* `schedule --ds-config` in fp32 with no attention_kernel: SDPA's default there is the
 * memory-efficient kernel, which zreal does not run; the schedule takes eager, as it does from
 * the flags, where it refused naming a key the file did not have. A named one is refused. */
static void test_schedule_default_attention(void)
{
    char *dir;
    char *config = tu_tmp_file("dsconfig", "ds.json", &dir);
    char *out = g_build_filename(dir, "s.json", NULL);
    const char *texts[] = {"{\"train_micro_batch_size_per_gpu\": 2}",
                           "{\"train_micro_batch_size_per_gpu\": 2, "
                           "\"attention_kernel\": \"mem-efficient\"}"};
    for (size_t i = 0; i < G_N_ELEMENTS(texts); i++) {
        g_assert_true(g_file_set_contents(config, texts[i], -1, NULL));
        char *args = g_strdup_printf("schedule --model tiny --cluster dgx-h100 --gpus 2 "
                                     "--ds-config %s --out %s", config, out);
        TuRun r = tu_zplan(args);
        g_assert_true(WIFEXITED(r.status));
        if (i == 0) {
            g_assert_cmpint(WEXITSTATUS(r.status), ==, 0);
            json_t *s = json_load_file(out, 0, NULL);
            g_assert_cmpstr(json_string_value(json_object_get(json_object_get(s, "plan"),
                                                              "attention")), ==, "eager");
            json_decref(s);
            g_remove(out);
        } else {
            g_assert_cmpint(WEXITSTATUS(r.status), ==, 1);
            g_assert_nonnull(strstr(r.err, "attention_kernel: zreal does not run mem-efficient"));
            g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
        }
        tu_free(&r);
        g_free(args);
    }
    g_free(out);
    tu_tmp_file_remove(config, dir);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/dsconfig/real-world-configs", test_real_world_configs);
    g_test_add_func("/dsconfig/contradictions", test_contradictions);
    g_test_add_func("/dsconfig/all-reduce-fetch", test_all_reduce_fetch);
    g_test_add_func("/dsconfig/expert-parallel", test_expert_parallel);
    g_test_add_func("/dsconfig/grad-accum-dtype", test_grad_accum_dtype);
    g_test_add_func("/dsconfig/optimizer-type", test_optimizer_type);
    g_test_add_func("/dsconfig/schedule-default-attention", test_schedule_default_attention);
    return g_test_run();
}
