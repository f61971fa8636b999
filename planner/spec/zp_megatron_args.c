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
    gboolean flash, unfused, no_overlap_p2p, tp_pp_dp;
    gboolean selective, full, uniform, sgd;
    /* Megatron-Core's mixture of experts (transformer_config.py, model_parallel_config.py):
     * experts 0 when --num-experts is absent, etp 0 when --expert-tensor-parallel-size is
     * (then the dense TP), capacity 0 (None: dropless), dispatcher 0 allgather (the default),
     * 1 alltoall, 2 flex; layer_freq the --moe-layer-freq text (NULL: 1) */
    double experts, ep, etp, topk, capacity;
    gboolean grouped_gemm, pad_capacity;
    int dispatcher;
    const char *layer_freq;
    /* The architecture Megatron builds from its flags (arch_rows): the MLP's activation, an
     * untied output layer, biases, grouped-query attention (query_groups -1 when absent: 1),
     * q/k norms, the normalization and position embedding as chosen (-1: absent, Megatron's
     * LayerNorm and learned_absolute), the dropouts (-1: absent, 0.1 each) */
    gboolean swiglu, quick_geglu, squared_relu, untie, no_bias, qkv_bias, gqa, qk_norm, rope;
    double query_groups, attention_dropout, hidden_dropout, dist_opt_instances;
    int norm, positions;
    const char *recompute_module; /* --recompute-modules' first other than core_attn, or NULL */
} Args;

typedef enum {
    A_NUMBER,  /* a whole number into a double of Args */
    A_REAL,    /* a number into a double of Args */
    A_SWITCH,  /* no value: sets a gboolean of Args */
    A_MODEL,   /* a whole number that must equal the model's (ModelDim) */
    A_CHOICE,  /* a word: handled by its own rule (choice) */
    A_REFUSE,  /* changes memory or time in a way zplan does not model */
    A_WORDS,   /* words to the next flag (argparse's nargs='+'): each by its rule (choice) */
} ArgKind;

typedef enum {
    DIM_LAYERS, DIM_HIDDEN, DIM_HEADS, DIM_SEQ, DIM_FFN, DIM_KV_CHANNELS,
    DIM_EXPERT_FFN, DIM_SHARED_FFN
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
#define REAL(f, field, lo, hi) {f, A_REAL, G_STRUCT_OFFSET(Args, field), lo, hi, 0, NULL}
#define SW(f, field) {f, A_SWITCH, G_STRUCT_OFFSET(Args, field), 0, 0, 0, NULL}
#define DIM(f, d) {f, A_MODEL, 0, 0, 0, d, NULL}
#define CHOICE(f) {f, A_CHOICE, 0, 0, 0, 0, NULL}
#define REFUSE(f, why) {f, A_REFUSE, 0, 0, 0, 0, why}
#define WORDS(f) {f, A_WORDS, 0, 0, 0, 0, NULL}

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
    NUM("--num-query-groups", query_groups, 1, 1 << 20),
    /* arguments.py: kv_channels, each head's width, hidden_size // num_attention_heads unless
     * given (the model's head_dim) */
    DIM("--kv-channels", DIM_KV_CHANNELS),
    CHOICE("--recompute-granularity"),
    CHOICE("--recompute-method"),
    /* transformer_config.py recompute_modules: selective recomputation's modules, core_attn
     * by default (zplan's --recompute selective) */
    WORDS("--recompute-modules"),
    CHOICE("--attention-backend"),
    CHOICE("--optimizer"),
    REFUSE("--no-scatter-gather-tensors-in-pipeline",
           "pipeline sends without scatter/gather are not modeled under --impl megatron"),
    /* a mixture of experts (moe_plan); the router's and the aux loss's knobs have no bearing */
    NUM("--num-experts", experts, 1, 1 << 20),
    NUM("--expert-model-parallel-size", ep, 1, 65536),
    NUM("--expert-tensor-parallel-size", etp, 1, 65536),
    NUM("--moe-router-topk", topk, 1, 1 << 20),
    /* transformer_config.py: a negative capacity factor is None (dropless) */
    REAL("--moe-expert-capacity-factor", capacity, -1e3, 1e3),
    SW("--moe-grouped-gemm", grouped_gemm),
    SW("--moe-pad-expert-input-to-capacity", pad_capacity),
    DIM("--moe-ffn-hidden-size", DIM_EXPERT_FFN),
    DIM("--moe-shared-expert-intermediate-size", DIM_SHARED_FFN),
    CHOICE("--moe-token-dispatcher-type"),
    CHOICE("--moe-layer-freq"),
    REFUSE("--moe-layer-recompute",
           "recomputing the MoE layers alone is not modeled (full or selective recomputation is)"),
    SW("--overlap-param-gather", overlap_param),
    /* arguments.py: batch_p2p_comm = not overlap_p2p_comm, and batch_p2p_sync's default
     * synchronizes the device after each batch (p2p_communication.py _communicate) */
    SW("--no-overlap-p2p-communication", no_overlap_p2p),
    /* initialize.py: order tp-cp-ep-pp-dp, not the default tp-cp-ep-dp-pp (ZpRankOrder) */
    SW("--use-tp-pp-dp-mapping", tp_pp_dp),
    REFUSE("--cpu-offloading", "activation offload is not modeled"),
    /* What changes a step's memory or time in ways zplan does not model: refused, not listed
     * among the flags of no bearing (transformer_config.py, model_parallel_config.py,
     * optimizer_config.py and arguments.py name them) */
    REFUSE("--fp8-format", "FP8 training (Transformer Engine's FP8 GEMMs) is not modeled"),
    REFUSE("--fp4-format", "FP4 training (Transformer Engine's FP4 GEMMs) is not modeled"),
    REFUSE("--fp8-param-gather", "FP8 parameters and their gathers are not modeled"),
    REFUSE("--tp-comm-overlap",
           "Transformer Engine's overlap of the tensor-parallel all-gathers and "
           "reduce-scatters with the GEMMs (userbuffers) is not modeled"),
    REFUSE("--use-torch-fsdp2", "Megatron's torch FSDP2 wrapping is not modeled under --impl "
                                "megatron (zplan's fsdp2 is torchtitan's: --impl fsdp2)"),
    REFUSE("--use-megatron-fsdp", "Megatron-FSDP's sharding is not modeled"),
    REFUSE("--decoder-first-pipeline-num-layers",
           "an uneven pipeline split is not modeled (Megatron's uniform split is)"),
    REFUSE("--decoder-last-pipeline-num-layers",
           "an uneven pipeline split is not modeled (Megatron's uniform split is)"),
    REFUSE("--pipeline-model-parallel-layout",
           "an explicit pipeline layout is not modeled (Megatron's uniform split is)"),
    REFUSE("--account-for-embedding-in-pipeline-split",
           "an uneven pipeline split is not modeled (Megatron's uniform split is)"),
    REFUSE("--account-for-loss-in-pipeline-split",
           "an uneven pipeline split is not modeled (Megatron's uniform split is)"),
    REFUSE("--use-precision-aware-optimizer",
           "optimizer states or main parameters and gradients other than fp32 are not modeled"),
    REFUSE("--optimizer-cpu-offload", "the hybrid CPU/GPU optimizer is not modeled under --impl "
                                      "megatron"),
    NUM("--num-distributed-optimizer-instances", dist_opt_instances, 1, 65536),
    REFUSE("--overlap-moe-expert-parallel-comm",
           "the expert all-to-alls overlapped with another micro-batch's compute are not modeled"),
    REFUSE("--delay-wgrad-compute", "weight gradients delayed for overlap are not modeled"),
    /* the architecture (arch_rows): checked against the model */
    SW("--swiglu", swiglu),
    SW("--quick-geglu", quick_geglu),
    SW("--squared-relu", squared_relu),
    SW("--untie-embeddings-and-output-weights", untie),
    SW("--disable-bias-linear", no_bias),
    SW("--add-qkv-bias", qkv_bias),
    SW("--group-query-attention", gqa),
    SW("--qk-layernorm", qk_norm),
    SW("--use-rotary-position-embeddings", rope), /* arguments.py: position_embedding_type rope */
    CHOICE("--normalization"),
    CHOICE("--position-embedding-type"),
    REAL("--attention-dropout", attention_dropout, 0, 1),
    REAL("--hidden-dropout", hidden_dropout, 0, 1),
};

static int64_t model_dim(const ZpModel *m, ModelDim d)
{
    switch (d) {
    case DIM_LAYERS: return m->layers;
    case DIM_HIDDEN: return m->hidden;
    case DIM_HEADS: return m->heads;
    case DIM_SEQ: return m->seq_len;
    case DIM_FFN: return m->ffn_hidden;
    case DIM_KV_CHANNELS: return zp_model_head_dim(m);
    case DIM_EXPERT_FFN: return m->moe.expert_ffn;
    case DIM_SHARED_FFN: return m->moe.shared_ffn;
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
    static const char *const dispatcher[] = {"allgather", "alltoall", "flex", NULL};
    static const char *const normalization[] = {"LayerNorm", "RMSNorm", NULL};
    /* arguments.py's choices; transformer_config.py: yarn and mrope rotate as rope does */
    static const char *const positions[] = {"learned_absolute", "rope", "yarn", "mrope",
                                            "relative", "none", NULL};
    int v;
    char *name = g_strdup_printf("%s: %s", what, flag);
    gboolean ok = TRUE;
    if (strcmp(flag, "--recompute-modules") == 0) {
        if (strcmp(value, "core_attn") != 0 && !a->recompute_module)
            a->recompute_module = value;
    } else if (strcmp(flag, "--moe-layer-freq") == 0) {
        a->layer_freq = value; /* an integer or a Python list expression: moe_plan */
    } else if (strcmp(flag, "--normalization") == 0) {
        ok = zp_parse_choice(value, name, normalization, &v, error);
        a->norm = ok ? v : -1;
    } else if (strcmp(flag, "--position-embedding-type") == 0) {
        ok = zp_parse_choice(value, name, positions, &v, error);
        a->positions = ok ? v : -1;
    } else if (strcmp(flag, "--moe-token-dispatcher-type") == 0) {
        ok = zp_parse_choice(value, name, dispatcher, &v, error);
        a->dispatcher = ok ? v : 0;
    } else if (strcmp(flag, "--recompute-granularity") == 0) {
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
    const gboolean ok = zp_parse_number(value, name, r->kind == A_MODEL ? 1 : r->min, hi,
                                        r->kind != A_REAL, &v, error);
    g_free(name);
    if (!ok)
        return FALSE;
    if (r->kind == A_NUMBER || r->kind == A_REAL) {
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

/* ---- the architecture the flags build, against the model ------------------------------ */

/* One property of the architecture: what Megatron builds from the flags and what the model
 * has, each as words (equal words: the same); `given` whether any of its flags was there. */
typedef struct {
    const char *flag; /* the flag to name: the one given, else the one that would say it */
    gboolean given;
    const char *megatron, *model;
} ArchRow;

static const char *mlp_words(gboolean gated, gboolean gelu)
{
    return !gated ? "a plain MLP" : gelu ? "a gated GELU MLP (GeGLU)" : "a gated SiLU MLP (SwiGLU)";
}

/* Which linear layers carry a bias, qkv (1), proj (2), the MLP (4), as words. */
static const char *bias_words(unsigned biased)
{
    static const char *const words[8] = {
        "no biases", "a bias on qkv alone", "a bias on proj alone", "biases on qkv and proj",
        "a bias on the MLP alone", "biases on qkv and the MLP", "biases on proj and the MLP",
        "biases on qkv, proj and the MLP"};
    return words[biased & 7];
}

static const char *position_words(int kind)
{
    static const char *const words[3] = {"a learned position table", "rotary embeddings",
                                         "neither a position table nor rotary embeddings"};
    return words[kind];
}

static const char *dropout_words(gboolean on)
{
    return on ? "dropout" : "no dropout";
}

/* The rows (at most ARCH_ROWS) for the model and the flags, as Megatron reads them:
 * argument_utils.py core_transformer_config_from_args (--swiglu, --quick-geglu and
 * --squared-relu choose the MLP; num_query_groups only under --group-query-attention, else
 * the heads; arguments.py validate_args: add_qkv_bias follows add_bias_linear,
 * --use-rotary-position-embeddings is rope), transformer_config.py's defaults (LayerNorm, a
 * bias on every linear layer, dropout 0.1 on the attention and the hidden states) and
 * arguments.py's (learned_absolute positions; --untie-embeddings-and-output-weights absent,
 * the output layer shares the embedding). */
enum { ARCH_ROWS = 7 };
static int arch_rows(const ZpModel *m, const Args *a, ArchRow *rows, char **owned)
{
    int n = 0;
    const gboolean model_gated = zp_model_gated(m);
    const char *mlp_flag = a->quick_geglu ? "--quick-geglu" : a->squared_relu ? "--squared-relu"
                                                                              : "--swiglu";
    rows[n++] = (ArchRow){mlp_flag, a->swiglu || a->quick_geglu || a->squared_relu,
                          mlp_words(a->swiglu || a->quick_geglu, a->quick_geglu),
                          mlp_words(model_gated, m->mlp == ZP_MLP_GEGLU)};
    rows[n++] = (ArchRow){"--untie-embeddings-and-output-weights", a->untie,
                          a->untie ? "an output layer of its own" : "the output layer tied to "
                                                                    "the embedding",
                          m->tied_embeddings ? "the output layer tied to the embedding"
                                             : "an output layer of its own"};
    rows[n++] = (ArchRow){"--normalization", a->norm >= 0, a->norm == 1 ? "RMSNorm" : "LayerNorm",
                          m->norm == ZP_NORM_RMSNORM ? "RMSNorm" : "LayerNorm"};
    const unsigned linear = a->no_bias ? 0u : 7u;
    const unsigned model_biased = (m->no_bias & ZP_NO_BIAS_QKV ? 0u : 1u) |
                                  (m->no_bias & ZP_NO_BIAS_PROJ ? 0u : 2u) |
                                  (m->no_bias & ZP_NO_BIAS_MLP ? 0u : 4u);
    rows[n++] = (ArchRow){a->qkv_bias && !a->no_bias ? "--add-qkv-bias" : "--disable-bias-linear",
                          a->no_bias || a->qkv_bias, bias_words(linear | (a->qkv_bias ? 1u : 0u)),
                          bias_words(model_biased)};
    const int type = a->rope ? 1 : a->positions < 0 ? 0 : a->positions;
    const int megatron_positions = type == 0 ? 0 : type <= 3 ? 1 : 2;
    const int model_positions = m->learned_positions ? 0 : m->rope_theta > 0 ? 1 : 2;
    rows[n++] = (ArchRow){a->rope ? "--use-rotary-position-embeddings"
                                  : "--position-embedding-type",
                          a->rope || a->positions >= 0, position_words(megatron_positions),
                          position_words(model_positions)};
    const double groups = a->gqa ? (a->query_groups > 0 ? a->query_groups : 1) : (double)m->heads;
    owned[0] = g_strdup_printf("%.0f key/value head%s", groups, groups == 1 ? "" : "s");
    owned[1] = g_strdup_printf("%" G_GINT64_FORMAT " key/value head%s", zp_model_kv_heads(m),
                               zp_model_kv_heads(m) == 1 ? "" : "s");
    rows[n++] = (ArchRow){a->query_groups > 0 ? "--num-query-groups" : "--group-query-attention",
                          a->gqa || a->query_groups > 0, owned[0], owned[1]};
    const double pa = a->attention_dropout >= 0 ? a->attention_dropout : 0.1;
    const double ph = a->hidden_dropout >= 0 ? a->hidden_dropout : 0.1;
    rows[n++] = (ArchRow){a->attention_dropout >= 0 ? "--attention-dropout"
                          : a->hidden_dropout >= 0  ? "--hidden-dropout"
                                                    : "--attention-dropout and --hidden-dropout",
                          a->attention_dropout >= 0 || a->hidden_dropout >= 0,
                          dropout_words(pa > 0 || ph > 0), dropout_words(m->dropout)};
    return n;
}

/* The architecture against the model: a flag given that builds otherwise fails naming it;
 * flags absent whose Megatron default builds otherwise are said in one warning (zplan
 * simulates the model: a file may carry the parallel flags alone). --qk-layernorm given
 * needs the model's q and k norms. */
static gboolean arch_check(const char *what, const ZpModel *m, const Args *a,
                           GPtrArray *warnings, GError **error)
{
    if (a->qk_norm && !m->qk_norm) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: --qk-layernorm: Megatron normalizes "
                    "each head's q and k, but the model (%s) does not", what, m->name);
        return FALSE;
    }
    ArchRow rows[ARCH_ROWS];
    char *owned[2] = {NULL, NULL};
    const int n = arch_rows(m, a, rows, owned);
    GString *absent = g_string_new(NULL);
    gboolean ok = TRUE;
    for (int i = 0; ok && i < n; i++) {
        if (strcmp(rows[i].megatron, rows[i].model) == 0)
            continue;
        if (rows[i].given) {
            g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s: Megatron builds %s, but the "
                        "model (%s) has %s", what, rows[i].flag, rows[i].megatron, m->name,
                        rows[i].model);
            ok = FALSE;
        } else {
            g_string_append_printf(absent, "%s%s (absent: %s; the model's: %s)",
                                   absent->len ? ", " : "", rows[i].flag, rows[i].megatron,
                                   rows[i].model);
        }
    }
    if (ok && !a->qk_norm && m->qk_norm)
        g_string_append_printf(absent, "%s--qk-layernorm (absent: no q and k norms; the "
                               "model's: q and k norms)", absent->len ? ", " : "");
    if (ok && absent->len)
        g_ptr_array_add(warnings, g_strdup_printf("%s: Megatron's defaults build otherwise "
                                                  "than the model (%s), which zplan simulates "
                                                  "as given: %s", what, m->name, absent->str));
    g_string_free(absent, TRUE);
    g_free(owned[0]);
    g_free(owned[1]);
    return ok;
}

/* The degrees and batch the flags give, checked against the GPUs. */
static gboolean degrees(const char *what, const ZpModel *model, int gpus, const Args *a,
                        ZpPlan *plan, GError **error)
{
    const double tp = a->tp, pp = a->pp;
    char *text = NULL;
    if (a->cp > 1)
        text = g_strdup("--context-parallel-size: context parallelism is not modeled");
    else if (a->dist_opt_instances > 1) /* distrib_optimizer.py: partial sharding */
        text = g_strdup("--num-distributed-optimizer-instances: the optimizer sharded over part "
                        "of the data-parallel ranks, replicated over the rest, is not modeled");
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
    plan->rank_order = a->tp_pp_dp ? ZP_ORDER_TP_PP_DP : ZP_ORDER_TP_DP_PP;
    return TRUE;
}

/* What a mixture of experts' flags contradict (the model, the degrees, what zplan times), as
 * text, or NULL. Megatron builds a dense model without --num-experts, routes top-2 without
 * --moe-router-topk and makes every layer sparse without --moe-layer-freq (1); its experts
 * split over the dense layers' TP unless --expert-tensor-parallel-size says otherwise
 * (model_parallel_config.py), which zplan's experts do (zp_ep); EP is taken from the
 * data-parallel ranks; its default dispatcher all-gathers the tokens over the TP x EP group
 * (allgather), the other all-to-alls them (alltoall), both of which zplan times (ZpDispatcher;
 * the TP x EP group laid out where zp_ep_dispatcher_check says); with TP > 1 it needs
 * sequence parallelism (moe_layer.py MoELayer.forward). */
static char *moe_contradiction(const ZpModel *model, const Args *a, int dp)
{
    const ZpMoe *moe = &model->moe;
    const int64_t sparse = zp_moe_sparse_layers(moe, model->layers);
    if (!zp_moe_enabled(moe)) {
        const char *flag = a->experts > 0 ? "--num-experts"
                           : a->ep > 1    ? "--expert-model-parallel-size"
                                          : NULL;
        return flag ? g_strdup_printf("%s: %s is dense", flag, model->name) : NULL;
    }
    if (a->experts == 0)
        return g_strdup_printf("--num-experts: absent, Megatron builds a dense model, but %s is "
                               "a mixture of %" G_GINT64_FORMAT " experts", model->name,
                               moe->experts);
    if ((int64_t)a->experts != moe->experts)
        return g_strdup_printf("--num-experts is %.0f but the model (%s) has %" G_GINT64_FORMAT,
                               a->experts, model->name, moe->experts);
    if ((int64_t)a->topk != moe->top_k)
        return g_strdup_printf("--moe-router-topk is %.0f (2 when absent) but the model (%s) "
                               "routes to %" G_GINT64_FORMAT, a->topk, model->name, moe->top_k);
    if ((!a->layer_freq || strcmp(a->layer_freq, "1") == 0) && sparse != model->layers)
        return g_strdup_printf("--moe-layer-freq: 1 (the default) makes all %" G_GINT64_FORMAT
                               " layers sparse, but %s has %" G_GINT64_FORMAT, model->layers,
                               model->name, sparse);
    if (a->etp > 1 && a->etp != a->tp)
        return g_strdup_printf("--expert-tensor-parallel-size %.0f: experts split otherwise than "
                               "over the dense layers' TP (%.0f) or whole (1) are not modeled",
                               a->etp, a->tp);
    /* whole experts (--expert-tensor-parallel-size 1) take EP from the TP x DP ranks */
    const int grid = a->etp == 1 ? (int)a->tp * dp : dp;
    if (fmod((double)moe->experts, a->ep) != 0 || grid % (int)a->ep != 0)
        return g_strdup_printf("--expert-model-parallel-size %.0f does not divide the %"
                               G_GINT64_FORMAT " experts and the %s size %d", a->ep,
                               moe->experts, a->etp == 1 ? "tensor x data-parallel" : "data-parallel",
                               grid);
    if (a->dispatcher == 2)
        return g_strdup("--moe-token-dispatcher-type flex (DeepEP and its kin) is not modeled");
    if (a->tp > 1 && !a->sp) /* moe_layer.py MoELayer.forward raises in training */
        return g_strdup("--sequence-parallel: absent, but Megatron-Core trains a mixture of "
                        "experts with --tensor-model-parallel-size > 1 only with it");
    return NULL;
}

/* The flags' mixture of experts into plan->experts (dropless without a capacity factor, every
 * expert loaded alike), with a warning each for what it prices otherwise than Megatron runs:
 * without --moe-grouped-gemm a rank's experts run one GEMM each (SequentialMLP); without
 * --moe-pad-expert-input-to-capacity the dispatch carries the kept tokens, not the capacity;
 * a --moe-layer-freq pattern is not checked against the model's sparse layers. */
static gboolean moe_plan(const char *what, const ZpModel *model, const Args *a, ZpPlan *plan,
                         GPtrArray *warnings, GError **error)
{
    char *bad = moe_contradiction(model, a, plan->dp);
    if (bad) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE, "%s: %s", what, bad);
        g_free(bad);
        return FALSE;
    }
    if (!zp_moe_enabled(&model->moe))
        return TRUE;
    plan->experts.ep = (int)a->ep;
    plan->experts.capacity_factor = a->capacity > 0 ? a->capacity : 0;
    plan->experts.dispatcher = a->dispatcher == 0 ? ZP_DISPATCH_ALLGATHER : ZP_DISPATCH_ALLTOALL;
    plan->experts.etp = a->etp == 1 ? 1 : 0;
    if (!zp_plan_etp_check(plan, TRUE, "--expert-tensor-parallel-size", error) ||
        !zp_plan_dispatcher_check(plan, "--moe-token-dispatcher-type", error)) {
        g_prefix_error(error, "%s: ", what);
        return FALSE;
    }
    const struct {
        gboolean when;
        const char *says;
    } notes[] = {
        {!a->grouped_gemm, "without --moe-grouped-gemm a rank's experts run one GEMM each "
                           "(SequentialMLP): priced as grouped GEMMs"},
        {a->capacity > 0 && !a->pad_capacity,
         "--moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity sends the "
         "tokens kept: sized as padded to the capacity"},
        {a->layer_freq && strcmp(a->layer_freq, "1") != 0,
         "--moe-layer-freq: the pattern is not checked; the model's sparse layers are used"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(notes); i++)
        if (notes[i].when)
            g_ptr_array_add(warnings, g_strdup_printf("%s: %s", what, notes[i].says));
    return TRUE;
}

gboolean zp_megatron_args_parse(int argc, char **argv, const char *what, const ZpModel *model,
                                int gpus, ZpPlan *plan, gboolean *attention_set,
                                GPtrArray *warnings, GError **error)
{
    Args a = {.tp = 1, .pp = 1, .micro = 1, .ep = 1, .topk = 2, .query_groups = -1,
              .attention_dropout = -1, .hidden_dropout = -1, .norm = -1, .positions = -1};
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
        const ArgRule *rule = find_rule(kv[0]); /* NULL: a flag zplan ignores */
        if (rule && rule->kind == A_WORDS) {
            if (!value) {
                ok = fail(error, what, kv[0], "needs a value%s", "");
            } else if (kv[1]) {
                ok = choice(what, kv[0], value, &a, error);
            } else {
                for (; ok && i + 1 < argc && !g_str_has_prefix(argv[i + 1], "--"); i++)
                    ok = choice(what, kv[0], argv[i + 1], &a, error);
            }
            g_strfreev(kv);
            continue;
        }
        ok = take(what, model, kv[0], value, &a, ignored, &used, error);
        if (used && !kv[1])
            i++;
        /* A flag zplan ignores may take several values (argparse's nargs='+': a blended
         * --data-path's weights and prefixes, --train-data-path's): all its words,
         * to the next flag, are its own. */
        if (ok && !rule && !kv[1])
            while (i + 1 < argc && !g_str_has_prefix(argv[i + 1], "--"))
                i++;
        g_strfreev(kv);
    }
    /* transformer_config.py: the modules recomputed under selective recomputation */
    if (ok && a.selective && a.recompute_module) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: --recompute-modules %s: selective recomputation of modules other than "
                    "core attention (core_attn, Megatron's default) is not modeled", what,
                    a.recompute_module);
        ok = FALSE;
    }
    /* arguments.py: full recomputation names its method and layers; zplan's is every layer */
    if (ok && a.full && !(a.uniform && a.recompute_layers == 1)) {
        g_set_error(error, ZP_ERROR, ZP_ERROR_VALUE,
                    "%s: --recompute-granularity full: only --recompute-method uniform with "
                    "--recompute-num-layers 1 (every layer from its input) is modeled", what);
        ok = FALSE;
    }
    ok = ok && arch_check(what, model, &a, warnings, error) &&
         degrees(what, model, gpus, &a, plan, error) &&
         moe_plan(what, model, &a, plan, warnings, error);
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
