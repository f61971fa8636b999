/* zp_megatron_args: Megatron-LM's launch flags (megatron/training/arguments.py) into a plan,
 * one table saying what each flag sets, checks or refuses. */
#include "zp_megatron_args.h"
#include "zp_util.h"

#include <math.h>
#include <string.h>

/* What the flags say, before they become a plan. */
typedef struct {
    double tp, pp, vpp, layers_per_vstage, micro, global, bucket, cp, recompute_layers;
    gboolean sp, dist_opt, overlap_grad, overlap_param, bf16, fp16, fp32_grads, bf16_grads;
    gboolean flash, unfused, no_overlap_p2p;
    gboolean selective, full, uniform, sgd;
} Args;

typedef enum {
    A_NUMBER,  /* a whole number into a double of Args */
    A_SWITCH,  /* no value: sets a gboolean of Args */
    A_MODEL,   /* a whole number that must equal the model's (ModelDim) */
    A_CHOICE,  /* a word: handled by its own rule (choice) */
    A_REFUSE,  /* changes memory or time in a way zplan does not model */
} ArgKind;

typedef enum {
    DIM_LAYERS, DIM_HIDDEN, DIM_HEADS, DIM_SEQ, DIM_FFN, DIM_GROUPS, DIM_KV_CHANNELS
} ModelDim;

typedef struct {
    const char *flag;
    ArgKind kind;
    size_t offset;   /* into Args (A_NUMBER, A_SWITCH) */
    double min, max; /* A_NUMBER */
    int dim;         /* A_MODEL: ModelDim */
    const char *why; /* A_REFUSE */
} ArgRule;

#define NUM(f, field, lo, hi) {f, A_NUMBER, G_STRUCT_OFFSET(Args, field), lo, hi, 0, NULL}
#define SW(f, field) {f, A_SWITCH, G_STRUCT_OFFSET(Args, field), 0, 0, 0, NULL}
#define DIM(f, d) {f, A_MODEL, 0, 0, 0, d, NULL}

static const ArgRule rules[] = {
    NUM("--tensor-model-parallel-size", tp, 1, 65536),
    NUM("--pipeline-model-parallel-size", pp, 1, 65536),
    NUM("--virtual-pipeline-model-parallel-size", vpp, 1, 65536),
    NUM("--num-layers-per-virtual-pipeline-stage", layers_per_vstage, 1, 1e6),
    NUM("--micro-batch-size", micro, 1, 1e6),
    NUM("--global-batch-size", global, 1, 1e12),
    NUM("--ddp-bucket-size", bucket, 1, 1e15),
    NUM("--context-parallel-size", cp, 1, 65536),
    NUM("--recompute-num-layers", recompute_layers, 1, 1e6),
    SW("--sequence-parallel", sp),
    SW("--use-distributed-optimizer", dist_opt),
    SW("--overlap-grad-reduce", overlap_grad),
    SW("--bf16", bf16),
    SW("--fp16", fp16),
    SW("--accumulate-allreduce-grads-in-fp32", fp32_grads),
    SW("--grad-reduce-in-bf16", bf16_grads),
    SW("--use-flash-attn", flash),
    SW("--recompute-activations", selective), /* arguments.py: granularity 'selective' */
    DIM("--num-layers", DIM_LAYERS),
    DIM("--hidden-size", DIM_HIDDEN),
    DIM("--num-attention-heads", DIM_HEADS),
    DIM("--seq-length", DIM_SEQ),
    DIM("--ffn-hidden-size", DIM_FFN),
    DIM("--num-query-groups", DIM_GROUPS),
    /* arguments.py: kv_channels, each head's width, hidden_size // num_attention_heads unless
     * given (the model's head_dim) */
    DIM("--kv-channels", DIM_KV_CHANNELS),
    {"--recompute-granularity", A_CHOICE, 0, 0, 0, 0, NULL},
    {"--recompute-method", A_CHOICE, 0, 0, 0, 0, NULL},
    {"--attention-backend", A_CHOICE, 0, 0, 0, 0, NULL},
    {"--optimizer", A_CHOICE, 0, 0, 0, 0, NULL},
    {"--no-scatter-gather-tensors-in-pipeline", A_REFUSE, 0, 0, 0, 0,
     "pipeline sends without scatter/gather are not modeled under --impl megatron"},
    {"--num-experts", A_REFUSE, 0, 0, 0, 0, "mixture-of-experts models are not modeled"},
    SW("--overlap-param-gather", overlap_param),
    /* arguments.py: batch_p2p_comm = not overlap_p2p_comm, and batch_p2p_sync's default
     * synchronizes the device after each batch (p2p_communication.py _communicate) */
    SW("--no-overlap-p2p-communication", no_overlap_p2p),
    {"--cpu-offloading", A_REFUSE, 0, 0, 0, 0, "activation offload is not modeled"},
};

static int64_t model_dim(const ZpModel *m, ModelDim d)
{
    switch (d) {
    case DIM_LAYERS: return m->layers;
    case DIM_HIDDEN: return m->hidden;
    case DIM_HEADS: return m->heads;
    case DIM_SEQ: return m->seq_len;
    case DIM_FFN: return m->ffn_hidden;
    case DIM_GROUPS: return zp_model_kv_heads(m);
    case DIM_KV_CHANNELS: return zp_model_head_dim(m);
    }
    return 0;
}

static const ArgRule *find_rule(const char *flag)
{
    for (size_t i = 0; i < G_N_ELEMENTS(rules); i++)
        if (strcmp(rules[i].flag, flag) == 0)
            return &rules[i];
    return NULL;
}

static gboolean fail(GError **error, const char *what, const char *flag, const char *fmt,
                     const char *arg)
{
    char *msg = g_strdup_printf(fmt, arg);
    g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s %s", what, flag, msg);
    g_free(msg);
    return FALSE;
}

/* The words of A_CHOICE flags. */
static gboolean choice(const char *what, const char *flag, const char *value, Args *a,
                       GError **error)
{
    static const char *const granularity[] = {"full", "selective", NULL};
    static const char *const method[] = {"uniform", "block", NULL};
    static const char *const backend[] = {"auto", "flash", "fused", "unfused", "local", NULL};
    static const char *const optimizer[] = {"adam", "sgd", NULL};
    int v;
    char *name = g_strdup_printf("%s: %s", what, flag);
    gboolean ok = TRUE;
    if (strcmp(flag, "--recompute-granularity") == 0) {
        ok = zp_parse_choice(value, name, granularity, &v, error);
        a->full = ok && v == 0;
        a->selective = a->selective || (ok && v == 1);
    } else if (strcmp(flag, "--recompute-method") == 0) {
        ok = zp_parse_choice(value, name, method, &v, error);
        a->uniform = ok && v == 0;
    } else if (strcmp(flag, "--attention-backend") == 0) {
        /* transformer_config.py AttnBackend: flash and fused are fused kernels (TE's
         * FlashAttention and cuDNN's), unfused and local keep the s x s scores */
        ok = zp_parse_choice(value, name, backend, &v, error);
        a->flash = a->flash || (ok && (v == 1 || v == 2));
        a->unfused = ok && (v == 3 || v == 4);
    } else {
        ok = zp_parse_choice(value, name, optimizer, &v, error);
        a->sgd = ok && v == 1;
    }
    g_free(name);
    return ok;
}

/* One flag and its value (NULL when it has none). */
static gboolean take(const char *what, const ZpModel *model, const char *flag, const char *value,
                     Args *a, GString *ignored, gboolean *used_value, GError **error)
{
    const ArgRule *r = find_rule(flag);
    *used_value = FALSE;
    if (!r) {
        g_string_append_printf(ignored, "%s%s", ignored->len ? ", " : "", flag);
        *used_value = value != NULL; /* its value is its own, not a flag */
        return TRUE;
    }
    if (r->kind == A_SWITCH) {
        G_STRUCT_MEMBER(gboolean, a, r->offset) = TRUE;
        return TRUE;
    }
    if (r->kind == A_REFUSE)
        return fail(error, what, flag, "is refused: %s", r->why);
    if (!value)
        return fail(error, what, flag, "needs a value%s", "");
    *used_value = TRUE;
    if (r->kind == A_CHOICE)
        return choice(what, flag, value, a, error);
    double v;
    char *name = g_strdup_printf("%s: %s", what, flag);
    const double hi = r->kind == A_MODEL ? 1e12 : r->max;
    const gboolean ok = zp_parse_number(value, name, r->kind == A_MODEL ? 1 : r->min, hi, TRUE,
                                        &v, error);
    g_free(name);
    if (!ok)
        return FALSE;
    if (r->kind == A_NUMBER) {
        G_STRUCT_MEMBER(double, a, r->offset) = v;
        return TRUE;
    }
    const int64_t want = model_dim(model, (ModelDim)r->dim);
    if ((int64_t)v != want) {
        char *have = g_strdup_printf("%s but the model (%s) has %" G_GINT64_FORMAT, value,
                                     model->name, want);
        fail(error, what, flag, "is %s", have);
        g_free(have);
        return FALSE;
    }
    return TRUE;
}

/* The degrees and batch the flags give, checked against the GPUs. */
static gboolean degrees(const char *what, const ZpModel *model, int gpus, const Args *a,
                        ZpPlan *plan, GError **error)
{
    const double tp = a->tp, pp = a->pp;
    char *text = NULL;
    if (a->cp > 1)
        text = g_strdup("--context-parallel-size: context parallelism is not modeled");
    else if (fmod(gpus, tp * pp) != 0)
        text = g_strdup_printf("--tensor-model-parallel-size x --pipeline-model-parallel-size "
                               "= %.0f does not divide the %d GPUs", tp * pp, gpus);
    else if (model->heads % (int64_t)tp != 0)
        text = g_strdup_printf("--tensor-model-parallel-size: %.0f does not divide the %"
                               G_GINT64_FORMAT " attention heads", tp, model->heads);
    else if (a->sp && tp == 1)
        text = g_strdup("--sequence-parallel: needs --tensor-model-parallel-size of 2 or more");
    else if (a->fp16 && a->bf16)
        text = g_strdup("--fp16 and --bf16: give one of them");
    else if (a->overlap_param && !a->dist_opt)
        text = g_strdup("--overlap-param-gather: needs --use-distributed-optimizer "
                        "(arguments.py validate_args)");
    if (text) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", what, text);
        g_free(text);
        return FALSE;
    }
    const int dp = gpus / (int)(tp * pp);
    const double global = a->global > 0 ? a->global : a->micro * dp;
    if (fmod(global, a->micro * dp) != 0) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: --global-batch-size %.0f is not a multiple of --micro-batch-size x "
                    "data-parallel size = %.0f x %d", what, global, a->micro, dp);
        return FALSE;
    }
    zp_plan_defaults(plan, a->dist_opt ? 1 : 0, dp, (int)tp);
    plan->impl = ZP_IMPL_MEGATRON;
    plan->micro_batch = (int)a->micro;
    plan->grad_accum = (int)(global / (a->micro * dp));
    plan->pipe.stages = (int)pp;
    double vpp = a->vpp;
    if (a->layers_per_vstage > 0)
        vpp = (double)model->layers / (pp * a->layers_per_vstage);
    if (vpp > 1) {
        plan->pipe.virtual_stages = (int)vpp;
        plan->pipe.schedule = ZP_PIPE_INTERLEAVED;
    }
    plan->sequence_parallel = a->sp;
    return TRUE;
}

gboolean zp_megatron_args_parse(int argc, char **argv, const char *what, const ZpModel *model,
                                int gpus, ZpPlan *plan, gboolean *attention_set,
                                GPtrArray *warnings, GError **error)
{
    Args a = {.tp = 1, .pp = 1, .micro = 1};
    GString *ignored = g_string_new(NULL);
    int first = 0;
    for (int i = 0; i < argc; i++)
        if (g_str_has_suffix(argv[i], ".py"))
            first = i + 1;
    gboolean ok = TRUE;
    for (int i = first; ok && i < argc; i++) {
        if (!g_str_has_prefix(argv[i], "--")) {
            ok = fail(error, what, argv[i], "%s", "is not a flag (a value with no flag before it)");
            break;
        }
        char **kv = g_strsplit(argv[i], "=", 2);
        const char *value = kv[1] ? kv[1]
                            : i + 1 < argc && !g_str_has_prefix(argv[i + 1], "--") ? argv[i + 1]
                                                                                   : NULL;
        gboolean used = FALSE;
        ok = take(what, model, kv[0], value, &a, ignored, &used, error);
        if (used && !kv[1])
            i++;
        g_strfreev(kv);
    }
    /* arguments.py: full recomputation names its method and layers; zplan's is every layer */
    if (ok && a.full && !(a.uniform && a.recompute_layers == 1)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: --recompute-granularity full: only --recompute-method uniform with "
                    "--recompute-num-layers 1 (every layer from its input) is modeled", what);
        ok = FALSE;
    }
    ok = ok && degrees(what, model, gpus, &a, plan, error);
    if (ok) {
        plan->precision = a.bf16 ? ZP_PREC_BF16 : a.fp16 ? ZP_PREC_FP16 : ZP_PREC_FP32;
        plan->optimizer = a.sgd ? ZP_OPT_SGD_MOMENTUM : ZP_OPT_ADAM;
        zp_plan_set_recompute(plan, a.full       ? ZP_RECOMPUTE_FULL
                                    : a.selective ? ZP_RECOMPUTE_SELECTIVE
                                                  : ZP_RECOMPUTE_NONE);
        /* arguments.py validate_args: bf16 accumulates and reduces in fp32 unless
         * --grad-reduce-in-bf16; the DDP's grad_dtype follows (distributed_data_parallel.py) */
        plan->reduce_dtype = a.bf16_grads                     ? ZP_REDUCE_BF16
                             : a.bf16 || a.fp32_grads         ? ZP_REDUCE_FP32
                                                              : ZP_REDUCE_GRAD;
        plan->zero.overlap_comm = a.overlap_grad;
        /* arguments.py: --overlap-param-gather needs the distributed optimizer (and
         * --overlap-grad-reduce) */
        plan->overlap_param_gather = a.overlap_param;
        plan->p2p_sync = a.no_overlap_p2p;
        /* distributed_data_parallel.py: bucket_size max(4e7, 1e6 dp) unless --ddp-bucket-size */
        plan->zero.reduce_bucket_size = a.bucket > 0 ? a.bucket : fmax(4e7, 1e6 * plan->dp);
        if (a.flash)
            plan->attention = ZP_ATTN_FLASH2;
        else if (a.unfused)
            plan->attention = ZP_ATTN_EAGER;
        *attention_set = a.flash || a.unfused;
        if (ignored->len)
            g_ptr_array_add(warnings,
                            g_strdup_printf("%s: not modeled (no bearing on a step's memory or "
                                            "time here), ignored: %s", what, ignored->str));
    }
    g_string_free(ignored, TRUE);
    return ok;
}

gboolean zp_megatron_args_read(const char *path, const ZpModel *model, int gpus, ZpPlan *plan,
                               gboolean *attention_set, GPtrArray *warnings, GError **error)
{
    char *text = NULL;
    GError *local = NULL;
    if (!g_file_get_contents(path, &text, NULL, &local)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", path, local->message);
        g_error_free(local);
        return FALSE;
    }
    int argc = 0;
    char **argv = NULL;
    gboolean ok = TRUE;
    if (!g_utf8_validate(text, -1, NULL)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: not UTF-8 text", path);
        ok = FALSE;
    } else if (!g_shell_parse_argv(text, &argc, &argv, &local)) {
        /* an empty file is no flags at all */
        if (g_error_matches(local, G_SHELL_ERROR, G_SHELL_ERROR_EMPTY_STRING)) {
            argc = 0;
        } else {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", path, local->message);
            ok = FALSE;
        }
        g_clear_error(&local);
    }
    g_free(text);
    ok = ok && zp_megatron_args_parse(argc, argv, path, model, gpus, plan, attention_set,
                                      warnings, error);
    g_strfreev(argv);
    return ok;
}
