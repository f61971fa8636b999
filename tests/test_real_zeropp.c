/* test_real_zeropp: zreal executes ZeRO++'s qwZ, hpZ and qgZ and ZeRO-R's cpu_checkpointing under
 * mpirun (4 ranks of the tiny GPT-2, 2 ranks a node for hpZ): the bytes it sends and keeps
 * equal zplan's prediction, and its loss stays near (or at) unquantised training's. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#define STEPS 10
/* After 10 steps the tiny model's loss is about 3.0; int8 weights with a scale per block
 * (and hpZ's secondary copy quantised again in backward) move it by a few hundredths. */
#define LOSS_TOLERANCE 0.1

static char *tmp_dir;

static json_t *zreal(const char *options, const char *name)
{
    char *path = g_strdup_printf("%s/%s.json", tmp_dir, name);
    char *args = g_strdup_printf("--model tiny --stage 3 --micro-batch 4 --persistence-threshold 0 "
                                 "--steps %d %s", STEPS, options);
    json_t *root = tu_zreal_measured(4, args, path);
    g_free(args);
    g_free(path);
    return root;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    g_assert_nonnull(v);
    return json_number_value(v);
}

static json_t *rank0(json_t *measured)
{
    return json_array_get(json_object_get(measured, "ranks"), 0);
}

static double final_loss(json_t *measured)
{
    json_t *loss = json_object_get(rank0(measured), "loss");
    return json_real_value(json_array_get(loss, json_array_size(loss) - 1));
}

/* zplan's prediction for the same plan on `cluster`: bytes per rank and the secondary
 * partitions. */
static json_t *predict_on(const char *cluster, const char *options)
{
    char *args = g_strdup_printf("simulate --model tiny --cluster %s --gpus 4 --stage 3 "
                                 "--micro-batch 4 --persistence-threshold 0 --precision bf16 "
                                 "--no-dropout --impl paper --json %s", cluster, options);
    json_t *p = tu_zplan_json(args);
    g_free(args);
    return p;
}

static json_t *predict(const char *options)
{
    return predict_on("dgx-a100-80g", options);
}

static void check_on(const char *cluster, json_t *measured, const char *zplan_options)
{
    json_t *p = predict_on(cluster, zplan_options), *r = rank0(measured);
    const double predicted = json_real_value(
        json_object_get(json_object_get(p, "comm_bytes_per_rank"), "dp"));
    g_assert_cmpfloat(json_real_value(json_object_get(r, "comm_bytes")), ==, predicted);
    const double secondary = json_real_value(
        json_object_get(json_object_get(p, "category_peak_bytes"), "secondary_params"));
    g_assert_cmpfloat(json_real_value(json_object_get(json_object_get(r, "category_peak_bytes"),
                                                      "secondary_params")), ==, secondary);
    /* zreal's own sequence through the caching-allocator model: 512-byte rounding makes its
     * allocated peak at least the tracker's, and the segments hold at least that. */
    json_t *ca = json_object_get(r, "caching_allocator");
    const double allocated = json_real_value(json_object_get(ca, "peak_allocated_bytes"));
    g_assert_cmpfloat(allocated, >=, json_real_value(json_object_get(r, "peak_memory_bytes")));
    g_assert_cmpfloat(json_real_value(json_object_get(ca, "peak_reserved_bytes")), >=, allocated);
    json_decref(p);
}

static void check_against_prediction(json_t *measured, const char *zplan_options)
{
    check_on("dgx-a100-80g", measured, zplan_options);
}

static void test_qwz_hpz(void)
{
    json_t *plain = zreal("", "plain");
    json_t *qwz = zreal("--quantized-weights", "qwz");
    json_t *hpz = zreal("--hpz-partition-size 2 --ranks-per-node 2", "hpz");
    json_t *both = zreal("--quantized-weights --hpz-partition-size 2 --ranks-per-node 2", "both");
    check_against_prediction(plain, "");
    check_against_prediction(qwz, "--quantized-weights");
    check_against_prediction(hpz, "--hpz-partition-size 2");
    check_against_prediction(both, "--quantized-weights --hpz-partition-size 2");
    /* qwZ sends less than the plain all-gathers; hpZ keeps some of them in the node. */
    const double sent_plain = json_real_value(json_object_get(rank0(plain), "comm_bytes"));
    g_assert_cmpfloat(json_real_value(json_object_get(rank0(qwz), "comm_bytes")), <, sent_plain);
    g_assert_cmpfloat(json_real_value(json_object_get(rank0(hpz), "comm_bytes")), <, sent_plain);
    /* hpZ alone gathers the same bf16 values from elsewhere: the same training. */
    const double base = final_loss(plain);
    g_assert_cmpfloat(final_loss(hpz), ==, base);
    g_test_message("final loss: plain %.4f, qwZ %+.4f, qwZ+hpZ %+.4f", base,
                   final_loss(qwz) - base, final_loss(both) - base);
    g_assert_cmpfloat(fabs(final_loss(qwz) - base), <, LOSS_TOLERANCE);
    g_assert_cmpfloat(fabs(final_loss(both) - base), <, LOSS_TOLERANCE);
    g_assert_cmpfloat(final_loss(qwz), !=, base); /* the quantisation did happen */
    json_decref(plain);
    json_decref(qwz);
    json_decref(hpz);
    json_decref(both);
}

/* DeepSpeed's stage 3 with qwZ (--impl deepspeed): each coalesced call's concatenated
 * partition quantised, its int8 and scales all-gathered, dequantised into the call's flat
 * buffer and unpacked (partition_parameters.py _all_gather_coalesced with quantize): the
 * bytes are zplan's for the same plan, fewer than the bf16 gathers', and the loss stays near
 * DeepSpeed's unquantised training's (the later --impl of the zplan options overrides
 * predict_on's). */
static void test_deepspeed_qwz(void)
{
    json_t *plain = zreal("--impl deepspeed", "ds-plain");
    json_t *qwz = zreal("--impl deepspeed --quantized-weights", "ds-qwz");
    check_against_prediction(plain, "--impl deepspeed");
    check_against_prediction(qwz, "--impl deepspeed --quantized-weights");
    const double sent_plain = json_real_value(json_object_get(rank0(plain), "comm_bytes"));
    g_assert_cmpfloat(json_real_value(json_object_get(rank0(qwz), "comm_bytes")), <, sent_plain);
    const double base = final_loss(plain);
    g_test_message("final loss: deepspeed %.4f, qwZ %+.4f", base, final_loss(qwz) - base);
    g_assert_cmpfloat(fabs(final_loss(qwz) - base), <, LOSS_TOLERANCE);
    g_assert_cmpfloat(final_loss(qwz), !=, base);
    json_decref(plain);
    json_decref(qwz);
}

/* zplan's prediction for DeepSpeed's stage 3 with stage3_prefetch_bucket_size and
 * stage3_max_reuse_distance 0 (from a ds_config: zplan simulate has no flag for the second). */
static json_t *predict_ds(int hpz, gboolean qwz)
{
    char *config = g_strdup_printf("%s/ds-hpz.json", tmp_dir);
    json_t *c = json_pack("{s:i, s:i, s:{s:b}, s:{s:i, s:i, s:i, s:i, s:i, s:b}}",
                          "train_micro_batch_size_per_gpu", 4, "gradient_accumulation_steps", 1,
                          "bf16", "enabled", TRUE, "zero_optimization", "stage", 3,
                          "stage3_prefetch_bucket_size", 0, "stage3_max_reuse_distance", 0,
                          "stage3_param_persistence_threshold", 0, "zero_hpz_partition_size", hpz,
                          "zero_quantized_weights", qwz);
    g_assert_cmpint(json_dump_file(c, config, 0), ==, 0);
    json_decref(c);
    char *args = g_strdup_printf("simulate --model tiny --cluster dgx-a100-80g --gpus 4 "
                                 "--ds-config %s --no-dropout --impl deepspeed --json", config);
    json_t *p = tu_zplan_json(args);
    g_unlink(config);
    g_free(config);
    g_free(args);
    return p;
}

/* The measured bytes per group (the data-parallel one's total holds hpZ's), the model
 * states, the secondary partition and the gathered buffers against zplan's; without qwZ the
 * peak's rise over the run without hpZ is the prediction's. */
static void check_ds(json_t *measured, json_t *plain, int hpz, gboolean qwz)
{
    json_t *p = predict_ds(hpz, qwz), *base = predict_ds(1, FALSE), *r = rank0(measured);
    json_t *sent = json_object_get(p, "zeropp_comm_bytes_per_rank");
    g_assert_cmpfloat(num(r, "comm_bytes"), ==,
                      num(json_object_get(p, "comm_bytes_per_rank"), "dp"));
    g_assert_cmpfloat(num(r, "comm_bytes") - num(r, "hpz_comm_bytes"), ==, num(sent, "dp_group"));
    g_assert_cmpfloat(num(r, "hpz_comm_bytes"), ==, num(sent, "hpz"));
    g_assert_cmpfloat(num(sent, "hpz"), >, 0);
    g_assert_cmpfloat(num(r, "model_state_bytes"), ==, num(p, "model_state_bytes"));
    static const char *const peaks[] = {"secondary_params", "gathered_params"};
    for (size_t i = 0; i < G_N_ELEMENTS(peaks); i++)
        g_assert_cmpfloat(num(json_object_get(r, "category_peak_bytes"), peaks[i]), ==,
                          num(json_object_get(p, "category_peak_bytes"), peaks[i]));
    if (!qwz) /* (zreal's peak is not where qwZ's int8 buffers live; zplan's is) */
        g_assert_cmpfloat(num(r, "peak_memory_bytes") - num(rank0(plain), "peak_memory_bytes"),
                          ==, num(p, "peak_memory_bytes") - num(base, "peak_memory_bytes"));
    json_decref(p);
    json_decref(base);
}

/* DeepSpeed's stage 3 with hpZ (--impl deepspeed, groups of 2 ranks): with
 * stage3_prefetch_bucket_size and stage3_max_reuse_distance 0 each module's parameters are
 * released after its forward and gathered again in backward. The forward's gathers over the
 * data-parallel group leave each rank its secondary slice of every tensor
 * (partition_parameters.py _partition_param_sec); the backward's coalesced calls gather the
 * secondary slices inside hpZ's group and unpack them (_all_gather_coalesced with
 * use_secondary_tensor, AllGatherCoalescedHandle.wait), with qwZ quantised first. hpZ alone
 * moves the same bf16 values: the loss is the plain run's to the bit. */
static void test_deepspeed_hpz(void)
{
    const char *ds = "--impl deepspeed --prefetch-bucket-size 0 --max-reuse-distance 0";
    char *plain_args = g_strdup_printf("%s", ds);
    char *hpz_args = g_strdup_printf("%s --hpz-partition-size 2 --ranks-per-node 2", ds);
    char *both_args = g_strdup_printf("%s --quantized-weights", hpz_args);
    json_t *plain = zreal(plain_args, "ds-reuse0");
    json_t *hpz = zreal(hpz_args, "ds-hpz");
    json_t *both = zreal(both_args, "ds-qwz-hpz");
    check_ds(hpz, plain, 2, FALSE);
    check_ds(both, plain, 2, TRUE);
    g_assert_null(json_object_get(rank0(plain), "hpz_comm_bytes"));
    const double base = final_loss(plain);
    g_test_message("final loss: deepspeed %.4f, hpZ %+.4f, qwZ+hpZ %+.4f", base,
                   final_loss(hpz) - base, final_loss(both) - base);
    g_assert_cmpfloat(final_loss(hpz), ==, base);
    g_assert_cmpfloat(fabs(final_loss(both) - base), <, LOSS_TOLERANCE);
    g_assert_cmpfloat(final_loss(both), !=, base);
    json_decref(plain);
    json_decref(hpz);
    json_decref(both);
    g_free(plain_args);
    g_free(hpz_args);
    g_free(both_args);
}

/* cpu_checkpointing at mp 1: each block's input, 2 b s h bytes (b 4, s 32, h 64: 16,384),
 * goes to the host tier in forward and comes back before the recompute, so per step
 * L x 2bsh = 32,768 bytes each way (L 2) and a host peak of the same, which is zplan memory's
 * checkpoint_host_bytes; the GPU holds one block's input at a time (simulate's checkpoints
 * peak), the collectives are zplan's, and the copies are exact: the loss is plain
 * checkpointing's to the bit. */
static void test_cpu_checkpointing(void)
{
    json_t *plain = zreal("--checkpoint", "ckpt");
    json_t *cpu = zreal("--checkpoint --cpu-checkpointing", "ckpt-cpu");
    check_against_prediction(cpu, "--checkpoint --cpu-checkpointing");
    json_t *host = json_object_get(rank0(cpu), "checkpoint_host");
    g_assert_nonnull(host);
    const double each_way = 2 * (2.0 * 4 * 32 * 64);
    g_assert_cmpfloat(num(host, "down_bytes"), ==, each_way);
    g_assert_cmpfloat(num(host, "up_bytes"), ==, each_way);
    g_assert_cmpfloat(num(host, "peak_bytes"), ==, each_way);
    json_t *mem = tu_zplan_json("memory --model tiny --gpus 4 --micro-batch 4 --checkpoint "
                                "--cpu-checkpointing --precision bf16 --impl paper --json");
    json_t *residual = json_object_get(json_object_get(json_array_get(
                                           json_object_get(mem, "rows"), 0), "residual"),
                                       "stage3");
    g_assert_cmpfloat(num(residual, "checkpoint_host_bytes"), ==, each_way);
    json_decref(mem);
    json_t *p = predict("--checkpoint --cpu-checkpointing");
    const double gpu_ckpt = num(json_object_get(p, "category_peak_bytes"), "checkpoints");
    g_assert_cmpfloat(gpu_ckpt, ==, each_way / 2);
    g_assert_cmpfloat(num(json_object_get(rank0(cpu), "category_peak_bytes"), "checkpoints"), ==,
                      gpu_ckpt);
    json_decref(p);
    g_assert_null(json_object_get(rank0(plain), "checkpoint_host"));
    g_assert_cmpfloat(final_loss(cpu), ==, final_loss(plain));
    json_decref(plain);
    json_decref(cpu);
}

/* qgZ with 2 ranks a node (2 nodes of 2): each bucket's gradients go as int4 with fp32
 * scales through an all-to-all inside the node, are summed there and requantised, and cross
 * the nodes once; the bytes zreal sends are zplan's on a cluster of 2 GPUs a node (its
 * zp_zeropp_qgz: per rank 1/2 S1 + 1/2 S1/2 for S1 = 4 (ceil(N / 8) + 4 g) a bucket of N),
 * fewer than the plain reduce-scatter's, and int4 gradients move the loss by less than the
 * tolerance (but move it). */
/* zreal's qgZ run under `impl_options` against plain training: the bytes are zplan's on a
 * cluster of 2 GPUs a node, fewer than the plain run's, and int4 gradients move the loss by
 * less than the tolerance (but move it). */
static void check_qgz(const char *impl_options, const char *name)
{
    char *options = g_strdup_printf("%s --quantized-gradients", impl_options);
    char *run = g_strdup_printf("%s --ranks-per-node 2", options);
    char *plain_name = g_strdup_printf("plain-%s", name);
    json_t *plain = zreal(impl_options, plain_name);
    json_t *qgz = zreal(run, name);
    json_error_t jerr;
    json_t *profile = json_load_file(ZP_DATA_DIR "/hwprofiles/dgx-a100-80g.json", 0, &jerr);
    g_assert_nonnull(profile);
    json_object_set_new(profile, "gpus_per_node", json_integer(2));
    char *cluster = g_strdup_printf("%s/two-a-node.json", tmp_dir);
    g_assert_cmpint(json_dump_file(profile, cluster, 0), ==, 0);
    json_decref(profile);
    check_on(cluster, qgz, options);
    json_t *p = predict_on(cluster, options);
    const double buckets = num(json_object_get(p, "category_peak_bytes"), "buckets");
    g_assert_cmpfloat(num(json_object_get(rank0(qgz), "category_peak_bytes"), "buckets"), ==,
                      buckets);
    json_decref(p);
    g_unlink(cluster);
    g_free(cluster);
    g_assert_cmpfloat(num(rank0(qgz), "comm_bytes"), <, num(rank0(plain), "comm_bytes"));
    const double base = final_loss(plain);
    g_test_message("%s: %.0f bytes a rank (plain %.0f); final loss: plain %.4f, qgZ %+.4f",
                   name, num(rank0(qgz), "comm_bytes"), num(rank0(plain), "comm_bytes"), base,
                   final_loss(qgz) - base);
    g_assert_cmpfloat(fabs(final_loss(qgz) - base), <, LOSS_TOLERANCE);
    g_assert_cmpfloat(final_loss(qgz), !=, base);
    json_decref(plain);
    json_decref(qgz);
    g_free(plain_name);
    g_free(run);
    g_free(options);
}

/* The paper's qgZ: each bucket through one pair of all-to-alls. */
static void test_qgz(void)
{
    check_qgz("", "qgz");
}

/* DeepSpeed's stage-3 qgZ (stage3.py __avg_scatter_grads -> comm/coalesced_collectives.py
 * all_to_all_quant_reduce) with 2 ranks a node: the bucket's tensors one by one, each 2-D one
 * (every matrix of the tiny model: numel a multiple of 2 x 4) quantised in max(rows, cols, 4)
 * groups through its own pair of all-to-alls, the norms and biases reduce-scattered alone
 * in their bucket; the bucket buffers' peak is zplan's too. */
static void test_deepspeed_qgz(void)
{
    check_qgz("--impl deepspeed", "ds-qgz");
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    tmp_dir = g_dir_make_tmp("zreal-zeropp-XXXXXX", NULL);
    g_test_add_func("/real/zeropp/qwz-hpz", test_qwz_hpz);
    g_test_add_func("/real/zeropp/deepspeed-qwz", test_deepspeed_qwz);
    g_test_add_func("/real/zeropp/deepspeed-hpz", test_deepspeed_hpz);
    g_test_add_func("/real/zeror/cpu-checkpointing", test_cpu_checkpointing);
    g_test_add_func("/real/zeropp/qgz", test_qgz);
    g_test_add_func("/real/zeropp/deepspeed-qgz", test_deepspeed_qgz);
    const int status = g_test_run();
    g_rmdir(tmp_dir);
    g_free(tmp_dir);
    return status;
}
