/* test_bad_input: hostile command lines against every zplan subcommand and zreal, as a table.
 * Each must exit non-zero below 128 within 10 s, with one stderr line naming the flag, file or
 * key at fault, and leave no file behind. */
#include "testutil.h"

#include <glib/gstdio.h>
#include <jansson.h>
#include <string.h>
#include <sys/wait.h>

#ifndef ZP_BUILD_DIR
#define ZP_BUILD_DIR "build"
#endif
#ifndef ZP_DATA_DIR
#define ZP_DATA_DIR "."
#endif

#define CORPUS ZP_DATA_DIR "/tests/fuzz/corpus"

/* Placeholders in a case's command line: {T} the fixtures' directory, {D} the case's own
 * empty directory (its working directory, where outputs are aimed; it must stay empty), {IN}
 * the case's input file (its `file` text), {C} the fuzz corpora. */
typedef struct {
    const char *command, *file, *message;
} BadCase;

static const BadCase cases[] = {
    /* ---- offload ---- */
    {"zplan memory --model tiny --gpus 2 --offload-optimizer foo", NULL, "zplan memory: --offload-optimizer: unknown value 'foo' (choose from none, cpu, nvme)"},
    /* sweep's tflops-only flags with another metric, and --params's activation flags: dropped
     * in silence before */
    {"zplan sweep --vary gpus --values 8,64 --model gpt-13b --cluster dgx-h100 --metric memory --out {D}/s --global-batch 512", NULL, "zplan sweep: --global-batch: the tflops metric's search takes it"},
    {"zplan sweep --vary gpus --values 8,64 --model gpt-13b --cluster dgx-h100 --metric memory --out {D}/s --kernels megatron", NULL, "zplan sweep: --kernels: the tflops metric's simulation prices kernels"},
    {"zplan memory --params 13B --gpus 64 --checkpoint", NULL, "zplan memory: --checkpoint: activations need a model's architecture (--model); --params counts model states only"},
    {"zplan memory --params 13B --gpus 64 --micro-batch 4", NULL, "zplan memory: --micro-batch: activations need a model's architecture"},
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 2 --stage 2 --micro-batch 1 --offload-param cpu", NULL, "zplan simulate: --offload-param: offload_param: needs ZeRO stage 3"},
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 2 --stage 0 --micro-batch 1 --offload-optimizer cpu", NULL, "--offload-optimizer: offload_optimizer: needs ZeRO stage 1, 2 or 3"},
    {"zplan simulate --model tiny --cluster h100-measured --gpus 2 --stage 2 --micro-batch 1 --offload-optimizer cpu", NULL, "h100-measured: optimizer offload needs \"cpu_adam_bytes_per_s_per_core\""},
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 2 --ds-config {IN}", "{\"train_batch_size\": 2, \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", \"max_in_cpu\": -1}}}", "offload_param: key \"max_in_cpu\""},
    {"zplan maxmodel --gpu-memory 32e9 --gpus 1 --offload-param tape", NULL, "--offload-param: unknown value 'tape'"},
    /* refused before the config's warning and defaults note: one line */
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", \"pipeline_read\": false}}}", "zplan simulate: dgx-h100: optimizer offload needs \"cpu_adam_bytes_per_s_per_core\""},
    /* ---- memory ---- */
    {"zplan memory --model {IN} --gpus 4", "", "{IN}:1:0: malformed JSON"},
    {"zplan memory --model {IN} --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"layers\": 3}", "{IN}:1:"},
    {"zplan memory --model {IN} --gpus 4", "{\"name\": \"x\", \"layers\": 1e9, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8}", "key \"layers\" = 1000000000 is outside"},
    {"zplan memory --model {IN} --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8.5}", "key \"vocab\" must be a whole number"},
    {"zplan memory --model {IN} --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8, \"dropout\": \"yes\"}", "key \"dropout\" must be true or false"},
    {"zplan memory --model {IN} --gpus 4", "{\"name\": 7, \"layers\": 2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8}", "key \"name\" must be a string"},
    {"zplan memory --model {IN} --gpus 4", "null", "{IN}"},
    {"zplan memory --model {IN} --gpus 4", "{\"name\": \"x\"} trailing", "{IN}:1:"},
    /* a newline in a key or a flag's value is escaped: the error stays one line */
    {"zplan memory --model {IN} --gpus 4", "{\"name\": \"x\", \"layers\": 2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8, \"bo\\ngus\": 1}", "{IN}: unknown key \"bo\\ngus\""},
    {"zplan memory --model tiny --gpus 4 --precision 'fp\n16'", NULL, "--precision: unknown value 'fp\\n16'"},
    {"zreal --model tiny --impl 'x\ty'", NULL, "--impl: unknown value 'x\\x09y'"},
    {"zplan memory --model {T}/dir.json --gpus 4", NULL, "{T}/dir.json: no config.json in this directory"},
    {"zplan memory --model {T}/missing.json --gpus 4", NULL, "{T}/missing.json"},
    {"zplan memory --model ../models/tiny --gpus 4", NULL, "--model: unknown model"},
    {"zplan memory --model '' --gpus 4", NULL, "zplan memory: --model: empty name"},
    /* GOption takes --switch=VALUE and ignores VALUE: --checkpoint=false would checkpoint */
    {"zplan memory --model tiny --gpus 4 --checkpoint=false", NULL, "zplan memory: --checkpoint takes no value ('--checkpoint=false')"},
    {"zplan memory --model \xff\xfe.json --gpus 4", NULL, "--model: argument 3 is not valid UTF-8"},
    {"zplan memory --params nan --gpus 4", NULL, "--params: 'nan' is not a number"},
    {"zplan memory --params inf --gpus 4", NULL, "--params: 'inf' is not a number"},
    {"zplan memory --params 1e309 --gpus 4", NULL, "--params: '1e309' is not a number"},
    {"zplan memory --params 1e9x --gpus 4", NULL, "--params: '1e9x' is not a number"},
    {"zplan memory --params 7Q --gpus 4", NULL, "--params: '7Q' is not a number (suffixes: K, M, B, T)"},
    {"zplan memory --params -1B --gpus 4", NULL, "--params: '-1B' is outside"},
    {"zplan memory --params 1e400 --gpus 4", NULL, "--params: '1e400' is not a number"},
    {"zplan memory --model gpt2-124m --gpus 4 --seq 0", NULL, "--seq: '0' is outside"},
    {"zplan memory --params 7B --gpus 4 --seq 2048", NULL, "--seq: --params gives no architecture"},
    {"zreal --schedule {C}/schedule/tiny-stage0.json --seq 16", NULL, "--seq needs --model"},
    {"zplan maxmodel --gpu-memory 80Gib --gpus 8", NULL, "--gpu-memory: '80Gib' is not a number (suffixes: KB, MB, GB, TB, KiB"},
    {"zplan memory --params 1e9 --gpus 1,,2", NULL, "--gpus: '' is not a number"},
    {"zplan memory --params 1e9 --gpus 4,99999999999", NULL, "--gpus: '99999999999' is outside"},
    {"zplan memory --params 1e9 --gpus 4 --mp 0", NULL, "--mp"},
    {"zplan memory --params 1e9 --gpus 4 --precision ''", NULL, "--precision"},
    {"zplan memory --params 1e9 --gpus 4 --cluster {IN}", "{\"name\": \"c\", \"gpu\": \"g\", \"gpus_per_node\": 8, \"gpu_memory_bytes\": -1}", "key \"gpu_memory_bytes\""},
    {"zplan memory --params 1e9 --gpus 4 --cluster {IN}", "{\"name\": \"\", \"gpu\": \"g\"}", "key \"name\" must be 1 to"},
    /* ---- maxmodel ---- */
    {"zplan maxmodel --gpu-memory 1e300 --gpus 8", NULL, "--gpu-memory: '1e300' is outside"},
    {"zplan maxmodel --gpu-memory 32e9 --gpus 8 --mp 3", NULL, "--mp"},
    {"zplan maxmodel --gpu-memory 32e9 --gpus 8 --optimizer adamw", NULL, "--optimizer: unknown value 'adamw'"},
    {"zplan maxmodel --gpu-memory 32e9 --gpus 8 --gpus 9 extra", NULL, "unexpected argument 'extra'"},
    {"zplan maxmodel --cluster {IN} --gpus 8", "{\"name\": \"c\", \"gpu\": \"g\", \"gpus_per_node\": 8, \"gpu_memory_bytes\": 8e10, \"peak_fp16_flops\": 1e30}", "key \"peak_fp16_flops\""},
    {"zplan maxmodel --cluster {IN} --gpus 8", "{\"name\": \"c\", \"gpu\": \"g\", \"gpus_per_node\": 8, \"collective_fit\": 5}", "{IN}"},
    /* ---- plan ---- */
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --headroom 85", NULL, "--headroom: '85' (85.0 GB) leaves nothing"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --headroom 8Q", NULL, "--headroom: '8Q' is not a number (suffixes: KB"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --headroom -1", NULL, "--headroom: '-1' is outside"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100", NULL, "--gpus"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --global-batch 0", NULL, "--global-batch: '0' is outside"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --global-batch 1e30", NULL, "--global-batch"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --top -1", NULL, "--top"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --seq 0", NULL, "--seq"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --mp 5", NULL, "--mp"},
    {"zplan plan --model gpt2-1.5b --cluster nosuch --gpus 8", NULL, "--cluster: unknown cluster 'nosuch'"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --ds-config {T}/missing/x.json", NULL, "--ds-config: cannot write in directory '{T}/missing'"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --ds-config {T}/dir.json", NULL, "--ds-config: '{T}/dir.json' is not a file name"},
    {"zplan plan --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --precision fp8", NULL, "--precision: unknown value 'fp8'"},
    {"zplan plan --model {IN} --cluster dgx-h100 --gpus 8", "{\"name\": \"x\", \"layers\": 2, \"hidden\": 8, \"heads\": 2, \"seq_len\": 8, \"vocab\": 8, \"ffn_hidden\": 0}", "key \"ffn_hidden\" = 0 is outside"},
    {"zplan plan --params 1e9 --cluster dgx-h100 --gpus 8", NULL, "--params"},
    /* ---- sweep ---- */
    {"zplan sweep --vary gpus --values 1,2 --params 1e9 --metric memory --gpu-memory 32e9", NULL, "--out PREFIX is required"},
    {"zplan sweep --vary layers --values 1,2 --params 1e9 --out {D}/s", NULL, "--vary"},
    {"zplan sweep --vary gpus --values '' --params 1e9 --metric memory --out {D}/s", NULL, "--values"},
    {"zplan sweep --vary gpus --values 1,x --params 1e9 --metric memory --out {D}/s", NULL, "--values: 'x' is not a number"},
    {"zplan sweep --vary gpus --values 1,2 --params 1e9 --metric speed --out {D}/s", NULL, "--metric"},
    {"zplan sweep --vary gpus --values 1,2 --params 1e9 --metric memory --out {T}/missing/s", NULL, "--out: cannot write in directory '{T}/missing'"},
    {"zplan sweep --vary gpus --values 1,2 --params 1e9 --metric memory --gpus 4 --out {D}/s", NULL, "--gpus: the GPU counts come from --values"},
    {"zplan sweep --vary params --values 1e9 --params 1e9 --metric memory --gpus 4 --out {D}/s", NULL, "--vary params"},
    {"zplan sweep --vary stage --values 0,4 --params 1e9 --metric memory --gpus 4 --out {D}/s", NULL, "--values: '4' is outside"},
    {"zplan sweep --vary gpus --values 1,2 --params 1e9 --metric tflops --out {D}/s", NULL, "--metric tflops: give --cluster"},
    {"zplan sweep --vary micro-batch --values 0 --model tiny --metric memory --gpus 4 --out {D}/s", NULL, "--values: '0' is outside"},
    {"zplan sweep --vary gpus --values 1,2 --model gpt2-1.5b --cluster dgx-h100 --micro-batch 1 --global-batch 1000000 --out {D}/s", NULL, "--global-batch: 1000000 needs so much accumulation"},
    /* ---- simulate ---- */
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3", NULL, "--micro-batch"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 5 --micro-batch 1", NULL, "--stage"},
    {"zplan simulate --model tiny --gpus 8 --stage 1 --micro-batch 1", NULL, "--cluster"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --grad-accum 1e6", NULL, "grad-accum: 1000000 micro-steps"},
    {"zplan simulate --model gpt2-1.5b --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --grad-accum 60000", NULL, "grad-accum: 60000 micro-steps x 50 units"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --grad-accum 0", NULL, "--grad-accum: '0' is outside"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch -1", NULL, "--micro-batch"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --reduce-bucket-size -5", NULL, "--reduce-bucket-size"},
    /* ZeRO-R and ZeRO++ options the plan cannot run */
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 2 --micro-batch 1 --partition-activations", NULL, "need checkpointing on (--checkpoint)"},
    {"zplan memory --model tiny --gpus 8 --cpu-checkpointing", NULL, "need checkpointing on (--checkpoint)"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 2 --micro-batch 1 --quantized-weights", NULL, "(stage 3 only)"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --hpz-partition-size 3", NULL, "zero_hpz_partition_size: must divide"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --hpz-partition-size 0", NULL, "--hpz-partition-size"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --impl fsdp --quantized-weights", NULL, "--impl fsdp has none of it"},
    {"zplan simulate --model gpt-13b --cluster dgx-a100-80g --gpus 32 --mp 2 --stage 3 --micro-batch 1 --quantized-gradients", NULL, "zero_quantized_gradients (--quantized-gradients) with --mp > 1 (tensor_parallel.autotp_size): DeepSpeed's qgZ all-to-alls span every rank of the world and ignore tensor parallelism"},
    {"zplan simulate --model gpt-13b --cluster dgx-a100-80g --gpus 32 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"tensor_parallel\": {\"autotp_size\": 2}, \"zero_optimization\": {\"stage\": 3, \"zero_quantized_gradients\": true}}", "with --mp > 1 (tensor_parallel.autotp_size)"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --max-live-parameters -1", NULL, "max-live-parameters"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --allgather-bucket-size 0", NULL, "--allgather-bucket-size: '0' is outside"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --impl megadeep", NULL, "--impl: unknown value 'megadeep'"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 2 --micro-batch 1 --impl megatron", NULL, "--impl megatron has stages 0 (DistributedDataParallel) and 1"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --megatron-args {IN}", "--tensor-model-parallel-size 3 --bf16", "{IN}: --tensor-model-parallel-size x --pipeline-model-parallel-size = 3 does not divide the 8 GPUs"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --megatron-args {IN} --mp 2", "--bf16", "--mp: the plan comes from --megatron-args"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --checkpoint --recompute selective", NULL, "--checkpoint is --recompute full, not --recompute selective"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --impl fsdp", NULL, "no stage 1"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN} --micro-batch 2", "{\"train_micro_batch_size_per_gpu\": 1}", "--micro-batch 2 contradicts"},
    /* refused for what zplan does not model, in one line: no warning for its other keys */
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"comms_logger\": {\"enabled\": true}, \"torch_autocast\": {\"enabled\": true, \"dtype\": \"bfloat16\"}}", "{IN}: torch_autocast.enabled (fp32 weights under torch.autocast) is not modeled"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 5, \"sequence_parallel_size\": 4}", "{IN}: sequence_parallel_size 4 (DeepSpeed-Ulysses sequence parallelism) is not modeled"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN} --attention eager", "{\"train_micro_batch_size_per_gpu\": 1, \"attention_kernel\": \"flash2\"}", "--attention eager contradicts {IN}'s attention_kernel flash2"},
    /* a fused attention kernel where its own entry point would raise (zp_hw_attention_check):
     * FlashAttention takes fp16/bf16 only, FA2 needs sm80, FA1 sm75 to sm90 */
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --attention flash2 --precision fp32", NULL, "zplan simulate: --attention: flash2 takes only fp16 or bf16 inputs, not fp32 (csrc/flash_attn/flash_api.cpp mha_fwd: \"FlashAttention only support fp16 and bf16 data type\")"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --attention flash3 --precision fp32", NULL, "zplan simulate: --attention: flash3 takes only fp16 or bf16 inputs, not fp32 (hopper/flash_api.cpp mha_bwd"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 3 --micro-batch 1 --attention flash --precision fp32", NULL, "--attention: flash (dgx-h100's flash2) takes only fp16 or bf16 inputs, not fp32"},
    {"zplan simulate --model tiny --cluster dgx-a100-80g --gpus 8 --stage 3 --micro-batch 1 --attention flash1-triton --precision fp32", NULL, "--attention: flash1-triton takes only fp16 or bf16 inputs, not fp32 (flash_attn/flash_attn_triton.py"},
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 8 --stage 3 --micro-batch 1 --attention flash2 --precision fp16", NULL, "zplan simulate: --attention: flash2 in fp16 needs compute capability 8.0 or newer (csrc/flash_attn/flash_api.cpp mha_fwd: \"FlashAttention only supports Ampere GPUs or newer.\"); dgx2-v100's V100-SXM3-32GB is 7.0"},
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 8 --stage 3 --micro-batch 1 --attention flash1 --precision fp16", NULL, "--attention: flash1 in fp16 needs compute capability 7.5 to 9.0"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --megatron-args {IN}", "--use-flash-attn", "{IN}: --use-flash-attn: flash2 takes only fp16 or bf16 inputs, not fp32 (csrc/flash_attn/flash_api.cpp mha_fwd"},
    {"zplan plan --model tiny --cluster dgx-h100 --gpus 8 --attention flash2 --precision fp32", NULL, "zplan plan: --attention: flash2 takes only fp16 or bf16 inputs, not fp32"},
    {"zplan sweep --model tiny --cluster dgx-h100 --gpus 8 --vary stage --values 1,2 --out {D}/s --attention flash3 --precision fp32", NULL, "zplan sweep: --attention: flash3 takes only fp16 or bf16 inputs, not fp32"},
    {"zplan memory --model tiny --gpus 8 --attention flash2 --precision fp32", NULL, "zplan memory: --attention: flash2 takes only fp16 or bf16 inputs, not fp32"},
    /* mem-efficient: bf16 needs sm80 (the V100 refuses it); zreal runs eager or its own
     * blockwise kernel, never PyTorch's memory-efficient one */
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 8 --stage 3 --micro-batch 1 --attention mem-efficient --precision bf16", NULL, "zplan simulate: --attention: mem-efficient in bf16 needs compute capability 8.0 to 12.1 (bf16 needs sm80: PyTorch sdp_utils.cpp check_dtypes_low_precision and can_use_mem_efficient_attention); dgx2-v100's V100-SXM3-32GB is 7.0"},
    {"zreal --model tiny --attention mem-efficient", NULL, "--attention: zreal does not run mem-efficient (PyTorch's memory-efficient SDPA kernel); use eager or flash"},
    {"zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 1 --attention mem-efficient --out {D}/s.json", NULL, "zplan schedule: --attention: zreal does not run mem-efficient"},
    {"zplan schedule --model tiny --cluster dgx-h100 --gpus 2 --precision fp32 --ds-config {IN} --out {D}/s.json", "{\"train_micro_batch_size_per_gpu\": 1, \"attention_kernel\": \"mem-efficient\"}", "{IN}: attention_kernel: zreal does not run mem-efficient"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"attention_kernel\": \"flash2\"}", "{IN}: attention_kernel: flash2 takes only fp16 or bf16 inputs, not fp32"},
    {"zplan simulate --model tiny --cluster dgx-b200 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, \"attention_kernel\": \"flash2\"}", "{IN}: attention_kernel: dgx-b200 has no rate for 'flash2' in its attention table"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN} --reduce-dtype fp32", "{\"train_micro_batch_size_per_gpu\": 1, \"communication_data_type\": \"bf16\"}", "--reduce-dtype fp32 contradicts {IN}'s communication_data_type bf16"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --overlap --no-overlap", NULL, "--overlap"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --trace {T}/missing/t.json", NULL, "--trace: cannot write in directory '{T}/missing'"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --stage 1 --micro-batch 1 --trace {T}/dir.json", NULL, "--trace: '{T}/dir.json' is not a file name"},
    {"zplan simulate --model tiny --cluster dgx2-v100 --gpus 8 --stage 1 --micro-batch 1 --precision bf16", NULL, "--precision"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": \"three\"}}", "key \"stage\""},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_batch_size\": 7, \"train_micro_batch_size_per_gpu\": 2}", "{IN}"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1.5}}", "reduce_bucket_size"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2, \"bogus\": 1}}", "bogus"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {IN}", "[]", "{IN}: top level must be a JSON object"},
    {"zplan simulate --model tiny --cluster dgx-h100 --gpus 8 --ds-config {T}/dir.json", NULL, "{T}/dir.json: is a directory"},
    /* ---- schedule ---- */
    {"zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 2", NULL, "--out FILE"},
    {"zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 2 --out {T}/missing/s.json", NULL, "--out: cannot write in directory '{T}/missing'"},
    {"zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 2 --out {T}/dir.json", NULL, "--out: '{T}/dir.json' is not a file name"},
    {"zplan schedule --model tiny --gpus 2 --stage 1 --micro-batch 2 --grad-accum 300000 --out {D}/s.json", NULL, "grad-accum: 300000 micro-steps"},
    {"zplan schedule --model tiny --gpus 3 --stage 1 --mp 2 --micro-batch 2 --out {D}/s.json", NULL, "--mp"},
    /* ---- validate ---- */
    {"zplan validate {C}/predicted/predicted-tiny.json", NULL, "give two files"},
    {"zplan validate --json=no {C}/predicted/predicted-tiny.json {C}/measured/measured-tiny.json", NULL, "zplan validate: --json takes no value ('--json=no')"},
    {"zplan validate {C}/predicted/predicted-tiny.json {T}/meas-ranks-empty.json", NULL, "{T}/meas-ranks-empty.json: key \"ranks\" must be a non-empty array"},
    {"zplan validate {C}/predicted/predicted-tiny.json {T}/meas-ranks-garbage.json", NULL, "{T}/meas-ranks-garbage.json: ranks[0] must be an object"},
    {"zplan validate {C}/predicted/predicted-tiny.json {T}/meas-rank-99.json", NULL, "ranks[0]: key \"rank\" = 99 is outside"},
    {"zplan validate {C}/predicted/predicted-tiny.json {T}/meas-format.json", NULL, "{T}/meas-format.json: format \"x\" is not zplan-measured-1"},
    {"zplan validate {C}/predicted/predicted-tiny.json {T}/meas-op.json", NULL, "ops: frobnicate: unknown op type"},
    {"zplan validate {T}/pred-no-step.json {C}/measured/measured-tiny.json", NULL, "{T}/pred-no-step.json: missing key \"step_time_s\""},
    {"zplan validate {T}/pred-negative.json {C}/measured/measured-tiny.json", NULL, "key \"peak_memory_bytes\" = -1 is outside"},
    {"zplan validate {C}/measured/measured-tiny.json {C}/predicted/predicted-tiny.json", NULL, "the two files are swapped: {C}/measured/measured-tiny.json is zreal's measurement"},
    {"zplan validate {C}/predicted/predicted-tiny.json {T}/dir.json", NULL, "{T}/dir.json: is a directory"},
    {"zplan validate {C}/predicted/predicted-tiny.json {IN}", "{\"plan\": {}}", "different plans"},
    {"zplan validate {C}/predicted/predicted-tiny.json {IN}", "{\"plan\": {\"stage\": 1, \"dp\": 2, \"mp\": 1, \"micro_batch\": 2, \"grad_accum\": 1, \"checkpoint\": false, \"precision\": \"bf16\", \"optimizer\": \"adam\", \"attention\": \"eager\"}}", "different plans: attention none vs \"eager\""},
    /* ---- calibrate ---- */
    {"zplan calibrate {C}/microbench/microbench-2.json", NULL, "give --out FILE"},
    {"zplan calibrate {C}/microbench/microbench-2.json --out {T}/missing/p.json", NULL, "--out: cannot write in directory '{T}/missing'"},
    {"zplan calibrate {T}/mb-huge-flops.json --out {D}/p.json", NULL, "--out: nothing written: the fitted profile: key \"peak_fp16_flops\""},
    {"zplan calibrate {T}/mb-huge-bytes.json --out {D}/p.json", NULL, "--out: nothing written: the fitted profile: key \"hbm_bytes_per_s\""},
    {"zplan calibrate {IN} --out {D}/p.json", "{\"format\": \"zplan-microbench-1\", \"backend\": \"cpu\", \"world\": 2, \"gemm\": [], \"memory\": [], \"collectives\": []}", "gemm"},
    {"zplan calibrate {IN} --out {D}/p.json", "{\"format\": \"other\"}", "{IN}: format \"other\" is not zplan-microbench-1"},
    {"zplan calibrate {IN} --out {D}/p.json", "{\"format\": \"zplan-microbench-1\", \"backend\": \"cpu\", \"world\": 0}", "key \"world\" = 0 is outside"},
    {"zplan calibrate {C}/microbench/microbench-2.json --out {D}/p.json --memory-bytes 1", NULL, "--memory-bytes: '1' is outside"},
    {"zplan calibrate {C}/microbench/microbench-2.json --out {D}/p.json --ranks 3", NULL, "--ranks: no run has 3 ranks"},
    {"zplan calibrate {C}/microbench/microbench-2.json --out {D}/p.json --ranks 0", NULL, "--ranks"},
    {"zplan calibrate {C}/microbench/microbench-2.json --out {D}/p.json --name ''", NULL, "zplan calibrate: --name: '' must be 1 to 63 characters"},
    {"zplan calibrate --torch-trace {C}/torchtrace/block-step.json --cluster dgx-h100 --out {D}/p.json --gpu 0123456789012345678901234567890123456789012345678901234567890123", NULL, "zplan calibrate: --gpu: '0123456789012345678901234567890123456789...' must be 1 to 63 characters"},
    /* ---- zreal: flags, before MPI starts ---- */
    {"zreal", NULL, "give one of --model and --schedule"},
    {"zreal --model tiny --schedule {C}/schedule/tiny-stage0.json", NULL, "give one of --model and --schedule"},
    {"zreal --model tiny --stage 4", NULL, "--stage: '4' is outside"},
    {"zreal --model tiny --stage 2 --impl megatron --micro-batch 2", NULL, "--impl megatron has stages 0 (DistributedDataParallel) and 1"},
    {"zreal --model tiny --stage 2 --impl fsdp2 --micro-batch 2 --hpz-partition-size 2 --emulate 2", NULL, "FSDP2's reshard_after_forward is False (--stage 2) or an int (--stage 3 --hpz-partition-size), not both"},
    {"zreal --model tiny --stage 1 --impl megatron --emulate 2 --micro-batch 2", NULL, "zreal keeps Megatron's main_grad in fp32 (grad_reduce_in_fp32) on the CPU backend over MPI ranks; here run with --reduce-dtype bf16"},
    {"zreal --model tiny --stage 1 --impl deepspeed --micro-batch 2 --reduce-dtype fp32", NULL, "zreal reduces gradients in bf16, their own dtype; the plan says fp32"},
    {"zreal --model tiny --stage 1 --micro-batch 2 --reduce-dtype int8", NULL, "--reduce-dtype: unknown value 'int8'"},
    {"zreal --model tiny --micro-batch 0", NULL, "--micro-batch: '0' is outside"},
    {"zreal --model tiny --mp 2", NULL, "--mp 2 x pipeline stages 1 must divide the 1 ranks"},
    {"zreal --microbench --model tiny --mp 3 --out {D}/mb.json", NULL, "--mp: 3 does not divide"},
    {"zreal --model tiny --micro-batch 1e7", NULL, "--micro-batch: '1e7' is outside"},
    {"zreal --model tiny --grad-accum 1e7", NULL, "--grad-accum: '1e7' is outside"},
    {"zreal --model tiny --steps -1", NULL, "--steps: '-1' is outside"},
    {"zreal --model tiny --lr 0", NULL, "--lr: '0' is outside"},
    {"zreal --model tiny --lr nan", NULL, "--lr: 'nan' is not a number"},
    {"zreal --model tiny --backend tpu", NULL, "--backend: 'tpu' is neither cpu nor cuda"},
    {"zreal --model tiny --rank 3", NULL, "--rank needs --emulate N"},
    {"zreal --model tiny --emulate 4 --rank 4", NULL, "--rank: '4' is outside"},
    {"zreal --model tiny --emulate 0", NULL, "--emulate: '0' is outside"},
    {"zreal --microbench", NULL, "--microbench needs --out FILE"},
    {"zreal --microbench=no --emulate 2 --out {D}/mb.json", NULL, "--microbench takes no value ('--microbench=no')"},
    {"zreal --model tiny --out {T}/missing/m.json", NULL, "--out: cannot write in directory '{T}/missing'"},
    {"zreal --model tiny --out {T}/dir.json", NULL, "--out: '{T}/dir.json' is not a file name"},
    {"zreal --model \xc3\x28", NULL, "--model: argument 2 is not valid UTF-8"},
    {"zreal --model tiny stray", NULL, "unexpected argument 'stray'"},
    {"zreal --model tiny --fault-action explode", NULL, "--fault-action: 'explode' is not kill"},
    /* ---- zreal: the model and schedule, one emulated rank ---- */
    {"zreal --model nosuch --emulate 2 --steps 1", NULL, "--model: unknown model 'nosuch'"},
    {"zreal --model {T}/long.json --micro-batch 600000 --emulate 2 --steps 1 --out {D}/m.json", NULL, "--micro-batch 600000 (--model {T}/long.json, --stage 0, --grad-accum 1): a rank's buffers peak at"},
    {"zreal --model tiny --grad-accum 300000 --emulate 2 --steps 1 --out {D}/m.json", NULL, "grad-accum: 300000 micro-steps"},
    {"zreal --model {T}/ropewpe.json --emulate 2 --steps 1 --out {D}/m.json", NULL, "one of the two; ropewpe has both"},
    {"zreal --model {T}/yarn.json --emulate 2 --steps 1 --out {D}/m.json", NULL, "(\"linear\", \"llama3\"), not \"yarn\" as yarn does"},
    {"zreal --schedule {T}/dir.json --emulate 2 --steps 1", NULL, "{T}/dir.json: is a directory"},
    {"zreal --schedule {IN} --emulate 2 --steps 1", "{\"format\": \"zplan-schedule-1\"}", "{IN}: keys \"model\" and \"plan\" must be objects"},
    {"zreal --schedule {T}/sched-plan-key.json --emulate 2 --steps 1", NULL, "{T}/sched-plan-key.json: plan: unknown key \"bogus\""},
    {"zreal --schedule {T}/sched-unit.json --emulate 2 --steps 1", NULL, "{T}/sched-unit.json: ops[0]: key \"unit\" = 1000000 is outside"},
    {"zreal --schedule {T}/sched-buffer.json --emulate 2 --steps 1", NULL, "{T}/sched-buffer.json: ops[1]: key \"buffer\" = 2147483647"},
    {"zreal --schedule {T}/sched-elems.json --emulate 2 --steps 1", NULL, "{T}/sched-elems.json: ops[3]: key \"elems\" = 999999999"},
    {"zreal --schedule {T}/sched-alloc-zero.json --emulate 2 --steps 1", NULL, "{T}/sched-alloc-zero.json: ops[0]: key \"bytes\" = 0"},
    {"zreal --schedule {T}/sched-bucket-zero.json --emulate 2 --steps 1", NULL, "{T}/sched-bucket-zero.json: ops[23]: key \"bytes\" = 0; the collective using it gives 256"},
    {"zreal --schedule {T}/sched-dep.json --emulate 2 --steps 1", NULL, "{T}/sched-dep.json: ops[3]: deps[0] must be the index of an earlier op"},
    {"zreal --schedule {T}/sched-op-key.json --emulate 2 --steps 1", NULL, "{T}/sched-op-key.json: ops[2]: unknown key \"extra\""},
    {"zreal --schedule {T}/sched-negative.json --emulate 2 --steps 1", NULL, "{T}/sched-negative.json: ops[2]: key \"bytes\" = -8 is outside"},
    {"zreal --schedule {C}/schedule/tiny-stage1.json --emulate 4 --steps 1", NULL, "the schedule is for 2 data-parallel ranks, 4 are running"},
    {"zreal --schedule {C}/schedule/tiny-tp.json --emulate 2 --steps 1", NULL, "tensor parallelism (mp 2) and pipelines (pp 1) run over MPI ranks"},
};

static char *fixtures;

/* A fixture file: text, or a corpus file with one key of one object changed. */
static void write_fixture(const char *name, const char *text)
{
    char *path = g_build_filename(fixtures, name, NULL);
    g_assert_true(g_file_set_contents(path, text, -1, NULL));
    g_free(path);
}

/* Loads CORPUS/source, sets `key` of the object at JSON pointer-ish `where` ("ops/18",
 * "ranks", "" for the root) to the JSON value `value`, and writes fixtures/name. */
static void mutate(const char *source, const char *name, const char *where, const char *key,
                   const char *value)
{
    char *in = g_build_filename(CORPUS, source, NULL);
    json_t *root = json_load_file(in, 0, NULL);
    g_assert_nonnull(root);
    json_t *o = root;
    char **parts = g_strsplit(where, "/", -1);
    for (char **p = parts; *p && **p; p++)
        o = json_is_array(o) ? json_array_get(o, (size_t)g_ascii_strtoull(*p, NULL, 10))
                             : json_object_get(o, *p);
    g_strfreev(parts);
    g_assert_nonnull(o);
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    g_assert_nonnull(v);
    json_object_set_new(o, key, v);
    char *text = json_dumps(root, JSON_PRESERVE_ORDER);
    write_fixture(name, text);
    free(text);
    json_decref(root);
    g_free(in);
}

/* Scales one field of every entry of one array of the microbench corpus file. */
static void scale_microbench(const char *name, const char *array, const char *field, double by)
{
    char *in = g_build_filename(CORPUS, "microbench/microbench-2.json", NULL);
    json_t *root = json_load_file(in, 0, NULL);
    json_t *entry;
    size_t i;
    json_array_foreach(json_object_get(root, array), i, entry)
        json_object_set_new(entry, field,
                            json_real(json_number_value(json_object_get(entry, field)) * by));
    char *text = json_dumps(root, JSON_PRESERVE_ORDER);
    write_fixture(name, text);
    free(text);
    json_decref(root);
    g_free(in);
}

static void make_fixtures(void)
{
    fixtures = g_dir_make_tmp("zplan-bad-input-XXXXXX", NULL);
    char *dir = g_build_filename(fixtures, "dir.json", NULL);
    g_assert_cmpint(g_mkdir(dir, 0755), ==, 0);
    g_free(dir);
    write_fixture("ropewpe.json", "{\"name\": \"ropewpe\", \"layers\": 2, \"hidden\": 64, "
                                  "\"heads\": 4, \"seq_len\": 32, \"vocab\": 64, \"dropout\": "
                                  "false, \"rope_theta\": 10000, \"learned_positions\": true}");
    write_fixture("yarn.json", "{\"name\": \"yarn\", \"layers\": 2, \"hidden\": 64, "
                               "\"heads\": 4, \"seq_len\": 32, \"vocab\": 64, \"dropout\": "
                               "false, \"rope_theta\": 10000, \"learned_positions\": false, "
                               "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}");
    write_fixture("long.json", "{\"name\": \"long\", \"layers\": 2, \"hidden\": 64, \"heads\": 4, "
                               "\"seq_len\": 4096, \"vocab\": 64, \"dropout\": false}");
    mutate("measured/measured-tiny.json", "meas-ranks-empty.json", "", "ranks", "[]");
    mutate("measured/measured-tiny.json", "meas-ranks-garbage.json", "", "ranks", "[\"x\", 3, null]");
    mutate("measured/measured-tiny.json", "meas-rank-99.json", "ranks/0", "rank", "99");
    mutate("measured/measured-tiny.json", "meas-format.json", "", "format", "\"x\"");
    mutate("measured/measured-tiny.json", "meas-op.json", "ranks/1/ops", "frobnicate", "{\"count\": 1, \"total_s\": 1}");
    mutate("predicted/predicted-tiny.json", "pred-no-step.json", "", "step_time_s", "null");
    mutate("predicted/predicted-tiny.json", "pred-negative.json", "", "peak_memory_bytes", "-1");
    scale_microbench("mb-huge-flops.json", "gemm", "flops", 1e15);
    scale_microbench("mb-huge-bytes.json", "memory", "bytes", 1e15);
    const char *s3 = "schedule/tiny-stage3.json";
    mutate(s3, "sched-plan-key.json", "plan", "bogus", "1");
    mutate(s3, "sched-unit.json", "ops/0", "unit", "1000000");
    mutate(s3, "sched-buffer.json", "ops/1", "buffer", "2147483647");
    mutate(s3, "sched-elems.json", "ops/3", "elems", "999999999");
    mutate(s3, "sched-alloc-zero.json", "ops/0", "bytes", "0");
    mutate(s3, "sched-bucket-zero.json", "ops/23", "bytes", "0");
    mutate(s3, "sched-dep.json", "ops/3", "deps", "[3]");
    mutate(s3, "sched-op-key.json", "ops/2", "extra", "1");
    mutate(s3, "sched-negative.json", "ops/2", "bytes", "-8");
}

/* Replaces every placeholder of `text`. */
static char *expand(const char *text, const char *case_dir, const char *input)
{
    const char *names[] = {"{T}", "{D}", "{IN}", "{C}"};
    const char *values[] = {fixtures, case_dir, input ? input : "", CORPUS};
    char *out = g_strdup(text);
    for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
        char **parts = g_strsplit(out, names[i], -1);
        g_free(out);
        out = g_strjoinv(values[i], parts);
        g_strfreev(parts);
    }
    return out;
}

/* Exactly one line: text, then the only newline at the end. */
static gboolean one_line(const char *text)
{
    const char *newline = strchr(text, '\n');
    return newline && newline > text && newline[1] == '\0';
}

static guint count_entries(const char *dir)
{
    GDir *d = g_dir_open(dir, 0, NULL);
    guint n = 0;
    while (d && g_dir_read_name(d))
        n++;
    if (d)
        g_dir_close(d);
    return n;
}

static void run_case(gconstpointer data)
{
    const BadCase *c = data;
    char *case_dir = g_dir_make_tmp("zplan-bad-case-XXXXXX", NULL);
    char *input = c->file ? g_build_filename(fixtures, "in.json", NULL) : NULL;
    if (input)
        g_assert_true(g_file_set_contents(input, c->file, -1, NULL));
    char *command = expand(c->command, case_dir, input);
    char *message = expand(c->message, case_dir, input);
    /* zplan ... / zreal ...: the programs under test from the build directory. */
    char *program = g_strdup_printf("%s/%s", ZP_BUILD_DIR, command);
    char **argv = NULL;
    g_assert_true(g_shell_parse_argv(program, NULL, &argv, NULL));
    char **envp = g_get_environ();
    envp = g_environ_setenv(envp, "OMPI_ALLOW_RUN_AS_ROOT", "1", TRUE);
    envp = g_environ_setenv(envp, "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", TRUE);
    envp = g_environ_setenv(envp, "OPENBLAS_NUM_THREADS", "1", TRUE);
    char *out = NULL, *err = NULL;
    int status = 0;
    const gint64 start = g_get_monotonic_time();
    g_assert_true(g_spawn_sync(case_dir, argv, envp, 0, NULL, NULL, &out, &err, &status, NULL));
    const double elapsed_s = (double)(g_get_monotonic_time() - start) / 1e6;
    g_test_message("%s -> status %d in %.2f s: %s", command, status, elapsed_s, err);
    g_assert_true(WIFEXITED(status));
    g_assert_cmpint(WEXITSTATUS(status), >, 0);
    g_assert_cmpint(WEXITSTATUS(status), <, 128);
    g_assert_cmpfloat(elapsed_s, <, 10);
    g_assert_nonnull(strstr(err, message));
    g_assert_true(one_line(err));
    g_assert_cmpuint(strlen(err), <, 1200); /* a 100 MB value echoed back is cut */
    g_assert_cmpuint(count_entries(case_dir), ==, 0); /* nothing left behind */
    if (input)
        g_remove(input);
    g_rmdir(case_dir);
    g_strfreev(envp);
    g_strfreev(argv);
    g_free(out), g_free(err), g_free(program), g_free(command), g_free(message);
    g_free(input), g_free(case_dir);
}

/* A huge string echoed back in an error (a 10 MB "format") is cut to its head and tail. */
static void test_long_value(void)
{
    char *format = g_strnfill(10 << 20, 'a');
    char *text = g_strdup_printf("{\"format\": \"%s\"}", format);
    const BadCase c = {"zplan calibrate {IN} --out {D}/p.json", text,
                       "aaaa\" is not zplan-microbench-1"}; /* run_case: under 1,200 bytes */
    run_case(&c);
    g_free(text);
    g_free(format);
}

/* Output that cannot be written fails the command: stdout a full device or closed. */
static void test_failed_stdout(void)
{
    const char *commands[] = {
        "memory --params 7.5e9 --gpus 64",
        "memory --params 7.5e9 --gpus 64 --json",
        "simulate --model tiny --cluster dgx-h100 --gpus 2 --stage 1 --micro-batch 2 --json",
        "plan --model gpt2-124m --cluster dgx-h100 --gpus 8 --json",
        "validate " CORPUS "/predicted/predicted-tiny.json " CORPUS "/measured/measured-tiny.json --json",
        "maxmodel --gpu-memory 32e9 --gpus 64",
        "--help",
    };
    const char *redirects[] = {"> /dev/full", ">&-"};
    for (size_t i = 0; i < G_N_ELEMENTS(commands); i++)
        for (size_t j = 0; j < G_N_ELEMENTS(redirects); j++) {
            char *script = g_strdup_printf("%s/zplan %s %s", ZP_BUILD_DIR, commands[i], redirects[j]);
            char *argv[] = {"/bin/sh", "-c", script, NULL};
            char *err = NULL;
            int status = 0;
            g_assert_true(g_spawn_sync(NULL, argv, NULL, G_SPAWN_STDOUT_TO_DEV_NULL, NULL, NULL,
                                       NULL, &err, &status, NULL));
            g_test_message("%s -> %d: %s", script, status, err);
            g_assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
            g_assert_nonnull(strstr(err, "writing to standard output"));
            g_assert_true(one_line(err));
            g_free(err);
            g_free(script);
        }
}

static void remove_fixtures(void)
{
    GDir *d = g_dir_open(fixtures, 0, NULL);
    const char *entry;
    while ((entry = g_dir_read_name(d))) {
        char *path = g_build_filename(fixtures, entry, NULL);
        if (g_remove(path) != 0)
            g_rmdir(path);
        g_free(path);
    }
    g_dir_close(d);
    g_rmdir(fixtures);
    g_free(fixtures);
}

int main(int argc, char **argv)
{
    g_test_init(&argc, &argv, NULL);
    g_test_set_nonfatal_assertions(); /* every case runs; each failure is reported */
    make_fixtures();
    g_assert_cmpuint(G_N_ELEMENTS(cases), >=, 100);
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *name = g_strdup_printf("/bad-input/%03zu", i);
        g_test_add_data_func(name, &cases[i], run_case);
        g_free(name);
    }
    g_test_add_func("/bad-input/long-value", test_long_value);
    g_test_add_func("/bad-input/failed-stdout", test_failed_stdout);
    const int status = g_test_run();
    remove_fixtures();
    return status;
}
