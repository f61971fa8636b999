/* test_megatron_args: --megatron-args FILE, a plan from Megatron-LM's launch flags
 * (megatron/training/arguments.py): what each flag sets, and one line naming the flag for
 * what is refused. */
#include "testutil.h"
#include "zp_megatron_args.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>

static const char *const llama_70b =
    "# Llama-2-70B as a launch script passes it\n"
    "torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \\\n"
    "    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel \\\n"
    "    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \\\n"
    "    --num-layers 80 --hidden-size 8192 --num-attention-heads 64 \\\n"
    "    --group-query-attention --num-query-groups 8 --seq-length 4096 \\\n"
    "    --ffn-hidden-size 28672 --swiglu --untie-embeddings-and-output-weights \\\n"
    "    --normalization RMSNorm --disable-bias-linear --position-embedding-type rope \\\n"
    "    --attention-dropout 0.0 --hidden-dropout 0.0 \\\n"
    "    --micro-batch-size 1 --global-batch-size 64 --recompute-activations \\\n"
    "    --bf16 --use-flash-attn --lr 3e-4 --data-path 0.3 '/data/my corpus' 0.7 /data/web \\\n"
    "    --recompute-modules core_attn --log-interval=10\n";

static char *write_args(const char *text)
{
    char *path = g_strdup_printf("%s/megatron-args-%d.sh", g_get_tmp_dir(), (int)getpid());
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    return path;
}

/* `flag` (with its value, `given`) beside the file at `path` is refused with exit status 1,
 * naming it: the file's own flag says it. */
static void refused_beside_file(const char *common, const char *path, const char *flag,
                                const char *given)
{
    char *args = g_strdup_printf("%s --megatron-args %s %s %s", common, path, flag, given);
    TuRun r = tu_zplan(args);
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    char *says = g_strdup_printf("%s: the plan comes from --megatron-args", flag);
    g_assert_nonnull(strstr(r.err, says));
    g_free(says);
    tu_free(&r);
    g_free(args);
}

/* `common` with the file at `path` (then `extra`) simulates the step `common` with `flags`
 * (then `extra`) does, to the bit; the file's run as JSON, for the caller to read and free. */
static json_t *same_step(const char *common, const char *path, const char *flags,
                         const char *extra)
{
    char *args = g_strdup_printf("%s --megatron-args %s%s --json", common, path, extra);
    json_t *from_file = tu_zplan_json_fit_or_not(args);
    g_free(args);
    args = g_strdup_printf("%s %s%s --json", common, flags, extra);
    json_t *from_flags = tu_zplan_json_fit_or_not(args);
    g_free(args);
    g_assert_cmpfloat(json_number_value(json_object_get(from_file, "step_time_s")), ==,
                      json_number_value(json_object_get(from_flags, "step_time_s")));
    json_decref(from_flags);
    return from_file;
}

/* Every flag of the script lands where Megatron puts it: TP 8 x DP 8 on 64 GPUs, the
 * distributed optimizer (stage 1), 64 / (1 x 8) = 8 micro-steps, sequence parallelism,
 * selective recomputation (--recompute-activations), bf16 with fp32 gradient reduction
 * (validate_args), overlap_grad_reduce, bucket_size max(4e7, 1e6 x 8) = 4e7, FlashAttention;
 * --overlap-param-gather; the flags without bearing are listed in one warning. Megatron's
 * pipeline exchanges overlap by default; --no-overlap-p2p-communication waits for them. */
static void test_plan(void)
{
    const ZpModel m = tu_load_model("models/hf/llama-2-70b");
    char *path = write_args(llama_70b);
    ZpPlan p;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    gboolean attention = FALSE;
    GError *error = NULL;
    g_assert_true(zp_megatron_args_read(path, &m, 64, &p, &attention, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpint(p.impl, ==, ZP_IMPL_MEGATRON);
    g_assert_cmpint(p.zero.stage, ==, 1);
    g_assert_cmpint(p.mp, ==, 8);
    g_assert_cmpint(p.dp, ==, 8);
    g_assert_cmpint(zp_plan_pp(&p), ==, 1);
    g_assert_cmpint(p.micro_batch, ==, 1);
    g_assert_cmpint(p.grad_accum, ==, 8);
    g_assert_true(p.sequence_parallel && p.selective_recompute && !p.checkpoint);
    g_assert_cmpint(p.precision, ==, ZP_PREC_BF16);
    g_assert_cmpint(p.reduce_dtype, ==, ZP_REDUCE_FP32);
    g_assert_true(p.zero.overlap_comm);
    g_assert_cmpfloat(p.zero.reduce_bucket_size, ==, 4e7);
    g_assert_true(attention);
    g_assert_cmpint(p.attention, ==, ZP_ATTN_FLASH2);
    g_assert_true(p.overlap_param_gather);
    g_assert_false(p.p2p_sync);
    g_assert_cmpuint(warnings->len, ==, 1);
    g_assert_nonnull(strstr(g_ptr_array_index(warnings, 0),
                            "ignored: --lr, --data-path, --log-interval"));
    g_ptr_array_unref(warnings);
    /* interleaving from layers per virtual stage; full recomputation of every layer */
    char *argv[] = {"--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage",
                    "5", "--recompute-granularity", "full", "--recompute-method", "uniform",
                    "--recompute-num-layers", "1", "--fp16", "--global-batch-size", "32",
                    "--no-overlap-p2p-communication"};
    warnings = g_ptr_array_new_with_free_func(g_free);
    g_assert_true(zp_megatron_args_parse(G_N_ELEMENTS(argv), argv, "flags", &m, 64, &p,
                                         &attention, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpint(zp_plan_pp(&p), ==, 4);
    g_assert_cmpint(zp_plan_vstages(&p), ==, 4); /* 80 / (4 x 5) */
    g_assert_cmpint(p.pipe.schedule, ==, ZP_PIPE_INTERLEAVED);
    g_assert_true(p.p2p_sync); /* batch_isend_irecv and batch_p2p_sync */
    g_assert_cmpint(p.dp, ==, 16);
    g_assert_cmpint(p.grad_accum, ==, 2);
    g_assert_true(p.checkpoint);
    g_assert_cmpint(p.zero.stage, ==, 0);
    g_assert_cmpint(p.reduce_dtype, ==, ZP_REDUCE_GRAD); /* fp16 keeps its 16-bit main_grad */
    g_assert_false(attention);
    g_assert_cmpint(p.rank_order, ==, ZP_ORDER_TP_DP_PP); /* parallel_state.py's default */
    g_ptr_array_unref(warnings);
    /* initialize.py: --use-tp-pp-dp-mapping orders the ranks tp-cp-ep-pp-dp */
    char *mapped[] = {"--pipeline-model-parallel-size", "4", "--use-tp-pp-dp-mapping"};
    warnings = g_ptr_array_new_with_free_func(g_free);
    g_assert_true(zp_megatron_args_parse(G_N_ELEMENTS(mapped), mapped, "flags", &m, 64, &p,
                                         &attention, warnings, &error));
    g_assert_no_error(error);
    g_assert_cmpint(p.rank_order, ==, ZP_ORDER_TP_PP_DP);
    for (guint i = 0; i < warnings->len; i++) /* read, not listed as of no bearing */
        g_assert_null(strstr(g_ptr_array_index(warnings, i), "--use-tp-pp-dp-mapping"));
    g_ptr_array_unref(warnings);
    g_unlink(path);
    g_free(path);
}

/* Parses `args` (shell words, from a file called `what`) for `model` on `gpus` GPUs into *p:
 * whether it was taken, the error or the warnings joined in *said (g_free). */
static gboolean parse_words(const char *what, const char *args, const ZpModel *model, int gpus,
                            ZpPlan *p, char **said)
{
    int argc;
    char **argv;
    g_assert_true(g_shell_parse_argv(args, &argc, &argv, NULL));
    gboolean attention;
    GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
    GError *error = NULL;
    const gboolean ok = zp_megatron_args_parse(argc, argv, what, model, gpus, p, &attention,
                                               warnings, &error);
    g_ptr_array_add(warnings, NULL);
    *said = ok ? g_strjoinv("\n", (char **)warnings->pdata) : g_strdup(error->message);
    g_clear_error(&error);
    g_ptr_array_unref(warnings);
    g_strfreev(argv);
    return ok;
}

/* Each refusal is one line naming the file and the flag. */
static void test_refusals(void)
{
    const ZpModel m = tu_load_model("models/hf/llama-2-70b");
    const struct {
        const char *args, *message;
    } cases[] = {
        {"--tensor-model-parallel-size two", "--tensor-model-parallel-size"},
        {"--num-layers 81", "--num-layers is 81 but the model (llama-2-70b) has 80"},
        {"--kv-channels 64", "--kv-channels is 64 but the model (llama-2-70b) has 128"},
        {"--micro-batch-size", "--micro-batch-size needs a value"},
        {"--recompute-granularity full", "--recompute-granularity full: only"},
        {"--recompute-granularity partial", "--recompute-granularity: unknown value"},
        {"--num-experts 8", "--num-experts: llama-2-70b is dense"},
        {"--global-batch-size 65", "--global-batch-size 65 is not a multiple"},
        {"--tensor-model-parallel-size 3", "does not divide the 64 GPUs"},
        {"--context-parallel-size 2", "context parallelism is not modeled"},
        {"--no-scatter-gather-tensors-in-pipeline", "--no-scatter-gather-tensors-in-pipeline"},
        {"8 --bf16", "8 is not a flag"},
        {"--fp16 --bf16", "--fp16 and --bf16"},
        {"--overlap-param-gather", "--overlap-param-gather: needs --use-distributed-optimizer"},
        {"--tensor-model-parallel-size $TP", "--tensor-model-parallel-size"},
        {"--fp8-format e4m3", "--fp8-format is refused: FP8 training"},
        {"--tp-comm-overlap", "--tp-comm-overlap is refused"},
        {"--decoder-first-pipeline-num-layers 3", "an uneven pipeline split is not modeled"},
        {"--use-precision-aware-optimizer", "other than fp32 are not modeled"},
        {"--num-distributed-optimizer-instances 2", "--num-distributed-optimizer-instances: "},
        {"--lr 1e-4 --use-torch-fsdp2", "--use-torch-fsdp2 is refused"},
        {"--recompute-activations --recompute-modules core_attn mlp",
         "--recompute-modules mlp: selective recomputation of modules other than core"},
        {"--recompute-modules", "--recompute-modules needs a value"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpPlan p;
        char *said;
        g_assert_false(parse_words("args.sh", cases[i].args, &m, 64, &p, &said));
        g_test_message("%s: %s", cases[i].args, said);
        g_assert_nonnull(strstr(said, cases[i].message));
        g_assert_true(g_str_has_prefix(said, "args.sh: "));
        g_assert_null(strchr(said, '\n'));
        g_free(said);
    }
}

/* The architecture the flags build (argument_utils.py core_transformer_config_from_args,
 * transformer_config.py's defaults) against the model: Llama-2-70B's launch with its
 * parallel flags alone is taken, the plan the full script's, with one warning naming each
 * property Megatron's defaults would build otherwise (and no more); a flag given that builds
 * otherwise is refused naming it, for Llama-2-70B (RMSNorm, 8 key/value heads: 1 under
 * --group-query-attention alone, the 64 heads under --num-query-groups without it, no
 * dropout), GPT-2 style gpt-13b (plain MLP, biases, learned positions, tied, dropout) and
 * Qwen2's qkv bias alone (--add-qkv-bias taken beside --disable-bias-linear). */
static void test_architecture(void)
{
    const ZpModel llama = tu_load_model("models/hf/llama-2-70b");
    const char *parallel = "--tensor-model-parallel-size 8 --num-layers 80 --hidden-size 8192 "
                           "--num-attention-heads 64 --group-query-attention "
                           "--num-query-groups 8 --micro-batch-size 1 --global-batch-size 64 "
                           "--bf16";
    ZpPlan alone, full;
    char *said;
    g_assert_true(parse_words("args.sh", parallel, &llama, 64, &alone, &said));
    g_test_message("%s", said);
    const char *absent[] = {
        "--swiglu (absent: a plain MLP; the model's: a gated SiLU MLP (SwiGLU))",
        "--untie-embeddings-and-output-weights (absent: the output layer tied to the embedding; "
        "the model's: an output layer of its own)",
        "--normalization (absent: LayerNorm; the model's: RMSNorm)",
        "--disable-bias-linear (absent: biases on qkv, proj and the MLP; the model's: no biases)",
        "--position-embedding-type (absent: a learned position table; the model's: rotary "
        "embeddings)",
        "--attention-dropout and --hidden-dropout (absent: dropout; the model's: no dropout)"};
    for (size_t i = 0; i < G_N_ELEMENTS(absent); i++)
        g_assert_nonnull(strstr(said, absent[i]));
    g_assert_null(strchr(said, '\n'));
    g_assert_null(strstr(said, "key/value"));
    g_free(said);
    char *whole = g_strdup_printf("%s --swiglu --untie-embeddings-and-output-weights "
                                  "--normalization RMSNorm --disable-bias-linear "
                                  "--position-embedding-type rope --attention-dropout 0 "
                                  "--hidden-dropout 0", parallel);
    g_assert_true(parse_words("args.sh", whole, &llama, 64, &full, &said));
    g_assert_cmpstr(said, ==, "");
    g_assert_cmpint(memcmp(&alone, &full, sizeof alone), ==, 0);
    g_free(said);
    g_free(whole);
    const ZpModel gpt = tu_load_model("gpt-13b"), qwen = tu_load_model("models/hf/qwen2-0.5b");
    const struct {
        const ZpModel *model;
        const char *args, *message;
    } cases[] = {
        {&llama, "--normalization LayerNorm", "--normalization: Megatron builds LayerNorm, but "
                                              "the model (llama-2-70b) has RMSNorm"},
        {&llama, "--group-query-attention", "--group-query-attention: Megatron builds 1 "
                                            "key/value head, but the model (llama-2-70b) has 8"},
        {&llama, "--num-query-groups 8", "--num-query-groups: Megatron builds 64 key/value heads"},
        {&llama, "--hidden-dropout 0.1", "--hidden-dropout: Megatron builds dropout, but the "
                                         "model (llama-2-70b) has no dropout"},
        {&llama, "--normalization LayerNorm1P", "--normalization: unknown value"},
        {&gpt, "--swiglu", "--swiglu: Megatron builds a gated SiLU MLP (SwiGLU), but the model "
                           "(gpt-13b) has a plain MLP"},
        {&gpt, "--quick-geglu", "--quick-geglu: Megatron builds a gated GELU MLP (GeGLU)"},
        {&gpt, "--untie-embeddings-and-output-weights", "the output layer tied to the embedding"},
        {&gpt, "--disable-bias-linear", "--disable-bias-linear: Megatron builds no biases"},
        {&gpt, "--use-rotary-position-embeddings", "--use-rotary-position-embeddings: Megatron "
                                                   "builds rotary embeddings"},
        {&gpt, "--attention-dropout 0 --hidden-dropout 0", "--attention-dropout: Megatron "
                                                           "builds no dropout"},
        {&gpt, "--qk-layernorm", "--qk-layernorm: Megatron normalizes each head's q and k"},
        {&qwen, "--disable-bias-linear", "--disable-bias-linear: Megatron builds no biases, but "
                                         "the model (qwen2-0.5b) has a bias on qkv alone"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        ZpPlan p;
        g_assert_false(parse_words("args.sh", cases[i].args, cases[i].model, 8, &p, &said));
        g_test_message("%s: %s", cases[i].args, said);
        g_assert_nonnull(strstr(said, cases[i].message));
        g_assert_true(g_str_has_prefix(said, "args.sh: "));
        g_free(said);
    }
    /* agreeing flags pass: gpt-13b at Megatron's defaults, Qwen2's qkv bias alone */
    ZpPlan p;
    g_assert_true(parse_words("args.sh", "--squared-relu --normalization LayerNorm "
                              "--position-embedding-type learned_absolute", &gpt, 8, &p, &said));
    g_assert_cmpstr(said, ==, "");
    g_free(said);
    g_assert_true(parse_words("args.sh", "--disable-bias-linear --add-qkv-bias", &qwen, 8, &p,
                              &said));
    g_assert_null(strstr(said, "bias"));
    g_free(said);
}

/* From the command line: the plan's figures, and plan flags beside the file refused. */
static void test_cli(void)
{
    char *path = write_args(llama_70b);
    char *args = g_strdup_printf("simulate --model models/hf/llama-2-70b --cluster dgx-h100 "
                                 "--gpus 64 --megatron-args %s --json", path);
    json_t *j = tu_zplan_json(args);
    json_t *plan = json_object_get(j, "plan");
    g_assert_cmpstr(json_string_value(json_object_get(plan, "impl")), ==, "megatron");
    g_assert_cmpstr(json_string_value(json_object_get(plan, "recompute")), ==, "selective");
    g_assert_cmpint(json_integer_value(json_object_get(plan, "mp")), ==, 8);
    json_decref(j);
    g_free(args);
    args = g_strdup_printf("simulate --model models/hf/llama-2-70b --cluster dgx-h100 --gpus 64 "
                           "--megatron-args %s --stage 1", path);
    TuRun r = tu_zplan(args);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--stage: the plan comes from --megatron-args"));
    tu_free(&r);
    g_free(args);
    args = g_strdup_printf("simulate --model models/hf/llama-2-70b --cluster dgx-h100 --gpus 64 "
                           "--megatron-args %s --impl deepspeed", path);
    r = tu_zplan(args);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--megatron-args plans are --impl megatron's"));
    tu_free(&r);
    g_free(args);
    /* --use-flash-attn where the profile rates no FlashAttention (dgx-b200 has no attention
     * table): refused naming the file and flag, as --attention flash2 is, not later by the
     * cost model without either. */
    args = g_strdup_printf("simulate --model models/hf/llama-2-70b --cluster dgx-b200 --gpus 64 "
                           "--megatron-args %s", path);
    r = tu_zplan(args);
    g_assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1);
    char *expected = g_strdup_printf("%s: --use-flash-attn: dgx-b200 has no rate for 'flash2'",
                                     path);
    g_assert_true(g_str_has_prefix(r.err, "zplan simulate: ") && strstr(r.err, expected));
    g_assert_true(strchr(r.err, '\n') == r.err + strlen(r.err) - 1); /* one line */
    g_free(expected);
    tu_free(&r);
    g_free(args);
    g_unlink(path);
    g_free(path);
}

/* Megatron-Core's mixture of experts (transformer_config.py, model_parallel_config.py): the
 * expert-parallel degree and capacity from its flags, each contradiction of the model or of
 * what zplan times one line naming the flag, what it prices otherwise a warning; and from the
 * command line the same step as the flags' plan, --expert-skew beside the file. */
static void test_moe(void)
{
    const ZpModel m = tu_load_model("models/hf/mixtral-8x7b");
    const char *base = "--num-experts 8 --moe-token-dispatcher-type alltoall --moe-grouped-gemm "
                       "--tensor-model-parallel-size 2 --sequence-parallel --bf16 --swiglu "
                       "--untie-embeddings-and-output-weights --normalization RMSNorm "
                       "--disable-bias-linear --position-embedding-type rope "
                       "--group-query-attention --num-query-groups 8 --attention-dropout 0 "
                       "--hidden-dropout 0";
    ZpPlan p;
    char *said;
    char *args = g_strdup_printf("%s --expert-model-parallel-size 4 "
                                 "--moe-expert-capacity-factor 1.25 "
                                 "--moe-pad-expert-input-to-capacity --moe-ffn-hidden-size 14336",
                                 base);
    g_assert_true(parse_words("moe.sh", args, &m, 16, &p, &said));
    g_assert_cmpint(p.experts.ep, ==, 4);
    g_assert_cmpfloat(p.experts.capacity_factor, ==, 1.25);
    g_assert_cmpint(p.mp, ==, 2);
    g_assert_cmpint(p.experts.dispatcher, ==, ZP_DISPATCH_ALLTOALL);
    g_assert_cmpstr(said, ==, "");
    g_free(said), g_free(args);
    /* Megatron's default dispatcher, allgather, over TP x EP without a pipeline, over EP with
     * one (TP 1), and over TP with one (EP 1) */
    const char *gathers[] = {
        "--num-experts 8 --expert-model-parallel-size 2 --tensor-model-parallel-size 2 "
        "--sequence-parallel",
        "--num-experts 8 --expert-model-parallel-size 4 --pipeline-model-parallel-size 2",
        "--num-experts 8 --tensor-model-parallel-size 2 --sequence-parallel "
        "--pipeline-model-parallel-size 2"};
    for (size_t i = 0; i < G_N_ELEMENTS(gathers); i++) {
        g_assert_true(parse_words("moe.sh", gathers[i], &m, 16, &p, &said));
        g_assert_cmpint(p.experts.dispatcher, ==, ZP_DISPATCH_ALLGATHER);
        g_free(said);
    }
    /* whole experts (--expert-tensor-parallel-size 1): EP 8 over TP 2 x DP 8 */
    g_assert_true(parse_words("moe.sh", "--num-experts 8 --tensor-model-parallel-size 2 "
                              "--sequence-parallel --expert-tensor-parallel-size 1 "
                              "--expert-model-parallel-size 16 --moe-token-dispatcher-type alltoall",
                              &m, 16, &p, &said) == FALSE);
    g_free(said);
    g_assert_true(parse_words("moe.sh", "--num-experts 8 --tensor-model-parallel-size 2 "
                              "--sequence-parallel --expert-tensor-parallel-size 1 "
                              "--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall",
                              &m, 16, &p, &said));
    g_assert_cmpint(p.experts.etp, ==, 1);
    g_assert_cmpint(zp_plan_edp(&p), ==, 2);
    g_free(said);
    /* and over a pipeline of 2 (TP 2 x DP 4 a stage: the tensor ranks of 4 dp ranks), with
     * Megatron's default dispatcher over TP 2 x EP 4 too */
    g_assert_true(parse_words("moe.sh", "--num-experts 8 --tensor-model-parallel-size 2 "
                              "--sequence-parallel --expert-tensor-parallel-size 1 "
                              "--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall "
                              "--pipeline-model-parallel-size 2", &m, 16, &p, &said));
    g_assert_cmpint(zp_plan_edp(&p), ==, 1);
    g_free(said);
    g_assert_true(parse_words("moe.sh", "--num-experts 8 --tensor-model-parallel-size 2 "
                              "--sequence-parallel --expert-model-parallel-size 4 "
                              "--pipeline-model-parallel-size 2", &m, 16, &p, &said));
    g_assert_cmpint(p.experts.dispatcher, ==, ZP_DISPATCH_ALLGATHER);
    g_free(said);
    const struct {
        const char *args, *says;
    } bad[] = {
        {"--tensor-model-parallel-size 2", "--num-experts: absent, Megatron builds a dense model"},
        {"--num-experts 16", "--num-experts is 16 but the model (mixtral-8x7b) has 8"},
        {"--num-experts 8 --moe-router-topk 1",
         "--moe-router-topk is 1 (2 when absent) but the model"},
        {"--num-experts 8 --moe-token-dispatcher-type alltoall --expert-model-parallel-size 3",
         "--expert-model-parallel-size 3 does not divide the 8 experts"},
        {"--num-experts 8 --moe-token-dispatcher-type alltoall --tensor-model-parallel-size 2",
         "--sequence-parallel: absent, but Megatron-Core trains a mixture of experts with "
         "--tensor-model-parallel-size > 1 only with it"},
        {"--num-experts 8 --moe-token-dispatcher-type flex", "flex (DeepEP and its kin)"},
        {"--num-experts 8 --tensor-model-parallel-size 2 --expert-tensor-parallel-size 4",
         "--expert-tensor-parallel-size 4: experts split otherwise than over the dense layers' "
         "TP (2) or whole (1)"},
        {"--num-experts 8 --tensor-model-parallel-size 2 --sequence-parallel "
         "--expert-tensor-parallel-size 1 --expert-model-parallel-size 8 "
         "--moe-token-dispatcher-type alltoall --pipeline-model-parallel-size 4",
         "--expert-model-parallel-size 8 does not divide the 8 experts and the tensor x "
         "data-parallel size 4"},
        {"--num-experts 8 --tensor-model-parallel-size 2 --sequence-parallel "
         "--expert-tensor-parallel-size 1 --expert-model-parallel-size 8 "
         "--moe-token-dispatcher-type alltoall --pipeline-model-parallel-size 2 "
         "--use-tp-pp-dp-mapping",
         "--expert-tensor-parallel-size: Megatron-Core under the tp-pp-dp order "
         "(--use-tp-pp-dp-mapping) with a pipeline of 2 stages needs ETP x EP = TP"},
        {"--num-experts 8 --tensor-model-parallel-size 2 --sequence-parallel "
         "--expert-model-parallel-size 2 --pipeline-model-parallel-size 2 "
         "--use-tp-pp-dp-mapping",
         "not ETP 2 x EP 2 over TP 2"},
        {"--num-experts 8 --moe-ffn-hidden-size 1408", "--moe-ffn-hidden-size is 1408"},
        {"--num-experts 8 --moe-layer-recompute", "--moe-layer-recompute is refused"},
        {"--num-experts 8 --moe-token-dispatcher-type all2all", "unknown value 'all2all'"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_assert_false(parse_words("moe.sh", bad[i].args, &m, 16, &p, &said));
        g_test_message("%s: %s", bad[i].args, said);
        g_assert_true(g_str_has_prefix(said, "moe.sh: "));
        g_assert_nonnull(strstr(said, bad[i].says));
        g_free(said);
    }
    const ZpModel dsv3 = tu_load_model("models/hf/deepseek-v3");
    g_assert_false(
        parse_words("moe.sh", "--num-experts 256 --moe-router-topk 8", &dsv3, 16, &p, &said));
    g_assert_nonnull(strstr(said, "--moe-layer-freq: 1 (the default) makes all 61 layers "
                                  "sparse, but deepseek-v3 has 58"));
    g_free(said);
    g_assert_true(parse_words("moe.sh", "--num-experts 256 --moe-router-topk 8 --moe-layer-freq "
                              "'([0]*3+[1]*58)' --moe-expert-capacity-factor 1.0",
                              &dsv3, 16, &p, &said));
    g_assert_nonnull(strstr(said, "without --moe-grouped-gemm"));
    g_assert_nonnull(strstr(said, "sized as padded to the capacity"));
    g_assert_nonnull(strstr(said, "--moe-layer-freq: the pattern is not checked"));
    g_free(said);
    const ZpModel dense = tu_load_model("models/gpt-13b.json");
    g_assert_false(
        parse_words("moe.sh", "--expert-model-parallel-size 2", &dense, 16, &p, &said));
    g_assert_nonnull(strstr(said, "--expert-model-parallel-size: gpt-13b is dense"));
    g_free(said);
    /* The command line: the step of the same plan given as flags; --expert-skew beside the
     * file, --ep refused there (the file's --expert-model-parallel-size says it). */
    char *words = g_strdup_printf("pretrain_gpt.py %s --expert-model-parallel-size 4 "
                                  "--micro-batch-size 1 --global-batch-size 32 "
                                  "--use-distributed-optimizer --use-flash-attn", base);
    char *path = write_args(words);
    const char *common = "simulate --model hf/mixtral-8x7b --cluster dgx-h100 --gpus 16 --seq 512";
    /* the flags the file's plan is, but for what each case adds */
    const char *flags = "--impl megatron --stage 1 --mp 2 --sequence-parallel --micro-batch 1 "
                        "--grad-accum 4 --precision bf16 --no-overlap --attention flash "
                        "--reduce-dtype fp32 --reduce-bucket-size 40000000";
    char *plain = g_strdup_printf("%s --ep 4", flags);
    for (int skewed = 0; skewed <= 1; skewed++)
        json_decref(same_step(common, path, plain, skewed ? " --expert-skew 1.5" : ""));
    g_free(plain);
    /* The flags without --sequence-parallel: simulated, with a note that Megatron would not
     * train it; with it, no such note. */
    for (int sp = 0; sp <= 1; sp++) {
        args = g_strdup_printf("%s --impl megatron --stage 1 --mp 2 --ep 4 --micro-batch 1 "
                               "--precision bf16%s --json",
                               common, sp ? " --sequence-parallel" : "");
        json_t *j = tu_zplan_json_fit_or_not(args);
        gboolean said = FALSE;
        size_t k;
        json_t *note;
        json_array_foreach(json_object_get(j, "notes"), k, note)
        {
            said = said || strstr(json_string_value(note), "without --sequence-parallel");
        }
        g_assert_cmpint(said, ==, !sp);
        json_decref(j);
        g_free(args);
    }
    refused_beside_file(common, path, "--ep", "2");
    g_free(words);
    g_unlink(path);
    g_free(path);
    /* Megatron's default dispatcher from the file is --moe-dispatcher allgather's step; its
     * bytes go over TP x EP, none over EP's all-to-all; --moe-dispatcher beside the file is
     * refused (the file's --moe-token-dispatcher-type says it). */
    words = g_strdup("pretrain_gpt.py --num-experts 8 --moe-grouped-gemm "
                     "--tensor-model-parallel-size 2 --sequence-parallel --bf16 "
                     "--expert-model-parallel-size 4 --micro-batch-size 1 "
                     "--global-batch-size 32 --use-distributed-optimizer --use-flash-attn");
    path = write_args(words);
    char *gathered = g_strdup_printf("%s --ep 4 --moe-dispatcher allgather", flags);
    json_t *from_file = same_step(common, path, gathered, "");
    g_free(gathered);
    json_t *comm = json_object_get(from_file, "comm_bytes_per_rank");
    g_assert_cmpfloat(json_number_value(json_object_get(comm, "tpep")), >, 0);
    g_assert_cmpfloat(json_number_value(json_object_get(comm, "ep")), ==, 0);
    g_assert_cmpstr(json_string_value(json_object_get(from_file, "moe_dispatcher")), ==,
                    "allgather");
    json_decref(from_file);
    refused_beside_file(common, path, "--moe-dispatcher", "alltoall");
    g_free(words);
    g_unlink(path);
    g_free(path);
    /* whole experts from the file, --expert-tensor-parallel-size 1 over TP 2 x DP 8 at EP 8,
     * are --expert-tp 1's step */
    words = g_strdup("pretrain_gpt.py --num-experts 8 --moe-grouped-gemm "
                     "--tensor-model-parallel-size 2 --sequence-parallel --bf16 "
                     "--expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
                     "--moe-token-dispatcher-type alltoall --micro-batch-size 1 "
                     "--global-batch-size 32 --use-distributed-optimizer --use-flash-attn");
    path = write_args(words);
    char *whole = g_strdup_printf("%s --ep 8 --expert-tp 1 --moe-dispatcher alltoall", flags);
    from_file = same_step(common, path, whole, "");
    g_free(whole);
    g_assert_cmpint(json_integer_value(json_object_get(
                        json_object_get(json_object_get(from_file, "plan"), "experts"), "etp")),
                    ==, 1);
    json_decref(from_file);
    refused_beside_file(common, path, "--expert-tp", "1");
    g_free(words);
    g_unlink(path);
    g_free(path);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/megatron-args/plan", test_plan);
    g_test_add_func("/megatron-args/refusals", test_refusals);
    g_test_add_func("/megatron-args/architecture", test_architecture);
    g_test_add_func("/megatron-args/cli", test_cli);
    g_test_add_func("/megatron-args/moe", test_moe);
    return g_test_run();
}
