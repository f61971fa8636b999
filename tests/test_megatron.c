/* test_megatron: --impl megatron against Megatron-LM's own figures: the weight-and-optimizer
 * bytes of megatron/training/theoretical_memory_usage.py, its main_grad buckets and padding
 * (param_and_grad_buffer.py), its defaults and the stages it has. */
#include "testutil.h"
#include "sim_engine.h"
#include "zp_impl.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

/* megatron/training/theoretical_memory_usage.py compute_weight_and_optimizer_memory for a
 * dense model (no MoE, no MTP, no MLA) on one pipeline stage and one tensor rank: per layer
 * 2h(f g + n) + 2h^2 (1 + k/a) (q/h), g = 3/2 with SwiGLU, n = 2 for LayerNorm and 1 for
 * RMSNorm; the word embedding h V_padded (twice when untied); the final norm n h; times 18
 * bytes, or 6 + 12/dp with the distributed optimizer. */
static double megatron_weight_and_optimizer(const ZpModel *m, double padded_vocab, int dp,
                                            gboolean distributed)
{
    const double h = (double)m->hidden, f = (double)m->ffn_hidden, a = (double)m->heads;
    const double groups = (double)zp_model_kv_heads(m);
    const double query_ratio = a * (double)zp_model_head_dim(m) / h;
    const double gated = zp_model_gated(m) ? 1.5 : 1.0;
    const double norm = m->norm == ZP_NORM_RMSNORM ? 1.0 : 2.0;
    const double attn = 2 * h * h * ((1 + groups / a) * query_ratio);
    const double layer = 2 * h * (f * gated + norm) + attn;
    const double embedding = h * padded_vocab;
    const double params = layer * (double)m->layers + norm * h +
                          (m->tied_embeddings ? 1.0 : 2.0) * embedding;
    return params * (distributed ? 6.0 + 12.0 / dp : 18.0);
}

/* megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding: the vocabulary padded to
 * a multiple of make_vocab_size_divisible_by (128) x tensor-parallel size. */
static double padded_vocab(double vocab, int tp)
{
    return ceil(vocab / (128.0 * tp)) * 128.0 * tp;
}

/* lcm(dp, 128) */
static int lcm_128(int dp)
{
    int a = dp, b = 128;
    while (b) {
        const int r = a % b;
        a = b, b = r;
    }
    return dp / a * 128;
}

/* Megatron's plan in bf16 at a stage (0 DDP, 1 the distributed optimizer) over dp ranks. */
static void megatron_plan(int stage, int dp, gboolean overlap, ZpPlan *p)
{
    zp_plan_defaults(p, stage, dp, 1);
    p->impl = ZP_IMPL_MEGATRON;
    p->precision = ZP_PREC_BF16;
    zp_impl_plan_defaults(p);
    p->zero.overlap_comm = overlap;
}

static ZpSchedule *build(const ZpModel *m, int stage, int dp, gboolean overlap)
{
    ZpPlan p;
    megatron_plan(stage, dp, overlap, &p);
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(m, &p, &error);
    g_assert_no_error(error);
    return s;
}

/* The terms our model counts that the formula leaves out, in parameters: GPT's linear biases
 * (Megatron's add_bias_linear, on by default; the formula counts weights only): qkv 3h, proj
 * h, fc1 f, fc2 h per layer, and its learned position table (position_embedding_type
 * learned_absolute: max_position_embeddings x h, also left out); and the formula's padded
 * vocabulary against the model file's tokenizer size (a negative term). Llama has none of
 * them at t = 1 (no biases, rotary, 32000 = 250 x 128). */
static double named_terms(const ZpModel *m)
{
    const double h = (double)m->hidden;
    double extra = 0;
    if (zp_model_has_bias(m, ZP_NO_BIAS_QKV))
        extra += (double)m->layers * (double)zp_model_qkv_width(m);
    if (zp_model_has_bias(m, ZP_NO_BIAS_PROJ))
        extra += (double)m->layers * h;
    if (zp_model_has_bias(m, ZP_NO_BIAS_MLP))
        extra += (double)m->layers * ((double)zp_model_fc1_width(m) + h);
    if (m->learned_positions)
        extra += (double)(m->max_positions ? m->max_positions : m->seq_len) * h;
    extra -= (padded_vocab((double)m->vocab, 1) - (double)m->vocab) * h *
             (m->tied_embeddings ? 1.0 : 2.0);
    return extra;
}

/* theoretical_memory_usage.py's weight and optimizer bytes for Llama-2-7B and GPT-3 175B at
 * DP 1, 8 and 64, with and without the distributed optimizer: ours (the schedule's model
 * states) equal theirs plus the named terms at bytes per parameter, and with the distributed
 * optimizer the buffer's padding, which the formula leaves out: param_and_grad_buffer.py pads
 * each parameter's start to 64 elements and each bucket's end to lcm(dp, 128), 4 bytes of
 * main_grad, 2 of param_data (allocated with the same numel) and 12/dp of the shard's fp32
 * states each (our shard is 1/dp of every padded bucket, zp_impl.h flat_elems). */
static void test_theoretical_memory(void)
{
    const char *models[] = {"models/hf/llama-2-7b", "gpt3-175b"};
    const int dps[] = {1, 8, 64};
    for (size_t i = 0; i < G_N_ELEMENTS(models); i++) {
        const ZpModel m = tu_load_model(models[i]);
        const double extra = named_terms(&m);
        for (size_t j = 0; j < G_N_ELEMENTS(dps); j++)
            for (int stage = 0; stage <= 1; stage++) {
                const int dp = dps[j];
                ZpSchedule *s = build(&m, stage, dp, TRUE);
                const double per_param = stage == 1 ? 6.0 + 12.0 / dp : 18.0;
                const double theirs =
                    megatron_weight_and_optimizer(&m, padded_vocab((double)m.vocab, 1), dp,
                                                  stage == 1) +
                    extra * per_param;
                const double ours = zp_sched_model_state_bytes(s);
                GArray *tensors = zp_impl_tensors(s);
                GArray *buckets = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
                zp_impl_get(ZP_IMPL_MEGATRON)->plan_buckets(s, buckets);
                const double lcm = (double)lcm_128(dp);
                const double padding =
                    stage == 1 ? (63.0 * tensors->len + lcm * buckets->len) * (6.0 + 12.0 / dp) +
                                     (double)dp * (2.0 + 12.0 / dp)
                               : 0.0;
                g_test_message("%s dp %d stage %d: ours %.6f GB, theirs %.6f GB, padding <= %.0f "
                               "bytes", models[i], dp, stage, ours / 1e9, theirs / 1e9, padding);
                g_assert_cmpfloat(ours, >=, theirs);
                g_assert_cmpfloat(ours - theirs, <=, padding);
                if (stage == 0)
                    g_assert_cmpfloat(ours, ==, theirs);
                g_array_unref(buckets);
                g_array_unref(tensors);
                zp_sched_free(s);
            }
    }
}

/* param_and_grad_buffer.py _ParamAndGradBuffer.__init__: buckets are cut in reverse
 * parameter order once they hold bucket_size elements or more (the crossing parameter stays
 * in), bucket_size max(4e7, 1e6 dp) (distributed_data_parallel.py); with the distributed
 * optimizer each bucket's end is padded to lcm(dp, 128), so each is reduce-scattered in equal
 * shards; without overlap_grad_reduce one bucket holds everything. The buckets tile the
 * main_grad buffer (fp32 under bf16: grad_reduce_in_fp32), reduced in place. */
static void test_buckets(void)
{
    const ZpModel m = tu_load_model("models/hf/llama-2-7b");
    for (int stage = 0; stage <= 1; stage++) {
        ZpSchedule *s = build(&m, stage, 64, TRUE);
        g_assert_cmpfloat(s->plan.zero.reduce_bucket_size, ==, 6.4e7);
        GArray *buckets = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
        zp_impl_get(ZP_IMPL_MEGATRON)->plan_buckets(s, buckets);
        double total = 0;
        GArray *tensors = zp_impl_tensors(s);
        for (guint i = 0; i < buckets->len; i++) {
            const ZpBucketSpec *k = &g_array_index(buckets, ZpBucketSpec, i);
            const double elems = k->bytes / 4.0;
            g_assert_true(k->bypass); /* a view of main_grad */
            if (i + 1 < buckets->len)
                g_assert_cmpfloat(elems, >=, 6.4e7);
            /* no bucket is cut later than the crossing parameter: without its lowest tensor
             * it would be under the size */
            if (stage == 0 && i + 1 < buckets->len) {
                for (guint t = 0; t < tensors->len; t++) {
                    const ZpImplTensor *x = &g_array_index(tensors, ZpImplTensor, t);
                    if (x->offset == k->lo)
                        g_assert_cmpfloat(elems - (double)x->elems, <, 6.4e7);
                }
            }
            if (stage == 1)
                g_assert_cmpfloat(fmod(elems, 128.0), ==, 0);
            total += k->bytes;
        }
        g_assert_cmpuint(buckets->len, >, 50); /* 6.7e9 / 6.4e7 = 105 */
        g_assert_cmpfloat(total, ==, s->state_bytes[ZP_MEM_GRADS]);
        if (stage == 0)
            g_assert_cmpfloat(total, ==, 4.0 * (double)zp_model_param_count(&m));
        g_array_unref(tensors);
        g_array_unref(buckets);
        zp_sched_free(s);
        s = build(&m, stage, 64, FALSE);
        buckets = g_array_new(FALSE, FALSE, sizeof(ZpBucketSpec));
        zp_impl_get(ZP_IMPL_MEGATRON)->plan_buckets(s, buckets);
        g_assert_cmpuint(buckets->len, ==, 1);
        g_array_unref(buckets);
        zp_sched_free(s);
    }
}

/* From the command line: bf16 keeps main_grad in fp32 (arguments.py: bf16 sets
 * accumulate_allreduce_grads_in_fp32), 18 bytes a parameter; --reduce-dtype bf16 (Megatron's
 * --grad-reduce-in-bf16) keeps it in 16 bits, 16 bytes; a stage Megatron does not have and
 * selective recomputation elsewhere are refused with one line naming them. */
static void test_cli(void)
{
    const char *base = "simulate --model models/hf/llama-2-7b --cluster dgx-h100 --gpus 8 "
                       "--micro-batch 1 --precision bf16 --json --impl megatron";
    const ZpModel m = tu_load_model("models/hf/llama-2-7b");
    const double psi = (double)zp_model_param_count(&m);
    char *args = g_strdup_printf("%s --stage 0", base);
    json_t *j = tu_zplan_json_exit(args, 2);
    g_assert_cmpfloat(json_number_value(json_object_get(j, "model_state_bytes")), ==, 18 * psi);
    g_assert_cmpstr(json_string_value(json_object_get(json_object_get(j, "plan"),
                                                      "reduce_dtype")), ==, "fp32");
    json_decref(j);
    g_free(args);
    args = g_strdup_printf("%s --stage 0 --reduce-dtype bf16", base);
    j = tu_zplan_json_exit(args, 2);
    g_assert_cmpfloat(json_number_value(json_object_get(j, "model_state_bytes")), ==, 16 * psi);
    json_decref(j);
    g_free(args);
    /* fp16 keeps a 16-bit main_grad (no accumulate_allreduce_grads_in_fp32): 2 + 2 + 12/8
     * bytes at stage 1, and the step's fp32 copy of the shard's gradients
     * (distrib_optimizer.py _copy_model_grads_to_main_grads: .float()), 4/8 a parameter */
    j = tu_zplan_json("simulate --model models/hf/llama-2-7b --cluster dgx-h100 --gpus 8 "
                      "--stage 1 --micro-batch 1 --precision fp16 --impl megatron --json");
    g_assert_cmpfloat(json_number_value(json_object_get(j, "model_state_bytes")), ==, 5.5 * psi);
    g_assert_cmpfloat(json_number_value(json_object_get(json_object_get(j, "category_peak_bytes"),
                                                        "workspace")), ==, 0.5 * psi);
    json_decref(j);
    /* zplan memory's closed form says the same: 2 + 4 + 12 bytes, 6 + 12/8 at stage 1 */
    j = tu_zplan_json("memory --model models/hf/llama-2-7b --gpus 8 --precision bf16 "
                      "--impl megatron --json");
    json_t *row = json_array_get(json_object_get(j, "rows"), 0);
    g_assert_cmpfloat(json_number_value(json_object_get(
                          json_object_get(j, "bytes_per_param"), "grads")), ==, 4);
    g_assert_cmpfloat(json_number_value(json_object_get(row, "stage0")), ==, 18 * psi);
    g_assert_cmpfloat(json_number_value(json_object_get(row, "stage1")), ==, 7.5 * psi);
    json_decref(j);
    args = g_strdup_printf("%s --stage 2", base);
    TuRun r = tu_zplan(args);
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--impl megatron has stages 0"));
    tu_free(&r);
    g_free(args);
    r = tu_zplan("simulate --model models/hf/llama-2-7b --cluster dgx-h100 --gpus 8 --stage 1 "
                 "--micro-batch 1 --recompute selective");
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "selective recomputation is Megatron's"));
    tu_free(&r);
    r = tu_zplan("simulate --model models/hf/llama-2-7b --cluster dgx-h100 --gpus 8 --stage 1 "
                 "--micro-batch 1 --impl megatron --recompute partial");
    g_assert_false(g_spawn_check_wait_status(r.status, NULL));
    g_assert_nonnull(strstr(r.err, "--recompute"));
    tu_free(&r);
}

/* Megatron's overlap_grad_reduce, PyTorch DDP's way: each bucket's all-reduce is issued when
 * backward has produced its last gradient (param_and_grad_buffer.py register_grad_ready ->
 * start_grad_sync) and runs beside the rest of backward. Hand case: gpt2-124m at stage 0 on
 * one DGX A100 (dp 8, micro-batch 8, bf16: a block's backward, about 1 ms, is longer than
 * a bucket's all-reduce), buckets of 2.2e7 elements or more (four: three of about three
 * blocks, the last the embeddings and two blocks): every bucket's
 * all-reduce but the last (the embeddings' and the lowest blocks', issued after the
 * embedding's backward) is hidden, so the step's exposed communication is that last
 * all-reduce's time; without overlap one bucket of everything is reduced after backward and
 * all of it is exposed. */
static void test_ddp_overlap(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    double exposed[2], last[2], sum[2];
    for (int overlap = 0; overlap <= 1; overlap++) {
        ZpPlan p;
        megatron_plan(0, 8, overlap, &p);
        p.micro_batch = 8;
        p.zero.reduce_bucket_size = 2.2e7;
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        SimOptions options = {.record_timeline = TRUE};
        SimResult *r = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        int n = 0;
        sum[overlap] = last[overlap] = 0;
        double last_compute_end = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
            if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_EMBED_BWD)
                last_compute_end = r->op_end_s[i];
            if (op->kind != ZP_OP_COLLECTIVE || op->group != ZP_GROUP_DP)
                continue;
            n++;
            last[overlap] = r->op_end_s[i] - r->op_start_s[i];
            sum[overlap] += last[overlap];
            g_test_message("bucket %d: %.0f bytes, %.3f to %.3f ms (backward ends %.3f ms)", n,
                           op->bytes, 1e3 * r->op_start_s[i], 1e3 * r->op_end_s[i],
                           1e3 * last_compute_end);
        }
        exposed[overlap] = r->exposed_comm_s;
        g_test_message("overlap %d: %d buckets, exposed %.3f ms, last all-reduce %.3f ms, all "
                       "%.3f ms", overlap, n, 1e3 * exposed[overlap], 1e3 * last[overlap],
                       1e3 * sum[overlap]);
        g_assert_cmpint(n, ==, overlap ? 4 : 1);
        sim_result_free(r);
        zp_sched_free(s);
    }
    g_assert_cmpfloat(fabs(exposed[0] - sum[0]), <=, 1e-9);
    g_assert_cmpfloat(fabs(exposed[1] - last[1]), <=, 1e-9);
    g_assert_cmpfloat(exposed[1], <, 0.5 * exposed[0]);
}

/* Pipeline sends under scatter/gather (Narayanan et al. 2021 section 4.1; Megatron's
 * p2p_communication.py): with tensor parallelism t and no sequence parallelism each rank sends
 * b s h / t of a micro-step's activations or gradients instead of b s h, and the receiving
 * tensor group all-gathers the b s h over NVLink; with sequence parallelism the sends are
 * b s h / t already and nothing changes. Against the paper's semantics, which send b s h. */
static double bsh_bytes(const ZpModel *m)
{
    return 2.0 * (double)m->seq_len * (double)m->hidden; /* micro-batch 1, 16 bits */
}

static void p2p_bytes(ZpImplKind impl, gboolean sp, double *sent, int *gathers)
{
    const ZpModel m = tu_load_model("gpt-13b");
    ZpPlan p;
    zp_plan_defaults(&p, 0, 4, 4);
    p.impl = impl;
    p.pipe.stages = 2;
    p.grad_accum = 8;
    p.checkpoint = TRUE;
    p.sequence_parallel = sp;
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    *sent = 0, *gathers = 0;
    for (guint i = 0; i < s->ops->len; i++) {
        const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
        if (op->kind == ZP_OP_P2P && op->sub != ZP_P2P_TIED)
            *sent += op->bytes;
        if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_TP &&
            op->sub == ZP_COLL_ALLGATHER && op->bytes == bsh_bytes(&m))
            (*gathers)++;
    }
    zp_sched_free(s);
}

/* A tied embedding under a pipeline (gpt2-124m, PP 2, DP 4, the distributed optimizer,
 * bf16): the first stage's wte and the last stage's output-layer copy of it are each a
 * gradient bucket of their own (param_and_grad_buffer.py _does_param_require_new_bucket:
 * shared_embedding with use_distributed_optimizer), reduce-scattered as one range of
 * V h = 50,257 x 768 = 38,597,376 elements; then, once the stage's reductions are done,
 * finalize_model_grads.py _allreduce_word_embedding_grads all-reduces the whole main_grad
 * (fp32: grad_reduce_in_fp32 under bf16) between the two stages: V h x 4 = 154,389,504
 * bytes each way, after every data-parallel reduction of the stage and before its
 * optimizer. The schedule had wte in one bucket with wpe and the copy with the final norm
 * and the last blocks, and exchanged the gradient before the reductions (DeepSpeed's
 * order). */
static void test_shared_embedding(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    ZpPlan p;
    zp_plan_defaults(&p, 1, 4, 1);
    p.impl = ZP_IMPL_MEGATRON;
    p.precision = ZP_PREC_BF16;
    p.pipe.stages = 2;
    p.grad_accum = 4;
    p.zero.overlap_comm = TRUE;
    p.reduce_dtype = ZP_REDUCE_FP32; /* grad_reduce_in_fp32, bf16's default (validate_args) */
    GError *error = NULL;
    ZpSchedule *s = zp_sched_build(&m, &p, &error);
    g_assert_no_error(error);
    const double vh = 50257.0 * 768.0;
    for (uint32_t stage = 0; stage < 2; stage++) {
        int alone = 0, tied = 0;
        guint last_reduction = 0, tied_at = 0, optimizer_at = 0;
        double tied_bytes = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = zp_sched_op(s, i);
            if (op->stage != stage)
                continue;
            if (op->kind == ZP_OP_COLLECTIVE && op->group == ZP_GROUP_DP &&
                op->sub == ZP_COLL_REDUCE_SCATTER) {
                last_reduction = i;
                alone += (double)op->elems == vh;
            }
            if (op->kind == ZP_OP_P2P && op->sub == ZP_P2P_TIED) {
                tied++, tied_at = i;
                tied_bytes = op->bytes;
            }
            if (op->kind == ZP_OP_COMPUTE && op->sub == ZP_COMP_OPTIMIZER)
                optimizer_at = i;
        }
        g_test_message("stage %u: %d reduce-scatters of the embedding alone, the exchange of "
                       "%.0f bytes at op %u after the last reduction %u, before the optimizer "
                       "%u", stage, alone, tied_bytes, tied_at, last_reduction, optimizer_at);
        g_assert_cmpint(alone, ==, 1);
        g_assert_cmpint(tied, ==, 1);
        g_assert_cmpfloat(tied_bytes, ==, vh * 4.0);
        g_assert_cmpuint(tied_at, >, last_reduction);
        g_assert_cmpuint(tied_at, <, optimizer_at);
    }
    zp_sched_free(s);
}

static void test_scatter_gather(void)
{
    const ZpModel m = tu_load_model("gpt-13b");
    double paper, megatron;
    int paper_gathers, megatron_gathers;
    p2p_bytes(ZP_IMPL_PAPER, FALSE, &paper, &paper_gathers);
    p2p_bytes(ZP_IMPL_MEGATRON, FALSE, &megatron, &megatron_gathers);
    g_test_message("sent %.0f against %.0f bytes, %d receives all-gathered", megatron, paper,
                   megatron_gathers);
    /* 8 micro-steps, one send forward and one back: 16 of b s h 16-bit values */
    g_assert_cmpfloat(paper, ==, 16 * bsh_bytes(&m));
    g_assert_cmpfloat(megatron, ==, paper / 4);
    g_assert_cmpint(paper_gathers, ==, 0);
    g_assert_cmpint(megatron_gathers, ==, 16);
    p2p_bytes(ZP_IMPL_PAPER, TRUE, &paper, &paper_gathers);
    p2p_bytes(ZP_IMPL_MEGATRON, TRUE, &megatron, &megatron_gathers);
    g_assert_cmpfloat(megatron, ==, paper);
    g_assert_cmpfloat(megatron, ==, 16 * bsh_bytes(&m) / 4);
}

/* overlap_param_gather, hand case: gpt2-124m at stage 1 (the distributed optimizer) on one
 * DGX A100, dp 8, micro-batch 8, buckets of 2.2e7 elements (four). Without it the updated
 * parameters are all-gathered after the optimizer a bucket at a time (start_param_sync of
 * each bucket group), the whole of it exposed; with it each
 * bucket's all-gather runs in the next forward, the first (the embeddings') waited for at
 * once and each later one dispatched when the one before is waited for, hidden behind the
 * blocks' forward: the step is shorter by all the gathers but the first (less the slowdown
 * their overlap costs the compute under the profile's contention). */
static void test_overlap_param_gather(void)
{
    const ZpModel m = tu_load_model("gpt2-124m");
    const ZpHw hw = tu_load_hw("dgx-a100-80g");
    double step[2], gathers[2], first[2];
    int count[2];
    for (int overlap = 0; overlap <= 1; overlap++) {
        ZpPlan p;
        megatron_plan(1, 8, TRUE, &p);
        p.micro_batch = 8;
        p.zero.reduce_bucket_size = 2.2e7;
        p.overlap_param_gather = overlap;
        GError *error = NULL;
        ZpSchedule *s = zp_sched_build(&m, &p, &error);
        g_assert_no_error(error);
        SimOptions options = {.record_timeline = TRUE};
        SimResult *r = sim_engine_run(s, &hw, &options, &error);
        g_assert_no_error(error);
        gathers[overlap] = first[overlap] = 0;
        count[overlap] = 0;
        for (guint i = 0; i < s->ops->len; i++) {
            const ZpOp *op = &g_array_index(s->ops, ZpOp, i);
            if (op->kind != ZP_OP_COLLECTIVE || op->sub != ZP_COLL_ALLGATHER)
                continue;
            const double d = r->op_end_s[i] - r->op_start_s[i];
            if (count[overlap]++ == 0)
                first[overlap] = d;
            gathers[overlap] += d;
        }
        step[overlap] = r->step_time_s;
        g_test_message("overlap_param_gather %d: step %.3f ms, %d all-gathers %.3f ms, the "
                       "first %.3f ms", overlap, 1e3 * step[overlap], count[overlap],
                       1e3 * gathers[overlap], 1e3 * first[overlap]);
        sim_result_free(r);
        zp_sched_free(s);
    }
    g_assert_cmpint(count[0], ==, 4); /* one per bucket either way (start_param_sync) */
    g_assert_cmpint(count[1], ==, 4);
    /* the hidden gathers come off the step, less what their interference slows the forward
     * they overlap (the profile's contention of compute with collectives) */
    const double hidden = gathers[0] - first[1], saved = step[0] - step[1];
    g_test_message("saved %.3f ms of the %.3f ms hidden", 1e3 * saved, 1e3 * hidden);
    g_assert_cmpfloat(saved, <=, hidden + 1e-9);
    g_assert_cmpfloat(saved, >=, 0.75 * hidden);
}

/* distrib_optimizer.py _build_model_gbuf_param_range_map / _build_model_and_main_param_groups:
 * a rank's fp32 main parameters (and Adam's moments) are its parameters' ranges within its
 * 1/dp of each bucket, not the padding: over the ranks they hold every parameter element
 * exactly once, the schedule's states are the most any rank holds (the peak's rank), and on
 * one rank nothing is padding. tiny and gpt2-124m, dp 1 to 8, one bucket, 3000-element and
 * 64-element buckets (a tensor each: 1,024 elements of end padding at dp 4). The schedule
 * held 1/dp of each padded bucket, 12 bytes an element of padding too. */
static void test_optimizer_ranges(void)
{
    const char *models[] = {"tiny", "gpt2-124m"};
    const double buckets[] = {0, 3000, 64};
    for (size_t i = 0; i < G_N_ELEMENTS(models); i++)
        for (int dp = 1; dp <= 8; dp *= 2)
            for (size_t k = 0; k < G_N_ELEMENTS(buckets); k++) {
                const ZpModel m = tu_load_model(models[i]);
                ZpPlan p;
                megatron_plan(1, dp, buckets[k] > 0, &p);
                if (buckets[k] > 0)
                    p.zero.reduce_bucket_size = buckets[k];
                GError *error = NULL;
                ZpSchedule *s = zp_sched_build(&m, &p, &error);
                g_assert_no_error(error);
                uint64_t sum = 0, most = 0, least = UINT64_MAX;
                for (int r = 0; r < dp; r++) {
                    const uint64_t own = zp_impl_opt_elems(s, r);
                    sum += own, most = MAX(most, own), least = MIN(least, own);
                    g_assert_cmpuint(own, <=, s->partition_elems);
                    double mine[ZP_MEM_N];
                    zp_sched_rank_state_bytes(s, r, mine);
                    g_assert_cmpfloat(mine[ZP_MEM_ADAM_V], ==, 4.0 * (double)own);
                }
                g_test_message("%s dp %d bucket %.0f: %" G_GUINT64_FORMAT " parameters, "
                               "%" G_GUINT64_FORMAT " padded, a rank's optimizer %" G_GUINT64_FORMAT
                               " to %" G_GUINT64_FORMAT " of a %" G_GUINT64_FORMAT " shard",
                               models[i], dp, buckets[k], s->total_elems, s->padded_elems, least,
                               most, s->partition_elems);
                g_assert_cmpuint(sum, ==, s->total_elems);
                g_assert_cmpuint(zp_impl_opt_elems(s, -1), ==, most);
                g_assert_cmpfloat(s->state_bytes[ZP_MEM_MASTER], ==, 4.0 * (double)most);
                g_assert_cmpfloat(s->state_bytes[ZP_MEM_ADAM_M], ==, 4.0 * (double)most);
                if (dp == 1)
                    g_assert_cmpuint(most, ==, s->total_elems);
                if (s->padded_elems > s->total_elems && dp == 1)
                    g_assert_cmpuint(most, <, s->partition_elems);
                zp_sched_free(s);
            }
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_add_func("/megatron/theoretical-memory", test_theoretical_memory);
    g_test_add_func("/megatron/buckets", test_buckets);
    g_test_add_func("/megatron/cli", test_cli);
    g_test_add_func("/megatron/ddp-overlap", test_ddp_overlap);
    g_test_add_func("/megatron/scatter-gather", test_scatter_gather);
    g_test_add_func("/megatron/shared-embedding", test_shared_embedding);
    g_test_add_func("/megatron/overlap-param-gather", test_overlap_param_gather);
    g_test_add_func("/megatron/optimizer-ranges", test_optimizer_ranges);
    return g_test_run();
}
