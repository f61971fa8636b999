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
    "    --micro-batch-size 1 --global-batch-size 64 --recompute-activations \\\n"
    "    --bf16 --use-flash-attn --lr 3e-4 --data-path '/data/my corpus' --log-interval=10\n";

static char *write_args(const char *text)
{
    char *path = g_strdup_printf("%s/megatron-args-%d.sh", g_get_tmp_dir(), (int)getpid());
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    return path;
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
                            "--group-query-attention, --lr, --data-path, --log-interval"));
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
    g_ptr_array_unref(warnings);
    g_unlink(path);
    g_free(path);
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
        {"--num-experts 8", "--num-experts is refused: mixture-of-experts"},
        {"--global-batch-size 65", "--global-batch-size 65 is not a multiple"},
        {"--tensor-model-parallel-size 3", "does not divide the 64 GPUs"},
        {"--context-parallel-size 2", "context parallelism is not modeled"},
        {"--no-scatter-gather-tensors-in-pipeline", "--no-scatter-gather-tensors-in-pipeline"},
        {"8 --bf16", "8 is not a flag"},
        {"--fp16 --bf16", "--fp16 and --bf16"},
        {"--overlap-param-gather", "--overlap-param-gather: needs --use-distributed-optimizer"},
        {"--tensor-model-parallel-size $TP", "--tensor-model-parallel-size"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        int argc;
        char **argv;
        g_assert_true(g_shell_parse_argv(cases[i].args, &argc, &argv, NULL));
        ZpPlan p;
        gboolean attention;
        GPtrArray *warnings = g_ptr_array_new_with_free_func(g_free);
        GError *error = NULL;
        g_assert_false(zp_megatron_args_parse(argc, argv, "args.sh", &m, 64, &p, &attention,
                                              warnings, &error));
        g_test_message("%s: %s", cases[i].args, error->message);
        g_assert_nonnull(strstr(error->message, cases[i].message));
        g_assert_true(g_str_has_prefix(error->message, "args.sh: "));
        g_assert_null(strchr(error->message, '\n'));
        g_error_free(error);
        g_ptr_array_unref(warnings);
        g_strfreev(argv);
    }
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

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/megatron-args/plan", test_plan);
    g_test_add_func("/megatron-args/refusals", test_refusals);
    g_test_add_func("/megatron-args/cli", test_cli);
    return g_test_run();
}
